//! Iteration over the graph order: a fast borrowing iterator, and an erase-safe [`Cursor`] for
//! loops that edit the graph (FX allows erasing the current node while iterating).

use crate::graph::graph::{Graph, ROOT};
use crate::graph::node::Node;
use crate::graph::node_id::NodeId;

/// Slot indices in order. While the graph is dense (slots `1..=len` in order: nothing but
/// appends since creation) it counts indices instead of chasing links, so a walk is a linear
/// scan of whatever arrays the caller reads.
#[derive(Clone)]
pub(crate) struct Slots<'g> {
    graph: &'g Graph,
    front: u32,
    back: u32,
    remaining: usize,
    dense: bool,
}

impl<'g> Slots<'g> {
    pub(crate) fn new(graph: &'g Graph) -> Slots<'g> {
        let root = &graph.links[ROOT as usize];
        Slots { graph, front: root.next, back: root.prev, remaining: graph.len(), dense: graph.dense }
    }
}

impl Iterator for Slots<'_> {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.remaining == 0 {
            return None;
        }
        let idx = self.front;
        self.front = if self.dense { idx + 1 } else { self.graph.links[idx as usize].next };
        self.remaining -= 1;
        Some(idx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl DoubleEndedIterator for Slots<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<u32> {
        if self.remaining == 0 {
            return None;
        }
        let idx = self.back;
        self.back = if self.dense { idx.wrapping_sub(1) } else { self.graph.links[idx as usize].prev };
        self.remaining -= 1;
        Some(idx)
    }
}

/// Borrowing iterator over the node handles in order (double-ended: `.rev()` walks backwards).
#[derive(Clone)]
pub struct Nodes<'g> {
    slots: Slots<'g>,
}

impl Iterator for Nodes<'_> {
    type Item = NodeId;

    #[inline]
    fn next(&mut self) -> Option<NodeId> {
        self.slots.next().map(|i| self.slots.graph.id_of(i))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.slots.size_hint()
    }
}

impl DoubleEndedIterator for Nodes<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<NodeId> {
        self.slots.next_back().map(|i| self.slots.graph.id_of(i))
    }
}

impl ExactSizeIterator for Nodes<'_> {}

/// Borrowing iterator over [`Node`] views in order (double-ended), from [`Graph::iter`]:
/// no handle validation per step, since the borrow guarantees every node stays live.
#[derive(Clone)]
pub struct Iter<'g> {
    slots: Slots<'g>,
}

impl<'g> Iterator for Iter<'g> {
    type Item = Node<'g>;

    #[inline]
    fn next(&mut self) -> Option<Node<'g>> {
        let g = self.slots.graph;
        self.slots.next().map(|idx| Node { g, idx })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.slots.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        let g = self.slots.graph;
        self.slots.next_back().map(|idx| Node { g, idx })
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// Direction of a [`Cursor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// First to last.
    Forward,
    /// Last to first.
    Reverse,
}

/// An iterator detached from the graph borrow, so the loop body may edit the graph.
///
/// Each step goes to the successor of the node returned last. If that node was erased in the
/// meantime, the cursor continues from where it stood when it was erased (following the chain
/// of erased nodes, like FX's iterator) and, should its slot have been reused, from the
/// successor recorded when it was returned. Nodes inserted after the current node are visited
/// (as in FX).
///
/// ```
/// use ferrofx_fx::{Graph, Target};
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// let a = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
/// let b = g.call_function(Target::named("neg"), vec![x.into()]).unwrap();
/// let mut seen = vec![];
/// let mut cur = g.cursor();
/// while let Some(id) = cur.next(&g) {
///     seen.push(id);
///     if g.node(id).unwrap().op() == ferrofx_fx::Opcode::CallFunction {
///         g.erase_node(id).unwrap(); // erasing the current node is fine
///     }
/// }
/// assert_eq!(seen, vec![x, a, b]);
/// assert_eq!(g.len(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct Cursor {
    direction: Direction,
    /// The node returned last, `None` before the first step.
    current: Option<NodeId>,
    /// Its successor when it was returned.
    prefetched: Option<NodeId>,
    done: bool,
}

impl Cursor {
    pub(crate) fn new(direction: Direction) -> Cursor {
        Cursor { direction, current: None, prefetched: None, done: false }
    }

    fn step(&self, graph: &Graph, idx: u32) -> u32 {
        let l = &graph.links[idx as usize];
        match self.direction {
            Direction::Forward => l.next,
            Direction::Reverse => l.prev,
        }
    }

    /// Whether `id` names a slot that was erased but not reused (its links are still those it
    /// had when erased).
    fn is_erased_unreused(graph: &Graph, id: NodeId) -> bool {
        let idx = id.index as usize;
        id.graph == graph.id
            && graph.links.get(idx).is_some_and(|l| !l.alive && l.generation == id.generation.wrapping_add(1))
    }

    /// The slot after `id` along the cursor's direction, following erased nodes.
    fn successor(&self, graph: &Graph, id: NodeId) -> Option<u32> {
        let mut idx = id.index;
        let mut hops = 0usize;
        loop {
            let nx = self.step(graph, idx);
            if nx == ROOT {
                return Some(ROOT);
            }
            if graph.links[nx as usize].alive {
                return Some(nx);
            }
            // An erased, unreused neighbour: keep following (bounded by the arena size).
            hops += 1;
            if hops > graph.links.len() {
                return None;
            }
            idx = nx;
        }
    }

    /// The next node, or `None` at the end.
    pub fn next(&mut self, graph: &Graph) -> Option<NodeId> {
        if self.done {
            return None;
        }
        let next_idx = match self.current {
            None => Some(self.step(graph, ROOT)),
            Some(cur) if graph.contains(cur) => Some(self.step(graph, cur.index)),
            Some(cur) if Self::is_erased_unreused(graph, cur) => self.successor(graph, cur),
            Some(_) => match self.prefetched {
                None => Some(ROOT),
                Some(p) if graph.contains(p) => Some(p.index),
                Some(p) if Self::is_erased_unreused(graph, p) => self.successor(graph, p),
                Some(_) => None,
            },
        };
        match next_idx {
            Some(idx) if idx != ROOT => {
                let id = graph.id_of(idx);
                let after = self.step(graph, idx);
                self.current = Some(id);
                self.prefetched = (after != ROOT).then(|| graph.id_of(after));
                Some(id)
            }
            _ => {
                self.done = true;
                None
            }
        }
    }
}

impl Graph {
    /// The nodes in order (use `.rev()` for reverse order). The graph cannot be edited while
    /// this borrow lives; see [`Graph::cursor`] for editing loops.
    pub fn nodes(&self) -> Nodes<'_> {
        Nodes { slots: Slots::new(self) }
    }

    /// The nodes in order as [`Node`] views (use `.rev()` for reverse order): the fastest way
    /// to read the whole graph.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Opcode, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// g.call_function(Target::named("neg"), vec![x.into()]).unwrap();
    /// let users: usize = g.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.num_users()).sum();
    /// assert_eq!(users, 1);
    /// ```
    pub fn iter(&self) -> Iter<'_> {
        Iter { slots: Slots::new(self) }
    }

    /// Slot indices in order.
    pub(crate) fn slots(&self) -> Slots<'_> {
        Slots::new(self)
    }

    /// An erase-safe forward cursor.
    pub fn cursor(&self) -> Cursor {
        Cursor::new(Direction::Forward)
    }

    /// An erase-safe reverse cursor.
    pub fn cursor_rev(&self) -> Cursor {
        Cursor::new(Direction::Reverse)
    }

    /// Node handles in order, collected (FX's `list(graph.nodes)`).
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes().collect()
    }
}
