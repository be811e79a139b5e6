//! Graphviz export of the autograd graph, in the style of torchviz's `make_dot`: output
//! tensors in green, backward nodes in grey, leaves (`AccumulateGrad`) in blue with their shape.

use super::node::NodeRef;
use crate::tensor::Tensor;
use std::collections::HashSet;
use std::fmt::Write;
use std::sync::Arc;

fn id(n: &NodeRef) -> usize {
    Arc::as_ptr(n) as *const () as usize
}

fn shape_str(s: &[usize]) -> String {
    let inner: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("({})", inner.join(", "))
}

/// The autograd graph behind `roots` as a DOT digraph (iterative walk; each node once).
///
/// ```
/// use ferrofx_core::{autograd, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
/// let y = x.unsqueeze(0).unwrap();
/// let dot = autograd::to_dot(&[&y]);
/// assert!(dot.starts_with("digraph {"));
/// assert!(dot.contains("UnsqueezeBackward0") && dot.contains("AccumulateGrad"));
/// ```
pub fn to_dot(roots: &[&Tensor]) -> String {
    let mut out = String::from("digraph {\n  graph [size=\"12,12\"]\n  node [align=left fontname=monospace fontsize=10 height=0.2 ranksep=0.1 shape=box style=filled]\n");
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<NodeRef> = Vec::new();
    for (i, r) in roots.iter().enumerate() {
        let tid = format!("out{i}");
        let _ = writeln!(out, "  {tid} [label=\"output {i}\\n{}\" fillcolor=darkolivegreen1]", shape_str(r.shape()));
        if let Some(gf) = r.grad_fn() {
            let _ = writeln!(out, "  n{} -> {tid}", id(&gf));
            stack.push(gf);
        } else if r.requires_grad() {
            let _ = writeln!(out, "  {tid} [fillcolor=lightblue]");
        }
    }
    while let Some(n) = stack.pop() {
        if !seen.insert(id(&n)) {
            continue;
        }
        match n.as_accumulate_grad() {
            Some(acc) => {
                let _ = writeln!(
                    out,
                    "  n{} [label=\"AccumulateGrad\\n{}\" fillcolor=lightblue]",
                    id(&n),
                    shape_str(acc.variable().shape())
                );
            }
            None => {
                let _ = writeln!(out, "  n{} [label=\"{}\" fillcolor=lightgrey]", id(&n), n.name());
            }
        }
        for e in n.next_edges() {
            if let Some(f) = &e.function {
                let _ = writeln!(out, "  n{} -> n{}", id(f), id(&n));
                if !seen.contains(&id(f)) {
                    stack.push(f.clone());
                }
            }
        }
    }
    out.push_str("}\n");
    out
}
