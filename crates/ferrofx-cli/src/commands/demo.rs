//! The main job: train the digits CNN on the embedded data set (progress bar and per-epoch
//! lines), trace it into a GraphModule, print the graph, optimise it (fold BatchNorm into the
//! convolutions, drop eval-mode dropout, CSE and simplification), check the optimised module
//! predicts exactly as the trained one, save it as a traced-module file, load it back (no model
//! code involved) and evaluate it, then print a short report; then quantize it to int8
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
    super::quantize::report(&gm, &file, &train.images, &test, out_dir)?;
    if loaded_pred != opt_pred {
        return Err("the reloaded module does not predict as the optimised one".into());
    }
    if agree(&opt_pred, &trained_pred) < 0.99 {
        return Err("the optimised module disagrees with the trained model on more than 1% of the test set".into());
    }
    Ok(())
}
