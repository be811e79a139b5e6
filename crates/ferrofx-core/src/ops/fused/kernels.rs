//! The evaluator's kernels: one small function per (instruction, operand kinds, instruction
//! set), each computing one strip of [`STRIP`] floats, called through a function pointer.
//!
//! The expression is decoded once per call into a list of these pointers, so the strip loop
//! runs each instruction as one indirect call to a straight vector loop with nothing to
//! decide inside. Measured on seed 003's `relu((x + 1) * 2)` (16M floats, the session-22
//! note in docs/compile.md): this ran at the speed of a copy of the same bytes, where one
//! loop with the whole instruction set inlined into it (a `match` per instruction per strip)
//! ran 2-2.5x slower.

use super::{binary, clamp_f, unary, FusedOp, STRIP};

/// `out[..STRIP] = f(a[..STRIP], b[..STRIP], params)`: the operands as raw pointers to
/// `STRIP` floats each (see [`Kind`] for which ones a kernel reads).
///
/// Safety contract of every kernel: `out` is valid for `STRIP` float writes, every operand
/// the kind reads is valid for `STRIP` float reads, `out` overlaps none of them, and the CPU
/// has the instruction set the kernel was chosen for (see [`Isa::detect`]).
pub(super) type Kernel = unsafe fn(*mut f32, *const f32, *const f32, [f32; 2]);

/// What a kernel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A unary instruction over the strip `a` (clamp: bounds `params[0]`, `params[1]`).
    Unary,
    /// A binary instruction over the strips `a` and `b`.
    StripStrip,
    /// A binary instruction `f(a, params[0])`: the second operand is a constant.
    StripConst,
    /// A binary instruction `f(params[0], a)`: the first operand is a constant and the strip
    /// is passed in `a`.
    ConstStrip,
}

/// The instruction set kernels are compiled for, chosen once per call by CPU feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    /// AVX-512F with AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 with FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The target's baseline.
    Base,
}

impl Isa {
    /// The best instruction set this CPU runs (the checks are cached by the standard library).
    pub(super) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = std::arch::is_x86_feature_detected!("fma");
            if std::arch::is_x86_feature_detected!("avx512f") && fma {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && fma {
                return Isa::Avx2;
            }
        }
        Isa::Base
    }
}

/// The body every kernel shares: `OP` is the instruction's index in [`FusedOp::ALL`] and `K`
/// the [`Kind`] as a number (0-3), both constants, so each instance is one straight loop over
/// arrays of constant length (unrolled into full-width vector operations where the function
/// vectorises).
///
/// # Safety
/// The [`Kernel`] contract.
#[inline(always)]
unsafe fn body<const OP: usize, const K: u8>(out: *mut f32, a: *const f32, b: *const f32, p: [f32; 2]) {
    let op = FusedOp::ALL[OP];
    // SAFETY: the Kernel contract: `out` and the operands read are valid, disjoint strips
    let (o, a) = unsafe { (&mut *out.cast::<[f32; STRIP]>(), &*a.cast::<[f32; STRIP]>()) };
    match K {
        0 if op == FusedOp::Clamp => {
            let (lo, hi) = (p[0], p[1]);
            for (o, &x) in o.iter_mut().zip(a) {
                *o = clamp_f(x, lo, hi);
            }
        }
        0 => {
            for (o, &x) in o.iter_mut().zip(a) {
                *o = unary(op, x);
            }
        }
        1 => {
            // SAFETY: as above, for the second strip
            let b = unsafe { &*b.cast::<[f32; STRIP]>() };
            for j in 0..STRIP {
                o[j] = binary(op, a[j], b[j]);
            }
        }
        2 => {
            let c = p[0];
            for (o, &x) in o.iter_mut().zip(a) {
                *o = binary(op, x, c);
            }
        }
        _ => {
            let c = p[0];
            for (o, &x) in o.iter_mut().zip(a) {
                *o = binary(op, c, x);
            }
        }
    }
}

/// [`body`] compiled for AVX-512.
///
/// # Safety
/// The [`Kernel`] contract (the CPU has AVX-512F, AVX2 and FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn avx512<const OP: usize, const K: u8>(out: *mut f32, a: *const f32, b: *const f32, p: [f32; 2]) {
    // SAFETY: forwarded contract
    unsafe { body::<OP, K>(out, a, b, p) }
}

/// [`body`] compiled for AVX2.
///
/// # Safety
/// The [`Kernel`] contract (the CPU has AVX2 and FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<const OP: usize, const K: u8>(out: *mut f32, a: *const f32, b: *const f32, p: [f32; 2]) {
    // SAFETY: forwarded contract
    unsafe { body::<OP, K>(out, a, b, p) }
}

/// [`body`] compiled for the baseline.
///
/// # Safety
/// The [`Kernel`] contract.
unsafe fn base<const OP: usize, const K: u8>(out: *mut f32, a: *const f32, b: *const f32, p: [f32; 2]) {
    // SAFETY: forwarded contract
    unsafe { body::<OP, K>(out, a, b, p) }
}

/// The kernel of instruction `OP` with kind number `K` for `isa`.
fn pick<const OP: usize, const K: u8>(isa: Isa) -> Kernel {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::<OP, K>,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::<OP, K>,
        Isa::Base => base::<OP, K>,
    }
}

/// The index of `op` in [`FusedOp::ALL`] (its declaration order), as a constant.
macro_rules! idx {
    ($o:ident) => {
        FusedOp::$o as usize
    };
}

/// The kernel computing `op` over operands of `kind` on `isa`; `None` for a kind the
/// instruction does not take (a binary kind for a unary instruction or the reverse).
pub(super) fn kernel(op: FusedOp, kind: Kind, isa: Isa) -> Option<Kernel> {
    macro_rules! table {
        (unary: $($u:ident),*; binary: $($b:ident),*) => {
            match (op, kind) {
                $((FusedOp::$u, Kind::Unary) => Some(pick::<{ idx!($u) }, 0>(isa)),)*
                $(
                    (FusedOp::$b, Kind::StripStrip) => Some(pick::<{ idx!($b) }, 1>(isa)),
                    (FusedOp::$b, Kind::StripConst) => Some(pick::<{ idx!($b) }, 2>(isa)),
                    (FusedOp::$b, Kind::ConstStrip) => Some(pick::<{ idx!($b) }, 3>(isa)),
                )*
                _ => None,
            }
        };
    }
    table!(
        unary: Neg, Abs, Relu, Sigmoid, Tanh, Exp, Expm1, Log, Log1p, Sqrt, Rsqrt, Reciprocal, Silu, Gelu,
            GeluTanh, Erf, Sin, Cos, Floor, Ceil, Trunc, Hardswish, Hardsigmoid, Clamp;
        binary: Add, Sub, Mul, Div, Maximum, Minimum, Pow, LeakyRelu, Eq, Ne, Gt, Ge, Lt, Le
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instruction_has_its_kernels_on_every_isa() {
        let isas = [
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2,
            Isa::Base,
        ];
        for &op in FusedOp::ALL {
            assert_eq!(FusedOp::ALL[op as usize], op, "ALL is in declaration order");
            for isa in isas {
                let binary = op.arity() == 2;
                assert_eq!(kernel(op, Kind::Unary, isa).is_some(), !binary, "{op:?}");
                for kind in [Kind::StripStrip, Kind::StripConst, Kind::ConstStrip] {
                    assert_eq!(kernel(op, kind, isa).is_some(), binary, "{op:?} {kind:?}");
                }
            }
        }
    }

    #[test]
    fn kernels_compute_their_instruction() {
        let isa = Isa::detect();
        let a: Vec<f32> = (0..STRIP).map(|i| i as f32 * 0.25 - 5.0).collect();
        let b: Vec<f32> = (0..STRIP).map(|i| 3.0 - i as f32 * 0.5).collect();
        let mut out = vec![0f32; STRIP];
        let run = |k: Kernel, out: &mut [f32], p: [f32; 2]| {
            // SAFETY: every buffer holds STRIP floats, `out` is distinct, `isa` was detected
            unsafe { k(out.as_mut_ptr(), a.as_ptr(), b.as_ptr(), p) }
        };
        let sub = |kind| kernel(FusedOp::Sub, kind, isa).unwrap();
        run(sub(Kind::StripStrip), &mut out, [0.0; 2]);
        assert!(out.iter().zip(a.iter().zip(&b)).all(|(o, (x, y))| *o == x - y));
        run(sub(Kind::StripConst), &mut out, [2.0, 0.0]);
        assert!(out.iter().zip(&a).all(|(o, x)| *o == x - 2.0));
        run(sub(Kind::ConstStrip), &mut out, [2.0, 0.0]);
        assert!(out.iter().zip(&a).all(|(o, x)| *o == 2.0 - x));
        run(kernel(FusedOp::Clamp, Kind::Unary, isa).unwrap(), &mut out, [-1.0, 1.5]);
        assert!(out.iter().zip(&a).all(|(o, x)| *o == x.clamp(-1.0, 1.5)));
        run(kernel(FusedOp::Relu, Kind::Unary, isa).unwrap(), &mut out, [0.0; 2]);
        assert!(out.iter().zip(&a).all(|(o, x)| *o == x.max(0.0)));
    }
}
