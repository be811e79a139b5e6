//! Work analysis against PyTorch's own counts (torch.utils.flop_counter.FlopCounterMode on
//! torchvision's models at 224 px: ResNet-18 1.814 GMACs, ResNet-50 4.089 GMACs; parameters
//! 11.69 M and 25.56 M), and the Conv-BN folding pass on ResNet-50.

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::Tensor;
use ferrofx_fx::passes::flops::{count_macs, count_parameters};
use ferrofx_fx::passes::fuse::fuse_conv_bn;
use ferrofx_fx::{trace_with_inputs, Opcode};
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;

fn within(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want
}

#[test]
fn resnet_macs_and_parameters_match_pytorch() {
    let x = Tensor::from_vec(vec![0.0f32; 3 * 224 * 224], &[1, 3, 224, 224]).unwrap();
    for (model, gmacs, mparams) in
        [(ResNet::resnet18(1000).unwrap(), 1.814, 11.69), (ResNet::resnet50(1000).unwrap(), 4.089, 25.56)]
    {
        let macs = count_macs(&model, &[(&x).into()]).unwrap();
        let g = macs.total as f64 / 1e9;
        assert!(within(g, gmacs, 0.01), "GMACs {g} vs PyTorch {gmacs} ({:?})", macs.by_op);
        let p = count_parameters(&model) as f64 / 1e6;
        assert!(within(p, mparams, 0.01), "parameters {p} M vs PyTorch {mparams} M");
    }
}

#[test]
fn conv_bn_folding_removes_all_53_batchnorms_of_resnet50() {
    manual_seed(7);
    let mut m = ResNet::resnet50(10).unwrap();
    m.eval();
    let x = randn(&[1, 3, 64, 64], None).unwrap();
    let mut gm = trace_with_inputs(&m, &[(&x).into()]).unwrap();
    let count_bn = |gm: &ferrofx_fx::GraphModule| {
        gm.graph()
            .iter()
            .filter(|n| {
                n.op() == Opcode::CallModule
                    && gm.leaf_modules()[n.target().name()].spec().is_some_and(|s| s.type_name == "BatchNorm2d")
            })
            .count()
    };
    assert_eq!(count_bn(&gm), 53);
    let before = gm.forward(&x).unwrap();
    assert_eq!(fuse_conv_bn(&mut gm).unwrap(), 53);
    assert_eq!(count_bn(&gm), 0);
    gm.graph().lint().unwrap();
    let after = gm.forward(&x).unwrap();
    for (a, b) in after.to_vec::<f32>().unwrap().iter().zip(before.to_vec::<f32>().unwrap()) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // the original model is untouched
    let eager = m.forward(&x).unwrap();
    assert_eq!(eager.to_vec::<f32>().unwrap(), before.to_vec::<f32>().unwrap());
}
