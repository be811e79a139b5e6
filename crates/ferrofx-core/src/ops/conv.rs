//! Convolutions: `conv1d`, `conv2d` (stride, padding incl. `"valid"`/`"same"`, dilation,
//! groups) and `conv_transpose2d`.
//!
//! Every convolution is lowered to the 2-D case (conv1d is conv2d with height 1) and computed
//! per (image, group) unit with GEMMs:
//! - 1x1, stride 1, no padding: one GEMM straight on the input (no copy);
//! - stride 1 on large planes (>= 32x32 outputs; any kernel, dilation, padding): the "shifted GEMM" scheme: the zero-padded input
//!   plane is replicated `kW` times, each copy shifted by one kernel column, and `kH` GEMMs
//!   (`K = C/groups * kW`) accumulate into a "wide" output of `OH x (W + pad)` columns whose
//!   extra columns are dropped afterwards. This moves `kW`x the input instead of im2col's
//!   `kH*kW`x;
//! - 3x3, stride 1, ungrouped float32 (and f16/bf16, computed in f32) with enough channels and
//!   tiles: Winograd F(4x4, 3x3) (`conv/winograd.rs`; [`set_winograd_enabled`] turns it off),
//!   4x fewer multiplies; also for the input gradient of such convolutions (checked first);
//! - depthwise float32 (`groups == in == out channels`, MobileNet's): a direct stencil per
//!   plane (`conv/depthwise.rs`; 3x3 stride 1/2 on AVX-512 by `conv/depthwise3x3.rs`), no GEMM;
//! - float32 with at most 4 input channels (the RGB stems), on AVX-512: a direct kernel
//!   (`conv/direct.rs`), no im2col;
//! - float32 1x1 without padding (any stride) on planes of more than 64 pixels (and more than
//!   64 output channels on planes of 2048+ pixels), on AVX-512: a GEMM over pre-packed weights
//!   reading the input in place, the epilogue in registers (`conv/pointwise.rs`);
//! - otherwise im2col + one GEMM (wide strided kernels through column phases).
//!
//! Units run in parallel (single-threaded GEMMs, one scratch buffer per worker, reused across
//! units) when there are enough of them; otherwise units run one by one with multi-threaded
//! GEMMs, so rayon is never nested. `conv_transpose2d` is GEMM + col2im.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::op::args::{int, ints, opt_tensor, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, OpDef, Outputs, Saves,
};
use crate::ops::kernel;
use crate::ops::linalg::{dtype_title, is_half, match_mat_dtype, MatElem, Par};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;
use std::mem::MaybeUninit;

mod depthwise;
mod depthwise3x3;
mod direct;
mod epilogue;
mod every_other;
mod nchwc;
mod nchwc_depthwise;
mod nchwc_pool;
mod nchwc_reorder;
mod pointwise;
mod winograd;
// whether the CPU has AVX-512F, which the direct float32 kernels (`depthwise3x3`, `direct`,
// `pointwise`, `every_other`) are written for
use super::simd::avx512f as avx512;
use super::team;
pub(crate) use epilogue::apply_block;
use epilogue::Epilogue;
pub use epilogue::{conv2d_fused, Activation, CONV2D_FUSED};
pub use nchwc::{nchwc_conv2d, nchwc_reads_nchw, nchwc_reorder_seconds, nchwc_saving, NCHWC_BLOCK, NCHWC_CONV2D};
pub use nchwc_pool::{nchwc_max_pool2d, NCHWC_MAX_POOL2D};
pub use nchwc_reorder::{nchwc_reorder_input, nchwc_reorder_output, NCHWC_REORDER_INPUT, NCHWC_REORDER_OUTPUT};
pub use winograd::{enabled as winograd_enabled, set_enabled as set_winograd_enabled};

/// The padding argument: explicit sizes or a mode string.
#[derive(Debug, Clone)]
pub enum Padding {
    /// Symmetric padding per spatial dim (one value repeats).
    Sizes(Vec<i64>),
    /// `"valid"` (no padding) or `"same"` (output size = input size; stride 1 only).
    Mode(String),
}

impl From<&[i64]> for Padding {
    fn from(v: &[i64]) -> Self {
        Padding::Sizes(v.to_vec())
    }
}
impl From<i64> for Padding {
    fn from(v: i64) -> Self {
        Padding::Sizes(vec![v])
    }
}
impl From<&str> for Padding {
    fn from(s: &str) -> Self {
        Padding::Mode(s.to_string())
    }
}
impl From<Padding> for Value {
    fn from(p: Padding) -> Self {
        match p {
            Padding::Sizes(v) => Value::Ints(v),
            Padding::Mode(s) => Value::Str(s),
        }
    }
}

/// Fully resolved 2-D convolution geometry (conv1d has `h = kh = 1`).
#[derive(Debug, Clone, Copy)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    /// Output channels.
    o: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    /// Padding before/after, per dim.
    pt: usize,
    pb: usize,
    pl: usize,
    pr: usize,
    dh: usize,
    dw: usize,
    groups: usize,
    oh: usize,
    ow: usize,
}

impl Geom {
    fn cg(&self) -> usize {
        self.c / self.groups
    }
    fn og(&self) -> usize {
        self.o / self.groups
    }
    fn flops(&self) -> u64 {
        // saturating: the cost is asked of hostile geometries too (the compute budget)
        [self.n, self.o, self.oh, self.ow, self.cg(), self.kh, self.kw]
            .iter()
            .fold(2u64, |f, &d| f.saturating_mul(d as u64))
    }
    /// This convolution as a Winograd geometry, when it is 3x3, stride 1, dilation 1 and
    /// ungrouped (whether Winograd pays off is [`winograd::worthwhile`]).
    fn winograd_shape(&self) -> Option<winograd::Geom3> {
        (self.kh == 3
            && self.kw == 3
            && self.sh == 1
            && self.sw == 1
            && self.dh == 1
            && self.dw == 1
            && self.groups == 1)
            .then_some(winograd::Geom3 {
                n: self.n,
                c: self.c,
                h: self.h,
                w: self.w,
                o: self.o,
                oh: self.oh,
                ow: self.ow,
                pt: self.pt,
                pl: self.pl,
            })
    }
    /// The Winograd geometry of this forward convolution, when Winograd applies and pays off.
    fn winograd(&self) -> Option<winograd::Geom3> {
        self.winograd_shape().filter(winograd::worthwhile)
    }
    /// The Winograd geometry of this convolution's input gradient (the convolution of the
    /// output gradient with the flipped, transposed kernel, padded by `2 - p` on each side).
    fn winograd_grad_input(&self) -> Option<winograd::Geom3> {
        let fwd = self.winograd_shape()?;
        if self.pt.max(self.pb).max(self.pl).max(self.pr) > 2 {
            return None;
        }
        let g3 = winograd::Geom3 {
            n: fwd.n,
            c: fwd.o,
            h: fwd.oh,
            w: fwd.ow,
            o: fwd.c,
            oh: fwd.h,
            ow: fwd.w,
            pt: 2 - self.pt,
            pl: 2 - self.pl,
        };
        winograd::worthwhile(&g3).then_some(g3)
    }
}

fn fmt_dims(v: &[usize], sep: &str) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(sep)
}

/// Expands `stride`/`padding`/`dilation` to `nd` values with PyTorch's message on a bad length.
fn expand(op: &str, name: &str, v: &[i64], nd: usize) -> Result<Vec<i64>> {
    match v.len() {
        1 => Ok(vec![v[0]; nd]),
        n if n == nd => Ok(v.to_vec()),
        _ => Err(Error::argument(
            op,
            format!(
                "expected {name} to be a single integer value or a list of {nd} values to match the convolution dimensions, but got {name}={v:?}"
            ),
        )),
    }
}

fn dtype_check(op: &str, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<DType> {
    let dt = x.dtype();
    for (what, t) in [("weight", Some(w)), ("bias", b)] {
        if let Some(t) = t {
            if t.dtype() != dt {
                return Err(Error::dtype(
                    op,
                    format!(
                        "expected scalar type {} but found {} (input is {dt}, {what} is {})",
                        dtype_title(dt),
                        dtype_title(t.dtype()),
                        t.dtype()
                    ),
                ));
            }
        }
    }
    if dt == DType::Bool {
        return Err(Error::dtype(op, format!("\"{op}\" not implemented for 'Bool'")));
    }
    Ok(dt)
}

/// Largest stride, padding and dilation a convolution accepts (2^32).
const MAX_EXTENT: i64 = 1 << 32;

/// Validates a (transposed) convolution's arguments and computes its geometry; `nd` is the
/// number of spatial dims (1 or 2). Returns the geometry and the output shape (without the batch
/// dim for unbatched input).
#[allow(clippy::too_many_arguments)]
fn geometry(
    op: &str,
    nd: usize,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &Value,
    dilation: &[i64],
    groups: i64,
    transposed: Option<&[i64]>,
) -> Result<(Geom, Shape, DType)> {
    let dt = dtype_check(op, x, w, bias)?;
    let xs = x.shape();
    if xs.len() != nd + 1 && xs.len() != nd + 2 {
        return Err(Error::shape(
            op,
            format!(
                "Expected {}D (unbatched) or {}D (batched) input to {op}, but got input of size: {xs:?}",
                nd + 1,
                nd + 2
            ),
        ));
    }
    let ws = w.shape();
    if ws.len() != nd + 2 {
        return Err(Error::shape(
            op,
            format!(
                "expected weight to be {}-D ({}), but got weight of size {ws:?}",
                nd + 2,
                if transposed.is_some() {
                    "in_channels, out_channels/groups, kernel..."
                } else {
                    "out_channels, in_channels/groups, kernel..."
                }
            ),
        ));
    }
    let batched = xs.len() == nd + 2;
    let full: Vec<usize> = if batched { xs.to_vec() } else { std::iter::once(1).chain(xs.iter().copied()).collect() };
    let stride = expand(op, "stride", stride, nd)?;
    let dilation = expand(op, "dilation", dilation, nd)?;
    if stride.iter().any(|&s| s <= 0) {
        return Err(Error::argument(op, format!("non-positive stride is not supported, got stride={stride:?}")));
    }
    if dilation.iter().any(|&d| d <= 0) {
        return Err(Error::argument(op, format!("dilation should be greater than zero, but got {dilation:?}")));
    }
    if groups <= 0 {
        return Err(Error::argument(op, format!("non-positive groups is not supported, got groups={groups}")));
    }
    // sane ranges (sizes come from files): beyond 2^32 a stride or dilation skips past any
    // input, and the window arithmetic would overflow
    for (name, v) in [("stride", &stride), ("dilation", &dilation)] {
        if let Some(&x) = v.iter().find(|&&x| x > MAX_EXTENT) {
            return Err(Error::argument(
                op,
                format!("{name}={v:?} is out of range: {x} is more than 2^32 (4294967296)"),
            ));
        }
    }
    let g = groups as usize;
    let k: Vec<usize> = ws[2..].to_vec();
    // sizes come from files and graphs: checked arithmetic, an overflow is an error
    let overflow = || {
        Error::limit(
            op,
            format!(
                "the sizes of this convolution overflow (input {xs:?}, weight {ws:?}, stride {stride:?}, dilation {dilation:?}, padding {padding:?}); \
                 no real model has such sizes"
            ),
        )
    };
    // (before, after) per spatial dim
    let pads: Vec<(usize, usize)> = match padding {
        Value::Str(s) if transposed.is_none() => match s.as_str() {
            "valid" => vec![(0, 0); nd],
            "same" => {
                if stride.iter().any(|&s| s != 1) {
                    return Err(Error::argument(op, "padding='same' is not supported for strided convolutions"));
                }
                (0..nd)
                    .map(|i| {
                        let total = (dilation[i] as usize).checked_mul(k[i].max(1) - 1).ok_or_else(overflow)?;
                        Ok((total / 2, total - total / 2))
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            other => {
                return Err(Error::argument(
                    op,
                    format!("Invalid padding string: '{other}' (expected 'valid' or 'same')"),
                ))
            }
        },
        Value::Ints(v) => {
            let p = expand(op, "padding", v, nd)?;
            if p.iter().any(|&x| x < 0) {
                return Err(Error::argument(op, format!("negative padding is not supported, got padding={p:?}")));
            }
            if let Some(&x) = p.iter().find(|&&x| x > MAX_EXTENT) {
                return Err(Error::argument(
                    op,
                    format!("padding={p:?} is out of range: {x} is more than 2^32 (4294967296)"),
                ));
            }
            p.iter().map(|&x| (x as usize, x as usize)).collect()
        }
        other => {
            return Err(Error::argument(
                op,
                format!("padding must be an int, a list of ints, 'valid' or 'same', got {other:?}"),
            ))
        }
    };
    let (c, spatial) = (full[1], &full[2..]);
    let (oc, out_sp): (usize, Vec<usize>) = match transposed {
        None => {
            if !ws[0].is_multiple_of(g) {
                return Err(Error::shape(
                    op,
                    format!("Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size [{ws:?}] instead"),
                ));
            }
            if ws[1].checked_mul(g) != Some(c) {
                return Err(Error::shape(
                    op,
                    format!(
                        "Given groups={g}, weight of size {ws:?}, expected input{xs:?} to have {} channels, but got {c} channels instead",
                        ws[1] * g
                    ),
                ));
            }
            let mut out = Vec::with_capacity(nd);
            let mut padded = Vec::with_capacity(nd);
            let mut eff = Vec::with_capacity(nd);
            for i in 0..nd {
                let p =
                    spatial[i].checked_add(pads[i].0).and_then(|p| p.checked_add(pads[i].1)).ok_or_else(overflow)?;
                let e = (dilation[i] as usize)
                    .checked_mul(k[i].max(1) - 1)
                    .and_then(|e| e.checked_add(1))
                    .ok_or_else(overflow)?;
                padded.push(p);
                eff.push(if k[i] == 0 { 0 } else { e });
                out.push(if p >= e && k[i] > 0 { (p - e) / stride[i] as usize + 1 } else { 0 });
            }
            if padded.iter().zip(&eff).any(|(p, e)| p < e) || k.contains(&0) {
                return Err(Error::shape(
                    op,
                    format!(
                        "Calculated padded input size per channel: ({}). Kernel size: ({}). Kernel size can't be greater than actual input size",
                        fmt_dims(&padded, " x "),
                        fmt_dims(&eff, " x ")
                    ),
                ));
            }
            (ws[0], out)
        }
        Some(out_pad) => {
            if ws[0] != c {
                return Err(Error::shape(
                    op,
                    format!(
                        "Given transposed=1, weight of size {ws:?}, expected input{xs:?} to have {} channels, but got {c} channels instead",
                        ws[0]
                    ),
                ));
            }
            if !ws[0].is_multiple_of(g) {
                return Err(Error::shape(
                    op,
                    format!("Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got weight of size [{ws:?}] instead"),
                ));
            }
            let op_pad = expand(op, "output_padding", out_pad, nd)?;
            if op_pad.iter().any(|&x| x < 0) {
                return Err(Error::argument(op, format!("negative output_padding is not supported, got {op_pad:?}")));
            }
            for i in 0..nd {
                if op_pad[i] >= stride[i] && op_pad[i] >= dilation[i] {
                    return Err(Error::argument(
                        op,
                        format!(
                            "output padding must be smaller than either stride or dilation, but got output_padding={op_pad:?}, stride={stride:?}, dilation={dilation:?}"
                        ),
                    ));
                }
            }
            let mut out = Vec::with_capacity(nd);
            for i in 0..nd {
                // in i128: every term fits, and the sum is checked against i64 below
                let v = (spatial[i] as i128 - 1) * stride[i] as i128 - 2 * pads[i].0 as i128
                    + dilation[i] as i128 * (k[i] as i128 - 1)
                    + op_pad[i] as i128
                    + 1;
                out.push(i64::try_from(v).map_err(|_| overflow())?);
            }
            if out.iter().any(|&v| v <= 0) {
                return Err(Error::shape(
                    op,
                    format!(
                        "Given input size per channel: ({}). Calculated output size per channel: ({}). Output size is too small",
                        fmt_dims(spatial, " x "),
                        out.iter().map(|v| v.max(&0).to_string()).collect::<Vec<_>>().join(" x ")
                    ),
                ));
            }
            (ws[1].checked_mul(g).ok_or_else(overflow)?, out.iter().map(|&v| v as usize).collect())
        }
    };
    if let Some(b) = bias {
        if b.ndim() != 1 || b.shape()[0] != oc {
            return Err(Error::shape(
                op,
                format!(
                    "Given weight of size {ws:?}, expected bias to be 1-dimensional with {oc} elements, but got bias of size {:?} instead",
                    b.shape()
                ),
            ));
        }
    }
    let two = |v: &[usize], d: usize| if nd == 2 { v[0] } else { d };
    let last = |v: &[usize]| v[nd - 1];
    let geom = Geom {
        n: full[0],
        c,
        h: two(spatial, 1),
        w: last(spatial),
        o: oc,
        kh: two(&k, 1),
        kw: last(&k),
        sh: if nd == 2 { stride[0] as usize } else { 1 },
        sw: stride[nd - 1] as usize,
        pt: if nd == 2 { pads[0].0 } else { 0 },
        pb: if nd == 2 { pads[0].1 } else { 0 },
        pl: pads[nd - 1].0,
        pr: pads[nd - 1].1,
        dh: if nd == 2 { dilation[0] as usize } else { 1 },
        dw: dilation[nd - 1] as usize,
        groups: g,
        oh: two(&out_sp, 1),
        ow: last(&out_sp),
    };
    let mut shape: Shape = Shape::new();
    if batched {
        shape.push(full[0]);
    }
    shape.push(oc);
    shape.extend_from_slice(&out_sp);
    Ok((geom, shape, dt))
}

// ---------------------------------------------------------------------------------------------
// Forward convolution kernels
// ---------------------------------------------------------------------------------------------

/// Which algorithm a forward convolution uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Algo {
    Pointwise,
    Shifted,
    Im2col,
}

fn choose(g: &Geom) -> Algo {
    if g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt + g.pb + g.pl + g.pr == 0 {
        Algo::Pointwise
    } else if g.sh == 1
        && g.sw == 1
        && g.kw > 1
        && g.oh * g.ow >= 1024
        && (g.h + g.pt + g.pb).saturating_mul(g.w + g.pl + g.pr) <= 4 * g.oh * g.ow
    {
        // Large planes: the shifted scheme moves 1/kh of im2col's data. On small planes the
        // wide output's extra columns and the kh GEMM calls cost more than im2col saves. Its
        // scratch is the padded plane (kw times): with a padding far larger than the output
        // (a hostile file's dilation and padding of 2^14 around a 32x32 output) that would be
        // gigabytes, so such convolutions take im2col, whose scratch follows the output.
        Algo::Shifted
    } else {
        Algo::Im2col
    }
}

/// Whether an im2col convolution of one unit on several threads builds its columns per block of
/// output rows, each thread its own (instead of all columns first, then a GEMM split over the
/// threads): when the output has at least half as many pixels as channels (measured on ResNet's
/// stride-2 3x3 layers, 2 threads: 3-14% faster; on layer4's 7x7 planes, where the weights are
/// ten times the columns, splitting the output channels instead stays), and not for the wide
/// strided kernels `fill_im2col` splits into column phases.
fn blocked_im2col(g: &Geom) -> bool {
    g.oh * g.ow * 2 >= g.og() && g.oh >= 2 && !(g.sw > 1 && g.kw >= 5)
}

/// Scratch sizes (elements) of one unit for the chosen algorithm.
fn scratch_len(g: &Geom, algo: Algo) -> (usize, usize) {
    let (hp, wp) = (g.h + g.pt + g.pb, g.w + g.pl + g.pr);
    match algo {
        Algo::Pointwise => (0, 0),
        Algo::Shifted => (g.cg() * g.kw * hp * wp, g.og() * g.oh * wp),
        Algo::Im2col => (g.cg() * g.kh * g.kw * g.oh * g.ow, 0),
    }
}

/// An epilogue run on each finished block of a convolution's output: `f(block, flat offset of
/// the block's first element in the output)`.
type Post<'a, T> = Option<&'a (dyn Fn(&mut [T], usize) + Sync)>;

/// A raw pointer that may cross threads; users guarantee disjoint access (see call sites).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used to hand disjoint output blocks of one buffer to rayon tasks.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above; the pointer itself is only copied, never dereferenced concurrently for
// the same element.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper, not its field).
    fn ptr(self) -> *mut T {
        self.0
    }
}

/// A GEMM `dst (m x n, row stride dst_rs) = [dst +] a (m x k) @ b (k x n)` with unit column
/// strides for `dst` and `b`; with `bias`, `dst = bias[row] + a @ b` (each block writes its bias
/// right before its GEMM, on the thread that runs it, and `dst` may be uninitialised). With
/// `Par::Pool` (and outside rayon workers) it splits the larger of `m`/`n` into one block per
/// thread and runs single-threaded GEMMs on the blocks: the `gemm` crate's own threading scales
/// poorly for the short-and-wide shapes of convolutions.
///
/// # Safety
/// As [`MatElem::gemm`]: all strided indices of the three operands must be in bounds, `dst`
/// exclusive and disjoint from `a` and `b`. `bias`, if given, holds at least `m` values
/// (asserted).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_split<T: MatElem>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: usize,
    read_dst: bool,
    bias: Option<&[T]>,
    a: *const T,
    a_rs: usize,
    a_cs: usize,
    b: *const T,
    b_rs: usize,
    par: Par,
    post: Post<'_, T>,
    base: usize,
) {
    let one = T::from_i64(1);
    // every row's bias is written before the GEMM reads dst (which may be uninitialised)
    assert!(bias.is_none_or(|bv| bv.len() >= m), "gemm_split: {m} rows need {m} biases");
    let read_dst = read_dst || bias.is_some();
    // the bias of a block: rows i0..i0+mm, columns j0..j0+nn of dst
    let init = |d: *mut T, i0: usize, mm: usize, j0: usize, nn: usize| {
        if let Some(bv) = bias {
            for (r, &v) in bv.iter().enumerate().skip(i0).take(mm) {
                // SAFETY: as `finish` below; written as MaybeUninit (dst may be uninitialised).
                let seg =
                    unsafe { std::slice::from_raw_parts_mut(d.add(r * dst_rs + j0).cast::<MaybeUninit<T>>(), nn) };
                seg.fill(MaybeUninit::new(v));
            }
        }
    };
    // the epilogue of a finished block: rows i0..i0+mm, columns j0..j0+nn of dst
    let finish = |d: *mut T, i0: usize, mm: usize, j0: usize, nn: usize| {
        if let Some(f) = post {
            for r in i0..i0 + mm {
                // SAFETY: the block's rows and columns are inside dst (the caller's bounds) and
                // belong to this block alone; the GEMM that wrote them has returned.
                let seg = unsafe { std::slice::from_raw_parts_mut(d.add(r * dst_rs + j0), nn) };
                f(seg, base + r * dst_rs + j0);
            }
        }
    };
    let threads = team::threads();
    let work = m * n * k;
    if par == Par::Seq || threads <= 1 || work < 1 << 18 {
        init(dst, 0, m, 0, n);
        T::gemm(
            m,
            n,
            k,
            dst,
            dst_rs as isize,
            1,
            read_dst,
            a,
            a_rs as isize,
            a_cs as isize,
            b,
            b_rs as isize,
            1,
            one,
            one,
            Par::Seq,
        );
        finish(dst, 0, m, 0, n);
        return;
    }
    let (d, a, b) = (SendPtr(dst), SendPtr(a as *mut T), SendPtr(b as *mut T));
    if n >= m {
        let step = n.div_ceil(threads).next_multiple_of(16).min(n);
        let chunks = n.div_ceil(step);
        team::for_each(chunks, |ci| {
            let (d, a, b) = (d, a, b);
            let j0 = ci * step;
            let nn = step.min(n - j0);
            init(d.ptr(), 0, m, j0, nn);
            // SAFETY: block ci covers columns j0..j0+nn of dst and b: inside the caller's
            // bounds, and disjoint from every other block's dst columns.
            unsafe {
                T::gemm(
                    m,
                    nn,
                    k,
                    d.0.add(j0),
                    dst_rs as isize,
                    1,
                    read_dst,
                    a.0,
                    a_rs as isize,
                    a_cs as isize,
                    b.0.add(j0),
                    b_rs as isize,
                    1,
                    one,
                    one,
                    Par::Seq,
                )
            }
            finish(d.ptr(), 0, m, j0, nn);
        });
    } else {
        let step = m.div_ceil(threads).next_multiple_of(16).min(m);
        let chunks = m.div_ceil(step);
        team::for_each(chunks, |ci| {
            let (d, a, b) = (d, a, b);
            let i0 = ci * step;
            let mm = step.min(m - i0);
            init(d.ptr(), i0, mm, 0, n);
            // SAFETY: block ci covers rows i0..i0+mm of dst and a: inside the caller's bounds,
            // and disjoint from every other block's dst rows.
            unsafe {
                T::gemm(
                    mm,
                    n,
                    k,
                    d.0.add(i0 * dst_rs),
                    dst_rs as isize,
                    1,
                    read_dst,
                    a.0.add(i0 * a_rs),
                    a_rs as isize,
                    a_cs as isize,
                    b.0,
                    b_rs as isize,
                    1,
                    one,
                    one,
                    Par::Seq,
                )
            }
            finish(d.ptr(), i0, mm, 0, n);
        });
    }
}

/// Runs `f(channel, block)` over `buf` split into per-channel blocks, in parallel when `par`
/// allows and the buffer is large.
fn per_channel<T: Send>(buf: &mut [T], block: usize, par: Par, f: impl Fn(usize, &mut [T]) + Sync) {
    if block == 0 {
        return;
    }
    if par == Par::Pool && team::parallel() && buf.len() >= 1 << 16 {
        team::chunks_mut(buf, block, f);
    } else {
        buf.chunks_mut(block).enumerate().for_each(|(c, b)| f(c, b));
    }
}

/// Fills the shifted-replica buffer for channels of one unit: `xr[c][kj][t] = xpad[c][t + kj*dw]`
/// (flat index into the zero-padded `hp x wp` plane; zero past its end).
fn fill_shifted<T: Copy + Default + Send + Sync>(x: &[T], g: &Geom, xr: &mut [T], par: Par) {
    let (hp, wp) = (g.h + g.pt + g.pb, g.w + g.pl + g.pr);
    let plane = hp * wp;
    let zero = T::default();
    per_channel(xr, g.kw * plane, par, |ci, xc| {
        let src = &x[ci * g.h * g.w..(ci + 1) * g.h * g.w];
        let (base, rest) = xc.split_at_mut(plane);
        // kj = 0: the padded plane itself
        base[..g.pt * wp].fill(zero);
        for r in 0..g.h {
            let row = &mut base[(g.pt + r) * wp..(g.pt + r + 1) * wp];
            row[..g.pl].fill(zero);
            row[g.pl..g.pl + g.w].copy_from_slice(&src[r * g.w..(r + 1) * g.w]);
            row[g.pl + g.w..].fill(zero);
        }
        base[(g.pt + g.h) * wp..].fill(zero);
        for (kj, dst) in rest.chunks_mut(plane).enumerate() {
            let s = (kj + 1) * g.dw;
            let n = plane.saturating_sub(s);
            dst[..n].copy_from_slice(&base[s..s + n]);
            dst[n..].fill(zero);
        }
    });
}

/// im2col for one unit: `col[(c*kh + ki)*kw + kj][oh*ow_n + ow] = xpad[c][oh*sh + ki*dh][ow*sw + kj*dw]`.
fn fill_im2col<T: Copy + Default + Send + Sync>(x: &[T], g: &Geom, col: &mut [T], par: Par) {
    let plane = g.oh * g.ow;
    let every_other = every_other::applies::<T>(g.sw);
    per_channel(col, g.kh * g.kw * plane, par, |ci, block| {
        if g.sw > 1 && g.kw >= 5 {
            im2col_channel_strided(&x[ci * g.h * g.w..(ci + 1) * g.h * g.w], g, block);
            return;
        }
        for (r, dst) in block.chunks_mut(plane).enumerate() {
            im2col_row(x, g, ci * g.kh * g.kw + r, 0..g.oh, dst, every_other);
        }
    });
}

/// The `kh * kw` im2col rows of one channel for a column stride `sw > 1`: the plane is split
/// once into `sw` column phases (`phase[p][r][j] = x[r][j*sw + p]`), after which every output
/// row is a contiguous copy instead of a strided gather. Used for wide kernels (`kw >= 5`, e.g.
/// ResNet's 7x7/2 stem), where many rows share each phase; for 3x3 the split costs more than
/// it saves.
fn im2col_channel_strided<T: Copy + Default>(src: &[T], g: &Geom, block: &mut [T]) {
    let zero = T::default();
    let (sw, wph) = (g.sw, g.w.div_ceil(g.sw));
    let mut phases = vec![zero; sw * g.h * wph];
    for (r, row) in src.chunks_exact(g.w).enumerate() {
        for p in 0..sw.min(g.w) {
            let dst = &mut phases[(p * g.h + r) * wph..][..wph];
            for (d, &v) in dst.iter_mut().zip(row[p..].iter().step_by(sw)) {
                *d = v;
            }
        }
    }
    let own = g.ow;
    for (rr, dst) in block.chunks_mut(g.oh * own).enumerate() {
        let (ki, kj) = (rr / g.kw, rr % g.kw);
        // valid ow range: 0 <= ow*sw + off < w
        let off = (kj * g.dw) as isize - g.pl as isize;
        let lo = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(sw) };
        let hi_num = g.w as isize - off;
        let hi = if hi_num <= 0 { 0 } else { (hi_num as usize).div_ceil(sw).min(own) };
        let lo = lo.min(hi);
        let first = ((lo * sw) as isize + off).max(0) as usize; // source column of ow = lo
        let (ph, j0) = (first % sw, first / sw);
        for oh in 0..g.oh {
            let drow = &mut dst[oh * own..(oh + 1) * own];
            let ih = (oh * g.sh + ki * g.dh) as isize - g.pt as isize;
            if ih < 0 || ih >= g.h as isize || lo == hi {
                drow.fill(zero);
                continue;
            }
            let prow = &phases[(ph * g.h + ih as usize) * wph..][..wph];
            drow[..lo].fill(zero);
            drow[lo..hi].copy_from_slice(&prow[j0..j0 + (hi - lo)]);
            drow[hi..].fill(zero);
        }
    }
}

/// Output rows `rows` of row `(c, ki, kj)` of the im2col matrix (`dst`: `rows.len() * ow`
/// columns); `every_other`: column stride 2 gathered by [`every_other::copy`] (which must be
/// available for `T`).
fn im2col_row<T: Copy + Default>(
    x: &[T],
    g: &Geom,
    r: usize,
    rows: std::ops::Range<usize>,
    dst: &mut [T],
    every_other: bool,
) {
    let zero = T::default();
    let own = g.ow;
    {
        let kj = r % g.kw;
        let ki = (r / g.kw) % g.kh;
        let ci = r / (g.kw * g.kh);
        let src = &x[ci * g.h * g.w..(ci + 1) * g.h * g.w];
        // valid ow range: 0 <= ow*sw + kj*dw - pl < w
        let off = (kj * g.dw) as isize - g.pl as isize;
        let lo = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(g.sw) };
        let hi_num = g.w as isize - off; // ow*sw < hi_num
        let hi = if hi_num <= 0 { 0 } else { (hi_num as usize).div_ceil(g.sw).min(own) };
        let lo = lo.min(hi);
        for (i, oh) in rows.enumerate() {
            let drow = &mut dst[i * own..(i + 1) * own];
            let ih = (oh * g.sh + ki * g.dh) as isize - g.pt as isize;
            if ih < 0 || ih >= g.h as isize {
                drow.fill(zero);
                continue;
            }
            let srow = &src[ih as usize * g.w..(ih as usize + 1) * g.w];
            drow[..lo].fill(zero);
            if lo == hi {
                // no column of this kernel tap lands in the input (a kernel wider than the
                // input plus padding): the whole row is padding
            } else if g.sw == 1 {
                let s0 = (lo as isize + off) as usize;
                drow[lo..hi].copy_from_slice(&srow[s0..s0 + (hi - lo)]);
            } else if every_other {
                // columns s0, s0 + 2, ..., s0 + 2 (hi - lo - 1) < w by the choice of lo and hi
                let s0 = (2 * lo as isize + off) as usize;
                every_other::copy(&srow[s0..], &mut drow[lo..hi]);
            } else {
                // first source column: lo*sw + off >= 0 by the choice of lo
                let s0 = ((lo * g.sw) as isize + off) as usize;
                for (d, &v) in drow[lo..hi].iter_mut().zip(srow[s0.min(srow.len())..].iter().step_by(g.sw)) {
                    *d = v;
                }
            }
            drow[hi..].fill(zero);
        }
    }
}

/// One (image, group) unit of a forward convolution.
/// `x`: the unit's input channels `[cg, h, w]`; `w`: the group's weights `[og, cg, kh, kw]`
/// (or, for `Shifted`, the reordered `[kh, og, cg, kw]`); `out`: `[og, oh, ow]`.
#[allow(clippy::too_many_arguments)]
fn conv_unit<T: MatElem>(
    g: &Geom,
    algo: Algo,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    out: &mut [MaybeUninit<T>],
    s1: &mut Vec<T>,
    s2: &mut Vec<T>,
    par: Par,
    post: Post<'_, T>,
    base: usize,
) {
    let (cg, og) = (g.cg(), g.og());
    let ohw = g.oh * g.ow;
    // Every element of `out` is written below: by the GEMM (which, given the bias, writes each
    // block's bias right before it reads it) or by the copy out of the shifted scheme's wide
    // rows (which hold the bias).
    let out_ptr = out.as_mut_ptr().cast::<T>();
    match algo {
        Algo::Pointwise => {
            // SAFETY: w is [og, cg] contiguous, x is [cg, h*w] contiguous, out is [og, h*w]
            // contiguous; out is exclusively borrowed and disjoint from x and w.
            unsafe {
                gemm_split(og, ohw, cg, out_ptr, ohw, false, bias, w.as_ptr(), cg, 1, x.as_ptr(), ohw, par, post, base)
            }
        }
        Algo::Im2col if par == Par::Pool && team::threads() > 1 && team::parallel() && blocked_im2col(g) => {
            // column blocks: each task builds the im2col columns of its own output rows (in its
            // core's cache) and runs its GEMM on them
            let kk = cg * g.kh * g.kw;
            let every_other = every_other::applies::<T>(g.sw);
            let per = g.oh.div_ceil(team::threads());
            let optr = SendPtr(out_ptr);
            team::for_each(g.oh.div_ceil(per), |bi| {
                let (r0, r1) = (bi * per, ((bi + 1) * per).min(g.oh));
                let nn = (r1 - r0) * g.ow;
                let mut col = vec![T::default(); kk * nn];
                for (r, dst) in col.chunks_mut(nn).enumerate() {
                    im2col_row(x, g, r, r0..r1, dst, every_other);
                }
                // SAFETY: w is [og, kk], col [kk, nn], both contiguous; the block is columns
                // r0*ow..r1*ow of every row of out ([og, ohw]): in bounds, and no other block
                // writes them.
                unsafe {
                    gemm_split(
                        og,
                        nn,
                        kk,
                        optr.ptr().add(r0 * g.ow),
                        ohw,
                        false,
                        bias,
                        w.as_ptr(),
                        kk,
                        1,
                        col.as_ptr(),
                        nn,
                        Par::Seq,
                        post,
                        base + r0 * g.ow,
                    )
                }
            });
        }
        Algo::Im2col => {
            let (len, _) = scratch_len(g, algo);
            s1.resize(len, T::default());
            fill_im2col(x, g, s1, par);
            let kk = cg * g.kh * g.kw;
            // SAFETY: w is [og, kk], col is [kk, ohw], out is [og, ohw], all contiguous and in
            // bounds; out is disjoint from both.
            unsafe {
                gemm_split(og, ohw, kk, out_ptr, ohw, false, bias, w.as_ptr(), kk, 1, s1.as_ptr(), ohw, par, post, base)
            }
        }
        Algo::Shifted => {
            let (len1, len2) = scratch_len(g, algo);
            s1.resize(len1, T::default());
            s2.resize(len2, T::default());
            fill_shifted(x, g, s1, par);
            let wp = g.w + g.pl + g.pr;
            let plane = (g.h + g.pt + g.pb) * wp;
            let nw = g.oh * wp; // wide output columns
            let kk = cg * g.kw;
            let wide = &mut s2[..];
            // the first GEMM writes the bias (or overwrites the wide rows), the others add
            for ki in 0..g.kh {
                // SAFETY: lhs = w[ki] is [og, cg*kw] contiguous inside w ([kh, og, cg, kw]);
                // rhs rows (c, kj) start at (c*kw + kj)*plane + ki*dh*wp and span nw columns:
                // ki*dh*wp + oh*wp <= hp*wp = plane, so every read is inside s1 (cg*kw planes);
                // wide is [og, nw] and disjoint from both.
                unsafe {
                    gemm_split(
                        og,
                        nw,
                        kk,
                        wide.as_mut_ptr(),
                        nw,
                        ki > 0,
                        if ki == 0 { bias } else { None },
                        w.as_ptr().add(ki * og * kk),
                        kk,
                        1,
                        s1.as_ptr().add(ki * g.dh * wp),
                        plane,
                        par,
                        None,
                        0,
                    )
                }
            }
            for (o, orow) in out.chunks_mut(ohw).enumerate() {
                let src = &wide[o * nw..(o + 1) * nw];
                for oh in 0..g.oh {
                    for (d, &v) in orow[oh * g.ow..(oh + 1) * g.ow].iter_mut().zip(&src[oh * wp..oh * wp + g.ow]) {
                        d.write(v);
                    }
                }
            }
            if let Some(f) = post {
                // SAFETY: every element of `out` was written just above.
                let done = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<T>(), out.len()) };
                f(done, base);
            }
        }
    }
}

/// Forward convolution on contiguous `x` `[n, c, h, w]`, `w` `[o, cg, kh, kw]`.
fn conv_forward<T: MatElem>(
    op: &str,
    g: &Geom,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    post: Post<'_, T>,
) -> Result<Vec<T>> {
    let algo = choose(g);
    let (cg, og) = (g.cg(), g.og());
    // the scratch of one unit (per worker) must be allocatable: refused here, with the sizes,
    // rather than aborting in a worker (x and w exist, so their sizes are known to fit)
    let (hp, wp) = (g.h + g.pt + g.pb, g.w + g.pl + g.pr);
    let scratch = match algo {
        Algo::Pointwise => Some(0),
        Algo::Shifted => [cg, g.kw, hp, wp].iter().try_fold(1usize, |a, &b| a.checked_mul(b)),
        Algo::Im2col => [cg, g.kh, g.kw, g.oh, g.ow].iter().try_fold(1usize, |a, &b| a.checked_mul(b)),
    };
    crate::memory::check_alloc(op, &[scratch.unwrap_or(usize::MAX)], T::DTYPE)
        .map_err(|e| Error::limit(op, format!("the convolution's work buffer (im2col columns): {}", e.message())))?;
    let unit_in = cg * g.h * g.w;
    let unit_out = og * g.oh * g.ow;
    let unit_w = og * cg * g.kh * g.kw;
    // The shifted scheme wants weights as [group][kh][og][cg][kw].
    let wr: Vec<T>;
    let wsrc: &[T] = if algo == Algo::Shifted {
        let mut v = vec![T::default(); w.len()];
        for gi in 0..g.groups {
            for o in 0..og {
                for c in 0..cg {
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            v[gi * unit_w + ((ki * og + o) * cg + c) * g.kw + kj] =
                                w[gi * unit_w + ((o * cg + c) * g.kh + ki) * g.kw + kj];
                        }
                    }
                }
            }
        }
        wr = v;
        &wr
    } else {
        w
    };
    let len = g.n * g.o * g.oh * g.ow;
    // not zero-filled: conv_unit writes every element of its unit (see there)
    let mut buf: Vec<T> = crate::memory::alloc_uninit(op, &[g.n, g.o, g.oh, g.ow])?;
    let out = &mut buf.spare_capacity_mut()[..len];
    if out.is_empty() {
        return Ok(Vec::new());
    }
    let units = g.n * g.groups;
    let threads = team::threads();
    let run = |u: usize, o: &mut [MaybeUninit<T>], s1: &mut Vec<T>, s2: &mut Vec<T>, par: Par| {
        let (ni, gi) = (u / g.groups, u % g.groups);
        let xi = &x[ni * g.c * g.h * g.w + gi * unit_in..][..unit_in];
        let wi = &wsrc[gi * unit_w..(gi + 1) * unit_w];
        let bi = bias.map(|b| &b[gi * og..(gi + 1) * og]);
        conv_unit(g, algo, xi, wi, bi, o, s1, s2, par, post, u * unit_out);
    };
    let work_per_unit = unit_out * cg * g.kh * g.kw;
    if threads > 1 && units >= threads && units * work_per_unit >= 1 << 16 {
        // one run of units (and one pair of scratch buffers) per thread
        let optr = SendPtr(out.as_mut_ptr());
        team::ranges(units, threads, |r| {
            let (mut s1, mut s2) = (Vec::new(), Vec::new());
            for u in r {
                // SAFETY: unit u's output is elements u*unit_out..(u+1)*unit_out of `out`
                // (units * unit_out = len), exclusively borrowed here; ranges are disjoint.
                let o = unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(u * unit_out), unit_out) };
                run(u, o, &mut s1, &mut s2, Par::Seq);
            }
        });
    } else {
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        for (u, o) in out.chunks_mut(unit_out).enumerate() {
            run(u, o, &mut s1, &mut s2, Par::Pool);
        }
    }
    // SAFETY: the units cover all `len` elements and conv_unit initialised each of them
    // (alloc_uninit reserved exactly n * o * oh * ow = len elements).
    unsafe { buf.set_len(len) };
    Ok(buf)
}

/// Transposed convolution on contiguous `x` `[n, c, h, w]`, `w` `[c, og, kh, kw]`: per unit
/// `col = W_g^T @ x_g` then col2im (scatter-add) into the output.
fn conv_transpose_forward<T: MatElem>(g: &Geom, x: &[T], w: &[T], bias: Option<&[T]>) -> Vec<T> {
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let (ih, iw) = (g.h, g.w);
    let hw = ih * iw;
    let rows = og * g.kh * g.kw;
    let unit_out = og * g.oh * g.ow;
    let mut out = vec![T::default(); g.n * g.o * g.oh * g.ow];
    if out.is_empty() {
        return out;
    }
    let one = T::from_i64(1);
    let units = g.n * g.groups;
    let threads = rayon::current_num_threads();
    let run = |u: usize, o: &mut [T], col: &mut Vec<T>, par: Par| {
        let (ni, gi) = (u / g.groups, u % g.groups);
        let xi = &x[ni * g.c * hw + gi * cg * hw..][..cg * hw];
        let wi = &w[gi * cg * rows..(gi + 1) * cg * rows];
        col.resize(rows * hw, T::default());
        // SAFETY: wi is [cg, rows] contiguous, read as its transpose [rows, cg] (rs 1, cs rows);
        // xi is [cg, hw]; col is [rows, hw]; all in bounds and col is disjoint.
        unsafe {
            T::gemm(
                rows,
                hw,
                cg,
                col.as_mut_ptr(),
                hw as isize,
                1,
                false,
                wi.as_ptr(),
                1,
                rows as isize,
                xi.as_ptr(),
                hw as isize,
                1,
                one,
                one,
                par,
            )
        }
        for (oc, orow) in o.chunks_mut(g.oh * g.ow).enumerate() {
            if let Some(b) = bias {
                orow.fill(b[gi * og + oc]);
            }
            for ki in 0..g.kh {
                for kj in 0..g.kw {
                    let crow = &col[((oc * g.kh + ki) * g.kw + kj) * hw..][..hw];
                    for y in 0..ih {
                        let oy = (y * g.sh + ki * g.dh) as isize - g.pt as isize;
                        if oy < 0 || oy >= g.oh as isize {
                            continue;
                        }
                        let orow_y = &mut orow[oy as usize * g.ow..(oy as usize + 1) * g.ow];
                        for xx in 0..iw {
                            let ox = (xx * g.sw + kj * g.dw) as isize - g.pl as isize;
                            if ox >= 0 && (ox as usize) < g.ow {
                                let d = &mut orow_y[ox as usize];
                                *d = add(*d, crow[y * iw + xx]);
                            }
                        }
                    }
                }
            }
        }
    };
    if threads > 1 && units >= threads && rayon::current_thread_index().is_none() {
        out.par_chunks_mut(unit_out).enumerate().for_each_init(Vec::new, |col, (u, o)| run(u, o, col, Par::Seq));
    } else {
        let mut col = Vec::new();
        for (u, o) in out.chunks_mut(unit_out).enumerate() {
            run(u, o, &mut col, Par::Pool);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Backward kernels (first-order gradients, used when the backward pass records no graph)
// ---------------------------------------------------------------------------------------------

/// col2im for one unit, the adjoint of [`fill_im2col`]: adds every row `(c, ki, kj)` of `col`
/// (`[cg*kh*kw, oh*ow]`) back into the input-gradient plane it was gathered from.
fn col2im_add<T: MatElem>(col: &[T], g: &Geom, gx: &mut [T], par: Par) {
    let plane = g.oh * g.ow;
    let khw = g.kh * g.kw;
    per_channel(gx, g.h * g.w, par, |ci, gplane| {
        for rr in 0..khw {
            let (ki, kj) = (rr / g.kw, rr % g.kw);
            let src = &col[(ci * khw + rr) * plane..][..plane];
            // valid ow range as in im2col_row: 0 <= ow*sw + kj*dw - pl < w
            let off = (kj * g.dw) as isize - g.pl as isize;
            let lo = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(g.sw) };
            let hi_num = g.w as isize - off;
            let hi = if hi_num <= 0 { 0 } else { (hi_num as usize).div_ceil(g.sw).min(g.ow) };
            let lo = lo.min(hi);
            for oh in 0..g.oh {
                let ih = (oh * g.sh + ki * g.dh) as isize - g.pt as isize;
                if ih < 0 || ih >= g.h as isize || lo == hi {
                    continue;
                }
                let srow = &src[oh * g.ow..(oh + 1) * g.ow];
                let drow = &mut gplane[ih as usize * g.w..(ih as usize + 1) * g.w];
                let s0 = ((lo * g.sw) as isize + off) as usize;
                if g.sw == 1 {
                    for (d, &v) in drow[s0..s0 + (hi - lo)].iter_mut().zip(&srow[lo..hi]) {
                        *d = add(*d, v);
                    }
                } else {
                    for (d, &v) in drow[s0..].iter_mut().step_by(g.sw).zip(&srow[lo..hi]) {
                        *d = add(*d, v);
                    }
                }
            }
        }
    });
}

/// Gradient of a forward convolution with respect to its input: per (image, group) unit,
/// `col = W_gᵀ · gy` (one GEMM) and col2im into `gx` (`[n, c, h, w]`).
fn conv_grad_input<T: MatElem>(g: &Geom, gy: &[T], w: &[T]) -> Vec<T> {
    let (cg, og) = (g.cg(), g.og());
    let kk = cg * g.kh * g.kw;
    let ohw = g.oh * g.ow;
    let unit_x = cg * g.h * g.w;
    let mut gx = vec![T::default(); g.n * g.c * g.h * g.w];
    if gx.is_empty() || ohw == 0 {
        return gx;
    }
    let run = |u: usize, gxu: &mut [T], col: &mut Vec<T>, par: Par| {
        let (ni, gi) = (u / g.groups, u % g.groups);
        let gyu = &gy[(ni * g.o + gi * og) * ohw..][..og * ohw];
        let wg = &w[gi * og * kk..(gi + 1) * og * kk];
        col.resize(kk * ohw, T::default());
        // SAFETY: wg is [og, kk] contiguous, read as its transpose [kk, og] (rs 1, cs kk); gyu
        // is [og, ohw] contiguous; col is [kk, ohw] and disjoint from both.
        unsafe {
            gemm_split(
                kk,
                ohw,
                og,
                col.as_mut_ptr(),
                ohw,
                false,
                None,
                wg.as_ptr(),
                1,
                kk,
                gyu.as_ptr(),
                ohw,
                par,
                None,
                0,
            )
        }
        col2im_add(col, g, gxu, par);
    };
    let units = g.n * g.groups;
    let threads = rayon::current_num_threads();
    if threads > 1 && units >= threads && rayon::current_thread_index().is_none() {
        gx.par_chunks_mut(unit_x).enumerate().for_each_init(Vec::new, |col, (u, gxu)| run(u, gxu, col, Par::Seq));
    } else {
        let mut col = Vec::new();
        for (u, gxu) in gx.chunks_mut(unit_x).enumerate() {
            run(u, gxu, &mut col, Par::Pool);
        }
    }
    gx
}

/// Gradient of a forward convolution with respect to its weight: per group,
/// `gw_g = Σ_n gy[n, g] · im2col(x[n, g])ᵀ`. Images are split across threads, each summing
/// into its own partial gradient (im2col and GEMM both run in parallel), then the partials
/// are added.
fn conv_grad_weight<T: MatElem>(g: &Geom, x: &[T], gy: &[T]) -> Vec<T> {
    let (cg, og) = (g.cg(), g.og());
    let kk = cg * g.kh * g.kw;
    let ohw = g.oh * g.ow;
    let unit_in = cg * g.h * g.w;
    let len = g.o * kk;
    let one = T::from_i64(1);
    // Adds image `ni`'s contribution to `acc` (`[o, kk]`).
    let image = |ni: usize, acc: &mut [T], col: &mut Vec<T>, par: Par| {
        for gi in 0..g.groups {
            let xi = &x[ni * g.c * g.h * g.w + gi * unit_in..][..unit_in];
            col.resize(kk * ohw, T::default());
            fill_im2col(xi, g, col, par);
            let gyu = &gy[(ni * g.o + gi * og) * ohw..][..og * ohw];
            let dst = &mut acc[gi * og * kk..(gi + 1) * og * kk];
            // SAFETY: gyu is [og, ohw] contiguous; col is [kk, ohw] contiguous, read as its
            // transpose [ohw, kk] (rs 1, cs ohw); dst is [og, kk] contiguous and disjoint.
            unsafe {
                T::gemm(
                    og,
                    kk,
                    ohw,
                    dst.as_mut_ptr(),
                    kk as isize,
                    1,
                    true,
                    gyu.as_ptr(),
                    ohw as isize,
                    1,
                    col.as_ptr(),
                    1,
                    ohw as isize,
                    one,
                    one,
                    par,
                )
            }
        }
    };
    let threads = rayon::current_num_threads();
    if len == 0 || ohw == 0 {
        return vec![T::default(); len];
    }
    if threads > 1 && g.n >= 2 && rayon::current_thread_index().is_none() {
        let parts = threads.min(g.n);
        let per = g.n.div_ceil(parts);
        let partials: Vec<Vec<T>> = (0..parts)
            .into_par_iter()
            .map(|t| {
                let mut acc = vec![T::default(); len];
                let mut col = Vec::new();
                for ni in t * per..((t + 1) * per).min(g.n) {
                    image(ni, &mut acc, &mut col, Par::Seq);
                }
                acc
            })
            .collect();
        let mut it = partials.into_iter();
        let mut gw = it.next().unwrap_or_else(|| vec![T::default(); len]);
        for p in it {
            for (a, b) in gw.iter_mut().zip(p) {
                *a = add(*a, b);
            }
        }
        gw
    } else {
        let mut gw = vec![T::default(); len];
        let mut col = Vec::new();
        for ni in 0..g.n {
            image(ni, &mut gw, &mut col, Par::Pool);
        }
        gw
    }
}

/// First-order gradients of `conv1d`/`conv2d` (`op`, with its forward `args`) from the output
/// gradient `gy`: `(grad_input, grad_weight)`, each computed only when asked for. These are
/// kernels, not differentiable ops: the backward formula uses them when no graph of the
/// backward pass is recorded (`create_graph=False`), and its differentiable form otherwise.
pub(crate) fn conv_input_weight_grads(
    op: &str,
    nd: usize,
    args: &[Value],
    gy: &Tensor,
    need_input: bool,
    need_weight: bool,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let (g, _, dt) = conv_geom(op, nd, args)?;
    let (x, w, _) = conv_args(op, args)?;
    if gy.numel() != g.n * g.o * g.oh * g.ow {
        return Err(Error::shape(
            op,
            format!("gradient of shape {:?} does not match the convolution's output", gy.shape()),
        ));
    }
    if is_half(dt) {
        let (x32, w32, gy32) =
            (kernel::cast(x, DType::F32)?, kernel::cast(w, DType::F32)?, kernel::cast(gy, DType::F32)?);
        let mut a32: Vec<Value> = args.to_vec();
        a32[0] = Value::Tensor(x32);
        a32[1] = Value::Tensor(w32);
        if let Some(b) = a32.get_mut(2) {
            *b = Value::None;
        }
        let (gx, gw) = conv_input_weight_grads(op, nd, &a32, &gy32, need_input, need_weight)?;
        return Ok((gx.map(|t| kernel::cast(&t, dt)).transpose()?, gw.map(|t| kernel::cast(&t, dt)).transpose()?));
    }
    let gy = if gy.dtype() != dt { kernel::cast(gy, dt)? } else { gy.clone() };
    match_mat_dtype!(op, dt, E => {
        let gyc = kernel::contiguous(&gy)?;
        let gx = if let (true, DType::F32, Some(g3)) = (need_input, dt, g.winograd_grad_input()) {
            let wc = kernel::contiguous(w)?;
            let v = gyc.with_contiguous::<f32, _>(op, |gys| {
                wc.with_contiguous::<f32, _>(op, |ws| {
                    winograd::with_transformed_weight(ws, g.o, g.c, true, |u| winograd::conv3x3(gys, &g3, u, None))
                })
            })??;
            Some(Tensor::from_vec(v, x.shape())?)
        } else if need_input {
            let wc = kernel::contiguous(w)?;
            let v = gyc.with_contiguous::<E, _>(op, |gys| wc.with_contiguous::<E, _>(op, |ws| conv_grad_input(&g, gys, ws)))??;
            Some(Tensor::from_vec(v, x.shape())?)
        } else {
            None
        };
        let gw = if let (true, DType::F32, Some(g3)) = (need_weight, dt, g.winograd()) {
            let xc = kernel::contiguous(x)?;
            let v = gyc.with_contiguous::<f32, _>(op, |gys| xc.with_contiguous::<f32, _>(op, |xs| winograd::conv3x3_grad_weight(xs, gys, &g3)))??;
            Some(Tensor::from_vec(v, w.shape())?)
        } else if need_weight {
            let xc = kernel::contiguous(x)?;
            let v = gyc.with_contiguous::<E, _>(op, |gys| xc.with_contiguous::<E, _>(op, |xs| conv_grad_weight(&g, xs, gys)))??;
            Some(Tensor::from_vec(v, w.shape())?)
        } else {
            None
        };
        Ok((gx, gw))
    })
}

#[inline(always)]
fn add<T: MatElem>(a: T, b: T) -> T {
    a.add_wrapping(b)
}

/// The cached forward Winograd transform of `w`, for weights that will not change under
/// autograd's eyes (no grad mode, or no `requires_grad`: inference). The cache lives on the
/// weights' storage ([`crate::storage::Storage::derived`]): any write to the weights
/// invalidates it, and it is freed with them. `None` when the weights are not cacheable
/// (training: the caller transforms them into a scratch buffer per call).
fn cached_winograd_weight(w: &Tensor, g: &Geom) -> Option<std::sync::Arc<Vec<f32>>> {
    const KEY: usize = 0x3a3; // Winograd F(4x4, 3x3) forward weights
    let (st, lay) = (w.storage()?, w.layout()?);
    let cacheable = !crate::autograd::is_grad_enabled() || !w.requires_grad();
    if !cacheable || !lay.is_contiguous() {
        return None;
    }
    let (off, len) = (lay.offset(), g.o * g.c * 9);
    // (an empty vector stands for "the storage does not hold these f32 weights")
    let u = st.derived(&[KEY, off, g.o, g.c], |buf| {
        buf.as_slice::<f32>()
            .and_then(|v| v.get(off..off + len))
            .map(|ws| winograd::transform_weight(ws, g.o, g.c, false))
            .unwrap_or_default()
    });
    (!u.is_empty()).then_some(u)
}

fn contiguous_vec<T: Element>(op: &str, t: &Tensor) -> Result<Vec<T>> {
    t.with_contiguous::<T, _>(op, |s| s.to_vec())
}

/// A direct float32 forward kernel: `(geometry, x, w, bias, out, epilogue)`, every element of
/// `out` written.
type DirectKernel = fn(&Geom, &[f32], &[f32], Option<&[f32]>, &mut [MaybeUninit<f32>], Option<&Epilogue<'_>>);

/// Runs a float32 kernel that writes **every** element of the `[n, o, oh, ow]` output: `f`
/// gets the contiguous input, weights and bias and the uninitialised output buffer (allocated
/// fallibly, never zero-filled).
#[allow(clippy::too_many_arguments)]
fn run_into_uninit(
    op: &str,
    g: &Geom,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    shape: &Shape,
    f: impl FnOnce(&[f32], &[f32], Option<&[f32]>, &mut [MaybeUninit<f32>]) -> Result<()>,
) -> Result<Tensor> {
    let xc = kernel::contiguous(x)?;
    let wc = kernel::contiguous(w)?;
    let bv = b.map(|b| contiguous_vec::<f32>(op, b)).transpose()?;
    let len = g.n * g.o * g.oh * g.ow;
    let mut buf: Vec<f32> = crate::memory::alloc_uninit(op, &[g.n, g.o, g.oh, g.ow])?;
    xc.with_contiguous::<f32, _>(op, |xs| {
        wc.with_contiguous::<f32, _>(op, |ws| f(xs, ws, bv.as_deref(), &mut buf.spare_capacity_mut()[..len]))
    })???;
    // SAFETY: alloc_uninit reserved exactly `len` elements and `f` initialised every one of
    // them (the contract of the kernels passed here).
    unsafe { buf.set_len(len) };
    Tensor::from_vec(buf, shape)
}

/// Runs a convolution kernel on concrete tensors, computing f16/bf16 in f32. `ep` (float32
/// forward convolutions only) is applied to each finished block of output.
#[allow(clippy::too_many_arguments)]
fn run_conv(
    op: &str,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    g: &Geom,
    shape: &Shape,
    dt: DType,
    transposed: bool,
    ep: Option<&Epilogue<'_>>,
) -> Result<Tensor> {
    if ep.is_some() && (transposed || dt != DType::F32) {
        return Err(Error::dtype(op, format!("a fused epilogue needs a float32 forward convolution, got {dt:?}")));
    }
    // every path below allocates an output of `shape`: refuse one over the allocation limit
    // before any work (the non-transposed path also reserves it fallibly)
    crate::memory::check_alloc(op, shape, dt)?;
    if is_half(dt) {
        let x32 = kernel::cast(x, DType::F32)?;
        let w32 = kernel::cast(w, DType::F32)?;
        let b32 = b.map(|b| kernel::cast(b, DType::F32)).transpose()?;
        let r = run_conv(op, &x32, &w32, b32.as_ref(), g, shape, DType::F32, transposed, None)?;
        return kernel::cast(&r, dt);
    }
    // the direct float32 kernels: depthwise, and few input channels (stems)
    let direct_kernel: Option<DirectKernel> = match (transposed, dt) {
        (false, DType::F32) if depthwise::applies(g) => Some(depthwise::conv),
        (false, DType::F32) if direct::applies(g) => Some(direct::conv),
        _ => None,
    };
    if let Some(run) = direct_kernel {
        return run_into_uninit(op, g, x, w, b, shape, |xs, ws, bv, out| {
            run(g, xs, ws, bv, out, ep);
            Ok(())
        });
    }
    // float32 1x1 convolutions on AVX-512: pre-packed weights, epilogue in registers
    if !transposed && dt == DType::F32 && pointwise::applies(g) {
        return run_into_uninit(op, g, x, w, b, shape, |xs, ws, bv, out| {
            pointwise::conv(op, g, xs, w, ws, bv, out, ep)
        });
    }
    if let (false, DType::F32, Some(g3)) = (transposed, dt, g.winograd()) {
        let xc = kernel::contiguous(x)?;
        let wc = kernel::contiguous(w)?;
        let bv = b.map(|b| contiguous_vec::<f32>(op, b)).transpose()?;
        let bias = bv.as_deref();
        let mut out = match cached_winograd_weight(w, g) {
            Some(u) => xc.with_contiguous::<f32, _>(op, |xs| winograd::conv3x3(xs, &g3, &u, bias))?,
            None => xc.with_contiguous::<f32, _>(op, |xs| {
                wc.with_contiguous::<f32, _>(op, |ws| {
                    winograd::with_transformed_weight(ws, g.o, g.c, false, |u| winograd::conv3x3(xs, &g3, u, bias))
                })
            })??,
        };
        if let Some(ep) = ep {
            ep.apply_all(&mut out);
        }
        return Tensor::from_vec(out, shape);
    }
    if let Some(ep) = ep {
        let xc = kernel::contiguous(x)?;
        let wc = kernel::contiguous(w)?;
        let bv = b.map(|b| contiguous_vec::<f32>(op, b)).transpose()?;
        let post = |seg: &mut [f32], off: usize| ep.apply(seg, off);
        let out = xc.with_contiguous::<f32, _>(op, |xs| {
            wc.with_contiguous::<f32, _>(op, |ws| {
                conv_forward(op, g, xs, ws, bv.as_deref(), Some(&post as &(dyn Fn(&mut [f32], usize) + Sync)))
            })
        })???;
        return Tensor::from_vec(out, shape);
    }
    match_mat_dtype!(op, dt, E => {
        let xc = kernel::contiguous(x)?;
        let wc = kernel::contiguous(w)?;
        let bv = b.map(|b| contiguous_vec::<E>(op, b)).transpose()?;
        let out = xc.with_contiguous::<E, _>(op, |xs| {
            wc.with_contiguous::<E, _>(op, |ws| {
                if transposed {
                    Ok(conv_transpose_forward(g, xs, ws, bv.as_deref()))
                } else {
                    conv_forward(op, g, xs, ws, bv.as_deref(), None)
                }
            })
        })???;
        Tensor::from_vec(out, shape)
    })
}

// ---------------------------------------------------------------------------------------------
// Op definitions
// ---------------------------------------------------------------------------------------------

fn conv_args<'a>(op: &str, args: &'a [Value]) -> Result<(&'a Tensor, &'a Tensor, Option<&'a Tensor>)> {
    Ok((tensor(op, args, 0)?, tensor(op, args, 1)?, opt_tensor(op, args, 2)?))
}

fn conv_geom(op: &str, nd: usize, args: &[Value]) -> Result<(Geom, Shape, DType)> {
    let (x, w, b) = conv_args(op, args)?;
    let pad = args.get(4).cloned().unwrap_or(Value::Ints(vec![0]));
    geometry(op, nd, x, w, b, &ints(op, args, 3)?, &pad, &ints(op, args, 5)?, int(op, args, 6)?, None)
}

fn convt_geom(op: &str, args: &[Value]) -> Result<(Geom, Shape, DType)> {
    let (x, w, b) = conv_args(op, args)?;
    let pad = Value::Ints(ints(op, args, 4)?.into_owned());
    geometry(
        op,
        2,
        x,
        w,
        b,
        &ints(op, args, 3)?,
        &pad,
        &ints(op, args, 7)?,
        int(op, args, 6)?,
        Some(&ints(op, args, 5)?),
    )
}

fn conv_cost_of(g: &Geom, args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes = 0u64;
    for a in args {
        a.for_each_tensor(|t| bytes = bytes.saturating_add(t.meta_nbytes() as u64));
    }
    bytes = outs.iter().fold(bytes, |b, o| b.saturating_add(o.nbytes() as u64));
    Cost { flops: g.flops(), bytes }
}

const CONV_SCHEMA_1D: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("weight", T::Tensor),
    ArgSpec::opt("bias", T::OptTensor, D::None),
    ArgSpec::opt("stride", T::IntList, D::Ints(&[1])),
    ArgSpec::opt("padding", T::IntListOrStr, D::Ints(&[0])),
    ArgSpec::opt("dilation", T::IntList, D::Ints(&[1])),
    ArgSpec::opt("groups", T::Int, D::Int(1)),
];
const CONV_SCHEMA_2D: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("weight", T::Tensor),
    ArgSpec::opt("bias", T::OptTensor, D::None),
    ArgSpec::opt("stride", T::IntList, D::Ints(&[1, 1])),
    ArgSpec::opt("padding", T::IntListOrStr, D::Ints(&[0, 0])),
    ArgSpec::opt("dilation", T::IntList, D::Ints(&[1, 1])),
    ArgSpec::opt("groups", T::Int, D::Int(1)),
];

macro_rules! conv_op {
    ($static:ident, $name:literal, $nd:expr, $schema:expr, $doc:literal) => {
        #[doc = $doc]
        pub static $static: OpDef = OpDef {
            name: $name,
            schema: $schema,
            meta: |args| {
                let (_, shape, dt) = conv_geom($name, $nd, args)?;
                Ok(smallvec![TensorMeta::contiguous(&shape, dt)])
            },
            kernel: |args| {
                let (g, shape, dt) = conv_geom($name, $nd, args)?;
                let (x, w, b) = conv_args($name, args)?;
                Ok(smallvec![run_conv($name, x, w, b, &g, &shape, dt, false, None)?])
            },
            cost: |args, outs| match conv_geom($name, $nd, args) {
                Ok((g, _, _)) => conv_cost_of(&g, args, outs),
                Err(_) => Cost::default(),
            },
            effect: Effect::Pure,
            category: Category::Convolution,
            backward: Some(crate::autograd::formulas::nn::conv_backward),
            saves: Saves::inputs(0b11),
            doc: $doc,
        };
    };
}

conv_op!(CONV1D, "conv1d", 1, CONV_SCHEMA_1D, "1-D convolution over `[N, C, L]` (or unbatched `[C, L]`) input.");
conv_op!(CONV2D, "conv2d", 2, CONV_SCHEMA_2D, "2-D convolution over `[N, C, H, W]` (or unbatched `[C, H, W]`) input.");

/// `conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
/// dilation=1)`; weight is `[in_channels, out_channels/groups, kH, kW]`.
pub static CONV_TRANSPOSE2D: OpDef = OpDef {
    name: "conv_transpose2d",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("weight", T::Tensor),
        ArgSpec::opt("bias", T::OptTensor, D::None),
        ArgSpec::opt("stride", T::IntList, D::Ints(&[1, 1])),
        ArgSpec::opt("padding", T::IntList, D::Ints(&[0, 0])),
        ArgSpec::opt("output_padding", T::IntList, D::Ints(&[0, 0])),
        ArgSpec::opt("groups", T::Int, D::Int(1)),
        ArgSpec::opt("dilation", T::IntList, D::Ints(&[1, 1])),
    ],
    meta: |args| {
        let (_, shape, dt) = convt_geom("conv_transpose2d", args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, dt)])
    },
    kernel: |args| {
        let op = "conv_transpose2d";
        let (g, shape, dt) = convt_geom(op, args)?;
        let (x, w, b) = conv_args(op, args)?;
        Ok(smallvec![run_conv(op, x, w, b, &g, &shape, dt, true, None)?])
    },
    cost: |args, outs| match convt_geom("conv_transpose2d", args) {
        Ok((g, _, _)) => {
            // same multiply-adds as the forward conv it is the gradient of
            let mut c = conv_cost_of(&g, args, outs);
            c.flops = 2 * (g.n * g.c * g.h * g.w * (g.o / g.groups) * g.kh * g.kw) as u64;
            c
        }
        Err(_) => Cost::default(),
    },
    effect: Effect::Pure,
    category: Category::Convolution,
    backward: Some(crate::autograd::formulas::nn::conv_transpose2d_backward),
    saves: Saves { inputs: 3, outputs: 0 },
    doc: "2-D transposed convolution (the gradient of conv2d with respect to its input).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &CONV1D,
    &CONV2D,
    &CONV_TRANSPOSE2D,
    &CONV2D_FUSED,
    &NCHWC_CONV2D,
    &NCHWC_REORDER_INPUT,
    &NCHWC_REORDER_OUTPUT,
    &NCHWC_MAX_POOL2D,
];

// ---------------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------------

fn one(op: &'static OpDef, args: &[Value]) -> Result<Tensor> {
    let mut out: Outputs = dispatch(op, CallKind::Function, args)?;
    out.pop().ok_or_else(|| Error::schema(op.name, "op returned no output"))
}

/// `torch.nn.functional.conv1d(input, weight, bias, stride, padding, dilation, groups)`.
pub fn conv1d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: impl Into<Padding>,
    dilation: &[i64],
    groups: i64,
) -> Result<Tensor> {
    one(
        &CONV1D,
        &[
            input.into(),
            weight.into(),
            bias.into(),
            stride.into(),
            padding.into().into(),
            dilation.into(),
            Value::Int(groups),
        ],
    )
}

/// `torch.nn.functional.conv2d(input, weight, bias, stride, padding, dilation, groups)`;
/// `padding` is an int, a list, `"valid"` or `"same"`.
pub fn conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: impl Into<Padding>,
    dilation: &[i64],
    groups: i64,
) -> Result<Tensor> {
    one(
        &CONV2D,
        &[
            input.into(),
            weight.into(),
            bias.into(),
            stride.into(),
            padding.into().into(),
            dilation.into(),
            Value::Int(groups),
        ],
    )
}

/// `torch.nn.functional.conv_transpose2d(input, weight, bias, stride, padding, output_padding,
/// groups, dilation)`.
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    output_padding: &[i64],
    groups: i64,
    dilation: &[i64],
) -> Result<Tensor> {
    one(
        &CONV_TRANSPOSE2D,
        &[
            input.into(),
            weight.into(),
            bias.into(),
            stride.into(),
            padding.into(),
            output_padding.into(),
            Value::Int(groups),
            dilation.into(),
        ],
    )
}
