//! Reductions, arg-reductions, scans, sorting and softmax-family ONNX ops.

use super::elementwise::cast;
use super::shape::flip;
use super::{call, call_all, v, Convert, Node};
use ferrofx_core::{Result, Tensor, Value};

/// The reduction axes (attribute before the op's input-axes opset, input after), normalised;
/// `None` means "reduce nothing" (`noop_with_empty_axes`).
fn reduce_axes(n: &Node<'_>, input_from: i64) -> Result<Option<Vec<usize>>> {
    let x = n.x(0)?;
    let r = x.ndim();
    let axes =
        if n.opset >= input_from { n.opt(1).map(|t| n.const_ints(t, "axes")).transpose()? } else { n.ints("axes") };
    let axes = axes.unwrap_or_default();
    if axes.is_empty() {
        if n.i("noop_with_empty_axes", 0) != 0 {
            return Ok(None);
        }
        return Ok(Some((0..r).collect()));
    }
    let mut out: Vec<usize> = axes.iter().map(|&a| n.axis(a, r)).collect::<Result<_>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(Some(out))
}

fn keep(n: &Node<'_>) -> bool {
    n.i("keepdims", 1) != 0
}

fn dims(axes: &[usize]) -> Value {
    Value::Ints(axes.iter().map(|&a| a as i64).collect())
}

/// Applies a `(input, dim list, keepdim)` reduction; for rank-0 inputs, the identity.
fn reduce_with(n: &Node<'_>, x: &Tensor, op: &str, input_from: i64) -> Result<Tensor> {
    let Some(axes) = reduce_axes(n, input_from)? else { return Ok(x.clone()) };
    if x.ndim() == 0 {
        return Ok(x.clone());
    }
    let out = call(op, vec![v(x), dims(&axes), Value::Bool(keep(n))])?;
    // Integer sums promote to int64 in PyTorch; ONNX keeps the input type.
    cast(&out, x.dtype())
}

fn reduce(n: &Node<'_>, op: &str, input_from: i64) -> Result<Vec<Tensor>> {
    Ok(vec![reduce_with(n, n.x(0)?, op, input_from)?])
}

fn reduce_prod(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let Some(axes) = reduce_axes(n, 18)? else { return Ok(vec![x.clone()]) };
    let mut y = x.clone();
    for &a in axes.iter().rev() {
        y = call("prod", vec![v(&y), Value::Int(a as i64), Value::Bool(true)])?;
    }
    if !keep(n) {
        let shape: Vec<i64> =
            y.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d as i64).collect();
        y = call("reshape", vec![v(&y), Value::Ints(shape)])?;
    }
    Ok(vec![cast(&y, x.dtype())?])
}

fn reduce_l1(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let a = call("abs", vec![v(n.x(0)?)])?;
    Ok(vec![reduce_with(n, &a, "sum", 18)?])
}

fn reduce_sum_square(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let sq = call("mul", vec![v(x), v(x)])?;
    Ok(vec![reduce_with(n, &sq, "sum", 18)?])
}

fn reduce_l2(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let s = reduce_sum_square(n)?.remove(0);
    Ok(vec![cast(&call("sqrt", vec![v(&s)])?, x.dtype())?])
}

fn reduce_log_sum(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let s = reduce(n, "sum", 18)?.remove(0);
    Ok(vec![call("log", vec![v(&s)])?])
}

fn reduce_log_sum_exp(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let Some(axes) = reduce_axes(n, 18)? else { return Ok(vec![x.clone()]) };
    Ok(vec![call("logsumexp", vec![v(x), dims(&axes), Value::Bool(keep(n))])?])
}

fn arg(n: &Node<'_>, op: &str) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axis = n.dim_axis(n.i("axis", 0), x.ndim())?;
    let keepdim = Value::Bool(keep(n));
    if n.i("select_last_index", 0) != 0 {
        let d = x.shape()[axis] as i64;
        let i = call(op, vec![v(&flip(x, axis)?), Value::Int(axis as i64), keepdim])?;
        return Ok(vec![call("rsub", vec![v(&i), Value::Int(d - 1)])?]);
    }
    Ok(vec![call(op, vec![v(x), Value::Int(axis as i64), keepdim])?])
}

/// Softmax-family axis handling: opset < 13 coerces the input to 2-D at `axis` (default 1).
fn softmax_like(n: &Node<'_>, op: &str) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    if n.opset >= 13 {
        let axis = n.axis(n.i("axis", -1), x.ndim())?;
        return Ok(vec![call(op, vec![v(x), Value::Int(axis as i64)])?]);
    }
    let axis = n.axis(n.i("axis", 1), x.ndim())?;
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis..].iter().product();
    let flat = call("reshape", vec![v(x), Value::Ints(vec![outer as i64, inner as i64])])?;
    let y = call(op, vec![v(&flat), Value::Int(1)])?;
    let shape: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
    Ok(vec![call("reshape", vec![v(&y), Value::Ints(shape)])?])
}

fn hardmax(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let (xx, axis, shape) = if n.opset >= 13 {
        (x.clone(), n.dim_axis(n.i("axis", -1), x.ndim())?, None)
    } else {
        let axis = n.axis(n.i("axis", 1), x.ndim())?;
        let outer: usize = x.shape()[..axis].iter().product();
        let inner: usize = x.shape()[axis..].iter().product();
        let flat = call("reshape", vec![v(x), Value::Ints(vec![outer as i64, inner as i64])])?;
        (flat, 1, Some(x.shape().iter().map(|&d| d as i64).collect::<Vec<_>>()))
    };
    let d = xx.shape()[axis] as i64;
    let idx = call("argmax", vec![v(&xx), Value::Int(axis as i64), Value::Bool(true)])?;
    let mut rshape = vec![1i64; xx.ndim()];
    rshape[axis] = d;
    let range = super::i64_tensor(&(0..d).collect::<Vec<_>>())?;
    let range = call("reshape", vec![v(&range), Value::Ints(rshape)])?;
    let hot = cast(&call("eq", vec![v(&idx), v(&range)])?, x.dtype())?;
    Ok(vec![match shape {
        Some(s) => call("reshape", vec![v(&hot), Value::Ints(s)])?,
        None => hot,
    }])
}

fn cumsum(n: &Node<'_>) -> Result<Vec<Tensor>> {
    scan(n, "cumsum", "zeros_like")
}

fn cumprod(n: &Node<'_>) -> Result<Vec<Tensor>> {
    scan(n, "cumprod", "ones_like")
}

/// A cumulative op along the node's axis, with ONNX's `reverse` and `exclusive` (shift by one,
/// starting from the op's identity element made by `identity_like`).
fn scan(n: &Node<'_>, op: &str, identity_like: &str) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axis = n.dim_axis(n.const_ints(n.x(1)?, "axis")?[0], x.ndim())?;
    let reverse = n.i("reverse", 0) != 0;
    let exclusive = n.i("exclusive", 0) != 0;
    let xx = if reverse { flip(x, axis)? } else { x.clone() };
    let mut y = cast(&call(op, vec![v(&xx), Value::Int(axis as i64)])?, x.dtype())?;
    if exclusive {
        // Shift by one along the axis: zero first, then the sums without the last.
        let d = xx.shape()[axis] as i64;
        let zeros = call(
            identity_like,
            vec![v(&call("slice", vec![v(&y), Value::Int(axis as i64), Value::Int(0), Value::Int(1), Value::Int(1)])?)],
        )?;
        let head = call(
            "slice",
            vec![v(&y), Value::Int(axis as i64), Value::Int(0), Value::Int((d - 1).max(0)), Value::Int(1)],
        )?;
        y = call("cat", vec![Value::Tensors(vec![zeros, head]), Value::Int(axis as i64)])?;
    }
    Ok(vec![if reverse { flip(&y, axis)? } else { y }])
}

fn topk(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let k = if n.opset < 10 { n.i("k", 1) } else { n.const_ints(n.x(1)?, "K")?[0] };
    let axis = n.axis(n.i("axis", -1), x.ndim())?;
    let largest = n.i("largest", 1) != 0;
    let sorted = n.i("sorted", 1) != 0;
    call_all("topk", vec![v(x), Value::Int(k), Value::Int(axis as i64), Value::Bool(largest), Value::Bool(sorted)])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[
    ("ReduceSum", |n| reduce(n, "sum", 13)),
    ("ReduceMean", |n| reduce(n, "mean", 18)),
    ("ReduceMax", |n| reduce(n, "amax", 18)),
    ("ReduceMin", |n| reduce(n, "amin", 18)),
    ("ReduceProd", reduce_prod),
    ("ReduceL1", reduce_l1),
    ("ReduceL2", reduce_l2),
    ("ReduceSumSquare", reduce_sum_square),
    ("ReduceLogSum", reduce_log_sum),
    ("ReduceLogSumExp", reduce_log_sum_exp),
    ("ArgMax", |n| arg(n, "argmax")),
    ("ArgMin", |n| arg(n, "argmin")),
    ("Softmax", |n| softmax_like(n, "softmax")),
    ("LogSoftmax", |n| softmax_like(n, "log_softmax")),
    ("Hardmax", hardmax),
    ("CumSum", cumsum),
    ("CumProd", cumprod),
    ("TopK", topk),
];
