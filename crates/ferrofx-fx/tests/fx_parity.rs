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

// ----- nested module namespaces -----

#[derive(Module)]
struct Inner {
    b: Linear,
    #[module(buffer)]
    buf: Tensor,
}

impl Module for Inner {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        &self.b.call(x)? + &self.buf
    }
}

#[derive(Module)]
#[module(name = "M")]
struct Nested {
    a: Inner,
    c: ReLU,
}

impl Module for Nested {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        self.c.call(&(&self.a.b.call(x)? + &self.a.buf)?)
    }
}

fn nested() -> Nested {
    Nested {
        a: Inner { b: Linear::new(2, 2, true).unwrap(), buf: Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap() },
        c: ReLU::new(),
    }
}

fn err<T>(r: ferrofx_core::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn nested_namespaces_get_submodule_parameter_and_buffer() {
    // FX (M: a = nn.Module() holding b = Linear and the buffer buf; c = ReLU):
    //   %a_b = call_module[target=a.b] ; %a_buf = get_attr[target=a.buf] ; %add ; %c ; return c
    //   type(gm.get_submodule("a")) is nn.Module; named_modules: '', a, a.b, c
    let gm = symbolic_trace(&nested()).unwrap();
    assert_eq!(
        lines(gm.graph()),
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%a_b : [num_users=1] = call_module[target=a.b](args = (%x,), kwargs = {})",
            "%a_buf : [num_users=1] = get_attr[target=a.buf]",
            "%add : [num_users=1] = call_function[target=add](args = (%a_b, %a_buf), kwargs = {})",
            "%c : [num_users=1] = call_module[target=c](args = (%add,), kwargs = {})",
            "return c",
        ]
    );
    assert_eq!(gm.get_submodule("a").unwrap().type_name(), "Module");
    assert_eq!(gm.get_submodule("a.b").unwrap().type_name(), "Linear");
    assert_eq!(gm.get_submodule("").unwrap().type_name(), "GraphModule");
    let a = gm.get_submodule("a").unwrap().as_any().downcast_ref::<ferrofx_fx::ModuleContainer>().unwrap();
    assert_eq!(a.children(), ["b", "buf"]);
    // FX's AttributeError texts, each case run on 2.15:
    assert!(err(gm.get_parameter("a.buf")).contains("`buf` is not an nn.Parameter"));
    assert!(err(gm.get_buffer("a.b.weight")).contains("`weight` is not a buffer"));
    assert!(err(gm.get_parameter("a.zz")).contains("Module has no attribute `zz`"));
    assert!(err(gm.get_submodule("a.zz")).contains("Module has no attribute `zz`"));
    assert!(err(gm.get_submodule("a.b.weight")).contains("`weight` is not an nn.Module"));
    assert!(err(gm.get_parameter("a.b")).contains("`b` is not an nn.Parameter"));
    assert!(err(gm.get_buffer("a.b")).contains("`b` is not a buffer"));
    // the root's class name: "M has no attribute `nonexist`"
    assert!(err(gm.get_submodule("nonexist")).contains("M has no attribute `nonexist`"));
    assert_eq!(gm.get_buffer("a.buf").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    assert_eq!(gm.get_parameter("a.b.weight").unwrap().shape(), &[2, 2]);
    // a container computes nothing
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]).unwrap();
    assert!(err(gm.get_submodule("a").unwrap().forward(&x)).contains("intermediate container"));
}

#[test]
fn add_delete_and_delete_all_unused_submodules_as_fx() {
    // FX 2.15 on the same module:
    //   add_submodule("x.y.z", ReLU()) -> True ; add_submodule("a.b.q", ReLU()) -> True ;
    //   add_submodule("a.buf.q", ReLU()) -> False
    //   named_modules: '', a, a.b, a.b.q, c, x, x.y, x.y.z
    //   delete_submodule: "x.y" -> True, "nope" -> False, "a.buf" -> False, "a.b.weight" -> False
    //   named_modules: '', a, a.b, a.b.q, c, x
    //   add_submodule("u.v", ReLU()); delete_all_unused_submodules()
    //   named_modules: '', a, a.b, a.b.q, c   (a.b.q stays: it is under the called a.b)
    let mut gm = symbolic_trace(&nested()).unwrap();
    assert!(gm.add_submodule("x.y.z", Box::new(ReLU::new())).unwrap());
    assert!(gm.add_submodule("a.b.q", Box::new(ReLU::new())).unwrap());
    assert!(!gm.add_submodule("a.buf.q", Box::new(ReLU::new())).unwrap());
    assert!(gm.add_submodule("a..q", Box::new(ReLU::new())).is_err());
    for p in ["x", "x.y"] {
        assert_eq!(gm.get_submodule(p).unwrap().type_name(), "Module", "{p}");
    }
    assert_eq!(gm.get_submodule("x.y.z").unwrap().type_name(), "ReLU");
    assert!(gm.delete_submodule("x.y"));
    assert!(!gm.delete_submodule("nope"));
    assert!(!gm.delete_submodule("a.buf"));
    assert!(!gm.delete_submodule("a.b.weight"));
    assert!(gm.get_submodule("x").is_ok(), "the parent container stays, empty");
    assert!(err(gm.get_submodule("x.y")).contains("Module has no attribute `y`"));
    assert!(gm.add_submodule("u.v", Box::new(ReLU::new())).unwrap());
    assert_eq!(gm.delete_all_unused_submodules(), 3); // x, u, u.v
    for p in ["a", "a.b", "a.b.q", "c"] {
        assert!(gm.get_submodule(p).is_ok(), "{p}");
    }
    for p in ["x", "u", "u.v"] {
        assert!(gm.get_submodule(p).is_err(), "{p}");
    }
    // the module still runs, and the buffer under the used container is kept
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]).unwrap();
    gm.forward(&x).unwrap();
    assert!(gm.get_buffer("a.buf").is_ok());
}

#[test]
fn lint_checks_targets_against_the_owning_graph_module() {
    // FX 2.15, a node inserted before the output of the traced M, then graph.lint():
    let cases = [
        (
            Opcode::CallModule,
            "nonexist",
            Some("Node nonexist target nonexist references nonexistent attribute nonexist of "),
        ),
        (Opcode::CallModule, "a.buf", Some("Node a_buf_1 target a.buf buf of a does not reference an nn.Module")),
        (
            Opcode::CallModule,
            "a.b.weight",
            Some("Node a_b_weight target a.b.weight weight of a.b does not reference an nn.Module"),
        ),
        (
            Opcode::CallModule,
            "a.nope.q",
            Some("Node a_nope_q target a.nope.q references nonexistent attribute nope of a"),
        ),
        (Opcode::GetAttr, "a.nope", Some("Node a_nope target a.nope references nonexistent attribute nope of a")),
        (Opcode::GetAttr, "a.b.weight", None),
        // FX accepts a get_attr of a module; a ferrofx get_attr reads a tensor (documented)
        (
            Opcode::GetAttr,
            "a.b",
            Some("Node a_b_1 target a.b b of a does not reference an nn.Parameter, buffer or tensor constant"),
        ),
    ];
    for (op, target, want) in cases {
        let mut gm = symbolic_trace(&nested()).unwrap();
        let out = gm.graph().output_node().unwrap();
        let x = gm.graph().first().unwrap();
        let args = if op == Opcode::CallModule { vec![x.into()] } else { vec![] };
        gm.graph_mut()
            .inserting_before(Some(out))
            .unwrap()
            .create_node(op, Target::Str(target.into()), args, Kwargs::new(), None, None)
            .unwrap();
        match want {
            None => gm.lint().unwrap(),
            Some(want) => {
                let e = err(gm.lint());
                assert!(e.contains(want), "{target}: {e}");
                // recompiling (what every forward does first) reports the same problem
                let e = err(gm.recompile());
                assert!(e.contains(want), "{target}: {e}");
            }
        }
    }
}

// ----- concrete_args -----

#[derive(Module)]
struct Flagged {}

impl Module for Flagged {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        x.relu()
    }
    fn forward_values(&self, v: &[ferrofx_core::Value]) -> ferrofx_core::Result<Vec<ferrofx_core::Value>> {
        use ferrofx_core::Value;
        let x = v[0].as_tensor().unwrap();
        let y = match &v[1] {
            Value::Bool(true) => x.relu()?,
            Value::Bool(false) => x.neg()?,
            Value::Int(k) => (x * *k as f64)?,
            Value::None => x.clone(),
            Value::Tensor(t) => (x + t)?,
            other => panic!("{other:?}"),
        };
        Ok(vec![y.into()])
    }
}

#[test]
fn concrete_args_make_guarded_placeholders() {
    use ferrofx_core::Value;
    use ferrofx_fx::Tracer;
    // FX: symbolic_trace(M(), concrete_args={"flag": True}) gives
    //   %x = placeholder[target=x] ; %flag_1 = placeholder[target=flag_1]
    //   %eq = call_function[target=operator.eq](args = (%flag_1, True))
    //   %_assert = call_function[target=torch._assert](args = (%eq, flag has been specialized to
    //     have value True but got another value)) ; %relu = x.relu() ; return relu
    // and gm(x, False) raises AssertionError("flag has been specialized to have value True but
    // got another value")
    let tracer = || Tracer::new().input_names(&["x", "flag"]);
    let gm = tracer().concrete_arg(1, true).trace(&Flagged {}, 2).unwrap();
    assert_eq!(
        lines(gm.graph()),
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%flag_1 : [num_users=1] = placeholder[target=flag_1](default=True)",
            "%eq_scalar : [num_users=1] = call_function[target=eq_scalar](args = (%flag_1, True), kwargs = {})",
            "%_assert : [num_users=0] = call_function[target=_assert](args = (%eq_scalar, flag has been specialized to have value True but got another value), kwargs = {})",
            "%relu : [num_users=1] = call_method[target=relu](args = (%x,), kwargs = {})",
            "return relu",
        ]
    );
    let x = Tensor::from_vec(vec![-1.0f32, 2.0], &[2]).unwrap();
    let run = |gm: &ferrofx_fx::GraphModule, flag: Value| gm.forward_values(&[x.clone().into(), flag]);
    assert_eq!(run(&gm, Value::Bool(true)).unwrap()[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), [0.0, 2.0]);
    let e = err(run(&gm, Value::Bool(false)));
    assert!(e.contains("flag has been specialized to have value True but got another value"), "{e}");
    // the default is the concrete value (Rust has no signature default to take)
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), [0.0, 2.0]);
    // the guards survive dead code elimination and a save/load round trip
    let mut gm = gm;
    assert!(!gm.eliminate_dead_code().unwrap());
    let loaded = ferrofx_fx::GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
    assert!(err(run(&loaded, Value::Bool(false))).contains("specialized to have value True"));

    // FX, concrete_args={"y": None}: %y_1 = placeholder[target=y_1](default=None) ;
    //   %_assert_is_none = call_function[target=_assert_is_none](args = (%y_1, y has been
    //   specialized to have value None but got another value))
    let gm = Tracer::new().input_names(&["x", "y"]).concrete_arg(1, Value::None).trace(&Flagged {}, 2).unwrap();
    assert!(lines(gm.graph()).contains(
        &"%_assert_is_none : [num_users=0] = call_function[target=_assert_is_none](args = (%y_1, y has been specialized to have value None but got another value), kwargs = {})".to_string()
    ));
    assert!(err(run(&gm, x.clone().into())).contains("y has been specialized to have value None"));
    run(&gm, Value::None).unwrap();

    // FX, concrete_args={"k": 2}: %eq = operator.eq(%k_1, 2) ; %mul = operator.mul(%x, 2)
    let gm = Tracer::new().input_names(&["x", "k"]).concrete_arg(1, Value::Int(2)).trace(&Flagged {}, 2).unwrap();
    assert!(gm.graph().to_string().contains("(args = (%k_1, 2)"));
    assert_eq!(run(&gm, Value::Int(2)).unwrap()[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), [-2.0, 4.0]);
    assert!(err(run(&gm, Value::Int(3))).contains("k has been specialized to have value 2"));

    // a tensor stays a constant with no placeholder (FX only warns that it cannot guard it)
    let c = Tensor::from_vec(vec![10.0f32, 10.0], &[2]).unwrap();
    let gm = Tracer::new().concrete_arg(1, c).trace(&Flagged {}, 2).unwrap();
    assert_eq!(targets(gm.graph(), Opcode::Placeholder), ["x"]);
}

// ----- tracer hooks -----

#[test]
fn create_node_hook_sees_every_node() {
    use ferrofx_fx::Tracer;
    // FX: a Tracer whose create_node sets n.meta["tag"] = 7 tags every node:
    //   {'x': 7, 'add': 7, 'mul': 7, 'attr_1': 7, 'add_1': 7, 'output': 7}
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::<String>::new()));
    let s = seen.clone();
    let gm = Tracer::new()
        .on_create_node(move |g, n| {
            s.borrow_mut().push(g.node(n).unwrap().name().to_string());
            g.meta_mut(n).unwrap().insert("tag", 7u32);
            Ok(())
        })
        .trace(&nested(), 1)
        .unwrap();
    assert_eq!(*seen.borrow(), ["x", "a_b", "a_buf", "add", "c", "output"]);
    assert!(gm.graph().iter().all(|n| n.meta().get::<u32>("tag") == Some(&7)));
    // an error from the hook ends the trace
    let e = err(Tracer::new()
        .on_create_node(|_, _| Err(ferrofx_core::Error::trace("hook", "no nodes today")))
        .trace(&nested(), 1));
    assert!(e.contains("no nodes today"), "{e}");
}

fn square_plus_one_meta(a: &[ferrofx_core::Value]) -> ferrofx_core::Result<ferrofx_core::op::MetaOutputs> {
    let t = a[0].as_tensor().unwrap();
    Ok(smallvec::smallvec![ferrofx_core::TensorMeta::contiguous(t.shape(), t.dtype())])
}

fn square_plus_one(a: &[ferrofx_core::Value]) -> ferrofx_core::Result<ferrofx_core::op::Outputs> {
    let x = a[0].as_tensor().unwrap();
    Ok(smallvec::smallvec![(&(x * x)? + 1.0)?])
}

static SQUARE_SCHEMA: &[ferrofx_core::op::ArgSpec] =
    &[ferrofx_core::op::ArgSpec::req("x", ferrofx_core::op::ArgType::Tensor)];

#[derive(Module)]
struct UsesWrapped {
    fc: Linear,
}

impl Module for UsesWrapped {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let f = ferrofx_fx::wrap::wrapped("parity_square_plus_one")?;
        f.call1(&self.fc.call(x)?)
    }
}

#[test]
fn wrapped_functions_are_call_function_leaves_that_save_and_load() {
    // FX: torch.fx.wrap("square_plus_one") makes the traced graph call it as one node:
    //   %fc = call_module[target=fc] ; %square_plus_one = call_function[target=square_plus_one]
    let f = ferrofx_fx::wrap("parity_square_plus_one", SQUARE_SCHEMA, square_plus_one_meta, square_plus_one).unwrap();
    // wrapping again is idempotent; another function under the name is refused
    assert_eq!(
        ferrofx_fx::wrap("parity_square_plus_one", SQUARE_SCHEMA, square_plus_one_meta, square_plus_one)
            .unwrap()
            .op()
            .name,
        f.op().name
    );
    assert!(ferrofx_fx::wrap(
        "parity_square_plus_one",
        SQUARE_SCHEMA,
        square_plus_one_meta,
        |_| Ok(Default::default())
    )
    .is_err());
    assert!(ferrofx_fx::wrap("relu", SQUARE_SCHEMA, square_plus_one_meta, square_plus_one).is_err());
    let m = UsesWrapped { fc: Linear::new(2, 2, true).unwrap() };
    let gm = symbolic_trace(&m).unwrap();
    assert_eq!(
        lines(gm.graph())[2],
        "%parity_square_plus_one : [num_users=1] = call_function[target=parity_square_plus_one](args = (%fc,), kwargs = {})"
    );
    let x = Tensor::from_vec(vec![0.5f32, -1.0], &[1, 2]).unwrap();
    let want = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    let loaded = ferrofx_fx::GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
    assert_eq!(loaded.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    // with example inputs the wrapped function's meta gives the shapes
    let gm = ferrofx_fx::trace_with_inputs(&m, &[x.clone().into()]).unwrap();
    let n = gm.graph().iter().find(|n| n.target().name() == "parity_square_plus_one").unwrap();
    assert_eq!(n.meta().tensor_meta.as_ref().unwrap().shape, vec![1, 2]);
    // a user function that is not a registry op is refused at save time, naming the fix
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = g.call_function(Target::function("my_python_fn"), vec![x.into()]).unwrap();
    g.output(r.into()).unwrap();
    let e = ferrofx_fx::serialize::graph_to_doc(&g).unwrap_err().to_string();
    assert!(e.contains("my_python_fn") && e.contains("register it as a custom op"), "{e}");
    // nor can a GraphModule run it
    let e = err(ferrofx_fx::GraphModule::from_parts(g, Default::default(), Default::default(), "M", false));
    assert!(e.contains("my_python_fn") && e.contains("not a registry op"), "{e}");
}

#[test]
fn trace_method_traces_another_method() {
    use ferrofx_fx::Tracer;
    // FX: Tracer with traced_func_name = "encode" traces encode instead of forward
    let m = nested();
    let gm =
        Tracer::new().trace_method(&m, 1, |v| Ok(vec![m.a.b.call(v[0].as_tensor().unwrap())?.tanh()?.into()])).unwrap();
    assert_eq!(targets(gm.graph(), Opcode::CallModule), ["a.b"]);
    assert_eq!(targets(gm.graph(), Opcode::CallMethod), ["tanh"]);
}

// ----- GraphModules as leaves -----

#[derive(Module)]
struct Outer {
    sub: ferrofx_fx::GraphModule,
    fc: Linear,
}

impl Module for Outer {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        self.fc.call(&self.sub.call(x)?)
    }
}

#[test]
fn graph_modules_are_traced_through_or_kept_as_leaves() {
    use ferrofx_fx::{GraphModule, Tracer};
    let inner =
        symbolic_trace(&Sequential::new().append(Linear::new(2, 2, true).unwrap()).append(ReLU::new())).unwrap();
    let m = Outer { sub: inner, fc: Linear::new(2, 2, true).unwrap() };
    let x = Tensor::from_vec(vec![0.5f32, -1.0], &[1, 2]).unwrap();
    let want = m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    // FX: a GraphModule is not a leaf by default: traced through, its modules called by path
    //   %sub_0 = call_module[target=sub.0] ; %sub_1 = call_module[target=sub.1] ; %fc
    let gm = symbolic_trace(&m).unwrap();
    assert_eq!(targets(gm.graph(), Opcode::CallModule), ["sub.0", "sub.1", "fc"]);
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    // FX: with is_leaf_module true for GraphModules: %sub = call_module[target=sub] ; %fc
    let gm = Tracer::new()
        .is_leaf_module(|m, _| m.is_builtin_leaf() || m.as_any().is::<GraphModule>())
        .trace(&m, 1)
        .unwrap();
    assert_eq!(targets(gm.graph(), Opcode::CallModule), ["sub", "fc"]);
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    assert_eq!(gm.get_submodule("sub.0").unwrap().type_name(), "Linear");
    // it saves and loads as a nested traced module
    let loaded = GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
    assert_eq!(loaded.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
}

// ----- dead code elimination (test_dce_pass.py) -----

#[derive(Module)]
struct Dce {
    attr_1: Tensor,
    #[module(skip)]
    case: u8,
}

impl Module for Dce {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        match self.case {
            // test_simple: a = x + 1; return x + self.attr_1
            0 => {
                let _a = (x + 1.0)?;
                x + &self.attr_1
            }
            // test_dead_chain: a = x + 1; b = a * 7; return x + self.attr_1
            1 => {
                let a = (x + 1.0)?;
                let _b = (&a * 7.0)?;
                x + &self.attr_1
            }
            // test_dead_getattr: a = x + 1; b = a * self.attr_1; return x + 11
            _ => {
                let a = (x + 1.0)?;
                let _b = (&a * &self.attr_1)?;
                x + 11.0
            }
        }
    }
}

#[test]
fn dead_code_elimination_as_test_dce_pass() {
    let x = Tensor::from_vec(vec![1.5f32], &[1]).unwrap();
    // FX test_simple after eliminate_dead_code() -> True:
    //   %x ; %attr_1 = get_attr[target=attr_1] ; %add_1 = add(%x, %attr_1) ; return add_1
    let want: [&[&str]; 3] = [
        &["%x", "%attr_1", "%add_1"],
        &["%x", "%attr_1", "%add_1"],
        // test_dead_getattr: the get_attr goes too
        &["%x", "%add_1"],
    ];
    for (case, want) in want.iter().enumerate() {
        let m = Dce { attr_1: Tensor::from_vec(vec![-0.9f32], &[1]).unwrap(), case: case as u8 };
        let mut gm = symbolic_trace(&m).unwrap();
        let before = gm.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert!(gm.eliminate_dead_code().unwrap(), "case {case}");
        let names: Vec<String> =
            lines(gm.graph()).iter().filter_map(|l| l.split(' ').next().map(str::to_string)).collect();
        assert_eq!(names[..names.len() - 1], want[..], "case {case}");
        assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), before);
        assert!(!gm.eliminate_dead_code().unwrap(), "a second pass finds nothing");
    }
    // test_dead_placeholder: x + 7 with an unused y: nothing removed; with a = y + 2 unused,
    // the add goes and the placeholder stays
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let r = f(&mut g, "add", vec![x.into(), 7.into()]);
    g.output(r.into()).unwrap();
    assert!(!g.eliminate_dead_code(None).unwrap());
    let a = g.inserting_before(Some(r)).unwrap().call_function(Target::named("add"), vec![y.into(), 2.into()]).unwrap();
    assert!(g.eliminate_dead_code(None).unwrap());
    assert!(!g.contains(a) && g.contains(y));
}

#[test]
fn dead_code_elimination_keeps_impure_nodes() {
    // test_keep_torch_assert: _assert(equal(a, a), "a must equal a") stays
    ferrofx_fx::assert_ops::register();
    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let eq = f(&mut g, "equal", vec![a.into(), a.into()]);
    let ok = f(&mut g, "_assert", vec![eq.into(), Argument::Str("a must equal a".into())]);
    let r = f(&mut g, "mul", vec![a.into(), 2.into()]);
    g.output(r.into()).unwrap();
    assert!(!g.eliminate_dead_code(None).unwrap());
    assert!(g.contains(ok) && g.contains(eq));
    // test_impure_nodes_args: the in-place add_(a, 1) stays
    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let inplace = f(&mut g, "add_", vec![a.into(), 1.into()]);
    let r = f(&mut g, "mul", vec![a.into(), 2.into()]);
    g.output(r.into()).unwrap();
    assert!(!g.eliminate_dead_code(None).unwrap());
    assert!(g.contains(inplace));
    // test_impure_kwargs: add(b, b, out=a, alpha=2) writes into a: it stays (and so does b)
    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let b = f(&mut g, "add", vec![a.into(), 1.into()]);
    let mut kw = Kwargs::new();
    kw.insert("out".into(), a.into());
    kw.insert("alpha".into(), 2.into());
    let out = g.call_function_with(Target::named("add"), vec![b.into(), b.into()], kw).unwrap();
    g.output(a.into()).unwrap();
    assert!(!g.eliminate_dead_code(None).unwrap());
    assert!(g.contains(out) && g.contains(b));
    // test_impure_custom: a callback calling add impure keeps b and c
    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let b = f(&mut g, "add", vec![a.into(), 1.into()]);
    let c = f(&mut g, "add", vec![b.into(), b.into()]);
    g.output(a.into()).unwrap();
    let custom = |n: &ferrofx_fx::Node<'_>| n.is_impure() || n.target().name() == "add";
    assert!(!g.eliminate_dead_code(Some(&custom)).unwrap());
    assert!(g.contains(b) && g.contains(c));
    // test_keep_module_with_side_effects: a ReLU flagged impure (_is_impure) stays
    let m = nested();
    let mut gm = symbolic_trace(&m).unwrap();
    let c = gm.graph().iter().find(|n| n.name() == "c").unwrap().id();
    let x = gm.graph().first().unwrap();
    let out = gm.graph().output_node().unwrap();
    gm.graph_mut().update_arg(out, 0, x.into()).unwrap();
    // FX: expect_dce_changes=False: the flagged module and everything it uses stay
    gm.set_module_impure("c", true).unwrap();
    assert!(!gm.eliminate_dead_code().unwrap());
    assert!(gm.graph().contains(c));
    // unflagged, the whole dead chain goes
    gm.set_module_impure("c", false).unwrap();
    assert!(gm.eliminate_dead_code().unwrap());
    assert!(!gm.graph().contains(c));
    assert_eq!(gm.graph().len(), 2);
    assert!(err(gm.set_module_impure("nope", true)).contains("has no attribute `nope`"));
}

#[test]
fn dead_code_elimination_lints_first() {
    // FX: eliminate_dead_code() calls self.lint() first; an owner lacking a target fails it
    struct NoModules;
    impl ferrofx_fx::TargetResolver for NoModules {
        fn has_attribute(&self, _: &str) -> bool {
            false
        }
        fn has_module(&self, _: &str) -> bool {
            false
        }
    }
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    g.call_module("gone", vec![x.into()]).unwrap();
    g.output(x.into()).unwrap();
    g.set_owner(Some(std::sync::Arc::new(NoModules)));
    let e = g.eliminate_dead_code(None).unwrap_err().to_string();
    assert!(e.contains("gone"), "{e}");
    assert_eq!(g.len(), 3, "nothing erased");
}

// ----- Interpreter -----

struct Recorder<'m> {
    gm: &'m ferrofx_fx::GraphModule,
    seen: Vec<(String, usize)>,
}

impl<'m> ferrofx_fx::Interpreter<'m> for Recorder<'m> {
    fn module(&self) -> &'m ferrofx_fx::GraphModule {
        self.gm
    }
    fn run_node(
        &mut self,
        node: ferrofx_fx::Node<'m>,
        env: &ferrofx_fx::Env,
    ) -> ferrofx_core::Result<ferrofx_fx::NodeValue> {
        self.seen.push((node.name().to_string(), env.len()));
        ferrofx_fx::interpreter::default_run_node(self, node, env)
    }
}

#[derive(Module)]
struct Chain {}

impl Module for Chain {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        &x.relu()? + 1.0
    }
}

#[test]
fn interpreter_runs_every_node_with_initial_env_boxed_run_and_gc() {
    use ferrofx_core::Value;
    use ferrofx_fx::{Env, Interpreter, NodeValue};
    let gm = symbolic_trace(&Chain {}).unwrap();
    let x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
    let one = |v: Vec<Value>| v[0].as_tensor().unwrap().to_vec::<f32>().unwrap();
    // FX: run_node sees placeholder x, call_method relu, call_function add, output output;
    // with garbage collection each node finds only its live inputs in env
    let mut r = Recorder { gm: &gm, seen: vec![] };
    assert_eq!(one(r.run(&[x.clone().into()]).unwrap()), [2.0]);
    assert_eq!(r.seen, [("x".into(), 0), ("relu".into(), 1), ("add".into(), 1), ("output".into(), 1)]);
    // FX: initial_env={relu: tensor([0.])} skips relu: run_node sees x, add and output
    let relu = gm.graph().iter().find(|n| n.name() == "relu").unwrap().id();
    let mut r = Recorder { gm: &gm, seen: vec![] };
    let env = Env::with_values([(relu, NodeValue::One(Tensor::from_vec(vec![0.0f32], &[1]).unwrap().into()))]);
    assert_eq!(one(r.run_with_env(&[x.clone().into()], env).unwrap()), [1.0]);
    assert_eq!(r.seen.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["x", "add", "output"]);
    // FX: boxed_run([x]) returns tensor([2.]) and clears the list
    let mut args = vec![Value::from(x.clone())];
    assert_eq!(one(ferrofx_fx::DefaultInterpreter(&gm).boxed_run(&mut args).unwrap()), [2.0]);
    assert!(args.is_empty());
    // FX: run() without the input: "Expected positional argument for parameter x, but one was
    // not passed in!"
    let e = err(ferrofx_fx::DefaultInterpreter(&gm).run(&[]));
    assert!(e.contains("Expected positional argument for parameter x, but one was not passed in!"), "{e}");
    // FX: Interpreter(gm, graph=g2) runs g2 (neg of its input) instead: tensor([-1.])
    let mut g2 = Graph::new();
    let a = g2.placeholder("a").unwrap();
    let n = f(&mut g2, "neg", vec![a.into()]);
    g2.output(n.into()).unwrap();
    assert_eq!(
        one(ferrofx_fx::DefaultInterpreter(&gm).run_graph(&g2, vec![x.clone().into()], Env::new()).unwrap()),
        [-1.0]
    );
}

// ----- Transformer -----

#[test]
fn transformer_names_nodes_from_their_new_targets_and_keeps_meta() {
    use ferrofx_fx::{Node, Transformer};
    // FX: a Transformer turning torch.relu into torch.sigmoid on relu(x) + 1 gives
    //   %x ; %sigmoid = call_function[target=torch.sigmoid](args = (%x,)) ; %add ; return add
    struct ToSigmoid;
    impl Transformer for ToSigmoid {
        fn call_method(
            &mut self,
            g: &mut Graph,
            node: Node<'_>,
            args: Vec<Argument>,
            kwargs: Kwargs,
        ) -> ferrofx_core::Result<Argument> {
            let t = if node.target().name() == "relu" { Target::Str("sigmoid".into()) } else { node.target().clone() };
            ferrofx_fx::transformer::emit(g, node, t, args, kwargs)
        }
    }
    let mut gm = symbolic_trace(&Chain {}).unwrap();
    let ids: Vec<NodeId> = gm.graph().node_ids();
    for id in ids {
        let name = gm.graph().node(id).unwrap().name().to_string();
        gm.graph_mut().meta_mut(id).unwrap().insert("tag", name);
    }
    let new = ToSigmoid.transform(&gm).unwrap();
    assert_eq!(
        lines(new.graph()),
        [
            "%x : [num_users=1] = placeholder[target=x]",
            "%sigmoid : [num_users=1] = call_method[target=sigmoid](args = (%x,), kwargs = {})",
            "%add : [num_users=1] = call_function[target=add](args = (%sigmoid, 1.0), kwargs = {})",
            "return add",
        ]
    );
    let sigmoid = new.graph().iter().find(|n| n.name() == "sigmoid").unwrap();
    assert_eq!(sigmoid.meta().get::<String>("tag").map(String::as_str), Some("relu"));
}

// ----- insert_arg and find_nodes -----

#[test]
fn insert_arg_and_find_nodes_errors_as_fx() {
    // FX on the traced M: add.insert_arg(0, 5) -> (5, a_b, a_buf); insert_arg(3, x) ->
    // (5, a_b, a_buf, x) and x.users gains add; insert_arg(-1 | 10, x): AssertionError
    // "insert_args index must be between 0 and len(self.args), got 10"
    let gm = symbolic_trace(&nested()).unwrap();
    let mut g = gm.graph().deep_copy().unwrap().0;
    let add = g.iter().find(|n| n.name() == "add").unwrap().id();
    let x = g.first().unwrap();
    let (a_b, a_buf) = (g.node(add).unwrap().args()[0].clone(), g.node(add).unwrap().args()[1].clone());
    g.insert_arg(add, 0, 5.into()).unwrap();
    assert_eq!(g.node(add).unwrap().args(), &[Argument::Int(5), a_b.clone(), a_buf.clone()]);
    g.insert_arg(add, 3, x.into()).unwrap();
    assert_eq!(g.node(add).unwrap().args(), &[Argument::Int(5), a_b, a_buf, x.into()]);
    assert!(g.node(x).unwrap().users().any(|u| u == add));
    let e = g.insert_arg(add, 10, x.into()).unwrap_err().to_string();
    assert!(e.contains("insert_arg index must be between 0 and len(args) = 4, got 10"), "{e}");
    g.lint().unwrap();
    // FX find_nodes: op="call_function" without a target: AssertionError("target must not be
    // None for call_function op"); a string target for call_function finds []; placeholder x
    // finds [x]; call_module c finds [c]; get_attr with a callable target finds []
    let g = gm.graph();
    let x = g.first().unwrap();
    let e = g.find_nodes(Opcode::CallFunction, None, true).unwrap_err().to_string();
    assert!(e.contains("target must not be None for call_function op"), "{e}");
    assert!(g.find_nodes(Opcode::CallFunction, Some(&Target::Str("relu".into())), true).unwrap().is_empty());
    assert_eq!(g.find_nodes(Opcode::Placeholder, Some(&"x".into()), true).unwrap(), [x]);
    let c = g.iter().find(|n| n.name() == "c").unwrap().id();
    assert_eq!(g.find_nodes(Opcode::CallModule, Some(&"c".into()), true).unwrap(), [c]);
    assert!(g.find_nodes(Opcode::GetAttr, Some(&Target::named("relu")), true).unwrap().is_empty());
    // an unknown opcode is refused where FX's string op finds nothing: Opcode is an enum
    assert!("bogus".parse::<Opcode>().is_err());
}

#[test]
fn module_level_replacement_removes_the_modules_it_no_longer_calls() {
    // FX: replace_pattern(gm, pattern calling self.1 (the ReLU), replacement torch.relu) on
    // symbolic_trace(Sequential(Linear, ReLU)) leaves %_0 = call_module[target=0] ;
    // %relu = torch.relu(%_0), and _replace_attributes' delete_all_unused_submodules drops `1`
    let seq = Sequential::new().append(Linear::new(2, 2, true).unwrap()).append(ReLU::new());
    let mut gm = symbolic_trace(&seq).unwrap();
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let m = p.call_module("1", vec![x.into()]).unwrap();
    p.output(m.into()).unwrap();
    let rep =
        ferrofx_fx::GraphModule::from_parts(unary("relu"), Default::default(), Default::default(), "R", false).unwrap();
    let x = Tensor::from_vec(vec![0.5f32, -1.0], &[1, 2]).unwrap();
    let want = seq.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let done = replace_pattern_in_module(&mut gm, &p, &rep, &[], false).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(targets(gm.graph(), Opcode::CallModule), ["0"]);
    assert_eq!(gm.leaf_modules().keys().collect::<Vec<_>>(), ["0"]);
    assert!(err(gm.get_submodule("1")).contains("has no attribute `1`"));
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
}

// ----- advanced indexing is a registry op: traced, run, saved -----

/// `y = x.index_put((None, cols), 1.0); return y[rows] * 2` with constant index tensors.
#[derive(Module)]
struct SetItem {
    #[module(skip)]
    cols: Tensor,
    #[module(skip)]
    rows: Tensor,
}

impl Module for SetItem {
    fn forward(&self, x: &Tensor) -> ferrofx_core::Result<Tensor> {
        let one = Tensor::from_vec(vec![1.0f32], &[])?;
        let y = x.index_put(&[None, Some(&self.cols)], &one, false)?;
        &y.index(&[Some(&self.rows)])? * 2.0
    }
}

#[test]
fn index_put_and_index_trace_run_and_save_as_registry_ops() {
    // FX on the same module records call_function index_put.default / index.Tensor (aten), here
    // the registry's index_put / index, with the index tensors as constants; the traced module
    // gives eager's result: x = arange(6).view(2, 3), cols = [2, 0], rows = [1, 1, 0] ->
    // [[2, 8, 2], [2, 8, 2], [2, 2, 2]]
    let m = SetItem {
        cols: Tensor::from_vec(vec![2i64, 0], &[2]).unwrap(),
        rows: Tensor::from_vec(vec![1i64, 1, 0], &[3]).unwrap(),
    };
    let gm = symbolic_trace(&m).unwrap();
    let calls: Vec<String> = gm
        .graph()
        .iter()
        .filter(|n| matches!(n.op(), Opcode::CallFunction | Opcode::CallMethod))
        .map(|n| n.target().name().to_string())
        .collect();
    assert!(calls.iter().any(|t| t == "index_put") && calls.iter().any(|t| t == "index"), "{calls:?}");
    let x = Tensor::from_vec((0..6).map(|v| v as f32).collect::<Vec<_>>(), &[2, 3]).unwrap();
    let want = vec![2.0f32, 8.0, 2.0, 2.0, 8.0, 2.0, 2.0, 2.0, 2.0];
    assert_eq!(m.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    let back = ferrofx_fx::GraphModule::from_bytes(&gm.to_bytes().unwrap()).unwrap();
    assert_eq!(back.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    // An index out of range is the op's error at run time, naming dim and size.
    let bad = SetItem {
        cols: Tensor::from_vec(vec![3i64], &[1]).unwrap(),
        rows: Tensor::from_vec(vec![0i64], &[1]).unwrap(),
    };
    let e = symbolic_trace(&bad).unwrap().forward(&x).unwrap_err().to_string();
    assert!(e.contains("index 3 is out of bounds for dimension 1 with size 3"), "{e}");
}
