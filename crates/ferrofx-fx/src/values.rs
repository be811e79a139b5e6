//! Conversions between runtime [`Value`]s and graph [`Argument`]s.

use crate::graph::{Argument, NodeId};
use ferrofx_core::op::ArgType;
use ferrofx_core::{Error, Result, Tensor, Value};

/// A literal runtime value as a graph argument (`None` for tensors, which the caller maps).
pub(crate) fn literal(v: &Value) -> Option<Argument> {
    Some(match v {
        Value::None => Argument::None,
        Value::Bool(b) => Argument::Bool(*b),
        Value::Int(i) => Argument::Int(*i),
        Value::Float(f) => Argument::Float(*f),
        Value::Str(s) => Argument::Str(s.as_str().into()),
        Value::DType(d) => Argument::DType(*d),
        Value::Ints(v) => Argument::list(v.iter().map(|&i| Argument::Int(i))),
        Value::Floats(v) => Argument::list(v.iter().map(|&f| Argument::Float(f))),
        Value::Tensor(_) | Value::Tensors(_) => return None,
    })
}

/// Where a plan finds a node's value when it runs.
pub(crate) trait Slots {
    /// The value of `node`.
    fn get(&self, node: NodeId) -> Result<Value>;
}

fn tensor_of(v: Value, what: &str) -> Result<Tensor> {
    match v {
        Value::Tensor(t) => Ok(t),
        other => Err(Error::argument(what, format!("expected a tensor, got {other:?}"))),
    }
}

fn ints(items: &[Argument]) -> Value {
    Value::Ints(items.iter().filter_map(|x| if let Argument::Int(i) = x { Some(*i) } else { None }).collect())
}

fn floats(items: &[Argument]) -> Value {
    Value::Floats(
        items
            .iter()
            .filter_map(|x| match x {
                Argument::Int(i) => Some(*i as f64),
                Argument::Float(f) => Some(*f),
                _ => None,
            })
            .collect(),
    )
}

/// A graph argument as a runtime value, guided by the schema type when known.
pub(crate) fn to_value(a: &Argument, ty: Option<ArgType>, slots: &dyn Slots, what: &str) -> Result<Value> {
    Ok(match a {
        Argument::None => Value::None,
        Argument::Bool(b) => Value::Bool(*b),
        Argument::Int(i) => Value::Int(*i),
        Argument::Float(f) => Value::Float(*f),
        Argument::Str(s) => Value::Str(s.to_string()),
        Argument::DType(d) => Value::DType(*d),
        Argument::Node(n) => slots.get(*n)?,
        Argument::List(items) | Argument::Tuple(items) => {
            let all_int = items.iter().all(|x| matches!(x, Argument::Int(_)));
            let all_num = items.iter().all(|x| matches!(x, Argument::Int(_) | Argument::Float(_)));
            match ty {
                Some(ArgType::IntList | ArgType::OptIntList) if all_int => Value::Ints(
                    items.iter().filter_map(|x| if let Argument::Int(i) = x { Some(*i) } else { None }).collect(),
                ),
                Some(ArgType::FloatList) if all_num => Value::Floats(
                    items
                        .iter()
                        .filter_map(|x| match x {
                            Argument::Int(i) => Some(*i as f64),
                            Argument::Float(f) => Some(*f),
                            _ => None,
                        })
                        .collect(),
                ),
                Some(ArgType::TensorList) => Value::Tensors(
                    items.iter().map(|x| tensor_of(to_value(x, None, slots, what)?, what)).collect::<Result<_>>()?,
                ),
                _ if !items.is_empty() && all_int => ints(items),
                _ if !items.is_empty() && all_num => floats(items),
                _ if items.iter().all(|x| matches!(x, Argument::Node(_))) && !items.is_empty() => Value::Tensors(
                    items.iter().map(|x| tensor_of(to_value(x, None, slots, what)?, what)).collect::<Result<_>>()?,
                ),
                _ if items.is_empty() => Value::Ints(vec![]),
                _ => {
                    return Err(Error::argument(
                        what,
                        format!("cannot pass the mixed list {a:?} to an op: lists hold numbers or tensors"),
                    ))
                }
            }
        }
        other => return Err(Error::argument(what, format!("the argument {other:?} has no runtime value in ferrofx"))),
    })
}
