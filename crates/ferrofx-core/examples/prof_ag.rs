//! Profiling driver for the autograd overhead: runs one workload in a tight loop so that
//! `perf record` sees only it.
//!
//! Run: `cargo run --release -p ferrofx-core --example prof_ag -- OP N` where OP is an op name
//! (`mul`, `add`, `exp`, `tanh`, ...; forward + backward on 1-element tensors) or `mlp` (the
//! 64-64-10 MLP training step of `bench_autograd`), N the number of iterations.
//!
//! It uses mimalloc as its global allocator, as `ferrofx-bench` does, so that instruction
//! counts (`valgrind --tool=callgrind`) match the benchmark's allocator.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use ferrofx_core::op;
use ferrofx_core::{Tensor, Value};
fn call1(name: &str, args: Vec<Value>) -> Tensor {
    op::call(name, args, vec![]).unwrap().pop().unwrap()
}
#[inline(never)]
fn one(name: &str, x: &Tensor, w: &Tensor, binary: bool) {
    let args = if binary { vec![Value::from(x), Value::from(w)] } else { vec![Value::from(x)] };
    let y = call1(name, args);
    y.backward(None, false, false).unwrap();
}
fn main() {
    let mut a = std::env::args().skip(1);
    let name = a.next().unwrap_or_else(|| "mul".into());
    let n: usize = a.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap().requires_grad_(true).unwrap();
    let w = Tensor::from_vec(vec![0.5f32], &[1]).unwrap().requires_grad_(true).unwrap();
    if name == "mlp" {
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
        for _ in 0..n {
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
                op::call("sub_", vec![Value::from(q), Value::from(&g)], vec![("alpha".into(), Value::Float(0.01))])
                    .unwrap();
                q.set_grad(None).unwrap();
            }
        }
        return;
    }
    let binary = matches!(name.as_str(), "mul" | "add");
    for _ in 0..n {
        one(&name, &x, &w, binary);
    }
}
