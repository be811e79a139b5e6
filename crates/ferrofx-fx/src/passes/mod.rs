//! Passes over graphs: analyses and rewrites.
//!
//! * [`matcher`]: FX's `SubgraphMatcher`: every occurrence of a pattern graph in a graph;
//! * [`subgraph_rewriter`]: FX's `replace_pattern`: replace each occurrence by a replacement
//!   graph.

pub mod matcher;
pub mod subgraph_rewriter;

pub use matcher::{Match, SubgraphMatcher};
pub use subgraph_rewriter::replace_pattern;
