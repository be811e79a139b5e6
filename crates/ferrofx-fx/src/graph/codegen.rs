//! Readable code generation (FX's `python_code`): the graph as a Python-like `forward` with
//! every value dropped (`x = None`) right after its last use.

use crate::graph::argument::Argument;
use crate::graph::display::py_repr;
use crate::graph::graph::Graph;
use crate::graph::hash::{FxHashMap, FxHashSet};
use crate::graph::namespace::is_identifier;
use crate::graph::node_id::NodeId;
use crate::graph::target::{Opcode, Target};
use smallvec::SmallVec;
use std::fmt::Write;

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
    fn write_call_args(
        &self,
        args: &[Argument],
        kwargs: &crate::Kwargs,
        name_fn: &dyn Fn(NodeId, &mut String),
        out: &mut String,
    ) {
        let mut first = true;
        for a in args {
            if !first {
                out.push_str(", ");
            }
            first = false;
            py_repr(a, name_fn, out);
        }
        for (k, v) in kwargs {
            if !first {
                out.push_str(", ");
            }
            first = false;
            out.push_str(k);
            out.push_str(" = ");
            py_repr(v, name_fn, out);
        }
    }

    /// Variables of the generated code that differ from the node name: a node named like a
    /// user function the graph calls (`my_add`, the default name of a call of `my_add`) would
    /// shadow the function, so its variable gets a fresh suffix (`my_add_1 = my_add(x, y)`),
    /// as FX does when a name collides with a global.
    fn codegen_renames(&self) -> FxHashMap<u32, String> {
        let mut functions: FxHashSet<&str> = FxHashSet::default();
        for n in self.iter() {
            if let (Opcode::CallFunction, Target::Function(f)) = (n.op(), n.target()) {
                functions.insert(f.name());
            }
        }
        // Only functions whose name some node took can collide (names are unique, so one node
        // each); filter the scan by name length before comparing strings.
        functions.retain(|f| self.namespace.is_used(f));
        let mut renamed = FxHashMap::default();
        if functions.is_empty() {
            return renamed;
        }
        let mut lengths = 0u64;
        for f in &functions {
            lengths |= 1 << f.len().min(63);
        }
        let mut taken: FxHashSet<String> = FxHashSet::default();
        for n in self.iter() {
            let name = n.name();
            if lengths & (1 << name.len().min(63)) == 0 || !functions.contains(name) {
                continue;
            }
            // Start after the namespace's counter for this base: usually the first try is free.
            for k in self.namespace.next_suffix(name).. {
                let candidate = format!("{name}_{k}");
                if !self.namespace.is_used(&candidate)
                    && !functions.contains(candidate.as_str())
                    && !taken.contains(&candidate)
                {
                    taken.insert(candidate.clone());
                    renamed.insert(n.idx, candidate);
                    break;
                }
            }
        }
        renamed
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
    ///      my_add_1 = my_add(x, y);  y = None\n    \
    ///      reshape = ops.reshape(my_add_1, (2, 3));  my_add_1 = None\n    \
    ///      sum_1 = x.sum();  x = None\n    \
    ///      return (reshape, sum_1)\n"
    /// );
    /// ```
    ///
    /// Registry ops print as `ops.<name>(...)`, user functions by name, methods as
    /// `a.method(...)`, modules and attributes as `self.<path>`. A user function's name is never
    /// given to a node (the namespace reserves it), so the code never shadows the function:
    /// `my_add_1 = my_add(x, y)`. After each statement, the values
    /// whose last use it was are set to `None` (values never used are dropped right away).
    pub fn python_code(&self) -> String {
        let renamed = self.codegen_renames();
        // Slot bitset of the renamed nodes: the common lookup is one bit test, not a hash.
        let mut is_renamed = vec![0u64; self.links.len().div_ceil(64)];
        for &i in renamed.keys() {
            is_renamed[i as usize / 64] |= 1 << (i % 64);
        }
        let var = |idx: u32| -> &str {
            if is_renamed[idx as usize / 64] & (1 << (idx % 64)) != 0 {
                if let Some(v) = renamed.get(&idx) {
                    return v;
                }
            }
            self.name_of(idx)
        };
        let name_fn = |n: NodeId, o: &mut String| match self.check(n) {
            Ok(i) => o.push_str(var(i)),
            Err(_) => self.write_name(n, o),
        };
        // Last uses: walking backwards, the first time a value is seen is its last use.
        let mut seen = vec![false; self.links.len()];
        let mut frees: Vec<SmallVec<[u32; 2]>> = vec![SmallVec::new(); self.links.len()];
        for node in self.iter().rev() {
            node.visit_input_refs(&mut |n| {
                let i = n.index as usize;
                if !seen[i] {
                    seen[i] = true;
                    frees[node.idx as usize].push(n.index);
                }
            });
        }
        let mut params: Vec<String> = Vec::new();
        let mut body = String::with_capacity(48 * self.len());
        for node in self.iter() {
            let name = var(node.idx);
            let annot = |out: &mut String| {
                if let Some(t) = node.type_expr() {
                    out.push_str(" : ");
                    out.push_str(t);
                }
            };
            let start = body.len();
            match node.op() {
                Opcode::Placeholder => {
                    let target = node.target().name();
                    let mut p = target.to_string();
                    annot(&mut p);
                    if let Some(default) = node.args().first() {
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
                    match node.args().first() {
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
                    format_target("self", node.target().name(), &mut body);
                }
                Opcode::CallFunction | Opcode::CallMethod | Opcode::CallModule => {
                    body.push_str("    ");
                    body.push_str(name);
                    annot(&mut body);
                    body.push_str(" = ");
                    match node.op() {
                        Opcode::CallMethod => {
                            match node.args().first() {
                                Some(a) => py_repr(a, &name_fn, &mut body),
                                None => body.push_str("None"),
                            }
                            body.push('.');
                            body.push_str(node.target().name());
                            body.push('(');
                            self.write_call_args(
                                node.args().get(1..).unwrap_or(&[]),
                                node.kwargs(),
                                &name_fn,
                                &mut body,
                            );
                        }
                        Opcode::CallModule => {
                            format_target("self", node.target().name(), &mut body);
                            body.push('(');
                            self.write_call_args(node.args(), node.kwargs(), &name_fn, &mut body);
                        }
                        _ => {
                            match node.target() {
                                Target::Op(def) => {
                                    body.push_str("ops.");
                                    body.push_str(def.name);
                                }
                                t => body.push_str(t.name()),
                            }
                            body.push('(');
                            self.write_call_args(node.args(), node.kwargs(), &name_fn, &mut body);
                        }
                    }
                    body.push(')');
                }
            }
            debug_assert!(body.len() > start);
            // Drop values after their last use; a value nobody uses is dropped at once.
            let to_free = &frees[node.idx as usize];
            let unused = node.num_users() == 0;
            if !to_free.is_empty() || unused {
                body.push_str(";  ");
                for &f in to_free {
                    body.push_str(var(f));
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
