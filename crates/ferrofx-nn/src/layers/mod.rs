//! Built-in layers with PyTorch's defaults and initialisation. All are tracing leaves
//! ([`crate::Module::is_builtin_leaf`]).

mod linear;

pub use linear::{Flatten, Identity, Linear};
