//! Binary arithmetic ops with broadcasting and PyTorch's type promotion: `add sub rsub mul div
//! pow maximum minimum remainder fmod`.
//!
//! `other` (and `input` for `pow`/`remainder`, as PyTorch's `Scalar_Tensor` overloads) may be a
//! tensor or a number. The compute dtype is `torch.result_type` of the operands: dimensioned
//! tensors outrank zero-dim tensors, which outrank numbers, within a category (bool < integer <
//! float); `div` without rounding always computes in floating point. float16/bfloat16 compute in
//! float32 and round back.

use crate::dtype::{result_type, DType, Element, Operand, DEFAULT_FLOAT};
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, Shape};
use crate::op::args::scalar;
use crate::op::{cost_elementwise, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, OpDef};
use crate::ops::kernel::{binary_map, cast, unary_map};
use crate::ops::num::{narrow_scalar, tensor_operand, torch_name, wide_dtype, Num};
use crate::ops::unary::call1;
use crate::scalar::Scalar;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

/// One operand of a binary op: a tensor or a plain number.
#[derive(Clone, Copy)]
pub(crate) enum Arg<'a> {
    Tensor(&'a Tensor),
    Scalar(Scalar),
}

impl Arg<'_> {
    /// The dtype this operand contributes (numbers: bool, int64 or float64).
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Arg::Tensor(t) => t.dtype(),
            Arg::Scalar(s) => s.dtype(),
        }
    }
    fn shape(&self) -> &[usize] {
        match self {
            Arg::Tensor(t) => t.shape(),
            Arg::Scalar(_) => &[],
        }
    }
}

/// Argument `i` as a tensor or number, naming the argument in the error.
pub(crate) fn arg<'a>(op: &str, args: &'a [Value], i: usize, name: &str) -> Result<Arg<'a>> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(Arg::Tensor(t)),
        Some(v) => v.as_scalar().map(Arg::Scalar).ok_or_else(|| {
            Error::schema(op, format!("argument '{name}' must be Tensor or Scalar, but got {}", v.type_name()))
        }),
        None => Err(Error::schema(op, format!("missing argument '{name}'"))),
    }
}

impl Arg<'_> {
    /// This operand's role in `result_type`.
    pub(crate) fn operand(&self) -> Operand {
        match self {
            Arg::Tensor(t) => tensor_operand(t),
            Arg::Scalar(s) => Operand::Scalar(s.dtype()),
        }
    }
}

/// `result_type` of two operands and (when `with_shape`; kernels leave the broadcast check to
/// the element map) their broadcast shape.
pub(crate) fn promote(op: &str, a: &Arg, b: &Arg, with_shape: bool) -> Result<(Shape, DType)> {
    if matches!((a, b), (Arg::Scalar(_), Arg::Scalar(_))) {
        return Err(Error::schema(op, "at least one of the operands must be a Tensor, got two numbers"));
    }
    let shape = if with_shape { broadcast_shapes(op, a.shape(), b.shape())? } else { Shape::new() };
    Ok((shape, result_type(&[a.operand(), b.operand()])))
}

/// Builds the element function of a binary op for one compute type.
pub(crate) trait BinKernel: Sync {
    fn make<N: Num>(&self) -> impl Fn(N, N) -> N + Sync + Send;
}

/// Applies `f` to operands converted to the compute type `N` (dtype `cd`), producing `U`.
pub(crate) fn exec_typed<N: Num, U: Element>(
    op: &str,
    a: &Arg,
    b: &Arg,
    cd: DType,
    f: impl Fn(N, N) -> U + Sync + Send,
) -> Result<Tensor> {
    // Borrow operands already in the compute dtype (no reference-count traffic on the hot path).
    let conv = |t: &Tensor| -> Result<Option<Tensor>> {
        if t.dtype() == cd {
            Ok(None)
        } else {
            cast(t, cd).map(Some)
        }
    };
    match (a, b) {
        (Arg::Tensor(x), Arg::Tensor(y)) => {
            let (cx, cy) = (conv(x)?, conv(y)?);
            binary_map::<N, U>(op, cx.as_ref().unwrap_or(x), cy.as_ref().unwrap_or(y), f)
        }
        (Arg::Tensor(x), Arg::Scalar(s)) => {
            let s = N::from_scalar(*s);
            let cx = conv(x)?;
            unary_map::<N, U>(op, cx.as_ref().unwrap_or(x), move |v| f(v, s))
        }
        (Arg::Scalar(s), Arg::Tensor(y)) => {
            let s = N::from_scalar(*s);
            let cy = conv(y)?;
            unary_map::<N, U>(op, cy.as_ref().unwrap_or(y), move |v| f(s, v))
        }
        (Arg::Scalar(_), Arg::Scalar(_)) => Err(Error::schema(op, "at least one of the operands must be a Tensor")),
    }
}

/// Narrows a number operand to dtype `d` (see [`narrow_scalar`]).
pub(crate) fn narrow_arg<'a>(a: &Arg<'a>, d: DType) -> Arg<'a> {
    match a {
        Arg::Scalar(s) => Arg::Scalar(narrow_scalar(*s, d)),
        t => *t,
    }
}

/// Runs `k` on `a` and `b` computing in dtype `d` (halves through float32, narrow integers
/// through int64), output dtype `d`.
pub(crate) fn exec<K: BinKernel>(op: &str, a: &Arg, b: &Arg, d: DType, k: &K) -> Result<Tensor> {
    let cd = wide_dtype(d);
    let (a, b) = (narrow_arg(a, d), narrow_arg(b, d));
    let r = crate::match_wide!(cd, N => exec_typed::<N, N>(op, &a, &b, cd, k.make::<N>()))?;
    if cd != d {
        cast(&r, d)
    } else {
        Ok(r)
    }
}

/// Defines a stateless kernel from a generic body.
macro_rules! bin_kernel {
    ($S:ident, |$x:ident, $y:ident| $body:expr) => {
        pub(crate) struct $S;
        impl BinKernel for $S {
            #[inline(always)]
            fn make<N: Num>(&self) -> impl Fn(N, N) -> N + Sync + Send {
                |$x: N, $y: N| $body
            }
        }
    };
}
bin_kernel!(AddK, |x, y| x.add(y));
bin_kernel!(SubK, |x, y| x.sub(y));
bin_kernel!(RsubK, |x, y| y.sub(x));
bin_kernel!(MulK, |x, y| x.mul(y));
bin_kernel!(DivK, |x, y| x.div(y));
bin_kernel!(DivTruncK, |x, y| x.div_trunc(y));
bin_kernel!(DivFloorK, |x, y| x.div_floor(y));
bin_kernel!(PowK, |x, y| x.pow(y));
bin_kernel!(SquareK, |x, _y| x.mul(x));
bin_kernel!(MaximumK, |x, y| x.maximum(y));
bin_kernel!(MinimumK, |x, y| x.minimum(y));
bin_kernel!(RemainderK, |x, y| x.remainder(y));
bin_kernel!(FmodK, |x, y| x.fmod(y));

/// `a + alpha * b` (`sub`: `a - alpha * b`, `rsub`: `b - alpha * a`).
pub(crate) struct AlphaK {
    pub alpha: Scalar,
    pub sign: i8, // 1 add, -1 sub, 0 rsub
}
impl BinKernel for AlphaK {
    #[inline(always)]
    fn make<N: Num>(&self) -> impl Fn(N, N) -> N + Sync + Send {
        let alpha = N::from_scalar(self.alpha);
        let sign = self.sign;
        move |x: N, y: N| match sign {
            1 => x.add(alpha.mul(y)),
            -1 => x.sub(alpha.mul(y)),
            _ => y.sub(alpha.mul(x)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Per-op validation: shape, compute dtype, errors (shared by meta and kernel).

/// The checked signature of one binary call.
pub(crate) struct Sig<'a> {
    pub shape: Shape,
    pub dtype: DType,
    pub a: Arg<'a>,
    pub b: Arg<'a>,
}

fn check_alpha(op: &str, d: DType, alpha: Scalar) -> Result<()> {
    if !d.is_floating_point() && alpha.is_float() {
        return Err(Error::argument(
            op,
            format!(
                "For integral input tensors, argument alpha must not be a floating point number (got alpha={}).",
                alpha.to_f64()
            ),
        ));
    }
    if d != DType::Bool && matches!(alpha, Scalar::Bool(_)) {
        return Err(Error::argument(op, "Boolean alpha only supported for Boolean results."));
    }
    Ok(())
}

fn check_bool_sub(op: &str, a: &Arg, b: &Arg) -> Result<()> {
    let (ba, bb) = (a.dtype() == DType::Bool, b.dtype() == DType::Bool);
    if ba && bb {
        return Err(Error::dtype(op, "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."));
    }
    if ba || bb {
        return Err(Error::dtype(op, "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."));
    }
    Ok(())
}

/// The rounding mode of `div`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Rounding {
    None,
    Trunc,
    Floor,
}

pub(crate) fn rounding(op: &str, v: &Value) -> Result<Rounding> {
    match v {
        Value::None => Ok(Rounding::None),
        Value::Str(s) if s == "trunc" => Ok(Rounding::Trunc),
        Value::Str(s) if s == "floor" => Ok(Rounding::Floor),
        Value::Str(s) => Err(Error::argument(
            op,
            format!("div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{s}'"),
        )),
        v => Err(Error::schema(op, format!("argument 'rounding_mode' must be str or None, but got {}", v.type_name()))),
    }
}

fn not_implemented(op: &str, d: DType) -> Error {
    Error::dtype(op, format!("\"{op}\" not implemented for '{}'", torch_name(d)))
}

/// Signature of `add`/`sub`/`rsub`/`mul`/... with the op's extra checks.
/// `with_shape` also computes (and checks) the broadcast shape.
pub(crate) fn signature<'a>(op: &str, args: &'a [Value], with_shape: bool) -> Result<Sig<'a>> {
    let a = arg(op, args, 0, "input")?;
    let b = arg(op, args, 1, if op.starts_with("pow") { "exponent" } else { "other" })?;
    let (shape, d) = promote(op, &a, &b, with_shape)?;
    let base = op.trim_end_matches('_');
    let dtype = match base {
        "add" => {
            check_alpha(op, d, scalar(op, args, 2)?)?;
            d
        }
        "sub" | "rsub" => {
            check_bool_sub(op, &a, &b)?;
            check_alpha(op, d, scalar(op, args, 2)?)?;
            d
        }
        "div" => match rounding(op, args.get(2).unwrap_or(&Value::None))? {
            Rounding::None => {
                if d.is_floating_point() {
                    d
                } else {
                    DEFAULT_FLOAT
                }
            }
            r => {
                if d == DType::Bool {
                    return Err(Error::dtype(
                        op,
                        format!(
                            "\"div\" with rounding_mode='{}' not implemented for 'Bool'",
                            if r == Rounding::Trunc { "trunc" } else { "floor" }
                        ),
                    ));
                }
                d
            }
        },
        "pow" => {
            if d == DType::Bool {
                return Err(not_implemented("pow", d));
            }
            if !d.is_floating_point() {
                if let Arg::Scalar(s) = b {
                    if !s.is_float() && s.to_i64() < 0 {
                        return Err(Error::argument(op, "Integers to negative integer powers are not allowed."));
                    }
                }
            }
            d
        }
        "remainder" | "fmod" => {
            if d == DType::Bool {
                return Err(not_implemented(base, d));
            }
            d
        }
        _ => d,
    };
    Ok(Sig { shape, dtype, a, b })
}

/// Integer division by zero is an error in PyTorch (`ZeroDivisionError`).
pub(crate) fn check_int_divisor(op: &str, b: &Arg, d: DType) -> Result<()> {
    if d.is_floating_point() {
        return Ok(());
    }
    let zero = match b {
        Arg::Scalar(s) => narrow_scalar(*s, d).to_i64() == 0,
        Arg::Tensor(t) => {
            let t = cast(&cast(t, d)?, DType::I64)?;
            t.with_contiguous::<i64, _>(op, |s| s.contains(&0))?
        }
    };
    if zero {
        return Err(Error::argument(op, "ZeroDivisionError: integer division or modulo by zero"));
    }
    Ok(())
}

/// Receives the element kernel of a binary call (out-of-place execution, or in-place update).
pub(crate) trait KernelVisitor {
    fn visit<K: BinKernel>(self, k: &K) -> Result<Tensor>;
}

struct Exec<'a> {
    op: &'a str,
    a: Arg<'a>,
    b: Arg<'a>,
    d: DType,
}
impl KernelVisitor for Exec<'_> {
    fn visit<K: BinKernel>(self, k: &K) -> Result<Tensor> {
        exec(self.op, &self.a, &self.b, self.d, k)
    }
}

/// Runs the arithmetic of a binary op out of place, computing in `sig.dtype`.
pub(crate) fn compute(op: &str, args: &[Value], sig: &Sig) -> Result<Tensor> {
    let d = sig.dtype;
    with_kernel(op, args, d, sig.b, Exec { op, a: sig.a, b: sig.b, d })
}

/// Selects the element kernel of binary op `op` (after its checks, e.g. integer division by
/// zero) and hands it to `v`.
pub(crate) fn with_kernel(op: &str, args: &[Value], d: DType, b: Arg, v: impl KernelVisitor) -> Result<Tensor> {
    match op.trim_end_matches('_') {
        "add" | "sub" | "rsub" => {
            let alpha = scalar(op, args, 2)?;
            let sign = match op.trim_end_matches('_') {
                "add" => 1,
                "sub" => -1,
                _ => 0,
            };
            if alpha.to_f64() == 1.0 && sign == 1 {
                v.visit(&AddK)
            } else if alpha.to_f64() == 1.0 && sign == -1 {
                v.visit(&SubK)
            } else if alpha.to_f64() == 1.0 {
                v.visit(&RsubK)
            } else {
                v.visit(&AlphaK { alpha, sign })
            }
        }
        "mul" => v.visit(&MulK),
        "div" => match rounding(op, args.get(2).unwrap_or(&Value::None))? {
            Rounding::None => v.visit(&DivK),
            Rounding::Trunc => {
                check_int_divisor(op, &b, d)?;
                v.visit(&DivTruncK)
            }
            Rounding::Floor => {
                check_int_divisor(op, &b, d)?;
                v.visit(&DivFloorK)
            }
        },
        "pow" => match b {
            Arg::Scalar(s) if s.to_f64() == 2.0 => v.visit(&SquareK),
            _ => v.visit(&PowK),
        },
        "maximum" => v.visit(&MaximumK),
        "minimum" => v.visit(&MinimumK),
        "remainder" => {
            check_int_divisor(op, &b, d)?;
            v.visit(&RemainderK)
        }
        "fmod" => {
            check_int_divisor(op, &b, d)?;
            v.visit(&FmodK)
        }
        other => Err(Error::schema(op, format!("no binary arithmetic named {other}"))),
    }
}

macro_rules! binary_op {
    ($STATIC:ident, $name:literal, $schema:expr, $doc:literal) => {
        #[doc = $doc]
        pub static $STATIC: OpDef = OpDef {
            name: $name,
            schema: $schema,
            meta: |args| {
                let s = signature($name, args, true)?;
                Ok(smallvec![TensorMeta::contiguous(&s.shape, s.dtype)])
            },
            kernel: |args| {
                let s = signature($name, args, false)?;
                Ok(smallvec![compute($name, args, &s)?])
            },
            cost: cost_elementwise,
            effect: Effect::Pure,
            category: Category::Elementwise,
            backward: crate::autograd::formulas::elementwise::backward_for($name),
            saves: crate::autograd::formulas::elementwise::saves_for($name),
            doc: $doc,
        };
    };
}

pub(crate) const ADD_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("other", T::TensorOrScalar),
    ArgSpec::kw("alpha", T::Scalar, D::Int(1)),
];
pub(crate) const BIN_SCHEMA: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::req("other", T::TensorOrScalar)];
pub(crate) const DIV_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("other", T::TensorOrScalar),
    ArgSpec::kw("rounding_mode", T::OptStr, D::None),
];
pub(crate) const POW_SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("input", T::TensorOrScalar), ArgSpec::req("exponent", T::TensorOrScalar)];
pub(crate) const TENSOR_PAIR: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::req("other", T::Tensor)];
const REMAINDER_SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("input", T::TensorOrScalar), ArgSpec::req("other", T::TensorOrScalar)];

binary_op!(ADD, "add", ADD_SCHEMA, "`input + alpha * other` with broadcasting and type promotion.");
binary_op!(SUB, "sub", ADD_SCHEMA, "`input - alpha * other` (bool operands rejected).");
binary_op!(RSUB, "rsub", ADD_SCHEMA, "`other - alpha * input` (what `number - tensor` records).");
binary_op!(MUL, "mul", BIN_SCHEMA, "`input * other`.");
binary_op!(
    DIV,
    "div",
    DIV_SCHEMA,
    "`input / other`: true division (integers give float32), or rounded with rounding_mode 'trunc'/'floor'."
);
binary_op!(POW, "pow", POW_SCHEMA, "`input ** exponent` (either may be a number).");
binary_op!(MAXIMUM, "maximum", TENSOR_PAIR, "Elementwise maximum (NaN propagates).");
binary_op!(MINIMUM, "minimum", TENSOR_PAIR, "Elementwise minimum (NaN propagates).");
binary_op!(REMAINDER, "remainder", REMAINDER_SCHEMA, "Python's modulus: the result has the sign of the divisor.");
binary_op!(FMOD, "fmod", BIN_SCHEMA, "C's fmod: the result has the sign of the dividend.");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&ADD, &SUB, &RSUB, &MUL, &DIV, &POW, &MAXIMUM, &MINIMUM, &REMAINDER, &FMOD];

// ---------------------------------------------------------------------------------------------
// Public API. `other` is anything that converts into a [`Value`]: `&Tensor`, `Tensor`, `f64`,
// `i64`, `bool` or [`Scalar`].

/// `add(input, other)`: `input + other` with broadcasting and type promotion.
///
/// ```
/// use ferrofx_core::{ops::binary::add, Tensor, DType};
/// let x = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
/// let y = add(&x, 0.5).unwrap(); // int tensor + float number -> float32
/// assert_eq!(y.dtype(), DType::F32);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.5, 2.5, 3.5]);
/// ```
pub fn add(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
    call1(&ADD, CallKind::Function, &[input.into(), other.into(), Value::Int(1)])
}
/// `add(input, other, alpha=alpha)`: `input + alpha * other`.
pub fn add_alpha(input: &Tensor, other: impl Into<Value>, alpha: impl Into<Scalar>) -> Result<Tensor> {
    call1(&ADD, CallKind::Function, &[input.into(), other.into(), alpha.into().into()])
}
/// `sub(input, other)`.
pub fn sub(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
    call1(&SUB, CallKind::Function, &[input.into(), other.into(), Value::Int(1)])
}
/// `sub(input, other, alpha=alpha)`: `input - alpha * other`.
pub fn sub_alpha(input: &Tensor, other: impl Into<Value>, alpha: impl Into<Scalar>) -> Result<Tensor> {
    call1(&SUB, CallKind::Function, &[input.into(), other.into(), alpha.into().into()])
}
/// `rsub(input, other)`: `other - input`.
pub fn rsub(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
    call1(&RSUB, CallKind::Function, &[input.into(), other.into(), Value::Int(1)])
}
/// `mul(input, other)`.
pub fn mul(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
    call1(&MUL, CallKind::Function, &[input.into(), other.into()])
}
/// `div(input, other)`: true division (integer inputs give float32).
pub fn div(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
    call1(&DIV, CallKind::Function, &[input.into(), other.into(), Value::None])
}
/// `div(input, other, rounding_mode=...)` with `"trunc"` or `"floor"`.
pub fn div_mode(input: &Tensor, other: impl Into<Value>, rounding_mode: &str) -> Result<Tensor> {
    call1(&DIV, CallKind::Function, &[input.into(), other.into(), rounding_mode.into()])
}
/// `pow(input, exponent)`: either may be a number (`pow(2.0, &x)`).
pub fn pow(input: impl Into<Value>, exponent: impl Into<Value>) -> Result<Tensor> {
    call1(&POW, CallKind::Function, &[input.into(), exponent.into()])
}
/// `maximum(input, other)`.
pub fn maximum(input: &Tensor, other: &Tensor) -> Result<Tensor> {
    call1(&MAXIMUM, CallKind::Function, &[input.into(), other.into()])
}
/// `minimum(input, other)`.
pub fn minimum(input: &Tensor, other: &Tensor) -> Result<Tensor> {
    call1(&MINIMUM, CallKind::Function, &[input.into(), other.into()])
}
/// `remainder(input, other)` (Python's `%`); either may be a number.
pub fn remainder(input: impl Into<Value>, other: impl Into<Value>) -> Result<Tensor> {
    call1(&REMAINDER, CallKind::Function, &[input.into(), other.into()])
}
/// `fmod(input, other)`.
pub fn fmod(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
    call1(&FMOD, CallKind::Function, &[input.into(), other.into()])
}

impl Tensor {
    /// `self + other` (tensor or number).
    pub fn add(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&ADD, CallKind::Method, &[self.into(), other.into(), Value::Int(1)])
    }
    /// `self + alpha * other`.
    pub fn add_alpha(&self, other: impl Into<Value>, alpha: impl Into<Scalar>) -> Result<Tensor> {
        call1(&ADD, CallKind::Method, &[self.into(), other.into(), alpha.into().into()])
    }
    /// `self - other`.
    pub fn sub(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&SUB, CallKind::Method, &[self.into(), other.into(), Value::Int(1)])
    }
    /// `self - alpha * other`.
    pub fn sub_alpha(&self, other: impl Into<Value>, alpha: impl Into<Scalar>) -> Result<Tensor> {
        call1(&SUB, CallKind::Method, &[self.into(), other.into(), alpha.into().into()])
    }
    /// `self * other`.
    pub fn mul(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&MUL, CallKind::Method, &[self.into(), other.into()])
    }
    /// `self / other` (true division).
    pub fn div(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&DIV, CallKind::Method, &[self.into(), other.into(), Value::None])
    }
    /// `self / other` rounded with `"trunc"` or `"floor"`.
    pub fn div_mode(&self, other: impl Into<Value>, rounding_mode: &str) -> Result<Tensor> {
        call1(&DIV, CallKind::Method, &[self.into(), other.into(), rounding_mode.into()])
    }
    /// `self ** exponent`.
    pub fn pow(&self, exponent: impl Into<Value>) -> Result<Tensor> {
        call1(&POW, CallKind::Method, &[self.into(), exponent.into()])
    }
    /// Elementwise maximum.
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        call1(&MAXIMUM, CallKind::Method, &[self.into(), other.into()])
    }
    /// Elementwise minimum.
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        call1(&MINIMUM, CallKind::Method, &[self.into(), other.into()])
    }
    /// Python-style remainder (sign of the divisor).
    pub fn remainder(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&REMAINDER, CallKind::Method, &[self.into(), other.into()])
    }
    /// C-style fmod (sign of the dividend).
    pub fn fmod(&self, other: impl Into<Value>) -> Result<Tensor> {
        call1(&FMOD, CallKind::Method, &[self.into(), other.into()])
    }
}
