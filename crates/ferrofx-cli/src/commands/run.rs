//! `ferrofx run FILE --input X.safetensors -o Y.safetensors`: runs a saved traced module on
//! tensors read from a safetensors file (inputs in key order `input0`, `input1`, ... or the
//! file's order) and writes the outputs (`output0`, ...).

use super::CliResult;
use ferrofx_core::Value;
use ferrofx_fx::GraphModule;
use ferrofx_nn::{load_state_dict_file, save_state_dict, Module, StateDict};
use std::path::PathBuf;

/// Arguments of `ferrofx run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// A traced-module file.
    pub file: PathBuf,
    /// A safetensors file with the inputs.
    #[arg(long, short)]
    pub input: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long, short)]
    pub out: PathBuf,
}

/// Runs `ferrofx run`.
pub fn run(a: &RunArgs) -> CliResult<()> {
    let gm = GraphModule::load(&a.file).map_err(|e| format!("cannot load {}: {e}", a.file.display()))?;
    let inputs =
        load_state_dict_file(&a.input).map_err(|e| format!("cannot read inputs from {}: {e}", a.input.display()))?;
    let mut named: Vec<(String, ferrofx_core::Tensor)> = inputs.into_iter().collect();
    if named.iter().all(|(k, _)| k.starts_with("input") && k[5..].parse::<usize>().is_ok()) {
        named.sort_by_key(|(k, _)| k[5..].parse::<usize>().unwrap_or(usize::MAX));
    }
    let values: Vec<Value> = named.into_iter().map(|(_, t)| Value::Tensor(t)).collect();
    let _g = ferrofx_core::autograd::no_grad();
    let outs = gm.forward_values(&values)?;
    let mut sd = StateDict::new();
    for (i, v) in outs.into_iter().enumerate() {
        match v {
            Value::Tensor(t) => {
                sd.insert(format!("output{i}"), t.contiguous()?);
            }
            other => return Err(format!("output {i} is not a tensor ({other:?})").into()),
        }
    }
    save_state_dict(&sd, &a.out).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    println!("wrote {} output(s) to {}", sd.len(), a.out.display());
    Ok(())
}
