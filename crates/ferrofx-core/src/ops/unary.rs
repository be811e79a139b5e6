//! Unary elementwise ops: `neg abs exp expm1 log log1p log2 log10 sqrt rsqrt sin cos tan atan
//! tanh sigmoid relu relu6 gelu silu leaky_relu elu selu softplus softsign hardswish hardsigmoid
//! hardtanh clamp reciprocal sign floor ceil round trunc erf`.
//!
//! Dtype rules follow PyTorch:
//! - *floating* ops (`exp`, `log`, `sqrt`, `sigmoid`, `erf`, `reciprocal`, ...) accept integer
//!   and bool inputs and return the default float dtype (float32);
//! - *activation* ops (`gelu`, `silu`, `elu`, `softplus`, `hardswish`, ...) accept only floating
//!   inputs, like PyTorch's CPU kernels (`"gelu" not implemented for 'Long'`);
//! - `neg abs relu hardtanh floor ceil round trunc sign` keep the input dtype (bool rejected
//!   except by `sign`);
//! - `clamp` computes in `result_type(input, min, max)`.
//!
//! float16/bfloat16 compute in float32 and round back.

use crate::dtype::{result_type, DType, Operand};
use crate::error::{Error, Result};
use crate::op::args::{int, scalar, str_, tensor};
use crate::op::{
    cost_elementwise, dispatch, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef,
    Outputs,
};
use crate::ops::kernel::{binary_map, cast, unary_map};
use crate::ops::num::{narrow_scalar, tensor_operand, torch_name, wide_dtype, Float, Num};
use crate::scalar::Scalar;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use half::{bf16, f16};
use smallvec::smallvec;

// ---------------------------------------------------------------------------------------------
// Generic element functions and the maps that apply them to every dtype.

/// A function applied to floating elements (f32/f64; halves go through f32).
pub(crate) trait FloatFn: Sync + Send {
    fn call<F: Float>(&self, x: F) -> F;
}

/// A function applied to any numeric element (keeps the dtype).
pub(crate) trait NumFn: Sync + Send {
    fn call<N: Num>(&self, x: N) -> N;
    /// The same function on floats (rounding ops differ between ints and floats).
    fn call_float<F: Float>(&self, x: F) -> F {
        self.call(x)
    }
}

/// Applies `o` computing in floating point: float inputs keep their dtype, integer and bool
/// inputs produce the default float dtype.
pub(crate) fn float_map<O: FloatFn>(op: &str, t: &Tensor, o: &O) -> Result<Tensor> {
    match t.dtype() {
        DType::F32 => unary_map::<f32, f32>(op, t, |x| o.call(x)),
        DType::F64 => unary_map::<f64, f64>(op, t, |x| o.call(x)),
        d @ (DType::F16 | DType::BF16) => cast(&unary_map::<f32, f32>(op, &cast(t, DType::F32)?, |x| o.call(x))?, d),
        _ => unary_map::<f32, f32>(op, &cast(t, DType::F32)?, |x| o.call(x)),
    }
}

/// Applies `o` in the input's own dtype.
pub(crate) fn num_map<O: NumFn>(op: &str, t: &Tensor, o: &O) -> Result<Tensor> {
    let d = t.dtype();
    match d {
        DType::F32 => unary_map::<f32, f32>(op, t, |x| o.call_float(x)),
        DType::F64 => unary_map::<f64, f64>(op, t, |x| o.call_float(x)),
        DType::F16 | DType::BF16 => cast(&unary_map::<f32, f32>(op, &cast(t, DType::F32)?, |x| o.call_float(x))?, d),
        DType::Bool => unary_map::<bool, bool>(op, t, |x| o.call(x)),
        DType::I64 => unary_map::<i64, i64>(op, t, |x| o.call(x)),
        _ => cast(&unary_map::<i64, i64>(op, &cast(t, DType::I64)?, |x| o.call(x))?, d),
    }
}

/// How an op treats input dtypes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Integer/bool inputs promote to float32.
    Floating,
    /// Only floating inputs.
    FloatOnly,
    /// Keeps the dtype; bool rejected.
    NoBool,
    /// Keeps the dtype; every dtype.
    Any,
}

fn not_implemented(op: &str, d: DType) -> Error {
    Error::dtype(op, format!("\"{op}\" not implemented for '{}'", torch_name(d)))
}

fn out_dtype(op: &str, kind: Kind, d: DType) -> Result<DType> {
    match kind {
        Kind::Floating => Ok(if d.is_floating_point() { d } else { crate::dtype::DEFAULT_FLOAT }),
        Kind::FloatOnly if !d.is_floating_point() => Err(not_implemented(op, d)),
        Kind::NoBool if d == DType::Bool => Err(match op {
            "neg" => Error::dtype(op, "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."),
            "relu" | "relu6" => Error::dtype(op, format!("Boolean inputs not supported for {op}")),
            "hardtanh" => Error::dtype(op, "Bool inputs not supported for hardtanh"),
            _ => not_implemented(op, d),
        }),
        _ => Ok(d),
    }
}

fn same_shape_meta(t: &Tensor, dtype: DType) -> MetaOutputs {
    smallvec![TensorMeta::contiguous(t.shape(), dtype)]
}

/// Defines a unary op with a kind, an element function (a `FloatFn` for Floating/FloatOnly, a
/// `NumFn` for NoBool/Any), an optional argument check, and an optional schema tail.
macro_rules! unary_op {
    ($STATIC:ident, $name:literal, $kind:expr, $schema:expr, $doc:literal,
     check: |$cargs:ident| $check:expr,
     kernel: |$t:ident, $args:ident| $kernel:expr) => {
        #[doc = $doc]
        pub static $STATIC: OpDef = OpDef {
            name: $name,
            schema: $schema,
            meta: |args| {
                let t = tensor($name, args, 0)?;
                let $cargs = args;
                $check?;
                Ok(same_shape_meta(t, out_dtype($name, $kind, t.dtype())?))
            },
            kernel: |args| {
                let $t = tensor($name, args, 0)?;
                out_dtype($name, $kind, $t.dtype())?;
                let $cargs = args;
                $check?;
                let $args = args;
                Ok(smallvec![$kernel?])
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

fn ok() -> Result<()> {
    Ok(())
}

/// Defines a stateless FloatFn.
macro_rules! float_fn {
    ($S:ident, |$x:ident| $body:expr) => {
        struct $S;
        impl FloatFn for $S {
            #[inline(always)]
            fn call<F: Float>(&self, $x: F) -> F {
                $body
            }
        }
    };
}

/// Defines a simple floating op (integer inputs promote to float32).
macro_rules! floating_op {
    ($STATIC:ident, $S:ident, $name:literal, $doc:literal, |$x:ident| $body:expr) => {
        float_fn!($S, |$x| $body);
        unary_op!($STATIC, $name, Kind::Floating, SELF_ONLY, $doc, check: |_a| ok(), kernel: |t, _a| float_map($name, t, &$S));
    };
}

/// Defines a stateless activation (floating inputs only).
macro_rules! activation_op {
    ($STATIC:ident, $S:ident, $name:literal, $doc:literal, |$x:ident| $body:expr) => {
        float_fn!($S, |$x| $body);
        unary_op!($STATIC, $name, Kind::FloatOnly, SELF_ONLY, $doc, check: |_a| ok(), kernel: |t, _a| float_map($name, t, &$S));
    };
}

const SELF_ONLY: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor)];

#[inline(always)]
fn one<F: Float>() -> F {
    F::c(1.0)
}

#[inline(always)]
fn sigmoid_f<F: Float>(x: F) -> F {
    one::<F>().div(one::<F>().add(x.neg().exp()))
}

floating_op!(EXP, Exp, "exp", "`e^x` elementwise.", |x| x.exp());
floating_op!(EXPM1, Expm1, "expm1", "`e^x - 1` elementwise (accurate near 0).", |x| x.exp_m1());
floating_op!(LOG, Log, "log", "Natural logarithm elementwise.", |x| x.ln());
floating_op!(LOG1P, Log1p, "log1p", "`ln(1 + x)` elementwise (accurate near 0).", |x| x.ln_1p());
floating_op!(LOG2, Log2, "log2", "Base-2 logarithm elementwise.", |x| x.log2());
floating_op!(LOG10, Log10, "log10", "Base-10 logarithm elementwise.", |x| x.log10());
floating_op!(SQRT, Sqrt, "sqrt", "Square root elementwise.", |x| x.sqrt());
floating_op!(RSQRT, Rsqrt, "rsqrt", "`1 / sqrt(x)` elementwise.", |x| one::<F>().div(x.sqrt()));
floating_op!(SIN, Sin, "sin", "Sine elementwise.", |x| x.sin());
floating_op!(COS, Cos, "cos", "Cosine elementwise.", |x| x.cos());
floating_op!(TAN, Tan, "tan", "Tangent elementwise.", |x| x.tan());
floating_op!(ATAN, Atan, "atan", "Arc tangent elementwise.", |x| x.atan());
floating_op!(TANH, Tanh, "tanh", "Hyperbolic tangent elementwise.", |x| x.tanh());
floating_op!(SIGMOID, Sigmoid, "sigmoid", "`1 / (1 + e^-x)` elementwise.", |x| sigmoid_f(x));
floating_op!(RECIPROCAL, Reciprocal, "reciprocal", "`1 / x` elementwise.", |x| one::<F>().div(x));
floating_op!(ERF, Erf, "erf", "The error function elementwise.", |x| x.erf());

activation_op!(SILU, Silu, "silu", "SiLU (swish): `x * sigmoid(x)`.", |x| x.div(one::<F>().add(x.neg().exp())));
activation_op!(
    SELU,
    Selu,
    "selu",
    "SELU: `scale * (max(0,x) + min(0, alpha * (e^x - 1)))` with PyTorch's constants.",
    |x| {
        let scale = F::c(1.050_700_987_355_480_5);
        let alpha = F::c(1.673_263_242_354_377_2);
        if x > F::zero() {
            x.mul(scale)
        } else {
            x.exp_m1().mul(alpha.mul(scale))
        }
    }
);
activation_op!(HARDSWISH, Hardswish, "hardswish", "`x * relu6(x + 3) / 6`.", |x| x
    .mul(clamp_f(x.add(F::c(3.0)), F::zero(), F::c(6.0)))
    .div(F::c(6.0)));
activation_op!(HARDSIGMOID, Hardsigmoid, "hardsigmoid", "`relu6(x + 3) / 6`.", |x| clamp_f(
    x.add(F::c(3.0)),
    F::zero(),
    F::c(6.0)
)
.div(F::c(6.0)));

#[inline(always)]
fn clamp_f<N: Num>(x: N, lo: N, hi: N) -> N {
    let y = if x < lo { lo } else { x };
    if y > hi {
        hi
    } else {
        y
    }
}

// softsign: float ops on ints promote (it is abs + div in PyTorch), bool rejected (by abs).
float_fn!(Softsign, |x| x.div(one::<F>().add(Num::abs(x))));
unary_op!(SOFTSIGN, "softsign", Kind::Floating, SELF_ONLY, "`x / (1 + |x|)`.",
    check: |a| {
        let t = tensor("softsign", a, 0)?;
        if t.dtype() == DType::Bool { Err(not_implemented("abs", DType::Bool).in_op("softsign")) } else { ok() }
    },
    kernel: |t, _a| float_map("softsign", t, &Softsign));

// ---- parametrised activations ----

struct Gelu {
    tanh: bool,
}
impl FloatFn for Gelu {
    #[inline(always)]
    fn call<F: Float>(&self, x: F) -> F {
        let half = F::c(0.5);
        if self.tanh {
            let k = F::c(0.7978845608028654); // sqrt(2/pi)
            let inner = k.mul(x.add(F::c(0.044715).mul(x).mul(x).mul(x)));
            half.mul(x).mul(one::<F>().add(inner.tanh()))
        } else {
            x.mul(half).mul(one::<F>().add(x.mul(F::c(std::f64::consts::FRAC_1_SQRT_2)).erf()))
        }
    }
}
fn gelu_mode(args: &[Value]) -> Result<bool> {
    match str_("gelu", args, 1)? {
        "none" => Ok(false),
        "tanh" => Ok(true),
        other => {
            Err(Error::argument("gelu", format!("approximate argument must be either none or tanh, got '{other}'.")))
        }
    }
}
unary_op!(GELU, "gelu", Kind::FloatOnly,
    &[ArgSpec::req("input", T::Tensor), ArgSpec::kw("approximate", T::Str, D::Str("none"))],
    "GELU: `x * Phi(x)` (exact with erf, or the tanh approximation).",
    check: |a| gelu_mode(a).map(|_| ()),
    kernel: |t, a| gelu_kernel(t, a));

/// GELU: f32 in the exact (erf) form runs the vectorised `vmath::gelu_slice`; other dtypes
/// and the tanh form go through the generic element map.
fn gelu_kernel(t: &Tensor, args: &[Value]) -> Result<Tensor> {
    let tanh = gelu_mode(args)?;
    if !tanh && t.dtype() == DType::F32 {
        return crate::ops::kernel::unary_map_slices::<f32, f32>("gelu", t, crate::ops::vmath::gelu_slice);
    }
    float_map("gelu", t, &Gelu { tanh })
}

struct LeakyRelu(f64);
impl FloatFn for LeakyRelu {
    #[inline(always)]
    fn call<F: Float>(&self, x: F) -> F {
        if x > F::zero() {
            x
        } else {
            x.mul(F::c(self.0))
        }
    }
}
unary_op!(LEAKY_RELU, "leaky_relu", Kind::FloatOnly,
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("negative_slope", T::Scalar, D::Float(0.01))],
    "`x if x > 0 else negative_slope * x`.",
    check: |a| scalar("leaky_relu", a, 1).map(|_| ()),
    kernel: |t, a| float_map("leaky_relu", t, &LeakyRelu(scalar("leaky_relu", a, 1)?.to_f64())));

struct Elu {
    alpha: f64,
    scale: f64,
    input_scale: f64,
}
impl FloatFn for Elu {
    #[inline(always)]
    fn call<F: Float>(&self, x: F) -> F {
        if x > F::zero() {
            x.mul(F::c(self.scale))
        } else {
            x.mul(F::c(self.input_scale)).exp_m1().mul(F::c(self.alpha * self.scale))
        }
    }
}
fn elu_params(args: &[Value]) -> Result<Elu> {
    Ok(Elu {
        alpha: scalar("elu", args, 1)?.to_f64(),
        scale: scalar("elu", args, 2)?.to_f64(),
        input_scale: scalar("elu", args, 3)?.to_f64(),
    })
}
unary_op!(ELU, "elu", Kind::FloatOnly,
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("alpha", T::Scalar, D::Float(1.0)), ArgSpec::opt("scale", T::Scalar, D::Float(1.0)), ArgSpec::opt("input_scale", T::Scalar, D::Float(1.0))],
    "ELU: `x if x > 0 else alpha * (e^x - 1)` (with PyTorch's scale/input_scale).",
    check: |a| elu_params(a).map(|_| ()),
    kernel: |t, a| float_map("elu", t, &elu_params(a)?));

struct Softplus {
    beta: f64,
    threshold: f64,
}
impl FloatFn for Softplus {
    #[inline(always)]
    fn call<F: Float>(&self, x: F) -> F {
        let b = F::c(self.beta);
        let bx = x.mul(b);
        if bx > F::c(self.threshold) {
            x
        } else {
            bx.exp().ln_1p().div(b)
        }
    }
}
fn softplus_params(args: &[Value]) -> Result<Softplus> {
    Ok(Softplus { beta: scalar("softplus", args, 1)?.to_f64(), threshold: scalar("softplus", args, 2)?.to_f64() })
}
unary_op!(SOFTPLUS, "softplus", Kind::FloatOnly,
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("beta", T::Scalar, D::Int(1)), ArgSpec::opt("threshold", T::Scalar, D::Int(20))],
    "`log(1 + e^(beta x)) / beta`, linear above `threshold`.",
    check: |a| softplus_params(a).map(|_| ()),
    kernel: |t, a| float_map("softplus", t, &softplus_params(a)?));

// ---- dtype-preserving ops ----

/// Defines a stateless NumFn (with an optional different float body).
macro_rules! num_fn {
    ($S:ident, |$x:ident| $body:expr) => {
        struct $S;
        impl NumFn for $S {
            #[inline(always)]
            fn call<N: Num>(&self, $x: N) -> N {
                $body
            }
        }
    };
    ($S:ident, |$x:ident| $body:expr, float |$y:ident| $fbody:expr) => {
        struct $S;
        impl NumFn for $S {
            #[inline(always)]
            fn call<N: Num>(&self, $x: N) -> N {
                $body
            }
            #[inline(always)]
            fn call_float<F: Float>(&self, $y: F) -> F {
                $fbody
            }
        }
    };
}

num_fn!(Neg, |x| x.neg());
num_fn!(Abs, |x| x.abs());
num_fn!(Relu, |x| if x < N::zero() { N::zero() } else { x });
num_fn!(Sign, |x| x.sign());
num_fn!(Floor, |x| x, float | x | x.floor());
num_fn!(Ceil, |x| x, float | x | x.ceil());
num_fn!(Trunc, |x| x, float | x | x.trunc());

unary_op!(NEG, "neg", Kind::NoBool, SELF_ONLY, "`-x` elementwise (integers wrap).", check: |_a| ok(), kernel: |t, _a| num_map("neg", t, &Neg));
unary_op!(ABS, "abs", Kind::NoBool, SELF_ONLY, "`|x|` elementwise.", check: |_a| ok(), kernel: |t, _a| num_map("abs", t, &Abs));
unary_op!(RELU, "relu", Kind::NoBool, SELF_ONLY, "`max(x, 0)` elementwise (NaN propagates).", check: |_a| ok(), kernel: |t, _a| num_map("relu", t, &Relu));
unary_op!(SIGN, "sign", Kind::Any, SELF_ONLY, "-1, 0 or 1 by sign (bool stays bool).", check: |_a| ok(), kernel: |t, _a| num_map("sign", t, &Sign));
unary_op!(FLOOR, "floor", Kind::NoBool, SELF_ONLY, "Rounds toward -inf (integers unchanged).", check: |_a| ok(), kernel: |t, _a| num_map("floor", t, &Floor));
unary_op!(CEIL, "ceil", Kind::NoBool, SELF_ONLY, "Rounds toward +inf (integers unchanged).", check: |_a| ok(), kernel: |t, _a| num_map("ceil", t, &Ceil));
unary_op!(TRUNC, "trunc", Kind::NoBool, SELF_ONLY, "Rounds toward zero (integers unchanged).", check: |_a| ok(), kernel: |t, _a| num_map("trunc", t, &Trunc));

struct Round(i64);
impl NumFn for Round {
    #[inline(always)]
    fn call<N: Num>(&self, x: N) -> N {
        x
    }
    #[inline(always)]
    fn call_float<F: Float>(&self, x: F) -> F {
        // PyTorch: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for d < 0.
        if self.0 == 0 {
            x.round_even()
        } else if self.0 > 0 {
            let p = F::c(10f64.powi(self.0 as i32));
            x.mul(p).round_even().div(p)
        } else {
            let p = F::c(10f64.powi((-self.0) as i32));
            x.div(p).round_even().mul(p)
        }
    }
}
fn round_check(args: &[Value]) -> Result<()> {
    let t = tensor("round", args, 0)?;
    let d = int("round", args, 1)?;
    if d != 0 && !t.dtype().is_floating_point() {
        return Err(Error::dtype(
            "round",
            format!("\"round\" with decimals={d} not implemented for '{}'", torch_name(t.dtype())),
        ));
    }
    if d.unsigned_abs() > 300 {
        return Err(Error::argument("round", format!("decimals must be in [-300, 300], got {d}")));
    }
    Ok(())
}
unary_op!(ROUND, "round", Kind::NoBool,
    &[ArgSpec::req("input", T::Tensor), ArgSpec::kw("decimals", T::Int, D::Int(0))],
    "Rounds half to even, optionally to `decimals` decimal places (integers unchanged).",
    check: |a| round_check(a),
    kernel: |t, a| num_map("round", t, &Round(int("round", a, 1)?)));

// ---- hardtanh / relu6 / clamp ----

struct ClampS<N> {
    lo: Option<N>,
    hi: Option<N>,
}
impl<N: Num> ClampS<N> {
    #[inline(always)]
    fn apply(&self, x: N) -> N {
        let mut y = x;
        if let Some(lo) = self.lo {
            if y < lo {
                y = lo;
            }
        }
        if let Some(hi) = self.hi {
            if y > hi {
                y = hi;
            }
        }
        y
    }
}

/// Clamps `t` (already of the compute dtype) between scalar bounds.
fn clamp_scalars(op: &str, t: &Tensor, lo: Option<Scalar>, hi: Option<Scalar>) -> Result<Tensor> {
    let d = t.dtype();
    match d {
        DType::F16 | DType::BF16 => {
            let c = ClampS { lo: lo.map(f32::from_scalar), hi: hi.map(f32::from_scalar) };
            if d == DType::F16 {
                unary_map::<f16, f16>(op, t, |x| f16::from_f32(c.apply(x.to_f32())))
            } else {
                unary_map::<bf16, bf16>(op, t, |x| bf16::from_f32(c.apply(x.to_f32())))
            }
        }
        DType::U8 | DType::I8 | DType::I16 | DType::I32 => {
            let n = |s: Scalar| i64::from_scalar(narrow_scalar(s, d));
            let c = ClampS { lo: lo.map(n), hi: hi.map(n) };
            cast(&unary_map::<i64, i64>(op, &cast(t, DType::I64)?, |x| c.apply(x))?, d)
        }
        _ => crate::match_wide!(d, N => {
            let c = ClampS { lo: lo.map(N::from_scalar), hi: hi.map(N::from_scalar) };
            unary_map::<N, N>(op, t, |x| c.apply(x))
        }),
    }
}

fn hardtanh_bounds(op: &str, args: &[Value]) -> Result<(Scalar, Scalar)> {
    let (lo, hi) = (scalar(op, args, 1)?, scalar(op, args, 2)?);
    if lo.to_f64() > hi.to_f64() {
        return Err(Error::argument(
            op,
            format!("min_val cannot be greater than max_val (got min_val={}, max_val={})", lo.to_f64(), hi.to_f64()),
        ));
    }
    Ok((lo, hi))
}
unary_op!(HARDTANH, "hardtanh", Kind::NoBool,
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("min_val", T::Scalar, D::Int(-1)), ArgSpec::opt("max_val", T::Scalar, D::Int(1))],
    "Clamps to `[min_val, max_val]`, keeping the dtype.",
    check: |a| hardtanh_bounds("hardtanh", a).map(|_| ()),
    kernel: |t, a| { let (lo, hi) = hardtanh_bounds("hardtanh", a)?; clamp_scalars("hardtanh", t, Some(lo), Some(hi)) });
unary_op!(RELU6, "relu6", Kind::NoBool, SELF_ONLY, "`min(max(x, 0), 6)`, keeping the dtype.",
    check: |_a| ok(),
    kernel: |t, _a| clamp_scalars("relu6", t, Some(Scalar::Int(0)), Some(Scalar::Int(6))));

/// A `clamp` bound: absent, a number or a tensor.
enum Bound<'a> {
    None,
    Scalar(Scalar),
    Tensor(&'a Tensor),
}
fn bound<'a>(args: &'a [Value], i: usize) -> Result<Bound<'a>> {
    match args.get(i) {
        None | Some(Value::None) => Ok(Bound::None),
        Some(Value::Tensor(t)) => Ok(Bound::Tensor(t)),
        Some(v) => v.as_scalar().map(Bound::Scalar).ok_or_else(|| {
            Error::schema(
                "clamp",
                format!(
                    "argument {} must be Tensor, Scalar or None, got {}",
                    if i == 1 { "'min'" } else { "'max'" },
                    v.type_name()
                ),
            )
        }),
    }
}
fn clamp_meta(args: &[Value]) -> Result<(crate::layout::Shape, DType)> {
    let t = tensor("clamp", args, 0)?;
    let (lo, hi) = (bound(args, 1)?, bound(args, 2)?);
    if matches!((&lo, &hi), (Bound::None, Bound::None)) {
        return Err(Error::argument("clamp", "torch.clamp: At least one of 'min' or 'max' must not be None"));
    }
    let mut ops = vec![tensor_operand(t)];
    let mut shape: crate::layout::Shape = t.shape().into();
    for b in [&lo, &hi] {
        match b {
            Bound::None => {}
            Bound::Scalar(s) => ops.push(Operand::Scalar(s.dtype())),
            Bound::Tensor(bt) => {
                ops.push(tensor_operand(bt));
                shape = crate::layout::broadcast_shapes("clamp", &shape, bt.shape())?;
            }
        }
    }
    let d = result_type(&ops);
    if d == DType::Bool {
        return Err(not_implemented("clamp", d));
    }
    Ok((shape, d))
}

/// `clamp(input, min=None, max=None)`: bounds are numbers or tensors (broadcast); computes in
/// `result_type(input, min, max)`.
pub static CLAMP: OpDef = OpDef {
    name: "clamp",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::opt("min", T::OptTensorOrScalar, D::None),
        ArgSpec::opt("max", T::OptTensorOrScalar, D::None),
    ],
    meta: |args| {
        let (shape, d) = clamp_meta(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, d)])
    },
    kernel: |args| {
        let (_, d) = clamp_meta(args)?;
        let t = cast(tensor("clamp", args, 0)?, d)?;
        let (lo, hi) = (bound(args, 1)?, bound(args, 2)?);
        let scalar_of = |b: &Bound| match b {
            Bound::Scalar(s) => Some(*s),
            _ => None,
        };
        if !matches!(lo, Bound::Tensor(_)) && !matches!(hi, Bound::Tensor(_)) {
            return Ok(smallvec![clamp_scalars("clamp", &t, scalar_of(&lo), scalar_of(&hi))?]);
        }
        // Tensor bounds: apply max(x, lo) then min(., hi), each with broadcasting; NaN in x
        // propagates.
        let apply = |x: Tensor, b: &Bound, upper: bool| -> Result<Tensor> {
            let bt = match b {
                Bound::None => return Ok(x),
                Bound::Scalar(s) => return clamp_scalars("clamp", &x, (!upper).then_some(*s), upper.then_some(*s)),
                Bound::Tensor(bt) => cast(bt, d)?,
            };
            let wide = matches!(d, DType::F16 | DType::BF16);
            let (x, bt) = if wide { (cast(&x, DType::F32)?, cast(&bt, DType::F32)?) } else { (x, bt) };
            let cd = x.dtype();
            let cd = wide_dtype(cd);
            let (x, bt) = (cast(&x, cd)?, cast(&bt, cd)?);
            #[allow(clippy::bool_comparison)]
            let r = crate::match_wide!(cd, N => binary_map::<N, N>("clamp", &x, &bt, |v, l| {
                if upper { if v > l { l } else { v } } else if v < l { l } else { v }
            }))?;
            if wide || cd != d {
                cast(&r, d)
            } else {
                Ok(r)
            }
        };
        let r = apply(t, &lo, false)?;
        Ok(smallvec![apply(r, &hi, true)?])
    },
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: crate::autograd::formulas::elementwise::backward_for("clamp"),
    saves: crate::autograd::formulas::elementwise::saves_for("clamp"),
    doc: "Clamps every element to [min, max] (bounds may be numbers or tensors).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &NEG,
    &ABS,
    &EXP,
    &EXPM1,
    &LOG,
    &LOG1P,
    &LOG2,
    &LOG10,
    &SQRT,
    &RSQRT,
    &SIN,
    &COS,
    &TAN,
    &ATAN,
    &TANH,
    &SIGMOID,
    &RELU,
    &RELU6,
    &GELU,
    &SILU,
    &LEAKY_RELU,
    &ELU,
    &SELU,
    &SOFTPLUS,
    &SOFTSIGN,
    &HARDSWISH,
    &HARDSIGMOID,
    &HARDTANH,
    &CLAMP,
    &RECIPROCAL,
    &SIGN,
    &FLOOR,
    &CEIL,
    &ROUND,
    &TRUNC,
    &ERF,
];

// ---------------------------------------------------------------------------------------------
// Public API.

#[inline]
pub(crate) fn call1(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Tensor> {
    let mut out: Outputs = dispatch(op, kind, args)?;
    out.pop().ok_or_else(|| Error::schema(op.name, "op returned no output"))
}

macro_rules! simple_api {
    ($($fname:ident => $STATIC:ident, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            pub fn $fname(input: &Tensor) -> Result<Tensor> {
                call1(&$STATIC, CallKind::Function, &[input.into()])
            }
        )*
        impl Tensor {
            $(
                #[doc = $doc]
                pub fn $fname(&self) -> Result<Tensor> {
                    call1(&$STATIC, CallKind::Method, &[self.into()])
                }
            )*
        }
    };
}

simple_api! {
    neg => NEG, "`-x` (integers wrap; bool is rejected: use `logical_not`).";
    abs => ABS, "`|x|`.";
    exp => EXP, "`e^x` (integer inputs give float32).";
    expm1 => EXPM1, "`e^x - 1`.";
    log => LOG, "Natural logarithm.";
    log1p => LOG1P, "`ln(1 + x)`.";
    log2 => LOG2, "Base-2 logarithm.";
    log10 => LOG10, "Base-10 logarithm.";
    sqrt => SQRT, "Square root.";
    rsqrt => RSQRT, "`1 / sqrt(x)`.";
    sin => SIN, "Sine.";
    cos => COS, "Cosine.";
    tan => TAN, "Tangent.";
    atan => ATAN, "Arc tangent.";
    tanh => TANH, "Hyperbolic tangent.";
    sigmoid => SIGMOID, "Logistic sigmoid.";
    relu => RELU, "`max(x, 0)`.";
    relu6 => RELU6, "`min(max(x, 0), 6)`.";
    silu => SILU, "`x * sigmoid(x)`.";
    selu => SELU, "SELU.";
    softsign => SOFTSIGN, "`x / (1 + |x|)`.";
    hardswish => HARDSWISH, "`x * relu6(x + 3) / 6`.";
    hardsigmoid => HARDSIGMOID, "`relu6(x + 3) / 6`.";
    reciprocal => RECIPROCAL, "`1 / x`.";
    sign => SIGN, "Sign (-1, 0, 1).";
    floor => FLOOR, "Round toward -inf.";
    ceil => CEIL, "Round toward +inf.";
    trunc => TRUNC, "Round toward zero.";
    erf => ERF, "The error function.";
}

/// `gelu(input, approximate)`: `"none"` (erf) or `"tanh"`.
pub fn gelu(input: &Tensor, approximate: &str) -> Result<Tensor> {
    call1(&GELU, CallKind::Function, &[input.into(), approximate.into()])
}
/// `leaky_relu(input, negative_slope)`.
pub fn leaky_relu(input: &Tensor, negative_slope: f64) -> Result<Tensor> {
    call1(&LEAKY_RELU, CallKind::Function, &[input.into(), Value::Float(negative_slope)])
}
/// `elu(input, alpha)`.
pub fn elu(input: &Tensor, alpha: f64) -> Result<Tensor> {
    call1(&ELU, CallKind::Function, &[input.into(), Value::Float(alpha), Value::Int(1), Value::Int(1)])
}
/// `softplus(input, beta, threshold)`.
pub fn softplus(input: &Tensor, beta: f64, threshold: f64) -> Result<Tensor> {
    call1(&SOFTPLUS, CallKind::Function, &[input.into(), Value::Float(beta), Value::Float(threshold)])
}
/// `hardtanh(input, min_val, max_val)`.
pub fn hardtanh(input: &Tensor, min_val: f64, max_val: f64) -> Result<Tensor> {
    call1(&HARDTANH, CallKind::Function, &[input.into(), Value::Float(min_val), Value::Float(max_val)])
}
/// `round(input, decimals=...)`.
pub fn round(input: &Tensor, decimals: i64) -> Result<Tensor> {
    call1(&ROUND, CallKind::Function, &[input.into(), Value::Int(decimals)])
}
/// `clamp(input, min, max)`: each bound is a number, a tensor, or `None` (e.g.
/// `clamp(&x, 0.0, None::<f64>)`, `clamp(&x, &lo, &hi)`).
pub fn clamp(input: &Tensor, min: impl Into<Value>, max: impl Into<Value>) -> Result<Tensor> {
    call1(&CLAMP, CallKind::Function, &[input.into(), min.into(), max.into()])
}

impl Tensor {
    /// `gelu(approximate)`: `"none"` (erf) or `"tanh"`.
    pub fn gelu(&self, approximate: &str) -> Result<Tensor> {
        call1(&GELU, CallKind::Method, &[self.into(), approximate.into()])
    }
    /// `leaky_relu(negative_slope)`.
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        call1(&LEAKY_RELU, CallKind::Method, &[self.into(), Value::Float(negative_slope)])
    }
    /// `elu(alpha)`.
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        call1(&ELU, CallKind::Method, &[self.into(), Value::Float(alpha), Value::Int(1), Value::Int(1)])
    }
    /// `softplus(beta, threshold)`.
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        call1(&SOFTPLUS, CallKind::Method, &[self.into(), Value::Float(beta), Value::Float(threshold)])
    }
    /// `hardtanh(min_val, max_val)`.
    pub fn hardtanh(&self, min_val: f64, max_val: f64) -> Result<Tensor> {
        call1(&HARDTANH, CallKind::Method, &[self.into(), Value::Float(min_val), Value::Float(max_val)])
    }
    /// `round(decimals=...)` (half to even).
    pub fn round(&self, decimals: i64) -> Result<Tensor> {
        call1(&ROUND, CallKind::Method, &[self.into(), Value::Int(decimals)])
    }
    /// `clamp(min, max)`: each bound is a number, a tensor or `None`.
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![-2i64, 0, 5], &[3]).unwrap();
    /// assert_eq!(x.clamp(0i64, 3i64).unwrap().to_vec::<i64>().unwrap(), vec![0, 0, 3]);
    /// // float bounds promote an integer tensor to float32, as in PyTorch
    /// assert_eq!(x.clamp(0.5, None::<f64>).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 0.5, 5.0]);
    /// ```
    pub fn clamp(&self, min: impl Into<Value>, max: impl Into<Value>) -> Result<Tensor> {
        call1(&CLAMP, CallKind::Method, &[self.into(), min.into(), max.into()])
    }
    // `clamp_min` / `clamp_max` are ops of their own (`ops/clamp_bound.rs`).
}
