//! [`Graph::lint`]: the five checks of FX's `Graph.lint` (seed 000 §9) plus use-def
//! consistency, output placement, cycles and the integrity of the order itself.

use crate::graph::argument::Argument;
use crate::graph::edge_set::{InputEdge, UserList, TOMB};
use crate::graph::error::{GraphError, Result};
use crate::graph::graph::{Graph, ROOT};
use crate::graph::node_id::{GraphId, NodeId};
use crate::graph::target::{check_target, Opcode};
use smallvec::SmallVec;
use std::fmt;

/// Resolves `get_attr` and `call_module` targets against the graph's owner (FX's
/// `owning_module`), for lint's target reachability check.
///
/// ```
/// use ferrofx_fx::{Graph, LintFinding, TargetResolver};
/// struct Owner;
/// impl TargetResolver for Owner {
///     fn has_attribute(&self, path: &str) -> bool { path == "linear.weight" }
///     fn has_module(&self, path: &str) -> bool { path == "linear" }
/// }
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// g.get_attr("linear.weight").unwrap();
/// g.call_module("linear", vec![x.into()]).unwrap();
/// assert!(g.lint_with(Some(&Owner)).is_empty());
/// g.call_module("conv", vec![x.into()]).unwrap();
/// let findings = g.lint_with(Some(&Owner));
/// assert!(matches!(&findings[..], [LintFinding::UnreachableTarget { node, .. }] if node == "conv"));
/// ```
pub trait TargetResolver {
    /// Whether the dotted path names an attribute (parameter, buffer, constant) of the owner.
    fn has_attribute(&self, path: &str) -> bool;
    /// Whether the dotted path names a submodule of the owner.
    fn has_module(&self, path: &str) -> bool;
}

/// One problem found by [`Graph::lint`], naming the nodes involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LintFinding {
    /// The opcode/target rule is broken (seed 000 §4.3).
    BadTarget {
        /// The node.
        node: String,
        /// What is wrong.
        message: String,
    },
    /// An argument refers to a node of another graph.
    ForeignReference {
        /// The node whose args hold the reference.
        node: String,
        /// The reference.
        reference: String,
    },
    /// An argument refers to an erased node.
    ErasedReference {
        /// The node whose args hold the reference.
        node: String,
        /// The erased node.
        reference: String,
    },
    /// An input comes after its user in the order.
    UsedBeforeDefined {
        /// The user.
        node: String,
        /// The input defined later.
        input: String,
    },
    /// Two nodes share a name.
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A `get_attr`/`call_module` target the owner does not have.
    UnreachableTarget {
        /// The node.
        node: String,
        /// Its target.
        target: String,
    },
    /// `users` / `input_nodes` disagree with the args or with each other.
    UseDefMismatch {
        /// The node.
        node: String,
        /// What disagrees.
        message: String,
    },
    /// More than one output node.
    MultipleOutputs {
        /// The output nodes.
        outputs: Vec<String>,
    },
    /// Nodes follow the output node.
    OutputNotLast {
        /// The output node.
        output: String,
        /// The nodes after it.
        after: Vec<String>,
    },
    /// The nodes named form a dependency cycle.
    Cycle {
        /// The nodes on the cycle.
        nodes: Vec<String>,
    },
    /// The linked order, the sequence numbers or the node count are inconsistent.
    CorruptOrder {
        /// What is wrong.
        message: String,
    },
}

impl fmt::Display for LintFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LintFinding::BadTarget { node, message } => write!(f, "node '{node}': {message}"),
            LintFinding::ForeignReference { node, reference } => {
                write!(f, "node '{node}' uses {reference}, which does not belong to this graph")
            }
            LintFinding::ErasedReference { node, reference } => {
                write!(f, "node '{node}' uses erased node '{reference}'")
            }
            LintFinding::UsedBeforeDefined { node, input } => {
                write!(f, "argument '{input}' of node '{node}' was used before it has been defined")
            }
            LintFinding::DuplicateName { name } => write!(f, "node redefined name '{name}'"),
            LintFinding::UnreachableTarget { node, target } => {
                write!(f, "node '{node}' refers to '{target}', which the owner does not have")
            }
            LintFinding::UseDefMismatch { node, message } => write!(f, "node '{node}': {message}"),
            LintFinding::MultipleOutputs { outputs } => write!(f, "the graph has several outputs: {outputs:?}"),
            LintFinding::OutputNotLast { output, after } => {
                write!(f, "output node '{output}' is not last; followed by {after:?}")
            }
            LintFinding::Cycle { nodes } => write!(f, "dependency cycle through {nodes:?}"),
            LintFinding::CorruptOrder { message } => write!(f, "corrupt order: {message}"),
        }
    }
}

impl Graph {
    /// Checks the graph; `Err(GraphError::Lint(findings))` lists every problem. Uses the owner
    /// set with [`Graph::set_owner`] for target reachability.
    pub fn lint(&self) -> Result<()> {
        let owner = self.owner.clone();
        let findings = self.lint_with(owner.as_deref().map(|o| o as &dyn TargetResolver));
        if findings.is_empty() {
            Ok(())
        } else {
            Err(GraphError::Lint(findings))
        }
    }

    /// All lint findings, checking targets against `resolver` when given.
    ///
    /// A clean graph (the common case) is recognised by one lean walk that only answers yes or
    /// no; when it says no, a second walk names every problem. Both read the struct-of-arrays
    /// data and never hash. The second walk:
    /// - names: ids into the namespace arena, which hands out each name once, so a duplicate
    ///   is a repeated id (a bitset);
    /// - `input_nodes` is compared with the nodes of args/kwargs in first-appearance order
    ///   (duplicates within one node found with a generation-stamped array);
    /// - users/input_nodes agreement is exact without set lookups in large sets: every user
    ///   `u` of `n` must list `n` among its (small) inputs, so the (user, input) pairs are a
    ///   subset of the (input, user) pairs; both sets of pairs are duplicate-free, so equal
    ///   totals make them equal.
    pub fn lint_with(&self, resolver: Option<&dyn TargetResolver>) -> Vec<LintFinding> {
        if self.lint_clean(resolver) {
            return Vec::new();
        }
        self.lint_findings(resolver)
    }

    /// Whether [`Graph::lint_with`] finds nothing, decided in one lean walk (the common case);
    /// `false` whenever anything is unusual, and then [`Graph::lint_findings`] walks again to
    /// name every problem.
    ///
    /// It checks the same invariants as `lint_findings`, but the users/input_nodes agreement
    /// from the input side only, with one load per edge: each input edge `(n, pos)` of a node
    /// `u` must find `u` at `users[n][pos]`, where `n` was walked before `u`. Distinct input
    /// edges then name distinct live user entries of walked nodes, so when the totals are equal
    /// every live user entry is the edge of exactly one walked input: the user is live, lists
    /// the node among its inputs, and records the entry's position (what `lint_findings`
    /// checks from the user side). The live entries of each user list are counted against
    /// `nusers` (a count the compiler vectorises for large lists).
    fn lint_clean(&self, resolver: Option<&dyn TargetResolver>) -> bool {
        let slots = self.links.len();
        // Every per-slot array cut to the same length, so that one bounds check of a slot
        // covers all of them.
        let (Some(ops), Some(names), Some(targets), Some(args), Some(kwargs), Some(users), Some(inputs), Some(nusers)) = (
            self.ops.get(..slots),
            self.names.get(..slots),
            self.targets.get(..slots),
            self.args.get(..slots),
            self.kwargs.get(..slots),
            self.users.get(..slots),
            self.inputs.get(..slots),
            self.nusers.get(..slots),
        ) else {
            return false;
        };
        let links = &self.links[..];
        let view = CleanView { id: self.id, slots, users };
        // walked[i] == generation + 1 of slot i once it was walked, 0 before (a walked slot is
        // live, not the root, and comes before the node being checked: sequence numbers
        // increase along the walk); one load and compare per edge checks a handle against it.
        let mut walked = vec![0u32; slots];
        let mut seen_name = vec![0u64; self.namespace.count().div_ceil(64)];
        let mut stamp: Vec<u32> = Vec::new();
        // Input edges minus live user entries, over the walked nodes.
        let mut balance = 0isize;
        let mut count = 0usize;
        let mut prev = ROOT;
        let Some(root) = links.get(ROOT as usize) else { return false };
        let mut cur = root.next;
        let mut last_seq = 0u64;
        let mut output_seen = false;
        while cur != ROOT {
            // Strictly increasing sequence numbers (checked below) end a walk that would revisit
            // a node, so it takes at most `slots` steps.
            count += 1;
            // Nothing may follow the output node (which also rules out a second output).
            if output_seen {
                return false;
            }
            let c = cur as usize;
            let Some(l) = links.get(c) else { return false };
            if !l.alive || l.prev != prev || l.seq <= last_seq {
                return false;
            }
            last_seq = l.seq;
            let op = ops[c];
            let name = names[c].0 as usize;
            match seen_name.get_mut(name / 64) {
                Some(w) if *w & (1 << (name % 64)) == 0 => *w |= 1 << (name % 64),
                _ => return false,
            }
            if targets[c].is_callable() != (op == Opcode::CallFunction) {
                return false;
            }
            let inputs = inputs[c].entries.as_slice();
            let mut k = 0usize;
            let mut nested = kwargs[c].is_some();
            if !nested {
                for a in args[c].iter() {
                    match a {
                        Argument::Node(n) => match view.clean_ref(*n, cur, inputs, k, &walked, &mut stamp) {
                            Some(next) => k = next,
                            None => return false,
                        },
                        Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_) => {
                            nested = true;
                            break;
                        }
                        _ => {}
                    }
                }
            }
            if nested {
                match view.clean_refs_nested(self.live(cur), inputs, &walked, &mut stamp) {
                    Some(all) => k = all,
                    None => return false,
                }
            }
            if k != inputs.len() {
                return false;
            }
            let live = count_live(&users[c].entries);
            if live != nusers[c] as usize {
                return false;
            }
            balance += k as isize - live as isize;
            walked[c] = l.generation.wrapping_add(1);
            output_seen = op == Opcode::Output;
            prev = cur;
            cur = l.next;
        }
        root.prev == prev && count == self.len() && balance == 0 && resolver.is_none_or(|res| self.targets_resolve(res))
    }

    /// Whether every `get_attr` and `call_module` target resolves (a second walk, only when
    /// an owner is given: the order was checked by the first).
    #[inline(never)]
    fn targets_resolve(&self, resolver: &dyn TargetResolver) -> bool {
        self.slots().all(|idx| {
            let target = &self.targets[idx as usize];
            match self.ops[idx as usize] {
                Opcode::GetAttr => resolver.has_attribute(target.name()),
                Opcode::CallModule => resolver.has_module(target.name()),
                _ => true,
            }
        })
    }

    /// Every finding of [`Graph::lint_with`], node by node.
    fn lint_findings(&self, resolver: Option<&dyn TargetResolver>) -> Vec<LintFinding> {
        let mut findings = Vec::new();
        let slots = self.links.len();
        let mut seen_name = vec![0u64; self.namespace.count().div_ceil(64)];
        // For nodes with many references: stamp[i] == node + 1 when `i` was already met in the
        // args of `node` (allocated on first need; small nodes dedupe by scanning).
        let mut stamp: Vec<u32> = Vec::new();
        let (mut input_pairs, mut user_pairs) = (0usize, 0usize);
        let mut expected: SmallVec<[u32; 8]> = SmallVec::new();
        let mut outputs = Vec::new();
        let mut order_violation = false;
        let mut count = 0usize;
        let mut prev = ROOT;
        let mut cur = self.links[ROOT as usize].next;
        let mut last_seq = 0u64;
        while cur != ROOT {
            count += 1;
            if count > slots {
                findings.push(LintFinding::CorruptOrder { message: "the node list does not close".into() });
                return findings;
            }
            let c = cur as usize;
            let l = self.links[c];
            if !l.alive {
                findings.push(LintFinding::CorruptOrder { message: format!("slot {cur} is linked but not live") });
                return findings;
            }
            if l.prev != prev {
                findings.push(LintFinding::CorruptOrder {
                    message: format!("node '{}' has a wrong prev link", self.name_of(cur)),
                });
            }
            if l.seq <= last_seq {
                findings.push(LintFinding::CorruptOrder {
                    message: format!("node '{}' has a sequence number out of order", self.name_of(cur)),
                });
            }
            last_seq = l.seq;
            let op = self.ops[c];
            // The common case first: a node that passes every check, verified straight from the
            // packed arrays; anything unusual (or any finding) takes the full path below.
            let name = self.names[c].0 as usize;
            let name_bit = 1u64 << (name % 64);
            let name_fresh = seen_name.get(name / 64).is_some_and(|w| w & name_bit == 0);
            let resolve = resolver.is_some() && matches!(op, Opcode::GetAttr | Opcode::CallModule);
            if name_fresh && !resolve {
                if let Some((ni, nu)) = self.lint_node_fast(cur, op, l.seq) {
                    seen_name[name / 64] |= name_bit;
                    input_pairs += ni;
                    user_pairs += nu;
                    if op == Opcode::Output {
                        outputs.push(cur);
                    }
                    prev = cur;
                    cur = l.next;
                    continue;
                }
            }
            // 1. opcode legality and the target rule (opcodes are an enum; the rule is checked).
            let target = &self.targets[c];
            if target.is_callable() != (op == Opcode::CallFunction) {
                if let Err(e) = check_target(op, target, self.name_of(cur)) {
                    findings
                        .push(LintFinding::BadTarget { node: self.name_of(cur).to_string(), message: e.to_string() });
                }
            }
            // 2. ownership and 3. topological order of every reference.
            expected.clear();
            let mut reference_error = false;
            let mark = cur + 1;
            self.live(cur).visit_input_refs(&mut |r| match self.check(r) {
                Err(GraphError::ForeignNode { .. }) => {
                    reference_error = true;
                    findings.push(LintFinding::ForeignReference {
                        node: self.name_of(cur).to_string(),
                        reference: format!("{r:?}"),
                    });
                }
                Err(_) => {
                    reference_error = true;
                    findings.push(LintFinding::ErasedReference {
                        node: self.name_of(cur).to_string(),
                        reference: self.name_or_unknown(r),
                    });
                }
                Ok(ri) => {
                    let new = if expected.len() < 16 {
                        !expected.contains(&ri)
                    } else {
                        if stamp.is_empty() {
                            stamp = vec![0u32; slots];
                        }
                        if expected.len() == 16 {
                            for &e in &expected {
                                stamp[e as usize] = mark;
                            }
                        }
                        std::mem::replace(&mut stamp[ri as usize], mark) != mark
                    };
                    if new {
                        expected.push(ri);
                        if self.links[ri as usize].seq >= l.seq {
                            order_violation = true;
                            findings.push(LintFinding::UsedBeforeDefined {
                                node: self.name_of(cur).to_string(),
                                input: self.name_of(ri).to_string(),
                            });
                        }
                    }
                }
            });
            // 4. unique names.
            match seen_name.get_mut(name / 64) {
                Some(word) if *word & (1 << (name % 64)) == 0 => *word |= 1 << (name % 64),
                _ => findings.push(LintFinding::DuplicateName { name: self.name_of(cur).to_string() }),
            }
            // 5. target reachability.
            if let Some(res) = resolver {
                let target = target.name();
                let ok = match op {
                    Opcode::GetAttr => res.has_attribute(target),
                    Opcode::CallModule => res.has_module(target),
                    _ => true,
                };
                if !ok {
                    findings.push(LintFinding::UnreachableTarget {
                        node: self.name_of(cur).to_string(),
                        target: target.to_string(),
                    });
                }
            }
            // Use-def consistency.
            let inputs = &self.inputs[c];
            if !reference_error && !inputs.same_as(&expected) {
                findings.push(LintFinding::UseDefMismatch {
                    node: self.name_of(cur).to_string(),
                    message: format!(
                        "input_nodes {:?} differ from the nodes in args/kwargs {:?}",
                        inputs.iter().map(|n| self.slot_name(n)).collect::<Vec<_>>(),
                        expected.iter().map(|&n| self.slot_name(n)).collect::<Vec<_>>()
                    ),
                });
            }
            input_pairs += inputs.len();
            let users = &self.users[c];
            let mut live_users = 0usize;
            for (p, &u) in users.entries.iter().enumerate() {
                if u == crate::graph::edge_set::TOMB {
                    continue;
                }
                live_users += 1;
                let ok = self.links.get(u as usize).is_some_and(|l| l.alive && u != ROOT);
                if !ok {
                    findings.push(LintFinding::UseDefMismatch {
                        node: self.name_of(cur).to_string(),
                        message: format!("user slot {u} is not a live node of this graph"),
                    });
                } else {
                    match self.inputs[u as usize].find(cur) {
                        None => findings.push(LintFinding::UseDefMismatch {
                            node: self.name_of(cur).to_string(),
                            message: format!("user '{}' does not list it as an input", self.name_of(u)),
                        }),
                        Some(e) if e.pos as usize != p => findings.push(LintFinding::UseDefMismatch {
                            node: self.name_of(cur).to_string(),
                            message: format!("user '{}' records a wrong position of its edge", self.name_of(u)),
                        }),
                        Some(_) => {}
                    }
                }
            }
            if live_users != self.nusers[c] as usize {
                findings.push(LintFinding::UseDefMismatch {
                    node: self.name_of(cur).to_string(),
                    message: format!("user count {} but {} users", self.nusers[c], live_users),
                });
            }
            user_pairs += live_users;
            if op == Opcode::Output {
                outputs.push(cur);
            }
            prev = cur;
            cur = l.next;
        }
        if self.links[ROOT as usize].prev != prev {
            findings.push(LintFinding::CorruptOrder { message: "the root's prev link is wrong".into() });
        }
        if count != self.len() {
            findings.push(LintFinding::CorruptOrder {
                message: format!("{count} nodes linked but len() is {}", self.len()),
            });
        }
        // Every (node, user) pair is an (input, node) pair (checked above); equal totals make
        // the two relations equal. On a mismatch, name the nodes whose inputs are not users.
        if input_pairs != user_pairs {
            for idx in self.slots() {
                for i in self.inputs[idx as usize].iter() {
                    if !self.users.get(i as usize).is_some_and(|u| u.iter().any(|x| x == idx)) {
                        findings.push(LintFinding::UseDefMismatch {
                            node: self.name_of(idx).to_string(),
                            message: format!("input '{}' does not list it as a user", self.slot_name(i)),
                        });
                    }
                }
            }
        }
        if outputs.len() > 1 {
            findings.push(LintFinding::MultipleOutputs {
                outputs: outputs.iter().map(|&o| self.name_of(o).to_string()).collect(),
            });
        }
        if let Some(&out) = outputs.first() {
            let mut after = Vec::new();
            let mut c = self.links[out as usize].next;
            while c != ROOT {
                after.push(self.name_of(c).to_string());
                c = self.links[c as usize].next;
            }
            if !after.is_empty() && outputs.len() == 1 {
                findings.push(LintFinding::OutputNotLast { output: self.name_of(out).to_string(), after });
            }
        }
        if order_violation {
            if let Some(cycle) = self.find_cycle() {
                findings.push(LintFinding::Cycle { nodes: cycle });
            }
        }
        findings
    }

    /// Every per-node check of [`Graph::lint_with`] (except target reachability) for a node
    /// without kwargs or nested arguments, in one pass over its packed data: `Some((inputs,
    /// live users))` when the node is clean, `None` when the full path must look (it then
    /// finds exactly the same problems it always did).
    #[inline]
    fn lint_node_fast(&self, cur: u32, op: Opcode, seq: u64) -> Option<(usize, usize)> {
        let c = cur as usize;
        if self.targets[c].is_callable() != (op == Opcode::CallFunction) || self.kwargs[c].is_some() {
            return None;
        }
        // input_nodes must be the referenced nodes, deduplicated, in first-appearance order;
        // each reference must be a live node of this graph defined earlier.
        let inputs = &self.inputs[c].entries;
        let mut k = 0usize;
        for a in self.args[c].iter() {
            let n = match a {
                Argument::Node(n) => *n,
                Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_) => return None,
                _ => continue,
            };
            let l = self.links.get(n.index as usize)?;
            if n.graph != self.id || !l.alive || l.generation != n.generation || n.index == ROOT || l.seq >= seq {
                return None;
            }
            if inputs[..k].iter().any(|e| e.node == n.index) {
                continue;
            }
            if inputs.get(k)?.node != n.index {
                return None;
            }
            k += 1;
        }
        if k != inputs.len() {
            return None;
        }
        // Every user is live and records this node as an input at the edge's position.
        let mut live = 0usize;
        for (p, &u) in self.users[c].entries.iter().enumerate() {
            if u == TOMB {
                continue;
            }
            live += 1;
            let ok = u != ROOT
                && self.links.get(u as usize).is_some_and(|l| l.alive)
                && self.inputs[u as usize].find(cur).is_some_and(|e| e.pos as usize == p);
            if !ok {
                return None;
            }
        }
        (live == self.nusers[c] as usize).then_some((k, live))
    }

    /// Name of a slot for messages (`?` when it is not a live node).
    fn slot_name(&self, idx: u32) -> String {
        match self.links.get(idx as usize) {
            Some(l) if l.alive && idx != ROOT => self.name_of(idx).to_string(),
            _ => format!("<slot {idx}>"),
        }
    }
}

/// The live entries (not [`TOMB`]) of a user list; long lists in blocks the compiler
/// vectorises.
#[inline]
fn count_live(list: &[u32]) -> usize {
    if list.len() <= 4 {
        return list.iter().filter(|&&u| u != TOMB).count();
    }
    let mut chunks = list.chunks_exact(16);
    let mut live = 0usize;
    for chunk in &mut chunks {
        live += chunk.iter().map(|&u| u32::from(u != TOMB)).sum::<u32>() as usize;
    }
    live + chunks.remainder().iter().filter(|&&u| u != TOMB).count()
}

/// What [`Graph::lint_clean`] reads per edge.
struct CleanView<'a> {
    id: GraphId,
    slots: usize,
    users: &'a [UserList],
}

impl CleanView<'_> {
    /// One reference `n` met in the arguments of walked node `cur` (for [`Graph::lint_clean`]),
    /// with `inputs[..k]` matched so far: `n` must be a walked node of this graph with the
    /// handle's generation, and either already among `inputs[..k]` (then `Some(k)`) or exactly
    /// `inputs[k]`, whose edge must be recorded at its position in `n`'s user list (then
    /// `Some(k + 1)`); `None` otherwise.
    #[inline(always)]
    fn clean_ref(
        &self,
        n: NodeId,
        cur: u32,
        inputs: &[InputEdge],
        k: usize,
        walked: &[u32],
        stamp: &mut Vec<u32>,
    ) -> Option<usize> {
        let i = n.index as usize;
        // Compared in 64 bits: a handle's generation + 1 is never 0 (an unwalked slot), and a
        // walked slot whose generation + 1 wrapped to 0 counts as unwalked (lint then falls back).
        if n.graph != self.id || u64::from(*walked.get(i)?) != u64::from(n.generation) + 1 {
            return None;
        }
        let seen = if k < 16 {
            match k {
                0 => false,
                1 => inputs.first()?.node == n.index,
                _ => inputs.get(..k)?.iter().any(|e| e.node == n.index),
            }
        } else {
            seen_many(i, cur, inputs, k, self.slots, stamp)?
        };
        if seen {
            return Some(k);
        }
        let e = inputs.get(k)?;
        if e.node != n.index || self.users.get(i)?.entries.as_slice().get(e.pos as usize) != Some(&cur) {
            return None;
        }
        Some(k + 1)
    }

    /// [`CleanView::clean_ref`] over every reference of a node with kwargs or nested arguments:
    /// the number of inputs matched, `None` on any mismatch.
    #[inline(never)]
    fn clean_refs_nested(
        &self,
        node: crate::graph::node::Node<'_>,
        inputs: &[InputEdge],
        walked: &[u32],
        stamp: &mut Vec<u32>,
    ) -> Option<usize> {
        let cur = node.idx;
        let mut k = Some(0usize);
        node.visit_input_refs(&mut |n| {
            k = k.and_then(|k| self.clean_ref(n, cur, inputs, k, walked, stamp));
        });
        k
    }
}

/// Whether slot `i` (below `slots`) is among `inputs[..k]` for `k >= 16` (a node with many
/// inputs), marking it: `stamp[s] == cur + 1` when `s` is among the inputs of `cur` matched so
/// far. `None` when the inputs are not slots or fewer than `k`.
#[cold]
#[inline(never)]
fn seen_many(i: usize, cur: u32, inputs: &[InputEdge], k: usize, slots: usize, stamp: &mut Vec<u32>) -> Option<bool> {
    let mark = cur + 1;
    if stamp.len() < slots {
        stamp.resize(slots, 0);
    }
    if k == 16 {
        for e in inputs.get(..16)? {
            *stamp.get_mut(e.node as usize)? = mark;
        }
    }
    Some(std::mem::replace(stamp.get_mut(i)?, mark) == mark)
}

#[cfg(test)]
mod tests {
    //! Lint must report corruption of the internal arrays (which the public API cannot cause)
    //! whether or not the node would otherwise take the fast path.
    use super::LintFinding;
    use crate::graph::argument::Argument;
    use crate::graph::edge_set::TOMB;
    use crate::graph::graph::Graph;
    use crate::graph::node_id::NodeId;
    use crate::graph::target::Target;

    /// x, a = add(x, x), b = mul(a, x), output(b); returns the graph and (x, a, b, out).
    fn chain() -> (Graph, [NodeId; 4]) {
        let mut g = Graph::new();
        let x = g.placeholder("x").unwrap();
        let a = g.call_function(Target::named("add"), [x.into(), x.into()]).unwrap();
        let b = g.call_function(Target::named("mul"), [a.into(), x.into()]).unwrap();
        let out = g.output(b.into()).unwrap();
        g.lint().unwrap();
        (g, [x, a, b, out])
    }

    fn findings(g: &Graph) -> Vec<LintFinding> {
        g.lint_with(None)
    }

    #[test]
    fn wrong_edge_position_is_reported() {
        let (mut g, [_, _, b, _]) = chain();
        g.inputs[b.index as usize].entries[1].pos += 1;
        let f = findings(&g);
        assert!(
            f.iter().any(|f| matches!(f, LintFinding::UseDefMismatch { node, message }
            if node == "x" && message.contains("wrong position"))),
            "{f:?}"
        );
    }

    #[test]
    fn wrong_user_count_is_reported() {
        let (mut g, [_, a, _, _]) = chain();
        g.nusers[a.index as usize] = 2;
        let f = findings(&g);
        assert!(
            f.iter().any(|f| matches!(f, LintFinding::UseDefMismatch { node, message }
            if node == "add" && message.contains("user count 2 but 1 users"))),
            "{f:?}"
        );
    }

    #[test]
    fn reference_to_an_erased_node_is_reported() {
        let (mut g, [x, _, b, _]) = chain();
        let stale = NodeId { generation: x.generation + 1, ..x };
        g.args[b.index as usize][1] = Argument::Node(stale);
        let f = findings(&g);
        assert!(f.iter().any(|f| matches!(f, LintFinding::ErasedReference { node, .. } if node == "mul")), "{f:?}");
    }

    #[test]
    fn foreign_reference_is_reported() {
        let (mut g, [_, _, b, _]) = chain();
        let mut other = Graph::new();
        let y = other.placeholder("y").unwrap();
        g.args[b.index as usize][1] = Argument::Node(y);
        let f = findings(&g);
        assert!(f.iter().any(|f| matches!(f, LintFinding::ForeignReference { node, .. } if node == "mul")), "{f:?}");
    }

    #[test]
    fn input_nodes_differing_from_args_are_reported() {
        let (mut g, [x, a, b, _]) = chain();
        // mul's args name (a, x); make them (x, a): same set, other first-appearance order.
        g.args[b.index as usize] = [Argument::Node(x), Argument::Node(a)].into_iter().collect();
        let f = findings(&g);
        assert!(
            f.iter().any(|f| matches!(f, LintFinding::UseDefMismatch { node, message }
            if node == "mul" && message.contains("differ"))),
            "{f:?}"
        );
    }

    #[test]
    fn use_before_definition_is_reported() {
        let (mut g, [_, a, b, _]) = chain();
        // add uses mul, which comes after it (the edge lists are left as they were).
        g.args[a.index as usize][1] = Argument::Node(b);
        let f = findings(&g);
        assert!(
            f.iter().any(|f| matches!(f, LintFinding::UsedBeforeDefined { node, input }
            if node == "add" && input == "mul")),
            "{f:?}"
        );
    }

    #[test]
    fn duplicate_name_is_reported() {
        let (mut g, [_, a, b, _]) = chain();
        g.names[b.index as usize] = g.names[a.index as usize];
        let f = findings(&g);
        assert!(f.contains(&LintFinding::DuplicateName { name: "add".into() }), "{f:?}");
    }

    #[test]
    fn user_that_is_not_live_is_reported() {
        let (mut g, [_, a, _, _]) = chain();
        let dead = g.links.len() as u32 + 5;
        g.users[a.index as usize].entries.push(dead);
        g.nusers[a.index as usize] += 1;
        let f = findings(&g);
        assert!(
            f.iter().any(|f| matches!(f, LintFinding::UseDefMismatch { node, message }
            if node == "add" && message.contains("not a live node"))),
            "{f:?}"
        );
        // A tombstone is not a user.
        let (mut g, [_, a, _, _]) = chain();
        g.users[a.index as usize].entries.insert(0, TOMB);
        let f = findings(&g);
        assert!(
            f.iter().any(|f| matches!(f, LintFinding::UseDefMismatch { node, message }
            if node == "add" && message.contains("wrong position"))),
            "{f:?}"
        );
    }

    #[test]
    fn callable_target_on_a_placeholder_is_reported() {
        let (mut g, [x, _, _, _]) = chain();
        g.targets[x.index as usize] = Target::named("add");
        let f = findings(&g);
        assert!(f.iter().any(|f| matches!(f, LintFinding::BadTarget { node, .. } if node == "x")), "{f:?}");
    }

    /// The lean walk (`lint_clean`) and the findings walk agree on graphs that exercise every
    /// path of the lean walk: kwargs, nested arguments, a node with more than 16 inputs and
    /// repeated references, tombstones left by erasures, reused slots, and a broken order.
    #[test]
    fn clean_walk_agrees_with_the_findings_walk() {
        let agree = |g: &Graph, expect_clean: bool| {
            let clean = g.lint_clean(None);
            let findings = g.lint_findings(None);
            assert_eq!(clean, expect_clean, "{findings:?}");
            assert_eq!(clean, findings.is_empty(), "{findings:?}");
        };
        let (mut g, [x, a, b, out]) = chain();
        agree(&g, true);
        // kwargs and nested arguments (a list with a repeated node, a dict).
        g.update_kwarg(b, "alpha", Argument::list([x.into(), a.into(), x.into()])).unwrap();
        g.update_kwarg(b, "d", Argument::dict([("k", Argument::Node(a))])).unwrap();
        agree(&g, true);
        // A node with 20 distinct inputs, each used twice (the stamped dedupe).
        let (many, cat) = {
            let mut g = g.inserting_before(Some(out)).unwrap();
            let many: Vec<_> = (0..20).map(|_| g.call_function(Target::named("neg"), [x.into()]).unwrap()).collect();
            let args: Vec<Argument> = many.iter().chain(many.iter().rev()).map(|&n| n.into()).collect();
            let cat = g.call_function(Target::named("cat"), args).unwrap();
            (many, cat)
        };
        g.update_arg(out, 0, cat.into()).unwrap();
        agree(&g, true);
        // Erasures (tombstones in x's user list) and a reused slot.
        g.replace_all_uses_with(a, x).unwrap();
        g.erase_node(a).unwrap();
        let again = {
            let mut g = g.inserting_before(Some(cat)).unwrap();
            g.call_function(Target::named("relu"), [x.into()]).unwrap()
        };
        g.replace_all_uses_with(many[3], again).unwrap();
        g.erase_node(many[3]).unwrap();
        agree(&g, true);
        // An input after its user (and the cycle search behind it).
        let (mut g, [_, a, b, _]) = chain();
        g.args[a.index as usize][1] = Argument::Node(b);
        agree(&g, false);
        // Anything after the output.
        let (mut g, [x, ..]) = chain();
        g.call_function(Target::named("neg"), [x.into()]).unwrap();
        agree(&g, false);
    }
}
