//! [`NodeMap`]: a map from the nodes of a source graph to nodes, stored densely by slot (the
//! `val_map` of [`Graph::graph_copy_with`](crate::Graph::graph_copy_with)), and the small
//! trait that lets the copy routines fill either it or a `HashMap`.

use crate::graph::node_id::{GraphId, NodeId};
use std::collections::HashMap;

/// A map `NodeId → NodeId` for the nodes of one source graph, stored in a `Vec` indexed by the
/// source slot (no hashing): what [`Graph::graph_copy_with`](crate::Graph::graph_copy_with)
/// records, old node → new node. Keys are exact handles (slot, generation and graph), so a
/// stale or foreign key is never confused with a live one; keys of graphs other than the first
/// one inserted go to a small hash map on the side.
///
/// ```
/// use ferrofx_fx::{Graph, NodeMap, Target};
/// let mut src = Graph::new();
/// let x = src.placeholder("x").unwrap();
/// let r = src.call_function(Target::named("relu"), [x.into()]).unwrap();
/// src.output(r.into()).unwrap();
/// let mut dst = Graph::new();
/// let mut map = NodeMap::new();
/// let out = dst.graph_copy_with(&src, &mut map).unwrap().unwrap();
/// dst.output(out).unwrap();
/// assert_eq!(map.len(), 2);
/// assert_eq!(dst.node(map.get(r).unwrap()).unwrap().name(), "relu");
/// assert_eq!(dst.to_string(), src.to_string());
/// ```
#[derive(Debug, Clone, Default)]
pub struct NodeMap {
    /// The graph of the keys stored densely (the first key's graph).
    graph: Option<GraphId>,
    /// The graph of the values stored densely (the first value's graph).
    value_graph: Option<GraphId>,
    /// Per source slot: the key's generation and the value's slot and generation (12 bytes).
    dense: Vec<Slot>,
    /// Entries that do not fit the dense part (keys or values of other graphs, or a key whose
    /// slot already holds another generation's key).
    other: HashMap<NodeId, NodeId>,
    len: usize,
}

/// One dense entry; `value == EMPTY` when the slot has none.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key_generation: u32,
    value: u32,
    value_generation: u32,
}

/// No value in a dense slot (slot indices stay below `u32::MAX`).
const EMPTY: u32 = u32::MAX;

impl NodeMap {
    /// An empty map.
    pub fn new() -> NodeMap {
        NodeMap::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The dense slot holding `key`, if it is there.
    #[inline]
    fn dense_slot(&self, key: NodeId) -> Option<usize> {
        if Some(key.graph) != self.graph {
            return None;
        }
        let i = key.index as usize;
        match self.dense.get(i) {
            Some(s) if s.value != EMPTY && s.key_generation == key.generation => Some(i),
            _ => None,
        }
    }

    /// The value for `key`.
    #[inline]
    pub fn get(&self, key: NodeId) -> Option<NodeId> {
        match (self.dense_slot(key), self.value_graph) {
            (Some(i), Some(graph)) => {
                let s = self.dense[i];
                Some(NodeId { index: s.value, generation: s.value_generation, graph })
            }
            _ if self.other.is_empty() => None,
            _ => self.other.get(&key).copied(),
        }
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: NodeId) -> bool {
        self.get(key).is_some()
    }

    /// Removes the entry of `key`; returns its value.
    pub fn remove(&mut self, key: NodeId) -> Option<NodeId> {
        let old = match self.dense_slot(key) {
            Some(i) => {
                let v = self.get(key);
                self.dense[i].value = EMPTY;
                v
            }
            // (An empty `other` is not hashed into.)
            None if self.other.is_empty() => None,
            None => self.other.remove(&key),
        };
        self.len -= usize::from(old.is_some());
        old
    }

    /// Sets the value for `key`; returns the previous one.
    #[inline]
    pub fn insert(&mut self, key: NodeId, value: NodeId) -> Option<NodeId> {
        let old = if self.len == 0 { None } else { self.remove(key) };
        let graph = *self.graph.get_or_insert(key.graph);
        let value_graph = *self.value_graph.get_or_insert(value.graph);
        let i = key.index as usize;
        let fits = key.graph == graph && value.graph == value_graph && value.index != EMPTY;
        if fits && self.dense.len() <= i {
            self.dense.resize(i + 1, Slot { key_generation: 0, value: EMPTY, value_generation: 0 });
        }
        match self.dense.get_mut(i) {
            Some(s) if fits && s.value == EMPTY => {
                *s = Slot { key_generation: key.generation, value: value.index, value_generation: value.generation };
            }
            _ => {
                self.other.insert(key, value);
            }
        }
        self.len += 1;
        old
    }

    /// Room for keys up to slot `slots` of the dense graph.
    pub(crate) fn reserve_slots(&mut self, slots: usize) {
        self.dense.reserve(slots.saturating_sub(self.dense.len()));
    }

    /// The entries: the dense ones in slot order, then the others (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, NodeId)> + '_ {
        let (graph, value_graph) = (self.graph, self.value_graph);
        let dense = self.dense.iter().enumerate().filter_map(move |(i, s)| {
            if s.value == EMPTY {
                return None;
            }
            Some((
                NodeId { index: i as u32, generation: s.key_generation, graph: graph? },
                NodeId { index: s.value, generation: s.value_generation, graph: value_graph? },
            ))
        });
        dense.chain(self.other.iter().map(|(k, v)| (*k, *v)))
    }
}

impl From<NodeMap> for HashMap<NodeId, NodeId> {
    fn from(m: NodeMap) -> HashMap<NodeId, NodeId> {
        m.iter().collect()
    }
}

impl From<HashMap<NodeId, NodeId>> for NodeMap {
    fn from(m: HashMap<NodeId, NodeId>) -> NodeMap {
        let mut out = NodeMap::new();
        for (k, v) in m {
            out.insert(k, v);
        }
        out
    }
}

/// What the copy routines need of a `val_map`: [`NodeMap`] or `HashMap<NodeId, NodeId>`.
pub(crate) trait ValMap {
    fn record(&mut self, key: NodeId, value: NodeId);
    /// Whether some key belongs to graph `g`.
    fn has_key_of(&self, g: GraphId) -> bool;
    /// Calls `f` on every entry.
    fn for_each(&self, f: impl FnMut(NodeId, NodeId));
    /// Room for `n` more entries of a graph with `slots` slots.
    fn reserve_for(&mut self, n: usize, slots: usize);
}

impl ValMap for HashMap<NodeId, NodeId> {
    #[inline]
    fn record(&mut self, key: NodeId, value: NodeId) {
        self.insert(key, value);
    }
    fn has_key_of(&self, g: GraphId) -> bool {
        self.keys().any(|k| k.graph == g)
    }
    fn for_each(&self, mut f: impl FnMut(NodeId, NodeId)) {
        for (k, v) in self.iter() {
            f(*k, *v);
        }
    }
    fn reserve_for(&mut self, n: usize, _slots: usize) {
        self.reserve(n);
    }
}

impl ValMap for NodeMap {
    #[inline]
    fn record(&mut self, key: NodeId, value: NodeId) {
        self.insert(key, value);
    }
    fn has_key_of(&self, g: GraphId) -> bool {
        (self.graph == Some(g) && self.dense.iter().any(|s| s.value != EMPTY))
            || self.other.keys().any(|k| k.graph == g)
    }
    fn for_each(&self, mut f: impl FnMut(NodeId, NodeId)) {
        for (k, v) in self.iter() {
            f(k, v);
        }
    }
    fn reserve_for(&mut self, _n: usize, slots: usize) {
        self.reserve_slots(slots);
    }
}

#[cfg(test)]
mod tests {
    use super::NodeMap;
    use crate::graph::graph::Graph;
    use std::collections::HashMap;

    #[test]
    fn keys_are_exact_handles() {
        let mut g = Graph::new();
        let a = g.placeholder("a").unwrap();
        let b = g.placeholder("b").unwrap();
        let mut h = Graph::new();
        let c = h.placeholder("c").unwrap();
        let mut m = NodeMap::new();
        assert_eq!(m.insert(a, c), None);
        assert_eq!(m.insert(a, b), Some(c));
        assert_eq!(m.insert(c, a), None); // another graph: kept on the side
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(a), Some(b));
        assert_eq!(m.get(b), None);
        assert_eq!(m.get(c), Some(a));
        // A stale handle of a's slot is another key.
        g.erase_node(a).unwrap();
        let a2 = g.placeholder("a2").unwrap();
        assert_eq!(a2.index, a.index);
        assert_eq!(m.get(a2), None);
        assert_eq!(m.insert(a2, c), None);
        // Both the stale and the live handle of the slot are keys, as in a HashMap.
        assert_eq!((m.get(a), m.get(a2), m.len()), (Some(b), Some(c), 3));
        assert_eq!(m.insert(a2, a2), Some(c));
        assert_eq!(m.insert(a2, c), Some(a2));
        assert_eq!(m.remove(a), Some(b));
        assert_eq!((m.get(a), m.remove(a), m.len()), (None, None, 2));
        let hm: HashMap<_, _> = m.clone().into();
        assert_eq!(hm, HashMap::from([(a2, c), (c, a)]));
        let back = NodeMap::from(hm);
        assert_eq!((back.get(a2), back.get(c), back.len()), (Some(c), Some(a), 2));
        // Values of several graphs.
        let mut m = NodeMap::new();
        m.insert(a2, c);
        m.insert(b, b);
        assert_eq!((m.get(a2), m.get(b), m.len()), (Some(c), Some(b), 2));
        assert_eq!(m.iter().count(), 2);
    }

    /// `graph_copy_with` gives what `graph_copy` gives, on the bulk path (fresh destination)
    /// and on the node-by-node path (a pre-mapped input).
    #[test]
    fn graph_copy_with_matches_graph_copy() {
        use crate::graph::target::Target;
        let mut src = Graph::new();
        let x = src.placeholder("x").unwrap();
        let y = src.placeholder("y").unwrap();
        let a = src.call_function(Target::named("add"), [x.into(), y.into()]).unwrap();
        let r = src.call_function(Target::named("relu"), [a.into()]).unwrap();
        src.output(r.into()).unwrap();

        let (mut d1, mut d2) = (Graph::new(), Graph::new());
        let mut hm = HashMap::new();
        let mut nm = NodeMap::new();
        let o1 = d1.graph_copy(&src, &mut hm).unwrap().unwrap();
        let o2 = d2.graph_copy_with(&src, &mut nm).unwrap().unwrap();
        d1.output(o1).unwrap();
        d2.output(o2).unwrap();
        assert_eq!(d1.to_string(), d2.to_string());
        assert_eq!(nm.len(), hm.len());
        for (k, v) in &hm {
            assert_eq!(d2.node(nm.get(*k).unwrap()).unwrap().name(), d1.node(*v).unwrap().name());
        }

        // y pre-mapped to a node of the destination: copied node by node, y not copied.
        let mut d3 = Graph::new();
        let z = d3.placeholder("z").unwrap();
        let mut nm = NodeMap::new();
        nm.insert(y, z);
        let o3 = d3.graph_copy_with(&src, &mut nm).unwrap().unwrap();
        d3.output(o3).unwrap();
        d3.lint().unwrap();
        assert_eq!(nm.len(), 4);
        let add = d3.node(nm.get(a).unwrap()).unwrap();
        assert_eq!(add.all_input_nodes(), vec![nm.get(x).unwrap(), z]);
    }
}
