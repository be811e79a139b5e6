//! Anomaly mode (`torch.autograd.set_detect_anomaly`): nodes remember where they were created
//! (a captured backtrace, plus the first frame outside ferrofx-core and std), errors raised in
//! backward name that place, and a NaN produced by a backward node is reported as an error
//! naming the node and its creation site.

use super::node::{CreationInfo, Node};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};

static ANOMALY: AtomicBool = AtomicBool::new(false);

/// Turns anomaly detection on or off (process-wide).
pub fn set_detect_anomaly(enabled: bool) {
    ANOMALY.store(enabled, Ordering::Relaxed)
}

/// `true` while anomaly detection is on.
#[inline]
pub fn is_anomaly_enabled() -> bool {
    ANOMALY.load(Ordering::Relaxed)
}

/// Restores the previous anomaly mode when dropped.
#[must_use = "anomaly mode is restored when the guard is dropped"]
pub struct AnomalyGuard(bool);
impl Drop for AnomalyGuard {
    fn drop(&mut self) {
        set_detect_anomaly(self.0)
    }
}

/// `torch.autograd.detect_anomaly()`: anomaly mode until the guard drops.
pub fn detect_anomaly() -> AnomalyGuard {
    let prev = is_anomaly_enabled();
    set_detect_anomaly(true);
    AnomalyGuard(prev)
}

fn is_internal(sym: &str) -> bool {
    let s = sym.trim();
    s.starts_with("std::")
        || s.starts_with("core::")
        || s.starts_with("alloc::")
        || s.starts_with("ferrofx_core::autograd")
        || s.starts_with("ferrofx_core::op::")
        || s.starts_with("<ferrofx_core::")
        || s.starts_with("ferrofx_core::ops::")
        || s.starts_with("ferrofx_core::tensor")
        || s.starts_with("__rust")
        || s.starts_with("rust_begin")
        || s.contains("backtrace")
}

/// Whether a frame's source file (as the backtrace prints it: absolute, or `./`-relative to the
/// working directory) is a file of this crate's `src/` or of the Rust toolchain. With
/// line-tables-only debug info, inlined frames carry short symbol names (`new`, `capture`), so
/// the file is what tells internal frames apart.
fn is_internal_file(at: &str, cwd: Option<&std::path::Path>) -> bool {
    let file = at.rsplitn(3, ':').last().unwrap_or(at);
    if file.starts_with("/rustc/") {
        return true;
    }
    let path = match (file.strip_prefix("./"), cwd) {
        (Some(rel), Some(cwd)) => cwd.join(rel),
        _ => std::path::PathBuf::from(file),
    };
    path.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
}

/// Captures the current backtrace and the first frame outside ferrofx-core internals.
pub(crate) fn capture() -> CreationInfo {
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let cwd = std::env::current_dir().ok();
    let mut location = String::from("<unknown location>");
    let lines: Vec<&str> = bt.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some((num, sym)) = line.trim_start().split_once(": ") else { continue };
        if !num.chars().all(|c| c.is_ascii_digit()) || is_internal(sym) {
            continue;
        }
        let at = lines.get(i + 1).map(|n| n.trim_start()).and_then(|n| n.strip_prefix("at "));
        if at.is_some_and(|a| is_internal_file(a, cwd.as_deref())) {
            continue;
        }
        location = match at {
            Some(a) => format!("{} ({a})", sym.trim()),
            None => sym.trim().to_string(),
        };
        break;
    }
    CreationInfo { location, backtrace: bt }
}

/// PyTorch's `AnomalyMetadata::print_stack` note (a warning there, part of the error here):
/// where the forward call that created `node` was made.
pub(crate) fn forward_trace_note(node: &dyn Node) -> String {
    match node.creation_info() {
        Some(c) => format!(
            "Error detected in {}. Traceback of forward call that caused the error:\n  {}\n{}",
            node.name(),
            c.location,
            c.backtrace
        ),
        None => format!(
            "Error detected in {}. No forward pass information available. Enable detect anomaly during forward pass for more information.",
            node.name()
        ),
    }
}

/// An error raised while `node` ran in anomaly mode, with the forward trace note appended.
pub(crate) fn decorate(e: Error, node: &dyn Node) -> Error {
    Error::new(e.kind(), e.op().to_string(), format!("{}\n{}", e.message(), forward_trace_note(node)))
}

/// PyTorch's anomaly check of a node's results: "Function 'MulBackward0' returned nan values in
/// its 0th output." (followed by the forward trace note).
pub(crate) fn check_nan(node: &dyn Node, outs: &[Option<Tensor>]) -> Result<()> {
    for (i, g) in outs.iter().enumerate() {
        let Some(g) = g else { continue };
        if !g.dtype().is_floating_point() {
            continue;
        }
        if g.to_vec_f64()?.iter().any(|v| v.is_nan()) {
            return Err(Error::autograd(
                node.name().to_string(),
                format!(
                    "Function '{}' returned nan values in its {i}th output.\n{}",
                    node.name(),
                    forward_trace_note(node)
                ),
            ));
        }
    }
    Ok(())
}
