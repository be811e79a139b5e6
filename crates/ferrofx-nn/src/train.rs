//! The digits training loop (the README's main job): trains [`DigitsCnn`] on the embedded
//! digits data with Adam and cross-entropy, showing a progress bar (indicatif) and one line per
//! epoch with the training loss, the test loss and the test accuracy. Tensor memory is tracked
//! while training ([`ferrofx_core::memory::tracking`]): the model's parameters, the forward
//! pass (activations), backward (gradients) and the optimizer step each count under their
//! category, and [`TrainReport::memory`] holds the peaks.
//!
//! ```no_run
//! let report = ferrofx_nn::train::train_digits(&ferrofx_nn::train::TrainConfig::default()).unwrap();
//! assert!(report.test_accuracy >= 0.97);
//! ```

use crate::datasets::{Batches, Digits, Split};
use crate::loss::{cross_entropy, CeOpts};
use crate::optim::{Adam, LrScheduler, OneCycleLR, Optimizer};
use crate::zoo::DigitsCnn;
use crate::Module;
use ferrofx_core::memory::tracking::{category_scope, Category, MemoryStats, MemoryTracker};
use ferrofx_core::{Result, Tensor};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::{Duration, Instant};

/// Settings of [`train_digits`].
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Passes over the training split.
    pub epochs: usize,
    /// Mini-batch size.
    pub batch_size: usize,
    /// Peak learning rate (one-cycle schedule with Adam).
    pub lr: f64,
    /// Seed of the model initialisation, the split and the shuffling.
    pub seed: u64,
    /// Fraction of the data held out for testing.
    pub test_fraction: f64,
    /// Draw a progress bar (on stderr) and print per-epoch lines (on stdout).
    pub progress: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig { epochs: 12, batch_size: 32, lr: 0.01, seed: 0, test_fraction: 0.2, progress: true }
    }
}

/// One epoch's figures.
#[derive(Debug, Clone)]
pub struct EpochStats {
    /// 1-based epoch number.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// Mean test loss.
    pub test_loss: f64,
    /// Test accuracy in `[0, 1]`.
    pub test_accuracy: f64,
}

/// What [`train_digits`] returns.
pub struct TrainReport {
    /// The trained model (in eval mode).
    pub model: DigitsCnn,
    /// Per-epoch figures.
    pub epochs: Vec<EpochStats>,
    /// Final test accuracy.
    pub test_accuracy: f64,
    /// Wall-clock training time (including the per-epoch evaluation).
    pub elapsed: Duration,
    /// Tensor memory while training, by category (`memory.peak(Category::Activation)` is the
    /// peak activation memory of a training step).
    pub memory: MemoryStats,
}

/// Loss and accuracy of `model` on `split` (eval mode, no gradients).
pub fn evaluate(model: &dyn Module, split: &Split) -> Result<(f64, f64)> {
    let _g = ferrofx_core::autograd::no_grad();
    let logits = model.forward(&split.images)?;
    let loss = cross_entropy(&logits, &split.labels, &CeOpts::default())?.item()?;
    let pred = logits.argmax(Some(1), false)?.to_vec::<i64>()?;
    let labels = split.labels.to_vec::<i64>()?;
    let correct = pred.iter().zip(&labels).filter(|(a, b)| a == b).count();
    Ok((loss, correct as f64 / labels.len().max(1) as f64))
}

/// One training step of [`train_digits_with`]: the loss of a batch `(images, labels)`, with
/// the parameters' gradients left in `.grad` for the optimizer (they are zeroed before the
/// step). The step attributes its memory to the tracker's categories itself ([`eager_step`]:
/// forward and loss under `Activation`, backward under the engine's `Gradient`).
pub type TrainStep<'a> = dyn FnMut(&DigitsCnn, &Tensor, &Tensor) -> Result<f64> + 'a;

/// The eager training step: forward, cross-entropy, `loss.backward()`.
pub fn eager_step(model: &DigitsCnn, x: &Tensor, y: &Tensor) -> Result<f64> {
    let loss = {
        let _mem = category_scope(Category::Activation);
        let logits = model.forward(x)?;
        cross_entropy(&logits, y, &CeOpts::default())?
    };
    loss.backward(None, false, false)?; // allocates under Category::Gradient
    loss.item()
}

/// Trains the digits CNN. See the module documentation.
pub fn train_digits(cfg: &TrainConfig) -> Result<TrainReport> {
    train_digits_with(cfg, &mut eager_step)
}

/// [`train_digits`] with another training step (`ferrofx-compile` runs the forward and
/// backward graphs of a partitioned joint graph here).
pub fn train_digits_with(cfg: &TrainConfig, train_step: &mut TrainStep<'_>) -> Result<TrainReport> {
    let start = Instant::now();
    let (train, test) = Digits::load()?.split(cfg.test_fraction, cfg.seed)?;
    let gen = ferrofx_core::ops::random::Generator::new(cfg.seed);
    let tracker = MemoryTracker::start();
    let mut model = {
        let _mem = category_scope(Category::Parameter);
        ferrofx_core::ops::random::with_generator(&gen, DigitsCnn::new)?
    };
    let steps_per_epoch = train.len().div_ceil(cfg.batch_size.max(1));
    let total = (steps_per_epoch * cfg.epochs) as u64;
    let mut opt = {
        let _mem = category_scope(Category::OptimizerState);
        Adam::new(model.parameters(), cfg.lr, (0.9, 0.999), 1e-8, 0.0)?
    };
    let mut sched = OneCycleLR::new(&mut opt, cfg.lr, total.max(2), 0.25, 10.0, 100.0)?;
    let pb = if cfg.progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden())
    };
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} batches, {elapsed_precise} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut epochs = Vec::new();
    let mut step = 0u64;
    for epoch in 1..=cfg.epochs {
        pb.set_prefix(format!("epoch {epoch}/{}", cfg.epochs));
        model.train(true);
        let mut sum = 0.0;
        let mut n = 0usize;
        ferrofx_core::ops::random::with_generator(&gen, || -> Result<()> {
            for batch in Batches::new(&train, cfg.batch_size, Some(cfg.seed.wrapping_mul(1000) + epoch as u64)) {
                let (x, y) = batch?;
                opt.zero_grad();
                let l = train_step(&model, &x, &y)?;
                {
                    let _mem = category_scope(Category::OptimizerState);
                    opt.step()?;
                }
                step += 1;
                if step < total {
                    sched.step(&mut opt)?;
                }
                sum += l;
                n += 1;
                pb.set_message(format!("loss {l:.4}"));
                pb.inc(1);
            }
            Ok(())
        })?;
        model.eval();
        let (test_loss, acc) = evaluate(&model, &test)?;
        let stats = EpochStats { epoch, train_loss: sum / n.max(1) as f64, test_loss, test_accuracy: acc };
        if cfg.progress {
            // on stdout, above the bar (indicatif's own println is silent when stderr is not a
            // terminal)
            pb.suspend(|| {
                println!(
                    "epoch {:>2}/{}: train loss {:.4}, test loss {:.4}, test accuracy {:.2}%",
                    epoch,
                    cfg.epochs,
                    stats.train_loss,
                    stats.test_loss,
                    100.0 * acc
                )
            });
        }
        epochs.push(stats);
    }
    pb.finish_and_clear();
    model.eval();
    let test_accuracy = epochs.last().map(|e| e.test_accuracy).unwrap_or(0.0);
    Ok(TrainReport { model, epochs, test_accuracy, elapsed: start.elapsed(), memory: tracker.stats() })
}

/// Predicted classes of `images` (`[N, 1, 8, 8]`).
pub fn predict(model: &dyn Module, images: &Tensor) -> Result<Vec<i64>> {
    let _g = ferrofx_core::autograd::no_grad();
    model.forward(images)?.argmax(Some(1), false)?.to_vec::<i64>()
}
