//! Engine behaviour beyond the seed: grad(), hooks, grad modes, in-place rules, higher order,
//! custom functions, anomaly mode, DOT export.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[x.clone()]` reads better in tests

mod autograd_common;
use autograd_common::*;
use ferrofx_core::autograd::{self, apply_function, Function, FunctionCtx};
use ferrofx_core::{Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn grad_returns_gradients_without_touching_dot_grad() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let y = sum(&mul(&x, &x));
    let g = autograd::grad(&[y.clone()], &[x.clone()], &[None], true, false, false).unwrap();
    assert_eq!(vals(g[0].as_ref().unwrap()), vec![2.0, 4.0]);
    assert!(x.grad().is_none());
    // grad w.r.t. an intermediate.
    let x2 = leaf32(&[3.0], &[]);
    let m = mul(&x2, &x2);
    let out = mul(&m, &t32(&[5.0], &[]));
    let g = autograd::grad(&[out], &[m.clone(), x2.clone()], &[None], false, false, false).unwrap();
    assert_eq!(vals(g[0].as_ref().unwrap()), vec![5.0]);
    assert_eq!(vals(g[1].as_ref().unwrap()), vec![30.0]);
}

#[test]
fn grad_unused_inputs() {
    let x = leaf32(&[1.0], &[]);
    let unused = leaf32(&[1.0], &[]);
    let y = mul(&x, &x);
    let err = autograd::grad(&[y.clone()], &[x.clone(), unused.clone()], &[None], true, false, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("The differentiated Tensor at index 1 appears to not have been used in the graph. Set allow_unused=True if this is the desired behavior."), "{err}");
    let g = autograd::grad(&[y], &[x, unused], &[None], false, false, true).unwrap();
    assert!(g[0].is_some() && g[1].is_none());
    let nr = t32(&[1.0], &[]);
    let y = mul(&leaf32(&[1.0], &[]), &nr);
    let err = autograd::grad(&[y], &[nr], &[None], false, false, true).unwrap_err().to_string();
    assert!(err.contains("does not require grad"), "{err}");
}

#[test]
fn higher_order_gradients_with_create_graph() {
    // y = x³: dy/dx = 3x², d²y/dx² = 6x, at x = 2.
    let x = leaf64(&[2.0], &[]);
    let y = mul(&mul(&x, &x), &x);
    let g = autograd::grad(&[y], &[x.clone()], &[None], false, true, false).unwrap().remove(0).unwrap();
    assert_eq!(vals(&g), vec![12.0]);
    assert!(g.requires_grad() && g.grad_fn().is_some());
    let g2 = autograd::grad(&[g], &[x.clone()], &[None], true, true, false).unwrap().remove(0).unwrap();
    assert_eq!(vals(&g2), vec![12.0]);
    let g3 = autograd::grad(&[g2], &[x.clone()], &[None], false, false, false).unwrap().remove(0).unwrap();
    assert_eq!(vals(&g3), vec![6.0]);
    // backward(create_graph) accumulates a differentiable .grad.
    let x = leaf64(&[3.0], &[]);
    let y = mul(&mul(&x, &x), &x);
    y.backward(None, false, true).unwrap();
    let gx = x.grad().unwrap();
    assert_eq!(vals(&gx), vec![27.0]);
    assert!(gx.requires_grad());
}

#[test]
fn hooks_can_replace_gradients_and_be_removed() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let h = x
        .register_hook(move |g| {
            s2.fetch_add(1, Ordering::SeqCst);
            Some(mul(g, &scalar_like(10.0, g)))
        })
        .unwrap();
    sum(&mul(&x, &t32(&[1.0, 1.0], &[2]))).backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![10.0, 10.0]);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert!(h.remove());
    assert!(!h.remove());
    x.zero_grad();
    sum(&mul(&x, &t32(&[1.0, 1.0], &[2]))).backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![1.0, 1.0]);

    // A hook on a non-leaf changes what flows further down.
    let x = leaf32(&[1.0], &[]);
    let y = mul(&x, &t32(&[3.0], &[]));
    y.register_hook(|g| Some(mul(g, &scalar_like(2.0, g)))).unwrap();
    y.retain_grad().unwrap();
    let z = mul(&y, &t32(&[5.0], &[]));
    z.backward(None, false, false).unwrap();
    assert_eq!(vals(&y.grad().unwrap()), vec![10.0]); // retain_grad runs after user hooks
    assert_eq!(vals(&x.grad().unwrap()), vec![30.0]);
    assert!(y.retains_grad());

    let err = t32(&[1.0], &[]).register_hook(|_| None).unwrap_err().to_string();
    assert!(err.contains("cannot register a hook on a tensor that doesn't require gradient"));
}

#[test]
fn non_leaf_grad_is_none_without_retain_grad() {
    let x = leaf32(&[1.0], &[]);
    let y = mul(&x, &x);
    let z = mul(&y, &y);
    z.backward(None, false, false).unwrap();
    assert!(y.grad().is_none());
    assert_eq!(vals(&x.grad().unwrap()), vec![4.0]);
}

#[test]
fn grad_modes() {
    let x = leaf32(&[1.0], &[]);
    {
        let _g = autograd::no_grad();
        let y = mul(&x, &x);
        assert!(!y.requires_grad() && y.grad_fn().is_none());
        {
            let _e = autograd::enable_grad();
            assert!(mul(&x, &x).requires_grad());
        }
        assert!(!autograd::is_grad_enabled());
    }
    {
        let _g = autograd::set_grad_enabled(false);
        assert!(!mul(&x, &x).requires_grad());
    }
    assert!(mul(&x, &x).requires_grad());
    // Threads have their own mode.
    let _g = autograd::no_grad();
    let x2 = x.clone();
    let r = std::thread::spawn(move || mul(&x2, &x2).requires_grad()).join().unwrap();
    assert!(r);
}

#[test]
fn requires_grad_rules() {
    let i = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let err = i.requires_grad_(true).unwrap_err().to_string();
    assert!(err.contains("only Tensors of floating point dtype can require gradients"), "{err}");
    let x = leaf32(&[1.0], &[]);
    let y = mul(&x, &x);
    let err = y.requires_grad_(false).unwrap_err().to_string();
    assert!(err.contains("you can only change requires_grad flags of leaf variables."), "{err}");
    assert!(y.requires_grad_(true).is_ok());
    let z = x.requires_grad_(false).unwrap();
    assert!(!z.requires_grad());
    assert_eq!(y.output_nr(), 0);
    // detach_ turns a non-leaf into a leaf.
    let y = mul(&leaf32(&[1.0], &[]), &t32(&[2.0], &[]));
    y.detach_().unwrap();
    assert!(y.is_leaf() && !y.requires_grad());
    // set_grad checks the shape.
    let x = leaf32(&[1.0, 2.0], &[2]);
    assert!(x
        .set_grad(Some(t32(&[1.0], &[1])))
        .unwrap_err()
        .to_string()
        .contains("attempting to assign a gradient of size '[1]' to a tensor of size '[2]'"));
    x.set_grad(Some(t32(&[1.0, 1.0], &[2]))).unwrap();
    sum(&mul(&x, &t32(&[2.0, 3.0], &[2]))).backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0, 4.0]);
}

#[test]
fn in_place_rules() {
    // On a leaf that requires grad: PyTorch's error.
    let x = leaf32(&[1.0, 2.0], &[2]);
    let err = add_(&x, &t32(&[1.0, 1.0], &[2])).unwrap_err().to_string();
    assert!(err.contains("a leaf Variable that requires grad is being used in an in-place operation."), "{err}");
    // Under no_grad it is allowed (optimizer steps).
    {
        let _g = autograd::no_grad();
        add_(&x, &t32(&[1.0, 1.0], &[2])).unwrap();
    }
    assert_eq!(vals(&x), vec![2.0, 3.0]);
    // On a non-leaf: history is rebased onto the in-place node.
    let y = mul(&x, &t32(&[3.0, 3.0], &[2]));
    let w = leaf32(&[1.0, 1.0], &[2]);
    let r = add_(&y, &w).unwrap();
    assert!(r.same(&y));
    let gf = y.grad_fn().unwrap();
    assert_eq!(gf.name(), "AddBackward0");
    assert_eq!(gf.next_functions()[0].0.as_ref().unwrap().name(), "MulBackward0");
    sum(&y).backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0, 3.0]);
    assert_eq!(vals(&w.grad().unwrap()), vec![1.0, 1.0]);
    // On a differentiable view: the base is rebased (PyTorch: base.grad_fn is CopySlices, the
    // view's AsStridedBackward0; gradients are those of autograd_golden's `cs_*` cases).
    let l = leaf32(&[1.0, 2.0], &[2]);
    let base = mul(&l, &t32(&[1.0, 1.0], &[2]));
    let v = base.view(&[2, 1]).unwrap().view(&[2]).unwrap();
    add_(&v, &t32(&[1.0, 1.0], &[2])).unwrap();
    assert_eq!(base.grad_fn().unwrap().name(), "CopySlices");
    assert_eq!(v.grad_fn().unwrap().name(), "AsStridedBackward0");
}

struct Cube;
impl Function for Cube {
    fn forward(&mut self, ctx: &mut FunctionCtx, x: &[Tensor]) -> Result<Vec<Tensor>> {
        ctx.save_for_backward(&[&x[0]]);
        let x0 = &x[0];
        Ok(vec![mul(&mul(x0, x0), x0)])
    }
    fn backward(&self, ctx: &FunctionCtx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let x = &ctx.saved_tensors()[0];
        let g = g[0].as_ref().unwrap();
        Ok(vec![Some(mul(&mul(g, &scalar_like(3.0, x)), &mul(x, x)))])
    }
}

#[test]
fn custom_functions_are_first_class_nodes() {
    let x = leaf64(&[2.0], &[]);
    let y = apply_function(Cube, &[x.clone()]).unwrap().remove(0);
    let gf = y.grad_fn().unwrap();
    assert_eq!(gf.name(), "CubeBackward");
    assert_eq!(gf.next_functions()[0].0.as_ref().unwrap().name(), "AccumulateGrad");
    // Second order through a custom backward written with differentiable ops.
    let g = autograd::grad(&[y.clone()], &[x.clone()], &[None], true, true, false).unwrap().remove(0).unwrap();
    assert_eq!(vals(&g), vec![12.0]);
    let g2 = autograd::grad(&[g], &[x.clone()], &[None], false, false, false).unwrap().remove(0).unwrap();
    assert_eq!(vals(&g2), vec![12.0]);
    y.backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![12.0]);
    let err = y.backward(None, false, false).unwrap_err().to_string();
    assert!(err.contains("Trying to backward through the graph a second time"), "{err}");
    // gradcheck on the custom function.
    autograd::gradcheck(|xs| apply_function(Cube, xs), &[leaf64(&[0.5, -1.5], &[2])], Default::default()).unwrap();
    // Without grad-requiring inputs: no node.
    let y = apply_function(Cube, &[t64(&[2.0], &[])]).unwrap().remove(0);
    assert!(y.grad_fn().is_none());
}

struct BadGrads;
impl Function for BadGrads {
    fn forward(&mut self, _ctx: &mut FunctionCtx, x: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![mul(&x[0], &x[0])])
    }
    fn backward(&self, _ctx: &FunctionCtx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().unwrap();
        // A trailing None would be accepted (PyTorch); a second gradient is not.
        Ok(vec![Some(mul(g, &scalar_like(f64::NAN, g))), Some(g.clone())])
    }
}

struct NanGrad;
impl Function for NanGrad {
    fn forward(&mut self, _ctx: &mut FunctionCtx, x: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![mul(&x[0], &x[0])])
    }
    fn backward(&self, _ctx: &FunctionCtx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().unwrap();
        Ok(vec![Some(mul(g, &scalar_like(f64::NAN, g)))])
    }
}

#[test]
fn wrong_gradient_count_is_reported() {
    let x = leaf32(&[1.0], &[]);
    let y = apply_function(BadGrads, &[x]).unwrap().remove(0);
    let err = y.backward(None, false, false).unwrap_err().to_string();
    assert!(
        err.contains("function BadGradsBackward returned an incorrect number of gradients (expected 1, got 2)"),
        "{err}"
    );
}

#[test]
fn anomaly_mode_reports_nan_with_node_and_location() {
    let x = leaf32(&[1.0], &[]);
    // Without anomaly mode the NaN goes through.
    let y = apply_function(NanGrad, &[x.clone()]).unwrap().remove(0);
    y.backward(None, false, false).unwrap();
    assert!(vals(&x.grad().unwrap())[0].is_nan());
    let y = {
        let _a = autograd::detect_anomaly();
        let y = apply_function(NanGrad, &[x.clone()]).unwrap().remove(0);
        let info = y.grad_fn().unwrap().creation_info().cloned().unwrap();
        assert!(info.location.contains("autograd_engine"), "{}", info.location);
        let err = y.backward(None, true, false).unwrap_err().to_string();
        // PyTorch 2.15: RuntimeError: Function 'MulBackward0' returned nan values in its 0th
        // output. (+ warning: Error detected in MulBackward0. Traceback of forward call that
        // caused the error: ...), here one error message.
        assert!(err.contains("Function 'NanGradBackward' returned nan values in its 0th output.\nError detected in NanGradBackward. Traceback of forward call that caused the error:"), "{err}");
        assert!(err.contains("autograd_engine"), "{err}");
        y
    };
    assert!(!autograd::is_anomaly_enabled());
    drop(y);
}

#[test]
fn dot_export_lists_nodes_and_edges() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let w = leaf32(&[3.0, 4.0], &[2]);
    let loss = sum(&add(&mul(&x, &w), &t32(&[1.0, 1.0], &[2])));
    let dot = autograd::to_dot(&[&loss]);
    for n in ["SumBackward0", "AddBackward0", "MulBackward0", "AccumulateGrad\\n(2)", "output 0\\n()"] {
        assert!(dot.contains(n), "{n} missing in\n{dot}");
    }
    assert_eq!(dot.matches(" -> ").count(), 5, "{dot}");
    assert!(dot.trim_end().ends_with('}'));
}

#[test]
fn single_root_runs_without_a_graph_root() {
    // One root edge: its node is the root of the pass (PyTorch's skip_dummy_node). Hooks and
    // retain_grad on the root still see the initial gradient, which is converted to the
    // root's dtype like any gradient.
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &t32(&[3.0], &[]));
    y.register_hook(|g| Some(mul(g, &scalar_like(2.0, g)))).unwrap();
    y.retain_grad().unwrap();
    y.backward(Some(&t64(&[0.5], &[])), false, false).unwrap();
    assert_eq!(vals(&y.grad().unwrap()), vec![1.0]);
    assert_eq!(x.grad().unwrap().dtype(), ferrofx_core::DType::F32);
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0]);
    // A leaf as root accumulates into its own .grad.
    let l = leaf32(&[1.0, 2.0], &[2]);
    l.backward(Some(&t32(&[1.0, 1.0], &[2])), false, false).unwrap();
    l.backward(Some(&t32(&[1.0, 1.0], &[2])), false, false).unwrap();
    assert_eq!(vals(&l.grad().unwrap()), vec![2.0, 2.0]);
    // grad() with respect to the root itself, and through it.
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &x);
    let g = autograd::grad(&[y.clone()], &[y.clone()], &[None], true, false, false).unwrap();
    assert_eq!(vals(g[0].as_ref().unwrap()), vec![1.0]);
    let g = autograd::grad(&[y.clone()], &[x.clone()], &[None], false, false, false).unwrap();
    assert_eq!(vals(g[0].as_ref().unwrap()), vec![4.0]);
    assert!(x.grad().is_none());
    // Several roots still go through a GraphRoot.
    let x = leaf32(&[1.0], &[]);
    let (a, b) = (mul(&x, &t32(&[2.0], &[])), mul(&x, &t32(&[5.0], &[])));
    autograd::backward(&[a, b], &[None, None], false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![7.0]);
}
