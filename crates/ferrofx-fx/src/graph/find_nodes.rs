//! The `(op, target)` lookup table behind [`Graph::find_nodes`], maintained incrementally on
//! node creation, retargeting and erasure (FX's `_FindNodesLookupTable`).
//!
//! Each key has a bucket holding an intrusive doubly linked list threaded through per-slot
//! `prev`/`next` arrays: insertion (at the tail, so buckets keep creation order) and removal
//! are O(1) with no per-node allocation or hashing beyond finding the bucket.

use crate::graph::error::{GraphError, Result};
use crate::graph::graph::Graph;
use crate::graph::hash::FxHashMap;
use crate::graph::node_id::NodeId;
use crate::graph::target::{Opcode, Target};

const NIL: u32 = u32::MAX;

/// Lookup-table key of a node: the opcode, and for `call_function` the target's identity
/// (kind, address).
pub(crate) type LookupKey = (Opcode, u8, usize);

pub(crate) fn key(op: Opcode, target: &Target) -> LookupKey {
    match (op, target) {
        (Opcode::CallFunction, Target::Op(def)) => (op, 1, *def as *const _ as usize),
        (Opcode::CallFunction, Target::Function(f)) => (op, 2, *f as *const _ as usize),
        _ => (op, 0, 0),
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    head: u32,
    tail: u32,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    prev: u32,
    next: u32,
    bucket: u32,
}

/// Nodes grouped by opcode, and `call_function` nodes further by target identity.
#[derive(Debug, Default, Clone)]
pub(crate) struct FindNodesTable {
    bucket_of: FxHashMap<LookupKey, u32>,
    buckets: Vec<Bucket>,
    entries: Vec<Entry>,
    /// The buckets found last (consecutive creations usually share a few).
    recent: [Option<(LookupKey, u32)>; 4],
    next_recent: usize,
}

impl FindNodesTable {
    fn bucket(&mut self, k: LookupKey) -> u32 {
        for (lk, b) in self.recent.iter().flatten() {
            if *lk == k {
                return *b;
            }
        }
        let next = self.buckets.len() as u32;
        let b = *self.bucket_of.entry(k).or_insert(next);
        if b == next {
            self.buckets.push(Bucket { head: NIL, tail: NIL });
        }
        self.recent[self.next_recent % 4] = Some((k, b));
        self.next_recent = self.next_recent.wrapping_add(1);
        b
    }

    /// Room for slots `0..slots` without growing.
    pub(crate) fn reserve_slots(&mut self, slots: usize) {
        self.entries.reserve(slots.saturating_sub(self.entries.len()));
    }

    pub(crate) fn insert(&mut self, k: LookupKey, idx: u32) {
        let b = self.bucket(k);
        let i = idx as usize;
        if self.entries.len() <= i {
            self.entries.resize(i + 1, Entry { prev: NIL, next: NIL, bucket: NIL });
        }
        let tail = self.buckets[b as usize].tail;
        self.entries[i] = Entry { prev: tail, next: NIL, bucket: b };
        match tail {
            NIL => self.buckets[b as usize].head = idx,
            t => self.entries[t as usize].next = idx,
        }
        self.buckets[b as usize].tail = idx;
    }

    pub(crate) fn remove(&mut self, idx: u32) {
        let Some(&Entry { prev, next, bucket }) = self.entries.get(idx as usize) else { return };
        if bucket == NIL {
            return;
        }
        match prev {
            NIL => self.buckets[bucket as usize].head = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.buckets[bucket as usize].tail = prev,
            n => self.entries[n as usize].prev = prev,
        }
        self.entries[idx as usize] = Entry { prev: NIL, next: NIL, bucket: NIL };
    }

    /// The slots of a bucket, in insertion order.
    fn walk(&self, b: u32, out: &mut Vec<u32>) {
        let mut cur = self.buckets[b as usize].head;
        while cur != NIL {
            out.push(cur);
            cur = self.entries[cur as usize].next;
        }
    }

    /// The slots under key `k`, in insertion order.
    pub(crate) fn get(&self, k: LookupKey, out: &mut Vec<u32>) {
        if let Some(&b) = self.bucket_of.get(&k) {
            self.walk(b, out);
        }
    }
}

impl Graph {
    /// Nodes with opcode `op` (and, if given, target `target`), from the lookup table; in graph
    /// order when `sort`, else in creation order. `call_function` lookups by target are O(k)
    /// for k results (plus the sort).
    ///
    /// As FX's `find_nodes`, a `call_function` lookup needs a target
    /// ([`GraphError::FindNodesWithoutTarget`]); a target of the wrong kind for `op` (a string
    /// for `call_function`, a callable for the others) finds nothing.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Opcode, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let relu = Target::named("relu");
    /// let a = g.call_function(relu.clone(), vec![x.into()]).unwrap();
    /// let b = g.call_function(Target::named("neg"), vec![a.into()]).unwrap();
    /// let c = g.call_function(relu.clone(), vec![b.into()]).unwrap();
    /// assert_eq!(g.find_nodes(Opcode::CallFunction, Some(&relu), true).unwrap(), vec![a, c]);
    /// assert_eq!(g.find_nodes(Opcode::Placeholder, None, true).unwrap(), vec![x]);
    /// assert_eq!(g.find_nodes(Opcode::Placeholder, Some(&"y".into()), true).unwrap(), vec![]);
    /// // FX: AssertionError("target must not be None for call_function op")
    /// assert!(g.find_nodes(Opcode::CallFunction, None, true).is_err());
    /// ```
    pub fn find_nodes(&self, op: Opcode, target: Option<&Target>, sort: bool) -> Result<Vec<NodeId>> {
        let mut found: Vec<u32> = Vec::new();
        match (op, target) {
            (Opcode::CallFunction, Some(t)) => self.lookup.get(key(op, t), &mut found),
            (Opcode::CallFunction, None) => return Err(GraphError::FindNodesWithoutTarget),
            (op, t) => {
                self.lookup.get(key(op, &Target::Str(String::new())), &mut found);
                if let Some(t) = t {
                    found.retain(|&i| self.targets[i as usize] == *t);
                }
            }
        }
        if sort {
            found.sort_unstable_by_key(|&i| self.seq_of(i));
        }
        Ok(found.into_iter().map(|i| self.id_of(i)).collect())
    }
}
