//! Tensor factories: `arange`, `zeros`, `ones`, `full`, `empty`, `eye`, `linspace`, and the
//! `_like` forms `zeros_like`, `ones_like`, `full_like`, `empty_like` (`rand_like` and
//! `randn_like` live in [`crate::ops::random`]).
//!
//! Dtype inference follows PyTorch: `arange` gives int64 when start, end and step are all
//! integers and the default float dtype otherwise; `full` takes the dtype of its fill value
//! (bool, int64 or the default float); the other factories default to float32.
//!
//! Sizes are checked before allocating: negative dims are errors, and tensors larger than
//! [`crate::ops::reduce::MAX_ALLOC_BYTES`] (or that the allocator cannot provide) give an error
//! instead of aborting. `empty` returns zeros (defined contents are cheap and safer).

use crate::dtype::{DType, Element, DEFAULT_FLOAT};
use crate::error::{Error, Result};
use crate::op::args::{int, ints, opt_dtype, opt_int, opt_scalar, scalar, tensor};
use crate::op::{cost_memory, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, OpDef, Outputs};
use crate::ops::reduce::{alloc_filled, call1, check_alloc, meta1, opdef};
use crate::scalar::Scalar;
use crate::tensor::Tensor;
use crate::value::Value;
use smallvec::smallvec;

/// Validates a requested size list (no negative dims, within the allocation limit).
pub(crate) fn check_size(op: &str, size: &[i64], dtype: DType) -> Result<Vec<usize>> {
    if let Some(&bad) = size.iter().find(|&&s| s < 0) {
        return Err(Error::argument(op, format!("Trying to create tensor with negative dimension {bad}: {size:?}")));
    }
    let shape: Vec<usize> = size.iter().map(|&s| s as usize).collect();
    check_alloc(op, &shape, dtype)?;
    Ok(shape)
}

/// A contiguous tensor of `shape` filled with `v` (converted to `dtype`).
pub(crate) fn filled(op: &str, shape: &[usize], dtype: DType, v: Scalar) -> Result<Tensor> {
    let n = check_alloc(op, shape, dtype)?;
    crate::match_dtype!(dtype, E => {
        let e: E = if E::DTYPE.is_floating_point() { E::from_f64(v.to_f64()) } else { E::from_i64(v.to_i64()) };
        Tensor::from_vec(alloc_filled(op, n, e)?, shape)
    })
}

fn scalar_dtype(s: Scalar) -> DType {
    match s {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_) => DType::I64,
        Scalar::Float(_) => DEFAULT_FLOAT,
    }
}

// ---------------------------------------------------------------------------------------------
// zeros / ones / empty / full
// ---------------------------------------------------------------------------------------------

fn sized(op: &str, a: &[Value], dtype_at: usize, default: DType) -> Result<(Vec<usize>, DType)> {
    let size = ints(op, a, 0)?;
    let dt = opt_dtype(op, a, dtype_at)?.unwrap_or(default);
    Ok((check_size(op, &size, dt)?, dt))
}

const SIZE_DTYPE: &[ArgSpec] = &[ArgSpec::req("size", T::IntList), ArgSpec::kw("dtype", T::OptDType, D::None)];

macro_rules! const_factory {
    ($s:ident, $name:literal, $val:expr, $doc:literal) => {
        opdef!($s, $name, SIZE_DTYPE,
            meta: |a| { let (s, dt) = sized($name, a, 1, DEFAULT_FLOAT)?; Ok(meta1(&s, dt)) },
            kernel: |a| { let (s, dt) = sized($name, a, 1, DEFAULT_FLOAT)?; Ok(smallvec![filled($name, &s, dt, $val)?]) },
            cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
            doc: $doc);
    };
}
const_factory!(ZEROS, "zeros", Scalar::Int(0), "A tensor of zeros (float32 unless dtype is given).");
const_factory!(ONES, "ones", Scalar::Int(1), "A tensor of ones (float32 unless dtype is given).");
const_factory!(EMPTY, "empty", Scalar::Int(0), "An uninitialised tensor in PyTorch; here zero-filled.");

fn full_params(op: &str, a: &[Value]) -> Result<(Vec<usize>, DType, Scalar)> {
    let v = scalar(op, a, 1)?;
    let (s, dt) = sized(op, a, 2, scalar_dtype(v))?;
    Ok((s, dt, v))
}

opdef!(FULL, "full", &[ArgSpec::req("size", T::IntList), ArgSpec::req("fill_value", T::Scalar), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (s, dt, _) = full_params("full", a)?; Ok(meta1(&s, dt)) },
    kernel: |a| { let (s, dt, v) = full_params("full", a)?; Ok(smallvec![filled("full", &s, dt, v)?]) },
    cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
    doc: "A tensor filled with fill_value (dtype from the value: bool, int64 or float32, unless given).");

// ---------------------------------------------------------------------------------------------
// _like
// ---------------------------------------------------------------------------------------------

fn like(op: &str, a: &[Value], dtype_at: usize) -> Result<(Vec<usize>, DType)> {
    let t = tensor(op, a, 0)?;
    let dt = opt_dtype(op, a, dtype_at)?.unwrap_or(t.dtype());
    let shape = t.shape().to_vec();
    check_alloc(op, &shape, dt)?;
    Ok((shape, dt))
}

const LIKE: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::kw("dtype", T::OptDType, D::None)];

macro_rules! like_factory {
    ($s:ident, $name:literal, $val:expr, $doc:literal) => {
        opdef!($s, $name, LIKE,
            meta: |a| { let (s, dt) = like($name, a, 1)?; Ok(meta1(&s, dt)) },
            kernel: |a| { let (s, dt) = like($name, a, 1)?; Ok(smallvec![filled($name, &s, dt, $val)?]) },
            cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
            doc: $doc);
    };
}
like_factory!(ZEROS_LIKE, "zeros_like", Scalar::Int(0), "Zeros with the input's shape and dtype (or dtype=).");
like_factory!(ONES_LIKE, "ones_like", Scalar::Int(1), "Ones with the input's shape and dtype (or dtype=).");
like_factory!(EMPTY_LIKE, "empty_like", Scalar::Int(0), "Like zeros_like (PyTorch leaves it uninitialised).");

opdef!(FULL_LIKE, "full_like", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("fill_value", T::Scalar), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (s, dt) = like("full_like", a, 2)?; Ok(meta1(&s, dt)) },
    kernel: |a| {
        let (s, dt) = like("full_like", a, 2)?;
        Ok(smallvec![filled("full_like", &s, dt, scalar("full_like", a, 1)?)?])
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
    doc: "fill_value with the input's shape and dtype (or dtype=).");

// ---------------------------------------------------------------------------------------------
// arange / linspace / eye
// ---------------------------------------------------------------------------------------------

struct Range {
    start: Scalar,
    step: Scalar,
    n: usize,
    dtype: DType,
}

fn arange_params(a: &[Value]) -> Result<Range> {
    let op = "arange";
    let s0 = scalar(op, a, 0)?;
    let (start, end) = match opt_scalar(op, a, 1)? {
        Some(e) => (s0, e),
        None => (Scalar::Int(0), s0),
    };
    let step = scalar(op, a, 2)?;
    let any_float = start.is_float() || end.is_float() || step.is_float();
    let dtype = opt_dtype(op, a, 3)?.unwrap_or(if any_float { DEFAULT_FLOAT } else { DType::I64 });
    let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
    if !(s.is_finite() && e.is_finite()) {
        return Err(Error::argument(op, format!("unsupported range: {s} -> {e}")));
    }
    if st == 0.0 || st.is_nan() {
        return Err(Error::argument(op, "step must be nonzero"));
    }
    if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
        return Err(Error::argument(
            op,
            format!("upper bound and lower bound inconsistent with step sign: start={s}, end={e}, step={st}"),
        ));
    }
    let size = if dtype.is_floating_point() || any_float {
        ((e - s) / st).ceil()
    } else {
        let (s, e, st) = (start.to_i64() as i128, end.to_i64() as i128, step.to_i64() as i128);
        let d = e - s;
        // ceil division for exact integers
        let q = d / st;
        (if d % st != 0 { q + 1 } else { q }) as f64
    };
    if !(size >= 0.0 && size < (usize::MAX >> 1) as f64) {
        return Err(Error::argument(op, format!("invalid size, possible overflow? start={s}, end={e}, step={st}")));
    }
    let n = size as usize;
    check_alloc(op, &[n], dtype)?;
    Ok(Range { start, step, n, dtype })
}

fn arange_kernel(a: &[Value]) -> Result<Outputs> {
    let op = "arange";
    let r = arange_params(a)?;
    let dt = r.dtype;
    let out = crate::match_dtype!(dt, E => {
        let mut v: Vec<E> = alloc_filled(op, r.n, E::default())?;
        if E::DTYPE.is_floating_point() || r.start.is_float() || r.step.is_float() {
            let (s, st) = (r.start.to_f64(), r.step.to_f64());
            v.iter_mut().enumerate().for_each(|(i, x)| *x = E::from_f64(s + st * i as f64));
        } else {
            let (s, st) = (r.start.to_i64(), r.step.to_i64());
            v.iter_mut().enumerate().for_each(|(i, x)| *x = E::from_i64(s.wrapping_add(st.wrapping_mul(i as i64))));
        }
        Tensor::from_vec(v, &[r.n])?
    });
    Ok(smallvec![out])
}

opdef!(ARANGE, "arange",
    &[ArgSpec::req("start", T::Scalar), ArgSpec::opt("end", T::OptScalar, D::None), ArgSpec::opt("step", T::Scalar, D::Int(1)), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let r = arange_params(a)?; Ok(meta1(&[r.n], r.dtype)) },
    kernel: arange_kernel,
    cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
    doc: "Values start, start+step, ... below end (arange(n) counts 0..n); int64 for integer arguments, else float32.");

fn linspace_params(a: &[Value]) -> Result<(f64, f64, usize, DType)> {
    let op = "linspace";
    let s = scalar(op, a, 0)?.to_f64();
    let e = scalar(op, a, 1)?.to_f64();
    let steps = int(op, a, 2)?;
    let dt = opt_dtype(op, a, 3)?.unwrap_or(DEFAULT_FLOAT);
    if steps < 0 {
        return Err(Error::argument(op, format!("number of steps must be non-negative, got {steps}")));
    }
    check_alloc(op, &[steps as usize], dt)?;
    Ok((s, e, steps as usize, dt))
}

/// PyTorch's linspace: the first half counts up from start, the second half down from end.
fn linspace_vals<F: Copy>(
    s: F,
    e: F,
    n: usize,
    sub: impl Fn(F, F) -> F,
    div: impl Fn(F, usize) -> F,
    mul: impl Fn(F, usize) -> F,
    add: impl Fn(F, F) -> F,
) -> Vec<F> {
    if n == 0 {
        return vec![];
    }
    if n == 1 {
        return vec![s];
    }
    let step = div(sub(e, s), n - 1);
    let half = n / 2;
    (0..n).map(|i| if i < half { add(s, mul(step, i)) } else { sub(e, mul(step, n - i - 1)) }).collect()
}

opdef!(LINSPACE, "linspace",
    &[ArgSpec::req("start", T::Scalar), ArgSpec::req("end", T::Scalar), ArgSpec::req("steps", T::Int), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (_, _, n, dt) = linspace_params(a)?; Ok(meta1(&[n], dt)) },
    kernel: |a| {
        let (s, e, n, dt) = linspace_params(a)?;
        let out = match dt {
            DType::F32 | DType::F16 | DType::BF16 => {
                let v = linspace_vals(s as f32, e as f32, n, |a, b| a - b, |a, k| a / k as f32, |a, k| a * k as f32, |a, b| a + b);
                crate::ops::kernel::cast(&Tensor::from_vec(v, &[n])?, dt)?
            }
            _ => {
                let v = linspace_vals(s, e, n, |a, b| a - b, |a, k| a / k as f64, |a, k| a * k as f64, |a, b| a + b);
                crate::ops::reduce::from_f64(v, &[n], dt)?
            }
        };
        Ok(smallvec![out])
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
    doc: "steps evenly spaced values from start to end inclusive (float32 unless dtype is given).");

fn eye_params(a: &[Value]) -> Result<(usize, usize, DType)> {
    let op = "eye";
    let n = int(op, a, 0)?;
    let m = opt_int(op, a, 1)?.unwrap_or(n);
    if n < 0 {
        return Err(Error::argument(op, format!("n must be greater or equal to 0, got {n}")));
    }
    if m < 0 {
        return Err(Error::argument(op, format!("m must be greater or equal to 0, got {m}")));
    }
    let dt = opt_dtype(op, a, 2)?.unwrap_or(DEFAULT_FLOAT);
    check_alloc(op, &[n as usize, m as usize], dt)?;
    Ok((n as usize, m as usize, dt))
}

opdef!(EYE, "eye",
    &[ArgSpec::req("n", T::Int), ArgSpec::opt("m", T::OptInt, D::None), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (n, m, dt) = eye_params(a)?; Ok(meta1(&[n, m], dt)) },
    kernel: |a| {
        let (n, m, dt) = eye_params(a)?;
        let out = crate::match_dtype!(dt, E => {
            let mut v: Vec<E> = alloc_filled("eye", n * m, E::default())?;
            for i in 0..n.min(m) {
                v[i * m + i] = E::from_i64(1);
            }
            Tensor::from_vec(v, &[n, m])?
        });
        Ok(smallvec![out])
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Creation,
    doc: "An n x m identity matrix (m defaults to n).");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] =
    &[&ZEROS, &ONES, &EMPTY, &FULL, &ZEROS_LIKE, &ONES_LIKE, &EMPTY_LIKE, &FULL_LIKE, &ARANGE, &LINSPACE, &EYE];

/// `torch.zeros(size, dtype=)`.
pub fn zeros(size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
    call1(&ZEROS, CallKind::Function, &[size.into(), dtype.into()])
}
/// `torch.ones(size, dtype=)`.
pub fn ones(size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
    call1(&ONES, CallKind::Function, &[size.into(), dtype.into()])
}
/// `torch.empty(size, dtype=)` (zero-filled here).
pub fn empty(size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
    call1(&EMPTY, CallKind::Function, &[size.into(), dtype.into()])
}
/// `torch.full(size, fill_value, dtype=)`.
pub fn full(size: &[i64], fill_value: impl Into<Scalar>, dtype: Option<DType>) -> Result<Tensor> {
    let v: Value = fill_value.into().into();
    call1(&FULL, CallKind::Function, &[size.into(), v, dtype.into()])
}
/// `torch.zeros_like(input, dtype=)`.
pub fn zeros_like(input: &Tensor, dtype: Option<DType>) -> Result<Tensor> {
    call1(&ZEROS_LIKE, CallKind::Function, &[input.into(), dtype.into()])
}
/// `torch.ones_like(input, dtype=)`.
pub fn ones_like(input: &Tensor, dtype: Option<DType>) -> Result<Tensor> {
    call1(&ONES_LIKE, CallKind::Function, &[input.into(), dtype.into()])
}
/// `torch.empty_like(input, dtype=)` (zero-filled here).
pub fn empty_like(input: &Tensor, dtype: Option<DType>) -> Result<Tensor> {
    call1(&EMPTY_LIKE, CallKind::Function, &[input.into(), dtype.into()])
}
/// `torch.full_like(input, fill_value, dtype=)`.
pub fn full_like(input: &Tensor, fill_value: impl Into<Scalar>, dtype: Option<DType>) -> Result<Tensor> {
    let v: Value = fill_value.into().into();
    call1(&FULL_LIKE, CallKind::Function, &[input.into(), v, dtype.into()])
}
/// `torch.arange(start, end, step, dtype=)`; use `arange(0, n, 1, None)` for `arange(n)`.
pub fn arange(
    start: impl Into<Scalar>,
    end: impl Into<Scalar>,
    step: impl Into<Scalar>,
    dtype: Option<DType>,
) -> Result<Tensor> {
    let (s, e, st): (Value, Value, Value) = (start.into().into(), end.into().into(), step.into().into());
    call1(&ARANGE, CallKind::Function, &[s, e, st, dtype.into()])
}
/// `torch.linspace(start, end, steps, dtype=)`.
pub fn linspace(start: f64, end: f64, steps: i64, dtype: Option<DType>) -> Result<Tensor> {
    call1(&LINSPACE, CallKind::Function, &[start.into(), end.into(), steps.into(), dtype.into()])
}
/// `torch.eye(n, m, dtype=)`.
pub fn eye(n: i64, m: Option<i64>, dtype: Option<DType>) -> Result<Tensor> {
    call1(&EYE, CallKind::Function, &[n.into(), m.into(), dtype.into()])
}
