//! # ferrofx
//!
//! Capture, transform, run and train neural-network programs: a torch.fx-style graph IR, an
//! eager autograd engine and traced modules that save without source code.
//!
//! This facade re-exports the layers; see [`prelude`] for the common names. The README's tour
//! below is compiled and run as this crate's documentation tests.
#![doc = include_str!("../../../README.md")]
#![warn(missing_docs)]

pub use ferrofx_compile as compile;
pub use ferrofx_core as core;
pub use ferrofx_fx as fx;
pub use ferrofx_nn as nn;
pub use ferrofx_onnx as onnx;
pub use ferrofx_quant as quant;

/// The user guide (`docs/user-guide.md`): capture, transform, run, train, save and load. Its
/// examples are compiled and run as this module's documentation tests.
#[doc = include_str!("../../../docs/user-guide.md")]
pub mod guide {}

/// The names most programs need.
pub mod prelude {
    pub use ferrofx_core::{DType, Error, Result, Scalar, Tensor, Value};
    pub use ferrofx_fx::{symbolic_trace, trace_with_inputs, Graph, GraphModule, Tracer};
    pub use ferrofx_nn::{Module, ModuleStructure};
}
