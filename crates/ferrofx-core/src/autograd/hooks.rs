//! Tensor hooks (`register_hook`) and `retain_grad`.
//!
//! Hooks of a leaf live in the leaf's autograd meta and run in its `AccumulateGrad`; hooks of a
//! non-leaf live on its `grad_fn` (for its `output_nr`) and run before that node. A hook may
//! return a replacement gradient. `retain_grad` hooks always run after user hooks (PyTorch ≥ 2.0).

use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorImpl};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// A gradient hook: sees the gradient, may return a replacement.
pub type HookFn = dyn Fn(&Tensor) -> Option<Tensor> + Send + Sync;

#[derive(Clone)]
pub(crate) enum HookKind {
    User(Arc<HookFn>),
    RetainGrad(Weak<TensorImpl>),
}

#[derive(Clone)]
pub(crate) struct HookEntry {
    id: u64,
    input_nr: u32,
    kind: HookKind,
}

static HOOK_ID: AtomicU64 = AtomicU64::new(1);

/// The hooks of one node or leaf.
#[derive(Default)]
pub struct HookList {
    hooks: Mutex<Vec<HookEntry>>,
}

impl HookList {
    pub(crate) fn add(self: &Arc<Self>, input_nr: u32, kind: HookKind) -> HookHandle {
        let id = HOOK_ID.fetch_add(1, Ordering::Relaxed);
        self.hooks.lock().push(HookEntry { id, input_nr, kind });
        HookHandle { list: Arc::downgrade(self), id }
    }

    pub(crate) fn has_retain_grad_for(&self, t: &Tensor) -> bool {
        self.hooks
            .lock()
            .iter()
            .any(|h| matches!(&h.kind, HookKind::RetainGrad(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(&t.0))))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.hooks.lock().is_empty()
    }

    /// Runs the hooks registered for `input_nr` on `grad` (user hooks first, in registration
    /// order, then `retain_grad`), returning the possibly replaced gradient.
    pub(crate) fn run(&self, input_nr: u32, mut grad: Tensor, create_graph: bool) -> Result<Tensor> {
        let entries: Vec<HookEntry> = self.hooks.lock().iter().filter(|h| h.input_nr == input_nr).cloned().collect();
        for e in entries.iter() {
            if let HookKind::User(f) = &e.kind {
                if let Some(new) = f(&grad) {
                    if new.shape() != grad.shape() {
                        return Err(Error::autograd(
                            "register_hook",
                            format!(
                                "hook has changed the size of value: expected {:?}, got {:?}",
                                grad.shape(),
                                new.shape()
                            ),
                        ));
                    }
                    if new.dtype() != grad.dtype() {
                        return Err(Error::autograd(
                            "register_hook",
                            format!(
                                "hook 'hook' has changed the type of value (was torch.{} got torch.{})",
                                super::legacy_type_name(grad.dtype()),
                                super::legacy_type_name(new.dtype())
                            ),
                        ));
                    }
                    grad = new;
                }
            }
        }
        for e in entries.iter() {
            if let HookKind::RetainGrad(w) = &e.kind {
                if let Some(imp) = w.upgrade() {
                    let t = Tensor(imp);
                    super::engine::accumulate_into_grad(&t, grad.clone(), create_graph)?;
                }
            }
        }
        Ok(grad)
    }

    fn remove(&self, id: u64) -> bool {
        let mut h = self.hooks.lock();
        let n = h.len();
        h.retain(|e| e.id != id);
        h.len() != n
    }
}

/// Returned by [`Tensor::register_hook`]; [`HookHandle::remove`] unregisters the hook.
#[derive(Debug)]
pub struct HookHandle {
    list: Weak<HookList>,
    id: u64,
}

impl HookHandle {
    /// Removes the hook; `false` if it was already removed or its graph is gone.
    pub fn remove(&self) -> bool {
        self.list.upgrade().map(|l| l.remove(self.id)).unwrap_or(false)
    }
}
