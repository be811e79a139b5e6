//! [`MemoryBudget`]: a limit on the memory activation checkpointing / rematerialisation may keep
//! for backward, shared by the eager checkpoint planner
//! ([`CheckpointPlan`](crate::autograd::CheckpointPlan)) and the graph partitioners of
//! `ferrofx-compile` (PyTorch's `activation_memory_budget`).

use crate::error::{Error, Result};

/// A memory budget: a fraction of what would be kept without recomputation, or bytes.
///
/// ```
/// use ferrofx_core::memory::MemoryBudget;
/// assert_eq!(MemoryBudget::Fraction(0.5).limit(1000, "memory_budget").unwrap(), 500);
/// assert_eq!(MemoryBudget::Bytes(64).limit(1000, "memory_budget").unwrap(), 64);
/// assert!(MemoryBudget::Fraction(1.5).limit(1000, "memory_budget").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryBudget {
    /// A fraction (0.0..=1.0) of the bytes kept without recomputation (the default partition's
    /// saved bytes; the unconstrained activation estimate of a checkpoint plan).
    Fraction(f64),
    /// An absolute limit in bytes.
    Bytes(u64),
}

impl MemoryBudget {
    /// The limit in bytes, given what would be kept without any recomputation; a fraction
    /// outside `0.0..=1.0` (or NaN) is an error naming `what`.
    pub fn limit(self, unconstrained: u64, what: &str) -> Result<u64> {
        match self {
            MemoryBudget::Fraction(f) if (0.0..=1.0).contains(&f) => Ok((f * unconstrained as f64).floor() as u64),
            MemoryBudget::Fraction(f) => Err(Error::argument(
                what,
                format!("memory_budget {f} is not a fraction in 0.0..=1.0 of the memory kept without recomputation ({unconstrained} B); give a fraction or an absolute byte limit"),
            )),
            MemoryBudget::Bytes(b) => Ok(b),
        }
    }
}
