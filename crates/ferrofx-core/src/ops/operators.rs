//! `std::ops` overloads: `+ - * / %` and unary `-` for tensors and numbers.
//!
//! **Choice: every operator returns `Result<Tensor>`** (as candle does) instead of panicking,
//! because shape and dtype mismatches are user errors (DESIGN.md "Errors and bad input"). To
//! keep expressions readable, a `Result<Tensor>` may stand on the left of an operator whose right
//! side is a tensor, and on the right of a tensor, so `&a + &b + &c` and `&a * (&b + 1.0)` work
//! and the first error propagates; finish with `?`. (`Result + Result` and `Result + number` are
//! impossible in Rust: neither side would be a local type.)
//!
//! Supported operands: `Tensor`, `&Tensor`, `f64`, `f32`, `i64`, `i32`, [`Scalar`] and
//! `Result<Tensor>` as described. Every operator goes through the op registry's dispatch with
//! [`CallKind::Operator`]: `a + b` is `add`, `a - b` is `sub`, `n - a` is `rsub`, `a * b` is
//! `mul`, `a / b` is `div`, `n / a` is `reciprocal(a) * n` (as PyTorch's `__rtruediv__`), `a % b`
//! and `n % a` are `remainder`, `-a` is `neg`.
//!
//! ```
//! use ferrofx_core::Tensor;
//! let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
//! let b = Tensor::from_vec(vec![10.0f32, 20.0], &[2]).unwrap();
//! let c = (&a * 2.0 + &b).unwrap();
//! assert_eq!(c.to_vec::<f32>().unwrap(), vec![12.0, 24.0]);
//! let d = (1.0 - &a).unwrap();
//! assert_eq!(d.to_vec::<f32>().unwrap(), vec![0.0, -1.0]);
//! let bad = Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap();
//! assert!((&a + &bad).is_err());
//! ```

use crate::error::Result;
use crate::op::{CallKind, OpDef};
use crate::ops::binary::{ADD, DIV, MUL, REMAINDER, RSUB, SUB};
use crate::ops::unary::{call1, NEG, RECIPROCAL};
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use crate::value::Value;
use std::ops::{Add, Div, Mul, Neg, Rem, Sub};

fn apply(op: &'static OpDef, a: Value, b: Value) -> Result<Tensor> {
    match op.name {
        "add" | "sub" | "rsub" => call1(op, CallKind::Operator, &[a, b, Value::Int(1)]),
        "div" => call1(op, CallKind::Operator, &[a, b, Value::None]),
        _ => call1(op, CallKind::Operator, &[a, b]),
    }
}

fn scalar_left(op: &'static OpDef, s: Value, t: &Tensor) -> Result<Tensor> {
    match op.name {
        "add" | "mul" => apply(op, t.into(), s),
        "sub" => apply(&RSUB, t.into(), s),
        "div" => {
            let r = call1(&RECIPROCAL, CallKind::Operator, &[t.into()])?;
            apply(&MUL, r.into(), s)
        }
        _ => apply(op, s, t.into()),
    }
}

macro_rules! tensor_ops {
    ($Trait:ident, $method:ident, $OP:ident) => {
        // tensor op tensor
        impl $Trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                apply(&$OP, self.into(), rhs.into())
            }
        }
        impl $Trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                apply(&$OP, self.into(), rhs.into())
            }
        }
        impl $Trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                apply(&$OP, self.into(), rhs.into())
            }
        }
        impl $Trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                apply(&$OP, self.into(), rhs.into())
            }
        }
        // Result chaining
        impl $Trait<Result<Tensor>> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Result<Tensor>) -> Result<Tensor> {
                apply(&$OP, self.into(), rhs?.into())
            }
        }
        impl $Trait<Result<Tensor>> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Result<Tensor>) -> Result<Tensor> {
                apply(&$OP, self.into(), rhs?.into())
            }
        }
        impl $Trait<&Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                apply(&$OP, self?.into(), rhs.into())
            }
        }
        impl $Trait<Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                apply(&$OP, self?.into(), rhs.into())
            }
        }
        tensor_ops!(@num $Trait, $method, $OP, f64, |x| Value::Float(x));
        tensor_ops!(@num $Trait, $method, $OP, f32, |x| Value::Float(x as f64));
        tensor_ops!(@num $Trait, $method, $OP, i64, |x| Value::Int(x));
        tensor_ops!(@num $Trait, $method, $OP, i32, |x| Value::Int(x as i64));
        tensor_ops!(@num $Trait, $method, $OP, Scalar, |x| Value::from(x));
    };
    (@num $Trait:ident, $method:ident, $OP:ident, $N:ty, |$x:ident| $conv:expr) => {
        impl $Trait<$N> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $x: $N) -> Result<Tensor> {
                apply(&$OP, self.into(), $conv)
            }
        }
        impl $Trait<$N> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $x: $N) -> Result<Tensor> {
                apply(&$OP, self.into(), $conv)
            }
        }
        impl $Trait<&Tensor> for $N {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                let $x = self;
                scalar_left(&$OP, $conv, rhs)
            }
        }
        impl $Trait<Tensor> for $N {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                let $x = self;
                scalar_left(&$OP, $conv, &rhs)
            }
        }
    };
}

tensor_ops!(Add, add, ADD);
tensor_ops!(Sub, sub, SUB);
tensor_ops!(Mul, mul, MUL);
tensor_ops!(Div, div, DIV);
tensor_ops!(Rem, rem, REMAINDER);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        call1(&NEG, CallKind::Operator, &[self.into()])
    }
}
impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        call1(&NEG, CallKind::Operator, &[self.into()])
    }
}
