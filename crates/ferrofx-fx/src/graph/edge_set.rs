//! [`EdgeSet`]: the insertion-ordered set of slot indices behind a node's `users` and
//! `input_nodes`, and [`NodeSetRef`], its public read-only view.
//!
//! Entries are `u32` slot indices (an edge always joins two live nodes of the same graph, so
//! the generation and graph id are implied). Small sets (the common case: one or two entries)
//! are an inline vector scanned linearly; larger ones add a hash index and leave tombstones on
//! removal, compacted once they outnumber the live entries, so removal keeps the order in O(1)
//! like a Python dict.

use crate::graph::graph::Graph;
use crate::graph::hash::FxHashMap;
use crate::graph::node_id::NodeId;
use smallvec::SmallVec;
use std::fmt;

/// Up to this many entries, no index.
const SMALL: usize = 8;
/// A removed entry of an indexed set.
const TOMB: u32 = u32::MAX;

#[derive(Clone, Default)]
pub(crate) struct EdgeSet {
    entries: SmallVec<[u32; 4]>,
    index: Option<Box<FxHashMap<u32, u32>>>,
}

impl EdgeSet {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        match &self.index {
            Some(ix) => ix.len(),
            None => self.entries.len(),
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn position(&self, idx: u32) -> Option<usize> {
        match &self.index {
            Some(ix) => ix.get(&idx).map(|&p| p as usize),
            None => self.entries.iter().position(|&e| e == idx),
        }
    }

    #[inline]
    pub(crate) fn contains(&self, idx: u32) -> bool {
        self.position(idx).is_some()
    }

    /// Appends `idx` unless present; returns whether it was added.
    #[inline]
    pub(crate) fn insert(&mut self, idx: u32) -> bool {
        if self.contains(idx) {
            return false;
        }
        self.push_new(idx);
        true
    }

    /// Appends `idx`, known to be absent (the use-def routine knows it from the node's old
    /// inputs, which saves a lookup in large sets).
    #[inline]
    pub(crate) fn push_new(&mut self, idx: u32) {
        let pos = self.entries.len();
        self.entries.push(idx);
        match &mut self.index {
            Some(ix) => {
                ix.insert(idx, pos as u32);
            }
            None if self.entries.len() > SMALL => self.rebuild_index(),
            None => {}
        }
    }

    /// Removes `idx`, keeping the order of the others; returns whether it was present.
    pub(crate) fn remove(&mut self, idx: u32) -> bool {
        match &mut self.index {
            None => match self.entries.iter().position(|&e| e == idx) {
                Some(pos) => {
                    self.entries.remove(pos);
                    true
                }
                None => false,
            },
            Some(ix) => {
                let Some(pos) = ix.remove(&idx) else { return false };
                self.entries[pos as usize] = TOMB;
                self.after_tomb();
                true
            }
        }
    }

    /// Moves `idx` (present) to the end: the same result as removing and re-inserting it, in
    /// one index lookup.
    pub(crate) fn move_to_end(&mut self, idx: u32) {
        if self.entries.last() == Some(&idx) {
            return;
        }
        let new_pos = self.entries.len() as u32;
        match &mut self.index {
            None => {
                if let Some(pos) = self.entries.iter().position(|&e| e == idx) {
                    self.entries.remove(pos);
                    self.entries.push(idx);
                }
            }
            Some(ix) => {
                let Some(p) = ix.get_mut(&idx) else { return };
                let old = std::mem::replace(p, new_pos) as usize;
                self.entries[old] = TOMB;
                self.entries.push(idx);
                self.after_tomb();
            }
        }
    }

    /// Drops trailing tombstones and compacts once the dead outnumber the live.
    fn after_tomb(&mut self) {
        while self.entries.last() == Some(&TOMB) {
            self.entries.pop();
        }
        let live = self.len();
        let dead = self.entries.len() - live;
        if dead > live.max(SMALL) {
            self.entries.retain(|e| *e != TOMB);
            if self.entries.len() > SMALL {
                self.rebuild_index();
            } else {
                self.index = None;
            }
        }
    }

    fn rebuild_index(&mut self) {
        let mut ix = match self.index.take() {
            Some(mut ix) => {
                ix.clear();
                ix
            }
            None => Box::default(),
        };
        ix.reserve(self.entries.len());
        for (pos, &e) in self.entries.iter().enumerate() {
            if e != TOMB {
                ix.insert(e, pos as u32);
            }
        }
        self.index = Some(ix);
    }

    /// The indices in insertion order.
    #[inline]
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        let indexed = self.index.is_some();
        self.entries.iter().copied().filter(move |&e| !indexed || e != TOMB)
    }

    /// Whether the entries are exactly `other` in order.
    pub(crate) fn same_as(&self, other: &[u32]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

/// A read-only view of a node's `users` or `input_nodes` (an insertion-ordered set of nodes of
/// the same graph), returned by [`Node::user_set`](crate::Node::user_set) and
/// [`Node::input_set`](crate::Node::input_set).
#[derive(Clone, Copy)]
pub struct NodeSetRef<'g> {
    pub(crate) graph: &'g Graph,
    pub(crate) set: &'g EdgeSet,
}

impl<'g> NodeSetRef<'g> {
    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Whether `id` (a live node of the same graph) is in the set.
    pub fn contains(&self, id: NodeId) -> bool {
        self.graph.check(id).is_ok() && self.set.contains(id.index)
    }

    /// The nodes in insertion order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = NodeId> + 'g {
        let g = self.graph;
        self.set.iter().map(move |i| g.id_of(i))
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

impl fmt::Debug for NodeSetRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
