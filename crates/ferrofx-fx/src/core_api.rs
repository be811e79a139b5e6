//! The parts of ferrofx-core the IR relies on: an op's name and purity
//! ([`OpDef::name`], [`OpDef::is_pure`]), by-name [`lookup`] in the registry, and [`DType`].
//! This module is the single place that binds them.

pub use ferrofx_core::op::OpDef;

/// The registry op called `name` (the guard ops of [`crate::assert_ops`] are registered
/// first, so files holding them load in a fresh process).
pub fn lookup(name: &str) -> Option<&'static OpDef> {
    crate::assert_ops::register();
    ferrofx_core::op::lookup(name)
}
pub use ferrofx_core::DType;
