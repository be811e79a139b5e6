//! Work analysis: multiply-accumulates (as PyTorch's `FlopCounterMode` counts them: matrix
//! products and convolutions) and parameter counts, from the op registry's cost functions over
//! a fully flattened trace with shapes.
//!
//! ```
//! use ferrofx_fx::passes::flops::{count_macs, count_parameters};
//! use ferrofx_nn::Linear;
//! let lin = Linear::new(8, 4, true).unwrap();
//! let x = ferrofx_core::Tensor::from_vec(vec![0.0f32; 16], &[2, 8]).unwrap();
//! assert_eq!(count_macs(&lin, &[(&x).into()]).unwrap().total, 2 * 8 * 4);
//! assert_eq!(count_parameters(&lin), 8 * 4 + 4);
//! ```

use crate::graph::{Argument, Opcode, Target};
use crate::Tracer;
use ferrofx_core::trace::Symbolic;
use ferrofx_core::{Error, Result, Tensor, TensorMeta, Value};
use ferrofx_nn::Module;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Ops whose FLOPs `FlopCounterMode` counts (as 2 × MACs).
const COUNTED: &[&str] = &["conv1d", "conv2d", "conv_transpose2d", "linear", "matmul", "mm", "bmm", "addmm", "baddbmm"];

/// Multiply-accumulates of one forward pass, in total and per op.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MacCount {
    /// Total multiply-accumulates.
    pub total: u64,
    /// Per op name.
    pub by_op: BTreeMap<String, u64>,
}

fn meta_of(n: &crate::graph::Node<'_>) -> Option<TensorMeta> {
    n.meta().tensor_meta.as_ref().map(|m| TensorMeta {
        shape: m.shape.as_slice().into(),
        dtype: m.dtype,
        strides: m.strides.iter().map(|&s| s as usize).collect::<Vec<_>>().as_slice().into(),
    })
}

/// Counts the MACs of `model` on `inputs` by tracing it down to ops (no leaves) and summing
/// the registry's cost of every counted op.
pub fn count_macs(model: &dyn Module, inputs: &[Value]) -> Result<MacCount> {
    let gm = Tracer::new().is_leaf_module(|_, _| false).trace_with_inputs(model, inputs)?;
    let g = gm.graph();
    let mut out = MacCount::default();
    for n in g.iter() {
        let def = match (n.op(), n.target()) {
            (Opcode::CallFunction, Target::Op(d)) => *d,
            (Opcode::CallMethod, Target::Str(m)) => match ferrofx_core::op::lookup(m) {
                Some(d) => d,
                None => continue,
            },
            _ => continue,
        };
        if !COUNTED.contains(&def.name) {
            continue;
        }
        let stand_in = |a: &Argument| -> Result<Value> {
            Ok(match a {
                Argument::Node(id) => {
                    let node = g.node(*id).map_err(|e| Error::argument("count_macs", e.to_string()))?;
                    Value::Tensor(Tensor::symbolic(Symbolic { meta: meta_of(&node), proxy: Arc::new(()) }))
                }
                Argument::Int(i) => Value::Int(*i),
                Argument::Float(f) => Value::Float(*f),
                Argument::Bool(b) => Value::Bool(*b),
                Argument::Str(s) => Value::Str(s.to_string()),
                Argument::List(v) | Argument::Tuple(v) => Value::Ints(
                    v.iter().filter_map(|x| if let Argument::Int(i) = x { Some(*i) } else { None }).collect(),
                ),
                _ => Value::None,
            })
        };
        let args = n.args().iter().map(stand_in).collect::<Result<Vec<_>>>()?;
        let kwargs = n.kwargs().iter().map(|(k, v)| Ok((k.clone(), stand_in(v)?))).collect::<Result<Vec<_>>>()?;
        let bound = ferrofx_core::op::bind(def.name, def.schema, args, kwargs)?;
        let outs = meta_of(&n).into_iter().collect::<Vec<_>>();
        let macs = (def.cost)(&bound, &outs).flops / 2;
        out.total += macs;
        *out.by_op.entry(def.name.to_string()).or_default() += macs;
    }
    Ok(out)
}

/// Number of parameter elements (PyTorch's `sum(p.numel() for p in model.parameters())`).
pub fn count_parameters(model: &dyn Module) -> usize {
    model.parameters().iter().map(|p| p.numel()).sum()
}
