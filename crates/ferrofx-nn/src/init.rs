//! `torch.nn.init`: in-place initialisers drawing from the current generator
//! ([`ferrofx_core::ops::random::manual_seed`] makes them reproducible). They run without
//! recording autograd history, so they work on parameters that require grad.

use ferrofx_core::{Error, Result, Tensor};

/// `calculate_gain(nonlinearity, param)`.
pub fn calculate_gain(nonlinearity: &str, param: Option<f64>) -> Result<f64> {
    Ok(match nonlinearity {
        "linear" | "conv1d" | "conv2d" | "conv3d" | "conv_transpose1d" | "conv_transpose2d" | "conv_transpose3d"
        | "sigmoid" => 1.0,
        "tanh" => 5.0 / 3.0,
        "relu" => 2f64.sqrt(),
        "leaky_relu" => {
            let slope = param.unwrap_or(0.01);
            (2.0 / (1.0 + slope * slope)).sqrt()
        }
        "selu" => 3.0 / 4.0,
        other => return Err(Error::argument("calculate_gain", format!("Unsupported nonlinearity {other}"))),
    })
}

/// `(fan_in, fan_out)` of a weight: `[out, in, *kernel]`.
pub fn calculate_fan_in_and_fan_out(t: &Tensor) -> Result<(usize, usize)> {
    let s = t.shape();
    if s.len() < 2 {
        return Err(Error::shape(
            "init",
            format!("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions (got shape {s:?})"),
        ));
    }
    let rf: usize = s[2..].iter().product();
    Ok((s[1] * rf, s[0] * rf))
}

/// `uniform_(t, a, b)`.
pub fn uniform_(t: &Tensor, a: f64, b: f64) -> Result<()> {
    let _g = ferrofx_core::autograd::no_grad();
    t.uniform_(a, b).map(|_| ())
}

/// `normal_(t, mean, std)`.
pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<()> {
    let _g = ferrofx_core::autograd::no_grad();
    t.normal_(mean, std).map(|_| ())
}

/// `constant_(t, value)`.
pub fn constant_(t: &Tensor, value: f64) -> Result<()> {
    let _g = ferrofx_core::autograd::no_grad();
    t.fill_(value).map(|_| ())
}

/// `zeros_(t)`.
pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

/// `ones_(t)`.
pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

fn fan(t: &Tensor, mode: &str) -> Result<usize> {
    let (fi, fo) = calculate_fan_in_and_fan_out(t)?;
    match mode {
        "fan_in" => Ok(fi),
        "fan_out" => Ok(fo),
        other => Err(Error::argument("init", format!("Mode {other} not supported, please use one of fan_in, fan_out"))),
    }
}

/// `kaiming_uniform_(t, a, mode, nonlinearity)`: U(-b, b) with `b = gain * sqrt(3 / fan)`.
pub fn kaiming_uniform_(t: &Tensor, a: f64, mode: &str, nonlinearity: &str) -> Result<()> {
    let f = fan(t, mode)?;
    if f == 0 {
        return Ok(()); // PyTorch warns and skips zero-element tensors
    }
    let gain = calculate_gain(nonlinearity, Some(a))?;
    let bound = 3f64.sqrt() * gain / (f as f64).sqrt();
    uniform_(t, -bound, bound)
}

/// `kaiming_normal_(t, a, mode, nonlinearity)`: N(0, gain / sqrt(fan)).
pub fn kaiming_normal_(t: &Tensor, a: f64, mode: &str, nonlinearity: &str) -> Result<()> {
    let f = fan(t, mode)?;
    if f == 0 {
        return Ok(());
    }
    let gain = calculate_gain(nonlinearity, Some(a))?;
    normal_(t, 0.0, gain / (f as f64).sqrt())
}

/// `xavier_uniform_(t, gain)`.
pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<()> {
    let (fi, fo) = calculate_fan_in_and_fan_out(t)?;
    let a = gain * (6.0 / (fi + fo) as f64).sqrt();
    uniform_(t, -a, a)
}

/// `xavier_normal_(t, gain)`.
pub fn xavier_normal_(t: &Tensor, gain: f64) -> Result<()> {
    let (fi, fo) = calculate_fan_in_and_fan_out(t)?;
    normal_(t, 0.0, gain * (2.0 / (fi + fo) as f64).sqrt())
}

/// A new parameter: a float32 tensor of `shape`, initialised by `init`, requiring grad.
pub fn parameter(shape: &[usize], init: impl FnOnce(&Tensor) -> Result<()>) -> Result<Tensor> {
    let t = ferrofx_core::ops::kernel::zeros(shape, ferrofx_core::DType::F32)?;
    init(&t)?;
    t.requires_grad_(true)
}

/// The default init of Linear/Conv weights: `kaiming_uniform_(a = sqrt(5))`, i.e.
/// U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
pub fn default_weight(shape: &[usize]) -> Result<Tensor> {
    parameter(shape, |t| kaiming_uniform_(t, 5f64.sqrt(), "fan_in", "leaky_relu"))
}

/// The default init of Linear/Conv biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
pub fn default_bias(n: usize, fan_in: usize) -> Result<Tensor> {
    let b = if fan_in > 0 { 1.0 / (fan_in as f64).sqrt() } else { 0.0 };
    parameter(&[n], |t| uniform_(t, -b, b))
}
