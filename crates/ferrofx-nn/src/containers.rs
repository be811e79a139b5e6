//! Containers: [`Sequential`], [`ModuleList`], [`ModuleDict`] (children named `0`, `1`, ... or
//! by key, as in PyTorch).

use crate::module::{Module, ModuleStructure, TensorKind};
use ferrofx_core::{Error, Result, Tensor, Value};
use indexmap::IndexMap;
use std::any::Any;

/// `nn.Sequential`: calls its children in order (through [`Module::call`], so tracers see
/// each one). Not a tracing leaf: tracers trace through it, as FX does.
///
/// ```
/// use ferrofx_nn::{Linear, Module, Sequential};
/// let seq = Sequential::new().append(Linear::new(3, 4, true).unwrap()).append(Linear::new(4, 2, false).unwrap());
/// let names: Vec<String> = seq.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "1.weight"]);
/// ```
#[derive(Default)]
pub struct Sequential {
    modules: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty Sequential.
    pub fn new() -> Self {
        Sequential { modules: Vec::new() }
    }
    /// From boxed modules.
    pub fn from_modules(modules: Vec<Box<dyn Module>>) -> Self {
        Sequential { modules }
    }
    /// Appends a module (builder style).
    pub fn append<M: Module>(mut self, m: M) -> Self {
        self.modules.push(Box::new(m));
        self
    }
    /// Appends a module.
    pub fn push<M: Module>(&mut self, m: M) {
        self.modules.push(Box::new(m));
    }
    /// Appends a boxed module.
    pub fn push_boxed(&mut self, m: Box<dyn Module>) {
        self.modules.push(m);
    }
    /// Number of children.
    pub fn len(&self) -> usize {
        self.modules.len()
    }
    /// `true` without children.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
    /// Child `i`.
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.modules.get(i).map(|m| &**m)
    }
    /// Child `i`, mutably.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut (dyn Module + 'static)> {
        self.modules.get_mut(i).map(|m| &mut **m)
    }
    /// The children.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.modules.iter().map(|m| &**m)
    }
}

impl ModuleStructure for Sequential {
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
    fn type_name(&self) -> &'static str {
        "Sequential"
    }
    fn visit_tensors(&self, _f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {}
    fn visit_tensors_mut(&mut self, _f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {}
    fn visit_children<'a>(&'a self, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        for (i, m) in self.modules.iter().enumerate() {
            f(&i.to_string(), &**m)
        }
    }
    fn visit_children_mut(&mut self, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        for (i, m) in self.modules.iter_mut().enumerate() {
            f(&i.to_string(), &mut **m)
        }
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for m in &self.modules {
            h = m.call(&h)?;
        }
        Ok(h)
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let mut h = inputs.to_vec();
        for m in &self.modules {
            h = m.call_values(&h)?;
        }
        Ok(h)
    }
}

/// `nn.ModuleList`: holds modules (named `0`, `1`, ...); it has no forward of its own.
#[derive(Default)]
pub struct ModuleList {
    modules: Vec<Box<dyn Module>>,
}

impl ModuleList {
    /// An empty list.
    pub fn new() -> Self {
        ModuleList::default()
    }
    /// From boxed modules.
    pub fn from_modules(modules: Vec<Box<dyn Module>>) -> Self {
        ModuleList { modules }
    }
    /// Appends a module.
    pub fn push<M: Module>(&mut self, m: M) {
        self.modules.push(Box::new(m));
    }
    /// Number of modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
    /// Module `i`.
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.modules.get(i).map(|m| &**m)
    }
    /// The modules.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.modules.iter().map(|m| &**m)
    }
}

impl ModuleStructure for ModuleList {
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
    fn type_name(&self) -> &'static str {
        "ModuleList"
    }
    fn visit_tensors(&self, _f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {}
    fn visit_tensors_mut(&mut self, _f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {}
    fn visit_children<'a>(&'a self, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        for (i, m) in self.modules.iter().enumerate() {
            f(&i.to_string(), &**m)
        }
    }
    fn visit_children_mut(&mut self, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        for (i, m) in self.modules.iter_mut().enumerate() {
            f(&i.to_string(), &mut **m)
        }
    }
}

impl Module for ModuleList {
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::argument("ModuleList", "ModuleList has no forward; iterate over its modules and call them"))
    }
}

/// `nn.ModuleDict`: modules by key, in insertion order.
#[derive(Default)]
pub struct ModuleDict {
    modules: IndexMap<String, Box<dyn Module>>,
}

impl ModuleDict {
    /// An empty dict.
    pub fn new() -> Self {
        ModuleDict::default()
    }
    /// Inserts (or replaces) a module under `key`. Keys may not contain `.` (like PyTorch).
    pub fn insert<M: Module>(&mut self, key: &str, m: M) -> Result<()> {
        if key.contains('.') || key.is_empty() {
            return Err(Error::argument(
                "ModuleDict",
                format!("module name can't contain \".\" or be empty, got: \"{key}\""),
            ));
        }
        self.modules.insert(key.to_string(), Box::new(m));
        Ok(())
    }
    /// The module under `key`.
    pub fn get(&self, key: &str) -> Option<&dyn Module> {
        self.modules.get(key).map(|m| &**m)
    }
    /// Number of modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(|k| k.as_str())
    }
}

impl ModuleStructure for ModuleDict {
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
    fn type_name(&self) -> &'static str {
        "ModuleDict"
    }
    fn visit_tensors(&self, _f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {}
    fn visit_tensors_mut(&mut self, _f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {}
    fn visit_children<'a>(&'a self, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        for (k, m) in &self.modules {
            f(k, &**m)
        }
    }
    fn visit_children_mut(&mut self, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        for (k, m) in self.modules.iter_mut() {
            f(k, &mut **m)
        }
    }
}

impl Module for ModuleDict {
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::argument("ModuleDict", "ModuleDict has no forward; look modules up by key and call them"))
    }
}
