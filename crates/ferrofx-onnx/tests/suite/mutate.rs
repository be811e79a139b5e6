//! Mutation fuzzing of the ONNX importer on the stable toolchain (the ONNX counterpart of
//! `ferrofx-fx/tests/support/mutate.rs`): valid small models built in Rust are mutated at the
//! byte level (bit flips, interesting bytes, truncation, range deletion and duplication, huge
//! varints spliced in) and at the protobuf level (the decoded `ModelProto` edited: dims, data
//! types, raw data lengths, attributes, op types, input names, opsets, external data, nesting)
//! and fed to the full import path under `catch_unwind`. A model that imports is then **run**
//! on inputs of its specialised shapes, under a memory limit ([`RUN_MEMORY_LIMIT`]). Shared by
//! the short seeded test in `tests/suite/fuzz.rs` (CI) and `examples/fuzz_import.rs` (long runs).

#![allow(dead_code)]

use ferrofx_core::Value;
use ferrofx_nn::Module;
use ferrofx_onnx::builder::*;
use ferrofx_onnx::proto::{GraphProto, ModelProto, StringStringEntryProto, TensorProto};
use ferrofx_onnx::{import_model, ImportOptions, ModelFile};
use prost::Message;
use std::time::Instant;

/// xorshift64*: a tiny deterministic generator (reproducible from the seed).
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

/// Memory limit of every run of an imported module (the long runs of `examples/fuzz_import.rs`
/// also make it the limit of any single allocation).
pub const RUN_MEMORY_LIMIT: u64 = 256 << 20;

const FLOAT: i32 = 1;
const INT64: i32 = 7;

fn f32_init(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    let raw: Vec<u8> = (0..n).flat_map(|i| ((i % 7) as f32 * 0.1 - 0.3).to_le_bytes()).collect();
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(FLOAT),
        raw_data: Some(raw),
        ..Default::default()
    }
}

fn i64_init(name: &str, vals: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: vec![vals.len() as i64],
        data_type: Some(INT64),
        int64_data: vals.to_vec(),
        ..Default::default()
    }
}

fn graph(
    nodes: Vec<ferrofx_onnx::proto::NodeProto>,
    inits: Vec<TensorProto>,
    x: &[Option<i64>],
    y: &str,
) -> GraphProto {
    GraphProto {
        name: Some("g".into()),
        node: nodes,
        initializer: inits,
        input: vec![value_info("x", FLOAT, x, "batch")],
        output: vec![value_info(y, FLOAT, &[], "batch")],
        ..Default::default()
    }
}

/// Valid seed models covering convolutions, pooling, GEMMs, shape folding, reshapes, slicing,
/// padding, resizing, reductions, attention-style matmuls, sequences and `If`.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = vec![];
    // conv -> batch norm -> relu -> max pool -> global pool -> flatten -> gemm
    let g = graph(
        vec![
            node("Conv", "conv", &["x", "w", "b"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])]),
            node("BatchNormalization", "bn", &["c", "s", "bb", "m", "v"], &["n"], vec![]),
            node("Relu", "relu", &["n"], &["r"], vec![]),
            node(
                "MaxPool",
                "mp",
                &["r"],
                &["mp"],
                vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2])],
            ),
            node("GlobalAveragePool", "gap", &["mp"], &["p"], vec![]),
            node("Flatten", "flat", &["p"], &["f"], vec![]),
            node("Gemm", "fc", &["f", "fw", "fb"], &["y"], vec![attr_int("transB", 1)]),
        ],
        vec![
            f32_init("w", &[4, 3, 3, 3]),
            f32_init("b", &[4]),
            f32_init("s", &[4]),
            f32_init("bb", &[4]),
            f32_init("m", &[4]),
            f32_init("v", &[4]),
            f32_init("fw", &[2, 4]),
            f32_init("fb", &[2]),
        ],
        &[None, Some(3), Some(8), Some(8)],
        "y",
    );
    out.push(model(g, 17).encode_to_vec());
    // shape folding: Shape -> Gather -> Unsqueeze -> Concat -> Reshape; MatMul, Softmax, Transpose
    let g = graph(
        vec![
            node("Shape", "shape", &["x"], &["sh"], vec![]),
            node("Gather", "g0", &["sh", "zero"], &["b0"], vec![attr_int("axis", 0)]),
            node("Unsqueeze", "u", &["b0", "ax0"], &["b1"], vec![]),
            node("Concat", "cat", &["b1", "rest"], &["ns"], vec![attr_int("axis", 0)]),
            node("Reshape", "rs", &["x", "ns"], &["xr"], vec![]),
            node("MatMul", "mm", &["xr", "wm"], &["h"], vec![]),
            node("Transpose", "tr", &["h"], &["ht"], vec![attr_ints("perm", &[0, 2, 1])]),
            node("MatMul", "att", &["h", "ht"], &["sc"], vec![]),
            node("Softmax", "sm", &["sc"], &["pr"], vec![attr_int("axis", -1)]),
            node("MatMul", "ctx", &["pr", "h"], &["c"], vec![]),
            node("ReduceMean", "rm", &["c", "ax1"], &["y"], vec![attr_int("keepdims", 0)]),
        ],
        vec![
            TensorProto {
                name: Some("zero".into()),
                data_type: Some(INT64),
                int64_data: vec![0],
                ..Default::default()
            },
            i64_init("ax0", &[0]),
            i64_init("rest", &[4, 6]),
            f32_init("wm", &[6, 5]),
            i64_init("ax1", &[1]),
        ],
        &[None, Some(24)],
        "y",
    );
    out.push(model(g, 18).encode_to_vec());
    // slice, pad, resize, average pool, concat, split
    let g = graph(
        vec![
            node("Slice", "sl", &["x", "st", "en", "axs", "steps"], &["s"], vec![]),
            node("Pad", "pad", &["s", "pads"], &["p"], vec![attr_str("mode", "reflect")]),
            node("Resize", "rz", &["p", "", "scales"], &["r"], vec![attr_str("mode", "nearest")]),
            node(
                "AveragePool",
                "ap",
                &["r"],
                &["a"],
                vec![attr_ints("kernel_shape", &[3, 3]), attr_ints("pads", &[1, 1, 1, 1])],
            ),
            node("Split", "sp", &["a", "split"], &["a0", "a1"], vec![attr_int("axis", 1)]),
            node("Mul", "mul", &["a0", "a1"], &["m"], vec![]),
            node("Concat", "cc", &["m", "a0"], &["y"], vec![attr_int("axis", 1)]),
        ],
        vec![
            i64_init("st", &[0, -1]),
            i64_init("en", &[i64::MAX, i64::MIN]),
            i64_init("axs", &[2, 3]),
            i64_init("steps", &[1, -1]),
            i64_init("pads", &[0, 0, 1, 1, 0, 0, 1, 1]),
            TensorProto {
                name: Some("scales".into()),
                dims: vec![4],
                data_type: Some(FLOAT),
                float_data: vec![1.0, 1.0, 2.0, 2.0],
                ..Default::default()
            },
            i64_init("split", &[2, 2]),
        ],
        &[Some(1), Some(4), Some(5), Some(5)],
        "y",
    );
    out.push(model(g, 18).encode_to_vec());
    // sequences, a constant-condition If, Where/Cast/Expand/ConstantOfShape
    let then_g = GraphProto {
        name: Some("then".into()),
        node: vec![node("Neg", "neg", &["t0"], &["t_out"], vec![])],
        output: vec![value_info("t_out", FLOAT, &[], "")],
        ..Default::default()
    };
    let else_g = GraphProto {
        name: Some("else".into()),
        node: vec![node("Abs", "abs", &["t0"], &["e_out"], vec![])],
        output: vec![value_info("e_out", FLOAT, &[], "")],
        ..Default::default()
    };
    let g = graph(
        vec![
            node("SplitToSequence", "sts", &["x"], &["seq"], vec![attr_int("axis", 1)]),
            node("SequenceAt", "at", &["seq", "one"], &["t0"], vec![]),
            node("SequenceLength", "len", &["seq"], &["n"], vec![]),
            node("Greater", "gt", &["n", "one"], &["cond"], vec![]),
            node(
                "If",
                "if",
                &["cond"],
                &["i"],
                vec![attr_graph("then_branch", then_g), attr_graph("else_branch", else_g)],
            ),
            node("ConstantOfShape", "cos", &["shp"], &["k"], vec![]),
            node("Cast", "cast", &["k"], &["kf"], vec![attr_int("to", FLOAT as i64)]),
            node("Expand", "ex", &["kf", "shp"], &["ke"], vec![]),
            node("Add", "add", &["i", "ke"], &["y"], vec![]),
        ],
        vec![
            TensorProto { name: Some("one".into()), data_type: Some(INT64), int64_data: vec![1], ..Default::default() },
            i64_init("shp", &[2, 1, 3]),
        ],
        &[Some(2), Some(3), Some(3)],
        "y",
    );
    out.push(model(g, 18).encode_to_vec());
    out
}

const INTERESTING: [u8; 10] = [0, 0xff, 0x7f, 0x80, 0x01, 0x08, 0x12, 0x1a, 0x22, 0x3a];

/// A varint of `v` (protobuf's encoding).
fn varint(mut v: u64) -> Vec<u8> {
    let mut b = vec![];
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            b.push(byte);
            return b;
        }
        b.push(byte | 0x80);
    }
}

fn huge(rng: &mut Rng) -> i64 {
    match rng.below(8) {
        0 => i64::MAX,
        1 => i64::MIN,
        2 => -1,
        3 => 0,
        4 => 1 << 31,
        5 => 1 << 40,
        6 => (rng.next() >> 1) as i64,
        _ => rng.below(100) as i64 - 50,
    }
}

fn mutate_bytes(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(b.len());
        match rng.below(6) {
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
            _ => {
                // a huge varint where a length or value may be
                let v = varint(huge(rng) as u64);
                let j = (i + 1).min(b.len());
                b.splice(i..j, v);
            }
        }
    }
    b
}

fn all_graphs(g: &mut GraphProto, f: &mut dyn FnMut(&mut GraphProto)) {
    f(g);
    for n in &mut g.node {
        for a in &mut n.attribute {
            if let Some(sub) = a.g.as_mut() {
                all_graphs(sub, f);
            }
        }
    }
}

fn mutate_proto(rng: &mut Rng, m: &mut ModelProto) {
    let ops = ferrofx_onnx::supported_ops();
    let choice = rng.below(14);
    if choice == 0 {
        m.opset_import.iter_mut().for_each(|o| o.version = Some(huge(rng)));
        return;
    }
    let Some(g) = m.graph.as_mut() else { return };
    let r1 = rng.next();
    let r2 = rng.next();
    let mut local = Rng::new(r1 ^ r2);
    all_graphs(g, &mut |g| {
        let rng = &mut local;
        match choice {
            1 if !g.initializer.is_empty() => {
                let i = rng.below(g.initializer.len());
                let t = &mut g.initializer[i];
                if !t.dims.is_empty() {
                    let d = rng.below(t.dims.len());
                    t.dims[d] = huge(rng);
                } else {
                    t.dims.push(huge(rng));
                }
            }
            2 if !g.initializer.is_empty() => {
                let i = rng.below(g.initializer.len());
                g.initializer[i].data_type = Some(rng.below(25) as i32);
            }
            3 if !g.initializer.is_empty() => {
                let i = rng.below(g.initializer.len());
                if let Some(raw) = g.initializer[i].raw_data.as_mut() {
                    let keep = rng.below(raw.len() + 1);
                    raw.truncate(keep);
                } else {
                    g.initializer[i].int64_data.push(huge(rng));
                }
            }
            4 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                let n = &mut g.node[i];
                if !n.attribute.is_empty() {
                    let a = rng.below(n.attribute.len());
                    let attr = &mut n.attribute[a];
                    if !attr.ints.is_empty() {
                        let k = rng.below(attr.ints.len());
                        attr.ints[k] = huge(rng);
                    } else {
                        attr.i = Some(huge(rng));
                    }
                }
            }
            5 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                g.node[i].op_type = Some(ops[rng.below(ops.len())].to_string());
            }
            6 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                let j = rng.below(g.node.len());
                if let (Some(a), Some(b)) = (g.node[j].output.first().cloned(), g.node[i].input.first_mut()) {
                    *b = a; // may break topological order
                }
            }
            7 if !g.input.is_empty() => {
                if let Some(Some(ferrofx_onnx::proto::type_proto::Value::TensorType(tt))) =
                    g.input[0].r#type.as_mut().map(|t| t.value.as_mut())
                {
                    if let Some(shape) = tt.shape.as_mut() {
                        if !shape.dim.is_empty() {
                            let d = rng.below(shape.dim.len());
                            shape.dim[d].value =
                                Some(ferrofx_onnx::proto::tensor_shape_proto::dimension::Value::DimValue(huge(rng)));
                        }
                    }
                    if rng.below(4) == 0 {
                        tt.elem_type = Some(rng.below(25) as i32);
                    }
                }
            }
            8 if !g.initializer.is_empty() => {
                // external data pointing outside the (absent) folder
                let i = rng.below(g.initializer.len());
                let t = &mut g.initializer[i];
                t.data_location = Some(1);
                t.external_data = vec![
                    StringStringEntryProto { key: Some("location".into()), value: Some("../../etc/passwd".into()) },
                    StringStringEntryProto { key: Some("length".into()), value: Some(huge(rng).to_string()) },
                ];
            }
            9 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                let n = g.node[i].clone();
                g.node.insert(rng.below(g.node.len()), n);
            }
            10 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                g.node.remove(i);
            }
            11 if !g.node.is_empty() => {
                // a Constant of a huge declared shape
                let t = TensorProto {
                    dims: vec![huge(rng), huge(rng)],
                    data_type: Some(FLOAT),
                    raw_data: Some(vec![0; rng.below(64)]),
                    ..Default::default()
                };
                let out = g.node[0].input.first().cloned().unwrap_or_default();
                g.node.insert(0, node("Constant", "k", &[], &[&out], vec![attr_tensor("value", t)]));
            }
            12 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                g.node[i].input.push(String::new());
                g.node[i].output.push(format!("extra{}", rng.below(4)));
            }
            _ => {
                // nest the graph in an If a few levels deep
                let inner = g.clone();
                let mut wrapped = GraphProto { name: Some("wrap".into()), ..Default::default() };
                wrapped.node.push(node(
                    "If",
                    "nest",
                    &["c"],
                    &["y"],
                    vec![attr_graph("then_branch", inner.clone()), attr_graph("else_branch", inner)],
                ));
                if rng.below(8) == 0 {
                    *g = wrapped;
                }
            }
        }
    });
}

/// One mutation of a seed: byte-level or protobuf-level.
pub fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    if rng.below(2) == 0 {
        return mutate_bytes(rng, seed);
    }
    let Ok(mut m) = ModelProto::decode(seed) else { return mutate_bytes(rng, seed) };
    for _ in 0..1 + rng.below(3) {
        mutate_proto(rng, &mut m);
    }
    let bytes = m.encode_to_vec();
    if rng.below(8) == 0 {
        mutate_bytes(rng, &bytes)
    } else {
        bytes
    }
}

/// How far a mutated file got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Decoding or importing refused it.
    Rejected,
    /// It imported; running gave an error (the memory budget, a shape error).
    RunError,
    /// It imported and ran.
    Ran,
}

/// Inputs for an imported model: its specialised shapes (bounded to 4096 elements), zeros
/// for integers (valid indices), 0.5 for floats.
fn inputs_for(imported: &ferrofx_onnx::Imported) -> Option<Vec<Value>> {
    imported
        .inputs
        .iter()
        .map(|(spec, shape)| {
            let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
            if n > 4096 {
                return None;
            }
            let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let fill = if spec.dtype.is_floating_point() { 0.5 } else { 0.0 };
            ferrofx_core::ops::creation::full(&dims, fill, Some(spec.dtype)).ok().map(Value::Tensor)
        })
        .collect()
}

/// Decodes and imports `bytes`; when that succeeds, runs the module under [`RUN_MEMORY_LIMIT`].
pub fn import_and_run(bytes: &[u8]) -> Outcome {
    let Ok(file) = ModelFile::from_bytes(bytes) else { return Outcome::Rejected };
    let Ok(imported) = import_model(&file, &ImportOptions::default()) else { return Outcome::Rejected };
    imported.module.set_max_memory(Some(RUN_MEMORY_LIMIT));
    let Some(inputs) = inputs_for(&imported) else { return Outcome::RunError };
    let _g = ferrofx_core::autograd::no_grad();
    match imported.module.forward_values(&inputs) {
        Ok(_) => Outcome::Ran,
        Err(_) => Outcome::RunError,
    }
}

/// Counts of a fuzzing run.
#[derive(Debug, Default)]
pub struct Report {
    pub iterations: u64,
    pub rejected: u64,
    pub accepted: u64,
    pub ran: u64,
    pub run_errors: u64,
    /// Inputs that panicked.
    pub panics: Vec<Vec<u8>>,
    /// Their panic messages.
    pub messages: Vec<String>,
}

/// Runs `iterations` mutated inputs (or until `deadline`) from `seeds`, starting from `seed`.
pub fn run(seed: u64, iterations: u64, deadline: Option<Instant>, seeds: &[Vec<u8>]) -> Report {
    let mut rng = Rng::new(seed);
    let mut r = Report::default();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for _ in 0..iterations {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let s = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, s);
        r.iterations += 1;
        match std::panic::catch_unwind(|| import_and_run(&input)) {
            Ok(Outcome::Rejected) => r.rejected += 1,
            Ok(Outcome::RunError) => {
                r.accepted += 1;
                r.run_errors += 1
            }
            Ok(Outcome::Ran) => {
                r.accepted += 1;
                r.ran += 1
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                r.messages.push(msg);
                r.panics.push(input);
            }
        }
    }
    std::panic::set_hook(prev);
    r
}
