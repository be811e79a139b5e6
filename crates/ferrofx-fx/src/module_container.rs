//! [`ModuleContainer`]: an intermediate module of a [`crate::GraphModule`]'s namespace.
//!
//! FX's `GraphModule` copies, for a target `layer1.0.conv1`, the containers `layer1` and
//! `layer1.0` as plain `nn.Module()` objects holding only what the graph uses. A ferrofx
//! GraphModule stores its modules flat by qualified path; the containers are derived from those
//! paths (and from the paths `add_submodule` created), so `get_submodule("layer1")` answers
//! with one of these. A container computes nothing: calling it is an error.

use ferrofx_core::{Error, Result, Tensor};
use ferrofx_nn::module::ModuleStructure;
use ferrofx_nn::{Module, TensorKind};
use std::any::Any;

/// An intermediate namespace module (FX's plain `nn.Module()` container): its qualified path
/// and the names of its direct children (modules and tensors), which live in the owning
/// GraphModule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleContainer {
    path: String,
    children: Vec<String>,
}

impl ModuleContainer {
    pub(crate) fn new(path: String, children: Vec<String>) -> ModuleContainer {
        ModuleContainer { path, children }
    }

    /// The container's qualified path in its GraphModule.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The names of its direct children (submodules, containers and tensors), in the owning
    /// GraphModule's order.
    pub fn children(&self) -> &[String] {
        &self.children
    }
}

impl ModuleStructure for ModuleContainer {
    fn type_name(&self) -> &'static str {
        "Module"
    }
    fn visit_tensors(&self, _: &mut dyn FnMut(&str, TensorKind, &Tensor)) {}
    fn visit_tensors_mut(&mut self, _: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {}
    fn visit_children<'a>(&'a self, _: &mut dyn FnMut(&str, &'a dyn Module)) {}
    fn visit_children_mut(&mut self, _: &mut dyn FnMut(&str, &mut dyn Module)) {}
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

impl Module for ModuleContainer {
    fn forward(&self, _: &Tensor) -> Result<Tensor> {
        Err(Error::argument(
            "Module.forward",
            format!(
                "'{}' is an intermediate container of a GraphModule's namespace (FX's plain nn.Module()); it has no forward: call the GraphModule or one of its leaf modules",
                self.path
            ),
        ))
    }
}
