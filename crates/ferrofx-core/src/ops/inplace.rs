//! In-place ops: `add_ sub_ mul_ div_ pow_ remainder_ fmod_`, the in-place unary ops (`relu_
//! sigmoid_ tanh_ neg_ abs_ exp_ clamp_ hardtanh_ ...`), `fill_ zero_ copy_`.
//!
//! Every one is [`Effect::Mutates`]`(0)`: it writes into its first argument through that
//! tensor's layout (so a write through a view is seen by the base and by every other view), and
//! dispatch bumps the storage's version counter afterwards. As in PyTorch:
//! - the result must have the destination's shape (`output with shape [3] doesn't match the
//!   broadcast shape [2, 3]`);
//! - the result dtype must be castable to the destination dtype (`result type Float can't be
//!   cast to the desired output type Long`);
//! - a destination whose elements overlap in memory (an expanded view) is rejected, except by
//!   `fill_`/`zero_` whose writes are all the same value.
//!
//! Binary ops whose compute dtype is the destination's update the destination directly (one
//! pass, no temporary); everything else computes out of place and copies back.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::op::args::tensor;
use crate::op::{
    cost_elementwise, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Saves,
};
use crate::ops::binary::{self, signature, with_kernel, Arg, BinKernel, KernelVisitor};
use crate::ops::compare;
use crate::ops::kernel::{cast, copy_into, update_strided};
use crate::ops::num::{can_cast, torch_name, wide_dtype, Num as _};
use crate::ops::unary::{self, call1};
use crate::scalar::Scalar;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

/// Errors when `t`'s elements overlap in memory (a dim of size > 1 with stride 0).
pub(crate) fn check_no_overlap(op: &str, t: &Tensor) -> Result<()> {
    let strides = t.strides();
    if t.shape().iter().zip(strides.iter()).any(|(&d, &s)| d > 1 && s == 0) {
        return Err(Error::argument(
            op,
            format!(
                "unsupported operation: more than one element of the written-to tensor refers to a single memory location (shape {:?}, strides {:?}). Please clone() the tensor before performing the operation.",
                t.shape(),
                strides.as_slice()
            ),
        ));
    }
    Ok(())
}

/// Checks that an out-of-place result (shape, dtype) can be written into `dst`.
pub(crate) fn check_writable(op: &str, dst: &Tensor, shape: &[usize], dtype: DType) -> Result<()> {
    if shape != dst.shape() {
        return Err(Error::shape(
            op,
            format!("output with shape {:?} doesn't match the broadcast shape {shape:?}", dst.shape()),
        ));
    }
    if !can_cast(dtype, dst.dtype()) {
        return Err(Error::dtype(
            op,
            format!(
                "result type {} can't be cast to the desired output type {}",
                torch_name(dtype),
                torch_name(dst.dtype())
            ),
        ));
    }
    Ok(())
}

fn self_meta(t: &Tensor) -> MetaOutputs {
    smallvec![TensorMeta { shape: t.shape().into(), dtype: t.dtype(), strides: t.strides() }]
}

/// Meta of an in-place form of `base`: the base's output must fit the destination.
pub(crate) fn inplace_meta(op: &str, base: &OpDef, args: &[Value]) -> Result<MetaOutputs> {
    let dst = tensor(op, args, 0)?;
    check_no_overlap(op, dst)?;
    let out = (base.meta)(args).map_err(|e| rename(e, base, op))?;
    let m = out.first().ok_or_else(|| Error::schema(op, "base op inferred no output"))?;
    check_writable(op, dst, &m.shape, m.dtype)?;
    Ok(self_meta(dst))
}

fn rename(e: Error, base: &OpDef, op: &str) -> Error {
    if e.op() == base.name {
        Error::new(e.kind(), op, e.message())
    } else {
        e
    }
}

/// Kernel of the in-place form of a unary (or any single-output) op: run the base op, then copy
/// the result into the destination.
pub(crate) fn inplace_generic(op: &str, base: &OpDef, args: &[Value]) -> Result<Tensor> {
    let dst = tensor(op, args, 0)?;
    check_no_overlap(op, dst)?;
    let out = (base.kernel)(args).map_err(|e| rename(e, base, op))?;
    let r = out.first().ok_or_else(|| Error::schema(op, "base op returned no output"))?;
    check_writable(op, dst, r.shape(), r.dtype())?;
    copy_into(op, dst, r)?;
    Ok(dst.clone())
}

/// Updates `dst` in place with a binary kernel.
struct Update<'a> {
    op: &'a str,
    dst: &'a Tensor,
    b: Arg<'a>,
    d: DType,
}

impl KernelVisitor for Update<'_> {
    fn visit<K: BinKernel>(self, k: &K) -> Result<Tensor> {
        let Update { op, dst, b, d } = self;
        let fallback = |k: &K| -> Result<Tensor> {
            let r = binary::exec(op, &Arg::Tensor(dst), &b, d, k)?;
            copy_into(op, dst, &r)?;
            Ok(dst.clone())
        };
        if d != dst.dtype() || wide_dtype(d) != d {
            return fallback(k);
        }
        let (st, lo) = dst.concrete(op)?;
        crate::match_wide!(d, N => {
            let f = k.make::<N>();
            let bad = || Error::dtype(op, "tensor dtype changed during the operation");
            match b {
                Arg::Scalar(s) => {
                    let src = [N::from_scalar(s)];
                    let ls = Layout::contiguous(&[]).broadcast_to(op, lo.shape())?;
                    let mut g = st.write();
                    let out = g.as_mut_slice::<N>().ok_or_else(bad)?;
                    update_strided(out, lo, &src, &ls, f);
                }
                Arg::Tensor(y) => {
                    let y = cast(y, d)?;
                    let (sy, ly) = y.concrete(op)?;
                    if sy.same(st) {
                        return fallback(k);
                    }
                    let ls = ly.broadcast_to(op, lo.shape())?;
                    let gy = sy.read();
                    let src = gy.as_slice::<N>().ok_or_else(bad)?;
                    let mut g = st.write();
                    let out = g.as_mut_slice::<N>().ok_or_else(bad)?;
                    update_strided(out, lo, src, &ls, f);
                }
            }
        });
        Ok(dst.clone())
    }
}

fn binary_inplace_meta(op: &'static str, args: &[Value]) -> Result<MetaOutputs> {
    let dst = tensor(op, args, 0)?;
    check_no_overlap(op, dst)?;
    let s = signature(op, args, true)?;
    check_writable(op, dst, &s.shape, s.dtype)?;
    Ok(self_meta(dst))
}

fn binary_inplace(op: &'static str, args: &[Value]) -> Result<Tensor> {
    let dst = tensor(op, args, 0)?;
    check_no_overlap(op, dst)?;
    let s = signature(op, args, true)?;
    check_writable(op, dst, &s.shape, s.dtype)?;
    with_kernel(op, args, s.dtype, s.b, Update { op, dst, b: s.b, d: s.dtype })
}

macro_rules! binary_inplace_op {
    ($STATIC:ident, $name:literal, $schema:expr, $doc:literal) => {
        #[doc = $doc]
        pub static $STATIC: OpDef = OpDef {
            name: $name,
            schema: $schema,
            meta: |args| binary_inplace_meta($name, args),
            kernel: |args| Ok(smallvec![binary_inplace($name, args)?]),
            cost: cost_elementwise,
            effect: Effect::Mutates(0),
            category: Category::Elementwise,
            backward: crate::autograd::formulas::elementwise::backward_for($name),
            saves: crate::autograd::formulas::elementwise::saves_for($name),
            doc: $doc,
        };
    };
}

const POW_SCHEMA_: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::req("exponent", T::TensorOrScalar)];

binary_inplace_op!(ADD_, "add_", binary::ADD_SCHEMA, "In-place `input += alpha * other`.");
binary_inplace_op!(SUB_, "sub_", binary::ADD_SCHEMA, "In-place `input -= alpha * other`.");
binary_inplace_op!(MUL_, "mul_", binary::BIN_SCHEMA, "In-place `input *= other`.");
binary_inplace_op!(DIV_, "div_", binary::DIV_SCHEMA, "In-place `input /= other` (optionally rounded).");
binary_inplace_op!(POW_, "pow_", POW_SCHEMA_, "In-place `input **= exponent`.");
binary_inplace_op!(REMAINDER_, "remainder_", binary::BIN_SCHEMA, "In-place Python-style remainder.");
binary_inplace_op!(FMOD_, "fmod_", binary::BIN_SCHEMA, "In-place C-style fmod.");

macro_rules! unary_inplace_op {
    ($($STATIC:ident, $name:literal, $BASE:path;)*) => {
        $(
            #[doc = concat!("In-place form of `", stringify!($BASE), "` (writes into `input`).")]
            pub static $STATIC: OpDef = OpDef {
                name: $name,
                schema: $BASE.schema,
                meta: |args| inplace_meta($name, &$BASE, args),
                kernel: |args| Ok(smallvec![inplace_generic($name, &$BASE, args)?]),
                cost: cost_elementwise,
                effect: Effect::Mutates(0),
                category: Category::Elementwise,
                backward: crate::autograd::formulas::elementwise::backward_for($name),
                saves: crate::autograd::formulas::elementwise::saves_for($name),
                doc: "In-place form of an elementwise op.",
            };
        )*
    };
}

unary_inplace_op! {
    NEG_, "neg_", unary::NEG;
    ABS_, "abs_", unary::ABS;
    EXP_, "exp_", unary::EXP;
    LOG_, "log_", unary::LOG;
    LOG1P_, "log1p_", unary::LOG1P;
    SQRT_, "sqrt_", unary::SQRT;
    RSQRT_, "rsqrt_", unary::RSQRT;
    SIN_, "sin_", unary::SIN;
    COS_, "cos_", unary::COS;
    TANH_, "tanh_", unary::TANH;
    SIGMOID_, "sigmoid_", unary::SIGMOID;
    RELU_, "relu_", unary::RELU;
    LEAKY_RELU_, "leaky_relu_", unary::LEAKY_RELU;
    ELU_, "elu_", unary::ELU;
    SELU_, "selu_", unary::SELU;
    SILU_, "silu_", unary::SILU;
    HARDTANH_, "hardtanh_", unary::HARDTANH;
    HARDSWISH_, "hardswish_", unary::HARDSWISH;
    HARDSIGMOID_, "hardsigmoid_", unary::HARDSIGMOID;
    CLAMP_, "clamp_", unary::CLAMP;
    RECIPROCAL_, "reciprocal_", unary::RECIPROCAL;
    SIGN_, "sign_", unary::SIGN;
    FLOOR_, "floor_", unary::FLOOR;
    CEIL_, "ceil_", unary::CEIL;
    ROUND_, "round_", unary::ROUND;
    TRUNC_, "trunc_", unary::TRUNC;
    ERF_, "erf_", unary::ERF;
    LOGICAL_NOT_, "logical_not_", compare::LOGICAL_NOT;
}

// ---- fill_ / zero_ / copy_ ----

fn fill_value(op: &str, args: &[Value]) -> Result<Scalar> {
    match args.get(1) {
        Some(Value::Tensor(v)) => {
            if !v.shape().is_empty() {
                return Err(Error::shape(
                    op,
                    format!(
                        "fill_ only supports 0-dimension value tensor but got tensor with {} dimensions.",
                        v.shape().len()
                    ),
                ));
            }
            let d = v.dtype();
            Ok(if d.is_floating_point() {
                Scalar::Float(v.item()?)
            } else if d == DType::Bool {
                Scalar::Bool(v.item()? != 0.0)
            } else {
                Scalar::Int(cast(v, DType::I64)?.item_as::<i64>()?)
            })
        }
        Some(v) => v.as_scalar().ok_or_else(|| {
            Error::schema(op, format!("argument 'value' must be Tensor or Scalar, but got {}", v.type_name()))
        }),
        None => Err(Error::schema(op, "missing argument 'value'")),
    }
}

/// Writes `v` (converted to `dst`'s dtype) into every element of `dst`.
fn fill(op: &str, dst: &Tensor, v: Scalar) -> Result<()> {
    let (st, lo) = dst.concrete(op)?;
    let d = dst.dtype();
    let ls = Layout::contiguous(&[]).broadcast_to(op, lo.shape())?;
    crate::match_dtype!(d, E => {
        let x: E = match v {
            Scalar::Float(f) => crate::dtype::Element::from_f64(f),
            Scalar::Int(i) => crate::dtype::Element::from_i64(i),
            Scalar::Bool(b) => crate::dtype::Element::from_i64(b as i64),
        };
        let src = [x];
        let mut g = st.write();
        let out = g.as_mut_slice::<E>().ok_or_else(|| Error::dtype(op, "tensor dtype changed during the operation"))?;
        update_strided(out, lo, &src, &ls, |_, s| s);
    });
    Ok(())
}

/// `fill_(input, value)`: every element becomes `value` (a number or a 0-dim tensor).
pub static FILL_: OpDef = OpDef {
    name: "fill_",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("value", T::TensorOrScalar)],
    meta: |args| {
        let t = tensor("fill_", args, 0)?;
        fill_value("fill_", args).or_else(|e| {
            if args.get(1).is_some_and(|v| v.as_tensor().is_some_and(|v| v.is_symbolic())) {
                Ok(Scalar::Int(0))
            } else {
                Err(e)
            }
        })?;
        Ok(self_meta(t))
    },
    kernel: |args| {
        let t = tensor("fill_", args, 0)?;
        fill("fill_", t, fill_value("fill_", args)?)?;
        Ok(smallvec![t.clone()])
    },
    cost: cost_elementwise,
    effect: Effect::Mutates(0),
    category: Category::Elementwise,
    backward: Some(crate::autograd::formulas::elementwise::fill_bw),
    saves: Saves::NOTHING,
    doc: "Fills the tensor with a value, in place.",
};

/// `zero_(input)`: every element becomes 0.
pub static ZERO_: OpDef = OpDef {
    name: "zero_",
    schema: &[ArgSpec::req("input", T::Tensor)],
    meta: |args| Ok(self_meta(tensor("zero_", args, 0)?)),
    kernel: |args| {
        let t = tensor("zero_", args, 0)?;
        fill("zero_", t, Scalar::Int(0))?;
        Ok(smallvec![t.clone()])
    },
    cost: cost_elementwise,
    effect: Effect::Mutates(0),
    category: Category::Elementwise,
    backward: Some(crate::autograd::formulas::elementwise::fill_bw),
    saves: Saves::NOTHING,
    doc: "Fills the tensor with zeros, in place.",
};

fn copy_check(args: &[Value]) -> Result<()> {
    let dst = tensor("copy_", args, 0)?;
    let src = tensor("copy_", args, 1)?;
    check_no_overlap("copy_", dst)?;
    let b = crate::layout::broadcast_shapes("copy_", dst.shape(), src.shape())?;
    if b.as_slice() != dst.shape() {
        return Err(Error::shape(
            "copy_",
            format!(
                "the source of shape {:?} cannot be broadcast to the destination shape {:?}",
                src.shape(),
                dst.shape()
            ),
        ));
    }
    Ok(())
}

/// `copy_(input, src)`: copies `src` (broadcast, converted to `input`'s dtype) into `input`.
pub static COPY_: OpDef = OpDef {
    name: "copy_",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("src", T::Tensor),
        ArgSpec::opt("non_blocking", T::Bool, D::Bool(false)),
    ],
    meta: |args| {
        copy_check(args)?;
        Ok(self_meta(tensor("copy_", args, 0)?))
    },
    kernel: |args| {
        copy_check(args)?;
        let dst = tensor("copy_", args, 0)?;
        copy_into("copy_", dst, tensor("copy_", args, 1)?)?;
        Ok(smallvec![dst.clone()])
    },
    cost: crate::op::cost_memory,
    effect: Effect::Mutates(0),
    category: Category::Elementwise,
    backward: Some(crate::autograd::formulas::elementwise::copy_bw),
    saves: Saves::NOTHING,
    doc: "Copies src into the tensor (broadcasting, converting dtype), in place.",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &ADD_,
    &SUB_,
    &MUL_,
    &DIV_,
    &POW_,
    &REMAINDER_,
    &FMOD_,
    &NEG_,
    &ABS_,
    &EXP_,
    &LOG_,
    &LOG1P_,
    &SQRT_,
    &RSQRT_,
    &SIN_,
    &COS_,
    &TANH_,
    &SIGMOID_,
    &RELU_,
    &LEAKY_RELU_,
    &ELU_,
    &SELU_,
    &SILU_,
    &HARDTANH_,
    &HARDSWISH_,
    &HARDSIGMOID_,
    &CLAMP_,
    &RECIPROCAL_,
    &SIGN_,
    &FLOOR_,
    &CEIL_,
    &ROUND_,
    &TRUNC_,
    &ERF_,
    &LOGICAL_NOT_,
    &FILL_,
    &ZERO_,
    &COPY_,
];

// ---------------------------------------------------------------------------------------------
// Public API: methods returning the (same) tensor.

macro_rules! unary_inplace_api {
    ($($f:ident => $S:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("In place: `", stringify!($f), "`; returns `self`.")]
                pub fn $f(&self) -> Result<Tensor> {
                    call1(&$S, CallKind::Method, &[self.into()])
                }
            )*
        }
    };
}
unary_inplace_api! {
    neg_ => NEG_; abs_ => ABS_; exp_ => EXP_; log_ => LOG_; log1p_ => LOG1P_; sqrt_ => SQRT_; rsqrt_ => RSQRT_;
    sin_ => SIN_; cos_ => COS_; tanh_ => TANH_; sigmoid_ => SIGMOID_; relu_ => RELU_; selu_ => SELU_; silu_ => SILU_;
    hardswish_ => HARDSWISH_; hardsigmoid_ => HARDSIGMOID_; reciprocal_ => RECIPROCAL_; sign_ => SIGN_;
    floor_ => FLOOR_; ceil_ => CEIL_; trunc_ => TRUNC_; erf_ => ERF_; logical_not_ => LOGICAL_NOT_; zero_ => ZERO_;
}

impl Tensor {
    /// `self += other` in place (PyTorch's `add_`); returns `self`.
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    /// let v = x.version();
    /// x.add_(1.0).unwrap();
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    /// assert_eq!(x.version(), v + 1);
    /// // an int tensor cannot hold a float result
    /// let i = Tensor::from_vec(vec![1i64], &[1]).unwrap();
    /// assert!(i.add_(0.5).unwrap_err().to_string().contains("result type Float can't be cast to the desired output type Long"));
    /// ```
    pub fn add_(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&ADD_, CallKind::Method, &[self.into(), other.into(), Value::Int(1)])
    }
    /// `self += alpha * other` in place.
    pub fn add_alpha_(&self, other: impl Into<Value>, alpha: impl Into<Scalar>) -> Result<Tensor> {
        call1(&ADD_, CallKind::Method, &[self.into(), other.into(), alpha.into().into()])
    }
    /// `self -= other` in place.
    pub fn sub_(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&SUB_, CallKind::Method, &[self.into(), other.into(), Value::Int(1)])
    }
    /// `self *= other` in place.
    pub fn mul_(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&MUL_, CallKind::Method, &[self.into(), other.into()])
    }
    /// `self /= other` in place (the tensor must be floating, as in PyTorch).
    pub fn div_(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&DIV_, CallKind::Method, &[self.into(), other.into(), Value::None])
    }
    /// `self /= other` in place, rounded with `"trunc"` or `"floor"`.
    pub fn div_mode_(&self, other: impl Into<Value>, rounding_mode: &str) -> Result<Tensor> {
        call1(&DIV_, CallKind::Method, &[self.into(), other.into(), rounding_mode.into()])
    }
    /// `self **= exponent` in place.
    pub fn pow_(&self, exponent: impl Into<Value>) -> Result<Tensor> {
        call1(&POW_, CallKind::Method, &[self.into(), exponent.into()])
    }
    /// Python-style remainder in place.
    pub fn remainder_(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&REMAINDER_, CallKind::Method, &[self.into(), other.into()])
    }
    /// C-style fmod in place.
    pub fn fmod_(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&FMOD_, CallKind::Method, &[self.into(), other.into()])
    }
    /// `clamp_(min, max)` in place (bounds: number, tensor or `None`).
    pub fn clamp_(&self, min: impl Into<Value>, max: impl Into<Value>) -> Result<Tensor> {
        call1(&CLAMP_, CallKind::Method, &[self.into(), min.into(), max.into()])
    }
    /// `leaky_relu_(negative_slope)` in place.
    pub fn leaky_relu_(&self, negative_slope: f64) -> Result<Tensor> {
        call1(&LEAKY_RELU_, CallKind::Method, &[self.into(), Value::Float(negative_slope)])
    }
    /// `elu_(alpha)` in place.
    pub fn elu_(&self, alpha: f64) -> Result<Tensor> {
        call1(&ELU_, CallKind::Method, &[self.into(), Value::Float(alpha), Value::Int(1), Value::Int(1)])
    }
    /// `hardtanh_(min_val, max_val)` in place.
    pub fn hardtanh_(&self, min_val: f64, max_val: f64) -> Result<Tensor> {
        call1(&HARDTANH_, CallKind::Method, &[self.into(), Value::Float(min_val), Value::Float(max_val)])
    }
    /// `round_(decimals)` in place.
    pub fn round_(&self, decimals: i64) -> Result<Tensor> {
        call1(&ROUND_, CallKind::Method, &[self.into(), Value::Int(decimals)])
    }
    /// `fill_(value)`: every element becomes `value` (a number or a 0-dim tensor).
    pub fn fill_(&self, value: impl Into<Value>) -> Result<Tensor> {
        call1(&FILL_, CallKind::Method, &[self.into(), value.into()])
    }
    /// `copy_(src)`: copies `src` (broadcast, dtype-converted) into `self`.
    pub fn copy_(&self, src: &Tensor) -> Result<Tensor> {
        call1(&COPY_, CallKind::Method, &[self.into(), src.into(), Value::Bool(false)])
    }
}
