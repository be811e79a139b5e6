//! Runs every PyTorch golden case in `tests/data/golden_*.safetensors` through the op registry
//! (`op::call` by name) and compares outputs: shapes and dtypes exactly, values within the
//! case's tolerance (integers and bools exactly, NaN equal to NaN).
//!
//! Goldens are written by `scripts/goldens/gen_all.py` (PyTorch); see `scripts/goldens/README.md`.

mod golden_common;
use ferrofx_core::ops::conv;
use ferrofx_core::{op, DType, Tensor, Value};
use golden_common::load_tensor;
use safetensors::SafeTensors;
use serde_json::Value as Json;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

fn apply_view(t: Tensor, view: &[Json]) -> Result<Tensor, String> {
    let kind = view.first().and_then(|k| k.as_str()).ok_or("view without kind")?;
    let int = |i: usize| view.get(i).and_then(|v| v.as_i64());
    let ints = |i: usize| -> Vec<i64> {
        view.get(i)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_i64()).collect())
            .unwrap_or_default()
    };
    let r = match kind {
        "transpose" => t.transpose(int(1).ok_or("dim0")?, int(2).ok_or("dim1")?),
        "slice" => t.slice(int(1).ok_or("dim")?, int(2), int(3), int(4).unwrap_or(1)),
        "expand" => t.expand(&ints(1)),
        "permute" => t.permute(&ints(1)),
        "select" => t.select(int(1).ok_or("dim")?, int(2).ok_or("index")?),
        other => return Err(format!("unknown view kind {other}")),
    };
    r.map_err(|e| e.to_string())
}

fn decode(st: &SafeTensors, j: &Json) -> Result<Value, String> {
    let obj = j.as_object().ok_or("argument is not an object")?;
    let (k, v) = obj.iter().find(|(k, _)| k.as_str() != "view").ok_or("empty argument")?;
    Ok(match k.as_str() {
        "tensor" => {
            let mut t = load_tensor(st, v.as_str().ok_or("tensor key")?)?;
            if let Some(view) = obj.get("view").and_then(|v| v.as_array()) {
                t = apply_view(t, view)?;
            }
            Value::Tensor(t)
        }
        "tensors" => Value::Tensors(
            v.as_array()
                .ok_or("tensors")?
                .iter()
                .map(|e| match decode(st, e)? {
                    Value::Tensor(t) => Ok(t),
                    _ => Err("tensor list element".to_string()),
                })
                .collect::<Result<_, _>>()?,
        ),
        "none" => Value::None,
        "bool" => Value::Bool(v.as_bool().ok_or("bool")?),
        "int" => Value::Int(v.as_i64().ok_or("int")?),
        "float" => Value::Float(match v.as_str() {
            Some("inf") => f64::INFINITY,
            Some("-inf") => f64::NEG_INFINITY,
            Some("nan") => f64::NAN,
            _ => v.as_f64().ok_or("float")?,
        }),
        "str" => Value::Str(v.as_str().ok_or("str")?.to_string()),
        "dtype" => Value::DType(DType::parse(v.as_str().ok_or("dtype")?).ok_or("dtype name")?),
        "ints" => {
            Value::Ints(v.as_array().ok_or("ints")?.iter().map(|x| x.as_i64().ok_or("int")).collect::<Result<_, _>>()?)
        }
        "floats" => Value::Floats(
            v.as_array().ok_or("floats")?.iter().map(|x| x.as_f64().ok_or("float")).collect::<Result<_, _>>()?,
        ),
        other => return Err(format!("unknown argument kind {other}")),
    })
}

fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64, meta_only: bool) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    if meta_only {
        return Ok(());
    }
    let g = got.to_vec_f64().map_err(|e| e.to_string())?;
    let w = want.to_vec_f64().map_err(|e| e.to_string())?;
    let exact = !want.dtype().is_floating_point();
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if exact {
            a == b
        } else if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= atol + rtol * b.abs()
        };
        if !ok {
            return Err(format!("element {i}: got {a}, expected {b} (rtol {rtol}, atol {atol})"));
        }
    }
    Ok(())
}

fn run_case(st: &SafeTensors, case: &Json) -> Result<(), String> {
    let op_name = case["op"].as_str().ok_or("op")?;
    let args = case["args"].as_array().ok_or("args")?.iter().map(|a| decode(st, a)).collect::<Result<Vec<_>, _>>()?;
    let kwargs = case["kwargs"]
        .as_object()
        .ok_or("kwargs")?
        .iter()
        .map(|(k, v)| Ok((k.clone(), decode(st, v)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5);
    let atol = case["atol"].as_f64().unwrap_or(1e-6);
    let meta_only = case["check"].as_str() == Some("meta");
    let run = |atol_of: &dyn Fn(&Tensor) -> f64| -> Result<(), String> {
        let outs = op::call(op_name, args.clone(), kwargs.clone()).map_err(|e| format!("call failed: {e}"))?;
        let want_keys = case["outputs"].as_array().ok_or("outputs")?;
        if outs.len() != want_keys.len() {
            return Err(format!("{} outputs, expected {}", outs.len(), want_keys.len()));
        }
        for (j, (got, key)) in outs.iter().zip(want_keys).enumerate() {
            let want = load_tensor(st, key.as_str().ok_or("output key")?)?;
            compare(got, &want, rtol, atol_of(&want), meta_only).map_err(|e| format!("output {j}: {e}"))?;
        }
        Ok(())
    };
    if !op_name.starts_with("conv") {
        return run(&|_| atol);
    }
    // Convolutions: the exact algorithms (Winograd off) to the case's tolerance, then the
    // default (Winograd F(4x4, 3x3) where it applies), whose rounding differs from direct
    // convolution by up to ~1e-5 of the output's magnitude (see ops::conv::winograd).
    let prev = conv::set_winograd_enabled(false);
    let exact = run(&|_| atol);
    conv::set_winograd_enabled(prev);
    exact.map_err(|e| format!("(winograd off) {e}"))?;
    let scale = |w: &Tensor| w.to_vec_f64().map(|v| v.iter().fold(0f64, |m, x| m.max(x.abs()))).unwrap_or(0.0);
    run(&|w| atol + 1e-5 * scale(w)).map_err(|e| format!("(winograd on) {e}"))
}

#[test]
fn pytorch_goldens() {
    let dir = data_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    n.starts_with("golden_") && n.ends_with(".safetensors")
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut total = 0usize;
    let mut failures = Vec::new();
    for path in &files {
        let bytes = std::fs::read(path).expect("read golden file");
        let (_, meta) = SafeTensors::read_metadata(&bytes).expect("golden metadata");
        let st = SafeTensors::deserialize(&bytes).expect("golden file");
        // Op goldens carry a `family`; gradient and nn goldens (other runners) do not.
        if meta.metadata().as_ref().and_then(|m| m.get("family")).is_none() {
            continue;
        }
        let cases_json = meta.metadata().as_ref().and_then(|m| m.get("cases")).expect("cases metadata");
        let cases: Vec<Json> = serde_json::from_str(cases_json).expect("cases json");
        for case in &cases {
            total += 1;
            if let Err(e) = run_case(&st, case) {
                failures.push(format!(
                    "{}: case {} (op {}): {e}",
                    path.file_name().unwrap().to_string_lossy(),
                    case["name"].as_str().unwrap_or("?"),
                    case["op"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    println!("{} golden files, {total} cases, {} failures", files.len(), failures.len());
    assert!(failures.is_empty(), "{} of {total} golden cases failed:\n{}", failures.len(), failures.join("\n"));
}
