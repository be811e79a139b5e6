//! Passes over graphs: analyses and rewrites.
//!
//! * [`matcher`]: FX's `SubgraphMatcher`: every occurrence of a pattern graph in a graph;
//! * [`subgraph_rewriter`]: FX's `replace_pattern`: replace each occurrence by a replacement
//!   graph;
//! * [`analysis`]: FLOPs, activation memory, shapes per node and module, `tabular`, the
//!   node-level profiler;
//! * [`constant_fold`]: constant folding (tensor constants and frozen attributes);
//! * [`cse`]: common subexpression elimination;
//! * [`draw`]: Graphviz DOT and SVG drawings;
//! * [`flops`]: MACs and parameter counts;
//! * [`manager`]: the pass manager (pipelines with lint after each pass, timing, report);
//! * [`fuse`]: Conv/Linear+BatchNorm folding and identity-dropout removal on GraphModules;
//! * [`simplify`](mod@simplify): algebraic simplification.

pub mod analysis;
pub mod constant_fold;
pub mod cse;
#[doc = include_str!("../../../../docs/writing-a-pass.md")]
pub mod guide {}
pub mod draw;
pub mod flops;
pub mod fuse;
pub mod manager;
pub mod matcher;
pub mod simplify;
pub mod subgraph_rewriter;

pub use constant_fold::fold_constants;
pub use cse::eliminate_common_subexpressions;
pub use manager::{PassManager, PassReport};
pub use matcher::{InternalMatch, SubgraphMatcher};
pub use simplify::simplify;
pub use subgraph_rewriter::{
    replace_pattern, replace_pattern_in_module, replace_pattern_with_filters, Match, MatchFilter, ReplacedPatterns,
    Replacement, ReplacementCallback,
};
pub mod partition_stages;
pub mod split_module;
pub use partition_stages::{partition_balanced, partition_by_memory, StagePlan, StageStats};
pub use split_module::{split_module, SharedState, SplitModule};
