//! Views and shape changes: `view`, `reshape`, `transpose`, `permute`, `narrow`, `select`,
//! `slice`, `expand`, `squeeze`, `unsqueeze`, `flatten`, `contiguous`, and the dtype conversion
//! `to`. Views share storage (and so the version counter); `reshape` and `contiguous` copy only
//! when the strides require it.

use crate::autograd::formulas::view as fm;
use crate::error::{Error, Result};
use crate::layout::{infer_shape, Layout};
use crate::op::args::{int, ints, opt_dtype, opt_int, tensor};
use crate::op::{
    cost_free, cost_memory, dispatch, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs,
    OpDef, Outputs, Saves,
};
use crate::ops::kernel;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

fn meta_layout(op: &str, t: &Tensor) -> Result<Layout> {
    match t.layout() {
        Some(l) => Ok(l.clone()),
        None => {
            let m = t.meta().ok_or_else(|| Error::trace(op, "shape of a symbolic tensor is unknown"))?;
            Ok(Layout::from_parts(m.shape, m.strides, 0))
        }
    }
}

fn meta_of(l: &Layout, t: &Tensor) -> MetaOutputs {
    smallvec![TensorMeta { shape: l.shape().into(), dtype: t.dtype(), strides: l.strides().into() }]
}

/// Defines a view op whose output layout is computed from the input layout by `$f`.
macro_rules! view_op {
    ($static:ident, $name:literal, $schema:expr, $doc:literal, $bw:expr, |$op:ident, $args:ident, $l:ident| $f:expr) => {
        #[doc = $doc]
        pub static $static: OpDef = OpDef {
            name: $name,
            schema: $schema,
            meta: |$args| {
                let t = tensor($name, $args, 0)?;
                let $l = meta_layout($name, t)?;
                let $op = $name;
                let out: Layout = $f?;
                Ok(meta_of(&out, t))
            },
            kernel: |$args| {
                let t = tensor($name, $args, 0)?;
                let $l = meta_layout($name, t)?;
                let $op = $name;
                let out: Layout = $f?;
                Ok(smallvec![t.view_with_layout($name, out)?])
            },
            cost: cost_free,
            effect: Effect::Pure,
            category: Category::View,
            backward: Some($bw),
            saves: Saves::NOTHING,
            doc: $doc,
        };
    };
}

const SELF_ONLY: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor)];

view_op!(
    VIEW,
    "view",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("size", T::IntList)],
    "A view with another shape; fails when the strides do not allow it (use reshape).",
    fm::reshape_backward,
    |op, args, l| {
        let sizes = ints(op, args, 1)?;
        let shape = infer_shape(op, &sizes, l.numel(), l.shape())?;
        l.view_as(&shape).ok_or_else(|| Error::shape(op, format!(
            "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces): shape {:?}, strides {:?}, requested {sizes:?}. Use .reshape(...) instead.",
            l.shape(), l.strides())))
    }
);

view_op!(
    TRANSPOSE,
    "transpose",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim0", T::Int), ArgSpec::req("dim1", T::Int)],
    "Swaps two dimensions (a view).",
    fm::transpose_backward,
    |op, args, l| l.transpose(op, int(op, args, 1)?, int(op, args, 2)?)
);

view_op!(T_, "t", SELF_ONLY, "Transposes a tensor of at most 2 dims (a view).", fm::t_backward, |op, _args, l| if l
    .ndim()
    > 2
{
    Err(Error::shape(
        op,
        format!(
            "t() expects a tensor with <= 2 dimensions, but self is {}D (shape {:?}); use transpose(dim0, dim1)",
            l.ndim(),
            l.shape()
        ),
    ))
} else if l.ndim() < 2 {
    Ok(l.clone())
} else {
    l.transpose(op, 0, 1)
});

view_op!(
    PERMUTE,
    "permute",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dims", T::IntList)],
    "Reorders dimensions (a view).",
    fm::permute_backward,
    |op, args, l| l.permute(op, &ints(op, args, 1)?)
);

view_op!(
    NARROW,
    "narrow",
    &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("dim", T::Int),
        ArgSpec::req("start", T::Int),
        ArgSpec::req("length", T::Int)
    ],
    "Elements start..start+length along dim (a view).",
    fm::narrow_backward,
    |op, args, l| l.narrow(op, int(op, args, 1)?, int(op, args, 2)?, int(op, args, 3)?)
);

view_op!(
    SELECT,
    "select",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::req("index", T::Int)],
    "Element index along dim, removing dim (a view).",
    fm::select_backward_formula,
    |op, args, l| l.select(op, int(op, args, 1)?, int(op, args, 2)?)
);

view_op!(
    SLICE,
    "slice",
    &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::opt("dim", T::Int, D::Int(0)),
        ArgSpec::opt("start", T::OptInt, D::None),
        ArgSpec::opt("end", T::OptInt, D::None),
        ArgSpec::opt("step", T::Int, D::Int(1))
    ],
    "Python slicing start:end:step along dim (a view).",
    fm::slice_backward_formula,
    |op, args, l| l.slice(op, int(op, args, 1)?, opt_int(op, args, 2)?, opt_int(op, args, 3)?, int(op, args, 4)?)
);

view_op!(
    EXPAND,
    "expand",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("size", T::IntList)],
    "Broadcasts size-1 dims to the given sizes without copying (a view).",
    fm::expand_backward,
    |op, args, l| l.expand(op, &ints(op, args, 1)?)
);

view_op!(
    SQUEEZE,
    "squeeze",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("dim", T::OptIntList, D::None)],
    "Removes size-1 dims (all, or the listed ones) (a view).",
    fm::reshape_backward,
    |op, args, l| l.squeeze(op, crate::op::args::opt_ints(op, args, 1)?.as_deref())
);

view_op!(
    UNSQUEEZE,
    "unsqueeze",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int)],
    "Inserts a size-1 dim (a view).",
    fm::unsqueeze_backward,
    |op, args, l| l.unsqueeze(op, int(op, args, 1)?)
);

/// The layout of `unflatten(dim, sizes)`: `dim` split into `sizes` (one may be `-1`), each new
/// dim striding over the old one's elements in row-major order.
fn unflatten_layout(op: &str, l: &Layout, dim: i64, sizes: &[i64]) -> Result<Layout> {
    if sizes.is_empty() {
        return Err(Error::argument(op, "unflatten: sizes must be non-empty (pass the sizes dim is split into)"));
    }
    let d = crate::layout::wrap_dim(op, dim, l.ndim())?;
    if l.ndim() == 0 {
        return Err(Error::index(op, "unflatten needs a tensor of at least 1 dim, got a 0-dim tensor"));
    }
    let size = l.shape()[d];
    let split = infer_shape(op, sizes, size, &[size]).map_err(|_| {
        Error::shape(
            op,
            format!(
                "unflatten: Provided sizes {sizes:?} don't multiply up to the size of dim {dim} ({size}) in the input tensor of shape {:?}",
                l.shape()
            ),
        )
    })?;
    let stride = l.strides()[d];
    let mut shape: crate::layout::Shape = l.shape()[..d].into();
    let mut strides: crate::layout::Strides = l.strides()[..d].into();
    let mut inner = stride;
    let mut new_strides = vec![0usize; split.len()];
    for (k, &s) in split.iter().enumerate().rev() {
        new_strides[k] = inner;
        inner = inner.saturating_mul(s);
    }
    shape.extend_from_slice(&split);
    strides.extend_from_slice(&new_strides);
    shape.extend_from_slice(&l.shape()[d + 1..]);
    strides.extend_from_slice(&l.strides()[d + 1..]);
    Ok(Layout::from_parts(shape, strides, l.offset()))
}

view_op!(
    UNFLATTEN,
    "unflatten",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::req("sizes", T::IntList)],
    "Splits dim into the given sizes, one of which may be -1 (a view; the inverse of flatten).",
    fm::reshape_backward,
    |op, args, l| unflatten_layout(op, &l, int(op, args, 1)?, &ints(op, args, 2)?)
);

fn reshape_shape(op: &str, args: &[Value], l: &Layout) -> Result<crate::layout::Shape> {
    infer_shape(op, &ints(op, args, 1)?, l.numel(), l.shape())
}

fn flatten_sizes(op: &str, args: &[Value], l: &Layout) -> Result<Vec<i64>> {
    let n = l.ndim();
    if n == 0 {
        return Ok(vec![1]);
    }
    let s = crate::layout::wrap_dim(op, int(op, args, 1)?, n)?;
    let e = crate::layout::wrap_dim(op, int(op, args, 2)?, n)?;
    if s > e {
        return Err(Error::argument(
            op,
            format!("flatten() has invalid args: start_dim ({s}) cannot come after end_dim ({e})"),
        ));
    }
    let mut sizes: Vec<i64> = l.shape()[..s].iter().map(|&d| d as i64).collect();
    sizes.push(l.shape()[s..=e].iter().product::<usize>() as i64);
    sizes.extend(l.shape()[e + 1..].iter().map(|&d| d as i64));
    Ok(sizes)
}

fn reshape_to(op: &str, t: &Tensor, l: &Layout, shape: &[usize]) -> Result<Tensor> {
    match l.view_as(shape) {
        Some(v) => t.view_with_layout(op, v),
        None => {
            let c = kernel::contiguous(t)?;
            let cl = Layout::contiguous(shape);
            c.view_with_layout(op, cl)
        }
    }
}

/// `reshape`: a view when possible, otherwise a contiguous copy.
pub static RESHAPE: OpDef = OpDef {
    name: "reshape",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("shape", T::IntList)],
    meta: |args| {
        let t = tensor("reshape", args, 0)?;
        let l = meta_layout("reshape", t)?;
        let shape = reshape_shape("reshape", args, &l)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, t.dtype())])
    },
    kernel: |args| {
        let t = tensor("reshape", args, 0)?;
        let l = meta_layout("reshape", t)?;
        let shape = reshape_shape("reshape", args, &l)?;
        Ok(smallvec![reshape_to("reshape", t, &l, &shape)?])
    },
    cost: cost_free,
    effect: Effect::Pure,
    category: Category::View,
    backward: Some(fm::reshape_backward),
    saves: Saves::NOTHING,
    doc: "Another shape with the same elements; copies only when a view is impossible.",
};

/// `flatten(start_dim, end_dim)`: merges a range of dims (a view when possible).
pub static FLATTEN: OpDef = OpDef {
    name: "flatten",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::opt("start_dim", T::Int, D::Int(0)),
        ArgSpec::opt("end_dim", T::Int, D::Int(-1)),
    ],
    meta: |args| {
        let t = tensor("flatten", args, 0)?;
        let l = meta_layout("flatten", t)?;
        let sizes: Vec<usize> = flatten_sizes("flatten", args, &l)?.iter().map(|&s| s as usize).collect();
        Ok(smallvec![TensorMeta::contiguous(&sizes, t.dtype())])
    },
    kernel: |args| {
        let t = tensor("flatten", args, 0)?;
        let l = meta_layout("flatten", t)?;
        let sizes: Vec<usize> = flatten_sizes("flatten", args, &l)?.iter().map(|&s| s as usize).collect();
        Ok(smallvec![reshape_to("flatten", t, &l, &sizes)?])
    },
    cost: cost_free,
    effect: Effect::Pure,
    category: Category::View,
    backward: Some(fm::reshape_backward),
    saves: Saves::NOTHING,
    doc: "Merges dims start_dim..=end_dim into one.",
};

/// `contiguous`: the same tensor when already contiguous, otherwise a row-major copy.
pub static CONTIGUOUS: OpDef = OpDef {
    name: "contiguous",
    schema: SELF_ONLY,
    meta: |args| {
        let t = tensor("contiguous", args, 0)?;
        let l = meta_layout("contiguous", t)?;
        Ok(smallvec![TensorMeta::contiguous(l.shape(), t.dtype())])
    },
    kernel: |args| Ok(smallvec![kernel::contiguous(tensor("contiguous", args, 0)?)?]),
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::View,
    backward: Some(fm::identity_backward),
    saves: Saves::NOTHING,
    doc: "A row-major copy, or the tensor itself when already contiguous.",
};

/// `clone`: a new tensor with its own storage holding a copy of the elements (row-major);
/// its backward passes the gradient through (`CloneBackward0`). Reached from Rust as
/// [`Tensor::clone_tensor`] (`Tensor::clone` is Rust's cheap handle clone).
pub static CLONE: OpDef = OpDef {
    name: "clone",
    schema: SELF_ONLY,
    meta: |args| {
        let t = tensor("clone", args, 0)?;
        let l = meta_layout("clone", t)?;
        Ok(smallvec![TensorMeta::contiguous(l.shape(), t.dtype())])
    },
    kernel: |args| Ok(smallvec![kernel::clone(tensor("clone", args, 0)?)?]),
    cost: cost_memory,
    effect: Effect::Pure,
    category: Category::View,
    backward: Some(fm::identity_backward),
    saves: Saves::NOTHING,
    doc: "A copy of the tensor in new storage (PyTorch's clone).",
};

/// `to(dtype)`: converts elements (PyTorch's casting rules); the same tensor if already `dtype`.
pub static TO: OpDef = OpDef {
    name: "to",
    schema: &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dtype", T::DType)],
    meta: |args| {
        let t = tensor("to", args, 0)?;
        let d = opt_dtype("to", args, 1)?.ok_or_else(|| Error::argument("to", "dtype is required"))?;
        Ok(smallvec![TensorMeta::contiguous(t.shape(), d)])
    },
    kernel: |args| {
        let t = tensor("to", args, 0)?;
        let d = opt_dtype("to", args, 1)?.ok_or_else(|| Error::argument("to", "dtype is required"))?;
        Ok(smallvec![kernel::cast(t, d)?])
    },
    cost: crate::op::cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: Some(fm::to_backward),
    saves: Saves::NOTHING,
    doc: "Converts to another dtype.",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &VIEW,
    &RESHAPE,
    &TRANSPOSE,
    &T_,
    &PERMUTE,
    &NARROW,
    &SELECT,
    &SLICE,
    &EXPAND,
    &SQUEEZE,
    &UNSQUEEZE,
    &FLATTEN,
    &UNFLATTEN,
    &CONTIGUOUS,
    &CLONE,
    &TO,
];

#[inline]
fn one(op: &'static OpDef, args: &[Value]) -> Result<Tensor> {
    let mut out: Outputs = dispatch(op, CallKind::Method, args)?;
    out.pop().ok_or_else(|| Error::schema(op.name, "op returned no output"))
}

impl Tensor {
    /// `view(size)`: same data, another shape; `-1` infers one size. Fails when the strides do
    /// not allow a view (then use [`Tensor::reshape`]).
    pub fn view(&self, size: &[i64]) -> Result<Tensor> {
        one(&VIEW, &[self.into(), Value::Ints(size.to_vec())])
    }
    /// `reshape(shape)`: a view when possible, else a copy.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        one(&RESHAPE, &[self.into(), Value::Ints(shape.to_vec())])
    }
    /// `transpose(dim0, dim1)` (a view).
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        one(&TRANSPOSE, &[self.into(), Value::Int(dim0), Value::Int(dim1)])
    }
    /// `t()`: transpose of a ≤2-D tensor (a view).
    pub fn t(&self) -> Result<Tensor> {
        one(&T_, &[self.into()])
    }
    /// `permute(dims)` (a view).
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        one(&PERMUTE, &[self.into(), Value::Ints(dims.to_vec())])
    }
    /// `narrow(dim, start, length)` (a view).
    pub fn narrow(&self, dim: i64, start: i64, length: i64) -> Result<Tensor> {
        one(&NARROW, &[self.into(), Value::Int(dim), Value::Int(start), Value::Int(length)])
    }
    /// `select(dim, index)` (a view without `dim`).
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        one(&SELECT, &[self.into(), Value::Int(dim), Value::Int(index)])
    }
    /// `x[.., start:end:step, ..]` along `dim` (a view).
    pub fn slice(&self, dim: i64, start: Option<i64>, end: Option<i64>, step: i64) -> Result<Tensor> {
        one(&SLICE, &[self.into(), Value::Int(dim), start.into(), end.into(), Value::Int(step)])
    }
    /// `expand(size)`: broadcast without copying; `-1` keeps a size (a view).
    pub fn expand(&self, size: &[i64]) -> Result<Tensor> {
        one(&EXPAND, &[self.into(), Value::Ints(size.to_vec())])
    }
    /// `squeeze()`: removes every size-1 dim (a view).
    pub fn squeeze(&self) -> Result<Tensor> {
        one(&SQUEEZE, &[self.into(), Value::None])
    }
    /// `squeeze(dim)`: removes `dim` if its size is 1 (a view).
    pub fn squeeze_dim(&self, dim: i64) -> Result<Tensor> {
        one(&SQUEEZE, &[self.into(), Value::Ints(vec![dim])])
    }
    /// `unsqueeze(dim)` (a view).
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        one(&UNSQUEEZE, &[self.into(), Value::Int(dim)])
    }
    /// `flatten(start_dim, end_dim)`.
    pub fn flatten(&self, start_dim: i64, end_dim: i64) -> Result<Tensor> {
        one(&FLATTEN, &[self.into(), Value::Int(start_dim), Value::Int(end_dim)])
    }
    /// `unflatten(dim, sizes)`: splits `dim` into `sizes` (one may be `-1`), a view.
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec((0..12).map(|i| i as f32).collect(), &[2, 6]).unwrap();
    /// let y = x.unflatten(1, &[3, -1]).unwrap();
    /// assert_eq!(y.shape(), &[2, 3, 2]);
    /// assert!(y.shares_storage(&x));
    /// ```
    pub fn unflatten(&self, dim: i64, sizes: &[i64]) -> Result<Tensor> {
        one(&UNFLATTEN, &[self.into(), Value::Int(dim), Value::Ints(sizes.to_vec())])
    }
    /// `contiguous()`: copies only when not already contiguous.
    pub fn contiguous(&self) -> Result<Tensor> {
        one(&CONTIGUOUS, &[self.into()])
    }
    /// PyTorch's `clone()`: a copy of the elements in new storage, recorded by autograd as
    /// `CloneBackward0`. (Rust's [`Clone::clone`] on a `Tensor` is a cheap handle copy that
    /// shares storage and history; this is the tensor operation.)
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    /// let y = x.clone_tensor().unwrap();
    /// assert!(!y.shares_storage(&x));
    /// assert_eq!(y.grad_fn().unwrap().name(), "CloneBackward0");
    /// ```
    pub fn clone_tensor(&self) -> Result<Tensor> {
        one(&CLONE, &[self.into()])
    }
    /// `to(dtype)`.
    pub fn to_dtype(&self, dtype: crate::DType) -> Result<Tensor> {
        one(&TO, &[self.into(), Value::DType(dtype)])
    }
}

#[cfg(test)]
mod tests {
    use crate::Tensor;

    #[test]
    fn views_share_storage_and_reshape_copies_when_needed() {
        let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]).unwrap();
        let v = x.view(&[3, 2]).unwrap();
        assert!(v.shares_storage(&x));
        let t = x.t().unwrap();
        assert!(t.view(&[6]).is_err());
        let r = t.reshape(&[6]).unwrap();
        assert!(!r.shares_storage(&x));
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let f = x.flatten(0, -1).unwrap();
        assert!(f.shares_storage(&x));
    }

    #[test]
    fn view_error_names_op_and_shapes() {
        let x = Tensor::from_vec(vec![0f32; 6], &[2, 3]).unwrap();
        let e = x.view(&[4, -1]).unwrap_err().to_string();
        assert_eq!(e, "view: shape error: shape '[4, -1]' is invalid for input of size 6 (input shape [2, 3])");
    }
}
