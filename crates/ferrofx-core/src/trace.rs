//! The tracing hook of the dispatch point.
//!
//! A tracer (in `ferrofx-fx`) installs a [`TraceHook`] for the current thread with
//! [`with_trace_hook`]; while it is installed, any op that receives a symbolic tensor is handed
//! to the hook, which records a graph node and returns symbolic outputs. Questions about a
//! symbolic tensor's data or unknown shape are reported to the hook, which turns them into a
//! trace error naming the caller's source location.

use crate::error::{Error, Result};
use crate::op::{CallKind, OpDef, Outputs};
use crate::tensor::TensorMeta;
use crate::value::Value;
use crate::Tensor;
use std::any::Any;
use std::cell::RefCell;
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;

/// The payload of a symbolic tensor: tracer-defined proxy data plus metadata when known.
#[derive(Clone)]
pub struct Symbolic {
    /// Shape/dtype when tracing with example inputs (or inferred by meta functions).
    pub meta: Option<TensorMeta>,
    /// Whatever the tracer needs to find the node (e.g. graph id + node id).
    pub proxy: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Symbolic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolic").field("meta", &self.meta).finish_non_exhaustive()
    }
}

/// What a tracer implements to capture ops.
pub trait TraceHook {
    /// Records a call of `op` (arguments bound to its schema) and returns its symbolic outputs.
    fn record(&self, op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Outputs>;
    /// A symbolic tensor's data or unknown metadata was requested at `location` (`what` is
    /// `"shape"`, `"dtype"`, `"item()"`, ...). The tracer should fail the trace with an
    /// explanation.
    fn concrete_query(&self, what: &str, location: &'static Location<'static>);
    /// Whether an op on this concrete tensor must be recorded too (the traced module's own
    /// parameters and buffers: `self.pos.narrow(..)` is part of the program, not a constant).
    /// Asked only while a tracer is installed.
    fn captures(&self, t: &Tensor) -> bool {
        let _ = t;
        false
    }
}

thread_local! {
    static HOOK: RefCell<Option<Rc<dyn TraceHook>>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` installed for this thread, restoring the previous hook afterwards (also
/// on panic).
pub fn with_trace_hook<R>(hook: Rc<dyn TraceHook>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<dyn TraceHook>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            HOOK.with(|h| *h.borrow_mut() = prev);
        }
    }
    let prev = HOOK.with(|h| h.borrow_mut().replace(hook));
    let _restore = Restore(prev);
    f()
}

/// Whether the active tracer (if any) wants an op on these concrete arguments recorded.
pub(crate) fn captures_any(args: &[Value]) -> bool {
    HOOK.with(|h| match h.borrow().as_ref() {
        None => false,
        Some(hook) => args.iter().any(|a| match a {
            Value::Tensor(t) => hook.captures(t),
            Value::Tensors(ts) => ts.iter().any(|t| hook.captures(t)),
            _ => false,
        }),
    })
}

/// `true` while a tracer is active on this thread.
pub fn is_tracing() -> bool {
    HOOK.with(|h| h.borrow().is_some())
}

/// The hook installed on this thread, if any: a hook that wraps the active tracer (to watch
/// what it records, as joint forward+backward capture does) delegates to it.
pub fn current_trace_hook() -> Option<Rc<dyn TraceHook>> {
    current()
}

fn current() -> Option<Rc<dyn TraceHook>> {
    HOOK.with(|h| h.borrow().clone())
}

pub(crate) fn record(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Outputs> {
    match current() {
        Some(hook) => hook.record(op, kind, args),
        None => Err(Error::trace(
            op.name,
            "a symbolic tensor was used outside of the trace that created it; run the model with concrete tensors, or call it inside the tracer",
        )),
    }
}

pub(crate) fn report_concrete_query(what: &str, location: &'static Location<'static>) {
    if let Some(hook) = current() {
        hook.concrete_query(what, location);
    }
}

pub(crate) fn concrete_query_error(what: &str, location: &'static Location<'static>) -> Error {
    report_concrete_query(what, location);
    Error::trace(
        what,
        format!(
            "{what} was called on a symbolic tensor at {location}: its value is not known while tracing. \
             Data-dependent control flow cannot be captured symbolically; pass the value through concrete_args, \
             or trace with example inputs"
        ),
    )
}
