//! Optimizers (`torch.optim`): [`Sgd`], [`Adam`], [`AdamW`] (Adam with decoupled weight decay),
//! [`RmsProp`]; LR schedulers ([`StepLR`], [`CosineAnnealingLR`], [`OneCycleLR`]); gradient
//! clipping ([`clip_grad_norm_`], [`clip_grad_value_`]); optimizer state save/load.
//!
//! An optimizer holds the parameter handles (`model.parameters()`), so its in-place updates
//! change the model. Updates are fused per-element loops over the parameter storage (PyTorch's
//! `foreach`/`fused` idea): they record no autograd history and bump the parameters' version
//! counters like any in-place op. Arithmetic is done in f64 per element and rounded to the
//! parameter dtype (f32/f64; other dtypes are rejected). One parameter group per optimizer.

mod clip;
mod optimizers;
mod sched;

pub use clip::{clip_grad_norm_, clip_grad_value_};
pub use optimizers::{Adam, AdamW, Optimizer, RmsProp, Sgd};
pub use sched::{CosineAnnealingLR, LrScheduler, OneCycleLR, StepLR};
