//! `quantized_conv2d_add`: an int8 convolution whose uint8 output goes straight into a quantized
//! add with a second uint8 tensor, optionally ReLU'd (PyTorch's oneDNN `quantized::conv2d_add` /
//! `conv2d_add_relu`, which `quantize_fx`'s x86 backend emits for ResNet's residual adds).
//!
//! The result is by definition `quantized_add(quantized_conv2d(...), other, ...)`: the
//! convolution is requantised to its own output scale and zero point first (bytes as the
//! unfused op writes them), then added. On the AMX path with a channels-last `other` (the
//! residual of a ResNet block whose convolutions run on AMX) the add happens in the
//! convolution's epilogue, so the convolution's output is never written or read back; every
//! other case runs the convolution and then the add kernel. Either way the bytes equal the two
//! unfused ops'.

use super::add;
use super::conv2d;
use super::expect_dtype;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::tensor;
use crate::op::{dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Effect, OpDef, Outputs, Saves};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

const OP: &str = "quantized_conv2d_add";

/// The convolution's arguments (`quantized_conv2d`'s, without ReLU), the checked add parameters
/// and the other operand.
fn check(args: &[Value]) -> Result<(Vec<Value>, add::Params)> {
    if args.len() < 18 {
        return Err(Error::schema(OP, format!("expected 18 arguments, got {}", args.len())));
    }
    let mut conv_args = args[..12].to_vec();
    conv_args.push(Value::Bool(false));
    let g = conv2d::check(&conv_args)?;
    let other = tensor(OP, args, 12)?;
    expect_dtype(OP, "other", other, DType::U8)?;
    let out = [g.n, g.oc, g.oh, g.ow];
    if other.shape() != out {
        return Err(Error::shape(
            OP,
            format!(
                "other {:?} must have the convolution's output shape {out:?} (input {:?}, weight {:?}): the residual add does not broadcast",
                other.shape(),
                tensor(OP, args, 0)?.shape(),
                tensor(OP, args, 3)?.shape()
            ),
        ));
    }
    // the add's input is the convolution's output (its scale and zero point are arguments 6, 7)
    let p = add::params(OP, args, [6, 7, 13, 14, 15, 16, 17])?;
    Ok((conv_args, p))
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    let (conv_args, p) = check(args)?;
    Ok(smallvec![conv2d::conv(&conv_args, Some((tensor(OP, args, 12)?, p)))?])
}

fn cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let conv = check(args).ok().map(|(c, _)| (QUANTIZED_CONV2D_COST)(&c, outs)).unwrap_or_default();
    let out_bytes: u64 = outs.iter().map(|o| o.numel() as u64).sum();
    // the add reads the other operand and rewrites nothing extra
    Cost { flops: conv.flops.saturating_add(out_bytes.saturating_mul(4)), bytes: conv.bytes.saturating_add(out_bytes) }
}

/// `quantized_conv2d`'s cost function.
const QUANTIZED_CONV2D_COST: fn(&[Value], &[TensorMeta]) -> Cost = super::QUANTIZED_CONV2D.cost;

/// `quantized_conv2d_add(input, input_scale, input_zero_point, weight, weight_scale, bias,
/// conv_output_scale, conv_output_zero_point, stride, padding, dilation, groups, other,
/// other_scale, other_zero_point, output_scale, output_zero_point, relu=False)`.
pub static QUANTIZED_CONV2D_ADD: OpDef = OpDef {
    name: "quantized_conv2d_add",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("input_scale", T::Float),
        ArgSpec::req("input_zero_point", T::Int),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::req("weight_scale", T::Tensor),
        ArgSpec::req("bias", T::OptTensor),
        ArgSpec::req("conv_output_scale", T::Float),
        ArgSpec::req("conv_output_zero_point", T::Int),
        ArgSpec::req("stride", T::IntList),
        ArgSpec::req("padding", T::IntList),
        ArgSpec::req("dilation", T::IntList),
        ArgSpec::req("groups", T::Int),
        ArgSpec::req("other", T::Tensor),
        ArgSpec::req("other_scale", T::Float),
        ArgSpec::req("other_zero_point", T::Int),
        ArgSpec::req("output_scale", T::Float),
        ArgSpec::req("output_zero_point", T::Int),
        ArgSpec::opt("relu", T::Bool, crate::op::Default::Bool(false)),
    ],
    meta: |args| {
        let (conv_args, _) = check(args)?;
        let g = conv2d::check(&conv_args)?;
        Ok(smallvec![TensorMeta::contiguous(&[g.n, g.oc, g.oh, g.ow], DType::U8)])
    },
    kernel,
    cost,
    effect: Effect::Pure,
    category: Category::Convolution,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Int8 2-D convolution requantised to uint8, then a quantized add of a second uint8 tensor (optional fused ReLU): quantized_add(quantized_conv2d(...), other), fused.",
};

/// The add half of [`quantized_conv2d_add`]: the other operand, its scale and zero point, the
/// sum's scale and zero point, and whether a ReLU follows.
#[derive(Debug, Clone)]
pub struct ResidualAdd<'a> {
    /// The uint8 tensor added to the convolution's output (its shape).
    pub other: &'a Tensor,
    /// `other`'s scale.
    pub other_scale: f64,
    /// `other`'s zero point.
    pub other_zero_point: i64,
    /// The sum's scale.
    pub output_scale: f64,
    /// The sum's zero point.
    pub output_zero_point: i64,
    /// ReLU after the add (clamps at the output zero point).
    pub relu: bool,
}

/// `quantized_conv2d_add` (see [`QUANTIZED_CONV2D_ADD`]): `quantized_conv2d` of `input` (its
/// output requantised with `conv_output_scale` / `conv_output_zero_point`, no ReLU) followed by
/// `quantized_add` with `add.other`, in one op.
///
/// ```
/// use ferrofx_core::ops::quantized::{
///     quantized_add, quantized_conv2d, quantized_conv2d_add, QuantizedConv2dArgs, ResidualAdd,
/// };
/// use ferrofx_core::Tensor;
/// let x = Tensor::from_vec(vec![7u8, 9, 11, 13], &[1, 1, 2, 2]).unwrap();
/// let w = Tensor::from_vec(vec![2i8], &[1, 1, 1, 1]).unwrap();
/// let ws = Tensor::from_vec(vec![0.5f32], &[1]).unwrap();
/// let r = Tensor::from_vec(vec![1u8, 2, 3, 4], &[1, 1, 2, 2]).unwrap();
/// let conv = QuantizedConv2dArgs::default();
/// let add = ResidualAdd { other: &r, other_scale: 0.2, other_zero_point: 2, output_scale: 0.3, output_zero_point: 5, relu: true };
/// let fused = quantized_conv2d_add(&x, 0.1, 3, &w, &ws, None, 0.05, 4, &conv, &add).unwrap();
/// let y = quantized_conv2d(&x, 0.1, 3, &w, &ws, None, 0.05, 4, &conv).unwrap();
/// let unfused = quantized_add(&y, 0.05, 4, &r, 0.2, 2, 0.3, 5, true).unwrap();
/// assert_eq!(fused.to_vec::<u8>().unwrap(), unfused.to_vec::<u8>().unwrap());
/// ```
#[allow(clippy::too_many_arguments)]
pub fn quantized_conv2d_add(
    input: &Tensor,
    input_scale: f64,
    input_zero_point: i64,
    weight: &Tensor,
    weight_scale: &Tensor,
    bias: Option<&Tensor>,
    conv_output_scale: f64,
    conv_output_zero_point: i64,
    conv: &super::QuantizedConv2dArgs,
    add: &ResidualAdd<'_>,
) -> Result<Tensor> {
    if conv.relu {
        return Err(Error::argument(
            OP,
            "the convolution of quantized_conv2d_add has no ReLU of its own (ReLU applies after the add: ResidualAdd::relu)",
        ));
    }
    let args = [
        input.into(),
        input_scale.into(),
        input_zero_point.into(),
        weight.into(),
        weight_scale.into(),
        bias.into(),
        conv_output_scale.into(),
        conv_output_zero_point.into(),
        Value::Ints(conv.stride.to_vec()),
        Value::Ints(conv.padding.to_vec()),
        Value::Ints(conv.dilation.to_vec()),
        conv.groups.into(),
        add.other.into(),
        add.other_scale.into(),
        add.other_zero_point.into(),
        add.output_scale.into(),
        add.output_zero_point.into(),
        add.relu.into(),
    ];
    let mut out = dispatch(&QUANTIZED_CONV2D_ADD, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
