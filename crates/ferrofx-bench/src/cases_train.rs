//! The `train` group (issue 21, acceptance 2): training steps of ResNet-18 (batch 32,
//! 3×224×224) and the transformer encoder (batch 32, 128 tokens) with and without activation
//! checkpointing, their step time and peak memory, side by side with PyTorch eager with and
//! without `torch.utils.checkpoint` (`scripts/train/bench_checkpoint.py`, same ids).
//!
//! A step is what a training loop does: grads set to `None`, forward + cross-entropy (under
//! [`Category::Activation`]), `backward`, an SGD step (lr 0.01, no momentum; under
//! [`Category::OptimizerState`]). The models are the zoo's `ResNet::resnet18` and
//! `TransformerClassifier` (d_model 384, 12 heads, ff 1536, 6 post-norm GELU layers, dropout
//! 0), run as a list of segments — ResNet-18: the stem (conv1, bn1, relu, maxpool) and its 8
//! basic blocks; the transformer: its 6 encoder layers between the embedding and the head —
//! so that checkpointing is `checkpoint_sequential(segments, segments.len(), x)`: one
//! checkpoint per residual block / encoder layer, the last one excepted (its activations are
//! needed by backward at once), exactly what the PyTorch script does with
//! `torch.utils.checkpoint.checkpoint_sequential(..., use_reentrant=False)`. The `_budget` cases
//! checkpoint only the segments a [`CheckpointPlan`] picks for memory budget 0.5 (the fewest
//! recomputed FLOPs whose estimated activations fit half the unconstrained estimate: the
//! segments where the memory is), each with its own checkpoint; the PyTorch script is given the
//! same segments (`--plan id=i:j:...`) and wraps each in `torch.utils.checkpoint.checkpoint`.
//!
//! Memory, measured the same way on both sides:
//! * **activation peak**: the most bytes alive at once among the tensor buffers allocated by
//!   the forward pass and by checkpoint's recomputation during backward, over one step —
//!   ferrofx: [`MemoryTracker`]'s [`Category::Activation`] peak; PyTorch: the CPU allocator's
//!   allocation and free events from `torch.profiler` (`profile_memory=True`), matched by
//!   address, counting those made before backward starts or inside a recomputed segment;
//! * **peak RSS growth**: a fresh process (this binary again with `FERROFX_BENCH_TRAIN_RSS=<id>`,
//!   a fresh interpreter for PyTorch) builds the model, input and optimizer, resets the peak
//!   RSS (`/proc/self/clear_refs`), runs two steps and reports `VmHWM` minus the `VmRSS`
//!   before them: gradients, activations, allocator and library workspaces.
//!
//! `FERROFX_BENCH_TRAIN_TRACE=1` prints the live and peak activation bytes as each segment
//! starts and ends, in forward and in checkpoint's recomputation (where the peak comes from).

use crate::cases::{tensor, Case, Runner};
use crate::cases_onnx::rss;
use ferrofx_core::autograd::{checkpoint_sequential, CheckpointPlan, SequentialFn};
use ferrofx_core::memory::tracking::{category_scope, Category, MemoryTracker};
use ferrofx_core::memory::MemoryBudget;
use ferrofx_core::op;
use ferrofx_core::{Error, Result, Tensor};
use ferrofx_nn::functional as F;
use ferrofx_nn::loss::{cross_entropy, CeOpts};
use ferrofx_nn::optim::{Optimizer, Sgd};
use ferrofx_nn::zoo::{ResNet, TransformerClassifier};
use ferrofx_nn::Module;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// Set to a case id, this binary only measures that case's peak RSS growth, prints it as a JSON
/// line and exits (the fresh process of the peak-RSS figure).
const RSS_CHILD: &str = "FERROFX_BENCH_TRAIN_RSS";

/// The batch of every case.
const BATCH: usize = 32;

/// What ferrofx's side measured, per case id.
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    /// [`Category::Activation`] peak of one step, bytes.
    activation: usize,
    /// Peak RSS growth over two steps in a fresh process, bytes (`None`: not measurable here).
    rss: Option<u64>,
}

static MEMORY: Mutex<BTreeMap<String, Memory>> = Mutex::new(BTreeMap::new());

/// The memory budget of the `_budget` cases (a fraction of the unconstrained estimate).
const BUDGET: f64 = 0.5;

/// The plan of each `_budget` case: the checkpointed segments, recomputed FLOPs, estimated
/// bytes with / without it (passed to the PyTorch script, printed in the summary).
static PLANS: Mutex<BTreeMap<String, CheckpointPlan>> = Mutex::new(BTreeMap::new());

/// How a case runs its segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain: nothing recomputed.
    Plain,
    /// `checkpoint_sequential` over every segment (the last excepted).
    Checkpoint,
    /// The segments a [`CheckpointPlan`] at memory budget [`BUDGET`] chose.
    Budget,
}

/// A model as segments between an input transform and a head.
struct Segmented {
    /// Before the segments (the transformer's embedding); `None`: the input itself.
    pre: Option<SequentialFn>,
    /// The residual blocks / encoder layers (ResNet-18: the stem first).
    segments: Vec<SequentialFn>,
    /// From the last segment's output to the logits.
    head: SequentialFn,
    params: Vec<Tensor>,
}

fn resnet18() -> Result<(Segmented, Tensor, Tensor)> {
    let mut m = {
        let _c = category_scope(Category::Parameter);
        ResNet::resnet18(1000)?
    };
    m.train(true);
    let params = m.parameters();
    let m = Arc::new(m);
    let mut segments: Vec<SequentialFn> = Vec::new();
    let r = m.clone();
    // torchvision's stem: conv1, bn1, ReLU(inplace=True), maxpool (batch norm saves its input,
    // so its output can be overwritten, as in PyTorch)
    segments.push(Arc::new(move |x: &Tensor| {
        let h = r.bn1.call(&r.conv1.call(x)?)?;
        op::call("relu_", vec![(&h).into()], vec![])?;
        r.maxpool.call(&h)
    }));
    for stage in 0..4 {
        let n = [&m.layer1, &m.layer2, &m.layer3, &m.layer4][stage].len();
        for block in 0..n {
            let r = m.clone();
            segments.push(Arc::new(move |x: &Tensor| {
                let layer = [&r.layer1, &r.layer2, &r.layer3, &r.layer4][stage];
                let b = layer.get(block).ok_or_else(|| {
                    Error::argument("bench", format!("ResNet-18 layer{} has no block {block}", stage + 1))
                })?;
                b.call(x)
            }));
        }
    }
    let r = m.clone();
    let head: SequentialFn = Arc::new(move |x: &Tensor| r.fc.call(&r.avgpool.call(x)?.flatten(1, -1)?));
    let x = tensor(&[BATCH, 3, 224, 224], 1)?;
    let y = Tensor::from_vec((0..BATCH).map(|i| (i * 37 % 1000) as i64).collect::<Vec<_>>(), &[BATCH])?;
    Ok((Segmented { pre: None, segments, head, params }, x, y))
}

fn transformer() -> Result<(Segmented, Tensor, Tensor)> {
    let mut m = {
        let _c = category_scope(Category::Parameter);
        // all-MiniLM-L6 sized, as the compile group's encoder
        TransformerClassifier::new(1000, 384, 12, 1536, 6, 128, 2, 0.0)?
    };
    m.train(true);
    let params = m.parameters();
    let m = Arc::new(m);
    let r = m.clone();
    let pre: SequentialFn = Arc::new(move |ids: &Tensor| {
        let l = ids.shape().get(1).copied().unwrap_or(0) as i64;
        F::add(&r.embed.call(ids)?, &r.pos.narrow(0, 0, l)?)
    });
    let segments = (0..m.layers.len())
        .map(|i| {
            let r = m.clone();
            Arc::new(move |h: &Tensor| r.layers[i].call(h)) as SequentialFn
        })
        .collect();
    let r = m.clone();
    let head: SequentialFn = Arc::new(move |h: &Tensor| r.head.call(&h.mean_dim(&[1], false)?));
    let ids = (0..BATCH).flat_map(|b| (0..128).map(move |i| ((b * 131 + i * 7) % 1000) as i64)).collect::<Vec<_>>();
    let x = Tensor::from_vec(ids, &[BATCH, 128])?;
    let y = Tensor::from_vec((0..BATCH).map(|i| (i % 2) as i64).collect::<Vec<_>>(), &[BATCH])?;
    Ok((Segmented { pre: Some(pre), segments, head, params }, x, y))
}

/// One training step of `model` on `(x, y)`, its segments run as `mode` says (`id`: the
/// case, under which a `_budget` case's plan is recorded).
type Step = Box<dyn FnMut() -> Result<()>>;

fn step(id: &str, model: &str, mode: Mode) -> Result<Step> {
    let (m, x, y) = match model {
        "resnet18" => resnet18()?,
        "transformer" => transformer()?,
        _ => return Err(Error::argument("bench", format!("unknown model {model}"))),
    };
    let mut opt = Sgd::new(m.params.clone(), 0.01, 0.0, 0.0, 0.0, false)?;
    let plan = match mode {
        Mode::Budget => {
            let h = match &m.pre {
                Some(f) => f(&x)?,
                None => x.clone(),
            };
            let plan = CheckpointPlan::new(&m.segments, &h, MemoryBudget::Fraction(BUDGET))?;
            PLANS.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), plan.clone());
            Some(plan)
        }
        _ => None,
    };
    let ckpt = mode == Mode::Checkpoint;
    let m = if std::env::var_os("FERROFX_BENCH_TRAIN_TRACE").is_some() { traced(m) } else { m };
    Ok(Box::new(move || {
        opt.zero_grad();
        let loss = {
            let _c = category_scope(Category::Activation);
            let mut h = match &m.pre {
                Some(f) => f(&x)?,
                None => x.clone(),
            };
            if let Some(plan) = &plan {
                h = plan.run(&m.segments, &h)?;
            } else if ckpt {
                h = checkpoint_sequential(&m.segments, m.segments.len(), &h)?;
            } else {
                for f in &m.segments {
                    h = f(&h)?;
                }
            }
            cross_entropy(&(m.head)(&h)?, &y, &CeOpts::default())?
        };
        loss.backward(None, false, false)?; // allocates under Category::Gradient
        let _c = category_scope(Category::OptimizerState);
        opt.step()
    }))
}

thread_local! {
    /// The tracker of `FERROFX_BENCH_TRAIN_TRACE`.
    static TRACE: std::cell::RefCell<Option<MemoryTracker>> = const { std::cell::RefCell::new(None) };
}

fn trace_line(what: String) {
    TRACE.with(|t| {
        if let Some(t) = t.borrow().as_ref() {
            let s = t.stats();
            eprintln!(
                "{what}: live activations {:.1} MB, peak {:.1} MB",
                s.live(Category::Activation) as f64 / 1e6,
                s.peak(Category::Activation) as f64 / 1e6
            );
        }
    });
}

/// Wraps every segment to print the activation figures around it.
fn traced(mut m: Segmented) -> Segmented {
    TRACE.with(|t| *t.borrow_mut() = Some(MemoryTracker::start()));
    m.segments = m
        .segments
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            Arc::new(move |x: &Tensor| {
                trace_line(format!("segment {i} enter (grad {})", ferrofx_core::autograd::is_grad_enabled()));
                let y = f(x);
                trace_line(format!("segment {i} exit"));
                y
            }) as SequentialFn
        })
        .collect();
    m
}

/// `train_<model>_b32[_checkpoint|_budget]` -> (model, mode).
fn parse(id: &str) -> (&str, Mode) {
    let model = id.trim_start_matches("train_").split('_').next().unwrap_or("");
    let mode = if id.ends_with("_checkpoint") {
        Mode::Checkpoint
    } else if id.ends_with("_budget") {
        Mode::Budget
    } else {
        Mode::Plain
    };
    (model, mode)
}

/// The peak-RSS child: builds the case, runs two steps from a reset peak, prints the growth.
fn rss_child(id: &str) -> Result<()> {
    let (model, mode) = parse(id);
    let mut s = step(id, model, mode)?;
    let before = rss("VmRSS:").ok_or_else(|| Error::io("bench", "cannot read /proc/self/status"))?;
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| Error::io("bench", format!("/proc/self/clear_refs: {e}")))?;
    s()?;
    s()?;
    let peak = rss("VmHWM:").unwrap_or(0).saturating_sub(before);
    println!("{}", serde_json::json!({"id": id, "rss_peak_bytes": peak}));
    Ok(())
}

/// Runs this binary again as the peak-RSS child of `id`.
fn rss_in_fresh_process(id: &str) -> Option<u64> {
    let exe = std::env::current_exe().ok()?;
    let out = Command::new(exe)
        .args(["--no-reference", "--quick", "--group", "train", "--filter", id])
        .env(RSS_CHILD, id)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("id").and_then(|x| x.as_str()) == Some(id))
        .and_then(|v| v.get("rss_peak_bytes").and_then(|x| x.as_u64()))
}

fn case(id: &'static str) -> Result<Runner> {
    if let Some(child) = std::env::var_os(RSS_CHILD) {
        if child != id {
            return Err(Error::argument("bench", "not this peak-RSS child's case"));
        }
        let code = match rss_child(id) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        };
        std::process::exit(code);
    }
    let rss = rss_in_fresh_process(id);
    let (model, mode) = parse(id);
    let mut s = step(id, model, mode)?;
    s()?; // warm: gradients and the allocator's pages exist
    let activation = {
        let tracker = MemoryTracker::start();
        s()?;
        tracker.stats().peak(Category::Activation)
    };
    MEMORY.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), Memory { activation, rss });
    Ok(Box::new(move || {
        let _ = s();
    }))
}

fn r18() -> Result<Runner> {
    case("train_resnet18_b32")
}
fn r18_ckpt() -> Result<Runner> {
    case("train_resnet18_b32_checkpoint")
}
fn r18_budget() -> Result<Runner> {
    case("train_resnet18_b32_budget")
}
fn tr_budget() -> Result<Runner> {
    case("train_transformer_b32_budget")
}
fn tr() -> Result<Runner> {
    case("train_transformer_b32")
}
fn tr_ckpt() -> Result<Runner> {
    case("train_transformer_b32_checkpoint")
}

/// The cases of the group (ids shared with `scripts/train/bench_checkpoint.py`).
pub fn all() -> Vec<Case> {
    let c = |id, what, setup| Case { id, group: "train", what, work: None, inner: 1, setup };
    vec![
        c("train_resnet18_b32", "ResNet-18 training step (fwd + bwd + SGD), batch 32, 224 px", r18),
        c(
            "train_resnet18_b32_checkpoint",
            "same, checkpoint_sequential per residual block (stem + 8 blocks)",
            r18_ckpt,
        ),
        c(
            "train_resnet18_b32_budget",
            "same, the segments a CheckpointPlan picks for memory budget 0.5 checkpointed (each on its own)",
            r18_budget,
        ),
        c("train_transformer_b32", "transformer encoder training step (384d, 6 layers), batch 32, 128 tokens", tr),
        c("train_transformer_b32_checkpoint", "same, checkpoint_sequential per encoder layer", tr_ckpt),
        c(
            "train_transformer_b32_budget",
            "same, the layers a CheckpointPlan picks for memory budget 0.5 checkpointed (each on its own)",
            tr_budget,
        ),
    ]
}

/// What the PyTorch script measured for one case.
#[derive(Debug, Clone, Copy, Default)]
struct TorchRow {
    seconds: Option<f64>,
    activation: Option<f64>,
    rss: Option<f64>,
}

fn run_torch(
    python: &Path,
    ids: &[&str],
    plans: &BTreeMap<String, CheckpointPlan>,
    quick: bool,
) -> std::result::Result<(String, BTreeMap<String, TorchRow>), String> {
    if !python.exists() {
        return Err(format!("{} not found (run with --setup-reference)", python.display()));
    }
    let mut cmd = Command::new(python);
    cmd.arg("scripts/train/bench_checkpoint.py").arg("--ids").arg(ids.join(","));
    for (id, plan) in plans {
        let segs: Vec<String> = plan.checkpointed_indices().iter().map(|i| i.to_string()).collect();
        cmd.arg("--plan").arg(format!("{id}={}", segs.join(":")));
    }
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!("scripts/train/bench_checkpoint.py failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let mut version = "?".to_string();
    let mut rows = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if let Some(ver) = v.get("torch_version").and_then(|x| x.as_str()) {
            version = ver.to_string();
        }
        let Some(id) = v.get("id").and_then(|x| x.as_str()) else { continue };
        if let Some(e) = v.get("error").and_then(|x| x.as_str()) {
            eprintln!("PyTorch {id}: {e}");
        }
        let f = |k: &str| v.get(k).and_then(|x| x.as_f64());
        rows.insert(
            id.to_string(),
            TorchRow { seconds: f("seconds"), activation: f("activation_peak_bytes"), rss: f("rss_peak_bytes") },
        );
    }
    Ok((version, rows))
}

fn mb(b: Option<f64>) -> String {
    b.map(|b| format!("{:.0} MB", b / 1e6)).unwrap_or_else(|| "–".into())
}

fn secs(s: Option<f64>) -> String {
    s.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "–".into())
}

/// `(checkpointed - plain) / plain` in percent, signed.
fn change(plain: Option<f64>, ckpt: Option<f64>) -> Option<f64> {
    match (plain, ckpt) {
        (Some(p), Some(c)) if p > 0.0 => Some((c - p) / p * 100.0),
        _ => None,
    }
}

fn pct(p: Option<f64>) -> String {
    p.map(|p| format!("{p:+.0}%")).unwrap_or_else(|| "–".into())
}

/// The table of the group: time and memory of both sides, and what checkpointing changes.
/// Runs the PyTorch script on the cases that ran unless `python` is `None` (`--no-reference`).
pub fn summary(ours: &BTreeMap<&str, std::result::Result<f64, String>>, python: Option<&Path>, quick: bool) -> String {
    let ids: Vec<&str> = all().iter().map(|c| c.id).filter(|id| ours.contains_key(id)).collect();
    if ids.is_empty() {
        return String::new();
    }
    let memory = MEMORY.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let plans = PLANS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (torch, header) = match python {
        Some(p) => {
            eprintln!("running the PyTorch training reference (scripts/train/bench_checkpoint.py) ...");
            match run_torch(p, &ids, &plans, quick) {
                Ok((v, rows)) => {
                    (rows, format!("PyTorch {v} eager, 2 threads, torch.utils.checkpoint (use_reentrant=False)"))
                }
                Err(e) => (BTreeMap::new(), format!("PyTorch NOT RUN ({e})")),
            }
        }
        None => (BTreeMap::new(), "PyTorch NOT RUN (--no-reference)".to_string()),
    };
    let ours_s = |id: &str| ours.get(id).and_then(|r| r.as_ref().ok()).copied();
    let ours_act = |id: &str| memory.get(id).map(|m| m.activation as f64);
    let ours_rss = |id: &str| memory.get(id).and_then(|m| m.rss).map(|b| b as f64);
    let t = |id: &str| torch.get(id).copied().unwrap_or_default();
    let mut md = format!(
        "\nTraining steps with and without activation checkpointing (issue 21; reference: {header}). Activation \
         peak: the most bytes alive at once among the buffers allocated by forward and by checkpoint's \
         recomputation, one step (ferrofx: MemoryTracker's activations category; PyTorch: the CPU allocator's \
         events from torch.profiler, matched by address). Peak RSS: growth of VmHWM over two steps in a fresh \
         process. Ratio = PyTorch time / ferrofx time.\n\n\
         | case | ferrofx step | PyTorch step | ratio | activation peak ferrofx | activation peak PyTorch | \
         peak RSS growth ferrofx | peak RSS growth PyTorch |\n|---|---|---|---|---|---|---|---|\n"
    );
    for id in &ids {
        let (o, r) = (ours_s(id), t(id).seconds);
        let ratio = match (o, r) {
            (Some(o), Some(r)) => format!("{:.2}×", r / o),
            _ => "–".into(),
        };
        md.push_str(&format!(
            "| {id} | {} | {} | {ratio} | {} | {} | {} | {} |\n",
            secs(o),
            secs(r),
            mb(ours_act(id)),
            mb(t(id).activation),
            mb(ours_rss(id)),
            mb(t(id).rss),
        ));
    }
    for model in ["resnet18", "transformer"] {
        let plain = format!("train_{model}_b32");
        for (suffix, what) in [("checkpoint", "checkpointing"), ("budget", "memory budget 0.5")] {
            let ckpt = format!("{plain}_{suffix}");
            if !ids.contains(&plain.as_str()) || !ids.contains(&ckpt.as_str()) {
                continue;
            }
            let act = change(ours_act(&plain), ours_act(&ckpt));
            let time = change(ours_s(&plain), ours_s(&ckpt));
            let verdict = match (act, time) {
                (Some(a), Some(t)) if a <= -50.0 && t <= 30.0 => "both targets met",
                (Some(a), Some(_)) if a <= -50.0 => "memory target met, time target missed",
                (Some(_), Some(t)) if t <= 30.0 => "time target met, memory target missed",
                (Some(_), Some(_)) => "both targets missed",
                _ => "not measured",
            };
            let plan = plans.get(&ckpt).map(|p| {
                format!(
                    " The plan checkpoints segments {:?} of {} (recomputing {:.1} GFLOP per step; estimated activations {:.0} MB against {:.0} MB unconstrained, limit {:.0} MB); PyTorch checkpoints the same segments.",
                    p.checkpointed_indices(),
                    p.checkpointed.len(),
                    p.recomputed_flops as f64 / 1e9,
                    p.estimated_bytes as f64 / 1e6,
                    p.unconstrained_bytes as f64 / 1e6,
                    p.limit as f64 / 1e6
                )
            });
            md.push_str(&format!(
                "\n{model} with {what}: ferrofx activation peak {}, peak RSS growth {}, step time {} (targets: \
                 activation peak <= -50%, step time <= +30%: {verdict}); PyTorch activation peak {}, peak RSS growth {}, \
                 step time {}.{}\n",
                pct(act),
                pct(change(ours_rss(&plain), ours_rss(&ckpt))),
                pct(time),
                pct(change(t(&plain).activation, t(&ckpt).activation)),
                pct(change(t(&plain).rss, t(&ckpt).rss)),
                pct(change(t(&plain).seconds, t(&ckpt).seconds)),
                plan.unwrap_or_default(),
            ));
        }
    }
    md
}
