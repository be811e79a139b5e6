//! Neural-network ONNX ops: `Conv` (1-D/2-D/3-D, `auto_pad`, asymmetric pads), `ConvTranspose`,
//! pooling, normalisations, `MatMul`, `Gemm` (transA/transB/alpha/beta), `Dropout`, `LRN`.

use super::elementwise::cast;
use super::shape::pad_dims;
use super::{call, callk, v, Convert, Node};
use ferrofx_core::{DType, Result, Tensor, Value};

/// Spatial padding of a conv/pool node as `(begin, end)` per spatial dim, from `pads` or
/// `auto_pad` (SAME_UPPER / SAME_LOWER / VALID).
fn spatial_pads(
    n: &Node<'_>,
    input: &[usize],
    kernel: &[i64],
    strides: &[i64],
    dilations: &[i64],
) -> Result<Vec<(i64, i64)>> {
    let k = kernel.len();
    let auto = n.s("auto_pad").unwrap_or_else(|| "NOTSET".into());
    match auto.as_str() {
        "NOTSET" | "" => {
            let pads = n.ints("pads").unwrap_or_else(|| vec![0; 2 * k]);
            if pads.len() != 2 * k {
                return Err(n.err(format!("pads {pads:?} must have 2 entries per spatial dim ({k})")));
            }
            Ok((0..k).map(|i| (pads[i], pads[i + k])).collect())
        }
        "VALID" => Ok(vec![(0, 0); k]),
        "SAME_UPPER" | "SAME_LOWER" => Ok((0..k)
            .map(|i| {
                let inp = input[i] as i64;
                let out = (inp + strides[i] - 1) / strides[i];
                let total = ((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - inp).max(0);
                let small = total / 2;
                if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            })
            .collect()),
        other => Err(n.err(format!("auto_pad `{other}` is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"))),
    }
}

fn ints_or(n: &Node<'_>, name: &str, k: usize, default: i64) -> Vec<i64> {
    n.ints(name).filter(|v| v.len() == k).unwrap_or_else(|| vec![default; k])
}

fn conv(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![conv_op(n)?])
}

/// `Conv` on the node's inputs 0 (x), 1 (w), 2 (optional bias); shared by the integer and
/// QLinear convolutions.
pub(crate) fn conv_op(n: &Node<'_>) -> Result<Tensor> {
    let (x, w) = (n.x(0)?, n.x(1)?);
    let b = n.opt(2);
    let k = x.ndim().saturating_sub(2);
    if !(1..=3).contains(&k) || w.ndim() != k + 2 {
        return Err(n.err(format!(
            "only 1-D, 2-D and 3-D convolutions are supported (input {:?}, weight {:?})",
            x.shape(),
            w.shape()
        )));
    }
    let kernel: Vec<i64> = w.shape()[2..].iter().map(|&d| d as i64).collect();
    let strides = ints_or(n, "strides", k, 1);
    let dilations = ints_or(n, "dilations", k, 1);
    let pads = spatial_pads(n, &x.shape()[2..], &kernel, &strides, &dilations)?;
    let groups = n.i("group", 1);
    // 1-D convolutions always pad first (the conv1d kernel's padded path is avoided).
    let symmetric = k >= 2 && pads.iter().all(|&(a, b)| a == b && a >= 0);
    let (x, padding) = if symmetric {
        (x.clone(), pads.iter().map(|p| p.0).collect::<Vec<_>>())
    } else {
        let mut full = vec![(0, 0); 2];
        full.extend(pads.iter().copied());
        (pad_dims(x, &full, "constant", 0.0)?, vec![0; k])
    };
    if k == 3 {
        return ferrofx_core::ops::volumetric::conv3d(&x, w, b, &strides, &padding, &dilations, groups)
            .map_err(|e| n.err(e));
    }
    let op = if k == 1 { "conv1d" } else { "conv2d" };
    let y = call(
        op,
        vec![
            v(&x),
            v(w),
            b.map(v).unwrap_or(Value::None),
            Value::Ints(strides),
            Value::Ints(padding),
            Value::Ints(dilations),
            Value::Int(groups),
        ],
    )
    .map_err(|e| n.err(e))?;
    Ok(y)
}

fn conv_transpose(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, w) = (n.x(0)?, n.x(1)?);
    let b = n.opt(2);
    let k = x.ndim().saturating_sub(2);
    if !(1..=2).contains(&k) {
        return Err(n.err(format!("only 1-D and 2-D transposed convolutions are supported (input {:?})", x.shape())));
    }
    if w.ndim() != k + 2 {
        return Err(n.err(format!("the weight {:?} must have rank {} for input {:?}", w.shape(), k + 2, x.shape())));
    }
    // 1-D runs as 2-D with a unit height.
    let (x2, w2) = if k == 1 {
        let xs: Vec<i64> = [x.shape()[0], x.shape()[1], 1, x.shape()[2]].iter().map(|&d| d as i64).collect();
        let ws: Vec<i64> = [w.shape()[0], w.shape()[1], 1, w.shape()[2]].iter().map(|&d| d as i64).collect();
        (call("reshape", vec![v(x), Value::Ints(xs)])?, call("reshape", vec![v(w), Value::Ints(ws)])?)
    } else {
        (x.clone(), w.clone())
    };
    let kernel: Vec<i64> = w.shape()[2..].iter().map(|&d| d as i64).collect();
    let strides = ints_or(n, "strides", k, 1);
    let dilations = ints_or(n, "dilations", k, 1);
    let mut out_pad = ints_or(n, "output_padding", k, 0);
    let inp: Vec<i64> = x.shape()[2..].iter().map(|&d| d as i64).collect();
    let full: Vec<i64> =
        (0..k).map(|i| strides[i] * (inp[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1).collect();
    let pads: Vec<(i64, i64)> = if let Some(os) = n.ints("output_shape").filter(|o| !o.is_empty()) {
        let os = &os[os.len().saturating_sub(k)..];
        let upper = n.s("auto_pad").as_deref() != Some("SAME_LOWER");
        (0..k)
            .map(|i| {
                let total = full[i] - os[i];
                if total < 0 {
                    out_pad[i] += -total;
                    (0, 0)
                } else if upper {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .collect()
    } else {
        match n.s("auto_pad").as_deref() {
            Some("SAME_UPPER") | Some("SAME_LOWER") => {
                let upper = n.s("auto_pad").as_deref() == Some("SAME_UPPER");
                (0..k)
                    .map(|i| {
                        let total = (full[i] - inp[i] * strides[i]).max(0);
                        if upper {
                            (total / 2, total - total / 2)
                        } else {
                            (total - total / 2, total / 2)
                        }
                    })
                    .collect()
            }
            _ => {
                let p = n.ints("pads").unwrap_or_else(|| vec![0; 2 * k]);
                if p.len() != 2 * k {
                    return Err(n.err(format!("pads {p:?} must have 2 entries per spatial dim")));
                }
                (0..k).map(|i| (p[i], p[i + k])).collect()
            }
        }
    };
    let (s2, d2, op2) = if k == 1 {
        (vec![1, strides[0]], vec![1, dilations[0]], vec![0, out_pad[0]])
    } else {
        (strides.clone(), dilations.clone(), out_pad.clone())
    };
    let y = callk(
        "conv_transpose2d",
        vec![v(&x2), v(&w2), b.map(v).unwrap_or(Value::None)],
        vec![
            ("stride", Value::Ints(s2)),
            ("padding", Value::Ints(vec![0, 0])),
            ("output_padding", Value::Ints(op2)),
            ("groups", Value::Int(n.i("group", 1))),
            ("dilation", Value::Ints(d2)),
        ],
    )
    .map_err(|e| n.err(e))?;
    // Pads crop the full output.
    let mut y = y;
    let off = if k == 1 { 3 } else { 2 };
    for (i, &(a, b)) in pads.iter().enumerate() {
        let d = off + i;
        let len = y.shape()[d] as i64;
        if a != 0 || b != 0 {
            y = call("slice", vec![v(&y), Value::Int(d as i64), Value::Int(a), Value::Int(len - b), Value::Int(1)])?;
        }
    }
    if k == 1 {
        let s = y.shape();
        let shape = vec![s[0] as i64, s[1] as i64, s[3] as i64];
        y = call("reshape", vec![v(&y), Value::Ints(shape)])?;
    }
    Ok(vec![y])
}

fn check_single_output(n: &Node<'_>, what: &str) -> Result<()> {
    if n.proto.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(n.err(format!("the optional output {what} is not supported")));
    }
    Ok(())
}

fn max_pool(n: &Node<'_>) -> Result<Vec<Tensor>> {
    check_single_output(n, "`Indices`")?;
    pool(n, true)
}

fn average_pool(n: &Node<'_>) -> Result<Vec<Tensor>> {
    pool(n, false)
}

fn pool(n: &Node<'_>, max: bool) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let k = x.ndim().saturating_sub(2);
    if !(1..=3).contains(&k) {
        return Err(n.err(format!("only 1-D, 2-D and 3-D pooling is supported (input {:?})", x.shape())));
    }
    let kernel = n.ints("kernel_shape").ok_or_else(|| n.err("`kernel_shape` is required"))?;
    if kernel.len() != k {
        return Err(n.err(format!("kernel_shape {kernel:?} must have {k} entries")));
    }
    let strides = ints_or(n, "strides", k, 1);
    let dilations = ints_or(n, "dilations", k, 1);
    let pads = spatial_pads(n, &x.shape()[2..], &kernel, &strides, &dilations)?;
    let ceil = n.i("ceil_mode", 0) != 0;
    let fits = pads.iter().zip(&kernel).all(|(&(a, b), &kk)| a == b && a >= 0 && a * 2 <= kk);
    if max {
        let (xx, padding) = if fits {
            (x.clone(), pads.iter().map(|p| p.0).collect::<Vec<_>>())
        } else {
            let mut full = vec![(0, 0); 2];
            full.extend(pads.iter().copied());
            (pad_dims(x, &full, "constant", f64::NEG_INFINITY)?, vec![0; k])
        };
        if k == 3 {
            let y = ferrofx_core::ops::volumetric::max_pool3d(&xx, &kernel, &strides, &padding, &dilations, ceil)
                .map_err(|e| n.err(e))?;
            return Ok(vec![y]);
        }
        let op = if k == 1 { "max_pool1d" } else { "max_pool2d" };
        let y = call(
            op,
            vec![
                v(&xx),
                Value::Ints(kernel),
                Value::Ints(strides),
                Value::Ints(padding),
                Value::Ints(dilations),
                Value::Bool(ceil),
            ],
        )
        .map_err(|e| n.err(e))?;
        return Ok(vec![y]);
    }
    if dilations.iter().any(|&d| d != 1) {
        return Err(n.err("AveragePool with dilations is not supported"));
    }
    let include = n.i("count_include_pad", 0) != 0;
    let op = if k == 1 { "avg_pool1d" } else { "avg_pool2d" };
    let run = |t: &Tensor, padding: Vec<i64>, include: bool| {
        if k == 3 {
            return ferrofx_core::ops::volumetric::avg_pool3d(t, &kernel, &strides, &padding, ceil, include);
        }
        call(
            op,
            vec![
                v(t),
                Value::Ints(kernel.clone()),
                Value::Ints(strides.clone()),
                Value::Ints(padding),
                Value::Bool(ceil),
                Value::Bool(include),
            ],
        )
    };
    if fits {
        return Ok(vec![run(x, pads.iter().map(|p| p.0).collect(), include).map_err(|e| n.err(e))?]);
    }
    let mut full = vec![(0, 0); 2];
    full.extend(pads.iter().copied());
    let xp = pad_dims(x, &full, "constant", 0.0)?;
    let sum_avg = run(&xp, vec![0; k], true).map_err(|e| n.err(e))?;
    if include {
        return Ok(vec![sum_avg]);
    }
    // Exclude the padding from the divisor: divide by the average of a padded mask of ones.
    let ones = call("ones_like", vec![v(x)])?;
    let mask = pad_dims(&ones, &full, "constant", 0.0)?;
    let frac = run(&mask, vec![0; k], true)?;
    Ok(vec![call("div", vec![v(&sum_avg), v(&frac)])?])
}

fn global_pool(n: &Node<'_>, op: &str) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let dims: Vec<i64> = (2..x.ndim() as i64).collect();
    Ok(vec![call(op, vec![v(x), Value::Ints(dims), Value::Bool(true)])?])
}

fn batch_norm(n: &Node<'_>) -> Result<Vec<Tensor>> {
    if n.i("training_mode", 0) != 0 {
        return Err(n.err("training_mode=1 is not supported (import the inference graph)"));
    }
    check_single_output(n, "running mean/var")?;
    let (x, scale, bias, mean, var) = (n.x(0)?, n.x(1)?, n.x(2)?, n.x(3)?, n.x(4)?);
    let y = callk(
        "batch_norm",
        vec![v(x), v(mean), v(var)],
        vec![
            ("weight", v(scale)),
            ("bias", v(bias)),
            ("training", Value::Bool(false)),
            ("momentum", Value::Float(n.f("momentum", 0.9))),
            ("eps", Value::Float(n.f("epsilon", 1e-5))),
        ],
    )
    .map_err(|e| n.err(e))?;
    Ok(vec![y])
}

fn instance_norm(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, scale, bias) = (n.x(0)?, n.x(1)?, n.x(2)?);
    let c = *x.shape().get(1).ok_or_else(|| n.err("needs an input of rank >= 2"))? as i64;
    let y = call("group_norm", vec![v(x), Value::Int(c), v(scale), v(bias), Value::Float(n.f("epsilon", 1e-5))])
        .map_err(|e| n.err(e))?;
    Ok(vec![y])
}

fn layer_norm(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axis = n.axis(n.i("axis", -1), x.ndim())?;
    let norm: Vec<i64> = x.shape()[axis..].iter().map(|&d| d as i64).collect();
    let fit = |t: &Tensor| -> Result<Tensor> {
        let s: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        if s == norm {
            Ok(t.clone())
        } else {
            call("contiguous", vec![v(&call("expand", vec![v(t), Value::Ints(norm.clone())])?)])
        }
    };
    let scale = fit(n.x(1)?)?;
    let bias = n.opt(2).map(fit).transpose()?;
    let eps = n.f("epsilon", 1e-5);
    let y = call(
        "layer_norm",
        vec![
            v(x),
            Value::Ints(norm.clone()),
            v(&scale),
            bias.as_ref().map(v).unwrap_or(Value::None),
            Value::Float(eps),
        ],
    )
    .map_err(|e| n.err(e))?;
    if n.proto.output.len() <= 1 {
        return Ok(vec![y]);
    }
    // Mean and InvStdDev outputs (float32, reduced dims kept).
    let dims: Vec<i64> = (axis as i64..x.ndim() as i64).collect();
    let xf = cast(x, DType::F32)?;
    let mean = call("mean", vec![v(&xf), Value::Ints(dims.clone()), Value::Bool(true)])?;
    let d = call("sub", vec![v(&xf), v(&mean)])?;
    let var = call("mean", vec![v(&call("mul", vec![v(&d), v(&d)])?), Value::Ints(dims), Value::Bool(true)])?;
    let inv = call("rsqrt", vec![v(&call("add", vec![v(&var), Value::Float(eps)])?)])?;
    Ok(vec![y, mean, inv])
}

fn group_norm(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, scale, bias) = (n.x(0)?, n.x(1)?, n.x(2)?);
    let g = n.attr("num_groups").and_then(|a| a.i).ok_or_else(|| n.err("`num_groups` is required"))?;
    let c = *x.shape().get(1).ok_or_else(|| n.err("needs an input of rank >= 2"))? as i64;
    if g <= 0 || c % g != 0 {
        return Err(n.err(format!("num_groups {g} must divide the {c} channels")));
    }
    // Opset 18 gives scale/bias per group; 21 per channel.
    let per_channel = |t: &Tensor| -> Result<Tensor> {
        if t.numel() as i64 == c {
            return Ok(t.clone());
        }
        let idx: Vec<i64> = (0..c).map(|i| i / (c / g)).collect();
        call("index_select", vec![v(t), Value::Int(0), v(&super::i64_tensor(&idx)?)])
    };
    let y = call(
        "group_norm",
        vec![v(x), Value::Int(g), v(&per_channel(scale)?), v(&per_channel(bias)?), Value::Float(n.f("epsilon", 1e-5))],
    )
    .map_err(|e| n.err(e))?;
    Ok(vec![y])
}

fn matmul(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![call("matmul", vec![v(n.x(0)?), v(n.x(1)?)]).map_err(|e| n.err(e))?])
}

fn gemm(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (a, b) = (n.x(0)?, n.x(1)?);
    let c = n.opt(2);
    let (alpha, beta) = (n.f("alpha", 1.0), n.f("beta", 1.0));
    let (ta, tb) = (n.i("transA", 0) != 0, n.i("transB", 0) != 0);
    let a = if ta { call("t", vec![v(a)])? } else { a.clone() };
    // The common exported form (x @ W^T + b) is exactly `linear`.
    if tb && alpha == 1.0 && beta == 1.0 && c.is_none_or(|c| c.ndim() == 1 && c.shape()[0] == b.shape()[0]) {
        return Ok(vec![call("linear", vec![v(&a), v(b), c.map(v).unwrap_or(Value::None)]).map_err(|e| n.err(e))?]);
    }
    let b = if tb { call("t", vec![v(b)])? } else { b.clone() };
    let mut y = call("matmul", vec![v(&a), v(&b)]).map_err(|e| n.err(e))?;
    if alpha != 1.0 {
        y = call("mul", vec![v(&y), Value::Float(alpha)])?;
    }
    if let Some(c) = c {
        let c = if beta != 1.0 { call("mul", vec![v(c), Value::Float(beta)])? } else { c.clone() };
        y = call("add", vec![v(&y), v(&c)])?;
    }
    Ok(vec![y])
}

fn dropout(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let training =
        n.opt(2).map(|t| n.const_ints(t, "training_mode")).transpose()?.is_some_and(|t| t.first() == Some(&1));
    if training {
        return Err(n.err("training_mode=1 is not supported (random); import the inference graph"));
    }
    let mut out = vec![x.clone()];
    if n.proto.output.len() > 1 {
        out.push(callk("ones_like", vec![v(x)], vec![("dtype", Value::DType(DType::Bool))])?);
    }
    Ok(out)
}

fn lrn(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    if x.ndim() != 4 {
        return Err(n.err(format!("only 4-D inputs are supported, got {:?}", x.shape())));
    }
    let size = n.attr("size").and_then(|a| a.i).ok_or_else(|| n.err("`size` is required"))?;
    let (alpha, beta, bias) = (n.f("alpha", 1e-4), n.f("beta", 0.75), n.f("bias", 1.0));
    let s: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
    // Sum of squares over a channel window: avg-pool (count padding) over [N, 1, C, H*W].
    let sq = call("mul", vec![v(x), v(x)])?;
    let sq = call("reshape", vec![v(&sq), Value::Ints(vec![s[0], 1, s[1], s[2] * s[3]])])?;
    let before = (size - 1) / 2;
    let after = size - 1 - before;
    let sq = pad_dims(&sq, &[(0, 0), (0, 0), (before, after), (0, 0)], "constant", 0.0)?;
    let avg = call("avg_pool2d", vec![v(&sq), Value::Ints(vec![size, 1]), Value::Ints(vec![1, 1])])?;
    let avg = call("reshape", vec![v(&avg), Value::Ints(s)])?;
    let denom = call("add", vec![v(&call("mul", vec![v(&avg), Value::Float(alpha)])?), Value::Float(bias)])?;
    let denom = call("pow", vec![v(&denom), Value::Float(beta)])?;
    Ok(vec![call("div", vec![v(x), v(&denom)])?])
}

fn lp_normalization(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axis = n.axis(n.i("axis", -1), x.ndim())?;
    let p = n.i("p", 2);
    let norm = match p {
        1 => call("sum", vec![v(&call("abs", vec![v(x)])?), Value::Ints(vec![axis as i64]), Value::Bool(true)])?,
        2 => call(
            "sqrt",
            vec![v(&call(
                "sum",
                vec![v(&call("mul", vec![v(x), v(x)])?), Value::Ints(vec![axis as i64]), Value::Bool(true)],
            )?)],
        )?,
        _ => return Err(n.err(format!("p must be 1 or 2, got {p}"))),
    };
    Ok(vec![call("div", vec![v(x), v(&norm)])?])
}

fn mean_variance_normalization(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let axes: Vec<i64> = n.ints("axes").unwrap_or_else(|| vec![0, 2, 3]);
    let m = call("mean", vec![v(x), Value::Ints(axes.clone()), Value::Bool(true)])?;
    let x2 = call("mul", vec![v(x), v(x)])?;
    let m2 = call("mean", vec![v(&x2), Value::Ints(axes), Value::Bool(true)])?;
    let var = call("sub", vec![v(&m2), v(&call("mul", vec![v(&m), v(&m)])?)])?;
    let std = call("add", vec![v(&call("sqrt", vec![v(&var)])?), Value::Float(1e-9)])?;
    Ok(vec![call("div", vec![v(&call("sub", vec![v(x), v(&m)])?), v(&std)])?])
}

fn rms_norm(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let (x, scale) = (n.x(0)?, n.x(1)?);
    let axis = n.axis(n.i("axis", -1), x.ndim())?;
    let dims: Vec<i64> = (axis as i64..x.ndim() as i64).collect();
    let xf = cast(x, DType::F32)?;
    let ms = call("mean", vec![v(&call("mul", vec![v(&xf), v(&xf)])?), Value::Ints(dims), Value::Bool(true)])?;
    let r = call("rsqrt", vec![v(&call("add", vec![v(&ms), Value::Float(n.f("epsilon", 1e-5))])?)])?;
    let y = cast(&call("mul", vec![v(&xf), v(&r)])?, x.dtype())?;
    Ok(vec![call("mul", vec![v(&y), v(scale)])?])
}

fn abs_pow(x: &Tensor, p: i64) -> Result<Tensor> {
    let a = call("abs", vec![v(x)])?;
    if p == 1 {
        Ok(a)
    } else {
        call("pow", vec![v(&a), Value::Float(p as f64)])
    }
}

fn root(x: &Tensor, p: i64) -> Result<Tensor> {
    if p == 1 {
        Ok(x.clone())
    } else {
        call("pow", vec![v(x), Value::Float(1.0 / p as f64)])
    }
}

fn lp_pool(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let p = n.i("p", 2);
    let k = x.ndim().saturating_sub(2);
    if !(1..=3).contains(&k) {
        return Err(n.err(format!("only 1-D, 2-D and 3-D pooling is supported (input {:?})", x.shape())));
    }
    let kernel = n.ints("kernel_shape").ok_or_else(|| n.err("`kernel_shape` is required"))?;
    let strides = ints_or(n, "strides", k, 1);
    let dilations = ints_or(n, "dilations", k, 1);
    if dilations.iter().any(|&d| d != 1) {
        return Err(n.err("LpPool with dilations is not supported"));
    }
    let pads = spatial_pads(n, &x.shape()[2..], &kernel, &strides, &dilations)?;
    let mut full = vec![(0, 0); 2];
    full.extend(pads.iter().copied());
    let xp = pad_dims(&abs_pow(x, p)?, &full, "constant", 0.0)?;
    let op = if k == 1 { "avg_pool1d" } else { "avg_pool2d" };
    let ceil = n.i("ceil_mode", 0) != 0;
    let avg = call(
        op,
        vec![
            v(&xp),
            Value::Ints(kernel.clone()),
            Value::Ints(strides),
            Value::Ints(vec![0; k]),
            Value::Bool(ceil),
            Value::Bool(true),
        ],
    )?;
    let sum = call("mul", vec![v(&avg), Value::Float(kernel.iter().product::<i64>() as f64)])?;
    Ok(vec![root(&sum, p)?])
}

fn global_lp_pool(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let x = n.x(0)?;
    let p = n.i("p", 2);
    let dims: Vec<i64> = (2..x.ndim() as i64).collect();
    let s = call("sum", vec![v(&abs_pow(x, p)?), Value::Ints(dims), Value::Bool(true)])?;
    Ok(vec![root(&s, p)?])
}

/// Negative log-likelihood of `logp` `[N, C, d...]` at `target` `[N, d...]` with optional class
/// weights, `ignore_index` and reduction (ONNX's `NegativeLogLikelihoodLoss`).
fn nll(n: &Node<'_>, logp: &Tensor, target: &Tensor, weight: Option<&Tensor>) -> Result<Tensor> {
    if target.ndim() == 0 || logp.ndim() != target.ndim() + 1 {
        return Err(n.err(format!(
            "the target of shape {:?} does not fit the input of shape {:?}: the input is [N, C, d...] and the target [N, d...]",
            target.shape(),
            logp.shape()
        )));
    }
    let target = cast(target, DType::I64)?;
    let ignore = n.attr("ignore_index").and_then(|a| a.i);
    let (safe, keep) = match ignore {
        Some(ig) => {
            let is_ig = call("eq", vec![v(&target), Value::Int(ig)])?;
            let zero = super::scalar_of(0.0, DType::I64)?;
            (call("where", vec![v(&is_ig), v(&zero), v(&target)])?, Some(call("logical_not", vec![v(&is_ig)])?))
        }
        None => (target.clone(), None),
    };
    let mut ishape: Vec<i64> = safe.shape().iter().map(|&d| d as i64).collect();
    ishape.insert(1, 1);
    let idx = call("reshape", vec![v(&safe), Value::Ints(ishape)])?;
    let picked = call("gather", vec![v(logp), Value::Int(1), v(&idx)])?;
    let tshape: Vec<i64> = safe.shape().iter().map(|&d| d as i64).collect();
    let picked = call("reshape", vec![v(&picked), Value::Ints(tshape.clone())])?;
    let mut w = match weight {
        Some(w) => {
            let flat = call("reshape", vec![v(&safe), Value::Ints(vec![safe.numel() as i64])])?;
            let g = call("index_select", vec![v(w), Value::Int(0), v(&flat)])?;
            call("reshape", vec![v(&g), Value::Ints(tshape)])?
        }
        None => call("ones_like", vec![v(&picked)])?,
    };
    if let Some(keep) = keep {
        w = call("mul", vec![v(&w), v(&cast(&keep, w.dtype())?)])?;
    }
    let loss = call("neg", vec![v(&call("mul", vec![v(&picked), v(&w)])?)])?;
    match n.s("reduction").as_deref().unwrap_or("mean") {
        "none" => Ok(loss),
        "sum" => call("sum", vec![v(&loss)]),
        "mean" => call("div", vec![v(&call("sum", vec![v(&loss)])?), v(&call("sum", vec![v(&w)])?)]),
        other => Err(n.err(format!("reduction `{other}` is not one of none, sum, mean"))),
    }
}

fn nll_loss(n: &Node<'_>) -> Result<Vec<Tensor>> {
    Ok(vec![nll(n, n.x(0)?, n.x(1)?, n.opt(2))?])
}

fn softmax_cross_entropy(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let logp = call("log_softmax", vec![v(n.x(0)?), Value::Int(1)])?;
    let loss = nll(n, &logp, n.x(1)?, n.opt(2))?;
    Ok(vec![loss, logp])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[
    ("Conv", conv),
    ("ConvTranspose", conv_transpose),
    ("MaxPool", max_pool),
    ("AveragePool", average_pool),
    ("GlobalAveragePool", |n| global_pool(n, "mean")),
    ("GlobalMaxPool", |n| global_pool(n, "amax")),
    ("BatchNormalization", batch_norm),
    ("InstanceNormalization", instance_norm),
    ("LayerNormalization", layer_norm),
    ("GroupNormalization", group_norm),
    ("MatMul", matmul),
    ("Gemm", gemm),
    ("Dropout", dropout),
    ("LRN", lrn),
    ("LpNormalization", lp_normalization),
    ("MeanVarianceNormalization", mean_variance_normalization),
    ("RMSNormalization", rms_norm),
    ("LpPool", lp_pool),
    ("GlobalLpPool", global_lp_pool),
    ("NegativeLogLikelihoodLoss", nll_loss),
    ("SoftmaxCrossEntropyLoss", softmax_cross_entropy),
];
