//! The `(op, target)` lookup table behind [`Graph::find_nodes`], maintained incrementally on
//! node creation, retargeting and erasure (FX's `_FindNodesLookupTable`).

use crate::graph::graph::Graph;
use crate::graph::hash::FxHashMap;
use crate::graph::node_id::NodeId;
use crate::graph::node_set::NodeSet;
use crate::graph::target::{Opcode, Target, TargetKey};

/// Nodes grouped by opcode, and `call_function` nodes further by target identity.
#[derive(Debug, Default, Clone)]
pub(crate) struct FindNodesTable {
    table: FxHashMap<(Opcode, Option<TargetKey>), NodeSet>,
}

/// Lookup-table key of a node.
pub(crate) type LookupKey = (Opcode, Option<TargetKey>);

pub(crate) fn key(op: Opcode, target: &Target) -> LookupKey {
    match op {
        Opcode::CallFunction => (op, Some(TargetKey::of(target))),
        _ => (op, None),
    }
}

impl FindNodesTable {
    pub(crate) fn insert(&mut self, k: LookupKey, id: NodeId) {
        self.table.entry(k).or_default().insert(id);
    }

    pub(crate) fn remove(&mut self, k: LookupKey, id: NodeId) {
        if let Some(set) = self.table.get_mut(&k) {
            set.remove(id);
            if set.is_empty() {
                self.table.remove(&k);
            }
        }
    }
}

impl Graph {
    /// Nodes with opcode `op` (and, if given, target `target`), from the lookup table; in graph
    /// order when `sort`, else in creation order. `call_function` lookups by target are O(k)
    /// for k results (plus the sort).
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Opcode, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let relu = Target::named("relu");
    /// let a = g.call_function(relu.clone(), vec![x.into()]).unwrap();
    /// let b = g.call_function(Target::named("neg"), vec![a.into()]).unwrap();
    /// let c = g.call_function(relu.clone(), vec![b.into()]).unwrap();
    /// assert_eq!(g.find_nodes(Opcode::CallFunction, Some(&relu), true), vec![a, c]);
    /// assert_eq!(g.find_nodes(Opcode::Placeholder, None, true), vec![x]);
    /// assert_eq!(g.find_nodes(Opcode::Placeholder, Some(&"y".into()), true), vec![]);
    /// ```
    pub fn find_nodes(&self, op: Opcode, target: Option<&Target>, sort: bool) -> Vec<NodeId> {
        let mut found: Vec<NodeId> = match (op, target) {
            (Opcode::CallFunction, Some(t)) => {
                self.lookup.table.get(&key(op, t)).map(|s| s.to_vec()).unwrap_or_default()
            }
            (Opcode::CallFunction, None) => self
                .lookup
                .table
                .iter()
                .filter(|((o, _), _)| *o == Opcode::CallFunction)
                .flat_map(|(_, s)| s.iter())
                .collect(),
            (op, t) => match self.lookup.table.get(&(op, None)) {
                None => Vec::new(),
                Some(s) => s
                    .iter()
                    .filter(|id| match t {
                        None => true,
                        Some(t) => self.live(id.index).target == *t,
                    })
                    .collect(),
            },
        };
        if sort {
            found.sort_unstable_by_key(|id| self.seq_of(id.index));
        }
        found
    }
}
