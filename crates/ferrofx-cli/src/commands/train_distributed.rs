//! `ferrofx train --data-parallel` / `--pipeline-stages N`: the digits CNN trained over the ranks of an MPI job
//! (`mpirun -np 2 ferrofx train --data-parallel --seed 0`), with exactly the weights of
//! `ferrofx train --seed 0` in one process; or cut into N pipeline stages, one per rank
//! (`mpirun -np 2 ferrofx train --pipeline-stages 2`). Rank 0 prints the progress and writes the files;
//! every rank's error names its rank. Needs the CLI's `mpi` feature (Open MPI); without it the
//! flag is an error saying how to build it.

use super::train::TrainArgs;
use super::CliResult;
use ferrofx_nn::train::TrainConfig;

/// The distributed flags of `ferrofx train`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DistArgs {
    /// Data-parallel training over the ranks of an MPI job: run as `mpirun -np N ferrofx train
    /// --data-parallel ...`. The fixed shards of every batch (`--batch-shards`) are spread over
    /// the ranks and their gradients summed in the order one process sums them, so the weights
    /// are exactly those of `ferrofx train` with the same seed; rank 0 writes the files. Needs
    /// ferrofx built with `--features mpi`.
    #[arg(long)]
    pub data_parallel: bool,
    /// With --data-parallel: BatchNorm over the whole global batch (SyncBatchNorm) and PyTorch's
    /// DDP all-reduce instead of fixed shards. Equal to `ferrofx train --batch-shards 1` only
    /// within rounding, which a whole run amplifies.
    #[arg(long, requires = "data_parallel")]
    pub sync_batchnorm: bool,
    /// Pipeline training over N ranks: run as `mpirun -np N ferrofx train --pipeline-stages N`.
    /// The traced model is cut into N stages of balanced cost, one per rank; rank 0 gathers the
    /// trained stages and writes the files. Needs ferrofx built with `--features mpi`.
    #[arg(long, value_name = "N")]
    pub pipeline_stages: Option<usize>,
    /// Micro-batches per batch in pipeline training (1: the single-process step exactly; more
    /// overlap the stages, and BatchNorm/dropout then see micro-batches).
    #[arg(long, default_value_t = 1, requires = "pipeline_stages")]
    pub micro_batches: usize,
    /// Pipeline schedule: 1f1b or gpipe.
    #[arg(long, default_value = "1f1b", requires = "pipeline_stages")]
    pub schedule: String,
    /// Save a sharded checkpoint instead of rank 0's single state dict and `.fxm`: every rank writes
    /// its part next to `-o` (`digits_cnn-00001-of-00002.safetensors`, ...; a pipeline rank its
    /// stage, a data-parallel rank an equal share of the bytes) and rank 0 the index
    /// `digits_cnn.safetensors.index.json`, which `ferrofx_dist::shards::load_sharded_state_dict`
    /// reads back on one machine. No `.fxm` is written.
    #[arg(long)]
    pub save_shards: bool,
}

impl DistArgs {
    /// Whether a distributed mode (or a distributed-only flag) was asked for.
    pub fn requested(&self) -> bool {
        self.data_parallel || self.pipeline_stages.is_some() || self.save_shards
    }

    fn check(&self) -> CliResult<()> {
        if self.save_shards && !self.data_parallel && self.pipeline_stages.is_none() {
            return Err(
                "--save-shards needs --data-parallel or --pipeline-stages N (one process writes one file)".into()
            );
        }
        if self.data_parallel && self.pipeline_stages.is_some() {
            return Err("--data-parallel and --pipeline-stages cannot be combined: choose one".into());
        }
        if self.pipeline_stages == Some(0) || self.micro_batches == 0 {
            return Err("--pipeline-stages and --micro-batches must be at least 1".into());
        }
        if !matches!(self.schedule.as_str(), "1f1b" | "gpipe") {
            return Err(format!("--schedule must be 1f1b or gpipe, got '{}'", self.schedule).into());
        }
        Ok(())
    }
}

/// Runs the distributed training `a.dist` asks for, with the checked settings `cfg`.
#[cfg(feature = "mpi")]
pub fn run(a: &TrainArgs, cfg: &TrainConfig) -> CliResult<()> {
    use std::sync::Arc;
    a.dist.check()?;
    let pg = Arc::new(ferrofx_dist::ProcessGroup::init().map_err(|e| format!("cannot join the MPI job: {e}"))?);
    let rank = pg.rank();
    let cfg = TrainConfig { progress: cfg.progress && rank == 0, ..cfg.clone() };
    if let Some(stages) = a.dist.pipeline_stages {
        if stages != pg.world_size() {
            return Err(format!(
                "rank {rank}: --pipeline-stages {stages} needs a job of {stages} ranks (mpirun -np {stages}), this one has {}",
                pg.world_size()
            )
            .into());
        }
        let schedule =
            if a.dist.schedule == "gpipe" { ferrofx_dist::Schedule::GPipe } else { ferrofx_dist::Schedule::OneFOneB };
        let trained = ferrofx_dist::train::train_digits_pipeline(&cfg, &pg, a.dist.micro_batches, schedule)
            .map_err(|e| format!("rank {rank}: {e}"))?;
        if a.dist.save_shards {
            save_shards(a, &pg, &trained.stage_state, &trained.owners)?;
        } else if let Some(report) = &trained.report {
            super::train::save_trained(a, report).map_err(|e| format!("rank 0: {e}"))?;
        }
        if let Some(report) = &trained.report {
            if a.dist.save_shards {
                println!("trained digits CNN: test accuracy {:.2}%", 100.0 * report.test_accuracy);
            }
            println!("(pipeline of {stages} stages, {} micro-batches, {})", a.dist.micro_batches, a.dist.schedule);
        }
        pg.barrier().map_err(|e| format!("rank {rank}: {e}"))?;
        return Ok(());
    }
    let report = if a.dist.sync_batchnorm {
        ferrofx_dist::train::train_digits_sync_batchnorm(&cfg, pg.clone())
    } else {
        ferrofx_dist::train::train_digits_data_parallel(&cfg, pg.clone())
    }
    .map_err(|e| format!("rank {rank}: {e}"))?;
    if a.dist.save_shards {
        let sd = ferrofx_nn::Module::state_dict(&report.model);
        save_shards(a, &pg, &sd, &ferrofx_dist::shards::assign_by_size(&sd, pg.world_size()))?;
        if rank == 0 {
            println!("trained digits CNN: test accuracy {:.2}%", 100.0 * report.test_accuracy);
        }
    } else if rank == 0 {
        super::train::save_trained(a, &report).map_err(|e| format!("rank 0: {e}"))?;
    }
    if rank == 0 {
        println!("(data parallel over {} ranks)", pg.world_size());
    }
    // the others wait until rank 0 has written: the job ends when the files exist
    pg.barrier().map_err(|e| format!("rank {rank}: {e}"))?;
    Ok(())
}

/// `--save-shards`: this rank's part of `local` (the tensors `owners` gives it) next to `-o`,
/// and rank 0's index; weights that diverged are refused on every rank before anything is
/// written.
#[cfg(feature = "mpi")]
fn save_shards(
    a: &TrainArgs,
    pg: &ferrofx_dist::ProcessGroup,
    local: &ferrofx_nn::StateDict,
    owners: &ferrofx_dist::shards::Owners,
) -> CliResult<()> {
    let rank = pg.rank();
    let bad = local
        .iter()
        .find(|(_, t)| t.to_vec_f64().map(|v| v.iter().any(|x| !x.is_finite())).unwrap_or(true))
        .map(|(name, _)| name.clone());
    // every rank learns whether any diverged, so that none writes a partial checkpoint
    let any = pg.all_gather_u64(u64::from(bad.is_some())).map_err(|e| format!("rank {rank}: {e}"))?;
    if let Some(name) = bad {
        return Err(format!(
            "rank {rank}: training diverged: '{name}' holds NaN or infinite values after training with --lr {}; \
             nothing was written. Use a smaller --lr (the default is 0.01)",
            a.lr
        )
        .into());
    }
    if let Some(r) = any.iter().position(|&b| b != 0) {
        return Err(format!("rank {rank}: rank {r}'s weights diverged; nothing was written").into());
    }
    let files =
        ferrofx_dist::shards::save_sharded(&a.out, local, owners, pg).map_err(|e| format!("rank {rank}: {e}"))?;
    if rank == 0 {
        let index = ferrofx_dist::shards::index_path(&a.out);
        println!(
            "sharded checkpoint: {} tensors in {} files, index {} (rank 0 wrote {})",
            owners.len(),
            pg.world_size(),
            index.display(),
            files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

/// Without MPI: `--data-parallel` says how to get it.
#[cfg(not(feature = "mpi"))]
pub fn run(a: &TrainArgs, _cfg: &TrainConfig) -> CliResult<()> {
    a.dist.check()?;
    let flag = if a.dist.data_parallel { "--data-parallel" } else { "--pipeline-stages" };
    Err(format!(
        "{flag} needs ferrofx built with MPI: install Open MPI and libclang (apt-get install openmpi-bin \
         libopenmpi-dev libclang-dev), build with `cargo build --release -p ferrofx-cli --features mpi`, and run it \
         as `mpirun -np 2 target/release/ferrofx train {flag} ...`"
    )
    .into())
}
