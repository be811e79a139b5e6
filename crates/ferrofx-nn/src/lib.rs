//! # ferrofx-nn
//!
//! Modules, layers, losses, optimizers and datasets for ferrofx, shaped like `torch.nn`:
//!
//! * [`Module`] (object-safe) with PyTorch's qualified names, `train`/`eval`, `state_dict` /
//!   `load_state_dict` (safetensors with PyTorch keys), `apply`, dtype conversion; write
//!   modules with `#[derive(Module)]` + `impl Module { fn forward }` (see [`module`]);
//! * built-in layers ([`layers`]), containers ([`Sequential`], [`ModuleList`], [`ModuleDict`]),
//!   [`functional`], [`init`], [`loss`];
//! * [`optim`] (SGD, Adam, AdamW, RMSprop, LR schedulers, gradient clipping);
//! * [`datasets`] (the embedded digits data) and [`zoo`] (MLP, digits CNN, ResNet, MobileNetV2,
//!   Transformer encoder classifier), [`train`] (the digits training loop), [`batch_shards`] (fixed reduction shards).
#![warn(missing_docs)]

extern crate self as ferrofx_nn;

pub mod batch_shards;
pub mod containers;
pub mod datasets;
pub mod functional;
pub mod fusion;
pub mod init;
pub mod layers;
pub mod loss;
pub mod module;
pub mod optim;
pub mod spec;
pub mod state_dict;
pub mod train;
pub mod zoo;

pub use containers::{ModuleDict, ModuleList, Sequential};
pub use ferrofx_core::{Error, Result, Tensor, Value};
pub use ferrofx_derive::Module;
pub use layers::*;
#[doc(hidden)]
pub use module::__private;
pub use module::{
    has_module_call_hook, with_module_call_hook, Module, ModuleCallHook, ModuleField, ModuleStructure, TensorKind,
};
pub use state_dict::{
    load_state_dict_file, open_for_reading, read_safetensors_header, save_state_dict, save_state_dict_with_metadata,
    state_dict_from_bytes, state_dict_to_bytes, LoadReport, SafetensorsHeader, StateDict,
};

/// `use ferrofx_nn::prelude::*;` brings the module traits (and the derive) into scope.
pub mod prelude {
    pub use crate::module::{Module, ModuleStructure};
    pub use ferrofx_core::{Result, Tensor};
}
