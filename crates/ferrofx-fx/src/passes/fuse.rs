//! Inference fusions on a [`GraphModule`] (FX's `fuse`, MegEngine's conv-bn fusion):
//!
//! * **Conv2d + BatchNorm2d** and **Linear + BatchNorm1d** in eval mode fold into one layer
//!   ([`ferrofx_nn::fusion`]): the BatchNorm node disappears, the conv/linear module is
//!   replaced by the fused one;
//! * **Dropout in eval mode** (or with `p = 0`) is the identity and is removed.
//!
//! A pair is folded only when the conv/linear output feeds the BatchNorm alone. The original
//! model is not touched: the GraphModule gets new modules.

use crate::graph::{Argument, NodeId, Opcode};
use crate::GraphModule;
use ferrofx_core::Result;
use ferrofx_nn::fusion::{fuse_conv_bn_eval, fuse_linear_bn_eval};
use ferrofx_nn::{BatchNorm, Conv2d, Dropout, Linear, Module};

fn module_of<'a, T: 'static>(gm: &'a GraphModule, path: &str) -> Option<&'a T> {
    gm.leaf_modules().get(path).and_then(|m| m.as_any().downcast_ref::<T>())
}

/// Folds every eval-mode BatchNorm that directly follows a Conv2d or Linear; returns how many
/// were folded.
pub fn fuse_conv_bn(gm: &mut GraphModule) -> Result<usize> {
    let mut pairs: Vec<(NodeId, NodeId, String, String)> = vec![];
    for n in gm.graph().iter() {
        if n.op() != Opcode::CallModule {
            continue;
        }
        let bn_path = n.target().name().to_string();
        let Some(bn) = module_of::<BatchNorm>(gm, &bn_path) else { continue };
        if !ferrofx_nn::fusion::is_foldable_bn(bn) {
            continue;
        }
        let Some(Argument::Node(src)) = n.args().first() else { continue };
        let src_node =
            gm.graph().node(*src).map_err(|e| ferrofx_core::Error::argument("fuse_conv_bn", e.to_string()))?;
        if src_node.op() != Opcode::CallModule || src_node.num_users() != 1 || n.args().len() != 1 {
            continue;
        }
        let layer_path = src_node.target().name().to_string();
        if module_of::<Conv2d>(gm, &layer_path).is_some() || module_of::<Linear>(gm, &layer_path).is_some() {
            pairs.push((*src, n.id(), layer_path, bn_path));
        }
    }
    let mut folded = 0;
    for (layer_node, bn_node, layer_path, bn_path) in pairs {
        let bn = module_of::<BatchNorm>(gm, &bn_path).ok_or_else(|| missing(&bn_path))?;
        let fused: Box<dyn Module> = if let Some(conv) = module_of::<Conv2d>(gm, &layer_path) {
            Box::new(fuse_conv_bn_eval(conv, bn)?)
        } else {
            let lin = module_of::<Linear>(gm, &layer_path).ok_or_else(|| missing(&layer_path))?;
            Box::new(fuse_linear_bn_eval(lin, bn)?)
        };
        // the fused layer keeps the conv's path; a path shared by several calls is not fused
        let callers =
            gm.graph().iter().filter(|n| n.op() == Opcode::CallModule && n.target().name() == layer_path).count();
        if callers != 1 {
            continue;
        }
        gm.add_submodule(&layer_path, fused)?;
        let g = gm.graph_mut();
        g.replace_all_uses_with(bn_node, layer_node).map_err(graph_err)?;
        g.erase_node(bn_node).map_err(graph_err)?;
        folded += 1;
    }
    gm.delete_all_unused_submodules();
    gm.delete_unused_attributes();
    gm.recompile()?;
    Ok(folded)
}

/// Removes Dropout modules that are the identity (eval mode or `p = 0`); returns how many.
pub fn remove_identity_dropout(gm: &mut GraphModule) -> Result<usize> {
    let mut found = vec![];
    for n in gm.graph().iter() {
        if n.op() != Opcode::CallModule || n.args().len() != 1 {
            continue;
        }
        let Some(d) = module_of::<Dropout>(gm, n.target().name()) else { continue };
        if !d.is_training() || d.p == 0.0 {
            if let Some(Argument::Node(src)) = n.args().first() {
                found.push((n.id(), *src));
            }
        }
    }
    let g = gm.graph_mut();
    for &(node, src) in &found {
        g.replace_all_uses_with(node, src).map_err(graph_err)?;
        g.erase_node(node).map_err(graph_err)?;
    }
    gm.delete_all_unused_submodules();
    gm.delete_unused_attributes();
    gm.recompile()?;
    Ok(found.len())
}

fn graph_err(e: crate::graph::GraphError) -> ferrofx_core::Error {
    ferrofx_core::Error::argument("fuse", e.to_string())
}

fn missing(path: &str) -> ferrofx_core::Error {
    ferrofx_core::Error::argument("fuse", format!("no module '{path}'"))
}
