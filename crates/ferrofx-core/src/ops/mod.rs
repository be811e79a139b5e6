//! Built-in ops, one file per family. Each family exposes its `OpDef` statics, the public
//! functions/methods that dispatch them, and an `OPS` list the registry collects.

pub mod kernel;
pub mod view;

use crate::op::OpDef;

/// Every built-in op.
pub(crate) fn builtin_ops() -> impl Iterator<Item = &'static &'static OpDef> {
    [view::OPS, crate::autograd::formulas::OPS].into_iter().flatten()
}
