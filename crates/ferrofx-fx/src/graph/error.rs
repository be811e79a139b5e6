//! Errors of the graph IR. Every variant names the nodes involved.

use crate::graph::lint::LintFinding;
use crate::graph::node_id::{GraphId, NodeId};

/// Result alias of the graph IR.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

/// Everything that can go wrong when building, editing or checking a [`Graph`](crate::Graph).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    /// A handle to a node that was erased (its slot may since have been reused).
    #[error("node {name} ({id:?}) was erased from this graph")]
    Erased {
        /// The stale handle.
        id: NodeId,
        /// The erased node's name when still known, `'?'` otherwise.
        name: String,
    },
    /// A handle that belongs to another graph.
    #[error("node {id:?} belongs to {owner}, not to this graph ({this})")]
    ForeignNode {
        /// The foreign handle.
        id: NodeId,
        /// The graph the handle belongs to.
        owner: GraphId,
        /// The graph it was used with.
        this: GraphId,
    },
    /// `erase_node` on a node that still has users.
    #[error("cannot erase node '{node}': it still has {} users in the graph: {users:?}", users.len())]
    HasUsers {
        /// The node that was to be erased.
        node: String,
        /// Its users' names.
        users: Vec<String>,
    },
    /// A `call_function` node whose target is not callable (a string).
    #[error("node '{node}': call_function needs a callable target (registry op or user function), got the string '{target}'")]
    NotCallable {
        /// The node's (candidate) name.
        node: String,
        /// The offending target.
        target: String,
    },
    /// A non-`call_function` node whose target is a callable instead of a string.
    #[error("node '{node}': op '{op}' needs a string target, got the callable '{target}'")]
    TargetNotString {
        /// The node's (candidate) name.
        node: String,
        /// The opcode.
        op: &'static str,
        /// The offending target.
        target: String,
    },
    /// An opcode string that is not one of the six.
    #[error(
        "unknown opcode '{0}'; legal opcodes: placeholder, get_attr, call_function, call_method, call_module, output"
    )]
    UnknownOpcode(String),
    /// An op name that the registry does not know.
    #[error("no op named '{0}' is registered")]
    UnknownOp(String),
    /// A mutation that would make a node (transitively) its own input.
    #[error("cycle: the edit would make node '{node}' depend on itself via {path:?}")]
    Cycle {
        /// The node that would depend on itself.
        node: String,
        /// The nodes on the cycle, in dependency order.
        path: Vec<String>,
    },
    /// A graph that contains a cycle (found by the topological sort).
    #[error("the graph has a cycle through nodes {0:?}")]
    GraphCycle(Vec<String>),
    /// Positional argument index out of range.
    #[error("node '{node}' has {len} positional args; index {index} is out of range")]
    ArgIndex {
        /// The node.
        node: String,
        /// The requested index.
        index: usize,
        /// Its number of positional args.
        len: usize,
    },
    /// `insert_arg` at an index past the end of the positional args (FX's `AssertionError`
    /// "insert_args index must be between 0 and len(self.args)").
    #[error("node '{node}': insert_arg index must be between 0 and len(args) = {len}, got {index}")]
    InsertArgIndex {
        /// The node.
        node: String,
        /// The requested index.
        index: usize,
        /// Its number of positional args.
        len: usize,
    },
    /// `find_nodes` asked for every `call_function` node without a target (FX's
    /// `AssertionError`: "target must not be None for call_function op").
    #[error("find_nodes: target must not be None for call_function op")]
    FindNodesWithoutTarget,
    /// `replace_input_with` where `old` is not an input of the node.
    #[error("node '{old}' is not an input of node '{node}'")]
    NotAnInput {
        /// The node whose inputs were searched.
        node: String,
        /// The missing input.
        old: String,
    },
    /// `replace_all_uses_with(..., propagate_meta = true)` onto a node that already has meta.
    #[error("cannot propagate meta of '{from}' onto '{to}': '{to}' already has meta entries")]
    MetaNotEmpty {
        /// Source of the meta.
        from: String,
        /// The replacement, whose meta was not empty.
        to: String,
    },
    /// Moving a node relative to itself, or anchoring at an erased node.
    #[error("invalid move: {0}")]
    InvalidMove(String),
    /// A pattern or replacement graph a rewrite cannot use, or a match it cannot apply.
    #[error("replace_pattern: {0}")]
    Pattern(String),
    /// The drawing backend could not lay the graph out.
    #[error("drawing: {0}")]
    Draw(String),
    /// The graph is inconsistent; the findings name the nodes.
    #[error("lint failed with {} finding(s): {}", .0.len(), .0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; "))]
    Lint(Vec<LintFinding>),
}
