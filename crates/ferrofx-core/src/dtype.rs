//! Element types and PyTorch's type promotion rules.

use std::fmt;

/// The element type of a tensor. Names and promotion rules follow PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `torch.bool`
    Bool,
    /// `torch.uint8`
    U8,
    /// `torch.int8`
    I8,
    /// `torch.int16`
    I16,
    /// `torch.int32`
    I32,
    /// `torch.int64`
    I64,
    /// `torch.float16` (storage and conversion; arithmetic computes in f32)
    F16,
    /// `torch.bfloat16` (storage and conversion; arithmetic computes in f32)
    BF16,
    /// `torch.float32`
    F32,
    /// `torch.float64`
    F64,
}

/// The dtype that floating results default to (`torch.get_default_dtype()`).
pub const DEFAULT_FLOAT: DType = DType::F32;

impl DType {
    /// All dtypes, in promotion-lattice order.
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
    /// `true` for f16, bf16, f32, f64.
    pub fn is_floating_point(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }
    /// `true` for the integer types (not bool).
    pub fn is_integral(self) -> bool {
        matches!(self, DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }
    /// `true` for signed types (integers and floats).
    pub fn is_signed(self) -> bool {
        !matches!(self, DType::Bool | DType::U8)
    }
    /// PyTorch's name (`float32`, `int64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }
    /// Parses PyTorch's names (with or without `torch.`) and the short aliases
    /// (`float`, `double`, `long`, `int`, `half`, `f32`, `i64`, ...).
    ///
    /// ```
    /// use ferrofx_core::DType;
    /// assert_eq!(DType::parse("torch.float32"), Some(DType::F32));
    /// assert_eq!(DType::parse("long"), Some(DType::I64));
    /// ```
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.strip_prefix("torch.").unwrap_or(s);
        Some(match s {
            "bool" => DType::Bool,
            "uint8" | "u8" => DType::U8,
            "int8" | "i8" => DType::I8,
            "int16" | "short" | "i16" => DType::I16,
            "int32" | "int" | "i32" => DType::I32,
            "int64" | "long" | "i64" => DType::I64,
            "float16" | "half" | "f16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float32" | "float" | "f32" => DType::F32,
            "float64" | "double" | "f64" => DType::F64,
            _ => return None,
        })
    }

    fn category(self) -> u8 {
        if self == DType::Bool {
            0
        } else if self.is_integral() {
            1
        } else {
            2
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `torch.promote_types(a, b)`: the smallest dtype both can be converted to without losing
/// category (bool < integer < floating).
///
/// ```
/// use ferrofx_core::{promote_types, DType};
/// assert_eq!(promote_types(DType::U8, DType::I8), DType::I16);
/// assert_eq!(promote_types(DType::I64, DType::F16), DType::F16);
/// assert_eq!(promote_types(DType::F16, DType::BF16), DType::F32);
/// ```
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        (F16, BF16) | (BF16, F16) => F32,
        _ => {
            let (ca, cb) = (a.category(), b.category());
            if ca != cb {
                return if ca > cb { a } else { b };
            }
            if a.is_floating_point() {
                return if a.size() >= b.size() { a } else { b };
            }
            // integers: u8 is the only unsigned type
            match (a, b) {
                (U8, I8) | (I8, U8) => I16,
                (U8, x) | (x, U8) => x,
                _ => {
                    if a.size() >= b.size() {
                        a
                    } else {
                        b
                    }
                }
            }
        }
    }
}

/// One operand's contribution to [`result_type`]: PyTorch gives dimensioned tensors priority
/// over zero-dim tensors, and both over plain numbers (scalars), within a category.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// A tensor with at least one dimension.
    Tensor(DType),
    /// A zero-dimensional tensor.
    ZeroDim(DType),
    /// A plain number: bool, integer (counts as int64) or float (counts as the default dtype).
    Scalar(DType),
}

/// `torch.result_type`: the dtype an op computes in for the given operands.
///
/// ```
/// use ferrofx_core::{result_type, DType, Operand};
/// // int tensor + float scalar -> default float dtype
/// assert_eq!(result_type(&[Operand::Tensor(DType::I64), Operand::Scalar(DType::F64)]), DType::F32);
/// // u8 tensor + int scalar stays u8
/// assert_eq!(result_type(&[Operand::Tensor(DType::U8), Operand::Scalar(DType::I64)]), DType::U8);
/// // f16 tensor + f32 zero-dim tensor stays f16
/// assert_eq!(result_type(&[Operand::Tensor(DType::F16), Operand::ZeroDim(DType::F32)]), DType::F16);
/// ```
pub fn result_type(operands: &[Operand]) -> DType {
    let mut dim: Option<DType> = None;
    let mut zero: Option<DType> = None;
    let mut wrapped: Option<DType> = None;
    let up = |slot: &mut Option<DType>, d: DType| {
        *slot = Some(match *slot {
            None => d,
            Some(s) => promote_types(s, d),
        });
    };
    for op in operands {
        match *op {
            Operand::Tensor(d) => up(&mut dim, d),
            Operand::ZeroDim(d) => up(&mut zero, d),
            Operand::Scalar(d) => {
                let d = if d.is_floating_point() { DEFAULT_FLOAT } else { d };
                up(&mut wrapped, d)
            }
        }
    }
    fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
        match (higher, lower) {
            (None, l) => l,
            (h, None) => h,
            (Some(h), Some(l)) => {
                if h.is_floating_point() {
                    Some(h)
                } else if h == DType::Bool || l.is_floating_point() {
                    Some(promote_types(h, l))
                } else {
                    Some(h)
                }
            }
        }
    }
    combine(dim, combine(zero, wrapped)).unwrap_or(DEFAULT_FLOAT)
}

/// A Rust type that can be a tensor element.
pub trait Element:
    Copy + Send + Sync + PartialOrd + fmt::Debug + Default + crate::storage::BufferElement + 'static
{
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Lossy conversion to f64 (bool → 0/1).
    fn to_f64(self) -> f64;
    /// Conversion from f64 with PyTorch's cast semantics (truncation toward zero for integers,
    /// wrapping for out-of-range integers, `!= 0` for bool).
    fn from_f64(v: f64) -> Self;
    /// Conversion to i64 (floats truncate).
    fn to_i64(self) -> i64;
    /// Conversion from i64 (wrapping for narrow integers).
    fn from_i64(v: i64) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                // PyTorch casts float -> narrow int via int64 then wraps.
                (v as i64) as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
int_element!(u8, DType::U8);
int_element!(i8, DType::I8);
int_element!(i16, DType::I16);
int_element!(i32, DType::I32);
int_element!(i64, DType::I64);

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
    fn to_i64(self) -> i64 {
        self.to_f64() as i64
    }
    fn from_i64(v: i64) -> Self {
        half::f16::from_f64(v as f64)
    }
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
    fn to_i64(self) -> i64 {
        self.to_f64() as i64
    }
    fn from_i64(v: i64) -> Self {
        half::bf16::from_f64(v as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_table_matches_pytorch() {
        // A few rows of torch.promote_types, checked by hand against PyTorch 2.x.
        assert_eq!(promote_types(Bool, U8), U8);
        assert_eq!(promote_types(U8, I8), I16);
        assert_eq!(promote_types(U8, I32), I32);
        assert_eq!(promote_types(I8, I64), I64);
        assert_eq!(promote_types(I32, F16), F16);
        assert_eq!(promote_types(BF16, F16), F32);
        assert_eq!(promote_types(F32, F64), F64);
        assert_eq!(promote_types(BF16, F32), F32);
        for &a in &DType::ALL {
            for &b in &DType::ALL {
                assert_eq!(promote_types(a, b), promote_types(b, a), "{a} {b}");
            }
        }
    }

    #[test]
    fn result_type_priorities() {
        use Operand::*;
        assert_eq!(result_type(&[Tensor(I32), Scalar(I64)]), I32);
        assert_eq!(result_type(&[Tensor(Bool), Scalar(I64)]), I64);
        assert_eq!(result_type(&[Tensor(I32), ZeroDim(I64)]), I32);
        assert_eq!(result_type(&[Tensor(I32), ZeroDim(F64)]), F64);
        assert_eq!(result_type(&[Tensor(F16), Scalar(F64)]), F16);
        assert_eq!(result_type(&[ZeroDim(I64), Scalar(F64)]), F32);
        assert_eq!(result_type(&[Tensor(F32), Tensor(F64)]), F64);
    }
}
