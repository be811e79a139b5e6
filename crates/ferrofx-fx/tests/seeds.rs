//! Ports of every example of seeds 000 (torch.fx Graph/Node deep dive) and 002 (FX Graph/Node
//! notes). Registry ops are used where ferrofx-core provides them (`Target::named`), otherwise
//! user functions of the same name.

use ferrofx_fx::{core_api, Argument, Graph, Kwargs, NodeId, Opcode, Target};

fn names(g: &Graph, ids: impl IntoIterator<Item = NodeId>) -> Vec<String> {
    ids.into_iter().map(|i| g.node(i).unwrap().name().to_string()).collect()
}

fn users(g: &Graph, id: NodeId) -> Vec<String> {
    names(g, g.node(id).unwrap().users())
}

fn inputs(g: &Graph, id: NodeId) -> Vec<String> {
    names(g, g.node(id).unwrap().all_input_nodes())
}

/// The variable generated code uses for a node named after the function it calls: a user
/// function's name is not shadowed (`relu_1 = relu(x)`); registry ops print as `ops.<name>`, so
/// no collision.
fn var(name: &str) -> String {
    if core_api::lookup(name).is_some() {
        name.to_string()
    } else {
        format!("{name}_1")
    }
}

/// How generated code spells a call of `name`: registry ops are `ops.<name>`.
fn call(name: &str) -> String {
    if core_api::lookup(name).is_some() {
        format!("ops.{name}")
    } else {
        name.to_string()
    }
}

/// Seed 000 §6.4: use-def tracking, before and after `add.args = (x, z)`.
#[test]
fn seed000_use_def_example() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let add = g.call_function(Target::named("add"), vec![x.into(), y.into()]).unwrap();
    assert_eq!(g.node(add).unwrap().all_input_nodes(), vec![x, y]);
    assert_eq!(users(&g, x), ["add"]);
    assert_eq!(users(&g, y), ["add"]);

    let z = g.placeholder("z").unwrap();
    g.set_args(add, vec![x.into(), z.into()]).unwrap();
    assert_eq!(g.node(add).unwrap().all_input_nodes(), vec![x, z]);
    assert!(users(&g, y).is_empty());
    assert_eq!(users(&g, z), ["add"]);
    assert_eq!(users(&g, x), ["add"]);
    // z was created after add, so the order is no longer topological; lint says so and the
    // stable sort fixes it by moving add after z.
    let findings = g.lint_with(None);
    assert_eq!(findings, vec![ferrofx_fx::LintFinding::UsedBeforeDefined { node: "add".into(), input: "z".into() }]);
    g.stable_topological_sort().unwrap();
    assert_eq!(g.node_ids(), vec![x, y, z, add]);
    g.lint().unwrap();
}

fn build_seed000_7_3() -> (Graph, [NodeId; 5]) {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let add = g.call_function(Target::named("add"), vec![x.into(), y.into()]).unwrap();
    let relu = g.call_function(Target::named("relu"), vec![add.into()]).unwrap();
    let out = g.output(relu.into()).unwrap();
    (g, [x, y, add, relu, out])
}

/// Seed 000 §7.3: the complete build example, its printed graph and its code.
#[test]
fn seed000_build_example_and_printed_form() {
    let (g, [x, y, add, relu, out]) = build_seed000_7_3();
    g.lint().unwrap();
    assert_eq!(g.node_ids(), vec![x, y, add, relu, out]);
    assert_eq!(
        g.to_string(),
        "graph():
    %x : [num_users=1] = placeholder[target=x]
    %y : [num_users=1] = placeholder[target=y]
    %add : [num_users=1] = call_function[target=add](args = (%x, %y), kwargs = {})
    %relu : [num_users=1] = call_function[target=relu](args = (%add,), kwargs = {})
    return relu"
    );
    assert_eq!(
        g.python_code(),
        format!(
            "def forward(self, x, y):
    {add} = {}(x, y);  x = y = None
    {relu} = {}({add});  {add} = None
    return {relu}
",
            call("add"),
            call("relu"),
            add = var("add"),
            relu = var("relu"),
        )
    );
    // §3.2: the circular list through the sentinel, both directions.
    assert_eq!(g.first(), Some(x));
    assert_eq!(g.last(), Some(out));
    assert_eq!(g.next(out).unwrap(), None);
    assert_eq!(g.prev(x).unwrap(), None);
    assert_eq!(g.nodes().rev().collect::<Vec<_>>(), vec![out, relu, add, y, x]);
    assert_eq!(g.len(), 5);
}

/// Seed 000 §7.2: the six convenience builders and the target kinds they take.
#[test]
fn seed000_builders_and_target_kinds() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let w = g.get_attr("layer.weight").unwrap();
    let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    let m = g.call_method("reshape", vec![x.into(), Argument::tuple([2.into(), 3.into()])]).unwrap();
    let l = g.call_module("linear", vec![x.into()]).unwrap();
    let o = g.output(Argument::tuple([r.into(), m.into(), l.into(), w.into()])).unwrap();
    let ops: Vec<Opcode> = g.nodes().map(|n| g.node(n).unwrap().op()).collect();
    assert_eq!(ops, Opcode::ALL.to_vec());
    assert_eq!(g.node(w).unwrap().name(), "layer_weight");
    assert_eq!(g.node(w).unwrap().target(), &Target::from("layer.weight"));
    assert_eq!(g.node(o).unwrap().target(), &Target::from("output"));
    assert_eq!(g.node(o).unwrap().name(), "output");
    g.lint().unwrap();
    // §4.3: call_function needs a callable; the other five need a string.
    let err = g.create_node(Opcode::CallFunction, "relu".into(), vec![], Kwargs::new(), None, None).unwrap_err();
    assert!(err.to_string().contains("callable"), "{err}");
    let err = g.create_node(Opcode::CallModule, Target::named("relu"), vec![], Kwargs::new(), None, None).unwrap_err();
    assert!(err.to_string().contains("string target"), "{err}");
    assert!("root".parse::<Opcode>().unwrap_err().to_string().contains("unknown opcode 'root'"));
}

/// Seed 000 §8.1: `inserting_after(add)` / `inserting_before(relu)`.
#[test]
fn seed000_insertion_point_example() {
    let (mut g, [x, _y, add, relu, _out]) = build_seed000_7_3();
    let neg = {
        let mut g = g.inserting_after(Some(add)).unwrap();
        g.call_function(Target::named("neg"), vec![add.into()]).unwrap()
    };
    let mul = {
        let mut g = g.inserting_before(Some(relu)).unwrap();
        g.call_function(Target::named("mul"), vec![neg.into(), x.into()]).unwrap()
    };
    assert_eq!(names(&g, g.node_ids()), ["x", "y", "add", "neg", "mul", "relu", "output"]);
    assert!(g.is_before(neg, mul).unwrap() && g.is_before(mul, relu).unwrap());
    g.lint().unwrap();
}

/// Seed 000 §10.1: traverse a traced module's graph, replace relu by gelu, lint, regenerate.
#[test]
fn seed000_relu_to_gelu() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let lin = g.call_module("linear", vec![x.into()]).unwrap();
    let relu = g.call_function(Target::named("relu"), vec![lin.into()]).unwrap();
    g.output(relu.into()).unwrap();

    let listing: Vec<String> = g
        .nodes()
        .map(|n| {
            let n = g.node(n).unwrap();
            format!("op={:<16} name={:<12} target={}", n.op().as_str(), n.name(), n.target())
        })
        .collect();
    assert_eq!(
        listing,
        [
            "op=placeholder      name=x            target=x",
            "op=call_module      name=linear       target=linear",
            "op=call_function    name=relu         target=relu",
            "op=output           name=output       target=output",
        ]
    );

    let relu_target = Target::named("relu");
    let mut cursor = g.cursor();
    while let Some(node) = cursor.next(&g) {
        let n = g.node(node).unwrap();
        if n.op() == Opcode::CallFunction && *n.target() == relu_target {
            let (args, kwargs) = (n.args().to_vec(), n.kwargs().clone());
            let new_node = {
                let mut g = g.inserting_after(Some(node)).unwrap();
                g.call_function_with(Target::named("gelu"), args, kwargs).unwrap()
            };
            g.replace_all_uses_with(node, new_node).unwrap();
            g.erase_node(node).unwrap();
        }
    }
    g.lint().unwrap();
    assert!(g.node(relu).is_err());
    assert_eq!(
        g.python_code(),
        format!(
            "def forward(self, x):
    linear = self.linear(x);  x = None
    {} = {}(linear);  linear = None
    return {}
",
            var("gelu"),
            call("gelu"),
            var("gelu")
        )
    );
}

/// Seed 000 §10.2: use-def analysis of `a = x + y; b = a * x; c = relu(b)`.
#[test]
fn seed000_use_def_analysis() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let a = g.call_function(Target::named("add"), vec![x.into(), y.into()]).unwrap();
    let b = g.call_function(Target::named("mul"), vec![a.into(), x.into()]).unwrap();
    let c = g.call_function(Target::named("relu"), vec![b.into()]).unwrap();
    let out = g.output(c.into()).unwrap();
    let table: Vec<(String, Vec<String>, Vec<String>)> =
        g.nodes().map(|n| (g.node(n).unwrap().name().to_string(), inputs(&g, n), users(&g, n))).collect();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        table,
        vec![
            ("x".into(), s(&[]), s(&["add", "mul"])),
            ("y".into(), s(&[]), s(&["add"])),
            ("add".into(), s(&["x", "y"]), s(&["mul"])),
            ("mul".into(), s(&["add", "x"]), s(&["relu"])),
            ("relu".into(), s(&["mul"]), s(&["output"])),
            ("output".into(), s(&["relu"]), s(&[])),
        ]
    );
    let _ = out;
}

/// Seed 000 §9: each lint check fires and names the nodes.
#[test]
fn seed000_lint_checks() {
    let (mut g, [x, _y, add, relu, out]) = build_seed000_7_3();
    // Topological order: move relu before add.
    g.prepend(add, relu).unwrap();
    let err = g.lint().unwrap_err().to_string();
    assert!(err.contains("argument 'add' of node 'relu' was used before it has been defined"), "{err}");
    g.stable_topological_sort().unwrap();
    g.lint().unwrap();
    // Output last.
    g.append(out, x).unwrap();
    let err = g.lint().unwrap_err().to_string();
    assert!(err.contains("output node 'output' is not last"), "{err}");
    assert!(err.contains("\"x\""), "{err}");
}

/// The graph of seed 002: p, q -> n -> a, b, c (c also uses t).
struct Seed002 {
    g: Graph,
    p: NodeId,
    q: NodeId,
    n: NodeId,
    t: NodeId,
    a: NodeId,
    b: NodeId,
    c: NodeId,
}

fn seed002() -> Seed002 {
    let mut g = Graph::new();
    let p = g.placeholder("p").unwrap();
    let q = g.placeholder("q").unwrap();
    let f = Target::named("add");
    let n = g
        .create_node(Opcode::CallFunction, f.clone(), vec![p.into(), q.into()], Kwargs::new(), Some("n"), None)
        .unwrap();
    let t = g.placeholder("t").unwrap();
    let a = g
        .create_node(Opcode::CallFunction, Target::named("relu"), vec![n.into()], Kwargs::new(), Some("a"), None)
        .unwrap();
    let b = g
        .create_node(Opcode::CallFunction, Target::named("neg"), vec![n.into()], Kwargs::new(), Some("b"), None)
        .unwrap();
    let c = g.create_node(Opcode::CallFunction, f, vec![n.into(), t.into()], Kwargs::new(), Some("c"), None).unwrap();
    Seed002 { g, p, q, n, t, a, b, c }
}

/// Seed 002: the topological list, `_input_nodes` / `users`, and that prepend/append change
/// only the order.
#[test]
fn seed002_topological_list_and_moves() {
    let Seed002 { mut g, p, q, n, t, a, b, c } = seed002();
    assert_eq!(names(&g, g.node_ids()), ["p", "q", "n", "t", "a", "b", "c"]);
    assert_eq!(g.node(n).unwrap().all_input_nodes(), vec![p, q]);
    assert_eq!(users(&g, n), ["a", "b", "c"]);
    assert_eq!(g.prev(n).unwrap(), Some(q));
    // Another valid topological list: [q, p, n, t, b, a, c]; moving changes no edge.
    g.prepend(p, q).unwrap();
    g.append(b, a).unwrap();
    assert_eq!(names(&g, g.node_ids()), ["q", "p", "n", "t", "b", "a", "c"]);
    assert_eq!(g.prev(n).unwrap(), Some(p));
    assert_eq!(g.node(n).unwrap().all_input_nodes(), vec![p, q]);
    assert_eq!(users(&g, n), ["a", "b", "c"]);
    let _ = (t, c);
    g.lint().unwrap();
}

/// Seed 002: `n.update_arg(2, r)` adds r to n's inputs and n to r's users.
#[test]
fn seed002_update_arg() {
    let mut g = Graph::new();
    let p = g.placeholder("p").unwrap();
    let q = g.placeholder("q").unwrap();
    let r = g.placeholder("r").unwrap();
    let n = g.call_function(Target::named("add"), vec![p.into(), q.into(), Argument::None]).unwrap();
    g.update_arg(n, 2, r.into()).unwrap();
    assert_eq!(g.node(n).unwrap().all_input_nodes(), vec![p, q, r]);
    assert_eq!(users(&g, r), [g.node(n).unwrap().name()]);
    assert_eq!(g.node(n).unwrap().args()[2], Argument::Node(r));
    assert!(g.update_arg(n, 3, r.into()).is_err());
    g.lint().unwrap();
}

/// Seed 002: the walk through `n.replace_all_uses_with(s)` (users of n and s at each step),
/// then `erase_node(n)`.
#[test]
fn seed002_replace_all_uses_with_walk_and_erase() {
    let Seed002 { mut g, p, q, n, t, a, b, c } = seed002();
    // s is created with n's args: it is linked to p and q from the start, with no users.
    let s = {
        let args = g.node(n).unwrap().args().to_vec();
        let mut g = g.inserting_after(Some(n)).unwrap();
        g.create_node(Opcode::CallFunction, Target::named("add"), args, Kwargs::new(), Some("s"), None).unwrap()
    };
    assert_eq!(g.node(s).unwrap().all_input_nodes(), vec![p, q]);
    assert!(users(&g, s).is_empty());

    // The loop of replace_all_uses_with, one user at a time, as the seed walks it.
    let to_process: Vec<NodeId> = g.node(n).unwrap().users().collect();
    assert_eq!(to_process, vec![a, b, c]);
    let expected = [(vec!["b", "c"], vec!["a"]), (vec!["c"], vec!["a", "b"]), (vec![], vec!["a", "b", "c"])];
    for (use_node, (n_users, s_users)) in to_process.iter().zip(expected) {
        g.replace_input_with(*use_node, n, s).unwrap();
        assert_eq!(users(&g, n), n_users);
        assert_eq!(users(&g, s), s_users);
    }
    assert_eq!(g.node(c).unwrap().args(), &[Argument::Node(s), Argument::Node(t)]);
    g.lint().unwrap();

    // erase_node(n): p and q forget n; n's inputs are cleared; n is gone.
    assert_eq!(users(&g, p), ["n", "s"]);
    g.erase_node(n).unwrap();
    assert_eq!(users(&g, p), ["s"]);
    assert_eq!(users(&g, q), ["s"]);
    assert!(g.node(n).is_err());
    assert!(g.node(n).unwrap_err().to_string().contains("node n "));
    g.lint().unwrap();
}

/// Seed 002: the same walk through the real `replace_all_uses_with`.
#[test]
fn seed002_replace_all_uses_with_returns_changed_users() {
    let Seed002 { mut g, n, a, b, c, .. } = seed002();
    let args = g.node(n).unwrap().args().to_vec();
    let s = g.call_function(Target::named("add"), args).unwrap();
    g.prepend(a, s).unwrap();
    // erase_node refuses while users remain, listing them.
    let err = g.erase_node(n).unwrap_err().to_string();
    assert!(err.contains("cannot erase node 'n'") && err.contains("[\"a\", \"b\", \"c\"]"), "{err}");
    assert_eq!(g.replace_all_uses_with(n, s).unwrap(), vec![a, b, c]);
    assert!(users(&g, n).is_empty());
    assert_eq!(users(&g, s), ["a", "b", "c"]);
    g.erase_node(n).unwrap();
    g.lint().unwrap();
}

/// Seed 002: examples/fx/replace_op.py — replace `x + y`, `torch.add(x, y)` and `x.add(y)`
/// by `bitwise_and`.
#[test]
fn seed002_replace_add_with_bitwise_and() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let add = Target::named("add");
    let a0 = g.call_function(add.clone(), vec![x.into(), y.into()]).unwrap();
    let a1 = g.call_function(add.clone(), vec![x.into(), y.into()]).unwrap();
    let a2 = g.call_method("add", vec![x.into(), y.into()]).unwrap();
    g.output(Argument::tuple([a0.into(), a1.into(), a2.into()])).unwrap();
    assert_eq!(names(&g, [a0, a1, a2]), ["add", "add_1", "add_2"]);

    let patterns = [add.clone(), Target::from("add")];
    let mut cursor = g.cursor();
    while let Some(n) = cursor.next(&g) {
        let node = g.node(n).unwrap();
        if patterns.iter().any(|p| node.target() == p) {
            let (args, kwargs) = (node.args().to_vec(), node.kwargs().clone());
            let new_node = {
                let mut g = g.inserting_after(Some(n)).unwrap();
                g.call_function_with(Target::named("bitwise_and"), args, kwargs).unwrap()
            };
            g.replace_all_uses_with(n, new_node).unwrap();
            g.erase_node(n).unwrap();
        }
    }
    g.lint().unwrap();
    assert_eq!(
        g.to_string(),
        "graph():
    %x : [num_users=3] = placeholder[target=x]
    %y : [num_users=3] = placeholder[target=y]
    %bitwise_and : [num_users=1] = call_function[target=bitwise_and](args = (%x, %y), kwargs = {})
    %bitwise_and_1 : [num_users=1] = call_function[target=bitwise_and](args = (%x, %y), kwargs = {})
    %bitwise_and_2 : [num_users=1] = call_function[target=bitwise_and](args = (%x, %y), kwargs = {})
    return (bitwise_and, bitwise_and_1, bitwise_and_2)"
    );
    assert!(g.find_nodes(Opcode::CallFunction, Some(&add), true).unwrap().is_empty());
    assert!(g.find_nodes(Opcode::CallMethod, None, true).unwrap().is_empty());
    assert_eq!(g.find_nodes(Opcode::CallFunction, Some(&Target::named("bitwise_and")), true).unwrap().len(), 3);
}
