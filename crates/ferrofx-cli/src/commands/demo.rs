//! The main job: train the digits CNN on the embedded data set (progress bar and per-epoch
//! lines), save the trained weights, reload them into a fresh model, check the reloaded model
//! predicts exactly as the trained one, and print a short report.

use super::CliResult;
use ferrofx_nn::datasets::Digits;
use ferrofx_nn::state_dict::{load_state_dict_file, save_state_dict};
use ferrofx_nn::train::{evaluate, predict, train_digits, TrainConfig};
use ferrofx_nn::zoo::DigitsCnn;
use ferrofx_nn::Module;
use std::path::Path;
use std::time::Instant;

/// Runs the main job, writing its files into `out_dir`.
pub fn run(out_dir: &Path, seed: u64, quiet: bool) -> CliResult<()> {
    let start = Instant::now();
    std::fs::create_dir_all(out_dir)
        .map_err(|e| format!("cannot create the output directory {}: {e}", out_dir.display()))?;
    let cfg = TrainConfig { seed, progress: !quiet, ..TrainConfig::default() };
    println!(
        "ferrofx main job: train the digits CNN ({} epochs, batch {}, Adam + one-cycle, lr {}) on the embedded digits",
        cfg.epochs, cfg.batch_size, cfg.lr
    );
    let report = train_digits(&cfg)?;
    let (_, test) = Digits::load()?.split(cfg.test_fraction, cfg.seed)?;
    let model = report.model;
    let trained_pred = predict(&model, &test.images)?;

    let weights = out_dir.join("digits_cnn.safetensors");
    let t = Instant::now();
    save_state_dict(&model.state_dict(), &weights).map_err(|e| format!("cannot write {}: {e}", weights.display()))?;
    let save_ms = t.elapsed().as_secs_f64() * 1e3;
    let size = std::fs::metadata(&weights).map(|m| m.len()).unwrap_or(0);

    let t = Instant::now();
    let mut reloaded = DigitsCnn::new()?;
    reloaded.load_state_dict(&load_state_dict_file(&weights)?, true)?;
    reloaded.eval();
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let (_, reloaded_acc) = evaluate(&reloaded, &test)?;
    let reloaded_pred = predict(&reloaded, &test.images)?;
    let same = trained_pred == reloaded_pred;

    let params: usize = model.parameters().iter().map(|p| p.numel()).sum();
    println!();
    println!("report");
    println!("  test images              {}", test.len());
    println!("  test accuracy (trained)  {:.2}%", 100.0 * report.test_accuracy);
    println!("  test accuracy (reloaded) {:.2}%", 100.0 * reloaded_acc);
    println!("  same predictions         {}", if same { "yes" } else { "NO" });
    println!("  parameters               {params}");
    println!("  training time            {:.1} s", report.elapsed.as_secs_f64());
    println!(
        "  weights file             {} ({size} bytes, saved in {save_ms:.1} ms, loaded in {load_ms:.1} ms)",
        weights.display()
    );
    println!("  total time               {:.1} s", start.elapsed().as_secs_f64());
    if !same {
        return Err("the reloaded model does not predict as the trained one".into());
    }
    Ok(())
}
