//! # ferrofx-dist
//!
//! Training past one process, on MPI (Open MPI through the `mpi` crate), launched like any MPI
//! program: `mpirun -np 2 my_program`.
//!
//! * [`ProcessGroup`]: the job's ranks, collectives and point-to-point messages, with every
//!   MPI call on one communication thread and every wait bounded by a timeout;
//! * [`DistributedDataParallel`]: PyTorch's DDP (same start on every rank, bucketed gradient
//!   all-reduce launched from autograd hooks while backward runs, `no_sync`);
//! * [`DistributedSampler`]: each rank's share of a data set;
//! * [`PipelineStage`]: one stage per rank of a model cut by `split_module`, micro-batches run
//!   with the GPipe or 1F1B [`Schedule`];
//! * [`SyncBatchNorm`] (global batch statistics) and [`DistributedDropout`] (the global batch's
//!   masks), with [`convert_sync_batchnorm`] / [`convert_distributed_dropout`] on a traced
//!   module, which make DDP training equal to one process within rounding;
//! * [`train::train_digits_data_parallel`]: `ferrofx train --data-parallel`, the fixed shards of
//!   [`ferrofx_nn::batch_shards`] spread over the ranks: the weights of one process, bit for bit;
//! * [`shards`]: a checkpoint written as one file per rank plus an index, and
//!   [`shards::load_sharded_state_dict`], which reassembles it on one machine.
//!
//! Model splitting for pipelines lives in the graph layer:
//! `ferrofx_fx::passes::split_module` and `ferrofx_fx::passes::partition_stages`.

pub mod ddp;
pub mod dropout;
pub mod pipeline;
pub mod process_group;
pub mod sampler;
pub mod shards;
pub mod sync_batchnorm;
pub mod train;

pub use ddp::{broadcast_module, shard_rows, DistributedDataParallel, Reduction, DEFAULT_BUCKET_CAP_BYTES};
pub use dropout::{convert_distributed_dropout, DistributedDropout};
pub use pipeline::{PipelineStage, Schedule};
pub use process_group::{PendingReduce, ProcessGroup};
pub use sampler::DistributedSampler;
pub use sync_batchnorm::{convert_sync_batchnorm, SyncBatchNorm};
