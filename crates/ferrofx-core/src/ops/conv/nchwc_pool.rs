//! `nchwc_max_pool2d`: `max_pool2d` on NCHW16c activations (`[n, c/16, h, w, 16]`), so that a
//! blocked chain of convolutions passes through a max pool without leaving the layout (ResNet's
//! stem, 7x7/2 convolution, then 3x3/2 max pool, then the first stage: ONNX Runtime's
//! `nchwc.MaxPool`).
//!
//! Each output pixel of a block is the lane-wise maximum of 16-channel vectors over the
//! window's taps inside the image (the padding never wins, as in PyTorch, where it is `-inf`);
//! a NaN anywhere in the window gives NaN, as PyTorch's `max_pool2d` (`val > max || isnan(val)`).
//! Output rows run in parallel on the kernel team. The padded channels of the last block are
//! pooled like the others (the maximum of `act(0)` values is finite).

use super::nchwc::NCHWC_BLOCK as B;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{dispatch, CallKind, Category, Cost, Effect, OpDef, Saves};
use crate::ops::simd::simd_dispatch;
use crate::tensor::{Tensor, TensorMeta};
use crate::trace::Symbolic;
use crate::value::Value;
use smallvec::smallvec;
use std::sync::Arc;

const OP: &str = "nchwc_max_pool2d";

/// The geometry of a call (from `max_pool2d`'s checks on the logical NCHW shape) and the
/// blocked output shape.
fn geom(args: &[Value]) -> Result<(crate::ops::pool::PoolGeom, Vec<usize>)> {
    let x = crate::op::args::tensor(OP, args, 0)?;
    let s = x.shape();
    if s.len() != 5 || s[4] != B || x.dtype() != DType::F32 {
        return Err(Error::shape(
            OP,
            format!(
                "the input must be float32 NCHW16c, [n, c/16, h, w, 16], got {:?} {s:?}; reorder an NCHW tensor with nchwc_reorder_input first, or use max_pool2d",
                x.dtype()
            ),
        ));
    }
    let c = s[1].checked_mul(B).ok_or_else(|| Error::limit(OP, format!("input {s:?} has too many channels")))?;
    let meta = TensorMeta::contiguous(&[s[0], c, s[2], s[3]], DType::F32);
    let mut logical = args.to_vec();
    logical[0] = Value::Tensor(Tensor::symbolic(Symbolic { meta: Some(meta), proxy: Arc::new(()) }));
    let (g, _) = crate::ops::pool::max_pool2d_geometry(OP, &logical)?;
    Ok((g, vec![s[0], s[1], g.oh, g.ow, B]))
}

/// `acc = max(acc, v)` lane by lane, NaN winning (PyTorch's `val > max || isnan(val)`),
/// branch-free so that it compiles to compare-and-blend vectors.
#[inline(always)]
fn max_lanes(acc: &mut [f32; B], v: &[f32; B]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        let take = (x > *a) | x.is_nan();
        *a = if take { x } else { *a };
    }
}

simd_dispatch!(
    /// One output row of one block: `dst` (`ow * 16`) from the block's plane `src` (`h * w * 16`),
    /// each window scanned in PyTorch's order (rows, then columns).
    fn pool_row(src: &[f32], g: &crate::ops::pool::PoolGeom, oy: usize, dst: &mut [f32]) {
        for (ox, out) in dst.chunks_exact_mut(B).enumerate() {
            let mut acc = [f32::NEG_INFINITY; B];
            for i in 0..g.kh {
                let Some(r) = (oy * g.sh + i * g.dh).checked_sub(g.ph).filter(|&r| r < g.h) else { continue };
                let row = &src[r * g.w * B..][..g.w * B];
                for j in 0..g.kw {
                    let Some(col) = (ox * g.sw + j * g.dw).checked_sub(g.pw).filter(|&c| c < g.w) else { continue };
                    let v: &[f32; B] = row[col * B..][..B].try_into().expect("16 lanes");
                    max_lanes(&mut acc, v);
                }
            }
            out.copy_from_slice(&acc);
        }
    }
);

/// [`pool_row`] on AVX-512F: the window's rows and columns inside the image are found once per
/// pixel (no test per tap), each tap one load, two compares and a masked move.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::B;
    use crate::ops::pool::PoolGeom;
    use std::arch::x86_64::*;

    /// The taps `start + k * step` (k < count) of a window that fall in `0..len`, given its
    /// first tap's position `first` (possibly negative): (first inside, how many inside).
    #[inline(always)]
    fn inside(first: isize, step: usize, count: usize, len: usize) -> (usize, usize) {
        let step_i = step as isize;
        // skip the taps before 0
        let skip = if first < 0 { ((-first) + step_i - 1) / step_i } else { 0 } as usize;
        if skip >= count {
            return (0, 0);
        }
        let start = first + (skip * step) as isize;
        if start >= len as isize {
            return (0, 0);
        }
        let left = (len as isize - 1 - start) as usize / step + 1;
        (start as usize, left.min(count - skip))
    }

    /// # Safety
    /// AVX-512F; `src` is one block's plane (`h * w * 16`), `dst` one output row (`ow * 16`,
    /// possibly uninitialised: every element is written).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pool_row(src: &[f32], g: &PoolGeom, oy: usize, dst: &mut [std::mem::MaybeUninit<f32>]) {
        assert!(src.len() >= g.h * g.w * B && dst.len() >= g.ow * B, "nchwc max pool: buffer sizes");
        let (r0, nr) = inside(oy as isize * g.sh as isize - g.ph as isize, g.dh, g.kh, g.h);
        for ox in 0..g.ow {
            let (c0, nc) = inside(ox as isize * g.sw as isize - g.pw as isize, g.dw, g.kw, g.w);
            let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
            for i in 0..nr {
                let row = src.as_ptr().add((r0 + i * g.dh) * g.w * B);
                for j in 0..nc {
                    // SAFETY: row r0 + i*dh < h and column c0 + j*dw < w (`inside`)
                    let v = _mm512_loadu_ps(row.add((c0 + j * g.dw) * B));
                    // PyTorch's rule: take v if v > max or v is NaN (a NaN max stays)
                    let m = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, acc) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                    acc = _mm512_mask_mov_ps(acc, m, v);
                }
            }
            _mm512_storeu_ps(dst.as_mut_ptr().cast::<f32>().add(ox * B), acc);
        }
    }
}

/// One output row (every element written), on AVX-512F when the CPU has it.
fn pool_row_fast(src: &[f32], g: &crate::ops::pool::PoolGeom, oy: usize, dst: &mut [std::mem::MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if crate::ops::simd::avx512f() {
        // SAFETY: AVX-512F checked; the buffer sizes are asserted inside
        unsafe { avx512::pool_row(src, g, oy, dst) };
        return;
    }
    let mut row = vec![0.0f32; dst.len()];
    pool_row(src, g, oy, &mut row);
    for (d, v) in dst.iter_mut().zip(row) {
        d.write(v);
    }
}

fn kernel(args: &[Value]) -> Result<Tensor> {
    let (g, shape) = geom(args)?;
    let x = crate::ops::kernel::contiguous(crate::op::args::tensor(OP, args, 0)?)?;
    let mut out = crate::memory::alloc_uninit::<f32>(OP, &shape)?;
    let len: usize = shape.iter().product();
    let (h, w) = (x.shape()[2], x.shape()[3]);
    let row = g.ow * B;
    if len > 0 {
        x.with_contiguous::<f32, _>(OP, |xs| {
            let run = |i: usize, dst: &mut [std::mem::MaybeUninit<f32>]| {
                let (plane, oy) = (i / g.oh, i % g.oh);
                pool_row_fast(&xs[plane * h * w * B..][..h * w * B], &g, oy, dst);
            };
            let dst = &mut out.spare_capacity_mut()[..len];
            if len >= 1 << 14 && crate::ops::team::parallel() {
                crate::ops::team::chunks_mut(dst, row, run);
            } else {
                dst.chunks_mut(row).enumerate().for_each(|(i, d)| run(i, d));
            }
        })?;
    }
    // SAFETY: alloc_uninit reserved `len` elements and every output row was written
    unsafe { out.set_len(len) };
    Tensor::from_vec(out, &shape)
}

/// `nchwc_max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)`: `max_pool2d`
/// on NCHW16c activations (see the module docs).
pub static NCHWC_MAX_POOL2D: OpDef = OpDef {
    name: OP,
    schema: crate::ops::pool::MAX2D_SCHEMA,
    meta: |args| {
        let (_, shape) = geom(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, DType::F32)])
    },
    kernel: |args| Ok(smallvec![kernel(args)?]),
    cost: |args, outs| {
        let bytes = args.first().map_or(0, |a| {
            let mut b = 0u64;
            a.for_each_tensor(|t| b = b.saturating_add(t.meta_nbytes() as u64));
            b
        });
        let k = match args.get(1) {
            Some(Value::Ints(v)) => v.iter().fold(1u64, |k, &x| k.saturating_mul(x.max(1) as u64)),
            _ => 1,
        };
        let elems = outs.first().map_or(0, |o| o.numel() as u64);
        Cost {
            flops: elems.saturating_mul(k),
            bytes: bytes.saturating_add(outs.first().map_or(0, |o| o.nbytes() as u64)),
        }
    },
    effect: Effect::Pure,
    category: Category::Pooling,
    backward: None,
    saves: Saves::NOTHING,
    doc: "2-D max pooling on NCHW16c activations [n, c/16, h, w, 16] (made by ferrofx-compile's layout pass).",
};

/// `max_pool2d` of an NCHW16c tensor (`[n, c/16, h, w, 16]`), in NCHW16c; an empty `stride`
/// means `kernel`.
///
/// ```
/// use ferrofx_core::ops::conv::{nchwc_max_pool2d, nchwc_reorder_input, nchwc_reorder_output};
/// use ferrofx_core::ops::pool::max_pool2d;
/// let x = ferrofx_core::ops::random::randn(&[2, 24, 11, 11], None)?;
/// let y = nchwc_max_pool2d(&nchwc_reorder_input(&x)?, &[3, 3], &[2, 2], &[1, 1], &[1, 1], false)?;
/// assert_eq!(y.shape(), &[2, 2, 6, 6, 16]);
/// let want = max_pool2d(&x, &[3, 3], &[2, 2], &[1, 1], &[1, 1], false)?;
/// assert_eq!(nchwc_reorder_output(&y, 24)?.to_vec::<f32>()?, want.to_vec::<f32>()?);
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn nchwc_max_pool2d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil_mode: bool,
) -> Result<Tensor> {
    let [a, b, c, d, e] = crate::ops::pool::max_values(kernel, stride, padding, dilation, ceil_mode);
    dispatch(&NCHWC_MAX_POOL2D, CallKind::Function, &[input.into(), a, b, c, d, e])?
        .into_iter()
        .next()
        .ok_or_else(|| Error::argument(OP, "no output"))
}

#[cfg(test)]
mod tests {
    use super::nchwc_max_pool2d;
    use crate::ops::conv::{nchwc_reorder_input, nchwc_reorder_output};
    use crate::ops::pool::max_pool2d;
    use crate::ops::random::randn;
    use crate::Tensor;

    /// Equal to `max_pool2d` in NCHW, bit for bit, on random geometries: kernels 1-5, strides
    /// 1-3, padding up to half the kernel, dilation 2, ceil mode, channel counts that are and
    /// are not multiples of 16, NaNs in the input.
    #[test]
    fn equals_max_pool2d() {
        let mut next = super::super::nchwc::tests::xorshift(0x243f_6a88_85a3_08d3);
        let mut ran = 0;
        for case in 0..60 {
            let k = 1 + next(5);
            let (stride, dil) = (1 + next(3), if next(5) == 0 { 2 } else { 1 });
            let pad = next(k / 2 + 1);
            let ceil = next(3) == 0;
            let (n, c, h, w) = (1 + next(2), 1 + next(40), 1 + next(20), 1 + next(20));
            let x = randn(&[n as i64, c as i64, h as i64, w as i64], None).unwrap();
            let mut v = x.to_vec::<f32>().unwrap();
            if case % 4 == 0 {
                let i = next(v.len());
                v[i] = f32::NAN;
            }
            let x = Tensor::from_vec(v, &[n, c, h, w]).unwrap();
            let (kk, st, pd, dl) = ([k as i64; 2], [stride as i64; 2], [pad as i64; 2], [dil as i64; 2]);
            let Ok(want) = max_pool2d(&x, &kk, &st, &pd, &dl, ceil) else {
                // an invalid geometry: the blocked op says so too
                assert!(nchwc_max_pool2d(&nchwc_reorder_input(&x).unwrap(), &kk, &st, &pd, &dl, ceil).is_err());
                continue;
            };
            ran += 1;
            let got = nchwc_max_pool2d(&nchwc_reorder_input(&x).unwrap(), &kk, &st, &pd, &dl, ceil).unwrap();
            let back = nchwc_reorder_output(&got, c as i64).unwrap();
            let (p, q) = (back.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            assert_eq!(back.shape(), want.shape(), "case {case}");
            for (i, (a, b)) in p.iter().zip(&q).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "case {case}: x {:?} k {k} s {stride} p {pad} d {dil} ceil {ceil}: {i}: {a} vs {b}",
                    x.shape()
                );
            }
        }
        assert!(ran >= 40, "{ran}");
    }

    #[test]
    fn bad_inputs_are_errors_naming_the_op_and_the_fix() {
        let x = randn(&[1, 16, 5, 5], None).unwrap();
        let e = nchwc_max_pool2d(&x, &[3, 3], &[2, 2], &[1, 1], &[1, 1], false).unwrap_err().to_string();
        assert!(e.contains("nchwc_max_pool2d") && e.contains("NCHW16c") && e.contains("nchwc_reorder_input"), "{e}");
        let xb = nchwc_reorder_input(&x).unwrap();
        // padding larger than half the kernel: max_pool2d's own message
        let e = nchwc_max_pool2d(&xb, &[3, 3], &[2, 2], &[2, 2], &[1, 1], false).unwrap_err().to_string();
        assert!(e.contains("nchwc_max_pool2d") && e.contains("pad"), "{e}");
    }
}
