//! Module specs: a built-in layer's type and configuration, enough to rebuild it without any
//! source code.
//!
//! A traced module file stores each leaf module (`call_module` target) as a [`ModuleSpec`] plus
//! its tensors; [`build_builtin`] turns them back into a module. Nothing here runs code named by
//! data: the type name selects one of the built-in constructors below, and every attribute and
//! tensor is checked (type, range, shape) before use, so a hostile file gets an `Err`.
//!
//! ```
//! use ferrofx_nn::{spec, Linear, Module};
//! let lin = Linear::new(4, 2, true).unwrap();
//! let s = lin.spec().unwrap();
//! assert_eq!(s.type_name, "Linear");
//! let sd: std::collections::HashMap<String, _> = lin.named_parameters().into_iter().collect();
//! let rebuilt = spec::build_builtin(&s, &mut |name: &str| sd.get(name).cloned()).unwrap();
//! assert_eq!(rebuilt.type_name(), "Linear");
//! ```

use crate::Module;
use ferrofx_core::{DType, Error, Result, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One configuration value of a [`ModuleSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Attr {
    /// Python's `None`.
    None,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A list of integers (kernel sizes, strides, shapes).
    Ints(Vec<i64>),
    /// A string (`approximate="tanh"`, `activation="relu"`).
    Str(String),
}

/// A built-in module's type name (PyTorch's class name) and configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleSpec {
    /// `Conv2d`, `BatchNorm2d`, `Linear`, ...
    pub type_name: String,
    /// Constructor arguments and flags, by PyTorch's argument names.
    pub attrs: BTreeMap<String, Attr>,
}

/// Where [`build_builtin`] takes a module's tensors from, by name relative to the module
/// (`weight`, `running_mean`, `self_attn.in_proj_weight`).
pub type TensorSource<'a> = dyn FnMut(&str) -> Option<Tensor> + 'a;

impl ModuleSpec {
    /// A spec without attributes.
    pub fn new(type_name: &str) -> ModuleSpec {
        ModuleSpec { type_name: type_name.to_string(), attrs: BTreeMap::new() }
    }

    /// Adds an attribute (builder style).
    pub fn with(mut self, name: &str, value: Attr) -> ModuleSpec {
        self.attrs.insert(name.to_string(), value);
        self
    }

    fn get(&self, name: &str) -> Result<&Attr> {
        self.attrs.get(name).ok_or_else(|| {
            Error::argument(&self.type_name, format!("module spec has no attribute '{name}'; the file is incomplete"))
        })
    }

    fn bad(&self, name: &str, want: &str, got: &Attr) -> Error {
        Error::argument(&self.type_name, format!("attribute '{name}' must be {want}, got {got:?}"))
    }

    /// An integer attribute.
    pub fn int(&self, name: &str) -> Result<i64> {
        match self.get(name)? {
            Attr::Int(v) => Ok(*v),
            a => Err(self.bad(name, "an integer", a)),
        }
    }

    /// A non-negative integer attribute that must also be at least `min`.
    pub fn size(&self, name: &str, min: usize) -> Result<usize> {
        let v = self.int(name)?;
        if v < min as i64 || v > (1 << 40) {
            return Err(Error::argument(
                &self.type_name,
                format!("attribute '{name}' = {v} is out of range (>= {min})"),
            ));
        }
        Ok(v as usize)
    }

    /// An optional integer attribute (`None` allowed).
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name)? {
            Attr::None => Ok(None),
            Attr::Int(v) => Ok(Some(*v)),
            a => Err(self.bad(name, "an integer or None", a)),
        }
    }

    /// A float attribute (integers are accepted, as Python would).
    pub fn float(&self, name: &str) -> Result<f64> {
        match self.get(name)? {
            Attr::Float(v) if v.is_finite() => Ok(*v),
            Attr::Int(v) => Ok(*v as f64),
            a => Err(self.bad(name, "a finite float", a)),
        }
    }

    /// An optional float attribute.
    pub fn opt_float(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name)? {
            Attr::None => Ok(None),
            _ => self.float(name).map(Some),
        }
    }

    /// A boolean attribute.
    pub fn bool(&self, name: &str) -> Result<bool> {
        match self.get(name)? {
            Attr::Bool(v) => Ok(*v),
            a => Err(self.bad(name, "a bool", a)),
        }
    }

    /// A string attribute.
    pub fn str(&self, name: &str) -> Result<&str> {
        match self.get(name)? {
            Attr::Str(v) => Ok(v),
            a => Err(self.bad(name, "a string", a)),
        }
    }

    /// A list of `N` integers.
    pub fn ints<const N: usize>(&self, name: &str) -> Result<[i64; N]> {
        match self.get(name)? {
            Attr::Ints(v) if v.len() == N => {
                let mut out = [0; N];
                out.copy_from_slice(v);
                Ok(out)
            }
            a => Err(self.bad(name, &format!("a list of {N} integers"), a)),
        }
    }

    /// A list of sizes (each in `1..=2^40`).
    pub fn sizes(&self, name: &str) -> Result<Vec<usize>> {
        match self.get(name)? {
            Attr::Ints(v) if v.iter().all(|&x| (1..=(1 << 40)).contains(&x)) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            a => Err(self.bad(name, "a list of positive sizes", a)),
        }
    }
}

/// `[a, b]` as an attribute.
pub(crate) fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// A tensor the module needs, checked against the shape the configuration implies.
pub(crate) fn tensor(spec: &ModuleSpec, src: &mut TensorSource, name: &str, shape: &[usize]) -> Result<Tensor> {
    let t = src(name).ok_or_else(|| {
        Error::argument(&spec.type_name, format!("missing tensor '{name}' (expected shape {shape:?})"))
    })?;
    if t.shape() != shape {
        return Err(Error::shape(
            &spec.type_name,
            format!("tensor '{name}' has shape {:?}, but the configuration implies {shape:?}", t.shape()),
        ));
    }
    if !t.dtype().is_floating_point() && t.dtype() != DType::I64 {
        return Err(Error::dtype(&spec.type_name, format!("tensor '{name}' has dtype {:?}", t.dtype())));
    }
    Ok(t)
}

/// An optional tensor: present iff `present`.
pub(crate) fn opt_tensor(
    spec: &ModuleSpec,
    src: &mut TensorSource,
    name: &str,
    shape: &[usize],
    present: bool,
) -> Result<Option<Tensor>> {
    if present {
        tensor(spec, src, name, shape).map(Some)
    } else {
        Ok(None)
    }
}

/// Rebuilds a built-in module from its spec and tensors (which it adopts, without copying).
///
/// Errors name the module type and say what is wrong: unknown type, missing or ill-typed
/// attribute, missing tensor or a tensor whose shape disagrees with the configuration.
pub fn build_builtin(spec: &ModuleSpec, src: &mut TensorSource) -> Result<Box<dyn Module>> {
    use crate::layers::*;
    let mut m: Box<dyn Module> = match spec.type_name.as_str() {
        "ReLU" => Box::new(ReLU::new()),
        "SiLU" => Box::new(SiLU::new()),
        "Sigmoid" => Box::new(Sigmoid::new()),
        "Tanh" => Box::new(Tanh::new()),
        "Hardswish" => Box::new(Hardswish::new()),
        "ReLU6" => Box::new(ReLU6::new()),
        "GELU" => Box::new(GELU::new(spec.str("approximate")?)?),
        "LeakyReLU" => Box::new(LeakyReLU::new(spec.float("negative_slope")?)),
        "ELU" => Box::new(ELU::new(spec.float("alpha")?)),
        "Softmax" => Box::new(Softmax::new(spec.int("dim")?)),
        "LogSoftmax" => Box::new(LogSoftmax::new(spec.int("dim")?)),
        "Dropout" => Box::new(Dropout::new(spec.float("p")?)?),
        "Identity" => Box::new(Identity::new()),
        "Flatten" => Box::new(Flatten::new(spec.int("start_dim")?, spec.int("end_dim")?)),
        "Linear" => Box::new(Linear::from_spec(spec, src)?),
        "Bilinear" => Box::new(Bilinear::from_spec(spec, src)?),
        "Conv1d" => Box::new(Conv1d::from_spec(spec, src)?),
        "Conv2d" => Box::new(Conv2d::from_spec(spec, src)?),
        "ConvTranspose2d" => Box::new(ConvTranspose2d::from_spec(spec, src)?),
        "BatchNorm1d" | "BatchNorm2d" => Box::new(BatchNorm::from_spec(spec, src)?),
        "LayerNorm" => Box::new(LayerNorm::from_spec(spec, src)?),
        "GroupNorm" => Box::new(GroupNorm::from_spec(spec, src)?),
        "MaxPool2d" => Box::new(MaxPool2d::from_spec(spec)?),
        "AvgPool2d" => Box::new(AvgPool2d::from_spec(spec)?),
        "AdaptiveAvgPool2d" => Box::new(AdaptiveAvgPool2d::from_spec(spec)?),
        "Embedding" => Box::new(Embedding::from_spec(spec, src)?),
        "MultiheadAttention" => Box::new(MultiheadAttention::from_spec(spec, src)?),
        "TransformerEncoderLayer" => Box::new(TransformerEncoderLayer::from_spec(spec, src)?),
        "LSTM" => Box::new(LSTM::from_spec(spec, src)?),
        other => {
            return Err(Error::argument(
                "build_builtin",
                format!("unknown module type '{other}': only ferrofx's built-in layers can be rebuilt from a spec"),
            ))
        }
    };
    if spec.attrs.contains_key("training") {
        m.train(spec.bool("training")?);
    }
    Ok(m)
}
