//! Automatic partitioners for [`split_module`]: pipeline stages balanced by cost, or bounded by
//! memory per stage.
//!
//! Both cut the graph's computing nodes, in graph (topological) order, into contiguous ranges,
//! so values always flow from a stage to later ones (no cycles, one send per boundary value).
//! They read each node's output shape from `tensor_meta`: run [`ShapeProp`](crate::ShapeProp)
//! on example inputs first.
//!
//! * **Cost** of a node: the registry's FLOPs (leaf modules: their body's FLOPs) plus the bytes
//!   it writes times [`FLOPS_PER_BYTE`], a machine balance that makes memory-bound nodes
//!   (activations, adds, pooling) count for the time they take.
//! * **Memory** of a stage: the bytes of the parameters and buffers its nodes use (a tensor read
//!   by two stages counts in both: each holds it) plus the bytes of every value its nodes
//!   produce (the activations a training step keeps for the backward pass).
//!
//! ```
//! use ferrofx_fx::passes::partition_stages::partition_balanced;
//! use ferrofx_fx::{symbolic_trace, ShapeProp};
//! use ferrofx_nn::{Linear, Module, ReLU, Sequential};
//! let model = Sequential::new()
//!     .append(Linear::new(64, 64, true).unwrap())
//!     .append(ReLU::new())
//!     .append(Linear::new(64, 64, true).unwrap())
//!     .append(ReLU::new());
//! let mut gm = symbolic_trace(&model).unwrap();
//! let x = ferrofx_core::Tensor::from_vec(vec![0.5f32; 512], &[8, 64]).unwrap();
//! ShapeProp::propagate(&mut gm, &[x.clone().into()]).unwrap();
//! let stages = partition_balanced(&gm, 2).unwrap();
//! assert_eq!(stages.stages.len(), 2);
//! let split = stages.split(&gm).unwrap();
//! assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), split.module.forward(&x).unwrap().to_vec::<f32>().unwrap());
//! ```

use super::analysis::node_stats;
use super::split_module::{split_module, SplitModule};
use crate::graph::{NodeId, Opcode};
use crate::GraphModule;
use ferrofx_core::{Error, Result};
use ferrofx_nn::Module;
use std::collections::{HashMap, HashSet};

/// FLOPs one byte written is worth in the cost model (roughly a CPU core's FLOP rate over its
/// memory bandwidth).
pub const FLOPS_PER_BYTE: u64 = 8;

/// What one stage computes and holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageStats {
    /// Number of computing nodes.
    pub nodes: usize,
    /// FLOPs of its nodes.
    pub flops: u64,
    /// Cost: FLOPs + [`FLOPS_PER_BYTE`] × bytes written.
    pub cost: u64,
    /// Parameter and buffer bytes it holds.
    pub param_bytes: u64,
    /// Bytes of the values its nodes produce.
    pub activation_bytes: u64,
}

impl StageStats {
    /// Parameter and activation bytes together.
    pub fn memory_bytes(&self) -> u64 {
        self.param_bytes + self.activation_bytes
    }
}

/// A partition of a GraphModule's computing nodes into pipeline stages.
#[derive(Debug, Clone)]
pub struct StagePlan {
    /// Stage of every computing node.
    pub assignment: HashMap<NodeId, usize>,
    /// Per stage, in order.
    pub stages: Vec<StageStats>,
}

impl StagePlan {
    /// Splits `gm` along this plan (one partition per stage, `submod_0`, `submod_1`, ...).
    pub fn split(&self, gm: &GraphModule) -> Result<SplitModule> {
        split_module(gm, |n| {
            self.assignment.get(&n.id()).copied().ok_or_else(|| {
                Error::argument(
                    "split_module",
                    format!("node '{}' has no stage: the plan was made for another graph", n.name()),
                )
            })
        })
    }

    /// Largest stage cost over the smallest (1.0 = perfectly balanced).
    pub fn imbalance(&self) -> f64 {
        let max = self.stages.iter().map(|s| s.cost).max().unwrap_or(0) as f64;
        let min = self.stages.iter().map(|s| s.cost).min().unwrap_or(0).max(1) as f64;
        max / min
    }
}

/// Per computing node: (id, flops, cost, activation bytes, tensors it reads as (key, bytes)).
struct NodeCost {
    id: NodeId,
    flops: u64,
    cost: u64,
    act: u64,
    params: Vec<(usize, u64)>,
}

fn module_bytes(m: &dyn Module) -> u64 {
    let mut total = 0u64;
    m.visit_tensors(&mut |_, _, t| total += (t.numel() * t.dtype().size()) as u64);
    total
}

fn node_costs(gm: &GraphModule) -> Result<Vec<NodeCost>> {
    let g = gm.graph();
    let stats = node_stats(gm)?;
    let mut param_keys: HashMap<String, usize> = HashMap::new();
    let mut key = |s: String| {
        let n = param_keys.len();
        *param_keys.entry(s).or_insert(n)
    };
    let mut out = vec![];
    for (n, st) in g.iter().zip(&stats) {
        if !matches!(n.op(), Opcode::CallFunction | Opcode::CallMethod | Opcode::CallModule) {
            continue;
        }
        if n.meta().tensor_meta.is_none() && !crate::tracer::is_getitem(g, n.id()) && n.num_users() > 0 {
            return Err(Error::argument(
                "partition_stages",
                format!("node '{}' has no shape: run ShapeProp::propagate on example inputs first", n.name()),
            ));
        }
        let mut params = vec![];
        if n.op() == Opcode::CallModule {
            if let Some(m) = gm.leaf_modules().get(n.target().name()) {
                params.push((key(format!("module:{}", n.target().name())), module_bytes(m.as_ref())));
            }
        }
        for d in n.all_input_nodes() {
            let dn = g.node(d).map_err(|e| Error::argument("partition_stages", e.to_string()))?;
            if dn.op() == Opcode::GetAttr {
                if let Some(e) = gm.attributes().get(dn.target().name()) {
                    let bytes = (e.tensor.numel() * e.tensor.dtype().size()) as u64;
                    params.push((key(format!("attr:{}", dn.target().name())), bytes));
                }
            }
        }
        out.push(NodeCost {
            id: n.id(),
            flops: st.flops,
            cost: st.flops.saturating_add(st.output_bytes.saturating_mul(FLOPS_PER_BYTE)),
            act: st.output_bytes,
            params,
        });
    }
    if out.is_empty() {
        return Err(Error::argument("partition_stages", "the graph has no computing nodes to place in stages"));
    }
    Ok(out)
}

fn plan_from_bounds(nodes: &[NodeCost], starts: &[usize]) -> StagePlan {
    let mut assignment = HashMap::with_capacity(nodes.len());
    let mut stages = Vec::with_capacity(starts.len());
    for (s, &start) in starts.iter().enumerate() {
        let end = starts.get(s + 1).copied().unwrap_or(nodes.len());
        let mut st = StageStats::default();
        let mut seen = HashSet::new();
        for n in &nodes[start..end] {
            assignment.insert(n.id, s);
            st.nodes += 1;
            st.flops += n.flops;
            st.cost += n.cost;
            st.activation_bytes += n.act;
            for &(k, b) in &n.params {
                if seen.insert(k) {
                    st.param_bytes += b;
                }
            }
        }
        stages.push(st);
    }
    StagePlan { assignment, stages }
}

/// Cuts the computing nodes into `stages` contiguous stages whose largest cost is as small as
/// possible (an exact linear-partition search over the cost model in the module docs).
///
/// Errors: `stages == 0`, more stages than computing nodes, or nodes without shapes.
pub fn partition_balanced(gm: &GraphModule, stages: usize) -> Result<StagePlan> {
    let nodes = node_costs(gm)?;
    let n = nodes.len();
    if stages == 0 || stages > n {
        return Err(Error::argument(
            "partition_balanced",
            format!("cannot cut {n} computing nodes into {stages} stages: ask for 1 to {n} stages"),
        ));
    }
    // prefix sums of cost
    let mut pre = vec![0u128; n + 1];
    for (i, c) in nodes.iter().enumerate() {
        pre[i + 1] = pre[i] + c.cost as u128;
    }
    let seg = |a: usize, b: usize| pre[b] - pre[a];
    // dp[j][i]: the smallest max cost cutting the first i nodes into j stages; cut[j][i]: start
    // of the last stage. The best start is where the earlier stages' max (growing with s) meets
    // the last stage's cost (shrinking with s): found by binary search.
    let mut dp = vec![vec![u128::MAX; n + 1]; stages + 1];
    let mut cut = vec![vec![0usize; n + 1]; stages + 1];
    for (i, d) in dp[1].iter_mut().enumerate().skip(1) {
        *d = seg(0, i);
    }
    for j in 2..=stages {
        for i in j..=n {
            // s ranges over [j-1, i-1]
            let (mut lo, mut hi) = (j - 1, i - 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if dp[j - 1][mid] >= seg(mid, i) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            let mut best = (u128::MAX, lo);
            for s in [lo.saturating_sub(1).max(j - 1), lo] {
                let v = dp[j - 1][s].max(seg(s, i));
                if v < best.0 {
                    best = (v, s);
                }
            }
            dp[j][i] = best.0;
            cut[j][i] = best.1;
        }
    }
    let mut starts = vec![0usize; stages];
    let mut i = n;
    for j in (2..=stages).rev() {
        starts[j - 1] = cut[j][i];
        i = cut[j][i];
    }
    Ok(plan_from_bounds(&nodes, &starts))
}

/// Cuts the computing nodes into as few contiguous stages as keep each stage's memory
/// (parameters + activations, see the module docs) within `max_bytes`.
///
/// Errors: a single node that needs more than `max_bytes` (naming it and its bytes), or nodes
/// without shapes.
pub fn partition_by_memory(gm: &GraphModule, max_bytes: u64) -> Result<StagePlan> {
    let nodes = node_costs(gm)?;
    let g = gm.graph();
    let mut starts = vec![0usize];
    let mut used = 0u64;
    let mut seen: HashSet<usize> = HashSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let own: u64 = n.act + n.params.iter().map(|p| p.1).sum::<u64>();
        if own > max_bytes {
            let name = g.node(n.id).map(|x| x.name().to_string()).unwrap_or_default();
            return Err(Error::argument(
                "partition_by_memory",
                format!(
                    "node '{name}' alone needs {own} bytes (parameters and output), more than the cap of \
                     {max_bytes} bytes per stage: raise the cap"
                ),
            ));
        }
        let extra: u64 = n.act + n.params.iter().filter(|p| !seen.contains(&p.0)).map(|p| p.1).sum::<u64>();
        if i > 0 && used + extra > max_bytes {
            starts.push(i);
            used = 0;
            seen.clear();
        }
        used += n.act;
        for &(k, b) in &n.params {
            if seen.insert(k) {
                used += b;
            }
        }
    }
    Ok(plan_from_bounds(&nodes, &starts))
}
