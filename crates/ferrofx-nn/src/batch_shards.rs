//! Fixed reduction shards: the arithmetic of a training step made independent of how many
//! processes share it.
//!
//! A global batch of `B` rows is cut into `S` fixed shards (contiguous row blocks,
//! [`shard_rows`]). Each shard's forward and backward run on their own, so every kernel sees
//! the same shapes and the same data whether the shard runs in one process or on one rank of a
//! data-parallel job, and gives the same bits. The shards' gradients (weighted by their share
//! of the batch), BatchNorm running statistics and losses are then combined with one fixed
//! pairwise tree over the *global* shard index ([`tree_sum`]). A job of `N` ranks gives rank `r`
//! the contiguous block [`shard_block`]`(S, r, N)` of `S / N` shards; because that block is a
//! subtree of the tree whenever `S / N` is a power of two ([`check_rank_count`]), the rank sums
//! its block with the same tree, the ranks exchange their block sums, and every rank finishes
//! the tree over the `N` block sums: the same additions in the same order as one process
//! running all `S` shards, so the same bits, whatever `N`.
//!
//! ```
//! use ferrofx_nn::batch_shards::{shard_block, tree_sum};
//! let leaves: Vec<Vec<f32>> = (0..8).map(|k| vec![0.1 * k as f32, 1e-8 * k as f32]).collect();
//! let whole = tree_sum(leaves.clone()).unwrap();
//! // 2 ranks: each sums its block of 4 shards, then the two block sums are added
//! let blocks: Vec<Vec<f32>> =
//!     (0..2).map(|r| tree_sum(leaves[shard_block(8, r, 2)].to_vec()).unwrap()).collect();
//! assert_eq!(tree_sum(blocks).unwrap(), whole);
//! ```

use crate::Module;
use ferrofx_core::{Error, Result};
use std::ops::Range;

/// Rows `[start, end)` of shard `k` of `shards` over a batch of `n` rows: equal contiguous
/// blocks, the first `n % shards` one row longer.
pub fn shard_rows(n: usize, shards: usize, k: usize) -> (usize, usize) {
    let shards = shards.max(1);
    let base = n / shards;
    let extra = n % shards;
    let start = k * base + k.min(extra);
    let len = base + usize::from(k < extra);
    (start.min(n), (start + len).min(n))
}

/// The global shards `[start, end)` rank `rank` of `world` runs: a contiguous block of
/// `shards / world` (call [`check_rank_count`] first).
pub fn shard_block(shards: usize, rank: usize, world: usize) -> Range<usize> {
    let per = shards / world.max(1);
    rank * per..(rank + 1) * per
}

/// Whether `world` ranks can share `shards` shards with the result of one process: every rank
/// needs the same number of shards, a power of two, so that its block is a subtree of
/// [`tree_sum`]'s tree. The error says which rank counts work.
pub fn check_rank_count(shards: usize, world: usize) -> Result<()> {
    if world <= 1 {
        return Ok(());
    }
    if shards.is_multiple_of(world) && (shards / world).is_power_of_two() {
        return Ok(());
    }
    let ok: Vec<String> = (1..=shards)
        .filter(|&n| shards.is_multiple_of(n) && (shards / n).is_power_of_two())
        .map(|n| n.to_string())
        .collect();
    Err(Error::argument(
        "batch shards",
        format!(
            "--batch-shards {shards} cannot be shared by {world} ranks: each rank runs a block of shards whose size \
             must be a power of two for the gradients to be summed in the order of one process; with \
             --batch-shards {shards} use {} ranks, or choose --batch-shards as {world} times a power of two \
             (e.g. {world} or {})",
            ok.join(", "),
            2 * world
        ),
    ))
}

/// The seed of shard `shard`'s random draws (dropout masks) at optimizer step `step` of a run
/// seeded `seed` (SplitMix64 of the three): a function of the global shard index, not of the
/// process that runs the shard.
pub fn shard_seed(seed: u64, step: u64, shard: usize) -> u64 {
    let mut z = seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(step.wrapping_add(1)) ^ (shard as u64).rotate_left(40);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element-wise sum of `leaves` in one fixed order: a pairwise tree in which a node over leaves
/// `[lo, hi)` adds the sum of its first `p` leaves to the sum of the rest, `p` the largest power
/// of two below `hi - lo`. Aligned blocks of a power-of-two size are subtrees, and the tree over
/// `N` such blocks' sums is the top of the tree over all leaves (see the module docs). Every
/// leaf must have the same length; an empty list is an error.
pub fn tree_sum(mut leaves: Vec<Vec<f32>>) -> Result<Vec<f32>> {
    let Some(len) = leaves.first().map(Vec::len) else {
        return Err(Error::argument("tree_sum", "no shards to combine"));
    };
    if let Some((k, l)) = leaves.iter().enumerate().find(|(_, l)| l.len() != len) {
        return Err(Error::shape(
            "tree_sum",
            format!(
                "shard {k} holds {} values where shard 0 holds {len}: every shard must flatten the same tensors",
                l.len()
            ),
        ));
    }
    fn node(leaves: &mut [Vec<f32>]) -> Vec<f32> {
        if leaves.len() == 1 {
            return std::mem::take(&mut leaves[0]);
        }
        // the largest power of two below the leaf count
        let p = 1usize << (usize::BITS - 1 - (leaves.len() - 1).leading_zeros());
        let (a, b) = leaves.split_at_mut(p);
        let mut left = node(a);
        let right = node(b);
        for (x, y) in left.iter_mut().zip(&right) {
            *x += *y;
        }
        left
    }
    Ok(node(&mut leaves))
}

/// How the shards of a training step are spread over processes and combined
/// ([`crate::train::train_digits_sharded`]): [`OneProcess`] runs all of them; a data-parallel
/// job (`ferrofx-dist`) gives each rank a block and exchanges the block sums.
pub trait ShardCombine {
    /// Called once with the freshly built model, before training (a data-parallel job checks
    /// that every rank built the same model and copies rank 0's values).
    fn start(&mut self, model: &dyn Module) -> Result<()>;
    /// The global shards, out of `shards`, this process runs (a contiguous block).
    fn block(&self, shards: usize) -> Result<Range<usize>>;
    /// The tree sum over all shards, given this process's [`tree_sum`] over its block (every
    /// process passes vectors of the same length).
    fn combine(&mut self, block_sum: Vec<f32>) -> Result<Vec<f32>>;
}

/// All shards in this process.
#[derive(Debug, Default, Clone, Copy)]
pub struct OneProcess;

impl ShardCombine for OneProcess {
    fn start(&mut self, _model: &dyn Module) -> Result<()> {
        Ok(())
    }
    fn block(&self, shards: usize) -> Result<Range<usize>> {
        Ok(0..shards)
    }
    fn combine(&mut self, block_sum: Vec<f32>) -> Result<Vec<f32>> {
        Ok(block_sum)
    }
}
