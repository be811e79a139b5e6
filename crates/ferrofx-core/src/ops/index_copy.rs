//! `index_copy(input, dim, index, source)` and the in-place `index_copy_`: slice `i` of
//! `source` along `dim` replaces slice `index[i]` of `input` (PyTorch's `index_copy`, the op
//! behind `x[idx] = v` updates along one dim). The kernel expands `index` to `source`'s shape and
//! runs `scatter`'s. Differentiable (IndexCopyBackward0): `input` gets the gradient with the
//! copied slices zeroed, `source` the gradient's slices at `index`; through a view of a tensor
//! with history the in-place form rebases the base with CopySlices.

use crate::error::{Error, Result};
use crate::layout::wrap_dim;
use crate::memory;
use crate::op::args::{int, tensor};
use crate::op::{cost_memory, ArgSpec, ArgType as T, CallKind, Category, Effect, MetaOutputs, OpDef, Outputs};
use crate::ops::inplace::{inplace_generic, inplace_meta};
use crate::ops::num::torch_name;
use crate::ops::unary::call1;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use crate::DType;
use smallvec::smallvec;

const SCHEMA: &[ArgSpec] = &[
    ArgSpec::req("input", T::Tensor),
    ArgSpec::req("dim", T::Int),
    ArgSpec::req("index", T::Tensor),
    ArgSpec::req("source", T::Tensor),
];

/// PyTorch's checks of `index_copy_` (its messages), returning the wrapped dim.
fn check(op: &str, args: &[Value]) -> Result<(usize, Tensor, Tensor, Tensor)> {
    let x = tensor(op, args, 0)?;
    let index = tensor(op, args, 2)?;
    let source = tensor(op, args, 3)?;
    let dim = int(op, args, 1)?;
    let d = wrap_dim(op, dim, x.ndim().max(1))?;
    if index.ndim() > 1 {
        return Err(Error::index(
            op,
            format!("index_copy_(): Index should have dimension 1 or 0 (got {})", index.ndim()),
        ));
    }
    if index.dtype() != DType::I64 {
        return Err(Error::dtype(
            op,
            format!("index_copy_(): Expected a long tensor for index, but got {}", torch_name(index.dtype())),
        ));
    }
    if x.dtype() != source.dtype() {
        return Err(Error::dtype(
            op,
            format!(
                "index_copy_(): self and source expected to have the same dtype, but got (self) {} and (source) {}",
                torch_name(x.dtype()),
                torch_name(source.dtype())
            ),
        ));
    }
    let (xs, ss): (Vec<usize>, Vec<usize>) = (
        if x.ndim() == 0 { vec![1] } else { x.shape().to_vec() },
        if source.ndim() == 0 { vec![1] } else { source.shape().to_vec() },
    );
    if xs.len() != ss.len() {
        return Err(Error::index(
            op,
            format!(
                "index_copy_(): When source and destination are not scalars, their dimensionality must match. Source dimensionality ({}), destination dimensionality ({})",
                source.ndim(),
                x.ndim()
            ),
        ));
    }
    for k in 0..xs.len() {
        if k != d && xs[k] != ss[k] {
            // PyTorch numbers the dims of the slice (the shape without `dim`).
            let j = if k < d { k } else { k - 1 };
            return Err(Error::shape(
                op,
                format!(
                    "index_copy_(): Source/destination tensor must have same slice shapes. Destination slice shape: {} at dimension {j} and source slice shape: {} at dimension {j}.",
                    xs[k], ss[k]
                ),
            ));
        }
    }
    if index.numel() != ss[d] {
        return Err(Error::index(
            op,
            format!(
                "index_copy_(): Number of indices ({}) should be equal to source.size(dim) ({})",
                index.numel(),
                ss[d]
            ),
        ));
    }
    Ok((d, x.clone(), index.clone(), source.clone()))
}

fn meta(op: &str, args: &[Value]) -> Result<MetaOutputs> {
    let (_, x, _, _) = check(op, args)?;
    Ok(smallvec![TensorMeta::contiguous(x.shape(), x.dtype())])
}

/// `index` expanded to `source`'s shape (entry `p` is `index[p[d]]`), bounds checked.
fn expanded_index(op: &str, index: &Tensor, shape: &[usize], d: usize, size: usize) -> Result<Tensor> {
    let idx = index.to_vec::<i64>()?;
    for &i in &idx {
        if i < 0 || i as usize >= size {
            return Err(Error::index(
                op,
                format!("index_copy_(): index {i} is out of bounds for dimension {d} with size {size}"),
            ));
        }
    }
    let inner: usize = shape[d + 1..].iter().product();
    let n: usize = shape.iter().product();
    let mut v = memory::alloc_uninit::<i64>(op, shape)?;
    for p in 0..n {
        v.push(idx[(p / inner.max(1)) % shape[d].max(1)]);
    }
    Tensor::from_vec(v, shape)
}

fn kernel(op: &str, args: &[Value]) -> Result<Outputs> {
    let (d, x, index, source) = check(op, args)?;
    let ss: Vec<usize> = if source.ndim() == 0 { vec![1] } else { source.shape().to_vec() };
    let size = if x.ndim() == 0 { 1 } else { x.shape()[d] };
    let idx = expanded_index(op, &index, &ss, d, size)?;
    let ss64: Vec<i64> = ss.iter().map(|&s| s as i64).collect();
    let x1 = if x.ndim() == 0 { x.reshape(&[1])? } else { x.clone() };
    let src1 = source.reshape(&ss64)?;
    let scatter_args = [Value::Tensor(x1), Value::Int(d as i64), Value::Tensor(idx), Value::Tensor(src1), Value::None];
    let mut out = (crate::ops::index::SCATTER.kernel)(&scatter_args)?;
    if x.ndim() == 0 {
        let r = out.remove(0).reshape(&[])?;
        return Ok(smallvec![r]);
    }
    Ok(out)
}

/// `index_copy(input, dim, index, source)`.
pub static INDEX_COPY: OpDef = OpDef {
    name: "index_copy",
    schema: SCHEMA,
    meta: |a| meta("index_copy", a),
    kernel: |a| kernel("index_copy", a),
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::Indexing,
    backward: Some(crate::autograd::formulas::index::index_copy_backward),
    saves: crate::op::Saves::inputs(0b100),
    doc: "Copies the slices of `source` along `dim` into the positions `index` of `input`.",
};

/// `index_copy_(dim, index, source)` in place.
pub static INDEX_COPY_: OpDef = OpDef {
    name: "index_copy_",
    schema: SCHEMA,
    meta: |a| inplace_meta("index_copy_", &INDEX_COPY, a),
    kernel: |a| Ok(smallvec![inplace_generic("index_copy_", &INDEX_COPY, a)?]),
    cost: cost_memory,
    effect: Effect::Mutates(0),
    category: Category::Indexing,
    backward: Some(crate::autograd::formulas::index::index_copy_backward),
    saves: crate::op::Saves::inputs(0b100),
    doc: "In-place form of `index_copy`.",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&INDEX_COPY, &INDEX_COPY_];

impl Tensor {
    /// `index_copy(dim, index, source)`: slice `i` of `source` along `dim` replaces slice
    /// `index[i]` (an int64 tensor of 0 or 1 dims).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32; 6], &[3, 2]).unwrap();
    /// let src = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    /// let i = Tensor::from_vec(vec![2i64, 0], &[2]).unwrap();
    /// assert_eq!(x.index_copy(0, &i, &src).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
    /// ```
    pub fn index_copy(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        call1(&INDEX_COPY, CallKind::Method, &[self.into(), Value::Int(dim), index.into(), source.into()])
    }
    /// `index_copy_(dim, index, source)` in place (returns `self`).
    pub fn index_copy_(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        call1(&INDEX_COPY_, CallKind::Method, &[self.into(), Value::Int(dim), index.into(), source.into()])
    }
}
