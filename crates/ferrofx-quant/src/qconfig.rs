//! `QConfig` and `QConfigMapping` (`torch.ao.quantization.qconfig` / `qconfig_mapping`): which
//! observers watch the activations and weights of which parts of a model.
//!
//! A [`QConfigMapping`] assigns an `Option<QConfig>` (`None`: keep in float) by, from the
//! weakest to the strongest match:
//! 1. the global setting;
//! 2. the module type (`"Conv2d"`, `"Linear"`, ...) of a `call_module` node, or the op name
//!    (`"add"`, `"cat"`, ...) of a `call_function`/`call_method` node;
//! 3. the module name: a path applies to the module itself and everything under it
//!    (`"layer1"` covers `layer1.0.conv1`); the longest matching path wins.

use crate::histogram::HistogramObserver;
use crate::observer::{MinMaxObserver, MovingAverageMinMaxObserver, Observer, PerChannelMinMaxObserver};
use crate::qparams::{ObserverConfig, QScheme};
use ferrofx_core::{DType, Error, Result};

/// The algorithm of an observer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ObserverKind {
    /// [`MinMaxObserver`].
    MinMax,
    /// [`MovingAverageMinMaxObserver`] with its averaging constant.
    MovingAverageMinMax(f64),
    /// [`HistogramObserver`] with its bin count.
    Histogram(usize),
    /// [`PerChannelMinMaxObserver`] along the given axis.
    PerChannelMinMax(i64),
}

/// How to build an observer: PyTorch's `Observer.with_args(...)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObserverSpec {
    /// The algorithm.
    pub kind: ObserverKind,
    /// dtype, scheme, range.
    pub config: ObserverConfig,
}

impl ObserverSpec {
    /// A fresh observer (checks the configuration).
    pub fn build(&self) -> Result<Box<dyn Observer>> {
        Ok(match self.kind {
            ObserverKind::MinMax => Box::new(MinMaxObserver::try_new(self.config)?),
            ObserverKind::MovingAverageMinMax(c) => Box::new(MovingAverageMinMaxObserver::new(self.config, c)?),
            ObserverKind::Histogram(bins) => Box::new(HistogramObserver::new(self.config, bins)?),
            ObserverKind::PerChannelMinMax(axis) => Box::new(PerChannelMinMaxObserver::new(self.config, axis)?),
        })
    }
}

/// Observers for a node's output activation and (for conv/linear) its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QConfig {
    /// Activation observer (uint8, per tensor).
    pub activation: ObserverSpec,
    /// Weight observer (int8, symmetric: per channel along axis 0, or per tensor).
    pub weight: ObserverSpec,
}

impl QConfig {
    /// PyTorch's x86 default (`get_default_qconfig("x86")`): a 2048-bin [`HistogramObserver`]
    /// on activations, per-channel symmetric int8 min-max on weights. PyTorch reduces the
    /// activation range to 7 bits for AVX2's `vpmaddubsw`; ferrofx's kernels accumulate
    /// exactly, so activations keep all 8 bits.
    ///
    /// ```
    /// let q = ferrofx_quant::QConfig::default_x86();
    /// assert!(q.validate("example").is_ok());
    /// ```
    pub fn default_x86() -> QConfig {
        QConfig {
            activation: ObserverSpec {
                kind: ObserverKind::Histogram(HistogramObserver::DEFAULT_BINS),
                config: ObserverConfig::default(),
            },
            weight: ObserverSpec {
                kind: ObserverKind::PerChannelMinMax(0),
                config: ObserverConfig::per_channel_weight(),
            },
        }
    }

    /// Min-max activations (fast to calibrate; PyTorch's `default_qconfig` with per-channel
    /// weights).
    pub fn min_max() -> QConfig {
        QConfig {
            activation: ObserverSpec { kind: ObserverKind::MinMax, config: ObserverConfig::default() },
            ..QConfig::default_x86()
        }
    }

    /// Checks the combination is one the int8 kernels run: uint8 per-tensor activations,
    /// symmetric int8 weights per channel (axis 0) or per tensor.
    pub fn validate(&self, who: &str) -> Result<()> {
        let a = &self.activation;
        if a.config.dtype != DType::U8 || a.config.qscheme.is_per_channel() {
            return Err(Error::argument(
                who,
                format!(
                    "activations quantize to uint8 per tensor (the int8 kernels' input), got {} {}",
                    a.config.dtype,
                    a.config.qscheme.name()
                ),
            ));
        }
        if matches!(a.kind, ObserverKind::PerChannelMinMax(_)) {
            return Err(Error::argument(who, "a per-channel observer cannot watch activations"));
        }
        let w = &self.weight;
        if w.config.dtype != DType::I8
            || !matches!(w.config.qscheme, QScheme::PerChannelSymmetric | QScheme::PerTensorSymmetric)
        {
            return Err(Error::argument(
                who,
                format!(
                    "weights quantize to int8 symmetric (zero point 0, what the int8 kernels assume), got {} {}",
                    w.config.dtype,
                    w.config.qscheme.name()
                ),
            ));
        }
        if let ObserverKind::PerChannelMinMax(axis) = w.kind {
            if axis != 0 {
                return Err(Error::argument(
                    who,
                    format!("weights are quantized per output channel (ch_axis 0), got ch_axis {axis}"),
                ));
            }
        }
        a.build()?;
        w.build()?;
        Ok(())
    }
}

/// Where a node's qconfig came from (errors name it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QConfigSource {
    /// The global setting.
    Global,
    /// A module type or op name entry.
    ObjectType(String),
    /// A module name entry.
    ModuleName(String),
}

impl std::fmt::Display for QConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QConfigSource::Global => write!(f, "the global qconfig"),
            QConfigSource::ObjectType(t) => write!(f, "set_object_type(\"{t}\")"),
            QConfigSource::ModuleName(n) => write!(f, "set_module_name(\"{n}\")"),
        }
    }
}

/// `QConfigMapping`: which qconfig applies where.
///
/// ```
/// use ferrofx_quant::{QConfig, QConfigMapping};
/// let mapping = QConfigMapping::new()
///     .set_global(QConfig::default_x86())
///     .set_object_type("add", None) // adds stay float
///     .set_module_name("fc2", None); // so does the classifier
/// let (q, _) = mapping.resolve(Some("fc2"), "Linear");
/// assert!(q.is_none());
/// let (q, _) = mapping.resolve(Some("fc1"), "Linear");
/// assert!(q.is_some());
/// ```
#[derive(Debug, Clone, Default)]
pub struct QConfigMapping {
    global: Option<QConfig>,
    object_types: Vec<(String, Option<QConfig>)>,
    module_names: Vec<(String, Option<QConfig>)>,
}

impl QConfigMapping {
    /// An empty mapping: nothing is quantized.
    pub fn new() -> QConfigMapping {
        QConfigMapping::default()
    }

    /// PyTorch's `get_default_qconfig_mapping("x86")`: [`QConfig::default_x86`] everywhere.
    pub fn default_x86() -> QConfigMapping {
        QConfigMapping::new().set_global(QConfig::default_x86())
    }

    /// The qconfig of everything no other entry matches.
    pub fn set_global(mut self, qconfig: QConfig) -> QConfigMapping {
        self.global = Some(qconfig);
        self
    }

    /// By module type (`"Conv2d"`) or function/method name (`"add"`, `"cat"`); `None` skips.
    pub fn set_object_type(mut self, type_or_op: &str, qconfig: Option<QConfig>) -> QConfigMapping {
        self.object_types.retain(|(t, _)| t != type_or_op);
        self.object_types.push((type_or_op.to_string(), qconfig));
        self
    }

    /// By module path (covers the module and everything under it); `None` skips. A name that
    /// matches no module of the model is an error at `prepare`.
    pub fn set_module_name(mut self, path: &str, qconfig: Option<QConfig>) -> QConfigMapping {
        self.module_names.retain(|(p, _)| p != path);
        self.module_names.push((path.to_string(), qconfig));
        self
    }

    /// The module names the mapping refers to.
    pub fn module_names(&self) -> impl Iterator<Item = &str> {
        self.module_names.iter().map(|(p, _)| p.as_str())
    }

    /// Checks every qconfig of the mapping (`who` names the caller in errors).
    pub fn validate(&self, who: &str) -> Result<()> {
        let all = self
            .global
            .iter()
            .map(|q| (QConfigSource::Global, q))
            .chain(
                self.object_types
                    .iter()
                    .filter_map(|(t, q)| q.as_ref().map(|q| (QConfigSource::ObjectType(t.clone()), q))),
            )
            .chain(
                self.module_names
                    .iter()
                    .filter_map(|(p, q)| q.as_ref().map(|q| (QConfigSource::ModuleName(p.clone()), q))),
            );
        for (src, q) in all {
            q.validate(who).map_err(|e| Error::argument(who, format!("{src}: {e}")))?;
        }
        Ok(())
    }

    /// The qconfig of a node: `module_path` is the module the node calls or was traced in,
    /// `type_or_op` its module type or op name. Returns the qconfig and where it came from.
    pub fn resolve(&self, module_path: Option<&str>, type_or_op: &str) -> (Option<QConfig>, QConfigSource) {
        if let Some(path) = module_path {
            let best = self
                .module_names
                .iter()
                .filter(|(p, _)| path == p || (path.starts_with(p.as_str()) && path[p.len()..].starts_with('.')))
                .max_by_key(|(p, _)| p.len());
            if let Some((p, q)) = best {
                return (*q, QConfigSource::ModuleName(p.clone()));
            }
        }
        if let Some((t, q)) = self.object_types.iter().find(|(t, _)| t == type_or_op) {
            return (*q, QConfigSource::ObjectType(t.clone()));
        }
        (self.global, QConfigSource::Global)
    }
}
