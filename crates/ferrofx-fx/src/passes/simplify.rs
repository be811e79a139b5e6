//! Algebraic simplification: removes computations whose result is known without computing
//! them, only where that is safe.
//!
//! Rules (as `call_function` of the registry op or as the method of the same name):
//!
//! | pattern | becomes | condition |
//! | --- | --- | --- |
//! | `add(x, 0)`, `sub(x, 0)` | `x` | the literal is an int, or `x` is floating (`tensor_meta`) |
//! | `mul(x, 1)`, `pow(x, 1)` | `x` | as above |
//! | `div(x, 1)` | `x` | `x` is floating (`tensor_meta`): int / 1 is a float |
//! | `neg(neg(x))` | `x` | |
//! | `t(t(x))`, `transpose(transpose(x, a, b), a, b)` | `x` | also with `(b, a)` |
//! | `reshape(reshape(x, s1), s2)` (also `view`) | `reshape(x, s2)` | |
//! | `dropout(x, p, training=False)` | `x` | |
//!
//! A node is only replaced by `x` when no user writes into its result in place (that would
//! then write into `x`), and never when it is the graph's output value and `x` is an input (the
//! caller may rely on getting a fresh tensor).
//!
//! ```
//! use ferrofx_fx::passes::simplify;
//! use ferrofx_fx::{Argument, Graph, Target};
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let a = g.call_function(Target::named("add"), vec![x.into(), Argument::Int(0)]).unwrap();
//! let r = g.call_function(Target::named("relu"), vec![a.into()]).unwrap();
//! g.output(r.into()).unwrap();
//! assert_eq!(simplify(&mut g).unwrap(), 1);
//! assert_eq!(g.len(), 3);
//! ```

use crate::core_api::lookup;
use crate::graph::{Argument, Graph, Node, NodeId, Opcode, Result, Target};

/// The registry op name of a call (function or method), if any.
fn op_name<'g>(n: &Node<'g>) -> Option<&'g str> {
    match (n.op(), n.target()) {
        (Opcode::CallFunction, Target::Op(def)) => Some(def.name),
        (Opcode::CallMethod, Target::Str(m)) => Some(m.as_str()),
        _ => None,
    }
}

fn arg<'g>(n: &Node<'g>, i: usize, name: &str) -> Option<&'g Argument> {
    n.args().get(i).or_else(|| n.kwargs().get(name))
}

fn is_floating(g: &Graph, id: NodeId) -> bool {
    g.node(id).ok().and_then(|n| n.meta().tensor_meta.as_ref().map(|m| m.dtype.is_floating_point())).unwrap_or(false)
}

/// `x` is the identity element `v` of the op, in a way that cannot change the dtype.
fn is_identity(g: &Graph, x: NodeId, other: Option<&Argument>, v: i64, int_ok: bool) -> bool {
    match other {
        Some(Argument::Int(i)) => *i == v && (int_ok || is_floating(g, x)),
        Some(Argument::Float(f)) => *f == v as f64 && is_floating(g, x),
        Some(Argument::Bool(b)) => int_ok && i64::from(*b) == v && is_floating(g, x),
        _ => false,
    }
}

fn input(n: &Node<'_>) -> Option<NodeId> {
    n.args().first().and_then(Argument::as_node)
}

fn ints(a: Option<&Argument>) -> Option<Vec<i64>> {
    a?.as_int_list()
}

/// What a node simplifies to.
enum Rewrite {
    /// Use this value instead.
    Value(NodeId),
    /// Make the node read `x` instead of its first argument.
    Rebase(NodeId),
}

fn rule(g: &Graph, n: &Node<'_>) -> Option<Rewrite> {
    let name = op_name(n)?;
    let x = input(n)?;
    let inner = g.node(x).ok()?;
    let inner_name = op_name(&inner);
    match name {
        "add" | "sub" if is_identity(g, x, arg(n, 1, "other"), 0, true) => Some(Rewrite::Value(x)),
        "mul" if is_identity(g, x, arg(n, 1, "other"), 1, true) => Some(Rewrite::Value(x)),
        "pow" if is_identity(g, x, arg(n, 1, "exponent"), 1, true) => Some(Rewrite::Value(x)),
        "div" if is_identity(g, x, arg(n, 1, "other"), 1, false) && arg(n, 2, "rounding_mode").is_none() => {
            Some(Rewrite::Value(x))
        }
        "neg" if inner_name == Some("neg") => input(&inner).map(Rewrite::Value),
        "t" if inner_name == Some("t") => input(&inner).map(Rewrite::Value),
        "transpose" if inner_name == Some("transpose") => {
            let (a, b) = (ints(arg(n, 1, "dim0"))?, ints(arg(n, 2, "dim1"))?);
            let (c, d) = (ints(arg(&inner, 1, "dim0"))?, ints(arg(&inner, 2, "dim1"))?);
            // only non-negative dims are comparable without knowing the rank
            let nonneg = [&a, &b, &c, &d].iter().all(|v| v.iter().all(|&i| i >= 0));
            (nonneg && ((a == c && b == d) || (a == d && b == c))).then(|| input(&inner)).flatten().map(Rewrite::Value)
        }
        "reshape" | "view" if matches!(inner_name, Some("reshape") | Some("view")) => {
            input(&inner).map(Rewrite::Rebase)
        }
        "dropout" => match arg(n, 2, "training") {
            Some(Argument::Bool(false)) => Some(Rewrite::Value(x)),
            _ => None,
        },
        _ => None,
    }
}

/// Whether replacing `n` by `x` is safe: no user mutates `n`'s value, and an input is not
/// returned in place of a fresh output.
fn safe_to_forward(g: &Graph, n: NodeId, x: NodeId) -> bool {
    let Ok(node) = g.node(n) else { return false };
    let x_is_input = g.node(x).is_ok_and(|x| x.op() == Opcode::Placeholder);
    node.users().all(|u| {
        let Ok(u) = g.node(u) else { return false };
        if u.op() == Opcode::Output {
            return !x_is_input;
        }
        let mutates = match op_name(&u) {
            Some(name) => lookup(name)
                .and_then(|d| d.mutated_arg())
                .is_some_and(|i| u.args().get(i).and_then(Argument::as_node) == Some(n) || u.args().get(i).is_none()),
            None => u.op() == Opcode::CallModule, // a module might write into its input
        };
        !mutates
    })
}

/// Applies the rules until nothing changes; returns how many rewrites were made. Dead nodes
/// left behind are removed. Each sweep visits the nodes in order and applies a rule as soon as
/// it matches, so a chain folds in one sweep; sweeps repeat while they change something.
pub fn simplify(g: &mut Graph) -> Result<usize> {
    let mut total = 0;
    for _ in 0..64 {
        let ids: Vec<NodeId> = g.iter().map(|n| n.id()).collect();
        let mut applied = 0;
        for id in ids {
            if !g.contains(id) {
                continue;
            }
            let Some(r) = rule(g, &g.node(id)?) else { continue };
            match r {
                Rewrite::Value(x) if safe_to_forward(g, id, x) => {
                    // the rule says the node computes nothing (dropout in eval included, though
                    // its op counts as random for DCE): reroute its users and drop it
                    g.replace_all_uses_with(id, x)?;
                    g.erase_node(id)?;
                    applied += 1;
                }
                Rewrite::Rebase(x) if input(&g.node(id)?) != Some(x) => {
                    g.update_arg(id, 0, Argument::Node(x))?;
                    applied += 1;
                }
                _ => {}
            }
        }
        g.eliminate_dead_code(None)?;
        total += applied;
        if applied == 0 {
            break;
        }
    }
    Ok(total)
}
