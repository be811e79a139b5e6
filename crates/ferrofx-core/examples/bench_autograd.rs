//! Autograd overhead benchmark: forward + backward per op on 1-element tensors, and (once the
//! elementwise/linear families are registered) a 64-64-10 MLP training step.
//!
//! Run: `cargo run --release -p ferrofx-core --example bench_autograd`
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
}
