//! Custom autograd functions (`torch.autograd.Function`): a user forward and backward whose
//! node is a first-class member of the graph (named `<Type>Backward`, with saved tensors that
//! obey the version counter and `retain_graph` like any other node).

use super::grad_mode::{is_grad_enabled, set_grad_enabled};
use super::node::{next_sequence_nr, ApplyContext, Edge, InputMetadata, Node, NodeBase, NodeRef};
use super::op_node::{gradient_edge, set_history};
use super::saved::{detached_alias, SavedVariable};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::sync::Arc;

/// A user-defined differentiable function.
///
/// ```
/// use ferrofx_core::autograd::{apply_function, Function, FunctionCtx};
/// use ferrofx_core::{Result, Tensor};
///
/// /// y = 3x, written by hand.
/// struct Triple;
/// impl Function for Triple {
///     fn forward(&mut self, _ctx: &mut FunctionCtx, x: &[Tensor]) -> Result<Vec<Tensor>> {
///         let v: Vec<f32> = x[0].to_vec::<f32>()?.iter().map(|a| a * 3.0).collect();
///         Ok(vec![Tensor::from_vec(v, x[0].shape())?])
///     }
///     fn backward(&self, _ctx: &FunctionCtx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let g = g[0].as_ref().unwrap();
///         let v: Vec<f32> = g.to_vec::<f32>()?.iter().map(|a| a * 3.0).collect();
///         Ok(vec![Some(Tensor::from_vec(v, g.shape())?)])
///     }
/// }
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
/// let y = apply_function(Triple, &[x.clone()]).unwrap().remove(0);
/// assert_eq!(y.grad_fn().unwrap().name(), "TripleBackward");
/// y.backward(Some(&Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap()), false, false).unwrap();
/// assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
/// ```
pub trait Function: Send + Sync + 'static {
    /// The node's name; defaults to the type's name + `Backward` (as PyTorch does).
    fn name(&self) -> String {
        let full = std::any::type_name::<Self>();
        let no_generics = full.split('<').next().unwrap_or(full);
        let short = no_generics.rsplit("::").next().unwrap_or(no_generics);
        format!("{short}Backward")
    }
    /// Computes the outputs (grad mode is off). Save tensors with
    /// [`FunctionCtx::save_for_backward`]; non-tensor state can be kept in `self`.
    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
    /// Gradients of the inputs (one per input, `None` for no gradient; extra trailing `None`s
    /// are allowed, as in PyTorch) from the gradients of the outputs. Output gradients the
    /// engine did not compute arrive as zeros of the output's shape, unless
    /// [`FunctionCtx::set_materialize_grads`]`(false)` was called in forward (then `None`).
    /// Use differentiable ops for higher-order gradients.
    fn backward(&self, ctx: &FunctionCtx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;
    /// PyTorch's `@once_differentiable`: `backward` runs with grad mode off, and differentiating
    /// its result again (under `create_graph`) fails with PyTorch's message.
    fn once_differentiable(&self) -> bool {
        false
    }
}

/// PyTorch's message when a `@once_differentiable` backward is differentiated.
pub const ONCE_DIFFERENTIABLE_MSG: &str =
    "trying to differentiate twice a function that was marked with @once_differentiable";

/// The context of a custom function: tensors saved in forward, available in backward.
#[derive(Default)]
pub struct FunctionCtx {
    to_save: Vec<Tensor>,
    saved: Vec<Tensor>,
    needs_input_grad: Vec<bool>,
    non_differentiable: Vec<Tensor>,
    dirty: Vec<Tensor>,
    no_materialize: bool,
}

impl FunctionCtx {
    /// Saves tensors (inputs or outputs) for backward; they are checked against the version
    /// counter when unpacked.
    pub fn save_for_backward(&mut self, tensors: &[&Tensor]) {
        self.to_save.extend(tensors.iter().map(|t| (*t).clone()));
    }
    /// The saved tensors (in backward).
    pub fn saved_tensors(&self) -> &[Tensor] {
        &self.saved
    }
    /// `true` when input `i` needs a gradient.
    pub fn needs_input_grad(&self, i: usize) -> bool {
        self.needs_input_grad.get(i).copied().unwrap_or(false)
    }
    /// Declares an output non-differentiable (it will not require grad; its gradient arrives
    /// in backward as zeros, or `None` without materialisation).
    pub fn mark_non_differentiable(&mut self, t: &Tensor) {
        self.non_differentiable.push(t.clone());
    }
    /// Declares that forward modified input `t` in place (PyTorch's `ctx.mark_dirty`): when
    /// forward returns it, it keeps its identity and its history is rebased onto this
    /// function's node. A leaf requiring grad cannot be dirtied (PyTorch's error).
    pub fn mark_dirty(&mut self, t: &Tensor) {
        self.dirty.push(t.clone());
    }
    /// PyTorch's `ctx.set_materialize_grads`: with `false`, output gradients the engine did
    /// not compute reach backward as `None` instead of zeros.
    pub fn set_materialize_grads(&mut self, value: bool) {
        self.no_materialize = !value;
    }
}

/// Stands in the graph for the gradients of a `@once_differentiable` backward under
/// `create_graph`: differentiating through it fails (PyTorch's `DelayedError`).
struct DelayedError {
    base: NodeBase,
}

impl Node for DelayedError {
    fn base(&self) -> &NodeBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut NodeBase {
        &mut self.base
    }
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("DelayedError")
    }
    fn apply(&self, _grads: super::node::GradBuffer, _ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>> {
        Err(Error::autograd("backward", ONCE_DIFFERENTIABLE_MSG))
    }
}

struct FunctionNode<F: Function> {
    base: NodeBase,
    f: F,
    name: String,
    saved: Mutex<Vec<SavedVariable>>,
    needs: Vec<bool>,
    materialize: bool,
}

impl<F: Function> Node for FunctionNode<F> {
    fn base(&self) -> &NodeBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut NodeBase {
        &mut self.base
    }
    fn name(&self) -> Cow<'static, str> {
        Cow::Owned(self.name.clone())
    }
    fn apply(&self, grads: super::node::GradBuffer, ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>> {
        let saved = {
            let s = self.saved.lock();
            s.iter().map(|v| v.unpack(Some(ctx.this), ctx.create_graph)).collect::<Result<Vec<_>>>()?
        };
        let fctx = FunctionCtx {
            to_save: Vec::new(),
            saved,
            needs_input_grad: self.needs.clone(),
            non_differentiable: Vec::new(),
            dirty: Vec::new(),
            no_materialize: !self.materialize,
        };
        let mut grads = grads;
        if self.materialize {
            for (g, m) in grads.iter_mut().zip(self.base.input_metadata.iter()) {
                if g.is_none() {
                    *g = Some(crate::ops::kernel::zeros(&m.shape, m.dtype)?);
                }
            }
        }
        let once = self.f.once_differentiable();
        let mut out = if once {
            let _g = set_grad_enabled(false);
            self.f.backward(&fctx, &grads)?
        } else {
            self.f.backward(&fctx, &grads)?
        };
        // Extra trailing gradients are allowed when they are None (PyTorch).
        while out.len() > self.needs.len() && out.last().is_some_and(|g| g.is_none()) {
            out.pop();
        }
        if once && ctx.create_graph {
            let edges: SmallVec<[Edge; 2]> = grads.iter().flatten().map(gradient_edge).collect();
            if edges.iter().any(|e| e.is_valid()) {
                let meta: SmallVec<[InputMetadata; 1]> = out.iter().flatten().map(InputMetadata::of).collect();
                let node: NodeRef = Arc::new(DelayedError { base: NodeBase::new(next_sequence_nr(), edges, meta) });
                for (k, g) in out.iter_mut().flatten().enumerate() {
                    let alias = detached_alias(g);
                    set_history(&alias, node.clone(), k as u32);
                    *g = alias;
                }
            }
        }
        if out.len() != self.needs.len() {
            return Err(Error::autograd(
                self.name.clone(),
                format!(
                    "function {} returned an incorrect number of gradients (expected {}, got {})",
                    self.name,
                    self.needs.len(),
                    out.len()
                ),
            ));
        }
        Ok(out)
    }
    fn release_variables(&self) {
        for s in self.saved.lock().iter_mut() {
            s.release();
        }
    }
    fn take_saved_nodes(&mut self, out: &mut super::node::NodeStack) {
        for s in self.saved.get_mut().iter_mut() {
            s.take_nodes(out);
        }
    }
}

/// Runs a custom function: `forward` without recording, then (if grad mode is on and an input
/// requires grad) one node whose backward is `f.backward`.
pub fn apply_function<F: Function>(mut f: F, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let record = is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    let needs: Vec<bool> = inputs.iter().map(|t| record && t.requires_grad()).collect();
    let edges: SmallVec<[Edge; 2]> = if record { inputs.iter().map(gradient_edge).collect() } else { SmallVec::new() };
    let mut ctx = FunctionCtx { needs_input_grad: needs.clone(), ..FunctionCtx::default() };
    let outputs = {
        let _g = set_grad_enabled(false);
        f.forward(&mut ctx, inputs)?
    };
    // An input returned as is becomes a fresh alias, so its own history is untouched, unless
    // forward marked it dirty (modified in place): then it keeps its identity and its history
    // is rebased onto the node, as for in-place ops.
    let is_dirty = |o: &Tensor| ctx.dirty.iter().any(|d| d.same(o));
    let outputs: Vec<Tensor> = outputs
        .into_iter()
        .map(|o| if inputs.iter().any(|i| i.same(&o)) && !is_dirty(&o) { detached_alias(&o) } else { o })
        .collect();
    if !record {
        return Ok(outputs);
    }
    for d in &ctx.dirty {
        if d.requires_grad() && d.is_leaf() {
            return Err(Error::autograd(
                f.name(),
                "a leaf Variable that requires grad is being used in an in-place operation.",
            ));
        }
    }
    let name = f.name();
    let meta: SmallVec<[InputMetadata; 1]> = outputs.iter().map(InputMetadata::of).collect();
    let node = Arc::new(FunctionNode {
        base: NodeBase::new(next_sequence_nr(), edges, meta),
        f,
        name,
        saved: Mutex::new(Vec::new()),
        needs,
        materialize: !ctx.no_materialize,
    });
    let node_ref: NodeRef = node.clone();
    for (j, o) in outputs.iter().enumerate() {
        let nd = ctx.non_differentiable.iter().any(|t| t.same(o));
        if o.dtype().is_floating_point() && !nd {
            set_history(o, node_ref.clone(), j as u32);
        }
    }
    let saved: Vec<SavedVariable> = ctx
        .to_save
        .iter()
        .map(|t| SavedVariable::auto(t, outputs.iter().position(|o| o.same(t)).map(|p| p as u32)))
        .collect();
    *node.saved.lock() = saved;
    Ok(outputs)
}
