//! `DistributedDropout`: dropout whose masks are those one process would draw for the whole
//! global batch, so that data-parallel training equals single-process training bit for bit in
//! its random choices.
//!
//! **The rank-consistent random stream.** Every rank seeds its generator identically (the
//! training seed) and draws, at every dropout call, the mask of the *global* batch, in the
//! same order as one process would; it then keeps the rows of its own share. Concretely the
//! layer gathers every rank's row count (an all-gather of one integer), places its rows at
//! their offset in a zero tensor of the global batch's shape, applies the ordinary `dropout`
//! op (which draws one value per element in order) and takes its rows back. The element at
//! row `i` of the global batch therefore sees the same random draw as in one process, whatever
//! the rank count, and every rank's generator stays in the same state. The cost is drawing
//! (and scaling) `world_size` times more values than the rank's own rows, which is small next to
//! the layers around it.
//!
//! The ranks' shares must be contiguous and in rank order (as [`crate::shard_rows`] makes them).

use crate::process_group::ProcessGroup;
use ferrofx_core::{Error, Result, Tensor};
use ferrofx_fx::GraphModule;
use ferrofx_nn::layers::Dropout;
use ferrofx_nn::Module;
use std::sync::Arc;

/// Dropout with global-batch masks (see the module docs).
#[derive(ferrofx_nn::Module)]
#[module(name = "DistributedDropout")]
pub struct DistributedDropout {
    /// Probability of an element being zeroed.
    #[module(skip)]
    pub p: f64,
    #[module(skip)]
    pg: Arc<ProcessGroup>,
    training: bool,
}

impl DistributedDropout {
    /// Dropout with probability `p` over the ranks of `pg` (training mode).
    pub fn new(p: f64, pg: Arc<ProcessGroup>) -> Result<DistributedDropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::argument(
                "DistributedDropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(DistributedDropout { p, pg, training: true })
    }
}

impl Module for DistributedDropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let rows = x.shape().first().copied().ok_or_else(|| {
            Error::shape("DistributedDropout", "expected an input with a batch dimension, got a scalar")
        })?;
        let counts = self.pg.all_gather_u64(rows as u64)?;
        let rank = self.pg.rank();
        let before: u64 = counts[..rank].iter().sum();
        let after: u64 = counts[rank + 1..].iter().sum();
        if self.pg.world_size() == 1 || before + after == 0 {
            return ferrofx_nn::functional::dropout(x, self.p, true);
        }
        let pad = |n: u64| -> Result<Tensor> {
            let mut shape = x.shape().to_vec();
            shape[0] = n as usize;
            ferrofx_core::ops::kernel::zeros(&shape, x.dtype())
        };
        let mut parts = vec![];
        if before > 0 {
            parts.push(pad(before)?);
        }
        parts.push(x.clone());
        if after > 0 {
            parts.push(pad(after)?);
        }
        let global = ferrofx_core::ops::join::cat(&parts, 0)?;
        let dropped = ferrofx_nn::functional::dropout(&global, self.p, true)?;
        dropped.narrow(0, before as i64, rows as i64)
    }
}

/// Replaces every `Dropout` leaf of `gm` by a [`DistributedDropout`] with the same
/// probability and training mode. Returns the paths of the replaced layers.
pub fn convert_distributed_dropout(gm: &mut GraphModule, pg: &Arc<ProcessGroup>) -> Result<Vec<String>> {
    let mut found = vec![];
    for (path, m) in gm.leaf_modules() {
        if let Some(d) = m.as_any().downcast_ref::<Dropout>() {
            let mut nd = DistributedDropout::new(d.p, pg.clone())?;
            nd.training = d.is_training();
            found.push((path.clone(), nd));
        }
    }
    let mut paths = Vec::with_capacity(found.len());
    for (path, d) in found {
        if !gm.add_submodule(&path, Box::new(d))? {
            return Err(Error::argument(
                "convert_distributed_dropout",
                format!("cannot replace the module at '{path}'"),
            ));
        }
        paths.push(path);
    }
    Ok(paths)
}
