//! Acceptance 1 (accuracy part): the digits CNN reaches >= 97% test accuracy with the default
//! configuration. The time limit (< 60 s on 2 cores) is measured with the example
//! (`cargo run -p ferrofx-nn --release --example train_digits`), not asserted here.

use ferrofx_nn::train::{train_digits, TrainConfig};

#[test]
fn digits_cnn_reaches_97_percent() {
    let cfg = TrainConfig { progress: false, ..TrainConfig::default() };
    match train_digits(&cfg) {
        Ok(r) => {
            assert_eq!(r.epochs.len(), cfg.epochs);
            assert!(r.test_accuracy >= 0.97, "test accuracy {}", r.test_accuracy);
            assert!(r.epochs.last().unwrap().train_loss < r.epochs[0].train_loss);
            // memory tracking: parameters, Adam's two moments per parameter, activations
            let param_bytes: usize = ferrofx_nn::Module::parameters(&r.model).iter().map(|p| p.numel() * 4).sum();
            assert!(r.memory.live(ferrofx_core::memory::tracking::Category::Parameter) >= param_bytes, "{}", r.memory);
            assert!(
                r.memory.peak(ferrofx_core::memory::tracking::Category::OptimizerState) >= 2 * param_bytes,
                "{}",
                r.memory
            );
            assert!(r.memory.peak(ferrofx_core::memory::tracking::Category::Activation) > 0, "{}", r.memory);
            eprintln!("digits CNN training: {}", r.memory);
            // training is deterministic for a seed
            let again = train_digits(&TrainConfig { epochs: 1, ..cfg.clone() }).unwrap();
            let again2 = train_digits(&TrainConfig { epochs: 1, ..cfg }).unwrap();
            assert_eq!(again.epochs[0].train_loss, again2.epochs[0].train_loss);
        }
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Issue 21: memory tracking, saved-tensor hooks, activation checkpointing (eager).
// PyTorch 2.15 figures quoted below come from `scripts/checkpoint_reference.py`.

use ferrofx_core::autograd::{
    checkpoint, checkpoint_sequential, checkpoint_with, saved_tensors_hooks, CheckpointOptions, Packed, SequentialFn,
    SECOND_BACKWARD_MSG,
};
use ferrofx_core::memory::tracking::{category_scope, Category, MemoryTracker};
use ferrofx_core::ops::random::{dropout, with_generator, Generator};
use ferrofx_core::Tensor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn leaf(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap().requires_grad_(true).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// `exp(sin(t) * t)`, counting its calls.
fn counted(calls: Arc<AtomicUsize>) -> impl Fn(&[Tensor]) -> ferrofx_core::Result<Vec<Tensor>> + Send + Sync {
    move |xs: &[Tensor]| {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(vec![xs[0].sin()?.mul(&xs[0])?.exp()?])
    }
}

#[test]
fn memory_tracking_counts_by_category_and_views_are_free() {
    let tracker = MemoryTracker::start();
    let w = {
        let _m = category_scope(Category::Parameter);
        Tensor::from_vec(vec![1.0f32; 1000], &[10, 100]).unwrap().requires_grad_(true).unwrap()
    };
    let loss = {
        let _m = category_scope(Category::Activation);
        let h = w.mul(&w).unwrap(); // 4000 B (MulBackward0 saves w twice: no new buffer)
        let v = h.reshape(&[100, 10]).unwrap(); // a view: no new buffer
        v.exp().unwrap().sum().unwrap() // exp's output (saved by ExpBackward0) + the scalar
    };
    let s = tracker.stats();
    assert_eq!(s.live(Category::Parameter), 4000);
    assert_eq!(s.live(Category::Activation), 4000 + 4);
    assert_eq!(s.peak(Category::Activation), 4000 + 4000 + 4);
    loss.backward(None, false, false).unwrap();
    let s = tracker.stats();
    assert_eq!(s.live(Category::Gradient), 4000, "w.grad lives on, the rest of backward is freed");
    assert_eq!(s.live(Category::Activation), 4, "only the loss is still alive: the saved exp output is freed");
    drop(loss);
    assert_eq!(tracker.stats().live(Category::Activation), 0);
    assert!(tracker.stats().to_string().starts_with("peak "));
}

#[test]
fn saved_tensors_hooks_pack_every_saved_tensor_and_free_it_after_backward() {
    let x = leaf(&[1.0, 2.0, 3.0]);
    let packs = Arc::new(AtomicUsize::new(0));
    let unpacks = Arc::new(AtomicUsize::new(0));
    let alive = Arc::new(());
    let (y, w) = {
        let (p, u, a) = (packs.clone(), unpacks.clone(), Arc::downgrade(&alive));
        let _h = saved_tensors_hooks(
            move |t| {
                p.fetch_add(1, Ordering::SeqCst);
                Box::new((t.clone(), a.upgrade().unwrap())) as Packed
            },
            move |p| {
                u.fetch_add(1, Ordering::SeqCst);
                Ok(p.downcast_ref::<(Tensor, Arc<()>)>().unwrap().0.clone())
            },
        );
        let z = x.mul(&x).unwrap(); // saves x twice
        (z.exp().unwrap(), z.sin().unwrap()) // saves exp's output, sin's input
    };
    // PyTorch 2.15 packs 4 tensors for the same code.
    assert_eq!(packs.load(Ordering::SeqCst), 4);
    // not active any more
    let _ = x.mul(&x).unwrap();
    assert_eq!(packs.load(Ordering::SeqCst), 4);
    y.add(&w).unwrap().sum().unwrap().backward(None, false, false).unwrap();
    assert_eq!(unpacks.load(Ordering::SeqCst), 4);
    let want: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|&v| 2.0 * v * ((v * v).exp() + (v * v).cos())).collect();
    assert!(close(&vals(&x.grad().unwrap()), &want, 1e-5));
    assert_eq!(Arc::strong_count(&alive), 1, "what the pack hook returned is freed by backward");
    let e = y.sum().unwrap().backward(None, false, false).unwrap_err();
    assert_eq!(e.message(), SECOND_BACKWARD_MSG);
}

#[test]
fn nested_saved_tensors_hooks_the_innermost_wins() {
    let x = leaf(&[2.0]);
    let outer = Arc::new(AtomicUsize::new(0));
    let inner = Arc::new(AtomicUsize::new(0));
    let hooks = |n: Arc<AtomicUsize>| {
        saved_tensors_hooks(
            move |t| {
                n.fetch_add(1, Ordering::SeqCst);
                Box::new(t.clone()) as Packed
            },
            |p| Ok(p.downcast_ref::<Tensor>().unwrap().clone()),
        )
    };
    let _o = hooks(outer.clone());
    let y = {
        let _i = hooks(inner.clone());
        x.exp().unwrap()
    };
    let z = y.sin().unwrap();
    assert_eq!((outer.load(Ordering::SeqCst), inner.load(Ordering::SeqCst)), (1, 1));
    z.backward(None, false, false).unwrap();
    let want = 2f32.exp().cos() * 2f32.exp();
    assert!(close(&vals(&x.grad().unwrap()), &[want], 1e-6));
}

#[test]
fn checkpoint_gradients_match_pytorch_and_recompute_once_per_backward() {
    // PyTorch 2.15: checkpoint(lambda t: (t.sin() * t).exp(), x, use_reentrant=False) on
    // x = [1, 2, 3]: x.grad = [3.2054, 0.4746, -4.3199]; with retain_graph twice, doubled; the
    // function runs 3 times (forward + one recomputation per backward).
    let x = leaf(&[1.0, 2.0, 3.0]);
    let calls = Arc::new(AtomicUsize::new(0));
    let y = checkpoint(counted(calls.clone()), std::slice::from_ref(&x)).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    y[0].sum().unwrap().backward(None, true, false).unwrap();
    assert!(close(&vals(&x.grad().unwrap()), &[3.2054, 0.4746, -4.3199], 1e-4), "{:?}", vals(&x.grad().unwrap()));
    y[0].sum().unwrap().backward(None, false, false).unwrap();
    assert!(close(&vals(&x.grad().unwrap()), &[6.4108, 0.9492, -8.6398], 1e-4));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // without retain_graph the placeholders are gone: PyTorch's message
    let e = y[0].sum().unwrap().backward(None, false, false).unwrap_err();
    assert_eq!(e.message(), SECOND_BACKWARD_MSG);

    // bit-equal to the same computation without checkpoint
    let x2 = leaf(&[1.0, 2.0, 3.0]);
    x2.sin().unwrap().mul(&x2).unwrap().exp().unwrap().sum().unwrap().backward(None, false, false).unwrap();
    let x3 = leaf(&[1.0, 2.0, 3.0]);
    checkpoint(counted(Arc::default()), std::slice::from_ref(&x3)).unwrap()[0]
        .sum()
        .unwrap()
        .backward(None, false, false)
        .unwrap();
    assert_eq!(vals(&x2.grad().unwrap()), vals(&x3.grad().unwrap()));
}

#[test]
fn checkpoint_under_no_grad_just_runs() {
    let x = leaf(&[1.0]);
    let calls = Arc::new(AtomicUsize::new(0));
    let y = {
        let _g = ferrofx_core::autograd::no_grad();
        checkpoint(counted(calls.clone()), &[x]).unwrap()
    };
    assert!(!y[0].requires_grad());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn nested_checkpoints_recompute_like_pytorch() {
    // PyTorch 2.15: outer(t) = checkpoint(inner, t.exp()).cos(), inner(t) = t.sin() * t,
    // checkpoint(outer, x) on [0.1, 0.2, 0.3]: calls after forward {inner: 1, outer: 1}, after
    // backward {inner: 3, outer: 2}; x.grad = [-1.2820, -1.5120, -1.6614].
    let ni = Arc::new(AtomicUsize::new(0));
    let no = Arc::new(AtomicUsize::new(0));
    let (ni2, no2) = (ni.clone(), no.clone());
    let outer = move |xs: &[Tensor]| {
        no2.fetch_add(1, Ordering::SeqCst);
        let ni3 = ni2.clone();
        let inner = move |ys: &[Tensor]| {
            ni3.fetch_add(1, Ordering::SeqCst);
            Ok(vec![ys[0].sin()?.mul(&ys[0])?])
        };
        let h = checkpoint(inner, &[xs[0].exp()?])?;
        Ok(vec![h[0].cos()?])
    };
    let x = leaf(&[0.1, 0.2, 0.3]);
    let y = checkpoint(outer, std::slice::from_ref(&x)).unwrap();
    assert_eq!((ni.load(Ordering::SeqCst), no.load(Ordering::SeqCst)), (1, 1));
    y[0].sum().unwrap().backward(None, false, false).unwrap();
    assert_eq!((ni.load(Ordering::SeqCst), no.load(Ordering::SeqCst)), (3, 2));
    assert!(close(&vals(&x.grad().unwrap()), &[-1.2820, -1.5120, -1.6614], 1e-4), "{:?}", vals(&x.grad().unwrap()));
}

#[test]
fn checkpoint_replays_the_rng_so_dropout_keeps_its_mask() {
    let run = |ckpt: bool| {
        let g = Generator::new(7);
        with_generator(&g, || {
            let x = Tensor::from_vec((0..64).map(|i| i as f32 * 0.1).collect(), &[64]).unwrap();
            let w = leaf(&[1.5; 64]);
            let f = |xs: &[Tensor]| Ok(vec![dropout(&xs[0].mul(&xs[1])?.tanh()?, 0.5, true)?.mul(&xs[1])?]);
            let y = if ckpt { checkpoint(f, &[x, w.clone()]).unwrap() } else { f(&[x, w.clone()]).unwrap() };
            // a draw between forward and backward: the recomputation must not see it
            let between = ferrofx_core::ops::random::rand(&[4], None).unwrap();
            y[0].sum().unwrap().backward(None, false, false).unwrap();
            let after = ferrofx_core::ops::random::rand(&[4], None).unwrap();
            (vals(&w.grad().unwrap()), vals(&between), vals(&after))
        })
    };
    let plain = run(false);
    let ck = run(true);
    assert_eq!(plain.0, ck.0, "same dropout mask in the recomputation");
    assert!(plain.0.contains(&0.0) && plain.0.iter().any(|&v| v != 0.0));
    assert_eq!(plain.1, ck.1);
    assert_eq!(plain.2, ck.2, "the generator continues as if nothing was recomputed");
    // without preserve_rng_state the recomputation draws a new mask (PyTorch's behaviour too)
    let g = Generator::new(7);
    let w = leaf(&[1.0; 256]);
    with_generator(&g, || {
        let opts = CheckpointOptions { preserve_rng_state: false, determinism_check: true };
        let y = checkpoint_with(|xs: &[Tensor]| Ok(vec![dropout(&xs[0], 0.5, true)?]), std::slice::from_ref(&w), opts)
            .unwrap();
        let fwd_mask: Vec<bool> = vals(&y[0]).iter().map(|&v| v != 0.0).collect();
        y[0].sum().unwrap().backward(None, false, false).unwrap();
        let bwd_mask: Vec<bool> = vals(&w.grad().unwrap()).iter().map(|&v| v != 0.0).collect();
        assert_ne!(fwd_mask, bwd_mask);
    });
}

#[test]
fn checkpoint_fires_hooks_once() {
    // PyTorch 2.15: a hook registered inside the checkpointed function fires once per backward.
    let fired = Arc::new(AtomicUsize::new(0));
    let fired2 = fired.clone();
    let x = leaf(&[1.0, 2.0, 3.0]);
    let y = checkpoint(
        move |xs: &[Tensor]| {
            let u = xs[0].sin()?;
            let f = fired2.clone();
            u.register_hook(move |_| {
                f.fetch_add(1, Ordering::SeqCst);
                None
            })?;
            Ok(vec![u.mul(&xs[0])?])
        },
        std::slice::from_ref(&x),
    )
    .unwrap();
    let node_calls = Arc::new(AtomicUsize::new(0));
    let nc = node_calls.clone();
    y[0].grad_fn().unwrap().register_hook(move |_, _| {
        nc.fetch_add(1, Ordering::SeqCst);
        None
    });
    y[0].sum().unwrap().backward(None, false, false).unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(node_calls.load(Ordering::SeqCst), 1);
}

#[test]
fn checkpoint_input_modified_in_place_names_the_tensor_and_version() {
    // PyTorch 2.15, a = x * 1; y = checkpoint(f, a); a.mul_(2); y.sum().backward():
    // "one of the variables needed for gradient computation has been modified by an inplace
    // operation: [torch.FloatTensor [3]], which is output 0 of Mul, is at version 1; expected
    // version 0 instead. Hint: ..."
    let x = leaf(&[1.0, 2.0, 3.0]);
    let a = x.mul(1.0).unwrap();
    let y = checkpoint(counted(Arc::default()), std::slice::from_ref(&a)).unwrap();
    a.mul_(2.0).unwrap();
    let e = y[0].sum().unwrap().backward(None, false, false).unwrap_err();
    assert!(
        e.message().starts_with("one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [3]], which is output 0 of Mul, is at version 1; expected version 0 instead."),
        "{e}"
    );
    // a leaf changed under no_grad: "[torch.FloatTensor [3]] is at version 1; expected version 0"
    let x = leaf(&[1.0, 2.0, 3.0]);
    let y = checkpoint(counted(Arc::default()), std::slice::from_ref(&x)).unwrap();
    {
        let _g = ferrofx_core::autograd::no_grad();
        x.add_(1.0).unwrap();
    }
    let e = y[0].sum().unwrap().backward(None, false, false).unwrap_err();
    assert!(e.message().contains(": [torch.FloatTensor [3]] is at version 1; expected version 0 instead."), "{e}");
}

#[test]
fn checkpoint_recomputation_saving_fewer_tensors_is_pytorchs_error() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let x = leaf(&[1.0, 2.0, 3.0]);
    let y = checkpoint(
        move |xs: &[Tensor]| {
            let first = c.fetch_add(1, Ordering::SeqCst) == 0;
            // forward saves 2 tensors (sin's and cos's inputs), the recomputation 1
            Ok(vec![if first { xs[0].sin()?.cos()? } else { xs[0].sin()?.add(1.0)? }])
        },
        &[x],
    )
    .unwrap();
    let e = y[0].sum().unwrap().backward(None, false, false).unwrap_err();
    assert!(e.message().starts_with("torch.utils.checkpoint: A different number of tensors was saved during the original forward and recomputation.\nNumber of tensors saved during forward: 2\nNumber of tensors saved during recomputation: 1."), "{e}");
    // a different shape is caught by the determinism check, naming the position
    let n = Arc::new(AtomicUsize::new(0));
    let x = leaf(&[1.0, 2.0, 3.0, 4.0]);
    let y = checkpoint(
        move |xs: &[Tensor]| {
            let t = if n.fetch_add(1, Ordering::SeqCst) == 0 { xs[0].clone() } else { xs[0].reshape(&[2, 2])? };
            Ok(vec![t.exp()?.sum()?])
        },
        &[x],
    )
    .unwrap();
    let e = y[0].backward(None, false, false).unwrap_err();
    assert!(e.message().contains("tensor at position 0:\nsaved metadata: {'shape': [4]"), "{e}");
}

fn chain(n: usize, w: &Tensor) -> Vec<SequentialFn> {
    (0..n)
        .map(|i| {
            let w = w.clone();
            if i % 2 == 0 {
                Arc::new(move |t: &Tensor| t.mul(&w)?.tanh()) as SequentialFn
            } else {
                Arc::new(|t: &Tensor| t.sin())
            }
        })
        .collect()
}

#[test]
fn checkpoint_sequential_matches_eager_and_lowers_peak_activation_memory() {
    let n = 16;
    let run = |segments: Option<usize>| {
        let tracker = MemoryTracker::start();
        let w = {
            let _m = category_scope(Category::Parameter);
            Tensor::from_vec((0..4096).map(|i| 1.0 + (i % 7) as f32 * 0.01).collect(), &[64, 64])
                .unwrap()
                .requires_grad_(true)
                .unwrap()
        };
        let x = Tensor::from_vec((0..64 * 4096).map(|i| ((i % 97) as f32) * 0.01).collect(), &[64, 64, 64]).unwrap();
        let fs = chain(n, &w);
        let loss = {
            let _m = category_scope(Category::Activation);
            let y = match segments {
                Some(s) => checkpoint_sequential(&fs, s, &x).unwrap(),
                None => fs.iter().fold(x.clone(), |t, f| f(&t).unwrap()),
            };
            y.sum().unwrap()
        };
        loss.backward(None, false, false).unwrap();
        (vals(&w.grad().unwrap()), tracker.stats().peak(Category::Activation))
    };
    let (g_plain, peak_plain) = run(None);
    let (g_ck, peak_ck) = run(Some(4));
    assert_eq!(g_plain, g_ck, "checkpoint_sequential gives eager's gradients exactly");
    eprintln!("16-stage chain, [64, 64, 64] f32: peak activation memory {peak_plain} B eager, {peak_ck} B with checkpoint_sequential(4 segments)");
    // eager keeps ~2 tensors of 1 MiB per stage (16 stages); 4 segments keep the segment
    // boundaries, the last segment's activations and one recomputed segment at a time
    assert!(
        (peak_ck as f64) < 0.6 * peak_plain as f64,
        "peak activation memory {peak_ck} B with checkpointing vs {peak_plain} B without"
    );
    let e = checkpoint_sequential(&chain(3, &leaf(&[1.0])), 4, &leaf(&[1.0])).unwrap_err();
    assert!(e.message().contains("segments must be between 1 and the number of functions (3), got 4"), "{e}");
}

#[test]
fn checkpoint_frees_a_regions_inputs_when_its_backward_is_done() {
    // PyTorch frees what a checkpointed region keeps (its inputs, the recomputed tensors) with
    // the region's backward nodes' saved values, not when the whole graph is dropped: else the
    // segment boundaries of checkpoint_sequential stay alive to the end of backward, and the
    // recomputation of the first (often largest) segment comes on top of all of them.
    let tracker = MemoryTracker::start();
    let w = {
        let _m = category_scope(Category::Parameter);
        Tensor::from_vec(vec![1.0f32; 4096], &[64, 64]).unwrap().requires_grad_(true).unwrap()
    };
    let x = Tensor::from_vec((0..64 * 4096).map(|i| ((i % 89) as f32) * 0.01).collect(), &[64, 64, 64]).unwrap();
    let fs = chain(8, &w);
    let mib = 1 << 20;
    let loss = {
        let _m = category_scope(Category::Activation);
        checkpoint_sequential(&fs, 8, &x).unwrap().sum().unwrap()
    };
    let boundaries = tracker.stats().live(Category::Activation);
    assert!(boundaries >= 7 * mib, "7 segment boundaries of 1 MiB are alive after forward: {boundaries} B");
    loss.backward(None, false, false).unwrap();
    // `loss` (and through it the whole graph) is still alive here
    let after = tracker.stats().live(Category::Activation);
    assert!(after < mib / 2, "{after} B of activations still alive after backward (boundaries: {boundaries} B)");
    assert!(w.grad().is_some());
    drop(loss);
    // with retain_graph the regions keep their inputs: a second backward recomputes them
    w.set_grad(None).unwrap();
    let loss = {
        let _m = category_scope(Category::Activation);
        checkpoint_sequential(&fs, 8, &x).unwrap().sum().unwrap()
    };
    loss.backward(None, true, false).unwrap();
    assert!(tracker.stats().live(Category::Activation) >= 7 * mib);
    let g1 = vals(&w.grad().unwrap());
    loss.backward(None, false, false).unwrap();
    let g2 = vals(&w.grad().unwrap());
    let twice: Vec<f32> = g1.iter().map(|g| 2.0 * g).collect();
    assert!(close(&g2, &twice, 1e-5), "the second backward recomputed and accumulated the same gradient");
    assert!(tracker.stats().live(Category::Activation) < mib / 2);
}

#[test]
fn memory_tracking_is_per_thread_and_trackers_nest() {
    let t = MemoryTracker::start();
    std::thread::spawn(|| Tensor::from_vec(vec![0.0f32; 1000], &[1000]).unwrap()).join().unwrap();
    assert_eq!(t.stats().allocations(), 0, "another thread's buffers are not counted");
    let _x = Tensor::from_vec(vec![0.0f64; 10], &[10]).unwrap();
    assert_eq!(t.stats().live(Category::Other), 80);
    let a = Tensor::from_vec(vec![1i32; 4], &[4]).unwrap();
    let inner = MemoryTracker::start();
    let v = a.reshape(&[2, 2]).unwrap();
    let b = a.to_dtype(ferrofx_core::DType::F64).unwrap();
    assert_eq!(inner.stats().live_total(), 32, "only b: the view shares a's buffer");
    assert_eq!(t.stats().live_total(), 80 + 16);
    drop(inner);
    drop(b);
    assert_eq!(t.stats().live_total(), 80 + 16);
    assert_eq!(t.stats().peak_total(), 80 + 16);
    drop(a);
    drop(v);
    t.reset_peak();
    assert_eq!(t.stats().peak_total(), 80);
}

// ---------------------------------------------------------------------------------------------
// Issue 22: fixed reduction shards (the arithmetic of a step independent of the rank count).

mod batch_shards {
    use ferrofx_nn::batch_shards::{check_rank_count, shard_block, shard_rows, tree_sum, ShardCombine};
    use ferrofx_nn::train::{eager_step, train_digits, train_digits_sharded, TrainConfig};
    use ferrofx_nn::Module;
    use std::ops::Range;
    use std::sync::{Arc, Barrier, Mutex};

    /// Values whose sums round differently in different orders.
    fn leaves(s: usize, len: usize) -> Vec<Vec<f32>> {
        (0..s)
            .map(|k| {
                (0..len).map(|i| ((k * 7919 + i * 104_729) % 1000) as f32 * 1.37e-3 + 1e-7 * (k as f32 + 1.0)).collect()
            })
            .collect()
    }

    #[test]
    fn the_tree_gives_the_same_bits_for_every_rank_count_it_allows() {
        let mut checked = 0;
        for s in 1..=32usize {
            let all = leaves(s, 64);
            let whole = tree_sum(all.clone()).unwrap();
            for world in 1..=s {
                if check_rank_count(s, world).is_err() {
                    continue;
                }
                // each rank sums its block, then the block sums in rank order
                let blocks: Vec<Vec<f32>> =
                    (0..world).map(|r| tree_sum(all[shard_block(s, r, world)].to_vec()).unwrap()).collect();
                assert_eq!(tree_sum(blocks).unwrap(), whole, "{s} shards over {world} ranks");
                checked += 1;
            }
        }
        assert!(checked > 60, "{checked}");
        // the order matters: a left fold of the same leaves differs somewhere
        let all = leaves(8, 64);
        let fold = all[1..].iter().fold(all[0].clone(), |mut a, b| {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            a
        });
        assert_ne!(fold, tree_sum(all).unwrap(), "the test data does not exercise rounding");
    }

    #[test]
    fn rank_counts_shards_and_rows() {
        assert!(check_rank_count(4, 1).is_ok() && check_rank_count(4, 2).is_ok() && check_rank_count(4, 4).is_ok());
        assert!(check_rank_count(12, 3).is_ok() && check_rank_count(6, 3).is_ok());
        let e = check_rank_count(4, 3).unwrap_err().to_string();
        assert!(e.contains("--batch-shards 4 cannot be shared by 3 ranks") && e.contains("use 1, 2, 4 ranks"), "{e}");
        assert!(check_rank_count(6, 2).is_err(), "blocks of 3 shards are not subtrees");
        assert_eq!((0..4).map(|k| shard_rows(29, 4, k)).collect::<Vec<_>>(), vec![(0, 8), (8, 15), (15, 22), (22, 29)]);
        assert!(tree_sum(vec![]).is_err());
        let e = tree_sum(vec![vec![1.0; 3], vec![1.0; 2]]).unwrap_err().to_string();
        assert!(e.contains("shard 1 holds 2 values where shard 0 holds 3"), "{e}");
        // every shard needs a row: 1437 training rows in batches of 32 leave a last batch of 29
        let cfg = TrainConfig { progress: false, batch_size: 1436, ..TrainConfig::default() };
        let e = train_digits(&cfg).err().unwrap().to_string();
        assert!(e.contains("a last batch of 1 rows") && e.contains("--batch-shards 4"), "{e}");
    }

    /// `world` ranks simulated by threads: each trains its own model on its block of shards and
    /// exchanges block sums through shared memory, as `ferrofx-dist`'s all-gather does.
    struct ThreadRanks {
        rank: usize,
        world: usize,
        barrier: Arc<Barrier>,
        slots: Arc<Mutex<Vec<Vec<f32>>>>,
    }

    impl ShardCombine for ThreadRanks {
        fn start(&mut self, _model: &dyn Module) -> ferrofx_core::Result<()> {
            Ok(())
        }
        fn block(&self, shards: usize) -> ferrofx_core::Result<Range<usize>> {
            check_rank_count(shards, self.world)?;
            Ok(shard_block(shards, self.rank, self.world))
        }
        fn combine(&mut self, block_sum: Vec<f32>) -> ferrofx_core::Result<Vec<f32>> {
            self.slots.lock().unwrap()[self.rank] = block_sum;
            self.barrier.wait();
            let all = self.slots.lock().unwrap().clone();
            self.barrier.wait();
            tree_sum(all)
        }
    }

    fn weights(m: &dyn Module) -> Vec<(String, Vec<f64>)> {
        m.state_dict().into_iter().map(|(k, t)| (k, t.to_vec_f64().unwrap())).collect()
    }

    #[test]
    fn a_run_over_two_and_four_ranks_gives_the_bits_of_one_process() {
        let cfg = TrainConfig { progress: false, epochs: 1, seed: 3, ..TrainConfig::default() };
        let one = train_digits(&cfg).unwrap();
        for world in [2usize, 4] {
            let barrier = Arc::new(Barrier::new(world));
            let slots = Arc::new(Mutex::new(vec![vec![]; world]));
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let (cfg, barrier, slots) = (cfg.clone(), barrier.clone(), slots.clone());
                    std::thread::spawn(move || {
                        let mut ranks = ThreadRanks { rank, world, barrier, slots };
                        let r = train_digits_sharded(&cfg, &mut eager_step, &mut ranks).unwrap();
                        (weights(&r.model), r.epochs[0].train_loss)
                    })
                })
                .collect();
            for (rank, h) in handles.into_iter().enumerate() {
                let (w, loss) = h.join().unwrap();
                assert_eq!(w, weights(&one.model), "rank {rank} of {world}: weights differ from one process");
                assert_eq!(loss, one.epochs[0].train_loss);
            }
        }
        // with other shards, other bits (the shards are part of the configuration)
        let two = train_digits(&TrainConfig { batch_shards: 2, ..cfg }).unwrap();
        assert_ne!(weights(&two.model), weights(&one.model));
    }
}

/// Segments on `[rows, 64]`: dense ones (`tanh(x @ w).sin()`, saving a `[rows, 64]` tensor of
/// their own) and pooling ones (pairs of rows averaged), so the memory sits in the first
/// segments.
fn pyramid(w: &Tensor) -> Vec<SequentialFn> {
    let dense = |w: &Tensor| {
        let w = w.clone();
        Arc::new(move |t: &Tensor| t.matmul(&w)?.tanh()?.sin()) as SequentialFn
    };
    let pool = Arc::new(|t: &Tensor| {
        let r = t.shape()[0] as i64;
        t.reshape(&[r / 2, 2, 64])?.mean_dim(&[1], false)
    }) as SequentialFn;
    vec![dense(w), dense(w), pool.clone(), dense(w), dense(w), pool, dense(w), dense(w)]
}

#[test]
fn checkpoint_plan_meets_its_budget_with_eagers_gradients_and_least_recomputation() {
    use ferrofx_core::autograd::CheckpointPlan;
    use ferrofx_core::memory::MemoryBudget;
    use ferrofx_core::op::FlopCounterMode;
    let w = {
        let _m = category_scope(Category::Parameter);
        Tensor::from_vec((0..4096).map(|i| ((i % 13) as f32 - 6.0) * 0.02).collect(), &[64, 64])
            .unwrap()
            .requires_grad_(true)
            .unwrap()
    };
    let x = Tensor::from_vec((0..1024 * 64).map(|i| ((i % 89) as f32) * 0.01 - 0.4).collect(), &[1024, 64]).unwrap();
    let fs = pyramid(&w);
    let plan = CheckpointPlan::new(&fs, &x, MemoryBudget::Fraction(0.5)).unwrap();
    // the profile: a dense segment saves its tanh output (distinct bytes) and its input; FLOPs
    // come from the registry's cost functions (matmul 2·M·K·N, one per element for tanh/sin)
    let s0 = plan.segments[0];
    assert_eq!(s0.saved_bytes, 1024 * 64 * 4, "{s0:?}");
    assert!(s0.saves_input && !s0.saves_output, "{s0:?}");
    assert_eq!(s0.flops, 2 * 1024 * 64 * 64 + 2 * 1024 * 64, "{s0:?}");
    assert_eq!(plan.segments[3].flops, 2 * 512 * 64 * 64 + 2 * 512 * 64);
    assert!(plan.estimated_bytes <= plan.limit && plan.limit == plan.unconstrained_bytes / 2, "{plan:?}");
    assert!(!plan.checkpointed[7], "the last segment is never checkpointed");
    // it recomputes less than checkpoint_sequential (every segment but the last)
    let all: u64 = plan.segments[..7].iter().map(|s| s.flops).sum();
    assert!(plan.recomputed_flops < all, "{} vs {all}", plan.recomputed_flops);
    // both steps, FLOPs counted over forward (the same ops) and activation memory over the step
    let run = |planned: bool| {
        w.set_grad(None).unwrap();
        let tracker = MemoryTracker::start();
        let counter = FlopCounterMode::start();
        let loss = {
            let _m = category_scope(Category::Activation);
            let y = if planned { plan.run(&fs, &x).unwrap() } else { fs.iter().fold(x.clone(), |t, f| f(&t).unwrap()) };
            y.sum().unwrap()
        };
        let forward = counter.total_flops();
        loss.backward(None, false, false).unwrap();
        (vals(&w.grad().unwrap()), tracker.stats().peak(Category::Activation), forward)
    };
    let (g_plain, peak_plain, fwd_plain) = run(false);
    let (g_plan, peak_plan, fwd_plan) = run(true);
    assert_eq!(g_plain, g_plan, "the planned checkpoints give eager's gradients exactly");
    assert_eq!(fwd_plain, fwd_plan, "forward runs the same ops");
    assert!(
        (peak_plan as f64) < 0.75 * peak_plain as f64,
        "peak activation memory {peak_plan} B with the plan vs {peak_plain} B without ({plan:?})"
    );
    // budget 1.0 recomputes nothing; an impossible budget and a foreign function list are errors
    let free = CheckpointPlan::new(&fs, &x, MemoryBudget::Fraction(1.0)).unwrap();
    assert_eq!((free.recomputed_flops, free.checkpointed_indices()), (0, vec![]));
    let e = CheckpointPlan::new(&fs, &x, MemoryBudget::Bytes(1)).unwrap_err().to_string();
    assert!(e.contains("memory budget 1 B cannot be met") && e.contains("raise the budget"), "{e}");
    let e = plan.run(&fs[..3], &x).unwrap_err().to_string();
    assert!(e.contains("the plan has 8 segments but 3 functions were given"), "{e}");
    let e = CheckpointPlan::new(&fs, &x, MemoryBudget::Fraction(2.0)).unwrap_err().to_string();
    assert!(e.contains("memory_budget 2 is not a fraction"), "{e}");
}
