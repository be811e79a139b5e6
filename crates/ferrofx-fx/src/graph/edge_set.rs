//! The edges behind a node's `users` and `input_nodes`, and [`NodeSetRef`], their public
//! read-only view.
//!
//! Entries are `u32` slot indices (an edge always joins two live nodes of the same graph, so
//! the generation and graph id are implied). As in LLVM's `Use` lists, each input entry also
//! records the position of the edge in the input's user list, so the use-def routine finds,
//! removes or moves an edge in O(1) even when the input has 50,000 users, with no hash index.
//! Removal from a user list leaves a tombstone (insertion order is kept, like a Python dict);
//! once tombstones outnumber the live entries the list is compacted and the recorded positions
//! of the moved edges are fixed up from the (small) input sets of the users.

use crate::graph::graph::Graph;
use crate::graph::node_id::NodeId;
use smallvec::SmallVec;
use std::fmt;

/// A removed entry of a user list.
pub(crate) const TOMB: u32 = u32::MAX;

/// One input edge: the input's slot and the edge's position in that input's user list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InputEdge {
    pub(crate) node: u32,
    pub(crate) pos: u32,
}

/// A node's `input_nodes`: first-appearance order, usually one or two entries (inline).
#[derive(Clone, Default)]
pub(crate) struct InputSet {
    pub(crate) entries: SmallVec<[InputEdge; 2]>,
}

impl InputSet {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub(crate) fn find(&self, idx: u32) -> Option<InputEdge> {
        self.entries.iter().find(|e| e.node == idx).copied()
    }

    #[inline]
    pub(crate) fn contains(&self, idx: u32) -> bool {
        self.entries.iter().any(|e| e.node == idx)
    }

    /// The input slots in order.
    #[inline]
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.entries.iter().map(|e| e.node)
    }

    /// Whether the input slots are exactly `other` in order.
    pub(crate) fn same_as(&self, other: &[u32]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

/// A node's `users` in insertion order, with tombstones ([`TOMB`]); the live count is kept in
/// the graph's `nusers` array.
#[derive(Clone, Default)]
pub(crate) struct UserList {
    pub(crate) entries: SmallVec<[u32; 4]>,
}

impl UserList {
    /// The live user slots in order.
    #[inline]
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.entries.iter().copied().filter(|&e| e != TOMB)
    }
}

/// A read-only view of a node's `users` or `input_nodes` (an insertion-ordered set of nodes of
/// the same graph), returned by [`Node::user_set`](crate::Node::user_set) and
/// [`Node::input_set`](crate::Node::input_set).
#[derive(Clone, Copy)]
pub struct NodeSetRef<'g> {
    pub(crate) graph: &'g Graph,
    pub(crate) kind: SetKind<'g>,
}

/// Which set a [`NodeSetRef`] shows.
#[derive(Clone, Copy)]
pub(crate) enum SetKind<'g> {
    /// The users of slot `owner`.
    Users { owner: u32, list: &'g UserList },
    /// An input set.
    Inputs(&'g InputSet),
}

impl<'g> NodeSetRef<'g> {
    /// Number of nodes.
    pub fn len(&self) -> usize {
        match self.kind {
            SetKind::Users { owner, .. } => self.graph.nusers[owner as usize] as usize,
            SetKind::Inputs(set) => set.len(),
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `id` (a live node of the same graph) is in the set.
    pub fn contains(&self, id: NodeId) -> bool {
        if !self.graph.contains(id) {
            return false;
        }
        match self.kind {
            // `id` uses `owner` exactly when `owner` is among the (few) inputs of `id`.
            SetKind::Users { owner, .. } => self.graph.inputs[id.index as usize].contains(owner),
            SetKind::Inputs(set) => set.contains(id.index),
        }
    }

    /// The nodes in insertion order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = NodeId> + 'g {
        let g = self.graph;
        let (users, inputs): (&'g [u32], &'g [InputEdge]) = match self.kind {
            SetKind::Users { list, .. } => (&list.entries, &[]),
            SetKind::Inputs(set) => (&[], &set.entries),
        };
        users.iter().copied().filter(|&e| e != TOMB).chain(inputs.iter().map(|e| e.node)).map(move |i| g.id_of(i))
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
