//! Hooks: tensor hooks (`register_hook`), `retain_grad`, and node pre-/post-hooks
//! (`grad_fn.register_prehook` / `grad_fn.register_hook`).
//!
//! Order in which the engine calls them for a node (PyTorch's `call_function`):
//!
//! 1. **tensor pre-hooks**: the hooks of the tensors this node produced (a non-leaf's hooks
//!    live on its `grad_fn`, keyed by `output_nr`; a leaf's live in its autograd meta and are
//!    the tensor pre-hooks of its `AccumulateGrad`), user hooks in registration order, then
//!    `retain_grad`. They run whenever gradients reach the node, in `autograd::grad()` too
//!    (where the node itself may not run);
//! 2. **node pre-hooks**: see all the node's incoming gradients, may replace them;
//! 3. the node;
//! 4. **node post-hooks**: see the gradients the node computed (`grad_inputs`) and the ones it
//!    received (`grad_outputs`), may replace `grad_inputs`.
//!
//! Every replacement is checked as PyTorch checks it (count, `None` slots, dtype, size).

use super::node::Node;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorImpl};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// A gradient hook: sees the gradient, may return a replacement.
pub type HookFn = dyn Fn(&Tensor) -> Option<Tensor> + Send + Sync;

/// A node pre-hook: sees the gradients the node receives (`grad_outputs`, one per forward
/// output, `None` = zero), may return replacements (same count).
pub type NodePreHookFn = dyn Fn(&[Option<Tensor>]) -> Option<Vec<Option<Tensor>>> + Send + Sync;

/// A node post-hook: sees the gradients the node computed (`grad_inputs`, one per next edge)
/// and the ones it received (`grad_outputs`), may return replacements for `grad_inputs`.
pub type NodePostHookFn = dyn Fn(&[Option<Tensor>], &[Option<Tensor>]) -> Option<Vec<Option<Tensor>>> + Send + Sync;

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

fn next_id() -> u64 {
    HOOK_ID.fetch_add(1, Ordering::Relaxed)
}

/// Something hooks can be removed from (the target of a [`HookHandle`]).
trait HookStore: Send + Sync {
    fn remove(&self, id: u64) -> bool;
}

/// The tensor hooks of one node (for the tensors it produced) or leaf.
#[derive(Default)]
pub struct HookList {
    hooks: Mutex<Vec<HookEntry>>,
}

/// PyTorch's `check_variable_result`: a hook's replacement keeps the dtype and size of the
/// value it replaces (ferrofx tensors all live on the CPU, so the device always matches).
fn check_replacement(hook: &str, value: &Tensor, new: &Tensor) -> Result<()> {
    if new.dtype() != value.dtype() {
        return Err(Error::autograd(
            hook,
            format!(
                "hook 'hook' has changed the type of value (was torch.{} got torch.{})",
                super::legacy_type_name(value.dtype()),
                super::legacy_type_name(new.dtype())
            ),
        ));
    }
    if new.shape() != value.shape() {
        return Err(Error::autograd(
            hook,
            format!(
                "hook 'hook' has changed the size of value (was {:?}, got {:?}; a hook must return a gradient of the same shape, or None to keep it)",
                value.shape(),
                new.shape()
            ),
        ));
    }
    Ok(())
}

impl HookList {
    pub(crate) fn add(self: &Arc<Self>, input_nr: u32, kind: HookKind) -> HookHandle {
        let id = next_id();
        self.hooks.lock().push(HookEntry { id, input_nr, kind });
        let store: Weak<dyn HookStore> = Arc::downgrade(self) as Weak<dyn HookStore>;
        HookHandle { store, id }
    }

    fn is_retain_of(h: &HookEntry, t: &Tensor) -> bool {
        matches!(&h.kind, HookKind::RetainGrad(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(&t.0)))
    }

    pub(crate) fn has_retain_grad_for(&self, t: &Tensor) -> bool {
        self.hooks.lock().iter().any(|h| Self::is_retain_of(h, t))
    }

    /// Removes the `retain_grad` hook of `t` (it moves to `t`'s new `grad_fn` when an in-place
    /// op rebases `t`'s history).
    pub(crate) fn remove_retain_grad_for(&self, t: &Tensor) {
        self.hooks.lock().retain(|h| !Self::is_retain_of(h, t));
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
                    check_replacement("register_hook", &grad, &new)?;
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
}

impl HookStore for HookList {
    fn remove(&self, id: u64) -> bool {
        let mut h = self.hooks.lock();
        let n = h.len();
        h.retain(|e| e.id != id);
        h.len() != n
    }
}

/// The node pre- and post-hooks of one node.
#[derive(Default)]
pub(crate) struct NodeHooks {
    pre: Mutex<Vec<(u64, Arc<NodePreHookFn>)>>,
    post: Mutex<Vec<(u64, Arc<NodePostHookFn>)>>,
}

/// PyTorch's checks of the values a node hook returned in place of `old`.
fn check_hook_result(node: &str, kind: &str, old: &[Option<Tensor>], new: &[Option<Tensor>]) -> Result<()> {
    if new.len() != old.len() {
        return Err(Error::autograd(
            node,
            format!(
                "hook 'hook' has returned an incorrect number of values (got {}, but expected {}) ({kind} of {node})",
                new.len(),
                old.len()
            ),
        ));
    }
    for (o, n) in old.iter().zip(new) {
        match (o, n) {
            (None, Some(_)) => {
                return Err(Error::autograd(
                    node,
                    format!("can't replace a None gradient with a non-None value ({kind} of {node})"),
                ))
            }
            (Some(o), Some(n)) => check_replacement(node, o, n)?,
            _ => {}
        }
    }
    Ok(())
}

impl NodeHooks {
    pub(crate) fn has_pre(&self) -> bool {
        !self.pre.lock().is_empty()
    }
    pub(crate) fn has_post(&self) -> bool {
        !self.post.lock().is_empty()
    }

    /// Runs the pre-hooks in registration order; each sees the previous one's replacement.
    pub(crate) fn run_pre(&self, node: &str, grads: &mut [Option<Tensor>]) -> Result<()> {
        let hooks: Vec<Arc<NodePreHookFn>> = self.pre.lock().iter().map(|(_, f)| f.clone()).collect();
        for f in hooks {
            if let Some(new) = f(grads) {
                check_hook_result(node, "pre-hook", grads, &new)?;
                for (slot, n) in grads.iter_mut().zip(new) {
                    *slot = n;
                }
            }
        }
        Ok(())
    }

    /// Runs the post-hooks in registration order on the node's result.
    pub(crate) fn run_post(
        &self,
        node: &str,
        mut grad_inputs: Vec<Option<Tensor>>,
        grad_outputs: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let hooks: Vec<Arc<NodePostHookFn>> = self.post.lock().iter().map(|(_, f)| f.clone()).collect();
        for f in hooks {
            if let Some(new) = f(&grad_inputs, grad_outputs) {
                check_hook_result(node, "post-hook", &grad_inputs, &new)?;
                grad_inputs = new;
            }
        }
        Ok(grad_inputs)
    }
}

impl HookStore for NodeHooks {
    fn remove(&self, id: u64) -> bool {
        let mut pre = self.pre.lock();
        let n = pre.len();
        pre.retain(|(i, _)| *i != id);
        if pre.len() != n {
            return true;
        }
        drop(pre);
        let mut post = self.post.lock();
        let n = post.len();
        post.retain(|(i, _)| *i != id);
        post.len() != n
    }
}

impl dyn Node {
    fn node_hooks(&self) -> &Arc<NodeHooks> {
        self.base().node_hooks.get_or_init(Default::default)
    }

    /// PyTorch's `grad_fn.register_prehook(hook)`: `hook` is called with the gradients this
    /// node receives (one per forward output, `None` = zero) before it runs, and may return
    /// replacements (same count; a `None` slot cannot become a tensor; dtype and size kept).
    /// Node pre-hooks run after the tensor hooks of the node's outputs, and only when the node
    /// runs (in `autograd::grad()`, nodes past the inputs do not).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    /// let y = x.mul(2.0).unwrap();
    /// let h = y.grad_fn().unwrap().register_prehook(|go| Some(vec![Some(go[0].as_ref()?.mul(10.0).ok()?)]));
    /// y.sum().unwrap().backward(None, false, false).unwrap();
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![20.0, 20.0]); // PyTorch 2.15: tensor([20., 20.])
    /// assert!(h.remove());
    /// ```
    pub fn register_prehook(
        &self,
        hook: impl Fn(&[Option<Tensor>]) -> Option<Vec<Option<Tensor>>> + Send + Sync + 'static,
    ) -> HookHandle {
        let hooks = self.node_hooks();
        let id = next_id();
        hooks.pre.lock().push((id, Arc::new(hook)));
        let store: Weak<dyn HookStore> = Arc::downgrade(hooks) as Weak<dyn HookStore>;
        HookHandle { store, id }
    }

    /// PyTorch's `grad_fn.register_hook(hook)`: `hook(grad_inputs, grad_outputs)` is called
    /// after the node ran, with the gradients it computed (one per next edge, `None` for
    /// inputs that need none) and the ones it received; it may return replacements for
    /// `grad_inputs` (same count; a `None` slot cannot become a tensor; dtype and size kept).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    /// let y = x.mul(2.0).unwrap();
    /// // MulBackward0 of `x * 2` has two edges: x's AccumulateGrad and (None, 0) for the number.
    /// y.grad_fn().unwrap().register_hook(|gi, _go| Some(vec![Some(gi[0].as_ref()?.add(1.0).ok()?), None]));
    /// y.sum().unwrap().backward(None, false, false).unwrap();
    /// assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    /// ```
    pub fn register_hook(
        &self,
        hook: impl Fn(&[Option<Tensor>], &[Option<Tensor>]) -> Option<Vec<Option<Tensor>>> + Send + Sync + 'static,
    ) -> HookHandle {
        let hooks = self.node_hooks();
        let id = next_id();
        hooks.post.lock().push((id, Arc::new(hook)));
        let store: Weak<dyn HookStore> = Arc::downgrade(hooks) as Weak<dyn HookStore>;
        HookHandle { store, id }
    }
}

/// Returned by every `register_*hook`; [`HookHandle::remove`] unregisters the hook
/// (PyTorch's `RemovableHandle`).
pub struct HookHandle {
    store: Weak<dyn HookStore>,
    id: u64,
}

impl std::fmt::Debug for HookHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HookHandle({})", self.id)
    }
}

impl HookHandle {
    /// Removes the hook; `false` if it was already removed or its graph is gone.
    pub fn remove(&self) -> bool {
        self.store.upgrade().map(|l| l.remove(self.id)).unwrap_or(false)
    }
}
