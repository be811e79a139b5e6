//! MegEngine-style traced modules (seed 001) as a **view** over the one graph IR.
//!
//! MegEngine describes a traced module's `forward` as an `InternalGraph`: a list of `Expr`s
//! (`Input`, `GetAttr`, `Constant`, `CallFunction`, `CallMethod`) over `Node`s (`TensorNode`
//! with shape and dtype, `ModuleNode` with its module type and owner). ferrofx does not keep a
//! second IR for this: [`InternalGraph`] is computed from a [`GraphModule`]'s graph on demand,
//! and every edit goes through the graph (so `lint`, the execution plan and the file format
//! stay the single source of truth).
//!
//! | file | concept |
//! | --- | --- |
//! | `expr.rs` | [`InternalGraph`], [`Expr`], [`ExprKind`], [`ValueNode`], printing in the seed's format |
//! | `interpret.rs` | [`ExprValue`], `Expr::interpret` and `InternalGraph::interpret` (the seed's loop) |
//! | `surgery.rs` | finding exprs, inserting, `replace_node`, `compile`, graph inputs/outputs |
//! | `module_tracer.rs` | [`trace_module`]: user modules become nested traced modules; `flatten` |
//!
//! [`GraphModule`]: crate::GraphModule

mod expr;
#[doc = include_str!("../../../../docs/traced-module.md")]
pub mod guide {}
mod interpret;
mod module_tracer;
mod surgery;

pub use expr::{Expr, ExprKind, InternalGraph, ModuleNode, NodeKind, TensorNode, ValueNode};
pub use interpret::ExprValue;
pub use module_tracer::{trace_module, ModuleTracer};
