//! Bad input (issue 23, acceptance 5): 30+ corrupted or hostile model files, each an `Err`
//! with a message naming what is wrong (node, op, file, sizes), never a panic, with memory
//! bounded by the file. The messages are printed (`--nocapture`) for the closing note.

use ferrofx_core::{Tensor, Value};
use ferrofx_nn::Module;
use ferrofx_onnx::builder::*;
use ferrofx_onnx::proto::{tensor_proto::DataLocation, GraphProto, ModelProto, StringStringEntryProto, TensorProto};
use ferrofx_onnx::{import, import_model, ImportOptions, ModelFile};
use prost::Message;

const FLOAT: i32 = 1;
const INT64: i32 = 7;

fn f32_init(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    let raw: Vec<u8> = (0..n).flat_map(|i| (i as f32 * 0.01).to_le_bytes()).collect();
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

/// A small valid model: Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm.
fn good() -> ModelProto {
    let g = GraphProto {
        name: Some("g".into()),
        node: vec![
            node("Conv", "conv", &["x", "w", "b"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])]),
            node("Relu", "relu", &["c"], &["r"], vec![]),
            node("GlobalAveragePool", "gap", &["r"], &["p"], vec![]),
            node("Flatten", "flat", &["p"], &["f"], vec![]),
            node("Gemm", "fc", &["f", "fw", "fb"], &["y"], vec![attr_int("transB", 1)]),
        ],
        initializer: vec![
            f32_init("w", &[4, 3, 3, 3]),
            f32_init("b", &[4]),
            f32_init("fw", &[2, 4]),
            f32_init("fb", &[2]),
        ],
        input: vec![value_info("x", FLOAT, &[None, Some(3), Some(8), Some(8)], "batch")],
        output: vec![value_info("y", FLOAT, &[None, Some(2)], "batch")],
        ..Default::default()
    };
    model(g, 17)
}

fn bytes(m: &ModelProto) -> Vec<u8> {
    m.encode_to_vec()
}

fn import_bytes(b: &[u8]) -> Result<(), String> {
    let f = ModelFile::from_bytes(b).map_err(|e| e.to_string())?;
    import_model(&f, &ImportOptions::default()).map(|_| ()).map_err(|e| e.to_string())
}

fn with_graph(f: impl FnOnce(&mut GraphProto)) -> Vec<u8> {
    let mut m = good();
    f(m.graph.as_mut().expect("graph"));
    bytes(&m)
}

fn expect_err(label: &str, r: Result<(), String>, needles: &[&str]) {
    let msg = match r {
        Ok(()) => panic!("{label}: expected an error, got Ok"),
        Err(m) => m,
    };
    println!("{label:<44} {msg}");
    for n in needles {
        assert!(msg.contains(n), "{label}: message {msg:?} should mention {n:?}");
    }
}

/// A fresh folder under the system temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let p = std::env::temp_dir().join(format!("ferrofx-onnx-corrupt-{}", std::process::id()));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_good_model_imports_and_runs() {
    let f = ModelFile::from_bytes(&bytes(&good())).expect("decode");
    let m = import_model(&f, &ImportOptions::default()).expect("import");
    let x = Tensor::from_vec(vec![0.5f32; 3 * 64], &[1, 3, 8, 8]).expect("x");
    let y = m.module.forward_values(&[Value::Tensor(x)]).expect("run");
    assert_eq!(y.len(), 1);
    assert!(m.module.code().expect("code").contains("conv2d"));
}

#[test]
fn corrupted_files_are_clear_errors() {
    let good_bytes = bytes(&good());
    let tmp = TempDir::new();
    let mut n = 0;
    let mut case = |label: &str, r: Result<(), String>, needles: &[&str]| {
        n += 1;
        expect_err(&format!("{n:>2}. {label}"), r, needles);
    };

    case("empty file", import_bytes(&[]), &["empty"]);
    case("random bytes", import_bytes(&[0xde, 0xad, 0xbe, 0xef, 0x11, 0x22, 0x33]), &["not a valid ONNX model"]);
    case("truncated at half", import_bytes(&good_bytes[..good_bytes.len() / 2]), &["truncated"]);
    case("truncated after 10 bytes", import_bytes(&good_bytes[..10]), &["ONNX"]);
    let mut flipped = good_bytes.clone();
    flipped[0] = 0xff;
    case("bad first tag", import_bytes(&flipped), &["protobuf"]);
    let mut m = good();
    m.graph = None;
    case("no graph", import_bytes(&bytes(&m)), &["no graph"]);
    let mut m = good();
    m.opset_import.clear();
    case("no opset_import", import_bytes(&bytes(&m)), &["opset"]);
    let mut m = good();
    m.opset_import[0].version = Some(99);
    case("opset 99", import_bytes(&bytes(&m)), &["opset 99"]);
    case(
        "unknown op",
        import_bytes(&with_graph(|g| g.node[1].op_type = Some("Rellu".into()))),
        &["node `relu`", "Rellu", "opset 17", "nearest supported op is `Relu`"],
    );
    case(
        "custom domain",
        import_bytes(&with_graph(|g| g.node[1].domain = Some("com.microsoft".into()))),
        &["node `relu`", "com.microsoft"],
    );
    case(
        "input used before definition",
        import_bytes(&with_graph(|g| g.node.swap(0, 1))),
        &["node `relu`", "not defined before"],
    );
    case(
        "dims declare 10^12 elements",
        import_bytes(&with_graph(|g| g.initializer[0].dims = vec![1_000_000, 1_000_000])),
        &["tensor `w`", "more elements than the file holds"],
    );
    case(
        "negative dim",
        import_bytes(&with_graph(|g| g.initializer[0].dims = vec![4, -3, 3, 3])),
        &["tensor `w`", "negative dimension"],
    );
    case(
        "raw data too short",
        import_bytes(&with_graph(|g| g.initializer[0].raw_data.as_mut().expect("raw").truncate(100))),
        &["tensor `w`", "more elements than the file holds"],
    );
    case(
        "float_data count mismatch",
        import_bytes(&with_graph(|g| {
            g.initializer[1].raw_data = None;
            g.initializer[1].float_data = vec![1.0, 2.0];
        })),
        &["tensor `b`", "more elements than the file holds"],
    );
    case(
        "string initializer",
        import_bytes(&with_graph(|g| g.initializer[1].data_type = Some(8))),
        &["tensor `b`", "STRING"],
    );
    case(
        "unknown element type 999",
        import_bytes(&with_graph(|g| g.initializer[1].data_type = Some(999))),
        &["unknown ONNX element type code 999"],
    );
    // External data: written into a model folder, read through `import(path)`.
    let ext = |loc: &str, offset: &str, length: &str| -> Vec<u8> {
        with_graph(|g| {
            let t = &mut g.initializer[1];
            t.raw_data = None;
            t.data_location = Some(DataLocation::External as i32);
            t.external_data = vec![
                StringStringEntryProto { key: Some("location".into()), value: Some(loc.into()) },
                StringStringEntryProto { key: Some("offset".into()), value: Some(offset.into()) },
                StringStringEntryProto { key: Some("length".into()), value: Some(length.into()) },
            ];
        })
    };
    std::fs::write(tmp.path().join("weights.bin"), [0u8; 16]).expect("write");
    let write_and_import = |name: &str, b: Vec<u8>| -> Result<(), String> {
        let p = tmp.path().join(name);
        std::fs::write(&p, b).map_err(|e| e.to_string())?;
        import(&p, &ImportOptions::default()).map(|_| ()).map_err(|e| e.to_string())
    };
    case(
        "external data ../ path",
        write_and_import("a.onnx", ext("../secret.bin", "0", "16")),
        &["leaves the model's folder"],
    );
    case(
        "external data absolute path",
        write_and_import("b.onnx", ext("/etc/passwd", "0", "16")),
        &["leaves the model's folder"],
    );
    case("external data file missing", write_and_import("c.onnx", ext("nothere.bin", "0", "16")), &["nothere.bin"]);
    case(
        "external data range beyond file",
        write_and_import("d.onnx", ext("weights.bin", "8", "64")),
        &["beyond the end"],
    );
    case("external data from bytes", import_bytes(&ext("weights.bin", "0", "16")), &["loaded from bytes"]);
    // Nested subgraphs 40 deep.
    let mut inner = GraphProto { name: Some("leaf".into()), ..Default::default() };
    for i in 0..40 {
        inner = GraphProto {
            name: Some(format!("level{i}")),
            node: vec![node(
                "If",
                &format!("if{i}"),
                &["c"],
                &["o"],
                vec![attr_graph("then_branch", inner), attr_graph("else_branch", GraphProto::default())],
            )],
            ..Default::default()
        };
    }
    let deep = with_graph(|g| {
        g.node.push(node(
            "If",
            "top",
            &["c"],
            &["o"],
            vec![attr_graph("then_branch", inner), attr_graph("else_branch", GraphProto::default())],
        ))
    });
    case("subgraphs nested 40 deep", import_bytes(&deep), &["nested"]);
    case(
        "sequence-typed input",
        import_bytes(&with_graph(|g| {
            g.input[0].r#type.as_mut().expect("type").value =
                Some(ferrofx_onnx::proto::type_proto::Value::SequenceType(Box::default()));
        })),
        &["input `x`", "not a tensor"],
    );
    case(
        "given shape contradicts the file",
        {
            let f = ModelFile::from_bytes(&good_bytes).map_err(|e| e.to_string()).expect("decode");
            let mut o = ImportOptions::default();
            o.input_shapes.insert("x".into(), vec![1, 4, 8, 8]);
            import_model(&f, &o).map(|_| ()).map_err(|e| e.to_string())
        },
        &["input `x`", "[1, 4, 8, 8]"],
    );
    case(
        "run with a wrong input shape",
        {
            let f = ModelFile::from_bytes(&good_bytes).expect("decode");
            let m = import_model(&f, &ImportOptions::default()).expect("import");
            let x = Tensor::from_vec(vec![0.0f32; 2 * 8 * 8], &[1, 2, 8, 8]).expect("x");
            m.module.forward_values(&[Value::Tensor(x)]).map(|_| ()).map_err(|e| e.to_string())
        },
        &["conv2d"],
    );
    case(
        "reshape target from input values",
        import_bytes(&with_graph(|g| {
            g.input.push(value_info("s", INT64, &[Some(2)], ""));
            g.node.push(node("Reshape", "rs", &["y", "s"], &["z"], vec![]));
            g.output[0].name = Some("z".into());
        })),
        &["node `rs`", "Reshape", "must be known when the model is imported"],
    );
    case(
        "4-D convolution",
        import_bytes(&with_graph(|g| {
            g.input[0] = value_info("x", FLOAT, &[Some(1), Some(3), Some(8), Some(8), Some(8), Some(8)], "");
            g.initializer[0].dims = vec![4, 3, 3, 3, 1, 1];
        })),
        &["node `conv`", "only 1-D, 2-D and 3-D convolutions"],
    );
    case(
        "Gemm with mismatched weights",
        import_bytes(&with_graph(|g| {
            g.initializer[2] = f32_init("fw", &[2, 5]);
        })),
        &["node `fc`", "Gemm"],
    );
    case(
        "Loop",
        import_bytes(&with_graph(|g| g.node.push(node("Loop", "loop", &["", ""], &["o"], vec![])))),
        &["node `loop`", "Loop", "loops are not supported"],
    );
    case(
        "graph output never produced",
        import_bytes(&with_graph(|g| g.output[0].name = Some("nowhere".into()))),
        &["graph output `nowhere`"],
    );
    case(
        "Split sizes do not add up",
        import_bytes(&with_graph(|g| {
            g.initializer.push(i64_init("sizes", &[1, 5]));
            g.node.push(node("Split", "split", &["y", "sizes"], &["s1", "s2"], vec![attr_int("axis", 1)]));
            g.output[0].name = Some("s1".into());
        })),
        &["node `split`", "do not add up"],
    );
    case(
        "rank 100 initializer",
        import_bytes(&with_graph(|g| g.initializer[1].dims = vec![1; 100])),
        &["100 dimensions"],
    );
    case(
        "ConstantOfShape of 10^15 elements",
        import_bytes(&with_graph(|g| {
            g.initializer.push(i64_init("big", &[1_000_000, 1_000_000_000]));
            g.node.push(node("ConstantOfShape", "cos", &["big"], &["z"], vec![]));
            g.output[0].name = Some("z".into());
        })),
        &["node `cos`", "ConstantOfShape"],
    );
    case(
        "node with too few inputs",
        import_bytes(&with_graph(|g| g.node[4].input.truncate(1))),
        &["node `fc`", "input 1 is required"],
    );
    assert!(n >= 30, "only {n} cases");
}
