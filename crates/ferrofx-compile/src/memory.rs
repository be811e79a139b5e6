//! Static memory planning: with every shape known, each intermediate value gets an offset in
//! one arena, chosen from liveness so that values alive at the same time never overlap.
//!
//! - **Liveness** is by graph position: a value lives from its node to its last user (the
//!   output keeps the returned values to the end). A view (registry category `View`) owns no
//!   buffer: it aliases its base, whose life is extended to the view's last use.
//! - **In place**: an elementwise node whose input of the same size dies at that node writes
//!   into the input's buffer (the two values share one buffer).
//! - **Placement**: buffers are placed either greedily by size (largest first, each into the
//!   tightest gap among the buffers it overlaps in time; TFLite's and ONNX Runtime's
//!   strategy) or by best fit in definition order; [`plan_memory`] runs both and keeps the
//!   smaller arena. `lower_bound_bytes` (the largest sum of sizes alive at one step) says how
//!   far from optimal the result is.
//!
//! Inputs and weights are not in the arena. [`MemoryPlan::validate`] checks the one invariant
//! that matters (no two buffers alive at the same step overlap) and is run on every zoo model
//! in the tests.

use ferrofx_core::op::Category;
use ferrofx_core::{Error, Result};
use ferrofx_fx::{Graph, NodeId, Opcode};
use std::collections::HashMap;
use std::fmt;

/// Buffers start at multiples of this many bytes (a cache line, an AVX-512 vector).
pub const ALIGN: usize = 64;

/// A placement strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Largest buffers first, each into the tightest gap.
    GreedyBySize,
    /// Buffers in definition order, each into the tightest gap.
    BestFitInOrder,
}

/// One arena buffer: the values that share it, its size and live range (graph positions).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedBuffer {
    /// Names of the values stored in it (more than one: written in place).
    pub values: Vec<String>,
    /// Bytes (rounded up to [`ALIGN`]).
    pub size: usize,
    /// Offset in the arena.
    pub offset: usize,
    /// First step it is alive (the defining node's position).
    pub start: usize,
    /// Last step it is alive.
    pub end: usize,
}

/// The memory plan of a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// The buffers with their offsets.
    pub buffers: Vec<PlannedBuffer>,
    /// Arena size: the peak intermediate memory of the planned execution.
    pub arena_bytes: usize,
    /// The largest sum of live buffer sizes at one step: no plan can use less.
    pub lower_bound_bytes: usize,
    /// Sum of all buffer sizes (what allocating every value separately would hold at most).
    pub total_bytes: usize,
    /// Values written into a dying input's buffer.
    pub in_place: usize,
    /// The strategy that produced this plan.
    pub strategy: Strategy,
    /// Arena size the other strategy reached (for comparison).
    pub other_strategy_bytes: usize,
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |b: usize| b as f64 / (1 << 20) as f64;
        write!(
            f,
            "arena {:.2} MiB ({:?}; other strategy {:.2} MiB), lower bound {:.2} MiB, {} buffers for {:.2} MiB of values, {} in place",
            mb(self.arena_bytes),
            self.strategy,
            mb(self.other_strategy_bytes),
            mb(self.lower_bound_bytes),
            self.buffers.len(),
            mb(self.total_bytes),
            self.in_place
        )
    }
}

impl MemoryPlan {
    /// Checks that no two buffers alive at the same step overlap in the arena, and that every
    /// buffer fits in it.
    pub fn validate(&self) -> Result<()> {
        for (i, a) in self.buffers.iter().enumerate() {
            if a.offset % ALIGN != 0 || a.offset + a.size > self.arena_bytes {
                return Err(Error::argument(
                    "memory_plan",
                    format!(
                        "buffer of {:?} at {}+{} is misaligned or outside the arena of {} bytes",
                        a.values, a.offset, a.size, self.arena_bytes
                    ),
                ));
            }
            for b in &self.buffers[i + 1..] {
                let live = a.start <= b.end && b.start <= a.end;
                let overlap = a.offset < b.offset + b.size && b.offset < a.offset + a.size;
                if live && overlap {
                    return Err(Error::argument(
                        "memory_plan",
                        format!(
                            "{:?} (steps {}..={}, bytes {}..{}) and {:?} (steps {}..={}, bytes {}..{}) are alive together and overlap",
                            a.values, a.start, a.end, a.offset, a.offset + a.size, b.values, b.start, b.end, b.offset, b.offset + b.size
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

struct Buf {
    values: Vec<NodeId>,
    size: usize,
    start: usize,
    end: usize,
}

fn gerr(e: ferrofx_fx::GraphError) -> Error {
    Error::argument("memory_plan", e.to_string())
}

/// Plans the arena of `g` (which must carry `tensor_meta` from shape propagation; values
/// without it, such as tuples, are left out of the arena).
pub fn plan_memory(g: &Graph) -> Result<MemoryPlan> {
    let order: Vec<NodeId> = g.iter().map(|n| n.id()).collect();
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let last_step = order.len().saturating_sub(1);
    let mut last: HashMap<NodeId, usize> = HashMap::new();
    let mut alias_of: HashMap<NodeId, NodeId> = HashMap::new();
    let mut sized: HashMap<NodeId, usize> = HashMap::new();
    for &id in &order {
        let n = g.node(id).map_err(gerr)?;
        let end = n
            .users()
            .map(|u| if g.node(u).map(|u| u.op() == Opcode::Output).unwrap_or(false) { last_step } else { pos[&u] })
            .max()
            .unwrap_or(pos[&id]);
        last.insert(id, end);
        if !matches!(n.op(), Opcode::CallFunction | Opcode::CallMethod | Opcode::CallModule) {
            continue;
        }
        let Some(m) = n.meta().tensor_meta.as_ref() else { continue };
        let is_view = crate::fusion::registry_op(&n).is_some_and(|d| d.category == Category::View);
        if is_view {
            if let Some(base) = n.args().first().and_then(|a| a.as_node()) {
                alias_of.insert(id, base);
                continue;
            }
        }
        let bytes = m.shape.iter().product::<usize>() * m.dtype.size();
        sized.insert(id, bytes.div_ceil(ALIGN) * ALIGN);
    }
    // a view keeps its base alive (chains of views resolve to the first base)
    for &id in order.iter().rev() {
        if let Some(&base) = alias_of.get(&id) {
            let mut root = base;
            while let Some(&b) = alias_of.get(&root) {
                root = b;
            }
            let e = last[&id];
            let l = last.entry(root).or_insert(e);
            *l = (*l).max(e);
        }
    }
    // buffers, merging an elementwise node into the buffer of a same-size input dying there
    let mut bufs: Vec<Buf> = Vec::new();
    let mut buf_of: HashMap<NodeId, usize> = HashMap::new();
    let mut in_place = 0;
    for &id in &order {
        let Some(&size) = sized.get(&id) else { continue };
        let n = g.node(id).map_err(gerr)?;
        let elementwise =
            crate::fusion::registry_op(&n).is_some_and(|d| d.category == Category::Elementwise && d.is_pure());
        let mut reuse = None;
        if elementwise {
            for a in n.all_input_nodes() {
                if let Some(&b) = buf_of.get(&a) {
                    if bufs[b].size == size && bufs[b].end == pos[&id] && *bufs[b].values.last().unwrap_or(&a) == a {
                        reuse = Some(b);
                        break;
                    }
                }
            }
        }
        match reuse {
            Some(b) => {
                bufs[b].values.push(id);
                bufs[b].end = last[&id].max(pos[&id]);
                buf_of.insert(id, b);
                in_place += 1;
            }
            None => {
                buf_of.insert(id, bufs.len());
                bufs.push(Buf { values: vec![id], size, start: pos[&id], end: last[&id].max(pos[&id]) });
            }
        }
    }
    let mut lower = 0;
    let mut live = vec![0usize; order.len() + 1];
    for b in &bufs {
        for l in &mut live[b.start..=b.end] {
            *l += b.size;
        }
    }
    if let Some(&m) = live.iter().max() {
        lower = m;
    }
    let (greedy, greedy_size) = place(&bufs, Strategy::GreedyBySize);
    let (inorder, inorder_size) = place(&bufs, Strategy::BestFitInOrder);
    let (offsets, arena, strategy, other) = if greedy_size <= inorder_size {
        (greedy, greedy_size, Strategy::GreedyBySize, inorder_size)
    } else {
        (inorder, inorder_size, Strategy::BestFitInOrder, greedy_size)
    };
    let name = |id: &NodeId| g.node(*id).map(|n| n.name().to_string()).unwrap_or_default();
    let buffers = bufs
        .iter()
        .zip(offsets)
        .map(|(b, offset)| PlannedBuffer {
            values: b.values.iter().map(name).collect(),
            size: b.size,
            offset,
            start: b.start,
            end: b.end,
        })
        .collect();
    Ok(MemoryPlan {
        buffers,
        arena_bytes: arena,
        lower_bound_bytes: lower,
        total_bytes: bufs.iter().map(|b| b.size).sum(),
        in_place,
        strategy,
        other_strategy_bytes: other,
    })
}

/// Offsets for `bufs` (in their order) by `strategy`, and the arena size.
fn place(bufs: &[Buf], strategy: Strategy) -> (Vec<usize>, usize) {
    let mut idx: Vec<usize> = (0..bufs.len()).collect();
    match strategy {
        Strategy::GreedyBySize => {
            idx.sort_by(|&a, &b| bufs[b].size.cmp(&bufs[a].size).then(bufs[a].start.cmp(&bufs[b].start)))
        }
        Strategy::BestFitInOrder => idx.sort_by_key(|&a| bufs[a].start),
    }
    let mut offsets = vec![usize::MAX; bufs.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for &i in &idx {
        let b = &bufs[i];
        // the arena ranges taken by placed buffers alive at the same time, by offset
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| bufs[j].start <= b.end && b.start <= bufs[j].end)
            .map(|&j| (offsets[j], offsets[j] + bufs[j].size))
            .collect();
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut cursor = 0;
        for &(s, e) in &busy {
            if s >= cursor {
                let gap = s - cursor;
                if gap >= b.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(e);
        }
        let off = best.map_or(cursor, |(_, o)| o);
        offsets[i] = off;
        arena = arena.max(off + b.size);
        placed.push(i);
    }
    (offsets, arena)
}
