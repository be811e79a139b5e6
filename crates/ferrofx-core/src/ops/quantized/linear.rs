//! `quantized_linear`: `y = x W^T + b` on a uint8 input and int8 weights, requantised to uint8
//! (PyTorch's `quantized::linear` / `quantized::linear_relu` with the fbgemm backend). The fast
//! paths are the packed GEMM of `linear_packed.rs`, the reference is `gemm.rs`'s scalar GEMM.

use super::gemm::{reference_gemm, row_sums, Operands, Path, RequantParams};
use super::linear_packed::{linear_packed, packed_weight, with_quad_slack};
use super::{channel_floats, check_channel_param, check_scale, check_zero_point, expect_dtype};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{bool_, float, int, opt_tensor, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

const OP: &str = "quantized_linear";

/// Shapes checked: `(M, K, N, output shape)`.
fn check(args: &[Value]) -> Result<(usize, usize, usize, Vec<usize>)> {
    let x = tensor(OP, args, 0)?;
    expect_dtype(OP, "input", x, DType::U8)?;
    check_scale(OP, "input_scale", float(OP, args, 1)?)?;
    check_zero_point(OP, "input_zero_point", int(OP, args, 2)?, DType::U8)?;
    let (m, k, n, shape) = check_weight(OP, x, args, 3)?;
    check_scale(OP, "output_scale", float(OP, args, 6)?)?;
    check_zero_point(OP, "output_zero_point", int(OP, args, 7)?, DType::U8)?;
    Ok((m, k, n, shape))
}

/// The checks `quantized_linear` and `quantized_linear_dynamic` share: the int8 weight at
/// argument `w_arg` fits the input `x`, its per-channel scale (`w_arg + 1`) and the optional
/// bias (`w_arg + 2`) have one value per output channel. Returns `(M, K, N, output shape)`.
pub(super) fn check_weight(
    op: &str,
    x: &Tensor,
    args: &[Value],
    w_arg: usize,
) -> Result<(usize, usize, usize, Vec<usize>)> {
    let w = tensor(op, args, w_arg)?;
    expect_dtype(op, "weight", w, DType::I8)?;
    if x.ndim() == 0 || w.ndim() != 2 || x.shape()[x.ndim() - 1] != w.shape()[1] {
        return Err(Error::shape(
            op,
            format!(
                "input {:?} and weight {:?} do not fit: the weight must be [out_features, in_features] with in_features equal to the input's last dim",
                x.shape(),
                w.shape()
            ),
        ));
    }
    let (n, k) = (w.shape()[0], w.shape()[1]);
    check_channel_param(op, "weight_scale", tensor(op, args, w_arg + 1)?, n, true)?;
    if let Some(b) = opt_tensor(op, args, w_arg + 2)? {
        check_channel_param(op, "bias", b, n, false)?;
    }
    let m = x.shape()[..x.ndim() - 1].iter().product();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("ndim >= 1") = n;
    Ok((m, k, n, shape))
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    let (m, k, n, shape) = check(args)?;
    let path = Path::select().vector();
    let x = tensor(OP, args, 0)?;
    let w = tensor(OP, args, 3)?;
    let w_scale = channel_floats(OP, "weight_scale", tensor(OP, args, 4)?, n, true)?;
    let bias = match opt_tensor(OP, args, 5)? {
        Some(b) => Some(channel_floats(OP, "bias", b, n, false)?),
        None => None,
    };
    let mut out = crate::memory::alloc_filled::<u8>(OP, &shape, 0)?;
    let (a_scale, a_zp) = (check_scale(OP, "input_scale", float(OP, args, 1)?)?, int(OP, args, 2)? as i32);
    let (o_scale, o_zp) = (check_scale(OP, "output_scale", float(OP, args, 6)?)?, int(OP, args, 7)? as i32);
    let relu = bool_(OP, args, 8)?;
    let params =
        |sums: Vec<i32>| RequantParams::new(a_scale, a_zp, &w_scale, sums, bias.as_deref(), o_scale, o_zp, relu);
    if path == Path::Reference {
        w.with_contiguous::<i8, _>(OP, |wv| {
            let rq = params(row_sums(wv, k, n, k));
            x.with_contiguous::<u8, _>(OP, |xv| {
                let p = Operands { a: xv, lda: k, b: wv, ldb: k, m, n, k };
                reference_gemm(&p, &rq.slice(0, n), &mut out, n, 1)
            })
        })??;
    } else {
        // weights packed once (cached on the weight's storage), the GEMM tiled in registers
        let pw = packed_weight(OP, w, n, k)?;
        let rq = params(pw.sums.clone()).padded(pw.padded());
        x.with_contiguous::<u8, _>(OP, |xv| {
            with_quad_slack(OP, xv, k, |a| linear_packed(path, a, m, &pw, &rq.slice(0, pw.padded()), &mut out))
        })??;
    }
    Ok(smallvec![Tensor::from_vec(out, &shape)?])
}

fn cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let (Ok(x), Ok(w)) = (tensor(OP, args, 0), tensor(OP, args, 3)) else {
        return Cost::default();
    };
    let n = w.shape().first().copied().unwrap_or(0) as u64;
    let mk = x.numel() as u64;
    let out: u64 = outs.iter().map(|o| o.nbytes() as u64).sum();
    Cost {
        flops: mk.saturating_mul(n).saturating_mul(2),
        bytes: (x.numel() as u64).saturating_add(w.numel() as u64).saturating_add(out),
    }
}

/// `quantized_linear(input, input_scale, input_zero_point, weight, weight_scale, bias,
/// output_scale, output_zero_point, relu=False)`: uint8 `[..., in]` × int8 `[out, in]`
/// (symmetric, per output channel or per tensor) + float bias → uint8 `[..., out]`.
pub static QUANTIZED_LINEAR: OpDef = OpDef {
    name: "quantized_linear",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("input_scale", T::Float),
        ArgSpec::req("input_zero_point", T::Int),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::req("weight_scale", T::Tensor),
        ArgSpec::req("bias", T::OptTensor),
        ArgSpec::req("output_scale", T::Float),
        ArgSpec::req("output_zero_point", T::Int),
        ArgSpec::opt("relu", T::Bool, D::Bool(false)),
    ],
    meta: |args| {
        let (_, _, _, shape) = check(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, DType::U8)])
    },
    kernel,
    cost,
    effect: Effect::Pure,
    category: Category::Linear,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Int8 linear: uint8 input x int8 weight (i32 accumulate), requantised to uint8 (optional fused ReLU).",
};

/// `quantized_linear` (see [`QUANTIZED_LINEAR`]); `weight_scale` has one value per output
/// feature (or one for the tensor); the weight's zero point is 0.
///
/// ```
/// use ferrofx_core::{ops::quantized::quantized_linear, Tensor};
/// // x = (q - 10) * 0.5 = [1, 2]; W = [[2, -1]] * 0.25 = [[0.5, -0.25]]; y = 0.5 - 0.5 + 1 = 1
/// let x = Tensor::from_vec(vec![12u8, 14], &[1, 2]).unwrap();
/// let w = Tensor::from_vec(vec![2i8, -1], &[1, 2]).unwrap();
/// let ws = Tensor::from_vec(vec![0.25f32], &[1]).unwrap();
/// let b = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
/// let y = quantized_linear(&x, 0.5, 10, &w, &ws, Some(&b), 0.125, 3, false).unwrap();
/// assert_eq!(y.to_vec::<u8>().unwrap(), vec![11]); // 1 / 0.125 + 3
/// ```
#[allow(clippy::too_many_arguments)]
pub fn quantized_linear(
    input: &Tensor,
    input_scale: f64,
    input_zero_point: i64,
    weight: &Tensor,
    weight_scale: &Tensor,
    bias: Option<&Tensor>,
    output_scale: f64,
    output_zero_point: i64,
    relu: bool,
) -> Result<Tensor> {
    let args = [
        input.into(),
        input_scale.into(),
        input_zero_point.into(),
        weight.into(),
        weight_scale.into(),
        bias.into(),
        output_scale.into(),
        output_zero_point.into(),
        relu.into(),
    ];
    let mut out = dispatch(&QUANTIZED_LINEAR, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
