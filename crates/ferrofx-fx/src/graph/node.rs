//! [`Node`]: one operation of a graph.

use crate::graph::argument::{Argument, Kwargs};
use crate::graph::meta::Meta;
use crate::graph::node_id::NodeId;
use crate::graph::node_set::NodeSet;
use crate::graph::target::{Opcode, Target};

/// One operation of a [`Graph`](crate::Graph) (FX's `Node`).
///
/// Nodes are owned by their graph and read through [`Graph::node`](crate::Graph::node); every
/// edit goes through the graph so that `users` / `input_nodes` stay consistent.
///
/// ```
/// use ferrofx_fx::{Graph, Opcode, Target};
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
/// let node = g.node(r).unwrap();
/// assert_eq!(node.name(), "relu");
/// assert_eq!(node.op(), Opcode::CallFunction);
/// assert_eq!(node.all_input_nodes(), vec![x]);
/// assert_eq!(g.node(x).unwrap().users().collect::<Vec<_>>(), vec![r]);
/// ```
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) id: NodeId,
    pub(crate) name: String,
    pub(crate) op: Opcode,
    pub(crate) target: Target,
    pub(crate) args: Vec<Argument>,
    pub(crate) kwargs: Kwargs,
    pub(crate) type_expr: Option<String>,
    /// Metadata (free to edit through [`Graph::meta_mut`](crate::Graph::meta_mut)); boxed and
    /// allocated on first write, which keeps `Node` small for cache-friendly walks.
    pub(crate) meta: Option<Box<Meta>>,
    pub(crate) users: NodeSet,
    pub(crate) input_nodes: NodeSet,
}

impl Node {
    /// This node's handle.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Unique (per graph) name, a valid identifier.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The opcode.
    pub fn op(&self) -> Opcode {
        self.op
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Positional arguments (FX's `args` tuple).
    pub fn args(&self) -> &[Argument] {
        &self.args
    }

    /// Keyword arguments, in insertion order.
    pub fn kwargs(&self) -> &Kwargs {
        &self.kwargs
    }

    /// The optional type annotation of the node's value.
    pub fn type_expr(&self) -> Option<&str> {
        self.type_expr.as_deref()
    }

    /// Metadata.
    pub fn meta(&self) -> &Meta {
        match &self.meta {
            Some(m) => m,
            None => Meta::empty(),
        }
    }

    /// Nodes that use this node's value, in the order they started using it.
    pub fn users(&self) -> impl DoubleEndedIterator<Item = NodeId> + '_ {
        self.users.iter()
    }

    /// The users as an ordered set.
    pub fn user_set(&self) -> &NodeSet {
        &self.users
    }

    /// Number of users.
    pub fn num_users(&self) -> usize {
        self.users.len()
    }

    /// Input nodes in order of first appearance in `args` then `kwargs` (FX's
    /// `all_input_nodes`).
    pub fn all_input_nodes(&self) -> Vec<NodeId> {
        self.input_nodes.to_vec()
    }

    /// The input nodes as an ordered set.
    pub fn input_set(&self) -> &NodeSet {
        &self.input_nodes
    }

    /// FX's `Node.is_impure`: placeholders and outputs are impure, as are calls of impure ops
    /// and impure user functions. Others are pure; pass a callback to
    /// [`Graph::eliminate_dead_code`](crate::Graph::eliminate_dead_code) for custom rules (e.g.
    /// impure modules).
    pub fn is_impure(&self) -> bool {
        match self.op {
            Opcode::Placeholder | Opcode::Output => true,
            Opcode::CallFunction => match &self.target {
                Target::Op(def) => !def.is_pure(),
                Target::Function(f) => f.is_impure(),
                Target::Str(_) => false,
            },
            Opcode::GetAttr | Opcode::CallMethod | Opcode::CallModule => false,
        }
    }

    /// Calls `f` on every node in `args` then `kwargs`, in first-appearance order, with
    /// repetitions.
    pub fn visit_input_refs(&self, f: &mut impl FnMut(NodeId)) {
        for a in &self.args {
            a.visit_nodes(f);
        }
        for a in self.kwargs.values() {
            a.visit_nodes(f);
        }
    }
}
