//! FX's textual forms: `print(graph)`, `Node.format_node`, `Graph.print_tabular`, and the
//! Python `str`/`repr` renderings of arguments they rely on.

use crate::graph::argument::Argument;
use crate::graph::error::Result;
use crate::graph::graph::Graph;
use crate::graph::node_id::NodeId;
use crate::graph::target::Opcode;
use std::fmt::{self, Write};

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside [1e-4, 1e16).
pub(crate) fn py_float(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("nan");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
    } else if v == 0.0 || (1e-4..1e16).contains(&v.abs()) {
        let start = out.len();
        let _ = write!(out, "{v}");
        if !out[start..].contains('.') {
            out.push_str(".0");
        }
    } else {
        let s = format!("{v:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let _ = write!(out, "{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// Python's `repr(str)`.
pub(crate) fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `repr` of an argument, node references rendered by `node`.
pub(crate) fn py_repr(arg: &Argument, node: &dyn Fn(NodeId, &mut String), out: &mut String) {
    match arg {
        Argument::None => out.push_str("None"),
        Argument::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Argument::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Argument::Float(f) => py_float(*f, out),
        Argument::Str(s) => py_str_repr(s, out),
        Argument::DType(d) => {
            let _ = write!(out, "torch.{}", d.name());
        }
        Argument::Device(d) => {
            out.push_str("device(type=");
            py_str_repr(&d.kind, out);
            if let Some(i) = d.index {
                let _ = write!(out, ", index={i}");
            }
            out.push(')');
        }
        Argument::Slice(s) => {
            out.push_str("slice(");
            py_repr(&s.start, node, out);
            out.push_str(", ");
            py_repr(&s.stop, node, out);
            out.push_str(", ");
            py_repr(&s.step, node, out);
            out.push(')');
        }
        Argument::Ellipsis => out.push_str("Ellipsis"),
        Argument::Node(n) => node(*n, out),
        Argument::List(items) => {
            out.push('[');
            seq_repr(items, node, out);
            out.push(']');
        }
        Argument::Tuple(items) => {
            out.push('(');
            seq_repr(items, node, out);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Argument::Dict(d) => {
            out.push('{');
            for (i, (k, v)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str_repr(k, out);
                out.push_str(": ");
                py_repr(v, node, out);
            }
            out.push('}');
        }
    }
}

fn seq_repr(items: &[Argument], node: &dyn Fn(NodeId, &mut String), out: &mut String) {
    for (i, a) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        py_repr(a, node, out);
    }
}

/// Python's `str` of an argument: like `repr` except that a top-level string is bare and a
/// device prints as `cpu`.
pub(crate) fn py_str(arg: &Argument, node: &dyn Fn(NodeId, &mut String), out: &mut String) {
    match arg {
        Argument::Str(s) => out.push_str(s),
        Argument::Device(d) => {
            let _ = write!(out, "{d}");
        }
        a => py_repr(a, node, out),
    }
}

/// FX's `_format_arg`: containers recurse, nodes print as `%name`, other leaves use `str`.
pub(crate) fn fx_format_arg(g: &Graph, arg: &Argument, out: &mut String) {
    match arg {
        Argument::List(items) => {
            out.push('[');
            fx_format_seq(g, items, out);
            out.push(']');
        }
        Argument::Tuple(items) => {
            out.push('(');
            fx_format_seq(g, items, out);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Argument::Dict(d) => {
            out.push('{');
            for (i, (k, v)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                fx_format_arg(g, v, out);
            }
            out.push('}');
        }
        Argument::Node(n) => {
            out.push('%');
            g.write_name(*n, out);
        }
        a => py_str(a, &|n, o| g.write_name(n, o), out),
    }
}

fn fx_format_seq(g: &Graph, items: &[Argument], out: &mut String) {
    for (i, a) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        fx_format_arg(g, a, out);
    }
}

impl Graph {
    /// Writes a node's name (or `<erased ...>` for a stale handle).
    pub(crate) fn write_name(&self, id: NodeId, out: &mut String) {
        match self.node(id) {
            Ok(n) => out.push_str(n.name()),
            Err(_) => {
                let _ = write!(out, "<invalid {}>", self.name_or_unknown(id));
            }
        }
    }

    pub(crate) fn format_node_into(&self, id: NodeId, out: &mut String) -> Result<()> {
        let node = self.node(id)?;
        let name_fn = |n: NodeId, o: &mut String| self.write_name(n, o);
        if node.op() == Opcode::Output {
            out.push_str("return ");
            match node.args().first() {
                Some(a) => py_str(a, &name_fn, out),
                None => out.push_str("None"),
            }
            return Ok(());
        }
        out.push('%');
        out.push_str(node.name());
        out.push_str(" : ");
        if let Some(t) = node.type_expr() {
            out.push_str(t);
            out.push(' ');
        }
        let _ =
            write!(out, "[num_users={}] = {}[target={}]", node.num_users(), node.op().as_str(), node.target().name());
        match node.op() {
            Opcode::Placeholder => {
                if let Some(default) = node.args().first() {
                    out.push_str("(default=");
                    py_str(default, &name_fn, out);
                    out.push(')');
                }
            }
            Opcode::GetAttr => {}
            _ => {
                out.push_str("(args = (");
                fx_format_seq(self, node.args(), out);
                if node.args().len() == 1 {
                    out.push(',');
                }
                out.push_str("), kwargs = {");
                for (i, (k, v)) in node.kwargs().iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(k);
                    out.push_str(": ");
                    fx_format_arg(self, v, out);
                }
                out.push_str("})");
            }
        }
        Ok(())
    }

    /// FX's `Node.format_node`: one line of the graph print.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Kwargs, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let mut kw = Kwargs::new();
    /// kw.insert("inplace".into(), false.into());
    /// let r = g.call_function_with(Target::named("relu"), vec![x.into()], kw).unwrap();
    /// assert_eq!(g.format_node(x).unwrap(), "%x : [num_users=1] = placeholder[target=x]");
    /// assert_eq!(
    ///     g.format_node(r).unwrap(),
    ///     "%relu : [num_users=0] = call_function[target=relu](args = (%x,), kwargs = {inplace: False})"
    /// );
    /// ```
    pub fn format_node(&self, id: NodeId) -> Result<String> {
        let mut s = String::new();
        self.format_node_into(id, &mut s)?;
        Ok(s)
    }

    /// FX's `print_tabular` as a string: an aligned table of opcode, name, target, args and
    /// kwargs (tabulate's "simple" format).
    ///
    /// ```
    /// use ferrofx_fx::{Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
    /// g.output(r.into()).unwrap();
    /// assert_eq!(
    ///     g.tabular(),
    ///     "opcode         name    target    args     kwargs\n\
    ///      -------------  ------  --------  -------  --------\n\
    ///      placeholder    x       x         ()       {}\n\
    ///      call_function  relu    relu      (x,)     {}\n\
    ///      output         output  output    (relu,)  {}\n"
    /// );
    /// ```
    pub fn tabular(&self) -> String {
        let name_fn = |n: NodeId, o: &mut String| self.write_name(n, o);
        let mut rows: Vec<[String; 5]> = vec![["opcode", "name", "target", "args", "kwargs"].map(String::from)];
        for n in self.iter() {
            let mut args = String::new();
            py_repr(&Argument::Tuple(n.args().to_vec()), &name_fn, &mut args);
            let mut kwargs = String::new();
            py_repr(&Argument::Dict(Box::new(n.kwargs().clone())), &name_fn, &mut kwargs);
            rows.push([n.op().as_str().to_string(), n.name().to_string(), n.target().name().to_string(), args, kwargs]);
        }
        // tabulate's "simple" format: a column is as wide as its widest cell and at least its
        // header plus 2.
        let mut widths = rows[0].clone().map(|h| h.chars().count() + 2);
        for r in &rows[1..] {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String; 5], out: &mut String| {
            let mut l = String::new();
            for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
                if i > 0 {
                    l.push_str("  ");
                }
                let _ = write!(l, "{c:<w$}");
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(&rows[0], &mut out);
        line(&widths.map(|w| "-".repeat(w)), &mut out);
        for r in &rows[1..] {
            line(r, &mut out);
        }
        out
    }

    /// Prints [`Graph::tabular`] to stdout.
    pub fn print_tabular(&self) {
        print!("{}", self.tabular());
    }
}

impl fmt::Display for Graph {
    /// FX's `print(graph)`: `graph():` then one indented `format_node` line per node.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::with_capacity(16 + 64 * self.len());
        s.push_str("graph():");
        for id in self.nodes() {
            s.push_str("\n    ");
            // Live handles from the iterator cannot fail.
            let _ = self.format_node_into(id, &mut s);
        }
        f.write_str(&s)
    }
}
