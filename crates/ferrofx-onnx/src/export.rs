//! [`GraphModule`] → ONNX (default opset 18).
//!
//! The module is first re-traced with example inputs and no leaf modules, so built-in layers
//! (`Conv2d`, `BatchNorm2d`...) become the registry ops they call and every node has its shape
//! (`tensor_meta`, as ShapeProp would give). Each node then becomes ONNX nodes: registry ops
//! map to their ONNX equivalents (arguments read by the op's schema), `get_attr` tensors become
//! initializers named by their path, placeholders the graph inputs (dim 0 symbolic with
//! [`ExportOptions::dynamic_batch`]). An op without an ONNX equivalent is refused by name.

use crate::builder::{attr_float, attr_int, attr_ints, model, node, value_info};
use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use crate::tensor_proto::{dtype_to_onnx, tensor_to_proto};
use ferrofx_core::op::{Default as D, OpDef};
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use ferrofx_fx::graph::{Argument, Node, NodeId, Opcode, Target};
use ferrofx_fx::{GraphModule, Tracer};
use std::collections::HashMap;
use std::path::Path;

/// The oldest opset [`export`] writes.
pub const MIN_EXPORT_OPSET: i64 = 18;
/// The newest opset [`export`] writes (the ops it emits did not change meaning from 18 to it).
pub const MAX_EXPORT_OPSET: i64 = 21;

/// Options of [`export`].
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// The default-domain opset written (18 by default; [`MIN_EXPORT_OPSET`] to
    /// [`MAX_EXPORT_OPSET`]).
    pub opset: i64,
    /// Make dim 0 of every input and output symbolic (`batch`).
    pub dynamic_batch: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions { opset: 18, dynamic_batch: false }
    }
}

/// Exports `gm` run on `inputs` as an ONNX model.
///
/// ```no_run
/// # fn demo(gm: &ferrofx_fx::GraphModule, x: ferrofx_core::Tensor) -> ferrofx_core::Result<()> {
/// let model = ferrofx_onnx::export(gm, &[x], &ferrofx_onnx::ExportOptions::default())?;
/// ferrofx_onnx::export::save(&model, "model.onnx")?;
/// # Ok(()) }
/// ```
pub fn export(gm: &GraphModule, inputs: &[Tensor], options: &ExportOptions) -> Result<ModelProto> {
    if !(MIN_EXPORT_OPSET..=MAX_EXPORT_OPSET).contains(&options.opset) {
        return Err(Error::argument(
            "onnx export",
            format!(
                "opset {} is not supported: ferrofx writes opsets {MIN_EXPORT_OPSET} to {MAX_EXPORT_OPSET} (opset 18 \
                 moved the reduction axes to an input; the ops written mean the same in 18 to {MAX_EXPORT_OPSET})",
                options.opset
            ),
        ));
    }
    let examples: Vec<Value> = inputs.iter().cloned().map(Value::Tensor).collect();
    let names: Vec<String> =
        gm.graph().iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.name().to_string()).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let flat = Tracer::new().is_leaf_module(|_, _| false).input_names(&refs).trace_with_inputs(gm, &examples)?;
    let mut ex = Exporter {
        nodes: vec![],
        inits: vec![],
        outs: HashMap::new(),
        dtypes: HashMap::new(),
        shapes: HashMap::new(),
        n_const: 0,
        dynamic: options.dynamic_batch,
    };
    let mut graph_inputs = Vec::new();
    let mut graph_outputs = Vec::new();
    let mut value_infos = Vec::new();
    let g = flat.graph();
    for n in g.iter() {
        let name = n.name().to_string();
        let meta = n.meta().tensor_meta.as_ref();
        if let Some(m) = meta {
            ex.dtypes.insert(n.id(), m.dtype);
            ex.shapes.insert(n.id(), m.shape.clone());
        }
        match n.op() {
            Opcode::Placeholder => {
                let m = meta.ok_or_else(|| Error::argument("onnx export", format!("input `{name}` has no shape")))?;
                graph_inputs.push(ex.value_info(&name, m.dtype, &m.shape));
                ex.outs.insert(n.id(), vec![name]);
            }
            Opcode::GetAttr => {
                let Target::Str(path) = n.target() else { continue };
                let t = flat
                    .attributes()
                    .get(path)
                    .map(|e| e.tensor.clone())
                    .ok_or_else(|| Error::argument("onnx export", format!("get_attr `{path}` has no tensor")))?;
                ex.inits.push(tensor_to_proto(&t, path)?);
                ex.dtypes.insert(n.id(), t.dtype());
                ex.shapes.insert(n.id(), t.shape().to_vec());
                ex.outs.insert(n.id(), vec![path.clone()]);
            }
            Opcode::CallFunction | Opcode::CallMethod => {
                let op = match n.target() {
                    Target::Op(op) => *op,
                    Target::Str(m) => ferrofx_core::op::lookup(m).ok_or_else(|| {
                        Error::argument("onnx export", format!("node `{name}`: method `{m}` is not a registry op"))
                    })?,
                    Target::Function(f) => {
                        return Err(Error::argument(
                            "onnx export",
                            format!("node `{name}` calls user function `{}`, which has no ONNX equivalent", f.name()),
                        ))
                    }
                };
                ex.node(&n, op).map_err(|e| {
                    Error::argument("onnx export", format!("node `{name}` ({}): {}", op.name, e.message()))
                })?;
                if let (Some(m), false) = (meta, options.dynamic_batch) {
                    value_infos.push(ex.value_info(&name, m.dtype, &m.shape));
                }
            }
            Opcode::CallModule => {
                return Err(Error::argument(
                    "onnx export",
                    format!("node `{name}` calls module `{}`, which could not be traced through", n.target()),
                ))
            }
            Opcode::Output => {
                let mut outs = vec![];
                match n.args().first() {
                    Some(Argument::Tuple(items)) | Some(Argument::List(items)) => outs.extend(items.iter().cloned()),
                    Some(a) => outs.push(a.clone()),
                    None => {}
                }
                for (i, a) in outs.iter().enumerate() {
                    let Argument::Node(id) = a else {
                        return Err(Error::argument("onnx export", format!("output {i} is not a tensor")));
                    };
                    let src = ex.name_of(*id)?;
                    let out_name = if outs.len() == 1 { "output".to_string() } else { format!("output_{i}") };
                    ex.nodes.push(node("Identity", &out_name, &[&src], &[&out_name], vec![]));
                    let m = g
                        .node(*id)
                        .ok()
                        .and_then(|n| n.meta().tensor_meta.clone())
                        .ok_or_else(|| Error::argument("onnx export", format!("output {i} has no shape")))?;
                    graph_outputs.push(ex.value_info(&out_name, m.dtype, &m.shape));
                }
            }
        }
    }
    let graph = GraphProto {
        name: Some(gm.traced_type_name().to_string()),
        node: ex.nodes,
        initializer: ex.inits,
        input: graph_inputs,
        output: graph_outputs,
        value_info: value_infos,
        ..Default::default()
    };
    Ok(model(graph, options.opset))
}

/// Writes a model to `path`.
pub fn save(model: &ModelProto, path: impl AsRef<Path>) -> Result<()> {
    use prost::Message;
    std::fs::write(path.as_ref(), model.encode_to_vec())
        .map_err(|e| Error::io("onnx export", format!("{}: {e}", path.as_ref().display())))
}

struct Exporter {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    outs: HashMap<NodeId, Vec<String>>,
    dtypes: HashMap<NodeId, DType>,
    shapes: HashMap<NodeId, Vec<usize>>,
    n_const: usize,
    dynamic: bool,
}

/// A node's arguments read by its op's schema (positional, keyword or default).
struct Args<'a, 'g> {
    n: &'a Node<'g>,
    op: &'static OpDef,
}

impl Args<'_, '_> {
    fn get(&self, name: &str) -> Option<Argument> {
        let pos = self.op.schema.iter().position(|s| s.name == name)?;
        if let Some(a) = self.n.args().get(pos) {
            if !self.op.schema[pos].kwarg_only {
                return Some(a.clone());
            }
        }
        if let Some(a) = self.n.kwargs().get(name) {
            return Some(a.clone());
        }
        Some(match self.op.schema[pos].default {
            D::Bool(b) => Argument::Bool(b),
            D::Int(i) => Argument::Int(i),
            D::Float(f) => Argument::Float(f),
            D::Str(s) => Argument::Str(s.into()),
            D::Ints(v) => Argument::List(v.iter().map(|&i| Argument::Int(i)).collect()),
            _ => Argument::None,
        })
    }
    fn int(&self, name: &str) -> Result<i64> {
        match self.get(name) {
            Some(Argument::Int(i)) => Ok(i),
            Some(Argument::Bool(b)) => Ok(b as i64),
            other => Err(Error::argument(self.op.name, format!("`{name}` must be an int, got {other:?}"))),
        }
    }
    fn float(&self, name: &str) -> Result<f64> {
        match self.get(name) {
            Some(Argument::Float(f)) => Ok(f),
            Some(Argument::Int(i)) => Ok(i as f64),
            other => Err(Error::argument(self.op.name, format!("`{name}` must be a number, got {other:?}"))),
        }
    }
    fn boolean(&self, name: &str) -> bool {
        matches!(self.get(name), Some(Argument::Bool(true)))
    }
    fn ints(&self, name: &str) -> Result<Vec<i64>> {
        match self.get(name) {
            Some(Argument::List(v)) | Some(Argument::Tuple(v)) => v
                .iter()
                .map(|a| match a {
                    Argument::Int(i) => Ok(*i),
                    other => Err(Error::argument(self.op.name, format!("`{name}` must be ints, got {other:?}"))),
                })
                .collect(),
            Some(Argument::Int(i)) => Ok(vec![i]),
            Some(Argument::None) | None => Ok(vec![]),
            other => Err(Error::argument(self.op.name, format!("`{name}` must be ints, got {other:?}"))),
        }
    }
}

fn shape_of(n: &Node<'_>) -> Result<Vec<usize>> {
    n.meta().tensor_meta.as_ref().map(|m| m.shape.clone()).ok_or_else(|| Error::argument("onnx export", "no shape"))
}

impl Exporter {
    fn value_info(&self, name: &str, dtype: DType, shape: &[usize]) -> ValueInfoProto {
        let dims: Vec<Option<i64>> = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if self.dynamic && i == 0 { None } else { Some(d as i64) })
            .collect();
        value_info(name, dtype_to_onnx(dtype), &dims, "batch")
    }

    fn name_of(&self, id: NodeId) -> Result<String> {
        self.outs
            .get(&id)
            .and_then(|v| v.first().cloned())
            .ok_or_else(|| Error::argument("onnx export", "a node uses a value that has no ONNX name"))
    }

    fn konst(&mut self, t: Tensor) -> Result<String> {
        self.n_const += 1;
        let name = format!("_const_{}", self.n_const);
        self.inits.push(tensor_to_proto(&t, &name)?);
        Ok(name)
    }

    fn ints_const(&mut self, v: &[i64]) -> Result<String> {
        self.konst(Tensor::from_vec(v.to_vec(), &[v.len()])?)
    }

    /// A tensor argument: a node's value, or a number as a constant of `dtype`.
    fn value(&mut self, a: &Argument, dtype: DType) -> Result<String> {
        match a {
            Argument::Node(id) => self.name_of(*id),
            Argument::Int(i) => self.scalar(*i as f64, dtype),
            Argument::Float(f) => self.scalar(*f, dtype),
            Argument::Bool(b) => self.scalar(*b as i64 as f64, dtype),
            other => Err(Error::argument("onnx export", format!("expected a tensor, got {other:?}"))),
        }
    }

    fn scalar(&mut self, v: f64, dtype: DType) -> Result<String> {
        let t = Tensor::scalar(v);
        let t = ferrofx_core::op::call("to", vec![Value::Tensor(t), Value::DType(dtype)], vec![])?
            .into_iter()
            .next()
            .ok_or_else(|| Error::schema("to", "no output"))?;
        self.konst(t)
    }

    fn emit(&mut self, op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) {
        self.nodes.push(node(op, name, inputs, outputs, attrs));
    }

    fn tmp(&mut self, base: &str) -> String {
        self.n_const += 1;
        format!("{base}__{}", self.n_const)
    }

    fn reshape_to(&mut self, name: &str, x: &str, shape: &[usize], out: &str) -> Result<()> {
        let mut s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        if self.dynamic && !s.is_empty() {
            s[0] = -1;
        }
        let sh = self.ints_const(&s)?;
        self.emit("Reshape", name, &[x, &sh], &[out], vec![]);
        Ok(())
    }

    fn node(&mut self, n: &Node<'_>, op: &'static OpDef) -> Result<()> {
        let name = n.name().to_string();
        let a = Args { n, op };
        let dtype = n.meta().tensor_meta.as_ref().map(|m| m.dtype).unwrap_or(DType::F32);
        let input_dtype = match a.get("input").or_else(|| n.args().first().cloned()) {
            Some(Argument::Node(id)) => self.dtypes.get(&id).copied().unwrap_or(dtype),
            _ => dtype,
        };
        let x = |s: &mut Self, arg: &str| -> Result<String> {
            let v = a.get(arg).ok_or_else(|| Error::argument(op.name, format!("no argument `{arg}`")))?;
            s.value(&v, input_dtype)
        };
        let out = name.clone();
        self.outs.insert(n.id(), vec![out.clone()]);
        let unary = |s: &mut Self, onnx: &str| -> Result<()> {
            let i = x(s, "input")?;
            s.emit(onnx, &name, &[&i], &[&out], vec![]);
            Ok(())
        };
        match op.name {
            "getitem" => {
                let (Some(Argument::Node(src)), Some(Argument::Int(i))) = (n.args().first(), n.args().get(1)) else {
                    return Err(Error::argument("getitem", "expected (node, index)"));
                };
                let outs = self.outs.get(src).cloned().unwrap_or_default();
                let v = outs
                    .get(*i as usize)
                    .cloned()
                    .ok_or_else(|| Error::argument("getitem", format!("no output {i}")))?;
                self.outs.insert(n.id(), vec![v]);
            }
            "add" | "sub" | "mul" | "div" | "rsub" => {
                let l = x(self, "input")?;
                let mut r = x(self, "other")?;
                if matches!(op.name, "add" | "sub" | "rsub") {
                    let alpha = a.float("alpha").unwrap_or(1.0);
                    if alpha != 1.0 {
                        let c = self.scalar(alpha, dtype)?;
                        let t = self.tmp(&name);
                        self.emit("Mul", &t, &[&r, &c], &[&t], vec![]);
                        r = t;
                    }
                }
                if op.name == "div" && !matches!(a.get("rounding_mode"), Some(Argument::None) | None) {
                    return Err(Error::argument("div", "rounding_mode has no single ONNX equivalent"));
                }
                let (onnx, ins) = match op.name {
                    "add" => ("Add", [l, r]),
                    "sub" => ("Sub", [l, r]),
                    "rsub" => ("Sub", [r, l]),
                    "mul" => ("Mul", [l, r]),
                    _ => ("Div", [l, r]),
                };
                self.emit(onnx, &name, &[&ins[0], &ins[1]], &[&out], vec![]);
            }
            "maximum" | "minimum" | "pow" | "eq" | "lt" | "le" | "gt" | "ge" | "logical_and" | "logical_or"
            | "logical_xor" => {
                let l = x(self, "input")?;
                let other = if op.name == "pow" { "exponent" } else { "other" };
                let r = x(self, other)?;
                let onnx = match op.name {
                    "maximum" => "Max",
                    "minimum" => "Min",
                    "pow" => "Pow",
                    "eq" => "Equal",
                    "lt" => "Less",
                    "le" => "LessOrEqual",
                    "gt" => "Greater",
                    "ge" => "GreaterOrEqual",
                    "logical_and" => "And",
                    "logical_or" => "Or",
                    _ => "Xor",
                };
                self.emit(onnx, &name, &[&l, &r], &[&out], vec![]);
            }
            "ne" => {
                let l = x(self, "input")?;
                let r = x(self, "other")?;
                let t = self.tmp(&name);
                self.emit("Equal", &t, &[&l, &r], &[&t], vec![]);
                self.emit("Not", &name, &[&t], &[&out], vec![]);
            }
            "neg" => unary(self, "Neg")?,
            "abs" => unary(self, "Abs")?,
            "exp" => unary(self, "Exp")?,
            "log" => unary(self, "Log")?,
            "sqrt" => unary(self, "Sqrt")?,
            "reciprocal" => unary(self, "Reciprocal")?,
            "floor" => unary(self, "Floor")?,
            "ceil" => unary(self, "Ceil")?,
            "round" => unary(self, "Round")?,
            "sign" => unary(self, "Sign")?,
            "sin" => unary(self, "Sin")?,
            "cos" => unary(self, "Cos")?,
            "tan" => unary(self, "Tan")?,
            "atan" => unary(self, "Atan")?,
            "tanh" => unary(self, "Tanh")?,
            "sigmoid" => unary(self, "Sigmoid")?,
            "relu" => unary(self, "Relu")?,
            "erf" => unary(self, "Erf")?,
            "softsign" => unary(self, "Softsign")?,
            "hardswish" => unary(self, "HardSwish")?,
            "logical_not" => unary(self, "Not")?,
            "contiguous" | "clone" | "dropout" | "alias" => unary(self, "Identity")?,
            "rsqrt" => {
                let i = x(self, "input")?;
                let t = self.tmp(&name);
                self.emit("Sqrt", &t, &[&i], &[&t], vec![]);
                self.emit("Reciprocal", &name, &[&t], &[&out], vec![]);
            }
            "hardsigmoid" => {
                let i = x(self, "input")?;
                self.emit(
                    "HardSigmoid",
                    &name,
                    &[&i],
                    &[&out],
                    vec![attr_float("alpha", 1.0 / 6.0), attr_float("beta", 0.5)],
                );
            }
            "silu" => {
                let i = x(self, "input")?;
                let t = self.tmp(&name);
                self.emit("Sigmoid", &t, &[&i], &[&t], vec![]);
                self.emit("Mul", &name, &[&i, &t], &[&out], vec![]);
            }
            "gelu" => {
                let i = x(self, "input")?;
                let approx = matches!(a.get("approximate"), Some(Argument::Str(s)) if &*s == "tanh");
                let half = self.scalar(0.5, dtype)?;
                let one = self.scalar(1.0, dtype)?;
                let inner = self.tmp(&name);
                if approx {
                    // 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))
                    let c3 = self.scalar(0.044715, dtype)?;
                    let k = self.scalar((2.0 / std::f64::consts::PI).sqrt(), dtype)?;
                    let (x2, x3, p, s, t) =
                        (self.tmp(&name), self.tmp(&name), self.tmp(&name), self.tmp(&name), self.tmp(&name));
                    self.emit("Mul", &x2, &[&i, &i], &[&x2], vec![]);
                    self.emit("Mul", &x3, &[&x2, &i], &[&x3], vec![]);
                    self.emit("Mul", &p, &[&x3, &c3], &[&p], vec![]);
                    self.emit("Add", &s, &[&p, &i], &[&s], vec![]);
                    self.emit("Mul", &t, &[&s, &k], &[&t], vec![]);
                    self.emit("Tanh", &inner, &[&t], &[&inner], vec![]);
                } else {
                    let r2 = self.scalar(std::f64::consts::FRAC_1_SQRT_2, dtype)?;
                    let t = self.tmp(&name);
                    self.emit("Mul", &t, &[&i, &r2], &[&t], vec![]);
                    self.emit("Erf", &inner, &[&t], &[&inner], vec![]);
                }
                let (p1, h) = (self.tmp(&name), self.tmp(&name));
                self.emit("Add", &p1, &[&inner, &one], &[&p1], vec![]);
                self.emit("Mul", &h, &[&i, &half], &[&h], vec![]);
                self.emit("Mul", &name, &[&h, &p1], &[&out], vec![]);
            }
            "leaky_relu" => {
                let i = x(self, "input")?;
                self.emit(
                    "LeakyRelu",
                    &name,
                    &[&i],
                    &[&out],
                    vec![attr_float("alpha", a.float("negative_slope")? as f32)],
                );
            }
            "elu" => {
                let i = x(self, "input")?;
                self.emit("Elu", &name, &[&i], &[&out], vec![attr_float("alpha", a.float("alpha")? as f32)]);
            }
            "relu6" | "hardtanh" | "clamp" => {
                let i = x(self, "input")?;
                let (lo, hi) = match op.name {
                    "relu6" => (Argument::Float(0.0), Argument::Float(6.0)),
                    "hardtanh" => (
                        a.get("min_val").unwrap_or(Argument::Float(-1.0)),
                        a.get("max_val").unwrap_or(Argument::Float(1.0)),
                    ),
                    _ => (a.get("min").unwrap_or(Argument::None), a.get("max").unwrap_or(Argument::None)),
                };
                let lo = if matches!(lo, Argument::None) { String::new() } else { self.value(&lo, dtype)? };
                let hi = if matches!(hi, Argument::None) { String::new() } else { self.value(&hi, dtype)? };
                self.emit("Clip", &name, &[&i, &lo, &hi], &[&out], vec![]);
            }
            "where" => {
                let c = x(self, "condition")?;
                let l = x(self, "input")?;
                let r = x(self, "other")?;
                self.emit("Where", &name, &[&c, &l, &r], &[&out], vec![]);
            }
            "masked_fill" => {
                let i = x(self, "input")?;
                let m = x(self, "mask")?;
                let v = self.value(&a.get("value").unwrap_or(Argument::Float(0.0)), dtype)?;
                self.emit("Where", &name, &[&m, &v, &i], &[&out], vec![]);
            }
            "matmul" | "mm" | "bmm" => {
                let l = x(self, "input")?;
                let r = x(self, if op.name == "matmul" { "other" } else { "mat2" })?;
                self.emit("MatMul", &name, &[&l, &r], &[&out], vec![]);
            }
            "linear" => {
                let i = x(self, "input")?;
                let w = x(self, "weight")?;
                let b = match a.get("bias") {
                    Some(Argument::None) | None => String::new(),
                    Some(b) => self.value(&b, dtype)?,
                };
                let in_rank = match a.get("input") {
                    Some(Argument::Node(id)) => self.rank_of(n, id),
                    _ => 0,
                };
                if in_rank == 2 {
                    self.emit("Gemm", &name, &[&i, &w, &b], &[&out], vec![attr_int("transB", 1)]);
                } else {
                    let wt = self.tmp(&name);
                    self.emit("Transpose", &wt, &[&w], &[&wt], vec![attr_ints("perm", &[1, 0])]);
                    if b.is_empty() {
                        self.emit("MatMul", &name, &[&i, &wt], &[&out], vec![]);
                    } else {
                        let mm = self.tmp(&name);
                        self.emit("MatMul", &mm, &[&i, &wt], &[&mm], vec![]);
                        self.emit("Add", &name, &[&mm, &b], &[&out], vec![]);
                    }
                }
            }
            "addmm" => {
                let c = x(self, "input")?;
                let m1 = x(self, "mat1")?;
                let m2 = x(self, "mat2")?;
                let attrs =
                    vec![attr_float("alpha", a.float("alpha")? as f32), attr_float("beta", a.float("beta")? as f32)];
                self.emit("Gemm", &name, &[&m1, &m2, &c], &[&out], attrs);
            }
            "conv1d" | "conv2d" | "conv_transpose2d" => {
                let i = x(self, "input")?;
                let w = x(self, "weight")?;
                let b = match a.get("bias") {
                    Some(Argument::None) | None => String::new(),
                    Some(b) => self.value(&b, dtype)?,
                };
                let k = if op.name == "conv1d" { 1 } else { 2 };
                let stride = fill(a.ints("stride")?, k, 1);
                let dilation = fill(a.ints("dilation")?, k, 1);
                let mut attrs = vec![
                    attr_ints("strides", &stride),
                    attr_ints("dilations", &dilation),
                    attr_int("group", a.int("groups")?),
                ];
                match a.get("padding") {
                    Some(Argument::Str(s)) if &*s == "same" => {
                        attrs.push(crate::builder::attr_str("auto_pad", "SAME_UPPER"))
                    }
                    Some(Argument::Str(s)) if &*s == "valid" => {}
                    _ => {
                        let p = fill(a.ints("padding")?, k, 0);
                        attrs.push(attr_ints("pads", &[p.clone(), p].concat()));
                    }
                }
                let onnx = if op.name == "conv_transpose2d" {
                    attrs.push(attr_ints("output_padding", &fill(a.ints("output_padding")?, k, 0)));
                    "ConvTranspose"
                } else {
                    "Conv"
                };
                self.emit(onnx, &name, &[&i, &w, &b], &[&out], attrs);
            }
            "batch_norm" => {
                if a.boolean("training") {
                    return Err(Error::argument(
                        "batch_norm",
                        "training mode has no inference ONNX equivalent: call eval() first",
                    ));
                }
                let i = x(self, "input")?;
                let mean = x(self, "running_mean")?;
                let var = x(self, "running_var")?;
                let c = match a.get("running_mean") {
                    Some(Argument::Node(id)) => self.shape_of_id(n, id)?.first().copied().unwrap_or(1),
                    _ => 1,
                };
                let w = self.opt_or_fill(&a, "weight", 1.0, c, dtype)?;
                let b = self.opt_or_fill(&a, "bias", 0.0, c, dtype)?;
                self.emit(
                    "BatchNormalization",
                    &name,
                    &[&i, &w, &b, &mean, &var],
                    &[&out],
                    vec![attr_float("epsilon", a.float("eps")? as f32)],
                );
            }
            "layer_norm" => {
                let i = x(self, "input")?;
                let ns = a.ints("normalized_shape")?;
                let c: usize = ns.iter().product::<i64>() as usize;
                let w = self.opt_or_fill(&a, "weight", 1.0, c, dtype)?;
                let b = self.opt_or_fill(&a, "bias", 0.0, c, dtype)?;
                let attrs = vec![attr_int("axis", -(ns.len() as i64)), attr_float("epsilon", a.float("eps")? as f32)];
                self.emit("LayerNormalization", &name, &[&i, &w, &b], &[&out], attrs);
            }
            "max_pool1d" | "max_pool2d" | "avg_pool1d" | "avg_pool2d" => {
                let i = x(self, "input")?;
                let k = if op.name.ends_with("1d") { 1 } else { 2 };
                let kernel = fill(a.ints("kernel_size")?, k, 1);
                let stride = a.ints("stride")?;
                let stride = if stride.is_empty() { kernel.clone() } else { fill(stride, k, 1) };
                let p = fill(a.ints("padding")?, k, 0);
                let mut attrs = vec![
                    attr_ints("kernel_shape", &kernel),
                    attr_ints("strides", &stride),
                    attr_ints("pads", &[p.clone(), p].concat()),
                    attr_int("ceil_mode", a.boolean("ceil_mode") as i64),
                ];
                let onnx = if op.name.starts_with("max") {
                    attrs.push(attr_ints("dilations", &fill(a.ints("dilation")?, k, 1)));
                    "MaxPool"
                } else {
                    if !matches!(a.get("divisor_override"), Some(Argument::None) | None) {
                        return Err(Error::argument(op.name, "divisor_override has no ONNX equivalent"));
                    }
                    attrs.push(attr_int("count_include_pad", a.boolean("count_include_pad") as i64));
                    "AveragePool"
                };
                self.emit(onnx, &name, &[&i], &[&out], attrs);
            }
            "adaptive_avg_pool2d" | "adaptive_max_pool2d" => {
                let i = x(self, "input")?;
                let os = fill(a.ints("output_size")?, 2, 1);
                let in_shape = match a.get("input") {
                    Some(Argument::Node(id)) => self.shape_of_id(n, id)?,
                    _ => vec![],
                };
                let avg = op.name.contains("avg");
                if os == [1, 1] {
                    self.emit(if avg { "GlobalAveragePool" } else { "GlobalMaxPool" }, &name, &[&i], &[&out], vec![]);
                } else if in_shape.len() == 4 && in_shape[2] as i64 % os[0] == 0 && in_shape[3] as i64 % os[1] == 0 {
                    let kernel = [in_shape[2] as i64 / os[0], in_shape[3] as i64 / os[1]];
                    let attrs = vec![attr_ints("kernel_shape", &kernel), attr_ints("strides", &kernel)];
                    self.emit(if avg { "AveragePool" } else { "MaxPool" }, &name, &[&i], &[&out], attrs);
                } else {
                    return Err(Error::argument(
                        op.name,
                        format!("output size {os:?} does not divide the input {in_shape:?}"),
                    ));
                }
            }
            "flatten" | "reshape" | "view" | "squeeze" | "unsqueeze" | "unflatten" => {
                let i = x(self, "input")?;
                let shape = shape_of(n)?;
                self.reshape_to(&name, &i, &shape, &out)?;
            }
            "expand" => {
                let i = x(self, "input")?;
                let shape: Vec<i64> = shape_of(n)?.iter().map(|&d| d as i64).collect();
                let s = self.ints_const(&shape)?;
                self.emit("Expand", &name, &[&i, &s], &[&out], vec![]);
            }
            "permute" => {
                let i = x(self, "input")?;
                let dims = a.ints("dims")?;
                let r = dims.len() as i64;
                let perm: Vec<i64> = dims.iter().map(|&d| if d < 0 { d + r } else { d }).collect();
                self.emit("Transpose", &name, &[&i], &[&out], vec![attr_ints("perm", &perm)]);
            }
            "transpose" | "t" => {
                let i = x(self, "input")?;
                let r = shape_of(n)?.len() as i64;
                let (d0, d1) = if op.name == "t" { (0, 1) } else { (a.int("dim0")?, a.int("dim1")?) };
                let (d0, d1) = ((d0 + r) % r.max(1), (d1 + r) % r.max(1));
                let mut perm: Vec<i64> = (0..r).collect();
                perm.swap(d0 as usize, d1 as usize);
                self.emit("Transpose", &name, &[&i], &[&out], vec![attr_ints("perm", &perm)]);
            }
            "scaled_dot_product_attention" => self.attention(n, &a, &name, dtype)?,
            "softmax" | "log_softmax" => {
                let i = x(self, "input")?;
                let onnx = if op.name == "softmax" { "Softmax" } else { "LogSoftmax" };
                self.emit(onnx, &name, &[&i], &[&out], vec![attr_int("axis", a.int("dim")?)]);
            }
            "mean" | "sum" | "amax" | "amin" => {
                let i = x(self, "input")?;
                let dims = a.ints("dim")?;
                let onnx = match op.name {
                    "mean" => "ReduceMean",
                    "sum" => "ReduceSum",
                    "amax" => "ReduceMax",
                    _ => "ReduceMin",
                };
                let keep = a.boolean("keepdim") as i64;
                if dims.is_empty() {
                    self.emit(onnx, &name, &[&i], &[&out], vec![attr_int("keepdims", keep)]);
                } else {
                    let ax = self.ints_const(&dims)?;
                    self.emit(onnx, &name, &[&i, &ax], &[&out], vec![attr_int("keepdims", keep)]);
                }
            }
            "cat" | "stack" => {
                let Some(Argument::List(items)) = a.get("tensors") else {
                    return Err(Error::argument(op.name, "expected a tensor list"));
                };
                let mut names = Vec::new();
                let dim = a.int("dim")?;
                let r = shape_of(n)?.len() as i64;
                let axis = if dim < 0 { dim + r } else { dim };
                for it in items.iter() {
                    let v = self.value(it, dtype)?;
                    if op.name == "stack" {
                        let ax = self.ints_const(&[axis])?;
                        let t = self.tmp(&name);
                        self.emit("Unsqueeze", &t, &[&v, &ax], &[&t], vec![]);
                        names.push(t);
                    } else {
                        names.push(v);
                    }
                }
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                self.emit("Concat", &name, &refs, &[&out], vec![attr_int("axis", axis)]);
            }
            "split" | "split_with_sizes" | "chunk" | "unbind" => {
                let i = x(self, "input")?;
                let users: Vec<NodeId> = n.users().collect();
                let in_shape = match a.get("input") {
                    Some(Argument::Node(id)) => self.shape_of_id(n, id)?,
                    _ => vec![],
                };
                let dim = a.int("dim").unwrap_or(0);
                let axis = if dim < 0 { dim + in_shape.len() as i64 } else { dim };
                let d = in_shape.get(axis as usize).copied().unwrap_or(0) as i64;
                let sizes: Vec<i64> = match op.name {
                    "split_with_sizes" => a.ints("split_sizes")?,
                    "unbind" => vec![1; d as usize],
                    "chunk" => {
                        let c = a.int("chunks")?;
                        let each = (d + c - 1) / c.max(1);
                        let mut v = vec![];
                        let mut left = d;
                        while left > 0 {
                            v.push(each.min(left));
                            left -= each;
                        }
                        v
                    }
                    _ => {
                        let s = a
                            .int("split_size")
                            .or_else(|_| a.ints("split_size").map(|v| v.first().copied().unwrap_or(1)))?;
                        let mut v = vec![];
                        let mut left = d;
                        while left > 0 {
                            v.push(s.min(left));
                            left -= s;
                        }
                        v
                    }
                };
                let _ = users;
                let outs: Vec<String> = (0..sizes.len()).map(|k| format!("{name}__{k}")).collect();
                let sz = self.ints_const(&sizes)?;
                let refs: Vec<&str> = outs.iter().map(String::as_str).collect();
                if op.name == "unbind" {
                    let mids: Vec<String> = (0..sizes.len()).map(|k| format!("{name}__u{k}")).collect();
                    let mrefs: Vec<&str> = mids.iter().map(String::as_str).collect();
                    self.emit("Split", &name, &[&i, &sz], &mrefs, vec![attr_int("axis", axis)]);
                    let ax = self.ints_const(&[axis])?;
                    for (m, o) in mids.iter().zip(&outs) {
                        self.emit("Squeeze", o, &[m, &ax], &[o], vec![]);
                    }
                } else {
                    self.emit("Split", &name, &[&i, &sz], &refs, vec![attr_int("axis", axis)]);
                }
                self.outs.insert(n.id(), outs);
            }
            "index_select" | "embedding" => {
                let (src, idx, axis) = if op.name == "embedding" {
                    (x(self, "weight")?, x(self, "input")?, 0)
                } else {
                    (x(self, "input")?, x(self, "index")?, a.int("dim")?)
                };
                self.emit("Gather", &name, &[&src, &idx], &[&out], vec![attr_int("axis", axis)]);
            }
            "select" => {
                let i = x(self, "input")?;
                let idx = self.konst(Tensor::scalar(a.int("index")?))?;
                self.emit("Gather", &name, &[&i, &idx], &[&out], vec![attr_int("axis", a.int("dim")?)]);
            }
            "slice" | "narrow" => {
                let i = x(self, "input")?;
                let dim = a.int("dim")?;
                let (start, end, step) = if op.name == "narrow" {
                    let s = a.int("start")?;
                    (s, s + a.int("length")?, 1)
                } else {
                    let s = match a.get("start") {
                        Some(Argument::Int(v)) => v,
                        _ => 0,
                    };
                    let e = match a.get("end") {
                        Some(Argument::Int(v)) => v,
                        _ => i64::MAX,
                    };
                    (s, e, a.int("step").unwrap_or(1))
                };
                let (s, e, ax, st) = (
                    self.ints_const(&[start])?,
                    self.ints_const(&[end])?,
                    self.ints_const(&[dim])?,
                    self.ints_const(&[step])?,
                );
                self.emit("Slice", &name, &[&i, &s, &e, &ax, &st], &[&out], vec![]);
            }
            "gather" => {
                let i = x(self, "input")?;
                let idx = x(self, "index")?;
                self.emit("GatherElements", &name, &[&i, &idx], &[&out], vec![attr_int("axis", a.int("dim")?)]);
            }
            "to" => {
                let i = x(self, "input")?;
                let to = match a.get("dtype") {
                    Some(Argument::DType(d)) => d,
                    _ => dtype,
                };
                self.emit("Cast", &name, &[&i], &[&out], vec![attr_int("to", dtype_to_onnx(to) as i64)]);
            }
            "pad" => {
                let i = x(self, "input")?;
                let p = a.ints("pad")?;
                let r = shape_of(n)?.len();
                let mut begins = vec![0i64; r];
                let mut ends = vec![0i64; r];
                for (k, pair) in p.chunks(2).enumerate() {
                    let d = r - 1 - k;
                    begins[d] = pair[0];
                    ends[d] = *pair.get(1).unwrap_or(&0);
                }
                let mode = match a.get("mode") {
                    Some(Argument::Str(s)) => match &*s {
                        "reflect" => "reflect",
                        "replicate" => "edge",
                        "circular" => "wrap",
                        _ => "constant",
                    },
                    _ => "constant",
                };
                let pads = self.ints_const(&[begins, ends].concat())?;
                let v = match a.get("value") {
                    Some(Argument::Float(f)) => self.scalar(f, dtype)?,
                    _ => String::new(),
                };
                self.emit("Pad", &name, &[&i, &pads, &v], &[&out], vec![crate::builder::attr_str("mode", mode)]);
            }
            other => {
                return Err(Error::argument(
                    other,
                    format!("registry op `{other}` has no ONNX equivalent in the exporter (opset 18)"),
                ))
            }
        }
        Ok(())
    }

    /// `scaled_dot_product_attention` as opset-17 ops (ONNX's `Attention` op needs opset 23):
    /// `Softmax(MatMul(q, kᵀ) · scale + mask) @ v`, a boolean or causal mask as `Where(mask,
    /// scores, -inf)` (PyTorch's convention: true where a query may attend a key), a float mask
    /// added to the scores.
    fn attention(&mut self, n: &Node<'_>, a: &Args<'_, '_>, name: &str, dtype: DType) -> Result<()> {
        const OP: &str = "scaled_dot_product_attention";
        let shape_arg = |s: &Self, arg: &str| -> Result<Vec<usize>> {
            match a.get(arg) {
                Some(Argument::Node(id)) => s.shape_of_id(n, id),
                _ => Err(Error::argument(OP, format!("`{arg}` must be a tensor of the graph"))),
            }
        };
        let (qs, ks) = (shape_arg(self, "query")?, shape_arg(self, "key")?);
        if qs.len() < 2 || ks.len() < 2 {
            return Err(Error::argument(OP, format!("query {qs:?} and key {ks:?} need at least 2 dimensions")));
        }
        let (l, s_len, e) = (qs[qs.len() - 2], ks[ks.len() - 2], qs[qs.len() - 1]);
        if a.float("dropout_p")? != 0.0 {
            return Err(Error::argument(OP, "dropout_p != 0 has no inference equivalent in ONNX; export in eval mode"));
        }
        let (q, k, v) = (
            self.value(&a.get("query").unwrap_or(Argument::None), dtype)?,
            self.value(&a.get("key").unwrap_or(Argument::None), dtype)?,
            self.value(&a.get("value").unwrap_or(Argument::None), dtype)?,
        );
        let scale = match a.get("scale") {
            Some(Argument::Float(f)) => f,
            _ => 1.0 / (e as f64).sqrt(),
        };
        let r = ks.len() as i64;
        let mut perm: Vec<i64> = (0..r).collect();
        perm.swap(r as usize - 1, r as usize - 2);
        let kt = self.tmp(name);
        self.emit("Transpose", &kt, &[&k], &[&kt], vec![attr_ints("perm", &perm)]);
        let qk = self.tmp(name);
        self.emit("MatMul", &qk, &[&q, &kt], &[&qk], vec![]);
        let sc = self.scalar(scale, dtype)?;
        let mut scores = self.tmp(name);
        self.emit("Mul", &scores, &[&qk, &sc], &[&scores], vec![]);
        let neg_inf = |s: &mut Self| s.scalar(f64::NEG_INFINITY, dtype);
        if a.boolean("is_causal") {
            let tril: Vec<bool> = (0..l * s_len).map(|i| i % s_len <= i / s_len).collect();
            let mask = self.konst(Tensor::from_vec(tril, &[l, s_len])?)?;
            let ninf = neg_inf(self)?;
            let masked = self.tmp(name);
            self.emit("Where", &masked, &[&mask, &scores, &ninf], &[&masked], vec![]);
            scores = masked;
        }
        if let Some(Argument::Node(id)) = a.get("attn_mask") {
            let m = self.value(&Argument::Node(id), dtype)?;
            let masked = self.tmp(name);
            if self.dtypes.get(&id) == Some(&DType::Bool) {
                let ninf = neg_inf(self)?;
                self.emit("Where", &masked, &[&m, &scores, &ninf], &[&masked], vec![]);
            } else {
                self.emit("Add", &masked, &[&scores, &m], &[&masked], vec![]);
            }
            scores = masked;
        }
        let p = self.tmp(name);
        self.emit("Softmax", &p, &[&scores], &[&p], vec![attr_int("axis", -1)]);
        self.emit("MatMul", name, &[&p, &v], &[name], vec![]);
        Ok(())
    }

    fn rank_of(&self, n: &Node<'_>, id: NodeId) -> usize {
        self.shape_of_id(n, id).map(|s| s.len()).unwrap_or(0)
    }

    fn shape_of_id(&self, n: &Node<'_>, id: NodeId) -> Result<Vec<usize>> {
        let _ = n;
        self.shapes.get(&id).cloned().ok_or_else(|| Error::argument("onnx export", "input without a shape"))
    }

    fn opt_or_fill(&mut self, a: &Args<'_, '_>, arg: &str, v: f64, c: usize, dtype: DType) -> Result<String> {
        match a.get(arg) {
            Some(Argument::None) | None => {
                let t = ferrofx_core::op::call(
                    "full",
                    vec![Value::Ints(vec![c as i64]), Value::Float(v)],
                    vec![("dtype".into(), Value::DType(dtype))],
                )?
                .into_iter()
                .next()
                .ok_or_else(|| Error::schema("full", "no output"))?;
                self.konst(t)
            }
            Some(b) => self.value(&b, dtype),
        }
    }
}

fn fill(v: Vec<i64>, k: usize, default: i64) -> Vec<i64> {
    match v.len() {
        0 => vec![default; k],
        1 => vec![v[0]; k],
        _ => v,
    }
}
