//! Per-node analysis of a [`GraphModule`]: FLOPs (the op registry's cost functions; a
//! multiply-add counts 2, elementwise ops one per output element), output activation memory,
//! shape and dtype per node, totals per module, [`tabular`] (FX's `print_tabular` with those
//! columns), and a node-level [`profile`] built on the [`Interpreter`] (time per node and per
//! module, sorted).
//!
//! Shapes come from `tensor_meta`: trace with example inputs (`trace_with_inputs`) or run
//! `ShapeProp` first. A leaf module's FLOPs are those of its body, traced down to ops with
//! the leaf's input shapes.
//!
//! ```
//! use ferrofx_fx::passes::analysis::{node_stats, tabular};
//! use ferrofx_fx::trace_with_inputs;
//! use ferrofx_nn::{Linear, Sequential};
//! let net = Sequential::new().append(Linear::new(8, 4, true)?);
//! let x = ferrofx_core::Tensor::from_vec(vec![0.0f32; 16], &[2, 8])?;
//! let gm = trace_with_inputs(&net, &[(&x).into()])?;
//! let stats = node_stats(&gm)?;
//! let call = stats.iter().find(|s| s.opcode == "call_module").expect("the linear call");
//! assert_eq!(call.flops, 2 * 2 * 8 * 4); // multiply-adds of the matrix product, as FlopCounterMode
//! assert_eq!(call.output_bytes, 2 * 4 * 4);
//! assert!(tabular(&gm)?.lines().next().unwrap().contains("FLOPs"));
//! # Ok::<(), ferrofx_core::Error>(())
//! ```

use crate::graph::{Argument, Graph, Node, Opcode, Target};
use crate::graph_module::GraphModule;
use crate::interpreter::{default_run_node, Env, Interpreter, NodeValue};
use crate::Tracer;
use ferrofx_core::trace::Symbolic;
use ferrofx_core::{DType, Error, Result, Tensor, TensorMeta, Value};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one node computes.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStats {
    /// The node's name.
    pub name: String,
    /// Its opcode (`call_module`, ...).
    pub opcode: &'static str,
    /// Its target.
    pub target: String,
    /// The arguments as FX prints them.
    pub args: String,
    /// Output shape, when known.
    pub shape: Option<Vec<usize>>,
    /// Output dtype, when known.
    pub dtype: Option<DType>,
    /// Floating point operations (0 for placeholders, attributes, views).
    pub flops: u64,
    /// Bytes of the node's output tensor (its activation memory).
    pub output_bytes: u64,
    /// The module the node belongs to: a leaf's own path, or the innermost module of the
    /// `nn_module_stack` ("" at the top level).
    pub module: String,
}

fn meta_of(n: &Node<'_>) -> Option<TensorMeta> {
    n.meta().tensor_meta.as_ref().map(|m| TensorMeta {
        shape: m.shape.as_slice().into(),
        dtype: m.dtype,
        strides: m.strides.iter().map(|&s| s as usize).collect::<Vec<_>>().as_slice().into(),
    })
}

fn symbolic(meta: Option<TensorMeta>) -> Value {
    Value::Tensor(Tensor::symbolic(Symbolic { meta, proxy: Arc::new(()) }))
}

/// A graph argument as a value for a cost function: nodes become symbolic tensors with their
/// `tensor_meta`, literals stay literals.
fn stand_in(g: &Graph, a: &Argument) -> Result<Value> {
    Ok(match a {
        Argument::Node(id) => {
            let node = g.node(*id).map_err(|e| Error::argument("node_stats", e.to_string()))?;
            symbolic(meta_of(&node))
        }
        Argument::Int(i) => Value::Int(*i),
        Argument::Float(f) => Value::Float(*f),
        Argument::Bool(b) => Value::Bool(*b),
        Argument::Str(s) => Value::Str(s.to_string()),
        Argument::DType(d) => Value::DType(*d),
        Argument::List(v) | Argument::Tuple(v) => {
            if v.iter().all(|x| matches!(x, Argument::Int(_))) {
                Value::Ints(v.iter().filter_map(|x| if let Argument::Int(i) = x { Some(*i) } else { None }).collect())
            } else {
                Value::Tensors(
                    v.iter()
                        .filter_map(|x| x.as_node())
                        .filter_map(|id| g.node(id).ok().map(|n| meta_of(&n)))
                        .map(|m| Tensor::symbolic(Symbolic { meta: m, proxy: Arc::new(()) }))
                        .collect(),
                )
            }
        }
        _ => Value::None,
    })
}

/// FLOPs of a call node from the registry's cost function (0 when the op has no cost or the
/// shapes are unknown).
fn op_flops(g: &Graph, n: &Node<'_>) -> u64 {
    let def = match (n.op(), n.target()) {
        (Opcode::CallFunction, Target::Op(d)) => *d,
        (Opcode::CallMethod, Target::Str(m)) => match ferrofx_core::op::lookup(m) {
            Some(d) => d,
            None => return 0,
        },
        _ => return 0,
    };
    let Some(out) = meta_of(n) else { return 0 };
    let args = n.args().iter().map(|a| stand_in(g, a)).collect::<Result<Vec<_>>>();
    let kwargs = n.kwargs().iter().map(|(k, v)| Ok((k.clone(), stand_in(g, v)?))).collect::<Result<Vec<_>>>();
    let (Ok(args), Ok(kwargs)) = (args, kwargs) else { return 0 };
    match ferrofx_core::op::bind(def.name, def.schema, args, kwargs) {
        Ok(bound) => (def.cost)(&bound, &[out]).flops,
        Err(_) => 0,
    }
}

/// FLOPs of a leaf module's body on inputs of the node's argument shapes.
fn leaf_flops(gm: &GraphModule, n: &Node<'_>) -> Result<u64> {
    let path = n.target().name();
    let Some(module) = gm.leaf_modules().get(path) else { return Ok(0) };
    let g = gm.graph();
    let inputs = n.args().iter().map(|a| stand_in(g, a)).collect::<Result<Vec<_>>>()?;
    if inputs.iter().any(|v| v.as_tensor().is_some_and(|t| t.meta().is_none())) {
        return Ok(0);
    }
    let body = Tracer::new().is_leaf_module(|_, _| false).trace_with_inputs(module.as_ref(), &inputs)?;
    let bg = body.graph();
    Ok(bg.iter().map(|m| op_flops(bg, &m)).sum())
}

/// One [`NodeStats`] per node, in graph order.
pub fn node_stats(gm: &GraphModule) -> Result<Vec<NodeStats>> {
    let g = gm.graph();
    let mut out = Vec::with_capacity(g.len());
    for n in g.iter() {
        let meta = n.meta().tensor_meta.clone();
        let flops = match n.op() {
            Opcode::CallFunction | Opcode::CallMethod => op_flops(g, &n),
            Opcode::CallModule => leaf_flops(gm, &n)?,
            _ => 0,
        };
        let output_bytes = match (n.op(), &meta) {
            (Opcode::Output, _) | (_, None) => 0,
            (_, Some(m)) => (m.shape.iter().product::<usize>() * m.dtype.size()) as u64,
        };
        let module = match n.op() {
            Opcode::CallModule => n.target().name().to_string(),
            _ => n.meta().nn_module_stack.last().map(|e| e.path.clone()).unwrap_or_default(),
        };
        let args = g.format_node(n.id()).ok().and_then(|l| l.split_once("](").map(|(_, rest)| rest.to_string()));
        out.push(NodeStats {
            name: n.name().to_string(),
            opcode: n.op().as_str(),
            target: n.target().name().to_string(),
            args: args.map(|a| a.trim_end_matches(')').to_string()).unwrap_or_default(),
            shape: meta.as_ref().map(|m| m.shape.clone()),
            dtype: meta.as_ref().map(|m| m.dtype),
            flops,
            output_bytes,
            module,
        });
    }
    Ok(out)
}

/// FLOPs and output bytes summed per module path, each node counted in its module and in every
/// enclosing one (`layer1.0` also counts into `layer1`; the top level `""` holds the total).
pub fn module_stats(stats: &[NodeStats]) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in stats {
        let mut path = s.module.as_str();
        loop {
            let e = out.entry(path.to_string()).or_default();
            e.0 += s.flops;
            e.1 += s.output_bytes;
            if path.is_empty() {
                break;
            }
            path = path.rsplit_once('.').map_or("", |(p, _)| p);
        }
    }
    out
}

fn human(v: u64) -> String {
    match v {
        0 => "0".to_string(),
        v if v >= 1_000_000_000 => format!("{:.2}G", v as f64 / 1e9),
        v if v >= 1_000_000 => format!("{:.2}M", v as f64 / 1e6),
        v if v >= 1_000 => format!("{:.1}K", v as f64 / 1e3),
        v => v.to_string(),
    }
}

fn table(rows: Vec<Vec<String>>) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let mut widths = vec![0usize; cols];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let mut line = String::new();
        for (j, (c, w)) in r.iter().zip(&widths).enumerate() {
            if j > 0 {
                line.push_str("  ");
            }
            let _ = write!(line, "{c:<w$}");
        }
        out.push_str(line.trim_end());
        out.push('\n');
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&rule.join("  "));
            out.push('\n');
        }
    }
    out
}

/// FX's `print_tabular` with analysis columns: opcode, name, target, args, shape, dtype,
/// FLOPs and output bytes, and a total line.
pub fn tabular(gm: &GraphModule) -> Result<String> {
    let stats = node_stats(gm)?;
    let mut rows =
        vec![["opcode", "name", "target", "args", "shape", "dtype", "FLOPs", "out bytes"].map(String::from).to_vec()];
    for s in &stats {
        rows.push(vec![
            s.opcode.to_string(),
            s.name.clone(),
            s.target.clone(),
            s.args.clone(),
            s.shape.as_ref().map(|v| format!("{v:?}")).unwrap_or_default(),
            s.dtype.map(|d| d.name().to_string()).unwrap_or_default(),
            human(s.flops),
            human(s.output_bytes),
        ]);
    }
    let (flops, bytes) = stats.iter().fold((0u64, 0u64), |(f, b), s| (f + s.flops, b + s.output_bytes));
    rows.push(vec![
        "total".into(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        human(flops),
        human(bytes),
    ]);
    Ok(table(rows))
}

/// Time spent in one node, from [`profile`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTime {
    /// The node's name.
    pub name: String,
    /// Its opcode.
    pub opcode: &'static str,
    /// Its module (as in [`NodeStats::module`]).
    pub module: String,
    /// Best time over the runs.
    pub time: Duration,
}

/// A node-level profile: nodes sorted by time (slowest first) and totals per module.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// Per node, slowest first.
    pub nodes: Vec<NodeTime>,
    /// Per module path (with enclosing modules, as [`module_stats`]), slowest first.
    pub modules: Vec<(String, Duration)>,
}

impl Profile {
    /// The sum of the node times.
    pub fn total(&self) -> Duration {
        self.nodes.iter().map(|n| n.time).sum()
    }

    /// The profile as two tables (nodes, modules), at most `top` rows each.
    pub fn table(&self, top: usize) -> String {
        let total = self.total().as_secs_f64().max(1e-12);
        let mut rows = vec![["node", "opcode", "module", "time", "share"].map(String::from).to_vec()];
        for n in self.nodes.iter().take(top) {
            rows.push(vec![
                n.name.clone(),
                n.opcode.to_string(),
                n.module.clone(),
                format!("{:.1} µs", n.time.as_secs_f64() * 1e6),
                format!("{:.1}%", 100.0 * n.time.as_secs_f64() / total),
            ]);
        }
        let mut out = table(rows);
        let mut rows = vec![["module", "time", "share"].map(String::from).to_vec()];
        for (m, t) in self.modules.iter().take(top) {
            rows.push(vec![
                if m.is_empty() { "(all)".to_string() } else { m.clone() },
                format!("{:.1} µs", t.as_secs_f64() * 1e6),
                format!("{:.1}%", 100.0 * t.as_secs_f64() / total),
            ]);
        }
        out.push('\n');
        out.push_str(&table(rows));
        out
    }
}

/// The Interpreter that times every node.
struct Timer<'m> {
    gm: &'m GraphModule,
    times: Vec<Duration>,
    index: std::collections::HashMap<crate::graph::NodeId, usize>,
}

impl<'m> Interpreter<'m> for Timer<'m> {
    fn module(&self) -> &'m GraphModule {
        self.gm
    }

    fn run_node(&mut self, node: Node<'m>, env: &Env) -> Result<NodeValue> {
        let start = Instant::now();
        let v = default_run_node(self, node, env)?;
        let t = start.elapsed();
        if let Some(&i) = self.index.get(&node.id()) {
            self.times[i] = self.times[i].min(t);
        }
        Ok(v)
    }
}

/// Runs `gm` on `inputs` `runs` times through the [`Interpreter`] (no autograd) and reports the
/// best time of every node, sorted, and the time per module.
pub fn profile(gm: &GraphModule, inputs: &[Value], runs: usize) -> Result<Profile> {
    if runs == 0 {
        return Err(Error::argument("profile", "runs must be at least 1"));
    }
    let g = gm.graph();
    let nodes: Vec<Node<'_>> = g.iter().collect();
    let index = nodes.iter().enumerate().map(|(i, n)| (n.id(), i)).collect();
    let mut timer = Timer { gm, times: vec![Duration::MAX; nodes.len()], index };
    {
        let _g = ferrofx_core::autograd::no_grad();
        for _ in 0..runs {
            timer.run(inputs)?;
        }
    }
    let mut out = Profile::default();
    let mut per_module: BTreeMap<String, Duration> = BTreeMap::new();
    for (n, t) in nodes.iter().zip(&timer.times) {
        if matches!(n.op(), Opcode::Placeholder | Opcode::Output) || *t == Duration::MAX {
            continue;
        }
        let module = match n.op() {
            Opcode::CallModule => n.target().name().to_string(),
            _ => n.meta().nn_module_stack.last().map(|e| e.path.clone()).unwrap_or_default(),
        };
        let mut path = module.as_str();
        loop {
            *per_module.entry(path.to_string()).or_default() += *t;
            if path.is_empty() {
                break;
            }
            path = path.rsplit_once('.').map_or("", |(p, _)| p);
        }
        out.nodes.push(NodeTime { name: n.name().to_string(), opcode: n.op().as_str(), module, time: *t });
    }
    out.nodes.sort_by_key(|n| std::cmp::Reverse(n.time));
    out.modules = per_module.into_iter().collect();
    out.modules.sort_by_key(|m| std::cmp::Reverse(m.1));
    Ok(out)
}
