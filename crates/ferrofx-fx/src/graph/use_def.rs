//! Use-def tracking (seed 000 §6). [`Graph::apply_args_kwargs`] is the ONE routine that edits
//! `users` and `input_nodes`; node creation, every args/kwargs edit, input replacement and
//! erasure go through it.

use crate::graph::argument::{Argument, Kwargs};
use crate::graph::error::{GraphError, Result};
use crate::graph::graph::Graph;
use crate::graph::hash::FxHashMap;
use crate::graph::node::Node;
use crate::graph::node_id::NodeId;

impl Graph {
    /// THE use-def routine (FX's `_update_args_kwargs`). Callers validated every node in the
    /// new args/kwargs (live, same graph, acyclic).
    ///
    /// Step 1: remove this node from the `users` of each old input and clear `input_nodes`.
    /// Step 2: walk the new args then kwargs; each node met is added (once, in first-appearance
    /// order) to `input_nodes`, and this node to that node's `users`.
    /// `None` keeps the current args (or kwargs).
    pub(crate) fn apply_args_kwargs(&mut self, idx: u32, args: Option<Vec<Argument>>, kwargs: Option<Kwargs>) {
        let node = self.live_mut(idx);
        let me = node.id;
        let mut inputs = std::mem::take(&mut node.input_nodes);
        if let Some(a) = args {
            node.args = a;
        }
        if let Some(k) = kwargs {
            node.kwargs = k;
        }
        // Step 1.
        for old in inputs.iter() {
            self.live_mut(old.index).users.remove(me);
        }
        inputs.clear();
        // Step 2.
        let node = self.live(idx);
        node.visit_input_refs(&mut |n| {
            inputs.insert(n);
        });
        let my_seq = self.seq_of(idx);
        for n in inputs.iter() {
            self.unordered |= self.seq_of(n.index) >= my_seq;
            self.live_mut(n.index).users.insert(me);
        }
        self.live_mut(idx).input_nodes = inputs;
    }

    /// Err if making slot `input` an input of slot `user` would create a cycle (including
    /// `user == input`). While the order is topological, only an input that comes after the
    /// user can close a cycle, so the search is bounded to nodes after the user; once an edit
    /// broke the order ([`Graph::unordered`]) the search is unbounded until the next sort.
    pub(crate) fn check_no_cycle(&self, user: u32, input: u32) -> Result<()> {
        if user == input {
            let name = self.live(user).name.clone();
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
            for n in self.live(cur).input_nodes.iter() {
                if n.index == user {
                    // Path: user -> input -> ... -> cur -> user (as "depends on").
                    let mut path = vec![self.live(user).name.clone()];
                    let mut chain = vec![cur];
                    let mut c = cur;
                    while c != input {
                        c = parent[&c];
                        chain.push(c);
                    }
                    path.extend(chain.iter().rev().map(|&i| self.live(i).name.clone()));
                    path.push(self.live(user).name.clone());
                    return Err(GraphError::Cycle { node: self.live(user).name.clone(), path });
                }
                if (!prune || self.seq_of(n.index) > user_seq) && !parent.contains_key(&n.index) {
                    parent.insert(n.index, cur);
                    stack.push(n.index);
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
        self.validate_inputs(Some(idx), &args, &Kwargs::new())?;
        self.apply_args_kwargs(idx, Some(args), None);
        Ok(())
    }

    /// Sets keyword args (FX's `node.kwargs = ...`).
    pub fn set_kwargs(&mut self, id: NodeId, kwargs: Kwargs) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), &[], &kwargs)?;
        self.apply_args_kwargs(idx, None, Some(kwargs));
        Ok(())
    }

    /// Sets both args and kwargs at once.
    pub fn set_args_kwargs(&mut self, id: NodeId, args: Vec<Argument>, kwargs: Kwargs) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), &args, &kwargs)?;
        self.apply_args_kwargs(idx, Some(args), Some(kwargs));
        Ok(())
    }

    /// Replaces positional arg `index` (FX's `update_arg`).
    pub fn update_arg(&mut self, id: NodeId, index: usize, arg: Argument) -> Result<()> {
        let idx = self.check(id)?;
        let node = self.live(idx);
        if index >= node.args.len() {
            return Err(GraphError::ArgIndex { node: node.name.clone(), index, len: node.args.len() });
        }
        self.validate_inputs(Some(idx), std::slice::from_ref(&arg), &Kwargs::new())?;
        let mut args = self.live(idx).args.clone();
        args[index] = arg;
        self.apply_args_kwargs(idx, Some(args), None);
        Ok(())
    }

    /// Sets keyword arg `key` (FX's `update_kwarg`; adds the key when missing).
    pub fn update_kwarg(&mut self, id: NodeId, key: &str, arg: Argument) -> Result<()> {
        let idx = self.check(id)?;
        self.validate_inputs(Some(idx), std::slice::from_ref(&arg), &Kwargs::new())?;
        let mut kwargs = self.live(idx).kwargs.clone();
        kwargs.insert(key.to_string(), arg);
        self.apply_args_kwargs(idx, None, Some(kwargs));
        Ok(())
    }

    /// Replaces every occurrence of input `old` by `new` in the args and kwargs of `id`
    /// (FX's `replace_input_with`). `old` must be an input of `id`.
    pub fn replace_input_with(&mut self, id: NodeId, old: NodeId, new: NodeId) -> Result<()> {
        let idx = self.check(id)?;
        self.check(old)?;
        let new_idx = self.check(new)?;
        if !self.live(idx).input_nodes.contains(old) {
            return Err(GraphError::NotAnInput { node: self.live(idx).name.clone(), old: self.name_or_unknown(old) });
        }
        self.check_no_cycle(idx, new_idx)?;
        self.replace_input_unchecked(idx, old, new);
        Ok(())
    }

    fn replace_input_unchecked(&mut self, idx: u32, old: NodeId, new: NodeId) {
        let node = self.live(idx);
        let mut args = node.args.clone();
        for a in &mut args {
            a.replace_node(old, new);
        }
        let kwargs = if node.kwargs.is_empty() {
            None
        } else {
            let mut k = node.kwargs.clone();
            for a in k.values_mut() {
                a.replace_node(old, new);
            }
            Some(k)
        };
        self.apply_args_kwargs(idx, Some(args), kwargs);
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
        mut filter: impl FnMut(&Node) -> bool,
        propagate_meta: bool,
    ) -> Result<Vec<NodeId>> {
        let idx = self.check(id)?;
        let rep = self.check(replacement)?;
        let selected: Vec<NodeId> = self.live(idx).users.iter().filter(|u| filter(self.live(u.index))).collect();
        if propagate_meta && idx != rep && !self.live(rep).meta().is_empty() {
            return Err(GraphError::MetaNotEmpty {
                from: self.live(idx).name.clone(),
                to: self.live(rep).name.clone(),
            });
        }
        if idx == rep {
            return Ok(selected);
        }
        for u in &selected {
            self.check_no_cycle(u.index, rep)?;
        }
        if propagate_meta {
            let meta = self.live(idx).meta.clone();
            self.live_mut(rep).meta = meta;
        }
        for u in &selected {
            self.replace_input_unchecked(u.index, id, replacement);
        }
        Ok(selected)
    }
}
