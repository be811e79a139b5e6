//! What the file commands share: loading a traced module with a message a newcomer
//! understands, describing the inputs and outputs a module expects, refusing output paths that
//! would destroy an input or fail after the work is done, and parsing `--max-memory`.

use super::CliResult;
use ferrofx_core::{DType, ErrorKind};
use ferrofx_fx::{Argument, GraphModule, Opcode, TensorMetadata};
use ferrofx_nn::Module;
use std::path::Path;

/// Loads a traced-module file (or imports an `.onnx` model); the error says what is wrong with
/// the file and what to do.
pub fn load_module(path: &Path) -> CliResult<GraphModule> {
    if super::onnx::is_onnx(path) {
        return super::onnx::load_onnx(path);
    }
    GraphModule::load(path).map_err(|e| {
        let file = path.display().to_string();
        let reason = e.message().strip_prefix(&format!("{file}: ")).unwrap_or(e.message()).to_string();
        let hint = match e.kind() {
            ErrorKind::Io => "check the path; a traced-module file is written by `ferrofx demo` (ferrofx-out/digits_cnn.fxm), `ferrofx train`, `ferrofx convert` or GraphModule::save",
            ErrorKind::Limit => "the file is over a bound of the format (docs/format.md); it was not written by ferrofx, or it is damaged",
            _ => "the file is damaged or was not written by ferrofx (see docs/format.md); nothing from it was run",
        };
        format!("cannot load {file}: {reason}\n  hint: {hint}").into()
    })
}

/// Refuses an output path equal to one of the inputs (it would destroy the input before or
/// while it is used).
pub fn refuse_overwriting_inputs(out: &Path, inputs: &[&Path]) -> CliResult<()> {
    for input in inputs {
        if out == *input || ferrofx_core::atomic_file::same_file(out, input) {
            return Err(format!(
                "refusing to write the output to {}: it is also an input, which would be destroyed; choose another -o path",
                out.display()
            )
            .into());
        }
    }
    Ok(())
}

/// Checks, before any work, that `out` can be written: its folder exists and it is not a
/// folder itself.
pub fn check_output_path(out: &Path) -> CliResult<()> {
    if out.is_dir() {
        return Err(format!(
            "the output {} is a directory; give a file name (e.g. {}/out.fxm)",
            out.display(),
            out.display()
        )
        .into());
    }
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(format!(
            "cannot write {}: the folder {} does not exist; create it first (mkdir -p {})",
            out.display(),
            dir.display(),
            dir.display()
        )
        .into());
    }
    Ok(())
}

/// Parses a memory size: bytes, or a number with a unit `K`, `M`, `G`, `T` (powers of 1024;
/// `KB`/`KiB` spellings accepted).
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 =
        num.parse().map_err(|_| format!("'{s}' is not a memory size; write e.g. 2G, 512M or 1073741824"))?;
    let mult: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KB" | "KIB" => 1024.0,
        "M" | "MB" | "MIB" => 1024.0 * 1024.0,
        "G" | "GB" | "GIB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TB" | "TIB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown unit '{other}' in '{s}'; use K, M, G or T")),
    };
    let bytes = value * mult;
    if !(1.0..1e19).contains(&bytes) {
        return Err(format!("'{s}' is not a usable memory size (at least 1 byte)"));
    }
    Ok(bytes as u64)
}

/// Parses a FLOP count: a number (`1e12`, `2000000`) or one with a unit `K`, `M`, `G`, `T`, `P`
/// (powers of 1000; a trailing `FLOP`/`FLOPs` is accepted).
pub fn parse_flops(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("FLOPs").or_else(|| t.strip_suffix("FLOP")).unwrap_or(t).trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        Some('P') => (&t[..t.len() - 1], 1e15),
        _ => (t, 1.0),
    };
    let value: f64 =
        num.trim().parse().map_err(|_| format!("'{s}' is not a FLOP count; write e.g. 1e12, 500G or 20T"))?;
    let flops = value * mult;
    if !(1.0..1.8e19).contains(&flops) {
        return Err(format!("'{s}' is not a usable FLOP count (at least 1)"));
    }
    Ok(flops as u64)
}

fn meta_text(m: Option<&TensorMetadata>) -> String {
    match m {
        Some(m) => format!("{:?} {}", m.shape, m.dtype),
        None => "shape and dtype not recorded in the file".to_string(),
    }
}

/// The dtype each input is expected in (from the file's recorded metadata, else the dtype of
/// the module's floating-point parameters), in order.
pub fn input_dtypes(gm: &GraphModule) -> Vec<Option<DType>> {
    let param = gm.parameters().first().map(|p| p.dtype()).filter(|d| d.is_floating_point());
    gm.graph()
        .iter()
        .filter(|n| n.op() == Opcode::Placeholder)
        .map(|n| n.meta().tensor_meta.as_ref().map(|m| m.dtype).or(param))
        .collect()
}

/// The "inputs"/"outputs" lines `show` starts with: names, shapes and dtypes.
pub fn describe_io(gm: &GraphModule) -> String {
    let mut s = String::from("inputs:\n");
    for n in gm.graph().iter().filter(|n| n.op() == Opcode::Placeholder) {
        s.push_str(&format!("  {:<16} {}\n", n.name(), meta_text(n.meta().tensor_meta.as_ref())));
    }
    s.push_str("outputs:\n");
    if let Some(out) = gm.graph().iter().find(|n| n.op() == Opcode::Output) {
        let items: Vec<Argument> = match out.args().first() {
            Some(Argument::Tuple(v)) | Some(Argument::List(v)) => v.to_vec(),
            Some(a) => vec![a.clone()],
            None => vec![],
        };
        for (i, a) in items.iter().enumerate() {
            let text = match a.as_node().and_then(|id| gm.graph().node(id).ok()) {
                Some(n) => format!("{:<16} {}", n.name(), meta_text(n.meta().tensor_meta.as_ref())),
                None => {
                    let name = format!("output{i}");
                    format!("{name:<16} the constant {a:?}")
                }
            };
            s.push_str(&format!("  {text}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("2G").unwrap(), 2 << 30);
        assert_eq!(parse_memory("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_memory("1.5k").unwrap(), 1536);
        assert_eq!(parse_memory("100").unwrap(), 100);
        assert!(parse_memory("lots").unwrap_err().contains("not a memory size"));
        assert!(parse_memory("3X").unwrap_err().contains("unknown unit"));
        assert!(parse_memory("0").is_err());
    }

    #[test]
    fn flop_counts() {
        assert_eq!(parse_flops("1e12").unwrap(), 1_000_000_000_000);
        assert_eq!(parse_flops("500G").unwrap(), 500_000_000_000);
        assert_eq!(parse_flops("2.5k").unwrap(), 2500);
        assert_eq!(parse_flops("20TFLOPs").unwrap(), 20_000_000_000_000);
        assert!(parse_flops("lots").unwrap_err().contains("not a FLOP count"));
        assert!(parse_flops("0").is_err());
        assert!(parse_flops("-5").is_err());
    }
}
