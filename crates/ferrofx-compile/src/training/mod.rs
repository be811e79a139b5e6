//! Training as a graph (issue 21): the forward and the backward of a scalar loss captured into
//! one joint [`GraphModule`](ferrofx_fx::GraphModule) ([`capture_joint`]), split into a forward
//! and a backward graph by a partitioner that decides which forward values are saved and which
//! are recomputed ([`default_partition`], [`min_cut_rematerialization_partition`] with a
//! [`MemoryBudget`], [`checkpoint_modules`]). PyTorch's AOTAutograd in ferrofx; see
//! `docs/training.md`.

pub mod digits;
pub mod joint;
pub mod maxflow;
pub mod mincut;
pub mod partition;

pub use joint::{capture_joint, capture_joint_with_targets, GradTarget, JointGraph, LossFn};
pub use mincut::{
    checkpoint_modules, min_cut_rematerialization_partition, MemoryBudget, ModuleSelector, PartitionOptions,
};
pub use partition::{default_partition, Partition, PartitionReport, SavedValue, ESTIMATE_FLOPS_PER_SECOND};
