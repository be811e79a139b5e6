//! View tracking (PyTorch's `DifferentiableViewMeta`): every output of a view op that shares
//! storage with its input remembers its root base, how it was created, and the version at which
//! its `grad_fn` was last set, whatever the grad mode at creation. This drives:
//!
//! * PyTorch's errors for in-place ops on views that cannot be recorded (a view of a leaf that
//!   requires grad, a view created under `no_grad` modified with grad mode on, an output of a
//!   function returning several views);
//! * the CopySlices rebase of the base when an in-place op writes through a view
//!   ([`super::copy_slices`]);
//! * the regeneration of a view's `grad_fn` (`AsStridedBackward0`) after its base or a sibling
//!   view was modified in place.

use super::copy_slices::AsStridedBackward;
use super::node::Edge;
use crate::error::{Error, Result};
use crate::op::{Category, OpDef, Outputs};
use crate::tensor::Tensor;
use crate::value::Value;
use std::sync::Arc;

/// How a view was created (PyTorch's `CreationMeta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Creation {
    /// A view op run with grad mode on.
    Default,
    /// A view op run with grad mode off.
    NoGradMode,
    /// Output `nr` of a view op that returns several views (`split`, `chunk`, `unbind`...).
    MultipleViews { op: &'static str, nr: u32 },
}

/// The view half of a tensor's autograd metadata.
pub(crate) struct ViewInfo {
    /// The root base (never itself a view).
    pub(crate) base: Tensor,
    pub(crate) creation: Creation,
    /// Storage version when the view's `grad_fn` was set (or the view created).
    pub(crate) attr_version: u64,
}

/// PyTorch's message for a view created under `no_grad` and modified in place with grad mode on.
pub const NO_GRAD_VIEW_MSG: &str = "A view was created in no_grad mode and is being modified inplace with grad mode enabled. Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by moving both the view and the inplace either both inside the no_grad block (if you don't want the inplace to be tracked) or both outside (if you want the inplace to be tracked).";

/// PyTorch's message for an in-place op on a view of a leaf requiring grad.
pub const LEAF_VIEW_MSG: &str = "a view of a leaf Variable that requires grad is being used in an in-place operation.";

/// `true` when `op` is an in-place op whose output is its first argument (`add_`, `copy_`...).
#[inline]
pub(crate) fn is_inplace(op: &OpDef) -> bool {
    matches!(op.effect, crate::op::Effect::Mutates(0)) && op.name.ends_with('_')
}

/// The root base of `t` and how `t` was created, when `t` is a view.
pub(crate) fn view_of(t: &Tensor) -> Option<(Tensor, Creation)> {
    let m = t.autograd_meta().lock();
    m.view.as_ref().map(|v| (v.base.clone(), v.creation))
}

/// Records the outputs of a view op that share storage with its input as views of the input's
/// root base. Called by dispatch for every eager view op (with or without grad), so it is kept
/// cheap: the view record is stored inline in the output's autograd meta (no allocation), and
/// a fresh output nobody else holds is written without taking its lock.
#[inline]
pub(crate) fn track_views(op: &'static OpDef, args: &[Value], outs: &mut Outputs) {
    if op.category != Category::View {
        return;
    }
    if let Some(Value::Tensor(inp)) = args.first() {
        track_views_of(op, inp, outs);
    }
}

fn track_views_of(op: &'static OpDef, inp: &Tensor, outs: &mut Outputs) {
    if inp.is_symbolic() {
        return;
    }
    let base = match view_of(inp) {
        Some((b, _)) => b,
        None => inp.clone(),
    };
    let grad_mode = super::is_grad_enabled();
    let multi = outs.len() > 1;
    for (j, o) in outs.iter_mut().enumerate() {
        if o.same(inp) || !o.shares_storage(inp) {
            continue;
        }
        let creation = if !grad_mode {
            Creation::NoGradMode
        } else if multi {
            Creation::MultipleViews { op: op.name, nr: j as u32 }
        } else {
            Creation::Default
        };
        let info = ViewInfo { base: base.clone(), creation, attr_version: o.version() };
        match Arc::get_mut(&mut o.0) {
            // A fresh output (the common case): no other handle, no lock needed.
            Some(imp) => imp.autograd.inner_mut().view = Some(info),
            None => o.autograd_meta().lock().view = Some(info),
        }
    }
}

/// `x.requires_grad` as PyTorch defines it for the target of an in-place op: its own flag, or
/// its base's when it is a view.
pub(crate) fn inplace_target_requires_grad(t: &Tensor) -> bool {
    if t.requires_grad() {
        return true;
    }
    let m = t.autograd_meta().lock();
    m.view.as_ref().is_some_and(|v| v.base.requires_grad())
}

/// PyTorch's `check_inplace` + `handle_view_on_rebase`, run before an in-place op that records
/// history writes into `t`. Returns the root base when `t` is a view whose base must be rebased.
pub(crate) fn check_inplace(op: &str, t: &Tensor) -> Result<Option<Tensor>> {
    let (base, creation) = {
        let m = t.autograd_meta().lock();
        match &m.view {
            Some(v) => (Some(v.base.clone()), v.creation),
            None => (None, Creation::Default),
        }
    };
    if let Some(base) = &base {
        match creation {
            Creation::NoGradMode => return Err(Error::autograd(op, NO_GRAD_VIEW_MSG)),
            Creation::MultipleViews { op: vop, nr } => {
                // PyTorch names the node's function: `chunk` and `split_with_sizes` are `Split`.
                let name = match vop {
                    "chunk" => "SplitBackward0".to_string(),
                    _ => super::op_node::camel_backward_name(vop),
                };
                let short = name.split("Backward").next().unwrap_or(&name).to_string();
                return Err(Error::autograd(
                    op,
                    format!(
                        "Output {nr} of {short} is a view and is being modified inplace. This view is the output of a function that returns multiple views. Such functions do not allow the output views to be modified inplace. You should replace the inplace operation by an out-of-place one."
                    ),
                ));
            }
            Creation::Default => {}
        }
        if base.requires_grad() && base.autograd_meta().lock().grad_fn.is_none() {
            return Err(Error::autograd(op, LEAF_VIEW_MSG));
        }
    }
    let meta = t.autograd_meta();
    if meta.requires_grad() && meta.lock().grad_fn.is_none() && base.is_none() {
        return Err(Error::autograd(op, "a leaf Variable that requires grad is being used in an in-place operation."));
    }
    Ok(base)
}

/// Regenerates the `grad_fn` of a view whose storage was modified in place since its `grad_fn`
/// was set (PyTorch's `VariableHooks::grad_fn` for views): the new node is an
/// `AsStridedBackward0` from the base's current history. Returns `true` when it changed.
pub(crate) fn refresh_view_grad_fn(t: &Tensor) -> Result<bool> {
    let (base, stale) = {
        let m = t.autograd_meta().lock();
        match &m.view {
            Some(v) if v.creation != Creation::NoGradMode => (v.base.clone(), v.attr_version != t.version()),
            _ => return Ok(false),
        }
    };
    if !stale || !base.requires_grad() {
        return Ok(false);
    }
    rebase_view_onto_base(t, &base)?;
    Ok(true)
}

/// Makes `view`'s `grad_fn` an `AsStridedBackward0` whose edge is the base's current history.
pub(crate) fn rebase_view_onto_base(view: &Tensor, base: &Tensor) -> Result<()> {
    let edge: Edge = super::op_node::gradient_edge(base);
    let node = AsStridedBackward::new(view, base, edge)?;
    super::set_history(view, Arc::new(node), 0);
    let v = view.version();
    if let Some(info) = view.autograd_meta().lock().view.as_mut() {
        info.attr_version = v;
    }
    Ok(())
}
