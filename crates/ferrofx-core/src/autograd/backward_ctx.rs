//! What a backward formula sees.

use crate::error::{Error, Result};
use crate::op::OpDef;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;

/// Metadata of the tensor(s) at one argument position.
#[derive(Debug, Clone)]
pub enum MetaSlot {
    /// Not a tensor.
    None,
    /// A tensor.
    One(TensorMeta),
    /// A tensor list (`cat`, `stack`).
    List(Vec<TensorMeta>),
}

/// The context of one backward formula call.
///
/// * `arg(i)`: forward argument `i`, with saved tensors unpacked (tensors the op's
///   [`crate::op::Saves`] did not save read as `Value::None`);
/// * `input_meta(i)`: shape/dtype/strides of tensor argument `i` (always recorded);
/// * `output(i)`: saved output `i`;
/// * `grad(i)`: the gradient flowing into output `i` (`None` means zero);
/// * `needs_grad(i)`: whether argument `i` needs a gradient.
///
/// A formula returns one gradient per argument position (trailing positions may be left out,
/// non-tensor positions must be `None`), except that a `Tensor[]` argument expands to one entry
/// per list element. Formulas must be written with differentiable tensor ops (the public
/// `Tensor` API), so `create_graph` yields higher-order gradients.
pub struct BackwardCtx<'a> {
    op: &'static OpDef,
    args: &'a [Value],
    input_metas: &'a [MetaSlot],
    outputs: &'a [Option<Tensor>],
    grads: &'a [Option<Tensor>],
    needs_input_grad: &'a [bool],
}

impl<'a> BackwardCtx<'a> {
    /// Builds a context (used by the engine and by tests of formulas).
    pub fn new(
        op: &'static OpDef,
        args: &'a [Value],
        input_metas: &'a [MetaSlot],
        outputs: &'a [Option<Tensor>],
        grads: &'a [Option<Tensor>],
        needs_input_grad: &'a [bool],
    ) -> Self {
        BackwardCtx { op, args, input_metas, outputs, grads, needs_input_grad }
    }
    /// The op being differentiated.
    pub fn op(&self) -> &'static OpDef {
        self.op
    }
    /// All forward arguments (see the type docs).
    pub fn args(&self) -> &[Value] {
        self.args
    }
    /// Forward argument `i` (non-tensor arguments are always available).
    pub fn arg(&self, i: usize) -> &Value {
        self.args.get(i).unwrap_or(&Value::None)
    }
    /// Saved tensor argument `i`; an error if the op's [`crate::op::Saves`] did not save it.
    pub fn input(&self, i: usize) -> Result<&Tensor> {
        match self.args.get(i) {
            Some(Value::Tensor(t)) => Ok(t),
            _ => Err(Error::autograd(
                self.op.name,
                format!("backward formula needs input {i}, which the op's Saves mask does not save"),
            )),
        }
    }
    /// Saved tensor-list argument `i`.
    pub fn input_list(&self, i: usize) -> Result<&[Tensor]> {
        match self.args.get(i) {
            Some(Value::Tensors(t)) => Ok(t),
            _ => Err(Error::autograd(
                self.op.name,
                format!("backward formula needs tensor list {i}, which the op's Saves mask does not save"),
            )),
        }
    }
    /// Metadata (shape, dtype, strides) of tensor argument `i` (always recorded).
    pub fn input_meta(&self, i: usize) -> Result<&TensorMeta> {
        match self.input_metas.get(i) {
            Some(MetaSlot::One(m)) => Ok(m),
            _ => Err(Error::autograd(self.op.name, format!("argument {i} is not a tensor, it has no metadata"))),
        }
    }
    /// Metadata of the tensors of list argument `i`.
    pub fn input_list_metas(&self, i: usize) -> Result<&[TensorMeta]> {
        match self.input_metas.get(i) {
            Some(MetaSlot::List(m)) => Ok(m),
            _ => Err(Error::autograd(self.op.name, format!("argument {i} is not a tensor list"))),
        }
    }
    /// `true` when argument `i` was a tensor.
    pub fn is_tensor_arg(&self, i: usize) -> bool {
        matches!(self.input_metas.get(i), Some(MetaSlot::One(_)))
    }
    /// Saved output `i`; an error if not saved.
    pub fn output(&self, i: usize) -> Result<&Tensor> {
        self.outputs.get(i).and_then(|o| o.as_ref()).ok_or_else(|| {
            Error::autograd(
                self.op.name,
                format!("backward formula needs output {i}, which the op's Saves mask does not save"),
            )
        })
    }
    /// Gradient flowing into output `i` (`None`: zero / unused).
    pub fn grad(&self, i: usize) -> Option<&Tensor> {
        self.grads.get(i).and_then(|g| g.as_ref())
    }
    /// `true` when argument `i` needs a gradient (formulas may skip work otherwise).
    pub fn needs_grad(&self, i: usize) -> bool {
        self.needs_input_grad.get(i).copied().unwrap_or(false)
    }
}
