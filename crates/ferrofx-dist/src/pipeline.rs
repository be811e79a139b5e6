//! Pipeline parallelism: the stages of a [`SplitModule`] placed one per rank, micro-batches run
//! with the GPipe or 1F1B schedule, activations and gradients sent point to point.
//!
//! Rank `r` runs partition `r` (so the split must have as many partitions as the job has
//! ranks: [`ferrofx_fx::passes::partition_balanced`] with `world_size()` stages makes one).
//! Each global batch is cut into `micro_batches` equal slices along dimension 0 of every model
//! input; every rank is given the whole batch and takes the inputs its stage reads. A value a
//! stage reads from an earlier stage arrives as a message from that stage's rank (any earlier
//! stage, not only the previous one), becomes a leaf that requires grad, and its gradient goes
//! back the same way during backward. The last stage applies the loss to each micro-batch's
//! output; the loss of a step is the mean of the micro-batch losses, so with equal slices the
//! gradients equal one process's on the whole batch (BatchNorm in training mode normalises per
//! micro-batch instead, as in every pipeline).
//!
//! * **GPipe**: every micro-batch forward, then every backward.
//! * **1F1B**: rank `r` runs `stages - r - 1` warm-up forwards (at most the micro-batch count),
//!   then alternates one forward and one backward, then drains the backwards: at most
//!   `stages - r` micro-batches' activations are alive at once instead of all of them.
//!
//! Messages: tag 0 carries activations, tag 1 gradients; each is `[ndim, dims..., values...]`
//! in `f32`. MPI keeps messages between two ranks with one tag in order, and both schedules
//! send and receive in micro-batch order, so no further matching is needed.

use crate::process_group::ProcessGroup;
use ferrofx_core::{DType, Error, Result, Tensor, Value};
use ferrofx_fx::passes::SplitModule;
use ferrofx_fx::{Argument, GraphModule, Opcode};
use ferrofx_nn::Module;
use std::collections::HashMap;

const TAG_ACT: i32 = 0;
const TAG_GRAD: i32 = 1;

/// The schedule of a pipeline step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward (PipeDream-flush), bounded activation memory.
    OneFOneB,
}

/// Where a stage input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Model input `i`.
    Input(usize),
    /// Output `j` of stage `s`.
    Stage(usize, usize),
}

/// This rank's stage of a pipeline.
pub struct PipelineStage {
    stage: usize,
    stages: usize,
    split: SplitModule,
    name: String,
    inputs: Vec<Source>,
    /// Per output: the stages that read it.
    consumers: Vec<Vec<usize>>,
    /// The output of the whole model (on the last stage: which of its outputs).
    final_output: Option<usize>,
    /// Per stage input: the shape and dtype the split graph propagated for it.
    expected: Vec<Option<(Vec<usize>, DType)>>,
    /// The batch size the shapes were propagated with (model input 0's first dimension).
    meta_batch: Option<usize>,
}

/// One micro-batch's state between its forward and backward.
struct InFlight {
    received: Vec<(usize, usize, Tensor)>,
    outputs: Vec<Tensor>,
    loss: Option<Tensor>,
}

fn perr(stage: usize, msg: impl std::fmt::Display) -> Error {
    Error::argument("pipeline", format!("stage {stage}: {msg}"))
}

fn encode(t: &Tensor) -> Result<Vec<f32>> {
    let mut v = Vec::with_capacity(1 + t.shape().len() + t.numel());
    v.push(t.shape().len() as f32);
    v.extend(t.shape().iter().map(|&d| d as f32));
    v.extend(t.contiguous()?.to_vec::<f32>()?);
    Ok(v)
}

/// What a stage expects to receive: the shape (when it can be predicted exactly) and a bound
/// on the message's length (header included).
struct Expect {
    shape: Option<Vec<usize>>,
    max_len: usize,
    what: String,
}

impl Expect {
    fn exact(shape: &[usize], what: String) -> Expect {
        Expect { max_len: 1 + shape.len() + shape.iter().product::<usize>(), shape: Some(shape.to_vec()), what }
    }
}

/// Decodes `[ndim, dims..., values...]` from rank `from` and checks it against `want`. The
/// message was already bounded by `want.max_len` before it was received.
fn decode(v: Vec<f32>, stage: usize, from: usize, want: &Expect) -> Result<Tensor> {
    let bad = |why: &str| perr(stage, format!("a malformed message from rank {from} ({why}); expected {}", want.what));
    let ndim = *v.first().ok_or_else(|| bad("empty"))?;
    if !(ndim >= 0.0 && ndim.fract() == 0.0 && (1.0 + ndim) as usize <= v.len()) {
        return Err(bad("a bad header"));
    }
    let ndim = ndim as usize;
    let mut shape = Vec::with_capacity(ndim);
    for &d in &v[1..1 + ndim] {
        if !(d >= 0.0 && d.fract() == 0.0 && d < 1e15) {
            return Err(bad("a bad dimension"));
        }
        shape.push(d as usize);
    }
    let ok_shape = match &want.shape {
        Some(w) => *w == shape,
        None => true,
    };
    if !ok_shape || shape.iter().product::<usize>() != v.len() - 1 - ndim {
        return Err(perr(
            stage,
            format!(
                "rank {stage} expected {} from rank {from}, but received a tensor of shape {shape:?} float32 \
                 ({} values): the two ranks run different models or were given inputs of different shapes",
                want.what,
                v.len() - 1 - ndim
            ),
        ));
    }
    let mut v = v;
    v.drain(..1 + ndim);
    Tensor::from_vec(v, &shape)
}

impl PipelineStage {
    /// This rank's stage of `split` (partition number `pg.rank()` in call order). Every rank
    /// builds the same split; the number of partitions must equal the number of ranks.
    pub fn new(split: SplitModule, pg: &ProcessGroup) -> Result<PipelineStage> {
        let stages = split.partitions.len();
        let stage = pg.rank();
        if stages != pg.world_size() {
            return Err(Error::argument(
                "pipeline",
                format!(
                    "the model is split into {stages} stages but the job has {} ranks: split it with \
                     partition_balanced(gm, {}) or run mpirun -np {stages}",
                    pg.world_size(),
                    pg.world_size()
                ),
            ));
        }
        let g = split.module.graph();
        let mut source_of: HashMap<ferrofx_fx::NodeId, Source> = HashMap::new();
        let mut n_inputs = 0usize;
        let mut stage_inputs: Vec<Vec<Source>> = vec![];
        let mut n_outputs: Vec<usize> = vec![];
        for n in g.iter() {
            match n.op() {
                Opcode::Placeholder => {
                    source_of.insert(n.id(), Source::Input(n_inputs));
                    n_inputs += 1;
                }
                Opcode::CallModule => {
                    let s = stage_inputs.len();
                    let ins = n
                        .args()
                        .iter()
                        .map(|a| {
                            a.as_node()
                                .and_then(|id| source_of.get(&id).copied())
                                .ok_or_else(|| perr(s, "an input that is not a model input or a stage output"))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    stage_inputs.push(ins);
                    let getitems: Vec<_> =
                        n.users().filter(|&u| ferrofx_fx::tracer::is_getitem(g, u)).collect::<Vec<_>>();
                    if getitems.is_empty() {
                        source_of.insert(n.id(), Source::Stage(s, 0));
                        n_outputs.push(1);
                    } else {
                        for u in &getitems {
                            let un = g.node(*u).map_err(|e| perr(s, e))?;
                            let j = match un.args().get(1) {
                                Some(Argument::Int(j)) => *j as usize,
                                _ => return Err(perr(s, "a malformed getitem")),
                            };
                            source_of.insert(*u, Source::Stage(s, j));
                        }
                        n_outputs.push(getitems.len());
                    }
                }
                _ => {}
            }
        }
        let out = g.output_node().ok_or_else(|| perr(stage, "the split module has no output"))?;
        let out_arg = g.node(out).map_err(|e| perr(stage, e))?.args().first().cloned().unwrap_or(Argument::None);
        let final_src = out_arg.as_node().and_then(|id| source_of.get(&id).copied());
        let final_output = match final_src {
            Some(Source::Stage(s, j)) if s + 1 == stages => Some(j),
            _ => {
                return Err(Error::argument(
                    "pipeline",
                    "the model must return one tensor computed by the last stage (a loss is applied to it there)",
                ))
            }
        };
        let mut consumers: Vec<Vec<usize>> = vec![vec![]; n_outputs.get(stage).copied().unwrap_or(0)];
        for (c, ins) in stage_inputs.iter().enumerate() {
            for src in ins {
                if let Source::Stage(s, j) = src {
                    if *s == stage && !consumers[*j].contains(&c) {
                        consumers[*j].push(c);
                    }
                }
            }
        }
        let name = split.partitions[stage].clone();
        let part = split.partition(&name)?;
        let expected: Vec<Option<(Vec<usize>, DType)>> = part
            .graph()
            .iter()
            .filter(|n| n.op() == Opcode::Placeholder)
            .map(|n| n.meta().tensor_meta.as_ref().map(|m| (m.shape.clone(), m.dtype)))
            .collect();
        for (k, src) in stage_inputs[stage].iter().enumerate() {
            if let Source::Stage(s, _) = src {
                if expected.get(k).and_then(|e| e.as_ref()).is_none() {
                    return Err(perr(
                        stage,
                        format!(
                            "input {k} (from stage {s}) has no propagated shape: run ShapeProp::propagate on the \
                             model before split_module, so that each stage knows what it receives"
                        ),
                    ));
                }
            }
        }
        let meta_batch = g
            .iter()
            .find(|n| n.op() == Opcode::Placeholder)
            .and_then(|n| n.meta().tensor_meta.as_ref().and_then(|m| m.shape.first().copied()));
        Ok(PipelineStage {
            stage,
            stages,
            split,
            name,
            inputs: stage_inputs[stage].clone(),
            consumers,
            final_output: if stage + 1 == stages { final_output } else { None },
            expected,
            meta_batch,
        })
    }

    /// The stage's module (its parameters are this rank's share of the model).
    pub fn module(&self) -> Result<&GraphModule> {
        self.split.partition(&self.name)
    }

    /// The split this stage belongs to (its `qualname_map` names the stage's state as in the
    /// original model).
    pub fn split(&self) -> &SplitModule {
        &self.split
    }

    /// This stage's parameters under their names in the original model.
    pub fn named_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self
            .module()?
            .named_parameters()
            .into_iter()
            .map(|(local, t)| (original_name(&self.split, &self.name, &local), t))
            .collect())
    }

    /// This stage's state dict (parameters and buffers) under the names of the original model:
    /// its shard of a checkpoint ([`crate::shards`]).
    pub fn state_dict(&self) -> Result<ferrofx_nn::StateDict> {
        partition_state_dict(&self.split, self.stage)
    }

    /// What input `k` (output `j` of stage `s`) of micro-batch `m` must look like: the
    /// propagated shape with its batch dimension scaled to the micro-batch.
    fn expect_input(&self, k: usize, s: usize, j: usize, micro_rows: Option<usize>, m: usize) -> Result<Expect> {
        let Some(Some((shape, dtype))) = self.expected.get(k) else {
            return Err(perr(self.stage, format!("input {k} has no propagated shape")));
        };
        if *dtype != DType::F32 {
            return Err(perr(
                self.stage,
                format!(
                    "input {k} (output {j} of stage {s}, rank {s}) is {dtype} in the split graph, but pipeline \
                     messages carry float32 tensors"
                ),
            ));
        }
        let mut want = shape.clone();
        let scaled = match (self.meta_batch, micro_rows, want.first_mut()) {
            (Some(b), Some(r), Some(d0)) if *d0 == b => {
                *d0 = r;
                true
            }
            (Some(b), Some(r), _) => b == r,
            _ => false,
        };
        let what = format!("output {j} of stage {s} for micro-batch {m}, of shape {want:?} float32");
        if scaled {
            return Ok(Expect::exact(&want, what));
        }
        // not batch-major: bound the size by the propagated one, scaled up to the micro-batch
        let numel: usize = shape.iter().product();
        let factor = match (self.meta_batch, micro_rows) {
            (Some(b), Some(r)) if b > 0 => r.div_ceil(b),
            _ => 1,
        };
        Ok(Expect { shape: None, max_len: 1 + shape.len() + numel.saturating_mul(factor.max(1)), what })
    }

    fn forward(
        &self,
        pg: &ProcessGroup,
        inputs: &[Tensor],
        m: usize,
        micro: usize,
        loss_fn: &dyn Fn(&Tensor, usize) -> Result<Tensor>,
    ) -> Result<InFlight> {
        let mut received = vec![];
        let mut vals = Vec::with_capacity(self.inputs.len());
        // rows per micro-batch (model input 0's), to scale the propagated shapes
        let micro_rows = inputs.first().and_then(|x| x.shape().first().copied()).map(|n| n / micro.max(1));
        for (k, src) in self.inputs.iter().enumerate() {
            match *src {
                Source::Input(i) => {
                    let x = inputs.get(i).ok_or_else(|| perr(self.stage, format!("model input {i} was not given")))?;
                    let n = x.shape().first().copied().unwrap_or(0);
                    if n % micro != 0 {
                        return Err(perr(
                            self.stage,
                            format!("a batch of {n} rows does not split into {micro} equal micro-batches"),
                        ));
                    }
                    let rows = n / micro;
                    vals.push(Value::Tensor(x.narrow(0, (m * rows) as i64, rows as i64)?.contiguous()?));
                }
                Source::Stage(s, j) => {
                    let want = self.expect_input(k, s, j, micro_rows, m)?;
                    let msg = pg.recv(s, TAG_ACT, want.max_len).map_err(|e| {
                        perr(self.stage, format!("{e} (rank {} expected {} from rank {s})", self.stage, want.what))
                    })?;
                    let t = decode(msg, self.stage, s, &want)?.requires_grad_(true)?;
                    vals.push(Value::Tensor(t.clone()));
                    received.push((s, j, t));
                }
            }
        }
        let outs = self.module()?.forward_values(&vals)?;
        let outputs: Vec<Tensor> = outs
            .into_iter()
            .map(|v| v.as_tensor().cloned().ok_or_else(|| perr(self.stage, "a stage output is not a tensor")))
            .collect::<Result<_>>()?;
        for (j, cons) in self.consumers.iter().enumerate() {
            for &c in cons {
                pg.send(c, TAG_ACT, encode(&outputs[j].detach())?)?;
            }
        }
        let loss = match self.final_output {
            Some(j) => Some(loss_fn(&outputs[j], m)?.div(micro as f64)?),
            None => None,
        };
        Ok(InFlight { received, outputs, loss })
    }

    fn backward(&self, pg: &ProcessGroup, f: InFlight) -> Result<()> {
        let mut tensors = vec![];
        let mut grads = vec![];
        if let Some(l) = &f.loss {
            tensors.push(l.clone());
            grads.push(None);
        }
        for (j, cons) in self.consumers.iter().enumerate() {
            let mut total: Option<Tensor> = None;
            let out_shape = f.outputs[j].shape().to_vec();
            for &c in cons {
                let want = Expect::exact(
                    &out_shape,
                    format!("the gradient of stage {}'s output {j}, of shape {out_shape:?} float32", self.stage),
                );
                let msg = pg.recv(c, TAG_GRAD, want.max_len).map_err(|e| {
                    perr(self.stage, format!("{e} (rank {} expected {} from rank {c})", self.stage, want.what))
                })?;
                let g = decode(msg, self.stage, c, &want)?;
                total = Some(match total {
                    None => g,
                    Some(t) => t.add(&g)?,
                });
            }
            if let Some(g) = total {
                if f.outputs[j].requires_grad() {
                    tensors.push(f.outputs[j].clone());
                    grads.push(Some(g));
                }
            }
        }
        if !tensors.is_empty() {
            ferrofx_core::autograd::backward(&tensors, &grads, false, false)?;
        }
        for (s, _j, t) in &f.received {
            let g = match t.grad() {
                Some(g) => g,
                None => ferrofx_core::ops::kernel::zeros(t.shape(), t.dtype())?,
            };
            pg.send(*s, TAG_GRAD, encode(&g)?)?;
        }
        Ok(())
    }

    /// One training step's forward and backward over `micro_batches` slices of `inputs` (the
    /// whole global batch, on every rank), with `loss_fn(output, micro_batch_index)` applied on
    /// the last stage. Gradients accumulate into the stage's parameters (zero them before);
    /// returns the step's loss (the mean over micro-batches) on the last stage, `None`
    /// elsewhere.
    pub fn step(
        &self,
        pg: &ProcessGroup,
        inputs: &[Tensor],
        micro_batches: usize,
        schedule: Schedule,
        loss_fn: &dyn Fn(&Tensor, usize) -> Result<Tensor>,
    ) -> Result<Option<f64>> {
        if micro_batches == 0 {
            return Err(perr(self.stage, "at least one micro-batch is needed"));
        }
        let mut total = 0.0f64;
        let mut in_flight: std::collections::VecDeque<InFlight> = Default::default();
        let mut add_loss = |f: &InFlight| -> Result<()> {
            if let Some(l) = &f.loss {
                total += l.item()?;
            }
            Ok(())
        };
        match schedule {
            Schedule::GPipe => {
                for m in 0..micro_batches {
                    let f = self.forward(pg, inputs, m, micro_batches, loss_fn)?;
                    add_loss(&f)?;
                    in_flight.push_back(f);
                }
                while let Some(f) = in_flight.pop_front() {
                    self.backward(pg, f)?;
                }
            }
            Schedule::OneFOneB => {
                let warmup = (self.stages - self.stage - 1).min(micro_batches);
                let mut next = 0usize;
                for _ in 0..warmup {
                    let f = self.forward(pg, inputs, next, micro_batches, loss_fn)?;
                    add_loss(&f)?;
                    in_flight.push_back(f);
                    next += 1;
                }
                while next < micro_batches {
                    let f = self.forward(pg, inputs, next, micro_batches, loss_fn)?;
                    add_loss(&f)?;
                    in_flight.push_back(f);
                    next += 1;
                    if let Some(f) = in_flight.pop_front() {
                        self.backward(pg, f)?;
                    }
                }
                while let Some(f) = in_flight.pop_front() {
                    self.backward(pg, f)?;
                }
            }
        }
        Ok(self.final_output.map(|_| total))
    }
}

/// The name in the original model of `local`, a parameter or buffer of partition `part`:
/// `layer1_0_conv1.weight` → module `layer1_0_conv1` → `layer1.0.conv1.weight` (through the
/// split's `qualname_map`).
fn original_name(split: &SplitModule, part: &str, local: &str) -> String {
    let (head, tail) = match local.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (local, None),
    };
    let orig = split.qualname_map.get(&format!("{part}.{head}")).map(String::as_str).unwrap_or(head);
    match tail {
        Some(t) => format!("{orig}.{t}"),
        None => orig.to_string(),
    }
}

/// The state dict (parameters and buffers) of partition `index` of `split` under the names of
/// the original model.
pub fn partition_state_dict(split: &SplitModule, index: usize) -> Result<ferrofx_nn::StateDict> {
    let name = split.partitions.get(index).ok_or_else(|| {
        Error::argument(
            "pipeline",
            format!("partition {index} does not exist: the split has {} partitions", split.partitions.len()),
        )
    })?;
    Ok(split
        .partition(name)?
        .state_dict()
        .into_iter()
        .map(|(local, t)| (original_name(split, name, &local), t))
        .collect())
}

/// Which rank writes each tensor of a pipeline's checkpoint ([`crate::shards::save_sharded`]):
/// the rank of the first stage that holds it (a tensor that several stages share is written
/// once). Every rank computes the same map from its copy of the split.
pub fn stage_owners(split: &SplitModule) -> Result<crate::shards::Owners> {
    let mut owners = crate::shards::Owners::new();
    for r in 0..split.partitions.len() {
        for name in partition_state_dict(split, r)?.into_keys() {
            owners.entry(name).or_insert(r);
        }
    }
    Ok(owners)
}
