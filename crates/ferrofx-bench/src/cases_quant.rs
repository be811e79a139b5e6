//! The `quant` group (issue 20): ResNet-18/50 int8 (static post-training quantization with
//! `ferrofx_quant::prepare`/`convert`, calibrated on random images) at batch 1 and 8, against
//! the same architectures compiled in float by ferrofx (`quant_*_float` cases), and against
//! PyTorch's `quantize_fx` x86 int8 model and onnxruntime's `quantize_static` QDQ model
//! (`scripts/quant/bench_quant.py`, same ids). The top-1 agreement of each int8 model with its
//! float model on 256 random images is measured once per model and printed in the summary.

use crate::cases::{tensor, Case, Runner};
use ferrofx_compile::{compile, CompileOptions};
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::{trace_with_inputs, GraphModule};
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;
use ferrofx_quant::{convert, prepare, QConfigMapping};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Random calibration images (PyTorch's and onnxruntime's references use 16 too).
const CALIBRATION_IMAGES: usize = 16;
/// Random images of the top-1 agreement check.
const AGREEMENT_IMAGES: usize = 256;

/// model → (int8 = float top-1 agreement, images)
static AGREEMENT: Mutex<BTreeMap<String, (usize, usize)>> = Mutex::new(BTreeMap::new());

fn float_model(name: &str) -> Result<GraphModule> {
    let mut m = match name {
        "resnet18" => ResNet::resnet18(1000)?,
        _ => ResNet::resnet50(1000)?,
    };
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
    timed(q, tensor(&[batch, 3, 224, 224], 2)?)
}

fn compiled_float(name: &str, batch: usize) -> Result<Runner> {
    let gm = float_model(name)?;
    let x = tensor(&[batch, 3, 224, 224], 2)?;
    let c = compile(&gm, &[(&x).into()], CompileOptions::default())?;
    let _g = ferrofx_core::autograd::no_grad();
    for _ in 0..2 {
        c.forward(&x)?;
    }
    Ok(Box::new(move || {
        let _g = ferrofx_core::autograd::no_grad();
        let _ = c.forward(&x);
    }))
}

macro_rules! cases {
    ($($int8:ident, $float:ident => $model:literal, $batch:literal;)*) => {
        $(
            fn $int8() -> Result<Runner> { int8($model, $batch) }
            fn $float() -> Result<Runner> { compiled_float($model, $batch) }
        )*
    };
}

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
    let agreement = AGREEMENT.lock().unwrap_or_else(|e| e.into_inner());
    for (model, (same, n)) in agreement.iter() {
        md.push_str(&format!(
            "\n{model} int8 vs float top-1 agreement on {n} random images: {same}/{n} ({:.1}%)\n",
            100.0 * *same as f64 / *n as f64
        ));
    }
    md
}
