//! Folding BatchNorm into the preceding Conv2d or Linear for inference (PyTorch's
//! `torch.nn.utils.fusion`, MegEngine's conv-bn fusion).
//!
//! In eval mode BatchNorm is an affine map per channel: `y = (x - mean) / sqrt(var + eps) *
//! gamma + beta`. Composed with a convolution or linear layer it is the same layer with
//! `w' = w * s` (per output channel) and `b' = (b - mean) * s + beta`, `s = gamma / sqrt(var +
//! eps)`: one layer instead of two, identical outputs up to rounding.
//!
//! ```
//! use ferrofx_nn::fusion::fuse_conv_bn_eval;
//! use ferrofx_nn::{BatchNorm, Conv2d, Module};
//! let conv = Conv2d::new(2, 3, 3).unwrap();
//! let mut bn = BatchNorm::new_2d(3).unwrap();
//! bn.eval();
//! let fused = fuse_conv_bn_eval(&conv, &bn).unwrap();
//! let x = ferrofx_core::ops::random::randn(&[1, 2, 5, 5], None).unwrap();
//! let a = bn.forward(&conv.forward(&x).unwrap()).unwrap().to_vec::<f32>().unwrap();
//! let b = fused.forward(&x).unwrap().to_vec::<f32>().unwrap();
//! assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 1e-5));
//! ```

use crate::{BatchNorm, Conv2d, Linear, Module};
use ferrofx_core::{Error, Result, Tensor};

/// Fused `(weight, bias)` of a layer with output-channel-first weight `w` followed by a
/// BatchNorm with the given statistics and affine parameters.
pub fn fuse_weights_bn(
    w: &Tensor,
    b: Option<&Tensor>,
    running_mean: &Tensor,
    running_var: &Tensor,
    eps: f64,
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let _g = ferrofx_core::autograd::no_grad();
    let c = w.shape().first().copied().unwrap_or(0);
    if running_mean.shape() != [c] || running_var.shape() != [c] {
        return Err(Error::shape(
            "fuse_bn",
            format!(
                "the layer has {c} output channels but the BatchNorm statistics have shapes {:?} and {:?}",
                running_mean.shape(),
                running_var.shape()
            ),
        ));
    }
    let inv_std = running_var.add(eps)?.rsqrt()?;
    let scale = match gamma {
        Some(g) => g.mul(&inv_std)?,
        None => inv_std,
    };
    let mut bshape = vec![c as i64];
    bshape.extend(std::iter::repeat_n(1, w.shape().len().saturating_sub(1)));
    let w2 = w.mul(&scale.reshape(&bshape)?)?;
    let centered = match b {
        Some(b) => b.sub(running_mean)?,
        None => running_mean.neg()?,
    };
    let mut b2 = centered.mul(&scale)?;
    if let Some(beta) = beta {
        b2 = b2.add(beta)?;
    }
    Ok((w2.detach().requires_grad_(true)?, b2.detach().requires_grad_(true)?))
}

fn eval_stats(bn: &BatchNorm, what: &str) -> Result<(Tensor, Tensor)> {
    if bn.training {
        return Err(Error::argument(
            what,
            "BatchNorm is in training mode: fusion is only valid in eval mode (call .eval() first)",
        ));
    }
    match (&bn.running_mean, &bn.running_var) {
        (Some(m), Some(v)) => Ok((m.clone(), v.clone())),
        _ => Err(Error::argument(
            what,
            "BatchNorm has no running statistics (track_running_stats=False): nothing to fold",
        )),
    }
}

/// `fuse_conv_bn_eval(conv, bn)`: one Conv2d computing `bn(conv(x))` (eval mode).
pub fn fuse_conv_bn_eval(conv: &Conv2d, bn: &BatchNorm) -> Result<Conv2d> {
    let (m, v) = eval_stats(bn, "fuse_conv_bn_eval")?;
    if bn.num_features != conv.out_channels {
        return Err(Error::shape(
            "fuse_conv_bn_eval",
            format!("Conv2d has {} output channels but BatchNorm has {} features", conv.out_channels, bn.num_features),
        ));
    }
    let (w, b) =
        fuse_weights_bn(&conv.weight, conv.bias.as_ref(), &m, &v, bn.eps, bn.weight.as_ref(), bn.bias.as_ref())?;
    Ok(Conv2d {
        weight: w,
        bias: Some(b),
        stride: conv.stride,
        padding: conv.padding,
        dilation: conv.dilation,
        groups: conv.groups,
        in_channels: conv.in_channels,
        out_channels: conv.out_channels,
        kernel: conv.kernel,
    })
}

/// `fuse_linear_bn_eval(linear, bn)`: one Linear computing `bn(linear(x))` (eval mode, BatchNorm1d).
pub fn fuse_linear_bn_eval(linear: &Linear, bn: &BatchNorm) -> Result<Linear> {
    let (m, v) = eval_stats(bn, "fuse_linear_bn_eval")?;
    if bn.num_features != linear.out_features {
        return Err(Error::shape(
            "fuse_linear_bn_eval",
            format!(
                "Linear has {} output features but BatchNorm has {} features",
                linear.out_features, bn.num_features
            ),
        ));
    }
    let (w, b) =
        fuse_weights_bn(&linear.weight, linear.bias.as_ref(), &m, &v, bn.eps, bn.weight.as_ref(), bn.bias.as_ref())?;
    Ok(Linear { weight: w, bias: Some(b), in_features: linear.in_features, out_features: linear.out_features })
}

/// Whether `m` is a BatchNorm in eval mode with running statistics (foldable).
pub fn is_foldable_bn(m: &dyn Module) -> bool {
    m.as_any().downcast_ref::<BatchNorm>().is_some_and(|bn| !bn.training && bn.running_mean.is_some())
}
