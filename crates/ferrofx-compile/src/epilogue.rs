//! Epilogue fusion: a float32 2-D convolution followed by a residual `add` and/or an activation
//! (`relu`, `relu6`, `hardtanh`, `clamp`, `silu`, `hardswish`) becomes one
//! `conv2d_fused(x, w, b, stride, padding, dilation, groups, residual, "act")` node
//! ([`ferrofx_core::ops::conv::CONV2D_FUSED`]), which applies the add and the activation to
//! each block of the convolution's output while it is in cache (ONNX Runtime's `FusedConv`,
//! the epilogue of a GEMM in cuDNN/oneDNN terms). The bias (and BatchNorm, folded into the
//! weights and bias by the inference pipeline before this pass) is already part of the
//! convolution.
//!
//! Rules:
//! - the convolution is a `Conv2d` leaf (`call_module`; its weight and bias become attributes
//!   of the GraphModule, sharing the leaf's tensors, read by `get_attr` nodes) or a
//!   `conv2d` `call_function` (ONNX imports), with a float32 value of known shape;
//! - each value absorbed (the convolution's, the add's) has exactly one user, the next op of
//!   the chain: a value used elsewhere stays materialised;
//! - the residual is the other operand of a plain `add` (no `alpha`), float32 of exactly the
//!   output's shape (a broadcast add stays separate);
//! - no in-place op lies between the convolution and the end of the chain (the fused node runs
//!   at the chain's end and must read the same input and residual).
//!
//! The same chains headed by a `batch_norm` `call_function` (training graphs, where BatchNorm
//! normalises with the batch statistics and cannot be folded into the convolution; or an
//! unfolded evaluation-mode BatchNorm) become one `batch_norm_fused(input, running_mean,
//! running_var, weight, bias, training, momentum, eps, residual, "act")` node
//! ([`ferrofx_core::ops::norm::BATCH_NORM_FUSED`]), which applies the add and the activation
//! to each normalised plane while it is in cache. It keeps BatchNorm's side effect (the running
//! statistics), now at the chain's end: the same rule forbids another in-place op in between.
//!
//! Run it after shape propagation and before elementwise fusion (which would otherwise take the
//! `add` + `relu` of a ResNet block into a separate `fused_elementwise` node).

use crate::fusion::registry_op;
use ferrofx_core::op::Effect;
use ferrofx_core::ops::conv::{Activation, CONV2D_FUSED};
use ferrofx_core::ops::norm::BATCH_NORM_FUSED;
use ferrofx_core::{DType, Error, Result};
use ferrofx_fx::{Argument, Graph, GraphModule, Node, NodeId, Opcode, Target};
use ferrofx_nn::Conv2d;
use std::collections::HashMap;

/// The float32 shape of a node's value.
pub(crate) fn shape_f32(g: &Graph, id: NodeId) -> Option<Vec<usize>> {
    let n = g.node(id).ok()?;
    let m = n.meta().tensor_meta.as_ref()?;
    (m.dtype == DType::F32).then(|| m.shape.clone())
}

fn number(a: &Argument) -> Option<f32> {
    match a {
        Argument::Int(i) => Some(*i as f32),
        Argument::Float(x) => Some(*x as f32),
        _ => None,
    }
}

/// The activation `n` applies to its only tensor argument `src`, if it is one the fused
/// convolution can apply.
fn activation_of(n: &Node<'_>, src: NodeId) -> Option<Activation> {
    let def = registry_op(n)?;
    let args = n.args();
    if args.first().and_then(|a| a.as_node()) != Some(src) {
        return None;
    }
    let kw = n.kwargs();
    let arg = |i: usize, k: &str| args.get(i).or_else(|| kw.get(k));
    let plain = args.len() == 1 && kw.is_empty();
    match def.name {
        "relu" if plain => Some(Activation::Relu),
        "relu6" if plain => Some(Activation::Clamp(0.0, 6.0)),
        "silu" if plain => Some(Activation::Silu),
        "hardswish" if plain => Some(Activation::Hardswish),
        "hardtanh" | "clamp" => {
            let (lo_k, hi_k) = if def.name == "hardtanh" { ("min_val", "max_val") } else { ("min", "max") };
            if !kw.keys().all(|k| k == lo_k || k == hi_k) || args.len() > 3 {
                return None;
            }
            let (lo, hi) = match (arg(1, lo_k), arg(2, hi_k)) {
                (Some(a), Some(b)) => (number(a)?, number(b)?),
                (None, None) if def.name == "hardtanh" => (-1.0, 1.0),
                _ => return None, // one-sided or defaulted clamp bounds: left to the clamp op
            };
            (lo <= hi).then_some(Activation::Clamp(lo, hi))
        }
        _ => None,
    }
}

/// The conv2d arguments after the input (`weight, bias, stride, padding, dilation, groups`),
/// as arguments of a `conv2d_fused` node; `None` when `n` is not a convolution this pass
/// handles. `attrs` collects `get_attr` paths to create for a `Conv2d` leaf.
fn conv_operands(gm: &GraphModule, n: &Node<'_>) -> Option<(Argument, ConvParams)> {
    let ints = |v: &[i64]| Argument::list(v.iter().map(|&i| Argument::Int(i)));
    match n.op() {
        Opcode::CallModule => {
            let path = n.target().name();
            let conv = gm.leaf_modules().get(path)?.as_any().downcast_ref::<Conv2d>()?;
            if n.args().len() != 1 || !n.kwargs().is_empty() {
                return None;
            }
            let x = n.args()[0].clone();
            let flat = path.replace('.', "_");
            let params = ConvParams {
                weight: Operand::Attr(format!("{flat}_weight"), conv.weight.clone()),
                bias: conv.bias.as_ref().map(|b| Operand::Attr(format!("{flat}_bias"), b.clone())),
                rest: vec![ints(&conv.stride), ints(&conv.padding), ints(&conv.dilation), Argument::Int(conv.groups)],
            };
            Some((x, params))
        }
        Opcode::CallFunction if n.target().as_op().is_some_and(|d| d.name == "conv2d") => {
            let args = n.args();
            if !n.kwargs().is_empty() || args.len() < 2 || args.len() > 7 {
                return None;
            }
            let get = |i: usize, d: Argument| args.get(i).cloned().unwrap_or(d);
            let params = ConvParams {
                weight: Operand::Arg(args[1].clone()),
                bias: match get(2, Argument::None) {
                    Argument::None => None,
                    b => Some(Operand::Arg(b)),
                },
                rest: vec![
                    get(3, ints(&[1, 1])),
                    get(4, ints(&[0, 0])),
                    get(5, ints(&[1, 1])),
                    get(6, Argument::Int(1)),
                ],
            };
            Some((args[0].clone(), params))
        }
        _ => None,
    }
}

/// A weight or bias: an existing argument or a tensor of a leaf to read with `get_attr`.
#[derive(Debug, Clone)]
enum Operand {
    Arg(Argument),
    /// A GraphModule attribute to register (the leaf's tensor, shared) and read.
    Attr(String, ferrofx_core::Tensor),
}

#[derive(Debug, Clone)]
struct ConvParams {
    weight: Operand,
    bias: Option<Operand>,
    /// stride, padding, dilation, groups
    rest: Vec<Argument>,
}

/// The `batch_norm` arguments after the input (`running_mean, running_var, weight, bias,
/// training, momentum, eps`, defaults filled in), as arguments of a `batch_norm_fused` node;
/// `None` when `n` is not a float32 `batch_norm` call this pass handles.
fn batch_norm_operands(n: &Node<'_>) -> Option<(Argument, Vec<Argument>)> {
    if n.op() != Opcode::CallFunction || n.target().as_op().is_none_or(|d| d.name != "batch_norm") {
        return None;
    }
    let args = n.args();
    if !n.kwargs().is_empty() || args.len() < 3 || args.len() > 8 {
        return None;
    }
    let defaults = [
        Argument::None,
        Argument::None,
        Argument::None,
        Argument::None,
        Argument::Bool(false),
        Argument::Float(0.1),
        Argument::Float(1e-5),
    ];
    let rest = (1..8).map(|i| args.get(i).cloned().unwrap_or_else(|| defaults[i - 1].clone())).collect();
    Some((args[0].clone(), rest))
}

/// What heads a chain: a convolution or a batch norm.
#[derive(Debug, Clone)]
enum Head {
    Conv(ConvParams),
    /// `batch_norm`'s arguments after the input.
    BatchNorm(Vec<Argument>),
}

/// One chain the pass fuses.
#[derive(Debug, Clone)]
struct Chain {
    conv: NodeId,
    x: Argument,
    head: Head,
    /// The `add` and the residual it adds.
    add: Option<(NodeId, NodeId)>,
    /// The activation node and what it computes.
    act: Option<(NodeId, Activation)>,
}

impl Chain {
    fn last(&self) -> NodeId {
        self.act.map(|a| a.0).or(self.add.map(|a| a.0)).unwrap_or(self.conv)
    }
}

/// The only user of `id`, if it has exactly one.
fn only_user(g: &Graph, id: NodeId) -> Option<NodeId> {
    let n = g.node(id).ok()?;
    let mut users = n.users();
    let u = users.next()?;
    users.next().is_none().then_some(u)
}

/// Decides whether a convolution without an add or activation after it becomes a
/// `conv2d_fused` node anyway: `(input shape, weight shape, [stride, padding, dilation,
/// groups])`.
type LonePredicate<'a> = &'a dyn Fn(&[usize], &[usize], &[Argument]) -> bool;

/// The float32 shape of a convolution's weight operand.
fn weight_shape(gm: &GraphModule, o: &Operand) -> Option<Vec<usize>> {
    let t = match o {
        Operand::Attr(_, t) => t.clone(),
        Operand::Arg(a) => {
            let id = a.as_node()?;
            if let Some(s) = shape_f32(gm.graph(), id) {
                return Some(s);
            }
            let n = gm.graph().node(id).ok()?;
            (n.op() == Opcode::GetAttr).then(|| gm.get_attr(n.target().name()).ok())??
        }
    };
    (t.dtype() == DType::F32).then(|| t.shape().to_vec())
}

fn find_chains(gm: &GraphModule, lone: Option<LonePredicate<'_>>) -> Vec<Chain> {
    let g = gm.graph();
    let pos: HashMap<NodeId, usize> = g.iter().enumerate().map(|(i, n)| (n.id(), i)).collect();
    let mutations: Vec<usize> = g
        .iter()
        .filter(|n| registry_op(n).is_some_and(|d| matches!(d.effect, Effect::Mutates(_))))
        .map(|n| pos[&n.id()])
        .collect();
    let mut chains = Vec::new();
    // adds and activations already claimed by an earlier chain (a ResNet block's add has two
    // convolution operands: the first in graph order takes it)
    let mut taken: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    for n in g.iter() {
        let Some(shape) = shape_f32(g, n.id()) else { continue };
        let head = match conv_operands(gm, &n) {
            Some((x, params)) => Some((x, Head::Conv(params))),
            None => batch_norm_operands(&n).map(|(x, rest)| (x, Head::BatchNorm(rest))),
        };
        let Some((x, head)) = head else { continue };
        let mut chain = Chain { conv: n.id(), x, head, add: None, act: None };
        let mut cur = n.id();
        if let Some(u) = only_user(g, cur) {
            let un = g.node(u).ok();
            let is_add = un.as_ref().and_then(registry_op).is_some_and(|d| d.name == "add")
                && un.as_ref().is_some_and(|un| un.args().len() == 2 && un.kwargs().is_empty());
            if let (true, Some(un), false) = (is_add, un, taken.contains(&u)) {
                let ops: Vec<Option<NodeId>> = un.args().iter().map(|a| a.as_node()).collect();
                let other = match (ops[0], ops[1]) {
                    (Some(a), Some(b)) if a == cur && b != cur => Some(b),
                    (Some(a), Some(b)) if b == cur && a != cur => Some(a),
                    _ => None,
                };
                if let Some(r) = other
                    .filter(|&r| shape_f32(g, r).as_ref() == Some(&shape))
                    .filter(|_| shape_f32(g, u).as_ref() == Some(&shape))
                {
                    chain.add = Some((u, r));
                    cur = u;
                }
            }
        }
        if let Some(u) = only_user(g, cur) {
            if let Some(a) = g.node(u).ok().and_then(|un| activation_of(&un, cur)) {
                if shape_f32(g, u).as_ref() == Some(&shape) {
                    chain.act = Some((u, a));
                }
            }
        }
        if chain.add.is_none() && chain.act.is_none() {
            let keep = match (&chain.head, lone) {
                (Head::Conv(p), Some(keep)) => {
                    let xs = chain.x.as_node().and_then(|x| shape_f32(g, x));
                    match (xs, weight_shape(gm, &p.weight)) {
                        (Some(xs), Some(ws)) => keep(&xs, &ws, &p.rest),
                        _ => false,
                    }
                }
                _ => false,
            };
            if !keep {
                continue;
            }
        }
        let (p0, p1) = (pos[&chain.conv], pos[&chain.last()]);
        if mutations.iter().any(|&m| m > p0 && m < p1) {
            continue;
        }
        taken.extend(chain.add.map(|a| a.0));
        taken.extend(chain.act.map(|a| a.0));
        chains.push(chain);
    }
    chains
}

fn gerr(e: ferrofx_fx::GraphError) -> Error {
    Error::argument("fuse_conv_epilogue", e.to_string())
}

/// The pass: replaces every conv → \[add\] → \[activation\] chain (see the module docs) by one
/// `conv2d_fused` node named after the convolution (`conv1_add_relu`). Returns the number of
/// chains fused. `gm`'s graph must carry `tensor_meta` (from [`ferrofx_fx::ShapeProp`]).
///
/// ```
/// use ferrofx_compile::epilogue::fuse_conv_epilogue;
/// use ferrofx_core::Tensor;
/// use ferrofx_fx::{trace_with_inputs, ShapeProp};
/// use ferrofx_nn::{Conv2d, Conv2dOpts, Module};
///
/// #[derive(ferrofx_nn::Module)]
/// struct Block { conv: Conv2d }
/// impl Module for Block {
///     fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
///         (self.conv.forward(x)? + x)?.relu()
///     }
/// }
/// let m = Block { conv: Conv2d::with(4, 4, 3, Conv2dOpts { padding: 1, ..Default::default() })? };
/// let x = ferrofx_core::ops::random::randn(&[1, 4, 6, 6], None)?;
/// let mut gm = trace_with_inputs(&m, &[(&x).into()])?;
/// ShapeProp::propagate(&mut gm, &[(&x).into()])?;
/// assert_eq!(fuse_conv_epilogue(&mut gm)?, 1);
/// let code = gm.graph().to_string();
/// assert!(code.contains("conv2d_fused") && code.contains("relu"), "{code}");
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn fuse_conv_epilogue(gm: &mut GraphModule) -> Result<usize> {
    fuse_chains(gm, None)
}

/// Makes each float32 convolution that has no add or activation to absorb a `conv2d_fused`
/// node (no residual, activation `none`) when `keep` says so: what the layout pass converts.
pub(crate) fn wrap_lone_convs(gm: &mut GraphModule, keep: LonePredicate<'_>) -> Result<usize> {
    fuse_chains(gm, Some(keep))
}

fn fuse_chains(gm: &mut GraphModule, lone: Option<LonePredicate<'_>>) -> Result<usize> {
    let chains: Vec<Chain> =
        find_chains(gm, lone).into_iter().filter(|c| lone.is_none() || (c.add.is_none() && c.act.is_none())).collect();
    let conv_target = Target::op(CONV2D_FUSED.name).map_err(gerr)?;
    let bn_target = Target::op(BATCH_NORM_FUSED.name).map_err(gerr)?;
    // a fused leaf's weight and bias become attributes of the GraphModule (sharing the
    // tensors), which every executor (the plan, the Interpreter, a reloaded file) reads
    for c in &chains {
        if let Head::Conv(params) = &c.head {
            for o in [Some(&params.weight), params.bias.as_ref()].into_iter().flatten() {
                if let Operand::Attr(p, t) = o {
                    gm.register_attribute(p, t.clone(), ferrofx_nn::TensorKind::Parameter);
                }
            }
        }
    }
    let g = gm.graph_mut();
    // a chain may read the end of an earlier chain (the previous block's output), which the
    // fused node has replaced
    let mut replaced: HashMap<NodeId, NodeId> = HashMap::new();
    let remap = |a: &Argument, replaced: &HashMap<NodeId, NodeId>| match a {
        Argument::Node(id) => Argument::Node(*replaced.get(id).unwrap_or(id)),
        other => other.clone(),
    };
    for c in &chains {
        let last = c.last();
        let meta = g.node(last).map_err(gerr)?.meta().clone();
        let conv_name = g.node(c.conv).map_err(gerr)?.name().to_string();
        let new = {
            let mut gi = g.inserting_before(Some(last)).map_err(gerr)?;
            let mut operand = |o: &Operand| -> Result<Argument> {
                Ok(match o {
                    Operand::Arg(a) => remap(a, &replaced),
                    Operand::Attr(p, _) => Argument::Node(gi.get_attr(p).map_err(gerr)?),
                })
            };
            let mut args = vec![remap(&c.x, &replaced)];
            let target = match &c.head {
                Head::Conv(params) => {
                    let w = operand(&params.weight)?;
                    let b = match &params.bias {
                        Some(o) => operand(o)?,
                        None => Argument::None,
                    };
                    args.extend([w, b]);
                    args.extend(params.rest.iter().map(|a| remap(a, &replaced)));
                    &conv_target
                }
                Head::BatchNorm(rest) => {
                    args.extend(rest.iter().map(|a| remap(a, &replaced)));
                    &bn_target
                }
            };
            args.push(c.add.map_or(Argument::None, |(_, r)| Argument::Node(*replaced.get(&r).unwrap_or(&r))));
            args.push(Argument::Str(c.act.map_or(Activation::None, |a| a.1).to_string().into()));
            gi.call_function(target.clone(), args).map_err(gerr)?
        };
        *g.meta_mut(new).map_err(gerr)? = meta;
        let mut name = conv_name;
        if c.add.is_some() {
            name.push_str("_add");
        }
        if let Some((_, a)) = c.act {
            let a = a.to_string();
            name.push('_');
            name.push_str(a.split('(').next().unwrap_or("act"));
        }
        g.rename(new, &name).map_err(gerr)?;
        g.replace_all_uses_with(last, new).map_err(gerr)?;
        replaced.insert(last, new);
        for id in [c.act.map(|a| a.0), c.add.map(|a| a.0), Some(c.conv)].into_iter().flatten() {
            g.erase_node(id).map_err(gerr)?;
        }
    }
    if !chains.is_empty() {
        // the fused leaves are no longer called
        gm.delete_all_unused_submodules();
    }
    Ok(chains.len())
}
