//! Data-parallel training of the digits CNN (`mpirun -np N ferrofx train --data-parallel`):
//! the same run as [`ferrofx_nn::train::train_digits`], with every global batch's fixed shards
//! ([`ferrofx_nn::batch_shards`]) spread over the ranks, and the same weights at the end as one
//! process, bit for bit, whatever the rank count (any count leaving each rank a power of two of
//! the `--batch-shards`).
//!
//! What makes it equal to one process:
//!
//! * the same seed everywhere: every rank builds the model, the split and the batch order from
//!   the seed, as one process does (and [`broadcast_module`] checks the models agree and copies
//!   rank 0's values);
//! * the same arithmetic: each shard's forward and backward are those one process runs for
//!   that shard (same rows, same shapes, the shard's own BatchNorm statistics and dropout
//!   generator), and the shards' gradients, running statistics and losses are combined with
//!   the same fixed tree: rank `r` sums its block, an all-gather brings every block sum to
//!   every rank, and every rank finishes the tree ([`RankShards`]);
//! * the optimizer and learning-rate schedule are the single-process ones, stepping on equal
//!   gradients on every rank.
//!
//! [`train_digits_sync_batchnorm`] is the other semantics: BatchNorm over the whole global batch
//! ([`SyncBatchNorm`]) and PyTorch's DDP all-reduce, equal to one process with
//! `--batch-shards 1` only within float rounding (the ranks sum in another order).

use crate::ddp::{broadcast_module, shard_rows, DistributedDataParallel, Reduction};
use crate::dropout::convert_distributed_dropout;
use crate::process_group::ProcessGroup;
use crate::sync_batchnorm::convert_sync_batchnorm;
use ferrofx_core::memory::tracking::{category_scope, Category, MemoryTracker};
use ferrofx_core::ops::random::{with_generator, Generator};
use ferrofx_core::{Error, Result, Tensor};
use ferrofx_nn::batch_shards::{check_rank_count, shard_block, shard_seed, tree_sum, ShardCombine};
use ferrofx_nn::datasets::{Batches, Digits};
use ferrofx_nn::loss::{cross_entropy, CeOpts, Reduction as LossReduction};
use ferrofx_nn::optim::{Adam, LrScheduler, OneCycleLR, Optimizer};
use ferrofx_nn::train::{eager_step, evaluate, train_digits_sharded, EpochStats, TrainConfig, TrainReport};
use ferrofx_nn::zoo::DigitsCnn;
use ferrofx_nn::Module;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

#[cfg(doc)]
use crate::{dropout::DistributedDropout, sync_batchnorm::SyncBatchNorm};

fn err(rank: usize, msg: impl std::fmt::Display) -> Error {
    Error::argument("distributed training", format!("rank {rank}: {msg}"))
}

/// The shards of a data-parallel job ([`ShardCombine`]): rank `r` of `N` runs the block
/// [`shard_block`]`(S, r, N)` and the block sums are exchanged with one all-gather, after which
/// every rank finishes the fixed tree over the `N` block sums in rank order.
pub struct RankShards {
    pg: Arc<ProcessGroup>,
}

impl RankShards {
    /// The shards of the ranks of `pg`.
    pub fn new(pg: Arc<ProcessGroup>) -> RankShards {
        RankShards { pg }
    }
}

impl ShardCombine for RankShards {
    fn start(&mut self, model: &dyn Module) -> Result<()> {
        broadcast_module(model, &self.pg)
    }
    fn block(&self, shards: usize) -> Result<Range<usize>> {
        check_rank_count(shards, self.pg.world_size())?;
        Ok(shard_block(shards, self.pg.rank(), self.pg.world_size()))
    }
    fn combine(&mut self, block_sum: Vec<f32>) -> Result<Vec<f32>> {
        if self.pg.world_size() == 1 {
            return Ok(block_sum);
        }
        tree_sum(self.pg.all_gather(block_sum)?)
    }
}

/// Trains the digits CNN data parallel over the ranks of `pg` (every rank calls it with the
/// same `cfg`): the single-process run's shards spread over the ranks (see the module docs).
/// Rank 0 prints the per-epoch lines when `cfg.progress`; every rank returns the same trained
/// model, equal to [`ferrofx_nn::train::train_digits`]'s for the same `cfg` when every process
/// runs its kernels with the same thread count (the CLI uses one).
///
/// ```no_run
/// // under `mpirun -np 2`
/// let pg = std::sync::Arc::new(ferrofx_dist::ProcessGroup::init().unwrap());
/// let cfg = ferrofx_nn::train::TrainConfig { epochs: 1, ..Default::default() };
/// let report = ferrofx_dist::train::train_digits_data_parallel(&cfg, pg).unwrap();
/// println!("{:.3}", report.test_accuracy);
/// ```
pub fn train_digits_data_parallel(cfg: &TrainConfig, pg: Arc<ProcessGroup>) -> Result<TrainReport> {
    let cfg = TrainConfig { progress: cfg.progress && pg.rank() == 0, ..cfg.clone() };
    train_digits_sharded(&cfg, &mut eager_step, &mut RankShards::new(pg))
}

/// Trains the digits CNN data parallel with BatchNorm over the whole global batch
/// ([`SyncBatchNorm`], `ferrofx train --data-parallel --sync-batchnorm`): each global batch is
/// cut into contiguous equal shares, each rank's loss is the sum of its rows' losses divided by
/// the *global* batch size, gradients are summed with DDP's bucketed all-reduce
/// ([`Reduction::Sum`]), and dropout draws the global batch's masks ([`DistributedDropout`])
/// from the generator of shard 0 of the step, as one process with `--batch-shards 1` does. The
/// result equals that process's only within rounding: the ranks sum each batch's gradients in
/// another order, and a whole run amplifies the difference (docs/distributed.md).
pub fn train_digits_sync_batchnorm(cfg: &TrainConfig, pg: Arc<ProcessGroup>) -> Result<TrainReport> {
    let start = Instant::now();
    // this rank's tensor memory, by category (as the single-process loop reports it)
    let tracker = MemoryTracker::start();
    let (rank, world) = (pg.rank(), pg.world_size());
    let (train, test) = Digits::load()?.split(cfg.test_fraction, cfg.seed)?;
    let bs = cfg.batch_size.max(1);
    let tail = train.len() % bs;
    if bs < world || (tail != 0 && tail < world) {
        return Err(err(
            rank,
            format!(
                "every rank needs at least one row of every batch: --batch-size {bs} over {} training samples \
                 leaves a batch of {} rows for {world} ranks; use a batch size of at least {world} that leaves no \
                 last batch smaller than {world}",
                train.len(),
                if bs < world { bs } else { tail }
            ),
        ));
    }
    let gen = Generator::new(cfg.seed);
    let mut model = with_generator(&gen, DigitsCnn::new)?;
    // a traced copy sharing the model's tensors, with the layers that look at the whole batch
    // replaced by their distributed versions (traced in eval mode: tracing runs nothing that
    // updates running statistics)
    model.eval();
    let example = Tensor::from_vec(vec![0.0f32; 64], &[1, 1, 8, 8])?;
    let mut gm = ferrofx_fx::trace_with_inputs(&model, &[(&example).into()])?;
    convert_sync_batchnorm(&mut gm, &pg)?;
    convert_distributed_dropout(&mut gm, &pg)?;
    let mut ddp = DistributedDataParallel::new(gm, pg.clone())?;
    ddp.set_reduction(Reduction::Sum);
    let steps_per_epoch = train.len().div_ceil(bs);
    let total = (steps_per_epoch * cfg.epochs) as u64;
    let mut opt = Adam::new(model.parameters(), cfg.lr, (0.9, 0.999), 1e-8, 0.0)?;
    let mut sched = OneCycleLR::new(&mut opt, cfg.lr, total.max(2), 0.25, 10.0, 100.0)?;
    let sum_opts = CeOpts { reduction: LossReduction::Sum, ..Default::default() };
    let mut epochs = Vec::new();
    let mut step = 0u64;
    for epoch in 1..=cfg.epochs {
        ddp.module_mut().train(true);
        let mut local_sum = 0.0f64;
        let mut n = 0usize;
        for batch in Batches::new(&train, bs, Some(cfg.seed.wrapping_mul(1000) + epoch as u64)) {
            let (x, y) = batch?;
            let rows = x.shape()[0];
            let (a, b) = shard_rows(rows, rank, world);
            let xs = x.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
            let ys = y.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
            let loss = {
                let _mem = category_scope(Category::Activation);
                let logits = with_generator(&Generator::new(shard_seed(cfg.seed, step, 0)), || ddp.forward(&xs))?;
                // this rank's share of the global batch's mean loss
                cross_entropy(&logits, &ys, &sum_opts)?.div(rows as f64)?
            };
            opt.zero_grad();
            ddp.backward(&loss)?;
            {
                let _mem = category_scope(Category::OptimizerState);
                opt.step()?;
            }
            step += 1;
            if step < total {
                sched.step(&mut opt)?;
            }
            local_sum += loss.item()?;
            n += 1;
        }
        let train_loss = pg.all_reduce_sum_f64(vec![local_sum])?[0] / n.max(1) as f64;
        model.eval();
        let (test_loss, acc) = evaluate(&model, &test)?;
        let stats = EpochStats { epoch, train_loss, test_loss, test_accuracy: acc };
        if cfg.progress && rank == 0 {
            println!(
                "epoch {:>2}/{} ({world} ranks, SyncBatchNorm): train loss {:.4}, test loss {:.4}, test accuracy {:.2}%",
                epoch,
                cfg.epochs,
                stats.train_loss,
                stats.test_loss,
                100.0 * acc
            );
        }
        epochs.push(stats);
    }
    drop(ddp);
    model.eval();
    let test_accuracy = epochs.last().map(|e| e.test_accuracy).unwrap_or(0.0);
    Ok(TrainReport { model, epochs, test_accuracy, elapsed: start.elapsed(), memory: tracker.stats() })
}

/// This rank's stage state (parameters, then buffers, as float32), in a fixed order.
fn stage_state(gm: &ferrofx_fx::GraphModule) -> Vec<Tensor> {
    gm.named_parameters().into_iter().chain(gm.named_buffers()).map(|(_, t)| t).collect()
}

/// What [`train_digits_pipeline`] returns on each rank.
pub struct PipelineTrainReport {
    /// Rank 0: the whole trained model (every stage gathered) and its figures; the other ranks:
    /// `None`.
    pub report: Option<TrainReport>,
    /// This rank's stage state (parameters and buffers) under the original model's names: its
    /// shard of a checkpoint.
    pub stage_state: ferrofx_nn::StateDict,
    /// The rank that writes each tensor of a sharded checkpoint
    /// ([`crate::pipeline::stage_owners`]; the same on every rank).
    pub owners: crate::shards::Owners,
}

/// Trains the digits CNN as a pipeline of `pg.world_size()` stages (`ferrofx train
/// --pipeline-stages N` under `mpirun -np N`): the model is traced, its shapes propagated, cut
/// with [`ferrofx_fx::passes::partition_balanced`], and rank `r` trains stage `r` with
/// `micro_batches` micro-batches per batch and `schedule`. With one micro-batch the step is the
/// single-process step of `--batch-shards 1` (same loss, gradients and dropout masks: only the rank holding the
/// dropout layer draws from the generator, in the same order); with more, BatchNorm and dropout
/// see micro-batches, as in every pipeline. At the end every stage's state is gathered to rank
/// 0, which returns the whole trained model; every rank also returns its stage's state (its
/// checkpoint shard, see [`crate::shards`]).
pub fn train_digits_pipeline(
    cfg: &TrainConfig,
    pg: &ProcessGroup,
    micro_batches: usize,
    schedule: crate::Schedule,
) -> Result<PipelineTrainReport> {
    let start = Instant::now();
    // this rank's tensor memory, by category (as the single-process loop reports it)
    let tracker = MemoryTracker::start();
    let (rank, world) = (pg.rank(), pg.world_size());
    let (train, test) = Digits::load()?.split(cfg.test_fraction, cfg.seed)?;
    let bs = cfg.batch_size.max(1);
    let micro = micro_batches.max(1);
    let tail = train.len() % bs;
    if !bs.is_multiple_of(micro) || !tail.is_multiple_of(micro) {
        return Err(err(
            rank,
            format!(
                "--micro-batches {micro} must divide every batch: --batch-size {bs} over {} training samples \
                 gives batches of {bs}{}",
                train.len(),
                if tail != 0 { format!(" and a last batch of {tail}") } else { String::new() }
            ),
        ));
    }
    let gen = Generator::new(cfg.seed);
    let mut model = with_generator(&gen, DigitsCnn::new)?;
    model.eval();
    let example = ferrofx_core::Value::Tensor(train.images.narrow(0, 0, bs.min(train.len()) as i64)?.contiguous()?);
    let mut gm = ferrofx_fx::trace_with_inputs(&model, std::slice::from_ref(&example))?;
    ferrofx_fx::ShapeProp::propagate(&mut gm, std::slice::from_ref(&example))?;
    gm.train(true);
    let plan = ferrofx_fx::passes::partition_balanced(&gm, world)?;
    let stage = crate::PipelineStage::new(plan.split(&gm)?, pg).map_err(|e| err(rank, e))?;
    let steps_per_epoch = train.len().div_ceil(bs);
    let total = (steps_per_epoch * cfg.epochs) as u64;
    let mut opt = Adam::new(stage.module()?.parameters(), cfg.lr, (0.9, 0.999), 1e-8, 0.0)?;
    let mut sched = OneCycleLR::new(&mut opt, cfg.lr, total.max(2), 0.25, 10.0, 100.0)?;
    let mut epochs = Vec::new();
    let mut step = 0u64;
    for epoch in 1..=cfg.epochs {
        let mut sum = 0.0f64;
        let mut n = 0usize;
        with_generator(&gen, || -> Result<()> {
            for batch in Batches::new(&train, bs, Some(cfg.seed.wrapping_mul(1000) + epoch as u64)) {
                let (x, y) = batch?;
                let rows = x.shape()[0] / micro;
                let loss_fn = |out: &Tensor, m: usize| {
                    let ym = y.narrow(0, (m * rows) as i64, rows as i64)?.contiguous()?;
                    cross_entropy(out, &ym, &CeOpts::default())
                };
                stage.module()?.zero_grad();
                let loss = {
                    // forward activations (the engine counts the backward's own tensors as gradients)
                    let _mem = category_scope(Category::Activation);
                    // the dropout masks of one process's step (shard 0 of `--batch-shards 1`)
                    let step_gen = Generator::new(shard_seed(cfg.seed, step, 0));
                    with_generator(&step_gen, || stage.step(pg, &[x], micro, schedule, &loss_fn))?
                };
                {
                    let _mem = category_scope(Category::OptimizerState);
                    opt.step()?;
                }
                step += 1;
                if step < total {
                    sched.step(&mut opt)?;
                }
                sum += loss.unwrap_or(0.0);
                n += 1;
            }
            Ok(())
        })
        .map_err(|e| err(rank, e))?;
        // the loss lives on the last stage: one sum brings it to every rank
        let train_loss = pg.all_reduce_sum_f64(vec![sum])?[0] / n.max(1) as f64;
        if cfg.progress && rank == 0 {
            println!("epoch {:>2}/{} ({world} pipeline stages): train loss {train_loss:.4}", epoch, cfg.epochs);
        }
        epochs.push(EpochStats { epoch, train_loss, test_loss: f64::NAN, test_accuracy: f64::NAN });
    }
    // gather: rank r sends its stage's state; rank 0 copies it into its own copy of stage r,
    // whose tensors are its model's
    let split = stage.split();
    if rank == 0 {
        let _g = ferrofx_core::autograd::no_grad();
        for r in 1..world {
            let part = split.partition(&split.partitions[r])?;
            let tensors = stage_state(part);
            let len: usize = tensors.iter().map(|t| t.numel()).sum();
            let data = pg.recv(r, 2, len)?;
            if data.len() != len {
                return Err(err(0, format!("rank {r} sent {} state values, its stage holds {len}", data.len())));
            }
            let mut off = 0;
            for t in tensors {
                let v = Tensor::from_vec(data[off..off + t.numel()].to_vec(), t.shape())?;
                off += t.numel();
                t.copy_(&v)?;
            }
        }
    } else {
        let mut flat = vec![];
        for t in stage_state(stage.module()?) {
            flat.extend(ferrofx_core::ops::kernel::cast(&t, ferrofx_core::DType::F32)?.contiguous()?.to_vec::<f32>()?);
        }
        pg.send(0, 2, flat)?;
    }
    pg.barrier()?;
    let stage_state = stage.state_dict()?;
    let owners = crate::pipeline::stage_owners(split)?;
    if rank != 0 {
        return Ok(PipelineTrainReport { report: None, stage_state, owners });
    }
    model.eval();
    let (test_loss, acc) = evaluate(&model, &test)?;
    if let Some(last) = epochs.last_mut() {
        last.test_loss = test_loss;
        last.test_accuracy = acc;
    }
    let report = TrainReport { model, epochs, test_accuracy: acc, elapsed: start.elapsed(), memory: tracker.stats() };
    Ok(PipelineTrainReport { report: Some(report), stage_state, owners })
}
