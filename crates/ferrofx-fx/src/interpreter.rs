//! [`Interpreter`]: runs a GraphModule node by node through overridable hooks (FX's
//! `torch.fx.Interpreter`). Unlike the compiled plan it goes through the registry by name
//! for every call, so it suits analyses (shape propagation, profiling, debugging), not speed.
//!
//! Override a per-opcode hook (`call_function`, `call_module`, ...) to change what a kind of
//! node does, or [`Interpreter::run_node`] to wrap every node (and call
//! [`default_run_node`] for the default behaviour, like `super().run_node(n)`).
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

use crate::graph::{Argument, Node, NodeId, Opcode, Target};
use crate::graph_module::GraphModule;
use crate::tracer::is_getitem;
use ferrofx_core::op::call;
use ferrofx_core::{Error, Result, Value};
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

/// The values computed so far, by node.
pub type Env = HashMap<NodeId, NodeValue>;

/// Runs a GraphModule node by node (FX's `Interpreter`); every hook has a default.
pub trait Interpreter<'m> {
    /// The GraphModule interpreted.
    fn module(&self) -> &'m GraphModule;

    /// A `placeholder`: the positional input, or the placeholder's default.
    fn placeholder(&mut self, node: Node<'m>, input: Option<&Value>) -> Result<NodeValue> {
        match (input, node.args().first()) {
            (Some(v), _) => Ok(NodeValue::One(v.clone())),
            (None, Some(d)) => Ok(NodeValue::One(arg_value(d, &Env::new(), node.name())?)),
            (None, None) => Err(Error::argument(node.name(), format!("missing input '{}'", node.target().name()))),
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
        let g = self.module().graph();
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

    /// Runs one node (FX's `run_node`); the default is [`default_run_node`].
    fn run_node(&mut self, node: Node<'m>, env: &Env) -> Result<NodeValue>
    where
        Self: Sized,
    {
        default_run_node(self, node, env, None)
    }

    /// Runs the whole graph on positional inputs, dropping each value after its last use.
    fn run(&mut self, inputs: &[Value]) -> Result<Vec<Value>>
    where
        Self: Sized,
    {
        let gm = self.module();
        let g = gm.graph();
        let mut remaining: HashMap<NodeId, usize> = g.iter().map(|n| (n.id(), n.num_users())).collect();
        let mut env: Env = HashMap::new();
        let mut next_input = 0usize;
        for node in g.iter() {
            let value = match node.op() {
                Opcode::Placeholder => {
                    let v = self.placeholder(node, inputs.get(next_input));
                    next_input += 1;
                    v?
                }
                Opcode::Output => {
                    let a = node.args().first().cloned().unwrap_or_default();
                    let vals = match &a {
                        crate::graph::Argument::Tuple(items) | crate::graph::Argument::List(items) => {
                            items.iter().map(|i| arg_value(i, &env, node.name())).collect::<Result<Vec<_>>>()?
                        }
                        other => match other.as_node().and_then(|n| env.get(&n)) {
                            Some(NodeValue::Many(vs)) => vs.clone(),
                            _ => vec![arg_value(other, &env, node.name())?],
                        },
                    };
                    return self.output(node, vals);
                }
                _ => self.run_node(node, &env)?,
            };
            env.insert(node.id(), value);
            for input in node.all_input_nodes() {
                if let Some(r) = remaining.get_mut(&input) {
                    *r = r.saturating_sub(1);
                    if *r == 0 {
                        env.remove(&input);
                    }
                }
            }
            if node.num_users() == 0 {
                env.remove(&node.id());
            }
        }
        Err(Error::argument("Interpreter", "the graph has no output node"))
    }
}

/// A node argument's value; a node with several outputs is passed as its list of tensors
/// (what `getitem` takes).
fn arg_value(a: &Argument, env: &Env, node: &str) -> Result<Value> {
    let value_of = |n: NodeId| -> Result<Value> {
        match env.get(&n) {
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
/// its opcode. `input` is used for placeholders.
pub fn default_run_node<'m, I: Interpreter<'m>>(
    interp: &mut I,
    node: Node<'m>,
    env: &Env,
    input: Option<&Value>,
) -> Result<NodeValue> {
    let name = node.name();
    let args = node.args().iter().map(|a| arg_value(a, env, name)).collect::<Result<Vec<_>>>()?;
    let kwargs = node
        .kwargs()
        .iter()
        .map(|(k, a)| arg_value(a, env, name).map(|v| (k.clone(), v)))
        .collect::<Result<Vec<_>>>()?;
    let ctx = |e: Error| Error::new(e.kind(), e.op(), format!("{} (while interpreting node '{name}')", e.message()));
    match node.op() {
        Opcode::Placeholder => interp.placeholder(node, input),
        Opcode::GetAttr => interp.get_attr(node, node.target().name()),
        Opcode::CallFunction => interp.call_function(node, node.target(), args, kwargs).map_err(ctx),
        Opcode::CallMethod => interp.call_method(node, node.target().name(), args, kwargs).map_err(ctx),
        Opcode::CallModule => interp.call_module(node, node.target().name(), args, kwargs).map_err(ctx),
        Opcode::Output => Ok(NodeValue::Many(args)),
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
