//! Small constructors for ONNX protos (nodes, attributes, value infos, models), used by the
//! exporter and by tests that build models in Rust.

use crate::proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension::Value as Dim, tensor_shape_proto::Dimension,
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, ValueInfoProto,
};

/// A node of the default domain.
pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.to_string()),
        name: Some(name.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn attr(name: &str, t: AttributeType) -> AttributeProto {
    AttributeProto { name: Some(name.to_string()), r#type: Some(t as i32), ..Default::default() }
}

/// An integer attribute.
pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { i: Some(v), ..attr(name, AttributeType::Int) }
}

/// A float attribute.
pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto { f: Some(v), ..attr(name, AttributeType::Float) }
}

/// An integer-list attribute.
pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { ints: v.to_vec(), ..attr(name, AttributeType::Ints) }
}

/// A string attribute.
pub fn attr_str(name: &str, v: &str) -> AttributeProto {
    AttributeProto { s: Some(v.as_bytes().to_vec()), ..attr(name, AttributeType::String) }
}

/// A tensor attribute.
pub fn attr_tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto { t: Some(t), ..attr(name, AttributeType::Tensor) }
}

/// A graph attribute (`If` branches, `Loop` bodies).
pub fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto { g: Some(g), ..attr(name, AttributeType::Graph) }
}

/// A tensor value info; `None` dims are symbolic (`dim_param` = `param`).
pub fn value_info(name: &str, elem_type: i32, dims: &[Option<i64>], param: &str) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => Dim::DimValue(*v),
                None => Dim::DimParam(param.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A model of one graph importing the default-domain `opset`.
pub fn model(graph: GraphProto, opset: i64) -> ModelProto {
    ModelProto {
        ir_version: Some(if opset >= 21 { 10 } else { 8 }),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        producer_name: Some("ferrofx".to_string()),
        producer_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        graph: Some(graph),
        ..Default::default()
    }
}
