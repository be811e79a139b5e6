//! ONNX → [`GraphModule`].
//!
//! The model is wrapped in an [`OnnxProgram`], a [`Module`] whose forward evaluates the ONNX
//! nodes with registry ops (the converters of `src/ops/`); its parameters are the floating-point
//! initializers. Importing traces that module with example inputs of the declared shapes:
//! graph inputs become placeholders, the initializers `get_attr` nodes (parameters, or buffers
//! for batch-norm statistics) named after the file's names, every node the registry ops it
//! maps to, and everything that only depends on constants and shapes is folded. The result is
//! an ordinary GraphModule: it prints, runs, saves as `.fxm` and trains.
//!
//! Shapes are specialised to the example inputs: a dynamic dimension (`batch_size`) takes the
//! size given in [`ImportOptions::input_shapes`] or [`ImportOptions::dynamic_dim`]; running the
//! module with another size then fails with the op's shape error.

use crate::model::ModelFile;
use crate::ops::{converter, supported_ops, Node};
use crate::proto::{type_proto, GraphProto, NodeProto, ValueInfoProto};
use crate::tensor_proto::{checked_shape, dtype_from_onnx, tensor_from_proto, ExternalDataDir};
use ferrofx_core::trace::Symbolic;
use ferrofx_core::{DType, Error, Result, Tensor, TensorMeta, Value};
use ferrofx_fx::{GraphModule, Tracer};
use ferrofx_nn::{Module, ModuleStructure, TensorKind};
use indexmap::IndexMap;
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Options of [`import`].
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Input shapes by ONNX input name, overriding the file's (needed for dynamic dims).
    pub input_shapes: HashMap<String, Vec<usize>>,
    /// The size given to a dynamic dimension without an entry in `input_shapes`.
    pub dynamic_dim: usize,
    /// Inputs fixed to a value at import (FX's `concrete_args`): no placeholder is made for
    /// them and code depending on them is specialised. Needed for inputs that ONNX ops read as
    /// shapes, axes or sizes (`Reshape`'s `shape` fed from a graph input).
    pub constants: HashMap<String, Tensor>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { input_shapes: HashMap::new(), dynamic_dim: 1, constants: HashMap::new() }
    }
}

/// A declared graph input: ONNX name, dtype and shape (`None` for a dynamic dim).
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    /// The ONNX name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions; `None` where the file has a symbolic (`batch_size`) or missing size.
    pub shape: Vec<Option<usize>>,
}

/// The result of [`import`]: the module and how ONNX names map to its names.
pub struct Imported {
    /// The imported module.
    pub module: GraphModule,
    /// The graph inputs the module takes, in order, with the shapes it was specialised to
    /// (inputs fixed by [`ImportOptions::constants`] are left out).
    pub inputs: Vec<(InputSpec, Vec<usize>)>,
    /// ONNX output names, in order (the module returns them in this order).
    pub outputs: Vec<String>,
    /// ONNX initializer name → attribute name in the module (sanitised for FX's namespace).
    pub names: IndexMap<String, String>,
}

/// Imports the ONNX model at `path` as a GraphModule.
///
/// ```no_run
/// use ferrofx_onnx::{import, ImportOptions};
/// let imported = import("model.onnx", &ImportOptions::default())?;
/// println!("{}", imported.module.code()?);
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub fn import(path: impl AsRef<Path>, options: &ImportOptions) -> Result<Imported> {
    let file = ModelFile::open(path.as_ref())?;
    import_model(&file, options).map_err(|e| e.with_context(&path.as_ref().display().to_string()))
}

/// Imports an already decoded model.
pub fn import_model(file: &ModelFile, options: &ImportOptions) -> Result<Imported> {
    let program = OnnxProgram::new(file)?;
    let mut examples = Vec::new();
    let mut inputs = Vec::new();
    let mut tracer = Tracer::new();
    let mut names: Vec<String> = Vec::new();
    for (i, spec) in program.inputs.iter().enumerate() {
        if let Some(c) = options.constants.get(&spec.name) {
            tracer = tracer.concrete_arg(i, Value::Tensor(c.clone()));
            examples.push(Value::Tensor(c.clone()));
            names.push(sanitize(&spec.name));
            continue;
        }
        let shape = match options.input_shapes.get(&spec.name) {
            Some(s) => {
                if s.len() != spec.shape.len() || s.iter().zip(&spec.shape).any(|(a, b)| b.is_some_and(|b| b != *a)) {
                    return Err(Error::shape(
                        "onnx import",
                        format!(
                            "input `{}`: the given shape {s:?} does not fit the declared {:?}",
                            spec.name, spec.shape
                        ),
                    ));
                }
                s.clone()
            }
            None => spec.shape.iter().map(|d| d.unwrap_or(options.dynamic_dim)).collect(),
        };
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        checked_shape(&dims, &format!("input `{}`", spec.name), 1 << 30)?;
        // The tracer reads only the example's shape and dtype: a metadata-only tensor, so a
        // file declaring a huge input allocates nothing at import.
        let t = Tensor::symbolic(Symbolic {
            meta: Some(TensorMeta::contiguous(&shape, spec.dtype)),
            proxy: std::sync::Arc::new(()),
        });
        examples.push(Value::Tensor(t));
        inputs.push((spec.clone(), shape));
        names.push(sanitize(&spec.name));
    }
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let module = tracer.input_names(&name_refs).trace_with_inputs(&program, &examples)?;
    let names = program.params.iter().map(|p| (p.onnx.clone(), p.name.clone())).collect();
    Ok(Imported { module, inputs, outputs: program.outputs.clone(), names })
}

/// Sanitises an ONNX name for FX's namespace: characters other than letters, digits, `_` and
/// `.` become `_`, dots stay as path separators where every part is non-empty.
pub fn sanitize(name: &str) -> String {
    let mut s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' }).collect();
    if s.split('.').any(|p| p.is_empty()) {
        s = s.replace('.', "_");
    }
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

struct Param {
    onnx: String,
    name: String,
    kind: TensorKind,
    tensor: Tensor,
}

/// An ONNX graph as a [`Module`]: forward evaluates the nodes with registry ops.
pub struct OnnxProgram {
    graph: GraphProto,
    opset: i64,
    dir: ExternalDataDir,
    params: Vec<Param>,
    consts: HashMap<String, Tensor>,
    inputs: Vec<InputSpec>,
    outputs: Vec<String>,
}

fn input_spec(vi: &ValueInfoProto) -> Result<InputSpec> {
    let name = vi.name.clone().unwrap_or_default();
    let tp = vi.r#type.as_ref().and_then(|t| t.value.as_ref());
    let Some(type_proto::Value::TensorType(tt)) = tp else {
        return Err(Error::dtype(
            "onnx import",
            format!("input `{name}` is not a tensor (sequence, map and optional inputs are not supported)"),
        ));
    };
    let dtype = dtype_from_onnx(tt.elem_type.unwrap_or(0), &format!("input `{name}`"))?;
    let shape = match &tt.shape {
        Some(s) => s
            .dim
            .iter()
            .map(|d| match d.value {
                Some(crate::proto::tensor_shape_proto::dimension::Value::DimValue(v)) if v >= 0 => Some(v as usize),
                _ => None,
            })
            .collect(),
        None => vec![],
    };
    Ok(InputSpec { name, dtype, shape })
}

impl OnnxProgram {
    /// Prepares a decoded model: initializers become tensors (floating ones parameters, the
    /// statistics of batch norms buffers, integer ones constants), inputs are read.
    pub fn new(file: &ModelFile) -> Result<OnnxProgram> {
        let g = file.graph()?;
        let mut buffers: HashSet<&str> = HashSet::new();
        for n in &g.node {
            if n.op_type.as_deref() == Some("BatchNormalization") {
                buffers.extend(n.input.iter().skip(3).take(2).map(String::as_str));
            }
        }
        let mut params = Vec::new();
        let mut consts = HashMap::new();
        let mut taken: HashSet<String> = HashSet::new();
        let init_names: HashSet<&str> = g.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
        for t in &g.initializer {
            let onnx = t.name.clone().unwrap_or_default();
            let tensor = tensor_from_proto(t, &file.dir)?;
            if tensor.dtype().is_floating_point() && tensor.ndim() > 0 {
                let mut name = sanitize(&onnx);
                while !taken.insert(name.clone()) {
                    name.push('_');
                }
                let kind = if buffers.contains(onnx.as_str()) { TensorKind::Buffer } else { TensorKind::Parameter };
                params.push(Param { onnx, name, kind, tensor });
            } else {
                consts.insert(onnx, tensor);
            }
        }
        if !g.sparse_initializer.is_empty() {
            return Err(Error::argument("onnx import", "sparse initializers are not supported"));
        }
        let inputs = g
            .input
            .iter()
            .filter(|vi| !init_names.contains(vi.name.as_deref().unwrap_or("")))
            .map(input_spec)
            .collect::<Result<Vec<_>>>()?;
        let outputs = g.output.iter().map(|o| o.name.clone().unwrap_or_default()).collect();
        Ok(OnnxProgram { graph: g.clone(), opset: file.opset, dir: file.dir.clone(), params, consts, inputs, outputs })
    }

    /// The declared graph inputs.
    pub fn inputs(&self) -> &[InputSpec] {
        &self.inputs
    }

    fn run(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::argument(
                "onnx",
                format!(
                    "the model takes {} input(s) ({}), got {}",
                    self.inputs.len(),
                    self.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", "),
                    inputs.len()
                ),
            ));
        }
        let mut env: HashMap<String, Tensor> = HashMap::new();
        for p in &self.params {
            env.insert(p.onnx.clone(), p.tensor.clone());
        }
        for (k, t) in &self.consts {
            env.insert(k.clone(), t.clone());
        }
        for (spec, value) in self.inputs.iter().zip(inputs) {
            let Value::Tensor(t) = value else {
                return Err(Error::argument("onnx", format!("input `{}` must be a tensor, got {value:?}", spec.name)));
            };
            if t.dtype() != spec.dtype {
                return Err(Error::dtype(
                    "onnx",
                    format!("input `{}` must be {:?}, got {:?}", spec.name, spec.dtype, t.dtype()),
                ));
            }
            let shape = t.shape();
            if shape.len() != spec.shape.len() || shape.iter().zip(&spec.shape).any(|(a, b)| b.is_some_and(|b| b != *a))
            {
                return Err(Error::shape(
                    "onnx",
                    format!("input `{}` must have shape {:?} (None: any), got {:?}", spec.name, spec.shape, shape),
                ));
            }
            env.insert(spec.name.clone(), t.clone());
        }
        let mut seqs = HashMap::new();
        if self.graph.node.iter().any(|n| n.op_type.as_deref() == Some(crate::ops::gradient::OP)) {
            crate::ops::gradient::with_tape(|| eval_graph(&self.graph, &mut env, &mut seqs, self.opset, &self.dir, 0))?;
        } else {
            eval_graph(&self.graph, &mut env, &mut seqs, self.opset, &self.dir, 0)?;
        }
        self.outputs
            .iter()
            .map(|o| {
                if seqs.contains_key(o) {
                    return Err(Error::argument(
                        "onnx",
                        format!("graph output `{o}` is a sequence; only tensor outputs are supported"),
                    ));
                }
                env.get(o)
                    .cloned()
                    .map(Value::Tensor)
                    .ok_or_else(|| Error::argument("onnx", format!("graph output `{o}` is not produced by any node")))
            })
            .collect()
    }
}

/// Evaluates `graph`'s nodes in order, reading and writing values in `env` by ONNX name.
pub(crate) fn eval_graph(
    graph: &GraphProto,
    env: &mut HashMap<String, Tensor>,
    seqs: &mut HashMap<String, Vec<Tensor>>,
    opset: i64,
    dir: &ExternalDataDir,
    depth: usize,
) -> Result<()> {
    if depth > crate::model::MAX_GRAPH_DEPTH {
        return Err(Error::argument("onnx", "subgraphs nested too deep"));
    }
    for t in &graph.initializer {
        if let Some(name) = &t.name {
            if !env.contains_key(name) {
                env.insert(name.clone(), tensor_from_proto(t, dir)?);
            }
        }
    }
    for node in &graph.node {
        let op_type = node.op_type.as_deref().unwrap_or("");
        if crate::ops::sequence::is_sequence_op(op_type)
            && matches!(node.domain.as_deref().unwrap_or(""), "" | "ai.onnx")
        {
            eval_sequence_node(node, env, seqs, opset, dir)?;
            continue;
        }
        let outs = eval_node(node, env, seqs, opset, dir, depth)?;
        for (name, t) in node.output.iter().zip(outs) {
            if !name.is_empty() {
                env.insert(name.clone(), t);
            }
        }
    }
    Ok(())
}

fn node_label(node: &NodeProto) -> String {
    format!("node `{}` ({})", node.name.as_deref().unwrap_or(""), node.op_type.as_deref().unwrap_or(""))
}

/// Evaluates a sequence op: its inputs may be sequences (`seqs`) or tensors (`env`).
fn eval_sequence_node(
    node: &NodeProto,
    env: &mut HashMap<String, Tensor>,
    seqs: &mut HashMap<String, Vec<Tensor>>,
    opset: i64,
    dir: &ExternalDataDir,
) -> Result<()> {
    let mut inputs = Vec::with_capacity(node.input.len());
    let mut seq_inputs = Vec::with_capacity(node.input.len());
    for name in &node.input {
        if name.is_empty() {
            inputs.push(None);
            seq_inputs.push(None);
        } else if let Some(s) = seqs.get(name) {
            inputs.push(None);
            seq_inputs.push(Some(s.clone()));
        } else {
            inputs.push(Some(lookup(node, env, name)?.clone()));
            seq_inputs.push(None);
        }
    }
    let n = Node { proto: node, opset, inputs, dir };
    let out = crate::ops::sequence::eval(&n, &seq_inputs)?;
    if let Some(name) = node.output.first().filter(|o| !o.is_empty()) {
        match out {
            crate::ops::sequence::SeqOut::Tensor(t) => {
                seqs.remove(name);
                env.insert(name.clone(), t);
            }
            crate::ops::sequence::SeqOut::Sequence(s) => {
                env.remove(name);
                seqs.insert(name.clone(), s);
            }
        }
    }
    Ok(())
}

fn lookup<'e>(node: &NodeProto, env: &'e HashMap<String, Tensor>, name: &str) -> Result<&'e Tensor> {
    env.get(name).ok_or_else(|| {
        Error::argument(
            "onnx",
            format!(
                "{}: input `{name}` is not defined before the node (nodes must be in topological order)",
                node_label(node)
            ),
        )
    })
}

fn eval_node(
    node: &NodeProto,
    env: &mut HashMap<String, Tensor>,
    seqs: &mut HashMap<String, Vec<Tensor>>,
    opset: i64,
    dir: &ExternalDataDir,
    depth: usize,
) -> Result<Vec<Tensor>> {
    let op_type = node.op_type.as_deref().unwrap_or("");
    let domain = node.domain.as_deref().unwrap_or("");
    if domain == crate::ops::gradient::DOMAIN && op_type == crate::ops::gradient::OP {
        let n = Node { proto: node, opset, inputs: vec![], dir };
        return crate::ops::gradient::gradient(&n, env);
    }
    if !matches!(domain, "" | "ai.onnx") {
        return Err(Error::argument(
            "onnx",
            format!("{}: op domain `{domain}` is not supported (only the default ONNX domain)", node_label(node)),
        ));
    }
    let mut inputs = Vec::with_capacity(node.input.len());
    for name in &node.input {
        if name.is_empty() {
            inputs.push(None);
        } else if seqs.contains_key(name) {
            return Err(Error::argument(
                "onnx",
                format!("{}: input `{name}` is a sequence, but the op takes tensors", node_label(node)),
            ));
        } else {
            inputs.push(Some(lookup(node, env, name)?.clone()));
        }
    }
    if op_type == "If" {
        return eval_if(node, &inputs, env, seqs, opset, dir, depth);
    }
    let Some(convert) = converter(op_type) else {
        return Err(unsupported(node, opset));
    };
    let n = Node { proto: node, opset, inputs, dir };
    let outs = convert(&n).map_err(|e| {
        if e.message().contains(&node_label(node)) || e.message().starts_with("node `") {
            e
        } else {
            n.err(format!("{}", e))
        }
    })?;
    if outs.len() < node.output.iter().filter(|o| !o.is_empty()).count() {
        return Err(n.err(format!("produces {} output(s) but the node names {}", outs.len(), node.output.len())));
    }
    Ok(outs)
}

fn eval_if(
    node: &NodeProto,
    inputs: &[Option<Tensor>],
    env: &mut HashMap<String, Tensor>,
    seqs: &mut HashMap<String, Vec<Tensor>>,
    opset: i64,
    dir: &ExternalDataDir,
    depth: usize,
) -> Result<Vec<Tensor>> {
    let cond = inputs
        .first()
        .and_then(|c| c.as_ref())
        .ok_or_else(|| Error::argument("onnx", format!("{}: no condition", node_label(node))))?;
    if cond.is_symbolic() {
        return Err(Error::argument(
            "onnx",
            format!(
                "{}: the condition depends on a graph input's values; only `If` with a condition known at import \
                 time (folded from constants and shapes) is supported",
                node_label(node)
            ),
        ));
    }
    let branch = if cond.to_vec_f64()?.first().copied().unwrap_or(0.0) != 0.0 { "then_branch" } else { "else_branch" };
    let g = node
        .attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(branch))
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| Error::argument("onnx", format!("{}: missing `{branch}`", node_label(node))))?;
    let mut sub = env.clone();
    let mut sub_seqs = seqs.clone();
    eval_graph(g, &mut sub, &mut sub_seqs, opset, dir, depth + 1)?;
    g.output
        .iter()
        .map(|o| {
            let name = o.name.as_deref().unwrap_or("");
            sub.get(name).cloned().ok_or_else(|| {
                Error::argument("onnx", format!("{}: `{branch}` output `{name}` undefined", node_label(node)))
            })
        })
        .collect()
}

/// The error for an op without a converter: names the node, op type, domain, opset and the
/// nearest supported op.
fn unsupported(node: &NodeProto, opset: i64) -> Error {
    let op_type = node.op_type.as_deref().unwrap_or("");
    let why = match op_type {
        "Loop" | "Scan" => " (loops are not supported: export the model with the loop unrolled)",
        "SequenceMap" => " (SequenceMap runs a subgraph per element, which is not supported)",
        _ => "",
    };
    let nearest = supported_ops()
        .into_iter()
        .min_by_key(|s| edit_distance(&s.to_ascii_lowercase(), &op_type.to_ascii_lowercase()))
        .unwrap_or("");
    Error::argument(
        "onnx",
        format!(
            "{}: op `{op_type}` (domain `{}`, opset {opset}) is not supported{why}; the nearest supported op is `{nearest}` \
             (`ferrofx_onnx::supported_ops()` lists all)",
            node_label(node),
            node.domain.as_deref().unwrap_or("ai.onnx"),
        ),
    )
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

impl ModuleStructure for OnnxProgram {
    fn type_name(&self) -> &'static str {
        "OnnxModel"
    }
    fn visit_tensors(&self, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        for p in &self.params {
            f(&p.name, p.kind, &p.tensor);
        }
    }
    fn visit_tensors_mut(&mut self, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
        for p in &mut self.params {
            f(&p.name, p.kind, &mut p.tensor);
        }
    }
    fn visit_children<'a>(&'a self, _f: &mut dyn FnMut(&str, &'a dyn Module)) {}
    fn visit_children_mut(&mut self, _f: &mut dyn FnMut(&str, &mut dyn Module)) {}
    fn as_module(&self) -> &dyn Module {
        self
    }
    fn as_module_mut(&mut self) -> &mut dyn Module {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Module for OnnxProgram {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.run(&[Value::Tensor(x.clone())])?.into_iter().next() {
            Some(Value::Tensor(t)) => Ok(t),
            _ => Err(Error::argument("onnx", "the model has no tensor output")),
        }
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        self.run(inputs)
    }
}
