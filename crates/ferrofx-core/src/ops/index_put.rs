//! Advanced indexing: `index(input, indices)` (PyTorch's `x[idx0, idx1]`, `x[mask]`,
//! `x[:, idx]`), `index_put(input, indices, values, accumulate)` and the in-place `index_put_`
//! (`x[idx0, idx1] = v`, `x[mask] = v`, `x[:, idx] = v`).
//!
//! PyTorch's `indices` is a `Tensor?[]`: one entry per indexed dim, `None` for a full slice.
//! A registry argument cannot hold a list with holes, so the ops take the tensors as a
//! `Tensor[]` and, when the tuple has `None` entries, their tuple positions as the keyword
//! `positions` (`x[:, idx]` is `indices=[idx], positions=[1]`); the Rust methods take PyTorch's
//! `&[Option<&Tensor>]` and build both.
//!
//! Semantics (PyTorch's `index` / `index_put_`):
//! * int64 (or int32) indices address one dim each; negative values wrap once; a value out of
//!   range is an error naming the value, the dim and its size;
//! * a bool (or uint8) mask addresses as many dims as it has, whose sizes it must match, and
//!   stands for the coordinates of its `true` elements (`nonzero`);
//! * the index tensors broadcast together to the *index shape*; when the indexed dims are
//!   adjacent the index shape replaces them in place, otherwise it goes first (NumPy's rule);
//! * `index_put` broadcasts `values` to the indexed shape and writes it in row-major order,
//!   so with duplicate positions the last write wins (PyTorch on CPU); `accumulate=true` adds
//!   instead (sums duplicates; `or` for bool).
//!
//! Differentiable: `index` → IndexBackward0 (the gradient index-put with `accumulate` into
//! zeros), `index_put` → IndexPutBackward0 (`input` gets the gradient with the written positions
//! zeroed unless `accumulate`, `values` the gradient indexed and summed back to its shape).
//! The in-place form on a view of a tensor with history rebases the base with CopySlices.
//!
//! A bool mask makes the output size of `index` depend on the data, so `index` with a mask
//! cannot be shape-propagated (its meta function says so, as `masked_select`'s).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{contiguous_strides, Layout, StridedIter};
use crate::memory;
use crate::op::args::{bool_, opt_ints, tensor, tensors};
use crate::op::{
    cost_memory, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs, Saves,
};
use crate::ops::inplace::{inplace_generic, inplace_meta};
use crate::ops::num::torch_name;
use crate::ops::unary::call1;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

const INDEX_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("indices", T::TensorList),
    ArgSpec::kw("positions", T::OptIntList, D::None),
];

const PUT_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("indices", T::TensorList),
    ArgSpec::req("values", T::Tensor),
    ArgSpec::opt("accumulate", T::Bool, D::Bool(false)),
    ArgSpec::kw("positions", T::OptIntList, D::None),
];

/// One index tensor of PyTorch's tuple and the first input dim it addresses.
struct Slot<'a> {
    t: &'a Tensor,
    dim: usize,
    mask: bool,
}

fn fmt_shape(s: &[usize]) -> String {
    format!("{s:?}")
}

/// Places the index tensors on the input's dims and checks what needs no data: positions,
/// index dtypes, the number of indexed dims, mask shapes.
fn slots<'a>(op: &str, x: &Tensor, indices: &'a [Tensor], positions: Option<&[i64]>) -> Result<Vec<Slot<'a>>> {
    if indices.is_empty() {
        return Err(Error::index(
            op,
            "at least one index must be provided (an index of only None is a plain slice: use the tensor, or narrow/slice)",
        ));
    }
    if let Some(p) = positions {
        if p.len() != indices.len() {
            return Err(Error::argument(
                op,
                format!(
                    "positions has {} entries but indices has {} tensors: give the position in PyTorch's index tuple of each index tensor",
                    p.len(),
                    indices.len()
                ),
            ));
        }
        if p.iter().any(|&v| v < 0) || p.windows(2).any(|w| w[1] <= w[0]) {
            return Err(Error::argument(
                op,
                format!("positions must be non-negative and strictly increasing (the tuple position of each index tensor), got {p:?}"),
            ));
        }
    }
    let (mut out, mut dim, mut cursor) = (Vec::with_capacity(indices.len()), 0usize, 0usize);
    for (i, t) in indices.iter().enumerate() {
        let pos = positions.map(|p| p[i] as usize).unwrap_or(i);
        // Every `None` entry before this tensor is a full slice of one dim.
        dim = dim.saturating_add(pos - cursor);
        cursor = pos + 1;
        let mask = match t.dtype() {
            DType::I64 | DType::I32 => false,
            DType::Bool | DType::U8 => true,
            d => {
                return Err(Error::index(
                    op,
                    format!(
                        "tensors used as indices must be long, int, byte or bool tensors (index {i} is {}); convert it with .to_dtype(DType::I64)",
                        torch_name(d)
                    ),
                ))
            }
        };
        if mask && t.ndim() == 0 {
            return Err(Error::index(
                op,
                format!("index {i} is a 0-dim bool mask, which ferrofx does not support: use unsqueeze(0) (for true) instead"),
            ));
        }
        out.push(Slot { t, dim, mask });
        dim = dim.saturating_add(if mask { t.ndim() } else { 1 });
    }
    if dim > x.ndim() {
        return Err(Error::index(op, format!("too many indices for tensor of dimension {} (got {dim})", x.ndim())));
    }
    let xs = x.shape();
    for s in out.iter().filter(|s| s.mask) {
        let ms = s.t.shape();
        for (j, &size) in ms.iter().enumerate() {
            if size != xs[s.dim + j] {
                return Err(Error::index(
                    op,
                    format!(
                        "The shape of the mask {} at index {j} does not match the shape of the indexed tensor {} at index {}",
                        fmt_shape(ms),
                        fmt_shape(xs),
                        s.dim + j
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// Broadcasts the index shapes together (PyTorch's message on mismatch).
fn broadcast_all(op: &str, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let n = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut b = vec![1usize; n];
    for s in shapes {
        for (j, &d) in s.iter().enumerate() {
            let k = n - s.len() + j;
            if b[k] == 1 {
                b[k] = d;
            } else if d != 1 && d != b[k] {
                let all: Vec<String> = shapes.iter().map(|s| fmt_shape(s)).collect();
                return Err(Error::index(
                    op,
                    format!(
                        "shape mismatch: indexing tensors could not be broadcast together with shapes {}",
                        all.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(b)
}

/// Where the index shape goes: the input dims that are not indexed before it (`outer`, only
/// when the indexed dims are adjacent) and after it (`inner`).
struct Arrangement {
    outer: Vec<usize>,
    inner: Vec<usize>,
}

fn arrange(ndim: usize, dims: &[usize]) -> Arrangement {
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let rest: Vec<usize> = (0..ndim).filter(|d| !dims.contains(d)).collect();
    match (adjacent, dims.first()) {
        (true, Some(&first)) => Arrangement {
            outer: rest.iter().copied().filter(|&d| d < first).collect(),
            inner: rest.into_iter().filter(|&d| d > first).collect(),
        },
        _ => Arrangement { outer: vec![], inner: rest },
    }
}

fn result_shape(xs: &[usize], a: &Arrangement, bshape: &[usize]) -> Vec<usize> {
    let mut r: Vec<usize> = a.outer.iter().map(|&d| xs[d]).collect();
    r.extend_from_slice(bshape);
    r.extend(a.inner.iter().map(|&d| xs[d]));
    r
}

/// The indexed shape when it does not depend on data (no mask), with the dims indexed.
fn static_result(op: &str, x: &Tensor, slots: &[Slot]) -> Result<Option<Vec<usize>>> {
    if slots.iter().any(|s| s.mask) {
        return Ok(None);
    }
    let shapes: Vec<&[usize]> = slots.iter().map(|s| s.t.shape()).collect();
    let b = broadcast_all(op, &shapes)?;
    let dims: Vec<usize> = slots.iter().map(|s| s.dim).collect();
    Ok(Some(result_shape(x.shape(), &arrange(x.ndim(), &dims), &b)))
}

/// `values` broadcast to the indexed shape `r` (one direction only, PyTorch's message).
fn check_values(op: &str, v: &[usize], r: &[usize]) -> Result<()> {
    let ok = v.len() <= r.len() && v.iter().zip(&r[r.len() - v.len()..]).all(|(&a, &b)| a == 1 || a == b);
    if ok {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!(
                "shape mismatch: value tensor of shape {} cannot be broadcast to indexing result of shape {}",
                fmt_shape(v),
                fmt_shape(r)
            ),
        ))
    }
}

/// The element offsets an index addresses, for input strides `strides`: per index position
/// (row-major over the broadcast index shape) the sum of `index * stride`, and the offsets of
/// the non-indexed dims before and after it.
struct Plan {
    result: Vec<usize>,
    outer: Vec<usize>,
    boff: Vec<usize>,
    inner: Vec<usize>,
}

fn plan(op: &str, x: &Tensor, slots: &[Slot], strides: &[usize]) -> Result<Plan> {
    let xs = x.shape();
    // Each addressed dim with its index values and their shape (masks become one coordinate
    // list per dim they cover).
    let mut cols: Vec<(usize, Vec<i64>, Vec<usize>)> = Vec::new();
    for s in slots {
        if s.mask {
            let m: Vec<bool> = match s.t.dtype() {
                DType::U8 => s.t.to_vec::<u8>()?.into_iter().map(|v| v != 0).collect(),
                _ => s.t.to_vec::<bool>()?,
            };
            let ms = s.t.shape();
            let nnz = m.iter().filter(|&&b| b).count();
            let k = ms.len();
            let mut cs: Vec<Vec<i64>> = (0..k).map(|_| memory::try_vec(op, nnz, 0i64)).collect::<Result<_>>()?;
            let st = contiguous_strides(ms);
            for (n, p) in m.iter().enumerate().filter(|(_, &b)| b).map(|(p, _)| p).enumerate() {
                for (j, c) in cs.iter_mut().enumerate() {
                    c[n] = ((p / st[j]) % ms[j]) as i64;
                }
            }
            for (j, c) in cs.into_iter().enumerate() {
                cols.push((s.dim + j, c, vec![nnz]));
            }
        } else {
            let v: Vec<i64> = match s.t.dtype() {
                DType::I32 => s.t.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
                _ => s.t.to_vec::<i64>()?,
            };
            let size = xs[s.dim];
            let mut w = v;
            for e in w.iter_mut() {
                let orig = *e;
                if orig < -(size as i64) || orig >= size as i64 {
                    return Err(Error::index(
                        op,
                        format!(
                            "index {orig} is out of bounds for dimension {} with size {size} (valid indices are {}..{size}, negative ones count from the end)",
                            s.dim,
                            -(size as i64)
                        ),
                    ));
                }
                if orig < 0 {
                    *e = orig + size as i64;
                }
            }
            cols.push((s.dim, w, s.t.shape().to_vec()));
        }
    }
    let shapes: Vec<&[usize]> = cols.iter().map(|c| c.2.as_slice()).collect();
    let bshape = broadcast_all(op, &shapes)?;
    let bn = memory::check_alloc(op, &bshape, DType::I64)?;
    let mut boff = memory::try_vec(op, bn, 0usize)?;
    for (d, v, shape) in &cols {
        let l = Layout::from_parts(shape.as_slice().into(), contiguous_strides(shape), 0).broadcast_to(op, &bshape)?;
        for (o, p) in boff.iter_mut().zip(StridedIter::new(&l)) {
            *o += v[p] as usize * strides[*d];
        }
    }
    let dims: Vec<usize> = cols.iter().map(|c| c.0).collect();
    let a = arrange(xs.len(), &dims);
    let result = result_shape(xs, &a, &bshape);
    memory::check_alloc(op, &result, x.dtype())?;
    let offsets = |ds: &[usize]| -> Result<Vec<usize>> {
        let sh: Vec<usize> = ds.iter().map(|&d| xs[d]).collect();
        let st: Vec<usize> = ds.iter().map(|&d| strides[d]).collect();
        let l = Layout::from_parts(sh.as_slice().into(), st.as_slice().into(), 0);
        let n = memory::check_alloc(op, &sh, DType::I64)?;
        let mut v = memory::try_vec(op, n, 0usize)?;
        v.clear();
        v.extend(StridedIter::new(&l));
        Ok(v)
    };
    Ok(Plan { result, outer: offsets(&a.outer)?, boff, inner: offsets(&a.inner)? })
}

/// Reads the bound arguments: input, indices, tuple positions.
fn read<'a>(op: &str, args: &'a [Value], pos_arg: usize) -> Result<(&'a Tensor, Vec<Slot<'a>>)> {
    let x = tensor(op, args, 0)?;
    let indices = tensors(op, args, 1)?;
    let positions = opt_ints(op, args, pos_arg)?;
    let s = slots(op, x, indices, positions.as_deref())?;
    Ok((x, s))
}

fn index_meta(op: &str, args: &[Value]) -> Result<MetaOutputs> {
    let (x, s) = read(op, args, 2)?;
    match static_result(op, x, &s)? {
        Some(r) => Ok(smallvec![TensorMeta::contiguous(&r, x.dtype())]),
        None => Err(Error::trace(
            op,
            "the output size of index with a bool mask depends on the mask's values, so it cannot be inferred from shapes",
        )),
    }
}

fn index_kernel(op: &str, args: &[Value]) -> Result<Outputs> {
    let (x, s) = read(op, args, 2)?;
    let dt = x.dtype();
    let out = crate::match_dtype!(dt, E => x.with_data::<E, _>(op, |data, l| -> Result<Tensor> {
        let p = plan(op, x, &s, l.strides())?;
        let mut out: Vec<E> = memory::alloc_uninit(op, &p.result)?;
        let base = l.offset();
        for &o in &p.outer {
            for &b in &p.boff {
                for &i in &p.inner {
                    out.push(data[base + o + b + i]);
                }
            }
        }
        Tensor::from_vec(out, &p.result)
    })??);
    Ok(smallvec![out])
}

fn put_meta(op: &str, args: &[Value]) -> Result<MetaOutputs> {
    let (x, s) = read(op, args, 4)?;
    let v = tensor(op, args, 2)?;
    check_put_dtype(op, x, v)?;
    if let Some(r) = static_result(op, x, &s)? {
        check_values(op, v.shape(), &r)?;
    }
    Ok(smallvec![TensorMeta::contiguous(x.shape(), x.dtype())])
}

fn check_put_dtype(op: &str, x: &Tensor, v: &Tensor) -> Result<()> {
    if x.dtype() != v.dtype() {
        return Err(Error::dtype(
            op,
            format!(
                "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source.",
                torch_name(x.dtype()),
                torch_name(v.dtype())
            ),
        ));
    }
    Ok(())
}

#[inline]
fn add<E: Element>(a: E, b: E) -> E {
    match E::DTYPE {
        DType::Bool => E::from_i64((a.to_i64() != 0 || b.to_i64() != 0) as i64),
        d if d.is_floating_point() => E::from_f64(a.to_f64() + b.to_f64()),
        _ => E::from_i64(a.to_i64().wrapping_add(b.to_i64())),
    }
}

fn put_kernel(op: &str, args: &[Value]) -> Result<Outputs> {
    let (x, s) = read(op, args, 4)?;
    let v = tensor(op, args, 2)?;
    let accumulate = bool_(op, args, 3)?;
    check_put_dtype(op, x, v)?;
    let xs = x.shape().to_vec();
    let st = contiguous_strides(&xs);
    let p = plan(op, x, &s, &st)?;
    check_values(op, v.shape(), &p.result)?;
    let dt = x.dtype();
    let out = crate::match_dtype!(dt, E => {
        let mut out: Vec<E> = x.to_vec::<E>()?;
        v.with_data::<E, _>(op, |vd, vl| -> Result<()> {
            let bl = vl.broadcast_to(op, &p.result)?;
            let mut vi = StridedIter::new(&bl);
            for &o in &p.outer {
                for &b in &p.boff {
                    for &i in &p.inner {
                        let k = o + b + i;
                        let val = vd[vi.next().unwrap_or(0)];
                        out[k] = if accumulate { add(out[k], val) } else { val };
                    }
                }
            }
            Ok(())
        })??;
        Tensor::from_vec(out, &xs)?
    });
    Ok(smallvec![out])
}

/// `index(input, indices, *, positions=None)`: PyTorch's `x[idx0, idx1]` / `x[mask]`.
pub static INDEX: OpDef = OpDef {
    name: "index",
    schema: INDEX_SCHEMA,
    meta: |a| index_meta("index", a),
    kernel: |a| index_kernel("index", a),
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(crate::autograd::formulas::index::index_backward),
    saves: Saves::inputs(0b10),
    doc: "Advanced indexing with a tuple of index tensors (int64 positions or bool masks; `positions` places them in PyTorch's `Tensor?[]` tuple).",
};

/// `index_put(input, indices, values, accumulate=False, *, positions=None)`.
pub static INDEX_PUT: OpDef = OpDef {
    name: "index_put",
    schema: PUT_SCHEMA,
    meta: |a| put_meta("index_put", a),
    kernel: |a| put_kernel("index_put", a),
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(crate::autograd::formulas::index::index_put_backward),
    saves: Saves::inputs(0b10),
    doc: "A copy of input with `values` written (or added, `accumulate`) at the positions an advanced index addresses.",
};

/// `index_put_(indices, values, accumulate=False, *, positions=None)` in place.
pub static INDEX_PUT_: OpDef = OpDef {
    name: "index_put_",
    schema: PUT_SCHEMA,
    meta: |a| inplace_meta("index_put_", &INDEX_PUT, a),
    kernel: |a| Ok(smallvec![inplace_generic("index_put_", &INDEX_PUT, a)?]),
    cost: cost_memory,
    effect: Effect::Mutates(0),
    category: Category::Indexing,
    backward: Some(crate::autograd::formulas::index::index_put_backward),
    saves: Saves::inputs(0b10),
    doc: "In-place form of `index_put` (PyTorch's `x[idx] = v`).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&INDEX, &INDEX_PUT, &INDEX_PUT_];

/// PyTorch's `Tensor?[]` index tuple as the registry's arguments: the tensors and, when the
/// tuple has holes, their positions (trailing `None`s are full slices and need no entry).
pub fn index_args(indices: &[Option<&Tensor>]) -> (Value, Value) {
    let ts: Vec<Tensor> = indices.iter().flatten().map(|t| (*t).clone()).collect();
    let pos: Vec<i64> = indices.iter().enumerate().filter(|(_, t)| t.is_some()).map(|(i, _)| i as i64).collect();
    let dense = pos.iter().enumerate().all(|(i, &p)| p == i as i64);
    (Value::Tensors(ts), if dense { Value::None } else { Value::Ints(pos) })
}

impl Tensor {
    /// `self[indices]` with advanced indexing (PyTorch's `x[idx0, idx1]`, `x[mask]`,
    /// `x[:, idx]`): each entry is an int64 index tensor, a bool mask or `None` (a full slice).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[3, 4]).unwrap();
    /// let rows = Tensor::from_vec(vec![2i64, 0], &[2]).unwrap();
    /// let cols = Tensor::from_vec(vec![1i64, -1], &[2]).unwrap();
    /// assert_eq!(x.index(&[Some(&rows), Some(&cols)]).unwrap().to_vec::<f32>().unwrap(), vec![9.0, 3.0]);
    /// assert_eq!(x.index(&[None, Some(&cols)]).unwrap().shape(), &[3, 2]);
    /// ```
    pub fn index(&self, indices: &[Option<&Tensor>]) -> Result<Tensor> {
        let (ts, pos) = index_args(indices);
        call1(&INDEX, CallKind::Method, &[self.into(), ts, pos])
    }
    /// A copy of `self` with `self[indices] = values` (`accumulate`: `+=`, summing duplicates).
    pub fn index_put(&self, indices: &[Option<&Tensor>], values: &Tensor, accumulate: bool) -> Result<Tensor> {
        let (ts, pos) = index_args(indices);
        call1(&INDEX_PUT, CallKind::Method, &[self.into(), ts, values.into(), Value::Bool(accumulate), pos])
    }
    /// `self[indices] = values` in place (returns `self`); `values` broadcasts to the indexed
    /// shape; with duplicate positions the last write wins, or they are summed (`accumulate`).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32; 6], &[2, 3]).unwrap();
    /// let mask = Tensor::from_vec(vec![true, false, true, false, false, true], &[2, 3]).unwrap();
    /// x.index_put_(&[Some(&mask)], &Tensor::from_vec(vec![7.0f32], &[]).unwrap(), false).unwrap();
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![7.0, 0.0, 7.0, 0.0, 0.0, 7.0]);
    /// ```
    pub fn index_put_(&self, indices: &[Option<&Tensor>], values: &Tensor, accumulate: bool) -> Result<Tensor> {
        let (ts, pos) = index_args(indices);
        call1(&INDEX_PUT_, CallKind::Method, &[self.into(), ts, values.into(), Value::Bool(accumulate), pos])
    }
}
