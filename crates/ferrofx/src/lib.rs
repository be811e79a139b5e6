//! # ferrofx
//!
//! Capture, transform, run and train neural-network programs: a torch.fx-style graph IR, an
//! eager autograd engine and traced modules that save without source code.
//!
//! This facade re-exports the layers; see [`prelude`] for the common names.
#![warn(missing_docs)]

pub use ferrofx_core as core;
pub use ferrofx_fx as fx;

/// The names most programs need.
pub mod prelude {
    pub use ferrofx_core::{DType, Error, Result, Scalar, Tensor};
}
