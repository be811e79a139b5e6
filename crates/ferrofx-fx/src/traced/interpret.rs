//! Interpreting an [`InternalGraph`] with the seed's semantics: a map from value nodes to
//! runtime values; every expression, in order, receives the values of its `inputs` and binds
//! its `outputs`; the result is the values of the graph's `outputs`.
//!
//! Calls reuse the [`Interpreter`](crate::Interpreter)'s default node evaluation (registry ops
//! by name, module calls through [`Module::call`]), so the view and the graph can never
//! disagree on what a node computes.

use super::expr::{Expr, ExprKind, InternalGraph};
use crate::graph_module::GraphModule;
use crate::interpreter::{default_run_node, DefaultInterpreter, Env, NodeValue};
use ferrofx_core::{Error, Result, Value};
use ferrofx_nn::Module;
use std::fmt;

/// What a value node holds while interpreting: a module (`self`, a submodule) or a value.
#[derive(Clone)]
pub enum ExprValue<'a> {
    /// A module.
    Module(&'a dyn Module),
    /// A tensor (or a list of tensors for a multi-output call, or a literal).
    Value(Value),
}

impl fmt::Debug for ExprValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExprValue::Module(m) => write!(f, "Module({})", m.type_name()),
            ExprValue::Value(v) => write!(f, "{v:?}"),
        }
    }
}

fn module_input<'a>(e: &Expr<'_>, inputs: &[ExprValue<'a>]) -> Result<&'a dyn Module> {
    match inputs.first() {
        Some(ExprValue::Module(m)) => Ok(*m),
        other => {
            Err(Error::argument("Expr::interpret", format!("{e}: the first input must be a module, got {other:?}")))
        }
    }
}

impl<'a> Expr<'a> {
    /// Runs this expression on the values of its [`Expr::inputs`] (one value per input, in
    /// order) and returns the values of its [`Expr::outputs`].
    ///
    /// `GetAttr` reads the attribute of its module input, `Constant` returns the captured
    /// value, calls run their op or module; an `Input` has no rule (its value is bound by the
    /// caller) and gives an `Err`, as does a wrong number or kind of inputs.
    pub fn interpret(&self, inputs: &[ExprValue<'a>]) -> Result<Vec<ExprValue<'a>>> {
        let want = self.inputs().len();
        if inputs.len() != want {
            return Err(Error::argument(
                "Expr::interpret",
                format!("{self}: takes {want} input value(s), got {}", inputs.len()),
            ));
        }
        let gm: &'a GraphModule = self.g.gm;
        match self.kind() {
            ExprKind::Input => Err(Error::argument(
                "Expr::interpret",
                format!("{self}: an Input has no rule; bind its value instead (InternalGraph::interpret does)"),
            )),
            ExprKind::Constant => {
                let e = gm.attributes().get(self.name()).ok_or_else(|| {
                    Error::argument("Expr::interpret", format!("{self}: constant '{}' is missing", self.name()))
                })?;
                Ok(vec![ExprValue::Value(Value::Tensor(e.tensor.clone()))])
            }
            ExprKind::GetAttr => {
                let owner = module_input(self, inputs)?;
                let path = self.name();
                let is_module = self.outputs().first().is_some_and(|o| o.type_name() == "ModuleNode");
                let root = owner.as_any().downcast_ref::<GraphModule>();
                if is_module {
                    let m = match root {
                        Some(r) => r.get_submodule_owned(path)?,
                        None => owner.get_submodule(path)?,
                    };
                    Ok(vec![ExprValue::Module(m)])
                } else {
                    let t = match root {
                        Some(r) => r.get_attr(path)?,
                        None => owner.get_tensor(path)?,
                    };
                    Ok(vec![ExprValue::Value(Value::Tensor(t))])
                }
            }
            ExprKind::CallFunction | ExprKind::CallMethod => {
                let node = self.graph_node().ok_or_else(|| {
                    Error::argument("Expr::interpret", format!("{self}: no graph node behind this call"))
                })?;
                let n = gm.graph().node(node).map_err(|e| Error::argument("Expr::interpret", e.to_string()))?;
                if self.module_path().is_some() {
                    // the module input must be the module the graph calls
                    let m = module_input(self, inputs)?;
                    let expected = gm.get_submodule_owned(n.target().name())?;
                    if !std::ptr::addr_eq(m as *const dyn Module, expected as *const dyn Module) {
                        return Err(Error::argument(
                            "Expr::interpret",
                            format!("{self}: the module input is not the module '{}'", n.target().name()),
                        ));
                    }
                }
                let mut env = Env::new();
                for (node, value) in self.inputs().iter().zip(inputs) {
                    if let (Some(id), ExprValue::Value(v)) = (node.graph_node(), value) {
                        env.insert(id, NodeValue::One(v.clone()));
                    }
                }
                let out = default_run_node(&mut DefaultInterpreter(gm), n, &env)?;
                let v = match out {
                    NodeValue::One(v) => v,
                    NodeValue::Many(vs) => {
                        Value::Tensors(vs.into_iter().filter_map(|v| v.as_tensor().cloned()).collect())
                    }
                };
                Ok(vec![ExprValue::Value(v)])
            }
        }
    }
}

impl<'m> InternalGraph<'m> {
    /// Runs the graph the seed's way: binds `self` to the module and the other inputs to
    /// `inputs`, interprets every expression in order on the values of its inputs, and returns
    /// the values of the outputs.
    ///
    /// ```
    /// use ferrofx_fx::symbolic_trace;
    /// use ferrofx_nn::{functional, Module, Result, Tensor};
    /// #[derive(ferrofx_nn::Module)]
    /// struct Net {}
    /// impl Module for Net {
    ///     fn forward(&self, x: &Tensor) -> Result<Tensor> { functional::relu(&(x * 2.0)?) }
    /// }
    /// let gm = symbolic_trace(&Net {}).unwrap();
    /// let x = Tensor::from_vec(vec![1.0f32, -1.0], &[2]).unwrap();
    /// let out = gm.internal_graph().interpret(&[x.into()]).unwrap();
    /// assert_eq!(out[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), vec![2.0, 0.0]);
    /// ```
    pub fn interpret(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let want = self.inputs.len() - 1;
        if inputs.len() != want {
            return Err(Error::argument(
                "InternalGraph::interpret",
                format!("{}.Graph takes {want} input(s) besides self, got {}", self.type_name(), inputs.len()),
            ));
        }
        let mut values: Vec<Option<ExprValue<'_>>> = vec![None; self.nodes.len()];
        values[self.inputs[0]] = Some(ExprValue::Module(self.gm));
        for (&n, v) in self.inputs[1..].iter().zip(inputs) {
            values[n] = Some(ExprValue::Value(v.clone()));
        }
        for e in self.exprs().into_iter().filter(|e| e.kind() != ExprKind::Input) {
            let args = e
                .inputs()
                .iter()
                .map(|i| {
                    values[i.idx].clone().ok_or_else(|| {
                        Error::argument("InternalGraph::interpret", format!("{e}: input '{i}' has no value"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            for (o, v) in e.outputs().iter().zip(e.interpret(&args)?) {
                values[o.idx] = Some(v);
            }
        }
        self.outputs
            .iter()
            .map(|&o| match values[o].clone() {
                Some(ExprValue::Value(v)) => Ok(v),
                other => Err(Error::argument(
                    "InternalGraph::interpret",
                    format!("output '{}' is {other:?}, not a value", self.nodes[o].name),
                )),
            })
            .collect()
    }
}
