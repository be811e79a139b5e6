//! `nchwc_conv2d`: a float32 2-D convolution in the channel-blocked NCHW16c layout (ONNX
//! Runtime's `nchwc.Conv`), computed directly (no im2col, no GEMM library) with its bias,
//! residual add and activation applied in registers.
//!
//! In NCHW16c an activation `[n, c, h, w]` is stored as `[n, c / 16, h, w, 16]`: the 16
//! channels of a block are contiguous per pixel, one AVX-512 register. The input of
//! `nchwc_conv2d` and its residual are in that layout and so is its output; its weight is the
//! ordinary `[o, c, kh, kw]` tensor (the saved file keeps the model's own weights), packed once
//! into `[o / 16][c / 16][kh][kw][16 in][16 out]` and cached on the weight's storage.
//! `ferrofx-compile`'s layout pass switches chains of convolutions to this op and puts
//! `nchwc_reorder_input` / `nchwc_reorder_output` at the chain's ends.
//!
//! The kernel: a tile of [`TILE_PIXELS`] output pixels (consecutive in row-major order, so a
//! tile may span rows — 7x7 planes waste no lanes) by up to [`TILE_BLOCKS`] blocks of 16 output
//! channels is accumulated in 24 registers. For every input channel of every kernel tap, the
//! tile's four weight vectors are loaded once and each pixel's input value is broadcast once
//! and multiplied into the four accumulators (24 fused multiply-adds per 10 loads). A pixel
//! whose tap falls in the padding reads a vector of zeros instead. Input channel blocks are
//! split into chunks whose weights stay in the L2 cache; between chunks the partial sums wait
//! in the output. Tiles run in parallel on the kernel team.
//!
//! Channel counts that are not a multiple of 16 (MobileNetV2's 24) are padded, as ONNX
//! Runtime pads them: the last block's channels past `c` hold zeros in the input, their
//! weights are zero, and the output's channels past `o` hold `act(0)` (finite for every
//! activation), which the next convolution multiplies by zero weights and
//! `nchwc_reorder_output` drops.
//!
//! Depthwise convolutions (`groups == c == o`) run their own kernel (`nchwc_depthwise.rs`): one
//! fused multiply-add of 16 channels per tap and pixel, no broadcast.
//!
//! Without AVX-512F, or for geometries the kernels do not cover (other grouped convolutions),
//! the op reorders to NCHW, runs `conv2d_fused` and reorders back: same result, slower; the
//! compile pass only emits the op where a kernel applies.

use super::depthwise3x3::RegAct;
use super::epilogue::{activation_arg, Epilogue, EPILOGUE_SCHEMA};
use super::winograd::Geom3;
use super::{conv_cost_of, conv_geom, Activation, Geom, SendPtr, CONV2D_FUSED};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{int, opt_tensor, tensor};
use crate::op::{Category, Cost, Effect, OpDef, Saves};
use crate::tensor::{Tensor, TensorMeta};
use crate::trace::Symbolic;
use crate::value::Value;
use smallvec::smallvec;
use std::mem::MaybeUninit;
use std::sync::Arc;

const OP: &str = "nchwc_conv2d";

/// Channels per block of the NCHWc layout (one AVX-512 register of float32).
pub const NCHWC_BLOCK: usize = 16;
const B: usize = NCHWC_BLOCK;
/// Output pixels per register tile.
pub(super) const TILE_PIXELS: usize = 6;
/// Blocks of 16 output channels per register tile.
pub(super) const TILE_BLOCKS: usize = 4;
/// How many tiles ahead a 1x1 convolution prefetches each pixel's input, per input channel
/// block. The tile reads one cache line per pixel from each of the chunk's input planes (16
/// planes for 256 channels, each a separate stream the hardware prefetcher tracks poorly):
/// at batch 8, where the input comes from memory, the prefetch took ResNet-50's 1x1 layers
/// from 114-292 to 363-418 GFLOP/s (AMD EPYC, two threads; 2, 4 and 8 tiles measured within
/// 10% of 3).
const PREFETCH_TILES: usize = 3;
/// Bytes of packed weights one chunk of input channel blocks may take (per tile's output
/// blocks): they are read once per tile, so they should stay in the L2 cache.
const CHUNK_BYTES: usize = 256 << 10;

/// Whether a blocked kernel computes a float32 convolution of `c` input and `o` output
/// channels in `groups` groups on this CPU: ungrouped or depthwise (`groups == c == o`), on
/// AVX-512F (channel counts that are not a multiple of 16 are padded).
pub(super) fn kernel_applies(c: usize, o: usize, groups: usize) -> bool {
    c > 0 && o > 0 && (groups == 1 || (groups == c && c == o)) && super::avx512()
}

/// Whether [`nchwc_conv2d`] reads the input of an ungrouped convolution with `c` input channels
/// in NCHW, in place (and `ferrofx-compile`'s layout pass inserts no reorder before it): the
/// stems of image models, over 1-4 channels (RGB, grayscale), where a blocked input would be
/// 4-16x padding. The output is NCHW16c either way.
///
/// ```
/// use ferrofx_core::ops::conv::nchwc_reads_nchw;
/// assert!(nchwc_reads_nchw(3, 1));
/// assert!(!nchwc_reads_nchw(64, 1) && !nchwc_reads_nchw(3, 3));
/// ```
pub fn nchwc_reads_nchw(c: usize, groups: i64) -> bool {
    groups == 1 && (1..=4).contains(&c)
}

/// How many times the multiply-adds of the convolution the blocked kernel performs, its padded
/// channels included (1.0 when both channel counts are multiples of 16).
fn padding_waste(c: usize, o: usize, groups: usize) -> f64 {
    let pad = |n: usize| n.div_ceil(B) as f64 * B as f64 / n as f64;
    if groups == 1 {
        pad(c) * pad(o)
    } else {
        pad(c)
    }
}

/// The time [`nchwc_conv2d`] is expected to save over the NCHW kernels for a float32
/// convolution of an NCHW `input` with `weight` (`[o, c, kh, kw]`), in seconds at two threads;
/// `None` when the blocked kernel does not apply on this CPU or is not faster.
///
/// The estimate is the convolution's NCHW time (its multiply-adds at 150 GFLOP/s) times the
/// share the blocked kernel saved on ResNet's layers (two threads, one Xeon): 40% for strided
/// convolutions larger than 1x1 (the NCHW kernels gather the strided columns first), 15% for
/// 1x1s, 20% for the rest, less the cost of the padded channels' multiply-adds (a layer of 24
/// channels computes 32); `None` where the padding would take more than 1.5x the layer's
/// multiply-adds. A convolution with fewer than 64 input or output channels (MobileNetV2's
/// 16-32-channel layers) saves 30%, padding included (cold caches, as in a model: the blocked
/// kernel took 0.50-0.65x the NCHW kernels' time on MobileNetV2's 1x1 layers at batch 8, Xeon;
/// with warm caches, timed alone, the NCHW kernels were up to 1.3x faster). A stem over 1-4
/// channels ([`nchwc_reads_nchw`]: its input is read in NCHW, unpadded) saves 40% (ResNet's
/// 7x7/2 stem in NCHW took 2x ONNX Runtime's blocked stem in the model; alone, the blocked
/// kernel runs it about as fast as the NCHW one, and the chain then starts at the model's
/// input: no reorder of the 112x112 stem output or of the pooled map). A depthwise convolution
/// saves 30% when it is 3x3 (MobileNet's; measured on MobileNetV2's layers, Xeon, two threads),
/// at stride 2 or on planes of at most 8 columns, and costs 10% more otherwise (AMD EPYC), so
/// MobileNetV2 forms one blocked chain from its stem to its last convolution. A 3x3 stride-1 convolution of at least 256 output pixels runs
/// Winograd F(4x4, 3x3) in NCHW16c too (the direct kernel took 1.1-1.8x Winograd's time on
/// 56x56 and 28x28 planes and at batch 8); it saves 10% of its NCHW Winograd time (the input's
/// transpose into blocks and the output's scatter), so it joins its neighbours' chain instead
/// of costing two reorders. `ferrofx-compile`'s layout pass weighs the sum over a chain against
/// [`nchwc_reorder_seconds`] of the reorders the chain needs.
///
/// ```
/// use ferrofx_core::ops::conv::nchwc_saving;
/// // whatever the CPU: a grouped convolution that is not depthwise stays in NCHW, and so does
/// // one whose padded channels would more than double its multiply-adds (1 -> 16, 2 -> 16)
/// assert!(nchwc_saving(&[1, 32, 14, 14], &[32, 16, 3, 3], &[1, 1], &[1, 1], &[1, 1], 2).is_none());
/// assert!(nchwc_saving(&[1, 8, 56, 56], &[2, 8, 1, 1], &[1, 1], &[0, 0], &[1, 1], 1).is_none());
/// ```
pub fn nchwc_saving(
    input: &[usize],
    weight: &[usize],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
) -> Option<f64> {
    let meta = |s: &[usize]| {
        Tensor::symbolic(Symbolic { meta: Some(TensorMeta::contiguous(s, DType::F32)), proxy: Arc::new(()) })
    };
    if input.len() != 4 || weight.len() != 4 {
        return None;
    }
    let pad = Value::Ints(padding.to_vec());
    let (g, _, _) =
        super::geometry(OP, 2, &meta(input), &meta(weight), None, stride, &pad, dilation, groups, None).ok()?;
    let pixels = g.n * g.oh * g.ow;
    let winograd = winograd_geom(&g).is_some();
    let stem = nchwc_reads_nchw(g.c, groups);
    // a stem's input is read in NCHW: only its output channels are padded
    let waste = if stem { padding_waste(B, g.o, 1) } else { padding_waste(g.c, g.o, g.groups) };
    // fewer than 4 blocks of input or output channels (MobileNetV2's 16-32-channel layers):
    // few multiply-adds per value moved, so what counts is how the output is written, and the
    // blocked kernel (16 channels contiguous per pixel) wrote it in 0.50-0.65x the NCHW
    // kernels' time with the activations out of the cache, as inside a model (Xeon, batch 8;
    // with warm caches the NCHW kernels were up to 1.3x faster)
    let narrow = g.groups == 1 && !stem && g.c.min(g.o) < 4 * B;
    if !kernel_applies(g.c, g.o, g.groups) || pixels == 0 || waste > 1.5 {
        return None;
    }
    let flops = 2.0 * (pixels * g.o) as f64 * (g.cg() * g.kh * g.kw) as f64;
    if winograd {
        // the same Winograd tiles either way (a quarter of the multiply-adds); blocked, the
        // input is padded with row copies instead of transposed from NCHW, and the 4x4 output
        // tiles are stored as 16-channel vectors instead of scattered lane by lane
        return Some(WINOGRAD_SHARE * flops / 4.0 / 150e9);
    }
    if narrow {
        return Some(NARROW_SHARE * flops / 150e9);
    }
    let share = if stem {
        // the NCHW stem kernel (pixels in lanes, weights broadcast, stride-2 columns
        // deinterleaved) against the blocked one (channels in lanes, 24 accumulators): ResNet's
        // 7x7/2 stem took 2x ONNX Runtime's blocked stem
        STEM_SHARE
    } else if g.groups > 1 {
        // depthwise: 3x3 (MobileNet's) 1.2-1.7x faster blocked with cold caches, 1.2-2.1x warm
        // (Xeon, batch 8: the weights in registers, no column deinterleave at stride 2, no
        // lanes wasted on narrow planes); other kernel sizes faster at stride 2 or on planes of
        // at most 8 columns and about as fast on larger stride-1 planes (AMD EPYC)
        if (g.kh == 3 && g.kw == 3 && g.dh == 1 && g.dw == 1) || g.sh > 1 || g.sw > 1 || g.ow <= 8 {
            0.3
        } else {
            -0.1
        }
    } else if g.kh * g.kw == 1 {
        0.15
    } else if g.sh > 1 || g.sw > 1 {
        0.4
    } else {
        0.2
    };
    Some((1.0 - (1.0 - share) * waste) * flops / 150e9)
}

/// The share of a narrow convolution's NCHW time (fewer than 64 input or output channels, see
/// [`nchwc_saving`]) that the blocked kernel saves, its padded channels included.
const NARROW_SHARE: f64 = 0.3;

/// The share of a stem's NCHW time (see [`nchwc_reads_nchw`]) that the blocked kernel saves.
const STEM_SHARE: f64 = 0.4;

/// The share of a Winograd convolution's NCHW time that computing it in NCHW16c saves (no
/// transpose of the input into blocks, no lane-by-lane scatter of the output).
const WINOGRAD_SHARE: f64 = 0.1;

/// The Winograd geometry of a convolution that [`nchwc_conv2d`] computes with Winograd
/// F(4x4, 3x3) (3x3, stride 1, dilation 1, ungrouped, enough channels, at least 256 output
/// pixels: below that the direct kernel was as fast, and the transformed weights are 4x the
/// kernel's size); `None` for the direct kernel.
fn winograd_geom(g: &Geom) -> Option<Geom3> {
    (g.groups == 1 && g.n * g.oh * g.ow >= 256).then(|| g.winograd())?
}

/// The expected time of one `nchwc_reorder_input` / `nchwc_reorder_output` of `elements`
/// float32 values, in seconds at two threads (ResNet's 128x28x28: 17-22 µs alone, about 1.5x
/// that inside a model whose other nodes evict it from the cache).
pub fn nchwc_reorder_seconds(elements: usize) -> f64 {
    elements as f64 * 3.0e-10
}

/// The packed weights: `[o / 16][c / cpb][kh][kw][cpb in][16 out]` (both channel counts
/// rounded up to blocks, the padding zero): `cpb` input channels per block, 16, or `c` for a
/// stem's NCHW input of fewer channels (see [`in_block`]).
fn pack(w: &[f32], o: usize, c: usize, taps: usize, cpb: usize) -> Vec<f32> {
    let (ob, cb) = (o.div_ceil(B), c.div_ceil(cpb));
    let mut p = vec![0.0f32; ob * cb * taps * cpb * B];
    for oc in 0..o {
        for ic in 0..c {
            for t in 0..taps {
                let dst = ((((oc / B) * cb + ic / cpb) * taps + t) * cpb + ic % cpb) * B + oc % B;
                p[dst] = w[(oc * c + ic) * taps + t];
            }
        }
    }
    p
}

/// Input channels per block of the packed weights: 16, or all of them for an NCHW input of
/// fewer (a stem over 3 channels then reads 3 weight vectors per tap, contiguous, instead of
/// 3 of 16 spread over a 1 KiB block).
fn in_block(g: &Geom, nchw_in: bool) -> usize {
    if nchw_in && g.c < B {
        g.c
    } else {
        B
    }
}

/// The shape of the packed weights of a call: `[o/16, c/16, taps, 16, 16]` (ungrouped) or
/// `[c/16, taps, 16]` (depthwise), channel counts rounded up to blocks. Up to 256 times the
/// weight's own size (one input and one output channel), so the op checks it against the
/// allocation limit before packing.
fn packed_shape(g: &Geom, cpb: usize) -> Vec<usize> {
    let taps = g.kh * g.kw;
    if g.groups > 1 {
        vec![g.c.div_ceil(B), taps, B]
    } else {
        vec![g.o.div_ceil(B), g.c.div_ceil(cpb), taps, cpb, B]
    }
}

/// The packed weights of `w` (`[o, c / groups, kh, kw]`, its contiguous values `ws`), as
/// [`pack`] (ungrouped) or [`super::nchwc_depthwise::pack`] (depthwise) lays them out: cached
/// on the weights' storage when autograd cannot change them, packed for this call otherwise.
fn packed(w: &Tensor, ws: &[f32], g: &Geom, cpb: usize) -> Arc<Vec<f32>> {
    const KEY: usize = 0x16c; // NCHW16c convolution weights
    let (o, c, taps, depthwise) = (g.o, g.c, g.kh * g.kw, g.groups > 1);
    let pack_of = |ws: &[f32]| {
        if depthwise {
            super::nchwc_depthwise::pack(ws, c, taps)
        } else {
            pack(ws, o, c, taps, cpb)
        }
    };
    let packed_len = packed_shape(g, cpb).iter().product::<usize>();
    let fresh = || Arc::new(pack_of(ws));
    let cacheable = !crate::autograd::is_grad_enabled() || !w.requires_grad();
    let (Some(st), Some(lay)) = (w.storage(), w.layout()) else { return fresh() };
    if !cacheable || !lay.is_contiguous() {
        return fresh();
    }
    let (off, len) = (lay.offset(), o * g.cg() * taps);
    // (an empty vector stands for "the storage does not hold these f32 weights")
    let p = st.derived(&[KEY, off, o, c, taps, g.groups, cpb], |buf| {
        buf.as_slice::<f32>().and_then(|v| v.get(off..off + len)).map(pack_of).unwrap_or_default()
    });
    if p.len() == packed_len {
        p
    } else {
        fresh()
    }
}

/// The blocked convolution: `x` `[n, c/16, h, w, 16]` (or `[n, c, h, w]` when `nchw_in`),
/// packed weights `wp`, `out` `[n, o/16, oh, ow, 16]` (every element written), `res` (if any)
/// in the output's layout; `act(conv + bias + res)`. `g` must satisfy [`kernel_applies`].
#[allow(clippy::too_many_arguments)]
fn conv(
    g: &Geom,
    nchw_in: bool,
    x: &[f32],
    wp: &[f32],
    bias: Option<&[f32]>,
    res: Option<&[f32]>,
    act: Activation,
    out: &mut [MaybeUninit<f32>],
) {
    let (cb, ob, taps) = (g.c.div_ceil(B), g.o.div_ceil(B), g.kh * g.kw);
    // weights per tap of one (output block, input block) pair
    let tap_floats = in_block(g, nchw_in) * B;
    let pixels = g.oh * g.ow;
    let total = g.n * ob * B * pixels;
    assert!(
        kernel_applies(g.c, g.o, g.groups)
            && g.groups == 1
            && x.len() >= if nchw_in { g.n * g.c * g.h * g.w } else { g.n * cb * B * g.h * g.w }
            && wp.len() >= ob * cb * taps * tap_floats
            && out.len() >= total
            && bias.is_none_or(|b| b.len() >= ob * B)
            && res.is_none_or(|r| r.len() >= total),
        "nchwc conv: geometry, CPU or buffer sizes (checked by the op)"
    );
    if total == 0 {
        return;
    }
    let (ract, later) = RegAct::split(act);
    // an NCHW input (a stem over a few channels) is zero-padded once, so that every tap of
    // every pixel reads inside the padded plane and the offsets are `pixel base + tap` (no
    // padding test per tap and pixel: with 3 channels a tap is only 72 multiply-adds)
    let padded = nchw_in.then(|| pad_nchw(g, x));
    let (x, ph, pw) = match &padded {
        Some((p, ph, pw)) => (p.as_slice(), *ph, *pw),
        None => (x, g.h, g.w),
    };
    // channel-block chunks whose weights (for one tile's output blocks) fit CHUNK_BYTES
    let per_block = taps * tap_floats * TILE_BLOCKS * 4;
    let kc = (CHUNK_BYTES / per_block).clamp(1, cb);
    let chunks = cb.div_ceil(kc);
    // an NCHW input: per chunk, one step per (input channel, tap), in the packed weights'
    // order: (input offset from a pixel's base, weight offset), both from the chunk's start
    let steps: Vec<Vec<(isize, usize)>> = if nchw_in {
        let tap = |t: usize| ((t / g.kw) * g.dh * pw + (t % g.kw) * g.dw) as isize;
        (0..chunks)
            .map(|k| {
                let (c0, c1) = (k * kc, ((k + 1) * kc).min(cb));
                let mut v = Vec::new();
                for bl in 0..c1 - c0 {
                    for t in 0..taps {
                        for ic in 0..in_block(g, true).min(g.c - (c0 + bl) * B) {
                            let x = ((bl * B + ic) * ph * pw) as isize + tap(t);
                            v.push((x, (bl * taps + t) * tap_floats + ic * B));
                        }
                    }
                }
                v
            })
            .collect()
    } else {
        Vec::new()
    };
    let groups = ob.div_ceil(TILE_BLOCKS);
    let tiles = pixels.div_ceil(TILE_PIXELS);
    // tasks: (image, group of output blocks, run of tiles); enough of them for the team
    let threads = super::team::threads().max(1);
    let per_image = groups * tiles;
    let runs = if threads > 1 { (4 * threads).div_ceil(g.n * groups).clamp(1, tiles) } else { 1 };
    let run_len = tiles.div_ceil(runs);
    let runs = tiles.div_ceil(run_len);
    let zero = [0.0f32; B];
    let bias = bias.map(|b| SendPtr(b.as_ptr().cast_mut()));
    let res = SendPtr(res.map_or(std::ptr::null_mut(), |r| r.as_ptr().cast_mut()));
    let optr = SendPtr(out.as_mut_ptr().cast::<f32>());
    let task = |t: usize| {
        let (ni, rest) = (t / (groups * runs), t % (groups * runs));
        let (gi, ri) = (rest / runs, rest % runs);
        let b0 = gi * TILE_BLOCKS;
        let nb = TILE_BLOCKS.min(ob - b0);
        let (t0, t1) = (ri * run_len, ((ri + 1) * run_len).min(tiles));
        // a group of fewer output blocks (MobileNetV2's 16-32 channels, a tail group) takes
        // more pixels per tile (as many as the vector registers allow)
        let tp = tile_pixels(nb);
        let (q0, q1) = (t0 * TILE_PIXELS, (t1 * TILE_PIXELS).min(pixels));
        // per tile: each pixel's offset (in floats, within one input channel block) for each
        // tap, -1 where the tap reads padding
        let mut offs = vec![-1isize; taps * tp];
        // a 1x1 convolution prefetches the input of the tile PREFETCH_TILES ahead: its pixels'
        // offsets, computed as the tile's (a strided layer's next output row starts `sh` input
        // rows on, not where a linear step ahead would read)
        let prefetch = taps == 1 && !nchw_in;
        let mut ahead = vec![-1isize; if prefetch { tp } else { 0 }];
        for k in 0..chunks {
            let (c0, c1) = (k * kc, ((k + 1) * kc).min(cb));
            for p0 in (q0..q1).step_by(tp) {
                let np = tp.min(q1 - p0);
                if nchw_in {
                    pixel_bases(g, pw, p0, np, tp, &mut offs);
                } else {
                    tap_offsets(g, p0, np, tp, &mut offs);
                    if prefetch {
                        let a0 = p0 + PREFETCH_TILES * tp;
                        tap_offsets(g, a0.min(pixels), pixels.saturating_sub(a0).min(tp), tp, &mut ahead);
                    }
                }
                let first = k == 0;
                let last = k + 1 == chunks;
                let args = TileArgs {
                    // NCHW: channel block c0 starts at channel 16 * c0 of image ni
                    x: if nchw_in {
                        x[(ni * g.c + c0 * B) * ph * pw..].as_ptr()
                    } else {
                        x[(ni * cb + c0) * g.h * g.w * B..].as_ptr()
                    },
                    plane: ph * pw * B,
                    ahead: &ahead,
                    blocks_in: c1 - c0,
                    offs: &offs,
                    steps: steps.get(k).map_or(&[], Vec::as_slice),
                    taps,
                    zero: zero.as_ptr(),
                    w: wp[(b0 * cb + c0) * taps * tap_floats..].as_ptr(),
                    w_block: cb * taps * tap_floats,
                    tap_floats,
                    // SAFETY (for the three pointers below): in bounds of their buffers
                    // (asserted sizes); this task alone writes pixels p0..p0+np of blocks
                    // b0..b0+nb
                    out: unsafe { optr.ptr().add(((ni * ob + b0) * pixels + p0) * B) },
                    res: if res.ptr().is_null() || !last {
                        std::ptr::null()
                    } else {
                        unsafe { res.ptr().add(((ni * ob + b0) * pixels + p0) * B) }
                    },
                    bias: if first { bias.map(|b| unsafe { b.ptr().add(b0 * B) }) } else { None },
                    out_plane: pixels * B,
                    pixels: np,
                    blocks_out: nb,
                    accumulate: !first,
                    act: if last { ract } else { RegAct::None },
                };
                // SAFETY: AVX-512F (kernel_applies, asserted); the pointers and sizes of
                // `args` are as `tile` requires (see above)
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    match (nb, nchw_in) {
                        (4, false) => avx512::tile::<4, 6>(&args),
                        (3, false) => avx512::tile::<3, 6>(&args),
                        (2, false) => avx512::tile::<2, 8>(&args),
                        (_, false) => avx512::tile::<1, 12>(&args),
                        (4, true) => avx512::tile_nchw::<4, 6>(&args),
                        (3, true) => avx512::tile_nchw::<3, 6>(&args),
                        (2, true) => avx512::tile_nchw::<2, 8>(&args),
                        (_, true) => avx512::tile_nchw::<1, 12>(&args),
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("nchwc conv kernel runs on x86-64 only (checked by kernel_applies)");
            }
        }
        if later {
            let ep = Epilogue { residual: None, act };
            for j in 0..nb {
                let off = ((ni * ob + b0 + j) * pixels + q0) * B;
                // SAFETY: these pixels of block b0 + j were written above by this task alone
                let seg = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(off), (q1 - q0) * B) };
                ep.apply(seg, off);
            }
        }
    };
    let tasks = g.n * groups * runs;
    let work = g.n * per_image * taps * cb;
    if threads > 1 && tasks > 1 && work >= 64 && super::team::parallel() {
        super::team::for_each(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// An NCHW input zero-padded to the planes the taps read: `[n][c][ph][pw]` with `ph = (oh - 1) *
/// sh + (kh - 1) * dh + 1` (and `pw` alike), input pixel `(r, c)` at `(r + pt, c + pl)`.
fn pad_nchw(g: &Geom, x: &[f32]) -> (Vec<f32>, usize, usize) {
    let [ph, pw] = padded_dims(g);
    let len = g.n * g.c * ph * pw;
    // columns copied per row: input columns c with c + pl < pw
    let (lo, n) = (g.pl.min(pw), g.w.min(pw.saturating_sub(g.pl)));
    let zero = MaybeUninit::new(0.0f32);
    let mut p: Vec<f32> = Vec::with_capacity(len);
    // one plane per task, every element written once (the padding zeroed, not the whole
    // buffer first): at batch 8 a 224x224 RGB input is 4.8 MB
    super::team::chunks_mut(&mut p.spare_capacity_mut()[..len], ph * pw, |plane, dst| {
        let src = &x[plane * g.h * g.w..][..g.h * g.w];
        for (pr, row) in dst.chunks_mut(pw).enumerate() {
            if pr < g.pt || pr - g.pt >= g.h {
                row.fill(zero);
                continue;
            }
            let r = pr - g.pt;
            row[..lo].fill(zero);
            for (d, &v) in row[lo..lo + n].iter_mut().zip(&src[r * g.w..][..n]) {
                *d = MaybeUninit::new(v);
            }
            row[lo + n..].fill(zero);
        }
    });
    // SAFETY: the tasks above wrote every one of the `len` elements
    unsafe { p.set_len(len) };
    (p, ph, pw)
}

/// The padded plane of [`pad_nchw`]: `[ph, pw]`.
fn padded_dims(g: &Geom) -> [usize; 2] {
    [(g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1]
}

/// For an input padded by [`pad_nchw`] (planes `pw` wide), where every tap is inside at the
/// pixel's base plus the tap's offset: fills `offs[p]` with the base (in floats within one
/// channel's plane) of pixel `p0 + p` of a tile of `tp` pixels; pixels past `np` (computed, not
/// stored) read pixel `p0`'s window.
fn pixel_bases(g: &Geom, pw: usize, p0: usize, np: usize, tp: usize, offs: &mut [isize]) {
    let (mut oy, mut ox) = (p0 / g.ow, p0 % g.ow);
    let first = (oy * g.sh * pw + ox * g.sw) as isize;
    for (p, o) in offs[..tp].iter_mut().enumerate() {
        if p > 0 {
            ox += 1;
            if ox == g.ow {
                (oy, ox) = (oy + 1, 0);
            }
        }
        *o = if p < np { (oy * g.sh * pw + ox * g.sw) as isize } else { first };
    }
}

/// Pixels per register tile for a group of `blocks` output blocks, in both kernels (`tile`,
/// `tile_nchw`): 24, 18, 16 or 12 accumulators, so that with the weights and a step's
/// broadcasts (which LLVM issues together) no more than 32 vectors are live. 2 x 12 and 1 x 24
/// spilled accumulators to the stack: MobileNetV2's 1-3-block 1x1 layers took 1.08-1.89x the
/// time, its stem (2 blocks) 1.3x.
fn tile_pixels(blocks: usize) -> usize {
    match blocks {
        4.. => TILE_PIXELS,
        3 => 6,
        2 => 8,
        _ => 12,
    }
}

/// Fills `offs[t * tp + p]` with the input offset (floats within one channel block's plane)
/// that pixel `p0 + p` of a tile of `tp` pixels reads at tap `t`, or -1 where that tap reads
/// padding (and for pixels past `np`).
fn tap_offsets(g: &Geom, p0: usize, np: usize, tp: usize, offs: &mut [isize]) {
    if g.kh * g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.h == g.oh && g.w == g.ow {
        // an unpadded 1x1 convolution of stride 1: output pixel q reads input pixel q
        for (p, o) in offs[..tp].iter_mut().enumerate() {
            *o = if p < np { ((p0 + p) * B) as isize } else { -1 };
        }
        return;
    }
    let (mut oy, mut ox) = (p0 / g.ow, p0 % g.ow);
    for p in 0..tp {
        if p > 0 {
            ox += 1;
            if ox == g.ow {
                (oy, ox) = (oy + 1, 0);
            }
        }
        let iy0 = (oy * g.sh) as isize - g.pt as isize;
        let ix0 = (ox * g.sw) as isize - g.pl as isize;
        for ki in 0..g.kh {
            let iy = iy0 + (ki * g.dh) as isize;
            for kj in 0..g.kw {
                let ix = ix0 + (kj * g.dw) as isize;
                let inside = p < np && iy >= 0 && (iy as usize) < g.h && ix >= 0 && (ix as usize) < g.w;
                offs[(ki * g.kw + kj) * tp + p] = if inside { (iy * g.w as isize + ix) * B as isize } else { -1 };
            }
        }
    }
}

/// One tile's operands (see `avx512::tile`).
struct TileArgs<'a> {
    /// The image's first input channel block of this chunk.
    x: *const f32,
    /// Floats per input channel block (`h * w * 16`).
    plane: usize,
    /// Per pixel (`[P]`), the input offset to prefetch (-1: none), as `offs`; empty: no
    /// prefetch.
    ahead: &'a [isize],
    /// Input channel blocks in this chunk.
    blocks_in: usize,
    /// Per tap and pixel (`[taps][P]`), the pixel's input offset at that tap, -1 in the padding;
    /// for an NCHW input (padded: every tap inside), per pixel only (`[P]`), its window's base.
    offs: &'a [isize],
    /// For an NCHW input, per input channel and tap of the chunk (the packed weights' order):
    /// the input's offset from a pixel's base and the weights' offset (floats from `x` and
    /// `w`); empty otherwise.
    steps: &'a [(isize, usize)],
    taps: usize,
    /// 16 zeros: what a padding tap reads.
    zero: *const f32,
    /// The packed weights of the tile's first output block, this chunk's first input block.
    w: *const f32,
    /// Floats between consecutive output blocks' packed weights.
    w_block: usize,
    /// Floats of packed weights per tap (`16 * 16`, or `c * 16` for a stem's NCHW input).
    tap_floats: usize,
    /// The tile's first pixel in its first output block.
    out: *mut f32,
    /// The residual at the same place (null: none, or not the last chunk).
    res: *const f32,
    /// The first chunk's bias for the tile's output blocks (16 per block).
    bias: Option<*mut f32>,
    /// Floats per output channel block (`oh * ow * 16`).
    out_plane: usize,
    /// Pixels of this tile that exist (the rest are computed on zeros and not stored).
    pixels: usize,
    /// Output blocks of this tile (1..=TILE_BLOCKS; the rest are not stored).
    blocks_out: usize,
    /// Add to the partial sums already in `out` (every chunk but the first).
    accumulate: bool,
    act: RegAct,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::depthwise3x3::avx512::finish;
    use super::{TileArgs, B};
    use std::arch::x86_64::*;

    /// The tile's accumulators before the first input: the partial sums in `out` (every chunk
    /// but the first), the bias, or zeros.
    ///
    /// # Safety
    /// As [`tile`].
    #[inline(always)]
    unsafe fn start<const N: usize, const P: usize>(a: &TileArgs<'_>) -> [__m512; 24] {
        // one flat array indexed by constants only (after unrolling), so it lives in registers
        let mut acc = [_mm512_setzero_ps(); 24];
        if a.accumulate {
            for j in 0..N {
                for p in 0..P {
                    if j < a.blocks_out && p < a.pixels {
                        acc[j * P + p] = _mm512_loadu_ps(a.out.add(j * a.out_plane + p * B));
                    }
                }
            }
        } else if let Some(b) = a.bias {
            for j in 0..N {
                let bv = _mm512_loadu_ps(b.add(j.min(a.blocks_out - 1) * B));
                for p in 0..P {
                    acc[j * P + p] = bv;
                }
            }
        }
        acc
    }

    /// Stores the tile's existing pixels of its existing blocks, with residual and activation.
    ///
    /// # Safety
    /// As [`tile`].
    #[inline(always)]
    unsafe fn store<const N: usize, const P: usize>(a: &TileArgs<'_>, acc: &[__m512; 24]) {
        for j in 0..N {
            for p in 0..P {
                if j < a.blocks_out && p < a.pixels {
                    let at = j * a.out_plane + p * B;
                    _mm512_storeu_ps(a.out.add(at), finish(acc[j * P + p], a.res, at, 0xffff, a.act));
                }
            }
        }
    }

    /// One register tile: `N` output blocks x `P` pixels (`N * P <= 24`), over the chunk's
    /// input blocks and every tap; written to `out` (with bias, residual and activation as `a`
    /// says).
    ///
    /// # Safety
    /// AVX-512F; `a.x` readable for `a.blocks_in` planes, every non-negative offset of
    /// `a.offs` (`a.taps * P` of them) inside a plane; `a.w` readable for `a.blocks_out <= N`
    /// output blocks (`a.w_block` apart) of `a.blocks_in * a.taps * 256` floats; `a.out` (and
    /// `a.res` if not null) holds `a.blocks_out` blocks `a.out_plane` apart with `a.pixels`
    /// pixels each, the writes exclusive to this call.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const N: usize, const P: usize>(a: &TileArgs<'_>) {
        let mut acc = start::<N, P>(a);
        // output blocks past `blocks_out` (a tail group) compute on block 0's weights and are
        // not stored
        let wj: [usize; N] = std::array::from_fn(|j| if j < a.blocks_out { j * a.w_block } else { 0 });
        for cb in 0..a.blocks_in {
            let xb = a.x.add(cb * a.plane);
            if !a.ahead.is_empty() {
                for p in 0..P {
                    if a.ahead[p] >= 0 {
                        // (wrapping arithmetic: a hint computes no reference, and never faults)
                        _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_offset(a.ahead[p]).cast());
                    }
                }
            }
            let wb = a.w.add(cb * a.taps * a.tap_floats);
            for t in 0..a.taps {
                let o = &a.offs[t * P..t * P + P];
                if o.iter().all(|&v| v < 0) {
                    continue;
                }
                let ptrs: [*const f32; P] = std::array::from_fn(|p| if o[p] < 0 { a.zero } else { xb.offset(o[p]) });
                let wt = wb.add(t * a.tap_floats);
                for ic in 0..B {
                    let mut w = [_mm512_setzero_ps(); 4];
                    for j in 0..N {
                        w[j] = _mm512_loadu_ps(wt.add(wj[j] + ic * B));
                    }
                    for p in 0..P {
                        let xv = _mm512_set1_ps(*ptrs[p].add(ic));
                        for j in 0..N {
                            acc[j * P + p] = _mm512_fmadd_ps(w[j], xv, acc[j * P + p]);
                        }
                    }
                }
            }
        }
        store::<N, P>(a, &acc);
    }

    /// [`tile`] over a padded NCHW image (a stem: one block of weights `[taps][c][16]` per
    /// output block, `c` of 1-4): one flat loop over the chunk's (input channel, tap) steps,
    /// each `N` weight vectors and `P` broadcasts, no padding test (pixel `p` of step `(x, w)`
    /// reads `a.x + x + a.offs[p]`).
    ///
    /// # Safety
    /// AVX-512F; every `a.x + x + a.offs[p]` of `a.steps` and the first `P` offsets readable;
    /// `a.w + w + 16` readable for every step's `w`, in each of the `a.blocks_out <= N` output
    /// blocks (`a.w_block` apart); `a.out` (and `a.res`) as for [`tile`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_nchw<const N: usize, const P: usize>(a: &TileArgs<'_>) {
        let mut acc = start::<N, P>(a);
        let base: [isize; P] = std::array::from_fn(|p| a.offs[p]);
        let w: [*const f32; N] = std::array::from_fn(|j| a.w.add(j.min(a.blocks_out - 1) * a.w_block));
        for &(xo, wo) in a.steps {
            let xk = a.x.offset(xo);
            let wv: [__m512; N] = std::array::from_fn(|j| _mm512_loadu_ps(w[j].add(wo)));
            for p in 0..P {
                let xv = _mm512_set1_ps(*xk.offset(base[p]));
                for j in 0..N {
                    acc[j * P + p] = _mm512_fmadd_ps(wv[j], xv, acc[j * P + p]);
                }
            }
        }
        store::<N, P>(a, &acc);
    }
}

/// The logical `[n, c, h, w]` meta tensor of a blocked `[n, c/16, h, w, 16]` one (for the
/// shared geometry checks): `c` is `channels` (what the weight expects) when the blocks hold
/// that many, `16 * blocks` otherwise (the geometry check then names the mismatch).
fn logical(op: &str, what: &str, t: &Tensor, channels: Option<usize>) -> Result<Tensor> {
    let s = t.shape();
    if s.len() != 5 || s[4] != B {
        return Err(Error::shape(
            op,
            format!(
                "the {what} must be NCHW16c, [n, c/16, h, w, 16], got {s:?}; reorder an NCHW tensor with nchwc_reorder_input first"
            ),
        ));
    }
    let c = match channels {
        Some(c) if c.div_ceil(B) == s[1] => c,
        _ => s[1].checked_mul(B).ok_or_else(|| Error::limit(op, format!("{what} {s:?} has too many channels")))?,
    };
    let meta = TensorMeta::contiguous(&[s[0], c, s[2], s[3]], t.dtype());
    Ok(Tensor::symbolic(Symbolic { meta: Some(meta), proxy: Arc::new(()) }))
}

/// The input channels the weight of a call expects (`weight.shape[1] * groups`), if it says.
fn weight_channels(args: &[Value]) -> Option<usize> {
    let w = tensor(OP, args, 1).ok()?;
    let groups = usize::try_from(int(OP, args, 6).ok()?).ok()?;
    (w.shape().len() == 4).then(|| w.shape()[1].checked_mul(groups))?
}

/// The arguments with the blocked input replaced by its logical NCHW meta tensor (an NCHW
/// input stays as it is).
fn logical_args(args: &[Value]) -> Result<Vec<Value>> {
    let x = tensor(OP, args, 0)?;
    if nchw_input(x) {
        return Ok(args.to_vec());
    }
    let mut logical_args = args.to_vec();
    logical_args[0] = Value::Tensor(logical(OP, "input", x, weight_channels(args))?);
    Ok(logical_args)
}

/// Whether the input of a call is NCHW (`[n, c, h, w]`: a model's first convolution, read in
/// place) rather than NCHW16c.
fn nchw_input(x: &Tensor) -> bool {
    x.shape().len() == 4
}

/// The geometry of a call and its blocked output shape.
fn geom(args: &[Value]) -> Result<(Geom, Vec<usize>)> {
    let (g, shape, dt) = conv_geom(OP, 2, &logical_args(args)?)?;
    if dt != DType::F32 {
        return Err(Error::dtype(OP, format!("nchwc_conv2d computes float32 only, got {dt:?}")));
    }
    if !(g.groups == 1 || (g.groups == g.c && g.c == g.o)) || shape.len() != 4 {
        return Err(Error::shape(
            OP,
            format!(
                "nchwc_conv2d needs an ungrouped or a depthwise convolution (groups = input channels = output channels), got groups={} with {} input and {} output channels; keep this convolution in NCHW (conv2d)",
                g.groups, g.c, g.o
            ),
        ));
    }
    if g.groups != 1 && nchw_input(tensor(OP, args, 0)?) {
        return Err(Error::shape(
            OP,
            format!(
                "an NCHW input [n, c, h, w] needs an ungrouped convolution, got groups={}; reorder it with nchwc_reorder_input first",
                g.groups
            ),
        ));
    }
    let out = vec![g.n, g.o.div_ceil(B), g.oh, g.ow, B];
    if let Some(r) = opt_tensor(OP, args, 7)? {
        if r.shape() != out.as_slice() || r.dtype() != DType::F32 {
            return Err(Error::shape(
                OP,
                format!(
                    "the residual must be float32 NCHW16c of the output's shape {out:?}, got {:?} {:?}",
                    r.dtype(),
                    r.shape()
                ),
            ));
        }
    }
    Ok((g, out))
}

fn kernel(args: &[Value]) -> Result<Tensor> {
    let (g, shape) = geom(args)?;
    let act = activation_arg(OP, args, 8)?;
    let (x, w, b) = (tensor(OP, args, 0)?, tensor(OP, args, 1)?, opt_tensor(OP, args, 2)?);
    let res = opt_tensor(OP, args, 7)?;
    let nchw_in = nchw_input(x);
    if !kernel_applies(g.c, g.o, g.groups) {
        // portable path: NCHW conv2d_fused between reorders
        let mut nchw = args.to_vec();
        if !nchw_in {
            nchw[0] = Value::Tensor(super::nchwc_reorder::reorder_output(x, g.c)?);
        }
        if let Some(r) = res {
            nchw[7] = Value::Tensor(super::nchwc_reorder::reorder_output(r, g.o)?);
        }
        let y = (CONV2D_FUSED.kernel)(&nchw)?.into_iter().next().ok_or_else(|| Error::argument(OP, "no output"))?;
        return super::nchwc_reorder::reorder_input(&y);
    }
    crate::memory::check_alloc(OP, &shape, DType::F32)?;
    let g3 = winograd_geom(&g).filter(|_| !nchw_in);
    if nchw_in && g.n * g.oh * g.ow > 0 {
        // the zero-padded copy of the input (see `conv`)
        let [ph, pw] = padded_dims(&g);
        crate::memory::check_alloc(OP, &[g.n, g.c, ph, pw], DType::F32)?;
    }
    if g3.is_some() {
        // the transformed weights, [36][c][o]
        crate::memory::check_alloc(OP, &[36, g.c, g.o], DType::F32)?;
    } else {
        crate::memory::check_alloc(OP, &packed_shape(&g, in_block(&g, nchw_in)), DType::F32)?;
    }
    let xc = crate::ops::kernel::contiguous(x)?;
    let wc = crate::ops::kernel::contiguous(w)?;
    let bv = b.map(crate::ops::kernel::contiguous).transpose()?;
    let rc = res.map(crate::ops::kernel::contiguous).transpose()?;
    let wp = wc.with_contiguous::<f32, _>(OP, |ws| match g3 {
        Some(_) => super::cached_winograd_weight(w, &g)
            .unwrap_or_else(|| Arc::new(super::winograd::transform_weight(ws, g.o, g.c, false))),
        None => packed(w, ws, &g, in_block(&g, nchw_in)),
    })?;
    let len = shape.iter().product::<usize>();
    let mut buf: Vec<f32> = crate::memory::alloc_uninit(OP, &shape)?;
    let run = |xs: &[f32], bias: Option<&[f32]>, r: Option<&[f32]>, buf: &mut Vec<f32>| {
        // the bias of every output block, zeros past `o`
        let padded: Option<Vec<f32>> = bias.filter(|_| !g.o.is_multiple_of(B)).map(|b| {
            let mut p = b[..g.o].to_vec();
            p.resize(g.o.div_ceil(B) * B, 0.0);
            p
        });
        let bias = padded.as_deref().or(bias);
        let out = &mut buf.spare_capacity_mut()[..len];
        if let Some(g3) = &g3 {
            super::winograd::conv3x3_nchwc(xs, g3, &wp, bias, r, act, out)
        } else if g.groups == 1 {
            conv(&g, nchw_in, xs, &wp, bias, r, act, out)
        } else {
            super::nchwc_depthwise::depthwise(&g, xs, &wp, bias, r, act, out)
        }
    };
    xc.with_contiguous::<f32, _>(OP, |xs| -> Result<()> {
        let with_res = |bias: Option<&[f32]>, buf: &mut Vec<f32>| -> Result<()> {
            match &rc {
                Some(r) => r.with_contiguous::<f32, _>(OP, |rs| run(xs, bias, Some(rs), buf)),
                None => {
                    run(xs, bias, None, buf);
                    Ok(())
                }
            }
        };
        match &bv {
            Some(b) => b.with_contiguous::<f32, _>(OP, |bs| with_res(Some(bs), &mut buf))?,
            None => with_res(None, &mut buf),
        }
    })??;
    // SAFETY: alloc_uninit reserved `len` elements and `conv` wrote every one of them
    unsafe { buf.set_len(len) };
    Tensor::from_vec(buf, &shape)
}

/// `nchwc_conv2d(input, weight, bias, stride, padding, dilation, groups, residual,
/// activation)`: `conv2d_fused` on NCHW16c activations (see the module docs).
pub static NCHWC_CONV2D: OpDef = OpDef {
    name: OP,
    schema: EPILOGUE_SCHEMA,
    meta: |args| {
        let (_, shape) = geom(args)?;
        activation_arg(OP, args, 8)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, DType::F32)])
    },
    kernel: |args| Ok(smallvec![kernel(args)?]),
    cost: |args, outs| {
        let Ok(logical_args) = logical_args(args) else { return Cost::default() };
        match conv_geom(OP, 2, &logical_args) {
            Ok((g, _, _)) => {
                let mut c: Cost = conv_cost_of(&g, &logical_args, outs);
                c.flops = c.flops.saturating_add(2 * (g.n * g.o * g.oh * g.ow) as u64);
                c
            }
            Err(_) => Cost::default(),
        }
    },
    effect: Effect::Pure,
    category: Category::Convolution,
    backward: None,
    saves: Saves::NOTHING,
    doc: "2-D convolution with bias, residual add and activation on NCHW16c activations [n, c/16, h, w, 16] (made by ferrofx-compile's layout pass).",
};

/// `act(conv2d(input, weight, bias, ...) + residual)` with `input`, `residual` and the result
/// in NCHW16c (`[n, c/16, h, w, 16]`); `weight` is the ordinary `[o, c, kh, kw]`.
///
/// ```
/// use ferrofx_core::ops::conv::{conv2d_fused, nchwc_conv2d, nchwc_reorder_input, nchwc_reorder_output};
/// use ferrofx_core::ops::random::randn;
/// let (x, w) = (randn(&[1, 16, 9, 9], None)?, randn(&[32, 16, 3, 3], None)?);
/// let blocked = nchwc_conv2d(&nchwc_reorder_input(&x)?, &w, None, &[2, 2], &[1, 1], &[1, 1], 1, None, "relu")?;
/// assert_eq!(blocked.shape(), &[1, 2, 5, 5, 16]);
/// let y = nchwc_reorder_output(&blocked, 32)?;
/// let reference = conv2d_fused(&x, &w, None, &[2, 2], &[1, 1], &[1, 1], 1, None, "relu")?;
/// let (a, b) = (y.to_vec::<f32>()?, reference.to_vec::<f32>()?);
/// assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs())));
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn nchwc_conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
    residual: Option<&Tensor>,
    activation: &str,
) -> Result<Tensor> {
    super::epilogue::dispatch_fused(
        &NCHWC_CONV2D,
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        residual,
        activation,
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{conv2d_fused, nchwc_reorder_input, nchwc_reorder_output};
    use super::nchwc_conv2d;
    use crate::ops::random::randn;
    use crate::Tensor;

    /// Equal up to float32 summation order: the reference may be Winograd or a GEMM, the
    /// blocked kernel sums per tap; `k` terms of unit-variance products each.
    fn close(a: &Tensor, b: &Tensor, k: usize, what: &str) {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len(), "{what}");
        let tol = 2e-6 * k as f32;
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!((p - q).abs() <= tol + 1e-5 * q.abs(), "{what}: element {i}: {p} vs {q}");
        }
    }

    /// A seeded xorshift generator: `next(n)` is in `0..n`.
    pub(in crate::ops::conv) fn xorshift(mut s: u64) -> impl FnMut(usize) -> usize {
        move |n: usize| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n as u64) as usize
        }
    }

    /// `nchwc_conv2d` between reorders equals `conv2d_fused` in NCHW on random geometries:
    /// kernel sizes 1-7, strides 1-3, padding, dilation 2, batch 1-3, 16-80 channels, every
    /// activation, with and without bias and residual; planes from 1x1 to wider than a tile
    /// row, so tiles span rows and end in partial tiles; output-channel counts that leave a
    /// partial group of blocks; every third case with channel counts that are not multiples
    /// of 16 (padded blocks).
    #[test]
    fn equals_conv2d_fused_on_random_geometries() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let acts = ["none", "relu", "relu6", "silu", "hardswish", "clamp(-0.5, 0.25)"];
        for case in 0..60 {
            let k = [1, 3, 5, 7][next(4)];
            let (stride, dil) = (1 + next(3), if next(5) == 0 { 2 } else { 1 });
            let pad = next(k / 2 + 1) * dil;
            let (n, mut c, mut o) = (1 + next(3), 16 * (1 + next(5)), 16 * (1 + next(6)));
            if case % 3 == 0 {
                // padded blocks: MobileNetV2's 24 channels, and counts below one block
                (c, o) = (c - next(16).min(c - 1), o - next(16).min(o - 1));
            }
            let (h, w) = (1 + next(17), 1 + next(17));
            let eff = dil * (k - 1) + 1;
            if h + 2 * pad < eff || w + 2 * pad < eff {
                continue;
            }
            let (oh, ow) = ((h + 2 * pad - eff) / stride + 1, (w + 2 * pad - eff) / stride + 1);
            let x = randn(&[n as i64, c as i64, h as i64, w as i64], None).unwrap();
            let wt = randn(&[o as i64, c as i64, k as i64, k as i64], None).unwrap();
            let b = (next(4) != 0).then(|| randn(&[o as i64], None).unwrap());
            let r = (next(2) == 0).then(|| randn(&[n as i64, o as i64, oh as i64, ow as i64], None).unwrap());
            let act = acts[next(acts.len())];
            let (st, pd, dl) = ([stride as i64; 2], [pad as i64; 2], [dil as i64; 2]);
            let want = conv2d_fused(&x, &wt, b.as_ref(), &st, &pd, &dl, 1, r.as_ref(), act).unwrap();
            let rb = r.as_ref().map(|r| nchwc_reorder_input(r).unwrap());
            let got =
                nchwc_conv2d(&nchwc_reorder_input(&x).unwrap(), &wt, b.as_ref(), &st, &pd, &dl, 1, rb.as_ref(), act)
                    .unwrap();
            assert_eq!(got.shape(), &[n, o.div_ceil(16), oh, ow, 16]);
            let what =
                format!("case {case}: x {:?} w {:?} stride {stride} pad {pad} dil {dil} {act}", x.shape(), wt.shape());
            close(&nchwc_reorder_output(&got, o as i64).unwrap(), &want, c * k * k, &what);
        }
    }

    /// 3x3 stride-1 convolutions of at least 256 output pixels run Winograd F(4x4, 3x3) in
    /// NCHW16c and equal `conv2d_fused` in NCHW: padding 0-2 (asymmetric tiles at the right and
    /// bottom edges), planes that are and are not multiples of the 4x4 tile, batch 1-3,
    /// channel counts that are and are not multiples of 16 (padded blocks on both sides), more
    /// output channels than tiles (the split over channels), every activation, with and
    /// without bias and residual.
    #[test]
    fn winograd_in_nchwc_equals_conv2d_fused() {
        let mut next = xorshift(0x6a09_e667_f3bc_c908);
        let acts = ["none", "relu", "relu6", "silu", "hardswish", "clamp(-0.5, 0.25)"];
        let mut ran = 0;
        for case in 0..24 {
            let pad = [1, 1, 0, 2][next(4)];
            let (n, mut c, mut o) = (1 + next(3), 16 * (1 + next(5)), 16 * (1 + next(6)));
            if case % 3 == 0 {
                (c, o) = (c + 1 + next(15), o + 1 + next(15));
            }
            if case % 8 == 7 {
                o = 320 + next(40);
            }
            let (h, w) = (4 + next(27), 4 + next(27));
            let (oh, ow) = (h + 2 * pad - 2, w + 2 * pad - 2);
            let g = super::super::winograd::Geom3 { n, c, h, w, o, oh, ow, pt: pad, pl: pad };
            if n * oh * ow < 256 || !super::super::winograd::worthwhile(&g) {
                continue;
            }
            ran += 1;
            let x = randn(&[n as i64, c as i64, h as i64, w as i64], None).unwrap();
            let wt = randn(&[o as i64, c as i64, 3, 3], None).unwrap();
            let b = (next(4) != 0).then(|| randn(&[o as i64], None).unwrap());
            let r = (next(2) == 0).then(|| randn(&[n as i64, o as i64, oh as i64, ow as i64], None).unwrap());
            let act = acts[next(acts.len())];
            let pd = [pad as i64; 2];
            let want = conv2d_fused(&x, &wt, b.as_ref(), &[1, 1], &pd, &[1, 1], 1, r.as_ref(), act).unwrap();
            let rb = r.as_ref().map(|r| nchwc_reorder_input(r).unwrap());
            let got = nchwc_conv2d(
                &nchwc_reorder_input(&x).unwrap(),
                &wt,
                b.as_ref(),
                &[1, 1],
                &pd,
                &[1, 1],
                1,
                rb.as_ref(),
                act,
            )
            .unwrap();
            assert_eq!(got.shape(), &[n, o.div_ceil(16), oh, ow, 16]);
            let what = format!("case {case}: winograd x {:?} w {:?} pad {pad} {act}", x.shape(), wt.shape());
            // Winograd's rounding: the transforms scale the terms by up to ~10
            close(&nchwc_reorder_output(&got, o as i64).unwrap(), &want, 8 * c * 9, &what);
            // the padded output channels hold act(0 + residual) = act(0) = 0 for these
            // activations (the residual's padded lanes are zeros), as the direct kernel's
            if o % 16 != 0 {
                let gv = got.to_vec::<f32>().unwrap();
                for (i, p) in gv.iter().enumerate() {
                    if i % 16 >= o % 16 && (i / 16 / (oh * ow)) % o.div_ceil(16) == o / 16 {
                        assert_eq!(*p, 0.0, "{what}: padded lane {i}");
                    }
                }
            }
        }
        assert!(ran >= 15, "{ran} geometries ran");
    }

    /// An NCHW input (a model's first convolution: ResNet's 7x7/2 and MobileNet's 3x3/2 RGB
    /// stems) is read in place and gives the NCHW16c output of the reordered input: 1-4 input
    /// channels and more than one block (20, 40), kernels 1-7, strides 1-2, padding, every
    /// activation, with and without bias and residual.
    #[test]
    fn nchw_input_equals_conv2d_fused() {
        let mut next = xorshift(0x3c6e_f372_fe94_f82b);
        let acts = ["none", "relu", "relu6", "silu"];
        for case in 0..60 {
            let k = [7, 3, 5, 1][next(4)];
            let (stride, dil) = (1 + next(2), 1 + next(2));
            let pad = next(k / 2 + 1);
            let c = [1usize, 2, 3, 3, 4, 20, 40][next(7)];
            let (n, o) = (1 + next(2), [16usize, 24, 32, 64][next(4)]);
            let span = dil * (k - 1) + 1;
            let (h, w) = (span + next(30), span + next(30));
            let (oh, ow) = ((h + 2 * pad - span) / stride + 1, (w + 2 * pad - span) / stride + 1);
            let x = randn(&[n as i64, c as i64, h as i64, w as i64], None).unwrap();
            let wt = randn(&[o as i64, c as i64, k as i64, k as i64], None).unwrap();
            let b = (next(4) != 0).then(|| randn(&[o as i64], None).unwrap());
            let r = (next(3) == 0).then(|| randn(&[n as i64, o as i64, oh as i64, ow as i64], None).unwrap());
            let act = acts[next(acts.len())];
            let (st, pd, dl) = ([stride as i64; 2], [pad as i64; 2], [dil as i64; 2]);
            let want = conv2d_fused(&x, &wt, b.as_ref(), &st, &pd, &dl, 1, r.as_ref(), act).unwrap();
            let rb = r.as_ref().map(|r| nchwc_reorder_input(r).unwrap());
            let got = nchwc_conv2d(&x, &wt, b.as_ref(), &st, &pd, &dl, 1, rb.as_ref(), act).unwrap();
            assert_eq!(got.shape(), &[n, o.div_ceil(16), oh, ow, 16]);
            let what = format!(
                "case {case}: NCHW x {:?} w {:?} stride {stride} pad {pad} dilation {dil} {act}",
                x.shape(),
                wt.shape()
            );
            close(&nchwc_reorder_output(&got, o as i64).unwrap(), &want, c * k * k, &what);
            // the same values as from the blocked input
            let blocked =
                nchwc_conv2d(&nchwc_reorder_input(&x).unwrap(), &wt, b.as_ref(), &st, &pd, &dl, 1, rb.as_ref(), act)
                    .unwrap();
            close(&got, &blocked, c * k * k, &what);
        }
    }

    /// Large enough for several input-channel chunks (partial sums kept in the output) and
    /// for the team: 512 input channels, 3x3.
    #[test]
    fn chunked_input_channels_match() {
        let x = randn(&[2, 512, 9, 9], None).unwrap();
        let wt = randn(&[48, 512, 3, 3], None).unwrap();
        let b = randn(&[48], None).unwrap();
        let r = randn(&[2, 48, 9, 9], None).unwrap();
        let want = conv2d_fused(&x, &wt, Some(&b), &[1, 1], &[1, 1], &[1, 1], 1, Some(&r), "relu").unwrap();
        let got = nchwc_conv2d(
            &nchwc_reorder_input(&x).unwrap(),
            &wt,
            Some(&b),
            &[1, 1],
            &[1, 1],
            &[1, 1],
            1,
            Some(&nchwc_reorder_input(&r).unwrap()),
            "relu",
        )
        .unwrap();
        close(&nchwc_reorder_output(&got, 48).unwrap(), &want, 512 * 9, "512 channels");
    }

    /// Depthwise convolutions (`groups == c == o`) in NCHW16c equal `conv2d_fused` in NCHW:
    /// kernels 3 and 5 (MobileNet's, EfficientNet's) and 1-7 otherwise, strides 1-3, padding
    /// from none to more than the kernel's half, dilation 2, channel counts that are and are
    /// not multiples of 16, planes from 1x1 to wider than a run of pixels, every activation,
    /// with and without bias and residual.
    #[test]
    fn depthwise_equals_conv2d_fused_on_random_geometries() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let acts = ["none", "relu", "relu6", "silu", "hardswish", "clamp(-0.5, 0.25)"];
        let mut ran = 0;
        for case in 0..160 {
            let k = [3, 3, 3, 5, 1, 7][next(6)];
            let (stride, dil) = (1 + next(3), if next(6) == 0 { 2 } else { 1 });
            let pad = next(k / 2 + 2) * dil;
            let (n, c) = (1 + next(2), 1 + next(60));
            let (h, w) = (1 + next(30), 1 + next(30));
            let eff = dil * (k - 1) + 1;
            if h + 2 * pad < eff || w + 2 * pad < eff {
                continue;
            }
            ran += 1;
            let (oh, ow) = ((h + 2 * pad - eff) / stride + 1, (w + 2 * pad - eff) / stride + 1);
            let x = randn(&[n as i64, c as i64, h as i64, w as i64], None).unwrap();
            let wt = randn(&[c as i64, 1, k as i64, k as i64], None).unwrap();
            let b = (next(4) != 0).then(|| randn(&[c as i64], None).unwrap());
            let r = (next(2) == 0).then(|| randn(&[n as i64, c as i64, oh as i64, ow as i64], None).unwrap());
            let act = acts[next(acts.len())];
            let (st, pd, dl) = ([stride as i64; 2], [pad as i64; 2], [dil as i64; 2]);
            let g = c as i64;
            let want = conv2d_fused(&x, &wt, b.as_ref(), &st, &pd, &dl, g, r.as_ref(), act).unwrap();
            let rb = r.as_ref().map(|r| nchwc_reorder_input(r).unwrap());
            let got =
                nchwc_conv2d(&nchwc_reorder_input(&x).unwrap(), &wt, b.as_ref(), &st, &pd, &dl, g, rb.as_ref(), act)
                    .unwrap();
            assert_eq!(got.shape(), &[n, c.div_ceil(16), oh, ow, 16]);
            let what =
                format!("case {case}: depthwise x {:?} k {k} stride {stride} pad {pad} dil {dil} {act}", x.shape());
            close(&nchwc_reorder_output(&got, c as i64).unwrap(), &want, k * k, &what);
        }
        assert!(ran >= 100, "{ran} geometries ran");
    }

    #[test]
    fn bad_inputs_are_errors_naming_the_op_and_the_fix() {
        let x = randn(&[1, 16, 5, 5], None).unwrap();
        let w = randn(&[16, 16, 3, 3], None).unwrap();
        // an input that is neither NCHW nor NCHW16c
        let x3 = randn(&[16, 5, 5], None).unwrap();
        let e = nchwc_conv2d(&x3, &w, None, &[1, 1], &[1, 1], &[1, 1], 1, None, "none").unwrap_err().to_string();
        assert!(e.contains("nchwc_conv2d") && e.contains("NCHW16c") && e.contains("nchwc_reorder_input"), "{e}");
        // an NCHW input to a depthwise convolution
        let wd = randn(&[16, 1, 3, 3], None).unwrap();
        let e = nchwc_conv2d(&x, &wd, None, &[1, 1], &[1, 1], &[1, 1], 16, None, "none").unwrap_err().to_string();
        assert!(e.contains("NCHW input") && e.contains("groups=16") && e.contains("nchwc_reorder_input"), "{e}");
        let xb = nchwc_reorder_input(&x).unwrap();
        // a grouped convolution that is not depthwise
        let w2 = randn(&[16, 8, 3, 3], None).unwrap();
        let e = nchwc_conv2d(&xb, &w2, None, &[1, 1], &[1, 1], &[1, 1], 2, None, "none").unwrap_err().to_string();
        assert!(e.contains("depthwise") && e.contains("groups=2"), "{e}");
        // 20 output channels: padded to two blocks, not an error
        let w20 = randn(&[20, 16, 3, 3], None).unwrap();
        let y = nchwc_conv2d(&xb, &w20, None, &[1, 1], &[1, 1], &[1, 1], 1, None, "none").unwrap();
        assert_eq!(y.shape(), &[1, 2, 5, 5, 16]);
        // a blocked input whose blocks cannot hold what the weight expects
        let w40 = randn(&[16, 40, 3, 3], None).unwrap();
        let e = nchwc_conv2d(&xb, &w40, None, &[1, 1], &[1, 1], &[1, 1], 1, None, "none").unwrap_err().to_string();
        assert!(e.contains("channels"), "{e}");
        // a residual of the wrong shape
        let bad_res = randn(&[1, 1, 4, 4, 16], None).unwrap();
        let e =
            nchwc_conv2d(&xb, &w, None, &[1, 1], &[1, 1], &[1, 1], 1, Some(&bad_res), "none").unwrap_err().to_string();
        assert!(e.contains("residual") && e.contains("[1, 1, 5, 5, 16]") && e.contains("[1, 1, 4, 4, 16]"), "{e}");
        // input channels that do not match the weight
        let w32 = randn(&[16, 32, 3, 3], None).unwrap();
        let e = nchwc_conv2d(&xb, &w32, None, &[1, 1], &[1, 1], &[1, 1], 1, None, "none").unwrap_err().to_string();
        assert!(e.contains("channels"), "{e}");
        // reorders
        let e = nchwc_reorder_output(&xb, 40).unwrap_err().to_string();
        assert!(e.contains("channels=40") && e.contains("1..=16"), "{e}");
        let e = nchwc_reorder_input(&xb).unwrap_err().to_string();
        assert!(e.contains("nchwc_reorder_input") && e.contains("[1, 1, 5, 5, 16]"), "{e}");
    }
}
