//! Pre-packed linear weights: every float32 `linear(x, W, b)` whose weight is a constant of the
//! module (a `Linear` leaf, a `get_attr`, or a `narrow` of one, as `MultiheadAttention`'s
//! packed in-projection gives) becomes `addmm(b, x.reshape(-1, K), Wt).reshape(..., N)` with
//! `Wt = W.T` stored once, contiguous, as a constant of the compiled module
//! (`<name>_weight_t`).
//!
//! Why: `linear` multiplies by a transposed view of `W`, which the GEMM must gather while it
//! packs its panels on every call; with `K = 1536` (a transformer's feed-forward output) that
//! costs a third of the GEMM's time on this project's machine. ONNX Runtime and oneDNN pre-pack
//! their weights at session creation for the same reason. The packed copy is data like any
//! other attribute: it prints as a `get_attr`, saves and loads with the module, and loading
//! runs no code.
//!
//! The weights are frozen: the compiled module keeps the transposed copy it made, so a later
//! in-place change of the original weight is not seen (as for the BatchNorm folding the
//! inference pipeline already does). [`crate::compile`] runs this pass only with
//! [`crate::CompileOptions::inference_passes`] and [`crate::CompileOptions::prepack_weights`].

use crate::fusion::registry_op;
use ferrofx_core::{DType, Error, Result, Tensor};
use ferrofx_fx::{Argument, Graph, GraphModule, Node, NodeId, Opcode, Target};
use ferrofx_nn::{Linear, TensorKind};

fn gerr(e: ferrofx_fx::GraphError) -> Error {
    Error::argument("prepack_linear_weights", e.to_string())
}

/// The float32 shape of a node's value.
fn shape_f32(g: &Graph, id: NodeId) -> Option<Vec<usize>> {
    let m = g.node(id).ok()?.meta().tensor_meta.clone()?;
    (m.dtype == DType::F32).then_some(m.shape)
}

/// The tensor a constant argument evaluates to, with a name for it: a `get_attr`
/// (`layer_weight`), or a `narrow` of one with constant arguments (`layer_weight_0_384`).
fn constant(gm: &GraphModule, a: &Argument) -> Option<(Tensor, String)> {
    let n = gm.graph().node(a.as_node()?).ok()?;
    match n.op() {
        Opcode::GetAttr => Some((gm.get_attr(n.target().name()).ok()?, n.target().name().replace('.', "_"))),
        _ if registry_op(&n).is_some_and(|d| d.name == "narrow") && n.kwargs().is_empty() => {
            let args = n.args();
            let int = |i: usize| match args.get(i) {
                Some(Argument::Int(v)) => Some(*v),
                _ => None,
            };
            let (t, name) = constant(gm, args.first()?)?;
            let (dim, start, len) = (int(1)?, int(2)?, int(3)?);
            Some((t.narrow(dim, start, len).ok()?, format!("{name}_{start}_{len}")))
        }
        _ => None,
    }
}

/// One `linear` the pass rewrites.
struct Site {
    node: NodeId,
    x: Argument,
    weight: Tensor,
    /// The packed weight's attribute name.
    packed_name: String,
    /// The bias: an existing argument, or a leaf's tensor to register.
    bias: Option<Bias>,
    x_shape: Vec<usize>,
}

enum Bias {
    Arg(Argument),
    Leaf(Tensor),
}

fn site(gm: &GraphModule, n: &Node<'_>) -> Option<Site> {
    let x_shape = shape_f32(gm.graph(), n.args().first()?.as_node()?)?;
    shape_f32(gm.graph(), n.id())?;
    let (x, weight, bias) = match n.op() {
        Opcode::CallModule => {
            let lin = gm.leaf_modules().get(n.target().name())?.as_any().downcast_ref::<Linear>()?;
            if n.args().len() != 1 || !n.kwargs().is_empty() {
                return None;
            }
            let flat = n.target().name().replace('.', "_");
            (n.args()[0].clone(), (lin.weight.clone(), format!("{flat}_weight")), lin.bias.clone().map(Bias::Leaf))
        }
        Opcode::CallFunction if n.target().as_op().is_some_and(|d| d.name == "linear") => {
            let args = n.args();
            if !n.kwargs().is_empty() || !(2..=3).contains(&args.len()) {
                return None;
            }
            let bias = match args.get(2) {
                None | Some(Argument::None) => None,
                Some(b) => Some(Bias::Arg(b.clone())),
            };
            (args[0].clone(), constant(gm, &args[1])?, bias)
        }
        _ => return None,
    };
    let (weight, packed_name) = (weight.0, format!("{}_t", weight.1));
    let ok = weight.dtype() == DType::F32
        && weight.ndim() == 2
        && !x_shape.is_empty()
        && x_shape.last() == weight.shape().get(1);
    ok.then_some(Site { node: n.id(), x, weight, packed_name, bias, x_shape })
}

/// The pass (see the module docs). Returns the number of `linear`s rewritten. `gm`'s graph must
/// carry `tensor_meta` (from [`ferrofx_fx::ShapeProp`]); the new nodes have none until shape
/// propagation runs again.
///
/// ```
/// use ferrofx_compile::linear_weights::prepack_linear_weights;
/// use ferrofx_fx::{trace_with_inputs, ShapeProp};
/// use ferrofx_nn::{Linear, Module};
///
/// let lin = Linear::new(8, 4, true)?;
/// let x = ferrofx_core::ops::random::randn(&[2, 3, 8], None)?;
/// let mut gm = trace_with_inputs(&lin, &[(&x).into()])?;
/// ShapeProp::propagate(&mut gm, &[(&x).into()])?;
/// assert_eq!(prepack_linear_weights(&mut gm)?, 1);
/// gm.recompile()?;
/// assert!(gm.graph().to_string().contains("addmm"));
/// let d = (gm.forward(&x)? - lin.forward(&x)?)?.abs()?.max()?.item()?;
/// assert!(d < 1e-5, "{d}");
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn prepack_linear_weights(gm: &mut GraphModule) -> Result<usize> {
    let sites: Vec<Site> = gm.graph().iter().filter_map(|n| site(gm, &n)).collect();
    let (addmm, mm, reshape) =
        (Target::op("addmm").map_err(gerr)?, Target::op("mm").map_err(gerr)?, Target::op("reshape").map_err(gerr)?);
    for s in &sites {
        let name = gm.graph().node(s.node).map_err(gerr)?.name().to_string();
        let wt = s.weight.t()?.contiguous()?;
        let wt_path = s.packed_name.clone();
        gm.register_attribute(&wt_path, wt, TensorKind::Buffer);
        let bias_path = match &s.bias {
            Some(Bias::Leaf(b)) => {
                let p = s.packed_name.replace("_weight_t", "_bias");
                gm.register_attribute(&p, b.clone(), TensorKind::Parameter);
                Some(p)
            }
            _ => None,
        };
        let k = s.weight.shape()[1] as i64;
        let n_out = s.weight.shape()[0] as i64;
        let g = gm.graph_mut();
        let mut meta = g.node(s.node).map_err(gerr)?.meta().clone();
        meta.tensor_meta = None;
        let before: std::collections::HashSet<NodeId> = g.iter().map(|n| n.id()).collect();
        let new = {
            let mut gi = g.inserting_before(Some(s.node)).map_err(gerr)?;
            let wt = Argument::Node(gi.get_attr(&wt_path).map_err(gerr)?);
            let bias = match (&s.bias, &bias_path) {
                (_, Some(p)) => Some(Argument::Node(gi.get_attr(p).map_err(gerr)?)),
                (Some(Bias::Arg(a)), None) => Some(a.clone()),
                _ => None,
            };
            let flat = s.x_shape.len() != 2;
            let x2 = if flat {
                Argument::Node(
                    gi.call_function(
                        reshape.clone(),
                        vec![s.x.clone(), Argument::list([Argument::Int(-1), Argument::Int(k)])],
                    )
                    .map_err(gerr)?,
                )
            } else {
                s.x.clone()
            };
            let y = match bias {
                Some(b) => gi.call_function(addmm.clone(), vec![b, x2, wt]).map_err(gerr)?,
                None => gi.call_function(mm.clone(), vec![x2, wt]).map_err(gerr)?,
            };
            if flat {
                let mut out: Vec<Argument> =
                    s.x_shape[..s.x_shape.len() - 1].iter().map(|&d| Argument::Int(d as i64)).collect();
                out.push(Argument::Int(n_out));
                gi.call_function(reshape.clone(), vec![Argument::Node(y), Argument::list(out)]).map_err(gerr)?
            } else {
                y
            }
        };
        // the new nodes keep the linear's provenance (module path, stack); shape propagation
        // gives them their own tensor metadata
        let added: Vec<NodeId> = g.iter().map(|n| n.id()).filter(|id| !before.contains(id)).collect();
        for id in added {
            *g.meta_mut(id).map_err(gerr)? = meta.clone();
        }
        g.replace_all_uses_with(s.node, new).map_err(gerr)?;
        g.erase_node(s.node).map_err(gerr)?;
        g.rename(new, &name).map_err(gerr)?;
    }
    if !sites.is_empty() {
        gm.eliminate_dead_code()?;
        gm.delete_all_unused_submodules();
        gm.delete_unused_attributes();
    }
    Ok(sites.len())
}
