//! Mutation fuzzing of the traced-module loader on the stable toolchain: byte-level mutations
//! (bit flips, interesting bytes, truncation, range deletion and duplication) and
//! document-level mutations (the JSON module document edited structurally and re-wrapped), each
//! fed to the full load path under `catch_unwind`; a file that loads is then built into a
//! GraphModule and **run** on inputs shaped from its recorded placeholder metadata, under a
//! memory limit ([`RUN_MEMORY_LIMIT`]). Shared by `tests/format_fuzz.rs` (a short, seeded run in
//! CI) and `examples/fuzz_loader.rs` (long runs).

#![allow(dead_code)]

use ferrofx_core::Tensor;
use ferrofx_fx::serialize::{
    graph_from_doc, graph_to_doc, read_module_bytes, write_module_bytes, LeafDoc, ModuleDoc, TensorDoc, TensorKind,
};
use ferrofx_fx::{Argument, Graph, Target};
use ferrofx_nn::{Module, StateDict};
use std::collections::HashMap;

/// xorshift64*: a tiny deterministic generator (no dependency, reproducible from the seed).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Memory limit of every run of a loaded module (and of any single allocation in the process).
pub const RUN_MEMORY_LIMIT: u64 = 256 << 20;
/// Compute limit of every run of a loaded module (FLOPs): a mutated window or batch that would
/// keep the fuzzer busy for minutes is refused by the compute budget.
pub const RUN_FLOPS_LIMIT: u64 = 1_000_000_000;

/// How far a mutated file got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The loader refused it.
    Rejected,
    /// It loaded; building or running the module gave an error (the memory budget, a shape error).
    RunError,
    /// It loaded and ran.
    Ran,
}

/// Input tensors for a loaded module: the placeholders' recorded shapes and dtypes (bounded to
/// 4096 elements), else `[1, 1, 4, 4]` float32. Integer inputs are zeros (valid indices).
fn inputs_for(gm: &ferrofx_fx::GraphModule) -> Vec<ferrofx_core::Value> {
    gm.graph()
        .iter()
        .filter(|n| n.op() == ferrofx_fx::Opcode::Placeholder)
        .map(|n| {
            let (shape, dtype) = match n.meta().tensor_meta.as_ref() {
                Some(m)
                    if m.shape.len() <= 6
                        && m.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_some_and(|k| k <= 4096) =>
                {
                    (m.shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), m.dtype)
                }
                _ => (vec![1, 1, 4, 4], ferrofx_core::DType::F32),
            };
            let fill = if dtype.is_floating_point() { 0.5 } else { 0.0 };
            let t = ferrofx_core::ops::creation::full(&shape, fill, Some(dtype))
                .unwrap_or_else(|_| Tensor::from_vec(vec![0.0f32], &[1]).unwrap());
            ferrofx_core::Value::Tensor(t)
        })
        .collect()
}

/// Loads `bytes` ([`load`]) and, when that succeeds, builds the module and runs it under
/// [`RUN_MEMORY_LIMIT`] and [`RUN_FLOPS_LIMIT`].
pub fn load_and_run(bytes: &[u8]) -> Outcome {
    if load(bytes).is_err() {
        return Outcome::Rejected;
    }
    let Ok(gm) = ferrofx_fx::GraphModule::from_bytes(bytes) else { return Outcome::RunError };
    gm.set_max_memory(Some(RUN_MEMORY_LIMIT));
    gm.set_max_flops(Some(RUN_FLOPS_LIMIT));
    let _g = ferrofx_core::autograd::no_grad();
    match gm.forward_values(&inputs_for(&gm)) {
        Ok(_) => Outcome::Ran,
        Err(_) => Outcome::RunError,
    }
}

/// The load path of a program without the model's source: container, graph, leaf specs.
pub fn load(bytes: &[u8]) -> Result<(), String> {
    let (doc, tensors) = read_module_bytes(bytes).map_err(|e| e.to_string())?;
    graph_from_doc(&doc.graph).map_err(|e| e.to_string())?;
    for leaf in &doc.leaves {
        let prefix = format!("{}.", leaf.path);
        ferrofx_nn::spec::build_builtin(&leaf.spec, &mut |n: &str| tensors.get(&format!("{prefix}{n}")).cloned())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn leaf(doc: &mut ModuleDoc, sd: &mut StateDict, path: &str, m: &dyn Module) {
    doc.leaves.push(LeafDoc { path: path.to_string(), spec: m.spec().expect("built-in") });
    for (name, t) in m.named_parameters().into_iter().chain(m.named_buffers()) {
        let full = format!("{path}.{name}");
        doc.tensors.push(TensorDoc {
            path: full.clone(),
            kind: TensorKind::Parameter,
            dtype: t.dtype().name().to_string(),
            shape: t.shape().iter().map(|&d| d as u64).collect(),
            requires_grad: false,
        });
        sd.insert(full, t);
    }
}

/// Valid seed files: small graphs with conv/bn/linear leaves, constants and varied arguments.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = vec![];
    // conv -> bn -> relu -> flatten -> linear, plus a constant and kwargs
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    g.meta_mut(x).unwrap().tensor_meta =
        Some(ferrofx_fx::TensorMetadata::contiguous(vec![1, 1, 4, 4], ferrofx_core::DType::F32));
    let c = g.call_module("conv", vec![x.into()]).unwrap();
    let b = g.call_module("bn", vec![c.into()]).unwrap();
    let r = g.call_function(Target::named("relu"), vec![b.into()]).unwrap();
    let f = g.call_method("flatten", vec![r.into(), Argument::Int(1)]).unwrap();
    let l = g.call_module("fc", vec![f.into()]).unwrap();
    let k = g.get_attr("_tensor_constant0").unwrap();
    let o = g.call_function(Target::named("add"), vec![l.into(), k.into()]).unwrap();
    g.output(Argument::tuple([o.into(), Argument::list([r.into(), Argument::Float(f64::NAN)])])).unwrap();
    let mut doc = ModuleDoc::new("Net", false, graph_to_doc(&g).unwrap());
    let mut sd = StateDict::new();
    leaf(&mut doc, &mut sd, "conv", &ferrofx_nn::Conv2d::new(1, 2, 3).unwrap());
    leaf(&mut doc, &mut sd, "bn", &ferrofx_nn::BatchNorm::new_2d(2).unwrap());
    leaf(&mut doc, &mut sd, "fc", &ferrofx_nn::Linear::new(8, 3, true).unwrap());
    doc.tensors.push(TensorDoc {
        path: "_tensor_constant0".into(),
        kind: TensorKind::Constant,
        dtype: "float32".into(),
        shape: vec![3],
        requires_grad: false,
    });
    sd.insert("_tensor_constant0".into(), Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap());
    out.push(write_module_bytes(&doc, &sd).unwrap());
    // attention + layer norm + embedding
    let mut g = Graph::new();
    let t = g.placeholder("tokens").unwrap();
    g.meta_mut(t).unwrap().tensor_meta =
        Some(ferrofx_fx::TensorMetadata::contiguous(vec![2, 5], ferrofx_core::DType::I64));
    let e = g.call_module("emb", vec![t.into()]).unwrap();
    let a = g.call_module("layer", vec![e.into()]).unwrap();
    let m = g.call_method("mean", vec![a.into(), Argument::Int(1)]).unwrap();
    g.output(m.into()).unwrap();
    let mut doc = ModuleDoc::new("Tiny", true, graph_to_doc(&g).unwrap());
    let mut sd = StateDict::new();
    leaf(&mut doc, &mut sd, "emb", &ferrofx_nn::Embedding::new(10, 8, Some(0)).unwrap());
    let tel = ferrofx_nn::TransformerEncoderLayer::new(8, 2, 16, 0.0, "relu", true, false).unwrap();
    leaf(&mut doc, &mut sd, "layer", &tel);
    out.push(write_module_bytes(&doc, &sd).unwrap());
    out
}

const INTERESTING: [u8; 12] = [0, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'[', b'9', b'-', b'\\', b'.'];

fn mutate_bytes(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(b.len());
        match rng.below(7) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b[i] = INTERESTING[rng.below(INTERESTING.len())],
            2 => b.truncate(i),
            3 => {
                let j = (i + 1 + rng.below(64)).min(b.len());
                b.drain(i..j);
            }
            4 => {
                let j = (i + 1 + rng.below(64)).min(b.len());
                let chunk = b[i..j].to_vec();
                let at = rng.below(b.len());
                b.splice(at..at, chunk);
            }
            5 if b.len() >= 8 => {
                // the safetensors header length
                let v = match rng.below(4) {
                    0 => 0u64,
                    1 => u64::MAX,
                    2 => rng.next(),
                    _ => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])).wrapping_add(rng.below(16) as u64),
                };
                b[..8].copy_from_slice(&v.to_le_bytes());
            }
            _ => b[i] = rng.next() as u8,
        }
    }
    b
}

fn mutate_json(rng: &mut Rng, v: &mut serde_json::Value, depth: usize) {
    use serde_json::Value as J;
    let choice = rng.below(10);
    match v {
        J::Object(map) if !map.is_empty() && (choice < 7 || depth > 8) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = &keys[rng.below(keys.len())];
            if choice == 0 {
                map.remove(k);
            } else if let Some(child) = map.get_mut(k) {
                mutate_json(rng, child, depth + 1);
            }
        }
        J::Array(items) if !items.is_empty() && (choice < 7 || depth > 8) => {
            let i = rng.below(items.len());
            match choice {
                0 => {
                    items.remove(i);
                }
                1 => {
                    let c = items[i].clone();
                    items.insert(rng.below(items.len() + 1), c);
                }
                2 => {
                    let j = rng.below(items.len());
                    items.swap(i, j)
                }
                _ => mutate_json(rng, &mut items[i], depth + 1),
            }
        }
        _ => {
            *v = match rng.below(12) {
                0 => J::Null,
                1 => J::from(-1),
                2 => J::from(u64::MAX),
                3 => J::from(rng.next() % 1000),
                4 => J::from(1e308),
                5 => J::from("relu"),
                6 => J::from("call_module"),
                7 => J::from("float64"),
                8 => serde_json::json!({"node": rng.below(64)}),
                9 => serde_json::json!([]),
                10 => serde_json::json!({"Int": -5}),
                _ => J::from("x.y"),
            }
        }
    }
}

fn mutate_doc(rng: &mut Rng, input: &[u8]) -> Option<Vec<u8>> {
    let (doc, sd) = read_module_bytes(input).ok()?;
    let mut v = serde_json::to_value(&doc).ok()?;
    for _ in 0..1 + rng.below(3) {
        mutate_json(rng, &mut v, 0);
    }
    let meta: HashMap<String, String> = HashMap::from([
        ("ferrofx.format".to_string(), "ferrofx.traced_module".to_string()),
        ("ferrofx.version".to_string(), "1".to_string()),
        ("ferrofx.module".to_string(), v.to_string()),
    ]);
    ferrofx_nn::state_dict_to_bytes(&sd, Some(meta)).ok()
}

/// Outcome of a fuzzing run.
#[derive(Debug, Default)]
pub struct Report {
    pub iterations: u64,
    /// Loaded (then ran, or failed to run with an error).
    pub accepted: u64,
    pub rejected: u64,
    /// Loaded files that also ran to the end.
    pub ran: u64,
    /// Loaded files whose run was refused or failed with an error.
    pub run_errors: u64,
    pub panics: Vec<Vec<u8>>,
}

/// Runs `iterations` mutations (or until `deadline`) from `seeds`, starting at `seed`.
pub fn run(seed: u64, iterations: u64, deadline: Option<std::time::Instant>, seeds: &[Vec<u8>]) -> Report {
    let mut rng = Rng::new(seed);
    let mut report = Report::default();
    // no single allocation may exceed the run limit either (data-dependent ops the budget
    // cannot see)
    ferrofx_core::memory::set_allocation_limit(Some(RUN_MEMORY_LIMIT as usize));
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for it in 0..iterations {
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        let base = &seeds[rng.below(seeds.len())];
        let input =
            if it % 2 == 0 { mutate_doc(&mut rng, base) } else { None }.unwrap_or_else(|| mutate_bytes(&mut rng, base));
        match std::panic::catch_unwind(|| load_and_run(&input)) {
            Ok(Outcome::Rejected) => report.rejected += 1,
            Ok(Outcome::RunError) => {
                report.accepted += 1;
                report.run_errors += 1
            }
            Ok(Outcome::Ran) => {
                report.accepted += 1;
                report.ran += 1
            }
            Err(_) => report.panics.push(input),
        }
        report.iterations += 1;
    }
    std::panic::set_hook(prev);
    report
}
