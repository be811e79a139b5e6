//! Shared kernel building blocks: dtype matching, element maps with broadcasting, casts and
//! contiguous copies. Every kernel family builds on these so fast paths live in one place.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, Layout, Shape, Strides};
use crate::tensor::Tensor;
use smallvec::SmallVec;
use std::mem::MaybeUninit;

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

/// An iteration plan over a (broadcast) shape shared by `N` operands: size-1 dims dropped and
/// adjacent dims merged whenever every operand's strides allow it, so the innermost loop runs as
/// long as possible with fixed strides (and usually stride 0 or 1, which vectorises).
///
/// Every layout must already have the plan's shape (use [`Layout::broadcast_to`]).
#[derive(Debug, Clone)]
pub struct Plan<const N: usize> {
    outer: Shape,
    outer_strides: [Strides; N],
    /// Length of the innermost loop.
    pub inner: usize,
    /// Per-operand stride of the innermost loop.
    pub inner_strides: [usize; N],
    offsets: [usize; N],
}

impl<const N: usize> Plan<N> {
    /// Builds the plan for `layouts` (all of the same shape).
    #[allow(clippy::needless_range_loop)]
    pub fn new(layouts: [&Layout; N]) -> Plan<N> {
        let shape = layouts[0].shape();
        let mut dims: Shape = Shape::new();
        let mut strides: [Strides; N] = std::array::from_fn(|_| Strides::new());
        for d in 0..shape.len() {
            let size = shape[d];
            if size == 1 {
                continue;
            }
            if let Some(&last) = dims.last() {
                let mergeable = (0..N).all(|k| strides[k][strides[k].len() - 1] == layouts[k].strides()[d] * size);
                if mergeable {
                    let i = dims.len() - 1;
                    dims[i] = last * size;
                    for k in 0..N {
                        let j = strides[k].len() - 1;
                        strides[k][j] = layouts[k].strides()[d];
                    }
                    continue;
                }
            }
            dims.push(size);
            for k in 0..N {
                strides[k].push(layouts[k].strides()[d]);
            }
        }
        let offsets = std::array::from_fn(|k| layouts[k].offset());
        if shape.contains(&0) {
            return Plan {
                outer: Shape::new(),
                outer_strides: std::array::from_fn(|_| Strides::new()),
                inner: 0,
                inner_strides: [0; N],
                offsets,
            };
        }
        match dims.pop() {
            None => Plan { outer: dims, outer_strides: strides, inner: 1, inner_strides: [0; N], offsets },
            Some(inner) => {
                let inner_strides = std::array::from_fn(|k| strides[k].pop().unwrap_or(0));
                Plan { outer: dims, outer_strides: strides, inner, inner_strides, offsets }
            }
        }
    }

    /// Number of inner rows.
    pub fn rows(&self) -> usize {
        if self.inner == 0 {
            0
        } else {
            self.outer.iter().product()
        }
    }

    /// Calls `f(row_index_from_start, operand offsets)` for rows `start..start + count`.
    #[inline]
    #[allow(clippy::needless_range_loop)]
    pub fn for_each_row(&self, start: usize, count: usize, mut f: impl FnMut(usize, [usize; N])) {
        let nd = self.outer.len();
        let mut idx: Shape = SmallVec::from_elem(0, nd);
        let mut off = self.offsets;
        let mut r = start;
        for d in (0..nd).rev() {
            let i = r % self.outer[d];
            r /= self.outer[d];
            idx[d] = i;
            for k in 0..N {
                off[k] += i * self.outer_strides[k][d];
            }
        }
        for j in 0..count {
            f(j, off);
            let mut d = nd;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for k in 0..N {
                    off[k] += self.outer_strides[k][d];
                }
                if idx[d] < self.outer[d] {
                    break;
                }
                for k in 0..N {
                    off[k] -= self.outer_strides[k][d] * self.outer[d];
                }
                idx[d] = 0;
            }
        }
    }

    /// Runs `row(out_row, offsets)` over every row, writing `out` (row-major, `rows * inner`
    /// elements), in parallel when the work is large (long rows are split into chunks, with the
    /// offsets advanced accordingly).
    ///
    /// `row` is a trait object so that `fill` is instantiated once per element type, not once per
    /// kernel (each instantiation carries rayon's machinery; this keeps compile time and code size
    /// down at the cost of one indirect call per row).
    pub fn fill<U: Send>(&self, out: &mut [U], row: &(dyn Fn(&mut [U], [usize; N]) + Sync)) {
        let inner = self.inner;
        let rows = self.rows();
        if rows == 0 {
            return;
        }
        if rows * inner < PAR_THRESHOLD {
            self.for_each_row(0, rows, |j, off| row(&mut out[j * inner..(j + 1) * inner], off));
        } else if inner >= PAR_CHUNK {
            let strides = self.inner_strides;
            // every chunk of every row is one task of one team job
            let per_row = inner.div_ceil(PAR_CHUNK);
            let mut parts = Vec::with_capacity(rows * per_row);
            for (r, o) in out.chunks_mut(inner).enumerate() {
                parts.extend(o.chunks_mut(PAR_CHUNK).enumerate().map(|(k, c)| ((r, k), c)));
            }
            super::team::slices_mut(parts, |&(r, k), c| {
                self.for_each_row(r, 1, |_, off| {
                    let start = k * PAR_CHUNK;
                    row(c, std::array::from_fn(|q| off[q] + start * strides[q]));
                });
            });
        } else {
            let per = (PAR_CHUNK / inner).max(1);
            super::team::chunks_mut(out, per * inner, |ci, chunk| {
                let n = chunk.len() / inner;
                self.for_each_row(ci * per, n, |j, off| row(&mut chunk[j * inner..(j + 1) * inner], off));
            });
        }
    }
}

/// `out[i] = f(x[ox + i*sx])` for a row (not inlined: one copy of the loop per element type
/// and function keeps compile times and code size down).
/// Every element of `out` is written (it may start uninitialised).
#[inline(never)]
fn row1<T: Copy, U>(out: &mut [MaybeUninit<U>], x: &[T], ox: usize, sx: usize, f: &impl Fn(T) -> U) {
    let n = out.len();
    if sx == 1 {
        for (o, &x) in out.iter_mut().zip(&x[ox..ox + n]) {
            o.write(f(x));
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            o.write(f(x[ox + i * sx]));
        }
    }
}

/// `out[i] = f(x[ox + i*sx], y[oy + i*sy])` for a row, specialised for strides 0 and 1. Every
/// element of `out` is written (it may start uninitialised).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn row2<T: Copy, V: Copy, U>(
    out: &mut [MaybeUninit<U>],
    x: &[T],
    ox: usize,
    sx: usize,
    y: &[V],
    oy: usize,
    sy: usize,
    f: &impl Fn(T, V) -> U,
) {
    let n = out.len();
    match (sx, sy) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&x[ox..ox + n]).zip(&y[oy..oy + n]) {
                o.write(f(x, y));
            }
        }
        (1, 0) => {
            let y = y[oy];
            for (o, &x) in out.iter_mut().zip(&x[ox..ox + n]) {
                o.write(f(x, y));
            }
        }
        (0, 1) => {
            let x = x[ox];
            for (o, &y) in out.iter_mut().zip(&y[oy..oy + n]) {
                o.write(f(x, y));
            }
        }
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                o.write(f(x[ox + i * sx], y[oy + i * sy]));
            }
        }
    }
}

/// Maps every element of `data` (read through `layout`) into a fresh row-major `Vec`.
///
/// The buffer comes from [`crate::memory::alloc_uninit`]: a shape too large for the allocation
/// limit is an error naming `op`, never an abort.
pub fn map_strided<T: Element, U: Element>(
    op: &str,
    data: &[T],
    layout: &Layout,
    f: impl Fn(T) -> U + Sync + Send,
) -> Result<Vec<U>> {
    let n = layout.numel();
    let mut buf: Vec<U> = crate::memory::alloc_uninit(op, layout.shape())?;
    if n == 0 {
        // (an empty view may have an offset past the end of its storage)
        return Ok(buf);
    }
    // not zero-filled first: row1 writes every element it is given, and the rows cover all n
    let out = &mut buf.spare_capacity_mut()[..n];
    if n < PAR_THRESHOLD && layout.is_contiguous() {
        row1(out, data, layout.offset(), 1, &f);
    } else {
        let plan = Plan::new([layout]);
        let [sx] = plan.inner_strides;
        plan.fill(out, &|o, [ox]| row1(o, data, ox, sx, &f));
    }
    // SAFETY: all n elements were written above (the plan's rows x inner = n), and
    // alloc_uninit reserved room for exactly the n elements of the layout's shape.
    unsafe { buf.set_len(n) };
    Ok(buf)
}

/// Maps every element through `f` into a new contiguous tensor of dtype `U`.
/// Contiguous inputs take a vectorisable (and, when large, parallel) path; strided inputs are
/// walked row by row with a coalesced plan.
pub fn unary_map<T: Element, U: Element>(op: &str, t: &Tensor, f: impl Fn(T) -> U + Sync + Send) -> Result<Tensor> {
    let (storage, layout) = t.concrete(op)?;
    let guard = storage.read();
    let data = guard
        .as_slice::<T>()
        .ok_or_else(|| Error::dtype(op, format!("expected a tensor of dtype {}, got {}", T::DTYPE, guard.dtype())))?;
    let out = map_strided(op, data, layout, f)?;
    drop(guard);
    Tensor::from_buffer(U::into_buffer(out), layout.shape())
}

/// Like [`unary_map`] for a function of whole slices: `f(out, x)` writes every element of `out`
/// from the equally long `x` (a loop that vectorises, e.g. one compiled by `simd_dispatch!`).
/// A strided input is made contiguous first; large tensors are split across the rayon pool in
/// chunks of [`PAR_CHUNK`]. The output comes from [`crate::memory::alloc_uninit`].
pub(crate) fn unary_map_slices<T: Element, U: Element>(
    op: &str,
    t: &Tensor,
    f: impl Fn(&mut [MaybeUninit<U>], &[T]) + Sync + Send,
) -> Result<Tensor> {
    let t = contiguous(t)?;
    let (storage, layout) = t.concrete(op)?;
    let guard = storage.read();
    let data = guard
        .as_slice::<T>()
        .ok_or_else(|| Error::dtype(op, format!("expected a tensor of dtype {}, got {}", T::DTYPE, guard.dtype())))?;
    let range = layout.contiguous_range().ok_or_else(|| Error::shape(op, "contiguous() returned a strided tensor"))?;
    let n = range.len();
    let mut buf: Vec<U> = crate::memory::alloc_uninit(op, layout.shape())?;
    if n > 0 {
        let x = &data[range];
        let out = &mut buf.spare_capacity_mut()[..n];
        if n < PAR_THRESHOLD {
            f(out, x);
        } else {
            super::team::chunks_mut(out, PAR_CHUNK, |i, o| f(o, &x[i * PAR_CHUNK..i * PAR_CHUNK + o.len()]));
        }
    }
    // SAFETY: `f` wrote every element of the n-element prefix of the spare capacity (its
    // contract; the chunks cover all n), and alloc_uninit reserved room for n elements.
    unsafe { buf.set_len(n) };
    drop(guard);
    Tensor::from_buffer(U::into_buffer(buf), layout.shape())
}

/// Combines `da` (through `la`) and `db` (through `lb`) elementwise with broadcasting to
/// `out_shape` into a fresh row-major `Vec`.
pub fn zip_strided<T: Element, V: Element, U: Element>(
    op: &str,
    da: &[T],
    la: &Layout,
    db: &[V],
    lb: &Layout,
    out_shape: &[usize],
    f: impl Fn(T, V) -> U + Sync + Send,
) -> Result<Vec<U>> {
    let mut buf: Vec<U> = crate::memory::alloc_uninit(op, out_shape)?;
    let n: usize = out_shape.iter().product();
    if n == 0 {
        return Ok(buf);
    }
    // not zero-filled first: row2 writes every element it is given, and the rows cover all n
    let out = &mut buf.spare_capacity_mut()[..n];
    let small_contiguous = n < PAR_THRESHOLD && la.is_contiguous() && la.shape() == out_shape;
    if small_contiguous && lb.shape() == out_shape && lb.is_contiguous() {
        // Tiny/small fast paths: skip building a plan.
        row2(out, da, la.offset(), 1, db, lb.offset(), 1, &f);
    } else if small_contiguous && lb.numel() == 1 {
        row2(out, da, la.offset(), 1, db, lb.offset(), 0, &f);
    } else {
        let ea = la.broadcast_to(op, out_shape)?;
        let eb = lb.broadcast_to(op, out_shape)?;
        let plan = Plan::new([&ea, &eb]);
        let [sa, sb] = plan.inner_strides;
        plan.fill(out, &|o, [oa, ob]| row2(o, da, oa, sa, db, ob, sb, &f));
    }
    // SAFETY: all n elements were written above (the plan's rows x inner = n). On the error
    // returns above, `buf` is dropped with length 0.
    unsafe { buf.set_len(n) };
    Ok(buf)
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
    let out = zip_strided(op, da, la, db, lb, &out_shape, f)?;
    drop(gb);
    drop(ga);
    Tensor::from_buffer(U::into_buffer(out), &out_shape)
}

/// Combines three tensors elementwise with broadcasting: `f(a, b, c)` with `a: A`, `b` and `c`
/// of type `T` (used by `where`).
pub fn ternary_map<A: Element, T: Element, U: Element>(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl Fn(A, T, T) -> U + Sync + Send,
) -> Result<Tensor> {
    let s = broadcast_shapes(op, a.shape(), b.shape())?;
    let out_shape = broadcast_shapes(op, &s, c.shape())?;
    let mut out: Vec<U> = crate::memory::alloc_filled(op, &out_shape, U::default())?;
    let (sa, la) = a.concrete(op)?;
    let (sb, lb) = b.concrete(op)?;
    let (sc, lc) = c.concrete(op)?;
    let (ea, eb, ec) =
        (la.broadcast_to(op, &out_shape)?, lb.broadcast_to(op, &out_shape)?, lc.broadcast_to(op, &out_shape)?);
    // One read guard per distinct storage (never two guards of one lock).
    let ga = sa.read();
    let gb = if sb.same(sa) { None } else { Some(sb.read()) };
    let gc = if sc.same(sa) || sc.same(sb) { None } else { Some(sc.read()) };
    let pick = |s: &crate::storage::Storage| -> &crate::storage::CpuBuffer {
        if s.same(sa) {
            &ga
        } else if s.same(sb) {
            gb.as_deref().unwrap_or(&ga)
        } else {
            gc.as_deref().unwrap_or(&ga)
        }
    };
    let bad = |t: &Tensor, want: DType| Error::dtype(op, format!("expected {want} input, got {}", t.dtype()));
    let da = pick(sa).as_slice::<A>().ok_or_else(|| bad(a, A::DTYPE))?;
    let db = pick(sb).as_slice::<T>().ok_or_else(|| bad(b, T::DTYPE))?;
    let dc = pick(sc).as_slice::<T>().ok_or_else(|| bad(c, T::DTYPE))?;
    let plan = Plan::new([&ea, &eb, &ec]);
    let [xa, xb, xc] = plan.inner_strides;
    plan.fill(&mut out, &|o, [oa, ob, oc]| {
        for (i, o) in o.iter_mut().enumerate() {
            *o = f(da[oa + i * xa], db[ob + i * xb], dc[oc + i * xc]);
        }
    });
    drop(gc);
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

/// A row-major copy of `t` in new storage (always a copy, unlike [`contiguous`]).
pub fn clone(t: &Tensor) -> Result<Tensor> {
    let dt = t.dtype();
    crate::match_dtype!(dt, T => unary_map::<T, T>("clone", t, |x| x))
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
    crate::match_dtype!(dtype, T => Tensor::from_vec::<T>(crate::memory::alloc_filled("zeros", shape, T::default())?, shape))
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
    let (dst_storage, dst_layout) = dst.concrete(op)?;
    let (src_storage, _) = src.concrete(op)?;
    crate::match_dtype!(dt, T => {
        if src_storage.same(dst_storage) {
            // Aliasing: read everything first, then write.
            let values: Vec<T> = src.with_data::<T, _>(op, |d, _| map_strided(op, d, &src_l, |x| x))??;
            let mut g = dst_storage.write();
            let out = g.as_mut_slice::<T>().ok_or_else(|| Error::dtype(op, "destination dtype changed"))?;
            write_strided(out, dst_layout, &values);
        } else {
            let gs = src_storage.read();
            let sd = gs.as_slice::<T>().ok_or_else(|| Error::dtype(op, "source dtype changed"))?;
            let mut g = dst_storage.write();
            let out = g.as_mut_slice::<T>().ok_or_else(|| Error::dtype(op, "destination dtype changed"))?;
            update_strided(out, dst_layout, sd, &src_l, |_, s| s);
        }
    });
    Ok(())
}

/// `out[i] = f(out[i], src[j])` for every element, with `out` read and written through `lo` and
/// `src` read through `ls` (which must already be broadcast to `lo`'s shape). The caller must
/// ensure `lo` has no internal overlap (no expanded dims) and that `out` and `src` are different
/// buffers. Contiguous operands take a vectorised, parallel path.
pub fn update_strided<T: Element, V: Element>(
    out: &mut [T],
    lo: &Layout,
    src: &[V],
    ls: &Layout,
    f: impl Fn(T, V) -> T + Sync + Send,
) {
    let n = lo.numel();
    if n == 0 {
        return;
    }
    if let Some(ro) = lo.contiguous_range() {
        let ss = if ls.is_contiguous() {
            Some(1)
        } else if ls.strides().iter().all(|&st| st == 0) {
            Some(0)
        } else {
            None
        };
        if let Some(ss) = ss {
            let (o, base) = (&mut out[ro], ls.offset());
            if n >= PAR_THRESHOLD {
                super::team::chunks_mut(o, PAR_CHUNK, |k, c| {
                    let len = c.len();
                    update_row(c, 0, 1, src, base + k * PAR_CHUNK * ss, ss, len, &f)
                });
            } else {
                update_row(o, 0, 1, src, base, ss, n, &f);
            }
            return;
        }
    }
    let plan = Plan::new([lo, ls]);
    let [so, ss] = plan.inner_strides;
    let inner = plan.inner;
    plan.for_each_row(0, plan.rows(), |_, [oo, os]| update_row(out, oo, so, src, os, ss, inner, &f));
}

/// `out[oo + i*so] = f(out[oo + i*so], src[os + i*ss])` for `i < n`, specialised for the
/// common strides.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn update_row<T: Copy, V: Copy>(
    out: &mut [T],
    oo: usize,
    so: usize,
    src: &[V],
    os: usize,
    ss: usize,
    n: usize,
    f: &impl Fn(T, V) -> T,
) {
    match (so, ss) {
        (1, 1) => {
            for (o, &s) in out[oo..oo + n].iter_mut().zip(&src[os..os + n]) {
                *o = f(*o, s);
            }
        }
        (1, 0) => {
            let y = src[os];
            for o in out[oo..oo + n].iter_mut() {
                *o = f(*o, y);
            }
        }
        _ => {
            for i in 0..n {
                let k = oo + i * so;
                out[k] = f(out[k], src[os + i * ss]);
            }
        }
    }
}

/// Writes `values` (row-major) into `out` through `layout`.
pub fn write_strided<T: Copy>(out: &mut [T], layout: &Layout, values: &[T]) {
    match layout.contiguous_range() {
        Some(r) => out[r].copy_from_slice(values),
        None => {
            let plan = Plan::new([layout]);
            let [so] = plan.inner_strides;
            let inner = plan.inner;
            plan.for_each_row(0, plan.rows(), |j, [oo]| {
                for (i, &v) in values[j * inner..(j + 1) * inner].iter().enumerate() {
                    out[oo + i * so] = v;
                }
            });
        }
    }
}
