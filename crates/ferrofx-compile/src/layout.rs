//! Layout: convolutions switch to the channel-blocked NCHW16c layout (ONNX Runtime's NCHWc
//! transformer), with reorders only where a value crosses between the layouts.
//!
//! In NCHW16c (`[n, c/16, h, w, 16]`) the 16 channels of a block are one AVX-512 register per
//! pixel, and a direct convolution kernel (`nchwc_conv2d`,
//! [`ferrofx_core::ops::conv::NCHWC_CONV2D`]) accumulates a tile of 4 channel blocks x 6 pixels
//! in registers with no im2col copy and no GEMM packing per call. A chain of such convolutions
//! (a ResNet stage: the blocks' convolutions, their residuals, the downsampling 1x1s) passes
//! blocked values from one to the next; `nchwc_reorder_input` is inserted where an NCHW value
//! enters the chain and `nchwc_reorder_output` where a blocked value leaves it (to a pooling
//! layer, a flatten, the graph's output), each once per value.
//!
//! Rules:
//! - a candidate is a float32 `conv2d_fused` (the epilogue pass runs first; its residual and
//!   activation carry over) of known shapes for which
//!   [`ferrofx_core::ops::conv::nchwc_saving`] has an estimate on this CPU (AVX-512; ungrouped
//!   (channel counts padded to blocks of 16) or depthwise; a 3x3
//!   stride-1 convolution of at least 256 output pixels runs Winograd in the blocked layout
//!   too); the estimate may be negative (a depthwise
//!   convolution on a large stride-1 plane), so that such a convolution joins a chain only
//!   when its neighbours gain more; convolutions with nothing fused after them become
//!   `conv2d_fused` first;
//! - candidates connected by a blocked value or reading the same NCHW value form a chain; a
//!   chain is converted only when the time its convolutions save is at least twice the time of
//!   the reorders it needs ([`ferrofx_core::ops::conv::nchwc_reorder_seconds`]): ResNet's
//!   stages switch, and so does the whole of MobileNetV2 (its 16-32-channel layers padded to
//!   blocks, 1x1 and depthwise convolutions alike, one reorder out before the pool);
//! - a float32 `max_pool2d` (a `MaxPool2d` module after a candidate becomes the op call first)
//!   is a candidate too (`nchwc_max_pool2d`, saving the NCHW pool's extra time per input
//!   element), so ResNet's stem, pool and first stage are one chain; a stem over 1-4 channels
//!   reads the model's NCHW input in place (no reorder before it);
//! - a value that an in-place op mutates is never reordered (the copy would miss the write),
//!   and a convolution whose output an in-place op mutates is not converted;
//! - the converted node keeps its name; its value's metadata becomes the blocked shape.
//!
//! Every output equals the NCHW graph's up to the convolution's summation order (float32
//! rounding; the reorders copy exactly).

use crate::fusion::registry_op;
use ferrofx_core::op::Effect;
use ferrofx_core::ops::conv::{
    nchwc_reads_nchw, nchwc_reorder_seconds, nchwc_saving, CONV2D_FUSED, NCHWC_BLOCK, NCHWC_CONV2D, NCHWC_MAX_POOL2D,
    NCHWC_REORDER_INPUT, NCHWC_REORDER_OUTPUT,
};
use ferrofx_core::ops::pool::MAX_POOL2D;
use ferrofx_core::{DType, Error, Result};
use ferrofx_fx::{Argument, Graph, GraphModule, NodeId, Opcode, Target, TensorMetadata};
use std::collections::{HashMap, HashSet};

fn gerr(e: ferrofx_fx::GraphError) -> Error {
    Error::argument("compile.nchwc_layout", e.to_string())
}

/// The float32 shape of a node argument's value.
fn shape_of(g: &Graph, a: &Argument) -> Option<Vec<usize>> {
    crate::epilogue::shape_f32(g, a.as_node()?)
}

/// Whether any user of `id` writes into its argument.
fn mutated(g: &Graph, id: NodeId) -> bool {
    let Ok(n) = g.node(id) else { return true };
    n.users()
        .any(|u| g.node(u).ok().and_then(|un| registry_op(&un)).is_some_and(|d| matches!(d.effect, Effect::Mutates(_))))
}

/// The time converting `id` saves, when it is a `conv2d_fused` node the blocked kernel runs
/// faster (see the module docs).
fn saving(gm: &GraphModule, id: NodeId) -> Option<f64> {
    let g = gm.graph();
    let n = g.node(id).ok()?;
    if n.op() != Opcode::CallFunction || n.target().as_op().is_none_or(|d| d.name != CONV2D_FUSED.name) {
        return None;
    }
    let a = n.args();
    if a.len() != 9 || !n.kwargs().is_empty() || a[0].as_node().is_none() {
        return None;
    }
    // the weight: a `get_attr` node (its metadata, or the attribute itself)
    let w = shape_of(g, &a[1]).or_else(|| {
        let wn = g.node(a[1].as_node()?).ok()?;
        let t = (wn.op() == Opcode::GetAttr).then(|| gm.get_attr(wn.target().name()).ok())??;
        (t.dtype() == DType::F32).then(|| t.shape().to_vec())
    });
    let (x, w, out) = (shape_of(g, &a[0])?, w?, crate::epilogue::shape_f32(g, id)?);
    let (Some(stride), Some(padding), Some(dilation), Argument::Int(groups)) =
        (a[3].as_int_list(), a[4].as_int_list(), a[5].as_int_list(), &a[6])
    else {
        return None;
    };
    let residual_ok = match &a[7] {
        Argument::None => true,
        r => r.as_node().is_some_and(|r| !mutated(g, r)) && shape_of(g, r).as_deref() == Some(out.as_slice()),
    };
    let ok = out.len() == 4 && residual_ok && !mutated(g, id) && !mutated(g, a[0].as_node().unwrap_or(id));
    ok.then(|| nchwc_saving(&x, &w, &stride, &padding, &dilation, *groups))?
}

/// The time one NCHW16c max pool saves over `max_pool2d` in NCHW per input element, in seconds
/// at two threads (ResNet-18's 3x3/2 pool over 64x112x112 at batch 1: 222 µs in NCHW, ONNX
/// Runtime's blocked pool 69 µs).
const POOL_SAVING_PER_ELEMENT: f64 = 1.5e-10;

/// A `max_pool2d` call of a float32 NCHW value (a `call_function` of the registry op, every
/// argument given) that `nchwc_max_pool2d` can compute: its saving (see
/// [`POOL_SAVING_PER_ELEMENT`]).
fn pool_saving(g: &Graph, id: NodeId) -> Option<f64> {
    let n = g.node(id).ok()?;
    let is_pool = n.op() == Opcode::CallFunction && n.target().as_op().is_some_and(|d| d.name == MAX_POOL2D.name);
    let a = n.args();
    if !is_pool || a.len() != 6 || !n.kwargs().is_empty() || mutated(g, id) {
        return None;
    }
    let x = a[0].as_node()?;
    let shape = shape_of(g, &a[0])?;
    let out = crate::epilogue::shape_f32(g, id)?;
    (shape.len() == 4 && out.len() == 4 && !mutated(g, x)).then(|| numel(&shape) as f64 * POOL_SAVING_PER_ELEMENT)
}

/// The values a converted node reads in NCHW16c: a convolution's input (unless
/// `nchwc_conv2d` reads it in NCHW: a stem over RGB channels) and residual, a pool's input.
fn blocked_inputs(g: &Graph, id: NodeId) -> Vec<NodeId> {
    let Ok(n) = g.node(id) else { return Vec::new() };
    let a = n.args();
    if n.target().as_op().is_some_and(|d| d.name == MAX_POOL2D.name) {
        return a.first().and_then(Argument::as_node).into_iter().collect();
    }
    let reads_nchw = match (shape_of(g, &a[0]), &a[6]) {
        (Some(x), Argument::Int(groups)) => x.len() == 4 && nchwc_reads_nchw(x[1], *groups),
        _ => false,
    };
    [0usize, 7].iter().filter(|&&i| i != 0 || !reads_nchw).filter_map(|&i| a.get(i)?.as_node()).collect()
}

/// `MaxPool2d` modules whose input is a candidate convolution become `max_pool2d` calls (the
/// op the module runs, its arguments spelled out), which the layout pass can then convert.
fn functional_max_pools(gm: &mut GraphModule, candidates: &HashMap<NodeId, f64>) -> Result<()> {
    let pools: Vec<(NodeId, NodeId, [Vec<i64>; 4], bool)> = gm
        .graph()
        .node_ids()
        .into_iter()
        .filter_map(|id| {
            let n = gm.graph().node(id).ok()?;
            if n.op() != Opcode::CallModule || n.args().len() != 1 || !n.kwargs().is_empty() {
                return None;
            }
            let x = n.args()[0].as_node().filter(|x| candidates.contains_key(x))?;
            let m = gm.leaf_modules().get(n.target().name())?.as_any().downcast_ref::<ferrofx_nn::MaxPool2d>()?;
            Some((id, x, [m.kernel.to_vec(), m.stride.to_vec(), m.padding.to_vec(), m.dilation.to_vec()], m.ceil_mode))
        })
        .collect();
    let target = Target::op(MAX_POOL2D.name).map_err(gerr)?;
    let g = gm.graph_mut();
    for (id, x, ints, ceil) in pools {
        let ints = ints.map(|v| Argument::list(v.into_iter().map(Argument::Int)));
        let [k, s, p, d] = ints;
        let new = {
            let mut gi = g.inserting_after(Some(id)).map_err(gerr)?;
            gi.call_function(target.clone(), vec![Argument::Node(x), k, s, p, d, Argument::Bool(ceil)]).map_err(gerr)?
        };
        *g.meta_mut(new).map_err(gerr)? = g.node(id).map_err(gerr)?.meta().clone();
        let name = g.node(id).map_err(gerr)?.name().to_string();
        g.replace_all_uses_with(id, new).map_err(gerr)?;
        g.erase_node(id).map_err(gerr)?;
        g.rename(new, &name).map_err(gerr)?;
    }
    Ok(())
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// How many times its reorders' time a chain must save: the estimates are coarse (one machine's
/// measurements), and a wrong switch costs a whole activation copied twice.
const MARGIN: f64 = 2.0;

/// The candidates worth converting: candidates connected through blocked values or a shared
/// NCHW source form a chain, converted only when the time its convolutions save exceeds the
/// time of the reorders it needs (its NCHW sources in, its values with NCHW users out).
fn worth_converting(g: &Graph, candidates: &HashMap<NodeId, f64>) -> HashSet<NodeId> {
    fn root(parent: &mut HashMap<NodeId, NodeId>, mut x: NodeId) -> NodeId {
        while let Some(&p) = parent.get(&x) {
            if p == x {
                break;
            }
            let gp = parent.get(&p).copied().unwrap_or(p);
            parent.insert(x, gp);
            x = gp;
        }
        x
    }
    let mut parent: HashMap<NodeId, NodeId> = HashMap::new();
    let inputs = |c: NodeId| -> Vec<NodeId> { blocked_inputs(g, c) };
    for &c in candidates.keys() {
        parent.entry(c).or_insert(c);
        for v in inputs(c) {
            parent.entry(v).or_insert(v);
            let (a, b) = (root(&mut parent, c), root(&mut parent, v));
            parent.insert(a, b);
        }
    }
    let mut gain: HashMap<NodeId, f64> = HashMap::new();
    let mut cost: HashMap<NodeId, f64> = HashMap::new();
    let mut sources: HashSet<NodeId> = HashSet::new();
    for (&c, &s) in candidates {
        let r = root(&mut parent, c);
        *gain.entry(r).or_default() += s;
        for v in inputs(c) {
            if !candidates.contains_key(&v) && sources.insert(v) {
                let elems = crate::epilogue::shape_f32(g, v).map_or(usize::MAX, |s| numel(&s));
                *cost.entry(r).or_default() += nchwc_reorder_seconds(elems);
            }
        }
        let leaves = g.node(c).is_ok_and(|n| n.users().any(|u| !candidates.contains_key(&u)));
        if leaves {
            let elems = crate::epilogue::shape_f32(g, c).map_or(usize::MAX, |s| numel(&s));
            *cost.entry(r).or_default() += nchwc_reorder_seconds(elems);
        }
    }
    let keys: Vec<NodeId> = candidates.keys().copied().collect();
    keys.into_iter()
        .filter(|&c| {
            let r = root(&mut parent, c);
            gain.get(&r).copied().unwrap_or(0.0) > MARGIN * cost.get(&r).copied().unwrap_or(0.0)
        })
        .collect()
}

/// The blocked shape of an NCHW shape.
fn blocked(shape: &[usize]) -> Vec<usize> {
    vec![shape[0], shape[1].div_ceil(NCHWC_BLOCK), shape[2], shape[3], NCHWC_BLOCK]
}

/// Converts every convertible convolution of `gm` to `nchwc_conv2d` and inserts the reorders;
/// returns how many convolutions were converted. `gm`'s graph must carry `tensor_meta`
/// (from [`ferrofx_fx::ShapeProp`]) and have been through [`crate::fuse_conv_epilogue`].
/// On a CPU without AVX-512 nothing is converted.
///
/// ```
/// use ferrofx_compile::{fuse_conv_epilogue, layout::convert_to_nchwc};
/// use ferrofx_core::Tensor;
/// use ferrofx_fx::{trace_with_inputs, ShapeProp};
/// use ferrofx_nn::{Conv2d, Conv2dOpts, Module};
///
/// #[derive(ferrofx_nn::Module)]
/// struct Net { a: Conv2d, b: Conv2d }
/// impl Module for Net {
///     fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
///         let y = self.a.forward(x)?.relu()?;
///         (self.b.forward(&y)? + &y)?.relu()
///     }
/// }
/// let a = Conv2d::with(64, 128, 3, Conv2dOpts { stride: 2, padding: 1, ..Default::default() })?;
/// let net = Net { a, b: Conv2d::new(128, 128, 1)? };
/// let x = ferrofx_core::ops::random::randn(&[1, 64, 56, 56], None)?;
/// let mut gm = trace_with_inputs(&net, &[(&x).into()])?;
/// ShapeProp::propagate(&mut gm, &[(&x).into()])?;
/// fuse_conv_epilogue(&mut gm)?;
/// let converted = convert_to_nchwc(&mut gm)?;
/// gm.recompile()?;
/// // both convolutions on AVX-512 (one chain: a reorder in, one out), none elsewhere
/// assert!(converted == 0 || converted == 2);
/// let _g = ferrofx_core::autograd::no_grad();
/// let (p, q) = (gm.forward(&x)?.to_vec::<f32>()?, net.forward(&x)?.to_vec::<f32>()?);
/// assert!(p.iter().zip(&q).all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs())));
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn convert_to_nchwc(gm: &mut GraphModule) -> Result<usize> {
    // convolutions with nothing to fuse after them (ResNet's downsampling 1x1s) first become
    // `conv2d_fused` nodes, so that the chain's values stay blocked through them
    crate::epilogue::wrap_lone_convs(gm, &|x, w, rest| match rest {
        [stride, padding, dilation, Argument::Int(groups)] => {
            match (stride.as_int_list(), padding.as_int_list(), dilation.as_int_list()) {
                (Some(s), Some(p), Some(d)) => nchwc_saving(x, w, &s, &p, &d, *groups).is_some(),
                _ => false,
            }
        }
        _ => false,
    })?;
    let convs: HashMap<NodeId, f64> =
        gm.graph().node_ids().into_iter().filter_map(|id| saving(gm, id).map(|s| (id, s))).collect();
    functional_max_pools(gm, &convs)?;
    let mut candidates = convs;
    for id in gm.graph().node_ids() {
        if let Some(s) = pool_saving(gm.graph(), id) {
            candidates.insert(id, s);
        }
    }
    let keep = worth_converting(gm.graph(), &candidates);
    let convs: Vec<NodeId> = gm.graph().node_ids().into_iter().filter(|id| keep.contains(id)).collect();
    let g = gm.graph_mut();
    if convs.is_empty() {
        return Ok(0);
    }
    let conv_target = Target::op(NCHWC_CONV2D.name).map_err(gerr)?;
    let pool_target = Target::op(NCHWC_MAX_POOL2D.name).map_err(gerr)?;
    let to_blocked = Target::op(NCHWC_REORDER_INPUT.name).map_err(gerr)?;
    let to_nchw = Target::op(NCHWC_REORDER_OUTPUT.name).map_err(gerr)?;
    let converted: HashSet<NodeId> = convs.iter().copied().collect();
    // the blocked copy of each NCHW value read by a converted convolution
    let mut reordered: HashMap<NodeId, NodeId> = HashMap::new();
    for &c in &convs {
        let args = g.node(c).map_err(gerr)?.args().to_vec();
        let is_pool = g.node(c).map_err(gerr)?.target().as_op().is_some_and(|d| d.name == MAX_POOL2D.name);
        let blocked_in = blocked_inputs(g, c);
        let mut new_args = args.clone();
        for i in [0usize, 7] {
            let Some(v) = args.get(i).and_then(Argument::as_node) else { continue };
            if converted.contains(&v) || !blocked_in.contains(&v) {
                continue; // already blocked, or read in NCHW
            }
            let b = match reordered.get(&v) {
                Some(&b) => b,
                None => {
                    let shape = shape_of(g, &args[i]).ok_or_else(|| {
                        Error::argument("compile.nchwc_layout", "a convolution input lost its shape metadata")
                    })?;
                    let b = {
                        let mut gi = g.inserting_before(Some(c)).map_err(gerr)?;
                        gi.call_function(to_blocked.clone(), vec![Argument::Node(v)]).map_err(gerr)?
                    };
                    g.meta_mut(b).map_err(gerr)?.tensor_meta =
                        Some(TensorMetadata::contiguous(blocked(&shape), DType::F32));
                    let name = format!("{}_nchwc", g.node(v).map_err(gerr)?.name());
                    g.rename(b, &name).map_err(gerr)?;
                    reordered.insert(v, b);
                    b
                }
            };
            new_args[i] = Argument::Node(b);
        }
        g.set_args(c, new_args).map_err(gerr)?;
        g.set_target(c, if is_pool { pool_target.clone() } else { conv_target.clone() }).map_err(gerr)?;
    }
    // NCHW copies of blocked values for the users outside the chains
    for &c in &convs {
        let users: Vec<NodeId> = g.node(c).map_err(gerr)?.users().filter(|u| !converted.contains(u)).collect();
        let shape = crate::epilogue::shape_f32(g, c)
            .ok_or_else(|| Error::argument("compile.nchwc_layout", "a convolution lost its shape metadata"))?;
        if !users.is_empty() {
            let back = {
                let mut gi = g.inserting_after(Some(c)).map_err(gerr)?;
                gi.call_function(to_nchw.clone(), vec![Argument::Node(c), Argument::Int(shape[1] as i64)])
                    .map_err(gerr)?
            };
            g.meta_mut(back).map_err(gerr)?.tensor_meta = Some(TensorMetadata::contiguous(shape.clone(), DType::F32));
            let name = format!("{}_nchw", g.node(c).map_err(gerr)?.name());
            g.rename(back, &name).map_err(gerr)?;
            for u in users {
                g.replace_input_with(u, c, back).map_err(gerr)?;
            }
        }
        g.meta_mut(c).map_err(gerr)?.tensor_meta = Some(TensorMetadata::contiguous(blocked(&shape), DType::F32));
    }
    Ok(convs.len())
}
