//! Constant folding on a [`GraphModule`]: every pure computation whose inputs are all known
//! before the module runs is computed once, now, and replaced by a constant attribute
//! (`_folded_constant0`, ...).
//!
//! Known values are tensor constants captured while tracing (`_tensor_constant0`, ...),
//! attributes the caller declares **frozen** (PyTorch's `torch.jit.freeze` semantics: a frozen
//! parameter or buffer is treated as a constant, so the graph no longer sees later updates to
//! it), literals, and results of already-folded nodes. Only pure registry ops fold: never random
//! or in-place ops, never module calls (a module may hold state), never placeholders. Ops with
//! several outputs are left alone. Attributes no node reads any more are dropped.
//!
//! ```
//! use ferrofx_fx::passes::constant_fold::fold_constants;
//! use ferrofx_fx::{symbolic_trace, Opcode};
//! use ferrofx_nn::{Module, ModuleStructure};
//! use ferrofx_core::{Result, Tensor};
//!
//! /// `x * (w.t() @ w)`: the Gram matrix of a frozen weight is a constant.
//! #[derive(ferrofx_nn::Module)]
//! struct Gram { w: Tensor }
//! impl Module for Gram {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         x.matmul(&self.w.t()?.matmul(&self.w)?)
//!     }
//! }
//! let m = Gram { w: Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])? };
//! let mut gm = symbolic_trace(&m)?;
//! assert_eq!(fold_constants(&mut gm, &["w"])?, 2); // t and matmul
//! let text = gm.graph().to_string();
//! assert!(text.contains("get_attr[target=_folded_constant0]"), "{text}");
//! assert!(!text.contains("target=w]"), "{text}");
//! let x = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2])?;
//! assert_eq!(gm.forward(&x)?.to_vec::<f32>()?, m.forward(&x)?.to_vec::<f32>()?);
//! # Ok::<(), ferrofx_core::Error>(())
//! ```

use crate::core_api;
use crate::graph::{Argument, NodeId, Opcode, Target};
use crate::graph_module::{GraphModule, TensorEntry};
use crate::plan::eval_op;
use crate::values::Slots;
use ferrofx_core::op::CallKind;
use ferrofx_core::{Error, Result, Value};
use ferrofx_nn::TensorKind;
use std::collections::{HashMap, HashSet};

struct Known<'a>(&'a HashMap<NodeId, Value>);

impl Slots for Known<'_> {
    fn get(&self, node: NodeId) -> Result<Value> {
        self.0
            .get(&node)
            .cloned()
            .ok_or_else(|| Error::argument("fold_constants", format!("node {node:?} is not a constant")))
    }
}

fn graph_err(e: crate::graph::GraphError) -> Error {
    Error::argument("fold_constants", e.to_string())
}

/// Folds every pure computation on constants (and on the attributes named in `frozen`) into
/// a constant attribute; returns how many computation nodes were folded away. The graph stays
/// lint-clean and the module computes the same values.
pub fn fold_constants(gm: &mut GraphModule, frozen: &[&str]) -> Result<usize> {
    for path in frozen {
        if !gm.attrs.contains_key(*path) {
            return Err(Error::argument(
                "fold_constants",
                format!(
                    "'{path}' is not an attribute of the module traced from {} (attributes: {})",
                    gm.type_name,
                    gm.attrs.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    let frozen: HashSet<&str> = frozen.iter().copied().collect();
    let mut known: HashMap<NodeId, Value> = HashMap::new();
    let mut folded: Vec<NodeId> = Vec::new();
    for n in gm.graph.iter() {
        match n.op() {
            Opcode::GetAttr => {
                let path = n.target().name();
                if let Some(e) = gm.attrs.get(path) {
                    if e.constant || frozen.contains(path) {
                        known.insert(n.id(), Value::Tensor(e.tensor.detach()));
                    }
                }
            }
            Opcode::CallFunction | Opcode::CallMethod => {
                let (def, kind) = match (n.op(), n.target()) {
                    (Opcode::CallFunction, Target::Op(def)) => (*def, CallKind::Function),
                    (Opcode::CallMethod, Target::Str(m)) => match core_api::lookup(m) {
                        Some(def) => (def, CallKind::Method),
                        None => continue,
                    },
                    _ => continue,
                };
                if !def.is_pure() || def.name == "getitem" {
                    continue;
                }
                let inputs = n.all_input_nodes();
                if inputs.is_empty() || !inputs.iter().all(|i| known.contains_key(i)) {
                    continue;
                }
                let kwargs: Vec<(String, Argument)> = n.kwargs().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                let value = {
                    let _g = ferrofx_core::autograd::no_grad();
                    eval_op(def, kind, n.args(), &kwargs, &Known(&known))
                        .map_err(|e| e.with_context(&format!("while folding node '{}'", n.name())))?
                };
                if matches!(value, Value::Tensor(_)) {
                    known.insert(n.id(), value);
                    folded.push(n.id());
                }
            }
            _ => {}
        }
    }
    // replace each folded node some unfolded node still reads by a constant attribute
    let folded_set: HashSet<NodeId> = folded.iter().copied().collect();
    let mut next = gm.attrs.keys().filter(|k| k.starts_with("_folded_constant")).count();
    for id in &folded {
        let needed = gm.graph.node(*id).map_err(graph_err)?.users().any(|u| !folded_set.contains(&u));
        if !needed {
            continue;
        }
        let Some(Value::Tensor(t)) = known.get(id).cloned() else { continue };
        let mut path = format!("_folded_constant{next}");
        while gm.attrs.contains_key(&path) {
            next += 1;
            path = format!("_folded_constant{next}");
        }
        next += 1;
        gm.attrs.insert(path.clone(), TensorEntry { tensor: t, kind: TensorKind::Buffer, constant: true });
        let g = gm.graph_mut();
        let attr = g.inserting_before(Some(*id)).map_err(graph_err)?.get_attr(&path).map_err(graph_err)?;
        g.replace_all_uses_with(*id, attr).map_err(graph_err)?;
    }
    // every folded node is now unused (its readers were folded too or read the constant)
    gm.graph_mut().eliminate_dead_code(None).map_err(graph_err)?;
    gm.delete_all_unused_submodules();
    gm.delete_unused_attributes();
    gm.graph.lint().map_err(graph_err)?;
    Ok(folded.len())
}
