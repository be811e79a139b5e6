//! Reductions, indexing, joining, creation and random ops: hand-checked values, non-contiguous
//! inputs, reproducible random streams, and the error text of bad input for every family.
#![allow(clippy::excessive_precision, clippy::approx_constant)] // reference values copied from PyTorch

use ferrofx_core::ops::{creation, index, join, random, reduce, shape_misc, softmax, sort};
use ferrofx_core::{op, DType, Tensor, Value};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}
fn ti(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}
fn f(x: &Tensor) -> Vec<f32> {
    x.to_vec::<f32>().unwrap()
}
fn err(r: ferrofx_core::Result<impl std::fmt::Debug>) -> String {
    r.unwrap_err().to_string()
}
fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "{a:?} vs {b:?}");
    }
}

// ------------------------------------------------------------------------------------------
// reductions
// ------------------------------------------------------------------------------------------

#[test]
fn sums_means_and_dtypes() {
    let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    assert_eq!(f(&x.sum().unwrap()), vec![21.]);
    assert_eq!(f(&x.sum_dim(&[0], false).unwrap()), vec![5., 7., 9.]);
    let k = x.sum_dim(&[-1], true).unwrap();
    assert_eq!(k.shape(), &[2, 1]);
    assert_eq!(f(&k), vec![6., 15.]);
    assert_eq!(f(&x.mean_dim(&[1], false).unwrap()), vec![2., 5.]);
    // transposed input
    let tt = x.t().unwrap();
    assert_eq!(f(&tt.sum_dim(&[1], false).unwrap()), vec![5., 7., 9.]);
    // ints sum to int64
    let xi = Tensor::from_vec(vec![1i32, 2, 3], &[3]).unwrap();
    let s = xi.sum().unwrap();
    assert_eq!(s.dtype(), DType::I64);
    assert_eq!(s.to_vec::<i64>().unwrap(), vec![6]);
    // f32 accuracy on a long sum: 1e6 copies of 0.1 (naive f32 accumulation drifts by ~1%)
    let big = creation::full(&[1_000_000], 0.1f64, None).unwrap();
    let s = big.sum().unwrap().item().unwrap();
    assert!((s - 100000.0).abs() < 0.05, "{s}");
    // reduction over leading dims of a large tensor (column accumulator path)
    let y = creation::ones(&[4000, 33], None).unwrap();
    assert!(f(&y.sum_dim(&[0], false).unwrap()).iter().all(|&v| v == 4000.0));
    assert!(f(&y.mean_dim(&[1], false).unwrap()).iter().all(|&v| v == 1.0));
    // sum_to_size
    let g = creation::ones(&[2, 3, 4], None).unwrap();
    let r = g.sum_to_size(&[3, 1]).unwrap();
    assert_eq!(r.shape(), &[3, 1]);
    assert_eq!(f(&r), vec![8., 8., 8.]);
}

#[test]
fn max_min_arg_and_nan() {
    let x = t(&[1., 5., 5., -2., f32::NAN, 0.], &[2, 3]);
    let (v, i) = x.max_dim(1, false).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap()[0], 5.);
    assert!(v.to_vec::<f32>().unwrap()[1].is_nan());
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 1]); // first of the tie; NaN wins
    assert!(x.max().unwrap().item().unwrap().is_nan());
    let y = t(&[3., 1., 2., 1.], &[4]);
    assert_eq!(y.argmin(None, false).unwrap().to_vec::<i64>().unwrap(), vec![1]);
    assert_eq!(y.argmax(Some(0), true).unwrap().shape(), &[1]);
    assert_eq!(f(&y.min().unwrap()), vec![1.]);
    let m = t(&[1., 2., 3., 4.], &[2, 2]);
    assert_eq!(f(&m.amax(&[0], false).unwrap()), vec![3., 4.]);
    assert_eq!(m.argmax(None, true).unwrap().shape(), &[1, 1]);
}

#[test]
fn var_std_norm_logsumexp_all_any() {
    let x = t(&[1., 2., 3., 4.], &[4]);
    close(&f(&x.var(None, 1.0, false).unwrap()), &[1.6666666]);
    close(&f(&x.var(None, 0.0, false).unwrap()), &[1.25]);
    close(&f(&x.std(None, 1.0, false).unwrap()), &[1.2909944]);
    close(&f(&x.norm(2.0, None, false).unwrap()), &[5.4772256]);
    close(&f(&x.norm(1.0, None, false).unwrap()), &[10.]);
    close(&f(&x.norm(f64::INFINITY, None, false).unwrap()), &[4.]);
    close(&f(&x.norm(f64::NEG_INFINITY, None, false).unwrap()), &[1.]);
    close(&f(&x.norm(0.0, None, false).unwrap()), &[4.]);
    close(&f(&x.logsumexp(&[0], false).unwrap()), &[4.4401897]);
    let big = t(&[1000., 1000.], &[2]);
    close(&f(&big.logsumexp(&[0], false).unwrap()), &[1000.6931]);
    let b = Tensor::from_vec(vec![true, false, true, true], &[2, 2]).unwrap();
    assert_eq!(b.all().unwrap().to_vec::<bool>().unwrap(), vec![false]);
    assert_eq!(b.all_dim(&[0], false).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    assert_eq!(b.any_dim(&[1], false).unwrap().to_vec::<bool>().unwrap(), vec![true, true]);
}

#[test]
fn reduction_errors() {
    let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    assert_eq!(
        err(x.sum_dim(&[5], false)),
        "sum: index error: Dimension out of range (expected to be in range of [-2, 1], but got 5)"
    );
    assert_eq!(
        err(x.sum_dim(&[0, -2], false)),
        "sum: invalid argument: dim 0 appears multiple times in the list of dims"
    );
    let xi = ti(&[1, 2], &[2]);
    assert_eq!(
        err(xi.mean()),
        "mean: dtype error: mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: int64"
    );
    assert!(err(xi.var(None, 1.0, false)).contains("std and var only support floating point"));
    assert!(err(xi.norm(2.0, None, false))
        .contains("norm: Expected a floating point or complex tensor as input. Got: int64"));
    let e = creation::zeros(&[0], None).unwrap();
    assert!(err(e.max()).contains("max(): Expected reduction dim to be specified for input.numel() == 0"));
    let e2 = creation::zeros(&[0, 3], None).unwrap();
    assert_eq!(
        err(e2.max_dim(0, false)),
        "max.dim: index error: max.dim(): Expected reduction dim 0 to have non-zero size."
    );
    assert_eq!(
        err(x.sum_to_size(&[3, 3])),
        "sum_to_size: shape error: size {[3, 3]} is not expandable to size {[2, 3]}."
    );
    assert!(err(softmax::softmax(&xi, 0, None)).contains("\"softmax_lastdim_kernel_impl\" not implemented for 'int64'"));
}

// ------------------------------------------------------------------------------------------
// softmax, scans, sort
// ------------------------------------------------------------------------------------------

#[test]
fn softmax_scan_sort() {
    let x = t(&[1., 2., 3., 1., 1., 1.], &[2, 3]);
    let s = x.softmax(1).unwrap();
    close(&f(&s), &[0.09003057, 0.24472847, 0.66524096, 1. / 3., 1. / 3., 1. / 3.]);
    let ls = x.log_softmax(0).unwrap();
    close(&f(&ls), &[-0.6931472, -0.3132617, -0.126928, -0.6931472, -1.3132617, -2.126928]);
    // non-contiguous along a non-last dim
    let tt = x.t().unwrap();
    close(&f(&tt.softmax(0).unwrap()), &[0.09003057, 1. / 3., 0.24472847, 1. / 3., 0.66524096, 1. / 3.]);
    assert_eq!(f(&x.cumsum(1).unwrap()), vec![1., 3., 6., 1., 2., 3.]);
    assert_eq!(f(&x.cumsum(0).unwrap()), vec![1., 2., 3., 2., 3., 4.]);
    assert_eq!(f(&tt.cumprod(0).unwrap()), vec![1., 1., 2., 1., 6., 1.]);
    let (v, i) = t(&[3., f32::NAN, 1., 3.], &[4]).sort(0, true).unwrap();
    assert!(v.to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 0, 3, 2]);
    let (v, i) = t(&[1., 3., 3., 2.], &[4]).topk(2, 0, true, true).unwrap();
    assert_eq!(f(&v), vec![3., 3.]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 2]);
    let (v, _) = x.topk(1, 0, false, true).unwrap();
    assert_eq!(f(&v), vec![1., 1., 1.]);
    assert_eq!(
        err(x.topk(4, 1, true, true)),
        "topk: index error: selected index k out of range: k = 4 but dimension 1 has size 3 (shape [2, 3])"
    );
    assert!(err(sort::sort(&x, 2, false)).contains("Dimension out of range"));
}

// ------------------------------------------------------------------------------------------
// join
// ------------------------------------------------------------------------------------------

#[test]
fn cat_stack_split() {
    let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = ti(&[7, 8], &[2, 1]);
    let c = join::cat(&[a.clone(), b.clone()], 1).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(f(&c), vec![1., 2., 3., 7., 4., 5., 6., 8.]);
    let c0 = join::cat(&[a.t().unwrap(), t(&[0., 0.], &[1, 2])], 0).unwrap();
    assert_eq!(f(&c0), vec![1., 4., 2., 5., 3., 6., 0., 0.]);
    let s = join::stack(&[a.clone(), a.clone()], 1).unwrap();
    assert_eq!(s.shape(), &[2, 2, 3]);
    assert_eq!(f(&s), vec![1., 2., 3., 1., 2., 3., 4., 5., 6., 4., 5., 6.]);
    let parts = a.split(2, 1).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(f(&parts[1]), vec![3., 6.]);
    assert!(parts[0].shares_storage(&a));
    let parts = a.split_with_sizes(&[1, 2], 1).unwrap();
    assert_eq!(f(&parts[1]), vec![2., 3., 5., 6.]);
    assert_eq!(a.chunk(2, 1).unwrap().len(), 2);
    let rows = a.unbind(0).unwrap();
    assert_eq!(f(&rows[1]), vec![4., 5., 6.]);

    assert_eq!(
        err(join::cat(&[a.clone(), t(&[0.; 8], &[2, 4]), t(&[0.; 12], &[3, 4])], 0)),
        "cat: shape error: Sizes of tensors must match except in dimension 0. Expected size 3 but got size 4 for tensor number 1 in the list."
    );
    let x3 = t(&[0.; 3], &[1, 3]);
    let x4 = t(&[0.; 4], &[1, 4]);
    assert_eq!(
        err(join::cat(&[x3, x4], 0)),
        "cat: shape error: Sizes of tensors must match except in dimension 0. Expected size 3 but got size 4 for tensor number 1 in the list."
    );
    assert_eq!(
        err(join::cat(&[a.clone(), t(&[0.; 3], &[3])], 0)),
        "cat: shape error: Tensors must have same number of dimensions: got 2 and 1"
    );
    assert_eq!(err(join::cat(&[], 0)), "cat: invalid argument: cat(): expected a non-empty list of Tensors");
    assert_eq!(
        err(join::stack(&[a.clone(), a.t().unwrap()], 0)),
        "stack: shape error: stack expects each tensor to be equal size, but got [2, 3] at entry 0 and [3, 2] at entry 1"
    );
    assert_eq!(
        err(a.split_with_sizes(&[1, 1], 1)),
        "split_with_sizes: shape error: split_with_sizes expects split_sizes to sum exactly to 3 (input tensor's size at dimension 1), but got split_sizes=[1, 1]"
    );
    assert_eq!(err(a.chunk(0, 0)), "chunk: invalid argument: chunk expects `chunks` to be greater than 0, got: 0");
}

#[test]
fn cat_matches_pytorch_message_for_dim1() {
    let a = t(&[0.; 6], &[2, 3]);
    let b = t(&[0.; 12], &[3, 4]);
    assert_eq!(
        err(join::cat(&[a, b], 1)),
        "cat: shape error: Sizes of tensors must match except in dimension 1. Expected size 2 but got size 3 for tensor number 1 in the list."
    );
}

// ------------------------------------------------------------------------------------------
// indexing
// ------------------------------------------------------------------------------------------

#[test]
fn gather_scatter_index_select_masked() {
    let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let idx = ti(&[2, 0, 1, 1], &[2, 2]);
    assert_eq!(f(&x.gather(1, &idx).unwrap()), vec![3., 1., 5., 5.]);
    assert_eq!(f(&x.t().unwrap().gather(0, &ti(&[1, 0], &[1, 2])).unwrap()), vec![2., 4.]);
    let z = creation::zeros(&[2, 3], None).unwrap();
    let src = t(&[10., 20., 30., 40.], &[2, 2]);
    assert_eq!(f(&z.scatter(1, &idx, &src).unwrap()), vec![20., 0., 10., 0., 40., 0.]);
    assert_eq!(f(&z.scatter_add(1, &idx, &src).unwrap()), vec![20., 0., 10., 0., 70., 0.]);
    assert_eq!(f(&index::scatter_value(&z, 1, &idx, 9.0, None).unwrap()), vec![9., 0., 9., 0., 9., 0.]);
    // in place bumps the version and writes through
    let w = creation::zeros(&[2, 3], None).unwrap();
    let v0 = w.version();
    w.scatter_add_(1, &idx, &src).unwrap();
    assert_eq!(w.version(), v0 + 1);
    assert_eq!(f(&w), vec![20., 0., 10., 0., 70., 0.]);
    assert_eq!(f(&x.index_select(1, &ti(&[2, 0], &[2])).unwrap()), vec![3., 1., 6., 4.]);
    let mask = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    assert_eq!(f(&x.masked_fill(&mask, -1.0).unwrap()), vec![-1., 2., -1., -1., 5., -1.]);
    let vt = Tensor::scalar(7.0f32);
    let r = op::call("masked_fill", vec![Value::from(&x), Value::from(&mask), Value::from(&vt)], vec![]).unwrap();
    assert_eq!(f(&r[0]), vec![7., 2., 7., 7., 5., 7.]);
    assert_eq!(f(&x.masked_select(&mask).unwrap()), vec![1., 3., 4., 6.]);
    let y = x.contiguous().unwrap().reshape(&[2, 3]).unwrap();
    let y = Tensor::from_vec(y.to_vec::<f32>().unwrap(), &[2, 3]).unwrap();
    y.masked_fill_(&mask, 0.0).unwrap();
    assert_eq!(f(&y), vec![0., 2., 0., 0., 5., 0.]);
}

#[test]
fn indexing_errors_name_the_bad_index() {
    let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    assert_eq!(
        err(x.gather(1, &ti(&[0, 5, 1, 0, 0, 0], &[2, 3]))),
        "gather: index error: index 5 is out of bounds for dimension 1 with size 3"
    );
    assert_eq!(
        err(x.gather(1, &ti(&[-1], &[1, 1]))),
        "gather: index error: index -1 is out of bounds for dimension 1 with size 3"
    );
    assert!(err(x.gather(1, &Tensor::from_vec(vec![0i32], &[1, 1]).unwrap()))
        .contains("gather(): Expected dtype int64 for index"));
    assert!(err(x.gather(1, &ti(&[0], &[1]))).contains("Index tensor must have the same number of dimensions"));
    let z = creation::zeros(&[2, 3], None).unwrap();
    assert_eq!(
        err(index::scatter_value(&z, 1, &ti(&[0, 7], &[1, 2]), 1.0, None)),
        "scatter: index error: index 7 is out of bounds for dimension 1 with size 3"
    );
    assert_eq!(
        err(x.index_select(1, &ti(&[0, 7], &[2]))),
        "index_select: index error: index_select(): index 7 is out of bounds for dimension 1 with size 3"
    );
    assert_eq!(
        err(shape_misc::one_hot(&ti(&[0, 5], &[2]), 3)),
        "one_hot: index error: Class values must be smaller than num_classes: got class 5 with num_classes=3."
    );
    assert_eq!(
        err(shape_misc::one_hot(&ti(&[0, -1], &[2]), 3)),
        "one_hot: index error: Class values must be non-negative, got -1."
    );
    assert!(err(shape_misc::one_hot(&t(&[0.], &[1]), 3))
        .contains("one_hot is only applicable to index tensor of type LongTensor"));
    assert_eq!(
        err(x.masked_fill(&ti(&[1, 0, 1], &[3]), 1.0)),
        "masked_fill: dtype error: masked_fill only supports boolean masks, but got mask with dtype int64"
    );
    let mask = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    assert!(err(x.masked_fill(&mask, 1.0)).contains("not broadcastable"));
    let vt = t(&[1., 2.], &[2]);
    let mask3 = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    let e = op::call("masked_fill", vec![Value::from(&x), Value::from(&mask3), Value::from(&vt)], vec![]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "masked_fill: shape error: masked_fill only supports a 0-dimensional value tensor, but got tensor with 1 dimension(s)."
    );
}

// ------------------------------------------------------------------------------------------
// creation
// ------------------------------------------------------------------------------------------

#[test]
fn creation_values_and_dtypes() {
    let a = creation::arange(0, 5, 1, None).unwrap();
    assert_eq!(a.dtype(), DType::I64);
    assert_eq!(a.to_vec::<i64>().unwrap(), vec![0, 1, 2, 3, 4]);
    let r = op::call("arange", vec![Value::Int(4)], vec![]).unwrap();
    assert_eq!(r[0].to_vec::<i64>().unwrap(), vec![0, 1, 2, 3]);
    let af = creation::arange(0, 1, 0.25, None).unwrap();
    assert_eq!(af.dtype(), DType::F32);
    assert_eq!(f(&af), vec![0., 0.25, 0.5, 0.75]);
    assert_eq!(creation::arange(5, 0, -2, None).unwrap().to_vec::<i64>().unwrap(), vec![5, 3, 1]);
    assert_eq!(f(&creation::linspace(0.0, 1.0, 5, None).unwrap()), vec![0., 0.25, 0.5, 0.75, 1.]);
    assert_eq!(f(&creation::eye(2, Some(3), None).unwrap()), vec![1., 0., 0., 0., 1., 0.]);
    assert_eq!(creation::full(&[2], true, None).unwrap().dtype(), DType::Bool);
    assert_eq!(creation::full(&[2], 3i64, None).unwrap().dtype(), DType::I64);
    assert_eq!(creation::full(&[2], 3.0f64, None).unwrap().dtype(), DType::F32);
    let x = Tensor::from_vec(vec![1i32, 2], &[2]).unwrap();
    assert_eq!(creation::ones_like(&x, None).unwrap().to_vec::<i32>().unwrap(), vec![1, 1]);
    assert_eq!(creation::zeros_like(&x, Some(DType::F64)).unwrap().dtype(), DType::F64);
}

#[test]
fn creation_errors() {
    assert_eq!(
        err(creation::zeros(&[2, -1], None)),
        "zeros: invalid argument: Trying to create tensor with negative dimension -1: [2, -1]"
    );
    assert!(err(creation::zeros(&[1 << 30, 1 << 30, 1 << 10], None)).contains("refusing to allocate a tensor of shape"));
    assert!(err(creation::ones(&[i64::MAX, i64::MAX], None)).contains("refusing to allocate"));
    assert_eq!(err(creation::arange(0, 10, 0, None)), "arange: invalid argument: step must be nonzero");
    assert!(err(creation::arange(10, 0, 1, None)).contains("upper bound and lower bound inconsistent with step sign"));
    assert!(err(creation::arange(0.0, 1e30, 1e-30, None)).contains("invalid size, possible overflow?"));
    assert!(err(creation::arange(0, 1i64 << 40, 1, None)).contains("refusing to allocate"));
    assert!(err(creation::linspace(0.0, 1.0, -1, None)).contains("number of steps must be non-negative"));
    assert_eq!(err(creation::eye(-1, None, None)), "eye: invalid argument: n must be greater or equal to 0, got -1");
}

// ------------------------------------------------------------------------------------------
// random
// ------------------------------------------------------------------------------------------

#[test]
fn random_streams_are_reproducible() {
    let g = random::Generator::new(42);
    let a = g.rand(&[1000], None).unwrap();
    let b = g.rand(&[1000], None).unwrap();
    assert_ne!(f(&a), f(&b));
    g.manual_seed(42);
    assert_eq!(f(&g.rand(&[1000], None).unwrap()), f(&a));
    // large tensors (parallel chunks) are reproducible too
    g.manual_seed(7);
    let big1 = g.randn(&[300_000], None).unwrap();
    g.manual_seed(7);
    let big2 = g.randn(&[300_000], None).unwrap();
    assert_eq!(f(&big1), f(&big2));
    let v = f(&big1);
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
    assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "{mean} {var}");
    assert!(f(&a).iter().all(|&u| (0.0..1.0).contains(&u)));
    // state snapshots
    let st = g.get_state();
    let c = g.randint(0, 10, &[50], None).unwrap();
    g.set_state(&st);
    assert_eq!(g.randint(0, 10, &[50], None).unwrap().to_vec::<i64>().unwrap(), c.to_vec::<i64>().unwrap());
    assert!(c.to_vec::<i64>().unwrap().iter().all(|&v| (0..10).contains(&v)));
    // dropout: zeros or scaled by 1/(1-p)
    let x = creation::ones(&[1000], None).unwrap();
    let d = g.scope(|| random::dropout(&x, 0.25, true)).unwrap();
    let dv = f(&d);
    assert!(dv.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    let kept = dv.iter().filter(|&&v| v != 0.0).count();
    assert!((650..850).contains(&kept), "{kept}");
    assert!(random::dropout(&x, 0.25, false).unwrap().same(&x));
    let (o, m) = random::native_dropout(&x, 0.5, true).unwrap();
    assert_eq!(m.dtype(), DType::Bool);
    assert_eq!(o.shape(), &[1000]);
    let bern = random::bernoulli(&creation::full(&[100], 1.0f64, None).unwrap(), None).unwrap();
    assert!(f(&bern).iter().all(|&v| v == 1.0));
    let perm = random::randperm(10, None).unwrap().to_vec::<i64>().unwrap();
    let mut sorted = perm.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<i64>>());
}

#[test]
fn random_errors() {
    assert!(err(random::rand(&[2], Some(DType::I64))).contains("needs a floating point dtype"));
    assert_eq!(
        err(random::randint(5, 2, &[3], None)),
        "randint.low: invalid argument: random_ expects 'from' to be less than 'to', but got from=5 >= to=2"
    );
    let x = t(&[0.5, 1.5], &[2]);
    assert!(err(random::bernoulli(&x, None))
        .contains("bernoulli expects all probabilities in the input to be in [0, 1], but found 1.5"));
    assert_eq!(
        err(random::bernoulli(&x, Some(1.5))),
        "bernoulli: invalid argument: bernoulli expects p to be in [0, 1], but got p=1.5"
    );
    assert_eq!(
        err(random::dropout(&x, 1.5, true)),
        "dropout: invalid argument: dropout probability has to be between 0 and 1, but got 1.5"
    );
}

// ------------------------------------------------------------------------------------------
// pad / one_hot / pixel_shuffle
// ------------------------------------------------------------------------------------------

#[test]
fn pad_one_hot_pixel_shuffle() {
    let x = t(&[1., 2., 3.], &[1, 3]);
    assert_eq!(f(&shape_misc::pad(&x, &[2, 1], "constant", Some(9.0)).unwrap()), vec![9., 9., 1., 2., 3., 9.]);
    assert_eq!(f(&shape_misc::pad(&x, &[2, 2], "reflect", None).unwrap()), vec![3., 2., 1., 2., 3., 2., 1.]);
    assert_eq!(f(&shape_misc::pad(&x, &[2, 1], "replicate", None).unwrap()), vec![1., 1., 1., 2., 3., 3.]);
    assert_eq!(f(&shape_misc::pad(&x, &[1, 1], "circular", None).unwrap()), vec![3., 1., 2., 3., 1.]);
    assert_eq!(f(&shape_misc::pad(&x, &[-1, 0], "constant", None).unwrap()), vec![2., 3.]);
    let p2 = shape_misc::pad(&x, &[0, 0, 1, 0], "constant", None).unwrap();
    assert_eq!(p2.shape(), &[2, 3]);
    // an empty input padded to a non-empty output is all fill (torch: F.pad(torch.empty(2, 0),
    // (1, 1), value=7.) is [[7., 7.], [7., 7.]]); found by the ONNX importer's fuzzer
    let empty = creation::zeros(&[2, 0], None).unwrap();
    let pe = shape_misc::pad(&empty, &[1, 1], "constant", Some(7.0)).unwrap();
    assert_eq!((pe.shape(), f(&pe)), (&[2usize, 2][..], vec![7.; 4]));
    let pe = shape_misc::pad(&creation::zeros(&[0, 3], None).unwrap(), &[0, 0, 2, 0], "constant", None).unwrap();
    assert_eq!((pe.shape(), f(&pe)), (&[2usize, 3][..], vec![0.; 6]));
    let oh = shape_misc::one_hot(&ti(&[0, 2], &[2]), -1).unwrap();
    assert_eq!(oh.shape(), &[2, 3]);
    assert_eq!(oh.to_vec::<i64>().unwrap(), vec![1, 0, 0, 0, 0, 1]);
    let ps = creation::arange(0, 8, 1, Some(DType::F32)).unwrap().reshape(&[1, 4, 1, 2]).unwrap();
    let up = shape_misc::pixel_shuffle(&ps, 2).unwrap();
    assert_eq!(up.shape(), &[1, 1, 2, 4]);
    assert_eq!(f(&up), vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    let down = shape_misc::pixel_unshuffle(&up, 2).unwrap();
    assert_eq!(f(&down), f(&ps));

    assert_eq!(
        err(shape_misc::pad(&t(&[0.; 6], &[1, 2, 3]), &[3, 3], "reflect", None)),
        "pad: invalid argument: Argument #4: Padding size should be less than the corresponding input dimension, but got: padding (3, 3) at dimension 2 of input [1, 2, 3]"
    );
    assert!(err(shape_misc::pad(&x, &[1], "constant", None)).contains("Padding length must be divisible by 2"));
    assert!(err(shape_misc::pad(&x, &[1, 1], "wrap", None)).contains("Unrecognised padding mode 'wrap'"));
    assert!(err(shape_misc::pad(&x, &[-2, -2], "constant", None)).contains("resulted in a negative output size"));
    assert_eq!(
        err(shape_misc::pixel_shuffle(&t(&[0.; 12], &[1, 3, 2, 2]), 2)),
        "pixel_shuffle: shape error: pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, but input.size(-3)=3 is not divisible by 4"
    );
}

#[test]
fn metas_agree_with_kernels() {
    // every op of the family: meta shape/dtype equals the kernel's output for a few calls
    let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let calls: Vec<(&str, Vec<Value>)> = vec![
        ("sum", vec![Value::from(&x), Value::Ints(vec![1]), Value::Bool(true)]),
        ("max.dim", vec![Value::from(&x), Value::Int(0)]),
        ("softmax", vec![Value::from(&x), Value::Int(1)]),
        ("topk", vec![Value::from(&x), Value::Int(2)]),
        ("cat", vec![Value::Tensors(vec![x.clone(), x.clone()]), Value::Int(1)]),
        ("split", vec![Value::from(&x), Value::Int(2), Value::Int(1)]),
        ("pad", vec![Value::from(&x), Value::Ints(vec![1, 1]), Value::from("reflect")]),
        ("arange", vec![Value::Float(0.5), Value::Int(3)]),
        ("pixel_shuffle", vec![Value::from(&creation::zeros(&[1, 4, 2, 2], None).unwrap()), Value::Int(2)]),
    ];
    for (name, args) in calls {
        let o = op::lookup(name).unwrap();
        let bound = op::bind(name, o.schema, args, vec![]).unwrap();
        let metas = (o.meta)(&bound).unwrap();
        let outs = (o.kernel)(&bound).unwrap();
        assert_eq!(metas.len(), outs.len(), "{name}");
        for (m, t) in metas.iter().zip(&outs) {
            assert_eq!(m.shape.as_slice(), t.shape(), "{name}");
            assert_eq!(m.dtype, t.dtype(), "{name}");
        }
    }
    let _ = reduce::MAX_ALLOC_BYTES;
}

/// Outputs (and contiguous copies of views) larger than any machine are refused with a limit
/// error through `ferrofx_core::memory`, never an allocator abort: reductions, `index_select`,
/// `gather`, `embedding`, `matmul`, masked ops, and reading a huge view as a vector.
#[test]
fn oversized_outputs_are_errors_not_aborts() {
    use ferrofx_core::ErrorKind;
    let limit = |r: ferrofx_core::Result<Tensor>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::Limit, "{what}: {e}");
        assert!(e.to_string().contains("limit of one allocation"), "{what}: {e}");
    };
    let one = t(&[1.0], &[1, 1, 1]);
    // a 2^20 x 2^20 x 4 view of one element: free, but any kernel reading it needs 16 TiB
    let huge = one.expand(&[1 << 20, 1 << 20, 4]).unwrap();
    limit(huge.sum_dim(&[-1], false), "sum over the last dim");
    limit(huge.amax(&[0], true), "amax");
    limit(huge.softmax(-1), "softmax");
    limit(huge.cumsum(2), "cumsum");
    // index_select: an index vector of 2^40 entries (a view of one zero)
    let idx = ti(&[0], &[1]).expand(&[1 << 40]).unwrap();
    limit(t(&[1.0, 2.0], &[2]).index_select(0, &idx), "index_select");
    // gather with a huge expanded index
    let gidx = ti(&[0], &[1, 1]).expand(&[1 << 20, 1 << 20]).unwrap();
    let wide = t(&[1.0], &[1, 1]).expand(&[1, 1 << 20]).unwrap();
    limit(wide.gather(0, &gidx), "gather");
    // matmul: [2^20, 1] @ [1, 2^20] is a 4 TiB outer product
    let col = t(&[1.0], &[1, 1]).expand(&[1 << 20, 1]).unwrap();
    let row = t(&[1.0], &[1, 1]).expand(&[1, 1 << 20]).unwrap();
    limit(col.matmul(&row), "matmul");
    // an empty output with a huge batch computes nothing (and does not enumerate the batch)
    let empty = Tensor::from_vec(Vec::<f32>::new(), &[1, 0, 3]).unwrap().expand(&[1 << 40, 0, 3]).unwrap();
    let y = empty.matmul(&t(&[1.0; 6], &[3, 2])).unwrap();
    assert_eq!(y.shape(), &[1 << 40, 0, 2]);
    // reading a huge view into a vector
    let e = huge.to_vec::<f32>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Limit, "{e}");
    let e = huge.to_vec_f64().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Limit, "{e}");
    // a view whose element count overflows is refused when it is made
    let e = one.expand(&[1 << 40, 1 << 40, 1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Limit, "{e}");
    assert!(e.to_string().contains("more elements than any tensor can hold"), "{e}");
}
