//! Winograd F(4x4, 3x3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional Neural
//! Networks", 2016) for 3x3, stride-1, dilation-1, ungrouped float32 convolutions.
//!
//! Each 4x4 block ("tile") of output is computed from the 6x6 input patch under it: the patch is
//! transformed (`V = Bᵀ d B`), multiplied elementwise with the transformed kernel
//! (`U = G g Gᵀ`), summed over input channels, and transformed back (`Y = Aᵀ M A`). The sum over
//! channels of the 36 elementwise products is 36 GEMMs, one per transform point `ξ`, so the
//! multiply count drops from 9 per output and channel pair to 36/16 = 2.25: 4x fewer.
//!
//! Data flow of one call:
//! 1. the input is zero-padded and blocked by 16 channels (`[n][c/16][hp][wp][16]`), so a tile's
//!    patch for 16 channels is 36 aligned 16-float loads;
//! 2. tiles are processed in blocks (parallel work items, each with its own scratch): the input
//!    transform writes `V[ξ][tile][c]`, 36 GEMMs give `M[ξ][tile][o] = Σ_c U[ξ][c][o] V[ξ][tile][c]`
//!    (column-major for the `gemm` crate: output channels are the vectorised dimension), and
//!    the output transform adds the bias and writes the 4x4 outputs of every channel;
//! 3. work items split the output channels too when the tiles alone give too few of them, and
//!    split them first when a layer has more output channels than tiles (see `run_tiles`).
//!
//! The input gradient is the same convolution of the output gradient with the flipped,
//! transposed kernel; the weight gradient ([`conv3x3_grad_weight`]) reuses the input transform
//! and sums `(A ∂Y Aᵀ) ⊙ V` over tiles with 36 GEMMs.
//!
//! The transforms run on `[f32; 16]` lanes (one lane per channel) in functions compiled for
//! AVX-512 or AVX2 when the CPU has them (`simd_dispatch!`). Winograd's results differ from direct convolution by rounding
//! (the points 0, ±1, ±2 keep it small: relative error ~1e-6 here, tested); the switch
//! [`set_enabled`] turns the algorithm off for bit-for-bit comparisons with im2col.

use super::epilogue::{apply_block, Activation};
use super::SendPtr;
use crate::ops::linalg::{MatElem, Par};
use crate::ops::simd::simd_dispatch;
use rayon::prelude::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Channels per lane block.
const L: usize = 16;
type Lanes = [f32; L];

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Enables or disables Winograd convolutions (on by default); returns the previous setting.
/// With it off, every convolution uses the exact im2col/GEMM schemes.
pub fn set_enabled(on: bool) -> bool {
    ENABLED.swap(on, Ordering::SeqCst)
}

/// Whether Winograd convolutions are enabled.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Geometry of one 3x3, stride-1 convolution: input `[n, c, h, w]`, output `[n, o, oh, ow]`,
/// padding `pt` rows on top and `pl` columns on the left (the bottom/right padding is implied by
/// `oh`/`ow`: `oh = h + pt + pb - 2`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geom3 {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub oh: usize,
    pub ow: usize,
    pub pt: usize,
    pub pl: usize,
}

impl Geom3 {
    fn tiles_h(&self) -> usize {
        self.oh.div_ceil(4)
    }
    fn tiles_w(&self) -> usize {
        self.ow.div_ceil(4)
    }
    fn tiles(&self) -> usize {
        self.n * self.tiles_h() * self.tiles_w()
    }
    /// Padded, blocked input plane: `hp x wp` covers every tile's 6x6 patch.
    fn hp(&self) -> usize {
        4 * self.tiles_h() + 2
    }
    fn wp(&self) -> usize {
        4 * self.tiles_w() + 2
    }
}

/// Whether Winograd pays off for this convolution (measured on ResNet layer shapes): enough
/// channels for the GEMMs and enough tiles to amortise the transformed weights, which are 4x
/// the size of the kernel.
pub(crate) fn worthwhile(g: &Geom3) -> bool {
    enabled() && g.c >= L && g.o >= L && g.oh >= 4 && g.ow >= 4 && g.tiles() >= 16
}

// -------------------------------------------------------------------------------------------
// The three transforms, on one row/column of 6 (or 3) lanes.
// -------------------------------------------------------------------------------------------

#[inline(always)]
fn lanes(f: impl Fn(usize) -> f32) -> Lanes {
    let mut v = [0f32; L];
    for (l, x) in v.iter_mut().enumerate() {
        *x = f(l);
    }
    v
}

/// `Bᵀ d` for F(4, 3), lane by lane.
#[inline(always)]
fn bt(d: [&Lanes; 6], o: &mut [Lanes; 6]) {
    let [d0, d1, d2, d3, d4, d5] = d;
    for l in 0..L {
        let (d0, d1, d2, d3, d4, d5) = (d0[l], d1[l], d2[l], d3[l], d4[l], d5[l]);
        o[0][l] = 4.0 * d0 - 5.0 * d2 + d4;
        o[1][l] = -4.0 * (d1 + d2) + d3 + d4;
        o[2][l] = 4.0 * (d1 - d2) - d3 + d4;
        o[3][l] = 2.0 * (d3 - d1) - d2 + d4;
        o[4][l] = 2.0 * (d1 - d3) - d2 + d4;
        o[5][l] = 4.0 * d1 - 5.0 * d3 + d5;
    }
}

/// `G g` for F(4, 3), lane by lane.
#[inline(always)]
fn gk(g: [&Lanes; 3], o: &mut [Lanes; 6]) {
    let [g0, g1, g2] = g;
    for l in 0..L {
        let (g0, g1, g2) = (g0[l], g1[l], g2[l]);
        o[0][l] = g0 * 0.25;
        o[1][l] = (g0 + g1 + g2) * (-1.0 / 6.0);
        o[2][l] = (g0 - g1 + g2) * (-1.0 / 6.0);
        o[3][l] = g0 * (1.0 / 24.0) + g1 * (1.0 / 12.0) + g2 * (1.0 / 6.0);
        o[4][l] = g0 * (1.0 / 24.0) - g1 * (1.0 / 12.0) + g2 * (1.0 / 6.0);
        o[5][l] = g2;
    }
}

/// `Aᵀ m` for F(4, 3), lane by lane.
#[inline(always)]
fn at(m: [&Lanes; 6], o: &mut [Lanes; 4]) {
    let [m0, m1, m2, m3, m4, m5] = m;
    for l in 0..L {
        let (m0, m1, m2, m3, m4, m5) = (m0[l], m1[l], m2[l], m3[l], m4[l], m5[l]);
        let (s12, d12, s34, d34) = (m1 + m2, m1 - m2, m3 + m4, m3 - m4);
        o[0][l] = m0 + s12 + s34;
        o[1][l] = d12 + 2.0 * d34;
        o[2][l] = s12 + 4.0 * s34;
        o[3][l] = d12 + 8.0 * d34 + m5;
    }
}

/// `A d` for F(4, 3) (`A` is `6 x 4`, the transpose of the output transform), lane by lane:
/// the output-gradient transform of the weight gradient.
#[inline(always)]
fn a6(d: [&Lanes; 4], o: &mut [Lanes; 6]) {
    let [d0, d1, d2, d3] = d;
    for l in 0..L {
        let (d0, d1, d2, d3) = (d0[l], d1[l], d2[l], d3[l]);
        let (s02, s13) = (d0 + d2, d1 + d3);
        let (q02, q13) = (d0 + 4.0 * d2, 2.0 * d1 + 8.0 * d3);
        o[0][l] = d0;
        o[1][l] = s02 + s13;
        o[2][l] = s02 - s13;
        o[3][l] = q02 + q13;
        o[4][l] = q02 - q13;
        o[5][l] = d3;
    }
}

/// `Gᵀ u` for F(4, 3) (`Gᵀ` is `3 x 6`), lane by lane: the weight gradient's back-transform.
#[inline(always)]
fn gt(u: [&Lanes; 6], o: &mut [Lanes; 3]) {
    let [u0, u1, u2, u3, u4, u5] = u;
    for l in 0..L {
        let (u0, u1, u2, u3, u4, u5) = (u0[l], u1[l], u2[l], u3[l], u4[l], u5[l]);
        let (s12, d12, s34, d34) = (u1 + u2, u2 - u1, u3 + u4, u3 - u4);
        o[0][l] = u0 * 0.25 - s12 * (1.0 / 6.0) + s34 * (1.0 / 24.0);
        o[1][l] = d12 * (1.0 / 6.0) + d34 * (1.0 / 12.0);
        o[2][l] = (s34 - s12) * (1.0 / 6.0) + u5;
    }
}

// -------------------------------------------------------------------------------------------
// Weights
// -------------------------------------------------------------------------------------------

/// Transforms 3x3 kernels `w` (`[o, c, 3, 3]`) to `U[ξ][a][b]` (36 matrices of `a_len x b_len`).
/// Forward (`flip = false`): `a` = input channel `c`, `b` = output channel `o`, `U = G w[o][c] Gᵀ`.
/// For the input gradient (`flip = true`): `a = o`, `b = c` and the kernel is rotated by 180°,
/// since `∂L/∂x` is the convolution of `∂L/∂y` with the flipped, transposed kernel.
/// (`[ξ][a][b]` rather than `[a][ξ][b]`, which would be written front to back: the GEMMs read
/// `U_ξ` column by column, and a column stride of `36 * b_len` floats costs them TLB misses.)
pub(crate) fn transform_weight(w: &[f32], o: usize, c: usize, flip: bool) -> Vec<f32> {
    let mut u = Vec::new();
    transform_weight_into(w, o, c, flip, &mut u);
    u
}

/// Runs `f` on [`transform_weight`]'s result, computed into this thread's reusable buffer (the
/// transform of a large layer is tens of MB: allocating it per call costs more in page faults
/// than the transform itself).
pub(crate) fn with_transformed_weight<R>(w: &[f32], o: usize, c: usize, flip: bool, f: impl FnOnce(&[f32]) -> R) -> R {
    WEIGHTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut u) => {
            transform_weight_into(w, o, c, flip, &mut u);
            f(&u)
        }
        Err(_) => f(&transform_weight(w, o, c, flip)),
    })
}

fn transform_weight_into(w: &[f32], o: usize, c: usize, flip: bool, u: &mut Vec<f32>) {
    let (a_len, b_len) = if flip { (o, c) } else { (c, o) };
    let plane = a_len * b_len;
    // every element is written below; `resize` only initialises growth
    u.resize(36 * plane, 0.0);
    // Parallel over `a`: each task writes the row `a` of all 36 matrices. Rows of different
    // matrices are interleaved in `u`, so tasks get a raw pointer (disjoint rows, see below).
    let base = SendPtr(u.as_mut_ptr());
    let run = |a: usize| {
        let mut b0 = 0;
        while b0 < b_len {
            let nb = L.min(b_len - b0);
            let mut k9 = [[0f32; L]; 9];
            for lane in 0..nb {
                let b = b0 + lane;
                let (oo, cc) = if flip { (a, b) } else { (b, a) };
                let src = &w[(oo * c + cc) * 9..][..9];
                for (k, row) in k9.iter_mut().enumerate() {
                    row[lane] = if flip { src[8 - k] } else { src[k] };
                }
            }
            let t = kernel_transform(&k9);
            for (xi, v) in t.iter().enumerate() {
                // SAFETY: row `a`, columns b0..b0+nb of matrix xi: inside `u` (36 * plane
                // elements) and written by this task only (tasks own distinct `a`).
                let dst = unsafe { base.ptr().add(xi * plane + a * b_len + b0) };
                if nb == L {
                    // SAFETY: as above, with nb = L (a fixed-size copy, inlined)
                    unsafe { dst.cast::<Lanes>().write_unaligned(*v) };
                } else {
                    // SAFETY: as above
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst, nb) };
                }
            }
            b0 += L;
        }
    };
    if plane >= 1 << 14 && rayon::current_thread_index().is_none() {
        (0..a_len).into_par_iter().for_each(run);
    } else {
        (0..a_len).for_each(run);
    }
}

fn kernel_transform(k9: &[Lanes; 9]) -> [Lanes; 36] {
    let mut out = [[0f32; L]; 36];
    kernel_transform_into(k9, &mut out);
    out
}

simd_dispatch!(
    fn kernel_transform_into(k9: &[Lanes; 9], out: &mut [Lanes; 36]) {
        // columns first: t[i][j] = (G g)[i][j] for each kernel column j
        // columns first: c[j][i] = (G g)[i][j] for each kernel column j, then rows
        let mut c = [[[0f32; L]; 6]; 3];
        for (j, cj) in c.iter_mut().enumerate() {
            gk([&k9[j], &k9[3 + j], &k9[6 + j]], cj);
        }
        let mut row = [[0f32; L]; 6];
        for i in 0..6 {
            gk([&c[0][i], &c[1][i], &c[2][i]], &mut row);
            out[i * 6..i * 6 + 6].copy_from_slice(&row);
        }
    }
);

// -------------------------------------------------------------------------------------------
// Convolution
// -------------------------------------------------------------------------------------------

/// Fills `xb` with `[n][cb][hp][wp][16]` padded planes: zero rows and borders outside the
/// image, and `row(unit, r, mid)` writes the `w * 16` floats of input row `r` of plane `unit`
/// (`image * cb + block`). Every element is written (no clearing pass).
fn pad_planes(g: &Geom3, xb: &mut Vec<f32>, row: impl Fn(usize, usize, &mut [f32]) + Sync) {
    let cbn = g.c.div_ceil(L);
    let (hp, wp) = (g.hp(), g.wp());
    let unit = hp * wp * L;
    xb.resize(g.n * cbn * unit, 0.0);
    let fill = |(u, dst): (usize, &mut [f32])| {
        for (pr, drow) in dst.chunks_mut(wp * L).enumerate() {
            if pr < g.pt || pr >= g.pt + g.h {
                drow.fill(0.0);
                continue;
            }
            // wp = 4 * tiles_w + 2 >= ow + 2 = w + pl + pr, so the row fits
            let (left, rest) = drow.split_at_mut(g.pl * L);
            let (mid, right) = rest.split_at_mut(g.w * L);
            left.fill(0.0);
            right.fill(0.0);
            row(u, pr - g.pt, mid);
        }
    };
    if xb.len() >= 1 << 15 && super::team::parallel() {
        super::team::chunks_mut(xb, unit, |i, c| fill((i, c)));
    } else {
        xb.chunks_mut(unit).enumerate().for_each(fill);
    }
}

/// Pads and blocks the NCHW input into `xb` ([`pad_planes`]), zero for channels past `c`.
fn block_input(x: &[f32], g: &Geom3, xb: &mut Vec<f32>) {
    let cbn = g.c.div_ceil(L);
    pad_planes(g, xb, |u, r, mid| {
        let (ni, cb) = (u / cbn, u % cbn);
        let nc = L.min(g.c - cb * L);
        for lane in 0..L {
            if lane < nc {
                let src = &x[((ni * g.c + cb * L + lane) * g.h + r) * g.w..][..g.w];
                for (col, &v) in src.iter().enumerate() {
                    mid[col * L + lane] = v;
                }
            } else {
                for col in 0..g.w {
                    mid[col * L + lane] = 0.0;
                }
            }
        }
    });
}

/// Pads an NCHW16c input (`[n, c/16, h, w, 16]`) into `xb` ([`pad_planes`]): one copy per row.
fn pad_blocked(x: &[f32], g: &Geom3, xb: &mut Vec<f32>) {
    let row = g.w * L;
    pad_planes(g, xb, |u, r, mid| mid.copy_from_slice(&x[(u * g.h + r) * row..][..row]));
}

simd_dispatch!(
    fn input_tile(xb: &[f32], wp: usize, out: &mut [Lanes; 36]) {
        // xb starts at the patch's top-left corner of one 16-channel block
        const ZERO: Lanes = [0.0; L];
        let ld = |r: usize, k: usize| -> &Lanes { xb[(r * wp + k) * L..].first_chunk::<L>().unwrap_or(&ZERO) };
        // columns first: c[k][i] = (Bᵀ d)[i][k], then rows
        let mut c = [[[0f32; L]; 6]; 6];
        for (k, ck) in c.iter_mut().enumerate() {
            bt([ld(0, k), ld(1, k), ld(2, k), ld(3, k), ld(4, k), ld(5, k)], ck);
        }
        let mut row = [[0f32; L]; 6];
        for i in 0..6 {
            bt([&c[0][i], &c[1][i], &c[2][i], &c[3][i], &c[4][i], &c[5][i]], &mut row);
            out[i * 6..i * 6 + 6].copy_from_slice(&row);
        }
    }
);

simd_dispatch!(
    fn output_tile(m: &[Lanes; 36], bias: &Lanes, out: &mut [Lanes; 16]) {
        // columns first: c[j][r] = (Aᵀ m)[r][j], then rows, then the bias
        let mut c = [[[0f32; L]; 4]; 6];
        for (j, cj) in c.iter_mut().enumerate() {
            at([&m[j], &m[6 + j], &m[12 + j], &m[18 + j], &m[24 + j], &m[30 + j]], cj);
        }
        let mut row = [[0f32; L]; 4];
        for r in 0..4 {
            at([&c[0][r], &c[1][r], &c[2][r], &c[3][r], &c[4][r], &c[5][r]], &mut row);
            for (q, v) in row.iter().enumerate() {
                for l in 0..L {
                    out[r * 4 + q][l] = v[l] + bias[l];
                }
            }
        }
    }
);

simd_dispatch!(
    fn grad_tile(gb: &[f32], wp: usize, out: &mut [Lanes; 36]) {
        // gb starts at the top-left corner of a 4x4 output-gradient tile of one 16-channel block;
        // out = A dY Aᵀ. Columns first: c[k][a] = (A dY)[a][k], then rows.
        const ZERO: Lanes = [0.0; L];
        let ld = |r: usize, k: usize| -> &Lanes { gb[(r * wp + k) * L..].first_chunk::<L>().unwrap_or(&ZERO) };
        let mut c = [[[0f32; L]; 6]; 4];
        for (k, ck) in c.iter_mut().enumerate() {
            a6([ld(0, k), ld(1, k), ld(2, k), ld(3, k)], ck);
        }
        let mut row = [[0f32; L]; 6];
        for a in 0..6 {
            a6([&c[0][a], &c[1][a], &c[2][a], &c[3][a]], &mut row);
            out[a * 6..a * 6 + 6].copy_from_slice(&row);
        }
    }
);

simd_dispatch!(
    fn weight_grad_tile(du: &[Lanes; 36], out: &mut [Lanes; 9]) {
        // out = Gᵀ dU G: rows first, t[a][j] = (dU G)[a][j], then columns
        let mut t = [[[0f32; L]; 3]; 6];
        for (a, ta) in t.iter_mut().enumerate() {
            gt([&du[a * 6], &du[a * 6 + 1], &du[a * 6 + 2], &du[a * 6 + 3], &du[a * 6 + 4], &du[a * 6 + 5]], ta);
        }
        let mut col = [[0f32; L]; 3];
        for j in 0..3 {
            gt([&t[0][j], &t[1][j], &t[2][j], &t[3][j], &t[4][j], &t[5][j]], &mut col);
            for i in 0..3 {
                out[i * 3 + j] = col[i];
            }
        }
    }
);

/// Scratch of one worker, reused across work items and calls (grow-only, per thread).
#[derive(Default)]
struct Scratch {
    v: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    /// The blocked input of the convolution this thread is running.
    static BLOCKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// This thread's transformed weights, when not cached (training).
    static WEIGHTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// This thread's transform buffers for work items.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch, or with a fresh one if it is in use (re-entrancy).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// Runs the convolution: `x` is `[n, c, h, w]` contiguous, `u` the transformed weights from
/// [`transform_weight`] (`[36][c][o]`), `bias` `[o]`. Returns `[n, o, oh, ow]`.
pub(crate) fn conv3x3(x: &[f32], g: &Geom3, u: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let len = g.n * g.o * g.oh * g.ow;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    if len == 0 {
        return out;
    }
    // The tiles cover every (image, channel, row, column) of the output and each work item
    // writes its tiles' elements exactly once, so the output is not zeroed first.
    let dst = SendPtr(out.as_mut_ptr());
    BLOCKED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut xb) => {
            block_input(x, g, &mut xb);
            run_tiles(&xb, g, u, bias, dst, Store::Nchw);
        }
        Err(_) => {
            let mut xb = Vec::new();
            block_input(x, g, &mut xb);
            run_tiles(&xb, g, u, bias, dst, Store::Nchw);
        }
    });
    // SAFETY: run_tiles wrote all `len` elements (see above); capacity is `len`.
    unsafe { out.set_len(len) };
    out
}

/// Where [`run_tiles`] writes its 4x4 output tiles.
#[derive(Clone, Copy)]
enum Store<'a> {
    /// `[n, o, oh, ow]`, bias only.
    Nchw,
    /// NCHW16c, `[n, o/16, oh, ow, 16]`: `act(conv + bias + res)` (`res` in the output's
    /// layout), the channels past `o` `act(0 + res)`.
    Blocked { res: Option<&'a [f32]>, act: Activation },
}

/// [`conv3x3`] in the NCHW16c layout: `x` is `[n, c/16, h, w, 16]`, `out` `[n, o/16, oh, ow,
/// 16]` (every element written) = `act(conv + bias + res)`, `res` (if any) in the output's
/// layout; `u` from [`transform_weight`]. The input's channels past `c` are not read (the
/// GEMMs sum over `c`); the output's are `act(0 + res)`, as `nchwc_conv2d`'s direct kernel
/// writes them.
pub(crate) fn conv3x3_nchwc(
    x: &[f32],
    g: &Geom3,
    u: &[f32],
    bias: Option<&[f32]>,
    res: Option<&[f32]>,
    act: Activation,
    out: &mut [std::mem::MaybeUninit<f32>],
) {
    let total = g.n * g.o.div_ceil(L) * L * g.oh * g.ow;
    assert!(
        x.len() >= g.n * g.c.div_ceil(L) * L * g.h * g.w
            && u.len() >= 36 * g.c * g.o
            && out.len() >= total
            && bias.is_none_or(|b| b.len() >= g.o)
            && res.is_none_or(|r| r.len() >= total),
        "winograd nchwc: buffer sizes (checked by the op)"
    );
    if total == 0 {
        return;
    }
    let dst = SendPtr(out.as_mut_ptr().cast::<f32>());
    let store = Store::Blocked { res, act };
    BLOCKED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut xb) => {
            pad_blocked(x, g, &mut xb);
            run_tiles(&xb, g, u, bias, dst, store);
        }
        Err(_) => {
            let mut xb = Vec::new();
            pad_blocked(x, g, &mut xb);
            run_tiles(&xb, g, u, bias, dst, store);
        }
    });
}

/// Steps 2 and 3 of [`conv3x3`] on the blocked input.
/// `outp` points to the output's (possibly uninitialised) elements, every one of which this
/// writes: `[n, o, oh, ow]` for [`Store::Nchw`], `[n, o/16, oh, ow, 16]` for
/// [`Store::Blocked`].
fn run_tiles(xb: &[f32], g: &Geom3, u: &[f32], bias: Option<&[f32]>, outp: SendPtr<f32>, store: Store<'_>) {
    let (th, tw) = (g.tiles_h(), g.tiles_w());
    let tiles = g.tiles();
    let (cp, cbn) = (g.c.div_ceil(L) * L, g.c.div_ceil(L));
    let threads = super::team::threads();
    // Work items: tile blocks (up to 64 tiles) x output-channel blocks, at least 2 per thread.
    // Every tile block reads all of the transformed weights U (36 * c * o floats) and every
    // channel block transforms its tiles' input again (36 * c floats per tile), so when there
    // are more output channels than tiles (deep layers, U larger than the transformed input)
    // the split is over output channels, with tile blocks as large as allowed; otherwise over
    // tiles first, and over channels too when the tiles alone do not make enough items.
    let mut tb = if g.o > tiles { 64.min(tiles) } else { 64.min(tiles.div_ceil(2 * threads)).max(8).min(tiles) };
    let blocks = tiles.div_ceil(tb);
    let mut ob_len = g.o;
    if blocks < 2 * threads {
        let want = (2 * threads).div_ceil(blocks);
        ob_len = g.o.div_ceil(want).next_multiple_of(L).min(g.o);
    }
    let oblocks = g.o.div_ceil(ob_len);
    tb = tb.min(tiles);
    let items = blocks * oblocks;
    let op = ob_len.next_multiple_of(L);
    let unit_in = cbn * g.hp() * g.wp() * L;
    let (hp, wp) = (g.hp(), g.wp());
    let ohw = g.oh * g.ow;
    let obn = g.o.div_ceil(L);
    let zero: Lanes = [0.0; L];

    let work = |s: &mut Scratch, item: usize| {
        let (bi, obi) = (item / oblocks, item % oblocks);
        let t0 = bi * tb;
        let nt = tb.min(tiles - t0);
        let o0 = obi * ob_len;
        let no = ob_len.min(g.o - o0);
        s.v.resize(36 * tb * cp, 0.0);
        s.m.resize(36 * tb * op, 0.0);
        // 1. input transform: V[ξ][t][c]
        let mut vt = [[0f32; L]; 36];
        for t in 0..nt {
            let tile = t0 + t;
            let (ni, rem) = (tile / (th * tw), tile % (th * tw));
            let (ti, tj) = (rem / tw, rem % tw);
            for cb in 0..cbn {
                let src = &xb[ni * unit_in + ((cb * hp + 4 * ti) * wp + 4 * tj) * L..];
                input_tile(src, wp, &mut vt);
                for (xi, v) in vt.iter().enumerate() {
                    s.v[(xi * tb + t) * cp + cb * L..][..L].copy_from_slice(v);
                }
            }
        }
        // 2. M[ξ][t][o] = Σ_c U[ξ][c][o] V[ξ][t][c]: column-major `no x nt` = (`no x c`) @ (`c x nt`)
        for xi in 0..36 {
            // SAFETY: dst: element (o, t) at xi*tb*op + t*op + o, o < no <= op, t < nt <= tb:
            // inside s.m (36*tb*op) and disjoint from the inputs. a: (o, c) at
            // xi*c*o_all + c*o_all + o0 + o inside u (36*c*o). b: (c, t) at xi*tb*cp + t*cp + c
            // inside s.v (36*tb*cp).
            unsafe {
                f32::gemm(
                    no,
                    nt,
                    g.c,
                    s.m.as_mut_ptr().add(xi * tb * op),
                    1,
                    op as isize,
                    false,
                    u.as_ptr().add(xi * g.c * g.o + o0),
                    1,
                    g.o as isize,
                    s.v.as_ptr().add(xi * tb * cp),
                    1,
                    cp as isize,
                    0.0,
                    1.0,
                    Par::Seq,
                );
            }
        }
        // 3. output transform, bias, store
        let mut mt = [[0f32; L]; 36];
        let mut y = [[0f32; L]; 16];
        for t in 0..nt {
            let tile = t0 + t;
            let (ni, rem) = (tile / (th * tw), tile % (th * tw));
            let (ti, tj) = (rem / tw, rem % tw);
            let rows = 4.min(g.oh - 4 * ti);
            let cols = 4.min(g.ow - 4 * tj);
            let mut ob = 0;
            while ob < no {
                let nl = L.min(no - ob);
                for (xi, dst) in mt.iter_mut().enumerate() {
                    dst.copy_from_slice(&s.m[(xi * tb + t) * op + ob..][..L]);
                }
                let bl: Lanes = match bias {
                    Some(b) => lanes(|l| if l < nl { b[o0 + ob + l] } else { 0.0 }),
                    None => zero,
                };
                output_tile(&mt, &bl, &mut y);
                if let Store::Blocked { res, act } = store {
                    // channels past `o` (the last block's padding): act(0 + residual), as the
                    // direct blocked kernel writes them
                    if nl < L {
                        y.iter_mut().for_each(|v| v[nl..].fill(0.0));
                    }
                    let block = (o0 + ob) / L;
                    for r in 0..rows {
                        let at = (((ni * obn + block) * g.oh + 4 * ti + r) * g.ow + 4 * tj) * L;
                        // SAFETY: pixels (4ti+r, 4tj..4tj+cols) of block `block` of image ni
                        // are inside `out` ([n, o/16, oh, ow, 16]); this work item alone owns
                        // tile `tile` and channels o0..o0+no (o0 is a multiple of 16)
                        let seg = unsafe {
                            let p = outp.ptr().add(at);
                            for (q, v) in y[r * 4..r * 4 + cols].iter().enumerate() {
                                std::ptr::copy_nonoverlapping(v.as_ptr(), p.add(q * L), L);
                            }
                            std::slice::from_raw_parts_mut(p, cols * L)
                        };
                        if res.is_some() || act != Activation::None {
                            apply_block(seg, res.map(|r| &r[at..at + cols * L]), act);
                        }
                    }
                    ob += L;
                    continue;
                }
                #[allow(clippy::needless_range_loop)] // `lane` indexes the inner arrays of `y`
                for lane in 0..nl {
                    let plane = (ni * g.o + o0 + ob + lane) * ohw;
                    for r in 0..rows {
                        let at = plane + (4 * ti + r) * g.ow + 4 * tj;
                        for q in 0..cols {
                            // SAFETY: (image ni, channel o0+ob+lane, row 4ti+r < oh, column
                            // 4tj+q < ow) is inside `out`; this work item owns tile `tile` and
                            // channels o0..o0+no, so no other task writes the element.
                            unsafe { *outp.ptr().add(at + q) = y[r * 4 + q][lane] };
                        }
                    }
                }
                ob += L;
            }
        }
    };
    if threads > 1 && items > 1 {
        super::team::for_each(items, |i| with_scratch(|s| work(s, i)));
    } else {
        with_scratch(|s| (0..items).for_each(|i| work(s, i)));
    }
}

/// Buffers of one weight-gradient call (grow-only, per calling thread).
#[derive(Default)]
struct GradWeightScratch {
    /// Blocked input and blocked output gradient.
    xb: Vec<f32>,
    gb: Vec<f32>,
    /// Transformed input `V[t][ξ][cp]` and output gradient `[t][ξ][op]` of one chunk of tiles.
    v: Vec<f32>,
    dy: Vec<f32>,
    /// The gradient in the transform domain, `dU[ξ][o][cp]`.
    du: Vec<f32>,
}

thread_local! {
    static GRAD_WEIGHT: RefCell<GradWeightScratch> = RefCell::new(GradWeightScratch::default());
}

/// Gradient of the convolution with respect to its 3x3 kernel (`[o, c, 3, 3]`), from the input
/// `x` (`[n, c, h, w]`) and the output gradient `gy` (`[n, o, oh, ow]`), both contiguous.
///
/// The forward output of one tile is `Y = Aᵀ [Σ_c U_oc ⊙ V_c] A` with `U = G w Gᵀ`, so
/// `∂L/∂U_oc = Σ_tiles (A ∂Y_o Aᵀ) ⊙ V_c` and `∂L/∂w_oc = Gᵀ (∂L/∂U_oc) G`. The sum over tiles
/// is 36 GEMMs (`o x c`, inner dimension the tiles), 4x fewer multiplies than im2col's.
///
/// Tiles are processed in chunks small enough for the transformed chunk to stay in cache:
/// both transforms run in parallel over the chunk's tiles, then the 36 GEMMs in parallel
/// (one per transform point), accumulating into `dU`; the back-transform comes last.
pub(crate) fn conv3x3_grad_weight(x: &[f32], gy: &[f32], g: &Geom3) -> Vec<f32> {
    GRAD_WEIGHT.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => grad_weight_with(x, gy, g, &mut s),
        Err(_) => grad_weight_with(x, gy, g, &mut GradWeightScratch::default()),
    })
}

fn grad_weight_with(x: &[f32], gy: &[f32], g: &Geom3, s: &mut GradWeightScratch) -> Vec<f32> {
    let (th, tw) = (g.tiles_h(), g.tiles_w());
    let tiles = g.tiles();
    let (cbn, obn) = (g.c.div_ceil(L), g.o.div_ceil(L));
    let (cp, op) = (cbn * L, obn * L);
    let mut gw = vec![0f32; g.o * g.c * 9];
    if tiles == 0 || gw.is_empty() {
        return gw;
    }
    // The output gradient, blocked like an input with no padding: its 4x4 tiles are exactly
    // the forward's output tiles, zero past the output's edge.
    let gg = Geom3 { n: g.n, c: g.o, h: g.oh, w: g.ow, o: 0, oh: g.oh, ow: g.ow, pt: 0, pl: 0 };
    block_input(x, g, &mut s.xb);
    block_input(gy, &gg, &mut s.gb);
    let (hp, wp) = (g.hp(), g.wp());
    let (unit_x, unit_g) = (cbn * hp * wp * L, obn * hp * wp * L);
    // ~4 MB of transformed tiles per chunk, but at least 64 tiles and at least o*c/(o+c): each
    // chunk's GEMMs read and write all of dU (36 * o * c floats), which should not outweigh
    // the chunk's transformed tiles (36 * chunk * (c + o)).
    let chunk = (4usize << 20).div_ceil(36 * 4 * (cp + op)).max(64).max(g.o * g.c / (g.o + g.c)).min(tiles);
    let (vrow, grow) = (36 * cp, 36 * op);
    s.v.resize(chunk * vrow, 0.0);
    s.dy.resize(chunk * grow, 0.0);
    s.du.resize(36 * g.o * cp, 0.0);
    let parallel = rayon::current_thread_index().is_none() && rayon::current_num_threads() > 1;
    let (xb, gb) = (&s.xb[..], &s.gb[..]);
    let mut t0 = 0;
    while t0 < tiles {
        let nt = chunk.min(tiles - t0);
        // 1. transforms of this chunk's tiles: V[t][ξ][c] and (A dY Aᵀ)[t][ξ][o]
        let transform = |(t, (vt, gt)): (usize, (&mut [f32], &mut [f32]))| {
            let tile = t0 + t;
            let (ni, rem) = (tile / (th * tw), tile % (th * tw));
            let (ti, tj) = (rem / tw, rem % tw);
            let mut out = [[0f32; L]; 36];
            for cb in 0..cbn {
                input_tile(&xb[ni * unit_x + ((cb * hp + 4 * ti) * wp + 4 * tj) * L..], wp, &mut out);
                for (xi, v) in out.iter().enumerate() {
                    vt[xi * cp + cb * L..][..L].copy_from_slice(v);
                }
            }
            for ob in 0..obn {
                grad_tile(&gb[ni * unit_g + ((ob * hp + 4 * ti) * wp + 4 * tj) * L..], wp, &mut out);
                for (xi, v) in out.iter().enumerate() {
                    gt[xi * op + ob * L..][..L].copy_from_slice(v);
                }
            }
        };
        let (vc, dyc) = (&mut s.v[..nt * vrow], &mut s.dy[..nt * grow]);
        if parallel {
            vc.par_chunks_mut(vrow).zip(dyc.par_chunks_mut(grow)).enumerate().with_min_len(4).for_each(transform);
        } else {
            vc.chunks_mut(vrow).zip(dyc.chunks_mut(grow)).enumerate().for_each(transform);
        }
        // 2. dU[ξ] (+)= Σ_t dY[t][ξ]ᵀ V[t][ξ]: `o x c` = (`o x nt`) @ (`nt x c`)
        let (v, dy) = (&s.v[..], &s.dy[..]);
        let first = t0 == 0;
        let gemm = |(xi, du): (usize, &mut [f32])| {
            // SAFETY: dst: (o, c) at o*cp + c, o < g.o, c < g.c: inside du (g.o*cp), disjoint
            // from the inputs. a: (o, t) at t*36*op + xi*op + o inside dy (chunk*36*op).
            // b: (t, c) at t*36*cp + xi*cp + c inside v (chunk*36*cp).
            unsafe {
                f32::gemm(
                    g.o,
                    g.c,
                    nt,
                    du.as_mut_ptr(),
                    cp as isize,
                    1,
                    !first,
                    dy.as_ptr().add(xi * op),
                    1,
                    grow as isize,
                    v.as_ptr().add(xi * cp),
                    vrow as isize,
                    1,
                    1.0,
                    1.0,
                    Par::Seq,
                );
            }
        };
        if parallel {
            s.du.par_chunks_mut(g.o * cp).enumerate().for_each(gemm);
        } else {
            s.du.chunks_mut(g.o * cp).enumerate().for_each(gemm);
        }
        t0 += nt;
    }
    // 3. back-transform: gw[o][c] = Gᵀ dU[·][o][c] G, 16 input channels at a time
    let du = &s.du[..];
    let plane = g.o * cp;
    let back = |(o, gwo): (usize, &mut [f32])| {
        let mut dut = [[0f32; L]; 36];
        let mut k = [[0f32; L]; 9];
        for cb in 0..cbn {
            for (xi, d) in dut.iter_mut().enumerate() {
                d.copy_from_slice(&du[xi * plane + o * cp + cb * L..][..L]);
            }
            weight_grad_tile(&dut, &mut k);
            for lane in 0..L.min(g.c - cb * L) {
                let dst = &mut gwo[(cb * L + lane) * 9..][..9];
                for (d, kk) in dst.iter_mut().zip(&k) {
                    *d = kk[lane];
                }
            }
        }
    };
    if parallel && g.o * g.c >= 1 << 12 {
        gw.par_chunks_mut(g.c * 9).enumerate().for_each(back);
    } else {
        gw.chunks_mut(g.c * 9).enumerate().for_each(back);
    }
    gw
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(x: &[f32], w: &[f32], b: Option<&[f32]>, g: &Geom3) -> Vec<f32> {
        let mut out = vec![0f32; g.n * g.o * g.oh * g.ow];
        for ni in 0..g.n {
            for o in 0..g.o {
                for y in 0..g.oh {
                    for xx in 0..g.ow {
                        let mut acc = b.map(|b| b[o] as f64).unwrap_or(0.0);
                        for c in 0..g.c {
                            for i in 0..3 {
                                for j in 0..3 {
                                    let (iy, ix) = (
                                        y as isize + i as isize - g.pt as isize,
                                        xx as isize + j as isize - g.pl as isize,
                                    );
                                    if iy >= 0 && ix >= 0 && (iy as usize) < g.h && (ix as usize) < g.w {
                                        acc += x[((ni * g.c + c) * g.h + iy as usize) * g.w + ix as usize] as f64
                                            * w[((o * g.c + c) * 3 + i) * 3 + j] as f64;
                                    }
                                }
                            }
                        }
                        out[((ni * g.o + o) * g.oh + y) * g.ow + xx] = acc as f32;
                    }
                }
            }
        }
        out
    }

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// `∂L/∂w` of [`direct`] for the output gradient `gy`, in f64.
    fn direct_grad_weight(x: &[f32], gy: &[f32], g: &Geom3) -> Vec<f32> {
        let mut gw = vec![0f64; g.o * g.c * 9];
        for ni in 0..g.n {
            for o in 0..g.o {
                for y in 0..g.oh {
                    for xx in 0..g.ow {
                        let d = gy[((ni * g.o + o) * g.oh + y) * g.ow + xx] as f64;
                        for c in 0..g.c {
                            for i in 0..3 {
                                for j in 0..3 {
                                    let (iy, ix) = (
                                        y as isize + i as isize - g.pt as isize,
                                        xx as isize + j as isize - g.pl as isize,
                                    );
                                    if iy >= 0 && ix >= 0 && (iy as usize) < g.h && (ix as usize) < g.w {
                                        gw[((o * g.c + c) * 3 + i) * 3 + j] +=
                                            d * x[((ni * g.c + c) * g.h + iy as usize) * g.w + ix as usize] as f64;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        gw.into_iter().map(|v| v as f32).collect()
    }

    /// Channels not multiples of 16, sizes not multiples of 4 (partial tiles), asymmetric
    /// padding, then `extra` (`(n, c, h, w, o, pt, pb, pl, pr)`).
    fn odd_shapes(extra: (usize, usize, usize, usize, usize, usize, usize, usize, usize)) -> Vec<Geom3> {
        [
            (1, 3, 5, 7, 5, 1, 1, 1, 1),
            (2, 17, 9, 6, 33, 1, 1, 1, 1),
            (1, 16, 4, 4, 16, 0, 0, 0, 0),
            (3, 20, 11, 13, 18, 2, 0, 0, 2),
            extra,
        ]
        .into_iter()
        .map(|(n, c, h, w, o, pt, pb, pl, pr)| Geom3 {
            n,
            c,
            h,
            w,
            o,
            oh: h + pt + pb - 2,
            ow: w + pl + pr - 2,
            pt,
            pl,
        })
        .collect()
    }

    #[test]
    fn weight_gradient_matches_direct_on_odd_shapes() {
        // the extra shape has 3 * 12 * 12 = 432 tiles: several chunks
        for g in odd_shapes((3, 24, 46, 45, 40, 1, 1, 1, 1)) {
            let (n, c, h, w, o) = (g.n, g.c, g.h, g.w, g.o);
            let x = rand_vec(n * c * h * w, 4);
            let gy = rand_vec(n * o * g.oh * g.ow, 5);
            let want = direct_grad_weight(&x, &gy, &g);
            let got = conv3x3_grad_weight(&x, &gy, &g);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-5 * scale, "{g:?}: max error {worst} (largest gradient {scale})");
        }
    }

    #[test]
    fn matches_direct_convolution_on_odd_shapes() {
        // the extra shape has padding larger than the kernel's reach
        for g in odd_shapes((1, 5, 3, 3, 7, 3, 3, 3, 3)) {
            let (n, c, h, w, o) = (g.n, g.c, g.h, g.w, g.o);
            let x = rand_vec(n * c * h * w, 1);
            let wt = rand_vec(o * c * 9, 2);
            let b = rand_vec(o, 3);
            let want = direct(&x, &wt, Some(&b), &g);
            let got = conv3x3(&x, &g, &transform_weight(&wt, o, c, false), Some(&b));
            let worst = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 2e-5 * (c as f32 * 9.0).sqrt(), "{g:?}: max error {worst}");
        }
    }
}
