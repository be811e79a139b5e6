//! The channels-in-lanes tile of `quantized_conv2d` (AVX-512 VNNI): every single-group
//! convolution.
//!
//! The pixels-in-lanes tile of `conv2d_packed.rs` computes the flat pixels `oh * wq + ow` of a
//! phase in vectors of 16: on a 7x7 plane with padding 1 that is 63 flat pixels for 49 outputs,
//! in 4 vectors (64 lanes), so 23% of its work is thrown away; 14x14 loses 12.5%. This tile puts
//! 16 output channels in the lanes instead: an output tile is [`MP`] real output pixels x up to
//! 64 output channels (`NB` vectors of 16), the reduction runs over the same packed weight words
//! (`ceil(C / 4) * kH * kW` words of four input channels) and reads the same packed input
//! (`conv2d_packed.rs`'s phases, `[C/4][pixels][4]`): per word, `NB` weight vectors are loaded
//! and each pixel's 4-byte word of the input is broadcast into `vpdpbusd`. Only real output
//! pixels are computed (the last tile of a run repeats its last pixel and stores only the real
//! ones).
//!
//! Measured against the pixels-in-lanes tile (qkernels layers, one thread, alternating, load
//! 5-5.3): 3x3 512→512 @7 379 → 299 us, 256→256 @14 315 → 277 us, 128→128 @28 306 → 284 us,
//! 64→64 @56 312 → 287 us, the 7x7 stem 519 → 441 us, 1x1 2048→512 @7 233 → 207 us,
//! 1024→256 @14 219 → 209 us; but 1x1 128→512 @28 180 → 192 us and 256→512/2 @56 344 → 359 us
//! (with few weight words per output, the per-tile epilogue and transpose weigh more), so until
//! session 27 1x1 convolutions on planes above [`MAX_PIXELS`] kept the pixels-in-lanes tile and
//! wrote row-major outputs. Since then this tile writes channels-last outputs on every plane and
//! reads channels-last inputs in place (1x1) or from their zero-point-padded copy: no per-call
//! input pack, no output transpose, and the residual add in the epilogue. Per-layer sums at
//! batch 8, two threads, alternating in one process (scratch program, every ResNet-50 conv with
//! its multiplicity, the inputs in the layout the model gives each): 110 → 89 ms for the
//! convolutions, 38 → 32 ms for the conv + residual add layers; ResNet-18 31.5 → 28.8 ms.
//! 1x1 256→64 @56 2.81 → 1.14 ms, 512→128 @28 2.42 → 0.98 ms, 3x3/2 64→128 @56 2.18 → 1.21 ms.
//!
//! **Weights** (`PackedWeight` with `lanes`): panels of 64 output channels (the last one
//! `round_up(OC - j, 16)` wide, zero past `OC`), each `[kq][width]` words, so one word index
//! gives `width / 16` consecutive 64-byte vectors. Panel `j / 64` starts at word `j * kq`.
//!
//! **Output**: the requantised bytes of an item (one image, one panel, a run of output pixels)
//! are collected pixel-major in a stack buffer (`[pixel][64]`) and transposed to the
//! channel-major output with 16x16 byte transposes (SSE2 unpacks), so the store costs a few
//! instructions per 16 bytes. The requantisation is the same f32 sequence as `Requant::apply`
//! (and the other tiles), so the bytes equal the reference's.

use super::conv2d::Geom;
use super::conv2d_packed::{PackedWeight, Plan, Residual};
use super::gemm::RequantParams;

/// Output pixels per register tile.
pub(super) const MP: usize = 6;
/// Output channels per weight panel (4 vectors of 16).
pub(super) const PANEL: usize = 64;
/// The longest run of pixels of one work item (its stack buffer).
pub(super) const MAX_PIXELS: usize = 256;

/// Whether a convolution runs on this tile (AVX-512 VNNI only; decided at weight-pack time too,
/// since the weight layout follows it): `groups == 1`. `FERROFX_QCONV_TILE=pixels` turns it off
/// (the pixels-in-lanes tile and row-major outputs) for a side-by-side measurement.
pub(super) fn applies(g: &Geom) -> bool {
    match forced() {
        Some(v) => v && g.groups == 1,
        None => g.groups == 1,
    }
}

fn forced() -> Option<bool> {
    static F: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *F.get_or_init(|| match std::env::var("FERROFX_QCONV_TILE").as_deref() {
        Ok("pixels") => Some(false),
        Ok("channels") => Some(true),
        _ => None,
    })
}

/// Packs the `[OC][kq]` word rows of the pixels-in-lanes layout into channel panels.
pub(super) fn panels(rows: &[i32], oc: usize, kq: usize) -> Vec<i32> {
    let mut out = vec![0i32; oc.next_multiple_of(16) * kq];
    let mut j0 = 0;
    while j0 < oc {
        let width = (oc - j0).next_multiple_of(16).min(PANEL);
        let panel = &mut out[j0 * kq..(j0 + width) * kq];
        for c in 0..width.min(oc - j0) {
            let src = &rows[(j0 + c) * kq..(j0 + c + 1) * kq];
            for (t, &v) in src.iter().enumerate() {
                panel[t * width + c] = v;
            }
        }
        j0 += PANEL;
    }
    out
}

/// The output buffer shared by the items (each writes its own channels x pixels).
#[derive(Clone, Copy)]
struct OutPtr(*mut u8);
// SAFETY: the items write disjoint (channel, pixel) ranges of the output (see `run`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The byte `off` of the output (a method, so closures capture the `Sync` wrapper).
    fn at(&self, off: usize) -> *mut u8 {
        self.0.wrapping_add(off)
    }
}

/// Where the tile reads its operand: output pixel `(r, c)` of image `i` reads the 4-byte word
/// of weight word `t` at `data[i * image_bytes + r * row + c * col + aoff[t]]`.
pub(super) struct Operand<'a> {
    /// The images' bytes.
    pub(super) data: &'a [u8],
    /// Bytes per image.
    pub(super) image_bytes: usize,
    /// Bytes between the operands of vertically / horizontally adjacent output pixels.
    pub(super) row: usize,
    pub(super) col: usize,
    /// Byte offset of each weight word's operand (`kq` of them).
    pub(super) aoff: &'a [usize],
}

impl<'a> Operand<'a> {
    /// The packed input of `conv2d_packed.rs` (`[C/4][pixels][4]` planes per phase).
    pub(super) fn packed(xp: &'a [u8], plan: &'a Plan) -> Operand<'a> {
        Operand { data: xp, image_bytes: plan.image_bytes, row: plan.wq * 4, col: 4, aoff: &plan.aoff }
    }
}

/// Runs the convolution of the operand `x` into `out` (`N x OC x OH x OW` bytes, channel-major
/// per image, or pixel-major `N x OH x OW x OC` when `nhwc_out`), adding `residual` (a fused
/// `quantized_conv2d_add`, channels-last outputs only) to each pixel's requantised channels.
/// Writes every byte of `out[..N * OC * OH * OW]` (it may start uninitialised). Requires
/// `Path::Vnni` and `applies(g)`.
pub(super) fn run(
    g: &Geom,
    x: &Operand,
    pw: &PackedWeight,
    rq: &RequantParams,
    out: &mut [std::mem::MaybeUninit<u8>],
    nhwc_out: bool,
    residual: Residual,
) {
    let p = g.p();
    let padded = g.oc.next_multiple_of(16);
    // the epilogue reads 16 channels' parameters at a time
    let rq = rq.clone().padded(padded);
    assert!(out.len() >= g.n * g.oc * p && x.data.len() >= g.n * x.image_bytes);
    // the residual is added to channels-last output pixels, and has the output's size
    assert!(residual.is_none_or(|(r, _)| nhwc_out && r.len() >= g.n * g.oc * p));
    assert!(pw.w.len() >= padded * pw.kq && x.aoff.len() == pw.kq);
    // every read of a tile lies in its image: the last pixel's operand plus the largest offset
    if p > 0 {
        let last = (g.oh - 1) * x.row + (g.ow - 1) * x.col;
        assert!(x.aoff.iter().all(|&o| last + o + 4 <= x.image_bytes));
    }
    let panels = g.oc.div_ceil(PANEL);
    let threads = rayon::current_num_threads().max(1);
    // about four items per thread: split the pixels when images x panels are too few
    let chunks = (4 * threads).div_ceil(g.n * panels).min(p.div_ceil(MP * 2)).max(1);
    let chunk_px = p.div_ceil(chunks).next_multiple_of(MP).min(MAX_PIXELS);
    let chunks = p.div_ceil(chunk_px);
    let dst = OutPtr(out.as_mut_ptr().cast::<u8>());
    // panel-major: the consecutive items a thread takes share their weight panel (in L2)
    // (on the kernels' team, `ops::team`, as the float convolutions and the AMX path)
    crate::ops::team::for_each(g.n * panels * chunks, |it| {
        let (jb, rest) = (it / (g.n * chunks), it % (g.n * chunks));
        let (i, ch) = (rest / chunks, rest % chunks);
        let (o0, o1) = (ch * chunk_px, ((ch + 1) * chunk_px).min(p));
        let j0 = jb * PANEL;
        let a = &x.data[i * x.image_bytes..(i + 1) * x.image_bytes];
        // SAFETY: `Path::Vnni` (the caller's condition) means the CPU has AVX-512 F/BW/VL/VNNI;
        // reads are bounded as asserted above; the item writes channels `j0..j0 + 64` (< OC)
        // and pixels `o0..o1` (< OH * OW) of image `i`, which no other item writes.
        let res = residual.map(|(r, ap)| (&r[i * g.oc * p..(i + 1) * g.oc * p], ap));
        unsafe { vnni::item(a.as_ptr(), g, x, pw, &rq, j0, o0, o1, dst.at(i * g.oc * p), nhwc_out, res) };
    });
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Geom, Operand, PackedWeight, RequantParams, Residual, MAX_PIXELS, MP, PANEL};
    use std::arch::x86_64::*;

    /// One tile: pixels whose operand words start at `ap[k]` (byte pointers into the group's
    /// planes, shifted per word by `aoff[t]`), `NB` vectors of channels starting at the panel
    /// pointer `w` (`width` words per word index). The requantised bytes go to `buf[k][0..NB*16]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const NB: usize>(
        ap: &[*const u8; MP],
        aoff: &[usize],
        w: *const i32,
        width: usize,
        rq: &RequantParams,
        j: usize,
        buf: *mut u8,
    ) {
        let mut acc = [[_mm512_setzero_si512(); NB]; MP];
        let mut wp = w;
        for &off in aoff {
            let mut wv = [_mm512_setzero_si512(); NB];
            for (v, x) in wv.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(wp.add(v * 16) as *const _);
            }
            for (k, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_epi32(std::ptr::read_unaligned(ap[k].add(off) as *const i32));
                for (c, wv) in row.iter_mut().zip(wv.iter()) {
                    *c = _mm512_dpbusd_epi32(*c, x, *wv);
                }
            }
            wp = wp.add(width);
        }
        let lo = _mm512_set1_ps((rq.lo - rq.out_zp) as f32);
        let hi = _mm512_set1_ps((rq.hi - rq.out_zp) as f32);
        let zp = _mm512_set1_epi32(rq.out_zp);
        for v in 0..NB {
            let jj = j + v * 16;
            let sums = _mm512_loadu_si512(rq.b_sums.as_ptr().add(jj) as *const _);
            let zsum = _mm512_mullo_epi32(_mm512_set1_epi32(rq.a_zp), sums);
            let bias = _mm512_loadu_ps(rq.bias_term.as_ptr().add(jj));
            let mult = _mm512_loadu_ps(rq.multiplier.as_ptr().add(jj));
            for (k, row) in acc.iter().enumerate() {
                let f = _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(row[v], zsum)), bias), mult);
                // NaN → 0 (as `NaN as i64`), then clamp and round half to even
                let f = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(f, f), f);
                let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
                let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), zp);
                _mm_storeu_si128(buf.add(k * PANEL + v * 16) as *mut __m128i, _mm512_cvtepi32_epi8(q));
            }
        }
    }

    /// Transposes the 16x16 bytes `src[r * PANEL + c]` (`r` pixel, `c` channel) and stores
    /// channel `c`'s 16 pixels at `dst + c * p` (only the first `n` pixels, and `m` channels).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn transpose16(src: *const u8, dst: *mut u8, p: usize, n: usize, m: usize) {
        let r: [__m128i; 16] = std::array::from_fn(|i| _mm_loadu_si128(src.add(i * PANEL) as *const __m128i));
        // stage 1: bytes of row pairs
        let mut a = [_mm_setzero_si128(); 16];
        for i in 0..8 {
            a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
        }
        // stage 2: 16-bit pairs of (rows 4i..4i+2) and (4i+2..4i+4)
        let mut b = [_mm_setzero_si128(); 16];
        for i in 0..4 {
            b[4 * i] = _mm_unpacklo_epi16(a[4 * i], a[4 * i + 2]);
            b[4 * i + 1] = _mm_unpackhi_epi16(a[4 * i], a[4 * i + 2]);
            b[4 * i + 2] = _mm_unpacklo_epi16(a[4 * i + 1], a[4 * i + 3]);
            b[4 * i + 3] = _mm_unpackhi_epi16(a[4 * i + 1], a[4 * i + 3]);
        }
        // stage 3: 32-bit pairs of row quads (0..4, 4..8) and (8..12, 12..16)
        let mut c = [_mm_setzero_si128(); 16];
        for h in 0..2 {
            for i in 0..4 {
                c[8 * h + 2 * i] = _mm_unpacklo_epi32(b[8 * h + i], b[8 * h + 4 + i]);
                c[8 * h + 2 * i + 1] = _mm_unpackhi_epi32(b[8 * h + i], b[8 * h + 4 + i]);
            }
        }
        // stage 4: 64-bit halves of rows 0..8 and 8..16; d[k] holds channel k's 16 pixels
        for k in 0..8 {
            let lo = _mm_unpacklo_epi64(c[k], c[8 + k]);
            let hi = _mm_unpackhi_epi64(c[k], c[8 + k]);
            for (ch, v) in [(2 * k, lo), (2 * k + 1, hi)] {
                if ch >= m {
                    continue;
                }
                if n == 16 {
                    _mm_storeu_si128(dst.add(ch * p) as *mut __m128i, v);
                } else {
                    _mm_mask_storeu_epi8(dst.add(ch * p) as *mut i8, ((1u32 << n) - 1) as u16, v);
                }
            }
        }
    }

    /// One item: channels `j0..j0 + 64` (clipped to `OC`) of output pixels `o0..o1` of one
    /// image (`a`: its operand, `out`: its `OC x OH x OW` output, or `OH x OW x OC` when
    /// `nhwc_out`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn item(
        a: *const u8,
        g: &Geom,
        x: &Operand,
        pw: &PackedWeight,
        rq: &RequantParams,
        j0: usize,
        o0: usize,
        o1: usize,
        out: *mut u8,
        nhwc_out: bool,
        residual: Residual,
    ) {
        let width = (g.oc - j0).next_multiple_of(16).min(PANEL);
        let valid = (g.oc - j0).min(PANEL);
        let w = pw.w.as_ptr().add(j0 * pw.kq);
        let mut buf = [0u8; (MAX_PIXELS + MP) * PANEL];
        let bufp = buf.as_mut_ptr();
        let mut o = o0;
        // output pixel `o` is (row, col) of the plane; its operand starts at row * x.row + col * x.col
        let (mut row, mut col) = (o0 / g.ow, o0 % g.ow);
        while o < o1 {
            let (mut r, mut c) = (row, col);
            let ap: [*const u8; MP] = std::array::from_fn(|k| {
                let p = a.add(r * x.row + c * x.col);
                // the next pixel, unless this is the run's last (the tile repeats it)
                if o + k + 1 < o1 {
                    c += 1;
                    if c == g.ow {
                        (r, c) = (r + 1, 0);
                    }
                }
                p
            });
            (row, col) = (r, c);
            let b = bufp.add((o - o0) * PANEL);
            match width / 16 {
                4 => tile::<4>(&ap, x.aoff, w, width, rq, j0, b),
                3 => tile::<3>(&ap, x.aoff, w, width, rq, j0, b),
                2 => tile::<2>(&ap, x.aoff, w, width, rq, j0, b),
                _ => tile::<1>(&ap, x.aoff, w, width, rq, j0, b),
            }
            o += MP;
        }
        if let Some((res, ap)) = residual {
            // the fused residual add (`quantized_conv2d_add`): the requantised convolution bytes
            // of each pixel and the other operand's, through the add op's own kernel
            for k in 0..o1 - o0 {
                let at = (o0 + k) * g.oc + j0;
                let conv = std::slice::from_raw_parts(bufp.add(k * PANEL), valid);
                let dst = std::slice::from_raw_parts_mut(out.add(at), valid);
                crate::ops::quantized::add::add_slices(conv, &res[at..at + valid], dst, ap);
            }
            return;
        }
        if nhwc_out {
            // pixel-major buffer → pixel-major output: each pixel's channels as they are
            for k in 0..o1 - o0 {
                std::ptr::copy_nonoverlapping(bufp.add(k * PANEL), out.add((o0 + k) * g.oc + j0), valid);
            }
            return;
        }
        // pixel-major buffer → channel-major output, 16 x 16 blocks
        let p = g.p();
        let mut c = 0;
        while c < valid {
            let mut k = 0;
            while k < o1 - o0 {
                let n = (o1 - o0 - k).min(16);
                transpose16(bufp.add(k * PANEL + c), out.add((j0 + c) * p + o0 + k), p, n, (valid - c).min(16));
                k += 16;
            }
            c += 16;
        }
    }
}
