//! Long mutation-fuzzing runs of the ONNX importer on the stable toolchain: every mutated
//! model that imports is also run under a 256 MiB memory limit (which is also the limit of any
//! single allocation in the process).
//!
//! `cargo run --release -p ferrofx-onnx --example fuzz_import -- --seconds 600 [--seed N]`
//!
//! Prints inputs executed, imported/rejected counts and panics; inputs that panic are written
//! to `fuzz-crashes/` (as `.onnx`) and the process exits with status 1.
//!
//! `... --example fuzz_import -- --replay DIR` re-runs every `.onnx` file of `DIR` (saved
//! crashes) once, with the default panic message (file and line) for each that still panics.

#[path = "../tests/suite/mutate.rs"]
mod mutate;

use std::time::{Duration, Instant};

fn arg(name: &str) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// Re-runs the saved inputs of `dir`; exits with status 1 if any still panics.
fn replay(dir: &str) {
    ferrofx_core::memory::set_allocation_limit(Some(mutate::RUN_MEMORY_LIMIT as usize));
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(d) => d.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => {
            eprintln!("error: cannot read the directory '{dir}': {e}");
            std::process::exit(2);
        }
    };
    files.sort();
    let mut panics = 0usize;
    for f in &files {
        let Ok(bytes) = std::fs::read(f) else { continue };
        if std::panic::catch_unwind(|| mutate::import_and_run(&bytes)).is_err() {
            eprintln!("  ^ {}", f.display());
            panics += 1;
        }
    }
    println!("fuzz_import --replay: {} files, {panics} still panic", files.len());
    if panics > 0 {
        std::process::exit(1);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--replay") {
        return replay(args.get(i + 1).map(String::as_str).unwrap_or("fuzz-crashes"));
    }
    let seconds = arg("--seconds").unwrap_or(60);
    let seed = arg("--seed").unwrap_or(1);
    ferrofx_core::memory::set_allocation_limit(Some(mutate::RUN_MEMORY_LIMIT as usize));
    let seeds = mutate::seeds();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut total = mutate::Report::default();
    let mut round = 0u64;
    while Instant::now() < deadline {
        let r = mutate::run(seed.wrapping_add(round), 10_000, Some(deadline), &seeds);
        total.iterations += r.iterations;
        total.accepted += r.accepted;
        total.rejected += r.rejected;
        total.ran += r.ran;
        total.run_errors += r.run_errors;
        total.panics.extend(r.panics);
        total.messages.extend(r.messages);
        round += 1;
    }
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.trim_start_matches("VmHWM:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!(
        "fuzz_import: {} inputs in {:.0} s ({} imported: {} ran, {} failed to run with an error; {} rejected by decoding or import; {} panics), peak RSS {rss}, seed {seed}",
        total.iterations,
        start.elapsed().as_secs_f64(),
        total.accepted,
        total.ran,
        total.run_errors,
        total.rejected,
        total.panics.len()
    );
    if !total.panics.is_empty() {
        let _ = std::fs::create_dir_all("fuzz-crashes");
        for (i, (p, m)) in total.panics.iter().zip(&total.messages).enumerate() {
            let _ = std::fs::write(format!("fuzz-crashes/crash-{i}.onnx"), p);
            eprintln!("crash-{i}.onnx: {m}");
        }
        std::process::exit(1);
    }
}
