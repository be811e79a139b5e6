//! Window-function ONNX ops (`HannWindow`, `HammingWindow`, `BlackmanWindow`): constants of a
//! size known at import time, computed in f64 and cast to `output_datatype`.

use super::elementwise::cast;
use super::{Convert, Node};
use crate::tensor_proto::dtype_from_onnx;
use ferrofx_core::{Result, Tensor};
use std::f64::consts::PI;

fn window(n: &Node<'_>, f: fn(f64) -> f64) -> Result<Vec<Tensor>> {
    let size = n.const_ints(n.x(0)?, "size")?.first().copied().unwrap_or(0);
    if !(0..=1 << 24).contains(&size) {
        return Err(n.err(format!("window size {size} is out of range")));
    }
    let periodic = n.i("periodic", 1) != 0;
    let den = if periodic { size as f64 } else { (size - 1).max(1) as f64 };
    let vals: Vec<f64> = (0..size).map(|i| f(2.0 * PI * i as f64 / den)).collect();
    let dtype = dtype_from_onnx(n.i("output_datatype", 1) as i32, "output_datatype").map_err(|e| n.err(e))?;
    Ok(vec![cast(&Tensor::from_vec(vals, &[size as usize])?, dtype)?])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[
    ("HannWindow", |n| window(n, |t| 0.5 - 0.5 * t.cos())),
    ("HammingWindow", |n| window(n, |t| 25.0 / 46.0 - (21.0 / 46.0) * t.cos())),
    ("BlackmanWindow", |n| window(n, |t| 0.42 - 0.5 * t.cos() + 0.08 * (2.0 * t).cos())),
];
