//! `SyncBatchNorm`: batch normalisation whose batch statistics are those of the global batch
//! (PyTorch's `torch.nn.SyncBatchNorm`), and [`convert_sync_batchnorm`], which puts it in place
//! of every `BatchNorm` of a traced module.
//!
//! In training mode every rank computes, per channel, the sum and the sum of squares of its
//! rows and its element count; one all-reduce gives the global mean and (biased) variance, with
//! which each rank normalises its rows, so that the output is the rows of what one process
//! would compute on the whole batch. Backward all-reduces the two per-channel gradient sums the
//! input gradient needs (`Σ dy` and `Σ dy·(x − mean)`) and leaves the weight and bias gradients
//! local: [`crate::DistributedDataParallel`] combines them like every other parameter's. The
//! running statistics are updated with the global mean and the unbiased global variance, the
//! same on every rank. Sums are taken in `f64`, as the single-process kernel does.
//!
//! In evaluation mode (or without running statistics in training mode being the only
//! difference) it is the ordinary `batch_norm` with the running statistics: no communication.
//!
//! Every rank must call the layer the same number of times in the same order (each call is a
//! collective), which data-parallel training of one model does.

use crate::process_group::ProcessGroup;
use ferrofx_core::autograd::{apply_function, no_grad, Function, FunctionCtx};
use ferrofx_core::{DType, Error, Result, Tensor};
use ferrofx_fx::GraphModule;
use ferrofx_nn::layers::BatchNorm;
use ferrofx_nn::Module;
use std::sync::{Arc, Mutex};

/// `nn.SyncBatchNorm`: see the module docs. Built from a `BatchNorm` by
/// [`SyncBatchNorm::from_batch_norm`] (sharing its tensors) or [`convert_sync_batchnorm`].
#[derive(ferrofx_nn::Module)]
#[module(name = "SyncBatchNorm")]
pub struct SyncBatchNorm {
    /// `[C]` (affine)
    pub weight: Option<Tensor>,
    /// `[C]` (affine)
    pub bias: Option<Tensor>,
    /// `[C]`
    #[module(buffer)]
    pub running_mean: Option<Tensor>,
    /// `[C]`
    #[module(buffer)]
    pub running_var: Option<Tensor>,
    /// `[]` int64
    #[module(buffer)]
    pub num_batches_tracked: Option<Tensor>,
    /// `eps`
    #[module(skip)]
    pub eps: f64,
    /// `momentum`; `None` is the cumulative moving average.
    #[module(skip)]
    pub momentum: Option<f64>,
    #[module(skip)]
    pg: Arc<ProcessGroup>,
    training: bool,
}

impl SyncBatchNorm {
    /// A `SyncBatchNorm` sharing `bn`'s parameters and buffers (updating one updates the
    /// other), in `bn`'s training mode, over the ranks of `pg`.
    pub fn from_batch_norm(bn: &BatchNorm, pg: Arc<ProcessGroup>) -> SyncBatchNorm {
        SyncBatchNorm {
            weight: bn.weight.clone(),
            bias: bn.bias.clone(),
            running_mean: bn.running_mean.clone(),
            running_var: bn.running_var.clone(),
            num_batches_tracked: bn.num_batches_tracked.clone(),
            eps: bn.eps,
            momentum: bn.momentum,
            pg,
            training: bn.is_training(),
        }
    }
}

/// Global per-channel mean, biased variance, and element count of one call.
type BatchStats = (Vec<f64>, Vec<f64>, f64);

/// The per-call statistics of a synchronised batch norm, kept for backward.
struct SyncBnFn {
    pg: Arc<ProcessGroup>,
    eps: f64,
    /// Per channel (global): mean and `1/sqrt(var + eps)`.
    mean: Vec<f64>,
    invstd: Vec<f64>,
    /// Global element count per channel.
    count: f64,
    /// Global biased variance per channel (for the running statistics).
    var: Vec<f64>,
    /// Hands the statistics back to the layer for its running statistics.
    stats: Arc<Mutex<BatchStats>>,
}

fn dims(x: &Tensor) -> Result<(usize, usize, usize)> {
    let s = x.shape();
    if s.len() < 2 {
        return Err(Error::shape(
            "SyncBatchNorm",
            format!("expected an input of at least 2 dimensions [N, C, ...], got {s:?}"),
        ));
    }
    Ok((s[0], s[1], s[2..].iter().product()))
}

/// `x` as f32 values (contiguous).
fn values(x: &Tensor) -> Result<Vec<f32>> {
    x.contiguous()?.to_vec::<f32>()
}

impl Function for SyncBnFn {
    fn name(&self) -> String {
        "SyncBatchNormBackward".into()
    }
    fn once_differentiable(&self) -> bool {
        true
    }
    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let x = &inputs[0];
        let (n, c, sp) = dims(x)?;
        let xs = values(x)?;
        // local sums, then the global ones: [Σx (C), Σx² (C), count]
        let mut sums = vec![0f64; 2 * c + 1];
        for i in 0..n {
            for ch in 0..c {
                let row = &xs[(i * c + ch) * sp..(i * c + ch + 1) * sp];
                let (mut s, mut q) = (0f64, 0f64);
                for &v in row {
                    let v = v as f64;
                    s += v;
                    q += v * v;
                }
                sums[ch] += s;
                sums[c + ch] += q;
            }
        }
        sums[2 * c] = (n * sp) as f64;
        let g = self.pg.all_reduce_sum_f64(sums)?;
        if g.len() != 2 * c + 1 {
            return Err(Error::argument("SyncBatchNorm", "the all-reduce returned a buffer of the wrong length"));
        }
        let count = g[2 * c];
        if count <= 1.0 {
            return Err(Error::argument(
                "SyncBatchNorm",
                format!(
                    "expected more than 1 value per channel when training over the global batch, got {count} \
                     (input {:?} on rank {})",
                    x.shape(),
                    self.pg.rank()
                ),
            ));
        }
        self.count = count;
        self.mean = (0..c).map(|ch| g[ch] / count).collect();
        self.var = (0..c).map(|ch| (g[c + ch] / count - self.mean[ch] * self.mean[ch]).max(0.0)).collect();
        self.invstd = self.var.iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect();
        let w = match inputs.get(1) {
            Some(w) => w.to_vec_f64()?,
            None => vec![1.0; c],
        };
        let b = match inputs.get(2) {
            Some(b) => b.to_vec_f64()?,
            None => vec![0.0; c],
        };
        let mut out = vec![0f32; xs.len()];
        for r in 0..n * c {
            let ch = r % c;
            let scale = w[ch] * self.invstd[ch];
            let shift = b[ch] - self.mean[ch] * scale;
            for (o, &v) in out[r * sp..(r + 1) * sp].iter_mut().zip(&xs[r * sp..(r + 1) * sp]) {
                *o = (v as f64 * scale + shift) as f32;
            }
        }
        if let Ok(mut st) = self.stats.lock() {
            *st = (self.mean.clone(), self.var.clone(), count);
        }
        ctx.save_for_backward(&inputs.iter().collect::<Vec<_>>());
        Ok(vec![Tensor::from_vec(out, x.shape())?])
    }

    fn backward(&self, ctx: &FunctionCtx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let saved = ctx.saved_tensors();
        let x = &saved[0];
        let (n, c, sp) = dims(x)?;
        let Some(gy) = grad_outputs.first().and_then(|g| g.as_ref()) else {
            return Ok(vec![None; saved.len()]);
        };
        let xs = values(x)?;
        let gs = values(gy)?;
        // local Σdy and Σdy·(x − mean) per channel; the input gradient needs their global sums
        let mut sums = vec![0f64; 2 * c];
        for r in 0..n * c {
            let ch = r % c;
            let (mut sg, mut sgx) = (0f64, 0f64);
            for (&g, &v) in gs[r * sp..(r + 1) * sp].iter().zip(&xs[r * sp..(r + 1) * sp]) {
                let g = g as f64;
                sg += g;
                sgx += g * (v as f64 - self.mean[ch]);
            }
            sums[ch] += sg;
            sums[c + ch] += sgx;
        }
        let w = match saved.get(1) {
            Some(w) => w.to_vec_f64()?,
            None => vec![1.0; c],
        };
        let mut out = vec![None; saved.len()];
        if ctx.needs_input_grad(1) && saved.len() > 1 {
            let gw: Vec<f32> = (0..c).map(|ch| (sums[c + ch] * self.invstd[ch]) as f32).collect();
            out[1] = Some(Tensor::from_vec(gw, &[c])?);
        }
        if ctx.needs_input_grad(2) && saved.len() > 2 {
            let gb: Vec<f32> = (0..c).map(|ch| sums[ch] as f32).collect();
            out[2] = Some(Tensor::from_vec(gb, &[c])?);
        }
        // the all-reduce runs whether or not this rank needs the input gradient: it is a
        // collective, every rank must take part
        let g = self.pg.all_reduce_sum_f64(sums)?;
        if ctx.needs_input_grad(0) {
            let mut gx = vec![0f32; xs.len()];
            for r in 0..n * c {
                let ch = r % c;
                let (mean_g, mean_gx) = (g[ch] / self.count, g[c + ch] / self.count);
                let k = self.invstd[ch] * self.invstd[ch] * mean_gx;
                let a = w[ch] * self.invstd[ch];
                for ((o, &gv), &v) in
                    gx[r * sp..(r + 1) * sp].iter_mut().zip(&gs[r * sp..(r + 1) * sp]).zip(&xs[r * sp..(r + 1) * sp])
                {
                    *o = (a * (gv as f64 - mean_g - (v as f64 - self.mean[ch]) * k)) as f32;
                }
            }
            out[0] = Some(Tensor::from_vec(gx, x.shape())?);
        }
        Ok(out)
    }
}

impl Module for SyncBatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.dtype() != DType::F32 {
            return Err(Error::dtype("SyncBatchNorm", format!("expected a float32 input, got {}", x.dtype())));
        }
        let (_, c, _) = dims(x)?;
        if let Some(w) = &self.weight {
            if w.numel() != c {
                return Err(Error::shape(
                    "SyncBatchNorm",
                    format!("the input {:?} has {c} channels but the layer has {} features", x.shape(), w.numel()),
                ));
            }
        }
        if !self.training && self.running_mean.is_some() {
            return ferrofx_nn::functional::batch_norm(
                x,
                self.running_mean.as_ref(),
                self.running_var.as_ref(),
                self.weight.as_ref(),
                self.bias.as_ref(),
                false,
                0.0,
                self.eps,
            );
        }
        let mut momentum = self.momentum.unwrap_or(0.0);
        if self.training {
            if let Some(nbt) = &self.num_batches_tracked {
                let _g = no_grad();
                nbt.add_(1i64)?;
                if self.momentum.is_none() {
                    momentum = 1.0 / nbt.item()?.max(1.0);
                }
            }
        }
        let mut inputs = vec![x.clone()];
        match (&self.weight, &self.bias) {
            (Some(w), Some(b)) => {
                inputs.push(w.clone());
                inputs.push(b.clone());
            }
            (Some(w), None) => inputs.push(w.clone()),
            _ => {}
        }
        let stats: Arc<Mutex<BatchStats>> = Arc::new(Mutex::new((vec![], vec![], 0.0)));
        let f = SyncBnFn {
            pg: self.pg.clone(),
            eps: self.eps,
            mean: vec![],
            invstd: vec![],
            count: 0.0,
            var: vec![],
            stats: stats.clone(),
        };
        let out = apply_function(f, &inputs)?.remove(0);
        if self.training {
            if let (Some(rm), Some(rv)) = (&self.running_mean, &self.running_var) {
                let (mean, var, count) = stats.lock().map(|g| g.clone()).unwrap_or_default();
                let _g = no_grad();
                let old_m = rm.to_vec_f64()?;
                let old_v = rv.to_vec_f64()?;
                let new_m: Vec<f32> =
                    old_m.iter().zip(&mean).map(|(o, m)| ((1.0 - momentum) * o + momentum * m) as f32).collect();
                let new_v: Vec<f32> = old_v
                    .iter()
                    .zip(&var)
                    .map(|(o, v)| ((1.0 - momentum) * o + momentum * v * count / (count - 1.0)) as f32)
                    .collect();
                rm.copy_(&Tensor::from_vec(new_m, rm.shape())?)?;
                rv.copy_(&Tensor::from_vec(new_v, rv.shape())?)?;
            }
        }
        Ok(out)
    }
}

/// PyTorch's `SyncBatchNorm.convert_sync_batchnorm`: replaces every `BatchNorm` leaf of `gm`
/// by a [`SyncBatchNorm`] sharing its tensors (so the original model's parameters and running
/// statistics are the ones trained). Returns the paths of the replaced layers.
pub fn convert_sync_batchnorm(gm: &mut GraphModule, pg: &Arc<ProcessGroup>) -> Result<Vec<String>> {
    let found: Vec<(String, SyncBatchNorm)> = gm
        .leaf_modules()
        .iter()
        .filter_map(|(path, m)| {
            m.as_any()
                .downcast_ref::<BatchNorm>()
                .map(|bn| (path.clone(), SyncBatchNorm::from_batch_norm(bn, pg.clone())))
        })
        .collect();
    let mut paths = Vec::with_capacity(found.len());
    for (path, sbn) in found {
        if !gm.add_submodule(&path, Box::new(sbn))? {
            return Err(Error::argument("convert_sync_batchnorm", format!("cannot replace the module at '{path}'")));
        }
        paths.push(path);
    }
    Ok(paths)
}
