//! Behaviour tests beyond the seeds: namespace edge cases, forced sequence renumbering,
//! printing of devices/slices/floats, generated code not shadowing user functions, and the
//! bulk whole-graph copy matching node-by-node copying.

use ferrofx_fx::{Argument, Device, Graph, Namespace, Opcode, Target};
use std::collections::HashMap;

#[test]
fn namespace_sanitises_and_suffixes() {
    let mut ns = Namespace::new();
    assert_eq!(ns.create_name("layers.0"), "layers_0");
    assert_eq!(ns.create_name("layers.0"), "layers_1");
    assert_eq!(ns.create_name("layers.0.conv"), "layers_0_conv");
    assert_eq!(ns.create_name("a--b"), "a_b");
    assert_eq!(ns.create_name("9lives"), "_9lives");
    assert_eq!(ns.create_name(""), "_unnamed");
    assert_eq!(ns.create_name("..."), "_");
    // Explicit suffixes are kept, then continue from there; `_0` is a distinct name.
    assert_eq!(ns.create_name("x_5"), "x_5");
    assert_eq!(ns.create_name("x"), "x");
    assert_eq!(ns.create_name("x"), "x_6");
    assert_eq!(ns.create_name("x_0"), "x_0");
    assert_eq!(ns.create_name("x_05"), "x_7");
    // A large explicit suffix (outside the bitset) is still tracked.
    assert_eq!(ns.create_name("y_1000000"), "y_1000000");
    assert_eq!(ns.create_name("y_1000000"), "y_1000001");
    assert!(ns.is_used("y_1000000") && ns.is_used("x_0") && !ns.is_used("x_8"));
}

#[test]
fn namespace_avoids_keywords_and_builtins() {
    let mut ns = Namespace::new();
    for kw in ["if", "for", "None", "True", "lambda", "return", "sum", "list", "fn", "let", "self", "torch"] {
        assert!(ns.is_reserved(kw), "{kw}");
        assert_eq!(ns.create_name(kw), format!("{kw}_1"));
    }
    // A suffixed keyword is fine.
    assert_eq!(ns.create_name("if_3"), "if_3");
    assert!(!ns.is_reserved("iff"));
    assert_eq!(ns.create_name("iff"), "iff");
}

#[test]
fn graph_names_from_targets() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let m = g.call_module("layers.0", vec![x.into()]).unwrap();
    let m2 = g.call_module("layers.0", vec![m.into()]).unwrap();
    let a = g.get_attr("encoder.Weight").unwrap();
    let s = g.call_method("__add__", vec![m2.into(), a.into()]).unwrap();
    let f = g.call_function(Target::function("MyFunc"), [s.into()]).unwrap();
    let names: Vec<_> = [m, m2, a, s, f].iter().map(|&n| g.node(n).unwrap().name().to_string()).collect();
    assert_eq!(names, ["layers_0", "layers_1", "encoder_weight", "add", "my_func"]);
    // Names are never handed out twice, even after erasure.
    g.erase_node(f).unwrap();
    let f2 = g.call_function(Target::function("MyFunc"), [s.into()]).unwrap();
    assert_eq!(g.node(f2).unwrap().name(), "my_func_1");
    g.lint().unwrap();
}

#[test]
fn many_inserts_at_one_point_force_renumbering() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let out = g.output(x.into()).unwrap();
    // 5,000 inserts right after x exhaust the gap between x and out many times over (halving a
    // 2^16 gap lasts 16 inserts), forcing local and then full renumbering.
    let mut created = Vec::new();
    for _ in 0..5_000 {
        let mut h = g.inserting_after(Some(x)).unwrap();
        created.push(h.call_function(Target::named("neg"), [x.into()]).unwrap());
    }
    // Also insert before a node deep in the middle, repeatedly.
    let mid = created[2_500];
    for _ in 0..2_000 {
        let mut h = g.inserting_before(Some(mid)).unwrap();
        h.call_function(Target::named("relu"), [x.into()]).unwrap();
    }
    let ids = g.node_ids();
    assert_eq!(ids.len(), 7_002);
    assert_eq!(ids[0], x);
    assert_eq!(*ids.last().unwrap(), out);
    // inserting_after puts each new node right after x: reverse creation order.
    let negs: Vec<_> = ids.iter().copied().filter(|&i| g.node(i).unwrap().target().name() == "neg").collect();
    let mut rev = created.clone();
    rev.reverse();
    assert_eq!(negs, rev);
    for w in ids.windows(2) {
        assert!(g.is_before(w[0], w[1]).unwrap());
        assert!(g.seq(w[0]).unwrap() < g.seq(w[1]).unwrap());
    }
    g.lint().unwrap();
}

#[test]
fn prints_devices_slices_floats() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let args = vec![
        x.into(),
        Argument::Device(Box::new(Device::new("cuda", Some(1)))),
        Device::cpu().into(),
        Argument::slice(1.into(), Argument::None, 2.into()),
        Argument::tuple([Argument::Ellipsis, Argument::slice(Argument::None, x.into(), Argument::None)]),
        1.0f64.into(),
        0.1f64.into(),
        1e-5f64.into(),
        1e16f64.into(),
        (-2.5f64).into(),
        f64::INFINITY.into(),
        f64::NAN.into(),
        "it's".into(),
    ];
    let n = g.call_function(Target::function("f"), args).unwrap();
    assert_eq!(
        g.format_node(n).unwrap(),
        "%f : [num_users=0] = call_function[target=f](args = (%x, cuda:1, cpu, slice(1, None, 2), \
         (Ellipsis, slice(None, x, None)), 1.0, 0.1, 1e-05, 1e+16, -2.5, inf, nan, it's), kwargs = {})"
    );
    assert_eq!(
        g.python_code(),
        "def forward(self, x):\n    f_1 = f(x, device(type='cuda', index=1), device(type='cpu'), slice(1, None, 2), \
         (Ellipsis, slice(None, x, None)), 1.0, 0.1, 1e-05, 1e+16, -2.5, inf, nan, \"it's\");  x = f_1 = None\n"
    );
    let p = g.placeholder_with_default("scale", 0.5f64.into()).unwrap();
    assert_eq!(g.format_node(p).unwrap(), "%scale : [num_users=0] = placeholder[target=scale](default=0.5)");
}

#[test]
fn codegen_never_shadows_user_functions() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let a = g.call_function(Target::function("my_add"), [x.into(), y.into()]).unwrap();
    // A node explicitly named like the next free suffix does not confuse the renaming.
    let b = g
        .create_node(
            Opcode::CallFunction,
            Target::function("my_add"),
            vec![a.into(), y.into()],
            Default::default(),
            Some("my_add_1"),
            None,
        )
        .unwrap();
    let c = g.call_function(Target::function("my_add"), [b.into(), x.into()]).unwrap();
    g.output(c.into()).unwrap();
    assert_eq!(g.node(a).unwrap().name(), "my_add");
    assert_eq!(g.node(c).unwrap().name(), "my_add_2");
    assert_eq!(
        g.python_code(),
        "def forward(self, x, y):\n    \
         my_add_3 = my_add(x, y)\n    \
         my_add_1 = my_add(my_add_3, y);  my_add_3 = y = None\n    \
         my_add_2 = my_add(my_add_1, x);  my_add_1 = x = None\n    \
         return my_add_2\n"
    );
    // Registry ops print as ops.<name>: no collision, no renaming.
    let mut h = Graph::new();
    let x = h.placeholder("x").unwrap();
    let r = h.call_function(Target::op("reshape").unwrap(), [x.into(), Argument::tuple([(-1).into()])]).unwrap();
    h.output(r.into()).unwrap();
    assert_eq!(
        h.python_code(),
        "def forward(self, x):\n    reshape = ops.reshape(x, (-1,));  x = None\n    return reshape\n"
    );
}

/// A graph with erasures, kwargs, meta, types and non-default names.
fn messy_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let w = g.get_attr("layers.0.weight").unwrap();
    let mut kw = ferrofx_fx::Kwargs::new();
    kw.insert("alpha".into(), 2.into());
    let a = g.call_function_with(Target::named("add"), vec![x.into(), w.into()], kw).unwrap();
    let dead = g.call_function(Target::named("relu"), [a.into()]).unwrap();
    g.erase_node(dead).unwrap();
    let r = g.call_function(Target::named("relu"), [a.into()]).unwrap();
    g.set_type(r, Some("Tensor".into())).unwrap();
    g.meta_mut(r).unwrap().stack_trace = Some("model.py:3".into());
    let m = g.call_method("view", vec![r.into(), Argument::list([(-1).into(), x.into()])]).unwrap();
    g.output(Argument::tuple([m.into(), a.into()])).unwrap();
    g
}

#[test]
fn whole_graph_copy_matches_node_by_node_copy() {
    let src = messy_graph();
    // Bulk path: fresh destination.
    let mut bulk = Graph::new();
    let mut map = HashMap::new();
    let out = bulk.graph_copy(&src, &mut map).unwrap().unwrap();
    bulk.output(out).unwrap();
    // Node-by-node path: a destination that already has a node.
    let mut slow = Graph::new();
    let extra = slow.placeholder("extra").unwrap();
    let mut map2 = HashMap::new();
    let out2 = slow.graph_copy(&src, &mut map2).unwrap().unwrap();
    slow.output(out2).unwrap();
    slow.erase_node(extra).unwrap();
    assert_eq!(bulk.to_string(), src.to_string());
    assert_eq!(slow.to_string(), src.to_string());
    assert_eq!(bulk.python_code(), src.python_code());
    assert_eq!(map.len(), src.len() - 1);
    for (s, d) in &map {
        let (sn, dn) = (src.node(*s).unwrap(), bulk.node(*d).unwrap());
        assert_eq!(sn.name(), dn.name());
        assert_eq!(sn.type_expr(), dn.type_expr());
        assert_eq!(sn.meta().stack_trace, dn.meta().stack_trace);
    }
    bulk.lint().unwrap();
    // The copy's namespace behaves like a node-by-node copy: the output and erased names of src
    // are free, copied names are not.
    let r = bulk.call_function(Target::named("relu"), [out_node(&bulk).into()]).unwrap();
    let r2 = slow.call_function(Target::named("relu"), [out_node(&slow).into()]).unwrap();
    assert_eq!(bulk.node(r).unwrap().name(), slow.node(r2).unwrap().name());
    assert_eq!(bulk.find_nodes(Opcode::CallFunction, Some(&Target::named("relu")), true).unwrap().len(), 2);
}

fn out_node(g: &Graph) -> ferrofx_fx::NodeId {
    g.nodes().find(|&n| g.node(n).unwrap().op() == Opcode::Placeholder).unwrap()
}

/// A node with many users, edited so that its user list collects tombstones and is compacted
/// many times (removals, moves to the end, erasures): `users` must stay in FX's order (a
/// model list kept alongside) and lint (which checks every recorded edge position) clean.
#[test]
fn large_user_lists_keep_order_through_compaction() {
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let y = g.placeholder("y").unwrap();
    let neg = Target::named("neg");
    let users: Vec<_> = (0..200).map(|_| g.call_function(neg.clone(), [x.into()]).unwrap()).collect();
    let mut model: Vec<_> = users.clone();
    let mut state = 12345u64;
    let mut rand = |n: usize| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize % n
    };
    for step in 0..2000 {
        let u = users[rand(users.len())];
        if !g.contains(u) {
            continue;
        }
        match step % 4 {
            // Re-setting the same args moves `u` to the end of x's users (FX).
            0 => {
                g.set_args(u, vec![x.into()]).unwrap();
                model.retain(|&m| m != u);
                model.push(u);
            }
            // Switching to y removes it from x's users.
            1 => {
                g.set_args(u, vec![y.into()]).unwrap();
                model.retain(|&m| m != u);
            }
            // Back to x (and y): appended at the end.
            2 => {
                let had_x = model.contains(&u);
                g.set_args(u, vec![y.into(), x.into()]).unwrap();
                if had_x {
                    model.retain(|&m| m != u);
                }
                model.push(u);
            }
            // Erase it (it has no users).
            _ => {
                g.erase_node(u).unwrap();
                model.retain(|&m| m != u);
            }
        }
        assert_eq!(g.node(x).unwrap().users().collect::<Vec<_>>(), model, "step {step}");
        assert_eq!(g.node(x).unwrap().num_users(), model.len());
        if step % 50 == 0 {
            g.lint().unwrap();
        }
    }
    g.lint().unwrap();
    for &u in &model {
        assert!(g.node(x).unwrap().user_set().contains(u));
    }
}
