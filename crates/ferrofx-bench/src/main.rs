//! `ferrofx-bench`: runs ferrofx's benchmarks and the PyTorch reference side by side and prints
//! a table of medians and ratios.
//!
//! ```text
//! cargo run --release -p ferrofx-bench -- [--setup-reference] [--no-reference] [--filter S] [--quick] [--rounds N]
//! ```
//!
//! The reference is `scripts/bench_reference.py --serve`, run with the interpreter given by
//! `--python` (default `.venv/bin/python`) beside the bench: each case is timed by ferrofx and
//! right after by the reference, `--rounds` times in turn (see `reference.rs`). Without it (or with `--no-reference`) only ferrofx's
//! figures are printed, and the table says so. The whole-model inference cases also run on ONNX
//! Runtime when the reference environment has it (a second table).

mod cases;
mod cases_compile;
mod cases_minilm;
mod cases_models;
mod cases_onnx;
mod cases_qkernels;
mod cases_quant;
mod cases_train;
mod cases_train_compiled;
mod reference;
mod timer;

/// mimalloc instead of the system allocator: glibc returns freed arrays to the kernel, so
/// every new graph or tensor buffer faults in fresh pages (see docs/benchmarks.md); wrapped so
/// every tensor buffer starts on a cache line (`ferrofx_core::memory::CacheAligned`).
#[global_allocator]
static GLOBAL: ferrofx_core::memory::CacheAligned<mimalloc::MiMalloc> =
    ferrofx_core::memory::CacheAligned(mimalloc::MiMalloc);

use clap::Parser;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

#[derive(Parser, Debug)]
#[command(about = "ferrofx benchmarks side by side with PyTorch (ratios = reference time / ferrofx time)")]
struct Args {
    /// Create `.venv` with torch 2.15, torchvision, onnxruntime, safetensors from pip first.
    #[arg(long)]
    setup_reference: bool,
    /// Run ferrofx only.
    #[arg(long)]
    no_reference: bool,
    /// Python interpreter with torch for the reference.
    #[arg(long, default_value = ".venv/bin/python")]
    python: PathBuf,
    /// Only cases whose id contains this string (or one of several, comma-separated: the cases
    /// still run in the table's order, e.g. `compile_copy_16m,compile_resnet18_b1`).
    #[arg(long)]
    filter: Option<String>,
    /// Only these groups (comma-separated): kernels, autograd, nn, fx, format, compile, minilm, onnx,
    /// qkernels, quant, train.
    #[arg(long, value_delimiter = ',')]
    group: Vec<String>,
    /// Shorter timing budget (noisier).
    #[arg(long)]
    quick: bool,
    /// Time each case this many times, alternating ferrofx and the reference (each side's
    /// figure: its best median over the rounds).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Where to write the markdown table and JSON results.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let avx512 = std::fs::read_to_string("/proc/cpuinfo").map(|s| s.contains("avx512f")).unwrap_or(false);
    format!("{cpu}, {cores} cores{}", if avx512 { ", AVX-512" } else { "" })
}

fn setup_reference(python: &PathBuf) -> Result<(), String> {
    let venv = python.parent().and_then(|p| p.parent()).ok_or("--python must be <venv>/bin/python")?;
    if !python.exists() {
        let st = Command::new("python3").arg("-m").arg("venv").arg(venv).status().map_err(|e| e.to_string())?;
        if !st.success() {
            return Err("python3 -m venv failed".into());
        }
    }
    let st = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "torch==2.15.*",
            "torchvision",
            "onnxruntime",
            "onnx",
            "safetensors",
            "numpy",
        ])
        .status()
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err("pip install of the reference environment failed".into());
    }
    Ok(())
}

fn fmt_time(s: f64) -> String {
    if s < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if s < 1e-3 {
        format!("{:.2} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
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

fn main() {
    keep_freed_memory();
    let args = Args::parse();
    if args.setup_reference {
        if let Err(e) = setup_reference(&args.python) {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
    let budget = timer::Budget::new(args.quick);
    let cases: Vec<_> = cases::all()
        .into_iter()
        .chain(cases_models::all())
        .chain(cases_compile::all())
        .chain(cases_minilm::all())
        .chain(cases_onnx::all())
        .chain(cases_qkernels::all())
        .chain(cases_quant::all())
        .chain(cases_train::all())
        .filter(|c| args.filter.as_deref().is_none_or(|f| f.split(',').any(|p| c.id.contains(p))))
        .filter(|c| args.group.is_empty() || args.group.iter().any(|g| g == c.group))
        .collect();
    let compiled_rows = (args.group.is_empty() || args.group.iter().any(|g| g == "train"))
        && cases_train_compiled::selected(args.filter.as_deref());
    if cases.is_empty() && !compiled_rows {
        eprintln!(
            "error: no benchmark case matches the filter (groups: kernels, autograd, nn, fx, format, compile, minilm, onnx, qkernels, quant, train)"
        );
        std::process::exit(2);
    }
    // the reference runs beside: each case is timed by ferrofx, then by the reference, `rounds`
    // times in turn
    let mut server = if args.no_reference {
        Err("disabled with --no-reference".to_string())
    } else {
        eprintln!("starting the PyTorch reference ...");
        reference::Server::start(&args.python, args.quick, args.out.join("reference.stderr"))
    };
    let mut ours: BTreeMap<&str, Result<f64, String>> = BTreeMap::new();
    for c in &cases {
        let mut runner = (c.setup)().map_err(|e| e.to_string());
        for round in 0..args.rounds {
            eprint!("ferrofx  {:<28}", c.id);
            let r = runner.as_mut().map_err(|e| e.clone()).map(|f| {
                let before = timer::Usage::now();
                let mut calls = 0usize;
                let s = timer::median_secs(budget, c.inner, || {
                    calls += 1;
                    f()
                });
                (s, before.and_then(|b| Some((b, timer::Usage::now()?))).map(|(b, a)| a.per_call_since(&b, calls)))
            });
            match &r {
                Ok((s, u)) => eprintln!(" {}{}", fmt_time(*s), u.map(|u| format!("  [{u}]")).unwrap_or_default()),
                Err(e) => eprintln!(" skipped: {e}"),
            }
            let r = r.map(|(s, _)| s);
            let best = match (ours.remove(c.id), r) {
                (Some(Ok(a)), Ok(b)) => Ok(a.min(b)),
                (_, b) => b,
            };
            ours.insert(c.id, best);
            if let Ok(srv) = server.as_mut() {
                eprint!("reference {:<27} (round {}/{})", c.id, round + 1, args.rounds);
                match srv.time(c.id) {
                    Ok(()) => eprintln!(" done"),
                    Err(e) => {
                        eprintln!(" failed");
                        server = Err(e);
                    }
                }
            }
        }
    }
    let ids: Vec<&str> = cases.iter().map(|c| c.id).collect();
    let reference = server.map(reference::Server::finish);
    let mut md = String::new();
    md.push_str(&format!("Machine: {}\n\n", machine()));
    match &reference {
        Ok(reference::Reference { torch_version: v, .. }) => md.push_str(&format!(
            "Reference: PyTorch {v}, 2 threads. Ratio = reference time / ferrofx time (> 1: ferrofx is faster). \
             Each case timed by ferrofx and then by the reference, {} round(s) in turn; each side: its best median.\n\n",
            args.rounds
        )),
        Err(e) => md.push_str(&format!("Reference: NOT RUN ({e}); ferrofx figures only.\n\n")),
    }
    md.push_str(
        "| group | case | what | ferrofx | reference | ratio | ferrofx throughput |\n|---|---|---|---|---|---|---|\n",
    );
    let mut json_rows = Vec::new();
    for c in &cases {
        let o = &ours[c.id];
        let r = reference.as_ref().ok().and_then(|rf| rf.torch.get(c.id).copied());
        let ours_s = match o {
            Ok(s) => fmt_time(*s),
            Err(e) => format!("skipped ({e})"),
        };
        let ref_s = r.map(fmt_time).unwrap_or_else(|| "–".into());
        let ratio = match (o, r) {
            (Ok(a), Some(b)) => format!("{:.2}×", b / a),
            _ => "–".into(),
        };
        let thr = match (o, c.work) {
            (Ok(s), Some((w, unit))) => format!("{:.1} {unit}", w / s / 1e9),
            _ => "".into(),
        };
        md.push_str(&format!("| {} | {} | {} | {ours_s} | {ref_s} | {ratio} | {thr} |\n", c.group, c.id, c.what));
        json_rows
            .push(json!({"id": c.id, "group": c.group, "ferrofx_seconds": o.as_ref().ok(), "reference_seconds": r}));
    }
    // ONNX Runtime on the whole-model inference cases
    if let Ok(rf) = &reference {
        if !rf.ort.is_empty() {
            md.push_str(&format!(
                "\nONNX Runtime {} (CPU execution provider, 2 threads, default graph optimisations; torchvision's \
                 model exported with torch.onnx). Ratio = onnxruntime time / ferrofx time.\n\n\
                 | case | ferrofx | onnxruntime | ratio |\n|---|---|---|---|\n",
                rf.ort_version.as_deref().unwrap_or("(not run)")
            ));
            for c in &cases {
                let Some(ort) = rf.ort.get(c.id) else { continue };
                let ours_s = ours[c.id].as_ref().map(|s| fmt_time(*s)).unwrap_or_else(|e| format!("skipped ({e})"));
                let (ort_s, ratio) = match (ort, &ours[c.id]) {
                    (Ok(b), Ok(a)) => (fmt_time(*b), format!("{:.2}×", b / a)),
                    (Ok(b), Err(_)) => (fmt_time(*b), "–".into()),
                    (Err(e), _) => (format!("not run ({e})"), "–".into()),
                };
                md.push_str(&format!("| {} | {ours_s} | {ort_s} | {ratio} |\n", c.id));
                json_rows.push(json!({"id": c.id, "engine": "onnxruntime", "seconds": ort.as_ref().ok()}));
            }
            if let Some(note) = cases_minilm::note(&ids) {
                md.push_str(&format!("\n{note}"));
            }
        }
    }
    // derived: what conv-bn folding saves on ResNet-50 (issue 8)
    if let (Some(Ok(eager)), Some(Ok(folded))) = (ours.get("resnet50_infer_b1"), ours.get("fx_resnet50_folded_b1")) {
        md.push_str(&format!(
            "\nConv-BN folding on ResNet-50 (batch 1): {} unfolded -> {} folded, {:.2}x faster.\n",
            fmt_time(*eager),
            fmt_time(*folded),
            eager / folded
        ));
    }
    md.push_str(&cases_compile::summary(&ours, reference.as_ref().ok().map(|r| (&r.ort, &r.ort_peak))));
    md.push_str(&cases_onnx::summary());
    md.push_str(&cases_qkernels::summary(&ours, reference.as_ref().ok().map(|r| &r.torch)));
    md.push_str(&cases_quant::summary(&ours));
    if compiled_rows {
        md.push_str(&cases_train_compiled::report(
            (!args.no_reference).then_some(args.python.as_path()),
            args.quick,
            args.filter.as_deref(),
        ));
    }
    md.push_str(&cases_train::summary(&ours, (!args.no_reference).then_some(args.python.as_path()), args.quick));
    println!("{md}");
    if std::fs::create_dir_all(&args.out).is_ok() {
        let _ = std::fs::write(args.out.join("latest.md"), &md);
        let _ = std::fs::write(
            args.out.join("latest.json"),
            serde_json::to_string_pretty(&json!({"machine": machine(), "rows": json_rows})).unwrap_or_default(),
        );
        eprintln!("wrote {}/latest.md and latest.json", args.out.display());
    }
}
