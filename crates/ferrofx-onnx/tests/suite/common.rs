//! Helpers shared by the suites: reading `TensorProto` files, comparing outputs.

use ferrofx_core::Tensor;
use ferrofx_onnx::proto::TensorProto;
use ferrofx_onnx::tensor_proto::{tensor_from_proto, ExternalDataDir};
use prost::Message;
use std::path::{Path, PathBuf};

/// Reads a serialised `TensorProto`.
pub fn read_tensor(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = TensorProto::decode(bytes.as_slice()).map_err(|e| format!("{}: {e}", path.display()))?;
    tensor_from_proto(&t, &ExternalDataDir(None)).map_err(|e| e.to_string())
}

/// Largest |a - b| / max(|b|, floor) over the elements, after checking shapes.
pub fn max_rel_err(got: &Tensor, want: &Tensor, floor: f64) -> Result<f64, String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    let g = got.to_vec_f64().map_err(|e| e.to_string())?;
    let w = want.to_vec_f64().map_err(|e| e.to_string())?;
    let scale = w.iter().fold(0f64, |m, x| m.max(x.abs())).max(floor);
    Ok(g.iter().zip(&w).map(|(a, b)| (a - b).abs() / scale).fold(0.0, f64::max))
}

/// The folder named by env var `var`; without it: a panic under CI (`CI=true`), else `None`
/// with a printed note telling how to make the data.
pub fn data_from_env(var: &str, how: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            let msg = format!("{var} is not set: {how}");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("note: skipping: {msg}");
            None
        }
    }
}
