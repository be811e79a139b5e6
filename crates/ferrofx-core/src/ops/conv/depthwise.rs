//! Direct depthwise convolution (`groups == in_channels == out_channels`, float32): each
//! output plane is a small stencil of one input plane, so the GEMM lowering (one im2col and a
//! 1-row GEMM per channel) spends its time in copies and call overhead. Here every (image,
//! channel) plane is computed straight from a zero-padded copy of its input plane that stays
//! in L1/L2:
//!
//! - the padded plane is stored by **column phase** (`[rows][stride_w][cols / stride_w]`), so
//!   for any horizontal stride the input values one kernel tap reads for a row of outputs are
//!   contiguous;
//! - per output row, the kernel's taps are accumulated into the row with loops over the width
//!   compiled for AVX-512/AVX2 by `simd_dispatch!` (the 3x3 case, MobileNet's and
//!   EfficientNet's, in one pass over the row with the nine taps in registers);
//! - planes run in parallel on the rayon pool.
//!
//! The sum per output is `bias + Σ_taps w * x` in row-major tap order, as the GEMM lowering
//! sums it (up to the GEMM's own blocking), within float32 rounding of PyTorch.

use super::{Epilogue, Geom};
use crate::ops::simd::simd_dispatch;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Whether `g` is a depthwise convolution this kernel computes (one input and one output
/// channel per group).
pub(super) fn applies(g: &Geom) -> bool {
    g.groups > 1 && g.groups == g.c && g.groups == g.o
}

/// Padded-plane geometry: rows and phase-split columns actually read.
struct Padded {
    rows: usize,
    /// Columns per phase (`ceil(cols / sw)`).
    wq: usize,
}

impl Padded {
    fn of(g: &Geom) -> Padded {
        let rows = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
        let cols = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
        Padded { rows, wq: cols.div_ceil(g.sw) }
    }
    fn len(&self, g: &Geom) -> usize {
        self.rows * g.sw * self.wq
    }
}

/// Copies input plane `x` (`h x w`) into `pad` (zero padding; columns split by phase).
fn fill_padded(g: &Geom, p: &Padded, x: &[f32], pad: &mut [f32]) {
    let row_len = g.sw * p.wq;
    for r in 0..p.rows {
        let dst = &mut pad[r * row_len..(r + 1) * row_len];
        let ih = r as isize - g.pt as isize;
        if ih < 0 || ih as usize >= g.h {
            dst.fill(0.0);
            continue;
        }
        let src = &x[ih as usize * g.w..(ih as usize + 1) * g.w];
        if g.sw == 1 {
            let pl = g.pl.min(dst.len());
            dst[..pl].fill(0.0);
            let n = src.len().min(dst.len() - pl);
            dst[pl..pl + n].copy_from_slice(&src[..n]);
            dst[pl + n..].fill(0.0);
        } else {
            split_phases(g.sw, g.pl, src, dst, p.wq);
        }
    }
}

/// Splits one row `src` into `sw` column phases of the zero-padded row (`pl` zeros before
/// it): `dst[q * wq + j] = src[j * sw + q - pl]`, zero where that column is padding. The valid
/// range of `j` is computed once per phase, so the copy has no per-element test; stride 2
/// (every stride-2 layer of MobileNet and EfficientNet) deinterleaves pairs.
fn split_phases(sw: usize, pl: usize, src: &[f32], dst: &mut [f32], wq: usize) {
    let w = src.len();
    for (q, phase) in dst.chunks_mut(wq).enumerate() {
        // valid j: 0 <= j*sw + q - pl < w
        let lo = pl.saturating_sub(q).div_ceil(sw).min(wq);
        let hi = (w + pl).saturating_sub(q).div_ceil(sw).clamp(lo, wq);
        phase[..lo].fill(0.0);
        phase[hi..].fill(0.0);
        if lo == hi {
            continue;
        }
        let s0 = lo * sw + q - pl;
        let out = &mut phase[lo..hi];
        if sw == 2 {
            // pairs (s0 + 2j, s0 + 2j + 1): the first of each pair is this phase's value
            let pairs = src[s0..].chunks_exact(2);
            let n = pairs.len().min(out.len());
            for (d, pr) in out[..n].iter_mut().zip(pairs) {
                *d = pr[0];
            }
            if n < out.len() {
                out[n] = src[s0 + 2 * n];
            }
        } else {
            for (d, &v) in out.iter_mut().zip(src[s0..].iter().step_by(sw)) {
                *d = v;
            }
        }
    }
}

/// Whether a plane is computed as one flat stencil (3x3, stride 1, no dilation; see `plane`).
fn wide(g: &Geom) -> bool {
    g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1
}

simd_dispatch! {
    /// One output plane from its padded input plane: `out[oh][ow] = b + Σ w[ki][kj] * x[..]`.
    fn plane(g: &Geom, wq: usize, pad: &[f32], w: &[f32], b: f32, acc: &mut [f32], out: &mut [MaybeUninit<f32>]) {
        let row_len = g.sw * wq;
        // the slice of the padded plane tap (ki, kj) reads for output row oh
        let tap = |oh: usize, ki: usize, kj: usize| -> &[f32] {
            let c = kj * g.dw;
            let start = (oh * g.sh + ki * g.dh) * row_len + (c % g.sw) * wq + c / g.sw;
            &pad[start..start + g.ow]
        };
        if wide(g) {
            // stride 1: the plane as one flat stencil over the padded rows ("wide" outputs
            // include the padding columns between rows, dropped below), so small planes
            // (7x7, 14x14) still run full-width vectors; same sum order as the per-row loop
            let n = (g.oh - 1) * wq + g.ow;
            let (t0, t1, t2) = (&pad[..n], &pad[1..n + 1], &pad[2..n + 2]);
            let (t3, t4, t5) = (&pad[wq..wq + n], &pad[wq + 1..wq + n + 1], &pad[wq + 2..wq + n + 2]);
            let (t6, t7, t8) = (&pad[2 * wq..2 * wq + n], &pad[2 * wq + 1..2 * wq + n + 1], &pad[2 * wq + 2..2 * wq + n + 2]);
            let w: &[f32; 9] = w[..9].try_into().expect("3x3 kernel");
            let acc = &mut acc[..n];
            for j in 0..n {
                let mut a = b + w[0] * t0[j];
                a += w[1] * t1[j];
                a += w[2] * t2[j];
                a += w[3] * t3[j];
                a += w[4] * t4[j];
                a += w[5] * t5[j];
                a += w[6] * t6[j];
                a += w[7] * t7[j];
                a += w[8] * t8[j];
                acc[j] = a;
            }
            for (oh, orow) in out.chunks_mut(g.ow).enumerate() {
                for (o, &a) in orow.iter_mut().zip(&acc[oh * wq..]) {
                    o.write(a);
                }
            }
            return;
        }
        for (oh, orow) in out.chunks_mut(g.ow).enumerate() {
            if g.kh == 3 && g.kw == 3 {
                let (t0, t1, t2) = (tap(oh, 0, 0), tap(oh, 0, 1), tap(oh, 0, 2));
                let (t3, t4, t5) = (tap(oh, 1, 0), tap(oh, 1, 1), tap(oh, 1, 2));
                let (t6, t7, t8) = (tap(oh, 2, 0), tap(oh, 2, 1), tap(oh, 2, 2));
                let w: &[f32; 9] = w[..9].try_into().expect("3x3 kernel");
                for j in 0..orow.len() {
                    let mut a = b + w[0] * t0[j];
                    a += w[1] * t1[j];
                    a += w[2] * t2[j];
                    a += w[3] * t3[j];
                    a += w[4] * t4[j];
                    a += w[5] * t5[j];
                    a += w[6] * t6[j];
                    a += w[7] * t7[j];
                    a += w[8] * t8[j];
                    orow[j].write(a);
                }
            } else {
                acc.fill(b);
                for ki in 0..g.kh {
                    for kj in 0..g.kw {
                        let wv = w[ki * g.kw + kj];
                        for (a, &v) in acc.iter_mut().zip(tap(oh, ki, kj)) {
                            *a += wv * v;
                        }
                    }
                }
                for (o, &a) in orow.iter_mut().zip(acc.iter()) {
                    o.write(a);
                }
            }
        }
    }
}

/// Depthwise convolution of contiguous `x` `[n, c, h, w]` with `w` `[c, 1, kh, kw]` into
/// `out` `[n, c, oh, ow]` (every element written), then `ep` on each plane while it is in cache.
pub(super) fn conv(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
) {
    let p = Padded::of(g);
    let (plane_in, plane_out, taps) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw);
    if out.is_empty() {
        return;
    }
    // scratch per worker: the padded plane and one accumulator row
    let run = |(u, o): (usize, &mut [MaybeUninit<f32>]), (pad, acc): &mut (Vec<f32>, Vec<f32>)| {
        let ch = u % g.c;
        pad.resize(p.len(g), 0.0);
        acc.resize(if wide(g) { g.oh * p.wq } else { g.ow }, 0.0);
        fill_padded(g, &p, &x[u * plane_in..(u + 1) * plane_in], pad);
        plane(g, p.wq, pad, &w[ch * taps..(ch + 1) * taps], bias.map_or(0.0, |b| b[ch]), acc, o);
        if let Some(ep) = ep {
            // SAFETY: `plane` wrote every element of `o`.
            let done = unsafe { std::slice::from_raw_parts_mut(o.as_mut_ptr().cast::<f32>(), o.len()) };
            ep.apply(done, u * plane_out);
        }
    };
    if out.len() * taps >= 1 << 15 && rayon::current_thread_index().is_none() {
        out.par_chunks_mut(plane_out).enumerate().for_each_init(|| (Vec::new(), Vec::new()), |s, uo| run(uo, s));
    } else {
        let mut s = (Vec::new(), Vec::new());
        for uo in out.chunks_mut(plane_out).enumerate() {
            run(uo, &mut s);
        }
    }
}
