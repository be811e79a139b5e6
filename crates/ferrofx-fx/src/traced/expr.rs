//! [`InternalGraph`]: MegEngine's expression view of a [`GraphModule`]'s graph.
//!
//! The mapping from the graph's opcodes (seed 000) to the seed's expressions (seed 001):
//!
//! | graph node | expression |
//! | --- | --- |
//! | (the module itself) | `Input` producing the `self` [`ModuleNode`] (expr `%0`) |
//! | `placeholder` | `Input` producing a [`TensorNode`] |
//! | `get_attr` of a parameter / buffer | `GetAttr`: `param = getattr(self, "param") -> (Tensor)` |
//! | `get_attr` of a traced constant | `Constant`: `const_tensor = Constant(Tensor) -> (Tensor)` |
//! | `call_module` | a `GetAttr` producing the module's [`ModuleNode`] (once per module, before its first call), then `CallMethod` `__call__` on it: `linear_out = linear(x, )` |
//! | `call_method` | `CallMethod` on its first input: `y = x.reshape(2, 3, )` |
//! | `call_function` of an operator op (`add`, `mul`, ...) with a tensor first | `CallMethod` of the Python operator: `add_out = x.__add__(y, )` |
//! | other `call_function` | `CallFunction`: `relu_out = F.relu(x, )` |
//! | `output` | the graph's `outputs` (`return linear_out`) |
//!
//! Expression ids are the positions in that order (`%0` is `self`, then the inputs, then the
//! body), so the same graph always gets the same ids, also after a save and load; an edit of
//! the graph renumbers the expressions after the edit point.

use crate::graph::{Argument, NodeId, Opcode, Target};
use crate::graph_module::GraphModule;
use ferrofx_core::DType;
use ferrofx_nn::Module;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// The five expression kinds of seed 001.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExprKind {
    /// A graph input (`self` or a `forward` argument): a placeholder, bound when interpreting.
    Input,
    /// `outputs = getattr(inputs[0], name)`: a parameter, buffer or submodule of `self`.
    GetAttr,
    /// A value captured while tracing (a tensor the user created in `forward`).
    Constant,
    /// `outputs = func(*inputs)`: a registry op or user function.
    CallFunction,
    /// `outputs = getattr(inputs[0], method)(*inputs[1:])`: a tensor method, a Python operator
    /// (`__add__`) or a module call (`__call__`).
    CallMethod,
}

impl ExprKind {
    /// MegEngine's class name (`CallMethod`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExprKind::Input => "Input",
            ExprKind::GetAttr => "GetAttr",
            ExprKind::Constant => "Constant",
            ExprKind::CallFunction => "CallFunction",
            ExprKind::CallMethod => "CallMethod",
        }
    }
}

impl fmt::Display for ExprKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(crate) struct ExprData {
    pub(crate) kind: ExprKind,
    /// The graph node behind the expression (`None` for `self`'s Input and module GetAttrs).
    pub(crate) node: Option<NodeId>,
    pub(crate) inputs: Vec<usize>,
    pub(crate) outputs: Vec<usize>,
    /// Attribute path (GetAttr, Constant), method (CallMethod) or function name (CallFunction).
    pub(crate) name: String,
    /// The literal arguments with their positions (MegEngine's `const_val`).
    pub(crate) consts: Vec<(usize, Argument)>,
    /// The printed right-hand side.
    pub(crate) rhs: String,
}

pub(crate) struct NodeData {
    pub(crate) name: String,
    pub(crate) expr: usize,
    pub(crate) users: Vec<usize>,
    /// The graph node whose value this is (tensor nodes).
    pub(crate) graph_node: Option<NodeId>,
    /// The module path (`""` for `self`) for module nodes.
    pub(crate) module: Option<String>,
}

/// MegEngine's `InternalGraph` as a view over a [`GraphModule`]: expressions in execution
/// order with numbered ids, the value nodes they produce and use, the graph's inputs and
/// outputs. Build it with [`GraphModule::internal_graph`]; it borrows the module, so edit the
/// module (see the surgery methods) and build a new view to see the change.
///
/// ```
/// use ferrofx_fx::{symbolic_trace, traced::ExprKind};
/// use ferrofx_nn::{functional, Linear, Module, Result, Tensor};
///
/// #[derive(ferrofx_nn::Module)]
/// struct Net { linear: Linear }
/// impl Module for Net {
///     fn forward(&self, x: &Tensor) -> Result<Tensor> { functional::relu(&self.linear.call(x)?) }
/// }
/// let gm = symbolic_trace(&Net { linear: Linear::new(4, 2, true).unwrap() }).unwrap();
/// let g = gm.internal_graph();
/// assert_eq!(
///     g.to_string(),
///     "Net.Graph (self, x) {\n\
///      \t%2:\tlinear_1 = getattr(self, \"linear\") -> (Linear)\n\
///      \t%3:\tlinear = linear_1(x, )\n\
///      \t%4:\trelu = F.relu(linear, )\n\
///      \treturn relu\n}"
/// );
/// let relu = g.get_expr_by_id(4).unwrap();
/// assert_eq!(relu.kind(), ExprKind::CallFunction);
/// assert_eq!(relu.inputs()[0].name(), "linear");
/// ```
pub struct InternalGraph<'m> {
    pub(crate) gm: &'m GraphModule,
    pub(crate) exprs: Vec<ExprData>,
    pub(crate) nodes: Vec<NodeData>,
    pub(crate) inputs: Vec<usize>,
    pub(crate) outputs: Vec<usize>,
    pub(crate) returns: String,
    by_graph_node: HashMap<NodeId, usize>,
}

/// Registry ops that are Python operators on tensors, shown as MegEngine shows them
/// (`x.__add__(y, )`).
const OPERATORS: &[(&str, &str)] = &[
    ("add", "__add__"),
    ("sub", "__sub__"),
    ("mul", "__mul__"),
    ("div", "__truediv__"),
    ("floor_divide", "__floordiv__"),
    ("remainder", "__mod__"),
    ("pow", "__pow__"),
    ("matmul", "__matmul__"),
    ("neg", "__neg__"),
    ("eq", "__eq__"),
    ("ne", "__ne__"),
    ("lt", "__lt__"),
    ("le", "__le__"),
    ("gt", "__gt__"),
    ("ge", "__ge__"),
    ("bitwise_and", "__and__"),
    ("bitwise_or", "__or__"),
    ("bitwise_xor", "__xor__"),
];

fn operator_of(op: &str) -> Option<&'static str> {
    OPERATORS.iter().find(|(o, _)| *o == op).map(|(_, m)| *m)
}

/// The type name shown for a module (`Linear`; a nested traced module shows the type it was
/// traced from).
pub(crate) fn module_type_name(m: &dyn Module) -> String {
    if let Some(gm) = m.as_any().downcast_ref::<GraphModule>() {
        return gm.traced_type_name().to_string();
    }
    match m.spec() {
        Some(s) => s.type_name.to_string(),
        None => m.type_name().to_string(),
    }
}

impl GraphModule {
    /// The expression view of this module's graph (MegEngine's `traced_module.graph`).
    pub fn internal_graph(&self) -> InternalGraph<'_> {
        InternalGraph::build(self)
    }
}

impl<'m> InternalGraph<'m> {
    fn build(gm: &'m GraphModule) -> InternalGraph<'m> {
        let g = gm.graph();
        let mut v = InternalGraph {
            gm,
            exprs: vec![],
            nodes: vec![],
            inputs: vec![],
            outputs: vec![],
            returns: String::new(),
            by_graph_node: HashMap::new(),
        };
        let mut taken: HashSet<String> = g.iter().map(|n| n.name().to_string()).collect();
        taken.insert("self".into());
        let mut module_nodes: HashMap<String, usize> = HashMap::new();
        let self_node = v.push_input("self".into(), None, Some(String::new()));
        v.inputs.push(self_node);
        for n in g.iter().filter(|n| n.op() == Opcode::Placeholder) {
            let id = v.push_input(n.name().to_string(), Some(n.id()), None);
            v.inputs.push(id);
        }
        for n in g.iter() {
            let name = n.name().to_string();
            match n.op() {
                Opcode::Placeholder => {}
                Opcode::Output => {
                    let a = n.args().first().cloned().unwrap_or(Argument::None);
                    a.visit_nodes(&mut |id| {
                        if let Some(&i) = v.by_graph_node.get(&id) {
                            v.outputs.push(i);
                        }
                    });
                    v.returns = match &a {
                        Argument::Tuple(items) | Argument::List(items) => {
                            items.iter().map(|x| v.fmt_arg(x)).collect::<Vec<_>>().join(", ")
                        }
                        other => v.fmt_arg(other),
                    };
                }
                Opcode::GetAttr => {
                    let path = n.target().name().to_string();
                    let constant = gm.attributes().get(&path).is_some_and(|e| e.constant);
                    let (kind, inputs, rhs) = if constant {
                        (ExprKind::Constant, vec![], "Constant(Tensor) -> (Tensor)".to_string())
                    } else {
                        (ExprKind::GetAttr, vec![self_node], format!("getattr(self, \"{path}\") -> (Tensor)"))
                    };
                    let out = v.push_node(name.clone(), Some(n.id()), None);
                    v.push_expr(ExprData {
                        kind,
                        node: Some(n.id()),
                        inputs,
                        outputs: vec![out],
                        name: path,
                        consts: vec![],
                        rhs,
                    });
                }
                Opcode::CallModule => {
                    let path = n.target().name().to_string();
                    let module = match module_nodes.get(&path) {
                        Some(&m) => m,
                        None => {
                            let mut cand: String =
                                path.chars().map(|c| if c.is_alphanumeric() || c == '_' { c } else { '_' }).collect();
                            let base = cand.clone();
                            let mut k = 1;
                            while taken.contains(&cand) {
                                cand = format!("{base}_{k}");
                                k += 1;
                            }
                            taken.insert(cand.clone());
                            let ty = gm.get_submodule_owned(&path).map(module_type_name).unwrap_or_else(|_| "?".into());
                            let m = v.push_node(cand, None, Some(path.clone()));
                            v.push_expr(ExprData {
                                kind: ExprKind::GetAttr,
                                node: None,
                                inputs: vec![self_node],
                                outputs: vec![m],
                                rhs: format!("getattr(self, \"{path}\") -> ({ty})"),
                                name: path.clone(),
                                consts: vec![],
                            });
                            module_nodes.insert(path.clone(), m);
                            m
                        }
                    };
                    let mut inputs = vec![module];
                    inputs.extend(n.all_input_nodes().iter().filter_map(|i| v.by_graph_node.get(i).copied()));
                    let rhs = format!("{}({})", v.nodes[module].name, v.fmt_call_args(n.args(), n.kwargs()));
                    let consts = literal_args(n.args());
                    let out = v.push_node(name, Some(n.id()), None);
                    v.push_expr(ExprData {
                        kind: ExprKind::CallMethod,
                        node: Some(n.id()),
                        inputs,
                        outputs: vec![out],
                        name: "__call__".into(),
                        consts,
                        rhs,
                    });
                }
                Opcode::CallMethod | Opcode::CallFunction => {
                    let inputs: Vec<usize> =
                        n.all_input_nodes().iter().filter_map(|i| v.by_graph_node.get(i).copied()).collect();
                    let args = n.args();
                    let first_is_node = args.first().and_then(Argument::as_node).is_some();
                    let (kind, fname, rhs) = match (n.op(), n.target()) {
                        (Opcode::CallMethod, t) if first_is_node => {
                            let m = t.name().to_string();
                            let rhs =
                                format!("{}.{m}({})", v.fmt_arg(&args[0]), v.fmt_call_args(&args[1..], n.kwargs()));
                            (ExprKind::CallMethod, m, rhs)
                        }
                        (Opcode::CallFunction, Target::Op(def))
                            if first_is_node && n.kwargs().is_empty() && operator_of(def.name).is_some() =>
                        {
                            let m = operator_of(def.name).unwrap_or(def.name).to_string();
                            let rhs =
                                format!("{}.{m}({})", v.fmt_arg(&args[0]), v.fmt_call_args(&args[1..], n.kwargs()));
                            (ExprKind::CallMethod, m, rhs)
                        }
                        (_, t) => {
                            let f = t.name().to_string();
                            let shown = if matches!(t, Target::Op(_)) { format!("F.{f}") } else { f.clone() };
                            (ExprKind::CallFunction, f, format!("{shown}({})", v.fmt_call_args(args, n.kwargs())))
                        }
                    };
                    let consts = literal_args(args);
                    let out = v.push_node(name, Some(n.id()), None);
                    v.push_expr(ExprData {
                        kind,
                        node: Some(n.id()),
                        inputs,
                        outputs: vec![out],
                        name: fname,
                        consts,
                        rhs,
                    });
                }
            }
        }
        // users, in expression order, each expression once per node
        for e in 0..v.exprs.len() {
            let mut seen = HashSet::new();
            for i in v.exprs[e].inputs.clone() {
                if seen.insert(i) {
                    v.nodes[i].users.push(e);
                }
            }
        }
        v
    }

    fn push_input(&mut self, name: String, graph_node: Option<NodeId>, module: Option<String>) -> usize {
        let out = self.push_node(name, graph_node, module);
        self.push_expr(ExprData {
            kind: ExprKind::Input,
            node: graph_node,
            inputs: vec![],
            outputs: vec![out],
            name: self.nodes[out].name.clone(),
            consts: vec![],
            rhs: "Input()".into(),
        });
        out
    }

    fn push_node(&mut self, name: String, graph_node: Option<NodeId>, module: Option<String>) -> usize {
        let i = self.nodes.len();
        if let Some(id) = graph_node {
            self.by_graph_node.insert(id, i);
        }
        self.nodes.push(NodeData { name, expr: self.exprs.len(), users: vec![], graph_node, module });
        i
    }

    fn push_expr(&mut self, e: ExprData) {
        self.exprs.push(e);
    }

    fn fmt_arg(&self, a: &Argument) -> String {
        match a {
            Argument::Node(n) => match self.by_graph_node.get(n) {
                Some(&i) => self.nodes[i].name.clone(),
                None => "?".into(),
            },
            Argument::List(v) => format!("[{}]", v.iter().map(|x| self.fmt_arg(x)).collect::<Vec<_>>().join(", ")),
            Argument::Tuple(v) if v.len() == 1 => format!("({},)", self.fmt_arg(&v[0])),
            Argument::Tuple(v) => format!("({})", v.iter().map(|x| self.fmt_arg(x)).collect::<Vec<_>>().join(", ")),
            Argument::Str(s) => format!("{:?}", s.to_string()),
            Argument::Bool(true) => "True".into(),
            Argument::Bool(false) => "False".into(),
            Argument::Int(i) => i.to_string(),
            Argument::Float(f) => format!("{f:?}"),
            Argument::None => "None".into(),
            other => format!("{other:?}"),
        }
    }

    /// MegEngine's argument layout: every argument followed by `, ` (`f(x, 2, dim=1, )`).
    fn fmt_call_args(&self, args: &[Argument], kwargs: &crate::graph::Kwargs) -> String {
        let mut s = String::new();
        for a in args {
            s.push_str(&self.fmt_arg(a));
            s.push_str(", ");
        }
        for (k, a) in kwargs.iter() {
            s.push_str(&format!("{k}={}, ", self.fmt_arg(a)));
        }
        s
    }

    /// The module this graph describes (MegEngine's `TracedModule`).
    pub fn module(&self) -> &'m GraphModule {
        self.gm
    }

    /// The name of the traced type (`SimpleModule`).
    pub fn type_name(&self) -> &'m str {
        self.gm.traced_type_name()
    }

    /// The expressions in execution order; `Input` expressions (`self` first) lead.
    pub fn exprs(&self) -> Vec<Expr<'_>> {
        (0..self.exprs.len()).map(|idx| Expr { g: self.erase(), idx }).collect()
    }

    /// The expression with id `id` (MegEngine's `exprs().as_dict()[id]`).
    pub fn get_expr_by_id(&self, id: usize) -> Option<Expr<'_>> {
        (id < self.exprs.len()).then(|| Expr { g: self.erase(), idx: id })
    }

    /// The graph inputs: `self` (a [`ModuleNode`]) then the forward's arguments.
    pub fn inputs(&self) -> Vec<ValueNode<'_>> {
        self.inputs.iter().map(|&idx| ValueNode { g: self.erase(), idx }).collect()
    }

    /// The graph outputs, in the order the output returns them.
    pub fn outputs(&self) -> Vec<ValueNode<'_>> {
        self.outputs.iter().map(|&idx| ValueNode { g: self.erase(), idx }).collect()
    }

    /// Every value node (inputs, attributes, modules, results) in creation order.
    pub fn nodes(&self) -> Vec<ValueNode<'_>> {
        (0..self.nodes.len()).map(|idx| ValueNode { g: self.erase(), idx }).collect()
    }

    /// The value node named `name`, if any (MegEngine's `get_node_by_name`).
    pub fn get_node_by_name(&self, name: &str) -> Option<ValueNode<'_>> {
        self.nodes.iter().position(|n| n.name == name).map(|idx| ValueNode { g: self.erase(), idx })
    }

    /// The value node of a graph node.
    pub fn node_of(&self, id: NodeId) -> Option<ValueNode<'_>> {
        self.by_graph_node.get(&id).map(|&idx| ValueNode { g: self.erase(), idx })
    }

    /// The graphs of the nested traced modules this graph calls (from
    /// [`crate::traced::trace_module`]), by path, in call order — what MegEngine's
    /// `exprs(recursive=True)` descends into.
    pub fn nested(&self) -> Vec<(&'m str, InternalGraph<'m>)> {
        let gm: &'m GraphModule = self.gm;
        gm.leaf_modules()
            .iter()
            .filter_map(|(p, m)| m.as_any().downcast_ref::<GraphModule>().map(|sub| (p.as_str(), sub.internal_graph())))
            .collect()
    }

    /// Shortens the `'m` lifetime to the borrow's, for handles (the view is covariant).
    fn erase(&self) -> &InternalGraph<'_> {
        self
    }
}

fn literal_args(args: &[Argument]) -> Vec<(usize, Argument)> {
    args.iter().enumerate().filter(|(_, a)| a.as_node().is_none()).map(|(i, a)| (i, a.clone())).collect()
}

impl fmt::Display for InternalGraph<'_> {
    /// The seed's layout: `Type.Graph (self, x) {`, one `%id:\tname = ...` line per expression
    /// (the `Input`s are the signature), `return ...`, `}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.inputs.iter().map(|&i| self.nodes[i].name.as_str()).collect();
        writeln!(f, "{}.Graph ({}) {{", self.type_name(), names.join(", "))?;
        for e in self.exprs().iter().filter(|e| e.kind() != ExprKind::Input) {
            writeln!(f, "\t{e}")?;
        }
        write!(f, "\treturn {}\n}}", self.returns)
    }
}

/// One expression of an [`InternalGraph`] (MegEngine's `Expr`): a cheap `Copy` handle.
#[derive(Clone, Copy)]
pub struct Expr<'a> {
    pub(crate) g: &'a InternalGraph<'a>,
    pub(crate) idx: usize,
}

impl<'a> Expr<'a> {
    pub(crate) fn data(&self) -> &'a ExprData {
        &self.g.exprs[self.idx]
    }

    /// The expression's id (the `%5` of the printout).
    pub fn id(&self) -> usize {
        self.idx
    }

    /// Its kind.
    pub fn kind(&self) -> ExprKind {
        self.data().kind
    }

    /// The input value nodes, in argument order (a `CallMethod`'s first input is its `self`:
    /// the tensor, or the module for a module call).
    pub fn inputs(&self) -> Vec<ValueNode<'a>> {
        self.data().inputs.iter().map(|&idx| ValueNode { g: self.g, idx }).collect()
    }

    /// The output value nodes.
    pub fn outputs(&self) -> Vec<ValueNode<'a>> {
        self.data().outputs.iter().map(|&idx| ValueNode { g: self.g, idx }).collect()
    }

    /// The literal (non-node) arguments with their positions (MegEngine's `const_val`).
    pub fn const_val(&self) -> &'a [(usize, Argument)] {
        &self.data().consts
    }

    /// The attribute path (`GetAttr`, `Constant`), method (`CallMethod`: `__add__`,
    /// `reshape`, `__call__`) or function name (`CallFunction`: `relu`); an `Input`'s name.
    pub fn name(&self) -> &'a str {
        &self.data().name
    }

    /// The graph node behind this expression, for editing through the graph; `None` for the
    /// `self` input and for the `GetAttr` of a module (the graph's `call_module` names the
    /// module itself).
    pub fn graph_node(&self) -> Option<NodeId> {
        self.data().node
    }

    /// For a module call (`CallMethod` `__call__`), the called module's path.
    pub fn module_path(&self) -> Option<&'a str> {
        if self.kind() != ExprKind::CallMethod || self.name() != "__call__" {
            return None;
        }
        self.data().inputs.first().and_then(|&m| self.g.nodes[m].module.as_deref())
    }

    /// The registry op a call runs (`add` for `__add__`, `reshape`, `relu`), if it runs one.
    pub fn op_name(&self) -> Option<&'a str> {
        let node = self.graph_node()?;
        let n = self.g.gm.graph().node(node).ok()?;
        match n.op() {
            Opcode::CallFunction | Opcode::CallMethod => Some(n.target().name()),
            _ => None,
        }
    }

    /// The graph this expression belongs to (MegEngine's `top_graph`).
    pub fn top_graph(&self) -> &'a InternalGraph<'a> {
        self.g
    }
}

impl fmt::Display for Expr<'_> {
    /// `%7:\trelu_out = F.relu(add_out, )`, as the seed prints expressions.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.data();
        let lhs: Vec<&str> = d.outputs.iter().map(|&o| self.g.nodes[o].name.as_str()).collect();
        write!(f, "%{}:\t{} = {}", self.idx, lhs.join(", "), d.rhs)
    }
}

impl fmt::Debug for Expr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A value of an [`InternalGraph`] (MegEngine's `Node`): a tensor or a module.
#[derive(Clone, Copy)]
pub struct ValueNode<'a> {
    pub(crate) g: &'a InternalGraph<'a>,
    pub(crate) idx: usize,
}

/// What a [`ValueNode`] describes.
#[derive(Clone, Copy, Debug)]
pub enum NodeKind<'a> {
    /// A tensor.
    Tensor(TensorNode<'a>),
    /// A module.
    Module(ModuleNode<'a>),
}

/// MegEngine's `TensorNode`: shape and dtype when known (tracing with example inputs or
/// after shape propagation).
#[derive(Clone, Copy, Debug)]
pub struct TensorNode<'a> {
    meta: Option<&'a crate::graph::TensorMetadata>,
}

impl<'a> TensorNode<'a> {
    /// The shape, when known.
    pub fn shape(&self) -> Option<&'a [usize]> {
        self.meta.map(|m| m.shape.as_slice())
    }

    /// The dtype, when known.
    pub fn dtype(&self) -> Option<DType> {
        self.meta.map(|m| m.dtype)
    }
}

/// MegEngine's `ModuleNode`: a module of the traced hierarchy.
#[derive(Clone, Copy)]
pub struct ModuleNode<'a> {
    owner: Option<&'a dyn Module>,
    path: &'a str,
}

impl<'a> ModuleNode<'a> {
    /// The module object itself (the traced module for `self`); `None` when the graph calls a
    /// path the GraphModule does not own (an edit left it dangling; `recompile` reports it).
    pub fn owner(&self) -> Option<&'a dyn Module> {
        self.owner
    }

    /// Its type name (`Linear`; the traced type for `self` and nested traced modules; `?` when
    /// the module is missing).
    pub fn module_type(&self) -> String {
        self.owner.map(module_type_name).unwrap_or_else(|| "?".to_string())
    }

    /// Its path in the traced module (`""` for `self`).
    pub fn path(&self) -> &'a str {
        self.path
    }
}

impl fmt::Debug for ModuleNode<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleNode").field("path", &self.path).field("type", &self.module_type()).finish()
    }
}

impl<'a> ValueNode<'a> {
    fn data(&self) -> &'a NodeData {
        &self.g.nodes[self.idx]
    }

    /// The node's name (unique in the view; a tensor node has its graph node's name).
    pub fn name(&self) -> &'a str {
        &self.data().name
    }

    /// The expression that produces it.
    pub fn expr(&self) -> Expr<'a> {
        Expr { g: self.g, idx: self.data().expr }
    }

    /// The expressions that use it, in execution order.
    pub fn users(&self) -> Vec<Expr<'a>> {
        self.data().users.iter().map(|&idx| Expr { g: self.g, idx }).collect()
    }

    /// Tensor or module.
    pub fn kind(&self) -> NodeKind<'a> {
        let d = self.data();
        match &d.module {
            Some(path) => {
                let owner: Option<&'a dyn Module> =
                    if path.is_empty() { Some(self.g.gm) } else { self.g.gm.get_submodule_owned(path).ok() };
                NodeKind::Module(ModuleNode { owner, path })
            }
            None => {
                let meta = d
                    .graph_node
                    .and_then(|id| self.g.gm.graph().node(id).ok())
                    .and_then(|n| n.meta().tensor_meta.as_ref());
                NodeKind::Tensor(TensorNode { meta })
            }
        }
    }

    /// MegEngine's class name: `TensorNode` or `ModuleNode`.
    pub fn type_name(&self) -> &'static str {
        match self.data().module {
            Some(_) => "ModuleNode",
            None => "TensorNode",
        }
    }

    /// The shape of a tensor node, when known.
    pub fn shape(&self) -> Option<&'a [usize]> {
        match self.kind() {
            NodeKind::Tensor(t) => t.shape(),
            NodeKind::Module(_) => None,
        }
    }

    /// The dtype of a tensor node, when known.
    pub fn dtype(&self) -> Option<DType> {
        match self.kind() {
            NodeKind::Tensor(t) => t.dtype(),
            NodeKind::Module(_) => None,
        }
    }

    /// The module of a module node (MegEngine's `owner`).
    pub fn owner(&self) -> Option<&'a dyn Module> {
        match self.kind() {
            NodeKind::Module(m) => m.owner(),
            NodeKind::Tensor(_) => None,
        }
    }

    /// The graph node whose value this is (tensor nodes).
    pub fn graph_node(&self) -> Option<NodeId> {
        self.data().graph_node
    }

    /// The graph it belongs to (MegEngine's `top_graph`).
    pub fn top_graph(&self) -> &'a InternalGraph<'a> {
        self.g
    }
}

impl fmt::Display for ValueNode<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Debug for ValueNode<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
