//! `quantized_add`: elementwise sum of two uint8 tensors with their own scales and zero points,
//! requantised to uint8 (PyTorch's `quantized::add` / `add_relu`): both sides are dequantized
//! to f32, added (ReLU'd when fused) and quantized with the output's parameters.

use super::channels_last;
use super::quantize::QOut;
use super::{check_scale, check_zero_point, expect_dtype, quantize_val};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{bool_, float, int, tensor};
use crate::op::{
    cost_elementwise, dispatch, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::ops::simd::simd_dispatch;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

const OP: &str = "quantized_add";

/// The parameters of one call, in f32.
#[derive(Debug, Clone, Copy)]
pub(super) struct Params {
    pub(super) sa: f32,
    /// `-zero_point * scale` of `input` (f32).
    pub(super) pa: f32,
    pub(super) sb: f32,
    /// `-zero_point * scale` of `other`.
    pub(super) pb: f32,
    pub(super) inv_out: f32,
    pub(super) zo: f32,
    pub(super) relu: bool,
}

simd_dispatch! {
    pub(super) fn add_slices(a: &[u8], b: &[u8], out: &mut [u8], p: Params) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            // PyTorch's vectorised dequantisation: fma(scale, q, -zero_point * scale)
            let s = p.sa.mul_add(x as f32, p.pa) + p.sb.mul_add(y as f32, p.pb);
            let s = if p.relu { s.max(0.0) } else { s };
            // the value is an integer in 0..=255: `from_clamped` converts it with vector
            // instructions (the saturating `as u8` cast stays scalar)
            *o = u8::from_clamped(quantize_val(s, p.inv_out, p.zo, 0.0, 255.0));
        }
    }
}

fn check(args: &[Value]) -> Result<Params> {
    let a = tensor(OP, args, 0)?;
    let b = tensor(OP, args, 3)?;
    expect_dtype(OP, "input", a, DType::U8)?;
    expect_dtype(OP, "other", b, DType::U8)?;
    if a.shape() != b.shape() {
        return Err(Error::shape(
            OP,
            format!(
                "input {:?} and other {:?} must have the same shape (quantized add does not broadcast; expand and quantize the smaller side first)",
                a.shape(),
                b.shape()
            ),
        ));
    }
    params(OP, args, [1, 2, 4, 5, 6, 7, 8])
}

/// The checked parameters of an add whose input scale, input zero point, other's scale and zero
/// point, output scale and zero point and `relu` are the arguments at `at` (of `op`).
pub(super) fn params(op: &str, args: &[Value], at: [usize; 7]) -> Result<Params> {
    let sa = check_scale(op, "input_scale", float(op, args, at[0])?)?;
    let za = check_zero_point(op, "input_zero_point", int(op, args, at[1])?, DType::U8)?;
    let sb = check_scale(op, "other_scale", float(op, args, at[2])?)?;
    let zb = check_zero_point(op, "other_zero_point", int(op, args, at[3])?, DType::U8)?;
    let so = check_scale(op, "output_scale", float(op, args, at[4])?)?;
    let zo = check_zero_point(op, "output_zero_point", int(op, args, at[5])?, DType::U8)?;
    Ok(Params {
        sa,
        pa: sa * -(za as f32),
        sb,
        pb: sb * -(zb as f32),
        inv_out: 1.0 / so,
        zo: zo as f32,
        relu: bool_(op, args, at[6])?,
    })
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    let p = check(args)?;
    Ok(smallvec![add_tensors(tensor(OP, args, 0)?, tensor(OP, args, 3)?, p)?])
}

/// The quantized sum of `a` and `b` (same shape, checked by the caller): channels-last when
/// both are, row-major otherwise.
pub(super) fn add_tensors(a: &Tensor, b: &Tensor, p: Params) -> Result<Tensor> {
    let shape = a.shape().to_vec();
    let mut out = crate::memory::alloc_filled::<u8>(OP, &shape, 0)?;
    const CHUNK: usize = 1 << 16;
    let mut add = |av: &[u8], bv: &[u8]| {
        if out.len() >= 2 * CHUNK {
            crate::ops::team::chunks_mut(&mut out, CHUNK, |i, o| {
                let r = i * CHUNK..i * CHUNK + o.len();
                add_slices(&av[r.clone()], &bv[r], o, p)
            });
        } else {
            add_slices(av, bv, &mut out, p);
        }
    };
    // two channels-last operands (the residual adds between channels-last convolutions): the
    // elementwise sum of their bytes in storage order, channels-last like them
    if let (Some(d), Some(_)) = (channels_last::dims(a), channels_last::dims(b)) {
        channels_last::with_bytes(a, OP, |av| channels_last::with_bytes(b, OP, |bv| add(av, bv)))??;
        return channels_last::tensor(OP, out, d);
    }
    a.with_contiguous::<u8, _>(OP, |av| b.with_contiguous::<u8, _>(OP, |bv| add(av, bv)))??;
    Tensor::from_vec(out, &shape)
}

/// `quantized_add(input, input_scale, input_zero_point, other, other_scale, other_zero_point,
/// output_scale, output_zero_point, relu=False)` on uint8 tensors of one shape.
pub static QUANTIZED_ADD: OpDef = OpDef {
    name: "quantized_add",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("input_scale", T::Float),
        ArgSpec::req("input_zero_point", T::Int),
        ArgSpec::req("other", T::Tensor),
        ArgSpec::req("other_scale", T::Float),
        ArgSpec::req("other_zero_point", T::Int),
        ArgSpec::req("output_scale", T::Float),
        ArgSpec::req("output_zero_point", T::Int),
        ArgSpec::opt("relu", T::Bool, D::Bool(false)),
    ],
    meta: |args| {
        check(args)?;
        Ok(smallvec![TensorMeta::contiguous(tensor(OP, args, 0)?.shape(), DType::U8)])
    },
    kernel,
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Sum of two uint8 tensors with their own scale/zero point, requantised to uint8 (optional fused ReLU).",
};

/// `quantized_add` (see [`QUANTIZED_ADD`]).
///
/// ```
/// use ferrofx_core::{ops::quantized::quantized_add, Tensor};
/// let a = Tensor::from_vec(vec![10u8, 0], &[2]).unwrap(); // (q - 0) * 0.1: 1.0, 0.0
/// let b = Tensor::from_vec(vec![4u8, 0], &[2]).unwrap(); // (q - 2) * 0.5: 1.0, -1.0
/// let y = quantized_add(&a, 0.1, 0, &b, 0.5, 2, 0.25, 8, false).unwrap();
/// assert_eq!(y.to_vec::<u8>().unwrap(), vec![16, 4]); // 2.0 / 0.25 + 8, -1.0 / 0.25 + 8
/// let y = quantized_add(&a, 0.1, 0, &b, 0.5, 2, 0.25, 8, true).unwrap();
/// assert_eq!(y.to_vec::<u8>().unwrap(), vec![16, 8]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn quantized_add(
    input: &Tensor,
    input_scale: f64,
    input_zero_point: i64,
    other: &Tensor,
    other_scale: f64,
    other_zero_point: i64,
    output_scale: f64,
    output_zero_point: i64,
    relu: bool,
) -> Result<Tensor> {
    let args = [
        input.into(),
        input_scale.into(),
        input_zero_point.into(),
        other.into(),
        other_scale.into(),
        other_zero_point.into(),
        output_scale.into(),
        output_zero_point.into(),
        relu.into(),
    ];
    let mut out = dispatch(&QUANTIZED_ADD, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
