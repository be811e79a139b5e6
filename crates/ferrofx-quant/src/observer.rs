//! Observers: record the range of the values that flow through a point of the model during
//! calibration and compute quantization parameters from it (`torch.ao.quantization.observer`).
//!
//! Observers take `&self` (their statistics sit behind a lock) so a model that holds them can
//! be run for calibration like any other. They skip empty tensors, as PyTorch's do. Unlike
//! PyTorch's, they count NaN and infinite values instead of folding them into the range, and
//! [`Observer::calculate_qparams`] refuses a range built from them (and an observer that saw
//! nothing) with an error naming the observer.

use crate::qparams::{calculate_qparams, QParams, QScheme};
use crate::ObserverConfig;
use ferrofx_core::{DType, Error, Result, Tensor};
use parking_lot::Mutex;

/// What every observer does.
pub trait Observer: Send + Sync {
    /// PyTorch's class name (`MinMaxObserver`, ...), used in errors and printouts.
    fn name(&self) -> &'static str;
    /// Records the statistics of `x` (any float dtype; not modified).
    fn observe(&self, x: &Tensor) -> Result<()>;
    /// Scale and zero point from what was observed so far.
    fn calculate_qparams(&self) -> Result<QParams>;
    /// The observed per-channel (or single) minima and maxima.
    fn min_max(&self) -> (Vec<f32>, Vec<f32>);
    /// The configuration (dtype, scheme, range).
    fn config(&self) -> &ObserverConfig;
    /// Forgets everything observed.
    fn reset(&self);
}

/// Finite min and max of `x` and the number of non-finite values, in f32.
fn finite_min_max(op: &str, x: &Tensor) -> Result<(f32, f32, usize)> {
    let x = if x.dtype() == DType::F32 { x.clone() } else { float_input(op, x)? };
    x.with_contiguous::<f32, _>(op, |v| {
        let (mut lo, mut hi, mut bad) = (f32::INFINITY, f32::NEG_INFINITY, 0usize);
        for &e in v {
            if e.is_finite() {
                lo = lo.min(e);
                hi = hi.max(e);
            } else {
                bad += 1;
            }
        }
        (lo, hi, bad)
    })
}

fn float_input(op: &str, x: &Tensor) -> Result<Tensor> {
    if !x.dtype().is_floating_point() {
        return Err(Error::dtype(op, format!("observers watch floating point tensors, got {}", x.dtype())));
    }
    x.to_dtype(DType::F32)
}

fn nonfinite_error(op: &str, bad: usize, seen: usize) -> Error {
    Error::argument(
        op,
        format!(
            "the observer saw {bad} NaN or infinite values among {seen}: the calibration data (or the float model on it) is not finite; fix the data before calculate_qparams"
        ),
    )
}

#[derive(Debug, Clone, Copy)]
struct Range {
    min: f32,
    max: f32,
    seen: usize,
    nonfinite: usize,
}

impl Range {
    const EMPTY: Range = Range { min: f32::INFINITY, max: f32::NEG_INFINITY, seen: 0, nonfinite: 0 };
}

fn per_tensor_config(op: &str, config: ObserverConfig) -> Result<ObserverConfig> {
    config.validate(op)?;
    if config.qscheme.is_per_channel() {
        return Err(Error::argument(
            op,
            format!("{} is a per-channel scheme: use PerChannelMinMaxObserver", config.qscheme.name()),
        ));
    }
    Ok(config)
}

/// `MinMaxObserver`: the running minimum and maximum of everything observed.
#[derive(Debug)]
pub struct MinMaxObserver {
    config: ObserverConfig,
    range: Mutex<Range>,
}

impl MinMaxObserver {
    /// An observer with a per-tensor configuration (PyTorch's default is
    /// [`ObserverConfig::default`]). Panics never; a per-channel scheme is reported by
    /// [`MinMaxObserver::try_new`].
    pub fn new(config: ObserverConfig) -> MinMaxObserver {
        MinMaxObserver { config, range: Mutex::new(Range::EMPTY) }
    }
    /// As [`MinMaxObserver::new`], checking the configuration first.
    pub fn try_new(config: ObserverConfig) -> Result<MinMaxObserver> {
        Ok(MinMaxObserver::new(per_tensor_config("MinMaxObserver", config)?))
    }
}

impl Observer for MinMaxObserver {
    fn name(&self) -> &'static str {
        "MinMaxObserver"
    }
    fn observe(&self, x: &Tensor) -> Result<()> {
        if x.numel() == 0 {
            return Ok(());
        }
        let (lo, hi, bad) = finite_min_max(self.name(), x)?;
        let mut r = self.range.lock();
        r.min = r.min.min(lo);
        r.max = r.max.max(hi);
        r.seen += x.numel();
        r.nonfinite += bad;
        Ok(())
    }
    fn calculate_qparams(&self) -> Result<QParams> {
        let r = *self.range.lock();
        if r.nonfinite > 0 {
            return Err(nonfinite_error(self.name(), r.nonfinite, r.seen));
        }
        calculate_qparams(self.name(), &[r.min], &[r.max], &per_tensor_config(self.name(), self.config)?)
    }
    fn min_max(&self) -> (Vec<f32>, Vec<f32>) {
        let r = *self.range.lock();
        (vec![r.min], vec![r.max])
    }
    fn config(&self) -> &ObserverConfig {
        &self.config
    }
    fn reset(&self) {
        *self.range.lock() = Range::EMPTY;
    }
}

/// `MovingAverageMinMaxObserver`: the first batch sets the range, each later batch moves it by
/// `averaging_constant` towards the batch's own min and max (`min += c * (batch_min - min)`).
#[derive(Debug)]
pub struct MovingAverageMinMaxObserver {
    config: ObserverConfig,
    averaging_constant: f32,
    range: Mutex<Range>,
}

impl MovingAverageMinMaxObserver {
    /// PyTorch's default `averaging_constant` is 0.01.
    pub const DEFAULT_AVERAGING_CONSTANT: f64 = 0.01;

    /// An observer with the given per-tensor configuration and averaging constant in `(0, 1]`.
    pub fn new(config: ObserverConfig, averaging_constant: f64) -> Result<MovingAverageMinMaxObserver> {
        let op = "MovingAverageMinMaxObserver";
        let config = per_tensor_config(op, config)?;
        if !(averaging_constant > 0.0 && averaging_constant <= 1.0) {
            return Err(Error::argument(op, format!("averaging_constant must be in (0, 1], got {averaging_constant}")));
        }
        Ok(MovingAverageMinMaxObserver {
            config,
            averaging_constant: averaging_constant as f32,
            range: Mutex::new(Range::EMPTY),
        })
    }
}

impl Observer for MovingAverageMinMaxObserver {
    fn name(&self) -> &'static str {
        "MovingAverageMinMaxObserver"
    }
    fn observe(&self, x: &Tensor) -> Result<()> {
        if x.numel() == 0 {
            return Ok(());
        }
        let (lo, hi, bad) = finite_min_max(self.name(), x)?;
        let mut r = self.range.lock();
        r.seen += x.numel();
        r.nonfinite += bad;
        if lo > hi {
            return Ok(()); // nothing finite in this batch (counted above)
        }
        if r.min == f32::INFINITY && r.max == f32::NEG_INFINITY {
            r.min = lo;
            r.max = hi;
        } else {
            let c = self.averaging_constant;
            r.min += c * (lo - r.min);
            r.max += c * (hi - r.max);
        }
        Ok(())
    }
    fn calculate_qparams(&self) -> Result<QParams> {
        let r = *self.range.lock();
        if r.nonfinite > 0 {
            return Err(nonfinite_error(self.name(), r.nonfinite, r.seen));
        }
        calculate_qparams(self.name(), &[r.min], &[r.max], &self.config)
    }
    fn min_max(&self) -> (Vec<f32>, Vec<f32>) {
        let r = *self.range.lock();
        (vec![r.min], vec![r.max])
    }
    fn config(&self) -> &ObserverConfig {
        &self.config
    }
    fn reset(&self) {
        *self.range.lock() = Range::EMPTY;
    }
}

#[derive(Debug, Default)]
struct ChannelRanges {
    min: Vec<f32>,
    max: Vec<f32>,
    seen: usize,
    nonfinite: usize,
}

/// `PerChannelMinMaxObserver`: the running minimum and maximum of each slice along `ch_axis`
/// (weights: axis 0, int8, per-channel symmetric).
#[derive(Debug)]
pub struct PerChannelMinMaxObserver {
    config: ObserverConfig,
    ch_axis: i64,
    ranges: Mutex<ChannelRanges>,
}

impl PerChannelMinMaxObserver {
    /// An observer of the channels along `ch_axis` (negative counts from the end) with a
    /// per-channel configuration ([`ObserverConfig::per_channel_weight`] for weights).
    pub fn new(config: ObserverConfig, ch_axis: i64) -> Result<PerChannelMinMaxObserver> {
        let op = "PerChannelMinMaxObserver";
        config.validate(op)?;
        if !config.qscheme.is_per_channel() {
            return Err(Error::argument(
                op,
                format!(
                    "{} is a per-tensor scheme: use MinMaxObserver, or a per_channel_* scheme",
                    config.qscheme.name()
                ),
            ));
        }
        Ok(PerChannelMinMaxObserver { config, ch_axis, ranges: Mutex::new(ChannelRanges::default()) })
    }
    /// The channel axis as given.
    pub fn ch_axis(&self) -> i64 {
        self.ch_axis
    }
}

impl Observer for PerChannelMinMaxObserver {
    fn name(&self) -> &'static str {
        "PerChannelMinMaxObserver"
    }
    fn observe(&self, x: &Tensor) -> Result<()> {
        let op = self.name();
        if x.numel() == 0 {
            return Ok(());
        }
        let nd = x.ndim() as i64;
        if self.ch_axis < -nd || self.ch_axis >= nd {
            return Err(Error::index(
                op,
                format!("ch_axis {} is out of range for an observed tensor of shape {:?}", self.ch_axis, x.shape()),
            ));
        }
        let axis = if self.ch_axis < 0 { self.ch_axis + nd } else { self.ch_axis } as usize;
        let shape = x.shape().to_vec();
        let c = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let x = if x.dtype() == DType::F32 { x.clone() } else { float_input(op, x)? };
        let (lo, hi, bad) = x.with_contiguous::<f32, _>(op, |v| {
            let mut lo = vec![f32::INFINITY; c];
            let mut hi = vec![f32::NEG_INFINITY; c];
            let mut bad = 0usize;
            for (i, &e) in v.iter().enumerate() {
                let ch = (i / inner) % c;
                if e.is_finite() {
                    lo[ch] = lo[ch].min(e);
                    hi[ch] = hi[ch].max(e);
                } else {
                    bad += 1;
                }
            }
            (lo, hi, bad)
        })?;
        let mut r = self.ranges.lock();
        if r.min.is_empty() {
            r.min = lo;
            r.max = hi;
        } else if r.min.len() != c {
            return Err(Error::shape(
                op,
                format!(
                    "the observed tensor {shape:?} has {c} channels along axis {axis}, but earlier ones had {}",
                    r.min.len()
                ),
            ));
        } else {
            for i in 0..c {
                r.min[i] = r.min[i].min(lo[i]);
                r.max[i] = r.max[i].max(hi[i]);
            }
        }
        r.seen += x.numel();
        r.nonfinite += bad;
        Ok(())
    }
    fn calculate_qparams(&self) -> Result<QParams> {
        let r = self.ranges.lock();
        if r.nonfinite > 0 {
            return Err(nonfinite_error(self.name(), r.nonfinite, r.seen));
        }
        calculate_qparams(self.name(), &r.min, &r.max, &self.config)
    }
    fn min_max(&self) -> (Vec<f32>, Vec<f32>) {
        let r = self.ranges.lock();
        (r.min.clone(), r.max.clone())
    }
    fn config(&self) -> &ObserverConfig {
        &self.config
    }
    fn reset(&self) {
        *self.ranges.lock() = ChannelRanges::default();
    }
}

impl QScheme {
    /// The observer PyTorch pairs with this scheme by default: per-channel schemes watch axis 0.
    pub fn default_observer(self, dtype: DType) -> Result<Box<dyn Observer>> {
        let config = ObserverConfig { dtype, qscheme: self, ..Default::default() };
        Ok(if self.is_per_channel() {
            Box::new(PerChannelMinMaxObserver::new(config, 0)?)
        } else {
            Box::new(MinMaxObserver::try_new(config)?)
        })
    }
}
