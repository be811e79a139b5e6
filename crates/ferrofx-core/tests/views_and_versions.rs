//! View semantics (issue 2, acceptance item 3): writes through a view are seen by the base and
//! by other views; the version counter is shared by every view of a storage and bumped once by
//! each successful in-place op (and never by a failed one or by an out-of-place op).

use ferrofx_core::{op, Tensor, Value};

fn arange(n: usize, shape: &[usize]) -> Tensor {
    Tensor::from_vec((0..n).map(|v| v as f32).collect(), shape).unwrap()
}

#[test]
fn writes_through_views_are_seen_by_the_base() {
    let base = arange(12, &[3, 4]);
    // row view
    let row = base.select(0, 1).unwrap();
    row.fill_(-1.0).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap()[4..8], [-1.0; 4]);
    // column view (strided)
    let col = base.select(1, 2).unwrap();
    col.add_(100.0).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 102.0, 3.0, -1.0, -1.0, 99.0, -1.0, 8.0, 9.0, 110.0, 11.0]);
    // transposed view
    let t = base.t().unwrap();
    t.zero_().unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![0.0; 12]);
    // stepped slice
    let s = base.view(&[12]).unwrap().slice(0, Some(1), None, 3).unwrap();
    s.copy_(&Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap()).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 4.0, 0.0]);
    // narrow + unsqueeze + permute chain
    let v = base.narrow(1, 1, 2).unwrap().unsqueeze(0).unwrap().permute(&[2, 1, 0]).unwrap();
    v.mul_(10.0).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![0.0, 10.0, 0.0, 0.0, 20.0, 0.0, 0.0, 30.0, 0.0, 0.0, 40.0, 0.0]);
    // another view of the same storage sees the write too
    let other = base.reshape(&[2, 6]).unwrap();
    assert!(other.shares_storage(&base));
    base.relu_().unwrap().sub_(5.0).unwrap();
    assert_eq!(other.to_vec::<f32>().unwrap()[1], 5.0);
    // in-place through a view of a view with a broadcast operand
    let sub = base.narrow(0, 1, 2).unwrap().narrow(1, 0, 2).unwrap(); // [2, 2]
    sub.copy_(&Tensor::from_vec(vec![7.0f32, 8.0], &[2]).unwrap()).unwrap();
    let b = base.to_vec::<f32>().unwrap();
    assert_eq!([b[4], b[5], b[8], b[9]], [7.0, 8.0, 7.0, 8.0]);
}

#[test]
fn version_counter_is_shared_and_bumped_once_per_inplace_op() {
    let base = arange(6, &[2, 3]);
    let view = base.t().unwrap();
    let row = base.select(0, 0).unwrap();
    assert_eq!(base.version(), 0);
    view.add_(1.0).unwrap();
    assert_eq!((base.version(), view.version(), row.version()), (1, 1, 1));
    row.mul_(2.0).unwrap();
    base.relu_().unwrap();
    row.fill_(0.0).unwrap();
    view.zero_().unwrap();
    base.copy_(&arange(6, &[2, 3])).unwrap();
    base.clamp_(0.0, 3.0).unwrap();
    base.sigmoid_().unwrap();
    assert_eq!(base.version(), 8);
    assert_eq!(view.version(), 8);
    // out-of-place ops and views do not bump
    let _ = base.add(1.0).unwrap();
    let _ = base.exp().unwrap();
    let _ = base.view(&[6]).unwrap();
    assert_eq!(base.version(), 8);
    // a failed in-place op does not bump
    assert!(base.add_(&arange(4, &[4])).is_err());
    assert!(base.expand(&[2, 2, 3]).unwrap().add_(1.0).is_err());
    assert_eq!(base.version(), 8);
    // calls by name go through the same dispatch
    op::call("add_", vec![Value::from(&row), Value::Float(1.0)], vec![]).unwrap();
    assert_eq!(view.version(), 9);
    // copies have their own counter
    let c = view.contiguous().unwrap();
    assert!(!c.shares_storage(&base));
    c.add_(1.0).unwrap();
    assert_eq!((c.version(), base.version()), (1, 9));
}

#[test]
fn inplace_returns_the_same_tensor_and_aliasing_sources_are_read_first() {
    let x = arange(4, &[4]);
    let r = x.add_(&x).unwrap();
    assert!(r.same(&x));
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 4.0, 6.0]);
    // source is a reversed-order view of the destination's storage
    let m = arange(4, &[2, 2]);
    m.copy_(&m.t().unwrap()).unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 1.0, 3.0]);
    let m = arange(4, &[2, 2]);
    m.add_(&m.t().unwrap()).unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), vec![0.0, 3.0, 3.0, 6.0]);
}

#[test]
fn concurrent_inplace_writes_on_disjoint_storages() {
    // Tensor is Send + Sync; in-place ops on different threads serialise on the storage lock.
    let x = Tensor::from_vec(vec![0.0f32; 1000], &[1000]).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let x = x.clone();
            s.spawn(move || {
                for _ in 0..25 {
                    x.add_(1.0).unwrap();
                }
            });
        }
    });
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![100.0; 1000]);
    assert_eq!(x.version(), 100);
}
