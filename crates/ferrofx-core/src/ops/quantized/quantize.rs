//! `quantize_per_tensor`, `quantize_per_channel`, `dequantize`, `dequantize_per_channel`: the
//! conversions between float tensors and their affine integer representation.
//!
//! `q = clamp(round_half_even(x * (1/scale)) + zero_point, qmin, qmax)` (f32 arithmetic, as
//! PyTorch's fbgemm path) and `x = (q - zero_point) * scale`. Outputs are `uint8` (quint8) or
//! `int8` (qint8) tensors; dequantization returns float32.

use super::{check_scale, check_zero_point, quant_range, quantize_val};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{float, int, tensor};
use crate::op::{
    cost_elementwise, dispatch, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::ops::simd::simd_dispatch;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

/// Elements per parallel task.
const CHUNK: usize = 1 << 16;

/// An integer element a quantized tensor stores.
pub(crate) trait QOut: Copy + Send + Sync + crate::dtype::Element {
    /// From a value already rounded and clamped to the type's range.
    fn from_clamped(v: f32) -> Self;
    /// To f32 (exact).
    fn to_f32(self) -> f32;
}

/// The low byte of the integer `v` (`|v| <= 2^22`): `v + 1.5 * 2^23` is exact and holds `v` in
/// its low mantissa bits (two's complement modulo 2^22 for negative `v`). Unlike the saturating
/// `as` cast, which the compiler leaves scalar, this vectorises (an add and a byte truncation).
#[inline(always)]
fn low_byte(v: f32) -> u8 {
    (v + 12_582_912.0).to_bits() as u8
}

impl QOut for u8 {
    #[inline(always)]
    fn from_clamped(v: f32) -> Self {
        low_byte(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}
impl QOut for i8 {
    #[inline(always)]
    fn from_clamped(v: f32) -> Self {
        low_byte(v) as i8
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

simd_dispatch! {
    /// Quantizes `src` into `dst` (same length) with one scale and zero point.
    pub(crate) fn quantize_slice<Q: QOut>(src: &[f32], dst: &mut [Q], inv_scale: f32, zp: f32, lo: f32, hi: f32) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Q::from_clamped(quantize_val(x, inv_scale, zp, lo, hi));
        }
    }
}

simd_dispatch! {
    /// The minimum and maximum of `src` (`(+inf, -inf)` when empty) and the index of its first
    /// NaN or infinite element, if any (then min/max are meaningless). Sixteen running minima
    /// and maxima (compare-and-select, which the compiler turns into vector min/max) so the scan
    /// runs at the speed of the loads.
    pub(crate) fn min_max_finite(src: &[f32]) -> (f32, f32, Option<usize>) {
        const L: usize = 16;
        let (mut lo, mut hi, mut bad) = ([f32::INFINITY; L], [f32::NEG_INFINITY; L], [0u32; L]);
        let chunks = src.chunks_exact(L);
        let rest = chunks.remainder();
        for c in chunks {
            for (((&x, lo), hi), bad) in c.iter().zip(&mut lo).zip(&mut hi).zip(&mut bad) {
                *lo = if x < *lo { x } else { *lo };
                *hi = if x > *hi { x } else { *hi };
                *bad |= u32::from(!x.is_finite());
            }
        }
        let (mut mn, mut mx) = (f32::INFINITY, f32::NEG_INFINITY);
        for (&l, &h) in lo.iter().zip(&hi) {
            mn = if l < mn { l } else { mn };
            mx = if h > mx { h } else { mx };
        }
        let mut nonfinite = bad.iter().any(|&b| b != 0);
        for &x in rest {
            mn = if x < mn { x } else { mn };
            mx = if x > mx { x } else { mx };
            nonfinite |= !x.is_finite();
        }
        (mn, mx, if nonfinite { src.iter().position(|x| !x.is_finite()) } else { None })
    }
}

/// [`min_max_finite`] split over threads for large slices.
pub(crate) fn min_max_finite_par(src: &[f32]) -> (f32, f32, Option<usize>) {
    if src.len() < 2 * CHUNK {
        return min_max_finite(src);
    }
    // one result per chunk, folded in chunk order
    let mut parts = vec![(f32::INFINITY, f32::NEG_INFINITY, None); src.len().div_ceil(CHUNK)];
    crate::ops::team::chunks_mut(&mut parts, 1, |c, r| {
        let s = &src[c * CHUNK..((c + 1) * CHUNK).min(src.len())];
        let (lo, hi, bad) = min_max_finite(s);
        r[0] = (lo, hi, bad.map(|i| c * CHUNK + i));
    });
    parts.into_iter().fold((f32::INFINITY, f32::NEG_INFINITY, None), |a, b| {
        let bad = match (a.2, b.2) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        (if b.0 < a.0 { b.0 } else { a.0 }, if b.1 > a.1 { b.1 } else { a.1 }, bad)
    })
}

/// [`quantize_slice`] split over threads for large slices.
pub(crate) fn quantize_slice_par<Q: QOut>(src: &[f32], dst: &mut [Q], inv_scale: f32, zp: f32, lo: f32, hi: f32) {
    if dst.len() >= 2 * CHUNK {
        crate::ops::team::chunks_mut(dst, CHUNK, |i, d| {
            quantize_slice(&src[i * CHUNK..i * CHUNK + d.len()], d, inv_scale, zp, lo, hi)
        });
    } else {
        quantize_slice(src, dst, inv_scale, zp, lo, hi);
    }
}

simd_dispatch! {
    /// Dequantizes `src` into `dst` (same length) with one scale and zero point.
    fn dequantize_slice<Q: QOut>(src: &[Q], dst: &mut [f32], scale: f32, zp: f32) {
        for (d, &q) in dst.iter_mut().zip(src) {
            *d = (q.to_f32() - zp) * scale;
        }
    }
}

/// The float input as f32 (other float dtypes are converted, as PyTorch computes in f32).
fn float_input(op: &str, x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 => Ok(x.clone()),
        dt if dt.is_floating_point() => x.to_dtype(DType::F32),
        dt => Err(Error::dtype(
            op,
            format!("expected a floating point input to quantize, got {dt}; only float tensors are quantized"),
        )),
    }
}

fn check_quantized_input(op: &str, x: &Tensor) -> Result<()> {
    if !matches!(x.dtype(), DType::U8 | DType::I8) {
        return Err(Error::dtype(
            op,
            format!("expected a quantized input (uint8 or int8), got {}; dequantize takes the output of quantize_per_tensor", x.dtype()),
        ));
    }
    Ok(())
}

/// Per-tensor: `(scale, zero_point, dtype)` checked.
fn per_tensor_params(
    op: &str,
    args: &[Value],
    dtype_at: Option<usize>,
    dt_default: DType,
) -> Result<(f32, i32, DType)> {
    let dtype = match dtype_at {
        Some(i) => match args.get(i) {
            Some(Value::DType(d)) => *d,
            _ => return Err(Error::schema(op, "argument 'dtype' must be a dtype (uint8 or int8)")),
        },
        None => dt_default,
    };
    quant_range(op, dtype)?;
    let scale = check_scale(op, "scale", float(op, args, 1)?)?;
    let zp = check_zero_point(op, "zero_point", int(op, args, 2)?, dtype)?;
    Ok((scale, zp, dtype))
}

fn quantize_per_tensor_meta(args: &[Value]) -> Result<crate::op::MetaOutputs> {
    let op = "quantize_per_tensor";
    let x = tensor(op, args, 0)?;
    if !x.dtype().is_floating_point() {
        float_input(op, x)?;
    }
    let (_, _, dtype) = per_tensor_params(op, args, Some(3), DType::U8)?;
    Ok(smallvec![TensorMeta::contiguous(x.shape(), dtype)])
}

fn quantize_into<Q: QOut>(op: &str, x: &[f32], shape: &[usize], scale: f32, zp: i32) -> Result<Tensor> {
    let (lo, hi) = quant_range(op, Q::DTYPE)?;
    let mut out = crate::memory::alloc_filled::<Q>(op, shape, Q::from_clamped(0.0))?;
    let inv = 1.0f32 / scale;
    let (zp, lo, hi) = (zp as f32, lo as f32, hi as f32);
    quantize_slice_par(x, &mut out, inv, zp, lo, hi);
    Tensor::from_vec(out, shape)
}

fn quantize_per_tensor_kernel(args: &[Value]) -> Result<Outputs> {
    let op = "quantize_per_tensor";
    quantize_per_tensor_meta(args)?;
    let x = float_input(op, tensor(op, args, 0)?)?;
    let (scale, zp, dtype) = per_tensor_params(op, args, Some(3), DType::U8)?;
    let shape = x.shape().to_vec();
    let out = x.with_contiguous::<f32, _>(op, |s| match dtype {
        DType::U8 => quantize_into::<u8>(op, s, &shape, scale, zp),
        _ => quantize_into::<i8>(op, s, &shape, scale, zp),
    })??;
    Ok(smallvec![out])
}

/// `quantize_per_tensor(input, scale, zero_point, dtype)`: float → uint8/int8 with one scale
/// and zero point (`torch.quantize_per_tensor`, with `uint8`/`int8` for `quint8`/`qint8`).
pub static QUANTIZE_PER_TENSOR: OpDef = OpDef {
    name: "quantize_per_tensor",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("scale", T::Float),
        ArgSpec::req("zero_point", T::Int),
        ArgSpec::opt("dtype", T::DType, D::DType(DType::U8)),
    ],
    meta: quantize_per_tensor_meta,
    kernel: quantize_per_tensor_kernel,
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Affine quantization with one scale and zero point: clamp(round_half_even(x / scale) + zero_point).",
};

/// Per-channel parameters checked against the input: `(scales, zero points, axis)`.
fn per_channel_params(op: &str, args: &[Value], x: &Tensor, dtype: DType) -> Result<(Vec<f32>, Vec<i32>, usize)> {
    let nd = x.ndim() as i64;
    let axis = int(op, args, 3)?;
    if nd == 0 || axis < -nd || axis >= nd {
        return Err(Error::index(
            op,
            format!("axis {axis} is out of range for an input of shape {:?} (expected -{nd}..{nd})", x.shape()),
        ));
    }
    let axis = if axis < 0 { (axis + nd) as usize } else { axis as usize };
    let c = x.shape()[axis];
    let scales = tensor(op, args, 1)?;
    let zps = tensor(op, args, 2)?;
    if scales.ndim() != 1 || scales.numel() != c || zps.ndim() != 1 || zps.numel() != c {
        return Err(Error::shape(
            op,
            format!(
                "scales and zero_points must be 1-D with one value per channel of axis {axis} (size {c}) of input {:?}, got scales {:?} and zero_points {:?}",
                x.shape(),
                scales.shape(),
                zps.shape()
            ),
        ));
    }
    if !scales.dtype().is_floating_point() {
        return Err(Error::dtype(op, format!("scales must be a floating point tensor, got {}", scales.dtype())));
    }
    if !zps.dtype().is_integral() {
        return Err(Error::dtype(op, format!("zero_points must be an integer tensor, got {}", zps.dtype())));
    }
    if scales.is_symbolic() || zps.is_symbolic() {
        return Ok((Vec::new(), Vec::new(), axis));
    }
    let s = scales.to_vec_f64()?;
    let z = zps.to_vec_f64()?;
    let mut sv = Vec::with_capacity(c);
    let mut zv = Vec::with_capacity(c);
    for i in 0..c {
        sv.push(check_scale(op, &format!("scales[{i}]"), s[i])?);
        zv.push(check_zero_point(op, &format!("zero_points[{i}]"), z[i] as i64, dtype)?);
    }
    Ok((sv, zv, axis))
}

fn quantize_per_channel_meta(args: &[Value]) -> Result<crate::op::MetaOutputs> {
    let op = "quantize_per_channel";
    let x = tensor(op, args, 0)?;
    if !x.dtype().is_floating_point() {
        float_input(op, x)?;
    }
    let dtype = match args.get(4) {
        Some(Value::DType(d)) => *d,
        _ => return Err(Error::schema(op, "argument 'dtype' must be a dtype (uint8 or int8)")),
    };
    quant_range(op, dtype)?;
    per_channel_params(op, args, x, dtype)?;
    Ok(smallvec![TensorMeta::contiguous(x.shape(), dtype)])
}

/// Splits a contiguous shape around `axis`: (outer, channels, inner).
fn split_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

fn quantize_channels<Q: QOut>(
    op: &str,
    x: &[f32],
    shape: &[usize],
    axis: usize,
    s: &[f32],
    z: &[i32],
) -> Result<Tensor> {
    let (lo, hi) = quant_range(op, Q::DTYPE)?;
    let mut out = crate::memory::alloc_filled::<Q>(op, shape, Q::from_clamped(0.0))?;
    let (_, c, inner) = split_axis(shape, axis);
    if inner > 0 && c > 0 {
        let block = c * inner;
        let run = |(d, src): (&mut [Q], &[f32])| {
            for ch in 0..c {
                let r = ch * inner..(ch + 1) * inner;
                quantize_slice(&src[r.clone()], &mut d[r], 1.0 / s[ch], z[ch] as f32, lo as f32, hi as f32);
            }
        };
        if out.len() >= 2 * CHUNK {
            crate::ops::team::chunks_mut(&mut out, block, |i, d| run((d, &x[i * block..(i + 1) * block])));
        } else {
            out.chunks_mut(block).zip(x.chunks(block)).for_each(run);
        }
    }
    Tensor::from_vec(out, shape)
}

fn quantize_per_channel_kernel(args: &[Value]) -> Result<Outputs> {
    let op = "quantize_per_channel";
    quantize_per_channel_meta(args)?;
    let x = float_input(op, tensor(op, args, 0)?)?;
    let Some(Value::DType(dtype)) = args.get(4) else {
        return Err(Error::schema(op, "argument 'dtype' must be a dtype"));
    };
    let (s, z, axis) = per_channel_params(op, args, &x, *dtype)?;
    let shape = x.shape().to_vec();
    let out = x.with_contiguous::<f32, _>(op, |v| match dtype {
        DType::U8 => quantize_channels::<u8>(op, v, &shape, axis, &s, &z),
        _ => quantize_channels::<i8>(op, v, &shape, axis, &s, &z),
    })??;
    Ok(smallvec![out])
}

/// `quantize_per_channel(input, scales, zero_points, axis, dtype)`: one scale and zero point per
/// slice along `axis` (`torch.quantize_per_channel`; weights use `axis=0`, int8, zero points 0).
pub static QUANTIZE_PER_CHANNEL: OpDef = OpDef {
    name: "quantize_per_channel",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("scales", T::Tensor),
        ArgSpec::req("zero_points", T::Tensor),
        ArgSpec::req("axis", T::Int),
        ArgSpec::req("dtype", T::DType),
    ],
    meta: quantize_per_channel_meta,
    kernel: quantize_per_channel_kernel,
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Affine quantization with one scale and zero point per channel of `axis`.",
};

fn dequantize_meta(args: &[Value]) -> Result<crate::op::MetaOutputs> {
    let op = "dequantize";
    let x = tensor(op, args, 0)?;
    check_quantized_input(op, x)?;
    per_tensor_params(op, args, None, x.dtype())?;
    Ok(smallvec![TensorMeta::contiguous(x.shape(), DType::F32)])
}

fn dequantize_into<Q: QOut>(op: &str, q: &[Q], shape: &[usize], scale: f32, zp: i32) -> Result<Tensor> {
    let mut out = crate::memory::alloc_filled::<f32>(op, shape, 0.0)?;
    if out.len() >= 2 * CHUNK {
        crate::ops::team::chunks_mut(&mut out, CHUNK, |i, d| {
            dequantize_slice(&q[i * CHUNK..i * CHUNK + d.len()], d, scale, zp as f32)
        });
    } else {
        dequantize_slice(q, &mut out, scale, zp as f32);
    }
    Tensor::from_vec(out, shape)
}

fn dequantize_kernel(args: &[Value]) -> Result<Outputs> {
    let op = "dequantize";
    dequantize_meta(args)?;
    let x = tensor(op, args, 0)?;
    let (scale, zp, _) = per_tensor_params(op, args, None, x.dtype())?;
    let shape = x.shape().to_vec();
    let out = match x.dtype() {
        DType::U8 => x.with_contiguous::<u8, _>(op, |s| dequantize_into(op, s, &shape, scale, zp))??,
        _ => x.with_contiguous::<i8, _>(op, |s| dequantize_into(op, s, &shape, scale, zp))??,
    };
    Ok(smallvec![out])
}

/// `dequantize(input, scale, zero_point)`: uint8/int8 → float32, `(q - zero_point) * scale`.
pub static DEQUANTIZE: OpDef = OpDef {
    name: "dequantize",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("scale", T::Float), ArgSpec::req("zero_point", T::Int)],
    meta: dequantize_meta,
    kernel: dequantize_kernel,
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Float32 values of an affinely quantized tensor: (q - zero_point) * scale.",
};

fn dequantize_per_channel_meta(args: &[Value]) -> Result<crate::op::MetaOutputs> {
    let op = "dequantize_per_channel";
    let x = tensor(op, args, 0)?;
    check_quantized_input(op, x)?;
    per_channel_params(op, args, x, x.dtype())?;
    Ok(smallvec![TensorMeta::contiguous(x.shape(), DType::F32)])
}

fn dequantize_channels<Q: QOut>(
    op: &str,
    q: &[Q],
    shape: &[usize],
    axis: usize,
    s: &[f32],
    z: &[i32],
) -> Result<Tensor> {
    let mut out = crate::memory::alloc_filled::<f32>(op, shape, 0.0)?;
    let (_, c, inner) = split_axis(shape, axis);
    if inner > 0 && c > 0 {
        let block = c * inner;
        for (d, src) in out.chunks_mut(block).zip(q.chunks(block)) {
            for ch in 0..c {
                let r = ch * inner..(ch + 1) * inner;
                dequantize_slice(&src[r.clone()], &mut d[r], s[ch], z[ch] as f32);
            }
        }
    }
    Tensor::from_vec(out, shape)
}

fn dequantize_per_channel_kernel(args: &[Value]) -> Result<Outputs> {
    let op = "dequantize_per_channel";
    dequantize_per_channel_meta(args)?;
    let x = tensor(op, args, 0)?;
    let (s, z, axis) = per_channel_params(op, args, x, x.dtype())?;
    let shape = x.shape().to_vec();
    let out = match x.dtype() {
        DType::U8 => x.with_contiguous::<u8, _>(op, |v| dequantize_channels(op, v, &shape, axis, &s, &z))??,
        _ => x.with_contiguous::<i8, _>(op, |v| dequantize_channels(op, v, &shape, axis, &s, &z))??,
    };
    Ok(smallvec![out])
}

/// `dequantize_per_channel(input, scales, zero_points, axis)`: the inverse of
/// `quantize_per_channel`, to float32.
pub static DEQUANTIZE_PER_CHANNEL: OpDef = OpDef {
    name: "dequantize_per_channel",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("scales", T::Tensor),
        ArgSpec::req("zero_points", T::Tensor),
        ArgSpec::req("axis", T::Int),
    ],
    meta: dequantize_per_channel_meta,
    kernel: dequantize_per_channel_kernel,
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Float32 values of a per-channel quantized tensor.",
};

fn first(op: &str, mut out: Outputs) -> Result<Tensor> {
    out.pop().ok_or_else(|| Error::schema(op, "op returned no output"))
}

/// `torch.quantize_per_tensor(input, scale, zero_point, dtype)` with `dtype` `uint8` (quint8)
/// or `int8` (qint8).
///
/// ```
/// use ferrofx_core::{ops::quantized::{dequantize, quantize_per_tensor}, DType, Tensor};
/// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 0.25, 0.75, 200.0], &[5]).unwrap();
/// let q = quantize_per_tensor(&x, 0.5, 10, DType::U8).unwrap();
/// // 0.25 / 0.5 = 0.5 rounds half to even (0), 0.75 / 0.5 = 1.5 rounds to 2; 200 clamps to 255
/// assert_eq!(q.to_vec::<u8>().unwrap(), vec![8, 10, 10, 12, 255]);
/// assert_eq!(dequantize(&q, 0.5, 10).unwrap().to_vec::<f32>().unwrap(), vec![-1.0, 0.0, 0.0, 1.0, 122.5]);
/// ```
pub fn quantize_per_tensor(input: &Tensor, scale: f64, zero_point: i64, dtype: DType) -> Result<Tensor> {
    let args = [input.into(), scale.into(), zero_point.into(), dtype.into()];
    first("quantize_per_tensor", dispatch(&QUANTIZE_PER_TENSOR, CallKind::Function, &args)?)
}

/// `torch.quantize_per_channel(input, scales, zero_points, axis, dtype)`.
pub fn quantize_per_channel(
    input: &Tensor,
    scales: &Tensor,
    zero_points: &Tensor,
    axis: i64,
    dtype: DType,
) -> Result<Tensor> {
    let args = [input.into(), scales.into(), zero_points.into(), axis.into(), dtype.into()];
    first("quantize_per_channel", dispatch(&QUANTIZE_PER_CHANNEL, CallKind::Function, &args)?)
}

/// `dequantize(input, scale, zero_point)`: float32 values of a per-tensor quantized tensor.
pub fn dequantize(input: &Tensor, scale: f64, zero_point: i64) -> Result<Tensor> {
    let args = [input.into(), scale.into(), zero_point.into()];
    first("dequantize", dispatch(&DEQUANTIZE, CallKind::Function, &args)?)
}

/// `dequantize_per_channel(input, scales, zero_points, axis)`: float32 values of a per-channel
/// quantized tensor.
pub fn dequantize_per_channel(input: &Tensor, scales: &Tensor, zero_points: &Tensor, axis: i64) -> Result<Tensor> {
    let args = [input.into(), scales.into(), zero_points.into(), axis.into()];
    first("dequantize_per_channel", dispatch(&DEQUANTIZE_PER_CHANNEL, CallKind::Function, &args)?)
}
