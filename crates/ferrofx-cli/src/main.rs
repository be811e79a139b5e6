//! The `ferrofx` command-line tool.
//!
//! With no arguments it runs the main job on the embedded digits data set (see
//! [`commands::demo`]). Subcommands work on real files.

/// mimalloc instead of the system allocator: glibc returns freed arrays to the kernel, so
/// every new graph or tensor buffer faults in fresh pages (see docs/benchmarks.md); wrapped so
/// every tensor buffer starts on a cache line (`ferrofx_core::memory::CacheAligned`).
#[global_allocator]
static GLOBAL: ferrofx_core::memory::CacheAligned<mimalloc::MiMalloc> =
    ferrofx_core::memory::CacheAligned(mimalloc::MiMalloc);

mod commands;
mod embed;
mod npy;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "ferrofx", version, about = "Capture, transform, run and train neural-network programs")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The main job (the default): train the digits CNN on the embedded data and report.
    Demo {
        /// Directory the trained model files are written to.
        #[arg(long, default_value = "ferrofx-out")]
        out_dir: PathBuf,
        /// Seed of the initialisation, the split and the shuffling.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Hide the progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Train a model of the zoo on the embedded digits data and save its state dict.
    Train(commands::train::TrainArgs),
    /// Print a traced-module file: graph, table, code or summary.
    Show(commands::show::ShowArgs),
    /// Run a traced-module file on inputs from a safetensors file or .npy files.
    Run(commands::run::RunArgs),
    /// Latency and throughput of a traced-module file.
    Bench(commands::bench::BenchArgs),
    /// Draw the graph of a traced-module file as DOT or SVG.
    Draw(commands::draw::DrawArgs),
    /// A zoo architecture plus a state dict (e.g. from PyTorch) becomes a traced-module file.
    Convert(commands::convert::ConvertArgs),
    /// Compile a traced-module file for given input shapes (fusion, memory plan) and save it.
    Compile(commands::compile::CompileArgs),
    /// int8 post-training quantization of a traced-module file, calibrated on a .npy file.
    Quantize(commands::quantize::QuantizeArgs),
    /// Import an ONNX model as a traced-module file.
    Import(commands::onnx::ImportArgs),
    /// Export a traced-module file as an ONNX model.
    Export(commands::onnx::ExportArgs),
    /// Sentence embeddings (all-MiniLM-L6-v2 from its model folder), or their similarity table.
    Embed(embed::EmbedArgs),
}

/// Keeps freed memory in mimalloc's arenas instead of returning it to the OS after 10 ms
/// (`mi_option_purge_delay = -1`): a training step frees and reallocates hundreds of MB of
/// activations, and purged pages come back zero-filled by the kernel (13% of a ResNet-18 step).
fn keep_freed_memory() {
    // mimalloc v2's mi_option_e
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets a process-wide allocator option; mimalloc allows this at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let r = match cli.command {
        None => commands::demo::run(&PathBuf::from("ferrofx-out"), 0, false),
        Some(Command::Demo { out_dir, seed, quiet }) => commands::demo::run(&out_dir, seed, quiet),
        Some(Command::Train(args)) => commands::train::run(&args),
        Some(Command::Show(args)) => commands::show::run(&args),
        Some(Command::Run(args)) => commands::run::run(&args),
        Some(Command::Quantize(args)) => commands::quantize::run(&args),
        Some(Command::Bench(args)) => commands::bench::run(&args),
        Some(Command::Draw(args)) => commands::draw::run(&args),
        Some(Command::Convert(args)) => commands::convert::run(&args),
        Some(Command::Compile(args)) => commands::compile::run(&args),
        Some(Command::Import(args)) => commands::onnx::run_import(&args),
        Some(Command::Export(args)) => commands::onnx::run_export(&args),
        Some(Command::Embed(args)) => embed::run(&args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
