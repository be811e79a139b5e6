//! CSE and algebraic simplification: graphs before and after, and the cases they must leave
//! alone.

use ferrofx_core::DType;
use ferrofx_fx::passes::{eliminate_common_subexpressions, simplify};
use ferrofx_fx::{Argument, Graph, Kwargs, NodeId, Target, TensorMetadata};

fn f(g: &mut Graph, op: &str, args: Vec<Argument>) -> NodeId {
    g.call_function(Target::named(op), args).unwrap()
}

fn lines(g: &Graph) -> Vec<String> {
    g.to_string().lines().skip(1).map(|l| l.trim().to_string()).collect()
}

#[test]
fn cse_merges_repeated_pure_calls_transitively() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let w1 = g.get_attr("w").unwrap();
    let w2 = g.get_attr("w").unwrap();
    let a = f(&mut g, "mul", vec![x.into(), w1.into()]);
    let b = f(&mut g, "mul", vec![x.into(), w2.into()]); // same once w2 -> w1
    let ea = f(&mut g, "exp", vec![a.into()]);
    let eb = g.call_method("exp", vec![b.into()]).unwrap(); // a method is not the same call
    let eb2 = f(&mut g, "exp", vec![b.into()]); // same as ea once b -> a
    let s = f(&mut g, "add", vec![ea.into(), eb.into()]);
    let s = f(&mut g, "add", vec![s.into(), eb2.into()]);
    g.output(s.into()).unwrap();
    assert_eq!(eliminate_common_subexpressions(&mut g).unwrap(), 3);
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        vec![
            "%x : [num_users=1] = placeholder[target=x]",
            "%w : [num_users=1] = get_attr[target=w]",
            "%mul : [num_users=2] = call_function[target=mul](args = (%x, %w), kwargs = {})",
            "%exp : [num_users=2] = call_function[target=exp](args = (%mul,), kwargs = {})",
            "%exp_1 : [num_users=1] = call_method[target=exp](args = (%mul,), kwargs = {})",
            "%add : [num_users=1] = call_function[target=add](args = (%exp, %exp_1), kwargs = {})",
            "%add_1 : [num_users=1] = call_function[target=add](args = (%add, %exp), kwargs = {})",
            "return add_1",
        ]
    );
}

#[test]
fn cse_leaves_random_in_place_modules_and_different_literals_alone() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let d1 = f(&mut g, "dropout", vec![x.into(), Argument::Float(0.5)]);
    let d2 = f(&mut g, "dropout", vec![x.into(), Argument::Float(0.5)]);
    let m1 = g.call_module("bn", vec![x.into()]).unwrap();
    let m2 = g.call_module("bn", vec![x.into()]).unwrap();
    let a1 = f(&mut g, "add", vec![x.into(), Argument::Float(0.0)]);
    let a2 = f(&mut g, "add", vec![x.into(), Argument::Float(-0.0)]);
    let i1 = g.call_method("add_", vec![x.into(), Argument::Int(1)]).unwrap();
    let i2 = g.call_method("add_", vec![x.into(), Argument::Int(1)]).unwrap();
    g.output(Argument::tuple([d1, d2, m1, m2, a1, a2, i1, i2].map(Argument::Node))).unwrap();
    let before = g.to_string();
    assert_eq!(eliminate_common_subexpressions(&mut g).unwrap(), 0);
    assert_eq!(g.to_string(), before);
    // kwargs take part in the key
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let mut kw = Kwargs::new();
    kw.insert("alpha".into(), Argument::Int(2));
    let a = g.call_function_with(Target::named("add"), vec![x.into(), x.into()], kw).unwrap();
    let b = f(&mut g, "add", vec![x.into(), x.into()]);
    g.output(Argument::tuple([a.into(), b.into()])).unwrap();
    assert_eq!(eliminate_common_subexpressions(&mut g).unwrap(), 0);
}

#[test]
fn simplify_removes_identities_double_transposes_and_reshape_chains() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r0 = f(&mut g, "relu", vec![x.into()]);
    let a = f(&mut g, "add", vec![r0.into(), Argument::Int(0)]);
    let m = g.call_method("mul", vec![a.into(), Argument::Int(1)]).unwrap();
    let t1 = f(&mut g, "transpose", vec![m.into(), Argument::Int(0), Argument::Int(1)]);
    let t2 = f(&mut g, "transpose", vec![t1.into(), Argument::Int(1), Argument::Int(0)]);
    let n1 = f(&mut g, "neg", vec![t2.into()]);
    let n2 = f(&mut g, "neg", vec![n1.into()]);
    let v1 = f(&mut g, "reshape", vec![n2.into(), Argument::list([Argument::Int(-1)])]);
    let v2 = g.call_method("view", vec![v1.into(), Argument::list([Argument::Int(2), Argument::Int(-1)])]).unwrap();
    let d = f(&mut g, "dropout", vec![v2.into(), Argument::Float(0.1), Argument::Bool(false)]);
    g.output(d.into()).unwrap();
    let n = simplify(&mut g).unwrap();
    assert_eq!(n, 6, "{g}");
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        vec![
            "%x : [num_users=1] = placeholder[target=x]",
            "%relu : [num_users=1] = call_function[target=relu](args = (%x,), kwargs = {})",
            "%view : [num_users=1] = call_method[target=view](args = (%relu, [2, -1]), kwargs = {})",
            "return view",
        ]
    );
}

#[test]
fn simplify_respects_dtype_aliasing_and_outputs() {
    // x + 0.0 on an int tensor promotes to float: kept; on a float tensor: removed
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = f(&mut g, "relu", vec![x.into()]);
    let a = f(&mut g, "add", vec![r.into(), Argument::Float(0.0)]);
    let e = f(&mut g, "exp", vec![a.into()]);
    g.output(e.into()).unwrap();
    assert_eq!(simplify(&mut g).unwrap(), 0, "no tensor_meta: unknown dtype, kept");
    g.meta_mut(r).unwrap().tensor_meta = Some(TensorMetadata::contiguous(vec![2], DType::I64));
    assert_eq!(simplify(&mut g).unwrap(), 0, "int tensor + 0.0 is float: kept");
    g.meta_mut(r).unwrap().tensor_meta = Some(TensorMetadata::contiguous(vec![2], DType::F32));
    assert_eq!(simplify(&mut g).unwrap(), 1);
    // int / 1 is a float division: kept without float meta
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = f(&mut g, "relu", vec![x.into()]);
    let d = f(&mut g, "div", vec![r.into(), Argument::Int(1)]);
    let e = f(&mut g, "exp", vec![d.into()]);
    g.output(e.into()).unwrap();
    assert_eq!(simplify(&mut g).unwrap(), 0);
    // a user writing in place into the result: kept (it would write into x)
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = f(&mut g, "relu", vec![x.into()]);
    let a = f(&mut g, "add", vec![r.into(), Argument::Int(0)]);
    let i = g.call_method("mul_", vec![a.into(), Argument::Int(3)]).unwrap();
    g.output(Argument::tuple([r.into(), i.into()])).unwrap();
    assert_eq!(simplify(&mut g).unwrap(), 0);
    // returning an input in place of a fresh output: kept
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let a = f(&mut g, "mul", vec![x.into(), Argument::Int(1)]);
    g.output(a.into()).unwrap();
    assert_eq!(simplify(&mut g).unwrap(), 0);
    // dropout in training mode: kept
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = f(&mut g, "relu", vec![x.into()]);
    let d = f(&mut g, "dropout", vec![r.into(), Argument::Float(0.1), Argument::Bool(true)]);
    g.output(d.into()).unwrap();
    assert_eq!(simplify(&mut g).unwrap(), 0);
}

#[test]
fn dce_keeps_in_place_methods() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    g.call_method("add_", vec![x.into(), Argument::Int(1)]).unwrap();
    g.call_method("add", vec![x.into(), Argument::Int(1)]).unwrap();
    g.output(x.into()).unwrap();
    assert!(g.eliminate_dead_code(None).unwrap());
    assert_eq!(g.len(), 3, "the unused add is removed, the in-place add_ stays:\n{g}");
}

#[test]
fn drawing_has_kinds_shapes_and_module_clusters() {
    use ferrofx_fx::passes::draw::{to_dot, to_svg};
    use ferrofx_fx::ModuleStackEntry;
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let c = g.call_module("layer1.conv", vec![x.into()]).unwrap();
    let r = g.call_method("relu", vec![c.into()]).unwrap();
    let w = g.get_attr("fc.weight").unwrap();
    let o = f(&mut g, "matmul", vec![r.into(), w.into()]);
    g.output(o.into()).unwrap();
    for (id, path) in [(c, "layer1"), (r, "layer1")] {
        let m = g.meta_mut(id).unwrap();
        m.nn_module_stack =
            vec![ModuleStackEntry { key: path.into(), path: path.into(), type_name: "Block".into() }].into();
    }
    g.meta_mut(c).unwrap().tensor_meta = Some(TensorMetadata::contiguous(vec![1, 8, 4, 4], DType::F32));
    let dot = to_dot(&g, "digits cnn");
    assert!(dot.starts_with("digraph digits_cnn {"), "{dot}");
    assert!(dot.contains("subgraph cluster_0 {\n    label=\"layer1\";"), "{dot}");
    assert!(dot.contains("\"layer1_conv\" -> \"relu\" [label=\"[1, 8, 4, 4] float32\"];"), "{dot}");
    assert!(dot.contains("fillcolor=\"#fff6b3\""), "call_module colour: {dot}");
    assert!(dot.contains("layer1_conv\\ncall_module\\nlayer1.conv\\n[1, 8, 4, 4] float32"), "{dot}");
    let svg = to_svg(&g, "digits cnn").unwrap();
    assert!(svg.contains("<svg") && svg.contains("matmul") && svg.contains("fc_weight"), "{svg}");
}
