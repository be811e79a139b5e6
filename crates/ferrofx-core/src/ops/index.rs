//! Indexing: `gather`, `scatter` (tensor or scalar `src`, optional `reduce='add'|'multiply'`),
//! `scatter_add`, `index_select`, `masked_fill` (scalar or 0-dim tensor value), `masked_select`,
//! and the in-place forms `scatter_`, `scatter_add_`, `masked_fill_`.
//!
//! Out-of-range indices are errors naming the index value, the dim and its size (never panics).
//! `masked_select`'s output size depends on the data, so its meta function reports an error
//! (it cannot be shape-propagated symbolically).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, wrap_dim, Layout, StridedIter};
use crate::op::args::{int, tensor};
use crate::op::{
    cost_memory, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs,
};
use crate::ops::kernel;
use crate::ops::reduce::{call1, meta1, opdef};
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use crate::value::Value;
use smallvec::smallvec;

fn oob(op: &str, v: i64, dim: usize, size: usize) -> Error {
    Error::index(op, format!("index {v} is out of bounds for dimension {dim} with size {size}"))
}

/// Reads an integer index tensor as a contiguous `Vec<i64>`.
fn index_values(op: &str, idx: &Tensor, allow_i32: bool) -> Result<Vec<i64>> {
    match idx.dtype() {
        DType::I64 => idx.to_vec::<i64>(),
        DType::I32 if allow_i32 => Ok(idx.to_vec::<i32>()?.into_iter().map(i64::from).collect()),
        d => Err(Error::dtype(
            op,
            format!("{op}(): Expected dtype {} for index, got {d}", if allow_i32 { "int32 or int64" } else { "int64" }),
        )),
    }
}

/// Contiguous strides of `shape` with `dim`'s stride zeroed: StridedIter over
/// `Layout(index_shape, these)` yields the base offset of each index position.
fn base_layout(index_shape: &[usize], target_strides: &[usize], dim: usize, offset: usize) -> Layout {
    let mut st: Vec<usize> = target_strides.to_vec();
    if !st.is_empty() {
        st[dim] = 0;
    }
    Layout::from_parts(index_shape.into(), st.as_slice().into(), offset)
}

// ---------------------------------------------------------------------------------------------
// gather
// ---------------------------------------------------------------------------------------------

fn gather_check(op: &str, x: &Tensor, dim: i64, idx: &Tensor) -> Result<usize> {
    let d = wrap_dim(op, dim, x.ndim())?;
    if idx.dtype() != DType::I64 {
        return Err(Error::dtype(op, format!("{op}(): Expected dtype int64 for index, got {}", idx.dtype())));
    }
    let (xs, is) = (x.shape(), idx.shape());
    if xs.len().max(1) != is.len().max(1) {
        return Err(Error::shape(
            op,
            format!("Index tensor must have the same number of dimensions as input tensor: index {is:?}, input {xs:?}"),
        ));
    }
    for k in 0..is.len().min(xs.len()) {
        if k != d && is[k] > xs[k] {
            return Err(Error::shape(
                op,
                format!("Size does not match at dimension {k} expected index {is:?} to be no larger than self {xs:?} apart from dimension {d}"),
            ));
        }
    }
    Ok(d)
}

opdef!(GATHER, "gather",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::req("index", T::Tensor), ArgSpec::kw("sparse_grad", T::Bool, D::Bool(false))],
    meta: |a| {
        let (x, idx) = (tensor("gather", a, 0)?, tensor("gather", a, 2)?);
        gather_check("gather", x, int("gather", a, 1)?, idx)?;
        Ok(meta1(idx.shape(), x.dtype()))
    },
    kernel: |a| {
        let op = "gather";
        let (x, idx) = (tensor(op, a, 0)?, tensor(op, a, 2)?);
        let d = gather_check(op, x, int(op, a, 1)?, idx)?;
        let iv = index_values(op, idx, false)?;
        let xs = x.shape().to_vec();
        let size = if xs.is_empty() { 1 } else { xs[d] };
        let dt = x.dtype();
        crate::match_dtype!(dt, E => x.with_data::<E, _>(op, |data, l| -> Result<Outputs> {
            let sd = if xs.is_empty() { 0 } else { l.strides()[d] };
            let bl = base_layout(idx.shape(), l.strides(), d, l.offset());
            let mut out: Vec<E> = crate::memory::alloc_uninit(op, idx.shape())?;
            for (base, &v) in StridedIter::new(&bl).zip(&iv) {
                if v < 0 || v as usize >= size {
                    return Err(oob(op, v, d, size));
                }
                out.push(data[base + v as usize * sd]);
            }
            Ok(smallvec![Tensor::from_vec(out, idx.shape())?])
        })?)
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::gather_backward, saves: crate::op::Saves { inputs: 4, outputs: 0 },
    doc: "`out[i][j] = input[i][index[i][j]]` (for dim = 1): picks elements along dim by index.");

// ---------------------------------------------------------------------------------------------
// scatter / scatter_add (+ in-place)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Reduce {
    Assign,
    Add,
    Mul,
}

#[inline]
fn combine<E: Element>(r: Reduce, a: E, b: E) -> E {
    match r {
        Reduce::Assign => b,
        Reduce::Add => {
            if E::DTYPE.is_floating_point() {
                E::from_f64(a.to_f64() + b.to_f64())
            } else {
                E::from_i64(a.to_i64().wrapping_add(b.to_i64()))
            }
        }
        Reduce::Mul => {
            if E::DTYPE.is_floating_point() {
                E::from_f64(a.to_f64() * b.to_f64())
            } else {
                E::from_i64(a.to_i64().wrapping_mul(b.to_i64()))
            }
        }
    }
}

enum Src<'a> {
    Tensor(&'a Tensor),
    Scalar(Scalar),
}

fn scatter_args<'a>(op: &str, a: &'a [Value], add: bool) -> Result<(&'a Tensor, usize, &'a Tensor, Src<'a>, Reduce)> {
    let x = tensor(op, a, 0)?;
    let idx = tensor(op, a, 2)?;
    let src = match a.get(3) {
        Some(Value::Tensor(t)) => Src::Tensor(t),
        Some(v) => Src::Scalar(v.as_scalar().ok_or_else(|| Error::schema(op, "src must be a Tensor or a number"))?),
        None => return Err(Error::schema(op, "missing src")),
    };
    let reduce = if add {
        Reduce::Add
    } else {
        match a.get(4) {
            Some(Value::Str(s)) => match s.as_str() {
                "add" => Reduce::Add,
                "multiply" => Reduce::Mul,
                other => {
                    return Err(Error::argument(
                        op,
                        format!("reduce argument must be either add or multiply, got '{other}'"),
                    ))
                }
            },
            _ => Reduce::Assign,
        }
    };
    let d = wrap_dim(op, int(op, a, 1)?, x.ndim())?;
    if idx.dtype() != DType::I64 {
        return Err(Error::dtype(op, format!("{op}(): Expected dtype int64 for index, got {}", idx.dtype())));
    }
    let (xs, is) = (x.shape(), idx.shape());
    if xs.len().max(1) != is.len().max(1) {
        return Err(Error::shape(
            op,
            format!("Index tensor must have the same number of dimensions as self tensor: index {is:?}, self {xs:?}"),
        ));
    }
    if let Src::Tensor(s) = &src {
        if s.dtype() != x.dtype() {
            return Err(Error::dtype(
                op,
                format!("{op}(): Expected self.dtype to be equal to src.dtype, got {} and {}", x.dtype(), s.dtype()),
            ));
        }
        let ss = s.shape();
        if ss.len().max(1) != is.len().max(1) {
            return Err(Error::shape(
                op,
                format!("Index tensor must have the same number of dimensions as src tensor: index {is:?}, src {ss:?}"),
            ));
        }
        for k in 0..is.len().min(ss.len()) {
            if is[k] > ss[k] {
                return Err(Error::shape(
                    op,
                    format!("Expected index {is:?} to be no larger than self {xs:?} apart from dimension {d} and to be no larger size than src {ss:?}"),
                ));
            }
        }
    }
    for k in 0..is.len().min(xs.len()) {
        if k != d && is[k] > xs[k] {
            return Err(Error::shape(
                op,
                format!("Expected index {is:?} to be no larger than self {xs:?} apart from dimension {d}"),
            ));
        }
    }
    Ok((x, d, idx, src, reduce))
}

/// Scatters into a fresh contiguous copy of `x` and returns it.
fn scatter_impl(op: &str, x: &Tensor, d: usize, idx: &Tensor, src: &Src, reduce: Reduce) -> Result<Tensor> {
    let iv = index_values(op, idx, false)?;
    let xs = x.shape().to_vec();
    let size = if xs.is_empty() { 1 } else { xs[d] };
    let dt = x.dtype();
    let out_strides = crate::layout::contiguous_strides(&xs);
    let sd = if xs.is_empty() { 0 } else { out_strides[d] };
    let bl = base_layout(idx.shape(), &out_strides, d, 0);
    crate::match_dtype!(dt, E => {
        let mut out: Vec<E> = x.to_vec::<E>()?;
        let mut put = |vals: &mut dyn Iterator<Item = E>| -> Result<()> {
            for ((base, &v), s) in StridedIter::new(&bl).zip(&iv).zip(vals) {
                if v < 0 || v as usize >= size {
                    return Err(oob(op, v, d, size));
                }
                let k = base + v as usize * sd;
                out[k] = combine(reduce, out[k], s);
            }
            Ok(())
        };
        match src {
            Src::Scalar(s) => {
                let v: E = if E::DTYPE.is_floating_point() { E::from_f64(s.to_f64()) } else { E::from_i64(s.to_i64()) };
                put(&mut std::iter::repeat(v))?;
            }
            Src::Tensor(s) => {
                s.with_data::<E, _>(op, |data, l| {
                    let sl = Layout::from_parts(idx.shape().into(), l.strides().into(), l.offset());
                    put(&mut StridedIter::new(&sl).map(|i| data[i]))
                })??;
            }
        }
        Tensor::from_vec(out, &xs)
    })
}

fn scatter_meta(op: &str, a: &[Value], add: bool) -> Result<MetaOutputs> {
    let (x, ..) = scatter_args(op, a, add)?;
    Ok(meta1(x.shape(), x.dtype()))
}

fn scatter_kernel(op: &str, a: &[Value], add: bool, inplace: bool) -> Result<Outputs> {
    let (x, d, idx, src, reduce) = scatter_args(op, a, add)?;
    let out = scatter_impl(op, x, d, idx, &src, reduce)?;
    if inplace {
        kernel::copy_into(op, x, &out)?;
        return Ok(smallvec![x.clone()]);
    }
    Ok(smallvec![out])
}

const SCATTER_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("dim", T::Int),
    ArgSpec::req("index", T::Tensor),
    ArgSpec::req("src", T::TensorOrScalar),
    ArgSpec::kw("reduce", T::OptStr, D::None),
];
const SCATTER_ADD_SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("dim", T::Int),
    ArgSpec::req("index", T::Tensor),
    ArgSpec::req("src", T::Tensor),
];

opdef!(SCATTER, "scatter", SCATTER_SCHEMA,
    meta: |a| scatter_meta("scatter", a, false),
    kernel: |a| scatter_kernel("scatter", a, false, false),
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::scatter_backward, saves: crate::op::Saves { inputs: 4, outputs: 0 },
    doc: "A copy of input with `out[i][index[i][j]] = src[i][j]` (dim = 1); src may be a number; reduce='add'|'multiply' combines instead.");
opdef!(SCATTER_, "scatter_", SCATTER_SCHEMA,
    meta: |a| scatter_meta("scatter_", a, false),
    kernel: |a| scatter_kernel("scatter_", a, false, true),
    cost: cost_memory, effect: Effect::Mutates(0), category: Category::Indexing,
    backward: crate::autograd::formulas::index::scatter_backward, saves: crate::op::Saves { inputs: 4, outputs: 0 },
    doc: "In-place scatter.");
opdef!(SCATTER_ADD, "scatter_add", SCATTER_ADD_SCHEMA,
    meta: |a| scatter_meta("scatter_add", a, true),
    kernel: |a| scatter_kernel("scatter_add", a, true, false),
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::scatter_add_backward, saves: crate::op::Saves { inputs: 4, outputs: 0 },
    doc: "A copy of input with `out[i][index[i][j]] += src[i][j]` (dim = 1).");
opdef!(SCATTER_ADD_, "scatter_add_", SCATTER_ADD_SCHEMA,
    meta: |a| scatter_meta("scatter_add_", a, true),
    kernel: |a| scatter_kernel("scatter_add_", a, true, true),
    cost: cost_memory, effect: Effect::Mutates(0), category: Category::Indexing,
    backward: crate::autograd::formulas::index::scatter_add_backward, saves: crate::op::Saves { inputs: 4, outputs: 0 },
    doc: "In-place scatter_add.");

// ---------------------------------------------------------------------------------------------
// index_select
// ---------------------------------------------------------------------------------------------

fn index_select_check(x: &Tensor, dim: i64, idx: &Tensor) -> Result<(usize, Vec<usize>)> {
    let op = "index_select";
    let d = wrap_dim(op, dim, x.ndim())?;
    if !matches!(idx.dtype(), DType::I64 | DType::I32) {
        return Err(Error::dtype(
            op,
            format!("index_select(): Expected dtype int32 or int64 for index, got {}", idx.dtype()),
        ));
    }
    if idx.ndim() > 1 {
        return Err(Error::shape(
            op,
            format!("index_select(): Index is supposed to be a vector, got shape {:?}", idx.shape()),
        ));
    }
    let mut shape = x.shape().to_vec();
    if shape.is_empty() {
        if idx.numel() != 1 {
            return Err(Error::shape(op, "index_select(): Index to scalar can have only 1 value"));
        }
    } else {
        shape[d] = idx.numel();
    }
    Ok((d, shape))
}

opdef!(INDEX_SELECT, "index_select",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::req("index", T::Tensor)],
    meta: |a| {
        let (x, idx) = (tensor("index_select", a, 0)?, tensor("index_select", a, 2)?);
        let (_, shape) = index_select_check(x, int("index_select", a, 1)?, idx)?;
        Ok(meta1(&shape, x.dtype()))
    },
    kernel: |a| {
        let op = "index_select";
        let (x, idx) = (tensor(op, a, 0)?, tensor(op, a, 2)?);
        let (d, shape) = index_select_check(x, int(op, a, 1)?, idx)?;
        let iv = index_values(op, idx, true)?;
        let xs = x.shape().to_vec();
        let size = if xs.is_empty() { 1 } else { xs[d] };
        for &v in &iv {
            if v < 0 || v as usize >= size {
                return Err(Error::index(op, format!("index_select(): index {v} is out of bounds for dimension {d} with size {size}")));
            }
        }
        let outer: usize = if xs.is_empty() { 1 } else { xs[..d].iter().product() };
        let inner: usize = if xs.is_empty() { 1 } else { xs[d + 1..].iter().product() };
        let dt = x.dtype();
        crate::match_dtype!(dt, E => x.with_contiguous::<E, _>(op, |data| -> Result<Outputs> {
            let mut out: Vec<E> = crate::memory::alloc_uninit(op, &shape)?;
            for o in 0..outer {
                for &v in &iv {
                    let s = (o * size + v as usize) * inner;
                    out.extend_from_slice(&data[s..s + inner]);
                }
            }
            Ok(smallvec![Tensor::from_vec(out, &shape)?])
        })?)
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::index_select_backward_formula, saves: crate::op::Saves { inputs: 4, outputs: 0 },
    doc: "Selects the entries at the given indices (a 1-D int64/int32 tensor) along dim.");

// ---------------------------------------------------------------------------------------------
// masked_fill / masked_select
// ---------------------------------------------------------------------------------------------

fn mask_check(op: &str, mask: &Tensor) -> Result<()> {
    if mask.dtype() != DType::Bool {
        return Err(Error::dtype(
            op,
            format!("{op} only supports boolean masks, but got mask with dtype {}", mask.dtype()),
        ));
    }
    Ok(())
}

fn fill_value(op: &str, a: &[Value]) -> Result<Scalar> {
    match a.get(2) {
        Some(Value::Tensor(v)) => {
            if v.ndim() != 0 {
                return Err(Error::shape(
                    op,
                    format!(
                        "{op} only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
                        v.ndim()
                    ),
                ));
            }
            if v.is_symbolic() {
                return Err(Error::trace(op, "the fill value tensor is symbolic; pass a number"));
            }
            let x = v.item()?;
            Ok(if v.dtype().is_floating_point() { Scalar::Float(x) } else { Scalar::Int(x as i64) })
        }
        Some(v) => v.as_scalar().ok_or_else(|| Error::schema(op, "value must be a number or a 0-dim tensor")),
        None => Err(Error::schema(op, "missing value")),
    }
}

fn masked_fill_shape(op: &str, a: &[Value], inplace: bool) -> Result<Vec<usize>> {
    let (x, mask) = (tensor(op, a, 0)?, tensor(op, a, 1)?);
    mask_check(op, mask)?;
    if let Some(Value::Tensor(v)) = a.get(2) {
        if v.ndim() != 0 {
            return Err(Error::shape(
                op,
                format!(
                    "{op} only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
                    v.ndim()
                ),
            ));
        }
    }
    let shape = broadcast_shapes(op, x.shape(), mask.shape())?;
    if inplace && shape.as_slice() != x.shape() {
        return Err(Error::shape(
            op,
            format!(
                "the mask of shape {:?} cannot be broadcast to the input's shape {:?} in place",
                mask.shape(),
                x.shape()
            ),
        ));
    }
    Ok(shape.to_vec())
}

fn masked_fill_kernel(op: &str, a: &[Value], inplace: bool) -> Result<Outputs> {
    let shape = masked_fill_shape(op, a, inplace)?;
    let (x, mask) = (tensor(op, a, 0)?, tensor(op, a, 1)?);
    let value = fill_value(op, a)?;
    let dt = x.dtype();
    let ml = mask.concrete(op)?.1.broadcast_to(op, &shape)?;
    let mv: Vec<bool> =
        mask.with_data::<bool, _>(op, |d, _| crate::memory::collect(op, &shape, StridedIter::new(&ml).map(|i| d[i])))??;
    let out = crate::match_dtype!(dt, E => {
        let v: E = if E::DTYPE.is_floating_point() { E::from_f64(value.to_f64()) } else { E::from_i64(value.to_i64()) };
        let xl = x.concrete(op)?.1.broadcast_to(op, &shape)?;
        let out: Vec<E> = x.with_data::<E, _>(op, |d, _| crate::memory::collect(op, &shape, StridedIter::new(&xl).zip(&mv).map(|(i, &m)| if m { v } else { d[i] })))??;
        Tensor::from_vec(out, &shape)?
    });
    if inplace {
        kernel::copy_into(op, x, &out)?;
        return Ok(smallvec![x.clone()]);
    }
    Ok(smallvec![out])
}

const MASKED_FILL_SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("mask", T::Tensor), ArgSpec::req("value", T::TensorOrScalar)];

opdef!(MASKED_FILL, "masked_fill", MASKED_FILL_SCHEMA,
    meta: |a| { let s = masked_fill_shape("masked_fill", a, false)?; Ok(meta1(&s, tensor("masked_fill", a, 0)?.dtype())) },
    kernel: |a| masked_fill_kernel("masked_fill", a, false),
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::masked_fill_backward, saves: crate::op::Saves { inputs: 2, outputs: 0 },
    doc: "A copy of input with value (a number or 0-dim tensor) where the bool mask is true (mask broadcasts).");
opdef!(MASKED_FILL_, "masked_fill_", MASKED_FILL_SCHEMA,
    meta: |a| { let s = masked_fill_shape("masked_fill_", a, true)?; Ok(meta1(&s, tensor("masked_fill_", a, 0)?.dtype())) },
    kernel: |a| masked_fill_kernel("masked_fill_", a, true),
    cost: cost_memory, effect: Effect::Mutates(0), category: Category::Indexing,
    backward: crate::autograd::formulas::index::masked_fill_backward, saves: crate::op::Saves { inputs: 2, outputs: 0 },
    doc: "In-place masked_fill.");

opdef!(MASKED_SELECT, "masked_select", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("mask", T::Tensor)],
    meta: |a| {
        let (x, mask) = (tensor("masked_select", a, 0)?, tensor("masked_select", a, 1)?);
        mask_check("masked_select", mask)?;
        broadcast_shapes("masked_select", x.shape(), mask.shape())?;
        Err(Error::trace("masked_select", "the output size of masked_select depends on the mask's values, so it cannot be inferred from shapes"))
    },
    kernel: |a| {
        let op = "masked_select";
        let (x, mask) = (tensor(op, a, 0)?, tensor(op, a, 1)?);
        mask_check(op, mask)?;
        let shape = broadcast_shapes(op, x.shape(), mask.shape())?;
        let ml = mask.concrete(op)?.1.broadcast_to(op, &shape)?;
        let mv: Vec<bool> = mask.with_data::<bool, _>(op, |d, _| crate::memory::collect(op, &shape, StridedIter::new(&ml).map(|i| d[i])))??;
        let dt = x.dtype();
        let xl = x.concrete(op)?.1.broadcast_to(op, &shape)?;
        crate::match_dtype!(dt, E => {
            let out: Vec<E> = x.with_data::<E, _>(op, |d, _| crate::memory::collect(op, &[mv.iter().filter(|&&m| m).count()], StridedIter::new(&xl).zip(&mv).filter(|(_, &m)| m).map(|(i, _)| d[i])))??;
            let n = out.len();
            Ok(smallvec![Tensor::from_vec(out, &[n])?])
        })
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::masked_select_backward_formula, saves: crate::op::Saves { inputs: 2, outputs: 0 },
    doc: "The elements where the bool mask is true, as a 1-D tensor (data-dependent size).");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &GATHER,
    &SCATTER,
    &SCATTER_,
    &SCATTER_ADD,
    &SCATTER_ADD_,
    &INDEX_SELECT,
    &MASKED_FILL,
    &MASKED_FILL_,
    &MASKED_SELECT,
];

fn reduce_value(reduce: Option<&str>) -> Value {
    reduce.map(|s| Value::Str(s.to_string())).unwrap_or(Value::None)
}

/// `torch.gather(input, dim, index)`.
pub fn gather(input: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    call1(&GATHER, CallKind::Function, &[input.into(), dim.into(), index.into(), false.into()])
}
/// `torch.scatter(input, dim, index, src, reduce=)` with a tensor `src`.
pub fn scatter(input: &Tensor, dim: i64, index: &Tensor, src: &Tensor, reduce: Option<&str>) -> Result<Tensor> {
    call1(&SCATTER, CallKind::Function, &[input.into(), dim.into(), index.into(), src.into(), reduce_value(reduce)])
}
/// `torch.scatter(input, dim, index, value, reduce=)` with a number.
pub fn scatter_value(
    input: &Tensor,
    dim: i64,
    index: &Tensor,
    value: impl Into<Scalar>,
    reduce: Option<&str>,
) -> Result<Tensor> {
    let v: Value = value.into().into();
    call1(&SCATTER, CallKind::Function, &[input.into(), dim.into(), index.into(), v, reduce_value(reduce)])
}
/// `torch.scatter_add(input, dim, index, src)`.
pub fn scatter_add(input: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    call1(&SCATTER_ADD, CallKind::Function, &[input.into(), dim.into(), index.into(), src.into()])
}
/// `torch.index_select(input, dim, index)`.
pub fn index_select(input: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    call1(&INDEX_SELECT, CallKind::Function, &[input.into(), dim.into(), index.into()])
}
/// `torch.masked_fill(input, mask, value)`.
pub fn masked_fill(input: &Tensor, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
    let v: Value = value.into().into();
    call1(&MASKED_FILL, CallKind::Function, &[input.into(), mask.into(), v])
}
/// `torch.masked_select(input, mask)`.
pub fn masked_select(input: &Tensor, mask: &Tensor) -> Result<Tensor> {
    call1(&MASKED_SELECT, CallKind::Function, &[input.into(), mask.into()])
}

impl Tensor {
    /// `x.gather(dim, index)`.
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        call1(&GATHER, CallKind::Method, &[self.into(), dim.into(), index.into(), false.into()])
    }
    /// `x.scatter(dim, index, src)`.
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        call1(&SCATTER, CallKind::Method, &[self.into(), dim.into(), index.into(), src.into(), Value::None])
    }
    /// `x.scatter_(dim, index, src)` (in place; returns `self`).
    pub fn scatter_(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        call1(&SCATTER_, CallKind::Method, &[self.into(), dim.into(), index.into(), src.into(), Value::None])
    }
    /// `x.scatter_add(dim, index, src)`.
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        call1(&SCATTER_ADD, CallKind::Method, &[self.into(), dim.into(), index.into(), src.into()])
    }
    /// `x.scatter_add_(dim, index, src)` (in place; returns `self`).
    pub fn scatter_add_(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        call1(&SCATTER_ADD_, CallKind::Method, &[self.into(), dim.into(), index.into(), src.into()])
    }
    /// `x.index_select(dim, index)`.
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        call1(&INDEX_SELECT, CallKind::Method, &[self.into(), dim.into(), index.into()])
    }
    /// `x.masked_fill(mask, value)`.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let v: Value = value.into().into();
        call1(&MASKED_FILL, CallKind::Method, &[self.into(), mask.into(), v])
    }
    /// `x.masked_fill_(mask, value)` (in place; returns `self`).
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let v: Value = value.into().into();
        call1(&MASKED_FILL_, CallKind::Method, &[self.into(), mask.into(), v])
    }
    /// `x.masked_select(mask)`.
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        call1(&MASKED_SELECT, CallKind::Method, &[self.into(), mask.into()])
    }
}
