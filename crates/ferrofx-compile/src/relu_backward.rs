//! Backward fusion of `relu`'s gradient: in a training graph, the backward of a `relu` whose
//! output is `y` is `mul(grad, gt(y, 0))` — a pass that reads the gradient and `y` and writes
//! the masked gradient, which the next backward kernel reads again. Two of those kernels can
//! apply the mask themselves while the data is in cache:
//!
//! - **max pooling**: `mul(max_pool2d_backward(g, y, ...), gt(y, 0))`, the pooling's input
//!   being the relu's output (ResNet's stem: `maxpool(relu(bn(conv(x))))`), becomes
//!   `max_pool2d_backward(g, y, ..., relu_mask=True)`, which masks each plane right after adding
//!   its gradients;
//! - **batch norm**: `batch_norm_backward(mul(g, gt(y, 0)), ...)` — the masked gradient used by
//!   nothing else — becomes `batch_norm_backward(g, ..., relu_output=y)`, which masks the
//!   gradient in both of its passes instead of reading a materialised product.
//!
//! Both kernels compute the mask exactly as the unfused graph does (the gradient times `1.0` or
//! `0.0` in float32), so the result is bit-equal. A product used elsewhere (the gradient of a
//! ResNet block's output also flows into the identity path) stays materialised.
//!
//! Run it after shape propagation and before elementwise fusion (which would otherwise fuse the
//! `gt` and the `mul` into a `fused_elementwise` node).

use crate::epilogue::shape_f32;
use crate::fusion::registry_op;
use ferrofx_core::{Error, Result};
use ferrofx_fx::{Argument, Graph, GraphModule, Node, NodeId};

fn gerr(e: ferrofx_fx::GraphError) -> Error {
    Error::argument("fuse_relu_backward", e.to_string())
}

fn op_name(n: &Node<'_>) -> Option<&'static str> {
    registry_op(n).map(|d| d.name)
}

/// `Some(y)` when `n` is `gt(y, 0)` with a float32 tensor `y` (the bool mask of relu's
/// backward).
fn relu_mask_of(g: &Graph, n: &Node<'_>) -> Option<NodeId> {
    if op_name(n) != Some("gt") || !n.kwargs().is_empty() || n.args().len() != 2 {
        return None;
    }
    let y = n.args()[0].as_node()?;
    let zero = match &n.args()[1] {
        Argument::Int(0) => true,
        Argument::Float(v) => *v == 0.0,
        _ => false,
    };
    (zero && shape_f32(g, y).is_some()).then_some(y)
}

/// The users of `id`.
fn users(g: &Graph, id: NodeId) -> Vec<NodeId> {
    g.node(id).map(|n| n.users().collect()).unwrap_or_default()
}

/// One rewrite the pass found.
enum Rewrite {
    /// `mul` node, the `max_pool2d_backward` node it masks, the `gt` node.
    MaxPool { mul: NodeId, pool: NodeId, gt: NodeId },
    /// `mul` node, its gradient operand, the relu output, the `batch_norm_backward` node, the
    /// `gt` node.
    BatchNorm { mul: NodeId, grad: Argument, y: NodeId, bn: NodeId, gt: NodeId },
}

fn find(g: &Graph) -> Vec<Rewrite> {
    let mut found = Vec::new();
    for n in g.iter() {
        if op_name(&n) != Some("mul") || !n.kwargs().is_empty() || n.args().len() != 2 {
            continue;
        }
        let Some(shape) = shape_f32(g, n.id()) else { continue };
        let (a, b) = (n.args()[0].as_node(), n.args()[1].as_node());
        // which operand is the mask
        let pick = [(a, b), (b, a)].into_iter().find_map(|(grad, mask)| {
            let (grad, mask) = (grad?, mask?);
            let y = relu_mask_of(g, &g.node(mask).ok()?)?;
            Some((grad, mask, y))
        });
        let Some((grad, gt, y)) = pick else { continue };
        if shape_f32(g, grad).as_ref() != Some(&shape) || shape_f32(g, y).as_ref() != Some(&shape) {
            continue;
        }
        let grad_node = g.node(grad).ok();
        // max pooling whose input is the relu's output, used only by this mul
        if let Some(p) = grad_node.filter(|p| op_name(p) == Some("max_pool2d_backward")) {
            let args = p.args();
            let unmasked = args.get(7).is_none_or(|a| matches!(a, Argument::Bool(false)));
            if p.kwargs().is_empty()
                && args.get(1).and_then(|a| a.as_node()) == Some(y)
                && unmasked
                && users(g, grad) == [n.id()]
            {
                found.push(Rewrite::MaxPool { mul: n.id(), pool: grad, gt });
                continue;
            }
        }
        // a batch norm backward reading the product as its only gradient, and nothing else
        // reading it
        let us = users(g, n.id());
        if let [bn] = us[..] {
            let Ok(bn_node) = g.node(bn) else { continue };
            let args = bn_node.args();
            let grad_arg = args.first().and_then(|a| a.as_node()) == Some(n.id());
            let unmasked = args.get(7).is_none_or(|a| matches!(a, Argument::None));
            let input_shape = args.get(4).and_then(|a| a.as_node()).and_then(|x| shape_f32(g, x));
            if op_name(&bn_node) == Some("batch_norm_backward")
                && bn_node.kwargs().is_empty()
                && grad_arg
                && unmasked
                && args.iter().skip(1).all(|a| a.as_node() != Some(n.id()))
                && input_shape.as_ref() == Some(&shape)
            {
                found.push(Rewrite::BatchNorm { mul: n.id(), grad: Argument::Node(grad), y, bn, gt });
            }
        }
    }
    found
}

/// Erases `id` if nothing uses it any more.
fn erase_if_unused(g: &mut Graph, id: NodeId) -> Result<()> {
    if users(g, id).is_empty() {
        g.erase_node(id).map_err(gerr)?;
    }
    Ok(())
}

/// The pass (see the module docs): returns the number of relu backwards fused. `gm`'s graph
/// must carry `tensor_meta` (from [`ferrofx_fx::ShapeProp`]).
pub fn fuse_relu_backward(gm: &mut GraphModule) -> Result<usize> {
    let rewrites = find(gm.graph());
    let g = gm.graph_mut();
    for r in &rewrites {
        match r {
            Rewrite::MaxPool { mul, pool, gt } => {
                let mut args = g.node(*pool).map_err(gerr)?.args().to_vec();
                let ints = |v: &[i64]| Argument::list(v.iter().map(|&i| Argument::Int(i)));
                let defaults = [ints(&[]), ints(&[0, 0]), ints(&[1, 1]), Argument::Bool(false)];
                while args.len() < 7 {
                    args.push(defaults[args.len() - 3].clone());
                }
                args.truncate(7);
                args.push(Argument::Bool(true));
                g.set_args(*pool, args).map_err(gerr)?;
                g.replace_all_uses_with(*mul, *pool).map_err(gerr)?;
                g.erase_node(*mul).map_err(gerr)?;
                erase_if_unused(g, *gt)?;
            }
            Rewrite::BatchNorm { mul, grad, y, bn, gt } => {
                let mut args = g.node(*bn).map_err(gerr)?.args().to_vec();
                args[0] = grad.clone();
                let defaults = [Argument::None, Argument::Float(1e-5)];
                while args.len() < 7 {
                    args.push(defaults[args.len() - 5].clone());
                }
                args.truncate(7);
                args.push(Argument::Node(*y));
                g.set_args(*bn, args).map_err(gerr)?;
                erase_if_unused(g, *mul)?;
                erase_if_unused(g, *gt)?;
            }
        }
    }
    Ok(rewrites.len())
}
