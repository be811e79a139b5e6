//! Eager autograd (seed 004): autograd metadata on tensors and the context backward formulas
//! receive. The engine itself (Node, Edge, GraphRoot, AccumulateGrad, SavedVariable) is built
//! on these.

mod backward_ctx;
mod grad_mode;
mod meta;

pub use backward_ctx::BackwardCtx;
pub use grad_mode::{is_grad_enabled, no_grad, set_grad_enabled, GradModeGuard};
pub(crate) use meta::AutogradMeta;

use crate::error::Result;
use crate::op::{OpDef, Outputs};
use crate::value::Value;

/// `true` when `op` must record history: grad mode on, op differentiable, and some tensor input
/// requires grad.
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
    // Filled by the autograd engine; until then no tensor can require grad (there is no public
    // way to set the flag), so this path is unreachable.
    crate::op::run_kernel(op, args)
}
