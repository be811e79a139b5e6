//! Per-tensor autograd metadata (PyTorch's `AutogradMeta`).
//!
//! `requires_grad` is an atomic flag read lock-free by the dispatch point on every op; it is
//! `true` for leaves that require grad and for every tensor with a `grad_fn`. Everything else
//! (grad, grad_fn, output_nr, the weakly cached `AccumulateGrad`, hooks, view bookkeeping) sits
//! behind a small mutex only touched on the autograd path.

use super::hooks::HookList;
use super::node::{drop_node, NodeRef, WeakNodeRef};
use crate::tensor::Tensor;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Autograd state carried by every tensor.
#[derive(Default)]
pub(crate) struct AutogradMeta {
    requires_grad: AtomicBool,
    inner: Mutex<MetaInner>,
}

#[derive(Default)]
pub(crate) struct MetaInner {
    /// Accumulated gradient (leaves, and non-leaves with `retain_grad`).
    pub(crate) grad: Option<Tensor>,
    /// The node that produced this tensor (`None` for leaves).
    pub(crate) grad_fn: Option<NodeRef>,
    /// Which output of `grad_fn` this tensor is.
    pub(crate) output_nr: u32,
    /// The leaf's `AccumulateGrad`, cached weakly (created once while a graph uses it).
    pub(crate) grad_accumulator: Option<WeakNodeRef>,
    /// `retain_grad()` was called on this non-leaf.
    pub(crate) retains_grad: bool,
    /// Hooks registered on a leaf (non-leaf hooks live on the grad_fn).
    pub(crate) leaf_hooks: Option<Arc<HookList>>,
    /// `register_post_accumulate_grad_hook` hooks of a leaf (run after `.grad` is updated).
    pub(crate) post_accumulate_hooks: Option<Arc<HookList>>,
    /// For views: the root base, how the view was created, and the version at which its
    /// `grad_fn` was set (see `view.rs`).
    /// Inline (no allocation per view op; views are tracked even without grad).
    pub(crate) view: Option<super::view::ViewInfo>,
}

impl AutogradMeta {
    /// The lock-free flag read by dispatch.
    #[inline]
    pub(crate) fn requires_grad(&self) -> bool {
        self.requires_grad.load(Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn set_requires_grad_flag(&self, v: bool) {
        self.requires_grad.store(v, Ordering::Relaxed)
    }
    pub(crate) fn inner_mut(&mut self) -> &mut MetaInner {
        self.inner.get_mut()
    }
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, MetaInner> {
        self.inner.lock()
    }
}

impl Drop for AutogradMeta {
    fn drop(&mut self) {
        // Unlink the history iteratively: a tensor at the end of a 1,000,000-node chain must
        // not drop its graph recursively.
        if let Some(f) = self.inner.get_mut().grad_fn.take() {
            drop_node(f);
        }
    }
}
