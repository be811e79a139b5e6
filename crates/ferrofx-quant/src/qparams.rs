//! Quantization schemes and the scale/zero-point computation of `torch.ao.quantization`'s
//! observers (`ObserverBase._calculate_qparams`), in the same f32 arithmetic so results match
//! PyTorch's to the bit.

use ferrofx_core::{DType, Error, Result};

/// How values map to integers (`torch.per_tensor_affine`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QScheme {
    /// One scale and zero point; the range `[min, max]` (widened to include 0) maps to
    /// `[qmin, qmax]`.
    PerTensorAffine,
    /// One scale; the range is symmetric around 0 (zero point 0 for int8, 128 for uint8).
    PerTensorSymmetric,
    /// Affine, one scale and zero point per channel.
    PerChannelAffine,
    /// Symmetric, one scale per channel (PyTorch's weight default on x86).
    PerChannelSymmetric,
}

impl QScheme {
    /// `true` for the symmetric schemes.
    pub fn is_symmetric(self) -> bool {
        matches!(self, QScheme::PerTensorSymmetric | QScheme::PerChannelSymmetric)
    }
    /// `true` for the per-channel schemes.
    pub fn is_per_channel(self) -> bool {
        matches!(self, QScheme::PerChannelAffine | QScheme::PerChannelSymmetric)
    }
    /// PyTorch's name (`per_tensor_affine`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QScheme::PerTensorAffine => "per_tensor_affine",
            QScheme::PerTensorSymmetric => "per_tensor_symmetric",
            QScheme::PerChannelAffine => "per_channel_affine",
            QScheme::PerChannelSymmetric => "per_channel_symmetric",
        }
    }
    /// Parses PyTorch's names (with or without `torch.`).
    pub fn parse(s: &str) -> Option<QScheme> {
        Some(match s.strip_prefix("torch.").unwrap_or(s) {
            "per_tensor_affine" => QScheme::PerTensorAffine,
            "per_tensor_symmetric" => QScheme::PerTensorSymmetric,
            "per_channel_affine" => QScheme::PerChannelAffine,
            "per_channel_symmetric" => QScheme::PerChannelSymmetric,
            _ => return None,
        })
    }
}

/// What an observer quantizes to: PyTorch's observer arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObserverConfig {
    /// `uint8` (quint8) or `int8` (qint8).
    pub dtype: DType,
    /// The scheme.
    pub qscheme: QScheme,
    /// Use one bit less of range (`0..=127` for uint8, `-64..=63` for int8), as PyTorch's
    /// fbgemm configs do to avoid the i16 saturation of AVX2 kernels.
    pub reduce_range: bool,
    /// The smallest scale (`torch.finfo(torch.float32).eps` by default).
    pub eps: f32,
}

impl Default for ObserverConfig {
    /// PyTorch's `MinMaxObserver()` defaults: quint8, per-tensor affine, full range.
    fn default() -> Self {
        ObserverConfig { dtype: DType::U8, qscheme: QScheme::PerTensorAffine, reduce_range: false, eps: f32::EPSILON }
    }
}

impl ObserverConfig {
    /// The weight configuration of PyTorch's x86 default: qint8, per-channel symmetric.
    pub fn per_channel_weight() -> Self {
        ObserverConfig { dtype: DType::I8, qscheme: QScheme::PerChannelSymmetric, ..Default::default() }
    }
    /// Checks the combination is one PyTorch accepts.
    pub fn validate(&self, observer: &str) -> Result<()> {
        quant_min_max(self.dtype, self.reduce_range).map_err(|e| Error::argument(observer, e.to_string()))?;
        if self.reduce_range && self.dtype == DType::U8 && self.qscheme.is_symmetric() {
            return Err(Error::argument(
                observer,
                "cannot reduce range for symmetric quantization to uint8 (PyTorch refuses it too); use int8 or reduce_range=false",
            ));
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::argument(observer, format!("eps must be a positive finite float, got {}", self.eps)));
        }
        Ok(())
    }
}

/// Scale and zero point, one of each per channel (one for per-tensor schemes).
#[derive(Debug, Clone, PartialEq)]
pub struct QParams {
    /// Scales (float32, as PyTorch's observers return them).
    pub scale: Vec<f32>,
    /// Zero points.
    pub zero_point: Vec<i64>,
}

/// `(quant_min, quant_max)` of a dtype, as `torch.ao.quantization`'s `_calculate_qmin_qmax`.
///
/// ```
/// use ferrofx_core::DType;
/// assert_eq!(ferrofx_quant::quant_min_max(DType::U8, true).unwrap(), (0, 127));
/// assert_eq!(ferrofx_quant::quant_min_max(DType::I8, false).unwrap(), (-128, 127));
/// ```
pub fn quant_min_max(dtype: DType, reduce_range: bool) -> Result<(i64, i64)> {
    match (dtype, reduce_range) {
        (DType::U8, false) => Ok((0, 255)),
        (DType::U8, true) => Ok((0, 127)),
        (DType::I8, false) => Ok((-128, 127)),
        (DType::I8, true) => Ok((-64, 63)),
        (other, _) => Err(Error::dtype(
            "quant_min_max",
            format!("observers quantize to uint8 (quint8) or int8 (qint8), got {other}"),
        )),
    }
}

/// Scale and zero point of each `[min[i], max[i]]` range (`ObserverBase._calculate_qparams`):
/// the range is widened to include 0; symmetric schemes use `max(-min, max) / ((qmax - qmin)
/// / 2)` with zero point 0 (128 for uint8), affine ones `(max - min) / (qmax - qmin)` with zero
/// point `qmin - round(min / scale)` clamped to the range; scales are at least `eps`.
///
/// `observer` names the caller in errors: an empty range list, a range whose min is above its
/// max, or a non-finite bound (the observer saw no data, or NaN/Inf).
///
/// ```
/// use ferrofx_quant::{calculate_qparams, ObserverConfig, QScheme};
/// let sym = ObserverConfig { dtype: ferrofx_core::DType::I8, qscheme: QScheme::PerTensorSymmetric, ..Default::default() };
/// let qp = calculate_qparams("example", &[-2.0], &[1.0], &sym).unwrap();
/// assert_eq!((qp.scale[0], qp.zero_point[0]), (2.0 / 127.5, 0));
/// ```
pub fn calculate_qparams(observer: &str, min: &[f32], max: &[f32], config: &ObserverConfig) -> Result<QParams> {
    config.validate(observer)?;
    let (qmin, qmax) = quant_min_max(config.dtype, config.reduce_range)?;
    if min.is_empty() || min.len() != max.len() {
        return Err(Error::argument(
            observer,
            "the observer has no statistics: run calibration data through it before calculate_qparams",
        ));
    }
    let mut qp = QParams { scale: Vec::with_capacity(min.len()), zero_point: Vec::with_capacity(min.len()) };
    for (i, (&lo, &hi)) in min.iter().zip(max).enumerate() {
        let at = if min.len() > 1 { format!(" (channel {i})") } else { String::new() };
        if lo == f32::INFINITY && hi == f32::NEG_INFINITY {
            return Err(Error::argument(
                observer,
                format!("the observer saw no data{at}: run calibration data through the prepared model before convert"),
            ));
        }
        if !lo.is_finite() || !hi.is_finite() {
            return Err(Error::argument(
                observer,
                format!("the observed range{at} [{lo}, {hi}] is not finite: the calibration data holds NaN or Inf"),
            ));
        }
        if lo > hi {
            return Err(Error::argument(observer, format!("the observed min {lo} is above the max {hi}{at}")));
        }
        let min_neg = lo.min(0.0);
        let max_pos = hi.max(0.0);
        let (scale, zp) = if config.qscheme.is_symmetric() {
            let m = (-min_neg).max(max_pos);
            let scale = (m / ((qmax - qmin) as f32 / 2.0)).max(config.eps);
            (scale, if config.dtype == DType::U8 { 128 } else { 0 })
        } else {
            let scale = ((max_pos - min_neg) / (qmax - qmin) as f32).max(config.eps);
            let zp = qmin - (min_neg / scale).round_ties_even() as i64;
            (scale, zp.clamp(qmin, qmax))
        };
        qp.scale.push(scale);
        qp.zero_point.push(zp);
    }
    Ok(qp)
}
