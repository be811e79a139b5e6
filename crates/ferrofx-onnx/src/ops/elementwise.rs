//! Elementwise ONNX ops: unary math and activations, binary arithmetic with ONNX's
//! broadcasting (numpy's, the same as PyTorch's), comparisons, logic, variadic `Sum`/`Max`/...

use super::{call, callk, scalar_of, v, Convert, Node};
use ferrofx_core::{DType, Result, Tensor, Value};

fn unary(n: &Node<'_>, op: &str) -> Result<Vec<Tensor>> {
    Ok(vec![call(op, vec![v(n.x(0)?)])?])
}

fn binary(n: &Node<'_>, op: &str) -> Result<Vec<Tensor>> {
    Ok(vec![call(op, vec![v(n.x(0)?), v(n.x(1)?)])?])
}

/// Casts `t` to `dtype` when it differs.
pub(crate) fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t.clone())
    } else {
        call("to", vec![v(t), Value::DType(dtype)])
    }
}

fn mul_s(t: &Tensor, s: f64) -> Result<Tensor> {
    call("mul", vec![v(t), Value::Float(s)])
}

fn add_s(t: &Tensor, s: f64) -> Result<Tensor> {
    call("add", vec![v(t), Value::Float(s)])
}

fn div(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (a, b) = (n.x(0)?, n.x(1)?);
    let out = if a.dtype().is_floating_point() {
        call("div", vec![v(a), v(b)])?
    } else {
        // ONNX integer division truncates (C semantics).
        callk("div", vec![v(a), v(b)], vec![("rounding_mode", Value::Str("trunc".into()))])?
    };
    Ok(vec![out])
}

fn pow(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (a, b) = (n.x(0)?, n.x(1)?);
    // ONNX: the result has the base's type.
    let out = if a.dtype().is_floating_point() {
        call("pow", vec![v(a), v(&cast(b, a.dtype())?)])?
    } else {
        cast(&call("pow", vec![v(&cast(a, DType::F64)?), v(&cast(b, DType::F64)?)])?, a.dtype())?
    };
    Ok(vec![out])
}

fn modulo(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let op = if n.i("fmod", 0) == 1 { "fmod" } else { "remainder" };
    binary(n, op)
}

fn variadic(n: &Node<'_>, op: &str) -> Result<Vec<Tensor>> {
    let mut acc = n.x(0)?.clone();
    for i in 1..n.inputs.len() {
        acc = call(op, vec![v(&acc), v(n.x(i)?)])?;
    }
    Ok(vec![acc])
}

fn mean(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let sum = variadic(n, "add")?.remove(0);
    Ok(vec![call("div", vec![v(&sum), Value::Float(n.inputs.len() as f64)])?])
}

fn clip(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let (lo, hi) = if n.opset < 11 {
        (Value::Float(n.f("min", f32::MIN)), Value::Float(n.f("max", f32::MAX)))
    } else {
        (n.opt(1).map(v).unwrap_or(Value::None), n.opt(2).map(v).unwrap_or(Value::None))
    };
    if matches!((&lo, &hi), (Value::None, Value::None)) {
        return Ok(vec![x.clone()]);
    }
    Ok(vec![call("clamp", vec![v(x), lo, hi])?])
}

fn leaky_relu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![call("leaky_relu", vec![v(n.x(0)?), Value::Float(n.f("alpha", 0.01))])?])
}

fn elu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![call("elu", vec![v(n.x(0)?), Value::Float(n.f("alpha", 1.0))])?])
}

fn selu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let e = call("elu", vec![v(n.x(0)?), Value::Float(n.f("alpha", 1.673_263_2))])?;
    Ok(vec![mul_s(&e, n.f("gamma", 1.050_701))?])
}

fn celu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    let x = n.x(0)?;
    let alpha = n.f("alpha", 1.0);
    let e = mul_s(&call("expm1", vec![v(&mul_s(x, 1.0 / alpha)?)])?, alpha)?;
    let zero = scalar_of(0.0, x.dtype())?;
    let pos = call("maximum", vec![v(x), v(&zero)])?;
    let neg = call("minimum", vec![v(&e), v(&zero)])?;
    Ok(vec![call("add", vec![v(&pos), v(&neg)])?])
}

fn hard_sigmoid(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (alpha, beta) = (n.f("alpha", 0.2), n.f("beta", 0.5));
    let x = n.x(0)?;
    if (alpha - 1.0 / 6.0).abs() < 1e-7 && (beta - 0.5).abs() < 1e-7 {
        return unary(n, "hardsigmoid");
    }
    let y = add_s(&mul_s(x, alpha)?, beta)?;
    Ok(vec![call("clamp", vec![v(&y), Value::Float(0.0), Value::Float(1.0)])?])
}

fn thresholded_relu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let mask = call("gt", vec![v(x), Value::Float(n.f("alpha", 1.0))])?;
    Ok(vec![call("where", vec![v(&mask), v(x), v(&scalar_of(0.0, x.dtype())?)])?])
}

fn prelu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, slope) = (n.x(0)?, n.x(1)?);
    // Opset < 7 broadcasts a per-channel slope [C] along axis 1.
    let slope = if n.opset < 7 && slope.ndim() == 1 && x.ndim() > 2 && x.shape()[1] == slope.numel() {
        let mut shape = vec![slope.numel() as i64];
        shape.extend(std::iter::repeat_n(1, x.ndim() - 2));
        &call("reshape", vec![v(slope), Value::Ints(shape)])?
    } else {
        slope
    };
    let mask = call("lt", vec![v(x), Value::Float(0.0)])?;
    let neg = call("mul", vec![v(x), v(slope)])?;
    Ok(vec![call("where", vec![v(&mask), v(&neg), v(x)])?])
}

fn gelu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let approx = n.s("approximate").unwrap_or_else(|| "none".into());
    Ok(vec![callk("gelu", vec![v(n.x(0)?)], vec![("approximate", Value::Str(approx))])?])
}

fn mish(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let sp = call("softplus", vec![v(x)])?;
    Ok(vec![call("mul", vec![v(x), v(&call("tanh", vec![v(&sp)])?)])?])
}

fn shrink(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let (bias, lambd) = (n.f("bias", 0.0), n.f("lambd", 0.5));
    let zero = scalar_of(0.0, x.dtype())?;
    let lo = call("lt", vec![v(x), Value::Float(-lambd)])?;
    let hi = call("gt", vec![v(x), Value::Float(lambd)])?;
    let x_plus = cast(&add_s(x, bias)?, x.dtype())?;
    let x_minus = cast(&add_s(x, -bias)?, x.dtype())?;
    let r = call("where", vec![v(&hi), v(&x_minus), v(&zero)])?;
    Ok(vec![call("where", vec![v(&lo), v(&x_plus), v(&r)])?])
}

fn softplus(n: &Node<'_>) -> Result<Vec<Tensor>> {
    unary(n, "softplus")
}

fn is_nan(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    Ok(vec![call("ne", vec![v(x), v(x)])?])
}

fn is_inf(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let (pos, neg) = (n.i("detect_positive", 1) != 0, n.i("detect_negative", 1) != 0);
    let p = call("eq", vec![v(x), Value::Float(f64::INFINITY)])?;
    let m = call("eq", vec![v(x), Value::Float(f64::NEG_INFINITY)])?;
    Ok(vec![match (pos, neg) {
        (true, true) => call("logical_or", vec![v(&p), v(&m)])?,
        (true, false) => p,
        (false, true) => m,
        (false, false) => call("logical_and", vec![v(&p), v(&m)])?, // never both: all false
    }])
}

/// `(exp(x) ± exp(-x)) / 2`.
fn exp_pair(x: &Tensor, plus: bool) -> Result<Tensor> {
    let a = call("exp", vec![v(x)])?;
    let b = call("exp", vec![v(&call("neg", vec![v(x)])?)])?;
    let s = call(if plus { "add" } else { "sub" }, vec![v(&a), v(&b)])?;
    mul_s(&s, 0.5)
}

fn sinh(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![exp_pair(n.x(0)?, false)?])
}

fn cosh(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![exp_pair(n.x(0)?, true)?])
}

fn asin(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // asin(x) = atan(x / sqrt(1 - x²))
    let x = n.x(0)?;
    let one_minus = call("rsub", vec![v(&call("mul", vec![v(x), v(x)])?), Value::Float(1.0)])?;
    let q = call("div", vec![v(x), v(&call("sqrt", vec![v(&one_minus)])?)])?;
    Ok(vec![call("atan", vec![v(&q)])?])
}

fn acos(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let a = asin(n)?.remove(0);
    Ok(vec![call("rsub", vec![v(&a), Value::Float(std::f64::consts::FRAC_PI_2)])?])
}

fn asinh(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // asinh(x) = sign(x) · log(|x| + sqrt(x² + 1))  (sign form keeps precision for x < 0)
    let x = n.x(0)?;
    let ax = call("abs", vec![v(x)])?;
    let r = call("sqrt", vec![v(&add_s(&call("mul", vec![v(x), v(x)])?, 1.0)?)])?;
    let l = call("log", vec![v(&call("add", vec![v(&ax), v(&r)])?)])?;
    Ok(vec![call("mul", vec![v(&call("sign", vec![v(x)])?), v(&l)])?])
}

fn acosh(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // acosh(x) = log(x + sqrt(x² - 1))
    let x = n.x(0)?;
    let r = call("sqrt", vec![v(&add_s(&call("mul", vec![v(x), v(x)])?, -1.0)?)])?;
    Ok(vec![call("log", vec![v(&call("add", vec![v(x), v(&r)])?)])?])
}

fn atanh(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // atanh(x) = 0.5 · (log1p(x) - log1p(-x))
    let x = n.x(0)?;
    let a = call("log1p", vec![v(x)])?;
    let b = call("log1p", vec![v(&call("neg", vec![v(x)])?)])?;
    Ok(vec![mul_s(&call("sub", vec![v(&a), v(&b)])?, 0.5)?])
}

fn where_(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![call("where", vec![v(n.x(0)?), v(n.x(1)?), v(n.x(2)?)])?])
}

fn sign(n: &Node<'_>) -> Result<Vec<Tensor>> {
    unary(n, "sign")
}

fn bitshift(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // x << y = x * 2^y, x >> y = floor(x / 2^y) for the unsigned types ONNX allows.
    let (x, y) = (n.x(0)?, n.x(1)?);
    let p = call("pow", vec![Value::Float(2.0), v(&cast(y, DType::F64)?)])?;
    let xf = cast(x, DType::F64)?;
    let r = match n.s("direction").as_deref() {
        Some("LEFT") => call("mul", vec![v(&xf), v(&p)])?,
        Some("RIGHT") => call("floor", vec![v(&call("div", vec![v(&xf), v(&p)])?)])?,
        other => return Err(n.err(format!("direction must be LEFT or RIGHT, got {other:?}"))),
    };
    Ok(vec![cast(&r, x.dtype())?])
}

fn swish_of(x: &Tensor, alpha: f64) -> Result<Tensor> {
    let sx = if alpha == 1.0 { x.clone() } else { mul_s(x, alpha)? };
    call("mul", vec![v(x), v(&call("sigmoid", vec![v(&sx)])?)])
}

fn swish(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![swish_of(n.x(0)?, n.f("alpha", 1.0))?])
}

fn swiglu(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (a, b) = (n.x(0)?, n.x(1)?);
    if a.shape() != b.shape() {
        return Err(n.err(format!("A {:?} and B {:?} must have the same shape", a.shape(), b.shape())));
    }
    Ok(vec![call("mul", vec![v(&swish_of(a, n.f("alpha", 1.0))?), v(b)])?])
}

fn bitwise_not(n: &Node<'_>) -> Result<Vec<Tensor>> {
    // Two's complement: !x = -x - 1 (signed), 255 - x (uint8).
    let x = n.x(0)?;
    Ok(vec![match x.dtype() {
        DType::Bool => call("logical_not", vec![v(x)])?,
        DType::U8 => call("rsub", vec![v(x), Value::Int(255)])?,
        d if d.is_floating_point() => return Err(n.err(format!("needs an integer input, got {d:?}"))),
        _ => call("sub", vec![v(&call("neg", vec![v(x)])?), Value::Int(1)])?,
    }])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[
    ("Abs", |n| unary(n, "abs")),
    ("Neg", |n| unary(n, "neg")),
    ("Exp", |n| unary(n, "exp")),
    ("Log", |n| unary(n, "log")),
    ("Sqrt", |n| unary(n, "sqrt")),
    ("Reciprocal", |n| unary(n, "reciprocal")),
    ("Floor", |n| unary(n, "floor")),
    ("Ceil", |n| unary(n, "ceil")),
    ("Round", |n| unary(n, "round")),
    ("Sign", sign),
    ("Erf", |n| unary(n, "erf")),
    ("Sin", |n| unary(n, "sin")),
    ("Cos", |n| unary(n, "cos")),
    ("Tan", |n| unary(n, "tan")),
    ("Atan", |n| unary(n, "atan")),
    ("Asin", asin),
    ("Acos", acos),
    ("Sinh", sinh),
    ("Cosh", cosh),
    ("Asinh", asinh),
    ("Acosh", acosh),
    ("Atanh", atanh),
    ("Tanh", |n| unary(n, "tanh")),
    ("Sigmoid", |n| unary(n, "sigmoid")),
    ("Relu", |n| unary(n, "relu")),
    ("Softplus", softplus),
    ("Softsign", |n| unary(n, "softsign")),
    ("HardSwish", |n| unary(n, "hardswish")),
    ("HardSigmoid", hard_sigmoid),
    ("LeakyRelu", leaky_relu),
    ("Elu", elu),
    ("Selu", selu),
    ("Celu", celu),
    ("ThresholdedRelu", thresholded_relu),
    ("PRelu", prelu),
    ("Gelu", gelu),
    ("Mish", mish),
    ("Shrink", shrink),
    ("Not", |n| unary(n, "logical_not")),
    ("IsNaN", is_nan),
    ("IsInf", is_inf),
    ("Add", |n| binary(n, "add")),
    ("Sub", |n| binary(n, "sub")),
    ("Mul", |n| binary(n, "mul")),
    ("Div", div),
    ("Pow", pow),
    ("Mod", modulo),
    ("BitShift", bitshift),
    ("Equal", |n| binary(n, "eq")),
    ("Less", |n| binary(n, "lt")),
    ("LessOrEqual", |n| binary(n, "le")),
    ("Greater", |n| binary(n, "gt")),
    ("GreaterOrEqual", |n| binary(n, "ge")),
    ("And", |n| binary(n, "logical_and")),
    ("Or", |n| binary(n, "logical_or")),
    ("Xor", |n| binary(n, "logical_xor")),
    ("Max", |n| variadic(n, "maximum")),
    ("Min", |n| variadic(n, "minimum")),
    ("Sum", |n| variadic(n, "add")),
    ("Mean", mean),
    ("Clip", clip),
    ("Where", where_),
    ("Swish", swish),
    ("SwiGLU", swiglu),
    ("BitwiseNot", bitwise_not),
];
