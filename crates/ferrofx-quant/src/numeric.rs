//! The numeric report (the idea of PyTorch's Numeric Suite): how far each quantized layer's
//! output is from the float one on calibration data, as a signal-to-quantization-noise ratio
//! `SQNR = 10 log10(Σ f² / Σ (f - q)²)` in dB, sorted from the most damaged layer; and automatic
//! mixed precision: keep the most sensitive layers in float until a budget is met.
//!
//! The float reference is the prepared module (its observers are the identity): every
//! quantized node of the converted module carries the name of the float node whose value it
//! replaces, and its [`QuantMeta`] dequantizes it.

use crate::convert::{convert_excluding, QuantMeta, QUANT_META};
use crate::observer_module::ObserverGuard;
use ferrofx_core::ops::quantized::dequantize;
use ferrofx_core::{Error, Result, Tensor, Value};
use ferrofx_fx::interpreter::default_run_node;
use ferrofx_fx::{Env, GraphModule, Interpreter, Node, NodeValue};
use std::collections::{HashMap, HashSet};

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSqnr {
    /// The node (its float name).
    pub node: String,
    /// The int8 op that computes it (`quantized_conv2d`, ...).
    pub op: String,
    /// SQNR in dB over all calibration batches (`inf` when equal).
    pub sqnr_db: f64,
}

/// Runs a module node by node and keeps the tensors of the named nodes.
struct Capture<'m> {
    gm: &'m GraphModule,
    wanted: &'m HashSet<String>,
    values: HashMap<String, Tensor>,
}

impl<'m> Interpreter<'m> for Capture<'m> {
    fn module(&self) -> &'m GraphModule {
        self.gm
    }
    fn run_node(&mut self, node: Node<'m>, env: &Env) -> Result<NodeValue> {
        let v = default_run_node(self, node, env)?;
        if self.wanted.contains(node.name()) {
            if let NodeValue::One(Value::Tensor(t)) = &v {
                self.values.insert(node.name().to_string(), t.clone());
            }
        }
        Ok(v)
    }
}

fn capture(gm: &GraphModule, wanted: &HashSet<String>, input: &Tensor) -> Result<HashMap<String, Tensor>> {
    let mut c = Capture { gm, wanted, values: HashMap::new() };
    c.run(&[Value::from(input)])?;
    Ok(c.values)
}

/// The quantized nodes of a converted module: name → (op, qparams).
fn quantized_nodes(q: &GraphModule) -> Vec<(String, String, QuantMeta)> {
    q.graph()
        .iter()
        .filter(|n| n.target().name().starts_with("quantized_"))
        .filter_map(|n| {
            n.meta().get::<QuantMeta>(QUANT_META).map(|m| (n.name().to_string(), n.target().name().to_string(), *m))
        })
        .collect()
}

/// Per-layer SQNR of `quantized` (from [`convert`](crate::convert())) against `prepared` (the
/// module it was converted from) on `batches`, worst first.
///
/// ```
/// use ferrofx_core::{ops::random::randn, Value};
/// use ferrofx_nn::{Linear, Module, Sequential};
/// use ferrofx_quant::{convert, numeric_report, prepare, QConfigMapping};
/// let mut lin = Sequential::new(); // traced as one call_module node `0`
/// lin.push(Linear::new(8, 4, true).unwrap());
/// lin.eval();
/// let gm = ferrofx_fx::symbolic_trace(&lin).unwrap();
/// let x = randn(&[32, 8], None).unwrap();
/// let prepared = prepare(&gm, &QConfigMapping::default_x86(), &[Value::from(&x)]).unwrap();
/// prepared.forward(&x).unwrap();
/// let q = convert(&prepared).unwrap();
/// let report = numeric_report(&prepared, &q, &[x]).unwrap();
/// assert_eq!(report.len(), 1);
/// assert!(report[0].sqnr_db > 25.0, "{report:?}");
/// ```
pub fn numeric_report(prepared: &GraphModule, quantized: &GraphModule, batches: &[Tensor]) -> Result<Vec<LayerSqnr>> {
    // the float runs must not change what the observers recorded
    let _frozen = ObserverGuard::disable(prepared);
    let nodes = quantized_nodes(quantized);
    let wanted: HashSet<String> = nodes.iter().map(|(n, _, _)| n.clone()).collect();
    let mut signal: HashMap<&str, f64> = HashMap::new();
    let mut noise: HashMap<&str, f64> = HashMap::new();
    for x in batches {
        let f = capture(prepared, &wanted, x)?;
        let q = capture(quantized, &wanted, x)?;
        for (name, _, m) in &nodes {
            let (Some(fv), Some(qv)) = (f.get(name), q.get(name)) else { continue };
            let dq = dequantize(qv, m.scale, m.zero_point)?;
            if dq.shape() != fv.shape() {
                return Err(Error::shape(
                    "numeric_report",
                    format!("node `{name}`: float value {:?} vs quantized {:?}", fv.shape(), dq.shape()),
                ));
            }
            let (a, b) = (fv.to_dtype(ferrofx_core::DType::F32)?.to_vec::<f32>()?, dq.to_vec::<f32>()?);
            let (mut s, mut e) = (0.0f64, 0.0f64);
            for (x, y) in a.iter().zip(&b) {
                s += (*x as f64) * (*x as f64);
                e += (*x as f64 - *y as f64).powi(2);
            }
            *signal.entry(name).or_default() += s;
            *noise.entry(name).or_default() += e;
        }
    }
    let mut rows: Vec<LayerSqnr> = nodes
        .iter()
        .filter(|(n, _, _)| signal.contains_key(n.as_str()))
        .map(|(n, op, _)| {
            let (s, e) = (signal[n.as_str()], noise[n.as_str()]);
            let sqnr_db = if e == 0.0 { f64::INFINITY } else { 10.0 * (s / e).log10() };
            LayerSqnr { node: n.clone(), op: op.clone(), sqnr_db }
        })
        .collect();
    rows.sort_by(|a, b| a.sqnr_db.total_cmp(&b.sqnr_db));
    Ok(rows)
}

/// The outcome of [`mixed_precision`].
pub struct MixedPrecision {
    /// The converted module.
    pub module: GraphModule,
    /// The nodes kept in float, in the order they were given up.
    pub kept_float: Vec<String>,
    /// The per-layer report of the final module.
    pub report: Vec<LayerSqnr>,
}

/// Automatic mixed precision for post-training quantization: converts `prepared`, and while
/// `accept(module)` says the budget (an accuracy, an SQNR of the output, ...) is not met, keeps
/// the layer with the lowest SQNR in float and converts again. Stops when the budget is met;
/// an error when even the all-float module does not meet it.
pub fn mixed_precision(
    prepared: &GraphModule,
    batches: &[Tensor],
    mut accept: impl FnMut(&GraphModule) -> Result<bool>,
) -> Result<MixedPrecision> {
    let mut skip: HashSet<String> = HashSet::new();
    let mut kept = vec![];
    loop {
        let module = convert_excluding(prepared, &skip)?;
        let report = numeric_report(prepared, &module, batches)?;
        if accept(&module)? {
            return Ok(MixedPrecision { module, kept_float: kept, report });
        }
        let Some(worst) = report.iter().find(|r| !skip.contains(&r.node)) else {
            return Err(Error::argument(
                "mixed_precision",
                format!(
                    "the budget is not met even with every quantized layer in float ({} kept float): the budget is stricter than the float model",
                    kept.len()
                ),
            ));
        };
        skip.insert(worst.node.clone());
        kept.push(worst.node.clone());
    }
}
