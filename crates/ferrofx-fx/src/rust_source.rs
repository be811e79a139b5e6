//! `to_rust_source`: a GraphModule as a standalone Rust module plus a weights file (FX's
//! `to_folder`, for Rust).
//!
//! The GraphModule is first traced through completely with example inputs (every module,
//! built-in layers included, becomes registry ops), so the emitted code depends only on
//! `ferrofx-core` (ops by name) and `ferrofx-nn` (reading the safetensors weights). Each node
//! becomes one statement calling the op with its arguments bound to the schema (the same
//! binding the execution plan uses), and every value is dropped after its last use, as in
//! [`GraphModule::code`]. The code is specialised like the trace: training flags (batch norm
//! statistics, dropout) and any shape the model read from its input are fixed at emission.

use crate::graph::{Argument, Graph, GraphError, Kwargs, NodeId, Opcode, Target};
use crate::graph_module::GraphModule;
use crate::tracer::Tracer;
use ferrofx_core::op::{bind, OpDef};
use ferrofx_core::{Error, Result, Tensor, Value};
use ferrofx_nn::StateDict;
use std::collections::HashMap;
use std::fmt::Write;

fn graph_err(e: GraphError) -> Error {
    Error::argument("to_rust_source", e.to_string())
}

/// Where an emitted argument comes from.
enum ArgT {
    /// A literal (bound to the schema).
    Const(Value),
    /// A node's variable.
    Slot(u32),
    /// A list of tensors from node variables.
    List(Vec<ArgT>),
}

fn dummy() -> Tensor {
    Tensor::scalar(0f32)
}

/// Binds a node's arguments to `op`'s schema, with node references kept as variables.
fn bind_node(
    op: &'static OpDef,
    args: &[Argument],
    kwargs: &Kwargs,
    slot_of: &HashMap<NodeId, u32>,
    multi: &dyn Fn(NodeId) -> bool,
    node: &str,
) -> Result<Vec<ArgT>> {
    let template = |a: &Argument| -> Result<(Value, Option<ArgT>)> {
        match a {
            Argument::Node(n) => {
                let s = *slot_of.get(n).ok_or_else(|| Error::argument(node, "uses a node defined later"))?;
                let v = if multi(*n) { Value::Tensors(vec![dummy()]) } else { Value::Tensor(dummy()) };
                Ok((v, Some(ArgT::Slot(s))))
            }
            Argument::List(items) | Argument::Tuple(items) if items.iter().any(|i| matches!(i, Argument::Node(_))) => {
                let mut ts = Vec::new();
                for i in items.iter() {
                    match i {
                        Argument::Node(n) => ts.push(ArgT::Slot(
                            *slot_of.get(n).ok_or_else(|| Error::argument(node, "uses a node defined later"))?,
                        )),
                        other => return Err(Error::argument(node, format!("a list mixes nodes and {other:?}"))),
                    }
                }
                Ok((Value::Tensors(vec![dummy(); ts.len()]), Some(ArgT::List(ts))))
            }
            other => Ok((crate::values::to_value(other, None, &NoSlots, node)?, None)),
        }
    };
    let mut pos_v = Vec::new();
    let mut pos_t = Vec::new();
    for a in args {
        let (v, t) = template(a)?;
        pos_v.push(v);
        pos_t.push(t);
    }
    let mut kw_v = Vec::new();
    let mut kw_t = Vec::new();
    for (k, a) in kwargs {
        let (v, t) = template(a)?;
        kw_v.push((k.clone(), v));
        kw_t.push((k.as_str(), t));
    }
    let bound = bind(op.name, op.schema, pos_v, kw_v)?;
    let mut out: Vec<ArgT> = bound.into_iter().map(ArgT::Const).collect();
    let positional: Vec<usize> = (0..op.schema.len()).filter(|&i| !op.schema[i].kwarg_only).collect();
    for (i, t) in pos_t.into_iter().enumerate() {
        if let (Some(t), Some(&slot)) = (t, positional.get(i)) {
            out[slot] = t;
        }
    }
    for (k, t) in kw_t {
        if let (Some(t), Some(slot)) = (t, op.schema.iter().position(|s| s.name == k)) {
            out[slot] = t;
        }
    }
    Ok(out)
}

struct NoSlots;
impl crate::values::Slots for NoSlots {
    fn get(&self, _node: NodeId) -> Result<Value> {
        Err(Error::argument("to_rust_source", "unexpected node reference"))
    }
}

/// The emitted module: its source and the weights it loads.
pub struct RustSource {
    /// The Rust source of the module (`pub struct <Name>` with `load` and `forward`).
    pub code: String,
    /// Parameters, buffers and constants by the names the code loads them with.
    pub weights: StateDict,
}

impl std::fmt::Debug for RustSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RustSource({} lines, {} weights)", self.code.lines().count(), self.weights.len())
    }
}

impl RustSource {
    /// Writes `<dir>/<file_stem>.rs` and `<dir>/<file_stem>.safetensors`.
    pub fn write(&self, dir: impl AsRef<std::path::Path>, file_stem: &str) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io("to_rust_source", format!("{}: {e}", dir.display())))?;
        let rs = dir.join(format!("{file_stem}.rs"));
        ferrofx_core::atomic_file::write_atomic_bytes("to_rust_source", &rs, self.code.as_bytes())?;
        ferrofx_nn::save_state_dict(&self.weights, dir.join(format!("{file_stem}.safetensors")))
    }
}

fn lit_f64(x: f64) -> String {
    if x.is_finite() && format!("{x:?}").parse::<f64>() == Ok(x) {
        format!("{x:?}")
    } else {
        format!("f64::from_bits({:#x})", x.to_bits())
    }
}

fn lit_value(v: &Value) -> Result<String> {
    Ok(match v {
        Value::None => "Value::None".into(),
        Value::Bool(b) => format!("Value::Bool({b})"),
        Value::Int(i) => format!("Value::Int({i})"),
        Value::Float(x) => format!("Value::Float({})", lit_f64(*x)),
        Value::Str(s) => format!("Value::Str({s:?}.to_string())"),
        Value::DType(d) => format!("Value::DType(DType::{d:?})"),
        Value::Ints(v) => format!("Value::Ints(vec!{v:?})"),
        Value::Floats(v) => {
            format!("Value::Floats(vec![{}])", v.iter().map(|x| lit_f64(*x)).collect::<Vec<_>>().join(", "))
        }
        Value::Tensor(_) | Value::Tensors(_) => {
            return Err(Error::argument(
                "to_rust_source",
                "a tensor literal reached code generation (expected a get_attr)",
            ))
        }
    })
}

fn arg_expr(a: &ArgT, names: &[String]) -> Result<String> {
    Ok(match a {
        ArgT::Const(v) => lit_value(v)?,
        ArgT::Slot(s) => format!("{}.clone()", names[*s as usize]),
        ArgT::List(items) => {
            let mut parts = Vec::with_capacity(items.len());
            for i in items {
                match i {
                    ArgT::Slot(s) => parts.push(format!("tensor(&{})?", names[*s as usize])),
                    _ => return Err(Error::argument("to_rust_source", "tensor lists may only hold node values")),
                }
            }
            format!("Value::Tensors(vec![{}])", parts.join(", "))
        }
    })
}

fn type_ident(name: &str) -> String {
    let mut s: String = name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'M');
    }
    s
}

impl GraphModule {
    /// Emits this GraphModule as a Rust module named `struct_name` plus its weights; see the
    /// module documentation. `example_inputs` drive the full trace (shapes known).
    ///
    /// ```
    /// use ferrofx_fx::symbolic_trace;
    /// use ferrofx_nn::{Linear, Module, Tensor};
    /// let gm = symbolic_trace(&Linear::new(3, 2, true).unwrap()).unwrap();
    /// let x = Tensor::from_vec(vec![0.0f32; 6], &[2, 3]).unwrap();
    /// let src = gm.to_rust_source("Tiny", &[x.into()]).unwrap();
    /// assert!(src.code.contains("pub struct Tiny"));
    /// assert!(src.code.contains("let linear = one(\"linear\", CallKind::Function, &[x.clone(), weight.clone(), bias.clone()])?;"));
    /// assert_eq!(src.weights.keys().collect::<Vec<_>>(), ["weight", "bias"]);
    /// ```
    pub fn to_rust_source(&self, struct_name: &str, example_inputs: &[Value]) -> Result<RustSource> {
        let input_names: Vec<String> = self
            .graph()
            .iter()
            .filter(|n| n.op() == Opcode::Placeholder)
            .map(|n| n.target().name().to_string())
            .collect();
        let names_ref: Vec<&str> = input_names.iter().map(String::as_str).collect();
        let flat = Tracer::new()
            .is_leaf_module(|_, _| false)
            .input_names(&names_ref)
            .trace_with_inputs(self, example_inputs)?;
        let g = flat.graph();
        let mut names: Vec<String> = Vec::new();
        let mut slot_of: HashMap<NodeId, u32> = HashMap::new();
        for n in g.iter() {
            let s = names.len() as u32;
            names.push(n.name().to_string());
            slot_of.insert(n.id(), s);
        }
        let multi = |id: NodeId| g.node(id).is_ok_and(|n| n.users().any(|u| crate::tracer::is_getitem(g, u)));
        // Last use of every node (by position), for the drops.
        let order: Vec<NodeId> = g.node_ids();
        let mut last_use: HashMap<NodeId, usize> = HashMap::new();
        for (i, id) in order.iter().enumerate() {
            let n = g.node(*id).map_err(graph_err)?;
            for input in n.all_input_nodes() {
                last_use.insert(input, i);
            }
        }
        let mut weights = StateDict::new();
        let mut body = String::new();
        let mut loads = String::new();
        let mut n_inputs = 0usize;
        for (i, id) in order.iter().enumerate() {
            let n = g.node(*id).map_err(graph_err)?;
            let var = n.name();
            match n.op() {
                Opcode::Placeholder => {
                    let _ = writeln!(
                        body,
                        "        let {var} = inputs.get({n_inputs}).cloned().ok_or_else(|| missing(\"{var}\"))?;"
                    );
                    n_inputs += 1;
                }
                Opcode::GetAttr => {
                    let path = n.target().name();
                    let t = flat.attributes().get(path).map(|e| e.tensor.clone()).ok_or_else(|| {
                        Error::argument("to_rust_source", format!("get_attr target '{path}' is missing"))
                    })?;
                    let idx = weights.len();
                    weights.insert(path.to_string(), t.detach());
                    let _ = writeln!(loads, "            {path:?},");
                    let _ = writeln!(body, "        let {var} = Value::Tensor(self.weights[{idx}].clone());");
                }
                Opcode::CallFunction | Opcode::CallMethod => {
                    let (opname, kind) = match (n.op(), n.target()) {
                        (Opcode::CallFunction, Target::Op(def)) => (def.name, "Function"),
                        (Opcode::CallMethod, t) => match ferrofx_core::op::lookup(t.name()) {
                            Some(def) => (def.name, "Method"),
                            None => {
                                return Err(Error::schema(var, format!("method '{}' is not a registry op", t.name())))
                            }
                        },
                        (_, t) => {
                            return Err(Error::argument(
                                var,
                                format!("'{}' is a user function: only registry ops can be emitted as Rust", t.name()),
                            ))
                        }
                    };
                    let def = ferrofx_core::op::require(opname)?;
                    let args = bind_node(def, n.args(), n.kwargs(), &slot_of, &multi, var)?;
                    let exprs = args.iter().map(|a| arg_expr(a, &names)).collect::<Result<Vec<_>>>()?;
                    if multi(n.id()) {
                        let _ = writeln!(
                            body,
                            "        let {var} = Value::Tensors(call(\"{opname}\", CallKind::{kind}, &[{}])?.iter().map(tensor).collect::<Result<Vec<_>>>()?);",
                            exprs.join(", ")
                        );
                    } else {
                        let _ = writeln!(
                            body,
                            "        let {var} = one(\"{opname}\", CallKind::{kind}, &[{}])?;",
                            exprs.join(", ")
                        );
                    }
                }
                Opcode::CallModule => {
                    return Err(Error::argument(var, "a call_module node survived the full trace"));
                }
                Opcode::Output => {
                    let a = n.args().first().cloned().unwrap_or_default();
                    let items: Vec<Argument> = match a {
                        Argument::Tuple(items) | Argument::List(items) => items.to_vec(),
                        other => vec![other],
                    };
                    let mut exprs = Vec::with_capacity(items.len());
                    for a in &items {
                        exprs.push(match a {
                            Argument::Node(x) => format!("{}.clone()", names[slot_of[x] as usize]),
                            other => lit_value(&crate::values::to_value(other, None, &NoSlots, "output")?)?,
                        });
                    }
                    let _ = writeln!(body, "        Ok(vec![{}])", exprs.join(", "));
                    continue;
                }
            }
            emit_drops(&mut body, i, g, n.id(), &last_use, &names, &slot_of)?;
        }
        let name = type_ident(struct_name);
        let mut code = String::new();
        let _ = write!(
            code,
            r#"//! `{name}`: generated by `ferrofx_fx::GraphModule::to_rust_source` (do not edit).
//!
//! Load the weights written beside this file with [`{name}::load`], then call
//! [`{name}::forward`] with the inputs {input_names:?}.

#![allow(clippy::all, unused_variables, unused_parens, unused_imports, dead_code)]

use ferrofx_core::op::{{dispatch, require, CallKind}};
use ferrofx_core::{{DType, Error, Result, Tensor, Value}};

/// The generated model: its weights, in the order the code reads them.
pub struct {name} {{
    weights: Vec<Tensor>,
}}

const WEIGHTS: &[&str] = &[
{loads}];

const INPUTS: &[&str] = &{input_names:?};

fn call(name: &str, kind: CallKind, args: &[Value]) -> Result<Vec<Value>> {{
    Ok(dispatch(require(name)?, kind, args)?.into_iter().map(Value::Tensor).collect())
}}

fn one(name: &str, kind: CallKind, args: &[Value]) -> Result<Value> {{
    let mut out = dispatch(require(name)?, kind, args)?;
    out.pop().map(Value::Tensor).ok_or_else(|| Error::schema(name, "op returned no output"))
}}

fn item(values: &[Value], i: usize) -> Result<Value> {{
    values.get(i).cloned().ok_or_else(|| Error::index("getitem", format!("index {{i}} of {{}} outputs", values.len())))
}}

fn tensor(v: &Value) -> Result<Tensor> {{
    v.as_tensor().cloned().ok_or_else(|| Error::argument("{name}", format!("expected a tensor, got {{v:?}}")))
}}

fn missing(input: &str) -> Error {{
    Error::argument("{name}", format!("missing input '{{input}}'; forward takes {{INPUTS:?}}"))
}}

impl {name} {{
    /// Loads the weights from a safetensors file written by `to_rust_source`.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<{name}> {{
        let sd = ferrofx_nn::load_state_dict_file(path)?;
        let mut weights = Vec::with_capacity(WEIGHTS.len());
        for w in WEIGHTS {{
            let t = sd.get(*w).ok_or_else(|| Error::io("{name}", format!("the weights file has no tensor '{{w}}'")))?;
            weights.push(t.clone());
        }}
        Ok({name} {{ weights }})
    }}

    /// Runs the model on positional inputs.
    pub fn forward(&self, inputs: &[Value]) -> Result<Vec<Value>> {{
{body}    }}
}}
"#
        );
        Ok(RustSource { code, weights })
    }
}

fn emit_drops(
    body: &mut String,
    i: usize,
    g: &Graph,
    id: NodeId,
    last_use: &HashMap<NodeId, usize>,
    names: &[String],
    slot_of: &HashMap<NodeId, u32>,
) -> Result<()> {
    let n = g.node(id).map_err(graph_err)?;
    let mut drops = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for input in n.all_input_nodes() {
        if last_use.get(&input) == Some(&i) && seen.insert(input) {
            drops.push(names[slot_of[&input] as usize].clone());
        }
    }
    if n.num_users() == 0 && n.op() != Opcode::Output {
        drops.push(names[slot_of[&id] as usize].clone());
    }
    if !drops.is_empty() {
        let _ = writeln!(body, "        drop(({}));", drops.join(", "));
    }
    Ok(())
}
