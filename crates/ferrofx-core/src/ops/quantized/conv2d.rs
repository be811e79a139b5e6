//! `quantized_conv2d`: 2-D convolution of a uint8 input with int8 weights, requantised to
//! uint8 (PyTorch's `quantized::conv2d` / `conv2d_relu`), with the float conv's stride,
//! padding, dilation and groups.
//!
//! The fast paths (AVX-512 VNNI, AVX2) are the direct convolution of `conv2d_packed.rs`. The
//! reference path is im2col per (image, group) (patch rows of `C/groups * kH * kW` bytes, padded
//! positions hold the input zero point so they contribute nothing) followed by the reference
//! int8 GEMM of [`super::gemm`] against the weight rows, writing the channel-major output
//! directly. Images run in parallel; a single image splits its output channels over threads.

use super::add;
use super::channels_last;
#[cfg(target_arch = "x86_64")]
use super::conv2d_amx::{self, AmxWeight};
#[cfg(target_arch = "x86_64")]
use super::conv2d_im2col;
use super::conv2d_packed::{self, PackedWeight};
#[cfg(target_arch = "x86_64")]
use super::conv2d_s2d;
use super::gemm::{reference_gemm, row_sums, Operands, Path, RequantParams};
use super::{channel_floats, check_channel_param, check_scale, check_zero_point, expect_dtype};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{bool_, expand_param, float, int, ints, opt_tensor, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;
use std::sync::Arc;

const OP: &str = "quantized_conv2d";

/// The checked geometry of one call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geom {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) oc: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
    pub(super) stride: [usize; 2],
    pub(super) pad: [usize; 2],
    pub(super) dil: [usize; 2],
    pub(super) groups: usize,
}

impl Geom {
    /// Channels per group (input).
    pub(super) fn cg(&self) -> usize {
        self.c / self.groups
    }
    /// Output channels per group.
    pub(super) fn ocg(&self) -> usize {
        self.oc / self.groups
    }
    /// The GEMM's reduction length (one weight row).
    pub(super) fn kg(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Output positions per image.
    pub(super) fn p(&self) -> usize {
        self.oh * self.ow
    }
    /// A one-group, stride-1, unpadded convolution with a `kh x 1` window, `n` images of `c`
    /// channels on `h x w`, `oc` outputs on `oh x ow` (what the AMX tile loop runs for the
    /// small-channel paths, `conv2d_s2d.rs` and `conv2d_im2col.rs`).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn column(n: usize, c: usize, [h, w]: [usize; 2], oc: usize, kh: usize, [oh, ow]: [usize; 2]) -> Geom {
        Geom { n, c, h, w, oc, kh, kw: 1, oh, ow, stride: [1, 1], pad: [0, 0], dil: [1, 1], groups: 1 }
    }
}

pub(super) fn check(args: &[Value]) -> Result<Geom> {
    let x = tensor(OP, args, 0)?;
    expect_dtype(OP, "input", x, DType::U8)?;
    check_scale(OP, "input_scale", float(OP, args, 1)?)?;
    check_zero_point(OP, "input_zero_point", int(OP, args, 2)?, DType::U8)?;
    let w = tensor(OP, args, 3)?;
    expect_dtype(OP, "weight", w, DType::I8)?;
    check_scale(OP, "output_scale", float(OP, args, 6)?)?;
    check_zero_point(OP, "output_zero_point", int(OP, args, 7)?, DType::U8)?;
    if x.ndim() != 4 || w.ndim() != 4 {
        return Err(Error::shape(
            OP,
            format!(
                "expected a 4-D input [N, C, H, W] and a 4-D weight [out_channels, C/groups, kH, kW], got input {:?} and weight {:?}",
                x.shape(),
                w.shape()
            ),
        ));
    }
    let stride = expand_param::<2>(OP, "stride", &ints(OP, args, 8)?)?;
    let padding = expand_param::<2>(OP, "padding", &ints(OP, args, 9)?)?;
    let dilation = expand_param::<2>(OP, "dilation", &ints(OP, args, 10)?)?;
    let groups = int(OP, args, 11)?;
    if stride.iter().any(|&s| s <= 0) || dilation.iter().any(|&d| d <= 0) || padding.iter().any(|&p| p < 0) {
        return Err(Error::argument(
            OP,
            format!("stride and dilation must be positive and padding non-negative, got stride={stride:?}, padding={padding:?}, dilation={dilation:?}"),
        ));
    }
    let (xs, ws) = (x.shape(), w.shape());
    if groups <= 0 || xs[1] % groups as usize != 0 || ws[0] % groups as usize != 0 || ws[1] * groups as usize != xs[1] {
        return Err(Error::shape(
            OP,
            format!(
                "groups={groups}: the input's {} channels and the weight's {} output channels must be divisible by groups, and the weight's dim 1 ({}) must be in_channels / groups; input {xs:?}, weight {ws:?}",
                xs[1], ws[0], ws[1]
            ),
        ));
    }
    let out_dim = |i: usize, k: usize, d: usize| -> Result<usize> {
        let span = dilation[d] as i128 * (k as i128 - 1) + 1;
        let o = (i as i128 + 2 * padding[d] as i128 - span).div_euclid(stride[d] as i128) + 1;
        if k == 0 || o < 1 {
            return Err(Error::shape(
                OP,
                format!(
                    "input {xs:?} (padded by {padding:?}) is smaller than the dilated kernel {:?} (dilation {dilation:?}): the output would be empty",
                    &ws[2..]
                ),
            ));
        }
        usize::try_from(o).map_err(|_| Error::shape(OP, "output size overflows"))
    };
    let g = Geom {
        n: xs[0],
        c: xs[1],
        h: xs[2],
        w: xs[3],
        oc: ws[0],
        kh: ws[2],
        kw: ws[3],
        oh: out_dim(xs[2], ws[2], 0)?,
        ow: out_dim(xs[3], ws[3], 1)?,
        stride: [stride[0] as usize, stride[1] as usize],
        pad: [padding[0] as usize, padding[1] as usize],
        dil: [dilation[0] as usize, dilation[1] as usize],
        groups: groups as usize,
    };
    check_channel_param(OP, "weight_scale", tensor(OP, args, 4)?, g.oc, true)?;
    if let Some(b) = opt_tensor(OP, args, 5)? {
        check_channel_param(OP, "bias", b, g.oc, false)?;
    }
    crate::memory::check_alloc(OP, &[g.n, g.oc, g.oh, g.ow], DType::U8)?;
    crate::memory::check_alloc(OP, &[g.p(), g.kg()], DType::U8)?;
    Ok(g)
}

/// Patch rows of image plane `x` (`C x H x W`, the group's channels from `c0`) into `col`
/// (`P x Kg`), padding with `zp`.
fn im2col(g: &Geom, x: &[u8], c0: usize, zp: u8, col: &mut [u8]) {
    let kg = g.kg();
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.pad[0] as isize, g.pad[1] as isize);
    let (dh, dw) = (g.dil[0], g.dil[1]);
    for oh in 0..g.oh {
        for ow in 0..g.ow {
            let row = &mut col[(oh * g.ow + ow) * kg..(oh * g.ow + ow + 1) * kg];
            let mut idx = 0;
            for c in c0..c0 + g.cg() {
                let plane = &x[c * g.h * g.w..(c + 1) * g.h * g.w];
                for ki in 0..g.kh {
                    let ih = (oh * sh + ki * dh) as isize - ph;
                    let inside_h = ih >= 0 && (ih as usize) < g.h;
                    for kj in 0..g.kw {
                        let iw = (ow * sw + kj * dw) as isize - pw;
                        row[idx] = if inside_h && iw >= 0 && (iw as usize) < g.w {
                            plane[ih as usize * g.w + iw as usize]
                        } else {
                            zp
                        };
                        idx += 1;
                    }
                }
            }
        }
    }
}

/// One image on the reference path: every group's im2col and GEMM; output channels split over
/// threads when `par`.
fn conv_image(g: &Geom, x: &[u8], w: &[i8], rq: &RequantParams, zp: u8, out: &mut [u8], par: bool) -> Result<()> {
    let (kg, p, ocg) = (g.kg(), g.p(), g.ocg());
    let mut col = crate::memory::try_vec(OP, p * kg, 0u8)?;
    for gi in 0..g.groups {
        im2col(g, x, gi * g.cg(), zp, &mut col);
        let region = &mut out[gi * ocg * p..(gi + 1) * ocg * p];
        let wg = &w[gi * ocg * kg..(gi + 1) * ocg * kg];
        let j_base = gi * ocg;
        let threads = rayon::current_num_threads().max(1);
        if par && threads > 1 && p * ocg * kg >= 1 << 17 && ocg > 1 {
            let cols = ocg.div_ceil(threads * 4).max(1);
            region.par_chunks_mut(cols * p).enumerate().for_each(|(c, o)| {
                let j0 = c * cols;
                let nn = o.len() / p;
                let ops = Operands { a: &col, lda: kg, b: &wg[j0 * kg..], ldb: kg, m: p, n: nn, k: kg };
                reference_gemm(&ops, &rq.slice(j_base + j0, j_base + j0 + nn), o, 1, p);
            });
        } else {
            let ops = Operands { a: &col, lda: kg, b: wg, ldb: kg, m: p, n: ocg, k: kg };
            reference_gemm(&ops, &rq.slice(j_base, j_base + ocg), region, 1, p);
        }
    }
    Ok(())
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    Ok(smallvec![conv(args, None)?])
}

/// The convolution of `args` (this op's arguments), followed, when `fused_add` is given, by the
/// quantized add of its uint8 output and the other operand (`quantized_conv2d_add`): in the AMX
/// tile epilogue when the other operand is channels-last, else as the add op does it.
pub(super) fn conv(args: &[Value], fused_add: Option<(&Tensor, add::Params)>) -> Result<Tensor> {
    let g = check(args)?;
    let selected = Path::select();
    let path = selected.vector();
    let x = tensor(OP, args, 0)?;
    let w = tensor(OP, args, 3)?;
    let w_scale = channel_floats(OP, "weight_scale", tensor(OP, args, 4)?, g.oc, true)?;
    let bias = match opt_tensor(OP, args, 5)? {
        Some(b) => Some(channel_floats(OP, "bias", b, g.oc, false)?),
        None => None,
    };
    let a_scale = check_scale(OP, "input_scale", float(OP, args, 1)?)?;
    let a_zp = int(OP, args, 2)? as i32;
    let o_scale = check_scale(OP, "output_scale", float(OP, args, 6)?)?;
    let o_zp = int(OP, args, 7)? as i32;
    let relu = bool_(OP, args, 12)?;
    let shape = [g.n, g.oc, g.oh, g.ow];
    let numel = crate::memory::check_alloc(OP, &shape, DType::U8)?;
    #[cfg(target_arch = "x86_64")]
    if selected == Path::Amx && numel > 0 {
        // AMX tiles on a channels-last operand, channels-last output (see `conv2d_amx.rs`);
        // the kernel writes every output byte, so the buffer is not zero-filled first. A
        // small-channel convolution (the stem) runs on its space-to-depth image
        // (`conv2d_s2d.rs`), or else as a 1x1 one over its im2col columns (`conv2d_im2col.rs`)
        let amx = if conv2d_amx::applies(&g) {
            Amx::Direct
        } else if conv2d_s2d::applies(&g) {
            Amx::SpaceToDepth
        } else if conv2d_im2col::applies(&g) {
            Amx::Im2col
        } else {
            Amx::No
        };
        if amx != Amx::No {
            return conv_amx(amx, &g, x, w, fused_add, shape, numel, |sums| {
                RequantParams::new(a_scale, a_zp, &w_scale, sums, bias.as_deref(), o_scale, o_zp, relu)
            });
        }
    }
    if path != Path::Reference && g.cg() > 0 && numel > 0 {
        // the fast path: packed weights (cached on the weight's storage) and a direct
        // convolution on the packed input
        let pw = packed_weight(w, &g, path)?;
        let rq = RequantParams::new(a_scale, a_zp, &w_scale, pw.sums.clone(), bias.as_deref(), o_scale, o_zp, relu);
        // channels-last activations (see `channels_last.rs`): read as they are, and written so
        // by the channels-in-lanes tile
        let nhwc_out = conv2d_packed::writes_channels_last(path, &pw);
        // a residual add on a channels-last output with a channels-last other operand happens as
        // each output pixel leaves the tile (the convolution's bytes are never stored alone)
        let in_epilogue = fused_add.filter(|(o, _)| nhwc_out && channels_last::dims(o) == Some(shape));
        // the kernels write every output byte: no zero fill first (it would cost a pass over
        // the output, 88 MB per forward of ResNet-50 at batch 8)
        let mut out = crate::memory::alloc_uninit::<u8>(OP, &shape)?;
        let mut conv = |xv: &[u8], nhwc_in: bool, res: conv2d_packed::Residual| {
            let o = &mut out.spare_capacity_mut()[..numel];
            conv2d_packed::conv(path, &g, xv, nhwc_in, &pw, &rq, a_zp as u8, o, nhwc_out, res)
        };
        let mut run = |res: conv2d_packed::Residual| -> Result<()> {
            if channels_last::dims(x).is_some() {
                channels_last::with_bytes(x, OP, |xv| conv(xv, true, res))?
            } else {
                x.with_contiguous::<u8, _>(OP, |xv| conv(xv, false, res))?
            }
        };
        match in_epilogue {
            Some((o, p)) => channels_last::with_bytes(o, OP, |ov| run(Some((ov, p))))??,
            None => run(None)?,
        }
        // SAFETY: `conv2d_packed::conv` returned Ok, so it wrote all `numel` bytes (every image,
        // pixel and output channel), and `numel` is the capacity `alloc_uninit` reserved
        unsafe { out.set_len(numel) };
        let y = if nhwc_out { channels_last::tensor(OP, out, shape)? } else { Tensor::from_vec(out, &shape)? };
        return match fused_add {
            Some((o, p)) if in_epilogue.is_none() => add::add_tensors(&y, o, p),
            _ => Ok(y),
        };
    }
    let mut out = crate::memory::alloc_filled::<u8>(OP, &shape, 0)?;
    let (img_in, img_out) = (g.c * g.h * g.w, g.oc * g.p());
    w.with_contiguous::<i8, _>(OP, |wv| -> Result<()> {
        let kg = g.kg();
        let rq = RequantParams::new(
            a_scale,
            a_zp,
            &w_scale,
            row_sums(wv, kg, g.oc, kg),
            bias.as_deref(),
            o_scale,
            o_zp,
            relu,
        );
        x.with_contiguous::<u8, _>(OP, |xv| -> Result<()> {
            if img_out == 0 {
                return Ok(());
            }
            let threads = rayon::current_num_threads().max(1);
            if g.n >= 2 && threads > 1 {
                out.par_chunks_mut(img_out).enumerate().try_for_each(|(i, o)| {
                    conv_image(&g, &xv[i * img_in..(i + 1) * img_in], wv, &rq, a_zp as u8, o, false)
                })
            } else {
                for (i, o) in out.chunks_mut(img_out).enumerate() {
                    conv_image(&g, &xv[i * img_in..(i + 1) * img_in], wv, &rq, a_zp as u8, o, true)?;
                }
                Ok(())
            }
        })?
    })??;
    let y = Tensor::from_vec(out, &shape)?;
    match fused_add {
        Some((o, p)) => add::add_tensors(&y, o, p),
        None => Ok(y),
    }
}

/// The weights packed for the fast kernels: cached on the weight tensor's storage (packed once
/// per weight, re-packed after any write to it), or packed for this call when the weight is a
/// non-contiguous view.
fn packed_weight(w: &Tensor, g: &Geom, path: Path) -> Result<Arc<PackedWeight>> {
    const KEY: usize = 0x18c8; // quantized_conv2d packed int8 weights
    let len = g.oc * g.kg();
    // the channels-in-lanes tile (VNNI, one group) reads the weights in panels
    #[cfg(target_arch = "x86_64")]
    let lanes = path == Path::Vnni && super::conv2d_lanes::applies(g);
    #[cfg(not(target_arch = "x86_64"))]
    let lanes = {
        let _ = path;
        false
    };
    if let (Some(st), Some(lay)) = (w.storage(), w.layout()) {
        if lay.is_contiguous() {
            let off = lay.offset();
            let cached = st.derived(&[KEY, off, g.oc, g.cg(), g.kh, g.kw, lanes as usize], |buf| {
                buf.as_slice::<i8>()
                    .and_then(|v| v.get(off..off + len))
                    .map(|ws| Arc::new(PackedWeight::new(ws, g, lanes)))
            });
            if let Some(p) = cached.as_ref() {
                return Ok(Arc::clone(p));
            }
        }
    }
    w.with_contiguous::<i8, _>(OP, |wv| Arc::new(PackedWeight::new(wv, g, lanes)))
}

/// Which AMX kernel runs a convolution (`Direct`: `conv2d_amx.rs`; the small-channel ones:
/// `conv2d_s2d.rs`, `conv2d_im2col.rs`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Amx {
    Direct,
    SpaceToDepth,
    Im2col,
    No,
}

/// The convolution `g` of `x` by `w` on the AMX tiles (`amx`, not `No`), with `requant`'s
/// parameters for the weights' row sums, followed by the fused add when given: channels-last
/// output of `shape` (`numel` bytes).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn conv_amx(
    amx: Amx,
    g: &Geom,
    x: &Tensor,
    w: &Tensor,
    fused_add: Option<(&Tensor, add::Params)>,
    shape: [usize; 4],
    numel: usize,
    requant: impl Fn(Vec<i32>) -> RequantParams,
) -> Result<Tensor> {
    let (ga, pw) = match amx {
        Amx::SpaceToDepth => (conv2d_s2d::geometry(g), amx_weight(w, g, 0x18cb, |ws| conv2d_s2d::weight(ws, g))?),
        Amx::Im2col => (conv2d_im2col::geometry(g), amx_weight(w, g, 0x18ca, |ws| conv2d_im2col::weight(ws, g))?),
        _ => (*g, amx_weight(w, g, 0x18c9, |ws| AmxWeight::new(ws, g))?),
    };
    let mut out = crate::memory::alloc_uninit::<u8>(OP, &shape)?;
    let rq = requant(pw.sums.clone());
    // the residual add in the epilogue when the other operand is channels-last like the output;
    // a row-major one of the output's shape (ResNet-18's first identity, from the max-pool)
    // is copied to channels-last first (one pass over it, instead of an unfused add)
    let in_epilogue = fused_add.filter(|(o, _)| channels_last::dims(o) == Some(shape));
    let copied = match &fused_add {
        Some((o, p)) if in_epilogue.is_none() && o.shape() == shape && g.oc.is_multiple_of(16) => {
            Some((o.with_contiguous::<u8, _>(OP, |ov| conv2d_amx::to_channels_last(ov, g))??, p))
        }
        _ => None,
    };
    let mut run = |xv: &[u8], nhwc: bool, res: Option<(&[u8], &add::Params)>| -> Result<()> {
        let out = &mut out.spare_capacity_mut()[..numel];
        let zp = rq.a_zp as u8;
        match amx {
            Amx::SpaceToDepth => {
                let (xp, image) = conv2d_s2d::pack(g, xv, nhwc, zp)?;
                let px = g.c * g.stride[0] * g.stride[1];
                conv2d_amx::conv_operand(&ga, xp.as_slice(), image, px, &pw, &rq, res, out)
            }
            Amx::Im2col => {
                let (padded, image) = conv2d_im2col::padded_images(g, xv, nhwc, zp)?;
                let gather = conv2d_im2col::gather(g, &padded, image, zp);
                conv2d_amx::conv_gather(&ga, &gather, &pw, &rq, res, out)
            }
            _ => conv2d_amx::conv(g, xv, nhwc, &pw, &rq, zp, res, out),
        }
    };
    let mut with_input = |res: Option<(&[u8], &add::Params)>| -> Result<()> {
        if channels_last::dims(x).is_some() {
            channels_last::with_bytes(x, OP, |xv| run(xv, true, res))?
        } else {
            x.with_contiguous::<u8, _>(OP, |xv| run(xv, false, res))?
        }
    };
    match (&in_epilogue, &copied) {
        (Some((o, p)), _) => channels_last::with_bytes(o, OP, |ov| with_input(Some((ov, p))))??,
        (None, Some((ov, p))) => with_input(Some((ov.as_slice(), p)))?,
        (None, None) => with_input(None)?,
    }
    // SAFETY: the AMX kernel (`conv`, `conv_operand` or `conv_gather`) returned Ok, so it
    // wrote all `numel` bytes (every pixel of every image, every output channel), and `numel`
    // is the capacity `alloc_uninit` reserved
    unsafe { out.set_len(numel) };
    let y = channels_last::tensor(OP, out, shape)?;
    match fused_add {
        Some((o, p)) if in_epilogue.is_none() && copied.is_none() => add::add_tensors(&y, o, p),
        _ => Ok(y),
    }
}

/// The weights packed as AMX B tiles by `pack` (keyed `key`: 0x18c9 direct, 0x18ca im2col
/// columns, 0x18cb space-to-depth), cached on the weight tensor's storage like [`packed_weight`].
#[cfg(target_arch = "x86_64")]
fn amx_weight(w: &Tensor, g: &Geom, key: usize, pack: impl Fn(&[i8]) -> Result<AmxWeight>) -> Result<Arc<AmxWeight>> {
    let len = g.oc * g.kg();
    if let (Some(st), Some(lay)) = (w.storage(), w.layout()) {
        if lay.is_contiguous() {
            let off = lay.offset();
            let cached = st.derived(&[key, off, g.oc, g.cg(), g.kh, g.kw], |buf| {
                buf.as_slice::<i8>().and_then(|v| v.get(off..off + len)).and_then(|ws| pack(ws).ok().map(Arc::new))
            });
            if let Some(p) = cached.as_ref() {
                return Ok(Arc::clone(p));
            }
        }
    }
    w.with_contiguous::<i8, _>(OP, pack)?.map(Arc::new)
}

fn cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let (Ok(x), Ok(w)) = (tensor(OP, args, 0), tensor(OP, args, 3)) else {
        return Cost::default();
    };
    let out_elems: u64 = outs.iter().map(|o| o.numel() as u64).sum();
    // each output element is one weight row (C/groups * kH * kW) of multiply-adds
    let row = w.shape().iter().skip(1).product::<usize>() as u64;
    Cost {
        flops: out_elems.saturating_mul(row).saturating_mul(2),
        bytes: (x.numel() as u64).saturating_add(w.numel() as u64).saturating_add(out_elems),
    }
}

/// `quantized_conv2d(input, input_scale, input_zero_point, weight, weight_scale, bias,
/// output_scale, output_zero_point, stride=1, padding=0, dilation=1, groups=1, relu=False)`.
pub static QUANTIZED_CONV2D: OpDef = OpDef {
    name: "quantized_conv2d",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("input_scale", T::Float),
        ArgSpec::req("input_zero_point", T::Int),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::req("weight_scale", T::Tensor),
        ArgSpec::req("bias", T::OptTensor),
        ArgSpec::req("output_scale", T::Float),
        ArgSpec::req("output_zero_point", T::Int),
        ArgSpec::opt("stride", T::IntList, D::Ints(&[1, 1])),
        ArgSpec::opt("padding", T::IntList, D::Ints(&[0, 0])),
        ArgSpec::opt("dilation", T::IntList, D::Ints(&[1, 1])),
        ArgSpec::opt("groups", T::Int, D::Int(1)),
        ArgSpec::opt("relu", T::Bool, D::Bool(false)),
    ],
    meta: |args| {
        let g = check(args)?;
        Ok(smallvec![TensorMeta::contiguous(&[g.n, g.oc, g.oh, g.ow], DType::U8)])
    },
    kernel,
    cost,
    effect: Effect::Pure,
    category: Category::Convolution,
    backward: None,
    saves: Saves::NOTHING,
    doc:
        "Int8 2-D convolution: uint8 input x int8 weight (i32 accumulate), requantised to uint8 (optional fused ReLU).",
};

/// The convolution geometry of [`quantized_conv2d`] (PyTorch's defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizedConv2dArgs {
    /// Stride per spatial dim.
    pub stride: [i64; 2],
    /// Zero padding per spatial dim (filled with the input zero point, i.e. real 0).
    pub padding: [i64; 2],
    /// Dilation per spatial dim.
    pub dilation: [i64; 2],
    /// Groups.
    pub groups: i64,
    /// Fused ReLU (clamps at the output zero point).
    pub relu: bool,
}

impl Default for QuantizedConv2dArgs {
    fn default() -> Self {
        QuantizedConv2dArgs { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1, relu: false }
    }
}

/// `quantized_conv2d` (see [`QUANTIZED_CONV2D`]): uint8 `[N, C, H, W]` with scale/zero point,
/// int8 weight `[OC, C/groups, kH, kW]` with per-output-channel (or per-tensor) scales and zero
/// point 0, float bias `[OC]`, requantised to uint8 with `output_scale`/`output_zero_point`.
///
/// ```
/// use ferrofx_core::{ops::quantized::{quantized_conv2d, QuantizedConv2dArgs}, Tensor};
/// // a 1x1 input, 3x3 kernel of ones, padding 1: only the centre tap sees the input
/// let x = Tensor::from_vec(vec![7u8], &[1, 1, 1, 1]).unwrap(); // (7 - 3) * 0.5 = 2.0
/// let w = Tensor::from_vec(vec![1i8; 9], &[1, 1, 3, 3]).unwrap();
/// let ws = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
/// let conv = QuantizedConv2dArgs { padding: [1, 1], ..Default::default() };
/// let y = quantized_conv2d(&x, 0.5, 3, &w, &ws, None, 0.25, 0, &conv).unwrap();
/// assert_eq!(y.to_vec::<u8>().unwrap(), vec![8]); // 2.0 / 0.25
/// ```
#[allow(clippy::too_many_arguments)]
pub fn quantized_conv2d(
    input: &Tensor,
    input_scale: f64,
    input_zero_point: i64,
    weight: &Tensor,
    weight_scale: &Tensor,
    bias: Option<&Tensor>,
    output_scale: f64,
    output_zero_point: i64,
    conv: &QuantizedConv2dArgs,
) -> Result<Tensor> {
    let args = [
        input.into(),
        input_scale.into(),
        input_zero_point.into(),
        weight.into(),
        weight_scale.into(),
        bias.into(),
        output_scale.into(),
        output_zero_point.into(),
        Value::Ints(conv.stride.to_vec()),
        Value::Ints(conv.padding.to_vec()),
        Value::Ints(conv.dilation.to_vec()),
        conv.groups.into(),
        conv.relu.into(),
    ];
    let mut out = dispatch(&QUANTIZED_CONV2D, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
