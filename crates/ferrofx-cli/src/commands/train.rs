//! `ferrofx train`: train the digits CNN of the zoo and save it twice: its state dict
//! (safetensors, with PyTorch key names, at `-o`) and a runnable traced-module file next to it
//! (`-o` with the extension `.fxm`; `ferrofx run`/`show`/`bench` take it). Paths and
//! arguments are checked before training; weights that became NaN or infinite (a learning rate
//! far too large) are refused instead of written.

use super::CliResult;
use ferrofx_nn::state_dict::save_state_dict;
use ferrofx_nn::train::{train_digits, TrainConfig, TrainReport};
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
    /// Peak learning rate (Adam with a one-cycle schedule), in (0, 1].
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true)]
    pub lr: f64,
    /// Seed of the initialisation, the split and the shuffling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fixed reduction shards per batch: each batch is cut into this many row blocks whose
    /// gradients are computed on their own and summed in one fixed order (BatchNorm normalises
    /// each shard with its own statistics), so that `mpirun -np N ferrofx train --data-parallel`
    /// writes exactly these weights for any N leaving each rank a power of two of shards (1, 2, 4
    /// with the default 4).
    #[arg(long, default_value_t = ferrofx_nn::train::DEFAULT_BATCH_SHARDS)]
    pub batch_shards: usize,
    /// Kernel threads per process. The default 1 makes the arithmetic the same on every
    /// machine and under any `mpirun` binding (some kernels cut their sums by thread count), so
    /// that one process and every data-parallel rank compute the same bits; more threads may
    /// train faster, with other roundings.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Fraction of the data held out for testing, in (0, 1).
    #[arg(long, default_value_t = 0.2)]
    pub test_fraction: f64,
    /// Where to write the trained state dict (safetensors); the runnable traced module goes
    /// next to it with the extension `.fxm`.
    #[arg(long, short, default_value = "digits_cnn.safetensors")]
    pub out: PathBuf,
    /// Hide the progress bar and the per-epoch lines.
    #[arg(long)]
    pub quiet: bool,
    /// Train through the partitioned joint forward+backward graph, saving at most this fraction
    /// (0, 1] of the activations the default partition saves (the min-cut partitioner picks what
    /// to recompute); prints the peak activation memory beside the unconstrained figure.
    #[arg(long)]
    pub memory_budget: Option<f64>,
    /// Training over several processes (under mpirun).
    #[command(flatten)]
    pub dist: super::train_distributed::DistArgs,
}

/// Runs `ferrofx train`.
pub fn run(a: &TrainArgs) -> CliResult<()> {
    if a.epochs == 0 {
        return Err("--epochs must be at least 1".into());
    }
    if a.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    if a.batch_shards == 0 || a.threads == 0 {
        return Err("--batch-shards and --threads must be at least 1".into());
    }
    if !(a.test_fraction > 0.0 && a.test_fraction < 1.0) {
        return Err(format!("--test-fraction must be in (0, 1), got {}", a.test_fraction).into());
    }
    if !(a.lr > 0.0 && a.lr.is_finite()) {
        return Err(format!("--lr must be a positive number such as 0.01, got {}", a.lr).into());
    }
    if a.lr > 1.0 {
        return Err(format!(
            "--lr {} is far too large for Adam: the weights would diverge to NaN; use a value in (0, 1], typically 0.001 to 0.05",
            a.lr
        )
        .into());
    }
    let fxm = a.out.with_extension("fxm");
    if fxm == a.out {
        return Err(format!(
            "-o {} ends in .fxm, but it names the state dict; give e.g. digits_cnn.safetensors (the .fxm is written next to it)",
            a.out.display()
        )
        .into());
    }
    // fail now, not after minutes of training
    super::module_io::check_output_path(&a.out)?;
    let cfg = TrainConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        seed: a.seed,
        test_fraction: a.test_fraction,
        progress: !a.quiet,
        batch_shards: a.batch_shards,
    };
    fix_threads(a.threads)?;
    if let Some(b) = a.memory_budget {
        if !(b > 0.0 && b <= 1.0) {
            return Err(format!(
                "--memory-budget must be a fraction in (0, 1] of the default saved activations, such as 0.5; got {b}"
            )
            .into());
        }
        if a.dist.requested() {
            return Err("--memory-budget trains in one process; drop it or the distributed options".into());
        }
        return run_memory_budget(a, &cfg, b);
    }
    if a.dist.requested() {
        return super::train_distributed::run(a, &cfg);
    }
    let report = train_digits(&cfg)?;
    save_trained(a, &report)
}

/// Runs this process's kernels on `threads` threads (`--threads`).
fn fix_threads(threads: usize) -> CliResult<()> {
    if rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().is_err()
        && rayon::current_num_threads() != threads
    {
        return Err(format!(
            "--threads {threads}: the kernels already run on {} threads in this process",
            rayon::current_num_threads()
        )
        .into());
    }
    Ok(())
}

/// `ferrofx train --memory-budget F`: one epoch through the default partition for the
/// unconstrained figure, then the whole run through the budgeted min-cut partition.
fn run_memory_budget(a: &TrainArgs, cfg: &TrainConfig, budget: f64) -> CliResult<()> {
    use ferrofx_compile::training::digits::{train_digits_graph, Partitioner};
    use ferrofx_compile::training::MemoryBudget;
    use ferrofx_core::memory::{format_bytes, tracking::Category};
    let probe = TrainConfig { epochs: 1, progress: false, ..cfg.clone() };
    let free = train_digits_graph(&probe, Partitioner::Default)?;
    let run = train_digits_graph(cfg, Partitioner::Budget(MemoryBudget::Fraction(budget)))?;
    let (peak, peak_free) =
        (run.report.memory.peak(Category::Activation), free.report.memory.peak(Category::Activation));
    println!(
        "peak activation memory {} per training step under --memory-budget {budget} (unconstrained {}: {:.0}% less); saved for backward {} of {} per step, {} forward values recomputed ({} FLOPs)",
        format_bytes(peak as u128),
        format_bytes(peak_free as u128),
        100.0 * (1.0 - peak as f64 / peak_free.max(1) as f64),
        format_bytes(run.partition.saved_bytes as u128),
        format_bytes(free.partition.saved_bytes as u128),
        run.recomputed.len(),
        run.partition.recomputed_flops
    );
    save_trained(a, &run.report)
}

/// Writes the trained model's state dict at `-o` and its traced module next to it, refusing
/// weights that diverged.
pub(crate) fn save_trained(a: &TrainArgs, report: &TrainReport) -> CliResult<()> {
    let fxm = a.out.with_extension("fxm");
    let sd = report.model.state_dict();
    if let Some((name, _)) =
        sd.iter().find(|(_, t)| t.to_vec_f64().map(|v| v.iter().any(|x| !x.is_finite())).unwrap_or(true))
    {
        return Err(format!(
            "training diverged: '{name}' holds NaN or infinite values after training with --lr {}; nothing was written. Use a smaller --lr (the default is 0.01)",
            a.lr
        )
        .into());
    }
    save_state_dict(&sd, &a.out).map_err(|e| format!("cannot write the state dict to {}: {e}", a.out.display()))?;
    let x = ferrofx_core::Tensor::from_vec(vec![0.0f32; 64], &[1, 1, 8, 8])?;
    let gm = ferrofx_fx::trace_with_inputs(&report.model, &[(&x).into()])?;
    gm.save(&fxm).map_err(|e| format!("cannot write {}: {e}", fxm.display()))?;
    println!(
        "peak activation memory {} per training step; tensor memory while training: {}",
        ferrofx_core::memory::format_bytes(
            report.memory.peak(ferrofx_core::memory::tracking::Category::Activation) as u128
        ),
        report.memory
    );
    println!(
        "trained digits CNN: test accuracy {:.2}% after {} epochs in {:.1} s; state dict written to {}, runnable traced module to {} (try: ferrofx show {})",
        100.0 * report.test_accuracy,
        a.epochs,
        report.elapsed.as_secs_f64(),
        a.out.display(),
        fxm.display(),
        fxm.display()
    );
    Ok(())
}
