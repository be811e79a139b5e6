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
