//! `clamp_min(input, min)` / `clamp_max(input, max)` and their in-place forms `clamp_min_` /
//! `clamp_max_`: `clamp` with one bound (a number or a tensor, broadcast), as registry ops of
//! their own so that autograd records PyTorch's nodes (`ClampMinBackward0` for a number bound,
//! `ClampMinBackward1` for a tensor bound, likewise `ClampMax...`) with their gradient
//! conventions (`autograd/formulas/elementwise.rs`). The kernels are `clamp`'s.

use crate::error::{Error, Result};
use crate::op::{cost_elementwise, ArgSpec, ArgType as T, CallKind, Category, Effect, MetaOutputs, OpDef, Outputs};
use crate::ops::inplace::{inplace_generic, inplace_meta};
use crate::ops::unary::{call1, CLAMP};
use crate::tensor::Tensor;
use crate::value::Value;
use smallvec::smallvec;

const MIN_SCHEMA: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::req("min", T::TensorOrScalar)];
const MAX_SCHEMA: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::req("max", T::TensorOrScalar)];

/// `clamp`'s arguments for a one-bound op: `(input, bound, None)` or `(input, None, bound)`.
fn clamp_args(op: &str, args: &[Value], upper: bool) -> Result<[Value; 3]> {
    let (Some(x), Some(b)) = (args.first(), args.get(1)) else {
        return Err(Error::schema(
            op,
            format!("{op}() takes 2 arguments (input, {}), got {}", bound_name(upper), args.len()),
        ));
    };
    if matches!(b, Value::None) {
        return Err(Error::argument(
            op,
            format!("{op}: the bound '{}' must be a number or a tensor, got None", bound_name(upper)),
        ));
    }
    Ok(if upper { [x.clone(), Value::None, b.clone()] } else { [x.clone(), b.clone(), Value::None] })
}

fn bound_name(upper: bool) -> &'static str {
    if upper {
        "max"
    } else {
        "min"
    }
}

/// Errors raised by `clamp`'s meta/kernel, renamed to the op the user called.
fn renamed(op: &str, e: Error) -> Error {
    if e.op() == "clamp" {
        Error::new(e.kind(), op, e.message())
    } else {
        e
    }
}

fn meta(op: &str, args: &[Value], upper: bool) -> Result<MetaOutputs> {
    (CLAMP.meta)(&clamp_args(op, args, upper)?).map_err(|e| renamed(op, e))
}

fn kernel(op: &str, args: &[Value], upper: bool) -> Result<Outputs> {
    (CLAMP.kernel)(&clamp_args(op, args, upper)?).map_err(|e| renamed(op, e))
}

/// `clamp_min(input, min)`: `max(input, min)` elementwise (NaN in `input` propagates).
pub static CLAMP_MIN: OpDef = OpDef {
    name: "clamp_min",
    schema: MIN_SCHEMA,
    meta: |a| meta("clamp_min", a, false),
    kernel: |a| kernel("clamp_min", a, false),
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: crate::autograd::formulas::elementwise::backward_for("clamp_min"),
    saves: crate::autograd::formulas::elementwise::saves_for("clamp_min"),
    doc: "Clamps every element to at least `min` (a number or a tensor).",
};

/// `clamp_max(input, max)`: `min(input, max)` elementwise (NaN in `input` propagates).
pub static CLAMP_MAX: OpDef = OpDef {
    name: "clamp_max",
    schema: MAX_SCHEMA,
    meta: |a| meta("clamp_max", a, true),
    kernel: |a| kernel("clamp_max", a, true),
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: crate::autograd::formulas::elementwise::backward_for("clamp_max"),
    saves: crate::autograd::formulas::elementwise::saves_for("clamp_max"),
    doc: "Clamps every element to at most `max` (a number or a tensor).",
};

/// In-place `clamp_min_(min)`.
pub static CLAMP_MIN_: OpDef = OpDef {
    name: "clamp_min_",
    schema: MIN_SCHEMA,
    meta: |a| inplace_meta("clamp_min_", &CLAMP_MIN, a),
    kernel: |a| Ok(smallvec![inplace_generic("clamp_min_", &CLAMP_MIN, a)?]),
    cost: cost_elementwise,
    effect: Effect::Mutates(0),
    category: Category::Elementwise,
    backward: crate::autograd::formulas::elementwise::backward_for("clamp_min_"),
    saves: crate::autograd::formulas::elementwise::saves_for("clamp_min_"),
    doc: "In-place form of `clamp_min` (writes into `input`).",
};

/// In-place `clamp_max_(max)`.
pub static CLAMP_MAX_: OpDef = OpDef {
    name: "clamp_max_",
    schema: MAX_SCHEMA,
    meta: |a| inplace_meta("clamp_max_", &CLAMP_MAX, a),
    kernel: |a| Ok(smallvec![inplace_generic("clamp_max_", &CLAMP_MAX, a)?]),
    cost: cost_elementwise,
    effect: Effect::Mutates(0),
    category: Category::Elementwise,
    backward: crate::autograd::formulas::elementwise::backward_for("clamp_max_"),
    saves: crate::autograd::formulas::elementwise::saves_for("clamp_max_"),
    doc: "In-place form of `clamp_max` (writes into `input`).",
};

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&CLAMP_MIN, &CLAMP_MAX, &CLAMP_MIN_, &CLAMP_MAX_];

impl Tensor {
    /// `clamp_min(min)`: each element at least `min` (a number or a tensor, broadcast). Under
    /// autograd the node is `ClampMinBackward0` (number) or `ClampMinBackward1` (tensor), as in
    /// PyTorch.
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f32, 1.0, 2.0], &[3]).unwrap().requires_grad_(true).unwrap();
    /// let y = x.clamp_min(1.0).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 2.0]);
    /// assert_eq!(y.grad_fn().unwrap().name(), "ClampMinBackward0");
    /// y.sum().unwrap().backward(None, false, false).unwrap();
    /// // PyTorch 2.15: tensor([0., 0., 1.]) (no gradient at the bound)
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0]);
    /// ```
    pub fn clamp_min(&self, min: impl Into<Value>) -> Result<Tensor> {
        call1(&CLAMP_MIN, CallKind::Method, &[self.into(), min.into()])
    }
    /// `clamp_max(max)`: each element at most `max` (a number or a tensor, broadcast); node
    /// `ClampMaxBackward0` / `ClampMaxBackward1`.
    pub fn clamp_max(&self, max: impl Into<Value>) -> Result<Tensor> {
        call1(&CLAMP_MAX, CallKind::Method, &[self.into(), max.into()])
    }
    /// `clamp_min_(min)` in place.
    pub fn clamp_min_(&self, min: impl Into<Value>) -> Result<Tensor> {
        call1(&CLAMP_MIN_, CallKind::Method, &[self.into(), min.into()])
    }
    /// `clamp_max_(max)` in place.
    pub fn clamp_max_(&self, max: impl Into<Value>) -> Result<Tensor> {
        call1(&CLAMP_MAX_, CallKind::Method, &[self.into(), max.into()])
    }
}
