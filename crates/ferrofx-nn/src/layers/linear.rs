//! Linear, Bilinear, Identity, Flatten.

use crate::init;
use crate::spec::{self, Attr, ModuleSpec, TensorSource};
use crate::Module;
use ferrofx_core::{Result, Tensor};

/// `nn.Linear(in_features, out_features, bias)`: `y = x W^T + b`, weight `[out, in]`
/// initialised with `kaiming_uniform_(a=sqrt(5))`, bias U(±1/sqrt(in)).
#[derive(crate::Module, Clone)]
pub struct Linear {
    /// `[out_features, in_features]`
    pub weight: Tensor,
    /// `[out_features]`
    pub bias: Option<Tensor>,
    /// Input size.
    pub in_features: usize,
    /// Output size.
    pub out_features: usize,
}

impl Linear {
    /// A new layer with PyTorch's default initialisation (current generator).
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = init::default_weight(&[out_features, in_features])?;
        let bias = if bias { Some(init::default_bias(out_features, in_features)?) } else { None };
        Ok(Linear { weight, bias, in_features, out_features })
    }
}

impl Module for Linear {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ferrofx_core::ops::linalg::linear(x, &self.weight, self.bias.as_ref())
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("Linear")
                .with("in_features", Attr::Int(self.in_features as i64))
                .with("out_features", Attr::Int(self.out_features as i64))
                .with("bias", Attr::Bool(self.bias.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "in_features={}, out_features={}, bias={}",
            self.in_features,
            self.out_features,
            py_bool(self.bias.is_some())
        )
    }
}

pub(crate) fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// `nn.Identity`.
#[derive(crate::Module, Default, Clone)]
pub struct Identity {
    /// Gives each instance its own address: tracers identify module instances by address,
    /// and zero-sized values all share one.
    #[module(skip)]
    _instance: u8,
}

impl Identity {
    /// A new Identity.
    pub fn new() -> Identity {
        Identity { _instance: 0 }
    }
}

impl Module for Identity {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("Identity"))
    }
}

/// `nn.Flatten(start_dim=1, end_dim=-1)`.
#[derive(crate::Module, Clone)]
pub struct Flatten {
    /// First dimension flattened.
    pub start_dim: i64,
    /// Last dimension flattened.
    pub end_dim: i64,
}

impl Flatten {
    /// `Flatten(start_dim, end_dim)`.
    pub fn new(start_dim: i64, end_dim: i64) -> Flatten {
        Flatten { start_dim, end_dim }
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new(1, -1)
    }
}

impl Module for Flatten {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start_dim, self.end_dim)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("Flatten")
                .with("start_dim", Attr::Int(self.start_dim))
                .with("end_dim", Attr::Int(self.end_dim)),
        )
    }
    fn extra_repr(&self) -> String {
        format!("start_dim={}, end_dim={}", self.start_dim, self.end_dim)
    }
}

/// `nn.Bilinear(in1_features, in2_features, out_features, bias)`: weight `[out, in1, in2]` and
/// bias initialised U(±1/sqrt(in1)).
#[derive(crate::Module, Clone)]
pub struct Bilinear {
    /// `[out, in1, in2]`
    pub weight: Tensor,
    /// `[out]`
    pub bias: Option<Tensor>,
    in1: usize,
    in2: usize,
    out: usize,
}

impl Bilinear {
    /// A new layer with PyTorch's init.
    pub fn new(in1_features: usize, in2_features: usize, out_features: usize, bias: bool) -> Result<Bilinear> {
        let b = 1.0 / (in1_features.max(1) as f64).sqrt();
        let weight = init::parameter(&[out_features, in1_features, in2_features], |t| init::uniform_(t, -b, b))?;
        let bias = if bias { Some(init::parameter(&[out_features], |t| init::uniform_(t, -b, b))?) } else { None };
        Ok(Bilinear { weight, bias, in1: in1_features, in2: in2_features, out: out_features })
    }
    /// `forward(x1, x2)`.
    pub fn forward2(&self, x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
        crate::functional::bilinear(x1, x2, &self.weight, self.bias.as_ref())
    }
}

impl Module for Bilinear {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(ferrofx_core::Error::argument(
            "Bilinear",
            "Bilinear takes two inputs: use call_values(&[x1, x2]) or forward2",
        ))
    }
    fn forward_values(&self, inputs: &[ferrofx_core::Value]) -> Result<Vec<ferrofx_core::Value>> {
        match inputs {
            [ferrofx_core::Value::Tensor(a), ferrofx_core::Value::Tensor(b)] => Ok(vec![self.forward2(a, b)?.into()]),
            _ => Err(ferrofx_core::Error::argument("Bilinear", format!("expected two tensors, got {inputs:?}"))),
        }
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("Bilinear")
                .with("in1_features", Attr::Int(self.in1 as i64))
                .with("in2_features", Attr::Int(self.in2 as i64))
                .with("out_features", Attr::Int(self.out as i64))
                .with("bias", Attr::Bool(self.bias.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "in1_features={}, in2_features={}, out_features={}, bias={}",
            self.in1,
            self.in2,
            self.out,
            py_bool(self.bias.is_some())
        )
    }
}

impl Linear {
    /// Rebuilds a Linear from its spec, adopting `weight` and `bias` from `src`.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<Linear> {
        let (i, o) = (s.size("in_features", 0)?, s.size("out_features", 0)?);
        let weight = spec::tensor(s, src, "weight", &[o, i])?;
        let bias = spec::opt_tensor(s, src, "bias", &[o], s.bool("bias")?)?;
        Ok(Linear { weight, bias, in_features: i, out_features: o })
    }
}

impl Bilinear {
    /// Rebuilds a Bilinear from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<Bilinear> {
        let (in1, in2, out) = (s.size("in1_features", 1)?, s.size("in2_features", 1)?, s.size("out_features", 1)?);
        let weight = spec::tensor(s, src, "weight", &[out, in1, in2])?;
        let bias = spec::opt_tensor(s, src, "bias", &[out], s.bool("bias")?)?;
        Ok(Bilinear { weight, bias, in1, in2, out })
    }
}
