//! Acceptance 1: every example of seed 004 (PyTorch's autograd graph).

mod autograd_common;
use autograd_common::*;
use ferrofx_core::autograd::{self, same_node, NodeRef};
use ferrofx_core::Tensor;

fn names(n: &NodeRef) -> Vec<(Option<String>, u32)> {
    n.next_functions().into_iter().map(|(f, nr)| (f.map(|f| f.name().to_string()), nr)).collect()
}
fn s(x: &str) -> Option<String> {
    Some(x.to_string())
}

#[test]
fn next_functions_chain_of_x_mul_w_plus_b_sum() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let w = leaf32(&[3.0, 4.0], &[2]);
    let b = leaf32(&[0.1, 0.2], &[2]);
    let y = mul(&x, &w);
    let z = add(&y, &b);
    let loss = sum(&z);

    let sum_back = loss.grad_fn().unwrap();
    assert_eq!(sum_back.name(), "SumBackward0");
    assert_eq!(names(&sum_back), vec![(s("AddBackward0"), 0)]);
    let add_back = sum_back.next_functions()[0].0.clone().unwrap();
    assert_eq!(names(&add_back), vec![(s("MulBackward0"), 0), (s("AccumulateGrad"), 0)]);
    let mul_back = add_back.next_functions()[0].0.clone().unwrap();
    assert_eq!(names(&mul_back), vec![(s("AccumulateGrad"), 0), (s("AccumulateGrad"), 0)]);
    assert!(same_node(&y.grad_fn().unwrap(), &mul_back));

    // Leaves: no grad_fn, AccumulateGrad is their virtual node; non-leaves have grad_fn.
    assert!(x.is_leaf() && x.grad_fn().is_none());
    assert!(!y.is_leaf() && y.requires_grad());
    let acc_x = mul_back.next_functions()[0].0.clone().unwrap();
    assert_eq!(acc_x.as_accumulate_grad().unwrap().variable().id(), x.id());
    // sequence numbers grow with creation; topological numbers are longest paths to leaves.
    assert!(sum_back.sequence_nr() > add_back.sequence_nr() && add_back.sequence_nr() > mul_back.sequence_nr());
    assert_eq!(
        (acc_x.topological_nr(), mul_back.topological_nr(), add_back.topological_nr(), sum_back.topological_nr()),
        (0, 1, 2, 3)
    );
    assert_eq!(acc_x.sequence_nr(), u64::MAX);
    // Edges mirror the forward: MulBackward0 has 2 outputs (next edges) and 1 input.
    assert_eq!((mul_back.num_outputs(), mul_back.num_inputs()), (2, 1));
    assert!(mul_back.next_edges().iter().all(|e| e.is_valid()));

    loss.backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0, 4.0]);
    assert_eq!(vals(&w.grad().unwrap()), vec![1.0, 2.0]);
    assert_eq!(vals(&b.grad().unwrap()), vec![1.0, 1.0]);
}

#[test]
fn accumulate_grad_is_created_once_per_leaf() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let y1 = mul(&x, &x);
    let y2 = mul(&x, &x);
    let a = y1.grad_fn().unwrap().next_functions();
    let b = y2.grad_fn().unwrap().next_functions();
    assert!(same_node(a[0].0.as_ref().unwrap(), a[1].0.as_ref().unwrap()));
    assert!(same_node(a[0].0.as_ref().unwrap(), b[0].0.as_ref().unwrap()));
}

#[test]
fn x_times_x_gives_two_x() {
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &x);
    let e = y.grad_fn().unwrap().next_functions();
    assert!(same_node(e[0].0.as_ref().unwrap(), e[1].0.as_ref().unwrap()));
    y.backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![4.0]);
}

#[test]
fn two_branches_sum_at_the_shared_node() {
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &t32(&[2.0], &[])); // branch point
    let z1 = add(&y, &t32(&[1.0], &[]));
    let z2 = mul(&y, &t32(&[3.0], &[]));
    let loss = add(&z1, &z2);
    loss.backward(None, false, false).unwrap();
    // d/dx (2x + 1 + 3·2x) = 2 + 6
    assert_eq!(vals(&x.grad().unwrap()), vec![8.0]);
    assert_eq!(vals(&loss), vec![2.0 * 2.0 + 1.0 + 3.0 * 4.0]);
}

#[test]
fn detach_cuts_the_graph() {
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &t32(&[2.0], &[]));
    let z = y.detach();
    assert!(!z.requires_grad() && z.grad_fn().is_none() && z.is_leaf());
    assert!(z.shares_storage(&y));
    let w = mul(&z, &t32(&[3.0], &[]));
    assert!(w.grad_fn().is_none() && !w.requires_grad());
    // detach shares the version counter.
    assert_eq!(z.version(), y.version());
    let err = w.backward(None, false, false).unwrap_err().to_string();
    assert!(err.contains("element 0 of tensors does not require grad and does not have a grad_fn"), "{err}");
}

#[test]
fn requires_grad_false_inputs_give_invalid_edges_and_no_grad() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let c = t32(&[5.0, 6.0], &[2]);
    let y = mul(&x, &c);
    let nf = y.grad_fn().unwrap().next_functions();
    assert_eq!(nf.len(), 2);
    assert!(nf[0].0.is_some() && nf[1].0.is_none());
    assert!(!y.grad_fn().unwrap().next_edges()[1].is_valid());
    sum(&y).backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![5.0, 6.0]);
    assert!(c.grad().is_none());
    // Nothing requires grad: no graph at all.
    let q = mul(&c, &c);
    assert!(q.grad_fn().is_none() && !q.requires_grad());
}

#[test]
fn version_counter_detects_in_place_modification_of_saved_tensor() {
    let leaf = leaf32(&[1.0, 2.0, 3.0], &[3]);
    let x = mul(&leaf, &t32(&[1.0, 1.0, 1.0], &[3])); // a non-leaf, like the seed's clone()
    let y = mul(&x, &x); // saves x at version 0
    assert_eq!(x.version(), 0);
    add_(&x.detach(), &t32(&[1.0, 1.0, 1.0], &[3])).unwrap(); // like x.data.add_(1)
    assert_eq!(x.version(), 1);
    let err = sum(&y).backward(None, false, false).unwrap_err().to_string();
    assert!(
        err.contains("one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [3]], which is output 0 of Mul, is at version 1; expected version 0 instead."),
        "{err}"
    );
    // A saved leaf, modified through a detached alias.
    let a = leaf32(&[1.0, 2.0, 3.0], &[3]);
    let y = mul(&a, &t32(&[2.0, 2.0, 2.0], &[3]));
    add_(&a.detach(), &t32(&[1.0, 1.0, 1.0], &[3])).unwrap();
    let err = sum(&y).backward(None, false, false).unwrap_err().to_string();
    assert!(err.contains("[torch.FloatTensor [3]] is at version 1; expected version 0 instead."), "{err}");
}

#[test]
fn second_backward_fails_without_retain_graph() {
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &x);
    y.backward(None, false, false).unwrap();
    let err = y.backward(None, false, false).unwrap_err().to_string();
    assert!(err.contains(autograd::SECOND_BACKWARD_MSG), "{err}");
}

#[test]
fn retain_graph_allows_a_second_backward_and_grads_accumulate() {
    let x = leaf32(&[2.0], &[]);
    let y = mul(&x, &x);
    y.backward(None, true, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![4.0]);
    y.backward(None, false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![8.0]);
}

#[test]
fn graph_root_needs_explicit_gradient_for_non_scalars() {
    let x = leaf32(&[1.0, 2.0], &[2]);
    let y = mul(&x, &x);
    let err = y.backward(None, false, false).unwrap_err().to_string();
    assert!(err.contains("grad can be implicitly created only for scalar outputs"), "{err}");
    y.backward(Some(&t32(&[1.0, 10.0], &[2])), false, false).unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 40.0]);
    let _ = Tensor::scalar(1.0f32);
}
