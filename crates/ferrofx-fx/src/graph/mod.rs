//! The graph IR: one concept per file.
//!
//! | file | concept |
//! | --- | --- |
//! | `node_id.rs` | [`GraphId`], [`NodeId`]: typed generational handles |
//! | `error.rs` | [`GraphError`]: every misuse, naming the nodes |
//! | `target.rs` | [`Opcode`] (the six opcodes), [`Target`], [`UserFunction`] |
//! | `argument.rs` | [`Argument`] trees, [`Slice`], [`Device`] |
//! | `meta.rs` | [`Meta`]: `tensor_meta`, `stack_trace`, `nn_module_stack`, free-form |
//! | `node_set.rs` | [`NodeSet`]: ordered set with O(1) order-preserving removal |
//! | `edge_set.rs` | the ordered slot-index sets behind `users`/`input_nodes`, [`NodeSetRef`] |
//! | `node.rs` | [`Node`] |
//! | `graph.rs` | [`Graph`]: arena, linked order, sequence numbers, builders, erase, moves |
//! | `iter.rs` | borrowing iterators and the erase-safe [`Cursor`] |
//! | `namespace.rs` | [`Namespace`]: unique, sanitised names |
//! | `use_def.rs` | the ONE routine that updates `users`/`input_nodes`, and the edits built on it |
//! | `insert_point.rs` | [`InsertPoint`] and the scoped [`InsertGuard`] |
//! | `find_nodes.rs` | the incrementally maintained `(op, target)` lookup table |
//! | `lint.rs` | [`Graph::lint`] and its [`LintFinding`]s |
//! | `display.rs` | FX's print format, `format_node`, `print_tabular` |
//! | `codegen.rs` | readable source with values dropped after their last use |
//! | `topo.rs` | stable topological sort, cycle detection |
//! | `dce.rs` | dead code elimination |
//! | `copy.rs` | `node_copy`, `graph_copy` |

mod argument;
mod codegen;
mod copy;
mod dce;
mod display;
mod edge_set;
mod error;
mod find_nodes;
#[allow(clippy::module_inception)]
mod graph;
pub(crate) mod hash;
mod insert_point;
mod iter;
mod lint;
mod meta;
mod namespace;
mod node;
mod node_id;
mod node_map;
mod node_set;
mod target;
mod topo;
mod use_def;

pub use argument::{Argument, Device, Kwargs, Slice};
pub use edge_set::NodeSetRef;
pub use error::{GraphError, Result};
pub use graph::Graph;
pub use insert_point::{InsertGuard, InsertPoint};
pub use iter::{Cursor, Direction, Iter, Nodes};
pub use lint::{LintFinding, TargetResolver};
pub use meta::{Meta, ModuleStackEntry, TensorMetadata};
pub use namespace::Namespace;
pub use node::{Node, SIDE_EFFECTFUL_FUNCTIONS};
pub use node_id::{GraphId, NodeId};
pub use node_map::NodeMap;
pub use node_set::NodeSet;
pub use target::{Opcode, Target, UserFunction};
