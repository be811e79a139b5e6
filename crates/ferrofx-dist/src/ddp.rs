//! `DistributedDataParallel`: PyTorch's DDP over a [`ProcessGroup`].
//!
//! Every rank holds the whole model and runs it on its share of each global batch; after the
//! backward pass every parameter's gradient is the mean over all ranks, so the optimizer steps
//! equal on every rank and equal to one process running the whole batch.
//!
//! * **Same start.** Construction checks that every rank holds the same model (names, shapes
//!   and dtypes of its parameters and buffers; a rank with a different model is named in the
//!   error) and copies rank 0's parameters and buffers to the others.
//! * **Buckets, launched from autograd hooks.** Parameters are grouped, in reverse order of
//!   `parameters()` (roughly the order backward produces their gradients), into buckets of at
//!   most `bucket_cap_bytes` (PyTorch's 25 MiB by default). A post-accumulate-grad hook on each
//!   parameter marks it ready; when a bucket is complete its gradients are flattened and its
//!   all-reduce starts on the communication thread while backward goes on. Buckets start in
//!   bucket order on every rank (MPI requires the same order everywhere).
//! * **Finish.** [`DistributedDataParallel::backward`] runs backward, starts the buckets that
//!   unused parameters kept from starting (their gradients count as zero), waits for every
//!   bucket, and writes the averaged gradients back.
//! * **`no_sync`.** Inside [`DistributedDataParallel::no_sync`] gradients accumulate locally;
//!   the next synchronised backward averages the accumulated sums (gradient accumulation).
//!
//! For equality with one process, give each rank an equal share of every global batch
//! ([`crate::DistributedSampler`] or [`shard_rows`]) and average the loss over the local share:
//! the mean of the ranks' mean gradients is then the global mean gradient.

use crate::process_group::{PendingReduce, ProcessGroup};
use ferrofx_core::autograd::HookHandle;
use ferrofx_core::{DType, Error, Result, Tensor};
use ferrofx_nn::Module;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// PyTorch's default bucket size (25 MiB).
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

struct Bucket {
    params: Vec<usize>,
}

#[derive(Default)]
struct SyncState {
    ready: Vec<bool>,
    bucket_ready: Vec<usize>,
    next_launch: usize,
    pending: Vec<Option<PendingReduce>>,
    error: Option<String>,
}

struct Shared {
    pg: Arc<ProcessGroup>,
    params: Vec<Tensor>,
    buckets: Vec<Bucket>,
    bucket_of: Vec<usize>,
    state: Mutex<SyncState>,
    sync: AtomicBool,
    reduction: Mutex<Reduction>,
}

/// How the ranks' gradients are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean over ranks (PyTorch's DDP): right when every rank's loss is the mean over an
    /// equal share of the global batch.
    #[default]
    Mean,
    /// The sum over ranks: right when each rank's loss is already its share of the global loss
    /// (e.g. the sum over its rows divided by the global batch size), which also handles
    /// unequal shares exactly.
    Sum,
}

/// Data-parallel training of `M` across the ranks of a [`ProcessGroup`]. See the module docs.
pub struct DistributedDataParallel<M: Module> {
    module: M,
    shared: Arc<Shared>,
    _hooks: Vec<HookHandle>,
}

impl Shared {
    /// Starts every complete bucket from `next_launch` on, in order.
    fn launch_ready(&self, st: &mut SyncState) {
        while st.next_launch < self.buckets.len() {
            let b = st.next_launch;
            if st.bucket_ready[b] < self.buckets[b].params.len() {
                break;
            }
            self.launch(st, b);
            st.next_launch += 1;
        }
    }

    fn launch(&self, st: &mut SyncState, b: usize) {
        let params = &self.buckets[b].params;
        let mut flat = Vec::with_capacity(params.iter().map(|&i| self.params[i].numel()).sum());
        for &i in params {
            let p = &self.params[i];
            // the gradient's values go straight into the bucket (no intermediate copy); a
            // parameter without a gradient counts as zeros
            let copied = match p.grad() {
                Some(g) if g.numel() == p.numel() => {
                    g.with_contiguous::<f32, _>("DistributedDataParallel", |v| flat.extend_from_slice(v))
                }
                Some(g) => Err(Error::shape(
                    "DistributedDataParallel",
                    format!("a gradient of shape {:?} for a parameter of shape {:?}", g.shape(), p.shape()),
                )),
                None => {
                    flat.extend(std::iter::repeat_n(0.0, p.numel()));
                    Ok(())
                }
            };
            if let Err(e) = copied {
                st.error.get_or_insert_with(|| e.to_string());
                flat.extend(std::iter::repeat_n(0.0, p.numel()));
            }
        }
        match self.pg.all_reduce_sum_async(flat) {
            Ok(p) => st.pending[b] = Some(p),
            Err(e) => {
                st.error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn on_grad_ready(&self, i: usize) {
        if !self.sync.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut st) = self.state.lock() else { return };
        if st.ready.get(i).copied().unwrap_or(true) {
            return;
        }
        st.ready[i] = true;
        let b = self.bucket_of[i];
        st.bucket_ready[b] += 1;
        self.launch_ready(&mut st);
    }

    fn reset(&self, st: &mut SyncState) {
        st.ready = vec![false; self.params.len()];
        st.bucket_ready = vec![0; self.buckets.len()];
        st.next_launch = 0;
        st.pending = (0..self.buckets.len()).map(|_| None).collect();
        st.error = None;
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` with PyTorch's default bucket size. Every rank must call it (it
    /// communicates).
    pub fn new(module: M, pg: Arc<ProcessGroup>) -> Result<Self> {
        Self::with_bucket_cap(module, pg, DEFAULT_BUCKET_CAP_BYTES)
    }

    /// Wraps `module` with buckets of at most `bucket_cap_bytes` (a parameter larger than the
    /// cap gets a bucket of its own).
    pub fn with_bucket_cap(module: M, pg: Arc<ProcessGroup>, bucket_cap_bytes: usize) -> Result<Self> {
        let named = module.named_parameters();
        let buffers = module.named_buffers();
        for (name, t) in named.iter().chain(&buffers) {
            if t.dtype() != DType::F32 && t.dtype().is_floating_point() {
                return Err(Error::dtype(
                    "DistributedDataParallel",
                    format!("'{name}' is {}: data parallel training handles float32 parameters", t.dtype()),
                ));
            }
        }
        // 1. the same model on every rank; 2. rank 0's values everywhere
        broadcast_module(&module, &pg)?;
        // 3. buckets in reverse parameter order
        let params: Vec<Tensor> = named.into_iter().map(|(_, t)| t).filter(|t| t.requires_grad()).collect();
        let mut buckets: Vec<Bucket> = vec![];
        let mut bucket_of = vec![0usize; params.len()];
        let mut bytes = 0usize;
        for i in (0..params.len()).rev() {
            let b = params[i].numel() * 4;
            if buckets.is_empty() || (bytes + b > bucket_cap_bytes && bytes > 0) {
                buckets.push(Bucket { params: vec![] });
                bytes = 0;
            }
            bytes += b;
            let last = buckets.len() - 1;
            buckets[last].params.push(i);
            bucket_of[i] = last;
        }
        let shared = Arc::new(Shared {
            pg,
            params,
            buckets,
            bucket_of,
            state: Mutex::new(SyncState::default()),
            sync: AtomicBool::new(true),
            reduction: Mutex::new(Reduction::Mean),
        });
        if let Ok(mut st) = shared.state.lock() {
            shared.reset(&mut st);
        }
        let mut hooks = Vec::with_capacity(shared.params.len());
        for (i, p) in shared.params.iter().enumerate() {
            let weak = Arc::downgrade(&shared);
            hooks.push(p.register_post_accumulate_grad_hook(move |_| {
                if let Some(s) = weak.upgrade() {
                    s.on_grad_ready(i);
                }
            })?);
        }
        Ok(DistributedDataParallel { module, shared, _hooks: hooks })
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, mutably (e.g. to switch train/eval mode).
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// Unwraps the module.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The process group.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.shared.pg
    }

    /// Number of gradient buckets (parameters per bucket in reverse order).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.shared.buckets.iter().map(|b| b.params.len()).collect()
    }

    /// Sets how gradients are combined (mean by default, as PyTorch).
    pub fn set_reduction(&self, reduction: Reduction) {
        if let Ok(mut r) = self.shared.reduction.lock() {
            *r = reduction;
        }
    }

    /// The module's forward.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.module.forward(x)
    }

    /// Backward of `loss` (a scalar), then the gradient all-reduce: on return every parameter's
    /// `.grad` is the mean over the ranks (unless inside [`DistributedDataParallel::no_sync`],
    /// where gradients only accumulate locally).
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        if self.shared.pg.world_size() == 1 {
            // a job of one rank: the mean over one rank is the gradient itself (no flattening,
            // no copies)
            return loss.backward(None, false, false);
        }
        let syncing = self.shared.sync.load(Ordering::SeqCst);
        if syncing {
            if let Ok(mut st) = self.shared.state.lock() {
                self.shared.reset(&mut st);
            }
        }
        loss.backward(None, false, false)?;
        if syncing {
            self.finish()?;
        }
        Ok(())
    }

    fn finish(&self) -> Result<()> {
        let s = &self.shared;
        let pending = {
            let mut st =
                s.state.lock().map_err(|_| Error::argument("DistributedDataParallel", "gradient state poisoned"))?;
            // buckets held back by parameters that got no gradient: launch them, in order
            while st.next_launch < s.buckets.len() {
                let b = st.next_launch;
                s.launch(&mut st, b);
                st.next_launch += 1;
            }
            if let Some(e) = st.error.take() {
                return Err(Error::argument("DistributedDataParallel", e));
            }
            std::mem::take(&mut st.pending)
        };
        let n = match s.reduction.lock().map(|r| *r).unwrap_or_default() {
            Reduction::Mean => s.pg.world_size() as f32,
            Reduction::Sum => 1.0,
        };
        let _g = ferrofx_core::autograd::no_grad();
        for (b, p) in pending.into_iter().enumerate() {
            let p =
                p.ok_or_else(|| Error::argument("DistributedDataParallel", format!("bucket {b} was never started")))?;
            let sum = s.pg.wait(p)?;
            let mut off = 0usize;
            for &i in &s.buckets[b].params {
                let t = &s.params[i];
                let len = t.numel();
                let part = &sum[off..off + len];
                let avg: Vec<f32> = if n == 1.0 { part.to_vec() } else { part.iter().map(|v| v / n).collect() };
                off += len;
                t.set_grad(Some(Tensor::from_vec(avg, t.shape())?))?;
            }
        }
        if let Ok(mut st) = s.state.lock() {
            s.reset(&mut st);
        }
        Ok(())
    }

    /// Runs `f` with gradient synchronisation off (PyTorch's `no_sync()` context): backward
    /// passes inside only accumulate local gradients; the first synchronised backward after it
    /// averages the accumulated gradients.
    pub fn no_sync<R>(&self, f: impl FnOnce(&Self) -> R) -> R {
        struct Restore<'a>(&'a AtomicBool);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        self.shared.sync.store(false, Ordering::SeqCst);
        let _r = Restore(&self.shared.sync);
        f(self)
    }
}

/// DDP's start: checks that every rank holds the same model (names, shapes and dtypes of its
/// parameters and buffers; a rank with a different model is named in the error) and copies rank
/// 0's float32 parameters and buffers to every rank. Every rank must call it (it communicates).
pub fn broadcast_module(module: &dyn Module, pg: &ProcessGroup) -> Result<()> {
    let named = module.named_parameters();
    let buffers = module.named_buffers();
    // 1. the same model on every rank
    let mut sig = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |bytes: &[u8]| {
        for &b in bytes {
            sig ^= b as u64;
            sig = sig.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (name, t) in named.iter().chain(&buffers) {
        mix(name.as_bytes());
        mix(format!("{:?}{}", t.shape(), t.dtype()).as_bytes());
    }
    let sigs = pg.all_gather_u64(sig)?;
    if let Some(bad) = sigs.iter().position(|&s| s != sigs[0]) {
        return Err(Error::argument(
            "DistributedDataParallel",
            format!(
                "rank {bad} holds a different model from rank 0 (parameter or buffer names, shapes or dtypes \
                     differ; {} parameters and {} buffers here on rank {}): every rank must build the same model",
                named.len(),
                buffers.len(),
                pg.rank()
            ),
        ));
    }
    // 2. rank 0's values everywhere
    if pg.world_size() > 1 {
        let _g = ferrofx_core::autograd::no_grad();
        for (name, t) in named.iter().chain(&buffers) {
            if t.dtype() != DType::F32 {
                continue;
            }
            let data = pg.broadcast(0, t.to_vec::<f32>()?)?;
            let src = Tensor::from_vec(data, t.shape())
                .map_err(|e| Error::argument("DistributedDataParallel", format!("'{name}': {e}")))?;
            t.copy_(&src)?;
        }
    }
    Ok(())
}

/// Rows `[start, end)` of a global batch of `n` rows that rank `rank` of `world` takes: equal
/// contiguous shares (the first `n % world` ranks take one more row).
pub fn shard_rows(n: usize, rank: usize, world: usize) -> (usize, usize) {
    ferrofx_nn::batch_shards::shard_rows(n, world, rank)
}
