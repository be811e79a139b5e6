//! Timing: warm up, then collect samples until a time budget is spent; report the median.

use std::time::{Duration, Instant};

/// Timing budget of one case.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Warm-up time before sampling.
    pub warmup: Duration,
    /// Total sampling time.
    pub measure: Duration,
    /// Minimum number of samples.
    pub min_samples: usize,
}

impl Budget {
    /// The default budget (or a quick one).
    pub fn new(quick: bool) -> Self {
        if quick {
            Budget { warmup: Duration::from_millis(50), measure: Duration::from_millis(300), min_samples: 3 }
        } else {
            Budget { warmup: Duration::from_millis(300), measure: Duration::from_secs(2), min_samples: 5 }
        }
    }
}

/// Median seconds per call of `f`, where each sample runs `f` `inner` times.
pub fn median_secs(budget: Budget, inner: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    while start.elapsed() < budget.warmup {
        for _ in 0..inner {
            f();
        }
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < budget.min_samples || start.elapsed() < budget.measure {
        let t = Instant::now();
        for _ in 0..inner {
            f();
        }
        samples.push(t.elapsed().as_secs_f64() / inner as f64);
        if samples.len() > 100_000 {
            break;
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// Median seconds per call of `a` and of `b`, sampled alternately (a, b, a, b, ...) after a
/// warm-up of both: two variants of one computation compared side by side, so that a change
/// of the machine's load during the measurement affects both columns alike.
pub fn median_secs_pair(budget: Budget, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let start = Instant::now();
    while start.elapsed() < budget.warmup {
        a();
        b();
    }
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while sa.len() < budget.min_samples || start.elapsed() < budget.measure * 2 {
        let t = Instant::now();
        a();
        sa.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b();
        sb.push(t.elapsed().as_secs_f64());
        if sa.len() > 100_000 {
            break;
        }
    }
    let median = |mut s: Vec<f64>| {
        s.sort_by(|x, y| x.total_cmp(y));
        s[s.len() / 2]
    };
    (median(sa), median(sb))
}
