//! Quantized (int8) ops: affine quantization of float tensors and integer compute kernels with
//! fused requantisation.
//!
//! ferrofx tensors carry no quantization parameters: a quantized activation is a plain `uint8`
//! tensor (PyTorch's `quint8`) and a quantized weight a plain `int8` tensor (`qint8`); the scale
//! and zero point travel as op arguments, so a graph shows them on every node that uses them.
//! The conventions are `torch.ao.quantization`'s:
//! - `q = clamp(round_half_even(x * (1 / scale)) + zero_point, qmin, qmax)` with `1 / scale`
//!   computed in f32 (fbgemm's `Quantize`), `x = (q - zero_point) * scale` back;
//! - activations `uint8` affine (any zero point in `0..=255`), weights `int8` symmetric
//!   (zero point 0), per output channel or per tensor;
//! - `quantized_linear`/`quantized_conv2d` accumulate `u8 x s8` products in `i32`, subtract
//!   `input_zero_point * sum(weight row)`, add `bias / (input_scale * weight_scale)` in f32,
//!   multiply by `input_scale * weight_scale / output_scale`, round half to even, add the
//!   output zero point and clamp (to `output_zero_point..=255` with the fused ReLU), as fbgemm's
//!   requantisation does.
//!
//! The integer kernels have a portable reference implementation, an AVX-512 VNNI path
//! (`vpdpbusd`: u8 x s8 products summed into i32 without the i16 saturation of AVX2's
//! `vpmaddubsw`, so activations keep all 8 bits) and an AVX2 path (`vpmaddwd` on bytes widened
//! to i16, also exact); all give bit-identical results
//! ([`with_reference_kernels`] forces the reference for a comparison, [`int8_kernel`] names the
//! path in use). None of these ops is differentiable: a backward through one is an autograd
//! error naming the op.

mod adaptive_avg_pool2d;
mod add;
mod channels_last;
mod conv2d;
mod conv2d_add;
#[cfg(target_arch = "x86_64")]
mod conv2d_amx;
#[cfg(target_arch = "x86_64")]
mod conv2d_im2col;
#[cfg(target_arch = "x86_64")]
mod conv2d_lanes;
mod conv2d_packed;
#[cfg(target_arch = "x86_64")]
mod conv2d_s2d;
mod gemm;
mod linear;
#[cfg(target_arch = "x86_64")]
mod linear_amx;
mod linear_dynamic;
mod linear_packed;
mod max_pool2d;
mod quantize;

pub use adaptive_avg_pool2d::{quantized_adaptive_avg_pool2d, QUANTIZED_ADAPTIVE_AVG_POOL2D};
pub use add::{quantized_add, QUANTIZED_ADD};
pub use conv2d::{quantized_conv2d, QuantizedConv2dArgs, QUANTIZED_CONV2D};
pub use conv2d_add::{quantized_conv2d_add, ResidualAdd, QUANTIZED_CONV2D_ADD};
pub use gemm::{int8_kernel, int8_kernels_available, with_int8_kernel, with_reference_kernels};
pub use linear::{quantized_linear, QUANTIZED_LINEAR};
pub use linear_dynamic::{choose_qparams, quantized_linear_dynamic, QUANTIZED_LINEAR_DYNAMIC};
pub(crate) use max_pool2d::max_pool2d_channels_last;
pub use quantize::{
    dequantize, dequantize_per_channel, quantize_per_channel, quantize_per_tensor, DEQUANTIZE, DEQUANTIZE_PER_CHANNEL,
    QUANTIZE_PER_CHANNEL, QUANTIZE_PER_TENSOR,
};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::OpDef;
use crate::tensor::Tensor;

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &QUANTIZE_PER_TENSOR,
    &QUANTIZE_PER_CHANNEL,
    &DEQUANTIZE,
    &DEQUANTIZE_PER_CHANNEL,
    &QUANTIZED_LINEAR,
    &QUANTIZED_LINEAR_DYNAMIC,
    &QUANTIZED_CONV2D,
    &QUANTIZED_CONV2D_ADD,
    &QUANTIZED_ADD,
    &QUANTIZED_ADAPTIVE_AVG_POOL2D,
];

/// The integer range of a quantized dtype: `uint8` → `0..=255`, `int8` → `-128..=127`.
///
/// ```
/// use ferrofx_core::{ops::quantized::quant_range, DType};
/// assert_eq!(quant_range("quantize_per_tensor", DType::U8).unwrap(), (0, 255));
/// assert!(quant_range("quantize_per_tensor", DType::F32).is_err());
/// ```
pub fn quant_range(op: &str, dtype: DType) -> Result<(i32, i32)> {
    match dtype {
        DType::U8 => Ok((0, 255)),
        DType::I8 => Ok((-128, 127)),
        other => {
            Err(Error::dtype(op, format!("expected a quantized dtype (uint8 for quint8, int8 for qint8), got {other}")))
        }
    }
}

/// Checks a scale: finite and positive (the float32 value, as the kernels use it).
pub(crate) fn check_scale(op: &str, what: &str, scale: f64) -> Result<f32> {
    let s = scale as f32;
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::argument(
            op,
            format!("{what} must be a positive finite float32, got {scale}; compute it with an observer's calculate_qparams"),
        ));
    }
    Ok(s)
}

/// Checks a zero point lies in the dtype's range.
pub(crate) fn check_zero_point(op: &str, what: &str, zp: i64, dtype: DType) -> Result<i32> {
    let (lo, hi) = quant_range(op, dtype)?;
    if zp < lo as i64 || zp > hi as i64 {
        return Err(Error::argument(op, format!("{what} must be in {lo}..={hi} for {dtype}, got {zp}")));
    }
    Ok(zp as i32)
}

/// Checks a tensor's dtype.
pub(crate) fn expect_dtype(op: &str, what: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        let hint = match dtype {
            DType::U8 => "quantize it with quantize_per_tensor(x, scale, zero_point, uint8) first",
            DType::I8 => "quantize weights with quantize_per_channel(w, scales, zeros, 0, int8)",
            _ => "convert it with to_dtype",
        };
        return Err(Error::dtype(op, format!("{what} must be {dtype}, got {} ({hint})", t.dtype())));
    }
    Ok(())
}

/// Checks the shape and dtype of a per-output-channel float parameter (`weight_scale`, `bias`):
/// 1-D floating of length `n` (or of length 1 when `broadcast_one` allows a per-tensor value).
pub(crate) fn check_channel_param(op: &str, what: &str, t: &Tensor, n: usize, broadcast_one: bool) -> Result<()> {
    if !t.dtype().is_floating_point() {
        return Err(Error::dtype(op, format!("{what} must be a floating point tensor, got {}", t.dtype())));
    }
    let len = t.numel();
    if t.ndim() > 1 || !(len == n || (broadcast_one && len == 1)) {
        let allowed = if broadcast_one { format!("[{n}] (or [1])") } else { format!("[{n}]") };
        return Err(Error::shape(
            op,
            format!("{what} must have shape {allowed}, one value per output channel, got {:?}", t.shape()),
        ));
    }
    Ok(())
}

/// A per-output-channel float parameter as `n` f32 values (checked as [`check_channel_param`]).
pub(crate) fn channel_floats(op: &str, what: &str, t: &Tensor, n: usize, broadcast_one: bool) -> Result<Vec<f32>> {
    check_channel_param(op, what, t, n, broadcast_one)?;
    let v = t.to_vec_f64()?;
    let mut out = crate::memory::try_vec(op, n, 0f32)?;
    for (i, o) in out.iter_mut().enumerate() {
        *o = v[if v.len() == 1 { 0 } else { i }] as f32;
    }
    Ok(out)
}

/// `round_half_even(x * inv_scale) + zero_point`, clamped to `lo..=hi` (fbgemm's `Quantize`,
/// non-legacy: the zero point is added after rounding). NaN quantizes to `lo` (PyTorch leaves
/// it to the float→int conversion; a calibrated observer refuses NaN before it gets here).
#[inline(always)]
pub(crate) fn quantize_val(x: f32, inv_scale: f32, zp: f32, lo: f32, hi: f32) -> f32 {
    let v = (x * inv_scale).round_ties_even() + zp;
    // max/min ignore NaN in Rust (NaN → lo); written so LLVM vectorises them
    v.max(lo).min(hi)
}
