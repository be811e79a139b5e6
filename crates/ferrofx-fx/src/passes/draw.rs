//! Drawing graphs (FX's `FxGraphDrawer`): Graphviz DOT with a colour per opcode, the value's
//! shape and dtype on each edge (from `tensor_meta`), and one cluster per top-level module
//! (from `nn_module_stack`); SVG rendered in-process (no external `dot` program needed).
//!
//! ```
//! use ferrofx_fx::passes::draw::{to_dot, to_svg};
//! use ferrofx_fx::{Graph, Target};
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! g.output(r.into()).unwrap();
//! let dot = to_dot(&g, "net");
//! assert!(dot.starts_with("digraph net {"));
//! assert!(dot.contains("\"x\" -> \"relu\""));
//! assert!(to_svg(&g, "net").unwrap().contains("<svg"));
//! ```

use crate::graph::{Argument, Graph, GraphError, Node, Opcode, Result};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Fill colour per opcode (FX's drawer uses similar pastel kinds).
fn colour(op: Opcode) -> &'static str {
    match op {
        Opcode::Placeholder => "#cfe8fc",
        Opcode::GetAttr => "#e6e6e6",
        Opcode::CallFunction => "#d9f2d0",
        Opcode::CallMethod => "#fde2c8",
        Opcode::CallModule => "#fff6b3",
        Opcode::Output => "#f9c6c6",
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn arg_summary(a: &Argument) -> Option<String> {
    match a {
        Argument::Node(_) => None,
        Argument::Int(i) => Some(i.to_string()),
        Argument::Float(f) => Some(format!("{f}")),
        Argument::Bool(b) => Some(if *b { "True".into() } else { "False".into() }),
        Argument::Str(s) => Some(format!("'{s}'")),
        Argument::None => Some("None".into()),
        Argument::List(v) | Argument::Tuple(v) if v.iter().all(|x| matches!(x, Argument::Int(_))) => {
            Some(format!("[{}]", v.iter().filter_map(arg_summary).collect::<Vec<_>>().join(", ")))
        }
        _ => Some("…".into()),
    }
}

fn label(n: &Node<'_>) -> String {
    let mut s = format!("{}\\n{}", n.name(), n.op().as_str());
    if !matches!(n.op(), Opcode::Placeholder | Opcode::Output) {
        let _ = write!(s, "\\n{}", n.target().name());
    }
    let literals: Vec<String> = n.args().iter().filter_map(arg_summary).collect();
    if !literals.is_empty() {
        let _ = write!(s, "\\nargs: {}", literals.join(", "));
    }
    for (k, v) in n.kwargs() {
        if let Some(v) = arg_summary(v) {
            let _ = write!(s, "\\n{k}={v}");
        }
    }
    if let Some(m) = &n.meta().tensor_meta {
        let _ = write!(s, "\\n{:?} {}", m.shape, m.dtype.name());
    }
    esc(&s).replace("\\\\n", "\\n")
}

/// The graph in Graphviz DOT. Nodes are named by their (unique) graph names.
pub fn to_dot(g: &Graph, name: &str) -> String {
    let mut out = format!(
        "digraph {} {{\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"Helvetica\"];\n",
        sanitize(name)
    );
    let mut clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in g.iter() {
        let line = format!("\"{}\" [label=\"{}\", fillcolor=\"{}\"];", esc(n.name()), label(&n), colour(n.op()));
        match n.meta().nn_module_stack.first() {
            Some(top) if n.op() != Opcode::Output && n.op() != Opcode::Placeholder => {
                clusters.entry(top.path.clone()).or_default().push(line)
            }
            _ => {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    for (i, (path, lines)) in clusters.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_{i} {{\n    label=\"{}\";\n    style=dashed;", esc(path));
        for l in lines {
            let _ = writeln!(out, "    {l}");
        }
        out.push_str("  }\n");
    }
    for n in g.iter() {
        for input in n.all_input_nodes() {
            let Ok(src) = g.node(input) else { continue };
            let edge_label = src
                .meta()
                .tensor_meta
                .as_ref()
                .map(|m| format!(" [label=\"{:?} {}\"]", m.shape, m.dtype.name()))
                .unwrap_or_default();
            let _ = writeln!(out, "  \"{}\" -> \"{}\"{edge_label};", esc(src.name()), esc(n.name()));
        }
    }
    out.push_str("}\n");
    out
}

fn sanitize(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("g_{s}")
    } else {
        s
    }
}

/// The graph drawn as SVG (layered layout computed in-process by `layout-rs`; clusters are
/// drawn as their member nodes).
pub fn to_svg(g: &Graph, name: &str) -> Result<String> {
    let dot = to_dot(g, name);
    let mut parser = layout::gv::DotParser::new(&dot);
    let ast = parser.process().map_err(|e| GraphError::Draw(format!("cannot parse the DOT text: {e}")))?;
    let mut builder = layout::gv::GraphBuilder::new();
    builder.visit_graph(&ast);
    let mut vg = builder.get();
    let mut svg = layout::backends::svg::SVGWriter::new();
    vg.do_it(false, false, false, &mut svg);
    Ok(svg.finalize())
}
