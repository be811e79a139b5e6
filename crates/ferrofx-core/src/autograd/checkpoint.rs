//! Activation checkpointing: PyTorch's `torch.utils.checkpoint.checkpoint(fn, *args,
//! use_reentrant=False)` and `checkpoint_sequential`.
//!
//! [`checkpoint`] runs `f` once in forward with [saved-tensor hooks](super::saved_hooks) that
//! keep only a numbered placeholder for every tensor the region's backward nodes save, so the
//! region's intermediate activations are freed as soon as forward no longer needs them. The
//! first time backward unpacks one of them, `f` is run again on the saved inputs (grad mode on,
//! the random-number generator set back to its state at the forward), and every tensor the
//! recomputation saves is matched, by position, with the placeholders. Semantics, as PyTorch's
//! non-reentrant variant:
//!
//! * **inputs** are saved as ordinary saved tensors: modifying one in place between forward and
//!   backward fails at backward with PyTorch's version-counter message, naming the tensor, its
//!   version and the version expected;
//! * **RNG**: with `preserve_rng_state` (the default) the recomputation draws the same numbers
//!   (dropout keeps the same mask), and the generator's state after backward is what it would
//!   have been without recomputation;
//! * **nesting** works (a checkpoint inside a checkpointed function is recomputed when the
//!   outer one's recomputation reaches it, and recomputes its own region when backward needs
//!   it);
//! * **hooks** fire once: the recomputation's graph is never run backward, so tensor and node
//!   hooks registered inside `f` fire for the original graph only;
//! * **`retain_graph`**: without it the placeholders are freed and a second backward fails with
//!   the usual message; with it, a second backward recomputes again;
//! * **no grad**: under `no_grad`, `f` simply runs;
//! * the recomputation must save the same tensors: fewer is an error (PyTorch's
//!   `CheckpointError` message), and with `determinism_check` a shape or dtype that differs is
//!   an error naming the position; extra tensors are ignored (PyTorch's early stop).
//!
//! Allocations of the recomputation count as [`Category::Activation`](crate::memory::tracking::Category)
//! in the tracked-allocator mode.
//!
//! ```
//! use ferrofx_core::autograd::checkpoint;
//! use ferrofx_core::Tensor;
//! let x = Tensor::from_vec(vec![0.5f32, 1.0], &[2]).unwrap().requires_grad_(true).unwrap();
//! let y = checkpoint(|xs: &[Tensor]| Ok(vec![xs[0].sin()?.mul(&xs[0])?.exp()?]), &[x.clone()]).unwrap();
//! y[0].sum().unwrap().backward(None, false, false).unwrap();
//! // d/dx exp(x sin x) = exp(x sin x) (sin x + x cos x)
//! let g = x.grad().unwrap().to_vec::<f32>().unwrap();
//! let want = |x: f32| (x * x.sin()).exp() * (x.sin() + x * x.cos());
//! assert!((g[0] - want(0.5)).abs() < 1e-6 && (g[1] - want(1.0)).abs() < 1e-5);
//! ```

use super::saved::SavedVariable;
use super::saved_hooks::{saved_tensors_hooks, Packed};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::tracking::{category_scope, Category};
use crate::ops::random::{current_generator, with_generator, Generator, GeneratorState};
use crate::tensor::Tensor;
use parking_lot::Mutex;
use std::sync::Arc;

/// The function a checkpoint runs (and reruns at backward): tensors in, tensors out.
pub type CheckpointFn = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync;

/// One stage of [`checkpoint_sequential`].
pub type SequentialFn = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// Options of [`checkpoint_with`] (keyword arguments of `torch.utils.checkpoint.checkpoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// Replay the random-number generator's state in the recomputation (default `true`).
    pub preserve_rng_state: bool,
    /// Check that the recomputed tensors have the shapes and dtypes saved in forward (default
    /// `true`, PyTorch's `determinism_check="default"`).
    pub determinism_check: bool,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        CheckpointOptions { preserve_rng_state: true, determinism_check: true }
    }
}

/// The state of one checkpointed call (PyTorch's `_CheckpointFrame`).
struct Frame {
    f: Arc<CheckpointFn>,
    /// The inputs, saved as backward saves tensors (version check; an outer checkpoint's hooks).
    inputs: Vec<SavedVariable>,
    input_requires_grad: Vec<bool>,
    rng: Option<(Generator, GeneratorState)>,
    opts: CheckpointOptions,
    /// Shape and dtype of each tensor saved in forward, by position.
    saved_meta: Mutex<Vec<(Vec<usize>, DType)>>,
    /// Recomputed tensors not yet unpacked, by position.
    recomputed: Mutex<Vec<Option<Tensor>>>,
}

/// What a checkpointed region's backward node keeps for each tensor it saved: the position of
/// the tensor among the region's saved tensors, and the region's frame.
struct Placeholder {
    idx: usize,
    frame: Arc<Frame>,
}

const TIP: &str = "Tip: the function given to checkpoint must compute the same thing when it is run again at backward (no dependence on state that changes between forward and backward, no data-dependent control flow that can differ).";

impl Frame {
    fn unpack(&self, idx: usize) -> Result<Tensor> {
        if let Some(t) = self.recomputed.lock().get_mut(idx).and_then(Option::take) {
            return Ok(t);
        }
        self.recompute()?;
        self.recomputed.lock().get_mut(idx).and_then(Option::take).ok_or_else(|| {
            Error::autograd(
                "checkpoint",
                format!("torch.utils.checkpoint: the recomputation did not produce saved tensor {idx}. {TIP}"),
            )
        })
    }

    fn recompute(&self) -> Result<()> {
        let mut detached = Vec::with_capacity(self.inputs.len());
        for (s, &rg) in self.inputs.iter().zip(&self.input_requires_grad) {
            let t = s.unpack(None, false)?.detach();
            detached.push(if rg { t.requires_grad_(true)? } else { t });
        }
        let sink: Arc<Mutex<Vec<Tensor>>> = Arc::default();
        let out = {
            let _grad = super::enable_grad();
            let _mem = category_scope(Category::Activation);
            let s = sink.clone();
            let _hooks = saved_tensors_hooks(
                move |t| {
                    s.lock().push(t.detach());
                    Box::new(()) as Packed
                },
                |_| {
                    Err(Error::autograd(
                        "checkpoint",
                        "torch.utils.checkpoint: a tensor saved during recomputation was unpacked (backward through the recomputed graph is not supported)",
                    ))
                },
            );
            match &self.rng {
                Some((g, state)) => {
                    let now = g.get_state();
                    g.set_state(state);
                    let out = with_generator(g, || (self.f)(&detached));
                    g.set_state(&now);
                    out
                }
                None => (self.f)(&detached),
            }
        };
        // The recomputed outputs (and their graph) are not needed: only what was saved.
        drop(out?);
        let got = std::mem::take(&mut *sink.lock());
        let meta = self.saved_meta.lock();
        if got.len() < meta.len() {
            return Err(Error::autograd(
                "checkpoint",
                format!(
                    "torch.utils.checkpoint: A different number of tensors was saved during the original forward and recomputation.\nNumber of tensors saved during forward: {}\nNumber of tensors saved during recomputation: {}.\n{TIP}",
                    meta.len(),
                    got.len()
                ),
            ));
        }
        if self.opts.determinism_check {
            for (i, ((shape, dtype), t)) in meta.iter().zip(&got).enumerate() {
                if t.shape() != shape.as_slice() || t.dtype() != *dtype {
                    return Err(Error::autograd(
                        "checkpoint",
                        format!(
                            "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during the forward pass.\ntensor at position {i}:\nsaved metadata: {{'shape': {shape:?}, 'dtype': {dtype}}}\nrecomputed metadata: {{'shape': {:?}, 'dtype': {}}}\n{TIP}",
                            t.shape(),
                            t.dtype()
                        ),
                    ));
                }
            }
        }
        let n = meta.len();
        *self.recomputed.lock() = got.into_iter().take(n).map(Some).collect();
        Ok(())
    }
}

/// `torch.utils.checkpoint.checkpoint(f, *inputs, use_reentrant=False)` with the default
/// options: see the module documentation.
pub fn checkpoint(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>> {
    checkpoint_with(f, inputs, CheckpointOptions::default())
}

/// [`checkpoint`] with options (`preserve_rng_state`, `determinism_check`).
pub fn checkpoint_with(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    inputs: &[Tensor],
    opts: CheckpointOptions,
) -> Result<Vec<Tensor>> {
    if !super::is_grad_enabled() {
        return f(inputs);
    }
    let rng = opts.preserve_rng_state.then(|| {
        let g = current_generator();
        let s = g.get_state();
        (g, s)
    });
    let f: Arc<CheckpointFn> = Arc::new(f);
    let frame = Arc::new(Frame {
        f: f.clone(),
        // Saved before this checkpoint's hooks are active: an outer checkpoint packs them.
        inputs: inputs.iter().map(SavedVariable::input).collect(),
        input_requires_grad: inputs.iter().map(|t| t.requires_grad()).collect(),
        rng,
        opts,
        saved_meta: Mutex::new(Vec::new()),
        recomputed: Mutex::new(Vec::new()),
    });
    // The placeholders own the frame (its saved inputs, the recomputed tensors not yet read):
    // backward frees a node's placeholders after running it (unless `retain_graph`), so the
    // frame and the region's inputs go as soon as the region's backward is done, not when the
    // whole graph is dropped. The hooks themselves only point to it (a saved variable keeps its
    // hook pair after release).
    let pack_frame = Arc::downgrade(&frame);
    let _hooks = saved_tensors_hooks(
        move |t| match pack_frame.upgrade() {
            Some(frame) => {
                let idx = {
                    let mut m = frame.saved_meta.lock();
                    m.push((t.shape().to_vec(), t.dtype()));
                    m.len() - 1
                };
                Box::new(Placeholder { idx, frame }) as Packed
            }
            // cannot happen: the hooks are active only while `frame` below is alive
            None => Box::new(()) as Packed,
        },
        |p| {
            let ph = p.downcast_ref::<Placeholder>().ok_or_else(|| {
                Error::autograd("checkpoint", "torch.utils.checkpoint: a saved tensor has a foreign placeholder")
            })?;
            ph.frame.unpack(ph.idx)
        },
    );
    let out = f(inputs);
    drop(frame);
    out
}

/// `torch.utils.checkpoint.checkpoint_sequential(functions, segments, input,
/// use_reentrant=False)`: runs `functions` in order, split into `segments` runs of
/// `functions.len() / segments` functions; every run but the last is checkpointed (the last
/// one's activations are needed by backward at once).
///
/// ```
/// use ferrofx_core::autograd::{checkpoint_sequential, SequentialFn};
/// use ferrofx_core::Tensor;
/// use std::sync::Arc;
/// let fs: Vec<SequentialFn> = vec![Arc::new(|t: &Tensor| t.sin()), Arc::new(|t: &Tensor| t.exp()), Arc::new(|t: &Tensor| t.mul(t))];
/// let x = Tensor::from_vec(vec![0.3f32], &[1]).unwrap().requires_grad_(true).unwrap();
/// checkpoint_sequential(&fs, 2, &x).unwrap().sum().unwrap().backward(None, false, false).unwrap();
/// let want = 2.0 * (2.0 * 0.3f32.sin()).exp() * 0.3f32.cos(); // d/dx exp(sin x)^2
/// assert!((x.grad().unwrap().item().unwrap() - want as f64).abs() < 1e-6);
/// ```
pub fn checkpoint_sequential(functions: &[SequentialFn], segments: usize, input: &Tensor) -> Result<Tensor> {
    if segments == 0 || segments > functions.len() {
        return Err(Error::argument(
            "checkpoint_sequential",
            format!("segments must be between 1 and the number of functions ({}), got {segments}", functions.len()),
        ));
    }
    let size = functions.len() / segments;
    let mut x = input.clone();
    let mut start = 0;
    for _ in 0..segments - 1 {
        let run: Vec<SequentialFn> = functions[start..start + size].to_vec();
        let out = checkpoint(
            move |xs: &[Tensor]| {
                let mut t = xs[0].clone();
                for f in &run {
                    t = f(&t)?;
                }
                Ok(vec![t])
            },
            &[x],
        )?;
        x = out
            .into_iter()
            .next()
            .ok_or_else(|| Error::autograd("checkpoint_sequential", "a checkpointed segment returned no tensor"))?;
        start += size;
    }
    for f in &functions[start..] {
        x = f(&x)?;
    }
    Ok(x)
}
