//! Direct float32 convolution for few input channels: the stems of image models (MobileNet's
//! 3x3 stride 2 and ResNet's 7x7 stride 2 over 3 RGB channels), computed straight from the
//! NCHW input with AVX-512 instead of an im2col copy and a GEMM whose inner dimension (27 or
//! 147) is too short for the GEMM to run at speed.
//!
//! Per output row and chunk of 16 output columns, a block of 16 output channels is
//! accumulated in 16 registers: every input vector a kernel tap reads (one masked load, or at
//! column stride 2 two loads deinterleaved into even and odd columns with `vpermt2ps`) is
//! multiplied by the 16 channels' weights (packed per call as `[c][kh][kw][16]`, broadcast
//! from memory) and added with one fused multiply-add each. Input rows outside the plane are
//! skipped, input columns outside a row are masked off (nothing is copied or padded). The
//! residual add and ReLU / clamp are applied in registers before the one store of each output
//! (SiLU and hardswish to each finished output row while it is in cache). Rows run in parallel.
//!
//! The sum per output is `bias + Σ_{c, ki, kj} w x` in that order (fused multiply-adds), within
//! float32 rounding of the GEMM paths (which sum in the GEMM's blocking order).

use super::depthwise3x3::RegAct;
use super::{Activation, Epilogue, Geom, SendPtr};
use std::mem::MaybeUninit;

/// Output channels per pass (one accumulator register each).
const OB: usize = 16;

/// Whether this kernel computes `g` on this CPU: ungrouped, at most 4 input channels, a
/// kernel larger than 1x1 and at most 12x12, no dilation, column stride 1 or 2, output rows
/// at least one vector (16 columns) wide, on a CPU with AVX-512F.
///
/// Narrower planes take im2col and the GEMM: on the digits CNN's 8x8 planes (one input
/// channel) half of every vector would be masked off and a row is too little work per task,
/// and the direct kernel measured 1.78 ms per batch against the GEMM path's 1.26 ms.
pub(super) fn applies(g: &Geom) -> bool {
    g.groups == 1
        && g.c <= 4
        && g.kh * g.kw > 1
        && g.kh <= 12
        && g.kw <= 12
        && g.dh == 1
        && g.dw == 1
        && matches!(g.sw, 1 | 2)
        && g.ow >= 16
        && super::avx512()
}

/// Convolution of contiguous `x` `[n, c, h, w]` with `w` `[o, c, kh, kw]` into `out`
/// `[n, o, oh, ow]` (every element written), then `ep` on each output row.
pub(super) fn conv(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
) {
    let taps = g.c * g.kh * g.kw;
    assert!(
        x.len() >= g.n * g.c * g.h * g.w && w.len() >= g.o * taps && out.len() >= g.n * g.o * g.oh * g.ow,
        "direct conv: buffer sizes"
    );
    if out.is_empty() {
        return;
    }
    assert!(applies(g), "direct conv: geometry or CPU not supported (checked by `applies`)");
    // weights per block of OB output channels: [block][c][kh][kw][OB], zero past o; bias per block
    let blocks = g.o.div_ceil(OB);
    let mut wp = vec![0.0f32; blocks * taps * OB];
    let mut bp = vec![0.0f32; blocks * OB];
    for (o, bo) in bp.iter_mut().enumerate().take(g.o) {
        let (bi, oi) = (o / OB, o % OB);
        for (t, &wt) in w[o * taps..(o + 1) * taps].iter().enumerate() {
            wp[(bi * taps + t) * OB + oi] = wt;
        }
        *bo = bias.map_or(0.0, |b| b[o]);
    }
    let (act, later) = RegAct::split(ep.map_or(Activation::None, |e| e.act));
    // what is left for the stored rows: SiLU / hardswish (the residual is added in registers)
    let later = later.then(|| Epilogue { residual: None, act: ep.map_or(Activation::None, |e| e.act) });
    let res = ep.and_then(|e| e.residual);
    if let Some(r) = res {
        assert!(r.len() >= g.n * g.o * g.oh * g.ow, "direct conv: residual size");
    }
    let res = SendPtr(res.map_or(std::ptr::null_mut(), |r| r.as_ptr().cast_mut()));
    let rows = g.n * g.oh;
    let ptr = SendPtr(out.as_mut_ptr().cast::<f32>());
    let run = |r0: usize, r1: usize| {
        for row in r0..r1 {
            let (ni, r) = (row / g.oh, row % g.oh);
            for bi in 0..blocks {
                let nb = OB.min(g.o - bi * OB);
                // SAFETY: AVX-512F (checked by `applies`, asserted above); x, the packed
                // weights and out hold the geometry's elements (asserted above); this call
                // writes output row r of image ni for channels bi*OB..bi*OB+nb, which no other
                // task writes; res (if not null) holds the output's shape (asserted above) and
                // is only read.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx512::row(
                        g,
                        x,
                        &wp[bi * taps * OB..(bi + 1) * taps * OB],
                        &bp[bi * OB..(bi + 1) * OB],
                        ptr.ptr(),
                        res.ptr(),
                        act,
                        ni,
                        r,
                        bi * OB,
                        nb,
                    )
                };
            }
            if let Some(ep) = &later {
                for o in 0..g.o {
                    let off = ((ni * g.o + o) * g.oh + r) * g.ow;
                    // SAFETY: row r of (ni, o) lies inside out, is written above and belongs to
                    // this task alone.
                    let seg = unsafe { std::slice::from_raw_parts_mut(ptr.ptr().add(off), g.ow) };
                    ep.apply(seg, off);
                }
            }
        }
    };
    let threads = super::team::threads();
    let work = rows * g.ow * g.o * taps;
    if threads > 1 && rows > 1 && work >= 1 << 20 {
        let per = rows.div_ceil(4 * threads);
        super::team::for_each(rows.div_ceil(per), |t| run(t * per, ((t + 1) * per).min(rows)));
    } else {
        run(0, rows);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::depthwise3x3::avx512::{finish, mask};
    use super::{Geom, RegAct, OB};
    use std::arch::x86_64::*;

    /// `acc[o] += wt[o] * v` for the 16 channels of a block.
    #[inline(always)]
    unsafe fn fma16(acc: &mut [__m512; OB], wt: *const f32, v: __m512) {
        for (o, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(_mm512_set1_ps(*wt.add(o)), v, *a);
        }
    }

    /// Output row `r` of image `ni`, channels `o0..o0 + nb`, every chunk of 16 columns.
    ///
    /// # Safety
    /// AVX-512F; `x` holds `[n, c, h, w]`, `wp` the block's packed weights (`c * kh * kw * 16`),
    /// `bp` its 16 biases, `out` `[n, o, oh, ow]` with row `r` of channels `o0..o0 + nb`
    /// exclusively this call's; `res` null or a readable residual of `out`'s shape.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row(
        g: &Geom,
        x: &[f32],
        wp: &[f32],
        bp: &[f32],
        out: *mut f32,
        res: *const f32,
        act: RegAct,
        ni: usize,
        r: usize,
        o0: usize,
        nb: usize,
    ) {
        let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
        let (kh, kw) = (g.kh, g.kw);
        let mut c0 = 0;
        while c0 < g.ow {
            let lanes = (g.ow - c0).min(16);
            let store = if lanes == 16 { 0xffff } else { ((1u32 << lanes) - 1) as __mmask16 };
            let mut acc: [__m512; OB] = std::array::from_fn(|o| _mm512_set1_ps(bp[o]));
            let t = (c0 * g.sw) as isize - g.pl as isize;
            // the load masks of this chunk (the same for every input row): stride 1, tap kj
            // loads at t + kj; stride 2, taps kb and kb + 1 (kb even) load at t + kb and
            // t + kb + 16
            let mut ms = [0 as __mmask16; 12];
            for (k, m) in ms.iter_mut().enumerate().take(kw.next_multiple_of(2)) {
                let off = if g.sw == 1 { k } else { (k & !1) + 16 * (k & 1) };
                *m = mask(t + off as isize, g.w);
            }
            for ci in 0..g.c {
                for ki in 0..kh {
                    let ri = (r * g.sh + ki) as isize - g.pt as isize;
                    if ri < 0 || ri as usize >= g.h {
                        continue; // a padding row adds nothing
                    }
                    let rowp = x.as_ptr().add(((ni * g.c + ci) * g.h + ri as usize) * g.w);
                    let wrow = wp.as_ptr().add((ci * kh + ki) * kw * OB);
                    // masked-off lanes are not read: only columns 0..w of the row are touched
                    let ld =
                        |k: usize, off: usize| _mm512_maskz_loadu_ps(ms[k], rowp.wrapping_offset(t + off as isize));
                    if g.sw == 1 {
                        for kj in 0..kw {
                            fma16(&mut acc, wrow.add(kj * OB), ld(kj, kj));
                        }
                    } else {
                        // columns t + kb + 2j (tap kb) and t + kb + 1 + 2j (tap kb + 1)
                        let mut kb = 0;
                        while kb < kw {
                            let (a, b) = (ld(kb, kb), ld(kb + 1, kb + 16));
                            fma16(&mut acc, wrow.add(kb * OB), _mm512_permutex2var_ps(a, even, b));
                            if kb + 1 < kw {
                                fma16(&mut acc, wrow.add((kb + 1) * OB), _mm512_permutex2var_ps(a, odd, b));
                            }
                            kb += 2;
                        }
                    }
                }
            }
            for (o, a) in acc.iter().enumerate().take(nb) {
                let at = ((ni * g.o + o0 + o) * g.oh + r) * g.ow + c0;
                _mm512_mask_storeu_ps(out.add(at), store, finish(*a, res, at, store, act));
            }
            c0 += 16;
        }
    }
}
