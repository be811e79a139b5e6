//! The ops issue 2 requires are all registered, and each has at least one PyTorch golden case.

use ferrofx_core::op;
use safetensors::SafeTensors;
use std::collections::BTreeSet;

/// Registry names of the ops the foundation must cover (PyTorch's names; `max.dim` etc. are the
/// dim overloads that return values and indices).
const REQUIRED: &[&str] = &[
    // unary
    "neg",
    "abs",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "silu",
    "leaky_relu",
    "elu",
    "selu",
    "softplus",
    "softsign",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "clamp",
    "reciprocal",
    "sign",
    "floor",
    "ceil",
    "round",
    "erf",
    // binary, comparison, logical
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "remainder",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_not",
    "logical_xor",
    "where",
    // reductions
    "sum",
    "mean",
    "prod",
    "max",
    "min",
    "max.dim",
    "min.dim",
    "argmax",
    "argmin",
    "var",
    "std",
    "logsumexp",
    "all",
    "any",
    "norm",
    "softmax",
    "log_softmax",
    // linear algebra and nn
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "linear",
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "max_pool1d",
    "max_pool2d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "batch_norm",
    "layer_norm",
    "group_norm",
    "embedding",
    "dropout",
    // joining and indexing
    "cat",
    "stack",
    "split",
    "chunk",
    "gather",
    "scatter",
    "index_select",
    "masked_fill",
    "pad",
    // creation
    "arange",
    "zeros",
    "ones",
    "full",
    "eye",
    "linspace",
    "zeros_like",
    "ones_like",
    "full_like",
    // misc
    "cumsum",
    "topk",
    "sort",
    "one_hot",
    "pixel_shuffle",
    // random
    "rand",
    "randn",
    "randint",
    "bernoulli",
    // views
    "view",
    "reshape",
    "transpose",
    "permute",
    "narrow",
    "select",
    "slice",
    "expand",
    "squeeze",
    "unsqueeze",
    "flatten",
    "contiguous",
];

fn golden_ops() -> BTreeSet<String> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
    let mut ops = BTreeSet::new();
    for e in std::fs::read_dir(dir).expect("tests/data").flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !(name.starts_with("golden_") && name.ends_with(".safetensors")) {
            continue;
        }
        let bytes = std::fs::read(e.path()).expect("read");
        let (_, meta) = SafeTensors::read_metadata(&bytes).expect("metadata");
        // Only op goldens (they carry a `family`) count; gradient and nn goldens are other runners'.
        if meta.metadata().as_ref().and_then(|m| m.get("family")).is_none() {
            continue;
        }
        let Some(cases) = meta.metadata().as_ref().and_then(|m| m.get("cases").cloned()) else { continue };
        let cases: Vec<serde_json::Value> = serde_json::from_str(&cases).expect("json");
        for c in cases {
            if let Some(op) = c["op"].as_str() {
                ops.insert(op.to_string());
            }
        }
    }
    ops
}

#[test]
fn every_required_op_is_registered_and_has_goldens() {
    let missing: Vec<_> = REQUIRED.iter().filter(|n| op::lookup(n).is_none()).collect();
    assert!(missing.is_empty(), "ops not registered: {missing:?}");
    let golden = golden_ops();
    let untested: Vec<_> = REQUIRED.iter().filter(|n| !golden.contains(**n)).collect();
    assert!(untested.is_empty(), "ops without a PyTorch golden case: {untested:?}");
}

#[test]
fn every_registered_op_has_a_consistent_definition() {
    for o in op::all_ops() {
        assert!(!o.doc.is_empty(), "{} has no doc line", o.name);
        let mut names = BTreeSet::new();
        for a in o.schema {
            assert!(names.insert(a.name), "{}: duplicate argument {}", o.name, a.name);
        }
        if let Some(i) = o.mutated_arg() {
            assert!(i < o.schema.len(), "{}: mutated argument {i} outside the schema", o.name);
        }
    }
}
