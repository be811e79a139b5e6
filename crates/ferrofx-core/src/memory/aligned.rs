//! Cache-line alignment of buffers.
//!
//! A 64-byte vector load or an AMX tile row that starts inside a cache line touches two lines:
//! on the Intel Xeon with AMX measured in session 18, `tileloadd` of 16 rows misaligned by 16 bytes (what glibc's
//! `malloc` returns for large blocks: the page plus a 16-byte header) runs about six times
//! slower than aligned, and a zmm load three times. PyTorch's CPU allocator and ONNX Runtime's
//! arena hand out 64-byte aligned buffers for the same reason.
//!
//! Two tools:
//! - [`CacheAligned`] wraps a global allocator so every block of [`CacheAligned::MIN_SIZE`]
//!   bytes or more is 64-byte aligned: every tensor buffer then starts on a cache line (the
//!   `ferrofx` and `ferrofx-bench` binaries install it over mimalloc).
//! - [`AlignedBytes`] is a byte buffer that starts on a cache line whatever the allocator, for
//!   the packed operands the kernels build themselves.

use crate::error::Result;
use std::alloc::{GlobalAlloc, Layout};

/// The cache line (and AVX-512 vector / AMX tile row) size in bytes.
pub const CACHE_LINE: usize = 64;

/// A global allocator that gives every block of at least [`CacheAligned::MIN_SIZE`] bytes
/// 64-byte alignment (smaller blocks keep the alignment their type asks for, so the many small
/// allocations of graphs and strings cost no padding).
///
/// ```
/// use ferrofx_core::memory::CacheAligned;
/// use std::alloc::System;
///
/// #[global_allocator]
/// static GLOBAL: CacheAligned<System> = CacheAligned(System);
///
/// let v = vec![0f32; 1000];
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheAligned<A>(pub A);

impl<A> CacheAligned<A> {
    /// Blocks of this many bytes or more are aligned to [`CACHE_LINE`].
    pub const MIN_SIZE: usize = 256;

    /// The layout actually requested from the wrapped allocator for `layout`.
    fn widen(layout: Layout) -> Layout {
        if layout.size() >= Self::MIN_SIZE && layout.align() < CACHE_LINE {
            // SAFETY: CACHE_LINE is a power of two, and rounding a size that fitted isize with
            // a smaller alignment up to a multiple of 64 stays below isize::MAX for any size a
            // caller could pass (Layout guarantees size <= isize::MAX - (align - 1)).
            unsafe { Layout::from_size_align_unchecked(layout.size(), CACHE_LINE) }
        } else {
            layout
        }
    }
}

// SAFETY: every method forwards to the wrapped allocator with the widened layout, which is a
// pure function of the caller's layout, so `dealloc` and `realloc` pass the wrapped allocator
// the layout it allocated the block with; a `realloc` that moves a block across the size
// threshold (so its widened alignment changes) allocates, copies and frees instead.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CacheAligned<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0.alloc(Self::widen(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.0.alloc_zeroed(Self::widen(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.0.dealloc(ptr, Self::widen(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = Self::widen(layout);
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let new = Self::widen(new);
        if new.align() == old.align() {
            return self.0.realloc(ptr, old, new_size);
        }
        let fresh = self.0.alloc(new);
        if !fresh.is_null() {
            std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
            self.0.dealloc(ptr, old);
        }
        fresh
    }
}

/// `len` bytes that start on a cache line, whatever the global allocator (a `Vec<u8>` with up
/// to 63 bytes of slack in front).
#[derive(Debug, Clone, Default)]
pub struct AlignedBytes {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBytes {
    /// `len` bytes, each `fill`, allocated through [`try_vec`](super::try_vec) (an error naming
    /// `op` when the size is beyond the allocation limit or the allocator refuses).
    pub fn try_new(op: &str, len: usize, fill: u8) -> Result<AlignedBytes> {
        let total = len.saturating_add(CACHE_LINE - 1);
        let buf = super::try_vec(op, total, fill)?;
        let off = buf.as_ptr().align_offset(CACHE_LINE).min(CACHE_LINE - 1);
        Ok(AlignedBytes { buf, off, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.off..self.off + self.len]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    #[test]
    fn aligned_bytes_start_on_a_cache_line() {
        for len in [0, 1, 63, 64, 1000, 1 << 20] {
            let mut b = AlignedBytes::try_new("t", len, 7).unwrap();
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % CACHE_LINE, 0);
            assert!(b.as_mut_slice().iter().all(|&v| v == 7));
        }
        let e = AlignedBytes::try_new("conv", usize::MAX - 8, 0).unwrap_err();
        assert!(e.to_string().contains("conv"), "{e}");
    }

    #[test]
    fn cache_aligned_widens_large_blocks_and_reallocates_across_the_threshold() {
        let a = CacheAligned(System);
        unsafe {
            let small = Layout::from_size_align(16, 4).unwrap();
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..16 {
                p.add(i).write(i as u8);
            }
            // grow past MIN_SIZE: the block moves to a 64-byte aligned one, bytes kept
            let q = a.realloc(p, small, 4096);
            assert_eq!(q as usize % CACHE_LINE, 0);
            assert!((0..16).all(|i| q.add(i).read() == i as u8));
            // shrink below it again
            let big = Layout::from_size_align(4096, 4).unwrap();
            let r = a.realloc(q, big, 8);
            assert!((0..8).all(|i| r.add(i).read() == i as u8));
            a.dealloc(r, Layout::from_size_align(8, 4).unwrap());
            let z = a.alloc_zeroed(Layout::from_size_align(1000, 8).unwrap());
            assert_eq!(z as usize % CACHE_LINE, 0);
            assert!((0..1000).all(|i| z.add(i).read() == 0));
            a.dealloc(z, Layout::from_size_align(1000, 8).unwrap());
        }
    }
}
