//! Timing of the non-convolution layers of a ResNet-18 training step at batch 8: max pooling,
//! batch norm (training mode), ReLU and the residual add, each forward (grad mode on, inputs
//! requiring grad, as in training) and backward (`autograd::grad` on a retained graph).
//!
//! `MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=2 cargo run --release -p ferrofx-core --example bench_layers [-- filter]`
//! The PyTorch side: `python scripts/bench/layers_torch.py [filter]` (same case names, 2 threads).

use ferrofx_core::ops::{binary, norm, pool, unary};
use ferrofx_core::{autograd, Result, Tensor};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Best time of `f` in ms over ~0.3 s (at least 3 calls), after 2 warm-up calls.
fn best_ms(mut f: impl FnMut()) -> f64 {
    f();
    f();
    let (start, mut best, mut n) = (Instant::now(), f64::INFINITY, 0);
    while n < 3 || start.elapsed().as_secs_f64() < 0.3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
    }
    best * 1e3
}

fn randn(shape: &[usize], seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_add(0x9E3779B97F4A7C15);
    let v = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape)
}

/// Times `forward` on inputs requiring grad, then the backward of its output to `wrt`.
fn case(name: &str, inputs: &[Tensor], forward: impl Fn(&[Tensor]) -> Result<Tensor>) -> Result<()> {
    let fwd = best_ms(|| {
        forward(inputs).unwrap();
    });
    let y = forward(inputs)?;
    let gy = randn(y.shape(), 9)?;
    let bwd = best_ms(|| {
        autograd::grad(std::slice::from_ref(&y), inputs, &[Some(gy.clone())], true, false, false).unwrap();
    });
    println!("{name}: fwd {fwd:.3} ms  bwd {bwd:.3} ms");
    Ok(())
}

fn main() -> Result<()> {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    println!("rayon threads: {}", rayon::current_num_threads());
    let x = randn(&[8, 64, 112, 112], 1)?.requires_grad_(true)?;
    if wanted("maxpool 3x3/2 64@112") {
        case("maxpool 3x3/2 64@112", std::slice::from_ref(&x), |t| {
            pool::max_pool2d(&t[0], &[3, 3], &[2, 2], &[1, 1], &[1, 1], false)
        })?;
    }
    for (c, hw) in [(64usize, 112usize), (64, 56), (128, 28), (256, 14), (512, 7)] {
        let name = format!("batchnorm train {c}@{hw}");
        if !wanted(&name) {
            continue;
        }
        let x = randn(&[8, c, hw, hw], 2)?.requires_grad_(true)?;
        let w = randn(&[c], 3)?.requires_grad_(true)?;
        let b = randn(&[c], 4)?.requires_grad_(true)?;
        let (rm, rv) = (Tensor::from_vec(vec![0f32; c], &[c])?, Tensor::from_vec(vec![1f32; c], &[c])?);
        case(&name, &[x, w, b], |t| {
            norm::batch_norm(&t[0], Some(&rm), Some(&rv), Some(&t[1]), Some(&t[2]), true, 0.1, 1e-5)
        })?;
    }
    for (c, hw) in [(64usize, 112usize), (64, 56), (512, 7)] {
        let name = format!("relu {c}@{hw}");
        if wanted(&name) {
            case(&name, &[randn(&[8, c, hw, hw], 5)?.requires_grad_(true)?], |t| unary::relu(&t[0]))?;
        }
        let name = format!("add {c}@{hw}");
        if wanted(&name) {
            let (a, b) =
                (randn(&[8, c, hw, hw], 6)?.requires_grad_(true)?, randn(&[8, c, hw, hw], 7)?.requires_grad_(true)?);
            case(&name, &[a, b], |t| binary::add(&t[0], &t[1]))?;
        }
    }
    Ok(())
}
