//! Fallible allocation of tensor buffers: the one place where kernels and creation ops ask for
//! memory.
//!
//! Every output buffer a kernel writes (elementwise maps, `contiguous`, convolution, pooling,
//! creation ops) is obtained through [`alloc_uninit`] or [`alloc_filled`], which
//!
//! 1. compute the element count and byte size with checked arithmetic (a shape whose product
//!    overflows is an error, not a wrap-around),
//! 2. refuse a buffer larger than the process-wide [`allocation_limit`] (by default the
//!    machine's physical memory, at most [`MAX_ALLOC_BYTES`]), and
//! 3. reserve with `try_reserve_exact`, so an allocator failure is an `Err`, never an abort.
//!
//! The error names the op, the shape, the dtype, the bytes requested and the limit.
//!
//! [`tracking`] counts live and peak tensor bytes by category (parameters, gradients,
//! optimizer state, activations) while a [`tracking::MemoryTracker`] is active.
//!
//! ```
//! use ferrofx_core::memory::{alloc_filled, allocation_limit};
//! use ferrofx_core::{DType, ErrorKind};
//! let v: Vec<f32> = alloc_filled("zeros", &[2, 3], 0.0).unwrap();
//! assert_eq!(v.len(), 6);
//! let e = alloc_filled::<f32>("zeros", &[1 << 40, 1 << 30], 0.0).unwrap_err();
//! assert_eq!(e.kind(), ErrorKind::Limit);
//! assert!(e.to_string().contains("[1099511627776, 1073741824]"));
//! assert!(allocation_limit() > 0);
//! ```

mod aligned;
mod budget;
pub mod tracking;

pub use aligned::{AlignedBytes, CacheAligned, CACHE_LINE};
pub use budget::MemoryBudget;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Largest buffer (in bytes) any op allocates, whatever the machine (256 GiB).
pub const MAX_ALLOC_BYTES: usize = 1 << 38;

/// 0 means "not set: use the default".
static LIMIT: AtomicUsize = AtomicUsize::new(0);

/// The machine's physical memory in bytes (`MemTotal` of `/proc/meminfo` on Linux); `None`
/// where it cannot be read.
pub fn physical_memory() -> Option<u64> {
    static MEM: OnceLock<Option<u64>> = OnceLock::new();
    *MEM.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        parse_meminfo(&text)
    })
}

/// `MemTotal` (kB) of a `/proc/meminfo` text, in bytes.
fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Physical memory, or 8 GiB where it is unknown (the fallback off Linux).
pub fn physical_memory_or_default() -> u64 {
    physical_memory().unwrap_or(8 << 30)
}

/// The largest single buffer any op will allocate: set by [`set_allocation_limit`], else the
/// physical memory (capped at [`MAX_ALLOC_BYTES`]).
pub fn allocation_limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        0 => usize::try_from(physical_memory_or_default()).unwrap_or(usize::MAX).min(MAX_ALLOC_BYTES),
        n => n,
    }
}

/// Sets the process-wide limit of one allocation in bytes (`None`: back to the default).
pub fn set_allocation_limit(bytes: Option<usize>) {
    LIMIT.store(bytes.unwrap_or(0).min(MAX_ALLOC_BYTES), Ordering::Relaxed);
}

/// Human-readable bytes (`1.5 GiB`).
pub fn format_bytes(bytes: u128) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Bytes of a tensor of `shape` and `dtype`, `None` when the count overflows.
pub fn nbytes(shape: &[usize], dtype: DType) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?.checked_mul(dtype.size())
}

fn limit_error(op: &str, shape: &[usize], dtype: DType, what: String) -> Error {
    Error::limit(
        op,
        format!(
            "refusing to allocate a tensor of shape {shape:?} and dtype {dtype} ({what}): the limit of one allocation is {}. \
             Use smaller inputs (or a smaller batch), or raise the limit with ferrofx_core::memory::set_allocation_limit",
            format_bytes(allocation_limit() as u128)
        ),
    )
}

/// Checks that a tensor of `shape` and `dtype` may be allocated; returns its element count.
pub fn check_alloc(op: &str, shape: &[usize], dtype: DType) -> Result<usize> {
    let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let exact: u128 = shape.iter().fold(dtype.size() as u128, |b, &d| b.saturating_mul(d as u128));
    match (n, nbytes(shape, dtype)) {
        (Some(n), Some(b)) if b <= allocation_limit() => Ok(n),
        _ => Err(limit_error(op, shape, dtype, format_bytes(exact))),
    }
}

/// An empty vector with room for exactly the elements of `shape` (length 0, for kernels that
/// write every element through `spare_capacity_mut` and then `set_len`).
pub fn alloc_uninit<E: Element>(op: &str, shape: &[usize]) -> Result<Vec<E>> {
    let n = check_alloc(op, shape, E::DTYPE)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        limit_error(
            op,
            shape,
            E::DTYPE,
            format!("{}: the allocator refused", format_bytes((n * E::DTYPE.size()) as u128)),
        )
    })?;
    Ok(v)
}

/// A vector of the elements of `shape`, each `v`.
pub fn alloc_filled<E: Element>(op: &str, shape: &[usize], v: E) -> Result<Vec<E>> {
    let n = check_alloc(op, shape, E::DTYPE)?;
    let mut out = alloc_uninit::<E>(op, shape)?;
    out.resize(n, v);
    Ok(out)
}

/// The elements `iter` yields (exactly the elements of `shape`, in order) in a buffer reserved
/// by [`alloc_uninit`]: the fallible replacement for `iter.collect::<Vec<_>>()` when a kernel
/// gathers its output (or a contiguous copy of its input) from an iterator.
pub fn collect<E: Element>(op: &str, shape: &[usize], iter: impl Iterator<Item = E>) -> Result<Vec<E>> {
    let mut v = alloc_uninit::<E>(op, shape)?;
    let n = v.capacity();
    v.extend(iter.take(n));
    Ok(v)
}

/// A vector of `n` copies of `v` for scratch or index buffers whose element type is not a
/// tensor dtype (`usize`, `u32`, tuples): checked against [`allocation_limit`] and reserved
/// with `try_reserve_exact`, so a size no machine has is an error naming `op`, not an abort.
pub fn try_vec<T: Clone>(op: &str, n: usize, v: T) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>().max(1);
    let refuse = |why: &str| {
        Error::limit(
            op,
            format!(
                "refusing to allocate {n} elements of {size} bytes ({why}): the limit of one allocation is {}. \
                 Use smaller inputs (or a smaller batch), or raise the limit with ferrofx_core::memory::set_allocation_limit",
                format_bytes(allocation_limit() as u128)
            ),
        )
    };
    let bytes = n.checked_mul(size).filter(|&b| b <= allocation_limit());
    if bytes.is_none() {
        return Err(refuse(&format_bytes((n as u128).saturating_mul(size as u128))));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| refuse("the allocator refused"))?;
    out.resize(n, v);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parses_mem_total() {
        assert_eq!(parse_meminfo("MemFree: 1 kB\nMemTotal:       24000 kB\n"), Some(24000 * 1024));
        assert_eq!(parse_meminfo("nothing"), None);
    }

    #[test]
    fn overflowing_shape_is_a_limit_error() {
        let e = check_alloc("add", &[usize::MAX, 2], DType::F32).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Limit);
        assert!(e.message().contains("limit of one allocation"), "{e}");
    }

    #[test]
    fn collect_and_try_vec_refuse_what_no_machine_has() {
        let v = collect("copy", &[2, 2], (0..10).map(|i| i as f32)).unwrap();
        assert_eq!(v, vec![0.0, 1.0, 2.0, 3.0]);
        let e = collect("copy", &[1 << 40, 1 << 30], std::iter::repeat(0f32)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Limit);
        assert_eq!(try_vec("scratch", 3, 7usize).unwrap(), vec![7, 7, 7]);
        let e = try_vec("scratch", usize::MAX / 2, 0u64).unwrap_err();
        assert!(e.message().contains("limit of one allocation"), "{e}");
    }

    #[test]
    fn bytes_format() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 30), "3.0 GiB");
    }
}
