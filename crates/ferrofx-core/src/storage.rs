//! Storage: the reference-counted buffer that tensors and their views share, with the version
//! counter that autograd reads.
//!
//! Soundness: the buffer sits behind a [`parking_lot::RwLock`]. Kernels take read locks on their
//! inputs and build outputs in fresh buffers; in-place ops take the write lock of the storage
//! they modify. An in-place op whose source aliases its destination reads the source into a
//! temporary first, so no op ever holds a read and a write lock of the same storage. This keeps
//! `Tensor: Send + Sync` without any `unsafe`.

use crate::dtype::{DType, Element};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A typed, owned CPU buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuBuffer {
    /// bool elements
    Bool(Vec<bool>),
    /// uint8 elements
    U8(Vec<u8>),
    /// int8 elements
    I8(Vec<i8>),
    /// int16 elements
    I16(Vec<i16>),
    /// int32 elements
    I32(Vec<i32>),
    /// int64 elements
    I64(Vec<i64>),
    /// float16 elements
    F16(Vec<half::f16>),
    /// bfloat16 elements
    BF16(Vec<half::bf16>),
    /// float32 elements
    F32(Vec<f32>),
    /// float64 elements
    F64(Vec<f64>),
}

/// Calls `$body` with `$v` bound to the typed `Vec` inside a [`CpuBuffer`] (by reference).
#[macro_export]
macro_rules! with_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::storage::CpuBuffer::Bool($v) => $body,
            $crate::storage::CpuBuffer::U8($v) => $body,
            $crate::storage::CpuBuffer::I8($v) => $body,
            $crate::storage::CpuBuffer::I16($v) => $body,
            $crate::storage::CpuBuffer::I32($v) => $body,
            $crate::storage::CpuBuffer::I64($v) => $body,
            $crate::storage::CpuBuffer::F16($v) => $body,
            $crate::storage::CpuBuffer::BF16($v) => $body,
            $crate::storage::CpuBuffer::F32($v) => $body,
            $crate::storage::CpuBuffer::F64($v) => $body,
        }
    };
}

impl CpuBuffer {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuBuffer::Bool(_) => DType::Bool,
            CpuBuffer::U8(_) => DType::U8,
            CpuBuffer::I8(_) => DType::I8,
            CpuBuffer::I16(_) => DType::I16,
            CpuBuffer::I32(_) => DType::I32,
            CpuBuffer::I64(_) => DType::I64,
            CpuBuffer::F16(_) => DType::F16,
            CpuBuffer::BF16(_) => DType::BF16,
            CpuBuffer::F32(_) => DType::F32,
            CpuBuffer::F64(_) => DType::F64,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        with_buffer!(self, v => v.len())
    }
    /// `true` when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A zero-filled buffer.
    pub fn zeros(dtype: DType, len: usize) -> CpuBuffer {
        match dtype {
            DType::Bool => CpuBuffer::Bool(vec![false; len]),
            DType::U8 => CpuBuffer::U8(vec![0; len]),
            DType::I8 => CpuBuffer::I8(vec![0; len]),
            DType::I16 => CpuBuffer::I16(vec![0; len]),
            DType::I32 => CpuBuffer::I32(vec![0; len]),
            DType::I64 => CpuBuffer::I64(vec![0; len]),
            DType::F16 => CpuBuffer::F16(vec![half::f16::ZERO; len]),
            DType::BF16 => CpuBuffer::BF16(vec![half::bf16::ZERO; len]),
            DType::F32 => CpuBuffer::F32(vec![0.0; len]),
            DType::F64 => CpuBuffer::F64(vec![0.0; len]),
        }
    }
    /// Typed slice access; `None` when `T` is not the buffer's element type.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::slice_of(self)
    }
    /// Typed mutable slice access; `None` when `T` is not the buffer's element type.
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        T::slice_of_mut(self)
    }
}

/// Typed access to [`CpuBuffer`]s, implemented for every [`Element`].
pub trait BufferElement: Sized {
    /// Wraps a vector.
    fn into_buffer(v: Vec<Self>) -> CpuBuffer;
    /// Borrows the vector if the buffer has this element type.
    fn slice_of(b: &CpuBuffer) -> Option<&[Self]>;
    /// Mutably borrows the vector if the buffer has this element type.
    fn slice_of_mut(b: &mut CpuBuffer) -> Option<&mut [Self]>;
}

macro_rules! buffer_element {
    ($t:ty, $var:ident) => {
        impl BufferElement for $t {
            #[inline]
            fn into_buffer(v: Vec<Self>) -> CpuBuffer {
                CpuBuffer::$var(v)
            }
            #[inline]
            fn slice_of(b: &CpuBuffer) -> Option<&[Self]> {
                match b {
                    CpuBuffer::$var(v) => Some(v),
                    _ => None,
                }
            }
            #[inline]
            fn slice_of_mut(b: &mut CpuBuffer) -> Option<&mut [Self]> {
                match b {
                    CpuBuffer::$var(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
buffer_element!(bool, Bool);
buffer_element!(u8, U8);
buffer_element!(i8, I8);
buffer_element!(i16, I16);
buffer_element!(i32, I32);
buffer_element!(i64, I64);
buffer_element!(half::f16, F16);
buffer_element!(half::bf16, BF16);
buffer_element!(f32, F32);
buffer_element!(f64, F64);

struct StorageInner {
    data: RwLock<CpuBuffer>,
    /// PyTorch's version counter: shared by every view of this storage, bumped by every
    /// in-place write.
    version: AtomicU64,
    /// Bumped by every [`Storage::write`] (whether or not the writer bumps `version`): the
    /// validity stamp of `derived`.
    writes: AtomicU64,
    /// Data a kernel derived from this buffer (see [`Storage::derived`]).
    derived: Mutex<Option<Derived>>,
    /// Set when a memory tracker counted this buffer (uncounted when the storage is freed).
    _tracked: Option<crate::memory::tracking::Tracked>,
}

impl std::fmt::Debug for StorageInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageInner")
            .field("data", &self.data)
            .field("version", &self.version)
            .field("writes", &self.writes)
            .finish_non_exhaustive()
    }
}

/// A value derived from a storage's contents, with the write stamp and key it was made for.
struct Derived {
    writes: u64,
    key: Box<[usize]>,
    value: Arc<dyn Any + Send + Sync>,
}

/// A shared, lockable buffer. Cloning shares it (views); see the module docs for soundness.
#[derive(Debug, Clone)]
pub struct Storage(Arc<StorageInner>);

impl Storage {
    /// Wraps a buffer.
    pub fn new(buf: CpuBuffer) -> Self {
        let tracked = crate::memory::tracking::on_alloc(buf.len().saturating_mul(buf.dtype().size()));
        Storage(Arc::new(StorageInner {
            data: RwLock::new(buf),
            version: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            derived: Mutex::new(None),
            _tracked: tracked,
        }))
    }
    /// Wraps a typed vector.
    pub fn from_vec<T: Element>(v: Vec<T>) -> Self {
        Storage::new(T::into_buffer(v))
    }
    /// Read access.
    pub fn read(&self) -> RwLockReadGuard<'_, CpuBuffer> {
        self.0.data.read()
    }
    /// Write access. Callers that write must also call [`Storage::bump_version`]. Any value
    /// cached by [`Storage::derived`] is invalidated.
    pub fn write(&self) -> RwLockWriteGuard<'_, CpuBuffer> {
        let guard = self.0.data.write();
        self.0.writes.fetch_add(1, Ordering::AcqRel);
        guard
    }
    /// A value derived from this buffer's contents (for example a kernel's pre-transformed
    /// weights), cached on the storage: returned from the cache when it was made under the
    /// same `key` and no [`Storage::write`] happened since, otherwise computed by `make` (under
    /// a read lock, so no write can interleave) and cached in place of the previous value.
    /// The cache holds one value and is freed with the storage.
    ///
    /// ```
    /// use ferrofx_core::storage::Storage;
    /// let s = Storage::from_vec(vec![1.0f32, 2.0]);
    /// let sum = |b: &ferrofx_core::storage::CpuBuffer| b.as_slice::<f32>().map(|v| v.iter().sum::<f32>());
    /// assert_eq!(*s.derived(&[0], sum), Some(3.0));
    /// s.write().as_mut_slice::<f32>().unwrap()[0] = 5.0; // any write invalidates the cache
    /// assert_eq!(*s.derived(&[0], sum), Some(7.0));
    /// ```
    pub fn derived<T: Any + Send + Sync>(&self, key: &[usize], make: impl FnOnce(&CpuBuffer) -> T) -> Arc<T> {
        let data = self.read();
        // No writer holds the lock while we hold `data`, so this stamp describes `data`.
        let stamp = self.0.writes.load(Ordering::Acquire);
        {
            let slot = self.0.derived.lock();
            if let Some(d) = slot.as_ref().filter(|d| d.writes == stamp && &*d.key == key) {
                if let Ok(v) = Arc::clone(&d.value).downcast::<T>() {
                    return v;
                }
            }
        }
        let value = Arc::new(make(&data));
        *self.0.derived.lock() = Some(Derived { writes: stamp, key: key.into(), value: value.clone() });
        value
    }
    /// The element type (fixed for the storage's life).
    pub fn dtype(&self) -> DType {
        self.read().dtype()
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.read().len()
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The current version (number of in-place writes so far).
    pub fn version(&self) -> u64 {
        self.0.version.load(Ordering::Acquire)
    }
    /// Records an in-place write.
    pub fn bump_version(&self) {
        self.0.version.fetch_add(1, Ordering::AcqRel);
    }
    /// `true` when this is the only handle to the buffer (no view or other tensor shares it).
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && Arc::weak_count(&self.0) == 0
    }
    /// `true` when both handles share one buffer.
    pub fn same(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    /// A stable identity for the buffer (for alias checks and tracing constants).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn storage_is_send_sync() {
        assert_send_sync::<Storage>();
    }

    #[test]
    fn derived_values_are_cached_per_key_and_invalidated_by_writes() {
        let s = Storage::from_vec(vec![1i64, 2, 3]);
        let calls = std::cell::Cell::new(0);
        let sum = |b: &CpuBuffer| {
            calls.set(calls.get() + 1);
            b.as_slice::<i64>().map(|v| v.iter().sum::<i64>()).unwrap_or(0)
        };
        assert_eq!(*s.derived(&[1], sum), 6);
        assert_eq!(*s.derived(&[1], sum), 6);
        assert_eq!(calls.get(), 1, "second lookup is cached");
        assert_eq!(*s.derived(&[2], sum), 6);
        assert_eq!(calls.get(), 2, "another key recomputes");
        if let Some(v) = s.write().as_mut_slice::<i64>() {
            v[0] = 10;
        }
        assert_eq!(*s.derived(&[2], sum), 15);
        assert_eq!(calls.get(), 3, "a write invalidates");
        // a different type under the same key is computed, not mis-cast
        assert_eq!(*s.derived(&[2], |_| "x"), "x");
    }
}
