//! Thread-local grad mode (`torch.no_grad`, `torch.enable_grad`, `torch.set_grad_enabled`).

use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// `true` when operations record autograd history on this thread.
#[inline]
pub fn is_grad_enabled() -> bool {
    ENABLED.with(|c| c.get())
}

/// Restores the previous grad mode when dropped.
#[must_use = "grad mode is restored when the guard is dropped"]
pub struct GradModeGuard {
    prev: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        ENABLED.with(|c| c.set(self.prev));
    }
}

/// Sets grad mode for this thread until the guard drops.
///
/// ```
/// use ferrofx_core::autograd::{is_grad_enabled, set_grad_enabled};
/// {
///     let _g = set_grad_enabled(false);
///     assert!(!is_grad_enabled());
/// }
/// assert!(is_grad_enabled());
/// ```
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    let prev = ENABLED.with(|c| c.replace(enabled));
    GradModeGuard { prev }
}

/// `torch.no_grad()`: disables history recording until the guard drops.
pub fn no_grad() -> GradModeGuard {
    set_grad_enabled(false)
}

/// `torch.enable_grad()`: enables history recording until the guard drops (inside `no_grad`).
pub fn enable_grad() -> GradModeGuard {
    set_grad_enabled(true)
}
