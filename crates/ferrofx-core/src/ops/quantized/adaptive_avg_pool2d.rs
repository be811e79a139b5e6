//! `quantized_adaptive_avg_pool2d`: adaptive average pooling of a uint8 `[N, C, H, W]` tensor
//! (or `[C, H, W]`), requantised: the window sum is taken in i32 and scaled to the output's
//! parameters, as PyTorch's quantized kernel does for NCHW tensors.
//!
//! Window `o` of an axis of size `i` pooled to `o_size` covers `floor(o * i / o_size) ..
//! ceil((o + 1) * i / o_size)`. With `acc = sum(q) - input_zero_point * window_size` and
//! `multiplier = input_scale / output_scale / window_size` (f32), the output is
//! `clamp(round_half_even(acc * (1 / (1 / multiplier))) + output_zero_point, 0, 255)`
//! (PyTorch's `quantize_val(1 / multiplier, ...)`).

use super::channels_last;
use super::{check_scale, check_zero_point, expect_dtype, quantize_val};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::args::{expand_param, float, int, ints, tensor};
use crate::op::{cost_elementwise, dispatch, ArgSpec, ArgType as T, CallKind, Category, Effect, OpDef, Outputs, Saves};
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::smallvec;

const OP: &str = "quantized_adaptive_avg_pool2d";

/// Output shape and the pooled sizes `(oh, ow)`.
fn check(args: &[Value]) -> Result<(Vec<usize>, usize, usize)> {
    let x = tensor(OP, args, 0)?;
    expect_dtype(OP, "input", x, DType::U8)?;
    let size = expand_param::<2>(OP, "output_size", &ints(OP, args, 1)?)?;
    check_scale(OP, "input_scale", float(OP, args, 2)?)?;
    check_zero_point(OP, "input_zero_point", int(OP, args, 3)?, DType::U8)?;
    check_scale(OP, "output_scale", float(OP, args, 4)?)?;
    check_zero_point(OP, "output_zero_point", int(OP, args, 5)?, DType::U8)?;
    let nd = x.ndim();
    if !(nd == 3 || nd == 4) || x.shape()[nd - 2] == 0 || x.shape()[nd - 1] == 0 {
        return Err(Error::shape(
            OP,
            format!("expected a 3-D [C, H, W] or 4-D [N, C, H, W] input with non-empty H and W, got {:?}", x.shape()),
        ));
    }
    if size.iter().any(|&s| s <= 0) {
        return Err(Error::argument(OP, format!("output_size must be positive, got {size:?}")));
    }
    let (oh, ow) = (size[0] as usize, size[1] as usize);
    let mut shape = x.shape().to_vec();
    shape[nd - 2] = oh;
    shape[nd - 1] = ow;
    crate::memory::check_alloc(OP, &shape, DType::U8)?;
    Ok((shape, oh, ow))
}

fn window(o: usize, i: usize, os: usize) -> (usize, usize) {
    (o * i / os, ((o + 1) * i).div_ceil(os))
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    let (shape, oh, ow) = check(args)?;
    let x = tensor(OP, args, 0)?;
    let nd = x.ndim();
    let (h, w) = (x.shape()[nd - 2], x.shape()[nd - 1]);
    let in_scale = check_scale(OP, "input_scale", float(OP, args, 2)?)?;
    let in_zp = int(OP, args, 3)? as i32;
    let out_scale = check_scale(OP, "output_scale", float(OP, args, 4)?)?;
    let out_zp = int(OP, args, 5)? as f32;
    let mut out = crate::memory::alloc_filled::<u8>(OP, &shape, 0)?;
    if let Some([n, c, _, _]) = channels_last::dims(x) {
        // channels-last input: each window's sums for all channels at once (a vector of `C`
        // i32 per window, added pixel by pixel; the integer sums are the same in any order)
        channels_last::with_bytes(x, OP, |xv| -> Result<()> {
            let mut acc = crate::memory::try_vec(OP, c, 0i32)?;
            for i in 0..n {
                let img = &xv[i * h * w * c..(i + 1) * h * w * c];
                let o = &mut out[i * c * oh * ow..(i + 1) * c * oh * ow];
                for r in 0..oh {
                    let (h0, h1) = window(r, h, oh);
                    for s in 0..ow {
                        let (w0, w1) = window(s, w, ow);
                        let cnt = ((h1 - h0) * (w1 - w0)) as i32;
                        acc.fill(-in_zp * cnt);
                        for y in h0..h1 {
                            for px in img[(y * w + w0) * c..(y * w + w1) * c].chunks_exact(c) {
                                for (a, &v) in acc.iter_mut().zip(px) {
                                    *a += v as i32;
                                }
                            }
                        }
                        let multiplier = in_scale / out_scale / cnt as f32;
                        let inv = 1.0f32 / (1.0f32 / multiplier);
                        for (ch, &a) in acc.iter().enumerate() {
                            o[ch * oh * ow + r * ow + s] = quantize_val(a as f32, inv, out_zp, 0.0, 255.0) as u8;
                        }
                    }
                }
            }
            Ok(())
        })??;
        return Ok(smallvec![Tensor::from_vec(out, &shape)?]);
    }
    x.with_contiguous::<u8, _>(OP, |xv| {
        let plane = |(o, src): (&mut [u8], &[u8])| {
            for i in 0..oh {
                let (h0, h1) = window(i, h, oh);
                for j in 0..ow {
                    let (w0, w1) = window(j, w, ow);
                    let n = ((h1 - h0) * (w1 - w0)) as i32;
                    let mut acc = -in_zp * n;
                    for r in h0..h1 {
                        acc += src[r * w + w0..r * w + w1].iter().map(|&v| v as i32).sum::<i32>();
                    }
                    let multiplier = in_scale / out_scale / n as f32;
                    let inv = 1.0f32 / (1.0f32 / multiplier);
                    o[i * ow + j] = quantize_val(acc as f32, inv, out_zp, 0.0, 255.0) as u8;
                }
            }
        };
        if out.is_empty() {
            return;
        }
        if xv.len() >= 1 << 16 {
            crate::ops::team::chunks_mut(&mut out, oh * ow, |i, o| plane((o, &xv[i * h * w..(i + 1) * h * w])));
        } else {
            out.chunks_mut(oh * ow).zip(xv.chunks(h * w)).for_each(plane);
        }
    })?;
    Ok(smallvec![Tensor::from_vec(out, &shape)?])
}

/// `quantized_adaptive_avg_pool2d(input, output_size, input_scale, input_zero_point,
/// output_scale, output_zero_point)` on uint8 tensors (PyTorch keeps the input's parameters:
/// pass them twice).
pub static QUANTIZED_ADAPTIVE_AVG_POOL2D: OpDef = OpDef {
    name: "quantized_adaptive_avg_pool2d",
    schema: &[
        ArgSpec::req("input", T::Tensor),
        ArgSpec::req("output_size", T::IntList),
        ArgSpec::req("input_scale", T::Float),
        ArgSpec::req("input_zero_point", T::Int),
        ArgSpec::req("output_scale", T::Float),
        ArgSpec::req("output_zero_point", T::Int),
    ],
    meta: |args| {
        let (shape, _, _) = check(args)?;
        Ok(smallvec![TensorMeta::contiguous(&shape, DType::U8)])
    },
    kernel,
    cost: cost_elementwise,
    effect: Effect::Pure,
    category: Category::Pooling,
    backward: None,
    saves: Saves::NOTHING,
    doc: "Adaptive average pooling of a uint8 tensor, the window sums requantised to uint8.",
};

/// `quantized_adaptive_avg_pool2d` (see [`QUANTIZED_ADAPTIVE_AVG_POOL2D`]).
///
/// ```
/// use ferrofx_core::{ops::quantized::quantized_adaptive_avg_pool2d, Tensor};
/// let x = Tensor::from_vec(vec![10u8, 20, 30, 41], &[1, 1, 2, 2]).unwrap();
/// let y = quantized_adaptive_avg_pool2d(&x, &[1, 1], 0.5, 10, 0.5, 10).unwrap();
/// assert_eq!(y.to_vec::<u8>().unwrap(), vec![25]); // mean 25.25 rounds to 25
/// ```
pub fn quantized_adaptive_avg_pool2d(
    input: &Tensor,
    output_size: &[i64],
    input_scale: f64,
    input_zero_point: i64,
    output_scale: f64,
    output_zero_point: i64,
) -> Result<Tensor> {
    let args = [
        input.into(),
        output_size.into(),
        input_scale.into(),
        input_zero_point.into(),
        output_scale.into(),
        output_zero_point.into(),
    ];
    let mut out = dispatch(&QUANTIZED_ADAPTIVE_AVG_POOL2D, CallKind::Function, &args)?;
    out.pop().ok_or_else(|| Error::schema(OP, "op returned no output"))
}
