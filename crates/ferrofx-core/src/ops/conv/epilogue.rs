//! `conv2d_fused`: a 2-D convolution whose **epilogue** — bias, a residual add and an
//! activation — is applied to each block of output while it is still in cache, instead of by
//! separate `add` / `relu` kernels that read and write the whole activation again.
//!
//! `conv2d_fused(input, weight, bias, stride, padding, dilation, groups, residual, activation)`
//! computes `act(conv2d(input, weight, bias, ...) + residual)` (PyTorch's
//! `relu(bn3(conv3(x)) + identity)` of a ResNet block once BatchNorm is folded). `residual` is
//! optional and must have the output's shape; `activation` is one of `none`, `relu`, `relu6`,
//! `silu`, `hardswish` or `clamp(lo, hi)` (ONNX Runtime's `FusedConv` activations). The op is
//! made by `ferrofx-compile`'s epilogue pass; as an ordinary registry op it prints, saves
//! (its activation is a string, parsed into this closed set on load) and runs in the
//! Interpreter.
//!
//! Where the epilogue runs: per (image, channel) plane of the depthwise kernel, per GEMM
//! block (each thread's block of output columns or rows) of the im2col / 1x1 paths, per unit of
//! the shifted scheme, and per parallel chunk of the Winograd output. The sum `conv + residual`
//! is one float32 addition, as in the unfused graph, so a fused node equals the unfused chain
//! up to the convolution's own rounding.

use super::{conv_args, conv_cost_of, conv_geom, run_conv, CONV_SCHEMA_2D};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{opt_tensor, str_};
use crate::op::{dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, OpDef, Saves};
use crate::ops::simd::simd_dispatch;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;
use std::fmt;

const OP: &str = "conv2d_fused";

/// The activation a fused convolution applies last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// No activation.
    None,
    /// `relu(x)`.
    Relu,
    /// `clamp(x, lo, hi)` (`relu6` is `clamp(0, 6)`, `hardtanh` `clamp(-1, 1)`).
    Clamp(f32, f32),
    /// `x * sigmoid(x)`.
    Silu,
    /// `x * relu6(x + 3) / 6`.
    Hardswish,
}

impl Activation {
    /// Parses the text form (`none`, `relu`, `relu6`, `silu`, `hardswish`, `clamp(lo, hi)`);
    /// anything else is an error naming it.
    ///
    /// ```
    /// use ferrofx_core::ops::conv::Activation;
    /// assert_eq!(Activation::parse("relu6")?, Activation::Clamp(0.0, 6.0));
    /// assert_eq!(Activation::parse("clamp(-1.5, 2)")?, Activation::Clamp(-1.5, 2.0));
    /// assert!(Activation::parse("gelu").is_err());
    /// # Ok::<(), ferrofx_core::Error>(())
    /// ```
    pub fn parse(text: &str) -> Result<Activation> {
        let t = text.trim();
        let bad = || {
            Error::argument(
                OP,
                format!(
                    "unknown activation '{text}': expected none, relu, relu6, silu, hardswish or clamp(lo, hi) with lo <= hi"
                ),
            )
        };
        Ok(match t {
            "none" => Activation::None,
            "relu" => Activation::Relu,
            "relu6" => Activation::Clamp(0.0, 6.0),
            "silu" => Activation::Silu,
            "hardswish" => Activation::Hardswish,
            _ => {
                let inner = t.strip_prefix("clamp(").and_then(|r| r.strip_suffix(')')).ok_or_else(bad)?;
                let (a, b) = inner.split_once(',').ok_or_else(bad)?;
                let lo: f32 = a.trim().parse().map_err(|_| bad())?;
                let hi: f32 = b.trim().parse().map_err(|_| bad())?;
                if lo.is_nan() || hi.is_nan() || lo > hi {
                    return Err(bad());
                }
                Activation::Clamp(lo, hi)
            }
        })
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Activation::None => write!(f, "none"),
            Activation::Relu => write!(f, "relu"),
            Activation::Clamp(lo, hi) if *lo == 0.0 && *hi == 6.0 => write!(f, "relu6"),
            // `{:?}` prints the shortest text that parses back to the same f32
            Activation::Clamp(lo, hi) => write!(f, "clamp({lo:?}, {hi:?})"),
            Activation::Silu => write!(f, "silu"),
            Activation::Hardswish => write!(f, "hardswish"),
        }
    }
}

/// What a fused convolution applies to its output: `act(out + residual)`.
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    /// The residual, contiguous, with the output's shape.
    pub residual: Option<&'a [f32]>,
    pub act: Activation,
}

#[inline(always)]
fn clamp_f(x: f32, lo: f32, hi: f32) -> f32 {
    // the unfused clamp's formula (NaN stays NaN)
    let y = if x < lo { lo } else { x };
    if y > hi {
        hi
    } else {
        y
    }
}

#[inline(always)]
fn act_f(act: Activation, x: f32) -> f32 {
    match act {
        Activation::None => x,
        Activation::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        Activation::Clamp(lo, hi) => clamp_f(x, lo, hi),
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Hardswish => x * clamp_f(x + 3.0, 0.0, 6.0) / 6.0,
    }
}

simd_dispatch! {
    /// `seg[i] = act(seg[i] + res[i])` (or `act(seg[i])` without a residual).
    pub(crate) fn apply_block(seg: &mut [f32], res: Option<&[f32]>, act: Activation) {
        macro_rules! each {
            ($f:expr) => {
                match res {
                    Some(r) => seg.iter_mut().zip(r).for_each(|(v, &r)| *v = $f(*v + r)),
                    None => seg.iter_mut().for_each(|v| *v = $f(*v)),
                }
            };
        }
        match act {
            Activation::None => {
                if let Some(r) = res {
                    seg.iter_mut().zip(r).for_each(|(v, &r)| *v += r);
                }
            }
            Activation::Relu => each!(|x: f32| if x < 0.0 { 0.0 } else { x }),
            Activation::Clamp(lo, hi) => each!(|x: f32| clamp_f(x, lo, hi)),
            a => each!(|x: f32| act_f(a, x)),
        }
    }
}

impl Epilogue<'_> {
    /// Applies the epilogue to `seg`, the output elements at flat offset `off`.
    pub(super) fn apply(&self, seg: &mut [f32], off: usize) {
        if self.residual.is_none() && self.act == Activation::None {
            return;
        }
        let res = self.residual.and_then(|r| r.get(off..off + seg.len()));
        apply_block(seg, res, self.act);
    }

    /// Applies the epilogue to a whole output, in parallel chunks.
    pub(super) fn apply_all(&self, out: &mut [f32]) {
        const CHUNK: usize = 1 << 14;
        if out.len() >= 4 * CHUNK && super::team::parallel() {
            super::team::chunks_mut(out, CHUNK, |i, c| self.apply(c, i * CHUNK));
        } else {
            self.apply(out, 0);
        }
    }
}

/// `conv2d_fused` schema: conv2d's, then the residual and the activation.
pub(super) const EPILOGUE_SCHEMA: &[ArgSpec] = &[
    CONV_SCHEMA_2D[0],
    CONV_SCHEMA_2D[1],
    CONV_SCHEMA_2D[2],
    CONV_SCHEMA_2D[3],
    CONV_SCHEMA_2D[4],
    CONV_SCHEMA_2D[5],
    CONV_SCHEMA_2D[6],
    ArgSpec::opt("residual", T::OptTensor, D::None),
    ArgSpec::opt("activation", T::Str, D::Str("none")),
];

/// The activation argument `args[i]` (`none` when absent).
pub(super) fn activation_arg(op: &str, args: &[Value], i: usize) -> Result<Activation> {
    match args.get(i) {
        None => Ok(Activation::None),
        Some(_) => Activation::parse(str_(op, args, i)?),
    }
}

/// The activation and (checked) residual of a call.
fn epilogue_args<'a>(args: &'a [Value], shape: &[usize], dt: DType) -> Result<(Option<&'a Tensor>, Activation)> {
    if dt != DType::F32 {
        return Err(Error::dtype(
            OP,
            format!(
                "conv2d_fused computes float32 only, got {dt:?}; use conv2d followed by the add and activation ops"
            ),
        ));
    }
    let act = activation_arg(OP, args, 8)?;
    let res = opt_tensor(OP, args, 7)?;
    if let Some(r) = res {
        if r.shape() != shape || r.dtype() != DType::F32 {
            return Err(Error::shape(
                OP,
                format!(
                    "the residual must be float32 of the output's shape {shape:?}, got {:?} {:?}; add a broadcast residual with a separate add",
                    r.dtype(),
                    r.shape()
                ),
            ));
        }
    }
    Ok((res, act))
}

/// `conv2d_fused(input, weight, bias, stride, padding, dilation, groups, residual, activation)`:
/// `act(conv2d(...) + residual)` in one kernel (see the module docs).
pub static CONV2D_FUSED: OpDef = OpDef {
    name: OP,
    schema: EPILOGUE_SCHEMA,
    meta: |args| {
        let (_, shape, dt) = conv_geom(OP, 2, args)?;
        epilogue_args(args, &shape, dt)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, dt)])
    },
    kernel: |args| {
        let (g, shape, dt) = conv_geom(OP, 2, args)?;
        let (res, act) = epilogue_args(args, &shape, dt)?;
        let (x, w, b) = conv_args(OP, args)?;
        let out = match res {
            Some(r) => {
                let r = crate::ops::kernel::contiguous(r)?;
                r.with_contiguous::<f32, _>(OP, |rs| {
                    run_conv(OP, x, w, b, &g, &shape, dt, false, Some(&Epilogue { residual: Some(rs), act }))
                })??
            }
            None => run_conv(OP, x, w, b, &g, &shape, dt, false, Some(&Epilogue { residual: None, act }))?,
        };
        Ok(smallvec![out])
    },
    cost: |args, outs| match conv_geom(OP, 2, args) {
        Ok((g, _, _)) => {
            let mut c: Cost = conv_cost_of(&g, args, outs);
            // the add and the activation: a few operations per output element
            let elems = (g.n * g.o * g.oh * g.ow) as u64;
            c.flops = c.flops.saturating_add(2 * elems);
            c
        }
        Err(_) => Cost::default(),
    },
    effect: Effect::Pure,
    category: Category::Convolution,
    backward: None,
    saves: Saves::NOTHING,
    doc: "2-D convolution with its bias, residual add and activation applied in one kernel (made by ferrofx-compile's epilogue fusion).",
};

/// `act(conv2d(input, weight, bias, stride, padding, dilation, groups) + residual)` in one
/// kernel; `activation` as [`Activation::parse`] reads it.
///
/// ```
/// use ferrofx_core::ops::conv::{conv2d, conv2d_fused};
/// use ferrofx_core::ops::random::randn;
/// let (x, w) = (randn(&[1, 4, 8, 8], None)?, randn(&[6, 4, 3, 3], None)?);
/// let r = randn(&[1, 6, 8, 8], None)?;
/// let fused = conv2d_fused(&x, &w, None, &[1, 1], &[1, 1], &[1, 1], 1, Some(&r), "relu")?;
/// let unfused = (conv2d(&x, &w, None, &[1, 1], &[1i64, 1][..], &[1, 1], 1)? + &r)?.relu()?;
/// let (a, b) = (fused.to_vec::<f32>()?, unfused.to_vec::<f32>()?);
/// assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs())));
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn conv2d_fused(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
    residual: Option<&Tensor>,
    activation: &str,
) -> Result<Tensor> {
    dispatch_fused(&CONV2D_FUSED, input, weight, bias, stride, padding, dilation, groups, residual, activation)
}

/// Dispatches an op with `conv2d_fused`'s schema (also `nchwc_conv2d`) on these arguments.
#[allow(clippy::too_many_arguments)]
pub(super) fn dispatch_fused(
    def: &'static OpDef,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
    residual: Option<&Tensor>,
    activation: &str,
) -> Result<Tensor> {
    let out = dispatch(
        def,
        CallKind::Function,
        &[
            input.into(),
            weight.into(),
            bias.into(),
            stride.into(),
            padding.into(),
            dilation.into(),
            Value::Int(groups),
            residual.into(),
            Value::Str(activation.to_string()),
        ],
    )?;
    out.into_iter().next().ok_or_else(|| Error::argument(def.name, "no output"))
}
