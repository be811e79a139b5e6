//! `ferrofx train`: train the digits CNN of the zoo and save its state dict (safetensors, with
//! PyTorch key names).

use super::CliResult;
use ferrofx_nn::state_dict::save_state_dict;
use ferrofx_nn::train::{train_digits, TrainConfig};
use ferrofx_nn::Module;
use std::path::PathBuf;

/// Arguments of `ferrofx train`.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// Passes over the training split.
    #[arg(long, default_value_t = 12)]
    pub epochs: usize,
    /// Mini-batch size.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Peak learning rate (Adam with a one-cycle schedule).
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    /// Seed of the initialisation, the split and the shuffling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fraction of the data held out for testing, in (0, 1).
    #[arg(long, default_value_t = 0.2)]
    pub test_fraction: f64,
    /// Where to write the trained state dict (safetensors).
    #[arg(long, short, default_value = "digits_cnn.safetensors")]
    pub out: PathBuf,
    /// Hide the progress bar and the per-epoch lines.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `ferrofx train`.
pub fn run(a: &TrainArgs) -> CliResult<()> {
    if a.epochs == 0 {
        return Err("--epochs must be at least 1".into());
    }
    if a.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    if !(a.test_fraction > 0.0 && a.test_fraction < 1.0) {
        return Err(format!("--test-fraction must be in (0, 1), got {}", a.test_fraction).into());
    }
    if !(a.lr > 0.0 && a.lr.is_finite()) {
        return Err(format!("--lr must be a positive number, got {}", a.lr).into());
    }
    let cfg = TrainConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        seed: a.seed,
        test_fraction: a.test_fraction,
        progress: !a.quiet,
    };
    let report = train_digits(&cfg)?;
    save_state_dict(&report.model.state_dict(), &a.out)
        .map_err(|e| format!("cannot write the state dict to {}: {e}", a.out.display()))?;
    println!(
        "trained digits CNN: test accuracy {:.2}% after {} epochs in {:.1} s; state dict written to {}",
        100.0 * report.test_accuracy,
        a.epochs,
        report.elapsed.as_secs_f64(),
        a.out.display()
    );
    Ok(())
}
