//! Sorting: `sort` (stable, ascending or descending), `argsort` and `topk`, along one dim.
//!
//! Order: NaN sorts above every number (last ascending, first descending), as in PyTorch.
//! Ties keep their original order (every sort here is stable, `stable=False` included). `topk`
//! picks among equal values the lowest indices and returns them by descending value (ascending
//! for `largest=False`), ties by ascending index; `sorted=False` returns the same order.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::wrap_dim;
use crate::op::args::{bool_, int, tensor};
use crate::op::{ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs};
use crate::ops::reduce::{call1, call2, cost_reduce, map_rows, opdef, plan, unpermute};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;
use std::cmp::Ordering;

/// Ascending order with NaN largest.
#[inline]
fn cmp_asc<E: PartialOrd>(a: &E, b: &E) -> Ordering {
    match a.partial_cmp(b) {
        Some(o) => o,
        #[allow(clippy::eq_op)]
        None => (a != a).cmp(&(b != b)),
    }
}

fn dim_of(op: &str, t: &Tensor, d: i64) -> Result<usize> {
    wrap_dim(op, d, t.ndim())
}

fn sort_rows<E: Element>(row: &[E], descending: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    if descending {
        idx.sort_by(|&i, &j| cmp_asc(&row[j], &row[i]));
    } else {
        idx.sort_by(|&i, &j| cmp_asc(&row[i], &row[j]));
    }
    idx
}

fn topk_rows<E: Element>(row: &[E], k: usize, largest: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let cmp = |&i: &usize, &j: &usize| {
        let o = if largest { cmp_asc(&row[j], &row[i]) } else { cmp_asc(&row[i], &row[j]) };
        o.then(i.cmp(&j))
    };
    if k == 0 {
        return vec![];
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

/// Applies `pick(row) -> indices` to every row along `dim` of `t`; returns (values, indices)
/// shaped like `t` with `dim` of size `k`.
fn gather_rows(
    op: &str,
    t: &Tensor,
    dim: usize,
    k: usize,
    want_values: bool,
    pick: &(dyn Fn(&dyn RowPick) -> Vec<usize> + Sync),
) -> Result<Outputs> {
    let shape = t.shape().to_vec();
    let mut mask = vec![false; shape.len()];
    if !shape.is_empty() {
        mask[dim] = true;
    }
    let p = plan(op, t, &mask, false)?;
    let mut out_shape = shape.clone();
    if !out_shape.is_empty() {
        out_shape[dim] = k;
    }
    let plan_shape: Vec<usize> = if p.permuted { vec![p.o, k] } else { out_shape.clone() };
    let dt = t.dtype();
    let (vals, idx) = crate::match_dtype!(dt, E => p.src.with_contiguous::<E, _>(op, |d| -> Result<(Option<Tensor>, Tensor)> {
        let rows: Vec<Vec<usize>> = if p.r == 0 { vec![vec![]; p.o] } else { map_rows(d, p.o, p.r, |row| pick(&Row(row))) };
        let mut iv: Vec<i64> = Vec::with_capacity(p.o * k);
        let mut vv: Vec<E> = Vec::with_capacity(if want_values { p.o * k } else { 0 });
        for (o, r) in rows.iter().enumerate() {
            for &j in r {
                iv.push(j as i64);
                if want_values {
                    vv.push(d[o * p.r + j]);
                }
            }
        }
        let vals = if want_values { Some(Tensor::from_vec(vv, &plan_shape)?) } else { None };
        Ok((vals, Tensor::from_vec(iv, &plan_shape)?))
    })??);
    let fix = |x: Tensor| if p.permuted { unpermute(op, x, &out_shape, dim) } else { Ok(x) };
    let mut out: Outputs = smallvec![];
    if let Some(v) = vals {
        out.push(fix(v)?);
    }
    out.push(fix(idx)?);
    Ok(out)
}

/// A row of any element type, seen by the row pickers.
trait RowPick {
    fn sort(&self, descending: bool) -> Vec<usize>;
    fn topk(&self, k: usize, largest: bool) -> Vec<usize>;
}
struct Row<'a, E>(&'a [E]);
impl<E: Element> RowPick for Row<'_, E> {
    fn sort(&self, descending: bool) -> Vec<usize> {
        sort_rows(self.0, descending)
    }
    fn topk(&self, k: usize, largest: bool) -> Vec<usize> {
        topk_rows(self.0, k, largest)
    }
}

// ---------------------------------------------------------------------------------------------

fn sort_meta(op: &str, a: &[Value], with_values: bool) -> Result<MetaOutputs> {
    let t = tensor(op, a, 0)?;
    dim_of(op, t, int(op, a, 1)?)?;
    let mut m: MetaOutputs = smallvec![];
    if with_values {
        m.push(TensorMeta::contiguous(t.shape(), t.dtype()));
    }
    m.push(TensorMeta::contiguous(t.shape(), DType::I64));
    Ok(m)
}

fn sort_kernel(op: &str, a: &[Value], with_values: bool) -> Result<Outputs> {
    let t = tensor(op, a, 0)?;
    let dim = dim_of(op, t, int(op, a, 1)?)?;
    let desc = bool_(op, a, 2)?;
    let k = if t.ndim() == 0 { 1 } else { t.shape()[dim] };
    gather_rows(op, t, dim, k, with_values, &|row| row.sort(desc))
}

const SORT_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::opt("dim", T::Int, D::Int(-1)),
    ArgSpec::opt("descending", T::Bool, D::Bool(false)),
    ArgSpec::kw("stable", T::Bool, D::Bool(false)),
];

opdef!(SORT, "sort", SORT_SCHEMA,
    meta: |a| sort_meta("sort", a, true),
    kernel: |a| sort_kernel("sort", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::sort_backward, saves: crate::op::Saves { inputs: 0, outputs: 2 },
    doc: "Sorts along dim: (values, indices). Always stable; NaN sorts as the largest value.");
opdef!(ARGSORT, "argsort", SORT_SCHEMA,
    meta: |a| sort_meta("argsort", a, false),
    kernel: |a| sort_kernel("argsort", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    doc: "Indices that sort along dim (stable; NaN largest).");

fn topk_params(a: &[Value]) -> Result<(usize, usize, bool, Vec<usize>)> {
    let op = "topk";
    let t = tensor(op, a, 0)?;
    let k = int(op, a, 1)?;
    let dim = dim_of(op, t, int(op, a, 2)?)?;
    let largest = bool_(op, a, 3)?;
    let size = if t.ndim() == 0 { 1 } else { t.shape()[dim] };
    if k < 0 || k as usize > size {
        return Err(Error::index(
            op,
            format!(
                "selected index k out of range: k = {k} but dimension {dim} has size {size} (shape {:?})",
                t.shape()
            ),
        ));
    }
    let mut shape = t.shape().to_vec();
    if !shape.is_empty() {
        shape[dim] = k as usize;
    }
    Ok((k as usize, dim, largest, shape))
}

opdef!(TOPK, "topk",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("k", T::Int), ArgSpec::opt("dim", T::Int, D::Int(-1)), ArgSpec::opt("largest", T::Bool, D::Bool(true)), ArgSpec::opt("sorted", T::Bool, D::Bool(true))],
    meta: |a| {
        let (_, _, _, shape) = topk_params(a)?;
        let t = tensor("topk", a, 0)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, t.dtype()), TensorMeta::contiguous(&shape, DType::I64)])
    },
    kernel: |a| {
        let (k, dim, largest, _) = topk_params(a)?;
        let t = tensor("topk", a, 0)?;
        gather_rows("topk", t, dim, k, true, &|row| row.topk(k, largest))
    },
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::sort_backward, saves: crate::op::Saves { inputs: 0, outputs: 2 },
    doc: "The k largest (or smallest) elements along dim: (values, indices), sorted; ties prefer lower indices.");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&SORT, &ARGSORT, &TOPK];

/// `torch.sort(input, dim, descending)`: `(values, indices)`.
pub fn sort(input: &Tensor, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
    call2(&SORT, CallKind::Function, &[input.into(), dim.into(), descending.into(), true.into()])
}
/// `torch.argsort(input, dim, descending)`.
pub fn argsort(input: &Tensor, dim: i64, descending: bool) -> Result<Tensor> {
    call1(&ARGSORT, CallKind::Function, &[input.into(), dim.into(), descending.into(), true.into()])
}
/// `torch.topk(input, k, dim, largest, sorted)`: `(values, indices)`.
pub fn topk(input: &Tensor, k: i64, dim: i64, largest: bool, sorted: bool) -> Result<(Tensor, Tensor)> {
    call2(&TOPK, CallKind::Function, &[input.into(), k.into(), dim.into(), largest.into(), sorted.into()])
}

impl Tensor {
    /// `x.sort(dim, descending)`: `(values, indices)`.
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        call2(&SORT, CallKind::Method, &[self.into(), dim.into(), descending.into(), true.into()])
    }
    /// `x.argsort(dim, descending)`.
    pub fn argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        call1(&ARGSORT, CallKind::Method, &[self.into(), dim.into(), descending.into(), true.into()])
    }
    /// `x.topk(k, dim, largest, sorted)`: `(values, indices)`.
    pub fn topk(&self, k: i64, dim: i64, largest: bool, sorted: bool) -> Result<(Tensor, Tensor)> {
        call2(&TOPK, CallKind::Method, &[self.into(), k.into(), dim.into(), largest.into(), sorted.into()])
    }
}
