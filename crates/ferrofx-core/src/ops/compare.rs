//! Comparisons (`eq ne lt le gt ge`), logical ops (`logical_and logical_or logical_xor
//! logical_not`) and `where(condition, input, other)`.
//!
//! Comparisons compute in `result_type(input, other)` and return bool; logical ops treat any
//! nonzero (and NaN) as true and return bool; `where` broadcasts all three operands and returns
//! `result_type(input, other)` (numbers allowed for both).

use crate::dtype::{result_type, DType};
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::op::args::tensor;
use crate::op::{cost_elementwise, ArgSpec, ArgType as T, CallKind, Category, Effect, OpDef, Saves};
use crate::ops::binary::{arg, exec_typed, narrow_arg, promote, Arg, BIN_SCHEMA, TENSOR_PAIR};
use crate::ops::kernel::{binary_map, cast, ternary_map, unary_map};
use crate::ops::num::{torch_name, value_operand, wide_dtype, Num};
use crate::ops::unary::call1;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

/// Builds a comparison for one compute type.
trait CmpKernel: Sync {
    fn make<N: Num>(&self) -> impl Fn(N, N) -> bool + Sync + Send;
}
macro_rules! cmp_kernel {
    ($S:ident, |$x:ident, $y:ident| $body:expr) => {
        struct $S;
        impl CmpKernel for $S {
            #[inline(always)]
            fn make<N: Num>(&self) -> impl Fn(N, N) -> bool + Sync + Send {
                |$x: N, $y: N| $body
            }
        }
    };
}
cmp_kernel!(EqK, |x, y| x == y);
cmp_kernel!(NeK, |x, y| x != y);
cmp_kernel!(LtK, |x, y| x < y);
cmp_kernel!(LeK, |x, y| x <= y);
cmp_kernel!(GtK, |x, y| x > y);
cmp_kernel!(GeK, |x, y| x >= y);

fn cmp_exec<K: CmpKernel>(op: &str, args: &[Value], k: &K) -> Result<Tensor> {
    let a = arg(op, args, 0, "input")?;
    let b = arg(op, args, 1, "other")?;
    let (_, d) = promote(op, &a, &b, false)?;
    // Halves convert exactly to f32 and narrow integers to i64, so comparing there is exact.
    let cd = wide_dtype(d);
    let (a, b) = (narrow_arg(&a, d), narrow_arg(&b, d));
    crate::match_wide!(cd, N => exec_typed::<N, bool>(op, &a, &b, cd, k.make::<N>()))
}

fn cmp_meta(op: &str, args: &[Value]) -> Result<crate::op::MetaOutputs> {
    let a = arg(op, args, 0, "input")?;
    let b = arg(op, args, 1, "other")?;
    let (shape, _) = promote(op, &a, &b, true)?;
    Ok(smallvec![TensorMeta::contiguous(&shape, DType::Bool)])
}

macro_rules! cmp_op {
    ($STATIC:ident, $name:literal, $K:ident, $doc:literal) => {
        #[doc = $doc]
        pub static $STATIC: OpDef = OpDef {
            name: $name,
            schema: BIN_SCHEMA,
            meta: |args| cmp_meta($name, args),
            kernel: |args| Ok(smallvec![cmp_exec($name, args, &$K)?]),
            cost: cost_elementwise,
            effect: Effect::Pure,
            category: Category::Elementwise,
            backward: None,
            saves: Saves::NOTHING,
            doc: $doc,
        };
    };
}
cmp_op!(EQ, "eq", EqK, "`input == other` elementwise (bool result).");
cmp_op!(NE, "ne", NeK, "`input != other` elementwise (bool result).");
cmp_op!(LT, "lt", LtK, "`input < other` elementwise (bool result).");
cmp_op!(LE, "le", LeK, "`input <= other` elementwise (bool result).");
cmp_op!(GT, "gt", GtK, "`input > other` elementwise (bool result).");
cmp_op!(GE, "ge", GeK, "`input >= other` elementwise (bool result).");

// ---- logical ----

fn logical_meta(op: &str, args: &[Value]) -> Result<crate::op::MetaOutputs> {
    let a = tensor(op, args, 0)?;
    let b = tensor(op, args, 1)?;
    Ok(smallvec![TensorMeta::contiguous(&broadcast_shapes(op, a.shape(), b.shape())?, DType::Bool)])
}

macro_rules! logical_op {
    ($STATIC:ident, $name:literal, |$x:ident, $y:ident| $body:expr, $doc:literal) => {
        #[doc = $doc]
        pub static $STATIC: OpDef = OpDef {
            name: $name,
            schema: TENSOR_PAIR,
            meta: |args| logical_meta($name, args),
            kernel: |args| {
                logical_meta($name, args)?;
                let a = cast(tensor($name, args, 0)?, DType::Bool)?;
                let b = cast(tensor($name, args, 1)?, DType::Bool)?;
                Ok(smallvec![binary_map::<bool, bool>($name, &a, &b, |$x, $y| $body)?])
            },
            cost: cost_elementwise,
            effect: Effect::Pure,
            category: Category::Elementwise,
            backward: None,
            saves: Saves::NOTHING,
            doc: $doc,
        };
    };
}
logical_op!(LOGICAL_AND, "logical_and", |x, y| x & y, "Elementwise logical AND (nonzero is true; bool result).");
logical_op!(LOGICAL_OR, "logical_or", |x, y| x | y, "Elementwise logical OR (nonzero is true; bool result).");
logical_op!(LOGICAL_XOR, "logical_xor", |x, y| x ^ y, "Elementwise logical XOR (nonzero is true; bool result).");

/// `logical_not(input)`: `input == 0` as bool.
pub static LOGICAL_NOT: OpDef = OpDef {
    name: "logical_not",
    schema: &[ArgSpec::req("input", T::Tensor)],
    meta: |args| Ok(smallvec![TensorMeta::contiguous(tensor("logical_not", args, 0)?.shape(), DType::Bool)]),
    kernel: |args| {
        let t = tensor("logical_not", args, 0)?;
        let d = t.dtype();
        let r = match d {
            DType::Bool => unary_map::<bool, bool>("logical_not", t, |x| !x),
            DType::F32 => unary_map::<f32, bool>("logical_not", t, |x| x.is_zero()),
            DType::F64 => unary_map::<f64, bool>("logical_not", t, |x| x.is_zero()),
            _ => unary_map::<bool, bool>("logical_not", &cast(t, DType::Bool)?, |x| !x),
        }?;
        Ok(smallvec![r])
    },
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Elementwise logical NOT (zero is true; bool result).",
};

// ---- where ----

fn where_sig(args: &[Value]) -> Result<(crate::layout::Shape, DType)> {
    let op = "where";
    let c = tensor(op, args, 0)?;
    if !matches!(c.dtype(), DType::Bool | DType::U8) {
        return Err(Error::dtype(
            op,
            format!(
                "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
                torch_name(c.dtype())
            ),
        ));
    }
    let a = arg(op, args, 1, "input")?;
    let b = arg(op, args, 2, "other")?;
    let shape = broadcast_shapes(op, c.shape(), &broadcast_shapes(op, shape_of(&a), shape_of(&b))?)?;
    let (Some(oa), Some(ob)) = (value_operand(&args[1]), value_operand(&args[2])) else {
        return Err(Error::schema(op, "input and other must be tensors or numbers"));
    };
    Ok((shape, result_type(&[oa, ob])))
}

fn shape_of<'a>(a: &Arg<'a>) -> &'a [usize] {
    match a {
        Arg::Tensor(t) => t.shape(),
        Arg::Scalar(_) => &[],
    }
}

fn as_tensor(a: &Arg, d: DType) -> Result<Tensor> {
    match a {
        Arg::Tensor(t) => cast(t, d),
        Arg::Scalar(s) => crate::match_compute!(d, N => Ok(Tensor::scalar(N::from_scalar(*s))), half => {
            cast(&Tensor::scalar(s.to_f64() as f32), d)
        }),
    }
}

/// `where(condition, input, other)`: `input` where `condition` is true, else `other`; all three
/// broadcast, `input`/`other` may be numbers.
pub static WHERE: OpDef = OpDef {
    name: "where",
    schema: &[
        ArgSpec::req("condition", T::Tensor),
        ArgSpec::req("input", T::TensorOrScalar),
        ArgSpec::req("other", T::TensorOrScalar),
    ],
    meta: |args| {
        let (shape, d) = where_sig(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, d)])
    },
    kernel: |args| {
        let (_, d) = where_sig(args)?;
        let c = cast(tensor("where", args, 0)?, DType::Bool)?;
        let x = as_tensor(&arg("where", args, 1, "input")?, d)?;
        let y = as_tensor(&arg("where", args, 2, "other")?, d)?;
        let r = crate::match_dtype!(d, N => ternary_map::<bool, N, N>("where", &c, &x, &y, |c, a, b| if c { a } else { b }))?;
        Ok(smallvec![r])
    },
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: crate::autograd::formulas::elementwise::backward_for("where"),
    saves: crate::autograd::formulas::elementwise::saves_for("where"),
    doc: "Selects from input where condition is true, else from other (with broadcasting).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] =
    &[&EQ, &NE, &LT, &LE, &GT, &GE, &LOGICAL_AND, &LOGICAL_OR, &LOGICAL_XOR, &LOGICAL_NOT, &WHERE];

// ---------------------------------------------------------------------------------------------
// Public API.

macro_rules! cmp_api {
    ($($f:ident => $S:ident, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            pub fn $f(input: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
                call1(&$S, CallKind::Function, &[input.into(), other.into()])
            }
        )*
        impl Tensor {
            $(
                #[doc = $doc]
                pub fn $f(&self, other: impl Into<Value>) -> Result<Tensor> {
                    call1(&$S, CallKind::Method, &[self.into(), other.into()])
                }
            )*
        }
    };
}
cmp_api! {
    eq => EQ, "`input == other` (bool tensor; `other` may be a number).";
    ne => NE, "`input != other` (bool tensor).";
    lt => LT, "`input < other` (bool tensor).";
    le => LE, "`input <= other` (bool tensor).";
    gt => GT, "`input > other` (bool tensor).";
    ge => GE, "`input >= other` (bool tensor).";
}

macro_rules! logical_api {
    ($($f:ident => $S:ident, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            pub fn $f(input: &Tensor, other: &Tensor) -> Result<Tensor> {
                call1(&$S, CallKind::Function, &[input.into(), other.into()])
            }
        )*
        impl Tensor {
            $(
                #[doc = $doc]
                pub fn $f(&self, other: &Tensor) -> Result<Tensor> {
                    call1(&$S, CallKind::Method, &[self.into(), other.into()])
                }
            )*
        }
    };
}
logical_api! {
    logical_and => LOGICAL_AND, "Elementwise logical AND (bool tensor).";
    logical_or => LOGICAL_OR, "Elementwise logical OR (bool tensor).";
    logical_xor => LOGICAL_XOR, "Elementwise logical XOR (bool tensor).";
}

/// `logical_not(input)` (bool tensor).
pub fn logical_not(input: &Tensor) -> Result<Tensor> {
    call1(&LOGICAL_NOT, CallKind::Function, &[input.into()])
}

/// `torch.where(condition, input, other)` (`where` is a Rust keyword, hence the name).
///
/// ```
/// use ferrofx_core::{ops::compare::where_cond, Tensor};
/// let c = Tensor::from_vec(vec![true, false], &[2]).unwrap();
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// assert_eq!(where_cond(&c, &x, 0.0).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
/// ```
pub fn where_cond(condition: &Tensor, input: impl Into<Value>, other: impl Into<Value>) -> Result<Tensor> {
    call1(&WHERE, CallKind::Function, &[condition.into(), input.into(), other.into()])
}

impl Tensor {
    /// `logical_not()`.
    pub fn logical_not(&self) -> Result<Tensor> {
        call1(&LOGICAL_NOT, CallKind::Method, &[self.into()])
    }
    /// PyTorch's `self.where(condition, other)`: `self` where `condition`, else `other`.
    pub fn where_cond(&self, condition: &Tensor, other: impl Into<Value>) -> Result<Tensor> {
        call1(&WHERE, CallKind::Method, &[condition.into(), self.into(), other.into()])
    }
}
