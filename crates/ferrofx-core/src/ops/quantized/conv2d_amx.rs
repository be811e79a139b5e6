//! The AMX tile path of `quantized_conv2d` (Intel Advanced Matrix Extensions: Sapphire Rapids
//! and later Xeons): `tdpbusd` multiplies a 16 x 64 tile of uint8 activations by a 64 x 16
//! tile of int8 weights into a 16 x 16 tile of i32 sums, 16384 multiply-adds per instruction
//! (eight times a `vpdpbusd` zmm pair's).
//!
//! **Operand**: the A tile is 16 output pixels x 64 input channels, one pixel per tile row, so
//! the input must be channels-last (`[pixels][C]`): each row is 64 contiguous bytes, rows `C`
//! bytes apart. The zero-point-padded input is split into its `stride_h x stride_w` phases as in
//! `conv2d_packed.rs` (phase `(a, b)` holds padded rows `a, a + sh, ...` and columns `b, b + sw,
//! ...`), each phase stored channels-last `[lp][C]`; in a phase every kernel tap is a constant
//! shift of the flat pixel index `q = oh * wq + ow`, so the A tile of tap `t`, channel chunk `c`
//! and pixels `q0..q0 + 16` is the run of rows starting at `(phase_t * lp + q0 + shift_t) * C +
//! 64 c`, read in place by `tileloadd` with stride `C`. A channels-last input of a 1x1
//! convolution with stride 1 and no padding is read as it is (no copy). Columns `ow >= OW` of
//! the flat index are computed and not stored.
//!
//! **Weights** are packed once per weight tensor (cached on its storage like the VNNI packs):
//! per block of 16 output channels, tap and chunk of 64 input channels, the 16 x 64-byte B tile
//! in the VNNI order `tdpbusd` wants (`row r = input channels 4r..4r + 4`, `column n` = output
//! channel `n`: `[r][n][4]`), with the row sums for the zero-point correction.
//!
//! **Tile**: 32 pixels x 32 output channels, in the eight tile registers as two A tiles, two B
//! tiles and four accumulators (the blocking oneDNN's AMX convolutions use), so every loaded
//! tile feeds two `tdpbusd`. The sums are stored to a stack buffer with `tilestored` and
//! requantised 16 channels at a time with AVX-512 (the f32 operations of `Requant::apply` in
//! the same order, as the VNNI tiles), so the output bytes equal the reference's: the i32 sums
//! hold the same exact terms in any order. The output is written channels-last.
//!
//! **Where**: `groups == 1` and a multiple of 64 input channels (every ResNet layer but the
//! 3-channel stem, which runs on the same tile loop over its space-to-depth image,
//! `conv2d_s2d.rs`, or over gathered im2col rows, `conv2d_im2col.rs`). Linux grants a process the AMX tile state only on
//! request (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`available`] asks once and
//! the path is used only when the kernel agreed. `FERROFX_AMX=0` turns it off for a
//! side-by-side measurement.
//!
//! The instructions are written with `asm!` (the AMX intrinsics are not stable Rust); each
//! kernel configures the tiles (`ldtilecfg`) at its start and releases them (`tilerelease`) at
//! its end, so no tile state outlives a work item.

use super::add;
use super::conv2d::Geom;
use super::conv2d_packed::Phases;
use super::gemm::RequantParams;
use crate::error::{Error, Result};
use crate::memory::{AlignedBytes, CACHE_LINE};
use std::mem::MaybeUninit;

const OP: &str = "quantized_conv2d";

/// Input channels per A tile row (and B tile rows x 4).
pub(super) const KC: usize = 64;
/// Pixels per tile step (two A tiles of 16 rows).
const TP: usize = 32;
/// Output channels per tile step (two B tiles of 16 columns).
const TJ: usize = 32;

/// Whether the CPU has AMX-INT8 with AVX-512 (for the epilogue) and the OS granted this process
/// the tile state (asked once), unless `FERROFX_AMX=0`.
pub(crate) fn available() -> bool {
    static A: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *A.get_or_init(|| {
        if std::env::var("FERROFX_AMX").is_ok_and(|v| v == "0") {
            return false;
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl");
            if !vnni {
                return false;
            }
            // CPUID leaf 7 (present on every CPU with AVX-512): EDX bit 24 AMX-TILE, 25 AMX-INT8
            let l7 = std::arch::x86_64::__cpuid_count(7, 0);
            if (l7.edx >> 24) & 3 != 3 {
                return false;
            }
            request_tile_state()
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: Linux's permission for this process
/// (all its threads) to use the AMX tile data. `false` when the kernel refuses or is too old.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call with these arguments only changes this process's
    // permitted extended-state set; it reads and writes no memory of ours. `syscall` clobbers
    // rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret == 0
}

/// Whether a convolution runs on the AMX tiles (given [`available`]): one group, a multiple of
/// 64 input channels, and channels-last outputs enabled.
pub(super) fn applies(g: &Geom) -> bool {
    g.groups == 1 && g.c > 0 && g.c.is_multiple_of(KC) && g.oc > 0 && super::channels_last::enabled()
}

/// Weights packed as B tiles: `[OC / 16][taps][C / 64][16][16][4]` bytes (output channels padded
/// to a multiple of 32 with zeros), with the row sums.
pub(super) struct AmxWeight {
    taps: usize,
    pub(super) chunks: usize,
    /// The B tiles, cache-line aligned (a `tileloadd` whose rows straddle cache lines runs
    /// several times slower).
    pub(super) w: AlignedBytes,
    /// `sum` of each output channel's int8 weights (`OC` of them).
    pub(super) sums: Vec<i32>,
}

impl AmxWeight {
    /// Packs `w` (`[OC][C][kH][kW]`, contiguous, `C` a multiple of 64).
    pub(super) fn new(w: &[i8], g: &Geom) -> Result<AmxWeight> {
        let (c, kh, kw) = (g.c, g.kh, g.kw);
        let taps = kh * kw;
        let chunks = c / KC;
        let ocp = g.oc.next_multiple_of(TJ);
        let tile = 16 * KC;
        let len = ocp.checked_mul(taps).and_then(|v| v.checked_mul(c)).ok_or_else(overflow)?;
        let mut buf = AlignedBytes::try_new(OP, len, 0)?;
        let packed = buf.as_mut_slice();
        for b in 0..ocp / 16 {
            for t in 0..taps {
                for ch in 0..chunks {
                    let dst = &mut packed[((b * taps + t) * chunks + ch) * tile..][..tile];
                    for n in 0..16 {
                        let oc = b * 16 + n;
                        if oc >= g.oc {
                            break;
                        }
                        for k in 0..KC {
                            let ic = ch * KC + k;
                            dst[(k / 4) * 64 + n * 4 + k % 4] = w[(oc * c + ic) * taps + t] as u8;
                        }
                    }
                }
            }
        }
        let row = c * taps;
        let sums = (0..g.oc).map(|j| w[j * row..(j + 1) * row].iter().map(|&v| v as i32).sum()).collect();
        Ok(AmxWeight { taps, chunks, w: buf, sums })
    }
}

/// The phases of the padded input and the per-tap row offsets.
struct Plan {
    /// Phases in use, as `(row phase, column phase)`.
    phases: Vec<(usize, usize)>,
    /// Rows and row length of a phase.
    hs: usize,
    wq: usize,
    /// Pixels per phase (every tile's reads stay inside).
    lp: usize,
    /// Pixel offset of each tap's first row from the image's base (`phase * lp + shift`).
    tap_px: Vec<usize>,
    /// Flat output pixels `OH * wq`, and tiles of [`TP`] of them.
    qtot: usize,
    tiles: usize,
    /// Bytes from one pixel's operand row to the next (the A tiles' row stride): `C`, or the
    /// space-to-depth channels of a small-channel convolution (`conv2d_s2d.rs`), whose 64-byte
    /// rows then overlap.
    px: usize,
}

fn overflow() -> Error {
    Error::limit(OP, "the packed input of this convolution does not fit in memory (size overflows usize)")
}

impl Plan {
    fn new(g: &Geom) -> Result<Plan> {
        let Phases { hs, wq, phases, taps } = Phases::new(g)?;
        let qtot = g.oh.checked_mul(wq).ok_or_else(overflow)?;
        let tiles = qtot.div_ceil(TP);
        let max_shift = taps.iter().map(|t| t.1).max().unwrap_or(0);
        let lp = (tiles * TP + max_shift).max(hs.checked_mul(wq).ok_or_else(overflow)?);
        let tap_px = taps.iter().map(|&(p, s)| p * lp + s).collect();
        Ok(Plan { phases, hs, wq, lp, tap_px, qtot, tiles, px: g.c })
    }

    /// Bytes of one image's packed input.
    fn image_bytes(&self, c: usize) -> Result<usize> {
        self.phases.len().checked_mul(self.lp).and_then(|v| v.checked_mul(c)).ok_or_else(overflow)
    }
}

/// Packs the images of `x` (`img_in` bytes apart, each `C x H x W` bytes, or `H x W x C` when
/// `nhwc`) into their channels-last phases in `dst` (`plan.image_bytes` each), padding with
/// `zp`: every row of every phase of every image is one task of one team job.
fn pack_images(g: &Geom, plan: &Plan, x: &[u8], img_in: usize, nhwc: bool, zp: u8, dst: &mut [u8]) -> Result<()> {
    let c = g.c;
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.pad[0], g.pad[1]);
    let row_bytes = plan.wq * c;
    let image_bytes = plan.phases.len() * plan.lp * c;
    if image_bytes == 0 || row_bytes == 0 {
        return Ok(());
    }
    // each task's row with its (image, phase, row) index
    let per_phase = (plan.lp * c).div_ceil(row_bytes);
    let count = (dst.len() / image_bytes)
        .checked_mul(plan.phases.len())
        .and_then(|v| v.checked_mul(per_phase))
        .ok_or_else(overflow)?;
    let mut rows = crate::ops::team::reserve_parts(OP, count)?;
    for (i, img) in dst.chunks_mut(image_bytes).enumerate() {
        for (p, phase) in img.chunks_mut(plan.lp * c).take(plan.phases.len()).enumerate() {
            rows.extend(phase.chunks_mut(row_bytes).enumerate().map(|(hs, row)| ((i, p, hs), row)));
        }
    }
    crate::ops::team::slices_mut(rows, |&(i, p, hs), out| {
        let (a, b) = plan.phases[p];
        let (ws_lo, ws_hi) = Phases::columns(g, plan.wq, b);
        let x = &x[i * img_in..(i + 1) * img_in];
        let hpad = hs * sh + a;
        if hs >= plan.hs || hpad < ph || hpad - ph >= g.h || ws_lo >= ws_hi {
            out.fill(zp);
            return;
        }
        let ih = hpad - ph;
        out[..ws_lo * c].fill(zp);
        out[ws_hi * c..].fill(zp);
        let iw0 = ws_lo * sw + b - pw;
        let n = ws_hi - ws_lo;
        let run = &mut out[ws_lo * c..ws_hi * c];
        if nhwc {
            let src = &x[(ih * g.w + iw0) * c..];
            if sw == 1 {
                run.copy_from_slice(&src[..n * c]);
            } else {
                for (k, px) in run.chunks_exact_mut(c).enumerate() {
                    px.copy_from_slice(&src[k * sw * c..k * sw * c + c]);
                }
            }
        } else {
            transpose_row(x, g.h * g.w, ih * g.w + iw0, sw, n, c, run);
        }
    });
    Ok(())
}

/// The row-major output-shaped `x` (`N x OC x OH x OW` bytes, `OC` a multiple of 16) as
/// channels-last bytes (a residual for the epilogue).
pub(super) fn to_channels_last(x: &[u8], g: &Geom) -> Result<AlignedBytes> {
    let (p, c) = (g.p(), g.oc);
    let image = p * c;
    assert!(c.is_multiple_of(16) && x.len() >= g.n * image);
    let mut out = AlignedBytes::try_new(OP, g.n * image, 0)?;
    // pieces of 64 pixels of one image
    const PIECE: usize = 64;
    let count = g.n.checked_mul(p.div_ceil(PIECE)).ok_or_else(overflow)?;
    let mut pieces = crate::ops::team::reserve_parts(OP, count)?;
    for (i, img) in out.as_mut_slice().chunks_mut(image.max(1)).enumerate() {
        pieces.extend(img.chunks_mut(PIECE * c).enumerate().map(|(k, run)| ((i, k), run)));
    }
    crate::ops::team::slices_mut(pieces, |&(i, k), run| {
        let n = run.len() / c;
        transpose_row(&x[i * image..(i + 1) * image], p, k * PIECE, 1, n, c, run);
    });
    Ok(out)
}

/// `run[k * c + ch] = x[ch * hw + base + k * sw]` for `k < n`, `ch < c`: one image row of a
/// channel-major input to channels-last, 16 x 16 byte blocks at a time where the stride is 1
/// (`c` a multiple of 16).
fn transpose_row(x: &[u8], hw: usize, base: usize, sw: usize, n: usize, c: usize, run: &mut [u8]) {
    let mut k0 = 0;
    #[cfg(target_arch = "x86_64")]
    if sw == 1 {
        while k0 + 16 <= n {
            for c0 in (0..c).step_by(16) {
                // SAFETY: SSE2 is part of x86-64; the loads read `x[(c0 + i) * hw + base + k0..+16]`
                // (pixels `k0..k0 + 16 <= n` of the row, inside the plane), the stores write
                // `run[(k0 + i) * c + c0..+16]` (`c0 + 16 <= c`, a multiple of 16).
                unsafe { transpose16(x.as_ptr().add(c0 * hw + base + k0), hw, run.as_mut_ptr().add(k0 * c + c0), c) };
            }
            k0 += 16;
        }
    }
    for k in k0..n {
        for ch in 0..c {
            run[k * c + ch] = x[ch * hw + base + k * sw];
        }
    }
}

/// Transposes 16 x 16 bytes: `dst[i * ld_dst + j] = src[j * ld_src + i]`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn transpose16(src: *const u8, ld_src: usize, dst: *mut u8, ld_dst: usize) {
    use std::arch::x86_64::*;
    let r: [__m128i; 16] = std::array::from_fn(|i| _mm_loadu_si128(src.add(i * ld_src) as *const __m128i));
    let mut a = [_mm_setzero_si128(); 16];
    for i in 0..8 {
        a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    let mut b = [_mm_setzero_si128(); 16];
    for i in 0..4 {
        b[4 * i] = _mm_unpacklo_epi16(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm_unpackhi_epi16(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm_unpacklo_epi16(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm_unpackhi_epi16(a[4 * i + 1], a[4 * i + 3]);
    }
    let mut c = [_mm_setzero_si128(); 16];
    for h in 0..2 {
        for i in 0..4 {
            c[8 * h + 2 * i] = _mm_unpacklo_epi32(b[8 * h + i], b[8 * h + 4 + i]);
            c[8 * h + 2 * i + 1] = _mm_unpackhi_epi32(b[8 * h + i], b[8 * h + 4 + i]);
        }
    }
    for k in 0..8 {
        _mm_storeu_si128(dst.add(2 * k * ld_dst) as *mut __m128i, _mm_unpacklo_epi64(c[k], c[8 + k]));
        _mm_storeu_si128(dst.add((2 * k + 1) * ld_dst) as *mut __m128i, _mm_unpackhi_epi64(c[k], c[8 + k]));
    }
}

/// The output buffer shared by the items (each writes its own pixels x channels).
#[derive(Clone, Copy)]
struct OutPtr(*mut u8);
// SAFETY: the items write disjoint (pixel, channel) ranges of the output (see `conv`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn at(&self, off: usize) -> *mut u8 {
        self.0.wrapping_add(off)
    }
}

thread_local! {
    /// The packed-input scratch of the calling thread, reused across calls (taken out while a
    /// convolution runs).
    static PACKED_INPUT: std::cell::Cell<AlignedBytes> = std::cell::Cell::new(AlignedBytes::default());
}

/// The bytes of B tiles an item cycles through per pixel tile (it stays in L2).
const B_SPAN: usize = 256 << 10;

/// The largest packed input kept between calls.
const SCRATCH_KEEP: usize = 64 << 20;

/// Runs the convolution of `x` (`N x C x H x W` bytes, or `N x H x W x C` when `nhwc_in`) into
/// `out` (`N x OH x OW x OC` bytes, channels-last), writing every byte of it when it returns
/// `Ok` (so `out` may start uninitialised). Requires [`available`] and [`applies`].
#[allow(clippy::too_many_arguments)]
pub(super) fn conv(
    g: &Geom,
    x: &[u8],
    nhwc_in: bool,
    pw: &AmxWeight,
    rq: &RequantParams,
    zp: u8,
    residual: Option<(&[u8], &add::Params)>,
    out: &mut [MaybeUninit<u8>],
) -> Result<()> {
    assert!(available() && applies(g));
    if let Some((r, _)) = residual {
        assert!(r.len() >= g.n * g.oc * g.p());
    }
    let plan = Plan::new(g)?;
    let img_in = g.c * g.h * g.w;
    // the epilogue reads 32 channels' parameters at a time
    let rq = rq.clone().padded(g.oc.next_multiple_of(TJ));
    assert!(out.len() >= g.n * g.oc * g.p() && x.len() >= g.n * img_in);
    assert!(pw.w.len() >= g.oc.next_multiple_of(TJ) * pw.taps * g.c && pw.chunks * KC == g.c);
    // a channels-last input of a 1x1, stride-1, unpadded convolution is the operand as it is;
    // the images whose last pixel tile would read past the input (the last one, or all of them
    // when an image is smaller than a tile) are copied, each into a slot with that slack
    // (when it starts on a cache line: misaligned tile rows would cost more than the copy)
    let in_place = nhwc_in
        && g.kh == 1
        && g.kw == 1
        && g.stride == [1, 1]
        && g.pad == [0, 0]
        && (x.as_ptr() as usize).is_multiple_of(CACHE_LINE);
    if in_place {
        let image = g.h * g.w * g.c;
        let span = plan.tiles * TP * g.c;
        let fit = (0..g.n).take_while(|&i| i * img_in + span <= x.len()).count();
        let split = fit * g.p() * g.oc;
        let (head, rest) = out.split_at_mut(split);
        run(g, &plan, x, img_in, fit, pw, &rq, residual, head, None);
        if fit < g.n {
            let mut tail = AlignedBytes::try_new(OP, span.checked_mul(g.n - fit).ok_or_else(overflow)?, zp)?;
            for (k, slot) in tail.as_mut_slice().chunks_mut(span).enumerate() {
                let i = fit + k;
                slot[..image].copy_from_slice(&x[i * img_in..i * img_in + image]);
            }
            run(
                g,
                &plan,
                tail.as_slice(),
                span,
                g.n - fit,
                pw,
                &rq,
                residual.map(|(r, p)| (&r[split..], p)),
                rest,
                None,
            );
        }
        return Ok(());
    }
    let image_bytes = plan.image_bytes(g.c)?;
    let total = image_bytes.checked_mul(g.n).ok_or_else(overflow)?;
    let mut scratch = PACKED_INPUT.with(|c| c.take());
    if scratch.len() < total {
        drop(std::mem::take(&mut scratch));
        scratch = AlignedBytes::try_new(OP, total, 0)?;
    }
    {
        let xp = &mut scratch.as_mut_slice()[..total];
        pack_images(g, &plan, x, img_in, nhwc_in, zp, xp)?;
        run(g, &plan, xp, image_bytes, g.n, pw, &rq, residual, out, None);
    }
    if scratch.len() <= SCRATCH_KEEP {
        PACKED_INPUT.with(|c| c.set(scratch));
    }
    Ok(())
}

/// Pixels per image of the operand [`conv_operand`] reads for `g` (every tile's reads, at every
/// tap's shift, start inside).
pub(super) fn operand_pixels(g: &Geom) -> Result<usize> {
    Ok(Plan::new(g)?.lp)
}

/// Runs `g` (stride 1, no padding, one 64-byte chunk per tap) on an operand packed by the
/// caller: `n` images `image_bytes` apart in `xp`, each [`operand_pixels`] pixel rows `px`
/// bytes apart, whose 64-byte A rows may overlap the next pixels' (the weights are zero there),
/// with 64 bytes of slack at the end (see `conv2d_s2d.rs`); into `out` (channels-last), writing
/// every byte of it. Requires [`available`].
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_operand(
    g: &Geom,
    xp: &[u8],
    image_bytes: usize,
    px: usize,
    pw: &AmxWeight,
    rq: &RequantParams,
    residual: Option<(&[u8], &add::Params)>,
    out: &mut [MaybeUninit<u8>],
) -> Result<()> {
    assert!(available() && g.c == KC && pw.chunks == 1 && g.stride == [1, 1] && g.pad == [0, 0] && px <= KC);
    let mut plan = Plan::new(g)?;
    plan.px = px;
    assert!(image_bytes >= plan.lp * px && xp.len() >= g.n * image_bytes + KC);
    let rq = rq.clone().padded(g.oc.next_multiple_of(TJ));
    run(g, &plan, xp, image_bytes, g.n, pw, &rq, residual, out, None);
    Ok(())
}

/// Runs `g` (a 1x1 convolution over the im2col columns of `gather`'s images, see
/// `conv2d_im2col.rs`) with each pixel tile's A rows gathered into a stack buffer by the item
/// that multiplies them (so the columns never go through memory), into `out` (channels-last),
/// writing every byte of it. Requires [`available`].
pub(super) fn conv_gather(
    g: &Geom,
    gather: &Gather<'_>,
    pw: &AmxWeight,
    rq: &RequantParams,
    residual: Option<(&[u8], &add::Params)>,
    out: &mut [MaybeUninit<u8>],
) -> Result<()> {
    assert!(available() && g.kh == 1 && g.kw == 1 && g.c == gather.kp && gather.kp <= MAX_GATHER);
    assert!(gather.padded.len() >= g.n * gather.image + 64);
    let plan = Plan::new(g)?;
    // the epilogue reads 32 channels' parameters at a time
    let rq = rq.clone().padded(g.oc.next_multiple_of(TJ));
    run(g, &plan, gather.padded, gather.image, g.n, pw, &rq, residual, out, Some(gather));
    Ok(())
}

/// The window rows of the im2col columns of a small-channel convolution, gathered per pixel
/// tile from zero-point-padded channels-last images (built by `conv2d_im2col.rs`).
pub(super) struct Gather<'a> {
    /// The padded images, `image` bytes apart, with 64 bytes of slack at the end.
    pub padded: &'a [u8],
    pub image: usize,
    /// Padded row length in pixels, and channels.
    pub wp: usize,
    pub c: usize,
    /// Window, stride and dilation of the original convolution.
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub dil: [usize; 2],
    /// Output row length, and the products per output `k` padded to `kp`.
    pub ow: usize,
    pub k: usize,
    pub kp: usize,
    pub zp: u8,
}

/// The largest padded window a gathered tile holds (`TP` rows of it on the stack).
pub(super) const MAX_GATHER: usize = 1024;

impl Gather<'_> {
    /// Writes the columns of pixels `q0..q0 + TP` (flat output index, those below `qtot`) of
    /// image `image` into `buf` (`TP` rows of `kp` bytes).
    fn fill(&self, image: usize, q0: usize, qtot: usize, buf: &mut [u8]) {
        let (c, kp, run) = (self.c, self.kp, self.kw * self.c);
        let src = &self.padded[image * self.image..];
        for (r, dst) in buf.chunks_exact_mut(kp).take(TP).enumerate() {
            let q = q0 + r;
            if q >= qtot {
                break;
            }
            let (oh, ow) = (q / self.ow, q % self.ow);
            for i in 0..self.kh {
                let base = ((oh * self.stride[0] + i * self.dil[0]) * self.wp + ow * self.stride[1]) * c;
                let at = i * run;
                if self.dil[1] == 1 {
                    // one window row as a fixed move while it stays inside the pixel's row (the
                    // spill is overwritten by the next window row or the padding fill)
                    if run <= 32 && at + 32 <= kp {
                        fixed_move::<32>(&mut dst[at..], &src[base..]);
                    } else if run <= 64 && at + 64 <= kp {
                        fixed_move::<64>(&mut dst[at..], &src[base..]);
                    } else {
                        dst[at..at + run].copy_from_slice(&src[base..base + run]);
                    }
                } else {
                    for j in 0..self.kw {
                        let b = base + j * self.dil[1] * c;
                        dst[at + j * c..at + (j + 1) * c].copy_from_slice(&src[b..b + c]);
                    }
                }
            }
            dst[self.k..].fill(self.zp);
        }
    }
}

/// Copies the first `N` bytes of `src` to `dst` as one fixed-size move (a register copy, not a
/// `memcpy` call).
#[inline(always)]
fn fixed_move<const N: usize>(dst: &mut [u8], src: &[u8]) {
    let v: [u8; N] = src[..N].try_into().expect("N bytes");
    let d: &mut [u8; N] = (&mut dst[..N]).try_into().expect("N bytes");
    *d = v;
}

/// The tiles of `n` images whose operands start `image_bytes` apart in `xp` (each holding
/// `plan.lp` pixels per phase, or the in-place input; or, with `gather`, the padded images the
/// columns are gathered from), into `out` (`n` channels-last images), with the quantized add
/// of `residual` (laid out as `out`) in the epilogue when given.
#[allow(clippy::too_many_arguments)]
fn run(
    g: &Geom,
    plan: &Plan,
    xp: &[u8],
    image_bytes: usize,
    n: usize,
    pw: &AmxWeight,
    rq: &RequantParams,
    residual: Option<(&[u8], &add::Params)>,
    out: &mut [MaybeUninit<u8>],
    gather: Option<&Gather<'_>>,
) {
    if n == 0 {
        return;
    }
    let jblocks = g.oc.div_ceil(TJ);
    if gather.is_none() {
        // every tile's rows lie in its image's operand: the last tile's last row at the largest
        // shift (gathered rows are read from the item's own buffer)
        let last_row =
            (plan.tiles * TP - 1 + plan.tap_px.iter().copied().max().unwrap_or(0)) * plan.px + pw.chunks * KC;
        assert!((n - 1) * image_bytes + last_row <= xp.len());
    }
    assert!(out.len() >= n * g.p() * g.oc);
    if let Some((r, _)) = residual {
        assert!(r.len() >= n * g.p() * g.oc);
    }
    let res = residual.map(|(r, p)| (r.as_ptr() as usize, *p));
    // finite multipliers and biases below 1e38 make every requantised value a number (at worst
    // an infinity, which the clamp handles), so the epilogue can skip its NaN test
    let nan_free = rq.multiplier.iter().all(|m| m.is_finite()) && rq.bias_term.iter().all(|b| b.abs() < 1e38);
    let threads = crate::ops::team::threads();
    // items: (image, run of output-channel blocks, run of pixel tiles), about four per thread;
    // an item walks its pixel tiles and, for each, all its channel blocks (so it writes whole
    // output rows while they are in cache), so the B tiles of its blocks are read once per
    // pixel tile: as many blocks as keep them within B_SPAN bytes (L2)
    let steps = plan.tap_px.len() * pw.chunks;
    let jper = (B_SPAN / (steps * 2 * 16 * KC)).clamp(1, jblocks);
    let jitems = jblocks.div_ceil(jper);
    let titems = (4 * threads).div_ceil(n * jitems).min(plan.tiles).max(1);
    let tper = plan.tiles.div_ceil(titems);
    let titems = plan.tiles.div_ceil(tper);
    let dst = OutPtr(out.as_mut_ptr() as *mut u8);
    let src = xp.as_ptr() as usize;
    crate::ops::team::for_each(n * jitems * titems, |it| {
        let (i, rest) = (it / (jitems * titems), it % (jitems * titems));
        let (jb, tb) = (rest / titems, rest % titems);
        let (j0, j1) = (jb * jper, ((jb + 1) * jper).min(jblocks));
        let (t0, t1) = (tb * tper, ((tb + 1) * tper).min(plan.tiles));
        // SAFETY: `available()` (asserted by `conv`) means AMX-INT8, AVX-512 F/BW/VL and the
        // tile state granted; every tile row read lies in the image's operand (asserted above);
        // the item writes pixels of tiles `t0..t1` and channels of blocks `j0..j1` of image `i`,
        // which no other item writes; it reads the residual at the same places (asserted as
        // long as the output).
        unsafe {
            amx::item(
                (src as *const u8).add(i * image_bytes),
                g,
                plan,
                pw,
                rq,
                nan_free,
                (j0, j1),
                (t0, t1),
                res.map(|(r, p)| ((r as *const u8).add(i * g.p() * g.oc), p)),
                dst.at(i * g.p() * g.oc),
                gather.map(|gt| (gt, i)),
            )
        };
    });
}

#[cfg(target_arch = "x86_64")]
pub(super) mod amx {
    use super::{add, AmxWeight, Gather, Geom, Plan, RequantParams, KC, MAX_GATHER, TJ, TP};
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// The 64-byte tile configuration of `ldtilecfg` (palette 1).
    #[repr(C, align(64))]
    pub(crate) struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// Eight tiles of 16 rows x 64 bytes (palette 1 has eight; the other entries must be 0).
    pub(crate) const CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
    };

    /// One 64-byte reduction chunk of a 2x2 block: the A tiles at `a0` and `a1` (16 rows each,
    /// `lda` bytes apart) times the B tiles at `b0` and `b1` (16 rows of 64 bytes), added to the
    /// accumulators `tmm0` (a0 x b0), `tmm1` (a0 x b1), `tmm2` (a1 x b0) and `tmm3` (a1 x b1).
    ///
    /// # Safety
    /// The tile configuration [`CONFIG`] is loaded and every tile row read lies in memory.
    #[inline(always)]
    pub(crate) unsafe fn step_2x2(a0: *const u8, a1: *const u8, lda: usize, b0: *const u8, b1: *const u8) {
        asm!(
            "tileloadd tmm4, [{a0} + {lda}*1]",
            "tileloadd tmm6, [{b0} + {ldb}*1]",
            "tileloadd tmm5, [{a1} + {lda}*1]",
            "tdpbusd tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {ldb}*1]",
            "tdpbusd tmm2, tmm5, tmm6",
            "tdpbusd tmm1, tmm4, tmm7",
            "tdpbusd tmm3, tmm5, tmm7",
            a0 = in(reg) a0,
            a1 = in(reg) a1,
            b0 = in(reg) b0,
            b1 = in(reg) b1,
            lda = in(reg) lda,
            ldb = in(reg) 64usize,
            options(nostack, readonly)
        );
    }

    /// Stores the accumulators `tmm0..tmm3` of [`step_2x2`] as one 32 x 32 block of i32 sums
    /// at `p` (row-major, rows of 32).
    ///
    /// # Safety
    /// The tile configuration is loaded and `p` points to 4096 writable bytes.
    #[inline(always)]
    pub(crate) unsafe fn store_2x2(p: *mut i32) {
        let p = p as *mut u8;
        asm!(
            "tilestored [{p} + {ld}*1], tmm0",
            "tilestored [{p1} + {ld}*1], tmm1",
            "tilestored [{p2} + {ld}*1], tmm2",
            "tilestored [{p3} + {ld}*1], tmm3",
            p = in(reg) p,
            p1 = in(reg) p.add(64),
            p2 = in(reg) p.add(16 * TJ * 4),
            p3 = in(reg) p.add(16 * TJ * 4 + 64),
            ld = in(reg) TJ * 4,
            options(nostack)
        );
    }

    /// One item: pixel tiles `t0..t1` x output-channel blocks `j0..j1` (of [`TJ`]) of one image
    /// (`a`: its operand, `out`: its channels-last output).
    ///
    /// Software-pipelined: the sums of a tile step are stored to one of two stack buffers, and
    /// their epilogue (AVX-512) runs in slices between the tile instructions of the next step,
    /// so the vector units requantise while the tile unit multiplies (a step costs about the
    /// larger of the two instead of their sum).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn item(
        a: *const u8,
        g: &Geom,
        plan: &Plan,
        pw: &AmxWeight,
        rq: &RequantParams,
        nan_free: bool,
        (j0, j1): (usize, usize),
        (t0, t1): (usize, usize),
        residual: Option<(*const u8, add::Params)>,
        out: *mut u8,
        gather: Option<(&Gather<'_>, usize)>,
    ) {
        let c = plan.px;
        // the gathered A rows of the current pixel tile (when gathering; zeroed once, so the
        // rows past the last pixel hold bytes too)
        let mut rows_buf = std::mem::MaybeUninit::<Gathered>::uninit();
        let rows_buf: &mut [u8] = match gather {
            Some(_) => {
                let p = rows_buf.as_mut_ptr() as *mut u8;
                std::ptr::write_bytes(p, 0, TP * c);
                std::slice::from_raw_parts_mut(p, TP * c)
            }
            None => &mut [],
        };
        let tile_bytes = 16 * KC;
        // B tiles of one 16-channel block: taps x chunks tiles
        let block_bytes = pw.taps * pw.chunks * tile_bytes;
        let steps = plan.tap_px.len() * pw.chunks;
        // epilogue rows per tile step of the next tile (all of them spread over its steps)
        let per_step = TP.div_ceil(steps.max(1));
        let epi = TileEpilogue { g, plan, rq, nan_free, residual, out };
        let mut acc = [Acc([0i32; TP * TJ]), Acc([0i32; TP * TJ])];
        let mut pending: Option<Rows> = None;
        let mut cur = 0;
        asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
        for t in t0..t1 {
            let q0 = t * TP;
            // the A rows of this pixel tile: in the operand, or gathered (a 1x1 plan: tap 0)
            let a_tile = match gather {
                Some((gt, image)) => {
                    gt.fill(image, q0, plan.qtot, rows_buf);
                    rows_buf.as_ptr()
                }
                None => a.add(q0 * c),
            };
            for jb in j0..j1 {
                let w0 = pw.w.as_slice().as_ptr().add(2 * jb * block_bytes);
                let w1 = w0.add(block_bytes);
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
                let mut wo = 0;
                for &tp in &plan.tap_px {
                    let a0 = a_tile.add(tp * c);
                    let a1 = a0.add(16 * c);
                    for ch in 0..pw.chunks {
                        step_2x2(a0.add(ch * KC), a1.add(ch * KC), c, w0.add(wo), w1.add(wo));
                        wo += tile_bytes;
                        if let Some(rows) = pending.as_mut() {
                            epi.rows(&acc[cur ^ 1].0, rows, per_step);
                        }
                    }
                }
                if t + 1 < t1 {
                    epi.prefetch_residual(q0 + TP, jb * TJ);
                }
                if let Some(rows) = pending.as_mut() {
                    epi.rows(&acc[cur ^ 1].0, rows, TP);
                }
                store_2x2(acc[cur].0.as_mut_ptr());
                pending = Some(epi.start(q0, jb * TJ));
                cur ^= 1;
            }
        }
        asm!("tilerelease", options(nostack, nomem));
        if let Some(rows) = pending.as_mut() {
            epi.rows(&acc[cur ^ 1].0, rows, TP);
        }
    }

    /// `1.5 * 2^23`: adding it to a float `v` with `|v| < 2^22` rounds `v` to an integer `k`
    /// (to nearest, ties to even: the spacing of floats in `[2^23, 2^24)` is 1 and `MAGIC` is
    /// even) and leaves `k` in the low bits of the sum's pattern, `MAGIC_BITS + k`, so the sum's
    /// low byte is `k` modulo 256. One add replaces round-and-convert. (The zero point is added
    /// after rounding, to the bytes: rounding `v + zp` would break ties the other way when `zp`
    /// is odd. Clamping to integer bounds commutes with rounding, and larger `|v|` lands beyond
    /// the bounds on the right side.)
    const MAGIC: f32 = 12_582_912.0;

    /// `quantized_add` of `x` (16 lanes of `MAGIC + k - zp`, `k` the requantised byte) and the
    /// bytes `y`: `fma(sa, k, pa) + fma(sb, y, pb)`, ReLU'd when fused, `round_half_even(s *
    /// inv_out)` clamped to `-zo..=255 - zo`, as `MAGIC + value` (the caller adds `zo` to the
    /// bytes); the scalar kernel's operations, each rounded once, NaN becoming 0 as there.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn add_residual(x: __m512, zp: f32, y: __m128i, p: &add::Params) -> __m512 {
        // `MAGIC + k - zp - (MAGIC - zp)`: integers below 2^24, exact
        let xf = _mm512_sub_ps(x, _mm512_set1_ps(MAGIC - zp));
        let yf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(y));
        let a = _mm512_fmadd_ps(_mm512_set1_ps(p.sa), xf, _mm512_set1_ps(p.pa));
        let b = _mm512_fmadd_ps(_mm512_set1_ps(p.sb), yf, _mm512_set1_ps(p.pb));
        let mut s = _mm512_add_ps(a, b);
        if p.relu {
            s = _mm512_max_ps(s, _mm512_setzero_ps());
        }
        let v = _mm512_add_ps(_mm512_mul_ps(s, _mm512_set1_ps(p.inv_out)), _mm512_set1_ps(MAGIC));
        _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(MAGIC - p.zo)), _mm512_set1_ps(MAGIC + 255.0 - p.zo))
    }

    /// The gathered A rows of a pixel tile, 64-byte aligned for `tileloadd`.
    #[repr(C, align(64))]
    struct Gathered([u8; TP * MAX_GATHER]);

    /// The 32 x 32 i32 sums of one tile step, 64-byte aligned for `tilestored`.
    #[repr(C, align(64))]
    struct Acc([i32; TP * TJ]);

    /// What the epilogue of an item needs.
    struct TileEpilogue<'a> {
        g: &'a Geom,
        plan: &'a Plan,
        rq: &'a RequantParams,
        /// No bias or multiplier can make a requantised value NaN (the NaN test is skipped).
        nan_free: bool,
        residual: Option<(*const u8, add::Params)>,
        out: *mut u8,
    }

    /// The rows of a tile step still to requantise: row `r` (its pixel at `(oh, ow)` of the
    /// flat index) up to `end`, channels `j..j + 32`.
    struct Rows {
        j: usize,
        r: usize,
        end: usize,
        oh: usize,
        ow: usize,
    }

    impl TileEpilogue<'_> {
        /// The rows of the step at pixel `q0`, channel `j`.
        fn start(&self, q0: usize, j: usize) -> Rows {
            let end = TP.min(self.plan.qtot - q0);
            Rows { j, r: 0, end, oh: q0 / self.plan.wq, ow: q0 % self.plan.wq }
        }

        /// Requantises up to `n` more rows of `rows` (the sums in `acc`) and stores the real
        /// pixels' channels below `OC` channels-last; with a residual, the stored byte is the
        /// quantized add of the requantised byte and the residual's byte at the same place (the
        /// f32 operations of `quantized_add`'s kernel in the same order).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn rows(&self, acc: &[i32; TP * TJ], rows: &mut Rows, n: usize) {
            let (g, rq) = (self.g, self.rq);
            let stop = rows.end.min(rows.r + n);
            if rows.r >= stop {
                return;
            }
            let j = rows.j;
            let live = (g.oc - j).min(TJ);
            let mask: u32 = if live == TJ { u32::MAX } else { (1u32 << live) - 1 };
            // rounded and clamped as `MAGIC + byte - zp` (see `MAGIC`; the bounds are integers)
            let lo = _mm512_set1_ps(MAGIC + (rq.lo - rq.out_zp) as f32);
            let hi = _mm512_set1_ps(MAGIC + (rq.hi - rq.out_zp) as f32);
            let magic = _mm512_set1_ps(MAGIC);
            // the zero point added to the bytes: the requantised one, or the add's output one
            let zp_bytes = _mm256_set1_epi8(match self.residual.as_ref() {
                Some((_, p)) => p.zo as i32 as u8 as i8,
                None => rq.out_zp as u8 as i8,
            });
            let azp = _mm512_set1_epi32(rq.a_zp);
            // the parameters are padded to a multiple of 32 channels
            let zsum =
                [0, 16].map(|v| _mm512_mullo_epi32(azp, _mm512_loadu_si512(rq.b_sums.as_ptr().add(j + v) as *const _)));
            let bias = [0, 16].map(|v| _mm512_loadu_ps(rq.bias_term.as_ptr().add(j + v)));
            let mult = [0, 16].map(|v| _mm512_loadu_ps(rq.multiplier.as_ptr().add(j + v)));
            let requant = |s: __m512i, v: usize| {
                let f =
                    _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, zsum[v])), bias[v]), mult[v]);
                // NaN → 0 (as `NaN as i64`), then clamp and round half to even
                let f = if self.nan_free { f } else { _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(f, f), f) };
                // round_half_even(f) clamped to `lo - zp..=hi - zp`, as `MAGIC + value`
                _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(f, magic), lo), hi)
            };
            for r in rows.r..stop {
                if rows.ow < g.ow {
                    let at = (rows.oh * g.ow + rows.ow) * g.oc + j;
                    let row = acc.as_ptr().add(r * TJ);
                    let mut q = [
                        requant(_mm512_load_si512(row as *const _), 0),
                        requant(_mm512_load_si512(row.add(16) as *const _), 1),
                    ];
                    if let Some((res, p)) = self.residual.as_ref() {
                        let y = _mm256_maskz_loadu_epi8(mask, res.add(at) as *const i8);
                        let zp = rq.out_zp as f32;
                        q[0] = add_residual(q[0], zp, _mm256_castsi256_si128(y), p);
                        q[1] = add_residual(q[1], zp, _mm256_extracti128_si256::<1>(y), p);
                    }
                    // the low byte of `MAGIC + v` is `v` modulo 256; plus the zero point, the byte
                    let bytes = _mm256_add_epi8(
                        _mm256_inserti128_si256::<1>(
                            _mm256_castsi128_si256(_mm512_cvtepi32_epi8(_mm512_castps_si512(q[0]))),
                            _mm512_cvtepi32_epi8(_mm512_castps_si512(q[1])),
                        ),
                        zp_bytes,
                    );
                    _mm256_mask_storeu_epi8(self.out.add(at) as *mut i8, mask, bytes);
                }
                rows.ow += 1;
                if rows.ow == self.plan.wq {
                    rows.ow = 0;
                    rows.oh += 1;
                }
            }
            rows.r = stop;
        }

        /// Prefetches the residual rows of the step at pixel `q0`, channel `j` (one pixel tile
        /// ahead of the step being multiplied), so their lines arrive while the tile unit works.
        /// (Prefetching the output rows for writing as well was measured slower: 1.3 → 2.2 ms
        /// on ResNet-50's first residual convolution at batch 8.)
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn prefetch_residual(&self, q0: usize, j: usize) {
            let Some((res, _)) = self.residual.as_ref() else {
                return;
            };
            let Rows { end, mut oh, mut ow, .. } = self.start(q0, j);
            for _ in 0..end {
                if ow < self.g.ow {
                    _mm_prefetch::<_MM_HINT_T0>(res.add((oh * self.g.ow + ow) * self.g.oc + j) as *const i8);
                }
                ow += 1;
                if ow == self.plan.wq {
                    ow = 0;
                    oh += 1;
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `conv` into a buffer filled with `poison` first.
    fn run_poisoned(g: &Geom, x: &[u8], nhwc: bool, w: &[i8], residual: Option<&[u8]>, poison: u8) -> Vec<u8> {
        let pw = AmxWeight::new(w, g).unwrap();
        let ws: Vec<f32> = (0..g.oc).map(|j| 0.002 + (j % 5) as f32 * 1e-3).collect();
        let bias: Vec<f32> = (0..g.oc).map(|j| (j % 7) as f32 * 0.1 - 0.3).collect();
        let rq = RequantParams::new(0.02, 120, &ws, pw.sums.clone(), Some(&bias), 0.05, 64, residual.is_none());
        let p = add::Params { sa: 0.05, pa: -3.2, sb: 0.04, pb: -4.0, inv_out: 1.0 / 0.06, zo: 10.0, relu: true };
        let mut out = vec![MaybeUninit::new(poison); g.n * g.p() * g.oc];
        conv(g, x, nhwc, &pw, &rq, 120, residual.map(|r| (r, &p)), &mut out).unwrap();
        // SAFETY: `MaybeUninit<u8>` initialised with `poison` (and possibly overwritten)
        out.into_iter().map(|b| unsafe { b.assume_init() }).collect()
    }

    /// Runs the gathered (im2col) convolution of a small-channel `g` into a buffer filled with
    /// `poison` first.
    fn run_gathered(g: &Geom, x: &[u8], nhwc: bool, w: &[i8], poison: u8) -> Vec<u8> {
        let pw = super::super::conv2d_im2col::weight(w, g).unwrap();
        let ga = super::super::conv2d_im2col::geometry(g);
        let ws: Vec<f32> = (0..g.oc).map(|j| 0.002 + (j % 5) as f32 * 1e-3).collect();
        let rq = RequantParams::new(0.02, 120, &ws, pw.sums.clone(), None, 0.05, 64, false);
        let (padded, image) = super::super::conv2d_im2col::padded_images(g, x, nhwc, 120).unwrap();
        let gather = super::super::conv2d_im2col::gather(g, &padded, image, 120);
        let mut out = vec![MaybeUninit::new(poison); g.n * g.p() * g.oc];
        conv_gather(&ga, &gather, &pw, &rq, None, &mut out).unwrap();
        // SAFETY: `MaybeUninit<u8>` initialised with `poison` (and possibly overwritten)
        out.into_iter().map(|b| unsafe { b.assume_init() }).collect()
    }

    /// Runs the space-to-depth convolution of a small-channel `g` (see `conv2d_s2d.rs`) into a
    /// buffer filled with `poison` first.
    fn run_s2d(g: &Geom, x: &[u8], nhwc: bool, w: &[i8], poison: u8) -> Vec<u8> {
        use super::super::conv2d_s2d;
        let pw = conv2d_s2d::weight(w, g).unwrap();
        let ws: Vec<f32> = (0..g.oc).map(|j| 0.002 + (j % 5) as f32 * 1e-3).collect();
        let rq = RequantParams::new(0.02, 120, &ws, pw.sums.clone(), None, 0.05, 64, false);
        let (xp, image) = conv2d_s2d::pack(g, x, nhwc, 120).unwrap();
        let px = g.c * g.stride[0] * g.stride[1];
        let mut out = vec![MaybeUninit::new(poison); g.n * g.p() * g.oc];
        conv_operand(&conv2d_s2d::geometry(g), xp.as_slice(), image, px, &pw, &rq, None, &mut out).unwrap();
        // SAFETY: `MaybeUninit<u8>` initialised with `poison` (and possibly overwritten)
        out.into_iter().map(|b| unsafe { b.assume_init() }).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The space-to-depth convolution (the stems' path) equals the gathered one (which the
        /// quant suite checks against the reference) byte for byte, and writes every output
        /// byte: every stride and window it takes, both input layouts, row-major strides with
        /// their own fixed moves (1..4) and the byte-by-byte one (5).
        #[test]
        fn space_to_depth_conv_equals_gathered(n in 1usize..3, c in 1usize..8, oc in 1usize..40, h in 1usize..20,
                                               w in 1usize..20, kh in 1usize..8, kw in 1usize..8, sh in 1usize..4,
                                               sw in 1usize..6, ph in 0usize..4, pw in 0usize..4, nhwc: bool,
                                               seed: u64) {
            if !available() {
                return Ok(());
            }
            let (h, w) = (h.max(kh), w.max(kw));
            // as many channels as keep a kernel row of the space-to-depth image within 64 bytes
            // (at least one: `sh sw ceil(kW / sw) <= 30` here)
            let c = c.min(KC / (sh * sw * kw.div_ceil(sw))).max(1);
            let (oh, ow) = ((h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1);
            let g = Geom { n, c, h, w, oc, kh, kw, oh, ow, stride: [sh, sw], pad: [ph, pw], dil: [1, 1], groups: 1 };
            // both apply to every such geometry unless channels-last outputs are switched off
            if !(super::super::conv2d_s2d::applies(&g) && super::super::conv2d_im2col::applies(&g)) {
                prop_assert!(!super::super::channels_last::enabled());
                return Ok(());
            }
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; (state >> 24) as u8 };
            let x: Vec<u8> = (0..n * c * h * w).map(|_| next()).collect();
            let wt: Vec<i8> = (0..oc * c * kh * kw).map(|_| next() as i8).collect();
            let want = run_gathered(&g, &x, nhwc, &wt, 0xa5);
            prop_assert_eq!(&run_s2d(&g, &x, nhwc, &wt, 0x5a), &want);
            prop_assert_eq!(&run_s2d(&g, &x, nhwc, &wt, 0xa5), &want);
        }

        /// The gathered convolution (the 3-channel stem's path) writes every output byte too.
        #[test]
        fn gathered_conv_writes_every_output_byte(n in 1usize..3, c in 1usize..8, oc in 1usize..40, h in 1usize..12,
                                                  w in 1usize..12, k in 1usize..8, s in 1usize..3, d in 1usize..3,
                                                  nhwc: bool, seed: u64) {
            if !available() {
                return Ok(());
            }
            let span = d * (k - 1) + 1;
            let pad = k / 2;
            let (h, w) = (h.max(span), w.max(span));
            let (oh, ow) = ((h + 2 * pad - span) / s + 1, (w + 2 * pad - span) / s + 1);
            let g = Geom { n, c, h, w, oc, kh: k, kw: k, oh, ow, stride: [s, s], pad: [pad, pad], dil: [d, d], groups: 1 };
            prop_assume!(super::super::conv2d_im2col::applies(&g));
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; (state >> 24) as u8 };
            let x: Vec<u8> = (0..n * c * h * w).map(|_| next()).collect();
            let wt: Vec<i8> = (0..oc * c * k * k).map(|_| next() as i8).collect();
            prop_assert_eq!(run_gathered(&g, &x, nhwc, &wt, 0xa5), run_gathered(&g, &x, nhwc, &wt, 0x5a));
        }

        /// `conv` writes every output byte (what lets `quantized_conv2d` skip zero-filling the
        /// output): runs into buffers poisoned with different bytes agree everywhere.
        #[test]
        fn conv_writes_every_output_byte(n in 1usize..3, chunks in 1usize..3, oc in 1usize..70, h in 1usize..11,
                                         w in 1usize..11, k in prop::sample::select(vec![1usize, 3]), s in 1usize..3,
                                         pad in 0usize..2, nhwc: bool, residual: bool, seed: u64) {
            if !available() {
                return Ok(());
            }
            let (h, w) = (h.max(k), w.max(k));
            let c = chunks * KC;
            let (oh, ow) = ((h + 2 * pad - k) / s + 1, (w + 2 * pad - k) / s + 1);
            let g = Geom { n, c, h, w, oc, kh: k, kw: k, oh, ow, stride: [s, s], pad: [pad, pad], dil: [1, 1], groups: 1 };
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; (state >> 24) as u8 };
            let x: Vec<u8> = (0..n * c * h * w).map(|_| next()).collect();
            let wt: Vec<i8> = (0..oc * c * k * k).map(|_| next() as i8).collect();
            let r: Vec<u8> = (0..n * g.p() * oc).map(|_| next()).collect();
            let res = residual.then_some(&r[..]);
            let a = run_poisoned(&g, &x, nhwc, &wt, res, 0xa5);
            let b = run_poisoned(&g, &x, nhwc, &wt, res, 0x5a);
            prop_assert_eq!(a, b);
        }
    }
}
