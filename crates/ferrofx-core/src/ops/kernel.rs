//! Shared kernel building blocks: dtype matching, element maps with broadcasting, casts and
//! contiguous copies. Every kernel family builds on these so fast paths live in one place.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, Layout, StridedIter};
use crate::storage::CpuBuffer;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Element count above which elementwise kernels split work across threads.
pub const PAR_THRESHOLD: usize = 1 << 15;
/// Chunk size for parallel elementwise loops.
pub const PAR_CHUNK: usize = 1 << 13;

/// Runs `$body` with type alias `$T` bound to the Rust type of `$dt` (every dtype).
#[macro_export]
macro_rules! match_dtype {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// Maps every element through `f` into a new contiguous tensor of dtype `U`.
/// Contiguous inputs take a vectorisable (and, when large, parallel) path.
pub fn unary_map<T: Element, U: Element>(op: &str, t: &Tensor, f: impl Fn(T) -> U + Sync + Send) -> Result<Tensor> {
    let shape = t.shape().to_vec();
    let out: Vec<U> = t.with_data::<T, _>(op, |data, layout| match layout.contiguous_range() {
        Some(r) => {
            let src = &data[r];
            if src.len() >= PAR_THRESHOLD {
                let mut out = vec![U::default(); src.len()];
                out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(|(o, s)| {
                    for (o, &s) in o.iter_mut().zip(s) {
                        *o = f(s);
                    }
                });
                out
            } else {
                src.iter().map(|&x| f(x)).collect()
            }
        }
        None => StridedIter::new(layout).map(|i| f(data[i])).collect(),
    })?;
    Tensor::from_buffer(U::into_buffer(out), &shape)
}

/// Combines two tensors of element type `T` (both must already have dtype `T`) elementwise with
/// broadcasting, producing dtype `U`.
pub fn binary_map<T: Element, U: Element>(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(T, T) -> U + Sync + Send,
) -> Result<Tensor> {
    let out_shape = broadcast_shapes(op, a.shape(), b.shape())?;
    let (sa, la) = a.concrete(op)?;
    let (sb, lb) = b.concrete(op)?;
    let ga = sa.read();
    let gb = if sa.same(sb) { None } else { Some(sb.read()) };
    let da = ga
        .as_slice::<T>()
        .ok_or_else(|| Error::dtype(op, format!("expected {} input, got {}", T::DTYPE, ga.dtype())))?;
    let db = match &gb {
        Some(g) => g.as_slice::<T>(),
        None => ga.as_slice::<T>(),
    }
    .ok_or_else(|| Error::dtype(op, format!("expected {} input, got {}", T::DTYPE, b.dtype())))?;
    let n: usize = out_shape.iter().product();
    let out: Vec<U> = if la.shape() == lb.shape() && la.is_contiguous() && lb.is_contiguous() {
        let (x, y) = (&da[la.offset()..la.offset() + n], &db[lb.offset()..lb.offset() + n]);
        if n >= PAR_THRESHOLD {
            let mut out = vec![U::default(); n];
            out.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK).zip(y.par_chunks(PAR_CHUNK))).for_each(
                |(o, (x, y))| {
                    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                        *o = f(x, y);
                    }
                },
            );
            out
        } else {
            x.iter().zip(y).map(|(&x, &y)| f(x, y)).collect()
        }
    } else if lb.numel() == 1 && la.is_contiguous() && la.shape() == out_shape.as_slice() {
        let y = db[lb.offset()];
        let x = &da[la.offset()..la.offset() + n];
        if n >= PAR_THRESHOLD {
            let mut out = vec![U::default(); n];
            out.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(|(o, x)| {
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = f(x, y);
                }
            });
            out
        } else {
            x.iter().map(|&x| f(x, y)).collect()
        }
    } else if la.numel() == 1 && lb.is_contiguous() && lb.shape() == out_shape.as_slice() {
        let x = da[la.offset()];
        db[lb.offset()..lb.offset() + n].iter().map(|&y| f(x, y)).collect()
    } else {
        let ea = la.broadcast_to(op, &out_shape)?;
        let eb = lb.broadcast_to(op, &out_shape)?;
        StridedIter::new(&ea).zip(StridedIter::new(&eb)).map(|(i, j)| f(da[i], db[j])).collect()
    };
    drop(gb);
    drop(ga);
    Tensor::from_buffer(U::into_buffer(out), &out_shape)
}

/// Converts a tensor to `dtype` (a contiguous copy; returns the same tensor when the dtype
/// already matches).
pub fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        return Ok(t.clone());
    }
    let src = t.dtype();
    crate::match_dtype!(src, S => crate::match_dtype!(dtype, D => unary_map::<S, D>("to", t, convert::<S, D>)))
}

/// PyTorch's element conversion: float → int truncates, anything → bool is `!= 0`.
#[inline(always)]
pub fn convert<S: Element, D: Element>(x: S) -> D {
    if S::DTYPE.is_floating_point() || D::DTYPE.is_floating_point() {
        D::from_f64(x.to_f64())
    } else {
        D::from_i64(x.to_i64())
    }
}

/// A contiguous copy of `t` (the same tensor when already contiguous).
pub fn contiguous(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    let dt = t.dtype();
    crate::match_dtype!(dt, T => unary_map::<T, T>("contiguous", t, |x| x))
}

/// Reads any tensor as a contiguous `Vec<f64>` (for reference computations and tests).
pub fn to_f64_vec(t: &Tensor) -> Result<Vec<f64>> {
    t.to_vec_f64()
}

/// Builds a tensor of dtype `dtype` from f64 values.
pub fn from_f64_vec(values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
    crate::match_dtype!(dtype, T => Tensor::from_vec::<T>(values.iter().map(|&v| T::from_f64(v)).collect(), shape))
}

/// A zero-filled contiguous tensor.
pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::from_buffer(CpuBuffer::zeros(dtype, shape.iter().product()), shape)
}

/// Copies `src` (broadcast to `dst`'s shape, converted to its dtype) into `dst` in place,
/// through `dst`'s layout. Handles aliasing between `src` and `dst` by reading first.
pub fn copy_into(op: &str, dst: &Tensor, src: &Tensor) -> Result<()> {
    let dst_shape = dst.shape().to_vec();
    let src = cast(src, dst.dtype())?;
    let src_l = src
        .layout()
        .ok_or_else(|| Error::trace(op, "cannot copy from a symbolic tensor"))?
        .broadcast_to(op, &dst_shape)
        .map_err(|_| {
            Error::shape(
                op,
                format!(
                    "the source of shape {:?} cannot be broadcast to the destination shape {dst_shape:?}",
                    src.shape()
                ),
            )
        })?;
    let dt = dst.dtype();
    crate::match_dtype!(dt, T => {
        let values: Vec<T> = src.with_data::<T, _>(op, |d, _| StridedIter::new(&src_l).map(|i| d[i]).collect())?;
        let (storage, layout) = dst.concrete(op)?;
        let mut g = storage.write();
        let out = g.as_mut_slice::<T>().ok_or_else(|| Error::dtype(op, "destination dtype changed"))?;
        write_strided(out, layout, &values);
    });
    Ok(())
}

/// Writes `values` (row-major) into `out` through `layout`.
pub fn write_strided<T: Copy>(out: &mut [T], layout: &Layout, values: &[T]) {
    match layout.contiguous_range() {
        Some(r) => out[r].copy_from_slice(values),
        None => {
            for (i, &v) in StridedIter::new(layout).zip(values) {
                out[i] = v;
            }
        }
    }
}
