//! Backward formulas of the reduction family (`ops/reduce.rs`).

use crate::autograd::BackwardCtx;
use crate::error::{Error, Result};
use crate::layout::wrap_dim;
use crate::op::args::{bool_, opt_ints};
use crate::tensor::Tensor;

type Grads = Result<Vec<Option<Tensor>>>;

fn g0<'a>(ctx: &'a BackwardCtx<'_>) -> Result<&'a Tensor> {
    ctx.grad(0).ok_or_else(|| Error::autograd(ctx.op().name, "missing output gradient"))
}

fn shape_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// `sum(input, dim, keepdim, dtype)`: re-insert reduced dims (when not kept), then expand.
pub fn sum_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let n = m.shape.len();
    let mut g = g0(ctx)?.clone();
    let dims = opt_ints("sum", ctx.args(), 1)?;
    let keepdim = bool_("sum", ctx.args(), 2).unwrap_or(false);
    if let Some(dims) = dims {
        if !keepdim && !dims.is_empty() {
            let mut ds: Vec<usize> = dims.iter().map(|&d| wrap_dim("sum", d, n.max(1))).collect::<Result<_>>()?;
            ds.sort_unstable();
            ds.dedup();
            for d in ds {
                g = g.unsqueeze(d as i64)?;
            }
        }
    }
    if g.dtype() != m.dtype {
        g = g.to_dtype(m.dtype)?;
    }
    Ok(vec![Some(g.expand(&shape_i64(&m.shape))?)])
}

/// `sum_to_size(input, size)`: expand back.
pub fn sum_to_size_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    Ok(vec![Some(g0(ctx)?.expand(&shape_i64(&m.shape))?)])
}

// ---------------------------------------------------------------------------------------------
// The rest of the reduction family, softmax, scans and sorts.

use super::prims::{self, reduced_count, reduced_dims, restore_dims, scale, to_dtype, zeros};
use crate::op::args::{int, opt_dtype, opt_int, opt_scalar};

fn g_restored(ctx: &BackwardCtx<'_>, dims: &[usize], keepdim: bool) -> Result<Tensor> {
    restore_dims(g0(ctx)?, dims, keepdim)
}

/// `mean(input, dim, keepdim, dtype)`: the gradient spread evenly.
pub fn mean_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let dims = reduced_dims("mean", opt_ints("mean", ctx.args(), 1)?.as_deref(), m.shape.len())?;
    let keepdim = bool_("mean", ctx.args(), 2).unwrap_or(false);
    let g = g_restored(ctx, &dims, keepdim)?;
    let n = reduced_count(&m.shape, &dims);
    let g = scale(&g, 1.0 / n as f64)?;
    let g = to_dtype(g, m.dtype)?;
    Ok(vec![Some(g.expand(&shape_i64(&m.shape))?)])
}

fn reverse(t: &Tensor, d: usize) -> Result<Tensor> {
    let n = t.shape()[d];
    let idx: Vec<i64> = (0..n as i64).rev().collect();
    t.index_select(d as i64, &Tensor::from_vec(idx, &[n])?)
}

/// Exclusive cumulative product along `d` (1, x0, x0*x1, ...).
fn exclusive_cumprod(x: &Tensor, d: usize) -> Result<Tensor> {
    let n = x.shape()[d];
    let mut ones_shape = x.shape().to_vec();
    ones_shape[d] = 1;
    let ones = crate::ops::kernel::from_f64_vec(&vec![1.0; ones_shape.iter().product()], &ones_shape, x.dtype())?;
    let shifted = crate::ops::join::cat(&[ones, x.narrow(d as i64, 0, n as i64 - 1)?], d as i64)?;
    shifted.cumprod(d as i64)
}

/// `prod(input, dim, keepdim, dtype)`: the product of the other elements, computed with
/// exclusive cumulative products from both ends (exact with zeros, differentiable).
pub fn prod_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let x = ctx.input(0)?;
    let dim = opt_int("prod", ctx.args(), 1)?;
    let keepdim = bool_("prod", ctx.args(), 2).unwrap_or(false);
    let x = to_dtype(x.clone(), g0(ctx)?.dtype())?;
    let (xs, d, g) = match dim {
        None => (x.reshape(&[-1])?, 0usize, g0(ctx)?.reshape(&[1])?),
        Some(d) => {
            let d = wrap_dim("prod", d, m.shape.len().max(1))?;
            let xs = if m.shape.is_empty() { x.reshape(&[1])? } else { x.clone() };
            let g = if m.shape.is_empty() { g0(ctx)?.reshape(&[1])? } else { restore_dims(g0(ctx)?, &[d], keepdim)? };
            (xs, d, g)
        }
    };
    if xs.shape()[d] == 0 {
        return Ok(vec![Some(zeros(&m.shape, m.dtype)?)]);
    }
    let fwd = exclusive_cumprod(&xs, d)?;
    let bwd = reverse(&exclusive_cumprod(&reverse(&xs, d)?, d)?, d)?;
    let gi = prims::mul(&prims::mul(&fwd, &bwd)?, &g)?;
    let gi = to_dtype(gi.reshape(&shape_i64(&m.shape))?, m.dtype)?;
    Ok(vec![Some(gi)])
}

/// Evenly distributes the gradient among the elements equal to the (kept-dim) result.
fn evenly_distribute(x: &Tensor, out: &Tensor, g: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let mask = prims::eq(x, out)?.to_dtype(g.dtype())?;
    let count = if dims.is_empty() { mask.sum()? } else { mask.sum_dim(&shape_i64(dims), true)? };
    prims::mul(&mask, &prims::div(g, &count)?)
}

/// `max()` / `min()` (full): gradient split among the tied extrema, as PyTorch.
pub fn max_all_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let x = ctx.input(0)?;
    let out = ctx.output(0)?;
    let dims: Vec<usize> = (0..x.ndim()).collect();
    Ok(vec![Some(evenly_distribute(x, out, g0(ctx)?, &dims)?)])
}

/// `amax(dim, keepdim)` / `amin`: gradient split among the tied extrema.
pub fn amax_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let x = ctx.input(0)?;
    let op = ctx.op().name;
    let dims = reduced_dims(op, opt_ints(op, ctx.args(), 1)?.as_deref(), x.ndim())?;
    let keepdim = bool_(op, ctx.args(), 2).unwrap_or(false);
    let out = restore_dims(ctx.output(0)?, &dims, keepdim)?;
    let g = g_restored(ctx, &dims, keepdim)?;
    Ok(vec![Some(evenly_distribute(x, &out, &g, &dims)?)])
}

/// Writes `g` (shaped like `index`) into zeros of the input's shape at `index` along `dim`.
fn value_selecting(ctx: &BackwardCtx<'_>, g: &Tensor, index: &Tensor, dim: usize) -> Result<Tensor> {
    let m = ctx.input_meta(0)?;
    if m.shape.is_empty() {
        return g.reshape(&[]);
    }
    let z = zeros(&m.shape, g.dtype())?;
    z.scatter(dim as i64, index, g)
}

/// `max.dim` / `min.dim`: the gradient goes to the selected index.
pub fn max_dim_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let m = ctx.input_meta(0)?;
    let d = wrap_dim(op, int(op, ctx.args(), 1)?, m.shape.len().max(1))?;
    let keepdim = bool_(op, ctx.args(), 2).unwrap_or(false);
    let ds = if m.shape.is_empty() { vec![] } else { vec![d] };
    let g = g_restored(ctx, &ds, keepdim)?;
    let idx = restore_dims(ctx.output(1)?, &ds, keepdim)?;
    Ok(vec![Some(value_selecting(ctx, &g, &idx, d)?)])
}

/// `sort` / `topk` (values): the gradient goes back to the selected positions.
pub fn sort_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let m = ctx.input_meta(0)?;
    let dim_pos = if op == "topk" { 2 } else { 1 };
    let d = wrap_dim(op, int(op, ctx.args(), dim_pos)?, m.shape.len().max(1))?;
    let g = g0(ctx)?;
    let idx = ctx.output(1)?;
    Ok(vec![Some(value_selecting(ctx, g, idx, d)?)])
}

fn var_params(ctx: &BackwardCtx<'_>) -> Result<(Vec<usize>, bool, f64)> {
    let op = ctx.op().name;
    let a = ctx.args();
    let m = ctx.input_meta(0)?;
    let dims = reduced_dims(op, opt_ints(op, a, 1)?.as_deref(), m.shape.len())?;
    let unbiased = bool_(op, a, 2).unwrap_or(true);
    let keepdim = bool_(op, a, 3).unwrap_or(false);
    let correction = match opt_scalar(op, a, 4)? {
        Some(c) => c.to_f64(),
        None => {
            if unbiased {
                1.0
            } else {
                0.0
            }
        }
    };
    Ok((dims, keepdim, correction))
}

fn centered(x: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let mean = x.mean_dim(&shape_i64(dims), true)?;
    prims::sub(x, &mean)
}

/// `var`: `2 (x - mean) / (N - correction)`.
pub fn var_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let x = ctx.input(0)?;
    let (dims, keepdim, c) = var_params(ctx)?;
    let n = reduced_count(x.shape(), &dims) as f64;
    let g = g_restored(ctx, &dims, keepdim)?;
    let gi = prims::mul(&scale(&centered(x, &dims)?, 2.0 / (n - c).max(0.0))?, &g)?;
    Ok(vec![Some(gi)])
}

/// `std`: `(x - mean) / ((N - correction) std)`.
pub fn std_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let x = ctx.input(0)?;
    let (dims, keepdim, c) = var_params(ctx)?;
    let n = reduced_count(x.shape(), &dims) as f64;
    let g = g_restored(ctx, &dims, keepdim)?;
    let out = restore_dims(ctx.output(0)?, &dims, keepdim)?;
    let r = prims::div(&g, &out)?;
    let gi = prims::mul(&scale(&centered(x, &dims)?, 1.0 / (n - c).max(0.0))?, &r)?;
    Ok(vec![Some(gi)])
}

/// `logsumexp`: `g * exp(x - out)`.
pub fn logsumexp_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let x = ctx.input(0)?;
    let dims = reduced_dims("logsumexp", opt_ints("logsumexp", ctx.args(), 1)?.as_deref(), x.ndim())?;
    let keepdim = bool_("logsumexp", ctx.args(), 2).unwrap_or(false);
    let g = g_restored(ctx, &dims, keepdim)?;
    let out = restore_dims(ctx.output(0)?, &dims, keepdim)?;
    let xx = to_dtype(x.clone(), out.dtype())?;
    Ok(vec![Some(prims::mul(&g, &prims::exp(&prims::sub(&xx, &out)?)?)?)])
}

/// `norm(p, dim, keepdim, dtype)`.
pub fn norm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let a = ctx.args();
    let x0 = ctx.input(0)?;
    let p = opt_scalar("norm", a, 1)?.map(|s| s.to_f64()).unwrap_or(2.0);
    let dims = reduced_dims("norm", opt_ints("norm", a, 2)?.as_deref(), x0.ndim())?;
    let keepdim = bool_("norm", a, 3).unwrap_or(false);
    let _ = opt_dtype("norm", a, 4)?;
    let g = g_restored(ctx, &dims, keepdim)?;
    let out = restore_dims(ctx.output(0)?, &dims, keepdim)?;
    let x = to_dtype(x0.clone(), out.dtype())?;
    let gi = if p == 0.0 {
        zeros(x.shape(), x.dtype())?
    } else if p == 1.0 {
        prims::mul(&prims::sign(&x)?, &g)?
    } else if p == 2.0 {
        let r = prims::where_(&prims::eq(&out, 0.0)?, 0.0, &prims::div(&g, &out)?)?;
        prims::mul(&x, &r)?
    } else if p.is_infinite() {
        let ax = prims::abs(&x)?;
        let d = evenly_distribute(&ax, &out, &g, &dims)?;
        prims::mul(&prims::sign(&x)?, &d)?
    } else {
        // x |x|^(p-2) g / out^(p-1)
        let ax = prims::abs(&x)?;
        let num = prims::mul(&x, &prims::pow(&ax, p - 2.0)?)?;
        let den = prims::pow(&out, p - 1.0)?;
        let r = prims::where_(&prims::eq(&out, 0.0)?, 0.0, &prims::div(&g, &den)?)?;
        prims::mul(&num, &r)?
    };
    Ok(vec![Some(to_dtype(gi, x0.dtype())?)])
}

/// `softmax(input, dim, dtype)`: `y (g - sum(g y))`.
pub fn softmax_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let d = int("softmax", ctx.args(), 1)?;
    let y = ctx.output(0)?;
    let g = g0(ctx)?;
    let gy = prims::mul(g, y)?;
    let gi = prims::sub(&gy, &prims::mul(y, &gy.sum_dim(&[d], true)?)?)?;
    Ok(vec![Some(to_dtype(gi, m.dtype)?)])
}

/// `log_softmax(input, dim, dtype)`: `g - exp(y) sum(g)`.
pub fn log_softmax_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let d = int("log_softmax", ctx.args(), 1)?;
    let y = ctx.output(0)?;
    let g = g0(ctx)?;
    let gi = prims::sub(g, &prims::mul(&prims::exp(y)?, &g.sum_dim(&[d], true)?)?)?;
    Ok(vec![Some(to_dtype(gi, m.dtype)?)])
}

/// Reverse cumulative sum along `d`: `sum(g) - cumsum(g) + g`.
fn reverse_cumsum(g: &Tensor, d: i64) -> Result<Tensor> {
    prims::add(&prims::sub(&g.sum_dim(&[d], true)?, &g.cumsum(d)?)?, g)
}

/// `cumsum(input, dim, dtype)`: reverse cumulative sum of the gradient.
pub fn cumsum_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    if m.shape.is_empty() {
        return Ok(vec![Some(to_dtype(g0(ctx)?.clone(), m.dtype)?)]);
    }
    let d = int("cumsum", ctx.args(), 1)?;
    Ok(vec![Some(to_dtype(reverse_cumsum(g0(ctx)?, d)?, m.dtype)?)])
}

/// `cumprod(input, dim, dtype)`: `revcumsum(g * out) / x`; positions where `x == 0` use the
/// exact product of the other factors (O(n^2) over that dim, only when zeros are present).
pub fn cumprod_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let x = ctx.input(0)?;
    let g = g0(ctx)?;
    if m.shape.is_empty() {
        return Ok(vec![Some(to_dtype(g.clone(), m.dtype)?)]);
    }
    let d = wrap_dim("cumprod", int("cumprod", ctx.args(), 1)?, m.shape.len())?;
    let out = ctx.output(0)?;
    let xx = to_dtype(x.clone(), g.dtype())?;
    let has_zero = {
        let _ng = crate::autograd::no_grad();
        xx.to_vec_f64()?.contains(&0.0)
    };
    if !has_zero {
        let gi = prims::div(&reverse_cumsum(&prims::mul(g, out)?, d as i64)?, &xx)?;
        return Ok(vec![Some(to_dtype(gi, m.dtype)?)]);
    }
    // Exact: grad_i = sum_{j >= i} g_j * prod_{k <= j, k != i} x_k.
    let n = m.shape[d];
    let mut cols = Vec::with_capacity(n);
    for i in 0..n {
        let ones_at_i = {
            let mut s = xx.shape().to_vec();
            s[d] = 1;
            crate::ops::kernel::from_f64_vec(&vec![1.0; s.iter().product()], &s, xx.dtype())?
        };
        let mut parts = Vec::new();
        if i > 0 {
            parts.push(xx.narrow(d as i64, 0, i as i64)?);
        }
        parts.push(ones_at_i);
        if i + 1 < n {
            parts.push(xx.narrow(d as i64, i as i64 + 1, (n - i - 1) as i64)?);
        }
        let xi = crate::ops::join::cat(&parts, d as i64)?;
        let c = xi.cumprod(d as i64)?.narrow(d as i64, i as i64, (n - i) as i64)?;
        let gs = g.narrow(d as i64, i as i64, (n - i) as i64)?;
        cols.push(prims::mul(&c, &gs)?.sum_dim(&[d as i64], true)?);
    }
    Ok(vec![Some(to_dtype(crate::ops::join::cat(&cols, d as i64)?, m.dtype)?)])
}
