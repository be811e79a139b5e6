//! torch.fx behaviours ported from PyTorch's own tests (`test/test_fx.py`,
//! `test/fx/test_subgraph_rewriter.py`, `test/fx/test_matcher_utils.py`,
//! `test/fx/test_dce_pass.py`). Each test quotes what PyTorch 2.15's torch.fx does on the same
//! case; misuse must return an error, never panic, in debug and release builds.

use ferrofx_core::Tensor;
use ferrofx_fx::passes::{
    replace_pattern, replace_pattern_in_module, replace_pattern_with_filters, InternalMatch, Replacement,
    SubgraphMatcher,
};
use ferrofx_fx::{symbolic_trace, Argument, Graph, Kwargs, NodeId, Opcode, Target};
use ferrofx_nn::*;

fn f(g: &mut Graph, op: &str, args: Vec<Argument>) -> NodeId {
    g.call_function(Target::named(op), args).unwrap()
}

fn lines(g: &Graph) -> Vec<String> {
    g.to_string().lines().skip(1).map(|l| l.trim().to_string()).collect()
}

fn unary(op: &str) -> Graph {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = f(&mut g, op, vec![x.into()]);
    g.output(r.into()).unwrap();
    g
}

fn targets(g: &Graph, op: Opcode) -> Vec<String> {
    g.iter().filter(|n| n.op() == op).map(|n| n.target().name().to_string()).collect()
}

fn stack_paths(g: &Graph, name: &str) -> Vec<String> {
    let n = g.iter().find(|n| n.name() == name).unwrap_or_else(|| panic!("no node {name}"));
    n.meta().nn_module_stack.iter().map(|e| e.path.clone()).collect()
}

// ----- module identity -----

#[test]
fn zero_sized_layers_keep_their_identity() {
    // FX: symbolic_trace(nn.Sequential(nn.ReLU(), nn.ReLU())) gives
    //   %_0 = call_module[target=0](args = (%x,)) ; %_1 = call_module[target=1](args = (%_0,))
    let seq = Sequential::new().append(ReLU::new()).append(ReLU::new()).append(Tanh::new()).append(Tanh::new());
    let gm = symbolic_trace(&seq).unwrap();
    assert_eq!(targets(gm.graph(), Opcode::CallModule), ["0", "1", "2", "3"]);
    assert_eq!(gm.leaf_modules().keys().collect::<Vec<_>>(), ["0", "1", "2", "3"]);
    // FX: a leaf's call_module node has its own frame last in nn_module_stack (seq_0's stack is
    // {'seq': ..., 'seq.0': ...} for a Sequential child `seq`)
    let names: Vec<String> =
        gm.graph().iter().filter(|n| n.op() == Opcode::CallModule).map(|n| n.name().to_string()).collect();
    assert_eq!(stack_paths(gm.graph(), &names[1]), ["1"]);
}

/// A user module with no fields: zero-sized, so its instances share an address in Rust.
#[derive(Module)]
struct Double {}

impl Module for Double {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        x * 2.0
    }
}

#[derive(Module)]
struct TwoDoubles {
    a: Double,
    b: Double,
    seq: Sequential,
}

impl Module for TwoDoubles {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let y = self.a.call(x)?;
        let y = self.b.call(&y)?;
        self.seq.call(&y)
    }
}

#[test]
fn zero_sized_user_modules_are_told_apart() {
    // FX: the two muls have nn_module_stack ['a'] and ['b']; the Sequential's leaves are
    // seq.0 and seq.1 with stacks ['seq', 'seq.0'] and ['seq', 'seq.1']
    let m = TwoDoubles {
        a: Double {},
        b: Double {},
        seq: Sequential::new().append(Identity::new()).append(Identity::new()),
    };
    let gm = symbolic_trace(&m).unwrap();
    let g = gm.graph();
    assert_eq!(stack_paths(g, "mul"), ["a"]);
    assert_eq!(stack_paths(g, "mul_1"), ["b"]);
    assert_eq!(targets(g, Opcode::CallModule), ["seq.0", "seq.1"]);
    assert_eq!(stack_paths(g, "seq_0"), ["seq", "seq.0"]);
    assert_eq!(stack_paths(g, "seq_1"), ["seq", "seq.1"]);
    let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
    assert_eq!(gm.forward(&x).unwrap().to_vec_f64().unwrap(), [4.0, -8.0]);
}

// ----- what the tracer records -----

#[derive(Module)]
struct Attrs {
    w: Tensor,
    #[module(buffer)]
    b: Tensor,
    #[module(skip)]
    k: Tensor,
}

impl Module for Attrs {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let y = ((x + &self.w)? + &self.w)?;
        let y = ((&y + &self.b)? + &self.b)?;
        let _dead = (x - 1.0)?;
        (&y + &self.k)? + &self.k
    }
}

#[test]
fn get_attr_nodes_and_dead_nodes_as_fx_records_them() {
    // FX (PyTorch 2.15) on the same module:
    //   %w = get_attr[target=w]                      (one node per parameter: parameter_proxy_cache)
    //   %add = add(%x, %w) ; %add_1 = add(%add, %w)
    //   %b = get_attr[target=b] ; %add_2 ; %b_1 = get_attr[target=b] ; %add_3   (a node per buffer use)
    //   %sub : [num_users=0] = sub(%x, 1)           (the tracer never eliminates dead code)
    //   %_tensor_constant0 = get_attr[target=_tensor_constant0] ; %add_4
    //   %_tensor_constant0_1 = get_attr[target=_tensor_constant0] ; %add_5
    let m = Attrs {
        w: Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap(),
        b: Tensor::from_vec(vec![2.0f32, 2.0], &[2]).unwrap(),
        k: Tensor::from_vec(vec![3.0f32, 3.0], &[2]).unwrap(),
    };
    let gm = symbolic_trace(&m).unwrap();
    let g = gm.graph();
    let attrs: Vec<(String, String)> = g
        .iter()
        .filter(|n| n.op() == Opcode::GetAttr)
        .map(|n| (n.name().to_string(), n.target().name().to_string()))
        .collect();
    let pairs = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
    assert_eq!(
        attrs,
        pairs(&[
            ("w", "w"),
            ("b", "b"),
            ("b_1", "b"),
            ("_tensor_constant0", "_tensor_constant0"),
            ("_tensor_constant0_1", "_tensor_constant0")
        ])
    );
    let sub = g.iter().find(|n| n.name() == "sub").expect("the dead sub is kept, as FX does");
    assert_eq!(sub.num_users(), 0);
    assert_eq!(gm.attributes().len(), 3);
    let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
    assert_eq!(gm.forward(&x).unwrap().to_vec_f64().unwrap(), [12.0, 13.0]);
}

// ----- subgraph rewriter -----

#[test]
fn a_match_may_consume_the_result_of_an_earlier_rewrite() {
    // FX: replace_pattern_with_filters(relu(relu(relu(x))), relu, sigmoid) gives 3 matches and
    //   %sigmoid = sigmoid(%x) ; %sigmoid_1 = sigmoid(%sigmoid) ; %sigmoid_2 = sigmoid(%sigmoid_1)
    // with anchor = the pattern's relu, nodes_map {relu: relu_1, x: sigmoid} for the second
    // match and replacements [sigmoid_1]
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r0 = f(&mut g, "relu", vec![x.into()]);
    let r1 = f(&mut g, "relu", vec![r0.into()]);
    let r2 = f(&mut g, "relu", vec![r1.into()]);
    g.output(r2.into()).unwrap();
    let pattern = unary("relu");
    let p_x = pattern.iter().next().unwrap().id();
    let p_relu = pattern.iter().nth(1).unwrap().id();
    let done =
        replace_pattern_with_filters(&mut g, &pattern, Replacement::Graph(&unary("sigmoid")), &[], false).unwrap();
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%sigmoid : [num_users=1] = call_function[target=sigmoid](args = (%x,), kwargs = {})",
            "%sigmoid_1 : [num_users=1] = call_function[target=sigmoid](args = (%sigmoid,), kwargs = {})",
            "%sigmoid_2 : [num_users=1] = call_function[target=sigmoid](args = (%sigmoid_1,), kwargs = {})",
            "return sigmoid_2",
        ]
    );
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|m| m.anchor == p_relu));
    assert_eq!(done[1].nodes_map[&p_relu], r1);
    assert_eq!(done[1].nodes_map[&p_x], done[0].replacements[0]);
    assert_eq!(done[1].placeholder_nodes, [Argument::Node(done[0].replacements[0])]);
    assert_eq!(g.node(done[1].replacements[0]).unwrap().name(), "sigmoid_1");
}

fn add_pattern(second: Option<Argument>) -> Graph {
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let c = match second {
        Some(lit) => lit,
        None => p.placeholder("c").unwrap().into(),
    };
    let a = f(&mut p, "add", vec![x.into(), c]);
    p.output(a.into()).unwrap();
    p
}

fn add_graph(lit: Argument) -> (Graph, NodeId) {
    let mut g = Graph::new();
    let x = g.placeholder("a").unwrap();
    let a = f(&mut g, "add", vec![x.into(), lit]);
    g.output(a.into()).unwrap();
    (g, x)
}

#[test]
fn placeholders_bind_literals_and_lists() {
    // FX: pattern (x, c) -> torch.add(x, c) on torch.add(a, 3): placeholder_nodes == [a, 3]
    let (g, a) = add_graph(Argument::Int(3));
    let found = SubgraphMatcher::new(&add_pattern(None)).unwrap().match_all(&g).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].placeholder_nodes, [Argument::Node(a), Argument::Int(3)]);
    // FX: pattern xs -> torch.cat(xs) on torch.cat([a, b]): placeholder_nodes == [[a, b]]
    let mut p = Graph::new();
    let xs = p.placeholder("xs").unwrap();
    let c = f(&mut p, "cat", vec![xs.into()]);
    p.output(c.into()).unwrap();
    let mut g = Graph::new();
    let (a, b) = (g.placeholder("a").unwrap(), g.placeholder("b").unwrap());
    let c = f(&mut g, "cat", vec![Argument::list([a.into(), b.into()])]);
    g.output(c.into()).unwrap();
    let found = SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap();
    assert_eq!(found[0].placeholder_nodes, [Argument::list([a.into(), b.into()])]);
    // FX: pattern (x, c) -> add(mul(x, c), c) matches add(mul(a, 2), 2) ([a, 2]) but not
    // add(mul(a, 2), 3): one placeholder binds one value
    let mut p = Graph::new();
    let (x, c) = (p.placeholder("x").unwrap(), p.placeholder("c").unwrap());
    let m = f(&mut p, "mul", vec![x.into(), c.into()]);
    let s = f(&mut p, "add", vec![m.into(), c.into()]);
    p.output(s.into()).unwrap();
    for (second, want) in [(2, 1), (3, 0)] {
        let mut g = Graph::new();
        let a = g.placeholder("a").unwrap();
        let m = f(&mut g, "mul", vec![a.into(), Argument::Int(2)]);
        let s = f(&mut g, "add", vec![m.into(), Argument::Int(second)]);
        g.output(s.into()).unwrap();
        let found = SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap();
        assert_eq!(found.len(), want, "add(mul(a, 2), {second})");
        if want == 1 {
            assert_eq!(found[0].placeholder_nodes, [Argument::Node(a), Argument::Int(2)]);
        }
    }
    // FX: pattern x -> add(x, x) does not match add(a, b), nor pattern (x, y) -> add(x, y) add(a, a)
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let s = f(&mut p, "add", vec![x.into(), x.into()]);
    p.output(s.into()).unwrap();
    let mut g = Graph::new();
    let (a, b) = (g.placeholder("a").unwrap(), g.placeholder("b").unwrap());
    let s = f(&mut g, "add", vec![a.into(), b.into()]);
    g.output(s.into()).unwrap();
    assert!(SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap().is_empty());
    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let s = f(&mut g, "add", vec![a.into(), a.into()]);
    g.output(s.into()).unwrap();
    assert!(SubgraphMatcher::new(&add_pattern(None)).unwrap().match_all(&g).unwrap().is_empty());
}

#[test]
fn literals_match_by_type_and_value_unless_ignored() {
    // FX: pattern add(x, 1) on add(a, 5): 0 matches; with ignore_literals=True: 1.
    // pattern add(x, 5.0) on add(a, 5): 0 matches (an int is not a float)
    let (g, _) = add_graph(Argument::Int(5));
    let one = add_pattern(Some(Argument::Int(1)));
    let strict = SubgraphMatcher::new(&one).unwrap();
    assert!(strict.match_all(&g).unwrap().is_empty());
    let loose = SubgraphMatcher::new(&one).unwrap().ignore_literals(true);
    assert_eq!(loose.match_all(&g).unwrap().len(), 1);
    let five_f = add_pattern(Some(Argument::Float(5.0)));
    let float = SubgraphMatcher::new(&five_f).unwrap();
    assert!(float.match_all(&g).unwrap().is_empty());
    assert_eq!(SubgraphMatcher::new(&add_pattern(Some(Argument::Int(5)))).unwrap().match_all(&g).unwrap().len(), 1);
    // the rewriter passes ignore_literals on
    let (mut g, _) = add_graph(Argument::Int(5));
    let p = add_pattern(Some(Argument::Int(1)));
    // no match without ignore_literals: nothing is replaced (FX checks arities per match)
    let none = replace_pattern_with_filters(&mut g, &p, Replacement::Graph(&sub_of_placeholders()), &[], false);
    assert!(none.unwrap().is_empty());
    let done = replace_pattern_with_filters(&mut g, &p, Replacement::Graph(&unary("neg")), &[], true).unwrap();
    assert_eq!(done.len(), 1);
    assert!(g.to_string().contains("call_function[target=neg](args = (%a,)"));
}

fn sub_of_placeholders() -> Graph {
    let mut r = Graph::new();
    let (x, c) = (r.placeholder("x").unwrap(), r.placeholder("c").unwrap());
    let s = f(&mut r, "sub", vec![x.into(), c.into()]);
    r.output(s.into()).unwrap();
    r
}

#[test]
fn keyword_and_positional_arguments_are_normalised_by_schema() {
    // FX (aten OpOverload targets): pattern aten.leaky_relu(x) matches aten.leaky_relu(x, 0.01),
    // the schema's default written out; not leaky_relu(x, negative_slope=0.2)
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let l = p.call_function(Target::op("leaky_relu").unwrap(), vec![x.into()]).unwrap();
    p.output(l.into()).unwrap();
    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let l1 = g.call_function(Target::op("leaky_relu").unwrap(), vec![a.into(), Argument::Float(0.01)]).unwrap();
    let mut kw = Kwargs::new();
    kw.insert("negative_slope".into(), Argument::Float(0.2));
    let l2 = g.call_function_with(Target::op("leaky_relu").unwrap(), vec![l1.into()], kw).unwrap();
    let mut kw = Kwargs::new();
    kw.insert("negative_slope".into(), Argument::Float(0.01));
    let l3 = g.call_function_with(Target::op("leaky_relu").unwrap(), vec![l2.into()], kw).unwrap();
    g.output(l3.into()).unwrap();
    let found = SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap();
    assert_eq!(found.iter().map(|m| m.returning_nodes[0]).collect::<Vec<_>>(), [l1, l3]);
}

#[test]
fn filters_and_replacement_callbacks() {
    // FX: match_filters drop matches; replacement_callback builds one replacement per match
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let a = f(&mut g, "add", vec![x.into(), Argument::Int(1)]);
    let b = f(&mut g, "add", vec![a.into(), Argument::Int(2)]);
    let c = f(&mut g, "add", vec![b.into(), Argument::Int(3)]);
    g.output(c.into()).unwrap();
    let p = add_pattern(None);
    let not_two = |m: &InternalMatch, _: &Graph, _: &Graph| m.placeholder_nodes[1] != Argument::Int(2);
    // odd constants become sub, built per match from the bound literal
    let callback = |m: &InternalMatch, _: &Graph, _: &Graph| -> ferrofx_fx::Result<Graph> {
        let mut r = Graph::new();
        let (x, _c) = (r.placeholder("x").unwrap(), r.placeholder("c").unwrap());
        let lit = match &m.placeholder_nodes[1] {
            Argument::Int(k) => Argument::Int(k * 10),
            other => other.clone(),
        };
        let s = r.call_function(Target::named("sub"), vec![x.into(), lit])?;
        r.output(s.into())?;
        Ok(r)
    };
    let done = replace_pattern_with_filters(&mut g, &p, Replacement::Callback(&callback), &[&not_two], false).unwrap();
    assert_eq!(done.len(), 2);
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%sub : [num_users=1] = call_function[target=sub](args = (%x, 10), kwargs = {})",
            "%add_1 : [num_users=1] = call_function[target=add](args = (%sub, 2), kwargs = {})",
            "%sub_1 : [num_users=1] = call_function[target=sub](args = (%add_1, 30), kwargs = {})",
            "return sub_1",
        ]
    );
}

#[derive(Module)]
struct Scaled {
    weight: Tensor,
}

impl Module for Scaled {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        functional::relu(&(x * &self.weight)?)
    }
}

#[derive(Module)]
struct Pat {
    w: Tensor,
}

impl Module for Pat {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        functional::relu(&(x * &self.w)?)
    }
}

#[derive(Module)]
struct Rep {
    scale: Tensor,
    lin: Linear,
}

impl Module for Rep {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        self.lin.call(&functional::sigmoid(&(x * &self.scale)?)?)
    }
}

#[test]
fn get_attr_matches_by_kind_and_module_replacement_copies_attributes() {
    // FX: replace_pattern(gm(relu(x * self.weight)), P(relu(x * self.w)), R(lin(sigmoid(x * self.scale))))
    // gives 1 match and
    //   %scale = get_attr[target=scale] ; %mul_1 = mul(%x, %scale) ; %sigmoid = sigmoid(%mul_1)
    //   %lin = call_module[target=lin](args = (%sigmoid,)) ; return lin
    // named_parameters: weight, scale, lin.weight, lin.bias (the unused `weight` stays: FX's
    // delete_all_unused_submodules deletes modules only); gm.scale is a copy of R's
    let mut gm = symbolic_trace(&Scaled { weight: Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap() }).unwrap();
    let pattern = symbolic_trace(&Pat { w: Tensor::from_vec(vec![0.0f32; 3], &[3]).unwrap() }).unwrap();
    let rep = Rep { scale: Tensor::from_vec(vec![7.0f32, 7.0], &[2]).unwrap(), lin: Linear::new(2, 2, true).unwrap() };
    let rgm = symbolic_trace(&rep).unwrap();
    let done = replace_pattern_in_module(&mut gm, pattern.graph(), &rgm, &[], false).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(
        lines(gm.graph()),
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%scale : [num_users=1] = get_attr[target=scale]",
            "%mul_1 : [num_users=1] = call_function[target=mul](args = (%x, %scale), kwargs = {})",
            "%sigmoid : [num_users=1] = call_function[target=sigmoid](args = (%mul_1,), kwargs = {})",
            "%lin : [num_users=1] = call_module[target=lin](args = (%sigmoid,), kwargs = {})",
            "return lin",
        ]
    );
    let mut names: Vec<String> = gm.named_parameters().into_iter().map(|(n, _)| n).collect();
    names.sort();
    assert_eq!(names, ["lin.bias", "lin.weight", "scale", "weight"]);
    // the copied attribute is a copy: changing the replacement's does not change the result
    let x = Tensor::from_vec(vec![0.5f32, -1.0], &[1, 2]).unwrap();
    let want = rep.forward(&x).unwrap().to_vec_f64().unwrap();
    rep.scale.fill_(0.0).unwrap();
    assert_eq!(gm.forward(&x).unwrap().to_vec_f64().unwrap(), want);
}

#[test]
fn rewriter_misuse_is_an_error_not_a_panic() {
    // FX: "SubgraphMatcher cannot be initialized with an empty pattern"
    let e = SubgraphMatcher::new(&Graph::new()).err().unwrap().to_string();
    assert!(e.contains("empty pattern"), "{e}");
    // a replacement returning a literal where a node was matched
    let mut r = Graph::new();
    r.placeholder("x").unwrap();
    r.output(Argument::Int(1)).unwrap();
    let mut g = unary("relu");
    let e = replace_pattern(&mut g, &unary("relu"), &r).unwrap_err().to_string();
    assert!(e.contains("a node's uses can only be rerouted to a node"), "{e}");
    g.lint().unwrap();
    // a replacement returning a placeholder bound to a literal
    let (mut g, _) = add_graph(Argument::Int(3));
    let mut r = Graph::new();
    r.placeholder("x").unwrap();
    let c = r.placeholder("c").unwrap();
    r.output(c.into()).unwrap();
    let e = replace_pattern(&mut g, &add_pattern(None), &r).unwrap_err().to_string();
    assert!(e.contains("a node's uses can only be rerouted to a node"), "{e}");
    g.lint().unwrap();
}
