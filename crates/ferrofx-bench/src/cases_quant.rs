//! The `quant` group (issue 20): ResNet-18/50 int8 (static post-training quantization with
//! `ferrofx_quant::prepare`/`convert`, calibrated on random images) at batch 1 and 8, against
//! the same architectures compiled in float by ferrofx (`quant_*_float` cases), and against
//! PyTorch's `quantize_fx` x86 int8 model and onnxruntime's `quantize_static` QDQ model
//! (`scripts/quant/bench_quant.py`, same ids). The top-1 agreement of each int8 model with its
//! float model on 256 random images is measured once per model and printed in the summary.
//!
//! Same weights and inputs on every side: ferrofx's float models write their (randomly
//! initialised) state dicts to `target/bench-quant/<arch>.safetensors`, which
//! `bench_quant.py` loads into torchvision's ResNet (the keys are torchvision's), and the
//! calibration and agreement images are `cases::data` (an LCG the script reproduces), so
//! PyTorch's agreement (written to `target/bench-quant/torch_agreement.json`) is printed
//! beside ours.
//!
//! Dynamic quantization (`quant_transformer_*`): the transformer encoder of the `compile`
//! group (batch 1 x 128 tokens, 384d, 6 layers) in float and after
//! `ferrofx_quant::quantize_dynamic(gm, ["Linear"], int8)`, both compiled; reference: the
//! PyTorch twin in float and after `torch.ao.quantization.quantize_dynamic` (per-channel int8
//! weights). `quant_transformer_dynamic_attn` also quantizes the attention projections
//! (`quantize_dynamic(gm, ["Linear", "MultiheadAttention"], int8)`; PyTorch keeps them float, so
//! its reference is the same PyTorch model). The summary says which layers are int8 and each int8
//! model's output agreement with float (max abs diff, cosine).

use crate::cases::{tensor, Case, Runner};
use ferrofx_compile::{compile, CompileOptions};
use ferrofx_core::DType;
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::{trace_with_inputs, GraphModule};
use ferrofx_nn::zoo::{ResNet, TransformerClassifier};
use ferrofx_nn::{save_state_dict, Module};
use ferrofx_quant::{convert, prepare, quantize_dynamic, QConfigMapping};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Random calibration images (PyTorch's and onnxruntime's references use 16 too).
const CALIBRATION_IMAGES: usize = 16;
/// Random images of the top-1 agreement check.
const AGREEMENT_IMAGES: usize = 256;

/// model → (int8 = float top-1 agreement, images)
static AGREEMENT: Mutex<BTreeMap<String, (usize, usize)>> = Mutex::new(BTreeMap::new());
/// dynamic case → (max abs diff, cosine) of its int8 output against float
static DYNAMIC_AGREEMENT: Mutex<BTreeMap<&str, (f32, f32)>> = Mutex::new(BTreeMap::new());

/// Where the float weights are shared with the reference script (relative to the repo root,
/// where the bench runs).
const WEIGHTS_DIR: &str = "target/bench-quant";

/// The float ResNet, its weights written once per process for the reference to load.
fn float_model(name: &str) -> Result<GraphModule> {
    static MODELS: Mutex<BTreeMap<String, ferrofx_nn::StateDict>> = Mutex::new(BTreeMap::new());
    // the weights depend on the model only, not on which cases ran before (`--filter`)
    ferrofx_core::ops::random::manual_seed(if name == "resnet18" { 18 } else { 50 });
    let mut m = match name {
        "resnet18" => ResNet::resnet18(1000)?,
        _ => ResNet::resnet50(1000)?,
    };
    let mut models = MODELS.lock().unwrap_or_else(|e| e.into_inner());
    match models.get(name) {
        Some(sd) => {
            m.load_state_dict(sd, true)?;
        }
        None => {
            let sd = m.state_dict();
            std::fs::create_dir_all(WEIGHTS_DIR).map_err(|e| ferrofx_core::Error::io("bench quant", e.to_string()))?;
            save_state_dict(&sd, format!("{WEIGHTS_DIR}/{name}.safetensors"))?;
            models.insert(name.to_string(), sd);
        }
    }
    drop(models);
    m.eval();
    let x = tensor(&[1, 3, 224, 224], 1)?;
    trace_with_inputs(&m, &[(&x).into()])
}

fn int8_model(name: &str, gm: &GraphModule) -> Result<GraphModule> {
    let _g = ferrofx_core::autograd::no_grad();
    let calib = tensor(&[CALIBRATION_IMAGES, 3, 224, 224], 7)?;
    let prepared = prepare(gm, &QConfigMapping::default_x86(), &[Value::from(&calib.narrow(0, 0, 1)?)])?;
    for i in (0..CALIBRATION_IMAGES).step_by(8) {
        prepared.forward(&calib.narrow(0, i as i64, 8)?)?;
    }
    let q = convert(&prepared)?;
    let mut agreement = AGREEMENT.lock().unwrap_or_else(|e| e.into_inner());
    if !agreement.contains_key(name) {
        let (mut same, batch) = (0, 8);
        for i in 0..AGREEMENT_IMAGES / batch {
            let x = tensor(&[batch, 3, 224, 224], 1000 + i as u64)?;
            let a = gm.forward(&x)?.argmax(Some(1), false)?.to_vec::<i64>()?;
            let b = q.forward(&x)?.argmax(Some(1), false)?.to_vec::<i64>()?;
            same += a.iter().zip(&b).filter(|(x, y)| x == y).count();
        }
        agreement.insert(name.to_string(), (same, AGREEMENT_IMAGES));
    }
    Ok(q)
}

fn timed(m: impl Module + 'static, x: Tensor) -> Result<Runner> {
    let _g = ferrofx_core::autograd::no_grad();
    for _ in 0..2 {
        m.forward(&x)?;
    }
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = m.forward(&x);
    }))
}

fn int8(name: &str, batch: usize) -> Result<Runner> {
    let gm = float_model(name)?;
    let q = int8_model(name, &gm)?;
    let x = tensor(&[batch, 3, 224, 224], 2)?;
    if std::env::var("FERROFX_QUANT_PROFILE").is_ok() {
        eprintln!("\n{}", profile_by_kind(&q, &x, &format!("{name} int8 batch {batch}"))?);
    }
    timed(q, x)
}

/// The op kind of an int8 graph's node, as the rows of the side-by-side profile (the names
/// `scripts/quant/profile_quant.py` maps PyTorch's ops to).
fn op_kind(target: &str) -> &str {
    match target {
        "quantized_conv2d" => "conv",
        "quantized_add" => "add",
        "quantized_conv2d_add" => "conv+add",
        "quantize_per_tensor" => "quantize",
        "dequantize" => "dequantize",
        "max_pool2d" | "MaxPool2d" => "max_pool",
        "quantized_adaptive_avg_pool2d" => "avg_pool",
        "quantized_linear" => "linear",
        "flatten" | "reshape" | "view" => "flatten/reshape",
        "get_attr" => "get_attr",
        other => other,
    }
}

/// `FERROFX_QUANT_PROFILE=1`: the int8 model's time per op kind (the Interpreter's per-node
/// profile, best of 5 runs per node, summed by kind; with `N > 1`, also the `N` slowest nodes), for the table beside PyTorch's
/// (`scripts/quant/profile_quant.py`) in docs/benchmarks.md.
fn profile_by_kind(q: &GraphModule, x: &Tensor, what: &str) -> Result<String> {
    let p = ferrofx_fx::passes::analysis::profile(q, &[x.into()], 5)?;
    let targets: BTreeMap<String, String> = q
        .graph()
        .iter()
        .map(|n| {
            let t = if n.op().as_str() == "get_attr" { "get_attr".to_string() } else { n.target().name().to_string() };
            (n.name().to_string(), t)
        })
        .collect();
    let mut kinds: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for n in &p.nodes {
        let kind = op_kind(targets.get(&n.name).map_or("?", |s| s.as_str())).to_string();
        let e = kinds.entry(kind).or_default();
        e.0 += n.time.as_secs_f64() * 1e3;
        e.1 += 1;
    }
    let total: f64 = kinds.values().map(|v| v.0).sum();
    let mut rows: Vec<_> = kinds.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    let mut s = format!("ferrofx {what}: time per op kind (sum of the nodes' best of 5, ms)\n| kind | nodes | ms | share |\n|---|---|---|---|\n");
    for (k, (t, n)) in rows {
        s.push_str(&format!("| {k} | {n} | {t:.3} | {:.1}% |\n", 100.0 * t / total.max(1e-12)));
    }
    s.push_str(&format!("| total | | {total:.3} | |\n"));
    // FERROFX_QUANT_PROFILE=N (N > 1): also the N slowest nodes
    if let Some(top) =
        std::env::var("FERROFX_QUANT_PROFILE").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&n| n > 1)
    {
        s.push_str(&format!("\n{}", p.table(top)));
    }
    Ok(s)
}

fn compiled_float(name: &str, batch: usize) -> Result<Runner> {
    let gm = float_model(name)?;
    compiled(&gm, tensor(&[batch, 3, 224, 224], 2)?)
}

macro_rules! cases {
    ($($int8:ident, $float:ident => $model:literal, $batch:literal;)*) => {
        $(
            fn $int8() -> Result<Runner> { int8($model, $batch) }
            fn $float() -> Result<Runner> { compiled_float($model, $batch) }
        )*
    };
}

/// The transformer encoder of the `compile` group and its input ids.
fn transformer() -> Result<(GraphModule, Tensor)> {
    // all-MiniLM-L6 sized: d_model 384, 12 heads, ff 1536, 6 layers, 128 tokens
    let mut m = TransformerClassifier::new(1000, 384, 12, 1536, 6, 128, 2, 0.0)?;
    m.eval();
    let ids = Tensor::from_vec((0..128).map(|i| (i * 7 % 1000) as i64).collect::<Vec<_>>(), &[1, 128])?;
    Ok((trace_with_inputs(&m, &[(&ids).into()])?, ids))
}

fn compiled(gm: &GraphModule, x: Tensor) -> Result<Runner> {
    let c = compile(gm, &[(&x).into()], CompileOptions::default())?;
    let _g = ferrofx_core::autograd::no_grad();
    for _ in 0..2 {
        c.forward(&x)?;
    }
    // FERROFX_COMPILE_PROFILE=N: the N slowest nodes of the compiled graph (best of 5 runs)
    if let (Some(s), Some(top)) =
        (c.latest(), std::env::var("FERROFX_COMPILE_PROFILE").ok().and_then(|v| v.parse::<usize>().ok()))
    {
        let p = ferrofx_fx::passes::analysis::profile(&s.module, &[(&x).into()], 5)?;
        eprintln!("\nper-node profile of the compiled model:\n{}", p.table(top));
    }
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = c.forward(&x);
    }))
}

fn transformer_float() -> Result<Runner> {
    let (gm, ids) = transformer()?;
    compiled(&gm, ids)
}

/// The int8 layer sets of the dynamic cases: case id, `quantize_dynamic` types, what is int8.
const DYNAMIC_CASES: &[(&str, &[&str], &str)] = &[
    (
        "quant_transformer_dynamic",
        &["Linear"],
        "the Linear layers (feed-forward, head); attention projections float, as PyTorch",
    ),
    (
        "quant_transformer_dynamic_attn",
        &["Linear", "MultiheadAttention"],
        "the Linear layers and the attention projections (q, k, v, out_proj)",
    ),
];

fn transformer_dynamic_case(index: usize) -> Result<Runner> {
    let (id, types, _) = DYNAMIC_CASES[index];
    let (gm, ids) = transformer()?;
    let q = quantize_dynamic(&gm, types, DType::I8)?;
    {
        let _g = ferrofx_core::autograd::no_grad();
        let a = gm.forward(&ids)?.to_vec::<f32>()?;
        let b = q.forward(&ids)?.to_vec::<f32>()?;
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let dot: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        DYNAMIC_AGREEMENT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (diff, (dot / (norm(&a) * norm(&b))) as f32));
    }
    // the compiled plan runs registry ops generically; if it refuses the graph, time the
    // GraphModule and say so in the summary
    match compiled(&q, ids.clone()) {
        Ok(r) => Ok(r),
        Err(e) => {
            DYNAMIC_UNCOMPILED.lock().unwrap_or_else(|e| e.into_inner()).insert(id, e.to_string());
            timed(q, ids)
        }
    }
}

fn transformer_dynamic() -> Result<Runner> {
    if std::env::var("FERROFX_QUANT_CPU_TIMES").is_ok() {
        cpu_times()?;
    }
    transformer_dynamic_case(0)
}

/// This thread's time on a CPU (ns), from `/proc/thread-self/schedstat` (Linux; 0 elsewhere).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// `FERROFX_QUANT_CPU_TIMES=1` (diagnostic for a loaded machine): the compiled float and
/// dynamic int8 transformers timed alternately (7 rounds of 10 forwards each, best round), by
/// the calling thread's on-CPU time (the per-core comparison with `RAYON_NUM_THREADS=1`: other
/// processes' load does not enter it) and by wall time.
fn cpu_times() -> Result<()> {
    let (gm, ids) = transformer()?;
    let _g = ferrofx_core::autograd::no_grad();
    let mut models = vec![("float", compile(&gm, &[(&ids).into()], CompileOptions::default())?)];
    for (id, types, _) in DYNAMIC_CASES {
        let q = quantize_dynamic(&gm, types, DType::I8)?;
        models.push((id, compile(&q, &[(&ids).into()], CompileOptions::default())?));
    }
    let (mut best, mut wall) = (vec![f64::MAX; models.len()], vec![f64::MAX; models.len()]);
    for _ in 0..7 {
        for (((_, c), b), w) in models.iter().zip(best.iter_mut()).zip(wall.iter_mut()) {
            c.forward(&ids)?;
            let (t0, w0) = (thread_cpu_ns(), std::time::Instant::now());
            for _ in 0..10 {
                c.forward(&ids)?;
            }
            *w = w.min(w0.elapsed().as_secs_f64() / 10.0 * 1e3);
            *b = b.min((thread_cpu_ns() - t0) as f64 / 10.0 / 1e6);
        }
    }
    let line = |v: &[f64]| {
        models
            .iter()
            .zip(v)
            .map(|((id, _), t)| format!("{id} {t:.2} ms ({:.2}x float)", v[0] / t))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let threads = rayon::current_num_threads();
    eprintln!("\n[calling thread's on-CPU time per forward, {threads} rayon thread(s): {}]", line(&best));
    eprintln!("[wall time per forward (best of 7 alternating rounds), {threads} rayon thread(s): {}]", line(&wall));
    Ok(())
}

fn transformer_dynamic_attn() -> Result<Runner> {
    transformer_dynamic_case(1)
}

/// Why a dynamic int8 transformer could not be compiled (then it runs as a GraphModule).
static DYNAMIC_UNCOMPILED: Mutex<BTreeMap<&str, String>> = Mutex::new(BTreeMap::new());

cases! {
    r18_b1, r18_b1_float => "resnet18", 1;
    r18_b8, r18_b8_float => "resnet18", 8;
    r50_b1, r50_b1_float => "resnet50", 1;
    r50_b8, r50_b8_float => "resnet50", 8;
}

/// The cases of the group.
pub fn all() -> Vec<Case> {
    let c = |id, what, setup| Case { id, group: "quant", what, work: None, inner: 1, setup };
    vec![
        c("quant_r18_b1", "ResNet-18 int8 (static PTQ), batch 1; reference: PyTorch quantize_fx x86", r18_b1),
        c("quant_r18_b1_float", "ResNet-18 float, compiled, batch 1", r18_b1_float),
        c("quant_r18_b8", "ResNet-18 int8 (static PTQ), batch 8; reference: PyTorch quantize_fx x86", r18_b8),
        c("quant_r18_b8_float", "ResNet-18 float, compiled, batch 8", r18_b8_float),
        c("quant_r50_b1", "ResNet-50 int8 (static PTQ), batch 1; reference: PyTorch quantize_fx x86", r50_b1),
        c("quant_r50_b1_float", "ResNet-50 float, compiled, batch 1", r50_b1_float),
        c("quant_r50_b8", "ResNet-50 int8 (static PTQ), batch 8; reference: PyTorch quantize_fx x86", r50_b8),
        c("quant_r50_b8_float", "ResNet-50 float, compiled, batch 8", r50_b8_float),
        c(
            "quant_transformer_float",
            "transformer encoder (384d, 6 layers, 128 tokens) float, compiled",
            transformer_float,
        ),
        c(
            "quant_transformer_dynamic",
            "transformer encoder, dynamic int8 Linear (quantize_dynamic), compiled; reference: torch quantize_dynamic",
            transformer_dynamic,
        ),
        c(
            "quant_transformer_dynamic_attn",
            "transformer encoder, dynamic int8 Linear + attention projections, compiled; reference: torch quantize_dynamic (Linear only: PyTorch keeps attention float)",
            transformer_dynamic_attn,
        ),
    ]
}

/// int8 against compiled float ferrofx (target ≥ 2×), and the top-1 agreement lines.
pub fn summary(ours: &BTreeMap<&str, std::result::Result<f64, String>>) -> String {
    let mut md = String::new();
    for (model, short) in [("ResNet-18", "r18"), ("ResNet-50", "r50")] {
        for b in [1, 8] {
            let (q, f) = (format!("quant_{short}_b{b}"), format!("quant_{short}_b{b}_float"));
            if let (Some(Ok(q)), Some(Ok(f))) = (ours.get(q.as_str()), ours.get(f.as_str())) {
                if md.is_empty() {
                    md.push_str("\nint8 (static PTQ) vs compiled float ferrofx (target >= 2x):\n\n| model | batch | float compiled | int8 | speed-up |\n|---|---|---|---|---|\n");
                }
                md.push_str(&format!(
                    "| {model} | {b} | {:.2} ms | {:.2} ms | {:.2}x{} |\n",
                    f * 1e3,
                    q * 1e3,
                    f / q,
                    if f / q >= 2.0 { "" } else { " (target missed)" }
                ));
            }
        }
    }
    // PyTorch's quantize_fx agreement on the same weights and images (bench_quant.py)
    let torch: BTreeMap<String, (usize, usize)> =
        std::fs::read_to_string(format!("{WEIGHTS_DIR}/torch_agreement.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
    let agreement = AGREEMENT.lock().unwrap_or_else(|e| e.into_inner());
    for (model, (same, n)) in agreement.iter() {
        md.push_str(&format!(
            "\n{model} int8 vs float top-1 agreement on {n} random images: {same}/{n} ({:.1}%)",
            100.0 * *same as f64 / *n as f64
        ));
        match torch.get(model) {
            Some((s, n)) => md.push_str(&format!(
                "; PyTorch quantize_fx on the same weights and images: {s}/{n} ({:.1}%)\n",
                100.0 * *s as f64 / *n as f64
            )),
            None => md.push_str("; PyTorch's: not run\n"),
        }
    }
    for (id, _, int8_layers) in DYNAMIC_CASES {
        let (Some(Ok(q)), Some(Ok(f))) = (ours.get(id), ours.get("quant_transformer_float")) else {
            continue;
        };
        md.push_str(&format!(
            "\ntransformer encoder, dynamic int8 ({int8_layers}) vs float, both compiled: {:.2} ms vs {:.2} ms, speed-up {:.2}x (target >= 1.5x{})",
            q * 1e3,
            f * 1e3,
            f / q,
            if f / q >= 1.5 { "" } else { ", missed" }
        ));
        if let Some((d, c)) = DYNAMIC_AGREEMENT.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            md.push_str(&format!("; output vs float: max abs diff {d:.4}, cosine {c:.6}"));
        }
        if let Some(e) = DYNAMIC_UNCOMPILED.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            md.push_str(&format!(" (the int8 model ran uncompiled: {e})"));
        }
        md.push('\n');
    }
    md
}
