//! [`SavedVariable`]: a tensor saved for backward, with the version counter value at save time.

use super::node::NodeRef;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// PyTorch's message when saved tensors were already freed.
pub const SECOND_BACKWARD_MSG: &str = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.";

/// A tensor saved by a node for its backward formula.
///
/// Inputs are saved as the original tensor (so higher-order graphs connect through their
/// history). Outputs are saved as a storage alias *without* history, which avoids the cycle
/// output → grad_fn → saved output; on unpack the alias is given the saving node as `grad_fn`.
///
/// While [saved-tensor hooks](super::saved_tensors_hooks) are active, the tensor is handed to
/// the pack hook and only what it returns is kept (see [`super::saved_hooks`]).
pub struct SavedVariable {
    data: Option<Tensor>,
    hooked: Option<Box<Hooked>>,
    version: u64,
    output_nr: u32,
    is_output: bool,
    requires_grad: bool,
}

impl SavedVariable {
    /// Saves a forward input.
    pub fn input(t: &Tensor) -> SavedVariable {
        SavedVariable {
            version: t.version(),
            data: Some(t.clone()),
            hooked: None,
            output_nr: 0,
            is_output: false,
            requires_grad: false,
        }
        .pack_if_hooked()
    }

    /// Saves output `output_nr` of the node that will own this saved variable.
    pub fn output(t: &Tensor, output_nr: u32) -> SavedVariable {
        let alias = detached_alias(t);
        SavedVariable {
            version: t.version(),
            data: Some(alias),
            hooked: None,
            output_nr,
            is_output: true,
            requires_grad: t.requires_grad(),
        }
        .pack_if_hooked()
    }

    /// Hands the tensor to the active pack hook, if any, keeping what it returns (and, for a
    /// saved input, the handle of its history, to reconnect it under `create_graph`).
    fn pack_if_hooked(mut self) -> SavedVariable {
        let Some(hooks) = super::saved_hooks::current() else {
            return self;
        };
        let Some(t) = self.data.take() else {
            return self;
        };
        let history = if self.is_output {
            History::None
        } else if let Some(g) = t.grad_fn() {
            History::Node(g, t.output_nr())
        } else if t.requires_grad() {
            History::Leaf(t.clone())
        } else {
            History::None
        };
        let packed = (hooks.pack)(&t);
        self.hooked = Some(Box::new(Hooked { hooks, packed: Some(packed), history }));
        self
    }

    /// Saves output `output_nr` of a node being created: `will_require_grad` says whether the
    /// output gets history (its flag is set only after the node exists), so the unpacked alias
    /// gets the node back as grad_fn under `create_graph`.
    pub(crate) fn output_of_new_node(t: &Tensor, output_nr: u32, will_require_grad: bool) -> SavedVariable {
        let mut s = SavedVariable::output(t, output_nr);
        s.requires_grad = will_require_grad;
        s
    }

    /// Saves `t`, as an output of `owner` when `t`'s grad_fn is `owner` (custom functions).
    pub(crate) fn auto(t: &Tensor, is_output_of_owner: Option<u32>) -> SavedVariable {
        match is_output_of_owner {
            Some(nr) => SavedVariable::output(t, nr),
            None => SavedVariable::input(t),
        }
    }

    /// Re-records the version of a saved tensor that does not require grad (state an op
    /// updates as a side effect, like batch_norm's running statistics, is saved as it is after
    /// the op).
    pub(crate) fn refresh_version_if_no_grad(&mut self) {
        if let Some(t) = &self.data {
            if !t.requires_grad() {
                self.version = t.version();
            }
        }
    }

    /// `true` once freed by `release`.
    pub fn is_released(&self) -> bool {
        match &self.hooked {
            Some(h) => h.packed.is_none(),
            None => self.data.is_none(),
        }
    }

    /// Frees the tensor (or what the pack hook returned).
    pub fn release(&mut self) {
        self.data = None;
        if let Some(h) = &mut self.hooked {
            h.packed = None;
            h.history = History::None;
        }
    }

    /// The saved tensor, checking it was not freed nor modified in place since it was saved.
    /// `owner` is the node that saved it (saved outputs get it back as grad_fn when
    /// `create_graph`).
    pub fn unpack(&self, owner: Option<&NodeRef>, create_graph: bool) -> Result<Tensor> {
        if let Some(h) = &self.hooked {
            return self.unpack_hooked(h, owner, create_graph);
        }
        let Some(t) = &self.data else {
            return Err(Error::autograd("backward", SECOND_BACKWARD_MSG));
        };
        let now = t.version();
        if now != self.version {
            let mut what = format!("[torch.{} {:?}]", legacy_type_name(t.dtype()), t.shape());
            let gf = if self.is_output {
                owner.cloned().map(|o| (o, self.output_nr))
            } else {
                t.grad_fn().map(|g| (g, t.output_nr()))
            };
            if let Some((g, nr)) = gf {
                let name = g.name();
                let short = name.split("Backward").next().unwrap_or(&name).to_string();
                what = format!("{what}, which is output {nr} of {short},");
            }
            return Err(Error::autograd(
                "backward",
                format!(
                    "one of the variables needed for gradient computation has been modified by an inplace operation: {what} is at version {now}; expected version {} instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, with ferrofx_core::autograd::set_detect_anomaly(true).",
                    self.version
                ),
            ));
        }
        if self.is_output && create_graph && self.requires_grad {
            if let Some(owner) = owner {
                let alias = detached_alias(t);
                super::set_history(&alias, owner.clone(), self.output_nr);
                return Ok(alias);
            }
        }
        Ok(t.clone())
    }

    /// `unpack` of a tensor saved through hooks: the unpack hook's tensor (no version check,
    /// as PyTorch), reconnected to its history under `create_graph`.
    fn unpack_hooked(&self, h: &Hooked, owner: Option<&NodeRef>, create_graph: bool) -> Result<Tensor> {
        let Some(p) = &h.packed else {
            return Err(Error::autograd("backward", SECOND_BACKWARD_MSG));
        };
        let t = (h.hooks.unpack)(p)?;
        if !create_graph {
            return Ok(t);
        }
        let history = if self.is_output {
            match owner {
                Some(o) if self.requires_grad => Some((o.clone(), self.output_nr)),
                _ => None,
            }
        } else {
            match &h.history {
                History::Node(g, nr) => Some((g.clone(), *nr)),
                History::Leaf(l) => return Ok(l.clone()),
                History::None => None,
            }
        };
        match history {
            Some((g, nr)) => {
                let alias = detached_alias(&t);
                super::set_history(&alias, g, nr);
                Ok(alias)
            }
            None => Ok(t),
        }
    }

    /// Moves out node handles reachable through the saved tensor (iterative teardown).
    pub(crate) fn take_nodes(&mut self, out: &mut super::node::NodeStack) {
        if let Some(h) = self.hooked.take() {
            if let History::Node(g, _) = h.history {
                out.push(g);
            }
        }
        if let Some(t) = self.data.take() {
            if let Ok(imp) = std::sync::Arc::try_unwrap(t.0) {
                let mut imp = imp;
                if let Some(f) = imp.autograd.inner_mut().grad_fn.take() {
                    out.push(f);
                }
            }
        }
    }
}

/// A tensor saved through saved-tensor hooks.
struct Hooked {
    hooks: std::sync::Arc<super::saved_hooks::HookPair>,
    /// What the pack hook returned; `None` once released.
    packed: Option<super::saved_hooks::Packed>,
    history: History,
}

/// The history of a hooked saved input, given back to the unpacked tensor under
/// `create_graph` (PyTorch keeps `grad_fn_` / the grad accumulator for this).
enum History {
    None,
    Leaf(Tensor),
    Node(NodeRef, u32),
}

/// A new tensor object sharing `t`'s storage and layout, without autograd history (PyTorch's
/// `detach()`; the version counter is shared because it lives on the storage).
pub(crate) fn detached_alias(t: &Tensor) -> Tensor {
    match (t.storage(), t.layout()) {
        (Some(s), Some(l)) => {
            Tensor::from_impl(crate::tensor::Data::Concrete { storage: s.clone(), layout: l.clone(), dtype: t.dtype() })
        }
        _ => t.clone(),
    }
}

/// `torch.FloatTensor`-style names used in PyTorch's version-counter message.
pub fn legacy_type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "FloatTensor",
        DType::F64 => "DoubleTensor",
        DType::F16 => "HalfTensor",
        DType::BF16 => "BFloat16Tensor",
        DType::I64 => "LongTensor",
        DType::I32 => "IntTensor",
        DType::I16 => "ShortTensor",
        DType::I8 => "CharTensor",
        DType::U8 => "ByteTensor",
        DType::Bool => "BoolTensor",
    }
}
