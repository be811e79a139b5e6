//! Conv+BN and Linear+BN folding: the fused layer computes what the pair computes in eval mode.

use ferrofx_core::ops::random::{manual_seed, rand, randn};
use ferrofx_core::Tensor;
use ferrofx_nn::fusion::{fuse_conv_bn_eval, fuse_linear_bn_eval};
use ferrofx_nn::*;

fn set(t: &Option<Tensor>, v: &Tensor) {
    t.as_ref().unwrap().copy_(v).unwrap();
}

fn random_stats(bn: &BatchNorm, c: i64) {
    let _g = ferrofx_core::autograd::no_grad();
    set(&bn.running_mean, &randn(&[c], None).unwrap());
    set(&bn.running_var, &rand(&[c], None).unwrap().add(0.5).unwrap());
    set(&bn.weight, &randn(&[c], None).unwrap());
    set(&bn.bias, &randn(&[c], None).unwrap());
}

fn assert_close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    for (x, y) in a.to_vec::<f32>().unwrap().iter().zip(b.to_vec::<f32>().unwrap()) {
        assert!((x - y).abs() <= 1e-4 + 1e-4 * y.abs(), "{x} vs {y}");
    }
}

#[test]
fn conv_bn_fold_matches_the_pair() {
    manual_seed(3);
    for (bias, groups) in [(true, 1), (false, 1), (true, 2)] {
        let opts = Conv2dOpts { stride: 2, padding: 1, dilation: 1, groups, bias };
        let conv = Conv2d::with(4, 6, 3, opts).unwrap();
        let mut bn = BatchNorm::new_2d(6).unwrap();
        random_stats(&bn, 6);
        bn.eval();
        let fused = fuse_conv_bn_eval(&conv, &bn).unwrap();
        let x = randn(&[2, 4, 9, 9], None).unwrap();
        assert_close(&fused.forward(&x).unwrap(), &bn.forward(&conv.forward(&x).unwrap()).unwrap());
        assert!(fused.weight.requires_grad() && fused.bias.as_ref().unwrap().requires_grad());
        assert!(fused.weight.grad_fn().is_none(), "fused parameters are leaves");
    }
}

#[test]
fn linear_bn_fold_matches_the_pair() {
    manual_seed(4);
    let lin = Linear::new(5, 3, true).unwrap();
    let mut bn = BatchNorm::new_1d(3).unwrap();
    random_stats(&bn, 3);
    bn.eval();
    let fused = fuse_linear_bn_eval(&lin, &bn).unwrap();
    let x = randn(&[4, 5], None).unwrap();
    assert_close(&fused.forward(&x).unwrap(), &bn.forward(&lin.forward(&x).unwrap()).unwrap());
}

#[test]
fn folding_refuses_training_mode_and_mismatched_channels() {
    let conv = Conv2d::new(2, 3, 1).unwrap();
    let bn = BatchNorm::new_2d(3).unwrap();
    let e = fuse_conv_bn_eval(&conv, &bn).err().unwrap().to_string();
    assert!(e.contains("BatchNorm is in training mode: fusion is only valid in eval mode"), "{e}");
    let mut bn4 = BatchNorm::new_2d(4).unwrap();
    bn4.eval();
    let e = fuse_conv_bn_eval(&conv, &bn4).err().unwrap().to_string();
    assert!(e.contains("Conv2d has 3 output channels but BatchNorm has 4 features"), "{e}");
    let mut no_stats = BatchNorm::with_2d(3, 1e-5, Some(0.1), true, false).unwrap();
    no_stats.eval();
    let e = fuse_conv_bn_eval(&conv, &no_stats).err().unwrap().to_string();
    assert!(e.contains("no running statistics"), "{e}");
}
