//! FX's `SubgraphMatcher` (`torch.fx.passes.utils.matcher_utils`): finds the occurrences of a
//! pattern graph in a graph.
//!
//! As in FX (`match_output=False`, `match_placeholder=False`):
//!
//! - the pattern's placeholders are wildcards: they bind a graph node, or a literal or list the
//!   graph passes where the pattern has a placeholder (one placeholder binds one value: using it
//!   twice requires the same value twice);
//! - the other pattern nodes match graph nodes with the same opcode and target whose arguments
//!   match (node for node, sequence for sequence item by item, literal for a literal of the same
//!   kind and value); `get_attr` nodes match by kind, not by name (every attribute a
//!   [`crate::GraphModule`] holds is a tensor, and FX matches tensor attributes whatever their
//!   name or value); when the argument layouts differ, a registry op's arguments are compared
//!   after normalising them by its schema (positional, keyword and default alike);
//! - matching starts at the pattern's *anchors* (the returning nodes used only by the output)
//!   and walks inputs backwards; every combination of anchor candidates is tried (backtracking);
//! - a match is kept only if it is self-contained (its inner nodes are used only inside it; the
//!   returning nodes may be used anywhere), fusing it would not form a cycle, and it does not
//!   overlap an earlier match (the first wins, in graph order of the first anchor's candidate).
//!
//! With `ignore_literals`, literals are wildcards: any two non-node arguments match.
//!
//! ```
//! use ferrofx_fx::passes::SubgraphMatcher;
//! use ferrofx_fx::{Argument, Graph, Target};
//! // pattern: relu(add(a, b))
//! let mut p = Graph::new();
//! let (a, b) = (p.placeholder("a").unwrap(), p.placeholder("b").unwrap());
//! let s = p.call_function(Target::named("add"), vec![a.into(), b.into()]).unwrap();
//! let r = p.call_function(Target::named("relu"), vec![s.into()]).unwrap();
//! p.output(r.into()).unwrap();
//! // graph: relu(add(x, 2.0)) and an unrelated relu
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let s2 = g.call_function(Target::named("add"), vec![x.into(), Argument::Float(2.0)]).unwrap();
//! let r2 = g.call_function(Target::named("relu"), vec![s2.into()]).unwrap();
//! let r3 = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! g.output(Argument::tuple([r2.into(), r3.into()])).unwrap();
//! let found = SubgraphMatcher::new(&p).unwrap().match_all(&g).unwrap();
//! assert_eq!(found.len(), 1);
//! assert_eq!(found[0].anchors, vec![r]); // the pattern's node, as in FX
//! assert_eq!(found[0].placeholder_nodes, vec![Argument::Node(x), Argument::Float(2.0)]);
//! assert_eq!(found[0].returning_nodes, vec![r2]);
//! ```

use crate::graph::{Argument, Graph, GraphError, Kwargs, Node, NodeId, Opcode, Result, Target};
use std::collections::{HashMap, HashSet};

/// One occurrence of a pattern (FX's `InternalMatch`).
#[derive(Debug, Clone, PartialEq)]
pub struct InternalMatch {
    /// The pattern's anchors (its returning nodes used only by its output), pattern nodes.
    pub anchors: Vec<NodeId>,
    /// Pattern node → graph node, for every pattern node matched to a graph node (placeholders
    /// bound to a literal or list appear in [`InternalMatch::placeholder_nodes`] only: a map of
    /// nodes cannot hold a literal, FX's dict can).
    pub nodes_map: HashMap<NodeId, NodeId>,
    /// What each pattern placeholder is bound to, in placeholder order: a graph node, or the
    /// literal or list the graph passes in its place.
    pub placeholder_nodes: Vec<Argument>,
    /// The graph nodes matched to the pattern's returning nodes, in output order.
    pub returning_nodes: Vec<NodeId>,
}

impl InternalMatch {
    /// The matched graph nodes a rewrite replaces: the images of every pattern node except the
    /// placeholders (and the output).
    pub fn compute_nodes(&self, pattern: &Graph) -> Vec<NodeId> {
        pattern
            .iter()
            .filter(|n| !matches!(n.op(), Opcode::Placeholder | Opcode::Output))
            .filter_map(|n| self.nodes_map.get(&n.id()).copied())
            .collect()
    }
}

/// A compiled pattern.
pub struct SubgraphMatcher<'p> {
    pattern: &'p Graph,
    placeholders: Vec<NodeId>,
    returning: Vec<NodeId>,
    anchors: Vec<NodeId>,
    ignore_literals: bool,
}

/// A match under construction: pattern node → graph node and its inverse (injective on
/// nodes), and the literal bindings of placeholders.
#[derive(Clone, Default)]
struct State {
    map: HashMap<NodeId, NodeId>,
    rev: HashMap<NodeId, NodeId>,
    literals: HashMap<NodeId, Argument>,
}

impl<'p> SubgraphMatcher<'p> {
    /// Checks and compiles `pattern`: it needs an output returning one node or a tuple/list of
    /// nodes, none of them a placeholder, and no dead node (FX: "SubgraphMatcher cannot be
    /// initialized with a pattern with dead code"; unused placeholders are allowed, but a match
    /// must bind every placeholder).
    pub fn new(pattern: &'p Graph) -> Result<SubgraphMatcher<'p>> {
        let bad = |msg: String| GraphError::Pattern(format!("invalid pattern: {msg}"));
        if pattern.is_empty() {
            return Err(bad("SubgraphMatcher cannot be initialized with an empty pattern".to_string()));
        }
        let out = pattern.output_node().ok_or_else(|| bad("it has no output node".to_string()))?;
        let out_node = pattern.node(out)?;
        let mut returning = vec![];
        match out_node.args().first() {
            Some(Argument::Node(n)) => returning.push(*n),
            Some(Argument::Tuple(items)) | Some(Argument::List(items)) => {
                for a in items.iter() {
                    match a {
                        Argument::Node(n) => {
                            if !returning.contains(n) {
                                returning.push(*n)
                            }
                        }
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
        for n in pattern.iter() {
            if !matches!(n.op(), Opcode::Output | Opcode::Placeholder) && n.num_users() == 0 && !n.is_impure() {
                return Err(bad(format!(
                    "node '{}' is dead code (no users): SubgraphMatcher cannot be initialized with a pattern with dead code",
                    n.name()
                )));
            }
        }
        let placeholders: Vec<NodeId> =
            pattern.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.id()).collect();
        let mut anchors = vec![];
        for &r in &returning {
            if pattern.node(r)?.num_users() == 1 {
                anchors.push(r);
            }
        }
        Ok(SubgraphMatcher { pattern, placeholders, returning, anchors, ignore_literals: false })
    }

    /// FX's `ignore_literals=True`: literals are wildcards (any two non-node arguments match).
    pub fn ignore_literals(mut self, ignore: bool) -> Self {
        self.ignore_literals = ignore;
        self
    }

    /// The pattern's anchors (FX's `pattern_anchors`).
    pub fn anchors(&self) -> &[NodeId] {
        &self.anchors
    }

    /// Every valid, non-overlapping occurrence of the pattern in `g` (FX's `match`), in graph
    /// order of the first anchor's candidate.
    pub fn match_all(&self, g: &Graph) -> Result<Vec<InternalMatch>> {
        let mut candidates: Vec<Vec<NodeId>> = Vec::with_capacity(self.anchors.len());
        for &a in &self.anchors {
            let pa = self.pattern.node(a)?;
            candidates.push(g.iter().filter(|n| self.nodes_are_equal(&pa, n)).map(|n| n.id()).collect());
        }
        let mut complete = vec![];
        if !self.anchors.is_empty() {
            self.backtrack(g, &candidates, 0, State::default(), &mut complete)?;
        }
        let mut found: Vec<InternalMatch> = vec![];
        let mut taken: HashSet<NodeId> = HashSet::new();
        for st in complete {
            let Some(m) = self.to_match(st) else { continue };
            let compute = m.compute_nodes(self.pattern);
            if !self.is_contained(g, &m)? || !validate_partition(g, &compute)? {
                continue;
            }
            if compute.iter().any(|n| taken.contains(n)) {
                continue; // overlaps an earlier match: the first one wins
            }
            taken.extend(compute);
            found.push(m);
        }
        Ok(found)
    }

    fn backtrack(
        &self,
        g: &Graph,
        candidates: &[Vec<NodeId>],
        i: usize,
        st: State,
        out: &mut Vec<State>,
    ) -> Result<()> {
        if i == candidates.len() {
            out.push(st);
            return Ok(());
        }
        for &cand in &candidates[i] {
            let mut next = st.clone();
            if self.match_nodes(g, self.anchors[i], cand, &mut next)? {
                self.backtrack(g, candidates, i + 1, next, out)?;
            }
        }
        Ok(())
    }

    /// FX's `_nodes_are_equal`: placeholders match anything; `get_attr` by kind; else same
    /// opcode and target.
    fn nodes_are_equal(&self, p: &Node<'_>, n: &Node<'_>) -> bool {
        match p.op() {
            Opcode::Placeholder => true,
            Opcode::Output => n.op() == Opcode::Output,
            Opcode::GetAttr => n.op() == Opcode::GetAttr,
            op => op == n.op() && p.target() == n.target(),
        }
    }

    fn match_nodes(&self, g: &Graph, p: NodeId, n: NodeId, st: &mut State) -> Result<bool> {
        if let Some(&m) = st.map.get(&p) {
            return Ok(m == n);
        }
        if st.literals.contains_key(&p) || st.rev.contains_key(&n) {
            return Ok(false);
        }
        let pn = self.pattern.node(p)?;
        let gn = g.node(n)?;
        if !self.nodes_are_equal(&pn, &gn) {
            return Ok(false);
        }
        let saved = st.clone();
        st.map.insert(p, n);
        st.rev.insert(n, p);
        if pn.op() == Opcode::Placeholder {
            return Ok(true);
        }
        let same_layout = pn.args().len() == gn.args().len() && pn.kwargs().keys().eq(gn.kwargs().keys());
        let ok = if same_layout {
            // same lengths and keys: compare argument by argument
            let pa = pn.args().iter().chain(pn.kwargs().values());
            let ga = gn.args().iter().chain(gn.kwargs().values());
            self.match_pairs(g, pa.zip(ga), st)?
        } else {
            match (pn.op(), pn.target()) {
                (Opcode::CallFunction, Target::Op(op)) => {
                    match (normalize(op, pn.args(), pn.kwargs()), normalize(op, gn.args(), gn.kwargs())) {
                        (Some(pa), Some(ga)) => self.match_seq(g, pa.iter(), ga.iter(), st)?,
                        _ => false,
                    }
                }
                _ => false,
            }
        };
        if !ok {
            *st = saved;
        }
        Ok(ok)
    }

    fn match_seq<'a>(
        &self,
        g: &Graph,
        p: impl ExactSizeIterator<Item = &'a Argument>,
        a: impl ExactSizeIterator<Item = &'a Argument>,
        st: &mut State,
    ) -> Result<bool> {
        if p.len() != a.len() {
            return Ok(false);
        }
        self.match_pairs(g, p.zip(a), st)
    }

    fn match_pairs<'a>(
        &self,
        g: &Graph,
        pairs: impl Iterator<Item = (&'a Argument, &'a Argument)>,
        st: &mut State,
    ) -> Result<bool> {
        for (p, a) in pairs {
            if !self.match_arg(g, p, a, st)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn match_arg(&self, g: &Graph, p: &Argument, a: &Argument, st: &mut State) -> Result<bool> {
        Ok(match (p, a) {
            (Argument::Node(pn), Argument::Node(gn)) => self.match_nodes(g, *pn, *gn, st)?,
            (Argument::List(x) | Argument::Tuple(x), Argument::List(y) | Argument::Tuple(y)) => {
                self.match_seq(g, x.iter(), y.iter(), st)?
            }
            (Argument::Node(pn), lit) => {
                // a placeholder binds whatever the graph passes (FX's `_match_literals`)
                if self.pattern.node(*pn)?.op() != Opcode::Placeholder {
                    false
                } else if let Some(bound) = st.literals.get(pn) {
                    same_literal(bound, lit)
                } else if st.map.contains_key(pn) {
                    false
                } else {
                    st.literals.insert(*pn, lit.clone());
                    true
                }
            }
            (_, Argument::Node(_)) => self.ignore_literals,
            (p, a) => self.ignore_literals || same_literal(p, a),
        })
    }

    fn to_match(&self, st: State) -> Option<InternalMatch> {
        // a placeholder the pattern never uses binds nothing: such a match is incomplete
        let placeholder_nodes = self
            .placeholders
            .iter()
            .map(|p| st.map.get(p).map(|&n| Argument::Node(n)).or_else(|| st.literals.get(p).cloned()))
            .collect::<Option<Vec<_>>>()?;
        let returning_nodes = self.returning.iter().map(|p| st.map.get(p).copied()).collect::<Option<Vec<_>>>()?;
        Some(InternalMatch { anchors: self.anchors.clone(), nodes_map: st.map, placeholder_nodes, returning_nodes })
    }

    /// FX's `_is_contained`: the matched nodes (but the placeholders' bindings and the
    /// returning nodes) are used only inside the match.
    fn is_contained(&self, g: &Graph, m: &InternalMatch) -> Result<bool> {
        let mut lookup: HashMap<NodeId, NodeId> = HashMap::new();
        for (&p, &n) in &m.nodes_map {
            if self.pattern.node(p)?.op() != Opcode::Placeholder {
                lookup.insert(n, p);
            }
        }
        for (&n, p) in &lookup {
            if self.returning.contains(p) {
                continue;
            }
            if g.node(n)?.users().any(|u| !lookup.contains_key(&u)) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// FX's `validate_partition`: `false` when fusing `partition` would form a cycle (a value
/// leaves the partition and comes back into it through outside nodes). Only nodes before the
/// partition's last node can lead back into it, which bounds the walk.
fn validate_partition(g: &Graph, partition: &[NodeId]) -> Result<bool> {
    let inside: HashSet<NodeId> = partition.iter().copied().collect();
    let Some(mut last) = partition.first().copied() else { return Ok(true) };
    for &n in partition {
        if g.is_before(last, n)? {
            last = n;
        }
    }
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = vec![];
    for &n in partition {
        stack.extend(g.node(n)?.users().filter(|u| !inside.contains(u)));
    }
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || !g.is_before(n, last)? {
            continue;
        }
        for u in g.node(n)?.users() {
            if inside.contains(&u) {
                return Ok(false);
            }
            stack.push(u);
        }
    }
    Ok(true)
}

/// FX's literal equality: same Python type and equal value (`1` does not match `1.0`).
fn same_literal(p: &Argument, a: &Argument) -> bool {
    match (p, a) {
        (Argument::Float(x), Argument::Float(y)) => x == y || x.to_bits() == y.to_bits(),
        (Argument::Dict(x), Argument::Dict(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|((kx, vx), (ky, vy))| kx == ky && same_literal(vx, vy))
        }
        (p, a) => p == a,
    }
}

/// All arguments of a call of `op` by its schema: a keyword if given, else the positional
/// argument, else the default (FX's normalisation for `OpOverload` targets). `None` when an
/// argument the schema does not know is passed.
fn normalize(op: &ferrofx_core::op::OpDef, args: &[Argument], kwargs: &Kwargs) -> Option<Vec<Argument>> {
    if args.len() > op.schema.len() || kwargs.keys().any(|k| !op.schema.iter().any(|s| s.name == k)) {
        return None;
    }
    Some(
        op.schema
            .iter()
            .enumerate()
            .map(|(i, s)| match kwargs.get(s.name) {
                Some(v) => v.clone(),
                None if !s.kwarg_only && i < args.len() => args[i].clone(),
                None => default_argument(&s.default),
            })
            .collect(),
    )
}

fn default_argument(d: &ferrofx_core::op::Default) -> Argument {
    use ferrofx_core::op::Default as D;
    match *d {
        D::Required | D::None => Argument::None,
        D::Bool(b) => Argument::Bool(b),
        D::Int(i) => Argument::Int(i),
        D::Float(f) => Argument::Float(f),
        D::Str(s) => Argument::Str(s.into()),
        D::Ints(v) => Argument::list(v.iter().map(|&i| Argument::Int(i))),
        D::DType(t) => Argument::DType(t),
    }
}
