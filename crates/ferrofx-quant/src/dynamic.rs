//! Dynamic quantization (`torch.ao.quantization.quantize_dynamic`): the weights of the chosen
//! layers are quantized once (int8, symmetric, per output channel) and their activations per
//! call, from the range of each input, by the registry op `quantized_linear_dynamic`. Nothing is
//! calibrated; the output is float, so the rest of the model is unchanged.
//!
//! The graph is re-traced through built-in layers that contain the chosen layers (e.g.
//! `TransformerEncoderLayer`, a leaf of the default trace, so that its `linear1`/`linear2` become
//! graph nodes). As in PyTorch, `MultiheadAttention` stays whole and float (its projections are
//! `NonDynamicallyQuantizableLinear` there).

use ferrofx_core::ops::quantized::quantize_per_channel;
use ferrofx_core::{DType, Error, Result, Tensor};
use ferrofx_fx::{Argument, GraphModule, Kwargs, Opcode, Target, Tracer};
use ferrofx_nn::{Linear, Module, TensorKind};

use crate::observer::{Observer, PerChannelMinMaxObserver};
use crate::qparams::ObserverConfig;

const OP: &str = "quantize_dynamic";

/// The layer types dynamic quantization supports.
const SUPPORTED: &[&str] = &["Linear"];

fn err(e: impl std::fmt::Display) -> Error {
    Error::argument(OP, e.to_string())
}

/// Whether `m` is a built-in leaf the re-trace must open: it holds a layer of `types` and is not
/// one itself (`MultiheadAttention` stays whole, as in PyTorch).
fn opens(m: &dyn Module, types: &[String]) -> bool {
    let t = m.type_name();
    !types.iter().any(|x| x == t)
        && t != "MultiheadAttention"
        && m.named_modules().iter().any(|(p, c)| !p.is_empty() && types.iter().any(|x| x == c.type_name()))
}

/// The int8 weight (per output channel, symmetric) and its scales.
fn quantize_weight(path: &str, w: &Tensor) -> Result<(Tensor, Tensor)> {
    let obs = PerChannelMinMaxObserver::new(ObserverConfig::per_channel_weight(), 0)?;
    let wf = w.to_dtype(DType::F32)?;
    obs.observe(&wf).map_err(|e| err(format!("weight of `{path}`: {e}")))?;
    let qp = obs.calculate_qparams().map_err(|e| err(format!("weight of `{path}`: {e}")))?;
    let oc = w.shape().first().copied().unwrap_or(0);
    let s = Tensor::from_vec(qp.scale.iter().map(|&s| s as f64).collect::<Vec<_>>(), &[oc])?;
    let z = Tensor::from_vec(qp.zero_point.clone(), &[oc])?;
    let wq = quantize_per_channel(&wf, &s, &z, 0, DType::I8)?;
    Ok((wq, Tensor::from_vec(qp.scale.clone(), &[oc])?))
}

/// [`quantize_dynamic_with`] with `reduce_range = false` (ferrofx's int8 kernels are exact with
/// all 8 bits of the activations).
///
/// ```
/// use ferrofx_core::{DType, Tensor};
/// use ferrofx_fx::trace_with_inputs;
/// use ferrofx_nn::{zoo::Mlp, Module};
/// use ferrofx_quant::quantize_dynamic;
/// let x = Tensor::from_vec((0..64).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(), &[4, 16]).unwrap();
/// let gm = trace_with_inputs(&Mlp::new(16, &[32], 8).unwrap(), &[(&x).into()]).unwrap();
/// let q = quantize_dynamic(&gm, &["Linear"], DType::I8).unwrap();
/// assert!(q.code().unwrap().contains("quantized_linear_dynamic"));
/// let (a, b) = (gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), q.forward(&x).unwrap().to_vec::<f32>().unwrap());
/// assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 0.05));
/// ```
pub fn quantize_dynamic(gm: &GraphModule, types: &[&str], dtype: DType) -> Result<GraphModule> {
    quantize_dynamic_with(gm, types, dtype, false)
}

/// Dynamic quantization of the layers of `gm` whose module type is in `types` (`"Linear"`):
/// each becomes a `quantized_linear_dynamic` node with int8 per-channel weights (attributes
/// `<path>_weight_int8`, `<path>_weight_scale`, `<path>_bias`, so the module saves to `.fxm`
/// with int8 weights); its input is quantized to uint8 per call (per tensor) with PyTorch's
/// `ChooseQuantizationParams`, `reduce_range` halving the range as PyTorch's x86 default does.
/// `dtype` is the weights' (`int8`, PyTorch's `qint8`; `float16` is not supported). `gm` is not
/// changed. Errors name the type or the layer.
pub fn quantize_dynamic_with(
    gm: &GraphModule,
    types: &[&str],
    dtype: DType,
    reduce_range: bool,
) -> Result<GraphModule> {
    if dtype != DType::I8 {
        return Err(err(format!(
            "dtype {dtype} is not supported: dynamic quantization stores int8 weights (PyTorch's torch.qint8); pass DType::I8"
        )));
    }
    if let Some(t) = types.iter().find(|t| !SUPPORTED.contains(t)) {
        return Err(err(format!(
            "module type {t:?} has no dynamically quantized implementation; supported: {SUPPORTED:?}"
        )));
    }
    let types: Vec<String> = types.iter().map(|s| s.to_string()).collect();
    // re-trace through the leaves that hold layers to quantize
    let names: Vec<String> =
        gm.graph().iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.target().name().to_string()).collect();
    let needs_retrace = gm.leaf_modules().values().any(|m| opens(m.as_ref(), &types));
    let mut q = if needs_retrace {
        let t2 = types.clone();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        Tracer::new()
            .input_names(&name_refs)
            .is_leaf_module(move |m, _| m.is_builtin_leaf() && !opens(m, &t2))
            .trace(gm, names.len())
            .map_err(|e| err(format!("re-tracing the model through the layers that hold {types:?}: {e}")))?
    } else {
        let (g, _) = gm.graph().deep_copy().map_err(err)?;
        let modules = gm
            .leaf_modules()
            .iter()
            .map(|(k, m)| {
                m.clone_module()
                    .map(|c| (k.clone(), c))
                    .ok_or_else(|| err(format!("module `{k}` ({}) cannot be copied", m.type_name())))
            })
            .collect::<Result<_>>()?;
        GraphModule::from_parts(g, modules, gm.attributes().clone(), gm.traced_type_name(), false)?
    };

    let targets: Vec<(ferrofx_fx::NodeId, String, String)> = q
        .graph()
        .iter()
        .filter(|n| n.op() == Opcode::CallModule)
        .filter_map(|n| {
            let path = n.target().name().to_string();
            let m = q.leaf_modules().get(&path)?;
            types.iter().any(|t| t == m.type_name()).then(|| (n.id(), path, n.name().to_string()))
        })
        .collect();
    for (id, path, name) in targets {
        let (w, b) = {
            let l = q
                .leaf_modules()
                .get(&path)
                .and_then(|m| m.as_any().downcast_ref::<Linear>())
                .ok_or_else(|| err(format!("node `{name}`: module `{path}` is not a Linear")))?;
            (l.weight.clone(), l.bias.clone())
        };
        let (wq, scale) = quantize_weight(&path, &w)?;
        let base = path.replace('.', "_");
        let (wn, sn, bn) = (format!("{base}_weight_int8"), format!("{base}_weight_scale"), format!("{base}_bias"));
        q.register_attribute(&wn, wq, TensorKind::Buffer);
        q.register_attribute(&sn, scale, TensorKind::Buffer);
        if let Some(b) = &b {
            q.register_attribute(&bn, b.to_dtype(DType::F32)?, TensorKind::Buffer);
        }
        let g = q.graph_mut();
        let node = g.node(id).map_err(err)?;
        if node.args().len() != 1 || !node.kwargs().is_empty() {
            return Err(err(format!(
                "node `{name}`: a Linear call takes one input, got {} arguments",
                node.args().len()
            )));
        }
        let x = node.args()[0].clone();
        let new = {
            let mut g = g.inserting_before(Some(id)).map_err(err)?;
            let w_arg: Argument = g.get_attr(&wn).map_err(err)?.into();
            let s_arg: Argument = g.get_attr(&sn).map_err(err)?.into();
            let b_arg: Argument = if b.is_some() { g.get_attr(&bn).map_err(err)?.into() } else { Argument::None };
            let t = Target::op("quantized_linear_dynamic").map_err(err)?;
            g.create_node(
                Opcode::CallFunction,
                t,
                vec![x, w_arg, s_arg, b_arg, Argument::Bool(reduce_range)],
                Kwargs::new(),
                Some(&format!("{name}_dynamic")),
                None,
            )
            .map_err(err)?
        };
        g.replace_all_uses_with(id, new).map_err(err)?;
        g.erase_node(id).map_err(err)?;
    }
    q.delete_all_unused_submodules();
    q.recompile()?;
    Ok(q)
}
