//! Shared helpers of the autograd tests: calls ops by registry name, and — when a family has
//! not landed yet — registers minimal stand-ins (`mul`, `add`, `sum`, `add_`) with backward
//! formulas, so the engine tests run with PyTorch's node names either way.
#![allow(dead_code)]

use ferrofx_core::autograd::BackwardCtx;
use ferrofx_core::op::{self, ArgSpec, ArgType, Category, Default as D, Effect, OpDef, Saves};
use ferrofx_core::ops::kernel;
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use std::sync::OnceLock;

pub fn call1(name: &str, args: Vec<Value>) -> Result<Tensor> {
    let mut o = op::call(name, args, vec![])?;
    o.pop().ok_or_else(|| Error::schema(name, "no output"))
}

pub fn t32(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}
pub fn t64(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}
pub fn leaf32(v: &[f32], shape: &[usize]) -> Tensor {
    t32(v, shape).requires_grad_(true).unwrap()
}
pub fn leaf64(v: &[f64], shape: &[usize]) -> Tensor {
    t64(v, shape).requires_grad_(true).unwrap()
}
pub fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

pub fn mul(a: &Tensor, b: &Tensor) -> Tensor {
    // Hot in the 1M-op tests: dispatch directly when the schema is (self, other).
    static DEF: OnceLock<&'static OpDef> = OnceLock::new();
    let def = *DEF.get_or_init(|| {
        ensure_ops();
        op::require("mul").unwrap()
    });
    if def.schema.len() == 2 {
        let mut o = op::dispatch(def, op::CallKind::Function, &[a.into(), b.into()]).unwrap();
        return o.pop().unwrap();
    }
    call1("mul", vec![a.into(), b.into()]).unwrap()
}
pub fn add(a: &Tensor, b: &Tensor) -> Tensor {
    ensure_ops();
    call1("add", vec![a.into(), b.into()]).unwrap()
}
pub fn sum(a: &Tensor) -> Tensor {
    ensure_ops();
    call1("sum", vec![a.into()]).unwrap()
}
pub fn add_(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    ensure_ops();
    call1("add_", vec![a.into(), b.into()])
}
pub fn scalar_like(v: f64, like: &Tensor) -> Tensor {
    kernel::from_f64_vec(&vec![v; like.numel()], like.shape(), like.dtype()).unwrap()
}

fn same_shape(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return Err(Error::shape(
            op,
            format!("test stand-in needs equal shapes/dtypes: {:?} vs {:?}", a.shape(), b.shape()),
        ));
    }
    Ok(())
}

fn bin(op: &str, a: &Tensor, b: &Tensor, f: fn(f64, f64) -> f64) -> Result<Tensor> {
    same_shape(op, a, b)?;
    match a.dtype() {
        DType::F32 => kernel::binary_map::<f32, f32>(op, a, b, move |x, y| f(x as f64, y as f64) as f32),
        DType::F64 => kernel::binary_map::<f64, f64>(op, a, b, f),
        d => Err(Error::dtype(op, format!("test stand-in supports f32/f64, got {d}"))),
    }
}

fn tensor_arg(args: &[Value], i: usize) -> Result<&Tensor> {
    op::args::tensor("stand-in", args, i)
}

fn meta_same(args: &[Value]) -> Result<op::MetaOutputs> {
    let a = tensor_arg(args, 0)?;
    Ok(smallvec::smallvec![ferrofx_core::TensorMeta::contiguous(a.shape(), a.dtype())])
}

static MUL_T: OpDef = OpDef {
    name: "mul",
    schema: &[ArgSpec::req("input", ArgType::Tensor), ArgSpec::req("other", ArgType::TensorOrScalar)],
    meta: meta_same,
    kernel: |a| Ok(smallvec::smallvec![bin("mul", tensor_arg(a, 0)?, tensor_arg(a, 1)?, |x, y| x * y)?]),
    cost: op::cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: Some(|ctx: &BackwardCtx<'_>| {
        let g = ctx.grad(0).unwrap();
        let (a, b) = (ctx.input(0)?, ctx.input(1)?);
        Ok(vec![
            if ctx.needs_grad(0) { Some(mul(g, b)) } else { None },
            if ctx.needs_grad(1) { Some(mul(g, a)) } else { None },
        ])
    }),
    saves: Saves::inputs(0b11),
    doc: "test stand-in",
};

static ADD_T: OpDef = OpDef {
    name: "add",
    schema: &[
        ArgSpec::req("input", ArgType::Tensor),
        ArgSpec::req("other", ArgType::TensorOrScalar),
        ArgSpec::kw("alpha", ArgType::Scalar, D::Int(1)),
    ],
    meta: meta_same,
    kernel: |a| Ok(smallvec::smallvec![bin("add", tensor_arg(a, 0)?, tensor_arg(a, 1)?, |x, y| x + y)?]),
    cost: op::cost_elementwise,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: Some(|ctx: &BackwardCtx<'_>| {
        let g = ctx.grad(0).unwrap();
        Ok(vec![Some(g.clone()), Some(g.clone())])
    }),
    saves: Saves::NOTHING,
    doc: "test stand-in",
};

static ADD_INPLACE_T: OpDef = OpDef {
    name: "add_",
    schema: &[
        ArgSpec::req("input", ArgType::Tensor),
        ArgSpec::req("other", ArgType::TensorOrScalar),
        ArgSpec::kw("alpha", ArgType::Scalar, D::Int(1)),
    ],
    meta: meta_same,
    kernel: |a| {
        let s = tensor_arg(a, 0)?;
        let r = bin("add_", s, tensor_arg(a, 1)?, |x, y| x + y)?;
        kernel::copy_into("add_", s, &r)?;
        Ok(smallvec::smallvec![s.clone()])
    },
    cost: op::cost_elementwise,
    effect: Effect::Mutates(0),
    category: Category::Elementwise,
    backward: Some(|ctx: &BackwardCtx<'_>| {
        let g = ctx.grad(0).unwrap();
        Ok(vec![Some(g.clone()), Some(g.clone())])
    }),
    saves: Saves::NOTHING,
    doc: "test stand-in",
};

static SUM_T: OpDef = OpDef {
    name: "sum",
    schema: &[ArgSpec::req("input", ArgType::Tensor), ArgSpec::opt("dim", ArgType::OptIntList, D::None)],
    meta: |a| {
        let t = tensor_arg(a, 0)?;
        Ok(smallvec::smallvec![ferrofx_core::TensorMeta::contiguous(&[], t.dtype())])
    },
    kernel: |a| {
        let t = tensor_arg(a, 0)?;
        let s: f64 = t.to_vec_f64()?.iter().sum();
        Ok(smallvec::smallvec![kernel::from_f64_vec(&[s], &[], t.dtype())?])
    },
    cost: op::cost_elementwise,
    effect: Effect::Pure,
    category: Category::Reduction,
    backward: Some(|ctx: &BackwardCtx<'_>| {
        let g = ctx.grad(0).unwrap();
        let shape: Vec<i64> = ctx.input_meta(0)?.shape.iter().map(|&d| d as i64).collect();
        Ok(vec![Some(g.expand(&shape)?)])
    }),
    saves: Saves::NOTHING,
    doc: "test stand-in",
};

/// Registers the stand-ins whose real op has not landed.
pub fn ensure_ops() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        for d in [&MUL_T, &ADD_T, &ADD_INPLACE_T, &SUM_T] {
            if op::lookup(d.name).is_none() {
                let copy = OpDef { ..*d };
                let _ = op::register(copy);
            }
        }
    });
}
