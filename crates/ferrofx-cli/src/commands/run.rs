//! `ferrofx run FILE -i X.safetensors -o Y.safetensors` (or `-i a.npy -i b.npy -o y.npy`): runs
//! a saved traced module on tensors read from files and writes its outputs.
//!
//! Inputs: one safetensors file (tensors in key order `input0`, `input1`, ... when so named,
//! else the file's order), or one `.npy` file per input, in order. Outputs: a safetensors
//! file (`output0`, ...), or, for a module with one output, a `.npy` file.

use super::CliResult;
use crate::npy;
use ferrofx_core::{Tensor, Value};
use ferrofx_fx::GraphModule;
use ferrofx_nn::{load_state_dict_file, save_state_dict, Module, StateDict};
use std::path::{Path, PathBuf};

/// Arguments of `ferrofx run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// A traced-module file.
    pub file: PathBuf,
    /// The inputs: one safetensors file, or one .npy file per input (repeat -i, in order).
    #[arg(long, short, required = true, num_args = 1)]
    pub input: Vec<PathBuf>,
    /// Where to write the outputs: a .safetensors file, or a .npy file for a single output.
    #[arg(long, short)]
    pub out: PathBuf,
}

fn is_npy(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"))
}

/// The input tensors, in order.
fn read_inputs(paths: &[PathBuf]) -> CliResult<Vec<Tensor>> {
    if paths.iter().any(|p| is_npy(p)) {
        if let Some(other) = paths.iter().find(|p| !is_npy(p)) {
            return Err(format!(
                "{}: give either one safetensors file or .npy files (one per input), not both",
                other.display()
            )
            .into());
        }
        return Ok(paths.iter().map(|p| npy::read(p)).collect::<Result<Vec<_>, _>>()?);
    }
    let [path] = paths else {
        return Err(format!(
            "{} safetensors files given: all inputs go in one safetensors file (or give one .npy file per input)",
            paths.len()
        )
        .into());
    };
    let inputs = load_state_dict_file(path).map_err(|e| format!("cannot read inputs from {}: {e}", path.display()))?;
    let mut named: Vec<(String, Tensor)> = inputs.into_iter().collect();
    if named.iter().all(|(k, _)| k.starts_with("input") && k[5..].parse::<usize>().is_ok()) {
        named.sort_by_key(|(k, _)| k[5..].parse::<usize>().unwrap_or(usize::MAX));
    }
    Ok(named.into_iter().map(|(_, t)| t).collect())
}

/// Runs `ferrofx run`.
pub fn run(a: &RunArgs) -> CliResult<()> {
    let gm = GraphModule::load(&a.file).map_err(|e| format!("cannot load {}: {e}", a.file.display()))?;
    let values: Vec<Value> = read_inputs(&a.input)?.into_iter().map(Value::Tensor).collect();
    let _g = ferrofx_core::autograd::no_grad();
    let outs = gm.forward_values(&values)?;
    let mut tensors = Vec::with_capacity(outs.len());
    for (i, v) in outs.into_iter().enumerate() {
        match v {
            Value::Tensor(t) => tensors.push(t.contiguous()?),
            other => return Err(format!("output {i} is not a tensor ({other:?})").into()),
        }
    }
    if is_npy(&a.out) {
        let [t] = tensors.as_slice() else {
            return Err(format!(
                "the module returns {} outputs and a .npy file holds one: write them to a .safetensors file",
                tensors.len()
            )
            .into());
        };
        npy::write(t, &a.out)?;
        println!("wrote 1 output to {}", a.out.display());
        return Ok(());
    }
    let mut sd = StateDict::new();
    for (i, t) in tensors.into_iter().enumerate() {
        sd.insert(format!("output{i}"), t);
    }
    save_state_dict(&sd, &a.out).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    println!("wrote {} output(s) to {}", sd.len(), a.out.display());
    Ok(())
}
