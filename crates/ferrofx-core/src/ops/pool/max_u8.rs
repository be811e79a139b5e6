//! Value-only uint8 max-pool of row-major planes (the max-pool after the stem of a quantized
//! ResNet, whose stem writes `N x C x H x W` bytes on CPUs without AMX).
//!
//! The same data flow as the float kernel (`max_f32.rs`), with SSE2 byte maxima (`pmaxub`, 16
//! bytes) and even/odd splits: per output row, the window's input rows are folded into one row
//! stored with 0 on both sides; at column stride 2 that row is split into its even and odd
//! columns, so every window column is a contiguous run over the row's outputs; the window's
//! columns are then folded over the whole output row. 0 is the smallest byte, so the padding
//! never wins a maximum unless the window's input bytes are 0 too, which gives the same 0; every
//! window overlaps the input ([`applies`]). The generic kernel visited each window element by
//! element: on 8 x 64 x 112 x 112 bytes (ResNet-18 at batch 8), one thread, 3.5 ms against
//! 1.5 ms here (1 x 64 x 112 x 112: 520 µs against 190 µs).

use super::PoolGeom;
use crate::error::Result;
use std::mem::MaybeUninit;

/// Whether this kernel computes `g`: dilation 1, column stride 1 or 2, and every window
/// overlapping the input (as `max_f32::applies`, on any CPU).
pub(super) fn applies(g: &PoolGeom) -> bool {
    g.dh == 1
        && g.dw == 1
        && matches!(g.sw, 1 | 2)
        && g.h > 0
        && g.w > 0
        && g.oh > 0
        && g.ow > 0
        && g.ph < g.kh
        && g.pw < g.kw
        && (g.oh - 1) * g.sh < g.h + g.ph
        && (g.ow - 1) * g.sw < g.w + g.pw
}

/// Max-pool of contiguous `x` (`planes x h x w`) into a new `planes x oh x ow` vector.
pub(super) fn max_pool(op: &str, g: &PoolGeom, x: &[u8]) -> Result<Vec<u8>> {
    assert!(applies(g), "max_pool u8: geometry not supported (checked by `applies`)");
    super::max_pool_by_planes(op, g, x, planes)
}

/// Planes `p0..` of the output, as many as `out` holds (whole planes).
fn planes(g: &PoolGeom, x: &[u8], p0: usize, out: &mut [MaybeUninit<u8>]) {
    // the padded row: column i is input column i - pw; `len` covers every window
    let len = (g.ow - 1) * g.sw + g.kw;
    let wv = g.w.min(len - g.pw); // input columns any window reads
    let mut row = vec![0u8; len];
    let half = len.div_ceil(2);
    let (mut even, mut odd) = (vec![0u8; half], vec![0u8; half]);
    let mut acc = vec![0u8; g.ow];
    let plane_out = g.oh * g.ow;
    for (k, op) in out.chunks_exact_mut(plane_out).enumerate() {
        let xp = &x[(p0 + k) * g.h * g.w..(p0 + k + 1) * g.h * g.w];
        for oh in 0..g.oh {
            let top = (oh * g.sh) as isize - g.ph as isize;
            let hs = top.max(0) as usize;
            let he = ((top + g.kh as isize) as usize).min(g.h);
            // the window's rows folded into row[pw..pw + wv] (hs < he: the window overlaps)
            let folded = &mut row[g.pw..g.pw + wv];
            folded.copy_from_slice(&xp[hs * g.w..hs * g.w + wv]);
            for y in hs + 1..he {
                max_into(folded, &xp[y * g.w..y * g.w + wv]);
            }
            if g.sw == 2 {
                deinterleave(&row, &mut even, &mut odd);
            }
            // window column j of output c: row[c * sw + j]
            let col = |j: usize| -> &[u8] {
                if g.sw == 1 {
                    &row[j..j + g.ow]
                } else if j.is_multiple_of(2) {
                    &even[j / 2..j / 2 + g.ow]
                } else {
                    &odd[j / 2..j / 2 + g.ow]
                }
            };
            acc.copy_from_slice(col(0));
            for j in 1..g.kw {
                max_into(&mut acc, col(j));
            }
            let dst = &mut op[oh * g.ow..(oh + 1) * g.ow];
            // SAFETY: `dst` and `acc` are `ow` bytes each and distinct buffers (a plain
            // byte copy into the uninitialised output, which initialises it)
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), dst.as_mut_ptr().cast::<u8>(), g.ow) };
        }
    }
}

/// `even[i] = row[2i]`, `odd[i] = row[2i + 1]` (as many as `row` has).
#[inline(always)]
fn deinterleave(row: &[u8], even: &mut [u8], odd: &mut [u8]) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        while 2 * i + 32 <= row.len() && i + 16 <= even.len().min(odd.len()) {
            // SAFETY: SSE2 is part of x86-64; the loads read `row[2i..2i + 32]` and the stores
            // write `even[i..i + 16]`, `odd[i..i + 16]`, all in bounds (loop condition).
            unsafe {
                let p = row.as_ptr().add(2 * i);
                let (a, b) = (_mm_loadu_si128(p as *const __m128i), _mm_loadu_si128(p.add(16) as *const __m128i));
                let low = _mm_set1_epi16(0xff);
                let e = _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low));
                let o = _mm_packus_epi16(_mm_srli_epi16::<8>(a), _mm_srli_epi16::<8>(b));
                _mm_storeu_si128(even.as_mut_ptr().add(i) as *mut __m128i, e);
                _mm_storeu_si128(odd.as_mut_ptr().add(i) as *mut __m128i, o);
            }
            i += 16;
        }
    }
    for (k, pair) in row[2 * i..].chunks(2).enumerate() {
        even[i + k] = pair[0];
        if let Some(&v) = pair.get(1) {
            odd[i + k] = v;
        }
    }
}

/// `acc[i] = max(acc[i], v[i])` (equal lengths).
#[inline(always)]
fn max_into(acc: &mut [u8], v: &[u8]) {
    let n = acc.len().min(v.len());
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        while i + 16 <= n {
            // SAFETY: SSE2 is part of x86-64; 16 bytes at `i` of both slices (`i + 16 <= n`).
            unsafe {
                let p = acc.as_mut_ptr().add(i) as *mut __m128i;
                let m = _mm_max_epu8(_mm_loadu_si128(p), _mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                _mm_storeu_si128(p, m);
            }
            i += 16;
        }
    }
    for (a, &b) in acc[i..n].iter_mut().zip(&v[i..n]) {
        *a = (*a).max(b);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{max_pool_impl, PoolGeom};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Equal to the generic kernel on random geometries (strides 1 and 2, padding up to half
        /// the kernel, ceil mode's extra window), on one thread's planes and on the team's.
        #[test]
        fn equals_the_generic_kernel(kh in 1usize..6, kw in 1usize..6, sh in 1usize..4, sw in 1usize..3,
                                     h in 1usize..20, w in 1usize..40, planes in 1usize..70, ceil: bool,
                                     pads in (0usize..3, 0usize..3), seed: u64) {
            let (ph, pw) = (pads.0.min(kh / 2), pads.1.min(kw / 2));
            let out = |n: usize, k: usize, s: usize, p: usize| {
                if n + 2 * p < k {
                    return None;
                }
                let span = n + 2 * p - k;
                let mut o = if ceil { span.div_ceil(s) + 1 } else { span / s + 1 };
                if ceil && (o - 1) * s >= n + p {
                    o -= 1;
                }
                Some(o)
            };
            let (Some(oh), Some(ow)) = (out(h, kh, sh, ph), out(w, kw, sw, pw)) else { return Ok(()) };
            let g = PoolGeom { planes, h, w, kh, kw, sh, sw, ph, pw, dh: 1, dw: 1, oh, ow };
            prop_assume!(super::applies(&g));
            let mut s = seed | 1;
            let x: Vec<u8> = (0..planes * h * w).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; (s >> 56) as u8 }).collect();
            let want = max_pool_impl(&g, &x, false).0;
            let got = super::max_pool("max_pool2d", &g, &x).unwrap();
            prop_assert_eq!(got, want);
        }
    }
}
