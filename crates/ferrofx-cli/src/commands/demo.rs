//! The main job: train the digits CNN on the embedded data set (progress bar and per-epoch
//! lines), trace it into a GraphModule, print the graph, optimise it (fold BatchNorm into the
//! convolutions, drop eval-mode dropout, CSE and simplification), check the optimised module
//! predicts exactly as the trained one, save it as a traced-module file, load it back (no model
//! code involved) and evaluate it, then print a short report; then train one epoch through the
//! partitioned joint forward+backward graph with and without a memory budget of 0.5 (what the
//! budget saves: [`memory_budget_report`]); then quantize it to int8
//! (`commands::quantize::report`: accuracy, file size, time).

use super::CliResult;
use ferrofx_fx::passes::{eliminate_common_subexpressions, fuse, simplify};
use ferrofx_fx::{trace_with_inputs, GraphModule};
use ferrofx_nn::datasets::Digits;
use ferrofx_nn::train::{evaluate, predict, train_digits, TrainConfig};
use ferrofx_nn::Module;
use std::path::Path;
use std::time::Instant;

fn agree(a: &[i64], b: &[i64]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len().max(1) as f64
}

/// Trains one epoch of the digits CNN through the joint forward+backward graph twice, with the
/// default partition (everything the backward reads is saved) and with the min-cut partition
/// under `budget`, and prints what the budget saves: bytes saved for backward, peak activation
/// memory of a step, the recomputed FLOPs and the time of each epoch (`ferrofx train
/// --memory-budget` does the same for a whole run).
pub fn memory_budget_report(cfg: &TrainConfig, budget: f64) -> CliResult<()> {
    use ferrofx_compile::training::digits::{train_digits_graph, Partitioner};
    use ferrofx_compile::training::MemoryBudget;
    use ferrofx_core::memory::{format_bytes, tracking::Category};
    let one = TrainConfig { epochs: 1, progress: false, ..cfg.clone() };
    let free = train_digits_graph(&one, Partitioner::Default)?;
    let run = train_digits_graph(&one, Partitioner::Budget(MemoryBudget::Fraction(budget)))?;
    let (peak, peak_free) =
        (run.report.memory.peak(Category::Activation), free.report.memory.peak(Category::Activation));
    let (saved, saved_free) = (run.partition.saved_bytes, free.partition.saved_bytes);
    let less = |a: u64, b: u64| 100.0 * (1.0 - a as f64 / b.max(1) as f64);
    let (t, t_free) = (run.report.elapsed.as_secs_f64(), free.report.elapsed.as_secs_f64());
    println!("memory budget {budget} (one epoch through the partitioned joint graph, batch {})", cfg.batch_size);
    println!(
        "  saved for backward            {} with the budget, {} without ({:.0}% less)",
        format_bytes(saved as u128),
        format_bytes(saved_free as u128),
        less(saved, saved_free)
    );
    println!(
        "  peak activation memory        {} with the budget, {} without ({:.0}% less)",
        format_bytes(peak as u128),
        format_bytes(peak_free as u128),
        less(peak as u64, peak_free as u64)
    );
    println!(
        "  recomputed in backward        {} forward values, {} FLOPs per step ({:.1}% of the step's {} FLOPs)",
        run.recomputed.len(),
        run.partition.recomputed_flops,
        100.0 * run.partition.recomputed_flops as f64
            / (free.partition.forward_flops + free.partition.backward_flops).max(1) as f64,
        free.partition.forward_flops + free.partition.backward_flops
    );
    println!(
        "  epoch time                    {t:.2} s with the budget, {t_free:.2} s without ({:+.0}%); test accuracy {:.2}% / {:.2}%",
        100.0 * (t / t_free.max(1e-9) - 1.0),
        100.0 * run.report.test_accuracy,
        100.0 * free.report.test_accuracy
    );
    Ok(())
}

/// Runs the main job, writing its files into `out_dir`.
pub fn run(out_dir: &Path, seed: u64, quiet: bool) -> CliResult<()> {
    let start = Instant::now();
    std::fs::create_dir_all(out_dir)
        .map_err(|e| format!("cannot create the output directory {}: {e}", out_dir.display()))?;
    // one process: every batch is one shard (BatchNorm over the whole batch); the fixed batch
    // shards of `ferrofx train` exist so that data-parallel ranks reproduce it bit for bit
    let cfg = TrainConfig { seed, progress: !quiet, batch_shards: 1, ..TrainConfig::default() };
    println!(
        "ferrofx main job: train the digits CNN ({} epochs, batch {}, Adam + one-cycle, lr {}) on the embedded digits",
        cfg.epochs, cfg.batch_size, cfg.lr
    );
    let report = train_digits(&cfg)?;
    let (train, test) = Digits::load()?.split(cfg.test_fraction, cfg.seed)?;
    let model = report.model;
    let trained_pred = predict(&model, &test.images)?;

    // trace
    let t = Instant::now();
    let example = test.images.narrow(0, 0, 1)?;
    let mut gm = trace_with_inputs(&model, &[(&example).into()])?;
    let trace_ms = t.elapsed().as_secs_f64() * 1e3;
    let nodes_before = gm.graph().len();
    println!("\ntraced graph ({nodes_before} nodes, {trace_ms:.1} ms):\n{}", gm.graph());
    let traced_pred = predict(&gm, &test.images)?;

    // optimise
    let t = Instant::now();
    let folded = fuse::fuse_conv_bn(&mut gm)?;
    let dropped = fuse::remove_identity_dropout(&mut gm)?;
    let merged = eliminate_common_subexpressions(gm.graph_mut())?;
    let simplified = simplify(gm.graph_mut())?;
    gm.recompile()?;
    let opt_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "optimised in {opt_ms:.1} ms: {folded} BatchNorm folded, {dropped} dropout removed, {merged} merged, {simplified} simplified; {} nodes:\n{}",
        gm.graph().len(),
        gm.code()?
    );
    let (_, opt_acc) = evaluate(&gm, &test)?;
    // compile (fusion + memory plan) for the test set's batch: time before and after
    let (before_ms, after_ms, compiled_what) = super::compile::time_before_after(&gm, &test.images)?;
    let opt_pred = predict(&gm, &test.images)?;

    // save and load
    let file = out_dir.join("digits_cnn.fxm");
    let t = Instant::now();
    gm.save(&file).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let save_ms = t.elapsed().as_secs_f64() * 1e3;
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let t = Instant::now();
    let loaded = GraphModule::load(&file)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let (_, loaded_acc) = evaluate(&loaded, &test)?;
    let loaded_pred = predict(&loaded, &test.images)?;

    let params: usize = model.parameters().iter().map(|p| p.numel()).sum();
    let opt_params: usize = gm.parameters().iter().map(|p| p.numel()).sum();
    println!("report");
    println!("  test images                   {}", test.len());
    println!("  test accuracy (trained)       {:.2}%", 100.0 * report.test_accuracy);
    println!("  test accuracy (optimised)     {:.2}%", 100.0 * opt_acc);
    println!("  test accuracy (reloaded)      {:.2}%", 100.0 * loaded_acc);
    println!("  traced = eager predictions    {:.2}%", 100.0 * agree(&traced_pred, &trained_pred));
    println!("  optimised = eager predictions {:.2}%", 100.0 * agree(&opt_pred, &trained_pred));
    println!("  reloaded = optimised          {:.2}%", 100.0 * agree(&loaded_pred, &opt_pred));
    println!("  parameters                    {params} (optimised module: {opt_params})");
    println!("  graph nodes                   {nodes_before} traced, {} optimised", gm.graph().len());
    println!("  training time                 {:.1} s", report.elapsed.as_secs_f64());
    println!(
        "  test-set inference            {before_ms:.2} ms optimised -> {after_ms:.2} ms compiled ({:.2}x; {compiled_what})",
        before_ms / after_ms
    );
    println!(
        "  traced module file            {} ({size} bytes, saved in {save_ms:.1} ms, loaded in {load_ms:.1} ms)",
        file.display()
    );
    println!("  total time                    {:.1} s", start.elapsed().as_secs_f64());
    println!();
    memory_budget_report(&cfg, 0.5)?;
    println!();
    super::quantize::report(&gm, &file, &train.images, &test, out_dir)?;
    if loaded_pred != opt_pred {
        return Err("the reloaded module does not predict as the optimised one".into());
    }
    if agree(&opt_pred, &trained_pred) < 0.99 {
        return Err("the optimised module disagrees with the trained model on more than 1% of the test set".into());
    }
    Ok(())
}
