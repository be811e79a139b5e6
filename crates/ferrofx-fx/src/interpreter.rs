//! [`Interpreter`]: runs a GraphModule node by node through overridable hooks (FX's
//! `torch.fx.Interpreter`). Unlike the compiled plan it goes through the registry by name
//! for every call, so it suits analyses (shape propagation, profiling, debugging), not speed.
//!
//! Override a per-opcode hook (`call_function`, `call_module`, ...) to change what a kind of
//! node does, or [`Interpreter::run_node`] to wrap every node, placeholders and the output
//! included as in FX (and call [`default_run_node`] for the default behaviour, like
//! `super().run_node(n)`). As FX's `Interpreter`, a run can start from an `initial_env`
//! ([`Interpreter::run_with_env`]: nodes already in it are not run), take its inputs by value
//! and free them early ([`Interpreter::boxed_run`]), run another graph against the same module
//! ([`Interpreter::run_graph`], FX's `graph=` argument), and frees every value after its last
//! use (FX's `garbage_collect_values`).
//!
//! ```
//! use ferrofx_fx::{symbolic_trace, GraphModule, Interpreter, NodeValue, Node, Target};
//! use ferrofx_nn::{Linear, Module, ReLU, Sequential, Tensor, Value, Result};
//!
//! /// Swaps relu for neg while interpreting (FX's NegSigmSwapInterpreter idea).
//! struct Swap<'m>(&'m GraphModule);
//! impl<'m> Interpreter<'m> for Swap<'m> {
//!     fn module(&self) -> &'m GraphModule { self.0 }
//!     fn call_function(&mut self, node: Node<'m>, target: &Target, args: Vec<Value>, kwargs: Vec<(String, Value)>) -> Result<NodeValue> {
//!         let t = if target.name() == "relu" { Target::op("neg").unwrap() } else { target.clone() };
//!         ferrofx_fx::interpreter::default_call_function(node, &t, args, kwargs)
//!     }
//! }
//!
//! #[derive(ferrofx_nn::Module)]
//! struct Net {}
//! impl Module for Net {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> { ferrofx_nn::functional::relu(x) }
//! }
//! let gm = symbolic_trace(&Net {}).unwrap();
//! let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
//! let out = Swap(&gm).run(&[x.into()]).unwrap();
//! assert_eq!(out[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), vec![-1.0, 2.0]);
//! ```

use crate::graph::{Argument, Graph, Node, NodeId, Opcode, Target};
use crate::graph_module::GraphModule;
use crate::tracer::is_getitem;
use ferrofx_core::op::call;
use ferrofx_core::{Error, Result, Value};
use std::cell::Cell;
use std::collections::HashMap;

/// The value of a node: one value, or the outputs of a node with several.
#[derive(Clone, Debug)]
pub enum NodeValue {
    /// One value.
    One(Value),
    /// Several outputs (selected by `getitem` nodes).
    Many(Vec<Value>),
}

impl NodeValue {
    /// The single value (an error naming `node` for several outputs).
    pub fn one(&self, node: &str) -> Result<Value> {
        match self {
            NodeValue::One(v) => Ok(v.clone()),
            NodeValue::Many(vs) => {
                Err(Error::argument(node, format!("'{node}' has {} outputs; select one with getitem", vs.len())))
            }
        }
    }
}

fn from_outputs(mut out: Vec<Value>) -> NodeValue {
    if out.len() == 1 {
        NodeValue::One(out.pop().unwrap_or(Value::None))
    } else {
        NodeValue::Many(out)
    }
}

/// The values computed so far, by node (FX's `Interpreter.env`), and the positional inputs the
/// placeholders take in order (FX's `args_iter`).
#[derive(Default)]
pub struct Env {
    values: HashMap<NodeId, NodeValue>,
    inputs: Vec<Option<Value>>,
    next_input: Cell<usize>,
    released: usize,
}

impl Env {
    /// An empty environment.
    pub fn new() -> Env {
        Env::default()
    }

    /// An environment holding `values` (FX's `initial_env`: those nodes are not run).
    pub fn with_values(values: impl IntoIterator<Item = (NodeId, NodeValue)>) -> Env {
        Env { values: values.into_iter().collect(), ..Env::default() }
    }

    /// The value of `node`, if computed and not freed yet.
    pub fn get(&self, node: NodeId) -> Option<&NodeValue> {
        self.values.get(&node)
    }

    /// Whether `node` has a value.
    pub fn contains(&self, node: NodeId) -> bool {
        self.values.contains_key(&node)
    }

    /// Sets the value of `node`.
    pub fn insert(&mut self, node: NodeId, value: NodeValue) -> Option<NodeValue> {
        self.values.insert(node, value)
    }

    /// Frees the value of `node`.
    pub fn remove(&mut self, node: NodeId) -> Option<NodeValue> {
        self.values.remove(&node)
    }

    /// How many values are held (what garbage collection keeps small).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no value is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The next positional input, consumed by a placeholder (FX's `next(self.args_iter)`);
    /// `None` when every input was taken.
    pub fn next_input(&self) -> Option<&Value> {
        let k = self.next_input.get();
        let v = self.inputs.get(k)?.as_ref();
        self.next_input.set(k + 1);
        v
    }

    /// Drops the inputs placeholders took (a boxed run holds nothing it no longer needs).
    fn release_taken_inputs(&mut self) {
        let taken = self.next_input.get().min(self.inputs.len());
        for v in &mut self.inputs[self.released.min(taken)..taken] {
            *v = None;
        }
        self.released = taken;
    }
}

/// Runs a GraphModule node by node (FX's `Interpreter`); every hook has a default.
pub trait Interpreter<'m> {
    /// The GraphModule interpreted.
    fn module(&self) -> &'m GraphModule;

    /// A `placeholder`: the positional input, or the placeholder's default.
    fn placeholder(&mut self, node: Node<'m>, input: Option<&Value>) -> Result<NodeValue> {
        match (input, node.args().first()) {
            (Some(v), _) => Ok(NodeValue::One(v.clone())),
            (None, Some(d)) => Ok(NodeValue::One(arg_value(d, &Env::new(), node.name())?)),
            (None, None) => Err(Error::argument(
                node.name(),
                format!(
                    "Expected positional argument for parameter {}, but one was not passed in!",
                    node.target().name()
                ),
            )),
        }
    }

    /// A `get_attr`: the tensor at the target path.
    fn get_attr(&mut self, node: Node<'m>, path: &str) -> Result<NodeValue> {
        match self.module().attributes().get(path) {
            Some(e) => Ok(NodeValue::One(Value::Tensor(e.tensor.clone()))),
            None => Err(Error::argument(node.name(), format!("get_attr target '{path}' does not exist"))),
        }
    }

    /// A `call_function` (a registry op).
    fn call_function(
        &mut self,
        node: Node<'m>,
        target: &Target,
        args: Vec<Value>,
        kwargs: Vec<(String, Value)>,
    ) -> Result<NodeValue> {
        default_call_function(node, target, args, kwargs)
    }

    /// A `call_method`: the registry op of that name on `args[0]`.
    fn call_method(
        &mut self,
        node: Node<'m>,
        name: &str,
        args: Vec<Value>,
        kwargs: Vec<(String, Value)>,
    ) -> Result<NodeValue> {
        let _ = node;
        call(name, args, kwargs).map(|o| from_outputs(o.into_iter().map(Value::Tensor).collect()))
    }

    /// A `call_module`: the submodule at the target path (`call` for a single tensor whose
    /// value is used directly, `call_values` otherwise, as the tracer recorded it).
    fn call_module(
        &mut self,
        node: Node<'m>,
        path: &str,
        args: Vec<Value>,
        kwargs: Vec<(String, Value)>,
    ) -> Result<NodeValue> {
        if !kwargs.is_empty() {
            return Err(Error::argument(node.name(), "modules take positional values only"));
        }
        let m = self.module().get_submodule_owned(path)?;
        let g = node.graph();
        let getitem_user = node.users().any(|u| is_getitem(g, u));
        match (&args[..], getitem_user) {
            ([Value::Tensor(x)], false) => Ok(NodeValue::One(Value::Tensor(m.call(x)?))),
            _ => m.call_values(&args).map(from_outputs),
        }
    }

    /// The `output` node: the returned values.
    fn output(&mut self, node: Node<'m>, values: Vec<Value>) -> Result<Vec<Value>> {
        let _ = node;
        Ok(values)
    }

    /// Runs one node, whatever its opcode (FX's `run_node`); the default is
    /// [`default_run_node`]. For the output node it returns the graph's results
    /// ([`NodeValue::Many`]).
    fn run_node(&mut self, node: Node<'m>, env: &Env) -> Result<NodeValue>
    where
        Self: Sized,
    {
        default_run_node(self, node, env)
    }

    /// Runs the module's graph on positional inputs (FX's `run`).
    fn run(&mut self, inputs: &[Value]) -> Result<Vec<Value>>
    where
        Self: Sized,
    {
        self.run_with_env(inputs, Env::new())
    }

    /// FX's `run(*args, initial_env=...)`: the nodes with a value in `initial_env` are not run
    /// (their value is used; a placeholder there takes no input).
    fn run_with_env(&mut self, inputs: &[Value], initial_env: Env) -> Result<Vec<Value>>
    where
        Self: Sized,
    {
        let graph = self.module().graph();
        self.run_graph(graph, inputs.to_vec(), initial_env)
    }

    /// FX's `boxed_run`: takes the inputs out of `inputs` (left empty) so each is freed as
    /// soon as its placeholder and last user ran.
    fn boxed_run(&mut self, inputs: &mut Vec<Value>) -> Result<Vec<Value>>
    where
        Self: Sized,
    {
        let graph = self.module().graph();
        let args = std::mem::take(inputs);
        self.run_graph(graph, args, Env::new())
    }

    /// Runs `graph` instead of the module's own (FX's `Interpreter(gm, graph=g)`): its
    /// `call_module` and `get_attr` nodes resolve against [`Interpreter::module`]. Every node
    /// goes through [`Interpreter::run_node`]; each value is dropped after its last use.
    fn run_graph(&mut self, graph: &'m Graph, inputs: Vec<Value>, initial_env: Env) -> Result<Vec<Value>>
    where
        Self: Sized,
    {
        let mut env = initial_env;
        env.inputs = inputs.into_iter().map(Some).collect();
        env.next_input.set(0);
        env.released = 0;
        let mut remaining: HashMap<NodeId, usize> = graph.iter().map(|n| (n.id(), n.num_users())).collect();
        for node in graph.iter() {
            if env.contains(node.id()) {
                continue;
            }
            let value = self.run_node(node, &env)?;
            if node.op() == Opcode::Output {
                return Ok(match value {
                    NodeValue::Many(vs) => vs,
                    NodeValue::One(v) => vec![v],
                });
            }
            env.insert(node.id(), value);
            env.release_taken_inputs();
            for input in node.all_input_nodes() {
                if let Some(r) = remaining.get_mut(&input) {
                    *r = r.saturating_sub(1);
                    if *r == 0 {
                        env.remove(input);
                    }
                }
            }
            if node.num_users() == 0 {
                env.remove(node.id());
            }
        }
        Err(Error::argument("Interpreter", "the graph has no output node"))
    }
}

/// A node argument's value; a node with several outputs is passed as its list of tensors
/// (what `getitem` takes).
fn arg_value(a: &Argument, env: &Env, node: &str) -> Result<Value> {
    let value_of = |n: NodeId| -> Result<Value> {
        match env.get(n) {
            Some(NodeValue::One(v)) => Ok(v.clone()),
            Some(NodeValue::Many(vs)) => {
                let mut ts = Vec::with_capacity(vs.len());
                for v in vs {
                    match v {
                        Value::Tensor(t) => ts.push(t.clone()),
                        other => {
                            return Err(Error::argument(
                                node,
                                format!("an output of an input of '{node}' is {other:?}, not a tensor"),
                            ))
                        }
                    }
                }
                Ok(Value::Tensors(ts))
            }
            None => Err(Error::argument(node, "an input of this node has no value (freed or not yet computed)")),
        }
    };
    Ok(match a {
        Argument::None => Value::None,
        Argument::Bool(b) => Value::Bool(*b),
        Argument::Int(i) => Value::Int(*i),
        Argument::Float(x) => Value::Float(*x),
        Argument::Str(s) => Value::Str(s.to_string()),
        Argument::DType(d) => Value::DType(*d),
        Argument::Node(n) => value_of(*n)?,
        Argument::List(items) | Argument::Tuple(items) => {
            if items.iter().all(|i| matches!(i, Argument::Int(_) | Argument::Bool(_))) {
                Value::Ints(
                    items
                        .iter()
                        .map(
                            |i| {
                                if let Argument::Int(v) = i {
                                    *v
                                } else {
                                    i64::from(matches!(i, Argument::Bool(true)))
                                }
                            },
                        )
                        .collect(),
                )
            } else if items.iter().all(|i| matches!(i, Argument::Int(_) | Argument::Float(_))) {
                Value::Floats(
                    items
                        .iter()
                        .map(|i| match i {
                            Argument::Int(v) => *v as f64,
                            Argument::Float(x) => *x,
                            _ => 0.0,
                        })
                        .collect(),
                )
            } else {
                let mut ts = Vec::with_capacity(items.len());
                for i in items.iter() {
                    match arg_value(i, env, node)? {
                        Value::Tensor(t) => ts.push(t),
                        other => {
                            return Err(Error::argument(
                                node,
                                format!("a list argument of '{node}' mixes tensors with {other:?}"),
                            ))
                        }
                    }
                }
                Value::Tensors(ts)
            }
        }
        other => return Err(Error::argument(node, format!("the argument {other:?} cannot be passed to a call"))),
    })
}

/// The default `call_function`: the registry op by name, binding the arguments to its schema.
pub fn default_call_function(
    node: Node<'_>,
    target: &Target,
    args: Vec<Value>,
    kwargs: Vec<(String, Value)>,
) -> Result<NodeValue> {
    match target {
        Target::Op(def) => {
            call(def.name, args, kwargs).map(|o| from_outputs(o.into_iter().map(Value::Tensor).collect()))
        }
        other => Err(Error::argument(
            node.name(),
            format!(
                "call_function target '{}' is not a registry op; override Interpreter::call_function to run it",
                other.name()
            ),
        )),
    }
}

/// FX's `Interpreter.run_node`: fetches the node's arguments from `env` and calls the hook of
/// its opcode; a placeholder takes the next positional input ([`Env::next_input`]), the output
/// node returns the graph's results as [`NodeValue::Many`].
pub fn default_run_node<'m, I: Interpreter<'m>>(interp: &mut I, node: Node<'m>, env: &Env) -> Result<NodeValue> {
    let name = node.name();
    match node.op() {
        Opcode::Placeholder => return interp.placeholder(node, env.next_input()),
        Opcode::GetAttr => return interp.get_attr(node, node.target().name()),
        Opcode::Output => {
            let a = node.args().first().cloned().unwrap_or_default();
            let vals = match &a {
                Argument::Tuple(items) | Argument::List(items) => {
                    items.iter().map(|i| arg_value(i, env, name)).collect::<Result<Vec<_>>>()?
                }
                other => match other.as_node().and_then(|n| env.get(n)) {
                    Some(NodeValue::Many(vs)) => vs.clone(),
                    _ => vec![arg_value(other, env, name)?],
                },
            };
            return interp.output(node, vals).map(NodeValue::Many);
        }
        _ => {}
    }
    let args = node.args().iter().map(|a| arg_value(a, env, name)).collect::<Result<Vec<_>>>()?;
    let kwargs = node
        .kwargs()
        .iter()
        .map(|(k, a)| arg_value(a, env, name).map(|v| (k.clone(), v)))
        .collect::<Result<Vec<_>>>()?;
    let ctx = |e: Error| Error::new(e.kind(), e.op(), format!("{} (while interpreting node '{name}')", e.message()));
    match node.op() {
        Opcode::CallFunction => interp.call_function(node, node.target(), args, kwargs).map_err(ctx),
        Opcode::CallMethod => interp.call_method(node, node.target().name(), args, kwargs).map_err(ctx),
        _ => interp.call_module(node, node.target().name(), args, kwargs).map_err(ctx),
    }
}

/// The plain interpreter with every default hook.
#[derive(Clone, Copy)]
pub struct DefaultInterpreter<'m>(pub &'m GraphModule);

impl<'m> Interpreter<'m> for DefaultInterpreter<'m> {
    fn module(&self) -> &'m GraphModule {
        self.0
    }
}
