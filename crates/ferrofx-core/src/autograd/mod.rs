//! Eager autograd (seed 004): the graph PyTorch builds during forward, and its engine.
//!
//! * Every op dispatched while grad mode is on and some input requires grad gets a backward
//!   [`Node`] (`MulBackward0`, `ViewBackward0`, ...) whose [`Edge`]s point at the inputs'
//!   `grad_fn` (with `output_nr`) or at their leaf's [`AccumulateGrad`] (created once, cached
//!   weakly on the leaf); inputs that do not require grad give invalid edges.
//! * Saved tensors are [`SavedVariable`]s recording the storage version counter at save time;
//!   unpacking after an in-place change fails with PyTorch's message.
//! * The engine ([`backward`], [`grad`], [`Tensor::backward`]) counts dependencies over the
//!   reachable graph, runs ready nodes by decreasing `sequence_nr`, sums gradients arriving on
//!   several edges in per-node input buffers, and is iterative (graph construction, backward
//!   and teardown all use explicit stacks: a 1,000,000-node chain is fine).
//! * Without `retain_graph`, saved tensors are freed as nodes run; a second backward through
//!   a node that saved tensors fails with PyTorch's message.
//! * In-place ops: on a leaf requiring grad they fail (PyTorch's message); on other tensors the
//!   history is rebased onto the in-place node. **In-place ops on differentiable views** (a
//!   view of a tensor requiring grad, taken while recording) **are rejected with an error**:
//!   ferrofx does not implement PyTorch's CopySlices rebase of the base. Likewise, views taken
//!   from a base *before* an in-place op on that base keep their old history.
//!
//! Backward formulas live in [`formulas`], one file per op family, and are referenced from each
//! op's `OpDef { backward, saves }`.

mod anomaly;
mod backward_ctx;
pub mod dot;
mod engine;
pub mod formulas;
mod function;
mod grad_mode;
pub mod gradcheck;
mod hooks;
mod meta;
mod node;
mod op_node;
mod raw;
mod saved;
mod tensor_api;

pub use anomaly::{detect_anomaly, is_anomaly_enabled, set_detect_anomaly, AnomalyGuard};
pub use backward_ctx::{BackwardCtx, MetaSlot};
pub use dot::to_dot;
pub use function::{apply_function, Function, FunctionCtx};
pub use grad_mode::{enable_grad, is_grad_enabled, no_grad, set_grad_enabled, GradModeGuard};
pub use gradcheck::{gradcheck, gradgradcheck, GradcheckOptions};
pub use hooks::{HookFn, HookHandle};
pub use node::{
    next_sequence_nr, same_node, AccumulateGrad, ApplyContext, CreationInfo, Edge, GraphRoot, InputMetadata, Node,
    NodeBase, NodeRef, WeakNodeRef,
};
pub use op_node::{camel_backward_name, OpNode};
pub use saved::{legacy_type_name, SavedVariable, SECOND_BACKWARD_MSG};

pub(crate) use meta::AutogradMeta;
pub(crate) use op_node::set_history;

use crate::error::{Error, Result};
use crate::op::{OpDef, Outputs};
use crate::tensor::Tensor;
use crate::value::Value;

/// `true` when `op` must record history: grad mode on and some tensor input requires grad.
#[inline]
pub(crate) fn needs_grad(op: &'static OpDef, args: &[Value]) -> bool {
    if !is_grad_enabled() {
        return false;
    }
    let _ = op;
    args.iter().any(|a| match a {
        Value::Tensor(t) => t.autograd_meta().requires_grad(),
        Value::Tensors(ts) => ts.iter().any(|t| t.autograd_meta().requires_grad()),
        _ => false,
    })
}

pub(crate) fn dispatch_with_grad(op: &'static OpDef, args: &[Value]) -> Result<Outputs> {
    op_node::dispatch_with_grad(op, args)
}

/// `torch.autograd.backward`: accumulates the gradients of `tensors` (weighted by
/// `grad_tensors`, required for non-scalar outputs) into the leaves' `.grad`.
/// `create_graph` records the backward computation (higher-order gradients) and implies
/// `retain_graph`.
pub fn backward(
    tensors: &[Tensor],
    grad_tensors: &[Option<Tensor>],
    retain_graph: bool,
    create_graph: bool,
) -> Result<()> {
    if tensors.is_empty() {
        return Err(Error::autograd("backward", "no tensors to differentiate"));
    }
    let grads = engine::make_grads(tensors, Some(grad_tensors))?;
    engine::run_backward(tensors, grads, retain_graph || create_graph, create_graph, None, true)?;
    Ok(())
}

/// `torch.autograd.grad`: the gradients of `outputs` with respect to `inputs` (returned, not
/// accumulated into `.grad`). Inputs the outputs do not depend on are an error unless
/// `allow_unused` (then their gradient is `None`).
///
/// ```
/// use ferrofx_core::{autograd, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap().requires_grad_(true).unwrap();
/// let y = x.t().unwrap();
/// let g = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// let gx = autograd::grad(&[y], &[x.clone()], &[Some(g)], false, false, false).unwrap();
/// assert_eq!(gx[0].as_ref().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
/// assert!(x.grad().is_none());
/// ```
pub fn grad(
    outputs: &[Tensor],
    inputs: &[Tensor],
    grad_outputs: &[Option<Tensor>],
    retain_graph: bool,
    create_graph: bool,
    allow_unused: bool,
) -> Result<Vec<Option<Tensor>>> {
    if outputs.is_empty() {
        return Err(Error::autograd("grad", "no outputs to differentiate"));
    }
    let grads = engine::make_grads(outputs, Some(grad_outputs))?;
    engine::run_backward(outputs, grads, retain_graph || create_graph, create_graph, Some(inputs), allow_unused)
}
