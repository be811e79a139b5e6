use crate::functional as F;
use crate::layers::{AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dOpts, Linear, MaxPool2d};
use crate::{init, Module, Sequential};
use ferrofx_core::{Error, Result, Tensor};

fn conv(cin: usize, cout: usize, k: usize, stride: usize, groups: usize) -> Result<Conv2d> {
    let c = Conv2d::with(cin, cout, k, Conv2dOpts { stride, padding: k / 2, dilation: 1, groups, bias: false })?;
    // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu")
    init::kaiming_normal_(&c.weight, 0.0, "fan_out", "relu")?;
    Ok(c)
}

fn downsample(cin: usize, cout: usize, stride: usize) -> Result<Option<Sequential>> {
    if stride == 1 && cin == cout {
        return Ok(None);
    }
    Ok(Some(Sequential::new().append(conv(cin, cout, 1, stride, 1)?).append(BatchNorm2d::new_2d(cout)?)))
}

/// torchvision's `BasicBlock` (ResNet-18/34).
#[derive(crate::Module)]
pub struct BasicBlock {
    /// 3×3 (stride)
    pub conv1: Conv2d,
    /// BN
    pub bn1: BatchNorm2d,
    /// 3×3
    pub conv2: Conv2d,
    /// BN
    pub bn2: BatchNorm2d,
    /// 1×1 conv + BN when the shape changes
    pub downsample: Option<Sequential>,
}

impl BasicBlock {
    /// `BasicBlock(inplanes, planes, stride)`.
    pub fn new(inplanes: usize, planes: usize, stride: usize) -> Result<BasicBlock> {
        Ok(BasicBlock {
            conv1: conv(inplanes, planes, 3, stride, 1)?,
            bn1: BatchNorm2d::new_2d(planes)?,
            conv2: conv(planes, planes, 3, 1, 1)?,
            bn2: BatchNorm2d::new_2d(planes)?,
            downsample: downsample(inplanes, planes, stride)?,
        })
    }
}

impl Module for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = F::relu(&self.bn1.call(&self.conv1.call(x)?)?)?;
        let out = self.bn2.call(&self.conv2.call(&out)?)?;
        let identity = match &self.downsample {
            Some(d) => d.call(x)?,
            None => x.clone(),
        };
        F::relu(&F::add(&out, &identity)?)
    }
}

/// torchvision's `Bottleneck` (ResNet-50/101/152; stride on the 3×3 conv, "ResNet v1.5").
#[derive(crate::Module)]
pub struct Bottleneck {
    /// 1×1
    pub conv1: Conv2d,
    /// BN
    pub bn1: BatchNorm2d,
    /// 3×3 (stride, groups)
    pub conv2: Conv2d,
    /// BN
    pub bn2: BatchNorm2d,
    /// 1×1 (expansion 4)
    pub conv3: Conv2d,
    /// BN
    pub bn3: BatchNorm2d,
    /// 1×1 conv + BN when the shape changes
    pub downsample: Option<Sequential>,
}

impl Bottleneck {
    /// `Bottleneck(inplanes, planes, stride, groups, base_width)`.
    pub fn new(inplanes: usize, planes: usize, stride: usize, groups: usize, base_width: usize) -> Result<Bottleneck> {
        let width = planes * base_width / 64 * groups;
        Ok(Bottleneck {
            conv1: conv(inplanes, width, 1, 1, 1)?,
            bn1: BatchNorm2d::new_2d(width)?,
            conv2: conv(width, width, 3, stride, groups)?,
            bn2: BatchNorm2d::new_2d(width)?,
            conv3: conv(width, planes * 4, 1, 1, 1)?,
            bn3: BatchNorm2d::new_2d(planes * 4)?,
            downsample: downsample(inplanes, planes * 4, stride)?,
        })
    }
}

impl Module for Bottleneck {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = F::relu(&self.bn1.call(&self.conv1.call(x)?)?)?;
        let out = F::relu(&self.bn2.call(&self.conv2.call(&out)?)?)?;
        let out = self.bn3.call(&self.conv3.call(&out)?)?;
        let identity = match &self.downsample {
            Some(d) => d.call(x)?,
            None => x.clone(),
        };
        F::relu(&F::add(&out, &identity)?)
    }
}

/// torchvision's `ResNet` with its key names (`conv1`, `bn1`, `layer1.0.conv1`, ..., `fc`).
/// `widths` are the planes of the four stages (torchvision: `[64, 128, 256, 512]`; the stem has
/// `widths[0]` channels); smaller widths give the reduced models used by the goldens.
#[derive(crate::Module)]
pub struct ResNet {
    /// 7×7 stride 2 stem
    pub conv1: Conv2d,
    /// BN
    pub bn1: BatchNorm2d,
    /// 3×3 stride 2 max pooling
    pub maxpool: MaxPool2d,
    /// Stage 1
    pub layer1: Sequential,
    /// Stage 2
    pub layer2: Sequential,
    /// Stage 3
    pub layer3: Sequential,
    /// Stage 4
    pub layer4: Sequential,
    /// Global average pooling
    pub avgpool: AdaptiveAvgPool2d,
    /// Classifier
    pub fc: Linear,
}

impl ResNet {
    /// A ResNet of `BasicBlock`s (`bottleneck = false`) or `Bottleneck`s with `layers` blocks
    /// per stage.
    pub fn build(bottleneck: bool, layers: [usize; 4], widths: [usize; 4], num_classes: usize) -> Result<ResNet> {
        if widths.contains(&0) || layers.contains(&0) {
            return Err(Error::argument(
                "ResNet",
                format!("widths and layers must be positive, got {widths:?} and {layers:?}"),
            ));
        }
        let expansion = if bottleneck { 4 } else { 1 };
        let mut inplanes = widths[0];
        let conv1 =
            Conv2d::with(3, inplanes, 7, Conv2dOpts { stride: 2, padding: 3, bias: false, ..Default::default() })?;
        init::kaiming_normal_(&conv1.weight, 0.0, "fan_out", "relu")?;
        let mut stages = Vec::new();
        for (i, (&planes, &n)) in widths.iter().zip(layers.iter()).enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            let mut seq = Sequential::new();
            for b in 0..n {
                let s = if b == 0 { stride } else { 1 };
                if bottleneck {
                    seq.push(Bottleneck::new(inplanes, planes, s, 1, 64)?);
                } else {
                    seq.push(BasicBlock::new(inplanes, planes, s)?);
                }
                inplanes = planes * expansion;
            }
            stages.push(seq);
        }
        let mut it = stages.into_iter();
        let mut next = || it.next().ok_or_else(|| Error::argument("ResNet", "missing stage"));
        Ok(ResNet {
            conv1,
            bn1: BatchNorm2d::new_2d(widths[0])?,
            maxpool: MaxPool2d::with(3, 2, 1),
            layer1: next()?,
            layer2: next()?,
            layer3: next()?,
            layer4: next()?,
            avgpool: AdaptiveAvgPool2d::new(1, 1),
            fc: Linear::new(widths[3] * expansion, num_classes, true)?,
        })
    }
    /// torchvision's `resnet18(num_classes)`.
    pub fn resnet18(num_classes: usize) -> Result<ResNet> {
        ResNet::build(false, [2, 2, 2, 2], [64, 128, 256, 512], num_classes)
    }
    /// torchvision's `resnet50(num_classes)`.
    pub fn resnet50(num_classes: usize) -> Result<ResNet> {
        ResNet::build(true, [3, 4, 6, 3], [64, 128, 256, 512], num_classes)
    }
}

impl Module for ResNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = F::relu(&self.bn1.call(&self.conv1.call(x)?)?)?;
        let x = self.maxpool.call(&x)?;
        let x = self.layer1.call(&x)?;
        let x = self.layer2.call(&x)?;
        let x = self.layer3.call(&x)?;
        let x = self.layer4.call(&x)?;
        let x = self.avgpool.call(&x)?.flatten(1, -1)?;
        self.fc.call(&x)
    }
}
