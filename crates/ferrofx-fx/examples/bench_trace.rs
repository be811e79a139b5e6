//! Tracing benchmark: `symbolic_trace` and `recompile` of ResNet-18/50 and GraphModule forward
//! vs eager forward on ResNet-18, side by side with torch.fx (`scripts/bench/fx_trace_torch.py`)
//! when a Python with torch and torchvision is given.
//!
//! ```text
//! cargo run --release -p ferrofx-fx --example bench_trace -- --reference .venv/bin/python
//! ```
//!
//! Options: `--repeat R` (best of R for tracing/recompile, default 20), `--forward-repeat F`
//! (best of F forwards, default 10), `--clock cpu|wall` (tracing and recompile; default `cpu`:
//! this thread's CPU time on both sides; forwards always use wall time because the kernels run
//! on a thread pool), `--reference PYTHON`, `--script PATH`, `--profile trace|recompile`
//! (loop R times on ResNet-50 only, for a profiler).

/// mimalloc, as the `ferrofx` binaries and `ferrofx-bench` use (tracing allocates many small
/// objects; docs/benchmarks.md also gives the figures with the system allocator, taken with
/// this line removed).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_fx::{symbolic_trace, GraphModule};
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;
use std::collections::HashMap;
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

struct Options {
    repeat: usize,
    forward_repeat: usize,
    wall: bool,
    reference: Option<String>,
    script: String,
    profile: Option<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        repeat: 20,
        forward_repeat: 10,
        wall: false,
        reference: None,
        script: concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench/fx_trace_torch.py").to_string(),
        profile: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--repeat" => o.repeat = value()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--forward-repeat" => o.forward_repeat = value()?.parse().map_err(|e| format!("--forward-repeat: {e}"))?,
            "--reference" => o.reference = Some(value()?),
            "--script" => o.script = value()?,
            "--profile" => o.profile = Some(value()?),
            "--clock" => match value()?.as_str() {
                "cpu" => o.wall = false,
                "wall" => o.wall = true,
                other => return Err(format!("--clock cpu|wall, not {other}")),
            },
            "--bench" => {}
            "-h" | "--help" => {
                return Err("usage: bench_trace [--repeat R] [--forward-repeat F] [--clock cpu|wall] [--reference PYTHON] [--script PATH]".into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_seconds() -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` (glibc/musl, 64-bit Linux: `struct timespec` is two 64-bit
    // integers, matching `Timespec`) writes one timespec through the valid, exclusive pointer.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_seconds() -> Option<f64> {
    None
}

/// Best of `n` runs of `f`, in milliseconds.
fn best_ms(n: usize, wall: bool, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let now = || {
        if wall {
            start.elapsed().as_secs_f64()
        } else {
            thread_cpu_seconds().unwrap_or_else(|| start.elapsed().as_secs_f64())
        }
    };
    let mut best = f64::INFINITY;
    for _ in 0..n.max(1) {
        let t = now();
        f();
        best = best.min(now() - t);
    }
    best * 1e3
}

fn reference(o: &Options) -> Result<HashMap<String, f64>, String> {
    let Some(python) = &o.reference else { return Err("no --reference PYTHON given".into()) };
    let out = Command::new(python)
        .arg(&o.script)
        .args(["--repeat", &o.repeat.min(10).to_string(), "--clock", if o.wall { "wall" } else { "cpu" }])
        .args(["--forward-repeat", &o.forward_repeat.to_string()])
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} {} failed: {}", o.script, String::from_utf8_lossy(&out.stderr)));
    }
    let mut m = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut it = line.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let Ok(v) = v.parse::<f64>() {
                m.insert(k.to_string(), v);
            }
        }
    }
    Ok(m)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    manual_seed(0);
    if let Some(what) = &o.profile {
        // `--profile trace|recompile`: loop on ResNet-50 only (for perf), no output table.
        let m = ResNet::resnet50(1000).expect("resnet50");
        let gm = symbolic_trace(&m).expect("trace");
        for _ in 0..o.repeat {
            match what.as_str() {
                "trace" => drop(black_box(symbolic_trace(&m).expect("trace"))),
                _ => gm.recompile().expect("recompile"),
            }
        }
        return;
    }
    let mut rows: Vec<(String, f64)> = Vec::new();
    let mut nodes = HashMap::new();
    for (name, mut m) in [
        ("resnet18", ResNet::resnet18(1000).expect("resnet18")),
        ("resnet50", ResNet::resnet50(1000).expect("resnet50")),
    ] {
        m.eval();
        let gm = symbolic_trace(&m).expect("trace");
        nodes.insert(name, gm.graph().len());
        let t = best_ms(o.repeat, o.wall, || {
            black_box(symbolic_trace(black_box(&m)).expect("trace"));
        });
        rows.push((format!("{name}.symbolic_trace"), t));
        let gm2: GraphModule = gm;
        let r = best_ms(o.repeat, o.wall, || gm2.recompile().expect("recompile"));
        rows.push((format!("{name}.recompile"), r));
    }
    let mut m = ResNet::resnet18(1000).expect("resnet18");
    m.eval();
    let gm = symbolic_trace(&m).expect("trace");
    let x = randn(&[1, 3, 224, 224], None).expect("input");
    let (e, g) = {
        let _ng = ferrofx_core::autograd::no_grad();
        for _ in 0..2 {
            black_box(m.forward(&x).expect("eager"));
            black_box(gm.forward(&x).expect("graph"));
        }
        // Interleave to share the machine's noise between the two.
        let (mut e, mut g) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..o.forward_repeat.max(1) {
            e = e.min(best_ms(1, true, || {
                black_box(m.forward(&x).expect("eager"));
            }));
            g = g.min(best_ms(1, true, || {
                black_box(gm.forward(&x).expect("graph"));
            }));
        }
        (e, g)
    };
    rows.push(("resnet18.forward_eager".into(), e));
    rows.push(("resnet18.forward_graph_module".into(), g));

    let reference = match reference(&o) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("reference not run: {e}");
            None
        }
    };
    println!(
        "clock: {} (tracing, recompile), wall (forwards); ferrofx best of {} / {} forwards",
        if o.wall { "wall" } else { "thread CPU" },
        o.repeat,
        o.forward_repeat
    );
    println!(
        "nodes: resnet18 {} (torch.fx {}), resnet50 {} (torch.fx {})",
        nodes["resnet18"],
        reference.as_ref().and_then(|r| r.get("resnet18.nodes")).map_or("?".into(), |v| v.to_string()),
        nodes["resnet50"],
        reference.as_ref().and_then(|r| r.get("resnet50.nodes")).map_or("?".into(), |v| v.to_string()),
    );
    println!("{:<32} {:>12} {:>12} {:>10}", "measurement", "ferrofx ms", "torch ms", "speedup");
    for (k, v) in &rows {
        match reference.as_ref().and_then(|r| r.get(k)) {
            Some(t) => println!("{k:<32} {v:>12.4} {t:>12.4} {:>9.1}x", t / v),
            None => println!("{k:<32} {v:>12.4} {:>12} {:>10}", "-", "-"),
        }
    }
    println!("GraphModule forward / eager forward (ResNet-18): {:.4}", g / e);
}
