//! Built-in ops, one file per family. Each family exposes its `OpDef` statics, the public
//! functions/methods that dispatch them, and an `OPS` list the registry collects.

pub mod attention;
mod attention_tiles;
pub mod binary;
pub mod clamp_bound;
pub mod compare;
pub mod conv;
pub mod creation;
pub mod display;
pub mod embedding;
pub mod fused;
mod gemv;
pub mod index;
pub mod index_copy;
pub mod index_put;
pub mod inplace;
pub mod join;
pub mod kernel;
pub mod linalg;
pub mod norm;
pub mod num;
pub mod operators;
pub mod pool;
pub mod quantized;
pub mod random;
pub mod reduce;
pub mod scan;
pub mod shape_misc;
pub(crate) mod simd;
pub mod softmax;
pub mod sort;
pub(crate) mod team;
pub mod unary;
pub mod view;
pub(crate) mod vmath;
pub mod volumetric;

use crate::op::OpDef;

/// Every built-in op.
pub(crate) fn builtin_ops() -> impl Iterator<Item = &'static &'static OpDef> {
    [
        view::OPS,
        reduce::OPS,
        softmax::OPS,
        scan::OPS,
        sort::OPS,
        join::OPS,
        index::OPS,
        creation::OPS,
        random::OPS,
        shape_misc::OPS,
        linalg::OPS,
        attention::OPS,
        conv::OPS,
        pool::OPS,
        norm::OPS,
        embedding::OPS,
        unary::OPS,
        fused::OPS,
        binary::OPS,
        compare::OPS,
        inplace::OPS,
        clamp_bound::OPS,
        index_copy::OPS,
        quantized::OPS,
        index_put::OPS,
        crate::autograd::formulas::OPS,
    ]
    .into_iter()
    .flatten()
}
