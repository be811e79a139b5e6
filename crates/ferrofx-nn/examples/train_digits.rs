//! Trains the digits CNN (acceptance 1 of issue 5):
//! `cargo run -p ferrofx-nn --release --example train_digits [epochs]`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = ferrofx_nn::train::TrainConfig::default();
    if let Some(e) = std::env::args().nth(1) {
        cfg.epochs = e.parse()?;
    }
    let r = ferrofx_nn::train::train_digits(&cfg)?;
    println!(
        "digits CNN: test accuracy {:.2}% after {} epochs in {:.1} s ({} threads)",
        100.0 * r.test_accuracy,
        cfg.epochs,
        r.elapsed.as_secs_f64(),
        rayon_threads()
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
