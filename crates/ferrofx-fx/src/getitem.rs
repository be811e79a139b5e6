//! `getitem(values, index)`: picks one tensor of a node that returns several (`topk`, `split`,
//! a leaf module returning a tuple), as FX's `operator.getitem` nodes do. Registered in the op
//! registry so graphs holding it can be saved and loaded by name.

use ferrofx_core::op::{self, ArgSpec, ArgType, Category, Cost, Effect, MetaOutputs, OpDef, Outputs, Saves};
use ferrofx_core::{Error, Result, TensorMeta, Value};
use std::sync::OnceLock;

fn pick(a: &[Value]) -> Result<usize> {
    let n = match a.first() {
        Some(Value::Tensors(ts)) => ts.len(),
        other => return Err(Error::argument("getitem", format!("expected a list of tensors, got {other:?}"))),
    };
    match a.get(1) {
        Some(Value::Int(i)) if (0..n as i64).contains(i) => Ok(*i as usize),
        Some(Value::Int(i)) if (-(n as i64)..0).contains(i) => Ok((n as i64 + i) as usize),
        other => Err(Error::index("getitem", format!("index {other:?} is out of range for {n} values"))),
    }
}

fn meta(a: &[Value]) -> Result<MetaOutputs> {
    let i = pick(a)?;
    match &a[0] {
        Value::Tensors(ts) => {
            let t = &ts[i];
            Ok(smallvec::smallvec![t.meta().unwrap_or_else(|| TensorMeta::contiguous(t.shape(), t.dtype()))])
        }
        _ => Err(Error::argument("getitem", "expected a list of tensors")),
    }
}

fn kernel(a: &[Value]) -> Result<Outputs> {
    let i = pick(a)?;
    match &a[0] {
        Value::Tensors(ts) => Ok(smallvec::smallvec![ts[i].clone()]),
        _ => Err(Error::argument("getitem", "expected a list of tensors")),
    }
}

const SCHEMA: &[ArgSpec] = &[ArgSpec::req("input", ArgType::TensorList), ArgSpec::req("index", ArgType::Int)];

static GETITEM: OpDef = OpDef {
    name: "getitem",
    schema: SCHEMA,
    meta,
    kernel,
    cost: |_, _| Cost::default(),
    effect: Effect::Pure,
    category: Category::Other,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Picks one value of a node that returns several (FX's operator.getitem).",
};

/// The registered `getitem` op (registered on first use; a `getitem` registered by someone
/// else first is used as is).
pub fn op() -> &'static OpDef {
    static OP: OnceLock<&'static OpDef> = OnceLock::new();
    OP.get_or_init(|| op::lookup("getitem").or_else(|| op::register(OpDef { ..GETITEM }).ok()).unwrap_or(&GETITEM))
}
