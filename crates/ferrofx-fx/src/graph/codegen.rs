//! Readable code generation (FX's `python_code`): the graph as a Python-like `forward` with
//! every value dropped (`x = None`) right after its last use.

use crate::graph::argument::Argument;
use crate::graph::display::py_repr;
use crate::graph::graph::Graph;
use crate::graph::node_id::NodeId;
use crate::graph::target::{Opcode, Target};
use smallvec::SmallVec;
use std::fmt::Write;

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// FX's `_format_target`: `self.a.b`, with `getattr(x, "0")` for non-identifier parts.
fn format_target(base: &str, path: &str, out: &mut String) {
    let mut expr = base.to_string();
    for part in path.split('.') {
        if is_identifier(part) {
            expr.push('.');
            expr.push_str(part);
        } else {
            expr = format!("getattr({expr}, \"{part}\")");
        }
    }
    out.push_str(&expr);
}

impl Graph {
    fn write_call_args(&self, args: &[Argument], kwargs: &crate::Kwargs, out: &mut String) {
        let name_fn = |n: NodeId, o: &mut String| self.write_name(n, o);
        let mut first = true;
        for a in args {
            if !first {
                out.push_str(", ");
            }
            first = false;
            py_repr(a, &name_fn, out);
        }
        for (k, v) in kwargs {
            if !first {
                out.push_str(", ");
            }
            first = false;
            out.push_str(k);
            out.push_str(" = ");
            py_repr(v, &name_fn, out);
        }
    }

    /// The graph as readable source, like FX's `graph.python_code("self").src`:
    ///
    /// ```
    /// use ferrofx_fx::{Argument, Graph, Target};
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// let y = g.placeholder("y").unwrap();
    /// let add = g.call_function(Target::function("my_add"), vec![x.into(), y.into()]).unwrap();
    /// let shape = Argument::tuple([2.into(), 3.into()]);
    /// let r = g.call_function(Target::op("reshape").unwrap(), vec![add.into(), shape]).unwrap();
    /// let m = g.call_method("sum", vec![x.into()]).unwrap();
    /// g.output(Argument::tuple([r.into(), m.into()])).unwrap();
    /// assert_eq!(
    ///     g.python_code(),
    ///     "def forward(self, x, y):\n    \
    ///      my_add = my_add(x, y);  y = None\n    \
    ///      reshape = ops.reshape(my_add, (2, 3));  my_add = None\n    \
    ///      sum_1 = x.sum();  x = None\n    \
    ///      return (reshape, sum_1)\n"
    /// );
    /// ```
    ///
    /// Registry ops print as `ops.<name>(...)`, user functions by name, methods as
    /// `a.method(...)`, modules and attributes as `self.<path>`. After each statement, the values
    /// whose last use it was are set to `None` (values never used are dropped right away).
    pub fn python_code(&self) -> String {
        let name_fn = |n: NodeId, o: &mut String| self.write_name(n, o);
        // Last uses: walking backwards, the first time a value is seen is its last use.
        let mut seen = vec![false; self.links.len()];
        let mut frees: Vec<SmallVec<[u32; 2]>> = vec![SmallVec::new(); self.links.len()];
        for id in self.nodes().rev() {
            let node = self.live(id.index);
            node.visit_input_refs(&mut |n| {
                let i = n.index as usize;
                if !seen[i] {
                    seen[i] = true;
                    frees[id.index as usize].push(n.index);
                }
            });
        }
        let mut params: Vec<String> = Vec::new();
        let mut body = String::with_capacity(48 * self.len());
        for id in self.nodes() {
            let node = self.live(id.index);
            let name = node.name.as_str();
            let annot = |out: &mut String| {
                if let Some(t) = &node.type_expr {
                    out.push_str(" : ");
                    out.push_str(t);
                }
            };
            let start = body.len();
            match node.op {
                Opcode::Placeholder => {
                    let target = node.target.name();
                    let mut p = target.to_string();
                    annot(&mut p);
                    if let Some(default) = node.args.first() {
                        p.push_str(" = ");
                        py_repr(default, &name_fn, &mut p);
                    }
                    params.push(p);
                    if target != name {
                        let _ = writeln!(body, "    {name} = {target}");
                    }
                    continue;
                }
                Opcode::Output => {
                    body.push_str("    return ");
                    match node.args.first() {
                        Some(a) => py_repr(a, &name_fn, &mut body),
                        None => body.push_str("None"),
                    }
                    body.push('\n');
                    continue;
                }
                Opcode::GetAttr => {
                    body.push_str("    ");
                    body.push_str(name);
                    annot(&mut body);
                    body.push_str(" = ");
                    format_target("self", node.target.name(), &mut body);
                }
                Opcode::CallFunction | Opcode::CallMethod | Opcode::CallModule => {
                    body.push_str("    ");
                    body.push_str(name);
                    annot(&mut body);
                    body.push_str(" = ");
                    match node.op {
                        Opcode::CallMethod => {
                            match node.args.first() {
                                Some(a) => py_repr(a, &name_fn, &mut body),
                                None => body.push_str("None"),
                            }
                            body.push('.');
                            body.push_str(node.target.name());
                            body.push('(');
                            self.write_call_args(node.args.get(1..).unwrap_or(&[]), &node.kwargs, &mut body);
                        }
                        Opcode::CallModule => {
                            format_target("self", node.target.name(), &mut body);
                            body.push('(');
                            self.write_call_args(&node.args, &node.kwargs, &mut body);
                        }
                        _ => {
                            match &node.target {
                                Target::Op(def) => {
                                    body.push_str("ops.");
                                    body.push_str(def.name);
                                }
                                t => body.push_str(t.name()),
                            }
                            body.push('(');
                            self.write_call_args(&node.args, &node.kwargs, &mut body);
                        }
                    }
                    body.push(')');
                }
            }
            debug_assert!(body.len() > start);
            // Drop values after their last use; a value nobody uses is dropped at once.
            let to_free = &frees[id.index as usize];
            let unused = node.users.is_empty();
            if !to_free.is_empty() || unused {
                body.push_str(";  ");
                for &f in to_free {
                    body.push_str(&self.live(f).name);
                    body.push_str(" = ");
                }
                if unused {
                    body.push_str(name);
                    body.push_str(" = ");
                }
                body.push_str("None");
            }
            body.push('\n');
        }
        let mut src = String::with_capacity(body.len() + 64);
        src.push_str("def forward(self");
        for p in &params {
            src.push_str(", ");
            src.push_str(p);
        }
        src.push_str("):\n");
        if body.is_empty() {
            body.push_str("    pass\n");
        }
        src.push_str(&body);
        src
    }
}
