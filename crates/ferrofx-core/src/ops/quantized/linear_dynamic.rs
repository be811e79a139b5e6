//! `quantized_linear_dynamic`: `y = x W^T + b` with a float input and output and int8 weights,
//! the input quantized per call (PyTorch's `quantized::linear_dynamic` with the fbgemm backend,
//! the op of `torch.ao.quantization.quantize_dynamic`'s `Linear`).
//!
//! Per call: the input's range (widened to include 0) gives a uint8 scale and zero point with
//! fbgemm's `ChooseQuantizationParams` ([`choose_qparams`]); the input is quantized with them
//! (`round_half_even(x * (1 / scale)) + zero_point`, as `quantize_per_tensor`); the u8 x s8 GEMM
//! of `quantized_linear` accumulates in i32, and the epilogue dequantizes each sum to f32:
//! `fma(acc - zero_point * sum(weight row), scale * w_scale, bias)` (fbgemm's
//! `ReQuantizeForFloat`, one rounding). The result is float32.
//!
//! Per call the work besides the GEMM is two vectorised passes over the input (min/max, then
//! quantize; both split over threads for large inputs); the allocations besides the output are
//! the u8 activations and the O(N) per-channel scales and bias. The weight is packed and its row sums computed once (cached on its
//! storage, see `linear_packed.rs`).

use super::channel_floats;
use super::gemm::{reference_gemm, row_sums, DequantOut, Operands, Path};
use super::linear_packed::{linear_packed, packed_weight};
use super::quantize::{min_max_finite_par, quantize_slice_par};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{bool_, opt_tensor, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

const OP: &str = "quantized_linear_dynamic";

/// Scales below this are raised to it (fbgemm's `SMALL_SCALE_THRESHOLD`).
const SMALL_SCALE_THRESHOLD: f32 = 6.1e-5;

/// fbgemm's `ChooseQuantizationParams(min, max, 0, 255, preserve_sparsity=false,
/// force_scale_power_of_two=false, reduce_range)`: the uint8 scale and zero point PyTorch's
/// dynamic linear quantizes its input with. The range is widened to include 0; `reduce_range`
/// halves the integer range to `0..=127` (PyTorch's `quantize_dynamic` sets it on x86, for
/// AVX2's 16-bit intermediate sums; ferrofx's kernels are exact without it). `min`/`max` must be
/// finite with `min <= max`.
///
/// ```
/// use ferrofx_core::ops::quantized::choose_qparams;
/// // [-1, 3] over 255 steps: scale 4/255, zero point round(255/4) = 64
/// assert_eq!(choose_qparams(-1.0, 3.0, false), ((4.0f64 / 255.0) as f32, 64));
/// assert_eq!(choose_qparams(0.0, 0.0, false), (0.1, 0)); // all zeros: PyTorch's fallback scale
/// ```
pub fn choose_qparams(min: f32, max: f32, reduce_range: bool) -> (f32, i32) {
    let (mut qmin, mut qmax) = (0i32, 255i32);
    if reduce_range {
        qmin /= 2;
        qmax /= 2;
    }
    let mut min = min.min(0.0);
    let mut max = max.max(0.0);
    let mut scale = (max as f64 - min as f64) / (qmax - qmin) as f64;
    if scale as f32 == 0.0 || (1.0f32 / scale as f32).is_infinite() {
        scale = 0.1;
    }
    if scale < SMALL_SCALE_THRESHOLD as f64 {
        let org = scale as f32;
        scale = SMALL_SCALE_THRESHOLD as f64;
        if min == 0.0 {
            max = SMALL_SCALE_THRESHOLD * (qmax - qmin) as f32;
        } else if max == 0.0 {
            min = -SMALL_SCALE_THRESHOLD * (qmax - qmin) as f32;
        } else {
            let amplifier = SMALL_SCALE_THRESHOLD / org;
            min *= amplifier;
            max *= amplifier;
        }
    }
    let zp_from_min = qmin as f64 - min as f64 / scale;
    let zp_from_max = qmax as f64 - max as f64 / scale;
    let zp_from_min_error = (qmin as f64).abs() - (min as f64 / scale).abs();
    let zp_from_max_error = (qmax as f64).abs() - (max as f64 / scale).abs();
    let initial = if zp_from_min_error < zp_from_max_error { zp_from_min } else { zp_from_max };
    let zp = if initial < qmin as f64 {
        qmin
    } else if initial > qmax as f64 {
        qmax
    } else {
        initial.round_ties_even() as i32
    };
    (scale as f32, zp)
}

/// Shapes checked: `(M, K, N, output shape)`.
fn check(args: &[Value]) -> Result<(usize, usize, usize, Vec<usize>)> {
    let x = tensor(OP, args, 0)?;
    if !x.dtype().is_floating_point() {
        return Err(Error::dtype(
            OP,
            format!("input must be a floating point tensor (it is quantized per call), got {}", x.dtype()),
        ));
    }
    super::linear::check_weight(OP, x, args, 1)
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    let (m, k, n, shape) = check(args)?;
    let x = tensor(OP, args, 0)?;
    let x = if x.dtype() == DType::F32 { x.clone() } else { x.to_dtype(DType::F32)? };
    let w = tensor(OP, args, 1)?;
    #[cfg(target_arch = "x86_64")]
    if Path::select() == Path::Amx && super::linear_amx::applies(k, n) {
        return amx_kernel(&x, w, args, (m, k, n), &shape);
    }
    let path = Path::select().vector();
    // the weight packed once (cached on its storage) for the fast paths; its row sums
    let packed = if path == Path::Reference { None } else { Some(packed_weight(OP, w, n, k)?) };
    let cols = packed.as_ref().map_or(n, |p| p.padded());
    // per-channel parameters, zero-padded to the channels the kernels read
    let mut w_scale = channel_floats(OP, "weight_scale", tensor(OP, args, 2)?, n, true)?;
    w_scale.resize(cols, 0.0);
    let mut bias = match opt_tensor(OP, args, 3)? {
        Some(b) => channel_floats(OP, "bias", b, n, false)?,
        None => crate::memory::try_vec(OP, n, 0f32)?,
    };
    bias.resize(cols, 0.0);
    let reduce_range = bool_(OP, args, 4)?;
    let mut out = crate::memory::alloc_filled::<f32>(OP, &shape, 0.0)?;
    x.with_contiguous::<f32, _>(OP, |xv| -> Result<()> {
        let (scale, zp) = input_qparams(&x, xv, reduce_range)?;
        // the u8 activations, with the k-quad slack the packed kernels read past the last row
        let mut xq = crate::memory::try_vec(OP, xv.len() + 3, 0u8)?;
        quantize_slice_par(xv, &mut xq[..xv.len()], 1.0f32 / scale, zp as f32, 0.0, 255.0);
        // w_scale becomes `scale * w_scale[j]` (fbgemm's act_times_w_scale, f32)
        w_scale.iter_mut().for_each(|s| *s *= scale);
        match &packed {
            Some(pw) => {
                let e = DequantOut { a_zp: zp, b_sums: &pw.sums, scale: &w_scale, bias: &bias };
                linear_packed(path, &xq, m, pw, &e, &mut out);
                Ok(())
            }
            None => w.with_contiguous::<i8, _>(OP, |wv| {
                let sums = row_sums(wv, k, n, k);
                let e = DequantOut { a_zp: zp, b_sums: &sums, scale: &w_scale, bias: &bias };
                let p = Operands { a: &xq, lda: k, b: wv, ldb: k, m, n, k };
                reference_gemm(&p, &e, &mut out, n, 1);
            }),
        }
    })??;
    Ok(smallvec![Tensor::from_vec(out, &shape)?])
}

/// The input's quantization parameters (an error naming a NaN or infinite element).
fn input_qparams(x: &Tensor, xv: &[f32], reduce_range: bool) -> Result<(f32, i32)> {
    let (lo, hi, bad) = min_max_finite_par(xv);
    if let Some(i) = bad {
        return Err(Error::argument(
            OP,
            format!(
                "input {:?} holds a NaN or infinite value (element {i}: {}): a dynamically quantized linear cannot represent it; keep this layer in float",
                x.shape(),
                xv[i]
            ),
        ));
    }
    Ok(if xv.is_empty() { choose_qparams(0.0, 0.0, reduce_range) } else { choose_qparams(lo, hi, reduce_range) })
}

/// The AMX path (`linear_amx.rs`): the input quantized into the tiles' aligned, row-padded
/// buffer, the weight as cached B tiles; the same parameters and epilogue as the other paths.
#[cfg(target_arch = "x86_64")]
fn amx_kernel(
    x: &Tensor,
    w: &Tensor,
    args: &[Value],
    (m, k, n): (usize, usize, usize),
    shape: &[usize],
) -> Result<Outputs> {
    use super::linear_amx;
    let pw = linear_amx::weight(OP, w, n, k)?;
    let mut w_scale = channel_floats(OP, "weight_scale", tensor(OP, args, 2)?, n, true)?;
    let bias = match opt_tensor(OP, args, 3)? {
        Some(b) => channel_floats(OP, "bias", b, n, false)?,
        None => crate::memory::try_vec(OP, n, 0f32)?,
    };
    let reduce_range = bool_(OP, args, 4)?;
    let numel = m * n;
    let mut out = crate::memory::alloc_uninit::<f32>(OP, shape)?;
    let mut xq = linear_amx::activations(OP, m, k)?;
    x.with_contiguous::<f32, _>(OP, |xv| -> Result<()> {
        let (scale, zp) = input_qparams(x, xv, reduce_range)?;
        quantize_slice_par(xv, &mut xq.as_mut_slice()[..xv.len()], 1.0f32 / scale, zp as f32, 0.0, 255.0);
        // `scale * w_scale[j]` (fbgemm's act_times_w_scale, f32)
        w_scale.iter_mut().for_each(|s| *s *= scale);
        let e = DequantOut { a_zp: zp, b_sums: &pw.sums, scale: &w_scale, bias: &bias };
        linear_amx::linear_f32(xq.as_slice(), m, k, &pw, n, &e, &mut out.spare_capacity_mut()[..numel]);
        // SAFETY: `linear_f32` wrote all `m * n` outputs (every row, every column below `n`),
        // and `numel` is the capacity `alloc_uninit` reserved
        unsafe { out.set_len(numel) };
        Ok(())
    })??;
    Ok(smallvec![Tensor::from_vec(out, shape)?])
}

fn cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let (Ok(x), Ok(w)) = (tensor(OP, args, 0), tensor(OP, args, 1)) else {
        return Cost::default();
    };
    let n = w.shape().first().copied().unwrap_or(0) as u64;
    let mk = x.numel() as u64;
    let out: u64 = outs.iter().map(|o| o.nbytes() as u64).sum();
    Cost {
        // the GEMM, plus the min/max scan and the quantization of the input
        flops: mk.saturating_mul(n).saturating_mul(2).saturating_add(mk.saturating_mul(3)),
        bytes: (x.numel() as u64)
            .saturating_mul(4)
            .saturating_add(mk)
            .saturating_add(w.numel() as u64)
            .saturating_add(out),
    }
}

/// `quantized_linear_dynamic(input, weight, weight_scale, bias, reduce_range=False)`: float
/// `[..., in]` quantized per call to uint8, × int8 `[out, in]` (symmetric, per output channel
/// or per tensor) + float bias → float32 `[..., out]`.
pub static QUANTIZED_LINEAR_DYNAMIC: OpDef = OpDef {
    name: "quantized_linear_dynamic",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::req("weight_scale", T::Tensor),
        ArgSpec::req("bias", T::OptTensor),
        ArgSpec::opt("reduce_range", T::Bool, D::Bool(false)),
    ],
    meta: |args| {
        let (_, _, _, shape) = check(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, DType::F32)])
    },
    kernel,
    cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Dynamically quantized linear: float input quantized to uint8 per call, int8 weight (i32 accumulate), dequantized to float32.",
};

/// `quantized_linear_dynamic` (see [`QUANTIZED_LINEAR_DYNAMIC`]); `weight_scale` has one value
/// per output feature (or one for the tensor); the weight's zero point is 0.
///
/// ```
/// use ferrofx_core::{ops::quantized::quantized_linear_dynamic, Tensor};
/// // x = [0, 2.55] → scale 0.01, zero point 0, q = [0, 255]; W = [[1, 2]] * 0.5
/// let x = Tensor::from_vec(vec![0.0f32, 2.55], &[1, 2]).unwrap();
/// let w = Tensor::from_vec(vec![1i8, 2], &[1, 2]).unwrap();
/// let ws = Tensor::from_vec(vec![0.5f32], &[1]).unwrap();
/// let b = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
/// let y = quantized_linear_dynamic(&x, &w, &ws, Some(&b), false).unwrap();
/// let y = y.to_vec::<f32>().unwrap()[0];
/// assert!((y - (2.55 * 1.0 + 1.0)).abs() < 1e-5, "{y}"); // 2.55 * (2 * 0.5) + 1
/// ```
pub fn quantized_linear_dynamic(
    input: &Tensor,
    weight: &Tensor,
    weight_scale: &Tensor,
    bias: Option<&Tensor>,
    reduce_range: bool,
) -> Result<Tensor> {
    let args = [input.into(), weight.into(), weight_scale.into(), bias.into(), reduce_range.into()];
    let mut out = dispatch(&QUANTIZED_LINEAR_DYNAMIC, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
