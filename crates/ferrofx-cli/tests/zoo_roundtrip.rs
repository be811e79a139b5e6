//! Issue 7, acceptance 2: every zoo model is traced and saved here, then loaded and run by a
//! *separate program* — the `ferrofx run` binary, whose code never names a zoo model — and gives
//! bit-identical outputs. A graph edit (relu → gelu) survives the trip as well.

use assert_cmd::Command;
use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{DType, Tensor, Value};
use ferrofx_fx::passes::replace_pattern;
use ferrofx_fx::{symbolic_trace, trace_with_inputs, Graph, GraphModule, Target};
use ferrofx_nn::zoo::{DigitsCnn, Mlp, MobileNetV2, ResNet, TransformerClassifier};
use ferrofx_nn::{load_state_dict_file, save_state_dict, Module, StateDict};
use std::path::Path;

/// Saves `gm`, runs the saved file on `inputs` in a separate `ferrofx run` process and returns
/// the outputs it wrote.
fn run_in_other_process(dir: &Path, name: &str, gm: &GraphModule, inputs: &[Tensor]) -> Vec<Tensor> {
    let file = dir.join(format!("{name}.fxm"));
    let input_file = dir.join(format!("{name}_in.safetensors"));
    let output_file = dir.join(format!("{name}_out.safetensors"));
    gm.save(&file).unwrap_or_else(|e| panic!("{name}: save: {e}"));
    let mut sd = StateDict::new();
    for (i, t) in inputs.iter().enumerate() {
        sd.insert(format!("input{i}"), t.clone());
    }
    save_state_dict(&sd, &input_file).unwrap();
    Command::cargo_bin("ferrofx")
        .unwrap()
        .arg("run")
        .arg(&file)
        .arg("--input")
        .arg(&input_file)
        .arg("--out")
        .arg(&output_file)
        .assert()
        .success();
    let outs = load_state_dict_file(&output_file).unwrap();
    (0..outs.len()).map(|i| outs[&format!("output{i}")].clone()).collect()
}

/// Runs `gm` in this process (no autograd, as `ferrofx run` does).
fn run_here(gm: &GraphModule, inputs: &[Tensor]) -> Vec<Tensor> {
    let _g = ferrofx_core::autograd::no_grad();
    let values: Vec<Value> = inputs.iter().cloned().map(Value::Tensor).collect();
    gm.forward_values(&values)
        .unwrap()
        .into_iter()
        .map(|v| match v {
            Value::Tensor(t) => t,
            other => panic!("non-tensor output {other:?}"),
        })
        .collect()
}

fn eager(m: &dyn Module, x: &Tensor) -> Tensor {
    let _g = ferrofx_core::autograd::no_grad();
    m.forward(x).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The file's outputs are bit-identical to the in-process GraphModule's and equal to eager.
fn check(dir: &Path, name: &str, model: &dyn Module, gm: &GraphModule, x: Tensor) {
    let here = run_here(gm, std::slice::from_ref(&x));
    let there = run_in_other_process(dir, name, gm, std::slice::from_ref(&x));
    assert_eq!(here.len(), there.len(), "{name}: number of outputs");
    for (h, t) in here.iter().zip(&there) {
        assert_eq!(h.shape(), t.shape(), "{name}: output shape");
        assert_eq!(bits(h), bits(t), "{name}: outputs of the loaded file differ from the traced module");
    }
    let e = eager(model, &x);
    let d = max_abs_diff(&e, &there[0]);
    assert!(d < 1e-4, "{name}: loaded file vs eager model: max abs diff {d}");
}

#[test]
fn every_zoo_model_round_trips_through_a_program_without_its_code() {
    let dir = tempfile::tempdir().unwrap();
    manual_seed(11);

    let mlp = Mlp::new(64, &[32, 16], 10).unwrap();
    let x = randn(&[5, 64], None).unwrap();
    // Mlp's forward asks for x.ndim(): trace with an example input
    let gm = trace_with_inputs(&mlp, &[Value::Tensor(x.clone())]).unwrap();
    check(dir.path(), "mlp", &mlp, &gm, x);

    let mut cnn = DigitsCnn::new().unwrap();
    cnn.eval();
    let gm = symbolic_trace(&cnn).unwrap();
    check(dir.path(), "digits_cnn", &cnn, &gm, randn(&[4, 1, 8, 8], None).unwrap());

    for (name, mut m) in [("resnet18", ResNet::resnet18(1000).unwrap()), ("resnet50", ResNet::resnet50(1000).unwrap())]
    {
        m.eval();
        let gm = symbolic_trace(&m).unwrap();
        check(dir.path(), name, &m, &gm, randn(&[1, 3, 64, 64], None).unwrap());
    }

    let mut mb = MobileNetV2::new(1000, 1.0).unwrap();
    mb.eval();
    let x = randn(&[1, 3, 64, 64], None).unwrap();
    let gm = trace_with_inputs(&mb, &[Value::Tensor(x.clone())]).unwrap();
    check(dir.path(), "mobilenet_v2", &mb, &gm, x);

    let mut t = TransformerClassifier::new(20, 16, 2, 32, 2, 12, 4, 0.1).unwrap();
    t.eval();
    let ids = Tensor::from_vec((0..14).map(|i| (i * 7) % 20).collect::<Vec<i64>>(), &[2, 7]).unwrap();
    let gm = trace_with_inputs(&t, &[Value::Tensor(ids.clone())]).unwrap();
    check(dir.path(), "transformer", &t, &gm, ids);
}

#[test]
fn a_relu_to_gelu_edit_survives_save_and_load() {
    let dir = tempfile::tempdir().unwrap();
    manual_seed(12);
    let mut cnn = DigitsCnn::new().unwrap();
    cnn.eval();
    let mut gm = symbolic_trace(&cnn).unwrap();
    let unary = |op: &str| {
        let mut p = Graph::new();
        let x = p.placeholder("x").unwrap();
        let y = p.call_function(Target::named(op), vec![x.into()]).unwrap();
        p.output(y.into()).unwrap();
        p
    };
    let matches = replace_pattern(gm.graph_mut(), &unary("relu"), &unary("gelu")).unwrap();
    assert_eq!(matches.len(), 3, "the digits CNN calls relu three times");
    gm.recompile().unwrap();

    let x = randn(&[3, 1, 8, 8], None).unwrap();
    let edited = run_here(&gm, std::slice::from_ref(&x));
    let there = run_in_other_process(dir.path(), "gelu_cnn", &gm, std::slice::from_ref(&x));
    assert_eq!(bits(&edited[0]), bits(&there[0]), "the edited graph's outputs after save/load");
    let original = eager(&cnn, &x);
    assert!(max_abs_diff(&original, &there[0]) > 1e-6, "the edit must change the outputs");

    // and the loaded graph still says gelu, not relu
    let loaded = GraphModule::load(dir.path().join("gelu_cnn.fxm")).unwrap();
    let text = loaded.graph().to_string();
    assert_eq!(text.matches("call_function[target=gelu]").count(), 3, "{text}");
    assert!(!text.contains("target=relu]"), "{text}");
}
