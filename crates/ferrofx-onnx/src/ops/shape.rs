//! Shape, indexing and constant ONNX ops: `Reshape`, `Slice` (any step, negative too),
//! `Gather`, `Split`, `Squeeze`/`Unsqueeze` (axes as attribute or input), `Pad` (all modes),
//! `Shape`, `Constant`, `Cast`, `Range`... Shape arguments must be known at import time; they
//! usually are, because `Shape` of a traced input is a concrete tensor (folded).

use super::elementwise::cast;
use super::{call, callk, i64_tensor, scalar_of, v, Convert, Node};
use crate::tensor_proto::dtype_from_onnx;
use ferrofx_core::{DType, Result, Tensor, Value};

fn usize_shape(t: &Tensor) -> Vec<i64> {
    t.shape().iter().map(|&d| d as i64).collect()
}

fn reshape_to(t: &Tensor, shape: &[i64]) -> Result<Tensor> {
    if usize_shape(t) == shape {
        return Ok(t.clone());
    }
    call("reshape", vec![v(t), Value::Ints(shape.to_vec())])
}

/// Reverses `t` along `dim` (index_select with a descending index).
pub(crate) fn flip(t: &Tensor, dim: usize) -> Result<Tensor> {
    let d = t.shape()[dim] as i64;
    let idx: Vec<i64> = (0..d).rev().collect();
    call("index_select", vec![v(t), Value::Int(dim as i64), v(&i64_tensor(&idx)?)])
}

fn reshape(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let mut shape = if n.opset < 5 { n.ints("shape").unwrap_or_default() } else { n.const_ints(n.x(1)?, "shape")? };
    let allowzero = n.i("allowzero", 0) != 0;
    if !allowzero {
        for (i, s) in shape.iter_mut().enumerate() {
            if *s == 0 {
                *s = *x.shape().get(i).ok_or_else(|| {
                    n.err(format!(
                        "shape {:?} copies dim {i} (0) but the input has shape {:?}",
                        n.x(1).map(usize_shape),
                        x.shape()
                    ))
                })? as i64;
            }
        }
    }
    Ok(vec![reshape_to(x, &shape).map_err(|e| n.err(e))?])
}

fn flatten(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let r = x.ndim();
    let axis = n.i("axis", 1);
    let a = if axis < 0 { axis + r as i64 } else { axis };
    if a < 0 || a > r as i64 {
        return Err(n.err(format!("axis {axis} is out of range for rank {r}")));
    }
    let a = a as usize;
    let outer: usize = x.shape()[..a].iter().product();
    let inner: usize = x.shape()[a..].iter().product();
    Ok(vec![reshape_to(x, &[outer as i64, inner as i64])?])
}

fn axes_of(n: &Node<'_>, input: usize) -> Result<Option<Vec<i64>>> {
    if n.opset >= 13 {
        match n.opt(input) {
            Some(t) => Ok(Some(n.const_ints(t, "axes")?)),
            None => Ok(None),
        }
    } else {
        Ok(n.ints("axes"))
    }
}

fn squeeze(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let r = x.ndim();
    let axes: Vec<usize> = match axes_of(n, 1)? {
        Some(a) => a.iter().map(|&a| n.dim_axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).filter(|&i| x.shape()[i] == 1).collect(),
    };
    for &a in &axes {
        if x.shape()[a] != 1 {
            return Err(n.err(format!("cannot squeeze axis {a} of size {} (shape {:?})", x.shape()[a], x.shape())));
        }
    }
    let shape: Vec<i64> =
        x.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d as i64).collect();
    Ok(vec![reshape_to(x, &shape)?])
}

fn unsqueeze(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axes = axes_of(n, 1)?.ok_or_else(|| n.err("`axes` is required"))?;
    let out_rank = x.ndim() + axes.len();
    let mut axes: Vec<usize> = axes.iter().map(|&a| n.axis(a, out_rank)).collect::<Result<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    if axes.len() + x.ndim() != out_rank {
        return Err(n.err("`axes` has duplicates"));
    }
    let mut shape = Vec::with_capacity(out_rank);
    let mut it = x.shape().iter();
    for i in 0..out_rank {
        if axes.contains(&i) {
            shape.push(1);
        } else {
            shape.push(*it.next().unwrap_or(&1) as i64);
        }
    }
    Ok(vec![reshape_to(x, &shape)?])
}

fn transpose(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let perm = n.ints("perm").unwrap_or_else(|| (0..x.ndim() as i64).rev().collect());
    Ok(vec![call("permute", vec![v(x), Value::Ints(perm)])?])
}

fn concat(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let xs: Vec<Tensor> = (0..n.inputs.len()).map(|i| n.x(i).cloned()).collect::<Result<_>>()?;
    let rank = xs.first().map(|t| t.ndim()).unwrap_or(1);
    let axis = n.axis(n.attr("axis").and_then(|a| a.i).ok_or_else(|| n.err("`axis` is required"))?, rank)?;
    Ok(vec![call("cat", vec![Value::Tensors(xs), Value::Int(axis as i64)])?])
}

fn split(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axis = n.dim_axis(n.i("axis", 0), x.ndim())?;
    let d = x.shape()[axis] as i64;
    let outs = n.proto.output.len().max(1) as i64;
    let sizes = if n.opset >= 13 {
        n.opt(1).map(|t| n.const_ints(t, "split")).transpose()?
    } else {
        n.ints("split").filter(|s| !s.is_empty())
    };
    let sizes = match sizes {
        Some(s) => s,
        None => {
            let parts = n.attr("num_outputs").and_then(|a| a.i).unwrap_or(outs);
            let each = (d + parts - 1) / parts.max(1);
            let mut s = vec![each; parts as usize];
            if let Some(last) = s.last_mut() {
                *last = d - each * (parts - 1);
            }
            s
        }
    };
    if sizes.iter().sum::<i64>() != d || sizes.iter().any(|&s| s < 0) {
        return Err(n.err(format!("split sizes {sizes:?} do not add up to dim {axis} of shape {:?}", x.shape())));
    }
    call_split(x, &sizes, axis)
}

fn call_split(x: &Tensor, sizes: &[i64], axis: usize) -> Result<Vec<Tensor>> {
    super::call_all("split_with_sizes", vec![v(x), Value::Ints(sizes.to_vec()), Value::Int(axis as i64)])
}

fn slice(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let r = x.ndim();
    let (starts, ends, axes, steps) = if n.opset < 10 {
        let starts = n.ints("starts").unwrap_or_default();
        let ends = n.ints("ends").unwrap_or_default();
        let axes = n.ints("axes");
        (starts, ends, axes, None)
    } else {
        let starts = n.const_ints(n.x(1)?, "starts")?;
        let ends = n.const_ints(n.x(2)?, "ends")?;
        let axes = n.opt(3).map(|t| n.const_ints(t, "axes")).transpose()?;
        let steps = n.opt(4).map(|t| n.const_ints(t, "steps")).transpose()?;
        (starts, ends, axes, steps)
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(n.err(format!(
            "starts {starts:?}, ends {ends:?}, axes {axes:?} and steps {steps:?} must have the same length"
        )));
    }
    let mut y = x.clone();
    for i in 0..starts.len() {
        let axis = n.dim_axis(axes[i], r)?;
        let d = y.shape()[axis] as i64;
        let step = steps[i];
        if step == 0 {
            return Err(n.err("a step of 0 is invalid"));
        }
        if d == 0 {
            // any slice of an empty axis is empty
            continue;
        }
        let norm = |s: i64| if s < 0 { s.saturating_add(d) } else { s };
        let (mut s, mut e) = (norm(starts[i]), norm(ends[i]));
        if step > 0 {
            s = s.clamp(0, d);
            e = e.clamp(0, d);
            if s == 0 && e == d && step == 1 {
                continue;
            }
            let e = e.max(s);
            y = call("slice", vec![v(&y), Value::Int(axis as i64), Value::Int(s), Value::Int(e), Value::Int(step)])?;
        } else {
            s = s.clamp(0, d - 1);
            e = e.clamp(-1, d - 1);
            let count = ((s - e + (-step) - 1) / (-step)).max(0) as usize;
            ferrofx_core::memory::check_alloc("onnx Slice", &[count], ferrofx_core::DType::I64)?;
            let mut idx = Vec::with_capacity(count);
            let mut k = s;
            while k > e && k >= 0 {
                idx.push(k);
                k += step;
            }
            y = call("index_select", vec![v(&y), Value::Int(axis as i64), v(&i64_tensor(&idx)?)])?;
        }
    }
    Ok(vec![y])
}

/// Indices with negative entries wrapped by `d` (concrete when possible).
fn wrap_indices(n: &Node<'_>, idx: &Tensor, d: usize) -> Result<Tensor> {
    if !idx.is_symbolic() {
        let vals = n.const_ints(idx, "indices")?;
        let mut out = Vec::with_capacity(vals.len());
        for &i in &vals {
            let w = if i < 0 { i + d as i64 } else { i };
            if w < 0 || w >= d as i64 {
                return Err(n.err(format!("index {i} is out of range for a dimension of size {d}")));
            }
            out.push(w);
        }
        return Tensor::from_vec(out, idx.shape());
    }
    let idx = cast(idx, DType::I64)?;
    let neg = call("lt", vec![v(&idx), Value::Int(0)])?;
    let shifted = call("add", vec![v(&idx), Value::Int(d as i64)])?;
    call("where", vec![v(&neg), v(&shifted), v(&idx)])
}

fn gather(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, idx) = (n.x(0)?, n.x(1)?);
    let axis = n.dim_axis(n.i("axis", 0), x.ndim())?;
    let idx = wrap_indices(n, idx, x.shape()[axis])?;
    if idx.ndim() == 1 {
        return Ok(vec![call("index_select", vec![v(x), Value::Int(axis as i64), v(&idx)])?]);
    }
    if idx.ndim() == 0 && !idx.is_symbolic() {
        let i = n.const_ints(&idx, "indices")?[0];
        return Ok(vec![call("select", vec![v(x), Value::Int(axis as i64), Value::Int(i)])?]);
    }
    let flat = reshape_to(&idx, &[idx.numel() as i64])?;
    let picked = call("index_select", vec![v(x), Value::Int(axis as i64), v(&flat)])?;
    let mut shape: Vec<i64> = x.shape()[..axis].iter().map(|&d| d as i64).collect();
    shape.extend(idx.shape().iter().map(|&d| d as i64));
    shape.extend(x.shape()[axis + 1..].iter().map(|&d| d as i64));
    Ok(vec![reshape_to(&picked, &shape)?])
}

fn gather_elements(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, idx) = (n.x(0)?, n.x(1)?);
    let axis = n.dim_axis(n.i("axis", 0), x.ndim())?;
    let idx = wrap_indices(n, idx, x.shape()[axis])?;
    Ok(vec![call("gather", vec![v(x), Value::Int(axis as i64), v(&idx)])?])
}

fn scatter_elements(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, idx, upd) = (n.x(0)?, n.x(1)?, n.x(2)?);
    let axis = n.dim_axis(n.i("axis", 0), x.ndim())?;
    let idx = wrap_indices(n, idx, x.shape()[axis])?;
    let op = match n.s("reduction").as_deref().unwrap_or("none") {
        "none" => "scatter",
        "add" => "scatter_add",
        other => return Err(n.err(format!("reduction `{other}` is not supported (supported: none, add)"))),
    };
    Ok(vec![call(op, vec![v(x), Value::Int(axis as i64), v(&idx), v(upd)])?])
}

fn expand(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let shape = n.const_ints(n.x(1)?, "shape")?;
    let xs = usize_shape(x);
    let r = xs.len().max(shape.len());
    let mut out = vec![0i64; r];
    for i in 0..r {
        let a = if i + xs.len() >= r { xs[i + xs.len() - r] } else { 1 };
        let b = if i + shape.len() >= r { shape[i + shape.len() - r] } else { 1 };
        out[i] = if a == 1 {
            b
        } else if b == 1 || a == b {
            a
        } else {
            return Err(n.err(format!("cannot broadcast input shape {xs:?} to {shape:?}")));
        };
    }
    if out == xs {
        return Ok(vec![x.clone()]);
    }
    Ok(vec![call("expand", vec![v(x), Value::Ints(out)])?])
}

fn tile(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let reps = n.const_ints(n.x(1)?, "repeats")?;
    if reps.len() != x.ndim() {
        return Err(n.err(format!("repeats {reps:?} must have one entry per dim of shape {:?}", x.shape())));
    }
    let mut y = x.clone();
    for (d, &r) in reps.iter().enumerate() {
        if r < 0 {
            return Err(n.err(format!("negative repeat {r}")));
        }
        if r != 1 {
            y = call("cat", vec![Value::Tensors(vec![y.clone(); r as usize]), Value::Int(d as i64)])?;
        }
    }
    Ok(vec![y])
}

fn shape(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let s = usize_shape(n.x(0)?);
    let r = s.len() as i64;
    let clampi = |i: i64| (if i < 0 { i + r } else { i }).clamp(0, r) as usize;
    let start = clampi(n.i("start", 0));
    let end = clampi(n.i("end", r));
    Ok(vec![i64_tensor(&s[start..end.max(start)])?])
}

fn size(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![Tensor::scalar(n.x(0)?.numel() as i64)])
}

fn constant_of_shape(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let shape = n.const_ints(n.x(0)?, "input")?;
    crate::tensor_proto::checked_shape(&shape, "ConstantOfShape", 1 << 31).map_err(|e| n.err(e))?;
    let value = n.t("value")?;
    let (fill, dtype) = match value {
        Some(t) => (t.to_vec_f64()?.first().copied().unwrap_or(0.0), t.dtype()),
        None => (0.0, DType::F32),
    };
    let fill = if dtype.is_floating_point() {
        Value::Float(fill)
    } else if dtype == DType::Bool {
        Value::Bool(fill != 0.0)
    } else {
        Value::Int(fill as i64)
    };
    Ok(vec![callk("full", vec![Value::Ints(shape), fill], vec![("dtype", Value::DType(dtype))])?])
}

fn constant(n: &Node<'_>) -> Result<Vec<Tensor>> {
    if let Some(t) = n.t("value")? {
        return Ok(vec![t]);
    }
    if let Some(f) = n.attr("value_float").and_then(|a| a.f) {
        return Ok(vec![Tensor::scalar(f)]);
    }
    if let Some(i) = n.attr("value_int").and_then(|a| a.i) {
        return Ok(vec![Tensor::scalar(i)]);
    }
    if let Some(a) = n.attr("value_floats") {
        return Ok(vec![Tensor::from_vec(a.floats.clone(), &[a.floats.len()])?]);
    }
    if let Some(a) = n.attr("value_ints") {
        return Ok(vec![i64_tensor(&a.ints)?]);
    }
    Err(n.err("only tensor, float(s) and int(s) constants are supported (not sparse or string)"))
}

fn cast_op(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let to = n.attr("to").and_then(|a| a.i).ok_or_else(|| n.err("`to` is required"))?;
    let dtype = dtype_from_onnx(to as i32, "Cast `to`").map_err(|e| n.err(e))?;
    Ok(vec![cast(n.x(0)?, dtype)?])
}

fn cast_like(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![cast(n.x(0)?, n.x(1)?.dtype())?])
}

fn range(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (s, l, d) = (n.x(0)?, n.x(1)?, n.x(2)?);
    let dtype = s.dtype();
    let start = n.const_floats(s, "start")?[0];
    let limit = n.const_floats(l, "limit")?[0];
    let delta = n.const_floats(d, "delta")?[0];
    if delta == 0.0 {
        return Err(n.err("delta must not be 0"));
    }
    let count = ((limit - start) / delta).ceil().max(0.0);
    if count > (1u64 << 31) as f64 {
        return Err(n.err(format!("Range of {count} elements is too large")));
    }
    let vals: Vec<f64> = (0..count as usize).map(|i| start + i as f64 * delta).collect();
    let t = Tensor::from_vec(vals, &[count as usize])?;
    Ok(vec![cast(&t, dtype)?])
}

fn identity(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![n.x(0)?.clone()])
}

fn pad(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let r = x.ndim();
    let (pads, value) = if n.opset < 11 {
        (n.ints("pads").unwrap_or_default(), n.f("value", 0.0))
    } else {
        let pads = n.const_ints(n.x(1)?, "pads")?;
        let value = match n.opt(2) {
            Some(t) => n.const_floats(t, "constant_value")?.first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        (pads, value)
    };
    let axes: Vec<usize> = match n.opt(3) {
        Some(t) => n.const_ints(t, "axes")?.iter().map(|&a| n.axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(n.err(format!("pads {pads:?} must have 2 entries per padded axis ({} axes)", axes.len())));
    }
    let mut full = vec![(0i64, 0i64); r];
    for (i, &a) in axes.iter().enumerate() {
        full[a] = (pads[i], pads[i + axes.len()]);
    }
    let mode = n.s("mode").unwrap_or_else(|| "constant".into());
    let torch_mode = match mode.as_str() {
        "constant" => "constant",
        "reflect" => "reflect",
        "edge" => "replicate",
        "wrap" => "circular",
        other => return Err(n.err(format!("mode `{other}` is not supported (constant, reflect, edge, wrap)"))),
    };
    pad_dims(x, &full, torch_mode, value).map(|t| vec![t]).map_err(|e| n.err(e))
}

/// Pads (or crops, for negative amounts) each dim by `(begin, end)`.
pub(crate) fn pad_dims(x: &Tensor, full: &[(i64, i64)], mode: &str, value: f64) -> Result<Tensor> {
    // Negative pads crop: slice first, then pad the positive parts.
    let mut y = x.clone();
    for (d, &(b, e)) in full.iter().enumerate() {
        if b < 0 || e < 0 {
            let len = y.shape()[d] as i64;
            let s = (-b).max(0);
            let end = len - (-e).max(0);
            y = call("slice", vec![v(&y), Value::Int(d as i64), Value::Int(s), Value::Int(end.max(s)), Value::Int(1)])?;
        }
    }
    let mut torch_pads = Vec::new();
    let last_nonzero = full.iter().position(|&(b, e)| b > 0 || e > 0);
    let Some(first) = last_nonzero else { return Ok(y) };
    for d in (first..full.len()).rev() {
        torch_pads.push(full[d].0.max(0));
        torch_pads.push(full[d].1.max(0));
    }
    let val = if mode == "constant" { Value::Float(value) } else { Value::None };
    call("pad", vec![v(&y), Value::Ints(torch_pads), Value::Str(mode.into()), val])
}

fn depth_to_space(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let b = n.i("blocksize", 0);
    let s = usize_shape(x);
    if s.len() != 4 || b <= 0 || s[1] % (b * b) != 0 {
        return Err(
            n.err(format!("needs a 4-D input with channels divisible by blocksize² (shape {s:?}, blocksize {b})"))
        );
    }
    let (nn, c, h, w) = (s[0], s[1], s[2], s[3]);
    let crd = n.s("mode").as_deref() == Some("CRD");
    let (shape6, perm) = if crd {
        (vec![nn, c / (b * b), b, b, h, w], vec![0, 1, 4, 2, 5, 3])
    } else {
        (vec![nn, b, b, c / (b * b), h, w], vec![0, 3, 4, 1, 5, 2])
    };
    let y = call("permute", vec![v(&reshape_to(x, &shape6)?), Value::Ints(perm)])?;
    Ok(vec![reshape_to(&call("contiguous", vec![v(&y)])?, &[nn, c / (b * b), h * b, w * b])?])
}

fn space_to_depth(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let b = n.i("blocksize", 0);
    let s = usize_shape(x);
    if s.len() != 4 || b <= 0 || s[2] % b != 0 || s[3] % b != 0 {
        return Err(
            n.err(format!("needs a 4-D input with H and W divisible by blocksize (shape {s:?}, blocksize {b})"))
        );
    }
    let (nn, c, h, w) = (s[0], s[1], s[2], s[3]);
    let y = reshape_to(x, &[nn, c, h / b, b, w / b, b])?;
    let y = call("permute", vec![v(&y), Value::Ints(vec![0, 3, 5, 1, 2, 4])])?;
    Ok(vec![reshape_to(&call("contiguous", vec![v(&y)])?, &[nn, c * b * b, h / b, w / b])?])
}

fn trilu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    if x.ndim() < 2 {
        return Err(n.err(format!("needs rank >= 2, got shape {:?}", x.shape())));
    }
    let k = match n.opt(1) {
        Some(t) => n.const_ints(t, "k")?[0],
        None => 0,
    };
    let upper = n.i("upper", 1) != 0;
    let (h, w) = (x.shape()[x.ndim() - 2], x.shape()[x.ndim() - 1]);
    let mut mask = Vec::with_capacity(h * w);
    for i in 0..h as i64 {
        for j in 0..w as i64 {
            mask.push(if upper { j - i >= k } else { j - i <= k });
        }
    }
    let mask = Tensor::from_vec(mask, &[h, w])?;
    Ok(vec![call("where", vec![v(&mask), v(x), v(&scalar_of(0.0, x.dtype())?)])?])
}

fn eye_like(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    if x.ndim() != 2 {
        return Err(n.err(format!("needs a 2-D input, got shape {:?}", x.shape())));
    }
    let dtype = match n.attr("dtype").and_then(|a| a.i) {
        Some(code) => dtype_from_onnx(code as i32, "EyeLike dtype").map_err(|e| n.err(e))?,
        None => x.dtype(),
    };
    let k = n.i("k", 0);
    let (h, w) = (x.shape()[0], x.shape()[1]);
    let vals: Vec<f64> =
        (0..h as i64).flat_map(|i| (0..w as i64).map(move |j| if j - i == k { 1.0 } else { 0.0 })).collect();
    Ok(vec![cast(&Tensor::from_vec(vals, &[h, w])?, dtype)?])
}

fn one_hot(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (idx, depth, values) = (n.x(0)?, n.x(1)?, n.x(2)?);
    let depth = n.const_floats(depth, "depth")?[0] as i64;
    if depth <= 0 {
        return Err(n.err(format!("depth must be positive, got {depth}")));
    }
    let idx = cast(idx, DType::I64)?;
    let neg = call("lt", vec![v(&idx), Value::Int(0)])?;
    let idx = call("where", vec![v(&neg), v(&call("add", vec![v(&idx), Value::Int(depth)])?), v(&idx)])?;
    // Out-of-range indices give an all-off row: compare against a range instead of one_hot.
    let range = i64_tensor(&(0..depth).collect::<Vec<_>>())?;
    let r = idx.ndim() + 1;
    let axis = n.axis(n.i("axis", -1), r)?;
    let mut ishape: Vec<i64> = usize_shape(&idx);
    ishape.insert(axis, 1);
    let mut rshape = vec![1i64; r];
    rshape[axis] = depth;
    let hot = call("eq", vec![v(&reshape_to(&idx, &ishape)?), v(&reshape_to(&range, &rshape)?)])?;
    let off = call("select", vec![v(values), Value::Int(0), Value::Int(0)])?;
    let on = call("select", vec![v(values), Value::Int(0), Value::Int(1)])?;
    Ok(vec![call("where", vec![v(&hot), v(&on), v(&off)])?])
}

/// Linear indices into `data` flattened over its first `b + k` dims, for `indices` whose last
/// dim holds `k` coordinates after `b` batch dims (GatherND / ScatterND). Returns the linear
/// index tensor (shape `indices.shape[..-1]`) and the remaining dims of `data`.
fn nd_linear(n: &Node<'_>, data: &Tensor, idx: &Tensor, b: usize) -> Result<(Tensor, Vec<i64>)> {
    let ishape: Vec<i64> = usize_shape(idx);
    let k = *ishape.last().ok_or_else(|| n.err("indices must have rank >= 1"))? as usize;
    let ds = usize_shape(data);
    if b + k > ds.len() || b >= ishape.len() {
        return Err(n.err(format!("indices {ishape:?} (batch_dims {b}) do not fit data {ds:?}")));
    }
    let idx = cast(idx, DType::I64)?;
    // Wrap negative coordinates: where(i < 0, i + dim, i) with the dims as a constant row.
    let dims = i64_tensor(&ds[b..b + k])?;
    let neg = call("lt", vec![v(&idx), Value::Int(0)])?;
    let idx = call("where", vec![v(&neg), v(&call("add", vec![v(&idx), v(&dims)])?), v(&idx)])?;
    let mut strides = vec![1i64; k];
    for j in (0..k.saturating_sub(1)).rev() {
        strides[j] = strides[j + 1] * ds[b + j + 1];
    }
    let lin = call(
        "sum",
        vec![v(&call("mul", vec![v(&idx), v(&i64_tensor(&strides)?)])?), Value::Ints(vec![-1]), Value::Bool(false)],
    )?;
    let lin = if b > 0 {
        let inner: i64 = ds[b..b + k].iter().product();
        let nb: i64 = ds[..b].iter().product();
        let mut bshape: Vec<i64> = ds[..b].to_vec();
        bshape.extend(std::iter::repeat_n(1, ishape.len() - 1 - b));
        let base = Tensor::from_vec(
            (0..nb).map(|i| i * inner).collect::<Vec<i64>>(),
            &bshape.iter().map(|&d| d as usize).collect::<Vec<_>>(),
        )?;
        call("add", vec![v(&lin), v(&base)])?
    } else {
        lin
    };
    Ok((lin, ds[b + k..].to_vec()))
}

fn gather_nd(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (data, idx) = (n.x(0)?, n.x(1)?);
    let b = n.i("batch_dims", 0).max(0) as usize;
    let (lin, rest) = nd_linear(n, data, idx, b)?;
    let ds = usize_shape(data);
    let k = *usize_shape(idx).last().unwrap_or(&0) as usize;
    let mut flat_shape = vec![ds[..b + k].iter().product::<i64>()];
    flat_shape.extend(&rest);
    let flat = reshape_to(data, &flat_shape)?;
    let picked = call("index_select", vec![v(&flat), Value::Int(0), v(&reshape_to(&lin, &[lin.numel() as i64])?)])?;
    let mut out: Vec<i64> = usize_shape(&lin);
    out.extend(&rest);
    Ok(vec![reshape_to(&picked, &out)?])
}

fn scatter_nd(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (data, idx, upd) = (n.x(0)?, n.x(1)?, n.x(2)?);
    let (lin, rest) = nd_linear(n, data, idx, 0)?;
    let ds = usize_shape(data);
    let k = ds.len() - rest.len();
    let mut flat_shape = vec![ds[..k].iter().product::<i64>()];
    flat_shape.extend(&rest);
    let flat = reshape_to(data, &flat_shape)?;
    let l = lin.numel() as i64;
    let mut ushape = vec![l];
    ushape.extend(&rest);
    let upd = reshape_to(upd, &ushape)?;
    let mut ishape = vec![l];
    ishape.extend(std::iter::repeat_n(1, rest.len()));
    let index = call("expand", vec![v(&reshape_to(&lin, &ishape)?), Value::Ints(ushape)])?;
    let op = match n.s("reduction").as_deref().unwrap_or("none") {
        "none" => "scatter",
        "add" => "scatter_add",
        other => return Err(n.err(format!("reduction `{other}` is not supported (supported: none, add)"))),
    };
    let y = call(op, vec![v(&flat), Value::Int(0), v(&index), v(&upd)])?;
    Ok(vec![reshape_to(&y, &ds)?])
}

fn compress(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, cond) = (n.x(0)?, n.x(1)?);
    let c = n.const_ints(cond, "condition")?;
    let (x, axis) = match n.attr("axis").and_then(|a| a.i) {
        Some(a) => (x.clone(), n.dim_axis(a, x.ndim())?),
        None => (reshape_to(x, &[x.numel() as i64])?, 0),
    };
    let d = x.shape()[axis];
    let idx: Vec<i64> = c.iter().take(d).enumerate().filter(|(_, &b)| b != 0).map(|(i, _)| i as i64).collect();
    Ok(vec![call("index_select", vec![v(&x), Value::Int(axis as i64), v(&i64_tensor(&idx)?)])?])
}

fn reverse_sequence(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let lens = n.const_ints(n.x(1)?, "sequence_lens")?;
    let ba = n.dim_axis(n.i("batch_axis", 1), x.ndim())?;
    let ta = n.dim_axis(n.i("time_axis", 0), x.ndim())?;
    let (nb, nt) = (x.shape()[ba], x.shape()[ta]);
    if lens.len() != nb {
        return Err(n.err(format!("sequence_lens has {} entries for a batch of {nb}", lens.len())));
    }
    // Gather index along the time axis, shaped with the batch and time dims in place.
    let mut shape = vec![1usize; x.ndim()];
    shape[ba] = nb;
    shape[ta] = nt;
    let mut vals = vec![0i64; nb * nt];
    for (bi, len) in lens.iter().enumerate() {
        for t in 0..nt {
            let l = (*len).clamp(0, nt as i64);
            let src = if (t as i64) < l { l - 1 - t as i64 } else { t as i64 };
            let pos = if ba < ta { bi * nt + t } else { t * nb + bi };
            vals[pos] = src;
        }
    }
    let idx = Tensor::from_vec(vals, &shape)?;
    let idx = call("expand", vec![v(&idx), Value::Ints(usize_shape(x))])?;
    Ok(vec![call("gather", vec![v(x), Value::Int(ta as i64), v(&call("contiguous", vec![v(&idx)])?)])?])
}

fn center_crop_pad(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let target = n.const_ints(n.x(1)?, "shape")?;
    let r = x.ndim();
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&a| n.dim_axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if axes.len() != target.len() {
        return Err(n.err(format!("shape {target:?} must have one entry per axis ({} axes)", axes.len())));
    }
    let mut full = vec![(0i64, 0i64); r];
    for (&a, &t) in axes.iter().zip(&target) {
        let d = x.shape()[a] as i64;
        if t < d {
            let s = (d - t) / 2;
            full[a] = (-s, -(d - t - s));
        } else if t > d {
            let s = (t - d) / 2;
            full[a] = (s, t - d - s);
        }
    }
    Ok(vec![pad_dims(x, &full, "constant", 0.0)?])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Squeeze", squeeze),
    ("Unsqueeze", unsqueeze),
    ("Transpose", transpose),
    ("Concat", concat),
    ("Split", split),
    ("Slice", slice),
    ("Gather", gather),
    ("GatherElements", gather_elements),
    ("ScatterElements", scatter_elements),
    ("Expand", expand),
    ("Tile", tile),
    ("Shape", shape),
    ("Size", size),
    ("ConstantOfShape", constant_of_shape),
    ("Constant", constant),
    ("Cast", cast_op),
    ("CastLike", cast_like),
    ("Range", range),
    ("Identity", identity),
    ("Pad", pad),
    ("DepthToSpace", depth_to_space),
    ("SpaceToDepth", space_to_depth),
    ("Trilu", trilu),
    ("EyeLike", eye_like),
    ("OneHot", one_hot),
    ("GatherND", gather_nd),
    ("ScatterND", scatter_nd),
    ("Scatter", scatter_elements),
    ("Compress", compress),
    ("ReverseSequence", reverse_sequence),
    ("CenterCropPad", center_crop_pad),
];
