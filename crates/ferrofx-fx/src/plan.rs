//! The execution plan of a [`GraphModule`]: built by `recompile` after lint, it resolves every
//! target once (registry ops, submodules, attributes), gives each node a value slot (dense, by
//! position in the graph) and lists after each step the slots whose last use it was, so values
//! are dropped as early as FX's generated code drops them. The readable form (`code()`) is
//! rendered on first request, not on every recompile.

use crate::graph::{Argument, Graph, NodeId, Opcode, Target};
use crate::graph_module::GraphModule;
use crate::values::{to_value, Slots};
use ferrofx_core::op::{bind, dispatch, ArgType, CallKind, OpDef};
use ferrofx_core::{Error, Result, Tensor, Value};
use std::fmt::Write;
use std::sync::OnceLock;

/// What one step of the plan does.
pub(crate) enum Step {
    Input(usize),
    Attr(Tensor),
    Op {
        def: &'static OpDef,
        kind: CallKind,
        args: Vec<Argument>,
        kwargs: Vec<(String, Argument)>,
        /// The arguments bound to the schema once, at build time (see [`prebind`]); `None`:
        /// converted and bound on every run.
        pre: Option<Vec<PreArg>>,
    },
    Module {
        path: String,
        args: Vec<Argument>,
        single: bool,
    },
    GetItem {
        from: NodeId,
        index: usize,
    },
    Output(Argument),
}

/// One argument of a pre-bound registry-op step.
pub(crate) enum PreArg {
    /// A literal, already converted and checked against the schema.
    Const(Value),
    /// The tensor value of the node in this slot.
    Slot(u32),
    /// A tensor list of the node values in these slots.
    Slots(Vec<u32>),
}

/// Binds a registry-op step's arguments once: literals are converted with the op's schema,
/// defaults filled and keywords placed, exactly as [`bind_args`] does on every run, while each
/// node argument stands in as a distinct placeholder tensor and becomes a [`PreArg::Slot`].
/// `None` (the step binds at run time) when a list holds nodes, a node sits where the schema
/// converts it (a tensor list), or binding fails (the run reports the error).
fn prebind(
    def: &'static OpDef,
    args: &[Argument],
    kwargs: &[(String, Argument)],
    slot_of: &[u32],
) -> Option<Vec<PreArg>> {
    let mut stand_ins: Vec<(usize, u32)> = Vec::new();
    let mut stand_in = |n: &NodeId| -> Option<Tensor> {
        let slot = *slot_of.get(n.index() as usize).filter(|&&s| s != NO_SLOT)?;
        let t = Tensor::scalar(0.0f32);
        stand_ins.push((t.id(), slot));
        Some(t)
    };
    let mut convert = |a: &Argument, ty: Option<ArgType>| -> Option<Value> {
        match a {
            Argument::Node(n) => stand_in(n).map(Value::Tensor),
            // a tensor list of nodes (fused_elementwise's inputs, cat's tensors)
            Argument::List(items) | Argument::Tuple(items)
                if ty == Some(ArgType::TensorList) && items.iter().all(|x| matches!(x, Argument::Node(_))) =>
            {
                let ts = items
                    .iter()
                    .map(|x| match x {
                        Argument::Node(n) => stand_in(n),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?;
                Some(Value::Tensors(ts))
            }
            _ => {
                let mut has_node = false;
                a.visit_nodes(&mut |_| has_node = true);
                if has_node {
                    return None;
                }
                to_value(a, ty, &NoSlots, def.name).ok()
            }
        }
    };
    let vals = args
        .iter()
        .enumerate()
        .map(|(j, a)| convert(a, def.schema.get(j).map(|s| s.ty)))
        .collect::<Option<Vec<_>>>()?;
    let kw = kwargs
        .iter()
        .map(|(k, a)| {
            let ty = def.schema.iter().find(|s| s.name == k.as_str()).map(|s| s.ty);
            convert(a, ty).map(|v| (k.clone(), v))
        })
        .collect::<Option<Vec<_>>>()?;
    let bound = bind(def.name, def.schema, vals, kw).ok()?;
    let mut placed = 0;
    let mut slot_of_stand_in = |t: &Tensor| -> Option<u32> {
        let &(_, slot) = stand_ins.iter().find(|(id, _)| *id == t.id())?;
        placed += 1;
        Some(slot)
    };
    let pre = bound
        .into_iter()
        .map(|v| match v {
            Value::Tensor(t) => slot_of_stand_in(&t).map(PreArg::Slot),
            Value::Tensors(ts) => ts.iter().map(&mut slot_of_stand_in).collect::<Option<Vec<_>>>().map(PreArg::Slots),
            v => Some(PreArg::Const(v)),
        })
        .collect::<Option<Vec<_>>>()?;
    (placed == stand_ins.len()).then_some(pre)
}

/// The pre-bound arguments of a step with the node values of this run; `None` when a node
/// value is not a single tensor or was freed (the dynamic path then reports it).
fn prebound(pre: &[PreArg], values: &[Option<Value>]) -> Option<Vec<Value>> {
    let mut out = Vec::with_capacity(pre.len());
    for a in pre {
        out.push(match a {
            PreArg::Const(v) => v.clone(),
            PreArg::Slot(s) => match values.get(*s as usize) {
                Some(Some(v @ Value::Tensor(_))) => v.clone(),
                _ => return None,
            },
            PreArg::Slots(slots) => Value::Tensors(
                slots
                    .iter()
                    .map(|s| match values.get(*s as usize) {
                        Some(Some(Value::Tensor(t))) => Some(t.clone()),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?,
            ),
        });
    }
    Some(out)
}

/// One step: the node it runs, what it does, and the slots freed after it.
pub(crate) struct PlanStep {
    pub(crate) node: NodeId,
    pub(crate) step: Step,
    pub(crate) frees: Vec<u32>,
}

/// A compiled GraphModule forward.
pub(crate) struct Plan {
    pub(crate) steps: Vec<PlanStep>,
    /// Slot of each node, indexed by `NodeId::index()` (`u32::MAX`: not in the plan).
    pub(crate) slot_of: Vec<u32>,
    pub(crate) num_inputs: usize,
    /// Each placeholder's name and default value (FX's `placeholder(default_value=..)`).
    inputs: Vec<(String, Option<Value>)>,
    code: OnceLock<String>,
}

/// No node values: for converting literal arguments (placeholder defaults).
struct NoSlots;

impl Slots for NoSlots {
    fn get(&self, node: NodeId) -> Result<Value> {
        Err(Error::argument("placeholder", format!("a placeholder default cannot refer to node {node:?}")))
    }
}

const NO_SLOT: u32 = u32::MAX;

pub(crate) struct Env<'a> {
    pub(crate) values: &'a [Option<Value>],
    pub(crate) slot_of: &'a [u32],
}

impl Slots for Env<'_> {
    fn get(&self, node: NodeId) -> Result<Value> {
        self.slot_of
            .get(node.index() as usize)
            .filter(|&&s| s != NO_SLOT)
            .and_then(|&s| self.values[s as usize].clone())
            .ok_or_else(|| Error::argument("GraphModule", format!("value of node {node:?} used after it was freed")))
    }
}

fn fmt_arg(g: &Graph, a: &Argument) -> String {
    match a {
        Argument::Node(n) => g.node(*n).map(|n| n.name().to_string()).unwrap_or_else(|_| "?".into()),
        Argument::List(v) => format!("[{}]", v.iter().map(|x| fmt_arg(g, x)).collect::<Vec<_>>().join(", ")),
        Argument::Tuple(v) => format!("({})", v.iter().map(|x| fmt_arg(g, x)).collect::<Vec<_>>().join(", ")),
        Argument::Str(s) => format!("{s:?}"),
        Argument::Bool(b) => b.to_string(),
        Argument::Int(i) => i.to_string(),
        Argument::Float(f) => format!("{f:?}"),
        Argument::None => "None".into(),
        other => format!("{other:?}"),
    }
}

impl Plan {
    /// Lints the graph and resolves every node into a step.
    pub(crate) fn build(gm: &GraphModule) -> Result<Plan> {
        let g = &gm.graph;
        g.lint().map_err(|e| Error::argument("recompile", format!("the graph fails lint: {e}")))?;
        let max_index = g.iter().map(|n| n.id().index() as usize + 1).max().unwrap_or(0);
        let mut slot_of = vec![NO_SLOT; max_index];
        let mut last_use: Vec<u32> = Vec::with_capacity(g.len());
        let mut steps = Vec::with_capacity(g.len());
        let mut num_inputs = 0;
        let mut inputs = Vec::new();
        for (i, n) in g.iter().enumerate() {
            slot_of[n.id().index() as usize] = i as u32;
            last_use.push(NO_SLOT);
            for input in n.all_input_nodes() {
                // lint guarantees inputs come earlier, so they have slots
                if let Some(&s) = slot_of.get(input.index() as usize).filter(|&&s| s != NO_SLOT) {
                    last_use[s as usize] = i as u32;
                }
            }
            let name = n.name();
            let step = match n.op() {
                Opcode::Placeholder => {
                    num_inputs += 1;
                    let default = match n.args().first() {
                        Some(a) => Some(to_value(a, None, &NoSlots, name)?),
                        None => None,
                    };
                    inputs.push((n.target().name().to_string(), default));
                    Step::Input(num_inputs - 1)
                }
                Opcode::GetAttr => {
                    let path = n.target().name();
                    let t = match gm.attrs.get(path) {
                        Some(e) => e.tensor.clone(),
                        None => gm.get_attr(path).map_err(|_| {
                            let what = format!("node '{name}': get_attr target '{path}' does not exist");
                            let problem = gm.target_problem(name, Opcode::GetAttr, path);
                            Error::argument(
                                "recompile",
                                match problem {
                                    Some(p) => format!("{p} ({what})"),
                                    None => what,
                                },
                            )
                        })?,
                    };
                    Step::Attr(t)
                }
                Opcode::CallFunction | Opcode::CallMethod => {
                    let (def, kind) = match (n.op(), n.target()) {
                        (Opcode::CallFunction, Target::Op(def)) => (*def, CallKind::Function),
                        (Opcode::CallMethod, Target::Str(m)) => (
                            ferrofx_core::op::lookup(m).ok_or_else(|| {
                                Error::argument("recompile", format!("node '{name}': no tensor method '{m}'"))
                            })?,
                            CallKind::Method,
                        ),
                        (_, t) => {
                            return Err(Error::argument(
                                "recompile",
                                format!("node '{name}': target '{}' is not a registry op; user functions cannot run in a GraphModule", t.name()),
                            ))
                        }
                    };
                    let args = n.args().to_vec();
                    if def.name == "getitem" {
                        let from = args.first().and_then(Argument::as_node);
                        let index = match args.get(1) {
                            Some(Argument::Int(i)) if *i >= 0 => Some(*i as usize),
                            _ => None,
                        };
                        match (from, index) {
                            (Some(from), Some(index)) => Step::GetItem { from, index },
                            _ => return Err(Error::argument("recompile", format!("node '{name}': malformed getitem"))),
                        }
                    } else {
                        let kwargs: Vec<(String, Argument)> =
                            n.kwargs().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                        let pre = prebind(def, &args, &kwargs, &slot_of);
                        Step::Op { def, kind, args, kwargs, pre }
                    }
                }
                Opcode::CallModule => {
                    let path = n.target().name().to_string();
                    if !gm.modules.contains_key(&path) {
                        let what = format!(
                            "node '{name}': call_module target '{path}' is not a submodule of this GraphModule"
                        );
                        let problem = match gm.target_problem(name, Opcode::CallModule, &path) {
                            Some(p) => format!("{p} ({what})"),
                            None => format!("{what}: an intermediate container has no forward"),
                        };
                        return Err(Error::argument("recompile", problem));
                    }
                    let args = n.args().to_vec();
                    // a module whose results are picked by getitem returns several values
                    // (call_values); otherwise a one-input call is the single-tensor forward
                    let multi = n.users().any(|u| crate::tracer::is_getitem(g, u));
                    Step::Module { path, single: args.len() == 1 && !multi, args }
                }
                Opcode::Output => Step::Output(n.args().first().cloned().unwrap_or(Argument::None)),
            };
            steps.push(PlanStep { node: n.id(), step, frees: Vec::new() });
        }
        // frees: after step i, drop every value whose last use is i (in slot order)
        for (s, &i) in last_use.iter().enumerate() {
            if i != NO_SLOT {
                steps[i as usize].frees.push(s as u32);
            }
        }
        Ok(Plan { steps, slot_of, num_inputs, inputs, code: OnceLock::new() })
    }

    /// The inputs completed with the placeholders' defaults when some trailing ones are missing
    /// (`None`: `given` is complete). A missing input without a default is an error in FX's
    /// words.
    pub(crate) fn complete_inputs(&self, gm: &GraphModule, given: &[Value]) -> Result<Option<Vec<Value>>> {
        if given.len() >= self.num_inputs {
            return Ok(None);
        }
        let mut all = given.to_vec();
        for (name, default) in &self.inputs[given.len()..] {
            match default {
                Some(v) => all.push(v.clone()),
                None => {
                    return Err(Error::argument(
                        "GraphModule.forward",
                        format!(
                            "{} takes {} inputs, got {}: expected positional argument for parameter {name}, but one was not passed in",
                            gm.type_name,
                            self.num_inputs,
                            given.len()
                        ),
                    ))
                }
            }
        }
        Ok(Some(all))
    }

    /// The plan as readable source (rendered once, on first request).
    pub(crate) fn code(&self, g: &Graph) -> &str {
        self.code.get_or_init(|| self.render(g))
    }

    fn render(&self, g: &Graph) -> String {
        let name_of = |node: NodeId| g.node(node).map(|n| n.name().to_string()).unwrap_or_else(|_| "?".into());
        let mut code = String::from("fn forward(&self");
        for st in &self.steps {
            if matches!(st.step, Step::Input(_)) {
                let _ = write!(code, ", {}: Tensor", name_of(st.node));
            }
        }
        code.push_str(") -> Result<Value> {\n");
        let mut by_slot: Vec<NodeId> = Vec::with_capacity(self.steps.len());
        by_slot.extend(self.steps.iter().map(|st| st.node));
        for st in &self.steps {
            let name = name_of(st.node);
            let shown = |args: &[Argument]| args.iter().map(|a| fmt_arg(g, a)).collect::<Vec<_>>();
            match &st.step {
                Step::Input(_) => continue,
                Step::Attr(_) => {
                    let path = g.node(st.node).map(|n| n.target().name().to_string()).unwrap_or_default();
                    let _ = write!(code, "    let {name} = self.{path};");
                }
                Step::Op { def, kind, args, kwargs, .. } => {
                    let mut all = shown(args);
                    all.extend(kwargs.iter().map(|(k, v)| format!("{k}={}", fmt_arg(g, v))));
                    if *kind == CallKind::Method && !all.is_empty() {
                        let _ = write!(code, "    let {name} = {}.{}({})?;", all[0], def.name, all[1..].join(", "));
                    } else {
                        let _ = write!(code, "    let {name} = {}({})?;", def.name, all.join(", "));
                    }
                }
                Step::Module { path, args, .. } => {
                    let _ = write!(code, "    let {name} = self.{path}({})?;", shown(args).join(", "));
                }
                Step::GetItem { from, index } => {
                    let _ = write!(code, "    let {name} = {}[{index}];", name_of(*from));
                }
                Step::Output(a) => {
                    let _ = write!(code, "    return {};", fmt_arg(g, a));
                }
            }
            if !st.frees.is_empty() && !matches!(st.step, Step::Output(_)) {
                let names: Vec<String> = st.frees.iter().map(|&s| name_of(by_slot[s as usize])).collect();
                let _ = write!(code, "  drop({});", names.join(", "));
            }
            code.push('\n');
        }
        code.push_str("}\n");
        code
    }

    /// Runs the plan on `inputs`.
    pub(crate) fn run(&self, gm: &GraphModule, inputs: &[Value]) -> Result<Vec<Value>> {
        self.run_with(gm, inputs.len(), |k| inputs[k].clone())
    }

    /// Runs the plan on `inputs` it owns: each input is dropped after its last use, like every
    /// other value of the plan.
    pub(crate) fn run_owned(&self, gm: &GraphModule, mut inputs: Vec<Value>) -> Result<Vec<Value>> {
        let n = inputs.len();
        self.run_with(gm, n, |k| std::mem::replace(&mut inputs[k], Value::None))
    }

    fn run_with(&self, gm: &GraphModule, n: usize, mut input: impl FnMut(usize) -> Value) -> Result<Vec<Value>> {
        if n != self.num_inputs {
            return Err(Error::argument(
                "GraphModule.forward",
                format!("{} takes {} inputs, got {}", gm.type_name, self.num_inputs, n),
            ));
        }
        let mut values: Vec<Option<Value>> = vec![None; self.steps.len()];
        for (i, PlanStep { node, step, frees }) in self.steps.iter().enumerate() {
            let v = {
                let env = Env { values: &values, slot_of: &self.slot_of };
                match step {
                    Step::Input(k) => input(*k),
                    Step::Attr(t) => Value::Tensor(t.clone()),
                    Step::Op { def, kind, args, kwargs, pre } => {
                        match pre.as_deref().and_then(|p| prebound(p, &values)) {
                            Some(vals) => dispatch(def, *kind, &vals).map(op_value),
                            None => eval_op(def, *kind, args, kwargs, &env),
                        }
                        .map_err(|e| node_err(gm, *node, e))?
                    }
                    Step::Module { path, args, single } => {
                        let m = gm
                            .modules
                            .get(path)
                            .ok_or_else(|| Error::argument("forward", format!("no module '{path}'")))?;
                        let vals = args.iter().map(|a| to_value(a, None, &env, path)).collect::<Result<Vec<_>>>()?;
                        let mut out = match (single, vals.first()) {
                            (true, Some(Value::Tensor(x))) => {
                                vec![Value::Tensor(m.call(x).map_err(|e| node_err(gm, *node, e))?)]
                            }
                            _ => m.call_values(&vals).map_err(|e| node_err(gm, *node, e))?,
                        };
                        if out.len() == 1 {
                            out.remove(0)
                        } else {
                            Value::Tensors(out.into_iter().filter_map(|v| v.as_tensor().cloned()).collect())
                        }
                    }
                    Step::GetItem { from, index } => match env.get(*from)? {
                        Value::Tensors(ts) => ts.get(*index).cloned().map(Value::Tensor).ok_or_else(|| {
                            Error::index("getitem", format!("index {index} out of range for {} values", ts.len()))
                        })?,
                        other => {
                            return Err(Error::argument("getitem", format!("expected several values, got {other:?}")))
                        }
                    },
                    Step::Output(a) => {
                        let out = match a {
                            Argument::Tuple(items) | Argument::List(items) => {
                                items.iter().map(|x| to_value(x, None, &env, "output")).collect::<Result<Vec<_>>>()?
                            }
                            single => vec![to_value(single, None, &env, "output")?],
                        };
                        return Ok(out);
                    }
                }
            };
            values[i] = Some(v);
            for &s in frees {
                values[s as usize] = None;
            }
        }
        Err(Error::argument("GraphModule.forward", "the graph has no output node"))
    }
}

/// Runs one registry op on graph arguments whose node values come from `slots`: the arguments
/// are converted with the op's schema, bound, and dispatched; one output is a tensor value,
/// several are a tensor list.
pub(crate) fn eval_op(
    def: &'static OpDef,
    kind: CallKind,
    args: &[Argument],
    kwargs: &[(String, Argument)],
    slots: &dyn Slots,
) -> Result<Value> {
    let bound = bind_args(def, args, kwargs, slots)?;
    dispatch(def, kind, &bound).map(op_value)
}

/// An op's outputs as one value: one output is a tensor, several a tensor list.
fn op_value(mut out: ferrofx_core::op::Outputs) -> Value {
    if out.len() == 1 {
        Value::Tensor(out.remove(0))
    } else {
        Value::Tensors(out.into_iter().collect())
    }
}

/// The arguments of a registry-op step as runtime values, converted with the op's schema and
/// bound (what [`eval_op`] dispatches; the memory check hands them to the op's meta function).
pub(crate) fn bind_args(
    def: &'static OpDef,
    args: &[Argument],
    kwargs: &[(String, Argument)],
    slots: &dyn Slots,
) -> Result<Vec<Value>> {
    let what = def.name;
    let vals = args
        .iter()
        .enumerate()
        .map(|(j, a)| to_value(a, def.schema.get(j).map(|s| s.ty), slots, what))
        .collect::<Result<Vec<_>>>()?;
    let kw = kwargs
        .iter()
        .map(|(k, a)| {
            let ty: Option<ArgType> = def.schema.iter().find(|s| s.name == k.as_str()).map(|s| s.ty);
            Ok((k.clone(), to_value(a, ty, slots, what)?))
        })
        .collect::<Result<Vec<_>>>()?;
    if kw.is_empty() && vals.len() == def.schema.len() {
        Ok(vals)
    } else {
        bind(def.name, def.schema, vals, kw)
    }
}

pub(crate) fn node_err(gm: &GraphModule, node: NodeId, e: Error) -> Error {
    let name = gm.graph.node(node).map(|n| n.name().to_string()).unwrap_or_default();
    e.with_context(&format!("while running node '{name}' of the GraphModule traced from {}", gm.type_name))
}
