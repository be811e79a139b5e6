//! Training as a graph: joint forward+backward capture, partitions, memory budget (issue 21).

use ferrofx_compile::training::{
    capture_joint, checkpoint_modules, default_partition, min_cut_rematerialization_partition, GradTarget, JointGraph,
    MemoryBudget, ModuleSelector, Partition, PartitionOptions,
};
use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Result, Tensor, Value};
use ferrofx_fx::graph::Opcode;
use ferrofx_nn::zoo::{catalogue, ZooModel};

/// The tests draw from the global generator (`manual_seed`): one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The loss of the tests: `sum(out * w)` with a fixed random `w` (every output element gets a
/// different gradient).
fn loss_of(w: Tensor) -> impl Fn(&[Value], &[Value]) -> Result<Tensor> {
    move |out, _| out[0].as_tensor().expect("tensor output").mul(&w)?.sum()
}

/// The zoo (seed 0) in training mode, with each model's loss weight and differentiable inputs.
fn zoo() -> Vec<(ZooModel, Tensor, Vec<usize>)> {
    manual_seed(0);
    let mut out = vec![];
    for mut z in catalogue().unwrap() {
        z.model.train(true);
        let y = {
            let _g = ferrofx_core::autograd::no_grad();
            z.model.eval();
            let y = z.model.forward(&z.input).unwrap();
            z.model.train(true);
            y
        };
        let shape: Vec<i64> = y.shape().iter().map(|&d| d as i64).collect();
        let w = randn(&shape, None).unwrap();
        let grad_inputs = if z.input.dtype().is_floating_point() { vec![0] } else { vec![] };
        out.push((z, w, grad_inputs));
    }
    out
}

struct Eager {
    loss: f32,
    grads: Vec<Option<Tensor>>,
    buffers: Vec<(String, Tensor)>,
}

/// Eager autograd on a fresh copy of zoo model `k` (same seed, same generator state).
fn eager(k: usize, seed: u64) -> Eager {
    let (z, w, grad_inputs) = zoo().remove(k);
    let x = if grad_inputs.is_empty() { z.input.clone() } else { z.input.detach().requires_grad_(true).unwrap() };
    manual_seed(seed);
    let y = z.model.forward(&x).unwrap();
    let loss = y.mul(&w).unwrap().sum().unwrap();
    loss.backward(None, false, false).unwrap();
    let mut grads: Vec<Option<Tensor>> =
        z.model.named_parameters().into_iter().filter(|(_, p)| p.requires_grad()).map(|(_, p)| p.grad()).collect();
    if !grad_inputs.is_empty() {
        grads.push(x.grad());
    }
    let buffers = z.model.named_buffers().into_iter().map(|(n, b)| (n, b.detach().clone_tensor().unwrap())).collect();
    Eager { loss: loss.item().unwrap() as f32, grads, buffers }
}

fn max_rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_vec::<f32>().unwrap();
    let b = b.to_vec::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-30);
    a.iter().zip(&b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / scale
}

fn assert_grads_match(what: &str, targets: &[GradTarget], got: &[Option<Tensor>], want: &[Option<Tensor>]) {
    assert_eq!(got.len(), want.len(), "{what}: gradient count");
    for ((t, g), w) in targets.iter().zip(got).zip(want) {
        match (g, w) {
            (Some(g), Some(w)) => {
                assert_eq!(g.shape(), w.shape(), "{what}: gradient of {t}");
                let e = max_rel_err(g, w);
                assert!(e <= 1e-6, "{what}: gradient of {t} differs from eager autograd by {e:e} (relative)");
            }
            (None, None) => {}
            (g, w) => panic!("{what}: gradient of {t}: graph {:?}, eager {:?}", g.is_some(), w.is_some()),
        }
    }
}

/// Captures zoo model `k`; returns the joint graph, the example input and the eager reference.
fn joint_of(k: usize) -> (ZooModel, JointGraph) {
    let (z, w, grad_inputs) = zoo().remove(k);
    let joint = capture_joint(z.model.as_ref(), &[z.input.clone().into()], &loss_of(w), &grad_inputs).unwrap();
    (z, joint)
}

/// Runs `make(joint)`'s partition on a fresh copy of model `k` and checks gradients, loss and
/// buffers (BatchNorm running statistics, `num_batches_tracked`) against eager.
fn check_against_eager(k: usize, what: &str, make: &dyn Fn(&JointGraph) -> Partition) -> Partition {
    let seed = 1234 + k as u64;
    let want = eager(k, seed);
    let (z, joint) = joint_of(k);
    let p = make(&joint);
    manual_seed(seed);
    let (outs, grads) = p.run(&[z.input.clone().into()]).unwrap();
    let what = format!("{} ({what})", z.name);
    let loss = outs[0].as_tensor().unwrap().item().unwrap() as f32;
    assert!((loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0), "{what}: loss {loss} vs eager {}", want.loss);
    assert_grads_match(&what, &p.grad_targets, &grads, &want.grads);
    for ((n, b), (n2, e)) in z.model.named_buffers().iter().zip(&want.buffers) {
        assert_eq!(n, n2);
        if b.dtype().is_floating_point() {
            assert!(max_rel_err(b, e) <= 1e-6, "{what}: buffer {n} after the step differs from eager");
        } else {
            assert_eq!(b.to_vec::<i64>().unwrap(), e.to_vec::<i64>().unwrap(), "{what}: buffer {n}");
        }
    }
    p
}

const NAMES: [&str; 6] = ["mlp", "digits_cnn", "resnet18", "resnet50", "mobilenet_v2", "transformer"];

#[test]
fn joint_graph_equals_eager_gradients_on_every_zoo_model() {
    let _serial = serial();
    for (k, name) in NAMES.iter().enumerate() {
        let seed = 99 + k as u64;
        let want = eager(k, seed);
        let (z, joint) = joint_of(k);
        assert_eq!(z.name, *name);
        // the backward's ops are real nodes of the one graph
        let g = joint.gm.graph();
        let calls = g.iter().filter(|n| matches!(n.op(), Opcode::CallFunction | Opcode::CallMethod)).count();
        assert!(calls > 0 && g.iter().all(|n| n.op() != Opcode::CallModule), "{name}: every module traced through");
        manual_seed(seed);
        let (_, grads) = joint.run(&[z.input.clone().into()]).unwrap();
        assert_grads_match(&format!("{name} (joint graph)"), &joint.grad_targets, &grads, &want.grads);
    }
}

#[test]
fn default_partition_equals_eager_with_batchnorm_and_dropout_on_every_zoo_model() {
    let _serial = serial();
    for k in 0..NAMES.len() {
        let p = check_against_eager(k, "default partition", &|j| default_partition(j).unwrap());
        assert!(p.recomputed.is_empty(), "the default partition recomputes nothing");
    }
}

/// The compiled training step: each half of the default partition through `compile` (fusion,
/// convolution epilogues, pre-bound plan arguments; no inference passes) gives eager autograd's
/// loss and gradients on every zoo model, on two calls (the second hits the specialisation
/// cache). BatchNorm normalises with the batch statistics and dropout's masks come from the
/// seed, so the running statistics the compile-time runs moved do not enter the step (the
/// buffers are checked on the uncompiled partitions above).
#[test]
fn compiled_partition_halves_equal_eager_gradients_on_every_zoo_model() {
    use ferrofx_compile::{compile, CompileOptions};
    let _serial = serial();
    for (k, name) in NAMES.iter().enumerate() {
        let seed = 4321 + k as u64;
        let want = eager(k, seed);
        let (z, joint) = joint_of(k);
        let p = default_partition(&joint).unwrap();
        let opts = CompileOptions { inference_passes: false, ..Default::default() };
        let x: Vec<Value> = vec![z.input.clone().into()];
        let _g = ferrofx_core::autograd::no_grad();
        let forward = compile(&p.forward, &x, opts.clone()).unwrap();
        let mut example = forward.forward_values(&x).unwrap().split_off(p.num_forward_outputs);
        example.push(Value::Tensor(Tensor::scalar(1.0f32)));
        let backward = compile(&p.backward, &example, opts).unwrap();
        drop(example);
        if *name == "resnet18" {
            // the fusions only a training graph allows: every batch norm → [add] → relu chain
            // but the three whose add is taken by the downsample's batch norm (its in-place
            // running statistics lie between), the inner relu of each block's backward masked
            // inside the batch-norm backward (the block outputs' masked gradients also feed the
            // identity path and stay materialised), the stem's inside the max-pool backward
            let count = |m: &ferrofx_compile::CompiledModule, f: &dyn Fn(&ferrofx_fx::Node<'_>) -> bool| {
                m.latest().unwrap().module.graph().iter().filter(|n| f(n)).count()
            };
            let target = |n: &ferrofx_fx::Node<'_>, t: &str| n.target().name() == t;
            assert_eq!(count(&forward, &|n| target(n, "batch_norm_fused")), 17, "{name}: fused batch norms");
            assert_eq!(count(&forward, &|n| target(n, "batch_norm")), 3, "{name}: plain batch norms");
            let masked_bn = |n: &ferrofx_fx::Node<'_>| {
                target(n, "batch_norm_backward") && n.args().get(7).is_some_and(|a| a.as_node().is_some())
            };
            assert_eq!(count(&backward, &masked_bn), 8, "{name}: batch-norm backwards with the relu mask");
            let masked_pool = |n: &ferrofx_fx::Node<'_>| {
                target(n, "max_pool2d_backward") && matches!(n.args().get(7), Some(ferrofx_fx::Argument::Bool(true)))
            };
            assert_eq!(count(&backward, &masked_pool), 1, "{name}: the stem's max-pool backward with the relu mask");
        }
        for call in 0..2 {
            manual_seed(seed);
            let mut outs = forward.forward_values(&x).unwrap();
            let loss = outs[0].as_tensor().unwrap().item().unwrap() as f32;
            let mut saved = outs.split_off(p.num_forward_outputs);
            drop(outs);
            saved.push(Value::Tensor(Tensor::scalar(1.0f32)));
            let grads: Vec<Option<Tensor>> =
                backward.forward_values(&saved).unwrap().into_iter().map(|v| v.as_tensor().cloned()).collect();
            let what = format!("{name} (compiled step, call {call})");
            assert!(
                (loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
                "{what}: loss {loss} vs eager {}",
                want.loss
            );
            assert_grads_match(&what, &p.grad_targets, &grads, &want.grads);
        }
        assert_eq!(
            (forward.cache_stats().misses, backward.cache_stats().misses),
            (1, 1),
            "{name}: one compilation each"
        );
    }
}

#[test]
fn partition_outputs_are_the_forward_outputs_then_the_saved_values() {
    let _serial = serial();
    let (z, joint) = joint_of(0);
    let p = default_partition(&joint).unwrap();
    assert_eq!(p.num_forward_outputs, 2, "loss and the model output");
    let fg = p.forward.graph();
    let fout = fg.node(fg.output_node().unwrap()).unwrap();
    let items = match &fout.args()[0] {
        ferrofx_fx::Argument::Tuple(t) => t.to_vec(),
        other => panic!("forward returns a tuple, got {other:?}"),
    };
    assert_eq!(items.len(), 2 + p.saved.len());
    let names: Vec<String> =
        items[2..].iter().map(|a| fg.node(a.as_node().unwrap()).unwrap().name().to_string()).collect();
    assert_eq!(names, p.saved.iter().map(|s| s.name.clone()).collect::<Vec<_>>());
    // the MLP's backward reads the input (first layer's weight gradient) and what each layer saved
    assert!(names.contains(&"x".to_string()), "saved: {names:?}");
    let bg = p.backward.graph();
    let bph: Vec<String> = bg.iter().filter(|n| n.op() == Opcode::Placeholder).map(|n| n.name().to_string()).collect();
    let mut want = names.clone();
    want.push("tangent".into());
    assert_eq!(bph, want, "backward inputs: saved values, then the loss gradient");
    assert!(
        bg.iter().all(|n| n.op() != Opcode::CallFunction || !n.target().name().starts_with("dropout")),
        "no random op in the backward"
    );
    let bout = bg.node(bg.output_node().unwrap()).unwrap();
    match &bout.args()[0] {
        ferrofx_fx::Argument::Tuple(t) => assert_eq!(t.len(), p.grad_targets.len()),
        other => panic!("backward returns a tuple, got {other:?}"),
    }
    assert_eq!(p.grad_targets.last(), Some(&GradTarget::Input(0)));
    let bytes: u64 = p.saved.iter().map(|s| s.bytes).sum();
    assert_eq!(bytes, p.report.saved_bytes);
    // forward outputs equal the model's
    let (outs, saved) = p.run_forward(&[z.input.clone().into()]).unwrap();
    assert_eq!(saved.len(), p.saved.len());
    for (v, s) in saved.iter().zip(&p.saved) {
        assert_eq!(v.as_tensor().unwrap().shape(), s.shape.as_slice(), "saved {}", s.name);
    }
    assert_eq!(outs.len(), 2);
}

#[test]
fn min_cut_partition_recomputes_cheap_ops_saves_less_and_keeps_gradients() {
    let _serial = serial();
    for (k, name) in NAMES.iter().enumerate() {
        let default_bytes = {
            let (_, joint) = joint_of(k);
            default_partition(&joint).unwrap().report.saved_bytes
        };
        let p = check_against_eager(k, "min-cut", &|j| {
            min_cut_rematerialization_partition(j, &PartitionOptions::default()).unwrap()
        });
        assert!(p.report.saved_bytes <= default_bytes, "{name}: min-cut saves no more than default");
        // never a matmul or convolution recomputed unless asked
        for n in p.backward.graph().iter() {
            if p.recomputed.iter().any(|r| r == n.name()) {
                let t = n.target().name();
                assert!(!["conv2d", "linear", "matmul", "mm", "addmm", "bmm"].contains(&t), "{name}: recomputed {t}");
            }
        }
    }
}

#[test]
fn memory_budget_is_respected_on_every_zoo_model_and_unreachable_budgets_name_the_smallest() {
    let _serial = serial();
    for (k, &name) in NAMES.iter().enumerate() {
        let (_, joint) = joint_of(k);
        let default = default_partition(&joint).unwrap().report.saved_bytes;
        let smallest =
            min_cut_rematerialization_partition(&joint, &PartitionOptions::default()).unwrap().report.saved_bytes;
        assert!(smallest <= default, "{name}");
        // a budget halfway between the smallest and the default footprint
        let limit = smallest + (default - smallest) / 2;
        let opts = PartitionOptions { memory_budget: Some(MemoryBudget::Bytes(limit)), ..Default::default() };
        let p = check_against_eager(k, "budget", &|j| min_cut_rematerialization_partition(j, &opts).unwrap());
        assert!(p.report.saved_bytes <= limit, "{name}: saved {} B over the budget {limit} B", p.report.saved_bytes);
        // recomputation only when the budget requires it
        if default <= limit {
            assert!(p.recomputed.is_empty());
        }
        // fraction 0.5 of the default: met, or an error naming the smallest achievable figure
        let half = PartitionOptions { memory_budget: Some(MemoryBudget::Fraction(0.5)), ..Default::default() };
        match min_cut_rematerialization_partition(&joint, &half) {
            Ok(p) => assert!(p.report.saved_bytes as f64 <= 0.5 * default as f64, "{name}"),
            Err(e) => {
                assert!(smallest as f64 > 0.5 * default as f64, "{name}: {e}");
                assert!(e.to_string().contains(&format!("smallest achievable saved memory is {smallest} B")), "{e}");
            }
        }
        if smallest > 0 {
            let below =
                PartitionOptions { memory_budget: Some(MemoryBudget::Bytes(smallest - 1)), ..Default::default() };
            let e = min_cut_rematerialization_partition(&joint, &below).err().expect("budget below the smallest");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{smallest} B")) && msg.contains("cannot be met"), "{name}: {msg}");
        }
        let bad = PartitionOptions { memory_budget: Some(MemoryBudget::Fraction(1.5)), ..Default::default() };
        assert!(min_cut_rematerialization_partition(&joint, &bad).err().unwrap().to_string().contains("0.0..=1.0"));
    }
}

#[test]
fn report_counts_recomputation_in_flops_and_time() {
    let _serial = serial();
    let (_, joint) = joint_of(2);
    let d = default_partition(&joint).unwrap();
    let m = min_cut_rematerialization_partition(&joint, &PartitionOptions::default()).unwrap();
    assert_eq!(d.report.recomputed_flops, 0);
    assert!(m.report.recomputed_flops > 0 && !m.recomputed.is_empty());
    assert!(m.report.backward_flops >= d.report.backward_flops);
    assert!(m.report.estimated_step_seconds > d.report.estimated_step_seconds);
    assert!(m.report.to_string().contains("recomputed"));
}

#[test]
fn checkpoint_pass_recomputes_selected_submodules_by_name_and_type() {
    let _serial = serial();
    // ResNet-18: every BasicBlock recomputed (convolutions included), only block inputs saved
    let by_type = check_against_eager(2, "checkpoint BasicBlock", &|j| {
        checkpoint_modules(j, &[ModuleSelector::Type("BasicBlock".into())]).unwrap()
    });
    let (_, joint) = joint_of(2);
    let default = default_partition(&joint).unwrap();
    assert!(
        by_type.report.saved_bytes < default.report.saved_bytes / 2,
        "{} vs {}",
        by_type.report.saved_bytes,
        default.report.saved_bytes
    );
    assert!(
        by_type.recomputed.iter().any(|n| n.starts_with("conv2d")),
        "convolutions inside the region are recomputed"
    );
    let by_path = check_against_eager(2, "checkpoint layer1", &|j| {
        checkpoint_modules(j, &[ModuleSelector::Path("layer1".into())]).unwrap()
    });
    assert!(by_path.report.saved_bytes < default.report.saved_bytes);
    assert!(by_path.report.saved_bytes > by_type.report.saved_bytes);
    let e = checkpoint_modules(&joint, &[ModuleSelector::Path("nope".into())]).err().unwrap().to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn capture_errors_name_the_problem() {
    let _serial = serial();
    let (z, w, _) = zoo().remove(0);
    let e = capture_joint(
        z.model.as_ref(),
        &[z.input.clone().into()],
        &|out, _| Ok(out[0].as_tensor().unwrap().clone()),
        &[],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("scalar") && e.contains("[4, 10]"), "{e}");
    let e = capture_joint(z.model.as_ref(), &[z.input.clone().into()], &loss_of(w), &[3]).err().unwrap().to_string();
    assert!(e.contains("input 3"), "{e}");
}

#[test]
fn digits_job_trains_through_the_graphs_and_the_budget_lowers_peak_activation_memory() {
    use ferrofx_compile::training::digits::{train_digits_graph, Partitioner};
    use ferrofx_core::memory::tracking::Category;
    use ferrofx_nn::train::{train_digits, TrainConfig};
    let _serial = serial();
    let cfg = TrainConfig { epochs: 2, progress: false, ..Default::default() };
    let eager = train_digits(&cfg).unwrap();
    let free = train_digits_graph(&cfg, Partitioner::Default).unwrap();
    // the default partition runs the kernels eager autograd runs: the same training
    for (a, b) in free.report.epochs.iter().zip(&eager.epochs) {
        assert_eq!(a.train_loss, b.train_loss, "epoch {}", a.epoch);
    }
    assert_eq!(free.report.test_accuracy, eager.test_accuracy);
    let half = train_digits_graph(&cfg, Partitioner::Budget(MemoryBudget::Fraction(0.5))).unwrap();
    assert!(half.partition.saved_bytes as f64 <= 0.5 * free.partition.saved_bytes as f64);
    assert!(!half.recomputed.is_empty());
    let (peak, peak_free) =
        (half.report.memory.peak(Category::Activation), free.report.memory.peak(Category::Activation));
    println!(
        "digits CNN peak activation memory: budget 0.5 {peak} B, default partition {peak_free} B, eager {} B",
        eager.memory.peak(Category::Activation)
    );
    assert!(peak < peak_free, "{peak} vs {peak_free}");
    assert!(half.report.test_accuracy >= 0.9, "{}", half.report.test_accuracy);
}
