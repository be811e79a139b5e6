//! The module system: [`Module`] (object-safe, what containers, tracers and GraphModule hold),
//! [`ModuleStructure`] (what `#[derive(Module)]` writes: the fields that are parameters,
//! buffers and children); the user implements [`Module::forward`].
//!
//! ```
//! use ferrofx_nn::{Linear, Module, Tensor, Result};
//!
//! #[derive(ferrofx_nn::Module)]
//! struct Net {
//!     fc1: Linear,
//!     fc2: Linear,
//!     hidden: usize, // configuration: ignored automatically
//! }
//!
//! impl Module for Net {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         let h = self.fc1.call(x)?;
//!         self.fc2.call(&h)
//!     }
//! }
//!
//! let net = Net { fc1: Linear::new(4, 8, true).unwrap(), fc2: Linear::new(8, 2, true).unwrap(), hidden: 8 };
//! let names: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
//! ```
//!
//! ## Field rules of `#[derive(Module)]`
//!
//! * A field whose type implements [`ModuleField`] is visited under its field name: [`Tensor`]
//!   (a parameter), `Option<Tensor>` (`None` is skipped, as PyTorch's `bias=None`), any
//!   [`Module`] (a child), `Vec<T>` (elements named `field.0`, `field.1`, ...), `Option<T>` and
//!   `Box<dyn Module>`.
//! * Every other field (sizes, flags, strings, configuration) is **ignored automatically**: the
//!   derive asks the compiler whether the field's type implements [`ModuleField`] and emits
//!   nothing when it does not. A field whose type mentions a generic parameter of the struct
//!   is always visited, so the parameter must be bounded by `Module` (or the field skipped).
//! * `#[module(buffer)]` makes a `Tensor` / `Option<Tensor>` field a buffer.
//! * `#[module(skip)]` ignores a field that would otherwise be visited.
//! * `#[module(rename = "0")]` uses another name in qualified paths and state dict keys.
//! * A field `training: bool` holds the module's own training flag.
//! * `#[module(name = "Conv2d")]` on the struct sets [`ModuleStructure::type_name`].
//!
//! ## Calling submodules
//!
//! Call submodules with [`Module::call`] (or [`Module::call_values`]), not `forward`: `call`
//! consults the thread's [`ModuleCallHook`] (installed by the fx tracer), which decides whether
//! the module is a leaf (recorded as one `call_module` node) or is traced through. Without a hook
//! installed `call` is `forward`.

use crate::state_dict::{LoadReport, StateDict};
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// Whether a tensor of a module is a trainable parameter or a buffer (running statistics...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// A parameter (`nn.Parameter`): trained by optimizers, `requires_grad` by default.
    Parameter,
    /// A buffer (`register_buffer`): saved in the state dict, not trained.
    Buffer,
}

/// The structure of a module: its own tensors and its children, by name. Written by
/// `#[derive(Module)]`; write it by hand only for containers with dynamic children.
pub trait ModuleStructure {
    /// The module's type name as PyTorch prints it (`Linear`, `Conv2d`, `Net`).
    fn type_name(&self) -> &'static str;
    /// Visits the module's own parameters and buffers (not the children's), in field order.
    fn visit_tensors(&self, f: &mut dyn FnMut(&str, TensorKind, &Tensor));
    /// Visits the module's own parameters and buffers mutably (to replace them: dtype
    /// conversion).
    fn visit_tensors_mut(&mut self, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor));
    /// Visits the direct children with their names.
    fn visit_children<'a>(&'a self, f: &mut dyn FnMut(&str, &'a dyn Module));
    /// Visits the direct children mutably.
    fn visit_children_mut(&mut self, f: &mut dyn FnMut(&str, &mut dyn Module));
    /// The module's own training flag, if it has one (a `training: bool` field).
    fn local_training(&self) -> Option<bool> {
        None
    }
    /// Sets the module's own training flag (no-op when it has none).
    fn set_local_training(&mut self, mode: bool) {
        let _ = mode;
    }
    /// `self` as `&dyn Module` (the derive writes `self`).
    fn as_module(&self) -> &dyn Module;
    /// `self` as `&mut dyn Module`.
    fn as_module_mut(&mut self) -> &mut dyn Module;
    /// `self` as `&dyn Any` (downcasting: `m.as_any().downcast_ref::<Linear>()`).
    fn as_any(&self) -> &dyn Any;
    /// `self` as `&mut dyn Any`.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

fn single_tensor_input<'a>(inputs: &'a [Value], what: &str) -> Result<&'a Tensor> {
    match inputs {
        [Value::Tensor(t)] => Ok(t),
        _ => Err(Error::argument(
            what,
            format!("this module's forward takes exactly one tensor, got {} argument(s): {:?}", inputs.len(), inputs),
        )),
    }
}

/// A neural-network module: object-safe, so heterogeneous containers hold `Box<dyn Module>`.
///
/// Write `#[derive(Module)]` (which implements the supertrait [`ModuleStructure`]) and
/// `impl Module for MyNet { fn forward(..) }`. The provided methods follow `torch.nn.Module`.
pub trait Module: ModuleStructure + Send + Sync + Any {
    /// The single-tensor forward pass. Prefer [`Module::call`] inside other modules.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// The general forward pass over several inputs and outputs (tensors, numbers, lists...).
    /// The default takes exactly one tensor and calls [`Module::forward`].
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let x = single_tensor_input(inputs, self.type_name())?;
        Ok(vec![Value::Tensor(self.forward(x)?)])
    }
    /// `true` for ferrofx's built-in layers: tracers keep them as leaves (`call_module`). The
    /// built-in layers are exactly the modules with a [`Module::spec`].
    fn is_builtin_leaf(&self) -> bool {
        self.spec().is_some()
    }
    /// A built-in layer's type and configuration, from which
    /// [`crate::spec::build_builtin`] rebuilds it with no source code (traced-module files store
    /// leaves this way). `None` for user-defined modules.
    fn spec(&self) -> Option<crate::spec::ModuleSpec> {
        None
    }
    /// A copy of this module that shares its tensors (parameters and buffers are cheap-clone
    /// handles to the same storage), as `Box<dyn Module>`: `Some` for the built-in layers,
    /// `None` by default. Tracers hold leaf modules in a `GraphModule` this way, sharing
    /// weights with the traced model as torch.fx's `GraphModule` shares submodules.
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        None
    }
    /// Extra text shown in the module's printout (`in_features=4, out_features=2, bias=True`).
    fn extra_repr(&self) -> String {
        String::new()
    }

    // ----- calling -----

    /// Calls the module on one tensor through the module call path: the installed
    /// [`ModuleCallHook`] (a tracer) sees the call; without one this is [`Module::forward`].
    fn call(&self, x: &Tensor) -> Result<Tensor> {
        match current_hook() {
            None => self.forward(x),
            Some(h) => h.call_module_single(self.as_module(), x),
        }
    }

    /// Calls the module on several values through the module call path.
    fn call_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        match current_hook() {
            None => self.forward_values(inputs),
            Some(h) => h.call_module(self.as_module(), inputs),
        }
    }

    // ----- structure -----

    /// Direct children with their names.
    fn named_children(&self) -> Vec<(String, &dyn Module)> {
        let mut out = Vec::new();
        self.visit_children(&mut |n, m| out.push((n.to_string(), m)));
        out
    }

    /// Every module of the tree (this one first, with the empty name), depth first, with
    /// PyTorch's qualified names (`layer1.0.conv1`). A module reachable twice is listed once.
    fn named_modules(&self) -> Vec<(String, &dyn Module)> {
        let mut out: Vec<(String, &dyn Module)> = Vec::new();
        let mut seen = HashSet::new();
        collect_modules(self.as_module(), String::new(), &mut out, &mut seen);
        out
    }

    /// Parameters with qualified names (`layer1.0.conv1.weight`); a tensor shared by several
    /// modules is listed once, as in PyTorch.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named_tensors(self.as_module(), Some(TensorKind::Parameter), true)
    }

    /// Buffers with qualified names.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        named_tensors(self.as_module(), Some(TensorKind::Buffer), true)
    }

    /// The parameters (the same handles the module uses, so optimizers update it in place).
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// The buffers.
    fn buffers(&self) -> Vec<Tensor> {
        self.named_buffers().into_iter().map(|(_, t)| t).collect()
    }

    /// The submodule at a dotted path (`"layer1.0.conv1"`; `""` is this module).
    fn get_submodule(&self, path: &str) -> Result<&dyn Module> {
        if path.is_empty() {
            return Ok(self.as_module());
        }
        let mut cur: &dyn Module = self.as_module();
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('.').collect();
        let mut i = 0;
        while i < parts.len() {
            // Children may have dotted names (`Vec` fields: `blocks.0`): match the longest.
            let mut found = None;
            for j in (i + 1..=parts.len()).rev() {
                let name = parts[i..j].join(".");
                if let Some((_, m)) = cur.named_children().into_iter().find(|(n, _)| *n == name) {
                    found = Some((m, j));
                    break;
                }
            }
            match found {
                Some((m, j)) => {
                    cur = m;
                    i = j;
                    prefix = parts[..j].join(".");
                }
                None => {
                    let names: Vec<String> = cur.named_children().into_iter().map(|(n, _)| n).collect();
                    return Err(Error::argument(
                        "get_submodule",
                        format!(
                            "{} has no submodule '{}' (looking up '{path}' at '{prefix}'); its children are {names:?}",
                            cur.type_name(),
                            parts[i]
                        ),
                    ));
                }
            }
        }
        Ok(cur)
    }

    /// The parameter or buffer at a qualified name.
    fn get_tensor(&self, name: &str) -> Result<Tensor> {
        let (module_path, leaf) = match name.rfind('.') {
            Some(i) => (&name[..i], &name[i + 1..]),
            None => ("", name),
        };
        let m = self.get_submodule(module_path)?;
        let mut found = None;
        m.visit_tensors(&mut |n, _, t| {
            if n == leaf {
                found = Some(t.clone());
            }
        });
        found.ok_or_else(|| {
            Error::argument(
                "get_tensor",
                format!("{} has no parameter or buffer '{leaf}' (looked up '{name}')", m.type_name()),
            )
        })
    }

    // ----- modes -----

    /// `train(mode)`: sets the training flag of this module and every descendant.
    fn train(&mut self, mode: bool) {
        self.set_local_training(mode);
        self.visit_children_mut(&mut |_, c| c.train(mode));
    }

    /// `eval()`: `train(false)`.
    fn eval(&mut self) {
        self.train(false);
    }

    /// The training flag: the module's own, or else the first one found among its descendants
    /// (depth first), or `true` when no module of the tree has a flag (nothing then behaves
    /// differently in training and evaluation).
    fn is_training(&self) -> bool {
        fn find(m: &dyn Module) -> Option<bool> {
            if let Some(t) = m.local_training() {
                return Some(t);
            }
            let mut r = None;
            m.visit_children(&mut |_, c| {
                if r.is_none() {
                    r = find(c);
                }
            });
            r
        }
        find(self.as_module()).unwrap_or(true)
    }

    /// Sets `requires_grad` on every parameter (`requires_grad_(false)` freezes the module).
    fn requires_grad_(&self, requires_grad: bool) -> Result<()> {
        for p in self.parameters() {
            p.requires_grad_(requires_grad)?;
        }
        Ok(())
    }

    /// Clears the gradients of every parameter (PyTorch's default `set_to_none=True`).
    fn zero_grad(&self) {
        for p in self.parameters() {
            let _ = p.set_grad(None);
        }
    }

    /// `apply(fn)`: calls `f` on every submodule (children first) and then on this module.
    fn apply(&mut self, f: &mut dyn FnMut(&mut dyn Module)) {
        self.visit_children_mut(&mut |_, c| c.apply(f));
        f(self.as_module_mut());
    }

    /// Converts every floating-point parameter and buffer to `dtype` (`module.to(dtype)`).
    /// Integer buffers (`num_batches_tracked`) keep their dtype, as in PyTorch. Parameters are
    /// replaced by new leaf tensors that keep `requires_grad`.
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        if !dtype.is_floating_point() {
            return Err(Error::dtype(
                "Module.to",
                format!("nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}"),
            ));
        }
        let mut err = None;
        self.apply(&mut |m| {
            m.visit_tensors_mut(&mut |_, _, t| {
                if err.is_some() || !t.dtype().is_floating_point() || t.dtype() == dtype {
                    return;
                }
                let rg = t.requires_grad();
                match t.detach().to_dtype(dtype).and_then(|n| n.contiguous()) {
                    Ok(n) => {
                        let n = if rg { n.detach().requires_grad_(true) } else { Ok(n) };
                        match n {
                            Ok(n) => *t = n,
                            Err(e) => err = Some(e),
                        }
                    }
                    Err(e) => err = Some(e),
                }
            })
        });
        err.map_or(Ok(()), Err)
    }

    // ----- state dict -----

    /// The state dict: every parameter and buffer by qualified name, in PyTorch's order (per
    /// module: parameters, then buffers, then the children). The tensors are the module's own
    /// handles (detach or save them to snapshot).
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        for (n, t) in named_tensors(self.as_module(), None, false) {
            sd.insert(n, t);
        }
        sd
    }

    /// Loads `state_dict` into this module's tensors **in place** (the handles stay the same,
    /// so optimizers and traced graphs keep working). With `strict`, missing and unexpected keys
    /// are errors; shape mismatches are always errors. Validation happens before any copy, so
    /// on error nothing is changed. The error message lists every problem like PyTorch's.
    fn load_state_dict(&self, state_dict: &StateDict, strict: bool) -> Result<LoadReport> {
        crate::state_dict::load_into(self.as_module(), state_dict, strict)
    }

    /// A printout like PyTorch's `print(model)`.
    fn repr(&self) -> String {
        let mut s = String::new();
        repr_into(self.as_module(), &mut s, 0);
        s
    }
}

impl std::fmt::Debug for dyn Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.repr())
    }
}

fn collect_modules<'a>(
    m: &'a dyn Module,
    prefix: String,
    out: &mut Vec<(String, &'a dyn Module)>,
    seen: &mut HashSet<(*const (), std::any::TypeId)>,
) {
    // A struct and its first field can share an address: identify a module by address and type.
    let key = (m as *const dyn Module as *const (), m.as_any().type_id());
    if !seen.insert(key) {
        return;
    }
    out.push((prefix.clone(), m));
    let mut kids: Vec<(String, &'a dyn Module)> = Vec::new();
    m.visit_children(&mut |n, c| kids.push((n.to_string(), c)));
    for (n, c) in kids {
        let p = if prefix.is_empty() { n } else { format!("{prefix}.{n}") };
        collect_modules(c, p, out, seen);
    }
}

/// Qualified tensors of the tree: per module its parameters, then its buffers, then the
/// children. `kind` filters; `dedup` lists a shared tensor once.
pub(crate) fn named_tensors(root: &dyn Module, kind: Option<TensorKind>, dedup: bool) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (prefix, m) in root.named_modules() {
        let mut params = Vec::new();
        let mut bufs = Vec::new();
        m.visit_tensors(&mut |n, k, t| {
            let q = if prefix.is_empty() { n.to_string() } else { format!("{prefix}.{n}") };
            match k {
                TensorKind::Parameter => params.push((q, t.clone())),
                TensorKind::Buffer => bufs.push((q, t.clone())),
            }
        });
        let lists: [(TensorKind, Vec<(String, Tensor)>); 2] =
            [(TensorKind::Parameter, params), (TensorKind::Buffer, bufs)];
        for (k, list) in lists {
            if kind.is_some_and(|want| want != k) {
                continue;
            }
            for (n, t) in list {
                if dedup && !seen.insert(t.id()) {
                    continue;
                }
                out.push((n, t));
            }
        }
    }
    out
}

fn repr_into(m: &dyn Module, s: &mut String, indent: usize) {
    let kids = m.named_children();
    s.push_str(m.type_name());
    s.push('(');
    let extra = m.extra_repr();
    if kids.is_empty() {
        s.push_str(&extra);
        s.push(')');
        return;
    }
    s.push('\n');
    let pad = " ".repeat(indent + 2);
    if !extra.is_empty() {
        s.push_str(&pad);
        s.push_str(&extra);
        s.push('\n');
    }
    for (n, c) in kids {
        s.push_str(&pad);
        s.push('(');
        s.push_str(&n);
        s.push_str("): ");
        repr_into(c, s, indent + 2);
        s.push('\n');
    }
    s.push_str(&" ".repeat(indent));
    s.push(')');
}

// ----- the module call hook -----

/// What a tracer installs to see module calls ([`Module::call`]). The hook decides: for a leaf
/// it records one `call_module` node and returns its symbolic outputs; otherwise it runs
/// `module.forward_values(inputs)` to trace through (and can keep a module stack meanwhile).
pub trait ModuleCallHook {
    /// Handles a call of `module` with `inputs` ([`Module::call_values`]).
    fn call_module(&self, module: &dyn Module, inputs: &[Value]) -> Result<Vec<Value>>;
    /// Handles a single-tensor call ([`Module::call`], which runs [`Module::forward`]); by
    /// default [`ModuleCallHook::call_module`] with one input, expecting one tensor back.
    fn call_module_single(&self, module: &dyn Module, x: &Tensor) -> Result<Tensor> {
        let out = self.call_module(module, &[Value::Tensor(x.clone())])?;
        match <[Value; 1]>::try_from(out) {
            Ok([Value::Tensor(t)]) => Ok(t),
            Ok([other]) => Err(Error::argument(
                module.type_name(),
                format!("call: expected the module to return one tensor, got {other:?}"),
            )),
            Err(v) => Err(Error::argument(
                module.type_name(),
                format!("call: expected the module to return one tensor, got {} values", v.len()),
            )),
        }
    }
}

thread_local! {
    static CALL_HOOK: RefCell<Option<Rc<dyn ModuleCallHook>>> = const { RefCell::new(None) };
}

fn current_hook() -> Option<Rc<dyn ModuleCallHook>> {
    CALL_HOOK.with(|h| h.borrow().clone())
}

/// Runs `f` with `hook` seeing every [`Module::call`] on this thread; the previous hook is
/// restored afterwards (also on panic).
pub fn with_module_call_hook<R>(hook: Rc<dyn ModuleCallHook>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<dyn ModuleCallHook>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            CALL_HOOK.with(|h| *h.borrow_mut() = prev);
        }
    }
    let prev = CALL_HOOK.with(|h| h.borrow_mut().replace(hook));
    let _restore = Restore(prev);
    f()
}

/// `true` while a module call hook is installed on this thread.
pub fn has_module_call_hook() -> bool {
    CALL_HOOK.with(|h| h.borrow().is_some())
}

// ----- field visiting (used by the derive) -----

/// A field type `#[derive(Module)]` visits: tensors, modules and collections of them.
pub trait ModuleField {
    /// Visits the tensors this field holds directly (a `Tensor` field is one parameter).
    fn visit_field_tensors(&self, name: &str, kind: TensorKind, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        let _ = (name, kind, f);
    }
    /// Mutable form of [`ModuleField::visit_field_tensors`].
    fn visit_field_tensors_mut(
        &mut self,
        name: &str,
        kind: TensorKind,
        f: &mut dyn FnMut(&str, TensorKind, &mut Tensor),
    ) {
        let _ = (name, kind, f);
    }
    /// Visits the child modules this field holds.
    fn visit_field_children<'a>(&'a self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        let _ = (name, f);
    }
    /// Mutable form of [`ModuleField::visit_field_children`].
    fn visit_field_children_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        let _ = (name, f);
    }
}

impl ModuleField for Tensor {
    fn visit_field_tensors(&self, name: &str, kind: TensorKind, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        f(name, kind, self)
    }
    fn visit_field_tensors_mut(
        &mut self,
        name: &str,
        kind: TensorKind,
        f: &mut dyn FnMut(&str, TensorKind, &mut Tensor),
    ) {
        f(name, kind, self)
    }
}

impl<M: Module> ModuleField for M {
    fn visit_field_children<'a>(&'a self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        f(name, self)
    }
    fn visit_field_children_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        f(name, self)
    }
}

impl ModuleField for Box<dyn Module> {
    fn visit_field_children<'a>(&'a self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        f(name, &**self)
    }
    fn visit_field_children_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        f(name, &mut **self)
    }
}

impl<T: ModuleField> ModuleField for Option<T> {
    fn visit_field_tensors(&self, name: &str, kind: TensorKind, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        if let Some(x) = self {
            x.visit_field_tensors(name, kind, f)
        }
    }
    fn visit_field_tensors_mut(
        &mut self,
        name: &str,
        kind: TensorKind,
        f: &mut dyn FnMut(&str, TensorKind, &mut Tensor),
    ) {
        if let Some(x) = self {
            x.visit_field_tensors_mut(name, kind, f)
        }
    }
    fn visit_field_children<'a>(&'a self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        if let Some(x) = self {
            x.visit_field_children(name, f)
        }
    }
    fn visit_field_children_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        if let Some(x) = self {
            x.visit_field_children_mut(name, f)
        }
    }
}

impl<T: ModuleField> ModuleField for Vec<T> {
    fn visit_field_tensors(&self, name: &str, kind: TensorKind, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        for (i, x) in self.iter().enumerate() {
            x.visit_field_tensors(&format!("{name}.{i}"), kind, f)
        }
    }
    fn visit_field_tensors_mut(
        &mut self,
        name: &str,
        kind: TensorKind,
        f: &mut dyn FnMut(&str, TensorKind, &mut Tensor),
    ) {
        for (i, x) in self.iter_mut().enumerate() {
            x.visit_field_tensors_mut(&format!("{name}.{i}"), kind, f)
        }
    }
    fn visit_field_children<'a>(&'a self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        for (i, x) in self.iter().enumerate() {
            x.visit_field_children(&format!("{name}.{i}"), f)
        }
    }
    fn visit_field_children_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        for (i, x) in self.iter_mut().enumerate() {
            x.visit_field_children_mut(&format!("{name}.{i}"), f)
        }
    }
}

/// Support code for `#[derive(Module)]` (not a stable API).
#[doc(hidden)]
pub mod __private {
    use super::{Module, ModuleField, TensorKind};
    use ferrofx_core::Tensor;
    use std::cell::Cell;

    pub struct Field<'a, T>(pub &'a T);
    pub struct FieldMut<'a, T>(Cell<Option<&'a mut T>>);
    impl<'a, T> FieldMut<'a, T> {
        pub fn new(x: &'a mut T) -> Self {
            FieldMut(Cell::new(Some(x)))
        }
    }

    // Autoref specialisation: `(&&Field(&x)).__tensors(..)` picks `ViaField` when the field's
    // type implements `ModuleField` and falls back to the no-op `ViaIgnore` otherwise.
    pub trait ViaField<'a> {
        fn __tensors(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor));
        fn __children(&self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module));
    }
    impl<'a, T: ModuleField> ViaField<'a> for &Field<'a, T> {
        fn __tensors(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
            self.0.visit_field_tensors(name, TensorKind::Parameter, f)
        }
        fn __children(&self, name: &str, f: &mut dyn FnMut(&str, &'a dyn Module)) {
            self.0.visit_field_children(name, f)
        }
    }
    pub trait ViaIgnore<'a> {
        fn __tensors(&self, _name: &str, _f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {}
        fn __children(&self, _name: &str, _f: &mut dyn FnMut(&str, &'a dyn Module)) {}
    }
    impl<'a, T> ViaIgnore<'a> for Field<'a, T> {}

    pub trait ViaFieldMut {
        fn __tensors_mut(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor));
        fn __children_mut(&self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module));
    }
    impl<T: ModuleField> ViaFieldMut for &FieldMut<'_, T> {
        fn __tensors_mut(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
            if let Some(x) = self.0.take() {
                x.visit_field_tensors_mut(name, TensorKind::Parameter, f)
            }
        }
        fn __children_mut(&self, name: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
            if let Some(x) = self.0.take() {
                x.visit_field_children_mut(name, f)
            }
        }
    }
    pub trait ViaIgnoreMut {
        fn __tensors_mut(&self, _name: &str, _f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {}
        fn __children_mut(&self, _name: &str, _f: &mut dyn FnMut(&str, &mut dyn Module)) {}
    }
    impl<T> ViaIgnoreMut for FieldMut<'_, T> {}

    /// Buffers: only tensors (and options/vectors of them) can be `#[module(buffer)]`.
    pub trait BufferField {
        fn visit_buffer(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor));
        fn visit_buffer_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor));
    }
    impl BufferField for Tensor {
        fn visit_buffer(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
            f(name, TensorKind::Buffer, self)
        }
        fn visit_buffer_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
            f(name, TensorKind::Buffer, self)
        }
    }
    impl<T: BufferField> BufferField for Option<T> {
        fn visit_buffer(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
            if let Some(x) = self {
                x.visit_buffer(name, f)
            }
        }
        fn visit_buffer_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
            if let Some(x) = self {
                x.visit_buffer_mut(name, f)
            }
        }
    }
    impl<T: BufferField> BufferField for Vec<T> {
        fn visit_buffer(&self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
            for (i, x) in self.iter().enumerate() {
                x.visit_buffer(&format!("{name}.{i}"), f)
            }
        }
        fn visit_buffer_mut(&mut self, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
            for (i, x) in self.iter_mut().enumerate() {
                x.visit_buffer_mut(&format!("{name}.{i}"), f)
            }
        }
    }
    pub fn visit_buffer<T: BufferField>(x: &T, name: &str, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        x.visit_buffer(name, f)
    }
    pub fn visit_buffer_mut<T: BufferField>(x: &mut T, name: &str, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
        x.visit_buffer_mut(name, f)
    }
}
