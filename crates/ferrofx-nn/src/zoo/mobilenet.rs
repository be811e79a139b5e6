use crate::layers::{BatchNorm2d, Conv2d, Conv2dOpts, Dropout, Linear, ReLU6};
use crate::{init, Module, Sequential};
use ferrofx_core::{Result, Tensor};

fn make_divisible(v: f64, divisor: usize) -> usize {
    let d = divisor as f64;
    let mut new_v = ((v + d / 2.0) / d).floor().max(1.0) as usize * divisor;
    new_v = new_v.max(divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

/// torchvision's `Conv2dNormActivation`: Sequential(Conv2d(bias=False), BatchNorm2d, ReLU6?).
fn conv_bn(cin: usize, cout: usize, k: usize, stride: usize, groups: usize, act: bool) -> Result<Sequential> {
    let c = Conv2d::with(cin, cout, k, Conv2dOpts { stride, padding: (k - 1) / 2, dilation: 1, groups, bias: false })?;
    init::kaiming_normal_(&c.weight, 0.0, "fan_out", "relu")?;
    let mut s = Sequential::new().append(c).append(BatchNorm2d::new_2d(cout)?);
    if act {
        s.push(ReLU6::new());
    }
    Ok(s)
}

/// torchvision's `InvertedResidual`.
#[derive(crate::Module)]
pub struct InvertedResidual {
    /// The block's layers.
    pub conv: Sequential,
    use_res: bool,
}

impl Module for InvertedResidual {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.conv.call(x)?;
        if self.use_res {
            crate::functional::add(x, &y)
        } else {
            Ok(y)
        }
    }
}

/// torchvision's `MobileNetV2(num_classes, width_mult)` with its key names (`features.N...`,
/// `classifier.1`).
#[derive(crate::Module)]
pub struct MobileNetV2 {
    /// Convolutional trunk.
    pub features: Sequential,
    /// Dropout(0.2) + Linear.
    pub classifier: Sequential,
}

impl MobileNetV2 {
    /// `mobilenet_v2(num_classes, width_mult)` (torchvision defaults: 1000, 1.0).
    pub fn new(num_classes: usize, width_mult: f64) -> Result<MobileNetV2> {
        let settings: [[usize; 4]; 7] =
            [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]];
        let mut input = make_divisible(32.0 * width_mult, 8);
        let last = make_divisible(1280.0 * width_mult.max(1.0), 8);
        let mut features = Sequential::new().append(conv_bn(3, input, 3, 2, 1, true)?);
        for [t, c, n, s] in settings {
            let out = make_divisible(c as f64 * width_mult, 8);
            for i in 0..n {
                let stride = if i == 0 { s } else { 1 };
                let hidden = input * t;
                let mut conv = Sequential::new();
                if t != 1 {
                    conv.push(conv_bn(input, hidden, 1, 1, 1, true)?);
                }
                conv.push(conv_bn(hidden, hidden, 3, stride, hidden, true)?);
                let pw = Conv2d::with(hidden, out, 1, Conv2dOpts { bias: false, ..Default::default() })?;
                init::kaiming_normal_(&pw.weight, 0.0, "fan_out", "relu")?;
                conv.push(pw);
                conv.push(BatchNorm2d::new_2d(out)?);
                features.push(InvertedResidual { conv, use_res: stride == 1 && input == out });
                input = out;
            }
        }
        features.push(conv_bn(input, last, 1, 1, 1, true)?);
        let fc = Linear::new(last, num_classes, true)?;
        init::normal_(&fc.weight, 0.0, 0.01)?;
        if let Some(b) = &fc.bias {
            init::zeros_(b)?;
        }
        Ok(MobileNetV2 { features, classifier: Sequential::new().append(Dropout::new(0.2)?).append(fc) })
    }
}

impl Module for MobileNetV2 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.features.call(x)?;
        let x = crate::functional::adaptive_avg_pool2d(&x, [1, 1])?.flatten(1, -1)?;
        self.classifier.call(&x)
    }
}
