//! Float32 1x1 convolutions (stride 1, or strided without padding) on AVX-512: a GEMM
//! `out[o][p] = act(bias[o] + Σ_k W[o][k] · X[k][p] + residual[o][p])` over **pre-packed
//! weights**, reading the NCHW activation in place and applying the epilogue in registers.
//!
//! - The weights are packed once into panels of `MR` output channels, in the order the kernel
//!   reads them (`[k block][panel][k in block][MR]`: one sequential stream per pass) and the
//!   packing is cached on the weights' storage ([`crate::storage::Storage::derived`], as the
//!   Winograd weights are) when autograd cannot change them (inference); otherwise it is
//!   packed per call.
//! - `X` (`[C, H*W]` of one image; for a strided 1x1 convolution, the subsampled copy
//!   `[C, OH*OW]`) is not packed: its rows are contiguous, so a register tile of `MR` output
//!   channels by `NV` vectors of 16 pixels loads `NV` vectors of one input row per `k` and
//!   broadcasts `MR` weights (`MR * NV` fused multiply-adds). `K` is blocked by [`KC`] so that
//!   the `KC x 16*NV` slice of `X` a tile reads stays in L1 while every panel of output
//!   channels passes over it.
//! - The accumulators start at the bias; after the last `K` block the residual is added and
//!   ReLU / clamp (ReLU6) applied in registers before the one store (masked at the plane's
//!   end); SiLU and hardswish are applied to the stored rows while they are in L1.
//! - The tile is `8 x 48` pixels (24 accumulators). (Prefetching the next tile's slice of
//!   `X` during the first panel's pass was measured 10-20% slower in the compiled ResNet-50:
//!   it evicts the current slice from L1.)
//! - Where it is not used (the `gemm` crate path, measured faster there in the compiled
//!   models, docs/benchmarks.md session 14): planes of 64 pixels or fewer (7x7: the 49-pixel
//!   tile wastes a quarter of its lanes and the weights stream from DRAM at batch 1) and
//!   large planes (2048+ pixels) with 64 or fewer output channels (there the kernel is bound
//!   by reading `X` in place, which the `gemm` crate packs in one sequential pass).
//! - Threads: at batch < threads, one fork-join per image splits the pixel tiles (large
//!   planes) or the output-channel panels (small planes); at batch >= threads, images run in
//!   parallel, one thread each.
//!
//! Measured (docs/benchmarks.md, session 14): on one core the `gemm` crate already runs these
//! layers at 200-255 GFLOP/s (≈ 80-95% of the core's peak); this kernel is 3-12% faster on
//! the 14x14-56x56 layers (hot caches, thread CPU time) and saves the epilogue's pass over
//! the output.
//!
//! The sum per output is `bias + Σ_k w x` in `k` order (fused multiply-adds, `K` blocks in
//! order), then `+ residual`, then the activation: a fused node equals `conv2d` followed by
//! `add` and the activation bit for bit, and the GEMM paths within float32 rounding.

use super::epilogue::{Activation, Epilogue};
use super::{Geom, SendPtr};
use crate::tensor::Tensor;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// `K` block: the rows of `X` one tile reads per pass (`KC * 48 * 4` bytes = 48 KiB at most;
/// 128-512 measured within a few percent of each other, 256 best).
const KC: usize = 256;

/// Output channels per register tile (rows of a packed panel).
const MR: usize = 8;
/// Vectors of 16 pixels per register tile.
const NV: usize = 3;

/// Whether this kernel computes `g` on this CPU: float32 is checked by the caller; an
/// ungrouped 1x1 convolution without padding (any stride and dilation) with more than 64
/// output pixels per image, and more than 64 output channels when the plane has 2048 pixels
/// or more (see the module docs), on a CPU with AVX-512F.
pub(super) fn applies(g: &Geom) -> bool {
    let p = g.oh * g.ow;
    g.groups == 1
        && g.kh == 1
        && g.kw == 1
        && g.pt + g.pb + g.pl + g.pr == 0
        && p > 64
        && (g.o > 64 || p < 2048)
        && g.c > 0
        && super::avx512()
}

/// Weights `[o][k]` packed for the kernel: for each `K` block `k0` (of `kb = min(KC, k - k0)`
/// rows) and panel `pi` of `mr` output channels, `kb x mr` values at `k0 * panels * mr +
/// pi * kb * mr`, zero for channels past `o`.
pub(super) struct PackedWeight {
    o: usize,
    k: usize,
    mr: usize,
    w: Vec<f32>,
}

impl PackedWeight {
    fn pack(ws: &[f32], o: usize, k: usize, mr: usize) -> PackedWeight {
        let panels = o.div_ceil(mr);
        let mut w = vec![0f32; panels * mr * k];
        for (oo, row) in ws.chunks_exact(k).take(o).enumerate() {
            let (pi, r) = (oo / mr, oo % mr);
            for k0 in (0..k).step_by(KC) {
                let kb = KC.min(k - k0);
                let dst = &mut w[k0 * panels * mr + pi * kb * mr..][..kb * mr];
                for (kk, &v) in row[k0..k0 + kb].iter().enumerate() {
                    dst[kk * mr + r] = v;
                }
            }
        }
        PackedWeight { o, k, mr, w }
    }

    fn panels(&self) -> usize {
        self.o.div_ceil(self.mr)
    }

    /// The packed block of panel `pi` for the `K` block starting at `k0`.
    fn block(&self, k0: usize, pi: usize) -> *const f32 {
        let kb = KC.min(self.k - k0);
        self.w[k0 * self.panels() * self.mr + pi * kb * self.mr..].as_ptr()
    }
}

/// The packed weights of `w` (`[o, c, 1, 1]`, its contiguous values `ws`) for tiles of `mr`
/// rows: cached on the weights' storage when autograd cannot change them (no-grad mode or
/// no `requires_grad`), packed for this call otherwise.
fn packed(w: &Tensor, ws: &[f32], o: usize, k: usize, mr: usize) -> Arc<PackedWeight> {
    const KEY: usize = 0x1b1; // 1x1 convolution panels
    let fresh = || Arc::new(PackedWeight::pack(ws, o, k, mr));
    let cacheable = !crate::autograd::is_grad_enabled() || !w.requires_grad();
    let (Some(st), Some(lay)) = (w.storage(), w.layout()) else { return fresh() };
    if !cacheable || !lay.is_contiguous() {
        return fresh();
    }
    let off = lay.offset();
    let pw = st.derived(&[KEY, off, o, k, mr, KC], |buf| {
        buf.as_slice::<f32>()
            .and_then(|v| v.get(off..off.checked_add(o.checked_mul(k)?)?))
            .map(|ws| PackedWeight::pack(ws, o, k, mr))
            .unwrap_or(PackedWeight { o: 0, k: 0, mr, w: Vec::new() })
    });
    if pw.o == o && pw.k == k && pw.mr == mr && !pw.w.is_empty() {
        pw
    } else {
        fresh()
    }
}

/// The convolution of contiguous `x` `[n, c, h, w]` (values of the tensor `wt`: `ws`,
/// `[o, c, 1, 1]`) into `out` `[n, o, oh, ow]` (every element written), with `ep` applied.
/// `g` must satisfy [`applies`].
#[allow(clippy::too_many_arguments)]
pub(super) fn conv(
    op: &str,
    g: &Geom,
    x: &[f32],
    wt: &Tensor,
    ws: &[f32],
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
) -> crate::error::Result<()> {
    let (p, k, o) = (g.oh * g.ow, g.c, g.o);
    assert!(
        applies(g) && x.len() >= g.n * k * g.h * g.w && ws.len() >= o * k && out.len() >= g.n * o * p,
        "pointwise conv: geometry, CPU or buffer sizes (checked by `applies`)"
    );
    let strided = g.sh != 1 || g.sw != 1;
    if strided {
        // the subsampled copy of one image per worker: refused here, with its size, rather
        // than aborting in a worker
        crate::memory::check_alloc(op, &[k, p], crate::dtype::DType::F32).map_err(|e| {
            crate::error::Error::limit(op, format!("the convolution's work buffer (strided input): {}", e.message()))
        })?;
    }
    let (mr, nv) = (MR, NV);
    let pw = packed(wt, ws, o, k, mr);
    let mut bp = vec![0f32; pw.panels() * mr];
    if let Some(b) = bias {
        bp[..o].copy_from_slice(&b[..o]);
    }
    let unit_in = k * g.h * g.w;
    let unit_out = o * p;
    let ptr = SendPtr(out.as_mut_ptr().cast::<f32>());
    let image = |ni: usize, scratch: &mut Vec<f32>, par: bool| {
        let xi = &x[ni * unit_in..(ni + 1) * unit_in];
        let b: &[f32] = if strided {
            scratch.resize(k * p, 0.0);
            subsample(xi, g, scratch);
            scratch
        } else {
            xi
        };
        // SAFETY: b is [k][p]; out holds image ni's [o][p] block at ni * unit_out, written by
        // this call alone (images are disjoint); AVX-512F is checked by `applies`.
        unsafe { gemm(&pw, nv, b, p, &bp, ptr, ni * unit_out, ep, par) };
    };
    let threads = super::team::threads();
    if threads > 1 && g.n >= threads {
        super::team::ranges(g.n, threads, |r| {
            let mut s = Vec::new();
            for ni in r {
                image(ni, &mut s, false);
            }
        });
    } else {
        let mut s = Vec::new();
        for ni in 0..g.n {
            image(ni, &mut s, true);
        }
    }
    Ok(())
}

/// The strided 1x1 convolution's input: `dst[c][r * ow + j] = x[c][r * sh][j * sw]`.
fn subsample(x: &[f32], g: &Geom, dst: &mut [f32]) {
    let p = g.oh * g.ow;
    for (c, plane) in dst.chunks_exact_mut(p).enumerate() {
        let src = &x[c * g.h * g.w..(c + 1) * g.h * g.w];
        for (r, row) in plane.chunks_exact_mut(g.ow).enumerate() {
            let srow = &src[r * g.sh * g.w..];
            for (j, d) in row.iter_mut().enumerate() {
                *d = srow[j * g.sw];
            }
        }
    }
}

/// One image: `out[base + o*p + j] = epilogue(W @ b)`, split over the pool when `par`.
///
/// # Safety
/// `b` holds `[pw.k][p]`; `out.add(base)` points at `pw.o * p` writable floats no one else
/// accesses; AVX-512F.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm(
    pw: &PackedWeight,
    nv: usize,
    b: &[f32],
    p: usize,
    bias: &[f32],
    out: SendPtr<f32>,
    base: usize,
    ep: Option<&Epilogue<'_>>,
    par: bool,
) {
    let nr = 16 * nv;
    let (tiles, panels) = (p.div_ceil(nr), pw.panels());
    let threads = super::team::threads();
    let work = pw.o * pw.k * p;
    // SAFETY (closures): each task writes the rows of its panels (or the columns of its
    // tiles) of this image's output only; the caller's bounds hold for every range.
    let run = |pr: std::ops::Range<usize>, tr: std::ops::Range<usize>| unsafe {
        range(pw, nv, b, p, bias, out.ptr().add(base), base, pr, tr, ep)
    };
    if par && threads > 1 && work >= 1 << 18 {
        if tiles >= 4 * threads {
            super::team::ranges(tiles, threads, |tr| run(0..panels, tr));
        } else {
            super::team::ranges(panels, threads, |pr| run(pr, 0..tiles));
        }
    } else {
        run(0..panels, 0..tiles);
    }
}

/// Panels `pr` x pixel tiles `tr` of one image (see [`gemm`]); `c` is the image's output,
/// `base` its flat offset in the whole output (the residual's index).
///
/// # Safety
/// As [`gemm`], for the rows of panels `pr` and the columns of tiles `tr`.
#[allow(clippy::too_many_arguments)]
unsafe fn range(
    pw: &PackedWeight,
    nv: usize,
    b: &[f32],
    p: usize,
    bias: &[f32],
    c: *mut f32,
    base: usize,
    pr: std::ops::Range<usize>,
    tr: std::ops::Range<usize>,
    ep: Option<&Epilogue<'_>>,
) {
    let (mr, k, o) = (pw.mr, pw.k, pw.o);
    let nr = 16 * nv;
    let act = ep.map_or(Activation::None, |e| e.act);
    let res = ep.and_then(|e| e.residual).map(|r| &r[base..base + o * p]);
    // the activation applied in registers; the others on the stored rows
    let (reg_act, after) = match act {
        Activation::None | Activation::Relu | Activation::Clamp(..) => (act, None),
        other => (Activation::None, Some(Epilogue { residual: None, act: other })),
    };
    let mut k0 = 0;
    while k0 < k {
        let kb = KC.min(k - k0);
        let (first, last) = (k0 == 0, k0 + kb == k);
        for t in tr.clone() {
            let p0 = t * nr;
            let np = nr.min(p - p0);
            let vecs = np.div_ceil(16);
            let tail = np - 16 * (vecs - 1);
            let mask = if tail == 16 { u16::MAX } else { (1u16 << tail) - 1 };
            let x = b.as_ptr().add(k0 * p + p0);
            for pi in pr.clone() {
                let rows = mr.min(o - pi * mr);
                let cp = c.add(pi * mr * p + p0);
                let rp = if last {
                    res.map_or(std::ptr::null(), |r| r.as_ptr().add(pi * mr * p + p0))
                } else {
                    std::ptr::null()
                };
                let bp = if first { bias.as_ptr().add(pi * mr) } else { std::ptr::null() };
                let a = Args {
                    kb,
                    w: pw.block(k0, pi),
                    x,
                    xs: p,
                    c: cp,
                    cs: p,
                    mask,
                    rows,
                    bias: bp,
                    res: rp,
                    act: if last { reg_act } else { Activation::None },
                };
                #[cfg(target_arch = "x86_64")]
                avx512::tile(mr, vecs, &a);
                if let (true, Some(e)) = (last, after.as_ref()) {
                    for r in 0..rows {
                        let seg = std::slice::from_raw_parts_mut(cp.add(r * p), np);
                        e.apply(seg, 0);
                    }
                }
            }
        }
        k0 += kb;
    }
}

/// One register tile's arguments.
struct Args {
    /// `K` rows of this pass.
    kb: usize,
    /// Packed weights `[kb][MR]`.
    w: *const f32,
    /// `X` at (row k0, column p0), row stride `xs`.
    x: *const f32,
    xs: usize,
    /// Output at (row pi*MR, column p0), row stride `cs`.
    c: *mut f32,
    cs: usize,
    /// Lanes of the last vector.
    mask: u16,
    /// Output rows to store (`<= MR`).
    rows: usize,
    /// `MR` biases to start from (first `K` block), or null: start from the stored output.
    bias: *const f32,
    /// The residual at the output's position (last block, fused add), or null.
    res: *const f32,
    /// Applied in registers (`None`, `Relu` or `Clamp`).
    act: Activation,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Activation, Args};
    use std::arch::x86_64::*;

    /// Dispatches to the `MR x NV` micro-kernel.
    ///
    /// # Safety
    /// AVX-512F; `a` describes valid memory (see [`Args`] and `super::range`).
    pub(super) unsafe fn tile(mr: usize, nv: usize, a: &Args) {
        debug_assert_eq!(mr, super::MR);
        match nv {
            1 => micro::<8, 1>(a),
            2 => micro::<8, 2>(a),
            _ => micro::<8, 3>(a),
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn micro<const MR: usize, const NV: usize>(a: &Args) {
        let m = |v: usize| if v == NV - 1 { a.mask } else { u16::MAX };
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if !a.bias.is_null() {
            for (r, row) in acc.iter_mut().enumerate() {
                *row = [_mm512_set1_ps(*a.bias.add(r)); NV];
            }
        } else {
            for (r, row) in acc.iter_mut().enumerate().take(a.rows) {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(m(v), a.c.add(r * a.cs + 16 * v));
                }
            }
        }
        let (mut xp, mut wp) = (a.x, a.w);
        for _ in 0..a.kb {
            let mut xv = [_mm512_setzero_ps(); NV];
            for (v, x) in xv.iter_mut().enumerate() {
                // masked-off lanes are not read: only the plane's columns are touched
                *x = if v == NV - 1 {
                    _mm512_maskz_loadu_ps(a.mask, xp.add(16 * v))
                } else {
                    _mm512_loadu_ps(xp.add(16 * v))
                };
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let wv = _mm512_set1_ps(*wp.add(r));
                for (x, y) in row.iter_mut().zip(&xv) {
                    *x = _mm512_fmadd_ps(wv, *y, *x);
                }
            }
            // the packed weights are one sequential stream: fetch 16 steps ahead (a hint; it
            // never faults)
            _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(MR * 16) as *const i8);
            xp = xp.add(a.xs);
            wp = wp.add(MR);
        }
        for (r, row) in acc.iter_mut().enumerate().take(a.rows) {
            for (v, x) in row.iter_mut().enumerate() {
                if !a.res.is_null() {
                    *x = _mm512_add_ps(*x, _mm512_maskz_loadu_ps(m(v), a.res.add(r * a.cs + 16 * v)));
                }
                // max(lo, x) then min(hi, x): the scalar clamp's results, NaN kept (the
                // second operand is returned when either is NaN)
                match a.act {
                    Activation::Relu => *x = _mm512_max_ps(_mm512_setzero_ps(), *x),
                    Activation::Clamp(lo, hi) => {
                        *x = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), *x))
                    }
                    _ => {}
                }
                _mm512_mask_storeu_ps(a.c.add(r * a.cs + 16 * v), m(v), *x);
            }
        }
    }
}
