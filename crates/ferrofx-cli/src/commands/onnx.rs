//! `ferrofx import model.onnx -o model.fxm`: an ONNX model becomes a traced-module file;
//! `ferrofx export model.fxm -o model.onnx`: the reverse; and the `.onnx` loading hook of
//! `run`/`show`/`bench`/`draw`.

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

/// Arguments of `ferrofx export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// The traced-module file (`.fxm`; an `.onnx` file is imported first).
    pub model: PathBuf,
    /// Where to write the ONNX model (`.onnx`).
    #[arg(long, short)]
    pub out: PathBuf,
    /// The default-domain opset written (18 to 21).
    #[arg(long, default_value_t = 18)]
    pub opset: i64,
    /// Make dim 0 of every input and output symbolic (`batch`).
    #[arg(long)]
    pub dynamic_batch: bool,
    /// The shape an input is exported at, `NAME=1,3,224,224` (repeatable; default: the shape
    /// recorded in the file).
    #[arg(long = "shape", value_name = "NAME=DIMS")]
    pub shapes: Vec<String>,
}

/// Runs `ferrofx export`.
pub fn run_export(a: &ExportArgs) -> CliResult<()> {
    super::module_io::refuse_overwriting_inputs(&a.out, &[&a.model])?;
    super::module_io::check_output_path(&a.out)?;
    let gm = super::module_io::load_module(&a.model)?;
    let mut shapes = std::collections::HashMap::new();
    for s in &a.shapes {
        let (name, dims) = parse_shape(s)?;
        shapes.insert(name, dims);
    }
    let mut inputs = Vec::new();
    for n in gm.graph().iter().filter(|n| n.op() == ferrofx_fx::Opcode::Placeholder) {
        let meta = n.meta().tensor_meta.as_ref();
        let dims: Vec<usize> = match (shapes.remove(n.name()), meta) {
            (Some(d), _) => d,
            (None, Some(m)) => m.shape.to_vec(),
            (None, None) => {
                return Err(format!(
                    "input `{}` has no recorded shape in {}; give it with --shape {}=D1,D2,...",
                    n.name(),
                    a.model.display(),
                    n.name()
                )
                .into())
            }
        };
        let dtype = meta.map(|m| m.dtype).unwrap_or(ferrofx_core::DType::F32);
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        inputs.push(ferrofx_core::ops::creation::zeros(&dims, Some(dtype))?);
    }
    if let Some(name) = shapes.keys().next() {
        return Err(format!("--shape {name}=...: the module has no input `{name}`").into());
    }
    let opts = ferrofx_onnx::ExportOptions { opset: a.opset, dynamic_batch: a.dynamic_batch };
    let model = ferrofx_onnx::export(&gm, &inputs, &opts)?;
    ferrofx_onnx::export::save(&model, &a.out)?;
    let g = model.graph.as_ref();
    println!(
        "wrote {} (opset {}, {} nodes, {} initializers{})",
        a.out.display(),
        a.opset,
        g.map_or(0, |g| g.node.len()),
        g.map_or(0, |g| g.initializer.len()),
        if a.dynamic_batch { ", dynamic batch" } else { "" }
    );
    Ok(())
}

/// Whether `path` names an ONNX model (by its extension).
pub fn is_onnx(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Loads an `.onnx` file for `run`/`show`/`bench`/`draw`: imported as a GraphModule with its
/// declared shapes; dynamic dimensions are specialised to 1 (a note on stderr says so and how
/// to import other sizes).
pub fn load_onnx(path: &std::path::Path) -> CliResult<ferrofx_fx::GraphModule> {
    let imported = import(path, &ImportOptions::default())?;
    let dynamic: Vec<String> = imported
        .inputs
        .iter()
        .filter(|(spec, _)| spec.shape.iter().any(Option::is_none))
        .map(|(spec, shape)| format!("`{}` {:?}", spec.name, shape))
        .collect();
    if !dynamic.is_empty() {
        eprintln!(
            "note: {}: dynamic dimensions specialised to 1 ({}); for other sizes run `ferrofx import {} --shape NAME=D1,D2,... -o model.fxm`",
            path.display(),
            dynamic.join(", "),
            path.display()
        );
    }
    Ok(imported.module)
}
