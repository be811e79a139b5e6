//! The 2-rank data-parallel benchmark of `docs/benchmarks.md` (issue 22): one training step of
//! the digits CNN or ResNet-18 under `DistributedDataParallel`, on 1 or more ranks, with the
//! same global batch.
//!
//! ```text
//! cargo build --release -p ferrofx-dist --features mpi --example ddp_scaling
//! RAYON_NUM_THREADS=1 mpirun -np 1 -x RAYON_NUM_THREADS target/release/examples/ddp_scaling resnet18
//! RAYON_NUM_THREADS=1 mpirun -np 2 -x RAYON_NUM_THREADS target/release/examples/ddp_scaling resnet18
//! ```
//!
//! Per step (median over the timed steps, every rank starting together after a barrier):
//! * `step`: forward + `DistributedDataParallel::backward` (gradients averaged);
//! * `compute`: the same forward + backward inside `no_sync` (no communication);
//! * `comm`: a blocking all-reduce of as many floats as the model has parameters;
//! * `exposed = step − compute`: the communication backward did not hide;
//! * `overlap = 1 − exposed / comm`: the share of the all-reduce hidden behind backward;
//! * `sharded`: the step `ferrofx train --data-parallel` runs (fixed batch shards,
//!   `ferrofx_nn::batch_shards`): forward + backward of this rank's block of the 4 shards, one
//!   at a time, their gradients summed with the fixed tree, and the all-gather of the block sums
//!   finishing the tree (`RankShards`); `gather`: that all-gather alone.
//!
//! Arguments: `digits|resnet18 [global batch] [timed steps]`.

use ferrofx_core::ops::random::{manual_seed, randint, randn};
use ferrofx_core::{Result, Tensor};
use ferrofx_dist::train::RankShards;
use ferrofx_dist::{shard_rows, DistributedDataParallel, ProcessGroup};
use ferrofx_nn::batch_shards::{shard_rows as shard_of, tree_sum, ShardCombine};
use ferrofx_nn::loss::{cross_entropy, CeOpts};
use ferrofx_nn::Module;
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Fixed batch shards per global batch in the `sharded` figure (the CLI's default).
const SHARDS: usize = 4;

/// One sharded step: this rank's shards' forward and backward, the tree over them, and the
/// all-gather finishing it. Returns the step's time and the all-gather's.
fn sharded_step(pg: &Arc<ProcessGroup>, model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<(f64, f64)> {
    let mut comb = RankShards::new(pg.clone());
    let block = comb.block(SHARDS)?;
    let n = x.shape()[0];
    let t = Instant::now();
    let mut leaves = vec![];
    for k in block {
        let (a, b) = shard_of(n, SHARDS, k);
        let xs = x.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
        let ys = y.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
        model.zero_grad();
        cross_entropy(&model.forward(&xs)?, &ys, &CeOpts::default())?.backward(None, false, false)?;
        let w = (b - a) as f32 / n as f32;
        let mut flat = vec![];
        for p in model.parameters() {
            if let Some(g) = p.grad() {
                flat.extend(g.to_vec::<f32>()?.into_iter().map(|v| v * w));
            } else {
                flat.extend(std::iter::repeat_n(0.0, p.numel()));
            }
        }
        leaves.push(flat);
    }
    let local = tree_sum(leaves)?;
    let g = Instant::now();
    comb.combine(local)?;
    Ok((t.elapsed().as_secs_f64(), g.elapsed().as_secs_f64()))
}

fn bench<M: Module>(pg: &Arc<ProcessGroup>, model: M, x: &Tensor, y: &Tensor, steps: usize) -> Result<[f64; 5]> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let n = x.shape()[0];
    let (a, b) = shard_rows(n, rank, world);
    let xs = x.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
    let ys = y.narrow(0, a as i64, (b - a) as i64)?.contiguous()?;
    let ddp = DistributedDataParallel::new(model, pg.clone())?;
    let numel: usize = ddp.module().parameters().iter().map(|p| p.numel()).sum();
    let (mut step, mut compute, mut comm, mut sharded, mut gather) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..steps + 1 {
        // synchronised step
        pg.barrier()?;
        let t = Instant::now();
        ddp.module().zero_grad();
        let loss = cross_entropy(&ddp.forward(&xs)?, &ys, &CeOpts::default())?;
        ddp.backward(&loss)?;
        let s = t.elapsed().as_secs_f64();
        // the same without communication
        pg.barrier()?;
        let t = Instant::now();
        ddp.module().zero_grad();
        let loss = cross_entropy(&ddp.forward(&xs)?, &ys, &CeOpts::default())?;
        ddp.no_sync(|d| d.backward(&loss))?;
        let c = t.elapsed().as_secs_f64();
        // the all-reduce alone
        pg.barrier()?;
        let buf = vec![1.0f32; numel];
        let t = Instant::now();
        pg.all_reduce_sum(buf)?;
        let r = t.elapsed().as_secs_f64();
        // the CLI's sharded step
        pg.barrier()?;
        // (inside no_sync: DDP's hooks stay quiet)
        let (sh, ga) = ddp.no_sync(|d| sharded_step(pg, d.module(), x, y))?;
        if i > 0 {
            sharded.push(sh);
            gather.push(ga);
            // the first step warms the allocator and the caches
            step.push(s);
            compute.push(c);
            comm.push(r);
        }
    }
    Ok([median(step), median(compute), median(comm), median(sharded), median(gather)])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("digits");
    let pg = Arc::new(ProcessGroup::init()?);
    let (batch, steps) = (
        args.get(1).and_then(|s| s.parse().ok()).unwrap_or(if which == "digits" { 64 } else { 16 }),
        args.get(2).and_then(|s| s.parse().ok()).unwrap_or(if which == "digits" { 20 } else { 5 }),
    );
    manual_seed(0);
    let (times, params) = match which {
        "digits" => {
            let mut m = ferrofx_nn::zoo::DigitsCnn::new()?;
            m.train(true);
            let params: usize = m.parameters().iter().map(|p| p.numel()).sum();
            let x = randn(&[batch as i64, 1, 8, 8], None)?;
            let y = randint(0, 10, &[batch as i64], None)?;
            (bench(&pg, m, &x, &y, steps)?, params)
        }
        "resnet18" => {
            let mut m = ferrofx_nn::zoo::ResNet::resnet18(10)?;
            m.train(true);
            let params: usize = m.parameters().iter().map(|p| p.numel()).sum();
            let x = randn(&[batch as i64, 3, 32, 32], None)?;
            let y = randint(0, 10, &[batch as i64], None)?;
            (bench(&pg, m, &x, &y, steps)?, params)
        }
        other => {
            eprintln!("unknown model '{other}': digits or resnet18");
            std::process::exit(2);
        }
    };
    let [step, compute, comm, sharded, gather] = times;
    if pg.rank() == 0 {
        let exposed = (step - compute).max(0.0);
        // one rank has nothing to overlap: its "all-reduce" returns its input
        let overlap = if pg.world_size() > 1 && comm > 0.0 {
            format!("{:.0}%", 100.0 * (1.0 - exposed / comm).clamp(0.0, 1.0))
        } else {
            "n/a".to_string()
        };
        println!(
            "{which}: {} ranks x {} threads, global batch {batch}, {params} parameters ({:.1} MB), {steps} steps: \
             step {:.2} ms ({:.0} samples/s), compute {:.2} ms, all-reduce {:.2} ms, exposed {:.2} ms, overlap {}; \
             sharded ({SHARDS} shards) {:.2} ms ({:.0} samples/s), all-gather {:.2} ms",
            pg.world_size(),
            std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "?".into()),
            params as f64 * 4.0 / 1e6,
            step * 1e3,
            batch as f64 / step,
            compute * 1e3,
            comm * 1e3,
            exposed * 1e3,
            overlap,
            sharded * 1e3,
            batch as f64 / sharded,
            gather * 1e3
        );
    }
    pg.barrier()?;
    Ok(())
}
