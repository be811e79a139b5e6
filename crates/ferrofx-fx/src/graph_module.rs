//! `GraphModule`: a module whose forward is a graph (FX's `GraphModule`).
//!
//! It owns the graph, the leaf modules the graph calls (copies of the traced model's leaves made
//! by `Module::clone_module`, or rebuilt from their specs after loading, in both cases sharing
//! the tensors, as FX's GraphModule shares the root's submodules), and the tensors
//! its `get_attr` nodes read (parameters, buffers, traced constants). It is a [`Module`]: it
//! runs, trains (gradients flow to the shared parameters), nests, and has a state dict with the
//! original model's keys.
//!
//! **Execution plan.** [`GraphModule::recompile`] lints the graph (including that every target
//! resolves) and turns it into a plan: ops resolved from the registry once, one value slot per
//! node, each value dropped right after its last use. [`GraphModule::code`] prints the plan.
//!
//! **No stale code.** The graph can only be edited through [`GraphModule::graph_mut`], which
//! marks the plan stale; the next forward recompiles automatically (an invalid edit then
//! surfaces as the forward's `Err`). Call `recompile()` yourself to see errors early.

use crate::graph::{Graph, Opcode};
use crate::module_container::ModuleContainer;
use crate::plan::Plan;
use crate::serialize::{
    check_declared_inputs, graph_from_doc, graph_to_doc, read_module_bytes, read_module_file, write_module_bytes,
    write_module_file, FormatError, LeafDoc, ModuleDoc, SubmoduleDoc, TensorDoc, TensorKind as DocKind,
};
use ferrofx_core::{Error, Result, Tensor, Value};
use ferrofx_nn::module::ModuleStructure;
use ferrofx_nn::{Module, StateDict, TensorKind};
use indexmap::IndexMap;
use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};

/// A tensor a `get_attr` node reads.
#[derive(Clone)]
pub struct TensorEntry {
    /// The tensor (shared with the traced model).
    pub tensor: Tensor,
    /// Parameter or buffer.
    pub kind: TensorKind,
    /// A constant captured while tracing (`_tensor_constant0`).
    pub constant: bool,
}

/// A module whose forward is a graph.
pub struct GraphModule {
    pub(crate) graph: Graph,
    pub(crate) modules: IndexMap<String, Box<dyn Module>>,
    pub(crate) attrs: IndexMap<String, TensorEntry>,
    pub(crate) type_name: String,
    training: bool,
    plan: RwLock<Option<Arc<Plan>>>,
    pub(crate) budget: std::sync::Mutex<crate::memory_budget::BudgetState>,
    /// The intermediate containers, derived from the paths on first use.
    containers: OnceLock<IndexMap<String, ModuleContainer>>,
    /// Containers that outlive their children (the parent of a deleted module, as in FX).
    kept_containers: Vec<String>,
    /// Modules flagged as having side effects (FX's `_is_impure`).
    impure_modules: std::collections::HashSet<String>,
}

/// What a dotted path of a GraphModule names.
pub(crate) enum Resolved<'a> {
    /// A module: leaf, nested traced module, a module inside one, or a container.
    Module(&'a dyn Module),
    /// A tensor of that kind (`constant`: a traced constant, a plain attribute in FX).
    Tensor {
        /// Parameter or buffer.
        kind: TensorKind,
        /// A traced constant.
        constant: bool,
    },
}

/// Where resolving a dotted path stopped: the atom, the path before it, the type of the
/// module that lacks it, and whether the atom names a tensor where a module was needed.
#[derive(Debug)]
pub(crate) struct Unresolved {
    pub(crate) atom: String,
    pub(crate) seen: String,
    pub(crate) parent_type: String,
    pub(crate) not_module: bool,
}

impl Unresolved {
    /// FX's `AttributeError` text.
    pub(crate) fn message(&self) -> String {
        if self.not_module {
            format!("`{}` is not an nn.Module", self.atom)
        } else {
            format!("{} has no attribute `{}`", self.parent_type, self.atom)
        }
    }
}

fn attr_err(op: &str, message: String) -> Error {
    Error::argument(op, message)
}

fn last_atom(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// Resolves `rest` inside `m` (found at `prefix`): nested GraphModules resolve on their own,
/// other modules through their children and tensors.
fn resolve_in<'a>(m: &'a dyn Module, prefix: &str, rest: &str) -> std::result::Result<Resolved<'a>, Unresolved> {
    let prefixed = |mut u: Unresolved| {
        u.seen = if u.seen.is_empty() { prefix.to_string() } else { format!("{prefix}.{}", u.seen) };
        u
    };
    if let Some(sub) = m.as_any().downcast_ref::<GraphModule>() {
        return sub.resolve(rest).map_err(prefixed);
    }
    if let Ok(sub) = m.get_submodule(rest) {
        return Ok(Resolved::Module(sub));
    }
    let (head, name) = match rest.rfind('.') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => ("", rest),
    };
    let owner = match m.get_submodule(head) {
        Ok(o) => o,
        Err(_) => {
            // the first atom of `head` that is no child of `m`
            let atom = head.split('.').next().unwrap_or(head);
            let mut is_tensor = false;
            m.visit_tensors(&mut |n, _, _| is_tensor |= n == atom);
            return Err(Unresolved {
                atom: atom.to_string(),
                seen: prefix.to_string(),
                parent_type: m.type_name().to_string(),
                not_module: is_tensor,
            });
        }
    };
    let mut found = None;
    owner.visit_tensors(&mut |n, kind, _| {
        if n == name {
            found = Some(kind);
        }
    });
    match found {
        Some(kind) => Ok(Resolved::Tensor { kind, constant: false }),
        None => Err(Unresolved {
            atom: name.to_string(),
            seen: if head.is_empty() { prefix.to_string() } else { format!("{prefix}.{head}") },
            parent_type: owner.type_name().to_string(),
            not_module: false,
        }),
    }
}

impl GraphModule {
    /// Assembles a GraphModule and compiles its plan.
    pub fn from_parts(
        graph: Graph,
        modules: IndexMap<String, Box<dyn Module>>,
        attrs: IndexMap<String, TensorEntry>,
        type_name: &str,
        training: bool,
    ) -> Result<GraphModule> {
        let gm = GraphModule {
            graph,
            modules,
            attrs,
            type_name: type_name.to_string(),
            training,
            plan: RwLock::new(None),
            budget: Default::default(),
            containers: OnceLock::new(),
            kept_containers: Vec::new(),
            impure_modules: Default::default(),
        };
        gm.recompile()?;
        Ok(gm)
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The graph, for editing; the plan is rebuilt before the next run.
    pub fn graph_mut(&mut self) -> &mut Graph {
        if let Ok(mut p) = self.plan.write() {
            *p = None;
        }
        &mut self.graph
    }

    /// Name of the traced module's type.
    pub fn traced_type_name(&self) -> &str {
        &self.type_name
    }

    /// The leaf modules by path.
    pub fn leaf_modules(&self) -> &IndexMap<String, Box<dyn Module>> {
        &self.modules
    }

    /// The tensors `get_attr` nodes read, by path.
    pub fn attributes(&self) -> &IndexMap<String, TensorEntry> {
        &self.attrs
    }

    /// Runs the graph on inputs it takes ownership of, dropping each input after its last use
    /// (AOTAutograd's "boxed" calling convention, where the compiled backward clears its
    /// argument list): a backward graph fed the saved activations frees each one as soon as it
    /// is consumed, as the eager engine does, instead of the caller keeping all of them alive
    /// until the call returns. Otherwise the same as `forward_values`.
    ///
    /// ```
    /// use ferrofx_core::{Tensor, Value};
    /// use ferrofx_fx::symbolic_trace;
    /// use ferrofx_nn::layers::ReLU;
    /// let gm = symbolic_trace(&ReLU::new()).unwrap();
    /// let x = Tensor::from_vec(vec![-1.0f32, 2.0], &[2]).unwrap();
    /// let out = gm.forward_values_owned(vec![Value::Tensor(x)]).unwrap();
    /// assert_eq!(out[0].as_tensor().unwrap().to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
    /// ```
    pub fn forward_values_owned(&self, inputs: Vec<Value>) -> Result<Vec<Value>> {
        let plan = self.plan()?;
        let inputs = match plan.complete_inputs(self, &inputs)? {
            Some(all) => all,
            None => inputs,
        };
        self.check_budget(&plan, &inputs)?;
        plan.run_owned(self, inputs)
    }

    /// The submodule at `path` among the modules this GraphModule holds directly (its leaf
    /// modules and nested traced modules, by qualified path); what the plan calls.
    pub fn get_submodule_owned(&self, path: &str) -> Result<&dyn Module> {
        self.modules.get(path).map(|m| m.as_ref()).ok_or_else(|| {
            Error::argument(
                "get_submodule",
                format!("GraphModule has no submodule '{path}'; it has: {:?}", self.modules.keys().collect::<Vec<_>>()),
            )
        })
    }

    /// The intermediate containers of the namespace, by path (derived from the module and
    /// attribute paths on first use, and rebuilt after an edit).
    fn containers(&self) -> &IndexMap<String, ModuleContainer> {
        self.containers.get_or_init(|| {
            let inside_module = |p: &str| {
                self.modules.contains_key(p) || p.match_indices('.').any(|(i, _)| self.modules.contains_key(&p[..i]))
            };
            let mut paths: IndexMap<String, Vec<String>> = IndexMap::new();
            let all = self.modules.keys().chain(self.attrs.keys()).chain(self.kept_containers.iter());
            for key in all.clone() {
                for (i, _) in key.match_indices('.') {
                    let prefix = &key[..i];
                    if !paths.contains_key(prefix) && !inside_module(prefix) && !self.attrs.contains_key(prefix) {
                        paths.insert(prefix.to_string(), vec![]);
                    }
                }
            }
            for kept in &self.kept_containers {
                if !paths.contains_key(kept) && !inside_module(kept) && !self.attrs.contains_key(kept) {
                    paths.insert(kept.clone(), vec![]);
                }
            }
            let containers: Vec<String> = paths.keys().cloned().collect();
            for key in all.chain(containers.iter()) {
                if let Some(i) = key.rfind('.') {
                    if let Some(children) = paths.get_mut(&key[..i]) {
                        let child = key[i + 1..].to_string();
                        if !children.contains(&child) {
                            children.push(child);
                        }
                    }
                }
            }
            paths.into_iter().map(|(p, c)| (p.clone(), ModuleContainer::new(p, c))).collect()
        })
    }

    /// Forgets the derived containers and the plan after a change of the namespace.
    fn namespace_changed(&mut self) {
        self.containers = OnceLock::new();
        self.invalidate();
    }

    /// What the dotted `path` names: a module (leaf, nested traced module or container) or a
    /// tensor, walking into leaf modules and nested GraphModules as FX's `getattr` chain does.
    pub(crate) fn resolve(&self, path: &str) -> std::result::Result<Resolved<'_>, Unresolved> {
        if path.is_empty() {
            return Ok(Resolved::Module(self));
        }
        if let Some(m) = self.modules.get(path) {
            return Ok(Resolved::Module(m.as_ref()));
        }
        if let Some(e) = self.attrs.get(path) {
            return Ok(Resolved::Tensor { kind: e.kind, constant: e.constant });
        }
        if let Some(c) = self.containers().get(path) {
            return Ok(Resolved::Module(c));
        }
        // walk the atoms: the longest module prefix owns the rest
        let mut parent_type = self.type_name.clone();
        let mut start = 0;
        loop {
            let end = path[start..].find('.').map(|i| start + i).unwrap_or(path.len());
            let prefix = &path[..end];
            let atom = &path[start..end];
            let seen = if start == 0 { String::new() } else { path[..start - 1].to_string() };
            if end == path.len() {
                return Err(Unresolved { atom: atom.into(), seen, parent_type, not_module: false });
            }
            let rest = &path[end + 1..];
            if let Some(m) = self.modules.get(prefix) {
                return resolve_in(m.as_ref(), prefix, rest);
            }
            if self.attrs.contains_key(prefix) {
                return Err(Unresolved { atom: atom.into(), seen, parent_type, not_module: true });
            }
            if !self.containers().contains_key(prefix) {
                return Err(Unresolved { atom: atom.into(), seen, parent_type, not_module: false });
            }
            parent_type = "Module".into();
            start = end + 1;
        }
    }

    /// FX's `get_submodule`: the module at the dotted `path`: a leaf module, a nested traced
    /// module, a module inside one, or an intermediate container ([`ModuleContainer`], FX's
    /// plain `nn.Module()`); `""` is the GraphModule itself. Errors use FX's wording.
    ///
    /// ```
    /// use ferrofx_fx::symbolic_trace;
    /// use ferrofx_nn::zoo::ResNet;
    /// use ferrofx_nn::ModuleStructure;
    /// let m = ResNet::build(false, [1, 1, 1, 1], [8, 16, 32, 64], 10).unwrap();
    /// let gm = symbolic_trace(&m).unwrap();
    /// assert_eq!(gm.get_submodule("layer1.0.conv1").unwrap().type_name(), "Conv2d");
    /// assert_eq!(gm.get_submodule("layer1").unwrap().type_name(), "Module"); // a container
    /// let e = gm.get_submodule("layer1.0.conv1.weight").unwrap_err();
    /// assert!(e.to_string().contains("`weight` is not an nn.Module"));
    /// ```
    pub fn get_submodule(&self, path: &str) -> Result<&dyn Module> {
        match self.resolve(path) {
            Ok(Resolved::Module(m)) => Ok(m),
            Ok(Resolved::Tensor { .. }) => {
                Err(attr_err("get_submodule", format!("`{}` is not an nn.Module", last_atom(path))))
            }
            Err(u) => Err(attr_err("get_submodule", u.message())),
        }
    }

    /// FX's `get_parameter`: the parameter at the dotted `path` (a tensor `get_attr` reads, or
    /// a leaf module's); a buffer, a constant or a module there is an error ("`x` is not an
    /// nn.Parameter"), as is a missing name ("M has no attribute `x`").
    pub fn get_parameter(&self, path: &str) -> Result<Tensor> {
        self.get_tensor_of_kind(
            path,
            "get_parameter",
            |kind, constant| kind == TensorKind::Parameter && !constant,
            "an nn.Parameter",
        )
    }

    /// FX's `get_buffer`: the buffer at the dotted `path`; a parameter, a traced constant
    /// (`_tensor_constant0` is a plain attribute in FX) or a module there is an error ("`x` is
    /// not a buffer").
    pub fn get_buffer(&self, path: &str) -> Result<Tensor> {
        self.get_tensor_of_kind(
            path,
            "get_buffer",
            |kind, constant| kind == TensorKind::Buffer && !constant,
            "a buffer",
        )
    }

    /// FX's `fetch_attr` for tensors: the tensor at the dotted `path`, whatever its kind
    /// (parameter, buffer, traced constant): what a `get_attr` node reads.
    pub fn get_attr(&self, path: &str) -> Result<Tensor> {
        self.get_tensor_of_kind(path, "get_attr", |_, _| true, "a tensor")
    }

    fn get_tensor_of_kind(
        &self,
        path: &str,
        op: &str,
        accept: impl Fn(TensorKind, bool) -> bool,
        what: &str,
    ) -> Result<Tensor> {
        match self.resolve(path) {
            Ok(Resolved::Tensor { kind, constant }) if accept(kind, constant) => {
                if let Some(e) = self.attrs.get(path) {
                    return Ok(e.tensor.clone());
                }
                self.get_tensor(path)
            }
            Ok(_) => Err(attr_err(op, format!("`{}` is not {what}", last_atom(path)))),
            Err(u) => Err(attr_err(op, u.message())),
        }
    }

    /// FX's `add_submodule`: adds (or replaces) `module` at the dotted `path`, creating the
    /// intermediate containers. Returns `Ok(false)` and changes nothing when a prefix of the
    /// path is a tensor (FX: "`x` is not an nn.Module", `False`); an empty path or atom is an
    /// error. A path under a leaf module adds a child of that module, as in FX.
    pub fn add_submodule(&mut self, path: &str, module: Box<dyn Module>) -> Result<bool> {
        if path.is_empty() || path.split('.').any(|p| p.is_empty()) {
            return Err(Error::argument("add_submodule", format!("'{path}' is not a valid module path")));
        }
        for (i, _) in path.match_indices('.') {
            if matches!(self.resolve(&path[..i]), Ok(Resolved::Tensor { .. })) {
                return Ok(false);
            }
        }
        self.modules.insert(path.to_string(), module);
        self.namespace_changed();
        Ok(true)
    }

    /// FX's `delete_submodule`: deletes the module (leaf, nested traced module or container) at
    /// `path` with everything beneath it, modules and tensors; its parent container stays,
    /// empty. `false` if `path` names no module (a tensor, or nothing), as in FX.
    pub fn delete_submodule(&mut self, path: &str) -> bool {
        if path.is_empty() {
            return false;
        }
        let own = self.modules.contains_key(path) || self.containers().contains_key(path);
        if !own {
            // a module inside a nested traced module
            let owner = path.match_indices('.').map(|(i, _)| i).find(|&i| self.modules.contains_key(&path[..i]));
            let Some(i) = owner else { return false };
            let Some(sub) = self.modules.get_mut(&path[..i]).and_then(|m| m.as_any_mut().downcast_mut::<GraphModule>())
            else {
                return false;
            };
            let deleted = sub.delete_submodule(&path[i + 1..]);
            self.namespace_changed();
            return deleted;
        }
        let under =
            |p: &str| p == path || (p.len() > path.len() && p.starts_with(path) && p.as_bytes()[path.len()] == b'.');
        self.modules.retain(|p, _| !under(p));
        self.attrs.retain(|p, _| !under(p));
        self.kept_containers.retain(|p| !under(p));
        self.impure_modules.retain(|p| !under(p));
        if let Some(i) = path.rfind('.') {
            let parent = &path[..i];
            if self.containers().contains_key(parent) && !self.kept_containers.iter().any(|k| k == parent) {
                self.kept_containers.push(parent.to_string());
            }
        }
        self.namespace_changed();
        true
    }

    /// FX's `delete_all_unused_submodules`: deletes every module (leaf, nested traced module,
    /// container) no node uses. As in FX, a module is used if a `call_module` or `get_attr`
    /// target lies under it (or is it), or it lies under a called module; deleting a module
    /// deletes the tensors beneath it (no `get_attr` reads them, or it would be used). Tensors
    /// directly on the GraphModule stay (see [`GraphModule::delete_unused_attributes`]).
    /// Returns how many modules were deleted.
    pub fn delete_all_unused_submodules(&mut self) -> usize {
        let mut used: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut called: Vec<String> = vec![];
        for n in self.graph.iter() {
            if !matches!(n.op(), Opcode::CallModule | Opcode::GetAttr) {
                continue;
            }
            let t = n.target().name();
            // every prefix of the target: `foo`, `foo.bar`, `foo.bar.baz`
            for (i, _) in t.match_indices('.') {
                used.insert(t[..i].to_string());
            }
            used.insert(t.to_string());
            if n.op() == Opcode::CallModule {
                called.push(t.to_string());
            }
        }
        let under_called = |p: &str| {
            called.iter().any(|c| p.len() > c.len() && p.starts_with(c.as_str()) && p.as_bytes()[c.len()] == b'.')
        };
        let mut unused: Vec<String> = self
            .containers()
            .keys()
            .chain(self.modules.keys())
            .filter(|p| !used.contains(p.as_str()) && !under_called(p))
            .cloned()
            .collect();
        // parents first: deleting one deletes its subtree
        unused.sort_by_key(|p| p.matches('.').count());
        let before = self.modules.len() + self.containers().len();
        for p in &unused {
            self.delete_submodule(p);
        }
        // an unused module's parent is not kept alive by the deletion itself
        self.kept_containers.retain(|k| used.contains(k));
        self.namespace_changed();
        before.saturating_sub(self.modules.len() + self.containers().len())
    }

    /// Deletes the attributes no `get_attr` node reads (a ferrofx addition: FX leaves unused
    /// attributes on the module). Returns how many were deleted.
    pub fn delete_unused_attributes(&mut self) -> usize {
        let used: std::collections::HashSet<String> =
            self.graph.iter().filter(|n| n.op() == Opcode::GetAttr).map(|n| n.target().name().to_string()).collect();
        let before = self.attrs.len();
        self.attrs.retain(|p, _| used.contains(p));
        self.namespace_changed();
        before - self.attrs.len()
    }

    /// Flags the module at `path` as having side effects (FX's `_is_impure = True` on a module
    /// class): [`GraphModule::eliminate_dead_code`] keeps its unused calls. The flag belongs to
    /// this GraphModule's path, as Rust modules carry no such attribute.
    pub fn set_module_impure(&mut self, path: &str, impure: bool) -> Result<()> {
        self.get_submodule(path)?;
        if impure {
            self.impure_modules.insert(path.to_string());
        } else {
            self.impure_modules.remove(path);
        }
        Ok(())
    }

    /// FX's `graph.eliminate_dead_code()` on a GraphModule's graph: lints first, keeps impure
    /// nodes ([`crate::Node::is_impure`]) and calls of modules flagged with
    /// [`GraphModule::set_module_impure`]. Returns whether anything was erased.
    ///
    /// ```
    /// use ferrofx_fx::{Graph, GraphModule, Opcode};
    /// use ferrofx_nn::ReLU;
    /// let mut g = Graph::new();
    /// let x = g.placeholder("x").unwrap();
    /// g.call_module("relu", vec![x.into()]).unwrap();
    /// g.output(x.into()).unwrap();
    /// let mut modules = indexmap::IndexMap::new();
    /// modules.insert("relu".to_string(), Box::new(ReLU::new()) as Box<dyn ferrofx_nn::Module>);
    /// let mut gm = GraphModule::from_parts(g, modules, Default::default(), "M", false).unwrap();
    /// gm.set_module_impure("relu", true).unwrap();
    /// assert!(!gm.eliminate_dead_code().unwrap()); // FX: ReLUImpure with _is_impure is kept
    /// gm.set_module_impure("relu", false).unwrap();
    /// assert!(gm.eliminate_dead_code().unwrap());
    /// ```
    pub fn eliminate_dead_code(&mut self) -> Result<bool> {
        let impure_modules = &self.impure_modules;
        let impure = |n: &crate::graph::Node<'_>| {
            n.is_impure() || (n.op() == Opcode::CallModule && impure_modules.contains(n.target().name()))
        };
        let changed = self
            .graph
            .eliminate_dead_code(Some(&impure))
            .map_err(|e| Error::argument("eliminate_dead_code", e.to_string()))?;
        self.invalidate();
        Ok(changed)
    }

    /// FX's `graph.lint()` on a GraphModule: the graph's own checks, then every `call_module`
    /// and `get_attr` target against this module, with FX's messages ("Node x target a.b
    /// references nonexistent attribute b of a", "... b of a does not reference an
    /// nn.Module"). A `get_attr` must read a tensor here (a plan value), not a module.
    pub fn lint(&self) -> Result<()> {
        self.graph.lint().map_err(|e| Error::argument("lint", e.to_string()))?;
        for n in self.graph.iter() {
            if matches!(n.op(), Opcode::CallModule | Opcode::GetAttr) {
                if let Some(message) = self.target_problem(n.name(), n.op(), n.target().name()) {
                    return Err(Error::argument("lint", message));
                }
            }
        }
        Ok(())
    }

    /// What is wrong with a `call_module`/`get_attr` target, in FX's words (`None`: nothing).
    pub(crate) fn target_problem(&self, node: &str, op: Opcode, target: &str) -> Option<String> {
        let (atom, seen) = match target.rfind('.') {
            Some(i) => (&target[i + 1..], &target[..i]),
            None => (target, ""),
        };
        match (self.resolve(target), op) {
            (Ok(Resolved::Module(_)), Opcode::CallModule) | (Ok(Resolved::Tensor { .. }), Opcode::GetAttr) => None,
            (Ok(Resolved::Tensor { .. }), _) => {
                Some(format!("Node {node} target {target} {atom} of {seen} does not reference an nn.Module"))
            }
            (Ok(Resolved::Module(_)), _) => Some(format!(
                "Node {node} target {target} {atom} of {seen} does not reference an nn.Parameter, buffer or tensor constant (a get_attr node reads a tensor in ferrofx)"
            )),
            (Err(u), Opcode::CallModule) if u.not_module => Some(format!(
                "Node {node} target {target} {} of {} does not reference an nn.Module",
                u.atom, u.seen
            )),
            (Err(u), _) => Some(format!(
                "Node {node} target {target} references nonexistent attribute {} of {}",
                u.atom, u.seen
            )),
        }
    }

    /// Adds (or replaces) a tensor read by `get_attr` nodes.
    pub fn register_attribute(&mut self, path: &str, tensor: Tensor, kind: TensorKind) {
        self.attrs.insert(path.to_string(), TensorEntry { tensor, kind, constant: false });
        self.namespace_changed();
    }

    pub(crate) fn invalidate(&self) {
        if let Ok(mut p) = self.plan.write() {
            *p = None;
        }
        self.reset_budget();
    }

    /// Validates the graph and builds the execution plan.
    pub fn recompile(&self) -> Result<()> {
        self.reset_budget();
        let plan = Plan::build(self)?;
        *self.plan.write().map_err(|_| Error::argument("recompile", "the plan lock is poisoned"))? =
            Some(Arc::new(plan));
        Ok(())
    }

    pub(crate) fn plan(&self) -> Result<Arc<Plan>> {
        if let Some(p) = self.plan.read().map_err(|_| Error::argument("forward", "the plan lock is poisoned"))?.as_ref()
        {
            return Ok(p.clone());
        }
        self.recompile()?;
        self.plan
            .read()
            .map_err(|_| Error::argument("forward", "the plan lock is poisoned"))?
            .clone()
            .ok_or_else(|| Error::argument("forward", "no plan"))
    }

    /// The plan as readable source: one line per node, with the values dropped after their
    /// last use (FX's `code`).
    pub fn code(&self) -> Result<String> {
        Ok(self.plan()?.code(&self.graph).to_string())
    }

    /// FX's `print_readable`: the module's code under its type name.
    pub fn print_readable(&self) -> Result<String> {
        Ok(format!("// GraphModule traced from {}\n{}", self.type_name, self.code()?))
    }

    /// Saves the module (graph, leaf specs, tensors) as a traced-module file (`docs/format.md`).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let (doc, sd) = self.document()?;
        write_module_file(&doc, &sd, path.as_ref())
            .map_err(|e| Error::io("GraphModule::save", format!("cannot write {}: {e}", path.as_ref().display())))
    }

    /// The traced-module file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let (doc, sd) = self.document()?;
        Ok(write_module_bytes(&doc, &sd)?)
    }

    /// The file's module document and the tensors it declares (shared with the model, not
    /// copied).
    fn document(&self) -> Result<(ModuleDoc, StateDict)> {
        let mut sd = StateDict::new();
        let mut declared = Vec::new();
        let mut doc = self.to_doc("", &mut declared, &mut sd)?;
        doc.tensors = declared;
        Ok((doc, sd))
    }

    /// This module's document; its tensors (and those of nested traced modules, under their
    /// path `prefix`) go to `declared` and `sd`, each path once.
    fn to_doc(&self, prefix: &str, declared: &mut Vec<TensorDoc>, sd: &mut StateDict) -> Result<ModuleDoc> {
        let mut doc = ModuleDoc::new(&self.type_name, self.training, graph_to_doc(&self.graph)?);
        doc.inputs = Some(doc.placeholder_targets());
        let mut declare = |path: String, t: &Tensor, kind: DocKind, sd: &mut StateDict| -> Result<()> {
            let path = format!("{prefix}{path}");
            if sd.contains_key(&path) {
                return Ok(());
            }
            let t = if t.is_contiguous() { t.detach() } else { t.detach().contiguous()? };
            declared.push(TensorDoc {
                path: path.clone(),
                kind,
                dtype: t.dtype().name().to_string(),
                shape: t.shape().iter().map(|&d| d as u64).collect(),
                requires_grad: matches!(kind, DocKind::Parameter),
            });
            sd.insert(path, t);
            Ok(())
        };
        let mut nested = vec![];
        for (path, m) in &self.modules {
            if let Some(sub) = m.as_any().downcast_ref::<GraphModule>() {
                nested.push((path, sub));
                continue;
            }
            let spec = m.spec().ok_or_else(|| {
                Error::argument(
                    "GraphModule::save",
                    format!(
                        "module '{path}' ({}) is a user module, and a file holds only built-in layers and traced modules (it is loaded without source code): trace through it, or use traced::trace_module to keep it as a nested traced module",
                        m.type_name()
                    ),
                )
            })?;
            doc.leaves.push(LeafDoc { path: path.clone(), spec });
            for (n, t) in m.named_parameters() {
                declare(format!("{path}.{n}"), &t, DocKind::Parameter, sd)?;
            }
            for (n, t) in m.named_buffers() {
                declare(format!("{path}.{n}"), &t, DocKind::Buffer, sd)?;
            }
        }
        for (path, e) in &self.attrs {
            let kind = match (e.constant, e.kind) {
                (true, _) => DocKind::Constant,
                (false, TensorKind::Parameter) => DocKind::Parameter,
                (false, TensorKind::Buffer) => DocKind::Buffer,
            };
            declare(path.clone(), &e.tensor, kind, sd)?;
        }
        for (path, sub) in nested {
            let module = sub.to_doc(&format!("{prefix}{path}."), declared, sd)?;
            doc.submodules.push(SubmoduleDoc { path: path.clone(), module });
        }
        Ok(doc)
    }

    /// Loads a traced-module file. Nothing in the file is executed; everything is validated
    /// (see `docs/format.md`), and the module is compiled before it is returned.
    pub fn load(path: impl AsRef<Path>) -> Result<GraphModule> {
        let path = path.as_ref();
        // every error names the file (I/O messages already do)
        let in_file = |e: Error| match e.kind() {
            ferrofx_core::ErrorKind::Io => Error::io("GraphModule::load", e.message()),
            kind => Error::new(kind, "GraphModule::load", format!("{}: {}", path.display(), e.message())),
        };
        let (doc, tensors) = read_module_file(path).map_err(|e| in_file(e.into()))?;
        GraphModule::from_document(&doc, &tensors).map_err(in_file)
    }

    /// Parses and validates a traced-module file.
    pub fn from_bytes(bytes: &[u8]) -> Result<GraphModule> {
        let (doc, tensors) = read_module_bytes(bytes)?;
        GraphModule::from_document(&doc, &tensors)
    }

    /// Builds the module a validated file document describes (with its nested modules).
    fn from_document(doc: &ModuleDoc, tensors: &StateDict) -> Result<GraphModule> {
        let kinds: HashMap<&str, &TensorDoc> = doc.tensors.iter().map(|t| (t.path.as_str(), t)).collect();
        // whatever fails while building the module is a fault of the file's content
        let gm = GraphModule::from_doc(doc, "", tensors, &kinds).map_err(|e| match e.kind() {
            ferrofx_core::ErrorKind::Io | ferrofx_core::ErrorKind::Limit | ferrofx_core::ErrorKind::Format => e,
            _ => Error::format("GraphModule::load", format!("{}: {}", e.op(), e.message())),
        })?;
        // parameters are trainable again
        for p in gm.parameters() {
            p.requires_grad_(true)?;
        }
        Ok(gm)
    }

    /// Builds the module a document describes; its tensors are those of `tensors` under
    /// `prefix` (nested traced modules are built from their documents under their paths).
    fn from_doc(
        doc: &ModuleDoc,
        prefix: &str,
        tensors: &StateDict,
        kinds: &HashMap<&str, &TensorDoc>,
    ) -> Result<GraphModule> {
        let graph = graph_from_doc(&doc.graph)?;
        let module = match prefix.strip_suffix('.') {
            Some(p) => format!("nested module '{p}'"),
            None => "the module".to_string(),
        };
        check_declared_inputs(doc, &module)?;
        let mut modules: IndexMap<String, Box<dyn Module>> = IndexMap::new();
        let mut owned: std::collections::HashSet<String> = std::collections::HashSet::new();
        for leaf in &doc.leaves {
            let leaf_prefix = format!("{prefix}{}.", leaf.path);
            let m = ferrofx_nn::spec::build_builtin(&leaf.spec, &mut |n: &str| {
                let key = format!("{leaf_prefix}{n}");
                let t = tensors.get(&key).cloned();
                if t.is_some() {
                    owned.insert(key);
                }
                t
            })
            .map_err(|e| Error::format("GraphModule::load", format!("leaf module '{prefix}{}': {e}", leaf.path)))?;
            if modules.insert(leaf.path.clone(), m).is_some() {
                return Err(
                    FormatError::Invalid(format!("leaf module '{prefix}{}' is declared twice", leaf.path)).into()
                );
            }
        }
        for sub in &doc.submodules {
            if !sub.module.tensors.is_empty() {
                return Err(FormatError::Invalid(format!(
                    "nested module '{prefix}{}' declares tensors; they belong to the root document",
                    sub.path
                ))
                .into());
            }
            let sub_prefix = format!("{prefix}{}.", sub.path);
            let m = GraphModule::from_doc(&sub.module, &sub_prefix, tensors, kinds)?;
            owned.extend(m.state_dict().into_iter().map(|(k, _)| format!("{sub_prefix}{k}")));
            if modules.insert(sub.path.clone(), Box::new(m)).is_some() {
                return Err(FormatError::Invalid(format!("module '{prefix}{}' is declared twice", sub.path)).into());
            }
        }
        // modules in the order the graph first calls them (the order tracing records them)
        let mut ordered: IndexMap<String, Box<dyn Module>> = IndexMap::with_capacity(modules.len());
        for n in graph.iter().filter(|n| n.op() == Opcode::CallModule) {
            if let Some((k, m)) = modules.shift_remove_entry(n.target().name()) {
                ordered.insert(k, m);
            }
        }
        ordered.extend(modules);
        let modules = ordered;
        // the tensors get_attr nodes read: every tensor under this prefix that no leaf or
        // nested module owns
        let mut attrs = IndexMap::new();
        for (path, t) in tensors.iter() {
            let Some(local) = path.strip_prefix(prefix) else { continue };
            if owned.contains(path) {
                continue;
            }
            let decl =
                kinds.get(path.as_str()).ok_or_else(|| FormatError::Invalid(format!("tensor '{path}' undeclared")))?;
            let (kind, constant) = match decl.kind {
                DocKind::Parameter => (TensorKind::Parameter, false),
                DocKind::Buffer => (TensorKind::Buffer, false),
                DocKind::Constant => (TensorKind::Buffer, true),
            };
            let t = if decl.requires_grad { t.requires_grad_(true)? } else { t.clone() };
            attrs.insert(local.to_string(), TensorEntry { tensor: t, kind, constant });
        }
        GraphModule::from_parts(graph, modules, attrs, &doc.type_name, doc.training)
    }
}

// ----- Module ----------------------------------------------------------------------------------

impl ModuleStructure for GraphModule {
    fn type_name(&self) -> &'static str {
        "GraphModule"
    }
    fn visit_tensors(&self, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        for (p, e) in &self.attrs {
            f(p, e.kind, &e.tensor);
        }
    }
    fn visit_tensors_mut(&mut self, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
        for (p, e) in self.attrs.iter_mut() {
            f(p, e.kind, &mut e.tensor);
        }
    }
    fn visit_children<'a>(&'a self, f: &mut dyn FnMut(&str, &'a dyn Module)) {
        for (p, m) in &self.modules {
            f(p, m.as_ref());
        }
    }
    fn visit_children_mut(&mut self, f: &mut dyn FnMut(&str, &mut dyn Module)) {
        for (p, m) in self.modules.iter_mut() {
            f(p, m.as_mut());
        }
    }
    fn local_training(&self) -> Option<bool> {
        Some(self.training)
    }
    fn set_local_training(&mut self, mode: bool) {
        self.training = mode;
    }
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

impl Module for GraphModule {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.forward_values(&[Value::Tensor(x.clone())])?;
        match <[Value; 1]>::try_from(out) {
            Ok([Value::Tensor(t)]) => Ok(t),
            Ok([other]) => {
                Err(Error::argument("GraphModule.forward", format!("the graph returned {other:?}, not a tensor")))
            }
            Err(v) => Err(Error::argument(
                "GraphModule.forward",
                format!("the graph returns {} values: use forward_values", v.len()),
            )),
        }
    }
    fn get_submodule(&self, path: &str) -> Result<&dyn Module> {
        GraphModule::get_submodule(self, path)
    }
    /// A copy sharing the tensors (its leaves copied with their own `clone_module`), so a
    /// GraphModule can be a leaf of another trace, as in FX; `None` when a leaf cannot be copied.
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        let (graph, _) = self.graph.deep_copy().ok()?;
        let mut modules: IndexMap<String, Box<dyn Module>> = IndexMap::with_capacity(self.modules.len());
        for (p, m) in &self.modules {
            modules.insert(p.clone(), m.clone_module()?);
        }
        let mut gm =
            GraphModule::from_parts(graph, modules, self.attrs.clone(), &self.type_name, self.training).ok()?;
        gm.kept_containers = self.kept_containers.clone();
        gm.impure_modules = self.impure_modules.clone();
        Some(Box::new(gm))
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let plan = self.plan()?;
        let completed;
        let inputs = match plan.complete_inputs(self, inputs)? {
            Some(all) => {
                completed = all;
                &completed[..]
            }
            None => inputs,
        };
        self.check_budget(&plan, inputs)?;
        plan.run(self, inputs)
    }
}

impl std::fmt::Display for GraphModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "GraphModule({})", self.type_name)?;
        for (p, m) in &self.modules {
            writeln!(
                f,
                "  ({p}): {}({})",
                m.spec().map(|s| s.type_name).unwrap_or_else(|| m.type_name().to_string()),
                m.extra_repr()
            )?;
        }
        write!(f, "{}", self.graph)
    }
}
