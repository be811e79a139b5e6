//! Tracing and GraphModule: traced equals eager (outputs and gradients) on the zoo, the FX
//! overview example, seed 003's examples, the stale-code policy and bad input.

use ferrofx_core::ops::random::{manual_seed, randint, randn};
use ferrofx_core::{Tensor, Value};
use ferrofx_fx::{symbolic_trace, trace_with_inputs, GraphModule, Opcode, Target, Tracer};
use ferrofx_nn::optim::Optimizer;
use ferrofx_nn::zoo::{DigitsCnn, Mlp, MobileNetV2, ResNet, TransformerClassifier};
use ferrofx_nn::*;

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (x, y) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!((p - q).abs() <= 1e-5 + 1e-5 * q.abs(), "{what}[{i}]: traced {p} vs eager {q}");
    }
}

/// Forward and gradients of the traced module equal the eager model's.
fn traced_equals_eager(model: &mut dyn Module, x: &Tensor, symbolic: bool) {
    model.eval();
    let gm = if symbolic { symbolic_trace(model).unwrap() } else { trace_with_inputs(model, &[x.into()]).unwrap() };
    let eager = model.forward(x).unwrap();
    let traced = gm.forward(x).unwrap();
    close(&traced, &eager, "output");
    // gradients: the GraphModule shares the model's parameters
    model.zero_grad();
    eager.sum().unwrap().backward(None, false, false).unwrap();
    let want: Vec<(String, Tensor)> =
        model.named_parameters().into_iter().filter_map(|(n, p)| p.grad().map(|g| (n, g))).collect();
    model.zero_grad();
    gm.forward(x).unwrap().sum().unwrap().backward(None, false, false).unwrap();
    assert!(!want.is_empty());
    for (n, g) in &want {
        let p = model.get_tensor(n).unwrap();
        close(&p.grad().unwrap_or_else(|| panic!("no traced gradient for {n}")), g, n);
    }
    // the GraphModule's own parameter names are the model's
    let mut a: Vec<String> = gm.named_parameters().into_iter().map(|(n, _)| n).collect();
    let mut b: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
}

#[test]
fn zoo_models_trace_to_graph_modules_equal_to_eager() {
    manual_seed(0);
    // Mlp asks for the input's rank (a shape query): traceable with example inputs, as in FX
    traced_equals_eager(&mut Mlp::new(8, &[16, 16], 4).unwrap(), &randn(&[3, 8], None).unwrap(), false);
    let e = symbolic_trace(&Mlp::new(8, &[4], 2).unwrap()).err().unwrap().to_string();
    assert!(e.contains("TraceError: shape of a symbolic tensor was requested at") && e.contains("zoo/cnn.rs"), "{e}");
    traced_equals_eager(&mut DigitsCnn::new().unwrap(), &randn(&[2, 1, 8, 8], None).unwrap(), true);
    traced_equals_eager(&mut DigitsCnn::new().unwrap(), &randn(&[2, 1, 8, 8], None).unwrap(), false);
    traced_equals_eager(&mut ResNet::resnet18(10).unwrap(), &randn(&[1, 3, 32, 32], None).unwrap(), false);
    traced_equals_eager(&mut MobileNetV2::new(10, 0.25).unwrap(), &randn(&[1, 3, 32, 32], None).unwrap(), false);
    let mut tc = TransformerClassifier::new(20, 16, 2, 32, 2, 12, 3, 0.0).unwrap();
    let tokens = randint(0, 20, &[2, 12], None).unwrap();
    traced_equals_eager(&mut tc, &tokens, false);
}

#[test]
fn resnet50_traces() {
    manual_seed(1);
    let mut m = ResNet::resnet50(10).unwrap();
    traced_equals_eager(&mut m, &randn(&[1, 3, 32, 32], None).unwrap(), false);
    let gm = symbolic_trace(&m).unwrap();
    let bn = gm
        .graph()
        .iter()
        .filter(|n| {
            n.op() == Opcode::CallModule
                && gm.leaf_modules()[n.target().name()].spec().is_some_and(|s| s.type_name == "BatchNorm2d")
        })
        .count();
    assert_eq!(bn, 53, "ResNet-50 has 53 BatchNorm layers");
}

/// FX's overview example: a parameter, a Linear and clamp.
#[derive(Module)]
struct MyModule {
    param: Tensor,
    linear: Linear,
}

impl Module for MyModule {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let h = x + &self.param;
        self.linear.call(&h?)?.clamp(Some(0.0), Some(1.0))
    }
}

#[test]
fn fx_overview_example() {
    manual_seed(2);
    let m = MyModule {
        param: randn(&[3, 4], None).unwrap().requires_grad_(true).unwrap(),
        linear: Linear::new(4, 5, true).unwrap(),
    };
    let gm = symbolic_trace(&m).unwrap();
    let g = gm.graph();
    let ops: Vec<(Opcode, String)> = g.iter().map(|n| (n.op(), n.target().name().to_string())).collect();
    assert_eq!(
        ops,
        vec![
            (Opcode::Placeholder, "x".to_string()),
            (Opcode::GetAttr, "param".to_string()),
            (Opcode::CallFunction, "add".to_string()),
            (Opcode::CallModule, "linear".to_string()),
            (Opcode::CallMethod, "clamp".to_string()),
            (Opcode::Output, "output".to_string()),
        ],
        "{g}"
    );
    let printed = g.to_string();
    assert!(
        printed.contains("%add : [num_users=1] = call_function[target=add](args = (%x, %param), kwargs = {})"),
        "{printed}"
    );
    assert!(
        printed.contains("%linear : [num_users=1] = call_module[target=linear](args = (%add,), kwargs = {})"),
        "{printed}"
    );
    assert!(
        printed.contains("%clamp : [num_users=1] = call_method[target=clamp](args = (%linear, 0.0, 1.0), kwargs = {})"),
        "{printed}"
    );
    let code = gm.code().unwrap();
    assert!(code.contains("let add = add(x, param)?;  drop(x, param);"), "{code}");
    assert!(code.contains("let linear = self.linear(add)?;  drop(add);"), "{code}");
    assert!(code.contains("return clamp;"), "{code}");
    let x = randn(&[3, 4], None).unwrap();
    close(&gm.forward(&x).unwrap(), &m.forward(&x).unwrap(), "overview");
}

/// Seed 003's SimpleModel: linear then relu.
#[derive(Module)]
struct SimpleModel {
    linear: Linear,
}

impl Module for SimpleModel {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        functional::relu(&self.linear.call(x)?)
    }
}

#[test]
fn seed_003_simple_model_and_leaf_override() {
    let m = SimpleModel { linear: Linear::new(4, 3, true).unwrap() };
    let gm = symbolic_trace(&m).unwrap();
    let ops: Vec<(Opcode, String)> = gm.graph().iter().map(|n| (n.op(), n.target().name().to_string())).collect();
    assert_eq!(
        ops,
        vec![
            (Opcode::Placeholder, "x".into()),
            (Opcode::CallModule, "linear".into()),
            (Opcode::CallFunction, "relu".into()),
            (Opcode::Output, "output".into())
        ]
    );
    // is_leaf_module override: trace through Linear
    let gm =
        Tracer::new().is_leaf_module(|m, _| m.is_builtin_leaf() && m.type_name() != "Linear").trace(&m, 1).unwrap();
    let printed = gm.graph().to_string();
    assert!(printed.contains("get_attr[target=linear.weight]"), "{printed}");
    assert!(printed.contains("call_function[target=linear](args = (%x, %linear_weight, %linear_bias)"), "{printed}");
    assert!(!printed.contains("call_module"), "{printed}");
    let x = randn(&[2, 4], None).unwrap();
    close(&gm.forward(&x).unwrap(), &m.forward(&x).unwrap(), "traced through");
}

/// Control flow on a value: the trace error names where, and concrete_args fixes it.
#[derive(Module)]
struct Branchy {
    lin: Linear,
}

impl Module for Branchy {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        self.forward_values(&[x.into(), Value::Bool(true)])?
            .remove(0)
            .as_tensor()
            .cloned()
            .ok_or_else(|| ferrofx_core::Error::argument("Branchy", "no output"))
    }
    fn forward_values(&self, inputs: &[Value]) -> ferrofx_core::Result<Vec<Value>> {
        let x = inputs[0].as_tensor().cloned().ok_or_else(|| ferrofx_core::Error::argument("Branchy", "x"))?;
        let h = self.lin.call(&x)?;
        // data-dependent: the sum's value decides the branch
        let use_relu = match inputs.get(1) {
            Some(Value::Bool(b)) => *b,
            _ => h.sum()?.item()? > 0.0,
        };
        Ok(vec![if use_relu { functional::relu(&h)? } else { h.neg()? }.into()])
    }
}

#[test]
fn control_flow_gives_trace_error_and_concrete_args_specialise() {
    let m = Branchy { lin: Linear::new(3, 3, true).unwrap() };
    let e = Tracer::new().trace(&m, 2).err().expect("data-dependent control flow must fail").to_string();
    assert!(e.contains("item()") || e.contains("symbolic"), "{e}");
    assert!(e.contains("concrete_arg") || e.contains("concrete_args"), "{e}");
    let gm = Tracer::new().concrete_arg(1, Value::Bool(false)).trace(&m, 2).unwrap();
    let printed = gm.graph().to_string();
    assert!(printed.contains("target=neg") && !printed.contains("relu"), "{printed}");
}

#[test]
fn edits_recompile_before_running_and_bad_edits_are_errors() {
    let m = SimpleModel { linear: Linear::new(4, 3, true).unwrap() };
    let mut gm = symbolic_trace(&m).unwrap();
    let x = randn(&[2, 4], None).unwrap();
    let relu = gm.graph().iter().find(|n| n.target().name() == "relu").unwrap().id();
    gm.graph_mut().set_target(relu, Target::named("neg")).unwrap();
    let want = m.linear.forward(&x).unwrap().neg().unwrap();
    close(&gm.forward(&x).unwrap(), &want, "after edit");
    assert!(gm.code().unwrap().contains("neg(linear)"));
    // a call_module of a missing submodule: the next run says which node and target
    let lin = gm.graph().iter().find(|n| n.op() == Opcode::CallModule).unwrap().id();
    assert!(gm.delete_submodule("linear"));
    let e = gm.forward(&x).unwrap_err().to_string();
    assert!(e.contains("call_module target 'linear' is not a submodule"), "{e}");
    let _ = lin;
    // wrong number of inputs
    let gm = symbolic_trace(&m).unwrap();
    let e = gm.forward_values(&[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs, got 0"), "{e}");
}

#[test]
fn traced_module_trains_like_eager() {
    manual_seed(5);
    let mut a = Mlp::new(4, &[8], 2).unwrap();
    let x = randn(&[6, 4], None).unwrap();
    let y = Tensor::from_vec(vec![0i64, 1, 0, 1, 1, 0], &[6]).unwrap();
    a.train(true);
    let gm = trace_with_inputs(&a, &[(&x).into()]).unwrap();
    let mut opt = optim::Sgd::new(gm.parameters(), 0.1, 0.0, 0.0, 0.0, false).unwrap();
    let mut losses = vec![];
    for _ in 0..5 {
        let loss = loss::cross_entropy(&gm.forward(&x).unwrap(), &y, &loss::CeOpts::default()).unwrap();
        opt.zero_grad();
        loss.backward(None, false, false).unwrap();
        opt.step().unwrap();
        losses.push(loss.item().unwrap());
    }
    assert!(losses[4] < losses[0], "{losses:?}");
    // the model shares the trained parameters
    close(&a.forward(&x).unwrap(), &gm.forward(&x).unwrap(), "shared parameters");
}

#[test]
fn save_and_load_round_trip() {
    manual_seed(6);
    let mut m = DigitsCnn::new().unwrap();
    m.eval();
    let x = randn(&[3, 1, 8, 8], None).unwrap();
    let gm = trace_with_inputs(&m, &[(&x).into()]).unwrap();
    let bytes = gm.to_bytes().unwrap();
    let back = GraphModule::from_bytes(&bytes).unwrap();
    assert_eq!(back.graph().to_string(), gm.graph().to_string());
    close(&back.forward(&x).unwrap(), &m.forward(&x).unwrap(), "reloaded");
    let mut sd_a: Vec<String> = back.state_dict().keys().cloned().collect();
    let mut sd_b: Vec<String> = m.state_dict().keys().cloned().collect();
    sd_a.sort();
    sd_b.sort();
    assert_eq!(sd_a, sd_b);
}

/// A user module that can copy itself (`Module::clone_module`).
#[derive(Module, Clone)]
struct Doubler {
    lin: Linear,
}

impl Module for Doubler {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let h = self.lin.call(x)?;
        h.add(&h)
    }
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
}

/// A user module without `clone_module`.
#[derive(Module)]
struct Opaque {
    lin: Linear,
}

impl Module for Opaque {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        self.lin.call(x)?.relu()
    }
}

#[derive(Module)]
struct TwoUserModules {
    double: Doubler,
    opaque: Opaque,
}

impl Module for TwoUserModules {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        self.opaque.call(&self.double.call(x)?)
    }
}

/// User modules chosen as leaves: one that implements `clone_module` becomes a `call_module`
/// node held (sharing its weights) by the GraphModule; one that does not is a clear error.
#[test]
fn user_modules_can_be_leaves_when_they_can_copy_themselves() {
    manual_seed(3);
    let m = TwoUserModules {
        double: Doubler { lin: Linear::new(4, 4, true).unwrap() },
        opaque: Opaque { lin: Linear::new(4, 3, true).unwrap() },
    };
    let gm = Tracer::new().is_leaf_module(|m, path| m.is_builtin_leaf() || path == "double").trace(&m, 1).unwrap();
    let printed = gm.graph().to_string();
    assert!(printed.contains("call_module[target=double](args = (%x,), kwargs = {})"), "{printed}");
    assert!(printed.contains("call_module[target=opaque.lin]"), "{printed}");
    let x = randn(&[2, 4], None).unwrap();
    close(&gm.forward(&x).unwrap(), &m.forward(&x).unwrap(), "user leaf");
    // the leaf shares the model's weights: an in-place change shows in the GraphModule
    {
        let _g = ferrofx_core::autograd::no_grad();
        m.double.lin.weight.mul_(Value::Float(0.5)).unwrap();
    }
    close(&gm.forward(&x).unwrap(), &m.forward(&x).unwrap(), "after editing the weights");
    // a file is loaded without source code, so it cannot hold the user's module
    let file = std::env::temp_dir().join(format!("ferrofx_user_leaf_{}.fxm", std::process::id()));
    let msg = gm.save(&file).expect_err("a user leaf cannot be saved").to_string();
    assert!(msg.contains("module 'double' (Doubler) is a user module") && msg.contains("trace_module"), "{msg}");
    assert!(!file.exists());

    let err = Tracer::new()
        .is_leaf_module(|m, path| m.is_builtin_leaf() || path == "opaque")
        .trace(&m, 1)
        .err()
        .expect("an opaque user module cannot be a leaf");
    let msg = err.to_string();
    assert!(msg.contains("module 'opaque' (Opaque)") && msg.contains("Module::clone_module"), "{msg}");
}

/// A module whose own parameter is called `_tensor_constant0` (as in a model imported from a
/// file ferrofx exported) and which also uses a captured constant: the constant gets another
/// name instead of silently replacing the parameter.
#[derive(Module)]
#[allow(non_snake_case)]
struct ConstantNamedParam {
    _tensor_constant0: Tensor,
}

impl Module for ConstantNamedParam {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let c = Tensor::from_vec(vec![10.0f32, 20.0], &[2])?;
        (x + &self._tensor_constant0)? + &c
    }
}

#[test]
fn captured_constants_never_take_a_module_tensor_name() {
    let m = ConstantNamedParam { _tensor_constant0: Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap() };
    let x = Tensor::from_vec(vec![0.5f32, 0.5], &[2]).unwrap();
    let gm = trace_with_inputs(&m, &[(&x).into()]).unwrap();
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![11.5, 22.5]);
    let targets: Vec<String> =
        gm.graph().iter().filter(|n| n.op() == Opcode::GetAttr).map(|n| n.target().to_string()).collect();
    assert!(
        targets.contains(&"_tensor_constant0".to_string()) && targets.contains(&"_tensor_constant1".to_string()),
        "{targets:?}"
    );
}
