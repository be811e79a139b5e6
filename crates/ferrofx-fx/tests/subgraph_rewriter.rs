//! `replace_pattern` on the cases of FX's documentation: a single match, several
//! non-overlapping matches, overlapping candidates (the first wins, deterministically), a
//! pattern with several outputs, and the containment rule; each checks the printed graph.

use ferrofx_fx::passes::{replace_pattern, replace_pattern_with_filters, Replacement, SubgraphMatcher};
use ferrofx_fx::{Argument, Graph, NodeId, Target};

fn f(g: &mut Graph, op: &str, args: Vec<Argument>) -> NodeId {
    g.call_function(Target::named(op), args).unwrap()
}

/// pattern(x, w1, w2) = add(mm(x, w1), mm(x, w2)) ; replacement = mm(x, add(w1, w2)) (FX's example)
fn fx_doc_pattern() -> (Graph, Graph) {
    let mut p = Graph::new();
    let (x, w1, w2) = (p.placeholder("x").unwrap(), p.placeholder("w1").unwrap(), p.placeholder("w2").unwrap());
    let m1 = f(&mut p, "mm", vec![x.into(), w1.into()]);
    let m2 = f(&mut p, "mm", vec![x.into(), w2.into()]);
    let s = f(&mut p, "add", vec![m1.into(), m2.into()]);
    p.output(s.into()).unwrap();
    let mut r = Graph::new();
    let (x, w1, w2) = (r.placeholder("x").unwrap(), r.placeholder("w1").unwrap(), r.placeholder("w2").unwrap());
    let s = f(&mut r, "add", vec![w1.into(), w2.into()]);
    let m = f(&mut r, "mm", vec![x.into(), s.into()]);
    r.output(m.into()).unwrap();
    (p, r)
}

fn lines(g: &Graph) -> Vec<String> {
    g.to_string().lines().skip(1).map(|l| l.trim().to_string()).collect()
}

#[test]
fn single_match_fx_documentation_example() {
    // forward(x, w1, w2): m1 = mm(x, w1); m2 = mm(x, w2); val = add(m1, m2); max = max(val); return max
    let mut g = Graph::new();
    let (x, w1, w2) = (g.placeholder("x").unwrap(), g.placeholder("w1").unwrap(), g.placeholder("w2").unwrap());
    let m1 = f(&mut g, "mm", vec![x.into(), w1.into()]);
    let m2 = f(&mut g, "mm", vec![x.into(), w2.into()]);
    let s = f(&mut g, "add", vec![m1.into(), m2.into()]);
    let mx = f(&mut g, "max", vec![s.into()]);
    g.output(mx.into()).unwrap();
    let (p, r) = fx_doc_pattern();
    let matches = replace_pattern_with_filters(&mut g, &p, Replacement::Graph(&r), &[], false).unwrap();
    assert_eq!(matches.len(), 1);
    assert_eq!(matches[0].placeholder_nodes, vec![x.into(), w1.into(), w2.into()]);
    // FX's ReplacedPatterns.anchor is the pattern's node (its `add`); replacements are the new nodes
    assert_eq!(p.node(matches[0].anchor).unwrap().name(), "add");
    assert_eq!(
        matches[0].replacements.iter().map(|&n| g.node(n).unwrap().name().to_string()).collect::<Vec<_>>(),
        ["add_1", "mm_2"]
    );
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        vec![
            "%x : [num_users=1] = placeholder[target=x]",
            "%w1 : [num_users=1] = placeholder[target=w1]",
            "%w2 : [num_users=1] = placeholder[target=w2]",
            "%add_1 : [num_users=1] = call_function[target=add](args = (%w1, %w2), kwargs = {})",
            "%mm_2 : [num_users=1] = call_function[target=mm](args = (%x, %add_1), kwargs = {})",
            "%max_1 : [num_users=1] = call_function[target=max](args = (%mm_2,), kwargs = {})",
            "return max_1",
        ]
    );
}

#[test]
fn several_non_overlapping_matches_are_all_replaced() {
    // relu(add(a, b)) twice, plus a lone add that must stay
    let mut p = Graph::new();
    let (a, b) = (p.placeholder("a").unwrap(), p.placeholder("b").unwrap());
    let s = f(&mut p, "add", vec![a.into(), b.into()]);
    let r = f(&mut p, "relu", vec![s.into()]);
    p.output(r.into()).unwrap();
    let mut rep = Graph::new();
    let (a, b) = (rep.placeholder("a").unwrap(), rep.placeholder("b").unwrap());
    let s = f(&mut rep, "sub", vec![a.into(), b.into()]);
    let r = f(&mut rep, "gelu", vec![s.into()]);
    rep.output(r.into()).unwrap();

    let mut g = Graph::new();
    let (x, y) = (g.placeholder("x").unwrap(), g.placeholder("y").unwrap());
    let s1 = f(&mut g, "add", vec![x.into(), y.into()]);
    let r1 = f(&mut g, "relu", vec![s1.into()]);
    let s2 = f(&mut g, "add", vec![r1.into(), y.into()]);
    let r2 = f(&mut g, "relu", vec![s2.into()]);
    let lone = f(&mut g, "add", vec![r2.into(), x.into()]);
    g.output(lone.into()).unwrap();
    let p_relu = p.iter().find(|n| n.name() == "relu").unwrap().id();
    let matches = replace_pattern(&mut g, &p, &rep).unwrap();
    assert_eq!(matches.len(), 2);
    assert!(matches.iter().all(|m| m.anchor == p_relu), "FX's Match.anchor is the pattern's node");
    assert_eq!(matches.iter().map(|m| m.nodes_map[&p_relu]).collect::<Vec<_>>(), vec![r1, r2]);
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        vec![
            "%x : [num_users=2] = placeholder[target=x]",
            "%y : [num_users=2] = placeholder[target=y]",
            "%sub : [num_users=1] = call_function[target=sub](args = (%x, %y), kwargs = {})",
            "%gelu : [num_users=1] = call_function[target=gelu](args = (%sub,), kwargs = {})",
            "%sub_1 : [num_users=1] = call_function[target=sub](args = (%gelu, %y), kwargs = {})",
            "%gelu_1 : [num_users=1] = call_function[target=gelu](args = (%sub_1,), kwargs = {})",
            "%add_2 : [num_users=1] = call_function[target=add](args = (%gelu_1, %x), kwargs = {})",
            "return add_2",
        ]
    );
}

#[test]
fn overlapping_candidates_first_wins() {
    // pattern relu(relu(x)) on relu(relu(relu(x))): candidates at the 2nd and 3rd relu overlap
    let chain = |n: usize| {
        let mut g = Graph::new();
        let mut v = g.placeholder("x").unwrap();
        for _ in 0..n {
            v = f(&mut g, "relu", vec![v.into()]);
        }
        g.output(v.into()).unwrap();
        g
    };
    let p = chain(2);
    let mut rep = Graph::new();
    let x = rep.placeholder("x").unwrap();
    let r = f(&mut rep, "sigmoid", vec![x.into()]);
    rep.output(r.into()).unwrap();
    for _ in 0..3 {
        // deterministic: the same result every time
        let mut g = chain(3);
        let second = g.iter().nth(2).unwrap().id();
        let matches = replace_pattern(&mut g, &p, &rep).unwrap();
        assert_eq!(matches.len(), 1);
        assert_eq!(matches[0].nodes_map[&matches[0].anchor], second, "the earliest anchor wins");
        g.lint().unwrap();
        assert_eq!(
            lines(&g),
            vec![
                "%x : [num_users=1] = placeholder[target=x]",
                "%sigmoid : [num_users=1] = call_function[target=sigmoid](args = (%x,), kwargs = {})",
                "%relu_2 : [num_users=1] = call_function[target=relu](args = (%sigmoid,), kwargs = {})",
                "return relu_2",
            ]
        );
    }
    // the matcher alone reports the same single match
    assert_eq!(SubgraphMatcher::new(&p).unwrap().match_all(&chain(3)).unwrap().len(), 1);
    // four relus: two disjoint matches
    let mut g = chain(4);
    assert_eq!(replace_pattern(&mut g, &p, &rep).unwrap().len(), 2);
}

#[test]
fn pattern_with_several_outputs() {
    // pattern(x) = (sin(x), cos(x)) ; replacement(x) = (sin(neg(x)), cos(neg(x)))
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let s = f(&mut p, "sin", vec![x.into()]);
    let c = f(&mut p, "cos", vec![x.into()]);
    p.output(Argument::tuple([s.into(), c.into()])).unwrap();
    let mut rep = Graph::new();
    let x = rep.placeholder("x").unwrap();
    let n = f(&mut rep, "neg", vec![x.into()]);
    let s = f(&mut rep, "sin", vec![n.into()]);
    let c = f(&mut rep, "cos", vec![n.into()]);
    rep.output(Argument::tuple([s.into(), c.into()])).unwrap();

    let mut g = Graph::new();
    let a = g.placeholder("a").unwrap();
    let s = f(&mut g, "sin", vec![a.into()]);
    let c = f(&mut g, "cos", vec![a.into()]);
    let m = f(&mut g, "mul", vec![s.into(), c.into()]);
    g.output(m.into()).unwrap();
    let (ps, pc) = (p.iter().nth(1).unwrap().id(), p.iter().nth(2).unwrap().id());
    let matches = replace_pattern(&mut g, &p, &rep).unwrap();
    assert_eq!(matches.len(), 1);
    assert_eq!((matches[0].nodes_map[&ps], matches[0].nodes_map[&pc]), (s, c));
    g.lint().unwrap();
    assert_eq!(
        lines(&g),
        vec![
            "%a : [num_users=1] = placeholder[target=a]",
            "%neg : [num_users=2] = call_function[target=neg](args = (%a,), kwargs = {})",
            "%sin_1 : [num_users=1] = call_function[target=sin](args = (%neg,), kwargs = {})",
            "%cos_1 : [num_users=1] = call_function[target=cos](args = (%neg,), kwargs = {})",
            "%mul : [num_users=1] = call_function[target=mul](args = (%sin_1, %cos_1), kwargs = {})",
            "return mul",
        ]
    );
}

#[test]
fn inner_nodes_used_outside_the_match_block_it() {
    // add(x, y) is used by relu (in the pattern) and by the output: it cannot be removed
    let mut p = Graph::new();
    let (a, b) = (p.placeholder("a").unwrap(), p.placeholder("b").unwrap());
    let s = f(&mut p, "add", vec![a.into(), b.into()]);
    let r = f(&mut p, "relu", vec![s.into()]);
    p.output(r.into()).unwrap();
    let mut g = Graph::new();
    let (x, y) = (g.placeholder("x").unwrap(), g.placeholder("y").unwrap());
    let s = f(&mut g, "add", vec![x.into(), y.into()]);
    let r = f(&mut g, "relu", vec![s.into()]);
    g.output(Argument::tuple([r.into(), s.into()])).unwrap();
    let before = g.to_string();
    let mut rep = Graph::new();
    let (a, b) = (rep.placeholder("a").unwrap(), rep.placeholder("b").unwrap());
    let s = f(&mut rep, "sub", vec![a.into(), b.into()]);
    rep.output(s.into()).unwrap();
    assert!(replace_pattern(&mut g, &p, &rep).unwrap().is_empty());
    assert_eq!(g.to_string(), before);
}

#[test]
fn literal_arguments_and_kwargs_must_be_equal() {
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let mut kw = ferrofx_fx::Kwargs::new();
    kw.insert("negative_slope".into(), Argument::Float(0.1));
    let l = p.call_function_with(Target::named("leaky_relu"), vec![x.into()], kw.clone()).unwrap();
    p.output(l.into()).unwrap();
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let a = g.call_function_with(Target::named("leaky_relu"), vec![x.into()], kw).unwrap();
    let mut kw2 = ferrofx_fx::Kwargs::new();
    kw2.insert("negative_slope".into(), Argument::Float(0.2));
    let b = g.call_function_with(Target::named("leaky_relu"), vec![a.into()], kw2).unwrap();
    g.output(b.into()).unwrap();
    let found = SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap();
    assert_eq!(found.iter().map(|m| m.returning_nodes[0]).collect::<Vec<_>>(), vec![a]);
}

#[test]
fn bad_patterns_and_replacements_are_errors() {
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    p.output(x.into()).unwrap();
    let e = SubgraphMatcher::new(&p).err().unwrap().to_string();
    assert!(e.contains("invalid pattern: it returns its input 'x' unchanged"), "{e}");
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    f(&mut p, "neg", vec![x.into()]);
    let r = f(&mut p, "relu", vec![x.into()]);
    p.output(r.into()).unwrap();
    let e = SubgraphMatcher::new(&p).err().unwrap().to_string();
    assert!(e.contains("node 'neg' is dead code"), "{e}");
    let mut p = Graph::new();
    let x = p.placeholder("x").unwrap();
    let r = f(&mut p, "relu", vec![x.into()]);
    p.output(r.into()).unwrap();
    let mut rep = Graph::new();
    let (a, b) = (rep.placeholder("a").unwrap(), rep.placeholder("b").unwrap());
    let s = f(&mut rep, "add", vec![a.into(), b.into()]);
    rep.output(s.into()).unwrap();
    let mut g = Graph::new();
    let x = g.placeholder("x").unwrap();
    let r = f(&mut g, "relu", vec![x.into()]);
    g.output(r.into()).unwrap();
    let e = replace_pattern(&mut g, &p, &rep).unwrap_err().to_string();
    assert!(e.contains("the replacement takes 2 inputs but the pattern binds 1"), "{e}");
}
