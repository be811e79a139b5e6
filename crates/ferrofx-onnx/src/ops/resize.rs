//! `Resize` (and the older `Upsample`) as separable gathers: for each resized axis the output
//! is `Σ_k w_k · index_select(x, axis, idx_k)` with indices and weights computed at import time
//! from ONNX's coordinate transformation (`half_pixel`, `pytorch_half_pixel`, `align_corners`,
//! `asymmetric`, `half_pixel_symmetric`, `tf_half_pixel_for_nn`) and mode (`nearest` with its
//! four rounding rules, `linear`, `cubic` with `cubic_coeff_a` and `exclude_outside`).
//! Everything is a registry op, so gradients flow and the result saves as `.fxm`.

use super::elementwise::cast;
use super::{call, i64_tensor, v, Convert, Node};
use ferrofx_core::{DType, Result, Tensor, Value};

struct Plan<'a> {
    mode: &'a str,
    coord: &'a str,
    nearest: &'a str,
    cubic_a: f64,
    exclude_outside: bool,
}

fn original(p: &Plan<'_>, o: usize, len_in: usize, len_out: usize, scale: f64) -> f64 {
    let x = o as f64;
    match p.coord {
        "asymmetric" => x / scale,
        "align_corners" => {
            if len_out <= 1 {
                0.0
            } else {
                x * (len_in as f64 - 1.0) / (len_out as f64 - 1.0)
            }
        }
        "pytorch_half_pixel" => {
            if len_out > 1 {
                (x + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        "tf_half_pixel_for_nn" => (x + 0.5) / scale,
        "half_pixel_symmetric" => {
            let adj = len_out as f64 / (scale * len_in as f64);
            let center = len_in as f64 / 2.0;
            center * (1.0 - adj) + (x + 0.5) / scale - 0.5
        }
        _ => (x + 0.5) / scale - 0.5, // half_pixel
    }
}

fn nearest_index(p: &Plan<'_>, x: f64) -> i64 {
    let f = x.floor();
    let frac = x - f;
    (match p.nearest {
        "floor" => f,
        "ceil" => x.ceil(),
        "round_prefer_ceil" => {
            if frac == 0.5 {
                f + 1.0
            } else {
                x.round()
            }
        }
        _ => {
            if frac == 0.5 {
                f
            } else {
                x.round()
            }
        }
    }) as i64
}

fn cubic_weight(a: f64, d: f64) -> f64 {
    let d = d.abs();
    if d <= 1.0 {
        (a + 2.0) * d * d * d - (a + 3.0) * d * d + 1.0
    } else if d < 2.0 {
        a * d * d * d - 5.0 * a * d * d + 8.0 * a * d - 4.0 * a
    } else {
        0.0
    }
}

/// Taps (index, weight) per output position of one axis.
fn taps(p: &Plan<'_>, len_in: usize, len_out: usize, scale: f64) -> Vec<Vec<(i64, f64)>> {
    // an empty input axis has no index to read: the gather reports it
    let last = (len_in as i64 - 1).max(0);
    (0..len_out)
        .map(|o| {
            let x = original(p, o, len_in, len_out, scale);
            match p.mode {
                "nearest" => vec![(nearest_index(p, x).clamp(0, last), 1.0)],
                "cubic" => {
                    let i = x.floor();
                    let t = x - i;
                    let mut ws: Vec<(i64, f64)> = [(-1, t + 1.0), (0, t), (1, 1.0 - t), (2, 2.0 - t)]
                        .iter()
                        .map(|&(k, d)| (i as i64 + k, cubic_weight(p.cubic_a, d)))
                        .collect();
                    if p.exclude_outside {
                        for w in ws.iter_mut() {
                            if w.0 < 0 || w.0 > last {
                                w.1 = 0.0;
                            }
                        }
                        let s: f64 = ws.iter().map(|w| w.1).sum();
                        for w in ws.iter_mut() {
                            w.1 /= s;
                        }
                    }
                    ws.into_iter().map(|(i, w)| (i.clamp(0, last), w)).collect()
                }
                _ => {
                    let x = x.clamp(0.0, last as f64);
                    let i0 = x.floor() as i64;
                    let i1 = (i0 + 1).min(last);
                    let w = x - i0 as f64;
                    vec![(i0, 1.0 - w), (i1, w)]
                }
            }
        })
        .collect()
}

fn resize_axis(x: &Tensor, axis: usize, plan: &Plan<'_>, len_out: usize, scale: f64) -> Result<Tensor> {
    let len_in = x.shape()[axis];
    let t = taps(plan, len_in, len_out, scale);
    let k = t.first().map(|v| v.len()).unwrap_or(1);
    let mut acc: Option<Tensor> = None;
    for j in 0..k {
        let idx: Vec<i64> = t.iter().map(|v| v[j].0).collect();
        let picked = call("index_select", vec![v(x), Value::Int(axis as i64), v(&i64_tensor(&idx)?)])?;
        let term = if plan.mode == "nearest" {
            picked
        } else {
            let w: Vec<f64> = t.iter().map(|v| v[j].1).collect();
            let mut shape = vec![1usize; x.ndim()];
            shape[axis] = len_out;
            let w = cast(
                &Tensor::from_vec(w, &shape)?,
                if x.dtype().is_floating_point() { x.dtype() } else { DType::F32 },
            )?;
            call("mul", vec![v(&picked), v(&w)])?
        };
        acc = Some(match acc {
            None => term,
            Some(a) => call("add", vec![v(&a), v(&term)])?,
        });
    }
    let out = acc.unwrap_or_else(|| x.clone());
    cast(&out, x.dtype())
}

fn resize_with(
    n: &Node<'_>,
    x: &Tensor,
    scales: Option<Vec<f64>>,
    sizes: Option<Vec<i64>>,
    plan: &Plan<'_>,
) -> Result<Vec<Tensor>> {
    let r = x.ndim();
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a.iter().map(|&a| n.dim_axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if n.i("antialias", 0) != 0 {
        return Err(n.err("antialias=1 is not supported"));
    }
    if n.s("keep_aspect_ratio_policy").is_some_and(|p| p != "stretch") {
        return Err(n.err("keep_aspect_ratio_policy other than `stretch` is not supported"));
    }
    if plan.coord == "tf_crop_and_resize" {
        return Err(n.err("coordinate_transformation_mode `tf_crop_and_resize` is not supported"));
    }
    let mut y = x.clone();
    for (i, &a) in axes.iter().enumerate() {
        let len_in = x.shape()[a];
        let (len_out, scale) = match (&sizes, &scales) {
            (Some(s), _) if s.len() == axes.len() => (s[i].max(0) as usize, s[i] as f64 / len_in.max(1) as f64),
            (_, Some(sc)) if sc.len() == axes.len() => ((len_in as f64 * sc[i]).floor() as usize, sc[i]),
            _ => return Err(n.err(format!("needs `scales` or `sizes` with one entry per axis ({} axes)", axes.len()))),
        };
        if len_out > 1 << 24 {
            return Err(n.err(format!("output size {len_out} is too large")));
        }
        if len_out == len_in && (scale - 1.0).abs() < 1e-12 {
            continue;
        }
        y = resize_axis(&y, a, plan, len_out, scale)?;
    }
    Ok(vec![y])
}

fn resize(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let mode = n.s("mode").unwrap_or_else(|| "nearest".into());
    let coord = n.s("coordinate_transformation_mode").unwrap_or_else(|| {
        if n.opset < 11 {
            "asymmetric".into()
        } else {
            "half_pixel".into()
        }
    });
    let nearest = n.s("nearest_mode").unwrap_or_else(|| "round_prefer_floor".into());
    let plan = Plan {
        mode: &mode,
        coord: &coord,
        nearest: if n.opset < 11 { "floor" } else { &nearest },
        cubic_a: n.f("cubic_coeff_a", -0.75),
        exclude_outside: n.i("exclude_outside", 0) != 0,
    };
    let (scales, sizes) = if n.opset < 11 {
        (Some(n.const_floats(n.x(1)?, "scales")?), None)
    } else {
        let scales = n.opt(2).map(|t| n.const_floats(t, "scales")).transpose()?.filter(|s| !s.is_empty());
        let sizes = n.opt(3).map(|t| n.const_ints(t, "sizes")).transpose()?.filter(|s| !s.is_empty());
        (scales, sizes)
    };
    resize_with(n, x, scales, sizes, &plan)
}

fn upsample(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let mode = n.s("mode").unwrap_or_else(|| "nearest".into());
    let plan = Plan { mode: &mode, coord: "asymmetric", nearest: "floor", cubic_a: -0.75, exclude_outside: false };
    let scales = match n.opt(1) {
        Some(t) => n.const_floats(t, "scales")?,
        None => n.floats("scales").unwrap_or_default().into_iter().map(f64::from).collect(),
    };
    resize_with(n, x, Some(scales), None, &plan)
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[("Resize", resize), ("Upsample", upsample)];
