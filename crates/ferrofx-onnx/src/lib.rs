//! ONNX for ferrofx: import any exported model as a [`ferrofx_fx::GraphModule`], export a
//! GraphModule as an ONNX model.
//!
//! - [`import()`] reads a `.onnx` file (prost-decoded `ModelProto`, with size, path and depth
//!   checks: a model file is user input) and returns an ordinary GraphModule whose nodes are
//!   registry op calls; see [`import`](mod@import) for how.
//! - [`OnnxModel`] runs a model with dynamic dimensions at any size, specialising at the first
//!   run of each input shape.
//! - [`supported_ops`] lists the ONNX ops the importer converts (default domain).
//!
//! See `docs/onnx.md` for the op table and the backend-suite results.
#![warn(missing_docs)]

pub mod builder;
pub mod dynamic;
pub mod export;
pub mod import;
pub mod model;
mod ops;
pub mod proto;
pub mod tensor_proto;

pub use dynamic::OnnxModel;
pub use export::{export, ExportOptions};
pub use import::{import, import_model, ImportOptions, Imported, InputSpec, OnnxProgram};
pub use model::ModelFile;
pub use ops::supported_ops;

/// The newest default-domain opset the importer accepts (the `onnx` 1.23 package's).
pub const MAX_OPSET: i64 = 28;
