//! Iteration over the graph order: a fast borrowing iterator, and an erase-safe [`Cursor`] for
//! loops that edit the graph (FX allows erasing the current node while iterating).

use crate::graph::graph::{Graph, Slot, ROOT};
use crate::graph::node_id::NodeId;

/// Borrowing iterator over the nodes in order (double-ended: `.rev()` walks backwards).
#[derive(Clone)]
pub struct Nodes<'g> {
    graph: &'g Graph,
    front: u32,
    back: u32,
    remaining: usize,
}

impl Iterator for Nodes<'_> {
    type Item = NodeId;

    #[inline]
    fn next(&mut self) -> Option<NodeId> {
        if self.remaining == 0 {
            return None;
        }
        let idx = self.front;
        self.front = self.graph.links[idx as usize].next;
        self.remaining -= 1;
        Some(self.graph.id_of(idx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl DoubleEndedIterator for Nodes<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<NodeId> {
        if self.remaining == 0 {
            return None;
        }
        let idx = self.back;
        self.back = self.graph.links[idx as usize].prev;
        self.remaining -= 1;
        Some(self.graph.id_of(idx))
    }
}

impl ExactSizeIterator for Nodes<'_> {}

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
            && matches!(graph.slots.get(idx), Some(Slot::Dead(_)))
            && graph.links[idx].generation == id.generation.wrapping_add(1)
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
        let root = &self.links[ROOT as usize];
        Nodes { graph: self, front: root.next, back: root.prev, remaining: self.len() }
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
