//! Group `train`, compiled training step (issue 21): one SGD training step (forward,
//! cross-entropy, backward, update) of the digits MLP (64 → 64 → 10, batch 32) and of ResNet-18
//! (batch 8, 224 px, train mode), three ways in one run:
//!
//! * ferrofx eager: `model.forward`, `loss.backward()`, SGD;
//! * ferrofx compiled: the joint forward+backward graph ([`capture_joint_with_targets`]),
//!   split by [`default_partition`], each half through [`ferrofx_compile::compile`] (elementwise
//!   fusion, memory plan; no inference passes: BatchNorm stays in training mode), then SGD;
//! * PyTorch eager (`scripts/train/compiled_step_reference.py`, 2 threads).
//!
//! Ratios: PyTorch time / compiled time and ferrofx eager time / compiled time (above 1: the
//! compiled step is faster).

use crate::timer::{median_secs, median_secs_pair, Budget};
use ferrofx_compile::training::{capture_joint_with_targets, default_partition};
use ferrofx_compile::{compile, CompileOptions, CompiledModule};
use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Error, Result, Tensor, Value};
use ferrofx_nn::loss::{cross_entropy, CeOpts};
use ferrofx_nn::optim::{Optimizer, Sgd};
use ferrofx_nn::zoo::{Mlp, ResNet};
use ferrofx_nn::Module;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn labels(n: usize) -> Result<Tensor> {
    Tensor::from_vec((0..n).map(|i| (i % 10) as i64).collect::<Vec<_>>(), &[n])
}

fn ce(out: &[Value], targets: &[Value]) -> Result<Tensor> {
    let (Some(o), Some(y)) = (out[0].as_tensor(), targets[0].as_tensor()) else {
        return Err(Error::argument("train step", "expected logits and labels"));
    };
    cross_entropy(o, y, &CeOpts::default())
}

fn sgd(model: &dyn Module) -> Result<Sgd> {
    Sgd::new(model.parameters(), 0.01, 0.0, 0.0, 0.0, false)
}

/// The eager step of `model` on `(x, y)`.
fn eager_step(model: &dyn Module, x: &Tensor, y: &Tensor, opt: &mut Sgd) -> Result<()> {
    opt.zero_grad();
    let loss = cross_entropy(&model.forward(x)?, y, &CeOpts::default())?;
    loss.backward(None, false, false)?;
    opt.step()
}

/// The compiled step: compiled forward and backward graphs of the default partition.
struct CompiledStep {
    forward: CompiledModule,
    backward: CompiledModule,
    num_forward_outputs: usize,
    params: Vec<Tensor>,
}

impl CompiledStep {
    fn new(model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<CompiledStep> {
        let joint = capture_joint_with_targets(model, &[x.into()], &[y.into()], &ce, &[])?;
        let p = default_partition(&joint)?;
        // FERROFX_TRAIN_STEP_NO_FUSION / _NO_EPILOGUE: turn a compile pass off (to see what it brings)
        let opts = CompileOptions {
            inference_passes: false,
            fuse_elementwise: std::env::var_os("FERROFX_TRAIN_STEP_NO_FUSION").is_none(),
            fuse_conv_epilogue: std::env::var_os("FERROFX_TRAIN_STEP_NO_EPILOGUE").is_none(),
            ..Default::default()
        };
        let inputs: Vec<Value> = vec![x.into(), y.into()];
        let forward = compile(&p.forward, &inputs, opts.clone())?;
        let mut saved = {
            let _g = ferrofx_core::autograd::no_grad();
            forward.forward_values(&inputs)?.split_off(p.num_forward_outputs)
        };
        saved.push(Value::Tensor(Tensor::scalar(1.0f32)));
        let backward = compile(&p.backward, &saved, opts)?;
        let params = model.parameters().into_iter().filter(|t| t.requires_grad()).collect();
        Ok(CompiledStep { forward, backward, num_forward_outputs: p.num_forward_outputs, params })
    }

    fn step(&self, x: &Tensor, y: &Tensor, opt: &mut Sgd) -> Result<()> {
        opt.zero_grad();
        let grads = {
            let _g = ferrofx_core::autograd::no_grad();
            let mut saved = self.forward.forward_values(&[x.into(), y.into()])?.split_off(self.num_forward_outputs);
            saved.push(Value::Tensor(Tensor::scalar(1.0f32)));
            self.backward.forward_values_owned(saved)?
        };
        for (p, g) in self.params.iter().zip(grads) {
            p.set_grad(g.as_tensor().cloned())?;
        }
        opt.step()
    }
}

/// One model's ferrofx figures: (eager seconds, compiled seconds) per step, sampled
/// alternately (an eager step, a compiled step, ...) so that both columns see the same load.
fn time_model(model: &dyn Module, x: &Tensor, y: &Tensor, budget: Budget) -> Result<(f64, f64)> {
    // FERROFX_TRAIN_STEP_ONLY=eager|compiled times one side only (for a profiler); the other
    // column then reads NaN
    let only = std::env::var("FERROFX_TRAIN_STEP_ONLY").unwrap_or_default();
    let mut opt = sgd(model)?;
    if only == "eager" {
        eager_step(model, x, y, &mut opt)?;
        let eager = median_secs(budget, 1, || {
            let _ = eager_step(model, x, y, &mut opt);
        });
        return Ok((eager, f64::NAN));
    }
    let compiled = CompiledStep::new(model, x, y)?;
    if std::env::var_os("FERROFX_TRAIN_STEP_GRAPHS").is_some() {
        for half in [&compiled.forward, &compiled.backward] {
            if let Some(s) = half.latest() {
                eprintln!("{}", s.module.code()?);
            }
        }
    }
    compiled.step(x, y, &mut opt)?;
    if only == "compiled" {
        let fast = median_secs(budget, 1, || {
            let _ = compiled.step(x, y, &mut opt);
        });
        return Ok((f64::NAN, fast));
    }
    eager_step(model, x, y, &mut opt)?;
    // both closures drive the one optimizer: sampled alternately, never at once
    let opt = std::cell::RefCell::new(opt);
    Ok(median_secs_pair(
        budget,
        || {
            let _ = eager_step(model, x, y, &mut opt.borrow_mut());
        },
        || {
            let _ = compiled.step(x, y, &mut opt.borrow_mut());
        },
    ))
}

fn reference(python: &Path, quick: bool, ids: &[&str]) -> std::result::Result<BTreeMap<String, f64>, String> {
    let mut cmd = Command::new(python);
    cmd.arg("scripts/train/compiled_step_reference.py").arg("--ids").arg(ids.join(","));
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!("reference script failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let mut r = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if let (Some(id), Some(s)) = (v.get("id").and_then(|x| x.as_str()), v.get("seconds").and_then(|x| x.as_f64())) {
            r.insert(id.to_string(), s);
        }
    }
    Ok(r)
}

/// The ids of the compiled-step rows.
const IDS: [&str; 2] = ["train_step_mlp", "train_step_resnet18_b8"];

/// Whether `--filter` selects any compiled-step row.
pub fn selected(filter: Option<&str>) -> bool {
    IDS.iter().any(|id| filter.is_none_or(|f| id.contains(f)))
}

/// One row of the report: case id, what it is, (eager, compiled) seconds.
type Row<'a> = (&'a str, &'a str, Result<(f64, f64)>);

/// Runs the compiled-training-step rows and returns their markdown section (printed by
/// `ferrofx-bench` for the group `train`). `python: None`: ferrofx only.
pub fn report(python: Option<&Path>, quick: bool, filter: Option<&str>) -> String {
    let budget = Budget::new(quick);
    let mut rows: Vec<Row> = vec![];
    let ids: Vec<&str> = IDS.iter().copied().filter(|id| filter.is_none_or(|f| id.contains(f))).collect();
    if ids.contains(&IDS[0]) {
        manual_seed(0);
        let mlp = (|| -> Result<(f64, f64)> {
            let m = Mlp::new(64, &[64], 10)?;
            time_model(&m, &randn(&[32, 64], None)?, &labels(32)?, budget)
        })();
        rows.push((IDS[0], "digits MLP 64-64-10, batch 32", mlp));
    }
    if ids.contains(&IDS[1]) {
        manual_seed(0);
        let r18 = (|| -> Result<(f64, f64)> {
            let mut m = ResNet::resnet18(10)?;
            m.train(true);
            time_model(&m, &randn(&[8, 3, 224, 224], None)?, &labels(8)?, budget)
        })();
        rows.push((IDS[1], "ResNet-18, batch 8, 224 px, train mode", r18));
    }
    let reference = match python {
        Some(p) => reference(p, quick, &ids),
        None => Err("--no-reference".to_string()),
    };
    let ms = |s: f64| if s < 1e-3 { format!("{:.1} µs", s * 1e6) } else { format!("{:.2} ms", s * 1e3) };
    let mut md = String::from(
        "\n### train: compiled training step (issue 21)\n\nOne SGD step (forward, cross-entropy, backward, update). Compiled: joint forward+backward graph, default partition, each half through `compile` (fusion, memory plan). Ratios above 1: the compiled step is faster.\n\n| case | ferrofx eager | ferrofx compiled | PyTorch eager | eager / compiled | PyTorch / compiled |\n|---|---|---|---|---|---|\n",
    );
    for (id, what, r) in rows {
        match r {
            Ok((eager, fast)) => {
                let torch = reference.as_ref().ok().and_then(|m| m.get(id).copied());
                md.push_str(&format!(
                    "| {what} | {} | {} | {} | {:.2}x | {} |\n",
                    ms(eager),
                    ms(fast),
                    torch.map(ms).unwrap_or_else(|| "-".into()),
                    eager / fast,
                    torch.map(|t| format!("{:.2}x", t / fast)).unwrap_or_else(|| "-".into())
                ));
            }
            Err(e) => md.push_str(&format!("| {what} | error: {e} | | | | |\n")),
        }
    }
    if let Err(e) = &reference {
        md.push_str(&format!("\nPyTorch reference not run: {e}\n"));
    }
    md
}
