//! Timing of the heavy kernels: matmul 1024³ f32 (GFLOP/s) and conv2d on ResNet-18 layer
//! shapes at batch 1 and 8 (ms per call, best of several runs).
//!
//! `cargo run --release -p ferrofx-core --example bench_kernels [-- --quick]`
//! The PyTorch side: `python scripts/bench/nn_kernels_torch.py` (same case names). Set
//! `RAYON_NUM_THREADS=2` to match `torch.set_num_threads(2)`. On a loaded machine, compare
//! single-thread CPU time per call instead: `RAYON_NUM_THREADS=1 ... -- --cpu-time` and
//! `python scripts/bench/nn_kernels_torch.py --cpu-time`. `--winograd` times each convolution
//! twice, with Winograd enabled and disabled (`conv::set_winograd_enabled`). `--backward` times
//! each convolution's two gradients instead: `grad_x` (input) and `grad_w` (weight), each a
//! `autograd::grad` call on a retained graph, as the PyTorch script does with `--backward`.
//! The allocator is mimalloc, as in the `ferrofx` binaries; run with `MIMALLOC_PURGE_DELAY=-1`
//! for their setting (freed memory kept, no page zeroing by the kernel).

use ferrofx_core::ops::{conv, linalg};
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use ferrofx_core::{autograd, Tensor};
use std::time::Instant;

/// CPU time of the calling thread in seconds (Linux), for `--cpu-time` runs on a loaded machine.
fn thread_cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
        .map(|ns| ns * 1e-9)
        .unwrap_or(0.0)
}

fn bench(min_secs: f64, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    if std::env::args().any(|a| a == "--cpu-time") {
        // Mean CPU time per call of this thread: with RAYON_NUM_THREADS=1 all work runs here, so
        // this measures single-thread efficiency independent of other load on the machine.
        let (c0, t0) = (thread_cpu_secs(), Instant::now());
        let mut n = 0;
        while t0.elapsed().as_secs_f64() < min_secs * 3.0 || n < 3 {
            f();
            n += 1;
        }
        return (thread_cpu_secs() - c0) / n as f64;
    }
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut n = 0;
    loop {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
        if start.elapsed().as_secs_f64() > min_secs && n >= 3 {
            break;
        }
    }
    best
}

fn randn(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_add(0x9E3779B97F4A7C15);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

const CONVS: &[(&str, usize, usize, usize, i64, i64, usize)] = &[
    ("conv1 7x7/2 3->64 @224", 3, 64, 7, 2, 3, 224),
    ("3x3 64->64 @56", 64, 64, 3, 1, 1, 56),
    ("3x3/2 64->128 @56", 64, 128, 3, 2, 1, 56),
    ("1x1/2 64->128 @56", 64, 128, 1, 2, 0, 56),
    ("3x3 128->128 @28", 128, 128, 3, 1, 1, 28),
    ("3x3/2 128->256 @28", 128, 256, 3, 2, 1, 28),
    ("1x1/2 128->256 @28", 128, 256, 1, 2, 0, 28),
    ("3x3 256->256 @14", 256, 256, 3, 1, 1, 14),
    ("3x3/2 256->512 @14", 256, 512, 3, 2, 1, 14),
    ("1x1/2 256->512 @14", 256, 512, 1, 2, 0, 14),
    ("3x3 512->512 @7", 512, 512, 3, 1, 1, 7),
];

fn main() -> ferrofx_core::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    // any other argument filters cases by substring ("b8", "64->64", "matmul")
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let min = if quick { 0.1 } else { 0.3 };
    println!("rayon threads: {}", rayon::current_num_threads());
    let n = 1024;
    let a = Tensor::from_vec(randn(n * n, 1), &[n, n])?;
    let b = Tensor::from_vec(randn(n * n, 2), &[n, n])?;
    if wanted("matmul 1024^3 f32") {
        let dt = bench(min, || {
            linalg::matmul(&a, &b).unwrap();
        });
        println!("matmul 1024^3 f32: {:.3} ms  {:.1} GFLOP/s", dt * 1e3, 2.0 * (n * n * n) as f64 / dt / 1e9);
    }
    for batch in [1usize, 8] {
        for &(name, cin, cout, k, s, p, hw) in CONVS {
            let label = format!("conv2d b{batch} {name}");
            if !wanted(&label) {
                continue;
            }
            let x = Tensor::from_vec(randn(batch * cin * hw * hw, 3), &[batch, cin, hw, hw])?;
            let w = Tensor::from_vec(randn(cout * cin * k * k, 4), &[cout, cin, k, k])?;
            if std::env::args().any(|a| a == "--backward") {
                // One graph per gradient, only its input requiring grad, so each call computes
                // just that gradient.
                let grad_of = |x: &Tensor, w: &Tensor, input: &Tensor| -> ferrofx_core::Result<f64> {
                    let y = conv::conv2d(x, w, None, &[s], p, &[1], 1)?;
                    let gy = Tensor::from_vec(randn(y.numel(), 5), y.shape())?;
                    Ok(bench(min, || {
                        autograd::grad(
                            std::slice::from_ref(&y),
                            std::slice::from_ref(input),
                            &[Some(gy.clone())],
                            true,
                            false,
                            false,
                        )
                        .unwrap();
                    }))
                };
                // (`requires_grad_` is in place, as in PyTorch: mark fresh copies)
                let xg = Tensor::from_vec(randn(x.numel(), 3), x.shape())?.requires_grad_(true)?;
                let wg = Tensor::from_vec(randn(w.numel(), 4), w.shape())?.requires_grad_(true)?;
                let only = std::env::var("ONLY").unwrap_or_default(); // "x" or "w": just that one
                let both = || -> ferrofx_core::Result<(f64, f64)> {
                    let gx = if only != "w" { grad_of(&xg, &w, &xg)? } else { 0.0 };
                    let gw = if only != "x" { grad_of(&x, &wg, &wg)? } else { 0.0 };
                    Ok((gx * 1e3, gw * 1e3))
                };
                if std::env::args().any(|a| a == "--winograd") {
                    let prev = conv::set_winograd_enabled(false);
                    let (ex, ew) = both()?;
                    conv::set_winograd_enabled(true);
                    let (wx, ww) = both()?;
                    conv::set_winograd_enabled(prev);
                    println!("{label}: grad_x {wx:.3} ms (off {ex:.3})  grad_w {ww:.3} ms (off {ew:.3})");
                } else {
                    let (gx, gw) = both()?;
                    println!("{label}: grad_x {gx:.3} ms  grad_w {gw:.3} ms");
                }
                continue;
            }
            let run = || {
                conv::conv2d(&x, &w, None, &[s], p, &[1], 1).unwrap();
            };
            if std::env::args().any(|a| a == "--winograd") {
                let prev = conv::set_winograd_enabled(false);
                let exact = bench(min, run);
                conv::set_winograd_enabled(true);
                let wino = bench(min, run);
                conv::set_winograd_enabled(prev);
                println!(
                    "{label}: {:.3} ms (winograd on) {:.3} ms (off) {:.2}x",
                    wino * 1e3,
                    exact * 1e3,
                    exact / wino
                );
            } else {
                println!("{label}: {:.3} ms", bench(min, run) * 1e3);
            }
        }
    }
    Ok(())
}
