//! # ferrofx-fx: the graph IR
//!
//! A torch.fx-style intermediate representation: a [`Graph`] owns [`Node`]s kept in an arena and
//! ordered by a circular doubly linked list with a sentinel root. Every node has one of six
//! [`Opcode`]s, a [`Target`], positional and keyword [`Argument`]s, [`Meta`]data, and use-def
//! edges (`users` / `input_nodes`) that the graph keeps consistent on every mutation.
//!
//! Nodes are addressed by [`NodeId`]s: typed, generational handles that carry the identity of
//! their graph, so using an erased node or a node of another graph is an [`Err`], never a panic
//! or a silent wrong answer.
//!
//! ```
//! use ferrofx_fx::{Graph, Target};
//!
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let y = g.placeholder("y").unwrap();
//! let add = g.call_function(Target::named("add"), vec![x.into(), y.into()]).unwrap();
//! let relu = g.call_function(Target::named("relu"), vec![add.into()]).unwrap();
//! g.output(relu.into()).unwrap();
//! g.lint().unwrap();
//! assert_eq!(
//!     g.to_string(),
//!     "graph():\n    \
//!      %x : [num_users=1] = placeholder[target=x]\n    \
//!      %y : [num_users=1] = placeholder[target=y]\n    \
//!      %add : [num_users=1] = call_function[target=add](args = (%x, %y), kwargs = {})\n    \
//!      %relu : [num_users=1] = call_function[target=relu](args = (%add,), kwargs = {})\n    \
//!      return relu"
//! );
//! ```
#![warn(missing_docs)]

pub mod assert_ops;
pub mod core_api;
pub mod getitem;
pub mod graph;
pub mod graph_module;
pub mod interpreter;
pub mod memory_budget;
pub mod module_container;
pub mod passes;
mod plan;
pub mod rust_source;
pub mod serialize;
pub mod shape_prop;
pub mod traced;
pub mod tracer;
pub mod transformer;
mod values;
pub mod wrap;

pub use graph::*;
pub use graph_module::GraphModule;
pub use interpreter::{DefaultInterpreter, Env, Interpreter, NodeValue};
pub use memory_budget::{default_max_memory, PeakMemory, DEFAULT_MAX_FLOPS};
pub use module_container::ModuleContainer;
pub use rust_source::RustSource;
pub use shape_prop::ShapeProp;
pub use tracer::{symbolic_trace, trace_with_inputs, Tracer};
pub use transformer::Transformer;
pub use wrap::{wrap, Wrapped};
