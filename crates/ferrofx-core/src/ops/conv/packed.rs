//! Convolutions as a GEMM over **pre-packed weights** with the epilogue in registers: the
//! float32 inference path of ungrouped 1x1 convolutions (straight on the input) and of the
//! im2col convolutions (strided 1x1, 3x3 stride 2, the stems, 3x3 on small planes).
//!
//! `out[o][p] = act(bias[o] + Σ_k W[o][k] · B[k][p] + residual[o][p])` where `B` is the image
//! itself (`[C, H*W]`, 1x1 stride 1) or its im2col matrix (`[C*KH*KW, OH*OW]`). The weights are
//! packed once into panels of [`MR`] output channels, `[o / MR][k][MR]` (the last panel padded
//! with zero rows), and the packing is cached on the weights' storage
//! ([`crate::storage::Storage::derived`], as the Winograd weights are): a compiled or eager
//! inference run packs each weight on its first call only, and any write to the weights
//! invalidates the packing. `B` is copied per block of 64 pixels into a contiguous `[k][64]`
//! panel that every output-channel panel then reads from L1/L2 (in place, its rows are a whole
//! plane apart: a new page per row, and for planes of a multiple of 4 KiB the same L1 sets).
//!
//! The micro-kernel (AVX-512) holds an `MR x 64` tile of outputs (6 rows of 4 vectors: 24
//! accumulators) in registers: per `k`, four loads of the `B` panel and six broadcasts of `W` feed 24 FMAs. The accumulators start at the bias; after the
//! last `k` the residual is added and ReLU / clamp (ReLU6) applied in registers, and the tile is
//! stored once (masked at the plane's tail). SiLU and hardswish are applied to the stored tile
//! while it is in L1. Threads split the pixel blocks (large planes) or the output-channel panels
//! (small planes such as 7x7 and 14x14), one rayon fork-join per convolution.
//!
//! Taken only where it applies: float32, `groups == 1`, not the shifted-GEMM scheme, weights
//! that autograd cannot change (no-grad mode or no `requires_grad`: inference), and a CPU with
//! AVX-512F; everything else keeps the `gemm` crate path.

use super::epilogue::{Activation, Epilogue};
use super::{fill_im2col, Algo, Geom, SendPtr};
use crate::error::{Error, Result};
use crate::ops::linalg::Par;
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Output channels per register tile (rows of a packed panel).
pub(super) const MR: usize = 6;
/// Pixels per register tile: four vectors of 16 lanes.
const NR: usize = 64;

/// Weights `[o][k]` packed into panels of [`MR`] output channels: `w[(panel * k + kk) * MR + r]
/// = W[panel * MR + r][kk]`, zero for rows past `o`.
pub(super) struct PackedWeight {
    o: usize,
    k: usize,
    w: Vec<f32>,
}

impl PackedWeight {
    /// Packs contiguous `[o][k]` weights.
    pub(super) fn pack(ws: &[f32], o: usize, k: usize) -> PackedWeight {
        let panels = o.div_ceil(MR);
        let mut w = vec![0f32; panels * k * MR];
        for (pi, panel) in w.chunks_exact_mut(k * MR).enumerate() {
            for r in 0..MR.min(o - pi * MR) {
                let row = &ws[(pi * MR + r) * k..(pi * MR + r + 1) * k];
                for (kk, &v) in row.iter().enumerate() {
                    panel[kk * MR + r] = v;
                }
            }
        }
        PackedWeight { o, k, w }
    }
}

/// Whether a forward convolution takes this path on this CPU (see the module docs).
pub(super) fn applies(g: &Geom, algo: Algo) -> bool {
    g.groups == 1 && algo != Algo::Shifted && g.o > 0 && g.oh * g.ow > 0 && avx512()
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The packed weights of `w` (`[o, c, kh, kw]` read as `[o][c*kh*kw]`), cached on its storage;
/// `None` when they are not cacheable (training: autograd may change them between calls) or
/// not contiguous float32.
pub(super) fn cached(w: &Tensor, g: &Geom) -> Option<Arc<PackedWeight>> {
    const KEY: usize = 0x9ac; // packed GEMM panels of MR rows
    let (st, lay) = (w.storage()?, w.layout()?);
    let cacheable = !crate::autograd::is_grad_enabled() || !w.requires_grad();
    if !cacheable || !lay.is_contiguous() {
        return None;
    }
    let k = g.c * g.kh * g.kw;
    let (off, len) = (lay.offset(), g.o.checked_mul(k)?);
    let pw = st.derived(&[KEY, off, g.o, k, MR], |buf| {
        buf.as_slice::<f32>()
            .and_then(|v| v.get(off..off.checked_add(len)?))
            .map(|ws| PackedWeight::pack(ws, g.o, k))
            .unwrap_or(PackedWeight { o: 0, k: 0, w: Vec::new() })
    });
    (pw.o == g.o && pw.k == k && !pw.w.is_empty()).then_some(pw)
}

/// The forward convolution of contiguous `x` `[n, c, h, w]` with packed weights, into `out`
/// (`n * o * oh * ow` elements, all written), with the epilogue `ep`.
pub(super) fn conv(
    op: &str,
    g: &Geom,
    algo: Algo,
    x: &[f32],
    pw: &PackedWeight,
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
) -> Result<()> {
    let p = g.oh * g.ow;
    let k = pw.k;
    let unit_in = g.c * g.h * g.w;
    let unit_out = g.o * p;
    let mut col: Vec<f32> = Vec::new();
    if algo == Algo::Im2col {
        crate::memory::check_alloc(op, &[k, p], crate::dtype::DType::F32).map_err(|e| {
            Error::limit(op, format!("the convolution's work buffer (im2col columns): {}", e.message()))
        })?;
        col = vec![0f32; k * p];
    }
    for (ni, o) in out.chunks_mut(unit_out).enumerate().take(g.n) {
        let xi = &x[ni * unit_in..(ni + 1) * unit_in];
        let b: &[f32] = if algo == Algo::Im2col {
            fill_im2col(xi, g, &mut col, Par::Pool);
            &col
        } else {
            xi
        };
        gemm(pw, b, p, bias, o, ep, ni * unit_out);
    }
    Ok(())
}

/// `out [o][p] = epilogue(W @ b)` for one image: `b` is `[k][p]` contiguous, `out` `[o][p]`
/// (every element written); `base` is `out`'s flat offset in the whole output (the residual's
/// index).
fn gemm(
    pw: &PackedWeight,
    b: &[f32],
    p: usize,
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ep: Option<&Epilogue<'_>>,
    base: usize,
) {
    let (o, k) = (pw.o, pw.k);
    assert!(b.len() >= k * p && out.len() >= o * p && bias.is_none_or(|b| b.len() >= o), "packed conv operands");
    if let Some(r) = ep.and_then(|e| e.residual) {
        assert!(r.len() >= base + o * p, "packed conv residual");
    }
    let panels = o.div_ceil(MR);
    let blocks = p.div_ceil(NR);
    let threads = rayon::current_num_threads();
    let dst = SendPtr(out.as_mut_ptr().cast::<f32>());
    // a rectangle of tiles: panels pa..pb, pixel blocks ba..bb. Each pixel block of B is
    // first copied into a contiguous `[k][NR]` panel (zero past the plane's end): B's rows are
    // a plane apart, which in place would cost a page and often the same L1 sets per row
    let run = |pa: usize, pb: usize, ba: usize, bb: usize| {
        let dst = dst;
        let mut panel = vec![0f32; k * NR];
        for bi in ba..bb {
            let (p0, cols) = (bi * NR, NR.min(p - bi * NR));
            for (kk, row) in panel.chunks_exact_mut(NR).enumerate() {
                row[..cols].copy_from_slice(&b[kk * p + p0..kk * p + p0 + cols]);
                row[cols..].fill(0.0);
            }
            for pi in pa..pb {
                // SAFETY: the asserts above bound every operand; rectangles handed to different
                // tasks are disjoint, so each output element is written by one task only.
                unsafe { tile(pw, &panel, p, bias, dst.ptr(), ep, base, pi, bi) };
            }
        }
    };
    let work = o * p * k;
    if threads <= 1 || rayon::current_thread_index().is_some() || work < 1 << 17 {
        run(0, panels, 0, blocks);
    } else if blocks >= 4 * threads {
        (0..blocks).into_par_iter().for_each(|bi| run(0, panels, bi, bi + 1));
    } else {
        // small planes: split the output channels too, ~4 tasks per thread
        let per = (blocks * panels).div_ceil(4 * threads).div_ceil(blocks).max(1);
        let chunks = panels.div_ceil(per);
        (0..blocks * chunks).into_par_iter().for_each(|t| {
            let (bi, ci) = (t / chunks, t % chunks);
            run(ci * per, ((ci + 1) * per).min(panels), bi, bi + 1)
        });
    }
}

/// One `MR x NR` tile: panel `pi`, pixel block `bi` (whose B panel `[k][NR]` is `b`).
///
/// # Safety
/// `out` must point to `[o][p]` floats, this tile's elements written by no one else meanwhile;
/// `b` must hold `k * NR` floats, `bias` `o` values and the residual `base + o * p` (checked by
/// [`gemm`]).
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    pw: &PackedWeight,
    b: &[f32],
    p: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
    ep: Option<&Epilogue<'_>>,
    base: usize,
    pi: usize,
    bi: usize,
) {
    let (o, k) = (pw.o, pw.k);
    let (o0, p0) = (pi * MR, bi * NR);
    let rows = MR.min(o - o0);
    let cols = NR.min(p - p0);
    let mut bv = [0f32; MR];
    if let Some(bs) = bias {
        bv[..rows].copy_from_slice(&bs[o0..o0 + rows]);
    }
    let act = ep.map(|e| e.act).unwrap_or(Activation::None);
    let res = ep.and_then(|e| e.residual).map(|r| r[base..].as_ptr());
    // activations other than relu/clamp run on the stored tile, with the residual
    let in_regs = matches!(act, Activation::None | Activation::Relu | Activation::Clamp(..));
    let t = Tile {
        w: pw.w.as_ptr().add(pi * k * MR),
        k,
        b: b.as_ptr(),
        ldb: NR,
        out: out.add(o0 * p + p0),
        ldc: p,
        rows,
        cols,
        bias: bv,
        res: if in_regs { res.map(|r| r.add(o0 * p + p0)) } else { None },
        act: if in_regs { act } else { Activation::None },
    };
    #[cfg(target_arch = "x86_64")]
    {
        match cols.div_ceil(16) {
            4 => avx512::tile::<4>(&t),
            3 => avx512::tile::<3>(&t),
            2 => avx512::tile::<2>(&t),
            _ => avx512::tile::<1>(&t),
        }
    }
    if let (false, Some(e)) = (in_regs, ep) {
        for r in 0..rows {
            let seg = std::slice::from_raw_parts_mut(out.add((o0 + r) * p + p0), cols);
            e.apply(seg, base + (o0 + r) * p + p0);
        }
    }
}

/// One tile's operands (pointers at the tile's first element).
struct Tile {
    /// The panel: `[k][MR]`.
    w: *const f32,
    k: usize,
    b: *const f32,
    ldb: usize,
    out: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    bias: [f32; MR],
    res: Option<*const f32>,
    act: Activation,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Tile, MR};
    use crate::ops::conv::epilogue::Activation;
    use std::arch::x86_64::*;

    /// The `MR x 16*NV` tile: `k` rank-1 updates in 24 (or fewer) accumulators, then bias,
    /// residual and activation in registers and one masked store per vector.
    ///
    /// # Safety
    /// AVX-512F; `t`'s pointers cover `k` rows of `ldb` (B), `rows` rows of `ldc` (out,
    /// residual) from the tile's first element, `cols <= 16 * NV` columns.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const NV: usize>(t: &Tile) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for (r, row) in acc.iter_mut().enumerate() {
            let v = _mm512_set1_ps(t.bias[r]);
            for a in row.iter_mut() {
                *a = v;
            }
        }
        // lanes of the last vector inside the plane
        let tail = t.cols - 16 * (NV - 1);
        let last: __mmask16 = if tail >= 16 { 0xffff } else { ((1u32 << tail) - 1) as __mmask16 };
        let mask = |v: usize| if v + 1 == NV { last } else { 0xffff };
        let (mut w, mut b) = (t.w, t.b);
        for _ in 0..t.k {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = if v + 1 == NV {
                    _mm512_maskz_loadu_ps(last, b.add(16 * v))
                } else {
                    _mm512_loadu_ps(b.add(16 * v))
                };
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*w.add(r));
                for (c, x) in row.iter_mut().zip(bv.iter()) {
                    *c = _mm512_fmadd_ps(a, *x, *c);
                }
            }
            w = w.add(MR);
            b = b.add(t.ldb);
        }
        let zero = _mm512_setzero_ps();
        for (r, row) in acc.iter().enumerate().take(t.rows) {
            let dst = t.out.add(r * t.ldc);
            for (v, &c) in row.iter().enumerate() {
                let m = mask(v);
                let mut x = c;
                if let Some(res) = t.res {
                    x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, res.add(r * t.ldc + 16 * v)));
                }
                // max(lo, x) / min(hi, x) keep a NaN x (the unfused ops' formulas)
                match t.act {
                    Activation::Relu => x = _mm512_max_ps(zero, x),
                    Activation::Clamp(lo, hi) => {
                        x = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x))
                    }
                    _ => {}
                }
                _mm512_mask_storeu_ps(dst.add(16 * v), m, x);
            }
        }
    }
}
