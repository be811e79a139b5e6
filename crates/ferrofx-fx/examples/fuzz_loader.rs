//! Long mutation-fuzzing runs of the traced-module loader on the stable toolchain: every
//! mutated file that loads is also run under a 256 MiB memory limit and a 10^9 FLOP limit.
//!
//! `cargo run --release -p ferrofx-fx --example fuzz_loader -- --seconds 600 [--seed N]`
//!
//! Prints iterations, accepted/rejected counts and panics; inputs that panic are written to
//! `fuzz-crashes/` and the process exits with status 1.

#[path = "../tests/support/mutate.rs"]
mod mutate;

use std::time::{Duration, Instant};

fn arg(name: &str) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

fn main() {
    let seconds = arg("--seconds").unwrap_or(60);
    let seed = arg("--seed").unwrap_or(1);
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
        round += 1;
    }
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.trim_start_matches("VmHWM:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!(
        "fuzz_loader: {} inputs in {:.0} s ({} loaded: {} ran, {} refused or failed to run with an error; {} rejected by the loader; {} panics), peak RSS {rss}, seed {seed}",
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
        for (i, p) in total.panics.iter().enumerate() {
            let _ = std::fs::write(format!("fuzz-crashes/crash-{i}.safetensors"), p);
        }
        std::process::exit(1);
    }
}
