//! Pooling: `max_pool1d`/`max_pool2d` (and `*_with_indices`), `avg_pool1d`/`avg_pool2d`,
//! `adaptive_avg_pool2d`, `adaptive_max_pool2d` (values and indices).
//!
//! Output sizes, window bounds, padding rules, NaN propagation and index conventions (flat
//! index into each input plane, int64) follow PyTorch's CPU kernels. 1-D pools run as 2-D pools
//! of height 1. Planes (batch x channel) are processed in parallel when the work is large.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::op::args::{bool_, ints, opt_int, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, MetaOutputs, OpDef, Outputs, Saves,
};
use crate::ops::kernel::PAR_THRESHOLD;
use crate::ops::linalg::dtype_title;
use crate::ops::simd::simd_dispatch;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;

mod max_f32;
mod max_u8;

/// The driver of the row-major max-pool kernels (`max_f32.rs`, `max_u8.rs`): a new `planes x oh
/// x ow` output, its planes split over the kernels' team when there is enough work, each chunk
/// of whole planes computed by `planes(g, x, first plane, chunk)`, which writes every element.
fn max_pool_by_planes<E: Element>(
    op: &str,
    g: &PoolGeom,
    x: &[E],
    planes: fn(&PoolGeom, &[E], usize, &mut [std::mem::MaybeUninit<E>]),
) -> Result<Vec<E>> {
    use crate::ops::team;
    assert!(x.len() >= g.planes * g.h * g.w, "max_pool: input size");
    let plane_out = g.oh * g.ow;
    let len = g.planes * plane_out;
    let mut out: Vec<E> = crate::memory::alloc_uninit(op, &[g.planes, g.oh, g.ow])?;
    if len > 0 {
        let buf = &mut out.spare_capacity_mut()[..len];
        let work = len * g.kh * g.kw;
        if team::threads() > 1 && team::parallel() && g.planes > 1 && work >= 1 << 16 {
            let per = g.planes.div_ceil(4 * team::threads());
            team::chunks_mut(buf, per * plane_out, |i, chunk| planes(g, x, i * per, chunk));
        } else {
            planes(g, x, 0, buf);
        }
    }
    // SAFETY: alloc_uninit reserved `len` elements and `planes` wrote every one of them.
    unsafe { out.set_len(len) };
    Ok(out)
}

/// Pooling geometry in 2-D form (1-D pools have `h = kh = 1`): input planes and size, kernel,
/// stride, padding, dilation and output size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolGeom {
    pub(crate) planes: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sh: usize,
    pub(crate) sw: usize,
    pub(crate) ph: usize,
    pub(crate) pw: usize,
    pub(crate) dh: usize,
    pub(crate) dw: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

fn expand_n(op: &str, name: &str, v: &[i64], nd: usize) -> Result<Vec<i64>> {
    match v.len() {
        1 => Ok(vec![v[0]; nd]),
        n if n == nd => Ok(v.to_vec()),
        n => Err(Error::argument(
            op,
            format!("{op}: {name} must either be a single int, or a tuple of {nd} ints, got {n} values {v:?}"),
        )),
    }
}

/// PyTorch's `pooling_output_shape`, in i128 (the sizes come from files and graphs: no term
/// can overflow); callers check the result's range.
fn out_size(input: i64, k: i64, pad: i64, s: i64, d: i64, ceil: bool) -> i128 {
    let (input, k, pad, s, d) = (input as i128, k as i128, pad as i128, s as i128, d as i128);
    let num = input + 2 * pad - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut o = num.div_euclid(s) + 1;
    if ceil && (o - 1) * s >= input + pad {
        o -= 1;
    }
    o
}

/// Input ranks accepted: `nd + 1` (unbatched) or `nd + 2`; returns (leading shape, planes, spatial).
fn split_input(op: &str, x: &Tensor, nd: usize) -> Result<(Shape, usize, Vec<usize>)> {
    let s = x.shape();
    let ok_rank = s.len() == nd + 1 || s.len() == nd + 2;
    let nonempty = ok_rank && s[s.len() - nd - 1..].iter().all(|&d| d > 0);
    if !ok_rank || !nonempty {
        return Err(Error::shape(
            op,
            format!(
                "non-empty {}D or {}D (batch mode) tensor expected for input, but got input of size {s:?}",
                nd + 1,
                nd + 2
            ),
        ));
    }
    let lead: Shape = s[..s.len() - nd].into();
    let planes = lead.iter().product();
    Ok((lead, planes, s[s.len() - nd..].to_vec()))
}

fn check_dtype(op: &str, dt: DType, allow_int: bool) -> Result<()> {
    if dt == DType::Bool || (!allow_int && !dt.is_floating_point()) {
        return Err(Error::dtype(op, format!("\"{op}\" not implemented for '{}'", dtype_title(dt))));
    }
    Ok(())
}

/// Largest kernel size, stride, padding, dilation and effective kernel a pool accepts (2^32).
const MAX_EXTENT: i64 = 1 << 32;

/// Validates a max/avg pool call and computes its geometry and output shape.
#[allow(clippy::too_many_arguments)]
fn pool_geom(
    op: &str,
    nd: usize,
    x: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil: bool,
) -> Result<(PoolGeom, Shape)> {
    let (lead, planes, sp) = split_input(op, x, nd)?;
    let k = expand_n(op, "kernel_size", kernel, nd)?;
    let s = if stride.is_empty() { k.clone() } else { expand_n(op, "stride", stride, nd)? };
    let p = expand_n(op, "padding", padding, nd)?;
    let d = expand_n(op, "dilation", dilation, nd)?;
    if k.iter().any(|&v| v <= 0) {
        return Err(Error::argument(op, format!("kernel size should be greater than zero, but got kernel_size={k:?}")));
    }
    if s.iter().any(|&v| v <= 0) {
        return Err(Error::argument(op, format!("stride should be greater than zero, but got stride={s:?}")));
    }
    if d.iter().any(|&v| v <= 0) {
        return Err(Error::argument(op, format!("dilation should be greater than zero, but got dilation={d:?}")));
    }
    if p.iter().any(|&v| v < 0) {
        return Err(Error::argument(op, format!("pad must be non-negative, but got padding={p:?}")));
    }
    // sane ranges (sizes come from files): a window wider than 2^32 covers no real input, and
    // beyond it the window arithmetic would overflow
    for (name, v) in [("kernel_size", &k), ("stride", &s), ("padding", &p), ("dilation", &d)] {
        if let Some(&x) = v.iter().find(|&&x| x > MAX_EXTENT) {
            return Err(Error::argument(
                op,
                format!("{name}={v:?} is out of range: {x} is more than 2^32 (4294967296), wider than any input"),
            ));
        }
    }
    for i in 0..nd {
        let eff = (k[i] as i128 - 1) * d[i] as i128 + 1;
        if eff > MAX_EXTENT as i128 {
            return Err(Error::argument(
                op,
                format!(
                    "the effective kernel size (kernel_size - 1) * dilation + 1 = {eff} (kernel_size={k:?}, dilation={d:?}) is more than 2^32, wider than any input"
                ),
            ));
        }
    }
    for i in 0..nd {
        if p[i] as i128 > ((k[i] as i128 - 1) * d[i] as i128 + 1) / 2 {
            return Err(Error::argument(
                op,
                format!(
                    "pad should be at most half of effective kernel size, but got pad={}, kernel_size={} and dilation={}",
                    p[i], k[i], d[i]
                ),
            ));
        }
    }
    // an output size past i64 (a 2^62 kernel with a 2^61 padding) is as impossible as one below 1
    let out: Vec<i64> =
        (0..nd).map(|i| i64::try_from(out_size(sp[i] as i64, k[i], p[i], s[i], d[i], ceil)).unwrap_or(-1)).collect();
    if out.iter().any(|&o| o < 1) {
        let c = if !lead.is_empty() { lead[lead.len() - 1] } else { 1 };
        let fmt = |v: &mut dyn Iterator<Item = i64>| v.map(|x| x.to_string()).collect::<Vec<_>>().join("x");
        return Err(Error::shape(
            op,
            format!(
                "Given input size: ({c}x{}). Calculated output size: ({c}x{}). Output size is too small",
                fmt(&mut sp.iter().map(|&x| x as i64)),
                fmt(&mut out.iter().map(|&x| x.max(0)))
            ),
        ));
    }
    let two = |v: &[i64], dflt: i64| (if nd == 2 { v[0] } else { dflt }) as usize;
    let last = |v: &[i64]| v[nd - 1] as usize;
    let spi: Vec<i64> = sp.iter().map(|&x| x as i64).collect();
    let g = PoolGeom {
        planes,
        h: two(&spi, 1),
        w: last(&spi),
        kh: two(&k, 1),
        kw: last(&k),
        sh: two(&s, 1),
        sw: last(&s),
        ph: two(&p, 0),
        pw: last(&p),
        dh: two(&d, 1),
        dw: last(&d),
        oh: two(&out, 1),
        ow: last(&out),
    };
    let mut shape = lead;
    shape.extend(out.iter().map(|&o| o as usize));
    Ok((g, shape))
}

/// Runs `f(plane_in, plane_out_values, plane_out_indices)` over all planes, in parallel when
/// large. `idx` is empty when indices are not wanted.
fn for_planes<T: Element>(
    x: &[T],
    in_plane: usize,
    out: &mut [T],
    idx: &mut [i64],
    out_plane: usize,
    work: usize,
    f: impl Fn(&[T], &mut [T], &mut [i64]) + Sync,
) {
    if out_plane == 0 {
        return;
    }
    let with_idx = !idx.is_empty();
    if work >= PAR_THRESHOLD && rayon::current_thread_index().is_none() {
        if with_idx {
            out.par_chunks_mut(out_plane)
                .zip(idx.par_chunks_mut(out_plane))
                .enumerate()
                .for_each(|(p, (o, i))| f(&x[p * in_plane..(p + 1) * in_plane], o, i));
        } else {
            out.par_chunks_mut(out_plane)
                .enumerate()
                .for_each(|(p, o)| f(&x[p * in_plane..(p + 1) * in_plane], o, &mut []));
        }
    } else if with_idx {
        for (p, (o, i)) in out.chunks_mut(out_plane).zip(idx.chunks_mut(out_plane)).enumerate() {
            f(&x[p * in_plane..(p + 1) * in_plane], o, i);
        }
    } else {
        for (p, o) in out.chunks_mut(out_plane).enumerate() {
            f(&x[p * in_plane..(p + 1) * in_plane], o, &mut []);
        }
    }
}

/// `true` for NaN (x != x), for any element type.
#[inline(always)]
#[allow(clippy::eq_op)]
fn is_nan<T: PartialOrd>(v: T) -> bool {
    v != v
}

/// `a` if it is larger or NaN, else `b`: PyTorch's `(val > maxval) || isnan(val)`, so NaN
/// propagates from either side.
#[inline(always)]
fn nan_max<T: Element>(a: T, b: T) -> T {
    if a > b || is_nan(a) {
        a
    } else {
        b
    }
}

fn max_pool_impl<T: Element>(g: &PoolGeom, x: &[T], want_idx: bool) -> (Vec<T>, Vec<i64>) {
    let plane_out = g.oh * g.ow;
    let mut out = vec![T::default(); g.planes * plane_out];
    let mut idx = if want_idx { vec![0i64; out.len()] } else { Vec::new() };
    let work = out.len().saturating_mul(g.kh).saturating_mul(g.kw);
    if !want_idx && g.dh == 1 && g.dw == 1 {
        for_planes(x, g.h * g.w, &mut out, &mut idx, plane_out, work, |xp, op, _| max_plane_separable(g, xp, op));
        return (out, idx);
    }
    for_planes(x, g.h * g.w, &mut out, &mut idx, plane_out, work, |xp, op, ip| {
        let mut scan = ArgmaxScan::new(g, xp);
        for oh in 0..g.oh {
            let (vals, at) = scan.row(oh);
            op[oh * g.ow..(oh + 1) * g.ow].copy_from_slice(vals);
            if want_idx {
                for (d, &i) in ip[oh * g.ow..(oh + 1) * g.ow].iter_mut().zip(at) {
                    *d = i as i64;
                }
            }
        }
    });
    (out, idx)
}

/// The maxima and argmaxes of a plane's windows, one output row at a time, equal to
/// [`window_max`]'s (same scan order, so the same first maximum and NaN rule) but
/// vectorisable: each input row is split into its `stride` column phases once, so a window
/// column is a contiguous run over the outputs of a row, and the interior outputs (windows
/// inside the columns) are scanned as whole rows with branch-free compare-selects. Edge
/// outputs, dilated windows and planes too large for `u32` indices use [`window_max`].
struct ArgmaxScan<'a, T> {
    g: &'a PoolGeom,
    xp: &'a [T],
    /// `phases[(r * sw + p) * plen + k] = xp[r * w + k * sw + p]`
    phases: Vec<T>,
    plen: usize,
    /// interior outputs `lo..hi` of every row (empty when the fast path does not apply)
    lo: usize,
    hi: usize,
    vals: Vec<T>,
    at: Vec<u32>,
}

impl<'a, T: Element> ArgmaxScan<'a, T> {
    fn new(g: &'a PoolGeom, xp: &'a [T]) -> Self {
        let (lo, mut hi) = (g.pw.div_ceil(g.sw), 0);
        let fast = g.dh == 1 && g.dw == 1 && g.h * g.w < u32::MAX as usize && g.w + g.pw >= g.kw;
        if fast {
            hi = ((g.w + g.pw - g.kw) / g.sw + 1).min(g.ow);
        }
        let (lo, hi) = if hi > lo { (lo, hi) } else { (0, 0) };
        let plen = g.w.div_ceil(g.sw);
        let mut phases = Vec::new();
        if hi > lo && g.sw > 1 {
            phases.resize(g.h * g.sw * plen, T::default());
            for (row, dst) in xp.chunks_exact(g.w).zip(phases.chunks_exact_mut(g.sw * plen)) {
                if g.sw == 2 {
                    // the common stride, as a plain deinterleave
                    let (even, odd) = dst.split_at_mut(plen);
                    for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(row.chunks_exact(2)) {
                        *e = pair[0];
                        *o = pair[1];
                    }
                    if g.w % 2 == 1 {
                        even[plen - 1] = row[g.w - 1];
                    }
                } else {
                    for (k, v) in row.iter().enumerate() {
                        dst[(k % g.sw) * plen + k / g.sw] = *v;
                    }
                }
            }
        }
        ArgmaxScan { g, xp, phases, plen, lo, hi, vals: vec![T::default(); g.ow], at: vec![0; g.ow] }
    }

    /// Values and flat plane indices of the maxima of output row `oh`.
    fn row(&mut self, oh: usize) -> (&[T], &[u32]) {
        let g = self.g;
        let top = (oh * g.sh) as isize - g.ph as isize;
        let (hs, he) = (top.max(0) as usize, ((top + g.kh as isize).min(g.h as isize)).max(0) as usize);
        let (lo, hi) = if hs < he { (self.lo, self.hi) } else { (0, 0) };
        for ow in (0..lo).chain(hi..g.ow) {
            let (v, i) = window_max(g, self.xp, oh, ow);
            self.vals[ow] = v;
            self.at[ow] = i as u32;
        }
        if lo < hi {
            let n = hi - lo;
            let (b, bi) = (&mut self.vals[lo..hi], &mut self.at[lo..hi]);
            let mut first = true;
            for r in hs..he {
                for j in 0..g.kw {
                    // input column of output ow: ow * sw + t, t = j - pw
                    let t = j as isize - g.pw as isize;
                    let start = (lo * g.sw) as isize + t; // >= 0 for interior outputs
                    let src: &[T] = if g.sw == 1 {
                        &self.xp[r * g.w + start as usize..][..n]
                    } else {
                        let (p, q) = (t.rem_euclid(g.sw as isize) as usize, t.div_euclid(g.sw as isize));
                        &self.phases[(r * g.sw + p) * self.plen + (lo as isize + q) as usize..][..n]
                    };
                    let base = (r * g.w) as u32 + start as u32;
                    let step = g.sw as u32;
                    if first {
                        b.copy_from_slice(src);
                        for (k, d) in bi.iter_mut().enumerate() {
                            *d = base + k as u32 * step;
                        }
                        first = false;
                        continue;
                    }
                    select_max_any(b, bi, src, base, step);
                }
            }
        }
        (&self.vals, &self.at)
    }
}

/// The smallest value of `T`: what a max pool's window with no input element gives (PyTorch
/// starts every window at `-inf`, or the integer type's `lowest()`).
fn lowest<T: Element>() -> T {
    match T::DTYPE {
        DType::Bool | DType::U8 => T::from_i64(0),
        DType::I8 => T::from_i64(i8::MIN.into()),
        DType::I16 => T::from_i64(i16::MIN.into()),
        DType::I32 => T::from_i64(i32::MIN.into()),
        DType::I64 => T::from_i64(i64::MIN),
        _ => T::from_f64(f64::NEG_INFINITY),
    }
}

/// The maximum of output `(oh, ow)`'s window in plane `xp` and its flat index: a row-major
/// scan in which the first maximum wins (PyTorch's order: it decides which input a tie's
/// gradient goes to) and NaN propagates; an empty window gives 0 at its clamped start.
#[inline(always)]
fn window_max<T: Element>(g: &PoolGeom, xp: &[T], oh: usize, ow: usize) -> (T, usize) {
    let mut hs = (oh * g.sh) as isize - g.ph as isize;
    let he = (hs + ((g.kh - 1) * g.dh + 1) as isize).min(g.h as isize);
    while hs < 0 {
        hs += g.dh as isize;
    }
    let mut ws = (ow * g.sw) as isize - g.pw as isize;
    let we = (ws + ((g.kw - 1) * g.dw + 1) as isize).min(g.w as isize);
    while ws < 0 {
        ws += g.dw as isize;
    }
    let mut bi = (hs.max(0) as usize) * g.w + ws.max(0) as usize;
    if hs >= he || ws >= we {
        // a dilated window whose taps all fall in the padding: PyTorch's initial value
        return (lowest::<T>(), bi);
    }
    let mut b = xp[bi];
    let mut y = hs as usize;
    while y < he as usize {
        let row = &xp[y * g.w..(y + 1) * g.w];
        let mut xx = ws as usize;
        while xx < we as usize {
            let v = row[xx];
            if v > b || is_nan(v) {
                b = v;
                bi = y * g.w + xx;
            }
            xx += g.dw;
        }
        y += g.dh;
    }
    (b, bi)
}

/// The input gradient of `max_pool1d`/`max_pool2d` (`op`, with its forward `args`): each
/// output's gradient added at its window's argmax, found by the same scan as the forward's
/// indices, in one pass per plane (no index tensor, no scatter). The backward formula uses it
/// when backward records no graph (`create_graph=False`).
pub(crate) fn max_pool_grad_input(op: &str, nd: usize, args: &[Value], gy: &Tensor, relu_mask: bool) -> Result<Tensor> {
    let a = max_args(op, nd, args, true)?;
    let x = tensor(op, args, 0)?;
    let g = &a.g;
    let plane_out = g.oh * g.ow;
    if gy.numel() != g.planes * plane_out {
        return Err(Error::shape(
            op,
            format!("gradient of shape {:?} does not match the output {:?}", gy.shape(), a.shape),
        ));
    }
    let dt = x.dtype();
    let gy = if gy.dtype() != dt { gy.to_dtype(dt)? } else { gy.clone() };
    crate::match_dtype!(dt, E => {
        let v = x.with_contiguous::<E, _>(op, |xs| {
            gy.with_contiguous::<E, _>(op, |gs| -> Result<Vec<E>> {
                let plane_in = g.h * g.w;
                // not zero-filled here: each plane is zeroed by its own task, in cache right
                // before its gradients are added (a zeroed allocation is one more pass over
                // memory, on one thread)
                let mut gx: Vec<E> = crate::memory::alloc_uninit(op, x.shape())?;
                let run = |(p, gp): (usize, &mut [std::mem::MaybeUninit<E>])| {
                    for v in gp.iter_mut() {
                        v.write(E::default());
                    }
                    // SAFETY: every element of the plane was initialised just above
                    let gp = unsafe { &mut *(gp as *mut [std::mem::MaybeUninit<E>] as *mut [E]) };
                    let xp = &xs[p * plane_in..(p + 1) * plane_in];
                    let gyp = &gs[p * plane_out..(p + 1) * plane_out];
                    let mut scan = ArgmaxScan::new(g, xp);
                    for oh in 0..g.oh {
                        let (_, at) = scan.row(oh);
                        for (&i, &gv) in at.iter().zip(&gyp[oh * g.ow..(oh + 1) * g.ow]) {
                            let i = i as usize;
                            // summed through f64 (halves round once per addition)
                            gp[i] = E::from_f64(gp[i].to_f64() + gv.to_f64());
                        }
                    }
                    if relu_mask {
                        relu_mask_in_place(gp, xp);
                    }
                };
                let spare = &mut gx.spare_capacity_mut()[..xs.len()];
                if plane_in > 0 {
                    if xs.len() >= PAR_THRESHOLD && rayon::current_thread_index().is_none() {
                        spare.par_chunks_mut(plane_in).enumerate().for_each(run);
                    } else {
                        spare.chunks_mut(plane_in).enumerate().for_each(run);
                    }
                }
                // SAFETY: alloc_uninit reserved xs.len() elements; the planes of `plane_in`
                // elements cover all of them (none when plane_in == 0, then xs is empty)
                unsafe { gx.set_len(xs.len()) };
                Ok(gx)
            })
        })???;
        Tensor::from_vec(v, x.shape())
    })
}

simd_dispatch! {
    /// `g[i] *= (x[i] > 0) as 1.0 / 0.0`: the backward of the `relu` whose output is `x`, as
    /// the unfused graph computes it (`mul(grad, gt(x, 0))`, so a NaN or infinite gradient
    /// where `x <= 0` gives NaN, and a negative one -0.0, exactly as there).
    fn relu_mask_in_place<T: Element>(g: &mut [T], x: &[T]) {
        for (gv, &xv) in g.iter_mut().zip(x) {
            let keep = xv > T::default();
            let masked = T::from_f64(gv.to_f64() * 0.0);
            *gv = if keep { *gv } else { masked };
        }
    }
}

/// [`select_max`], with AVX-512 masked loads and stores for float32 where the CPU has them
/// (a row's interior outputs are rarely a multiple of 16: ResNet's stem pool has 55, whose
/// remainder the generic loop runs one lane at a time).
#[inline]
fn select_max_any<T: Element>(b: &mut [T], bi: &mut [u32], src: &[T], base: u32, step: u32) {
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && std::arch::is_x86_feature_detected!("avx512f") {
        let n = b.len().min(bi.len()).min(src.len());
        // SAFETY: T is f32 (checked just above), so the slices are f32 slices of at least `n`
        // elements; the CPU has AVX-512F (checked just above)
        unsafe {
            let b = std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut f32, n);
            let src = std::slice::from_raw_parts(src.as_ptr() as *const f32, n);
            select_max_f32_avx512(b, &mut bi[..n], src, base, step);
        }
        return;
    }
    select_max(b, bi, src, base, step)
}

/// [`select_max`] on float32, 16 lanes at a time, the last block masked.
///
/// # Safety
/// The CPU must support AVX-512F; `b`, `bi` and `src` have the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn select_max_f32_avx512(b: &mut [f32], bi: &mut [u32], src: &[f32], base: u32, step: u32) {
    use std::arch::x86_64::*;
    let n = b.len();
    debug_assert!(bi.len() == n && src.len() == n);
    let lane_step = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(step as i32),
    );
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
        // SAFETY: lanes outside the mask are neither read nor written; lanes inside are at
        // indices < n of slices of length n
        let v = _mm512_maskz_loadu_ps(m, src.as_ptr().add(i));
        let bv = _mm512_maskz_loadu_ps(m, b.as_ptr().add(i));
        // (v > b) | isnan(v), the generic loop's rule
        let take = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(m, v, bv) | _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, v, v);
        _mm512_mask_storeu_ps(b.as_mut_ptr().add(i), take, v);
        let idx =
            _mm512_add_epi32(_mm512_set1_epi32(base.wrapping_add((i as u32).wrapping_mul(step)) as i32), lane_step);
        _mm512_mask_storeu_epi32(bi.as_mut_ptr().add(i) as *mut i32, take, idx);
        i += 16;
    }
}

simd_dispatch! {
    /// `b[k], bi[k] = src[k], base + k * step` where `src[k]` is larger than `b[k]` or NaN: one
    /// step of [`ArgmaxScan`]'s scan, compiled for AVX2/AVX-512 when the CPU has them (x86-64's
    /// baseline SSE2 has no blend, and its compare-selects become a branch per lane).
    fn select_max<T: Element>(b: &mut [T], bi: &mut [u32], src: &[T], base: u32, step: u32) {
        for (k, ((bv, bix), &v)) in b.iter_mut().zip(bi.iter_mut()).zip(src).enumerate() {
            // `|`, not `||`: no short-circuit branch, so the remainder lanes (and the whole loop
            // where it is not vectorised) are selects rather than unpredictable branches
            let take = (v > *bv) | is_nan(v);
            *bv = if take { v } else { *bv };
            *bix = if take { base + k as u32 * step } else { *bix };
        }
    }
}

/// Max pooling of one plane without dilation or indices, separably: the maximum over the
/// window's rows first (whole rows at a time, which vectorises), then over each window's
/// columns. Max with NaN propagation is associative and commutative, so the values equal
/// the window scan's (up to the sign of a zero when `-0.0` and `0.0` tie: the column-major
/// order may keep the other one).
fn max_plane_separable<T: Element>(g: &PoolGeom, xp: &[T], op: &mut [T]) {
    let mut rows = vec![T::default(); g.w];
    // Interior outputs `lo..hi` (windows inside the row) take their maximum column by column:
    // the row is split once into its `stride` column phases, so window column `k` of all
    // interior outputs is one contiguous run (vectorised compare-selects, e.g. the uint8
    // max-pool of a quantized ResNet). Same fold order as the scalar edge loop, so the same
    // result and NaN rule.
    let lo = g.pw.div_ceil(g.sw).min(g.ow);
    let hi = if g.w + g.pw >= g.kw { ((g.w + g.pw - g.kw) / g.sw + 1).min(g.ow) } else { 0 };
    let plen = g.w.div_ceil(g.sw);
    let mut phases = if hi > lo && g.sw > 1 { vec![T::default(); g.sw * plen] } else { Vec::new() };
    for oh in 0..g.oh {
        let top = (oh * g.sh) as isize - g.ph as isize;
        let he = (top + g.kh as isize).min(g.h as isize);
        let hs = top.max(0);
        let orow = &mut op[oh * g.ow..(oh + 1) * g.ow];
        if hs >= he {
            orow.fill(T::default());
            continue;
        }
        let (hs, he) = (hs as usize, he as usize);
        rows.copy_from_slice(&xp[hs * g.w..(hs + 1) * g.w]);
        for y in hs + 1..he {
            for (r, &v) in rows.iter_mut().zip(&xp[y * g.w..(y + 1) * g.w]) {
                *r = nan_max(v, *r);
            }
        }
        let edge = |ow: usize| {
            let left = (ow * g.sw) as isize - g.pw as isize;
            let we = (left + g.kw as isize).min(g.w as isize);
            let ws = left.max(0);
            if ws < we {
                rows[ws as usize + 1..we as usize].iter().fold(rows[ws as usize], |b, &v| nan_max(v, b))
            } else {
                T::default()
            }
        };
        if hi <= lo {
            for (ow, o) in orow.iter_mut().enumerate() {
                *o = edge(ow);
            }
            continue;
        }
        for ow in (0..lo).chain(hi..g.ow) {
            orow[ow] = edge(ow);
        }
        let (src, stride) = if g.sw == 1 {
            (&rows[..], g.w)
        } else {
            if g.sw == 2 {
                let (even, odd) = phases.split_at_mut(plen);
                for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(rows.chunks_exact(2)) {
                    *e = pair[0];
                    *o = pair[1];
                }
                if g.w % 2 == 1 {
                    even[plen - 1] = rows[g.w - 1];
                }
            } else {
                for (p, dst) in phases.chunks_exact_mut(plen).enumerate() {
                    for (d, &v) in dst.iter_mut().zip(rows[p..].iter().step_by(g.sw)) {
                        *d = v;
                    }
                }
            }
            (&phases[..], plen)
        };
        let o = &mut orow[lo..hi];
        for k in 0..g.kw {
            // column `ow * sw + k - pw` of output `ow` is phase `p`'s element `ow + d`
            let s = k as isize - g.pw as isize;
            let p = s.rem_euclid(g.sw as isize);
            let start = p as usize * stride + (lo as isize + (s - p) / g.sw as isize) as usize;
            let col = &src[start..start + (hi - lo)];
            if k == 0 {
                o.copy_from_slice(col);
            } else {
                for (d, &v) in o.iter_mut().zip(col) {
                    *d = nan_max(v, *d);
                }
            }
        }
    }
}

fn avg_pool_impl<T: Element>(g: &PoolGeom, x: &[T], count_include_pad: bool, divisor: Option<i64>) -> Vec<T> {
    let plane_out = g.oh * g.ow;
    let mut out = vec![T::default(); g.planes * plane_out];
    let work = out.len().saturating_mul(g.kh).saturating_mul(g.kw);
    let float = T::DTYPE.is_floating_point();
    for_planes(x, g.h * g.w, &mut out, &mut [], plane_out, work, |xp, op, _| {
        let (h, w) = (g.h as isize, g.w as isize);
        for oh in 0..g.oh {
            for ow in 0..g.ow {
                let mut hs = (oh * g.sh) as isize - g.ph as isize;
                let mut ws = (ow * g.sw) as isize - g.pw as isize;
                let mut he = (hs + g.kh as isize).min(h + g.ph as isize);
                let mut we = (ws + g.kw as isize).min(w + g.pw as isize);
                let pool_size = (he - hs) * (we - ws);
                hs = hs.max(0);
                ws = ws.max(0);
                he = he.min(h);
                we = we.min(w);
                let o = &mut op[oh * g.ow + ow];
                if hs >= he || ws >= we {
                    *o = T::default();
                    continue;
                }
                let div = match divisor {
                    Some(d) => d,
                    None if count_include_pad => pool_size as i64,
                    None => ((he - hs) * (we - ws)) as i64,
                };
                if float {
                    let mut s = 0f64;
                    for y in hs..he {
                        let row = &xp[y as usize * g.w..];
                        for xx in ws..we {
                            s += row[xx as usize].to_f64();
                        }
                    }
                    *o = T::from_f64(s / div as f64);
                } else {
                    let mut s = 0i64;
                    for y in hs..he {
                        let row = &xp[y as usize * g.w..];
                        for xx in ws..we {
                            s = s.wrapping_add(row[xx as usize].to_i64());
                        }
                    }
                    *o = T::from_i64(s / div);
                }
            }
        }
    });
    out
}

/// PyTorch's adaptive pooling window: `[floor(o*in/out), ceil((o+1)*in/out))`.
#[inline]
fn adaptive_range(o: usize, out: usize, input: usize) -> (usize, usize) {
    let s = (o * input) / out;
    let e = ((o + 1) * input).div_ceil(out);
    (s, e)
}

/// Planes whose means [`global_mean`] sums side by side.
const MEAN_LANES: usize = 8;

/// The mean of each of `planes` planes of `hw` values (an adaptive average pool to 1x1: the
/// global pooling of ResNet, MobileNet, EfficientNet). Each plane's sum is the same sequence of
/// f64 additions as the general path's (so the result is the same), but [`MEAN_LANES`] planes
/// are summed side by side, so their additions overlap instead of waiting on one another; the
/// planes are split over the kernel team in chunks (not one task per plane).
fn global_mean<T: Element>(planes: usize, hw: usize, x: &[T]) -> Vec<T> {
    const CHUNK: usize = 16 * MEAN_LANES;
    let mut out = vec![T::default(); planes];
    let run = |p0: usize, o: &mut [T]| {
        let mut lanes = o.chunks_exact_mut(MEAN_LANES);
        let mut p = p0;
        for group in &mut lanes {
            let mut s = [0f64; MEAN_LANES];
            for i in 0..hw {
                for (k, s) in s.iter_mut().enumerate() {
                    *s += x[(p + k) * hw + i].to_f64();
                }
            }
            for (o, s) in group.iter_mut().zip(s) {
                *o = T::from_f64(s / hw as f64);
            }
            p += MEAN_LANES;
        }
        for o in lanes.into_remainder() {
            let s: f64 = x[p * hw..(p + 1) * hw].iter().fold(0.0, |s, v| s + v.to_f64());
            *o = T::from_f64(s / hw as f64);
            p += 1;
        }
    };
    if planes * hw >= PAR_THRESHOLD && planes > CHUNK && crate::ops::team::parallel() {
        crate::ops::team::chunks_mut(&mut out, CHUNK, |i, o| run(i * CHUNK, o));
    } else {
        run(0, &mut out);
    }
    out
}

fn adaptive_impl<T: Element>(
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    x: &[T],
    max: bool,
) -> (Vec<T>, Vec<i64>) {
    if !max && oh == 1 && ow == 1 && h * w > 0 {
        return (global_mean(planes, h * w, x), Vec::new());
    }
    let plane_out = oh * ow;
    let mut out = vec![T::default(); planes * plane_out];
    let mut idx = if max { vec![0i64; out.len()] } else { Vec::new() };
    let work = planes * h * w;
    for_planes(x, h * w, &mut out, &mut idx, plane_out, work, |xp, op, ip| {
        for oy in 0..oh {
            let (hs, he) = adaptive_range(oy, oh, h);
            for ox in 0..ow {
                let (ws, we) = adaptive_range(ox, ow, w);
                let k = oy * ow + ox;
                if max {
                    let mut best: Option<(T, usize)> = None;
                    for y in hs..he {
                        for xx in ws..we {
                            let i = y * w + xx;
                            let v = xp[i];
                            match best {
                                Some((b, _)) if !(v > b || is_nan(v)) => {}
                                _ => best = Some((v, i)),
                            }
                        }
                    }
                    let (v, i) = best.unwrap_or((T::default(), hs * w + ws));
                    op[k] = v;
                    ip[k] = i as i64;
                } else {
                    let mut s = 0f64;
                    for y in hs..he {
                        for xx in ws..we {
                            s += xp[y * w + xx].to_f64();
                        }
                    }
                    op[k] = T::from_f64(s / ((he - hs) * (we - ws)) as f64);
                }
            }
        }
    });
    (out, idx)
}

// ---------------------------------------------------------------------------------------------
// Op plumbing
// ---------------------------------------------------------------------------------------------

fn pool_cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes = 0u64;
    for a in args {
        a.for_each_tensor(|t| bytes = bytes.saturating_add(t.meta_nbytes() as u64));
    }
    bytes = outs.iter().fold(bytes, |b, o| b.saturating_add(o.nbytes() as u64));
    let k: u64 = match args.get(1) {
        Some(Value::Ints(v)) => {
            let k = v.iter().fold(1u64, |k, &x| k.saturating_mul(x.max(1) as u64));
            if v.len() == 1 {
                k.saturating_mul(k)
            } else {
                k
            }
        }
        _ => 1,
    };
    Cost { flops: outs.first().map(|o| o.numel() as u64).unwrap_or(0).saturating_mul(k), bytes }
}

struct MaxArgs {
    g: PoolGeom,
    shape: Shape,
}

fn max_args(op: &str, nd: usize, args: &[Value], allow_int: bool) -> Result<MaxArgs> {
    let x = tensor(op, args, 0)?;
    check_dtype(op, x.dtype(), allow_int)?;
    let (g, shape) = pool_geom(
        op,
        nd,
        x,
        &ints(op, args, 1)?,
        &ints(op, args, 2)?,
        &ints(op, args, 3)?,
        &ints(op, args, 4)?,
        bool_(op, args, 5)?,
    )?;
    Ok(MaxArgs { g, shape })
}

/// The geometry and output shape `max_pool2d` computes for `args` (its checks and messages,
/// under the name `op`): for ops that pool another layout of the same logical tensor.
pub(crate) fn max_pool2d_geometry(op: &str, args: &[Value]) -> Result<(PoolGeom, Shape)> {
    let a = max_args(op, 2, args, true)?;
    Ok((a.g, a.shape))
}

fn run_max(op: &str, x: &Tensor, a: &MaxArgs, want_idx: bool) -> Result<Outputs> {
    let dt = x.dtype();
    if !want_idx {
        // a channels-last uint8 input (a quantized network's) stays channels-last
        if let Some(y) = crate::ops::quantized::max_pool2d_channels_last(op, x, &a.g)? {
            return Ok(smallvec![y]);
        }
    }
    crate::memory::check_alloc(op, &a.shape, if want_idx { DType::I64 } else { dt })?;
    if !want_idx && dt == DType::F32 && max_f32::applies(&a.g) {
        let v = x.with_contiguous::<f32, _>(op, |xs| max_f32::max_pool(op, &a.g, xs))??;
        return Ok(smallvec![Tensor::from_vec(v, &a.shape)?]);
    }
    if !want_idx && dt == DType::U8 && max_u8::applies(&a.g) {
        let v = x.with_contiguous::<u8, _>(op, |xs| max_u8::max_pool(op, &a.g, xs))??;
        return Ok(smallvec![Tensor::from_vec(v, &a.shape)?]);
    }
    crate::match_dtype!(dt, E => {
        let (v, i) = x.with_contiguous::<E, _>(op, |xs| max_pool_impl(&a.g, xs, want_idx))?;
        let mut outs: Outputs = smallvec![Tensor::from_vec(v, &a.shape)?];
        if want_idx {
            outs.push(Tensor::from_vec(i, &a.shape)?);
        }
        Ok(outs)
    })
}

const MAX1D_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("kernel_size", T::IntList),
    ArgSpec::opt("stride", T::IntList, D::Ints(&[])),
    ArgSpec::opt("padding", T::IntList, D::Ints(&[0])),
    ArgSpec::opt("dilation", T::IntList, D::Ints(&[1])),
    ArgSpec::opt("ceil_mode", T::Bool, D::Bool(false)),
];
pub(crate) const MAX2D_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("kernel_size", T::IntList),
    ArgSpec::opt("stride", T::IntList, D::Ints(&[])),
    ArgSpec::opt("padding", T::IntList, D::Ints(&[0, 0])),
    ArgSpec::opt("dilation", T::IntList, D::Ints(&[1, 1])),
    ArgSpec::opt("ceil_mode", T::Bool, D::Bool(false)),
];

macro_rules! max_pool_op {
    ($static:ident, $name:literal, $nd:expr, $schema:expr, $idx:expr, $ints:expr, $doc:literal) => {
        #[doc = $doc]
        pub static $static: OpDef = OpDef {
            name: $name,
            schema: $schema,
            meta: |args| {
                let a = max_args($name, $nd, args, $ints)?;
                let dt = tensor($name, args, 0)?.dtype();
                let mut m: MetaOutputs = smallvec![TensorMeta::contiguous(&a.shape, dt)];
                if $idx {
                    m.push(TensorMeta::contiguous(&a.shape, DType::I64));
                }
                Ok(m)
            },
            kernel: |args| {
                let a = max_args($name, $nd, args, $ints)?;
                run_max($name, tensor($name, args, 0)?, &a, $idx)
            },
            cost: pool_cost,
            effect: Effect::Pure,
            category: Category::Pooling,
            backward: Some(if $idx {
                crate::autograd::formulas::nn::max_pool_with_indices_backward
            } else {
                crate::autograd::formulas::nn::max_pool_backward
            }),
            saves: if $idx { Saves::outputs(0b10) } else { Saves::inputs(1) },
            doc: $doc,
        };
    };
}

max_pool_op!(MAX_POOL1D, "max_pool1d", 1, MAX1D_SCHEMA, false, false, "1-D max pooling over `[N, C, L]` or `[C, L]`.");
max_pool_op!(
    MAX_POOL1D_WITH_INDICES,
    "max_pool1d_with_indices",
    1,
    MAX1D_SCHEMA,
    true,
    true,
    "1-D max pooling returning (values, int64 indices into each input row)."
);
max_pool_op!(
    MAX_POOL2D,
    "max_pool2d",
    2,
    MAX2D_SCHEMA,
    false,
    true,
    "2-D max pooling over `[N, C, H, W]` or `[C, H, W]`."
);
max_pool_op!(
    MAX_POOL2D_WITH_INDICES,
    "max_pool2d_with_indices",
    2,
    MAX2D_SCHEMA,
    true,
    true,
    "2-D max pooling returning (values, int64 flat indices into each input plane)."
);

fn avg_args(op: &str, nd: usize, args: &[Value]) -> Result<(PoolGeom, Shape, bool, Option<i64>)> {
    let x = tensor(op, args, 0)?;
    check_dtype(op, x.dtype(), true)?;
    let ceil = bool_(op, args, 4)?;
    let cip = bool_(op, args, 5)?;
    let div = if nd == 2 { opt_int(op, args, 6)? } else { None };
    if div == Some(0) {
        return Err(Error::argument(op, "divisor must be not zero"));
    }
    let (g, shape) = pool_geom(op, nd, x, &ints(op, args, 1)?, &ints(op, args, 2)?, &ints(op, args, 3)?, &[1], ceil)?;
    Ok((g, shape, cip, div))
}

fn run_avg(op: &str, nd: usize, args: &[Value]) -> Result<Outputs> {
    let (g, shape, cip, div) = avg_args(op, nd, args)?;
    let x = tensor(op, args, 0)?;
    let dt = x.dtype();
    crate::memory::check_alloc(op, &shape, dt)?;
    crate::match_dtype!(dt, E => {
        let v = x.with_contiguous::<E, _>(op, |xs| avg_pool_impl(&g, xs, cip, div))?;
        Ok(smallvec![Tensor::from_vec(v, &shape)?])
    })
}

/// `avg_pool1d(input, kernel_size, stride=[], padding=0, ceil_mode=False, count_include_pad=True)`.
pub static AVG_POOL1D: OpDef = OpDef {
    name: "avg_pool1d",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("kernel_size", T::IntList),
        ArgSpec::opt("stride", T::IntList, D::Ints(&[])),
        ArgSpec::opt("padding", T::IntList, D::Ints(&[0])),
        ArgSpec::opt("ceil_mode", T::Bool, D::Bool(false)),
        ArgSpec::opt("count_include_pad", T::Bool, D::Bool(true)),
    ],
    meta: |args| {
        let (_, shape, _, _) = avg_args("avg_pool1d", 1, args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, tensor("avg_pool1d", args, 0)?.dtype())])
    },
    kernel: |args| run_avg("avg_pool1d", 1, args),
    cost: pool_cost,
    effect: Effect::Pure,
    category: Category::Pooling,
    backward: Some(crate::autograd::formulas::nn::avg_pool_backward),
    saves: Saves { inputs: 0, outputs: 0 },
    doc: "1-D average pooling.",
};

/// `avg_pool2d(input, kernel_size, stride=[], padding=0, ceil_mode=False,
/// count_include_pad=True, divisor_override=None)`.
pub static AVG_POOL2D: OpDef = OpDef {
    name: "avg_pool2d",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("kernel_size", T::IntList),
        ArgSpec::opt("stride", T::IntList, D::Ints(&[])),
        ArgSpec::opt("padding", T::IntList, D::Ints(&[0, 0])),
        ArgSpec::opt("ceil_mode", T::Bool, D::Bool(false)),
        ArgSpec::opt("count_include_pad", T::Bool, D::Bool(true)),
        ArgSpec::opt("divisor_override", T::OptInt, D::None),
    ],
    meta: |args| {
        let (_, shape, _, _) = avg_args("avg_pool2d", 2, args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, tensor("avg_pool2d", args, 0)?.dtype())])
    },
    kernel: |args| run_avg("avg_pool2d", 2, args),
    cost: pool_cost,
    effect: Effect::Pure,
    category: Category::Pooling,
    backward: Some(crate::autograd::formulas::nn::avg_pool_backward),
    saves: Saves { inputs: 0, outputs: 0 },
    doc: "2-D average pooling.",
};

fn adaptive_args(op: &str, args: &[Value]) -> Result<(usize, usize, usize, usize, usize, Shape)> {
    let x = tensor(op, args, 0)?;
    check_dtype(op, x.dtype(), false)?;
    let os = ints(op, args, 1)?;
    let os = match os.len() {
        1 => [os[0], os[0]],
        2 => [os[0], os[1]],
        n => return Err(Error::argument(op, format!("{op}: output_size must be 2, got {n} values {:?}", os.as_ref()))),
    };
    if os.iter().any(|&v| v < 0) {
        return Err(Error::argument(
            op,
            format!(
                "{op}: elements of output_size must be greater than or equal to 0 but received {{{}, {}}}",
                os[0], os[1]
            ),
        ));
    }
    let s = x.shape();
    if s.len() != 3 && s.len() != 4 {
        return Err(Error::shape(op, format!("{op}(): Expected 3D or 4D tensor, but got {s:?}")));
    }
    for (i, &d) in s.iter().enumerate().skip(s.len() - 3) {
        if d == 0 && (s.len() == 3 || i > 0) {
            return Err(Error::shape(
                op,
                format!("{op}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes {s:?} with dimension {i} being empty"),
            ));
        }
    }
    let (h, w) = (s[s.len() - 2], s[s.len() - 1]);
    let planes: usize = s[..s.len() - 2].iter().product();
    let mut shape: Shape = s[..s.len() - 2].into();
    shape.push(os[0] as usize);
    shape.push(os[1] as usize);
    Ok((planes, h, w, os[0] as usize, os[1] as usize, shape))
}

fn run_adaptive(op: &str, args: &[Value], max: bool) -> Result<Outputs> {
    let (planes, h, w, oh, ow, shape) = adaptive_args(op, args)?;
    let x = tensor(op, args, 0)?;
    let dt = x.dtype();
    crate::memory::check_alloc(op, &shape, if max { DType::I64 } else { dt })?;
    crate::match_dtype!(dt, E => {
        let (v, i) = x.with_contiguous::<E, _>(op, |xs| adaptive_impl(planes, h, w, oh, ow, xs, max))?;
        let mut outs: Outputs = smallvec![Tensor::from_vec(v, &shape)?];
        if max {
            outs.push(Tensor::from_vec(i, &shape)?);
        }
        Ok(outs)
    })
}

const ADAPTIVE_SCHEMA: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::req("output_size", T::IntList)];

/// `adaptive_avg_pool2d(input, output_size)`.
pub static ADAPTIVE_AVG_POOL2D: OpDef = OpDef {
    name: "adaptive_avg_pool2d",
    schema: ADAPTIVE_SCHEMA,
    meta: |args| {
        let (.., shape) = adaptive_args("adaptive_avg_pool2d", args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, tensor("adaptive_avg_pool2d", args, 0)?.dtype())])
    },
    kernel: |args| run_adaptive("adaptive_avg_pool2d", args, false),
    cost: pool_cost,
    effect: Effect::Pure,
    category: Category::Pooling,
    backward: Some(crate::autograd::formulas::nn::adaptive_avg_pool2d_backward),
    saves: Saves { inputs: 0, outputs: 0 },
    doc: "2-D adaptive average pooling to a fixed output size.",
};

/// `adaptive_max_pool2d(input, output_size) -> (values, indices)`, as ATen.
pub static ADAPTIVE_MAX_POOL2D: OpDef = OpDef {
    name: "adaptive_max_pool2d",
    schema: ADAPTIVE_SCHEMA,
    meta: |args| {
        let (.., shape) = adaptive_args("adaptive_max_pool2d", args)?;
        let dt = tensor("adaptive_max_pool2d", args, 0)?.dtype();
        Ok(smallvec![TensorMeta::contiguous(&shape, dt), TensorMeta::contiguous(&shape, DType::I64)])
    },
    kernel: |args| run_adaptive("adaptive_max_pool2d", args, true),
    cost: pool_cost,
    effect: Effect::Pure,
    category: Category::Pooling,
    backward: Some(crate::autograd::formulas::nn::max_pool_with_indices_backward),
    saves: Saves { inputs: 0, outputs: 2 },
    doc: "2-D adaptive max pooling; returns (values, int64 flat indices into each input plane).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &MAX_POOL1D,
    &MAX_POOL1D_WITH_INDICES,
    &MAX_POOL2D,
    &MAX_POOL2D_WITH_INDICES,
    &AVG_POOL1D,
    &AVG_POOL2D,
    &ADAPTIVE_AVG_POOL2D,
    &ADAPTIVE_MAX_POOL2D,
];

// ---------------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------------

fn call(op: &'static OpDef, args: &[Value]) -> Result<Outputs> {
    dispatch(op, CallKind::Function, args)
}

fn first(op: &'static OpDef, mut o: Outputs) -> Result<Tensor> {
    if o.is_empty() {
        return Err(Error::schema(op.name, "op returned no output"));
    }
    Ok(o.swap_remove(0))
}

fn pair(op: &'static OpDef, o: Outputs) -> Result<(Tensor, Tensor)> {
    let mut it = o.into_iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(Error::schema(op.name, "op returned fewer than two outputs")),
    }
}

pub(crate) fn max_values(kernel: &[i64], stride: &[i64], padding: &[i64], dilation: &[i64], ceil: bool) -> [Value; 5] {
    [kernel.into(), stride.into(), padding.into(), dilation.into(), Value::Bool(ceil)]
}

/// `max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode)`; an empty `stride`
/// means `kernel_size`.
pub fn max_pool1d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil_mode: bool,
) -> Result<Tensor> {
    let [a, b, c, d, e] = max_values(kernel, stride, padding, dilation, ceil_mode);
    first(&MAX_POOL1D, call(&MAX_POOL1D, &[input.into(), a, b, c, d, e])?)
}
/// `max_pool1d_with_indices(...) -> (values, indices)`.
pub fn max_pool1d_with_indices(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil_mode: bool,
) -> Result<(Tensor, Tensor)> {
    let [a, b, c, d, e] = max_values(kernel, stride, padding, dilation, ceil_mode);
    pair(&MAX_POOL1D_WITH_INDICES, call(&MAX_POOL1D_WITH_INDICES, &[input.into(), a, b, c, d, e])?)
}
/// `max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)`; an empty `stride`
/// means `kernel_size`.
pub fn max_pool2d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil_mode: bool,
) -> Result<Tensor> {
    let [a, b, c, d, e] = max_values(kernel, stride, padding, dilation, ceil_mode);
    first(&MAX_POOL2D, call(&MAX_POOL2D, &[input.into(), a, b, c, d, e])?)
}
/// `max_pool2d_with_indices(...) -> (values, indices)`.
pub fn max_pool2d_with_indices(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil_mode: bool,
) -> Result<(Tensor, Tensor)> {
    let [a, b, c, d, e] = max_values(kernel, stride, padding, dilation, ceil_mode);
    pair(&MAX_POOL2D_WITH_INDICES, call(&MAX_POOL2D_WITH_INDICES, &[input.into(), a, b, c, d, e])?)
}
/// `avg_pool1d(input, kernel_size, stride, padding, ceil_mode, count_include_pad)`.
pub fn avg_pool1d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    ceil_mode: bool,
    count_include_pad: bool,
) -> Result<Tensor> {
    first(
        &AVG_POOL1D,
        call(
            &AVG_POOL1D,
            &[input.into(), kernel.into(), stride.into(), padding.into(), ceil_mode.into(), count_include_pad.into()],
        )?,
    )
}
/// `avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
/// divisor_override)`.
#[allow(clippy::too_many_arguments)]
pub fn avg_pool2d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Result<Tensor> {
    first(
        &AVG_POOL2D,
        call(
            &AVG_POOL2D,
            &[
                input.into(),
                kernel.into(),
                stride.into(),
                padding.into(),
                ceil_mode.into(),
                count_include_pad.into(),
                divisor_override.into(),
            ],
        )?,
    )
}
/// `adaptive_avg_pool2d(input, output_size)`.
pub fn adaptive_avg_pool2d(input: &Tensor, output_size: &[i64]) -> Result<Tensor> {
    first(&ADAPTIVE_AVG_POOL2D, call(&ADAPTIVE_AVG_POOL2D, &[input.into(), output_size.into()])?)
}
/// `adaptive_max_pool2d(input, output_size) -> (values, indices)`.
pub fn adaptive_max_pool2d(input: &Tensor, output_size: &[i64]) -> Result<(Tensor, Tensor)> {
    pair(&ADAPTIVE_MAX_POOL2D, call(&ADAPTIVE_MAX_POOL2D, &[input.into(), output_size.into()])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dilated window whose taps all fall in the padding gives `-inf` (the integer type's
    /// lowest value) and the index of its first in-range start, as PyTorch
    /// (`F.max_pool2d(arange(10.).reshape(1, 1, 1, 10), 2, 3, 1, 2, return_indices=True)`:
    /// values `-inf` x 4, indices `[11, 12, 15, 18]`).
    #[test]
    fn windows_entirely_in_the_padding_give_the_lowest_value() {
        let x = Tensor::from_vec((0..10).map(|v| v as f32).collect::<Vec<_>>(), &[1, 1, 1, 10]).unwrap();
        let (v, i) = max_pool2d_with_indices(&x, &[2, 2], &[3, 3], &[1, 1], &[2, 2], false).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![f32::NEG_INFINITY; 4]);
        assert_eq!(i.to_vec::<i64>().unwrap(), vec![11, 12, 15, 18]);
        let v = max_pool2d(&x, &[2, 2], &[3, 3], &[1, 1], &[2, 2], false).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![f32::NEG_INFINITY; 4]);
        let xi = Tensor::from_vec((0..10).collect::<Vec<i32>>(), &[1, 1, 1, 10]).unwrap();
        let v = max_pool2d(&xi, &[2, 2], &[3, 3], &[1, 1], &[2, 2], false).unwrap();
        assert_eq!(v.to_vec::<i32>().unwrap(), vec![i32::MIN; 4]);
    }

    /// The global mean (adaptive average pool to 1x1) is each plane's sequential f64 sum over
    /// its size, bit for bit, for plane counts around the lanes and the team's chunks (the
    /// remainder planes, a parallel split) and for float32 and float64.
    #[test]
    fn global_mean_equals_each_planes_sequential_sum() {
        for (planes, hw) in [(1, 1), (7, 49), (8, 49), (9, 3), (1280, 49), (2048 + 5, 49), (3000, 1)] {
            let x: Vec<f32> = (0..planes * hw).map(|i| ((i * 7919) % 1013) as f32 * 0.37 - 150.0).collect();
            let got = global_mean(planes, hw, &x);
            let xd: Vec<f64> = x.iter().map(|&v| v as f64 * 1.1).collect();
            let got_d = global_mean(planes, hw, &xd);
            for p in 0..planes {
                let plane = &x[p * hw..(p + 1) * hw];
                let want = (plane.iter().fold(0f64, |s, &v| s + v as f64) / hw as f64) as f32;
                assert_eq!(got[p].to_bits(), want.to_bits(), "{planes} planes of {hw}: plane {p}");
                let plane = &xd[p * hw..(p + 1) * hw];
                let want = plane.iter().fold(0f64, |s, &v| s + v) / hw as f64;
                assert_eq!(got_d[p].to_bits(), want.to_bits(), "f64: {planes} planes of {hw}: plane {p}");
            }
        }
    }

    /// The vectorised scan finds the same values and indices as the window-by-window scan:
    /// ties (values drawn from a few levels, so windows hold equal maxima), NaNs, every
    /// stride/padding/ceil combination of small kernels, odd and even widths.
    #[test]
    fn argmax_scan_equals_window_max() {
        let mut s = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for (h, w) in [(7usize, 9usize), (8, 8), (5, 12), (1, 6)] {
            let xp: Vec<f32> = (0..h * w)
                .map(|_| match next() % 11 {
                    0 => f32::NAN,
                    r => (r % 4) as f32,
                })
                .collect();
            for (kh, kw) in [(1usize, 1usize), (2, 2), (3, 3), (1, 3), (3, 2)] {
                for (sh, sw) in [(1usize, 1usize), (2, 2), (1, 3), (3, 2)] {
                    for (ph, pw) in [(0usize, 0usize), (kh / 2, kw / 2)] {
                        for ceil in [false, true] {
                            let oh = out_size(h as i64, kh as i64, ph as i64, sh as i64, 1, ceil);
                            let ow = out_size(w as i64, kw as i64, pw as i64, sw as i64, 1, ceil);
                            if oh < 1 || ow < 1 {
                                continue;
                            }
                            let (oh, ow) = (oh as usize, ow as usize);
                            let g = PoolGeom { planes: 1, h, w, kh, kw, sh, sw, ph, pw, dh: 1, dw: 1, oh, ow };
                            let mut scan = ArgmaxScan::new(&g, &xp);
                            for r in 0..oh {
                                let (vals, at) = scan.row(r);
                                for c in 0..ow {
                                    let (v, i) = window_max(&g, &xp, r, c);
                                    assert_eq!(at[c] as usize, i, "{g:?} output ({r}, {c})");
                                    assert_eq!(vals[c].to_bits(), v.to_bits(), "{g:?} output ({r}, {c})");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
