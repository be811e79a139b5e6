use ferrofx_core::{DType, Error, Result, Tensor};

fn for_grads(op: &str, params: &[Tensor], mut f: impl FnMut(&Tensor) -> Result<()>) -> Result<()> {
    for p in params {
        if let Some(g) = p.grad() {
            if !matches!(g.dtype(), DType::F32 | DType::F64) {
                return Err(Error::dtype(op, format!("gradients must be float32/float64, got {}", g.dtype())));
            }
            f(&g)?;
        }
    }
    Ok(())
}

fn scale_in_place(op: &str, g: &Tensor, f: impl Fn(f64) -> f64) -> Result<()> {
    let (s, l) = g.concrete(op)?;
    let r = l.contiguous_range().ok_or_else(|| Error::argument(op, "gradients must be contiguous"))?;
    {
        let mut guard = s.write();
        if let Some(v) = guard.as_mut_slice::<f32>() {
            v[r].iter_mut().for_each(|x| *x = f(*x as f64) as f32);
        } else if let Some(v) = guard.as_mut_slice::<f64>() {
            v[r].iter_mut().for_each(|x| *x = f(*x));
        }
    }
    s.bump_version();
    Ok(())
}

/// `torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`: scales all gradients by
/// `min(1, max_norm / (total_norm + 1e-6))`; returns the total norm (over all gradients as one
/// vector). `norm_type` may be `f64::INFINITY`.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<f64> {
    let op = "clip_grad_norm_";
    if norm_type <= 0.0 || norm_type.is_nan() {
        return Err(Error::argument(op, format!("norm_type must be positive, got {norm_type}")));
    }
    let mut acc = 0f64;
    for_grads(op, params, |g| {
        for v in g.to_vec_f64()? {
            if norm_type.is_infinite() {
                acc = acc.max(v.abs());
            } else {
                acc += v.abs().powf(norm_type);
            }
        }
        Ok(())
    })?;
    let total = if norm_type.is_infinite() { acc } else { acc.powf(1.0 / norm_type) };
    let coef = (max_norm / (total + 1e-6)).min(1.0);
    if coef < 1.0 {
        for_grads(op, params, |g| scale_in_place(op, g, |x| x * coef))?;
    }
    Ok(total)
}

/// `torch.nn.utils.clip_grad_value_(params, clip_value)`: clamps every gradient element to
/// `[-clip_value, clip_value]`.
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    let op = "clip_grad_value_";
    if clip_value < 0.0 {
        return Err(Error::argument(op, format!("clip_value must be non-negative, got {clip_value}")));
    }
    for_grads(op, params, |g| scale_in_place(op, g, |x| x.clamp(-clip_value, clip_value)))
}
