//! Backward formulas of matrix products, convolutions, pooling and normalisation. Every
//! formula is written with differentiable ops (matmul, conv2d, conv_transpose2d, scatter_add,
//! elementwise arithmetic), so `create_graph` gives second-order gradients.

use super::prims::{self, g0, scale, shape_i64, zeros, Grads};
use crate::autograd::BackwardCtx;
use crate::error::{Error, Result};
use crate::op::args::{bool_, float, int, ints, opt_int, scalar};
use crate::ops::conv::{conv2d, conv_transpose2d};
use crate::tensor::Tensor;
use crate::value::Value;

// ---------------------------------------------------------------------------------------------
// matrix products

fn t_last(t: &Tensor) -> Result<Tensor> {
    t.transpose(-1, -2)
}

/// `mm(input, mat2)`.
pub fn mm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let ga = if ctx.needs_grad(0) { Some(g.mm(&ctx.input(1)?.t()?)?) } else { None };
    let gb = if ctx.needs_grad(1) { Some(ctx.input(0)?.t()?.mm(g)?) } else { None };
    Ok(vec![ga, gb])
}

/// `bmm(input, mat2)`.
pub fn bmm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let ga = if ctx.needs_grad(0) { Some(g.bmm(&t_last(ctx.input(1)?)?)?) } else { None };
    let gb = if ctx.needs_grad(1) { Some(t_last(ctx.input(0)?)?.bmm(g)?) } else { None };
    Ok(vec![ga, gb])
}

/// `matmul(input, other)` with 1-D operands and batch broadcasting.
pub fn matmul_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let (da, db) = (a.ndim(), b.ndim());
    if da == 1 && db == 1 {
        let ga = if ctx.needs_grad(0) { Some(prims::mul(b, g)?) } else { None };
        let gb = if ctx.needs_grad(1) { Some(prims::mul(a, g)?) } else { None };
        return Ok(vec![ga, gb]);
    }
    let a2 = if da == 1 { a.unsqueeze(0)? } else { a.clone() };
    let b2 = if db == 1 { b.unsqueeze(-1)? } else { b.clone() };
    let mut g2 = g.clone();
    if da == 1 {
        g2 = g2.unsqueeze(-2)?;
    }
    if db == 1 {
        g2 = g2.unsqueeze(-1)?;
    }
    let ga = if ctx.needs_grad(0) {
        let mut r = g2.matmul(&t_last(&b2)?)?;
        if r.shape() != a2.shape() {
            r = r.sum_to_size(&shape_i64(a2.shape()))?;
        }
        Some(if da == 1 { r.squeeze_dim(0)? } else { r })
    } else {
        None
    };
    let gb = if ctx.needs_grad(1) {
        let mut r = t_last(&a2)?.matmul(&g2)?;
        if r.shape() != b2.shape() {
            r = r.sum_to_size(&shape_i64(b2.shape()))?;
        }
        Some(if db == 1 { r.squeeze_dim(-1)? } else { r })
    } else {
        None
    };
    Ok(vec![ga, gb])
}

/// `addmm(input, mat1, mat2, beta, alpha)`.
pub fn addmm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let a = ctx.args();
    let beta = scalar("addmm", a, 3)?.to_f64();
    let alpha = scalar("addmm", a, 4)?.to_f64();
    let m = ctx.input_meta(0)?;
    let gi = if ctx.needs_grad(0) {
        let r = if g.shape() != &m.shape[..] { g.sum_to_size(&shape_i64(&m.shape))? } else { g.clone() };
        Some(scale(&r, beta)?)
    } else {
        None
    };
    let g1 = if ctx.needs_grad(1) { Some(scale(&g.mm(&ctx.input(2)?.t()?)?, alpha)?) } else { None };
    let g2 = if ctx.needs_grad(2) { Some(scale(&ctx.input(1)?.t()?.mm(g)?, alpha)?) } else { None };
    Ok(vec![gi, g1, g2])
}

/// `linear(input, weight, bias)`: `x W^T + b`.
pub fn linear_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let w = ctx.input(1)?;
    let gx = if ctx.needs_grad(0) { Some(if g.ndim() == 2 { g.mm(w)? } else { g.matmul(w)? }) } else { None };
    let out_f = w.shape()[0] as i64;
    let gw = if ctx.needs_grad(1) {
        let x = ctx.input(0)?;
        Some(if x.ndim() == 1 {
            g.unsqueeze(1)?.mm(&x.unsqueeze(0)?)?
        } else if x.ndim() == 2 {
            g.t()?.mm(x)?
        } else {
            let in_f = *x.shape().last().unwrap_or(&1) as i64;
            g.reshape(&[-1, out_f])?.t()?.mm(&x.reshape(&[-1, in_f])?)?
        })
    } else {
        None
    };
    let gb = if ctx.is_tensor_arg(2) && ctx.needs_grad(2) {
        let bm = ctx.input_meta(2)?;
        Some(if g.ndim() <= 1 { g.clone() } else { g.sum_to_size(&shape_i64(&bm.shape))? })
    } else {
        None
    };
    Ok(vec![gx, gw, gb])
}

// ---------------------------------------------------------------------------------------------
// convolutions (in 2-D form; conv1d lifts to 2-D)

fn expand2(v: &[i64], fill: i64) -> [i64; 2] {
    match v.len() {
        0 => [fill, fill],
        1 => [v[0], v[0]],
        _ => [v[0], v[1]],
    }
}

/// `sum_{n,oh,ow} inp[n, g*Ci + ci, oh*s + kh*d - p] * gr[n, g*Co + co, oh, ow]`, shaped
/// `[G*Co, Ci, k0, k1]`: the weight gradient of a convolution (input `inp`, output grad `gr`).
#[allow(clippy::too_many_arguments)]
fn conv_weight_grad(
    inp: &Tensor,
    gr: &Tensor,
    k: [i64; 2],
    s: [i64; 2],
    p: [i64; 2],
    d: [i64; 2],
    groups: i64,
) -> Result<Tensor> {
    let (n, ci_all) = (inp.shape()[0] as i64, inp.shape()[1] as i64);
    let co_all = gr.shape()[1] as i64;
    let ci = ci_all / groups;
    let co = co_all / groups;
    let (h, w) = (inp.shape()[2] as i64, inp.shape()[3] as i64);
    let (oh, ow) = (gr.shape()[2] as i64, gr.shape()[3] as i64);
    // input: [Ci, G*N, H, W]
    let x = inp.reshape(&[n, groups, ci, h, w])?.permute(&[2, 1, 0, 3, 4])?.reshape(&[ci, groups * n, h, w])?;
    // weight: [G*Co, N, OH, OW]
    let wt = gr.reshape(&[n, groups, co, oh, ow])?.permute(&[1, 2, 0, 3, 4])?.reshape(&[groups * co, n, oh, ow])?;
    let r = conv2d(&x, &wt, None, &[d[0], d[1]], &[p[0], p[1]][..], &[s[0], s[1]], groups)?; // [Ci, G*Co, K0', K1']
    let r = r.narrow(2, 0, k[0])?.narrow(3, 0, k[1])?;
    r.transpose(0, 1)
}

struct ConvArgs {
    s: [i64; 2],
    /// before/after padding per dim
    pb: [i64; 2],
    pa: [i64; 2],
    d: [i64; 2],
    groups: i64,
}

fn conv_args(ctx: &BackwardCtx<'_>, nd: usize, kshape: &[usize]) -> Result<ConvArgs> {
    let op = ctx.op().name;
    let a = ctx.args();
    let lift = |v: &[i64], fill: i64| -> [i64; 2] {
        if nd == 1 {
            [fill, *v.first().unwrap_or(&fill)]
        } else {
            expand2(v, fill)
        }
    };
    let s = lift(&ints(op, a, 3)?, 1);
    let d = lift(&ints(op, a, 5)?, 1);
    let groups = int(op, a, 6)?;
    let k: Vec<i64> = kshape.iter().map(|&v| v as i64).collect();
    let k2 = if nd == 1 { [1, k[0]] } else { [k[0], k[1]] };
    let (pb, pa) = match ctx.arg(4) {
        Value::Str(m) if m == "valid" => ([0, 0], [0, 0]),
        Value::Str(m) if m == "same" => {
            let tot = [d[0] * (k2[0] - 1), d[1] * (k2[1] - 1)];
            ([tot[0] / 2, tot[1] / 2], [tot[0] - tot[0] / 2, tot[1] - tot[1] / 2])
        }
        Value::Str(m) => return Err(Error::argument(op, format!("Invalid padding string: '{m}'"))),
        _ => {
            let p = lift(&ints(op, a, 4)?, 0);
            (p, p)
        }
    };
    Ok(ConvArgs { s, pb, pa, d, groups })
}

/// The bias gradient of a convolution: the output gradient summed over every dim but the
/// channels (dim 1 when batched, 0 when not).
fn conv_bias_grad(ctx: &BackwardCtx<'_>, gy: &Tensor, nd: usize) -> Result<Option<Tensor>> {
    if !(ctx.is_tensor_arg(2) && ctx.needs_grad(2)) {
        return Ok(None);
    }
    let channels = gy.ndim() - nd - 1;
    let dims: Vec<i64> = (0..gy.ndim() as i64).filter(|&d| d as usize != channels).collect();
    Ok(Some(gy.sum_dim(&dims, false)?))
}

/// `conv1d` / `conv2d(input, weight, bias, stride, padding, dilation, groups)`: grad input by a
/// transposed convolution, grad weight by a convolution of input and grad, grad bias by a sum.
///
/// Without `create_graph` (grad mode off during backward) the input and weight gradients come
/// from dedicated kernels instead: one GEMM plus col2im per image for the input, im2col plus
/// one GEMM per image (images split across threads) for the weight.
pub fn conv_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let nd = if ctx.op().name == "conv1d" { 1 } else { 2 };
    let g0t = g0(ctx)?;
    if !crate::autograd::is_grad_enabled() && (ctx.needs_grad(0) || ctx.needs_grad(1)) {
        // through the registry (`conv2d_backward`), so a tracer records the same kernels
        let (ni, nw) = (ctx.needs_grad(0), ctx.needs_grad(1));
        let op = if nd == 1 { &super::fused::CONV1D_BACKWARD } else { &super::fused::CONV2D_BACKWARD };
        let mut args = vec![Value::Tensor(g0t.clone()), Value::Bool(ni), Value::Bool(nw)];
        args.extend(ctx.args().iter().cloned());
        let mut out = super::fused::call(op, args)?.into_iter();
        let gx = if ni { out.next() } else { None };
        let gw = if nw { out.next() } else { None };
        return Ok(vec![gx, gw, conv_bias_grad(ctx, g0t, nd)?]);
    }
    let xm = ctx.input_meta(0)?;
    let wm = ctx.input_meta(1)?;
    let unbatched = xm.shape.len() == nd + 1;
    let ca = conv_args(ctx, nd, &wm.shape[2..])?;
    // Lift to batched 2-D.
    let lift = |t: &Tensor, is_batched_kind: bool| -> Result<Tensor> {
        let mut t = t.clone();
        if is_batched_kind && unbatched {
            t = t.unsqueeze(0)?;
        }
        if nd == 1 {
            t = t.unsqueeze(-2)?;
        }
        Ok(t)
    };
    let unlift = |t: Tensor, is_batched_kind: bool| -> Result<Tensor> {
        let mut t = t;
        if nd == 1 {
            t = t.squeeze_dim(-2)?;
        }
        if is_batched_kind && unbatched {
            t = t.squeeze_dim(0)?;
        }
        Ok(t)
    };
    let g = lift(g0t, true)?;
    let k = {
        let ws = &wm.shape[2..];
        if nd == 1 {
            [1, ws[0] as i64]
        } else {
            [ws[0] as i64, ws[1] as i64]
        }
    };
    let extra = [ca.pa[0] - ca.pb[0], ca.pa[1] - ca.pb[1]];
    let gx = if ctx.needs_grad(0) {
        let w = lift(ctx.input(1)?, false)?;
        let xs = {
            let mut s: Vec<i64> = xm.shape.iter().map(|&v| v as i64).collect();
            if unbatched {
                s.insert(0, 1);
            }
            if nd == 1 {
                s.insert(2, 1);
            }
            s
        };
        // grad w.r.t. the input padded by `extra` after (asymmetric 'same'), then cropped
        let (h, wd) = (xs[2] + extra[0], xs[3] + extra[1]);
        let (oh, ow) = (g.shape()[2] as i64, g.shape()[3] as i64);
        let full = |o: i64, i: usize| (o - 1) * ca.s[i] - 2 * ca.pb[i] + ca.d[i] * (k[i] - 1) + 1;
        let op = [h - full(oh, 0), wd - full(ow, 1)];
        let mut r = conv_transpose2d(&g, &w, None, &ca.s, &ca.pb, &op, ca.groups, &ca.d)?;
        if extra != [0, 0] {
            r = r.narrow(2, 0, xs[2])?.narrow(3, 0, xs[3])?;
        }
        Some(unlift(r, true)?)
    } else {
        None
    };
    let gw = if ctx.needs_grad(1) {
        let mut x = lift(ctx.input(0)?, true)?;
        if extra != [0, 0] {
            x = crate::ops::shape_misc::pad(&x, &[0, extra[1], 0, extra[0]], "constant", Some(0.0))?;
        }
        let r = conv_weight_grad(&x, &g, k, ca.s, ca.pb, ca.d, ca.groups)?;
        Some(if nd == 1 { r.squeeze_dim(-2)? } else { r })
    } else {
        None
    };
    Ok(vec![gx, gw, conv_bias_grad(ctx, g0t, nd)?])
}

/// `conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)`:
/// grad input by a convolution, grad weight by a convolution of grad and input.
pub fn conv_transpose2d_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = "conv_transpose2d";
    let a = ctx.args();
    let xm = ctx.input_meta(0)?;
    let wm = ctx.input_meta(1)?;
    let unbatched = xm.shape.len() == 3;
    let s = expand2(&ints(op, a, 3)?, 1);
    let p = expand2(&ints(op, a, 4)?, 0);
    let groups = int(op, a, 6)?;
    let d = expand2(&ints(op, a, 7)?, 1);
    let k = [wm.shape[2] as i64, wm.shape[3] as i64];
    let mut g = g0(ctx)?.clone();
    if unbatched {
        g = g.unsqueeze(0)?;
    }
    let gx = if ctx.needs_grad(0) {
        let r = conv2d(&g, ctx.input(1)?, None, &s, &p[..], &d, groups)?;
        Some(if unbatched { r.squeeze_dim(0)? } else { r })
    } else {
        None
    };
    let gw = if ctx.needs_grad(1) {
        let mut x = ctx.input(0)?.clone();
        if unbatched {
            x = x.unsqueeze(0)?;
        }
        Some(conv_weight_grad(&g, &x, k, s, p, d, groups)?)
    } else {
        None
    };
    let gb = if ctx.is_tensor_arg(2) && ctx.needs_grad(2) { Some(g.sum_dim(&[0, 2, 3], false)?) } else { None };
    Ok(vec![gx, gw, gb])
}

// ---------------------------------------------------------------------------------------------
// pooling

/// Scatter-adds `g` into zeros of the input's shape at the flat spatial `indices`.
fn scatter_spatial(in_shape: &[usize], nd: usize, g: &Tensor, indices: &Tensor) -> Result<Tensor> {
    let lead = &in_shape[..in_shape.len() - nd];
    let plane: usize = in_shape[in_shape.len() - nd..].iter().product();
    let mut zs: Vec<usize> = lead.to_vec();
    zs.push(plane);
    let mut gs: Vec<i64> = shape_i64(lead);
    gs.push(-1);
    let r = zeros(&zs, g.dtype())?.scatter_add(lead.len() as i64, &indices.reshape(&gs)?, &g.reshape(&gs)?)?;
    r.reshape(&shape_i64(in_shape))
}

/// `max_pool*_with_indices`, `adaptive_max_pool2d`: the gradient goes to the argmax.
pub fn max_pool_with_indices_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let nd = if ctx.op().name.contains("1d") { 1 } else { 2 };
    Ok(vec![Some(scatter_spatial(&m.shape, nd, g0(ctx)?, ctx.output(1)?)?)])
}

/// `max_pool1d` / `max_pool2d`: recompute the argmax (no grad), then as with indices; without
/// `create_graph`, one fused kernel (`ops::pool::max_pool_grad_input`).
pub fn max_pool_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let a = ctx.args();
    let x = ctx.input(0)?;
    let nd = if op.contains("1d") { 1 } else { 2 };
    if !crate::autograd::is_grad_enabled() {
        // one pass: each output's gradient added at its argmax
        let fused = if nd == 1 { &super::fused::MAX_POOL1D_BACKWARD } else { &super::fused::MAX_POOL2D_BACKWARD };
        let mut args = vec![Value::Tensor(g0(ctx)?.clone())];
        args.extend(a.iter().cloned());
        let gx = super::fused::call(fused, args)?.pop();
        return Ok(vec![gx]);
    }
    let idx = {
        let _ng = crate::autograd::no_grad();
        let (k, s, p, d, c) = (ints(op, a, 1)?, ints(op, a, 2)?, ints(op, a, 3)?, ints(op, a, 4)?, bool_(op, a, 5)?);
        if nd == 1 {
            crate::ops::pool::max_pool1d_with_indices(x, &k, &s, &p, &d, c)?.1
        } else {
            crate::ops::pool::max_pool2d_with_indices(x, &k, &s, &p, &d, c)?.1
        }
    };
    Ok(vec![Some(scatter_spatial(x.shape(), nd, g0(ctx)?, &idx)?)])
}

/// PyTorch's `pooling_output_shape`.
fn pool_out(input: i64, k: i64, pad: i64, s: i64, ceil: bool) -> i64 {
    let num = input + 2 * pad - (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut o = num.div_euclid(s) + 1;
    if ceil && (o - 1) * s >= input + pad {
        o -= 1;
    }
    o
}

/// `avg_pool1d` / `avg_pool2d`: the gradient divided by each window's divisor, spread over
/// the window with a transposed convolution of ones.
pub fn avg_pool_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let a = ctx.args();
    let m = ctx.input_meta(0)?;
    let nd = if op == "avg_pool1d" { 1 } else { 2 };
    let lift = |v: &[i64], fill: i64| -> [i64; 2] {
        if nd == 1 {
            [fill, *v.first().unwrap_or(&fill)]
        } else {
            expand2(v, fill)
        }
    };
    let k = lift(&ints(op, a, 1)?, 1);
    let sv = ints(op, a, 2)?;
    let s = if sv.is_empty() { k } else { lift(&sv, 1) };
    let p = lift(&ints(op, a, 3)?, 0);
    let ceil = bool_(op, a, 4)?;
    let cip = bool_(op, a, 5)?;
    let div_override = if nd == 2 { opt_int(op, a, 6)? } else { None };
    let sp = &m.shape[m.shape.len() - nd..];
    let (h, w) = if nd == 1 { (1i64, sp[0] as i64) } else { (sp[0] as i64, sp[1] as i64) };
    let (oh, ow) = (pool_out(h, k[0], p[0], s[0], ceil), pool_out(w, k[1], p[1], s[1], ceil));
    // divisors
    let mut dv = Vec::with_capacity((oh * ow) as usize);
    for i in 0..oh {
        for j in 0..ow {
            let (mut hs, mut ws) = (i * s[0] - p[0], j * s[1] - p[1]);
            let (mut he, mut we) = ((hs + k[0]).min(h + p[0]), (ws + k[1]).min(w + p[1]));
            let pool = (he - hs) * (we - ws);
            hs = hs.max(0);
            ws = ws.max(0);
            he = he.min(h);
            we = we.min(w);
            let dvv = match div_override {
                Some(d) => d,
                None if cip => pool,
                None => (he - hs) * (we - ws),
            };
            dv.push(if hs >= he || ws >= we { f64::INFINITY } else { dvv as f64 });
        }
    }
    let g = g0(ctx)?;
    let dvt = crate::ops::kernel::from_f64_vec(&dv, &[oh as usize, ow as usize], g.dtype())?;
    let planes: usize = m.shape[..m.shape.len() - nd].iter().product();
    let g4 = g.reshape(&[planes as i64, 1, oh, ow])?;
    let g4 = prims::div(&g4, &dvt)?;
    let ones = crate::ops::kernel::from_f64_vec(
        &vec![1.0; (k[0] * k[1]) as usize],
        &[1, 1, k[0] as usize, k[1] as usize],
        g.dtype(),
    )?;
    let full = [(oh - 1) * s[0] - 2 * p[0] + k[0], (ow - 1) * s[1] - 2 * p[1] + k[1]];
    let opad = [(h - full[0]).max(0), (w - full[1]).max(0)];
    let mut r = conv_transpose2d(&g4, &ones, None, &s, &p, &opad, 1, &[1, 1])?;
    if r.shape()[2] as i64 != h || r.shape()[3] as i64 != w {
        r = r.narrow(2, 0, h)?.narrow(3, 0, w)?;
    }
    Ok(vec![Some(r.reshape(&shape_i64(&m.shape))?)])
}

fn adaptive_matrix(out: usize, input: usize, dtype: crate::DType) -> Result<(Tensor, Vec<f64>)> {
    let mut v = vec![0.0; out * input];
    let mut counts = Vec::with_capacity(out);
    for o in 0..out {
        let s = (o * input) / out;
        let e = ((o + 1) * input).div_ceil(out);
        for i in s..e {
            v[o * input + i] = 1.0;
        }
        counts.push((e - s) as f64);
    }
    Ok((crate::ops::kernel::from_f64_vec(&v, &[out, input], dtype)?, counts))
}

/// `adaptive_avg_pool2d(output_size)`: `A_h^T (g / counts) A_w` with 0/1 window matrices.
pub fn adaptive_avg_pool2d_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let g = g0(ctx)?;
    let n = m.shape.len();
    let (h, w) = (m.shape[n - 2], m.shape[n - 1]);
    let (oh, ow) = (g.shape()[n - 2], g.shape()[n - 1]);
    let (ah, ch) = adaptive_matrix(oh, h, g.dtype())?;
    let (aw, cw) = adaptive_matrix(ow, w, g.dtype())?;
    let cnt: Vec<f64> = ch.iter().flat_map(|a| cw.iter().map(move |b| a * b)).collect();
    let cnt = crate::ops::kernel::from_f64_vec(&cnt, &[oh, ow], g.dtype())?;
    let r = ah.t()?.matmul(&prims::div(g, &cnt)?)?.matmul(&aw)?;
    Ok(vec![Some(r)])
}

// ---------------------------------------------------------------------------------------------
// normalisation

/// Shared core: `rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat))` over `dims`.
fn norm_input_grad(gxhat: &Tensor, xhat: &Tensor, rstd: &Tensor, dims: &[i64]) -> Result<Tensor> {
    let m1 = gxhat.mean_dim(dims, true)?;
    let m2 = prims::mul(gxhat, xhat)?.mean_dim(dims, true)?;
    let inner = prims::sub(&prims::sub(gxhat, &m1)?, &prims::mul(xhat, &m2)?)?;
    prims::mul(&inner, rstd)
}

/// `(xhat, rstd)` of `x` normalised over `dims` (biased variance).
fn normalize(x: &Tensor, dims: &[i64], eps: f64) -> Result<(Tensor, Tensor)> {
    let mean = x.mean_dim(dims, true)?;
    let xc = prims::sub(x, &mean)?;
    let var = prims::mul(&xc, &xc)?.mean_dim(dims, true)?;
    let rstd = prims::rsqrt(&prims::add(&var, eps)?)?;
    Ok((prims::mul(&xc, &rstd)?, rstd))
}

/// `layer_norm(input, normalized_shape, weight, bias, eps)`.
pub fn layer_norm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let a = ctx.args();
    let x = ctx.input(0)?;
    let k = ints("layer_norm", a, 1)?.len();
    let eps = float("layer_norm", a, 4)?;
    let n = x.ndim();
    let dims: Vec<i64> = (n - k..n).map(|d| d as i64).collect();
    let g = g0(ctx)?;
    let (xhat, rstd) = normalize(x, &dims, eps)?;
    let has_w = ctx.is_tensor_arg(2);
    let gxhat = if has_w { prims::mul(g, ctx.input(2)?)? } else { g.clone() };
    let gx = if ctx.needs_grad(0) { Some(norm_input_grad(&gxhat, &xhat, &rstd, &dims)?) } else { None };
    let gw = if has_w && ctx.needs_grad(2) {
        Some(prims::mul(g, &xhat)?.sum_to_size(&shape_i64(&ctx.input_meta(2)?.shape))?)
    } else {
        None
    };
    let gb = if ctx.is_tensor_arg(3) && ctx.needs_grad(3) {
        Some(g.sum_to_size(&shape_i64(&ctx.input_meta(3)?.shape))?)
    } else {
        None
    };
    Ok(vec![gx, None, gw, gb])
}

fn channel_shape(n: usize, c: usize) -> Vec<i64> {
    let mut s = vec![1i64; n];
    if n > 1 {
        s[1] = c as i64;
    }
    s
}

/// `batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)`.
pub fn batch_norm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let a = ctx.args();
    let x = ctx.input(0)?;
    let training = bool_("batch_norm", a, 5)?;
    let eps = float("batch_norm", a, 7)?;
    let n = x.ndim();
    let c = x.shape()[1];
    let cs = channel_shape(n, c);
    let dims: Vec<i64> = (0..n as i64).filter(|&d| d != 1).collect();
    let g = g0(ctx)?;
    let has_w = ctx.is_tensor_arg(3);
    let w = if has_w { Some(ctx.input(3)?.reshape(&cs)?) } else { None };
    let use_batch = training || !ctx.is_tensor_arg(1) || !ctx.is_tensor_arg(2);
    let gb_wanted = ctx.is_tensor_arg(4) && ctx.needs_grad(4);
    if use_batch && !crate::autograd::is_grad_enabled() {
        // one fused kernel (no graph of the backward pass to record)
        // through the registry (`batch_norm_backward`), so a tracer records the same kernel
        let (ni, nw, nb) = (ctx.needs_grad(0), has_w && ctx.needs_grad(3), gb_wanted);
        if !(ni || nw || nb) {
            return Ok(vec![None; 5]);
        }
        let w = if has_w { Value::Tensor(ctx.input(3)?.clone()) } else { Value::None };
        let args = vec![
            Value::Tensor(g.clone()),
            Value::Bool(ni),
            Value::Bool(nw),
            Value::Bool(nb),
            Value::Tensor(x.clone()),
            w,
            Value::Float(eps),
        ];
        let mut out = super::fused::call(&super::fused::BATCH_NORM_BACKWARD, args)?.into_iter();
        let gx = if ni { out.next() } else { None };
        let gw = if nw { out.next() } else { None };
        let gb = if nb { out.next() } else { None };
        return Ok(vec![gx, None, None, gw, gb]);
    }
    let (xhat, rstd) = if use_batch {
        normalize(x, &dims, eps)?
    } else {
        let rm = ctx.input(1)?.reshape(&cs)?;
        let rv = ctx.input(2)?.reshape(&cs)?;
        let rstd = prims::rsqrt(&prims::add(&rv, eps)?)?;
        (prims::mul(&prims::sub(x, &rm)?, &rstd)?, rstd)
    };
    let gxhat = match &w {
        Some(w) => prims::mul(g, w)?,
        None => g.clone(),
    };
    let gx = if ctx.needs_grad(0) {
        Some(if use_batch { norm_input_grad(&gxhat, &xhat, &rstd, &dims)? } else { prims::mul(&gxhat, &rstd)? })
    } else {
        None
    };
    let gw = if has_w && ctx.needs_grad(3) { Some(prims::mul(g, &xhat)?.sum_dim(&dims, false)?) } else { None };
    let gb = if gb_wanted { Some(g.sum_dim(&dims, false)?) } else { None };
    Ok(vec![gx, None, None, gw, gb])
}

/// `group_norm(input, num_groups, weight, bias, eps)`.
pub fn group_norm_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let a = ctx.args();
    let x = ctx.input(0)?;
    let groups = int("group_norm", a, 1)?;
    let eps = float("group_norm", a, 4)?;
    let shape = shape_i64(x.shape());
    let (nb, c) = (x.shape()[0] as i64, x.shape()[1]);
    let cs = channel_shape(x.ndim(), c);
    let g = g0(ctx)?;
    let xr = x.reshape(&[nb, groups, -1])?;
    let (xhat_r, rstd) = normalize(&xr, &[2], eps)?;
    let xhat = xhat_r.reshape(&shape)?;
    let has_w = ctx.is_tensor_arg(2);
    let gxhat = if has_w { prims::mul(g, &ctx.input(2)?.reshape(&cs)?)? } else { g.clone() };
    let gx = if ctx.needs_grad(0) {
        let r = norm_input_grad(&gxhat.reshape(&[nb, groups, -1])?, &xhat_r, &rstd, &[2])?;
        Some(r.reshape(&shape)?)
    } else {
        None
    };
    let dims: Vec<i64> = (0..x.ndim() as i64).filter(|&d| d != 1).collect();
    let gw = if has_w && ctx.needs_grad(2) { Some(prims::mul(g, &xhat)?.sum_dim(&dims, false)?) } else { None };
    let gb = if ctx.is_tensor_arg(3) && ctx.needs_grad(3) { Some(g.sum_dim(&dims, false)?) } else { None };
    Ok(vec![gx, None, gw, gb])
}
