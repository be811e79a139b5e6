//! What a node is to the quantization workflow (FX's backend config patterns): an op with an
//! int8 kernel, a ReLU that fuses into one, an op that passes uint8 values through, or an op
//! that stays in float.

use crate::qconfig::QConfig;
use ferrofx_fx::{Argument, GraphModule, Node, NodeId, Opcode};

/// The role of a node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Role {
    /// `Conv2d` module → `quantized_conv2d`.
    Conv(String),
    /// `Linear` module → `quantized_linear`.
    Linear(String),
    /// `add(a, b)` of two tensors → `quantized_add`.
    Add,
    /// `relu` (function, method or `ReLU` module): fuses into the op before it.
    Relu,
    /// Max pooling, flatten, reshape, view: the float op on uint8 values is the quantized op.
    PassThrough,
    /// Adaptive average pooling → `quantized_adaptive_avg_pool2d` with the input's qparams.
    AdaptiveAvgPool(Vec<i64>),
    /// `cat`: inputs requantized to the output's qparams, then concatenated as uint8.
    Cat,
    /// No int8 implementation.
    Other,
}

/// The module type of a `call_module` node, or the op name of a function/method call.
pub(crate) fn type_or_op(gm: &GraphModule, n: &Node<'_>) -> String {
    match n.op() {
        Opcode::CallModule => {
            gm.leaf_modules().get(n.target().name()).map_or_else(|| "<missing module>".into(), |m| m.type_name().into())
        }
        _ => n.target().name().to_string(),
    }
}

/// The module a node calls, or the innermost module it was traced in.
pub(crate) fn module_path(n: &Node<'_>) -> Option<String> {
    match n.op() {
        Opcode::CallModule => Some(n.target().name().to_string()),
        _ => n.meta().nn_module_stack.last().map(|e| e.path.clone()),
    }
}

fn int_list(a: &Argument) -> Option<Vec<i64>> {
    match a {
        Argument::Int(i) => Some(vec![*i, *i]),
        Argument::List(v) | Argument::Tuple(v) => {
            v.iter().map(|x| if let Argument::Int(i) = x { Some(*i) } else { None }).collect()
        }
        _ => None,
    }
}

/// Classifies a node.
pub(crate) fn role(gm: &GraphModule, n: &Node<'_>) -> Role {
    let name = type_or_op(gm, n);
    match n.op() {
        Opcode::CallModule => {
            let path = n.target().name().to_string();
            let m = gm.leaf_modules().get(&path);
            match name.as_str() {
                "Conv2d" if m.and_then(|m| m.as_any().downcast_ref::<ferrofx_nn::Conv2d>()).is_some() => {
                    Role::Conv(path)
                }
                "Linear" if m.and_then(|m| m.as_any().downcast_ref::<ferrofx_nn::Linear>()).is_some() => {
                    Role::Linear(path)
                }
                "ReLU" => Role::Relu,
                "MaxPool2d" | "Flatten" | "Identity" => Role::PassThrough,
                "AdaptiveAvgPool2d" => match m.and_then(|m| m.as_any().downcast_ref::<ferrofx_nn::AdaptiveAvgPool2d>())
                {
                    Some(p) => Role::AdaptiveAvgPool(p.output_size.to_vec()),
                    None => Role::Other,
                },
                _ => Role::Other,
            }
        }
        Opcode::CallFunction | Opcode::CallMethod => match name.as_str() {
            "add" if n.args().len() == 2 && n.kwargs().is_empty() && n.args().iter().all(|a| a.as_node().is_some()) => {
                Role::Add
            }
            "relu" if n.args().len() == 1 => Role::Relu,
            "max_pool2d" | "flatten" | "reshape" | "view" | "contiguous" => Role::PassThrough,
            "adaptive_avg_pool2d" => match n.args().get(1).and_then(int_list) {
                Some(size) => Role::AdaptiveAvgPool(size),
                None => Role::Other,
            },
            "cat" if matches!(n.args().first(), Some(Argument::List(v) | Argument::Tuple(v)) if v.iter().all(|a| a.as_node().is_some())) => {
                Role::Cat
            }
            _ => Role::Other,
        },
        _ => Role::Other,
    }
}

/// What `prepare` decided for a node (kept in the node's meta under [`ANNOTATION`] for
/// `convert`).
#[derive(Debug, Clone)]
pub(crate) enum Annotation {
    /// An op with an int8 kernel; `relu` fuses into it and `output` is the node whose value
    /// is observed (the ReLU when fused).
    Quantized { qconfig: QConfig, relu: Option<NodeId> },
    /// A ReLU fused into the op before it.
    FusedRelu,
    /// Runs on uint8 when its input is quantized.
    PassThrough,
}

/// The meta key of [`Annotation`].
pub(crate) const ANNOTATION: &str = "quantization_annotation";
