//! Numeric element traits for the elementwise kernels: [`Num`] (arithmetic with PyTorch's
//! integer semantics: wrapping, Python-style floor division and remainder) for every compute
//! dtype, and [`Float`] (transcendental functions) for f32/f64. Half types compute in f32.

use crate::dtype::{DType, Element, Operand};
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use crate::value::Value;

/// A tensor's role in `result_type`: dimensioned or zero-dim.
#[inline]
pub fn tensor_operand(t: &Tensor) -> Operand {
    if t.shape().is_empty() {
        Operand::ZeroDim(t.dtype())
    } else {
        Operand::Tensor(t.dtype())
    }
}

/// A tensor-or-number argument's role in `result_type` (`None` for other values).
#[inline]
pub fn value_operand(v: &Value) -> Option<Operand> {
    match v {
        Value::Tensor(t) => Some(tensor_operand(t)),
        v => v.as_scalar().map(|s| Operand::Scalar(s.dtype())),
    }
}

/// PyTorch's C++ `ScalarType` name (`Float`, `Long`...), used in messages that mirror
/// PyTorch's wording (`"abs_cpu" not implemented for 'Bool'`).
pub fn torch_name(d: DType) -> &'static str {
    match d {
        DType::Bool => "Bool",
        DType::U8 => "Byte",
        DType::I8 => "Char",
        DType::I16 => "Short",
        DType::I32 => "Int",
        DType::I64 => "Long",
        DType::F16 => "Half",
        DType::BF16 => "BFloat16",
        DType::F32 => "Float",
        DType::F64 => "Double",
    }
}

/// PyTorch's `canCast(from, to)`: floating results cannot be written into integer or bool
/// tensors and non-bool results cannot be written into bool tensors.
pub fn can_cast(from: DType, to: DType) -> bool {
    if from.is_floating_point() && !to.is_floating_point() {
        return false;
    }
    if from != DType::Bool && to == DType::Bool {
        return false;
    }
    true
}

/// Arithmetic on one compute dtype (bool, integers, f32, f64). Integer ops wrap like C++;
/// division by zero is checked by the callers before these run.
pub trait Num: Element + PartialOrd {
    /// `a + b`
    fn add(self, o: Self) -> Self;
    /// `a - b`
    fn sub(self, o: Self) -> Self;
    /// `a * b`
    fn mul(self, o: Self) -> Self;
    /// True division for floats; truncating for integers.
    fn div(self, o: Self) -> Self;
    /// Division rounding toward zero.
    fn div_trunc(self, o: Self) -> Self;
    /// Division rounding toward negative infinity (PyTorch's `div_floor`).
    fn div_floor(self, o: Self) -> Self;
    /// Python's remainder (sign of the divisor).
    fn remainder(self, o: Self) -> Self;
    /// C's fmod (sign of the dividend).
    fn fmod(self, o: Self) -> Self;
    /// `a ** b`
    fn pow(self, o: Self) -> Self;
    /// NaN-propagating maximum.
    fn maximum(self, o: Self) -> Self;
    /// NaN-propagating minimum.
    fn minimum(self, o: Self) -> Self;
    /// `-a` (wrapping)
    fn neg(self) -> Self;
    /// `|a|` (wrapping)
    fn abs(self) -> Self;
    /// -1, 0 or 1 (NaN stays NaN)
    fn sign(self) -> Self;
    /// The scalar converted with PyTorch's cast rules.
    fn from_scalar(s: Scalar) -> Self;
    /// `a == 0`
    fn is_zero(self) -> bool;
    /// zero
    fn zero() -> Self;
}

macro_rules! int_num {
    ($t:ty, signed: $signed:tt) => {
        impl Num for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            #[inline(always)]
            fn div_trunc(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            #[inline(always)]
            fn div_floor(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let q = self.wrapping_div(o);
                let r = self.wrapping_rem(o);
                int_num!(@floor $signed, q, r, o)
            }
            #[inline(always)]
            fn remainder(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(o);
                int_num!(@rem $signed, r, o)
            }
            #[inline(always)]
            fn fmod(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_rem(o) }
            }
            #[inline]
            fn pow(self, o: Self) -> Self {
                int_num!(@negpow $signed, self, o);
                let mut base = self;
                let mut e = o as u64;
                let mut acc: $t = 1;
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
            #[inline(always)]
            fn maximum(self, o: Self) -> Self {
                if self >= o { self } else { o }
            }
            #[inline(always)]
            fn minimum(self, o: Self) -> Self {
                if self <= o { self } else { o }
            }
            #[inline(always)]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn abs(self) -> Self {
                int_num!(@abs $signed, self)
            }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0 { 1 } else { int_num!(@signneg $signed, self) }
            }
            #[inline(always)]
            fn from_scalar(s: Scalar) -> Self {
                match s {
                    Scalar::Bool(b) => b as $t,
                    Scalar::Int(i) => i as $t,
                    Scalar::Float(f) => <$t as Element>::from_f64(f),
                }
            }
            #[inline(always)]
            fn is_zero(self) -> bool {
                self == 0
            }
            #[inline(always)]
            fn zero() -> Self {
                0
            }
        }
    };
    (@floor true, $q:ident, $r:ident, $o:ident) => {
        if $r != 0 && (($r < 0) != ($o < 0)) { $q.wrapping_sub(1) } else { $q }
    };
    (@floor false, $q:ident, $r:ident, $o:ident) => {{
        let _ = ($r, $o);
        $q
    }};
    (@rem true, $r:ident, $o:ident) => {
        if $r != 0 && (($r < 0) != ($o < 0)) { $r.wrapping_add($o) } else { $r }
    };
    (@rem false, $r:ident, $o:ident) => {{
        let _ = $o;
        $r
    }};
    (@negpow true, $a:ident, $b:ident) => {
        if $b < 0 {
            return if $a == 1 {
                1
            } else if $a == -1 {
                if $b & 1 == 1 { -1 } else { 1 }
            } else {
                0
            };
        }
    };
    (@negpow false, $a:ident, $b:ident) => {};
    (@abs true, $a:ident) => { $a.wrapping_abs() };
    (@abs false, $a:ident) => { $a };
    (@signneg true, $a:ident) => { if $a < 0 { -1 } else { 0 } };
    (@signneg false, $a:ident) => { 0 };
}
int_num!(u8, signed: false);
int_num!(i8, signed: true);
int_num!(i16, signed: true);
int_num!(i32, signed: true);
int_num!(i64, signed: true);

macro_rules! float_num {
    ($t:ty) => {
        impl Num for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn div_trunc(self, o: Self) -> Self {
                (self / o).trunc()
            }
            #[inline]
            fn div_floor(self, b: Self) -> Self {
                // PyTorch's div_floor_floating (matches Python's // for floats).
                let a = self;
                if b == 0.0 {
                    return a / b;
                }
                let m = a % b;
                let mut div = (a - m) / b;
                if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
                    div -= 1.0;
                }
                if div != 0.0 {
                    let mut fd = div.floor();
                    if div - fd > 0.5 {
                        fd += 1.0;
                    }
                    fd
                } else {
                    (0.0 as $t).copysign(a / b)
                }
            }
            #[inline(always)]
            fn remainder(self, b: Self) -> Self {
                let m = self % b;
                if m != 0.0 && ((b < 0.0) != (m < 0.0)) { m + b } else { m }
            }
            #[inline(always)]
            fn fmod(self, o: Self) -> Self {
                self % o
            }
            #[inline(always)]
            fn pow(self, o: Self) -> Self {
                self.powf(o)
            }
            #[inline(always)]
            fn maximum(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() { <$t>::NAN } else if self >= o { self } else { o }
            }
            #[inline(always)]
            fn minimum(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() { <$t>::NAN } else if self <= o { self } else { o }
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn abs(self) -> Self {
                self.abs()
            }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0.0 {
                    1.0
                } else if self < 0.0 {
                    -1.0
                } else {
                    if self.is_nan() { self } else { 0.0 }
                }
            }
            #[inline(always)]
            fn from_scalar(s: Scalar) -> Self {
                s.to_f64() as $t
            }
            #[inline(always)]
            fn is_zero(self) -> bool {
                self == 0.0
            }
            #[inline(always)]
            fn zero() -> Self {
                0.0
            }
        }
    };
}
float_num!(f32);
float_num!(f64);

impl Num for bool {
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self | o
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self ^ o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self & o
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        self & o
    }
    #[inline(always)]
    fn div_trunc(self, o: Self) -> Self {
        self & o
    }
    #[inline(always)]
    fn div_floor(self, o: Self) -> Self {
        self & o
    }
    #[inline(always)]
    fn remainder(self, _: Self) -> Self {
        false
    }
    #[inline(always)]
    fn fmod(self, _: Self) -> Self {
        false
    }
    #[inline(always)]
    fn pow(self, o: Self) -> Self {
        self | !o
    }
    #[inline(always)]
    fn maximum(self, o: Self) -> Self {
        self | o
    }
    #[inline(always)]
    fn minimum(self, o: Self) -> Self {
        self & o
    }
    #[inline(always)]
    fn neg(self) -> Self {
        self
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self
    }
    #[inline(always)]
    fn sign(self) -> Self {
        self
    }
    #[inline(always)]
    fn from_scalar(s: Scalar) -> Self {
        s.to_f64() != 0.0
    }
    #[inline(always)]
    fn is_zero(self) -> bool {
        !self
    }
    #[inline(always)]
    fn zero() -> Self {
        false
    }
}

/// Transcendental functions for f32 and f64 (f32 uses single-precision routines, as PyTorch).
pub trait Float: Num + Copy {
    /// From f64 (rounding).
    fn c(v: f64) -> Self;
    /// `e^x`
    fn exp(self) -> Self;
    /// `e^x - 1`
    fn exp_m1(self) -> Self;
    /// natural log
    fn ln(self) -> Self;
    /// `ln(1 + x)`
    fn ln_1p(self) -> Self;
    /// square root
    fn sqrt(self) -> Self;
    /// sine
    fn sin(self) -> Self;
    /// cosine
    fn cos(self) -> Self;
    /// hyperbolic tangent
    fn tanh(self) -> Self;
    /// error function
    fn erf(self) -> Self;
    /// round toward -inf
    fn floor(self) -> Self;
    /// round toward +inf
    fn ceil(self) -> Self;
    /// round half to even
    fn round_even(self) -> Self;
    /// `true` for NaN
    fn is_nan(self) -> bool;
    /// base-2 log
    fn log2(self) -> Self;
    /// base-10 log
    fn log10(self) -> Self;
    /// tangent
    fn tan(self) -> Self;
    /// arc tangent
    fn atan(self) -> Self;
    /// round toward zero
    fn trunc(self) -> Self;
}

macro_rules! float_impl {
    ($t:ty, $erf:path, $expm1:path, $log1p:path) => {
        impl Float for $t {
            #[inline(always)]
            fn c(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                $expm1(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                $log1p(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            #[inline(always)]
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn log2(self) -> Self {
                <$t>::log2(self)
            }
            #[inline(always)]
            fn log10(self) -> Self {
                <$t>::log10(self)
            }
            #[inline(always)]
            fn tan(self) -> Self {
                <$t>::tan(self)
            }
            #[inline(always)]
            fn atan(self) -> Self {
                <$t>::atan(self)
            }
            #[inline(always)]
            fn trunc(self) -> Self {
                <$t>::trunc(self)
            }
        }
    };
}
float_impl!(f32, libm::erff, libm::expm1f, libm::log1pf);
float_impl!(f64, libm::erf, libm::expm1, libm::log1p);

/// Runs `$body` with `$T` bound to the compute type of `$dt` for dtypes with native
/// arithmetic (bool, integers, f32, f64); half types must be widened to f32 by the caller.
/// `$half` is evaluated for f16/bf16.
#[macro_export]
#[doc(hidden)]
macro_rules! match_compute {
    ($dt:expr, $T:ident => $body:expr, half => $half:expr) => {
        match $dt {
            $crate::DType::Bool => { type $T = bool; $body }
            $crate::DType::U8 => { type $T = u8; $body }
            $crate::DType::I8 => { type $T = i8; $body }
            $crate::DType::I16 => { type $T = i16; $body }
            $crate::DType::I32 => { type $T = i32; $body }
            $crate::DType::I64 => { type $T = i64; $body }
            $crate::DType::F32 => { type $T = f32; $body }
            $crate::DType::F64 => { type $T = f64; $body }
            $crate::DType::F16 | $crate::DType::BF16 => $half,
        }
    };
}

/// The dtype kernels compute in: bool, int64, float32 or float64. Narrow integers compute in
/// int64 (wrapping arithmetic modulo 2^k gives the same bits after the cast back) and halves in
/// float32; fewer compute types keep the number of kernel instantiations (and compile time)
/// small. Rare dtypes pay one conversion pass each way.
#[inline]
pub fn wide_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        DType::U8 | DType::I8 | DType::I16 | DType::I32 => DType::I64,
        d => d,
    }
}

/// Converts a number to dtype `d` and back (PyTorch converts scalar operands to the compute
/// dtype first: `uint8 + 300` adds 44). Identity unless `d` is a narrow integer type.
pub fn narrow_scalar(s: Scalar, d: DType) -> Scalar {
    if !matches!(d, DType::U8 | DType::I8 | DType::I16 | DType::I32) {
        return s;
    }
    crate::match_dtype!(d, E => {
        let e: E = match s {
            Scalar::Bool(b) => E::from_i64(b as i64),
            Scalar::Int(i) => E::from_i64(i),
            Scalar::Float(f) => E::from_f64(f),
        };
        Scalar::Int(e.to_i64())
    })
}

/// Runs `$body` with `$T` bound to the Rust type of a wide compute dtype (see [`wide_dtype`]).
#[macro_export]
#[doc(hidden)]
macro_rules! match_wide {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            _ => {
                type $T = f32;
                $body
            }
        }
    };
}
