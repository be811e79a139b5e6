//! Per-layer timing of the NCHW16c convolution kernels (`nchwc_conv2d`) beside the NCHW ones
//! (`conv2d_fused`) on ResNet-50's and MobileNetV2's 1x1 layers, ResNet's and MobileNetV2's stems and MobileNetV2's
//! depthwise 3x3 layers: best of a 0.5 s loop each, the inputs already in each layout, both threads.
//! This is what the layout pass's estimates (`nchwc_saving`) were read from.
//!
//! With `COLD=1`, 128 MiB are written between calls, so that activations and weights come from
//! memory, as inside a model at batch 8 (the warm loop flattered the NCHW kernels on
//! MobileNetV2's 16-32-channel layers).
//!
//! `cargo run --release -p ferrofx-core --example bench_nchwc -- [batch]` (default 8); `ONLY=pointwise`,
//! `strided`, `stems` or `depthwise` runs one section.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use ferrofx_core::ops::{conv, random::randn};
use std::time::Instant;

fn best_of(mut f: impl FnMut()) -> f64 {
    let cold = std::env::var("COLD").is_ok_and(|v| v == "1");
    let mut junk = vec![0u8; if cold { 128 << 20 } else { 0 }];
    for _ in 0..3 {
        f();
    }
    let (start, mut best, mut n) = (Instant::now(), f64::INFINITY, 0);
    while start.elapsed().as_secs_f64() < 0.5 || n < 5 {
        for (i, b) in junk.iter_mut().enumerate().step_by(64) {
            *b = b.wrapping_add(i as u8);
        }
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
    }
    best
}

fn main() -> ferrofx_core::Result<()> {
    let _g = ferrofx_core::autograd::no_grad();
    let b: i64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    // ONLY=pointwise|strided|stems|depthwise: one section
    let only = std::env::var("ONLY").ok();
    let only = only.as_deref();
    let section = |name: &str, title: &str| {
        let on = only.is_none_or(|f| f == name || (name == "pointwise" && f == "strided"));
        if on {
            println!("{title}, batch {b}");
        }
        on
    };
    let run_pointwise = section("pointwise", "1x1 convolutions + bias + relu");
    // (in, out, plane, stride): ResNet-50's and MobileNetV2's 1x1 layers, then ResNet-50's
    // stride-2 downsampling 1x1s
    let pointwise = [
        (256i64, 64i64, 56i64, 1i64),
        (64, 256, 56, 1),
        (512, 128, 28, 1),
        (1024, 256, 14, 1),
        (256, 1024, 14, 1),
        (2048, 512, 7, 1),
        (512, 2048, 7, 1),
        (96, 24, 56, 1),
        (24, 144, 56, 1),
        (144, 24, 56, 1),
        (32, 16, 112, 1),
        (16, 96, 112, 1),
        (960, 160, 7, 1),
        (160, 960, 7, 1),
        (256, 512, 56, 2),
        (256, 512, 28, 1),
        (512, 1024, 14, 1),
        (512, 1024, 28, 2),
        (1024, 2048, 14, 2),
    ];
    for (c, o, hw, s) in pointwise {
        let wanted = match only {
            None | Some("pointwise") => true,
            Some(f) => f == "strided" && s > 1,
        };
        if !run_pointwise || !wanted {
            continue;
        }
        let x = randn(&[b, c, hw, hw], None)?;
        let (w, bias) = (randn(&[o, c, 1, 1], None)?, randn(&[o], None)?);
        let xb = conv::nchwc_reorder_input(&x)?;
        let nchw = best_of(|| {
            conv::conv2d_fused(&x, &w, Some(&bias), &[s, s], &[0, 0], &[1, 1], 1, None, "relu").unwrap();
        });
        let blocked = best_of(|| {
            conv::nchwc_conv2d(&xb, &w, Some(&bias), &[s, s], &[0, 0], &[1, 1], 1, None, "relu").unwrap();
        });
        let ohw = (hw - 1) / s + 1;
        let gflop = 2.0 * (b * ohw * ohw * c * o) as f64 / 1e9;
        println!(
            "  {c:5} -> {o:5} @ {hw:3} /{s}: NCHW {:8.1} us ({:4.0} GFLOP/s)  NCHW16c {:8.1} us ({:4.0} GFLOP/s)",
            nchw * 1e6,
            gflop / nchw,
            blocked * 1e6,
            gflop / blocked
        );
    }
    let run_stems = section("stems", "stems (NCHW input) + bias + relu");
    for (c, o, k, s, hw) in [(3i64, 32i64, 3i64, 2i64, 224i64), (3, 64, 7, 2, 224)] {
        if !run_stems {
            continue;
        }
        let x = randn(&[b, c, hw, hw], None)?;
        let (w, bias) = (randn(&[o, c, k, k], None)?, randn(&[o], None)?);
        let p = k / 2;
        let nchw = best_of(|| {
            conv::conv2d_fused(&x, &w, Some(&bias), &[s, s], &[p, p], &[1, 1], 1, None, "relu").unwrap();
        });
        let blocked = best_of(|| {
            conv::nchwc_conv2d(&x, &w, Some(&bias), &[s, s], &[p, p], &[1, 1], 1, None, "relu").unwrap();
        });
        println!(
            "  {c} -> {o:3} {k}x{k}/{s} @ {hw}: NCHW {:8.1} us  NCHW16c {:8.1} us  ({:.2}x)",
            nchw * 1e6,
            blocked * 1e6,
            nchw / blocked
        );
    }
    let run_depthwise = section("depthwise", "depthwise 3x3 + bias + relu6");
    for (c, hw, s) in [
        (32i64, 112i64, 1i64),
        (96, 112, 2),
        (144, 56, 1),
        (144, 56, 2),
        (192, 28, 1),
        (192, 28, 2),
        (384, 14, 1),
        (576, 14, 1),
        (576, 14, 2),
        (960, 7, 1),
    ] {
        if !run_depthwise {
            continue;
        }
        let x = randn(&[b, c, hw, hw], None)?;
        let (w, bias) = (randn(&[c, 1, 3, 3], None)?, randn(&[c], None)?);
        let xb = conv::nchwc_reorder_input(&x)?;
        let nchw = best_of(|| {
            conv::conv2d_fused(&x, &w, Some(&bias), &[s, s], &[1, 1], &[1, 1], c, None, "relu6").unwrap();
        });
        let blocked = best_of(|| {
            conv::nchwc_conv2d(&xb, &w, Some(&bias), &[s, s], &[1, 1], &[1, 1], c, None, "relu6").unwrap();
        });
        println!(
            "  {c:4} @ {hw:3} stride {s}: NCHW {:8.1} us  NCHW16c {:8.1} us  ({:.2}x)",
            nchw * 1e6,
            blocked * 1e6,
            nchw / blocked
        );
    }
    Ok(())
}
