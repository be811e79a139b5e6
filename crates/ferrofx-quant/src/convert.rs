//! `convert` (`torch.ao.quantization.quantize_fx.convert_fx`): turns a calibrated prepared
//! module into one that runs int8 registry ops.
//!
//! Every observer becomes a scale and zero point; each quantized pattern becomes one int8 op
//! (`quantized_conv2d`, `quantized_linear`, `quantized_add`, with the ReLU fused in; a residual
//! add of a convolution that nothing else reads becomes one `quantized_conv2d_add`;
//! `quantized_adaptive_avg_pool2d`; `cat` of uint8 inputs requantized to the output's
//! parameters); pass-through ops run on the uint8 values; `quantize_per_tensor` is inserted
//! where a float value enters a quantized region and `dequantize` where a quantized value
//! leaves it. Weights are quantized with the qconfig's weight observer (int8, symmetric, per
//! output channel) and stored as int8 attributes, so the module saves to `.fxm` with int8
//! weights and runs without the model's code.
//!
//! Each quantized node carries its output's [`QuantMeta`] in its meta (key
//! [`QUANT_META`]); the scales and zero points are also the ops' arguments, so they show in
//! `print`, `print_tabular` and the generated code.

use crate::observer_module::ObserverModule;
use crate::pattern::{role, Annotation, Role, ANNOTATION};
use crate::prepare::graph_err;
use ferrofx_core::ops::quantized::{quantize_per_channel, quantize_per_tensor};
use ferrofx_core::{DType, Error, Result, Tensor};
use ferrofx_fx::graph_module::TensorEntry;
use ferrofx_fx::{Argument, Graph, GraphModule, Kwargs, Node, NodeId, Opcode, Target};
use ferrofx_nn::{Module, TensorKind};
use indexmap::IndexMap;
use std::collections::{HashMap, HashSet};

const OP: &str = "convert";

/// The meta key of [`QuantMeta`] on converted nodes.
pub const QUANT_META: &str = "qparams";

/// Quantization parameters of a node's uint8 output (seed 001's `TensorNode.qparams`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantMeta {
    /// Scale.
    pub scale: f64,
    /// Zero point.
    pub zero_point: i64,
    /// `uint8`.
    pub dtype: DType,
}

#[derive(Clone, Copy)]
struct QValue {
    node: NodeId,
    scale: f64,
    zero_point: i64,
}

struct Converter<'a> {
    old: &'a GraphModule,
    g: Graph,
    fenv: HashMap<NodeId, Argument>,
    qenv: HashMap<NodeId, QValue>,
    /// observer node → the value it observes
    alias: HashMap<NodeId, NodeId>,
    /// observed value → (scale, zero point)
    qparams: HashMap<NodeId, (f64, i64)>,
    attrs: IndexMap<String, TensorEntry>,
}

impl Converter<'_> {
    fn resolve(&self, mut v: NodeId) -> NodeId {
        while let Some(&a) = self.alias.get(&v) {
            v = a;
        }
        v
    }

    fn name(&self, v: NodeId) -> String {
        self.old.graph().node(v).map(|n| n.name().to_string()).unwrap_or_else(|_| "?".into())
    }

    fn call(&mut self, target: &str, args: Vec<Argument>, name: &str) -> Result<NodeId> {
        let t = Target::op(target).map_err(graph_err)?;
        self.g.create_node(Opcode::CallFunction, t, args, Kwargs::new(), Some(name), None).map_err(graph_err)
    }

    fn mark(&mut self, id: NodeId, q: QValue) -> Result<()> {
        self.g
            .meta_mut(id)
            .map_err(graph_err)?
            .insert(QUANT_META, QuantMeta { scale: q.scale, zero_point: q.zero_point, dtype: DType::U8 });
        Ok(())
    }

    /// Whether `q` (the converted node of the old graph's value `v`, an operand of the add
    /// `add`) is a `quantized_conv2d` without ReLU whose output only `add` reads: no other user
    /// of the value or of its observers in the old graph, none yet in the new one.
    fn lone_conv_output(&self, v: NodeId, add: NodeId, q: NodeId) -> bool {
        let Ok(node) = self.g.node(q) else { return false };
        let conv = node.target().name() == "quantized_conv2d"
            && node.args().len() == 13
            && matches!(node.args()[12], Argument::Bool(false))
            && node.users().next().is_none();
        if !conv {
            return false;
        }
        let value = self.resolve(v);
        // the value's readers: its users and its observers' users, observers excluded
        let mut readers = HashSet::new();
        let mut stack = vec![value];
        while let Some(x) = stack.pop() {
            let Ok(xn) = self.old.graph().node(x) else { return false };
            for u in xn.users() {
                if self.alias.contains_key(&u) {
                    stack.push(u);
                } else {
                    readers.insert(u);
                }
            }
        }
        readers.len() == 1 && readers.contains(&add)
    }

    /// The uint8 value of `v`, quantizing its float value with its observed parameters.
    fn get_q(&mut self, v: NodeId) -> Result<QValue> {
        let v = self.resolve(v);
        if let Some(q) = self.qenv.get(&v) {
            return Ok(*q);
        }
        let (scale, zero_point) = *self.qparams.get(&v).ok_or_else(|| {
            Error::argument(
                OP,
                format!("node `{}` enters a quantized op but was not observed: re-run prepare", self.name(v)),
            )
        })?;
        let f = self.get_f(v)?;
        let name = format!("{}_quantized", self.name(v));
        let node = self.call(
            "quantize_per_tensor",
            vec![f, Argument::Float(scale), Argument::Int(zero_point), Argument::DType(DType::U8)],
            &name,
        )?;
        let q = QValue { node, scale, zero_point };
        self.mark(node, q)?;
        self.qenv.insert(v, q);
        Ok(q)
    }

    /// The float value of `v`, dequantizing its uint8 value when it has no float one.
    fn get_f(&mut self, v: NodeId) -> Result<Argument> {
        let v = self.resolve(v);
        if let Some(a) = self.fenv.get(&v) {
            return Ok(a.clone());
        }
        let q = *self
            .qenv
            .get(&v)
            .ok_or_else(|| Error::argument(OP, format!("node `{}` is used before it is defined", self.name(v))))?;
        let name = format!("{}_dequantized", self.name(v));
        let node =
            self.call("dequantize", vec![q.node.into(), Argument::Float(q.scale), Argument::Int(q.zero_point)], &name)?;
        self.fenv.insert(v, node.into());
        Ok(node.into())
    }

    fn map_float(&mut self, a: &Argument) -> Result<Argument> {
        a.try_map_nodes(&mut |id| self.get_f(id))
    }

    fn copy_float(&mut self, n: &Node<'_>) -> Result<()> {
        let args = n.args().iter().map(|a| self.map_float(a)).collect::<Result<Vec<_>>>()?;
        let kwargs = n.kwargs().iter().map(|(k, v)| Ok((k.clone(), self.map_float(v)?))).collect::<Result<Kwargs>>()?;
        let id = self
            .g
            .create_node(n.op(), n.target().clone(), args, kwargs, Some(n.name()), n.type_expr().map(str::to_string))
            .map_err(graph_err)?;
        *self.g.meta_mut(id).map_err(graph_err)? = n.meta().clone();
        self.g.meta_mut(id).map_err(graph_err)?.remove(ANNOTATION);
        self.fenv.insert(n.id(), id.into());
        Ok(())
    }

    fn out_qparams(&self, out: NodeId) -> Result<(f64, i64)> {
        self.qparams.get(&out).copied().ok_or_else(|| {
            Error::argument(OP, format!("the output of node `{}` was not observed: re-run prepare", self.name(out)))
        })
    }

    fn attr(&mut self, name: String, t: Tensor) -> Result<Argument> {
        self.attrs.insert(name.clone(), TensorEntry { tensor: t, kind: TensorKind::Buffer, constant: false });
        Ok(self.g.get_attr(&name).map_err(graph_err)?.into())
    }

    /// Quantizes a conv/linear weight with the qconfig's weight observer: int8 values and
    /// one scale per output channel.
    fn weight(&mut self, path: &str, w: &Tensor, bias: Option<&Tensor>, q: &crate::QConfig) -> Result<[Argument; 3]> {
        let obs = q.weight.build()?;
        obs.observe(w).map_err(|e| Error::argument(OP, format!("weight of `{path}`: {e}")))?;
        let qp = obs.calculate_qparams().map_err(|e| Error::argument(OP, format!("weight of `{path}`: {e}")))?;
        let oc = w.shape().first().copied().unwrap_or(0);
        let (wq, scales) = if qp.scale.len() == 1 {
            (quantize_per_tensor(w, qp.scale[0] as f64, 0, DType::I8)?, vec![qp.scale[0]; oc])
        } else {
            let s = Tensor::from_vec(qp.scale.iter().map(|&s| s as f64).collect::<Vec<_>>(), &[oc])?;
            let z = Tensor::from_vec(qp.zero_point.clone(), &[oc])?;
            (quantize_per_channel(w, &s, &z, 0, DType::I8)?, qp.scale.clone())
        };
        let base = path.replace('.', "_");
        let w_arg = self.attr(format!("{base}_weight_int8"), wq)?;
        let s_arg = self.attr(format!("{base}_weight_scale"), Tensor::from_vec(scales, &[oc])?)?;
        let b_arg = match bias {
            Some(b) => self.attr(format!("{base}_bias"), b.to_dtype(DType::F32)?)?,
            None => Argument::None,
        };
        Ok([w_arg, s_arg, b_arg])
    }
}

fn ints(v: &[i64]) -> Argument {
    Argument::list(v.iter().map(|&i| Argument::Int(i)))
}

/// Converts a prepared and calibrated module (see [`prepare`](crate::prepare())) into an int8
/// one. The prepared module is not changed.
///
/// Errors name the node: an observer that saw no data (calibration not run), or NaN/Inf; a
/// module that is not the Conv2d/Linear `prepare` saw.
pub fn convert(prepared: &GraphModule) -> Result<GraphModule> {
    convert_excluding(prepared, &HashSet::new())
}

/// [`convert`], keeping the patterns whose output node is named in `keep_float` in float
/// (their neighbours dequantize and quantize around them): the mechanism of
/// [`mixed_precision`](crate::mixed_precision).
pub fn convert_excluding(prepared: &GraphModule, keep_float: &HashSet<String>) -> Result<GraphModule> {
    let old = prepared;
    let mut cv = Converter {
        old,
        g: Graph::new(),
        fenv: HashMap::new(),
        qenv: HashMap::new(),
        alias: HashMap::new(),
        qparams: HashMap::new(),
        attrs: IndexMap::new(),
    };
    // observers → qparams of the values they watch
    for n in old.graph().iter() {
        if n.op() != Opcode::CallModule {
            continue;
        }
        let Some(obs) =
            old.leaf_modules().get(n.target().name()).and_then(|m| m.as_any().downcast_ref::<ObserverModule>())
        else {
            continue;
        };
        let v = n
            .args()
            .first()
            .and_then(|a| a.as_node())
            .ok_or_else(|| Error::argument(OP, format!("observer node `{}` has no input node", n.name())))?;
        let vname = old.graph().node(v).map_err(graph_err)?.name().to_string();
        let qp = obs.observer().calculate_qparams().map_err(|e| {
            Error::argument(
                OP,
                format!(
                    "node `{vname}` (observed by `{}`, {}): {}",
                    n.target().name(),
                    obs.observer().name(),
                    e.message()
                ),
            )
        })?;
        cv.alias.insert(n.id(), v);
        cv.qparams.insert(v, (qp.scale[0] as f64, qp.zero_point[0]));
    }

    let ids: Vec<NodeId> = old.graph().iter().map(|n| n.id()).collect();
    for id in ids {
        let n = old.graph().node(id).map_err(graph_err)?;
        if cv.alias.contains_key(&id) {
            continue; // an observer: its users read the observed value
        }
        let ann = n.meta().get::<Annotation>(ANNOTATION).cloned();
        match (n.op(), ann) {
            (Opcode::Output, _) => {
                let a = cv.map_float(&n.args()[0])?;
                cv.g.output(a).map_err(graph_err)?;
            }
            (_, Some(Annotation::FusedRelu)) if keep_float.contains(n.name()) => cv.copy_float(&n)?,
            (_, Some(Annotation::FusedRelu)) => {} // emitted with its op
            (_, Some(Annotation::Quantized { relu, .. })) if keep_float.contains(&cv.name(relu.unwrap_or(id))) => {
                cv.copy_float(&n)?
            }
            (_, Some(Annotation::Quantized { qconfig, relu })) => {
                let out = relu.unwrap_or(id);
                let (so, zo) = cv.out_qparams(out)?;
                let out_name = cv.name(out);
                let r = role(old, &n);
                let node = match r {
                    Role::Conv(path) | Role::Linear(path) => {
                        let x = cv.get_q(n.args()[0].as_node().expect("prepare checked"))?;
                        let m = old.leaf_modules().get(&path).map(|m| m.as_any());
                        let mut args = vec![x.node.into(), Argument::Float(x.scale), Argument::Int(x.zero_point)];
                        let target;
                        let mut tail = vec![];
                        if let Some(c) = m.and_then(|m| m.downcast_ref::<ferrofx_nn::Conv2d>()) {
                            args.extend(cv.weight(&path, &c.weight, c.bias.as_ref(), &qconfig)?);
                            tail = vec![ints(&c.stride), ints(&c.padding), ints(&c.dilation), Argument::Int(c.groups)];
                            target = "quantized_conv2d";
                        } else if let Some(l) = m.and_then(|m| m.downcast_ref::<ferrofx_nn::Linear>()) {
                            args.extend(cv.weight(&path, &l.weight, l.bias.as_ref(), &qconfig)?);
                            target = "quantized_linear";
                        } else {
                            return Err(Error::argument(
                                OP,
                                format!(
                                    "node `{}`: module `{path}` is no longer a Conv2d/Linear: re-run prepare",
                                    n.name()
                                ),
                            ));
                        }
                        args.extend([Argument::Float(so), Argument::Int(zo)]);
                        args.extend(tail);
                        args.push(Argument::Bool(relu.is_some()));
                        cv.call(target, args, &out_name)?
                    }
                    Role::Add => {
                        let a = cv.get_q(n.args()[0].as_node().expect("prepare checked"))?;
                        let b = cv.get_q(n.args()[1].as_node().expect("prepare checked"))?;
                        // a residual add of a convolution (without ReLU) that nothing else reads
                        // becomes one quantized_conv2d_add (oneDNN's conv2d_add), the sum being
                        // commutative: the convolution's output never goes through memory
                        let lone = |cv: &Converter<'_>, k: usize, q: &QValue| {
                            n.args()[k].as_node().is_some_and(|v| cv.lone_conv_output(v, n.id(), q.node))
                        };
                        let fused = if lone(&cv, 0, &a) {
                            Some((a, b))
                        } else if lone(&cv, 1, &b) {
                            Some((b, a))
                        } else {
                            None
                        };
                        if let Some((c, o)) = fused {
                            let mut args = cv.g.node(c.node).map_err(graph_err)?.args()[..12].to_vec();
                            cv.g.erase_node(c.node).map_err(graph_err)?;
                            args.extend([
                                o.node.into(),
                                Argument::Float(o.scale),
                                Argument::Int(o.zero_point),
                                Argument::Float(so),
                                Argument::Int(zo),
                                Argument::Bool(relu.is_some()),
                            ]);
                            let node = cv.call("quantized_conv2d_add", args, &out_name)?;
                            let q = QValue { node, scale: so, zero_point: zo };
                            cv.mark(node, q)?;
                            cv.qenv.insert(out, q);
                            continue;
                        }
                        let args = vec![
                            a.node.into(),
                            Argument::Float(a.scale),
                            Argument::Int(a.zero_point),
                            b.node.into(),
                            Argument::Float(b.scale),
                            Argument::Int(b.zero_point),
                            Argument::Float(so),
                            Argument::Int(zo),
                            Argument::Bool(relu.is_some()),
                        ];
                        cv.call("quantized_add", args, &out_name)?
                    }
                    Role::Cat => {
                        let mut items = vec![];
                        for v in n.all_input_nodes() {
                            let q = cv.get_q(v)?;
                            if (q.scale, q.zero_point) == (so, zo) {
                                items.push(Argument::Node(q.node));
                            } else {
                                let name = format!("{}_requantized", cv.name(cv.resolve(v)));
                                let f = cv.call(
                                    "dequantize",
                                    vec![q.node.into(), Argument::Float(q.scale), Argument::Int(q.zero_point)],
                                    &name,
                                )?;
                                let rq = cv.call(
                                    "quantize_per_tensor",
                                    vec![f.into(), Argument::Float(so), Argument::Int(zo), Argument::DType(DType::U8)],
                                    &name,
                                )?;
                                items.push(Argument::Node(rq));
                            }
                        }
                        let mut args = vec![Argument::list(items)];
                        for a in &n.args()[1..] {
                            args.push(cv.map_float(a)?);
                        }
                        let kwargs = n
                            .kwargs()
                            .iter()
                            .map(|(k, v)| Ok((k.clone(), cv.map_float(v)?)))
                            .collect::<Result<Kwargs>>()?;
                        cv.g.create_node(n.op(), n.target().clone(), args, kwargs, Some(&out_name), None)
                            .map_err(graph_err)?
                    }
                    other => {
                        return Err(Error::argument(OP, format!("node `{}`: unexpected pattern {other:?}", n.name())));
                    }
                };
                let q = QValue { node, scale: so, zero_point: zo };
                cv.mark(node, q)?;
                cv.qenv.insert(out, q);
            }
            (_, Some(Annotation::PassThrough)) => {
                let src = n.args().first().and_then(|a| a.as_node()).map(|s| cv.resolve(s));
                match src.and_then(|s| cv.qenv.get(&s).copied()) {
                    Some(q) => {
                        let node = if let Role::AdaptiveAvgPool(size) = role(old, &n) {
                            let args = vec![
                                q.node.into(),
                                ints(&size),
                                Argument::Float(q.scale),
                                Argument::Int(q.zero_point),
                                Argument::Float(q.scale),
                                Argument::Int(q.zero_point),
                            ];
                            cv.call("quantized_adaptive_avg_pool2d", args, n.name())?
                        } else {
                            let mut args = vec![Argument::Node(q.node)];
                            for a in &n.args()[1..] {
                                args.push(cv.map_float(a)?);
                            }
                            let kwargs = n
                                .kwargs()
                                .iter()
                                .map(|(k, v)| Ok((k.clone(), cv.map_float(v)?)))
                                .collect::<Result<Kwargs>>()?;
                            cv.g.create_node(n.op(), n.target().clone(), args, kwargs, Some(n.name()), None)
                                .map_err(graph_err)?
                        };
                        let q = QValue { node, ..q };
                        cv.mark(node, q)?;
                        cv.qenv.insert(id, q);
                    }
                    None => cv.copy_float(&n)?,
                }
            }
            _ => cv.copy_float(&n)?,
        }
    }

    // the modules and attributes the new graph still uses
    let mut modules: IndexMap<String, Box<dyn Module>> = IndexMap::new();
    let mut attrs = IndexMap::new();
    for n in cv.g.iter() {
        let t = n.target().name();
        match n.op() {
            Opcode::CallModule if !modules.contains_key(t) => {
                let m = old
                    .leaf_modules()
                    .get(t)
                    .ok_or_else(|| Error::argument(OP, format!("node `{}` calls a missing module `{t}`", n.name())))?;
                let copy = m
                    .clone_module()
                    .ok_or_else(|| Error::argument(OP, format!("module `{t}` ({}) cannot be copied", m.type_name())))?;
                modules.insert(t.to_string(), copy);
            }
            Opcode::GetAttr => {
                if let Some(e) = cv.attrs.get(t).or_else(|| old.attributes().get(t)) {
                    attrs.insert(t.to_string(), e.clone());
                }
            }
            _ => {}
        }
    }
    cv.g.lint().map_err(graph_err)?;
    GraphModule::from_parts(cv.g, modules, attrs, old.traced_type_name(), false)
}
