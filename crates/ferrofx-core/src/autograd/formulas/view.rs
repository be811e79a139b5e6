//! Backward formulas of the view family (`ops/view.rs`), and the ATen helper ops
//! `slice_backward` / `select_backward` (zeros with the gradient written into a slice), which
//! are differentiable themselves (their backward is `slice` / `select`).

use crate::autograd::BackwardCtx;
use crate::error::{Error, Result};
use crate::layout::{wrap_dim, Layout};
use crate::op::args::{int, ints, opt_int, tensor};
use crate::op::{cost_memory, dispatch, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, OpDef, Saves};
use crate::ops::kernel;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

type Grads = Result<Vec<Option<Tensor>>>;

fn g0<'a>(ctx: &'a BackwardCtx<'_>) -> Result<&'a Tensor> {
    ctx.grad(0).ok_or_else(|| Error::autograd(ctx.op().name, "missing output gradient"))
}

fn shape_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// `view`, `reshape`, `flatten`, `squeeze`: reshape the gradient back to the input's shape.
pub fn reshape_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let shape = shape_i64(&ctx.input_meta(0)?.shape);
    Ok(vec![Some(g0(ctx)?.reshape(&shape)?)])
}

/// `transpose(dim0, dim1)`: transpose back.
pub fn transpose_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let (a, b) = (int("transpose", ctx.args(), 1)?, int("transpose", ctx.args(), 2)?);
    Ok(vec![Some(g0(ctx)?.transpose(a, b)?)])
}

/// `t()`: transpose back.
pub fn t_backward(ctx: &BackwardCtx<'_>) -> Grads {
    Ok(vec![Some(g0(ctx)?.t()?)])
}

/// `permute(dims)`: permute by the inverse permutation.
pub fn permute_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let dims = ints("permute", ctx.args(), 1)?;
    let n = dims.len();
    let mut inv = vec![0i64; n];
    for (i, &d) in dims.iter().enumerate() {
        inv[wrap_dim("permute", d, n)?] = i as i64;
    }
    Ok(vec![Some(g0(ctx)?.permute(&inv)?)])
}

fn slice_backward_call(
    g: &Tensor,
    sizes: &[usize],
    dim: i64,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> Result<Tensor> {
    let args =
        [Value::from(g), Value::Ints(shape_i64(sizes)), Value::Int(dim), start.into(), end.into(), Value::Int(step)];
    let mut out = dispatch(&SLICE_BACKWARD, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema("slice_backward", "op returned no output"))
}

/// `narrow(dim, start, length)`: the gradient written into zeros at the slice.
pub fn narrow_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let a = ctx.args();
    let dim = int("narrow", a, 1)?;
    let d = wrap_dim("narrow", dim, m.shape.len())?;
    let mut start = int("narrow", a, 2)?;
    if start < 0 {
        start += m.shape[d] as i64;
    }
    let len = int("narrow", a, 3)?;
    Ok(vec![Some(slice_backward_call(g0(ctx)?, &m.shape, dim, Some(start), Some(start + len), 1)?)])
}

/// `slice(dim, start, end, step)`: `slice_backward`.
pub fn slice_backward_formula(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let a = ctx.args();
    let g = slice_backward_call(
        g0(ctx)?,
        &m.shape,
        int("slice", a, 1)?,
        opt_int("slice", a, 2)?,
        opt_int("slice", a, 3)?,
        int("slice", a, 4)?,
    )?;
    Ok(vec![Some(g)])
}

/// `select(dim, index)`: `select_backward`.
pub fn select_backward_formula(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    let a = ctx.args();
    let args = [
        Value::from(g0(ctx)?),
        Value::Ints(shape_i64(&m.shape)),
        Value::Int(int("select", a, 1)?),
        Value::Int(int("select", a, 2)?),
    ];
    let mut out = dispatch(&SELECT_BACKWARD, CallKind::Function, &args)?;
    Ok(vec![out.pop()])
}

/// `expand(size)`: sum the gradient back to the input's shape (`sum_to_size`).
pub fn expand_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let shape = &ctx.input_meta(0)?.shape;
    let g = g0(ctx)?;
    if g.shape() == &shape[..] {
        return Ok(vec![Some(g.clone())]);
    }
    let mut out = crate::op::call("sum_to_size", vec![g.into(), Value::Ints(shape_i64(shape))], vec![])?;
    Ok(vec![out.pop()])
}

/// `unsqueeze(dim)`: squeeze that dim.
pub fn unsqueeze_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let dim = int("unsqueeze", ctx.args(), 1)?;
    Ok(vec![Some(g0(ctx)?.squeeze_dim(dim)?)])
}

/// `contiguous`: the gradient itself.
pub fn identity_backward(ctx: &BackwardCtx<'_>) -> Grads {
    Ok(vec![Some(g0(ctx)?.clone())])
}

/// `to(dtype)`: convert the gradient back to the input's dtype.
pub fn to_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let d = ctx.input_meta(0)?.dtype;
    Ok(vec![Some(g0(ctx)?.to_dtype(d)?)])
}

fn usize_sizes(op: &str, v: &[i64]) -> Result<Vec<usize>> {
    v.iter()
        .map(|&s| {
            usize::try_from(s).map_err(|_| Error::argument(op, format!("input_sizes must be non-negative, got {v:?}")))
        })
        .collect()
}

fn scatter_into_zeros(
    op: &str,
    g: &Tensor,
    sizes: &[usize],
    view: impl Fn(&Layout) -> Result<Layout>,
) -> Result<Tensor> {
    let out = kernel::zeros(sizes, g.dtype())?;
    let l = view(&Layout::contiguous(sizes))?;
    if l.shape() != g.shape() {
        return Err(Error::shape(
            op,
            format!("grad_output has shape {:?}, but the slice of {sizes:?} has shape {:?}", g.shape(), l.shape()),
        ));
    }
    let v = out.view_with_layout(op, l)?;
    kernel::copy_into(op, &v, g)?;
    Ok(out)
}

fn slice_backward_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let a = ctx.args();
    let gg = g0(ctx)?;
    Ok(vec![Some(gg.slice(
        int("slice_backward", a, 2)?,
        opt_int("slice_backward", a, 3)?,
        opt_int("slice_backward", a, 4)?,
        int("slice_backward", a, 5)?,
    )?)])
}

fn select_backward_backward(ctx: &BackwardCtx<'_>) -> Grads {
    let a = ctx.args();
    Ok(vec![Some(g0(ctx)?.select(int("select_backward", a, 2)?, int("select_backward", a, 3)?)?)])
}

/// `slice_backward(grad_output, input_sizes, dim, start, end, step)`: zeros of `input_sizes`
/// with `grad_output` written at `[start:end:step]` along `dim`.
pub static SLICE_BACKWARD: OpDef = OpDef {
    name: "slice_backward",
    schema: &[
        ArgSpec::req("grad_output", T::Tensor),
        ArgSpec::req("input_sizes", T::IntList),
        ArgSpec::req("dim", T::Int),
        ArgSpec::opt("start", T::OptInt, D::None),
        ArgSpec::opt("end", T::OptInt, D::None),
        ArgSpec::opt("step", T::Int, D::Int(1)),
    ],
    meta: |args| {
        let g = tensor("slice_backward", args, 0)?;
        let sizes = usize_sizes("slice_backward", &ints("slice_backward", args, 1)?)?;
        Ok(smallvec![TensorMeta::contiguous(&sizes, g.dtype())])
    },
    kernel: |args| {
        let op = "slice_backward";
        let g = tensor(op, args, 0)?;
        let sizes = usize_sizes(op, &ints(op, args, 1)?)?;
        let (dim, s, e, st) = (int(op, args, 2)?, opt_int(op, args, 3)?, opt_int(op, args, 4)?, int(op, args, 5)?);
        Ok(smallvec![scatter_into_zeros(op, g, &sizes, |l| l.slice(op, dim, s, e, st))?])
    },
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(slice_backward_backward),
    saves: Saves::NOTHING,
    doc: "Backward of slice: zeros with the gradient written into the slice.",
};

/// `select_backward(grad_output, input_sizes, dim, index)`: zeros of `input_sizes` with
/// `grad_output` written at `index` along `dim`.
pub static SELECT_BACKWARD: OpDef = OpDef {
    name: "select_backward",
    schema: &[
        ArgSpec::req("grad_output", T::Tensor),
        ArgSpec::req("input_sizes", T::IntList),
        ArgSpec::req("dim", T::Int),
        ArgSpec::req("index", T::Int),
    ],
    meta: |args| {
        let g = tensor("select_backward", args, 0)?;
        let sizes = usize_sizes("select_backward", &ints("select_backward", args, 1)?)?;
        Ok(smallvec![TensorMeta::contiguous(&sizes, g.dtype())])
    },
    kernel: |args| {
        let op = "select_backward";
        let g = tensor(op, args, 0)?;
        let sizes = usize_sizes(op, &ints(op, args, 1)?)?;
        let (dim, index) = (int(op, args, 2)?, int(op, args, 3)?);
        Ok(smallvec![scatter_into_zeros(op, g, &sizes, |l| l.select(op, dim, index))?])
    },
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(select_backward_backward),
    saves: Saves::NOTHING,
    doc: "Backward of select: zeros with the gradient written at the index.",
};
