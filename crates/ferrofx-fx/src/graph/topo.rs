//! Stable topological sort and cycle detection.

use crate::graph::error::{GraphError, Result};
use crate::graph::graph::Graph;
use crate::graph::target::Opcode;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

impl Graph {
    /// Reorders the nodes so every input comes before its users, changing as little as
    /// possible: among the nodes whose inputs are all placed, the earliest in the current order
    /// goes first, and output nodes go last. A graph that is already ordered keeps its order.
    /// A dependency cycle is an [`GraphError::GraphCycle`] naming its nodes (the graph is left
    /// unchanged).
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let a = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// let b = g.call_function(Target::named("neg"), vec![a.into()]).unwrap();
    /// g.prepend(x, b).unwrap(); // b now comes first: lint fails
    /// assert!(g.lint().is_err());
    /// g.stable_topological_sort().unwrap();
    /// assert_eq!(g.node_ids(), vec![x, a, b]);
    /// g.lint().unwrap();
    /// ```
    pub fn stable_topological_sort(&mut self) -> Result<()> {
        let mut indeg = vec![0u32; self.links.len()];
        let mut heap = BinaryHeap::new();
        let key = |g: &Graph, idx: u32| (g.ops[idx as usize] == Opcode::Output, g.seq_of(idx), idx);
        for idx in self.slots() {
            let n = self.inputs[idx as usize].len() as u32;
            indeg[idx as usize] = n;
            if n == 0 {
                heap.push(Reverse(key(self, idx)));
            }
        }
        let mut order = Vec::with_capacity(self.len());
        while let Some(Reverse((_, _, idx))) = heap.pop() {
            order.push(idx);
            for u in self.users[idx as usize].iter() {
                let d = &mut indeg[u as usize];
                *d -= 1;
                if *d == 0 {
                    heap.push(Reverse(key(self, u)));
                }
            }
        }
        if order.len() != self.len() {
            let cycle = self.find_cycle().unwrap_or_default();
            return Err(GraphError::GraphCycle(cycle));
        }
        self.relink_in_order(&order);
        Ok(())
    }

    /// The names of the nodes on some dependency cycle (each depends on the previous), or
    /// `None` for an acyclic graph.
    pub fn find_cycle(&self) -> Option<Vec<String>> {
        // 0 = unvisited, 1 = on the DFS stack, 2 = done. Edges go from a node to its inputs.
        let mut color = vec![0u8; self.links.len()];
        for start in self.slots() {
            if color[start as usize] != 0 {
                continue;
            }
            let mut stack: Vec<(u32, Vec<u32>)> = Vec::new();
            color[start as usize] = 1;
            stack.push((start, self.inputs[start as usize].iter().collect()));
            while let Some((node, pending)) = stack.last_mut() {
                let node = *node;
                match pending.pop() {
                    Some(inp) => match color[inp as usize] {
                        0 => {
                            color[inp as usize] = 1;
                            let ins = self.inputs[inp as usize].iter().collect();
                            stack.push((inp, ins));
                        }
                        1 => {
                            let pos = stack.iter().position(|(n, _)| *n == inp).unwrap_or(0);
                            let mut names: Vec<String> =
                                stack[pos..].iter().map(|(n, _)| self.name_of(*n).to_string()).collect();
                            names.reverse();
                            return Some(names);
                        }
                        _ => {}
                    },
                    None => {
                        color[node as usize] = 2;
                        stack.pop();
                    }
                }
            }
        }
        None
    }
}
