//! Quantisation ONNX ops (`QuantizeLinear`, `DequantizeLinear`, `DynamicQuantizeLinear`, the
//! integer and QLinear matmul/conv) decomposed into float registry ops: dequantise, compute in
//! float (f64 for the exact integer ops), round half to even, saturate.

use super::elementwise::cast;
use super::{call, v, Convert, Node};
use ferrofx_core::{DType, Result, Tensor, Value};

/// Reshapes a per-axis parameter (1-D, length = dim `axis`) to broadcast against rank `r`.
fn along(n: &Node<'_>, p: &Tensor, axis: i64, r: usize) -> Result<Tensor> {
    if p.ndim() == 0 || p.numel() == 1 && r == 0 {
        return Ok(p.clone());
    }
    if p.ndim() == 1 {
        let a = n.dim_axis(axis, r)?;
        let mut shape = vec![1i64; r];
        shape[a] = p.numel() as i64;
        return call("reshape", vec![v(p), Value::Ints(shape)]);
    }
    Err(n.err(format!("blocked quantisation (scale of shape {:?}) is not supported", p.shape())))
}

fn dequantize(n: &Node<'_>, x: &Tensor, scale: &Tensor, zp: Option<&Tensor>, axis: i64) -> Result<Tensor> {
    let r = x.ndim();
    let xf = cast(x, DType::F32)?;
    let xf = match zp {
        Some(z) => call("sub", vec![v(&xf), v(&cast(&along(n, z, axis, r)?, DType::F32)?)])?,
        None => xf,
    };
    call("mul", vec![v(&xf), v(&along(n, &cast(scale, DType::F32)?, axis, r)?)])
}

fn range_of(d: DType) -> Option<(f64, f64)> {
    match d {
        DType::U8 => Some((0.0, 255.0)),
        DType::I8 => Some((-128.0, 127.0)),
        DType::I16 => Some((-32768.0, 32767.0)),
        DType::I32 => Some((i32::MIN as f64, i32::MAX as f64)),
        _ => None,
    }
}

fn quantize(n: &Node<'_>, x: &Tensor, scale: &Tensor, zp: Option<&Tensor>, axis: i64, out: DType) -> Result<Tensor> {
    let r = x.ndim();
    let (lo, hi) = range_of(out).ok_or_else(|| n.err(format!("quantising to {out:?} is not supported")))?;
    let q = call("div", vec![v(&cast(x, DType::F32)?), v(&along(n, &cast(scale, DType::F32)?, axis, r)?)])?;
    let q = call("round", vec![v(&q)])?;
    let q = match zp {
        Some(z) => call("add", vec![v(&q), v(&cast(&along(n, z, axis, r)?, DType::F32)?)])?,
        None => q,
    };
    let q = call("clamp", vec![v(&q), Value::Float(lo), Value::Float(hi)])?;
    cast(&q, out)
}

fn dequantize_linear(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    if x.dtype() == DType::I32 && n.opt(2).is_some() {
        // int32 has no zero point in the spec; accept a zero one.
    }
    let y = dequantize(n, x, n.x(1)?, n.opt(2), n.i("axis", 1))?;
    Ok(vec![cast(&y, n.x(1)?.dtype())?])
}

fn quantize_linear(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let out = n.opt(2).map(|z| z.dtype()).unwrap_or(DType::U8);
    Ok(vec![quantize(n, n.x(0)?, n.x(1)?, n.opt(2), n.i("axis", 1), out)?])
}

fn dynamic_quantize_linear(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = cast(n.x(0)?, DType::F32)?;
    let zero = super::scalar_of(0.0, DType::F32)?;
    let mx = call("maximum", vec![v(&call("max", vec![v(&x)])?), v(&zero)])?;
    let mn = call("minimum", vec![v(&call("min", vec![v(&x)])?), v(&zero)])?;
    let scale = call("div", vec![v(&call("sub", vec![v(&mx), v(&mn)])?), Value::Float(255.0)])?;
    let zp = call("round", vec![v(&call("neg", vec![v(&call("div", vec![v(&mn), v(&scale)])?)])?)])?;
    let zp = cast(&call("clamp", vec![v(&zp), Value::Float(0.0), Value::Float(255.0)])?, DType::U8)?;
    let y = quantize(n, &x, &scale, Some(&zp), 1, DType::U8)?;
    Ok(vec![y, scale, zp])
}

fn centered(x: &Tensor, zp: Option<&Tensor>, n: &Node<'_>, axis: i64) -> Result<Tensor> {
    let xf = cast(x, DType::F64)?;
    match zp {
        Some(z) => {
            let z = if z.ndim() == 1 && z.numel() > 1 { along(n, z, axis, x.ndim())? } else { z.clone() };
            call("sub", vec![v(&xf), v(&cast(&z, DType::F64)?)])
        }
        None => Ok(xf),
    }
}

fn matmul_integer(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (a, b) = (n.x(0)?, n.x(1)?);
    // a's zero point is per row (axis 0 of a 2-D a), b's per column (last axis).
    let a = centered(a, n.opt(2), n, 0)?;
    let bz = n.opt(3);
    let b = centered(b, bz, n, -1)?;
    Ok(vec![cast(&call("matmul", vec![v(&a), v(&b)])?, DType::I32)?])
}

fn conv_integer(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = centered(n.x(0)?, n.opt(2), n, 1)?;
    let w = centered(n.x(1)?, n.opt(3), n, 0)?;
    let inner = Node { proto: n.proto, opset: n.opset, inputs: vec![Some(x), Some(w)], dir: n.dir };
    let y = super::nn::conv_op(&inner)?;
    Ok(vec![cast(&y, DType::I32)?])
}

fn qlinear_matmul(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let a = dequantize(n, n.x(0)?, n.x(1)?, n.opt(2), 0)?;
    let b = dequantize(n, n.x(3)?, n.x(4)?, n.opt(5), -1)?;
    let y = call("matmul", vec![v(&a), v(&b)])?;
    let out = n.opt(7).map(|z| z.dtype()).unwrap_or(DType::U8);
    Ok(vec![quantize(n, &y, n.x(6)?, n.opt(7), 1, out)?])
}

fn qlinear_conv(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = dequantize(n, n.x(0)?, n.x(1)?, n.opt(2), 1)?;
    let w = dequantize(n, n.x(3)?, n.x(4)?, n.opt(5), 0)?;
    let bias = match n.opt(8) {
        Some(b) => {
            let s = call("mul", vec![v(&cast(n.x(1)?, DType::F32)?), v(&cast(n.x(4)?, DType::F32)?)])?;
            Some(call("mul", vec![v(&cast(b, DType::F32)?), v(&s)])?)
        }
        None => None,
    };
    let inner = Node { proto: n.proto, opset: n.opset, inputs: vec![Some(x), Some(w), bias], dir: n.dir };
    let y = super::nn::conv_op(&inner)?;
    let out = n.opt(7).map(|z| z.dtype()).unwrap_or(DType::U8);
    Ok(vec![quantize(n, &y, n.x(6)?, n.opt(7), 1, out)?])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[
    ("DequantizeLinear", dequantize_linear),
    ("QuantizeLinear", quantize_linear),
    ("DynamicQuantizeLinear", dynamic_quantize_linear),
    ("MatMulInteger", matmul_integer),
    ("ConvInteger", conv_integer),
    ("QLinearMatMul", qlinear_matmul),
    ("QLinearConv", qlinear_conv),
];
