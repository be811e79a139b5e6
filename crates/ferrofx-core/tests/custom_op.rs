//! The walk-through of `docs/adding-an-op.md`, as a test: a user op defined once becomes
//! callable by name, differentiable (first and second order) and reports its cost.

use ferrofx_core::autograd::{self, BackwardCtx};
use ferrofx_core::op::{
    self, ArgSpec, ArgType, Category, Cost, Default as D, Effect, MetaOutputs, OpDef, Outputs, Saves,
};
use ferrofx_core::ops::kernel::from_f64_vec;
use ferrofx_core::{Error, Result, Tensor, TensorMeta, Value};
use std::sync::OnceLock;

/// `softclip(input, limit=1.0) = limit * tanh(input / limit)`.
fn softclip_meta(a: &[Value]) -> Result<MetaOutputs> {
    let x = op::args::tensor("softclip", a, 0)?;
    if !x.dtype().is_floating_point() {
        return Err(Error::dtype("softclip", format!("expected a floating point input, got {}", x.dtype())));
    }
    let limit = op::args::float("softclip", a, 1)?;
    if limit.is_nan() || limit <= 0.0 {
        return Err(Error::argument("softclip", format!("limit must be positive, got {limit}")));
    }
    Ok(smallvec::smallvec![TensorMeta::contiguous(x.shape(), x.dtype())])
}

fn softclip_kernel(a: &[Value]) -> Result<Outputs> {
    let meta = softclip_meta(a)?; // same checks in eager and meta mode
    let x = op::args::tensor("softclip", a, 0)?;
    let limit = op::args::float("softclip", a, 1)?;
    let v: Vec<f64> = x.to_vec_f64()?.iter().map(|&v| limit * (v / limit).tanh()).collect();
    Ok(smallvec::smallvec![from_f64_vec(&v, &meta[0].shape, meta[0].dtype)?])
}

fn softclip_cost(_: &[Value], outs: &[TensorMeta]) -> Cost {
    let n = outs.iter().map(|o| o.numel() as u64).sum::<u64>();
    Cost { flops: 4 * n, bytes: 2 * outs.iter().map(|o| o.nbytes() as u64).sum::<u64>() }
}

/// d/dx = 1 - tanh(x/limit)^2, written with differentiable ops so double backward works.
fn softclip_backward(ctx: &BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>> {
    let Some(g) = ctx.grad(0) else { return Ok(vec![None, None]) };
    let x = ctx.input(0)?;
    let limit = op::args::float("softclip", ctx.args(), 1)?;
    let t = x.div(limit)?.tanh()?;
    let d = t.mul(&t)?.neg()?.add(1.0)?;
    Ok(vec![Some(g.mul(&d)?), None])
}

const SOFTCLIP_SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("input", ArgType::Tensor), ArgSpec::opt("limit", ArgType::Float, D::Float(1.0))];

fn softclip() -> &'static OpDef {
    static OP: OnceLock<&'static OpDef> = OnceLock::new();
    OP.get_or_init(|| {
        op::register(OpDef {
            name: "softclip",
            schema: SOFTCLIP_SCHEMA,
            meta: softclip_meta,
            kernel: softclip_kernel,
            cost: softclip_cost,
            effect: Effect::Pure,
            category: Category::Elementwise,
            backward: Some(softclip_backward),
            saves: Saves::inputs(0b1),
            doc: "limit * tanh(input / limit): a smooth clip to (-limit, limit)",
        })
        .expect("softclip registers once")
    })
}

fn call(x: &Tensor, limit: f64) -> Result<Tensor> {
    softclip();
    Ok(op::call("softclip", vec![x.into()], vec![("limit".into(), Value::Float(limit))])?.remove(0))
}

#[test]
fn custom_op_is_callable_by_name_with_defaults() {
    softclip();
    let x = Tensor::from_vec(vec![0.0f32, 1.0, -10.0], &[3]).unwrap();
    let y = op::call("softclip", vec![(&x).into()], vec![]).unwrap().remove(0);
    let want: Vec<f32> = [0.0f32, 1.0, -10.0].iter().map(|v| v.tanh()).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    assert_eq!(op::lookup("softclip").unwrap().schema_string(), softclip().schema_string());
    assert!(op::all_ops().iter().any(|o| o.name == "softclip"));
    assert_eq!(call(&x, 2.0).unwrap().to_vec::<f32>().unwrap()[1], 2.0 * 0.5f32.tanh());
}

#[test]
fn custom_op_is_differentiable_to_second_order() {
    let x = Tensor::from_vec(vec![0.3f64, -1.2, 2.5], &[3]).unwrap().requires_grad_(true).unwrap();
    autograd::gradcheck(|xs| Ok(vec![call(&xs[0], 1.5)?]), std::slice::from_ref(&x), Default::default()).unwrap();
    let y = call(&x, 1.5).unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "SoftclipBackward0");
    let g = autograd::grad(&[y.sum().unwrap()], std::slice::from_ref(&x), &[None], true, true, false)
        .unwrap()
        .remove(0)
        .unwrap();
    let h = autograd::grad(&[g.sum().unwrap()], std::slice::from_ref(&x), &[None], false, false, false)
        .unwrap()
        .remove(0)
        .unwrap();
    // d2/dx2 limit*tanh(x/limit) = -2/limit * tanh * (1 - tanh^2)
    let want: Vec<f64> = [0.3f64, -1.2, 2.5]
        .iter()
        .map(|&v| {
            let t = (v / 1.5).tanh();
            -2.0 / 1.5 * t * (1.0 - t * t)
        })
        .collect();
    for (a, b) in h.to_vec::<f64>().unwrap().iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn custom_op_errors_and_cost() {
    let i = Tensor::from_vec(vec![1i64], &[1]).unwrap();
    let e = call(&i, 1.0).unwrap_err().to_string();
    assert!(e.contains("softclip") && e.contains("expected a floating point input"), "{e}");
    let x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
    let e = call(&x, -1.0).unwrap_err().to_string();
    assert!(e.contains("limit must be positive, got -1"), "{e}");
    let metas = (softclip().meta)(&[(&x).into(), Value::Float(1.0)]).unwrap();
    assert_eq!((softclip().cost)(&[], &metas), Cost { flops: 4, bytes: 8 });
    // a second registration under the same name is refused
    let dup = OpDef { ..*softclip() };
    assert!(op::register(dup).is_err());
}
