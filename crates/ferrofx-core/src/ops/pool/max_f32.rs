//! Value-only float32 max-pool with AVX-512 (ResNet's 3x3 stride-2 max-pool after the stem).
//!
//! Per output row, the window's input rows are folded into one row (`nan_max` in row order),
//! stored in a row padded with `-inf` on both sides (padding never wins a maximum, as in
//! PyTorch); at column stride 2 that row is split once into its even and odd columns
//! (`vpermt2ps`), so every window column is a contiguous run over the row's outputs; then the
//! window's columns are folded 16 outputs at a time. The result equals the generic kernel's bit
//! for bit: the same `nan_max` (`v > acc || v is NaN ? v : acc`, so NaN propagates and the
//! first of equal values stays) in the same order (rows top to bottom, then columns left to
//! right), and a leading `-inf` changes no fold. Planes run in parallel on the team; the output
//! is written once (never zero-filled).

use super::PoolGeom;
use crate::error::Result;
use crate::ops::simd::avx512f as avx512;
use std::mem::MaybeUninit;

/// Whether this kernel computes `g` on this CPU: dilation 1, column stride 1 or 2, and every
/// window overlapping the input (padding smaller than the kernel, the last window starting
/// before the input's end: always so for PyTorch's own geometries), on a CPU with AVX-512F.
pub(super) fn applies(g: &PoolGeom) -> bool {
    super::max_u8::applies(g) && avx512()
}

/// Max-pool of contiguous `x` (`planes x h x w`) into a new `planes x oh x ow` vector.
pub(super) fn max_pool(op: &str, g: &PoolGeom, x: &[f32]) -> Result<Vec<f32>> {
    assert!(applies(g), "max_pool f32: geometry or CPU not supported (checked by `applies`)");
    super::max_pool_by_planes(op, g, x, planes)
}

/// Planes `p0..` of the output, as many as `out` holds (whole planes).
fn planes(g: &PoolGeom, x: &[f32], p0: usize, out: &mut [MaybeUninit<f32>]) {
    // the padded row: column i is input column i - pw; `len` covers every window
    let len = (g.ow - 1) * g.sw + g.kw;
    let wv = g.w.min(len - g.pw); // input columns any window reads
    let mut row = vec![f32::NEG_INFINITY; len];
    let half = len.div_ceil(2);
    let mut phases = vec![0f32; if g.sw == 2 { 2 * half } else { 0 }];
    let plane_out = g.oh * g.ow;
    for (k, op) in out.chunks_exact_mut(plane_out).enumerate() {
        let xp = &x[(p0 + k) * g.h * g.w..(p0 + k + 1) * g.h * g.w];
        for oh in 0..g.oh {
            let top = (oh * g.sh) as isize - g.ph as isize;
            let hs = top.max(0) as usize;
            let he = ((top + g.kh as isize) as usize).min(g.h);
            let orow = &mut op[oh * g.ow..(oh + 1) * g.ow];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F (checked by `applies`, asserted by `max_pool`); rows hs..he
            // (hs < he: every window overlaps the input) of the plane are read for columns
            // 0..wv <= w; `row` holds len >= pw + wv elements, `phases` 2 * ceil(len / 2) at
            // stride 2; the output row holds ow elements, each written once.
            unsafe {
                avx512::output_row(g, xp, hs, he, wv, &mut row, &mut phases, orow.as_mut_ptr().cast::<f32>())
            };
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = (hs, he, wv, &mut row, &mut phases, orow);
                unreachable!("max_pool f32 runs on x86-64 only (checked by `applies`)");
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::PoolGeom;
    use std::arch::x86_64::*;

    /// The first `n.min(16)` lanes.
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// `nan_max(v, acc)`: `v > acc || v is NaN ? v : acc`, lane by lane.
    #[inline(always)]
    unsafe fn nan_max(v: __m512, acc: __m512) -> __m512 {
        // maxps(v, acc) = v > acc ? v : acc; then a NaN in v replaces the result
        _mm512_mask_mov_ps(_mm512_max_ps(v, acc), _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v), v)
    }

    /// One output row from input rows `hs..he`.
    ///
    /// # Safety
    /// AVX-512F; `hs < he <= h`, `wv <= w`, `row.len() >= pw + wv` and covers every window,
    /// `phases.len() >= 2 * ceil(row.len() / 2)` at column stride 2, `out` writable for `ow`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn output_row(
        g: &PoolGeom,
        xp: &[f32],
        hs: usize,
        he: usize,
        wv: usize,
        row: &mut [f32],
        phases: &mut [f32],
        out: *mut f32,
    ) {
        // the window's rows folded into row[pw..pw + wv]
        let dst = row.as_mut_ptr().add(g.pw);
        let mut c = 0;
        while c < wv {
            let m = lanes(wv - c);
            let mut acc = _mm512_maskz_loadu_ps(m, xp.as_ptr().add(hs * g.w + c));
            for y in hs + 1..he {
                acc = nan_max(_mm512_maskz_loadu_ps(m, xp.as_ptr().add(y * g.w + c)), acc);
            }
            _mm512_mask_storeu_ps(dst.add(c), m, acc);
            c += 16;
        }
        let len = row.len();
        let (even, odd) = if g.sw == 2 {
            // even[i] = row[2i], odd[i] = row[2i + 1]
            let half = len.div_ceil(2);
            let (e, o) = phases.split_at_mut(half);
            let ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            let io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
            let mut i = 0;
            while i < half {
                let s = 2 * i;
                let a = _mm512_maskz_loadu_ps(lanes(len - s), row.as_ptr().add(s));
                let b = _mm512_maskz_loadu_ps(lanes(len.saturating_sub(s + 16)), row.as_ptr().wrapping_add(s + 16));
                _mm512_mask_storeu_ps(e.as_mut_ptr().add(i), lanes(half - i), _mm512_permutex2var_ps(a, ie, b));
                _mm512_mask_storeu_ps(o.as_mut_ptr().add(i), lanes(len / 2 - i), _mm512_permutex2var_ps(a, io, b));
                i += 16;
            }
            (e.as_ptr(), o.as_ptr())
        } else {
            (row.as_ptr(), row.as_ptr())
        };
        // window column k of outputs j..j+16: row[j + k] (stride 1), even/odd[j + k / 2] (stride 2)
        let mut j = 0;
        while j < g.ow {
            let m = lanes(g.ow - j);
            let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
            for k in 0..g.kw {
                let src = if g.sw == 1 {
                    row.as_ptr().add(j + k)
                } else if k % 2 == 0 {
                    even.add(j + k / 2)
                } else {
                    odd.add(j + k / 2)
                };
                acc = nan_max(_mm512_maskz_loadu_ps(m, src), acc);
            }
            _mm512_mask_storeu_ps(out.add(j), m, acc);
            j += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{max_pool_impl, PoolGeom};

    /// Bit-equal to the generic kernel on random geometries (strides 1 and 2, padding up to
    /// half the kernel, ceil mode's extra window) with NaN, infinities and signed zeros in the
    /// input, on one thread and on the team.
    #[test]
    fn equals_the_generic_kernel_bit_for_bit() {
        if !super::avx512() {
            return;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: usize| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n as u64) as usize
        };
        let mut tried = 0;
        for case in 0..400 {
            let (kh, kw) = (1 + next(5), 1 + next(5));
            let (sh, sw) = (1 + next(3), 1 + next(2));
            let (ph, pw) = (next(kh / 2 + 1), next(kw / 2 + 1));
            let (h, w) = (1 + next(20), 1 + next(40));
            let planes = 1 + next(if case % 10 == 0 { 70 } else { 3 });
            let ceil = next(2) == 1;
            let out = |n: usize, k: usize, s: usize, p: usize| {
                if n + 2 * p < k {
                    return None;
                }
                let span = n + 2 * p - k;
                let mut o = if ceil { span.div_ceil(s) + 1 } else { span / s + 1 };
                // PyTorch's ceil-mode rule: the last window must start inside the input or
                // the left padding
                if ceil && (o - 1) * s >= n + p {
                    o -= 1;
                }
                Some(o)
            };
            let (Some(oh), Some(ow)) = (out(h, kh, sh, ph), out(w, kw, sw, pw)) else { continue };
            let g = PoolGeom { planes, h, w, kh, kw, sh, sw, ph, pw, dh: 1, dw: 1, oh, ow };
            assert!(super::applies(&g), "{case}: {h}x{w} k{kh}x{kw} s{sh}x{sw} p{ph}x{pw}");
            let x: Vec<f32> = (0..planes * h * w)
                .map(|_| match next(40) {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => 0.0,
                    4 => -0.0,
                    _ => next(1000) as f32 / 100.0 - 5.0,
                })
                .collect();
            let want = max_pool_impl(&g, &x, false).0;
            let got = super::max_pool("max_pool2d", &g, &x).unwrap();
            let bits =
                |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{case}: {planes} planes {h}x{w} k{kh}x{kw} s{sh}x{sw} p{ph}x{pw}");
            tried += 1;
        }
        assert!(tried > 300, "{tried} geometries");
    }
}
