//! Losses (`torch.nn.functional`): cross_entropy (class indices or probabilities,
//! ignore_index, label_smoothing, class weights), nll_loss, mse_loss, l1_loss, smooth_l1_loss,
//! binary_cross_entropy(_with_logits), kl_div. Built from registry ops, so they differentiate
//! and trace.

use crate::functional as F;
use ferrofx_core::ops::{binary, compare, unary};
use ferrofx_core::{DType, Error, Result, Tensor};

/// How a loss reduces its elementwise values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Elementwise losses.
    None,
    /// Mean (the default).
    Mean,
    /// Sum.
    Sum,
}

impl Reduction {
    /// Parses `"none"`, `"mean"` or `"sum"`.
    pub fn parse(s: &str) -> Result<Reduction> {
        match s {
            "none" => Ok(Reduction::None),
            "mean" => Ok(Reduction::Mean),
            "sum" => Ok(Reduction::Sum),
            other => Err(Error::argument("loss", format!("{other} is not a valid value for reduction"))),
        }
    }
}

fn reduce(x: Tensor, r: Reduction) -> Result<Tensor> {
    match r {
        Reduction::None => Ok(x),
        Reduction::Mean => x.mean(),
        Reduction::Sum => x.sum(),
    }
}

fn same_shape(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shape(
            op,
            format!(
                "Using a target size ({:?}) that is different to the input size ({:?}) is not supported",
                b.shape(),
                a.shape()
            ),
        ));
    }
    Ok(())
}

/// Options of [`cross_entropy`] / [`nll_loss`] (PyTorch's defaults).
#[derive(Debug, Clone)]
pub struct CeOpts {
    /// Class weights `[C]`.
    pub weight: Option<Tensor>,
    /// Target value to ignore (-100).
    pub ignore_index: i64,
    /// Reduction (mean).
    pub reduction: Reduction,
    /// Label smoothing in `[0, 1]` (0).
    pub label_smoothing: f64,
}

impl Default for CeOpts {
    fn default() -> Self {
        CeOpts { weight: None, ignore_index: -100, reduction: Reduction::Mean, label_smoothing: 0.0 }
    }
}

fn check_class_target(op: &str, input: &Tensor, target: &Tensor) -> Result<()> {
    let (is, ts) = (input.shape(), target.shape());
    let ok = match is.len() {
        1 => ts.is_empty(),
        0 => false,
        _ => ts.len() + 1 == is.len() && ts[0] == is[0] && ts[1..] == is[2..],
    };
    if !ok {
        return Err(Error::shape(
            op,
            format!("expected target of shape {:?} for input of shape {is:?}, got target {ts:?}", {
                let mut e = is.to_vec();
                if e.len() >= 2 {
                    e.remove(1);
                } else {
                    e.clear();
                }
                e
            }),
        ));
    }
    if !target.dtype().is_integral() || target.dtype() == DType::Bool {
        return Err(Error::dtype(
            op,
            format!("expected target of dtype int64 (class indices), got {}", target.dtype()),
        ));
    }
    Ok(())
}

/// `F.nll_loss(input, target, weight, ignore_index, reduction)`: input holds log-probabilities
/// `[N, C, d...]` (or `[C]`), target class indices `[N, d...]`.
pub fn nll_loss(input: &Tensor, target: &Tensor, o: &CeOpts) -> Result<Tensor> {
    let op = "nll_loss";
    check_class_target(op, input, target)?;
    let (input, target) =
        if input.ndim() == 1 { (input.unsqueeze(0)?, target.unsqueeze(0)?) } else { (input.clone(), target.clone()) };
    let c = input.shape()[1] as i64;
    let target = target.to_dtype(DType::I64)?;
    let valid = compare::ne(&target, o.ignore_index)?; // bool
    let safe = F::where_(&valid, &target, 0i64)?;
    if let Ok(v) = safe.to_vec::<i64>() {
        if let Some(bad) = v.iter().find(|&&t| t < 0 || t >= c) {
            return Err(Error::index(op, format!("Target {bad} is out of bounds (number of classes is {c})")));
        }
    }
    let picked = input.gather(1, &safe.unsqueeze(1)?)?.squeeze_dim(1)?; // [N, d...]
    let w = match &o.weight {
        Some(w) => {
            if w.shape() != [c as usize] {
                return Err(Error::shape(op, format!("weight tensor should be defined either for all {c} classes or no classes but got weight tensor of shape: {:?}", w.shape())));
            }
            let flat = w
                .index_select(0, &safe.reshape(&[-1])?)?
                .reshape(&safe.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())?;
            F::mul(&flat, &valid)?
        }
        None => valid.to_dtype(input.dtype())?,
    };
    let loss = F::neg(&F::mul(&picked, &w)?)?;
    match o.reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(),
        Reduction::Mean => F::div(&loss.sum()?, &w.sum()?),
    }
}

/// `F.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)`. The
/// target is either class indices (integer, `[N, d...]`) or class probabilities (float, the
/// input's shape).
pub fn cross_entropy(input: &Tensor, target: &Tensor, o: &CeOpts) -> Result<Tensor> {
    let op = "cross_entropy";
    if !(0.0..=1.0).contains(&o.label_smoothing) {
        return Err(Error::argument(
            op,
            format!("label_smoothing must be between 0.0 and 1.0. Got: {}", o.label_smoothing),
        ));
    }
    let class_dim = if input.ndim() == 1 { 0 } else { 1 };
    let logp = F::log_softmax(input, class_dim)?;
    let c = input.shape().get(class_dim as usize).copied().unwrap_or(0);
    let ls = o.label_smoothing;
    // weight broadcast over the class dim: [1, C, 1, ...]
    let wview = |w: &Tensor| -> Result<Tensor> {
        let mut shape = vec![1i64; input.ndim()];
        shape[class_dim as usize] = c as i64;
        w.reshape(&shape)
    };
    if target.dtype().is_floating_point() {
        same_shape(op, input, target)?;
        let t = if ls > 0.0 { F::add(&F::mul(target, 1.0 - ls)?, ls / c as f64)? } else { target.clone() };
        let mut prod = F::mul(&logp, &t)?;
        if let Some(w) = &o.weight {
            prod = F::mul(&prod, &wview(w)?)?;
        }
        let loss = F::neg(&prod.sum_dim(&[class_dim], false)?)?;
        return match o.reduction {
            Reduction::None => Ok(loss),
            Reduction::Sum => loss.sum(),
            Reduction::Mean => {
                let n = (input.numel() / c.max(1)) as f64;
                F::div(&loss.sum()?, n)
            }
        };
    }
    let nll = nll_loss(&logp, target, o)?;
    if ls == 0.0 {
        return Ok(nll);
    }
    // label smoothing with class indices (PyTorch's cross_entropy_loss_label_smoothing)
    let valid = compare::ne(target, o.ignore_index)?;
    let weighted = match &o.weight {
        Some(w) => F::mul(&logp, &wview(w)?)?,
        None => logp.clone(),
    };
    let smooth = F::neg(&weighted.sum_dim(&[class_dim], false)?)?;
    let smooth = F::mul(&smooth, &valid)?;
    let smooth = match o.reduction {
        Reduction::None => smooth,
        Reduction::Sum => smooth.sum()?,
        Reduction::Mean => match &o.weight {
            Some(w) => {
                let safe = F::where_(&valid, target, 0i64)?.to_dtype(DType::I64)?;
                let ws = F::mul(&w.index_select(0, &safe.reshape(&[-1])?)?, &valid.reshape(&[-1])?)?;
                F::div(&smooth.sum()?, &ws.sum()?)?
            }
            None => F::div(&smooth.sum()?, &valid.to_dtype(input.dtype())?.sum()?)?,
        },
    };
    F::add(&F::mul(&nll, 1.0 - ls)?, &F::mul(&smooth, ls / c as f64)?)
}

/// `F.mse_loss(input, target, reduction)`.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    same_shape("mse_loss", input, target)?;
    let d = F::sub(input, target)?;
    reduce(F::mul(&d, &d)?, reduction)
}

/// `F.l1_loss(input, target, reduction)`.
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    same_shape("l1_loss", input, target)?;
    reduce(F::abs(&F::sub(input, target)?)?, reduction)
}

/// `F.smooth_l1_loss(input, target, reduction, beta)`: `0.5 d²/beta` where `|d| < beta`, else
/// `|d| - 0.5 beta`.
pub fn smooth_l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction, beta: f64) -> Result<Tensor> {
    same_shape("smooth_l1_loss", input, target)?;
    if beta < 0.0 {
        return Err(Error::argument("smooth_l1_loss", "smooth_l1_loss does not support negative values for beta."));
    }
    let a = F::abs(&F::sub(input, target)?)?;
    if beta == 0.0 {
        return reduce(a, reduction);
    }
    let small = compare::lt(&a, beta)?;
    let quad = F::mul(&F::mul(&a, &a)?, 0.5 / beta)?;
    let lin = F::sub(&a, 0.5 * beta)?;
    reduce(F::where_(&small, &quad, &lin)?, reduction)
}

/// `F.binary_cross_entropy(input, target, weight, reduction)`: input are probabilities; the
/// logs are clamped at -100 as in PyTorch.
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy", input, target)?;
    let lp = F::clamp(&F::log(input)?, Some(-100.0), None)?;
    let one_minus = binary::rsub(input, 1.0)?;
    let lq = F::clamp(&F::log(&one_minus)?, Some(-100.0), None)?;
    let one_minus_t = binary::rsub(target, 1.0)?;
    let mut l = F::neg(&F::add(&F::mul(target, &lp)?, &F::mul(&one_minus_t, &lq)?)?)?;
    if let Some(w) = weight {
        l = F::mul(&l, w)?;
    }
    reduce(l, reduction)
}

/// `F.binary_cross_entropy_with_logits(input, target, weight, reduction, pos_weight)`, in the
/// numerically stable form `(1 - y) x + (1 + (pw - 1) y) (log1p(exp(-|x|)) + max(-x, 0))`.
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
    pos_weight: Option<&Tensor>,
) -> Result<Tensor> {
    same_shape("binary_cross_entropy_with_logits", input, target)?;
    let softplus_neg = F::add(&unary::log1p(&F::exp(&F::neg(&F::abs(input)?)?)?)?, &F::relu(&F::neg(input)?)?)?;
    let one_minus_t = binary::rsub(target, 1.0)?;
    let coef = match pos_weight {
        Some(pw) => F::add(&F::mul(&F::sub(pw, 1.0)?, target)?, 1.0)?,
        None => ferrofx_core::ops::creation::ones_like(input, None)?,
    };
    let mut l = F::add(&F::mul(&one_minus_t, input)?, &F::mul(&coef, &softplus_neg)?)?;
    if let Some(w) = weight {
        l = F::mul(&l, w)?;
    }
    reduce(l, reduction)
}

/// `F.kl_div(input, target, reduction, log_target)`; `input` holds log-probabilities.
/// `reduction` is `"none"`, `"mean"`, `"sum"` or `"batchmean"` (sum / batch size).
pub fn kl_div(input: &Tensor, target: &Tensor, reduction: &str, log_target: bool) -> Result<Tensor> {
    let l = if log_target {
        F::mul(&F::exp(target)?, &F::sub(target, input)?)?
    } else {
        // xlogy(t, t) - t * input, with 0 where t == 0
        let pos = compare::gt(target, 0.0)?;
        let safe = F::where_(&pos, target, 1.0)?;
        let tlogt = F::mul(target, &F::log(&safe)?)?;
        F::sub(&tlogt, &F::mul(target, input)?)?
    };
    match reduction {
        "batchmean" => {
            let n = input.shape().first().copied().unwrap_or(1).max(1);
            F::div(&l.sum()?, n as f64)
        }
        r => reduce(l, Reduction::parse(r)?),
    }
}
