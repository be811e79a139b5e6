//! Common subexpression elimination: a pure call repeated with the same arguments is computed
//! once.
//!
//! Candidates are `call_function` of pure registry ops (not in-place, not random), `call_method`
//! named like a pure registry op, and repeated `get_attr` of the same path. Module calls are
//! never merged (a module may hold state). Two nodes are the same when opcode, target, positional
//! and keyword arguments are equal after earlier merges; floats compare by bits, so `nan`
//! literals merge and `0.0` / `-0.0` do not.
//!
//! ```
//! use ferrofx_fx::passes::eliminate_common_subexpressions;
//! use ferrofx_fx::{Graph, Target};
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let a = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! let b = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! let s = g.call_function(Target::named("add"), vec![a.into(), b.into()]).unwrap();
//! g.output(s.into()).unwrap();
//! assert_eq!(eliminate_common_subexpressions(&mut g).unwrap(), 1);
//! assert_eq!(g.len(), 4);
//! ```

use crate::core_api;
use crate::graph::{Argument, Graph, NodeId, Opcode, Result, Target};
use std::collections::HashMap;
use std::fmt::Write;

fn key_arg(a: &Argument, out: &mut String) {
    match a {
        Argument::Float(f) => {
            let _ = write!(out, "f{:x}", f.to_bits());
        }
        Argument::List(items) | Argument::Tuple(items) => {
            out.push(if matches!(a, Argument::List(_)) { '[' } else { '(' });
            for i in items.iter() {
                key_arg(i, out);
                out.push(',');
            }
            out.push(')');
        }
        Argument::Dict(d) => {
            out.push('{');
            for (k, v) in d.iter() {
                let _ = write!(out, "{k:?}:");
                key_arg(v, out);
                out.push(',');
            }
            out.push('}');
        }
        Argument::Slice(s) => {
            out.push_str("slice(");
            key_arg(&s.start, out);
            key_arg(&s.stop, out);
            key_arg(&s.step, out);
            out.push(')');
        }
        other => {
            let _ = write!(out, "{other:?}");
        }
    }
}

fn mergeable(op: Opcode, target: &Target) -> bool {
    match (op, target) {
        (Opcode::CallFunction, Target::Op(def)) => def.is_pure(),
        (Opcode::CallMethod, Target::Str(m)) => core_api::lookup(m).is_some_and(|d| d.is_pure()),
        (Opcode::GetAttr, _) => true,
        _ => false,
    }
}

/// Merges repeated pure computations; returns how many nodes were removed. The graph stays
/// lint-clean.
pub fn eliminate_common_subexpressions(g: &mut Graph) -> Result<usize> {
    let mut seen: HashMap<String, NodeId> = HashMap::new();
    let mut dups: Vec<(NodeId, NodeId)> = vec![];
    let mut replaced: HashMap<NodeId, NodeId> = HashMap::new();
    for n in g.iter() {
        if !mergeable(n.op(), n.target()) {
            continue;
        }
        let mut key = format!("{}|{}|", n.op().as_str(), n.target().name());
        let map = |id: NodeId| Argument::Node(replaced.get(&id).copied().unwrap_or(id));
        for a in n.args() {
            key_arg(&a.map_nodes(&mut { map }), &mut key);
            key.push(';');
        }
        key.push('|');
        for (k, v) in n.kwargs() {
            let _ = write!(key, "{k}=");
            key_arg(&v.map_nodes(&mut { map }), &mut key);
            key.push(';');
        }
        match seen.get(&key) {
            Some(&first) => {
                dups.push((n.id(), first));
                replaced.insert(n.id(), first);
            }
            None => {
                seen.insert(key, n.id());
            }
        }
    }
    for &(dup, first) in &dups {
        g.replace_all_uses_with(dup, first)?;
    }
    for &(dup, _) in dups.iter().rev() {
        g.erase_node(dup)?;
    }
    Ok(dups.len())
}
