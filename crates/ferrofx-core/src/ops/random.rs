//! Random sampling with reproducible streams: `rand`, `randn`, `randint` (`randint(high, size)`)
//! and `randint.low` (`randint(low, high, size)`), `randperm`, `rand_like`, `randn_like`,
//! `bernoulli` (probability tensor or float `p`), `dropout`, `native_dropout` (output and
//! keep-mask, for autograd) and the in-place `uniform_`, `normal_`.
//!
//! ## Generators and reproducibility
//!
//! A [`Generator`] is a shareable handle to a ChaCha8 stream. The process-wide default
//! generator starts from PyTorch's default CPU seed (67280421310721), so programs are
//! deterministic unless they reseed; [`manual_seed`] reseeds it. An explicit generator is used
//! for everything inside [`with_generator`] on the current thread (or with the `Generator`
//! methods such as [`Generator::rand`]), which still dispatches through the op registry.
//!
//! Every random op draws one 64-bit key from the generator and then fills its output in fixed
//! chunks of 65536 elements, chunk `c` from ChaCha8 seeded by the key on stream `c`. So: the
//! same seed gives the same numbers, independent of the number of threads (chunks run in
//! parallel for large tensors). The numbers differ from PyTorch's (mt19937) stream — only our
//! own stream is reproducible, by design.

use crate::dtype::{DType, Element, DEFAULT_FLOAT};
use crate::error::{Error, Result};
use crate::op::args::{bool_, float, int, ints, opt_dtype, opt_float, tensor};
use crate::op::{
    cost_elementwise, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs,
};
use crate::ops::creation::check_size;
use crate::ops::kernel;
use crate::ops::reduce::{call1, call2, check_alloc, meta1, opdef};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use smallvec::smallvec;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

/// PyTorch's default CPU seed, used for the default generator at start-up.
pub const DEFAULT_SEED: u64 = 67280421310721;
/// Elements per independently seeded chunk.
const CHUNK: usize = 1 << 16;

struct GenState {
    seed: u64,
    rng: ChaCha8Rng,
}

/// A random number generator handle (cloning shares the state, like `torch.Generator`).
#[derive(Clone)]
pub struct Generator(Arc<Mutex<GenState>>);

/// A snapshot of a generator's state ([`Generator::get_state`] / [`Generator::set_state`]).
#[derive(Clone)]
pub struct GeneratorState {
    seed: u64,
    rng: ChaCha8Rng,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Generator(initial_seed={})", self.initial_seed())
    }
}

impl Generator {
    /// A new generator seeded with `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator(Arc::new(Mutex::new(GenState { seed, rng: ChaCha8Rng::seed_from_u64(seed) })))
    }
    /// Reseeds this generator (`g.manual_seed(seed)`); returns it for chaining.
    pub fn manual_seed(&self, seed: u64) -> &Generator {
        let mut g = self.0.lock();
        g.seed = seed;
        g.rng = ChaCha8Rng::seed_from_u64(seed);
        self
    }
    /// The seed last set.
    pub fn initial_seed(&self) -> u64 {
        self.0.lock().seed
    }
    /// A snapshot of the current state.
    pub fn get_state(&self) -> GeneratorState {
        let g = self.0.lock();
        GeneratorState { seed: g.seed, rng: g.rng.clone() }
    }
    /// Restores a snapshot taken with [`Generator::get_state`].
    pub fn set_state(&self, s: &GeneratorState) {
        let mut g = self.0.lock();
        g.seed = s.seed;
        g.rng = s.rng.clone();
    }
    fn next_key(&self) -> u64 {
        self.0.lock().rng.random::<u64>()
    }
    /// Runs `f` with this generator as the current one on this thread.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        with_generator(self, f)
    }
    /// `torch.rand(size, generator=self)`.
    pub fn rand(&self, size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
        self.scope(|| rand(size, dtype))
    }
    /// `torch.randn(size, generator=self)`.
    pub fn randn(&self, size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
        self.scope(|| randn(size, dtype))
    }
    /// `torch.randint(low, high, size, generator=self)`.
    pub fn randint(&self, low: i64, high: i64, size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
        self.scope(|| randint(low, high, size, dtype))
    }
}

/// The process-wide default generator.
pub fn default_generator() -> &'static Generator {
    static G: OnceLock<Generator> = OnceLock::new();
    G.get_or_init(|| Generator::new(DEFAULT_SEED))
}

/// `torch.manual_seed(seed)`: reseeds the default generator.
pub fn manual_seed(seed: u64) {
    default_generator().manual_seed(seed);
}

thread_local! {
    static CURRENT: RefCell<Vec<Generator>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `g` as the generator of every random op called on this thread (restored
/// afterwards, also on panic).
pub fn with_generator<R>(g: &Generator, f: impl FnOnce() -> R) -> R {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            CURRENT.with(|c| c.borrow_mut().pop());
        }
    }
    CURRENT.with(|c| c.borrow_mut().push(g.clone()));
    let _pop = Pop;
    f()
}

/// The generator random ops use on this thread now: the innermost [`with_generator`]'s, else
/// the default one (activation checkpointing records and replays its state).
pub fn current_generator() -> Generator {
    CURRENT.with(|c| c.borrow().last().cloned()).unwrap_or_else(|| default_generator().clone())
}

fn next_key() -> u64 {
    let explicit = CURRENT.with(|c| c.borrow().last().cloned());
    match explicit {
        Some(g) => g.next_key(),
        None => default_generator().next_key(),
    }
}

/// Fills `n` values with `f(rng)`, chunk `c` drawing from ChaCha8(key) on stream `c`.
fn fill<E: Element>(op: &str, n: usize, f: impl Fn(&mut ChaCha8Rng) -> E + Sync) -> Result<Vec<E>> {
    let key = next_key();
    let mut out = crate::ops::reduce::alloc_filled(op, n, E::default())?;
    let run = |(c, chunk): (usize, &mut [E])| {
        let mut rng = ChaCha8Rng::seed_from_u64(key);
        rng.set_stream(c as u64);
        for x in chunk.iter_mut() {
            *x = f(&mut rng);
        }
    };
    if n >= 2 * CHUNK {
        out.par_chunks_mut(CHUNK).enumerate().for_each(run);
    } else {
        out.chunks_mut(CHUNK).enumerate().for_each(run);
    }
    Ok(out)
}

/// Largest value below 1 representable in `dt` (uniform samples must stay in [0, 1)).
fn below_one(dt: DType) -> f64 {
    match dt {
        DType::F16 => 1.0 - 2f64.powi(-11),
        DType::BF16 => 1.0 - 2f64.powi(-8),
        DType::F32 => 1.0 - 2f64.powi(-24),
        _ => 1.0 - 2f64.powi(-53),
    }
}

/// Uniform [lo, hi) samples of dtype `dt`.
fn uniform(op: &str, shape: &[usize], dt: DType, lo: f64, hi: f64) -> Result<Tensor> {
    let n = check_alloc(op, shape, dt)?;
    match dt {
        DType::F64 => Tensor::from_vec(fill(op, n, |r| lo + (hi - lo) * r.random::<f64>())?, shape),
        DType::F32 => {
            let (l, h) = (lo as f32, hi as f32);
            if lo == 0.0 && hi == 1.0 {
                Tensor::from_vec(fill(op, n, |r| r.random::<f32>())?, shape)
            } else {
                Tensor::from_vec(fill(op, n, |r| l + (h - l) * r.random::<f32>())?, shape)
            }
        }
        DType::F16 | DType::BF16 => {
            let cap = below_one(dt);
            let v = fill(op, n, |r| r.random::<f32>() as f64)?;
            crate::match_dtype!(dt, E => Tensor::from_vec(v.into_iter().map(|u| {
                let x = E::from_f64(lo + (hi - lo) * u);
                if lo == 0.0 && hi == 1.0 && x.to_f64() >= 1.0 { E::from_f64(cap) } else { x }
            }).collect::<Vec<E>>(), shape))
        }
        d => Err(Error::dtype(
            op,
            format!("\"check_uniform_bounds\" not implemented for '{d}': {op} needs a floating point dtype"),
        )),
    }
}

/// Standard normal samples scaled: mean + std * N(0, 1).
fn normal(op: &str, shape: &[usize], dt: DType, mean: f64, std: f64) -> Result<Tensor> {
    let n = check_alloc(op, shape, dt)?;
    match dt {
        DType::F64 => Tensor::from_vec(
            fill(op, n, |r| {
                let z: f64 = StandardNormal.sample(r);
                mean + std * z
            })?,
            shape,
        ),
        DType::F32 => {
            let (m, s) = (mean as f32, std as f32);
            if mean == 0.0 && std == 1.0 {
                Tensor::from_vec(fill(op, n, |r| -> f32 { StandardNormal.sample(r) })?, shape)
            } else {
                Tensor::from_vec(
                    fill(op, n, |r| {
                        m + s * {
                            let z: f32 = StandardNormal.sample(r);
                            z
                        }
                    })?,
                    shape,
                )
            }
        }
        DType::F16 | DType::BF16 => {
            let v = fill(op, n, |r| -> f32 { StandardNormal.sample(r) })?;
            crate::match_dtype!(dt, E => Tensor::from_vec(v.into_iter().map(|z| E::from_f64(mean + std * z as f64)).collect::<Vec<E>>(), shape))
        }
        d => Err(Error::dtype(
            op,
            format!("\"normal_kernel_cpu\" not implemented for '{d}': {op} needs a floating point dtype"),
        )),
    }
}

fn need_float(op: &str, dt: DType) -> Result<()> {
    if dt.is_floating_point() {
        Ok(())
    } else {
        Err(Error::dtype(op, format!("{op} needs a floating point dtype, got {dt}")))
    }
}

// ---------------------------------------------------------------------------------------------
// rand / randn / randint / randperm / _like
// ---------------------------------------------------------------------------------------------

fn sized(op: &str, a: &[Value], size_at: usize, dtype_at: usize, default: DType) -> Result<(Vec<usize>, DType)> {
    let size = ints(op, a, size_at)?;
    let dt = opt_dtype(op, a, dtype_at)?.unwrap_or(default);
    Ok((check_size(op, &size, dt)?, dt))
}

const SIZE_DTYPE: &[ArgSpec] = &[ArgSpec::req("size", T::IntList), ArgSpec::kw("dtype", T::OptDType, D::None)];

opdef!(RAND, "rand", SIZE_DTYPE,
    meta: |a| { let (s, dt) = sized("rand", a, 0, 1, DEFAULT_FLOAT)?; need_float("rand", dt)?; Ok(meta1(&s, dt)) },
    kernel: |a| { let (s, dt) = sized("rand", a, 0, 1, DEFAULT_FLOAT)?; Ok(smallvec![uniform("rand", &s, dt, 0.0, 1.0)?]) },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "Uniform samples in [0, 1) (float32 unless dtype is given).");
opdef!(RANDN, "randn", SIZE_DTYPE,
    meta: |a| { let (s, dt) = sized("randn", a, 0, 1, DEFAULT_FLOAT)?; need_float("randn", dt)?; Ok(meta1(&s, dt)) },
    kernel: |a| { let (s, dt) = sized("randn", a, 0, 1, DEFAULT_FLOAT)?; Ok(smallvec![normal("randn", &s, dt, 0.0, 1.0)?]) },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "Standard normal samples (float32 unless dtype is given).");

fn randint_params(op: &str, a: &[Value], with_low: bool) -> Result<(i64, i64, Vec<usize>, DType)> {
    let (low, high, at) = if with_low { (int(op, a, 0)?, int(op, a, 1)?, 2) } else { (0, int(op, a, 0)?, 1) };
    let (s, dt) = sized(op, a, at, at + 1, DType::I64)?;
    if low >= high {
        return Err(Error::argument(
            op,
            format!("random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"),
        ));
    }
    if dt == DType::Bool {
        return Err(Error::dtype(op, "randint does not support dtype bool"));
    }
    Ok((low, high, s, dt))
}

fn randint_kernel(op: &str, a: &[Value], with_low: bool) -> Result<Outputs> {
    let (low, high, s, dt) = randint_params(op, a, with_low)?;
    let n: usize = s.iter().product();
    let v = fill(op, n, |r| r.random_range(low..high))?;
    Ok(smallvec![crate::ops::reduce::from_i64(v, &s, dt)?])
}

opdef!(RANDINT, "randint", &[ArgSpec::req("high", T::Int), ArgSpec::req("size", T::IntList), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (_, _, s, dt) = randint_params("randint", a, false)?; Ok(meta1(&s, dt)) },
    kernel: |a| randint_kernel("randint", a, false),
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "Uniform integers in [0, high) (int64 unless dtype is given).");
opdef!(RANDINT_LOW, "randint.low", &[ArgSpec::req("low", T::Int), ArgSpec::req("high", T::Int), ArgSpec::req("size", T::IntList), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (_, _, s, dt) = randint_params("randint.low", a, true)?; Ok(meta1(&s, dt)) },
    kernel: |a| randint_kernel("randint.low", a, true),
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "torch.randint(low, high, size): uniform integers in [low, high).");

fn randperm_params(a: &[Value]) -> Result<(usize, DType)> {
    let op = "randperm";
    let n = int(op, a, 0)?;
    let dt = opt_dtype(op, a, 1)?.unwrap_or(DType::I64);
    if n < 0 {
        return Err(Error::argument(op, format!("n must be non-negative, got {n}")));
    }
    check_alloc(op, &[n as usize], dt)?;
    Ok((n as usize, dt))
}

opdef!(RANDPERM, "randperm", &[ArgSpec::req("n", T::Int), ArgSpec::kw("dtype", T::OptDType, D::None)],
    meta: |a| { let (n, dt) = randperm_params(a)?; Ok(meta1(&[n], dt)) },
    kernel: |a| {
        let (n, dt) = randperm_params(a)?;
        let mut rng = ChaCha8Rng::seed_from_u64(next_key());
        let mut v: Vec<i64> = (0..n as i64).collect();
        for i in (1..n).rev() {
            let j = rng.random_range(0..=i);
            v.swap(i, j);
        }
        Ok(smallvec![crate::ops::reduce::from_i64(v, &[n], dt)?])
    },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "A random permutation of 0..n (int64 unless dtype is given).");

fn like(op: &str, a: &[Value]) -> Result<(Vec<usize>, DType)> {
    let t = tensor(op, a, 0)?;
    let dt = opt_dtype(op, a, 1)?.unwrap_or(t.dtype());
    need_float(op, dt)?;
    let s = t.shape().to_vec();
    check_alloc(op, &s, dt)?;
    Ok((s, dt))
}

const LIKE: &[ArgSpec] = &[ArgSpec::req("input", T::Tensor), ArgSpec::kw("dtype", T::OptDType, D::None)];

opdef!(RAND_LIKE, "rand_like", LIKE,
    meta: |a| { let (s, dt) = like("rand_like", a)?; Ok(meta1(&s, dt)) },
    kernel: |a| { let (s, dt) = like("rand_like", a)?; Ok(smallvec![uniform("rand_like", &s, dt, 0.0, 1.0)?]) },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "Uniform [0, 1) samples with the input's shape and dtype.");
opdef!(RANDN_LIKE, "randn_like", LIKE,
    meta: |a| { let (s, dt) = like("randn_like", a)?; Ok(meta1(&s, dt)) },
    kernel: |a| { let (s, dt) = like("randn_like", a)?; Ok(smallvec![normal("randn_like", &s, dt, 0.0, 1.0)?]) },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "Standard normal samples with the input's shape and dtype.");

// ---------------------------------------------------------------------------------------------
// bernoulli / dropout / native_dropout
// ---------------------------------------------------------------------------------------------

fn check_p(op: &str, p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::argument(op, format!("{op} expects p to be in [0, 1], but got p={p}")))
    }
}

fn bernoulli_meta(a: &[Value]) -> Result<MetaOutputs> {
    let op = "bernoulli";
    let t = tensor(op, a, 0)?;
    match opt_float(op, a, 1)? {
        Some(p) => check_p(op, p)?,
        None => need_float(op, t.dtype())?,
    }
    Ok(meta1(t.shape(), t.dtype()))
}

opdef!(BERNOULLI, "bernoulli", &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("p", T::OptFloat, D::None)],
    meta: bernoulli_meta,
    kernel: |a| {
        let op = "bernoulli";
        bernoulli_meta(a)?;
        let t = tensor(op, a, 0)?;
        let shape = t.shape().to_vec();
        let n = t.numel();
        let u = fill(op, n, |r| r.random::<f64>())?;
        let draws: Vec<bool> = match opt_float(op, a, 1)? {
            Some(p) => u.into_iter().map(|u| u < p).collect(),
            None => {
                let probs = t.to_vec_f64()?;
                if let Some(bad) = probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
                    return Err(Error::argument(op, format!("bernoulli expects all probabilities in the input to be in [0, 1], but found {bad}")));
                }
                u.into_iter().zip(probs).map(|(u, p)| u < p).collect()
            }
        };
        let dt = t.dtype();
        let out = crate::match_dtype!(dt, E => Tensor::from_vec(draws.into_iter().map(|b| E::from_i64(b as i64)).collect::<Vec<E>>(), &shape)?);
        Ok(smallvec![out])
    },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    doc: "Samples 0/1 with probability given by the input's elements (or by p), in the input's dtype.");

fn dropout_check(op: &str, a: &[Value]) -> Result<(f64, bool)> {
    let t = tensor(op, a, 0)?;
    let p = float(op, a, 1)?;
    let train = bool_(op, a, 2)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::argument(op, format!("dropout probability has to be between 0 and 1, but got {p}")));
    }
    need_float(op, t.dtype())?;
    Ok((p, train))
}

/// Dropout: output and keep-mask.
fn dropout_impl(op: &str, t: &Tensor, p: f64) -> Result<(Tensor, Tensor)> {
    let shape = t.shape().to_vec();
    let n = t.numel();
    let keep: Vec<bool> = if p == 0.0 {
        vec![true; n]
    } else if p == 1.0 {
        vec![false; n]
    } else {
        fill(op, n, |r| r.random::<f64>() >= p)?
    };
    let dt = t.dtype();
    let x = kernel::contiguous(t)?;
    let out = crate::match_dtype!(dt, E => {
        let scale = if p == 1.0 { 0.0 } else { E::from_f64(1.0 / (1.0 - p)).to_f64() };
        let v: Vec<E> = x.with_contiguous::<E, _>(op, |d| d.iter().zip(&keep).map(|(&x, &k)| if k { E::from_f64(x.to_f64() * scale) } else { E::from_f64(0.0) }).collect())?;
        Tensor::from_vec(v, &shape)?
    });
    Ok((out, Tensor::from_vec(keep, &shape)?))
}

opdef!(DROPOUT, "dropout", &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("p", T::Float, D::Float(0.5)), ArgSpec::opt("training", T::Bool, D::Bool(true))],
    meta: |a| { dropout_check("dropout", a)?; let t = tensor("dropout", a, 0)?; Ok(meta1(t.shape(), t.dtype())) },
    kernel: |a| {
        let (p, train) = dropout_check("dropout", a)?;
        let t = tensor("dropout", a, 0)?;
        if !train || p == 0.0 {
            return Ok(smallvec![t.clone()]);
        }
        Ok(smallvec![dropout_impl("dropout", t, p)?.0])
    },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    backward: crate::autograd::formulas::index::dropout_backward, saves: crate::op::Saves { inputs: 1, outputs: 1 },
    doc: "Zeroes each element with probability p and scales the rest by 1/(1-p) when training; the input itself otherwise.");

opdef!(NATIVE_DROPOUT, "native_dropout", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("p", T::Float), ArgSpec::opt("train", T::Bool, D::Bool(true))],
    meta: |a| {
        dropout_check("native_dropout", a)?;
        let t = tensor("native_dropout", a, 0)?;
        Ok(smallvec![TensorMeta::contiguous(t.shape(), t.dtype()), TensorMeta::contiguous(t.shape(), DType::Bool)])
    },
    kernel: |a| {
        let (p, train) = dropout_check("native_dropout", a)?;
        let t = tensor("native_dropout", a, 0)?;
        let (o, m) = if train { dropout_impl("native_dropout", t, p)? } else {
            (kernel::contiguous(t)?, crate::ops::creation::filled("native_dropout", t.shape(), DType::Bool, crate::Scalar::Bool(true))?)
        };
        Ok(smallvec![o, m])
    },
    cost: cost_elementwise, effect: Effect::Random, category: Category::Random,
    backward: crate::autograd::formulas::index::native_dropout_backward, saves: crate::op::Saves { inputs: 0, outputs: 2 },
    doc: "Dropout returning (output, keep mask); the mask lets backward rescale gradients.");

// ---------------------------------------------------------------------------------------------
// in-place uniform_ / normal_
// ---------------------------------------------------------------------------------------------

fn inplace_meta(op: &str, a: &[Value]) -> Result<MetaOutputs> {
    let t = tensor(op, a, 0)?;
    need_float(op, t.dtype())?;
    Ok(meta1(t.shape(), t.dtype()))
}

opdef!(UNIFORM_, "uniform_", &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("from", T::Float, D::Float(0.0)), ArgSpec::opt("to", T::Float, D::Float(1.0))],
    meta: |a| inplace_meta("uniform_", a),
    kernel: |a| {
        let op = "uniform_";
        inplace_meta(op, a)?;
        let t = tensor(op, a, 0)?;
        let (lo, hi) = (float(op, a, 1)?, float(op, a, 2)?);
        if lo > hi {
            return Err(Error::argument(op, format!("uniform_ expects to return a [from, to) range, but found from={lo} > to={hi}")));
        }
        let v = uniform(op, t.shape(), t.dtype(), lo, hi)?;
        kernel::copy_into(op, t, &v)?;
        Ok(smallvec![t.clone()])
    },
    cost: cost_elementwise, effect: Effect::Mutates(0), category: Category::Random,
    doc: "Fills the input in place with uniform samples in [from, to).");
opdef!(NORMAL_, "normal_", &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("mean", T::Float, D::Float(0.0)), ArgSpec::opt("std", T::Float, D::Float(1.0))],
    meta: |a| inplace_meta("normal_", a),
    kernel: |a| {
        let op = "normal_";
        inplace_meta(op, a)?;
        let t = tensor(op, a, 0)?;
        let (m, s) = (float(op, a, 1)?, float(op, a, 2)?);
        if s < 0.0 {
            return Err(Error::argument(op, format!("normal expects std >= 0.0, but found std {s}")));
        }
        let v = normal(op, t.shape(), t.dtype(), m, s)?;
        kernel::copy_into(op, t, &v)?;
        Ok(smallvec![t.clone()])
    },
    cost: cost_elementwise, effect: Effect::Mutates(0), category: Category::Random,
    doc: "Fills the input in place with normal samples of the given mean and std.");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[
    &RAND,
    &RANDN,
    &RANDINT,
    &RANDINT_LOW,
    &RANDPERM,
    &RAND_LIKE,
    &RANDN_LIKE,
    &BERNOULLI,
    &DROPOUT,
    &NATIVE_DROPOUT,
    &UNIFORM_,
    &NORMAL_,
];

/// `torch.rand(size, dtype=)`.
pub fn rand(size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
    call1(&RAND, CallKind::Function, &[size.into(), dtype.into()])
}
/// `torch.randn(size, dtype=)`.
pub fn randn(size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
    call1(&RANDN, CallKind::Function, &[size.into(), dtype.into()])
}
/// `torch.randint(low, high, size, dtype=)` (op `randint.low`).
pub fn randint(low: i64, high: i64, size: &[i64], dtype: Option<DType>) -> Result<Tensor> {
    call1(&RANDINT_LOW, CallKind::Function, &[low.into(), high.into(), size.into(), dtype.into()])
}
/// `torch.randperm(n, dtype=)`.
pub fn randperm(n: i64, dtype: Option<DType>) -> Result<Tensor> {
    call1(&RANDPERM, CallKind::Function, &[n.into(), dtype.into()])
}
/// `torch.rand_like(input, dtype=)`.
pub fn rand_like(input: &Tensor, dtype: Option<DType>) -> Result<Tensor> {
    call1(&RAND_LIKE, CallKind::Function, &[input.into(), dtype.into()])
}
/// `torch.randn_like(input, dtype=)`.
pub fn randn_like(input: &Tensor, dtype: Option<DType>) -> Result<Tensor> {
    call1(&RANDN_LIKE, CallKind::Function, &[input.into(), dtype.into()])
}
/// `torch.bernoulli(input)` (input holds probabilities) or `torch.bernoulli(input, p)`.
pub fn bernoulli(input: &Tensor, p: Option<f64>) -> Result<Tensor> {
    call1(&BERNOULLI, CallKind::Function, &[input.into(), p.into()])
}
/// `F.dropout(input, p, training)`.
pub fn dropout(input: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    call1(&DROPOUT, CallKind::Function, &[input.into(), p.into(), training.into()])
}
/// `torch.native_dropout(input, p, train)`: `(output, keep_mask)`.
pub fn native_dropout(input: &Tensor, p: f64, train: bool) -> Result<(Tensor, Tensor)> {
    call2(&NATIVE_DROPOUT, CallKind::Function, &[input.into(), p.into(), train.into()])
}

impl Tensor {
    /// `x.uniform_(from, to)` (in place; returns `self`).
    pub fn uniform_(&self, from: f64, to: f64) -> Result<Tensor> {
        call1(&UNIFORM_, CallKind::Method, &[self.into(), from.into(), to.into()])
    }
    /// `x.normal_(mean, std)` (in place; returns `self`).
    pub fn normal_(&self, mean: f64, std: f64) -> Result<Tensor> {
        call1(&NORMAL_, CallKind::Method, &[self.into(), mean.into(), std.into()])
    }
    /// `x.bernoulli()` / `x.bernoulli(p)`.
    pub fn bernoulli(&self, p: Option<f64>) -> Result<Tensor> {
        call1(&BERNOULLI, CallKind::Method, &[self.into(), p.into()])
    }
}
