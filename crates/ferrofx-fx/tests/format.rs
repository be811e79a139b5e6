//! Traced-module file format: graphs survive a round trip exactly; every kind of corrupted or
//! hostile file gives its own clear error (never a panic).

#[path = "support/mutate.rs"]
mod mutate;

use ferrofx_core::{DType, Tensor};
use ferrofx_fx::serialize::{
    graph_from_doc, graph_to_doc, read_module_bytes, write_module_bytes, ArgDoc, FormatError, LeafDoc, ModuleDoc,
    TensorDoc, TensorKind,
};
use ferrofx_fx::{Argument, Device, Graph, Kwargs, ModuleStackEntry, Target, TensorMetadata};
use ferrofx_nn::spec::{Attr, ModuleSpec};
use ferrofx_nn::StateDict;
use std::collections::HashMap;

/// A graph using every argument kind, kwargs, type annotations and metadata.
fn rich_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let w = g.get_attr("fc.weight").unwrap();
    let lin = g.call_module("fc", vec![x.into()]).unwrap();
    let mut kw = Kwargs::new();
    kw.insert("alpha".into(), Argument::Float(0.5));
    let add = g.call_function_with(Target::named("add"), vec![lin.into(), w.into()], kw).unwrap();
    let args = vec![
        add.into(),
        Argument::tuple([
            Argument::None,
            Argument::Ellipsis,
            Argument::Bool(true),
            Argument::Int(-3),
            Argument::Float(f64::INFINITY),
            Argument::Float(f64::NEG_INFINITY),
            Argument::Str("s".into()),
            Argument::DType(DType::F16),
            Argument::Device(Box::new(Device::new("cuda", Some(1)))),
            Argument::slice(Argument::Int(0), Argument::None, Argument::Int(2)),
            Argument::list([x.into(), Argument::dict([("k", Argument::Node(add))])]),
        ]),
    ];
    let m = g.call_method("clamp", args).unwrap();
    g.set_type(m, Some("Tensor".to_string())).unwrap();
    let meta = g.meta_mut(m).unwrap();
    meta.tensor_meta = Some(TensorMetadata::contiguous(vec![2, 3], DType::F32));
    meta.stack_trace = Some("src/model.rs:12:9".to_string());
    meta.nn_module_stack =
        vec![ModuleStackEntry { key: "fc".into(), path: "fc".into(), type_name: "Linear".into() }].into();
    g.output(Argument::tuple([m.into(), Argument::Float(f64::NAN)])).unwrap();
    g
}

#[test]
fn graph_round_trip_is_exact() {
    let g = rich_graph();
    let doc = graph_to_doc(&g).unwrap();
    let json = serde_json::to_string(&doc).unwrap();
    let back = graph_from_doc(&serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back.to_string(), g.to_string());
    assert_eq!(graph_to_doc(&back).unwrap(), doc);
    let clamp = back.iter().find(|n| n.name() == "clamp").unwrap();
    assert_eq!(clamp.type_expr(), Some("Tensor"));
    assert_eq!(clamp.meta().tensor_meta.as_ref().unwrap().shape, vec![2, 3]);
    assert_eq!(clamp.meta().stack_trace.as_deref(), Some("src/model.rs:12:9"));
    assert_eq!(clamp.meta().nn_module_stack[0].type_name, "Linear");
}

fn valid() -> (ModuleDoc, StateDict) {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.call_module("fc", vec![x.into()]).unwrap();
    let c = g.get_attr("scale").unwrap();
    let z = g.call_function(Target::named("mul"), vec![y.into(), c.into()]).unwrap();
    g.output(z.into()).unwrap();
    let mut doc = ModuleDoc::new("Net", false, graph_to_doc(&g).unwrap());
    doc.leaves.push(LeafDoc {
        path: "fc".into(),
        spec: ModuleSpec::new("Linear")
            .with("in_features", Attr::Int(3))
            .with("out_features", Attr::Int(2))
            .with("bias", Attr::Bool(true)),
    });
    let decl = |path: &str, kind, shape: &[u64]| TensorDoc {
        path: path.into(),
        kind,
        dtype: "float32".into(),
        shape: shape.to_vec(),
        requires_grad: kind == TensorKind::Parameter,
    };
    doc.tensors = vec![
        decl("fc.weight", TensorKind::Parameter, &[2, 3]),
        decl("fc.bias", TensorKind::Parameter, &[2]),
        decl("scale", TensorKind::Constant, &[]),
    ];
    let mut sd = StateDict::new();
    sd.insert("fc.weight".into(), Tensor::from_vec(vec![1.0f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap());
    sd.insert("fc.bias".into(), Tensor::from_vec(vec![0.5f32, -0.5], &[2]).unwrap());
    sd.insert("scale".into(), Tensor::from_vec(vec![2.0f32], &[]).unwrap());
    (doc, sd)
}

#[test]
fn file_round_trip_keeps_document_and_tensors() {
    let (doc, sd) = valid();
    let bytes = write_module_bytes(&doc, &sd).unwrap();
    let (back, tensors) = read_module_bytes(&bytes).unwrap();
    assert_eq!(back, doc);
    assert_eq!(tensors.len(), 3);
    assert_eq!(tensors["fc.weight"].to_vec::<f32>().unwrap(), vec![1.0, 2., 3., 4., 5., 6.]);
    let g = graph_from_doc(&back.graph).unwrap();
    assert_eq!(g.len(), 5);
}

#[test]
fn writing_refuses_undeclared_or_mismatched_tensors() {
    let (doc, mut sd) = valid();
    sd.insert("extra".into(), Tensor::from_vec(vec![1.0f32], &[1]).unwrap());
    let e = write_module_bytes(&doc, &sd).unwrap_err().to_string();
    assert!(e.contains("holds 4 tensors but declares 3"), "{e}");
    let (doc, mut sd) = valid();
    sd.insert("scale".into(), Tensor::from_vec(vec![1.0f64], &[1]).unwrap());
    let e = write_module_bytes(&doc, &sd).unwrap_err().to_string();
    assert!(e.contains("tensor 'scale' is declared as float32 [] but the data is float64 [1]"), "{e}");
}

/// Writes `doc_json` and `sd` with arbitrary format/version metadata, bypassing every check.
fn raw(meta: &[(&str, &str)], sd: &StateDict) -> Vec<u8> {
    let m: HashMap<String, String> = meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    ferrofx_nn::state_dict_to_bytes(sd, if m.is_empty() { None } else { Some(m) }).unwrap()
}

fn with_doc(doc_json: &str, sd: &StateDict) -> Vec<u8> {
    raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "1"), ("ferrofx.module", doc_json)], sd)
}

/// Applies `edit` to the valid document's JSON value and writes it with the valid tensors.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let (doc, sd) = valid();
    let mut v = serde_json::to_value(&doc).unwrap();
    edit(&mut v);
    with_doc(&v.to_string(), &sd)
}

fn expect(name: &str, bytes: &[u8], want: &str) {
    match mutate::load(bytes) {
        Ok(()) => panic!("corruption '{name}' was accepted"),
        Err(e) => assert!(e.contains(want), "corruption '{name}': got «{e}», expected it to contain «{want}»"),
    }
}

#[test]
fn corrupted_files_give_clear_errors() {
    let (doc, sd) = valid();
    let good = write_module_bytes(&doc, &sd).unwrap();
    mutate::load(&good).unwrap();
    let n = |i: usize| format!("/graph/nodes/{i}");
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty file", vec![], "the file is truncated or corrupt"),
        ("4 bytes", good[..4].to_vec(), "the file is truncated or corrupt"),
        (
            "header length past the end",
            {
                let mut b = good.clone();
                b[..8].copy_from_slice(&(good.len() as u64 * 2).to_le_bytes());
                b
            },
            "the file is truncated or corrupt",
        ),
        ("truncated data", good[..good.len() - 3].to_vec(), "past the end of the"),
        (
            "header not JSON",
            {
                let mut b = good.clone();
                b[8] = b'#';
                b
            },
            "the file is truncated or corrupt",
        ),
        ("plain state dict", raw(&[], &sd), "no metadata (a plain state dict?)"),
        ("other metadata", raw(&[("format", "pt")], &sd), "no ferrofx.format"),
        ("wrong format tag", raw(&[("ferrofx.format", "onnx")], &sd), "ferrofx.format is 'onnx'"),
        (
            "version from the future",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "7")], &sd),
            "format version 7, but this ferrofx reads versions up to 1",
        ),
        (
            "version not a number",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "1.0beta")], &sd),
            "'1.0beta' is not a version number",
        ),
        ("no version", raw(&[("ferrofx.format", "ferrofx.traced_module")], &sd), "no ferrofx.version"),
        (
            "no module document",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "1")], &sd),
            "no ferrofx.module document",
        ),
        ("document not JSON", with_doc("{\"producer\": ", &sd), "module document: EOF"),
        (
            "document misses the graph",
            with_doc("{\"producer\":\"x\",\"type_name\":\"t\",\"training\":false}", &sd),
            "missing field `graph`",
        ),
        (
            "unknown opcode",
            edited(|v| v.pointer_mut(&(n(1) + "/op")).unwrap().clone_from(&"call_shell".into())),
            "unknown opcode 'call_shell'",
        ),
        (
            "unknown op",
            edited(|v| v.pointer_mut(&(n(3) + "/target")).unwrap().clone_from(&"os_system".into())),
            "calls the op 'os_system', which is not registered",
        ),
        (
            "reference to a later node",
            edited(|v| v.pointer_mut(&(n(1) + "/args/0")).unwrap().clone_from(&serde_json::json!({"node": 3}))),
            "uses node #3, which is not defined before it",
        ),
        (
            "dangling reference",
            edited(|v| {
                v.pointer_mut(&(n(3) + "/args/0")).unwrap().clone_from(&serde_json::json!({"node": 4000000000u32}))
            }),
            "uses node #4000000000",
        ),
        (
            "duplicate node name",
            edited(|v| v.pointer_mut(&(n(2) + "/name")).unwrap().clone_from(&"fc".into())),
            "the name 'fc' is used twice",
        ),
        (
            "invalid node name",
            edited(|v| v.pointer_mut(&(n(2) + "/name")).unwrap().clone_from(&"scale factor".into())),
            "is not a valid node name",
        ),
        (
            "unknown dtype argument",
            edited(|v| {
                v.pointer_mut(&(n(3) + "/args/1")).unwrap().clone_from(&serde_json::json!({"dtype": "float128"}))
            }),
            "unknown dtype 'float128'",
        ),
        (
            "bad non-finite float",
            edited(|v| {
                v.pointer_mut(&(n(3) + "/args/1")).unwrap().clone_from(&serde_json::json!({"non_finite": "huge"}))
            }),
            "non-finite float 'huge'",
        ),
        (
            "arguments nested too deep",
            edited(|v| {
                let mut a = serde_json::json!({"int": 1});
                for _ in 0..40 {
                    a = serde_json::json!({"list": [a]});
                }
                v.pointer_mut(&(n(3) + "/args/1")).unwrap().clone_from(&a);
            }),
            "nested deeper than 32 levels",
        ),
        (
            "JSON nested too deep",
            edited(|v| {
                let mut a = serde_json::json!({"int": 1});
                for _ in 0..70 {
                    a = serde_json::json!({"list": [a]});
                }
                v.pointer_mut(&(n(3) + "/args/1")).unwrap().clone_from(&a);
            }),
            "recursion limit exceeded",
        ),
        (
            "duplicate keyword",
            edited(|v| {
                v.pointer_mut(&n(3))
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .insert("kwargs".into(), serde_json::json!([["alpha", {"int": 1}], ["alpha", {"int": 2}]]));
            }),
            "keyword argument 'alpha' given twice",
        ),
        (
            "two outputs",
            edited(|v| {
                let out = v.pointer(&n(4)).unwrap().clone();
                let mut second = out.clone();
                second["name"] = "output_1".into();
                v.pointer_mut("/graph/nodes").unwrap().as_array_mut().unwrap().push(second);
            }),
            "the graph has 2 output nodes",
        ),
        (
            "huge tensor meta",
            edited(|v| {
                v.pointer_mut(&n(3)).unwrap().as_object_mut().unwrap().insert("meta".into(), serde_json::json!({"tensor_meta": {"shape": [4294967296u64, 4294967296u64], "dtype": "float32", "strides": [1, 1]}}));
            }),
            "has more elements than any tensor can",
        ),
        (
            "meta rank and strides disagree",
            edited(|v| {
                v.pointer_mut(&n(3)).unwrap().as_object_mut().unwrap().insert(
                    "meta".into(),
                    serde_json::json!({"tensor_meta": {"shape": [2, 3], "dtype": "float32", "strides": [1]}}),
                );
            }),
            "rank must match",
        ),
        (
            "declared tensor missing",
            edited(|v| {
                v["tensors"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"path": "ghost", "kind": "buffer", "dtype": "float32", "shape": [1]}))
            }),
            "tensor 'ghost' is declared but its data is missing",
        ),
        (
            "undeclared tensor",
            edited(|v| {
                v["tensors"].as_array_mut().unwrap().pop();
            }),
            "holds 3 tensors but declares 2",
        ),
        (
            "declared twice",
            edited(|v| {
                let t = v["tensors"][0].clone();
                v["tensors"].as_array_mut().unwrap().push(t);
            }),
            "tensor 'fc.weight' is declared twice",
        ),
        (
            "dtype disagrees",
            edited(|v| v["tensors"][0]["dtype"] = "float64".into()),
            "declared as float64 [2, 3] but the data is float32 [2, 3]",
        ),
        (
            "shape disagrees",
            edited(|v| v["tensors"][0]["shape"] = serde_json::json!([3, 2])),
            "declared as float32 [3, 2] but the data is float32 [2, 3]",
        ),
        (
            "unknown leaf type",
            edited(|v| v["leaves"][0]["spec"]["type_name"] = "Subprocess".into()),
            "unknown module type 'Subprocess'",
        ),
        (
            "leaf config disagrees with its weights",
            edited(|v| v["leaves"][0]["spec"]["attrs"]["in_features"] = serde_json::json!({"Int": 4})),
            "tensor 'weight' has shape [2, 3], but the configuration implies [2, 4]",
        ),
        (
            "leaf attribute of the wrong type",
            edited(|v| v["leaves"][0]["spec"]["attrs"]["bias"] = serde_json::json!({"Str": "yes"})),
            "attribute 'bias' must be a bool",
        ),
    ];
    assert!(cases.len() >= 20);
    for (name, bytes, want) in cases.drain(..) {
        expect(name, &bytes, want);
    }
}

#[test]
fn user_functions_cannot_be_saved() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let f: &'static ferrofx_fx::UserFunction = Box::leak(Box::new(ferrofx_fx::UserFunction::new("my_helper")));
    let y = g.call_function(f, vec![x.into()]).unwrap();
    g.output(y.into()).unwrap();
    let e = graph_to_doc(&g).unwrap_err();
    assert!(matches!(e, FormatError::Invalid(_)));
    assert!(e.to_string().contains("user function 'my_helper'") && e.to_string().contains("custom op"), "{e}");
}

#[test]
fn arg_doc_json_is_readable() {
    let j = serde_json::to_string(&ArgDoc::List(vec![ArgDoc::Node(0), ArgDoc::Int(2), ArgDoc::None])).unwrap();
    assert_eq!(j, r#"{"list":[{"node":0},{"int":2},"none"]}"#);
}
