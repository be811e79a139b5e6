//! Typed op schemas: argument names, types and defaults, following PyTorch's signatures.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::value::Value;

/// The type of one schema argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    /// `Tensor`
    Tensor,
    /// `Tensor?`
    OptTensor,
    /// `Tensor[]`
    TensorList,
    /// `Scalar` (bool, int or float)
    Scalar,
    /// `Scalar?`
    OptScalar,
    /// `Tensor` or `Scalar` (binary ops' `other`)
    TensorOrScalar,
    /// `Tensor`, `Scalar` or `None` (`clamp`'s bounds)
    OptTensorOrScalar,
    /// `int`
    Int,
    /// `int?`
    OptInt,
    /// `float`
    Float,
    /// `float?`
    OptFloat,
    /// `bool`
    Bool,
    /// `int[]` (a single int is accepted and kept as a one-element list)
    IntList,
    /// `int[]?`
    OptIntList,
    /// `float[]`
    FloatList,
    /// `str`
    Str,
    /// `str?`
    OptStr,
    /// `ScalarType`
    DType,
    /// `ScalarType?`
    OptDType,
    /// `int[]` or `str` (conv's `padding`: sizes or `"valid"`/`"same"`)
    IntListOrStr,
}

impl ArgType {
    /// The schema spelling (`Tensor`, `int[]?`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ArgType::Tensor => "Tensor",
            ArgType::OptTensor => "Tensor?",
            ArgType::TensorList => "Tensor[]",
            ArgType::Scalar => "Scalar",
            ArgType::OptScalar => "Scalar?",
            ArgType::TensorOrScalar => "Tensor|Scalar",
            ArgType::OptTensorOrScalar => "Tensor|Scalar?",
            ArgType::Int => "int",
            ArgType::OptInt => "int?",
            ArgType::Float => "float",
            ArgType::OptFloat => "float?",
            ArgType::Bool => "bool",
            ArgType::IntList => "int[]",
            ArgType::OptIntList => "int[]?",
            ArgType::FloatList => "float[]",
            ArgType::Str => "str",
            ArgType::OptStr => "str?",
            ArgType::DType => "ScalarType",
            ArgType::OptDType => "ScalarType?",
            ArgType::IntListOrStr => "int[]|str",
        }
    }
    fn optional(self) -> bool {
        matches!(
            self,
            ArgType::OptTensor
                | ArgType::OptTensorOrScalar
                | ArgType::OptScalar
                | ArgType::OptInt
                | ArgType::OptFloat
                | ArgType::OptIntList
                | ArgType::OptStr
                | ArgType::OptDType
        )
    }
}

/// A default value written in a schema (const-constructible so ops can be `static`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// No default: the argument is required.
    Required,
    /// `None`
    None,
    /// A bool default.
    Bool(bool),
    /// An int default.
    Int(i64),
    /// A float default.
    Float(f64),
    /// A string default.
    Str(&'static str),
    /// An int-list default.
    Ints(&'static [i64]),
    /// A dtype default.
    DType(DType),
}

impl Default {
    fn to_value(self) -> Value {
        match self {
            Default::Required | Default::None => Value::None,
            Default::Bool(b) => Value::Bool(b),
            Default::Int(i) => Value::Int(i),
            Default::Float(x) => Value::Float(x),
            Default::Str(s) => Value::Str(s.to_string()),
            Default::Ints(v) => Value::Ints(v.to_vec()),
            Default::DType(d) => Value::DType(d),
        }
    }
}

/// One argument of a schema.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    /// PyTorch's argument name (`input`, `other`, `dim`, `keepdim`...).
    pub name: &'static str,
    /// Its type.
    pub ty: ArgType,
    /// Its default.
    pub default: Default,
    /// Keyword-only (after `*` in PyTorch's signature).
    pub kwarg_only: bool,
}

impl ArgSpec {
    /// A required positional argument.
    pub const fn req(name: &'static str, ty: ArgType) -> Self {
        ArgSpec { name, ty, default: Default::Required, kwarg_only: false }
    }
    /// A positional argument with a default.
    pub const fn opt(name: &'static str, ty: ArgType, default: Default) -> Self {
        ArgSpec { name, ty, default, kwarg_only: false }
    }
    /// A keyword-only argument with a default.
    pub const fn kw(name: &'static str, ty: ArgType, default: Default) -> Self {
        ArgSpec { name, ty, default, kwarg_only: true }
    }
}

/// Formats a schema the way PyTorch prints one: `add(Tensor input, Tensor|Scalar other, *, Scalar alpha=1)`.
pub fn format_schema(name: &str, args: &[ArgSpec]) -> String {
    let mut s = format!("{name}(");
    let mut star = false;
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        if a.kwarg_only && !star {
            s.push_str("*, ");
            star = true;
        }
        s.push_str(a.ty.name());
        s.push(' ');
        s.push_str(a.name);
        match a.default {
            Default::Required => {}
            d => s.push_str(&format!("={:?}", d.to_value())),
        }
    }
    s.push(')');
    s
}

fn check_type(op: &str, spec: &ArgSpec, v: Value) -> Result<Value> {
    use ArgType as T;
    let bad = |v: &Value| {
        Err(Error::schema(
            op,
            format!("argument '{}' must be {}, but got {}", spec.name, spec.ty.name(), v.type_name()),
        ))
    };
    if matches!(v, Value::None) {
        return if spec.ty.optional() { Ok(v) } else { bad(&v) };
    }
    Ok(match (spec.ty, v) {
        (T::Tensor | T::OptTensor, v @ Value::Tensor(_)) => v,
        (T::TensorList, v @ Value::Tensors(_)) => v,
        (T::TensorList, Value::Tensor(t)) => Value::Tensors(vec![t]),
        (
            T::Scalar | T::OptScalar | T::TensorOrScalar | T::OptTensorOrScalar,
            v @ (Value::Bool(_) | Value::Int(_) | Value::Float(_)),
        ) => v,
        (T::TensorOrScalar | T::OptTensorOrScalar, v @ Value::Tensor(_)) => v,
        (T::Int | T::OptInt, v @ Value::Int(_)) => v,
        (T::Int | T::OptInt, Value::Bool(b)) => Value::Int(b as i64),
        (T::Float | T::OptFloat, v @ Value::Float(_)) => v,
        (T::Float | T::OptFloat, Value::Int(i)) => Value::Float(i as f64),
        (T::Bool, v @ Value::Bool(_)) => v,
        (T::IntList | T::OptIntList, v @ Value::Ints(_)) => v,
        (T::IntList | T::OptIntList, Value::Int(i)) => Value::Ints(vec![i]),
        (T::FloatList, v @ Value::Floats(_)) => v,
        (T::FloatList, Value::Ints(v)) => Value::Floats(v.into_iter().map(|i| i as f64).collect()),
        (T::Str | T::OptStr, v @ Value::Str(_)) => v,
        (T::DType | T::OptDType, v @ Value::DType(_)) => v,
        (T::IntListOrStr, v @ (Value::Ints(_) | Value::Str(_))) => v,
        (T::IntListOrStr, Value::Int(i)) => Value::Ints(vec![i]),
        (_, v) => return bad(&v),
    })
}

/// Binds positional and keyword arguments to a schema: fills defaults, converts int→float and
/// int→int[] where PyTorch does, and rejects unknown, duplicate, missing or mistyped arguments
/// with a message that prints the schema.
pub fn bind(op: &str, schema: &[ArgSpec], args: Vec<Value>, kwargs: Vec<(String, Value)>) -> Result<Vec<Value>> {
    if kwargs.is_empty() && args.len() == schema.len() && !schema.iter().any(|a| a.kwarg_only) {
        // Every argument given positionally (the common case): check them in place.
        let mut args = args;
        for (spec, v) in schema.iter().zip(args.iter_mut()) {
            *v = check_type(op, spec, std::mem::replace(v, Value::None))?;
        }
        return Ok(args);
    }
    let sig = || format_schema(op, schema);
    let npos = schema.iter().filter(|a| !a.kwarg_only).count();
    if args.len() > npos {
        return Err(Error::schema(
            op,
            format!("takes {npos} positional arguments but {} were given; schema: {}", args.len(), sig()),
        ));
    }
    let mut slots: Vec<Option<Value>> = vec![None; schema.len()];
    let mut pos_i = 0usize;
    for v in args {
        while schema[pos_i].kwarg_only {
            pos_i += 1;
        }
        slots[pos_i] = Some(v);
        pos_i += 1;
    }
    for (k, v) in kwargs {
        let Some(i) = schema.iter().position(|a| a.name == k) else {
            return Err(Error::schema(op, format!("got an unexpected keyword argument '{k}'; schema: {}", sig())));
        };
        if slots[i].is_some() {
            return Err(Error::schema(op, format!("got multiple values for argument '{k}'; schema: {}", sig())));
        }
        slots[i] = Some(v);
    }
    let mut out = Vec::with_capacity(schema.len());
    for (spec, slot) in schema.iter().zip(slots) {
        let v = match slot {
            Some(v) => v,
            None => {
                if spec.default == Default::Required {
                    return Err(Error::schema(
                        op,
                        format!("missing required argument '{}'; schema: {}", spec.name, sig()),
                    ));
                }
                spec.default.to_value()
            }
        };
        out.push(check_type(op, spec, v)?);
    }
    Ok(out)
}
