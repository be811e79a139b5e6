//! Op arguments: the values the op registry's schemas describe.

use crate::dtype::DType;
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use std::fmt;

/// One argument of an op call, as bound by the op's schema.
#[derive(Clone)]
pub enum Value {
    /// Python's `None` (an optional argument left out).
    None,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (padding modes, reductions, approximations...).
    Str(String),
    /// A dtype.
    DType(DType),
    /// A list of integers (sizes, dims, strides...).
    Ints(Vec<i64>),
    /// A list of floats.
    Floats(Vec<f64>),
    /// A tensor.
    Tensor(Tensor),
    /// A list of tensors (`cat`, `stack`...).
    Tensors(Vec<Tensor>),
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::None => write!(f, "None"),
            Value::Bool(b) => write!(f, "{}", if *b { "True" } else { "False" }),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::DType(d) => write!(f, "torch.{d}"),
            Value::Ints(v) => write!(f, "{v:?}"),
            Value::Floats(v) => write!(f, "{v:?}"),
            Value::Tensor(t) => write!(f, "Tensor(shape={:?}, dtype={})", t.meta_shape(), t.meta_dtype_name()),
            Value::Tensors(ts) => {
                write!(f, "[")?;
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "Tensor(shape={:?})", t.meta_shape())?;
                }
                write!(f, "]")
            }
        }
    }
}

impl Value {
    /// A short type name for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::DType(_) => "dtype",
            Value::Ints(_) => "int[]",
            Value::Floats(_) => "float[]",
            Value::Tensor(_) => "Tensor",
            Value::Tensors(_) => "Tensor[]",
        }
    }
    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
    /// The number, if this is a bool/int/float.
    pub fn as_scalar(&self) -> Option<Scalar> {
        match *self {
            Value::Bool(b) => Some(Scalar::Bool(b)),
            Value::Int(i) => Some(Scalar::Int(i)),
            Value::Float(x) => Some(Scalar::Float(x)),
            _ => None,
        }
    }
    /// Calls `f` on every tensor inside this value.
    pub fn for_each_tensor(&self, mut f: impl FnMut(&Tensor)) {
        match self {
            Value::Tensor(t) => f(t),
            Value::Tensors(ts) => ts.iter().for_each(f),
            _ => {}
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Tensor(t)
    }
}
impl From<&Tensor> for Value {
    fn from(t: &Tensor) -> Self {
        Value::Tensor(t.clone())
    }
}
impl From<Scalar> for Value {
    fn from(s: Scalar) -> Self {
        match s {
            Scalar::Bool(b) => Value::Bool(b),
            Scalar::Int(i) => Value::Int(i),
            Scalar::Float(x) => Value::Float(x),
        }
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<DType> for Value {
    fn from(d: DType) -> Self {
        Value::DType(d)
    }
}
impl From<Vec<i64>> for Value {
    fn from(v: Vec<i64>) -> Self {
        Value::Ints(v)
    }
}
impl From<&[i64]> for Value {
    fn from(v: &[i64]) -> Self {
        Value::Ints(v.to_vec())
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}
impl From<Vec<Tensor>> for Value {
    fn from(v: Vec<Tensor>) -> Self {
        Value::Tensors(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(o: Option<T>) -> Self {
        match o {
            Some(v) => v.into(),
            None => Value::None,
        }
    }
}
