//! The memory budget of a [`GraphModule`] run: before the plan runs on concrete inputs, every
//! intermediate's shape and dtype is inferred from the actual inputs with the registry's meta
//! functions (no data is touched, nothing is allocated), and the peak of the bytes alive at
//! once is computed by liveness over the plan's slots (a value is freed after its last use, as
//! the plan frees it). A plan whose peak exceeds the module's limit is refused with an error
//! naming the node, its shape and dtype, the bytes and the limit, instead of running until the
//! allocator aborts or the kernel's OOM killer ends the process. This is what makes running a
//! module loaded from a stranger's file safe.
//!
//! The limit defaults to half the machine's physical memory ([`default_max_memory`]) and is set
//! per module with [`GraphModule::set_max_memory`] (the CLI's `--max-memory`). The result is
//! cached per input shapes, so a training loop pays for the check once.
//!
//! The same pass bounds the *work*: each op's cost (the registry's FLOP count for the inferred
//! shapes) is summed over the plan, and a forward whose total exceeds the module's compute
//! limit ([`DEFAULT_MAX_FLOPS`], [`GraphModule::set_max_flops`], the CLI's `--max-flops`) is
//! refused before any kernel runs, naming the node that crosses the limit and its FLOPs. A
//! file cannot make `run` spin for hours with a huge pooling window over a small output.
//!
//! Counted: every op and module output (views, in-place results and `getitem` share their
//! input's storage and count nothing); inputs, parameters and constants exist already and are
//! not counted. Inside a leaf module (a `Conv2d`, an `LSTM`) each op's output is checked on its
//! own against what is left of the budget.
//!
//! ```
//! use ferrofx_fx::symbolic_trace;
//! use ferrofx_nn::{Linear, Module, Tensor};
//! let gm = symbolic_trace(&Linear::new(3, 2, true).unwrap()).unwrap();
//! let x = Tensor::from_vec(vec![0.0f32; 12], &[4, 3]).unwrap();
//! let peak = gm.peak_memory(&[x.clone().into()]).unwrap();
//! assert_eq!(peak.bytes, 4 * 2 * 4); // the [4, 2] float32 output
//! gm.set_max_memory(Some(16));
//! let e = gm.forward(&x).unwrap_err();
//! assert!(e.to_string().contains("node 'linear'"), "{e}");
//! assert!(e.to_string().contains("[4, 2]"), "{e}");
//! gm.set_max_memory(None);
//! gm.set_max_flops(Some(10)); // the [4, 3] @ [3, 2] product alone is 48 FLOPs
//! let e = gm.forward(&x).unwrap_err();
//! assert!(e.to_string().contains("48 FLOPs"), "{e}");
//! ```

use crate::graph_module::GraphModule;
use crate::plan::{bind_args, Env, Plan, Step};
use crate::values::{to_value, Slots};
use ferrofx_core::memory::{format_bytes, physical_memory_or_default};
use ferrofx_core::op::{CallKind, Category, Effect, OpDef, Outputs};
use ferrofx_core::trace::{with_trace_hook, Symbolic, TraceHook};
use ferrofx_core::{DType, Error, Result, Tensor, TensorMeta, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// The default memory limit of a run: half the physical memory (8 GiB where it is unknown).
pub fn default_max_memory() -> u64 {
    physical_memory_or_default() / 2
}

/// The default compute limit of one forward: 10^13 floating-point operations (about three
/// minutes at 50 GFLOP/s). A ResNet-50 forward at batch 256 is 2 * 10^12; raise the limit with
/// [`GraphModule::set_max_flops`] (or `--max-flops`) for larger work.
pub const DEFAULT_MAX_FLOPS: u64 = 10_000_000_000_000;

/// What [`GraphModule::peak_memory`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakMemory {
    /// Most bytes of intermediate values alive at once.
    pub bytes: u128,
    /// The node at which the peak is reached.
    pub node: String,
    /// Floating-point operations of the whole forward (the registry's cost of every op).
    pub flops: u128,
}

/// The budget state of a module: its limits and the input signature last checked under them.
#[derive(Default)]
pub(crate) struct BudgetState {
    limit: Option<u64>,
    flops: Option<u64>,
    checked: Option<Vec<(Vec<usize>, DType)>>,
}

fn signature(inputs: &[Value]) -> Option<Vec<(Vec<usize>, DType)>> {
    inputs
        .iter()
        .map(|v| match v {
            Value::Tensor(t) if !t.is_symbolic() => Some((t.shape().to_vec(), t.dtype())),
            Value::Tensor(_) => None,
            _ => Some((vec![], DType::Bool)),
        })
        .collect()
}

/// Whether `inputs` have the signature `sig` (what [`signature`] would return).
fn same_signature(sig: &[(Vec<usize>, DType)], inputs: &[Value]) -> bool {
    sig.len() == inputs.len()
        && sig.iter().zip(inputs).all(|((shape, dtype), v)| match v {
            Value::Tensor(t) => !t.is_symbolic() && t.dtype() == *dtype && t.shape() == shape.as_slice(),
            _ => shape.is_empty() && *dtype == DType::Bool,
        })
}

fn meta_tensor(m: TensorMeta) -> Tensor {
    Tensor::symbolic(Symbolic { meta: Some(m), proxy: Arc::new(()) })
}

/// Whether `m` describes a row-major contiguous tensor (sizes-1 dims ignored).
fn is_contiguous(m: &TensorMeta) -> bool {
    let mut expected = 1usize;
    for (&d, &s) in m.shape.iter().zip(m.strides.iter()).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

fn meta_bytes(m: &TensorMeta) -> u128 {
    m.shape.iter().fold(m.dtype.size() as u128, |b, &d| b.saturating_mul(d as u128))
}

/// Bytes an op call allocates for its outputs: none for in-place ops and for views; a view op
/// whose contiguous output comes from a non-contiguous input (`reshape` of an expanded tensor,
/// `contiguous`) copies, and counts.
fn out_bytes(def: &OpDef, args: &[Value], metas: &[TensorMeta]) -> u128 {
    if matches!(def.effect, Effect::Mutates(_)) || def.name == "getitem" {
        return 0;
    }
    if def.category == Category::View {
        let input = args.iter().find_map(|a| match a {
            Value::Tensor(t) => t.meta(),
            _ => None,
        });
        let copies = match (input, metas.first()) {
            (Some(i), Some(o)) => !is_contiguous(&i) && is_contiguous(o) && o.numel() > 1,
            _ => false,
        };
        if !copies {
            return 0;
        }
    }
    metas.iter().map(meta_bytes).sum()
}

fn value_bytes(v: &Value) -> u128 {
    let one = |t: &Tensor| t.meta().map(|m| meta_bytes(&m)).unwrap_or(0);
    match v {
        Value::Tensor(t) => one(t),
        Value::Tensors(ts) => ts.iter().map(one).sum(),
        _ => 0,
    }
}

/// The largest single output inside a leaf module, with the op and its metadata.
struct Largest {
    bytes: u128,
    op: &'static str,
    meta: Option<TensorMeta>,
}

/// Trace hook used while a leaf module runs on metadata: every op (also on the module's own
/// concrete weights) answers with its meta function's outputs; the largest one is remembered.
struct MetaHook {
    largest: RefCell<Largest>,
    /// FLOPs of every op the module ran, and the costliest op.
    flops: RefCell<(u128, u128, &'static str)>,
}

impl TraceHook for MetaHook {
    fn record(&self, op: &'static OpDef, _kind: CallKind, args: &[Value]) -> Result<Outputs> {
        let metas = (op.meta)(args)?;
        let cost = (op.cost)(args, &metas).flops as u128;
        {
            let mut f = self.flops.borrow_mut();
            f.0 = f.0.saturating_add(cost);
            if cost > f.1 {
                f.1 = cost;
                f.2 = op.name;
            }
        }
        let bytes = out_bytes(op, args, &metas);
        let mut l = self.largest.borrow_mut();
        if bytes > l.bytes {
            *l = Largest { bytes, op: op.name, meta: metas.iter().max_by_key(|m| m.numel()).cloned() };
        }
        Ok(metas.into_iter().map(meta_tensor).collect())
    }
    fn concrete_query(&self, _what: &str, _location: &'static std::panic::Location<'static>) {}
    fn captures(&self, _t: &Tensor) -> bool {
        true
    }
}

/// Why the inference stopped: over the budget (an error to return), or something it cannot
/// infer (data-dependent code: the run itself decides).
enum Stop {
    Over(Error),
    Unknown,
}

impl GraphModule {
    /// Sets the most bytes of intermediate values a forward may hold at once (`None`: the
    /// default, [`default_max_memory`]). A forward whose inferred peak is larger fails before
    /// running any kernel.
    pub fn set_max_memory(&self, bytes: Option<u64>) {
        if let Ok(mut b) = self.budget.lock() {
            b.limit = bytes;
            b.checked = None;
        }
    }

    /// The memory limit of a forward in bytes.
    pub fn max_memory(&self) -> u64 {
        self.budget.lock().ok().and_then(|b| b.limit).unwrap_or_else(default_max_memory)
    }

    /// Sets the most floating-point operations one forward may take (`None`: the default,
    /// [`DEFAULT_MAX_FLOPS`]), counted from the registry's op costs on the inferred shapes. A
    /// forward over it fails before running any kernel.
    pub fn set_max_flops(&self, flops: Option<u64>) {
        if let Ok(mut b) = self.budget.lock() {
            b.flops = flops;
            b.checked = None;
        }
    }

    /// The compute limit of a forward in FLOPs.
    pub fn max_flops(&self) -> u64 {
        self.budget.lock().ok().and_then(|b| b.flops).unwrap_or(DEFAULT_MAX_FLOPS)
    }

    /// Forgets which input shapes passed the check (the graph changed).
    pub(crate) fn reset_budget(&self) {
        if let Ok(mut b) = self.budget.lock() {
            b.checked = None;
        }
    }

    /// The peak memory of a forward on inputs shaped like `inputs`, inferred without running
    /// any kernel; an error when it exceeds [`GraphModule::max_memory`] (kind
    /// [`ferrofx_core::ErrorKind::Limit`], naming the node, its shape and the limit). Parts that cannot be
    /// inferred without data (data-dependent ops) are left to the run.
    pub fn peak_memory(&self, inputs: &[Value]) -> Result<PeakMemory> {
        let plan = self.plan()?;
        match infer_peak(self, &plan, inputs, self.limits()) {
            Ok(p) => Ok(p),
            Err(Stop::Over(e)) => Err(e),
            Err(Stop::Unknown) => Ok(PeakMemory { bytes: 0, node: String::new(), flops: 0 }),
        }
    }

    /// The memory (bytes) and compute (FLOPs) limits of a forward.
    fn limits(&self) -> Limits {
        Limits { bytes: self.max_memory() as u128, flops: self.max_flops() as u128 }
    }

    /// Called by every forward on concrete inputs: checks the budget once per input signature.
    pub(crate) fn check_budget(&self, plan: &Plan, inputs: &[Value]) -> Result<()> {
        if ferrofx_core::trace::is_tracing() {
            return Ok(());
        }
        // the common case, a call with the signature checked last, allocates nothing
        if self.budget.lock().map(|b| b.checked.as_deref().is_some_and(|c| same_signature(c, inputs))).unwrap_or(false)
        {
            return Ok(());
        }
        let Some(sig) = signature(inputs) else { return Ok(()) };
        match infer_peak(self, plan, inputs, self.limits()) {
            Err(Stop::Over(e)) => return Err(e),
            Ok(_) | Err(Stop::Unknown) => {}
        }
        if let Ok(mut b) = self.budget.lock() {
            b.checked = Some(sig);
        }
        Ok(())
    }
}

/// The limits a forward is checked against.
#[derive(Clone, Copy)]
struct Limits {
    bytes: u128,
    flops: u128,
}

/// The FLOPs of node `node` (`what`) would take the forward past the compute limit.
fn over_flops(gm: &GraphModule, node: &str, what: &str, flops: u128, before: u128, limit: u128) -> Stop {
    Stop::Over(Error::limit(
        "GraphModule.forward",
        format!(
            "node '{node}' ({what}) would take {flops} FLOPs ({}) after {before} FLOPs of earlier nodes, over the compute limit of \
             {limit} FLOPs for running {}. A window, kernel or input this large is not a real model's; if it is meant, raise the \
             limit (GraphModule::set_max_flops, or --max-flops on the command line)",
            format_flops(flops),
            gm.type_name,
        ),
    ))
}

/// FLOPs in engineering units (`1.2 TFLOP`).
fn format_flops(f: u128) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = f as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.1} {}FLOP", UNITS[u])
}

fn over(
    gm: &GraphModule,
    node: &str,
    what: &str,
    meta: Option<&TensorMeta>,
    bytes: u128,
    live: u128,
    limit: u128,
) -> Stop {
    let shape = meta.map(|m| format!("a {} tensor of shape {:?}", m.dtype, m.shape.as_slice())).unwrap_or_default();
    Stop::Over(Error::limit(
        "GraphModule.forward",
        format!(
            "node '{node}' ({what}) would allocate {shape} ({}) while {} of other values are alive, over the memory limit of {} \
             for running {}. Run it on smaller inputs (a smaller batch), or raise the limit (GraphModule::set_max_memory, \
             or --max-memory on the command line) if the machine has the memory",
            format_bytes(bytes),
            format_bytes(live),
            format_bytes(limit),
            gm.type_name,
        ),
    ))
}

/// A meta function refused a size outright (over the allocation limit): a budget error naming
/// the node; any other meta failure leaves the decision to the run.
fn too_large(gm: &GraphModule, node: &str, e: Error, limit: u128) -> Stop {
    if e.kind() != ferrofx_core::ErrorKind::Limit {
        return Stop::Unknown;
    }
    Stop::Over(Error::limit(
        "GraphModule.forward",
        format!(
            "node '{node}' ({}): {}; the memory limit for running {} is {}. Run it on smaller inputs, or raise the limit \
             (GraphModule::set_max_memory, or --max-memory on the command line) if the machine has the memory",
            e.op(),
            e.message(),
            gm.type_name,
            format_bytes(limit)
        ),
    ))
}

fn infer_peak(gm: &GraphModule, plan: &Plan, inputs: &[Value], limits: Limits) -> Result<PeakMemory, Stop> {
    let limit = limits.bytes;
    let mut total_flops = 0u128;
    if inputs.len() != plan.num_inputs {
        return Err(Stop::Unknown);
    }
    let name_of = |n| gm.graph.node(n).map(|n| n.name().to_string()).unwrap_or_default();
    let mut values: Vec<Option<Value>> = vec![None; plan.steps.len()];
    let mut bytes_of: Vec<u128> = vec![0; plan.steps.len()];
    let (mut live, mut peak, mut peak_node) = (0u128, 0u128, String::new());
    for (i, st) in plan.steps.iter().enumerate() {
        let env = Env { values: &values, slot_of: &plan.slot_of };
        let (v, bytes, what, meta, flops): (Value, u128, String, Option<TensorMeta>, u128) = match &st.step {
            Step::Input(k) => (inputs[*k].clone(), 0, String::new(), None, 0),
            Step::Attr(t) => (Value::Tensor(t.clone()), 0, String::new(), None, 0),
            Step::Op { def, args, kwargs, .. } => {
                let bound = bind_args(def, args, kwargs, &env).map_err(|_| Stop::Unknown)?;
                let metas = (def.meta)(&bound).map_err(|e| too_large(gm, &name_of(st.node), e, limit))?;
                let flops = (def.cost)(&bound, &metas).flops as u128;
                let bytes = out_bytes(def, &bound, &metas);
                let meta = metas.iter().max_by_key(|m| m.numel()).cloned();
                let mut ts: Vec<Tensor> = metas.into_iter().map(meta_tensor).collect();
                let v = if ts.len() == 1 { Value::Tensor(ts.remove(0)) } else { Value::Tensors(ts) };
                (v, bytes, format!("op {}", def.name), meta, flops)
            }
            Step::Module { path, args, single } => {
                let m = gm.modules.get(path).ok_or(Stop::Unknown)?;
                let vals = args.iter().map(|a| to_value(a, None, &env, path)).collect::<Result<Vec<_>>>();
                let vals = vals.map_err(|_| Stop::Unknown)?;
                let vals: Vec<Value> = vals
                    .into_iter()
                    .map(|v| match v {
                        Value::Tensor(t) if !t.is_symbolic() => {
                            t.meta().map(|m| Value::Tensor(meta_tensor(m))).unwrap_or(Value::Tensor(t))
                        }
                        other => other,
                    })
                    .collect();
                let hook = Rc::new(MetaHook {
                    largest: RefCell::new(Largest { bytes: 0, op: "", meta: None }),
                    flops: RefCell::new((0, 0, "")),
                });
                let out = with_trace_hook(hook.clone(), || match (single, vals.first()) {
                    (true, Some(Value::Tensor(x))) => m.call(x).map(|t| vec![Value::Tensor(t)]),
                    _ => m.call_values(&vals),
                });
                let largest = hook.largest.borrow();
                let (flops, costliest, costliest_op) = *hook.flops.borrow();
                if largest.bytes > limit.saturating_sub(live) {
                    let what = format!("module '{path}', inside it op {}", largest.op);
                    return Err(over(gm, &name_of(st.node), &what, largest.meta.as_ref(), largest.bytes, live, limit));
                }
                if flops > limits.flops.saturating_sub(total_flops) {
                    let what = format!("module '{path}', {costliest} FLOPs of them in op {costliest_op}");
                    return Err(over_flops(gm, &name_of(st.node), &what, flops, total_flops, limits.flops));
                }
                let mut out = out.map_err(|e| too_large(gm, &name_of(st.node), e, limit))?;
                let v = if out.len() == 1 {
                    out.remove(0)
                } else {
                    Value::Tensors(out.into_iter().filter_map(|v| v.as_tensor().cloned()).collect())
                };
                let bytes = value_bytes(&v);
                let meta = match &v {
                    Value::Tensor(t) => t.meta(),
                    _ => None,
                };
                (v, bytes, format!("module '{path}'"), meta, flops)
            }
            Step::GetItem { from, index } => match env.get(*from) {
                Ok(Value::Tensors(ts)) => {
                    (ts.get(*index).cloned().map(Value::Tensor).ok_or(Stop::Unknown)?, 0, String::new(), None, 0)
                }
                _ => return Err(Stop::Unknown),
            },
            Step::Output(_) => break,
        };
        // memory first: an allocation too large is the more direct explanation
        if bytes > limit.saturating_sub(live) {
            return Err(over(gm, &name_of(st.node), &what, meta.as_ref(), bytes, live, limit));
        }
        if flops > limits.flops.saturating_sub(total_flops) {
            return Err(over_flops(gm, &name_of(st.node), &what, flops, total_flops, limits.flops));
        }
        total_flops += flops;
        live += bytes;
        bytes_of[i] = bytes;
        if live > peak {
            peak = live;
            peak_node = name_of(st.node);
        }
        values[i] = Some(v);
        for &s in &st.frees {
            values[s as usize] = None;
            live -= std::mem::take(&mut bytes_of[s as usize]);
        }
    }
    Ok(PeakMemory { bytes: peak, node: peak_node, flops: total_flops })
}
