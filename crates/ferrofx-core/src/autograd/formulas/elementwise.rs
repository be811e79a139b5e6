//! Backward formulas of the elementwise family (`ops/unary.rs`, `ops/binary.rs`,
//! `ops/compare.rs::where`, `ops/inplace.rs`). The op macros there look formulas up by op name
//! with the `const fn`s [`backward_for`] / [`saves_for`], so each op keeps a one-line hook.

use super::prims::{self as p, g0, scale, shape_i64, zeros, Grads};
use crate::autograd::BackwardCtx;
use crate::error::Result;
use crate::op::BackwardFn;
use crate::op::Saves;
use crate::tensor::Tensor;
use crate::value::Value;

const fn eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The base op of an in-place name (`add_` → `add`).
const fn base(name: &str) -> &str {
    let b = name.as_bytes();
    if b.len() > 1 && b[b.len() - 1] == b'_' {
        match name.split_at_checked(b.len() - 1) {
            Some((h, _)) => h,
            None => name,
        }
    } else {
        name
    }
}

macro_rules! table {
    ($($name:literal => $f:ident, $saves:expr;)*) => {
        /// The backward formula of an elementwise op, by name (in-place forms share the base's).
        pub const fn backward_for(name: &str) -> Option<BackwardFn> {
            let n = base(name);
            $( if eq(n, $name) { return Some($f); } )*
            None
        }
        /// What the formula of [`backward_for`] needs saved.
        pub const fn saves_for(name: &str) -> Saves {
            let n = base(name);
            $( if eq(n, $name) { return $saves; } )*
            Saves::NOTHING
        }
    };
}

const IN0: Saves = Saves::inputs(1);
const IN01: Saves = Saves::inputs(0b11);
const OUT0: Saves = Saves::outputs(1);

table! {
    "add" => add_bw, Saves::NOTHING;
    "sub" => sub_bw, Saves::NOTHING;
    "rsub" => rsub_bw, Saves::NOTHING;
    "mul" => mul_bw, IN01;
    "div" => div_bw, IN01;
    "pow" => pow_bw, Saves { inputs: 0b11, outputs: 1 };
    "maximum" => maximum_bw, IN01;
    "minimum" => minimum_bw, IN01;
    "remainder" => remainder_bw, IN01;
    "fmod" => remainder_bw, IN01;
    "neg" => neg_bw, Saves::NOTHING;
    "exp" => exp_bw, OUT0;
    "expm1" => expm1_bw, OUT0;
    "log" => log_bw, IN0;
    "log1p" => log1p_bw, IN0;
    "log2" => log2_bw, IN0;
    "log10" => log10_bw, IN0;
    "sqrt" => sqrt_bw, OUT0;
    "rsqrt" => rsqrt_bw, OUT0;
    "sin" => sin_bw, IN0;
    "cos" => cos_bw, IN0;
    "tan" => tan_bw, OUT0;
    "atan" => atan_bw, IN0;
    "tanh" => tanh_bw, OUT0;
    "sigmoid" => sigmoid_bw, OUT0;
    "reciprocal" => reciprocal_bw, OUT0;
    "erf" => erf_bw, IN0;
    "silu" => silu_bw, IN0;
    "selu" => elu_bw, Saves { inputs: 1, outputs: 1 };
    "elu" => elu_bw, Saves { inputs: 1, outputs: 1 };
    "hardswish" => hardswish_bw, IN0;
    "hardsigmoid" => hardsigmoid_bw, IN0;
    "softsign" => softsign_bw, IN0;
    "gelu" => gelu_bw, IN0;
    "leaky_relu" => leaky_relu_bw, IN0;
    "softplus" => softplus_bw, IN0;
    "abs" => abs_bw, IN0;
    "relu" => relu_bw, OUT0;
    "sign" => zero_bw, Saves::NOTHING;
    "floor" => zero_bw, Saves::NOTHING;
    "ceil" => zero_bw, Saves::NOTHING;
    "trunc" => zero_bw, Saves::NOTHING;
    "round" => zero_bw, Saves::NOTHING;
    "hardtanh" => hardtanh_bw, IN0;
    "relu6" => hardtanh_bw, IN0;
    "clamp" => clamp_bw, Saves::inputs(0b111);
    "clamp_min" => clamp_min_bw, IN01;
    "clamp_max" => clamp_max_bw, IN01;
    "where" => where_bw, Saves::inputs(1);
}

/// Reduces a broadcast gradient to argument `i`'s shape (None for number arguments).
fn fit(ctx: &BackwardCtx<'_>, i: usize, g: Result<Tensor>) -> Result<Option<Tensor>> {
    if !ctx.is_tensor_arg(i) || !ctx.needs_grad(i) {
        return Ok(None);
    }
    let g = g?;
    let m = ctx.input_meta(i)?;
    let g = if g.shape() != &m.shape[..] { g.sum_to_size(&shape_i64(&m.shape))? } else { g };
    Ok(Some(if g.dtype() != m.dtype && m.dtype.is_floating_point() { g.to_dtype(m.dtype)? } else { g }))
}

fn alpha(ctx: &BackwardCtx<'_>) -> f64 {
    match ctx.arg(2) {
        Value::Int(v) => *v as f64,
        Value::Float(v) => *v,
        Value::Bool(b) => *b as i64 as f64,
        _ => 1.0,
    }
}

fn lazy<T>(ctx: &BackwardCtx<'_>, i: usize, f: impl FnOnce() -> Result<T>) -> Result<T>
where
    T: Default,
{
    if ctx.is_tensor_arg(i) && ctx.needs_grad(i) {
        f()
    } else {
        Ok(T::default())
    }
}

fn add_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let a = alpha(ctx);
    Ok(vec![
        fit(ctx, 0, Ok(g.clone()))?,
        fit(ctx, 1, lazy(ctx, 1, || scale(g, a).map(Some)).map(|o| o.unwrap_or_else(|| g.clone())))?,
    ])
}
fn sub_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let a = alpha(ctx);
    Ok(vec![fit(ctx, 0, Ok(g.clone()))?, fit(ctx, 1, scale_neg(ctx, 1, g, a))?])
}
fn scale_neg(ctx: &BackwardCtx<'_>, i: usize, g: &Tensor, a: f64) -> Result<Tensor> {
    if ctx.is_tensor_arg(i) && ctx.needs_grad(i) {
        if a == 1.0 {
            p::neg(g)
        } else {
            scale(g, -a)
        }
    } else {
        Ok(g.clone())
    }
}
fn rsub_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let a = alpha(ctx);
    Ok(vec![fit(ctx, 0, scale_neg(ctx, 0, g, a))?, fit(ctx, 1, Ok(g.clone()))?])
}
fn mul_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let gi = if ctx.needs_grad(0) {
        fit(
            ctx,
            0,
            match ctx.arg(1) {
                Value::Tensor(b) => p::mul(g, b),
                b => p::mul(g, b.clone()),
            },
        )?
    } else {
        None
    };
    let go = if ctx.is_tensor_arg(1) && ctx.needs_grad(1) { fit(ctx, 1, p::mul(g, ctx.input(0)?))? } else { None };
    Ok(vec![gi, go])
}
fn div_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    if matches!(ctx.arg(2), Value::Str(_)) {
        let m = ctx.input_meta(0)?;
        return Ok(vec![Some(zeros(&m.shape, g.dtype())?)]);
    }
    let other = ctx.arg(1).clone();
    let gi = if ctx.needs_grad(0) { fit(ctx, 0, p::div(g, other.clone()))? } else { None };
    let go = if ctx.is_tensor_arg(1) && ctx.needs_grad(1) {
        let b = ctx.input(1)?;
        fit(ctx, 1, p::neg(&p::div(&p::mul(g, ctx.input(0)?)?, &p::mul(b, b)?)?))?
    } else {
        None
    };
    Ok(vec![gi, go])
}
fn pow_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let (base_v, exp_v) = (ctx.arg(0).clone(), ctx.arg(1).clone());
    let gi = if ctx.is_tensor_arg(0) && ctx.needs_grad(0) {
        let x = ctx.input(0)?;
        // e * x^(e-1), zero where e == 0
        let r = match &exp_v {
            Value::Tensor(e) => {
                let d = p::mul(e, &p::pow(x, &p::sub(e, 1.0)?)?)?;
                p::where_(&p::eq(e, 0.0)?, 0.0, &d)?
            }
            v => {
                let e = v.as_scalar().map(|s| s.to_f64()).unwrap_or(1.0);
                if e == 0.0 {
                    zeros(x.shape(), g.dtype())?
                } else {
                    scale(&p::pow(x, e - 1.0)?, e)?
                }
            }
        };
        fit(ctx, 0, p::mul(g, &r))?
    } else {
        None
    };
    let ge = if ctx.is_tensor_arg(1) && ctx.needs_grad(1) {
        let out = ctx.output(0)?;
        let e = ctx.input(1)?;
        let r = match &base_v {
            Value::Tensor(x) => {
                let d = p::mul(out, &p::log(x)?)?;
                p::where_(&p::logical_and(&p::eq(x, 0.0)?, &p::ge_(e, 0.0)?)?, 0.0, &d)?
            }
            v => {
                let b = v.as_scalar().map(|s| s.to_f64()).unwrap_or(1.0);
                scale(out, b.ln())?
            }
        };
        fit(ctx, 1, p::mul(g, &r))?
    } else {
        None
    };
    Ok(vec![gi, ge])
}
fn maximum_bw(ctx: &BackwardCtx<'_>) -> Grads {
    minmax(ctx, true)
}
fn minimum_bw(ctx: &BackwardCtx<'_>) -> Grads {
    minmax(ctx, false)
}
fn minmax(ctx: &BackwardCtx<'_>, max: bool) -> Grads {
    let g = g0(ctx)?;
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let tie = p::eq(a, b)?;
    let wins_a = if max { p::gt_(a, b)? } else { p::lt_(a, b)? };
    let wa = p::where_(&tie, 0.5, &wins_a.to_dtype(g.dtype())?)?;
    let wb = p::where_(&tie, 0.5, &p::logical_not(&p::logical_or(&wins_a, &tie)?)?.to_dtype(g.dtype())?)?;
    Ok(vec![fit(ctx, 0, p::mul(g, &wa))?, fit(ctx, 1, p::mul(g, &wb))?])
}
fn remainder_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let gi = fit(ctx, 0, Ok(g.clone()))?;
    let go = if ctx.is_tensor_arg(1) && ctx.needs_grad(1) {
        let mode = if ctx.op().name.starts_with("fmod") { "trunc" } else { "floor" };
        let q = crate::op::call(
            "div",
            vec![ctx.arg(0).clone(), ctx.arg(1).clone()],
            vec![("rounding_mode".into(), Value::Str(mode.into()))],
        )?
        .swap_remove(0);
        fit(ctx, 1, p::neg(&p::mul(g, &q)?))?
    } else {
        None
    };
    Ok(vec![gi, go])
}

fn one(ctx: &BackwardCtx<'_>, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Grads {
    let g = g0(ctx)?;
    Ok(vec![fit(ctx, 0, f(g))?])
}
fn x0<'a>(ctx: &'a BackwardCtx<'_>) -> Result<&'a Tensor> {
    ctx.input(0)
}
fn y0<'a>(ctx: &'a BackwardCtx<'_>) -> Result<&'a Tensor> {
    ctx.output(0)
}
fn sc(ctx: &BackwardCtx<'_>, i: usize, d: f64) -> f64 {
    ctx.arg(i).as_scalar().map(|s| s.to_f64()).unwrap_or(d)
}

fn neg_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, p::neg)
}
fn exp_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::mul(g, y0(ctx)?))
}
fn expm1_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::mul(g, &p::add(y0(ctx)?, 1.0)?))
}
fn log_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::div(g, x0(ctx)?))
}
fn log1p_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::div(g, &p::add(x0(ctx)?, 1.0)?))
}
fn log2_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::div(g, &scale(x0(ctx)?, std::f64::consts::LN_2)?))
}
fn log10_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::div(g, &scale(x0(ctx)?, std::f64::consts::LN_10)?))
}
fn sqrt_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::div(g, &scale(y0(ctx)?, 2.0)?))
}
fn rsqrt_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let y = y0(ctx)?;
        p::mul(g, &scale(&p::mul(&p::mul(y, y)?, y)?, -0.5)?)
    })
}
fn sin_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::mul(g, &p::cos(x0(ctx)?)?))
}
fn cos_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::mul(g, &p::neg(&p::sin(x0(ctx)?)?)?))
}
fn tan_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let y = y0(ctx)?;
        p::mul(g, &p::add(&p::mul(y, y)?, 1.0)?)
    })
}
fn atan_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let x = x0(ctx)?;
        p::div(g, &p::add(&p::mul(x, x)?, 1.0)?)
    })
}
fn tanh_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let y = y0(ctx)?;
        if let Some(r) = p::direct2!(g, y, |g, y| g * (1.0 - y * y)) {
            return r;
        }
        p::mul(g, &p::rsub_(&p::mul(y, y)?, 1.0)?)
    })
}
fn sigmoid_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let y = y0(ctx)?;
        if let Some(r) = p::direct2!(g, y, |g, y| g * (y * (1.0 - y))) {
            return r;
        }
        p::mul(g, &p::mul(y, &p::rsub_(y, 1.0)?)?)
    })
}
fn reciprocal_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let y = y0(ctx)?;
        p::mul(g, &p::neg(&p::mul(y, y)?)?)
    })
}
fn erf_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let x = x0(ctx)?;
        let e = p::exp(&p::neg(&p::mul(x, x)?)?)?;
        p::mul(g, &scale(&e, std::f64::consts::FRAC_2_SQRT_PI)?)
    })
}
fn silu_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let x = x0(ctx)?;
        let s = p::sigmoid(x)?;
        let d = p::mul(&s, &p::add(&p::mul(x, &p::rsub_(&s, 1.0)?)?, 1.0)?)?;
        p::mul(g, &d)
    })
}
fn elu_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let selu = ctx.op().name.starts_with("selu");
    let (alpha, sc_, is) = if selu {
        (1.673_263_242_354_377_3, 1.050_700_987_355_480_5, 1.0)
    } else {
        (sc(ctx, 1, 1.0), sc(ctx, 2, 1.0), sc(ctx, 3, 1.0))
    };
    one(ctx, |g| {
        let x = x0(ctx)?;
        let y = y0(ctx)?;
        let neg = scale(&p::add(y, alpha * sc_)?, is)?;
        let d = p::where_(&p::gt_(x, 0.0)?, sc_, &neg)?;
        p::mul(g, &d)
    })
}
fn hardswish_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let x = x0(ctx)?;
        let mid = scale(&p::add(&scale(x, 2.0)?, 3.0)?, 1.0 / 6.0)?;
        let d = p::where_(&p::lt_(x, -3.0)?, 0.0, &p::where_(&p::le_(x, 3.0)?, &mid, 1.0)?)?;
        p::mul(g, &d)
    })
}
fn hardsigmoid_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let x = x0(ctx)?;
        let inside = p::logical_and(&p::gt_(x, -3.0)?, &p::lt_(x, 3.0)?)?;
        p::mul(g, &scale(&inside.to_dtype(g.dtype())?, 1.0 / 6.0)?)
    })
}
fn softsign_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let d = p::add(&p::abs(x0(ctx)?)?, 1.0)?;
        p::div(g, &p::mul(&d, &d)?)
    })
}
fn gelu_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let tanh_approx = matches!(ctx.arg(1), Value::Str(s) if s == "tanh");
    one(ctx, |g| {
        let x = x0(ctx)?;
        let d = if tanh_approx {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let x2 = p::mul(x, x)?;
            let inner = scale(&p::add(x, &scale(&p::mul(&x2, x)?, 0.044715)?)?, k)?;
            let t = p::tanh(&inner)?;
            let dinner = scale(&p::add(&scale(&x2, 3.0 * 0.044715)?, 1.0)?, k)?;
            let left = scale(&p::add(&t, 1.0)?, 0.5)?;
            let right = p::mul(&scale(&p::mul(x, &p::rsub_(&p::mul(&t, &t)?, 1.0)?)?, 0.5)?, &dinner)?;
            p::add(&left, &right)?
        } else {
            let cdf =
                scale(&p::add(&p::call("erf", vec![scale(x, std::f64::consts::FRAC_1_SQRT_2)?.into()])?, 1.0)?, 0.5)?;
            let pdf = scale(&p::exp(&scale(&p::mul(x, x)?, -0.5)?)?, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
            p::add(&cdf, &p::mul(x, &pdf)?)?
        };
        p::mul(g, &d)
    })
}
fn leaky_relu_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let slope = sc(ctx, 1, 0.01);
    if ctx.op().name == "leaky_relu_" && slope < 0.0 {
        return Err(crate::error::Error::autograd(
            "leaky_relu_",
            "In-place leakyReLu backward calculation is triggered with a negative slope which is not supported. This is caused by calling in-place forward function with a negative slope, please call out-of-place version instead.",
        ));
    }
    one(ctx, |g| {
        let x = x0(ctx)?;
        p::where_(&p::gt_(x, 0.0)?, g, &scale(g, slope)?)
    })
}
fn softplus_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let (beta, th) = (sc(ctx, 1, 1.0), sc(ctx, 2, 20.0));
    one(ctx, |g| {
        let x = x0(ctx)?;
        let bx = scale(x, beta)?;
        let s = p::sigmoid(&bx)?;
        p::where_(&p::gt_(&bx, th)?, g, &p::mul(g, &s)?)
    })
}
fn abs_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| p::mul(g, &p::sign(x0(ctx)?)?))
}
fn relu_bw(ctx: &BackwardCtx<'_>) -> Grads {
    one(ctx, |g| {
        let y = y0(ctx)?;
        // g * (y > 0) with the mask as 1.0 / 0.0, as the dispatched ops compute it.
        if let Some(r) = p::direct2!(g, y, |g, y| if y > 0.0 { g * 1.0 } else { g * 0.0 }) {
            return r;
        }
        p::mul(g, &p::gt_(y, 0.0)?)
    })
}
/// `fill_(value)` / `zero_()`: the overwritten tensor gets a zero gradient, a tensor `value`
/// the sum of the output gradient (PyTorch's FillBackward2/3, ZeroBackward0).
pub(crate) fn fill_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let m = ctx.input_meta(0)?;
    let z = if ctx.needs_grad(0) { Some(zeros(&m.shape, g.dtype())?) } else { None };
    if ctx.args().len() > 1 && ctx.is_tensor_arg(1) {
        return Ok(vec![z, fit(ctx, 1, g.sum())?]);
    }
    Ok(vec![z])
}
/// `copy_(src)`: the overwritten tensor gets a zero gradient, `src` the output gradient reduced
/// to its shape and converted to its dtype (PyTorch's CopyBackwards).
pub(crate) fn copy_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let m = ctx.input_meta(0)?;
    let z = if ctx.needs_grad(0) { Some(zeros(&m.shape, g.dtype())?) } else { None };
    Ok(vec![z, fit(ctx, 1, Ok(g.clone()))?, None])
}
fn zero_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let m = ctx.input_meta(0)?;
    Ok(vec![Some(zeros(&m.shape, g0(ctx)?.dtype())?)])
}
fn hardtanh_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let (lo, hi) = if ctx.op().name.starts_with("relu6") { (0.0, 6.0) } else { (sc(ctx, 1, -1.0), sc(ctx, 2, 1.0)) };
    one(ctx, |g| {
        let x = x0(ctx)?;
        let inside = p::logical_and(&p::gt_(x, lo)?, &p::lt_(x, hi)?)?;
        p::mul(g, &inside)
    })
}
/// PyTorch 2.15's conventions (goldens `clamp_at_bounds`, `clamp_tensor_bounds`,
/// `clamp_*_ties` from `scripts/goldens/gen_grads.py`):
///
/// * number bounds (ClampBackward1): the gradient passes where `min < x < max` (zero at the
///   bounds and where `x` is NaN), as hardtanh;
/// * one tensor bound (ClampBackward0 with `max=None`, same as `clamp_min`/`clamp_max` with a
///   tensor): [`clamp_one_tensor_bw`];
/// * two bounds, one a tensor (ClampBackward0): `x` gets it where `!(x < min) && !(x > max)`
///   (so NaN in `x` or in the bound it is compared with passes), `min` where `x < min` and
///   `min <= max`, `max` where `min > max` (a crossed pair clamps to `max`) or `x > max` and
///   `min <= max`; when `min < max` and `x` equals one of them the gradient is split in half
///   between `x` and that bound.
fn clamp_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let x = ctx.input(0)?;
    let (lo, hi) = (ctx.arg(1).clone(), ctx.arg(2).clone());
    let (has_lo, has_hi) = (!matches!(lo, Value::None), !matches!(hi, Value::None));
    let tensor_bounds = ctx.is_tensor_arg(1) || ctx.is_tensor_arg(2);
    if tensor_bounds && has_lo != has_hi {
        let (i, upper) = if has_lo { (1, false) } else { (2, true) };
        let (gx, gb) = clamp_one_tensor_bw(ctx, i, upper)?;
        return Ok(if upper { vec![gx, None, gb] } else { vec![gx, gb, None] });
    }
    if !tensor_bounds {
        let mut inside: Option<Tensor> = None;
        if has_lo {
            inside = Some(p::gt_(x, lo.clone())?);
        }
        if has_hi {
            let m = p::lt_(x, hi.clone())?;
            inside = Some(match inside {
                Some(a) => p::logical_and(&a, &m)?,
                None => m,
            });
        }
        let gi = match &inside {
            Some(m) => fit(ctx, 0, p::mul(g, m))?,
            None => fit(ctx, 0, Ok(g.clone()))?,
        };
        return Ok(vec![gi, None, None]);
    }
    // Two bounds, at least one a tensor. a < b / a <= b for two bounds, whichever is a tensor.
    let cmp = |a: &Value, b: &Value, strict: bool| -> Result<Tensor> {
        match (a, b) {
            (Value::Tensor(a), b) => {
                if strict {
                    p::lt_(a, b.clone())
                } else {
                    p::le_(a, b.clone())
                }
            }
            (a, Value::Tensor(b)) => {
                if strict {
                    p::gt_(b, a.clone())
                } else {
                    p::ge_(b, a.clone())
                }
            }
            _ => Err(crate::error::Error::autograd("clamp", "bounds compared without a tensor")),
        }
    };
    let lo_lt_hi = cmp(&lo, &hi, true)?;
    let lo_le_hi = cmp(&lo, &hi, false)?;
    let at_lo = p::logical_and(&p::eq(x, lo.clone())?, &lo_lt_hi)?;
    let at_hi = p::logical_and(&p::eq(x, hi.clone())?, &lo_lt_hi)?;
    let below = p::lt_(x, lo.clone())?;
    let above = p::gt_(x, hi.clone())?;
    let half = scale(g, 0.5)?;
    let split = |tie: &Tensor, mask: &Tensor| -> Result<Tensor> {
        p::where_(tie, Value::Tensor(half.clone()), Value::Tensor(p::mul(g, mask)?))
    };
    let gx = if ctx.needs_grad(0) {
        let inside = p::logical_and(&p::logical_not(&below)?, &p::logical_not(&above)?)?;
        fit(ctx, 0, split(&p::logical_or(&at_lo, &at_hi)?, &inside))?
    } else {
        None
    };
    let gmin = if ctx.is_tensor_arg(1) && ctx.needs_grad(1) {
        fit(ctx, 1, split(&at_lo, &p::logical_and(&below, &lo_le_hi)?))?
    } else {
        None
    };
    let gmax = if ctx.is_tensor_arg(2) && ctx.needs_grad(2) {
        // `max < min` (a NaN bound is not crossed).
        let crossed = cmp(&hi, &lo, true)?;
        let m = p::logical_or(&crossed, &p::logical_and(&above, &lo_le_hi)?)?;
        fit(ctx, 2, split(&at_hi, &m))?
    } else {
        None
    };
    Ok(vec![gx, gmin, gmax])
}

/// Gradients of `clamp` with one tensor bound (argument `i`; `upper` for a `max` bound), as
/// PyTorch 2.15's ClampMinBackward1 / ClampMaxBackward1 / ClampBackward0: where `x` equals the
/// bound, half to each; elsewhere `x` gets it unless it is past the bound, the bound gets it
/// unless `x` is strictly inside (so a NaN on either side gives the gradient to both).
fn clamp_one_tensor_bw(ctx: &BackwardCtx<'_>, i: usize, upper: bool) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let g = g0(ctx)?;
    let x = ctx.input(0)?;
    let b = ctx.input(i)?;
    let tie = p::eq(x, b)?;
    let half = scale(g, 0.5)?;
    let part = |past: Tensor| -> Result<Tensor> {
        let keep = p::logical_not(&past)?;
        p::where_(&tie, Value::Tensor(half.clone()), Value::Tensor(p::mul(g, &keep)?))
    };
    let gx =
        if ctx.needs_grad(0) { fit(ctx, 0, part(if upper { p::gt_(x, b)? } else { p::lt_(x, b)? }))? } else { None };
    let gb =
        if ctx.needs_grad(i) { fit(ctx, i, part(if upper { p::lt_(x, b)? } else { p::gt_(x, b)? }))? } else { None };
    Ok((gx, gb))
}

/// `clamp_min(x, min)`: ClampMinBackward0 (number: the gradient passes where `x > min`, zero at
/// the bound and for NaN) or ClampMinBackward1 (tensor: [`clamp_one_tensor_bw`]).
fn clamp_min_bw(ctx: &BackwardCtx<'_>) -> Grads {
    clamp_bound_bw(ctx, false)
}
/// `clamp_max(x, max)`: ClampMaxBackward0 (`x < max`) / ClampMaxBackward1.
fn clamp_max_bw(ctx: &BackwardCtx<'_>) -> Grads {
    clamp_bound_bw(ctx, true)
}
fn clamp_bound_bw(ctx: &BackwardCtx<'_>, upper: bool) -> Grads {
    if ctx.is_tensor_arg(1) {
        let (gx, gb) = clamp_one_tensor_bw(ctx, 1, upper)?;
        return Ok(vec![gx, gb]);
    }
    let g = g0(ctx)?;
    let x = ctx.input(0)?;
    let b = ctx.arg(1).clone();
    let inside = if upper { p::lt_(x, b)? } else { p::gt_(x, b)? };
    Ok(vec![fit(ctx, 0, p::mul(g, &inside))?, None])
}
fn where_bw(ctx: &BackwardCtx<'_>) -> Grads {
    let g = g0(ctx)?;
    let c = ctx.input(0)?;
    let gi = if ctx.is_tensor_arg(1) && ctx.needs_grad(1) { fit(ctx, 1, p::where_(c, g, 0.0))? } else { None };
    let go = if ctx.is_tensor_arg(2) && ctx.needs_grad(2) { fit(ctx, 2, p::where_(c, 0.0, g))? } else { None };
    Ok(vec![None, gi, go])
}
