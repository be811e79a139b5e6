//! ResNet timings for acceptance 5 of issue 5 (side by side with PyTorch; see the lead's
//! benchmark harness for the official figures):
//! `cargo run -p ferrofx-nn --release --example bench_resnet [runs]`.
//! Prints the median of `runs` (default 5) after one warm-up for: ResNet-18 inference batch 1,
//! ResNet-50 inference batch 1 (224 px, eval, no_grad) and ResNet-18 forward+backward batch 8.

use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(5);
    let x1 = ferrofx_core::ops::random::randn(&[1, 3, 224, 224], None)?;
    for (name, mut m) in [("resnet18", ResNet::resnet18(1000)?), ("resnet50", ResNet::resnet50(1000)?)] {
        m.eval();
        let ms = time(runs, || {
            let _g = ferrofx_core::autograd::no_grad();
            m.forward(&x1).expect("forward");
        });
        println!("{name} inference batch 1: {ms:.1} ms");
    }
    let mut m = ResNet::resnet18(1000)?;
    m.train(true);
    let x8 = ferrofx_core::ops::random::randn(&[8, 3, 224, 224], None)?;
    let mut err = None;
    let ms = time(runs, || {
        m.zero_grad();
        let r = m.forward(&x8).and_then(|y| y.sum()).and_then(|l| l.backward(None, false, false));
        if let Err(e) = r {
            err = Some(e);
        }
    });
    match err {
        None => println!("resnet18 forward+backward batch 8: {ms:.1} ms"),
        Some(e) => println!("resnet18 forward+backward batch 8: not available ({e})"),
    }
    Ok(())
}
