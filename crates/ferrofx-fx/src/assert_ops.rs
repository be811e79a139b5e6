//! The guard ops of specialised traces: `_assert(condition, message)` (FX's `torch._assert`),
//! `_assert_is_none(value, message)` (FX's `_assert_is_none`) and `eq_scalar(a, b)` (the `==`
//! of two plain values, FX's `operator.eq` on a `concrete_args` placeholder).
//!
//! [`crate::Tracer::concrete_arg`] records them after the placeholder of a specialised input,
//! so a traced module called with another value fails instead of silently computing the branch
//! traced. They are registry ops (registered on first use, like `getitem`), so graphs holding
//! them save and load by name; `_assert` and `_assert_is_none` are FX's side-effectful
//! functions ([`crate::SIDE_EFFECTFUL_FUNCTIONS`]): dead code elimination keeps them.
//!
//! ```
//! use ferrofx_core::{op::call, Value};
//! ferrofx_fx::assert_ops::register();
//! let eq = call("eq_scalar", vec![Value::Bool(true), Value::Bool(true)], vec![]).unwrap();
//! assert!(call("_assert", vec![eq[0].clone().into(), Value::Str("fine".into())], vec![]).is_ok());
//! let e = call("_assert", vec![Value::Bool(false), Value::Str("flag was specialised".into())], vec![]);
//! assert!(e.unwrap_err().to_string().contains("flag was specialised"));
//! ```

use ferrofx_core::op::{self, ArgSpec, ArgType, Category, Cost, Effect, MetaOutputs, OpDef, Outputs, Saves};
use ferrofx_core::{DType, Error, Result, Tensor, TensorMeta, Value};
use std::sync::OnceLock;

fn message(a: &[Value]) -> &str {
    match a.get(1) {
        Some(Value::Str(s)) => s,
        _ => "assertion failed",
    }
}

fn truth(v: Option<&Value>) -> Result<bool> {
    match v {
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::Int(i)) => Ok(*i != 0),
        Some(Value::Float(x)) => Ok(*x != 0.0),
        Some(Value::Tensor(t)) if t.numel() == 1 => Ok(t.item()? != 0.0),
        other => Err(Error::argument(
            "_assert",
            format!("the condition must be a bool or a one-element tensor, got {other:?}"),
        )),
    }
}

fn no_outputs(_: &[Value]) -> Result<MetaOutputs> {
    Ok(MetaOutputs::new())
}

fn assert_kernel(a: &[Value]) -> Result<Outputs> {
    if truth(a.first())? {
        Ok(Outputs::new())
    } else {
        Err(Error::argument("_assert", format!("AssertionError: {}", message(a))))
    }
}

fn assert_is_none_kernel(a: &[Value]) -> Result<Outputs> {
    match a.first() {
        None | Some(Value::None) => Ok(Outputs::new()),
        Some(_) => Err(Error::argument("_assert_is_none", format!("AssertionError: {}", message(a)))),
    }
}

/// Python's `==` on two plain values (bool, int, float; ints and floats compare by value).
fn scalar_eq(a: &Value, b: &Value) -> Result<bool> {
    Ok(match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Bool(x), Value::Int(y)) | (Value::Int(y), Value::Bool(x)) => i64::from(*x) == *y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::Int(x), Value::Float(y)) | (Value::Float(y), Value::Int(x)) => *x as f64 == *y,
        (Value::Bool(x), Value::Float(y)) | (Value::Float(y), Value::Bool(x)) => f64::from(u8::from(*x)) == *y,
        (x, y) => return Err(Error::argument("eq_scalar", format!("cannot compare {x:?} with {y:?}"))),
    })
}

fn eq_meta(_: &[Value]) -> Result<MetaOutputs> {
    Ok(smallvec::smallvec![TensorMeta::contiguous(&[], DType::Bool)])
}

fn eq_kernel(a: &[Value]) -> Result<Outputs> {
    match a {
        [x, y] => Ok(smallvec::smallvec![Tensor::scalar(scalar_eq(x, y)?)]),
        _ => Err(Error::argument("eq_scalar", "expected two values")),
    }
}

const ASSERT_SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("condition", ArgType::TensorOrScalar), ArgSpec::req("message", ArgType::Str)];
const IS_NONE_SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("value", ArgType::OptTensorOrScalar), ArgSpec::req("message", ArgType::Str)];
const EQ_SCHEMA: &[ArgSpec] = &[ArgSpec::req("self", ArgType::Scalar), ArgSpec::req("other", ArgType::Scalar)];

fn def(
    name: &'static str,
    schema: &'static [ArgSpec],
    meta: op::MetaFn,
    kernel: op::KernelFn,
    doc: &'static str,
) -> OpDef {
    OpDef {
        name,
        schema,
        meta,
        kernel,
        cost: |_, _| Cost::default(),
        effect: Effect::Pure,
        category: Category::Other,
        backward: None,
        saves: Saves::NOTHING,
        doc,
    }
}

/// Registers `_assert`, `_assert_is_none` and `eq_scalar` (once per process; an op of the same
/// name registered by someone else first is kept). Called by the tracer and by every by-name
/// lookup of this crate, so loading a file that holds them needs no setup.
pub fn register() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for d in [
            def(
                "_assert",
                ASSERT_SCHEMA,
                no_outputs,
                assert_kernel,
                "Fails with the message unless the condition holds (FX's torch._assert).",
            ),
            def(
                "_assert_is_none",
                IS_NONE_SCHEMA,
                no_outputs,
                assert_is_none_kernel,
                "Fails with the message unless the value is None (FX's _assert_is_none).",
            ),
            def(
                "eq_scalar",
                EQ_SCHEMA,
                eq_meta,
                eq_kernel,
                "`self == other` on two plain values, as a bool tensor (FX's operator.eq).",
            ),
        ] {
            if op::lookup(d.name).is_none() {
                // a concurrent registration of the same name is the only failure: keep theirs
                let _ = op::register(d);
            }
        }
    });
}
