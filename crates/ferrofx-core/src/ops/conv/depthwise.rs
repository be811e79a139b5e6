//! Direct depthwise convolution (`groups == in_channels == out_channels`, float32): each
//! output plane is a small stencil of one input plane, so the GEMM lowering (one im2col and a
//! 1-row GEMM per channel) spends its time in copies and call overhead. Here every (image,
//! channel) plane is computed straight from a zero-padded copy of its input plane that stays
//! in L1/L2:
//!
//! - the padded plane is stored by **row and column phase** (`[stride_h][stride_w][rows /
//!   stride_h][cols / stride_w]`), so for any stride the input values one kernel tap reads for
//!   the whole output plane are one contiguous run of a phase plane;
//! - the plane is computed as one **flat stencil**: per tap, one loop over the "wide" output
//!   (`oh` rows of the phase plane's width, whose extra columns are dropped when the plane is
//!   stored), compiled for AVX-512/AVX2 by `simd_dispatch!` (the 3x3 case, MobileNet's and
//!   EfficientNet's, in one pass with the nine taps in registers). Small planes (7x7, 14x14)
//!   thus run full-width vectors instead of a 7- or 14-element loop per row;
//! - planes run in parallel on the rayon pool.
//!
//! The sum per output is `bias + Σ_taps w * x` in row-major tap order, as the GEMM lowering
//! sums it (up to the GEMM's own blocking), within float32 rounding of PyTorch.

use super::{depthwise3x3, Epilogue, Geom, SendPtr};
use crate::ops::simd::simd_dispatch;
use std::mem::MaybeUninit;

/// Whether `g` is a depthwise convolution this kernel computes (one input and one output
/// channel per group).
pub(super) fn applies(g: &Geom) -> bool {
    g.groups > 1 && g.groups == g.c && g.groups == g.o
}

/// Padded-plane geometry: rows and columns per phase.
struct Padded {
    /// Rows per row phase (`ceil(rows / sh)`).
    rq: usize,
    /// Columns per column phase (`ceil(cols / sw)`).
    wq: usize,
}

impl Padded {
    fn of(g: &Geom) -> Padded {
        let rows = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
        let cols = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
        Padded { rq: rows.div_ceil(g.sh), wq: cols.div_ceil(g.sw) }
    }
    /// Elements of one phase plane.
    fn phase(&self) -> usize {
        self.rq * self.wq
    }
    fn len(&self, g: &Geom) -> usize {
        g.sh * g.sw * self.phase()
    }
}

/// Copies input plane `x` (`h x w`) into `pad` (zero padding; rows and columns split by
/// phase: padded row `r`, column `c` at `[r % sh][c % sw][r / sh][c / sw]`).
fn fill_padded(g: &Geom, p: &Padded, x: &[f32], pad: &mut [f32]) {
    let phase = p.phase();
    for r in 0..p.rq * g.sh {
        let (ph, rr) = (r % g.sh, r / g.sh);
        let ih = r as isize - g.pt as isize;
        let src = (ih >= 0 && (ih as usize) < g.h).then(|| &x[ih as usize * g.w..(ih as usize + 1) * g.w]);
        for q in 0..g.sw {
            let dst = &mut pad[(ph * g.sw + q) * phase + rr * p.wq..][..p.wq];
            match src {
                None => dst.fill(0.0),
                Some(src) => phase_row(g.sw, g.pl, src, q, dst),
            }
        }
    }
}

/// Column phase `q` of one zero-padded row (`pl` zeros before `src`):
/// `dst[j] = src[j * sw + q - pl]`, zero where that column is padding. The valid range of `j`
/// is computed once, so the copy has no per-element test; stride 2 (every stride-2 layer of
/// MobileNet and EfficientNet) takes the first of each pair.
fn phase_row(sw: usize, pl: usize, src: &[f32], q: usize, dst: &mut [f32]) {
    let (w, wq) = (src.len(), dst.len());
    // valid j: 0 <= j*sw + q - pl < w
    let lo = pl.saturating_sub(q).div_ceil(sw).min(wq);
    let hi = (w + pl).saturating_sub(q).div_ceil(sw).clamp(lo, wq);
    dst[..lo].fill(0.0);
    dst[hi..].fill(0.0);
    if lo == hi {
        return;
    }
    let s0 = lo * sw + q - pl;
    let out = &mut dst[lo..hi];
    match sw {
        1 => out.copy_from_slice(&src[s0..s0 + out.len()]),
        2 => {
            // pairs (s0 + 2j, s0 + 2j + 1): the first of each pair is this phase's value
            let pairs = src[s0..].chunks_exact(2);
            let n = pairs.len().min(out.len());
            for (d, pr) in out[..n].iter_mut().zip(pairs) {
                *d = pr[0];
            }
            if n < out.len() {
                out[n] = src[s0 + 2 * n];
            }
        }
        _ => {
            for (d, &v) in out.iter_mut().zip(src[s0..].iter().step_by(sw)) {
                *d = v;
            }
        }
    }
}

simd_dispatch! {
    /// One output plane from its padded input plane: `out[oh][ow] = b + Σ w[ki][kj] * x[..]`,
    /// computed as a flat stencil into `acc` (`oh` rows of `wq`) and stored without the extra
    /// columns.
    fn plane(g: &Geom, p: &Padded, pad: &[f32], w: &[f32], b: f32, acc: &mut [f32], out: &mut [MaybeUninit<f32>]) {
        let (wq, phase) = (p.wq, p.phase());
        // the wide outputs: rows of wq, the last one cut at ow
        let n = (g.oh - 1) * wq + g.ow;
        // the run of the padded plane tap (ki, kj) reads for the n wide outputs: rows
        // oh*sh + ki*dh and columns ow*sw + kj*dw are phase (r % sh, c % sw), index
        // (oh + r / sh, ow + c / sw) there
        let tap = |ki: usize, kj: usize| -> &[f32] {
            let (r, c) = (ki * g.dh, kj * g.dw);
            let start = ((r % g.sh) * g.sw + c % g.sw) * phase + (r / g.sh) * wq + c / g.sw;
            &pad[start..start + n]
        };
        let acc = &mut acc[..n];
        if g.kh == 3 && g.kw == 3 {
            let (t0, t1, t2) = (tap(0, 0), tap(0, 1), tap(0, 2));
            let (t3, t4, t5) = (tap(1, 0), tap(1, 1), tap(1, 2));
            let (t6, t7, t8) = (tap(2, 0), tap(2, 1), tap(2, 2));
            let w: &[f32; 9] = w[..9].try_into().expect("3x3 kernel");
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
        } else {
            acc.fill(b);
            for ki in 0..g.kh {
                for kj in 0..g.kw {
                    let wv = w[ki * g.kw + kj];
                    for (a, &v) in acc.iter_mut().zip(tap(ki, kj)) {
                        *a += wv * v;
                    }
                }
            }
        }
        for (oh, orow) in out.chunks_mut(g.ow).enumerate() {
            for (o, &a) in orow.iter_mut().zip(&acc[oh * wq..]) {
                o.write(a);
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
    if out.is_empty() {
        return;
    }
    if depthwise3x3::applies(g) {
        conv_3x3(g, x, w, bias, out, ep);
    } else {
        conv_padded(g, x, w, bias, out, ep);
    }
}

/// [`conv`] by the portable kernel: a padded, phase-split copy of each plane and a flat stencil.
fn conv_padded(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
) {
    let p = Padded::of(g);
    let (plane_in, plane_out, taps) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw);
    // scratch per worker: the padded plane and the wide output
    let run = |(u, o): (usize, &mut [MaybeUninit<f32>]), (pad, acc): &mut (Vec<f32>, Vec<f32>)| {
        let ch = u % g.c;
        pad.resize(p.len(g), 0.0);
        acc.resize(g.oh * p.wq, 0.0);
        fill_padded(g, &p, &x[u * plane_in..(u + 1) * plane_in], pad);
        plane(g, &p, pad, &w[ch * taps..(ch + 1) * taps], bias.map_or(0.0, |b| b[ch]), acc, o);
        if let Some(ep) = ep {
            // SAFETY: `plane` wrote every element of `o`.
            let done = unsafe { std::slice::from_raw_parts_mut(o.as_mut_ptr().cast::<f32>(), o.len()) };
            ep.apply(done, u * plane_out);
        }
    };
    let threads = super::team::threads();
    if out.len() * taps >= 1 << 15 && threads > 1 {
        // runs of planes, one pair of scratch buffers per run
        let planes = out.len() / plane_out;
        let optr = SendPtr(out.as_mut_ptr());
        super::team::ranges(planes, 2 * threads, |r| {
            let mut s = (Vec::new(), Vec::new());
            for u in r {
                // SAFETY: plane u is elements u*plane_out..(u+1)*plane_out of `out`, exclusively
                // borrowed here; the ranges are disjoint.
                let o = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(u * plane_out), plane_out) };
                run((u, o), &mut s);
            }
        });
    } else {
        let mut s = (Vec::new(), Vec::new());
        for uo in out.chunks_mut(plane_out).enumerate() {
            run(uo, &mut s);
        }
    }
}

/// [`conv`] by the direct 3x3 kernel (`depthwise3x3.rs`): planes split into a few tasks per
/// thread (one fork-join per call, each task a run of whole planes), the epilogue in registers.
fn conv_3x3(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
) {
    let (plane_in, plane_out) = (g.h * g.w, g.oh * g.ow);
    let planes = g.n * g.c;
    // what the plane kernel could not apply in registers (silu, hardswish): the residual was
    // added there, so only the activation is left
    let later = ep.map(|e| Epilogue { residual: None, act: e.act });
    let run = |u0: usize, o: &mut [MaybeUninit<f32>], zero: &[f32]| {
        for (k, op) in o.chunks_mut(plane_out).enumerate() {
            let u = u0 + k;
            let ch = u % g.c;
            let p = depthwise3x3::Plane {
                x: &x[u * plane_in..(u + 1) * plane_in],
                w: &w[ch * 9..ch * 9 + 9],
                b: bias.map_or(0.0, |b| b[ch]),
                res: ep.and_then(|e| e.residual).map(|r| &r[u * plane_out..(u + 1) * plane_out]),
                zero,
                out: op,
            };
            if depthwise3x3::plane(g, p, ep) {
                if let Some(l) = &later {
                    // SAFETY: `plane` wrote every element of `op`.
                    let done = unsafe { std::slice::from_raw_parts_mut(op.as_mut_ptr().cast::<f32>(), op.len()) };
                    l.apply(done, u * plane_out);
                }
            }
        }
    };
    let zero = vec![0.0f32; g.w];
    let threads = super::team::threads();
    // below ~64K outputs a fork-join costs about what a second thread saves
    if threads > 1 && planes > 1 && out.len() >= 1 << 16 {
        let per = planes.div_ceil(2 * threads);
        super::team::chunks_mut(out, per * plane_out, |t, o| run(t * per, o, &zero));
    } else {
        run(0, out, &zero);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Activation;
    use super::*;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn run(
        f: super::super::DirectKernel,
        g: &Geom,
        x: &[f32],
        w: &[f32],
        b: &[f32],
        ep: Option<&Epilogue<'_>>,
    ) -> Vec<u32> {
        let len = g.n * g.c * g.oh * g.ow;
        let mut out = vec![f32::NAN; len];
        // SAFETY: f32 and MaybeUninit<f32> have the same layout; every element is initialised.
        let o = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<MaybeUninit<f32>>(), len) };
        f(g, x, w, Some(b), o, ep);
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// The direct AVX-512 3x3 kernel equals the portable one bit for bit: every stride pair,
    /// padding 0-2 per side (asymmetric too), planes from 1x1 to wider than one block of 8
    /// chunks (130 columns), batch 1 and 2 (parallel and serial), every activation with and
    /// without a residual.
    #[test]
    fn direct_3x3_is_bit_equal_to_the_padded_stencil() {
        let acts = [
            Activation::None,
            Activation::Relu,
            Activation::Clamp(0.0, 6.0),
            Activation::Clamp(-0.5, 0.25),
            Activation::Silu,
            Activation::Hardswish,
        ];
        let r = rand_vec(12 * 64, 99);
        let pick =
            |i: usize, lo: usize, hi: usize| lo + ((r[i] + 1.0) / 2.0 * (hi - lo + 1) as f32) as usize % (hi - lo + 1);
        let mut geoms = vec![
            // MobileNetV2's shapes, a plane wider than 8 chunks, and 1-3 wide planes
            (1, 32, 112, 112, 1, 1, 1, 1, 1, 1),
            (1, 24, 56, 56, 2, 2, 1, 1, 1, 1),
            (2, 40, 7, 7, 1, 1, 1, 1, 1, 1),
            (1, 3, 9, 261, 1, 2, 1, 1, 1, 1),
            (1, 4, 1, 1, 1, 1, 1, 1, 1, 1),
            (2, 3, 3, 2, 2, 2, 1, 1, 1, 1),
            (1, 5, 2, 3, 1, 1, 1, 1, 1, 1),
            (1, 2, 5, 1, 2, 1, 0, 2, 1, 1),
        ];
        for i in 0..64 {
            let k = 12 * i;
            let (sh, sw) = (pick(k, 1, 2), pick(k + 1, 1, 2));
            let (pt, pb, pl, pr) = (pick(k + 2, 0, 2), pick(k + 3, 0, 2), pick(k + 4, 0, 2), pick(k + 5, 0, 2));
            let h = pick(k + 6, 1, 20).max(3 - (pt + pb).min(3));
            let w = pick(k + 7, 1, 40).max(3 - (pl + pr).min(3));
            geoms.push((pick(k + 8, 1, 2), pick(k + 9, 1, 6), h, w, sh, sw, pt, pb, pl, pr));
        }
        let mut tested = 0;
        for (i, &(n, c, h, w, sh, sw, pt, pb, pl, pr)) in geoms.iter().enumerate() {
            let (oh, ow) = ((h + pt + pb - 3) / sh + 1, (w + pl + pr - 3) / sw + 1);
            let g = Geom { n, c, h, w, o: c, kh: 3, kw: 3, sh, sw, pt, pb, pl, pr, dh: 1, dw: 1, groups: c, oh, ow };
            if !depthwise3x3::applies(&g) {
                return; // no AVX-512 on this CPU: nothing to compare
            }
            let seed = 1000 + 10 * i as u64;
            let x = rand_vec(n * c * h * w, seed);
            let wt: Vec<f32> = rand_vec(c * 9, seed + 1).iter().map(|v| 2.0 * v).collect();
            let b = rand_vec(c, seed + 2);
            let res = rand_vec(n * c * oh * ow, seed + 3);
            let act = acts[i % acts.len()];
            for residual in [None, Some(&res[..])] {
                let ep = Epilogue { residual, act };
                for e in [None, Some(&ep)] {
                    let want = run(conv_padded, &g, &x, &wt, &b, e);
                    let got = run(conv_3x3, &g, &x, &wt, &b, e);
                    assert!(got == want, "case {i}: {g:?} {act} residual={}", residual.is_some());
                    tested += 1;
                }
            }
        }
        assert_eq!(tested, 4 * geoms.len());
    }
}
