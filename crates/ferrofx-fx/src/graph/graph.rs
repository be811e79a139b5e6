//! [`Graph`]: the node arena, the circular doubly linked order with its sentinel root, sequence
//! numbers for O(1) order queries, node creation, erasure and moves.
//!
//! Storage is struct-of-arrays: every per-node field lives in its own contiguous `Vec` indexed
//! by the `u32` slot index, so a walk touches only the arrays it reads (the opcode array is one
//! byte per node, the user counts four). Edges (`users`, `input_nodes`) are sets of slot
//! indices; names are ids into the namespace's string arena.

use crate::graph::argument::{Argument, Kwargs};
use crate::graph::edge_set::{InputSet, UserList};
use crate::graph::error::{GraphError, Result};
use crate::graph::find_nodes::{key, FindNodesTable};
use crate::graph::insert_point::InsertPoint;
use crate::graph::lint::TargetResolver;
use crate::graph::meta::Meta;
use crate::graph::namespace::{NameId, Namespace};
use crate::graph::node::Node;
use crate::graph::node_id::{GraphId, NodeId};
use crate::graph::target::{check_target, Opcode, Target};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;

/// Index of the sentinel root in the arena. It is never erased and never handed out.
pub(crate) const ROOT: u32 = 0;
/// Sequence number gap between consecutive nodes after a full renumbering or an append.
const MAJOR_STRIDE: u64 = 1 << 16;
/// Gap used by local renumbering.
const MINOR_STRIDE: u64 = 1 << 6;
/// Local renumbering gives up (and renumbers everything) past this many sequence units.
const LOCAL_LIMIT: u64 = 128 * MINOR_STRIDE;

/// Positional arguments as stored: inline up to two (the common case), no allocation.
pub(crate) type Args = SmallVec<[Argument; 2]>;

/// Hot per-slot order data: links, generation, liveness, sequence number (24 bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) generation: u32,
    pub(crate) alive: bool,
    pub(crate) seq: u64,
}

/// The rarely used per-node fields, allocated only for nodes that have any of them.
#[derive(Clone, Default)]
pub(crate) struct Cold {
    pub(crate) type_expr: Option<String>,
    pub(crate) meta: Meta,
}

impl Cold {
    /// The record for a node created with `type_expr` and empty meta (`None` if nothing).
    fn with_type(type_expr: Option<String>) -> Option<Box<Cold>> {
        type_expr.map(|t| Box::new(Cold { type_expr: Some(t), meta: Meta::default() }))
    }
}

/// A torch.fx-style graph: nodes in an arena, ordered by a circular doubly linked list with a
/// sentinel root, with use-def edges kept consistent by every edit.
///
/// Order operations (insert, move, erase) are O(1); `is_before` is O(1) amortised thanks to
/// strided sequence numbers with local renumbering (as in Cranelift's layout). Node handles are
/// generational and carry the graph's identity.
///
/// ```
/// use ferrofx_fx::{Graph, Target};
/// let mut g = Graph::new();
/// let x = g.placeholder("x").unwrap();
/// let neg = g.call_function(Target::named("neg"), vec![x.into()]).unwrap();
/// let out = g.output(neg.into()).unwrap();
/// assert_eq!(g.len(), 3);
/// assert!(g.is_before(x, out).unwrap());
/// assert_eq!(g.nodes().collect::<Vec<_>>(), vec![x, neg, out]);
/// assert_eq!(g.nodes().rev().collect::<Vec<_>>(), vec![out, neg, x]);
/// ```
pub struct Graph {
    pub(crate) id: GraphId,
    pub(crate) links: Vec<Link>,
    pub(crate) ops: Vec<Opcode>,
    /// `users[i].len()`, kept by the use-def routine (contiguous for fast walks).
    pub(crate) nusers: Vec<u32>,
    pub(crate) names: Vec<NameId>,
    pub(crate) targets: Vec<Target>,
    pub(crate) args: Vec<Args>,
    pub(crate) kwargs: Vec<Option<Box<Kwargs>>>,
    pub(crate) users: Vec<UserList>,
    pub(crate) inputs: Vec<InputSet>,
    /// Rarely set per-node data (type annotation, meta), one lazily allocated record.
    pub(crate) cold: Vec<Option<Box<Cold>>>,
    free: VecDeque<u32>,
    len: usize,
    /// Slots `1..=len` are exactly the nodes, in order (true until something other than an
    /// append happens); iteration then walks indices instead of chasing links.
    pub(crate) dense: bool,
    pub(crate) insert: InsertPoint,
    pub(crate) namespace: Namespace,
    pub(crate) lookup: FindNodesTable,
    pub(crate) owner: Option<Arc<dyn TargetResolver + Send + Sync>>,
    /// Set when some input may come after its user (an edit or move broke the topological
    /// order); cycle checks then search without the order-based pruning. Cleared by
    /// [`Graph::stable_topological_sort`].
    pub(crate) unordered: bool,
}

impl Default for Graph {
    fn default() -> Graph {
        Graph::new()
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({}, {} nodes)", self.id, self.len)
    }
}

/// FX's `_snake_case`: an underscore before each upper-case letter that follows a lower-case
/// one, then lower case.
fn snake_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    let mut prev_lower = false;
    for c in s.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase();
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// FX's `_target_to_str`: the name a node gets from its target.
fn target_to_str(target: &Target) -> std::borrow::Cow<'_, str> {
    let raw = match target {
        Target::Str(s) if s.len() > 4 && s.starts_with("__") && s.ends_with("__") => &s[2..s.len() - 2],
        t => t.name(),
    };
    if raw.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(snake_case(raw))
    } else {
        std::borrow::Cow::Borrowed(raw)
    }
}

impl Graph {
    /// An empty graph with a fresh identity.
    pub fn new() -> Graph {
        Graph::with_capacity(0)
    }

    /// An empty graph with room for `n` nodes.
    pub fn with_capacity(n: usize) -> Graph {
        let mut g = Graph {
            id: GraphId::fresh(),
            links: Vec::with_capacity(n + 1),
            ops: Vec::with_capacity(n + 1),
            nusers: Vec::with_capacity(n + 1),
            names: Vec::with_capacity(n + 1),
            targets: Vec::with_capacity(n + 1),
            args: Vec::with_capacity(n + 1),
            kwargs: Vec::with_capacity(n + 1),
            users: Vec::with_capacity(n + 1),
            inputs: Vec::with_capacity(n + 1),
            cold: Vec::with_capacity(n + 1),
            free: VecDeque::new(),
            len: 0,
            dense: true,
            insert: InsertPoint::End,
            namespace: Namespace::new(),
            lookup: FindNodesTable::default(),
            owner: None,
            unordered: false,
        };
        g.namespace.reserve(n);
        g.lookup.reserve_slots(n + 1);
        // The sentinel root.
        g.push_slot(Opcode::Placeholder, Target::Str(String::new()), NameId::NONE, None);
        g.links[ROOT as usize].alive = true;
        g
    }

    /// Reserves room for `additional` more nodes in every array.
    pub fn reserve(&mut self, additional: usize) {
        self.reserve_slots(additional);
        self.namespace.reserve(additional);
    }

    /// [`Graph::reserve`] for the per-slot arrays (and the lookup table), not the namespace.
    pub(crate) fn reserve_slots(&mut self, additional: usize) {
        self.links.reserve(additional);
        self.ops.reserve(additional);
        self.nusers.reserve(additional);
        self.names.reserve(additional);
        self.targets.reserve(additional);
        self.args.reserve(additional);
        self.kwargs.reserve(additional);
        self.users.reserve(additional);
        self.inputs.reserve(additional);
        self.cold.reserve(additional);
        // The lookup table grows in step, so that it is not copied (and its fresh pages
        // touched twice) by growths of its own; so does the namespace (in `reserve`).
        self.lookup.reserve_slots(self.links.capacity());
    }

    /// Appends a fresh (unlinked, not yet live) slot to every array.
    fn push_slot(&mut self, op: Opcode, target: Target, name: NameId, type_expr: Option<String>) -> u32 {
        let idx = self.links.len() as u32;
        if self.links.len() == self.links.capacity() {
            // Grow every array at once, by 4x: capacity that is never used costs address space
            // only (its pages are never touched), while each growth copies every array, so
            // fewer growths mean fewer copies and fewer page faults (a 100,000-node graph
            // then takes 150,000 nodes without growing again).
            self.reserve(self.links.len().max(16) * 3);
        }
        self.links.push(Link { prev: ROOT, next: ROOT, generation: 0, alive: false, seq: 0 });
        self.ops.push(op);
        self.nusers.push(0);
        self.names.push(name);
        self.targets.push(target);
        self.args.push(Args::new());
        self.kwargs.push(None);
        self.users.push(UserList::default());
        self.inputs.push(InputSet::default());
        self.cold.push(Cold::with_type(type_expr));
        idx
    }

    /// This graph's identity.
    pub fn id(&self) -> GraphId {
        self.id
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The namespace that names this graph's nodes.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// Sets (or clears) the owner used by [`Graph::lint`] to check that `get_attr` and
    /// `call_module` targets exist (FX's `owning_module`).
    pub fn set_owner(&mut self, owner: Option<Arc<dyn TargetResolver + Send + Sync>>) {
        self.owner = owner;
    }

    // ----- handle validation -------------------------------------------------------------

    /// Validates a handle and returns its slot index.
    #[inline]
    pub(crate) fn check(&self, id: NodeId) -> Result<u32> {
        if id.graph != self.id {
            return Err(GraphError::ForeignNode { id, owner: id.graph, this: self.id });
        }
        match self.links.get(id.index as usize) {
            Some(l) if l.alive && l.generation == id.generation && id.index != ROOT => Ok(id.index),
            _ => Err(self.erased_error(id)),
        }
    }

    #[cold]
    fn erased_error(&self, id: NodeId) -> GraphError {
        let name = match self.links.get(id.index as usize) {
            Some(l) if !l.alive && l.generation == id.generation.wrapping_add(1) => {
                self.namespace.get(self.names[id.index as usize]).to_string()
            }
            _ => "?".to_string(),
        };
        GraphError::Erased { id, name }
    }

    /// Whether `id` is a live node of this graph (no error is built: editing loops ask this
    /// of erased nodes all the time).
    #[inline]
    pub fn contains(&self, id: NodeId) -> bool {
        id.graph == self.id
            && self
                .links
                .get(id.index as usize)
                .is_some_and(|l| l.alive && l.generation == id.generation && id.index != ROOT)
    }

    /// The node behind a handle, or an error naming the stale/foreign handle.
    #[inline]
    pub fn node(&self, id: NodeId) -> Result<Node<'_>> {
        let idx = self.check(id)?;
        Ok(Node { g: self, idx })
    }

    /// View of a slot known to be live (internal invariant: callers validated `idx`).
    #[inline]
    pub(crate) fn live(&self, idx: u32) -> Node<'_> {
        debug_assert!(self.links[idx as usize].alive && idx != ROOT);
        Node { g: self, idx }
    }

    /// The name of a slot.
    #[inline]
    pub(crate) fn name_of(&self, idx: u32) -> &str {
        self.namespace.get(self.names[idx as usize])
    }

    /// The handle of a live slot.
    #[inline]
    pub(crate) fn id_of(&self, idx: u32) -> NodeId {
        NodeId { index: idx, generation: self.links[idx as usize].generation, graph: self.id }
    }

    /// The node's name, or `?` for an invalid handle (for messages).
    pub(crate) fn name_or_unknown(&self, id: NodeId) -> String {
        match self.check(id) {
            Ok(idx) => self.name_of(idx).to_string(),
            Err(GraphError::Erased { name, .. }) => name,
            Err(_) => format!("{id:?}"),
        }
    }

    /// Metadata of a node, for editing.
    pub fn meta_mut(&mut self, id: NodeId) -> Result<&mut Meta> {
        let idx = self.check(id)?;
        Ok(&mut self.cold[idx as usize].get_or_insert_with(Default::default).meta)
    }

    /// Sets the type annotation of a node.
    pub fn set_type(&mut self, id: NodeId, type_expr: Option<String>) -> Result<()> {
        let idx = self.check(id)?;
        match (&mut self.cold[idx as usize], type_expr) {
            (Some(c), t) => c.type_expr = t,
            (c @ None, t) => *c = Cold::with_type(t),
        }
        Ok(())
    }

    /// Renames a node to a fresh unique name derived from `candidate`; returns the new name.
    pub fn rename(&mut self, id: NodeId, candidate: &str) -> Result<String> {
        let idx = self.check(id)?;
        let name = self.namespace.create(candidate);
        self.names[idx as usize] = name;
        Ok(self.namespace.get(name).to_string())
    }

    /// Changes a node's target, enforcing the opcode/target rule and keeping the
    /// [`find_nodes`](Graph::find_nodes) table current.
    pub fn set_target(&mut self, id: NodeId, target: Target) -> Result<()> {
        let idx = self.check(id)?;
        let op = self.ops[idx as usize];
        check_target(op, &target, self.name_of(idx))?;
        self.lookup.remove(idx);
        self.lookup.insert(key(op, &target), idx);
        self.targets[idx as usize] = target;
        Ok(())
    }

    // ----- order ---------------------------------------------------------------------------

    /// The first node, if any.
    pub fn first(&self) -> Option<NodeId> {
        let n = self.links[ROOT as usize].next;
        (n != ROOT).then(|| self.id_of(n))
    }

    /// The last node, if any.
    pub fn last(&self) -> Option<NodeId> {
        let p = self.links[ROOT as usize].prev;
        (p != ROOT).then(|| self.id_of(p))
    }

    /// The node after `id` (`None` at the end).
    pub fn next(&self, id: NodeId) -> Result<Option<NodeId>> {
        let idx = self.check(id)?;
        let n = self.links[idx as usize].next;
        Ok((n != ROOT).then(|| self.id_of(n)))
    }

    /// The node before `id` (`None` at the start).
    pub fn prev(&self, id: NodeId) -> Result<Option<NodeId>> {
        let idx = self.check(id)?;
        let p = self.links[idx as usize].prev;
        Ok((p != ROOT).then(|| self.id_of(p)))
    }

    /// Whether `a` comes before `b` in the graph order. O(1).
    ///
    /// ```
    /// use ferrofx_fx::Graph;
    /// let mut g = Graph::new();
    /// let a = g.placeholder("a").unwrap();
    /// let b = g.placeholder("b").unwrap();
    /// assert!(g.is_before(a, b).unwrap());
    /// g.prepend(a, b).unwrap(); // move b before a
    /// assert!(g.is_before(b, a).unwrap());
    /// ```
    pub fn is_before(&self, a: NodeId, b: NodeId) -> Result<bool> {
        let ia = self.check(a)?;
        let ib = self.check(b)?;
        Ok(self.links[ia as usize].seq < self.links[ib as usize].seq)
    }

    /// The sequence number of a node (strictly increasing along the order).
    pub fn seq(&self, id: NodeId) -> Result<u64> {
        let idx = self.check(id)?;
        Ok(self.links[idx as usize].seq)
    }

    #[inline]
    pub(crate) fn seq_of(&self, idx: u32) -> u64 {
        self.links[idx as usize].seq
    }

    /// Links slot `idx` between `prev` and `prev.next` and gives it a sequence number.
    fn link_after(&mut self, prev: u32, idx: u32) {
        let next = self.links[prev as usize].next;
        self.links[idx as usize].prev = prev;
        self.links[idx as usize].next = next;
        self.links[prev as usize].next = idx;
        self.links[next as usize].prev = idx;
        self.assign_seq(idx);
    }

    /// Removes slot `idx` from the order. Its own links are left as they were, so an erase-safe
    /// cursor standing on it can still find its successor.
    fn unlink(&mut self, idx: u32) {
        let Link { prev, next, .. } = self.links[idx as usize];
        self.links[prev as usize].next = next;
        self.links[next as usize].prev = prev;
    }

    fn assign_seq(&mut self, idx: u32) {
        let Link { prev, next, .. } = self.links[idx as usize];
        let prev_seq = self.links[prev as usize].seq;
        if next == ROOT {
            match prev_seq.checked_add(MAJOR_STRIDE) {
                Some(s) => self.links[idx as usize].seq = s,
                None => self.renumber_all(),
            }
            return;
        }
        let next_seq = self.links[next as usize].seq;
        if next_seq > prev_seq && next_seq - prev_seq >= 2 {
            self.links[idx as usize].seq = prev_seq + (next_seq - prev_seq) / 2;
            return;
        }
        // No room: renumber forward from idx with the minor stride until we catch up with the
        // existing numbering; give up and renumber everything past LOCAL_LIMIT.
        let limit = prev_seq.saturating_add(LOCAL_LIMIT);
        let mut seq = prev_seq.saturating_add(MINOR_STRIDE);
        let mut cur = idx;
        loop {
            self.links[cur as usize].seq = seq;
            let nx = self.links[cur as usize].next;
            if nx == ROOT || self.links[nx as usize].seq > seq {
                return;
            }
            seq = seq.saturating_add(MINOR_STRIDE);
            if seq > limit {
                self.renumber_all();
                return;
            }
            cur = nx;
        }
    }

    /// Renumbers every node with the major stride.
    pub(crate) fn renumber_all(&mut self) {
        let mut cur = self.links[ROOT as usize].next;
        let mut seq = 0u64;
        while cur != ROOT {
            seq += MAJOR_STRIDE;
            self.links[cur as usize].seq = seq;
            cur = self.links[cur as usize].next;
        }
    }

    /// Moves `x` to just before `anchor` (FX's `anchor.prepend(x)`). Only the order changes,
    /// never the edges. Moving a node next to itself is a no-op.
    pub fn prepend(&mut self, anchor: NodeId, x: NodeId) -> Result<()> {
        let a = self.check(anchor)?;
        let xi = self.check(x)?;
        if a == xi {
            return Ok(());
        }
        self.unlink(xi);
        let prev = self.links[a as usize].prev;
        self.link_after(prev, xi);
        self.note_order_of(xi);
        Ok(())
    }

    /// Moves `x` to just after `anchor` (FX's `anchor.append(x)`). Only the order changes.
    pub fn append(&mut self, anchor: NodeId, x: NodeId) -> Result<()> {
        let a = self.check(anchor)?;
        let xi = self.check(x)?;
        if a == xi {
            return Ok(());
        }
        self.unlink(xi);
        self.link_after(a, xi);
        self.note_order_of(xi);
        Ok(())
    }

    /// Sets [`Graph::unordered`] if a moved node now comes before an input or after a user.
    fn note_order_of(&mut self, idx: u32) {
        let seq = self.seq_of(idx);
        let bad = self.inputs[idx as usize].iter().any(|i| self.seq_of(i) >= seq)
            || self.users[idx as usize].iter().any(|u| self.seq_of(u) <= seq);
        self.unordered |= bad;
        self.dense = false;
    }

    /// Relinks all nodes in the given order (which must be a permutation of the graph's nodes)
    /// and renumbers them.
    pub(crate) fn relink_in_order(&mut self, order: &[u32]) {
        let mut prev = ROOT;
        for &idx in order {
            self.links[prev as usize].next = idx;
            self.links[idx as usize].prev = prev;
            prev = idx;
        }
        self.links[prev as usize].next = ROOT;
        self.links[ROOT as usize].prev = prev;
        self.renumber_all();
        self.unordered = false;
        self.dense = false;
    }

    // ----- creation ------------------------------------------------------------------------

    /// Where [`Graph::create_node`] puts the next node: the slot to link after.
    fn resolve_insert_point(&self) -> Result<u32> {
        Ok(match self.insert {
            InsertPoint::End => self.links[ROOT as usize].prev,
            InsertPoint::Start => ROOT,
            InsertPoint::Before(n) => self.links[self.check(n)? as usize].prev,
            InsertPoint::After(n) => self.check(n)?,
        })
    }

    /// Validates every node referenced by `args`/`kwargs` for use as an input of slot `user`
    /// (`None` for a node being created): live, of this graph, not the user itself, and no
    /// cycle through the user.
    pub(crate) fn validate_inputs(&self, user: Option<u32>, args: &[Argument], kwargs: Option<&Kwargs>) -> Result<()> {
        // Common case inline: node and scalar arguments, no kwargs.
        if kwargs.is_none() {
            for a in args {
                match a {
                    Argument::Node(n) => {
                        let idx = self.check(*n)?;
                        if let Some(u) = user {
                            self.check_no_cycle(u, idx)?;
                        }
                    }
                    Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_) => {
                        return self.validate_inputs_nested(user, args, kwargs)
                    }
                    _ => {}
                }
            }
            return Ok(());
        }
        self.validate_inputs_nested(user, args, kwargs)
    }

    /// [`Graph::validate_inputs`] for any arguments (containers, kwargs).
    fn validate_inputs_nested(&self, user: Option<u32>, args: &[Argument], kwargs: Option<&Kwargs>) -> Result<()> {
        let mut result = Ok(());
        let mut visit = |n: NodeId| {
            if result.is_err() {
                return;
            }
            result = match self.check(n) {
                Err(e) => Err(e),
                Ok(idx) => match user {
                    Some(u) => self.check_no_cycle(u, idx),
                    None => Ok(()),
                },
            };
        };
        for a in args {
            a.visit_nodes(&mut visit);
        }
        if let Some(k) = kwargs {
            for a in k.values() {
                a.visit_nodes(&mut visit);
            }
        }
        result
    }

    /// FX's `create_node`: the single entry point of node creation. Enforces the opcode/target
    /// rule, validates the inputs, names the node uniquely (from `name` or the target), inserts
    /// it at the current insertion point and records its use-def edges.
    ///
    /// ```
    /// use ferrofx_fx::{Argument, Graph, GraphError, Kwargs, Opcode, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let m = g
    ///     .create_node(Opcode::CallModule, "layers.0".into(), vec![x.into()], Kwargs::new(), None, None)
    ///     .unwrap();
    /// assert_eq!(g.node(m).unwrap().name(), "layers_0");
    /// // call_function needs a callable target:
    /// let err = g.create_node(Opcode::CallFunction, "add".into(), vec![], Kwargs::new(), None, None);
    /// assert!(matches!(err, Err(GraphError::NotCallable { .. })));
    /// ```
    pub fn create_node(
        &mut self,
        op: Opcode,
        target: Target,
        args: Vec<Argument>,
        kwargs: Kwargs,
        name: Option<&str>,
        type_expr: Option<String>,
    ) -> Result<NodeId> {
        let kwargs = (!kwargs.is_empty()).then(|| Box::new(kwargs));
        self.create_node_raw(op, target, Args::from_vec(args), kwargs, name, type_expr)
    }

    /// [`Graph::create_node`] on the stored representations (no conversion).
    pub(crate) fn create_node_raw(
        &mut self,
        op: Opcode,
        target: Target,
        args: Args,
        kwargs: Option<Box<Kwargs>>,
        name: Option<&str>,
        type_expr: Option<String>,
    ) -> Result<NodeId> {
        let (name, after) = {
            let candidate = match name {
                Some(n) => std::borrow::Cow::Borrowed(n),
                None => target_to_str(&target),
            };
            check_target(op, &target, &candidate)?;
            self.validate_inputs(None, &args, kwargs.as_deref())?;
            if self.links.len() >= u32::MAX as usize && self.free.is_empty() {
                return Err(GraphError::InvalidMove("the graph is full (2^32 - 1 slots)".to_string()));
            }
            let after = self.resolve_insert_point()?;
            // Naming is the first mutation: every check above comes before it.
            (self.namespace.create(&candidate), after)
        };
        let lookup_key = key(op, &target);
        let tail = self.links[ROOT as usize].prev;
        let idx = match self.free.pop_front() {
            Some(idx) => {
                let i = idx as usize;
                self.ops[i] = op;
                self.names[i] = name;
                self.targets[i] = target;
                self.cold[i] = Cold::with_type(type_expr);
                idx
            }
            None => self.push_slot(op, target, name, type_expr),
        };
        self.dense = self.dense && after == tail && idx as usize == self.len + 1;
        self.links[idx as usize].alive = true;
        self.lookup.insert(lookup_key, idx);
        self.link_after(after, idx);
        self.len += 1;
        self.apply_args_kwargs(idx, Some(args), Some(kwargs));
        Ok(self.id_of(idx))
    }

    /// A `placeholder` (function input) named `name`.
    pub fn placeholder(&mut self, name: &str) -> Result<NodeId> {
        self.create_node_raw(Opcode::Placeholder, Target::Str(name.to_string()), Args::new(), None, Some(name), None)
    }

    /// A `placeholder` with a default value (`args = (default,)`).
    pub fn placeholder_with_default(&mut self, name: &str, default: Argument) -> Result<NodeId> {
        let args: Args = smallvec::smallvec![default];
        self.create_node_raw(Opcode::Placeholder, Target::Str(name.to_string()), args, None, Some(name), None)
    }

    /// A `get_attr` of the dotted attribute path `path`.
    pub fn get_attr(&mut self, path: &str) -> Result<NodeId> {
        self.create_node_raw(Opcode::GetAttr, Target::Str(path.to_string()), Args::new(), None, None, None)
    }

    /// A `call_function` of a registry op or user function with positional args (a `Vec`, or
    /// an array such as `[x.into(), y.into()]`, which needs no heap allocation).
    pub fn call_function(
        &mut self,
        target: impl Into<Target>,
        args: impl IntoIterator<Item = Argument>,
    ) -> Result<NodeId> {
        self.create_node_raw(Opcode::CallFunction, target.into(), args.into_iter().collect(), None, None, None)
    }

    /// A `call_function` with positional and keyword args.
    pub fn call_function_with(
        &mut self,
        target: impl Into<Target>,
        args: Vec<Argument>,
        kwargs: Kwargs,
    ) -> Result<NodeId> {
        self.create_node(Opcode::CallFunction, target.into(), args, kwargs, None, None)
    }

    /// A `call_method` of `method` on `args[0]`.
    pub fn call_method(&mut self, method: &str, args: Vec<Argument>) -> Result<NodeId> {
        self.create_node(Opcode::CallMethod, Target::Str(method.to_string()), args, Kwargs::new(), None, None)
    }

    /// A `call_method` with keyword args.
    pub fn call_method_with(&mut self, method: &str, args: Vec<Argument>, kwargs: Kwargs) -> Result<NodeId> {
        self.create_node(Opcode::CallMethod, Target::Str(method.to_string()), args, kwargs, None, None)
    }

    /// A `call_module` of the submodule at dotted path `path`.
    pub fn call_module(&mut self, path: &str, args: Vec<Argument>) -> Result<NodeId> {
        self.create_node(Opcode::CallModule, Target::Str(path.to_string()), args, Kwargs::new(), None, None)
    }

    /// A `call_module` with keyword args.
    pub fn call_module_with(&mut self, path: &str, args: Vec<Argument>, kwargs: Kwargs) -> Result<NodeId> {
        self.create_node(Opcode::CallModule, Target::Str(path.to_string()), args, kwargs, None, None)
    }

    /// The `output` node returning `result`.
    pub fn output(&mut self, result: Argument) -> Result<NodeId> {
        let args: Args = smallvec::smallvec![result];
        self.create_node_raw(Opcode::Output, Target::Str("output".to_string()), args, None, None, None)
    }

    /// The last `output` node, if any (FX's `output_node`).
    pub fn output_node(&self) -> Option<NodeId> {
        self.nodes().rev().find(|&id| self.ops[id.index as usize] == Opcode::Output)
    }

    // ----- erasure -------------------------------------------------------------------------

    /// Erases a node that has no users; its edges to its inputs are removed first. With users
    /// left it refuses, listing them.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, GraphError, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// let err = g.erase_node(x).unwrap_err();
    /// assert_eq!(err, GraphError::HasUsers { node: "x".into(), users: vec!["relu".into()] });
    /// g.erase_node(r).unwrap();
    /// assert_eq!(g.node(x).unwrap().num_users(), 0);
    /// ```
    pub fn erase_node(&mut self, id: NodeId) -> Result<()> {
        let idx = self.check(id)?;
        if self.nusers[idx as usize] != 0 {
            return Err(GraphError::HasUsers {
                node: self.name_of(idx).to_string(),
                users: self.users[idx as usize].iter().map(|u| self.name_of(u).to_string()).collect(),
            });
        }
        self.erase_unused(idx);
        Ok(())
    }

    /// Appends a copy of `src`'s slot `s` (opcode, target, name id, type, meta; no args yet)
    /// at the end of this graph, which shares `src`'s name arena (whole-graph copy).
    pub(crate) fn append_copied_slot(&mut self, src: &Graph, s: u32) -> u32 {
        let si = s as usize;
        let op = src.ops[si];
        let target = src.targets[si].clone();
        let lookup_key = key(op, &target);
        let name = src.names[si];
        self.namespace.mark(name);
        let tail = self.links[ROOT as usize].prev;
        let idx = self.push_slot(op, target, name, None);
        if let Some(c) = &src.cold[si] {
            self.cold[idx as usize] = Some(c.clone());
        }
        self.dense = self.dense && idx as usize == self.len + 1;
        self.links[idx as usize].alive = true;
        self.lookup.insert(lookup_key, idx);
        self.link_after(tail, idx);
        self.len += 1;
        idx
    }

    /// Erases live slot `idx`, which has no users.
    pub(crate) fn erase_unused(&mut self, idx: u32) {
        // FX nulls the node's args through the use-def routine so its inputs forget it.
        self.clear_args_kwargs(idx);
        self.lookup.remove(idx);
        self.unlink(idx);
        let link = &mut self.links[idx as usize];
        link.alive = false;
        link.generation = link.generation.wrapping_add(1);
        // The name stays (for error messages about stale handles) until the slot is reused.
        self.cold[idx as usize] = None;
        self.free.push_back(idx);
        self.len -= 1;
        self.dense = false;
    }
}
