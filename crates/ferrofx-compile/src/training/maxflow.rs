//! Maximum flow / minimum cut (Dinic's algorithm) on the small graphs partitioners build.

/// A capacity no cut may cross ("infinite").
pub const INF: u64 = 1 << 60;

/// A flow network with integer capacities.
pub struct FlowGraph {
    head: Vec<Vec<usize>>,
    to: Vec<usize>,
    cap: Vec<u64>,
}

impl FlowGraph {
    /// A network with `n` vertices and no edges.
    pub fn new(n: usize) -> FlowGraph {
        FlowGraph { head: vec![Vec::new(); n], to: Vec::new(), cap: Vec::new() }
    }

    /// Adds the edge `u → v` with capacity `c` (and its residual twin).
    pub fn add_edge(&mut self, u: usize, v: usize, c: u64) {
        self.head[u].push(self.to.len());
        self.to.push(v);
        self.cap.push(c.min(INF));
        self.head[v].push(self.to.len());
        self.to.push(u);
        self.cap.push(0);
    }

    fn levels(&self, s: usize) -> Vec<u32> {
        let mut level = vec![u32::MAX; self.head.len()];
        level[s] = 0;
        let mut queue = std::collections::VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            for &e in &self.head[u] {
                let v = self.to[e];
                if self.cap[e] > 0 && level[v] == u32::MAX {
                    level[v] = level[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        level
    }

    /// Pushes a blocking flow along level-increasing paths (iterative DFS).
    fn blocking(&mut self, s: usize, t: usize, level: &[u32], it: &mut [usize]) -> u64 {
        let mut total = 0u64;
        loop {
            // find one augmenting path
            let mut path: Vec<usize> = vec![];
            let mut u = s;
            loop {
                if u == t {
                    break;
                }
                let mut advanced = false;
                while it[u] < self.head[u].len() {
                    let e = self.head[u][it[u]];
                    let v = self.to[e];
                    if self.cap[e] > 0 && level[v] == level[u].wrapping_add(1) {
                        path.push(e);
                        u = v;
                        advanced = true;
                        break;
                    }
                    it[u] += 1;
                }
                if !advanced {
                    if u == s {
                        return total;
                    }
                    // dead end: retreat
                    let e = path.pop().expect("non-empty path when not at the source");
                    u = self.to[e ^ 1];
                    it[u] += 1;
                }
            }
            let f = path.iter().map(|&e| self.cap[e]).min().unwrap_or(0);
            for &e in &path {
                self.cap[e] -= f;
                self.cap[e ^ 1] = self.cap[e ^ 1].saturating_add(f);
            }
            total = total.saturating_add(f);
            if total >= INF {
                return total;
            }
        }
    }

    /// The maximum flow from `s` to `t` (saturating at [`INF`]) and the source side of a minimum
    /// cut (vertices reachable from `s` in the residual network).
    ///
    /// ```
    /// use ferrofx_compile::training::maxflow::FlowGraph;
    /// let mut g = FlowGraph::new(4);
    /// g.add_edge(0, 1, 3);
    /// g.add_edge(0, 2, 2);
    /// g.add_edge(1, 3, 1);
    /// g.add_edge(2, 3, 5);
    /// let (flow, side) = g.min_cut(0, 3);
    /// assert_eq!(flow, 3);
    /// assert_eq!(side, vec![true, true, false, false]);
    /// ```
    pub fn min_cut(&mut self, s: usize, t: usize) -> (u64, Vec<bool>) {
        let mut flow = 0u64;
        loop {
            let level = self.levels(s);
            if level[t] == u32::MAX || flow >= INF {
                break;
            }
            let mut it = vec![0usize; self.head.len()];
            let f = self.blocking(s, t, &level, &mut it);
            if f == 0 {
                break;
            }
            flow = flow.saturating_add(f);
        }
        let level = self.levels(s);
        (flow.min(INF), level.iter().map(|&l| l != u32::MAX).collect())
    }
}
