//! Reductions: `sum`, `mean`, `prod`, `max`/`min` (full and `max.dim`/`min.dim` with indices),
//! `amax`/`amin`, `argmax`/`argmin`, `var`/`std` (`correction` or `unbiased`), `logsumexp`,
//! `all`/`any`, `norm` (p = 2 default, 1, inf, -inf, 0, any other p) and `sum_to_size`.
//!
//! Naming: PyTorch's `max(input)` (full reduction) and `max(input, dim, keepdim)` (values and
//! indices) are two ATen overloads; here they are two ops, `max` and `max.dim` (likewise `min`
//! and `min.dim`). The Tensor methods are [`Tensor::max`] and [`Tensor::max_dim`].
//!
//! Numerics: floating sums (sum, mean, var, std, norm, logsumexp) accumulate in f64 with eight
//! independent lanes and fixed-size blocks, so f32 results are at least as accurate as
//! PyTorch's cascade sum and do not depend on the number of threads. Integer and bool inputs
//! sum and multiply in int64 (wrapping), as PyTorch does.
//!
//! Layout strategy: a reduction is planned as `[outer, reduced, inner]` over a contiguous
//! buffer. When the input is contiguous and the reduced dims are adjacent this needs no copy
//! (`inner > 1` for reductions over leading dims runs a vectorisable column-accumulator loop);
//! otherwise the reduced dims are permuted last and copied once.
//!
//! This file also holds the small helpers the other files of the family share (`opdef!`,
//! `dim_mask`, allocation limits, output wrapping).

use crate::dtype::{DType, Element, DEFAULT_FLOAT};
use crate::error::{Error, Result};
use crate::layout::wrap_dim;
use crate::op::args::{bool_, int, opt_dtype, opt_int, opt_ints, opt_scalar, tensor};
use crate::op::{
    dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Default as D, Effect, MetaOutputs, OpDef, Outputs,
};
use crate::ops::kernel;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;

// ------------------------------------------------------------------------------------------
// Shared helpers for the reduction / indexing / creation / random family.
// ------------------------------------------------------------------------------------------

/// Defines a built-in `OpDef` static (backward left to the autograd engineer).
macro_rules! opdef {
    ($s:ident, $name:literal, $schema:expr, meta: $meta:expr, kernel: $kernel:expr, cost: $cost:expr, effect: $effect:expr, category: $cat:expr, doc: $doc:literal) => {
        #[doc = $doc]
        pub static $s: $crate::op::OpDef = $crate::op::OpDef {
            name: $name,
            schema: $schema,
            meta: $meta,
            kernel: $kernel,
            cost: $cost,
            effect: $effect,
            category: $cat,
            backward: None,
            saves: $crate::op::Saves::NOTHING,
            doc: $doc,
        };
    };
    ($s:ident, $name:literal, $schema:expr, meta: $meta:expr, kernel: $kernel:expr, cost: $cost:expr, effect: $effect:expr, category: $cat:expr, backward: $bw:expr, saves: $saves:expr, doc: $doc:literal) => {
        #[doc = $doc]
        pub static $s: $crate::op::OpDef = $crate::op::OpDef {
            name: $name,
            schema: $schema,
            meta: $meta,
            kernel: $kernel,
            cost: $cost,
            effect: $effect,
            category: $cat,
            backward: Some($bw),
            saves: $saves,
            doc: $doc,
        };
    };
}
pub(crate) use opdef;

/// Largest buffer (in bytes) a creation op or kernel will allocate (see [`crate::memory`]).
pub use crate::memory::MAX_ALLOC_BYTES;

/// Checks that a tensor of `shape` and `dtype` may be allocated ([`crate::memory::check_alloc`]).
pub(crate) fn check_alloc(op: &str, shape: &[usize], dtype: DType) -> Result<usize> {
    crate::memory::check_alloc(op, shape, dtype)
}

/// A vector of `n` copies of `v`, reporting allocation failure as an error (no abort).
pub(crate) fn alloc_filled<E: Element>(op: &str, n: usize, v: E) -> Result<Vec<E>> {
    crate::memory::alloc_filled(op, &[n], v)
}

/// One contiguous output meta.
#[inline]
pub(crate) fn meta1(shape: &[usize], dtype: DType) -> MetaOutputs {
    smallvec![TensorMeta::contiguous(shape, dtype)]
}

/// The first output of a dispatched op.
#[inline]
pub(crate) fn call1(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Tensor> {
    let mut out: Outputs = dispatch(op, kind, args)?;
    if out.is_empty() {
        return Err(Error::schema(op.name, "op returned no output"));
    }
    Ok(out.swap_remove(0))
}

/// The two outputs of a dispatched op.
#[inline]
pub(crate) fn call2(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<(Tensor, Tensor)> {
    let out: Outputs = dispatch(op, kind, args)?;
    let mut it = out.into_iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(Error::schema(op.name, "op returned fewer than two outputs")),
    }
}

/// Builds a tensor of `dtype` from f64 values.
pub(crate) fn from_f64(values: Vec<f64>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    if dtype == DType::F64 {
        return Tensor::from_vec(values, shape);
    }
    crate::match_dtype!(dtype, E => Tensor::from_vec::<E>(values.into_iter().map(E::from_f64).collect(), shape))
}

/// Builds a tensor of `dtype` from i64 values.
pub(crate) fn from_i64(values: Vec<i64>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    if dtype == DType::I64 {
        return Tensor::from_vec(values, shape);
    }
    crate::match_dtype!(dtype, E => Tensor::from_vec::<E>(values.into_iter().map(E::from_i64).collect(), shape))
}

/// Normalises reduction dims into a mask over `ndim` dims. `None` or an empty list reduces
/// every dim (PyTorch's convention); repeated dims are an error.
pub(crate) fn dim_mask(op: &str, dims: Option<&[i64]>, ndim: usize) -> Result<Vec<bool>> {
    let mut mask = vec![false; ndim];
    match dims {
        None => mask.iter_mut().for_each(|m| *m = true),
        Some([]) => mask.iter_mut().for_each(|m| *m = true),
        Some(ds) => {
            for &d in ds {
                let w = wrap_dim(op, d, ndim)?;
                if ndim == 0 {
                    continue;
                }
                if mask[w] {
                    return Err(Error::argument(op, format!("dim {w} appears multiple times in the list of dims")));
                }
                mask[w] = true;
            }
        }
    }
    Ok(mask)
}

/// The shape after reducing the masked dims.
pub(crate) fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(shape.len());
    for (&s, &m) in shape.iter().zip(mask) {
        if !m {
            out.push(s);
        } else if keepdim {
            out.push(1);
        }
    }
    out
}

/// A reduction laid out as `[o, r, i]` over the contiguous tensor `src`.
pub(crate) struct Plan {
    pub src: Tensor,
    pub o: usize,
    pub r: usize,
    pub i: usize,
    /// `true` when `src` holds the kept dims then the reduced dims (a permuted copy); `false`
    /// when it is the input itself in its own order.
    pub permuted: bool,
}

/// Plans a reduction of the masked dims of `t`. With `allow_inner == false` the result always
/// has `i == 1` (the reduced elements of each output are adjacent).
pub(crate) fn plan(op: &str, t: &Tensor, mask: &[bool], allow_inner: bool) -> Result<Plan> {
    let shape = t.shape().to_vec();
    let n = shape.len();
    let r: usize = (0..n).filter(|&d| mask[d]).map(|d| shape[d]).product();
    if t.is_contiguous() {
        let nz: Vec<usize> = (0..n).filter(|&d| shape[d] != 1).collect();
        let pos: Vec<usize> = (0..nz.len()).filter(|&k| mask[nz[k]]).collect();
        if pos.is_empty() {
            return Ok(Plan { src: t.clone(), o: shape.iter().product(), r, i: 1, permuted: false });
        }
        let (a, b) = (pos[0], pos[pos.len() - 1]);
        if b - a + 1 == pos.len() {
            let o: usize = nz[..a].iter().map(|&d| shape[d]).product();
            let i: usize = nz[b + 1..].iter().map(|&d| shape[d]).product();
            if i == 1 || allow_inner {
                return Ok(Plan { src: t.clone(), o, r, i, permuted: false });
            }
        }
    }
    let mut perm: Vec<i64> = (0..n).filter(|&d| !mask[d]).map(|d| d as i64).collect();
    perm.extend((0..n).filter(|&d| mask[d]).map(|d| d as i64));
    let (_, layout) = t.concrete(op)?;
    let l = layout.permute(op, &perm)?;
    let src = kernel::contiguous(&t.view_with_layout(op, l)?)?;
    let o = (0..n).filter(|&d| !mask[d]).map(|d| shape[d]).product();
    Ok(Plan { src, o, r, i: 1, permuted: true })
}

/// Undoes a single-dim [`plan`] that permuted: `t` holds the elements in the order "kept dims,
/// then `dim`" (any shape with that many elements); returns a contiguous tensor of `shape`.
pub(crate) fn unpermute(op: &str, t: Tensor, shape: &[usize], dim: usize) -> Result<Tensor> {
    let n = shape.len();
    let mut pshape: Vec<usize> = (0..n).filter(|&d| d != dim).map(|d| shape[d]).collect();
    pshape.push(shape[dim]);
    let inv: Vec<i64> = (0..n)
        .map(|d| {
            if d == dim {
                (n - 1) as i64
            } else if d < dim {
                d as i64
            } else {
                (d - 1) as i64
            }
        })
        .collect();
    let l = crate::layout::Layout::contiguous(&pshape).permute(op, &inv)?;
    kernel::contiguous(&t.view_with_layout(op, l)?)
}

/// Cost of a reduction: one flop per input element, input and output bytes.
pub(crate) fn cost_reduce(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes = 0u64;
    let mut flops = 0u64;
    for a in args {
        a.for_each_tensor(|t| {
            bytes = bytes.saturating_add(t.meta_nbytes() as u64);
            flops = flops.saturating_add(t.meta().map(|m| m.numel()).unwrap_or(0) as u64);
        });
    }
    for o in outs {
        bytes = bytes.saturating_add(o.nbytes() as u64);
    }
    Cost { flops, bytes }
}

const LANES: usize = 8;
/// Elements per block of a blocked sum (fixed, so results do not depend on thread count).
const BLOCK: usize = 1 << 14;

#[inline(always)]
fn lane_sum<E: Copy>(x: &[E], f: &impl Fn(E) -> f64) -> f64 {
    let mut acc = [0f64; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += f(c[j]);
        }
    }
    let mut s = 0.0;
    for &v in rem {
        s += f(v);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + s
}

#[inline]
fn blocked_sum<E: Copy + Sync>(row: &[E], f: &(impl Fn(E) -> f64 + Sync), parallel: bool) -> f64 {
    if row.len() <= BLOCK {
        return lane_sum(row, f);
    }
    if parallel {
        let parts: Vec<f64> = row.par_chunks(BLOCK).map(|b| lane_sum(b, f)).collect();
        parts.into_iter().sum()
    } else {
        row.chunks(BLOCK).map(|b| lane_sum(b, f)).sum()
    }
}

/// Sums `f(x, k)` over the reduced axis of an `[o, r, i]` buffer, where `k` is the output
/// index; returns `o * i` f64 values.
pub(crate) fn sum_rows<E: Element>(
    x: &[E],
    o: usize,
    r: usize,
    i: usize,
    f: impl Fn(E, usize) -> f64 + Sync + Send,
) -> Vec<f64> {
    let mut out = vec![0f64; o * i];
    let big = o * r * i >= kernel::PAR_THRESHOLD;
    if i == 1 {
        if o >= 4 || !big {
            let per_row = |(k, slot): (usize, &mut f64)| {
                let row = &x[k * r..(k + 1) * r];
                *slot = blocked_sum(row, &|v| f(v, k), false);
            };
            if big {
                out.par_iter_mut().enumerate().with_min_len((kernel::PAR_CHUNK / r.max(1)).max(1)).for_each(per_row);
            } else {
                out.iter_mut().enumerate().for_each(per_row);
            }
        } else {
            for (k, slot) in out.iter_mut().enumerate() {
                let row = &x[k * r..(k + 1) * r];
                *slot = blocked_sum(row, &|v| f(v, k), true);
            }
        }
        return out;
    }
    // i > 1: accumulate whole rows of `i` columns (vectorisable).
    let cols = |oo: usize, c0: usize, acc: &mut [f64]| {
        let base = oo * r * i;
        for rr in 0..r {
            let row = &x[base + rr * i + c0..base + rr * i + c0 + acc.len()];
            for (k, (a, &v)) in acc.iter_mut().zip(row).enumerate() {
                *a += f(v, oo * i + c0 + k);
            }
        }
    };
    if !big {
        for (oo, acc) in out.chunks_mut(i).enumerate() {
            cols(oo, 0, acc);
        }
    } else if o >= 4 {
        out.par_chunks_mut(i).enumerate().for_each(|(oo, acc)| cols(oo, 0, acc));
    } else {
        const COLS: usize = 512;
        for (oo, accs) in out.chunks_mut(i).enumerate() {
            accs.par_chunks_mut(COLS).enumerate().for_each(|(c, acc)| cols(oo, c * COLS, acc));
        }
    }
    out
}

/// Applies `f` to every reduced row of an `[o, r]` buffer (rows in parallel when large).
pub(crate) fn map_rows<E: Element, A: Send + Default + Clone>(
    x: &[E],
    o: usize,
    r: usize,
    f: impl Fn(&[E]) -> A + Sync + Send,
) -> Vec<A> {
    let mut out = vec![A::default(); o];
    if o * r >= kernel::PAR_THRESHOLD && o > 1 {
        out.par_iter_mut()
            .enumerate()
            .with_min_len((kernel::PAR_CHUNK / r.max(1)).max(1))
            .for_each(|(k, s)| *s = f(&x[k * r..(k + 1) * r]));
    } else {
        for (k, s) in out.iter_mut().enumerate() {
            *s = f(&x[k * r..(k + 1) * r]);
        }
    }
    out
}

/// `true` when `cand` should replace `cur` as the running max (`is_max`) or min: the first NaN
/// wins and sticks, otherwise strict improvement (so ties keep the first index).
#[inline(always)]
fn better<E: PartialOrd + Copy>(cand: E, cur: E, is_max: bool) -> bool {
    #[allow(clippy::eq_op)]
    let (cur_nan, cand_nan) = (cur != cur, cand != cand);
    if cur_nan {
        return false;
    }
    if cand_nan {
        return true;
    }
    if is_max {
        cand > cur
    } else {
        cand < cur
    }
}

#[inline]
fn arg_best<E: PartialOrd + Copy>(row: &[E], is_max: bool) -> (E, usize) {
    let mut best = row[0];
    let mut bi = 0;
    for (k, &v) in row.iter().enumerate().skip(1) {
        if better(v, best, is_max) {
            best = v;
            bi = k;
        }
    }
    (best, bi)
}

fn float_only(op: &str, dt: DType, what: &str) -> Result<()> {
    if dt.is_floating_point() {
        Ok(())
    } else {
        Err(Error::dtype(op, format!("{what}. Got: {dt}")))
    }
}

// ------------------------------------------------------------------------------------------
// sum / mean / prod
// ------------------------------------------------------------------------------------------

struct SumParams {
    mask: Vec<bool>,
    out_shape: Vec<usize>,
    out_dtype: DType,
}

fn default_acc_dtype(dt: DType) -> DType {
    if dt.is_floating_point() {
        dt
    } else {
        DType::I64
    }
}

fn sum_params(op: &str, args: &[Value], mean: bool) -> Result<SumParams> {
    let t = tensor(op, args, 0)?;
    let dims = opt_ints(op, args, 1)?;
    let keepdim = bool_(op, args, 2)?;
    let dtype = opt_dtype(op, args, 3)?;
    let shape = t.shape();
    let mask = dim_mask(op, dims.as_deref(), shape.len())?;
    let out_dtype = match dtype {
        Some(d) => d,
        None => default_acc_dtype(t.dtype()),
    };
    if mean && !out_dtype.is_floating_point() {
        return Err(Error::dtype(
            op,
            format!(
                "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {}",
                if dtype.is_some() { out_dtype } else { t.dtype() }
            ),
        ));
    }
    Ok(SumParams { out_shape: reduced_shape(shape, &mask, keepdim), mask, out_dtype })
}

fn sum_meta(op: &str, args: &[Value], mean: bool) -> Result<MetaOutputs> {
    let p = sum_params(op, args, mean)?;
    Ok(meta1(&p.out_shape, p.out_dtype))
}

/// Sums the masked dims of `t` into `out_dtype` (the input is cast first when the result is
/// floating or the input is floating; integers accumulate in int64).
fn sum_impl(op: &str, t: &Tensor, mask: &[bool], out_shape: &[usize], out_dtype: DType, mean: bool) -> Result<Tensor> {
    if out_dtype.is_floating_point() {
        let x = kernel::cast(t, out_dtype)?;
        let p = plan(op, &x, mask, true)?;
        let xdt = x.dtype();
        let vals: Vec<f64> = crate::match_dtype!(xdt, E => p.src.with_contiguous::<E, _>(op, |d| sum_rows(d, p.o, p.r, p.i, |v, _| v.to_f64()))?);
        let vals = if mean {
            let n = p.r as f64;
            vals.into_iter().map(|v| v / n).collect()
        } else {
            vals
        };
        from_f64(vals, out_shape, out_dtype)
    } else {
        let x = if t.dtype().is_floating_point() { kernel::cast(t, out_dtype)? } else { t.clone() };
        let p = plan(op, &x, mask, false)?;
        let dt = x.dtype();
        let vals: Vec<i64> = crate::match_dtype!(dt, E => p.src.with_contiguous::<E, _>(op, |d| {
            map_rows(d, p.o, p.r, |row| row.iter().fold(0i64, |a, &v| a.wrapping_add(v.to_i64())))
        })?);
        from_i64(vals, out_shape, out_dtype)
    }
}

fn sum_kernel(op: &str, args: &[Value], mean: bool) -> Result<Outputs> {
    let p = sum_params(op, args, mean)?;
    let t = tensor(op, args, 0)?;
    Ok(smallvec![sum_impl(op, t, &p.mask, &p.out_shape, p.out_dtype, mean)?])
}

const SUM_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::opt("dim", T::OptIntList, D::None),
    ArgSpec::opt("keepdim", T::Bool, D::Bool(false)),
    ArgSpec::kw("dtype", T::OptDType, D::None),
];

opdef!(SUM, "sum", SUM_SCHEMA,
    meta: |a| sum_meta("sum", a, false),
    kernel: |a| sum_kernel("sum", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::sum_backward, saves: crate::op::Saves::NOTHING,
    doc: "Sum over dims (all when dim is None); ints and bools sum in int64.");

opdef!(MEAN, "mean", SUM_SCHEMA,
    meta: |a| sum_meta("mean", a, true),
    kernel: |a| sum_kernel("mean", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::mean_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Mean over dims (all when dim is None); floating inputs (or a floating dtype) only.");

fn prod_params(args: &[Value]) -> Result<SumParams> {
    let op = "prod";
    let t = tensor(op, args, 0)?;
    let dim = opt_int(op, args, 1)?;
    let keepdim = bool_(op, args, 2)?;
    let dtype = opt_dtype(op, args, 3)?;
    let shape = t.shape();
    let mask = match dim {
        None => vec![true; shape.len()],
        Some(d) => dim_mask(op, Some(&[d]), shape.len())?,
    };
    let out_shape = if dim.is_none() { vec![] } else { reduced_shape(shape, &mask, keepdim) };
    Ok(SumParams { mask, out_shape, out_dtype: dtype.unwrap_or_else(|| default_acc_dtype(t.dtype())) })
}

opdef!(PROD, "prod",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("dim", T::OptInt, D::None), ArgSpec::opt("keepdim", T::Bool, D::Bool(false)), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let p = prod_params(a)?; Ok(meta1(&p.out_shape, p.out_dtype)) },
    kernel: |a| {
        let p = prod_params(a)?;
        let t = tensor("prod", a, 0)?;
        let out = if p.out_dtype.is_floating_point() || t.dtype().is_floating_point() {
            let x = kernel::cast(t, p.out_dtype)?;
            let pl = plan("prod", &x, &p.mask, false)?;
            let xdt = x.dtype();
            let vals: Vec<f64> = crate::match_dtype!(xdt, E => pl.src.with_contiguous::<E, _>("prod", |d| map_rows(d, pl.o, pl.r, |row| row.iter().fold(1f64, |a, &v| a * v.to_f64())))?);
            if p.out_dtype.is_floating_point() { from_f64(vals, &p.out_shape, p.out_dtype)? }
            else { from_i64(vals.into_iter().map(|v| v as i64).collect(), &p.out_shape, p.out_dtype)? }
        } else {
            let pl = plan("prod", t, &p.mask, false)?;
            let dt = t.dtype();
            let vals: Vec<i64> = crate::match_dtype!(dt, E => pl.src.with_contiguous::<E, _>("prod", |d| map_rows(d, pl.o, pl.r, |row| row.iter().fold(1i64, |a, &v| a.wrapping_mul(v.to_i64()))))?);
            from_i64(vals, &p.out_shape, p.out_dtype)?
        };
        Ok(smallvec![out])
    },
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::prod_backward, saves: crate::op::Saves { inputs: 1, outputs: 0 },
    doc: "Product over one dim (all when dim is None); ints and bools multiply in int64.");

/// `sum_to_size(size)`: sums broadcast dims so the result has `size` (the inverse of
/// broadcasting; used by autograd). Returns the input itself when no reduction is needed.
fn sum_to_size_params(args: &[Value]) -> Result<(Vec<bool>, Vec<usize>)> {
    let op = "sum_to_size";
    let t = tensor(op, args, 0)?;
    let size = crate::op::args::ints(op, args, 1)?;
    let shape = t.shape();
    let bad = || Error::shape(op, format!("size {{{:?}}} is not expandable to size {{{:?}}}.", size.as_ref(), shape));
    if size.len() > shape.len() || size.iter().any(|&s| s < 0) {
        return Err(bad());
    }
    let lead = shape.len() - size.len();
    let mut mask = vec![false; shape.len()];
    for d in 0..shape.len() {
        if d < lead {
            mask[d] = true;
        } else {
            let s = size[d - lead] as usize;
            if s == shape[d] {
                continue;
            }
            if s != 1 {
                return Err(bad());
            }
            mask[d] = true;
        }
    }
    Ok((mask, size.iter().map(|&s| s as usize).collect()))
}

opdef!(SUM_TO_SIZE, "sum_to_size", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("size", T::IntList)],
    meta: |a| {
        let t = tensor("sum_to_size", a, 0)?;
        let (mask, size) = sum_to_size_params(a)?;
        let dt = if mask.iter().any(|&m| m) { default_acc_dtype(t.dtype()) } else { t.dtype() };
        Ok(meta1(&size, dt))
    },
    kernel: |a| {
        let t = tensor("sum_to_size", a, 0)?;
        let (mask, size) = sum_to_size_params(a)?;
        if !mask.iter().any(|&m| m) {
            return Ok(smallvec![t.clone()]);
        }
        Ok(smallvec![sum_impl("sum_to_size", t, &mask, &size, default_acc_dtype(t.dtype()), false)?])
    },
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::sum_to_size_backward, saves: crate::op::Saves::NOTHING,
    doc: "Sums broadcast dims so the result has the given size (reverses broadcasting).");

// ------------------------------------------------------------------------------------------
// max / min / amax / amin / argmax / argmin
// ------------------------------------------------------------------------------------------

fn full_minmax_meta(op: &str, args: &[Value]) -> Result<MetaOutputs> {
    let t = tensor(op, args, 0)?;
    if t.numel() == 0 {
        return Err(Error::argument(
            op,
            format!("{op}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument."),
        ));
    }
    Ok(meta1(&[], t.dtype()))
}

fn full_minmax_kernel(op: &str, args: &[Value], is_max: bool) -> Result<Outputs> {
    full_minmax_meta(op, args)?;
    let t = tensor(op, args, 0)?;
    let dt = t.dtype();
    crate::match_dtype!(dt, E => {
        let v: E = t.with_contiguous::<E, _>(op, |d| {
            if d.len() >= kernel::PAR_THRESHOLD {
                d.par_chunks(BLOCK).map(|c| arg_best(c, is_max).0).reduce_with(|a, b| if better(b, a, is_max) { b } else { a }).unwrap_or(d[0])
            } else {
                arg_best(d, is_max).0
            }
        })?;
        Ok(smallvec![Tensor::scalar(v)])
    })
}

struct DimParams {
    mask: Vec<bool>,
    out_shape: Vec<usize>,
}

fn dim_params(op: &str, t: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<DimParams> {
    let shape = t.shape();
    match dim {
        None => {
            if t.numel() == 0 {
                return Err(Error::argument(
                    op,
                    format!("{op}(): Expected reduction dim to be specified for input.numel() == 0."),
                ));
            }
            let out_shape = if keepdim { vec![1; shape.len()] } else { vec![] };
            Ok(DimParams { mask: vec![true; shape.len()], out_shape })
        }
        Some(d) => {
            let w = wrap_dim(op, d, shape.len())?;
            let mut mask = vec![false; shape.len()];
            if !shape.is_empty() {
                mask[w] = true;
                if shape[w] == 0 {
                    return Err(Error::index(op, format!("{op}(): Expected reduction dim {w} to have non-zero size.")));
                }
            }
            Ok(DimParams { out_shape: reduced_shape(shape, &mask, keepdim), mask })
        }
    }
}

fn minmax_dim_params(op: &str, args: &[Value]) -> Result<DimParams> {
    let t = tensor(op, args, 0)?;
    dim_params(op, t, Some(int(op, args, 1)?), bool_(op, args, 2)?)
}

fn minmax_dim_kernel(op: &str, args: &[Value], is_max: bool, want_values: bool, want_idx: bool) -> Result<Outputs> {
    let p = minmax_dim_params(op, args)?;
    let t = tensor(op, args, 0)?;
    arg_reduce(op, t, &p, is_max, want_values, want_idx)
}

fn arg_reduce(op: &str, t: &Tensor, p: &DimParams, is_max: bool, want_values: bool, want_idx: bool) -> Result<Outputs> {
    let pl = plan(op, t, &p.mask, false)?;
    let dt = t.dtype();
    crate::match_dtype!(dt, E => {
        let res: Vec<(E, usize)> = pl.src.with_contiguous::<E, _>(op, |d| map_rows(d, pl.o, pl.r, |row| arg_best(row, is_max)))?;
        let mut out: Outputs = smallvec![];
        if want_values {
            out.push(Tensor::from_vec(res.iter().map(|x| x.0).collect::<Vec<E>>(), &p.out_shape)?);
        }
        if want_idx {
            out.push(Tensor::from_vec(res.iter().map(|x| x.1 as i64).collect::<Vec<i64>>(), &p.out_shape)?);
        }
        Ok(out)
    })
}

const SELF_ONLY: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor)];
const DIM_KEEPDIM: &[ArgSpec] =
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::opt("keepdim", T::Bool, D::Bool(false))];
const OPTDIM_KEEPDIM: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::opt("dim", T::OptInt, D::None),
    ArgSpec::opt("keepdim", T::Bool, D::Bool(false)),
];
const DIMS_KEEPDIM: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::opt("dim", T::IntList, D::Ints(&[])),
    ArgSpec::opt("keepdim", T::Bool, D::Bool(false)),
];

opdef!(MAX, "max", SELF_ONLY,
    meta: |a| full_minmax_meta("max", a),
    kernel: |a| full_minmax_kernel("max", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::max_all_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Largest element (a 0-dim tensor); NaN propagates. With a dim, use max.dim.");
opdef!(MIN, "min", SELF_ONLY,
    meta: |a| full_minmax_meta("min", a),
    kernel: |a| full_minmax_kernel("min", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::max_all_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Smallest element (a 0-dim tensor); NaN propagates. With a dim, use min.dim.");

fn minmax_dim_meta(op: &str, a: &[Value]) -> Result<MetaOutputs> {
    let p = minmax_dim_params(op, a)?;
    let t = tensor(op, a, 0)?;
    Ok(smallvec![TensorMeta::contiguous(&p.out_shape, t.dtype()), TensorMeta::contiguous(&p.out_shape, DType::I64)])
}

opdef!(MAX_DIM, "max.dim", DIM_KEEPDIM,
    meta: |a| minmax_dim_meta("max.dim", a),
    kernel: |a| minmax_dim_kernel("max.dim", a, true, true, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::max_dim_backward, saves: crate::op::Saves { inputs: 0, outputs: 2 },
    doc: "torch.max(input, dim, keepdim): (values, indices) of the largest elements along dim; ties give the first index.");
opdef!(MIN_DIM, "min.dim", DIM_KEEPDIM,
    meta: |a| minmax_dim_meta("min.dim", a),
    kernel: |a| minmax_dim_kernel("min.dim", a, false, true, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::max_dim_backward, saves: crate::op::Saves { inputs: 0, outputs: 2 },
    doc: "torch.min(input, dim, keepdim): (values, indices) of the smallest elements along dim; ties give the first index.");

fn amax_params(op: &str, a: &[Value]) -> Result<DimParams> {
    let t = tensor(op, a, 0)?;
    let dims = crate::op::args::ints(op, a, 1)?;
    let keepdim = bool_(op, a, 2)?;
    let mask = dim_mask(op, Some(&dims), t.ndim())?;
    for (d, &m) in mask.iter().enumerate() {
        if m && t.shape()[d] == 0 {
            return Err(Error::index(op, format!("{op}(): Expected reduction dim {d} to have non-zero size.")));
        }
    }
    if t.numel() == 0 && t.ndim() == 0 {
        return Err(Error::index(op, format!("{op}(): Expected reduction dim to have non-zero size.")));
    }
    Ok(DimParams { out_shape: reduced_shape(t.shape(), &mask, keepdim), mask })
}

fn amax_kernel(op: &str, a: &[Value], is_max: bool) -> Result<Outputs> {
    let p = amax_params(op, a)?;
    arg_reduce(op, tensor(op, a, 0)?, &p, is_max, true, false)
}

opdef!(AMAX, "amax", DIMS_KEEPDIM,
    meta: |a| { let p = amax_params("amax", a)?; Ok(meta1(&p.out_shape, tensor("amax", a, 0)?.dtype())) },
    kernel: |a| amax_kernel("amax", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::amax_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Largest values over dims (all when dim is empty); NaN propagates.");
opdef!(AMIN, "amin", DIMS_KEEPDIM,
    meta: |a| { let p = amax_params("amin", a)?; Ok(meta1(&p.out_shape, tensor("amin", a, 0)?.dtype())) },
    kernel: |a| amax_kernel("amin", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::amax_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Smallest values over dims (all when dim is empty); NaN propagates.");

fn argmax_params(op: &str, a: &[Value]) -> Result<DimParams> {
    let t = tensor(op, a, 0)?;
    dim_params(op, t, opt_int(op, a, 1)?, bool_(op, a, 2)?)
}

fn argmax_kernel(op: &str, a: &[Value], is_max: bool) -> Result<Outputs> {
    let p = argmax_params(op, a)?;
    let t = tensor(op, a, 0)?;
    if opt_int(op, a, 1)?.is_none() {
        // index into the flattened tensor: reduce everything as one row
        let flat = kernel::contiguous(t)?;
        let flat = flat.view_with_layout(op, crate::layout::Layout::contiguous(&[t.numel()]))?;
        let q = DimParams { mask: vec![true], out_shape: p.out_shape.clone() };
        return arg_reduce(op, &flat, &q, is_max, false, true);
    }
    arg_reduce(op, t, &p, is_max, false, true)
}

opdef!(ARGMAX, "argmax", OPTDIM_KEEPDIM,
    meta: |a| { let p = argmax_params("argmax", a)?; Ok(meta1(&p.out_shape, DType::I64)) },
    kernel: |a| argmax_kernel("argmax", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    doc: "Index of the largest element along dim (of the flattened tensor when dim is None); first index on ties, NaN counts as largest.");
opdef!(ARGMIN, "argmin", OPTDIM_KEEPDIM,
    meta: |a| { let p = argmax_params("argmin", a)?; Ok(meta1(&p.out_shape, DType::I64)) },
    kernel: |a| argmax_kernel("argmin", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    doc: "Index of the smallest element along dim (of the flattened tensor when dim is None); first index on ties, NaN counts as smallest.");

// ------------------------------------------------------------------------------------------
// var / std
// ------------------------------------------------------------------------------------------

struct VarParams {
    mask: Vec<bool>,
    out_shape: Vec<usize>,
    correction: f64,
}

fn var_params(op: &str, a: &[Value]) -> Result<VarParams> {
    let t = tensor(op, a, 0)?;
    let dims = opt_ints(op, a, 1)?;
    let unbiased = bool_(op, a, 2)?;
    let keepdim = bool_(op, a, 3)?;
    let correction = opt_scalar(op, a, 4)?;
    if !t.dtype().is_floating_point() {
        return Err(Error::dtype(
            op,
            format!("std and var only support floating point and complex dtypes, got {}", t.dtype()),
        ));
    }
    let mask = dim_mask(op, dims.as_deref(), t.ndim())?;
    let correction = match correction {
        Some(c) => c.to_f64(),
        None => {
            if unbiased {
                1.0
            } else {
                0.0
            }
        }
    };
    Ok(VarParams { out_shape: reduced_shape(t.shape(), &mask, keepdim), mask, correction })
}

fn var_kernel(op: &str, a: &[Value], sqrt: bool) -> Result<Outputs> {
    let p = var_params(op, a)?;
    let t = tensor(op, a, 0)?;
    let pl = plan(op, t, &p.mask, true)?;
    let dt = t.dtype();
    let vals: Vec<f64> = crate::match_dtype!(dt, E => pl.src.with_contiguous::<E, _>(op, |d| {
        let n = pl.r as f64;
        let mut mean = sum_rows(d, pl.o, pl.r, pl.i, |v, _| v.to_f64());
        mean.iter_mut().for_each(|m| *m /= n);
        let ss = sum_rows(d, pl.o, pl.r, pl.i, |v, k| { let x = v.to_f64() - mean[k]; x * x });
        let denom = (n - p.correction).max(0.0);
        ss.into_iter().map(|s| { let v = s / denom; if sqrt { v.sqrt() } else { v } }).collect()
    })?);
    Ok(smallvec![from_f64(vals, &p.out_shape, dt)?])
}

const VAR_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::opt("dim", T::OptIntList, D::None),
    ArgSpec::opt("unbiased", T::Bool, D::Bool(true)),
    ArgSpec::opt("keepdim", T::Bool, D::Bool(false)),
    ArgSpec::kw("correction", T::OptScalar, D::None),
];

opdef!(VAR, "var", VAR_SCHEMA,
    meta: |a| { let p = var_params("var", a)?; Ok(meta1(&p.out_shape, tensor("var", a, 0)?.dtype())) },
    kernel: |a| var_kernel("var", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::var_backward, saves: crate::op::Saves { inputs: 1, outputs: 0 },
    doc: "Variance over dims, dividing by N - correction (correction defaults to 1, or 0 when unbiased=False).");
opdef!(STD, "std", VAR_SCHEMA,
    meta: |a| { let p = var_params("std", a)?; Ok(meta1(&p.out_shape, tensor("std", a, 0)?.dtype())) },
    kernel: |a| var_kernel("std", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::std_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Standard deviation over dims, dividing by N - correction (correction defaults to 1, or 0 when unbiased=False).");

// ------------------------------------------------------------------------------------------
// logsumexp / norm / all / any
// ------------------------------------------------------------------------------------------

fn lse_params(a: &[Value]) -> Result<(Vec<usize>, Vec<bool>, DType)> {
    let op = "logsumexp";
    let t = tensor(op, a, 0)?;
    let dims = crate::op::args::ints(op, a, 1)?;
    let keepdim = bool_(op, a, 2)?;
    let mask = dim_mask(op, Some(&dims), t.ndim())?;
    let dt = if t.dtype().is_floating_point() { t.dtype() } else { DEFAULT_FLOAT };
    Ok((reduced_shape(t.shape(), &mask, keepdim), mask, dt))
}

opdef!(LOGSUMEXP, "logsumexp", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::IntList), ArgSpec::opt("keepdim", T::Bool, D::Bool(false))],
    meta: |a| { let (s, _, dt) = lse_params(a)?; Ok(meta1(&s, dt)) },
    kernel: |a| {
        let op = "logsumexp";
        let (shape, mask, dt) = lse_params(a)?;
        let x = kernel::cast(tensor(op, a, 0)?, dt)?;
        let pl = plan(op, &x, &mask, false)?;
        let vals: Vec<f64> = crate::match_dtype!(dt, E => pl.src.with_contiguous::<E, _>(op, |d| map_rows(d, pl.o, pl.r, |row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| { let v = v.to_f64(); if v > m || v.is_nan() { v } else { m } });
            if m.is_nan() { return f64::NAN; }
            let shift = if m.is_infinite() { 0.0 } else { m };
            lane_sum(row, &|v: E| (v.to_f64() - shift).exp()).ln() + shift
        })))?;
        Ok(smallvec![from_f64(vals, &shape, dt)?])
    },
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::logsumexp_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "log(sum(exp(x))) over dims, computed stably (integer inputs give the default float dtype).");

struct NormParams {
    p: f64,
    mask: Vec<bool>,
    out_shape: Vec<usize>,
    dtype: DType,
}

fn norm_params(a: &[Value]) -> Result<NormParams> {
    let op = "norm";
    let t = tensor(op, a, 0)?;
    let p = opt_scalar(op, a, 1)?.map(|s| s.to_f64()).unwrap_or(2.0);
    let dims = opt_ints(op, a, 2)?;
    let keepdim = bool_(op, a, 3)?;
    let dtype = opt_dtype(op, a, 4)?;
    let dt = dtype.unwrap_or(t.dtype());
    float_only(op, dt, "norm: Expected a floating point or complex tensor as input")?;
    if dtype.is_some() && !t.dtype().is_floating_point() {
        float_only(op, t.dtype(), "norm: Expected a floating point or complex tensor as input")?;
    }
    if p.is_nan() {
        return Err(Error::argument(op, "norm: p must not be NaN"));
    }
    let mask = dim_mask(op, dims.as_deref(), t.ndim())?;
    Ok(NormParams { p, out_shape: reduced_shape(t.shape(), &mask, keepdim), mask, dtype: dt })
}

opdef!(NORM, "norm",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("p", T::OptScalar, D::None), ArgSpec::opt("dim", T::OptIntList, D::None), ArgSpec::opt("keepdim", T::Bool, D::Bool(false)), ArgSpec::opt("dtype", T::OptDType, D::None)],
    meta: |a| { let p = norm_params(a)?; Ok(meta1(&p.out_shape, p.dtype)) },
    kernel: |a| {
        let op = "norm";
        let np = norm_params(a)?;
        let x = kernel::cast(tensor(op, a, 0)?, np.dtype)?;
        let p = np.p;
        let dt = np.dtype;
        let vals: Vec<f64> = if p.is_infinite() {
            let pl = plan(op, &x, &np.mask, false)?;
            crate::match_dtype!(dt, E => pl.src.with_contiguous::<E, _>(op, |d| map_rows(d, pl.o, pl.r, |row| {
                let init = if p > 0.0 { 0.0 } else { f64::INFINITY };
                row.iter().fold(init, |m: f64, &v| { let v = v.to_f64().abs(); if v.is_nan() || m.is_nan() { f64::NAN } else if p > 0.0 { m.max(v) } else { m.min(v) } })
            })))?
        } else {
            let pl = plan(op, &x, &np.mask, true)?;
            crate::match_dtype!(dt, E => pl.src.with_contiguous::<E, _>(op, |d| {
                if p == 2.0 {
                    sum_rows(d, pl.o, pl.r, pl.i, |v, _| { let v = v.to_f64(); v * v }).into_iter().map(f64::sqrt).collect()
                } else if p == 1.0 {
                    sum_rows(d, pl.o, pl.r, pl.i, |v, _| v.to_f64().abs())
                } else if p == 0.0 {
                    sum_rows(d, pl.o, pl.r, pl.i, |v, _| if v.to_f64() != 0.0 { 1.0 } else { 0.0 })
                } else {
                    sum_rows(d, pl.o, pl.r, pl.i, |v, _| v.to_f64().abs().powf(p)).into_iter().map(|s| s.powf(1.0 / p)).collect()
                }
            }))?
        };
        Ok(smallvec![from_f64(vals, &np.out_shape, dt)?])
    },
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::norm_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Vector p-norm over dims (all when dim is None): p = 2 (default; equals 'fro'), 1, inf, -inf, 0 (count of non-zeros) or any other p.");

fn allany_params(op: &str, a: &[Value]) -> Result<(Vec<usize>, Vec<bool>, DType)> {
    let t = tensor(op, a, 0)?;
    let dims = opt_ints(op, a, 1)?;
    let keepdim = bool_(op, a, 2)?;
    let mask = dim_mask(op, dims.as_deref(), t.ndim())?;
    let dt = if t.dtype() == DType::U8 { DType::U8 } else { DType::Bool };
    Ok((reduced_shape(t.shape(), &mask, keepdim), mask, dt))
}

fn allany_kernel(op: &str, a: &[Value], is_all: bool) -> Result<Outputs> {
    let (shape, mask, odt) = allany_params(op, a)?;
    let t = tensor(op, a, 0)?;
    let pl = plan(op, t, &mask, false)?;
    let dt = t.dtype();
    let vals: Vec<bool> = crate::match_dtype!(dt, E => pl.src.with_contiguous::<E, _>(op, |d| map_rows(d, pl.o, pl.r, |row| {
        let z = E::default();
        if is_all { row.iter().all(|&v| v != z) } else { row.iter().any(|&v| v != z) }
    }))?);
    let out = if odt == DType::U8 {
        Tensor::from_vec(vals.into_iter().map(u8::from).collect::<Vec<u8>>(), &shape)?
    } else {
        Tensor::from_vec(vals, &shape)?
    };
    Ok(smallvec![out])
}

const ALLANY_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::opt("dim", T::OptIntList, D::None),
    ArgSpec::opt("keepdim", T::Bool, D::Bool(false)),
];

opdef!(ALL, "all", ALLANY_SCHEMA,
    meta: |a| { let (s, _, dt) = allany_params("all", a)?; Ok(meta1(&s, dt)) },
    kernel: |a| allany_kernel("all", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    doc: "True when every element over dims is non-zero (bool result; uint8 for uint8 input).");
opdef!(ANY, "any", ALLANY_SCHEMA,
    meta: |a| { let (s, _, dt) = allany_params("any", a)?; Ok(meta1(&s, dt)) },
    kernel: |a| allany_kernel("any", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    doc: "True when some element over dims is non-zero (bool result; uint8 for uint8 input).");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &SUM,
    &MEAN,
    &PROD,
    &SUM_TO_SIZE,
    &MAX,
    &MIN,
    &MAX_DIM,
    &MIN_DIM,
    &AMAX,
    &AMIN,
    &ARGMAX,
    &ARGMIN,
    &VAR,
    &STD,
    &LOGSUMEXP,
    &NORM,
    &ALL,
    &ANY,
];

// ------------------------------------------------------------------------------------------
// Public API
// ------------------------------------------------------------------------------------------

fn dims_value(dims: Option<&[i64]>) -> Value {
    match dims {
        Some(d) => Value::Ints(d.to_vec()),
        None => Value::None,
    }
}

/// `torch.sum(input, dim, keepdim, dtype=)`; `dim = None` reduces everything.
pub fn sum(input: &Tensor, dim: Option<&[i64]>, keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    call1(&SUM, CallKind::Function, &[input.into(), dims_value(dim), keepdim.into(), dtype.into()])
}
/// `torch.mean(input, dim, keepdim, dtype=)`.
pub fn mean(input: &Tensor, dim: Option<&[i64]>, keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    call1(&MEAN, CallKind::Function, &[input.into(), dims_value(dim), keepdim.into(), dtype.into()])
}
/// `torch.prod(input, dim, keepdim, dtype=)`.
pub fn prod(input: &Tensor, dim: Option<i64>, keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    call1(&PROD, CallKind::Function, &[input.into(), dim.into(), keepdim.into(), dtype.into()])
}
/// `torch.max(input)`: the largest element.
pub fn max(input: &Tensor) -> Result<Tensor> {
    call1(&MAX, CallKind::Function, &[input.into()])
}
/// `torch.min(input)`: the smallest element.
pub fn min(input: &Tensor) -> Result<Tensor> {
    call1(&MIN, CallKind::Function, &[input.into()])
}
/// `torch.max(input, dim, keepdim)`: `(values, indices)` (op `max.dim`).
pub fn max_dim(input: &Tensor, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    call2(&MAX_DIM, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.min(input, dim, keepdim)`: `(values, indices)` (op `min.dim`).
pub fn min_dim(input: &Tensor, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    call2(&MIN_DIM, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.amax(input, dim, keepdim)`.
pub fn amax(input: &Tensor, dim: &[i64], keepdim: bool) -> Result<Tensor> {
    call1(&AMAX, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.amin(input, dim, keepdim)`.
pub fn amin(input: &Tensor, dim: &[i64], keepdim: bool) -> Result<Tensor> {
    call1(&AMIN, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.argmax(input, dim, keepdim)`.
pub fn argmax(input: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    call1(&ARGMAX, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.argmin(input, dim, keepdim)`.
pub fn argmin(input: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    call1(&ARGMIN, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.var(input, dim, correction=, keepdim=)`.
pub fn var(input: &Tensor, dim: Option<&[i64]>, correction: f64, keepdim: bool) -> Result<Tensor> {
    call1(&VAR, CallKind::Function, &[input.into(), dims_value(dim), true.into(), keepdim.into(), correction.into()])
}
/// `torch.std(input, dim, correction=, keepdim=)`.
pub fn std(input: &Tensor, dim: Option<&[i64]>, correction: f64, keepdim: bool) -> Result<Tensor> {
    call1(&STD, CallKind::Function, &[input.into(), dims_value(dim), true.into(), keepdim.into(), correction.into()])
}
/// `torch.logsumexp(input, dim, keepdim)`.
pub fn logsumexp(input: &Tensor, dim: &[i64], keepdim: bool) -> Result<Tensor> {
    call1(&LOGSUMEXP, CallKind::Function, &[input.into(), dim.into(), keepdim.into()])
}
/// `torch.norm(input, p, dim, keepdim)` (vector norms; `p = 2.0` is also the Frobenius norm).
pub fn norm(input: &Tensor, p: f64, dim: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
    call1(&NORM, CallKind::Function, &[input.into(), p.into(), dims_value(dim), keepdim.into(), Value::None])
}
/// `torch.all(input, dim, keepdim)`.
pub fn all(input: &Tensor, dim: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
    call1(&ALL, CallKind::Function, &[input.into(), dims_value(dim), keepdim.into()])
}
/// `torch.any(input, dim, keepdim)`.
pub fn any(input: &Tensor, dim: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
    call1(&ANY, CallKind::Function, &[input.into(), dims_value(dim), keepdim.into()])
}

impl Tensor {
    /// `x.sum()`: the sum of all elements (int64 for integer/bool inputs).
    pub fn sum(&self) -> Result<Tensor> {
        call1(&SUM, CallKind::Method, &[self.into(), Value::None, false.into(), Value::None])
    }
    /// `x.sum(dim, keepdim)`.
    pub fn sum_dim(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&SUM, CallKind::Method, &[self.into(), dim.into(), keepdim.into(), Value::None])
    }
    /// `x.sum(dim, keepdim, dtype=)` with every argument.
    pub fn sum_dtype(&self, dim: Option<&[i64]>, keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
        call1(&SUM, CallKind::Method, &[self.into(), dims_value(dim), keepdim.into(), dtype.into()])
    }
    /// `x.sum_to_size(size)`: sums broadcast dims down to `size`.
    pub fn sum_to_size(&self, size: &[i64]) -> Result<Tensor> {
        call1(&SUM_TO_SIZE, CallKind::Method, &[self.into(), size.into()])
    }
    /// `x.mean()`.
    pub fn mean(&self) -> Result<Tensor> {
        call1(&MEAN, CallKind::Method, &[self.into(), Value::None, false.into(), Value::None])
    }
    /// `x.mean(dim, keepdim)`.
    pub fn mean_dim(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&MEAN, CallKind::Method, &[self.into(), dim.into(), keepdim.into(), Value::None])
    }
    /// `x.prod()`.
    pub fn prod(&self) -> Result<Tensor> {
        call1(&PROD, CallKind::Method, &[self.into(), Value::None, false.into(), Value::None])
    }
    /// `x.prod(dim, keepdim)`.
    pub fn prod_dim(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        call1(&PROD, CallKind::Method, &[self.into(), dim.into(), keepdim.into(), Value::None])
    }
    /// `x.max()`: the largest element (0-dim).
    pub fn max(&self) -> Result<Tensor> {
        call1(&MAX, CallKind::Method, &[self.into()])
    }
    /// `x.min()`: the smallest element (0-dim).
    pub fn min(&self) -> Result<Tensor> {
        call1(&MIN, CallKind::Method, &[self.into()])
    }
    /// `x.max(dim, keepdim)`: `(values, indices)`.
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        call2(&MAX_DIM, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.min(dim, keepdim)`: `(values, indices)`.
    pub fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        call2(&MIN_DIM, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.amax(dim, keepdim)`.
    pub fn amax(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&AMAX, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.amin(dim, keepdim)`.
    pub fn amin(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&AMIN, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.argmax(dim, keepdim)`.
    pub fn argmax(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        call1(&ARGMAX, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.argmin(dim, keepdim)`.
    pub fn argmin(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        call1(&ARGMIN, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.var(dim, correction=, keepdim=)`.
    pub fn var(&self, dim: Option<&[i64]>, correction: f64, keepdim: bool) -> Result<Tensor> {
        call1(&VAR, CallKind::Method, &[self.into(), dims_value(dim), true.into(), keepdim.into(), correction.into()])
    }
    /// `x.std(dim, correction=, keepdim=)`.
    pub fn std(&self, dim: Option<&[i64]>, correction: f64, keepdim: bool) -> Result<Tensor> {
        call1(&STD, CallKind::Method, &[self.into(), dims_value(dim), true.into(), keepdim.into(), correction.into()])
    }
    /// `x.logsumexp(dim, keepdim)`.
    pub fn logsumexp(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&LOGSUMEXP, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.norm(p, dim, keepdim)`.
    pub fn norm(&self, p: f64, dim: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        call1(&NORM, CallKind::Method, &[self.into(), p.into(), dims_value(dim), keepdim.into(), Value::None])
    }
    /// `x.all()`.
    pub fn all(&self) -> Result<Tensor> {
        call1(&ALL, CallKind::Method, &[self.into(), Value::None, false.into()])
    }
    /// `x.any()`.
    pub fn any(&self) -> Result<Tensor> {
        call1(&ANY, CallKind::Method, &[self.into(), Value::None, false.into()])
    }
    /// `x.all(dim, keepdim)`.
    pub fn all_dim(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&ALL, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
    /// `x.any(dim, keepdim)`.
    pub fn any_dim(&self, dim: &[i64], keepdim: bool) -> Result<Tensor> {
        call1(&ANY, CallKind::Method, &[self.into(), dim.into(), keepdim.into()])
    }
}
