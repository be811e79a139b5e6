//! [`Graph::lint`]: the five checks of FX's `Graph.lint` (seed 000 §9) plus use-def
//! consistency, output placement, cycles and the integrity of the order itself.

use crate::graph::error::{GraphError, Result};
use crate::graph::graph::{Graph, ROOT};
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
    /// One walk over the order, reading the struct-of-arrays data; no hashing:
    /// - names: ids into the namespace arena, which hands out each name once, so a duplicate
    ///   is a repeated id (a bitset);
    /// - `input_nodes` is compared with the nodes of args/kwargs in first-appearance order
    ///   (duplicates within one node found with a generation-stamped array);
    /// - users/input_nodes agreement is exact without set lookups in large sets: every user
    ///   `u` of `n` must list `n` among its (small) inputs, so the (user, input) pairs are a
    ///   subset of the (input, user) pairs; both sets of pairs are duplicate-free, so equal
    ///   totals make them equal.
    pub fn lint_with(&self, resolver: Option<&dyn TargetResolver>) -> Vec<LintFinding> {
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
            let name = self.names[c].0 as usize;
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
            if users.len() != self.nusers[c] as usize {
                findings.push(LintFinding::UseDefMismatch {
                    node: self.name_of(cur).to_string(),
                    message: format!("user count {} but {} users", self.nusers[c], users.len()),
                });
            }
            user_pairs += users.len();
            for u in users.iter() {
                let ok = self.links.get(u as usize).is_some_and(|l| l.alive && u != ROOT);
                if !ok {
                    findings.push(LintFinding::UseDefMismatch {
                        node: self.name_of(cur).to_string(),
                        message: format!("user slot {u} is not a live node of this graph"),
                    });
                } else if !self.inputs[u as usize].contains(cur) {
                    findings.push(LintFinding::UseDefMismatch {
                        node: self.name_of(cur).to_string(),
                        message: format!("user '{}' does not list it as an input", self.name_of(u)),
                    });
                }
            }
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
                    if !self.users.get(i as usize).is_some_and(|u| u.contains(idx)) {
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

    /// Name of a slot for messages (`?` when it is not a live node).
    fn slot_name(&self, idx: u32) -> String {
        match self.links.get(idx as usize) {
            Some(l) if l.alive && idx != ROOT => self.name_of(idx).to_string(),
            _ => format!("<slot {idx}>"),
        }
    }
}
