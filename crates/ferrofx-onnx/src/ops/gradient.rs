//! `Gradient` (domain `ai.onnx.preview.training`): the gradient of a graph value `y` with
//! respect to graph values `xs`, as part of the forward graph.
//!
//! While a graph holding a `Gradient` node is evaluated, every registry call the converters
//! make is recorded on a tape (op, bound arguments, outputs). The `Gradient` node then walks
//! that tape backwards from `y` (seeded with ones, as ONNX specifies) and calls each op's
//! registry backward formula, the same formulas the autograd engine uses, through a
//! `BackwardCtx`. The formulas are tensor ops, so while the importer traces they are recorded
//! like any other node: the imported GraphModule computes the gradients in its forward.
//! Outputs for an `x` that `y` does not depend on are zeros. The ops converters compute by
//! other means than registry calls (none on the usual arithmetic path) do not reach the tape;
//! a gradient that would need one is an error naming the value.

use super::{call, v, Node};
use ferrofx_core::autograd::{BackwardCtx, MetaSlot};
use ferrofx_core::op::{OpDef, Outputs};
use ferrofx_core::{Result, Tensor, Value};
use std::cell::RefCell;
use std::collections::HashMap;

/// The ONNX op type.
pub(crate) const OP: &str = "Gradient";
/// Its domain.
pub(crate) const DOMAIN: &str = "ai.onnx.preview.training";

struct Entry {
    op: &'static OpDef,
    args: Vec<Value>,
    outputs: Vec<Tensor>,
}

thread_local! {
    static TAPE: RefCell<Option<Vec<Entry>>> = const { RefCell::new(None) };
}

/// Whether registry calls are being recorded.
pub(crate) fn recording() -> bool {
    TAPE.with(|t| t.borrow().is_some())
}

/// Records one registry call.
pub(crate) fn record(op: &'static OpDef, args: Vec<Value>, outputs: &Outputs) {
    TAPE.with(|t| {
        if let Some(tape) = t.borrow_mut().as_mut() {
            tape.push(Entry { op, args, outputs: outputs.iter().cloned().collect() });
        }
    });
}

/// Runs `f` with the tape on (for a graph holding `Gradient` nodes); the tape is dropped
/// afterwards, also on error.
pub(crate) fn with_tape<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    struct Off(Option<Vec<Entry>>);
    impl Drop for Off {
        fn drop(&mut self) {
            let prev = self.0.take();
            TAPE.with(|t| *t.borrow_mut() = prev);
        }
    }
    let prev = TAPE.with(|t| t.borrow_mut().replace(Vec::new()));
    let _off = Off(prev);
    f()
}

fn meta_slot(v: &Value) -> MetaSlot {
    match v {
        Value::Tensor(t) => t.meta().map(MetaSlot::One).unwrap_or(MetaSlot::None),
        Value::Tensors(ts) => MetaSlot::List(ts.iter().filter_map(|t| t.meta()).collect()),
        _ => MetaSlot::None,
    }
}

/// Evaluates a `Gradient` node: `env` holds the graph's values by name.
pub(crate) fn gradient(n: &Node<'_>, env: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
    let strings = |name: &str| -> Vec<String> {
        n.attr(name)
            .map(|a| a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
            .unwrap_or_default()
    };
    let xs = strings("xs");
    let y_name = n.s("y").ok_or_else(|| n.err("the `y` attribute is required"))?;
    if xs.is_empty() {
        return Err(n.err("the `xs` attribute is required"));
    }
    let value = |name: &str| {
        env.get(name).ok_or_else(|| n.err(format!("`{name}` is not a tensor value computed before the node")))
    };
    let y = value(&y_name)?;
    // the tape of the calls so far; the backward formulas' own calls are not recorded
    let tape = TAPE.with(|t| t.borrow_mut().take()).ok_or_else(|| n.err("no tape (internal error)"))?;
    let result = backward(n, &tape, y, &xs, &value);
    TAPE.with(|t| *t.borrow_mut() = Some(tape));
    result
}

fn backward<'e>(
    n: &Node<'_>,
    tape: &[Entry],
    y: &Tensor,
    xs: &[String],
    value: &dyn Fn(&str) -> Result<&'e Tensor>,
) -> Result<Vec<Tensor>> {
    let mut grads: HashMap<usize, Tensor> = HashMap::new();
    grads.insert(y.id(), call("ones_like", vec![v(y)])?);
    let accumulate = |grads: &mut HashMap<usize, Tensor>, t: &Tensor, g: Tensor| -> Result<()> {
        let g = match grads.remove(&t.id()) {
            Some(prev) => call("add", vec![v(&prev), v(&g)])?,
            None => g,
        };
        grads.insert(t.id(), g);
        Ok(())
    };
    for e in tape.iter().rev() {
        let out_grads: Vec<Option<Tensor>> = e.outputs.iter().map(|o| grads.get(&o.id()).cloned()).collect();
        if out_grads.iter().all(Option::is_none) {
            continue;
        }
        let Some(formula) = e.op.backward else {
            return Err(n.err(format!("`{}` is on the path from `y` to `xs` but has no derivative", e.op.name)));
        };
        let metas: Vec<MetaSlot> = e.args.iter().map(meta_slot).collect();
        let outputs: Vec<Option<Tensor>> = e.outputs.iter().cloned().map(Some).collect();
        let needs: Vec<bool> = e
            .args
            .iter()
            .map(|a| match a {
                Value::Tensor(t) => t.dtype().is_floating_point(),
                Value::Tensors(ts) => ts.iter().any(|t| t.dtype().is_floating_point()),
                _ => false,
            })
            .collect();
        let ctx = BackwardCtx::new(e.op, &e.args, &metas, &outputs, &out_grads, &needs);
        let gin = formula(&ctx).map_err(|err| n.err(format!("backward of `{}`: {err}", e.op.name)))?;
        // one slot per argument, a tensor list expanding to its elements
        let slots: Vec<&Tensor> = e
            .args
            .iter()
            .flat_map(|a| match a {
                Value::Tensor(t) => vec![Some(t)],
                Value::Tensors(ts) => ts.iter().map(Some).collect(),
                _ => vec![None],
            })
            .map(|t| t.unwrap_or(y))
            .collect();
        let kinds: Vec<bool> = e
            .args
            .iter()
            .flat_map(|a| match a {
                Value::Tensor(_) => vec![true],
                Value::Tensors(ts) => vec![true; ts.len()],
                _ => vec![false],
            })
            .collect();
        for ((g, t), is_tensor) in gin.into_iter().zip(slots).zip(kinds) {
            if let (Some(g), true) = (g, is_tensor) {
                accumulate(&mut grads, t, g)?;
            }
        }
    }
    xs.iter()
        .map(|x| {
            let t = value(x)?;
            match grads.get(&t.id()) {
                Some(g) => Ok(g.clone()),
                None => call("zeros_like", vec![v(t)]),
            }
        })
        .collect()
}
