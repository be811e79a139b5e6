//! Dynamic dimensions and control flow: a model exported with a dynamic batch runs at several
//! batch sizes through [`OnnxModel`] (specialised at the first run of each shape) and matches
//! the source module; `If` on an input-dependent condition, `Loop` and `Scan` are refused by
//! name.

use ferrofx_core::{Tensor, Value};
use ferrofx_nn::Module;
use ferrofx_onnx::builder::*;
use ferrofx_onnx::proto::{GraphProto, TensorProto};
use ferrofx_onnx::{export, import_model, ExportOptions, ImportOptions, ModelFile, OnnxModel};
use prost::Message;

const FLOAT: i32 = 1;
const BOOL: i32 = 9;

fn input(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i as u64 * 2654435761 + seed) % 1000) as f32) / 500.0 - 1.0).collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn dynamic_batch_export_runs_at_two_batch_sizes() {
    // conv -> relu -> flatten -> linear: the flatten is a reshape whose batch size the
    // exporter writes as -1 with dynamic_batch
    let net = ferrofx_nn::Sequential::new()
        .append(ferrofx_nn::Conv2d::new(2, 3, 3).unwrap())
        .append(ferrofx_nn::ReLU::new())
        .append(ferrofx_nn::Flatten::new(1, -1))
        .append(ferrofx_nn::Linear::new(3 * 4 * 4, 5, true).unwrap());
    let gm = ferrofx_fx::trace_with_inputs(&net, &[Value::Tensor(input(&[2, 2, 6, 6], 1))]).unwrap();
    let onnx =
        export(&gm, &[input(&[2, 2, 6, 6], 1)], &ExportOptions { dynamic_batch: true, ..Default::default() }).unwrap();
    let file = ModelFile::from_bytes(&onnx.encode_to_vec()).unwrap();
    let model = OnnxModel::new(file.clone(), ImportOptions::default()).unwrap();
    assert_eq!(model.inputs()[0].shape, vec![None, Some(2), Some(6), Some(6)]);
    for batch in [3, 1, 3] {
        let x = input(&[batch, 2, 6, 6], batch as u64);
        close(&model.forward(&x).unwrap(), &net.forward(&x).unwrap());
    }
    // one specialisation per batch size, reused
    assert_eq!(model.specialisations(), vec![vec![vec![1, 2, 6, 6]], vec![vec![3, 2, 6, 6]]]);
    // a size the file fixes is refused with both shapes
    let e = model.forward(&input(&[3, 2, 7, 6], 0)).unwrap_err().to_string();
    assert!(e.contains("[3, 2, 7, 6]") && e.contains("[None, 2, 6, 6]"), "{e}");
    // the plain import specialises to the given size
    let mut opts = ImportOptions::default();
    opts.input_shapes.insert(model.inputs()[0].name.clone(), vec![4, 2, 6, 6]);
    let imported = import_model(&file, &opts).unwrap();
    let x = input(&[4, 2, 6, 6], 9);
    let out = imported.module.forward_values(&[Value::Tensor(x.clone())]).unwrap();
    let Value::Tensor(out) = &out[0] else { panic!("not a tensor") };
    close(out, &net.forward(&x).unwrap());
}

fn branch(name: &str, op: &str) -> GraphProto {
    GraphProto {
        name: Some(name.into()),
        node: vec![node(op, op, &["x"], &[&format!("{name}_out")], vec![])],
        output: vec![value_info(&format!("{name}_out"), FLOAT, &[Some(3)], "")],
        ..Default::default()
    }
}

fn control_model(op: &str) -> ModelFile {
    let mut inputs = vec![value_info("x", FLOAT, &[Some(3)], "")];
    let node = match op {
        "If" => {
            inputs.push(value_info("cond", BOOL, &[], ""));
            node(
                "If",
                "branch",
                &["cond"],
                &["y"],
                vec![
                    attr_graph("then_branch", branch("then", "Neg")),
                    attr_graph("else_branch", branch("else", "Abs")),
                ],
            )
        }
        "Loop" => node("Loop", "loop", &["", "", "x"], &["y"], vec![attr_graph("body", branch("body", "Neg"))]),
        _ => node(
            "Scan",
            "scan",
            &["x"],
            &["y"],
            vec![attr_graph("body", branch("body", "Neg")), attr_int("num_scan_inputs", 1)],
        ),
    };
    let g = GraphProto {
        name: Some("g".into()),
        node: vec![node],
        input: inputs,
        output: vec![value_info("y", FLOAT, &[Some(3)], "")],
        initializer: Vec::<TensorProto>::new(),
        ..Default::default()
    };
    ModelFile::from_bytes(&model(g, 18).encode_to_vec()).unwrap()
}

#[test]
fn control_flow_works_or_is_refused_by_name() {
    // If on a condition known at import runs its branch inline
    let file = control_model("If");
    let mut opts = ImportOptions::default();
    opts.constants.insert("cond".into(), Tensor::from_vec(vec![true], &[]).unwrap());
    let m = import_model(&file, &opts).unwrap();
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3]).unwrap();
    let Value::Tensor(y) = &m.module.forward_values(&[Value::Tensor(x.clone())]).unwrap()[0] else { panic!() };
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, 2.0, -3.0]);
    // ... and is refused by name when the condition is a runtime value
    let e = import_model(&file, &ImportOptions::default()).err().expect("refused").to_string();
    assert!(e.contains("node `branch` (If)") && e.contains("condition depends on a graph input"), "{e}");
    for op in ["Loop", "Scan"] {
        let e = import_model(&control_model(op), &ImportOptions::default()).err().expect("refused").to_string();
        assert!(e.contains(&format!("op `{op}`")) && e.contains("loops are not supported"), "{e}");
    }
}
