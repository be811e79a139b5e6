//! `prepare` (`torch.ao.quantization.quantize_fx.prepare_fx`): fold BatchNorm into the conv
//! or linear before it, drop eval-mode Dropout, and insert observer modules
//! (`activation_post_process_N`) on the values that will be quantized, following a
//! [`QConfigMapping`].
//!
//! Patterns (FX's x86 backend config): `conv2d (+ relu)`, `linear (+ relu)`, `add (+ relu)`,
//! `cat`, and pass-through ops (max pooling, flatten/reshape/view, adaptive average pooling)
//! that share their input's quantization parameters. The input of each quantized op and the
//! output of each pattern is observed once; a value reached through pass-through ops from an
//! observed value is not observed again.

use crate::observer_module::ObserverModule;
use crate::pattern::{module_path, role, type_or_op, Annotation, Role, ANNOTATION};
use crate::qconfig::{QConfig, QConfigMapping, QConfigSource};
use ferrofx_core::{DType, Error, Result, Value};
use ferrofx_fx::passes::fuse::{fuse_conv_bn, remove_identity_dropout};
use ferrofx_fx::{GraphModule, NodeId, Opcode, ShapeProp};
use ferrofx_nn::Module;
use indexmap::IndexMap;
use std::collections::{HashMap, HashSet};

const OP: &str = "prepare";

pub(crate) fn graph_err(e: impl std::fmt::Display) -> Error {
    Error::argument(OP, e.to_string())
}

/// A copy of `gm` with its own graph and module copies (tensors shared).
pub(crate) fn copy_graph_module(gm: &GraphModule, who: &str) -> Result<GraphModule> {
    let (graph, _) = gm.graph().deep_copy().map_err(|e| Error::argument(who, e.to_string()))?;
    let mut modules: IndexMap<String, Box<dyn Module>> = IndexMap::new();
    for (p, m) in gm.leaf_modules() {
        let copy = m.clone_module().ok_or_else(|| {
            Error::argument(who, format!("module `{p}` ({}) cannot be copied (no clone_module)", m.type_name()))
        })?;
        modules.insert(p.clone(), copy);
    }
    GraphModule::from_parts(graph, modules, gm.attributes().clone(), gm.traced_type_name(), false)
}

/// Checks every `set_module_name` entry names a module of `gm`.
fn check_module_names(gm: &GraphModule, mapping: &QConfigMapping) -> Result<()> {
    for name in mapping.module_names() {
        let prefix = format!("{name}.");
        let found = gm.leaf_modules().keys().any(|p| p == name || p.starts_with(&prefix))
            || gm
                .graph()
                .iter()
                .any(|n| n.meta().nn_module_stack.iter().any(|e| e.path == name || e.path.starts_with(&prefix)));
        if !found {
            let known: Vec<&str> = gm.leaf_modules().keys().map(String::as_str).collect();
            return Err(Error::argument(
                OP,
                format!(
                    "QConfigMapping.set_module_name(\"{name}\") names no module of the model; its modules are [{}]: fix the name or remove the entry",
                    known.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Inserts observers into a copy of `gm` (which must be in eval mode) for calibration, as
/// `prepare_fx` does; `example_inputs` run once through the model to learn which values are
/// float tensors (shape propagation). Returns the prepared module: run calibration batches
/// through it, then [`convert`](crate::convert()) it.
///
/// Errors: a module name in the mapping that matches no module; a node the mapping selects by
/// its own module name or type/op name but that has no int8 implementation (it names the
/// node, the op and the fix); a model in training mode.
///
/// ```
/// use ferrofx_core::{ops::random::randn, Value};
/// use ferrofx_nn::{Linear, Module, Sequential};
/// use ferrofx_quant::{convert, prepare, QConfigMapping};
/// let mut lin = Sequential::new(); // traced as one call_module node `0`
/// lin.push(Linear::new(8, 4, true).unwrap());
/// lin.eval();
/// let gm = ferrofx_fx::symbolic_trace(&lin).unwrap();
/// let x = randn(&[16, 8], None).unwrap();
/// let prepared = prepare(&gm, &QConfigMapping::default_x86(), &[Value::from(&x)]).unwrap();
/// assert!(prepared.graph().to_string().contains("activation_post_process_0"));
/// prepared.forward(&x).unwrap(); // calibration
/// let q = convert(&prepared).unwrap();
/// assert!(q.graph().to_string().contains("quantized_linear"));
/// let (a, b) = (q.forward(&x).unwrap().to_vec::<f32>().unwrap(), lin.forward(&x).unwrap().to_vec::<f32>().unwrap());
/// assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 0.1));
/// ```
pub fn prepare(gm: &GraphModule, mapping: &QConfigMapping, example_inputs: &[Value]) -> Result<GraphModule> {
    mapping.validate(OP)?;
    // modules that behave differently in training (BatchNorm, Dropout) must be in eval mode
    if let Some((path, m)) = gm.leaf_modules().iter().find(|(_, m)| m.local_training() == Some(true)) {
        return Err(Error::argument(
            OP,
            format!(
                "the model is in training mode (module `{path}`, {}): call .eval() before post-training quantization (BatchNorm folds with its running statistics)",
                m.type_name()
            ),
        ));
    }
    check_module_names(gm, mapping)?;
    let mut gm = copy_graph_module(gm, OP)?;
    fuse_conv_bn(&mut gm)?;
    remove_identity_dropout(&mut gm)?;
    ShapeProp::propagate(&mut gm, example_inputs)
        .map_err(|e| Error::argument(OP, format!("running the example inputs through the model failed: {e}")))?;

    // decide each node's role first (the graph does not change during this walk)
    let is_float = |gm: &GraphModule, id: NodeId| -> bool {
        gm.graph().node(id).ok().and_then(|n| n.meta().tensor_meta.clone()).is_some_and(|m| m.dtype == DType::F32)
    };
    let ids: Vec<NodeId> = gm.graph().iter().map(|n| n.id()).collect();
    let mut decided: HashMap<NodeId, (Role, Option<QConfig>)> = HashMap::new();
    for &id in &ids {
        let n = gm.graph().node(id).map_err(graph_err)?;
        let r = role(&gm, &n);
        let path = module_path(&n);
        let type_name = type_or_op(&gm, &n);
        let (q, src) = mapping.resolve(path.as_deref(), &type_name);
        if q.is_some()
            && r == Role::Other
            && matches!(n.op(), Opcode::CallModule | Opcode::CallFunction | Opcode::CallMethod)
        {
            let explicit = match &src {
                QConfigSource::ObjectType(t) => *t == type_name,
                QConfigSource::ModuleName(p) => n.op() == Opcode::CallModule && path.as_deref() == Some(p.as_str()),
                QConfigSource::Global => false,
            };
            if explicit {
                return Err(Error::argument(
                    OP,
                    format!(
                        "node `{}` ({} `{}`) is selected for quantization by {src}, but ferrofx has no int8 implementation of {type_name} (quantizable: Conv2d, Linear, add, relu fused into them, cat, max_pool2d, adaptive_avg_pool2d, flatten/reshape/view): map it to None to keep it in float",
                        n.name(),
                        n.op().as_str(),
                        n.target().name()
                    ),
                ));
            }
        }
        decided.insert(id, (r, q));
    }

    let mut observed: HashSet<NodeId> = HashSet::new(); // values and observer nodes
    let mut annotations: Vec<(NodeId, Annotation)> = vec![];
    let mut counter = 0usize;
    for &id in &ids {
        let (r, q) = decided[&id].clone();
        let Some(qconfig) = q else { continue };
        let n = gm.graph().node(id).map_err(graph_err)?;
        let inputs: Vec<NodeId> = match &r {
            Role::Conv(_) | Role::Linear(_) => n.args().first().and_then(|a| a.as_node()).into_iter().collect(),
            Role::Add => n.args().iter().filter_map(|a| a.as_node()).collect(),
            Role::Cat => n.all_input_nodes(),
            Role::PassThrough | Role::AdaptiveAvgPool(_) => {
                annotations.push((id, Annotation::PassThrough));
                continue;
            }
            Role::Relu | Role::Other => continue,
        };
        if !is_float(&gm, id) || inputs.iter().any(|&i| !is_float(&gm, i)) || inputs.is_empty() {
            continue; // not a float tensor op (e.g. an add of integer tensors)
        }
        // a ReLU that is the only user fuses in (not for cat)
        let mut relu = None;
        if r != Role::Cat && n.num_users() == 1 {
            let u = n.users().next().expect("one user");
            if let Some((Role::Relu, Some(_))) = decided.get(&u) {
                relu = Some(u);
            }
        }
        let output = relu.unwrap_or(id);
        for input in inputs {
            observe(&mut gm, input, &qconfig, &decided, &mut observed, &mut counter)?;
        }
        observe(&mut gm, output, &qconfig, &decided, &mut observed, &mut counter)?;
        if let Some(u) = relu {
            annotations.push((u, Annotation::FusedRelu));
        }
        annotations.push((id, Annotation::Quantized { qconfig, relu }));
    }
    let g = gm.graph_mut();
    for (id, a) in annotations {
        g.meta_mut(id).map_err(graph_err)?.insert(ANNOTATION, a);
    }
    gm.recompile()?;
    Ok(gm)
}

/// Whether `v` already carries quantization parameters: it is observed, or it passes an
/// observed value through.
fn is_observed(
    gm: &GraphModule,
    mut v: NodeId,
    decided: &HashMap<NodeId, (Role, Option<QConfig>)>,
    observed: &HashSet<NodeId>,
) -> bool {
    loop {
        if observed.contains(&v) {
            return true;
        }
        match decided.get(&v) {
            Some((Role::PassThrough | Role::AdaptiveAvgPool(_), Some(_))) => {
                match gm.graph().node(v).ok().and_then(|n| n.args().first().and_then(|a| a.as_node())) {
                    Some(src) => v = src,
                    None => return false,
                }
            }
            _ => return false,
        }
    }
}

/// Inserts an activation observer after `v` (after the last placeholder when `v` is one) and
/// routes every other user of `v` through it.
fn observe(
    gm: &mut GraphModule,
    v: NodeId,
    qconfig: &QConfig,
    decided: &HashMap<NodeId, (Role, Option<QConfig>)>,
    observed: &mut HashSet<NodeId>,
    counter: &mut usize,
) -> Result<()> {
    if is_observed(gm, v, decided, observed) {
        return Ok(());
    }
    let path = loop {
        let p = format!("activation_post_process_{counter}");
        *counter += 1;
        if !gm.leaf_modules().contains_key(&p) {
            break p;
        }
    };
    gm.add_submodule(&path, Box::new(ObserverModule::new(qconfig.activation.build()?)))?;
    let (after, meta) = {
        let n = gm.graph().node(v).map_err(graph_err)?;
        let mut after = v;
        if n.op() == Opcode::Placeholder {
            for m in gm.graph().iter() {
                if m.op() == Opcode::Placeholder {
                    after = m.id();
                }
            }
        }
        (after, n.meta().tensor_meta.clone())
    };
    let g = gm.graph_mut();
    let obs = {
        let mut g = g.inserting_after(Some(after)).map_err(graph_err)?;
        g.call_module(&path, vec![v.into()]).map_err(graph_err)?
    };
    g.replace_all_uses_with_where(v, obs, |u| u.id() != obs, false).map_err(graph_err)?;
    g.meta_mut(obs).map_err(graph_err)?.tensor_meta = meta;
    observed.insert(v);
    observed.insert(obs);
    Ok(())
}
