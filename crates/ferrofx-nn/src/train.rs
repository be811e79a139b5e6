//! The digits training loop (the README's main job): trains [`DigitsCnn`] on the embedded
//! digits data with Adam and cross-entropy, showing a progress bar (indicatif) and one line per
//! epoch with the training loss, the test loss and the test accuracy. Tensor memory is tracked
//! while training ([`ferrofx_core::memory::tracking`]): the model's parameters, the forward
//! pass (activations), backward (gradients) and the optimizer step each count under their
//! category, and [`TrainReport::memory`] holds the peaks.
//!
//! Every batch is cut into [`TrainConfig::batch_shards`] fixed shards whose forward and backward
//! run on their own and whose gradients are combined in one fixed order
//! ([`crate::batch_shards`]): BatchNorm normalises each shard with its own statistics (as DDP
//! does on each rank without SyncBatchNorm), the running statistics are the ordered mean of the
//! shards' updates, and each shard's dropout masks come from a generator seeded with (seed,
//! step, shard). This makes a data-parallel run over any rank count dividing the shards into
//! powers of two (`ferrofx-dist`) give the same bits as one process.
//!
//! ```no_run
//! let report = ferrofx_nn::train::train_digits(&ferrofx_nn::train::TrainConfig::default()).unwrap();
//! assert!(report.test_accuracy >= 0.97);
//! ```

use crate::batch_shards::{shard_rows, shard_seed, tree_sum, OneProcess, ShardCombine};
use crate::datasets::{Batches, Digits, Split};
use crate::loss::{cross_entropy, CeOpts};
use crate::optim::{Adam, LrScheduler, OneCycleLR, Optimizer};
use crate::zoo::DigitsCnn;
use crate::Module;
use ferrofx_core::memory::tracking::{category_scope, Category, MemoryStats, MemoryTracker};
use ferrofx_core::ops::random::{with_generator, Generator};
use ferrofx_core::{DType, Error, Result, Tensor};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::ops::Range;
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
    /// Fixed reduction shards per batch ([`crate::batch_shards`]): each batch is cut into this
    /// many contiguous row blocks, run and combined in a fixed order, so that data-parallel
    /// training over 1, 2, ... ranks (any count leaving each rank a power of two of shards)
    /// gives the same weights. Part of the training configuration, like the batch size.
    pub batch_shards: usize,
}

/// The default [`TrainConfig::batch_shards`]: 4, so that 1, 2 and 4 ranks give the same
/// weights.
pub const DEFAULT_BATCH_SHARDS: usize = 4;

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 12,
            batch_size: 32,
            lr: 0.01,
            seed: 0,
            test_fraction: 0.2,
            progress: true,
            batch_shards: DEFAULT_BATCH_SHARDS,
        }
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
/// backward graphs of a partitioned joint graph here). The step runs once per shard of every
/// batch, on the shard's rows, and returns the shard's mean loss.
pub fn train_digits_with(cfg: &TrainConfig, train_step: &mut TrainStep<'_>) -> Result<TrainReport> {
    train_digits_sharded(cfg, train_step, &mut OneProcess)
}

/// Checks that every batch of a training split of `n` rows leaves at least one row to each of
/// `shards` shards.
pub fn check_batch_shards(n: usize, batch_size: usize, shards: usize) -> Result<()> {
    let tail = n % batch_size.max(1);
    if shards == 0 || batch_size < shards || (tail != 0 && tail < shards) {
        return Err(Error::argument(
            "train",
            format!(
                "--batch-shards {shards} must be at least 1 and leave every shard of every batch at least one row: \
                 --batch-size {batch_size} over {n} training samples gives {}; use fewer shards or another batch size",
                if tail != 0 && batch_size >= shards {
                    format!("a last batch of {tail} rows")
                } else {
                    format!("batches of {batch_size} rows")
                }
            ),
        ));
    }
    Ok(())
}

/// The parameters that train and the model's buffers, in a fixed order.
struct Slots {
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
}

impl Slots {
    /// Length of a shard's flat vector: every gradient, every float32 buffer, the loss.
    fn len(&self) -> usize {
        self.params.iter().map(Tensor::numel).sum::<usize>()
            + self.buffers.iter().filter(|b| b.dtype() == DType::F32).map(Tensor::numel).sum::<usize>()
            + 1
    }
}

/// One optimizer step's gradients over the shards `block` of a batch `(x, y)`, combined by
/// `combine`: on return every parameter's `.grad` holds the batch's gradient, every float32
/// buffer the shards' mean update, and the batch's mean loss is returned.
#[allow(clippy::too_many_arguments)]
fn sharded_step(
    model: &DigitsCnn,
    slots: &Slots,
    (x, y): (&Tensor, &Tensor),
    shards: usize,
    block: Range<usize>,
    (seed, step): (u64, u64),
    train_step: &mut TrainStep<'_>,
    combine: &mut dyn ShardCombine,
) -> Result<f64> {
    let rows = x.shape()[0];
    let snapshot: Vec<Tensor> = {
        let _g = ferrofx_core::autograd::no_grad();
        slots.buffers.iter().map(|b| b.detach().clone_tensor()).collect::<Result<_>>()?
    };
    let mut leaves = Vec::with_capacity(block.len());
    for k in block {
        let (a, b) = shard_rows(rows, shards, k);
        {
            // every shard starts from the step's buffers (running statistics, batch counts)
            let _g = ferrofx_core::autograd::no_grad();
            for (buf, s) in slots.buffers.iter().zip(&snapshot) {
                buf.copy_(s)?;
            }
        }
        for p in &slots.params {
            p.set_grad(None)?;
        }
        let xs = x.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
        let ys = y.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
        let gen = Generator::new(shard_seed(seed, step, k));
        let loss = with_generator(&gen, || train_step(model, &xs, &ys))?;
        // the shard's share of the batch's mean
        let w = (b - a) as f32 / rows as f32;
        let mut flat = Vec::with_capacity(slots.len());
        for p in &slots.params {
            match p.grad() {
                Some(g) => g.with_contiguous::<f32, _>("train", |v| flat.extend(v.iter().map(|g| g * w)))?,
                None => flat.extend(std::iter::repeat_n(0.0, p.numel())),
            }
        }
        for buf in slots.buffers.iter().filter(|b| b.dtype() == DType::F32) {
            buf.with_contiguous::<f32, _>("train", |v| flat.extend_from_slice(v))?;
        }
        flat.push(loss as f32 * w);
        leaves.push(flat);
    }
    let sum = combine.combine(tree_sum(leaves)?)?;
    if sum.len() != slots.len() {
        return Err(Error::shape(
            "train",
            format!("the combined shards hold {} values, the model {}", sum.len(), slots.len()),
        ));
    }
    let _g = ferrofx_core::autograd::no_grad();
    let mut off = 0;
    {
        let _mem = category_scope(Category::Gradient);
        for p in &slots.params {
            let n = p.numel();
            p.set_grad(Some(Tensor::from_vec(sum[off..off + n].to_vec(), p.shape())?))?;
            off += n;
        }
    }
    // running statistics: the mean of the shards' updates (batch counts: every shard's update
    // is the same)
    for buf in slots.buffers.iter().filter(|b| b.dtype() == DType::F32) {
        let n = buf.numel();
        let mean: Vec<f32> = sum[off..off + n].iter().map(|v| v / shards as f32).collect();
        buf.copy_(&Tensor::from_vec(mean, buf.shape())?)?;
        off += n;
    }
    Ok(f64::from(sum[off]))
}

/// [`train_digits_with`] over the shards `combine` gives this process: one process runs all
/// of them ([`OneProcess`]); a data-parallel rank runs its block and exchanges block sums
/// (`ferrofx_dist::train::train_digits_data_parallel`). Every process returns the same model.
pub fn train_digits_sharded(
    cfg: &TrainConfig,
    train_step: &mut TrainStep<'_>,
    combine: &mut dyn ShardCombine,
) -> Result<TrainReport> {
    let start = Instant::now();
    let (train, test) = Digits::load()?.split(cfg.test_fraction, cfg.seed)?;
    let shards = cfg.batch_shards;
    let bs = cfg.batch_size.max(1);
    check_batch_shards(train.len(), bs, shards)?;
    let block = combine.block(shards)?;
    let gen = Generator::new(cfg.seed);
    let tracker = MemoryTracker::start();
    let mut model = {
        let _mem = category_scope(Category::Parameter);
        with_generator(&gen, DigitsCnn::new)?
    };
    combine.start(&model)?;
    let slots = Slots {
        params: model.parameters().into_iter().filter(Tensor::requires_grad).collect(),
        buffers: model.named_buffers().into_iter().map(|(_, t)| t).collect(),
    };
    let steps_per_epoch = train.len().div_ceil(bs);
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
        for batch in Batches::new(&train, bs, Some(cfg.seed.wrapping_mul(1000) + epoch as u64)) {
            let (x, y) = batch?;
            let l =
                sharded_step(&model, &slots, (&x, &y), shards, block.clone(), (cfg.seed, step), train_step, combine)?;
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
