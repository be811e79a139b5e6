//! `ferrofx run FILE -i X.safetensors -o Y.safetensors` (or `-i a.npy -i b.npy -o y.npy`): runs
//! a saved traced module on tensors read from files and writes its outputs.
//!
//! Inputs: one safetensors file (tensors in key order `input0`, `input1`, ... when so named,
//! else the file's order), or one `.npy` file per input, in order. Outputs: a safetensors
//! file (`output0`, ...), or, for a module with one output, a `.npy` file. It prints a summary
//! of each output (shape, dtype, the top classes of a classifier; `--print` adds the values).
//! Inputs of another dtype than the module expects (NumPy's default float64) are converted,
//! with a note. The run is refused before it starts when its intermediate values would need
//! more than `--max-memory`.

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
    /// Without it the outputs are only summarised.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Print the output values too (not only their shapes and top classes).
    #[arg(long)]
    pub print: bool,
    /// Most memory the module's intermediate values may take at once (e.g. `2G`, `512M`);
    /// default: half the physical memory. A larger plan is refused before it runs.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Most floating-point operations one forward may take (e.g. `1e12`, `500G`, `20T`);
    /// default: 10^13. A larger plan (a huge pooling window, a huge batch) is refused before
    /// it runs.
    #[arg(long, value_name = "FLOPS")]
    pub max_flops: Option<String>,
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

/// Converts each input to the dtype the module expects (float64 or integer NumPy arrays to
/// float32, say), printing a note for each conversion.
fn convert_inputs(gm: &GraphModule, inputs: Vec<Tensor>, paths: &[PathBuf]) -> CliResult<Vec<Tensor>> {
    let want = super::module_io::input_dtypes(gm);
    if inputs.len() != want.len() {
        return Err(format!(
            "the module takes {} input(s) but {} were given; `ferrofx show FILE` lists them",
            want.len(),
            inputs.len()
        )
        .into());
    }
    let mut out = Vec::with_capacity(inputs.len());
    for (i, (t, want)) in inputs.into_iter().zip(want).enumerate() {
        match want {
            Some(d) if d != t.dtype() => {
                let from = paths.get(i).or(paths.first()).map(|p| p.display().to_string()).unwrap_or_default();
                eprintln!("note: input {i} ({from}) is {}; converted to {d}, the dtype the module expects", t.dtype());
                out.push(t.to_dtype(d)?);
            }
            _ => out.push(t),
        }
    }
    Ok(out)
}

/// A few lines per output: shape and dtype, and for a classifier's `[batch, classes]` scores
/// the top classes of the first samples.
fn summary(i: usize, t: &Tensor, print: bool) -> CliResult<String> {
    let mut s = format!("output{i}: shape {:?}, {}", t.shape(), t.dtype());
    if let (true, &[n, c]) = (t.dtype().is_floating_point(), t.shape()) {
        if (2..=100_000).contains(&c) && n > 0 {
            let v = t.to_vec_f64()?;
            for row in 0..n.min(4) {
                let r = &v[row * c..(row + 1) * c];
                let max = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = r.iter().map(|x| (x - max).exp()).sum();
                let mut idx: Vec<usize> = (0..c).collect();
                idx.sort_by(|&a, &b| r[b].total_cmp(&r[a]));
                let top: Vec<String> = idx
                    .iter()
                    .take(3)
                    .map(|&k| format!("class {k} ({:.1}%)", 100.0 * (r[k] - max).exp() / sum))
                    .collect();
                s.push_str(&format!("\n  sample {row}: {}", top.join(", ")));
            }
            if n > 4 {
                s.push_str(&format!("\n  ... {} more samples", n - 4));
            }
        }
    }
    if print {
        s.push_str(&format!("\n{t}"));
    }
    Ok(s)
}

/// Runs `ferrofx run`.
pub fn run(a: &RunArgs) -> CliResult<()> {
    if let Some(out) = &a.out {
        let mut inputs: Vec<&Path> = a.input.iter().map(|p| p.as_path()).collect();
        inputs.push(&a.file);
        super::module_io::refuse_overwriting_inputs(out, &inputs)?;
        super::module_io::check_output_path(out)?;
    }
    let gm = super::module_io::load_module(&a.file)?;
    if let Some(m) = &a.max_memory {
        gm.set_max_memory(Some(super::module_io::parse_memory(m)?));
    }
    if let Some(f) = &a.max_flops {
        gm.set_max_flops(Some(super::module_io::parse_flops(f)?));
    }
    let inputs = convert_inputs(&gm, read_inputs(&a.input)?, &a.input)?;
    let values: Vec<Value> = inputs.into_iter().map(Value::Tensor).collect();
    let _g = ferrofx_core::autograd::no_grad();
    let outs = gm.forward_values(&values)?;
    let mut tensors = Vec::with_capacity(outs.len());
    for (i, v) in outs.into_iter().enumerate() {
        match v {
            Value::Tensor(t) => tensors.push(t.contiguous()?),
            other => return Err(format!("output {i} is not a tensor ({other:?})").into()),
        }
    }
    for (i, t) in tensors.iter().enumerate() {
        println!("{}", summary(i, t, a.print)?);
    }
    let Some(out) = &a.out else { return Ok(()) };
    if is_npy(out) {
        let [t] = tensors.as_slice() else {
            return Err(format!(
                "the module returns {} outputs and a .npy file holds one: write them to a .safetensors file",
                tensors.len()
            )
            .into());
        };
        npy::write(t, out)?;
        println!("wrote 1 output to {}", out.display());
        return Ok(());
    }
    let mut sd = StateDict::new();
    for (i, t) in tensors.into_iter().enumerate() {
        sd.insert(format!("output{i}"), t);
    }
    save_state_dict(&sd, out).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("wrote {} output(s) to {}", sd.len(), out.display());
    Ok(())
}
