//! Dead code elimination.

use crate::graph::error::Result;
use crate::graph::graph::{Graph, ROOT};
use crate::graph::node::Node;

impl Graph {
    /// FX's `eliminate_dead_code`: lints the graph first (as FX does, so a corrupt or unsorted
    /// graph is an error, not a wrong elimination), then walks it backwards and erases every
    /// node without users that is not impure. Impurity is [`Node::is_impure`] unless
    /// `is_impure` is given (FX's `is_impure_node`); placeholders and the output are never
    /// erased by the default rule, nor are calls with side effects (`_assert`, in-place ops,
    /// `out=` writes). A GraphModule's modules flagged impure are kept by
    /// [`crate::GraphModule::eliminate_dead_code`].
    /// One pass removes whole dead chains, since users come after their inputs: the walk goes
    /// backwards through the links, and erasing a node decrements the user counters of its
    /// inputs, which the walk reaches later. Returns whether anything was erased.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let dead = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// g.call_function(Target::named("neg"), vec![dead.into()]).unwrap();
    /// g.output(x.into()).unwrap();
    /// assert!(g.eliminate_dead_code(None).unwrap());
    /// assert_eq!(g.len(), 2);
    /// ```
    pub fn eliminate_dead_code(&mut self, is_impure: Option<&dyn Fn(&Node<'_>) -> bool>) -> Result<bool> {
        self.lint()?;
        let mut changed = false;
        let mut cur = self.links[ROOT as usize].prev;
        while cur != ROOT {
            // Erasing `cur` leaves its predecessor in place.
            let prev = self.links[cur as usize].prev;
            if self.nusers[cur as usize] == 0 {
                let node = self.live(cur);
                let impure = match is_impure {
                    Some(f) => f(&node),
                    None => node.is_impure(),
                };
                if !impure {
                    self.erase_unused(cur);
                    changed = true;
                }
            }
            cur = prev;
        }
        Ok(changed)
    }
}
