//! LSTM (single and multi-layer), with PyTorch's parameter names and gate order (i, f, g, o).

use crate::module::{ModuleStructure, TensorKind};
use crate::spec::{self, Attr, ModuleSpec, TensorSource};
use crate::{functional as F, init, Module};
use ferrofx_core::ops::join;
use ferrofx_core::{Error, Result, Tensor, Value};
use std::any::Any;

/// `nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False)`: parameters
/// `weight_ih_l{k} [4H, in]`, `weight_hh_l{k} [4H, H]`, `bias_ih_l{k}`, `bias_hh_l{k} [4H]`, all
/// initialised U(±1/sqrt(H)).
///
/// `forward(x)` returns the output `[L, N, H]` (`[N, L, H]` with `batch_first`);
/// `forward_values([x, h0?, c0?])` returns `[output, h_n, c_n]` with states
/// `[num_layers, N, H]`.
#[derive(Clone)]
pub struct LSTM {
    layers: Vec<[Option<Tensor>; 4]>,
    /// Input features.
    pub input_size: usize,
    /// Hidden features H.
    pub hidden_size: usize,
    /// Inputs are `[N, L, in]`.
    pub batch_first: bool,
}

const NAMES: [&str; 4] = ["weight_ih_l", "weight_hh_l", "bias_ih_l", "bias_hh_l"];

impl LSTM {
    /// A new LSTM.
    pub fn new(
        input_size: usize,
        hidden_size: usize,
        num_layers: usize,
        bias: bool,
        batch_first: bool,
    ) -> Result<LSTM> {
        if hidden_size == 0 || num_layers == 0 {
            return Err(Error::argument("LSTM", "hidden_size and num_layers must be positive"));
        }
        let b = 1.0 / (hidden_size as f64).sqrt();
        let h4 = 4 * hidden_size;
        let mut layers = Vec::new();
        for k in 0..num_layers {
            let inp = if k == 0 { input_size } else { hidden_size };
            let u = |shape: &[usize]| init::parameter(shape, |t| init::uniform_(t, -b, b));
            layers.push([
                Some(u(&[h4, inp])?),
                Some(u(&[h4, hidden_size])?),
                if bias { Some(u(&[h4])?) } else { None },
                if bias { Some(u(&[h4])?) } else { None },
            ]);
        }
        Ok(LSTM { layers, input_size, hidden_size, batch_first })
    }

    /// Runs the LSTM; returns `(output, h_n, c_n)`.
    pub fn run(&self, x: &Tensor, h0: Option<&Tensor>, c0: Option<&Tensor>) -> Result<(Tensor, Tensor, Tensor)> {
        let x = if self.batch_first { x.transpose(0, 1)? } else { x.clone() };
        let s = x.shape().to_vec();
        if s.len() != 3 || s[2] != self.input_size {
            return Err(Error::shape(
                "LSTM",
                format!(
                    "input must have 3 dimensions [L, N, {}] (batch_first={}), got {:?}",
                    self.input_size, self.batch_first, s
                ),
            ));
        }
        let (l, n, h) = (s[0], s[1], self.hidden_size);
        let nl = self.layers.len();
        let state_shape = [nl, n, h];
        for st in [h0, c0].into_iter().flatten() {
            if st.shape() != state_shape {
                return Err(Error::shape(
                    "LSTM",
                    format!("Expected hidden size {state_shape:?}, got {:?}", st.shape()),
                ));
            }
        }
        let dtype = x.dtype();
        let zeros = || ferrofx_core::ops::creation::zeros(&[n as i64, h as i64], Some(dtype));
        let mut layer_in = x;
        let (mut hs, mut cs) = (Vec::new(), Vec::new());
        for (k, [w_ih, w_hh, b_ih, b_hh]) in self.layers.iter().enumerate() {
            let (w_ih, w_hh) = (w_ih.as_ref().expect("weights exist"), w_hh.as_ref().expect("weights exist"));
            let mut hcur = match h0 {
                Some(t) => t.select(0, k as i64)?,
                None => zeros()?,
            };
            let mut ccur = match c0 {
                Some(t) => t.select(0, k as i64)?,
                None => zeros()?,
            };
            let xw = F::linear(&layer_in, w_ih, b_ih.as_ref())?; // [L, N, 4H]
            let mut outs = Vec::with_capacity(l);
            for t in 0..l {
                let gates = F::add(&xw.select(0, t as i64)?, &F::linear(&hcur, w_hh, b_hh.as_ref())?)?;
                let g4 = gates.chunk(4, 1)?;
                let i = F::sigmoid(&g4[0])?;
                let f = F::sigmoid(&g4[1])?;
                let g = F::tanh(&g4[2])?;
                let o = F::sigmoid(&g4[3])?;
                ccur = F::add(&F::mul(&f, &ccur)?, &F::mul(&i, &g)?)?;
                hcur = F::mul(&o, &F::tanh(&ccur)?)?;
                outs.push(hcur.clone());
            }
            layer_in = join::stack(&outs, 0)?;
            hs.push(hcur);
            cs.push(ccur);
        }
        let out = if self.batch_first { layer_in.transpose(0, 1)? } else { layer_in };
        Ok((out, join::stack(&hs, 0)?, join::stack(&cs, 0)?))
    }
}

impl ModuleStructure for LSTM {
    fn type_name(&self) -> &'static str {
        "LSTM"
    }
    fn visit_tensors(&self, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        for (k, l) in self.layers.iter().enumerate() {
            for (name, t) in NAMES.iter().zip(l.iter()) {
                if let Some(t) = t {
                    f(&format!("{name}{k}"), TensorKind::Parameter, t);
                }
            }
        }
    }
    fn visit_tensors_mut(&mut self, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
        for (k, l) in self.layers.iter_mut().enumerate() {
            for (name, t) in NAMES.iter().zip(l.iter_mut()) {
                if let Some(t) = t {
                    f(&format!("{name}{k}"), TensorKind::Parameter, t);
                }
            }
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

impl Module for LSTM {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.run(x, None, None)?.0)
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let t = |i: usize| match inputs.get(i) {
            Some(Value::Tensor(t)) => Some(t),
            _ => None,
        };
        let x = t(0).ok_or_else(|| Error::argument("LSTM", "missing input"))?;
        let (o, h, c) = self.run(x, t(1), t(2))?;
        Ok(vec![o.into(), h.into(), c.into()])
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("LSTM")
                .with("input_size", Attr::Int(self.input_size as i64))
                .with("hidden_size", Attr::Int(self.hidden_size as i64))
                .with("num_layers", Attr::Int(self.layers.len() as i64))
                .with("bias", Attr::Bool(self.layers.first().is_some_and(|l| l[2].is_some())))
                .with("batch_first", Attr::Bool(self.batch_first)),
        )
    }
    fn extra_repr(&self) -> String {
        let mut s = format!("{}, {}", self.input_size, self.hidden_size);
        if self.layers.len() > 1 {
            s += &format!(", num_layers={}", self.layers.len());
        }
        if self.batch_first {
            s += ", batch_first=True";
        }
        s
    }
}

impl LSTM {
    /// Rebuilds an LSTM from its spec and tensors (`weight_ih_l0` ...).
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<LSTM> {
        let (input_size, h, nl) = (s.size("input_size", 1)?, s.size("hidden_size", 1)?, s.size("num_layers", 1)?);
        if nl > 1024 {
            return Err(Error::argument("LSTM", format!("num_layers = {nl} is out of range")));
        }
        let bias = s.bool("bias")?;
        let mut layers = Vec::with_capacity(nl);
        for k in 0..nl {
            let inp = if k == 0 { input_size } else { h };
            layers.push([
                Some(spec::tensor(s, src, &format!("weight_ih_l{k}"), &[4 * h, inp])?),
                Some(spec::tensor(s, src, &format!("weight_hh_l{k}"), &[4 * h, h])?),
                spec::opt_tensor(s, src, &format!("bias_ih_l{k}"), &[4 * h], bias)?,
                spec::opt_tensor(s, src, &format!("bias_hh_l{k}"), &[4 * h], bias)?,
            ]);
        }
        Ok(LSTM { layers, input_size, hidden_size: h, batch_first: s.bool("batch_first")? })
    }
}
