//! Backward formulas of the view family: node names as in PyTorch, gradcheck (f64 finite
//! differences) for every op, second order for the ops whose backward is another op.

mod autograd_common;
use autograd_common::*;
use ferrofx_core::autograd::{self, gradcheck, gradgradcheck, GradcheckOptions};
use ferrofx_core::{DType, Result, Tensor};

fn x23() -> Tensor {
    leaf64(&[0.1, -0.2, 0.3, 0.4, -0.5, 0.6], &[2, 3])
}

type F = fn(&Tensor) -> Result<Tensor>;

fn cases() -> Vec<(&'static str, &'static str, F)> {
    vec![
        ("view", "ViewBackward0", |x| x.view(&[3, 2])),
        ("reshape", "ViewBackward0", |x| x.reshape(&[6])),
        ("reshape (copy)", "ViewBackward0", |x| x.t()?.reshape(&[6])),
        ("flatten", "ViewBackward0", |x| x.flatten(0, -1)),
        ("transpose", "TransposeBackward0", |x| x.transpose(0, 1)),
        ("t", "TBackward0", |x| x.t()),
        ("permute", "PermuteBackward0", |x| x.unsqueeze(0)?.permute(&[2, 0, 1])),
        ("narrow", "SliceBackward0", |x| x.narrow(1, -2, 2)),
        ("select", "SelectBackward0", |x| x.select(1, -1)),
        ("slice", "SliceBackward0", |x| x.slice(1, Some(0), None, 2)),
        ("squeeze", "SqueezeBackward0", |x| x.unsqueeze(1)?.squeeze()),
        ("squeeze(dim)", "SqueezeBackward1", |x| x.unsqueeze(1)?.squeeze_dim(1)),
        ("unsqueeze", "UnsqueezeBackward0", |x| x.unsqueeze(-1)),
        ("contiguous", "CloneBackward0", |x| x.t()?.contiguous()),
        ("to", "ToCopyBackward0", |x| x.to_dtype(DType::F32)?.to_dtype(DType::F64)),
    ]
}

#[test]
fn view_nodes_have_pytorch_names() {
    for (what, name, f) in cases() {
        let y = f(&x23()).unwrap();
        assert_eq!(y.grad_fn().unwrap().name(), name, "{what}");
    }
}

#[test]
fn view_formulas_pass_gradcheck() {
    for (what, _, f) in cases() {
        // The f32 round trip of `to` needs a larger step for finite differences.
        let eps = if what == "to" { 1e-3 } else { 1e-6 };
        let r = gradcheck(|xs| Ok(vec![f(&xs[0])?]), &[x23()], GradcheckOptions { eps, ..Default::default() });
        assert!(r.is_ok(), "{what}: {r:?}");
    }
}

#[test]
fn slicing_backward_ops_have_second_order() {
    let o = GradcheckOptions::default();
    gradgradcheck(|xs| Ok(vec![mul(&xs[0].narrow(1, 1, 2)?, &xs[0].narrow(1, 0, 2)?)]), &[x23()], o).unwrap();
    gradgradcheck(|xs| Ok(vec![mul(&xs[0].select(0, 1)?, &xs[0].select(0, 0)?)]), &[x23()], o).unwrap();
    let y = x23().slice(1, Some(1), None, 1).unwrap();
    let g = autograd::grad(std::slice::from_ref(&y), &[], &[Some(t64(&[1.0; 4], &[2, 2]))], false, false, true);
    assert!(g.is_ok());
}

#[test]
fn to_backward_converts_dtype_and_noop_to_keeps_tensor() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let y = x.to_dtype(DType::F64).unwrap();
    y.backward(Some(&t64(&[1.0, 2.0], &[2])), false, false).unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), DType::F32);
    assert_eq!(vals(&g), vec![1.0, 2.0]);
    // Same dtype / already contiguous: PyTorch returns self, no new node.
    assert!(x.to_dtype(DType::F32).unwrap().same(&x));
    assert!(x.contiguous().unwrap().same(&x));
}

#[test]
fn views_of_non_contiguous_gradients_and_accumulation() {
    // The same leaf through several views: gradients sum in the input buffer.
    let x = x23();
    let a = x.t().unwrap().contiguous().unwrap().view(&[6]).unwrap();
    let b = x.flatten(0, -1).unwrap();
    let out = sum(&add(&mul(&a, &t64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[6])), &b));
    out.backward(None, false, false).unwrap();
    // a[k] = x.t().flat[k]: x[i][j] appears at position j*2+i with weight (j*2+i)+1.
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 4.0, 6.0, 3.0, 5.0, 7.0]);
}

#[test]
fn expand_backward_uses_sum_to_size() {
    let x = leaf64(&[1.0, 2.0], &[2, 1]);
    let y = x.expand(&[2, 3]).unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "ExpandBackward0");
    let r = y.backward(Some(&t64(&[1.0; 6], &[2, 3])), false, false);
    if ferrofx_core::op::lookup("sum_to_size").is_some() {
        r.unwrap();
        assert_eq!(vals(&x.grad().unwrap()), vec![3.0, 3.0]);
        gradcheck(|xs| Ok(vec![xs[0].expand(&[2, 2, 3])?]), &[leaf64(&[1.0, 2.0], &[2, 1])], Default::default())
            .unwrap();
    } else {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("sum_to_size"), "{e}");
    }
}

#[test]
fn slice_backward_errors_name_the_op() {
    let g = t64(&[1.0, 2.0], &[2]);
    let e = ferrofx_core::op::call(
        "slice_backward",
        vec![
            g.into(),
            ferrofx_core::Value::Ints(vec![3, -1]),
            0i64.into(),
            ferrofx_core::Value::None,
            ferrofx_core::Value::None,
            1i64.into(),
        ],
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("slice_backward:"), "{e}");
    assert!(e.contains("non-negative"), "{e}");
}

#[test]
fn sum_formulas_pass_gradcheck() {
    use ferrofx_core::ops::reduce::sum;
    let o = GradcheckOptions::default();
    gradcheck(|xs| Ok(vec![sum(&xs[0], None, false, None)?]), &[x23()], o).unwrap();
    gradcheck(|xs| Ok(vec![sum(&xs[0], Some(&[1]), false, None)?]), &[x23()], o).unwrap();
    gradcheck(|xs| Ok(vec![sum(&xs[0], Some(&[0, -1]), true, None)?]), &[x23()], o).unwrap();
    gradcheck(|xs| Ok(vec![xs[0].sum_to_size(&[1, 3])?]), &[x23()], o).unwrap();
    let y = sum(&x23(), Some(&[1]), false, None).unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "SumBackward1");
    assert_eq!(x23().sum().unwrap().grad_fn().unwrap().name(), "SumBackward0");
}
