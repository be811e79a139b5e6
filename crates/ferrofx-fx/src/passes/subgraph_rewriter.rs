//! FX's `replace_pattern`: replaces every occurrence of a pattern graph by a replacement graph.
//!
//! The replacement's placeholders receive, in order, the values bound to the pattern's
//! placeholders; its output values replace the pattern's returning values, in order. The
//! replacement nodes are inserted after the last input of the match and before the first
//! outside use of its results; the matched nodes are erased. Matches are those of
//! [`SubgraphMatcher::match_all`] (non-overlapping, first wins) and are returned.
//!
//! ```
//! use ferrofx_fx::passes::replace_pattern;
//! use ferrofx_fx::{Graph, Target};
//! let relu_of = |op: &str| {
//!     let mut p = Graph::new();
//!     let x = p.placeholder("x").unwrap();
//!     let r = p.call_function(Target::named(op), vec![x.into()]).unwrap();
//!     p.output(r.into()).unwrap();
//!     p
//! };
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! g.output(r.into()).unwrap();
//! let matches = replace_pattern(&mut g, &relu_of("relu"), &relu_of("gelu")).unwrap();
//! assert_eq!(matches.len(), 1);
//! assert!(g.to_string().contains("call_function[target=gelu](args = (%x,)"));
//! ```

use super::matcher::{Match, SubgraphMatcher};
use crate::graph::{Argument, Graph, GraphError, InsertPoint, NodeId, Opcode, Result};
use std::collections::{HashMap, HashSet};

fn invalid(msg: String) -> GraphError {
    GraphError::Pattern(msg)
}

/// Replaces every non-overlapping occurrence of `pattern` in `g` by `replacement`; returns the
/// matches replaced. The graph passes `lint` afterwards.
pub fn replace_pattern(g: &mut Graph, pattern: &Graph, replacement: &Graph) -> Result<Vec<Match>> {
    let matcher = SubgraphMatcher::new(pattern)?;
    let rep_placeholders: Vec<NodeId> =
        replacement.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.id()).collect();
    let n_pattern_inputs = pattern.iter().filter(|n| n.op() == Opcode::Placeholder).count();
    if rep_placeholders.len() != n_pattern_inputs {
        return Err(invalid(format!(
            "the replacement takes {} inputs but the pattern binds {n_pattern_inputs}",
            rep_placeholders.len()
        )));
    }
    let rep_out = replacement.output_node().ok_or_else(|| invalid("the replacement has no output".to_string()))?;
    let rep_values: Vec<Argument> = match replacement.node(rep_out)?.args().first() {
        Some(Argument::Tuple(items)) | Some(Argument::List(items)) => items.to_vec(),
        Some(a) => vec![a.clone()],
        None => vec![],
    };
    let matches = matcher.match_all(g)?;
    if let Some(m) = matches.first() {
        if rep_values.len() != m.returning_nodes.len() {
            return Err(invalid(format!(
                "the replacement returns {} values but the pattern returns {}",
                rep_values.len(),
                m.returning_nodes.len()
            )));
        }
    }
    // a later match may consume a value an earlier rewrite replaced: follow the replacements
    let mut replaced: HashMap<NodeId, NodeId> = HashMap::new();
    for m in &matches {
        let mut m = m.clone();
        for p in &mut m.placeholder_nodes {
            while let Some(&n) = replaced.get(p) {
                *p = n;
            }
        }
        let new = rewrite(g, &m, replacement, &rep_placeholders, &rep_values)?;
        replaced.extend(m.returning_nodes.iter().copied().zip(new));
    }
    Ok(matches)
}

fn rewrite(
    g: &mut Graph,
    m: &Match,
    replacement: &Graph,
    rep_placeholders: &[NodeId],
    rep_values: &[Argument],
) -> Result<Vec<NodeId>> {
    let inner = m.inner_nodes();
    // insertion point: after the last input, before the first matched node if possible
    let mut first_inner: Option<NodeId> = None;
    for n in g.iter() {
        if inner.contains(&n.id()) {
            first_inner = Some(n.id());
            break;
        }
    }
    let first_inner = first_inner.ok_or_else(|| invalid("empty match".to_string()))?;
    let mut last_input: Option<NodeId> = None;
    for &p in &m.placeholder_nodes {
        if last_input.is_none_or(|l| g.is_before(l, p).unwrap_or(false)) {
            last_input = Some(p);
        }
    }
    let point = match last_input {
        Some(l) if g.is_before(first_inner, l)? => InsertPoint::After(l),
        _ => InsertPoint::Before(first_inner),
    };
    if let InsertPoint::After(l) = point {
        for &r in &m.returning_nodes {
            for u in g.node(r)?.users() {
                if !inner.contains(&u) && g.is_before(u, l)? {
                    return Err(invalid(format!(
                        "cannot place the replacement: '{}' uses the match's result before its input '{}' is computed",
                        g.node(u)?.name(),
                        g.node(l)?.name()
                    )));
                }
            }
        }
    }
    let mut env: HashMap<NodeId, NodeId> =
        rep_placeholders.iter().copied().zip(m.placeholder_nodes.iter().copied()).collect();
    g.with_insert_point(point, |g| -> Result<()> {
        for n in replacement.iter() {
            if matches!(n.op(), Opcode::Placeholder | Opcode::Output) {
                continue;
            }
            let new = g.node_copy(&n, |x| {
                env.get(&x)
                    .map(|&v| Argument::Node(v))
                    .ok_or_else(|| invalid(format!("replacement node '{}' uses a value defined after it", n.name())))
            })?;
            env.insert(n.id(), new);
        }
        Ok(())
    })??;
    let mut results = Vec::with_capacity(rep_values.len());
    for (r, v) in m.returning_nodes.iter().zip(rep_values) {
        let new = match v {
            Argument::Node(x) => {
                *env.get(x).ok_or_else(|| invalid("the replacement returns a value it does not define".to_string()))?
            }
            other => {
                return Err(invalid(format!(
                    "the replacement returns the literal {other:?}; a node's uses can only be rerouted to a node"
                )))
            }
        };
        g.replace_all_uses_with(*r, new)?;
        results.push(new);
    }
    // erase the matched nodes, users before their inputs
    let mut order: Vec<NodeId> = g.iter().map(|n| n.id()).filter(|n| inner.contains(n)).collect();
    order.reverse();
    let erased: HashSet<NodeId> = order.iter().copied().collect();
    debug_assert_eq!(erased.len(), inner.len());
    for n in order {
        g.erase_node(n)?;
    }
    Ok(results)
}
