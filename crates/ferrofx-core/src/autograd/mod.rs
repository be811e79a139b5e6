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
//! * In-place ops: on a leaf requiring grad (or a view of one) they fail with PyTorch's
//!   message; on other tensors the history is rebased onto the in-place node; through a view,
//!   the base gets a [`CopySlices`] node and the view an [`AsStridedBackward`] (views are
//!   tracked whatever the grad mode; see `docs/autograd.md`). The overwritten tensor's
//!   original value is saved as a copy when the formula needs it.
//!
//! Backward formulas live in [`formulas`], one file per op family, and are referenced from each
//! op's `OpDef { backward, saves }`.

mod anomaly;
mod backward_ctx;
mod checkpoint;
mod checkpoint_plan;
mod copy_slices;
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
pub mod saved_hooks;
mod tensor_api;
mod view;

pub use anomaly::{detect_anomaly, is_anomaly_enabled, set_detect_anomaly, AnomalyGuard};
pub use backward_ctx::{BackwardCtx, MetaSlot};
pub use checkpoint::{
    checkpoint, checkpoint_sequential, checkpoint_with, CheckpointFn, CheckpointOptions, SequentialFn,
};
pub use checkpoint_plan::{profile_segments, CheckpointPlan, SegmentProfile};
pub use copy_slices::{AsStridedBackward, CopySlices};
pub use dot::to_dot;
pub use function::{apply_function, Function, FunctionCtx, ONCE_DIFFERENTIABLE_MSG};
pub use grad_mode::{enable_grad, is_grad_enabled, no_grad, set_grad_enabled, GradModeGuard};
pub use gradcheck::{gradcheck, gradgradcheck, GradcheckOptions};
pub use hooks::{HookFn, HookHandle, NodePostHookFn, NodePreHookFn};
pub use node::{
    next_sequence_nr, same_node, AccumulateGrad, ApplyContext, CreationInfo, Edge, GraphRoot, InputMetadata, Node,
    NodeBase, NodeRef, WeakNodeRef,
};
pub use op_node::{camel_backward_name, OpNode};
pub use saved::{legacy_type_name, SavedVariable, SECOND_BACKWARD_MSG};
pub use saved_hooks::{saved_tensors_hooks, PackHookFn, Packed, SavedTensorsHooksGuard, UnpackHookFn};
pub use view::{LEAF_VIEW_MSG, NO_GRAD_VIEW_MSG};

pub(crate) use meta::AutogradMeta;
pub(crate) use op_node::set_history;
pub(crate) use view::track_views;

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
    args.iter().enumerate().any(|(i, a)| match a {
        Value::Tensor(t) => {
            t.autograd_meta().requires_grad()
                // The target of an in-place op requires grad when its base does (a view taken
                // before the base's requires_grad_, PyTorch's `is_view() && base.requires_grad()`).
                || (i == 0 && view::is_inplace(op) && view::inplace_target_requires_grad(t))
        }
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

/// Options of [`grad_with`] (the keyword arguments of `torch.autograd.grad`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GradOptions {
    /// Keep the graph (saved tensors) after this pass.
    pub retain_graph: bool,
    /// Record the backward computation (higher-order gradients); implies `retain_graph`.
    pub create_graph: bool,
    /// Inputs the outputs do not depend on get `None` instead of an error.
    pub allow_unused: bool,
    /// Inputs the outputs do not depend on get zeros of their shape and dtype instead of
    /// `None`; implies `allow_unused` (PyTorch defaults `allow_unused` to `materialize_grads`).
    pub materialize_grads: bool,
}

/// `torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=, create_graph=,
/// allow_unused=, materialize_grads=)`.
///
/// ```
/// use ferrofx_core::{autograd::{self, GradOptions}, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
/// let unused = Tensor::from_vec(vec![0.0f32; 3], &[3]).unwrap().requires_grad_(true).unwrap();
/// let y = x.sum().unwrap();
/// // Unused inputs are an error by default...
/// assert!(autograd::grad_with(&[y.clone()], &[unused.clone()], &[None], GradOptions { retain_graph: true, ..Default::default() }).is_err());
/// // ...and zeros with materialize_grads.
/// let g = autograd::grad_with(&[y], &[x, unused], &[None], GradOptions { materialize_grads: true, ..Default::default() }).unwrap();
/// assert_eq!(g[1].as_ref().unwrap().to_vec::<f32>().unwrap(), vec![0.0; 3]);
/// ```
pub fn grad_with(
    outputs: &[Tensor],
    inputs: &[Tensor],
    grad_outputs: &[Option<Tensor>],
    opts: GradOptions,
) -> Result<Vec<Option<Tensor>>> {
    let allow_unused = opts.allow_unused || opts.materialize_grads;
    let mut gs = grad(outputs, inputs, grad_outputs, opts.retain_graph, opts.create_graph, allow_unused)?;
    if opts.materialize_grads {
        for (g, x) in gs.iter_mut().zip(inputs) {
            if g.is_none() {
                *g = Some(crate::ops::kernel::zeros(x.shape(), x.dtype())?);
            }
        }
    }
    Ok(gs)
}

/// `torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph, inputs=...)`:
/// accumulates gradients into the `.grad` of `inputs` only (leaves or non-leaves), leaving every
/// other leaf's `.grad` untouched. Inputs the tensors do not depend on keep their `.grad`.
///
/// ```
/// use ferrofx_core::{autograd, Tensor};
/// let a = Tensor::from_vec(vec![2.0f32], &[]).unwrap().requires_grad_(true).unwrap();
/// let b = Tensor::from_vec(vec![3.0f32], &[]).unwrap().requires_grad_(true).unwrap();
/// let y = a.mul(&b).unwrap();
/// autograd::backward_inputs(&[y], &[None], false, false, &[a.clone()]).unwrap();
/// assert_eq!(a.grad().unwrap().item().unwrap(), 3.0);
/// assert!(b.grad().is_none());
/// ```
pub fn backward_inputs(
    tensors: &[Tensor],
    grad_tensors: &[Option<Tensor>],
    retain_graph: bool,
    create_graph: bool,
    inputs: &[Tensor],
) -> Result<()> {
    if tensors.is_empty() {
        return Err(Error::autograd("backward", "no tensors to differentiate"));
    }
    if inputs.is_empty() {
        return Err(Error::autograd("backward", "`inputs` argument to `backward()` cannot be empty."));
    }
    let grads = engine::make_grads(tensors, Some(grad_tensors))?;
    let gs = engine::run_backward(tensors, grads, retain_graph || create_graph, create_graph, Some(inputs), true)?;
    for (x, g) in inputs.iter().zip(gs) {
        if let Some(g) = g {
            engine::accumulate_into_grad(x, g, create_graph)?;
        }
    }
    Ok(())
}
