//! The observer as a module of a prepared [`GraphModule`]: FX's
//! `activation_post_process_N`. Its forward records the statistics of its input and returns
//! the input unchanged, so a prepared model runs (eagerly, in the Interpreter, or through its
//! plan) exactly like the float one while calibrating.

use crate::observer::Observer;
use ferrofx_core::{Result, Tensor};
use ferrofx_fx::GraphModule;
use ferrofx_nn::module::ModuleStructure;
use ferrofx_nn::{Module, TensorKind};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An observer inserted by [`prepare`](crate::prepare()); prints as the observer's class name.
#[derive(Clone)]
pub struct ObserverModule {
    observer: Arc<dyn Observer>,
    enabled: Arc<AtomicBool>,
}

impl ObserverModule {
    /// Wraps an observer (enabled).
    pub fn new(observer: Box<dyn Observer>) -> ObserverModule {
        ObserverModule { observer: Arc::from(observer), enabled: Arc::new(AtomicBool::new(true)) }
    }

    /// Whether forward records statistics (PyTorch's `enable_observer` / `disable_observer`).
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// See [`ObserverModule::set_enabled`].
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The observer.
    pub fn observer(&self) -> &dyn Observer {
        self.observer.as_ref()
    }
}

impl ModuleStructure for ObserverModule {
    fn type_name(&self) -> &'static str {
        self.observer.name()
    }
    fn visit_tensors(&self, _f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {}
    fn visit_tensors_mut(&mut self, _f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {}
    fn visit_children<'a>(&'a self, _f: &mut dyn FnMut(&str, &'a dyn Module)) {}
    fn visit_children_mut(&mut self, _f: &mut dyn FnMut(&str, &mut dyn Module)) {}
    fn as_module(&self) -> &dyn Module {
        self
    }
    fn as_module_mut(&mut self) -> &mut dyn Module {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Module for ObserverModule {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.is_enabled() {
            self.observer.observe(x)?;
        }
        Ok(x.clone())
    }
    /// A copy that shares the statistics (calibrating either calibrates both).
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn extra_repr(&self) -> String {
        let c = self.observer.config();
        let (lo, hi) = self.observer.min_max();
        let range = match (lo.first(), hi.first()) {
            (Some(l), Some(h)) if lo.len() == 1 && l.is_finite() && h.is_finite() => {
                format!(", min_val={l}, max_val={h}")
            }
            _ => String::new(),
        };
        format!("dtype={}, qscheme={}{range}", c.dtype, c.qscheme.name())
    }
}

/// Disables every observer of a prepared module while it lives (restoring each one's previous
/// state on drop): runs for evaluation that must not change the calibration.
pub struct ObserverGuard<'a> {
    saved: Vec<(&'a ObserverModule, bool)>,
}

impl<'a> ObserverGuard<'a> {
    /// Disables the observers of `gm`.
    pub fn disable(gm: &'a GraphModule) -> ObserverGuard<'a> {
        let saved = gm
            .leaf_modules()
            .values()
            .filter_map(|m| m.as_any().downcast_ref::<ObserverModule>())
            .map(|o| {
                let was = o.is_enabled();
                o.set_enabled(false);
                (o, was)
            })
            .collect();
        ObserverGuard { saved }
    }
}

impl Drop for ObserverGuard<'_> {
    fn drop(&mut self) {
        for (o, was) in &self.saved {
            o.set_enabled(*was);
        }
    }
}
