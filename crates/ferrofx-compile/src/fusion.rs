//! Elementwise fusion: maximal groups of float32 elementwise ops become one
//! `fused_elementwise` node whose expression (data, not code) computes the whole group in one
//! pass over memory.
//!
//! Rules (inductor's and XLA's, restricted to what is always safe):
//! - a node is *fusable* when it is a pure registry op the evaluator knows (`add sub rsub mul
//!   div maximum minimum pow neg abs relu relu6 hardtanh clamp leaky_relu sigmoid tanh exp
//!   expm1 log log1p sqrt rsqrt reciprocal silu gelu erf sin cos floor ceil trunc hardswish
//!   hardsigmoid`), its value and every tensor operand are float32 (so PyTorch's type
//!   promotion never changes a dtype inside a group: an int64 or float64 operand leaves the
//!   node unfused), its scalar operands are numbers and its keyword arguments the defaults;
//! - comparisons (`eq ne gt ge lt le`) of float32 operands are fusable too: their bool value
//!   is computed as `1.0` / `0.0` inside the group and read by the float32 op that uses it
//!   (relu's backward `mul(grad, gt(y, 0))` becomes one pass, as eager's fused kernel), which is
//!   PyTorch's promotion of bool where it meets float32. A comparison is never a group's root
//!   (its value must stay bool), and a mask used outside the group is read as an input;
//! - a group grows from its last node (the *root*) backwards over producers of the root's
//!   shape; a producer joins only when **all** its users are in the group (a value used
//!   outside stays a materialised boundary), and only when no in-place op lies between it and
//!   the root (moving its computation past a mutation could read the mutated value);
//! - producers of another (broadcast) shape are read as inputs, not recomputed per element;
//! - views, in-place ops, random ops and everything not elementwise are never fused.
//!
//! The fused node is placed at the root's position and named after its ops
//! (`fused_add_mul_relu`); the inputs of the group are its `inputs` list, in first-use order.

use ferrofx_core::op::{Effect, OpDef};
use ferrofx_core::ops::fused::{FusedExpr, FusedOp, Instr, Operand, MAX_INPUTS, MAX_INSTRS};
use ferrofx_core::{DType, Error, Result};
use ferrofx_fx::{Argument, Graph, GraphModule, Node, NodeId, Opcode, Target};
use smallvec::SmallVec;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// An operand of a fusable node: another node or a constant.
#[derive(Debug, Clone, Copy, PartialEq)]
enum In {
    Node(NodeId),
    Const(f32),
}

/// A fusable node as one instruction of the evaluator.
#[derive(Debug, Clone)]
struct Lowered {
    op: FusedOp,
    args: SmallVec<[In; 3]>,
}

/// One group the planner formed.
#[derive(Debug, Clone, PartialEq)]
pub struct FusionGroup {
    /// Names of the member nodes, in graph order (the last is the root).
    pub members: Vec<String>,
    /// Names of the nodes the group reads.
    pub inputs: Vec<String>,
    /// The expression.
    pub expr: String,
}

/// Why a node next to a group was not fused into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Boundary {
    /// The producer left outside.
    pub node: String,
    /// The group's root it feeds.
    pub root: String,
    /// The reason.
    pub reason: String,
}

/// What the fusion pass decided: the groups and the boundaries with their reasons.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FusionPlan {
    /// Groups of two or more ops.
    pub groups: Vec<FusionGroup>,
    /// Neighbours left outside, with why.
    pub boundaries: Vec<Boundary>,
}

impl fmt::Display for FusionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} fused group(s)", self.groups.len())?;
        for g in &self.groups {
            writeln!(f, "  [{}] reads ({})", g.members.join(", "), g.inputs.join(", "))?;
            writeln!(f, "      {}", g.expr)?;
        }
        if !self.boundaries.is_empty() {
            writeln!(f, "not fused:")?;
            for b in &self.boundaries {
                writeln!(f, "  {} -> {}: {}", b.node, b.root, b.reason)?;
            }
        }
        Ok(())
    }
}

/// The float32 shape of a node's value, if shape propagation recorded one.
fn shape_f32(g: &Graph, id: NodeId) -> Option<Vec<usize>> {
    let n = g.node(id).ok()?;
    let m = n.meta().tensor_meta.as_ref()?;
    (m.dtype == DType::F32).then(|| m.shape.clone())
}

/// The shape of a float32 value or of a bool mask (which a float32 op reads as `1.0` / `0.0`).
fn shape_f32_or_mask(g: &Graph, id: NodeId) -> Option<Vec<usize>> {
    let n = g.node(id).ok()?;
    let m = n.meta().tensor_meta.as_ref()?;
    matches!(m.dtype, DType::F32 | DType::Bool).then(|| m.shape.clone())
}

/// Whether `id`'s value is a bool tensor (a comparison: a member of a group, never its root).
fn is_mask(g: &Graph, id: NodeId) -> bool {
    g.node(id).ok().and_then(|n| n.meta().tensor_meta.as_ref().map(|m| m.dtype == DType::Bool)).unwrap_or(false)
}

fn number(a: &Argument) -> Option<f32> {
    match a {
        Argument::Int(i) => Some(*i as f32),
        Argument::Float(x) => Some(*x as f32),
        _ => None,
    }
}

/// An operand of a float32-valued op: a float32 node, a bool mask (promoted to `1.0` / `0.0`
/// as PyTorch promotes it: the op's value being float32 says the promotion happened) or a
/// number.
fn operand(g: &Graph, a: &Argument) -> Option<In> {
    match a {
        Argument::Node(id) => shape_f32_or_mask(g, *id).map(|_| In::Node(*id)),
        other => number(other).map(In::Const),
    }
}

/// The registry op a `call_function` or `call_method` node runs (methods are named by their
/// op).
pub(crate) fn registry_op(n: &Node<'_>) -> Option<&'static OpDef> {
    match n.op() {
        Opcode::CallFunction => n.target().as_op(),
        Opcode::CallMethod => ferrofx_core::op::lookup(n.target().name()),
        _ => None,
    }
}

/// `Some(instruction)` when `n` is fusable (see the module docs).
fn lower(g: &Graph, n: &Node<'_>) -> Option<Lowered> {
    let def = registry_op(n)?;
    if def.effect != Effect::Pure {
        return None;
    }
    let args = n.args();
    let kw = n.kwargs();
    let arg = |i: usize| args.get(i);
    let kwarg = |k: &str| kw.get(k);
    let comparisons = [
        ("eq", FusedOp::Eq),
        ("ne", FusedOp::Ne),
        ("gt", FusedOp::Gt),
        ("ge", FusedOp::Ge),
        ("lt", FusedOp::Lt),
        ("le", FusedOp::Le),
    ];
    if let Some(&(_, op)) = comparisons.iter().find(|(c, _)| *c == def.name) {
        // a bool mask of float32 operands (relu's backward `gt(y, 0)`): fused as 1.0 / 0.0
        // into the float32 op that reads it
        if !is_mask(g, n.id()) || args.len() != 2 || !kw.is_empty() {
            return None;
        }
        let a = match arg(0)? {
            Argument::Node(id) => shape_f32(g, *id).map(|_| In::Node(*id))?,
            _ => return None,
        };
        let b = match arg(1)? {
            Argument::Node(id) => shape_f32(g, *id).map(|_| In::Node(*id))?,
            other => In::Const(number(other)?),
        };
        return Some(Lowered { op, args: SmallVec::from_slice(&[a, b]) });
    }
    shape_f32(g, n.id())?;
    let tensor0 = || match arg(0) {
        Some(Argument::Node(id)) => shape_f32(g, *id).map(|_| In::Node(*id)),
        _ => None,
    };
    let only = |names: &[&str]| kw.keys().all(|k| names.contains(&k.as_str()));
    let name = def.name;
    let unary_ops = [
        ("neg", FusedOp::Neg),
        ("abs", FusedOp::Abs),
        ("relu", FusedOp::Relu),
        ("sigmoid", FusedOp::Sigmoid),
        ("tanh", FusedOp::Tanh),
        ("exp", FusedOp::Exp),
        ("expm1", FusedOp::Expm1),
        ("log", FusedOp::Log),
        ("log1p", FusedOp::Log1p),
        ("sqrt", FusedOp::Sqrt),
        ("rsqrt", FusedOp::Rsqrt),
        ("reciprocal", FusedOp::Reciprocal),
        ("silu", FusedOp::Silu),
        ("erf", FusedOp::Erf),
        ("sin", FusedOp::Sin),
        ("cos", FusedOp::Cos),
        ("floor", FusedOp::Floor),
        ("ceil", FusedOp::Ceil),
        ("trunc", FusedOp::Trunc),
        ("hardswish", FusedOp::Hardswish),
        ("hardsigmoid", FusedOp::Hardsigmoid),
    ];
    if let Some(&(_, op)) = unary_ops.iter().find(|(n, _)| *n == name) {
        if args.len() != 1 || !kw.is_empty() {
            return None;
        }
        return Some(Lowered { op, args: SmallVec::from_slice(&[tensor0()?]) });
    }
    let l = |op, a: &[In]| Some(Lowered { op, args: SmallVec::from_slice(a) });
    match name {
        "add" | "sub" | "rsub" | "mul" | "div" | "maximum" | "minimum" | "pow" => {
            // operators record `alpha` positionally (`add(x, y, 1)`), calls by keyword
            let alpha_ok = match (args.get(2), kwarg("alpha")) {
                (Some(_), Some(_)) => false,
                (Some(a), None) | (None, Some(a)) => number(a) == Some(1.0),
                (None, None) => true,
            };
            let has_alpha = matches!(name, "add" | "sub" | "rsub");
            if !(args.len() == 2 || (has_alpha && args.len() == 3)) || !only(&["alpha"]) || !alpha_ok {
                return None;
            }
            // either operand may be a bool mask (promoted: the node's value is float32)
            let a = match arg(0)? {
                Argument::Node(id) => shape_f32_or_mask(g, *id).map(|_| In::Node(*id))?,
                _ => return None,
            };
            let b = operand(g, arg(1)?)?;
            let op = match name {
                "add" => FusedOp::Add,
                "sub" | "rsub" => FusedOp::Sub,
                "mul" => FusedOp::Mul,
                "div" => FusedOp::Div,
                "maximum" => FusedOp::Maximum,
                "minimum" => FusedOp::Minimum,
                _ => FusedOp::Pow,
            };
            if name == "rsub" {
                l(op, &[b, a])
            } else {
                l(op, &[a, b])
            }
        }
        "relu6" if args.len() == 1 && kw.is_empty() => l(FusedOp::Clamp, &[tensor0()?, In::Const(0.0), In::Const(6.0)]),
        "hardtanh" | "clamp" => {
            if !only(&["min", "max", "min_val", "max_val"]) {
                return None;
            }
            let (dlo, dhi) = if name == "hardtanh" { (Some(-1.0), Some(1.0)) } else { (None, None) };
            let (klo, khi) = if name == "hardtanh" { ("min_val", "max_val") } else { ("min", "max") };
            let bound = |i: usize, k: &str, d: Option<f32>| -> Option<f32> {
                match arg(i).or_else(|| kwarg(k)) {
                    None => Some(d.unwrap_or(if i == 1 { f32::NEG_INFINITY } else { f32::INFINITY })),
                    Some(Argument::None) if name == "clamp" => {
                        Some(if i == 1 { f32::NEG_INFINITY } else { f32::INFINITY })
                    }
                    Some(a) => number(a),
                }
            };
            let (lo, hi) = (bound(1, klo, dlo)?, bound(2, khi, dhi)?);
            if lo > hi || (name == "clamp" && lo == f32::NEG_INFINITY && hi == f32::INFINITY) {
                // an invalid or unbounded clamp keeps the op's own error / no-op semantics
                return None;
            }
            l(FusedOp::Clamp, &[tensor0()?, In::Const(lo), In::Const(hi)])
        }
        "leaky_relu" => {
            if !only(&["negative_slope"]) {
                return None;
            }
            let slope = match arg(1).or_else(|| kwarg("negative_slope")) {
                None => 0.01,
                Some(a) => number(a)?,
            };
            // the unfused op multiplies in f64 then rounds; the constant is rounded first here,
            // which differs in the last bit at most
            l(FusedOp::LeakyRelu, &[tensor0()?, In::Const(slope)])
        }
        "gelu" => {
            if args.len() > 2 || !only(&["approximate"]) {
                return None;
            }
            let op = match arg(1).or_else(|| kwarg("approximate")) {
                None => FusedOp::Gelu,
                Some(Argument::Str(s)) if &**s == "none" => FusedOp::Gelu,
                Some(Argument::Str(s)) if &**s == "tanh" => FusedOp::GeluTanh,
                _ => return None,
            };
            l(op, &[tensor0()?])
        }
        _ => None,
    }
}

/// Plans the groups of `g` (which must carry `tensor_meta`, e.g. from
/// [`ferrofx_fx::ShapeProp`]); nothing is changed.
pub fn plan_fusion(g: &Graph) -> Result<FusionPlan> {
    Ok(plan_groups(g)?.0)
}

type Groups = Vec<(Vec<NodeId>, HashMap<NodeId, Lowered>)>;

fn plan_groups(g: &Graph) -> Result<(FusionPlan, Groups)> {
    let order: Vec<NodeId> = g.iter().map(|n| n.id()).collect();
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let name = |id: NodeId| g.node(id).map(|n| n.name().to_string()).unwrap_or_default();
    let lowered: HashMap<NodeId, Lowered> = g.iter().filter_map(|n| lower(g, &n).map(|l| (n.id(), l))).collect();
    // positions of in-place ops: a group never spans one
    let mutations: Vec<usize> = g
        .iter()
        .filter(|n| registry_op(n).is_some_and(|d| matches!(d.effect, Effect::Mutates(_))))
        .map(|n| pos[&n.id()])
        .collect();
    let mut taken: HashSet<NodeId> = HashSet::new();
    let mut plan = FusionPlan::default();
    let mut groups: Groups = Vec::new();
    for &root in order.iter().rev() {
        if taken.contains(&root) || !lowered.contains_key(&root) || is_mask(g, root) {
            continue;
        }
        let root_shape = shape_f32(g, root);
        let root_pos = pos[&root];
        let mut members: HashSet<NodeId> = HashSet::from([root]);
        let mut inputs: HashSet<NodeId> = HashSet::new();
        // candidates by position, latest first: every user of a candidate that can join the
        // group is decided before the candidate itself
        let mut cand: BTreeMap<usize, NodeId> = BTreeMap::new();
        let push_operands = |m: NodeId, cand: &mut BTreeMap<usize, NodeId>| {
            for a in &lowered[&m].args {
                if let In::Node(p) = a {
                    cand.insert(pos[p], *p);
                }
            }
        };
        push_operands(root, &mut cand);
        let mut boundaries = Vec::new();
        while let Some((p_pos, p)) = cand.pop_last() {
            if members.contains(&p) || inputs.contains(&p) {
                continue;
            }
            let reason = if !lowered.contains_key(&p) {
                None // not an elementwise float32 op: an ordinary input, nothing to explain
            } else if taken.contains(&p) {
                Some("already in a later group".to_string())
            } else if shape_f32_or_mask(g, p) != root_shape {
                Some(format!(
                    "its shape {:?} differs from the group's {:?} (read broadcast, not recomputed)",
                    shape_f32_or_mask(g, p).unwrap_or_default(),
                    root_shape.clone().unwrap_or_default()
                ))
            } else if let Some(u) = g
                .node(p)
                .map_err(|e| Error::argument("fuse_elementwise", e.to_string()))?
                .users()
                .find(|u| !members.contains(u))
            {
                Some(format!("its value is also used by '{}' outside the group", name(u)))
            } else if mutations.iter().any(|&m| m > p_pos && m < root_pos) {
                Some("an in-place op lies between it and the group".to_string())
            } else if members.len() >= MAX_INSTRS {
                Some(format!("the group reached {MAX_INSTRS} ops"))
            } else {
                members.insert(p);
                push_operands(p, &mut cand);
                continue;
            };
            if let Some(reason) = reason {
                boundaries.push(Boundary { node: name(p), root: name(root), reason });
            }
            inputs.insert(p);
        }
        if inputs.len() > MAX_INPUTS {
            continue;
        }
        plan.boundaries.extend(boundaries);
        if members.len() < 2 {
            continue;
        }
        let mut ordered: Vec<NodeId> = members.iter().copied().collect();
        ordered.sort_by_key(|id| pos[id]);
        let low: HashMap<NodeId, Lowered> = ordered.iter().map(|id| (*id, lowered[id].clone())).collect();
        let (expr, ins) = build_expr(&ordered, &low);
        plan.groups.push(FusionGroup {
            members: ordered.iter().map(|&id| name(id)).collect(),
            inputs: ins.iter().map(|&id| name(id)).collect(),
            expr: expr.to_string(),
        });
        taken.extend(ordered.iter().copied());
        groups.push((ordered, low));
    }
    plan.groups.reverse();
    groups.reverse();
    Ok((plan, groups))
}

/// The expression of a group (members in graph order) and its inputs in first-use order.
fn build_expr(ordered: &[NodeId], low: &HashMap<NodeId, Lowered>) -> (FusedExpr, Vec<NodeId>) {
    let tmp: HashMap<NodeId, u16> = ordered.iter().enumerate().map(|(k, id)| (*id, k as u16)).collect();
    let mut inputs: Vec<NodeId> = Vec::new();
    let mut instrs = Vec::with_capacity(ordered.len());
    for id in ordered {
        let l = &low[id];
        let args = l
            .args
            .iter()
            .map(|a| match *a {
                In::Const(c) => Operand::Const(c),
                In::Node(p) => match tmp.get(&p) {
                    Some(&t) => Operand::Tmp(t),
                    None => {
                        let i = inputs.iter().position(|&q| q == p).unwrap_or_else(|| {
                            inputs.push(p);
                            inputs.len() - 1
                        });
                        Operand::Input(i as u16)
                    }
                },
            })
            .collect();
        instrs.push(Instr { op: l.op, args });
    }
    (FusedExpr { instrs }, inputs)
}

fn gerr(e: ferrofx_fx::GraphError) -> Error {
    Error::argument("fuse_elementwise", e.to_string())
}

/// The pass: replaces every group of [`plan_fusion`] by one `fused_elementwise` node. Returns
/// the number of groups made. `gm`'s graph must carry `tensor_meta` (nodes without it are
/// left alone).
///
/// ```
/// use ferrofx_compile::fusion::fuse_elementwise;
/// use ferrofx_core::Tensor;
/// use ferrofx_fx::{trace_with_inputs, ShapeProp};
///
/// #[derive(ferrofx_nn::Module)]
/// struct Seed003 {}
/// impl ferrofx_nn::Module for Seed003 {
///     fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
///         ((x + 1.0)? * 2.0)?.relu()
///     }
/// }
/// let x = ferrofx_core::ops::random::randn(&[4, 5], None)?;
/// let mut gm = trace_with_inputs(&Seed003 {}, &[(&x).into()])?;
/// assert_eq!(fuse_elementwise(&mut gm)?, 1);
/// assert!(gm.graph().to_string().contains("fused_add_mul_relu"));
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn fuse_elementwise(gm: &mut GraphModule) -> Result<usize> {
    let (_, groups) = plan_groups(gm.graph())?;
    let g = gm.graph_mut();
    let target = Target::op(ferrofx_core::ops::fused::FUSED_ELEMENTWISE.name)
        .map_err(|e| Error::argument("fuse_elementwise", e.to_string()))?;
    // a group may read the root of an earlier group, which the fused node has replaced
    let mut replaced: HashMap<NodeId, NodeId> = HashMap::new();
    for (ordered, low) in &groups {
        let (expr, inputs) = build_expr(ordered, low);
        let inputs: Vec<NodeId> = inputs.iter().map(|i| *replaced.get(i).unwrap_or(i)).collect();
        let root = *ordered.last().ok_or_else(|| Error::argument("fuse_elementwise", "empty group"))?;
        let meta = g.node(root).map_err(gerr)?.meta().clone();
        let new = {
            let mut gi = g.inserting_before(Some(root)).map_err(gerr)?;
            gi.call_function(
                target.clone(),
                vec![Argument::list(inputs.iter().map(|&i| Argument::Node(i))), Argument::Str(expr.to_string().into())],
            )
            .map_err(gerr)?
        };
        *g.meta_mut(new).map_err(gerr)? = meta;
        g.rename(new, &format!("fused_{}", expr.short_name())).map_err(gerr)?;
        g.replace_all_uses_with(root, new).map_err(gerr)?;
        replaced.insert(root, new);
        for &m in ordered.iter().rev() {
            g.erase_node(m).map_err(gerr)?;
        }
    }
    Ok(groups.len())
}
