//! 3-D (volumetric) convolution and pooling: `conv3d`, `max_pool3d`, `avg_pool3d`.
//!
//! These are composite functions, like PyTorch's `CompositeImplicitAutograd` ops: each one is
//! computed by the registry's 2-D ops, one call per depth tap of the kernel, so it needs no
//! kernel, backward formula or file-format entry of its own. Autograd, tracing (a traced
//! `conv3d` records the `pad`/`slice`/`conv2d`/`add` calls it is made of), shape propagation and
//! ONNX export all work through the 2-D ops. The depth axis is handled by:
//!
//! - zero (or `-inf`) padding of the depth axis with `pad`;
//! - for each kernel tap `kd`, the strided depth slice `x[:, :, kd*dd :: sd][:OD]`, folded into
//!   the batch and run through the 2-D op on height and width;
//! - summing (convolution, average) or taking the maximum (max pooling) over the taps.
//!
//! Argument conventions, output sizes and error rules follow `torch.nn.functional`; `ceil_mode`
//! is not supported for 3-D pooling (an error says so).

use crate::error::{Error, Result};
use crate::ops::conv::conv2d;
use crate::ops::pool::{avg_pool2d, max_pool2d};
use crate::ops::shape_misc::pad;
use crate::tensor::Tensor;

/// A 1- or 3-entry list as 3 values (PyTorch's `_triple`).
fn triple(op: &str, name: &str, v: &[i64], default: Option<[i64; 3]>) -> Result<[i64; 3]> {
    match (v.len(), default) {
        (0, Some(d)) => Ok(d),
        (1, _) => Ok([v[0]; 3]),
        (3, _) => Ok([v[0], v[1], v[2]]),
        (n, _) => Err(Error::argument(
            op,
            format!("{op}: {name} must either be a single int, or a tuple of 3 ints, got {n} values {v:?}"),
        )),
    }
}

/// Adds the batch dim to an unbatched `[C, D, H, W]` input; checks the rank.
fn batched(op: &str, x: &Tensor) -> Result<(Tensor, bool)> {
    match x.ndim() {
        5 => Ok((x.clone(), false)),
        4 => Ok((x.unsqueeze(0)?, true)),
        _ => Err(Error::shape(
            op,
            format!("Expected 4D (unbatched) or 5D (batched) input to {op}, but got input of size: {:?}", x.shape()),
        )),
    }
}

fn unbatch(y: Tensor, squeeze: bool) -> Result<Tensor> {
    if squeeze {
        y.select(0, 0)
    } else {
        Ok(y)
    }
}

/// Output length of a window of `k` taps (dilation `d`, stride `s`) over `len` padded elements.
fn out_len(op: &str, len: i64, k: i64, s: i64, d: i64) -> Result<i64> {
    let span = d * (k - 1) + 1;
    if len < span {
        return Err(Error::shape(
            op,
            format!(
                "{op}: the depth window (kernel {k}, dilation {d}: {span} elements) is larger than the padded input \
                 depth {len}"
            ),
        ));
    }
    Ok((len - span) / s + 1)
}

/// The depth slices `x[:, :, kd*dd :: sd][:od]` of a padded `[N, C, D, H, W]` tensor, each
/// folded to `[N*od, C, H, W]`.
fn depth_taps(x: &Tensor, kd: i64, sd: i64, dd: i64, od: i64) -> Result<Vec<Tensor>> {
    let s = x.shape().to_vec();
    let (n, c, h, w) = (s[0] as i64, s[1] as i64, s[3] as i64, s[4] as i64);
    (0..kd)
        .map(|t| {
            let start = t * dd;
            let sl = x.slice(2, Some(start), Some(start + (od - 1) * sd + 1), sd)?;
            sl.permute(&[0, 2, 1, 3, 4])?.reshape(&[n * od, c, h, w])
        })
        .collect()
}

/// Unfolds `[N*od, C', H', W']` back to `[N, C', od, H', W']`.
fn unfold_depth(y: &Tensor, n: i64, od: i64) -> Result<Tensor> {
    let s = y.shape().to_vec();
    y.reshape(&[n, od, s[1] as i64, s[2] as i64, s[3] as i64])?.permute(&[0, 2, 1, 3, 4])?.contiguous()
}

fn check_positive(op: &str, name: &str, v: &[i64; 3], allow_zero: bool) -> Result<()> {
    if v.iter().any(|&x| x < 0 || (!allow_zero && x == 0)) {
        return Err(Error::argument(
            op,
            format!("{op}: {name} must be {}, got {v:?}", if allow_zero { "non-negative" } else { "positive" }),
        ));
    }
    Ok(())
}

/// `torch.nn.functional.conv3d(input, weight, bias, stride, padding, dilation, groups)` on
/// `[N, C, D, H, W]` (or unbatched `[C, D, H, W]`) with weight `[O, C/groups, kD, kH, kW]`.
/// `stride`, `padding` and `dilation` take 1 or 3 values.
///
/// ```
/// use ferrofx_core::ops::{creation::ones, volumetric::conv3d};
/// let x = ones(&[1, 2, 4, 4, 4], None)?;
/// let w = ones(&[3, 2, 2, 2, 2], None)?;
/// let y = conv3d(&x, &w, None, &[1], &[0], &[1], 1)?;
/// assert_eq!(y.shape(), &[1, 3, 3, 3, 3]);
/// assert_eq!(y.to_vec::<f32>()?[0], 16.0); // 2 channels x 2x2x2 taps
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn conv3d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
) -> Result<Tensor> {
    const OP: &str = "conv3d";
    let (x, squeeze) = batched(OP, input)?;
    let ws = weight.shape().to_vec();
    if ws.len() != 5 {
        return Err(Error::shape(
            OP,
            format!("expected weight to be 5-D (out_channels, in_channels/groups, kD, kH, kW), but got weight of size {ws:?}"),
        ));
    }
    let s = triple(OP, "stride", stride, None)?;
    let p = triple(OP, "padding", padding, None)?;
    let d = triple(OP, "dilation", dilation, None)?;
    check_positive(OP, "stride", &s, false)?;
    check_positive(OP, "padding", &p, true)?;
    check_positive(OP, "dilation", &d, false)?;
    let xs = x.shape().to_vec();
    if groups <= 0 || xs[1] as i64 != ws[1] as i64 * groups || ws[0] as i64 % groups != 0 {
        return Err(Error::shape(
            OP,
            format!(
                "Given groups={groups}, weight of size {ws:?}, expected input{xs:?} to have {} channels, but got {} \
                 channels instead",
                ws[1] as i64 * groups.max(1),
                xs[1]
            ),
        ));
    }
    let xp = if p[0] > 0 { pad(&x, &[0, 0, 0, 0, p[0], p[0]], "constant", Some(0.0))? } else { x };
    let od = out_len(OP, xp.shape()[2] as i64, ws[2] as i64, s[0], d[0])?;
    let n = xs[0] as i64;
    let mut acc: Option<Tensor> = None;
    for (t, xt) in depth_taps(&xp, ws[2] as i64, s[0], d[0], od)?.into_iter().enumerate() {
        let wt = weight.select(2, t as i64)?;
        let y = conv2d(&xt, &wt, None, &s[1..], &p[1..], &d[1..], groups)?;
        acc = Some(match acc {
            None => y,
            Some(a) => a.add(&y)?,
        });
    }
    let acc = acc.ok_or_else(|| Error::shape(OP, format!("the weight {ws:?} has no depth taps")))?;
    let mut y = unfold_depth(&acc, n, od)?;
    if let Some(b) = bias {
        y = y.add(&b.reshape(&[1, -1, 1, 1, 1])?)?;
    }
    unbatch(y, squeeze)
}

/// `torch.nn.functional.max_pool3d(input, kernel_size, stride, padding, dilation)` on
/// `[N, C, D, H, W]` or `[C, D, H, W]`; an empty `stride` means `kernel_size`. Padding counts
/// as `-inf` and must be at most half the kernel (PyTorch's rule). `ceil_mode` is refused.
///
/// ```
/// use ferrofx_core::{ops::volumetric::max_pool3d, Tensor};
/// let x = Tensor::from_vec((0..8).map(|v| v as f32).collect(), &[1, 1, 2, 2, 2])?;
/// let y = max_pool3d(&x, &[2], &[], &[0], &[1], false)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![7.0]);
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn max_pool3d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    ceil_mode: bool,
) -> Result<Tensor> {
    const OP: &str = "max_pool3d";
    let (x, squeeze) = batched(OP, input)?;
    let k = triple(OP, "kernel_size", kernel, None)?;
    let s = triple(OP, "stride", stride, Some(k))?;
    let p = triple(OP, "padding", padding, Some([0; 3]))?;
    let d = triple(OP, "dilation", dilation, Some([1; 3]))?;
    check_common(OP, &k, &s, &p, &d, ceil_mode)?;
    let xs = x.shape().to_vec();
    let n = xs[0] as i64;
    let xp = if p[0] > 0 { pad(&x, &[0, 0, 0, 0, p[0], p[0]], "constant", Some(f64::NEG_INFINITY))? } else { x };
    let od = out_len(OP, xp.shape()[2] as i64, k[0], s[0], d[0])?;
    let mut acc: Option<Tensor> = None;
    for xt in depth_taps(&xp, k[0], s[0], d[0], od)? {
        // [N*od, C, H, W]: the 2-D pool sees C planes per (image, depth)
        let y = max_pool2d(&xt, &k[1..], &s[1..], &p[1..], &d[1..], false)?;
        acc = Some(match acc {
            None => y,
            Some(a) => a.maximum(&y)?,
        });
    }
    let acc = acc.ok_or_else(|| Error::argument(OP, "empty kernel"))?;
    unbatch(unfold_depth(&acc, n, od)?, squeeze)
}

fn check_common(op: &str, k: &[i64; 3], s: &[i64; 3], p: &[i64; 3], d: &[i64; 3], ceil_mode: bool) -> Result<()> {
    check_positive(op, "kernel_size", k, false)?;
    check_positive(op, "stride", s, false)?;
    check_positive(op, "padding", p, true)?;
    check_positive(op, "dilation", d, false)?;
    if ceil_mode {
        return Err(Error::argument(
            op,
            format!("{op}: ceil_mode=True is not supported for 3-D pooling (pad the input's end instead)"),
        ));
    }
    if p.iter().zip(k).any(|(&p, &k)| p * 2 > k) {
        return Err(Error::argument(
            op,
            format!(
                "{op}: pad should be at most half of effective kernel size, but got pad={p:?} and kernel_size={k:?}"
            ),
        ));
    }
    Ok(())
}

/// `torch.nn.functional.avg_pool3d(input, kernel_size, stride, padding, ceil_mode,
/// count_include_pad)` on `[N, C, D, H, W]` or `[C, D, H, W]`; an empty `stride` means
/// `kernel_size`. With `count_include_pad=false` each window is divided by the number of its
/// elements inside the input. `ceil_mode` is refused.
///
/// ```
/// use ferrofx_core::{ops::volumetric::avg_pool3d, Tensor};
/// let x = Tensor::from_vec((0..8).map(|v| v as f32).collect(), &[1, 1, 2, 2, 2])?;
/// let y = avg_pool3d(&x, &[2], &[], &[0], false, true)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![3.5]);
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn avg_pool3d(
    input: &Tensor,
    kernel: &[i64],
    stride: &[i64],
    padding: &[i64],
    ceil_mode: bool,
    count_include_pad: bool,
) -> Result<Tensor> {
    const OP: &str = "avg_pool3d";
    let (x, squeeze) = batched(OP, input)?;
    let k = triple(OP, "kernel_size", kernel, None)?;
    let s = triple(OP, "stride", stride, Some(k))?;
    let p = triple(OP, "padding", padding, Some([0; 3]))?;
    check_common(OP, &k, &s, &p, &[1; 3], ceil_mode)?;
    let xs = x.shape().to_vec();
    let n = xs[0] as i64;
    let depth = xs[2] as i64;
    let xp = if p[0] > 0 { pad(&x, &[0, 0, 0, 0, p[0], p[0]], "constant", Some(0.0))? } else { x };
    let od = out_len(OP, xp.shape()[2] as i64, k[0], s[0], 1)?;
    // Each tap's 2-D average divides by kH*kW (or by the window's count inside H x W); the
    // depth taps are summed and divided by kD (or by the taps inside the input depth).
    let mut acc: Option<Tensor> = None;
    for xt in depth_taps(&xp, k[0], s[0], 1, od)? {
        let y = avg_pool2d(&xt, &k[1..], &s[1..], &p[1..], false, count_include_pad, None)?;
        acc = Some(match acc {
            None => y,
            Some(a) => a.add(&y)?,
        });
    }
    let acc = acc.ok_or_else(|| Error::argument(OP, "empty kernel"))?;
    let y = unfold_depth(&acc, n, od)?;
    let y = if count_include_pad || p[0] == 0 {
        y.div(k[0] as f64)?
    } else {
        // taps of output depth o inside the input: o*sd + t - pd in [0, depth)
        let counts: Vec<f64> = (0..od)
            .map(|o| (0..k[0]).filter(|t| (0..depth).contains(&(o * s[0] + t - p[0]))).count().max(1) as f64)
            .collect();
        let div = Tensor::from_vec(counts, &[1, 1, od as usize, 1, 1])?.to_dtype(y.dtype())?;
        y.div(&div)?
    };
    unbatch(y, squeeze)
}
