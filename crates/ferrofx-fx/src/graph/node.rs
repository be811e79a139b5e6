//! [`Node`]: a read-only view of one operation of a graph.

use crate::core_api;
use crate::graph::argument::{Argument, Kwargs};
use crate::graph::edge_set::{NodeSetRef, SetKind};
use crate::graph::graph::Graph;
use crate::graph::meta::Meta;
use crate::graph::node_id::NodeId;
use crate::graph::target::{Opcode, Target};
use std::fmt;

/// The shared empty kwargs of nodes without keyword arguments.
pub(crate) fn empty_kwargs() -> &'static Kwargs {
    static EMPTY: std::sync::OnceLock<Kwargs> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Kwargs::new)
}

/// One operation of a [`Graph`] (FX's `Node`), as a cheap `Copy` view into the graph.
///
/// The graph stores its nodes as struct-of-arrays (opcodes, user counts, names, targets,
/// args... each in its own contiguous array, indexed by slot); a `Node` is a graph reference
/// plus a slot index, obtained from [`Graph::node`] or [`Graph::iter`]. Every edit goes through
/// the graph so that `users` / `input_nodes` stay consistent.
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
#[derive(Clone, Copy)]
pub struct Node<'g> {
    pub(crate) g: &'g Graph,
    pub(crate) idx: u32,
}

impl<'g> Node<'g> {
    /// This node's handle.
    #[inline]
    pub fn id(&self) -> NodeId {
        self.g.id_of(self.idx)
    }

    /// Unique (per graph) name, a valid identifier.
    #[inline]
    pub fn name(&self) -> &'g str {
        self.g.name_of(self.idx)
    }

    /// The opcode.
    #[inline]
    pub fn op(&self) -> Opcode {
        self.g.ops[self.idx as usize]
    }

    /// The target.
    #[inline]
    pub fn target(&self) -> &'g Target {
        &self.g.targets[self.idx as usize]
    }

    /// Positional arguments (FX's `args` tuple).
    #[inline]
    pub fn args(&self) -> &'g [Argument] {
        &self.g.args[self.idx as usize]
    }

    /// Keyword arguments, in insertion order.
    #[inline]
    pub fn kwargs(&self) -> &'g Kwargs {
        match &self.g.kwargs[self.idx as usize] {
            Some(k) => k,
            None => empty_kwargs(),
        }
    }

    /// The optional type annotation of the node's value.
    pub fn type_expr(&self) -> Option<&'g str> {
        self.g.cold[self.idx as usize].as_ref().and_then(|c| c.type_expr.as_deref())
    }

    /// Metadata.
    pub fn meta(&self) -> &'g Meta {
        match &self.g.cold[self.idx as usize] {
            Some(c) => &c.meta,
            None => Meta::empty(),
        }
    }

    /// Nodes that use this node's value, in the order they started using it.
    pub fn users(&self) -> impl DoubleEndedIterator<Item = NodeId> + 'g {
        self.user_set().iter()
    }

    /// The users as an ordered set.
    pub fn user_set(&self) -> NodeSetRef<'g> {
        NodeSetRef { graph: self.g, kind: SetKind::Users { owner: self.idx, list: &self.g.users[self.idx as usize] } }
    }

    /// Number of users (O(1), from a contiguous per-slot counter).
    #[inline]
    pub fn num_users(&self) -> usize {
        self.g.nusers[self.idx as usize] as usize
    }

    /// Input nodes in order of first appearance in `args` then `kwargs` (FX's
    /// `all_input_nodes`).
    pub fn all_input_nodes(&self) -> Vec<NodeId> {
        self.input_set().to_vec()
    }

    /// The graph the node belongs to.
    pub fn graph(&self) -> &'g Graph {
        self.g
    }

    /// The input nodes as an ordered set.
    pub fn input_set(&self) -> NodeSetRef<'g> {
        NodeSetRef { graph: self.g, kind: SetKind::Inputs(&self.g.inputs[self.idx as usize]) }
    }

    /// FX's `Node.is_impure`: placeholders and outputs are impure, as are calls of impure ops
    /// (in-place, random; as functions or as methods), FX's side-effectful functions
    /// ([`SIDE_EFFECTFUL_FUNCTIONS`]: `_assert`, `_assert_is_none`), calls writing into an
    /// `out=` tensor, and impure user functions. Others are pure; pass a callback to
    /// [`Graph::eliminate_dead_code`] for custom rules. Modules flagged impure are a property of
    /// the owning GraphModule ([`crate::GraphModule::set_module_impure`]).
    pub fn is_impure(&self) -> bool {
        match self.op() {
            Opcode::Placeholder | Opcode::Output => true,
            Opcode::CallFunction => {
                // an `out=` tensor is written in place (FX: a mutable schema)
                if self.kwargs().get("out").is_some_and(|a| !matches!(a, Argument::None)) {
                    return true;
                }
                match self.target() {
                    Target::Op(def) => !def.is_pure() || SIDE_EFFECTFUL_FUNCTIONS.contains(&def.name),
                    Target::Function(f) => f.is_impure() || SIDE_EFFECTFUL_FUNCTIONS.contains(&f.name()),
                    Target::Str(_) => false,
                }
            }
            // a method named like an in-place or random registry op (`add_`, `bernoulli`) has
            // side effects
            Opcode::CallMethod => match self.target() {
                Target::Str(m) => core_api::lookup(m).is_some_and(|def| !def.is_pure()),
                _ => false,
            },
            Opcode::GetAttr | Opcode::CallModule => false,
        }
    }

    /// Calls `f` on every node in `args` then `kwargs`, in first-appearance order, with
    /// repetitions.
    pub fn visit_input_refs(&self, f: &mut impl FnMut(NodeId)) {
        for a in self.args() {
            a.visit_nodes(f);
        }
        if let Some(k) = &self.g.kwargs[self.idx as usize] {
            for a in k.values() {
                a.visit_nodes(f);
            }
        }
    }
}

/// Functions whose calls have side effects whatever their results (FX's
/// `_side_effectful_functions`): dead code elimination keeps them.
pub const SIDE_EFFECTFUL_FUNCTIONS: &[&str] = &["_assert", "_assert_is_none"];

impl fmt::Debug for Node<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id())
            .field("name", &self.name())
            .field("op", &self.op())
            .field("target", self.target())
            .field("args", &self.args())
            .field("kwargs", self.kwargs())
            .field("users", &self.user_set())
            .finish()
    }
}
