//! Saved-tensor hooks: PyTorch's `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`.
//!
//! While a [`SavedTensorsHooksGuard`] is alive on a thread, every tensor a backward node saves
//! there (op inputs and outputs, custom functions' `save_for_backward`) is handed to `pack`,
//! and the node keeps only what `pack` returns; when backward needs the tensor, `unpack` turns
//! that back into a tensor. The innermost active pair wins (guards nest). As in PyTorch:
//!
//! * the version counter is not checked for hooked tensors (the hooks own the value);
//! * a hooked tensor is still freed by backward without `retain_graph` (what `pack` returned is
//!   dropped), and a second backward fails with the usual message;
//! * hooks are registered per thread and apply to the nodes created while they are active,
//!   whenever those nodes later run.
//!
//! Activation checkpointing ([`checkpoint`](super::checkpoint)) is built on these hooks; CPU
//! offloading or compression of activations are other uses.
//!
//! ```
//! use ferrofx_core::autograd::{saved_tensors_hooks, Packed};
//! use ferrofx_core::Tensor;
//! use std::sync::{Arc, Mutex};
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap().requires_grad_(true).unwrap();
//! let packed = Arc::new(Mutex::new(0));
//! let y = {
//!     let n = packed.clone();
//!     let _hooks = saved_tensors_hooks(
//!         move |t| { *n.lock().unwrap() += 1; Box::new(t.clone()) as Packed },
//!         |p| Ok(p.downcast_ref::<Tensor>().unwrap().clone()),
//!     );
//!     x.mul(&x).unwrap() // MulBackward0 saves both inputs
//! };
//! assert_eq!(*packed.lock().unwrap(), 2); // PyTorch 2.15 packs twice too
//! y.sum().unwrap().backward(None, false, false).unwrap();
//! assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
//! ```

use crate::error::Result;
use crate::tensor::Tensor;
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

/// What a pack hook returns and an unpack hook receives (any owned value).
pub type Packed = Box<dyn Any + Send + Sync>;

/// A pack hook: receives the tensor being saved, returns what the node keeps instead.
pub type PackHookFn = dyn Fn(&Tensor) -> Packed + Send + Sync;

/// An unpack hook: receives what the pack hook returned, returns the tensor backward reads.
pub type UnpackHookFn = dyn Fn(&Packed) -> Result<Tensor> + Send + Sync;

/// One registered (pack, unpack) pair.
pub(crate) struct HookPair {
    pub(crate) pack: Box<PackHookFn>,
    pub(crate) unpack: Box<UnpackHookFn>,
}

thread_local! {
    static STACK: RefCell<Vec<Arc<HookPair>>> = const { RefCell::new(Vec::new()) };
}

/// The innermost active pair of this thread.
pub(crate) fn current() -> Option<Arc<HookPair>> {
    STACK.try_with(|s| s.borrow().last().cloned()).ok().flatten()
}

/// Keeps a pair of hooks active on this thread until dropped (the `with` block of PyTorch's
/// context manager).
#[must_use = "the hooks are removed when the guard is dropped"]
pub struct SavedTensorsHooksGuard {
    pair: Arc<HookPair>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for SavedTensorsHooksGuard {
    fn drop(&mut self) {
        let _ = STACK.try_with(|s| {
            let mut s = s.borrow_mut();
            if let Some(i) = s.iter().rposition(|p| Arc::ptr_eq(p, &self.pair)) {
                s.remove(i);
            }
        });
    }
}

/// `torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook)`: see the module
/// documentation.
pub fn saved_tensors_hooks(
    pack: impl Fn(&Tensor) -> Packed + Send + Sync + 'static,
    unpack: impl Fn(&Packed) -> Result<Tensor> + Send + Sync + 'static,
) -> SavedTensorsHooksGuard {
    let pair = Arc::new(HookPair { pack: Box::new(pack), unpack: Box::new(unpack) });
    STACK.with(|s| s.borrow_mut().push(pair.clone()));
    SavedTensorsHooksGuard { pair, _not_send: PhantomData }
}
