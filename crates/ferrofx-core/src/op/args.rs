//! Typed access to bound arguments, for kernels and meta functions.
//!
//! Arguments arrive bound to the op's schema, so these only fail when an op is called with
//! hand-built arguments that do not match its schema; the error then names op and position.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use crate::value::Value;

fn wrong(op: &str, i: usize, want: &str, got: Option<&Value>) -> Error {
    Error::schema(op, format!("argument {i} must be {want}, got {}", got.map(|v| v.type_name()).unwrap_or("nothing")))
}

/// Argument `i` as a tensor.
pub fn tensor<'a>(op: &str, args: &'a [Value], i: usize) -> Result<&'a Tensor> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(t),
        g => Err(wrong(op, i, "Tensor", g)),
    }
}
/// Argument `i` as an optional tensor.
pub fn opt_tensor<'a>(op: &str, args: &'a [Value], i: usize) -> Result<Option<&'a Tensor>> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(Some(t)),
        Some(Value::None) | None => Ok(None),
        g => Err(wrong(op, i, "Tensor?", g)),
    }
}
/// Argument `i` as a tensor list.
pub fn tensors<'a>(op: &str, args: &'a [Value], i: usize) -> Result<&'a [Tensor]> {
    match args.get(i) {
        Some(Value::Tensors(t)) => Ok(t),
        g => Err(wrong(op, i, "Tensor[]", g)),
    }
}
/// Argument `i` as a number.
pub fn scalar(op: &str, args: &[Value], i: usize) -> Result<Scalar> {
    args.get(i).and_then(|v| v.as_scalar()).ok_or_else(|| wrong(op, i, "Scalar", args.get(i)))
}
/// Argument `i` as an optional number.
pub fn opt_scalar(op: &str, args: &[Value], i: usize) -> Result<Option<Scalar>> {
    match args.get(i) {
        Some(Value::None) | None => Ok(None),
        Some(v) => v.as_scalar().map(Some).ok_or_else(|| wrong(op, i, "Scalar?", Some(v))),
    }
}
/// Argument `i` as an int.
pub fn int(op: &str, args: &[Value], i: usize) -> Result<i64> {
    match args.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        Some(Value::Bool(b)) => Ok(*b as i64),
        g => Err(wrong(op, i, "int", g)),
    }
}
/// Argument `i` as an optional int.
pub fn opt_int(op: &str, args: &[Value], i: usize) -> Result<Option<i64>> {
    match args.get(i) {
        Some(Value::None) | None => Ok(None),
        _ => int(op, args, i).map(Some),
    }
}
/// Argument `i` as a float (ints convert).
pub fn float(op: &str, args: &[Value], i: usize) -> Result<f64> {
    match args.get(i) {
        Some(Value::Float(v)) => Ok(*v),
        Some(Value::Int(v)) => Ok(*v as f64),
        g => Err(wrong(op, i, "float", g)),
    }
}
/// Argument `i` as an optional float.
pub fn opt_float(op: &str, args: &[Value], i: usize) -> Result<Option<f64>> {
    match args.get(i) {
        Some(Value::None) | None => Ok(None),
        _ => float(op, args, i).map(Some),
    }
}
/// Argument `i` as a bool.
pub fn bool_(op: &str, args: &[Value], i: usize) -> Result<bool> {
    match args.get(i) {
        Some(Value::Bool(v)) => Ok(*v),
        g => Err(wrong(op, i, "bool", g)),
    }
}
/// Argument `i` as an int list (a single int becomes a one-element list).
pub fn ints<'a>(op: &str, args: &'a [Value], i: usize) -> Result<std::borrow::Cow<'a, [i64]>> {
    match args.get(i) {
        Some(Value::Ints(v)) => Ok(std::borrow::Cow::Borrowed(v)),
        Some(Value::Int(v)) => Ok(std::borrow::Cow::Owned(vec![*v])),
        g => Err(wrong(op, i, "int[]", g)),
    }
}
/// Argument `i` as an optional int list.
pub fn opt_ints<'a>(op: &str, args: &'a [Value], i: usize) -> Result<Option<std::borrow::Cow<'a, [i64]>>> {
    match args.get(i) {
        Some(Value::None) | None => Ok(None),
        _ => ints(op, args, i).map(Some),
    }
}
/// Argument `i` as a string.
pub fn str_<'a>(op: &str, args: &'a [Value], i: usize) -> Result<&'a str> {
    match args.get(i) {
        Some(Value::Str(s)) => Ok(s),
        g => Err(wrong(op, i, "str", g)),
    }
}
/// Argument `i` as an optional dtype.
pub fn opt_dtype(op: &str, args: &[Value], i: usize) -> Result<Option<DType>> {
    match args.get(i) {
        Some(Value::DType(d)) => Ok(Some(*d)),
        Some(Value::None) | None => Ok(None),
        g => Err(wrong(op, i, "ScalarType?", g)),
    }
}

/// Expands an `int[N]` argument: one value repeats N times, N values stay, anything else is an
/// error naming the argument.
pub fn expand_param<const N: usize>(op: &str, name: &str, v: &[i64]) -> Result<[i64; N]> {
    match v.len() {
        1 => Ok([v[0]; N]),
        n if n == N => {
            let mut out = [0; N];
            out.copy_from_slice(v);
            Ok(out)
        }
        n => Err(Error::argument(op, format!("{name} must have 1 or {N} elements, got {n}: {v:?}"))),
    }
}
