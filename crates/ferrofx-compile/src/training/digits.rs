//! The digits job trained through a partitioned joint graph (`ferrofx train --memory-budget`).
//!
//! [`ferrofx_nn::train::train_digits_with`] runs the usual loop (data, Adam, one-cycle schedule,
//! evaluation, memory tracking); each step here runs the forward graph of a
//! [`min_cut_rematerialization_partition`] of the digits CNN's joint graph under the
//! `Activation` category, then its backward graph under `Gradient`, and hands the gradients to
//! the optimizer through `.grad`. The partition is captured once per batch shape (the last batch
//! of an epoch may be smaller).

use super::joint::capture_joint_with_targets;
use super::mincut::{min_cut_rematerialization_partition, MemoryBudget, PartitionOptions};
use super::partition::{default_partition, Partition, PartitionReport};
use ferrofx_core::memory::tracking::{category_scope, Category};
use ferrofx_core::{Error, Result, Tensor, Value};
use ferrofx_nn::loss::{cross_entropy, CeOpts};
use ferrofx_nn::train::{train_digits_with, TrainConfig, TrainReport};
use ferrofx_nn::zoo::DigitsCnn;
use ferrofx_nn::Module;
use std::collections::HashMap;

/// A training run through the graphs, with what the partition cost.
pub struct GraphTrainReport {
    /// The usual report (`memory.peak(Category::Activation)`: the peak activation memory).
    pub report: TrainReport,
    /// The partition of a full batch.
    pub partition: PartitionReport,
    /// Names of the forward values recomputed in backward.
    pub recomputed: Vec<String>,
}

/// Which partition a graph training run uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Partitioner {
    /// Save everything the backward reads.
    Default,
    /// Min-cut with a memory budget.
    Budget(MemoryBudget),
}

fn partition(model: &DigitsCnn, x: &Tensor, y: &Tensor, how: Partitioner) -> Result<Partition> {
    let loss = |out: &[Value], targets: &[Value]| -> Result<Tensor> {
        let logits = out[0].as_tensor().ok_or_else(|| Error::argument("train", "the model returned no tensor"))?;
        let y = targets[0].as_tensor().ok_or_else(|| Error::argument("train", "labels are not a tensor"))?;
        cross_entropy(logits, y, &CeOpts::default())
    };
    let joint = capture_joint_with_targets(model, &[x.into()], &[y.into()], &loss, &[])?;
    match how {
        Partitioner::Default => default_partition(&joint),
        Partitioner::Budget(b) => min_cut_rematerialization_partition(
            &joint,
            &PartitionOptions { memory_budget: Some(b), ..Default::default() },
        ),
    }
}

/// Trains the digits CNN as `ferrofx train` does, each step through the forward and backward
/// graphs of `how`'s partition.
pub fn train_digits_graph(cfg: &TrainConfig, how: Partitioner) -> Result<GraphTrainReport> {
    let mut cache: HashMap<Vec<usize>, Partition> = HashMap::new();
    let mut full: Option<(PartitionReport, Vec<String>)> = None;
    let mut step = |model: &DigitsCnn, x: &Tensor, y: &Tensor| -> Result<f64> {
        let key = x.shape().to_vec();
        if !cache.contains_key(&key) {
            let p = partition(model, x, y, how)?;
            if full.is_none() {
                full = Some((p.report.clone(), p.recomputed.clone()));
            }
            cache.insert(key.clone(), p);
        }
        let p = &cache[&key];
        let _g = ferrofx_core::autograd::no_grad();
        let (outs, saved) = {
            let _mem = category_scope(Category::Activation);
            p.run_forward(&[x.into(), y.into()])?
        };
        let loss = outs[0].as_tensor().ok_or_else(|| Error::argument("train", "no loss"))?.item()?;
        drop(outs);
        let grads = {
            let _mem = category_scope(Category::Gradient);
            p.run_backward(saved, Tensor::scalar(1.0f32))?
        };
        let params: Vec<Tensor> = model.parameters().into_iter().filter(|p| p.requires_grad()).collect();
        for (p, g) in params.iter().zip(grads) {
            p.set_grad(g)?;
        }
        Ok(loss)
    };
    let report = train_digits_with(cfg, &mut step)?;
    let (partition, recomputed) = full.ok_or_else(|| Error::argument("train", "no training step ran"))?;
    Ok(GraphTrainReport { report, partition, recomputed })
}
