//! Activation layers and Dropout.

use crate::spec::{Attr, ModuleSpec};
use crate::{functional as F, Module};
use ferrofx_core::{Error, Result, Tensor};

macro_rules! simple_activation {
    ($(#[$doc:meta])* $name:ident, $f:expr) => {
        $(#[$doc])*
        #[derive(crate::Module, Default, Clone, Copy)]
        pub struct $name {
            /// Gives each instance its own address: tracers identify module instances by
            /// address, and zero-sized values all share one.
            #[module(skip)]
            _instance: u8,
        }
        impl $name {
            /// A new layer.
            pub fn new() -> $name {
                $name { _instance: 0 }
            }
        }
        impl Module for $name {
            fn clone_module(&self) -> Option<Box<dyn Module>> {
                Some(Box::new(self.clone()))
            }
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let f: fn(&Tensor) -> Result<Tensor> = $f;
                f(x)
            }
            fn is_builtin_leaf(&self) -> bool {
                true
            }
            fn spec(&self) -> Option<ModuleSpec> {
                Some(ModuleSpec::new(stringify!($name)))
            }
        }
    };
}

simple_activation!(
    /// `nn.ReLU`.
    ReLU, F::relu);
simple_activation!(
    /// `nn.SiLU`.
    SiLU, F::silu);
simple_activation!(
    /// `nn.Sigmoid`.
    Sigmoid, F::sigmoid);
simple_activation!(
    /// `nn.Tanh`.
    Tanh, F::tanh);
simple_activation!(
    /// `nn.Hardswish`.
    Hardswish, F::hardswish);
simple_activation!(
    /// `nn.ReLU6`.
    ReLU6, F::relu6);

/// `nn.GELU(approximate='none')`.
#[derive(crate::Module, Clone)]
pub struct GELU {
    /// `"none"` or `"tanh"`.
    pub approximate: String,
}

impl GELU {
    /// `GELU(approximate)`.
    pub fn new(approximate: &str) -> Result<GELU> {
        if approximate != "none" && approximate != "tanh" {
            return Err(Error::argument("GELU", format!("approximate must be 'none' or 'tanh', got '{approximate}'")));
        }
        Ok(GELU { approximate: approximate.to_string() })
    }
}

impl Default for GELU {
    fn default() -> Self {
        GELU { approximate: "none".into() }
    }
}

impl Module for GELU {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::gelu(x, &self.approximate)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("GELU").with("approximate", Attr::Str(self.approximate.clone())))
    }
    fn extra_repr(&self) -> String {
        format!("approximate='{}'", self.approximate)
    }
}

/// `nn.LeakyReLU(negative_slope=0.01)`.
#[derive(crate::Module, Clone, Copy)]
pub struct LeakyReLU {
    /// Slope for negative inputs.
    pub negative_slope: f64,
}

impl LeakyReLU {
    /// `LeakyReLU(negative_slope)`.
    pub fn new(negative_slope: f64) -> LeakyReLU {
        LeakyReLU { negative_slope }
    }
}

impl Module for LeakyReLU {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::leaky_relu(x, self.negative_slope)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("LeakyReLU").with("negative_slope", Attr::Float(self.negative_slope)))
    }
    fn extra_repr(&self) -> String {
        format!("negative_slope={}", self.negative_slope)
    }
}

/// `nn.ELU(alpha=1.0)`.
#[derive(crate::Module, Clone, Copy)]
pub struct ELU {
    /// alpha
    pub alpha: f64,
}

impl ELU {
    /// `ELU(alpha)`.
    pub fn new(alpha: f64) -> ELU {
        ELU { alpha }
    }
}

impl Module for ELU {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::elu(x, self.alpha)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("ELU").with("alpha", Attr::Float(self.alpha)))
    }
    fn extra_repr(&self) -> String {
        format!("alpha={:?}", self.alpha)
    }
}

/// `nn.Softmax(dim)`.
#[derive(crate::Module, Clone, Copy)]
pub struct Softmax {
    /// The dimension.
    pub dim: i64,
}

impl Softmax {
    /// `Softmax(dim)`.
    pub fn new(dim: i64) -> Softmax {
        Softmax { dim }
    }
}

impl Module for Softmax {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::softmax(x, self.dim)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("Softmax").with("dim", Attr::Int(self.dim)))
    }
    fn extra_repr(&self) -> String {
        format!("dim={}", self.dim)
    }
}

/// `nn.LogSoftmax(dim)`.
#[derive(crate::Module, Clone, Copy)]
pub struct LogSoftmax {
    /// The dimension.
    pub dim: i64,
}

impl LogSoftmax {
    /// `LogSoftmax(dim)`.
    pub fn new(dim: i64) -> LogSoftmax {
        LogSoftmax { dim }
    }
}

impl Module for LogSoftmax {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::log_softmax(x, self.dim)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("LogSoftmax").with("dim", Attr::Int(self.dim)))
    }
    fn extra_repr(&self) -> String {
        format!("dim={}", self.dim)
    }
}

/// `nn.Dropout(p=0.5)`: zeroes elements with probability `p` and scales the rest by
/// `1/(1-p)` in training; identity in eval.
#[derive(crate::Module, Clone, Copy)]
pub struct Dropout {
    /// Drop probability.
    pub p: f64,
    training: bool,
}

impl Dropout {
    /// `Dropout(p)`; `p` must be in `[0, 1]`.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::argument(
                "Dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(Dropout { p, training: true })
    }
}

impl Module for Dropout {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::dropout(x, self.p, self.training)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("Dropout").with("p", Attr::Float(self.p)).with("training", Attr::Bool(self.training)))
    }
    fn extra_repr(&self) -> String {
        format!("p={:?}, inplace=False", self.p)
    }
}
