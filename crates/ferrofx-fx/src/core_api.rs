//! The parts of ferrofx-core the IR relies on: an op's name and purity
//! ([`OpDef::name`], [`OpDef::is_pure`]), by-name [`lookup`] in the registry, and [`DType`].
//! This module is the single place that binds them.

pub use ferrofx_core::op::{lookup, OpDef};
pub use ferrofx_core::DType;
