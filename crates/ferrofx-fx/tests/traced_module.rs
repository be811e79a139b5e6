//! Seed 001 (MegEngine TracedModule) end to end: the expression view of the one graph IR,
//! interpret, module-preserving tracing and flatten, graph surgery that survives save/load.

use ferrofx_core::ops::creation::zeros;
use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{DType, Tensor, Value};
use ferrofx_fx::traced::{trace_module, ExprKind, ExprValue, ModuleTracer};
use ferrofx_fx::{symbolic_trace, Argument, GraphModule, Opcode, Target};
use ferrofx_nn::*;

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (x, y) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!((p - q).abs() <= 1e-5 + 1e-5 * q.abs(), "{what}[{i}]: {p} vs {q}");
    }
}

/// The seed's SimpleModule: a constant, relu, a parameter and a Linear.
#[derive(Module)]
struct SimpleModule {
    linear: Linear,
    param: Tensor,
}

impl SimpleModule {
    fn new() -> SimpleModule {
        SimpleModule {
            linear: Linear::new(4, 5, true).unwrap(),
            param: Tensor::from_vec(vec![1.0f32], &[1]).unwrap().requires_grad_(true).unwrap(),
        }
    }
}

impl Module for SimpleModule {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let x = (x + &Tensor::from_vec(vec![1.0f32], &[1])?)?;
        let x = functional::relu(&x)?;
        self.linear.call(&(&x + &self.param)?)
    }
}

#[test]
fn seed001_simple_module_end_to_end() {
    manual_seed(0);
    let module = SimpleModule::new();
    assert_eq!(module.repr(), "SimpleModule(\n  (linear): Linear(in_features=4, out_features=5, bias=True)\n)");
    let inp = zeros(&[3, 4], None).unwrap();
    let traced = trace_module(&module, &[inp.clone().into()]).unwrap();
    traced.graph().lint().unwrap();
    let graph = traced.internal_graph();
    // the seed's printout; MegEngine records `getattr(self, "linear")` when Python evaluates
    // `self.linear`, before the argument; a ferrofx module call is seen after its argument,
    // so the module's GetAttr comes right before its call
    assert_eq!(
        graph.to_string(),
        "SimpleModule.Graph (self, x) {\n\
         \t%2:\tconst_tensor = Constant(Tensor) -> (Tensor)\n\
         \t%3:\tadd_out = x.__add__(const_tensor, )\n\
         \t%4:\trelu_out = F.relu(add_out, )\n\
         \t%5:\tparam = getattr(self, \"param\") -> (Tensor)\n\
         \t%6:\tadd_out_1 = relu_out.__add__(param, )\n\
         \t%7:\tlinear = getattr(self, \"linear\") -> (Linear)\n\
         \t%8:\tlinear_out = linear(add_out_1, )\n\
         \treturn linear_out\n}"
    );
    // Node: expr, users
    let linear_out = graph.outputs()[0];
    let self_node = graph.inputs()[0];
    assert_eq!(linear_out.to_string(), "linear_out");
    assert_eq!(linear_out.expr().to_string(), "%8:\tlinear_out = linear(add_out_1, )");
    assert_eq!(self_node.to_string(), "self");
    let users: Vec<String> = self_node.users().iter().map(|e| e.to_string()).collect();
    assert_eq!(
        users,
        vec![
            "%5:\tparam = getattr(self, \"param\") -> (Tensor)".to_string(),
            "%7:\tlinear = getattr(self, \"linear\") -> (Linear)".to_string()
        ]
    );
    // TensorNode / ModuleNode
    assert_eq!(linear_out.type_name(), "TensorNode");
    assert_eq!(linear_out.shape(), Some(&[3usize, 5][..]));
    assert_eq!(linear_out.dtype(), Some(DType::F32));
    assert_eq!(self_node.type_name(), "ModuleNode");
    let owner = self_node.owner().unwrap();
    assert!(std::ptr::addr_eq(owner as *const dyn Module, &traced as *const GraphModule as *const dyn Module));
    assert_eq!(owner.repr(), "GraphModule(\n  (linear): Linear(in_features=4, out_features=5, bias=True)\n)");
    let linear_node = graph.get_node_by_name("linear").unwrap();
    assert_eq!(linear_node.type_name(), "ModuleNode");
    assert_eq!(linear_node.owner().unwrap().repr(), "Linear(in_features=4, out_features=5, bias=True)");
    // Expr kinds, inputs, outputs (the seed's exprs[9], [10], [7], [5])
    let io = |id: usize| {
        let e = graph.get_expr_by_id(id).unwrap();
        let names = |v: Vec<ferrofx_fx::traced::ValueNode<'_>>| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        (e.kind(), names(e.inputs()), names(e.outputs()))
    };
    assert_eq!(io(5), (ExprKind::GetAttr, vec!["self".into()], vec!["param".into()]));
    assert_eq!(io(6), (ExprKind::CallMethod, vec!["relu_out".into(), "param".into()], vec!["add_out_1".into()]));
    assert_eq!(io(4), (ExprKind::CallFunction, vec!["add_out".into()], vec!["relu_out".into()]));
    assert_eq!(io(2), (ExprKind::Constant, vec![], vec!["const_tensor".into()]));
    assert_eq!(io(0), (ExprKind::Input, vec![], vec!["self".into()]));
    assert_eq!(io(8), (ExprKind::CallMethod, vec!["linear".into(), "add_out_1".into()], vec!["linear_out".into()]));
    assert_eq!(graph.get_expr_by_id(8).unwrap().module_path(), Some("linear"));
    assert!(graph.get_expr_by_id(9).is_none());
    // every expression's outputs point back at it; users are consistent with inputs
    for e in graph.exprs() {
        for o in e.outputs() {
            assert_eq!(o.expr().id(), e.id());
        }
        for i in e.inputs() {
            assert!(i.users().iter().any(|u| u.id() == e.id()), "{e}: {i} does not list it as a user");
        }
    }
    // interpret: the seed's node2value loop equals eager
    let x = randn(&[3, 4], None).unwrap();
    let out = graph.interpret(&[x.clone().into()]).unwrap();
    let eager = module.forward(&x).unwrap();
    close(out[0].as_tensor().unwrap(), &eager, "interpret");
    close(&traced.forward(&x).unwrap(), &eager, "forward");
    // one expression at a time
    let relu = graph.get_expr_by_id(4).unwrap();
    let v = relu.interpret(&[ExprValue::Value(Tensor::from_vec(vec![-1.0f32, 2.0], &[2]).unwrap().into())]).unwrap();
    match &v[0] {
        ExprValue::Value(Value::Tensor(t)) => assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 2.0]),
        other => panic!("{other:?}"),
    }
    let err = relu.interpret(&[]).unwrap_err().to_string();
    assert!(err.contains("takes 1 input value(s), got 0"), "{err}");
    let err = graph.get_expr_by_id(0).unwrap().interpret(&[]).unwrap_err().to_string();
    assert!(err.contains("an Input has no rule"), "{err}");
    let err = graph.interpret(&[]).unwrap_err().to_string();
    assert!(err.contains("takes 1 input(s) besides self, got 0"), "{err}");
}

#[test]
fn expression_view_survives_save_and_load() {
    let module = SimpleModule::new();
    let inp = zeros(&[3, 4], None).unwrap();
    let traced = trace_module(&module, &[inp.into()]).unwrap();
    let loaded = GraphModule::from_bytes(&traced.to_bytes().unwrap()).unwrap();
    assert_eq!(loaded.internal_graph().to_string(), traced.internal_graph().to_string());
    let view = loaded.internal_graph();
    let out = view.outputs()[0];
    assert_eq!(out.shape(), Some(&[3usize, 5][..]));
}

/// A user module inside a user module inside the root.
#[derive(Module)]
struct Inner {
    lin: Linear,
}

impl Module for Inner {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        functional::relu(&self.lin.call(x)?)
    }
}

#[derive(Module)]
struct Block {
    inner: Inner,
    scale: Tensor,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let h = (&self.inner.call(x)? * &self.scale)?;
        &h + x
    }
}

#[derive(Module)]
struct Net {
    stem: Linear,
    block1: Block,
    block2: Block,
    head: Linear,
}

impl Net {
    fn new() -> Net {
        let block = || Block {
            inner: Inner { lin: Linear::new(8, 8, true).unwrap() },
            scale: randn(&[8], None).unwrap().requires_grad_(true).unwrap(),
        };
        Net {
            stem: Linear::new(4, 8, true).unwrap(),
            block1: block(),
            block2: block(),
            head: Linear::new(8, 3, true).unwrap(),
        }
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let h = self.stem.call(x)?;
        let h = self.block2.call(&self.block1.call(&h)?)?;
        self.head.call(&h.tanh()?)
    }
}

fn ops(gm: &GraphModule) -> Vec<(Opcode, String)> {
    gm.graph().iter().map(|n| (n.op(), n.target().name().to_string())).collect()
}

#[test]
fn module_preserving_trace_nests_user_modules_and_flatten_equals_symbolic_trace() {
    manual_seed(3);
    let net = Net::new();
    let x = randn(&[2, 4], None).unwrap();
    let tm = trace_module(&net, &[x.clone().into()]).unwrap();
    tm.graph().lint().unwrap();
    // built-ins stay leaves; user modules are nested traced modules with their own graphs
    let kinds: Vec<(String, String)> = tm
        .leaf_modules()
        .iter()
        .map(|(p, m)| {
            let ty = match m.as_any().downcast_ref::<GraphModule>() {
                Some(g) => format!("traced {}", g.traced_type_name()),
                None => m.spec().unwrap().type_name.to_string(),
            };
            (p.clone(), ty)
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("stem".to_string(), "Linear".to_string()),
            ("block1".to_string(), "traced Block".to_string()),
            ("block2".to_string(), "traced Block".to_string()),
            ("head".to_string(), "Linear".to_string()),
        ]
    );
    let root = tm.internal_graph().to_string();
    assert!(root.contains("block1_out = block1(stem_out, )"), "{root}");
    assert!(root.contains("getattr(self, \"block2\") -> (Block)"), "{root}");
    let block1 = tm.get_submodule_owned("block1").unwrap().as_any().downcast_ref::<GraphModule>().unwrap();
    block1.graph().lint().unwrap();
    let inner = block1.get_submodule_owned("inner").unwrap().as_any().downcast_ref::<GraphModule>().unwrap();
    inner.graph().lint().unwrap();
    assert_eq!(
        block1.internal_graph().to_string(),
        "Block.Graph (self, x) {\n\
         \t%2:\tinner = getattr(self, \"inner\") -> (Inner)\n\
         \t%3:\tinner_out = inner(x, )\n\
         \t%4:\tscale = getattr(self, \"scale\") -> (Tensor)\n\
         \t%5:\tmul_out = inner_out.__mul__(scale, )\n\
         \t%6:\tadd_out = mul_out.__add__(x, )\n\
         \treturn add_out\n}"
    );
    let root_view = tm.internal_graph();
    let nested: Vec<&str> = root_view.nested().iter().map(|(p, _)| *p).collect();
    assert_eq!(nested, vec!["block1", "block2"]);
    assert_eq!(root_view.nested()[0].1.nested()[0].0, "inner");
    assert!(root_view.nested()[0].1.nested()[0].1.nested().is_empty());
    // shapes inside the nested graphs come from the call's inputs
    assert_eq!(inner.internal_graph().outputs()[0].shape(), Some(&[2usize, 8][..]));
    // outputs (and gradients through the shared parameters) equal eager
    let eager = net.forward(&x).unwrap();
    close(&tm.forward(&x).unwrap(), &eager, "nested forward");
    close(tm.internal_graph().interpret(&[x.clone().into()]).unwrap()[0].as_tensor().unwrap(), &eager, "interpret");
    net.zero_grad();
    tm.forward(&x).unwrap().sum().unwrap().backward(None, false, false).unwrap();
    assert!(net.block1.inner.lin.weight.grad().is_some() && net.block2.scale.grad().is_some());
    // flatten: one graph, the same nodes as symbolic_trace, the same output
    let flat = tm.flatten().unwrap();
    flat.graph().lint().unwrap();
    let reference = symbolic_trace(&net).unwrap();
    assert_eq!(ops(&flat), ops(&reference), "flat:\n{}\nsymbolic_trace:\n{}", flat.graph(), reference.graph());
    assert!(flat.leaf_modules().values().all(|m| m.spec().is_some()));
    close(&flat.forward(&x).unwrap(), &eager, "flatten");
    // symbolic (no shapes) module-preserving tracing works too, with FX names on request
    let sym = ModuleTracer::new().fx_names(true).trace(&net, 1).unwrap();
    close(&sym.forward(&x).unwrap(), &eager, "symbolic nested");
    assert_eq!(ops(&sym.flatten().unwrap()), ops(&reference));
    // the nested module saves and loads as nested traced modules (no model code needed)
    let loaded = GraphModule::from_bytes(&tm.to_bytes().unwrap()).unwrap();
    loaded.graph().lint().unwrap();
    assert_eq!(loaded.internal_graph().to_string(), tm.internal_graph().to_string());
    let lb = loaded.get_submodule_owned("block1").unwrap().as_any().downcast_ref::<GraphModule>().unwrap();
    assert_eq!(lb.internal_graph().to_string(), block1.internal_graph().to_string());
    assert_eq!(
        loaded.state_dict().keys().cloned().collect::<Vec<_>>(),
        tm.state_dict().keys().cloned().collect::<Vec<_>>()
    );
    assert_eq!(loaded.forward(&x).unwrap().to_vec::<f32>().unwrap(), tm.forward(&x).unwrap().to_vec::<f32>().unwrap());
    assert!(loaded.parameters().iter().all(|p| p.requires_grad()));
    // the flat module saves and loads like any traced module
    let loaded = GraphModule::from_bytes(&flat.to_bytes().unwrap()).unwrap();
    close(&loaded.forward(&x).unwrap(), &eager, "flatten + load");
}

#[test]
fn module_preserving_trace_of_zoo_models_equals_eager() {
    manual_seed(4);
    let mut m = ferrofx_nn::zoo::ResNet::resnet18(10).unwrap();
    m.eval();
    let x = randn(&[1, 3, 32, 32], None).unwrap();
    let tm = trace_module(&m, &[x.clone().into()]).unwrap();
    let eager = m.forward(&x).unwrap();
    close(&tm.forward(&x).unwrap(), &eager, "resnet18 nested");
    let flat = tm.flatten().unwrap();
    assert_eq!(ops(&flat), ops(&symbolic_trace(&m).unwrap()));
    close(&flat.forward(&x).unwrap(), &eager, "resnet18 flat");
    let loaded = GraphModule::from_bytes(&tm.to_bytes().unwrap()).unwrap();
    assert_eq!(loaded.forward(&x).unwrap().to_vec::<f32>().unwrap(), tm.forward(&x).unwrap().to_vec::<f32>().unwrap());
}

#[test]
fn nested_documents_are_validated() {
    use ferrofx_fx::serialize::{read_module_bytes, write_module_bytes, LeafDoc};
    manual_seed(6);
    let net = Net::new();
    let x = randn(&[2, 4], None).unwrap();
    let bytes = trace_module(&net, &[x.into()]).unwrap().to_bytes().unwrap();
    let (doc, sd) = read_module_bytes(&bytes).unwrap();
    assert_eq!(doc.submodules.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(), vec!["block1", "block2"]);
    assert_eq!(doc.submodules[0].module.submodules[0].path, "inner");
    // a nested document declaring its own tensors
    let mut bad = doc.clone();
    bad.submodules[0].module.tensors.push(doc.tensors[0].clone());
    let err = GraphModule::from_bytes(&write_module_bytes(&bad, &sd).unwrap()).err().unwrap().to_string();
    assert!(err.contains("nested module 'block1' declares tensors"), "{err}");
    // a nested module declared twice
    let mut bad = doc.clone();
    let again = bad.submodules[0].clone();
    bad.submodules.push(again);
    let err = GraphModule::from_bytes(&write_module_bytes(&bad, &sd).unwrap()).err().unwrap().to_string();
    assert!(err.contains("module 'block1' is declared twice"), "{err}");
    // a nested module's leaf whose weights are missing from the file
    let mut bad = doc.clone();
    let spec = bad.leaves[0].spec.clone();
    bad.submodules[1].module.submodules[0].module.leaves.push(LeafDoc { path: "extra".into(), spec });
    let err = GraphModule::from_bytes(&write_module_bytes(&bad, &sd).unwrap()).err().unwrap().to_string();
    assert!(err.contains("block2.inner.extra"), "{err}");
    // a nested graph calling a module it does not have
    let mut bad = doc;
    bad.submodules[0].module.submodules.clear();
    let err = GraphModule::from_bytes(&write_module_bytes(&bad, &sd).unwrap()).err().unwrap().to_string();
    assert!(err.contains("call_module target 'inner' is not a submodule"), "{err}");
}

#[test]
fn surgery_relu_to_gelu_survives_save_and_load() {
    manual_seed(5);
    let module = SimpleModule::new();
    let x = randn(&[3, 4], None).unwrap();
    let mut tm = trace_module(&module, &[x.clone().into()]).unwrap();
    // finding expressions
    let (relu, relu_input, add_1, linear_call, param) = {
        let g = tm.internal_graph();
        let relus = g.get_function_by_type("relu");
        assert_eq!(relus.len(), 1);
        assert_eq!(relus[0].to_string(), "%4:\trelu_out = F.relu(add_out, )");
        let adds = g.get_function_by_type("add");
        assert_eq!(adds.iter().map(|e| e.id()).collect::<Vec<_>>(), vec![3, 6]);
        assert_eq!(g.get_method_by_type("__add__").len(), 2);
        let linears = g.get_module_by_type("Linear");
        assert_eq!(linears.len(), 1);
        assert_eq!(linears[0].id(), 8);
        assert!(g.get_module_by_type("Conv2d").is_empty());
        assert_eq!(g.get_expr_by_node_name("add_out_1").unwrap().id(), 6);
        assert_eq!(g.get_expr_by_id(5).unwrap().name(), "param");
        let relu = relus[0].graph_node().unwrap();
        (
            relu,
            relus[0].inputs()[0].graph_node().unwrap(),
            adds[1].graph_node().unwrap(),
            linears[0].graph_node().unwrap(),
            g.get_node_by_name("param").unwrap().graph_node().unwrap(),
        )
    };
    // insert gelu after relu, on relu's input; route relu's users to it; compile drops relu
    let gelu = tm
        .insert_exprs(relu, |g| {
            g.call_function_with(
                Target::op("gelu")?,
                vec![Argument::Node(relu_input)],
                [("approximate".to_string(), Argument::Str("tanh".into()))].into_iter().collect(),
            )
        })
        .unwrap();
    tm.graph().lint().unwrap();
    assert_eq!(tm.replace_node(relu, gelu).unwrap(), 1);
    tm.graph().lint().unwrap();
    assert_eq!(tm.compile().unwrap(), 1);
    tm.graph().lint().unwrap();
    let printed = tm.internal_graph().to_string();
    assert!(printed.contains("gelu = F.gelu(add_out, approximate=\"tanh\", )"), "{printed}");
    assert!(printed.contains("add_out_1 = gelu.__add__(param, )"), "{printed}");
    assert!(!printed.contains("relu"), "{printed}");
    // the edit computes gelu instead of relu
    let want = {
        let h = functional::gelu(&(&x + &Tensor::from_vec(vec![1.0f32], &[1]).unwrap()).unwrap(), "tanh").unwrap();
        module.linear.forward(&(&h + &module.param).unwrap()).unwrap()
    };
    close(&tm.forward(&x).unwrap(), &want, "gelu edit");
    // ... and survives save/load (a file: what another program would read)
    let dir = std::env::temp_dir().join(format!("ferrofx_tm_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gelu.fxm");
    tm.save(&path).unwrap();
    let loaded = GraphModule::load(&path).unwrap();
    loaded.graph().lint().unwrap();
    assert_eq!(loaded.internal_graph().to_string(), tm.internal_graph().to_string());
    close(&loaded.forward(&x).unwrap(), &want, "gelu edit after load");
    std::fs::remove_file(&path).ok();

    // outputs: add one, the forward returns it too; remove it again
    tm.add_output(add_1).unwrap();
    tm.graph().lint().unwrap();
    assert!(tm.internal_graph().to_string().contains("return linear_out, add_out_1"));
    let outs = tm.forward_values(&[x.clone().into()]).unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[1].as_tensor().unwrap().shape(), &[3, 4]);
    let err = tm.remove_output(param).unwrap_err().to_string();
    assert!(err.contains("'param' is not an output of the graph"), "{err}");
    tm.remove_output(add_1).unwrap();
    let err = tm.remove_output(linear_call).unwrap_err().to_string();
    assert!(err.contains("only output"), "{err}");
    tm.graph().lint().unwrap();
    // inputs: add one, use it, removing a used input is an error naming its users
    let y = tm.add_input("y").unwrap();
    assert_eq!(tm.internal_graph().to_string().lines().next().unwrap(), "SimpleModule.Graph (self, x, y) {");
    let mul = tm
        .insert_exprs(linear_call, |g| g.call_function(Target::op("mul")?, vec![linear_call.into(), y.into()]))
        .unwrap();
    tm.replace_node(linear_call, mul).unwrap();
    tm.graph().lint().unwrap();
    let two = Tensor::from_vec(vec![2.0f32], &[1]).unwrap();
    let out = tm.forward_values(&[x.clone().into(), two.into()]).unwrap();
    close(out[0].as_tensor().unwrap(), &(&want * 2.0).unwrap(), "extra input");
    let err = tm.remove_input(y).unwrap_err().to_string();
    assert!(err.contains("input 'y' is still used by [\"mul\"]"), "{err}");
    let err = tm.remove_input(mul).unwrap_err().to_string();
    assert!(err.contains("'mul' is a call_function, not a graph input"), "{err}");
    // the output (after linear_out) goes back to linear_out; mul is then dead
    assert_eq!(tm.replace_node(mul, linear_call).unwrap(), 1);
    assert_eq!(tm.compile().unwrap(), 1);
    tm.remove_input(y).unwrap();
    tm.graph().lint().unwrap();
    close(&tm.forward(&x).unwrap(), &want, "inputs restored");
}

#[test]
fn a_dangling_module_call_is_visible_and_reported() {
    let module = SimpleModule::new();
    let mut tm = trace_module(&module, &[zeros(&[3, 4], None).unwrap().into()]).unwrap();
    assert!(tm.delete_submodule("linear"));
    let g = tm.internal_graph();
    let linear = g.get_node_by_name("linear").unwrap();
    assert_eq!(linear.type_name(), "ModuleNode");
    assert!(linear.owner().is_none());
    assert!(g.to_string().contains("linear = getattr(self, \"linear\") -> (?)"), "{g}");
    let err = g.interpret(&[randn(&[3, 4], None).unwrap().into()]).unwrap_err().to_string();
    assert!(err.contains("GraphModule has no submodule 'linear'"), "{err}");
    let err = tm.recompile().unwrap_err().to_string();
    assert!(err.contains("call_module target 'linear' is not a submodule"), "{err}");
}
