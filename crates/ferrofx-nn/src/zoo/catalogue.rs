//! The zoo at test size: every model family of the zoo, freshly initialised from the current
//! generator (seed it first with `manual_seed`), in eval mode, with an example input. Tests and
//! passes that must hold "on every zoo model" iterate over [`catalogue`].

use crate::module::Module;
use crate::zoo::{DigitsCnn, Mlp, MobileNetV2, ResNet, TransformerClassifier};
use ferrofx_core::ops::random::randn;
use ferrofx_core::{Result, Tensor};

/// One model of [`catalogue`].
pub struct ZooModel {
    /// Short name: `mlp`, `digits_cnn`, `resnet18`, `resnet50`, `mobilenet_v2`, `transformer`.
    pub name: &'static str,
    /// The model, in eval mode.
    pub model: Box<dyn Module>,
    /// An example input (float images, or token ids for the transformer).
    pub input: Tensor,
}

/// The six zoo models at test size, in eval mode: an MLP (64 → 32 → 16 → 10) on `[4, 64]`, the
/// digits CNN on `[4, 1, 8, 8]`, ResNet-18 and ResNet-50 (10 classes) and MobileNetV2 (width
/// 0.5) on `[1, 3, 64, 64]`, and a 2-layer transformer classifier on token ids `[2, 7]`.
/// Parameters and inputs are drawn from the current generator in that order.
///
/// ```
/// use ferrofx_nn::zoo::catalogue;
/// ferrofx_core::ops::random::manual_seed(0);
/// let zoo = catalogue().unwrap();
/// assert_eq!(zoo.iter().map(|z| z.name).collect::<Vec<_>>(),
///            ["mlp", "digits_cnn", "resnet18", "resnet50", "mobilenet_v2", "transformer"]);
/// let y = zoo[1].model.forward(&zoo[1].input).unwrap();
/// assert_eq!(y.shape(), &[4, 10]);
/// ```
pub fn catalogue() -> Result<Vec<ZooModel>> {
    let mut out = Vec::with_capacity(6);
    let mut add = |name: &'static str, mut model: Box<dyn Module>, input: Tensor| {
        model.eval();
        out.push(ZooModel { name, model, input });
    };
    add("mlp", Box::new(Mlp::new(64, &[32, 16], 10)?), randn(&[4, 64], None)?);
    add("digits_cnn", Box::new(DigitsCnn::new()?), randn(&[4, 1, 8, 8], None)?);
    add("resnet18", Box::new(ResNet::resnet18(10)?), randn(&[1, 3, 64, 64], None)?);
    add("resnet50", Box::new(ResNet::resnet50(10)?), randn(&[1, 3, 64, 64], None)?);
    add("mobilenet_v2", Box::new(MobileNetV2::new(10, 0.5)?), randn(&[1, 3, 64, 64], None)?);
    let ids = Tensor::from_vec((0..14).map(|i| (i * 3) % 20).collect::<Vec<i64>>(), &[2, 7])?;
    add("transformer", Box::new(TransformerClassifier::new(20, 16, 2, 32, 2, 12, 4, 0.1)?), ids);
    Ok(out)
}
