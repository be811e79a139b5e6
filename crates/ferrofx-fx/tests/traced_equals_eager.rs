//! Acceptance 1: traced equals eager, outputs and gradients, for every built-in module and
//! every zoo model (reduced sizes; full-size ResNet-18/50 forward once).

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{DType, Tensor, Value};
use ferrofx_fx::{symbolic_trace, trace_with_inputs, GraphModule, Opcode};
use ferrofx_nn::zoo::{DigitsCnn, Mlp, MobileNetV2, ResNet, TransformerClassifier};
use ferrofx_nn::*;

/// The tests share the global random generator (dropout, init): run them one at a time.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|p| p.into_inner())
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0, f64::max)
}

fn outputs_loss(outs: &[Value]) -> Option<Tensor> {
    let mut loss: Option<Tensor> = None;
    for (i, v) in outs.iter().enumerate() {
        if let Value::Tensor(t) = v {
            if t.dtype().is_floating_point() {
                // Weight outputs differently so every output's gradient matters.
                let term = (t.sum().unwrap() * (i as f64 + 1.0)).unwrap();
                loss = Some(match loss {
                    None => term,
                    Some(l) => (&l + &term).unwrap(),
                });
            }
        }
    }
    loss
}

/// Runs eager and traced, compares outputs, then gradients of every parameter and float input.
fn check(name: &str, m: &dyn Module, gm: &GraphModule, inputs: &[Value], seed: u64) {
    let prep = |inputs: &[Value]| -> Vec<Value> {
        inputs
            .iter()
            .map(|v| match v {
                Value::Tensor(t) if t.dtype().is_floating_point() => {
                    Value::Tensor(t.detach().requires_grad_(true).unwrap())
                }
                other => other.clone(),
            })
            .collect()
    };
    let run = |module: &dyn Module| -> (Vec<Value>, Vec<Option<Tensor>>, Vec<Option<Tensor>>) {
        m.zero_grad();
        let ins = prep(inputs);
        manual_seed(seed);
        let outs = module.forward_values(&ins).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(loss) = outputs_loss(&outs) {
            loss.backward(None, false, false).unwrap_or_else(|e| panic!("{name}: backward: {e}"));
        }
        let pg = m.parameters().iter().map(|p| p.grad()).collect();
        let ig = ins.iter().map(|v| v.as_tensor().and_then(|t| t.grad())).collect();
        (outs, pg, ig)
    };
    let (eo, epg, eig) = run(m);
    let (go, gpg, gig) = run(gm);
    assert_eq!(eo.len(), go.len(), "{name}: number of outputs");
    for (i, (e, g)) in eo.iter().zip(&go).enumerate() {
        match (e, g) {
            (Value::Tensor(e), Value::Tensor(g)) => {
                assert_eq!(e.shape(), g.shape(), "{name}: output {i} shape");
                let d = max_rel_diff(e, g);
                assert!(d < 1e-5, "{name}: output {i} differs by {d}");
            }
            (Value::None, Value::None) => {}
            other => panic!("{name}: output {i}: {other:?}"),
        }
    }
    let mut n_grads = 0;
    for (i, (e, g)) in epg.iter().zip(&gpg).chain(eig.iter().zip(&gig)).enumerate() {
        match (e, g) {
            (Some(e), Some(g)) => {
                let d = max_rel_diff(e, g);
                assert!(d < 1e-5, "{name}: gradient {i} differs by {d}");
                n_grads += 1;
            }
            (None, None) => {}
            (e, g) => panic!("{name}: gradient {i}: eager {:?} traced {:?}", e.is_some(), g.is_some()),
        }
    }
    let expect_grads = outputs_loss(&eo).is_some();
    assert!(!expect_grads || n_grads > 0, "{name}: no gradient compared");
}

fn rn(shape: &[i64]) -> Value {
    Value::Tensor(randn(shape, None).unwrap())
}

/// Each built-in traced through (as the root) with example inputs, and as a leaf inside a
/// Sequential traced symbolically.
#[test]
fn every_builtin_module() {
    let _serial = serial();
    manual_seed(1);
    let conv_o = Conv2dOpts { padding: 1, ..Default::default() };
    let cases: Vec<(&str, Box<dyn Module>, Vec<Value>)> = vec![
        ("Linear", Box::new(Linear::new(4, 3, true).unwrap()), vec![rn(&[2, 4])]),
        ("Bilinear", Box::new(Bilinear::new(3, 4, 2, true).unwrap()), vec![rn(&[2, 3]), rn(&[2, 4])]),
        ("Identity", Box::new(Identity::new()), vec![rn(&[2, 3])]),
        ("Flatten", Box::new(Flatten::new(1, -1)), vec![rn(&[2, 3, 4])]),
        ("Conv1d", Box::new(Conv1d::new(2, 3, 3, conv_o).unwrap()), vec![rn(&[1, 2, 8])]),
        ("Conv2d", Box::new(Conv2d::with(2, 4, 3, conv_o).unwrap()), vec![rn(&[1, 2, 6, 6])]),
        (
            "ConvTranspose2d",
            Box::new(ConvTranspose2d::new(2, 3, 3, Conv2dOpts { stride: 2, ..Default::default() }, 1).unwrap()),
            vec![rn(&[1, 2, 4, 4])],
        ),
        (
            "Embedding",
            Box::new(Embedding::new(10, 4, None).unwrap()),
            vec![Value::Tensor(Tensor::from_vec(vec![1i64, 3, 5, 7, 9, 0], &[2, 3]).unwrap())],
        ),
        ("BatchNorm1d", Box::new(BatchNorm::new_1d(4).unwrap()), vec![rn(&[3, 4])]),
        ("BatchNorm2d", Box::new(BatchNorm::new_2d(3).unwrap()), vec![rn(&[2, 3, 4, 4])]),
        ("LayerNorm", Box::new(LayerNorm::new(&[4]).unwrap()), vec![rn(&[2, 3, 4])]),
        ("GroupNorm", Box::new(GroupNorm::new(2, 4).unwrap()), vec![rn(&[2, 4, 3, 3])]),
        ("MaxPool2d", Box::new(MaxPool2d::new(2)), vec![rn(&[1, 2, 4, 4])]),
        ("AvgPool2d", Box::new(AvgPool2d::new(2)), vec![rn(&[1, 2, 4, 4])]),
        ("AdaptiveAvgPool2d", Box::new(AdaptiveAvgPool2d::new(1, 1)), vec![rn(&[1, 2, 4, 4])]),
        ("ReLU", Box::new(ReLU::new()), vec![rn(&[2, 5])]),
        ("SiLU", Box::new(SiLU::new()), vec![rn(&[2, 5])]),
        ("Sigmoid", Box::new(Sigmoid::new()), vec![rn(&[2, 5])]),
        ("Tanh", Box::new(Tanh::new()), vec![rn(&[2, 5])]),
        ("Hardswish", Box::new(Hardswish::new()), vec![rn(&[2, 5])]),
        ("GELU", Box::new(GELU::new("tanh").unwrap()), vec![rn(&[2, 5])]),
        ("LeakyReLU", Box::new(LeakyReLU::new(0.1)), vec![rn(&[2, 5])]),
        ("ELU", Box::new(ELU::new(1.0)), vec![rn(&[2, 5])]),
        ("Softmax", Box::new(Softmax::new(1)), vec![rn(&[2, 5])]),
        ("LogSoftmax", Box::new(LogSoftmax::new(1)), vec![rn(&[2, 5])]),
        ("Dropout", Box::new(Dropout::new(0.5).unwrap()), vec![rn(&[4, 5])]),
        (
            "MultiheadAttention",
            Box::new(MultiheadAttention::new(8, 2, 0.0, true, true).unwrap()),
            vec![rn(&[2, 3, 8]), rn(&[2, 4, 8]), rn(&[2, 4, 8])],
        ),
        (
            "TransformerEncoderLayer",
            Box::new(TransformerEncoderLayer::new(8, 2, 16, 0.0, "relu", true, false).unwrap()),
            vec![rn(&[2, 3, 8])],
        ),
        ("LSTM", Box::new(LSTM::new(4, 5, 2, true, false).unwrap()), vec![rn(&[3, 2, 4])]),
    ];
    for (name, m, inputs) in cases {
        assert!(m.is_builtin_leaf(), "{name} should be a built-in leaf");
        let gm = trace_with_inputs(&*m, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            gm.graph().iter().all(|n| n.meta().tensor_meta.is_some()
                || n.users().any(|u| ferrofx_fx::tracer::is_getitem(gm.graph(), u))
                || matches!(n.op(), Opcode::Output)),
            "{name}: every node has tensor_meta"
        );
        check(name, &*m, &gm, &inputs, 7);
        // As a leaf: one call_module node, and the same results (with example inputs, so the
        // tracer learns how many outputs the leaf returns: LSTM's forward_values gives three).
        if inputs.len() == 1 {
            let mut seq = Sequential::new();
            seq.push_boxed(m);
            let leaf_gm = trace_with_inputs(&seq, &inputs).unwrap_or_else(|e| panic!("{name} as a leaf: {e}"));
            let kinds: Vec<String> =
                leaf_gm.graph().iter().filter(|n| n.target().name() != "getitem").map(|n| n.op().to_string()).collect();
            assert_eq!(kinds, ["placeholder", "call_module", "output"], "{name}");
            check(name, &seq, &leaf_gm, &inputs, 7);
        }
    }
}

#[test]
fn builtin_modules_in_eval_mode() {
    let _serial = serial();
    manual_seed(2);
    let mut bn = BatchNorm::new_2d(3).unwrap();
    let x = rn(&[2, 3, 4, 4]);
    bn.forward_values(std::slice::from_ref(&x)).unwrap(); // move the running statistics
    bn.eval();
    let gm = trace_with_inputs(&bn, std::slice::from_ref(&x)).unwrap();
    check("BatchNorm2d eval", &bn, &gm, &[x], 3);
    let mut d = Dropout::new(0.5).unwrap();
    d.eval();
    let x = rn(&[3, 3]);
    let gm = symbolic_trace(&d).unwrap();
    check("Dropout eval", &d, &gm, &[x], 3);
}

#[test]
fn zoo_mlp_and_digits_cnn() {
    let _serial = serial();
    manual_seed(3);
    let mlp = Mlp::new(64, &[32, 16], 10).unwrap();
    let x = rn(&[5, 64]);
    let gm = trace_with_inputs(&mlp, std::slice::from_ref(&x)).unwrap();
    check("MLP", &mlp, &gm, &[x], 1);
    let cnn = DigitsCnn::new().unwrap();
    let gm = symbolic_trace(&cnn).unwrap();
    assert_eq!(
        gm.graph().iter().filter(|n| n.op() == Opcode::CallModule).count(),
        8,
        "conv1 bn1 conv2 bn2 pool fc1 dropout fc2"
    );
    let x = rn(&[4, 1, 8, 8]);
    check("DigitsCnn", &cnn, &gm, &[x], 5);
}

#[test]
fn zoo_resnets_and_mobilenet_reduced() {
    let _serial = serial();
    manual_seed(4);
    let r18 = ResNet::build(false, [1, 1, 1, 1], [8, 16, 32, 64], 10).unwrap();
    let gm = symbolic_trace(&r18).unwrap();
    check("ResNet(basic, reduced)", &r18, &gm, &[rn(&[2, 3, 32, 32])], 1);
    let r50 = ResNet::build(true, [1, 1, 1, 1], [8, 16, 32, 64], 10).unwrap();
    let gm = symbolic_trace(&r50).unwrap();
    check("ResNet(bottleneck, reduced)", &r50, &gm, &[rn(&[2, 3, 32, 32])], 1);
    let mb = MobileNetV2::new(10, 0.25).unwrap();
    let x = rn(&[2, 3, 32, 32]);
    let gm = trace_with_inputs(&mb, std::slice::from_ref(&x)).unwrap();
    check("MobileNetV2(0.25)", &mb, &gm, &[x], 1);
}

#[test]
fn zoo_transformer_encoder() {
    let _serial = serial();
    manual_seed(5);
    let t = TransformerClassifier::new(20, 16, 2, 32, 2, 12, 4, 0.0).unwrap();
    let ids = Value::Tensor(Tensor::from_vec((0..14).map(|i| i % 20).collect::<Vec<i64>>(), &[2, 7]).unwrap());
    let gm = trace_with_inputs(&t, std::slice::from_ref(&ids)).unwrap();
    // The positional table is sliced inside forward: recorded as get_attr + narrow (not frozen),
    // so it receives its gradient.
    let text = gm.graph().to_string();
    assert!(text.contains("get_attr[target=pos]"), "{text}");
    check("TransformerClassifier", &t, &gm, &[ids], 1);
}

#[test]
fn zoo_full_size_resnets_forward_once() {
    let _serial = serial();
    manual_seed(6);
    for (name, mut m) in [("resnet18", ResNet::resnet18(1000).unwrap()), ("resnet50", ResNet::resnet50(1000).unwrap())]
    {
        m.eval();
        let gm = symbolic_trace(&m).unwrap();
        let x = randn(&[1, 3, 224, 224], None).unwrap();
        let e = no_grad_forward(&m, &x);
        let g = no_grad_forward(&gm, &x);
        let d = max_rel_diff(&e, &g);
        assert!(d < 1e-5, "{name}: {d}");
        assert_eq!(g.shape(), &[1, 1000]);
        assert_eq!(g.dtype(), DType::F32);
    }
}

fn no_grad_forward(m: &dyn Module, x: &Tensor) -> Tensor {
    let _g = ferrofx_core::autograd::no_grad();
    m.forward(x).unwrap()
}
