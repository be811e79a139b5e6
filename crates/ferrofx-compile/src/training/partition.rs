//! Splitting a [`JointGraph`] into a forward and a backward [`GraphModule`] (AOTAutograd's
//! partitioners share this step: a partitioner only chooses *which* forward values are saved).
//!
//! * The forward holds every node the forward outputs need, plus the side effects of forward
//!   (BatchNorm's running statistics, `num_batches_tracked`), and returns
//!   `(loss, model outputs..., saved values...)`.
//! * The backward takes `(saved values..., tangent)` and returns one gradient per
//!   [`JointGraph::grad_targets`] entry. A forward value it needs that was not saved is
//!   recomputed inside it from saved values (rematerialisation). Parameters and buffers are
//!   `get_attr` nodes in both halves (never saved).
//! * Random ops and in-place ops are never recomputed (the value would differ, the side effect
//!   would happen twice), except training-mode `batch_norm`, whose recomputation is rewritten to
//!   normalise with the batch statistics without touching the running statistics.

use super::joint::{GradTarget, JointGraph};
use ferrofx_core::op::{Category, Effect, OpDef};
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use ferrofx_fx::graph::{Argument, Graph, GraphError, NodeId, Opcode, Target};
use ferrofx_fx::passes::analysis::node_stats;
use ferrofx_fx::GraphModule;
use ferrofx_nn::Module;
use std::collections::{HashMap, HashSet};

/// Assumed arithmetic rate of the step-time estimate (FLOP/s): a planning figure, not a
/// measurement (the benchmark measures).
pub const ESTIMATE_FLOPS_PER_SECOND: f64 = 10e9;

/// A forward value the forward returns for the backward.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedValue {
    /// The node's name in the joint graph.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its dtype.
    pub dtype: DType,
    /// Its size in bytes.
    pub bytes: u64,
}

/// What a partition costs.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionReport {
    /// Bytes of the saved values (what lives from forward to backward).
    pub saved_bytes: u64,
    /// FLOPs of the forward graph.
    pub forward_flops: u64,
    /// FLOPs of the backward graph, recomputation included.
    pub backward_flops: u64,
    /// FLOPs of the forward nodes the backward recomputes.
    pub recomputed_flops: u64,
    /// Step time estimated from the FLOPs at [`ESTIMATE_FLOPS_PER_SECOND`].
    pub estimated_step_seconds: f64,
}

impl std::fmt::Display for PartitionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "saved {} B, recomputed {} FLOPs (forward {}, backward {}), estimated step {:.3} ms",
            self.saved_bytes,
            self.recomputed_flops,
            self.forward_flops,
            self.backward_flops,
            self.estimated_step_seconds * 1e3
        )
    }
}

/// A forward/backward pair from a [`JointGraph`].
pub struct Partition {
    /// Model inputs → `(loss, model outputs..., saved values...)`.
    pub forward: GraphModule,
    /// `(saved values..., tangent)` → gradients.
    pub backward: GraphModule,
    /// Number of forward outputs before the saved values (loss + model outputs).
    pub num_forward_outputs: usize,
    /// The saved values, in the order the forward returns them.
    pub saved: Vec<SavedValue>,
    /// Names of the forward nodes the backward recomputes.
    pub recomputed: Vec<String>,
    /// What each gradient is the gradient of.
    pub grad_targets: Vec<GradTarget>,
    /// Costs.
    pub report: PartitionReport,
}

impl Partition {
    /// Runs the forward graph: `(forward outputs, saved values)`.
    pub fn run_forward(&self, inputs: &[Value]) -> Result<(Vec<Value>, Vec<Value>)> {
        let mut out = self.forward.forward_values(inputs)?;
        let saved = out.split_off(self.num_forward_outputs);
        Ok((out, saved))
    }

    /// Runs the backward graph on the saved values and the loss gradient `tangent`.
    pub fn run_backward(&self, saved: Vec<Value>, tangent: Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut args = saved;
        args.push(Value::Tensor(tangent));
        // the backward owns the saved values: each is freed after its last use
        let out = self.backward.forward_values_owned(args)?;
        Ok(out.into_iter().map(|v| v.as_tensor().cloned()).collect())
    }

    /// A training step's graphs: forward, then backward with tangent 1.0 (the saved values are
    /// dropped as the backward frees them). Returns `(forward outputs, gradients)`.
    pub fn run(&self, inputs: &[Value]) -> Result<(Vec<Value>, Vec<Option<Tensor>>)> {
        let _g = ferrofx_core::autograd::no_grad();
        let (outs, saved) = self.run_forward(inputs)?;
        let grads = self.run_backward(saved, Tensor::scalar(1.0f32))?;
        Ok((outs, grads))
    }
}

/// The registry op a call node runs.
pub(crate) fn node_op(g: &Graph, id: NodeId) -> Option<&'static OpDef> {
    let n = g.node(id).ok()?;
    match (n.op(), n.target()) {
        (Opcode::CallFunction, Target::Op(d)) => Some(*d),
        (Opcode::CallMethod, Target::Str(m)) => ferrofx_core::op::lookup(m),
        _ => None,
    }
}

/// Whether node `id` is a training-mode `batch_norm` (recomputable without its side effect).
pub(crate) fn is_train_batch_norm(g: &Graph, id: NodeId) -> bool {
    let Some(op) = node_op(g, id) else { return false };
    if op.name != "batch_norm" {
        return false;
    }
    let Ok(n) = g.node(id) else { return false };
    let training = n.args().get(5).or_else(|| n.kwargs().get("training"));
    matches!(training, Some(Argument::Bool(true)))
}

/// Whether the backward may recompute node `id` at all.
pub(crate) fn recomputable(g: &Graph, id: NodeId) -> bool {
    let Ok(n) = g.node(id) else { return false };
    match n.op() {
        Opcode::CallFunction | Opcode::CallMethod => {}
        _ => return false,
    }
    match node_op(g, id) {
        Some(op) => match op.effect {
            Effect::Pure => true,
            Effect::Random => false,
            Effect::Mutates(_) => is_train_batch_norm(g, id),
        },
        // getitem and other plain functions: pure
        None => !n.is_impure(),
    }
}

/// Whether node `id` is a matmul or convolution (not recomputed unless asked).
pub(crate) fn is_expensive(g: &Graph, id: NodeId) -> bool {
    node_op(g, id).is_some_and(|op| matches!(op.category, Category::Linear | Category::Convolution))
}

/// What partitioners need to know about a joint graph.
pub(crate) struct Analysis {
    /// Nodes in graph order (output excluded).
    pub order: Vec<NodeId>,
    /// The forward region.
    pub forward: HashSet<NodeId>,
    /// Forward nodes (not `get_attr`) the backward region reads directly.
    pub used_by_backward: Vec<NodeId>,
    /// Bytes of each node's value (0 when unknown or a tuple).
    pub bytes: HashMap<NodeId, u64>,
    /// FLOPs of each node.
    pub flops: HashMap<NodeId, u64>,
    /// Whether the node has a single tensor value (can be saved).
    pub saveable: HashSet<NodeId>,
}

fn output_items(g: &Graph) -> Result<Vec<Argument>> {
    let out = g.output_node().ok_or_else(|| Error::argument("partition", "the joint graph has no output"))?;
    let n = g.node(out).map_err(|e| Error::argument("partition", e.to_string()))?;
    Ok(match n.args().first() {
        Some(Argument::Tuple(items)) => items.to_vec(),
        Some(a) => vec![a.clone()],
        None => vec![],
    })
}

fn placeholders(g: &Graph) -> Vec<NodeId> {
    g.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.id()).collect()
}

fn ancestors(g: &Graph, roots: impl IntoIterator<Item = NodeId>, stop: &dyn Fn(NodeId) -> bool) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack: Vec<NodeId> = roots.into_iter().collect();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) || stop(id) {
            continue;
        }
        if let Ok(n) = g.node(id) {
            stack.extend(n.all_input_nodes());
        }
    }
    seen
}

impl Analysis {
    pub(crate) fn new(joint: &JointGraph) -> Result<Analysis> {
        let g = joint.gm.graph();
        let ph = placeholders(g);
        let tangent = *ph
            .get(joint.num_primals)
            .ok_or_else(|| Error::argument("partition", "the joint graph has no tangent input"))?;
        let items = output_items(g)?;
        let nodes_of = |a: &[Argument]| {
            let mut v = vec![];
            for x in a {
                x.visit_nodes(&mut |id| v.push(id));
            }
            v
        };
        let fwd_roots = nodes_of(&items[..joint.num_forward_outputs.min(items.len())]);
        // nodes depending on the tangent
        let mut tangent_dep: HashSet<NodeId> = HashSet::new();
        tangent_dep.insert(tangent);
        let order: Vec<NodeId> = g.iter().filter(|n| n.op() != Opcode::Output).map(|n| n.id()).collect();
        for &id in &order {
            if let Ok(n) = g.node(id) {
                if n.all_input_nodes().iter().any(|i| tangent_dep.contains(i)) {
                    tangent_dep.insert(id);
                }
            }
        }
        let side_effects =
            order.iter().copied().filter(|&id| !tangent_dep.contains(&id) && g.node(id).is_ok_and(|n| n.is_impure()));
        let mut roots = fwd_roots;
        roots.extend(side_effects);
        roots.extend(ph[..joint.num_primals].iter().copied());
        let forward = ancestors(g, roots, &|_| false);
        let mut used = vec![];
        let mut used_set = HashSet::new();
        let grad_roots = nodes_of(&items[joint.num_forward_outputs.min(items.len())..]);
        for &id in &grad_roots {
            if forward.contains(&id) && used_set.insert(id) {
                used.push(id);
            }
        }
        let backward = ancestors(g, grad_roots, &|id| forward.contains(&id));
        for &id in &order {
            if !backward.contains(&id) || forward.contains(&id) {
                continue;
            }
            for i in g.node(id).map(|n| n.all_input_nodes()).unwrap_or_default() {
                if forward.contains(&i) && used_set.insert(i) {
                    used.push(i);
                }
            }
        }
        let used_by_backward =
            used.into_iter().filter(|&id| g.node(id).is_ok_and(|n| n.op() != Opcode::GetAttr)).collect::<Vec<_>>();
        let stats = node_stats(&joint.gm)?;
        let mut bytes = HashMap::new();
        let mut flops = HashMap::new();
        let mut saveable = HashSet::new();
        for (n, s) in g.iter().zip(stats) {
            bytes.insert(n.id(), s.output_bytes);
            flops.insert(n.id(), s.flops);
            if n.meta().tensor_meta.is_some() {
                saveable.insert(n.id());
            }
        }
        Ok(Analysis { order, forward, used_by_backward, bytes, flops, saveable })
    }
}

fn graph_err(e: impl std::fmt::Display) -> Error {
    Error::argument("partition", e.to_string())
}

/// Builds the forward/backward pair that saves exactly `saved` (forward nodes, in order).
pub(crate) fn build(joint: &JointGraph, a: &Analysis, saved: &[NodeId]) -> Result<Partition> {
    let g = joint.gm.graph();
    let items = output_items(g)?;
    let nf = joint.num_forward_outputs.min(items.len());
    let ph = placeholders(g);
    let tangent = ph[joint.num_primals];
    let saved_set: HashSet<NodeId> = saved.iter().copied().collect();
    for &s in saved {
        if !a.saveable.contains(&s) {
            let name = g.node(s).map(|n| n.name().to_string()).unwrap_or_default();
            return Err(Error::argument(
                "partition",
                format!("node '{name}' has no single tensor value and cannot be saved"),
            ));
        }
    }
    // --- forward
    let mut fg = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for &id in &a.order {
        if !a.forward.contains(&id) {
            continue;
        }
        let n = g.node(id).map_err(graph_err)?;
        let (owner, this) = (g.id(), fg.id());
        let new = fg
            .node_copy(&n, |old| {
                map.get(&old).map(|&x| Argument::Node(x)).ok_or(GraphError::ForeignNode { id: old, owner, this })
            })
            .map_err(graph_err)?;
        map.insert(id, new);
    }
    let remap = |arg: &Argument, map: &HashMap<NodeId, NodeId>| {
        arg.try_map_nodes(&mut |old| {
            map.get(&old)
                .map(|&x| Argument::Node(x))
                .ok_or_else(|| graph_err("an output reads a value the graph does not compute"))
        })
    };
    let mut fouts = items[..nf].iter().map(|x| remap(x, &map)).collect::<Result<Vec<_>>>()?;
    fouts.extend(saved.iter().map(|s| Argument::Node(map[s])));
    fg.output(Argument::tuple(fouts)).map_err(graph_err)?;
    // --- backward: walk back from the gradients, stopping at saved values
    let grad_items = &items[nf..];
    let mut needed: HashSet<NodeId> = HashSet::new();
    let mut stack = vec![];
    for x in grad_items {
        x.visit_nodes(&mut |id| stack.push(id));
    }
    // a batch_norm recomputed in backward does not read its running statistics
    let skip_arg = |id: NodeId, arg: NodeId| -> bool {
        is_train_batch_norm(g, id)
            && g.node(id).is_ok_and(|n| {
                n.args().get(1).and_then(Argument::as_node) == Some(arg)
                    || n.args().get(2).and_then(Argument::as_node) == Some(arg)
            })
    };
    while let Some(id) = stack.pop() {
        if !needed.insert(id) || saved_set.contains(&id) || id == tangent {
            continue;
        }
        let n = g.node(id).map_err(graph_err)?;
        if n.op() == Opcode::Placeholder {
            return Err(Error::argument(
                "partition",
                format!("the backward needs input '{}', which the partition does not save", n.name()),
            ));
        }
        if a.forward.contains(&id) && n.op() != Opcode::GetAttr && !recomputable(g, id) {
            return Err(Error::argument(
                "partition",
                format!(
                    "the backward needs '{}' ({}), which cannot be recomputed (random or in-place); save it",
                    n.name(),
                    n.target().name()
                ),
            ));
        }
        for i in n.all_input_nodes() {
            if !skip_arg(id, i) {
                stack.push(i);
            }
        }
    }
    let mut bg = Graph::new();
    let mut bmap: HashMap<NodeId, NodeId> = HashMap::new();
    let mut saved_info = Vec::with_capacity(saved.len());
    for &s in saved {
        let n = g.node(s).map_err(graph_err)?;
        let p = bg.placeholder(n.name()).map_err(graph_err)?;
        let tm = n.meta().tensor_meta.clone();
        if let Some(m) = &tm {
            saved_info.push(SavedValue {
                name: n.name().to_string(),
                shape: m.shape.clone(),
                dtype: m.dtype,
                bytes: a.bytes.get(&s).copied().unwrap_or(0),
            });
        }
        bg.meta_mut(p).map_err(graph_err)?.tensor_meta = tm;
        bmap.insert(s, p);
    }
    {
        let n = g.node(tangent).map_err(graph_err)?;
        let p = bg.placeholder(n.name()).map_err(graph_err)?;
        bg.meta_mut(p).map_err(graph_err)?.tensor_meta = n.meta().tensor_meta.clone();
        bmap.insert(tangent, p);
    }
    let mut recomputed = vec![];
    let mut recomputed_flops = 0u64;
    for &id in &a.order {
        if !needed.contains(&id) || bmap.contains_key(&id) {
            continue;
        }
        let n = g.node(id).map_err(graph_err)?;
        let bn = is_train_batch_norm(g, id);
        let (owner, this) = (g.id(), bg.id());
        let new = bg
            .node_copy(&n, |old| {
                if bn && skip_arg(id, old) {
                    return Ok(Argument::None);
                }
                bmap.get(&old).map(|&x| Argument::Node(x)).ok_or(GraphError::ForeignNode { id: old, owner, this })
            })
            .map_err(graph_err)?;
        if a.forward.contains(&id) && n.op() != Opcode::GetAttr {
            recomputed.push(n.name().to_string());
            recomputed_flops += a.flops.get(&id).copied().unwrap_or(0);
        }
        bmap.insert(id, new);
    }
    let bouts = grad_items.iter().map(|x| remap(x, &bmap)).collect::<Result<Vec<_>>>()?;
    bg.output(Argument::tuple(bouts)).map_err(graph_err)?;
    let make = |graph: Graph, name: &str| -> Result<GraphModule> {
        let mut gm = GraphModule::from_parts(
            graph,
            Default::default(),
            joint.gm.attributes().clone(),
            name,
            joint.gm.is_training(),
        )?;
        gm.delete_unused_attributes();
        Ok(gm)
    };
    let forward = make(fg, "JointForward")?;
    let backward = make(bg, "JointBackward")?;
    let sum_flops = |gm: &GraphModule| -> Result<u64> { Ok(node_stats(gm)?.iter().map(|s| s.flops).sum()) };
    let forward_flops = sum_flops(&forward)?;
    let backward_flops = sum_flops(&backward)?;
    let saved_bytes = saved_info.iter().map(|s| s.bytes).sum();
    Ok(Partition {
        forward,
        backward,
        num_forward_outputs: nf,
        saved: saved_info,
        recomputed,
        grad_targets: joint.grad_targets.clone(),
        report: PartitionReport {
            saved_bytes,
            forward_flops,
            backward_flops,
            recomputed_flops,
            estimated_step_seconds: (forward_flops + backward_flops) as f64 / ESTIMATE_FLOPS_PER_SECOND,
        },
    })
}

/// AOTAutograd's `default_partition`: the forward saves every forward value the backward reads
/// (nothing is recomputed).
///
/// ```
/// use ferrofx_compile::training::{capture_joint, default_partition};
/// use ferrofx_nn::zoo::Mlp;
/// use ferrofx_core::Tensor;
/// let mlp = Mlp::new(4, &[3], 2).unwrap();
/// let x = Tensor::from_vec(vec![0.5f32; 8], &[2, 4]).unwrap();
/// let joint = capture_joint(&mlp, &[x.clone().into()], &|out, _| out[0].as_tensor().unwrap().sum(), &[]).unwrap();
/// let p = default_partition(&joint).unwrap();
/// assert!(p.recomputed.is_empty());
/// let (_, grads) = p.run(&[x.into()]).unwrap();
/// assert_eq!(grads.len(), 4);
/// ```
pub fn default_partition(joint: &JointGraph) -> Result<Partition> {
    let a = Analysis::new(joint)?;
    let saved = a.used_by_backward.clone();
    build(joint, &a, &saved)
}
