//! The autograd methods of [`Tensor`].

use super::hooks::{HookFn, HookHandle, HookKind};
use super::node::NodeRef;
use super::saved::detached_alias;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::Arc;

impl Tensor {
    /// `true` for leaves created with `requires_grad_(true)` and for every tensor with a
    /// `grad_fn`.
    #[inline]
    pub fn requires_grad(&self) -> bool {
        self.autograd_meta().requires_grad()
    }

    /// Sets `requires_grad` on a leaf (returns the tensor for chaining). Only floating point
    /// tensors can require gradients; non-leaves cannot change the flag (PyTorch's messages).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    /// assert!(x.requires_grad() && x.is_leaf());
    /// let i = Tensor::from_vec(vec![1i64], &[1]).unwrap();
    /// assert!(i.requires_grad_(true).unwrap_err().to_string().contains("only Tensors of floating point dtype can require gradients"));
    /// ```
    pub fn requires_grad_(&self, requires_grad: bool) -> Result<Tensor> {
        let meta = self.autograd_meta();
        if meta.lock().grad_fn.is_some() {
            if !requires_grad {
                return Err(Error::autograd(
                    "requires_grad_",
                    "you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().",
                ));
            }
            return Ok(self.clone());
        }
        if requires_grad && !self.dtype().is_floating_point() {
            return Err(Error::autograd(
                "requires_grad_",
                format!("only Tensors of floating point dtype can require gradients (got {})", self.dtype()),
            ));
        }
        meta.set_requires_grad_flag(requires_grad);
        Ok(self.clone())
    }

    /// The accumulated gradient (`.grad`).
    pub fn grad(&self) -> Option<Tensor> {
        self.autograd_meta().lock().grad.clone()
    }

    /// Replaces `.grad` (`None` clears it). The gradient must have this tensor's dtype and
    /// shape (PyTorch 2.15's messages; ferrofx tensors all live on the CPU, so the device
    /// check PyTorch also makes always passes).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    /// let e = x.set_grad(Some(Tensor::from_vec(vec![0.0f64; 2], &[2]).unwrap())).unwrap_err();
    /// assert!(e.to_string().contains("attempting to assign a gradient with dtype 'double' to a tensor with grad_dtype 'Float'"));
    /// let e = x.set_grad(Some(Tensor::from_vec(vec![0.0f32; 3], &[3]).unwrap())).unwrap_err();
    /// assert!(e.to_string().contains("attempting to assign a gradient of size '[3]' to a tensor of size '[2]'"));
    /// ```
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            if g.dtype() != self.dtype() {
                return Err(Error::dtype(
                    "set_grad",
                    format!(
                        "attempting to assign a gradient with dtype '{}' to a tensor with grad_dtype '{}'. The gradient must match the tensor's grad_dtype (defaults to the tensor's dtype).",
                        type_meta_name(g.dtype()),
                        crate::ops::num::torch_name(self.dtype())
                    ),
                ));
            }
            if g.shape() != self.shape() {
                return Err(Error::shape(
                    "set_grad",
                    format!(
                        "attempting to assign a gradient of size '{:?}' to a tensor of size '{:?}'. Please ensure that the gradient and the tensor are the same size",
                        g.shape(),
                        self.shape()
                    ),
                ));
            }
        }
        self.autograd_meta().lock().grad = grad;
        Ok(())
    }

    /// Clears `.grad` (PyTorch's `zero_grad(set_to_none=True)`, the default).
    pub fn zero_grad(&self) {
        self.autograd_meta().lock().grad = None;
    }

    /// The node that produced this tensor (`None` for leaves). A view whose base was modified
    /// in place since gets its `grad_fn` regenerated first (`AsStridedBackward0`), as in PyTorch.
    pub fn grad_fn(&self) -> Option<NodeRef> {
        if self.requires_grad() && self.autograd_meta().lock().view.is_some() {
            let _ = super::view::refresh_view_grad_fn(self);
        }
        self.autograd_meta().lock().grad_fn.clone()
    }

    /// `true` when the tensor has no `grad_fn` (created by the user, or not requiring grad).
    pub fn is_leaf(&self) -> bool {
        self.autograd_meta().lock().grad_fn.is_none()
    }

    /// Which output of its `grad_fn` this tensor is.
    pub fn output_nr(&self) -> u32 {
        self.autograd_meta().lock().output_nr
    }

    /// Keeps `.grad` for this non-leaf after backward (no-op on leaves).
    pub fn retain_grad(&self) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::autograd("retain_grad", "can't retain_grad on Tensor that has requires_grad=False"));
        }
        let (gf, nr) = {
            let mut m = self.autograd_meta().lock();
            if m.grad_fn.is_none() || m.retains_grad {
                return Ok(());
            }
            m.retains_grad = true;
            (m.grad_fn.clone(), m.output_nr)
        };
        if let Some(gf) = gf {
            let h = gf.base().hooks();
            if !h.has_retain_grad_for(self) {
                let _ = h.add(nr, HookKind::RetainGrad(Arc::downgrade(&self.0)));
            }
        }
        Ok(())
    }

    /// `true` after `retain_grad()` on a non-leaf.
    pub fn retains_grad(&self) -> bool {
        self.autograd_meta().lock().retains_grad
    }

    /// A new tensor sharing storage (and so the version counter) without history.
    pub fn detach(&self) -> Tensor {
        detached_alias(self)
    }

    /// Detaches in place: drops the history, making this a leaf that does not require grad.
    /// Views created with history cannot be detached in place (PyTorch's rule).
    pub fn detach_(&self) -> Result<Tensor> {
        let old = {
            let mut m = self.autograd_meta().lock();
            if m.view.is_some() && m.grad_fn.is_some() {
                return Err(Error::autograd("detach_", "Can't detach views in-place. Use detach() instead."));
            }
            m.output_nr = 0;
            m.grad_fn.take()
        };
        self.autograd_meta().set_requires_grad_flag(false);
        if let Some(o) = old {
            super::node::drop_node(o);
        }
        Ok(self.clone())
    }

    /// Registers a hook called with this tensor's gradient during backward; returning
    /// `Some(g)` replaces the gradient. The returned handle removes it.
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor) -> Option<Tensor> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        if !self.requires_grad() {
            return Err(Error::autograd(
                "register_hook",
                "cannot register a hook on a tensor that doesn't require gradient",
            ));
        }
        let f: Arc<HookFn> = Arc::new(hook);
        let mut m = self.autograd_meta().lock();
        match &m.grad_fn {
            Some(gf) => {
                let nr = m.output_nr;
                let gf = gf.clone();
                drop(m);
                Ok(gf.base().hooks().add(nr, HookKind::User(f)))
            }
            None => {
                let list = m.leaf_hooks.get_or_insert_with(Default::default).clone();
                drop(m);
                Ok(list.add(0, HookKind::User(f)))
            }
        }
    }

    /// PyTorch's `register_post_accumulate_grad_hook`: `hook` is called with this leaf after
    /// backward accumulated into its `.grad` (e.g. to step an optimizer per parameter). Only
    /// leaves requiring grad accept one (PyTorch's messages).
    ///
    /// ```
    /// use ferrofx_core::Tensor;
    /// use std::sync::{Arc, Mutex};
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    /// let seen = Arc::new(Mutex::new(vec![]));
    /// let s = seen.clone();
    /// w.register_post_accumulate_grad_hook(move |p| s.lock().unwrap().push(p.grad().unwrap().to_vec::<f32>().unwrap())).unwrap();
    /// w.mul(3.0).unwrap().sum().unwrap().backward(None, false, false).unwrap();
    /// assert_eq!(*seen.lock().unwrap(), vec![vec![3.0, 3.0]]);
    /// ```
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        if !self.requires_grad() {
            return Err(Error::autograd(
                "register_post_accumulate_grad_hook",
                "cannot register a hook on a tensor that doesn't require gradient",
            ));
        }
        let mut m = self.autograd_meta().lock();
        if m.grad_fn.is_some() {
            return Err(Error::autograd(
                "register_post_accumulate_grad_hook",
                "post accumulate grad hooks cannot be registered on non-leaf tensors",
            ));
        }
        let list = m.post_accumulate_hooks.get_or_insert_with(Default::default).clone();
        drop(m);
        let f: Arc<HookFn> = Arc::new(move |t: &Tensor| {
            hook(t);
            None
        });
        Ok(list.add(0, HookKind::User(f)))
    }

    /// Computes gradients of this tensor w.r.t. the graph leaves, accumulating into their
    /// `.grad`. `gradient` is required unless the tensor has one element. Without
    /// `retain_graph` (or `create_graph`, which implies it) the graph's saved tensors are freed.
    pub fn backward(&self, gradient: Option<&Tensor>, retain_graph: bool, create_graph: bool) -> Result<()> {
        super::backward(std::slice::from_ref(self), &[gradient.cloned()], retain_graph, create_graph)
    }
}

/// c10 `TypeMeta` names (`float`, `double`...), as PyTorch prints a gradient's dtype.
fn type_meta_name(d: crate::DType) -> &'static str {
    use crate::DType::*;
    match d {
        F32 => "float",
        F64 => "double",
        F16 => "c10::Half",
        BF16 => "c10::BFloat16",
        I64 => "long int",
        I32 => "int",
        I16 => "short int",
        I8 => "signed char",
        U8 => "unsigned char",
        Bool => "bool",
    }
}

impl Tensor {
    /// How many handles share this tensor object (for tests of graph memory: saved tensors
    /// hold handles until backward releases them).
    #[doc(hidden)]
    pub fn use_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}
