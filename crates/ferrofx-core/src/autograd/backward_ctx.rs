//! What a backward formula sees.

use crate::error::{Error, Result};
use crate::op::OpDef;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;

/// The context of one backward formula call: the forward arguments (saved tensors unpacked,
/// other tensor arguments replaced by their metadata), saved outputs, the gradients flowing in
/// for each output and which inputs need a gradient.
pub struct BackwardCtx<'a> {
    op: &'static OpDef,
    args: &'a [Value],
    input_metas: &'a [Option<TensorMeta>],
    outputs: &'a [Option<Tensor>],
    grads: &'a [Option<Tensor>],
    needs_input_grad: &'a [bool],
}

impl<'a> BackwardCtx<'a> {
    /// Builds a context (used by the engine and by tests of formulas).
    pub fn new(
        op: &'static OpDef,
        args: &'a [Value],
        input_metas: &'a [Option<TensorMeta>],
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
    /// Metadata (shape, dtype) of tensor argument `i` (always recorded).
    pub fn input_meta(&self, i: usize) -> Result<&TensorMeta> {
        self.input_metas
            .get(i)
            .and_then(|m| m.as_ref())
            .ok_or_else(|| Error::autograd(self.op.name, format!("argument {i} is not a tensor, it has no metadata")))
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
    /// `true` when input `i` needs a gradient (formulas may skip work otherwise).
    pub fn needs_grad(&self, i: usize) -> bool {
        self.needs_input_grad.get(i).copied().unwrap_or(false)
    }
}
