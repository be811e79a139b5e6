//! `split_module`: FX's `torch.fx.passes.split_module`, the pass that model parallelism and
//! pipelines are built on.
//!
//! A callback assigns every computing node (`call_function`, `call_method`, `call_module`) a
//! partition number. Each partition becomes a [`GraphModule`] `submod_<n>` whose placeholders
//! are the values it reads from outside (the original inputs and the results of earlier
//! partitions, in first-use order, named `arg_0`, `arg_1`, ... as FX names them) and whose
//! outputs are the values later partitions or the original output read. The returned module's
//! graph calls the partitions in dependency order and computes exactly what the original did.
//!
//! Ownership of state, as pipelines need it (and FX does for submodules):
//!
//! * a leaf module called by a partition is owned by that partition, under its path with `.`
//!   replaced by `_` (FX's naming; [`SplitModule::qualname_map`] maps the new names back);
//! * a tensor attribute (`get_attr`: a parameter, buffer or traced constant) is placed in every
//!   partition that reads it, sharing the same tensor. FX instead keeps it in the parent and
//!   passes it in as an input; ferrofx moves it into the partition so a stage holds its own
//!   weights. An attribute or module read by more than one partition is listed in
//!   [`SplitModule::shared`], because a pipeline placing those partitions on different ranks
//!   must keep the copies equal (average their gradients).
//!
//! `getitem` nodes always join the partition of the node whose results they pick, so a value
//! crossing a cut is always one tensor (FX passes the whole tuple; the result is the same).
//!
//! ```
//! use ferrofx_fx::passes::split_module::split_module;
//! use ferrofx_fx::{symbolic_trace, Opcode};
//! use ferrofx_nn::{Linear, Module, ReLU, Sequential};
//! let model = Sequential::new()
//!     .append(Linear::new(4, 8, true).unwrap())
//!     .append(ReLU::new())
//!     .append(Linear::new(8, 2, true).unwrap());
//! let gm = symbolic_trace(&model).unwrap();
//! // everything up to the ReLU in partition 0, the rest in partition 1
//! let split = split_module(&gm, |n| Ok(if n.name() == "_2" { 1 } else { 0 })).unwrap();
//! assert_eq!(split.partitions, ["submod_0", "submod_1"]);
//! let x = ferrofx_core::Tensor::from_vec(vec![1.0f32; 12], &[3, 4]).unwrap();
//! let (a, b) = (gm.forward(&x).unwrap(), split.module.forward(&x).unwrap());
//! assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
//! ```

use crate::graph::{Argument, Graph, Node, NodeId, Opcode, Target};
use crate::graph_module::{GraphModule, TensorEntry};
use crate::tracer::is_getitem;
use ferrofx_core::{Error, Result};
use ferrofx_nn::Module;
use indexmap::{IndexMap, IndexSet};
use std::collections::{BTreeSet, HashMap};

/// An attribute or leaf module that several partitions use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedState {
    /// Its path in the original module.
    pub path: String,
    /// `true` for a leaf module, `false` for a tensor attribute.
    pub is_module: bool,
    /// The partitions (`submod_<n>`) that hold it, in dependency order.
    pub partitions: Vec<String>,
}

/// The result of [`split_module`].
pub struct SplitModule {
    /// The split module: its graph calls the partitions in order; its children are the
    /// partitions (each a [`GraphModule`]).
    pub module: GraphModule,
    /// The partitions' names (`submod_<n>`), in the order the split module calls them.
    pub partitions: Vec<String>,
    /// New qualified name (`submod_0.layer1_0_conv1`) → the name in the original module
    /// (`layer1.0.conv1`), for every module and attribute placed in a partition (FX's
    /// `qualname_map`).
    pub qualname_map: IndexMap<String, String>,
    /// Modules and attributes used by more than one partition.
    pub shared: Vec<SharedState>,
}

impl SplitModule {
    /// The partition called `name`, as a [`GraphModule`].
    pub fn partition(&self, name: &str) -> Result<&GraphModule> {
        let m = self.module.get_submodule_owned(name)?;
        m.as_any()
            .downcast_ref::<GraphModule>()
            .ok_or_else(|| Error::argument("split_module", format!("'{name}' is not a partition")))
    }
}

/// One partition being built.
struct Part {
    /// Nodes of the original graph, in graph order.
    nodes: Vec<NodeId>,
    /// Values defined elsewhere that this partition reads (first use order).
    inputs: IndexSet<NodeId>,
    /// Values defined here that others read (first use order).
    outputs: IndexSet<NodeId>,
    /// Partitions this one reads from.
    deps: BTreeSet<usize>,
}

fn part_name(index: usize) -> String {
    format!("submod_{index}")
}

fn gerr(e: impl std::fmt::Display) -> Error {
    Error::argument("split_module", e.to_string())
}

/// FX's `split_module`: splits `gm` into one [`GraphModule`] per partition that
/// `partition_of_node` assigns to its computing nodes (`call_*`; placeholders, `get_attr` and
/// the output are placed by the pass). See the [module documentation](self) for the rules.
///
/// Errors: a callback error (returned as is), partitions that depend on each other in a cycle
/// (naming them), or a target the module does not have.
pub fn split_module(
    gm: &GraphModule,
    mut partition_of_node: impl FnMut(&Node<'_>) -> Result<usize>,
) -> Result<SplitModule> {
    let g = gm.graph();
    // ---- 1. assign partitions (getitem joins its producer) ---------------------------------
    let mut part_of: HashMap<NodeId, usize> = HashMap::new();
    let mut parts: IndexMap<usize, Part> = IndexMap::new();
    for n in g.iter() {
        if !matches!(n.op(), Opcode::CallFunction | Opcode::CallMethod | Opcode::CallModule) {
            continue;
        }
        let p = match n.args().first().and_then(Argument::as_node) {
            Some(src) if is_getitem(g, n.id()) && part_of.contains_key(&src) => part_of[&src],
            _ => partition_of_node(&n)?,
        };
        part_of.insert(n.id(), p);
        parts
            .entry(p)
            .or_insert_with(|| Part {
                nodes: vec![],
                inputs: IndexSet::new(),
                outputs: IndexSet::new(),
                deps: BTreeSet::new(),
            })
            .nodes
            .push(n.id());
    }
    // ---- 2. cross-partition uses -----------------------------------------------------------
    // attribute reads: get_attr nodes are copied into each partition that reads them
    let mut attr_users: HashMap<NodeId, BTreeSet<usize>> = HashMap::new();
    let mut output_arg = None;
    for n in g.iter() {
        match n.op() {
            Opcode::Output => output_arg = n.args().first().cloned(),
            Opcode::CallFunction | Opcode::CallMethod | Opcode::CallModule => {
                let used = part_of[&n.id()];
                for def in n.all_input_nodes() {
                    let dn = g.node(def).map_err(gerr)?;
                    match dn.op() {
                        Opcode::GetAttr => {
                            attr_users.entry(def).or_default().insert(used);
                        }
                        Opcode::Placeholder => {
                            parts[&used].inputs.insert(def);
                        }
                        _ => {
                            let defined = part_of[&def];
                            if defined != used {
                                parts[&defined].outputs.insert(def);
                                parts[&used].inputs.insert(def);
                                parts[&used].deps.insert(defined);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let output_arg = output_arg.ok_or_else(|| Error::argument("split_module", "the graph has no output node"))?;
    let mut base_attrs: Vec<NodeId> = vec![];
    output_arg.visit_nodes(&mut |def| {
        if let Some(&p) = part_of.get(&def) {
            parts[&p].outputs.insert(def);
        } else if g.node(def).is_ok_and(|d| d.op() == Opcode::GetAttr) && !base_attrs.contains(&def) {
            base_attrs.push(def);
        }
    });
    // ---- 3. order partitions (Kahn, smallest number first) --------------------------------
    let mut remaining: BTreeSet<usize> = parts.keys().copied().collect();
    let mut order: Vec<usize> = Vec::with_capacity(parts.len());
    while !remaining.is_empty() {
        let ready = remaining.iter().copied().find(|p| parts[p].deps.iter().all(|d| !remaining.contains(d)));
        match ready {
            Some(p) => {
                remaining.remove(&p);
                order.push(p);
            }
            None => {
                let names: Vec<String> = remaining.iter().map(|&p| part_name(p)).collect();
                return Err(Error::argument(
                    "split_module",
                    format!(
                        "the partitions {names:?} depend on each other in a cycle: assign the nodes so that \
                         values flow one way between partitions (e.g. contiguous ranges of the graph's order)"
                    ),
                ));
            }
        }
    }
    // ---- 4. build each partition ----------------------------------------------------------
    let mut qualname_map: IndexMap<String, String> = IndexMap::new();
    let mut holders: IndexMap<(String, bool), Vec<String>> = IndexMap::new();
    let mut children: Vec<(String, GraphModule)> = Vec::with_capacity(order.len());
    for &p in &order {
        let part = &parts[&p];
        let name = part_name(p);
        let mut sub = Graph::new();
        let mut env: HashMap<NodeId, NodeId> = HashMap::new();
        let mut modules: IndexMap<String, Box<dyn Module>> = IndexMap::new();
        let mut attrs: IndexMap<String, TensorEntry> = IndexMap::new();
        for (i, &inp) in part.inputs.iter().enumerate() {
            let orig = g.node(inp).map_err(gerr)?;
            let ph = sub.placeholder(&format!("arg_{i}")).map_err(gerr)?;
            *sub.meta_mut(ph).map_err(gerr)? = orig.meta().clone();
            env.insert(inp, ph);
        }
        // attributes this partition reads, in graph order, before its computation
        for n in g.iter().filter(|n| n.op() == Opcode::GetAttr) {
            if !attr_users.get(&n.id()).is_some_and(|u| u.contains(&p)) {
                continue;
            }
            let path = n.target().name().to_string();
            let local = path.replace('.', "_");
            let entry = gm.attributes().get(&path).cloned().ok_or_else(|| {
                Error::argument("split_module", format!("node '{}': get_attr target '{path}' does not exist", n.name()))
            })?;
            attrs.insert(local.clone(), entry);
            let id = sub
                .node_copy(&n, |_| Err(crate::graph::GraphError::InvalidMove("get_attr has no inputs".into())))
                .map_err(gerr)?;
            sub.set_target(id, Target::Str(local.clone())).map_err(gerr)?;
            env.insert(n.id(), id);
            if qualname_map.insert(format!("{name}.{local}"), path.clone()).is_none() {
                holders.entry((path, false)).or_default().push(name.clone());
            }
        }
        for &id in &part.nodes {
            let n = g.node(id).map_err(gerr)?;
            let new = sub
                .node_copy(&n, |d| {
                    env.get(&d).map(|&x| Argument::Node(x)).ok_or_else(|| {
                        crate::graph::GraphError::InvalidMove(format!("value {d:?} is not available in {name}"))
                    })
                })
                .map_err(gerr)?;
            if n.op() == Opcode::CallModule {
                let path = n.target().name().to_string();
                let local = path.replace('.', "_");
                if !modules.contains_key(&local) {
                    let m = gm.leaf_modules().get(&path).ok_or_else(|| {
                        Error::argument(
                            "split_module",
                            format!("node '{}': call_module target '{path}' is not a submodule", n.name()),
                        )
                    })?;
                    let copy = m.clone_module().ok_or_else(|| {
                        Error::argument(
                            "split_module",
                            format!(
                                "node '{}': module '{path}' ({}) cannot be copied into a partition: give it a \
                                 `clone_module` (sharing its tensors) or trace through it",
                                n.name(),
                                m.type_name()
                            ),
                        )
                    })?;
                    modules.insert(local.clone(), copy);
                    qualname_map.insert(format!("{name}.{local}"), path.clone());
                    holders.entry((path, true)).or_default().push(name.clone());
                }
                sub.set_target(new, Target::Str(local)).map_err(gerr)?;
            }
            env.insert(id, new);
        }
        let outs: Vec<Argument> = part.outputs.iter().map(|o| Argument::Node(env[o])).collect();
        let out =
            if outs.len() == 1 { outs.into_iter().next().unwrap_or(Argument::None) } else { Argument::tuple(outs) };
        sub.output(out).map_err(gerr)?;
        let child = GraphModule::from_parts(sub, modules, attrs, &name, gm.is_training())?;
        children.push((name, child));
    }
    // ---- 5. the base graph ----------------------------------------------------------------
    let mut base = Graph::new();
    let mut benv: HashMap<NodeId, NodeId> = HashMap::new();
    let mut base_attr_entries: IndexMap<String, TensorEntry> = IndexMap::new();
    for n in g.iter() {
        match n.op() {
            Opcode::Placeholder => {
                let id = base.node_copy(&n, |_| Ok(Argument::None)).map_err(gerr)?;
                benv.insert(n.id(), id);
            }
            Opcode::GetAttr if base_attrs.contains(&n.id()) => {
                let path = n.target().name().to_string();
                if let Some(e) = gm.attributes().get(&path) {
                    base_attr_entries.insert(path.clone(), e.clone());
                }
                let id = base.node_copy(&n, |_| Ok(Argument::None)).map_err(gerr)?;
                benv.insert(n.id(), id);
            }
            _ => {}
        }
    }
    let mut base_modules: IndexMap<String, Box<dyn Module>> = IndexMap::new();
    for (&p, (name, child)) in order.iter().zip(children) {
        let part = &parts[&p];
        let args: Vec<Argument> = part.inputs.iter().map(|i| Argument::Node(benv[i])).collect();
        let call = base.call_module(&name, args).map_err(gerr)?;
        if part.outputs.len() == 1 {
            benv.insert(part.outputs[0], call);
        } else {
            for (k, &o) in part.outputs.iter().enumerate() {
                let pick = base
                    .call_function(
                        Target::op("getitem").map_err(gerr)?,
                        [Argument::Node(call), Argument::Int(k as i64)],
                    )
                    .map_err(gerr)?;
                let orig = g.node(o).map_err(gerr)?;
                base.rename(pick, orig.name()).map_err(gerr)?;
                *base.meta_mut(pick).map_err(gerr)? = orig.meta().clone();
                benv.insert(o, pick);
            }
        }
        base_modules.insert(name, Box::new(child));
    }
    let out = output_arg.map_nodes(&mut |d| Argument::Node(benv[&d]));
    base.output(out).map_err(gerr)?;
    let module =
        GraphModule::from_parts(base, base_modules, base_attr_entries, gm.traced_type_name(), gm.is_training())?;
    let partitions: Vec<String> = order.iter().map(|&p| part_name(p)).collect();
    let shared = holders
        .into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|((path, is_module), partitions)| SharedState { path, is_module, partitions })
        .collect();
    Ok(SplitModule { module, partitions, qualname_map, shared })
}
