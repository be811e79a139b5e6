//! `ferrofx bench FILE --shape 1,1,8,8`: latency and throughput of a saved traced module on
//! random inputs (median of timed runs after warm-up).

use super::CliResult;
use ferrofx_nn::Module;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `ferrofx bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// A traced-module file.
    pub file: PathBuf,
    /// Input shape, comma separated (batch first).
    #[arg(long, value_delimiter = ',', required = true)]
    pub shape: Vec<usize>,
    /// Timed runs.
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
    /// Most memory the module's intermediate values may take at once (e.g. `2G`, `512M`);
    /// default: half the physical memory. A larger plan is refused before it runs.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Most floating-point operations one forward may take (e.g. `1e12`, `500G`, `20T`);
    /// default: 10^13. A larger plan (a huge pooling window, a huge batch) is refused before
    /// it runs.
    #[arg(long, value_name = "FLOPS")]
    pub max_flops: Option<String>,
}

/// Runs `ferrofx bench`.
pub fn run(a: &BenchArgs) -> CliResult<()> {
    let numel = a.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if a.shape.is_empty() || a.shape.contains(&0) || !matches!(numel, Some(n) if n <= 1 << 28) {
        return Err(format!("--shape {:?} must be non-empty positive sizes of at most 2^28 elements", a.shape).into());
    }
    if a.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let gm = super::module_io::load_module(&a.file)?;
    if let Some(m) = &a.max_memory {
        gm.set_max_memory(Some(super::module_io::parse_memory(m)?));
    }
    if let Some(f) = &a.max_flops {
        gm.set_max_flops(Some(super::module_io::parse_flops(f)?));
    }
    let dims: Vec<i64> = a.shape.iter().map(|&d| d as i64).collect();
    let x = ferrofx_core::ops::random::randn(&dims, None)?;
    let _g = ferrofx_core::autograd::no_grad();
    for _ in 0..3.max(a.runs / 10) {
        gm.forward(&x)?;
    }
    let mut times = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        let t = Instant::now();
        gm.forward(&x)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|p, q| p.total_cmp(q));
    let median = times[times.len() / 2];
    let batch = a.shape[0] as f64;
    println!(
        "{}: median latency {:.3} ms over {} runs (min {:.3} ms), throughput {:.0} samples/s at batch {}",
        a.file.display(),
        median * 1e3,
        a.runs,
        times[0] * 1e3,
        batch / median,
        a.shape[0]
    );
    Ok(())
}
