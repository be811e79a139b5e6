//! `ferrofx train --data-parallel` / `--pipeline-stages N`: the digits CNN trained over the ranks of an MPI job
//! (`mpirun -np 2 ferrofx train --data-parallel --seed 0`), with the same weights as
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
    /// --data-parallel ...`. Each global batch is cut across the ranks (BatchNorm uses the global
    /// batch's statistics, dropout the global batch's masks), so the weights equal those of one
    /// process with the same seed; rank 0 writes the files. Needs ferrofx built with `--features
    /// mpi`.
    #[arg(long)]
    pub data_parallel: bool,
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
}

impl DistArgs {
    /// Whether a distributed mode was asked for.
    pub fn requested(&self) -> bool {
        self.data_parallel || self.pipeline_stages.is_some()
    }

    fn check(&self) -> CliResult<()> {
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
        let report = ferrofx_dist::train::train_digits_pipeline(&cfg, &pg, a.dist.micro_batches, schedule)
            .map_err(|e| format!("rank {rank}: {e}"))?;
        if let Some(report) = report {
            super::train::save_trained(a, &report).map_err(|e| format!("rank 0: {e}"))?;
            println!("(pipeline of {stages} stages, {} micro-batches, {})", a.dist.micro_batches, a.dist.schedule);
        }
        pg.barrier().map_err(|e| format!("rank {rank}: {e}"))?;
        return Ok(());
    }
    let report =
        ferrofx_dist::train::train_digits_data_parallel(&cfg, pg.clone()).map_err(|e| format!("rank {rank}: {e}"))?;
    if rank == 0 {
        super::train::save_trained(a, &report).map_err(|e| format!("rank 0: {e}"))?;
        println!("(data parallel over {} ranks)", pg.world_size());
    }
    // the others wait until rank 0 has written: the job ends when the files exist
    pg.barrier().map_err(|e| format!("rank {rank}: {e}"))?;
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
