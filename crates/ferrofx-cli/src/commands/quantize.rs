//! `ferrofx quantize FILE --calibrate DATA.npy -o OUT`: int8 post-training static quantization
//! of a traced-module file (prepare → calibrate on the batches of a `.npy` file → convert), and
//! the main job's quantized-digits report.

use super::CliResult;
use ferrofx::quant::{convert, prepare, QConfig, QConfigMapping};
use ferrofx_core::{Tensor, Value};
use ferrofx_fx::GraphModule;
use ferrofx_nn::datasets::Split;
use ferrofx_nn::train::{evaluate, predict};
use ferrofx_nn::Module;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `ferrofx quantize`.
#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// A traced-module file (float32, eval mode).
    pub file: PathBuf,
    /// Calibration inputs: a float32 `.npy` file whose first dimension is the batch (split
    /// into batches of `--batch-size`).
    #[arg(long)]
    pub calibrate: PathBuf,
    /// Where to write the int8 module.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Calibration batch size.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Activation observer: `histogram` (PyTorch's x86 default) or `minmax`.
    #[arg(long, default_value = "histogram")]
    pub observer: String,
}

/// Quantizes `gm` on the calibration images in batches; returns the int8 module.
pub fn quantize_module(gm: &GraphModule, calib: &Tensor, batch: usize, qconfig: QConfig) -> CliResult<GraphModule> {
    let n = calib.shape().first().copied().unwrap_or(0);
    if n == 0 || batch == 0 {
        return Err("the calibration data is empty (or --batch-size is 0): give at least one sample".into());
    }
    let example = calib.narrow(0, 0, batch.min(n) as i64)?;
    let prepared = prepare(gm, &QConfigMapping::new().set_global(qconfig), &[Value::from(&example)])?;
    let mut start = 0;
    while start < n {
        let len = batch.min(n - start);
        prepared.forward(&calib.narrow(0, start as i64, len as i64)?)?;
        start += len;
    }
    Ok(convert(&prepared)?)
}

/// Runs `ferrofx quantize`.
pub fn run(args: &QuantizeArgs) -> CliResult<()> {
    let gm = GraphModule::load(&args.file).map_err(|e| format!("cannot load {}: {e}", args.file.display()))?;
    let calib = crate::npy::read(&args.calibrate).map_err(|e| format!("{}: {e}", args.calibrate.display()))?;
    let calib = calib.to_dtype(ferrofx_core::DType::F32)?;
    let qconfig = match args.observer.as_str() {
        "histogram" => QConfig::default_x86(),
        "minmax" => QConfig::min_max(),
        other => return Err(format!("unknown --observer '{other}': use histogram or minmax").into()),
    };
    let t = Instant::now();
    let q = quantize_module(&gm, &calib, args.batch_size, qconfig)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    q.save(&args.output).map_err(|e| format!("cannot write {}: {e}", args.output.display()))?;
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (before, after) = (size(&args.file), size(&args.output));
    let ops = q.graph().iter().filter(|n| n.target().name().starts_with("quantized_")).count();
    println!(
        "quantized {} ({} calibration samples, {ms:.0} ms): {ops} int8 ops; {} bytes -> {} bytes ({:.1}% smaller), written to {}",
        args.file.display(),
        calib.shape()[0],
        before,
        after,
        100.0 * (1.0 - after as f64 / before.max(1) as f64),
        args.output.display()
    );
    Ok(())
}

fn time_ms(m: &dyn Module, x: &Tensor) -> CliResult<f64> {
    m.forward(x)?; // warm-up
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        m.forward(x)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

/// The main job's quantization part: static int8 quantization of the optimised digits CNN,
/// calibrated on `calib` (training images), evaluated on `test`, saved next to the float file.
pub fn report(gm: &GraphModule, float_file: &Path, calib: &Tensor, test: &Split, out_dir: &Path) -> CliResult<()> {
    let t = Instant::now();
    let q = quantize_module(gm, calib, 64, QConfig::default_x86())?;
    let quant_ms = t.elapsed().as_secs_f64() * 1e3;
    let file = out_dir.join("digits_cnn.int8.fxm");
    q.save(&file).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let loaded = GraphModule::load(&file)?;
    let (_, float_acc) = evaluate(gm, test)?;
    let (_, int8_acc) = evaluate(&loaded, test)?;
    let agree = {
        let (a, b) = (predict(gm, &test.images)?, predict(&loaded, &test.images)?);
        a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len().max(1) as f64
    };
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (fs, qs) = (size(float_file), size(&file));
    let (f_ms, q_ms) = (time_ms(gm, &test.images)?, time_ms(&loaded, &test.images)?);
    println!("int8 quantization (static, HistogramObserver activations, per-channel int8 weights)");
    println!("  calibration                   {} training images, {quant_ms:.0} ms", calib.shape()[0]);
    println!(
        "  test accuracy                 {:.2}% float -> {:.2}% int8 ({:+.2} pp); predictions agree {:.2}%",
        100.0 * float_acc,
        100.0 * int8_acc,
        100.0 * (int8_acc - float_acc),
        100.0 * agree
    );
    println!(
        "  module file                   {fs} bytes float -> {qs} bytes int8 ({:.1}% smaller): {}",
        100.0 * (1.0 - qs as f64 / fs.max(1) as f64),
        file.display()
    );
    println!("  test-set inference            {f_ms:.2} ms float -> {q_ms:.2} ms int8 ({:.2}x)", f_ms / q_ms.max(1e-9));
    Ok(())
}
