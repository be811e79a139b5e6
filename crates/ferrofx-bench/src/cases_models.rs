//! Model-level cases: autograd overhead, whole-model inference and training (ResNet), tracing
//! and recompiling (torch.fx), and saving/loading a traced ResNet-50 (`torch.save`/`torch.load`).
//! Ids are shared with `scripts/bench_reference.py`.

use crate::cases::{tensor, Case, Runner};
use ferrofx_core::op;
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::{symbolic_trace, GraphModule};
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;

fn call1(name: &str, args: Vec<Value>) -> Result<Tensor> {
    op::call(name, args, vec![])?.pop().ok_or_else(|| ferrofx_core::Error::argument(name, "the op returned no tensor"))
}

/// `x * w` forward and backward on 1-element tensors that require grad.
fn mul_tiny_fwd_bwd() -> Result<Runner> {
    let x = Tensor::from_vec(vec![1.0f32], &[1])?.requires_grad_(true)?;
    let w = Tensor::from_vec(vec![0.5f32], &[1])?.requires_grad_(true)?;
    Ok(Box::new(move || {
        if let Ok(y) = call1("mul", vec![Value::from(&x), Value::from(&w)]) {
            let _ = y.backward(None, false, false);
        }
    }))
}

/// 64-64-10 MLP, batch 32: linear, relu, linear, log_softmax, NLL, backward, SGD update.
fn mlp_step() -> Result<Runner> {
    let p = |shape: &[usize], seed: u64| -> Result<Tensor> {
        let t = call1("mul", vec![Value::from(&tensor(shape, seed)?), Value::Float(0.1)])?;
        t.requires_grad_(true)
    };
    let (w1, b1, w2, b2) = (p(&[64, 64], 1)?, p(&[64], 2)?, p(&[10, 64], 3)?, p(&[10], 4)?);
    let x = tensor(&[32, 64], 5)?;
    let target = Tensor::from_vec((0..32).map(|i| (i % 10) as i64).collect::<Vec<_>>(), &[32, 1])?;
    let step = move || -> Result<()> {
        let h = call1("linear", vec![Value::from(&x), Value::from(&w1), Value::from(&b1)])?;
        let h = call1("relu", vec![Value::from(&h)])?;
        let o = call1("linear", vec![Value::from(&h), Value::from(&w2), Value::from(&b2)])?;
        let lp = call1("log_softmax", vec![Value::from(&o), Value::Int(1)])?;
        let picked = call1("gather", vec![Value::from(&lp), Value::Int(1), Value::from(&target)])?;
        let loss = call1("neg", vec![Value::from(&call1("mean", vec![Value::from(&picked)])?)])?;
        loss.backward(None, false, false)?;
        let _ng = ferrofx_core::autograd::no_grad();
        for q in [&w1, &b1, &w2, &b2] {
            if let Some(g) = q.grad() {
                op::call("sub_", vec![Value::from(q), Value::from(&g)], vec![("alpha".into(), Value::Float(0.01))])?;
            }
            q.set_grad(None)?;
        }
        Ok(())
    };
    step()?;
    Ok(Box::new(move || {
        let _ = step();
    }))
}

fn resnet(fifty: bool) -> Result<ResNet> {
    if fifty {
        ResNet::resnet50(1000)
    } else {
        ResNet::resnet18(1000)
    }
}

fn infer(fifty: bool) -> Result<Runner> {
    let mut m = resnet(fifty)?;
    m.eval();
    let x = tensor(&[1, 3, 224, 224], 1)?;
    let run = move || -> Result<()> {
        let _g = ferrofx_core::autograd::no_grad();
        m.forward(&x).map(|_| ())
    };
    run()?;
    Ok(Box::new(move || {
        let _ = run();
    }))
}

fn resnet18_infer_b1() -> Result<Runner> {
    infer(false)
}

fn resnet50_infer_b1() -> Result<Runner> {
    infer(true)
}

/// ResNet-18 in training mode, batch 8 at 224 px: forward, `sum()` of the logits, backward.
fn resnet18_train_b8() -> Result<Runner> {
    let m = resnet(false)?;
    let x = tensor(&[8, 3, 224, 224], 1)?;
    let params = m.parameters();
    let run = move || -> Result<()> {
        let loss = m.forward(&x)?.sum()?;
        loss.backward(None, false, false)?;
        for p in &params {
            p.set_grad(None)?;
        }
        Ok(())
    };
    run()?;
    Ok(Box::new(move || {
        let _ = run();
    }))
}

/// ResNet-18 traced into a GraphModule, inference batch 1 at 224 px (vs the eager model in the
/// reference: a GraphModule should cost what the eager model costs).
fn resnet18_graph_module_b1() -> Result<Runner> {
    let mut m = resnet(false)?;
    m.eval();
    let gm = symbolic_trace(&m)?;
    let x = tensor(&[1, 3, 224, 224], 1)?;
    let run = move || -> Result<()> {
        let _g = ferrofx_core::autograd::no_grad();
        gm.forward(&x).map(|_| ())
    };
    run()?;
    Ok(Box::new(move || {
        let _ = run();
    }))
}

/// ResNet-50 traced, every BatchNorm folded into its conv (`fuse_conv_bn`), inference batch 1.
/// The reference is FX's own `fuse` on torchvision's model; the drop against the unfolded
/// model is `resnet50_infer_b1 / fx_resnet50_folded_b1`, printed under the table.
fn resnet50_folded_b1() -> Result<Runner> {
    let mut m = resnet(true)?;
    m.eval();
    let mut gm = symbolic_trace(&m)?;
    let folded = ferrofx_fx::passes::fuse::fuse_conv_bn(&mut gm)?;
    if folded != 53 {
        return Err(ferrofx_core::Error::argument("fuse_conv_bn", format!("folded {folded} BatchNorms, expected 53")));
    }
    gm.recompile()?;
    let x = tensor(&[1, 3, 224, 224], 1)?;
    let run = move || -> Result<()> {
        let _g = ferrofx_core::autograd::no_grad();
        gm.forward(&x).map(|_| ())
    };
    run()?;
    Ok(Box::new(move || {
        let _ = run();
    }))
}

fn trace(fifty: bool) -> Result<Runner> {
    let m = resnet(fifty)?;
    symbolic_trace(&m)?;
    Ok(Box::new(move || {
        let _ = symbolic_trace(&m);
    }))
}

fn trace_resnet18() -> Result<Runner> {
    trace(false)
}

fn trace_resnet50() -> Result<Runner> {
    trace(true)
}

fn recompile(fifty: bool) -> Result<Runner> {
    let gm = symbolic_trace(&resnet(fifty)?)?;
    Ok(Box::new(move || {
        let _ = gm.recompile();
    }))
}

fn recompile_resnet18() -> Result<Runner> {
    recompile(false)
}

fn recompile_resnet50() -> Result<Runner> {
    recompile(true)
}

/// A file in the temporary directory, removed when dropped (with the runner that owns it).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn traced_resnet50_file(tag: &str) -> Result<(GraphModule, TempFile)> {
    let mut m = resnet(true)?;
    m.eval();
    let gm = symbolic_trace(&m)?;
    let file = TempFile(std::env::temp_dir().join(format!("ferrofx_bench_{tag}_{}.fxm", std::process::id())));
    gm.save(&file.0)?;
    Ok((gm, file))
}

fn save_resnet50() -> Result<Runner> {
    let (gm, file) = traced_resnet50_file("save")?;
    Ok(Box::new(move || {
        let _ = gm.save(&file.0);
    }))
}

fn load_resnet50() -> Result<Runner> {
    let (_, file) = traced_resnet50_file("load")?;
    GraphModule::load(&file.0)?;
    Ok(Box::new(move || {
        let _ = GraphModule::load(&file.0);
    }))
}

/// ResNet-18's multiply-accumulates at 224 px, batch 1 (torchvision's count).
const R18_MACS: f64 = 1.814e9;
/// ResNet-50's multiply-accumulates at 224 px, batch 1.
const R50_MACS: f64 = 4.089e9;
/// Bytes of ResNet-50's traced-module file (weights and buffers, f32).
const R50_FILE_BYTES: f64 = 102.6e6;

/// The model-level cases.
pub fn all() -> Vec<Case> {
    vec![
        Case {
            id: "autograd_mul_tiny",
            group: "autograd",
            what: "mul forward + backward, 1-element tensors (per-op autograd overhead)",
            work: None,
            inner: 2_000,
            setup: mul_tiny_fwd_bwd,
        },
        Case {
            id: "autograd_mlp_step",
            group: "autograd",
            what: "MLP 64-64-10 training step, batch 32 (fwd + bwd + SGD)",
            work: None,
            inner: 50,
            setup: mlp_step,
        },
        Case {
            id: "resnet18_infer_b1",
            group: "nn",
            what: "ResNet-18 inference, batch 1, 224 px",
            work: Some((2.0 * R18_MACS, "GFLOP/s")),
            inner: 1,
            setup: resnet18_infer_b1,
        },
        Case {
            id: "resnet50_infer_b1",
            group: "nn",
            what: "ResNet-50 inference, batch 1, 224 px",
            work: Some((2.0 * R50_MACS, "GFLOP/s")),
            inner: 1,
            setup: resnet50_infer_b1,
        },
        Case {
            id: "resnet18_train_b8",
            group: "nn",
            what: "ResNet-18 forward + backward, batch 8, 224 px, train mode",
            work: Some((3.0 * 2.0 * 8.0 * R18_MACS, "GFLOP/s")),
            inner: 1,
            setup: resnet18_train_b8,
        },
        Case {
            id: "fx_graph_module_resnet18_b1",
            group: "fx",
            what: "traced ResNet-18 GraphModule inference, batch 1 (reference: the eager torchvision model)",
            work: Some((2.0 * R18_MACS, "GFLOP/s")),
            inner: 1,
            setup: resnet18_graph_module_b1,
        },
        Case {
            id: "fx_resnet50_folded_b1",
            group: "fx",
            what:
                "ResNet-50 with its 53 BatchNorms folded into the convs, inference batch 1 (reference: torch.fx fuse)",
            work: Some((2.0 * R50_MACS, "GFLOP/s")),
            inner: 1,
            setup: resnet50_folded_b1,
        },
        Case {
            id: "fx_symbolic_trace_resnet18",
            group: "fx",
            what: "symbolic_trace of ResNet-18 (reference: torch.fx)",
            work: None,
            inner: 1,
            setup: trace_resnet18,
        },
        Case {
            id: "fx_symbolic_trace_resnet50",
            group: "fx",
            what: "symbolic_trace of ResNet-50 (reference: torch.fx)",
            work: None,
            inner: 1,
            setup: trace_resnet50,
        },
        Case {
            id: "fx_recompile_resnet18",
            group: "fx",
            what: "recompile of traced ResNet-18 (reference: torch.fx GraphModule.recompile)",
            work: None,
            inner: 1,
            setup: recompile_resnet18,
        },
        Case {
            id: "fx_recompile_resnet50",
            group: "fx",
            what: "recompile of traced ResNet-50 (reference: torch.fx GraphModule.recompile)",
            work: None,
            inner: 1,
            setup: recompile_resnet50,
        },
        Case {
            id: "save_resnet50",
            group: "format",
            what: "save traced ResNet-50 (102.6 MB; reference: torch.save of its state dict)",
            work: Some((R50_FILE_BYTES, "GB/s")),
            inner: 1,
            setup: save_resnet50,
        },
        Case {
            id: "load_resnet50",
            group: "format",
            what: "load traced ResNet-50, validated and compiled (reference: torch.load of its state dict)",
            work: Some((R50_FILE_BYTES, "GB/s")),
            inner: 1,
            setup: load_resnet50,
        },
    ]
}
