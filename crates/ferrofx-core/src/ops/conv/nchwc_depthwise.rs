//! The depthwise kernel of `nchwc_conv2d` (`groups == in_channels == out_channels`, MobileNet's
//! and EfficientNet's 3x3 and 5x5 layers) on NCHW16c activations.
//!
//! In the blocked layout a depthwise convolution needs no broadcast and no transpose: the 16
//! channels of a block are the 16 lanes of one register, each tap's 16 weights are one more
//! register, and an output pixel is `sum over taps of x[pixel + tap] * w[tap]`, one fused
//! multiply-add per tap on whole vectors. A row of output pixels is computed [`RUN`] pixels at
//! a time (independent accumulators, so the multiply-adds of one tap overlap); runs whose
//! window lies inside the row take every tap without a test, the few at the row's ends test
//! each column. Rows outside the plane (padding) are skipped, so no padded copy is made. Bias,
//! residual, ReLU and clamp are applied in registers before the one store; SiLU and hardswish
//! on the stored row. Tasks are (image, channel block, band of output rows) on the kernel
//! team.

use super::depthwise3x3::RegAct;
use super::epilogue::Epilogue;
use super::nchwc::NCHWC_BLOCK as B;
use super::{Activation, Geom, SendPtr};
use std::mem::MaybeUninit;

/// Output pixels computed together (one accumulator each).
const RUN: usize = 8;

/// The depthwise weights `[c, 1, kh, kw]` packed as `[c/16][kh * kw][16]` (channels past `c`
/// in the last block are zero).
pub(super) fn pack(w: &[f32], c: usize, taps: usize) -> Vec<f32> {
    let mut p = vec![0.0f32; c.div_ceil(B) * taps * B];
    for ch in 0..c {
        for t in 0..taps {
            p[((ch / B) * taps + t) * B + ch % B] = w[ch * taps + t];
        }
    }
    p
}

/// The depthwise convolution: `x` `[n, c/16, h, w, 16]`, packed weights `wp` (see [`pack`]),
/// `bias` (if any) `c/16 * 16` values, `res` (if any) and `out` `[n, c/16, oh, ow, 16]` (every
/// element of `out` written); `act(conv + bias + res)`. `g` is a depthwise geometry
/// (`groups == c == o`) and the CPU has AVX-512F (checked by the caller).
#[allow(clippy::too_many_arguments)]
pub(super) fn depthwise(
    g: &Geom,
    x: &[f32],
    wp: &[f32],
    bias: Option<&[f32]>,
    res: Option<&[f32]>,
    act: Activation,
    out: &mut [MaybeUninit<f32>],
) {
    let cb = g.c.div_ceil(B);
    let taps = g.kh * g.kw;
    let (plane_in, plane_out) = (g.h * g.w * B, g.oh * g.ow * B);
    let total = g.n * cb * plane_out;
    assert!(
        g.groups == g.c
            && g.c == g.o
            && super::avx512()
            && x.len() >= g.n * cb * plane_in
            && wp.len() >= cb * taps * B
            && out.len() >= total
            && bias.is_none_or(|b| b.len() >= cb * B)
            && res.is_none_or(|r| r.len() >= total),
        "nchwc depthwise conv: geometry, CPU or buffer sizes (checked by the op)"
    );
    if total == 0 {
        return;
    }
    let (ract, later) = RegAct::split(act);
    let threads = super::team::threads().max(1);
    let planes = g.n * cb;
    // bands of output rows, so that a few large planes still give every thread work
    let bands = if threads > 1 { (4 * threads).div_ceil(planes).clamp(1, g.oh) } else { 1 };
    let band_rows = g.oh.div_ceil(bands);
    let bands = g.oh.div_ceil(band_rows);
    let zero = [0.0f32; B];
    // 3x3 of stride 1 or 2 (MobileNet's layers): rows in the padding read a row of zeros, the
    // nine weights stay in registers, every column test is on constants
    let k3 = g.kh == 3 && g.kw == 3 && g.dh == 1 && g.dw == 1 && g.sh == g.sw && (1..=2).contains(&g.sh);
    let zero_row = if k3 { vec![0.0f32; g.w * B] } else { Vec::new() };
    let bias = bias.map(|b| SendPtr(b.as_ptr().cast_mut()));
    let res = SendPtr(res.map_or(std::ptr::null_mut(), |r| r.as_ptr().cast_mut()));
    let optr = SendPtr(out.as_mut_ptr().cast::<f32>());
    let task = |t: usize| {
        let (plane, band) = (t / bands, t % bands);
        let blk = plane % cb;
        let (y0, y1) = (band * band_rows, ((band + 1) * band_rows).min(g.oh));
        let args = PlaneArgs {
            x: x[plane * plane_in..].as_ptr(),
            w: wp[blk * taps * B..].as_ptr(),
            // SAFETY: `bias` holds `cb * 16` values (asserted)
            bias: bias.map_or(zero.as_ptr(), |b| unsafe { b.ptr().add(blk * B).cast_const() }),
            // SAFETY (both): in bounds (asserted sizes); this task alone writes rows y0..y1
            // of this plane
            res: if res.ptr().is_null() { std::ptr::null() } else { unsafe { res.ptr().add(plane * plane_out) } },
            out: unsafe { optr.ptr().add(plane * plane_out) },
            act: ract,
        };
        for oy in y0..y1 {
            // SAFETY: AVX-512F (asserted); the pointers of `args` are as `row` requires, and
            // `zero_row` holds a row of the input's width
            #[cfg(target_arch = "x86_64")]
            unsafe {
                match (k3, g.sw) {
                    (true, 1) => avx512::row3::<1>(g, &args, oy, zero_row.as_ptr()),
                    (true, _) => avx512::row3::<2>(g, &args, oy, zero_row.as_ptr()),
                    _ => avx512::row(g, &args, oy),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("nchwc depthwise kernel runs on x86-64 only (checked by the caller)");
        }
        if later {
            let off = plane * plane_out + y0 * g.ow * B;
            let len = (y1 - y0) * g.ow * B;
            // SAFETY: these rows were written above by this task alone
            let seg = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(off), len) };
            Epilogue { residual: None, act }.apply(seg, off);
        }
    };
    let tasks = planes * bands;
    if threads > 1 && tasks > 1 && total >= 1 << 14 && super::team::parallel() {
        super::team::for_each(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One plane's operands (one image, one channel block).
struct PlaneArgs {
    /// The input plane `[h][w][16]`.
    x: *const f32,
    /// The block's packed weights `[kh * kw][16]`.
    w: *const f32,
    /// The block's 16 biases (zeros when there is no bias).
    bias: *const f32,
    /// The residual plane (the output's shape) or null.
    res: *const f32,
    /// The output plane `[oh][ow][16]`.
    out: *mut f32,
    act: RegAct,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::depthwise3x3::avx512::finish;
    use super::super::Geom;
    use super::{PlaneArgs, B, RUN};
    use std::arch::x86_64::*;

    /// Output row `oy` of one plane.
    ///
    /// # Safety
    /// AVX-512F; the pointers of `a` cover their planes as [`super::depthwise`] describes.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row(g: &Geom, a: &PlaneArgs, oy: usize) {
        // the kernel rows that fall inside the input
        let iy0 = (oy * g.sh) as isize - g.pt as isize;
        let rows: smallvec::SmallVec<[(usize, *const f32); 8]> = (0..g.kh)
            .filter_map(|ki| {
                let iy = iy0 + (ki * g.dh) as isize;
                (iy >= 0 && (iy as usize) < g.h).then(|| (ki, a.x.add(iy as usize * g.w * B)))
            })
            .collect();
        let bias = _mm512_loadu_ps(a.bias);
        let out_row = oy * g.ow * B;
        // output columns whose whole window lies inside the row: ox * sw >= pl and
        // ox * sw - pl + (kw - 1) * dw < w
        let span = (g.kw - 1) * g.dw;
        let lo = g.pl.div_ceil(g.sw).min(g.ow);
        let hi = if g.w + g.pl > span { ((g.w + g.pl - span - 1) / g.sw + 1).min(g.ow) } else { 0 };
        let hi = hi.max(lo);
        let mut ox = 0;
        while ox < g.ow {
            if ox >= lo && ox + RUN <= hi {
                run(g, a, &rows, bias, out_row, ox);
                ox += RUN;
            } else {
                pixel(g, a, &rows, bias, out_row, ox);
                ox += 1;
            }
        }
    }

    /// Output row `oy` of a 3x3 depthwise convolution of stride `S` (dilation 1): the weights
    /// in nine registers, rows in the padding read `zero_row`; the columns whose window lies
    /// inside the row in runs of 8, 4 and 1 pixels without tests, the others tap by tap.
    ///
    /// # Safety
    /// As [`row`]; `zero_row` holds `g.w * 16` zeros.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row3<const S: usize>(g: &Geom, a: &PlaneArgs, oy: usize, zero_row: *const f32) {
        let iy0 = (oy * S) as isize - g.pt as isize;
        let r = Row3 {
            rows: std::array::from_fn(|ki| {
                let iy = iy0 + ki as isize;
                if iy >= 0 && (iy as usize) < g.h {
                    a.x.add(iy as usize * g.w * B)
                } else {
                    zero_row
                }
            }),
            wv: std::array::from_fn(|t| _mm512_loadu_ps(a.w.add(t * B))),
            bias: _mm512_loadu_ps(a.bias),
            out_row: oy * g.ow * B,
        };
        // output columns whose window lies inside the row: ox * S >= pl, ox * S - pl + 2 < w
        let lo = g.pl.div_ceil(S).min(g.ow);
        let hi = if g.w + g.pl > 2 { ((g.w + g.pl - 3) / S + 1).min(g.ow) } else { 0 };
        let hi = hi.max(lo);
        let mut ox = 0;
        while ox < lo {
            edge3::<S>(g, a, &r, ox);
            ox += 1;
        }
        while ox + 8 <= hi {
            run3::<8, S>(g, a, &r, ox);
            ox += 8;
        }
        if ox + 4 <= hi {
            run3::<4, S>(g, a, &r, ox);
            ox += 4;
        }
        while ox < hi {
            run3::<1, S>(g, a, &r, ox);
            ox += 1;
        }
        while ox < g.ow {
            edge3::<S>(g, a, &r, ox);
            ox += 1;
        }
    }

    /// One output row of a 3x3 depthwise convolution: its three input rows (a row of zeros
    /// for those in the padding), the nine weight vectors, the bias, the row's first output.
    struct Row3 {
        rows: [*const f32; 3],
        wv: [__m512; 9],
        bias: __m512,
        out_row: usize,
    }

    /// `R` output pixels of a 3x3 row from `ox` on, every tap inside the row.
    #[inline(always)]
    unsafe fn run3<const R: usize, const S: usize>(g: &Geom, a: &PlaneArgs, r: &Row3, ox: usize) {
        let mut acc = [r.bias; R];
        for (ki, xr) in r.rows.iter().enumerate() {
            let base = xr.add((ox * S - g.pl) * B);
            for kj in 0..3 {
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_loadu_ps(base.add((j * S + kj) * B)), r.wv[ki * 3 + kj], *acc);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            let at = r.out_row + (ox + j) * B;
            _mm512_storeu_ps(a.out.add(at), finish(*acc, a.res, at, 0xffff, a.act));
        }
    }

    /// One output pixel of a 3x3 row whose window crosses the row's ends.
    #[inline(always)]
    unsafe fn edge3<const S: usize>(g: &Geom, a: &PlaneArgs, r: &Row3, ox: usize) {
        let mut acc = r.bias;
        let ix0 = (ox * S) as isize - g.pl as isize;
        for (ki, xr) in r.rows.iter().enumerate() {
            for kj in 0..3 {
                let ix = ix0 + kj as isize;
                if ix >= 0 && (ix as usize) < g.w {
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(xr.add(ix as usize * B)), r.wv[ki * 3 + kj], acc);
                }
            }
        }
        let at = r.out_row + ox * B;
        _mm512_storeu_ps(a.out.add(at), finish(acc, a.res, at, 0xffff, a.act));
    }

    /// `RUN` output pixels from `ox` on, every tap inside the row.
    #[inline(always)]
    unsafe fn run(g: &Geom, a: &PlaneArgs, rows: &[(usize, *const f32)], bias: __m512, out_row: usize, ox: usize) {
        let mut acc = [bias; RUN];
        let step = g.sw * B;
        for &(ki, xr) in rows {
            for kj in 0..g.kw {
                let wv = _mm512_loadu_ps(a.w.add((ki * g.kw + kj) * B));
                let base = xr.add((ox * g.sw + kj * g.dw - g.pl) * B);
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_loadu_ps(base.add(j * step)), wv, *acc);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            let at = out_row + (ox + j) * B;
            _mm512_storeu_ps(a.out.add(at), finish(*acc, a.res, at, 0xffff, a.act));
        }
    }

    /// One output pixel, testing each tap's column.
    #[inline(always)]
    unsafe fn pixel(g: &Geom, a: &PlaneArgs, rows: &[(usize, *const f32)], bias: __m512, out_row: usize, ox: usize) {
        let mut acc = bias;
        let ix0 = (ox * g.sw) as isize - g.pl as isize;
        for &(ki, xr) in rows {
            for kj in 0..g.kw {
                let ix = ix0 + (kj * g.dw) as isize;
                if ix >= 0 && (ix as usize) < g.w {
                    let wv = _mm512_loadu_ps(a.w.add((ki * g.kw + kj) * B));
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(xr.add(ix as usize * B)), wv, acc);
                }
            }
        }
        let at = out_row + ox * B;
        _mm512_storeu_ps(a.out.add(at), finish(acc, a.res, at, 0xffff, a.act));
    }
}
