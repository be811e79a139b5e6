//! Graph IR benchmark: the workloads of `scripts/bench_fx_graph.py`, run on ferrofx and (when a
//! Python with torch is given) on torch.fx, printed side by side with speedups.
//!
//! ```text
//! cargo run --release -p ferrofx-fx --example bench_graph -- --reference .venv/bin/python
//! ```
//!
//! Options: `--nodes N` (default 100000), `--repeat R` (best of R, default 5),
//! `--reference PYTHON` (a Python with torch; without it only ferrofx runs),
//! `--clock cpu|wall` (default `cpu`: this thread's CPU time on both sides, robust against
//! the other processes of a shared machine), `--script PATH` (default: the repository's `scripts/bench_fx_graph.py`), `--only WORKLOAD`
//! (ferrofx only, one workload: for profiling).

/// mimalloc, as the `ferrofx` binaries use: with glibc's allocator every new graph faults in
/// fresh pages (docs/graph-ir.md, "Benchmark vs torch.fx").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use ferrofx_fx::{Graph, NodeId, NodeMap, Opcode, Target};
use std::collections::HashMap;
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

struct Options {
    nodes: usize,
    repeat: usize,
    reference: Option<String>,
    script: String,
    only: Option<String>,
    wall: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        nodes: 100_000,
        repeat: 5,
        reference: None,
        script: concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench_fx_graph.py").to_string(),
        only: None,
        wall: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--nodes" => o.nodes = value()?.parse().map_err(|e| format!("--nodes: {e}"))?,
            "--repeat" => o.repeat = value()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--reference" => o.reference = Some(value()?),
            "--script" => o.script = value()?,
            "--only" => o.only = Some(value()?),
            "--clock" => match value()?.as_str() {
                "cpu" => o.wall = false,
                "wall" => o.wall = true,
                other => return Err(format!("--clock cpu|wall, not {other}")),
            },
            "--bench" => {} // passed by `cargo bench`
            "-h" | "--help" => {
                return Err("usage: bench_graph [--nodes N] [--repeat R] [--reference PYTHON] [--script PATH] [--clock cpu|wall] [--only WORKLOAD]".into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.nodes < 8 {
        return Err("--nodes must be at least 8".into());
    }
    Ok(o)
}

struct Ops {
    add: Target,
    mul: Target,
    sub: Target,
    relu: Target,
}

fn build_chain(n: usize, ops: &Ops) -> Graph {
    let mut g = Graph::new();
    let x = g.placeholder("x").expect("placeholder");
    let mut cur = x;
    for i in 0..n - 2 {
        let t = if i % 2 == 0 { &ops.add } else { &ops.mul };
        cur = g.call_function(t.clone(), [cur.into(), x.into()]).expect("call_function");
    }
    g.output(cur.into()).expect("output");
    g
}

fn build_half_dead(n: usize, ops: &Ops) -> Graph {
    let mut g = Graph::new();
    let x = g.placeholder("x").expect("placeholder");
    let mut cur = x;
    for _ in 0..(n - 2) / 2 {
        cur = g.call_function(ops.add.clone(), [cur.into(), x.into()]).expect("add");
        g.call_function(ops.relu.clone(), [cur.into()]).expect("relu");
    }
    g.output(cur.into()).expect("output");
    g
}

fn w_iterate(g: &mut Graph, _ops: &Ops) -> Option<Graph> {
    let mut total = 0usize;
    for node in g.iter() {
        if node.op() == Opcode::CallFunction {
            total += node.num_users();
        }
    }
    assert!(black_box(total) > 0);
    None
}

fn w_lint(g: &mut Graph, _ops: &Ops) -> Option<Graph> {
    g.lint().expect("lint");
    None
}

fn w_codegen(g: &mut Graph, _ops: &Ops) -> Option<Graph> {
    let src = g.python_code();
    assert!(black_box(src.len()) > g.len());
    None
}

fn w_insert_relu(g: &mut Graph, ops: &Ops) -> Option<Graph> {
    let ids: Vec<NodeId> = g.node_ids();
    for id in ids {
        let node = g.node(id).expect("live");
        if node.op() == Opcode::CallFunction && *node.target() == ops.add {
            let relu = {
                let mut g = g.inserting_after(Some(id)).expect("anchor");
                g.call_function(ops.relu.clone(), [id.into()]).expect("relu")
            };
            g.replace_all_uses_with_where(id, relu, |u| u.id() != relu, false).expect("rauw");
        }
    }
    None
}

fn w_replace_add(g: &mut Graph, ops: &Ops) -> Option<Graph> {
    let mut cursor = g.cursor();
    while let Some(id) = cursor.next(g) {
        let node = g.node(id).expect("live");
        if node.op() == Opcode::CallFunction && *node.target() == ops.add {
            let (args, kwargs) = (node.args().to_vec(), node.kwargs().clone());
            let new = {
                let mut g = g.inserting_after(Some(id)).expect("anchor");
                g.call_function_with(ops.sub.clone(), args, kwargs).expect("sub")
            };
            g.replace_all_uses_with(id, new).expect("rauw");
            g.erase_node(id).expect("erase");
        }
    }
    None
}

fn w_dce(g: &mut Graph, _ops: &Ops) -> Option<Graph> {
    assert!(g.eliminate_dead_code(None).unwrap());
    None
}

/// Returns the copy, so that it is freed after the clock stops: the reference script's copy is
/// freed only by the garbage collector between runs (its nodes form reference cycles), and
/// `build_chain` likewise frees its graph outside the timing on both sides. The old → new map
/// is recorded in a [`NodeMap`] (FX records it in a dict; `graph_copy` with a `HashMap` is
/// the same copy with a hash per node).
fn w_copy(g: &mut Graph, _ops: &Ops) -> Option<Graph> {
    let mut g2 = Graph::new();
    let mut val_map = NodeMap::new();
    let out = g2.graph_copy_with(g, &mut val_map).expect("copy").expect("output");
    assert_eq!(val_map.len(), g.len() - 1);
    g2.output(out).expect("output");
    assert_eq!(g2.len(), g.len());
    Some(g2)
}

/// A clock reading in seconds: this thread's CPU time (so the other processes of a shared
/// machine do not count; the reference script uses `time.thread_time()` likewise), or wall time.
#[derive(Clone, Copy)]
struct Clock {
    wall: bool,
    start: Instant,
}

impl Clock {
    fn now(&self) -> f64 {
        if self.wall {
            return self.start.elapsed().as_secs_f64();
        }
        thread_cpu_seconds().unwrap_or_else(|| self.start.elapsed().as_secs_f64())
    }
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

type Setup = fn(usize, &Ops) -> Graph;
/// A workload; what it returns is dropped after the clock stops.
type Work = fn(&mut Graph, &Ops) -> Option<Graph>;

fn time_best(repeat: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..repeat.max(1)).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn run_reference(o: &Options) -> Result<HashMap<String, f64>, String> {
    let Some(python) = &o.reference else {
        return Err("no --reference PYTHON given".into());
    };
    let out = Command::new(python)
        .arg(&o.script)
        .args(["--nodes", &o.nodes.to_string(), "--repeat", "1", "--clock", if o.wall { "wall" } else { "cpu" }])
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut res = HashMap::new();
    for line in stdout.lines() {
        // Lines look like {"workload": "lint", "nodes": 100000, "seconds": 0.1}; parsed by hand
        // to keep the crate free of a JSON dependency.
        if let Some(err) = line.split("\"error\": \"").nth(1) {
            return Err(err.trim_end_matches(['"', '}']).to_string());
        }
        let field = |key: &str| {
            line.split(&format!("\"{key}\": "))
                .nth(1)
                .map(|r| r.split([',', '}']).next().unwrap_or("").trim().trim_matches('"').to_string())
        };
        if let (Some(w), Some(s)) = (field("workload"), field("seconds")) {
            if let Ok(secs) = s.parse::<f64>() {
                res.insert(w, secs);
            }
        }
    }
    if res.is_empty() {
        return Err(format!(
            "the reference script produced no results (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        ));
    }
    Ok(res)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let ops = Ops {
        add: Target::named("add"),
        mul: Target::named("mul"),
        sub: Target::named("sub"),
        relu: Target::named("relu"),
    };
    let workloads: [(&str, Option<Setup>, Work); 8] = [
        ("build_chain", None, |_, _| None),
        ("iterate", Some(build_chain), w_iterate),
        ("lint", Some(build_chain), w_lint),
        ("codegen", Some(build_chain), w_codegen),
        ("insert_relu", Some(build_chain), w_insert_relu),
        ("replace_add", Some(build_chain), w_replace_add),
        ("dce", Some(build_half_dead), w_dce),
        ("copy", Some(build_chain), w_copy),
    ];
    let n = o.nodes;
    let clock = Clock { wall: o.wall, start: Instant::now() };
    let mut ours = Vec::new();
    for (name, setup, work) in workloads {
        if o.only.as_deref().is_some_and(|w| w != name) {
            continue;
        }
        let secs = time_best(o.repeat, || match setup {
            None => {
                let t = clock.now();
                let g = build_chain(n, &ops);
                let e = clock.now() - t;
                drop(black_box(g));
                e
            }
            Some(setup) => {
                let mut g = setup(n, &ops);
                let t = clock.now();
                let made = work(&mut g, &ops);
                let e = clock.now() - t;
                drop(black_box(made));
                g.lint().expect("workload left the graph lint-clean");
                e
            }
        });
        ours.push((name, secs));
    }
    let reference = if o.only.is_some() { Err("--only given".to_string()) } else { run_reference(&o) };
    println!(
        "graph IR benchmark: {n} nodes, ferrofx best of {}, torch.fx best of 1, {} time",
        o.repeat,
        if o.wall { "wall" } else { "thread CPU" }
    );
    if let Err(e) = &reference {
        println!("torch.fx reference not run: {e} (pass --reference .venv/bin/python with torch installed)");
    }
    println!(
        "{:<12} {:>13} {:>9} {:>14} {:>9} {:>9}",
        "workload", "ferrofx (ms)", "ns/node", "torch.fx (ms)", "us/node", "speedup"
    );
    for (name, secs) in &ours {
        let ns = secs * 1e9 / n as f64;
        match reference.as_ref().ok().and_then(|r| r.get(*name)) {
            Some(fx) => println!(
                "{:<12} {:>13.3} {:>9.1} {:>14.1} {:>9.2} {:>8.0}x",
                name,
                secs * 1e3,
                ns,
                fx * 1e3,
                fx * 1e6 / n as f64,
                fx / secs
            ),
            None => println!("{:<12} {:>13.3} {:>9.1} {:>14} {:>9} {:>9}", name, secs * 1e3, ns, "-", "-", "-"),
        }
    }
}
