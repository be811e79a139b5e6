use crate::functional as F;
use crate::layers::{BatchNorm2d, Conv2d, Conv2dOpts, Dropout, Linear, MaxPool2d, ReLU};
use crate::{Module, Sequential};
use ferrofx_core::{Result, Tensor};

/// A multi-layer perceptron: `Linear → ReLU → ... → Linear` in a Sequential named `layers`
/// (keys `layers.0.weight`, `layers.2.weight`, ...).
#[derive(crate::Module)]
#[module(name = "MLP")]
pub struct Mlp {
    /// Linear and ReLU layers.
    pub layers: Sequential,
}

impl Mlp {
    /// `in_features → hidden[0] → ... → out_features`, ReLU between layers.
    pub fn new(in_features: usize, hidden: &[usize], out_features: usize) -> Result<Mlp> {
        let mut layers = Sequential::new();
        let mut prev = in_features;
        for &h in hidden {
            layers.push(Linear::new(prev, h, true)?);
            layers.push(ReLU::new());
            prev = h;
        }
        layers.push(Linear::new(prev, out_features, true)?);
        Ok(Mlp { layers })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = if x.ndim() > 2 { x.flatten(1, -1)? } else { x.clone() };
        self.layers.call(&x)
    }
}

/// The digits CNN: `conv(1→16, 3, p1) → BN → ReLU → conv(16→32, 3, p1) → BN → ReLU → maxpool 2
/// → flatten → linear(32·4·4 → 64) → ReLU → dropout(0.25) → linear(64 → 10)`, for `[N, 1, 8, 8]`.
///
/// The convolutions have no bias (`bias=False`, as torchvision's ResNet convolutions before
/// BatchNorm): BatchNorm subtracts the channel mean, which cancels a bias exactly, so its
/// gradient would be zero up to rounding, and an optimizer that normalises gradients (Adam)
/// would turn that rounding noise into learning-rate-sized random steps.
#[derive(crate::Module)]
pub struct DigitsCnn {
    /// First conv.
    pub conv1: Conv2d,
    /// First BN.
    pub bn1: BatchNorm2d,
    /// Second conv.
    pub conv2: Conv2d,
    /// Second BN.
    pub bn2: BatchNorm2d,
    /// 2×2 max pooling.
    pub pool: MaxPool2d,
    /// Hidden linear.
    pub fc1: Linear,
    /// Dropout.
    pub dropout: Dropout,
    /// Classifier.
    pub fc2: Linear,
}

impl DigitsCnn {
    /// A freshly initialised model (current generator).
    pub fn new() -> Result<DigitsCnn> {
        // no bias before BatchNorm (see the type's docs)
        let p1 = Conv2dOpts { padding: 1, bias: false, ..Default::default() };
        Ok(DigitsCnn {
            conv1: Conv2d::with(1, 16, 3, p1)?,
            bn1: BatchNorm2d::new_2d(16)?,
            conv2: Conv2d::with(16, 32, 3, p1)?,
            bn2: BatchNorm2d::new_2d(32)?,
            pool: MaxPool2d::new(2),
            fc1: Linear::new(32 * 4 * 4, 64, true)?,
            dropout: Dropout::new(0.25)?,
            fc2: Linear::new(64, 10, true)?,
        })
    }
}

impl Module for DigitsCnn {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = F::relu(&self.bn1.call(&self.conv1.call(x)?)?)?;
        let h = F::relu(&self.bn2.call(&self.conv2.call(&h)?)?)?;
        let h = self.pool.call(&h)?.flatten(1, -1)?;
        let h = F::relu(&self.fc1.call(&h)?)?;
        self.fc2.call(&self.dropout.call(&h)?)
    }
}
