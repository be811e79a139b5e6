//! `ferrofx convert --model digits-cnn --weights W.safetensors -o M.fxm`: a state dict (for
//! instance exported from PyTorch with safetensors) plus a zoo architecture becomes a traced
//! module file that runs without the model's code.

use super::CliResult;
use ferrofx_fx::trace_with_inputs;
use ferrofx_nn::zoo::{DigitsCnn, MobileNetV2, ResNet};
use ferrofx_nn::{load_state_dict_file, Module};
use std::path::PathBuf;

/// Architectures `convert` knows.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Arch {
    /// The digits CNN (input `[N, 1, 8, 8]`).
    DigitsCnn,
    /// torchvision's ResNet-18 (1000 classes, `[N, 3, 224, 224]`).
    Resnet18,
    /// torchvision's ResNet-50.
    Resnet50,
    /// torchvision's MobileNetV2.
    MobilenetV2,
}

/// Arguments of `ferrofx convert`.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// The architecture the weights belong to.
    #[arg(long, value_enum)]
    pub model: Arch,
    /// A safetensors state dict with PyTorch's key names.
    #[arg(long)]
    pub weights: PathBuf,
    /// Where to write the traced module.
    #[arg(long, short)]
    pub out: PathBuf,
}

/// Runs `ferrofx convert`.
pub fn run(a: &ConvertArgs) -> CliResult<()> {
    super::module_io::refuse_overwriting_inputs(&a.out, &[&a.weights])?;
    super::module_io::check_output_path(&a.out)?;
    let (mut model, shape): (Box<dyn Module>, Vec<i64>) = match a.model {
        Arch::DigitsCnn => (Box::new(DigitsCnn::new()?), vec![1, 1, 8, 8]),
        Arch::Resnet18 => (Box::new(ResNet::resnet18(1000)?), vec![1, 3, 224, 224]),
        Arch::Resnet50 => (Box::new(ResNet::resnet50(1000)?), vec![1, 3, 224, 224]),
        Arch::MobilenetV2 => (Box::new(MobileNetV2::new(1000, 1.0)?), vec![1, 3, 224, 224]),
    };
    let sd = load_state_dict_file(&a.weights).map_err(|e| format!("cannot read {}: {e}", a.weights.display()))?;
    model.load_state_dict(&sd, true).map_err(|e| format!("the weights do not fit {:?}: {e}", a.model))?;
    model.eval();
    let x = ferrofx_core::Tensor::from_vec(
        vec![0.0f32; shape.iter().product::<i64>() as usize],
        &shape.iter().map(|&d| d as usize).collect::<Vec<_>>(),
    )?;
    let gm = trace_with_inputs(model.as_ref(), &[(&x).into()])?;
    gm.save(&a.out).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    println!("wrote {} ({} nodes, traced from {:?})", a.out.display(), gm.graph().len(), a.model);
    Ok(())
}
