//! Normalisations: `batch_norm` (training and evaluation, running statistics), `layer_norm`,
//! `group_norm`.
//!
//! Statistics accumulate in f64 lanes in one pass over the data, shifted by each channel's first
//! value so that a mean far from zero does not cancel the variance (see `stats`); the normalised
//! output is written in the input's dtype (f16/bf16 compute in f32). Normalisation uses the
//! biased variance, as PyTorch does.
//!
//! **`batch_norm` has a side effect.** In training mode with running statistics given, it
//! updates `running_mean` and `running_var` in place (PyTorch's formula, with the *unbiased*
//! batch variance for `running_var`): `running = (1 - momentum) * running + momentum * batch`.
//! Its [`Effect`] is therefore `Mutates(1)` (the `running_mean` argument), so DCE never drops it
//! and dispatch bumps `running_mean`'s version counter; the kernel bumps `running_var`'s itself.
//! The op's output is a fresh tensor (not an alias of argument 1).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::op::args::{bool_, float, int, ints, opt_tensor, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::ops::conv::{apply_block, Activation};
use crate::ops::kernel::{self, PAR_THRESHOLD};
use crate::ops::linalg::{dtype_title, is_half};
use crate::ops::simd::simd_dispatch;
use crate::ops::vmath;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;
use std::mem::MaybeUninit;

fn float_only(op: &str, dt: DType) -> Result<()> {
    if !dt.is_floating_point() {
        return Err(Error::dtype(
            op,
            format!("\"{op}\" not implemented for '{}' (normalisation needs a floating point input)", dtype_title(dt)),
        ));
    }
    Ok(())
}

/// Parameters may have the input's dtype, or f32 when the input is f16/bf16 (PyTorch's mixed
/// precision rule on CPU).
fn param_dtype_ok(op: &str, input: DType, name: &str, p: Option<&Tensor>) -> Result<()> {
    if let Some(p) = p {
        let d = p.dtype();
        if d != input && !(is_half(input) && d == DType::F32) {
            return Err(Error::dtype(
                op,
                format!("mixed dtype (CPU): all inputs must share same datatype. input is {input}, {name} is {d}"),
            ));
        }
    }
    Ok(())
}

fn norm_cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let c = crate::op::cost_elementwise(args, outs);
    Cost { flops: c.flops.saturating_mul(5), bytes: c.bytes }
}

/// Independent f64 accumulators per reduction: sums split over this many lanes vectorise (a
/// single running sum is one long chain of dependent additions) and round less.
const LANES: usize = 8;

/// Mean and biased variance of strided f64-convertible values, in one pass over the data:
/// sums of `d = x - k` and `d²` in f64, shifted by the first value `k` so that a mean far
/// from zero does not cancel the variance's digits (`var = (Σd² - (Σd)²/n) / n`).
#[inline]
fn stats<T: Element>(chunks: impl Iterator<Item = impl AsRef<[T]>> + Clone, count: usize) -> (f64, f64) {
    let k = chunks.clone().find_map(|c| c.as_ref().first().map(|v| v.to_f64())).unwrap_or(0.0);
    let mut acc = [[0f64; LANES]; 2];
    for c in chunks {
        shifted_sums(c.as_ref(), k, &mut acc);
    }
    let [s, q] = acc.map(|a| a.iter().sum::<f64>());
    let n = count as f64;
    let mean_d = s / n;
    (k + mean_d, ((q - s * mean_d) / n).max(0.0))
}

simd_dispatch! {
    /// Adds `d = x - k` and `d²` of `x` to the lane sums `acc`.
    fn shifted_sums<T: Element>(x: &[T], k: f64, acc: &mut [[f64; LANES]; 2]) {
        let [s, q] = acc;
        let mut blocks = x.chunks_exact(LANES);
        for b in &mut blocks {
            for l in 0..LANES {
                let d = b[l].to_f64() - k;
                s[l] += d;
                q[l] += d * d;
            }
        }
        for (l, v) in blocks.remainder().iter().enumerate() {
            let d = v.to_f64() - k;
            s[l] += d;
            q[l] += d * d;
        }
    }
}

simd_dispatch! {
    /// Adds `Σd, Σd², Σgy, Σgy·d` (`d = x - k`) of one plane to the lane sums `acc`: the batch
    /// statistics and gradient sums of the batch-norm backward, in one pass over `x` and `gy`.
    fn grad_sums<T: Element>(x: &[T], g: &[T], k: f64, acc: &mut [[f64; LANES]; 4]) {
        let (mut xb, mut gb) = (x.chunks_exact(LANES), g.chunks_exact(LANES));
        for (xs, gs) in (&mut xb).zip(&mut gb) {
            for l in 0..LANES {
                let (d, gv) = (xs[l].to_f64() - k, gs[l].to_f64());
                acc[0][l] += d;
                acc[1][l] += d * d;
                acc[2][l] += gv;
                acc[3][l] += gv * d;
            }
        }
        for (l, (xv, gv)) in xb.remainder().iter().zip(gb.remainder()).enumerate() {
            let (d, gv) = (xv.to_f64() - k, gv.to_f64());
            acc[0][l] += d;
            acc[1][l] += d * d;
            acc[2][l] += gv;
            acc[3][l] += gv * d;
        }
    }
}

/// `g` masked by the relu output `y`, as the unfused graph's `mul(g, gt(y, 0))` computes it
/// (times 1.0 or 0.0 in `T`: a NaN or infinite gradient where `y <= 0` gives NaN), in f64.
#[inline(always)]
fn masked<T: Element>(g: T, y: T) -> f64 {
    let keep = y > T::default();
    let gz = T::from_f64(g.to_f64() * 0.0);
    (if keep { g } else { gz }).to_f64()
}

simd_dispatch! {
    /// [`grad_sums`] of the gradient `g` masked by the relu output `y` (see [`masked`]).
    fn grad_sums_masked<T: Element>(x: &[T], g: &[T], y: &[T], k: f64, acc: &mut [[f64; LANES]; 4]) {
        let (mut xb, mut gb, mut yb) = (x.chunks_exact(LANES), g.chunks_exact(LANES), y.chunks_exact(LANES));
        for ((xs, gs), ys) in (&mut xb).zip(&mut gb).zip(&mut yb) {
            for l in 0..LANES {
                let (d, gv) = (xs[l].to_f64() - k, masked(gs[l], ys[l]));
                acc[0][l] += d;
                acc[1][l] += d * d;
                acc[2][l] += gv;
                acc[3][l] += gv * d;
            }
        }
        for (l, ((xv, gv), yv)) in xb.remainder().iter().zip(gb.remainder()).zip(yb.remainder()).enumerate() {
            let (d, gv) = (xv.to_f64() - k, masked(*gv, *yv));
            acc[0][l] += d;
            acc[1][l] += d * d;
            acc[2][l] += gv;
            acc[3][l] += gv * d;
        }
    }
}

simd_dispatch! {
    /// [`affine2`] of the gradient `g` masked by the relu output `y` (see [`masked`]).
    fn affine2_masked<T: Element>(out: &mut [MaybeUninit<T>], g: &[T], y: &[T], x: &[T], a: f64, b: f64, k: f64) {
        for (((o, &gv), &yv), &xv) in out.iter_mut().zip(g).zip(y).zip(x) {
            o.write(T::from_f64(a * masked(gv, yv) + b * xv.to_f64() + k));
        }
    }
}

simd_dispatch! {
    /// `out = x * scale + shift` (the batch-norm forward of one plane), computed in f64;
    /// writes every element of `out` (which may be uninitialised).
    fn scale_shift<T: Element>(out: &mut [MaybeUninit<T>], x: &[T], scale: f64, shift: f64) {
        for (o, &v) in out.iter_mut().zip(x) {
            o.write(T::from_f64(v.to_f64() * scale + shift));
        }
    }
}

simd_dispatch! {
    /// `out = a * g + b * x + k` (the batch-norm input gradient of one plane), computed in
    /// f64; writes every element of `out` (which may be uninitialised).
    fn affine2<T: Element>(out: &mut [MaybeUninit<T>], g: &[T], x: &[T], a: f64, b: f64, k: f64) {
        for ((o, &gv), &xv) in out.iter_mut().zip(g).zip(x) {
            o.write(T::from_f64(a * gv.to_f64() + b * xv.to_f64() + k));
        }
    }
}

/// `f` on the contiguous elements of `t`, or on `None` without a tensor.
fn with_opt_contiguous<E: Element, R>(op: &str, t: Option<&Tensor>, f: impl FnOnce(Option<&[E]>) -> R) -> Result<R> {
    match t {
        Some(t) => t.with_contiguous::<E, _>(op, |v| f(Some(v))),
        None => Ok(f(None)),
    }
}

fn f64_vec(op: &str, t: Option<&Tensor>) -> Result<Option<Vec<f64>>> {
    t.map(|t| kernel::to_f64_vec(t).map_err(|e| e.in_op(op))).transpose()
}

// ---------------------------------------------------------------------------------------------
// batch_norm
// ---------------------------------------------------------------------------------------------

struct BnArgs<'a> {
    x: &'a Tensor,
    rm: Option<&'a Tensor>,
    rv: Option<&'a Tensor>,
    w: Option<&'a Tensor>,
    b: Option<&'a Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
}

fn bn_args<'a>(args: &'a [Value]) -> Result<BnArgs<'a>> {
    let op = "batch_norm";
    let a = BnArgs {
        x: tensor(op, args, 0)?,
        rm: opt_tensor(op, args, 1)?,
        rv: opt_tensor(op, args, 2)?,
        w: opt_tensor(op, args, 3)?,
        b: opt_tensor(op, args, 4)?,
        training: bool_(op, args, 5)?,
        momentum: float(op, args, 6)?,
        eps: float(op, args, 7)?,
    };
    let dt = a.x.dtype();
    float_only(op, dt)?;
    let s = a.x.shape();
    if s.len() < 2 {
        return Err(Error::shape(
            op,
            format!("expected input of shape (N, C, *) with at least 2 dims, but got input of size {s:?}"),
        ));
    }
    let c = s[1];
    for (name, t) in [("running_mean", a.rm), ("running_var", a.rv), ("weight", a.w), ("bias", a.b)] {
        if let Some(t) = t {
            if t.numel() != c {
                return Err(Error::shape(
                    op,
                    format!("{name} should contain {c} elements not {} (input of size {s:?})", t.numel()),
                ));
            }
        }
        param_dtype_ok(op, dt, name, t)?;
    }
    if !a.training && (a.rm.is_none() || a.rv.is_none()) {
        let which = if a.rm.is_none() { "running_mean" } else { "running_var" };
        return Err(Error::argument(op, format!("{which} must be defined in evaluation mode")));
    }
    if a.training {
        let per_channel = a.x.numel() / c.max(1);
        if per_channel <= 1 {
            return Err(Error::argument(
                op,
                format!("Expected more than 1 value per channel when training, got input size {s:?}"),
            ));
        }
    }
    Ok(a)
}

fn bn_kernel(args: &[Value]) -> Result<Outputs> {
    bn_run("batch_norm", args, None)
}

/// What `batch_norm_fused` applies to each plane of the normalised output while it is in
/// cache: `act(y + residual)` (float32 only; the residual has the output's shape).
struct BnEpilogue<'a> {
    residual: Option<&'a [f32]>,
    act: Activation,
}

/// `batch_norm` (and, with `epi`, `batch_norm_fused`): statistics, normalisation plane by
/// plane, then the running statistics.
fn bn_run(op: &str, args: &[Value], epi: Option<&BnEpilogue<'_>>) -> Result<Outputs> {
    let a = bn_args(args)?;
    let dt = a.x.dtype();
    let x = if is_half(dt) { kernel::cast(a.x, DType::F32)? } else { a.x.clone() };
    let s = x.shape().to_vec();
    let (n, c) = (s[0], s[1]);
    let sp: usize = s[2..].iter().product();
    let w = f64_vec(op, a.w)?;
    let b = f64_vec(op, a.b)?;
    let xt = x.dtype();
    if epi.is_some() && xt != DType::F32 {
        return Err(Error::dtype(
            op,
            format!("{op} computes float32 only, got {xt:?}; use batch_norm and the add and activation ops"),
        ));
    }
    let (out, mean, var) = crate::match_dtype!(xt, E => x.with_contiguous::<E, _>(op, |xs| -> Result<(Tensor, Vec<f64>, Vec<f64>)> {
        // per-channel mean and invstd
        let (mean, var): (Vec<f64>, Vec<f64>) = if a.training {
            let count = n * sp;
            let st = |ch: usize| stats::<E>((0..n).map(move |i| &xs[(i * c + ch) * sp..(i * c + ch + 1) * sp]), count);
            if xs.len() >= PAR_THRESHOLD { (0..c).into_par_iter().map(st).unzip() } else { (0..c).map(st).unzip() }
        } else {
            (kernel::to_f64_vec(a.rm.ok_or_else(|| Error::argument(op, "running_mean must be defined in evaluation mode"))?)?,
             kernel::to_f64_vec(a.rv.ok_or_else(|| Error::argument(op, "running_var must be defined in evaluation mode"))?)?)
        };
        // y = x * scale + shift per channel
        let scale: Vec<f64> = (0..c).map(|ch| w.as_ref().map_or(1.0, |w| w[ch]) / (var[ch] + a.eps).sqrt()).collect();
        let shift: Vec<f64> = (0..c).map(|ch| b.as_ref().map_or(0.0, |b| b[ch]) - mean[ch] * scale[ch]).collect();
        // not zero-filled: every plane is written once below
        let mut out: Vec<E> = crate::memory::alloc_uninit(op, &s)?;
        let spare = &mut out.spare_capacity_mut()[..xs.len()];
        let row = |(r, o): (usize, &mut [MaybeUninit<E>])| {
            let ch = r % c;
            let xp = &xs[r * sp..(r + 1) * sp];
            match epi {
                None => scale_shift::<E>(o, xp, scale[ch], shift[ch]),
                Some(e) => {
                    // in chunks that stay in L1 between the normalisation and the epilogue
                    const CHUNK: usize = 1024;
                    for (i, (oc, xc)) in o.chunks_mut(CHUNK).zip(xp.chunks(CHUNK)).enumerate() {
                        scale_shift::<E>(oc, xc, scale[ch], shift[ch]);
                        if std::any::TypeId::of::<E>() == std::any::TypeId::of::<f32>() {
                            // SAFETY: E is f32 (checked just above), and scale_shift wrote
                            // every element of `oc`
                            let seg = unsafe { std::slice::from_raw_parts_mut(oc.as_mut_ptr() as *mut f32, oc.len()) };
                            let at = r * sp + i * CHUNK;
                            apply_block(seg, e.residual.map(|res| &res[at..at + seg.len()]), e.act);
                        }
                    }
                }
            }
        };
        if sp > 0 {
            if xs.len() >= PAR_THRESHOLD { spare.par_chunks_mut(sp).enumerate().for_each(row) } else { spare.chunks_mut(sp).enumerate().for_each(row) }
        }
        // SAFETY: alloc_uninit reserved xs.len() elements (the shape's product) and the planes
        // of `sp` elements cover all of them (with sp == 0 there are none).
        unsafe { out.set_len(xs.len()) };
        Ok((Tensor::from_vec(out, &s)?, mean, var))
    })?)?;
    // Running statistics are written after the input's read lock is released.
    if a.training {
        if let (Some(rm), Some(rv)) = (a.rm, a.rv) {
            let count = (n * sp) as f64;
            let m = a.momentum;
            let old_m = kernel::to_f64_vec(rm)?;
            let old_v = kernel::to_f64_vec(rv)?;
            let new_m: Vec<f64> = (0..c).map(|ch| (1.0 - m) * old_m[ch] + m * mean[ch]).collect();
            let new_v: Vec<f64> =
                (0..c).map(|ch| (1.0 - m) * old_v[ch] + m * var[ch] * count / (count - 1.0)).collect();
            kernel::copy_into(op, rm, &kernel::from_f64_vec(&new_m, rm.shape(), rm.dtype())?)?;
            kernel::copy_into(op, rv, &kernel::from_f64_vec(&new_v, rv.shape(), rv.dtype())?)?;
            // dispatch bumps running_mean (Effect::Mutates(1)); running_var is ours to bump.
            if !rv.shares_storage(rm) {
                rv.bump_version();
            }
        }
    }
    let out = if is_half(dt) { kernel::cast(&out, dt)? } else { out };
    Ok(smallvec![out])
}

/// The residual and activation of a `batch_norm_fused` call, checked against the input.
fn bn_fused_epilogue_args(args: &[Value]) -> Result<(Option<&Tensor>, Activation)> {
    const OP: &str = "batch_norm_fused";
    let x = tensor(OP, args, 0)?;
    if x.dtype() != DType::F32 {
        return Err(Error::dtype(
            OP,
            format!(
                "batch_norm_fused computes float32 only, got {:?}; use batch_norm and the add and activation ops",
                x.dtype()
            ),
        ));
    }
    let act = match args.get(9) {
        None => Activation::None,
        Some(_) => Activation::parse(crate::op::args::str_(OP, args, 9)?).map_err(|e| e.in_op(OP))?,
    };
    let res = opt_tensor(OP, args, 8)?;
    if let Some(r) = res {
        if r.shape() != x.shape() || r.dtype() != DType::F32 {
            return Err(Error::shape(
                OP,
                format!(
                    "the residual must be float32 of the input's shape {:?}, got {:?} {:?}; add a broadcast residual with a separate add",
                    x.shape(),
                    r.dtype(),
                    r.shape()
                ),
            ));
        }
    }
    Ok((res, act))
}

fn bn_fused_kernel(args: &[Value]) -> Result<Outputs> {
    const OP: &str = "batch_norm_fused";
    let (res, act) = bn_fused_epilogue_args(args)?;
    match res {
        Some(r) => {
            let r = kernel::contiguous(r)?;
            r.with_contiguous::<f32, _>(OP, |rs| bn_run(OP, args, Some(&BnEpilogue { residual: Some(rs), act })))?
        }
        None => bn_run(OP, args, Some(&BnEpilogue { residual: None, act })),
    }
}

/// Per channel: (sum of `gy * xhat` = the weight gradient, sum of `gy` = the bias gradient).
type ParamGrads = (f64, f64);

/// First-order gradients of `batch_norm` normalising with the batch statistics (training
/// mode): `(grad_input, grad_weight, grad_bias)`, each only when asked for, in one kernel:
/// per channel, the batch mean and variance of `x` and the sums of `gy` and `gy * (x - mean)`,
/// then `gx = w * rstd * (gy - mean(gy) - (x - mean) * rstd² * mean(gy * (x - mean)))`.
/// The backward formula uses it when backward records no graph (`create_graph=False`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_train_grads(
    x: &Tensor,
    gy: &Tensor,
    w: Option<&Tensor>,
    eps: f64,
    need_input: bool,
    need_weight: bool,
    need_bias: bool,
    relu_output: Option<&Tensor>,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let op = "batch_norm";
    let dt = x.dtype();
    if x.shape() != gy.shape() || x.ndim() < 2 {
        return Err(Error::shape(
            op,
            format!("gradient of shape {:?} does not match the input {:?}", gy.shape(), x.shape()),
        ));
    }
    if let Some(y) = relu_output {
        if y.shape() != x.shape() {
            return Err(Error::shape(
                "batch_norm_backward",
                format!("relu_output of shape {:?} does not match the input {:?}", y.shape(), x.shape()),
            ));
        }
    }
    let work = if is_half(dt) { DType::F32 } else { dt };
    let xw = if x.dtype() != work { kernel::cast(x, work)? } else { kernel::contiguous(x)? };
    let gw_ = if gy.dtype() != work { kernel::cast(gy, work)? } else { kernel::contiguous(gy)? };
    // the relu output whose mask multiplies the gradient (empty: none), in the working dtype
    let yw = match relu_output {
        Some(y) if y.dtype() != work => Some(kernel::cast(y, work)?),
        Some(y) => Some(kernel::contiguous(y)?),
        None => None,
    };
    let s = x.shape().to_vec();
    let (n, c) = (s[0], s[1]);
    let sp: usize = s[2..].iter().product();
    let count = (n * sp) as f64;
    let wv = f64_vec(op, w)?;
    let (gx, params) = crate::match_dtype!(work, E => xw.with_contiguous::<E, _>(op, |xs| {
        gw_.with_contiguous::<E, _>(op, |gs| -> Result<(Option<Tensor>, Vec<ParamGrads>)> {
          with_opt_contiguous::<E, _>(op, yw.as_ref(), |ys| -> Result<(Option<Tensor>, Vec<ParamGrads>)> {
            // per channel: (mean, sum of gy, sum of gy * (x - mean)), and the biased variance
            let chan = |ch: usize| {
                let planes = (0..n).map(move |i| (i * c + ch) * sp..(i * c + ch + 1) * sp);
                let k = xs.get(ch * sp).map_or(0.0, |v| v.to_f64());
                let mut acc = [[0f64; LANES]; 4];
                for r in planes {
                    match ys {
                        Some(ys) => grad_sums_masked::<E>(&xs[r.clone()], &gs[r.clone()], &ys[r], k, &mut acc),
                        None => grad_sums::<E>(&xs[r.clone()], &gs[r], k, &mut acc),
                    }
                }
                let [sd, sdd, sg, sgd] = acc.map(|a| a.iter().sum::<f64>());
                let count = (n * sp) as f64;
                let mean_d = sd / count;
                let var = ((sdd - sd * mean_d) / count).max(0.0);
                // Σ gy (x - mean) = Σ gy d - (mean - k) Σ gy
                ((k + mean_d, sg, sgd - mean_d * sg), var)
            };
            let (sums, vars): (Vec<(f64, f64, f64)>, Vec<f64>) =
                if xs.len() >= PAR_THRESHOLD { (0..c).into_par_iter().map(chan).unzip() } else { (0..c).map(chan).unzip() };
            let rstd: Vec<f64> = vars.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
            let params: Vec<ParamGrads> = sums.iter().zip(&rstd).map(|(&(_, sg, sgx), r)| (sgx * r, sg)).collect();
            if !need_input || sp == 0 {
                return Ok((None, params));
            }
            // gx = a * gy + b * x + k per channel
            let coef: Vec<(f64, f64, f64)> = (0..c)
                .map(|ch| {
                    let ((mean, sg, sgx), rstd) = (sums[ch], rstd[ch]);
                    let a = wv.as_ref().map_or(1.0, |w| w[ch]) * rstd;
                    let b = -a * rstd * rstd * sgx / count;
                    (a, b, -a * sg / count - b * mean)
                })
                .collect();
            // not zero-filled: every plane is written once below
            let mut out: Vec<E> = crate::memory::alloc_uninit(op, &s)?;
            let spare = &mut out.spare_capacity_mut()[..xs.len()];
            let row = |(r, o): (usize, &mut [MaybeUninit<E>])| {
                let (a, b, k) = coef[r % c];
                let pr = r * sp..(r + 1) * sp;
                match ys {
                    Some(ys) => affine2_masked::<E>(o, &gs[pr.clone()], &ys[pr.clone()], &xs[pr], a, b, k),
                    None => affine2::<E>(o, &gs[pr.clone()], &xs[pr], a, b, k),
                }
            };
            if xs.len() >= PAR_THRESHOLD { spare.par_chunks_mut(sp).enumerate().for_each(row) } else { spare.chunks_mut(sp).enumerate().for_each(row) }
            // SAFETY: alloc_uninit reserved xs.len() elements and the planes of `sp > 0`
            // elements (checked above) cover all of them.
            unsafe { out.set_len(xs.len()) };
            Ok((Some(Tensor::from_vec(out, &s)?), params))
          })?
        })
    })???);
    let back = |t: Tensor| if t.dtype() != dt { kernel::cast(&t, dt) } else { Ok(t) };
    let gx = gx.map(back).transpose()?;
    // parameter gradients in the parameters' dtype
    let pdt = w.map(|w| w.dtype()).unwrap_or(dt);
    let gw = if need_weight {
        Some(kernel::from_f64_vec(&params.iter().map(|p| p.0).collect::<Vec<_>>(), &[c], pdt)?)
    } else {
        None
    };
    let gb = if need_bias {
        Some(kernel::from_f64_vec(&params.iter().map(|p| p.1).collect::<Vec<_>>(), &[c], pdt)?)
    } else {
        None
    };
    Ok((gx, gw, gb))
}

/// `batch_norm`'s arguments (also the first eight of `batch_norm_fused`).
const BN_SCHEMA: [ArgSpec; 8] = [
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("running_mean", T::OptTensor),
    ArgSpec::req("running_var", T::OptTensor),
    ArgSpec::opt("weight", T::OptTensor, D::None),
    ArgSpec::opt("bias", T::OptTensor, D::None),
    ArgSpec::opt("training", T::Bool, D::Bool(false)),
    ArgSpec::opt("momentum", T::Float, D::Float(0.1)),
    ArgSpec::opt("eps", T::Float, D::Float(1e-5)),
];

/// `batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
/// momentum=0.1, eps=1e-5)` (torch.nn.functional's argument order).
///
/// In training mode it normalises with the batch statistics and, when running statistics are
/// given, **updates them in place** (see the module docs); in evaluation mode it uses them.
pub static BATCH_NORM: OpDef = OpDef {
    name: "batch_norm",
    schema: &BN_SCHEMA,
    meta: |args| {
        let a = bn_args(args)?;
        Ok(smallvec![TensorMeta::contiguous(a.x.shape(), a.x.dtype())])
    },
    kernel: bn_kernel,
    cost: norm_cost,
    effect: Effect::Mutates(1),
    category: Category::Normalization,
    backward: Some(crate::autograd::formulas::nn::batch_norm_backward),
    saves: Saves { inputs: 15, outputs: 0 },
    doc: "Batch normalisation; in training mode updates running_mean/running_var in place.",
};

/// `batch_norm_fused(input, running_mean, running_var, weight, bias, training, momentum, eps,
/// residual, activation)`: `act(batch_norm(...) + residual)` with the add and the activation
/// applied to each normalised (image, channel) plane while it is in cache, instead of by
/// separate kernels that read and write the whole activation again. Made by
/// `ferrofx-compile`'s epilogue pass for the `batch_norm → [add] → relu` chains of training
/// graphs (where BatchNorm cannot be folded into the convolution); float32 only; same side
/// effect as `batch_norm` (the running statistics, in training mode). `activation` is one of
/// [`Activation::parse`]'s texts. The result equals the unfused chain bit for bit (the same
/// float32 add and activation on the same normalised values).
pub static BATCH_NORM_FUSED: OpDef = OpDef {
    name: "batch_norm_fused",
    schema: &[
        BN_SCHEMA[0],
        BN_SCHEMA[1],
        BN_SCHEMA[2],
        BN_SCHEMA[3],
        BN_SCHEMA[4],
        BN_SCHEMA[5],
        BN_SCHEMA[6],
        BN_SCHEMA[7],
        ArgSpec::opt("residual", T::OptTensor, D::None),
        ArgSpec::opt("activation", T::Str, D::Str("none")),
    ],
    meta: |args| {
        let a = bn_args(args)?;
        bn_fused_epilogue_args(args)?;
        Ok(smallvec![TensorMeta::contiguous(a.x.shape(), a.x.dtype())])
    },
    kernel: bn_fused_kernel,
    cost: norm_cost,
    effect: Effect::Mutates(1),
    category: Category::Normalization,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Batch normalisation with a residual add and an activation applied per plane in one kernel (made by ferrofx-compile's epilogue fusion).",
};

// ---------------------------------------------------------------------------------------------
// layer_norm
// ---------------------------------------------------------------------------------------------

fn ln_check(args: &[Value]) -> Result<(usize, usize)> {
    let op = "layer_norm";
    let x = tensor(op, args, 0)?;
    float_only(op, x.dtype())?;
    let ns = ints(op, args, 1)?;
    let s = x.shape();
    let nsu: Vec<usize> = ns.iter().map(|&v| v.max(0) as usize).collect();
    if ns.is_empty() {
        return Err(Error::argument(op, "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = []"));
    }
    if ns.iter().any(|&v| v < 0) || s.len() < ns.len() || s[s.len() - ns.len()..] != nsu[..] {
        return Err(Error::shape(
            op,
            format!(
                "Given normalized_shape={:?}, expected input with shape [*, {}], but got input of size{s:?}",
                ns.as_ref(),
                ns.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for (name, i) in [("weight", 2), ("bias", 3)] {
        if let Some(t) = opt_tensor(op, args, i)? {
            if t.shape() != nsu.as_slice() {
                return Err(Error::shape(
                    op,
                    format!("Expected {name} to be of same shape as normalized_shape, but got {name} of shape {:?} and normalized_shape = {:?}", t.shape(), ns.as_ref()),
                ));
            }
            param_dtype_ok(op, x.dtype(), name, Some(t))?;
        }
    }
    let d: usize = nsu.iter().product();
    Ok((x.numel() / d.max(1), d))
}

fn ln_kernel(args: &[Value]) -> Result<Outputs> {
    let op = "layer_norm";
    let (_rows, d) = ln_check(args)?;
    let x0 = tensor(op, args, 0)?;
    let dt = x0.dtype();
    let x = if is_half(dt) { kernel::cast(x0, DType::F32)? } else { x0.clone() };
    let eps = float(op, args, 4)?;
    let xt = x.dtype();
    if xt == DType::F32 {
        let out = ln_f32(op, &x, d, eps, opt_tensor(op, args, 2)?, opt_tensor(op, args, 3)?)?;
        let out = if is_half(dt) { kernel::cast(&out, dt)? } else { out };
        return Ok(smallvec![out]);
    }
    let w = f64_vec(op, opt_tensor(op, args, 2)?)?;
    let b = f64_vec(op, opt_tensor(op, args, 3)?)?;
    let out = crate::match_dtype!(xt, E => x.with_contiguous::<E, _>(op, |xs| {
        let mut out = vec![E::default(); xs.len()];
        let row = |(o, xr): (&mut [E], &[E])| {
            let (mean, var) = stats::<E>(std::iter::once(xr), d);
            let rstd = 1.0 / (var + eps).sqrt();
            for (j, (o, &v)) in o.iter_mut().zip(xr).enumerate() {
                let y = (v.to_f64() - mean) * rstd;
                let y = match &w { Some(w) => y * w[j], None => y };
                *o = E::from_f64(match &b { Some(b) => y + b[j], None => y });
            }
        };
        if d > 0 {
            if xs.len() >= PAR_THRESHOLD {
                out.par_chunks_mut(d).zip(xs.par_chunks(d)).for_each(row);
            } else {
                out.chunks_mut(d).zip(xs.chunks(d)).for_each(row);
            }
        }
        Tensor::from_vec(out, x.shape())
    })?)?;
    let out = if is_half(dt) { kernel::cast(&out, dt)? } else { out };
    Ok(smallvec![out])
}

/// LayerNorm of f32 rows of `d` elements: statistics in f64 (one pass), the normalisation and
/// affine map in f32 with the vectorised `vmath::normalize_row`, rows split across the pool.
fn ln_f32(op: &str, x: &Tensor, d: usize, eps: f64, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Tensor> {
    let param = |t: Option<&Tensor>| -> Result<Option<Vec<f32>>> {
        t.map(|t| kernel::cast(t, DType::F32)?.to_vec::<f32>()).transpose().map_err(|e| e.in_op(op))
    };
    let (w, b) = (param(w)?, param(b)?);
    x.with_contiguous::<f32, _>(op, |xs| {
        let mut out = crate::memory::alloc_filled::<f32>(op, x.shape(), 0.0)?;
        let row = |(o, xr): (&mut [f32], &[f32])| {
            let (mean, var) = stats::<f32>(std::iter::once(xr), d);
            let rstd = 1.0 / (var + eps).sqrt();
            vmath::normalize_row(o, xr, mean as f32, rstd as f32, w.as_deref(), b.as_deref());
        };
        // rows in tasks of about PAR_THRESHOLD / 4 elements, one team job
        match (PAR_THRESHOLD / 4).checked_div(d) {
            Some(rows) if xs.len() >= PAR_THRESHOLD => {
                let per = rows.max(1) * d;
                super::team::chunks_mut(&mut out, per, |k, o| {
                    let xr = &xs[k * per..k * per + o.len()];
                    o.chunks_mut(d).zip(xr.chunks(d)).for_each(row)
                });
            }
            Some(_) => out.chunks_mut(d).zip(xs.chunks(d)).for_each(row),
            None => {}
        }
        Tensor::from_vec(out, x.shape())
    })?
}

/// `layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5)`.
pub static LAYER_NORM: OpDef = OpDef {
    name: "layer_norm",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("normalized_shape", T::IntList),
        ArgSpec::opt("weight", T::OptTensor, D::None),
        ArgSpec::opt("bias", T::OptTensor, D::None),
        ArgSpec::opt("eps", T::Float, D::Float(1e-5)),
    ],
    meta: |args| {
        ln_check(args)?;
        let x = tensor("layer_norm", args, 0)?;
        Ok(smallvec![TensorMeta::contiguous(x.shape(), x.dtype())])
    },
    kernel: ln_kernel,
    cost: norm_cost,
    effect: Effect::Pure,
    category: Category::Normalization,
    backward: Some(crate::autograd::formulas::nn::layer_norm_backward),
    saves: Saves { inputs: 5, outputs: 0 },
    doc: "Layer normalisation over the trailing normalized_shape dims.",
};

// ---------------------------------------------------------------------------------------------
// group_norm
// ---------------------------------------------------------------------------------------------

fn gn_check(args: &[Value]) -> Result<(usize, usize, usize, usize)> {
    let op = "group_norm";
    let x = tensor(op, args, 0)?;
    float_only(op, x.dtype())?;
    let s = x.shape();
    if s.len() < 2 {
        return Err(Error::shape(
            op,
            format!("Expected at least 2 dimensions for input tensor but received {}", s.len()),
        ));
    }
    let g = int(op, args, 1)?;
    let c = s[1];
    if g <= 0 || c % g as usize != 0 {
        return Err(Error::shape(
            op,
            format!("Expected number of channels in input to be divisible by num_groups, but got input of shape {s:?} and num_groups={g}"),
        ));
    }
    for (name, i) in [("weight", 2), ("bias", 3)] {
        if let Some(t) = opt_tensor(op, args, i)? {
            if t.ndim() != 1 || t.numel() != c {
                return Err(Error::shape(
                    op,
                    format!("Expected {name} to be a vector of size equal to the number of channels in input, but got {name} of shape {:?} and input of shape {s:?}", t.shape()),
                ));
            }
            param_dtype_ok(op, x.dtype(), name, Some(t))?;
        }
    }
    Ok((s[0], c, g as usize, s[2..].iter().product()))
}

fn gn_kernel(args: &[Value]) -> Result<Outputs> {
    let op = "group_norm";
    let (_n, c, g, sp) = gn_check(args)?;
    let x0 = tensor(op, args, 0)?;
    let dt = x0.dtype();
    let x = if is_half(dt) { kernel::cast(x0, DType::F32)? } else { x0.clone() };
    let w = f64_vec(op, opt_tensor(op, args, 2)?)?;
    let b = f64_vec(op, opt_tensor(op, args, 3)?)?;
    let eps = float(op, args, 4)?;
    let cg = c / g;
    let block = cg * sp;
    let xt = x.dtype();
    let out = crate::match_dtype!(xt, E => x.with_contiguous::<E, _>(op, |xs| {
        let mut out = vec![E::default(); xs.len()];
        let unit = |(u, (o, xr)): (usize, (&mut [E], &[E]))| {
            let gi = u % g;
            let (mean, var) = stats::<E>(std::iter::once(xr), block);
            let rstd = 1.0 / (var + eps).sqrt();
            for k in 0..cg {
                let ch = gi * cg + k;
                let sc = w.as_ref().map_or(1.0, |w| w[ch]) * rstd;
                let sh = b.as_ref().map_or(0.0, |b| b[ch]) - mean * sc;
                for (o, &v) in o[k * sp..(k + 1) * sp].iter_mut().zip(&xr[k * sp..(k + 1) * sp]) {
                    *o = E::from_f64(v.to_f64() * sc + sh);
                }
            }
        };
        if block > 0 {
            if xs.len() >= PAR_THRESHOLD {
                out.par_chunks_mut(block).zip(xs.par_chunks(block)).enumerate().for_each(unit);
            } else {
                out.chunks_mut(block).zip(xs.chunks(block)).enumerate().for_each(unit);
            }
        }
        Tensor::from_vec(out, x.shape())
    })?)?;
    let out = if is_half(dt) { kernel::cast(&out, dt)? } else { out };
    Ok(smallvec![out])
}

/// `group_norm(input, num_groups, weight=None, bias=None, eps=1e-5)`.
pub static GROUP_NORM: OpDef = OpDef {
    name: "group_norm",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("num_groups", T::Int),
        ArgSpec::opt("weight", T::OptTensor, D::None),
        ArgSpec::opt("bias", T::OptTensor, D::None),
        ArgSpec::opt("eps", T::Float, D::Float(1e-5)),
    ],
    meta: |args| {
        gn_check(args)?;
        let x = tensor("group_norm", args, 0)?;
        Ok(smallvec![TensorMeta::contiguous(x.shape(), x.dtype())])
    },
    kernel: gn_kernel,
    cost: norm_cost,
    effect: Effect::Pure,
    category: Category::Normalization,
    backward: Some(crate::autograd::formulas::nn::group_norm_backward),
    saves: Saves { inputs: 5, outputs: 0 },
    doc: "Group normalisation over groups of channels.",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&BATCH_NORM, &BATCH_NORM_FUSED, &LAYER_NORM, &GROUP_NORM];

// ---------------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------------

fn one(op: &'static OpDef, args: &[Value]) -> Result<Tensor> {
    let mut out: Outputs = dispatch(op, CallKind::Function, args)?;
    out.pop().ok_or_else(|| Error::schema(op.name, "op returned no output"))
}

/// `torch.nn.functional.batch_norm(input, running_mean, running_var, weight, bias, training,
/// momentum, eps)`. In training mode, given running statistics are updated in place.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    one(
        &BATCH_NORM,
        &[
            input.into(),
            running_mean.into(),
            running_var.into(),
            weight.into(),
            bias.into(),
            training.into(),
            momentum.into(),
            eps.into(),
        ],
    )
}

/// `torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)`.
pub fn layer_norm(
    input: &Tensor,
    normalized_shape: &[i64],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    one(&LAYER_NORM, &[input.into(), normalized_shape.into(), weight.into(), bias.into(), eps.into()])
}

/// `torch.nn.functional.group_norm(input, num_groups, weight, bias, eps)`.
pub fn group_norm(
    input: &Tensor,
    num_groups: i64,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    one(&GROUP_NORM, &[input.into(), Value::Int(num_groups), weight.into(), bias.into(), eps.into()])
}
