//! Acceptance 3: a 1,000,000-op chain (backward and teardown without stack overflow) and
//! saved tensors freed after backward.

mod autograd_common;
use autograd_common::*;
use ferrofx_core::autograd::{self, NodeRef};
use std::sync::Arc;
use std::time::Instant;

const N: usize = 1_000_000;

#[test]
fn million_op_chain_backward_and_teardown() {
    let x = leaf32(&[1.0], &[1]);
    let c = t32(&[1.0], &[1]);
    let t0 = Instant::now();
    let mut y = x.clone();
    for i in 0..N {
        // Alternate an op that saves tensors with a view op.
        y = if i % 2 == 0 { mul(&y, &c) } else { y.view(&[1]).unwrap() };
    }
    let fwd = t0.elapsed();
    let root: NodeRef = y.grad_fn().unwrap();
    assert_eq!(root.topological_nr(), N as u64);
    let t1 = Instant::now();
    y.backward(None, false, false).unwrap();
    let bwd = t1.elapsed();
    assert_eq!(vals(&x.grad().unwrap()), vec![1.0]);
    let t2 = Instant::now();
    drop(root);
    drop(y);
    let teardown = t2.elapsed();
    eprintln!("1M chain: forward {fwd:?}, backward {bwd:?}, teardown {teardown:?}");
}

#[test]
fn million_op_graph_dropped_without_backward() {
    let x = leaf32(&[1.0], &[1]);
    let c = t32(&[2.0], &[1]);
    let mut y = x.clone();
    for _ in 0..N {
        y = mul(&y, &c);
    }
    let weak = Arc::downgrade(&y.grad_fn().unwrap());
    drop(y);
    assert!(weak.upgrade().is_none(), "graph must be freed when its last tensor goes");
}

#[test]
fn saved_tensors_are_freed_after_backward() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let h = mul(&x, &x); // an intermediate
    let out = mul(&h, &h); // saves h twice
    let base = h.use_count();
    assert!(base >= 3, "h is held by its handle and by the saved variables of `out`'s node: {base}");
    let saved_storage_users = h.use_count();
    sum(&out).backward(None, false, false).unwrap();
    assert_eq!(h.use_count(), 1, "release_variables must drop the saved copies (was {saved_storage_users})");
    // With retain_graph they stay, and are freed once the graph goes.
    let h = mul(&x, &x);
    let out = sum(&mul(&h, &h));
    let before = h.use_count();
    out.backward(None, true, false).unwrap();
    assert_eq!(h.use_count(), before);
    let weak = Arc::downgrade(&out.grad_fn().unwrap());
    drop(out);
    assert!(weak.upgrade().is_none());
    assert_eq!(h.use_count(), 1);
    // The whole graph is freed when the last tensor referring to it goes.
    let l = leaf32(&[1.0], &[1]);
    let a = mul(&l, &l);
    let weak_node = Arc::downgrade(&a.grad_fn().unwrap());
    let weak_acc = Arc::downgrade(a.grad_fn().unwrap().next_functions()[0].0.as_ref().unwrap());
    drop(a);
    assert!(weak_node.upgrade().is_none() && weak_acc.upgrade().is_none());
    let _ = autograd::is_grad_enabled();
}
