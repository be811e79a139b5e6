//! [`OpDef`]: everything ferrofx knows about one op, defined once.

use crate::error::Result;
use crate::op::schema::ArgSpec;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::SmallVec;

/// The tensors an op returns (inline for up to two).
pub type Outputs = SmallVec<[Tensor; 2]>;
/// Output metadata inferred without touching data.
pub type MetaOutputs = SmallVec<[TensorMeta; 2]>;

/// Infers output shapes/dtypes from the (bound) arguments' metadata. Must not read tensor data.
pub type MetaFn = fn(&[Value]) -> Result<MetaOutputs>;
/// Runs the op on concrete tensors (bound arguments, schema order).
pub type KernelFn = fn(&[Value]) -> Result<Outputs>;
/// Estimates the work of one call from the bound arguments and the output metadata.
pub type CostFn = fn(&[Value], &[TensorMeta]) -> Cost;
/// Computes input gradients from output gradients; see [`crate::autograd::BackwardCtx`].
pub type BackwardFn = fn(&crate::autograd::BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>>;

/// Work estimate of one op call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Floating point operations (a multiply-add counts as 2).
    pub flops: u64,
    /// Bytes read plus bytes written.
    pub bytes: u64,
}

/// Coarse op families, used by passes (fusion, analysis) and documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// One output element from the same-index input elements (with broadcasting).
    Elementwise,
    /// Reductions over dims (sum, mean, softmax...).
    Reduction,
    /// Matrix products (mm, matmul, linear...).
    Linear,
    /// Convolutions.
    Convolution,
    /// Pooling.
    Pooling,
    /// Normalisations.
    Normalization,
    /// Views and shape changes that share storage when they can.
    View,
    /// Gathers, scatters, concatenation, indexing.
    Indexing,
    /// Tensor factories (zeros, arange...).
    Creation,
    /// Random sampling and dropout.
    Random,
    /// Everything else.
    Other,
}

/// How an op interacts with state; decides what DCE and CSE may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Output depends only on inputs; removable when unused, mergeable when repeated.
    Pure,
    /// Writes into the argument at this index (in-place op, `add_`...).
    Mutates(usize),
    /// Draws from the random generator: not mergeable, not removable by CSE.
    Random,
}

/// Which tensors autograd saves for the backward formula (bit i = argument/output i).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Saves {
    /// Bit mask over argument positions.
    pub inputs: u32,
    /// Bit mask over outputs.
    pub outputs: u32,
}

impl Saves {
    /// Saves nothing (the formula needs only shapes and scalar args).
    pub const NOTHING: Saves = Saves { inputs: 0, outputs: 0 };
    /// Saves the listed inputs.
    pub const fn inputs(mask: u32) -> Saves {
        Saves { inputs: mask, outputs: 0 }
    }
    /// Saves the listed outputs.
    pub const fn outputs(mask: u32) -> Saves {
        Saves { inputs: 0, outputs: mask }
    }
}

/// The single definition of an op: name, schema, meta inference, kernel, cost, effect,
/// category, and (optionally) its backward formula. Built-in ops are `static`s; user ops are
/// registered with [`crate::op::register`].
pub struct OpDef {
    /// Stable name, as in PyTorch (`add`, `conv2d`, `layer_norm`); also the method name.
    pub name: &'static str,
    /// Typed schema with defaults (PyTorch's argument names).
    pub schema: &'static [ArgSpec],
    /// Output metadata from input metadata.
    pub meta: MetaFn,
    /// The CPU kernel.
    pub kernel: KernelFn,
    /// Work estimate.
    pub cost: CostFn,
    /// Purity / mutation / randomness.
    pub effect: Effect,
    /// Op family.
    pub category: Category,
    /// Backward formula (`None`: not differentiable).
    pub backward: Option<BackwardFn>,
    /// What the backward formula needs saved.
    pub saves: Saves,
    /// One-line description.
    pub doc: &'static str,
}

impl OpDef {
    /// `true` when the op has no side effect and no randomness (safe for DCE and CSE).
    pub fn is_pure(&self) -> bool {
        self.effect == Effect::Pure
    }
    /// The index of the argument an in-place op writes to.
    pub fn mutated_arg(&self) -> Option<usize> {
        match self.effect {
            Effect::Mutates(i) => Some(i),
            _ => None,
        }
    }
    /// The schema printed PyTorch-style.
    pub fn schema_string(&self) -> String {
        crate::op::schema::format_schema(self.name, self.schema)
    }
}

impl std::fmt::Debug for OpDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpDef({})", self.schema_string())
    }
}

impl PartialEq for OpDef {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for OpDef {}
impl std::hash::Hash for OpDef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self as *const OpDef as usize).hash(state)
    }
}

/// A cost function for ops whose work is one pass over inputs and outputs.
pub fn cost_elementwise(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes = 0u64;
    for a in args {
        a.for_each_tensor(|t| bytes = bytes.saturating_add(t.meta_nbytes() as u64));
    }
    let mut flops = 0u64;
    for o in outs {
        bytes = bytes.saturating_add(o.nbytes() as u64);
        flops = flops.saturating_add(o.numel() as u64);
    }
    Cost { flops, bytes }
}

/// A cost function for ops that only move or reinterpret data (no arithmetic).
pub fn cost_memory(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let c = cost_elementwise(args, outs);
    Cost { flops: 0, bytes: c.bytes }
}

/// A cost function for views: no flops, no bytes.
pub fn cost_free(_: &[Value], _: &[TensorMeta]) -> Cost {
    Cost::default()
}
