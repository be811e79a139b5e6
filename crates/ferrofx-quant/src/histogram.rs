//! `HistogramObserver`: a running histogram of the observed values and an L2-minimising search
//! for the clipping range (`torch.ao.quantization.HistogramObserver`, after caffe2's
//! `NormMinimization::NonlinearQuantizationParamsSearch`).
//!
//! The arithmetic follows PyTorch's step by step in the same precision (f32 tensors, f64
//! Python scalars), so the chosen range and the scale/zero point match PyTorch's goldens:
//!
//! - the first batch sets `min`/`max` and a `bins`-bin histogram over them (`torch.histc`:
//!   edges `linspace(min, max, bins + 1)` in f32, the last bin closed);
//! - a later batch that widens the range re-bins the old histogram into the new range by
//!   splitting every bin into 16 equal parts and moving each part's mass to the new bin that
//!   holds its midpoint (`_upscale_histogram`), then adds the batch's own histogram;
//! - `calculate_qparams` walks the cumulative histogram inwards from both ends in quantile
//!   steps of `1e-5`, moving whichever end frees more bins, and stops as soon as the L2 error of
//!   quantizing the histogram to `2^bits` levels over the candidate range grows
//!   (`_non_linear_param_search` / `_compute_quantization_error`).

use crate::qparams::{calculate_qparams, QParams};
use crate::{Observer, ObserverConfig};
use ferrofx_core::{DType, Error, Result, Tensor};
use parking_lot::Mutex;

/// Levels each source bin is split into when the range grows (PyTorch's `upsample_rate`).
const UPSAMPLE_RATE: usize = 16;

#[derive(Debug, Clone)]
struct State {
    histogram: Vec<f32>,
    min: f32,
    max: f32,
    seen: usize,
    nonfinite: usize,
}

/// `HistogramObserver`: per-tensor activation observer that clips outliers by minimising the
/// L2 quantization error over a histogram of everything observed.
///
/// ```
/// use ferrofx_core::Tensor;
/// use ferrofx_quant::{HistogramObserver, Observer, ObserverConfig};
/// let obs = HistogramObserver::new(ObserverConfig::default(), 2048).unwrap();
/// obs.observe(&Tensor::from_vec((0..1000).map(|i| i as f32 / 100.0).collect(), &[1000]).unwrap()).unwrap();
/// let qp = obs.calculate_qparams().unwrap();
/// assert_eq!(qp.zero_point, vec![0]);
/// assert!(qp.scale[0] > 9.9 / 255.0 && qp.scale[0] <= 9.99 / 255.0);
/// ```
#[derive(Debug)]
pub struct HistogramObserver {
    config: ObserverConfig,
    bins: usize,
    state: Mutex<State>,
}

impl HistogramObserver {
    /// PyTorch's default bin count.
    pub const DEFAULT_BINS: usize = 2048;

    /// The largest bin count accepted: the histogram holds `bins` floats per observer and
    /// `calculate_qparams`'s range search costs `O(bins)` per step over up to `bins` steps, so a
    /// larger count (e.g. from a corrupted config) is refused rather than allocated.
    pub const MAX_BINS: usize = 1 << 16;

    /// An observer with a per-tensor configuration and `bins` histogram bins (2048 in
    /// PyTorch; at least 1, at most [`HistogramObserver::MAX_BINS`]).
    pub fn new(config: ObserverConfig, bins: usize) -> Result<HistogramObserver> {
        let op = "HistogramObserver";
        config.validate(op)?;
        if config.qscheme.is_per_channel() {
            return Err(Error::argument(
                op,
                format!(
                    "{} is a per-channel scheme: HistogramObserver supports per_tensor_affine and per_tensor_symmetric only (as PyTorch's)",
                    config.qscheme.name()
                ),
            ));
        }
        if bins == 0 || bins > Self::MAX_BINS {
            return Err(Error::argument(
                op,
                format!(
                    "bins must be in 1..={}, got {bins} (PyTorch's default is {}; more bins only slow calculate_qparams down)",
                    Self::MAX_BINS,
                    Self::DEFAULT_BINS
                ),
            ));
        }
        Ok(HistogramObserver { config, bins, state: Mutex::new(Self::empty(bins)) })
    }

    fn empty(bins: usize) -> State {
        State { histogram: vec![0.0; bins], min: f32::INFINITY, max: f32::NEG_INFINITY, seen: 0, nonfinite: 0 }
    }

    /// The number of bins.
    pub fn bins(&self) -> usize {
        self.bins
    }

    /// The current histogram (one count per bin over `[min, max]` of [`Observer::min_max`]).
    pub fn histogram(&self) -> Vec<f32> {
        self.state.lock().histogram.clone()
    }

    /// The clipping range the L2 search picks, before it becomes a scale and zero point
    /// (PyTorch's `_non_linear_param_search`).
    pub fn search_range(&self) -> Result<(f32, f32)> {
        let s = self.state.lock();
        if s.nonfinite > 0 {
            return Err(nonfinite(s.nonfinite, s.seen));
        }
        if s.min == f32::INFINITY && s.max == f32::NEG_INFINITY {
            return Err(Error::argument(
                "HistogramObserver",
                "the observer saw no data: run calibration data through the prepared model before convert",
            ));
        }
        Ok(non_linear_param_search(&s, self.config.dtype))
    }
}

fn nonfinite(bad: usize, seen: usize) -> Error {
    Error::argument(
        "HistogramObserver",
        format!(
            "the observer saw {bad} NaN or infinite values among {seen}: the calibration data (or the float model on it) is not finite; fix the data before calculate_qparams"
        ),
    )
}

/// `torch.linspace(start, end, steps)` for f32 on the CPU: the first half counts up from
/// `start`, the second half down from `end`.
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps).map(|i| if i < half { start + step * i as f32 } else { end - step * (steps - i - 1) as f32 }).collect()
}

/// `torch.histc(values, bins, min, max)` in f32: elements outside the edges are dropped, the
/// bin comes from a linear estimate corrected against the f32 edges, the last bin is closed.
fn histc(values: &[f32], bins: usize, min: f32, max: f32) -> Vec<f32> {
    let (mut lo, mut hi) = (min as f64, max as f64);
    if lo == hi {
        lo -= 1.0;
        hi += 1.0;
    }
    let edges = linspace(lo as f32, hi as f32, bins + 1);
    let (left, right) = (edges[0], edges[bins]);
    let mut hist = vec![0.0f32; bins];
    for &e in values {
        if !(e >= left && e <= right) {
            continue;
        }
        let est = ((e - left) * bins as f32 / (right - left)) as i64;
        let lo_i = (est - 1).max(0) as usize;
        let hi_i = ((est + 2).max(0) as usize).min(bins + 1);
        let mut pos = lo_i + edges[lo_i..hi_i.max(lo_i)].partition_point(|&b| b <= e);
        pos = pos.saturating_sub(1);
        if pos == bins {
            pos -= 1;
        }
        hist[pos] += 1.0;
    }
    hist
}

/// `_upscale_histogram`: the old histogram's mass, split 16 ways per bin, moved to the bins of
/// `[new_min, new_max]` that hold each part's midpoint.
fn upscale(hist: &[f32], old_min: f32, old_max: f32, new_min: f32, new_max: f32) -> Vec<f32> {
    let bins = hist.len();
    let fine = bins * UPSAMPLE_RATE;
    let bin_size = (old_max - old_min) / fine as f32;
    let half = 0.5f32 * bin_size;
    let mids = linspace(old_min, old_max, fine + 1);
    let bounds = linspace(new_min, new_max, bins + 1);
    let mut out = vec![0.0f32; bins];
    for (i, &m) in mids[..fine].iter().enumerate() {
        let mid = m + half;
        // bucketize(right=True) - 1: the number of boundaries <= mid, minus one
        let b = (bounds.partition_point(|&x| x <= mid) as i64 - 1).clamp(0, bins as i64 - 1) as usize;
        out[b] += hist[i / UPSAMPLE_RATE] / UPSAMPLE_RATE as f32;
    }
    out
}

/// `torch.div(a, b, rounding_mode="floor")` for floats (Python's floor division).
fn div_floor(a: f32, b: f32) -> f32 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut f = div.floor();
        if div - f > 0.5 {
            f += 1.0;
        }
        f
    } else {
        (0.0f32).copysign(a / b)
    }
}

/// `density * (end^3 - begin^3) / 3`.
fn l2(begin: f32, end: f32, density: f32) -> f32 {
    density * ((end * end * end - begin * begin * begin) / 3.0)
}

/// `_compute_quantization_error`: L2 error of quantizing the histogram to `dst_bins` levels
/// spread over bins `start..=end`.
fn quantization_error(s: &State, dst_bins: usize, start: usize, end: usize) -> f64 {
    let bins = s.histogram.len();
    let bin_width = (s.max as f64 - s.min as f64) / bins as f64;
    let dst_width = bin_width * (end - start + 1) as f64 / dst_bins as f64;
    if dst_width == 0.0 {
        return 0.0;
    }
    let (bw, dw, dw_half) = (bin_width as f32, dst_width as f32, (dst_width / 2.0) as f32);
    let neg_half = (-dst_width / 2.0) as f32;
    let last = (dst_bins - 1) as f32;
    let mut sum = 0.0f64;
    for (i, &count) in s.histogram.iter().enumerate() {
        let begin = (i as i64 - start as i64) as f32 * bw;
        let end_ = begin + bw;
        let d_begin = div_floor(begin, dw).clamp(0.0, last);
        let d_end = div_floor(end_, dw).clamp(0.0, last);
        let density = count / bw;
        let mut norm = 0.0f32;
        norm += l2(begin - (d_begin + 0.5) * dw, dw_half, density);
        norm += (d_end - d_begin - 1.0) * l2(neg_half, dw_half, density);
        norm += l2(neg_half, end_ - (d_end * dw + dw_half), density);
        sum += norm as f64;
    }
    sum as f32 as f64
}

/// `_non_linear_param_search`: the `[min, max]` the histogram is quantized over.
fn non_linear_param_search(s: &State, dtype: DType) -> (f32, f32) {
    let bins = s.histogram.len();
    let dst_bins = 1usize << (dtype.size() * 8);
    let bin_width = (s.max - s.min) / bins as f32;
    let total = s.histogram.iter().map(|&v| v as f64).sum::<f64>() as f32 as f64;
    let mut acc = 0.0f64;
    let csum: Vec<f32> = s
        .histogram
        .iter()
        .map(|&v| {
            acc += v as f64;
            acc as f32
        })
        .collect();
    let step = 1e-5f64;
    let (mut alpha, mut beta) = (0.0f64, 1.0f64);
    let (mut start, mut end) = (0usize, bins - 1);
    let mut norm_min = f64::INFINITY;
    while alpha < beta {
        let next_alpha = alpha + step;
        let next_beta = beta - step;
        let (lo_bound, hi_bound) = ((next_alpha * total) as f32, (next_beta * total) as f32);
        let mut l = start;
        while l < end && csum[l] < lo_bound {
            l += 1;
        }
        let mut r = end;
        while r > start && csum[r] > hi_bound {
            r -= 1;
        }
        let (mut next_start, mut next_end) = (start, end);
        if l - start > end - r {
            next_start = l;
            alpha = next_alpha;
        } else {
            next_end = r;
            beta = next_beta;
        }
        if next_start == start && next_end == end {
            continue;
        }
        let norm = quantization_error(s, dst_bins, next_start, next_end);
        if norm > norm_min {
            break;
        }
        norm_min = norm;
        start = next_start;
        end = next_end;
    }
    (s.min + bin_width * start as f32, s.min + bin_width * (end + 1) as f32)
}

impl Observer for HistogramObserver {
    fn name(&self) -> &'static str {
        "HistogramObserver"
    }
    fn observe(&self, x: &Tensor) -> Result<()> {
        let op = self.name();
        if x.numel() == 0 {
            return Ok(());
        }
        if !x.dtype().is_floating_point() {
            return Err(Error::dtype(op, format!("observers watch floating point tensors, got {}", x.dtype())));
        }
        let x = if x.dtype() == DType::F32 { x.clone() } else { x.to_dtype(DType::F32)? };
        let numel = x.numel();
        let (finite, bad) = x.with_contiguous::<f32, _>(op, |v| {
            let finite: Vec<f32> = v.iter().copied().filter(|e| e.is_finite()).collect();
            let bad = v.len() - finite.len();
            (finite, bad)
        })?;
        let mut s = self.state.lock();
        s.seen += numel;
        s.nonfinite += bad;
        if finite.is_empty() {
            return Ok(());
        }
        let (lo, hi) = finite.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &e| (a.min(e), b.max(e)));
        if s.min == f32::INFINITY || s.max == f32::NEG_INFINITY {
            s.histogram = histc(&finite, self.bins, lo, hi);
            s.min = lo;
            s.max = hi;
            return Ok(());
        }
        let (new_min, new_max) = (s.min.min(lo), s.max.max(hi));
        let update = histc(&finite, self.bins, new_min, new_max);
        if new_min == s.min && new_max == s.max {
            for (h, u) in s.histogram.iter_mut().zip(&update) {
                *h += u;
            }
            return Ok(());
        }
        let old = if s.min == s.max {
            let mass: f32 = s.histogram.iter().sum();
            histc(&[s.min], self.bins, new_min, new_max).into_iter().map(|v| v * mass).collect()
        } else {
            upscale(&s.histogram, s.min, s.max, new_min, new_max)
        };
        s.histogram = update.iter().zip(&old).map(|(u, o)| u + o).collect();
        s.min = new_min;
        s.max = new_max;
        Ok(())
    }
    fn calculate_qparams(&self) -> Result<QParams> {
        let (lo, hi) = self.search_range()?;
        calculate_qparams(self.name(), &[lo], &[hi], &self.config)
    }
    fn min_max(&self) -> (Vec<f32>, Vec<f32>) {
        let s = self.state.lock();
        (vec![s.min], vec![s.max])
    }
    fn config(&self) -> &ObserverConfig {
        &self.config
    }
    fn reset(&self) {
        *self.state.lock() = Self::empty(self.bins);
    }
}
