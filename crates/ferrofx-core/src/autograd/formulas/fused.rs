//! Registry ops for the fused first-order backward kernels (ATen's `convolution_backward`,
//! `native_batch_norm_backward`, `max_pool2d_with_indices_backward` in spirit).
//!
//! Without `create_graph` the formulas of convolution, training-mode `batch_norm` and max
//! pooling compute their gradients with dedicated kernels. Calling those kernels through these
//! ops (instead of directly) changes nothing eagerly, and lets a tracer record them: the joint
//! forward+backward graph of `ferrofx-compile` then runs exactly the kernels eager backward
//! runs (bit-equal gradients, same speed). The ops are not differentiable (higher-order
//! gradients take the formulas' composite path).
//!
//! Each op takes the output gradient, one `need_*` flag per gradient, then the forward op's
//! arguments in its schema order, and returns the wanted gradients in order.

use crate::error::{Error, Result};
use crate::op::args::{bool_, float, opt_tensor, tensor};
use crate::op::{cost_elementwise, ArgSpec, ArgType as T, Category, Cost, Default as D, Effect, OpDef, Saves};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::SmallVec;

fn metas_of(pairs: &[(bool, &[usize])], dt: crate::DType) -> SmallVec<[TensorMeta; 2]> {
    pairs.iter().filter(|(n, _)| *n).map(|(_, s)| TensorMeta::contiguous(s, dt)).collect()
}

fn wanted(v: impl IntoIterator<Item = Option<Tensor>>, op: &str) -> Result<crate::op::Outputs> {
    v.into_iter()
        .map(|t| t.ok_or_else(|| Error::autograd(op, "a requested gradient was not computed")))
        .collect::<Result<_>>()
}

macro_rules! conv_backward_op {
    ($static:ident, $name:literal, $fwd:literal, $nd:expr, $fwd_static:path, $s:expr, $p:expr, $d:expr) => {
        /// Input and weight gradients of a convolution: `(grad_output, need_input, need_weight,
        /// <the convolution's arguments>)`.
        pub static $static: OpDef = OpDef {
            name: $name,
            schema: &[
                ArgSpec::req("grad_output", T::Tensor),
                ArgSpec::req("need_input", T::Bool),
                ArgSpec::req("need_weight", T::Bool),
                ArgSpec::req("input", T::Tensor),
                ArgSpec::req("weight", T::Tensor),
                ArgSpec::opt("bias", T::OptTensor, D::None),
                ArgSpec::opt("stride", T::IntList, D::Ints($s)),
                ArgSpec::opt("padding", T::IntListOrStr, D::Ints($p)),
                ArgSpec::opt("dilation", T::IntList, D::Ints($d)),
                ArgSpec::opt("groups", T::Int, D::Int(1)),
            ],
            meta: |a| {
                let (ni, nw) = (bool_($name, a, 1)?, bool_($name, a, 2)?);
                let (x, w) = (tensor($name, a, 3)?, tensor($name, a, 4)?);
                Ok(metas_of(&[(ni, x.shape()), (nw, w.shape())], x.dtype()))
            },
            kernel: |a| {
                let (ni, nw) = (bool_($name, a, 1)?, bool_($name, a, 2)?);
                let g = tensor($name, a, 0)?;
                let (gx, gw) = crate::ops::conv::conv_input_weight_grads($fwd, $nd, &a[3..], g, ni, nw)?;
                wanted([gx.filter(|_| ni), gw.filter(|_| nw)].into_iter().filter(|t| t.is_some()), $name)
            },
            cost: |a, outs| {
                let fwd = match a.first() {
                    Some(Value::Tensor(g)) => g.meta(),
                    _ => None,
                };
                match (a.get(3..), fwd) {
                    (Some(args), Some(m)) => {
                        let c = ($fwd_static.cost)(args, &[m]);
                        Cost { flops: c.flops.saturating_mul(outs.len() as u64), bytes: c.bytes.saturating_mul(2) }
                    }
                    _ => Cost::default(),
                }
            },
            effect: Effect::Pure,
            category: Category::Convolution,
            backward: None,
            saves: Saves::NOTHING,
            doc: "Input and weight gradients of a convolution (the fused first-order backward kernels).",
        };
    };
}

conv_backward_op!(CONV1D_BACKWARD, "conv1d_backward", "conv1d", 1, crate::ops::conv::CONV1D, &[1], &[0], &[1]);
conv_backward_op!(CONV2D_BACKWARD, "conv2d_backward", "conv2d", 2, crate::ops::conv::CONV2D, &[1, 1], &[0, 0], &[1, 1]);

/// Gradients of training-mode `batch_norm` (batch statistics):
/// `(grad_output, need_input, need_weight, need_bias, input, weight, eps, relu_output)` → the
/// wanted ones of `(grad_input, grad_weight, grad_bias)`. With `relu_output` (a tensor of the
/// input's shape) `grad_output` is first multiplied by `relu_output > 0` (as 1.0 / 0.0): the
/// backward of a `relu` applied to the normalised output, fused into both passes over the
/// gradient (made by `ferrofx-compile` for training graphs; equal bit for bit to the separate
/// `mul(grad, gt(relu_output, 0))`).
pub static BATCH_NORM_BACKWARD: OpDef = OpDef {
    name: "batch_norm_backward",
    schema: &[
        ArgSpec::req("grad_output", T::Tensor),
        ArgSpec::req("need_input", T::Bool),
        ArgSpec::req("need_weight", T::Bool),
        ArgSpec::req("need_bias", T::Bool),
        ArgSpec::req("input", T::Tensor),
        ArgSpec::opt("weight", T::OptTensor, D::None),
        ArgSpec::opt("eps", T::Float, D::Float(1e-5)),
        ArgSpec::opt("relu_output", T::OptTensor, D::None),
    ],
    meta: |a| {
        let op = "batch_norm_backward";
        let (ni, nw, nb) = (bool_(op, a, 1)?, bool_(op, a, 2)?, bool_(op, a, 3)?);
        let x = tensor(op, a, 4)?;
        if x.ndim() < 2 {
            return Err(Error::shape(op, format!("input of shape {:?} has no channel dimension", x.shape())));
        }
        let c = [x.shape()[1]];
        Ok(metas_of(&[(ni, x.shape()), (nw, &c), (nb, &c)], x.dtype()))
    },
    kernel: |a| {
        let op = "batch_norm_backward";
        let (ni, nw, nb) = (bool_(op, a, 1)?, bool_(op, a, 2)?, bool_(op, a, 3)?);
        let (g, x, w, eps) = (tensor(op, a, 0)?, tensor(op, a, 4)?, opt_tensor(op, a, 5)?, float(op, a, 6)?);
        let relu_output = if a.len() > 7 { opt_tensor(op, a, 7)? } else { None };
        let (gx, gw, gb) =
            crate::ops::norm::batch_norm_train_grads(x, g, w, eps, ni, nw && w.is_some(), nb, relu_output)?;
        wanted([gx.filter(|_| ni), gw.filter(|_| nw), gb.filter(|_| nb)].into_iter().filter(|t| t.is_some()), op)
    },
    cost: |a, outs| {
        let c = cost_elementwise(a, outs);
        Cost { flops: c.flops.saturating_mul(8), bytes: c.bytes }
    },
    effect: Effect::Pure,
    category: Category::Normalization,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Gradients of training-mode batch_norm (the fused first-order backward kernel).",
};

macro_rules! max_pool_backward_op {
    ($static:ident, $name:literal, $fwd:literal, $nd:expr, $p:expr, $d:expr) => {
        /// Input gradient of max pooling: `(grad_output, <the pooling's arguments>,
        /// relu_mask)`. With `relu_mask` the gradient is multiplied by `input > 0` (as 1.0 /
        /// 0.0), the backward of the `relu` that produced the pooling's input, on each plane
        /// while it is in cache (made by `ferrofx-compile` for training graphs; equal bit for
        /// bit to the separate `mul(grad, gt(input, 0))`).
        pub static $static: OpDef = OpDef {
            name: $name,
            schema: &[
                ArgSpec::req("grad_output", T::Tensor),
                ArgSpec::req("input", T::Tensor),
                ArgSpec::req("kernel_size", T::IntList),
                ArgSpec::opt("stride", T::IntList, D::Ints(&[])),
                ArgSpec::opt("padding", T::IntList, D::Ints($p)),
                ArgSpec::opt("dilation", T::IntList, D::Ints($d)),
                ArgSpec::opt("ceil_mode", T::Bool, D::Bool(false)),
                ArgSpec::opt("relu_mask", T::Bool, D::Bool(false)),
            ],
            meta: |a| {
                let x = tensor($name, a, 1)?;
                Ok(smallvec::smallvec![TensorMeta::contiguous(x.shape(), x.dtype())])
            },
            kernel: |a| {
                let g = tensor($name, a, 0)?;
                let relu_mask = a.len() > 7 && bool_($name, a, 7)?;
                let pool = &a[1..a.len().min(7)];
                Ok(smallvec::smallvec![crate::ops::pool::max_pool_grad_input($fwd, $nd, pool, g, relu_mask)?])
            },
            cost: cost_elementwise,
            effect: Effect::Pure,
            category: Category::Pooling,
            backward: None,
            saves: Saves::NOTHING,
            doc: "Input gradient of max pooling (the fused first-order backward kernel).",
        };
    };
}

max_pool_backward_op!(MAX_POOL1D_BACKWARD, "max_pool1d_backward", "max_pool1d", 1, &[0], &[1]);
max_pool_backward_op!(MAX_POOL2D_BACKWARD, "max_pool2d_backward", "max_pool2d", 2, &[0, 0], &[1, 1]);

/// Calls one of these ops through the dispatch point (so a tracer records it).
pub(crate) fn call(op: &'static OpDef, args: Vec<Value>) -> Result<crate::op::Outputs> {
    crate::op::dispatch(op, crate::op::CallKind::Function, &args)
}
