//! Dynamic quantization (`torch.ao.quantization.quantize_dynamic`): the weights of the chosen
//! layers are quantized once (int8, symmetric, per output channel) and their activations per
//! call, from the range of each input, by the registry op `quantized_linear_dynamic`. Nothing is
//! calibrated; the output is float, so the rest of the model is unchanged.
//!
//! The graph is re-traced through built-in layers that contain the chosen layers (e.g.
//! `TransformerEncoderLayer`, a leaf of the default trace, so that its `linear1`/`linear2` become
//! graph nodes). As in PyTorch, `MultiheadAttention` stays whole and float (its projections are
//! `NonDynamicallyQuantizableLinear` there) unless `"MultiheadAttention"` is one of the types:
//! then the attention layers are re-traced too and their projections become dynamically
//! quantized linears: the packed query/key/value projection of self-attention (the whole
//! `in_proj_weight`, as PyTorch's `_in_projection_packed`), or for attention over other inputs
//! the three slices of it, each its own int8 weight; and `out_proj`.

use ferrofx_core::ops::quantized::quantize_per_channel;
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use ferrofx_fx::{Argument, GraphModule, Kwargs, Opcode, Target, Tracer};
use ferrofx_nn::{Linear, Module, TensorKind};

use crate::observer::{Observer, PerChannelMinMaxObserver};
use crate::qparams::ObserverConfig;

const OP: &str = "quantize_dynamic";

/// The layer types dynamic quantization supports.
const SUPPORTED: &[&str] = &["Linear", "MultiheadAttention"];

/// The attention layer type, quantized only when named.
const MHA: &str = "MultiheadAttention";

fn err(e: impl std::fmt::Display) -> Error {
    Error::argument(OP, e.to_string())
}

/// Whether `m` is a built-in leaf the re-trace must open: it holds a layer of `types` and is not
/// one itself; `MultiheadAttention` is opened only when it is one of `types` (it stays whole
/// and float otherwise, as in PyTorch).
fn opens(m: &dyn Module, types: &[String]) -> bool {
    let t = m.type_name();
    if t == MHA {
        return types.iter().any(|x| x == MHA);
    }
    !types.iter().any(|x| x == t)
        && m.named_modules().iter().any(|(p, c)| !p.is_empty() && types.iter().any(|x| x == c.type_name()))
}

/// The paths of the `MultiheadAttention` layers of `gm` (inside its leaves).
fn attention_paths(gm: &GraphModule) -> Vec<String> {
    let mut out = Vec::new();
    for (path, m) in gm.leaf_modules() {
        for (sub, c) in m.named_modules() {
            if c.type_name() == MHA {
                out.push(match (path.is_empty(), sub.is_empty()) {
                    (_, true) => path.clone(),
                    (true, false) => sub.clone(),
                    (false, false) => format!("{path}.{sub}"),
                });
            }
        }
    }
    out
}

/// Example inputs for a re-trace through attention layers (whose forward computes with shapes):
/// zeros of the shapes and dtypes `gm`'s placeholders recorded when it was traced with example
/// inputs. The re-traced graph is specialised to those shapes (as `ferrofx-compile`'s inlining of
/// the same layers).
fn example_inputs(gm: &GraphModule) -> Result<Vec<Value>> {
    gm.graph()
        .iter()
        .filter(|n| n.op() == Opcode::Placeholder)
        .map(|n| {
            let meta = n.meta().tensor_meta.as_ref().ok_or_else(|| {
                err(format!(
                    "quantizing MultiheadAttention needs the shapes of the model's inputs (attention computes with them), but placeholder `{}` has none: trace the model with trace_with_inputs",
                    n.name()
                ))
            })?;
            let shape: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
            Ok(Value::from(&ferrofx_core::ops::creation::zeros(&shape, Some(meta.dtype))?))
        })
        .collect()
}

/// A constant operand of a traced functional `linear`: a `get_attr` of `<attention>.<name>`
/// (an attention layer's `in_proj_weight` / `in_proj_bias`), or its `narrow(0, start, length)`.
/// Returns the attention layer's path, the rows taken (`start`, `length`) and the tensor.
fn attention_operand(
    q: &GraphModule,
    arg: &Argument,
    name: &str,
    attention: &[String],
) -> Option<(String, usize, usize, Tensor)> {
    let node = q.graph().node(arg.as_node()?).ok()?;
    let (attr, slice) = match node.op() {
        Opcode::GetAttr => (node, None),
        Opcode::CallFunction | Opcode::CallMethod if node.target().name() == "narrow" => {
            let a = node.args();
            let int = |i: usize| match a.get(i) {
                Some(Argument::Int(v)) => Some(*v),
                _ => None,
            };
            let src = q.graph().node(a.first()?.as_node()?).ok()?;
            if src.op() != Opcode::GetAttr || int(1)? != 0 || !node.kwargs().is_empty() {
                return None;
            }
            (src, Some((usize::try_from(int(2)?).ok()?, usize::try_from(int(3)?).ok()?)))
        }
        _ => return None,
    };
    let path = attr.target().name();
    let (layer, field) = path.rsplit_once('.')?;
    if field != name || !attention.iter().any(|a| a == layer) {
        return None;
    }
    let t = q.get_attr(path).ok()?;
    let rows = t.shape().first().copied()?;
    let (start, len) = slice.unwrap_or((0, rows));
    let t = t.narrow(0, start as i64, len as i64).ok()?;
    Some((layer.to_string(), start, len, t))
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

/// Dynamic quantization of the layers of `gm` whose module type is in `types`: `"Linear"` (every
/// `Linear` layer) and `"MultiheadAttention"` (the attention layers' query/key/value and output
/// projections, which PyTorch's `quantize_dynamic` keeps float; a ferrofx option). Each becomes
/// a `quantized_linear_dynamic` node with int8 per-channel weights (attributes
/// `<path>_weight_int8`, `<path>_weight_scale`, `<path>_bias`, so the module saves to `.fxm`
/// with int8 weights); its input is quantized to uint8 per call (per tensor) with PyTorch's
/// `ChooseQuantizationParams`, `reduce_range` halving the range as PyTorch's x86 default does.
/// `dtype` is the weights' (`int8`, PyTorch's `qint8`; `float16` is not supported). `gm` is not
/// changed. Errors name the type or the layer.
///
/// ```
/// use ferrofx_core::{DType, Tensor};
/// use ferrofx_fx::trace_with_inputs;
/// use ferrofx_nn::{Module, TransformerEncoderLayer};
/// use ferrofx_quant::quantize_dynamic_with;
/// let mut layer = TransformerEncoderLayer::new(16, 2, 32, 0.0, "relu", true, false)?;
/// layer.eval();
/// let x = ferrofx_core::ops::random::randn(&[1, 6, 16], None)?;
/// let gm = trace_with_inputs(&layer, &[(&x).into()])?;
/// // feed-forward and attention projections: the packed q/k/v projection, out_proj, linear1, linear2
/// let q = quantize_dynamic_with(&gm, &["Linear", "MultiheadAttention"], DType::I8, false)?;
/// let code = q.code()?;
/// assert_eq!(code.matches("quantized_linear_dynamic(").count(), 4, "{code}");
/// let d = (q.forward(&x)? - gm.forward(&x)?)?.abs()?.max()?.item()?;
/// assert!(d < 0.1, "{d}");
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
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
    let (all_linears, attention) = (
        types.iter().any(|t| t == "Linear"),
        if types.iter().any(|t| t == MHA) { attention_paths(gm) } else { Vec::new() },
    );
    // re-trace through the leaves that hold layers to quantize
    let names: Vec<String> =
        gm.graph().iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.target().name().to_string()).collect();
    let needs_retrace = gm.leaf_modules().values().any(|m| opens(m.as_ref(), &types));
    let mut q = if needs_retrace {
        let t2 = types.clone();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let tracer =
            Tracer::new().input_names(&name_refs).is_leaf_module(move |m, _| m.is_builtin_leaf() && !opens(m, &t2));
        // attention computes with its inputs' shapes: trace it on the recorded example shapes
        let traced = if attention.is_empty() {
            tracer.trace(gm, names.len())
        } else {
            tracer.trace_with_inputs(gm, &example_inputs(gm)?)
        };
        traced.map_err(|e| err(format!("re-tracing the model through the layers that hold {types:?}: {e}")))?
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
            // every Linear, or (for "MultiheadAttention") the attention layers' out_proj
            let in_attention = path.rsplit_once('.').is_some_and(|(p, _)| attention.iter().any(|a| a == p));
            (m.type_name() == "Linear" && (all_linears || in_attention)).then(|| (n.id(), path, n.name().to_string()))
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
    if !attention.is_empty() {
        quantize_in_projections(&mut q, &attention, reduce_range)?;
    }
    q.delete_all_unused_submodules();
    q.recompile()?;
    Ok(q)
}

/// The attention layers' input projections: each traced `linear(x, in_proj_weight[rows],
/// in_proj_bias[rows])` becomes a `quantized_linear_dynamic` with its own int8 weight:
/// `<layer>_in_proj_qkv_weight_int8` for self-attention's packed projection (all rows), else
/// `..._in_proj_{q,k,v}_weight_int8` (one storage per projection, so each keeps its packed form
/// cached); the float `in_proj_weight` is dropped.
fn quantize_in_projections(q: &mut GraphModule, attention: &[String], reduce_range: bool) -> Result<()> {
    let linears: Vec<ferrofx_fx::NodeId> = q
        .graph()
        .iter()
        .filter(|n| n.op() == Opcode::CallFunction && n.target().name() == "linear")
        .map(|n| n.id())
        .collect();
    for id in linears {
        let (name, x, weight, bias) = {
            let n = q.graph().node(id).map_err(err)?;
            let a = n.args();
            let Some((layer, start, len, w)) =
                a.get(1).and_then(|w| attention_operand(q, w, "in_proj_weight", attention))
            else {
                continue;
            };
            let bias = match a.get(2) {
                None | Some(Argument::None) => None,
                Some(b) => match attention_operand(q, b, "in_proj_bias", attention) {
                    Some((l, s, bl, b)) if l == layer && s == start && bl == len => Some(b),
                    _ => continue, // a bias from elsewhere: leave this linear float
                },
            };
            if !n.kwargs().is_empty() || a.len() > 3 {
                continue;
            }
            let whole = q.get_attr(&format!("{layer}.in_proj_weight")).ok().and_then(|t| t.shape().first().copied());
            let part = match (start / len.max(1), start % len.max(1)) {
                _ if start == 0 && Some(len) == whole => "qkv".to_string(),
                (0, 0) => "q".to_string(),
                (1, 0) => "k".to_string(),
                (2, 0) => "v".to_string(),
                _ => format!("{start}"),
            };
            let base = format!("{}_in_proj_{part}", layer.replace('.', "_"));
            (base, a[0].clone(), (layer, w), bias)
        };
        let (layer, w) = weight;
        let (wq, scale) = quantize_weight(&format!("{layer}.in_proj_weight"), &w.contiguous()?)?;
        let (wn, sn, bn) = (format!("{name}_weight_int8"), format!("{name}_weight_scale"), format!("{name}_bias"));
        q.register_attribute(&wn, wq, TensorKind::Buffer);
        q.register_attribute(&sn, scale, TensorKind::Buffer);
        if let Some(b) = &bias {
            q.register_attribute(&bn, b.contiguous()?.to_dtype(DType::F32)?, TensorKind::Buffer);
        }
        let g = q.graph_mut();
        let node_name = g.node(id).map_err(err)?.name().to_string();
        let new = {
            let mut g = g.inserting_before(Some(id)).map_err(err)?;
            let w_arg: Argument = g.get_attr(&wn).map_err(err)?.into();
            let s_arg: Argument = g.get_attr(&sn).map_err(err)?.into();
            let b_arg: Argument = if bias.is_some() { g.get_attr(&bn).map_err(err)?.into() } else { Argument::None };
            let t = Target::op("quantized_linear_dynamic").map_err(err)?;
            g.create_node(
                Opcode::CallFunction,
                t,
                vec![x, w_arg, s_arg, b_arg, Argument::Bool(reduce_range)],
                Kwargs::new(),
                Some(&format!("{node_name}_dynamic")),
                None,
            )
            .map_err(err)?
        };
        g.replace_all_uses_with(id, new).map_err(err)?;
        g.erase_node(id).map_err(err)?;
    }
    q.eliminate_dead_code()?;
    q.delete_unused_attributes();
    Ok(())
}
