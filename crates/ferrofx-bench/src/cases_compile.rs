//! The `compile` group (issue 18): seed 003's fusion examples against the unfused GraphModule
//! and a copy of the same bytes (the memory-bandwidth bound), and compiled whole models
//! (ids shared with `scripts/bench_reference.py`, which runs PyTorch eager and ONNX Runtime on
//! the same models).
//!
//! Each compiled-model case is also timed **alone in a fresh process** of this binary (the
//! same case, the same budget and `--rounds`, nothing run before it in that process): the ratio against ONNX
//! Runtime and ferrofx's peak memory are taken from that run, which is what a program running
//! one model sees. The in-group figure is printed beside it: in one long process, earlier
//! cases leave allocator state behind (the 64-96 MiB buffers of seed 003's cases; freed memory
//! is kept by mimalloc and reused, so the peak-RSS growth of a later case reads ~0 MB).

use crate::cases::{tensor, Case, Runner};
use crate::timer::median_secs_alternating;
use ferrofx_compile::{compile, CompileOptions};
use ferrofx_core::ops::fused::STREAM_MIN_BYTES;
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::{trace_with_inputs, GraphModule};
use ferrofx_nn::zoo::{MobileNetV2, ResNet, TransformerClassifier};
use ferrofx_nn::Module;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

const N16M: usize = 16 << 20;

#[derive(ferrofx_nn::Module)]
struct AddMulRelu {}
impl Module for AddMulRelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ((x + 1.0)? * 2.0)?.relu()
    }
}

#[derive(ferrofx_nn::Module)]
struct AddScaledRelu {}
impl Module for AddScaledRelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_values(&[x.into(), x.into()])?
            .pop()
            .and_then(|v| v.as_tensor().cloned())
            .ok_or_else(|| ferrofx_core::Error::argument("bench", "no output"))
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let (x, y) = match inputs {
            [Value::Tensor(x), Value::Tensor(y)] => (x, y),
            _ => return Err(ferrofx_core::Error::argument("bench", "two tensors expected")),
        };
        Ok(vec![(x + (y * 2.0)?)?.relu()?.into()])
    }
}

fn runner(gm: GraphModule, inputs: Vec<Value>) -> Result<Runner> {
    let _g = ferrofx_core::autograd::no_grad();
    gm.forward_values(&inputs)?;
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = gm.forward_values(&inputs);
    }))
}

fn seed003(two_inputs: bool, fused: bool) -> Result<Runner> {
    let inputs: Vec<Value> = if two_inputs {
        vec![tensor(&[N16M], 1)?.into(), tensor(&[N16M], 2)?.into()]
    } else {
        vec![tensor(&[N16M], 1)?.into()]
    };
    let mut gm = if two_inputs {
        trace_with_inputs(&AddScaledRelu {}, &inputs)?
    } else {
        trace_with_inputs(&AddMulRelu {}, &inputs)?
    };
    if fused {
        let groups = ferrofx_compile::fuse_elementwise(&mut gm)?;
        if groups != 1 {
            return Err(ferrofx_core::Error::argument("bench", format!("expected one fused group, got {groups}")));
        }
    }
    runner(gm, inputs)
}

fn add_mul_relu_unfused() -> Result<Runner> {
    seed003(false, false)
}
fn add_mul_relu_fused() -> Result<Runner> {
    alternate("relu((x+1)*2)", false)?;
    seed003(false, true)
}
fn add_scaled_relu_unfused() -> Result<Runner> {
    seed003(true, false)
}
fn add_scaled_relu_fused() -> Result<Runner> {
    alternate("relu(x+2*y)", true)?;
    seed003(true, true)
}

/// Seed 003's expression -> median seconds of (fused, unfused, streaming copy, plain copy)
/// sampled in turn in one measurement ([`median_secs_alternating`]).
static ALTERNATING: Mutex<BTreeMap<&'static str, [f64; 4]>> = Mutex::new(BTreeMap::new());

/// Times seed 003's fused and unfused module and both copies of the same bytes in turn (one
/// call of each per round), so that the ratios of the summary do not depend on how the
/// machine's memory bandwidth drifted between separately timed cases (on a shared VM it
/// moved by 20-30% within minutes: the copies of one run read 47-74 GB/s).
fn alternate(name: &'static str, two_inputs: bool) -> Result<()> {
    if std::env::var_os(FRESH_CHILD).is_some() {
        return Ok(());
    }
    let n = if two_inputs { N16M + N16M / 2 } else { N16M };
    let (mut fused, mut unfused) = (seed003(two_inputs, true)?, seed003(two_inputs, false)?);
    let (mut stream, mut plain) = (copy(n, N16M * 4 >= STREAM_MIN_BYTES)?, copy(n, false)?);
    let budget = crate::timer::Budget::new(std::env::args().any(|a| a == "--quick"));
    let m = median_secs_alternating(budget, &mut [&mut fused, &mut unfused, &mut stream, &mut plain]);
    if let [f, u, s, p] = m[..] {
        eprintln!(
            "[{name}, sampled in turn: fused {:.2} ms, unfused {:.2} ms, copies {:.2} / {:.2} ms]",
            f * 1e3,
            u * 1e3,
            s * 1e3,
            p * 1e3
        );
        ALTERNATING.lock().unwrap_or_else(|e| e.into_inner()).insert(name, [f, u, s, p]);
    }
    Ok(())
}

/// Copies `src` into `out` with non-temporal (streaming) stores, 64 bytes at a time where the
/// CPU has AVX-512, else 16; `out` must start 64-byte aligned and hold a multiple of 16 floats.
fn copy_streaming(out: &mut [MaybeUninit<f32>], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        fn wide(out: &mut [MaybeUninit<f32>], src: &[f32]) {
            for (o, s) in out.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
                // SAFETY: 16 floats each side; `o` is 64-byte aligned (checked by the caller).
                unsafe { _mm512_stream_ps(o.as_mut_ptr().cast(), _mm512_loadu_ps(s.as_ptr())) };
            }
            _mm_sfence();
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { wide(out, src) };
        }
        for (o, s) in out.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            // SAFETY: 4 floats each side; `o` is 16-byte aligned (checked by the caller); SSE
            // is baseline on x86-64.
            unsafe { _mm_stream_ps(o.as_mut_ptr().cast(), _mm_loadu_ps(s.as_ptr())) };
        }
        // SAFETY: no preconditions.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (o, &v) in out.iter_mut().zip(src) {
        o.write(v);
    }
}

/// Copies `n` floats into a fresh buffer on the rayon pool, as the fused kernel writes its
/// output: the memory-bandwidth bound of a pass that moves the same bytes. Same allocation
/// policy as the kernels (a fresh uninitialised buffer from the process allocator each call,
/// tasks of 64K floats) and, with `stream`, the same store policy as `fused_elementwise` for
/// outputs of at least `STREAM_MIN_BYTES` (non-temporal stores); without it, ordinary stores.
fn copy(n: usize, stream: bool) -> Result<Runner> {
    let src = crate::cases::data(n, 3);
    Ok(Box::new(move || {
        let mut out: Vec<f32> = Vec::with_capacity(n);
        let aligned = (out.as_ptr() as usize).is_multiple_of(64) && n.is_multiple_of(16);
        out.spare_capacity_mut()[..n].par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(o, s)| {
            if stream && aligned {
                copy_streaming(o, s);
            } else {
                for (o, &v) in o.iter_mut().zip(s) {
                    o.write(v);
                }
            }
        });
        // SAFETY: the chunks cover all n elements and every element was written above.
        unsafe { out.set_len(n) };
        std::hint::black_box(&out);
    }))
}

/// 64 MiB read + 64 MiB written: the traffic of `relu((x + 1) * 2)` on 16M floats.
fn copy_16m() -> Result<Runner> {
    copy(N16M, N16M * 4 >= STREAM_MIN_BYTES)
}
/// 96 MiB read + 96 MiB written: the traffic of `relu(x + 2 * y)` (two inputs, one output).
fn copy_24m() -> Result<Runner> {
    copy(N16M + N16M / 2, N16M * 4 >= STREAM_MIN_BYTES)
}
/// The same copies with ordinary stores (each output line is read before it is written).
fn copy_16m_plain() -> Result<Runner> {
    copy(N16M, false)
}
fn copy_24m_plain() -> Result<Runner> {
    copy(N16M + N16M / 2, false)
}

/// Case id -> ferrofx's peak RSS growth (bytes) over compiling the traced model (BatchNorm
/// folding makes new weights) and running it 3 times: the counterpart of ONNX Runtime's
/// session creation (weights loaded, graph optimised) and 3 runs.
static PEAK: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Runs `setup` (which compiles the model and runs it) with the process's peak-RSS
/// counter reset, and records the growth of the peak over the RSS before under `id`.
fn with_peak<T>(id: &str, setup: impl FnOnce() -> Result<T>) -> Result<T> {
    use crate::cases_onnx::rss;
    let before = rss("VmRSS:").unwrap_or(0);
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let out = setup()?;
    if reset {
        let peak = rss("VmHWM:").unwrap_or(0).saturating_sub(before);
        PEAK.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), peak);
        if std::env::var(FRESH_CHILD).is_ok_and(|c| c == id) {
            // for the parent (time_in_fresh_process)
            println!("{}", serde_json::json!({"id": id, "peak_bytes": peak}));
        }
    }
    Ok(out)
}

/// Set (to the case id) in the child process that times one model case alone.
const FRESH_CHILD: &str = "FERROFX_BENCH_COMPILE_FRESH";

/// Case id -> (median seconds, peak RSS growth in bytes) of the case timed alone in a fresh
/// process (see the module docs).
static FRESH: Mutex<BTreeMap<String, (f64, Option<u64>)>> = Mutex::new(BTreeMap::new());

/// Whether this process is the fresh child of a case other than `id` (whose setup it skips).
fn other_child(id: &str) -> bool {
    std::env::var(FRESH_CHILD).is_ok_and(|c| c != id)
}

/// Times case `id` alone in a fresh process of this binary (`--group compile --filter id`,
/// the same budget) and records its median and peak memory in [`FRESH`]; nothing in the
/// child itself. A child that fails leaves no entry (the table then says so).
fn time_in_fresh_process(id: &str) {
    if std::env::var_os(FRESH_CHILD).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    wait_until_idle();
    let out_dir = format!("target/bench-fresh/{id}");
    let mut cmd = Command::new(exe);
    cmd.args(["--no-reference", "--group", "compile", "--filter", id, "--out", &out_dir])
        .env(FRESH_CHILD, id)
        .env_remove("FERROFX_COMPILE_PROFILE");
    // the same budget as the parent's figure for ONNX Runtime: with `--rounds N`, the child
    // times the case N times too (its figure: the best median, as each side's in the table)
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--quick") {
        cmd.arg("--quick");
    }
    let rounds = args.iter().position(|a| a == "--rounds").and_then(|i| args.get(i + 1)).cloned();
    let rounds = rounds.or_else(|| args.iter().find_map(|a| a.strip_prefix("--rounds=").map(str::to_string)));
    if let Some(r) = rounds {
        cmd.args(["--rounds", &r]);
    }
    let Ok(out) = cmd.output() else { return };
    let json = |text: &str| -> Vec<serde_json::Value> {
        text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).collect()
    };
    let peak = json(&String::from_utf8_lossy(&out.stdout))
        .iter()
        .find(|v| v.get("id").and_then(|x| x.as_str()) == Some(id))
        .and_then(|v| v.get("peak_bytes").and_then(|x| x.as_u64()));
    let secs = std::fs::read_to_string(format!("{out_dir}/latest.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("rows")?
                .as_array()?
                .iter()
                .find(|r| r.get("id").and_then(|x| x.as_str()) == Some(id))?
                .get("ferrofx_seconds")?
                .as_f64()
        });
    if let Some(s) = secs {
        FRESH.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), (s, peak));
    }
}

/// The machine's busy and total CPU time so far (`/proc/stat`, in clock ticks).
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).unwrap_or(&0);
    Some((total - idle, total))
}

/// Waits (up to 3 s) until the machine has been idle for 100 ms: the reference's thread pools
/// (ONNX Runtime's and PyTorch's OpenMP workers) keep spinning for a while after its last
/// timed run, and a child started meanwhile shares the cores with them (ResNet-18 batch 1 read
/// 11.6 ms in the fresh child of a full run and 9.6-9.8 ms in children started alone).
fn wait_until_idle() {
    let start = Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(3) {
        let Some((b0, t0)) = cpu_ticks() else { return };
        std::thread::sleep(std::time::Duration::from_millis(100));
        let Some((b1, t1)) = cpu_ticks() else { return };
        if t1 > t0 && ((b1 - b0) as f64) < 0.1 * (t1 - t0) as f64 {
            return;
        }
    }
}

fn model(name: &str) -> Result<(Box<dyn Module>, Vec<usize>)> {
    Ok(match name {
        "resnet18" => (Box::new(ResNet::resnet18(1000)?), vec![3, 224, 224]),
        "resnet50" => (Box::new(ResNet::resnet50(1000)?), vec![3, 224, 224]),
        "mobilenet_v2" => (Box::new(MobileNetV2::new(1000, 1.0)?), vec![3, 224, 224]),
        _ => return Err(ferrofx_core::Error::argument("bench", format!("unknown model {name}"))),
    })
}

fn compiled_model(name: &str, batch: usize) -> Result<Runner> {
    time_in_fresh_process(&format!("compile_{name}_b{batch}"));
    let (mut m, chw) = model(name)?;
    m.eval();
    let mut shape = vec![batch];
    shape.extend(chw);
    let x = tensor(&shape, 1)?;
    let gm = trace_with_inputs(m.as_ref(), &[(&x).into()])?;
    let (c, took) = with_peak(&format!("compile_{name}_b{batch}"), || {
        let t0 = Instant::now();
        let c = compile(&gm, &[(&x).into()], CompileOptions::default())?;
        let took = t0.elapsed();
        let _g = ferrofx_core::autograd::no_grad();
        for _ in 0..3 {
            c.forward(&x)?;
        }
        Ok((c, took))
    })?;
    if let Some(s) = c.latest() {
        eprint!(
            "[{name} b{batch}: compiled in {:.0} ms, {} fused groups; {}] ",
            took.as_secs_f64() * 1e3,
            s.fusion.groups.len(),
            s.memory
        );
        // FERROFX_COMPILE_PROFILE=N: the N slowest nodes of the compiled graph (best of 5 runs)
        if let Some(top) = std::env::var("FERROFX_COMPILE_PROFILE").ok().and_then(|v| v.parse::<usize>().ok()) {
            let _g = ferrofx_core::autograd::no_grad();
            let p = ferrofx_fx::passes::analysis::profile(&s.module, &[(&x).into()], 5)?;
            eprintln!("\nper-node profile of compiled {name} b{batch}:\n{}", p.table(top));
        }
    }
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = c.forward(&x);
    }))
}

fn transformer() -> Result<(TransformerClassifier, Tensor)> {
    // all-MiniLM-L6 sized: d_model 384, 12 heads, ff 1536, 6 layers, 128 tokens
    let mut m = TransformerClassifier::new(1000, 384, 12, 1536, 6, 128, 2, 0.0)?;
    m.eval();
    let ids = Tensor::from_vec((0..128).map(|i| (i * 7 % 1000) as i64).collect::<Vec<_>>(), &[1, 128])?;
    Ok((m, ids))
}

fn transformer_compiled() -> Result<Runner> {
    time_in_fresh_process("compile_transformer");
    let (m, ids) = transformer()?;
    let gm = trace_with_inputs(&m, &[(&ids).into()])?;
    let c = with_peak("compile_transformer", || {
        let c = compile(&gm, &[(&ids).into()], CompileOptions::default())?;
        let _g = ferrofx_core::autograd::no_grad();
        for _ in 0..3 {
            c.forward(&ids)?;
        }
        Ok(c)
    })?;
    // FERROFX_COMPILE_PROFILE=N: the N slowest nodes of the compiled graph (best of 5 runs)
    if let (Some(s), Some(top)) =
        (c.latest(), std::env::var("FERROFX_COMPILE_PROFILE").ok().and_then(|v| v.parse::<usize>().ok()))
    {
        let _g = ferrofx_core::autograd::no_grad();
        let p = ferrofx_fx::passes::analysis::profile(&s.module, &[(&ids).into()], 5)?;
        eprintln!("\nper-node profile of the compiled transformer:\n{}", p.table(top));
    }
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = c.forward(&ids);
    }))
}

fn transformer_traced() -> Result<Runner> {
    if other_child("compile_transformer_traced") {
        return Err(ferrofx_core::Error::argument("bench", "not this fresh child's case"));
    }
    let (m, ids) = transformer()?;
    let gm = trace_with_inputs(&m, &[(&ids).into()])?;
    runner(gm, vec![ids.into()])
}

/// Wall time of `compile` on ResNet-50 at batch 1 (trace excluded; shape propagation, which
/// runs the model once, included).
fn compile_time_resnet50() -> Result<Runner> {
    let mut m = ResNet::resnet50(1000)?;
    m.eval();
    let x = tensor(&[1, 3, 224, 224], 1)?;
    let gm = trace_with_inputs(&m, &[(&x).into()])?;
    Ok(Box::new(move || {
        let _ = compile(&gm, &[(&x).into()], CompileOptions::default());
    }))
}

macro_rules! model_cases {
    ($($f:ident => $name:literal, $b:literal;)*) => {
        $(fn $f() -> Result<Runner> { compiled_model($name, $b) })*
    };
}
model_cases! {
    r18_b1 => "resnet18", 1;
    r18_b8 => "resnet18", 8;
    r50_b1 => "resnet50", 1;
    r50_b8 => "resnet50", 8;
    mb2_b1 => "mobilenet_v2", 1;
    mb2_b8 => "mobilenet_v2", 8;
}

/// The cases of the group.
pub fn all() -> Vec<Case> {
    let c =
        |id, what, work: Option<(f64, &'static str)>, setup| Case { id, group: "compile", what, work, inner: 1, setup };
    let bytes16 = Some(((2 * N16M * 4) as f64, "GB/s"));
    let bytes24 = Some(((3 * N16M * 4) as f64, "GB/s"));
    vec![
        c("compile_copy_16m", "copy 64 MiB (bandwidth bound of relu((x+1)*2))", bytes16, copy_16m),
        c(
            "compile_add_mul_relu_16m_unfused",
            "relu((x+1)*2), 16M f32, GraphModule unfused",
            bytes16,
            add_mul_relu_unfused,
        ),
        c("compile_add_mul_relu_16m_fused", "relu((x+1)*2), 16M f32, one fused node", bytes16, add_mul_relu_fused),
        c("compile_copy_16m_plain", "copy 64 MiB, ordinary stores (for comparison)", bytes16, copy_16m_plain),
        c("compile_copy_24m", "copy 96 MiB (bandwidth bound of relu(x+2*y))", bytes24, copy_24m),
        c("compile_copy_24m_plain", "copy 96 MiB, ordinary stores (for comparison)", bytes24, copy_24m_plain),
        c(
            "compile_add_scaled_relu_16m_unfused",
            "relu(x+2*y), 16M f32, GraphModule unfused",
            bytes24,
            add_scaled_relu_unfused,
        ),
        c("compile_add_scaled_relu_16m_fused", "relu(x+2*y), 16M f32, one fused node", bytes24, add_scaled_relu_fused),
        c("compile_resnet18_b1", "ResNet-18 compiled, batch 1, 224 px", None, r18_b1),
        c("compile_resnet18_b8", "ResNet-18 compiled, batch 8, 224 px", None, r18_b8),
        c("compile_resnet50_b1", "ResNet-50 compiled, batch 1, 224 px", None, r50_b1),
        c("compile_resnet50_b8", "ResNet-50 compiled, batch 8, 224 px", None, r50_b8),
        c("compile_mobilenet_v2_b1", "MobileNetV2 compiled, batch 1, 224 px", None, mb2_b1),
        c("compile_mobilenet_v2_b8", "MobileNetV2 compiled, batch 8, 224 px", None, mb2_b8),
        c(
            "compile_transformer_traced",
            "transformer encoder (384d, 6 layers, 128 tokens), traced",
            None,
            transformer_traced,
        ),
        c(
            "compile_transformer",
            "transformer encoder (384d, 6 layers, 128 tokens), compiled",
            None,
            transformer_compiled,
        ),
        c("compile_time_resnet50", "compile() of traced ResNet-50 (target < 1 s)", None, compile_time_resnet50),
    ]
}

fn fmt_ms(s: f64) -> String {
    format!("{:.2} ms", s * 1e3)
}

fn fmt_mb(b: f64) -> String {
    format!("{:.1} MB", b / 1e6)
}

/// ONNX Runtime's times and peak memory per case id (from the reference script).
type Ort<'a> = (&'a BTreeMap<String, std::result::Result<f64, String>>, &'a BTreeMap<String, f64>);

/// Derived rows under the table: fused vs unfused, fused vs the copy of the same bytes, and
/// the compiled models against ONNX Runtime with the peak memory of both.
pub fn summary(ours: &BTreeMap<&str, std::result::Result<f64, String>>, ort: Option<Ort<'_>>) -> String {
    let get = |id: &str| ours.get(id).and_then(|r| r.as_ref().ok()).copied();
    let mut md = String::new();
    let peaks = PEAK.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let fresh = FRESH.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let models = ["resnet18_b1", "resnet18_b8", "resnet50_b1", "resnet50_b8", "mobilenet_v2_b1", "mobilenet_v2_b8"]
        .map(|m| format!("compile_{m}"));
    let rows: Vec<String> = models.iter().cloned().chain(["compile_transformer".to_string()]).collect();
    if rows.iter().any(|id| get(id).is_some()) {
        md.push_str(
            "\nCompiled ferrofx against ONNX Runtime (2 intra-op threads, default optimisations), with the peak \
             memory of both. ferrofx's time and peak memory are those of the case run **alone in a fresh \
             process** (this binary again, the same budget), as a program running one model sees them; the \
             time in this long process, after the group's other cases, is beside it. Peak memory: the growth \
             of the process's peak RSS over compiling the traced model + 3 runs (ferrofx) and over creating \
             the InferenceSession + 3 runs in a fresh Python process (ONNX Runtime). Ratio = ONNX Runtime \
             time / ferrofx's fresh-process time (>= 1: target met).\n\n\
             | case | ferrofx compiled (fresh process) | ferrofx (in this process) | ONNX Runtime | ratio | peak memory ferrofx | peak memory ONNX Runtime |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for id in &rows {
            let Some(f) = get(id) else { continue };
            let (alone, alone_peak) = match fresh.get(id) {
                Some(&(s, p)) => (Some(s), p),
                None => (None, None),
            };
            // the fresh-process figure when the child ran, else this process's
            let t = alone.unwrap_or(f);
            let o = ort.and_then(|(t, _)| t.get(id.as_str()).and_then(|r| r.as_ref().ok()).copied());
            let op = ort.and_then(|(_, p)| p.get(id.as_str()).copied());
            md.push_str(&format!(
                "| {id} | {} | {} | {} | {} | {} | {} |\n",
                alone.map(fmt_ms).unwrap_or_else(|| "– (child did not run)".into()),
                fmt_ms(f),
                o.map(fmt_ms).unwrap_or_else(|| "–".into()),
                o.map(|o| format!("{:.2}×", o / t)).unwrap_or_else(|| "–".into()),
                alone_peak.or_else(|| peaks.get(id).copied()).map(|b| fmt_mb(b as f64)).unwrap_or_else(|| "–".into()),
                op.map(fmt_mb).unwrap_or_else(|| "–".into()),
            ));
        }
    }
    for (name, unfused, fused, copy) in [
        ("relu((x+1)*2)", "compile_add_mul_relu_16m_unfused", "compile_add_mul_relu_16m_fused", "compile_copy_16m"),
        ("relu(x+2*y)", "compile_add_scaled_relu_16m_unfused", "compile_add_scaled_relu_16m_fused", "compile_copy_24m"),
    ] {
        // the bandwidth bound: the faster of the two copies of the same bytes
        let plain = get(&format!("{copy}_plain"));
        let c = match (get(copy), plain) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let (Some(u), Some(f), Some(c)) = (get(unfused), get(fused), c) {
            md.push_str(&format!(
                "\nFusion of {name} on 16M float32: {:.2}x faster than the unfused GraphModule (target >= 3x); \
                 {:.2}x the time of the faster copy of the same bytes (target <= 1.25x).",
                u / f,
                f / c
            ));
            if let Some([f, u, s, p]) = ALTERNATING.lock().unwrap_or_else(|e| e.into_inner()).get(name).copied() {
                md.push_str(&format!(
                    " Sampled in turn (fused, unfused and both copies one call each per round, one \
                     measurement): {:.2}x faster than unfused, {:.2}x the time of the faster copy.",
                    u / f,
                    f / s.min(p)
                ));
            }
            md.push('\n');
        }
    }
    if let (Some(t), Some(c)) = (get("compile_transformer_traced"), get("compile_transformer")) {
        md.push_str(&format!("\nTransformer encoder: compiled {:.2}x the speed of the traced GraphModule.\n", t / c));
    }
    md
}
