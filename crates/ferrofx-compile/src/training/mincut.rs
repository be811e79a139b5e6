//! The min-cut rematerialisation partitioner (AOTAutograd's
//! `min_cut_rematerialization_partition`), the memory budget, and activation checkpointing of
//! chosen submodules as a graph pass.
//!
//! The choice of saved values is a minimum cut. Every forward node `v` becomes two vertices
//! `v_in → v_out` joined by an edge of capacity *bytes of v* (cutting it = saving v); data
//! dependencies are infinite edges `u_out → v_in`; forward values the backward reads are joined
//! to the sink, and the model inputs and the nodes that must not be recomputed (random, in-place,
//! matmul/convolution unless asked) to the source. A node on the sink side of the cut is
//! recomputed in the backward. Recomputation itself is priced by an edge `source → v_in` of
//! capacity `λ · FLOPs(v)`: with λ = 0 the cut minimises saved bytes alone (the smallest
//! footprint any partition reaches), with λ → ∞ nothing is recomputed (the default partition).
//! A memory budget is met by searching the largest λ whose cut fits.

use super::joint::JointGraph;
use super::maxflow::{FlowGraph, INF};
use super::partition::{build, is_expensive, recomputable, Analysis, Partition};
use ferrofx_core::{Error, Result};
use ferrofx_fx::graph::{Graph, NodeId, Opcode};
use std::collections::{HashMap, HashSet};

/// A memory budget for the saved values (the type is `ferrofx_core`'s, shared with the eager
/// checkpoint planner): a fraction of the default partition's saved bytes, or bytes.
pub use ferrofx_core::memory::MemoryBudget;

/// Submodules whose forward is recomputed in backward (activation checkpointing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSelector {
    /// A module by qualified path (`layer1.0`), with everything inside it.
    Path(String),
    /// Every module of a type (`BasicBlock`).
    Type(String),
}

/// Options of [`min_cut_rematerialization_partition`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionOptions {
    /// Limit on the saved bytes; `None`: the smallest footprint.
    pub memory_budget: Option<MemoryBudget>,
    /// Allow recomputing matmuls and convolutions (off: they are always saved when needed).
    pub recompute_matmul: bool,
}

/// The cost weights of one cut.
struct Weights<'a> {
    /// Bytes per FLOP charged for recomputing a node; `None`: recomputation outside checkpointed
    /// regions is not allowed.
    lambda: Option<f64>,
    recompute_matmul: bool,
    /// Nodes inside checkpointed submodules: never saved, recomputed for free.
    checkpointed: &'a HashSet<NodeId>,
}

/// Bytes are scaled so a per-node tie-break of 1 (prefer saving to recomputing at equal
/// memory) never outweighs a byte.
const SCALE: u64 = 1024;

fn cut(g: &Graph, a: &Analysis, w: &Weights<'_>) -> Result<Vec<NodeId>> {
    let nodes: Vec<NodeId> = a
        .order
        .iter()
        .copied()
        .filter(|id| a.forward.contains(id) && g.node(*id).is_ok_and(|n| n.op() != Opcode::GetAttr))
        .collect();
    let index: HashMap<NodeId, usize> = nodes.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let (src, sink) = (0usize, 1usize);
    let vin = |i: usize| 2 + 2 * i;
    let vout = |i: usize| 3 + 2 * i;
    let mut f = FlowGraph::new(2 + 2 * nodes.len());
    for (i, &id) in nodes.iter().enumerate() {
        let n = g.node(id).map_err(|e| Error::argument("partition", e.to_string()))?;
        let marked = w.checkpointed.contains(&id);
        let can = recomputable(g, id) && (w.recompute_matmul || marked || !is_expensive(g, id));
        let saveable = a.saveable.contains(&id);
        let bytes = a.bytes.get(&id).copied().unwrap_or(0);
        let save_cost = if !saveable || (marked && can) { INF } else { bytes.saturating_mul(SCALE).saturating_add(1) };
        f.add_edge(vin(i), vout(i), save_cost);
        if !can {
            f.add_edge(src, vin(i), INF);
        } else if !marked {
            let flops = a.flops.get(&id).copied().unwrap_or(0) as f64;
            let price = match w.lambda {
                None => INF,
                Some(l) => {
                    let p = l * flops * SCALE as f64;
                    if p >= INF as f64 {
                        INF
                    } else {
                        p as u64 + 1
                    }
                }
            };
            f.add_edge(src, vin(i), price);
        }
        for u in n.all_input_nodes() {
            if let Some(&j) = index.get(&u) {
                f.add_edge(vout(j), vin(i), INF);
            }
        }
    }
    for id in &a.used_by_backward {
        if let Some(&i) = index.get(id) {
            f.add_edge(vout(i), sink, INF);
        }
    }
    let (flow, side) = f.min_cut(src, sink);
    if flow >= INF {
        return Err(Error::argument(
            "partition",
            "no partition exists: a value the backward needs can neither be saved nor recomputed",
        ));
    }
    Ok(nodes.iter().enumerate().filter(|&(i, _)| side[vin(i)] && !side[vout(i)]).map(|(_, &id)| id).collect())
}

fn saved_bytes(a: &Analysis, saved: &[NodeId]) -> u64 {
    saved.iter().map(|id| a.bytes.get(id).copied().unwrap_or(0)).sum()
}

/// AOTAutograd's `min_cut_rematerialization_partition`: saves the set of forward values of
/// least total size from which the backward can recompute what it needs with cheap ops
/// (elementwise, views, reductions, normalisation statistics; matmul and convolution only with
/// `recompute_matmul`). With a [`MemoryBudget`] it recomputes only as much as the budget
/// requires (fewest FLOPs first). A budget below the smallest footprint is an error naming it.
///
/// ```
/// use ferrofx_compile::training::{capture_joint, default_partition, min_cut_rematerialization_partition, PartitionOptions, MemoryBudget};
/// use ferrofx_nn::zoo::Mlp;
/// use ferrofx_core::Tensor;
/// let mlp = Mlp::new(16, &[32, 32], 4).unwrap();
/// let x = Tensor::from_vec(vec![0.5f32; 128], &[8, 16]).unwrap();
/// let joint = capture_joint(&mlp, &[x.clone().into()], &|out, _| out[0].as_tensor().unwrap().tanh()?.sum(), &[]).unwrap();
/// let default = default_partition(&joint).unwrap();
/// // an MLP saves little but matmul inputs: meeting 80% means recomputing a matmul, if allowed
/// let opts = PartitionOptions {
///     memory_budget: Some(MemoryBudget::Fraction(0.8)),
///     recompute_matmul: true,
///     ..Default::default()
/// };
/// let p = min_cut_rematerialization_partition(&joint, &opts).unwrap();
/// assert!(p.report.saved_bytes as f64 <= 0.8 * default.report.saved_bytes as f64);
/// let too_small = PartitionOptions { memory_budget: Some(MemoryBudget::Bytes(1)), ..Default::default() };
/// let err = min_cut_rematerialization_partition(&joint, &too_small).err().expect("an unreachable budget is an error");
/// assert!(err.to_string().contains("smallest"), "{err}");
/// ```
pub fn min_cut_rematerialization_partition(joint: &JointGraph, opts: &PartitionOptions) -> Result<Partition> {
    let a = Analysis::new(joint)?;
    let g = joint.gm.graph();
    let none = HashSet::new();
    let weights =
        |lambda: Option<f64>| Weights { lambda, recompute_matmul: opts.recompute_matmul, checkpointed: &none };
    let smallest = cut(g, &a, &weights(Some(0.0)))?;
    let smallest_bytes = saved_bytes(&a, &smallest);
    let Some(budget) = opts.memory_budget else {
        return build(joint, &a, &smallest);
    };
    let default_bytes = saved_bytes(&a, &a.used_by_backward);
    let limit = budget.limit(default_bytes, "memory_budget")?;
    if smallest_bytes > limit {
        return Err(Error::limit(
            "memory_budget",
            format!(
                "memory budget {limit} B cannot be met: the smallest achievable saved memory is {smallest_bytes} B ({:.3} of the default partition's {default_bytes} B){}",
                smallest_bytes as f64 / default_bytes.max(1) as f64,
                if opts.recompute_matmul { "" } else { "; allowing matmul/convolution recomputation (recompute_matmul) may lower it" }
            ),
        ));
    }
    if default_bytes <= limit {
        let saved = a.used_by_backward.clone();
        return build(joint, &a, &saved);
    }
    // the largest price of recomputation (least recomputation) whose cut fits: bisection on
    // log λ between "bytes only" and "a FLOP costs as much as 2^20 bytes"
    let (mut lo, mut hi) = (-40.0f64, 20.0f64);
    let mut best = smallest;
    for _ in 0..36 {
        let mid = 0.5 * (lo + hi);
        let s = cut(g, &a, &weights(Some(mid.exp2())))?;
        if saved_bytes(&a, &s) <= limit {
            best = s;
            lo = mid;
        } else {
            hi = mid;
        }
    }
    build(joint, &a, &best)
}

/// Whether node `id` was traced inside a selected submodule.
fn selected(g: &Graph, id: NodeId, selectors: &[ModuleSelector]) -> bool {
    let Ok(n) = g.node(id) else { return false };
    n.meta().nn_module_stack.iter().any(|frame| {
        selectors.iter().any(|s| match s {
            ModuleSelector::Path(p) => frame.path == *p || frame.path.starts_with(&format!("{p}.")),
            ModuleSelector::Type(t) => frame.type_name == *t,
        })
    })
}

/// Activation checkpointing as a graph pass (`torch.utils.checkpoint` on chosen submodules):
/// the forward values computed inside the selected submodules are not saved but recomputed in
/// backward (convolutions and matmuls included, as eager checkpointing reruns the whole region);
/// everything else is saved as in the default partition. Random ops inside a region are the
/// exception: their outputs are saved (the graph cannot replay the generator).
///
/// ```
/// use ferrofx_compile::training::{capture_joint, checkpoint_modules, default_partition, ModuleSelector};
/// use ferrofx_nn::zoo::Mlp;
/// use ferrofx_core::Tensor;
/// let mlp = Mlp::new(16, &[32, 32], 4).unwrap();
/// let x = Tensor::from_vec(vec![0.5f32; 128], &[8, 16]).unwrap();
/// let joint = capture_joint(&mlp, &[x.clone().into()], &|out, _| out[0].as_tensor().unwrap().sum(), &[]).unwrap();
/// let p = checkpoint_modules(&joint, &[ModuleSelector::Type("ReLU".into())]).unwrap();
/// assert!(!p.recomputed.is_empty()); // the ReLUs' outputs are recomputed in backward
/// // ... from their inputs, which are saved instead: never more than the default partition
/// assert!(p.report.saved_bytes <= default_partition(&joint).unwrap().report.saved_bytes);
/// ```
pub fn checkpoint_modules(joint: &JointGraph, selectors: &[ModuleSelector]) -> Result<Partition> {
    let a = Analysis::new(joint)?;
    let g = joint.gm.graph();
    let marked: HashSet<NodeId> =
        a.order.iter().copied().filter(|&id| a.forward.contains(&id) && selected(g, id, selectors)).collect();
    if marked.is_empty() {
        return Err(Error::argument(
            "checkpoint_modules",
            format!("no node of the forward was traced inside {selectors:?}; name a submodule path or a module type of the model"),
        ));
    }
    let saved = cut(g, &a, &Weights { lambda: None, recompute_matmul: false, checkpointed: &marked })?;
    build(joint, &a, &saved)
}
