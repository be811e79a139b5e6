//! The one dispatch point every tensor function, method and operator overload goes through.
//!
//! Dispatch decides, per call:
//! 1. **trace**: an argument is symbolic → the active tracer records a node ([`crate::trace`]);
//! 2. **eager + autograd**: grad mode is on, the op is differentiable and an input requires
//!    grad → run the kernel and attach a backward node ([`crate::autograd`]);
//! 3. **eager**: run the kernel.
//!
//! In-place ops (those with [`Effect::Mutates`]) bump the version counter of the storage they
//! wrote, after the kernel succeeded.

use crate::error::Result;
use crate::op::def::{Effect, OpDef, Outputs};
use crate::op::registry::require;
use crate::op::schema::bind;
use crate::value::Value;

/// How the user spelled a call; tracing records it as FX does (`torch.add(x, y)` is a
/// `call_function`, `x.add(y)` a `call_method`, `x + y` an operator `call_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// A free function (`ferrofx::add(&x, &y)`, `functional::relu(&x)`).
    Function,
    /// A tensor method (`x.add(&y)`).
    Method,
    /// An operator overload (`&x + &y`).
    Operator,
}

fn any_symbolic(args: &[Value]) -> bool {
    args.iter().any(|a| match a {
        Value::Tensor(t) => t.is_symbolic(),
        Value::Tensors(ts) => ts.iter().any(|t| t.is_symbolic()),
        _ => false,
    })
}

/// Runs `op` on bound arguments (schema order, defaults filled).
#[inline]
pub fn dispatch(op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Outputs> {
    if any_symbolic(args) || crate::trace::captures_any(args) {
        return crate::trace::record(op, kind, args);
    }
    if crate::autograd::needs_grad(op, args) {
        return crate::autograd::dispatch_with_grad(op, args);
    }
    let mut out = run_kernel(op, args)?;
    if op.category == crate::op::Category::View {
        // Views remember their base whatever the grad mode (autograd's view tracking).
        crate::autograd::track_views(op, args, &mut out);
    }
    Ok(out)
}

/// Runs the kernel only (no tracing, no autograd), bumping the version counter for in-place
/// ops. Autograd and interpreters use this after they made their own decisions.
#[inline]
pub fn run_kernel(op: &'static OpDef, args: &[Value]) -> Result<Outputs> {
    let out = (op.kernel)(args)?;
    super::flop_counter::record(op, args, &out);
    if let Effect::Mutates(i) = op.effect {
        if let Some(Value::Tensor(t)) = args.get(i) {
            if writes(op, args) {
                t.bump_version();
            }
        }
    }
    Ok(out)
}

/// Whether a mutating op writes on this call: ops whose side effect depends on a `training`
/// flag (`batch_norm` updates its running statistics only in training mode) write nothing when
/// it is false, so the version counters of their arguments stay as they were (as in PyTorch,
/// where evaluating a BatchNorm twice does not invalidate the first graph).
fn writes(op: &OpDef, args: &[Value]) -> bool {
    match op.schema.iter().position(|s| s.name == "training") {
        Some(p) => !matches!(args.get(p), Some(Value::Bool(false))),
        None => true,
    }
}

/// Calls an op by name with positional and keyword arguments, binding them to its schema
/// (defaults, int→float, int→int[]).
///
/// ```
/// use ferrofx_core::{op, Tensor, Value};
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
/// let y = op::call("add", vec![Value::from(&x), Value::Float(1.0)], vec![("alpha".into(), Value::Int(2))]).unwrap();
/// assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![3.0, 0.0]);
/// ```
pub fn call(name: &str, args: Vec<Value>, kwargs: Vec<(String, Value)>) -> Result<Outputs> {
    let op = require(name)?;
    let bound = bind(op.name, op.schema, args, kwargs)?;
    dispatch(op, CallKind::Function, &bound)
}
