//! Property tests: random sequences of creations, arg updates, moves, replacements and
//! erasures keep the graph lint-clean with users/input_nodes mutually consistent; misuse
//! (erased or foreign handles, erasing used nodes, cycles) returns `Err` and never panics.
//! 10,000 cases for the edit sequences plus 2,000 for erase-while-iterating.

use ferrofx_fx::{Argument, Graph, GraphError, Kwargs, LintFinding, NodeId, Target};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Placeholder,
    Call { f: u8, inputs: Vec<u16>, kw: Option<u16>, anchor: Option<(u16, bool)> },
    SetArgs { node: u16, inputs: Vec<u16> },
    UpdateArg { node: u16, pos: u8, input: u16 },
    UpdateKwarg { node: u16, input: u16 },
    Move { node: u16, anchor: u16, before: bool },
    ReplaceAllUses { node: u16, with: u16, filter_odd: bool },
    ReplaceInput { node: u16, old: u16, new: u16 },
    Erase { node: u16 },
    UseStale { stale: u16 },
    UseForeign,
    Sort,
    Dce,
}

fn step() -> impl Strategy<Value = Step> {
    let idx = any::<u16>();
    prop_oneof![
        2 => Just(Step::Placeholder),
        5 => (0u8..4, prop::collection::vec(idx, 0..3), prop::option::of(idx), prop::option::of((idx, any::<bool>())))
            .prop_map(|(f, inputs, kw, anchor)| Step::Call { f, inputs, kw, anchor }),
        2 => (idx, prop::collection::vec(idx, 0..3)).prop_map(|(node, inputs)| Step::SetArgs { node, inputs }),
        1 => (idx, any::<u8>(), idx).prop_map(|(node, pos, input)| Step::UpdateArg { node, pos, input }),
        1 => (idx, idx).prop_map(|(node, input)| Step::UpdateKwarg { node, input }),
        2 => (idx, idx, any::<bool>()).prop_map(|(node, anchor, before)| Step::Move { node, anchor, before }),
        2 => (idx, idx, any::<bool>()).prop_map(|(node, with, filter_odd)| Step::ReplaceAllUses { node, with, filter_odd }),
        1 => (idx, idx, idx).prop_map(|(node, old, new)| Step::ReplaceInput { node, old, new }),
        3 => idx.prop_map(|node| Step::Erase { node }),
        1 => idx.prop_map(|stale| Step::UseStale { stale }),
        1 => Just(Step::UseForeign),
        1 => Just(Step::Sort),
        1 => Just(Step::Dce),
    ]
}

const FUNCS: [&str; 4] = ["add", "mul", "relu", "neg"];

fn pick(ids: &[NodeId], i: u16) -> Option<NodeId> {
    (!ids.is_empty()).then(|| ids[i as usize % ids.len()])
}

/// Findings that must never appear, whatever the order (order problems are fixed by the sort).
fn is_structural(f: &LintFinding) -> bool {
    !matches!(f, LintFinding::UsedBeforeDefined { .. } | LintFinding::OutputNotLast { .. })
}

fn check_consistent(g: &Graph) -> Result<(), TestCaseError> {
    let structural: Vec<_> = g.lint_with(None).into_iter().filter(is_structural).collect();
    prop_assert!(structural.is_empty(), "structural findings: {:?}", structural);
    // users / input_nodes mutually consistent, input_nodes = nodes of args in first-appearance order.
    for id in g.nodes() {
        let n = g.node(id).unwrap();
        let mut expected = Vec::new();
        n.visit_input_refs(&mut |r| {
            if !expected.contains(&r) {
                expected.push(r)
            }
        });
        prop_assert_eq!(n.all_input_nodes(), expected);
        for i in n.input_set().iter() {
            prop_assert!(g.node(i).unwrap().user_set().contains(id));
        }
        for u in n.users() {
            prop_assert!(g.node(u).unwrap().input_set().contains(id));
        }
    }
    // is_before agrees with the iteration order.
    let ids = g.node_ids();
    for w in ids.windows(2) {
        prop_assert!(g.is_before(w[0], w[1]).unwrap());
    }
    prop_assert_eq!(ids.len(), g.len());
    Ok(())
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut g = Graph::new();
    let foreign = {
        let mut h = Graph::new();
        h.placeholder("f").unwrap()
    };
    let mut stale: Vec<NodeId> = Vec::new();
    for s in steps {
        let ids = g.node_ids();
        let arg = |i: u16| pick(&ids, i).map_or(Argument::Int(i as i64), Argument::Node);
        match s {
            Step::Placeholder => {
                g.placeholder("x").unwrap();
            }
            Step::Call { f, inputs, kw, anchor } => {
                let args: Vec<Argument> = inputs.iter().map(|&i| arg(i)).collect();
                let mut kwargs = Kwargs::new();
                if let Some(k) = kw {
                    kwargs.insert("other".into(), Argument::list([arg(*k), Argument::None]));
                }
                let target = Target::named(FUNCS[*f as usize % FUNCS.len()]);
                match anchor.and_then(|(a, before)| pick(&ids, a).map(|a| (a, before))) {
                    Some((a, true)) => {
                        let mut g = g.inserting_before(Some(a)).unwrap();
                        g.call_function_with(target, args, kwargs).unwrap();
                    }
                    Some((a, false)) => {
                        let mut g = g.inserting_after(Some(a)).unwrap();
                        g.call_function_with(target, args, kwargs).unwrap();
                    }
                    None => {
                        g.call_function_with(target, args, kwargs).unwrap();
                    }
                }
            }
            Step::SetArgs { node, inputs } => {
                if let Some(n) = pick(&ids, *node) {
                    let args = inputs.iter().map(|&i| arg(i)).collect();
                    if let Err(e) = g.set_args(n, args) {
                        prop_assert!(matches!(e, GraphError::Cycle { .. }), "{e}");
                    }
                }
            }
            Step::UpdateArg { node, pos, input } => {
                if let Some(n) = pick(&ids, *node) {
                    match g.update_arg(n, *pos as usize % 4, arg(*input)) {
                        Ok(()) | Err(GraphError::Cycle { .. }) | Err(GraphError::ArgIndex { .. }) => {}
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
            }
            Step::UpdateKwarg { node, input } => {
                if let Some(n) = pick(&ids, *node) {
                    if let Err(e) = g.update_kwarg(n, "k", arg(*input)) {
                        prop_assert!(matches!(e, GraphError::Cycle { .. }), "{e}");
                    }
                }
            }
            Step::Move { node, anchor, before } => {
                if let (Some(n), Some(a)) = (pick(&ids, *node), pick(&ids, *anchor)) {
                    let edges_before: Vec<_> = g.nodes().map(|i| g.node(i).unwrap().all_input_nodes()).collect();
                    if *before {
                        g.prepend(a, n).unwrap();
                    } else {
                        g.append(a, n).unwrap();
                    }
                    // Moves change only the order.
                    let mut sorted_before = edges_before;
                    sorted_before.sort();
                    let mut after: Vec<_> = g.nodes().map(|i| g.node(i).unwrap().all_input_nodes()).collect();
                    after.sort();
                    prop_assert_eq!(sorted_before, after);
                }
            }
            Step::ReplaceAllUses { node, with, filter_odd } => {
                if let (Some(n), Some(w)) = (pick(&ids, *node), pick(&ids, *with)) {
                    let users_before: Vec<NodeId> = g.node(n).unwrap().users().collect();
                    let res = if *filter_odd {
                        g.replace_all_uses_with_where(n, w, |u| u.id().index() % 2 == 1, false)
                    } else {
                        g.replace_all_uses_with(n, w)
                    };
                    match res {
                        Ok(changed) => {
                            for u in &changed {
                                prop_assert!(users_before.contains(u));
                                if n != w {
                                    prop_assert!(!g.node(*u).unwrap().input_set().contains(n));
                                    prop_assert!(g.node(w).unwrap().user_set().contains(*u));
                                }
                            }
                        }
                        Err(GraphError::Cycle { .. }) => {
                            // Atomic: nothing changed.
                            prop_assert_eq!(users_before, g.node(n).unwrap().users().collect::<Vec<_>>());
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
            }
            Step::ReplaceInput { node, old, new } => {
                if let (Some(n), Some(o), Some(w)) = (pick(&ids, *node), pick(&ids, *old), pick(&ids, *new)) {
                    match g.replace_input_with(n, o, w) {
                        Ok(()) | Err(GraphError::Cycle { .. }) | Err(GraphError::NotAnInput { .. }) => {}
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
            }
            Step::Erase { node } => {
                if let Some(n) = pick(&ids, *node) {
                    let has_users = g.node(n).unwrap().num_users() > 0;
                    match g.erase_node(n) {
                        Ok(()) => {
                            prop_assert!(!has_users);
                            stale.push(n);
                        }
                        Err(GraphError::HasUsers { users, .. }) => prop_assert!(has_users && !users.is_empty()),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
            }
            Step::UseStale { stale: i } => {
                if let (Some(s), Some(live)) = (pick(&stale, *i), pick(&ids, *i)) {
                    prop_assert!(matches!(g.node(s), Err(GraphError::Erased { .. })), "stale handle accepted");
                    prop_assert!(g.erase_node(s).is_err());
                    prop_assert!(g.set_args(live, vec![s.into()]).is_err());
                    prop_assert!(g.replace_all_uses_with(live, s).is_err());
                    prop_assert!(g.prepend(live, s).is_err());
                    prop_assert!(g.inserting_after(Some(s)).is_err());
                    prop_assert!(g.call_function(Target::named("relu"), vec![s.into()]).is_err());
                }
            }
            Step::UseForeign => {
                prop_assert!(matches!(g.node(foreign), Err(GraphError::ForeignNode { .. })), "foreign handle accepted");
                prop_assert!(g.erase_node(foreign).is_err());
                prop_assert!(g.call_function(Target::named("relu"), vec![foreign.into()]).is_err());
                if let Some(live) = g.first() {
                    prop_assert!(g.set_args(live, vec![foreign.into()]).is_err());
                    prop_assert!(g.is_before(live, foreign).is_err());
                }
            }
            Step::Sort => {
                g.stable_topological_sort().unwrap();
                g.lint().unwrap();
            }
            Step::Dce => {
                g.stable_topological_sort().unwrap();
                let before: Vec<NodeId> = g.node_ids();
                g.eliminate_dead_code(None).unwrap();
                for id in before {
                    if !g.contains(id) {
                        stale.push(id);
                    }
                }
            }
        }
        check_consistent(&g)?;
    }
    // Cycles are refused at mutation time, so the sort always succeeds and leaves lint clean.
    g.stable_topological_sort().unwrap();
    g.lint().unwrap();
    // Printing and codegen work on every graph.
    prop_assert_eq!(g.to_string().lines().count(), g.len() + 1);
    let _ = g.python_code();
    let _ = g.tabular();
    // The copy is identical.
    let (copy, _) = g.deep_copy().unwrap();
    prop_assert_eq!(copy.to_string(), g.to_string());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn random_edit_sequences_stay_consistent(steps in prop::collection::vec(step(), 1..24)) {
        run(&steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Erasing nodes during a cursor walk (forward or reverse) visits every other node exactly
    /// once, in order.
    #[test]
    fn erase_while_iterating(n in 1usize..30, erase_mask in any::<u32>(), reverse in any::<bool>()) {
        let mut g = Graph::new();
        let ids: Vec<NodeId> = (0..n).map(|_| g.placeholder("p").unwrap()).collect();
        let mut expected = ids.clone();
        if reverse {
            expected.reverse();
        }
        let mut seen = Vec::new();
        let mut cur = if reverse { g.cursor_rev() } else { g.cursor() };
        while let Some(id) = cur.next(&g) {
            seen.push(id);
            let k = ids.iter().position(|&i| i == id).unwrap();
            if erase_mask & (1 << (k % 32)) != 0 {
                g.erase_node(id).unwrap();
                // A node created right away may reuse the slot; the walk must not be confused.
                if k % 3 == 0 {
                    let extra = g.inserting_before(None).unwrap().placeholder("q").unwrap();
                    g.erase_node(extra).unwrap();
                }
            }
        }
        prop_assert_eq!(seen, expected);
        g.lint().unwrap();
    }
}
