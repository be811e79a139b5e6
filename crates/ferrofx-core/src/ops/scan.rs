//! Scans: `cumsum` and `cumprod` along one dim, with the optional `dtype` (integer and bool
//! inputs give int64, as in PyTorch). Floating scans accumulate in f64 (PyTorch's CPU
//! accumulation type for float), integers in wrapping int64.

use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::layout::wrap_dim;
use crate::op::args::{int, opt_dtype, tensor};
use crate::op::{ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs};
use crate::ops::kernel;
use crate::ops::reduce::{call1, cost_reduce, from_f64, from_i64, meta1, opdef, plan, unpermute};
use crate::tensor::Tensor;
use crate::value::Value;
use rayon::prelude::*;
use smallvec::smallvec;

fn params(op: &str, a: &[Value]) -> Result<(usize, DType)> {
    let t = tensor(op, a, 0)?;
    let dim = wrap_dim(op, int(op, a, 1)?, t.ndim())?;
    let dt = match opt_dtype(op, a, 2)? {
        Some(d) => d,
        None if t.dtype().is_floating_point() => t.dtype(),
        None => DType::I64,
    };
    Ok((dim, dt))
}

/// Scans an `[o, r, i]` buffer along `r` with accumulator `A`.
fn scan<E: Element, A: Copy + Send + Sync + Default>(
    x: &[E],
    o: usize,
    r: usize,
    i: usize,
    init: A,
    load: impl Fn(E) -> A + Sync,
    step: impl Fn(A, A) -> A + Sync,
) -> Vec<A> {
    let n = o * r * i;
    let mut out = vec![A::default(); n];
    if n == 0 {
        return out;
    }
    let block = |(xs, os): (&[E], &mut [A])| {
        if i == 1 {
            let mut acc = init;
            for (o, &v) in os.iter_mut().zip(xs) {
                acc = step(acc, load(v));
                *o = acc;
            }
        } else {
            for k in 0..i {
                os[k] = step(init, load(xs[k]));
            }
            for rr in 1..r {
                let (prev, cur) = os[(rr - 1) * i..(rr + 1) * i].split_at_mut(i);
                for k in 0..i {
                    cur[k] = step(prev[k], load(xs[rr * i + k]));
                }
            }
        }
    };
    let len = r * i;
    if n >= kernel::PAR_THRESHOLD && o > 1 {
        x.par_chunks(len).zip(out.par_chunks_mut(len)).with_min_len((kernel::PAR_CHUNK / len).max(1)).for_each(block);
    } else {
        x.chunks(len).zip(out.chunks_mut(len)).for_each(block);
    }
    out
}

fn run(op: &str, a: &[Value], prod: bool) -> Result<Outputs> {
    let (dim, dt) = params(op, a)?;
    let t = tensor(op, a, 0)?;
    let x = if dt.is_floating_point() || t.dtype().is_floating_point() { kernel::cast(t, dt)? } else { t.clone() };
    let shape = x.shape().to_vec();
    let mut mask = vec![false; shape.len()];
    if !shape.is_empty() {
        mask[dim] = true;
    }
    let p = plan(op, &x, &mask, true)?;
    let xdt = x.dtype();
    let out_shape: Vec<usize> = if p.permuted { vec![p.o, p.r] } else { shape.clone() };
    let out = if dt.is_floating_point() {
        let v: Vec<f64> = crate::match_dtype!(xdt, E => p.src.with_contiguous::<E, _>(op, |d| if prod {
            scan(d, p.o, p.r, p.i, 1f64, |v: E| v.to_f64(), |a, b| a * b)
        } else {
            scan(d, p.o, p.r, p.i, 0f64, |v: E| v.to_f64(), |a, b| a + b)
        })?);
        from_f64(v, &out_shape, dt)?
    } else {
        let v: Vec<i64> = crate::match_dtype!(xdt, E => p.src.with_contiguous::<E, _>(op, |d| if prod {
            scan(d, p.o, p.r, p.i, 1i64, |v: E| v.to_i64(), |a: i64, b| a.wrapping_mul(b))
        } else {
            scan(d, p.o, p.r, p.i, 0i64, |v: E| v.to_i64(), |a: i64, b| a.wrapping_add(b))
        })?);
        from_i64(v, &out_shape, dt)?
    };
    let out = if p.permuted { unpermute(op, out, &shape, dim)? } else { out };
    Ok(smallvec![out])
}

fn meta(op: &str, a: &[Value]) -> Result<MetaOutputs> {
    let (_, dt) = params(op, a)?;
    Ok(meta1(tensor(op, a, 0)?.shape(), dt))
}

const SCHEMA: &[ArgSpec] =
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("dim", T::Int), ArgSpec::kw("dtype", T::OptDType, D::None)];

opdef!(CUMSUM, "cumsum", SCHEMA,
    meta: |a| meta("cumsum", a),
    kernel: |a| run("cumsum", a, false),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::cumsum_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Cumulative sum along dim (integer and bool inputs give int64).");
opdef!(CUMPROD, "cumprod", SCHEMA,
    meta: |a| meta("cumprod", a),
    kernel: |a| run("cumprod", a, true),
    cost: cost_reduce, effect: Effect::Pure, category: Category::Reduction,
    backward: crate::autograd::formulas::reduce::cumprod_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Cumulative product along dim (integer and bool inputs give int64).");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&CUMSUM, &CUMPROD];

/// `torch.cumsum(input, dim, dtype=None)`.
pub fn cumsum(input: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    call1(&CUMSUM, CallKind::Function, &[input.into(), dim.into(), dtype.into()])
}
/// `torch.cumprod(input, dim, dtype=None)`.
pub fn cumprod(input: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    call1(&CUMPROD, CallKind::Function, &[input.into(), dim.into(), dtype.into()])
}

impl Tensor {
    /// `x.cumsum(dim)`.
    pub fn cumsum(&self, dim: i64) -> Result<Tensor> {
        call1(&CUMSUM, CallKind::Method, &[self.into(), dim.into(), Value::None])
    }
    /// `x.cumprod(dim)`.
    pub fn cumprod(&self, dim: i64) -> Result<Tensor> {
        call1(&CUMPROD, CallKind::Method, &[self.into(), dim.into(), Value::None])
    }
}
