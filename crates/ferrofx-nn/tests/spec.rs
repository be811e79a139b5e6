//! Module specs: every built-in layer rebuilds from its spec and tensors alone, computing the
//! same outputs; bad specs and tensors give errors naming the module and the problem.

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Tensor, Value};
use ferrofx_nn::spec::{build_builtin, Attr, ModuleSpec};
use ferrofx_nn::*;
use std::collections::HashMap;

fn tensors(m: &dyn Module) -> HashMap<String, Tensor> {
    let mut all: HashMap<String, Tensor> = m.named_parameters().into_iter().collect();
    all.extend(m.named_buffers());
    all
}

fn rebuild(m: &dyn Module) -> Box<dyn Module> {
    let s = m.spec().unwrap_or_else(|| panic!("{} has no spec", m.type_name()));
    let t = tensors(m);
    let rebuilt = build_builtin(&s, &mut |name: &str| t.get(name).cloned()).expect("rebuild");
    assert_eq!(rebuilt.spec().as_ref(), Some(&s), "spec of the rebuilt {}", s.type_name);
    let mut got: Vec<_> = tensors(rebuilt.as_ref()).into_keys().collect();
    let mut want: Vec<_> = t.into_keys().collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "tensor names of the rebuilt {}", s.type_name);
    rebuilt
}

fn same(a: &[Value], b: &[Value]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_tensor().expect("tensor"), y.as_tensor().expect("tensor"));
        assert_eq!(x.shape(), y.shape());
        assert_eq!(x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
    }
}

fn check(mut m: Box<dyn Module>, inputs: Vec<Value>) {
    m.eval();
    let r = rebuild(m.as_ref());
    assert!(m.is_builtin_leaf() && r.is_builtin_leaf());
    same(&m.call_values(&inputs).unwrap(), &r.call_values(&inputs).unwrap());
}

#[test]
fn every_builtin_layer_round_trips_through_its_spec() {
    manual_seed(0);
    let x4 = || Value::from(randn(&[2, 4, 6, 6], None).unwrap());
    let x2 = || Value::from(randn(&[3, 4], None).unwrap());
    check(Box::new(ReLU::new()), vec![x2()]);
    check(Box::new(SiLU::new()), vec![x2()]);
    check(Box::new(Sigmoid::new()), vec![x2()]);
    check(Box::new(Tanh::new()), vec![x2()]);
    check(Box::new(Hardswish::new()), vec![x2()]);
    check(Box::new(ReLU6::new()), vec![x2()]);
    check(Box::new(GELU::new("tanh").unwrap()), vec![x2()]);
    check(Box::new(LeakyReLU::new(0.2)), vec![x2()]);
    check(Box::new(ELU::new(0.5)), vec![x2()]);
    check(Box::new(Softmax::new(1)), vec![x2()]);
    check(Box::new(LogSoftmax::new(-1)), vec![x2()]);
    check(Box::new(Dropout::new(0.3).unwrap()), vec![x2()]);
    check(Box::new(Identity::new()), vec![x2()]);
    check(Box::new(Flatten::new(1, -1)), vec![x4()]);
    check(Box::new(Linear::new(4, 3, true).unwrap()), vec![x2()]);
    check(Box::new(Linear::new(4, 3, false).unwrap()), vec![x2()]);
    check(Box::new(Bilinear::new(4, 4, 2, true).unwrap()), vec![x2(), Value::from(randn(&[3, 4], None).unwrap())]);
    let opts = Conv2dOpts { stride: 2, padding: 1, dilation: 1, groups: 2, bias: true };
    check(Box::new(Conv2d::with(4, 6, 3, opts).unwrap()), vec![x4()]);
    check(
        Box::new(Conv1d::new(4, 2, 3, Conv2dOpts::default()).unwrap()),
        vec![Value::from(randn(&[2, 4, 9], None).unwrap())],
    );
    check(Box::new(ConvTranspose2d::new(4, 2, 3, opts, 1).unwrap()), vec![x4()]);
    check(Box::new(BatchNorm::new_2d(4).unwrap()), vec![x4()]);
    check(Box::new(BatchNorm::with_1d(4, 1e-3, None, false, true).unwrap()), vec![x2()]);
    check(Box::new(LayerNorm::new(&[6, 6]).unwrap()), vec![x4()]);
    check(Box::new(GroupNorm::new(2, 4).unwrap()), vec![x4()]);
    check(Box::new(MaxPool2d::with(3, 2, 1)), vec![x4()]);
    check(Box::new(AvgPool2d::with(2, 2, 0)), vec![x4()]);
    check(Box::new(AdaptiveAvgPool2d::new(1, 1)), vec![x4()]);
    let idx = Tensor::from_vec(vec![0i64, 3, 1, 4], &[2, 2]).unwrap();
    check(Box::new(Embedding::new(5, 3, Some(1)).unwrap()), vec![Value::from(idx)]);
    let seq = || Value::from(randn(&[5, 2, 8], None).unwrap());
    check(Box::new(MultiheadAttention::new(8, 2, 0.0, true, false).unwrap()), vec![seq()]);
    check(Box::new(TransformerEncoderLayer::new(8, 2, 16, 0.1, "gelu", false, true).unwrap()), vec![seq()]);
    check(Box::new(LSTM::new(8, 4, 2, true, false).unwrap()), vec![seq()]);
}

#[test]
fn training_mode_is_part_of_the_spec() {
    let bn = BatchNorm::new_2d(3).unwrap();
    let t = tensors(&bn);
    let r = build_builtin(&bn.spec().unwrap(), &mut |n: &str| t.get(n).cloned()).unwrap();
    assert!(r.is_training());
    let mut d = Dropout::new(0.5).unwrap();
    d.eval();
    let r = build_builtin(&d.spec().unwrap(), &mut |_: &str| None).unwrap();
    assert!(!r.is_training());
}

#[test]
fn user_modules_and_containers_have_no_spec() {
    let seq = Sequential::new().append(ReLU::new());
    assert!(seq.spec().is_none());
    assert!(!seq.is_builtin_leaf());
}

fn err(s: &ModuleSpec, t: &HashMap<String, Tensor>) -> String {
    match build_builtin(s, &mut |n: &str| t.get(n).cloned()) {
        Ok(m) => panic!("{} built from a bad spec", m.type_name()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_specs_and_tensors_are_errors_naming_the_problem() {
    let lin = Linear::new(4, 3, true).unwrap();
    let good = lin.spec().unwrap();
    let t = tensors(&lin);
    let e = err(&ModuleSpec::new("os.system"), &t);
    assert!(e.contains("unknown module type 'os.system'"), "{e}");
    let e = err(&ModuleSpec::new("Linear"), &t);
    assert!(e.contains("Linear") && e.contains("no attribute 'in_features'"), "{e}");
    let e = err(&good.clone().with("in_features", Attr::Str("4".into())), &t);
    assert!(e.contains("attribute 'in_features' must be an integer"), "{e}");
    let e = err(&good.clone().with("in_features", Attr::Int(-1)), &t);
    assert!(e.contains("'in_features' = -1 is out of range"), "{e}");
    let e = err(&good.clone().with("in_features", Attr::Int(5)), &t);
    assert!(e.contains("tensor 'weight' has shape [3, 4], but the configuration implies [3, 5]"), "{e}");
    let mut missing = t.clone();
    missing.remove("bias");
    let e = err(&good, &missing);
    assert!(e.contains("missing tensor 'bias' (expected shape [3])"), "{e}");
    let conv = Conv2d::new(2, 4, 3).unwrap();
    let e = err(&conv.spec().unwrap().with("groups", Attr::Int(3)), &tensors(&conv));
    assert!(e.contains("in_channels must be divisible by groups"), "{e}");
    let e = err(&conv.spec().unwrap().with("stride", Attr::Ints(vec![0, 1])), &tensors(&conv));
    assert!(e.contains("'stride' = [0, 1] is out of range"), "{e}");
    let e = err(&ModuleSpec::new("Dropout").with("p", Attr::Float(2.0)).with("training", Attr::Bool(false)), &t);
    assert!(e.contains("dropout probability has to be between 0 and 1"), "{e}");
    let e = err(&ModuleSpec::new("LeakyReLU").with("negative_slope", Attr::Float(f64::NAN)), &t);
    assert!(e.contains("must be a finite float"), "{e}");
}
