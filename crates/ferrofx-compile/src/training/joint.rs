//! Joint forward+backward capture (AOTAutograd's joint graph).
//!
//! The model's forward and a scalar loss are traced with example inputs (every module traced
//! through, so each node is a registry op); a hook wrapped around the tracer keeps a tape of the
//! differentiable ops it records. The backward is then built by walking the tape in reverse and
//! calling each op's backward formula (the same `OpDef::backward` the eager engine calls) on the
//! symbolic tensors: the formulas are written with registry ops, so the tracer records them as
//! ordinary nodes of the same graph. Gradients reaching a tensor along several uses are summed
//! with `add` nodes, as the engine's input buffers do.

use ferrofx_core::autograd::{BackwardCtx, MetaSlot};
use ferrofx_core::op::{CallKind, OpDef, Outputs};
use ferrofx_core::trace::{current_trace_hook, with_trace_hook, TraceHook};
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use ferrofx_fx::{GraphModule, Tracer};
use ferrofx_nn::Module;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::panic::Location;
use std::rc::Rc;

/// The loss of a joint capture: model outputs and loss targets (labels...) → a float32 scalar.
pub type LossFn<'a> = dyn Fn(&[Value], &[Value]) -> Result<Tensor> + 'a;

/// Which gradients a joint graph returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GradTarget {
    /// A parameter of the model, by qualified name.
    Parameter(String),
    /// Model input `i`.
    Input(usize),
}

impl std::fmt::Display for GradTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GradTarget::Parameter(p) => write!(f, "{p}"),
            GradTarget::Input(i) => write!(f, "input {i}"),
        }
    }
}

/// A joint forward+backward graph.
///
/// Inputs: the model inputs (primals), then `tangent`, the gradient of the loss (a float32
/// scalar; 1.0 for training). Outputs, as one tuple: the loss, the model's outputs, then one
/// gradient per [`JointGraph::grad_targets`] entry (`None` for a parameter the loss does not
/// depend on).
pub struct JointGraph {
    /// The captured graph (parameters and buffers are `get_attr` nodes sharing the model's
    /// tensors: an optimizer step on the model is seen by the graph).
    pub gm: GraphModule,
    /// Number of model inputs (the tangent placeholder comes after them).
    pub num_primals: usize,
    /// Number of forward outputs: the loss plus the model's outputs.
    pub num_forward_outputs: usize,
    /// What each gradient output is the gradient of.
    pub grad_targets: Vec<GradTarget>,
}

impl JointGraph {
    /// Runs the joint graph on concrete inputs with tangent 1.0: `(forward outputs, gradients)`.
    pub fn run(&self, inputs: &[Value]) -> Result<(Vec<Value>, Vec<Option<Tensor>>)> {
        let mut all = inputs.to_vec();
        all.push(Value::Tensor(Tensor::scalar(1.0f32)));
        let _g = ferrofx_core::autograd::no_grad();
        let mut out = self.gm.forward_values(&all)?;
        let grads = out.split_off(self.num_forward_outputs);
        Ok((out, grads.into_iter().map(|v| v.as_tensor().cloned()).collect()))
    }
}

/// One differentiable op recorded during forward.
struct Entry {
    op: &'static OpDef,
    args: Vec<Value>,
    outputs: Vec<Tensor>,
}

/// Wraps the tracer's hook: every op goes to the tracer; while `recording`, differentiable ops
/// on tensors requiring grad are also put on the tape and their outputs marked as requiring grad.
struct Tape {
    inner: Rc<dyn TraceHook>,
    recording: Cell<bool>,
    requires: RefCell<HashSet<usize>>,
    entries: RefCell<Vec<Entry>>,
}

impl Tape {
    fn requires(&self, v: &Value) -> bool {
        let r = self.requires.borrow();
        match v {
            Value::Tensor(t) => r.contains(&t.id()),
            Value::Tensors(ts) => ts.iter().any(|t| r.contains(&t.id())),
            _ => false,
        }
    }
}

impl TraceHook for Tape {
    fn record(&self, op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Outputs> {
        let out = self.inner.record(op, kind, args)?;
        if self.recording.get() && op.backward.is_some() && args.iter().any(|a| self.requires(a)) {
            let mut r = self.requires.borrow_mut();
            for t in &out {
                if t.meta().is_some_and(|m| m.dtype.is_floating_point()) {
                    r.insert(t.id());
                }
            }
            drop(r);
            self.entries.borrow_mut().push(Entry { op, args: args.to_vec(), outputs: out.to_vec() });
        }
        Ok(out)
    }
    fn concrete_query(&self, what: &str, location: &'static Location<'static>) {
        self.inner.concrete_query(what, location)
    }
    fn captures(&self, t: &Tensor) -> bool {
        self.inner.captures(t)
    }
}

fn meta_slot(v: &Value) -> Result<MetaSlot> {
    let meta = |t: &Tensor| {
        t.meta().ok_or_else(|| Error::trace("capture_joint", "a tensor of the forward has no shape while tracing"))
    };
    Ok(match v {
        Value::Tensor(t) => MetaSlot::One(meta(t)?),
        Value::Tensors(ts) => MetaSlot::List(ts.iter().map(meta).collect::<Result<_>>()?),
        _ => MetaSlot::None,
    })
}

/// Sums `g` into the gradient of `t` (an `add` node when one is already there).
fn accumulate(grads: &mut HashMap<usize, Tensor>, t: &Tensor, g: Tensor) -> Result<()> {
    let g = match grads.remove(&t.id()) {
        Some(prev) => prev.add(&g)?,
        None => g,
    };
    grads.insert(t.id(), g);
    Ok(())
}

/// The backward over the tape: each entry's formula, in reverse recording order.
fn backward(tape: &Tape, loss: &Tensor, tangent: &Tensor) -> Result<HashMap<usize, Tensor>> {
    let mut grads: HashMap<usize, Tensor> = HashMap::new();
    grads.insert(loss.id(), tangent.clone());
    let entries = tape.entries.borrow();
    for e in entries.iter().rev() {
        let gouts: Vec<Option<Tensor>> = e.outputs.iter().map(|o| grads.remove(&o.id())).collect();
        if gouts.iter().all(Option::is_none) {
            continue;
        }
        let Some(formula) = e.op.backward else { continue };
        let metas = e.args.iter().map(meta_slot).collect::<Result<Vec<_>>>()?;
        let needs: Vec<bool> = e.args.iter().map(|a| tape.requires(a)).collect();
        let outs: Vec<Option<Tensor>> = e.outputs.iter().cloned().map(Some).collect();
        let ctx = BackwardCtx::new(e.op, &e.args, &metas, &outs, &gouts, &needs);
        let res = formula(&ctx)
            .map_err(|err| err.with_context(&format!("backward of '{}' in the joint graph", e.op.name)))?;
        // one gradient slot per tensor argument, a tensor list expanding to one per element
        let mut res = res.into_iter();
        for a in &e.args {
            let ts: Vec<&Tensor> = match a {
                Value::Tensor(t) => vec![t],
                Value::Tensors(ts) => ts.iter().collect(),
                _ => {
                    let _ = res.next();
                    continue;
                }
            };
            for t in ts {
                if let Some(Some(g)) = res.next() {
                    if tape.requires.borrow().contains(&t.id()) {
                        accumulate(&mut grads, t, g)?;
                    }
                }
            }
        }
    }
    Ok(grads)
}

/// Captures the forward of `model` on `inputs`, the scalar `loss` of its outputs, and the
/// backward of that loss into one [`JointGraph`]. Gradients are taken for every parameter that
/// requires grad (in `named_parameters` order) and for the inputs listed in `grad_inputs`.
/// The model's training flag is respected (BatchNorm in train mode updates its running
/// statistics when the graph runs; dropout draws from the generator in eager order).
///
/// ```
/// use ferrofx_compile::training::capture_joint;
/// use ferrofx_nn::{zoo::Mlp, Module};
/// use ferrofx_core::{Tensor, Value};
/// let mlp = Mlp::new(4, &[3], 2).unwrap();
/// let x = Tensor::from_vec(vec![0.5f32; 8], &[2, 4]).unwrap();
/// let joint = capture_joint(&mlp, &[x.clone().into()], &|out, _| out[0].as_tensor().unwrap().sum(), &[]).unwrap();
/// let (fwd, grads) = joint.run(&[x.into()]).unwrap();
/// assert_eq!(fwd.len(), 2); // the loss and the model output
/// assert_eq!(grads.len(), mlp.parameters().len());
/// ```
pub fn capture_joint(
    model: &dyn Module,
    inputs: &[Value],
    loss: &LossFn<'_>,
    grad_inputs: &[usize],
) -> Result<JointGraph> {
    capture_joint_with_targets(model, inputs, &[], loss, grad_inputs)
}

/// [`capture_joint`] with loss targets: `targets` (labels, ...) are inputs of the joint graph
/// after the model's inputs, passed to `loss` only (the model's forward gets `inputs`).
pub fn capture_joint_with_targets(
    model: &dyn Module,
    inputs: &[Value],
    targets: &[Value],
    loss: &LossFn<'_>,
    grad_inputs: &[usize],
) -> Result<JointGraph> {
    const OP: &str = "capture_joint";
    if let Some(&bad) = grad_inputs.iter().find(|&&i| i >= inputs.len()) {
        return Err(Error::argument(
            OP,
            format!("grad_inputs names input {bad}, but the model gets {} inputs", inputs.len()),
        ));
    }
    let params: Vec<(String, Tensor)> =
        model.named_parameters().into_iter().filter(|(_, p)| p.requires_grad()).collect();
    let m = inputs.len();
    let n = m + targets.len();
    let mut examples = inputs.to_vec();
    examples.extend(targets.iter().cloned());
    examples.push(Value::Tensor(Tensor::scalar(1.0f32)));
    let mut names: Vec<String> = (0..n).map(|i| if n == 1 { "x".to_string() } else { format!("x{i}") }).collect();
    names.push("tangent".into());
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let num_outputs = Cell::new(0usize);
    let gm = Tracer::new().is_leaf_module(|_, _| false).input_names(&name_refs).trace_method_with_inputs(
        model,
        &examples,
        |args| {
            let inner = current_trace_hook().ok_or_else(|| Error::trace(OP, "no tracer is active"))?;
            let tape = Rc::new(Tape {
                inner,
                recording: Cell::new(true),
                requires: RefCell::new(HashSet::new()),
                entries: RefCell::new(Vec::new()),
            });
            {
                let mut r = tape.requires.borrow_mut();
                r.extend(params.iter().map(|(_, p)| p.id()));
                for &i in grad_inputs {
                    match &args[i] {
                        Value::Tensor(t) => {
                            r.insert(t.id());
                        }
                        other => {
                            return Err(Error::argument(OP, format!("grad_inputs names input {i}, which is {other:?}, not a tensor")))
                        }
                    }
                }
            }
            let (primals, loss_targets) = (&args[..m], &args[m..n]);
            let tangent = args[n].as_tensor().cloned().ok_or_else(|| Error::trace(OP, "the tangent is not a tensor"))?;
            let hook: Rc<dyn TraceHook> = tape.clone();
            let (outs, l) = with_trace_hook(hook.clone(), || -> Result<(Vec<Value>, Tensor)> {
                let outs = model.forward_values(primals)?;
                let l = loss(&outs, loss_targets)?;
                Ok((outs, l))
            })?;
            match l.meta() {
                Some(m) if m.shape.is_empty() && m.dtype == DType::F32 => {}
                Some(m) => {
                    return Err(Error::shape(
                        OP,
                        format!(
                            "the loss must be a float32 scalar, got shape {:?} dtype {:?}; reduce it (sum/mean) before capture",
                            m.shape, m.dtype
                        ),
                    ))
                }
                None => return Err(Error::trace(OP, "the loss has no shape while tracing")),
            }
            if !tape.requires.borrow().contains(&l.id()) {
                return Err(Error::autograd(
                    OP,
                    "the loss does not depend on any parameter or input requiring grad: nothing to differentiate",
                ));
            }
            tape.recording.set(false);
            // grad mode off, as in eager backward: the formulas take the same paths (fused
            // kernels are registry ops such as `conv2d_backward`, recorded like any other)
            let grads = with_trace_hook(hook, || backward(&tape, &l, &tangent))?;
            let mut out = Vec::with_capacity(1 + outs.len() + params.len() + grad_inputs.len());
            out.push(Value::Tensor(l));
            out.extend(outs.iter().cloned());
            num_outputs.set(out.len());
            let grad_of = |t: &Tensor| grads.get(&t.id()).cloned().map(Value::Tensor).unwrap_or(Value::None);
            out.extend(params.iter().map(|(_, p)| grad_of(p)));
            for &i in grad_inputs {
                out.push(args[i].as_tensor().map(grad_of).unwrap_or(Value::None));
            }
            Ok(out)
        },
    )?;
    let mut grad_targets: Vec<GradTarget> = params.into_iter().map(|(p, _)| GradTarget::Parameter(p)).collect();
    grad_targets.extend(grad_inputs.iter().map(|&i| GradTarget::Input(i)));
    Ok(JointGraph { gm, num_primals: n, num_forward_outputs: num_outputs.get(), grad_targets })
}
