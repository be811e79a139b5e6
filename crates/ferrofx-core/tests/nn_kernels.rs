//! Linear algebra and neural-network kernels: behaviour the PyTorch goldens cannot show
//! (in-place running statistics, version counters, meta inference on symbolic tensors, large
//! parallel paths against naive references) and the exact error text of every op family.

use ferrofx_core::op::{self, CallKind};
use ferrofx_core::ops::{conv, embedding, linalg, norm, pool};
use ferrofx_core::trace::Symbolic;
use ferrofx_core::{DType, Tensor, TensorMeta, Value};
use std::sync::Arc;

fn t(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

/// Deterministic pseudo-random values in [-1, 1).
fn rnd(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn err(r: ferrofx_core::Result<Tensor>) -> String {
    r.unwrap_err().to_string()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

// ------------------------------------------------------------------------------------------
// matmul family
// ------------------------------------------------------------------------------------------

fn naive_mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

#[test]
fn matmul_large_and_batched_paths_match_naive() {
    // one big GEMM (parallel), a folded batch (linear on 3-D input), a batch-parallel path and
    // matrix-vector products split over threads by columns and by rows
    for &(batch, m, k, n, share_b) in &[
        (1, 150, 170, 130, true),
        (6, 20, 33, 17, true),
        (64, 12, 9, 10, false),
        (1, 1, 700, 500, true),
        (1, 500, 700, 1, true),
    ] {
        let a = rnd(batch * m * k, 1);
        let b = rnd(if share_b { k * n } else { batch * k * n }, 2);
        let ta = Tensor::from_vec(a.clone(), &[batch, m, k]).unwrap();
        let tb = if share_b {
            Tensor::from_vec(b.clone(), &[k, n]).unwrap()
        } else {
            Tensor::from_vec(b.clone(), &[batch, k, n]).unwrap()
        };
        let c = linalg::matmul(&ta, &tb).unwrap();
        assert_eq!(c.shape(), &[batch, m, n]);
        let got = c.to_vec::<f64>().unwrap();
        for bi in 0..batch {
            let bb = if share_b { &b[..] } else { &b[bi * k * n..(bi + 1) * k * n] };
            let want = naive_mm(&a[bi * m * k..(bi + 1) * m * k], bb, m, k, n);
            close(&got[bi * m * n..(bi + 1) * m * n], &want, 1e-12);
        }
    }
}

#[test]
fn matmul_f32_transposed_views_need_no_copy_and_are_right() {
    let a = rnd(64 * 48, 3);
    let b = rnd(48 * 40, 4);
    let ta = Tensor::from_vec(a.iter().map(|&x| x as f32).collect(), &[48, 64]).unwrap().t().unwrap();
    let tb = Tensor::from_vec(b.iter().map(|&x| x as f32).collect(), &[40, 48]).unwrap().t().unwrap();
    let c = ta.matmul(&tb).unwrap().to_vec::<f32>().unwrap();
    // reference on the transposed data
    let at: Vec<f64> = (0..64 * 48).map(|i| a[(i % 48) * 64 + i / 48]).collect();
    let bt: Vec<f64> = (0..48 * 40).map(|i| b[(i % 40) * 48 + i / 40]).collect();
    let want = naive_mm(&at, &bt, 64, 48, 40);
    close(&c.iter().map(|&x| x as f64).collect::<Vec<_>>(), &want, 1e-5);
}

#[test]
fn linear_addmm_and_api() {
    let x = t(vec![1., 2., 3., 4., 5., 6.], &[2, 3]);
    let w = t(vec![1., 0., -1., 2., 1., 0.], &[2, 3]);
    let b = t(vec![10., 20.], &[2]);
    let y = linalg::linear(&x, &w, Some(&b)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![8., 24., 8., 33.]);
    let z = linalg::addmm(&b, &x, &w.t().unwrap(), 0.5, 2.0).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![1., 18., 1., 36.]);
    let i = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap();
    assert_eq!(i.mm(&i).unwrap().to_vec::<i64>().unwrap(), vec![7, 10, 15, 22]);
    let d = linalg::matmul(&t(vec![1., 2.], &[2]), &t(vec![3., 4.], &[2])).unwrap();
    assert_eq!(d.shape(), &[] as &[usize]);
    assert_eq!(d.item().unwrap(), 11.0);
    // kwargs by PyTorch's names through the registry
    let r =
        op::call("addmm", vec![(&b).into(), (&x).into(), w.t().unwrap().into()], vec![("beta".into(), Value::Int(0))])
            .unwrap();
    assert_eq!(r[0].to_vec::<f32>().unwrap(), vec![-2., 4., -2., 13.]);
}

#[test]
fn matmul_errors() {
    let a = t(vec![0.; 6], &[2, 3]);
    let b = t(vec![0.; 20], &[4, 5]);
    assert_eq!(err(linalg::mm(&a, &b)), "mm: shape error: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
    assert_eq!(
        err(linalg::matmul(&a, &b)),
        "matmul: shape error: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"
    );
    assert_eq!(
        err(linalg::matmul(&t(vec![0.; 3], &[3]), &t(vec![0.; 4], &[4]))),
        "matmul: shape error: inconsistent tensor size, expected tensor [3] and src [4] to have the same number of elements, but got 3 and 4 elements respectively"
    );
    assert_eq!(
        err(linalg::matmul(&Tensor::scalar(1f32), &t(vec![0.; 4], &[4]))),
        "matmul: shape error: both arguments to matmul need to be at least 1D, but they are 0D and 1D"
    );
    assert_eq!(
        err(linalg::matmul(&t(vec![0.; 24], &[2, 3, 4]), &t(vec![0.; 72], &[3, 4, 6]))),
        "matmul: shape error: shapes [2] and [3] are not broadcastable: the size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0"
    );
    let d = Tensor::from_vec(vec![0f64; 6], &[3, 2]).unwrap();
    assert_eq!(
        err(linalg::mm(&a, &d)),
        "mm: dtype error: expected m1 and m2 to have the same dtype, but got: float != double"
    );
    let bo = Tensor::from_vec(vec![true; 4], &[2, 2]).unwrap();
    assert_eq!(err(linalg::mm(&bo, &bo)), "mm: dtype error: \"addmm_impl_cpu_\" not implemented for 'Bool'");
    assert_eq!(err(linalg::mm(&t(vec![0.; 3], &[3]), &b)), "mm: shape error: self must be a matrix, got 1-D tensor");
    assert_eq!(err(linalg::bmm(&a, &a)), "bmm: shape error: batch1 must be a 3D tensor, got shape [2, 3]");
    assert_eq!(
        err(linalg::bmm(&t(vec![0.; 24], &[2, 3, 4]), &t(vec![0.; 60], &[3, 4, 5]))),
        "bmm: shape error: Expected size for first two dimensions of batch2 tensor to be: [2, 4] but got: [3, 4]."
    );
    assert_eq!(
        err(linalg::linear(&a, &t(vec![0.; 20], &[4, 5]), None)),
        "linear: shape error: mat1 and mat2 shapes cannot be multiplied (2x3 and 5x4)"
    );
    assert_eq!(
        err(linalg::linear(&a, &t(vec![0.; 12], &[4, 3]), Some(&t(vec![0.; 5], &[5])))),
        "linear: shape error: The expanded size of the tensor (4) must match the existing size (5) at non-singleton dimension 1.  Target sizes: [2, 4].  Tensor sizes: [5]"
    );
    assert_eq!(
        err(linalg::addmm(&t(vec![0.; 3], &[3]), &a, &t(vec![0.; 12], &[3, 4]), 1, 1)),
        "addmm: shape error: The expanded size of the tensor (4) must match the existing size (3) at non-singleton dimension 1.  Target sizes: [2, 4].  Tensor sizes: [3]"
    );
}

// ------------------------------------------------------------------------------------------
// convolution
// ------------------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn naive_conv2d(
    x: &[f64],
    w: &[f64],
    (n, c, h, wd): (usize, usize, usize, usize),
    (o, kh, kw): (usize, usize, usize),
    s: (usize, usize),
    p: (usize, usize),
    d: (usize, usize),
    g: usize,
) -> (Vec<f64>, usize, usize) {
    let oh = (h + 2 * p.0 - d.0 * (kh - 1) - 1) / s.0 + 1;
    let ow = (wd + 2 * p.1 - d.1 * (kw - 1) - 1) / s.1 + 1;
    let (cg, og) = (c / g, o / g);
    let mut out = vec![0.0; n * o * oh * ow];
    for ni in 0..n {
        for oc in 0..o {
            let gi = oc / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = 0.0;
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy = (y * s.0 + ki * d.0) as isize - p.0 as isize;
                                let ix = (xx * s.1 + kj * d.1) as isize - p.1 as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let cin = gi * cg + ci;
                                acc += x[((ni * c + cin) * h + iy as usize) * wd + ix as usize]
                                    * w[((oc * cg + ci) * kh + ki) * kw + kj];
                            }
                        }
                    }
                    out[((ni * o + oc) * oh + y) * ow + xx] = acc;
                }
            }
        }
    }
    (out, oh, ow)
}

#[test]
fn conv2d_all_algorithms_match_naive_reference() {
    // (n, c, h, w), (o, kh, kw), stride, pad, dilation, groups: covers pointwise, shifted
    // (stride 1), im2col (strided), grouped, batch-parallel and single-image paths.
    let cases = [
        ((3, 8, 17, 15), (6, 1, 1), (1, 1), (0, 0), (1, 1), 1),
        ((3, 8, 17, 15), (6, 3, 3), (1, 1), (1, 1), (1, 1), 2),
        ((1, 6, 20, 19), (4, 3, 5), (1, 1), (2, 1), (2, 1), 1),
        ((4, 4, 16, 16), (8, 3, 3), (2, 2), (1, 1), (1, 1), 1),
        ((2, 6, 12, 13), (6, 3, 3), (1, 2), (1, 0), (1, 2), 6),
        ((1, 3, 30, 30), (8, 7, 7), (2, 2), (3, 3), (1, 1), 1),
        // >= 32x32 outputs with stride 1: the shifted-GEMM scheme (grouped, dilated, asymmetric)
        ((2, 4, 34, 33), (6, 3, 3), (1, 1), (1, 1), (1, 2), 2),
        ((1, 3, 40, 36), (4, 5, 3), (1, 1), (2, 0), (2, 1), 1),
        ((1, 5, 36, 36), (7, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ];
    for (i, &(ins, ws, s, p, d, g)) in cases.iter().enumerate() {
        let x = rnd(ins.0 * ins.1 * ins.2 * ins.3, 10 + i as u64);
        let w = rnd(ws.0 * (ins.1 / g) * ws.1 * ws.2, 20 + i as u64);
        let (want, oh, ow) = naive_conv2d(&x, &w, ins, ws, s, p, d, g);
        let tx = Tensor::from_vec(x, &[ins.0, ins.1, ins.2, ins.3]).unwrap();
        let tw = Tensor::from_vec(w, &[ws.0, ins.1 / g, ws.1, ws.2]).unwrap();
        let y = conv::conv2d(
            &tx,
            &tw,
            None,
            &[s.0 as i64, s.1 as i64],
            &[p.0 as i64, p.1 as i64][..],
            &[d.0 as i64, d.1 as i64],
            g as i64,
        )
        .unwrap();
        assert_eq!(y.shape(), &[ins.0, ws.0, oh, ow], "case {i}");
        close(&y.to_vec::<f64>().unwrap(), &want, 1e-12);
    }
}

#[test]
fn depthwise_conv2d_f32_matches_naive_reference() {
    // float32 depthwise convolutions take the direct stencil kernel (conv/depthwise.rs): 3x3
    // at stride 1 and 2 (MobileNet), 5x5, dilation, asymmetric stride and padding, a padding
    // wider than the kernel reach, batch > 1, bias, and planes smaller than the kernel's
    // padded reach
    let cases = [
        ((1, 8, 14, 13), 3, 3, (1, 1), (1, 1), (1, 1)),
        ((2, 16, 15, 16), 3, 3, (2, 2), (1, 1), (1, 1)),
        ((1, 4, 17, 19), 5, 5, (2, 2), (2, 2), (1, 1)),
        ((3, 5, 12, 11), 3, 3, (1, 2), (2, 0), (2, 1)),
        ((1, 6, 9, 10), 3, 1, (3, 1), (0, 3), (1, 1)),
        ((1, 32, 56, 56), 3, 3, (1, 1), (1, 1), (1, 1)),
        ((1, 3, 2, 2), 3, 3, (2, 2), (1, 1), (1, 1)),
    ];
    for (i, &(ins, kh, kw, s, p, d)) in cases.iter().enumerate() {
        let c = ins.1;
        let xf: Vec<f32> = rnd(ins.0 * c * ins.2 * ins.3, 50 + i as u64).iter().map(|&v| v as f32).collect();
        let wf: Vec<f32> = rnd(c * kh * kw, 60 + i as u64).iter().map(|&v| v as f32).collect();
        let bf: Vec<f32> = rnd(c, 70 + i as u64).iter().map(|&v| v as f32).collect();
        let x64: Vec<f64> = xf.iter().map(|&v| v as f64).collect();
        let w64: Vec<f64> = wf.iter().map(|&v| v as f64).collect();
        let (mut want, oh, ow) = naive_conv2d(&x64, &w64, ins, (c, kh, kw), s, p, d, c);
        for (j, v) in want.iter_mut().enumerate() {
            *v += bf[(j / (oh * ow)) % c] as f64;
        }
        let y = conv::conv2d(
            &t(xf, &[ins.0, c, ins.2, ins.3]),
            &t(wf, &[c, 1, kh, kw]),
            Some(&t(bf, &[c])),
            &[s.0 as i64, s.1 as i64],
            &[p.0 as i64, p.1 as i64][..],
            &[d.0 as i64, d.1 as i64],
            c as i64,
        )
        .unwrap();
        assert_eq!(y.shape(), &[ins.0, c, oh, ow], "case {i}");
        let got: Vec<f64> = y.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
        close(&got, &want, 1e-5);
    }
}

#[test]
fn conv_errors() {
    let x = t(vec![0.; 256], &[1, 4, 8, 8]);
    let w = t(vec![0.; 216], &[6, 4, 3, 3]);
    let c2 = |w: &Tensor, s: &[i64], p: conv::Padding, g: i64| conv::conv2d(&x, w, None, s, p, &[1], g);
    assert_eq!(
        err(c2(&t(vec![0.; 162], &[6, 3, 3, 3]), &[1], 0.into(), 1)),
        "conv2d: shape error: Given groups=1, weight of size [6, 3, 3, 3], expected input[1, 4, 8, 8] to have 3 channels, but got 4 channels instead"
    );
    assert_eq!(
        err(c2(&t(vec![0.; 90], &[5, 2, 3, 3]), &[1], 0.into(), 2)),
        "conv2d: shape error: Given groups=2, expected weight to be divisible by 2 at dimension 0, but got weight of size [[5, 2, 3, 3]] instead"
    );
    assert_eq!(
        err(c2(&w, &[2], "same".into(), 1)),
        "conv2d: invalid argument: padding='same' is not supported for strided convolutions"
    );
    assert_eq!(
        err(c2(&w, &[1], "foo".into(), 1)),
        "conv2d: invalid argument: Invalid padding string: 'foo' (expected 'valid' or 'same')"
    );
    assert_eq!(
        err(c2(&t(vec![0.; 6 * 4 * 81], &[6, 4, 9, 9]), &[1], 0.into(), 1)),
        "conv2d: shape error: Calculated padded input size per channel: (8 x 8). Kernel size: (9 x 9). Kernel size can't be greater than actual input size"
    );
    assert_eq!(
        err(c2(&w, &[1, 1, 1], 0.into(), 1)),
        "conv2d: invalid argument: expected stride to be a single integer value or a list of 2 values to match the convolution dimensions, but got stride=[1, 1, 1]"
    );
    assert_eq!(
        err(c2(&w, &[0], 0.into(), 1)),
        "conv2d: invalid argument: non-positive stride is not supported, got stride=[0, 0]"
    );
    assert_eq!(
        err(c2(&w, &[1], (-1).into(), 1)),
        "conv2d: invalid argument: negative padding is not supported, got padding=[-1, -1]"
    );
    assert_eq!(
        err(conv::conv2d(&t(vec![0.; 64], &[8, 8]), &w, None, &[1], 0, &[1], 1)),
        "conv2d: shape error: Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: [8, 8]"
    );
    assert_eq!(
        err(conv::conv2d(&x, &w, Some(&t(vec![0.; 5], &[5])), &[1], 0, &[1], 1)),
        "conv2d: shape error: Given weight of size [6, 4, 3, 3], expected bias to be 1-dimensional with 6 elements, but got bias of size [5] instead"
    );
    let wd = Tensor::from_vec(vec![0f64; 216], &[6, 4, 3, 3]).unwrap();
    assert_eq!(
        err(c2(&wd, &[1], 0.into(), 1)),
        "conv2d: dtype error: expected scalar type Float but found Double (input is float32, weight is float64)"
    );
    assert_eq!(
        err(conv::conv1d(&t(vec![0.; 100], &[2, 5, 10]), &t(vec![0.; 72], &[6, 4, 3]), None, &[1], 0, &[1], 1)),
        "conv1d: shape error: Given groups=1, weight of size [6, 4, 3], expected input[2, 5, 10] to have 4 channels, but got 5 channels instead"
    );
    assert_eq!(
        err(conv::conv_transpose2d(&x, &t(vec![0.; 216], &[4, 6, 3, 3]), None, &[2], &[0], &[2], 1, &[1])),
        "conv_transpose2d: invalid argument: output padding must be smaller than either stride or dilation, but got output_padding=[2, 2], stride=[2, 2], dilation=[1, 1]"
    );
    assert_eq!(
        err(conv::conv_transpose2d(&x, &t(vec![0.; 108], &[4, 3, 3, 3]), None, &[1], &[5], &[0], 1, &[1])),
        "conv_transpose2d: shape error: Given input size per channel: (8 x 8). Calculated output size per channel: (0 x 0). Output size is too small"
    );
    assert_eq!(
        err(conv::conv_transpose2d(&x, &t(vec![0.; 162], &[3, 6, 3, 3]), None, &[1], &[0], &[0], 1, &[1])),
        "conv_transpose2d: shape error: Given transposed=1, weight of size [3, 6, 3, 3], expected input[1, 4, 8, 8] to have 3 channels, but got 4 channels instead"
    );
}

#[test]
fn conv_same_padding_keeps_size_and_schema_accepts_strings() {
    let x = t(rnd(2 * 3 * 9 * 8, 5).iter().map(|&v| v as f32).collect(), &[2, 3, 9, 8]);
    let w = t(rnd(4 * 3 * 4 * 3, 6).iter().map(|&v| v as f32).collect(), &[4, 3, 4, 3]);
    let y = op::call("conv2d", vec![(&x).into(), (&w).into()], vec![("padding".into(), Value::Str("same".into()))])
        .unwrap();
    assert_eq!(y[0].shape(), &[2, 4, 9, 8]);
    let y = op::call("conv2d", vec![(&x).into(), (&w).into()], vec![("padding".into(), Value::Int(1))]).unwrap();
    assert_eq!(y[0].shape(), &[2, 4, 8, 8]);
}

// ------------------------------------------------------------------------------------------
// meta inference on symbolic tensors (no data touched)
// ------------------------------------------------------------------------------------------

fn sym(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::symbolic(Symbolic { meta: Some(TensorMeta::contiguous(shape, dtype)), proxy: Arc::new(()) })
}

#[test]
fn meta_functions_work_on_symbolic_tensors() {
    let check = |name: &str, args: Vec<Value>, want: &[&[usize]]| {
        let opdef = op::require(name).unwrap();
        let bound = op::bind(name, opdef.schema, args, vec![]).unwrap();
        let metas = (opdef.meta)(&bound).unwrap();
        let shapes: Vec<Vec<usize>> = metas.iter().map(|m| m.shape.to_vec()).collect();
        let want: Vec<Vec<usize>> = want.iter().map(|s| s.to_vec()).collect();
        assert_eq!(shapes, want, "{name}");
    };
    let f = DType::F32;
    check("matmul", vec![sym(&[2, 1, 5, 7], f).into(), sym(&[3, 7, 4], f).into()], &[&[2, 3, 5, 4]]);
    check("linear", vec![sym(&[8, 3, 6], f).into(), sym(&[5, 6], f).into()], &[&[8, 3, 5]]);
    check(
        "conv2d",
        vec![
            sym(&[8, 64, 56, 56], f).into(),
            sym(&[128, 64, 3, 3], f).into(),
            Value::None,
            Value::Int(2),
            Value::Int(1),
        ],
        &[&[8, 128, 28, 28]],
    );
    check(
        "conv_transpose2d",
        vec![sym(&[1, 4, 5, 5], f).into(), sym(&[4, 3, 3, 3], f).into(), Value::None, Value::Int(2)],
        &[&[1, 3, 11, 11]],
    );
    check(
        "max_pool2d_with_indices",
        vec![
            sym(&[1, 2, 7, 7], f).into(),
            Value::Int(2),
            Value::Ints(vec![]),
            Value::Int(0),
            Value::Int(1),
            Value::Bool(true),
        ],
        &[&[1, 2, 4, 4], &[1, 2, 4, 4]],
    );
    check(
        "adaptive_max_pool2d",
        vec![sym(&[2, 3, 9, 9], f).into(), Value::Ints(vec![4, 2])],
        &[&[2, 3, 4, 2], &[2, 3, 4, 2]],
    );
    check("layer_norm", vec![sym(&[2, 3, 8], f).into(), Value::Int(8)], &[&[2, 3, 8]]);
    check("embedding", vec![sym(&[4, 5], DType::I64).into(), sym(&[10, 3], f).into()], &[&[4, 5, 3]]);
    let _ = CallKind::Function;
}

// ------------------------------------------------------------------------------------------
// pooling
// ------------------------------------------------------------------------------------------

/// The value-only max pool (separable: rows, then columns) equals the window scan that also
/// finds indices, on every geometry ResNet-style models use and the awkward ones (padding,
/// ceil mode with windows hanging off the edge, strides larger than the kernel, NaN, ints).
#[test]
fn max_pool_values_equal_the_indexed_scan() {
    let mut seed = 1;
    for (h, w, k, s, p, ceil) in [
        (112, 112, 3, 2, 1, false),
        (7, 9, 3, 2, 1, true),
        (8, 8, 2, 2, 0, false),
        (5, 6, 3, 1, 1, false),
        (6, 5, 2, 3, 0, true),
        (1, 7, 1, 1, 0, false),
        (9, 4, 4, 3, 2, true),
        // 3x3 windows (ResNet's max-pool and any faster pass for it): odd and even planes,
        // strides 1-3, windows hanging off the edge, a plane of one window
        (56, 57, 3, 2, 0, false),
        (13, 11, 3, 3, 0, true),
        (10, 10, 3, 1, 1, false),
        (3, 3, 3, 2, 1, true),
        (20, 33, 3, 2, 1, true),
        (3, 3, 3, 1, 0, false),
    ] {
        seed += 1;
        let mut v: Vec<f32> = rnd(2 * 3 * h * w, seed).into_iter().map(|x| x as f32).collect();
        if seed % 2 == 0 {
            v[h * w + w / 2] = f32::NAN;
        } else {
            // NaN in a corner and in the middle of the last plane
            v[0] = f32::NAN;
            v[5 * h * w + (h / 2) * w + w / 2] = f32::NAN;
        }
        let x = t(v, &[2, 3, h, w]);
        let plain = pool::max_pool2d(&x, &[k], &[s], &[p], &[1], ceil).unwrap();
        let (indexed, _) = pool::max_pool2d_with_indices(&x, &[k], &[s], &[p], &[1], ceil).unwrap();
        assert_eq!(plain.shape(), indexed.shape());
        let (a, b) = (plain.to_vec::<f32>().unwrap(), indexed.to_vec::<f32>().unwrap());
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(p == q || (p.is_nan() && q.is_nan()), "{h}x{w} k{k} s{s} p{p} ceil {ceil}, [{i}]: {p} vs {q}");
        }
        let xi = x.mul(Tensor::scalar(100.0f32)).unwrap().to_dtype(DType::I64).unwrap();
        let plain = pool::max_pool2d(&xi, &[k], &[s], &[p], &[1], ceil).unwrap();
        let (indexed, _) = pool::max_pool2d_with_indices(&xi, &[k], &[s], &[p], &[1], ceil).unwrap();
        assert_eq!(plain.to_vec::<i64>().unwrap(), indexed.to_vec::<i64>().unwrap());
        // uint8 (the activations of a quantized model)
        let xu = x.abs().unwrap().mul(Tensor::scalar(60.0f32)).unwrap().to_dtype(DType::U8).unwrap();
        let plain = pool::max_pool2d(&xu, &[k], &[s], &[p], &[1], ceil).unwrap();
        let (indexed, _) = pool::max_pool2d_with_indices(&xu, &[k], &[s], &[p], &[1], ceil).unwrap();
        assert_eq!(plain.to_vec::<u8>().unwrap(), indexed.to_vec::<u8>().unwrap(), "uint8 {h}x{w} k{k} s{s} p{p}");
    }
}

#[test]
fn pool_values_indices_and_nan() {
    let x = t(vec![1., 5., 2., 0., 3., f32::NAN, 4., 4., 9.], &[1, 1, 3, 3]);
    let (v, i) = pool::max_pool2d_with_indices(&x, &[2], &[1], &[0], &[1], false).unwrap();
    let v = v.to_vec::<f32>().unwrap();
    assert_eq!(v[0], 5.0);
    assert!(v[1].is_nan() && v[3].is_nan());
    assert_eq!(v[2], 4.0);
    // NaN propagates; ties keep the first index (PyTorch 2.15 gives the same)
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 5, 6, 5]);
    let a =
        pool::avg_pool2d(&t((0..16).map(|v| v as f32).collect(), &[1, 1, 4, 4]), &[2], &[], &[0], false, true, None)
            .unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.5, 4.5, 10.5, 12.5]);
    let (m, mi) = pool::adaptive_max_pool2d(&t((0..16).map(|v| v as f32).collect(), &[1, 4, 4]), &[1]).unwrap();
    assert_eq!((m.to_vec::<f32>().unwrap(), mi.to_vec::<i64>().unwrap()), (vec![15.0], vec![15]));
}

#[test]
fn pool_errors() {
    let x = t(vec![0.; 98], &[1, 2, 7, 7]);
    assert_eq!(
        err(pool::max_pool2d(&x, &[2], &[], &[2], &[1], false)),
        "max_pool2d: invalid argument: pad should be at most half of effective kernel size, but got pad=2, kernel_size=2 and dilation=1"
    );
    assert_eq!(
        err(pool::max_pool2d(&t(vec![0.; 4], &[1, 1, 2, 2]), &[3], &[], &[0], &[1], false)),
        "max_pool2d: shape error: Given input size: (1x2x2). Calculated output size: (1x0x0). Output size is too small"
    );
    assert_eq!(
        err(pool::max_pool2d(&t(vec![0.; 49], &[7, 7]), &[2], &[], &[0], &[1], false)),
        "max_pool2d: shape error: non-empty 3D or 4D (batch mode) tensor expected for input, but got input of size [7, 7]"
    );
    assert_eq!(
        err(pool::max_pool2d(&x, &[2], &[0], &[0], &[1], false)),
        "max_pool2d: invalid argument: stride should be greater than zero, but got stride=[0, 0]"
    );
    let b = Tensor::from_vec(vec![true; 98], &[1, 2, 7, 7]).unwrap();
    assert_eq!(
        err(pool::max_pool2d(&b, &[2], &[], &[0], &[1], false)),
        "max_pool2d: dtype error: \"max_pool2d\" not implemented for 'Bool'"
    );
    let xi = Tensor::from_vec(vec![0i64; 30], &[1, 3, 10]).unwrap();
    assert_eq!(
        err(pool::max_pool1d(&xi, &[2], &[], &[0], &[1], false)),
        "max_pool1d: dtype error: \"max_pool1d\" not implemented for 'Long'"
    );
    assert_eq!(
        err(pool::avg_pool2d(&x, &[2], &[], &[0], false, true, Some(0))),
        "avg_pool2d: invalid argument: divisor must be not zero"
    );
    assert_eq!(
        err(pool::adaptive_avg_pool2d(&x, &[-1])),
        "adaptive_avg_pool2d: invalid argument: adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but received {-1, -1}"
    );
    assert_eq!(
        pool::adaptive_max_pool2d(&t(vec![], &[1, 2, 0, 3]), &[3]).unwrap_err().to_string(),
        "adaptive_max_pool2d: shape error: adaptive_max_pool2d(): Expected input to have non-zero size for non-batch dimensions, but input has sizes [1, 2, 0, 3] with dimension 2 being empty"
    );
}

// ------------------------------------------------------------------------------------------
// normalisation
// ------------------------------------------------------------------------------------------

#[test]
fn batch_norm_training_updates_running_stats_in_place_like_pytorch() {
    // Values from PyTorch 2.15: x = arange(24).reshape(2,3,4).sin(), momentum 0.3.
    let x = t((0..24).map(|i| (i as f32).sin()).collect(), &[2, 3, 4]);
    let rm = t(vec![0.1, 0.2, 0.3], &[3]);
    let rv = t(vec![1.0, 2.0, 0.5], &[3]);
    let (v_m, v_v) = (rm.version(), rv.version());
    let y = norm::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.3, 1e-5).unwrap();
    close(
        &rm.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>(),
        &[0.19811418652534485, 0.02042875438928604, 0.23819980025291443],
        1e-6,
    );
    close(
        &rv.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>(),
        &[0.7841921448707581, 1.499631643295288, 0.5481522679328918],
        1e-6,
    );
    close(
        &y.to_vec::<f32>().unwrap()[..6].iter().map(|&v| v as f64).collect::<Vec<_>>(),
        &[
            -0.8617630004882812,
            0.8362894058227539,
            0.9731602668762207,
            -0.5769888758659363,
            -0.6645297408103943,
            -1.0394712686538696,
        ],
        1e-5,
    );
    assert!(rm.version() > v_m && rv.version() > v_v, "running stats' version counters must be bumped");
    assert_eq!(op::require("batch_norm").unwrap().mutated_arg(), Some(1));
    // evaluation mode reads the running stats and leaves them alone
    let before = rm.to_vec::<f32>().unwrap();
    let e = norm::batch_norm(&x, Some(&rm), Some(&rv), None, None, false, 0.3, 1e-5).unwrap();
    assert_eq!(rm.to_vec::<f32>().unwrap(), before);
    let xv = x.to_vec::<f32>().unwrap();
    let want0 = (xv[0] - before[0]) / (rv.to_vec::<f32>().unwrap()[0] + 1e-5).sqrt();
    assert!((e.to_vec::<f32>().unwrap()[0] - want0).abs() < 1e-6);
}

#[test]
fn norm_errors() {
    let x = t(vec![0.; 98], &[1, 2, 7, 7]);
    let z3 = t(vec![0.; 3], &[3]);
    let z2 = t(vec![1.; 2], &[2]);
    assert_eq!(
        err(norm::batch_norm(&x, Some(&z3), Some(&z3), None, None, false, 0.1, 1e-5)),
        "batch_norm: shape error: running_mean should contain 2 elements not 3 (input of size [1, 2, 7, 7])"
    );
    assert_eq!(
        err(norm::batch_norm(&x, None, None, None, None, false, 0.1, 1e-5)),
        "batch_norm: invalid argument: running_mean must be defined in evaluation mode"
    );
    assert_eq!(
        err(norm::batch_norm(&t(vec![0.; 2], &[1, 2]), None, None, None, None, true, 0.1, 1e-5)),
        "batch_norm: invalid argument: Expected more than 1 value per channel when training, got input size [1, 2]"
    );
    let xd = Tensor::from_vec(vec![0f64; 98], &[1, 2, 7, 7]).unwrap();
    assert_eq!(
        err(norm::batch_norm(&xd, Some(&z2), Some(&z2), None, None, false, 0.1, 1e-5)),
        "batch_norm: dtype error: mixed dtype (CPU): all inputs must share same datatype. input is float64, running_mean is float32"
    );
    let xi = Tensor::from_vec(vec![0i64; 98], &[1, 2, 7, 7]).unwrap();
    assert_eq!(
        err(norm::layer_norm(&xi, &[7], None, None, 1e-5)),
        "layer_norm: dtype error: \"layer_norm\" not implemented for 'Long' (normalisation needs a floating point input)"
    );
    assert_eq!(
        err(norm::layer_norm(&x, &[6], None, None, 1e-5)),
        "layer_norm: shape error: Given normalized_shape=[6], expected input with shape [*, 6], but got input of size[1, 2, 7, 7]"
    );
    assert_eq!(
        err(norm::layer_norm(&x, &[7], Some(&t(vec![1.; 6], &[6])), None, 1e-5)),
        "layer_norm: shape error: Expected weight to be of same shape as normalized_shape, but got weight of shape [6] and normalized_shape = [7]"
    );
    assert_eq!(
        err(norm::group_norm(&x, 3, None, None, 1e-5)),
        "group_norm: shape error: Expected number of channels in input to be divisible by num_groups, but got input of shape [1, 2, 7, 7] and num_groups=3"
    );
    assert_eq!(
        err(norm::group_norm(&x, 2, Some(&z3), None, 1e-5)),
        "group_norm: shape error: Expected weight to be a vector of size equal to the number of channels in input, but got weight of shape [3] and input of shape [1, 2, 7, 7]"
    );
    assert_eq!(
        err(norm::group_norm(&t(vec![0.; 4], &[4]), 1, None, None, 1e-5)),
        "group_norm: shape error: Expected at least 2 dimensions for input tensor but received 1"
    );
}

// ------------------------------------------------------------------------------------------
// embedding
// ------------------------------------------------------------------------------------------

#[test]
fn embedding_lookup_and_errors() {
    let w = t((0..12).map(|v| v as f32).collect(), &[4, 3]);
    let idx = Tensor::from_vec(vec![3i64, 0, 3], &[3]).unwrap();
    let y = embedding::embedding(&idx, &w, None).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![9., 10., 11., 0., 1., 2., 9., 10., 11.]);
    let bad = Tensor::from_vec(vec![1i64, 5], &[2]).unwrap();
    assert_eq!(
        err(embedding::embedding(&bad, &w, None)),
        "embedding: index error: index 5 (at position 1 of input of shape [2]) is out of range for an embedding table of 4 rows (valid indices are 0..4)"
    );
    let neg = Tensor::from_vec(vec![-1i64], &[1]).unwrap();
    assert!(err(embedding::embedding(&neg, &w, None)).contains("index -1 (at position 0"));
    assert_eq!(
        err(embedding::embedding(&t(vec![1.0], &[1]), &w, None)),
        "embedding: dtype error: Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got float32 (Float) instead"
    );
    assert_eq!(
        err(embedding::embedding(&idx, &t(vec![0.; 4], &[4]), None)),
        "embedding: shape error: 'weight' must be 2-D (num_embeddings, embedding_dim), but got weight of shape [4]"
    );
    assert_eq!(
        err(embedding::embedding(&idx, &w, Some(5))),
        "embedding: invalid argument: Padding_idx must be within num_embeddings: got padding_idx=5 for a table of 4 rows"
    );
}

/// Winograd convolutions (forward, input gradient, and the cached inference weights) agree
/// with the exact im2col path, on shapes that take the Winograd path: >= 16 channels, >= 16
/// tiles, sizes that are not multiples of 4, paddings 0 to 2.
#[test]
fn winograd_forward_and_gradients_match_the_exact_path() {
    let close = |a: &[f32], b: &[f32], what: &str| {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-5 * scale + 1e-6, "{what}: max difference {worst} at scale {scale}");
    };
    for (n, c, o, h, w, pad) in
        [(2usize, 16usize, 32usize, 18usize, 13usize, 1i64), (1, 20, 17, 17, 21, 0), (3, 24, 16, 10, 10, 2)]
    {
        let x = t(rnd(n * c * h * w, 7).iter().map(|&v| v as f32).collect(), &[n, c, h, w]);
        let wt = t(rnd(o * c * 9, 8).iter().map(|&v| v as f32).collect(), &[o, c, 3, 3]);
        let b = t(rnd(o, 9).iter().map(|&v| v as f32).collect(), &[o]);
        let run = |winograd: bool| {
            let prev = conv::set_winograd_enabled(winograd);
            let xg = x.detach().requires_grad_(true).unwrap();
            let wg = wt.detach().requires_grad_(true).unwrap();
            let y = conv::conv2d(&xg, &wg, Some(&b), &[1], pad, &[1], 1).unwrap();
            // a non-uniform output gradient, so a flipped or transposed kernel would show
            let gy = t(rnd(y.numel(), 10).iter().map(|&v| v as f32).collect(), y.shape());
            y.backward(Some(&gy), false, false).unwrap();
            conv::set_winograd_enabled(prev);
            let grad = |t: &Tensor| t.grad().unwrap().to_vec::<f32>().unwrap();
            (y.to_vec::<f32>().unwrap(), grad(&xg), grad(&wg))
        };
        let (y_exact, gx_exact, gw_exact) = run(false);
        let (y_wino, gx_wino, gw_wino) = run(true);
        // Winograd rounds differently: equal bits would mean the exact path ran twice
        assert_ne!(y_wino, y_exact, "forward took the Winograd path");
        assert_ne!(gx_wino, gx_exact, "input gradient took the Winograd path");
        assert_ne!(gw_wino, gw_exact, "weight gradient took the Winograd path");
        close(&y_wino, &y_exact, &format!("forward {n}x{c}x{h}x{w} -> {o}, pad {pad}"));
        close(&gx_wino, &gx_exact, &format!("input gradient {n}x{c}x{h}x{w} -> {o}, pad {pad}"));
        close(&gw_wino, &gw_exact, &format!("weight gradient {n}x{c}x{h}x{w} -> {o}, pad {pad}"));
        // inference: cached transformed weights, invalidated by an in-place write
        let _ng = ferrofx_core::autograd::no_grad();
        let y1 = conv::conv2d(&x, &wt, None, &[1], pad, &[1], 1).unwrap().to_vec::<f32>().unwrap();
        let y2 = conv::conv2d(&x, &wt, None, &[1], pad, &[1], 1).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(y1, y2, "the cached weights give the same result");
        wt.mul_(2.0).unwrap();
        let y3 = conv::conv2d(&x, &wt, None, &[1], pad, &[1], 1).unwrap().to_vec::<f32>().unwrap();
        let doubled: Vec<f32> = y1.iter().map(|v| v * 2.0).collect();
        close(&y3, &doubled, "after an in-place write to the weights");
        wt.mul_(0.5).unwrap();
    }
}

#[test]
fn conv1d_kernel_wider_than_the_input_is_padding_only_where_it_misses() {
    // PyTorch's test_Conv1d_pad2size1: length 1, kernel 5, padding 2 (a kernel tap whose
    // columns all fall in the padding used to slice past the input row)
    let x = rnd(4, 3);
    let w = rnd(4 * 4 * 5, 4);
    let y = conv::conv1d(
        &Tensor::from_vec(x.clone(), &[1, 4, 1]).unwrap(),
        &Tensor::from_vec(w.clone(), &[4, 4, 5]).unwrap(),
        None,
        &[1],
        2,
        &[1],
        1,
    )
    .unwrap();
    assert_eq!(y.shape(), &[1, 4, 1]);
    // only the centre tap meets the input
    let want: Vec<f64> = (0..4).map(|o| (0..4).map(|c| x[c] * w[(o * 4 + c) * 5 + 2]).sum()).collect();
    close(&y.to_vec::<f64>().unwrap(), &want, 1e-12);
    // the same through conv2d with a 1 x 5 kernel and strided columns
    let (want2, oh, ow) = naive_conv2d(&x, &w, (1, 4, 1, 1), (4, 1, 5), (1, 2), (0, 2), (1, 1), 1);
    let y2 = conv::conv2d(
        &Tensor::from_vec(x, &[1, 4, 1, 1]).unwrap(),
        &Tensor::from_vec(w, &[4, 4, 1, 5]).unwrap(),
        None,
        &[1, 2],
        &[0, 2][..],
        &[1, 1],
        1,
    )
    .unwrap();
    assert_eq!(y2.shape(), &[1, 4, oh, ow]);
    close(&y2.to_vec::<f64>().unwrap(), &want2, 1e-12);
}

/// One window of [`naive_3d`]: (image, output channel, (tap index, input value or `None` for
/// padding) per channel-tap) -> the output value.
type Window<'a> = &'a mut dyn FnMut(usize, usize, &[(usize, Option<f64>)]) -> f64;

/// Direct 3-D convolution / pooling over `[n, c, d, h, w]` for the volumetric ops.
#[allow(clippy::too_many_arguments)]
fn naive_3d(
    x: &[f64],
    (n, c, d, h, w): (usize, usize, usize, usize, usize),
    k: [usize; 3],
    s: [usize; 3],
    p: [usize; 3],
    dil: [usize; 3],
    out_c: usize,
    per_window: Window<'_>,
) -> (Vec<f64>, [usize; 3]) {
    let o = |i: usize| (([d, h, w][i] + 2 * p[i]) - dil[i] * (k[i] - 1) - 1) / s[i] + 1;
    let (od, oh, ow) = (o(0), o(1), o(2));
    let mut out = vec![0.0; n * out_c * od * oh * ow];
    let mut idx = 0;
    for ni in 0..n {
        for oc in 0..out_c {
            for z in 0..od {
                for y in 0..oh {
                    for xx in 0..ow {
                        // (tap index, input value or None for padding) per channel-tap
                        let mut taps = Vec::new();
                        for ci in 0..c {
                            for a in 0..k[0] {
                                for b in 0..k[1] {
                                    for e in 0..k[2] {
                                        let iz = (z * s[0] + a * dil[0]) as isize - p[0] as isize;
                                        let iy = (y * s[1] + b * dil[1]) as isize - p[1] as isize;
                                        let ix = (xx * s[2] + e * dil[2]) as isize - p[2] as isize;
                                        let inside = iz >= 0
                                            && iy >= 0
                                            && ix >= 0
                                            && (iz as usize) < d
                                            && (iy as usize) < h
                                            && (ix as usize) < w;
                                        let v = inside.then(|| {
                                            x[(((ni * c + ci) * d + iz as usize) * h + iy as usize) * w + ix as usize]
                                        });
                                        taps.push((((ci * k[0] + a) * k[1] + b) * k[2] + e, v));
                                    }
                                }
                            }
                        }
                        out[idx] = per_window(ni, oc, &taps);
                        idx += 1;
                    }
                }
            }
        }
    }
    (out, [od, oh, ow])
}

#[test]
fn conv3d_and_3d_pools_match_direct_references() {
    use ferrofx_core::ops::volumetric::{avg_pool3d, conv3d, max_pool3d};
    let dims = (2, 4, 5, 6, 5);
    let x = rnd(2 * 4 * 5 * 6 * 5, 7);
    let tx = Tensor::from_vec(x.clone(), &[2, 4, 5, 6, 5]).unwrap();
    // convolution: stride, padding, dilation, groups, bias
    for (i, &(k, s, p, dil, g)) in [
        ([3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], 1),
        ([2, 3, 2], [2, 1, 2], [1, 1, 0], [1, 1, 1], 2),
        ([2, 2, 2], [2, 2, 2], [0, 1, 1], [2, 2, 1], 1),
    ]
    .iter()
    .enumerate()
    {
        let out_c = 6;
        let cg = 4 / g;
        let w = rnd(out_c * cg * k[0] * k[1] * k[2], 30 + i as u64);
        let b = rnd(out_c, 40 + i as u64);
        let per_group = k[0] * k[1] * k[2];
        let (want, o) = naive_3d(&x, dims, k, s, p, dil, out_c, &mut |_, oc, taps| {
            let gi = oc / (out_c / g);
            let mut acc = b[oc];
            for &(t, v) in taps {
                let ci = t / per_group;
                if ci / cg == gi {
                    if let Some(v) = v {
                        acc += v * w[(oc * cg + ci % cg) * per_group + t % per_group];
                    }
                }
            }
            acc
        });
        let tw = Tensor::from_vec(w.clone(), &[out_c, cg, k[0], k[1], k[2]]).unwrap();
        let tb = Tensor::from_vec(b.clone(), &[out_c]).unwrap();
        let ints = |v: [usize; 3]| v.map(|x| x as i64);
        let y = conv3d(&tx, &tw, Some(&tb), &ints(s), &ints(p), &ints(dil), g as i64).unwrap();
        assert_eq!(y.shape(), &[2, out_c, o[0], o[1], o[2]], "conv case {i}");
        close(&y.to_vec::<f64>().unwrap(), &want, 1e-12);
    }
    // pooling
    for (i, &(k, s, p, dil)) in
        [([2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1]), ([3, 2, 3], [1, 2, 2], [1, 1, 1], [1, 1, 1])].iter().enumerate()
    {
        let ints = |v: [usize; 3]| v.map(|x| x as i64);
        let (want, o) = naive_3d(&x, dims, k, s, p, dil, 4, &mut |_, oc, taps| {
            let per_c = k[0] * k[1] * k[2];
            taps[oc * per_c..(oc + 1) * per_c].iter().filter_map(|t| t.1).fold(f64::NEG_INFINITY, f64::max)
        });
        let y = max_pool3d(&tx, &ints(k), &ints(s), &ints(p), &ints(dil), false).unwrap();
        assert_eq!(y.shape(), &[2, 4, o[0], o[1], o[2]], "max pool case {i}");
        close(&y.to_vec::<f64>().unwrap(), &want, 1e-12);
        for include in [true, false] {
            let (want, _) = naive_3d(&x, dims, k, s, p, [1; 3], 4, &mut |_, oc, taps| {
                let per_c = k[0] * k[1] * k[2];
                let t = &taps[oc * per_c..(oc + 1) * per_c];
                let sum: f64 = t.iter().filter_map(|t| t.1).sum();
                let count = if include { per_c } else { t.iter().filter(|t| t.1.is_some()).count() };
                sum / count as f64
            });
            let y = avg_pool3d(&tx, &ints(k), &ints(s), &ints(p), false, include).unwrap();
            close(&y.to_vec::<f64>().unwrap(), &want, 1e-12);
        }
    }
    // unbatched input, and the errors
    let y = max_pool3d(&tx.select(0, 1).unwrap(), &[2], &[], &[0], &[1], false).unwrap();
    assert_eq!(y.shape(), &[4, 2, 3, 2]);
    let e = err(max_pool3d(&tx, &[2], &[], &[0], &[1], true));
    assert!(e.contains("ceil_mode=True is not supported"), "{e}");
    let e = err(conv3d(
        &tx,
        &Tensor::from_vec(vec![0.0f64; 6 * 3 * 8], &[6, 3, 2, 2, 2]).unwrap(),
        None,
        &[1],
        &[0],
        &[1],
        1,
    ));
    assert!(e.contains("to have 3 channels, but got 4 channels"), "{e}");
    let e = err(conv3d(
        &tx.select(0, 0).unwrap().select(0, 0).unwrap(),
        &Tensor::from_vec(vec![0.0f64; 8], &[1, 1, 2, 2, 2]).unwrap(),
        None,
        &[1],
        &[0],
        &[1],
        1,
    ));
    assert!(e.contains("Expected 4D (unbatched) or 5D (batched) input to conv3d"), "{e}");
}

// ------------------------------------------------------------------------------------------
// scaled_dot_product_attention, unflatten
// ------------------------------------------------------------------------------------------

fn t64(v: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape).unwrap()
}

/// The fused f32 kernel (parallel over many matrices, several blocks of query rows, strided
/// head views, additive and boolean masks, causal) equals the f64 decomposition.
#[test]
fn sdpa_fused_f32_matches_the_f64_decomposition() {
    use ferrofx_core::ops::attention::scaled_dot_product_attention as sdpa;
    let (n, h, l, s, d) = (2, 3, 150, 140, 8);
    let q64 = t64(rnd(n * l * h * d, 1), &[n, l, h * d]);
    let k64 = t64(rnd(n * s * h * d, 2), &[n, s, h * d]);
    let v64 = t64(rnd(n * s * h * d, 3), &[n, s, h * d]);
    let heads = |x: &Tensor| x.unflatten(2, &[h as i64, -1]).unwrap().permute(&[0, 2, 1, 3]).unwrap();
    let f32_of = |x: &Tensor| x.to_dtype(DType::F32).unwrap();
    let mask64 = t64(rnd(n * s, 4).iter().map(|v| if *v < -0.5 { f64::MIN } else { *v }).collect(), &[n, 1, 1, s]);
    let bmask = Tensor::from_vec(rnd(l * s, 5).iter().map(|v| *v > -0.7).collect::<Vec<bool>>(), &[l, s]).unwrap();
    for (mask, causal) in [(None, false), (Some(&mask64), false), (Some(&bmask), false), (None, true)] {
        let want = sdpa(&heads(&q64), &heads(&k64), &heads(&v64), mask, causal, None).unwrap();
        let m32 = mask.map(|m| if m.dtype() == DType::Bool { m.clone() } else { f32_of(m) });
        let (q, k, v) = (heads(&f32_of(&q64)), heads(&f32_of(&k64)), heads(&f32_of(&v64)));
        assert!(!q.is_contiguous(), "heads are strided views");
        let got = sdpa(&q, &k, &v, m32.as_ref(), causal, None).unwrap();
        assert_eq!(got.shape(), &[n, h, l, d]);
        let got: Vec<f64> = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        close(&got, &want.to_vec::<f64>().unwrap(), 2e-5);
    }
}

/// The fused f32 backward (`scaled_dot_product_attention_backward`: several blocks of query
/// rows, many matrices in parallel or one matrix on the pool, strided head views, additive and
/// boolean masks, causal) gives the f64 tensor-op formula's gradients; broadcast batch dims run
/// the formula; a wrong `grad_out` is named.
#[test]
fn sdpa_fused_f32_backward_matches_the_f64_formula() {
    use ferrofx_core::ops::attention::scaled_dot_product_attention as sdpa;
    for (n, h) in [(2, 3), (1, 1)] {
        let (l, s, d) = (150, 140, 8);
        let heads = |x: &Tensor| x.unflatten(2, &[h as i64, -1]).unwrap().permute(&[0, 2, 1, 3]).unwrap();
        let mask64 = t64(rnd(n * s, 4).iter().map(|v| if *v < -0.5 { f64::MIN } else { *v }).collect(), &[n, 1, 1, s]);
        let bmask = Tensor::from_vec(rnd(l * s, 5).iter().map(|v| *v > -0.7).collect::<Vec<bool>>(), &[l, s]).unwrap();
        let w = t64(rnd(n * h * l * d, 6), &[n, h, l, d]);
        for (mask, causal) in [(None, false), (Some(&mask64), false), (Some(&bmask), false), (None, true)] {
            let grads = |dt: DType| -> Vec<Vec<f64>> {
                let leaf = |seed: u64, len: usize| {
                    t64(rnd(n * len * h * d, seed), &[n, len, h * d])
                        .to_dtype(dt)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap()
                };
                let (q, k, v) = (leaf(1, l), leaf(2, s), leaf(3, s));
                let m = mask.map(|m| if m.dtype() == DType::Bool { m.clone() } else { m.to_dtype(dt).unwrap() });
                let o = sdpa(&heads(&q), &heads(&k), &heads(&v), m.as_ref(), causal, None).unwrap();
                o.mul(w.to_dtype(dt).unwrap()).unwrap().sum().unwrap().backward(None, false, false).unwrap();
                [q, k, v]
                    .iter()
                    .map(|x| x.grad().unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap())
                    .collect()
            };
            let (want, got) = (grads(DType::F64), grads(DType::F32));
            for (g, w) in got.iter().zip(&want) {
                close(g, w, 1e-4);
            }
        }
    }
    // broadcast batch dims (key shared by both images) run the tensor-op formula, same values
    let q = t(rnd(2 * 5 * 4, 7).iter().map(|&v| v as f32).collect(), &[2, 5, 4]);
    let k = t(rnd(6 * 4, 8).iter().map(|&v| v as f32).collect(), &[1, 6, 4]);
    let v = t(rnd(2 * 6 * 3, 9).iter().map(|&v| v as f32).collect(), &[2, 6, 3]);
    let g = t(rnd(2 * 5 * 3, 10).iter().map(|&v| v as f32).collect(), &[2, 5, 3]);
    let call = |args: Vec<Value>| op::call("scaled_dot_product_attention_backward", args, vec![]);
    let out = call(vec![(&g).into(), (&q).into(), (&k).into(), (&v).into()]).unwrap();
    assert_eq!(
        out.iter().map(|x| x.shape().to_vec()).collect::<Vec<_>>(),
        [vec![2, 5, 4], vec![1, 6, 4], vec![2, 6, 3]]
    );
    let ke = k.expand(&[2, 6, 4]).unwrap().contiguous().unwrap();
    let full = call(vec![(&g).into(), (&q).into(), (&ke).into(), (&v).into()]).unwrap();
    let dk_sum = full[1].sum_dim(&[0], true).unwrap().to_vec::<f32>().unwrap();
    close(
        &out[1].to_vec::<f32>().unwrap().iter().map(|&x| x as f64).collect::<Vec<_>>(),
        &dk_sum.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        1e-5,
    );
    let e = call(vec![(&q).into(), (&q).into(), (&k).into(), (&v).into()]).unwrap_err().to_string();
    assert!(
        e.contains("scaled_dot_product_attention_backward") && e.contains("grad_out") && e.contains("[2, 5, 3]"),
        "{e}"
    );
}

#[test]
fn sdpa_rows_with_nothing_to_attend_are_zero_and_errors_are_clear() {
    use ferrofx_core::ops::attention::scaled_dot_product_attention as sdpa;
    let q = t(rnd(2 * 3 * 4, 7).iter().map(|&v| v as f32).collect(), &[2, 3, 4]);
    let none = Tensor::from_vec(vec![true, true, false, false, true, false], &[3, 2]).unwrap();
    let kv = t(rnd(2 * 2 * 4, 8).iter().map(|&v| v as f32).collect(), &[2, 2, 4]);
    let o = sdpa(&q, &kv, &kv, Some(&none), false, None).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&o[4..8], &[0.0; 4], "row 1 attends nothing");
    assert!(o[..4].iter().all(|v| v.is_finite() && *v != 0.0));
    // errors name the op, the shapes and the fix
    let e = err(sdpa(&q, &t(vec![0.0; 2 * 2 * 5], &[2, 2, 5]), &kv, None, false, None));
    assert!(e.contains("scaled_dot_product_attention") && e.contains("[2, 2, 5]") && e.contains("[.., S, E]"), "{e}");
    let e = err(sdpa(&q, &kv, &kv, Some(&none), true, None));
    assert!(e.contains("Explicit attn_mask should not be set when is_causal=True"), "{e}");
    let e = err(sdpa(&q, &kv, &kv, Some(&t(vec![0.0; 4], &[4, 1])), false, None));
    assert!(e.contains("attn_mask of shape [4, 1] does not broadcast") && e.contains("[2, 3, 2]"), "{e}");
    let e = err(sdpa(&t(vec![0.0; 4], &[4]), &kv, &kv, None, false, None));
    assert!(e.contains("at least 2 dimensional"), "{e}");
    let e = err(sdpa(&q, &kv.to_dtype(DType::F64).unwrap(), &kv, None, false, None));
    assert!(e.contains("same dtype"), "{e}");
    let e = op::call(
        "scaled_dot_product_attention",
        vec![(&q).into(), (&kv).into(), (&kv).into(), Value::None, Value::Float(0.1)],
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("dropout_p = 0.1 is not supported"), "{e}");
}

#[test]
fn sdpa_meta_cost_and_gradients() {
    use ferrofx_core::autograd::{gradcheck, GradcheckOptions};
    use ferrofx_core::ops::attention::scaled_dot_product_attention as sdpa;
    let opdef = op::require("scaled_dot_product_attention").unwrap();
    let f = DType::F32;
    let args = vec![sym(&[2, 4, 16, 8], f).into(), sym(&[1, 4, 12, 8], f).into(), sym(&[4, 12, 5], f).into()];
    let bound = op::bind(opdef.name, opdef.schema, args, vec![]).unwrap();
    let metas = (opdef.meta)(&bound).unwrap();
    assert_eq!(metas[0].shape.to_vec(), vec![2, 4, 16, 5]);
    let cost = (opdef.cost)(&bound, &metas);
    assert_eq!(cost.flops, 2 * 4 * 16 * 12 * (2 * 8 + 2 * 5 + 5));
    // f64 gradients of query, key, value and an additive mask, with broadcast batch dims
    let leaf = |n: usize, shape: &[usize], seed: u64| t64(rnd(n, seed), shape).requires_grad_(true).unwrap();
    let (q, k, v) = (leaf(2 * 3 * 2, &[2, 3, 2], 11), leaf(4 * 2, &[1, 4, 2], 12), leaf(2 * 4 * 3, &[2, 4, 3], 13));
    let m = leaf(4, &[4], 14);
    gradcheck(
        |x| Ok(vec![sdpa(&x[0], &x[1], &x[2], Some(&x[3]), false, None)?]),
        &[q.clone(), k.clone(), v.clone(), m],
        GradcheckOptions::default(),
    )
    .unwrap();
    gradcheck(|x| Ok(vec![sdpa(&x[0], &x[1], &x[2], None, true, Some(0.7))?]), &[q, k, v], GradcheckOptions::default())
        .unwrap();
}

#[test]
fn unflatten_is_a_view_with_clear_errors() {
    let x = t((0..24).map(|i| i as f32).collect(), &[2, 12]);
    let y = x.unflatten(-1, &[3, -1, 2]).unwrap();
    assert_eq!(y.shape(), &[2, 3, 2, 2]);
    assert!(y.shares_storage(&x));
    assert_eq!(y.select(1, 2).unwrap().flatten(0, -1).unwrap().to_vec::<f32>().unwrap()[..4], [8.0, 9.0, 10.0, 11.0]);
    let e = err(x.unflatten(1, &[5, -1]));
    assert!(e.contains("unflatten: Provided sizes [5, -1] don't multiply up to the size of dim 1 (12)"), "{e}");
    assert!(err(x.unflatten(1, &[])).contains("sizes must be non-empty"));
    assert!(err(x.unflatten(2, &[2, 6])).contains("unflatten"));
}

// ------------------------------------------------------------------------------------------
// conv2d_fused: the convolution epilogue (residual add + activation) of ferrofx-compile
// ------------------------------------------------------------------------------------------

fn call1(name: &str, args: Vec<Value>) -> Tensor {
    op::call(name, args, vec![]).unwrap().into_iter().next().unwrap()
}

/// `act(conv2d(..) + residual)` with the unfused ops.
#[allow(clippy::too_many_arguments)]
fn conv_epilogue_unfused(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    s: i64,
    p: i64,
    d: i64,
    groups: i64,
    res: Option<&Tensor>,
    act: &str,
) -> Tensor {
    let mut y = conv::conv2d(x, w, b, &[s, s], &[p, p][..], &[d, d], groups).unwrap();
    if let Some(r) = res {
        y = (&y + r).unwrap();
    }
    match act {
        "none" => y,
        "relu" => y.relu().unwrap(),
        "relu6" | "silu" | "hardswish" => call1(act, vec![(&y).into()]),
        "clamp(-0.5, 0.25)" => call1("clamp", vec![(&y).into(), Value::Float(-0.5), Value::Float(0.25)]),
        other => panic!("no unfused form for {other}"),
    }
}

/// One geometry through every kernel path (depthwise, Winograd, 1x1 GEMM, shifted, im2col),
/// batch 1 (one unit, blocks split over threads) and 3 (units in parallel).
#[allow(clippy::too_many_arguments)]
fn check_conv_epilogue(
    n: usize,
    c: usize,
    o: usize,
    hw: usize,
    k: usize,
    s: i64,
    p: i64,
    d: i64,
    groups: usize,
    act: &str,
) {
    let seed = (n * 7 + c * 13 + o * 17 + hw + k * 3 + s as usize * 5 + groups) as u64;
    let x = t(rnd(n * c * hw * hw, seed).iter().map(|&v| v as f32).collect(), &[n, c, hw, hw]);
    let w = t(rnd(o * (c / groups) * k * k, seed + 1).iter().map(|&v| v as f32).collect(), &[o, c / groups, k, k]);
    let b = t(rnd(o, seed + 2).iter().map(|&v| v as f32).collect(), &[o]);
    let y0 = conv::conv2d(&x, &w, Some(&b), &[s, s], &[p, p][..], &[d, d], groups as i64).unwrap();
    let r = t(rnd(y0.numel(), seed + 3).iter().map(|&v| 3.0 * v as f32).collect(), y0.shape());
    for res in [None, Some(&r)] {
        let want = conv_epilogue_unfused(&x, &w, Some(&b), s, p, d, groups as i64, res, act);
        let got = conv::conv2d_fused(&x, &w, Some(&b), &[s, s], &[p, p], &[d, d], groups as i64, res, act).unwrap();
        assert_eq!(got.shape(), want.shape());
        let (g, wv) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
        for (i, (a, e)) in g.iter().zip(&wv).enumerate() {
            assert!(
                (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "n{n} c{c} o{o} {hw}x{hw} k{k} s{s} p{p} d{d} g{groups} {act} residual={}: element {i}: {a} vs {e}",
                res.is_some()
            );
        }
    }
}

#[test]
fn conv2d_fused_equals_conv_add_activation_on_every_kernel_path() {
    for n in [1, 3] {
        // depthwise 3x3 stride 1 and 2 (MobileNet), 5x5 stride 2 (EfficientNet)
        check_conv_epilogue(n, 32, 32, 20, 3, 1, 1, 1, 32, "relu6");
        check_conv_epilogue(n, 32, 32, 21, 3, 2, 1, 1, 32, "relu6");
        check_conv_epilogue(n, 16, 16, 19, 5, 2, 2, 1, 16, "silu");
        // Winograd 3x3 stride 1 (ResNet)
        check_conv_epilogue(n, 64, 64, 14, 3, 1, 1, 1, 1, "relu");
        // 1x1 pointwise (bottlenecks, MobileNet expand/project)
        check_conv_epilogue(n, 48, 96, 28, 1, 1, 0, 1, 1, "relu");
        check_conv_epilogue(n, 96, 24, 14, 1, 1, 0, 1, 1, "none");
        // shifted scheme (grouped 3x3 on a large plane) and im2col (stride 2, 7x7 stem, dilation)
        check_conv_epilogue(n, 8, 8, 40, 3, 1, 1, 1, 2, "hardswish");
        check_conv_epilogue(n, 16, 32, 17, 3, 2, 1, 1, 1, "clamp(-0.5, 0.25)");
        check_conv_epilogue(n, 3, 16, 30, 7, 2, 3, 1, 1, "relu");
        check_conv_epilogue(n, 8, 8, 15, 3, 1, 2, 2, 1, "relu");
        // 1x1 stride 2 (ResNet downsample)
        check_conv_epilogue(n, 16, 32, 14, 1, 2, 0, 1, 1, "none");
    }
}

/// `act(naive_conv2d + bias + residual)` in f64 (the activations' formulas).
#[allow(clippy::too_many_arguments)]
fn naive_conv_epilogue(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    ins: (usize, usize, usize, usize),
    ws: (usize, usize, usize),
    s: (usize, usize),
    p: (usize, usize),
    d: (usize, usize),
    groups: usize,
    res: Option<&[f32]>,
    act: &str,
) -> (Vec<f64>, usize, usize) {
    let f = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (mut y, oh, ow) = naive_conv2d(&f(x), &f(w), ins, ws, s, p, d, groups);
    for (j, v) in y.iter_mut().enumerate() {
        *v += b[(j / (oh * ow)) % ws.0] as f64;
        if let Some(r) = res {
            *v += r[j] as f64;
        }
        let clamp = |v: f64, lo: f64, hi: f64| v.max(lo).min(hi);
        *v = match act {
            "none" => *v,
            "relu" => v.max(0.0),
            "relu6" => clamp(*v, 0.0, 6.0),
            "clamp(-0.5, 0.25)" => clamp(*v, -0.5, 0.25),
            "silu" => *v / (1.0 + (-*v).exp()),
            "hardswish" => *v * clamp(*v + 3.0, 0.0, 6.0) / 6.0,
            other => panic!("no reference for {other}"),
        };
    }
    (y, oh, ow)
}

#[test]
fn conv_gemm_paths_match_naive_reference_on_random_shapes() {
    // conv2d_fused and conv2d against an f64 reference on the GEMM paths (1x1 in place,
    // im2col, shifted) at small and large planes: output-channel and pixel tails, strides,
    // padding, dilation, batch > 1, every activation with and without a residual; the training
    // path (weights requiring grad) must agree. These geometries are also the acceptance test
    // of any pre-packed kernel (see docs/compile.md: one was built, measured slower and
    // withdrawn).
    let acts = ["none", "relu", "relu6", "clamp(-0.5, 0.25)", "silu", "hardswish"];
    // (n, c, h, w), (o, kh, kw), stride, padding, dilation
    type Case = ((usize, usize, usize, usize), (usize, usize, usize), (usize, usize), (usize, usize), (usize, usize));
    let mut cases: Vec<Case> = vec![
        ((1, 64, 7, 7), (130, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 40, 14, 14), (96, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((2, 24, 30, 30), (37, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 8, 40, 41), (14, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((2, 3, 64, 63), (10, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((1, 6, 48, 48), (9, 3, 3), (1, 1), (2, 2), (2, 2)),
        ((1, 32, 14, 13), (64, 1, 1), (2, 2), (0, 0), (1, 1)),
        ((1, 3, 33, 35), (16, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((2, 3, 31, 29), (13, 7, 7), (2, 2), (3, 3), (1, 1)),
        ((1, 20, 7, 7), (70, 3, 3), (1, 1), (1, 1), (1, 1)),
        ((1, 12, 11, 9), (8, 3, 2), (1, 2), (2, 1), (2, 1)),
        ((3, 5, 6, 6), (1, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 1, 5, 4), (7, 1, 1), (1, 1), (0, 0), (1, 1)),
        // the AVX-512 1x1 kernel (conv/pointwise.rs) and its boundary with the GEMM path:
        // K past one 256-row block and its tail, output-channel tails of the 8-row tile, pixel
        // tails of the 48-pixel tile (P = 65, 105, 120, 196, 784; 33, 49 and 64 take the GEMM),
        // strided 1x1, batches run in parallel, both thread splits (pixel tiles, channel panels)
        ((1, 12, 5, 13), (8, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 70, 47, 50), (72, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 300, 7, 7), (13, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 520, 14, 14), (70, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((2, 33, 19, 23), (17, 1, 1), (2, 2), (0, 0), (1, 1)),
        ((3, 24, 8, 8), (40, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 16, 20, 30), (9, 1, 1), (3, 2), (0, 0), (1, 1)),
        ((1, 12, 3, 11), (8, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 64, 28, 28), (96, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 300, 7, 7), (130, 1, 1), (1, 1), (0, 0), (1, 1)),
        ((1, 40, 14, 14), (25, 1, 1), (2, 2), (0, 0), (2, 2)),
        // larger kernels on small planes, where im2col + GEMM runs today and any pre-packed
        // replacement must agree: ResNet's 3x3 on 7x7 (K = 576, past two 256-row blocks),
        // strided 3x3 on P = 49, 196, 256, 1024 and 1089 pixels, batches in parallel,
        // dilation, asymmetric kernels and padding, odd channel counts
        ((1, 64, 7, 7), (72, 3, 3), (1, 1), (1, 1), (1, 1)),
        ((3, 29, 9, 9), (33, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((2, 40, 28, 28), (24, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((1, 16, 32, 32), (20, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((1, 10, 64, 64), (12, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((1, 10, 66, 66), (12, 3, 3), (2, 2), (1, 1), (1, 1)),
        ((2, 17, 12, 10), (9, 3, 5), (1, 2), (2, 1), (2, 1)),
        ((1, 130, 7, 7), (65, 3, 3), (1, 1), (1, 1), (1, 1)),
    ];
    // random small geometries
    let r = rnd(8 * 40, 4242);
    let pick =
        |i: usize, lo: usize, hi: usize| lo + ((r[i] + 1.0) / 2.0 * (hi - lo + 1) as f64) as usize % (hi - lo + 1);
    for i in 0..40 {
        let k = [1, 1, 3, 5][pick(8 * i, 0, 3)];
        let (st, pd, dl) = (pick(8 * i + 1, 1, 3), pick(8 * i + 2, 0, 2), pick(8 * i + 3, 1, 2));
        let hw = (k - 1) * dl + 1 + pick(8 * i + 4, 0, 20);
        let (c, o, n) = (pick(8 * i + 5, 1, 33), pick(8 * i + 6, 1, 40), pick(8 * i + 7, 1, 2));
        let pd = if k == 1 && st == 1 && i % 2 == 0 { 0 } else { pd };
        cases.push(((n, c, hw, hw + 1), (o, k, k), (st, st), (pd, pd), (dl, dl)));
    }
    for (i, &(ins, ws, s, p, d)) in cases.iter().enumerate() {
        let act = acts[i % acts.len()];
        let (n, c) = (ins.0, ins.1);
        let seed = 500 + 10 * i as u64;
        let xf: Vec<f32> = rnd(n * c * ins.2 * ins.3, seed).iter().map(|&v| v as f32).collect();
        let wf: Vec<f32> = rnd(ws.0 * c * ws.1 * ws.2, seed + 1).iter().map(|&v| v as f32).collect();
        let bf: Vec<f32> = rnd(ws.0, seed + 2).iter().map(|&v| v as f32).collect();
        let x = t(xf.clone(), &[n, c, ins.2, ins.3]);
        let w = t(wf.clone(), &[ws.0, c, ws.1, ws.2]);
        let b = t(bf.clone(), &[ws.0]);
        let (si, pi, di) = ([s.0 as i64, s.1 as i64], [p.0 as i64, p.1 as i64], [d.0 as i64, d.1 as i64]);
        let y0 = conv::conv2d(&x, &w, Some(&b), &si, &pi[..], &di, 1).unwrap();
        let rf: Vec<f32> = rnd(y0.numel(), seed + 3).iter().map(|&v| 2.0 * v as f32).collect();
        let rt = t(rf.clone(), y0.shape());
        for res in [None, Some(&rf)] {
            let (want, oh, ow) = naive_conv_epilogue(&xf, &wf, &bf, ins, ws, s, p, d, 1, res.map(|v| &v[..]), act);
            let rt = res.map(|_| &rt);
            let got = conv::conv2d_fused(&x, &w, Some(&b), &si, &pi, &di, 1, rt, act).unwrap();
            assert_eq!(got.shape(), &[n, ws.0, oh, ow], "case {i}");
            let tag = format!("case {i} {ins:?} {ws:?} s{s:?} p{p:?} d{d:?} {act} residual={}", res.is_some());
            let g: Vec<f64> = got.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
            for (j, (a, e)) in g.iter().zip(&want).enumerate() {
                assert!((a - e).abs() <= 2e-5 * (1.0 + e.abs()), "{tag}: element {j}: {a} vs {e}");
            }
            // twice: a second call (which may read cached weight transforms) gives the same
            let again = conv::conv2d_fused(&x, &w, Some(&b), &si, &pi, &di, 1, rt, act).unwrap();
            assert_eq!(again.to_vec::<f32>().unwrap(), got.to_vec::<f32>().unwrap(), "{tag}");
        }
        // plain conv2d, and the training path (weights requiring grad are never cached)
        let wg = w.detach().requires_grad_(true).unwrap();
        let (want, _, _) = naive_conv_epilogue(&xf, &wf, &bf, ins, ws, s, p, d, 1, None, "none");
        for y in [y0, conv::conv2d(&x, &wg, Some(&b), &si, &pi[..], &di, 1).unwrap()] {
            let g: Vec<f64> = y.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
            close(&g, &want, 2e-5);
        }
    }
}

#[test]
fn depthwise_conv_matches_naive_reference_on_random_shapes() {
    // float32 depthwise convolutions (the direct 3x3 kernel for strides 1 and 2 on AVX-512, the
    // padded stencil otherwise) against an f64 reference: MobileNet's shapes, planes 1-3 wide,
    // edges (every padding 0-2, the last partial 16-column chunk, rows wider than 128), strides
    // 1 and 2 in each dimension, dilation and 5x5 (the stencil), batch 1-3, every activation
    // with and without a residual, plain conv2d and conv2d_fused.
    let acts = ["none", "relu", "relu6", "clamp(-0.5, 0.25)", "silu", "hardswish"];
    // (n, c, h, w), k, stride, padding, dilation
    type Case = ((usize, usize, usize, usize), usize, (usize, usize), (usize, usize), (usize, usize));
    let mut cases: Vec<Case> = vec![
        ((1, 32, 112, 112), 3, (1, 1), (1, 1), (1, 1)),
        ((1, 16, 112, 112), 3, (2, 2), (1, 1), (1, 1)),
        ((1, 24, 14, 14), 3, (1, 1), (1, 1), (1, 1)),
        ((3, 20, 7, 7), 3, (1, 1), (1, 1), (1, 1)),
        ((1, 8, 14, 14), 3, (2, 2), (1, 1), (1, 1)),
        ((1, 3, 5, 150), 3, (1, 2), (1, 1), (1, 1)),
        ((2, 4, 1, 1), 3, (1, 1), (1, 1), (1, 1)),
        ((1, 5, 2, 3), 3, (2, 2), (1, 1), (1, 1)),
        ((1, 6, 3, 1), 3, (1, 1), (1, 1), (1, 1)),
        ((1, 4, 9, 17), 3, (1, 1), (0, 0), (1, 1)),
        ((1, 4, 10, 17), 3, (2, 1), (2, 0), (1, 1)),
        ((1, 4, 16, 33), 3, (1, 1), (1, 1), (2, 2)),
        ((2, 6, 19, 18), 5, (2, 2), (2, 2), (1, 1)),
    ];
    let r = rnd(8 * 40, 777);
    let pick =
        |i: usize, lo: usize, hi: usize| lo + ((r[i] + 1.0) / 2.0 * (hi - lo + 1) as f64) as usize % (hi - lo + 1);
    for i in 0..40 {
        let k = [3, 3, 3, 5][pick(8 * i, 0, 3)];
        let (sh, sw) = (pick(8 * i + 1, 1, 2), pick(8 * i + 2, 1, 2));
        let (ph, pw) = (pick(8 * i + 3, 0, 2), pick(8 * i + 4, 0, 2));
        let dl = if i % 5 == 4 { 2 } else { 1 };
        let reach: usize = (k - 1) * dl + 1;
        let h = pick(8 * i + 5, 1, 24).max(reach.saturating_sub(2 * ph));
        let w = pick(8 * i + 6, 1, 40).max(reach.saturating_sub(2 * pw));
        let (n, c) = (1 + i % 3, pick(8 * i + 7, 1, 12));
        cases.push(((n, c, h, w), k, (sh, sw), (ph, pw), (dl, dl)));
    }
    for (i, &(ins, k, s, p, d)) in cases.iter().enumerate() {
        let act = acts[i % acts.len()];
        let (n, c) = (ins.0, ins.1);
        let seed = 900 + 10 * i as u64;
        let xf: Vec<f32> = rnd(n * c * ins.2 * ins.3, seed).iter().map(|&v| v as f32).collect();
        let wf: Vec<f32> = rnd(c * k * k, seed + 1).iter().map(|&v| v as f32).collect();
        let bf: Vec<f32> = rnd(c, seed + 2).iter().map(|&v| v as f32).collect();
        let (x, w, b) = (t(xf.clone(), &[n, c, ins.2, ins.3]), t(wf.clone(), &[c, 1, k, k]), t(bf.clone(), &[c]));
        let (si, pi, di) = ([s.0 as i64, s.1 as i64], [p.0 as i64, p.1 as i64], [d.0 as i64, d.1 as i64]);
        let tag = format!("case {i} {ins:?} k{k} s{s:?} p{p:?} d{d:?} {act}");
        let y0 = conv::conv2d(&x, &w, Some(&b), &si, &pi[..], &di, c as i64).unwrap();
        let (want, oh, ow) = naive_conv_epilogue(&xf, &wf, &bf, ins, (c, k, k), s, p, d, c, None, "none");
        assert_eq!(y0.shape(), &[n, c, oh, ow], "{tag}");
        close(&y0.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, 1e-5);
        let rf: Vec<f32> = rnd(y0.numel(), seed + 3).iter().map(|&v| 2.0 * v as f32).collect();
        let rt = t(rf.clone(), y0.shape());
        for res in [None, Some(&rf)] {
            let (want, _, _) = naive_conv_epilogue(&xf, &wf, &bf, ins, (c, k, k), s, p, d, c, res.map(|v| &v[..]), act);
            let got = conv::conv2d_fused(&x, &w, Some(&b), &si, &pi, &di, c as i64, res.map(|_| &rt), act).unwrap();
            let g: Vec<f64> = got.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
            for (j, (a, e)) in g.iter().zip(&want).enumerate() {
                assert!(
                    (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "{tag} residual={}: element {j}: {a} vs {e}",
                    res.is_some()
                );
            }
        }
    }
}

#[test]
fn few_input_channel_conv_matches_naive_reference() {
    // float32 convolutions with at most 4 input channels (the stems; the direct kernel on
    // AVX-512): MobileNetV2's and ResNet's stems, then random kernels 2-12 wide, strides 1-3
    // (column stride 3 takes im2col), padding, batch 1-2, 1-40 output channels (partial blocks
    // of 16), every activation with and without a residual
    let acts = ["none", "relu", "relu6", "clamp(-0.5, 0.25)", "silu", "hardswish"];
    type Case = ((usize, usize, usize, usize), (usize, usize, usize), (usize, usize), (usize, usize));
    let mut cases: Vec<Case> = vec![
        ((1, 3, 224, 224), (32, 3, 3), (2, 2), (1, 1)),
        ((1, 3, 224, 224), (64, 7, 7), (2, 2), (3, 3)),
        ((2, 3, 35, 33), (24, 3, 3), (1, 1), (1, 1)),
    ];
    let r = rnd(8 * 30, 31337);
    let pick =
        |i: usize, lo: usize, hi: usize| lo + ((r[i] + 1.0) / 2.0 * (hi - lo + 1) as f64) as usize % (hi - lo + 1);
    for i in 0..30 {
        let (kh, kw) = (pick(8 * i, 1, 7), pick(8 * i + 1, 2, 12));
        let (sh, sw) = (pick(8 * i + 2, 1, 3), pick(8 * i + 3, 1, 2) + usize::from(i == 7));
        let (ph, pw) = (pick(8 * i + 4, 0, 3).min(kh - 1), pick(8 * i + 4, 0, 5).min(kw - 1));
        let (c, o) = (pick(8 * i + 5, 1, 4), pick(8 * i + 6, 1, 40));
        let (h, w) = ((kh + pick(8 * i + 7, 0, 20)).max(1), kw + pick(8 * i + 7, 0, 40));
        cases.push(((1 + i % 2, c, h, w), (o, kh, kw), (sh, sw), (ph, pw)));
    }
    for (i, &(ins, ws, s, p)) in cases.iter().enumerate() {
        let act = acts[i % acts.len()];
        let (n, c) = (ins.0, ins.1);
        let seed = 1300 + 10 * i as u64;
        let xf: Vec<f32> = rnd(n * c * ins.2 * ins.3, seed).iter().map(|&v| v as f32).collect();
        let wf: Vec<f32> = rnd(ws.0 * c * ws.1 * ws.2, seed + 1).iter().map(|&v| v as f32).collect();
        let bf: Vec<f32> = rnd(ws.0, seed + 2).iter().map(|&v| v as f32).collect();
        let (x, w, b) =
            (t(xf.clone(), &[n, c, ins.2, ins.3]), t(wf.clone(), &[ws.0, c, ws.1, ws.2]), t(bf.clone(), &[ws.0]));
        let (si, pi) = ([s.0 as i64, s.1 as i64], [p.0 as i64, p.1 as i64]);
        let tag = format!("case {i} {ins:?} {ws:?} s{s:?} p{p:?} {act}");
        let (want, oh, ow) = naive_conv_epilogue(&xf, &wf, &bf, ins, ws, s, p, (1, 1), 1, None, "none");
        let y0 = conv::conv2d(&x, &w, Some(&b), &si, &pi[..], &[1, 1], 1).unwrap();
        assert_eq!(y0.shape(), &[n, ws.0, oh, ow], "{tag}");
        close(&y0.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, 1e-5);
        let rf: Vec<f32> = rnd(y0.numel(), seed + 3).iter().map(|&v| 2.0 * v as f32).collect();
        let rt = t(rf.clone(), y0.shape());
        for res in [None, Some(&rf)] {
            let (want, _, _) = naive_conv_epilogue(&xf, &wf, &bf, ins, ws, s, p, (1, 1), 1, res.map(|v| &v[..]), act);
            let got = conv::conv2d_fused(&x, &w, Some(&b), &si, &pi, &[1, 1], 1, res.map(|_| &rt), act).unwrap();
            let g: Vec<f64> = got.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
            for (j, (a, e)) in g.iter().zip(&want).enumerate() {
                assert!(
                    (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "{tag} residual={}: element {j}: {a} vs {e}",
                    res.is_some()
                );
            }
        }
    }
}

#[test]
fn conv_weights_written_in_place_take_effect_on_the_next_call() {
    let x = t(rnd(2 * 16 * 9 * 9, 1).iter().map(|&v| v as f32).collect(), &[2, 16, 9, 9]);
    let w = t(rnd(20 * 16, 2).iter().map(|&v| v as f32).collect(), &[20, 16, 1, 1]);
    let y1 = conv::conv2d(&x, &w, None, &[1, 1], &[0, 0][..], &[1, 1], 1).unwrap().to_vec::<f32>().unwrap();
    w.mul_(2.0).unwrap();
    let y2 = conv::conv2d(&x, &w, None, &[1, 1], &[0, 0][..], &[1, 1], 1).unwrap().to_vec::<f32>().unwrap();
    for (a, b) in y1.iter().zip(&y2) {
        assert_eq!(2.0 * a, *b);
    }
    // a view of part of a weight storage convolves with that part
    let big = t(rnd(40 * 16, 3).iter().map(|&v| v as f32).collect(), &[40, 16, 1, 1]);
    let half = big.narrow(0, 20, 20).unwrap();
    let y3 = conv::conv2d(&x, &half, None, &[1, 1], &[0, 0][..], &[1, 1], 1).unwrap();
    let y4 = conv::conv2d(&x, &half.contiguous().unwrap(), None, &[1, 1], &[0, 0][..], &[1, 1], 1).unwrap();
    assert_eq!(y3.to_vec::<f32>().unwrap(), y4.to_vec::<f32>().unwrap());
}

#[test]
fn conv2d_fused_errors_name_the_op_the_shapes_and_the_fix() {
    let x = t(vec![0.5; 2 * 4 * 5 * 5], &[2, 4, 5, 5]);
    let w = t(vec![0.1; 6 * 4 * 3 * 3], &[6, 4, 3, 3]);
    let fused =
        |res: Option<&Tensor>, act: &str| conv::conv2d_fused(&x, &w, None, &[1, 1], &[1, 1], &[1, 1], 1, res, act);
    let e = err(fused(None, "gelu"));
    assert!(e.contains("conv2d_fused") && e.contains("unknown activation 'gelu'") && e.contains("relu6"), "{e}");
    for bad in ["clamp(2, 1)", "clamp(0)", "clamp(a, 1)", "clamp(0, nan)", ""] {
        assert!(err(fused(None, bad)).contains("unknown activation"), "{bad}");
    }
    let small = t(vec![0.0; 6 * 5 * 5], &[1, 6, 5, 5]);
    let e = err(fused(Some(&small), "relu"));
    assert!(e.contains("conv2d_fused") && e.contains("[2, 6, 5, 5]") && e.contains("[1, 6, 5, 5]"), "{e}");
    let x64 = x.to_dtype(DType::F64).unwrap();
    let w64 = w.to_dtype(DType::F64).unwrap();
    let e = err(conv::conv2d_fused(&x64, &w64, None, &[1, 1], &[1, 1], &[1, 1], 1, None, "relu"));
    assert!(e.contains("conv2d_fused") && e.contains("float32"), "{e}");
    // the conv's own geometry errors are conv2d's
    let w_bad = t(vec![0.1; 6 * 3 * 3 * 3], &[6, 3, 3, 3]);
    assert!(
        err(conv::conv2d_fused(&x, &w_bad, None, &[1, 1], &[1, 1], &[1, 1], 1, None, "relu")).contains("conv2d_fused")
    );
    // text form round trip, exact for any f32 bounds
    for a in ["none", "relu", "relu6", "silu", "hardswish", "clamp(-0.1, 3.3)", "clamp(-1.0, 1.0)"] {
        let act = conv::Activation::parse(a).unwrap();
        assert_eq!(conv::Activation::parse(&act.to_string()).unwrap(), act, "{a}");
    }
    assert_eq!(conv::Activation::parse("clamp(0, 6)").unwrap().to_string(), "relu6");
}

// ------------------------------------------------------------------------------------------
// fused training kernels: batch_norm_fused, the relu mask of the max-pool and batch-norm
// backward kernels (made by ferrofx-compile; each must equal its unfused chain bit for bit)
// ------------------------------------------------------------------------------------------

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Values with the special cases a mask or an activation must keep: zeros of both signs,
/// NaN, infinities, and enough of them to take the parallel paths.
fn special(n: usize, seed: u64) -> Vec<f32> {
    let specials = [0.0f32, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-30, -1e-30];
    rnd(n, seed)
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % 97 == 5 { specials[(i / 97) % specials.len()] } else { v as f32 * 3.0 })
        .collect()
}

#[test]
fn batch_norm_fused_equals_batch_norm_then_add_and_activation_bit_for_bit() {
    for (shape, training) in [(vec![2usize, 3, 5, 7], true), (vec![4, 16, 40, 40], true), (vec![3, 4, 6], false)] {
        let c = shape[1];
        let n: usize = shape.iter().product();
        let x = t(rnd(n, 1).iter().map(|&v| v as f32 * 2.0 + 0.5).collect(), &shape);
        let res = t(special(n, 2), &shape);
        let w = t(rnd(c, 3).iter().map(|&v| v as f32).collect(), &[c]);
        let b = t(rnd(c, 4).iter().map(|&v| v as f32).collect(), &[c]);
        for (act, residual) in [("relu", true), ("relu", false), ("none", true), ("relu6", true)] {
            let stats = |v: f32| (t(vec![v; c], &[c]), t(vec![1.0 + v; c], &[c]));
            let ((rm1, rv1), (rm2, rv2)) = (stats(0.25), stats(0.25));
            let bn_args = |rm: &Tensor, rv: &Tensor| -> Vec<Value> {
                vec![
                    (&x).into(),
                    rm.into(),
                    rv.into(),
                    (&w).into(),
                    (&b).into(),
                    training.into(),
                    0.1.into(),
                    1e-5.into(),
                ]
            };
            let mut y = call1("batch_norm", bn_args(&rm1, &rv1));
            if residual {
                y = call1("add", vec![(&y).into(), (&res).into()]);
            }
            let want = match act {
                "relu" => call1("relu", vec![(&y).into()]),
                "relu6" => call1("relu6", vec![(&y).into()]),
                _ => y,
            };
            let mut args = bn_args(&rm2, &rv2);
            args.push(if residual { (&res).into() } else { Value::None });
            args.push(Value::Str(act.into()));
            let got = call1("batch_norm_fused", args);
            assert_eq!(bits(&got), bits(&want), "{shape:?} training={training} {act} residual={residual}");
            // the side effect: the same running statistics
            assert_eq!(bits(&rm2), bits(&rm1));
            assert_eq!(bits(&rv2), bits(&rv1));
        }
    }
}

#[test]
fn batch_norm_fused_rejects_other_dtypes_and_residual_shapes_with_the_fix() {
    let x = t(vec![1.0; 2 * 3 * 4], &[2, 3, 4]);
    let base = |res: Value| -> Vec<Value> {
        vec![
            (&x).into(),
            Value::None,
            Value::None,
            Value::None,
            Value::None,
            true.into(),
            0.1.into(),
            1e-5.into(),
            res,
            Value::Str("relu".into()),
        ]
    };
    let bad = t(vec![1.0; 3 * 4], &[3, 4]);
    let e = op::call("batch_norm_fused", base((&bad).into()), vec![]).unwrap_err().to_string();
    assert!(e.contains("batch_norm_fused") && e.contains("residual") && e.contains("separate add"), "{e}");
    let x64 = x.to_dtype(DType::F64).unwrap();
    let mut a = base(Value::None);
    a[0] = (&x64).into();
    let e = op::call("batch_norm_fused", a, vec![]).unwrap_err().to_string();
    assert!(e.contains("float32 only") && e.contains("batch_norm and the add"), "{e}");
    let mut a = base(Value::None);
    a[9] = Value::Str("gelu".into());
    let e = op::call("batch_norm_fused", a, vec![]).unwrap_err().to_string();
    assert!(e.contains("unknown activation 'gelu'"), "{e}");
}

#[test]
fn max_pool2d_backward_relu_mask_equals_the_separate_mask_bit_for_bit() {
    let ints = |v: &[i64]| Value::from(v.to_vec());
    for (shape, k, s, p) in [([2usize, 3, 9, 11], 3, 2, 1), ([4, 16, 56, 56], 3, 2, 1), ([1, 2, 8, 8], 2, 2, 0)] {
        let n: usize = shape.iter().product();
        // a relu output: non-negative values with many zeros (ties) and a NaN
        let y: Vec<f32> = special(n, 7).iter().map(|&v| if v.is_nan() { v } else { v.max(0.0) }).collect();
        let y = t(y, &shape);
        let out = [shape[0], shape[1], (shape[2] + 2 * p - k) / s + 1, (shape[3] + 2 * p - k) / s + 1];
        let g = t(special(out.iter().product(), 8), &out);
        let args = |mask: bool| -> Vec<Value> {
            vec![
                (&g).into(),
                (&y).into(),
                ints(&[k as i64; 2]),
                ints(&[s as i64; 2]),
                ints(&[p as i64; 2]),
                ints(&[1, 1]),
                false.into(),
                mask.into(),
            ]
        };
        let unmasked = call1("max_pool2d_backward", args(false));
        let gt = call1("gt", vec![(&y).into(), Value::Float(0.0)]);
        let want = call1("mul", vec![(&unmasked).into(), (&gt).into()]);
        let got = call1("max_pool2d_backward", args(true));
        assert_eq!(bits(&got), bits(&want), "{shape:?}");
    }
}

#[test]
fn batch_norm_backward_relu_output_equals_the_masked_gradient_bit_for_bit() {
    for shape in [vec![2usize, 3, 5, 7], vec![4, 16, 40, 40]] {
        let c = shape[1];
        let n: usize = shape.iter().product();
        let x = t(rnd(n, 11).iter().map(|&v| v as f32 * 2.0 - 0.25).collect(), &shape);
        let w = t(rnd(c, 12).iter().map(|&v| v as f32).collect(), &[c]);
        let y = t(special(n, 13).iter().map(|&v| if v.is_nan() { v } else { v.max(-0.0) }).collect(), &shape);
        let g = t(special(n, 14), &shape);
        let bwd = |grad: &Tensor, y: Option<&Tensor>| -> Vec<Tensor> {
            let mut a: Vec<Value> =
                vec![grad.into(), true.into(), true.into(), true.into(), (&x).into(), (&w).into(), 1e-5.into()];
            a.push(y.map_or(Value::None, Value::from));
            op::call("batch_norm_backward", a, vec![]).unwrap().into_iter().collect()
        };
        let gt = call1("gt", vec![(&y).into(), Value::Float(0.0)]);
        let masked = call1("mul", vec![(&g).into(), (&gt).into()]);
        let want = bwd(&masked, None);
        let got = bwd(&g, Some(&y));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(bits(a), bits(b), "{shape:?} output {i}");
        }
    }
    let x = t(vec![1.0; 24], &[2, 3, 4]);
    let y = t(vec![1.0; 12], &[3, 4]);
    let a: Vec<Value> =
        vec![(&x).into(), true.into(), false.into(), false.into(), (&x).into(), Value::None, 1e-5.into(), (&y).into()];
    let e = op::call("batch_norm_backward", a, vec![]).unwrap_err().to_string();
    assert!(e.contains("relu_output of shape [3, 4] does not match the input [2, 3, 4]"), "{e}");
}
