//! PyTorch-like `Display` for tensors: `tensor([[1.0000, 2.0000], [3.0000, 4.0000]])`, with
//! `dtype=` appended for dtypes other than float32, int64 and bool. Tensors with more than 1000
//! elements show the first and last three entries of each dim around `...`, as PyTorch does.

use crate::dtype::DType;
use crate::tensor::Tensor;
use std::fmt;

const THRESHOLD: usize = 1000;
const EDGE: usize = 3;

fn fmt_elem(v: f64, dtype: DType, int_like: bool) -> String {
    if dtype == DType::Bool {
        return if v != 0.0 { "True".into() } else { "False".into() };
    }
    if !dtype.is_floating_point() {
        return format!("{v}");
    }
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf".into() } else { "-inf".into() }
    } else if int_like {
        format!("{v:.0}.")
    } else {
        format!("{v:.4}")
    }
}

fn write_dim(
    out: &mut String,
    vals: &[String],
    shape: &[usize],
    offset: usize,
    depth: usize,
    summarize: bool,
    width: usize,
) {
    if shape.is_empty() {
        out.push_str(&format!("{:>width$}", vals[offset]));
        return;
    }
    let n = shape[0];
    let inner: usize = shape[1..].iter().product();
    out.push('[');
    let idx: Vec<Option<usize>> = if summarize && n > 2 * EDGE {
        (0..EDGE).map(Some).chain(std::iter::once(None)).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (k, i) in idx.iter().enumerate() {
        if k > 0 {
            out.push(',');
            if shape.len() > 1 {
                out.push_str(&"\n".repeat(shape.len() - 1));
                out.push_str(&" ".repeat(depth + 8));
            } else {
                out.push(' ');
            }
        }
        match i {
            Some(i) => write_dim(out, vals, &shape[1..], offset + i * inner, depth + 1, summarize, width),
            None => out.push_str("..."),
        }
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_symbolic() {
            return write!(f, "{self:?}");
        }
        let dtype = self.dtype();
        let shape = self.shape().to_vec();
        let values = self.to_vec_f64().map_err(|_| fmt::Error)?;
        let int_like = values.iter().all(|v| !v.is_finite() || v.fract() == 0.0);
        let strs: Vec<String> = values.iter().map(|&v| fmt_elem(v, dtype, int_like)).collect();
        let width = strs.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut out = String::from("tensor(");
        if values.is_empty() {
            out.push_str("[]");
        } else {
            write_dim(&mut out, &strs, &shape, 0, 0, values.len() > THRESHOLD, width);
        }
        if !matches!(dtype, DType::F32 | DType::I64 | DType::Bool) {
            out.push_str(&format!(", dtype=torch.{dtype}"));
        }
        out.push(')');
        f.write_str(&out)
    }
}
