//! The pass manager: a pipeline of passes over a [`GraphModule`], each run in place, with lint
//! and recompilation after every pass (a pass that leaves the module invalid stops the pipeline
//! with an error naming it), per-pass timing, and a report of what changed.
//!
//! One convention for every pass: `Fn(&mut GraphModule) -> Result<usize>`, in place, returning
//! how many rewrites it made (0: nothing to do). Graph-level passes (`&mut Graph`) are wrapped
//! with [`PassManager::add_graph_pass`].
//!
//! ```
//! use ferrofx_fx::passes::manager::PassManager;
//! use ferrofx_fx::symbolic_trace;
//! use ferrofx_nn::zoo::DigitsCnn;
//! use ferrofx_nn::Module;
//!
//! let mut model = DigitsCnn::new()?;
//! model.eval();
//! let mut gm = symbolic_trace(&model)?;
//! let report = PassManager::inference().run(&mut gm)?;
//! println!("{report}");
//! assert_eq!(report.get("fuse_conv_bn").map(|r| r.changed), Some(2));
//! assert_eq!(report.get("remove_identity_dropout").map(|r| r.changed), Some(1));
//! assert_eq!(report.nodes_after(), gm.graph().len());
//! # Ok::<(), ferrofx_core::Error>(())
//! ```

use crate::graph::Graph;
use crate::graph_module::GraphModule;
use ferrofx_core::{Error, Result};
use std::fmt;
use std::time::{Duration, Instant};

type PassFn = Box<dyn Fn(&mut GraphModule) -> Result<usize>>;

/// A named pass.
struct Pass {
    name: String,
    run: PassFn,
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq)]
pub struct PassRecord {
    /// The pass's name.
    pub name: String,
    /// Rewrites the pass reported (folded pairs, merged nodes, replaced matches, ...).
    pub changed: usize,
    /// Graph nodes before the pass.
    pub nodes_before: usize,
    /// Graph nodes after the pass.
    pub nodes_after: usize,
    /// Wall time of the pass, lint and recompilation included.
    pub elapsed: Duration,
}

/// The report of a pipeline run: one record per pass, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassReport {
    /// The records, in pipeline order.
    pub passes: Vec<PassRecord>,
}

impl PassReport {
    /// The record of the first pass named `name`.
    pub fn get(&self, name: &str) -> Option<&PassRecord> {
        self.passes.iter().find(|p| p.name == name)
    }

    /// Total rewrites of all passes.
    pub fn total_changed(&self) -> usize {
        self.passes.iter().map(|p| p.changed).sum()
    }

    /// Graph nodes after the last pass (0 for an empty pipeline).
    pub fn nodes_after(&self) -> usize {
        self.passes.last().map_or(0, |p| p.nodes_after)
    }

    /// Total time of the pipeline.
    pub fn elapsed(&self) -> Duration {
        self.passes.iter().map(|p| p.elapsed).sum()
    }
}

impl fmt::Display for PassReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.passes.iter().map(|p| p.name.len()).max().unwrap_or(4).max(4);
        writeln!(f, "{:<w$}  {:>7}  {:>13}  {:>10}", "pass", "changed", "nodes", "time")?;
        for p in &self.passes {
            writeln!(
                f,
                "{:<w$}  {:>7}  {:>6} -> {:<5}  {:>7.1} µs",
                p.name,
                p.changed,
                p.nodes_before,
                p.nodes_after,
                p.elapsed.as_secs_f64() * 1e6
            )?;
        }
        write!(
            f,
            "{:<w$}  {:>7}  {:>13}  {:>7.1} µs",
            "total",
            self.total_changed(),
            self.nodes_after(),
            self.elapsed().as_secs_f64() * 1e6
        )
    }
}

/// A pipeline of passes run in order on a GraphModule.
#[derive(Default)]
pub struct PassManager {
    passes: Vec<Pass>,
}

impl PassManager {
    /// An empty pipeline.
    pub fn new() -> PassManager {
        PassManager::default()
    }

    /// The inference pipeline: DCE, Conv/Linear+BatchNorm folding, identity-dropout removal,
    /// constant folding (tensor constants only), CSE, algebraic simplification, DCE.
    pub fn inference() -> PassManager {
        use super::{constant_fold, fuse};
        PassManager::new()
            .add_graph_pass("dce", dce_count)
            .add("fuse_conv_bn", fuse::fuse_conv_bn)
            .add("remove_identity_dropout", fuse::remove_identity_dropout)
            .add("fold_constants", |gm| constant_fold::fold_constants(gm, &[]))
            .add_graph_pass("cse", |g| super::eliminate_common_subexpressions(g).map_err(graph_err))
            .add_graph_pass("simplify", |g| super::simplify(g).map_err(graph_err))
            .add_graph_pass("dce", dce_count)
    }

    /// Appends a pass on the module.
    pub fn add(mut self, name: &str, pass: impl Fn(&mut GraphModule) -> Result<usize> + 'static) -> PassManager {
        self.passes.push(Pass { name: name.to_string(), run: Box::new(pass) });
        self
    }

    /// Appends a pass on the module's graph.
    pub fn add_graph_pass(self, name: &str, pass: impl Fn(&mut Graph) -> Result<usize> + 'static) -> PassManager {
        self.add(name, move |gm: &mut GraphModule| pass(gm.graph_mut()))
    }

    /// Names of the passes, in order.
    pub fn names(&self) -> Vec<&str> {
        self.passes.iter().map(|p| p.name.as_str()).collect()
    }

    /// Runs every pass in order. After each pass the graph is linted and the module recompiled
    /// (every target must resolve); the first pass that fails, or leaves the module invalid,
    /// stops the pipeline with an error naming it.
    pub fn run(&self, gm: &mut GraphModule) -> Result<PassReport> {
        let mut report = PassReport::default();
        for p in &self.passes {
            let nodes_before = gm.graph().len();
            let start = Instant::now();
            let changed = (p.run)(gm).map_err(|e| e.with_context(&format!("in pass '{}'", p.name)))?;
            gm.graph().lint().map_err(|e| {
                Error::argument("PassManager", format!("pass '{}' left a graph that fails lint: {e}", p.name))
            })?;
            gm.recompile().map_err(|e| e.with_context(&format!("after pass '{}'", p.name)))?;
            report.passes.push(PassRecord {
                name: p.name.clone(),
                changed,
                nodes_before,
                nodes_after: gm.graph().len(),
                elapsed: start.elapsed(),
            });
        }
        Ok(report)
    }
}

fn graph_err(e: crate::graph::GraphError) -> Error {
    Error::argument("pass", e.to_string())
}

/// Dead-code elimination, returning how many nodes it removed.
fn dce_count(g: &mut Graph) -> Result<usize> {
    let before = g.len();
    g.eliminate_dead_code(None).map_err(graph_err)?;
    Ok(before - g.len())
}
