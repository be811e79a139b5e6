//! Shape-changing copies: `pad` (F.pad: modes constant, reflect, replicate, circular; the pad
//! list runs from the last dim backwards), `one_hot`, `pixel_shuffle`, `pixel_unshuffle`.
//!
//! `pad` handles any number of trailing dims in every mode (PyTorch restricts the non-constant
//! modes to 2-D..5-D inputs; this is a superset). Constant padding may be negative (cropping).
//! `one_hot` with `num_classes=-1` infers the class count from the data, so its meta function
//! can only answer when `num_classes` is given.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::{contiguous_strides, Layout};
use crate::op::args::{int, ints, opt_float, str_, tensor};
use crate::op::{
    cost_memory, ArgSpec, ArgType as T, CallKind, Category, Default as D, Effect, MetaOutputs, OpDef, Outputs,
};
use crate::ops::kernel;
use crate::ops::reduce::{call1, check_alloc, meta1, opdef};
use crate::tensor::Tensor;
use crate::value::Value;
use smallvec::smallvec;

// ---------------------------------------------------------------------------------------------
// pad
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Constant,
    Reflect,
    Replicate,
    Circular,
}

struct PadPlan {
    mode: Mode,
    /// (before, after) per input dim (zeros for unpadded dims).
    pads: Vec<(i64, i64)>,
    out_shape: Vec<usize>,
    value: f64,
}

fn pad_plan(a: &[Value]) -> Result<PadPlan> {
    let op = "pad";
    let t = tensor(op, a, 0)?;
    let pad = ints(op, a, 1)?;
    let mode_s = str_(op, a, 2)?;
    let value = opt_float(op, a, 3)?;
    let mode = match mode_s {
        "constant" => Mode::Constant,
        "reflect" => Mode::Reflect,
        "replicate" => Mode::Replicate,
        "circular" => Mode::Circular,
        m => {
            return Err(Error::argument(
                op,
                format!(
                    "Unrecognised padding mode '{m}'; expected one of 'constant', 'reflect', 'replicate', 'circular'"
                ),
            ))
        }
    };
    if mode != Mode::Constant && value.is_some_and(|v| v != 0.0) {
        return Err(Error::argument(op, format!("Padding mode \"{mode_s}\" doesn't take in value argument.")));
    }
    let shape = t.shape();
    let nd = shape.len();
    if pad.len() % 2 != 0 {
        return Err(Error::argument(
            op,
            format!("Padding length must be divisible by 2, got {} values: {:?}", pad.len(), pad.as_ref()),
        ));
    }
    if pad.len() / 2 > nd {
        return Err(Error::argument(
            op,
            format!(
                "Padding length should be less than or equal to two times the input dimension but got padding length {} and input of dimension {nd}",
                pad.len()
            ),
        ));
    }
    let mut pads = vec![(0i64, 0i64); nd];
    for k in 0..pad.len() / 2 {
        pads[nd - 1 - k] = (pad[2 * k], pad[2 * k + 1]);
    }
    let mut out_shape = Vec::with_capacity(nd);
    for d in 0..nd {
        let (l, r) = pads[d];
        let n = shape[d] as i64;
        if mode != Mode::Constant && (l != 0 || r != 0) {
            if l < 0 || r < 0 {
                return Err(Error::argument(
                    op,
                    format!("{mode_s} padding does not support negative padding, got ({l}, {r}) at dimension {d}"),
                ));
            }
            let ok = match mode {
                Mode::Reflect => l < n && r < n,
                Mode::Replicate => n > 0,
                Mode::Circular => l <= n && r <= n,
                Mode::Constant => true,
            };
            if !ok {
                let what = if mode == Mode::Circular { "less than or equal to" } else { "less than" };
                return Err(Error::argument(
                    op,
                    format!(
                        "Argument #4: Padding size should be {what} the corresponding input dimension, but got: padding ({l}, {r}) at dimension {d} of input {shape:?}"
                    ),
                ));
            }
        }
        let o = n.checked_add(l).and_then(|v| v.checked_add(r)).unwrap_or(-1);
        if o < 0 {
            return Err(Error::argument(
                op,
                format!(
                    "The input size {n}, plus negative padding {l} and {r} resulted in a negative output size, which is invalid. Check dimension {d} of your input."
                ),
            ));
        }
        out_shape.push(o as usize);
    }
    check_alloc(op, &out_shape, t.dtype())?;
    Ok(PadPlan { mode, pads, out_shape, value: value.unwrap_or(0.0) })
}

/// For every output position along one dim, the input index it reads (-1: the fill value).
fn index_map(mode: Mode, n: usize, l: i64, out: usize) -> Vec<isize> {
    let n = n as i64;
    (0..out as i64)
        .map(|j| {
            let i = j - l;
            let s = match mode {
                Mode::Constant => {
                    if (0..n).contains(&i) {
                        i
                    } else {
                        -1
                    }
                }
                Mode::Reflect => {
                    if i < 0 {
                        -i
                    } else if i >= n {
                        2 * (n - 1) - i
                    } else {
                        i
                    }
                }
                Mode::Replicate => i.clamp(0, n - 1),
                Mode::Circular => i.rem_euclid(n),
            };
            s as isize
        })
        .collect()
}

fn pad_kernel(a: &[Value]) -> Result<Outputs> {
    let op = "pad";
    let p = pad_plan(a)?;
    let t = tensor(op, a, 0)?;
    let shape = t.shape().to_vec();
    let nd = shape.len();
    if nd == 0 {
        return Ok(smallvec![kernel::contiguous(t)?]);
    }
    if p.out_shape.contains(&0) {
        // nothing to write; the per-dim index maps of the other dims could be huge (a padded
        // dim of 10^16 next to an empty one passes the allocation check of the output)
        let out: Vec<i64> = p.out_shape.iter().map(|&d| d as i64).collect();
        return Ok(smallvec![crate::ops::creation::zeros(&out, Some(t.dtype()))?]);
    }
    if t.numel() == 0 {
        // an empty input padded to a non-empty output: every element is the fill value (only
        // constant padding can get here; the plan refuses the other modes on an empty dim), and
        // the strides of an empty tensor must not be used to address it
        let out: Vec<i64> = p.out_shape.iter().map(|&d| d as i64).collect();
        return Ok(smallvec![crate::ops::creation::full(&out, p.value, Some(t.dtype()))?]);
    }
    let maps: Vec<Vec<isize>> = (0..nd).map(|d| index_map(p.mode, shape[d], p.pads[d].0, p.out_shape[d])).collect();
    let st = contiguous_strides(&shape);
    let n_out: usize = p.out_shape.iter().product();
    let last = p.out_shape[nd - 1];
    let rows = n_out.checked_div(last).unwrap_or(0);
    let dt = t.dtype();
    let out = crate::match_dtype!(dt, E => t.with_contiguous::<E, _>(op, |x| -> Result<Tensor> {
        let fillv = E::from_f64(p.value);
        let mut out: Vec<E> = Vec::with_capacity(n_out);
        let mut idx = vec![0usize; nd - 1];
        for _ in 0..rows {
            let mut base = 0usize;
            let mut valid = true;
            for d in 0..nd - 1 {
                let s = maps[d][idx[d]];
                if s < 0 {
                    valid = false;
                    break;
                }
                base += s as usize * st[d];
            }
            if valid {
                let row = &x[base..base + shape[nd - 1]];
                out.extend(maps[nd - 1].iter().map(|&s| if s < 0 { fillv } else { row[s as usize] }));
            } else {
                out.extend(std::iter::repeat_n(fillv, last));
            }
            for d in (0..nd - 1).rev() {
                idx[d] += 1;
                if idx[d] < p.out_shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Tensor::from_vec(out, &p.out_shape)
    })??);
    Ok(smallvec![out])
}

opdef!(PAD, "pad",
    &[ArgSpec::req("input", T::Tensor), ArgSpec::req("pad", T::IntList), ArgSpec::opt("mode", T::Str, D::Str("constant")), ArgSpec::opt("value", T::OptFloat, D::None)],
    meta: |a| { let p = pad_plan(a)?; Ok(meta1(&p.out_shape, tensor("pad", a, 0)?.dtype())) },
    kernel: pad_kernel,
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    backward: crate::autograd::formulas::index::pad_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "F.pad: pads (left, right) of the last dim, then of the one before, ...; modes constant (value), reflect, replicate, circular.");

// ---------------------------------------------------------------------------------------------
// one_hot
// ---------------------------------------------------------------------------------------------

fn one_hot_check(a: &[Value]) -> Result<i64> {
    let op = "one_hot";
    let t = tensor(op, a, 0)?;
    let c = int(op, a, 1)?;
    if t.dtype() != DType::I64 {
        return Err(Error::dtype(
            op,
            format!("one_hot is only applicable to index tensor of type LongTensor (int64), got {}", t.dtype()),
        ));
    }
    if c < -1 {
        return Err(Error::argument(op, format!("num_classes should be -1 or non-negative, got {c}")));
    }
    Ok(c)
}

opdef!(ONE_HOT, "one_hot", &[ArgSpec::req("input", T::Tensor), ArgSpec::opt("num_classes", T::Int, D::Int(-1))],
    meta: |a| {
        let c = one_hot_check(a)?;
        if c < 0 {
            return Err(Error::trace("one_hot", "with num_classes=-1 the output size depends on the input's values; pass num_classes"));
        }
        let mut s = tensor("one_hot", a, 0)?.shape().to_vec();
        s.push(c as usize);
        Ok(meta1(&s, DType::I64))
    },
    kernel: |a| {
        let op = "one_hot";
        let c = one_hot_check(a)?;
        let t = tensor(op, a, 0)?;
        let v = t.to_vec::<i64>()?;
        if let Some(&bad) = v.iter().find(|&&x| x < 0) {
            return Err(Error::index(op, format!("Class values must be non-negative, got {bad}.")));
        }
        let c = if c < 0 {
            match v.iter().max() {
                Some(&m) => m + 1,
                None => return Err(Error::argument(op, "Can not infer total number of classes from empty tensor.")),
            }
        } else {
            if let Some(&bad) = v.iter().find(|&&x| x >= c) {
                return Err(Error::index(op, format!("Class values must be smaller than num_classes: got class {bad} with num_classes={c}.")));
            }
            c
        } as usize;
        let mut shape = t.shape().to_vec();
        shape.push(c);
        let n = check_alloc(op, &shape, DType::I64)?;
        let mut out = crate::ops::reduce::alloc_filled(op, n, 0i64)?;
        for (k, &x) in v.iter().enumerate() {
            out[k * c + x as usize] = 1;
        }
        Ok(smallvec![Tensor::from_vec(out, &shape)?])
    },
    cost: cost_memory, effect: Effect::Pure, category: Category::Indexing,
    doc: "int64 one-hot encoding with a new last dim of num_classes (inferred as max + 1 when -1).");

// ---------------------------------------------------------------------------------------------
// pixel_shuffle / pixel_unshuffle
// ---------------------------------------------------------------------------------------------

/// (input shape, output shape, permutation, intermediate shape) of a pixel (un)shuffle.
type ShuffleShapes = (Vec<usize>, Vec<usize>, Vec<i64>, Vec<usize>);

fn shuffle_shapes(a: &[Value], up: bool) -> Result<ShuffleShapes> {
    let op = if up { "pixel_shuffle" } else { "pixel_unshuffle" };
    let t = tensor(op, a, 0)?;
    let r = int(op, a, 1)?;
    let s = t.shape();
    if s.len() < 3 {
        return Err(Error::shape(
            op,
            format!("{op} expects input to have at least 3 dimensions, but got input with {} dimension(s)", s.len()),
        ));
    }
    let what = if up { "upscale_factor" } else { "downscale_factor" };
    if r <= 0 {
        return Err(Error::argument(op, format!("{op} expects a positive {what}, but got {r}")));
    }
    let r = r as usize;
    let n = s.len();
    let batch = &s[..n - 3];
    let (c, h, w) = (s[n - 3], s[n - 2], s[n - 1]);
    let b = batch.len() as i64;
    // perm over [batch..., a, b, c, d, e, f]
    let perm: Vec<i64> = (0..b).chain([b, b + 3, b + 1, b + 4, b + 2].iter().copied()).collect();
    let (split, out) = if up {
        if c % (r * r) != 0 {
            return Err(Error::shape(
                op,
                format!("pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, but input.size(-3)={c} is not divisible by {}", r * r),
            ));
        }
        let oc = c / (r * r);
        // [*, oc, r, r, h, w] -> [*, oc, h, r, w, r]
        let split: Vec<usize> = batch.iter().copied().chain([oc, r, r, h, w]).collect();
        let out: Vec<usize> = batch.iter().copied().chain([oc, h * r, w * r]).collect();
        (split, out)
    } else {
        if h % r != 0 {
            return Err(Error::shape(op, format!("pixel_unshuffle expects height to be divisible by downscale_factor, but input.size(-2)={h} is not divisible by {r}")));
        }
        if w % r != 0 {
            return Err(Error::shape(op, format!("pixel_unshuffle expects width to be divisible by downscale_factor, but input.size(-1)={w} is not divisible by {r}")));
        }
        // [*, c, oh, r, ow, r] -> [*, c, r, r, oh, ow]
        let split: Vec<usize> = batch.iter().copied().chain([c, h / r, r, w / r, r]).collect();
        let out: Vec<usize> = batch.iter().copied().chain([c * r * r, h / r, w / r]).collect();
        (split, out)
    };
    let perm = if up { perm } else { (0..b).chain([b, b + 2, b + 4, b + 1, b + 3].iter().copied()).collect() };
    Ok((s.to_vec(), split, perm, out))
}

fn shuffle_kernel(a: &[Value], up: bool) -> Result<Outputs> {
    let op = if up { "pixel_shuffle" } else { "pixel_unshuffle" };
    let (_, split, perm, out) = shuffle_shapes(a, up)?;
    let t = kernel::contiguous(tensor(op, a, 0)?)?;
    let (_, l) = t.concrete(op)?;
    let off = l.offset();
    let sl = Layout::from_parts(split.as_slice().into(), contiguous_strides(&split), off).permute(op, &perm)?;
    let c = kernel::contiguous(&t.view_with_layout(op, sl)?)?;
    let (_, cl) = c.concrete(op)?;
    let ol = Layout::from_parts(out.as_slice().into(), contiguous_strides(&out), cl.offset());
    Ok(smallvec![c.view_with_layout(op, ol)?])
}

fn shuffle_meta(a: &[Value], up: bool) -> Result<MetaOutputs> {
    let op = if up { "pixel_shuffle" } else { "pixel_unshuffle" };
    let (_, _, _, out) = shuffle_shapes(a, up)?;
    Ok(meta1(&out, tensor(op, a, 0)?.dtype()))
}

opdef!(PIXEL_SHUFFLE, "pixel_shuffle", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("upscale_factor", T::Int)],
    meta: |a| shuffle_meta(a, true),
    kernel: |a| shuffle_kernel(a, true),
    cost: cost_memory, effect: Effect::Pure, category: Category::Other,
    backward: crate::autograd::formulas::index::pixel_shuffle_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Rearranges [*, C*r*r, H, W] into [*, C, H*r, W*r].");
opdef!(PIXEL_UNSHUFFLE, "pixel_unshuffle", &[ArgSpec::req("input", T::Tensor), ArgSpec::req("downscale_factor", T::Int)],
    meta: |a| shuffle_meta(a, false),
    kernel: |a| shuffle_kernel(a, false),
    cost: cost_memory, effect: Effect::Pure, category: Category::Other,
    backward: crate::autograd::formulas::index::pixel_unshuffle_backward, saves: crate::op::Saves { inputs: 0, outputs: 0 },
    doc: "Rearranges [*, C, H*r, W*r] into [*, C*r*r, H, W] (inverse of pixel_shuffle).");

/// The ops of this family.
pub(crate) static OPS: &[&OpDef] = &[&PAD, &ONE_HOT, &PIXEL_SHUFFLE, &PIXEL_UNSHUFFLE];

/// `F.pad(input, pad, mode, value)`.
pub fn pad(input: &Tensor, pad: &[i64], mode: &str, value: Option<f64>) -> Result<Tensor> {
    call1(&PAD, CallKind::Function, &[input.into(), pad.into(), mode.into(), value.into()])
}
/// `F.one_hot(input, num_classes)` (`-1` infers).
pub fn one_hot(input: &Tensor, num_classes: i64) -> Result<Tensor> {
    call1(&ONE_HOT, CallKind::Function, &[input.into(), num_classes.into()])
}
/// `F.pixel_shuffle(input, upscale_factor)`.
pub fn pixel_shuffle(input: &Tensor, upscale_factor: i64) -> Result<Tensor> {
    call1(&PIXEL_SHUFFLE, CallKind::Function, &[input.into(), upscale_factor.into()])
}
/// `F.pixel_unshuffle(input, downscale_factor)`.
pub fn pixel_unshuffle(input: &Tensor, downscale_factor: i64) -> Result<Tensor> {
    call1(&PIXEL_UNSHUFFLE, CallKind::Function, &[input.into(), downscale_factor.into()])
}
