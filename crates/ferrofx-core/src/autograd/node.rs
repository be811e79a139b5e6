//! The autograd graph (seed 004): [`Node`], [`Edge`], [`GraphRoot`], [`AccumulateGrad`].
//!
//! A node is the *backward* of one forward operation. Its inputs are the gradients of the
//! forward outputs (described by [`Node::input_metadata`]); its outputs are the gradients of the
//! forward inputs, sent along [`Node::next_edges`]. An [`Edge`] names a node and which of its
//! inputs the gradient feeds (`input_nr`); an invalid edge (no function) stands for a forward
//! input that does not require grad, and the engine skips it.

use super::hooks::{HookList, NodeHooks};
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Shape;
use crate::tensor::Tensor;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// A shared handle to a node.
pub type NodeRef = Arc<dyn Node>;
/// The explicit stack of the iterative graph teardown ([`Node::take_saved_nodes`]): inline for
/// a small graph (an op and its AccumulateGrads), so freeing one allocates nothing.
pub type NodeStack = SmallVec<[NodeRef; 8]>;
/// The gradients a node receives (one per input, `None` = zero): inline for up to two inputs,
/// so a backward pass allocates nothing for them in the common case.
pub type GradBuffer = SmallVec<[Option<Tensor>; 2]>;
/// A weak handle to a node.
pub type WeakNodeRef = Weak<dyn Node>;

static SEQUENCE_NR: AtomicU64 = AtomicU64::new(0);

/// Takes the next number of the global sequence counter (PyTorch's
/// `at::sequence_number::get_and_increment`).
#[inline]
pub fn next_sequence_nr() -> u64 {
    SEQUENCE_NR.fetch_add(1, Ordering::Relaxed)
}

/// An edge of the graph: `function`'s input number `input_nr`. `function == None` is an
/// invalid edge (the forward input did not require grad).
#[derive(Clone, Default)]
pub struct Edge {
    /// The node the gradient flows to.
    pub function: Option<NodeRef>,
    /// Which input of `function` receives it.
    pub input_nr: u32,
}

impl Edge {
    /// A valid edge.
    pub fn new(function: NodeRef, input_nr: u32) -> Edge {
        Edge { function: Some(function), input_nr }
    }
    /// An invalid edge (skipped by the engine).
    pub fn invalid() -> Edge {
        Edge { function: None, input_nr: 0 }
    }
    /// `true` when the edge points at a node.
    #[inline]
    pub fn is_valid(&self) -> bool {
        self.function.is_some()
    }
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.function {
            Some(n) => write!(f, "({}, {})", n.name(), self.input_nr),
            None => write!(f, "(None, {})", self.input_nr),
        }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        if let Some(f) = self.function.take() {
            drop_node(f);
        }
    }
}

/// Drops a node handle without recursion: when this was the last handle, the node's edges are
/// moved onto an explicit stack before the node itself is freed, so freeing a 1,000,000-node
/// chain uses constant stack depth (a classic pitfall of `Arc` chains in Rust).
pub(crate) fn drop_node(n: NodeRef) {
    if Arc::strong_count(&n) > 1 {
        // Not the last handle (the common case): nothing is freed.
        drop(n);
        return;
    }
    let mut stack: NodeStack = smallvec::smallvec![n];
    while let Some(mut n) = stack.pop() {
        if let Some(node) = Arc::get_mut(&mut n) {
            let base = node.base_mut();
            for e in base.next_edges.iter_mut() {
                if let Some(f) = e.function.take() {
                    stack.push(f);
                }
            }
            node.take_saved_nodes(&mut stack);
        }
        // Now childless (or still shared): dropping it cannot recurse deeply.
        drop(n);
    }
}

/// Shape and dtype of one input of a node (= one output of the forward op).
#[derive(Debug, PartialEq, Eq)]
pub struct InputMetadata {
    /// Shape of the gradient expected.
    pub shape: Shape,
    /// Dtype of the gradient expected.
    pub dtype: DType,
}

impl Clone for InputMetadata {
    // By hand: `SmallVec`'s `Clone` goes through a generic `extend`; `from_slice` copies.
    fn clone(&self) -> Self {
        InputMetadata { shape: SmallVec::from_slice(&self.shape), dtype: self.dtype }
    }
}

impl InputMetadata {
    /// Metadata of a tensor.
    pub fn of(t: &Tensor) -> InputMetadata {
        InputMetadata { shape: SmallVec::from_slice(t.shape()), dtype: t.dtype() }
    }
}

/// Where a node was created (recorded in anomaly mode).
#[derive(Debug, Clone)]
pub struct CreationInfo {
    /// The first frame outside ferrofx-core and std (`file:line`), if found.
    pub location: String,
    /// The full backtrace of the forward call.
    pub backtrace: String,
}

/// Fields every node has (PyTorch's `Node` data members).
pub struct NodeBase {
    pub(crate) sequence_nr: u64,
    pub(crate) topological_nr: u64,
    pub(crate) next_edges: SmallVec<[Edge; 2]>,
    pub(crate) input_metadata: SmallVec<[InputMetadata; 1]>,
    /// Tensor hooks of the tensors this node produced (with `retain_grad`), by `output_nr`.
    pub(crate) tensor_pre_hooks: OnceLock<Arc<HookList>>,
    /// Node pre- and post-hooks (`register_prehook` / `register_hook` on the node).
    pub(crate) node_hooks: OnceLock<Arc<NodeHooks>>,
    pub(crate) creation: Option<Box<CreationInfo>>,
}

impl NodeBase {
    /// A base with `sequence_nr`, `next_edges` and the metadata of its inputs; the topological
    /// number is 1 + the largest of the next nodes' (0 without valid edges).
    pub fn new(
        sequence_nr: u64,
        next_edges: SmallVec<[Edge; 2]>,
        input_metadata: SmallVec<[InputMetadata; 1]>,
    ) -> NodeBase {
        let mut topo = 0;
        for e in &next_edges {
            if let Some(f) = &e.function {
                topo = topo.max(f.topological_nr() + 1);
            }
        }
        let creation =
            if super::anomaly::is_anomaly_enabled() { Some(Box::new(super::anomaly::capture())) } else { None };
        NodeBase {
            sequence_nr,
            topological_nr: topo,
            next_edges,
            input_metadata,
            tensor_pre_hooks: OnceLock::new(),
            node_hooks: OnceLock::new(),
            creation,
        }
    }
    pub(crate) fn hooks(&self) -> &Arc<HookList> {
        self.tensor_pre_hooks.get_or_init(|| Arc::new(HookList::default()))
    }
}

/// What the engine passes to [`Node::apply`].
pub struct ApplyContext<'a> {
    /// The node being applied (for saved outputs that must point back at it).
    pub this: &'a NodeRef,
    /// `true` when the backward computation itself records a graph (higher-order gradients).
    pub create_graph: bool,
    /// `true` when the graph is kept after this pass (`retain_graph`).
    pub keep_graph: bool,
}

/// A node of the autograd graph: the backward of one forward operation.
pub trait Node: Send + Sync + 'static {
    /// The shared fields.
    fn base(&self) -> &NodeBase;
    /// The shared fields, mutably (used to unlink the graph when it is freed).
    fn base_mut(&mut self) -> &mut NodeBase;
    /// The PyTorch-style name (`MulBackward0`, `AccumulateGrad`, ...).
    fn name(&self) -> Cow<'static, str>;
    /// Computes the gradients of the forward inputs (one per next edge) from the gradients of
    /// the forward outputs (one per input; `None` = zero).
    fn apply(&self, grads: GradBuffer, ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>>;
    /// Frees saved tensors (called after the node ran unless `retain_graph`).
    fn release_variables(&self) {}
    /// Moves out every node handle held by saved state, for the iterative graph teardown.
    fn take_saved_nodes(&mut self, _out: &mut NodeStack) {}
    /// Downcast to [`AccumulateGrad`].
    fn as_accumulate_grad(&self) -> Option<&AccumulateGrad> {
        None
    }

    /// The creation order; higher runs earlier in backward.
    fn sequence_nr(&self) -> u64 {
        self.base().sequence_nr
    }
    /// Longest path to a leaf; if there is a path X → Y then `topo(X) > topo(Y)`.
    fn topological_nr(&self) -> u64 {
        self.base().topological_nr
    }
    /// Outgoing edges (towards the forward inputs).
    fn next_edges(&self) -> &[Edge] {
        &self.base().next_edges
    }
    /// PyTorch's `next_functions`: `(node, input_nr)` per edge (`None` for invalid edges).
    fn next_functions(&self) -> Vec<(Option<NodeRef>, u32)> {
        self.base().next_edges.iter().map(|e| (e.function.clone(), e.input_nr)).collect()
    }
    /// Number of inputs (gradients received).
    fn num_inputs(&self) -> usize {
        self.base().input_metadata.len()
    }
    /// Number of outputs (gradients produced = next edges).
    fn num_outputs(&self) -> usize {
        self.base().next_edges.len()
    }
    /// Shape/dtype of each input.
    fn input_metadata(&self) -> &[InputMetadata] {
        &self.base().input_metadata
    }
    /// Where the node was created (only recorded in anomaly mode).
    fn creation_info(&self) -> Option<&CreationInfo> {
        self.base().creation.as_deref()
    }
}

impl std::fmt::Debug for dyn Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{}>", self.name())
    }
}

/// `true` when both handles are the same node.
pub fn same_node(a: &NodeRef, b: &NodeRef) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// The root of a backward pass: injects the initial gradients into the graph.
pub struct GraphRoot {
    base: NodeBase,
    outputs: parking_lot::Mutex<Vec<Option<Tensor>>>,
}

impl GraphRoot {
    /// A root sending `grads[i]` along `edges[i]`.
    pub fn new(edges: SmallVec<[Edge; 2]>, grads: Vec<Tensor>) -> GraphRoot {
        GraphRoot {
            base: NodeBase::new(next_sequence_nr(), edges, SmallVec::new()),
            outputs: parking_lot::Mutex::new(grads.into_iter().map(Some).collect()),
        }
    }
}

impl Node for GraphRoot {
    fn base(&self) -> &NodeBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut NodeBase {
        &mut self.base
    }
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("GraphRoot")
    }
    fn apply(&self, _grads: GradBuffer, ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>> {
        // A root is applied once per backward pass; without retain_graph its gradients are
        // handed over (so an unshared gradient can become a leaf's `.grad` without a copy).
        if ctx.keep_graph {
            Ok(self.outputs.lock().clone())
        } else {
            Ok(std::mem::take(&mut *self.outputs.lock()))
        }
    }
}

/// The node of a leaf tensor: accumulates the gradient it receives into the leaf's `.grad`.
pub struct AccumulateGrad {
    base: NodeBase,
    pub(crate) variable: Tensor,
}

impl AccumulateGrad {
    pub(crate) fn new(variable: Tensor) -> AccumulateGrad {
        let meta = smallvec::smallvec![InputMetadata::of(&variable)];
        // PyTorch gives AccumulateGrad the largest sequence number so it runs as soon as ready.
        AccumulateGrad { base: NodeBase::new(u64::MAX, SmallVec::new(), meta), variable }
    }
    /// The leaf this node accumulates into.
    pub fn variable(&self) -> &Tensor {
        &self.variable
    }
}

impl Node for AccumulateGrad {
    fn base(&self) -> &NodeBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut NodeBase {
        &mut self.base
    }
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("AccumulateGrad")
    }
    fn apply(&self, grads: GradBuffer, ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>> {
        // The leaf's tensor hooks already ran in the engine (they are this node's tensor
        // pre-hooks, which also run in `autograd::grad()`).
        let Some(g) = grads.into_iter().next().flatten() else { return Ok(Vec::new()) };
        super::engine::accumulate_into_grad(&self.variable, g, ctx.create_graph)?;
        let post = self.variable.autograd_meta().lock().post_accumulate_hooks.clone();
        if let Some(h) = post {
            h.run(0, self.variable.clone(), false)?;
        }
        Ok(Vec::new())
    }
    fn as_accumulate_grad(&self) -> Option<&AccumulateGrad> {
        Some(self)
    }
}
