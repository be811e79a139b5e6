//! Backward formulas of joining, indexing, padding, shuffling, dropout and embedding, and the
//! helper ops `index_select_backward` (index_add into zeros) and `masked_select_backward`
//! (masked scatter into zeros), which are differentiable themselves.

use super::prims::{self, g0, one, shape_i64, zeros, Grads};
use crate::autograd::BackwardCtx;
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, wrap_dim};
use crate::op::args::{bool_, float, int, ints, opt_int, str_, tensor};
use crate::op::{cost_memory, ArgSpec, ArgType as T, Category, Effect, OpDef, Saves};
use crate::ops::kernel;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

fn zeros_like_meta(m: &TensorMeta) -> Result<Tensor> {
    zeros(&m.shape, m.dtype)
}

/// `cat(tensors, dim)`: narrow the gradient back into pieces.
pub fn cat_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let metas = ctx.input_list_metas(0)?;
    let g = g0(ctx)?;
    let dim = int("cat", ctx.args(), 1)?;
    let d = wrap_dim("cat", dim, g.ndim())?;
    let mut off = 0i64;
    let mut out = Vec::with_capacity(metas.len());
    for m in metas {
        if m.shape.len() == 1 && m.shape[0] == 0 && g.ndim() != 1 {
            out.push(Some(zeros_like_meta(m)?));
            continue;
        }
        let len = m.shape[d] as i64;
        out.push(Some(g.narrow(d as i64, off, len)?));
        off += len;
    }
    Ok(out)
}

/// `stack(tensors, dim)`: unbind the gradient.
pub fn stack_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let dim = int("stack", ctx.args(), 1)?;
    Ok(g0(ctx)?.unbind(dim)?.into_iter().map(Some).collect())
}

fn split_sizes(ctx: &BackwardCtx<'_>, len: usize) -> Result<Vec<usize>> {
    let op = ctx.op().name;
    let a = ctx.args();
    Ok(match op {
        "split" => {
            let s = int(op, a, 1)?.max(1) as usize;
            if len == 0 {
                vec![0]
            } else {
                (0..len.div_ceil(s)).map(|i| s.min(len - i * s)).collect()
            }
        }
        "chunk" => {
            let c = int(op, a, 1)?.max(1) as usize;
            let s = len.div_ceil(c).max(1);
            if len == 0 {
                vec![0]
            } else {
                (0..len.div_ceil(s)).map(|i| s.min(len - i * s)).collect()
            }
        }
        _ => ints(op, a, 1)?.iter().map(|&v| v.max(0) as usize).collect(),
    })
}

/// `split`, `split_with_sizes`, `chunk`: concatenate the pieces' gradients (zeros for unused
/// pieces).
pub fn split_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let m = ctx.input_meta(0)?;
    let d = wrap_dim(op, int(op, ctx.args(), 2)?, m.shape.len())?;
    let sizes = split_sizes(ctx, m.shape[d])?;
    let dtype = (0..sizes.len()).find_map(|i| ctx.grad(i).map(|g| g.dtype())).unwrap_or(m.dtype);
    let mut parts = Vec::with_capacity(sizes.len());
    for (i, &s) in sizes.iter().enumerate() {
        match ctx.grad(i) {
            Some(g) => parts.push(g.clone()),
            None => {
                let mut sh = m.shape.clone();
                sh[d] = s;
                parts.push(zeros(&sh, dtype)?);
            }
        }
    }
    Ok(vec![Some(crate::ops::join::cat(&parts, d as i64)?)])
}

/// `unbind(dim)`: stack the gradients (zeros for unused outputs).
pub fn unbind_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let d = wrap_dim("unbind", int("unbind", ctx.args(), 1)?, m.shape.len())?;
    let n = m.shape[d];
    let mut sh = m.shape.clone();
    sh.remove(d);
    let dtype = (0..n).find_map(|i| ctx.grad(i).map(|g| g.dtype())).unwrap_or(m.dtype);
    let parts: Vec<Tensor> =
        (0..n).map(|i| ctx.grad(i).cloned().map(Ok).unwrap_or_else(|| zeros(&sh, dtype))).collect::<Result<_>>()?;
    Ok(vec![Some(crate::ops::join::stack(&parts, d as i64)?)])
}

/// `gather(input, dim, index)`: scatter-add the gradient into zeros.
pub fn gather_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let dim = int("gather", ctx.args(), 1)?;
    let idx = ctx.input(2)?;
    let g = g0(ctx)?;
    Ok(vec![Some(zeros(&m.shape, g.dtype())?.scatter_add(dim, idx, g)?)])
}

/// `scatter(input, dim, index, src|value, reduce=None)`: the overwritten positions get no
/// gradient; `src` gets the gathered gradient.
pub fn scatter_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    if let Value::Str(r) = ctx.arg(4) {
        return Err(Error::autograd(op, format!("the derivative for '{op}' with reduce='{r}' is not implemented")));
    }
    let dim = int(op, ctx.args(), 1)?;
    let idx = ctx.input(2)?;
    let g = g0(ctx)?;
    let gi = if ctx.needs_grad(0) { Some(crate::ops::index::scatter_value(g, dim, idx, 0.0, None)?) } else { None };
    let gs = if ctx.is_tensor_arg(3) && ctx.needs_grad(3) { Some(g.gather(dim, idx)?) } else { None };
    Ok(vec![gi, None, None, gs])
}

/// `scatter_add(input, dim, index, src)`: identity for input, gather for src.
pub fn scatter_add_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let dim = int(ctx.op().name, ctx.args(), 1)?;
    let idx = ctx.input(2)?;
    let g = g0(ctx)?;
    let gs = if ctx.needs_grad(3) { Some(g.gather(dim, idx)?) } else { None };
    Ok(vec![Some(g.clone()), None, None, gs])
}

/// `index_copy(input, dim, index, source)` (IndexCopyBackward0): `input` gets the gradient with
/// the slices at `index` zeroed (an `index_copy` of zeros, differentiable), `source` the
/// gradient's slices at `index`.
pub fn index_copy_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let dim = int(op, ctx.args(), 1)?;
    let idx = ctx.input(2)?;
    let g = g0(ctx)?;
    let sm = ctx.input_meta(3)?;
    let gi = if ctx.needs_grad(0) {
        let z = zeros(&sm.shape, g.dtype())?;
        Some(g.index_copy(dim, idx, &z)?)
    } else {
        None
    };
    let gs = if ctx.needs_grad(3) {
        let s = if g.ndim() == 0 { g.clone() } else { g.index_select(dim, idx)? };
        Some(if s.shape() != &sm.shape[..] { s.reshape(&shape_i64(&sm.shape))? } else { s })
    } else {
        None
    };
    Ok(vec![gi, None, None, gs])
}

/// `index_put(input, indices, values, accumulate, positions)` (and `index_put_`), PyTorch's
/// formula: `input` gets `accumulate ? grad : grad.index_put(indices, 0)`, `values` gets
/// `grad.index(indices)` summed back to its shape (it was broadcast); the index tensors none.
pub fn index_put_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let op = ctx.op().name;
    let indices = ctx.input_list(1)?;
    let accumulate = bool_(op, ctx.args(), 3)?;
    let positions = ctx.arg(4).clone();
    let g = g0(ctx)?;
    let list = Value::Tensors(indices.to_vec());
    let gi = if ctx.needs_grad(0) {
        Some(if accumulate {
            g.clone()
        } else {
            let z = zeros(&[], g.dtype())?;
            one(
                &crate::ops::index_put::INDEX_PUT,
                &[g.into(), list.clone(), z.into(), Value::Bool(false), positions.clone()],
            )?
        })
    } else {
        None
    };
    let gv = if ctx.needs_grad(2) {
        let vm = ctx.input_meta(2)?;
        let s = one(&crate::ops::index_put::INDEX, &[g.into(), list, positions])?;
        Some(if s.shape() != &vm.shape[..] { s.sum_to_size(&shape_i64(&vm.shape))? } else { s })
    } else {
        None
    };
    let mut out = Vec::with_capacity(indices.len() + 2);
    out.push(gi);
    out.extend(std::iter::repeat_n(None, indices.len()));
    out.push(gv);
    Ok(out)
}

/// `index(input, indices, positions)`: PyTorch's `index_backward`, the gradient put with
/// `accumulate` into zeros of the input's shape (repeated positions sum).
pub fn index_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let indices = ctx.input_list(1)?;
    let g = g0(ctx)?;
    let z = zeros(&m.shape, g.dtype())?;
    let gi = one(
        &crate::ops::index_put::INDEX_PUT,
        &[z.into(), Value::Tensors(indices.to_vec()), g.into(), Value::Bool(true), ctx.arg(2).clone()],
    )?;
    Ok(vec![Some(gi)])
}

/// `index_select(input, dim, index)`: `index_select_backward`.
pub fn index_select_backward_formula(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let dim = int("index_select", ctx.args(), 1)?;
    let idx = ctx.input(2)?;
    Ok(vec![Some(index_select_backward(g0(ctx)?, &m.shape, dim, idx)?)])
}

/// `index_select_backward(grad, self_sizes, dim, index)` (zeros with `grad` index-added).
pub fn index_select_backward(g: &Tensor, sizes: &[usize], dim: i64, index: &Tensor) -> Result<Tensor> {
    one(&INDEX_SELECT_BACKWARD, &[g.into(), Value::Ints(shape_i64(sizes)), Value::Int(dim), index.into()])
}

/// `masked_fill(input, mask, value)`: zero where filled; a tensor value gets the sum there.
pub fn masked_fill_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let mask = ctx.input(1)?;
    let g = g0(ctx)?;
    let gi = if ctx.needs_grad(0) { Some(g.masked_fill(mask, 0.0)?.sum_to_size(&shape_i64(&m.shape))?) } else { None };
    let gv = if ctx.is_tensor_arg(2) && ctx.needs_grad(2) {
        let vm = ctx.input_meta(2)?;
        let s = prims::where_(mask, g, 0.0)?.sum()?;
        Some(s.reshape(&shape_i64(&vm.shape))?)
    } else {
        None
    };
    Ok(vec![gi, None, gv])
}

/// `masked_select(input, mask)`: `masked_select_backward`, summed to the input's shape.
pub fn masked_select_backward_formula(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let mask = ctx.input(1)?;
    let sizes = broadcast_shapes("masked_select", &m.shape, mask.shape())?;
    let g = one(&MASKED_SELECT_BACKWARD, &[g0(ctx)?.into(), mask.into(), Value::Ints(shape_i64(&sizes))])?;
    Ok(vec![Some(g.sum_to_size(&shape_i64(&m.shape))?)])
}

/// Source index along one padded dim for each output position.
fn pad_source(mode: &str, n: usize, l: i64, out_len: usize) -> Vec<i64> {
    let n = n as i64;
    (0..out_len as i64)
        .map(|o| {
            let i = o - l;
            match mode {
                "reflect" => {
                    let p = 2 * (n - 1).max(1);
                    let mut j = i.rem_euclid(p);
                    if j >= n {
                        j = p - j;
                    }
                    j
                }
                "replicate" => i.clamp(0, n - 1),
                _ => i.rem_euclid(n),
            }
        })
        .collect()
}

/// `pad(input, pad, mode, value)`: constant mode crops (or zero-pads for negative pads) the
/// gradient; reflect/replicate/circular index-add it back along each padded dim.
pub fn pad_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let a = ctx.args();
    let pads = ints("pad", a, 1)?.to_vec();
    let mode = str_("pad", a, 2).unwrap_or("constant");
    let nd = m.shape.len();
    let mut g = g0(ctx)?.clone();
    if mode == "constant" {
        if pads.iter().all(|&p| p >= 0) {
            for (k, pair) in pads.chunks(2).enumerate() {
                let d = nd - 1 - k;
                g = g.narrow(d as i64, pair[0], m.shape[d] as i64)?;
            }
        } else {
            let neg: Vec<i64> = pads.iter().map(|&p| -p).collect();
            g = crate::ops::shape_misc::pad(&g, &neg, "constant", Some(0.0))?;
        }
        return Ok(vec![Some(g)]);
    }
    for (k, pair) in pads.chunks(2).enumerate() {
        let d = nd - 1 - k;
        let n = m.shape[d];
        let out_len = g.shape()[d];
        let idx = Tensor::from_vec(pad_source(mode, n, pair[0], out_len), &[out_len])?;
        let mut sizes = g.shape().to_vec();
        sizes[d] = n;
        g = index_select_backward(&g, &sizes, d as i64, &idx)?;
    }
    Ok(vec![Some(g)])
}

/// `pixel_shuffle(r)`: `pixel_unshuffle(r)` of the gradient.
pub fn pixel_shuffle_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let r = int("pixel_shuffle", ctx.args(), 1)?;
    Ok(vec![Some(crate::ops::shape_misc::pixel_unshuffle(g0(ctx)?, r)?)])
}

/// `pixel_unshuffle(r)`: `pixel_shuffle(r)` of the gradient.
pub fn pixel_unshuffle_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let r = int("pixel_unshuffle", ctx.args(), 1)?;
    Ok(vec![Some(crate::ops::shape_misc::pixel_shuffle(g0(ctx)?, r)?)])
}

fn dropout_scale(p: f64) -> f64 {
    if p >= 1.0 {
        0.0
    } else {
        1.0 / (1.0 - p)
    }
}

/// `native_dropout(input, p, train)`: `g * mask / (1 - p)`.
pub fn native_dropout_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let p = float("native_dropout", ctx.args(), 1)?;
    let train = bool_("native_dropout", ctx.args(), 2).unwrap_or(true);
    let g = g0(ctx)?;
    if !train {
        return Ok(vec![Some(g.clone())]);
    }
    let mask = ctx.output(1)?;
    Ok(vec![Some(prims::scale(&prims::mul(g, mask)?, dropout_scale(p))?)])
}

/// `dropout(input, p, training)`: the keep mask is recovered from the output (`out != 0`);
/// elements where the input itself is 0 count as kept (their output is 0 either way). Use
/// `native_dropout` when the exact mask matters.
pub fn dropout_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let p = float("dropout", ctx.args(), 1)?;
    let train = bool_("dropout", ctx.args(), 2).unwrap_or(true);
    let g = g0(ctx)?;
    if !train || p == 0.0 {
        return Ok(vec![Some(g.clone())]);
    }
    let out = ctx.output(0)?;
    let x = ctx.input(0)?;
    let keep = prims::where_(&prims::eq(x, 0.0)?, true, &prims::ne(out, 0.0)?)?;
    Ok(vec![Some(prims::scale(&prims::mul(g, &keep)?, dropout_scale(p))?)])
}

/// `embedding(input, weight, padding_idx)`: rows index-added (the padding row gets none).
pub fn embedding_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let wm = ctx.input_meta(1)?;
    let idx = ctx.input(0)?;
    let pad = opt_int("embedding", ctx.args(), 2)?;
    let g = g0(ctx)?;
    let dim = *wm.shape.last().unwrap_or(&1) as i64;
    let g2 = g.reshape(&[-1, dim])?;
    let flat = idx.reshape(&[-1])?;
    let mut gw = index_select_backward(&g2, &wm.shape, 0, &flat)?;
    if let Some(p) = pad {
        let n = wm.shape[0];
        let p = if p < 0 { p + n as i64 } else { p };
        let mask: Vec<bool> = (0..n).map(|i| i as i64 == p).collect();
        gw = gw.masked_fill(&Tensor::from_vec(mask, &[n, 1])?, 0.0)?;
    }
    Ok(vec![None, Some(gw)])
}

// ---------------------------------------------------------------------------------------------
// helper ops

fn sizes_arg(op: &str, args: &[Value], i: usize) -> Result<Vec<usize>> {
    ints(op, args, i)?
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| Error::argument(op, format!("sizes must be non-negative, got {s}"))))
        .collect()
}

fn index_add_zeros(op: &str, g: &Tensor, sizes: &[usize], dim: i64, index: &Tensor) -> Result<Tensor> {
    let d = wrap_dim(op, dim, sizes.len().max(1))?;
    if sizes.is_empty() {
        return kernel::contiguous(&g.reshape(&[])?);
    }
    let idx = index.to_vec_f64()?;
    if index.ndim() > 1 {
        return Err(Error::shape(op, format!("index must be 0-D or 1-D, got shape {:?}", index.shape())));
    }
    let gs = g.shape();
    let mut expect = sizes.to_vec();
    expect[d] = idx.len();
    if gs.len() != sizes.len() || gs != &expect[..] {
        return Err(Error::shape(op, format!("grad has shape {gs:?}, expected {expect:?}")));
    }
    let outer: usize = sizes[..d].iter().product();
    let inner: usize = sizes[d + 1..].iter().product();
    let n = sizes[d];
    let gv = g.to_vec_f64()?;
    let mut out = vec![0.0f64; outer * n * inner];
    for (k, &iv) in idx.iter().enumerate() {
        let i = iv as i64;
        let i = if i < 0 { i + n as i64 } else { i };
        if i < 0 || i >= n as i64 {
            return Err(Error::index(op, format!("index {iv} is out of bounds for dimension {d} with size {n}")));
        }
        for o in 0..outer {
            let src = (o * idx.len() + k) * inner;
            let dst = (o * n + i as usize) * inner;
            for j in 0..inner {
                out[dst + j] += gv[src + j];
            }
        }
    }
    kernel::from_f64_vec(&out, sizes, g.dtype())
}

fn index_select_backward_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let dim = int("index_select_backward", ctx.args(), 2)?;
    let idx = ctx.input(3)?;
    Ok(vec![Some(g0(ctx)?.index_select(dim, idx)?)])
}

/// `index_select_backward(grad, self_sizes, dim, index)`: zeros of `self_sizes` with `grad`
/// added at `index` along `dim` (index_add).
pub static INDEX_SELECT_BACKWARD: OpDef = OpDef {
    name: "index_select_backward",
    schema: &[
        ArgSpec::req("grad", T::Tensor),
        ArgSpec::req("self_sizes", T::IntList),
        ArgSpec::req("dim", T::Int),
        ArgSpec::req("index", T::Tensor),
    ],
    meta: |args| {
        let g = tensor("index_select_backward", args, 0)?;
        Ok(smallvec![TensorMeta::contiguous(&sizes_arg("index_select_backward", args, 1)?, g.dtype())])
    },
    kernel: |args| {
        let op = "index_select_backward";
        let g = tensor(op, args, 0)?;
        Ok(smallvec![index_add_zeros(op, g, &sizes_arg(op, args, 1)?, int(op, args, 2)?, tensor(op, args, 3)?)?])
    },
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(index_select_backward_backward),
    saves: Saves::inputs(0b1000),
    doc: "Backward of index_select: zeros with the gradient index-added along dim.",
};

fn masked_select_backward_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let mask = ctx.input(1)?;
    Ok(vec![Some(g0(ctx)?.masked_select(mask)?)])
}

/// `masked_select_backward(grad, mask, sizes)`: zeros of `sizes` with `grad`'s elements
/// written, in order, where the (broadcast) mask is true.
pub static MASKED_SELECT_BACKWARD: OpDef = OpDef {
    name: "masked_select_backward",
    schema: &[ArgSpec::req("grad", T::Tensor), ArgSpec::req("mask", T::Tensor), ArgSpec::req("sizes", T::IntList)],
    meta: |args| {
        let g = tensor("masked_select_backward", args, 0)?;
        Ok(smallvec![TensorMeta::contiguous(&sizes_arg("masked_select_backward", args, 2)?, g.dtype())])
    },
    kernel: |args| {
        let op = "masked_select_backward";
        let g = tensor(op, args, 0)?;
        let mask = tensor(op, args, 1)?;
        let sizes = sizes_arg(op, args, 2)?;
        let m = kernel::contiguous(&mask.expand(&shape_i64(&sizes))?)?.to_vec_f64()?;
        let gv = g.to_vec_f64()?;
        let count = m.iter().filter(|&&v| v != 0.0).count();
        if count != gv.len() {
            return Err(Error::shape(op, format!("grad has {} elements but the mask selects {count}", gv.len())));
        }
        let mut it = gv.into_iter();
        let out: Vec<f64> = m.iter().map(|&v| if v != 0.0 { it.next().unwrap_or(0.0) } else { 0.0 }).collect();
        Ok(smallvec![kernel::from_f64_vec(&out, &sizes, g.dtype())?])
    },
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(masked_select_backward_backward),
    saves: Saves::inputs(0b10),
    doc: "Backward of masked_select: zeros with the gradient written where the mask is true.",
};
