//! The `ferrofx` command-line tool.
//!
//! With no arguments it runs the main job on the embedded digits data set. Until the
//! training/tracing stack lands, the main job is a nearest-centroid classifier computed entirely
//! with ferrofx tensor ops (class means, squared distances through a matrix product, argmin),
//! reporting accuracy and timings honestly.

use clap::{Parser, Subcommand};
use ferrofx_core::{op, Result, Tensor, Value};
use ferrofx_nn::datasets::Digits;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "ferrofx", version, about = "Capture, transform, run and train neural-network programs")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the main job on the embedded digits data (the default).
    Demo {
        /// Seed of the train/test split.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn call1(name: &str, args: Vec<Value>) -> Result<Tensor> {
    let mut out = op::call(name, args, vec![])?;
    Ok(out.swap_remove(0))
}

fn kw1(name: &str, args: Vec<Value>, kwargs: Vec<(&str, Value)>) -> Result<Tensor> {
    let mut out = op::call(name, args, kwargs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())?;
    Ok(out.swap_remove(0))
}

/// Nearest-centroid classification of the digits test set, with tensor ops only.
fn demo(seed: u64) -> Result<()> {
    let t0 = Instant::now();
    let digits = Digits::load()?;
    let (train, test) = digits.split(0.2, seed)?;
    println!("digits: {} train / {} test images of 8x8 pixels (split seed {seed})", train.len(), test.len());
    let xtr = train.images.reshape(&[train.len() as i64, 64])?;
    let xte = test.images.reshape(&[test.len() as i64, 64])?;
    // one_hot(labels) [n, 10] -> class sums via a matrix product, divided by the counts
    let onehot = call1("one_hot", vec![(&train.labels).into(), Value::Int(10)])?.to_dtype(ferrofx_core::DType::F32)?;
    let sums = call1("matmul", vec![onehot.t()?.into(), (&xtr).into()])?; // [10, 64]
    let counts = kw1("sum", vec![(&onehot).into(), Value::Int(0)], vec![("keepdim", Value::Bool(false))])?;
    let centroids = call1("div", vec![sums.into(), counts.unsqueeze(1)?.into()])?;
    // squared distance = |x|^2 - 2 x·c + |c|^2 ; |x|^2 is the same for every class, skip it.
    let xc = call1("matmul", vec![(&xte).into(), centroids.t()?.into()])?; // [n, 10]
    let c2 =
        kw1("sum", vec![call1("mul", vec![(&centroids).into(), (&centroids).into()])?.into(), Value::Int(1)], vec![])?;
    let dist = call1("sub", vec![c2.into(), call1("mul", vec![xc.into(), Value::Float(2.0)])?.into()])?;
    let pred = kw1("argmin", vec![dist.into()], vec![("dim", Value::Int(1))])?;
    let correct = call1("eq", vec![pred.into(), (&test.labels).into()])?;
    let acc = kw1("mean", vec![correct.to_dtype(ferrofx_core::DType::F32)?.into()], vec![])?.item()?;
    println!("nearest-centroid test accuracy: {:.2}%", acc * 100.0);
    println!("total time: {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command.unwrap_or(Command::Demo { seed: 0 }) {
        Command::Demo { seed } => demo(seed),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
