//! BatchNorm1d/2d, LayerNorm, GroupNorm.

use crate::spec::{self, Attr, ModuleSpec, TensorSource};
use crate::{functional as F, init, Module};
use ferrofx_core::{Error, Result, Tensor};

/// `nn.BatchNorm1d` / `nn.BatchNorm2d` (one type; `dims` checks the input rank): weight 1,
/// bias 0, running_mean 0, running_var 1, num_batches_tracked 0 (int64). In training the
/// running statistics are updated in place (momentum 0.1; `momentum=None` is the cumulative
/// average, as PyTorch).
#[derive(crate::Module, Clone)]
pub struct BatchNorm {
    /// `[C]` (affine)
    pub weight: Option<Tensor>,
    /// `[C]` (affine)
    pub bias: Option<Tensor>,
    /// `[C]`
    #[module(buffer)]
    pub running_mean: Option<Tensor>,
    /// `[C]`
    #[module(buffer)]
    pub running_var: Option<Tensor>,
    /// `[]` int64
    #[module(buffer)]
    pub num_batches_tracked: Option<Tensor>,
    /// `eps` (1e-5)
    pub eps: f64,
    /// `momentum` (Some(0.1)); `None` = cumulative moving average.
    pub momentum: Option<f64>,
    pub(crate) num_features: usize,
    kind: BnKind,
    pub(crate) training: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BnKind {
    D1,
    D2,
}

impl BatchNorm {
    fn make(
        num_features: usize,
        kind: BnKind,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track: bool,
    ) -> Result<BatchNorm> {
        let c = num_features;
        let (weight, bias) = if affine {
            (Some(init::parameter(&[c], init::ones_)?), Some(init::parameter(&[c], init::zeros_)?))
        } else {
            (None, None)
        };
        let (rm, rv, nbt) = if track {
            let rv = ferrofx_core::ops::kernel::zeros(&[c], ferrofx_core::DType::F32)?;
            init::ones_(&rv)?;
            (
                Some(ferrofx_core::ops::kernel::zeros(&[c], ferrofx_core::DType::F32)?),
                Some(rv),
                Some(Tensor::scalar(0i64)),
            )
        } else {
            (None, None, None)
        };
        Ok(BatchNorm {
            weight,
            bias,
            running_mean: rm,
            running_var: rv,
            num_batches_tracked: nbt,
            eps,
            momentum,
            num_features,
            kind,
            training: true,
        })
    }
    /// `BatchNorm1d(num_features)` with defaults.
    pub fn new_1d(num_features: usize) -> Result<BatchNorm> {
        BatchNorm::make(num_features, BnKind::D1, 1e-5, Some(0.1), true, true)
    }
    /// `BatchNorm2d(num_features)` with defaults.
    pub fn new_2d(num_features: usize) -> Result<BatchNorm> {
        BatchNorm::make(num_features, BnKind::D2, 1e-5, Some(0.1), true, true)
    }
    /// `BatchNorm2d(num_features, eps, momentum, affine, track_running_stats)`.
    pub fn with_2d(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
    ) -> Result<BatchNorm> {
        BatchNorm::make(num_features, BnKind::D2, eps, momentum, affine, track_running_stats)
    }
    /// `BatchNorm1d(num_features, eps, momentum, affine, track_running_stats)`.
    pub fn with_1d(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
    ) -> Result<BatchNorm> {
        BatchNorm::make(num_features, BnKind::D1, eps, momentum, affine, track_running_stats)
    }
}

/// `nn.BatchNorm2d`.
pub type BatchNorm2d = BatchNorm;
/// `nn.BatchNorm1d`.
pub type BatchNorm1d = BatchNorm;

impl Module for BatchNorm {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let name = if self.kind == BnKind::D2 { "BatchNorm2d" } else { "BatchNorm1d" };
        let nd = x.ndim();
        let ok = match self.kind {
            BnKind::D1 => nd == 2 || nd == 3,
            BnKind::D2 => nd == 4,
        };
        if !ok {
            let want = if self.kind == BnKind::D2 { "4D" } else { "2D or 3D" };
            return Err(Error::shape(name, format!("expected {want} input (got {nd}D input)")));
        }
        let mut momentum = self.momentum.unwrap_or(0.0);
        if self.training {
            if let Some(n) = &self.num_batches_tracked {
                // num_batches_tracked += 1 (in place, no history)
                {
                    let _g = ferrofx_core::autograd::no_grad();
                    n.add_(1i64)?;
                }
                let v = n.item()? as i64;
                if self.momentum.is_none() {
                    momentum = 1.0 / v as f64;
                }
            }
        }
        // running stats are used in eval; in training they are updated (when tracked)
        let use_batch = self.training || self.running_mean.is_none();
        F::batch_norm(
            x,
            self.running_mean.as_ref(),
            self.running_var.as_ref(),
            self.weight.as_ref(),
            self.bias.as_ref(),
            use_batch,
            momentum,
            self.eps,
        )
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new(if self.kind == BnKind::D1 { "BatchNorm1d" } else { "BatchNorm2d" })
                .with("num_features", Attr::Int(self.num_features as i64))
                .with("eps", Attr::Float(self.eps))
                .with("momentum", self.momentum.map_or(Attr::None, Attr::Float))
                .with("affine", Attr::Bool(self.weight.is_some()))
                .with("track_running_stats", Attr::Bool(self.running_mean.is_some()))
                .with("training", Attr::Bool(self.training)),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, eps={:e}, momentum={}, affine={}, track_running_stats={}",
            self.num_features,
            self.eps,
            self.momentum.map_or("None".to_string(), |m| m.to_string()),
            super::linear::py_bool(self.weight.is_some()),
            super::linear::py_bool(self.running_mean.is_some())
        )
        .replace("1e-5", "1e-05")
    }
}

/// `nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)`: weight 1, bias 0.
#[derive(crate::Module, Clone)]
pub struct LayerNorm {
    /// `normalized_shape`
    pub weight: Option<Tensor>,
    /// `normalized_shape`
    pub bias: Option<Tensor>,
    /// The normalised trailing shape.
    pub normalized_shape: Vec<usize>,
    /// eps (1e-5)
    pub eps: f64,
}

impl LayerNorm {
    /// `LayerNorm(normalized_shape)` with defaults.
    pub fn new(normalized_shape: &[usize]) -> Result<LayerNorm> {
        LayerNorm::with(normalized_shape, 1e-5, true, true)
    }
    /// `LayerNorm(normalized_shape, eps, elementwise_affine, bias)`.
    pub fn with(normalized_shape: &[usize], eps: f64, elementwise_affine: bool, bias: bool) -> Result<LayerNorm> {
        let weight = if elementwise_affine { Some(init::parameter(normalized_shape, init::ones_)?) } else { None };
        let b = if elementwise_affine && bias { Some(init::parameter(normalized_shape, init::zeros_)?) } else { None };
        Ok(LayerNorm { weight, bias: b, normalized_shape: normalized_shape.to_vec(), eps })
    }
}

impl Module for LayerNorm {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ns: Vec<i64> = self.normalized_shape.iter().map(|&d| d as i64).collect();
        F::layer_norm(x, &ns, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("LayerNorm")
                .with("normalized_shape", Attr::Ints(self.normalized_shape.iter().map(|&d| d as i64).collect()))
                .with("eps", Attr::Float(self.eps))
                .with("elementwise_affine", Attr::Bool(self.weight.is_some()))
                .with("bias", Attr::Bool(self.bias.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "({},), eps={}, elementwise_affine={}",
            self.normalized_shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
            if self.eps == 1e-5 { "1e-05".to_string() } else { self.eps.to_string() },
            super::linear::py_bool(self.weight.is_some())
        )
    }
}

/// `nn.GroupNorm(num_groups, num_channels, eps, affine)`: weight 1, bias 0.
#[derive(crate::Module, Clone)]
pub struct GroupNorm {
    /// `[C]`
    pub weight: Option<Tensor>,
    /// `[C]`
    pub bias: Option<Tensor>,
    /// Number of groups.
    pub num_groups: usize,
    /// Number of channels.
    pub num_channels: usize,
    /// eps (1e-5)
    pub eps: f64,
}

impl GroupNorm {
    /// `GroupNorm(num_groups, num_channels)` with defaults.
    pub fn new(num_groups: usize, num_channels: usize) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::argument(
                "GroupNorm",
                format!("num_channels must be divisible by num_groups (got {num_channels} and {num_groups})"),
            ));
        }
        Ok(GroupNorm {
            weight: Some(init::parameter(&[num_channels], init::ones_)?),
            bias: Some(init::parameter(&[num_channels], init::zeros_)?),
            num_groups,
            num_channels,
            eps: 1e-5,
        })
    }
}

impl Module for GroupNorm {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::group_norm(x, self.num_groups as i64, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("GroupNorm")
                .with("num_groups", Attr::Int(self.num_groups as i64))
                .with("num_channels", Attr::Int(self.num_channels as i64))
                .with("eps", Attr::Float(self.eps))
                .with("affine", Attr::Bool(self.weight.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, {}, eps=1e-05, affine={}",
            self.num_groups,
            self.num_channels,
            super::linear::py_bool(self.weight.is_some())
        )
    }
}

impl BatchNorm {
    /// Rebuilds a BatchNorm1d/2d from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<BatchNorm> {
        let kind = if s.type_name == "BatchNorm1d" { BnKind::D1 } else { BnKind::D2 };
        let c = s.size("num_features", 1)?;
        let (affine, track) = (s.bool("affine")?, s.bool("track_running_stats")?);
        let weight = spec::opt_tensor(s, src, "weight", &[c], affine)?;
        let bias = spec::opt_tensor(s, src, "bias", &[c], affine)?;
        let running_mean = spec::opt_tensor(s, src, "running_mean", &[c], track)?;
        let running_var = spec::opt_tensor(s, src, "running_var", &[c], track)?;
        let num_batches_tracked = spec::opt_tensor(s, src, "num_batches_tracked", &[], track)?;
        Ok(BatchNorm {
            weight,
            bias,
            running_mean,
            running_var,
            num_batches_tracked,
            eps: s.float("eps")?,
            momentum: s.opt_float("momentum")?,
            num_features: c,
            kind,
            training: s.bool("training")?,
        })
    }
}

impl LayerNorm {
    /// Rebuilds a LayerNorm from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<LayerNorm> {
        let shape = s.sizes("normalized_shape")?;
        let affine = s.bool("elementwise_affine")?;
        let weight = spec::opt_tensor(s, src, "weight", &shape, affine)?;
        let bias = spec::opt_tensor(s, src, "bias", &shape, affine && s.bool("bias")?)?;
        Ok(LayerNorm { weight, bias, normalized_shape: shape, eps: s.float("eps")? })
    }
}

impl GroupNorm {
    /// Rebuilds a GroupNorm from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<GroupNorm> {
        let (g, c) = (s.size("num_groups", 1)?, s.size("num_channels", 1)?);
        if !c.is_multiple_of(g) {
            return Err(Error::argument(
                "GroupNorm",
                format!("num_channels must be divisible by num_groups (got {c} and {g})"),
            ));
        }
        let affine = s.bool("affine")?;
        let weight = spec::opt_tensor(s, src, "weight", &[c], affine)?;
        let bias = spec::opt_tensor(s, src, "bias", &[c], affine)?;
        Ok(GroupNorm { weight, bias, num_groups: g, num_channels: c, eps: s.float("eps")? })
    }
}
