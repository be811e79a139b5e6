//! PyTorch gradient goldens (`tests/data/golden_grads.safetensors`, written by
//! `scripts/goldens/gen_grads.py`): first-order gradients of every case and Hessian-vector
//! products (double backward under `create_graph`) for the second-order subset, computed with
//! the ops called by registry name (`op::call`) and compared in float64.
//!
//! Each case also compares the `grad_fn` name of every output with PyTorch's (issue 16: node
//! names as PyTorch 2.15 gives them; `names_only` cases, random ops, check nothing else).
//!
//! Cases marked `values` (index / index_put) compare the outputs with PyTorch's too.
//!
//! In-place cases (issue 16) may `prep` an input with a chain of ops (a non-leaf `clone`, then
//! views of it) and return (`ret`) the base the in-place op wrote through (CopySlices).

mod golden_common;
use ferrofx_core::autograd;
use ferrofx_core::{op, Tensor, Value};
use golden_common::load_tensor;
use safetensors::SafeTensors;
use serde_json::Value as Json;
use std::path::PathBuf;

fn flatten(j: &Json, shape: &mut Vec<usize>, depth: usize, out: &mut Vec<Json>) {
    match j {
        Json::Array(a) => {
            if shape.len() <= depth {
                shape.push(a.len());
            }
            for x in a {
                flatten(x, shape, depth + 1, out);
            }
        }
        x => out.push(x.clone()),
    }
}

fn to_value(j: &Json, inputs: &[Tensor]) -> Result<Value, String> {
    Ok(match j {
        Json::Null => Value::None,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else {
                Value::Float(n.as_f64().ok_or("bad number")?)
            }
        }
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(a) => Value::Ints(a.iter().map(|x| x.as_i64().ok_or("non-int list")).collect::<Result<_, _>>()?),
        Json::Object(o) => {
            if let Some(i) = o.get("t") {
                Value::Tensor(inputs[i.as_u64().ok_or("bad t")? as usize].clone())
            } else if let Some(l) = o.get("tl") {
                let l = l.as_array().ok_or("bad tl")?;
                Value::Tensors(l.iter().map(|i| inputs[i.as_u64().unwrap_or(0) as usize].clone()).collect())
            } else if let Some(v) = o.get("i") {
                let (mut shape, mut flat) = (vec![], vec![]);
                flatten(v, &mut shape, 0, &mut flat);
                let d: Vec<i64> = flat.iter().map(|x| x.as_i64().unwrap_or(0)).collect();
                Value::Tensor(Tensor::from_vec(d, &shape).map_err(|e| e.to_string())?)
            } else if let Some(l) = o.get("il") {
                // A list of literal index tensors (`index` / `index_put`'s `Tensor[] indices`).
                let mut ts = vec![];
                for x in l.as_array().ok_or("bad il")? {
                    match to_value(x, inputs)? {
                        Value::Tensor(t) => ts.push(t),
                        other => return Err(format!("il entries must be tensors, got {other:?}")),
                    }
                }
                Value::Tensors(ts)
            } else if let Some(v) = o.get("m") {
                let (mut shape, mut flat) = (vec![], vec![]);
                flatten(v, &mut shape, 0, &mut flat);
                let d: Vec<bool> = flat.iter().map(|x| x.as_bool().unwrap_or(false)).collect();
                Value::Tensor(Tensor::from_vec(d, &shape).map_err(|e| e.to_string())?)
            } else {
                return Err(format!("unknown arg {j}"));
            }
        }
    })
}

fn close(name: &str, what: &str, got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("{name}: {what} shape {:?}, PyTorch {:?}", got.shape(), want.shape()));
    }
    let (g, w) = (got.to_vec_f64().map_err(|e| e.to_string())?, want.to_vec_f64().map_err(|e| e.to_string())?);
    for (k, (a, b)) in g.iter().zip(&w).enumerate() {
        if (a - b).abs() > 1e-8 + 1e-6 * b.abs() {
            return Err(format!("{name}: {what}[{k}] = {a}, PyTorch {b}"));
        }
    }
    Ok(())
}

/// PyTorch's name of a node without the C++ namespace its two C++-only classes print
/// (`torch::autograd::CopySlices`, `torch::autograd::CopyBackwards`).
fn short_name(n: &str) -> &str {
    n.strip_prefix("torch::autograd::").unwrap_or(n)
}

/// Compares the `grad_fn` names of `outs` with the case's PyTorch list (`null`: no grad_fn).
fn check_names(name: &str, c: &Json, outs: &[Tensor], names: &mut Vec<String>) {
    let Some(want) = c.get("grad_fn").and_then(|g| g.as_array()) else { return };
    let got: Vec<Option<String>> = outs.iter().map(|o| o.grad_fn().map(|f| f.name().to_string())).collect();
    let want: Vec<Option<String>> = want.iter().map(|w| w.as_str().map(|s| short_name(s).to_string())).collect();
    // PyTorch's function may return fewer outputs (e.g. `.values` of sort): compare those.
    if got.len() < want.len() || got[..want.len()] != want[..] {
        names.push(format!("{name}: ferrofx {got:?}, PyTorch {want:?}"));
    }
}

fn run_case(st: &SafeTensors, c: &Json, names: &mut Vec<String>) -> Result<bool, String> {
    let name = c["name"].as_str().ok_or("no name")?;
    let opname = c["op"].as_str().ok_or("no op")?;
    let grad: Vec<usize> =
        c["grad"].as_array().ok_or("no grad")?.iter().map(|v| v.as_u64().unwrap_or(0) as usize).collect();
    let second = c["second"].as_bool().unwrap_or(false);
    let mut inputs = vec![];
    while let Ok(t) = load_tensor(st, &format!("{name}/in{}", inputs.len())) {
        inputs.push(t);
        if inputs.len() > 16 {
            break;
        }
    }
    for &i in &grad {
        inputs[i] = inputs[i].requires_grad_(true).map_err(|e| e.to_string())?;
    }
    // `prep`: input i goes through a chain of ops first ("alias" = the input itself); `bases`
    // keeps each chain's first result (the base of the views after it).
    let mut work = inputs.clone();
    let mut bases: Vec<Option<Tensor>> = vec![None; inputs.len()];
    if let Some(prep) = c.get("prep").and_then(|p| p.as_object()) {
        for (k, steps) in prep {
            let i: usize = k.parse().map_err(|_| format!("{name}: bad prep index {k}"))?;
            let mut t = inputs[i].clone();
            for (n, step) in steps.as_array().ok_or("bad prep")?.iter().enumerate() {
                let step = step.as_array().ok_or("bad prep step")?;
                let opn = step.first().and_then(|v| v.as_str()).ok_or("bad prep op")?;
                if opn != "alias" {
                    let mut a = vec![Value::Tensor(t.clone())];
                    for v in &step[1..] {
                        a.push(to_value(v, &inputs)?);
                    }
                    t = op::call(opn, a, vec![]).map_err(|e| format!("{name}: prep {opn}: {e}"))?.remove(0);
                }
                if n == 0 {
                    bases[i] = Some(t.clone());
                }
            }
            work[i] = t;
        }
    }
    let args: Vec<Value> =
        c["args"].as_array().ok_or("no args")?.iter().map(|a| to_value(a, &work)).collect::<Result<_, _>>()?;
    let kwargs: Vec<(String, Value)> = c["kwargs"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| Ok((k.clone(), to_value(v, &work)?))).collect::<Result<Vec<_>, String>>())
        .transpose()?
        .unwrap_or_default();
    let all: Vec<Tensor> = op::call(opname, args, kwargs).map_err(|e| format!("{name}: {e}"))?.into_iter().collect();
    let mut outs: Vec<Tensor> = all.iter().filter(|t| t.dtype().is_floating_point()).cloned().collect();
    if let Some(r) = c.get("ret").and_then(|r| r.as_u64()) {
        outs = vec![bases.get(r as usize).cloned().flatten().ok_or(format!("{name}: ret without prep"))?];
        check_names(name, c, &outs, names);
    } else {
        check_names(name, c, &all, names);
    }
    if c.get("names_only").and_then(|v| v.as_bool()).unwrap_or(false) {
        return Ok(false);
    }
    if c.get("values").and_then(|v| v.as_bool()).unwrap_or(false) {
        for (j, o) in outs.iter().enumerate() {
            close(name, &format!("out{j}"), o, &load_tensor(st, &format!("{name}/out{j}"))?)?;
        }
    }
    let vs: Vec<Option<Tensor>> =
        (0..outs.len()).map(|j| load_tensor(st, &format!("{name}/v{j}")).map(Some)).collect::<Result<_, _>>()?;
    let wrt: Vec<Tensor> = grad.iter().map(|&i| inputs[i].clone()).collect();
    let gs = autograd::grad(&outs, &wrt, &vs, second, second, true).map_err(|e| format!("{name}: backward: {e}"))?;
    for (k, &i) in grad.iter().enumerate() {
        let want = load_tensor(st, &format!("{name}/grad{i}"))?;
        let got = match &gs[k] {
            Some(g) => g.clone(),
            None => Tensor::from_vec(vec![0.0f64; want.numel()], want.shape()).map_err(|e| e.to_string())?,
        };
        close(name, &format!("grad{i}"), &got, &want)?;
    }
    if second {
        let mut gouts = vec![];
        let mut us = vec![];
        for (k, &i) in grad.iter().enumerate() {
            if let Some(g) = &gs[k] {
                if g.requires_grad() {
                    gouts.push(g.clone());
                    us.push(Some(load_tensor(st, &format!("{name}/u{i}"))?));
                }
            }
        }
        // A gradient that does not depend on the inputs (mean, gather, avg_pool2d: linear ops) has
        // no graph; its Hessian-vector product is zero, which the golden must then show.
        let hv = if gouts.is_empty() {
            vec![None; wrt.len()]
        } else {
            autograd::grad(&gouts, &wrt, &us, false, false, true)
                .map_err(|e| format!("{name}: double backward: {e}"))?
        };
        for (k, &i) in grad.iter().enumerate() {
            let want = load_tensor(st, &format!("{name}/hvp{i}"))?;
            let got = match &hv[k] {
                Some(g) => g.clone(),
                None => Tensor::from_vec(vec![0.0f64; want.numel()], want.shape()).map_err(|e| e.to_string())?,
            };
            close(name, &format!("hvp{i}"), &got, &want)?;
        }
    }
    Ok(second)
}

#[test]
fn pytorch_gradient_goldens() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/golden_grads.safetensors");
    let bytes = std::fs::read(&path).expect("golden_grads.safetensors (run scripts/goldens/gen_grads.py)");
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let cases: Json =
        serde_json::from_str(meta.metadata().as_ref().and_then(|m| m.get("cases")).expect("cases metadata")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (mut n, mut n2, mut fails, mut names) = (0, 0, vec![], vec![]);
    for c in cases.as_array().unwrap() {
        n += 1;
        match run_case(&st, c, &mut names) {
            Ok(s) => n2 += s as usize,
            Err(e) => fails.push(e),
        }
    }
    println!(
        "gradient goldens: {n} cases ({n2} second-order passed), {} failures, {} node-name mismatches",
        fails.len(),
        names.len()
    );
    assert!(
        fails.is_empty() && names.is_empty(),
        "{} of {n} gradient golden cases fail:\n{}\n{} node names differ from PyTorch 2.15's:\n{}",
        fails.len(),
        fails.join("\n"),
        names.len(),
        names.join("\n")
    );
}
