//! Backward formulas, one file per op family. Each op's `OpDef { backward, saves }` points at
//! the functions here. Formulas are written with differentiable ops (the public `Tensor`
//! API or [`crate::op::call`]), so `create_graph` gives higher-order gradients.
//!
//! Helper ops used only by backward formulas (`slice_backward`, `select_backward`, named as in
//! ATen) are registered like any other op and have their own backward.

pub mod elementwise;
pub mod fused;
pub mod index;
pub mod nn;
pub(crate) mod prims;
pub mod reduce;
pub mod view;

use crate::op::OpDef;

/// Ops defined by the formulas (registered with the built-ins).
pub(crate) static OPS: &[&OpDef] = &[
    &view::SLICE_BACKWARD,
    &view::SELECT_BACKWARD,
    &index::INDEX_SELECT_BACKWARD,
    &index::MASKED_SELECT_BACKWARD,
    &fused::CONV1D_BACKWARD,
    &fused::CONV2D_BACKWARD,
    &fused::BATCH_NORM_BACKWARD,
    &fused::MAX_POOL1D_BACKWARD,
    &fused::MAX_POOL2D_BACKWARD,
];
