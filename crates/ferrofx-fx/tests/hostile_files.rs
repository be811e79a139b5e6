//! Hostile traced-module files, generated here (no committed binaries): each one is loaded and,
//! when it loads, run under a memory limit; each must fail with its own specific error, and the
//! whole suite must stay under 2 GB resident (checked with the process's peak RSS, `VmHWM`, on
//! Linux). Runs in debug and release builds.

use ferrofx_core::{DType, ErrorKind, Tensor, Value};
use ferrofx_fx::serialize::{graph_to_doc, write_module_bytes, LeafDoc, ModuleDoc, TensorDoc, TensorKind};
use ferrofx_fx::{Argument, Graph, GraphModule, Target};
use ferrofx_nn::spec::{Attr, ModuleSpec};
use ferrofx_nn::{Module, StateDict};
use std::collections::HashMap;

/// Memory limit of every run in this suite.
const LIMIT: u64 = 256 << 20;
/// Compute limit of every run in this suite (FLOPs).
const FLOPS: u64 = 100_000_000_000;

/// What a case does with its file.
enum Stage {
    /// Loading must fail.
    Load,
    /// Loading must succeed and running on these inputs must fail.
    Run(Vec<Tensor>),
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    stage: Stage,
    /// The error kind and a piece of the message that identifies this failure.
    kind: ErrorKind,
    want: &'static str,
}

fn decl(path: &str, t: &Tensor, kind: TensorKind) -> TensorDoc {
    TensorDoc {
        path: path.into(),
        kind,
        dtype: t.dtype().name().into(),
        shape: t.shape().iter().map(|&d| d as u64).collect(),
        requires_grad: false,
    }
}

/// A module file: the graph, leaves `(path, spec, module)` (tensors from the module), constants.
fn file(g: &Graph, leaves: &[(&str, ModuleSpec, &dyn Module)], consts: &[(&str, Tensor)]) -> Vec<u8> {
    let mut doc = ModuleDoc::new("Hostile", false, graph_to_doc(g).unwrap());
    let mut sd = StateDict::new();
    for (path, spec, m) in leaves {
        doc.leaves.push(LeafDoc { path: path.to_string(), spec: spec.clone() });
        for (n, t) in m.named_parameters().into_iter().chain(m.named_buffers()) {
            let p = format!("{path}.{n}");
            doc.tensors.push(decl(&p, &t, TensorKind::Parameter));
            sd.insert(p, t);
        }
    }
    for (p, t) in consts {
        doc.tensors.push(decl(p, t, TensorKind::Constant));
        sd.insert(p.to_string(), t.clone());
    }
    write_module_bytes(&doc, &sd).unwrap()
}

/// `x -> relu -> output`, with one constant: the valid base the document edits start from.
fn base() -> (serde_json::Value, StateDict) {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let c = g.get_attr("scale").unwrap();
    let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    let m = g.call_function(Target::named("mul"), vec![r.into(), c.into()]).unwrap();
    g.output(m.into()).unwrap();
    let mut doc = ModuleDoc::new("Base", false, graph_to_doc(&g).unwrap());
    let scale = Tensor::from_vec(vec![2.0f32], &[1]).unwrap();
    doc.tensors.push(decl("scale", &scale, TensorKind::Constant));
    let mut sd = StateDict::new();
    sd.insert("scale".into(), scale);
    (serde_json::to_value(&doc).unwrap(), sd)
}

fn raw(meta: &[(&str, &str)], sd: &StateDict) -> Vec<u8> {
    let m: HashMap<String, String> = meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    ferrofx_nn::state_dict_to_bytes(sd, if m.is_empty() { None } else { Some(m) }).unwrap()
}

fn with_doc(doc: &str, sd: &StateDict) -> Vec<u8> {
    raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "1"), ("ferrofx.module", doc)], sd)
}

/// The base document edited by `f` (and its tensors edited by `t`).
fn edited(f: impl FnOnce(&mut serde_json::Value), t: impl FnOnce(&mut StateDict)) -> Vec<u8> {
    let (mut v, mut sd) = base();
    f(&mut v);
    t(&mut sd);
    with_doc(&v.to_string(), &sd)
}

fn doc_edit(f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    edited(f, |_| {})
}

fn node(i: usize) -> String {
    format!("/graph/nodes/{i}")
}

/// Sets the value at a JSON pointer (creating the last key of an object when absent).
fn set(v: &mut serde_json::Value, ptr: &str, x: serde_json::Value) {
    if let Some(slot) = v.pointer_mut(ptr) {
        *slot = x;
        return;
    }
    let (parent, key) = ptr.rsplit_once('/').unwrap();
    v.pointer_mut(parent)
        .and_then(|p| p.as_object_mut())
        .unwrap_or_else(|| panic!("no {parent}"))
        .insert(key.into(), x);
}

/// A safetensors file written by hand: the base document as metadata, then the header text
/// `entries` (a JSON object body without braces) and `data_len` zero bytes of data.
fn st_text(entries: &str, data_len: usize) -> Vec<u8> {
    let (v, _) = base();
    let meta = serde_json::json!({
        "ferrofx.format": "ferrofx.traced_module", "ferrofx.version": "1", "ferrofx.module": v.to_string()
    });
    let text = format!("{{\"__metadata__\": {meta}, {entries}}}");
    let mut b = (text.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(text.as_bytes());
    b.resize(b.len() + data_len, 0);
    b
}

/// [`st_text`] with entries `(name, dtype, shape, [begin, end])`, in this order.
fn st(entries: &[(&str, &str, &[u64], [u64; 2])], data_len: usize) -> Vec<u8> {
    let body: Vec<String> = entries
        .iter()
        .map(|(n, d, s, o)| format!("\"{n}\": {}", serde_json::json!({"dtype": d, "shape": s, "data_offsets": o})))
        .collect();
    st_text(&body.join(", "), data_len)
}

fn good_bytes() -> Vec<u8> {
    let (v, sd) = base();
    with_doc(&v.to_string(), &sd)
}

fn x4() -> Tensor {
    Tensor::from_vec(vec![1.0f32; 4], &[1, 1, 2, 2]).unwrap()
}

fn max_pool_spec(kernel: i64, padding: i64) -> ModuleSpec {
    ModuleSpec::new("MaxPool2d")
        .with("kernel_size", Attr::Ints(vec![kernel, kernel]))
        .with("stride", Attr::Ints(vec![1, 1]))
        .with("padding", Attr::Ints(vec![padding, padding]))
        .with("dilation", Attr::Ints(vec![1, 1]))
        .with("ceil_mode", Attr::Bool(false))
}

fn conv_spec(padding: i64) -> ModuleSpec {
    ModuleSpec::new("Conv2d")
        .with("in_channels", Attr::Int(1))
        .with("out_channels", Attr::Int(1))
        .with("kernel_size", Attr::Ints(vec![1, 1]))
        .with("stride", Attr::Ints(vec![1, 1]))
        .with("padding", Attr::Ints(vec![padding, padding]))
        .with("dilation", Attr::Ints(vec![1, 1]))
        .with("groups", Attr::Int(1))
        .with("bias", Attr::Bool(false))
}

/// [`leaf_file`]'s document as JSON, with its tensors.
fn leaf_doc(spec: ModuleSpec) -> (serde_json::Value, StateDict) {
    let bytes = leaf_file(spec);
    let (doc, sd) = ferrofx_fx::serialize::read_module_bytes(&bytes).unwrap();
    (serde_json::to_value(&doc).unwrap(), sd)
}

/// A graph `x -> leaf -> output` with a built leaf.
fn leaf_file(spec: ModuleSpec) -> Vec<u8> {
    let m = ferrofx_nn::spec::build_builtin(&spec, &mut |n: &str| {
        if n == "weight" {
            Some(Tensor::from_vec(vec![1.0f32], &[1, 1, 1, 1]).unwrap())
        } else {
            None
        }
    })
    .unwrap();
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.call_module("layer", vec![x.into()]).unwrap();
    g.output(y.into()).unwrap();
    file(&g, &[("layer", spec, m.as_ref())], &[])
}

/// A graph `x -> f(x, args...) -> output` of one registry op.
fn op_file(op: &str, args: Vec<Argument>) -> Vec<u8> {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let mut all = vec![Argument::Node(x)];
    all.extend(args);
    let y = g.call_function(Target::named(op), all).unwrap();
    g.output(y.into()).unwrap();
    file(&g, &[], &[])
}

/// `x -> expand(huge) -> add(expanded, 1) -> output`: the view is free, the add is not.
fn expand_add(shape: Vec<i64>) -> Vec<u8> {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let e = g.call_method("expand", vec![x.into(), Argument::list(shape.into_iter().map(Argument::Int))]).unwrap();
    let a = g.call_function(Target::named("add"), vec![e.into(), Argument::Float(1.0)]).unwrap();
    g.output(a.into()).unwrap();
    file(&g, &[], &[])
}

fn cases() -> Vec<Case> {
    let good = good_bytes();
    let (_, sd) = base();
    let load = |name, bytes, kind, want| Case { name, bytes, stage: Stage::Load, kind, want };
    let run = |name, bytes, inputs, want| Case { name, bytes, stage: Stage::Run(inputs), kind: ErrorKind::Limit, want };
    let fmt = ErrorKind::Format;
    let mut v = vec![
        // ---- the container -------------------------------------------------------------
        load("empty file", vec![], fmt, "truncated or corrupt"),
        load("4 bytes", good[..4].to_vec(), fmt, "truncated or corrupt"),
        load(
            "header length past the end",
            {
                let mut b = good.clone();
                b[..8].copy_from_slice(&(good.len() as u64 * 2).to_le_bytes());
                b
            },
            fmt,
            "truncated or corrupt",
        ),
        load(
            "header length of 2^63",
            {
                let mut b = good.clone();
                b[..8].copy_from_slice(&(1u64 << 63).to_le_bytes());
                b
            },
            fmt,
            "truncated or corrupt",
        ),
        load(
            "truncated data",
            good[..good.len() - 3].to_vec(),
            fmt,
            "tensor 'scale' has data_offsets [0, 4], past the end",
        ),
        load(
            "trailing garbage",
            {
                let mut b = good.clone();
                b.extend_from_slice(b"junk");
                b
            },
            fmt,
            "truncated or corrupt",
        ),
        load(
            "header not JSON",
            {
                let mut b = good.clone();
                b[8] = b'#';
                b
            },
            fmt,
            "truncated or corrupt",
        ),
        load(
            "header not UTF-8",
            {
                let mut b = good.clone();
                b[9] = 0xFF;
                b
            },
            fmt,
            "truncated or corrupt",
        ),
        // ---- tensor offsets: every check names the tensor at fault ('zeta' is first in the
        // data, 'alpha' second, so neither name order nor data order can pick the right one
        // by accident)
        load(
            "offsets: a span that disagrees with the tensor's size",
            st(&[("zeta", "F32", &[2], [0, 4]), ("alpha", "F32", &[3], [4, 16])], 16),
            fmt,
            "tensor 'zeta' is F32 [2] (8 bytes), but its data_offsets [0, 4] span 4 bytes",
        ),
        load(
            "offsets: the end before the start",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F32", &[1], [12, 8])], 8),
            fmt,
            "tensor 'alpha' has data_offsets [12, 8]: the end is before the start",
        ),
        load(
            "offsets: a gap between two tensors",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F32", &[3], [12, 24])], 24),
            fmt,
            "tensor 'alpha' starts at byte 12, but tensor 'zeta' ends at byte 8",
        ),
        load(
            "offsets: overlapping tensors",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F32", &[3], [4, 16])], 16),
            fmt,
            "tensor 'alpha' (data_offsets [4, 16]) overlaps tensor 'zeta'",
        ),
        load(
            "offsets: the first tensor starts late",
            st(&[("zeta", "F32", &[2], [4, 12]), ("alpha", "F32", &[3], [12, 24])], 24),
            fmt,
            "tensor 'zeta' starts at byte 4, but the first tensor's data must start at byte 0",
        ),
        load(
            "offsets: data past the end of the file",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F32", &[3], [8, 20])], 12),
            fmt,
            "tensor 'alpha' has data_offsets [8, 20], past the end of the 12 bytes",
        ),
        load(
            "offsets: bytes after the last tensor",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F32", &[3], [8, 20])], 24),
            fmt,
            "ends at byte 20 (tensor 'alpha'), but 24 bytes follow the header",
        ),
        load(
            "offsets: an unknown dtype",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F128", &[3], [8, 20])], 20),
            fmt,
            "tensor 'alpha': unknown variant `F128`",
        ),
        load(
            "offsets: a size that overflows",
            st(&[("zeta", "F32", &[2], [0, 8]), ("alpha", "F32", &[1 << 40, 1 << 40], [8, 20])], 20),
            fmt,
            "tensor 'alpha' of dtype F32 and shape [1099511627776, 1099511627776]",
        ),
        load(
            "offsets: a tensor named twice",
            st_text(
                r#""zeta": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "zeta": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}"#,
                8,
            ),
            fmt,
            "tensor 'zeta' appears twice in the header",
        ),
        load("plain state dict", raw(&[], &sd), fmt, "a plain state dict"),
        load("wrong format tag", raw(&[("ferrofx.format", "onnx")], &sd), fmt, "ferrofx.format is 'onnx'"),
        load(
            "version from the future",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "99")], &sd),
            fmt,
            "format version 99, but this ferrofx reads versions up to 1",
        ),
        load(
            "version zero",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "0")], &sd),
            fmt,
            "'0' is not a version number",
        ),
        load(
            "version negative",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "-1")], &sd),
            fmt,
            "'-1' is not a version number",
        ),
        load(
            "no module document",
            raw(&[("ferrofx.format", "ferrofx.traced_module"), ("ferrofx.version", "1")], &sd),
            fmt,
            "no ferrofx.module document",
        ),
        load("document not JSON", with_doc("{\"producer\": ", &sd), fmt, "module document: EOF"),
        load("document is a list", with_doc("[1, 2, 3]", &sd), fmt, "module document: invalid type"),
        // ---- the graph rules -------------------------------------------------------------
        load("no nodes", doc_edit(|v| set(v, "/graph/nodes", serde_json::json!([]))), fmt, "the graph has no nodes"),
        load(
            "no output node",
            doc_edit(|v| {
                v.pointer_mut("/graph/nodes").unwrap().as_array_mut().unwrap().pop();
            }),
            fmt,
            "no output node",
        ),
        load(
            "two output nodes",
            doc_edit(|v| {
                let nodes = v.pointer_mut("/graph/nodes").unwrap().as_array_mut().unwrap();
                let mut o = nodes.last().unwrap().clone();
                o["name"] = "output_1".into();
                nodes.push(o);
            }),
            fmt,
            "2 output nodes",
        ),
        load(
            "output not last",
            doc_edit(|v| {
                let nodes = v.pointer_mut("/graph/nodes").unwrap().as_array_mut().unwrap();
                let o = nodes.pop().unwrap();
                nodes.insert(3, o);
            }),
            fmt,
            "must be its last node",
        ),
        load("unknown opcode", doc_edit(|v| set(v, &(node(2) + "/op"), "call_shell".into())), fmt, "unknown opcode"),
        load(
            "unknown op",
            doc_edit(|v| set(v, &(node(2) + "/target"), "os_system".into())),
            fmt,
            "calls the op 'os_system', which is not registered",
        ),
        load(
            "forward reference",
            doc_edit(|v| set(v, &(node(2) + "/args/0"), serde_json::json!({"node": 3}))),
            fmt,
            "uses node #3, which is not defined before it",
        ),
        load(
            "dangling reference",
            doc_edit(|v| set(v, &(node(3) + "/args/0"), serde_json::json!({"node": 4000000000u32}))),
            fmt,
            "uses node #4000000000",
        ),
        load("duplicate name", doc_edit(|v| set(v, &(node(2) + "/name"), "x".into())), fmt, "'x' is used twice"),
        load(
            "invalid name",
            doc_edit(|v| set(v, &(node(2) + "/name"), "rm -rf".into())),
            fmt,
            "is not a valid node name",
        ),
        load(
            "unknown dtype argument",
            doc_edit(|v| set(v, &(node(3) + "/args/1"), serde_json::json!({"dtype": "float128"}))),
            fmt,
            "unknown dtype 'float128'",
        ),
        load(
            "bad non-finite float",
            doc_edit(|v| set(v, &(node(3) + "/args/1"), serde_json::json!({"non_finite": "huge"}))),
            fmt,
            "non-finite float 'huge'",
        ),
        load(
            "arguments nested 40 deep",
            doc_edit(|v| {
                let mut a = serde_json::json!({"int": 1});
                for _ in 0..40 {
                    a = serde_json::json!({"list": [a]});
                }
                set(v, &(node(3) + "/args/1"), a);
            }),
            ErrorKind::Limit,
            "nested deeper than 32 levels",
        ),
        load(
            "tensor meta of 2^60 elements",
            doc_edit(|v| {
                set(
                    v,
                    &(node(2) + "/meta"),
                    serde_json::json!({"tensor_meta": {"shape": [1u64 << 30, 1u64 << 30], "dtype": "float32", "strides": [1, 1]}}),
                )
            }),
            ErrorKind::Limit,
            "more elements than any tensor can",
        ),
        load(
            "tensor meta rank 65",
            doc_edit(|v| {
                set(
                    v,
                    &(node(2) + "/meta"),
                    serde_json::json!({"tensor_meta": {"shape": vec![1; 65], "dtype": "float32", "strides": vec![1; 65]}}),
                )
            }),
            fmt,
            "rank must match and be at most 64",
        ),
        // ---- the declared inputs -------------------------------------------------------------
        load(
            "a declared input without a placeholder",
            doc_edit(|v| v["inputs"] = serde_json::json!(["x", "y"])),
            fmt,
            "the module declares the input 'y', but its graph has no placeholder for it",
        ),
        load(
            "a placeholder that is not declared",
            doc_edit(|v| v["inputs"] = serde_json::json!([])),
            fmt,
            "the module's graph has the placeholder 'x', which is not among the declared inputs []",
        ),
        load(
            "a declared input repeated",
            doc_edit(|v| v["inputs"] = serde_json::json!(["x", "x"])),
            fmt,
            "declares the inputs [\"x\", \"x\"], but its graph's placeholders are [\"x\"]",
        ),
        load(
            "a nested module's undeclared placeholder",
            doc_edit(|v| {
                let mut inner = v.clone();
                inner["tensors"] = serde_json::json!([]);
                inner["inputs"] = serde_json::json!(["input"]);
                v["submodules"] = serde_json::json!([{"path": "inner", "module": inner}]);
            }),
            fmt,
            "nested module 'inner' declares the input 'input'",
        ),
        // ---- the declared tensors ----------------------------------------------------------
        load(
            "tensor declared twice",
            doc_edit(|v| {
                let ts = v["tensors"].as_array_mut().unwrap();
                let t = ts[0].clone();
                ts.push(t);
            }),
            fmt,
            "declared twice",
        ),
        load(
            "declared tensor missing",
            edited(
                |_| {},
                |sd| {
                    sd.shift_remove("scale");
                    sd.insert("other".into(), Tensor::from_vec(vec![2.0f32], &[1]).unwrap());
                },
            ),
            fmt,
            "tensor 'scale' is declared but its data is missing",
        ),
        load(
            "undeclared tensor",
            edited(
                |_| {},
                |sd| {
                    sd.insert("payload".into(), Tensor::from_vec(vec![0u8; 16], &[16]).unwrap());
                },
            ),
            fmt,
            "holds 2 tensors but declares 1",
        ),
        load(
            "200k undeclared tensors",
            edited(
                |_| {},
                |sd| {
                    for i in 0..200_000 {
                        sd.insert(format!("t{i}"), Tensor::from_vec(vec![0u8], &[1]).unwrap());
                    }
                },
            ),
            fmt,
            "holds 200001 tensors but declares 1",
        ),
        load(
            "declared dtype differs",
            doc_edit(|v| set(v, "/tensors/0/dtype", "float64".into())),
            fmt,
            "declared as float64 [1] but the data is float32 [1]",
        ),
        load(
            "declared shape differs",
            doc_edit(|v| set(v, "/tensors/0/shape", serde_json::json!([1, 1]))),
            fmt,
            "declared as float32 [1, 1]",
        ),
        load(
            "declared rank 100",
            doc_edit(|v| set(v, "/tensors/0/shape", serde_json::json!(vec![1; 100]))),
            ErrorKind::Limit,
            "has rank 100 > 64",
        ),
        load(
            "get_attr of a missing tensor",
            doc_edit(|v| set(v, &(node(1) + "/target"), "no_such_weight".into())),
            fmt,
            "get_attr target 'no_such_weight' does not exist",
        ),
        load(
            "call_module of a missing module",
            doc_edit(|v| {
                set(v, &(node(2) + "/op"), "call_module".into());
                set(v, &(node(2) + "/target"), "ghost".into());
            }),
            fmt,
            "call_module target 'ghost' is not a submodule",
        ),
        load(
            "unknown leaf type",
            doc_edit(|v| {
                v["leaves"] = serde_json::json!([{"path": "evil", "spec": {"type_name": "PickleLoader", "attrs": {}}}])
            }),
            fmt,
            "leaf module 'evil'",
        ),
        load(
            "conv padding over 2^20",
            {
                let (mut v, sd) = leaf_doc(conv_spec(4));
                v["leaves"][0]["spec"]["attrs"]["padding"] = serde_json::json!({"Ints": [9999999, 9]});
                with_doc(&v.to_string(), &sd)
            },
            fmt,
            "attribute 'padding'",
        ),
        load(
            "max-pool padding over half its kernel",
            {
                let (mut v, sd) = leaf_doc(max_pool_spec(3, 1));
                v["leaves"][0]["spec"]["attrs"]["padding"] = serde_json::json!({"Ints": [2, 2]});
                with_doc(&v.to_string(), &sd)
            },
            fmt,
            "attribute 'padding' = [2, 2] is more than half the effective kernel",
        ),
        load(
            "avg-pool padding over half its kernel",
            {
                let (mut v, sd) = leaf_doc(
                    ModuleSpec::new("AvgPool2d")
                        .with("kernel_size", Attr::Ints(vec![4, 4]))
                        .with("stride", Attr::Ints(vec![1, 1]))
                        .with("padding", Attr::Ints(vec![0, 0]))
                        .with("ceil_mode", Attr::Bool(false))
                        .with("count_include_pad", Attr::Bool(true)),
                );
                v["leaves"][0]["spec"]["attrs"]["padding"] = serde_json::json!({"Ints": [0, 3]});
                with_doc(&v.to_string(), &sd)
            },
            fmt,
            "attribute 'padding' = [0, 3] is more than half the effective kernel",
        ),
        load(
            "nested module declaring tensors",
            doc_edit(|v| {
                let inner = v.clone();
                v["submodules"] = serde_json::json!([{"path": "inner", "module": inner}]);
            }),
            fmt,
            "nested module 'inner' declares tensors",
        ),
    ];
    // ---- files that load but must not run: refused by the memory budget ---------------------
    v.extend([
        run(
            "conv padding 2^20 (a 4 TiB output)",
            leaf_file(conv_spec(1 << 20)),
            vec![x4()],
            "node 'layer' (module 'layer', inside it op conv2d)",
        ),
        run(
            "adaptive pool to 2^20 x 2^20",
            leaf_file(ModuleSpec::new("AdaptiveAvgPool2d").with("output_size", Attr::Ints(vec![1 << 20, 1 << 20]))),
            vec![x4()],
            "inside it op adaptive_avg_pool2d",
        ),
        run(
            "outer product of an expanded vector",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let e = g.call_method("expand", vec![x.into(), Argument::list([Argument::Int(1 << 20)])]).unwrap();
                let c = g.call_method("reshape", vec![e.into(), Argument::list([-1, 1].map(Argument::Int))]).unwrap();
                let r = g.call_method("reshape", vec![e.into(), Argument::list([1, -1].map(Argument::Int))]).unwrap();
                let m = g.call_function(Target::named("matmul"), vec![c.into(), r.into()]).unwrap();
                g.output(m.into()).unwrap();
                file(&g, &[], &[])
            },
            vec![Tensor::from_vec(vec![1.0f32], &[1]).unwrap()],
            "node 'matmul'",
        ),
        run(
            "cat of expanded views",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let e = g
                    .call_method("expand", vec![x.into(), Argument::list([1 << 16, 1 << 16, 2, 2].map(Argument::Int))])
                    .unwrap();
                let c = g.call_function(Target::named("cat"), vec![Argument::list([e.into(), e.into()])]).unwrap();
                g.output(c.into()).unwrap();
                file(&g, &[], &[])
            },
            vec![x4()],
            "node 'cat'",
        ),
        run("expand then add", expand_add(vec![1 << 16, 1 << 16, 2, 2]), vec![x4()], "node 'add' (op add)"),
        run(
            "ones_like of a 2^40-element view",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let e = g
                    .call_method("expand", vec![x.into(), Argument::list([1 << 18, 1 << 18, 2, 2].map(Argument::Int))])
                    .unwrap();
                let o = g.call_function(Target::named("ones_like"), vec![e.into()]).unwrap();
                g.output(o.into()).unwrap();
                file(&g, &[], &[])
            },
            vec![x4()],
            "node 'ones_like'",
        ),
        run(
            "zeros of 2^40 elements",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let z = g
                    .call_function(Target::named("zeros"), vec![Argument::list([1 << 20, 1 << 20].map(Argument::Int))])
                    .unwrap();
                let a = g.call_function(Target::named("add"), vec![x.into(), z.into()]).unwrap();
                g.output(a.into()).unwrap();
                file(&g, &[], &[])
            },
            vec![x4()],
            "node 'zeros'",
        ),
        run(
            "a chain whose live values exceed the limit",
            {
                // each value is 64 MiB; five of them stay alive until the final sum
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let e = g.call_method("expand", vec![x.into(), Argument::list([1 << 12, 1 << 12].map(Argument::Int))]);
                let e = e.unwrap();
                let mut live = vec![];
                for _ in 0..5 {
                    live.push(g.call_function(Target::named("mul"), vec![e.into(), Argument::Float(2.0)]).unwrap());
                }
                let mut acc = live[0];
                for &n in &live[1..] {
                    acc = g.call_function(Target::named("add"), vec![acc.into(), n.into()]).unwrap();
                }
                g.output(acc.into()).unwrap();
                file(&g, &[], &[])
            },
            vec![Tensor::from_vec(vec![1.0f32], &[1, 1]).unwrap()],
            "other values are alive",
        ),
        run(
            "a huge input batch",
            op_file("relu", vec![]),
            vec![Tensor::from_vec(vec![0.0f32; 1 << 20], &[1 << 20]).unwrap().expand(&[1 << 12, 1 << 20]).unwrap()],
            "node 'relu'",
        ),
    ]);
    // ---- files that load but would spin: refused by the compute budget (registry FLOPs) ----
    v.extend([
        run(
            "max-pool window of 2^20 x 2^20 over a 64 x 64 input",
            leaf_file(max_pool_spec(1 << 20, 1 << 19)),
            vec![Tensor::from_vec(vec![1.0f32; 64 * 64], &[1, 1, 64, 64]).unwrap()],
            "FLOPs of them in op max_pool2d",
        ),
        run(
            "avg_pool2d window of 2^20 x 2^20 over an 8 x 8 input",
            op_file(
                "avg_pool2d",
                vec![
                    Argument::list([(1 << 20) + 1, (1 << 20) + 1].map(Argument::Int)),
                    Argument::list([1, 1].map(Argument::Int)),
                    Argument::list([1 << 19, 1 << 19].map(Argument::Int)),
                ],
            ),
            vec![Tensor::from_vec(vec![1.0f32; 64], &[1, 1, 8, 8]).unwrap()],
            "node 'avg_pool2d' (op avg_pool2d) would take",
        ),
        run(
            "a 4096 x 4096 product of expanded views (1.4e11 FLOPs in 64 MiB)",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let e = g
                    .call_method("expand", vec![x.into(), Argument::list([1 << 12, 1 << 12].map(Argument::Int))])
                    .unwrap();
                let m = g.call_function(Target::named("matmul"), vec![e.into(), e.into()]).unwrap();
                g.output(m.into()).unwrap();
                file(&g, &[], &[])
            },
            vec![Tensor::from_vec(vec![1.0f32], &[1, 1]).unwrap()],
            "node 'matmul' (op matmul) would take 137438953472 FLOPs",
        ),
    ]);
    // ---- attributes out of any sane range: refused by the op with the attribute named -----
    let argument =
        |name, bytes, want| Case { name, bytes, stage: Stage::Run(vec![x4()]), kind: ErrorKind::Argument, want };
    v.extend([
        argument(
            "max_pool2d kernel of 2^33",
            op_file(
                "max_pool2d",
                vec![Argument::list([1 << 33, 1].map(Argument::Int)), Argument::list([1, 1].map(Argument::Int))],
            ),
            "kernel_size=[8589934592, 1] is out of range",
        ),
        argument(
            "max_pool2d dilation making a 2^62 window",
            op_file(
                "max_pool2d",
                vec![
                    Argument::list([1 << 31, 1].map(Argument::Int)),
                    Argument::list([1, 1].map(Argument::Int)),
                    Argument::list([0, 0].map(Argument::Int)),
                    Argument::list([1 << 31, 1].map(Argument::Int)),
                ],
            ),
            "the effective kernel size",
        ),
        argument(
            "conv2d dilation of 2^40",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let ints = |v: [i64; 2]| Argument::list(v.map(Argument::Int));
                let c = g
                    .call_function(
                        Target::named("conv2d"),
                        vec![x.into(), x.into(), Argument::None, ints([1, 1]), ints([0, 0]), ints([1 << 40, 1])],
                    )
                    .unwrap();
                g.output(c.into()).unwrap();
                file(&g, &[], &[])
            },
            "dilation=[1099511627776, 1] is out of range",
        ),
        argument(
            "conv2d padding of i64::MAX",
            {
                let mut g = Graph::new();
                let x = g.placeholder("x").unwrap();
                let ints = |v: [i64; 2]| Argument::list(v.map(Argument::Int));
                let c = g
                    .call_function(
                        Target::named("conv2d"),
                        vec![x.into(), x.into(), Argument::None, ints([1, 1]), ints([i64::MAX, 0])],
                    )
                    .unwrap();
                g.output(c.into()).unwrap();
                file(&g, &[], &[])
            },
            "padding=[9223372036854775807, 0] is out of range",
        ),
    ]);
    // narrow with start + length overflowing: a clear index error, not an overflow
    v.push(Case {
        name: "narrow with start + length past i64::MAX",
        bytes: op_file("narrow", vec![Argument::Int(0), Argument::Int(1), Argument::Int(i64::MAX)]),
        stage: Stage::Run(vec![x4()]),
        kind: ErrorKind::Index,
        want: "exceeds dimension size",
    });
    v
}

fn check(c: &Case) -> Result<(), String> {
    let loaded = GraphModule::from_bytes(&c.bytes);
    let e = match (&c.stage, loaded) {
        (Stage::Load, Ok(_)) => return Err("loaded".into()),
        (Stage::Load, Err(e)) => e,
        (Stage::Run(_), Err(e)) => return Err(format!("did not load: {e}")),
        (Stage::Run(inputs), Ok(gm)) => {
            gm.set_max_memory(Some(LIMIT));
            gm.set_max_flops(Some(FLOPS));
            let vals: Vec<Value> = inputs.iter().map(|t| Value::Tensor(t.clone())).collect();
            match gm.forward_values(&vals) {
                Ok(_) => return Err("ran".into()),
                Err(e) => e,
            }
        }
    };
    let text = e.to_string();
    if e.kind() != c.kind || !text.contains(c.want) {
        return Err(format!("got {:?} «{text}», expected {:?} containing «{}»", e.kind(), c.kind, c.want));
    }
    if c.kind == ErrorKind::Limit
        && matches!(c.stage, Stage::Run(_))
        && !text.contains("256.0 MiB")
        && !text.contains("100000000000 FLOPs")
    {
        return Err(format!("the limit is not named: {text}"));
    }
    Ok(())
}

/// Peak resident memory of this process (Linux `VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

#[test]
fn every_hostile_file_gives_its_error_within_2_gb() {
    let cases = cases();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut failures = vec![];
    for c in &cases {
        let t = std::time::Instant::now();
        if let Err(e) = check(c) {
            failures.push(format!("{}: {e}", c.name));
        }
        // bounded work: no case may take long (the 200k-tensor file is the largest)
        assert!(t.elapsed().as_secs() < 60, "{} took {:?}", c.name, t.elapsed());
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    if let Some(rss) = peak_rss() {
        assert!(rss < 2 << 30, "peak RSS {} MiB exceeds 2 GiB", rss >> 20);
    }
}

#[test]
fn a_directory_is_not_a_file() {
    let e = GraphModule::load(std::env::temp_dir()).err().expect("a directory must not load");
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("is a directory"), "{e}");
}

#[test]
fn errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("ferrofx-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("no_output.fxm");
    std::fs::write(&p, doc_edit(|v| set(v, "/graph/nodes", serde_json::json!([])))).unwrap();
    let e = GraphModule::load(&p).err().unwrap().to_string();
    assert!(e.contains("no_output.fxm") && e.contains("invalid file") && !e.contains("io error"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_budget_admits_what_fits_and_caches_per_shape() {
    let bytes = expand_add(vec![4, 4, 2, 2]);
    let gm = GraphModule::from_bytes(&bytes).unwrap();
    gm.set_max_memory(Some(LIMIT));
    let y = gm.forward_values(&[Value::Tensor(x4())]).unwrap();
    assert_eq!(y[0].as_tensor().unwrap().shape(), &[4, 4, 2, 2]);
    let peak = gm.peak_memory(&[Value::Tensor(x4())]).unwrap();
    assert_eq!(peak.bytes, 4 * 4 * 2 * 2 * 4);
    assert_eq!(peak.node, "add");
    // just under the output's size: refused, naming node, shape, bytes and limit
    gm.set_max_memory(Some(255));
    let e = gm.forward_values(&[Value::Tensor(x4())]).unwrap_err().to_string();
    assert!(e.contains("node 'add'") && e.contains("[4, 4, 2, 2]") && e.contains("255 B"), "{e}");
    assert_eq!(DType::F32.size(), 4);
}

/// A save interrupted after the new content was written but before it replaced the file (a
/// crash before the rename), and a save whose serializer fails: the previous file stays intact
/// and loadable, and no temporary file is left behind.
#[test]
fn interrupted_saves_leave_the_previous_file_intact() {
    let dir = std::env::temp_dir().join(format!("ferrofx-interrupted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("m.fxm");
    let a = GraphModule::from_bytes(&expand_add(vec![2, 1, 2, 2])).unwrap();
    let b = GraphModule::from_bytes(&expand_add(vec![3, 1, 2, 2])).unwrap();
    a.save(&p).unwrap();
    let before = std::fs::read(&p).unwrap();
    let crash = ferrofx_core::atomic_file::write_atomic("save", &p, |tmp| {
        b.save(tmp)?;
        Err(ferrofx_core::Error::io("save", "simulated crash before the rename"))
    });
    assert!(crash.unwrap_err().to_string().contains("simulated crash"));
    let midway = ferrofx_core::atomic_file::write_atomic("save", &p, |tmp| {
        std::fs::write(tmp, &b.to_bytes().unwrap()[..100]).unwrap();
        Err(ferrofx_core::Error::io("save", "disk full after 100 bytes"))
    });
    assert!(midway.is_err());
    assert_eq!(std::fs::read(&p).unwrap(), before);
    let back = GraphModule::load(&p).unwrap();
    let y = back.forward_values(&[Value::Tensor(x4())]).unwrap();
    assert_eq!(y[0].as_tensor().unwrap().shape(), &[2, 1, 2, 2]);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "a temporary file was left behind");
    // a completed save replaces it
    b.save(&p).unwrap();
    let y = GraphModule::load(&p).unwrap().forward_values(&[Value::Tensor(x4())]).unwrap();
    assert_eq!(y[0].as_tensor().unwrap().shape(), &[3, 1, 2, 2]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The compute limit's default (10^13 FLOPs) refuses a pooling window no model has, before
/// any kernel runs, and admits the same module on a window it can afford.
#[test]
fn the_default_compute_limit_refuses_a_huge_window() {
    let gm = GraphModule::from_bytes(&leaf_file(max_pool_spec(1 << 20, 1 << 19))).unwrap();
    assert_eq!(gm.max_flops(), ferrofx_fx::DEFAULT_MAX_FLOPS);
    let x = Tensor::from_vec(vec![1.0f32; 64 * 64], &[1, 1, 64, 64]).unwrap();
    let t = std::time::Instant::now();
    let e = gm.forward_values(&[Value::Tensor(x)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Limit);
    let text = e.to_string();
    assert!(text.contains("node 'layer'") && text.contains("compute limit of 10000000000000 FLOPs"), "{text}");
    assert!(text.contains("--max-flops"), "{text}");
    assert!(t.elapsed().as_secs() < 5, "refused only after {:?}", t.elapsed());
    // a 3 x 3 window is cheap, and the FLOPs are reported
    let gm = GraphModule::from_bytes(&leaf_file(max_pool_spec(3, 1))).unwrap();
    let x = Tensor::from_vec(vec![1.0f32; 64 * 64], &[1, 1, 64, 64]).unwrap();
    let peak = gm.peak_memory(&[Value::Tensor(x.clone())]).unwrap();
    assert_eq!(peak.flops, 64 * 64 * 9);
    gm.forward_values(&[Value::Tensor(x)]).unwrap();
}

/// Legal but pathological attributes (a dilation and a padding of 2^14 around a 32 x 32
/// output) run with work and memory that follow the output: the convolution does not build a
/// padded 32k x 32k plane (12 GiB) to compute 1024 values.
#[test]
fn pathological_conv_geometry_runs_small() {
    let d = 1 << 14;
    let spec = ModuleSpec::new("Conv2d")
        .with("in_channels", Attr::Int(1))
        .with("out_channels", Attr::Int(1))
        .with("kernel_size", Attr::Ints(vec![3, 3]))
        .with("stride", Attr::Ints(vec![1, 1]))
        .with("padding", Attr::Ints(vec![d, d]))
        .with("dilation", Attr::Ints(vec![d, d]))
        .with("groups", Attr::Int(1))
        .with("bias", Attr::Bool(false));
    let m = ferrofx_nn::spec::build_builtin(&spec, &mut |n: &str| {
        (n == "weight").then(|| Tensor::from_vec(vec![1.0f32; 9], &[1, 1, 3, 3]).unwrap())
    })
    .unwrap();
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.call_module("layer", vec![x.into()]).unwrap();
    g.output(y.into()).unwrap();
    let gm = GraphModule::from_bytes(&file(&g, &[("layer", spec, m.as_ref())], &[])).unwrap();
    gm.set_max_memory(Some(LIMIT));
    gm.set_max_flops(Some(FLOPS));
    let x: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let t = std::time::Instant::now();
    let y = gm.forward_values(&[Value::Tensor(Tensor::from_vec(x.clone(), &[1, 1, 32, 32]).unwrap())]).unwrap();
    assert!(t.elapsed().as_secs() < 10, "took {:?}", t.elapsed());
    // only the centre tap of each dilated window lands inside the input: y = x
    assert_eq!(y[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), x);
}
