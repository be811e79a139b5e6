//! `softmax` and `log_softmax` along one dim, with the optional `dtype` (the input is cast to
//! it first, as PyTorch does). Numerically stable: the row maximum is subtracted before `exp`,
//! and the normaliser is summed in f64. f16/bf16 compute in f32 and round back.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::wrap_dim;
use crate::op::args::{int, opt_dtype, tensor};
use crate::op::{ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs};
use crate::ops::kernel;
use crate::ops::reduce::{call1, cost_reduce, meta1, opdef, plan, unpermute};
use crate::ops::vmath;
use crate::tensor::Tensor;
use crate::value::Value;
use smallvec::smallvec;

trait Real: Copy + Send + Sync + PartialOrd + crate::dtype::Element {
    fn exp_(self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn f64_(self) -> f64;
    fn of(v: f64) -> Self;
    const NEG_INF: Self;
    /// The maximum of a row (NaN if any element is NaN).
    fn row_max(x: &[Self]) -> Self {
        x.iter().fold(Self::NEG_INF, |m, &v| max_of(m, v))
    }
    /// `out = exp(x - m)`, returning the sum of `out` in f64.
    fn exp_sum(out: &mut [Self], x: &[Self], m: Self) -> f64 {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v.sub(m).exp_();
        }
        // eight independent f64 lanes: vectorisable and accurate
        let mut acc = [0f64; 8];
        let chunks = out.chunks_exact(8);
        let s: f64 = chunks.remainder().iter().map(|v| v.f64_()).sum();
        for c in chunks {
            for j in 0..8 {
                acc[j] += c[j].f64_();
            }
        }
        s + acc.iter().sum::<f64>()
    }
}
impl Real for f32 {
    #[inline(always)]
    fn exp_(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn f64_(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn of(v: f64) -> Self {
        v as f32
    }
    const NEG_INF: Self = f32::NEG_INFINITY;
    fn row_max(x: &[Self]) -> Self {
        vmath::max(x)
    }
    fn exp_sum(out: &mut [Self], x: &[Self], m: Self) -> f64 {
        vmath::exp_shifted_sum(out, x, m)
    }
}
impl Real for f64 {
    #[inline(always)]
    fn exp_(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn f64_(self) -> f64 {
        self
    }
    #[inline(always)]
    fn of(v: f64) -> Self {
        v
    }
    const NEG_INF: Self = f64::NEG_INFINITY;
}

#[inline(always)]
fn max_of<R: Real>(a: R, b: R) -> R {
    #[allow(clippy::eq_op)]
    if b > a || b != b {
        b
    } else {
        a
    }
}

/// Softmax (or log-softmax) of each row of `r` adjacent elements.
fn row_softmax<R: Real>(x: &[R], out: &mut [R], log: bool) {
    let m = R::row_max(x);
    // A row whose max is -inf gives NaN (as in PyTorch).
    let s = R::exp_sum(out, x, m);
    if log {
        let ls = s.ln();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = R::of(v.sub(m).f64_() - ls);
        }
    } else {
        let inv = R::of(1.0 / s);
        for o in out.iter_mut() {
            *o = o.mul(inv);
        }
    }
}

/// Softmax over the middle axis of an `[r, i]` block (columns are independent; vectorisable).
fn block_softmax<R: Real>(x: &[R], out: &mut [R], r: usize, i: usize, log: bool, m: &mut [R], s: &mut [f64]) {
    m.iter_mut().for_each(|v| *v = R::NEG_INF);
    s.iter_mut().for_each(|v| *v = 0.0);
    for rr in 0..r {
        for (mv, &v) in m.iter_mut().zip(&x[rr * i..(rr + 1) * i]) {
            *mv = max_of(*mv, v);
        }
    }
    for rr in 0..r {
        let (xs, os) = (&x[rr * i..(rr + 1) * i], &mut out[rr * i..(rr + 1) * i]);
        for k in 0..i {
            let e = xs[k].sub(m[k]).exp_();
            os[k] = e;
            s[k] += e.f64_();
        }
    }
    if log {
        s.iter_mut().for_each(|v| *v = v.ln());
        for rr in 0..r {
            let (xs, os) = (&x[rr * i..(rr + 1) * i], &mut out[rr * i..(rr + 1) * i]);
            for k in 0..i {
                os[k] = R::of(xs[k].sub(m[k]).f64_() - s[k]);
            }
        }
    } else {
        s.iter_mut().for_each(|v| *v = 1.0 / *v);
        for rr in 0..r {
            let os = &mut out[rr * i..(rr + 1) * i];
            for k in 0..i {
                os[k] = R::of(os[k].f64_() * s[k]);
            }
        }
    }
}

fn softmax_typed<R: Real>(op: &str, x: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let mut mask = vec![false; shape.len()];
    if !shape.is_empty() {
        mask[dim] = true;
    }
    let p = plan(op, x, &mask, true)?;
    let (o, r, i) = (p.o, p.r, p.i);
    let n = o * r * i;
    let mut out = vec![R::default(); n];
    p.src.with_contiguous::<R, _>(op, |d| {
        if n == 0 {
            return;
        }
        let big = n >= kernel::PAR_THRESHOLD;
        if i == 1 {
            let f = |(xs, os): (&[R], &mut [R])| row_softmax(xs, os, log);
            if big {
                // rows in tasks of about PAR_CHUNK elements, one team job
                let per = (kernel::PAR_CHUNK / r).max(1) * r;
                super::team::chunks_mut(&mut out, per, |k, os| {
                    d[k * per..k * per + os.len()].chunks(r).zip(os.chunks_mut(r)).for_each(f)
                });
            } else {
                d.chunks(r).zip(out.chunks_mut(r)).for_each(f);
            }
        } else {
            let f = |(xs, os): (&[R], &mut [R])| {
                let mut m = vec![R::NEG_INF; i];
                let mut s = vec![0f64; i];
                block_softmax(xs, os, r, i, log, &mut m, &mut s)
            };
            if big && o > 1 {
                super::team::chunks_mut(&mut out, r * i, |k, os| f((&d[k * r * i..(k + 1) * r * i], os)));
            } else {
                d.chunks(r * i).zip(out.chunks_mut(r * i)).for_each(f);
            }
        }
    })?;
    // the plan may have permuted (non-contiguous input): results are in plan order [o, r]
    // with the softmax dim last; when the plan kept the input order this is the input shape.
    if !p.permuted {
        return Tensor::from_vec(out, &shape);
    }
    unpermute(op, Tensor::from_vec(out, &[p.o, p.r])?, &shape, dim)
}

fn params(op: &str, a: &[Value]) -> Result<(usize, DType)> {
    let t = tensor(op, a, 0)?;
    let dim = wrap_dim(op, int(op, a, 1)?, t.ndim())?;
    let dt = opt_dtype(op, a, 2)?.unwrap_or(t.dtype());
    if !dt.is_floating_point() {
        let kname = if op == "softmax" { "softmax_lastdim_kernel_impl" } else { "log_softmax_lastdim_kernel_impl" };
        return Err(Error::dtype(
            op,
            format!("\"{kname}\" not implemented for '{dt}': {op} needs a floating point input (or pass dtype=torch.float32)"),
        ));
    }
    Ok((dim, dt))
}

fn run(op: &str, a: &[Value], log: bool) -> Result<Outputs> {
    let (dim, dt) = params(op, a)?;
    let t = tensor(op, a, 0)?;
    let out = match dt {
        DType::F64 => softmax_typed::<f64>(op, &kernel::cast(t, DType::F64)?, dim, log)?,
        DType::F32 => softmax_typed::<f32>(op, &kernel::cast(t, DType::F32)?, dim, log)?,
        _ => kernel::cast(&softmax_typed::<f32>(op, &kernel::cast(t, DType::F32)?, dim, log)?, dt)?,
    };
    Ok(smallvec![out])
}

fn meta(op: &str, a: &[Value]) -> Result<MetaOutputs> {
    let (_, dt) = params(op, a)?;
    Ok(meta1(tensor(op, a, 0)?.shape(), dt))
}

const SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::opt("dtype", T::OptDType, D::None)];

opdef!(SOFTMAX, "softmax", SCHEMA,
    meta: |a| meta("softmax", a),
    kernel: |a| run("softmax", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::softmax_backward, saves: crate::op::Saves { inputs: 0, outputs: 1 },
    doc: "exp(x) / sum(exp(x)) along dim, computed stably; dtype casts the input first.");
opdef!(LOG_SOFTMAX, "log_softmax", SCHEMA,
    meta: |a| meta("log_softmax", a),
    kernel: |a| run("log_softmax", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::log_softmax_backward, saves: crate::op::Saves { inputs: 0, outputs: 1 },
    doc: "x - logsumexp(x) along dim, computed stably; dtype casts the input first.");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&SOFTMAX, &LOG_SOFTMAX];

/// `torch.softmax(input, dim, dtype=None)`.
pub fn softmax(input: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    call1(&SOFTMAX, CallKind::Function, &[input.into(), dim.into(), dtype.into()])
}
/// `torch.log_softmax(input, dim, dtype=None)`.
pub fn log_softmax(input: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    call1(&LOG_SOFTMAX, CallKind::Function, &[input.into(), dim.into(), dtype.into()])
}

impl Tensor {
    /// `x.softmax(dim)`.
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        call1(&SOFTMAX, CallKind::Method, &[self.into(), dim.into(), Value::None])
    }
    /// `x.log_softmax(dim)`.
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        call1(&LOG_SOFTMAX, CallKind::Method, &[self.into(), dim.into(), Value::None])
    }
}
