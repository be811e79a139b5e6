//! Autograd overhead benchmark: forward + backward per op on 1-element tensors, and (once the
//! elementwise/linear families are registered) a 64-64-10 MLP training step.
//!
//! Run: `cargo run --release -p ferrofx-core --example bench_autograd [-- --chain]`
//! (`--chain` also times a 1,000,000-op chain forward and backward).
//! PyTorch side: `scripts/bench/autograd_torch.py`.
//! PyTorch reference (same machine): 7.5 µs per op, 176 µs per MLP step.

use ferrofx_core::op;
use ferrofx_core::{Tensor, Value};
use std::time::Instant;

fn per_iter(name: &str, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters / 10 {
        f();
    }
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    println!("{name:<48} {best:>8.3} µs");
    best
}

fn call1(name: &str, args: Vec<Value>) -> Tensor {
    op::call(name, args, vec![]).unwrap().pop().unwrap()
}

fn main() {
    let x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap().requires_grad_(true).unwrap();
    println!("forward + backward of one op on a 1-element tensor (best of 5):");
    per_iter("unsqueeze (method)", 100_000, || {
        let y = x.unsqueeze(0).unwrap();
        y.backward(None, false, false).unwrap();
    });
    per_iter("view (method)", 100_000, || {
        let y = x.view(&[1, 1]).unwrap();
        y.backward(None, false, false).unwrap();
    });
    per_iter("forward only: unsqueeze, no grad", 100_000, || {
        let _ = x.detach().unsqueeze(0).unwrap();
    });
    per_iter("forward only: unsqueeze, recording", 100_000, || {
        let _ = x.unsqueeze(0).unwrap();
    });
    let chain = |n: usize| {
        let mut y = x.clone();
        for _ in 0..n {
            y = y.view(&[1]).unwrap();
        }
        y.backward(None, false, false).unwrap();
    };
    let t = per_iter("chain of 1000 views, per op", 100, || chain(1000)) / 1000.0;
    println!("{:<48} {t:>8.3} µs", "  (per op)");
    for name in ["mul", "add", "relu", "exp", "tanh", "sigmoid"] {
        let Some(def) = op::lookup(name) else {
            println!("{name:<48} (not registered yet)");
            continue;
        };
        if def.backward.is_none() {
            println!("{name:<48} (no backward formula yet)");
            continue;
        }
        let binary =
            def.schema.len() >= 2 && matches!(def.schema[1].ty, op::ArgType::Tensor | op::ArgType::TensorOrScalar);
        let w = Tensor::from_vec(vec![0.5f32], &[1]).unwrap().requires_grad_(true).unwrap();
        per_iter(&format!("{name} (op::call)"), 100_000, || {
            let args = if binary { vec![Value::from(&x), Value::from(&w)] } else { vec![Value::from(&x)] };
            let y = call1(name, args);
            y.backward(None, false, false).unwrap();
        });
    }
    mlp_step();
    if std::env::args().any(|a| a == "--chain") {
        chain_1m();
    }
}

/// 64-64-10 MLP, batch 32, f32: linear, relu, linear, log_softmax, NLL (gather, mean), backward,
/// SGD update under no_grad. Ops are called by registry name.
fn mlp_step() {
    use ferrofx_core::ops::random::{manual_seed, randn};
    manual_seed(0);
    let p = |shape: &[i64], s: f64| {
        let t = call1("mul", vec![Value::from(&randn(shape, None).unwrap()), Value::Float(s)]);
        t.requires_grad_(true).unwrap()
    };
    let (w1, b1, w2, b2) = (p(&[64, 64], 0.1), p(&[64], 0.1), p(&[10, 64], 0.1), p(&[10], 0.1));
    let x = randn(&[32, 64], None).unwrap();
    let target = Tensor::from_vec((0..32).map(|i| (i % 10) as i64).collect::<Vec<_>>(), &[32, 1]).unwrap();
    let params = [w1.clone(), b1.clone(), w2.clone(), b2.clone()];
    let step = || {
        let h = call1("linear", vec![Value::from(&x), Value::from(&w1), Value::from(&b1)]);
        let h = call1("relu", vec![Value::from(&h)]);
        let o = call1("linear", vec![Value::from(&h), Value::from(&w2), Value::from(&b2)]);
        let lp = call1("log_softmax", vec![Value::from(&o), Value::Int(1)]);
        let picked = call1("gather", vec![Value::from(&lp), Value::Int(1), Value::from(&target)]);
        let loss = call1("neg", vec![Value::from(&call1("mean", vec![Value::from(&picked)]))]);
        loss.backward(None, false, false).unwrap();
        let _ng = ferrofx_core::autograd::no_grad();
        for q in &params {
            let g = q.grad().unwrap();
            let step =
                op::call("sub_", vec![Value::from(q), Value::from(&g)], vec![("alpha".into(), Value::Float(0.01))]);
            step.unwrap();
            q.set_grad(None).unwrap();
        }
    };
    println!("MLP 64-64-10 training step, batch 32 (PyTorch here: 176 µs)");
    per_iter("mlp step (forward + backward + sgd)", 2_000, step);
}

/// A chain of 1,000,000 `mul` by a leaf on a 1-element tensor: forward, then backward.
fn chain_1m() {
    let w = Tensor::from_vec(vec![1.0f32], &[1]).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap().requires_grad_(true).unwrap();
    let t = Instant::now();
    let mut y = x.clone();
    for _ in 0..1_000_000 {
        y = call1("mul", vec![Value::from(&y), Value::from(&w)]);
    }
    let f = t.elapsed().as_secs_f64();
    let t = Instant::now();
    y.backward(None, false, false).unwrap();
    let b = t.elapsed().as_secs_f64();
    let t = Instant::now();
    drop(y);
    let d = t.elapsed().as_secs_f64();
    println!("1M-op chain: forward {f:.3} s, backward {b:.3} s, drop {d:.3} s");
}
