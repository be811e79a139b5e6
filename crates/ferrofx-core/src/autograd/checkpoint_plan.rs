//! Selective activation checkpointing under a memory budget: which segments of a sequential
//! model to [`checkpoint`](super::checkpoint) so that the activations kept for backward fit a
//! [`MemoryBudget`], recomputing as few FLOPs as possible.
//!
//! `checkpoint_sequential` recomputes every segment but the last. Where the memory is and where
//! the work is rarely coincide: in a ResNet the stem and the first stage hold most of the
//! activation bytes for a small part of the FLOPs, and checkpointing the later stages frees
//! little memory for as much recomputation. [`CheckpointPlan::new`] measures each segment once
//! ([`profile_segments`]: the distinct bytes its backward nodes save, whether it saves its input
//! or its output, its forward FLOPs from the registry's cost functions via
//! [`FlopCounterMode`]), then picks the cheapest set of segments whose estimated activation
//! memory fits the budget (every subset for up to 16 candidate segments, a greedy choice by
//! bytes freed per FLOP above). [`CheckpointPlan::run`] applies it on each step: the chosen
//! segments are checkpointed with PyTorch's non-reentrant semantics, the others run as usual.
//! This is PyTorch's selective checkpointing with the choice made by the memory budget, as
//! `torch._functorch.config.activation_memory_budget` does for compiled graphs (the
//! `ferrofx-compile` partitioners do the same on a joint graph, per node).
//!
//! **The estimate.** Without checkpointing, the activations kept at the end of forward are the
//! distinct saved bytes of every segment plus the boundary tensors (a segment's input and
//! output) that some backward node saves. A checkpointed segment keeps only its input; its
//! saved tensors come back during its backward, so the estimate is the larger of the end of
//! forward and, for each checkpointed segment, what the earlier segments keep plus its own
//! recomputed tensors and its output's gradient. The model's own input is not counted (it is
//! alive anyway). A [`MemoryBudget::Fraction`] is a fraction of the unconstrained estimate.
//!
//! **Profiling runs each segment once**, one at a time (so profiling needs one segment's
//! activations, not the whole model's), with grad mode on: in-place state updates in the
//! segments happen once more (a BatchNorm in training mode updates its running statistics, as
//! one more forward would); the random-number generator's state is restored afterwards.
//!
//! ```
//! use ferrofx_core::autograd::{CheckpointPlan, SequentialFn};
//! use ferrofx_core::memory::MemoryBudget;
//! use ferrofx_core::Tensor;
//! use std::sync::Arc;
//! // four segments, each saving two tensors of its own: exp's output (sin's input) and cos's input
//! let f: Vec<SequentialFn> = (0..4).map(|_| Arc::new(|t: &Tensor| t.exp()?.sin()?.cos()) as SequentialFn).collect();
//! let x = Tensor::from_vec(vec![0.1f32; 1024], &[1024]).unwrap().requires_grad_(true).unwrap();
//! let plan = CheckpointPlan::new(&f, &x, MemoryBudget::Fraction(0.7)).unwrap();
//! assert_eq!(plan.segments[0].saved_bytes, 2 * 4096);
//! assert!(plan.estimated_bytes <= plan.limit);
//! assert_eq!(plan.checkpointed, vec![true, true, false, false]); // the cheapest set that fits
//! let y = plan.run(&f, &x).unwrap();
//! y.sum().unwrap().backward(None, false, false).unwrap();
//! assert!(x.grad().is_some());
//! ```

use super::checkpoint::{checkpoint, SequentialFn};
use super::saved_hooks::{saved_tensors_hooks, Packed};
use crate::error::{Error, Result};
use crate::memory::MemoryBudget;
use crate::op::FlopCounterMode;
use crate::ops::random::current_generator;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Candidate segments up to which every subset is tried (2^16 estimates).
const EXHAUSTIVE: usize = 16;

/// What one segment keeps for backward and costs to recompute, measured by running it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentProfile {
    /// Distinct storage bytes its backward nodes save, its input's and output's storage and
    /// parameters (leaves that require grad) excepted.
    pub saved_bytes: u64,
    /// Whether a backward node of the segment saves the segment's input (a convolution's input).
    pub saves_input: bool,
    /// Whether one saves the segment's output (a final ReLU's result).
    pub saves_output: bool,
    /// Storage bytes of its input.
    pub input_bytes: u64,
    /// Storage bytes of its output.
    pub output_bytes: u64,
    /// FLOPs of its forward: what checkpointing it recomputes.
    pub flops: u64,
}

/// Which segments to checkpoint, and the estimate behind the choice (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointPlan {
    /// Per segment: checkpointed (recomputed in backward) or not. The last one never is.
    pub checkpointed: Vec<bool>,
    /// The measured segments.
    pub segments: Vec<SegmentProfile>,
    /// Estimated activation bytes kept without checkpointing.
    pub unconstrained_bytes: u64,
    /// Estimated activation bytes with this plan.
    pub estimated_bytes: u64,
    /// The budget in bytes.
    pub limit: u64,
    /// FLOPs recomputed per step.
    pub recomputed_flops: u64,
}

fn storage_bytes(t: &Tensor) -> (usize, u64) {
    match t.storage() {
        Some(s) => (s.id(), (s.len() * s.dtype().size()) as u64),
        None => (0, 0),
    }
}

/// Runs each segment once (grad mode on, one segment's activations at a time) and measures what
/// it saves for backward and its forward FLOPs; see the module documentation for the side
/// effects.
pub fn profile_segments(functions: &[SequentialFn], input: &Tensor) -> Result<Vec<SegmentProfile>> {
    let gen = current_generator();
    let rng = gen.get_state();
    let out = profile_all(functions, input);
    gen.set_state(&rng);
    out
}

fn profile_all(functions: &[SequentialFn], input: &Tensor) -> Result<Vec<SegmentProfile>> {
    let _grad = super::enable_grad();
    let mut h = input.clone();
    let mut out = Vec::with_capacity(functions.len());
    for (i, f) in functions.iter().enumerate() {
        let x = if i == 0 { h.clone() } else { h.detach().requires_grad_(true)? };
        let saved: Arc<Mutex<Vec<Tensor>>> = Arc::default();
        let counter = FlopCounterMode::start();
        let y = {
            let s = saved.clone();
            let _hooks = saved_tensors_hooks(
                move |t| {
                    s.lock().unwrap_or_else(|e| e.into_inner()).push(t.clone());
                    Box::new(()) as Packed
                },
                |_| Err(Error::autograd("CheckpointPlan", "profiling runs no backward")),
            );
            f(&x).map_err(|e| e.with_context(&format!("CheckpointPlan: profiling segment {i}")))?
        };
        let flops = counter.total_flops();
        drop(counter);
        let (in_id, input_bytes) = storage_bytes(&x);
        let (out_id, output_bytes) = storage_bytes(&y);
        let mut p = SegmentProfile { input_bytes, output_bytes, flops, ..Default::default() };
        let mut internal = HashMap::new();
        for t in saved.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let (id, bytes) = storage_bytes(t);
            if id == in_id {
                p.saves_input = true;
            } else if id == out_id {
                p.saves_output = true;
            } else if t.is_leaf() && t.requires_grad() {
                // a parameter: kept by the model, not an activation
            } else {
                internal.insert(id, bytes);
            }
        }
        p.saved_bytes = internal.values().sum();
        out.push(p);
        h = y.detach();
    }
    Ok(out)
}

/// The estimated activation bytes of `segments` with `ckpt` checkpointed (module docs).
pub(crate) fn estimate(segments: &[SegmentProfile], ckpt: &[bool]) -> u64 {
    let n = segments.len();
    // boundary k (1..=n): the output of segment k-1, the input of segment k
    let kept = |k: usize| -> u64 {
        let prev = &segments[k - 1];
        let by_prev = !ckpt[k - 1] && prev.saves_output;
        let by_next = k < n && (ckpt[k] || segments[k].saves_input);
        if by_prev || by_next {
            prev.output_bytes
        } else {
            0
        }
    };
    let mut before = 0u64; // kept by segments 0..i and boundaries 1..=i
    let mut worst_recompute = 0u64;
    for i in 0..n {
        if ckpt[i] {
            let s = &segments[i];
            let recomputed = s.saved_bytes + if s.saves_output { s.output_bytes } else { 0 };
            worst_recompute = worst_recompute.max(before + recomputed + s.output_bytes);
        } else {
            before += segments[i].saved_bytes;
        }
        before += kept(i + 1);
    }
    before.max(worst_recompute)
}

impl CheckpointPlan {
    /// Profiles `functions` on `input` ([`profile_segments`]) and plans for `budget`.
    pub fn new(functions: &[SequentialFn], input: &Tensor, budget: MemoryBudget) -> Result<CheckpointPlan> {
        CheckpointPlan::from_profiles(profile_segments(functions, input)?, budget)
    }

    /// Plans from measured segments: the set of segments (the last excepted) with the fewest
    /// recomputed FLOPs whose estimate fits `budget`. An error names the budget and the
    /// smallest estimate reachable (every candidate checkpointed).
    pub fn from_profiles(segments: Vec<SegmentProfile>, budget: MemoryBudget) -> Result<CheckpointPlan> {
        let n = segments.len();
        if n == 0 {
            return Err(Error::argument("CheckpointPlan", "no segments to plan; give at least one function"));
        }
        let none = vec![false; n];
        let unconstrained = estimate(&segments, &none);
        let limit = budget.limit(unconstrained, "CheckpointPlan")?;
        let candidates = n - 1;
        let flops = |c: &[bool]| -> u64 { c.iter().zip(&segments).filter(|(&c, _)| c).map(|(_, s)| s.flops).sum() };
        let best = if candidates <= EXHAUSTIVE {
            let mut best: Option<(u64, u64, Vec<bool>)> = None;
            let mut c = vec![false; n];
            for mask in 0u32..(1u32 << candidates) {
                for (i, ci) in c.iter_mut().take(candidates).enumerate() {
                    *ci = mask >> i & 1 == 1;
                }
                let e = estimate(&segments, &c);
                if e > limit {
                    continue;
                }
                let key = (flops(&c), e);
                if best.as_ref().is_none_or(|b| key < (b.0, b.1)) {
                    best = Some((key.0, key.1, c.clone()));
                }
            }
            best.map(|b| b.2)
        } else {
            greedy(&segments, limit)
        };
        let Some(checkpointed) = best else {
            let mut all = vec![true; n];
            all[n - 1] = false;
            return Err(Error::limit(
                "CheckpointPlan",
                format!(
                    "memory budget {limit} B cannot be met: checkpointing every segment but the last still keeps an estimated {} B ({:.3} of the unconstrained {unconstrained} B); split the model into more, smaller segments or raise the budget",
                    estimate(&segments, &all),
                    estimate(&segments, &all) as f64 / unconstrained.max(1) as f64
                ),
            ));
        };
        Ok(CheckpointPlan {
            estimated_bytes: estimate(&segments, &checkpointed),
            recomputed_flops: flops(&checkpointed),
            checkpointed,
            segments,
            unconstrained_bytes: unconstrained,
            limit,
        })
    }

    /// Runs `functions` on `input` in order, checkpointing the planned segments (each one on
    /// its own, with [`checkpoint`]'s non-reentrant semantics).
    pub fn run(&self, functions: &[SequentialFn], input: &Tensor) -> Result<Tensor> {
        if functions.len() != self.checkpointed.len() {
            return Err(Error::argument(
                "CheckpointPlan::run",
                format!(
                    "the plan has {} segments but {} functions were given; plan again for these functions",
                    self.checkpointed.len(),
                    functions.len()
                ),
            ));
        }
        let mut h = input.clone();
        for (f, &c) in functions.iter().zip(&self.checkpointed) {
            h = if c {
                let f = f.clone();
                checkpoint(move |xs: &[Tensor]| Ok(vec![f(&xs[0])?]), &[h])?.pop().ok_or_else(|| {
                    Error::autograd("CheckpointPlan::run", "a checkpointed segment returned no tensor")
                })?
            } else {
                f(&h)?
            };
        }
        Ok(h)
    }

    /// The indices of the checkpointed segments.
    pub fn checkpointed_indices(&self) -> Vec<usize> {
        self.checkpointed.iter().enumerate().filter(|(_, &c)| c).map(|(i, _)| i).collect()
    }
}

/// Above [`EXHAUSTIVE`] candidates: add segments by bytes freed per FLOP until the estimate
/// fits, then drop the ones (latest added first) that are no longer needed.
fn greedy(segments: &[SegmentProfile], limit: u64) -> Option<Vec<bool>> {
    let n = segments.len();
    let mut order: Vec<usize> = (0..n - 1).collect();
    let ratio = |i: usize| segments[i].saved_bytes as f64 / segments[i].flops.max(1) as f64;
    order.sort_by(|&a, &b| ratio(b).total_cmp(&ratio(a)));
    let mut c = vec![false; n];
    let mut added = Vec::new();
    for &i in &order {
        if estimate(segments, &c) <= limit {
            break;
        }
        c[i] = true;
        added.push(i);
    }
    if estimate(segments, &c) > limit {
        return None;
    }
    for &i in added.iter().rev() {
        c[i] = false;
        if estimate(segments, &c) > limit {
            c[i] = true;
        }
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(saved: u64, io: u64, flops: u64) -> SegmentProfile {
        SegmentProfile {
            saved_bytes: saved,
            saves_input: true,
            saves_output: false,
            input_bytes: io,
            output_bytes: io,
            flops,
        }
    }

    #[test]
    fn estimate_counts_boundaries_once() {
        let s = vec![seg(100, 10, 1), seg(50, 10, 1), seg(20, 10, 1)];
        // no checkpoint: all saved + boundaries 1 and 2 (saved as inputs); boundary 3 unsaved
        assert_eq!(estimate(&s, &[false, false, false]), 100 + 50 + 20 + 10 + 10);
        // segment 0 checkpointed: end of forward 10 + 50 + 10 + 20 = 90; its recomputation at the
        // end of backward: its 100 saved bytes + its output's gradient (10)
        assert_eq!(estimate(&s, &[true, false, false]), 110);
    }

    #[test]
    fn exhaustive_and_greedy_meet_the_budget_with_least_flops() {
        // unconstrained 400 + 300 + 300 + 10 + 3 x 10 = 1040, limit 520: {0} keeps 640 at the end
        // of forward, {1, 2} 720 while recomputing 1, {0, 2} 630 while recomputing 2; {0, 1}
        // fits (410, recomputing 0) with the fewest flops
        let s = vec![seg(400, 10, 5), seg(300, 10, 50), seg(300, 10, 50), seg(10, 10, 50)];
        let p = CheckpointPlan::from_profiles(s.clone(), MemoryBudget::Fraction(0.5)).unwrap();
        assert_eq!(p.unconstrained_bytes, 1040);
        assert_eq!(p.checkpointed, vec![true, true, false, false]);
        assert_eq!((p.estimated_bytes, p.limit, p.recomputed_flops), (410, 520, 55));
        let g = greedy(&s, p.limit).unwrap();
        assert_eq!(g, p.checkpointed);
        // budget 1.0: nothing recomputed
        let p = CheckpointPlan::from_profiles(s.clone(), MemoryBudget::Fraction(1.0)).unwrap();
        assert_eq!(p.recomputed_flops, 0);
        // an impossible budget names what can be reached
        let e = CheckpointPlan::from_profiles(s, MemoryBudget::Bytes(1)).unwrap_err().to_string();
        assert!(e.contains("memory budget 1 B cannot be met"), "{e}");
    }
}
