//! Per-tensor autograd metadata.

use std::sync::atomic::{AtomicBool, Ordering};

/// Autograd state carried by every tensor.
#[derive(Default)]
pub(crate) struct AutogradMeta {
    requires_grad: AtomicBool,
}

impl AutogradMeta {
    #[inline]
    pub(crate) fn requires_grad(&self) -> bool {
        self.requires_grad.load(Ordering::Relaxed)
    }
}
