//! `ferrofx import model.onnx -o model.fxm`: an ONNX model becomes a traced-module file.

use super::CliResult;
use ferrofx_onnx::{import, ImportOptions};
use std::path::PathBuf;

/// Arguments of `ferrofx import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// Where to write the traced module (`.fxm`).
    #[arg(long, short)]
    pub out: PathBuf,
    /// The shape of an input with dynamic dimensions, `NAME=1,3,224,224` (repeatable).
    #[arg(long = "shape", value_name = "NAME=DIMS")]
    pub shapes: Vec<String>,
    /// The size given to dynamic dimensions without a `--shape` (e.g. `batch_size`).
    #[arg(long, default_value_t = 1)]
    pub dynamic_dim: usize,
}

/// Parses `NAME=1,3,224,224`.
fn parse_shape(s: &str) -> CliResult<(String, Vec<usize>)> {
    let (name, dims) = s.rsplit_once('=').ok_or_else(|| format!("--shape {s:?}: expected NAME=D1,D2,..."))?;
    let dims = dims
        .split(',')
        .map(|d| d.trim().parse::<usize>().map_err(|_| format!("--shape {s:?}: `{d}` is not a size")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), dims))
}

/// Runs `ferrofx import`.
pub fn run_import(a: &ImportArgs) -> CliResult<()> {
    let mut opts = ImportOptions { dynamic_dim: a.dynamic_dim, ..ImportOptions::default() };
    for s in &a.shapes {
        let (name, dims) = parse_shape(s)?;
        opts.input_shapes.insert(name, dims);
    }
    let imported = import(&a.model, &opts)?;
    imported.module.save(&a.out).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    let inputs: Vec<String> = imported.inputs.iter().map(|(s, shape)| format!("{} {:?}", s.name, shape)).collect();
    println!(
        "wrote {} ({} nodes, {} tensors; inputs {})",
        a.out.display(),
        imported.module.graph().len(),
        imported.names.len(),
        inputs.join(", ")
    );
    Ok(())
}
