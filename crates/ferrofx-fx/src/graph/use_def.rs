//! Use-def tracking (seed 000 §6). [`Graph::apply_args_kwargs`] is the ONE routine that edits
//! `users` and `input_nodes`; node creation, every args/kwargs edit, input replacement and
//! erasure go through it.

use crate::graph::argument::{Argument, Kwargs};
use crate::graph::edge_set::{InputEdge, InputSet, TOMB};
use crate::graph::error::{GraphError, Result};
use crate::graph::graph::{Args, Graph};
use crate::graph::hash::FxHashMap;
use crate::graph::node::Node;
use crate::graph::node_id::NodeId;

impl Graph {
    /// THE use-def routine (FX's `_update_args_kwargs`). Callers validated every node in the
    /// new args/kwargs (live, same graph, acyclic).
    ///
    /// `args`/`kwargs` replace the stored ones when given (`None` keeps them: callers that
    /// edited the stored arguments in place pass `None` to re-derive the edges).
    ///
    /// Semantics (FX): remove this node from the `users` of each old input, clear
    /// `input_nodes`; then walk the args then kwargs, adding each node met once, in
    /// first-appearance order, to `input_nodes`, and this node to the end of that node's
    /// `users`. Implemented as a diff with the same result: inputs that go away lose this user,
    /// new inputs gain it at the end, and inputs that stay see it moved to the end of their
    /// `users` (one index lookup on a large set instead of a removal and an insertion).
    pub(crate) fn apply_args_kwargs(&mut self, idx: u32, args: Option<Args>, kwargs: Option<Option<Box<Kwargs>>>) {
        let i = idx as usize;
        if let Some(a) = args {
            self.args[i] = a;
        }
        if let Some(k) = kwargs {
            self.kwargs[i] = k;
        }
        let old = std::mem::take(&mut self.inputs[i]);
        // The new set is built in place (not moved in afterwards: copying a just-written small
        // vector stalls on store forwarding). While the user lists change below, `idx` is never
        // a live user of a list being compacted (its entry there is removed first), so the
        // compactions never need to fix up one of its positions.
        self.derive_inputs(i);
        let my_seq = self.links[i].seq;
        if !old.entries.is_empty() {
            for o in old.entries.iter() {
                if !self.inputs[i].contains(o.node) {
                    self.remove_user_at(o.node, o.pos);
                }
            }
        }
        for k in 0..self.inputs[i].entries.len() {
            let n = self.inputs[i].entries[k].node;
            let nu = n as usize;
            let pos = match old.find(n) {
                // Already the last user: moving it to the end changes nothing.
                Some(o) if o.pos as usize + 1 == self.users[nu].entries.len() => o.pos,
                found => {
                    if let Some(o) = found {
                        self.remove_user_at(n, o.pos);
                    }
                    let list = &mut self.users[nu].entries;
                    let pos = list.len() as u32;
                    list.push(idx);
                    self.nusers[nu] += 1;
                    pos
                }
            };
            self.inputs[i].entries[k].pos = pos;
            self.unordered |= self.links[nu].seq >= my_seq;
        }
    }

    /// Fills the (empty) input set of slot `i` from its args then kwargs: each node met once,
    /// in first-appearance order (edge positions not yet set).
    #[inline]
    fn derive_inputs(&mut self, i: usize) {
        fn add(set: &mut InputSet, n: u32) {
            if !set.contains(n) {
                set.entries.push(InputEdge { node: n, pos: TOMB });
            }
        }
        let Graph { args, kwargs, inputs, .. } = self;
        let set = &mut inputs[i];
        for a in args[i].iter() {
            match a {
                Argument::Node(n) => add(set, n.index),
                Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_) => {
                    a.visit_nodes(&mut |n| add(set, n.index))
                }
                _ => {}
            }
        }
        if let Some(k) = &kwargs[i] {
            for a in k.values() {
                a.visit_nodes(&mut |n| add(set, n.index));
            }
        }
    }

    /// [`Graph::apply_args_kwargs`] with empty args and no kwargs (erasure): every input
    /// forgets this user, in input order.
    pub(crate) fn clear_args_kwargs(&mut self, idx: u32) {
        let i = idx as usize;
        self.args[i] = Args::new();
        self.kwargs[i] = None;
        let old = std::mem::take(&mut self.inputs[i]);
        for o in old.entries.iter() {
            self.remove_user_at(o.node, o.pos);
        }
    }

    /// Removes the user edge at `pos` of slot `n`'s user list (a tombstone), dropping trailing
    /// tombstones and compacting once the dead outnumber the live; compaction fixes up the
    /// positions recorded in the input sets of the users that moved.
    fn remove_user_at(&mut self, n: u32, pos: u32) {
        let nu = n as usize;
        let list = &mut self.users[nu].entries;
        let entries = list.as_mut_slice();
        debug_assert!(entries[pos as usize] != TOMB);
        entries[pos as usize] = TOMB;
        // Drop trailing tombstones.
        let mut len = entries.len();
        while len > 0 && entries[len - 1] == TOMB {
            len -= 1;
        }
        list.truncate(len);
        self.nusers[nu] -= 1;
        let live = self.nusers[nu] as usize;
        if list.len() - live > live.max(4) {
            list.retain(|e| *e != TOMB);
            for (p, &u) in list.iter().enumerate() {
                if let Some(e) = self.inputs[u as usize].entries.iter_mut().find(|e| e.node == n) {
                    e.pos = p as u32;
                }
            }
        }
    }

    /// Err if making slot `input` an input of slot `user` would create a cycle (including
    /// `user == input`). While the order is topological, only an input that comes after the
    /// user can close a cycle, so the search is bounded to nodes after the user; once an edit
    /// broke the order ([`Graph::unordered`]) the search is unbounded until the next sort.
    pub(crate) fn check_no_cycle(&self, user: u32, input: u32) -> Result<()> {
        if user == input {
            let name = self.name_of(user).to_string();
            return Err(GraphError::Cycle { node: name.clone(), path: vec![name.clone(), name] });
        }
        let user_seq = self.seq_of(user);
        let prune = !self.unordered;
        if prune && self.seq_of(input) < user_seq {
            return Ok(());
        }
        // DFS from `input` through input_nodes looking for `user`.
        let mut parent: FxHashMap<u32, u32> = FxHashMap::default();
        let mut stack = vec![input];
        parent.insert(input, input);
        while let Some(cur) = stack.pop() {
            for n in self.inputs[cur as usize].iter() {
                if n == user {
                    // Path: user -> input -> ... -> cur -> user (as "depends on").
                    let mut path = vec![self.name_of(user).to_string()];
                    let mut chain = vec![cur];
                    let mut c = cur;
                    while c != input {
                        c = parent[&c];
                        chain.push(c);
                    }
                    path.extend(chain.iter().rev().map(|&i| self.name_of(i).to_string()));
                    path.push(self.name_of(user).to_string());
                    return Err(GraphError::Cycle { node: self.name_of(user).to_string(), path });
                }
                if (!prune || self.seq_of(n) > user_seq) && !parent.contains_key(&n) {
                    parent.insert(n, cur);
                    stack.push(n);
                }
            }
        }
        Ok(())
    }

    /// Sets positional args (FX's `node.args = ...`).
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let y = g.placeholder("y").unwrap();
    /// let add = g.call_function(Target::named("add"), vec![x.into(), y.into()]).unwrap();
    /// g.set_args(add, vec![x.into(), x.into()]).unwrap();
    /// assert_eq!(g.node(add).unwrap().all_input_nodes(), vec![x]);
    /// assert_eq!(g.node(y).unwrap().num_users(), 0);
    /// // a node cannot use itself:
    /// assert!(g.set_args(add, vec![add.into()]).is_err());
    /// ```
    pub fn set_args(&mut self, id: NodeId, args: Vec<Argument>) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), &args, None)?;
        self.apply_args_kwargs(idx, Some(Args::from_vec(args)), None);
        Ok(())
    }

    /// Sets keyword args (FX's `node.kwargs = ...`).
    pub fn set_kwargs(&mut self, id: NodeId, kwargs: Kwargs) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), &[], Some(&kwargs))?;
        self.apply_args_kwargs(idx, None, Some((!kwargs.is_empty()).then(|| Box::new(kwargs))));
        Ok(())
    }

    /// Sets both args and kwargs at once.
    pub fn set_args_kwargs(&mut self, id: NodeId, args: Vec<Argument>, kwargs: Kwargs) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), &args, Some(&kwargs))?;
        let kwargs = (!kwargs.is_empty()).then(|| Box::new(kwargs));
        self.apply_args_kwargs(idx, Some(Args::from_vec(args)), Some(kwargs));
        Ok(())
    }

    /// Replaces positional arg `index` (FX's `update_arg`).
    pub fn update_arg(&mut self, id: NodeId, index: usize, arg: Argument) -> Result<()> {
        let idx = self.check(id)?;
        let len = self.args[idx as usize].len();
        if index >= len {
            return Err(GraphError::ArgIndex { node: self.name_of(idx).to_string(), index, len });
        }
        self.validate_inputs(Some(idx), std::slice::from_ref(&arg), None)?;
        self.args[idx as usize][index] = arg;
        self.apply_args_kwargs(idx, None, None);
        Ok(())
    }

    /// Inserts positional arg `arg` before index `index` (FX's `Node.insert_arg`); `index` may
    /// be `args.len()` to append. The node's new inputs gain it as a user (through the one
    /// use-def update routine, like every other edit).
    ///
    /// ```
    /// use ferrofx_fx::{Argument, Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let y = g.placeholder("y").unwrap();
    /// let add = g.call_function(Target::named("add"), vec![x.into()]).unwrap();
    /// g.insert_arg(add, 1, y.into()).unwrap();
    /// assert_eq!(g.node(add).unwrap().args(), &[Argument::Node(x), Argument::Node(y)]);
    /// assert_eq!(g.node(y).unwrap().users().collect::<Vec<_>>(), vec![add]);
    /// // FX: "insert_args index must be between 0 and len(self.args), got 3"
    /// assert!(g.insert_arg(add, 3, 1.into()).is_err());
    /// ```
    pub fn insert_arg(&mut self, id: NodeId, index: usize, arg: Argument) -> Result<()> {
        let idx = self.check(id)?;
        let len = self.args[idx as usize].len();
        if index > len {
            return Err(GraphError::InsertArgIndex { node: self.name_of(idx).to_string(), index, len });
        }
        let mut args = self.args[idx as usize].to_vec();
        args.insert(index, arg);
        self.set_args(id, args)
    }

    /// Sets keyword arg `key` (FX's `update_kwarg`; adds the key when missing).
    pub fn update_kwarg(&mut self, id: NodeId, key: &str, arg: Argument) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), std::slice::from_ref(&arg), None)?;
        self.kwargs[idx as usize].get_or_insert_with(Default::default).insert(key.to_string(), arg);
        self.apply_args_kwargs(idx, None, None);
        Ok(())
    }

    /// Replaces every occurrence of input `old` by `new` in the args and kwargs of `id`
    /// (FX's `replace_input_with`). `old` must be an input of `id`.
    pub fn replace_input_with(&mut self, id: NodeId, old: NodeId, new: NodeId) -> Result<()> {
        let idx = self.check(id)?;
        self.check(old)?;
        let new_idx = self.check(new)?;
        if !self.inputs[idx as usize].contains(old.index) {
            return Err(GraphError::NotAnInput { node: self.name_of(idx).to_string(), old: self.name_or_unknown(old) });
        }
        self.check_no_cycle(idx, new_idx)?;
        self.replace_input_unchecked(idx, old, new);
        Ok(())
    }

    /// Rewrites the stored arguments of slot `idx` in place, then re-derives the edges.
    fn replace_input_unchecked(&mut self, idx: u32, old: NodeId, new: NodeId) {
        let i = idx as usize;
        // Common case: plain node/scalar args, no kwargs, `new` not yet an input. Then the
        // derived input set is the old one with `old` replaced by `new` in place, and the edit
        // is what `apply_args_kwargs` would do, without re-deriving: `old` loses this user,
        // `new` gains it at the end, and every other input sees it moved to the end of its
        // users (the same removals and pushes on each user list, so the same lists).
        let plain = self.kwargs[i].is_none()
            && !self.inputs[i].contains(new.index)
            && self.args[i]
                .iter()
                .all(|a| !matches!(a, Argument::List(_) | Argument::Tuple(_) | Argument::Dict(_) | Argument::Slice(_)));
        if plain {
            for a in self.args[i].iter_mut() {
                if let Argument::Node(n) = a {
                    if *n == old {
                        *n = new;
                    }
                }
            }
            // Taken out while the user lists change, as in `apply_args_kwargs` (an edit in
            // place measured slower here).
            let mut set = std::mem::take(&mut self.inputs[i]);
            let my_seq = self.links[i].seq;
            for e in set.entries.iter_mut() {
                let n = e.node;
                let nu = n as usize;
                if n == old.index {
                    self.remove_user_at(n, e.pos);
                    e.node = new.index;
                    let ni = new.index as usize;
                    e.pos = self.users[ni].entries.len() as u32;
                    self.users[ni].entries.push(idx);
                    self.nusers[ni] += 1;
                    // The other inputs were inputs before: only the new edge can break the
                    // order (`unordered` is never cleared here).
                    self.unordered |= self.links[ni].seq >= my_seq;
                } else if e.pos as usize + 1 != self.users[nu].entries.len() {
                    self.remove_user_at(n, e.pos);
                    e.pos = self.users[nu].entries.len() as u32;
                    self.users[nu].entries.push(idx);
                    self.nusers[nu] += 1;
                }
            }
            self.inputs[i] = set;
            return;
        }
        for a in self.args[idx as usize].iter_mut() {
            a.replace_node(old, new);
        }
        if let Some(k) = &mut self.kwargs[idx as usize] {
            for a in k.values_mut() {
                a.replace_node(old, new);
            }
        }
        self.apply_args_kwargs(idx, None, None);
    }

    /// Makes every user of `id` use `replacement` instead; returns the changed users in the
    /// order they were processed (FX's `replace_all_uses_with`).
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let relu = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// let out = g.output(relu.into()).unwrap();
    /// let gelu = {
    ///     let mut g = g.inserting_after(Some(relu)).unwrap();
    ///     g.call_function(Target::named("gelu"), vec![x.into()]).unwrap()
    /// };
    /// assert_eq!(g.replace_all_uses_with(relu, gelu).unwrap(), vec![out]);
    /// g.erase_node(relu).unwrap();
    /// g.lint().unwrap();
    /// ```
    pub fn replace_all_uses_with(&mut self, id: NodeId, replacement: NodeId) -> Result<Vec<NodeId>> {
        self.replace_all_uses_with_where(id, replacement, |_| true, false)
    }

    /// [`Graph::replace_all_uses_with`] with FX's options: only users for which `filter`
    /// returns `true` are changed (FX's `delete_user_cb`), and with `propagate_meta` the
    /// replacement receives this node's meta (it must have none). The edit is atomic: it is
    /// validated (no node may come to use itself) before anything changes.
    pub fn replace_all_uses_with_where(
        &mut self,
        id: NodeId,
        replacement: NodeId,
        mut filter: impl FnMut(&Node<'_>) -> bool,
        propagate_meta: bool,
    ) -> Result<Vec<NodeId>> {
        let idx = self.check(id)?;
        let rep = self.check(replacement)?;
        let selected: Vec<NodeId> =
            self.users[idx as usize].iter().filter(|&u| filter(&self.live(u))).map(|u| self.id_of(u)).collect();
        if propagate_meta && idx != rep && !self.live(rep).meta().is_empty() {
            return Err(GraphError::MetaNotEmpty {
                from: self.name_of(idx).to_string(),
                to: self.name_of(rep).to_string(),
            });
        }
        if idx == rep {
            return Ok(selected);
        }
        for u in &selected {
            self.check_no_cycle(u.index, rep)?;
        }
        if propagate_meta {
            let meta = self.cold[idx as usize].as_ref().map(|c| c.meta.clone()).unwrap_or_default();
            self.cold[rep as usize].get_or_insert_with(Default::default).meta = meta;
        }
        for u in &selected {
            self.replace_input_unchecked(u.index, id, replacement);
        }
        Ok(selected)
    }
}
