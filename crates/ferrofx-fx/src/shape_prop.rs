//! [`ShapeProp`]: shape propagation on the [`Interpreter`] (FX's
//! `torch.fx.passes.shape_prop.ShapeProp`): runs the GraphModule on example inputs and records
//! every node's `tensor_meta` (shape, dtype, strides, requires_grad); nodes with several
//! outputs get one entry per output under the meta key [`TENSOR_METAS`].
//!
//! ```
//! use ferrofx_fx::{symbolic_trace, ShapeProp};
//! use ferrofx_nn::{Linear, Module, Tensor};
//! let mut gm = symbolic_trace(&Linear::new(3, 2, true).unwrap()).unwrap();
//! let x = Tensor::from_vec(vec![0.0f32; 12], &[4, 3]).unwrap();
//! ShapeProp::propagate(&mut gm, &[x.into()]).unwrap();
//! let lin = gm.graph().iter().find(|n| n.name() == "linear").unwrap();
//! assert_eq!(lin.meta().tensor_meta.as_ref().unwrap().shape, vec![4, 2]);
//! ```

use crate::graph::{Node, NodeId, TensorMetadata};
use crate::graph_module::GraphModule;
use crate::interpreter::{default_run_node, Env, Interpreter, NodeValue};
use ferrofx_core::{Result, Tensor, Value};
use std::collections::HashMap;

/// The `meta` key under which ShapeProp stores one `Option<TensorMetadata>` per output of a
/// node with several outputs (`Vec<Option<TensorMetadata>>`).
pub const TENSOR_METAS: &str = "tensor_metas";

/// Shape propagation (an [`Interpreter`] that records what each node produced).
pub struct ShapeProp<'m> {
    gm: &'m GraphModule,
    metas: HashMap<NodeId, Vec<Option<TensorMetadata>>>,
}

fn metadata(t: &Tensor) -> Option<TensorMetadata> {
    t.meta().map(|m| TensorMetadata {
        shape: m.shape.to_vec(),
        dtype: m.dtype,
        strides: m.strides.iter().map(|&s| s as isize).collect(),
        requires_grad: t.requires_grad(),
    })
}

fn value_meta(v: &Value) -> Option<TensorMetadata> {
    match v {
        Value::Tensor(t) => metadata(t),
        _ => None,
    }
}

impl<'m> Interpreter<'m> for ShapeProp<'m> {
    fn module(&self) -> &'m GraphModule {
        self.gm
    }
    fn run_node(&mut self, node: Node<'m>, env: &Env) -> Result<NodeValue> {
        let v = default_run_node(self, node, env)?;
        if node.op() != crate::graph::Opcode::Output {
            self.record(node.id(), &v);
        }
        Ok(v)
    }
}

impl<'m> ShapeProp<'m> {
    fn record(&mut self, id: NodeId, v: &NodeValue) {
        let ms = match v {
            NodeValue::One(v) => vec![value_meta(v)],
            NodeValue::Many(vs) => vs.iter().map(value_meta).collect(),
        };
        self.metas.insert(id, ms);
    }

    /// Runs `gm` on `inputs` and stores every node's `tensor_meta`; returns the outputs. (Editing
    /// meta goes through `graph_mut`, so the next forward recompiles the plan.)
    pub fn propagate(gm: &mut GraphModule, inputs: &[Value]) -> Result<Vec<Value>> {
        let (out, metas) = {
            let mut sp = ShapeProp { gm, metas: HashMap::new() };
            let out = sp.run(inputs)?;
            (out, sp.metas)
        };
        let g = gm.graph_mut();
        for (id, mut ms) in metas {
            let meta = g.meta_mut(id).map_err(|e| ferrofx_core::Error::argument("ShapeProp", e.to_string()))?;
            if ms.len() == 1 {
                meta.tensor_meta = ms.pop().flatten();
            } else {
                meta.tensor_meta = None;
                meta.insert(TENSOR_METAS, ms);
            }
        }
        Ok(out)
    }
}
