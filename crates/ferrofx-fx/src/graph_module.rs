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
use std::sync::{Arc, RwLock};

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

    /// FX's `get_submodule` for the modules this GraphModule owns.
    pub fn get_submodule_owned(&self, path: &str) -> Result<&dyn Module> {
        self.modules.get(path).map(|m| m.as_ref()).ok_or_else(|| {
            Error::argument(
                "get_submodule",
                format!("GraphModule has no submodule '{path}'; it has: {:?}", self.modules.keys().collect::<Vec<_>>()),
            )
        })
    }

    /// FX's `get_parameter`: a `get_attr` tensor or a leaf module's tensor by qualified path.
    pub fn get_parameter(&self, path: &str) -> Result<Tensor> {
        if let Some(e) = self.attrs.get(path) {
            return Ok(e.tensor.clone());
        }
        self.get_tensor(path)
    }

    /// FX's `add_submodule`: adds (or replaces) a leaf module at `path`.
    pub fn add_submodule(&mut self, path: &str, module: Box<dyn Module>) -> Result<()> {
        if path.is_empty() || path.split('.').any(|p| p.is_empty()) {
            return Err(Error::argument("add_submodule", format!("'{path}' is not a valid module path")));
        }
        self.modules.insert(path.to_string(), module);
        self.invalidate();
        Ok(())
    }

    /// FX's `delete_submodule`: removes the module at `path`; `false` if there was none.
    pub fn delete_submodule(&mut self, path: &str) -> bool {
        let found = self.modules.shift_remove(path).is_some();
        self.invalidate();
        found
    }

    /// FX's `delete_all_unused_submodules`: deletes every submodule no node uses. As in FX, a
    /// module is used if a `call_module` node calls it or one of its ancestors, or a
    /// `call_module`/`get_attr` target lies under it; attributes (parameters, buffers,
    /// constants) are never deleted here (see [`GraphModule::delete_unused_attributes`]).
    /// Returns how many modules were deleted.
    pub fn delete_all_unused_submodules(&mut self) -> usize {
        let mut used: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut called: Vec<&str> = vec![];
        for n in self.graph.iter() {
            if !matches!(n.op(), Opcode::CallModule | Opcode::GetAttr) {
                continue;
            }
            let t = n.target().name();
            let t: &str = self.modules.get_key_value(t).map(|(k, _)| k.as_str()).unwrap_or(t);
            // every prefix of the target: `foo`, `foo.bar`, `foo.bar.baz`
            for (i, c) in t.char_indices() {
                if c == '.' {
                    used.insert(&t[..i]);
                }
            }
            used.insert(t);
            if n.op() == Opcode::CallModule {
                called.push(t);
            }
        }
        let unused: Vec<String> = self
            .modules
            .keys()
            .filter(|p| {
                !used.contains(p.as_str())
                    && !called.iter().any(|c| p.len() > c.len() && p.starts_with(c) && p.as_bytes()[c.len()] == b'.')
            })
            .cloned()
            .collect();
        for p in &unused {
            self.modules.shift_remove(p);
        }
        self.invalidate();
        unused.len()
    }

    /// Deletes the attributes no `get_attr` node reads (a ferrofx addition: FX leaves unused
    /// attributes on the module). Returns how many were deleted.
    pub fn delete_unused_attributes(&mut self) -> usize {
        let used: std::collections::HashSet<String> =
            self.graph.iter().filter(|n| n.op() == Opcode::GetAttr).map(|n| n.target().name().to_string()).collect();
        let before = self.attrs.len();
        self.attrs.retain(|p, _| used.contains(p));
        self.invalidate();
        before - self.attrs.len()
    }

    /// Adds (or replaces) a tensor read by `get_attr` nodes.
    pub fn register_attribute(&mut self, path: &str, tensor: Tensor, kind: TensorKind) {
        self.attrs.insert(path.to_string(), TensorEntry { tensor, kind, constant: false });
        self.invalidate();
    }

    fn invalidate(&self) {
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
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let plan = self.plan()?;
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
