//! Issue 22, acceptance 1: `split_module` with FX's semantics on every zoo model and on the
//! partition edge cases; the automatic partitioners (balanced cost, memory cap).

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Tensor, Value};
use ferrofx_fx::graph_module::TensorEntry;
use ferrofx_fx::passes::{partition_balanced, partition_by_memory, split_module};
use ferrofx_fx::{trace_with_inputs, Argument, Graph, GraphModule, Opcode, ShapeProp, Target};
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::{Module, TensorKind};
use indexmap::IndexMap;

static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn out(gm: &GraphModule, inputs: &[Value]) -> Vec<f32> {
    let _g = ferrofx_core::autograd::no_grad();
    let v = gm.forward_values(inputs).unwrap();
    v[0].as_tensor().unwrap().to_vec::<f32>().unwrap()
}

/// The zoo in eval mode, traced and shape-propagated, with its example input.
fn zoo() -> Vec<(&'static str, GraphModule, Value)> {
    manual_seed(22);
    let zoo = ferrofx_nn::zoo::catalogue().unwrap();
    zoo.into_iter()
        .map(|z| {
            let x = Value::Tensor(z.input);
            let mut gm = trace_with_inputs(z.model.as_ref(), std::slice::from_ref(&x)).unwrap();
            ShapeProp::propagate(&mut gm, std::slice::from_ref(&x)).unwrap();
            (z.name, gm, x)
        })
        .collect()
}

#[test]
fn every_zoo_model_splits_into_equal_lint_clean_stages() {
    let _s = serial();
    for (name, gm, x) in zoo() {
        let want = out(&gm, std::slice::from_ref(&x));
        for stages in [2, 3, 4] {
            let plan = partition_balanced(&gm, stages).unwrap();
            let split = plan.split(&gm).unwrap();
            assert_eq!(split.partitions.len(), stages, "{name}: {stages} stages");
            split.module.graph().lint().unwrap();
            for p in &split.partitions {
                let part = split.partition(p).unwrap();
                part.graph().lint().unwrap_or_else(|e| panic!("{name} {p}: {e}"));
                part.recompile().unwrap();
            }
            // the split module calls every partition once, in order
            let calls: Vec<String> = split
                .module
                .graph()
                .iter()
                .filter(|n| n.op() == Opcode::CallModule)
                .map(|n| n.target().name().to_string())
                .collect();
            assert_eq!(calls, split.partitions, "{name}");
            let got = out(&split.module, std::slice::from_ref(&x));
            assert_eq!(got, want, "{name} split into {stages} stages changed the output");
            // state: every parameter of the original is held by some partition, same storage
            let mut held = 0usize;
            for (new, old) in &split.qualname_map {
                let (part, local) = new.split_once('.').unwrap();
                let p = split.partition(part).unwrap();
                let is_attr = p.attributes().contains_key(local);
                assert!(is_attr || p.leaf_modules().contains_key(local), "{name}: {new} -> {old}");
                held += 1;
            }
            assert!(held > 0 || name == "none", "{name}: nothing placed in partitions");
        }
    }
}

#[test]
fn gradients_through_the_split_module_equal_the_original() {
    let _s = serial();
    manual_seed(5);
    let mut m = ResNet::resnet18(10).unwrap();
    m.eval();
    let x = randn(&[2, 3, 32, 32], None).unwrap();
    let xv = Value::Tensor(x.clone());
    let mut gm = trace_with_inputs(&m, std::slice::from_ref(&xv)).unwrap();
    ShapeProp::propagate(&mut gm, std::slice::from_ref(&xv)).unwrap();
    let grads = |module: &dyn Module| -> Vec<Vec<f32>> {
        for p in m.parameters() {
            p.set_grad(None).unwrap();
        }
        let y = module.forward(&x).unwrap();
        y.sum().unwrap().backward(None, false, false).unwrap();
        m.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect()
    };
    let want = grads(&gm);
    let split = partition_balanced(&gm, 3).unwrap().split(&gm).unwrap();
    let got = grads(&split.module);
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a, b);
    }
}

/// x -> relu (p0) -> neg (p1) -> add(neg, relu) (p2) + a parameter `w` read in p0 and p2.
fn hand_graph() -> GraphModule {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let w = g.get_attr("lin.w").unwrap();
    let a = g.call_function(Target::op("mul").unwrap(), [x.into(), w.into()]).unwrap();
    let r = g.call_function(Target::op("relu").unwrap(), [a.into()]).unwrap();
    let n = g.call_function(Target::op("neg").unwrap(), [r.into()]).unwrap();
    let w2 = g.get_attr("lin.w").unwrap();
    let s = g.call_function(Target::op("add").unwrap(), [n.into(), r.into()]).unwrap();
    let t = g.call_function(Target::op("mul").unwrap(), [s.into(), w2.into()]).unwrap();
    g.output(Argument::tuple([t.into(), x.into()])).unwrap();
    let mut attrs = IndexMap::new();
    let wt = Tensor::from_vec(vec![0.5f32, -2.0, 3.0], &[3]).unwrap();
    attrs.insert("lin.w".to_string(), TensorEntry { tensor: wt, kind: TensorKind::Parameter, constant: false });
    GraphModule::from_parts(g, IndexMap::new(), attrs, "Hand", false).unwrap()
}

#[test]
fn non_adjacent_use_and_a_parameter_in_two_partitions() {
    let _s = serial();
    let gm = hand_graph();
    let part = |name: &str| match name {
        "mul" | "relu" => 0,
        "neg" => 1,
        _ => 2,
    };
    let split = split_module(&gm, |n| Ok(part(n.name()))).unwrap();
    assert_eq!(split.partitions, ["submod_0", "submod_1", "submod_2"]);
    let x = Value::Tensor(Tensor::from_vec(vec![1.0f32, 1.0, -1.0], &[3]).unwrap());
    let a = gm.forward_values(std::slice::from_ref(&x)).unwrap();
    let b = split.module.forward_values(std::slice::from_ref(&x)).unwrap();
    assert_eq!(a.len(), 2);
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(a.as_tensor().unwrap().to_vec::<f32>().unwrap(), b.as_tensor().unwrap().to_vec::<f32>().unwrap());
    }
    // submod_2 reads relu's result straight from submod_0 (skipping submod_1)
    let code = split.module.graph().to_string();
    assert!(code.contains("call_module[target=submod_2](args = (%submod_1, %submod_0)"), "{code}");
    // the parameter is held by partitions 0 and 2 (same storage) and reported shared
    assert_eq!(split.shared.len(), 1);
    assert_eq!(split.shared[0].path, "lin.w");
    assert_eq!(split.shared[0].partitions, ["submod_0", "submod_2"]);
    let p0 = split.partition("submod_0").unwrap().attributes()["lin_w"].tensor.clone();
    let p2 = split.partition("submod_2").unwrap().attributes()["lin_w"].tensor.clone();
    assert!(p0.shares_storage(&p2));
    assert_eq!(split.qualname_map["submod_2.lin_w"], "lin.w");
    // FX's placeholder names inside partitions
    let p1 = split.partition("submod_1").unwrap();
    assert_eq!(p1.graph().iter().next().unwrap().name(), "arg_0");
}

#[test]
fn getitem_of_a_multi_output_node_across_the_cut() {
    let _s = serial();
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let c = g.call_function(Target::op("chunk").unwrap(), [x.into(), Argument::Int(2), Argument::Int(0)]).unwrap();
    let c0 = g.call_function(Target::op("getitem").unwrap(), [c.into(), Argument::Int(0)]).unwrap();
    let c1 = g.call_function(Target::op("getitem").unwrap(), [c.into(), Argument::Int(1)]).unwrap();
    let m = g.call_function(Target::op("mul").unwrap(), [c0.into(), c1.into()]).unwrap();
    g.output(m.into()).unwrap();
    let gm = GraphModule::from_parts(g, IndexMap::new(), IndexMap::new(), "Chunky", false).unwrap();
    // the callback puts the getitems in partition 1: they follow `chunk` into partition 0
    let split = split_module(&gm, |n| Ok(if n.name() == "chunk" { 0 } else { 1 })).unwrap();
    let x = Value::Tensor(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap());
    assert_eq!(out(&split.module, std::slice::from_ref(&x)), out(&gm, std::slice::from_ref(&x)));
    assert_eq!(out(&split.module, std::slice::from_ref(&x)), vec![3.0, 8.0]);
    let p0 = split.partition("submod_0").unwrap();
    assert_eq!(p0.graph().iter().filter(|n| n.target().name() == "getitem").count(), 2);
}

#[test]
fn cyclic_partitions_are_refused_by_name() {
    let _s = serial();
    let gm = hand_graph();
    let err = split_module(&gm, |n| Ok(if n.name() == "relu" || n.name() == "mul_1" { 1 } else { 0 }))
        .err()
        .expect("a cycle between partitions must be refused")
        .to_string();
    assert!(err.contains("cycle") && err.contains("submod_0") && err.contains("submod_1"), "{err}");
    let err = split_module(&gm, |n| {
        if n.name() == "neg" {
            Err(ferrofx_core::Error::argument("test", "no partition for neg"))
        } else {
            Ok(0)
        }
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("no partition for neg"), "{err}");
}

#[test]
fn balanced_stages_of_resnet50_are_within_20_percent() {
    let _s = serial();
    let (_, gm, x) = zoo().into_iter().find(|z| z.0 == "resnet50").unwrap();
    for stages in [2, 4] {
        let plan = partition_balanced(&gm, stages).unwrap();
        let costs: Vec<u64> = plan.stages.iter().map(|s| s.cost).collect();
        assert!(plan.imbalance() <= 1.2, "{stages} stages: costs {costs:?} ({:.3})", plan.imbalance());
        let total: u64 = costs.iter().sum();
        let want = out(&gm, std::slice::from_ref(&x));
        assert_eq!(out(&plan.split(&gm).unwrap().module, std::slice::from_ref(&x)), want);
        assert!(total > 0);
    }
    let err = partition_balanced(&gm, 0).unwrap_err().to_string();
    assert!(err.contains("1 to"), "{err}");
}

#[test]
fn memory_capped_stages_respect_the_cap() {
    let _s = serial();
    let (_, gm, x) = zoo().into_iter().find(|z| z.0 == "resnet18").unwrap();
    let one = partition_by_memory(&gm, u64::MAX).unwrap();
    assert_eq!(one.stages.len(), 1);
    let total = one.stages[0].memory_bytes();
    let cap = total / 3;
    let plan = partition_by_memory(&gm, cap).unwrap();
    assert!(plan.stages.len() >= 3, "{} stages", plan.stages.len());
    for s in &plan.stages {
        assert!(s.memory_bytes() <= cap, "{} > {cap}", s.memory_bytes());
    }
    let want = out(&gm, std::slice::from_ref(&x));
    assert_eq!(out(&plan.split(&gm).unwrap().module, std::slice::from_ref(&x)), want);
    let err = partition_by_memory(&gm, 16).unwrap_err().to_string();
    assert!(err.contains("alone needs") && err.contains("cap of 16 bytes"), "{err}");
    // without shapes, the partitioners say what to do
    let bare = hand_graph();
    let err = partition_balanced(&bare, 2).unwrap_err().to_string();
    assert!(err.contains("ShapeProp"), "{err}");
}
