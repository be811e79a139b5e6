//! Graph surgery in MegEngine's vocabulary: find expressions (by function, module type,
//! method, node name, id) on the [`InternalGraph`] view, then edit the [`GraphModule`] with
//! `insert_exprs`, `replace_node`, `compile` and the input/output methods.
//!
//! Every edit goes through the graph's own mutation API (one use-def routine, insertion
//! points), so the IR's invariants hold after each call (`lint` stays clean) and the execution
//! plan is rebuilt before the next run. Build a new view after editing.
//!
//! ```
//! use ferrofx_fx::{symbolic_trace, Argument, Target};
//! use ferrofx_nn::{functional, Module, Result, Tensor};
//! #[derive(ferrofx_nn::Module)]
//! struct Net {}
//! impl Module for Net {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> { functional::relu(x) }
//! }
//! let mut gm = symbolic_trace(&Net {}).unwrap();
//! let relu = gm.internal_graph().get_function_by_type("relu")[0].graph_node().unwrap();
//! let x = gm.graph().node(relu).unwrap().args()[0].clone();
//! let neg = gm.insert_exprs(relu, |g| g.call_function(Target::op("neg")?, vec![x])).unwrap();
//! gm.replace_node(relu, neg).unwrap();
//! assert_eq!(gm.compile().unwrap(), 1); // the relu is dead
//! let t = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
//! assert_eq!(gm.forward(&t).unwrap().to_vec::<f32>().unwrap(), vec![-1.0, 2.0]);
//! ```

use super::expr::{module_type_name, Expr, ExprKind, InternalGraph};
use crate::graph::{Argument, Graph, GraphError, NodeId, Opcode};
use crate::graph_module::GraphModule;
use ferrofx_core::{Error, Result};

fn edit_err(what: &str, e: GraphError) -> Error {
    Error::argument(what, e.to_string())
}

impl<'m> InternalGraph<'m> {
    /// Calls of the function `name` (MegEngine's `get_function_by_type(F.relu)`): the
    /// `CallFunction`s of that registry op or user function, and the operator `CallMethod`s
    /// that run it (`add` finds `x.__add__(y, )`).
    pub fn get_function_by_type(&self, name: &str) -> Vec<Expr<'_>> {
        self.exprs()
            .into_iter()
            .filter(|e| match e.kind() {
                ExprKind::CallFunction => e.name() == name,
                ExprKind::CallMethod => e.name().starts_with("__") && e.op_name() == Some(name),
                _ => false,
            })
            .collect()
    }

    /// Calls of modules of type `type_name` (`Linear`; a nested traced module by the type it
    /// was traced from) — MegEngine's `get_module_by_type(M.Linear)`.
    pub fn get_module_by_type(&self, type_name: &str) -> Vec<Expr<'_>> {
        self.exprs()
            .into_iter()
            .filter(|e| {
                e.module_path().is_some_and(|p| {
                    self.module().get_submodule_owned(p).is_ok_and(|m| module_type_name(m) == type_name)
                })
            })
            .collect()
    }

    /// `CallMethod`s of `method` (`reshape`, `__add__`, `__call__`) — MegEngine's
    /// `get_method_by_type`.
    pub fn get_method_by_type(&self, method: &str) -> Vec<Expr<'_>> {
        self.exprs().into_iter().filter(|e| e.kind() == ExprKind::CallMethod && e.name() == method).collect()
    }

    /// The expression producing the node named `name` (MegEngine's
    /// `get_node_by_name(name).expr`).
    pub fn get_expr_by_node_name(&self, name: &str) -> Option<Expr<'_>> {
        self.get_node_by_name(name).map(|n| n.expr())
    }
}

impl GraphModule {
    /// Runs `f` with the graph's insertion point right after `anchor` (MegEngine's
    /// `with graph.insert_exprs(expr):`); the previous point is restored afterwards.
    pub fn insert_exprs<R>(
        &mut self,
        anchor: NodeId,
        f: impl FnOnce(&mut Graph) -> crate::graph::Result<R>,
    ) -> Result<R> {
        let mut g = self.graph_mut().inserting_after(Some(anchor)).map_err(|e| edit_err("insert_exprs", e))?;
        f(&mut g).map_err(|e| edit_err("insert_exprs", e))
    }

    /// MegEngine's `replace_node({old: new})`: every use of `old` by an expression after `new`
    /// now uses `new` (uses before `new`, and `new` itself, are left alone so no value is used
    /// before it exists). Returns how many nodes changed.
    pub fn replace_node(&mut self, old: NodeId, new: NodeId) -> Result<usize> {
        let g = self.graph();
        let users: Vec<NodeId> = g.node(old).map_err(|e| edit_err("replace_node", e))?.users().collect();
        let mut after = Vec::with_capacity(users.len());
        for u in users {
            if u != new && g.is_before(new, u).map_err(|e| edit_err("replace_node", e))? {
                after.push(u);
            }
        }
        let changed = self
            .graph_mut()
            .replace_all_uses_with_where(old, new, |n| after.contains(&n.id()), false)
            .map_err(|e| edit_err("replace_node", e))?;
        Ok(changed.len())
    }

    /// MegEngine's `compile()`: removes expressions whose results nobody uses (pure ones; see
    /// [`Graph::eliminate_dead_code`]) and the modules and tensors no node refers to any more,
    /// then lints and rebuilds the plan. Returns the number of nodes removed.
    pub fn compile(&mut self) -> Result<usize> {
        let before = self.graph().len();
        self.graph_mut().eliminate_dead_code(None).map_err(|e| edit_err("compile", e))?;
        let removed = before - self.graph().len();
        self.delete_all_unused_submodules();
        self.delete_unused_attributes();
        self.graph().lint().map_err(|e| edit_err("compile", e))?;
        self.recompile()?;
        Ok(removed)
    }

    /// Adds a graph input called `name` (made unique) after the existing ones.
    pub fn add_input(&mut self, name: &str) -> Result<NodeId> {
        let last = self.graph().iter().rfind(|n| n.op() == Opcode::Placeholder).map(|n| n.id());
        let g = self.graph_mut();
        let mut g = match last {
            Some(l) => g.inserting_after(Some(l)),
            None => g.inserting_before(g.first()),
        }
        .map_err(|e| edit_err("add_input", e))?;
        g.placeholder(name).map_err(|e| edit_err("add_input", e))
    }

    /// Removes the graph input `input`; an `Err` if it is not an input or is still used.
    pub fn remove_input(&mut self, input: NodeId) -> Result<()> {
        let n = self.graph().node(input).map_err(|e| edit_err("remove_input", e))?;
        if n.op() != Opcode::Placeholder {
            return Err(Error::argument("remove_input", format!("'{}' is a {}, not a graph input", n.name(), n.op())));
        }
        if n.num_users() > 0 {
            let users: Vec<String> =
                n.users().filter_map(|u| self.graph().node(u).ok().map(|u| u.name().to_string())).collect();
            return Err(Error::argument(
                "remove_input",
                format!("input '{}' is still used by {users:?}; replace those uses first", n.name()),
            ));
        }
        self.graph_mut().erase_node(input).map_err(|e| edit_err("remove_input", e))
    }

    fn output_items(&self, what: &str) -> Result<(NodeId, Vec<Argument>)> {
        let out = self.graph().output_node().ok_or_else(|| Error::argument(what, "the graph has no output node"))?;
        let n = self.graph().node(out).map_err(|e| edit_err(what, e))?;
        let items = match n.args().first() {
            Some(Argument::Tuple(items)) | Some(Argument::List(items)) => items.to_vec(),
            Some(Argument::None) | None => vec![],
            Some(single) => vec![single.clone()],
        };
        Ok((out, items))
    }

    fn set_output_items(&mut self, what: &str, out: NodeId, mut items: Vec<Argument>) -> Result<()> {
        let arg = if items.len() == 1 { items.remove(0) } else { Argument::tuple(items) };
        self.graph_mut().set_args(out, vec![arg]).map_err(|e| edit_err(what, e))
    }

    /// Appends `node`'s value to the graph's outputs (the forward then returns one more value).
    pub fn add_output(&mut self, node: NodeId) -> Result<()> {
        let n = self.graph().node(node).map_err(|e| edit_err("add_output", e))?;
        if n.op() == Opcode::Output {
            return Err(Error::argument("add_output", "the output node cannot be an output"));
        }
        let (out, mut items) = self.output_items("add_output")?;
        items.push(Argument::Node(node));
        self.set_output_items("add_output", out, items)
    }

    /// Removes `node` from the graph's outputs; an `Err` if it is not one, or is the last one.
    pub fn remove_output(&mut self, node: NodeId) -> Result<()> {
        let (out, mut items) = self.output_items("remove_output")?;
        let pos = items.iter().position(|a| a.as_node() == Some(node)).ok_or_else(|| {
            let name = self.graph().node(node).map(|n| n.name().to_string()).unwrap_or_else(|_| format!("{node:?}"));
            Error::argument("remove_output", format!("'{name}' is not an output of the graph"))
        })?;
        if items.len() == 1 {
            return Err(Error::argument("remove_output", "cannot remove the graph's only output"));
        }
        items.remove(pos);
        self.set_output_items("remove_output", out, items)
    }
}
