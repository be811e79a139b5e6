//! Quick timing of the elementwise paths: per-op overhead on 1-element tensors (dispatch +
//! kernel + allocation) and bandwidth on 16M-element f32 tensors.
//!
//! `cargo run -p ferrofx-core --release --example bench_elementwise [-- --quick]`
//!
//! Prints ns/op for tiny tensors and ms + GB/s (bytes read + written) for large ones. `add_` is
//! the preallocated-output comparison for PyTorch's `torch.add(a, b, out=c)` (both move 3 × 64 MB).

use ferrofx_core::Tensor;
use std::hint::black_box;
use std::time::Instant;

/// Median of `reps` timings of `iters` calls, in seconds per call.
fn time<F: FnMut()>(reps: usize, iters: usize, mut f: F) -> f64 {
    for _ in 0..iters.min(10) {
        f();
    }
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[reps / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (reps, tiny_iters) = if quick { (3, 20_000) } else { (7, 200_000) };

    println!("== tiny tensors (1 element, f32): dispatch + kernel + allocation ==");
    let a = Tensor::from_vec(vec![1.5f32], &[1]).unwrap();
    let b = Tensor::from_vec(vec![2.5f32], &[1]).unwrap();
    let rows: Vec<(&str, f64)> = vec![
        ("add(t, t)", time(reps, tiny_iters, || drop(black_box(a.add(&b).unwrap())))),
        ("&a + &b", time(reps, tiny_iters, || drop(black_box((&a + &b).unwrap())))),
        ("add(t, 1.0)", time(reps, tiny_iters, || drop(black_box(a.add(1.0).unwrap())))),
        ("mul(t, t)", time(reps, tiny_iters, || drop(black_box(a.mul(&b).unwrap())))),
        ("relu(t)", time(reps, tiny_iters, || drop(black_box(a.relu().unwrap())))),
        ("exp(t)", time(reps, tiny_iters, || drop(black_box(a.exp().unwrap())))),
        ("lt(t, t)", time(reps, tiny_iters, || drop(black_box(a.lt(&b).unwrap())))),
        ("add_(t, t)", time(reps, tiny_iters, || drop(black_box(a.add_(&b).unwrap())))),
    ];
    for (name, s) in rows {
        println!("{name:<14} {:>8.1} ns/op", s * 1e9);
    }

    let n = 16 * 1024 * 1024;
    let big_reps = if quick { 3 } else { 9 };
    println!("== large tensors ({n} elements, f32, {} threads) ==", rayon::current_num_threads());
    let x = Tensor::from_vec((0..n).map(|i| (i % 1000) as f32).collect(), &[n]).unwrap();
    let y = Tensor::from_vec(vec![0.5f32; n], &[n]).unwrap();
    let mb = (n * 4) as f64;
    let report = |name: &str, s: f64, streams: f64| {
        println!("{name:<22} {:>7.2} ms {:>7.1} GB/s", s * 1e3, streams * mb / s / 1e9);
    };
    report("add_(x, y) in place", time(big_reps, 1, || drop(black_box(x.add_(&y).unwrap()))), 3.0);
    report("add(x, y) allocating", time(big_reps, 1, || drop(black_box(x.add(&y).unwrap()))), 3.0);
    report("mul(x, 2.0)", time(big_reps, 1, || drop(black_box(x.mul(2.0).unwrap()))), 2.0);
    report("relu(x)", time(big_reps, 1, || drop(black_box(x.relu().unwrap()))), 2.0);
    report("relu_(x)", time(big_reps, 1, || drop(black_box(x.relu_().unwrap()))), 2.0);
    let m = x.view(&[4096, 4096]).unwrap();
    let row = Tensor::from_vec(vec![1.0f32; 4096], &[4096]).unwrap();
    report("add(m, row) bcast", time(big_reps, 1, || drop(black_box(m.add(&row).unwrap()))), 2.0);
    let mt = m.t().unwrap();
    report("add(m.t(), m) strided", time(big_reps, 1, || drop(black_box(mt.add(&m).unwrap()))), 3.0);
}
