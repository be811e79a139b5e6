//! Insertion point control: where [`Graph::create_node`] puts new nodes.

use crate::graph::error::Result;
use crate::graph::graph::Graph;
use crate::graph::node_id::NodeId;
use std::ops::{Deref, DerefMut};

/// Where new nodes go.
///
/// As in FX, `After(n)` puts each new node *immediately* after `n`, so several nodes created
/// under the same `After(n)` end up in reverse creation order; `Before(n)` keeps creation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InsertPoint {
    /// At the end of the graph (the default).
    #[default]
    End,
    /// At the start of the graph.
    Start,
    /// Just before a node.
    Before(NodeId),
    /// Just after a node.
    After(NodeId),
}

/// A scoped insertion point: derefs to the [`Graph`] and restores the previous insertion
/// point when dropped. Guards nest.
///
/// ```
/// use ferrofx_fx::{Graph, Target};
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// let out = g.output(x.into()).unwrap();
/// {
///     let mut g2 = g.inserting_before(Some(out)).unwrap();
///     let r = g2.call_function(Target::named("relu"), vec![x.into()]).unwrap();
///     {
///         let mut g3 = g2.inserting_after(Some(x)).unwrap();
///         g3.call_function(Target::named("neg"), vec![x.into()]).unwrap();
///     } // back to "before out"
///     g2.call_function(Target::named("gelu"), vec![r.into()]).unwrap();
/// } // back to the end
/// let names: Vec<_> = g.nodes().map(|n| g.node(n).unwrap().name().to_string()).collect();
/// assert_eq!(names, ["x", "neg", "relu", "gelu", "output"]);
/// ```
pub struct InsertGuard<'g> {
    graph: &'g mut Graph,
    saved: InsertPoint,
}

impl Deref for InsertGuard<'_> {
    type Target = Graph;
    fn deref(&self) -> &Graph {
        self.graph
    }
}

impl DerefMut for InsertGuard<'_> {
    fn deref_mut(&mut self) -> &mut Graph {
        self.graph
    }
}

impl Drop for InsertGuard<'_> {
    fn drop(&mut self) {
        self.graph.insert = self.saved;
    }
}

impl Graph {
    /// The current insertion point.
    pub fn insert_point(&self) -> InsertPoint {
        self.insert
    }

    /// Sets the insertion point (validating its anchor) and returns the previous one.
    pub fn set_insert_point(&mut self, point: InsertPoint) -> Result<InsertPoint> {
        match point {
            InsertPoint::Before(n) | InsertPoint::After(n) => {
                self.check(n)?;
            }
            InsertPoint::End | InsertPoint::Start => {}
        }
        Ok(std::mem::replace(&mut self.insert, point))
    }

    /// FX's `inserting_before(n)`: new nodes go before `n`; `None` means the start of the
    /// graph. The previous point is restored when the guard drops.
    pub fn inserting_before(&mut self, n: Option<NodeId>) -> Result<InsertGuard<'_>> {
        let point = n.map_or(InsertPoint::Start, InsertPoint::Before);
        let saved = self.set_insert_point(point)?;
        Ok(InsertGuard { graph: self, saved })
    }

    /// FX's `inserting_after(n)`: new nodes go right after `n`; `None` means the end of the
    /// graph. The previous point is restored when the guard drops.
    pub fn inserting_after(&mut self, n: Option<NodeId>) -> Result<InsertGuard<'_>> {
        let point = n.map_or(InsertPoint::End, InsertPoint::After);
        let saved = self.set_insert_point(point)?;
        Ok(InsertGuard { graph: self, saved })
    }

    /// Runs `f` with the insertion point set to `point`, restoring the previous one afterwards.
    pub fn with_insert_point<R>(&mut self, point: InsertPoint, f: impl FnOnce(&mut Graph) -> R) -> Result<R> {
        let saved = self.set_insert_point(point)?;
        let mut guard = InsertGuard { graph: self, saved };
        Ok(f(&mut guard))
    }
}
