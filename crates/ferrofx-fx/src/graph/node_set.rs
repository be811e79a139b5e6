//! An insertion-ordered set of nodes (FX's `dict[Node, None]`), used for `users` and
//! `input_nodes`.
//!
//! Like a Python dict it keeps insertion order *and* removes in O(1): small sets (the common
//! case: one or two users) are an inline vector scanned linearly; larger ones add a hash index
//! and leave tombstones on removal, compacted once they outnumber the live entries. An
//! `IndexSet` would need O(n) `shift_remove` to keep the order, which makes rerouting the users
//! of a node with 50,000 users quadratic.

use crate::graph::hash::FxHashMap;
use crate::graph::node_id::NodeId;
use smallvec::SmallVec;
use std::fmt;

const SMALL: usize = 8;

/// Insertion-ordered set of [`NodeId`]s with O(1) membership, insertion and removal.
///
/// ```
/// use ferrofx_fx::{Graph, NodeSet};
/// let mut g = Graph::new();
/// let a = g.placeholder("a").unwrap();
/// let b = g.placeholder("b").unwrap();
/// let mut s = NodeSet::new();
/// assert!(s.insert(b));
/// assert!(s.insert(a));
/// assert!(!s.insert(b));
/// assert_eq!(s.iter().collect::<Vec<_>>(), vec![b, a]);
/// assert!(s.remove(b));
/// assert_eq!(s.iter().collect::<Vec<_>>(), vec![a]);
/// ```
#[derive(Clone, Default)]
pub struct NodeSet {
    entries: SmallVec<[Option<NodeId>; 2]>,
    live: usize,
    index: Option<Box<FxHashMap<u32, u32>>>,
}

impl NodeSet {
    /// An empty set (no allocation).
    pub fn new() -> NodeSet {
        NodeSet::default()
    }

    /// Number of nodes in the set.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn position(&self, id: NodeId) -> Option<usize> {
        match &self.index {
            Some(ix) => {
                let pos = *ix.get(&id.index)? as usize;
                (self.entries[pos] == Some(id)).then_some(pos)
            }
            None => self.entries.iter().position(|e| *e == Some(id)),
        }
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: NodeId) -> bool {
        self.position(id).is_some()
    }

    /// Adds `id` at the end unless present (Python's `setdefault`); returns whether it was added.
    pub fn insert(&mut self, id: NodeId) -> bool {
        if self.contains(id) {
            return false;
        }
        let pos = self.entries.len();
        self.entries.push(Some(id));
        self.live += 1;
        match &mut self.index {
            Some(ix) => {
                ix.insert(id.index, pos as u32);
            }
            None if self.entries.len() > SMALL => self.rebuild_index(),
            None => {}
        }
        true
    }

    /// Removes `id`, keeping the order of the others; returns whether it was present.
    pub fn remove(&mut self, id: NodeId) -> bool {
        let Some(pos) = self.position(id) else { return false };
        self.live -= 1;
        match &mut self.index {
            None => {
                self.entries.remove(pos);
            }
            Some(ix) => {
                ix.remove(&id.index);
                self.entries[pos] = None;
                while matches!(self.entries.last(), Some(None)) {
                    self.entries.pop();
                }
                let dead = self.entries.len() - self.live;
                if dead > self.live.max(SMALL) {
                    self.entries.retain(|e| e.is_some());
                    if self.entries.len() > SMALL {
                        self.rebuild_index();
                    } else {
                        self.index = None;
                    }
                }
            }
        }
        true
    }

    fn rebuild_index(&mut self) {
        let mut ix = FxHashMap::default();
        ix.reserve(self.entries.len());
        for (pos, e) in self.entries.iter().enumerate() {
            if let Some(id) = e {
                ix.insert(id.index, pos as u32);
            }
        }
        self.index = Some(Box::new(ix));
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.live = 0;
        self.index = None;
    }

    /// The nodes in insertion order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = NodeId> + '_ {
        self.entries.iter().filter_map(|e| *e)
    }

    /// The first node in insertion order.
    pub fn first(&self) -> Option<NodeId> {
        self.iter().next()
    }

    /// The nodes in insertion order, collected.
    pub fn to_vec(&self) -> Vec<NodeId> {
        self.iter().collect()
    }
}

impl PartialEq for NodeSet {
    /// Same nodes in the same order.
    fn eq(&self, other: &NodeSet) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for NodeSet {}

impl fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<NodeId> for NodeSet {
    fn from_iter<I: IntoIterator<Item = NodeId>>(iter: I) -> NodeSet {
        let mut s = NodeSet::new();
        for id in iter {
            s.insert(id);
        }
        s
    }
}
