//! FX's `SubgraphMatcher`: finds the occurrences of a pattern graph in a graph.
//!
//! The pattern's placeholders are wildcards (they match any value); its other nodes match
//! nodes with the same opcode and target whose arguments match the pattern's arguments
//! structurally (node for node, literal for equal literal, keyword arguments by name). Matching
//! is anchored at the pattern's returning nodes (the values its output returns) and walks their
//! inputs backwards, so one choice of anchors decides the whole match.
//!
//! A match is valid only if the nodes it would remove have no users outside the match: the
//! pattern's inner nodes may be used only inside the match (the returning nodes may be used
//! anywhere). Matches are reported in graph order of their first anchor; overlapping matches
//! are dropped in favour of the earlier one (FX's `remove_overlapping_matches`), so the result
//! is deterministic.
//!
//! ```
//! use ferrofx_fx::passes::SubgraphMatcher;
//! use ferrofx_fx::{Graph, Target};
//! // pattern: relu(add(a, b))
//! let mut p = Graph::new();
//! let (a, b) = (p.placeholder("a").unwrap(), p.placeholder("b").unwrap());
//! let s = p.call_function(Target::named("add"), vec![a.into(), b.into()]).unwrap();
//! let r = p.call_function(Target::named("relu"), vec![s.into()]).unwrap();
//! p.output(r.into()).unwrap();
//! // graph: relu(add(x, y)) and an unrelated relu
//! let mut g = Graph::new();
//! let (x, y) = (g.placeholder("x").unwrap(), g.placeholder("y").unwrap());
//! let s = g.call_function(Target::named("add"), vec![x.into(), y.into()]).unwrap();
//! let r = g.call_function(Target::named("relu"), vec![s.into()]).unwrap();
//! let r2 = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! g.output(ferrofx_fx::Argument::tuple([r.into(), r2.into()])).unwrap();
//! let found = SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap();
//! assert_eq!(found.len(), 1);
//! assert_eq!(found[0].placeholder_nodes, vec![x, y]);
//! assert_eq!(found[0].returning_nodes, vec![r]);
//! ```

use crate::graph::{Argument, Graph, GraphError, NodeId, Opcode, Result};
use std::collections::{HashMap, HashSet};

/// One occurrence of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// The graph node matched to the pattern's first returning node.
    pub anchor: NodeId,
    /// Pattern node → graph node, for every pattern node except the output.
    pub nodes_map: HashMap<NodeId, NodeId>,
    /// The graph values bound to the pattern's placeholders, in placeholder order.
    pub placeholder_nodes: Vec<NodeId>,
    /// The graph nodes matched to the pattern's returning nodes, in output order.
    pub returning_nodes: Vec<NodeId>,
}

impl Match {
    /// Graph nodes a rewrite would remove: every matched node except the placeholder bindings.
    pub fn inner_nodes(&self) -> HashSet<NodeId> {
        let bound: HashSet<NodeId> = self.placeholder_nodes.iter().copied().collect();
        self.nodes_map.values().copied().filter(|n| !bound.contains(n)).collect()
    }
}

/// A compiled pattern.
pub struct SubgraphMatcher<'p> {
    pattern: &'p Graph,
    placeholders: Vec<NodeId>,
    returning: Vec<NodeId>,
}

/// Pattern node → graph node and its inverse (a match is injective).
#[derive(Clone, Default)]
struct State {
    map: HashMap<NodeId, NodeId>,
    rev: HashMap<NodeId, NodeId>,
}

impl<'p> SubgraphMatcher<'p> {
    /// Checks and compiles `pattern`: it needs an output returning one node or a tuple/list of
    /// nodes, none of them a placeholder, and every node must contribute to the output (a dead
    /// pattern node could never be matched).
    pub fn new(pattern: &'p Graph) -> Result<SubgraphMatcher<'p>> {
        let bad = |msg: String| GraphError::Pattern(format!("invalid pattern: {msg}"));
        let out = pattern.output_node().ok_or_else(|| bad("it has no output node".to_string()))?;
        let out_node = pattern.node(out)?;
        let mut returning = vec![];
        match out_node.args().first() {
            Some(Argument::Node(n)) => returning.push(*n),
            Some(Argument::Tuple(items)) | Some(Argument::List(items)) => {
                for a in items.iter() {
                    match a {
                        Argument::Node(n) => returning.push(*n),
                        other => return Err(bad(format!("it returns the literal {other:?}; return nodes only"))),
                    }
                }
            }
            other => return Err(bad(format!("its output must be a node or a tuple of nodes, got {other:?}"))),
        }
        if returning.is_empty() {
            return Err(bad("it returns nothing".to_string()));
        }
        for &r in &returning {
            if pattern.node(r)?.op() == Opcode::Placeholder {
                return Err(bad(format!("it returns its input '{}' unchanged", pattern.node(r)?.name())));
            }
        }
        let placeholders: Vec<NodeId> =
            pattern.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.id()).collect();
        // every node must reach the output
        let mut live: HashSet<NodeId> = HashSet::new();
        let mut stack = returning.clone();
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(pattern.node(n)?.all_input_nodes());
            }
        }
        for n in pattern.iter() {
            if n.op() != Opcode::Output && !live.contains(&n.id()) {
                return Err(bad(format!("node '{}' does not contribute to the output", n.name())));
            }
        }
        Ok(SubgraphMatcher { pattern, placeholders, returning })
    }

    /// Every valid, non-overlapping occurrence of the pattern in `g`, in graph order of the
    /// first anchor.
    pub fn match_all(&self, g: &Graph) -> Result<Vec<Match>> {
        let first = self.pattern.node(self.returning[0])?;
        let mut found: Vec<Match> = vec![];
        let mut taken: HashSet<NodeId> = HashSet::new();
        for cand in g.iter() {
            if !self.same_node(&first, &cand) {
                continue;
            }
            let mut st = State::default();
            if !self.match_node(g, self.returning[0], cand.id(), &mut st)? {
                continue;
            }
            let Some(st) = self.match_anchors(g, 1, st)? else { continue };
            let m = self.to_match(st);
            if !self.contained(g, &m)? {
                continue;
            }
            let inner = m.inner_nodes();
            if inner.iter().any(|n| taken.contains(n)) {
                continue; // overlaps an earlier match: the first one wins
            }
            taken.extend(inner);
            found.push(m);
        }
        Ok(found)
    }

    /// Extends `st` with anchors `i..`, trying graph nodes in order (first success wins).
    fn match_anchors(&self, g: &Graph, i: usize, st: State) -> Result<Option<State>> {
        if i == self.returning.len() {
            return Ok(Some(st));
        }
        let p = self.returning[i];
        if st.map.contains_key(&p) {
            return self.match_anchors(g, i + 1, st);
        }
        let pn = self.pattern.node(p)?;
        for cand in g.iter() {
            if !self.same_node(&pn, &cand) || st.rev.contains_key(&cand.id()) {
                continue;
            }
            let mut next = st.clone();
            if self.match_node(g, p, cand.id(), &mut next)? {
                if let Some(done) = self.match_anchors(g, i + 1, next)? {
                    return Ok(Some(done));
                }
            }
        }
        Ok(None)
    }

    /// Same opcode and target (placeholders match anything).
    fn same_node(&self, p: &crate::graph::Node<'_>, n: &crate::graph::Node<'_>) -> bool {
        match p.op() {
            Opcode::Placeholder => true,
            Opcode::Output => false,
            op => op == n.op() && p.target() == n.target(),
        }
    }

    fn match_node(&self, g: &Graph, p: NodeId, n: NodeId, st: &mut State) -> Result<bool> {
        if let Some(&m) = st.map.get(&p) {
            return Ok(m == n);
        }
        if st.rev.contains_key(&n) {
            return Ok(false);
        }
        let pn = self.pattern.node(p)?;
        let gn = g.node(n)?;
        if !self.same_node(&pn, &gn) {
            return Ok(false);
        }
        st.map.insert(p, n);
        st.rev.insert(n, p);
        if pn.op() == Opcode::Placeholder {
            return Ok(true);
        }
        if pn.args().len() != gn.args().len() || pn.kwargs().len() != gn.kwargs().len() {
            return Ok(false);
        }
        for (pa, ga) in pn.args().iter().zip(gn.args()) {
            if !self.match_arg(g, pa, ga, st)? {
                return Ok(false);
            }
        }
        for (k, pa) in pn.kwargs() {
            match gn.kwargs().get(k) {
                Some(ga) if self.match_arg(g, pa, ga, st)? => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    fn match_arg(&self, g: &Graph, p: &Argument, a: &Argument, st: &mut State) -> Result<bool> {
        Ok(match (p, a) {
            (Argument::Node(pn), Argument::Node(gn)) => self.match_node(g, *pn, *gn, st)?,
            (Argument::Node(pn), _) => {
                // a placeholder also matches a literal only in FX's "match literals" mode; here
                // placeholders stand for values produced by nodes
                let _ = pn;
                false
            }
            (Argument::List(x), Argument::List(y)) | (Argument::Tuple(x), Argument::Tuple(y)) => {
                if x.len() != y.len() {
                    return Ok(false);
                }
                for (p, a) in x.iter().zip(y.iter()) {
                    if !self.match_arg(g, p, a, st)? {
                        return Ok(false);
                    }
                }
                true
            }
            (Argument::Dict(x), Argument::Dict(y)) => {
                if x.len() != y.len() {
                    return Ok(false);
                }
                for ((kp, p), (ka, a)) in x.iter().zip(y.iter()) {
                    if kp != ka || !self.match_arg(g, p, a, st)? {
                        return Ok(false);
                    }
                }
                true
            }
            (Argument::Slice(x), Argument::Slice(y)) => {
                self.match_arg(g, &x.start, &y.start, st)?
                    && self.match_arg(g, &x.stop, &y.stop, st)?
                    && self.match_arg(g, &x.step, &y.step, st)?
            }
            (Argument::Float(x), Argument::Float(y)) => x.to_bits() == y.to_bits() || x == y,
            (p, a) => p == a,
        })
    }

    fn to_match(&self, st: State) -> Match {
        let placeholder_nodes = self.placeholders.iter().filter_map(|p| st.map.get(p).copied()).collect();
        let returning_nodes: Vec<NodeId> = self.returning.iter().filter_map(|p| st.map.get(p).copied()).collect();
        Match { anchor: returning_nodes[0], nodes_map: st.map, placeholder_nodes, returning_nodes }
    }

    /// The inner nodes (matched, not returning, not bound to placeholders) are used only
    /// inside the match.
    fn contained(&self, g: &Graph, m: &Match) -> Result<bool> {
        let inner = m.inner_nodes();
        let returning: HashSet<NodeId> = m.returning_nodes.iter().copied().collect();
        for &n in &inner {
            if returning.contains(&n) {
                continue;
            }
            if g.node(n)?.users().any(|u| !inner.contains(&u)) {
                return Ok(false);
            }
        }
        // placeholders unused by the pattern (never matched) are not allowed to go missing
        Ok(m.placeholder_nodes.len() == self.placeholders.len())
    }
}
