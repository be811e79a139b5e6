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
    let m = median_secs_alternating(budget, &mut [&mut a, &mut b]);
    (m[0], m[1])
}

/// [`median_secs_pair`] for any number of functions: each sample round calls every function
/// once, in order; the sampling time is the budget's per function. Returns each one's median.
pub fn median_secs_alternating(budget: Budget, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    if fs.is_empty() {
        return Vec::new();
    }
    let start = Instant::now();
    while start.elapsed() < budget.warmup * fs.len().max(1) as u32 / 2 {
        fs.iter_mut().for_each(|f| f());
    }
    let mut samples = vec![Vec::new(); fs.len()];
    let start = Instant::now();
    while samples[0].len() < budget.min_samples || start.elapsed() < budget.measure * fs.len() as u32 {
        for (f, s) in fs.iter_mut().zip(&mut samples) {
            let t = Instant::now();
            f();
            s.push(t.elapsed().as_secs_f64());
        }
        if samples[0].len() > 100_000 {
            break;
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(|x, y| x.total_cmp(y));
            s[s.len() / 2]
        })
        .collect()
}

/// What the process used up to now (all threads): CPU time, minor page faults and context
/// switches, read from `/proc/self` (Linux; `None` elsewhere). Printed per case beside its
/// time, so a case whose process state makes it slower (page faults on fresh buffers,
/// spinning or sleeping threads) shows why.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    wall: Instant,
    cpu_secs: f64,
    minor_faults: u64,
    switches: u64,
}

impl Usage {
    /// The process's usage now.
    pub fn now() -> Option<Usage> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // the fields after the command name (which may hold spaces) in parentheses
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        // fields 10 (minflt), 14 (utime), 15 (stime), counted from 1 with pid and comm first
        let (minflt, utime, stime) = (num(7)?, num(11)?, num(12)?);
        let tick = 100.0; // USER_HZ on Linux
        let mut switches = 0;
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                if let Ok(st) = std::fs::read_to_string(t.path().join("status")) {
                    for l in st.lines() {
                        if l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:") {
                            switches += l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                        }
                    }
                }
            }
        }
        Some(Usage { wall: Instant::now(), cpu_secs: (utime + stime) as f64 / tick, minor_faults: minflt, switches })
    }

    /// Per call of the `calls` made since `before`: CPU time (all threads) against wall time,
    /// minor page faults, context switches.
    pub fn per_call_since(&self, before: &Usage, calls: usize) -> PerCall {
        let n = calls.max(1) as f64;
        let wall = self.wall.duration_since(before.wall).as_secs_f64();
        PerCall {
            cpu_per_wall: if wall > 0.0 { (self.cpu_secs - before.cpu_secs) / wall } else { 0.0 },
            faults: self.minor_faults.saturating_sub(before.minor_faults) as f64 / n,
            switches: self.switches.saturating_sub(before.switches) as f64 / n,
        }
    }
}

/// [`Usage`] per call of a case.
#[derive(Debug, Clone, Copy)]
pub struct PerCall {
    /// CPU seconds of all threads per wall second (2.0: two threads busy throughout).
    pub cpu_per_wall: f64,
    /// Minor page faults per call.
    pub faults: f64,
    /// Context switches (voluntary and not, all threads) per call.
    pub switches: f64,
}

impl std::fmt::Display for PerCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu {:.2}/wall, {:.1} faults/call, {:.1} switches/call",
            self.cpu_per_wall, self.faults, self.switches
        )
    }
}
