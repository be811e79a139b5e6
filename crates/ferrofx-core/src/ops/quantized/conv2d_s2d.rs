//! Small-channel convolutions on the AMX tiles by space-to-depth: the 3-channel stems of the
//! ImageNet networks (ResNet's 7x7 stride 2, MobileNet's and EfficientNet's 3x3 stride 2) with
//! no per-pixel gather.
//!
//! The AMX kernel (`conv2d_amx.rs`) multiplies A tiles whose 16 rows are 64 bytes each, `lda`
//! bytes apart, read in place by `tileloadd`. A stride-`(sh, sw)` convolution on `C` channels is
//! a stride-1 one on the input's space-to-depth image: pixel `(r, s)` of it holds the `sh x sw`
//! block of padded pixels `(r sh + di, s sw + dj)`, `Cs = sh sw C` bytes in the order
//! `[di][c][dj]` (a channel's `sw` neighbours adjacent, as in a row-major input), and the kernel becomes `ceil(kH / sh) x ceil(kW / sw)` taps of `Cs` channels
//! (taps past the original window have zero weights). The `kW' = ceil(kW / sw)` taps of one
//! kernel row read `kW' Cs` consecutive bytes of the image's row (48 for the 7x7 stem: 4 pixels
//! of 12); when they fit in 64 bytes, one kernel row is one A tile row that starts at the output
//! pixel's space-to-depth pixel, `Cs` bytes after the previous pixel's. So the convolution is
//! `ceil(kH / sh)` taps of one 64-byte chunk on A tiles with row stride `Cs` (overlapping rows:
//! the bytes past `kW' Cs` belong to the next pixels and meet zero weights), exactly the direct
//! kernel's loop with a pixel stride that is not the chunk size ([`conv2d_amx::conv_operand`]).
//!
//! The i32 sums hold exactly the direct convolution's products (every other product has a zero
//! weight) and the weight row sums are the same, so the output bytes equal the reference's. The
//! only copy is the space-to-depth image (the input's bytes once, zero-point padded), where the
//! im2col gather (`conv2d_im2col.rs`, kept for what this does not cover: dilation, wide windows)
//! wrote every pixel's whole window per tile: the stem of ResNet at batch 8 ran 3.5 ms gathered.

use super::channels_last;
use super::conv2d::Geom;
use super::conv2d_amx::{self, AmxWeight, KC};
use crate::error::{Error, Result};
use crate::memory::AlignedBytes;

const OP: &str = "quantized_conv2d";

/// Whether `g` runs by space-to-depth on the AMX tiles (given that AMX is available): one group,
/// input channels not a multiple of 64 (those run directly), no dilation, a kernel row of the
/// space-to-depth image within 64 bytes, and channels-last outputs enabled.
pub(super) fn applies(g: &Geom) -> bool {
    g.groups == 1
        && g.c > 0
        && !g.c.is_multiple_of(KC)
        && g.dil == [1, 1]
        && g.stride[0] > 0
        && g.stride[1] > 0
        && g.kh > 0
        && g.kw > 0
        && g.c
            .checked_mul(g.stride[0] * g.stride[1])
            .and_then(|v| v.checked_mul(g.kw.div_ceil(g.stride[1])))
            .is_some_and(|row| row <= KC)
        && g.oc > 0
        && channels_last::enabled()
}

/// Bytes of one space-to-depth pixel.
fn cs(g: &Geom) -> usize {
    g.c * g.stride[0] * g.stride[1]
}

/// The stride-1 convolution the AMX kernel runs: one 64-byte "channel" chunk per kernel row of
/// the space-to-depth image (`hs x ws` pixels), `ceil(kH / sh)` taps, the original output plane.
pub(super) fn geometry(g: &Geom) -> Geom {
    let (hs, ws) = ((g.h + 2 * g.pad[0]).div_ceil(g.stride[0]), (g.w + 2 * g.pad[1]).div_ceil(g.stride[1]));
    Geom::column(g.n, KC, [hs, ws], g.oc, g.kh.div_ceil(g.stride[0]), [g.oh, g.ow])
}

/// The AMX weights of the space-to-depth convolution from `w` (`[OC][C][kH][kW]`, contiguous):
/// tap `t`, byte `j' Cs + (di C + c) sw + dj` = `w[o][c][t sh + di][j' sw + dj]` inside the
/// window, zero elsewhere.
pub(super) fn weight(w: &[i8], g: &Geom) -> Result<AmxWeight> {
    let gs = geometry(g);
    let (c, kh, kw, [sh, sw]) = (g.c, g.kh, g.kw, g.stride);
    let (taps, cs) = (gs.kh, cs(g));
    let len = g.oc.checked_mul(KC * taps).ok_or_else(overflow)?;
    let mut buf = crate::memory::try_vec(OP, len, 0i8)?;
    for (o, rows) in buf.chunks_exact_mut(KC * taps).enumerate() {
        for b in 0..kw.div_ceil(sw) * cs {
            let (jp, rest) = (b / cs, b % cs);
            let (dc, dj) = (rest / sw, rest % sw);
            let (di, ch) = (dc / c, dc % c);
            let kj = jp * sw + dj;
            for t in 0..taps {
                let ki = t * sh + di;
                if ki < kh && kj < kw {
                    // `AmxWeight::new` reads `[OC][C = 64][taps][1]`
                    rows[b * taps + t] = w[((o * c + ch) * kh + ki) * kw + kj];
                }
            }
        }
    }
    AmxWeight::new(&buf, &gs)
}

fn overflow() -> Error {
    Error::limit(OP, "the space-to-depth input of this convolution does not fit in memory (size overflows usize)")
}

/// The space-to-depth images of `x` (`N x C x H x W` bytes, or `N x H x W x C` when `nhwc`),
/// zero-point padded: `N` images of `conv2d_amx::operand_pixels` pixels of `Cs` bytes (pixel
/// `(r, s)` at `r ws + s`, rows past the padded input all `zp`), 64 bytes of slack at the end.
/// Returns the bytes and the size of one image.
pub(super) fn pack(g: &Geom, x: &[u8], nhwc: bool, zp: u8) -> Result<(AlignedBytes, usize)> {
    let gs = geometry(g);
    let (c, cs, ws, [sh, sw], [ph, pw]) = (g.c, cs(g), gs.w, g.stride, g.pad);
    let pixels = conv2d_amx::operand_pixels(&gs)?;
    let image = pixels.checked_mul(cs).ok_or_else(overflow)?;
    let total = image.checked_mul(g.n).and_then(|v| v.checked_add(KC)).ok_or_else(overflow)?;
    let mut buf = AlignedBytes::try_new(OP, total, zp)?;
    let plane = g.h * g.w;
    let row_bytes = ws * cs;
    let geo = RowGeom { c, cs, sh, sw, ph, pw, h: g.h, w: g.w };
    // every row of every image is one task of one team job
    let mut rows = crate::ops::team::reserve_parts(OP, g.n.checked_mul(gs.h).ok_or_else(overflow)?)?;
    for (n, img) in buf.as_mut_slice()[..image * g.n].chunks_mut(image.max(1)).enumerate() {
        rows.extend(img.chunks_mut(row_bytes.max(1)).take(gs.h).enumerate().map(|(r, dst)| ((n, r), dst)));
    }
    crate::ops::team::slices_mut(rows, |&(n, r), dst| {
        let src = &x[n * plane * c..(n + 1) * plane * c];
        if nhwc {
            geo.row_nhwc(src, r, dst);
        } else {
            match sw {
                1 => geo.row::<1>(src, r, dst),
                2 => geo.row::<2>(src, r, dst),
                3 => geo.row::<3>(src, r, dst),
                4 => geo.row::<4>(src, r, dst),
                _ => geo.row_nhwc_or_any(src, r, dst, false),
            }
        }
    });
    Ok((buf, image))
}

/// What writing one space-to-depth row needs.
struct RowGeom {
    c: usize,
    cs: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    h: usize,
    w: usize,
}

impl RowGeom {
    /// Row `r` of the space-to-depth image (`dst`, pre-filled with the zero point) from one
    /// row-major image `src` (`C x H x W`), `SW == sw`: each channel's `SW` neighbours as one
    /// fixed move inside the input, byte by byte at its edges.
    fn row<const SW: usize>(&self, src: &[u8], r: usize, dst: &mut [u8]) {
        let (c, cs, plane) = (self.c, self.cs, self.h * self.w);
        // s2d columns whose `SW` padded columns all lie inside the input
        let s_lo = self.pw.div_ceil(SW);
        let s_hi = ((self.w + self.pw) / SW).max(s_lo);
        for di in 0..self.sh {
            let Some(ih) = (r * self.sh + di).checked_sub(self.ph).filter(|&v| v < self.h) else {
                continue;
            };
            for ch in 0..c {
                let line = &src[ch * plane + ih * self.w..ch * plane + (ih + 1) * self.w];
                let base = (di * c + ch) * SW;
                let n = s_hi - s_lo;
                if n > 0 {
                    let first = s_lo * SW - self.pw;
                    for (d, p) in dst[s_lo * cs..].chunks_exact_mut(cs).zip(line[first..].chunks_exact(SW)).take(n) {
                        let v: [u8; SW] = p.try_into().expect("SW bytes");
                        let to: &mut [u8; SW] = (&mut d[base..base + SW]).try_into().expect("SW bytes");
                        *to = v;
                    }
                }
                // the partial blocks at both edges
                for pc in (self.pw..(s_lo * SW).min(self.pw + self.w)).chain((s_hi * SW).max(self.pw)..self.pw + self.w)
                {
                    dst[(pc / SW) * cs + base + pc % SW] = line[pc - self.pw];
                }
            }
        }
    }

    /// Row `r` from a channels-last image `src` (`H x W x C`).
    fn row_nhwc(&self, src: &[u8], r: usize, dst: &mut [u8]) {
        self.row_nhwc_or_any(src, r, dst, true)
    }

    /// Row `r` byte by byte, from a channels-last (`nhwc`) or row-major image.
    fn row_nhwc_or_any(&self, src: &[u8], r: usize, dst: &mut [u8], nhwc: bool) {
        let (c, cs, sw, plane) = (self.c, self.cs, self.sw, self.h * self.w);
        for di in 0..self.sh {
            let Some(ih) = (r * self.sh + di).checked_sub(self.ph).filter(|&v| v < self.h) else {
                continue;
            };
            for iw in 0..self.w {
                let pc = iw + self.pw;
                for ch in 0..c {
                    let v = if nhwc { src[(ih * self.w + iw) * c + ch] } else { src[ch * plane + ih * self.w + iw] };
                    dst[(pc / sw) * cs + (di * c + ch) * sw + pc % sw] = v;
                }
            }
        }
    }
}
