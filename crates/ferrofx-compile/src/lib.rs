//! # ferrofx-compile
//!
//! Makes a captured program run faster: [`compile`] takes a GraphModule and example inputs
//! (or input shapes) and returns a [`CompiledModule`], PyTorch's `torch.compile` in ferrofx.
//! It is a pipeline of ordinary FX passes over a copy of the GraphModule, each usable alone:
//!
//! 1. the inference pipeline of `ferrofx-fx` (Conv/Linear+BatchNorm folding, DCE, CSE, ...);
//! 2. activation leaves (`ReLU`, ...) become the registry ops they call, so they can fuse;
//! 3. per input shape signature: shape propagation, then [`epilogue::fuse_conv_epilogue`]
//!    (a convolution's or a batch norm's residual add and activation become one
//!    `conv2d_fused` / `batch_norm_fused` node) and [`relu_backward::fuse_relu_backward`]
//!    (relu's gradient mask applied inside the max-pool and batch-norm backward kernels) and,
//!    for inference, [`layout::convert_to_nchwc`] (convolutions in the channel-blocked NCHW16c
//!    layout where its direct kernel is faster, reorders where values cross layouts), then
//!    [`fusion::fuse_elementwise`] (groups
//!    of float32 elementwise ops become one `fused_elementwise` node carrying its expression
//!    as data) and [`memory::plan_memory`] (arena offsets from liveness, peak memory).
//!
//! Fused nodes are ordinary registry-op nodes: the result prints, runs in the Interpreter,
//! saves to and loads from `.fxm` files like any GraphModule (loading parses the expression
//! into the evaluator's closed instruction set; it never runs code from the file).
#![warn(missing_docs)]

pub mod compiled;
pub mod epilogue;
pub mod fusion;
pub mod inline;
pub mod layout;
pub mod linear_weights;
pub mod memory;
pub mod relu_backward;
pub mod training;

pub use compiled::{
    compile, compile_for_shapes, CacheStats, CompileOptions, CompiledModule, ShapeSignature, Specialization,
};
pub use epilogue::fuse_conv_epilogue;
pub use fusion::{fuse_elementwise, plan_fusion, FusionPlan};
pub use memory::{plan_memory, MemoryPlan};
pub use relu_backward::fuse_relu_backward;
