//! The graph section of a traced-module file: a [`Graph`] as plain data ([`GraphDoc`]), and
//! back with every reference, op name and opcode checked.
//!
//! ```
//! use ferrofx_fx::serialize::{graph_from_doc, graph_to_doc};
//! use ferrofx_fx::{Graph, Target};
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! let r = g.call_function(Target::named("relu"), vec![x.into()]).unwrap();
//! g.output(r.into()).unwrap();
//! let doc = graph_to_doc(&g).unwrap();
//! let json = serde_json::to_string(&doc).unwrap();
//! let back = graph_from_doc(&serde_json::from_str(&json).unwrap()).unwrap();
//! assert_eq!(back.to_string(), g.to_string());
//! ```

use super::FormatError;
use crate::core_api::{lookup, DType};
use crate::graph::{Argument, Device, Graph, Kwargs, Meta, ModuleStackEntry, NodeId, Opcode, Target, TensorMetadata};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Most nodes a file may declare (a ResNet-50 has ~180; a large transformer a few thousand).
pub const MAX_NODES: usize = 1 << 22;
/// Deepest nesting of arguments (lists in tuples in dicts ...).
pub const MAX_ARG_DEPTH: usize = 32;
/// Largest rank of a declared tensor.
pub const MAX_RANK: usize = 64;

/// One argument as data. Node references are indices into [`GraphDoc::nodes`] and must point to
/// an earlier node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgDoc {
    /// `None`.
    None,
    /// `...`.
    Ellipsis,
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A finite float.
    Float(f64),
    /// A float JSON cannot hold: `"inf"`, `"-inf"` or `"nan"`.
    NonFinite(String),
    /// A string.
    Str(String),
    /// A dtype by PyTorch name (`float32`, `int64`, ...).
    Dtype(String),
    /// A device.
    Device {
        /// `cpu`, `cuda`, `meta`.
        kind: String,
        /// Device index.
        index: Option<u32>,
    },
    /// A slice `(start, stop, step)`.
    Slice(Box<[ArgDoc; 3]>),
    /// The value of node `i`.
    Node(u32),
    /// A list.
    List(Vec<ArgDoc>),
    /// A tuple.
    Tuple(Vec<ArgDoc>),
    /// A dict with string keys, in order.
    Dict(Vec<(String, ArgDoc)>),
}

/// Declared metadata of a tensor value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMetaDoc {
    /// Sizes.
    pub shape: Vec<u64>,
    /// PyTorch dtype name.
    pub dtype: String,
    /// Strides in elements.
    pub strides: Vec<i64>,
    /// Whether autograd tracked the value.
    #[serde(default)]
    pub requires_grad: bool,
}

/// The saved part of a node's `meta`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaDoc {
    /// Shape propagation's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_meta: Option<TensorMetaDoc>,
    /// Where the node was traced from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_trace: Option<String>,
    /// `(key, path, type)` frames, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nn_module_stack: Vec<(String, String, String)>,
}

/// One node as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDoc {
    /// Unique name.
    pub name: String,
    /// `placeholder`, `get_attr`, `call_function`, `call_method`, `call_module` or `output`.
    pub op: String,
    /// Registry op name for `call_function`; the string target otherwise.
    pub target: String,
    /// Positional arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgDoc>,
    /// Keyword arguments, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kwargs: Vec<(String, ArgDoc)>,
    /// Type annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_expr: Option<String>,
    /// Saved metadata.
    #[serde(default, skip_serializing_if = "is_default_meta")]
    pub meta: MetaDoc,
}

fn is_default_meta(m: &MetaDoc) -> bool {
    *m == MetaDoc::default()
}

/// A whole graph as data: its nodes in graph order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphDoc {
    /// Nodes, definitions before uses.
    pub nodes: Vec<NodeDoc>,
}

fn dtype_from_name(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.name() == name)
}

fn arg_to_doc(a: &Argument, index: &HashMap<NodeId, u32>, node: &str) -> Result<ArgDoc, FormatError> {
    let list = |items: &[Argument]| items.iter().map(|x| arg_to_doc(x, index, node)).collect::<Result<Vec<_>, _>>();
    Ok(match a {
        Argument::None => ArgDoc::None,
        Argument::Ellipsis => ArgDoc::Ellipsis,
        Argument::Bool(b) => ArgDoc::Bool(*b),
        Argument::Int(i) => ArgDoc::Int(*i),
        Argument::Float(f) if f.is_finite() => ArgDoc::Float(*f),
        Argument::Float(f) => ArgDoc::NonFinite(
            if f.is_nan() {
                "nan"
            } else if *f > 0.0 {
                "inf"
            } else {
                "-inf"
            }
            .to_string(),
        ),
        Argument::Str(s) => ArgDoc::Str(s.to_string()),
        Argument::DType(d) => ArgDoc::Dtype(d.name().to_string()),
        Argument::Device(d) => ArgDoc::Device { kind: d.kind.clone(), index: d.index },
        Argument::Slice(s) => ArgDoc::Slice(Box::new([
            arg_to_doc(&s.start, index, node)?,
            arg_to_doc(&s.stop, index, node)?,
            arg_to_doc(&s.step, index, node)?,
        ])),
        Argument::Node(n) => ArgDoc::Node(*index.get(n).ok_or_else(|| {
            FormatError::Invalid(format!("node '{node}' refers to a node that is not in the graph ({n:?})"))
        })?),
        Argument::List(items) => ArgDoc::List(list(items)?),
        Argument::Tuple(items) => ArgDoc::Tuple(list(items)?),
        Argument::Dict(d) => {
            ArgDoc::Dict(d.iter().map(|(k, v)| Ok((k.clone(), arg_to_doc(v, index, node)?))).collect::<Result<_, _>>()?)
        }
    })
}

/// Converts a graph to its document form. Fails on targets a file cannot name: user functions
/// (register them as custom ops instead) and nodes of another graph.
pub fn graph_to_doc(g: &Graph) -> Result<GraphDoc, FormatError> {
    let mut index = HashMap::with_capacity(g.len());
    let mut nodes = Vec::with_capacity(g.len());
    for (i, n) in g.iter().enumerate() {
        let target = match n.target() {
            Target::Op(def) => def.name.to_string(),
            Target::Str(s) => s.clone(),
            Target::Function(f) => {
                return Err(FormatError::Invalid(format!(
                    "node '{}' calls the user function '{}', which a file cannot reference; register it as a custom op (ferrofx_core::op::register) so it is saved by name",
                    n.name(),
                    f.name()
                )))
            }
        };
        let args = n.args().iter().map(|a| arg_to_doc(a, &index, n.name())).collect::<Result<Vec<_>, _>>()?;
        let kwargs = n
            .kwargs()
            .iter()
            .map(|(k, v)| Ok((k.clone(), arg_to_doc(v, &index, n.name())?)))
            .collect::<Result<Vec<_>, FormatError>>()?;
        let m = n.meta();
        let meta = MetaDoc {
            tensor_meta: m.tensor_meta.as_ref().map(|t| TensorMetaDoc {
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                dtype: t.dtype.name().to_string(),
                strides: t.strides.iter().map(|&s| s as i64).collect(),
                requires_grad: t.requires_grad,
            }),
            stack_trace: m.stack_trace.clone(),
            nn_module_stack: m
                .nn_module_stack
                .iter()
                .map(|e| (e.key.clone(), e.path.clone(), e.type_name.clone()))
                .collect(),
        };
        nodes.push(NodeDoc {
            name: n.name().to_string(),
            op: n.op().as_str().to_string(),
            target,
            args,
            kwargs,
            type_expr: n.type_expr().map(str::to_string),
            meta,
        });
        index.insert(n.id(), i as u32);
    }
    Ok(GraphDoc { nodes })
}

fn arg_from_doc(a: &ArgDoc, ids: &[NodeId], node: &str, depth: usize) -> Result<Argument, FormatError> {
    if depth > MAX_ARG_DEPTH {
        return Err(FormatError::Limit(format!("node '{node}': arguments nested deeper than {MAX_ARG_DEPTH} levels")));
    }
    let list =
        |items: &[ArgDoc]| items.iter().map(|x| arg_from_doc(x, ids, node, depth + 1)).collect::<Result<Vec<_>, _>>();
    Ok(match a {
        ArgDoc::None => Argument::None,
        ArgDoc::Ellipsis => Argument::Ellipsis,
        ArgDoc::Bool(b) => Argument::Bool(*b),
        ArgDoc::Int(i) => Argument::Int(*i),
        ArgDoc::Float(f) => Argument::Float(*f),
        ArgDoc::NonFinite(s) => Argument::Float(match s.as_str() {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            other => {
                return Err(FormatError::Invalid(format!(
                    "node '{node}': non-finite float '{other}' (expected inf, -inf or nan)"
                )))
            }
        }),
        ArgDoc::Str(s) => Argument::Str(s.as_str().into()),
        ArgDoc::Dtype(d) => Argument::DType(
            dtype_from_name(d).ok_or_else(|| FormatError::Invalid(format!("node '{node}': unknown dtype '{d}'")))?,
        ),
        ArgDoc::Device { kind, index } => Argument::Device(Box::new(Device::new(kind.clone(), *index))),
        ArgDoc::Slice(s) => Argument::slice(
            arg_from_doc(&s[0], ids, node, depth + 1)?,
            arg_from_doc(&s[1], ids, node, depth + 1)?,
            arg_from_doc(&s[2], ids, node, depth + 1)?,
        ),
        ArgDoc::Node(i) => Argument::Node(*ids.get(*i as usize).ok_or_else(|| {
            FormatError::Invalid(format!(
                "node '{node}' uses node #{i}, which is not defined before it (only {} nodes precede it)",
                ids.len()
            ))
        })?),
        ArgDoc::List(items) => Argument::list(list(items)?),
        ArgDoc::Tuple(items) => Argument::tuple(list(items)?),
        ArgDoc::Dict(d) => Argument::dict(
            d.iter()
                .map(|(k, v)| Ok((k.clone(), arg_from_doc(v, ids, node, depth + 1)?)))
                .collect::<Result<Vec<_>, FormatError>>()?,
        ),
    })
}

/// Declared tensor metadata, checked (known dtype, rank and strides agree, sizes bounded).
pub fn tensor_meta_from_doc(t: &TensorMetaDoc, what: &str) -> Result<TensorMetadata, FormatError> {
    let dtype = dtype_from_name(&t.dtype)
        .ok_or_else(|| FormatError::Invalid(format!("{what}: unknown dtype '{}'", t.dtype)))?;
    if t.shape.len() > MAX_RANK || t.strides.len() != t.shape.len() {
        return Err(FormatError::Invalid(format!(
            "{what}: shape {:?} and strides {:?} disagree (rank must match and be at most {MAX_RANK})",
            t.shape, t.strides
        )));
    }
    let mut numel: u64 = 1;
    for &d in &t.shape {
        numel = numel.checked_mul(d).filter(|&n| n <= 1 << 48).ok_or_else(|| {
            FormatError::Limit(format!("{what}: shape {:?} has more elements than any tensor can (2^48)", t.shape))
        })?;
    }
    Ok(TensorMetadata {
        shape: t.shape.iter().map(|&d| d as usize).collect(),
        dtype,
        strides: t.strides.iter().map(|&s| s as isize).collect(),
        requires_grad: t.requires_grad,
    })
}

/// Rebuilds a graph from its document form. Checks, in order, for every node: the opcode is one
/// of the six, a `call_function` target is a registered op, every node reference points to an
/// earlier node, names are unique; then the graph's own [`Graph::lint`].
pub fn graph_from_doc(doc: &GraphDoc) -> Result<Graph, FormatError> {
    if doc.nodes.len() > MAX_NODES {
        return Err(FormatError::Limit(format!("{} nodes is more than the limit {MAX_NODES}", doc.nodes.len())));
    }
    // the format's rules (docs/format.md): a graph has nodes and exactly one output, last
    if doc.nodes.is_empty() {
        return Err(FormatError::Invalid(
            "the graph has no nodes; a module needs at least an output node (was the file written by ferrofx?)"
                .to_string(),
        ));
    }
    match doc.nodes.iter().filter(|n| n.op == "output").count() {
        0 => {
            return Err(FormatError::Invalid(
                "the graph has no output node, so running it would return nothing; every traced graph ends with one"
                    .to_string(),
            ))
        }
        1 => {}
        k => return Err(FormatError::Invalid(format!("the graph has {k} output nodes; it must have exactly one"))),
    }
    if doc.nodes.last().map(|n| n.op.as_str()) != Some("output") {
        return Err(FormatError::Invalid("the graph's output node must be its last node".to_string()));
    }
    let mut g = Graph::with_capacity(doc.nodes.len());
    let mut ids: Vec<NodeId> = Vec::with_capacity(doc.nodes.len());
    let mut names = std::collections::HashSet::with_capacity(doc.nodes.len());
    for (i, n) in doc.nodes.iter().enumerate() {
        let op: Opcode =
            n.op.parse()
                .map_err(|_| FormatError::Invalid(format!("node #{i} '{}': unknown opcode '{}'", n.name, n.op)))?;
        if !names.insert(n.name.as_str()) {
            return Err(FormatError::Invalid(format!("node #{i}: the name '{}' is used twice", n.name)));
        }
        let target = if op == Opcode::CallFunction {
            Target::Op(
                lookup(&n.target)
                    .ok_or_else(|| FormatError::UnknownOp { node: n.name.clone(), op: n.target.clone() })?,
            )
        } else {
            Target::Str(n.target.clone())
        };
        let args = n.args.iter().map(|a| arg_from_doc(a, &ids, &n.name, 0)).collect::<Result<Vec<_>, _>>()?;
        let mut kwargs = Kwargs::with_capacity(n.kwargs.len());
        for (k, v) in &n.kwargs {
            if kwargs.insert(k.clone(), arg_from_doc(v, &ids, &n.name, 0)?).is_some() {
                return Err(FormatError::Invalid(format!("node '{}': keyword argument '{k}' given twice", n.name)));
            }
        }
        let id = g
            .create_node(op, target, args, kwargs, Some(&n.name), n.type_expr.clone())
            .map_err(|e| FormatError::Invalid(format!("node #{i} '{}': {e}", n.name)))?;
        let created = g.node(id).map(|x| x.name().to_string()).map_err(|e| FormatError::Invalid(e.to_string()))?;
        if created != n.name {
            return Err(FormatError::Invalid(format!(
                "node #{i}: '{}' is not a valid node name (it would be renamed '{created}')",
                n.name
            )));
        }
        let m = &n.meta;
        if m.tensor_meta.is_some() || m.stack_trace.is_some() || !m.nn_module_stack.is_empty() {
            let meta: &mut Meta = g.meta_mut(id).map_err(|e| FormatError::Invalid(e.to_string()))?;
            meta.tensor_meta = match &m.tensor_meta {
                Some(t) => Some(tensor_meta_from_doc(t, &format!("node '{}'", n.name))?),
                None => None,
            };
            meta.stack_trace = m.stack_trace.clone();
            meta.nn_module_stack = m
                .nn_module_stack
                .iter()
                .map(|(key, path, type_name)| ModuleStackEntry {
                    key: key.clone(),
                    path: path.clone(),
                    type_name: type_name.clone(),
                })
                .collect();
        }
        ids.push(id);
    }
    g.lint().map_err(|e| FormatError::Invalid(format!("the graph fails lint: {e}")))?;
    Ok(g)
}
