//! FX's subgraph rewriter (`torch.fx.subgraph_rewriter`): replaces every occurrence of a
//! pattern graph by a replacement graph.
//!
//! As in FX: matches are those of [`SubgraphMatcher::match_all`] (non-overlapping, first
//! wins), kept if every filter accepts them; for each match, in order, the replacement's
//! placeholders receive the values bound to the pattern's placeholders (a value an earlier
//! rewrite replaced is followed to its replacement, so one match may consume another's result);
//! the replacement is copied before the first user of the match's returning nodes (or, when
//! they have none, before the node after the last of them); its output values take over the
//! returning nodes' uses, in order; the matched nodes are erased.
//!
//! [`replace_pattern`] returns FX's `Match` (`anchor`, `nodes_map`),
//! [`replace_pattern_with_filters`] FX's `ReplacedPatterns` (plus `replacements`, the nodes
//! added). [`replace_pattern_in_module`] works on a [`GraphModule`] and copies the attributes
//! and submodules the replacement's `get_attr`/`call_module` nodes need from the replacement
//! GraphModule (FX's `_replace_attributes`), after deleting those no node uses any more.
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
//! let pattern = relu_of("relu");
//! let matches = replace_pattern(&mut g, &pattern, &relu_of("gelu")).unwrap();
//! assert_eq!(matches.len(), 1);
//! assert_eq!(pattern.node(matches[0].anchor).unwrap().name(), "relu"); // a pattern node
//! assert!(g.to_string().contains("call_function[target=gelu](args = (%x,)"));
//! ```

use super::matcher::{InternalMatch, SubgraphMatcher};
use crate::graph::{Argument, Graph, GraphError, InsertPoint, NodeId, Opcode, Result};
use crate::graph_module::GraphModule;
use std::collections::HashMap;

fn invalid(msg: String) -> GraphError {
    GraphError::Pattern(msg)
}

/// FX's `Match`: what [`replace_pattern`] returns for each replaced occurrence.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// The pattern node the match was found from (the pattern's first anchor).
    pub anchor: NodeId,
    /// Pattern node → graph node (the graph nodes matched to the pattern's compute nodes have
    /// been erased by the rewrite, as in FX; placeholders map to their bindings after earlier
    /// rewrites).
    pub nodes_map: HashMap<NodeId, NodeId>,
}

/// FX's `ReplacedPatterns`: a [`Match`] plus the nodes the rewrite added.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplacedPatterns {
    /// The pattern node the match was found from (the pattern's first anchor).
    pub anchor: NodeId,
    /// Pattern node → graph node, as in [`Match::nodes_map`].
    pub nodes_map: HashMap<NodeId, NodeId>,
    /// What each pattern placeholder was bound to (a node, or a literal or list), after
    /// earlier rewrites.
    pub placeholder_nodes: Vec<Argument>,
    /// The graph nodes copied from the replacement, in the replacement's order.
    pub replacements: Vec<NodeId>,
}

/// A match filter: `(match, original graph, pattern graph) -> keep?` (FX's `match_filters`).
pub type MatchFilter<'a> = dyn Fn(&InternalMatch, &Graph, &Graph) -> bool + 'a;

/// Builds the replacement of one match: `(match, original graph, pattern graph) -> graph`
/// (FX's `replacement_callback`).
pub type ReplacementCallback<'a> = dyn Fn(&InternalMatch, &Graph, &Graph) -> Result<Graph> + 'a;

/// The replacement of [`replace_pattern_with_filters`]: one graph for every match, or a
/// callback building one per match.
pub enum Replacement<'a> {
    /// The same replacement graph for every match.
    Graph(&'a Graph),
    /// FX's `replacement_callback`.
    Callback(&'a ReplacementCallback<'a>),
}

/// FX's `replace_pattern`: replaces every non-overlapping occurrence of `pattern` in `g` by
/// `replacement`; returns the matches replaced. The graph passes `lint` afterwards.
pub fn replace_pattern(g: &mut Graph, pattern: &Graph, replacement: &Graph) -> Result<Vec<Match>> {
    Ok(replace_pattern_with_filters(g, pattern, Replacement::Graph(replacement), &[], false)?
        .into_iter()
        .map(|r| Match { anchor: r.anchor, nodes_map: r.nodes_map })
        .collect())
}

/// FX's `replace_pattern_with_filters`: [`replace_pattern`] keeping only the matches every
/// filter accepts, with literals as wildcards if `ignore_literals`, and a replacement graph or
/// a callback building one per match.
///
/// ```
/// use ferrofx_fx::passes::{replace_pattern_with_filters, Replacement};
/// use ferrofx_fx::{Argument, Graph, Target};
/// // pattern: add(x, c) for any literal c (c binds the literal); replacement: sub(x, c)
/// let build = |op: &str| {
///     let mut p = Graph::new();
///     let (x, c) = (p.placeholder("x").unwrap(), p.placeholder("c").unwrap());
///     let r = p.call_function(Target::named(op), vec![x.into(), c.into()]).unwrap();
///     p.output(r.into()).unwrap();
///     p
/// };
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// let a = g.call_function(Target::named("add"), vec![x.into(), Argument::Int(3)]).unwrap();
/// g.output(a.into()).unwrap();
/// let keep_small = |m: &ferrofx_fx::passes::InternalMatch, _: &Graph, _: &Graph| {
///     m.placeholder_nodes[1] == Argument::Int(3)
/// };
/// let done = replace_pattern_with_filters(&mut g, &build("add"), Replacement::Graph(&build("sub")), &[&keep_small], false)
///     .unwrap();
/// assert_eq!(done.len(), 1);
/// assert_eq!(done[0].replacements.len(), 1);
/// assert!(g.to_string().contains("call_function[target=sub](args = (%x, 3)"));
/// ```
pub fn replace_pattern_with_filters(
    g: &mut Graph,
    pattern: &Graph,
    replacement: Replacement<'_>,
    match_filters: &[&MatchFilter<'_>],
    ignore_literals: bool,
) -> Result<Vec<ReplacedPatterns>> {
    let matcher = SubgraphMatcher::new(pattern)?.ignore_literals(ignore_literals);
    let matches: Vec<InternalMatch> =
        matcher.match_all(g)?.into_iter().filter(|m| match_filters.iter().all(|f| f(m, g, pattern))).collect();
    let pattern_placeholders: Vec<NodeId> =
        pattern.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.id()).collect();
    let pattern_compute: Vec<NodeId> =
        pattern.iter().filter(|n| !matches!(n.op(), Opcode::Placeholder | Opcode::Output)).map(|n| n.id()).collect();
    // a later match may consume a value an earlier rewrite replaced: follow the replacements
    let mut changed: HashMap<NodeId, NodeId> = HashMap::new();
    let mut done = Vec::with_capacity(matches.len());
    for mut m in matches {
        let built;
        let rep: &Graph = match &replacement {
            Replacement::Graph(r) => r,
            Replacement::Callback(f) => {
                built = f(&m, g, pattern)?;
                &built
            }
        };
        for (i, binding) in m.placeholder_nodes.iter_mut().enumerate() {
            *binding = binding.map_nodes(&mut |n| Argument::Node(follow(&changed, n)));
            if let Argument::Node(n) = binding {
                m.nodes_map.insert(pattern_placeholders[i], *n);
            }
        }
        let replacements = rewrite(g, &m, rep, &pattern_compute, &mut changed)?;
        done.push(ReplacedPatterns {
            anchor: m.anchors[0],
            nodes_map: m.nodes_map,
            placeholder_nodes: m.placeholder_nodes,
            replacements,
        });
    }
    Ok(done)
}

/// [`replace_pattern_with_filters`] on a [`GraphModule`], with a replacement GraphModule
/// whose attributes and submodules are copied in as FX's `_replace_attributes` does: unused
/// submodules and attributes are deleted first; then each `call_module`/`get_attr` target the
/// GraphModule lacks is copied from `replacement` (a target both have keeps the GraphModule's
/// own); a target neither has is an error.
pub fn replace_pattern_in_module(
    gm: &mut GraphModule,
    pattern: &Graph,
    replacement: &GraphModule,
    match_filters: &[&MatchFilter<'_>],
    ignore_literals: bool,
) -> Result<Vec<ReplacedPatterns>> {
    let done = replace_pattern_with_filters(
        gm.graph_mut(),
        pattern,
        Replacement::Graph(replacement.graph()),
        match_filters,
        ignore_literals,
    )?;
    gm.delete_all_unused_submodules();
    let targets: Vec<(Opcode, String, String)> = gm
        .graph()
        .iter()
        .filter(|n| matches!(n.op(), Opcode::CallModule | Opcode::GetAttr))
        .map(|n| (n.op(), n.target().name().to_string(), n.name().to_string()))
        .collect();
    for (op, target, node) in targets {
        if op == Opcode::CallModule {
            if gm.leaf_modules().contains_key(&target) {
                continue;
            }
            let copy = replacement.leaf_modules().get(&target).and_then(|m| m.clone_module());
            match copy {
                Some(m) => {
                    if !gm.add_submodule(&target, m).map_err(|e| invalid(e.to_string()))? {
                        return Err(invalid(format!(
                            "the replacement's module '{target}' cannot be added: a prefix of its path is a tensor of the module"
                        )));
                    }
                }
                None => return Err(missing_attribute(op, &target, &node)),
            }
        } else {
            if gm.attributes().contains_key(&target) {
                continue;
            }
            match replacement.attributes().get(&target) {
                Some(e) => {
                    // FX deep-copies the replacement's attribute
                    let t =
                        deep_copy(&e.tensor).map_err(|err| invalid(format!("copying attribute '{target}': {err}")))?;
                    gm.register_attribute(&target, t, e.kind);
                }
                None => return Err(missing_attribute(op, &target, &node)),
            }
        }
    }
    gm.graph().lint()?;
    Ok(done)
}

fn deep_copy(t: &ferrofx_core::Tensor) -> ferrofx_core::Result<ferrofx_core::Tensor> {
    let out = ferrofx_core::ops::kernel::zeros(t.shape(), t.dtype())?;
    ferrofx_core::ops::kernel::copy_into("replace_pattern", &out, t)?;
    Ok(out)
}

fn missing_attribute(op: Opcode, target: &str, node: &str) -> GraphError {
    invalid(format!(
        "Attempted to create a \"{op}\" node ('{node}') during subgraph rewriting with target {target}, but the \
         referenced attribute does not exist in the replacement GraphModule"
    ))
}

fn follow(changed: &HashMap<NodeId, NodeId>, mut n: NodeId) -> NodeId {
    while let Some(&m) = changed.get(&n) {
        n = m;
    }
    n
}

/// Rewrites one match; returns the nodes added.
fn rewrite(
    g: &mut Graph,
    m: &InternalMatch,
    replacement: &Graph,
    pattern_compute: &[NodeId],
    changed: &mut HashMap<NodeId, NodeId>,
) -> Result<Vec<NodeId>> {
    let rep_placeholders: Vec<NodeId> =
        replacement.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.id()).collect();
    if rep_placeholders.len() != m.placeholder_nodes.len() {
        return Err(invalid(format!(
            "the replacement takes {} inputs but the pattern binds {} (the replacement needs as many parameters as the pattern, used or not)",
            rep_placeholders.len(),
            m.placeholder_nodes.len()
        )));
    }
    let rep_out = replacement.output_node().ok_or_else(|| invalid("the replacement has no output".to_string()))?;
    let rep_values: Vec<Argument> = match replacement.node(rep_out)?.args().first() {
        Some(Argument::Tuple(items)) | Some(Argument::List(items)) => items.to_vec(),
        Some(a) => vec![a.clone()],
        None => vec![],
    };
    if rep_values.len() != m.returning_nodes.len() {
        return Err(invalid(format!(
            "the replacement returns {} values but the pattern returns {}",
            rep_values.len(),
            m.returning_nodes.len()
        )));
    }
    // each returned value must become a node: a replacement node, or a placeholder bound to one
    for (&r, v) in m.returning_nodes.iter().zip(&rep_values) {
        let ok = match v {
            Argument::Node(x) => match rep_placeholders.iter().position(|p| p == x) {
                Some(i) => matches!(m.placeholder_nodes[i], Argument::Node(_)),
                None => true,
            },
            _ => false,
        };
        if !ok {
            return Err(invalid(format!(
                "the replacement returns {v:?} for '{}'; a node's uses can only be rerouted to a node",
                g.node(r)?.name()
            )));
        }
    }
    // insertion point: the first user of a returning node, else the node after the last one
    let mut first_user: Option<NodeId> = None;
    let mut last_returning = m.returning_nodes[0];
    for &r in &m.returning_nodes {
        if g.is_before(last_returning, r)? {
            last_returning = r;
        }
        for u in g.node(r)?.users() {
            if first_user.is_none_or(|f| g.is_before(u, f).unwrap_or(false)) {
                first_user = Some(u);
            }
        }
    }
    let point = match first_user {
        Some(p) => p,
        None => g
            .next(last_returning)?
            .ok_or_else(|| invalid("the match's results are the last nodes of the graph".to_string()))?,
    };
    let mut env: HashMap<NodeId, Argument> =
        rep_placeholders.iter().copied().zip(m.placeholder_nodes.iter().cloned()).collect();
    let mut added = vec![];
    g.with_insert_point(InsertPoint::Before(point), |g| -> Result<()> {
        for n in replacement.iter() {
            if matches!(n.op(), Opcode::Placeholder | Opcode::Output) {
                continue;
            }
            let new = g.node_copy(&n, |x| {
                env.get(&x)
                    .cloned()
                    .ok_or_else(|| invalid(format!("replacement node '{}' uses a value defined after it", n.name())))
            })?;
            env.insert(n.id(), Argument::Node(new));
            added.push(new);
        }
        Ok(())
    })??;
    for (&r, v) in m.returning_nodes.iter().zip(&rep_values) {
        let new = match v.map_nodes(&mut |x| env.get(&x).cloned().unwrap_or(Argument::None)) {
            Argument::Node(x) => x,
            other => return Err(invalid(format!("the replacement returns {other:?}; expected a node"))),
        };
        if new != r {
            g.replace_all_uses_with(r, new)?;
            changed.insert(r, new);
        }
    }
    // erase the matched nodes in reverse pattern order (users before their inputs)
    for p in pattern_compute.iter().rev() {
        let n = *m.nodes_map.get(p).ok_or_else(|| invalid("a pattern node is missing from the match".to_string()))?;
        g.erase_node(n)?;
    }
    Ok(added)
}
