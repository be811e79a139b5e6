//! ONNX operators as registry op calls.
//!
//! Every ONNX node is evaluated by calling registry ops through `op::call` (the single
//! dispatch point), so the same code runs eagerly on concrete tensors and records
//! `call_function` nodes while the importer traces it with symbolic inputs. Values that only
//! depend on constants and known shapes (`Shape`, `Gather` on a shape, `Constant`...) are
//! computed on concrete tensors and so folded away.
//!
//! One file per family: [`elementwise`], [`shape`], [`reduce`], [`nn`], [`quant`], [`signal`],
//! [`resize`], [`einsum`], [`sequence`] (lists of tensors, unrolled at import).

pub(crate) mod einsum;
pub(crate) mod elementwise;
pub(crate) mod gradient;
pub(crate) mod nn;
pub(crate) mod quant;
pub(crate) mod reduce;
pub(crate) mod resize;
pub(crate) mod sequence;
pub(crate) mod shape;
pub(crate) mod signal;

use crate::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
use crate::tensor_proto::{tensor_from_proto, ExternalDataDir};
use ferrofx_core::{op, DType, Error, Result, Tensor, Value};

/// One node being evaluated: its proto, opset and input values (`None` for an omitted
/// optional input, the empty name).
pub(crate) struct Node<'a> {
    pub proto: &'a NodeProto,
    pub opset: i64,
    pub inputs: Vec<Option<Tensor>>,
    pub dir: &'a ExternalDataDir,
}

/// The signature of an ONNX op's converter.
pub(crate) type Convert = fn(&Node<'_>) -> Result<Vec<Tensor>>;

impl<'a> Node<'a> {
    /// The op type.
    pub fn op(&self) -> &str {
        self.proto.op_type.as_deref().unwrap_or("")
    }

    /// An error naming the node, its op type and opset.
    pub fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::argument(
            "onnx",
            format!("node `{}` ({} opset {}): {msg}", self.proto.name.as_deref().unwrap_or(""), self.op(), self.opset),
        )
    }

    /// Required input `i`.
    pub fn x(&self, i: usize) -> Result<&Tensor> {
        self.inputs
            .get(i)
            .and_then(|t| t.as_ref())
            .ok_or_else(|| self.err(format!("input {i} is required but the node has {} input(s)", self.inputs.len())))
    }

    /// Optional input `i`.
    pub fn opt(&self, i: usize) -> Option<&Tensor> {
        self.inputs.get(i).and_then(|t| t.as_ref())
    }

    /// The attribute `name`.
    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.proto.attribute.iter().find(|a| a.name.as_deref() == Some(name))
    }

    /// Integer attribute with a default.
    pub fn i(&self, name: &str, default: i64) -> i64 {
        self.attr(name).and_then(|a| a.i).unwrap_or(default)
    }

    /// Float attribute with a default.
    pub fn f(&self, name: &str, default: f32) -> f64 {
        self.attr(name).and_then(|a| a.f).unwrap_or(default) as f64
    }

    /// Integer-list attribute.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name)
            .filter(|a| !a.ints.is_empty() || a.r#type == Some(AttributeType::Ints as i32))
            .map(|a| a.ints.clone())
    }

    /// Float-list attribute.
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.attr(name).map(|a| a.floats.clone())
    }

    /// String attribute.
    pub fn s(&self, name: &str) -> Option<String> {
        self.attr(name).and_then(|a| a.s.as_ref()).map(|s| String::from_utf8_lossy(s).into_owned())
    }

    /// Tensor attribute.
    pub fn t(&self, name: &str) -> Result<Option<Tensor>> {
        match self.attr(name).and_then(|a| a.t.as_ref()) {
            Some(t) => tensor_from_proto(t, self.dir).map(Some).map_err(|e| self.err(e)),
            None => Ok(None),
        }
    }

    /// The values of a tensor that must be known at import time (shapes, axes, pads...).
    pub fn const_ints(&self, t: &Tensor, what: &str) -> Result<Vec<i64>> {
        if t.is_symbolic() {
            return Err(self.err(format!(
                "input `{what}` must be known when the model is imported (a constant, an initializer or computed \
                 from shapes), but it depends on the values of a graph input"
            )));
        }
        Ok(t.to_vec_f64()?.into_iter().map(|v| v as i64).collect())
    }

    /// The values of a tensor that must be known at import time, as floats.
    pub fn const_floats(&self, t: &Tensor, what: &str) -> Result<Vec<f64>> {
        if t.is_symbolic() {
            return Err(self.err(format!("input `{what}` must be known when the model is imported")));
        }
        t.to_vec_f64()
    }

    /// Normalises an axis against `rank` (negative counts from the end).
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize> {
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r.max(1) {
            return Err(self.err(format!("axis {axis} is out of range for a tensor of rank {rank}")));
        }
        Ok(a as usize)
    }

    /// Normalises `axis` as [`Node::axis`] for an axis that indexes a dimension of a tensor of
    /// rank `rank`: a scalar (rank 0) has none, so every axis is an error there.
    pub fn dim_axis(&self, axis: i64, rank: usize) -> Result<usize> {
        if rank == 0 {
            return Err(self.err(format!(
                "axis {axis} names a dimension, but the input is a scalar (rank 0); give a tensor of rank >= 1"
            )));
        }
        self.axis(axis, rank)
    }
}

/// Calls registry op `name` with positional arguments, returning its first output.
pub(crate) fn call(name: &str, args: Vec<Value>) -> Result<Tensor> {
    first(name, call_op(name, args, vec![])?)
}

/// Calls registry op `name` with positional and keyword arguments, returning its first output.
pub(crate) fn callk(name: &str, args: Vec<Value>, kwargs: Vec<(&str, Value)>) -> Result<Tensor> {
    first(name, call_op(name, args, kwargs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())?)
}

/// Calls registry op `name`, returning all its outputs.
pub(crate) fn call_all(name: &str, args: Vec<Value>) -> Result<Vec<Tensor>> {
    Ok(call_op(name, args, vec![])?.into_iter().collect())
}

/// Every converter's registry call: `op::call`, recorded on the [`gradient`] tape while a
/// graph with a `Gradient` node is evaluated.
fn call_op(name: &str, args: Vec<Value>, kwargs: Vec<(String, Value)>) -> Result<op::Outputs> {
    if !gradient::recording() {
        return op::call(name, args, kwargs);
    }
    let def = op::require(name)?;
    let bound = op::bind(def.name, def.schema, args, kwargs)?;
    let out = op::dispatch(def, op::CallKind::Function, &bound)?;
    gradient::record(def, bound, &out);
    Ok(out)
}

fn first(name: &str, out: op::Outputs) -> Result<Tensor> {
    out.into_iter().next().ok_or_else(|| Error::schema(name, "op returned no output"))
}

/// `Value` of a tensor.
pub(crate) fn v(t: &Tensor) -> Value {
    Value::Tensor(t.clone())
}

/// A concrete `i64` tensor of a list.
pub(crate) fn i64_tensor(values: &[i64]) -> Result<Tensor> {
    Tensor::from_vec(values.to_vec(), &[values.len()])
}

/// A scalar tensor of `dtype`.
pub(crate) fn scalar_of(value: f64, dtype: DType) -> Result<Tensor> {
    callk("full", vec![Value::Ints(vec![]), Value::Float(value)], vec![("dtype", Value::DType(dtype))])
}

/// Every family's table of (ONNX op type, converter).
const TABLES: &[&[(&str, Convert)]] = &[
    elementwise::TABLE,
    shape::TABLE,
    reduce::TABLE,
    nn::TABLE,
    quant::TABLE,
    signal::TABLE,
    resize::TABLE,
    einsum::TABLE,
];

/// The converter of ONNX op `op_type` (default domain), if supported.
pub(crate) fn converter(op_type: &str) -> Option<Convert> {
    TABLES.iter().flat_map(|t| t.iter()).find(|(name, _)| *name == op_type).map(|(_, f)| *f)
}

/// Every supported ONNX op type (default domain), sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = TABLES.iter().flat_map(|t| t.iter().map(|(n, _)| *n)).collect();
    all.extend(sequence::OPS);
    all.push(gradient::OP);
    all.sort_unstable();
    all
}
