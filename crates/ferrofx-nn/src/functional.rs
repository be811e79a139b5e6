//! `torch.nn.functional`: stateless functions over the op registry. Every function dispatches
//! registry ops through the core's public functions, so they trace, differentiate and count
//! FLOPs like any op.

use ferrofx_core::ops::{binary, compare, conv, embedding as emb, linalg, norm, pool, random, softmax as sm, unary};
use ferrofx_core::{DType, Error, Result, Tensor, Value};

// ----- elementwise building blocks -----

/// `a + b`.
pub fn add(a: &Tensor, b: impl Into<Value>) -> Result<Tensor> {
    binary::add(a, b)
}
/// `a - b`.
pub fn sub(a: &Tensor, b: impl Into<Value>) -> Result<Tensor> {
    binary::sub(a, b)
}
/// `a * b`.
pub fn mul(a: &Tensor, b: impl Into<Value>) -> Result<Tensor> {
    binary::mul(a, b)
}
/// `a / b`.
pub fn div(a: &Tensor, b: impl Into<Value>) -> Result<Tensor> {
    binary::div(a, b)
}
/// `-a`.
pub fn neg(a: &Tensor) -> Result<Tensor> {
    unary::neg(a)
}
/// `|a|`.
pub fn abs(a: &Tensor) -> Result<Tensor> {
    unary::abs(a)
}
/// `exp(a)`.
pub fn exp(a: &Tensor) -> Result<Tensor> {
    unary::exp(a)
}
/// `log(a)`.
pub fn log(a: &Tensor) -> Result<Tensor> {
    unary::log(a)
}
/// `where(cond, a, b)`.
pub fn where_(cond: &Tensor, a: impl Into<Value>, b: impl Into<Value>) -> Result<Tensor> {
    compare::where_cond(cond, a, b)
}
/// `clamp(a, min, max)`.
pub fn clamp(a: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
    unary::clamp(a, min, max)
}

// ----- activations -----

/// `F.relu`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    unary::relu(x)
}
/// `F.gelu(x, approximate)` (`"none"` or `"tanh"`).
pub fn gelu(x: &Tensor, approximate: &str) -> Result<Tensor> {
    unary::gelu(x, approximate)
}
/// `F.silu`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    unary::silu(x)
}
/// `torch.sigmoid`.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    unary::sigmoid(x)
}
/// `torch.tanh`.
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    unary::tanh(x)
}
/// `F.leaky_relu(x, negative_slope)`.
pub fn leaky_relu(x: &Tensor, negative_slope: f64) -> Result<Tensor> {
    unary::leaky_relu(x, negative_slope)
}
/// `F.elu(x, alpha)`.
pub fn elu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    unary::elu(x, alpha)
}
/// `F.hardswish`.
pub fn hardswish(x: &Tensor) -> Result<Tensor> {
    unary::hardswish(x)
}
/// `F.relu6`.
pub fn relu6(x: &Tensor) -> Result<Tensor> {
    unary::relu6(x)
}
/// `F.softmax(x, dim)`.
pub fn softmax(x: &Tensor, dim: i64) -> Result<Tensor> {
    sm::softmax(x, dim, None)
}
/// `F.log_softmax(x, dim)`.
pub fn log_softmax(x: &Tensor, dim: i64) -> Result<Tensor> {
    sm::log_softmax(x, dim, None)
}
/// `F.dropout(x, p, training)` (identity when not training or `p == 0`).
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::argument("dropout", format!("dropout probability has to be between 0 and 1, but got {p}")));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    random::dropout(x, p, training)
}

// ----- linear, conv, norm, pool, embedding -----

/// `F.linear(x, weight, bias)`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    linalg::linear(x, weight, bias)
}

/// `F.bilinear(x1, x2, weight, bias)`: `y_k = x1^T W_k x2 + b_k` with weight `[out, in1, in2]`.
pub fn bilinear(x1: &Tensor, x2: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let ws = weight.shape().to_vec();
    if ws.len() != 3 {
        return Err(Error::shape("bilinear", format!("weight must be [out, in1, in2], got {ws:?}")));
    }
    let (o, i1, i2) = (ws[0] as i64, ws[1] as i64, ws[2] as i64);
    let s1 = x1.shape().to_vec();
    if s1.last() != Some(&(i1 as usize)) || x2.shape().last() != Some(&(i2 as usize)) {
        return Err(Error::shape(
            "bilinear",
            format!(
                "input1 {:?} and input2 {:?} do not match weight {ws:?} (last dims must be {i1} and {i2})",
                s1,
                x2.shape()
            ),
        ));
    }
    let lead: Vec<i64> = s1[..s1.len() - 1].iter().map(|&d| d as i64).collect();
    let a = x1.reshape(&[-1, i1])?; // [N, i1]
    let b = x2.reshape(&[-1, i2])?; // [N, i2]
                                    // t[n, o*i2] = a @ W' with W' = W.permute(1,0,2).reshape(i1, o*i2)
    let w2 = weight.permute(&[1, 0, 2])?.reshape(&[i1, o * i2])?;
    let t = a.matmul(&w2)?.reshape(&[-1, o, i2])?; // [N, o, i2]
    let y = t.matmul(&b.unsqueeze(2)?)?.squeeze_dim(2)?; // [N, o]
    let y = match bias {
        Some(bb) => add(&y, bb)?,
        None => y,
    };
    let mut shape = lead;
    shape.push(o);
    y.reshape(&shape)
}

/// `F.conv1d`.
pub fn conv1d(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    stride: i64,
    padding: i64,
    dilation: i64,
    groups: i64,
) -> Result<Tensor> {
    conv::conv1d(x, w, b, &[stride], &[padding][..], &[dilation], groups)
}

/// `F.conv2d` with square or rectangular (`[h, w]`) stride/padding/dilation.
pub fn conv2d(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    stride: [i64; 2],
    padding: [i64; 2],
    dilation: [i64; 2],
    groups: i64,
) -> Result<Tensor> {
    conv::conv2d(x, w, b, &stride, &padding[..], &dilation, groups)
}

/// `F.conv_transpose2d`.
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose2d(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    stride: [i64; 2],
    padding: [i64; 2],
    output_padding: [i64; 2],
    groups: i64,
    dilation: [i64; 2],
) -> Result<Tensor> {
    conv::conv_transpose2d(x, w, b, &stride, &padding, &output_padding, groups, &dilation)
}

/// `F.batch_norm`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    norm::batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
}

/// `F.layer_norm`.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[i64],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    norm::layer_norm(x, normalized_shape, weight, bias, eps)
}

/// `F.group_norm`.
pub fn group_norm(
    x: &Tensor,
    num_groups: i64,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    norm::group_norm(x, num_groups, weight, bias, eps)
}

/// `F.embedding`.
pub fn embedding(input: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    emb::embedding(input, weight, padding_idx)
}

/// `F.max_pool2d` (stride defaults to the kernel size when `None`).
pub fn max_pool2d(
    x: &Tensor,
    kernel: [i64; 2],
    stride: Option<[i64; 2]>,
    padding: [i64; 2],
    dilation: [i64; 2],
    ceil_mode: bool,
) -> Result<Tensor> {
    let s = stride.unwrap_or(kernel);
    pool::max_pool2d(x, &kernel, &s, &padding, &dilation, ceil_mode)
}

/// `F.avg_pool2d`.
pub fn avg_pool2d(
    x: &Tensor,
    kernel: [i64; 2],
    stride: Option<[i64; 2]>,
    padding: [i64; 2],
    ceil_mode: bool,
    count_include_pad: bool,
) -> Result<Tensor> {
    let s = stride.unwrap_or(kernel);
    pool::avg_pool2d(x, &kernel, &s, &padding, ceil_mode, count_include_pad, None)
}

/// `F.adaptive_avg_pool2d`.
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [i64; 2]) -> Result<Tensor> {
    pool::adaptive_avg_pool2d(x, &output_size)
}

/// `F.scaled_dot_product_attention(q, k, v, attn_mask)`: `softmax(q k^T / sqrt(d) + mask) v`
/// over the last two dims. A boolean mask marks positions that **may** attend (PyTorch's
/// convention); a float mask is added. Without active dropout this is the fused registry op
/// [`ferrofx_core::ops::attention::scaled_dot_product_attention`] (a row that may attend
/// nothing gives zeros, as PyTorch's); with dropout, the same formula in separate ops.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    training: bool,
) -> Result<Tensor> {
    if dropout_p == 0.0 || !training {
        // the fused registry op (scores never materialised), PyTorch's semantics
        return ferrofx_core::ops::attention::scaled_dot_product_attention(q, k, v, attn_mask, false, None);
    }
    let d = *q
        .shape()
        .last()
        .ok_or_else(|| Error::shape("scaled_dot_product_attention", "query must have at least 1 dimension"))?;
    let nd = k.ndim() as i64;
    let scores = q.matmul(&k.transpose(nd - 2, nd - 1)?)?;
    let scores = mul(&scores, 1.0 / (d as f64).sqrt())?;
    let scores = match attn_mask {
        None => scores,
        Some(m) if m.dtype() == DType::Bool => where_(m, &scores, f64::NEG_INFINITY)?,
        Some(m) => add(&scores, m)?,
    };
    let p = softmax(&scores, -1)?;
    let p = dropout(&p, dropout_p, training)?;
    p.matmul(v)
}
