//! Copying nodes and graphs.

use crate::graph::argument::{Argument, Kwargs};
use crate::graph::error::{GraphError, Result};
use crate::graph::graph::Args;
use crate::graph::graph::Graph;
use crate::graph::node::Node;
use crate::graph::node_id::NodeId;
use crate::graph::node_map::{NodeMap, ValMap};
use crate::graph::target::Opcode;
use std::collections::HashMap;

impl Graph {
    /// FX's `node_copy`: creates in this graph a node like `node` (which may belong to any
    /// graph) at the insertion point, mapping each node reference of its args/kwargs through
    /// `arg_transform`. Name (made unique), type and meta are copied.
    ///
    /// ```
    /// use ferrofx_fx::{Argument, Graph, Target};
    /// let mut src = Graph::new();
    /// let x = src.placeholder("x").unwrap();
    /// let r = src.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// let mut dst = Graph::new();
    /// let y = dst.placeholder("y").unwrap();
    /// let r2 = dst.node_copy(&src.node(r).unwrap(), |_| Ok(Argument::Node(y))).unwrap();
    /// assert_eq!(dst.node(r2).unwrap().all_input_nodes(), vec![y]);
    /// ```
    pub fn node_copy(
        &mut self,
        node: &Node<'_>,
        mut arg_transform: impl FnMut(NodeId) -> Result<Argument>,
    ) -> Result<NodeId> {
        let args = node.args().iter().map(|a| a.try_map_nodes(&mut arg_transform)).collect::<Result<Args>>()?;
        let kwargs = match &node.g.kwargs[node.idx as usize] {
            None => None,
            Some(k) => Some(Box::new(
                k.iter()
                    .map(|(k, v)| Ok((k.clone(), v.try_map_nodes(&mut arg_transform)?)))
                    .collect::<Result<Kwargs>>()?,
            )),
        };
        let type_expr = node.type_expr().map(str::to_string);
        let id = self.create_node_raw(node.op(), node.target().clone(), args, kwargs, Some(node.name()), type_expr)?;
        if let Some(c) = &node.g.cold[node.idx as usize] {
            self.cold[id.index as usize] = Some(c.clone());
        }
        Ok(id)
    }

    /// FX's `graph_copy`: copies every node of `src` except its output into this graph,
    /// recording `src` node → new node in `val_map` (entries already present are used instead
    /// of copying). Returns the value the output of `src` returned, mapped into this graph, or
    /// `None` when `src` has no output.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Target};
    /// use std::collections::HashMap;
    /// let mut src = Graph::new();
    /// let x = src.placeholder("x").unwrap();
    /// let r = src.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// src.output(r.into()).unwrap();
    /// let mut dst = Graph::new();
    /// let mut map = HashMap::new();
    /// let out = dst.graph_copy(&src, &mut map).unwrap().unwrap();
    /// dst.output(out).unwrap();
    /// assert_eq!(dst.to_string(), src.to_string());
    /// ```
    pub fn graph_copy(&mut self, src: &Graph, val_map: &mut HashMap<NodeId, NodeId>) -> Result<Option<Argument>> {
        self.graph_copy_impl(src, val_map)
    }

    /// [`Graph::graph_copy`] recording old node → new node in a dense [`NodeMap`] instead of a
    /// `HashMap` (no hashing per node; same result otherwise).
    pub fn graph_copy_with(&mut self, src: &Graph, val_map: &mut NodeMap) -> Result<Option<Argument>> {
        self.graph_copy_impl(src, val_map)
    }

    fn graph_copy_impl(&mut self, src: &Graph, val_map: &mut impl ValMap) -> Result<Option<Argument>> {
        let fresh = self.links.len() == 1 && self.namespace.count() == 0;
        if fresh && !src.unordered && !val_map.has_key_of(src.id) {
            return Ok(self.graph_copy_whole(src, val_map));
        }
        // Slot-indexed map of src nodes (faster than hashing every lookup).
        let mut fast: Vec<Option<NodeId>> = vec![None; src.links.len()];
        val_map.for_each(|k, v| {
            if src.contains(k) {
                fast[k.index as usize] = Some(v);
            }
        });
        val_map.reserve_for(src.len(), src.links.len());
        self.reserve(src.len() + 1);
        let mut result = None;
        for node in src.iter() {
            if fast[node.idx as usize].is_some() {
                continue;
            }
            let mut map = |n: NodeId| -> Result<Argument> {
                match fast.get(n.index as usize) {
                    Some(Some(m)) if n.graph == src.id => Ok(Argument::Node(*m)),
                    _ => Err(GraphError::Erased { id: n, name: src.name_or_unknown(n) }),
                }
            };
            if node.op() == Opcode::Output {
                result = Some(match node.args().first() {
                    Some(a) => a.try_map_nodes(&mut map)?,
                    None => Argument::None,
                });
                break;
            }
            let new = self.node_copy(&node, map)?;
            fast[node.idx as usize] = Some(new);
            val_map.record(node.id(), new);
        }
        Ok(result)
    }

    /// [`Graph::graph_copy`] into a fresh graph of a topologically ordered `src` with nothing
    /// pre-mapped: the same result as copying node by node, in bulk. Nothing can fail (src's
    /// invariants guarantee live, ordered inputs and unique names), names keep their interned
    /// ids (the name arena is cloned, then the copied names are marked used), slots are
    /// assigned in order so node references map by a slot table, and the use-def edges still
    /// come from the one routine.
    fn graph_copy_whole(&mut self, src: &Graph, val_map: &mut impl ValMap) -> Option<Argument> {
        let mut order: Vec<u32> = Vec::with_capacity(src.len());
        let mut new_index = vec![u32::MAX; src.links.len()];
        let mut output = None;
        for s in src.slots() {
            if src.ops[s as usize] == Opcode::Output {
                output = Some(s);
                break;
            }
            order.push(s);
            new_index[s as usize] = order.len() as u32;
        }
        // Room for the output the caller adds next (FX: `g.output(g.graph_copy(src, {}))`), so
        // that the arrays do not grow (and get copied) right after the copy; the name arena
        // is cloned with room for a few new names likewise.
        self.namespace = crate::graph::namespace::Namespace::arena_copy(&src.namespace, 16);
        self.reserve_slots(order.len() + 1);
        val_map.reserve_for(order.len(), src.links.len());
        let graph = self.id;
        let remap = |n: NodeId| Argument::Node(NodeId { index: new_index[n.index as usize], generation: 0, graph });
        for &s in &order {
            let si = s as usize;
            // Common case: every argument is a node or a scalar; clone and renumber in place.
            let mut args: Args = src.args[si].clone();
            for a in args.iter_mut() {
                match a {
                    Argument::Node(n) => *n = NodeId { index: new_index[n.index as usize], generation: 0, graph },
                    Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_) => {
                        *a = a.map_nodes(&mut { remap })
                    }
                    _ => {}
                }
            }
            let kwargs = src.kwargs[si]
                .as_ref()
                .map(|k| Box::new(k.iter().map(|(k, v)| (k.clone(), v.map_nodes(&mut { remap }))).collect::<Kwargs>()));
            let d = self.append_copied_slot(src, s);
            self.apply_args_kwargs(d, Some(args), Some(kwargs));
            val_map.record(src.id_of(s), self.id_of(d));
        }
        output.map(|o| src.args[o as usize].first().map_or(Argument::None, |a| a.map_nodes(&mut { remap })))
    }

    /// A copy of this graph with a fresh identity (same names, order, args, meta). Returns the
    /// copy and the map from this graph's nodes to the copy's.
    pub fn deep_copy(&self) -> Result<(Graph, HashMap<NodeId, NodeId>)> {
        let mut g = Graph::new();
        let mut map = HashMap::with_capacity(self.len());
        if let Some(out) = self.graph_copy_into(&mut g, &mut map)? {
            g.output(out)?;
        }
        g.owner = self.owner.clone();
        Ok((g, map))
    }

    fn graph_copy_into(&self, g: &mut Graph, map: &mut HashMap<NodeId, NodeId>) -> Result<Option<Argument>> {
        g.graph_copy(self, map)
    }
}
