//! Tracked-allocator mode: live and peak tensor bytes, by category (PyTorch's memory profiler
//! categories: parameters, gradients, optimizer state, activations; everything else is
//! `Other`).
//!
//! Every tensor buffer is a [`Storage`](crate::storage::Storage); while a [`MemoryTracker`] is
//! active on the current thread, each storage created on that thread is counted (its element
//! count × element size) under the thread's current [`Category`] until the storage is freed
//! (views share their base's storage and cost nothing). The category is set by a scoped guard,
//! [`category_scope`]; the autograd engine puts what it allocates during `backward` under
//! [`Category::Gradient`], and activation checkpointing puts what it recomputes under
//! [`Category::Activation`].
//!
//! Off, the cost is one relaxed atomic load per storage created (no tracker anywhere in the
//! process) and nothing per storage freed.
//!
//! What is counted: storages created on a thread while a tracker is active there (ferrofx's
//! kernels compute in parallel but create their output storage on the calling thread).
//! Trackers nest: an allocation counts in the innermost tracker of its thread.
//!
//! ```
//! use ferrofx_core::memory::tracking::{category_scope, Category, MemoryTracker};
//! use ferrofx_core::Tensor;
//! let tracker = MemoryTracker::start();
//! let w = {
//!     let _c = category_scope(Category::Parameter);
//!     Tensor::from_vec(vec![0.0f32; 256], &[16, 16]).unwrap() // 1 KiB of parameters
//! };
//! {
//!     let _c = category_scope(Category::Activation);
//!     let h = w.mul(2.0).unwrap(); // 1 KiB
//!     let _h2 = h.add(1.0).unwrap(); // 1 KiB more while h is alive
//! } // both freed here
//! let s = tracker.stats();
//! assert_eq!(s.live(Category::Parameter), 1024);
//! assert_eq!(s.peak(Category::Activation), 2048);
//! assert_eq!(s.live(Category::Activation), 0);
//! assert_eq!(s.peak_total(), 3072);
//! ```

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// What a tensor buffer is for (PyTorch's `torch.profiler._memory_profiler.Category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// Model parameters (and buffers such as BatchNorm's running statistics).
    Parameter,
    /// Gradients, and everything the backward pass allocates.
    Gradient,
    /// Optimizer state (Adam's moments) and the optimizer's step.
    OptimizerState,
    /// What the forward pass allocates: the activations saved for backward and the forward's
    /// temporaries.
    Activation,
    /// Anything allocated outside a category scope (input batches, evaluation, ...).
    Other,
}

impl Category {
    /// Every category, in display order.
    pub const ALL: [Category; 5] =
        [Category::Parameter, Category::Gradient, Category::OptimizerState, Category::Activation, Category::Other];

    fn index(self) -> usize {
        self as usize
    }

    /// The lower-case name (`"optimizer state"`).
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameters",
            Category::Gradient => "gradients",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activations",
            Category::Other => "other",
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

const N: usize = Category::ALL.len();

#[derive(Default)]
struct Counters {
    live: [AtomicUsize; N],
    peak: [AtomicUsize; N],
    live_total: AtomicUsize,
    peak_total: AtomicUsize,
    allocations: AtomicU64,
}

impl Counters {
    fn add(&self, c: usize, bytes: usize) {
        let now = self.live[c].fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak[c].fetch_max(now, Ordering::Relaxed);
        let total = self.live_total.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_total.fetch_max(total, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }
    fn sub(&self, c: usize, bytes: usize) {
        self.live[c].fetch_sub(bytes, Ordering::Relaxed);
        self.live_total.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Number of trackers active anywhere in the process (the fast path's only check).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static TRACKERS: RefCell<Vec<Arc<Counters>>> = const { RefCell::new(Vec::new()) };
    static CATEGORY: Cell<Category> = const { Cell::new(Category::Other) };
}

/// The record of one counted buffer, kept by its storage: freeing the storage uncounts it
/// (on whatever thread that happens).
pub struct Tracked {
    counters: Arc<Counters>,
    category: Category,
    bytes: usize,
}

impl std::fmt::Debug for Tracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tracked({} bytes of {})", self.bytes, self.category)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.counters.sub(self.category.index(), self.bytes);
    }
}

/// Counts a new buffer of `bytes` when a tracker is active on this thread (called by
/// `Storage::new`).
#[inline]
pub(crate) fn on_alloc(bytes: usize) -> Option<Tracked> {
    if ACTIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    on_alloc_slow(bytes)
}

#[cold]
fn on_alloc_slow(bytes: usize) -> Option<Tracked> {
    let counters = TRACKERS.try_with(|t| t.borrow().last().cloned()).ok().flatten()?;
    let category = current_category();
    counters.add(category.index(), bytes);
    Some(Tracked { counters, category, bytes })
}

/// The category new buffers of this thread are counted under.
pub fn current_category() -> Category {
    CATEGORY.try_with(|c| c.get()).unwrap_or(Category::Other)
}

/// Restores the previous category when dropped (see [`category_scope`]).
#[must_use = "the category is reset when the guard is dropped"]
pub struct CategoryGuard {
    prev: Category,
    _not_send: PhantomData<*const ()>,
}

impl Drop for CategoryGuard {
    fn drop(&mut self) {
        let _ = CATEGORY.try_with(|c| c.set(self.prev));
    }
}

/// Counts the buffers this thread creates under `category` until the guard is dropped
/// (scopes nest; the innermost wins).
pub fn category_scope(category: Category) -> CategoryGuard {
    let prev = CATEGORY.with(|c| c.replace(category));
    CategoryGuard { prev, _not_send: PhantomData }
}

/// An active tracking session on the current thread: from [`MemoryTracker::start`] until it
/// is dropped, the storages this thread creates are counted in it. Buffers counted stay
/// counted until they are freed, even after the tracker is dropped.
pub struct MemoryTracker {
    counters: Arc<Counters>,
    _not_send: PhantomData<*const ()>,
}

impl MemoryTracker {
    /// Starts counting the buffers created on this thread.
    pub fn start() -> MemoryTracker {
        let counters = Arc::new(Counters::default());
        TRACKERS.with(|t| t.borrow_mut().push(counters.clone()));
        ACTIVE.fetch_add(1, Ordering::Relaxed);
        MemoryTracker { counters, _not_send: PhantomData }
    }

    /// The figures so far.
    pub fn stats(&self) -> MemoryStats {
        let c = &self.counters;
        let load = |a: &[AtomicUsize; N]| std::array::from_fn(|i| a[i].load(Ordering::Relaxed));
        MemoryStats {
            live: load(&c.live),
            peak: load(&c.peak),
            live_total: c.live_total.load(Ordering::Relaxed),
            peak_total: c.peak_total.load(Ordering::Relaxed),
            allocations: c.allocations.load(Ordering::Relaxed),
        }
    }

    /// Sets every peak to the current live figure (`torch.cuda.reset_peak_memory_stats`): to
    /// measure one phase (a training step) after setup.
    pub fn reset_peak(&self) {
        let c = &self.counters;
        for i in 0..N {
            c.peak[i].store(c.live[i].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        c.peak_total.store(c.live_total.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Drop for MemoryTracker {
    fn drop(&mut self) {
        let _ = TRACKERS.try_with(|t| {
            let mut t = t.borrow_mut();
            if let Some(i) = t.iter().rposition(|c| Arc::ptr_eq(c, &self.counters)) {
                t.remove(i);
            }
        });
        ACTIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A snapshot of a [`MemoryTracker`]'s figures, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    live: [usize; N],
    peak: [usize; N],
    live_total: usize,
    peak_total: usize,
    allocations: u64,
}

impl MemoryStats {
    /// Bytes of `category` alive now.
    pub fn live(&self, category: Category) -> usize {
        self.live[category.index()]
    }
    /// The most bytes of `category` alive at once.
    pub fn peak(&self, category: Category) -> usize {
        self.peak[category.index()]
    }
    /// Bytes of every category alive now.
    pub fn live_total(&self) -> usize {
        self.live_total
    }
    /// The most bytes alive at once, all categories together (not the sum of the per-category
    /// peaks, which need not coincide).
    pub fn peak_total(&self) -> usize {
        self.peak_total
    }
    /// Buffers counted.
    pub fn allocations(&self) -> u64 {
        self.allocations
    }
}

impl std::fmt::Display for MemoryStats {
    /// `peak 1.2 MiB (parameters 10.0 KiB, gradients ..., ...)`: per-category peaks.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peak {} (", super::format_bytes(self.peak_total as u128))?;
        for (i, c) in Category::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} {}", c.name(), super::format_bytes(self.peak(*c) as u128))?;
        }
        f.write_str(")")
    }
}
