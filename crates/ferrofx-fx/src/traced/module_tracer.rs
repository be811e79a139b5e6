//! Module-preserving tracing (MegEngine's `trace_module`) and [`GraphModule::flatten`].
//!
//! [`ModuleTracer`] traces like [`Tracer`], except that every module called from `forward`
//! stays a module: built-in layers are leaves as usual, and **user-defined modules (and
//! built-in containers such as `Sequential`) become nested [`GraphModule`]s with their own
//! graphs**, traced from the inputs of their first call. The parent graph calls them with a
//! `call_module` node whose target is the child's path, so a nested module runs, trains and
//! prints like any other child; [`GraphModule::internal_graph`] shows it as
//! `block_out = block(x, )`, and the child's own expressions are in
//! `child.internal_graph()`.
//!
//! [`GraphModule::flatten`] inlines the hierarchy back into one graph: the same nodes, in the
//! same order, as [`crate::symbolic_trace`] (the ops of a child replace its `call_module`
//! node; its attributes and leaves are re-rooted under the child's path).
//!
//! Node names follow MegEngine: a call's result is `<op>_out` (`add_out`, `relu_out`,
//! `linear_out`, `add_out_1`), a traced constant is `const_tensor`.

use crate::graph::{Argument, Graph, NodeId, Opcode};
use crate::graph_module::{GraphModule, TensorEntry};
use crate::tracer::Tracer;
use ferrofx_core::{Error, Result, Value};
use ferrofx_nn::Module;
use indexmap::IndexMap;
use std::collections::{HashMap, HashSet};

/// A tracer that keeps the module hierarchy (see [`crate::traced`]).
#[derive(Clone, Debug, Default)]
pub struct ModuleTracer {
    fx_names: bool,
}

/// MegEngine's `trace_module(module, *inputs)`: traces `module` on example inputs into a
/// [`GraphModule`] whose user-defined submodules are nested traced modules; every node gets
/// its shape and dtype, names follow MegEngine (`add_out`, `const_tensor`).
///
/// ```
/// use ferrofx_fx::traced::trace_module;
/// use ferrofx_nn::{functional, Linear, Module, Result, Tensor};
/// #[derive(ferrofx_nn::Module)]
/// struct Block { linear: Linear }
/// impl Module for Block {
///     fn forward(&self, x: &Tensor) -> Result<Tensor> { functional::relu(&self.linear.call(x)?) }
/// }
/// #[derive(ferrofx_nn::Module)]
/// struct Net { block: Block }
/// impl Module for Net {
///     fn forward(&self, x: &Tensor) -> Result<Tensor> { self.block.call(x) }
/// }
/// let net = Net { block: Block { linear: Linear::new(3, 2, true).unwrap() } };
/// let x = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
/// let tm = trace_module(&net, &[x.clone().into()]).unwrap();
/// assert_eq!(
///     tm.internal_graph().to_string(),
///     "Net.Graph (self, x) {\n\t%2:\tblock = getattr(self, \"block\") -> (Block)\n\
///      \t%3:\tblock_out = block(x, )\n\treturn block_out\n}"
/// );
/// let block = tm.get_submodule_owned("block").unwrap();
/// let block = block.as_any().downcast_ref::<ferrofx_fx::GraphModule>().unwrap();
/// assert!(block.internal_graph().to_string().contains("relu_out = F.relu(linear_out, )"));
/// let flat = tm.flatten().unwrap();
/// assert_eq!(flat.forward(&x).unwrap().to_vec::<f32>().unwrap(), net.forward(&x).unwrap().to_vec::<f32>().unwrap());
/// ```
pub fn trace_module(module: &dyn Module, inputs: &[Value]) -> Result<GraphModule> {
    ModuleTracer::new().trace_with_inputs(module, inputs)
}

impl ModuleTracer {
    /// A module-preserving tracer with MegEngine's node names.
    pub fn new() -> ModuleTracer {
        ModuleTracer::default()
    }

    /// Keeps FX's node names (`add`, `add_1`, `linear`) instead of MegEngine's.
    pub fn fx_names(mut self, yes: bool) -> ModuleTracer {
        self.fx_names = yes;
        self
    }

    fn tracer(&self) -> Tracer {
        let me = self.clone();
        Tracer::new()
            .is_leaf_module(|_, _| true)
            .build_submodules_with(move |m, _path, inputs| Ok(Box::new(me.trace_values(m, inputs)?)))
    }

    /// Traces symbolically (no shapes) with `num_inputs` inputs.
    pub fn trace(&self, module: &dyn Module, num_inputs: usize) -> Result<GraphModule> {
        let gm = self.tracer().trace(module, num_inputs)?;
        self.finish(gm)
    }

    /// Traces on example inputs: every node gets its `tensor_meta`.
    pub fn trace_with_inputs(&self, module: &dyn Module, inputs: &[Value]) -> Result<GraphModule> {
        let gm = self.tracer().trace_with_inputs(module, inputs)?;
        self.finish(gm)
    }

    /// A child's trace from the values of its call: tensors with shapes are example inputs,
    /// tensors without make the trace symbolic, anything else is a concrete argument.
    fn trace_values(&self, module: &dyn Module, inputs: &[Value]) -> Result<GraphModule> {
        let mut tracer = self.tracer();
        let mut symbolic = false;
        for (i, v) in inputs.iter().enumerate() {
            match v {
                Value::Tensor(t) => symbolic |= t.meta().is_none(),
                other => tracer = tracer.concrete_arg(i, other.clone()),
            }
        }
        let gm = if symbolic {
            tracer.trace(module, inputs.len())?
        } else {
            let examples: Vec<Value> = inputs
                .iter()
                .map(|v| match v {
                    Value::Tensor(_) => v.clone(),
                    _ => Value::None,
                })
                .collect();
            tracer.trace_with_inputs(module, &examples)?
        };
        self.finish(gm)
    }

    fn finish(&self, mut gm: GraphModule) -> Result<GraphModule> {
        if !self.fx_names {
            let constants: HashSet<String> =
                gm.attributes().iter().filter(|(_, e)| e.constant).map(|(p, _)| p.clone()).collect();
            megengine_names(&constants, gm.graph_mut())?;
            gm.recompile()?;
        }
        Ok(gm)
    }
}

/// Renames call results `<base>_out` and traced constants `const_tensor` (MegEngine's names).
fn megengine_names(constants: &HashSet<String>, g: &mut Graph) -> Result<()> {
    let plan: Vec<(NodeId, String)> = g
        .iter()
        .filter_map(|n| {
            let base = match n.op() {
                Opcode::CallFunction | Opcode::CallMethod => format!("{}_out", n.target().name()),
                Opcode::CallModule => format!("{}_out", n.target().name().replace('.', "_")),
                Opcode::GetAttr if constants.contains(n.target().name()) => "const_tensor".to_string(),
                _ => return None,
            };
            Some((n.id(), base))
        })
        .collect();
    for (id, base) in plan {
        g.rename(id, &base).map_err(|e| Error::trace("trace_module", e.to_string()))?;
    }
    Ok(())
}

/// Copies `n` into `graph` with its inputs mapped (every input must be mapped already).
fn copy_node(graph: &mut Graph, n: &crate::graph::Node<'_>, map: &HashMap<NodeId, Argument>) -> Result<NodeId> {
    if let Some(missing) = n.all_input_nodes().into_iter().find(|i| !map.contains_key(i)) {
        return Err(Error::argument(
            "GraphModule::flatten",
            format!("node '{}' uses {missing:?} before it is defined", n.name()),
        ));
    }
    graph.node_copy(n, |id| Ok(map.get(&id).cloned().unwrap_or_default())).map_err(graph_err)
}

fn graph_err(e: crate::graph::GraphError) -> Error {
    Error::argument("GraphModule::flatten", e.to_string())
}

struct Flattener {
    graph: Graph,
    modules: IndexMap<String, Box<dyn Module>>,
    attrs: IndexMap<String, TensorEntry>,
    attr_nodes: HashMap<String, NodeId>,
}

impl Flattener {
    /// Copies `gm`'s graph under `prefix`; `inputs` are the values of its placeholders (`None`
    /// at the top, where placeholders are copied). Returns the output argument.
    fn inline(&mut self, gm: &GraphModule, prefix: &str, inputs: Option<&[Argument]>) -> Result<Argument> {
        let g = gm.graph();
        let mut map: HashMap<NodeId, Argument> = HashMap::new();
        let mut next_input = 0usize;
        let join = |p: &str| if prefix.is_empty() { p.to_string() } else { format!("{prefix}.{p}") };
        for n in g.iter() {
            let mapped = |map: &HashMap<NodeId, Argument>, a: &Argument| -> Result<Argument> {
                a.try_map_nodes(&mut |id| {
                    map.get(&id).cloned().ok_or_else(|| {
                        Error::argument("GraphModule::flatten", format!("node {id:?} is used before it is defined"))
                    })
                })
            };
            let value = match n.op() {
                Opcode::Placeholder => match inputs {
                    None => Argument::Node(self.graph.node_copy(&n, |_| Ok(Argument::None)).map_err(graph_err)?),
                    Some(vals) => {
                        let v =
                            vals.get(next_input).cloned().or_else(|| n.args().first().cloned()).ok_or_else(|| {
                                Error::argument(
                                    "GraphModule::flatten",
                                    format!("'{prefix}' is called with {} inputs, its graph has more", vals.len()),
                                )
                            })?;
                        next_input += 1;
                        v
                    }
                },
                Opcode::GetAttr => {
                    let path = join(n.target().name());
                    let id = match self.attr_nodes.get(&path) {
                        Some(&id) => id,
                        None => {
                            let id = self.graph.get_attr(&path).map_err(graph_err)?;
                            *self.graph.meta_mut(id).map_err(graph_err)? = n.meta().clone();
                            self.attr_nodes.insert(path.clone(), id);
                            let entry = match gm.attributes().get(n.target().name()) {
                                Some(e) => e.clone(),
                                None => TensorEntry {
                                    tensor: gm.get_attr(n.target().name())?,
                                    kind: ferrofx_nn::TensorKind::Parameter,
                                    constant: false,
                                },
                            };
                            self.attrs.insert(path, entry);
                            id
                        }
                    };
                    Argument::Node(id)
                }
                Opcode::CallModule => {
                    let path = n.target().name();
                    let child = gm.get_submodule_owned(path)?;
                    let args = n.args().iter().map(|a| mapped(&map, a)).collect::<Result<Vec<_>>>()?;
                    match child.as_any().downcast_ref::<GraphModule>() {
                        Some(sub) => self.inline(sub, &join(path), Some(&args))?,
                        None => {
                            let spec = child.spec().ok_or_else(|| {
                                Error::argument(
                                    "GraphModule::flatten",
                                    format!("module '{path}' is neither a built-in layer nor a traced module"),
                                )
                            })?;
                            let full = join(path);
                            let id = copy_node(&mut self.graph, &n, &map)?;
                            self.graph.set_target(id, full.clone().into()).map_err(graph_err)?;
                            if !self.modules.contains_key(&full) {
                                let m =
                                    ferrofx_nn::spec::build_builtin(&spec, &mut |t: &str| child.get_tensor(t).ok())?;
                                self.modules.insert(full, m);
                            }
                            Argument::Node(id)
                        }
                    }
                }
                Opcode::CallFunction if crate::tracer::is_getitem(g, n.id()) => {
                    // picking from an inlined child's tuple: the element itself
                    let from = n.args().first().map(|a| mapped(&map, a)).transpose()?;
                    match (from, n.args().get(1)) {
                        (Some(Argument::Tuple(items) | Argument::List(items)), Some(Argument::Int(i))) => {
                            items.get(*i as usize).cloned().ok_or_else(|| {
                                Error::index("GraphModule::flatten", format!("getitem {i} of {} values", items.len()))
                            })?
                        }
                        _ => Argument::Node(copy_node(&mut self.graph, &n, &map)?),
                    }
                }
                Opcode::CallFunction | Opcode::CallMethod => Argument::Node(copy_node(&mut self.graph, &n, &map)?),
                Opcode::Output => {
                    let out = mapped(&map, n.args().first().unwrap_or(&Argument::None))?;
                    if inputs.is_none() {
                        self.graph.output(out.clone()).map_err(graph_err)?;
                    }
                    return Ok(out);
                }
            };
            map.insert(n.id(), value);
        }
        Err(Error::argument("GraphModule::flatten", format!("the graph of '{prefix}' has no output node")))
    }
}

impl GraphModule {
    /// Inlines nested traced modules (from [`trace_module`]) into one graph: the result has
    /// only built-in leaves, and the same nodes as [`crate::symbolic_trace`] of the original
    /// model. Tensors and leaves are shared, not copied. A module without nested traced
    /// modules flattens to a copy of itself.
    pub fn flatten(&self) -> Result<GraphModule> {
        let mut f = Flattener {
            graph: Graph::new(),
            modules: IndexMap::new(),
            attrs: IndexMap::new(),
            attr_nodes: HashMap::new(),
        };
        f.inline(self, "", None)?;
        f.graph
            .eliminate_dead_code(None)
            .map_err(|e| Error::argument("GraphModule::flatten", format!("the flattened graph fails lint: {e}")))?;
        f.graph
            .lint()
            .map_err(|e| Error::argument("GraphModule::flatten", format!("the flattened graph fails lint: {e}")))?;
        GraphModule::from_parts(f.graph, f.modules, f.attrs, self.traced_type_name(), self.is_training())
    }
}
