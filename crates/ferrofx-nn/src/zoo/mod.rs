//! The model zoo: [`Mlp`], [`DigitsCnn`], [`ResNet`] (ResNet-18/50 with torchvision's layout and
//! key names), [`MobileNetV2`] (torchvision layout), [`TransformerClassifier`].

mod cnn;
mod mobilenet;
mod resnet;
mod transformer;

pub use cnn::{DigitsCnn, Mlp};
pub use mobilenet::MobileNetV2;
pub use resnet::{BasicBlock, Bottleneck, ResNet};
pub use transformer::TransformerClassifier;
