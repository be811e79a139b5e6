//! `gradcheck` / `gradgradcheck`: compare analytical gradients (the engine) with central finite
//! differences, in f64. For users' custom ops and functions, and for our own formula tests.

use super::grad_mode::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Tolerances of [`gradcheck`] (PyTorch's defaults).
#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions { eps: 1e-6, atol: 1e-5, rtol: 1e-3 }
    }
}

fn fresh(values: &[f64], like: &Tensor, requires_grad: bool) -> Result<Tensor> {
    let t = crate::ops::kernel::from_f64_vec(values, like.shape(), like.dtype())?;
    if requires_grad {
        t.requires_grad_(true)?;
    }
    Ok(t)
}

/// Checks the gradients of `f` at `inputs` against finite differences. Inputs with
/// `requires_grad` are checked; they must be float64 (as PyTorch recommends). Returns an error
/// naming the output, the input, the element and both values on the first mismatch.
///
/// `f` must be deterministic and build its result from its arguments with ferrofx ops.
pub fn gradcheck(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<()> {
    let checked: Vec<usize> = (0..inputs.len()).filter(|&i| inputs[i].requires_grad()).collect();
    if checked.is_empty() {
        return Err(Error::autograd("gradcheck", "gradcheck expects at least one input tensor to require gradient"));
    }
    for &i in &checked {
        if inputs[i].dtype() != crate::DType::F64 {
            return Err(Error::autograd(
                "gradcheck",
                format!(
                    "input {i} has dtype {}; gradcheck needs float64 inputs for accurate finite differences",
                    inputs[i].dtype()
                ),
            ));
        }
    }
    let base: Vec<Vec<f64>> = inputs.iter().map(|t| t.to_vec_f64()).collect::<Result<_>>()?;
    let leaves: Vec<Tensor> =
        inputs.iter().enumerate().map(|(i, t)| fresh(&base[i], t, t.requires_grad())).collect::<Result<_>>()?;
    let outs = f(&leaves)?;
    let out_vals: Vec<Vec<f64>> = outs.iter().map(|o| o.to_vec_f64()).collect::<Result<_>>()?;
    let wrt: Vec<Tensor> = checked.iter().map(|&i| leaves[i].clone()).collect();

    // Numerical Jacobian columns: num[o][k][(input, elem)]
    let eval = |i: usize, e: usize, delta: f64| -> Result<Vec<Vec<f64>>> {
        let _g = no_grad();
        let args: Vec<Tensor> = inputs
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let mut v = base[j].clone();
                if j == i {
                    v[e] += delta;
                }
                fresh(&v, t, false)
            })
            .collect::<Result<_>>()?;
        f(&args)?.iter().map(|o| o.to_vec_f64()).collect()
    };
    // num[ci][e][o][k] = d out[o][k] / d input[checked[ci]][e], by central differences.
    let mut num: Vec<Vec<Vec<Vec<f64>>>> = Vec::with_capacity(checked.len());
    for &i in &checked {
        let mut cols = Vec::with_capacity(base[i].len());
        for e in 0..base[i].len() {
            let plus = eval(i, e, opts.eps)?;
            let minus = eval(i, e, -opts.eps)?;
            let col: Vec<Vec<f64>> = plus
                .iter()
                .zip(&minus)
                .map(|(p, m)| p.iter().zip(m).map(|(p, m)| (p - m) / (2.0 * opts.eps)).collect())
                .collect();
            cols.push(col);
        }
        num.push(cols);
    }
    // Analytical rows via one-hot grad_outputs.
    for (o, out) in outs.iter().enumerate() {
        let n = out_vals[o].len();
        for k in 0..n {
            let ana_rows: Vec<Option<Tensor>> = if out.requires_grad() {
                let mut onehot = vec![0.0; n];
                onehot[k] = 1.0;
                let go = fresh(&onehot, out, false)?;
                super::grad(std::slice::from_ref(out), &wrt, &[Some(go)], true, false, true)?
            } else {
                vec![None; wrt.len()]
            };
            for (ci, &i) in checked.iter().enumerate() {
                let ana: Vec<f64> = match &ana_rows[ci] {
                    Some(t) => t.to_vec_f64()?,
                    None => vec![0.0; base[i].len()],
                };
                for e in 0..base[i].len() {
                    let nv = num[ci][e][o][k];
                    let a = ana[e];
                    if (a - nv).abs() > opts.atol + opts.rtol * nv.abs() || a.is_nan() != nv.is_nan() {
                        return Err(Error::autograd(
                            "gradcheck",
                            format!(
                                "Jacobian mismatch for output {o} with respect to input {i}, at output element {k} and input element {e}: numerical {nv}, analytical {a}"
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks second-order gradients: runs [`gradcheck`] on `inputs ↦ grad(f(inputs), inputs,
/// v, create_graph=true)` with fixed pseudo-random `v`.
pub fn gradgradcheck(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Clone,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<()> {
    let mask: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
    let g = move |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let outs = f(xs)?;
        let wrt: Vec<Tensor> = xs.iter().zip(&mask).filter(|(_, m)| **m).map(|(t, _)| t.clone()).collect();
        let vs: Vec<Option<Tensor>> = outs
            .iter()
            .enumerate()
            .map(|(o, t)| {
                let n = t.numel();
                let v: Vec<f64> = (0..n).map(|k| 0.5 + ((k * 7 + o * 3) % 5) as f64 * 0.25).collect();
                fresh(&v, t, false).map(Some)
            })
            .collect::<Result<_>>()?;
        if !crate::autograd::is_grad_enabled() {
            // Finite-difference evaluations: differentiate anyway, the result is data.
            let _e = crate::autograd::enable_grad();
            let xs2: Vec<Tensor> = wrt.iter().map(|t| fresh(&t.to_vec_f64()?, t, true)).collect::<Result<_>>()?;
            let mut k = 0;
            let full: Vec<Tensor> = xs
                .iter()
                .zip(&mask)
                .map(|(t, m)| {
                    if *m {
                        k += 1;
                        xs2[k - 1].clone()
                    } else {
                        t.clone()
                    }
                })
                .collect();
            let outs = f(&full)?;
            let gs = super::grad(&outs, &xs2, &vs, false, false, true)?;
            return gs
                .into_iter()
                .zip(&xs2)
                .map(|(g, x)| g.map(Ok).unwrap_or_else(|| fresh(&vec![0.0; x.numel()], x, false)))
                .collect();
        }
        let gs = super::grad(&outs, &wrt, &vs, true, true, true)?;
        gs.into_iter()
            .zip(&wrt)
            .map(|(g, x)| g.map(Ok).unwrap_or_else(|| fresh(&vec![0.0; x.numel()], x, false)))
            .collect()
    };
    gradcheck(g, inputs, opts)
}
