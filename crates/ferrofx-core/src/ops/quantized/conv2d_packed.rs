//! The fast path of `quantized_conv2d`: a direct convolution on a packed input, with
//! pre-packed weights and register-blocked AVX-512 VNNI / AVX2 micro-kernels. No im2col.
//!
//! **Input packing** (per image, O(input) work): the zero-point-padded input is split into its
//! `stride_h x stride_w` phases (phase `(a, b)` holds padded rows `a, a + sh, ...` and columns
//! `b, b + sw, ...`) and each phase is stored as `[groups * ceil(C_g / 4)][lp][4]`: four
//! channels interleaved per pixel (channels past `C_g` hold the zero point; their weights are
//! 0), planes `lp` pixels long (`hs * wq` plus a slack row). In a phase every kernel tap
//! `(ki, kj)` of every stride and dilation is a plain shift of the flat pixel index
//! (`(ki * dh / sh) * wq + kj * dw / sw` in phase `(ki * dh % sh, kj * dw % sw)`), so the output
//! pixels `q = oh * wq + ow` of a tile read one contiguous run of 4-byte pixels per tap and
//! channel quad: the GEMM operand is read in place. Columns `ow >= OW` of the flat index
//! (the padding, at most `(wq - OW) / wq` of the work) are computed and not stored.
//!
//! **Weights** are packed once per weight tensor as `[OC][quads * kH * kW]` words of four int8
//! channels (zero-padded), with their row sums, and cached on the weight's storage
//! (`Storage::derived`: any write to the weights invalidates it).
//!
//! **Micro-kernels**: an output tile is `MR` output channels x `NV` vectors of pixels. Per
//! (quad, tap) the kernel loads `NV` pixel vectors and broadcasts one weight word per channel;
//! AVX-512 VNNI: `vpdpbusd` of 16 pixels x 4 channels (8 x 3 tile: 24 accumulators, 48
//! pixels); AVX2: the u8 and s8 bytes widened to i16 in registers and `vpmaddwd` (exact), 8
//! pixels per vector, 4 x 2 tile. The requantisation is vectorised over the pixels of a
//! channel (same f32 operations in the same order as `Requant::apply` in `gemm.rs`, NaN and
//! out-of-range values handled as the scalar cast does), so the result is bit-identical to the
//! reference (im2col + scalar GEMM), whose i32 sums hold the same terms.
//!
//! **Threads**: work items are (image, block of output channels); with one image the channels
//! are split in `>= 4 x threads` blocks so both cores work at batch 1.

use super::conv2d::Geom;
use super::gemm::{Path, RequantParams};
use crate::error::{Error, Result};

use std::mem::MaybeUninit;

const OP: &str = "quantized_conv2d";

/// Weights packed for the micro-kernels, with their row sums.
pub(super) struct PackedWeight {
    /// Words per output channel: `ceil(C_g / 4) * kH * kW`.
    pub(super) kq: usize,
    /// `[OC][kq]` little-endian words of four int8 weights (channels `4q..4q+4`, 0 past `C_g`),
    /// word `t = (quad * kH + ki) * kW + kj`; with `lanes`, the same words in the channel
    /// panels of `conv2d_lanes.rs` (`[OC / 64][kq][64]`).
    pub(super) w: Vec<i32>,
    /// `sum` of each output channel's int8 weights.
    pub(super) sums: Vec<i32>,
    /// Whether `w` is in the channels-in-lanes panel layout.
    pub(super) lanes: bool,
}

impl PackedWeight {
    /// Packs `w` (`[OC][C_g][kH][kW]`, contiguous), in the channel panels of the
    /// channels-in-lanes tile when `lanes`.
    pub(super) fn new(w: &[i8], g: &Geom, lanes: bool) -> PackedWeight {
        let (cg, kh, kw) = (g.cg(), g.kh, g.kw);
        let quads = cg.div_ceil(4);
        let kq = quads * kh * kw;
        let row = cg * kh * kw;
        let mut packed = vec![0i32; g.oc * kq];
        let mut sums = vec![0i32; g.oc];
        for (j, (dst, sum)) in packed.chunks_mut(kq.max(1)).zip(sums.iter_mut()).enumerate() {
            let src = &w[j * row..(j + 1) * row];
            *sum = src.iter().map(|&v| v as i32).sum();
            for q in 0..quads {
                for ki in 0..kh {
                    for kj in 0..kw {
                        let mut bytes = [0u8; 4];
                        for (e, b) in bytes.iter_mut().enumerate() {
                            let c = q * 4 + e;
                            if c < cg {
                                *b = src[(c * kh + ki) * kw + kj] as u8;
                            }
                        }
                        dst[(q * kh + ki) * kw + kj] = i32::from_le_bytes(bytes);
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        let packed = if lanes { super::conv2d_lanes::panels(&packed, g.oc, kq) } else { packed };
        PackedWeight { kq, w: packed, sums, lanes }
    }
}

/// The stride phases of a convolution's zero-padded input and where each kernel tap reads in
/// them (shared by the VNNI and AMX packings).
pub(super) struct Phases {
    /// Rows and row length of a phase.
    pub(super) hs: usize,
    pub(super) wq: usize,
    /// Phases in use, as `(row phase, column phase)`.
    pub(super) phases: Vec<(usize, usize)>,
    /// Per tap `(ki, kj)` in row-major order: its phase's index and its flat pixel shift.
    pub(super) taps: Vec<(usize, usize)>,
}

impl Phases {
    pub(super) fn new(g: &Geom) -> Result<Phases> {
        let (sh, sw) = (g.stride[0], g.stride[1]);
        let hp = g.h.checked_add(2 * g.pad[0]).ok_or_else(overflow)?;
        let wp = g.w.checked_add(2 * g.pad[1]).ok_or_else(overflow)?;
        let (hs, wq) = (hp.div_ceil(sh), wp.div_ceil(sw));
        let mut phases: Vec<(usize, usize)> = Vec::new();
        let mut taps = Vec::with_capacity(g.kh * g.kw);
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let (ri, cj) = (ki * g.dil[0], kj * g.dil[1]);
                let ph = (ri % sh, cj % sw);
                let idx = match phases.iter().position(|&p| p == ph) {
                    Some(i) => i,
                    None => {
                        phases.push(ph);
                        phases.len() - 1
                    }
                };
                taps.push((idx, (ri / sh) * wq + cj / sw));
            }
        }
        Ok(Phases { hs, wq, phases, taps })
    }

    /// The columns `ws_lo..ws_hi` of phase column `b` whose padded column `ws * sw + b` is
    /// inside the image.
    pub(super) fn columns(g: &Geom, wq: usize, b: usize) -> (usize, usize) {
        let (sw, pw) = (g.stride[1], g.pad[1]);
        let ws_lo = pw.saturating_sub(b).div_ceil(sw);
        let ws_hi = if g.w + pw > b { (g.w + pw - b).div_ceil(sw).min(wq) } else { 0 };
        (ws_lo, ws_hi)
    }
}

/// The packed input's geometry and the per-word read offsets.
pub(super) struct Plan {
    /// Phases in use, as `(row phase, column phase)`.
    phases: Vec<(usize, usize)>,
    /// Channel quads per group.
    quads: usize,
    /// Rows and row length of a phase.
    hs: usize,
    pub(super) wq: usize,
    /// Pixels per plane (`hs * wq` plus slack for the last tile's over-read).
    lp: usize,
    /// Byte offset of each weight word's operand from the group's base (`kq` of them).
    pub(super) aoff: Vec<usize>,
    /// Bytes of one image's packed input, and of one group's planes within a phase.
    pub(super) image_bytes: usize,
    group_bytes: usize,
}

fn overflow() -> Error {
    Error::limit(OP, "the packed input of this convolution does not fit in memory (size overflows usize)")
}

impl Plan {
    fn new(g: &Geom) -> Result<Plan> {
        let Phases { hs, wq, phases, taps } = Phases::new(g)?;
        let lp = hs.checked_mul(wq).and_then(|v| v.checked_add(wq + 16)).ok_or_else(overflow)?;
        let quads = g.cg().div_ceil(4);
        let planes_per_phase = g.groups.checked_mul(quads).ok_or_else(overflow)?;
        let plane_bytes = lp.checked_mul(4).ok_or_else(overflow)?;
        let group_bytes = quads.checked_mul(plane_bytes).ok_or_else(overflow)?;
        let image_bytes =
            phases.len().checked_mul(planes_per_phase).and_then(|v| v.checked_mul(plane_bytes)).ok_or_else(overflow)?;
        let mut aoff = Vec::with_capacity(quads * taps.len());
        for q in 0..quads {
            for &(phase, shift) in &taps {
                aoff.push(((phase * planes_per_phase + q) * lp + shift) * 4);
            }
        }
        Ok(Plan { phases, quads, hs, wq, lp, aoff, image_bytes, group_bytes })
    }
}

/// Packs one image (`C x H x W` bytes, or `H x W x C` when `nhwc`) into `dst`
/// (`plan.image_bytes`).
fn pack_image(g: &Geom, plan: &Plan, x: &[u8], nhwc: bool, zp: u8, dst: &mut [u8]) {
    let plane_bytes = plan.lp * 4;
    let planes_per_phase = g.groups * plan.quads;
    crate::ops::team::chunks_mut(dst, plane_bytes, |i, plane| {
        let (phase, rest) = (i / planes_per_phase, i % planes_per_phase);
        let (gi, q) = (rest / plan.quads, rest % plan.quads);
        if nhwc {
            pack_plane_nhwc(g, plan, plan.phases[phase], x, gi * g.cg(), q, zp, plane);
        } else {
            pack_plane(g, plan, plan.phases[phase], x, gi * g.cg(), q, zp, plane);
        }
    });
}

/// The columns `ws_lo..ws_hi` of phase column `b` whose padded column `ws * sw + b` is inside
/// the image.
fn phase_columns(g: &Geom, plan: &Plan, b: usize) -> (usize, usize) {
    Phases::columns(g, plan.wq, b)
}

/// [`pack_plane`] from a channels-last image (`H x W x C` bytes): each packed pixel is the one
/// 4-byte word of channels `c0 + 4q..+4` of its input pixel.
#[allow(clippy::too_many_arguments)]
fn pack_plane_nhwc(
    g: &Geom,
    plan: &Plan,
    (a, b): (usize, usize),
    x: &[u8],
    c0: usize,
    q: usize,
    zp: u8,
    plane: &mut [u8],
) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.pad[0], g.pad[1]);
    let (ws_lo, ws_hi) = phase_columns(g, plan, b);
    if ws_lo >= ws_hi {
        plane.fill(zp);
        return;
    }
    // channels of the quad inside the group (the rest hold the zero point; their weights are 0)
    let real = g.cg().saturating_sub(4 * q).min(4);
    let mut filled = 0;
    for hs in 0..plan.hs {
        let hpad = hs * sh + a;
        if hpad < ph || hpad - ph >= g.h {
            continue;
        }
        let ih = hpad - ph;
        let (s, e) = ((hs * plan.wq + ws_lo) * 4, (hs * plan.wq + ws_hi) * 4);
        plane[filled..s].fill(zp);
        filled = e;
        let base = (ih * g.w + ws_lo * sw + b - pw) * g.c + c0 + 4 * q;
        let step = sw * g.c;
        let out = &mut plane[s..e];
        if real == 4 {
            for (k, px) in out.chunks_exact_mut(4).enumerate() {
                let i = base + k * step;
                px.copy_from_slice(&x[i..i + 4]);
            }
        } else {
            for (k, px) in out.chunks_exact_mut(4).enumerate() {
                let i = base + k * step;
                px[..real].copy_from_slice(&x[i..i + real]);
                px[real..].fill(zp);
            }
        }
    }
    plane[filled..].fill(zp);
}

/// One plane: channels `c0 + 4q ..+4` of phase `(a, b)`.
#[allow(clippy::too_many_arguments)]
fn pack_plane(g: &Geom, plan: &Plan, (a, b): (usize, usize), x: &[u8], c0: usize, q: usize, zp: u8, plane: &mut [u8]) {
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.pad[0], g.pad[1]);
    let hw = g.h * g.w;
    let (ws_lo, ws_hi) = phase_columns(g, plan, b);
    if ws_lo >= ws_hi {
        plane.fill(zp);
        return;
    }
    let pad_row = vec![zp; g.w];
    // the bytes before `filled` are written: everything between the image's runs (padding
    // rows and columns, the slack) gets the zero point, each byte once
    let mut filled = 0;
    for hs in 0..plan.hs {
        let hpad = hs * sh + a;
        if hpad < ph || hpad - ph >= g.h {
            continue;
        }
        let ih = hpad - ph;
        let rows: [&[u8]; 4] = std::array::from_fn(|e| {
            let c = q * 4 + e;
            if c < g.cg() {
                &x[(c0 + c) * hw + ih * g.w..(c0 + c) * hw + (ih + 1) * g.w]
            } else {
                &pad_row[..]
            }
        });
        let (s, e) = ((hs * plan.wq + ws_lo) * 4, (hs * plan.wq + ws_hi) * 4);
        plane[filled..s].fill(zp);
        filled = e;
        let out = &mut plane[s..e];
        let iw0 = ws_lo * sw + b - pw;
        if sw == 1 {
            interleave4(&rows, iw0, out);
        } else if sw == 2 {
            // the phase's columns gathered per channel row (vectorised), then interleaved
            let n = out.len() / 4;
            let mut tmp = [[0u8; 64]; 4];
            let mut k0 = 0;
            while k0 < n {
                let m = (n - k0).min(64);
                for (t, row) in tmp.iter_mut().zip(&rows) {
                    gather2(row, iw0 + 2 * k0, &mut t[..m]);
                }
                let t: [&[u8]; 4] = std::array::from_fn(|e| &tmp[e][..m]);
                interleave4(&t, 0, &mut out[4 * k0..4 * (k0 + m)]);
                k0 += m;
            }
        } else {
            for (k, px) in out.chunks_exact_mut(4).enumerate() {
                let iw = iw0 + k * sw;
                px.copy_from_slice(&[rows[0][iw], rows[1][iw], rows[2][iw], rows[3][iw]]);
            }
        }
    }
    plane[filled..].fill(zp);
}

/// `dst[k] = src[start + 2k]` (the columns of one stride-2 phase).
fn gather2(src: &[u8], start: usize, dst: &mut [u8]) {
    let n = dst.len();
    let mut k = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        while k + 16 <= n && start + 2 * k + 32 <= src.len() {
            // SAFETY: SSE2 is part of x86-64; the loads read `src[start + 2k..start + 2k + 32]`
            // and the store writes `dst[k..k + 16]`, both in bounds (loop condition).
            unsafe {
                let p = src.as_ptr().add(start + 2 * k);
                let even = _mm_set1_epi16(0xff);
                let lo = _mm_and_si128(_mm_loadu_si128(p as *const __m128i), even);
                let hi = _mm_and_si128(_mm_loadu_si128(p.add(16) as *const __m128i), even);
                _mm_storeu_si128(dst.as_mut_ptr().add(k) as *mut __m128i, _mm_packus_epi16(lo, hi));
            }
            k += 16;
        }
    }
    for (kk, d) in dst.iter_mut().enumerate().skip(k) {
        *d = src[start + 2 * kk];
    }
}

/// `out[4i + e] = rows[e][iw0 + i]` (four channel rows interleaved per pixel).
fn interleave4(rows: &[&[u8]; 4], iw0: usize, out: &mut [u8]) {
    let n = out.len() / 4;
    let r: [&[u8]; 4] = std::array::from_fn(|e| &rows[e][iw0..iw0 + n]);
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        while i + 16 <= n {
            // SAFETY: SSE2 is part of x86-64; the 16-byte loads read `r[e][i..i + 16]` and the
            // stores write `out[4i..4i + 64]`, both in bounds (`i + 16 <= n`).
            unsafe {
                let l = |e: usize| _mm_loadu_si128(r[e].as_ptr().add(i) as *const __m128i);
                let (c0, c1, c2, c3) = (l(0), l(1), l(2), l(3));
                let (t0, t1) = (_mm_unpacklo_epi8(c0, c1), _mm_unpackhi_epi8(c0, c1));
                let (t2, t3) = (_mm_unpacklo_epi8(c2, c3), _mm_unpackhi_epi8(c2, c3));
                let o = out.as_mut_ptr().add(4 * i) as *mut __m128i;
                _mm_storeu_si128(o, _mm_unpacklo_epi16(t0, t2));
                _mm_storeu_si128(o.add(1), _mm_unpackhi_epi16(t0, t2));
                _mm_storeu_si128(o.add(2), _mm_unpacklo_epi16(t1, t3));
                _mm_storeu_si128(o.add(3), _mm_unpackhi_epi16(t1, t3));
            }
            i += 16;
        }
    }
    for k in i..n {
        out[4 * k..4 * k + 4].copy_from_slice(&[r[0][k], r[1][k], r[2][k], r[3][k]]);
    }
}

/// Where a tile's requantised bytes go: channel `j`'s `[OH][OW]` plane of the image output,
/// from flat pixels `q = oh * wq + ow`.
struct Sink {
    out: *mut u8,
    /// `OH * OW`, `OW`, the flat row length and the number of flat pixels `OH * wq`.
    p: usize,
    ow: usize,
    wq: usize,
    qtot: usize,
}

impl Sink {
    /// The runs of lanes `l` (flat pixels `qs + l`, `l < lanes`) that are real outputs, as
    /// `(first lane, end lane, output index of the first lane)`.
    #[inline(always)]
    fn runs(&self, qs: usize, lanes: usize, mut f: impl FnMut(usize, usize, usize)) {
        let end = (qs + lanes).min(self.qtot);
        let mut row = qs / self.wq;
        loop {
            let rs = row * self.wq;
            if rs >= end {
                break;
            }
            let (lo, hi) = (rs.max(qs), (rs + self.ow).min(end));
            if hi > lo {
                f(lo - qs, hi - qs, row * self.ow + (lo - rs));
            }
            row += 1;
        }
    }

    /// Stores `vals` (lane `l` = flat pixel `qs + l`) of channel `j` (scalar copy per run).
    #[inline(always)]
    fn store(&self, j: usize, qs: usize, vals: &[u8]) {
        self.runs(qs, vals.len(), |lo, hi, o| {
            // SAFETY: `o + (hi - lo) <= p` (the run is inside row `o / OW`), `j < OC` of this
            // image's output, which the caller's slice holds.
            unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr().add(lo), self.out.add(j * self.p + o), hi - lo) };
        });
    }
}

/// Output channels per register tile, and vectors of pixels per tile, of each path.
#[cfg(target_arch = "x86_64")]
const VNNI_MR: usize = 8;
#[cfg(target_arch = "x86_64")]
const VNNI_NV: usize = 3;
#[cfg(target_arch = "x86_64")]
const AVX2_MR: usize = 4;
#[cfg(target_arch = "x86_64")]
const AVX2_NV: usize = 2;

/// Output channels `j0..j1` (one group) of one image.
#[allow(clippy::too_many_arguments)]
fn conv_block(
    path: Path,
    g: &Geom,
    plan: &Plan,
    xp: &[u8],
    pw: &PackedWeight,
    rq: &RequantParams,
    j0: usize,
    j1: usize,
    out: &mut [u8],
) {
    let gi = j0 / g.ocg();
    let a = &xp[gi * plan.group_bytes..];
    let sink = Sink { out: out.as_mut_ptr(), p: g.p(), ow: g.ow, wq: plan.wq, qtot: g.oh * plan.wq };
    // every read of the kernels stays inside this image's planes (see the module docs)
    assert!(out.len() >= (j1 - j0) * g.p() && pw.w.len() >= j1 * pw.kq && plan.aoff.len() == pw.kq);
    assert!(plan.aoff.iter().all(|&o| gi * plan.group_bytes + o + (sink.qtot + 16) * 4 <= xp.len()));
    let _ = (a, &sink, rq);
    match path {
        Path::Reference => unreachable!("the reference path uses im2col"),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Path::Vnni` is selected only on CPUs with AVX-512 F/BW/VL/VNNI; bounds as
        // asserted above.
        Path::Vnni | Path::Amx => unsafe { vnni::run(a, plan, pw, rq, j0, j1, &sink) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Path::Avx2` is selected only on CPUs with AVX2; bounds as above.
        Path::Avx2 => unsafe { avx2::run(a, plan, pw, rq, j0, j1, &sink) },
    }
}

/// Whether the output of this convolution is written channels-last (`N x OH x OW x OC` bytes):
/// whenever it runs the channels-in-lanes tile (which produces pixel rows of channels), unless
/// `FERROFX_QCONV_NHWC=0`. The next convolution then reads its operand in place (1x1) or from
/// the padded channels-last image, and the residual add fuses into its epilogue.
pub(super) fn writes_channels_last(path: Path, pw: &PackedWeight) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        path == Path::Vnni && pw.lanes && super::channels_last::enabled()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, pw);
        false
    }
}

/// Runs the convolution of `x` (`N x C x H x W` bytes, or `N x H x W x C` when `nhwc_in`) into
/// `out` (`N x OC x OH x OW`, or `N x OH x OW x OC` when `nhwc_out`, which needs
/// [`writes_channels_last`]) on a fast path. Writes every byte of `out` (`N * OC * OH * OW`
/// long, and possibly uninitialised) when it returns `Ok`.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv(
    path: Path,
    g: &Geom,
    x: &[u8],
    nhwc_in: bool,
    pw: &PackedWeight,
    rq: &RequantParams,
    zp: u8,
    out: &mut [MaybeUninit<u8>],
    nhwc_out: bool,
    residual: Residual,
) -> Result<()> {
    debug_assert!(nhwc_out || residual.is_none(), "the residual add is fused into channels-last outputs only");
    // a channels-last input of a 1x1 convolution without padding is the tile's operand as it is:
    // pixel (r, c) reads its channel quads at ((r * sh) * W + c * sw) * C + 4q, no packing
    #[cfg(target_arch = "x86_64")]
    if nhwc_in
        && path == Path::Vnni
        && pw.lanes
        && g.kh == 1
        && g.kw == 1
        && g.pad == [0, 0]
        && g.c.is_multiple_of(4)
        && g.groups == 1
    {
        let aoff: Vec<usize> = (0..pw.kq).map(|q| 4 * q).collect();
        let operand = super::conv2d_lanes::Operand {
            data: x,
            image_bytes: g.h * g.w * g.c,
            row: g.stride[0] * g.w * g.c,
            col: g.stride[1] * g.c,
            aoff: &aoff,
        };
        super::conv2d_lanes::run(g, &operand, pw, rq, out, nhwc_out, residual);
        return Ok(());
    }
    // any other channels-last input of the channels-in-lanes tile: the zero-point-padded image,
    // still channels-last, is the operand (one copy per input row, no per-quad gather)
    #[cfg(target_arch = "x86_64")]
    if nhwc_in && path == Path::Vnni && pw.lanes && g.c.is_multiple_of(4) && g.groups == 1 {
        if let Some((hp, wp)) = padded_plane(g) {
            return conv_padded_nhwc(g, hp, wp, x, pw, rq, zp, out, nhwc_out, residual);
        }
    }
    let plan = Plan::new(g)?;
    let total = plan.image_bytes.checked_mul(g.n).ok_or_else(overflow)?;
    // the packed input goes into this thread's scratch buffer
    with_scratch(total, |xp| conv_packed(path, g, &plan, x, nhwc_in, pw, rq, zp, xp, out, nhwc_out, residual))?
}

/// Runs `f` on `total` bytes of this thread's scratch buffer (contents arbitrary), reused
/// across calls: the callers write every byte of it, so a fresh zeroed allocation per call (a
/// memset and, for the large early layers, page faults) would be pure overhead.
fn with_scratch<R>(total: usize, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
    let mut scratch = PACKED_INPUT.with(|c| c.take());
    if scratch.len() < total {
        drop(std::mem::take(&mut scratch));
        scratch = crate::memory::try_vec(OP, total, 0u8)?;
    }
    let result = f(&mut scratch[..total]);
    if scratch.len() <= SCRATCH_KEEP {
        PACKED_INPUT.with(|c| c.set(scratch));
    }
    Ok(result)
}

/// The channels-in-lanes tile on the zero-point-padded channels-last image of each input
/// (`hp x wp x C` bytes, [`padded_plane`]): output pixel `(r, c)` reads weight word
/// `(q, ki, kj)` at `((r sh + ki dh) Wp + c sw + kj dw) C + 4q` of its image, so the tile's
/// operand is read in place, every stride and dilation alike.
/// The padded plane `(H + 2 pad_h, W + 2 pad_w)` of [`conv_padded_nhwc`], when it is at most
/// four times the input plane (or 64 pixels): a padding far beyond the kernel (with a stride to
/// match) would make the copy much larger than the input, and the stride phases of the packed
/// operand keep only the pixels the kernel reads.
#[cfg(target_arch = "x86_64")]
fn padded_plane(g: &Geom) -> Option<(usize, usize)> {
    let hp = g.pad[0].checked_mul(2)?.checked_add(g.h)?;
    let wp = g.pad[1].checked_mul(2)?.checked_add(g.w)?;
    (hp.checked_mul(wp)? <= g.h.saturating_mul(g.w).max(16).saturating_mul(4)).then_some((hp, wp))
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn conv_padded_nhwc(
    g: &Geom,
    hp: usize,
    wp: usize,
    x: &[u8],
    pw: &PackedWeight,
    rq: &RequantParams,
    zp: u8,
    out: &mut [MaybeUninit<u8>],
    nhwc_out: bool,
    residual: Residual,
) -> Result<()> {
    let row = wp.checked_mul(g.c).ok_or_else(overflow)?;
    let image_bytes = hp.checked_mul(row).ok_or_else(overflow)?;
    let total = image_bytes.checked_mul(g.n).ok_or_else(overflow)?;
    let mut aoff = Vec::with_capacity(pw.kq);
    for q in 0..g.c / 4 {
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                aoff.push((ki * g.dil[0] * wp + kj * g.dil[1]) * g.c + 4 * q);
            }
        }
    }
    // one word per (quad, tap), in the packed weight's order (`PackedWeight::new`)
    debug_assert_eq!(aoff.len(), pw.kq);
    let (img_in, row_in) = (g.h * g.w * g.c, g.w * g.c);
    let (ph, pwd) = (g.pad[0], g.pad[1]);
    with_scratch(total, |padded| {
        crate::ops::team::chunks_mut(padded, image_bytes, |i, d| {
            d[..ph * row].fill(zp);
            if row_in > 0 {
                let src = &x[i * img_in..(i + 1) * img_in];
                for (ih, s) in src.chunks_exact(row_in).enumerate() {
                    let r = &mut d[(ih + ph) * row..(ih + ph + 1) * row];
                    r[..pwd * g.c].fill(zp);
                    r[pwd * g.c..(pwd + g.w) * g.c].copy_from_slice(s);
                    r[(pwd + g.w) * g.c..].fill(zp);
                }
            }
            d[(ph + g.h) * row..].fill(zp);
        });
        let operand = super::conv2d_lanes::Operand {
            data: padded,
            image_bytes,
            row: g.stride[0] * row,
            col: g.stride[1] * g.c,
            aoff: &aoff,
        };
        super::conv2d_lanes::run(g, &operand, pw, rq, out, nhwc_out, residual);
    })
}

/// The residual of a fused `quantized_conv2d_add` on a channels-last output: the other operand's
/// bytes (channels-last, the output's shape) and the add's parameters, applied to each output
/// pixel's channels as they leave the tile (`None`: a plain convolution).
pub(super) type Residual<'a> = Option<(&'a [u8], super::add::Params)>;

thread_local! {
    /// The packed-input scratch of the calling thread (taken out while a convolution runs, so a
    /// nested call on the same thread allocates its own).
    static PACKED_INPUT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest packed input kept between calls (larger ones are freed after the call).
const SCRATCH_KEEP: usize = 64 << 20;

/// [`conv`] on the packed-input buffer `xp` (`plan.image_bytes * N`, contents arbitrary).
#[allow(clippy::too_many_arguments)]
fn conv_packed(
    path: Path,
    g: &Geom,
    plan: &Plan,
    x: &[u8],
    nhwc_in: bool,
    pw: &PackedWeight,
    rq: &RequantParams,
    zp: u8,
    xp: &mut [u8],
    out: &mut [MaybeUninit<u8>],
    nhwc_out: bool,
    residual: Residual,
) -> Result<()> {
    let (img_in, img_out) = (g.c * g.h * g.w, g.oc * g.p());
    if plan.image_bytes > 0 {
        crate::ops::team::chunks_mut(xp, plan.image_bytes, |i, d| {
            pack_image(g, plan, &x[i * img_in..(i + 1) * img_in], nhwc_in, zp, d)
        });
    }
    #[cfg(target_arch = "x86_64")]
    if pw.lanes && path == Path::Vnni {
        super::conv2d_lanes::run(g, &super::conv2d_lanes::Operand::packed(xp, plan), pw, rq, out, nhwc_out, residual);
        return Ok(());
    }
    debug_assert!(!nhwc_out, "only the channels-in-lanes tile writes channels-last");
    let _ = residual;
    // the pixels-in-lanes tile stores whole vectors of flat pixels, masked at the row ends: the
    // output is zero-filled first, and then an ordinary byte slice
    for b in out.iter_mut() {
        b.write(0);
    }
    // SAFETY: every byte was just initialised; `MaybeUninit<u8>` has `u8`'s layout
    let out: &mut [u8] = unsafe { &mut *(out as *mut [MaybeUninit<u8>] as *mut [u8]) };
    // work items: (image, output channels j0..j1 within one group)
    let threads = rayon::current_num_threads().max(1);
    let per_image = (4 * threads).div_ceil(g.n).max(1);
    let ocg = g.ocg();
    let cs = ocg.div_ceil(per_image.div_ceil(g.groups).max(1)).next_multiple_of(8).min(ocg).max(1);
    // (image, first and end output channel) and the output rows they write
    type Item<'a> = ((usize, usize, usize), &'a mut [u8]);
    let mut items: Vec<Item<'_>> = Vec::new();
    for (i, mut rest) in out.chunks_mut(img_out).enumerate() {
        for gi in 0..g.groups {
            let mut j = gi * ocg;
            while j < (gi + 1) * ocg {
                let j1 = (j + cs).min((gi + 1) * ocg);
                let (head, tail) = std::mem::take(&mut rest).split_at_mut((j1 - j) * g.p());
                items.push(((i, j, j1), head));
                rest = tail;
                j = j1;
            }
        }
    }
    let xp = &*xp;
    // on the kernels' team (`ops::team`), as the float convolutions and the AMX path: rayon's
    // pool puts the caller to sleep and parks its workers between a model's nodes
    crate::ops::team::slices_mut(items, |&(i, j0, j1), o| {
        conv_block(path, g, plan, &xp[i * plan.image_bytes..(i + 1) * plan.image_bytes], pw, rq, j0, j1, o)
    });
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{PackedWeight, Plan, RequantParams, Sink, VNNI_MR, VNNI_NV};
    use std::arch::x86_64::*;

    /// One tile: output channels `j..j + MR` (row `r` of the block written at `(j - j0 + r)` of
    /// the sink), flat pixels `q0..q0 + 16 * NV`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const MR: usize, const NV: usize>(
        a: *const u8,
        aoff: &[usize],
        w: *const i32,
        kq: usize,
        rq: &RequantParams,
        j: usize,
        jrow: usize,
        q0: usize,
        sink: &Sink,
    ) {
        let mut acc = [[_mm512_setzero_si512(); NV]; MR];
        let a0 = a.add(q0 * 4);
        for (t, &off) in aoff.iter().enumerate() {
            let ap = a0.add(off);
            let mut av = [_mm512_setzero_si512(); NV];
            for (v, x) in av.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(ap.add(v * 64) as *const _);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_epi32(*w.add(r * kq + t));
                for (c, x) in row.iter_mut().zip(av.iter()) {
                    *c = _mm512_dpbusd_epi32(*c, *x, b);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            let jj = j + r;
            let zsum = _mm512_set1_epi32(rq.a_zp.wrapping_mul(rq.b_sums[jj]));
            let bias = _mm512_set1_ps(rq.bias_term[jj]);
            let mult = _mm512_set1_ps(rq.multiplier[jj]);
            let lo = _mm512_set1_ps((rq.lo - rq.out_zp) as f32);
            let hi = _mm512_set1_ps((rq.hi - rq.out_zp) as f32);
            let zp = _mm512_set1_epi32(rq.out_zp);
            for (v, c) in row.iter().enumerate() {
                let f = _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(*c, zsum)), bias), mult);
                // NaN → 0 (as `NaN as i64`), then clamp and round half to even
                let f = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(f, f), f);
                let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
                let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), zp);
                let bytes = _mm512_cvtepi32_epi8(q);
                let qs = q0 + v * 16;
                let base = sink.out.wrapping_add((jrow + r) * sink.p);
                if sink.wq == sink.ow {
                    let n = sink.qtot.saturating_sub(qs).min(16);
                    let mask = ((1u32 << n) - 1) as u16;
                    _mm_mask_storeu_epi8(base.add(qs) as *mut i8, mask, bytes);
                } else {
                    sink.runs(qs, 16, |l0, l1, o| {
                        let mask = (((1u32 << l1) - 1) & !((1u32 << l0) - 1)) as u16;
                        // lane l goes to `o + (l - l0)`: only lanes l0..l1 are written
                        let p = base.wrapping_add(o).wrapping_sub(l0);
                        _mm_mask_storeu_epi8(p as *mut i8, mask, bytes);
                    });
                }
            }
        }
    }

    /// Tiles of `MR` channels at `j` over all pixels.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<const MR: usize>(
        a: *const u8,
        plan: &Plan,
        pw: &PackedWeight,
        rq: &RequantParams,
        j: usize,
        jrow: usize,
        sink: &Sink,
    ) {
        let w = pw.w.as_ptr().add(j * pw.kq);
        let nvec = sink.qtot.div_ceil(16);
        let mut v = 0;
        while v + VNNI_NV <= nvec {
            tile::<MR, VNNI_NV>(a, &plan.aoff, w, pw.kq, rq, j, jrow, v * 16, sink);
            v += VNNI_NV;
        }
        match nvec - v {
            2 => tile::<MR, 2>(a, &plan.aoff, w, pw.kq, rq, j, jrow, v * 16, sink),
            1 => tile::<MR, 1>(a, &plan.aoff, w, pw.kq, rq, j, jrow, v * 16, sink),
            _ => {}
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn run(
        a: &[u8],
        plan: &Plan,
        pw: &PackedWeight,
        rq: &RequantParams,
        j0: usize,
        j1: usize,
        sink: &Sink,
    ) {
        let a = a.as_ptr();
        let mut j = j0;
        while j + VNNI_MR <= j1 {
            rows::<VNNI_MR>(a, plan, pw, rq, j, j - j0, sink);
            j += VNNI_MR;
        }
        for step in [4, 2, 1] {
            if j + step <= j1 {
                match step {
                    4 => rows::<4>(a, plan, pw, rq, j, j - j0, sink),
                    2 => rows::<2>(a, plan, pw, rq, j, j - j0, sink),
                    _ => rows::<1>(a, plan, pw, rq, j, j - j0, sink),
                }
                j += step;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{PackedWeight, Plan, RequantParams, Sink, AVX2_MR, AVX2_NV};
    use std::arch::x86_64::*;

    /// One tile: output channels `j..j + MR`, flat pixels `q0..q0 + 8 * NV`. Per word, the 8
    /// pixels x 4 channels of a vector split into even channels (`& 0xff` per i16) and odd
    /// channels (`>> 8`), the weight word into sign-extended i16 pairs `(w0, w2)`, `(w1, w3)`;
    /// `vpmaddwd` sums each pair exactly into i32.
    #[inline]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    unsafe fn tile<const MR: usize, const NV: usize>(
        a: *const u8,
        aoff: &[usize],
        w: *const i32,
        kq: usize,
        rq: &RequantParams,
        j: usize,
        jrow: usize,
        q0: usize,
        sink: &Sink,
    ) {
        let mut acc = [[_mm256_setzero_si256(); NV]; MR];
        let a0 = a.add(q0 * 4);
        let low = _mm256_set1_epi16(0xff);
        for (t, &off) in aoff.iter().enumerate() {
            let ap = a0.add(off);
            let mut even = [_mm256_setzero_si256(); NV];
            let mut odd = [_mm256_setzero_si256(); NV];
            for v in 0..NV {
                let x = _mm256_loadu_si256(ap.add(v * 32) as *const __m256i);
                even[v] = _mm256_and_si256(x, low);
                odd[v] = _mm256_srli_epi16::<8>(x);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let b = _mm256_set1_epi32(*w.add(r * kq + t));
                let (we, wo) = (_mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(b)), _mm256_srai_epi16::<8>(b));
                for (v, c) in row.iter_mut().enumerate() {
                    let s = _mm256_add_epi32(_mm256_madd_epi16(even[v], we), _mm256_madd_epi16(odd[v], wo));
                    *c = _mm256_add_epi32(*c, s);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            let jj = j + r;
            let zsum = _mm256_set1_epi32(rq.a_zp.wrapping_mul(rq.b_sums[jj]));
            let bias = _mm256_set1_ps(rq.bias_term[jj]);
            let mult = _mm256_set1_ps(rq.multiplier[jj]);
            let lo = _mm256_set1_ps((rq.lo - rq.out_zp) as f32);
            let hi = _mm256_set1_ps((rq.hi - rq.out_zp) as f32);
            let zp = _mm256_set1_epi32(rq.out_zp);
            let mut vals = [0u8; 16];
            for (v, c) in row.iter().enumerate() {
                let f = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(*c, zsum)), bias), mult);
                let f = _mm256_and_ps(f, _mm256_cmp_ps::<_CMP_ORD_Q>(f, f));
                let f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
                let q = _mm256_add_epi32(_mm256_cvtps_epi32(f), zp);
                let mut lanes = [0i32; 8];
                _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, q);
                for (d, &s) in vals[v * 8..v * 8 + 8].iter_mut().zip(&lanes) {
                    *d = s as u8;
                }
            }
            sink.store(jrow + r, q0, &vals[..8 * NV]);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn rows<const MR: usize>(
        a: *const u8,
        plan: &Plan,
        pw: &PackedWeight,
        rq: &RequantParams,
        j: usize,
        jrow: usize,
        sink: &Sink,
    ) {
        let w = pw.w.as_ptr().add(j * pw.kq);
        let nvec = sink.qtot.div_ceil(8);
        let mut v = 0;
        while v + AVX2_NV <= nvec {
            tile::<MR, AVX2_NV>(a, &plan.aoff, w, pw.kq, rq, j, jrow, v * 8, sink);
            v += AVX2_NV;
        }
        if nvec > v {
            tile::<MR, 1>(a, &plan.aoff, w, pw.kq, rq, j, jrow, v * 8, sink);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn run(
        a: &[u8],
        plan: &Plan,
        pw: &PackedWeight,
        rq: &RequantParams,
        j0: usize,
        j1: usize,
        sink: &Sink,
    ) {
        let a = a.as_ptr();
        let mut j = j0;
        while j + AVX2_MR <= j1 {
            rows::<AVX2_MR>(a, plan, pw, rq, j, j - j0, sink);
            j += AVX2_MR;
        }
        for step in [2, 1] {
            if j + step <= j1 {
                match step {
                    2 => rows::<2>(a, plan, pw, rq, j, j - j0, sink),
                    _ => rows::<1>(a, plan, pw, rq, j, j - j0, sink),
                }
                j += step;
            }
        }
    }
}
