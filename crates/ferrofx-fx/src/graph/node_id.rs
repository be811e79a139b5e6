//! Typed, generational node handles that carry the identity of their graph.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of one [`Graph`](crate::Graph): unique for the whole process (drawn from a global
/// atomic counter), so a [`NodeId`] of one graph is never mistaken for a node of another.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphId(NonZeroU64);

static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

impl GraphId {
    /// A fresh identity, never returned before in this process.
    pub(crate) fn fresh() -> GraphId {
        let raw = NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed);
        // The counter starts at 1 and 2^64 graphs are never created, so it is never zero.
        GraphId(NonZeroU64::new(raw).unwrap_or(NonZeroU64::MIN))
    }

    /// The raw number, for messages.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Debug for GraphId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "graph#{}", self.0)
    }
}

impl fmt::Display for GraphId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "graph#{}", self.0)
    }
}

/// A handle to a node: arena index, generation (bumped when the slot is erased, so stale handles
/// are detected), and the [`GraphId`] of the owning graph.
///
/// `NodeId`s are `Copy` and cheap (16 bytes). Every graph operation validates them and returns
/// [`GraphError::Erased`](crate::GraphError::Erased) or
/// [`GraphError::ForeignNode`](crate::GraphError::ForeignNode) on misuse.
///
/// `Ord` is an arbitrary but stable order (for sorting and maps), not the graph order; use
/// [`Graph::is_before`](crate::Graph::is_before) for that.
///
/// ```
/// use ferrofx_fx::{Graph, GraphError};
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// g.erase_node(x).unwrap();
/// assert!(matches!(g.node(x), Err(GraphError::Erased { .. })));
/// let other = Graph::new();
/// let mut h = Graph::new();
/// let y = h.placeholder("y").unwrap();
/// assert!(matches!(other.node(y), Err(GraphError::ForeignNode { .. })));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    pub(crate) graph: GraphId,
}

impl std::hash::Hash for NodeId {
    /// One `u64` write (index and generation, mixed with the graph id): `val_map`s of a
    /// 100,000-node copy hash every node, and SipHash pays per write. Equality still compares
    /// every field, so ids of different graphs that mix to the same word are merely collisions.
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let local = (u64::from(self.generation) << 32) | u64::from(self.index);
        state.write_u64(local ^ self.graph.get().wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
}

impl NodeId {
    /// The graph this node belongs (or belonged) to.
    pub fn graph(self) -> GraphId {
        self.graph
    }

    /// The arena slot index (stable while the node lives; reused after erasure).
    pub fn index(self) -> u32 {
        self.index
    }

    /// The slot generation this handle was issued for.
    pub fn generation(self) -> u32 {
        self.generation
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}v{}@{}", self.index, self.generation, self.graph.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
