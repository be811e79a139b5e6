//! [`Transformer`]: rebuilds a GraphModule node by node through overridable hooks, producing a
//! new GraphModule (FX's `torch.fx.Transformer`). Each hook receives the node and its
//! arguments already mapped into the new graph, and returns the new node's value as an
//! [`Argument`] (usually a node; returning an input removes the node). New nodes are named from
//! their new targets and keep the original node's meta.
//!
//! ```
//! use ferrofx_fx::{symbolic_trace, Argument, Graph, Kwargs, Node, Result as GResult, Target, Transformer};
//! use ferrofx_nn::{Module, Tensor, Result};
//!
//! /// relu -> gelu (seed 000 §10.1 as a Transformer).
//! struct ReluToGelu;
//! impl Transformer for ReluToGelu {
//!     fn call_function(&mut self, g: &mut Graph, node: Node<'_>, args: Vec<Argument>, kwargs: Kwargs) -> Result<Argument> {
//!         let target = if node.target().name() == "relu" { Target::op("gelu").unwrap() } else { node.target().clone() };
//!         ferrofx_fx::transformer::emit(g, node, target, args, kwargs)
//!     }
//! }
//! #[derive(ferrofx_nn::Module)]
//! struct Net {}
//! impl Module for Net {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> { ferrofx_nn::functional::relu(x) }
//! }
//! let gm = symbolic_trace(&Net {}).unwrap();
//! let new = ReluToGelu.transform(&gm).unwrap();
//! assert!(new.code().unwrap().contains("gelu(x)"));
//! let x = Tensor::from_vec(vec![-1.0f32], &[1]).unwrap();
//! assert!(new.forward(&x).unwrap().to_vec::<f32>().unwrap()[0] < 0.0);
//! ```

use crate::graph::{Argument, Graph, Kwargs, Node, NodeId, Opcode, Target};
use crate::graph_module::GraphModule;
use ferrofx_core::{Error, Result};
use ferrofx_nn::Module;
use indexmap::IndexMap;
use std::collections::HashMap;

fn graph_err(e: crate::graph::GraphError) -> Error {
    Error::argument("Transformer", e.to_string())
}

/// Creates `node`'s copy in `g` with `target` and the mapped arguments, keeping its type and
/// meta: what the default hooks do. As in FX's `Transformer` (which creates nodes through its
/// tracer), the new node is named from its *new* target (`relu` retargeted to `sigmoid` gives
/// a node `sigmoid`); a placeholder keeps its name.
pub fn emit(g: &mut Graph, node: Node<'_>, target: Target, args: Vec<Argument>, kwargs: Kwargs) -> Result<Argument> {
    let name = (node.op() == Opcode::Placeholder).then(|| node.name());
    let id = g
        .create_node(node.op(), target, args, kwargs, name, node.type_expr().map(str::to_string))
        .map_err(graph_err)?;
    *g.meta_mut(id).map_err(graph_err)? = node.meta().clone();
    Ok(Argument::Node(id))
}

/// Rebuilds a GraphModule through per-opcode hooks; every hook defaults to copying the node.
pub trait Transformer {
    /// A `placeholder`.
    fn placeholder(&mut self, g: &mut Graph, node: Node<'_>, args: Vec<Argument>) -> Result<Argument> {
        emit(g, node, node.target().clone(), args, Kwargs::new())
    }
    /// A `get_attr`.
    fn get_attr(&mut self, g: &mut Graph, node: Node<'_>) -> Result<Argument> {
        emit(g, node, node.target().clone(), vec![], Kwargs::new())
    }
    /// A `call_function`.
    fn call_function(
        &mut self,
        g: &mut Graph,
        node: Node<'_>,
        args: Vec<Argument>,
        kwargs: Kwargs,
    ) -> Result<Argument> {
        emit(g, node, node.target().clone(), args, kwargs)
    }
    /// A `call_method`.
    fn call_method(&mut self, g: &mut Graph, node: Node<'_>, args: Vec<Argument>, kwargs: Kwargs) -> Result<Argument> {
        emit(g, node, node.target().clone(), args, kwargs)
    }
    /// A `call_module`.
    fn call_module(&mut self, g: &mut Graph, node: Node<'_>, args: Vec<Argument>, kwargs: Kwargs) -> Result<Argument> {
        emit(g, node, node.target().clone(), args, kwargs)
    }

    /// Runs the hooks over `gm`'s graph and returns the new GraphModule (sharing `gm`'s
    /// submodules and tensors).
    fn transform(&mut self, gm: &GraphModule) -> Result<GraphModule>
    where
        Self: Sized,
    {
        let src = gm.graph();
        let mut g = Graph::with_capacity(src.len());
        let mut env: HashMap<NodeId, Argument> = HashMap::with_capacity(src.len());
        for node in src.iter() {
            let map = |a: &Argument| -> Result<Argument> {
                a.try_map_nodes(&mut |n| {
                    env.get(&n).cloned().ok_or_else(|| {
                        Error::argument(node.name(), "an input of this node was not transformed before it")
                    })
                })
            };
            let args = node.args().iter().map(map).collect::<Result<Vec<_>>>()?;
            let mut kwargs = Kwargs::new();
            for (k, a) in node.kwargs() {
                kwargs.insert(k.clone(), map(a)?);
            }
            let new = match node.op() {
                Opcode::Placeholder => self.placeholder(&mut g, node, args)?,
                Opcode::GetAttr => self.get_attr(&mut g, node)?,
                Opcode::CallFunction => self.call_function(&mut g, node, args, kwargs)?,
                Opcode::CallMethod => self.call_method(&mut g, node, args, kwargs)?,
                Opcode::CallModule => self.call_module(&mut g, node, args, kwargs)?,
                Opcode::Output => {
                    g.output(args.into_iter().next().unwrap_or_default()).map_err(graph_err)?;
                    continue;
                }
            };
            env.insert(node.id(), new);
        }
        // The new GraphModule holds copies of the leaf modules sharing their tensors (as the
        // tracer does), and the same get_attr tensors.
        let mut modules: IndexMap<String, Box<dyn Module>> = IndexMap::new();
        for (path, m) in gm.leaf_modules() {
            let copy = m.clone_module().ok_or_else(|| {
                Error::argument(
                    "Transformer",
                    format!(
                        "leaf '{path}' ({}) cannot be copied (it does not implement Module::clone_module)",
                        m.type_name()
                    ),
                )
            })?;
            modules.insert(path.clone(), copy);
        }
        GraphModule::from_parts(g, modules, gm.attributes().clone(), gm.traced_type_name(), gm.is_training())
    }
}
