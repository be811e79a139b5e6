//! ONNX's backend test suite, run through the importer: every case of the per-operator `node`
//! suite and of the shipped `pytorch-converted`, `pytorch-operator` and `simple` suites is
//! imported as a GraphModule (with its test inputs' shapes), run, and compared with the
//! expected outputs (ONNX's tolerances: rtol 1e-3, atol 1e-7).
//!
//! Data: `FERROFX_ONNX_BACKEND_DATA` names a folder written by
//! `.venv/bin/python scripts/onnx/gen_backend_data.py DIR`. Without it the test fails under CI
//! (`CI=true`) and is skipped locally with a note.
//!
//! Prints pass / fail / unsupported per op, writes the op table of `docs/onnx.md` when
//! `FERROFX_ONNX_WRITE_DOCS` names the file, and asserts the totals of issue 23: at least 95% of
//! the shipped suites pass, at least 150 ONNX ops are supported, and at least 95% of the node
//! cases of supported ops pass.

use crate::common::{data_from_env, read_tensor};
use ferrofx_core::{DType, Tensor, Value};
use ferrofx_nn::Module;
use ferrofx_onnx::{import_model, supported_ops, ImportOptions, ModelFile};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    Pass,
    Fail,
    Unsupported,
}

fn data_dir() -> Option<PathBuf> {
    data_from_env(
        "FERROFX_ONNX_BACKEND_DATA",
        "generate the data with `.venv/bin/python scripts/onnx/gen_backend_data.py DIR` and set it to DIR",
    )
}

fn close(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {:?}, expected {:?}", got.dtype(), want.dtype()));
    }
    let g = got.to_vec_f64().map_err(|e| e.to_string())?;
    let w = want.to_vec_f64().map_err(|e| e.to_string())?;
    let (rtol, atol) = match want.dtype() {
        DType::F16 | DType::BF16 => (1e-2, 1e-3),
        _ => (1e-3, 1e-7),
    };
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
        if !ok {
            return Err(format!("element {i}: {a}, expected {b}"));
        }
    }
    Ok(())
}

/// Why a case is outside what the importer claims to support, if it is.
fn unsupported_reason(model: &ModelFile, supported: &[&str]) -> Option<String> {
    let g = model.model.graph.as_ref()?;
    for n in &g.node {
        let op = n.op_type.as_deref().unwrap_or("");
        if !matches!(n.domain.as_deref().unwrap_or(""), "" | "ai.onnx" | "ai.onnx.preview.training") {
            return Some(format!("domain {}", n.domain.as_deref().unwrap_or("")));
        }
        if !supported.contains(&op) && op != "If" {
            return Some(format!("op {op}"));
        }
    }
    None
}

fn is_unsupported_error(msg: &str) -> bool {
    msg.contains("is not supported (supported:")
        || msg.contains("unknown ONNX element type")
        || msg.contains("is not a tensor (sequence")
        || msg.contains("only tensor, float(s) and int(s) constants")
}

fn run_case(dir: &Path, supported: &[&str]) -> (Status, Vec<String>, String) {
    let model = match ModelFile::open(dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => {
            let msg = e.to_string();
            let st = if msg.contains("opset") { Status::Unsupported } else { Status::Fail };
            return (st, vec![], msg);
        }
    };
    let ops: Vec<String> = model
        .model
        .graph
        .as_ref()
        .map(|g| g.node.iter().map(|n| n.op_type.clone().unwrap_or_default()).collect())
        .unwrap_or_default();
    if let Some(r) = unsupported_reason(&model, supported) {
        return (Status::Unsupported, ops, r);
    }
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    sets.sort();
    let graph_inputs: Vec<String> = {
        let g = model.model.graph.as_ref();
        let inits: Vec<&str> =
            g.map(|g| g.initializer.iter().filter_map(|t| t.name.as_deref()).collect()).unwrap_or_default();
        g.map(|g| g.input.iter().filter_map(|i| i.name.clone()).filter(|n| !inits.contains(&n.as_str())).collect())
            .unwrap_or_default()
    };
    for set in sets {
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        for i in 0.. {
            let p = set.join(format!("input_{i}.pb"));
            if !p.exists() {
                break;
            }
            match read_tensor(&p) {
                Ok(t) => inputs.push(t),
                Err(e) => return (Status::Unsupported, ops, format!("input {i}: {e}")),
            }
        }
        for i in 0.. {
            let p = set.join(format!("output_{i}.pb"));
            if !p.exists() {
                break;
            }
            match read_tensor(&p) {
                Ok(t) => outputs.push(t),
                Err(e) => return (Status::Unsupported, ops, format!("output {i}: {e}")),
            }
        }
        let mut opts = ImportOptions::default();
        for (name, t) in graph_inputs.iter().zip(&inputs) {
            opts.input_shapes.insert(name.clone(), t.shape().to_vec());
        }
        let mut imported = import_model(&model, &opts);
        let mut fixed = vec![false; inputs.len()];
        // Inputs read as shapes/axes/sizes/scales must be known at import: fix them to their
        // test values (FX's concrete_args) and import again, widening step by step: integer
        // and bool inputs, then every input but the first, then all.
        for step in 0..3 {
            match &imported {
                Err(e) if e.to_string().contains("must be known when the model is imported") => {}
                _ => break,
            }
            for (i, (name, t)) in graph_inputs.iter().zip(&inputs).enumerate() {
                let fix = match step {
                    0 => !t.dtype().is_floating_point(),
                    1 => i > 0,
                    _ => true,
                };
                if fix {
                    opts.constants.insert(name.clone(), t.clone());
                    fixed[i] = true;
                }
            }
            imported = import_model(&model, &opts);
        }
        let imported = match imported {
            Ok(m) => m,
            Err(e) => {
                let msg = e.to_string();
                let st = if is_unsupported_error(&msg) { Status::Unsupported } else { Status::Fail };
                return (st, ops, format!("import: {msg}"));
            }
        };
        let inputs: Vec<Tensor> = inputs.into_iter().zip(&fixed).filter(|(_, f)| !**f).map(|(t, _)| t).collect();
        let args: Vec<Value> = inputs.into_iter().map(Value::Tensor).collect();
        let got = match imported.module.forward_values(&args) {
            Ok(g) => g,
            Err(e) => return (Status::Fail, ops, format!("run: {e}")),
        };
        if got.len() != outputs.len() {
            return (Status::Fail, ops, format!("{} outputs, expected {}", got.len(), outputs.len()));
        }
        for (i, (g, w)) in got.iter().zip(&outputs).enumerate() {
            let Value::Tensor(g) = g else { return (Status::Fail, ops, format!("output {i} is not a tensor")) };
            if let Err(e) = close(g, w) {
                return (Status::Fail, ops, format!("output {i}: {e}"));
            }
        }
    }
    (Status::Pass, ops, String::new())
}

/// The op a node case tests: the longest op type of its graph whose name (lower case, no
/// underscores) starts the case name.
fn primary_op(case: &str, ops: &[String]) -> String {
    let key = case.trim_start_matches("test_").replace('_', "").to_ascii_lowercase();
    let mut best: Option<&String> = None;
    for op in ops {
        if key.starts_with(&op.to_ascii_lowercase()) && best.is_none_or(|b| op.len() > b.len()) {
            best = Some(op);
        }
    }
    best.or(ops.first()).cloned().unwrap_or_else(|| "?".into())
}

#[derive(Default, Clone, Copy)]
struct Count {
    pass: usize,
    fail: usize,
    unsupported: usize,
}

#[test]
fn onnx_backend_suite() {
    let Some(root) = data_dir() else { return };
    let supported = supported_ops();
    let only = std::env::var("FERROFX_ONNX_ONLY").ok();
    let verbose = std::env::var("FERROFX_ONNX_VERBOSE").is_ok();
    let mut per_op: BTreeMap<String, Count> = BTreeMap::new();
    let mut suites: BTreeMap<&str, Count> = BTreeMap::new();
    let mut failures = Vec::new();
    for suite in ["node", "pytorch-converted", "pytorch-operator", "simple"] {
        let dir = root.join(suite);
        let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/onnx/gen_backend_data.py)", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("model.onnx").exists())
            .collect();
        cases.sort();
        for case in cases {
            let name = case.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if only.as_deref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            let r = std::panic::catch_unwind(|| run_case(&case, &supported));
            let (st, ops, msg) = r.unwrap_or_else(|_| (Status::Fail, vec![], "PANIC".into()));
            let c = suites.entry(suite).or_default();
            match st {
                Status::Pass => c.pass += 1,
                Status::Fail => c.fail += 1,
                Status::Unsupported => c.unsupported += 1,
            }
            if suite == "node" {
                let op = primary_op(&name, &ops);
                let c = per_op.entry(op).or_default();
                match st {
                    Status::Pass => c.pass += 1,
                    Status::Fail => c.fail += 1,
                    Status::Unsupported => c.unsupported += 1,
                }
            }
            if st == Status::Fail || (verbose && st == Status::Unsupported) {
                failures.push(format!("{suite}/{name}: {st:?}: {msg}"));
            }
        }
    }
    for f in &failures {
        println!("{f}");
    }
    println!("\n{:<34} {:>6} {:>6} {:>6}", "node cases by op", "pass", "fail", "unsup");
    for (op, c) in &per_op {
        println!("{op:<34} {:>6} {:>6} {:>6}", c.pass, c.fail, c.unsupported);
    }
    println!();
    for (s, c) in &suites {
        println!("suite {s:<20} pass {:>5}  fail {:>5}  unsupported {:>5}", c.pass, c.fail, c.unsupported);
    }
    if let Ok(path) = std::env::var("FERROFX_ONNX_WRITE_DOCS") {
        write_docs(Path::new(&path), &root, &per_op, &suites, &supported);
    }
    if only.is_some() {
        return;
    }
    let shipped: Count = ["pytorch-converted", "pytorch-operator", "simple"].iter().filter_map(|s| suites.get(s)).fold(
        Count::default(),
        |a, c| Count { pass: a.pass + c.pass, fail: a.fail + c.fail, unsupported: a.unsupported + c.unsupported },
    );
    let shipped_total = shipped.pass + shipped.fail + shipped.unsupported;
    let node = suites.get("node").copied().unwrap_or_default();
    let node_supported = node.pass + node.fail;
    println!(
        "shipped suites: {}/{} pass ({:.1}%); supported ops: {}; node cases of supported ops: {}/{} pass ({:.1}%)",
        shipped.pass,
        shipped_total,
        100.0 * shipped.pass as f64 / shipped_total.max(1) as f64,
        supported.len(),
        node.pass,
        node_supported,
        100.0 * node.pass as f64 / node_supported.max(1) as f64
    );
    // Issue 23's targets: 95% of the shipped suites (134/140 reached: the misses are the six
    // string-tensor `StringNormalizer` cases of `simple`), 150 ops, 95% of the node cases.
    assert!(shipped.pass >= 134, "only {}/{shipped_total} shipped cases pass (134 did)", shipped.pass);
    assert!(shipped.pass * 100 >= 95 * shipped_total, "fewer than 95% of the shipped suites pass");
    assert!(supported.len() >= 150, "only {} ONNX ops supported (target 150)", supported.len());
    assert!(node.pass * 100 >= 95 * node_supported, "fewer than 95% of the node cases of supported ops pass");
}

fn write_docs(
    path: &Path,
    root: &Path,
    per_op: &BTreeMap<String, Count>,
    suites: &BTreeMap<&str, Count>,
    supported: &[&str],
) {
    // All default-domain ops the onnx package knows, if the generator listed them.
    let mut all: BTreeMap<String, String> = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(root.join("ops.txt")) {
        for line in text.lines() {
            let mut it = line.splitn(2, '\t');
            if let (Some(op), Some(note)) = (it.next(), it.next()) {
                all.insert(op.to_string(), note.to_string());
            }
        }
    }
    for op in per_op.keys() {
        all.entry(op.clone()).or_default();
    }
    for op in supported {
        all.entry(op.to_string()).or_default();
    }
    let mut md = String::from("| op | status | node cases passed |\n|---|---|---|\n");
    let reasons: HashMap<&str, &str> = [
        ("Sequence", "sequence types are not supported"),
        ("Optional", "optional types are not supported"),
        ("String", "string tensors are not supported"),
        ("Regex", "string tensors are not supported"),
        ("Loop", "loops are not supported (export unrolled)"),
        ("Scan", "loops are not supported (export unrolled)"),
        ("Random", "random ops: outputs cannot be compared"),
        ("Bernoulli", "random ops: outputs cannot be compared"),
        ("Multinomial", "random ops: outputs cannot be compared"),
        ("Gradient", "training-only"),
    ]
    .into_iter()
    .collect();
    for (op, note) in &all {
        let c = per_op.get(op).copied().unwrap_or_default();
        let status = if supported.contains(&op.as_str()) {
            "supported".to_string()
        } else {
            let why = reasons.iter().find(|(k, _)| op.contains(*k)).map(|(_, v)| *v).unwrap_or("not yet");
            format!("unsupported: {why}")
        };
        let cases = if c.pass + c.fail + c.unsupported == 0 {
            "-".to_string()
        } else {
            format!("{}/{}", c.pass, c.pass + c.fail + c.unsupported)
        };
        let _ = note;
        md.push_str(&format!("| {op} | {status} | {cases} |\n"));
    }
    md.push_str("\n| suite | pass | fail | unsupported |\n|---|---|---|---|\n");
    for (s, c) in suites {
        md.push_str(&format!("| {s} | {} | {} | {} |\n", c.pass, c.fail, c.unsupported));
    }
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (begin, end) = ("<!-- ops table begin -->", "<!-- ops table end -->");
    let new = match (text.find(begin), text.find(end)) {
        (Some(b), Some(e)) if e > b => format!("{}{begin}\n{md}{}", &text[..b], &text[e..]),
        _ => format!("{text}\n{begin}\n{md}{end}\n"),
    };
    std::fs::write(path, new).expect("write docs");
}
