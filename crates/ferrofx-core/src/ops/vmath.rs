//! Vectorisable f32 math for the hot loops of activations and normalisations: `exp` and `erf`
//! written branch-free (selects, not branches), so that the loops over slices compile to vector
//! code through [`simd_dispatch!`](super::simd) (AVX-512, AVX2 + FMA, or the SSE2 baseline)
//! instead of one libm call per element.
//!
//! Accuracy (checked by the tests below against f64 libm over the whole f32 range):
//! - `exp`: Cephes' range reduction `x = n ln2 + r` and degree-6 polynomial, within 1 ulp of
//!   the correctly rounded result on a dense grid over the whole f32 range, subnormal results
//!   included (the test allows 2); +inf on overflow, 0 below -104; NaN stays NaN;
//! - `erf`: the odd/even rational minimax approximation on `[-4, 4]` used by Eigen and XLA
//!   (±1 outside), within 5e-7 absolute. PyTorch's own vectorised CPU `erf` is of the same
//!   accuracy, so GELU matches PyTorch to ~1.5e-6 absolute.

use super::simd::simd_dispatch;
use std::mem::MaybeUninit;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n * LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Inputs above this are clamped to it: `e^89` already overflows f32 (to +inf).
const EXP_HI: f32 = 89.0;
/// Below this `exp` is below half the smallest subnormal f32: the result is 0.
const EXP_LO: f32 = -104.0;
/// Adding then subtracting 1.5 * 2^23 rounds an f32 of magnitude < 2^22 to the nearest integer.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x` for one f32, branch-free (see the module doc for the accuracy).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let xc = if x > EXP_HI { EXP_HI } else { x };
    let xc = if xc < EXP_LO { EXP_LO } else { xc };
    // n = round(x / ln 2), as an f32 and as the integer in the low bits of `t`
    let t = xc * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * z + r + 1.0;
    // 2^n for n in [-150, 129] as two normal factors, so that results near f32::MAX and the
    // subnormal ones are rounded once, like libm's
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    let v = y * s1 * s2;
    let v = if x < EXP_LO { 0.0 } else { v };
    // NaN compares false everywhere above: give it back unchanged
    #[allow(clippy::eq_op)]
    if x != x {
        x
    } else {
        v
    }
}

/// `erf(x)` for one f32, branch-free (see the module doc for the accuracy).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let xc = if x > 4.0 { 4.0 } else { x };
    let xc = if xc < -4.0 { -4.0 } else { xc };
    let x2 = xc * xc;
    let mut p = -2.726_142_3e-10f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    let p = p * xc;
    let mut q = -1.456_607_2e-5f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    let v = p / q;
    // |x| >= 4: erf is ±1 in f32 (the rational form gives 1 - 1 ulp there)
    let v = if x >= 4.0 { 1.0 } else { v };
    let v = if x <= -4.0 { -1.0 } else { v };
    #[allow(clippy::eq_op)]
    if x != x {
        x
    } else {
        v
    }
}

/// GELU with the exact (erf) form: `x/2 * (1 + erf(x/√2))`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Lanes of the f64 sums (independent accumulators: the loop vectorises and rounds less).
const LANES: usize = 8;

simd_dispatch! {
    /// `out[i] = gelu(x[i])` (exact form) for equal-length slices; every element of `out` is
    /// written.
    pub(crate) fn gelu_slice(out: &mut [MaybeUninit<f32>], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            o.write(gelu(v));
        }
    }
}

simd_dispatch! {
    /// `out[i] = exp(x[i] - shift)` for equal-length slices; returns the sum of the results,
    /// accumulated in f64 (the softmax normaliser).
    pub(crate) fn exp_shifted_sum(out: &mut [f32], x: &[f32], shift: f32) -> f64 {
        let mut acc = [0f64; LANES];
        let mut oc = out.chunks_exact_mut(LANES);
        let mut xc = x.chunks_exact(LANES);
        for (o, xs) in (&mut oc).zip(&mut xc) {
            for l in 0..LANES {
                let e = exp(xs[l] - shift);
                o[l] = e;
                acc[l] += e as f64;
            }
        }
        let mut s = 0f64;
        for (o, &v) in oc.into_remainder().iter_mut().zip(xc.remainder()) {
            let e = exp(v - shift);
            *o = e;
            s += e as f64;
        }
        s + acc.iter().sum::<f64>()
    }
}

simd_dispatch! {
    /// `x[i] = exp(x[i] - shift)` in place; returns the sum of the results in f64.
    pub(crate) fn exp_shifted_sum_inplace(x: &mut [f32], shift: f32) -> f64 {
        let mut acc = [0f64; LANES];
        let mut xc = x.chunks_exact_mut(LANES);
        for xs in &mut xc {
            for l in 0..LANES {
                let e = exp(xs[l] - shift);
                xs[l] = e;
                acc[l] += e as f64;
            }
        }
        let mut s = 0f64;
        for v in xc.into_remainder() {
            let e = exp(*v - shift);
            *v = e;
            s += e as f64;
        }
        s + acc.iter().sum::<f64>()
    }
}

simd_dispatch! {
    /// The maximum of `x` (`-inf` when empty), NaN when any element is NaN (PyTorch's max).
    pub(crate) fn max(x: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut xc = x.chunks_exact(LANES);
        for xs in &mut xc {
            for l in 0..LANES {
                let v = xs[l];
                lanes[l] = if v > lanes[l] || v.is_nan() { v } else { lanes[l] };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for &v in xc.remainder().iter().chain(lanes.iter()) {
            if v.is_nan() {
                return v;
            }
            if v > m {
                m = v;
            }
        }
        m
    }
}

simd_dispatch! {
    /// `out[i] = x[i] * s`.
    pub(crate) fn scale(out: &mut [f32], s: f32) {
        for o in out.iter_mut() {
            *o *= s;
        }
    }
}

simd_dispatch! {
    /// One row of LayerNorm in f32: `out = (x - mean) * rstd * w + b` (`w`, `b` optional, of the
    /// row's length).
    pub(crate) fn normalize_row(out: &mut [f32], x: &[f32], mean: f32, rstd: f32, w: Option<&[f32]>, b: Option<&[f32]>) {
        match (w, b) {
            (Some(w), Some(b)) => {
                for (((o, &v), &wv), &bv) in out.iter_mut().zip(x).zip(w).zip(b) {
                    *o = (v - mean) * rstd * wv + bv;
                }
            }
            (Some(w), None) => {
                for ((o, &v), &wv) in out.iter_mut().zip(x).zip(w) {
                    *o = (v - mean) * rstd * wv;
                }
            }
            (None, Some(b)) => {
                for ((o, &v), &bv) in out.iter_mut().zip(x).zip(b) {
                    *o = (v - mean) * rstd + bv;
                }
            }
            (None, None) => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = (v - mean) * rstd;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulp_diff(a: f32, b: f32) -> u32 {
        if a == b {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_1_ulp_over_the_range() {
        let mut worst = 0;
        let mut x = -103.9f32;
        while x < 88.722_8 {
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulp_diff(exp(x), want));
            x += 0.000_731;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert!(exp(-100.0) > 0.0 && exp(-100.0) < f32::MIN_POSITIVE);
        assert!(exp(88.722_83).is_finite());
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erf_is_within_5e_7_absolute() {
        let mut worst = 0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            let want = libm::erf(x as f64);
            worst = worst.max((erf(x) as f64 - want).abs());
            x += 0.000_37;
        }
        assert!(worst < 5e-7, "worst error {worst}");
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert!(erf(f32::NAN).is_nan());
    }

    #[test]
    fn slices_match_the_scalar_forms() {
        let x: Vec<f32> = (0..1037).map(|i| (i as f32 - 500.0) * 0.013).collect();
        let mut out = vec![MaybeUninit::uninit(); x.len()];
        gelu_slice(&mut out, &x);
        for (o, &v) in out.iter().zip(&x) {
            // SAFETY: gelu_slice wrote every element.
            assert_eq!(unsafe { o.assume_init() }, gelu(v));
        }
        let mut e = vec![0f32; x.len()];
        let s = exp_shifted_sum(&mut e, &x, 1.5);
        let want: f64 = x.iter().map(|&v| exp(v - 1.5) as f64).sum();
        assert!((s - want).abs() <= 1e-9 * want);
        assert_eq!(max(&x), x[x.len() - 1]);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let mut y = x.clone();
        y[3] = f32::NAN;
        assert!(max(&y).is_nan());
    }
}
