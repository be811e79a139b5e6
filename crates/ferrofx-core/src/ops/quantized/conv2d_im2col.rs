//! Small-channel convolutions on the AMX tiles: the 3-channel stem of the ImageNet networks (and
//! any single-group convolution whose input channels are not a multiple of 64) as a 1x1
//! convolution over im2col channels.
//!
//! The AMX kernel (`conv2d_amx.rs`) reads 64 input channels per tile row. A convolution with
//! `C` channels and a `kH x kW` window has `K = C * kH * kW` products per output (147 for the
//! 7x7 stem): gathering each output pixel's window into one channels-last row of `Kp = K` padded
//! to a multiple of 64 bytes (column `(i * kW + j) * C + c` = input channel `c` at window
//! position `(i, j)`, the padding the input zero point) makes the convolution a 1x1, stride-1
//! one over `Kp` channels, which the kernel runs with its operand read in place. The weights are
//! reordered the same way (`[OC][Kp]`, zeros in the padding, cached on the weight's storage), so
//! every i32 sum holds exactly the products of the direct convolution and the row sums are the
//! same: the output bytes equal the reference's.
//!
//! The columns never go through memory: the AMX item gathers the 32 rows of each pixel tile
//! into a stack buffer just before multiplying them (`conv2d_amx::Gather`), from a
//! zero-point-padded channels-last copy of each image made here; with `dW == 1` a window row
//! is `kW * C` contiguous bytes of it, copied as one fixed 32- or 64-byte move.

use super::channels_last;
use super::conv2d::Geom;
use super::conv2d_amx::{AmxWeight, Gather, KC, MAX_GATHER};
use crate::error::{Error, Result};

const OP: &str = "quantized_conv2d";

/// Whether `g` runs as a 1x1 convolution over im2col columns on the AMX tiles (given that AMX
/// is available): one group, input channels not a multiple of 64 (those run directly), a
/// window of at most [`MAX_GATHER`] products (padded), and channels-last outputs enabled.
pub(super) fn applies(g: &Geom) -> bool {
    g.groups == 1 && g.c > 0 && !g.c.is_multiple_of(KC) && kp(g) <= MAX_GATHER && g.oc > 0 && channels_last::enabled()
}

/// The padded window length `Kp`.
fn kp(g: &Geom) -> usize {
    (g.c * g.kh * g.kw).next_multiple_of(KC)
}

/// The 1x1 convolution over the columns: `Kp` channels on the `OH x OW` output plane.
pub(super) fn geometry(g: &Geom) -> Geom {
    Geom::column(g.n, kp(g), [g.oh, g.ow], g.oc, 1, [g.oh, g.ow])
}

/// The AMX weights of the column convolution from `w` (`[OC][C][kH][kW]`, contiguous).
pub(super) fn weight(w: &[i8], g: &Geom) -> Result<AmxWeight> {
    let (c, kh, kw, kp) = (g.c, g.kh, g.kw, kp(g));
    let k = c * kh * kw;
    let mut cols = crate::memory::try_vec(OP, g.oc.checked_mul(kp).ok_or_else(overflow)?, 0i8)?;
    for (o, row) in cols.chunks_exact_mut(kp).enumerate() {
        for ch in 0..c {
            for i in 0..kh {
                for j in 0..kw {
                    row[(i * kw + j) * c + ch] = w[o * k + (ch * kh + i) * kw + j];
                }
            }
        }
    }
    AmxWeight::new(&cols, &geometry(g))
}

fn overflow() -> Error {
    Error::limit(OP, "the im2col columns of this convolution do not fit in memory (size overflows usize)")
}

/// Zero-point-padded channels-last copies of the images of `x` (`N x C x H x W` bytes, or
/// `N x H x W x C` when `nhwc`): `N` images of `(H + 2 pH) x (W + 2 pW) x C` bytes, with 64
/// bytes of slack at the end for the fixed moves of the gather. Returns the bytes and the size
/// of one image.
pub(super) fn padded_images(g: &Geom, x: &[u8], nhwc: bool, zp: u8) -> Result<(Vec<u8>, usize)> {
    let c = g.c;
    let (hp, wp) = (g.h + 2 * g.pad[0], g.w + 2 * g.pad[1]);
    let image = hp.checked_mul(wp).and_then(|v| v.checked_mul(c)).ok_or_else(overflow)?;
    let total = image.checked_mul(g.n).and_then(|v| v.checked_add(64)).ok_or_else(overflow)?;
    let mut padded = crate::memory::try_vec(OP, total, zp)?;
    let plane = g.h * g.w;
    crate::ops::team::chunks_mut(&mut padded[..image * g.n], wp * c, |row, dst| {
        let (n, r) = (row / hp, row % hp);
        if r < g.pad[0] || r - g.pad[0] >= g.h {
            return;
        }
        let ih = r - g.pad[0];
        let src = &x[n * plane * c..(n + 1) * plane * c];
        let dst = &mut dst[g.pad[1] * c..(g.pad[1] + g.w) * c];
        if nhwc {
            dst.copy_from_slice(&src[ih * g.w * c..(ih + 1) * g.w * c]);
        } else {
            for ch in 0..c {
                let line = &src[ch * plane + ih * g.w..ch * plane + (ih + 1) * g.w];
                for (iw, &v) in line.iter().enumerate() {
                    dst[iw * c + ch] = v;
                }
            }
        }
    });
    Ok((padded, image))
}

/// What the AMX kernel needs to gather the columns of `g` from [`padded_images`].
pub(super) fn gather<'a>(g: &Geom, padded: &'a [u8], image: usize, zp: u8) -> Gather<'a> {
    Gather {
        padded,
        image,
        wp: g.w + 2 * g.pad[1],
        c: g.c,
        kh: g.kh,
        kw: g.kw,
        stride: g.stride,
        dil: g.dil,
        ow: g.ow,
        k: g.c * g.kh * g.kw,
        kp: kp(g),
        zp,
    }
}
