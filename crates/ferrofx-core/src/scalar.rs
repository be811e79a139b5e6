//! Plain numbers passed to ops (PyTorch's `Scalar`).

use crate::dtype::DType;

/// A number argument: `x + 1`, `x.clamp(0.0, 6.0)`, `full(shape, true)`.
///
/// Integers count as int64 and floats as the default float dtype in type promotion, exactly as
/// Python numbers do in PyTorch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// `True`/`False`
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating point number.
    Float(f64),
}

impl Scalar {
    /// The dtype this number has on its own (bool, int64 or float64).
    pub fn dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F64,
        }
    }
    /// The value as f64.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
    /// The value as i64 (floats truncate toward zero).
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(f) => f as i64,
        }
    }
    /// `true` for [`Scalar::Float`].
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::Float(_))
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(x: $t) -> Self {
                Scalar::$v(x as $c)
            }
        }
    )*};
}
scalar_from!(f32 => Float as f64, f64 => Float as f64, i32 => Int as i64, i64 => Int as i64, u8 => Int as i64, usize => Int as i64, i8 => Int as i64);
impl From<bool> for Scalar {
    fn from(b: bool) -> Self {
        Scalar::Bool(b)
    }
}
