//! Elementwise family: values, dtype promotion, broadcasting, non-contiguous inputs, in-place
//! forms, operator overloads and bad-input messages (checked against PyTorch 2.x by hand).

use ferrofx_core::ops::{binary, compare, unary};
use ferrofx_core::{op, DType, Scalar, Tensor, Value};

fn f32s(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}
fn i64s(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}
fn bools(v: &[bool]) -> Tensor {
    Tensor::from_slice(v, &[v.len()]).unwrap()
}
fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0) || (x.is_nan() && y.is_nan()), "{a:?} vs {b:?}");
    }
}
fn err(r: ferrofx_core::Result<Tensor>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn unary_float_values() {
    let x = f32s(&[-1.5, 0.0, 0.5, 2.0], &[4]);
    close(&x.exp().unwrap().to_vec::<f32>().unwrap(), &[0.22313016, 1.0, 1.6487213, 7.389056]);
    close(&x.sigmoid().unwrap().to_vec::<f32>().unwrap(), &[0.18242553, 0.5, 0.62245935, 0.8807971]);
    close(&x.tanh().unwrap().to_vec::<f32>().unwrap(), &[-0.90514827, 0.0, 0.46211717, 0.9640276]);
    close(&x.erf().unwrap().to_vec::<f32>().unwrap(), &[-0.96610516, 0.0, 0.5204999, 0.9953223]);
    close(&x.gelu("none").unwrap().to_vec::<f32>().unwrap(), &[-0.10020709, 0.0, 0.34573123, 1.9544997]);
    close(&x.gelu("tanh").unwrap().to_vec::<f32>().unwrap(), &[-0.10042843, 0.0, 0.34571400, 1.9545977]);
    close(&x.silu().unwrap().to_vec::<f32>().unwrap(), &[-0.2736383, 0.0, 0.31122968, 1.7615942]);
    close(&x.leaky_relu(0.2).unwrap().to_vec::<f32>().unwrap(), &[-0.3, 0.0, 0.5, 2.0]);
    close(&x.elu(0.5).unwrap().to_vec::<f32>().unwrap(), &[-0.3884349, 0.0, 0.5, 2.0]);
    close(&x.selu().unwrap().to_vec::<f32>().unwrap(), &[-1.3658923, 0.0, 0.52535045, 2.101402]);
    close(&x.softplus(2.0, 1.0).unwrap().to_vec::<f32>().unwrap(), &[0.02429258, 0.34657359, 0.65634357, 2.0]);
    close(&x.softsign().unwrap().to_vec::<f32>().unwrap(), &[-0.6, 0.0, 0.33333334, 0.6666667]);
    close(&x.hardswish().unwrap().to_vec::<f32>().unwrap(), &[-0.375, 0.0, 0.29166666, 1.6666666]);
    close(&x.hardsigmoid().unwrap().to_vec::<f32>().unwrap(), &[0.25, 0.5, 0.5833333, 0.8333333]);
    close(&x.hardtanh(-1.0, 1.0).unwrap().to_vec::<f32>().unwrap(), &[-1.0, 0.0, 0.5, 1.0]);
    close(&x.relu().unwrap().to_vec::<f32>().unwrap(), &[0.0, 0.0, 0.5, 2.0]);
    close(&x.relu6().unwrap().to_vec::<f32>().unwrap(), &[0.0, 0.0, 0.5, 2.0]);
    close(&x.abs().unwrap().to_vec::<f32>().unwrap(), &[1.5, 0.0, 0.5, 2.0]);
    close(&x.neg().unwrap().to_vec::<f32>().unwrap(), &[1.5, 0.0, -0.5, -2.0]);
    close(&x.sign().unwrap().to_vec::<f32>().unwrap(), &[-1.0, 0.0, 1.0, 1.0]);
    close(&x.floor().unwrap().to_vec::<f32>().unwrap(), &[-2.0, 0.0, 0.0, 2.0]);
    close(&x.ceil().unwrap().to_vec::<f32>().unwrap(), &[-1.0, 0.0, 1.0, 2.0]);
    close(&x.round(0).unwrap().to_vec::<f32>().unwrap(), &[-2.0, 0.0, 0.0, 2.0]);
    close(&x.reciprocal().unwrap().to_vec::<f32>().unwrap(), &[-0.6666667, f32::INFINITY, 2.0, 0.5]);
    close(&x.sin().unwrap().to_vec::<f32>().unwrap(), &[-0.997495, 0.0, 0.47942555, 0.9092974]);
    close(&x.cos().unwrap().to_vec::<f32>().unwrap(), &[0.0707372, 1.0, 0.87758255, -0.41614684]);
    let p = f32s(&[0.25, 1.0, 4.0], &[3]);
    close(&p.sqrt().unwrap().to_vec::<f32>().unwrap(), &[0.5, 1.0, 2.0]);
    close(&p.rsqrt().unwrap().to_vec::<f32>().unwrap(), &[2.0, 1.0, 0.5]);
    close(&p.log().unwrap().to_vec::<f32>().unwrap(), &[-1.3862944, 0.0, 1.3862944]);
    close(&p.log1p().unwrap().to_vec::<f32>().unwrap(), &[0.22314355, 0.6931472, 1.609438]);
    // round half to even, with decimals
    let r = f32s(&[0.5, 1.5, 2.5, -0.5, 1.25, -0.55], &[6]);
    close(&r.round(0).unwrap().to_vec::<f32>().unwrap(), &[0.0, 2.0, 2.0, -0.0, 1.0, -1.0]);
    close(&f32s(&[1.25, 2.5, -0.55], &[3]).round(1).unwrap().to_vec::<f32>().unwrap(), &[1.2, 2.5, -0.6]);
    close(&f32s(&[1234.0, 1250.0], &[2]).round(-2).unwrap().to_vec::<f32>().unwrap(), &[1200.0, 1200.0]);
    // NaN propagates through relu and clamp
    let n = f32s(&[f32::NAN, -1.0], &[2]);
    assert!(n.relu().unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert!(n.clamp(0.0, 1.0).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
}

#[test]
fn unary_dtype_rules() {
    let i = i64s(&[1, 2, -3], &[3]);
    // floating ops promote ints to float32
    for f in [Tensor::exp, Tensor::sqrt, Tensor::sigmoid, Tensor::erf, Tensor::reciprocal, Tensor::log, Tensor::tanh] {
        assert_eq!(f(&i).unwrap().dtype(), DType::F32);
    }
    close(&i.sqrt().unwrap().to_vec::<f32>().unwrap(), &[1.0, 1.4142135, f32::NAN]);
    close(&bools(&[true, false]).exp().unwrap().to_vec::<f32>().unwrap(), &[std::f32::consts::E, 1.0]);
    // dtype-preserving ops
    assert_eq!(i.neg().unwrap().to_vec::<i64>().unwrap(), vec![-1, -2, 3]);
    assert_eq!(i.abs().unwrap().to_vec::<i64>().unwrap(), vec![1, 2, 3]);
    assert_eq!(i.relu().unwrap().to_vec::<i64>().unwrap(), vec![1, 2, 0]);
    assert_eq!(i.sign().unwrap().to_vec::<i64>().unwrap(), vec![1, 1, -1]);
    assert_eq!(i.floor().unwrap().to_vec::<i64>().unwrap(), vec![1, 2, -3]);
    assert_eq!(i.hardtanh(-1.0, 1.0).unwrap().to_vec::<i64>().unwrap(), vec![1, 1, -1]);
    assert_eq!(bools(&[true, false]).sign().unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    let u = Tensor::from_vec(vec![1u8, 2], &[2]).unwrap();
    assert_eq!(u.neg().unwrap().to_vec::<u8>().unwrap(), vec![255, 254]);
    let s = i.softsign().unwrap();
    assert_eq!(s.dtype(), DType::F32);
    close(&s.to_vec::<f32>().unwrap(), &[0.5, 0.6666667, -0.75]);
    // clamp: result_type of input and bounds
    assert_eq!(i.clamp(0i64, 1i64).unwrap().to_vec::<i64>().unwrap(), vec![1, 1, 0]);
    let c = i.clamp(0.5, 1.5).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    close(&c.to_vec::<f32>().unwrap(), &[1.0, 1.5, 0.5]);
    assert_eq!(bools(&[true, false]).clamp(0i64, 1i64).unwrap().dtype(), DType::I64);
    // min > max gives max everywhere
    close(&f32s(&[0.0, 5.0], &[2]).clamp(2.0, 1.0).unwrap().to_vec::<f32>().unwrap(), &[1.0, 1.0]);
    // tensor bounds broadcast
    let x = f32s(&[-2.0, 0.5, 3.0, 9.0], &[2, 2]);
    let lo = f32s(&[0.0, 1.0], &[2]);
    let hi = f32s(&[2.5], &[1]);
    close(&x.clamp(&lo, &hi).unwrap().to_vec::<f32>().unwrap(), &[0.0, 1.0, 2.5, 2.5]);
    close(&x.clamp_min(&lo).unwrap().to_vec::<f32>().unwrap(), &[0.0, 1.0, 3.0, 9.0]);
    // halves compute in f32 and round back
    let h = f32s(&[0.5, -1.0], &[2]).to_dtype(DType::F16).unwrap();
    let e = h.exp().unwrap();
    assert_eq!(e.dtype(), DType::F16);
    close(&e.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), &[1.6484375, 0.36791992]);
    let b = f32s(&[0.5, -1.0], &[2]).to_dtype(DType::BF16).unwrap();
    assert_eq!(b.relu().unwrap().dtype(), DType::BF16);
    // f64 stays f64
    let d = Tensor::from_vec(vec![1.0f64], &[1]).unwrap();
    assert_eq!(d.exp().unwrap().to_vec::<f64>().unwrap(), vec![std::f64::consts::E]);
}

#[test]
fn unary_bad_input_messages() {
    let b = bools(&[true]);
    let i = i64s(&[1], &[1]);
    assert_eq!(
        err(b.neg()),
        "neg: dtype error: Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
    );
    assert_eq!(err(b.abs()), "abs: dtype error: \"abs\" not implemented for 'Bool'");
    assert_eq!(err(b.relu()), "relu: dtype error: Boolean inputs not supported for relu");
    assert_eq!(err(b.floor()), "floor: dtype error: \"floor\" not implemented for 'Bool'");
    assert_eq!(err(i.gelu("none")), "gelu: dtype error: \"gelu\" not implemented for 'Long'");
    assert_eq!(err(i.silu()), "silu: dtype error: \"silu\" not implemented for 'Long'");
    assert_eq!(err(i.leaky_relu(0.1)), "leaky_relu: dtype error: \"leaky_relu\" not implemented for 'Long'");
    assert_eq!(err(i.elu(1.0)), "elu: dtype error: \"elu\" not implemented for 'Long'");
    assert_eq!(err(i.softplus(1.0, 20.0)), "softplus: dtype error: \"softplus\" not implemented for 'Long'");
    assert_eq!(err(i.hardswish()), "hardswish: dtype error: \"hardswish\" not implemented for 'Long'");
    assert_eq!(err(b.hardtanh(-1.0, 1.0)), "hardtanh: dtype error: Bool inputs not supported for hardtanh");
    assert_eq!(err(b.softsign()), "softsign: dtype error: \"abs\" not implemented for 'Bool' (inside abs)");
    let x = f32s(&[1.0], &[1]);
    assert_eq!(
        err(x.gelu("fast")),
        "gelu: invalid argument: approximate argument must be either none or tanh, got 'fast'."
    );
    assert_eq!(
        err(x.hardtanh(2.0, 1.0)),
        "hardtanh: invalid argument: min_val cannot be greater than max_val (got min_val=2, max_val=1)"
    );
    assert_eq!(
        err(x.clamp(None::<f64>, None::<f64>)),
        "clamp: invalid argument: torch.clamp: At least one of 'min' or 'max' must not be None"
    );
    assert_eq!(err(i.round(1)), "round: dtype error: \"round\" with decimals=1 not implemented for 'Long'");
    assert_eq!(
        err(f32s(&[1.0; 3], &[3]).clamp(&f32s(&[0.0, 1.0], &[2]), None::<f64>)),
        "clamp: shape error: shapes [3] and [2] are not broadcastable: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0"
    );
}

#[test]
fn binary_values_and_promotion() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = f32s(&[10.0, 20.0, 30.0], &[3]);
    close(&a.add(&b).unwrap().to_vec::<f32>().unwrap(), &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    close(&a.add_alpha(&b, 2.0).unwrap().to_vec::<f32>().unwrap(), &[21.0, 42.0, 63.0, 24.0, 45.0, 66.0]);
    close(&a.sub_alpha(&b, 0.5).unwrap().to_vec::<f32>().unwrap(), &[-4.0, -8.0, -12.0, -1.0, -5.0, -9.0]);
    close(&a.mul(&b).unwrap().to_vec::<f32>().unwrap(), &[10.0, 40.0, 90.0, 40.0, 100.0, 180.0]);
    close(&b.div(&a).unwrap().to_vec::<f32>().unwrap(), &[10.0, 10.0, 10.0, 2.5, 4.0, 5.0]);
    // column broadcast [2,1] with [3]
    let c = f32s(&[1.0, 2.0], &[2, 1]);
    let s = c.mul(&b).unwrap();
    assert_eq!(s.shape(), &[2, 3]);
    close(&s.to_vec::<f32>().unwrap(), &[10.0, 20.0, 30.0, 20.0, 40.0, 60.0]);
    // promotion: int tensor + float number -> float32; int + int number stays int64
    let i = i64s(&[1, 2, -3], &[3]);
    assert_eq!(i.add(1.5).unwrap().dtype(), DType::F32);
    assert_eq!(i.add(2i64).unwrap().to_vec::<i64>().unwrap(), vec![3, 4, -1]);
    // i32 tensor * float number -> float32; u8 + int number stays u8
    let i32t = Tensor::from_vec(vec![1i32], &[1]).unwrap();
    assert_eq!(i32t.mul(2.5).unwrap().to_vec::<f32>().unwrap(), vec![2.5]);
    let u = Tensor::from_vec(vec![250u8], &[1]).unwrap();
    assert_eq!(u.add(10i64).unwrap().to_vec::<u8>().unwrap(), vec![4]);
    // zero-dim tensors rank below dimensioned tensors of the same category
    let z = Tensor::scalar(2.0f64);
    assert_eq!(f32s(&[1.0], &[1]).mul(&z).unwrap().dtype(), DType::F32);
    assert_eq!(i.mul(&z).unwrap().dtype(), DType::F64);
    // f32 + f64 tensor -> f64
    assert_eq!(a.add(&Tensor::from_vec(vec![1.0f64; 3], &[3]).unwrap()).unwrap().dtype(), DType::F64);
    // bool + bool stays bool (logical or); bool * bool stays bool
    let t = bools(&[true, false, true]);
    assert_eq!(t.add(&t).unwrap().to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(t.add(true).unwrap().to_vec::<bool>().unwrap(), vec![true, true, true]);
    // integer division is true division into float32
    let d = i.div(2i64).unwrap();
    assert_eq!(d.dtype(), DType::F32);
    close(&d.to_vec::<f32>().unwrap(), &[0.5, 1.0, -1.5]);
    assert_eq!(i.div_mode(2i64, "trunc").unwrap().to_vec::<i64>().unwrap(), vec![0, 1, -1]);
    assert_eq!(i.div_mode(2i64, "floor").unwrap().to_vec::<i64>().unwrap(), vec![0, 1, -2]);
    close(&f32s(&[1.5, -2.5, 0.5], &[3]).div_mode(0.7, "floor").unwrap().to_vec::<f32>().unwrap(), &[2.0, -4.0, 0.0]);
    close(&f32s(&[1.5, -2.5], &[2]).div_mode(0.7, "trunc").unwrap().to_vec::<f32>().unwrap(), &[2.0, -3.0]);
    assert_eq!(t.div(&t).unwrap().dtype(), DType::F32);
    // pow
    assert_eq!(i.pow(2i64).unwrap().to_vec::<i64>().unwrap(), vec![1, 4, 9]);
    close(&i.pow(0.5).unwrap().to_vec::<f32>().unwrap(), &[1.0, 1.4142135, f32::NAN]);
    assert_eq!(binary::pow(2i64, &i).unwrap().to_vec::<i64>().unwrap(), vec![2, 4, 0]);
    close(&binary::pow(2.5, &i).unwrap().to_vec::<f32>().unwrap(), &[2.5, 6.25, 0.064]);
    assert_eq!(i.pow(&i64s(&[-1, 0, 2], &[3])).unwrap().to_vec::<i64>().unwrap(), vec![1, 1, 9]);
    assert_eq!(t.pow(2i64).unwrap().to_vec::<i64>().unwrap(), vec![1, 0, 1]);
    close(&f32s(&[2.0, 3.0], &[2]).pow(&f32s(&[3.0, 0.5], &[2])).unwrap().to_vec::<f32>().unwrap(), &[8.0, 1.7320508]);
    // remainder (sign of divisor) and fmod (sign of dividend)
    assert_eq!(i.remainder(-2i64).unwrap().to_vec::<i64>().unwrap(), vec![-1, 0, -1]);
    assert_eq!(i.fmod(-2i64).unwrap().to_vec::<i64>().unwrap(), vec![1, 0, -1]);
    close(&f32s(&[1.5, -2.5, 0.5], &[3]).remainder(-2.0).unwrap().to_vec::<f32>().unwrap(), &[-0.5, -0.5, -1.5]);
    assert!(f32s(&[1.0], &[1]).remainder(0.0).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(binary::remainder(5i64, &i).unwrap().to_vec::<i64>().unwrap(), vec![0, 1, -1]);
    // maximum/minimum propagate NaN and promote
    let m = f32s(&[f32::NAN, 1.0, 5.0], &[3]).maximum(&f32s(&[0.0, f32::NAN, 2.0], &[3])).unwrap();
    let mv = m.to_vec::<f32>().unwrap();
    assert!(mv[0].is_nan() && mv[1].is_nan() && mv[2] == 5.0);
    let mm = i.minimum(&f32s(&[1.5, -2.5, 0.5], &[3])).unwrap();
    assert_eq!(mm.dtype(), DType::F32);
    close(&mm.to_vec::<f32>().unwrap(), &[1.0, -2.5, -3.0]);
    assert_eq!(t.maximum(&bools(&[false, true, false])).unwrap().to_vec::<bool>().unwrap(), vec![true, true, true]);
    // halves
    let h = f32s(&[1.0, 2.0], &[2]).to_dtype(DType::F16).unwrap();
    let hs = h.add(&h).unwrap();
    assert_eq!(hs.dtype(), DType::F16);
    assert_eq!(hs.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(h.add(1.0).unwrap().dtype(), DType::F16);
    // int8 wraps
    let i8t = Tensor::from_vec(vec![100i8], &[1]).unwrap();
    assert_eq!(i8t.add(&i8t).unwrap().to_vec::<i8>().unwrap(), vec![-56]);
}

#[test]
fn binary_non_contiguous_inputs() {
    let base = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[3, 4]).unwrap();
    let t = base.t().unwrap(); // [4, 3], strides [1, 4]
    let ones = f32s(&[1.0; 12], &[4, 3]);
    let r = t.add(&ones).unwrap();
    assert_eq!(r.shape(), &[4, 3]);
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0, 4.0, 8.0, 12.0]);
    // stepped slice + expanded operand
    let s = base.slice(1, Some(0), None, Some(2)).unwrap().slice(1, None, None, 1).unwrap(); // [3, 2]
    let col = f32s(&[100.0, 200.0, 300.0], &[3, 1]).expand(&[3, 2]).unwrap();
    assert_eq!(s.add(&col).unwrap().to_vec::<f32>().unwrap(), vec![100.0, 102.0, 204.0, 206.0, 308.0, 310.0]);
    // unary on a transposed view
    assert_eq!(t.neg().unwrap().to_vec::<f32>().unwrap()[..3], [-0.0, -4.0, -8.0]);
    // large non-contiguous (parallel plan path) matches the contiguous result
    let big = Tensor::from_vec((0..(300 * 257)).map(|v| (v % 97) as f32).collect(), &[300, 257]).unwrap();
    let bt = big.t().unwrap();
    let a = bt.mul(&bt).unwrap().to_vec::<f32>().unwrap();
    let c = bt.contiguous().unwrap();
    let b = c.mul(&c).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b);
    // x op x (same storage)
    assert_eq!(base.sub(&base).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 12]);
}

#[test]
fn binary_bad_input_messages() {
    let a = Tensor::from_vec(vec![0f32; 6], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![0f32; 4], &[4]).unwrap();
    assert_eq!(
        err(a.add(&b)),
        "add: shape error: shapes [2, 3] and [4] are not broadcastable: the size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1"
    );
    let t = bools(&[true]);
    assert_eq!(
        err(t.sub(&t)),
        "sub: dtype error: Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
    );
    assert_eq!(
        err(t.sub(1i64)),
        "sub: dtype error: Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
    );
    let i = i64s(&[1, 2], &[2]);
    assert_eq!(
        err(i.add_alpha(&i, 1.5)),
        "add: invalid argument: For integral input tensors, argument alpha must not be a floating point number (got alpha=1.5)."
    );
    assert_eq!(err(a.add_alpha(&a, true)), "add: invalid argument: Boolean alpha only supported for Boolean results.");
    assert_eq!(
        err(i.div_mode(2i64, "round")),
        "div: invalid argument: div expected rounding_mode to be one of None, 'trunc', or 'floor' but found 'round'"
    );
    assert_eq!(err(i.div_mode(0i64, "floor")), "div: invalid argument: ZeroDivisionError: integer division or modulo by zero");
    assert_eq!(err(i.remainder(&i64s(&[1, 0], &[2]))), "remainder: invalid argument: ZeroDivisionError: integer division or modulo by zero");
    assert_eq!(err(i.fmod(0i64)), "fmod: invalid argument: ZeroDivisionError: integer division or modulo by zero");
    assert_eq!(err(i.pow(-1i64)), "pow: invalid argument: Integers to negative integer powers are not allowed.");
    assert_eq!(err(t.pow(&t)), "pow: dtype error: \"pow\" not implemented for 'Bool'");
    assert_eq!(err(t.remainder(&t)), "remainder: dtype error: \"remainder\" not implemented for 'Bool'");
    assert_eq!(err(t.div_mode(&t, "trunc")), "div: dtype error: \"div\" with rounding_mode='trunc' not implemented for 'Bool'");
    // wrong argument types through the registry
    let e = op::call("add", vec![Value::from(&a), Value::from("x")], vec![]).unwrap_err().to_string();
    assert!(e.starts_with("add: schema error: argument 'other' must be Tensor|Scalar, but got str"), "{e}");
    let e = op::call("maximum", vec![Value::from(&a), Value::Int(1)], vec![]).unwrap_err().to_string();
    assert!(e.starts_with("maximum: schema error: argument 'other' must be Tensor, but got int"), "{e}");
    let e = op::call("pow", vec![Value::Int(2), Value::Int(3)], vec![]).unwrap_err().to_string();
    assert_eq!(e, "pow: schema error: at least one of the operands must be a Tensor, got two numbers");
}

#[test]
fn registry_calls_with_kwargs() {
    let x = f32s(&[1.0, -2.0], &[2]);
    let y = op::call("add", vec![Value::from(&x), Value::Float(1.0)], vec![("alpha".into(), Value::Int(2))]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![3.0, 0.0]);
    let g = op::call("gelu", vec![Value::from(&x)], vec![("approximate".into(), "tanh".into())]).unwrap();
    close(&g[0].to_vec::<f32>().unwrap(), &[0.8411920, -0.04540235]);
    let d = op::call("div", vec![Value::from(&x), Value::Float(0.7)], vec![("rounding_mode".into(), "floor".into())]).unwrap();
    close(&d[0].to_vec::<f32>().unwrap(), &[1.0, -3.0]);
    let c = op::call("clamp", vec![Value::from(&x)], vec![("max".into(), Value::Int(0))]).unwrap();
    close(&c[0].to_vec::<f32>().unwrap(), &[0.0, -2.0]);
    let w = op::call("where", vec![Value::from(&bools(&[true, false])), Value::from(&x), Value::Float(9.0)], vec![]).unwrap();
    close(&w[0].to_vec::<f32>().unwrap(), &[1.0, 9.0]);
    let r = op::call("leaky_relu", vec![Value::from(&x)], vec![("negative_slope".into(), Value::Float(0.5))]).unwrap();
    close(&r[0].to_vec::<f32>().unwrap(), &[1.0, -1.0]);
    for name in ["add_", "mul_", "relu_", "copy_", "fill_", "zero_", "clamp_", "sub_", "div_"] {
        assert_eq!(op::lookup(name).unwrap().mutated_arg(), Some(0), "{name}");
    }
    for name in ["add", "eq", "where", "gelu", "logical_xor"] {
        assert!(op::lookup(name).unwrap().is_pure(), "{name}");
    }
}

#[test]
fn meta_matches_kernel() {
    let cases: Vec<(&str, Vec<Value>)> = vec![
        ("add", vec![Value::from(&i64s(&[1, 2], &[2, 1])), Value::Float(1.5), Value::Int(1)]),
        ("div", vec![Value::from(&i64s(&[1, 2], &[2])), Value::from(&i64s(&[3], &[1])), Value::None]),
        ("eq", vec![Value::from(&f32s(&[1.0, 2.0], &[2])), Value::from(&f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]))]),
        ("where", vec![Value::from(&bools(&[true, false])), Value::Int(1), Value::Float(0.5)]),
        ("exp", vec![Value::from(&i64s(&[1], &[1]))]),
        ("clamp", vec![Value::from(&bools(&[true])), Value::Int(0), Value::Int(1)]),
    ];
    for (name, args) in cases {
        let o = op::lookup(name).unwrap();
        let meta = (o.meta)(&args).unwrap();
        let out = (o.kernel)(&args).unwrap();
        assert_eq!(meta[0].shape.as_slice(), out[0].shape(), "{name}");
        assert_eq!(meta[0].dtype, out[0].dtype(), "{name}");
    }
    // meta reports the same error as the kernel
    let t = bools(&[true]);
    let args = vec![Value::from(&t), Value::from(&t), Value::Int(1)];
    let o = op::lookup("sub").unwrap();
    assert_eq!((o.meta)(&args).unwrap_err(), (o.kernel)(&args).unwrap_err());
    let cost = (o.cost)(&[Value::from(&f32s(&[1.0; 4], &[4])), Value::Float(1.0)], &[ferrofx_core::TensorMeta::contiguous(&[4], DType::F32)]);
    assert_eq!(cost.flops, 4);
}

#[test]
fn comparisons_logical_where() {
    let i = i64s(&[1, 2, -3], &[3]);
    assert_eq!(i.eq(1.0).unwrap().to_vec::<bool>().unwrap(), vec![true, false, false]);
    assert_eq!(i.ne(1i64).unwrap().to_vec::<bool>().unwrap(), vec![false, true, true]);
    assert_eq!(i.lt(&i64s(&[2], &[1])).unwrap().to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(i.le(2i64).unwrap().to_vec::<bool>().unwrap(), vec![true, true, true]);
    assert_eq!(i.gt(1.5).unwrap().to_vec::<bool>().unwrap(), vec![false, true, false]);
    assert_eq!(i.ge(&f32s(&[1.0, 2.5, -3.0], &[3])).unwrap().to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(bools(&[true, false]).lt(0.5).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    let n = f32s(&[f32::NAN], &[1]);
    assert_eq!(n.eq(&n).unwrap().to_vec::<bool>().unwrap(), vec![false]);
    assert_eq!(n.ne(&n).unwrap().to_vec::<bool>().unwrap(), vec![true]);
    // broadcasting comparison
    let c = f32s(&[1.0, 2.0], &[2, 1]).gt(&f32s(&[0.0, 1.5, 3.0], &[3])).unwrap();
    assert_eq!(c.shape(), &[2, 3]);
    assert_eq!(c.to_vec::<bool>().unwrap(), vec![true, false, false, true, true, false]);
    // logical ops: nonzero (and NaN) is true
    let f = f32s(&[1.5, 0.0, f32::NAN], &[3]);
    assert_eq!(i.logical_and(&f).unwrap().to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(i.logical_xor(&f32s(&[0.0, 1.0, 0.0], &[3])).unwrap().to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(f.logical_or(&i64s(&[0, 0, 0], &[3])).unwrap().to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(f.logical_not().unwrap().to_vec::<bool>().unwrap(), vec![false, true, false]);
    // where with broadcasting of all three and numbers
    let cond = bools(&[true, false, true]);
    let w = compare::where_cond(&cond, &i, &f32s(&[1.5, -2.5, 0.5], &[3])).unwrap();
    assert_eq!(w.dtype(), DType::F32);
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, -2.5, -3.0]);
    let w = compare::where_cond(&cond, 1i64, 0.5).unwrap();
    assert_eq!(w.dtype(), DType::F32);
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 0.5, 1.0]);
    assert_eq!(compare::where_cond(&cond, 1i64, 0i64).unwrap().dtype(), DType::I64);
    let cb = Tensor::from_vec(vec![true, false], &[2, 1]).unwrap();
    let w = compare::where_cond(&cb, &f32s(&[1.0, 2.0, 3.0], &[3]), &f32s(&[0.0], &[1])).unwrap();
    assert_eq!(w.shape(), &[2, 3]);
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.0]);
    let w = i.where_cond(&cond, 7i64).unwrap();
    assert_eq!(w.to_vec::<i64>().unwrap(), vec![1, 7, -3]);
    // where on a transposed condition
    let ct = Tensor::from_vec(vec![true, false, false, true], &[2, 2]).unwrap().t().unwrap();
    let w = compare::where_cond(&ct, 1i64, 0i64).unwrap();
    assert_eq!(w.to_vec::<i64>().unwrap(), vec![1, 0, 0, 1]);
    // errors
    assert_eq!(
        err(compare::where_cond(&i, &i, &i)),
        "where: dtype error: where expected condition to be a boolean tensor, but got a tensor with dtype Long"
    );
    assert_eq!(
        err(compare::where_cond(&bools(&[true, false]), &i, 0i64)),
        "where: shape error: shapes [2] and [3] are not broadcastable: the size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0"
    );
    assert_eq!(
        err(i.eq(&i64s(&[1, 2], &[2]))),
        "eq: shape error: shapes [3] and [2] are not broadcastable: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0"
    );
    assert!(err(i.logical_and(&i64s(&[1, 2], &[2]))).starts_with("logical_and: shape error"));
}

#[test]
fn inplace_ops() {
    let x = f32s(&[1.0, -2.0, 3.0], &[3]);
    let v0 = x.version();
    let r = x.add_(1.0).unwrap();
    assert!(r.same(&x));
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, -1.0, 4.0]);
    x.mul_(&f32s(&[2.0], &[1])).unwrap();
    x.sub_(&f32s(&[1.0, 1.0, 1.0], &[3])).unwrap();
    x.div_(2.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.5, -1.5, 3.5]);
    x.relu_().unwrap();
    x.clamp_(None::<f64>, 2.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.5, 0.0, 2.0]);
    x.pow_(2i64).unwrap();
    x.add_alpha_(&x.clone(), 1.0).unwrap(); // aliasing source and destination
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![4.5, 0.0, 8.0]);
    x.neg_().unwrap();
    x.abs_().unwrap();
    x.sigmoid_().unwrap();
    x.tanh_().unwrap();
    x.fill_(2.5).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.5; 3]);
    x.zero_().unwrap();
    x.copy_(&i64s(&[7, 8, 9], &[3])).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![7.0, 8.0, 9.0]);
    assert_eq!(x.version(), v0 + 17);
    // int destination: int results fine, float results rejected
    let i = i64s(&[5, -7], &[2]);
    i.add_(2i64).unwrap();
    i.div_mode_(2i64, "floor").unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![3, -3]);
    i.relu_().unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![3, 0]);
    i.fill_(2.7).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![2, 2]);
    i.copy_(&f32s(&[1.9, -2.9], &[2])).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, -2]);
    i.fill_(&Tensor::scalar(4i64)).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![4, 4]);
    // f32 destination with an f64 operand: computed in f64, cast back
    let y = f32s(&[1.0], &[1]);
    y.add_(&Tensor::from_vec(vec![0.5f64], &[1]).unwrap()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.5]);
    // f16 destination
    let h = f32s(&[1.0, 2.0], &[2]).to_dtype(DType::F16).unwrap();
    h.mul_(3.0).unwrap();
    assert_eq!(h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    // broadcast source into a transposed destination
    let base = f32s(&[0.0; 6], &[2, 3]);
    let t = base.t().unwrap();
    t.add_(&f32s(&[1.0, 2.0], &[2])).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    // large contiguous in-place (parallel path)
    let n = 100_000;
    let big = Tensor::from_vec(vec![1.0f32; n], &[n]).unwrap();
    let other = Tensor::from_vec((0..n).map(|v| v as f32).collect(), &[n]).unwrap();
    big.add_(&other).unwrap();
    let v = big.to_vec::<f32>().unwrap();
    assert_eq!((v[0], v[n - 1]), (1.0, n as f32));
}

#[test]
fn inplace_bad_input_messages() {
    let i = i64s(&[1, 2, 3], &[3]);
    let v = i.version();
    assert_eq!(err(i.add_(1.5)), "add_: dtype error: result type Float can't be cast to the desired output type Long");
    assert_eq!(err(i.add_(&f32s(&[1.0], &[1]))), "add_: dtype error: result type Float can't be cast to the desired output type Long");
    assert_eq!(err(i.div_(2i64)), "div_: dtype error: result type Float can't be cast to the desired output type Long");
    assert_eq!(err(i.sigmoid_()), "sigmoid_: dtype error: result type Float can't be cast to the desired output type Long");
    assert_eq!(err(i.clamp_(0.5, None::<f64>)), "clamp_: dtype error: result type Float can't be cast to the desired output type Long");
    let b = bools(&[true, false]);
    assert_eq!(err(b.mul_(2i64)), "mul_: dtype error: result type Long can't be cast to the desired output type Bool");
    assert!(err(b.neg_()).starts_with("neg_: dtype error: Negation, the `-` operator, on a bool tensor is not supported."));
    assert!(err(b.sub_(&b)).starts_with("sub_: dtype error: Subtraction, the `-` operator, with two bool tensors"));
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
    assert_eq!(i.version(), v, "failed in-place ops must not bump the version");
    // result shape must equal the destination shape
    let x = f32s(&[0.0; 3], &[3]);
    assert_eq!(
        err(x.add_(&f32s(&[1.0; 6], &[2, 3]))),
        "add_: shape error: output with shape [3] doesn't match the broadcast shape [2, 3]"
    );
    // writing into an expanded (overlapping) tensor
    let e = f32s(&[0.0; 3], &[3, 1]).expand(&[3, 4]).unwrap();
    let msg = "unsupported operation: more than one element of the written-to tensor refers to a single memory location (shape [3, 4], strides [1, 0]). Please clone() the tensor before performing the operation.";
    assert_eq!(err(e.add_(1.0)), format!("add_: invalid argument: {msg}"));
    assert_eq!(err(e.relu_()), format!("relu_: invalid argument: {msg}"));
    assert_eq!(err(e.copy_(&f32s(&[1.0; 12], &[3, 4]))), format!("copy_: invalid argument: {msg}"));
    // fill_ and zero_ may write an expanded tensor (every write is the same value)
    e.fill_(1.0).unwrap();
    assert_eq!(e.to_vec::<f32>().unwrap(), vec![1.0; 12]);
    e.zero_().unwrap();
    assert_eq!(
        err(x.fill_(&f32s(&[1.0, 2.0], &[2]))),
        "fill_: shape error: fill_ only supports 0-dimension value tensor but got tensor with 1 dimensions."
    );
    assert_eq!(
        err(x.copy_(&f32s(&[1.0; 2], &[2]))),
        "copy_: shape error: shapes [3] and [2] are not broadcastable: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0"
    );
    assert_eq!(
        err(x.copy_(&f32s(&[1.0; 6], &[2, 3]))),
        "copy_: shape error: the source of shape [2, 3] cannot be broadcast to the destination shape [3]"
    );
}

#[test]
fn operator_overloads() {
    let a = f32s(&[1.0, 2.0], &[2]);
    let b = f32s(&[10.0, 20.0], &[2]);
    assert_eq!((&a + &b).unwrap().to_vec::<f32>().unwrap(), vec![11.0, 22.0]);
    assert_eq!((&b - &a).unwrap().to_vec::<f32>().unwrap(), vec![9.0, 18.0]);
    assert_eq!((&a * 3.0).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    assert_eq!((&b / 2i64).unwrap().to_vec::<f32>().unwrap(), vec![5.0, 10.0]);
    assert_eq!((&b % 3.0).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert_eq!((-&a).unwrap().to_vec::<f32>().unwrap(), vec![-1.0, -2.0]);
    assert_eq!((2.0 * &a).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!((1.0 - &a).unwrap().to_vec::<f32>().unwrap(), vec![0.0, -1.0]);
    assert_eq!((1.0 / &a).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 0.5]);
    assert_eq!((5i64 + &a).unwrap().to_vec::<f32>().unwrap(), vec![6.0, 7.0]);
    assert_eq!((Scalar::Float(0.5) * &a).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 1.0]);
    assert_eq!((a.clone() + b.clone()).unwrap().to_vec::<f32>().unwrap(), vec![11.0, 22.0]);
    // chaining through Result
    let c = (&a + &b + &a).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![12.0, 24.0]);
    let d = (&a * (&b + 1.0)).unwrap();
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![11.0, 42.0]);
    // int tensor: number / tensor gives float, number % tensor stays int
    let i = i64s(&[1, 2, -3], &[3]);
    let r = (1i64 / &i).unwrap();
    assert_eq!(r.dtype(), DType::F32);
    close(&r.to_vec::<f32>().unwrap(), &[1.0, 0.5, -0.33333334]);
    assert_eq!((5i64 % &i).unwrap().to_vec::<i64>().unwrap(), vec![0, 1, -1]);
    assert_eq!((1i64 - &i).unwrap().to_vec::<i64>().unwrap(), vec![0, -1, 4]);
    // errors propagate
    let bad = f32s(&[1.0; 3], &[3]);
    assert!(err(&a + &bad).starts_with("add: shape error"));
    assert!(err((&a + &bad) * &a).starts_with("add: shape error"));
    assert!(err(-bools(&[true])).starts_with("neg: dtype error"));
}

#[test]
fn free_functions_match_methods() {
    let x = f32s(&[-1.0, 0.5], &[2]);
    assert_eq!(unary::relu(&x).unwrap().to_vec::<f32>().unwrap(), x.relu().unwrap().to_vec::<f32>().unwrap());
    assert_eq!(unary::gelu(&x, "tanh").unwrap().to_vec::<f32>().unwrap(), x.gelu("tanh").unwrap().to_vec::<f32>().unwrap());
    assert_eq!(unary::clamp(&x, 0.0, 0.2).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.2]);
    assert_eq!(binary::add(&x, 1.0).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 1.5]);
    assert_eq!(binary::sub(&x, &x).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    assert_eq!(binary::rsub(&x, 1.0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 0.5]);
    assert_eq!(compare::gt(&x, 0.0).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
    assert_eq!(compare::logical_not(&x).unwrap().to_vec::<bool>().unwrap(), vec![false, false]);
}

#[test]
fn empty_and_zero_dim_tensors() {
    let e = Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap();
    assert_eq!(e.exp().unwrap().shape(), &[0, 3]);
    assert_eq!(e.add(&f32s(&[1.0, 2.0, 3.0], &[3])).unwrap().shape(), &[0, 3]);
    e.add_(1.0).unwrap();
    let s = Tensor::scalar(2.0f32);
    let r = s.mul(&s).unwrap();
    assert_eq!(r.shape(), &[] as &[usize]);
    assert_eq!(r.item().unwrap(), 4.0);
    s.add_(1.0).unwrap();
    assert_eq!(s.item().unwrap(), 3.0);
}

// ---- element semantics (ops::num) and Display ----
mod num_semantics {
    use ferrofx_core::ops::num::*;
    use ferrofx_core::DType;

    #[test]
    fn integer_semantics_follow_pytorch() {
        assert_eq!(Num::div_floor(-3i64, 2), -2);
        assert_eq!(Num::div_trunc(-3i64, 2), -1);
        assert_eq!(Num::remainder(-3i64, 2), 1);
        assert_eq!(Num::remainder(3i64, -2), -1);
        assert_eq!(Num::fmod(-3i64, 2), -1);
        assert_eq!(Num::pow(2i64, 10), 1024);
        assert_eq!(Num::pow(2i64, -1), 0);
        assert_eq!(Num::pow(-1i64, -3), -1);
        assert_eq!(Num::div_trunc(i64::MIN, -1), i64::MIN);
        assert_eq!(Num::remainder(i64::MIN, -1), 0);
        assert_eq!(Num::abs(-128i8), -128);
    }

    #[test]
    fn float_semantics_follow_pytorch() {
        assert_eq!(Num::div_floor(-2.5f32, 0.7), -4.0);
        assert_eq!(Num::remainder(-2.5f32, 2.0), 1.5);
        assert_eq!(Num::remainder(1.5f64, -2.0), -0.5);
        assert!(Num::remainder(1.0f64, 0.0).is_nan());
        assert!(Num::maximum(f32::NAN, 1.0).is_nan());
        assert_eq!(Num::sign(-0.0f32), 0.0);
        assert!(Num::sign(f64::NAN).is_nan());
        assert!(!can_cast(DType::F32, DType::I64));
        assert!(!can_cast(DType::I64, DType::Bool));
        assert!(can_cast(DType::Bool, DType::U8));
    }
}

mod display {
    use ferrofx_core::Tensor;

    #[test]
    fn display_like_pytorch() {
        let t = Tensor::from_vec(vec![1.0f32, 2.5, -3.0, 4.0], &[2, 2]).unwrap();
        assert_eq!(t.to_string(), "tensor([[ 1.0000,  2.5000],\n        [-3.0000,  4.0000]])");
        let i = Tensor::from_vec(vec![1i32, -20], &[2]).unwrap();
        assert_eq!(i.to_string(), "tensor([  1, -20], dtype=torch.int32)");
        let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
        assert_eq!(b.to_string(), "tensor([ True, False])");
        let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        assert_eq!(w.to_string(), "tensor([1., 2.])");
        assert_eq!(Tensor::scalar(3i64).to_string(), "tensor(3)");
        let big = Tensor::from_vec((0..2000).map(|v| v as i64).collect(), &[2000]).unwrap();
        assert_eq!(big.to_string(), "tensor([   0,    1,    2, ..., 1997, 1998, 1999])");
    }
}
