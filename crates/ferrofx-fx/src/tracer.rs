//! Symbolic tracing (FX's `symbolic_trace` / `Tracer`, MegEngine's `trace_module`): runs a
//! module's forward on symbolic tensors and records every op, method and module call as a
//! graph node.
//!
//! Tracing goes through the one dispatch point of `ferrofx-core`: an op that receives a
//! symbolic tensor is handed to the tracer ([`ferrofx_core::trace::TraceHook`]), which records a
//! `call_function` (functions and operators) or `call_method` node and returns symbolic outputs;
//! module calls go through [`ferrofx_nn::ModuleCallHook`], which records a `call_module` node for
//! leaf modules (the built-in layers by default) and traces through the others. Parameters and
//! buffers used directly become `get_attr` nodes with their qualified path; other concrete
//! tensors become constants (`_tensor_constant0`, ...) owned by the [`GraphModule`].
//!
//! Without example inputs ([`symbolic_trace`]) values have no shape, as in FX: code that asks
//! for a shape, a value or a Python-level decision fails with a trace error explaining where
//! and what to do. With example inputs ([`trace_with_inputs`]) every node records its
//! `tensor_meta` and shape queries answer.
//!
//! ```
//! use ferrofx_fx::tracer::symbolic_trace;
//! use ferrofx_nn::{zoo::DigitsCnn, Module};
//! let cnn = DigitsCnn::new().unwrap();
//! let gm = symbolic_trace(&cnn).unwrap();
//! assert!(gm.graph().to_string().contains("call_module[target=conv1]"));
//! let x = ferrofx_core::Tensor::from_vec(vec![0.5f32; 64], &[1, 1, 8, 8]).unwrap();
//! assert_eq!(gm.forward(&x).unwrap().shape(), &[1, 10]);
//! ```

use crate::graph::hash::FxHashMap;
use crate::graph::{Argument, Graph, GraphId, ModuleStackEntry, NodeId, Opcode, Target, TensorMetadata};
use crate::graph_module::{GraphModule, TensorEntry};
use crate::values::literal;
use ferrofx_core::op::{CallKind, OpDef, Outputs};
use ferrofx_core::trace::{with_trace_hook, Symbolic, TraceHook};
use ferrofx_core::{Error, Result, Tensor, TensorMeta, Value};
use ferrofx_nn::{with_module_call_hook, Module, ModuleCallHook, TensorKind};
use indexmap::IndexMap;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;

/// The proxy payload of a symbolic tensor made by this tracer.
#[derive(Debug, Clone, Copy)]
struct Proxy {
    graph: GraphId,
    /// `None` while probing a leaf module's outputs (nothing is recorded then).
    node: Option<NodeId>,
}

/// Decides whether a module call is recorded as one `call_module` node (a leaf) or traced
/// through. Arguments: the module and its qualified path.
pub type LeafPredicate = dyn Fn(&dyn Module, &str) -> bool;

/// Builds the module a [`GraphModule`] owns for a leaf that is not a built-in layer (used by
/// module-preserving tracing, [`crate::traced::trace_module`], to trace a user module into a
/// nested GraphModule). Arguments: the module, its qualified path, the call's inputs.
pub type SubmoduleBuilder = dyn Fn(&dyn Module, &str, &[Value]) -> Result<Box<dyn Module>>;

/// Ops that return several tensors; without example inputs their output count is unknown.
const MULTI_OUTPUT: &[&str] = &[
    "sort",
    "topk",
    "split",
    "chunk",
    "unbind",
    "max_pool2d_with_indices",
    "max_pool1d_with_indices",
    "var_mean",
    "std_mean",
];

/// Called for every node the tracer creates, right after its creation and metadata (FX's
/// `Tracer.create_node` override point): it may edit the node (meta, name, type) through the
/// graph. An error ends the trace.
pub type CreateNodeHook = dyn Fn(&mut Graph, NodeId) -> Result<()>;

/// The function traced instead of `forward` ([`Tracer::trace_method`]): symbolic inputs to
/// outputs.
type TracedMethod<'a> = dyn Fn(&[Value]) -> Result<Vec<Value>> + 'a;

/// A configurable tracer (FX's `Tracer`).
pub struct Tracer {
    leaf: Rc<LeafPredicate>,
    input_names: Vec<String>,
    concrete_args: HashMap<usize, Value>,
    submodule: Option<Rc<SubmoduleBuilder>>,
    create_node: Option<Rc<CreateNodeHook>>,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer {
            leaf: Rc::new(|m, _| m.is_builtin_leaf()),
            input_names: vec![],
            concrete_args: HashMap::new(),
            submodule: None,
            create_node: None,
        }
    }
}

impl Tracer {
    /// A tracer with FX's defaults: built-in layers are leaves.
    pub fn new() -> Tracer {
        Tracer::default()
    }

    /// Overrides the leaf decision (FX's `is_leaf_module`). Leaves must be built-in layers
    /// (they have a [`Module::spec`]) so the [`GraphModule`] can own them and files can store
    /// them; returning `true` for other modules makes the trace fail with an explanation.
    pub fn is_leaf_module(mut self, f: impl Fn(&dyn Module, &str) -> bool + 'static) -> Tracer {
        self.leaf = Rc::new(f);
        self
    }

    /// Leaves that are not built-in layers become the module `build` returns (called once per
    /// module path, with the first call's inputs) instead of failing the trace.
    pub fn build_submodules_with(
        mut self,
        build: impl Fn(&dyn Module, &str, &[Value]) -> Result<Box<dyn Module>> + 'static,
    ) -> Tracer {
        self.submodule = Some(Rc::new(build));
        self
    }

    /// Names of the placeholders, in input order (default `x`, `x_1`, ...).
    pub fn input_names(mut self, names: &[&str]) -> Tracer {
        self.input_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// FX's `concrete_args`: input `index` is fixed to `value` and code depending on it is
    /// specialised. As in FX, a plain value (bool, int, float, `None`, string, list) still gets
    /// a placeholder, `{name}_1`, guarded so that calling the traced module with another value
    /// fails: `eq_scalar` + `_assert` ("flag has been specialized to have value True but got
    /// another value") for bools and numbers, `_assert_is_none` for `None` (other values are not
    /// guarded, as FX only warns for them). The placeholder's default is the concrete value (FX
    /// takes the default from the Python signature, which Rust has not), so the input may be
    /// left out. A tensor becomes a constant of the graph with no placeholder.
    ///
    /// ```
    /// use ferrofx_fx::Tracer;
    /// use ferrofx_nn::{functional, Module, Result, Tensor, Value};
    /// #[derive(ferrofx_nn::Module)]
    /// struct M {}
    /// impl Module for M {
    ///     fn forward(&self, x: &Tensor) -> Result<Tensor> { x.neg() }
    ///     fn forward_values(&self, v: &[Value]) -> Result<Vec<Value>> {
    ///         let x = v[0].as_tensor().unwrap();
    ///         let y = if matches!(v[1], Value::Bool(true)) { functional::relu(x)? } else { x.neg()? };
    ///         Ok(vec![y.into()])
    ///     }
    /// }
    /// let gm = Tracer::new().input_names(&["x", "flag"]).concrete_arg(1, true).trace(&M {}, 2).unwrap();
    /// let x = Tensor::from_vec(vec![-1.0f32], &[1]).unwrap();
    /// assert_eq!(gm.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![0.0]); // default: true
    /// let e = gm.forward_values(&[x.into(), Value::Bool(false)]).unwrap_err();
    /// assert!(e.to_string().contains("flag has been specialized to have value True but got another value"));
    /// ```
    pub fn concrete_arg(mut self, index: usize, value: impl Into<Value>) -> Tracer {
        self.concrete_args.insert(index, value.into());
        self
    }

    /// FX's `create_node` override: `hook` sees every node the tracer creates (after its
    /// metadata is set) and may edit it through the graph.
    ///
    /// ```
    /// use ferrofx_fx::{symbolic_trace, Tracer};
    /// use ferrofx_nn::zoo::DigitsCnn;
    /// let m = DigitsCnn::new().unwrap();
    /// let gm = Tracer::new()
    ///     .on_create_node(|g, n| {
    ///         g.meta_mut(n).map_err(|e| ferrofx_core::Error::trace("tag", e.to_string()))?.insert("tag", 7u32);
    ///         Ok(())
    ///     })
    ///     .trace(&m, 1)
    ///     .unwrap();
    /// assert!(gm.graph().iter().all(|n| n.meta().get::<u32>("tag") == Some(&7)));
    /// ```
    pub fn on_create_node(mut self, hook: impl Fn(&mut Graph, NodeId) -> Result<()> + 'static) -> Tracer {
        self.create_node = Some(Rc::new(hook));
        self
    }

    /// Traces `module` symbolically (no shapes) with `num_inputs` inputs.
    pub fn trace(&self, module: &dyn Module, num_inputs: usize) -> Result<GraphModule> {
        self.run(module, Inputs::Symbolic(num_inputs), None)
    }

    /// Traces `module` on example inputs: every node gets its `tensor_meta`.
    pub fn trace_with_inputs(&self, module: &dyn Module, inputs: &[Value]) -> Result<GraphModule> {
        self.run(module, Inputs::Examples(inputs), None)
    }

    /// Traces `method` instead of `module.forward` (FX's `Tracer.traced_func_name`, the method
    /// to trace): `method` receives the symbolic inputs, usually a closure calling another
    /// method of `module`; parameters, buffers and submodules resolve in `module` as for
    /// `forward`.
    ///
    /// ```
    /// use ferrofx_fx::Tracer;
    /// use ferrofx_nn::{Linear, Module, Result, Tensor, Value};
    /// #[derive(ferrofx_nn::Module)]
    /// struct Enc { fc: Linear }
    /// impl Module for Enc {
    ///     fn forward(&self, x: &Tensor) -> Result<Tensor> { self.fc.call(x) }
    /// }
    /// impl Enc {
    ///     fn encode(&self, x: &Tensor) -> Result<Tensor> { self.fc.call(x)?.tanh() }
    /// }
    /// let m = Enc { fc: Linear::new(2, 2, true).unwrap() };
    /// let gm = Tracer::new()
    ///     .trace_method(&m, 1, |v| Ok(vec![m.encode(v[0].as_tensor().unwrap())?.into()]))
    ///     .unwrap();
    /// assert!(gm.graph().to_string().contains("tanh"));
    /// ```
    pub fn trace_method(
        &self,
        module: &dyn Module,
        num_inputs: usize,
        method: impl Fn(&[Value]) -> Result<Vec<Value>>,
    ) -> Result<GraphModule> {
        self.run(module, Inputs::Symbolic(num_inputs), Some(&method))
    }

    /// [`Tracer::trace_method`] on example inputs: every node gets its `tensor_meta` (joint
    /// forward+backward capture traces a closure that runs forward, loss and the backward
    /// formulas this way).
    pub fn trace_method_with_inputs(
        &self,
        module: &dyn Module,
        inputs: &[Value],
        method: impl Fn(&[Value]) -> Result<Vec<Value>>,
    ) -> Result<GraphModule> {
        self.run(module, Inputs::Examples(inputs), Some(&method))
    }

    fn run(&self, module: &dyn Module, inputs: Inputs<'_>, method: Option<&TracedMethod<'_>>) -> Result<GraphModule> {
        let mut state = State::new(module, self.leaf.clone());
        state.submodule = self.submodule.clone();
        state.create_node = self.create_node.clone();
        let state = Rc::new(state);
        let n = match inputs {
            Inputs::Symbolic(n) => n,
            Inputs::Examples(v) => v.len(),
        };
        let mut args = Vec::with_capacity(n);
        for i in 0..n {
            let name = self.input_names.get(i).cloned().unwrap_or_else(|| "x".to_string());
            if let Some(v) = self.concrete_args.get(&i) {
                state.concrete_placeholder(&name, v)?;
                state.flush_created()?;
                args.push(v.clone());
                continue;
            }
            let node = state.graph.borrow_mut().placeholder(&name).map_err(trace_err)?;
            let meta = match inputs {
                Inputs::Symbolic(_) => None,
                Inputs::Examples(v) => match &v[i] {
                    Value::Tensor(t) => t.meta(),
                    other => {
                        return Err(Error::trace(
                            "trace_with_inputs",
                            format!(
                                "example input {i} is {other:?}; inputs must be tensors (fix others with concrete_arg)"
                            ),
                        ))
                    }
                },
            };
            state.set_meta(node, meta.as_ref(), None)?;
            state.flush_created()?;
            args.push(Value::Tensor(state.symbolic(node, meta)));
        }
        let hook: Rc<Hooks> = Rc::new(Hooks(state.clone()));
        let outputs = with_trace_hook(hook.clone(), || {
            with_module_call_hook(hook.clone(), || {
                let _g = ferrofx_core::autograd::no_grad();
                match method {
                    Some(f) => f(&args),
                    None => module.forward_values(&args),
                }
            })
        });
        if let Some(e) = state.failure.borrow_mut().take() {
            return Err(e);
        }
        let outputs = outputs?;
        let out_arg = if outputs.len() == 1 {
            state.to_arg(&outputs[0])?
        } else {
            Argument::tuple(outputs.iter().map(|v| state.to_arg(v)).collect::<Result<Vec<_>>>()?)
        };
        state.graph.borrow_mut().output(out_arg).map_err(trace_err)?;
        state.flush_created()?;
        drop(hook);
        let state = Rc::try_unwrap(state).map_err(|_| Error::trace("trace", "the tracer is still referenced"))?;
        state.finish(module)
    }
}

enum Inputs<'a> {
    Symbolic(usize),
    Examples(&'a [Value]),
}

/// `symbolic_trace(module)`: FX's entry point, one input named `x`, no shapes.
pub fn symbolic_trace(module: &dyn Module) -> Result<GraphModule> {
    Tracer::new().trace(module, 1)
}

/// `trace_with_inputs(module, inputs)`: MegEngine's `trace_module`; every node gets shapes.
pub fn trace_with_inputs(module: &dyn Module, inputs: &[Value]) -> Result<GraphModule> {
    Tracer::new().trace_with_inputs(module, inputs)
}

fn trace_err(e: crate::graph::GraphError) -> Error {
    Error::trace("trace", e.to_string())
}

/// Where a parameter or buffer lives: its module (index into `State::paths`), its field name
/// (index into `State::names`, interned: a model has few distinct field names) and its kind.
/// The qualified path is formatted only for tensors the forward actually uses.
#[derive(Clone, Copy)]
struct TensorPath {
    module: u32,
    name: u32,
    kind: TensorKind,
}

struct State {
    graph: RefCell<Graph>,
    gid: GraphId,
    tensor_paths: FxHashMap<usize, TensorPath>,
    /// Module index by identity; several for zero-sized modules, whose instances share an
    /// address (see [`State::module_index`]).
    module_paths: FxHashMap<(usize, std::any::TypeId), Vec<u32>>,
    /// Per module frame being traced through (the root first): how many calls each zero-sized
    /// module identity received in it, to tell same-typed zero-sized siblings apart.
    zst_calls: RefCell<Vec<FxHashMap<(usize, std::any::TypeId), usize>>>,
    /// Qualified module paths, by module index ("" is the root).
    paths: Vec<String>,
    /// Interned field names of parameters and buffers.
    names: Vec<String>,
    leaf: Rc<LeafPredicate>,
    submodule: Option<Rc<SubmoduleBuilder>>,
    /// `get_attr` node of each parameter used so far, by tensor id.
    attr_nodes: RefCell<FxHashMap<usize, NodeId>>,
    /// `_tensor_constantN` path of each constant captured so far, by tensor id.
    constant_paths: RefCell<FxHashMap<usize, String>>,
    attrs: RefCell<IndexMap<String, TensorEntry>>,
    constants: Cell<usize>,
    leaves: RefCell<IndexMap<String, Box<dyn Module>>>,
    /// `nn_module_stack` of the module being traced through, one shared stack per depth (nodes
    /// point at it instead of copying it).
    stack: RefCell<Vec<Arc<[ModuleStackEntry]>>>,
    empty_stack: Arc<[ModuleStackEntry]>,
    scratch: Cell<usize>,
    probing: Cell<bool>,
    failure: RefCell<Option<Error>>,
    getitem: &'static OpDef,
    create_node: Option<Rc<CreateNodeHook>>,
    /// The last node the create-node hook saw.
    hooked: Cell<Option<NodeId>>,
}

/// A module's identity during a trace: its address and concrete type (a struct and its first
/// field can share an address). Zero-sized modules have no address of their own; the built-in
/// layers are never zero-sized for this reason, and user modules that are fall back to
/// [`State::module_index`]'s disambiguation.
fn module_key(m: &dyn Module) -> (usize, std::any::TypeId) {
    (m as *const dyn Module as *const () as usize, m.as_any().type_id())
}

impl State {
    fn new(root: &dyn Module, leaf: Rc<LeafPredicate>) -> State {
        let graph = Graph::new();
        let gid = graph.id();
        // One pre-order walk (PyTorch's named_modules order; the first path of a module or
        // tensor reachable twice wins) instead of three traversals with dedup sets.
        #[derive(Default)]
        struct Walk {
            tensor_paths: FxHashMap<usize, TensorPath>,
            module_paths: FxHashMap<(usize, std::any::TypeId), Vec<u32>>,
            paths: Vec<String>,
            names: Vec<String>,
        }
        fn walk<'a>(m: &'a dyn Module, path: String, w: &mut Walk) {
            let key = module_key(m);
            // a module reachable twice keeps its first path (FX's named_modules); zero-sized
            // instances are distinct modules even though they share an address
            let zero_sized = std::mem::size_of_val(m) == 0;
            if !zero_sized && w.module_paths.contains_key(&key) {
                return;
            }
            let idx = w.paths.len() as u32;
            let Walk { tensor_paths, names, .. } = w;
            m.visit_tensors(&mut |n, kind, t| {
                tensor_paths.entry(t.id()).or_insert_with(|| {
                    let name = match names.iter().position(|x| x == n) {
                        Some(i) => i,
                        None => {
                            names.push(n.to_string());
                            names.len() - 1
                        }
                    } as u32;
                    TensorPath { module: idx, name, kind }
                });
            });
            let mut kids: Vec<(String, &'a dyn Module)> = Vec::new();
            m.visit_children(&mut |n, c| {
                kids.push((if path.is_empty() { n.to_string() } else { format!("{path}.{n}") }, c));
            });
            w.module_paths.entry(key).or_default().push(idx);
            w.paths.push(path);
            for (p, c) in kids {
                walk(c, p, w);
            }
        }
        let mut w = Walk::default();
        walk(root, String::new(), &mut w);
        let Walk { tensor_paths, module_paths, paths, names } = w;
        State {
            graph: RefCell::new(graph),
            gid,
            tensor_paths,
            module_paths,
            zst_calls: RefCell::new(vec![FxHashMap::default()]),
            paths,
            names,
            leaf,
            submodule: None,
            attr_nodes: RefCell::new(FxHashMap::default()),
            constant_paths: RefCell::new(FxHashMap::default()),
            attrs: RefCell::new(IndexMap::new()),
            constants: Cell::new(0),
            leaves: RefCell::new(IndexMap::new()),
            stack: RefCell::new(vec![]),
            empty_stack: Arc::from(Vec::new()),
            scratch: Cell::new(0),
            probing: Cell::new(false),
            failure: RefCell::new(None),
            getitem: crate::getitem::op(),
            create_node: None,
            hooked: Cell::new(None),
        }
    }

    /// Calls the create-node hook on every node created since the last call (nodes are
    /// appended in creation order while tracing).
    fn flush_created(&self) -> Result<()> {
        let Some(hook) = &self.create_node else { return Ok(()) };
        let fresh: Vec<NodeId> = {
            let g = self.graph.borrow();
            let mut cur = match self.hooked.get() {
                Some(last) => g.next(last).map_err(trace_err)?,
                None => g.first(),
            };
            let mut v = vec![];
            while let Some(n) = cur {
                v.push(n);
                cur = g.next(n).map_err(trace_err)?;
            }
            v
        };
        for n in fresh {
            hook(&mut self.graph.borrow_mut(), n)?;
            self.hooked.set(Some(n));
        }
        Ok(())
    }

    /// The placeholder of a `concrete_args` input and its guard (FX's `_proxy_placeholder`).
    fn concrete_placeholder(&self, name: &str, v: &Value) -> Result<()> {
        let Some(default) = literal(v) else {
            // a tensor: specialised into a constant, no placeholder
            return Ok(());
        };
        crate::assert_ops::register();
        let op = |n: &str| Target::op(n).map_err(trace_err);
        let py = match v {
            Value::Bool(true) => "True".to_string(),
            Value::Bool(false) => "False".to_string(),
            Value::None => "None".to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) => format!("{x:?}"),
            _ => String::new(),
        };
        let message =
            Argument::Str(format!("{name} has been specialized to have value {py} but got another value").into());
        let mut g = self.graph.borrow_mut();
        let ph = g.placeholder_with_default(&format!("{name}_1"), default.clone()).map_err(trace_err)?;
        match v {
            Value::Bool(_) | Value::Int(_) | Value::Float(_) => {
                let eq = g.call_function(op("eq_scalar")?, vec![ph.into(), default]).map_err(trace_err)?;
                g.call_function(op("_assert")?, vec![eq.into(), message]).map_err(trace_err)?;
            }
            Value::None => {
                g.call_function(op("_assert_is_none")?, vec![ph.into(), message]).map_err(trace_err)?;
            }
            // FX warns that it cannot guard these
            _ => {}
        }
        Ok(())
    }

    fn is_leaf(&self, m: &dyn Module, path: &str) -> bool {
        (self.leaf)(m, path)
    }

    fn symbolic(&self, node: NodeId, meta: Option<TensorMeta>) -> Tensor {
        Tensor::symbolic(Symbolic { meta, proxy: Arc::new(Proxy { graph: self.gid, node: Some(node) }) })
    }

    fn probe_tensor(&self, meta: Option<TensorMeta>) -> Tensor {
        Tensor::symbolic(Symbolic { meta, proxy: Arc::new(Proxy { graph: self.gid, node: None }) })
    }

    /// The qualified path of a parameter or buffer.
    fn tensor_path(&self, p: TensorPath) -> String {
        let module = &self.paths[p.module as usize];
        let name = &self.names[p.name as usize];
        if module.is_empty() {
            name.clone()
        } else {
            format!("{module}.{name}")
        }
    }

    /// Enters a module traced through: its frame joins `nn_module_stack`.
    fn push_module(&self, path: &str, type_name: &str) {
        let mut stack = self.stack.borrow_mut();
        let mut frames: Vec<ModuleStackEntry> = stack.last().map(|s| s.to_vec()).unwrap_or_default();
        frames.push(ModuleStackEntry {
            key: path.to_string(),
            path: path.to_string(),
            type_name: type_name.to_string(),
        });
        stack.push(frames.into());
        self.zst_calls.borrow_mut().push(FxHashMap::default());
    }

    /// Leaves the module entered last.
    fn pop_module(&self) {
        self.stack.borrow_mut().pop();
        self.zst_calls.borrow_mut().pop();
    }

    /// The index of the module `m` in `paths`, `None` for modules outside the traced tree.
    ///
    /// A module is identified by address and type, which is exact for every module that
    /// occupies memory. Zero-sized instances of one type all share an address: among them the
    /// call picks the children of the module being traced through, in order of their calls
    /// there (the k-th call of such a module in a frame is its k-th same-typed zero-sized
    /// child, cycling); a documented difference from FX, which could tell a reused instance
    /// from a second one.
    fn module_index(&self, m: &dyn Module) -> Option<u32> {
        let key = module_key(m);
        let all = self.module_paths.get(&key)?;
        if all.len() == 1 {
            return Some(all[0]);
        }
        let parent = self.stack.borrow().last().and_then(|s| s.last().map(|f| f.path.clone())).unwrap_or_default();
        let is_child = |i: &u32| {
            let p = &self.paths[*i as usize];
            match p.rsplit_once('.') {
                Some((head, _)) => head == parent,
                None => parent.is_empty(),
            }
        };
        let children: Vec<u32> = all.iter().copied().filter(is_child).collect();
        if children.is_empty() {
            return Some(all[0]);
        }
        let mut calls = self.zst_calls.borrow_mut();
        let counter = calls.last_mut()?.entry(key).or_insert(0);
        let i = children[*counter % children.len()];
        *counter += 1;
        Some(i)
    }

    fn set_meta(&self, node: NodeId, meta: Option<&TensorMeta>, _kind: Option<CallKind>) -> Result<()> {
        let stack = self.stack.borrow().last().unwrap_or(&self.empty_stack).clone();
        let mut g = self.graph.borrow_mut();
        let m = g.meta_mut(node).map_err(trace_err)?;
        if let Some(t) = meta {
            m.tensor_meta = Some(TensorMetadata {
                shape: t.shape.to_vec(),
                dtype: t.dtype,
                strides: t.strides.iter().map(|&s| s as isize).collect(),
                requires_grad: false,
            });
        }
        m.nn_module_stack = stack;
        Ok(())
    }

    /// A `get_attr` node reading `t` under `path`. As in FX, a parameter gets one node per
    /// trace (FX's `parameter_proxy_cache`); buffers and constants get a node per use, all
    /// with the same target (`b`, `b_1`; `_tensor_constant0`, `_tensor_constant0_1`).
    fn attr_node(&self, path: String, t: &Tensor, kind: TensorKind, constant: bool) -> Result<NodeId> {
        let n = self.graph.borrow_mut().get_attr(&path).map_err(trace_err)?;
        self.set_meta(n, t.meta().as_ref(), None)?;
        if kind == TensorKind::Parameter && !constant {
            self.attr_nodes.borrow_mut().insert(t.id(), n);
        }
        if constant {
            self.constant_paths.borrow_mut().insert(t.id(), path.clone());
        }
        self.attrs.borrow_mut().insert(path, TensorEntry { tensor: t.clone(), kind, constant });
        Ok(n)
    }

    fn tensor_arg(&self, t: &Tensor) -> Result<Argument> {
        if let Some(sym) = t.as_symbolic() {
            let p = sym
                .proxy
                .downcast_ref::<Proxy>()
                .filter(|p| p.graph == self.gid)
                .ok_or_else(|| Error::trace("trace", "a symbolic tensor of another trace was used in this one"))?;
            return p.node.map(Argument::Node).ok_or_else(|| {
                Error::trace("trace", "a value computed inside a leaf module escaped it while probing its outputs")
            });
        }
        if let Some(&n) = self.attr_nodes.borrow().get(&t.id()) {
            return Ok(Argument::Node(n));
        }
        if let Some(&p) = self.tensor_paths.get(&t.id()) {
            return Ok(Argument::Node(self.attr_node(self.tensor_path(p), t, p.kind, false)?));
        }
        let known = self.constant_paths.borrow().get(&t.id()).cloned();
        if let Some(path) = known {
            return Ok(Argument::Node(self.attr_node(path, t, TensorKind::Buffer, true)?));
        }
        // the next `_tensor_constantN` that no tensor of the module is called (a module
        // imported from a file can have one: its constant would silently replace it)
        let path = loop {
            let k = self.constants.get();
            self.constants.set(k + 1);
            let path = format!("_tensor_constant{k}");
            if !self.names.contains(&path) && !self.attrs.borrow().contains_key(&path) {
                break path;
            }
        };
        Ok(Argument::Node(self.attr_node(path, t, TensorKind::Buffer, true)?))
    }

    fn to_arg(&self, v: &Value) -> Result<Argument> {
        match v {
            Value::Tensor(t) => self.tensor_arg(t),
            Value::Tensors(ts) => {
                Ok(Argument::list(ts.iter().map(|t| self.tensor_arg(t)).collect::<Result<Vec<_>>>()?))
            }
            other => Ok(literal(other).unwrap_or(Argument::None)),
        }
    }

    /// Output metadata of `op` on `args`, or `None` when some input's shape is unknown.
    fn probe(&self, op: &'static OpDef, args: &[Value]) -> Result<Option<Vec<TensorMeta>>> {
        let unknown = args.iter().any(|a| match a {
            Value::Tensor(t) => t.meta().is_none(),
            Value::Tensors(ts) => ts.iter().any(|t| t.meta().is_none()),
            _ => false,
        });
        if unknown {
            return Ok(None);
        }
        self.probing.set(true);
        let r = (op.meta)(args);
        self.probing.set(false);
        r.map(|m| Some(m.into_iter().collect())).map_err(|e| e.in_op(op.name))
    }

    /// Symbolic outputs of a node whose value has `count` tensors (`getitem` nodes for several).
    fn outputs(&self, node: NodeId, metas: Option<Vec<TensorMeta>>, count: usize) -> Result<Vec<Tensor>> {
        if count == 1 {
            let meta = metas.and_then(|m| m.into_iter().next());
            self.set_meta(node, meta.as_ref(), None)?;
            return Ok(vec![self.symbolic(node, meta)]);
        }
        self.set_meta(node, None, None)?;
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let item = self
                .graph
                .borrow_mut()
                .call_function(Target::Op(self.getitem), vec![Argument::Node(node), Argument::Int(i as i64)])
                .map_err(trace_err)?;
            let meta = metas.as_ref().and_then(|m| m.get(i).cloned());
            self.set_meta(item, meta.as_ref(), None)?;
            out.push(self.symbolic(item, meta));
        }
        Ok(out)
    }

    fn record_op(&self, op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Outputs> {
        let metas = self.probe(op, args)?;
        if self.scratch.get() > 0 {
            let metas = metas.ok_or_else(|| Error::trace(op.name, "output shapes unknown"))?;
            return Ok(metas.into_iter().map(|m| self.probe_tensor(Some(m))).collect());
        }
        // FX records what the user wrote: trailing defaults are left out, keyword-only
        // arguments go to kwargs
        let mut keep = args.len();
        while keep > 0 && op.schema.get(keep - 1).is_some_and(|s| is_default(&args[keep - 1], &s.default)) {
            keep -= 1;
        }
        let mut positional = vec![];
        let mut kwargs = crate::graph::Kwargs::new();
        for (i, a) in args[..keep].iter().enumerate() {
            match op.schema.get(i) {
                Some(spec) if spec.kwarg_only => {
                    if !is_default(a, &spec.default) {
                        kwargs.insert(spec.name.to_string(), self.to_arg(a)?);
                    }
                }
                _ if !kwargs.is_empty() => {
                    let name = op.schema.get(i).map(|s| s.name).unwrap_or("arg");
                    kwargs.insert(name.to_string(), self.to_arg(a)?);
                }
                _ => positional.push(self.to_arg(a)?),
            }
        }
        let node = {
            let mut g = self.graph.borrow_mut();
            match kind {
                CallKind::Method => g.call_method_with(op.name, positional, kwargs),
                CallKind::Function | CallKind::Operator => g.call_function_with(Target::Op(op), positional, kwargs),
            }
            .map_err(trace_err)?
        };
        let count = match &metas {
            Some(m) => m.len(),
            None if MULTI_OUTPUT.contains(&op.name) => {
                return Err(Error::trace(
                    op.name,
                    format!(
                        "'{}' returns several tensors, and how many is unknown without shapes: trace with example inputs (trace_with_inputs)",
                        op.name
                    ),
                ))
            }
            None => 1,
        };
        Ok(self.outputs(node, metas, count)?.into_iter().collect())
    }

    fn record_leaf(&self, module: &dyn Module, path: &str, inputs: &[Value], single: bool) -> Result<Vec<Value>> {
        let record =
            if self.leaves.borrow().contains_key(path) { None } else { Some(self.leaf_record(module, path, inputs)?) };
        let arguments = inputs.iter().map(|a| self.to_arg(a)).collect::<Result<Vec<_>>>()?;
        let node = self.graph.borrow_mut().call_module(path, arguments).map_err(trace_err)?;
        // a single-tensor call on an input of unknown shape returns one value of unknown shape:
        // nothing to probe (FX does not look inside leaves either)
        let unknown = inputs.iter().any(|v| v.as_tensor().is_some_and(|t| t.is_symbolic() && t.meta().is_none()));
        if single && unknown {
            self.remember_leaf(path, record);
            let out = self.outputs(node, None, 1)?;
            self.add_leaf_frame(node, path, module.type_name())?;
            return Ok(out.into_iter().map(Value::Tensor).collect());
        }
        // output count and shapes: trace the leaf's body without recording it
        self.scratch.set(self.scratch.get() + 1);
        let probe_inputs: Vec<Value> = inputs
            .iter()
            .map(|v| match v {
                Value::Tensor(t) if t.is_symbolic() => Value::Tensor(self.probe_tensor(t.meta())),
                other => other.clone(),
            })
            .collect();
        let probed = match (single, probe_inputs.first()) {
            (true, Some(Value::Tensor(x))) => module.forward(x).map(|t| vec![Value::Tensor(t)]),
            _ => module.forward_values(&probe_inputs),
        };
        self.scratch.set(self.scratch.get() - 1);
        let (metas, count) = match probed {
            Ok(vals) => {
                let metas: Option<Vec<TensorMeta>> =
                    vals.iter().map(|v| v.as_tensor().and_then(|t| t.meta())).collect();
                let n = vals.len();
                (metas, n)
            }
            Err(_) if inputs.iter().any(|v| v.as_tensor().is_some_and(|t| t.meta().is_none())) => (None, 1),
            Err(e) => return Err(e),
        };
        self.remember_leaf(path, record);
        let out = self.outputs(node, metas, count)?;
        self.add_leaf_frame(node, path, module.type_name())?;
        Ok(out.into_iter().map(Value::Tensor).collect())
    }

    /// A leaf's `call_module` node carries the leaf's own frame last in its `nn_module_stack`,
    /// as in FX (`seq.0` for `Sequential(ReLU)`'s first layer).
    fn add_leaf_frame(&self, node: NodeId, path: &str, type_name: &str) -> Result<()> {
        let mut g = self.graph.borrow_mut();
        let m = g.meta_mut(node).map_err(trace_err)?;
        let mut frames = m.nn_module_stack.to_vec();
        frames.push(ModuleStackEntry {
            key: path.to_string(),
            path: path.to_string(),
            type_name: type_name.to_string(),
        });
        m.nn_module_stack = frames.into();
        Ok(())
    }

    /// What the GraphModule will hold for a leaf called for the first time: what the submodule
    /// builder makes of a user module (module-preserving tracing), else the module's own copy
    /// sharing its tensors (`Module::clone_module`: every built-in layer, and user modules that
    /// implement it).
    fn leaf_record(&self, module: &dyn Module, path: &str, inputs: &[Value]) -> Result<Box<dyn Module>> {
        if let Some(build) = &self.submodule {
            // built-in layers stay leaves; user modules go to the builder
            if !module.is_builtin_leaf() {
                return build(module, path, inputs);
            }
        }
        module.clone_module().ok_or_else(|| {
            Error::trace(
                module.type_name(),
                format!(
                    "module '{path}' ({}) was chosen as a leaf, but a GraphModule can only hold leaves it can copy: the built-in layers, or user modules implementing Module::clone_module; implement it or trace through the module",
                    module.type_name()
                ),
            )
        })
    }

    /// Remembers a leaf the first time it is called.
    fn remember_leaf(&self, path: &str, record: Option<Box<dyn Module>>) {
        if let Some(r) = record {
            self.leaves.borrow_mut().insert(path.to_string(), r);
        }
    }

    fn finish(self, root: &dyn Module) -> Result<GraphModule> {
        // no dead code elimination: FX's tracer keeps every node it records (unused ones too)
        let graph = self.graph.into_inner();
        GraphModule::from_parts(
            graph,
            self.leaves.into_inner(),
            self.attrs.into_inner(),
            root.type_name(),
            root.is_training(),
        )
    }
}

fn is_default(v: &Value, d: &ferrofx_core::op::Default) -> bool {
    use ferrofx_core::op::Default as D;
    match (v, d) {
        (Value::None, D::None) => true,
        (Value::Bool(a), D::Bool(b)) => a == b,
        (Value::Int(a), D::Int(b)) => a == b,
        (Value::Float(a), D::Float(b)) => a.to_bits() == b.to_bits(),
        (Value::Str(a), D::Str(b)) => a == b,
        (Value::Ints(a), D::Ints(b)) => a.as_slice() == *b,
        (Value::DType(a), D::DType(b)) => a == b,
        _ => false,
    }
}

/// The hook object installed for the duration of a trace.
struct Hooks(Rc<State>);

impl TraceHook for Hooks {
    fn record(&self, op: &'static OpDef, kind: CallKind, args: &[Value]) -> Result<Outputs> {
        let out = self.0.record_op(op, kind, args)?;
        self.0.flush_created()?;
        Ok(out)
    }

    fn captures(&self, t: &Tensor) -> bool {
        self.0.tensor_paths.contains_key(&t.id())
    }

    fn concrete_query(&self, what: &str, location: &'static Location<'static>) {
        let s = &self.0;
        if s.probing.get() || s.scratch.get() > 0 {
            return;
        }
        let mut f = s.failure.borrow_mut();
        if f.is_none() {
            *f = Some(Error::trace(
                what,
                format!(
                    "TraceError: {what} of a symbolic tensor was requested at {location}; its value is not known while tracing \
                     symbolically (data-dependent control flow). Fix the value with Tracer::concrete_arg, or trace with example \
                     inputs (trace_with_inputs) so shapes are known"
                ),
            ));
        }
    }
}

impl Hooks {
    fn module_call(&self, module: &dyn Module, inputs: &[Value], single: bool) -> Result<Vec<Value>> {
        let s = &self.0;
        let run = |m: &dyn Module| match (single, inputs.first()) {
            (true, Some(Value::Tensor(x))) => m.forward(x).map(|t| vec![Value::Tensor(t)]),
            _ => m.forward_values(inputs),
        };
        if s.scratch.get() > 0 {
            return run(module);
        }
        let path = s.module_index(module).map(|i| s.paths[i as usize].as_str());
        match path {
            Some(p) if !p.is_empty() && s.is_leaf(module, p) => {
                let out = s.record_leaf(module, p, inputs, single)?;
                s.flush_created()?;
                Ok(out)
            }
            Some(p) => {
                let pushed = !p.is_empty();
                if pushed {
                    s.push_module(p, module.type_name());
                }
                let r = run(module);
                if pushed {
                    s.pop_module();
                }
                r
            }
            None => run(module),
        }
    }
}

impl ModuleCallHook for Hooks {
    fn call_module(&self, module: &dyn Module, inputs: &[Value]) -> Result<Vec<Value>> {
        self.module_call(module, inputs, false)
    }

    fn call_module_single(&self, module: &dyn Module, x: &Tensor) -> Result<Tensor> {
        let mut out = self.module_call(module, &[Value::Tensor(x.clone())], true)?;
        match out.pop() {
            Some(Value::Tensor(t)) if out.is_empty() => Ok(t),
            _ => Err(Error::trace(module.type_name(), "call: expected the module to return one tensor")),
        }
    }
}

/// Whether `node` is a `call_function` of the tracer's `getitem`.
pub fn is_getitem(g: &Graph, node: NodeId) -> bool {
    g.node(node).is_ok_and(|n| n.op() == Opcode::CallFunction && n.target().name() == "getitem")
}
