//! The backward engine (seed 004 §8): dependency counting over the reachable graph, a ready
//! queue ordered by `sequence_nr` (higher first), one input buffer per node summing the
//! gradients arriving on several edges. Entirely iterative: no recursion over the graph.

use super::grad_mode::set_grad_enabled;
use super::node::{ApplyContext, Edge, GradBuffer, GraphRoot, Node, NodeRef};
use super::op_node::gradient_edge;
use super::raw;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use smallvec::SmallVec;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

#[derive(Default)]
struct PtrHasher(u64);
impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("PtrHasher hashes usize keys only")
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}
type PtrMap<V> = HashMap<usize, V, BuildHasherDefault<PtrHasher>>;

/// Node → state index: a linear scan for small graphs (the common case of a few ops), a hash
/// map beyond that.
#[derive(Default)]
struct NodeIndex {
    small: SmallVec<[(usize, usize); SMALL]>,
    map: Option<PtrMap<usize>>,
}

const SMALL: usize = 16;

impl NodeIndex {
    #[inline]
    fn get(&self, k: usize) -> Option<usize> {
        match &self.map {
            Some(m) => m.get(&k).copied(),
            None => self.small.iter().find(|(a, _)| *a == k).map(|(_, v)| *v),
        }
    }
    #[inline]
    fn insert(&mut self, k: usize, v: usize) {
        match &mut self.map {
            Some(m) => {
                m.insert(k, v);
            }
            None if self.small.len() < SMALL => self.small.push((k, v)),
            None => {
                let mut m: PtrMap<usize> = self.small.drain(..).collect();
                m.insert(k, v);
                self.map = Some(m);
            }
        }
    }
    #[inline]
    fn at(&self, k: usize) -> usize {
        self.get(k).expect("engine: node discovered during graph traversal")
    }
}

#[inline]
fn key(n: &NodeRef) -> usize {
    Arc::as_ptr(n) as *const () as usize
}

/// Per-node bookkeeping of one pass (the node itself lives at the same index in a separate
/// `nodes` vector, so it can be borrowed while other states are updated, without cloning the
/// `Arc`).
struct NodeState {
    deps: u32,
    buffer: SmallVec<[Option<Tensor>; 2]>,
    needed: bool,
    captures: SmallVec<[(u32, usize); 1]>,
}

/// Buffers of one backward pass, kept per thread so that small passes allocate nothing for
/// the engine's own bookkeeping (a nested pass, from a hook, simply allocates its own).
#[derive(Default)]
struct Scratch {
    nodes: Vec<NodeRef>,
    states: Vec<NodeState>,
    stack: Vec<usize>,
    ready: Vec<Ready>,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// Largest buffers worth keeping between passes.
const SCRATCH_KEEP: usize = 4096;

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Ready {
    seq: u64,
    // Ties (AccumulateGrad all share u64::MAX): later-discovered first is fine.
    idx: usize,
}

/// `a + b` for gradient accumulation: differentiable (through the registry's `add`) when
/// building a graph, raw otherwise.
pub(crate) fn accumulate(a: Tensor, b: Tensor, create_graph: bool) -> Result<Tensor> {
    if create_graph && (a.requires_grad() || b.requires_grad()) && crate::op::lookup("add").is_some() {
        let mut out = crate::op::call("add", vec![a.into(), b.into()], vec![])?;
        return out.pop().ok_or_else(|| Error::autograd("backward", "add returned no output"));
    }
    raw::add(&a, &b)
}

/// Accumulates `g` into `t.grad` (AccumulateGrad's and retain_grad's behaviour): the first
/// gradient is stored as a fresh copy (or as is, with its graph, under `create_graph`); later
/// ones are added in place (or out of place under `create_graph`).
pub(crate) fn accumulate_into_grad(t: &Tensor, g: Tensor, create_graph: bool) -> Result<()> {
    let g = if g.dtype() != t.dtype() { crate::ops::kernel::cast(&g, t.dtype())? } else { g };
    let meta = t.autograd_meta();
    let old = meta.lock().grad.clone();
    let new = match old {
        None => {
            if (create_graph && g.requires_grad()) || can_steal(&g) {
                g
            } else {
                raw::copy(&g)?
            }
        }
        Some(old) => {
            if create_graph || old.requires_grad() {
                accumulate(old, g, create_graph)?
            } else {
                raw::add_assign(&old, &g)?;
                return Ok(());
            }
        }
    };
    meta.lock().grad = Some(new);
    Ok(())
}

/// PyTorch's gradient stealing: a gradient nobody else can observe (the only handle to a
/// tensor without history, whose contiguous layout covers a storage no other tensor shares)
/// becomes `.grad` as is instead of being copied.
fn can_steal(g: &Tensor) -> bool {
    if g.requires_grad() || Arc::strong_count(&g.0) != 1 || Arc::weak_count(&g.0) != 0 {
        return false;
    }
    match (g.storage(), g.layout()) {
        (Some(s), Some(l)) => {
            s.is_unique()
                && l.offset() == 0
                && l.is_contiguous()
                && l.numel() == s.len()
                && g.0.autograd.lock().grad.is_none()
        }
        _ => false,
    }
}

/// Runs the tensor hooks of the tensors `node` produced (PyTorch's `call_tensor_pre_hooks`):
/// a non-leaf's hooks and `retain_grad` on its `grad_fn`, a leaf's on its `AccumulateGrad`.
fn call_tensor_pre_hooks(node: &dyn Node, inputs: &mut GradBuffer, create_graph: bool) -> Result<()> {
    let leaf;
    let list = match node.as_accumulate_grad() {
        Some(acc) => {
            leaf = acc.variable().autograd_meta().lock().leaf_hooks.clone();
            leaf.as_ref()
        }
        None => node.base().tensor_pre_hooks.get(),
    };
    if let Some(h) = list {
        if !h.is_empty() {
            for (nr, slot) in inputs.iter_mut().enumerate() {
                if let Some(g) = slot.take() {
                    *slot = Some(h.run(nr as u32, g, create_graph)?);
                }
            }
        }
    }
    Ok(())
}

fn check_grad_shape(node: &dyn Node, k: usize, g: &Tensor, next: &dyn Node, input_nr: u32) -> Result<Option<Tensor>> {
    check_grad_meta(&|| node.name().to_string(), k, g, next, input_nr)
}

/// The shape check (an error naming `name()`, the node that produced `g`) and dtype conversion
/// of gradient `k` flowing into input `input_nr` of `next`.
fn check_grad_meta(
    name: &dyn Fn() -> String,
    k: usize,
    g: &Tensor,
    next: &dyn Node,
    input_nr: u32,
) -> Result<Option<Tensor>> {
    let Some(m) = next.input_metadata().get(input_nr as usize) else { return Ok(None) };
    if g.shape() != &m.shape[..] {
        let name = name();
        return Err(Error::autograd(
            name.clone(),
            format!(
                "Function {name} returned an invalid gradient at index {k} - got {:?} but expected shape compatible with {:?}",
                g.shape(),
                &m.shape[..]
            ),
        ));
    }
    if g.dtype() != m.dtype {
        return Ok(Some(g.to_dtype(m.dtype)?));
    }
    Ok(None)
}

fn call_node(node: &NodeRef, inputs: GradBuffer, create_graph: bool, keep_graph: bool) -> Result<Vec<Option<Tensor>>> {
    let ctx = ApplyContext { this: node, create_graph, keep_graph };
    let res = node.apply(inputs, &ctx);
    let anomaly = super::anomaly::is_anomaly_enabled();
    match res {
        Err(e) if anomaly => Err(super::anomaly::decorate(e, &**node)),
        Err(e) => Err(e),
        Ok(outs) => {
            if anomaly {
                super::anomaly::check_nan(&**node, &outs)?;
            }
            Ok(outs)
        }
    }
}

/// Runs backward from `roots` with initial gradients `grads`. With `capture = Some(inputs)`,
/// returns the gradients flowing into `inputs` instead of accumulating into leaves' `.grad`
/// (only the part of the graph leading to them runs).
pub(crate) fn run_backward(
    roots: &[Tensor],
    grads: Vec<Tensor>,
    keep_graph: bool,
    create_graph: bool,
    capture: Option<&[Tensor]>,
    allow_unused: bool,
) -> Result<Vec<Option<Tensor>>> {
    // What backward allocates counts as gradients in the tracked-allocator mode.
    let _mem = crate::memory::tracking::category_scope(crate::memory::tracking::Category::Gradient);
    let mut root_edges: SmallVec<[Edge; 2]> = SmallVec::new();
    for (i, r) in roots.iter().enumerate() {
        let e = gradient_edge(r);
        if !e.is_valid() {
            return Err(Error::autograd(
                "backward",
                format!("element {i} of tensors does not require grad and does not have a grad_fn"),
            ));
        }
        root_edges.push(e);
    }
    // PyTorch's `skip_dummy_node`: with one root edge, its node is the root of the pass and
    // receives the initial gradient in its input buffer; a `GraphRoot` (which takes a sequence
    // number) is only made for several roots, or in anomaly mode (which checks the initial
    // gradients as the root's outputs).
    let dummy_root = root_edges.len() != 1 || super::anomaly::is_anomaly_enabled();
    let mut root_buffer: GradBuffer = SmallVec::new();
    let single = match root_edges.first() {
        Some(Edge { function: Some(f), input_nr }) if !dummy_root && grads.len() == 1 => Some((f.clone(), *input_nr)),
        _ => None,
    };
    let root: NodeRef = match single {
        Some((f, nr)) => {
            let mut g = grads.into_iter().next().ok_or_else(|| Error::autograd("backward", "no initial gradient"))?;
            if let Some(c) = check_grad_meta(&|| "GraphRoot".to_string(), 0, &g, &*f, nr)? {
                g = c;
            }
            root_buffer = smallvec::smallvec![None; f.num_inputs().max(nr as usize + 1)];
            root_buffer[nr as usize] = Some(g);
            f
        }
        None => Arc::new(GraphRoot::new(root_edges, grads)),
    };

    // Discover the reachable graph (iterative DFS) and count dependencies.
    let mut index = NodeIndex::default();
    let Scratch { mut nodes, mut states, mut stack, ready } = SCRATCH.with(|s| s.take());
    index.insert(key(&root), 0);
    nodes.push(root);
    states.push(NodeState { deps: 0, buffer: root_buffer, needed: true, captures: SmallVec::new() });
    stack.push(0);
    while let Some(i) = stack.pop() {
        let n_edges = nodes[i].next_edges().len();
        for ei in 0..n_edges {
            let e = &nodes[i].next_edges()[ei];
            let Some(f) = &e.function else { continue };
            let k = key(f);
            match index.get(k) {
                Some(j) => states[j].deps += 1,
                None => {
                    let j = states.len();
                    index.insert(k, j);
                    let n_in = f.num_inputs().max(1);
                    let f = f.clone();
                    nodes.push(f);
                    states.push(NodeState {
                        deps: 1,
                        buffer: smallvec::smallvec![None; n_in],
                        needed: capture.is_none(),
                        captures: SmallVec::new(),
                    });
                    stack.push(j);
                }
            }
        }
    }

    // Captures for autograd.grad: mark targets, then find which nodes lead to one.
    let mut captured: Vec<Option<Tensor>> = Vec::new();
    if let Some(inputs) = capture {
        captured = vec![None; inputs.len()];
        for (ci, t) in inputs.iter().enumerate() {
            let e = gradient_edge(t);
            let Some(f) = &e.function else {
                return Err(Error::autograd(
                    "grad",
                    format!("One of the differentiated Tensors does not require grad (input {ci}: make it require grad, or leave it out of the inputs)"),
                ));
            };
            if let Some(j) = index.get(key(f)) {
                states[j].captures.push((e.input_nr, ci));
            }
        }
        // Post-order (children first) with an explicit stack, then propagate "needed".
        let n = states.len();
        let mut visited = vec![false; n];
        let mut order: Vec<usize> = Vec::with_capacity(n);
        let mut st: Vec<(usize, usize)> = vec![(0, 0)];
        visited[0] = true;
        while let Some(&mut (i, ref mut pos)) = st.last_mut() {
            let node = &nodes[i];
            let edges = node.next_edges();
            let mut pushed = false;
            while *pos < edges.len() {
                let e = &edges[*pos];
                *pos += 1;
                if let Some(f) = &e.function {
                    let j = index.at(key(f));
                    if !visited[j] {
                        visited[j] = true;
                        st.push((j, 0));
                        pushed = true;
                        break;
                    }
                }
            }
            if !pushed {
                order.push(i);
                st.pop();
            }
        }
        for &i in &order {
            let mut need = false;
            for e in nodes[i].next_edges() {
                if let Some(f) = &e.function {
                    let j = index.at(key(f));
                    if states[j].needed || !states[j].captures.is_empty() {
                        need = true;
                        break;
                    }
                }
            }
            states[i].needed = need;
        }
        if dummy_root {
            // A GraphRoot always runs; a real node as root runs only when it leads to an input.
            states[0].needed = true;
        }
        // Recount dependencies over edges that will actually carry gradients.
        for s in states.iter_mut() {
            s.deps = 0;
        }
        for i in 0..n {
            if !states[i].needed {
                continue;
            }
            for e in nodes[i].next_edges() {
                if let Some(f) = &e.function {
                    let j = index.at(key(f));
                    if states[j].needed || !states[j].captures.is_empty() {
                        states[j].deps += 1;
                    }
                }
            }
        }
    }

    let _mode = set_grad_enabled(create_graph);
    let mut heap: BinaryHeap<Ready> = BinaryHeap::from(ready);
    heap.push(Ready { seq: u64::MAX, idx: 0 });
    while let Some(Ready { idx, .. }) = heap.pop() {
        let node = &nodes[idx];
        let mut inputs = std::mem::take(&mut states[idx].buffer);
        let needed = states[idx].needed;
        // PyTorch's evaluate_function: in `grad()`, a node that will run captures its inputs
        // before its tensor pre-hooks (they run in call_function); one that will not run
        // calls them first, so a hook on a captured input changes the returned gradient.
        if needed {
            for &(nr, ci) in states[idx].captures.iter() {
                captured[ci] = inputs.get(nr as usize).cloned().flatten();
            }
        }
        call_tensor_pre_hooks(&**node, &mut inputs, create_graph)?;
        if !needed {
            for &(nr, ci) in states[idx].captures.iter() {
                captured[ci] = inputs.get(nr as usize).cloned().flatten();
            }
            continue;
        }
        let node_hooks = node.base().node_hooks.get();
        if let Some(h) = node_hooks {
            if h.has_pre() {
                h.run_pre(&node.name(), &mut inputs)?;
            }
        }
        let post = node_hooks.filter(|h| h.has_post());
        let grad_outputs = post.map(|_| inputs.to_vec());
        let mut outputs = call_node(node, inputs, create_graph, keep_graph)?;
        if let (Some(h), Some(go)) = (post, grad_outputs) {
            outputs = h.run_post(&node.name(), outputs, &go)?;
        }
        if !keep_graph {
            node.release_variables();
        }
        let edges = node.next_edges();
        if outputs.len() != edges.len() && !(outputs.is_empty() && node.as_accumulate_grad().is_some()) {
            return Err(Error::autograd(
                node.name().to_string(),
                format!(
                    "function {} returned an incorrect number of gradients (expected {}, got {})",
                    node.name(),
                    edges.len(),
                    outputs.len()
                ),
            ));
        }
        for (k, (e, g)) in edges.iter().zip(outputs).enumerate() {
            let Some(f) = &e.function else { continue };
            let j = index.at(key(f));
            let st = &mut states[j];
            if !st.needed && st.captures.is_empty() {
                continue;
            }
            if let Some(mut g) = g {
                if let Some(c) = check_grad_shape(&**node, k, &g, &**f, e.input_nr)? {
                    g = c;
                }
                let nr = e.input_nr as usize;
                if st.buffer.len() <= nr {
                    st.buffer.resize(nr + 1, None);
                }
                st.buffer[nr] = Some(match st.buffer[nr].take() {
                    None => g,
                    Some(old) => accumulate(old, g, create_graph)?,
                });
            }
            st.deps -= 1;
            if st.deps == 0 {
                heap.push(Ready { seq: nodes[j].sequence_nr(), idx: j });
            }
        }
    }

    if capture.is_some() && !allow_unused {
        // PyTorch checks the result: an input reached only by `None` gradients is unused too.
        for (ci, g) in captured.iter().enumerate() {
            if g.is_none() {
                return Err(Error::autograd(
                    "grad",
                    format!("The differentiated Tensor at index {ci} appears to not have been used in the graph. Set allow_unused=True if this is the desired behavior."),
                ));
            }
        }
    }
    states.clear();
    nodes.clear();
    stack.clear();
    let mut ready = heap.into_vec();
    ready.clear();
    if [states.capacity(), nodes.capacity(), stack.capacity(), ready.capacity()].iter().all(|&c| c <= SCRATCH_KEEP) {
        SCRATCH.with(|s| s.set(Scratch { nodes, states, stack, ready }));
    }
    Ok(captured)
}

/// Initial gradients: explicit ones (checked against the outputs' shapes) or 1 for
/// one-element outputs.
pub(crate) fn make_grads(outputs: &[Tensor], grad_outputs: Option<&[Option<Tensor>]>) -> Result<Vec<Tensor>> {
    let mut v = Vec::with_capacity(outputs.len());
    for (i, o) in outputs.iter().enumerate() {
        let g = grad_outputs.and_then(|g| g.get(i).cloned().flatten());
        match g {
            Some(g) => {
                if g.shape() != o.shape() {
                    return Err(Error::shape(
                        "backward",
                        format!("Mismatch in shape: grad_output[{i}] has a shape of {:?} and output[{i}] has a shape of {:?}.", g.shape(), o.shape()),
                    ));
                }
                v.push(g);
            }
            None => {
                if o.numel() != 1 {
                    return Err(Error::autograd(
                        "backward",
                        format!("grad can be implicitly created only for scalar outputs (output {i} has shape {:?}; pass a gradient of that shape)", o.shape()),
                    ));
                }
                v.push(raw::ones_like(o)?);
            }
        }
    }
    Ok(v)
}
