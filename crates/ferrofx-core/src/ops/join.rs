//! Joining and splitting: `cat` (with PyTorch's dtype promotion across the list), `stack`,
//! `split` (one size), `split_with_sizes` (a list of sizes), `chunk` and `unbind`.
//!
//! `split`, `split_with_sizes`, `chunk` and `unbind` return views sharing the input's storage,
//! as in PyTorch; `cat` and `stack` copy into a new contiguous tensor.

use crate::dtype::{promote_types, DType};
use crate::error::{Error, Result};
use crate::layout::{wrap_dim, Layout};
use crate::op::args::{int, ints, tensor, tensors};
use crate::op::{
    cost_free, cost_memory, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef,
    Outputs,
};
use crate::ops::kernel;
use crate::ops::reduce::{call1, check_alloc, meta1, opdef};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;

struct CatPlan {
    /// Indices of the tensors that take part (legacy empty 1-D tensors are skipped).
    used: Vec<usize>,
    dim: usize,
    shape: Vec<usize>,
    dtype: DType,
}

fn cat_plan(op: &str, ts: &[Tensor], dim: i64) -> Result<CatPlan> {
    if ts.is_empty() {
        return Err(Error::argument(op, format!("{op}(): expected a non-empty list of Tensors")));
    }
    let dtype = ts.iter().skip(1).fold(ts[0].dtype(), |d, t| promote_types(d, t.dtype()));
    for (i, t) in ts.iter().enumerate() {
        if t.ndim() == 0 {
            return Err(Error::shape(
                op,
                format!("zero-dimensional tensor (at position {i}) cannot be concatenated; unsqueeze it or use stack"),
            ));
        }
    }
    // PyTorch skips 1-D empty tensors when other tensors have another rank (legacy behaviour).
    let legacy_empty = |t: &Tensor| t.shape() == [0];
    let used: Vec<usize> = (0..ts.len()).filter(|&i| !legacy_empty(&ts[i])).collect();
    let Some(&first) = used.first() else {
        let d = wrap_dim(op, dim, 1)?;
        let _ = d;
        return Ok(CatPlan { used: vec![], dim: 0, shape: vec![0], dtype });
    };
    let refs = ts[first].shape().to_vec();
    let d = wrap_dim(op, dim, refs.len())?;
    let mut shape = refs.clone();
    shape[d] = 0;
    for &i in &used {
        let s = ts[i].shape();
        if s.len() != refs.len() {
            return Err(Error::shape(
                op,
                format!("Tensors must have same number of dimensions: got {} and {}", refs.len(), s.len()),
            ));
        }
        for k in 0..s.len() {
            if k != d && s[k] != refs[k] {
                return Err(Error::shape(
                    op,
                    format!(
                        "Sizes of tensors must match except in dimension {d}. Expected size {} but got size {} for tensor number {i} in the list.",
                        refs[k], s[k]
                    ),
                ));
            }
        }
        shape[d] = shape[d].checked_add(s[d]).ok_or_else(|| {
            Error::limit(
                op,
                format!("the concatenated size along dimension {d} overflows (tensor number {i} has {})", s[d]),
            )
        })?;
    }
    check_alloc(op, &shape, dtype)?;
    Ok(CatPlan { used, dim: d, shape, dtype })
}

/// Concatenates `ts` (already validated by `p`) into a new contiguous tensor.
fn cat_impl(op: &str, ts: &[Tensor], p: &CatPlan) -> Result<Tensor> {
    let parts: Vec<Tensor> =
        p.used.iter().map(|&i| kernel::contiguous(&kernel::cast(&ts[i], p.dtype)?)).collect::<Result<_>>()?;
    let outer: usize = p.shape[..p.dim].iter().product();
    let inner: usize = p.shape[p.dim + 1..].iter().product();
    let widths: Vec<usize> = parts.iter().map(|t| t.shape()[p.dim] * inner).collect();
    let row: usize = widths.iter().sum();
    let n = outer * row;
    let dt = p.dtype;
    crate::match_dtype!(dt, E => {
        let mut out = vec![E::default(); n];
        // read every part once (read locks held for the copy)
        let guards: Vec<_> = parts.iter().map(|t| t.concrete(op).map(|(s, l)| (s.read(), l.offset()))).collect::<Result<_>>()?;
        let srcs: Vec<&[E]> = guards.iter().map(|(g, off)| g.as_slice::<E>().map(|s| &s[*off..])).collect::<Option<_>>()
            .ok_or_else(|| Error::dtype(op, "internal dtype mismatch"))?;
        let copy_row = |(o, dst): (usize, &mut [E])| {
            let mut at = 0;
            for (src, &w) in srcs.iter().zip(&widths) {
                dst[at..at + w].copy_from_slice(&src[o * w..(o + 1) * w]);
                at += w;
            }
        };
        if row > 0 {
            if n >= kernel::PAR_THRESHOLD && outer > 1 {
                out.par_chunks_mut(row).enumerate().with_min_len((kernel::PAR_CHUNK / row).max(1)).for_each(copy_row);
            } else {
                out.chunks_mut(row).enumerate().for_each(copy_row);
            }
        }
        drop(srcs);
        drop(guards);
        Tensor::from_vec(out, &p.shape)
    })
}

opdef!(CAT, "cat", &[ArgSpec::req("tensors", T::TensorList), ArgSpec::opt("dim", T::Int, D::Int(0))],
    meta: |a| {
        let p = cat_plan("cat", tensors("cat", a, 0)?, int("cat", a, 1)?)?;
        Ok(meta1(&p.shape, p.dtype))
    },
    kernel: |a| {
        let ts = tensors("cat", a, 0)?;
        let p = cat_plan("cat", ts, int("cat", a, 1)?)?;
        Ok(smallvec![cat_impl("cat", ts, &p)?])
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::cat_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Concatenates tensors along an existing dim (dtypes promote as in PyTorch).");

fn stack_check(op: &str, ts: &[Tensor], dim: i64) -> Result<usize> {
    if ts.is_empty() {
        return Err(Error::argument(op, "stack expects a non-empty TensorList"));
    }
    let s0 = ts[0].shape();
    for (i, t) in ts.iter().enumerate().skip(1) {
        if t.shape() != s0 {
            return Err(Error::shape(
                op,
                format!(
                    "stack expects each tensor to be equal size, but got {s0:?} at entry 0 and {:?} at entry {i}",
                    t.shape()
                ),
            ));
        }
    }
    wrap_dim(op, dim, s0.len() + 1)
}

opdef!(STACK, "stack", &[ArgSpec::req("tensors", T::TensorList), ArgSpec::opt("dim", T::Int, D::Int(0))],
    meta: |a| {
        let ts = tensors("stack", a, 0)?;
        let d = stack_check("stack", ts, int("stack", a, 1)?)?;
        let mut shape = ts[0].shape().to_vec();
        shape.insert(d, ts.len());
        let dtype = ts.iter().skip(1).fold(ts[0].dtype(), |d, t| promote_types(d, t.dtype()));
        Ok(meta1(&shape, dtype))
    },
    kernel: |a| {
        let op = "stack";
        let ts = tensors(op, a, 0)?;
        let d = stack_check(op, ts, int(op, a, 1)?)?;
        let us: Vec<Tensor> = ts.iter().map(|t| {
            let (_, l) = t.concrete(op)?;
            t.view_with_layout(op, l.unsqueeze(op, d as i64)?)
        }).collect::<Result<_>>()?;
        let p = cat_plan(op, &us, d as i64)?;
        Ok(smallvec![cat_impl(op, &us, &p)?])
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::stack_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Stacks equally shaped tensors along a new dim.");

// ---------------------------------------------------------------------------------------------
// split / split_with_sizes / chunk / unbind (views)
// ---------------------------------------------------------------------------------------------

fn meta_layout(op: &str, t: &Tensor) -> Result<Layout> {
    match t.layout() {
        Some(l) => Ok(l.clone()),
        None => {
            let m = t.meta().ok_or_else(|| Error::trace(op, "shape of a symbolic tensor is unknown"))?;
            Ok(Layout::from_parts(m.shape, m.strides, 0))
        }
    }
}

/// Sizes of the pieces along `dim`.
fn split_sizes(op: &str, t: &Tensor, a: &[Value]) -> Result<(usize, Vec<usize>)> {
    let x = tensor(op, a, 0)?;
    let _ = t;
    if x.ndim() == 0 {
        return Err(Error::index(op, format!("{op}() cannot be applied to a 0-dim tensor.")));
    }
    let dim = wrap_dim(op, int(op, a, 2)?, x.ndim())?;
    let size = x.shape()[dim];
    let sizes = match op {
        "split" => {
            let s = int(op, a, 1)?;
            if s < 0 {
                return Err(Error::argument(
                    op,
                    format!("split expects split_size be non-negative, but got split_size={s}"),
                ));
            }
            if s == 0 {
                if size != 0 {
                    return Err(Error::argument(
                        op,
                        format!("split_size can only be 0 if dimension size is 0, but got dimension size of {size}"),
                    ));
                }
                vec![0]
            } else {
                let s = s as usize;
                let n = size.div_ceil(s).max(1);
                (0..n).map(|i| s.min(size - (i * s).min(size))).collect()
            }
        }
        "chunk" => {
            let c = int(op, a, 1)?;
            if c <= 0 {
                return Err(Error::argument(op, format!("chunk expects `chunks` to be greater than 0, got: {c}")));
            }
            let s = size.div_ceil(c as usize);
            if s == 0 {
                vec![0; (c as usize).min(size.max(1))]
            } else {
                let n = size.div_ceil(s);
                (0..n).map(|i| s.min(size - i * s)).collect()
            }
        }
        "unbind" => vec![1; size],
        _ => {
            let ss = ints(op, a, 1)?;
            if ss.iter().any(|&s| s < 0) || ss.iter().map(|&s| s.max(0) as usize).sum::<usize>() != size {
                return Err(Error::shape(
                    op,
                    format!(
                        "split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size at dimension {dim}), but got split_sizes={:?}",
                        ss.as_ref()
                    ),
                ));
            }
            ss.iter().map(|&s| s as usize).collect()
        }
    };
    Ok((dim, sizes))
}

fn split_layouts(op: &str, a: &[Value]) -> Result<Vec<Layout>> {
    let t = tensor(op, a, 0)?;
    let l = meta_layout(op, t)?;
    let (dim, sizes) = split_sizes(op, t, a)?;
    let mut at = 0i64;
    let mut out = Vec::with_capacity(sizes.len());
    for s in sizes {
        let piece =
            if op == "unbind" { l.select(op, dim as i64, at)? } else { l.narrow(op, dim as i64, at, s as i64)? };
        out.push(piece);
        at += s as i64;
    }
    Ok(out)
}

fn split_meta(op: &str, a: &[Value]) -> Result<MetaOutputs> {
    let dt = tensor(op, a, 0)?.dtype();
    Ok(split_layouts(op, a)?
        .into_iter()
        .map(|l| TensorMeta { shape: l.shape().into(), dtype: dt, strides: l.strides().into() })
        .collect())
}

fn split_kernel(op: &str, a: &[Value]) -> Result<Outputs> {
    let t = tensor(op, a, 0)?;
    split_layouts(op, a)?.into_iter().map(|l| t.view_with_layout(op, l)).collect()
}

opdef!(SPLIT, "split", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("split_size", T::Int), ArgSpec::opt("dim", T::Int, D::Int(0))],
    meta: |a| split_meta("split", a),
    kernel: |a| split_kernel("split", a),
    cost: cost_free, effect: Effect::Pure, category: Category::View,
    backward: crate::autograd::formulas::index::split_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Splits into views of split_size along dim (the last may be smaller).");
opdef!(SPLIT_WITH_SIZES, "split_with_sizes", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("split_sizes", T::IntList), ArgSpec::opt("dim", T::Int, D::Int(0))],
    meta: |a| split_meta("split_with_sizes", a),
    kernel: |a| split_kernel("split_with_sizes", a),
    cost: cost_free, effect: Effect::Pure, category: Category::View,
    backward: crate::autograd::formulas::index::split_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Splits into views with the given sizes along dim (torch.split with a list).");
opdef!(CHUNK, "chunk", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("chunks", T::Int), ArgSpec::opt("dim", T::Int, D::Int(0))],
    meta: |a| split_meta("chunk", a),
    kernel: |a| split_kernel("chunk", a),
    cost: cost_free, effect: Effect::Pure, category: Category::View,
    backward: crate::autograd::formulas::index::split_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Splits into at most `chunks` views of size ceil(n / chunks) along dim.");
opdef!(UNBIND, "unbind", &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("dim", T::Int, D::Int(0))],
    meta: |a| { let a2 = [a[0].clone(), Value::None, a.get(1).cloned().unwrap_or(Value::Int(0))]; split_meta("unbind", &a2) },
    kernel: |a| { let a2 = [a[0].clone(), Value::None, a.get(1).cloned().unwrap_or(Value::Int(0))]; split_kernel("unbind", &a2) },
    cost: cost_free, effect: Effect::Pure, category: Category::View,
    backward: crate::autograd::formulas::index::unbind_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Removes dim, returning every slice along it as a view.");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&CAT, &STACK, &SPLIT, &SPLIT_WITH_SIZES, &CHUNK, &UNBIND];

fn many(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Vec<Tensor>> {
    Ok(crate::op::dispatch(op, kind, args)?.into_vec())
}

/// `torch.cat(tensors, dim)`.
pub fn cat(tensors: &[Tensor], dim: i64) -> Result<Tensor> {
    call1(&CAT, CallKind::Function, &[Value::Tensors(tensors.to_vec()), dim.into()])
}
/// `torch.stack(tensors, dim)`.
pub fn stack(tensors: &[Tensor], dim: i64) -> Result<Tensor> {
    call1(&STACK, CallKind::Function, &[Value::Tensors(tensors.to_vec()), dim.into()])
}
/// `torch.split(input, split_size, dim)` (views).
pub fn split(input: &Tensor, split_size: i64, dim: i64) -> Result<Vec<Tensor>> {
    many(&SPLIT, CallKind::Function, &[input.into(), split_size.into(), dim.into()])
}
/// `torch.split(input, [sizes], dim)` (views).
pub fn split_with_sizes(input: &Tensor, split_sizes: &[i64], dim: i64) -> Result<Vec<Tensor>> {
    many(&SPLIT_WITH_SIZES, CallKind::Function, &[input.into(), split_sizes.into(), dim.into()])
}
/// `torch.chunk(input, chunks, dim)` (views).
pub fn chunk(input: &Tensor, chunks: i64, dim: i64) -> Result<Vec<Tensor>> {
    many(&CHUNK, CallKind::Function, &[input.into(), chunks.into(), dim.into()])
}
/// `torch.unbind(input, dim)` (views).
pub fn unbind(input: &Tensor, dim: i64) -> Result<Vec<Tensor>> {
    many(&UNBIND, CallKind::Function, &[input.into(), dim.into()])
}

impl Tensor {
    /// `x.split(split_size, dim)` (views).
    pub fn split(&self, split_size: i64, dim: i64) -> Result<Vec<Tensor>> {
        many(&SPLIT, CallKind::Method, &[self.into(), split_size.into(), dim.into()])
    }
    /// `x.split([sizes], dim)` (views).
    pub fn split_with_sizes(&self, split_sizes: &[i64], dim: i64) -> Result<Vec<Tensor>> {
        many(&SPLIT_WITH_SIZES, CallKind::Method, &[self.into(), split_sizes.into(), dim.into()])
    }
    /// `x.chunk(chunks, dim)` (views).
    pub fn chunk(&self, chunks: i64, dim: i64) -> Result<Vec<Tensor>> {
        many(&CHUNK, CallKind::Method, &[self.into(), chunks.into(), dim.into()])
    }
    /// `x.unbind(dim)` (views).
    pub fn unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        many(&UNBIND, CallKind::Method, &[self.into(), dim.into()])
    }
}
