#![allow(dead_code)]
//! Small differentiable building blocks shared by the formula files: elementwise arithmetic
//! called through the registry by name (so the formulas do not depend on how the elementwise
//! family spells its Rust API, and they record history under `create_graph`), and helpers to
//! re-insert reduced dims.

use crate::autograd::BackwardCtx;
use crate::error::{Error, Result};
use crate::layout::wrap_dim;
use crate::op::{dispatch, CallKind, OpDef};
use crate::tensor::Tensor;
use crate::value::Value;
use std::sync::OnceLock;

pub(crate) type Grads = Result<Vec<Option<Tensor>>>;

/// The gradient of output 0.
pub(crate) fn g0<'a>(ctx: &'a BackwardCtx<'_>) -> Result<&'a Tensor> {
    ctx.grad(0).ok_or_else(|| Error::autograd(ctx.op().name, "missing output gradient"))
}

pub(crate) fn shape_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// Runs a registry op by name with positional arguments (bound to its schema).
pub(crate) fn call(name: &str, args: Vec<Value>) -> Result<Tensor> {
    let mut o = crate::op::call(name, args, vec![])?;
    if o.is_empty() {
        return Err(Error::schema(name, "op returned no output"));
    }
    Ok(o.swap_remove(0))
}

/// Dispatches a static op with bound arguments (schema order), first output.
pub(crate) fn one(op: &'static OpDef, args: &[Value]) -> Result<Tensor> {
    let mut o = dispatch(op, CallKind::Function, args)?;
    if o.is_empty() {
        return Err(Error::schema(op.name, "op returned no output"));
    }
    Ok(o.swap_remove(0))
}

/// A registry op looked up once (elementwise ops live in another family).
fn cached(cell: &'static OnceLock<Option<&'static OpDef>>, name: &str) -> Result<&'static OpDef> {
    cell.get_or_init(|| crate::op::lookup(name)).ok_or_else(|| {
        Error::autograd(name, format!("backward formulas need the op '{name}', which is not registered"))
    })
}

/// `true` when an elementwise formula may combine `ts` with a raw kernel instead of
/// dispatching registry ops: all concrete, one shape, one float dtype (f32/f64), and nothing to
/// record (grad mode off, as in a backward pass without `create_graph`, or no input requiring
/// grad). The kernel then computes exactly what the dispatched ops would (same element
/// operations in the same order), without the per-op dispatch overhead.
#[inline]
pub(crate) fn direct_ok(ts: &[&Tensor]) -> bool {
    let first = ts[0];
    let d = first.dtype();
    if !matches!(d, crate::DType::F32 | crate::DType::F64) {
        return false;
    }
    let rec = crate::autograd::is_grad_enabled();
    ts.iter().all(|t| {
        !t.is_symbolic()
            && t.dtype() == d
            && (t.same(first) || t.shape() == first.shape())
            && !(rec && t.requires_grad())
    })
}

/// `Some(f(a, b))` computed by one elementwise kernel when [`direct_ok`] allows, else `None`.
/// The closure body is compiled for f32 and f64 (write float literals as `1.0`).
macro_rules! direct2 {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {{
        let (a, b): (&$crate::tensor::Tensor, &$crate::tensor::Tensor) = ($a, $b);
        if $crate::autograd::formulas::prims::direct_ok(&[a, b]) {
            Some(match a.dtype() {
                $crate::DType::F32 => {
                    $crate::ops::kernel::binary_map::<f32, f32>("backward", a, b, |$x: f32, $y: f32| $body)
                }
                _ => $crate::ops::kernel::binary_map::<f64, f64>("backward", a, b, |$x: f64, $y: f64| $body),
            })
        } else {
            None
        }
    }};
}
pub(crate) use direct2;

/// The second operand of the binary prims: a tensor (borrowed or owned), a number, or a
/// `Value`. A tensor is borrowed by the direct kernel, without a reference-count round trip.
pub(crate) trait Operand: Into<Value> {
    /// The tensor, when this operand is one.
    fn tensor(&self) -> Option<&Tensor>;
}
impl Operand for &Tensor {
    fn tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}
impl Operand for Tensor {
    fn tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}
impl Operand for Value {
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
}
impl Operand for f64 {
    fn tensor(&self) -> Option<&Tensor> {
        None
    }
}
impl Operand for i64 {
    fn tensor(&self) -> Option<&Tensor> {
        None
    }
}

macro_rules! bin {
    ($f:ident, $name:literal $(, |$x:ident, $y:ident| $body:expr)?) => {
        /// `
        #[doc = $name]
        /// ` through the registry (other may be a tensor or a number).
        pub(crate) fn $f(a: &Tensor, b: impl Operand) -> Result<Tensor> {
            $(
                if let Some(bt) = b.tensor() {
                    if let Some(r) = direct2!(a, bt, |$x, $y| $body) {
                        return r;
                    }
                }
            )?
            let b: Value = b.into();
            static C: OnceLock<Option<&'static OpDef>> = OnceLock::new();
            let op = cached(&C, $name)?;
            if op.schema.len() == 2 {
                return one(op, &[a.into(), b]);
            }
            call($name, vec![a.into(), b])
        }
    };
}
macro_rules! un {
    ($f:ident, $name:literal) => {
        /// `
        #[doc = $name]
        /// ` through the registry.
        pub(crate) fn $f(a: &Tensor) -> Result<Tensor> {
            static C: OnceLock<Option<&'static OpDef>> = OnceLock::new();
            let op = cached(&C, $name)?;
            if op.schema.len() == 1 {
                return one(op, &[a.into()]);
            }
            call($name, vec![a.into()])
        }
    };
}
bin!(mul, "mul", |x, y| x * y);
bin!(div, "div", |x, y| x / y);
bin!(add, "add", |x, y| x + y);
bin!(sub, "sub", |x, y| x - y);
bin!(pow, "pow");
bin!(eq, "eq");
bin!(ne, "ne");
bin!(gt, "gt");
bin!(ge, "ge");
bin!(lt, "lt");
bin!(le, "le");
un!(neg, "neg");
un!(exp, "exp");
un!(log, "log");
un!(sqrt, "sqrt");
un!(rsqrt, "rsqrt");
un!(abs, "abs");
un!(sign, "sign");
un!(sigmoid, "sigmoid");
un!(tanh, "tanh");
un!(logical_not, "logical_not");
un!(sin, "sin");
un!(cos, "cos");
bin!(logical_and, "logical_and");
bin!(logical_or, "logical_or");
bin!(rsub_, "rsub");
pub(crate) use {ge as ge_, gt as gt_, le as le_, lt as lt_};

/// `where(condition, input, other)` (numbers allowed for input/other).
pub(crate) fn where_(c: &Tensor, a: impl Into<Value>, b: impl Into<Value>) -> Result<Tensor> {
    call("where", vec![c.into(), a.into(), b.into()])
}

/// Multiplies by a number, skipping the op when it is 1.
pub(crate) fn scale(a: &Tensor, s: f64) -> Result<Tensor> {
    if s == 1.0 {
        Ok(a.clone())
    } else {
        mul(a, Value::Float(s))
    }
}

/// Converts `t` to `dtype` when it differs.
pub(crate) fn to_dtype(t: Tensor, dtype: crate::DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        t.to_dtype(dtype)
    }
}

/// The sorted, deduplicated reduced dims (`None` or empty: all dims).
pub(crate) fn reduced_dims(op: &str, dims: Option<&[i64]>, ndim: usize) -> Result<Vec<usize>> {
    match dims {
        Some(ds) if !ds.is_empty() => {
            let mut v: Vec<usize> = ds.iter().map(|&d| wrap_dim(op, d, ndim.max(1))).collect::<Result<_>>()?;
            v.sort_unstable();
            v.dedup();
            v.retain(|&d| d < ndim.max(1));
            if ndim == 0 {
                v.clear();
            }
            Ok(v)
        }
        _ => Ok((0..ndim).collect()),
    }
}

/// Re-inserts the reduced dims of a reduction output (when not kept), giving the keepdim shape.
pub(crate) fn restore_dims(t: &Tensor, dims: &[usize], keepdim: bool) -> Result<Tensor> {
    if keepdim {
        return Ok(t.clone());
    }
    let mut g = t.clone();
    for &d in dims {
        g = g.unsqueeze(d as i64)?;
    }
    Ok(g)
}

/// Zeros of a shape and dtype (no history).
pub(crate) fn zeros(shape: &[usize], dtype: crate::DType) -> Result<Tensor> {
    crate::ops::kernel::zeros(shape, dtype)
}

/// Number of elements reduced into one output element.
pub(crate) fn reduced_count(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape.get(d).copied().unwrap_or(1)).product()
}
