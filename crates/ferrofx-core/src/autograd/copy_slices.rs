//! The nodes of in-place ops on views (PyTorch's `CopySlices`) and of regenerated views
//! (`AsStridedBackward0`).
//!
//! When an in-place op writes through a view `v` of a base `b` while recording, `b`'s history
//! becomes a [`CopySlices`] node wrapping the op's own node: in backward it takes the gradient
//! of `b`, runs the op's node on the part `v` covers, writes the result back into that part
//! (the rest of `b`'s gradient passes through unchanged), and sends the gradients of the op's
//! other inputs along. `v`'s history becomes an [`AsStridedBackward`] from `b`'s new history.
//!
//! Both are written with differentiable registry ops (`index_select`, `scatter`,
//! `scatter_add`, `reshape`), so gradients through them can themselves be differentiated.

use super::node::{ApplyContext, Edge, GradBuffer, InputMetadata, Node, NodeBase, NodeRef, NodeStack};
use crate::error::{Error, Result};
use crate::layout::StridedIter;
use crate::tensor::Tensor;
use crate::value::Value;
use smallvec::{smallvec, SmallVec};
use std::borrow::Cow;

/// For every element of `view` (row-major), the row-major index of the same storage element in
/// `base`, as an `int64` tensor of shape `[view.numel()]`.
pub(crate) fn view_index(op: &str, view: &Tensor, base: &Tensor) -> Result<Tensor> {
    let (_, bl) = base.concrete(op)?;
    let (_, vl) = view.concrete(op)?;
    let n = bl.numel();
    let (lo, hi) = StridedIter::new(bl)
        .fold(None, |acc: Option<(usize, usize)>, p| match acc {
            None => Some((p, p)),
            Some((a, b)) => Some((a.min(p), b.max(p))),
        })
        .unwrap_or_default();
    let span = hi - lo + 1;
    if span > 16 * n + 4096 {
        return Err(Error::autograd(
            op,
            format!(
                "cannot rebase a view of a base whose layout spans {span} storage elements for {n} elements (shape {:?}, strides {:?}); clone() the base first",
                bl.shape(),
                bl.strides()
            ),
        ));
    }
    let mut map = vec![-1i64; span];
    for (k, p) in StridedIter::new(bl).enumerate() {
        map[p - lo] = k as i64;
    }
    let mut idx = Vec::with_capacity(vl.numel());
    for p in StridedIter::new(vl) {
        let k = p.checked_sub(lo).and_then(|q| map.get(q)).copied().unwrap_or(-1);
        if k < 0 {
            return Err(Error::autograd(
                op,
                format!(
                    "view (shape {:?}, strides {:?}, offset {}) reaches storage element {p}, outside its base (shape {:?}, strides {:?}, offset {})",
                    vl.shape(),
                    vl.strides(),
                    vl.offset(),
                    bl.shape(),
                    bl.strides(),
                    bl.offset()
                ),
            ));
        }
        idx.push(k);
    }
    let len = idx.len();
    Tensor::from_vec(idx, &[len])
}

fn call(name: &str, args: Vec<Value>) -> Result<Tensor> {
    super::formulas::prims::call(name, args)
}

fn flat(t: &Tensor) -> Result<Tensor> {
    t.reshape(&[-1])
}

fn shape_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// The backward of a view regenerated from its base: scatters the view's gradient into a zero
/// gradient of the base's shape (summing where the view repeats elements).
pub struct AsStridedBackward {
    base: NodeBase,
    index: Tensor,
    base_shape: Vec<usize>,
}

impl AsStridedBackward {
    pub(crate) fn new(view: &Tensor, base: &Tensor, edge: Edge) -> Result<AsStridedBackward> {
        let index = view_index("as_strided", view, base)?;
        Ok(AsStridedBackward {
            base: NodeBase::new(super::next_sequence_nr(), smallvec![edge], smallvec![InputMetadata::of(view)]),
            index,
            base_shape: base.shape().to_vec(),
        })
    }
}

impl Node for AsStridedBackward {
    fn base(&self) -> &NodeBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut NodeBase {
        &mut self.base
    }
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("AsStridedBackward0")
    }
    fn apply(&self, grads: GradBuffer, _ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = grads.into_iter().next().flatten() else { return Ok(vec![None]) };
        let n: usize = self.base_shape.iter().product();
        let z = super::formulas::prims::zeros(&[n], g.dtype())?;
        let out = call("scatter_add", vec![(&z).into(), Value::Int(0), (&self.index).into(), (&flat(&g)?).into()])?;
        Ok(vec![Some(out.reshape(&shape_i64(&self.base_shape))?)])
    }
}

/// PyTorch's `CopySlices`: the base's node after an in-place op wrote through one of its views.
pub struct CopySlices {
    base: NodeBase,
    /// The in-place op's own node (its first edge, the view's old history, is not used).
    fn_: Option<NodeRef>,
    index: Tensor,
    view_shape: Vec<usize>,
}

impl CopySlices {
    /// `fn_` is the node of the in-place op on `view`; `base_edge` the base's history before it.
    pub(crate) fn new(base: &Tensor, view: &Tensor, base_edge: Edge, fn_: NodeRef) -> Result<CopySlices> {
        let index = view_index("CopySlices", view, base)?;
        let mut edges: SmallVec<[Edge; 2]> = smallvec![base_edge];
        edges.extend(fn_.next_edges().iter().skip(1).cloned());
        Ok(CopySlices {
            base: NodeBase::new(super::next_sequence_nr(), edges, smallvec![InputMetadata::of(base)]),
            fn_: Some(fn_),
            index,
            view_shape: view.shape().to_vec(),
        })
    }
}

impl Node for CopySlices {
    fn base(&self) -> &NodeBase {
        &self.base
    }
    fn base_mut(&mut self) -> &mut NodeBase {
        &mut self.base
    }
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("CopySlices")
    }
    fn apply(&self, grads: GradBuffer, ctx: &ApplyContext<'_>) -> Result<Vec<Option<Tensor>>> {
        let n_out = self.base.next_edges.len();
        let Some(g) = grads.into_iter().next().flatten() else { return Ok(vec![None; n_out]) };
        let Some(f) = &self.fn_ else { return Err(Error::autograd("CopySlices", super::SECOND_BACKWARD_MSG)) };
        let gf = flat(&g)?;
        let gv = call("index_select", vec![(&gf).into(), Value::Int(0), (&self.index).into()])?
            .reshape(&shape_i64(&self.view_shape))?;
        let res = f.apply(
            smallvec![Some(gv)],
            &ApplyContext { this: f, create_graph: ctx.create_graph, keep_graph: ctx.keep_graph },
        )?;
        let mut res = res.into_iter();
        let src: Value = match res.next().flatten() {
            Some(r) => Value::Tensor(flat(&r)?),
            None => Value::Float(0.0),
        };
        let base_grad = call("scatter", vec![(&gf).into(), Value::Int(0), (&self.index).into(), src])?
            .reshape(&shape_i64(g.shape()))?;
        let mut out = Vec::with_capacity(n_out);
        out.push(Some(base_grad));
        out.extend(res);
        out.resize(n_out, None);
        Ok(out)
    }
    fn release_variables(&self) {
        if let Some(f) = &self.fn_ {
            f.release_variables();
        }
    }
    fn take_saved_nodes(&mut self, out: &mut NodeStack) {
        if let Some(f) = self.fn_.take() {
            out.push(f);
        }
    }
}
