//! [`Graph::lint`]: the five checks of FX's `Graph.lint` (seed 000 §9) plus use-def
//! consistency, output placement, cycles and the integrity of the order itself.

use crate::graph::error::{GraphError, Result};
use crate::graph::graph::{Graph, Slot, ROOT};
use crate::graph::hash::FxHashSet;
use crate::graph::node_set::NodeSet;
use crate::graph::target::{check_target, Opcode};
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
    pub fn lint_with(&self, resolver: Option<&dyn TargetResolver>) -> Vec<LintFinding> {
        let mut findings = Vec::new();
        // The order itself: links, sequence numbers, count.
        let mut count = 0usize;
        let mut prev = ROOT;
        let mut cur = self.links[ROOT as usize].next;
        let mut last_seq = 0u64;
        while cur != ROOT {
            count += 1;
            if count > self.links.len() {
                findings.push(LintFinding::CorruptOrder { message: "the node list does not close".into() });
                return findings;
            }
            let l = &self.links[cur as usize];
            if !l.alive || !matches!(self.slots[cur as usize], Slot::Live(_)) {
                findings.push(LintFinding::CorruptOrder { message: format!("slot {cur} is linked but not live") });
                return findings;
            }
            if l.prev != prev {
                findings.push(LintFinding::CorruptOrder {
                    message: format!("node '{}' has a wrong prev link", self.live(cur).name),
                });
            }
            if l.seq <= last_seq {
                findings.push(LintFinding::CorruptOrder {
                    message: format!("node '{}' has a sequence number out of order", self.live(cur).name),
                });
            }
            last_seq = l.seq;
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

        let mut names: FxHashSet<&str> = FxHashSet::default();
        let mut outputs = Vec::new();
        let mut order_violation = false;
        for id in self.nodes() {
            let node = self.live(id.index);
            // 1. opcode legality and the target rule (opcodes are an enum; the rule is checked).
            if let Err(e) = check_target(node.op, &node.target, &node.name) {
                findings.push(LintFinding::BadTarget { node: node.name.clone(), message: e.to_string() });
            }
            // 2. ownership and 3. topological order of every reference.
            let mut expected = NodeSet::new();
            let mut reference_error = false;
            node.visit_input_refs(&mut |r| match self.check(r) {
                Err(GraphError::ForeignNode { .. }) => {
                    reference_error = true;
                    findings
                        .push(LintFinding::ForeignReference { node: node.name.clone(), reference: format!("{r:?}") });
                }
                Err(_) => {
                    reference_error = true;
                    findings.push(LintFinding::ErasedReference {
                        node: node.name.clone(),
                        reference: self.name_or_unknown(r),
                    });
                }
                Ok(ri) => {
                    if expected.insert(r) && self.seq_of(ri) >= self.seq_of(id.index) {
                        order_violation = true;
                        findings.push(LintFinding::UsedBeforeDefined {
                            node: node.name.clone(),
                            input: self.live(ri).name.clone(),
                        });
                    }
                }
            });
            // 4. unique names.
            if !names.insert(node.name.as_str()) {
                findings.push(LintFinding::DuplicateName { name: node.name.clone() });
            }
            // 5. target reachability.
            if let Some(res) = resolver {
                let target = node.target.name();
                let ok = match node.op {
                    Opcode::GetAttr => res.has_attribute(target),
                    Opcode::CallModule => res.has_module(target),
                    _ => true,
                };
                if !ok {
                    findings
                        .push(LintFinding::UnreachableTarget { node: node.name.clone(), target: target.to_string() });
                }
            }
            // Use-def consistency.
            if !reference_error && expected != node.input_nodes {
                findings.push(LintFinding::UseDefMismatch {
                    node: node.name.clone(),
                    message: format!(
                        "input_nodes {:?} differ from the nodes in args/kwargs {:?}",
                        node.input_nodes.iter().map(|n| self.name_or_unknown(n)).collect::<Vec<_>>(),
                        expected.iter().map(|n| self.name_or_unknown(n)).collect::<Vec<_>>()
                    ),
                });
            }
            for inp in node.input_nodes.iter() {
                match self.node(inp) {
                    Ok(i) if i.users.contains(id) => {}
                    Ok(i) => findings.push(LintFinding::UseDefMismatch {
                        node: node.name.clone(),
                        message: format!("input '{}' does not list it as a user", i.name),
                    }),
                    Err(_) => {}
                }
            }
            for u in node.users.iter() {
                match self.node(u) {
                    Ok(un) if un.input_nodes.contains(id) => {}
                    Ok(un) => findings.push(LintFinding::UseDefMismatch {
                        node: node.name.clone(),
                        message: format!("user '{}' does not list it as an input", un.name),
                    }),
                    Err(_) => findings.push(LintFinding::UseDefMismatch {
                        node: node.name.clone(),
                        message: format!("user {u:?} is not a live node of this graph"),
                    }),
                }
            }
            if node.op == Opcode::Output {
                outputs.push(id);
            }
        }
        if outputs.len() > 1 {
            findings.push(LintFinding::MultipleOutputs {
                outputs: outputs.iter().map(|o| self.live(o.index).name.clone()).collect(),
            });
        }
        if let Some(&out) = outputs.first() {
            let after: Vec<String> = {
                let mut v = Vec::new();
                let mut c = self.links[out.index as usize].next;
                while c != ROOT {
                    v.push(self.live(c).name.clone());
                    c = self.links[c as usize].next;
                }
                v
            };
            if !after.is_empty() && outputs.len() == 1 {
                findings.push(LintFinding::OutputNotLast { output: self.live(out.index).name.clone(), after });
            }
        }
        if order_violation {
            if let Some(cycle) = self.find_cycle() {
                findings.push(LintFinding::Cycle { nodes: cycle });
            }
        }
        findings
    }
}
