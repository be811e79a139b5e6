//! Group `onnx` (issue 23): importing ResNet-50's `.onnx` file (time; peak memory under the
//! table) and inference of imported models (ResNet-18/50, MobileNetV2, the BERT-style encoder)
//! side by side with ONNX Runtime (2 threads, default graph optimisations) on the **same
//! file** (`scripts/onnx/bench_onnx.py`).
//!
//! The files are the zoo of the ONNX tests: `$FERROFX_ONNX_ZOO/<model>/model.onnx` with its
//! `input_0.pb` (`.venv/bin/python scripts/onnx/export_zoo.py DIR`); without it the cases are
//! skipped with that reason.

use crate::cases::{Case, Runner};
use ferrofx_core::{Error, Result, Value};
use ferrofx_nn::Module;
use ferrofx_onnx::{import, ImportOptions};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

/// What the first import of ResNet-50 measured: (seconds, peak RSS growth in bytes, file bytes).
static IMPORT_MEMORY: Mutex<Option<(f64, u64, u64)>> = Mutex::new(None);

fn zoo(name: &str) -> Result<PathBuf> {
    let root = std::env::var_os("FERROFX_ONNX_ZOO").filter(|d| !d.is_empty()).ok_or_else(|| {
        Error::io("onnx", "FERROFX_ONNX_ZOO is not set (make it with .venv/bin/python scripts/onnx/export_zoo.py DIR)")
    })?;
    let dir = PathBuf::from(root).join(name);
    if !dir.join("model.onnx").exists() {
        return Err(Error::io("onnx", format!("{} has no model.onnx", dir.display())));
    }
    Ok(dir)
}

fn options(dir: &std::path::Path) -> Result<(ImportOptions, ferrofx_core::Tensor)> {
    let x = ferrofx_onnx::tensor_proto::load_tensor(dir.join("input_0.pb"))?;
    let mut opts = ImportOptions::default();
    opts.input_shapes.insert("input".into(), x.shape().to_vec());
    Ok((opts, x))
}

/// `VmRSS` / `VmHWM` of this process in bytes.
pub(crate) fn rss(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.trim_start_matches(field).trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Imports ResNet-50 once with the peak-RSS counter reset (`/proc/self/clear_refs` = 5), and
/// records the time and the growth of the peak over the RSS before.
fn measure_import_memory(dir: &std::path::Path, opts: &ImportOptions) -> Result<()> {
    let before = rss("VmRSS:").unwrap_or(0);
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let t = Instant::now();
    let imported = import(dir.join("model.onnx"), opts)?;
    let secs = t.elapsed().as_secs_f64();
    let peak = if reset { rss("VmHWM:").unwrap_or(0).saturating_sub(before) } else { 0 };
    let file = std::fs::metadata(dir.join("model.onnx")).map(|m| m.len()).unwrap_or(0);
    drop(imported);
    *IMPORT_MEMORY.lock().unwrap_or_else(|e| e.into_inner()) = Some((secs, peak, file));
    Ok(())
}

fn import_resnet50() -> Result<Runner> {
    let dir = zoo("resnet50")?;
    let (opts, _) = options(&dir)?;
    measure_import_memory(&dir, &opts)?;
    Ok(Box::new(move || {
        let _ = import(dir.join("model.onnx"), &opts);
    }))
}

fn infer(name: &str) -> Result<Runner> {
    let dir = zoo(name)?;
    let (opts, x) = options(&dir)?;
    let gm = import(dir.join("model.onnx"), &opts)?.module;
    let inputs = vec![Value::Tensor(x)];
    {
        let _g = ferrofx_core::autograd::no_grad();
        gm.forward_values(&inputs)?;
    }
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = gm.forward_values(&inputs);
    }))
}

fn r18() -> Result<Runner> {
    infer("resnet18")
}
fn r50() -> Result<Runner> {
    infer("resnet50")
}
fn mb2() -> Result<Runner> {
    infer("mobilenet_v2")
}
fn bert() -> Result<Runner> {
    infer("bert")
}

/// The cases of the group (ids shared with `scripts/onnx/bench_onnx.py`).
pub fn all() -> Vec<Case> {
    let c = |id, what, setup| Case { id, group: "onnx", what, work: None, inner: 1, setup };
    vec![
        c("onnx_import_resnet50", "import ResNet-50's .onnx (decode + trace to a GraphModule)", import_resnet50),
        c("onnx_resnet18_b1", "imported ResNet-18 .onnx, batch 1, 224 px", r18),
        c("onnx_resnet50_b1", "imported ResNet-50 .onnx, batch 1, 224 px", r50),
        c("onnx_mobilenet_v2_b1", "imported MobileNetV2 .onnx, batch 1, 224 px", mb2),
        c("onnx_bert", "imported BERT-style encoder .onnx (the zoo's input)", bert),
    ]
}

/// The line under the table: import time and peak memory of ResNet-50.
pub fn summary() -> String {
    match *IMPORT_MEMORY.lock().unwrap_or_else(|e| e.into_inner()) {
        Some((secs, peak, file)) => format!(
            "\nONNX import of ResNet-50 ({:.1} MB file): first import {:.2} s, peak RSS growth during it {:.1} MB \
             (the decoded protobuf, its tensors and the traced GraphModule).\n",
            file as f64 / 1e6,
            secs,
            peak as f64 / 1e6
        ),
        None => String::new(),
    }
}
