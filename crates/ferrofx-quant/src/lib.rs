//! # ferrofx-quant
//!
//! Post-training quantization for ferrofx, following `torch.ao.quantization`:
//! - [`qparams`]: the quantization schemes and the scale/zero-point computation of PyTorch's
//!   observers (`quint8` affine, `qint8` symmetric, `reduce_range`, `eps`);
//! - [`observer`]: observers that record the range of the tensors they see during calibration
//!   ([`MinMaxObserver`], [`MovingAverageMinMaxObserver`], [`PerChannelMinMaxObserver`],
//!   [`HistogramObserver`]) and
//!   turn it into quantization parameters, refusing ranges that are not usable (no data seen,
//!   NaN or infinite values).
//!
//! - [`qconfig`]: [`QConfig`] (which observers) and [`QConfigMapping`] (where: global, by module
//!   type or op, by module name, `None` to keep in float);
//! - [`prepare()`] / [`convert()`]: the FX graph-mode workflow (`prepare_fx` → calibrate →
//!   `convert_fx`) on a [`GraphModule`](ferrofx_fx::GraphModule);
//! - [`quantize_dynamic()`]: dynamic quantization of `Linear` layers (int8 weights, activations
//!   quantized per call), PyTorch's `quantize_dynamic`;
//! - [`numeric`]: per-layer SQNR of a converted module against the float one, and automatic
//!   mixed precision (the most sensitive layers stay in float until a budget is met).
//!
//! The int8 kernels themselves (`quantize_per_tensor`, `quantized_linear`,
//! `quantized_conv2d`, ...) are registry ops in [`ferrofx_core::ops::quantized`], so tracing,
//! interpretation, FLOP counting and saving see them like any other op.
//!
//! ```
//! use ferrofx_core::{ops::quantized::quantize_per_tensor, Tensor};
//! use ferrofx_quant::{MinMaxObserver, Observer, ObserverConfig};
//! let obs = MinMaxObserver::new(ObserverConfig::default()); // quint8, per-tensor affine
//! let x = Tensor::from_vec(vec![-1.0f32, 1.0, 2.0], &[3]).unwrap();
//! obs.observe(&x).unwrap();
//! let qp = obs.calculate_qparams().unwrap();
//! assert_eq!(qp.zero_point, vec![85]); // 0 - round(-1 / (3 / 255))
//! let q = quantize_per_tensor(&x, qp.scale[0] as f64, qp.zero_point[0], ferrofx_core::DType::U8).unwrap();
//! assert_eq!(q.to_vec::<u8>().unwrap(), vec![0, 170, 255]);
//! ```
#![warn(missing_docs)]

pub mod convert;
pub mod dynamic;
pub mod histogram;
pub mod numeric;
pub mod observer;
pub mod observer_module;
mod pattern;
pub mod prepare;
pub mod qconfig;
pub mod qparams;

pub use convert::{convert, convert_excluding, QuantMeta, QUANT_META};
pub use dynamic::{quantize_dynamic, quantize_dynamic_with};
pub use histogram::HistogramObserver;
pub use numeric::{mixed_precision, numeric_report, LayerSqnr, MixedPrecision};
pub use observer::{MinMaxObserver, MovingAverageMinMaxObserver, Observer, PerChannelMinMaxObserver};
pub use observer_module::{ObserverGuard, ObserverModule};
pub use prepare::prepare;
pub use qconfig::{ObserverKind, ObserverSpec, QConfig, QConfigMapping, QConfigSource};
pub use qparams::{calculate_qparams, quant_min_max, ObserverConfig, QParams, QScheme};
