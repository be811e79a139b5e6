//! Behaviour and bad-input tests of built-in layers, losses, optimizers and clipping.

use ferrofx_core::{DType, Tensor, Value};
use ferrofx_nn::layers::*;
use ferrofx_nn::loss::{self, CeOpts, Reduction};
use ferrofx_nn::optim::{self, clip_grad_norm_, clip_grad_value_, Optimizer};
use ferrofx_nn::Module;

fn t(v: Vec<f32>, s: &[usize]) -> Tensor {
    Tensor::from_vec(v, s).unwrap()
}

#[test]
fn pytorch_default_inits() {
    let bn = BatchNorm2d::new_2d(3).unwrap();
    let sd = bn.state_dict();
    let keys: Vec<&str> = sd.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
    assert_eq!(sd["weight"].to_vec::<f32>().unwrap(), [1.0; 3]);
    assert_eq!(sd["bias"].to_vec::<f32>().unwrap(), [0.0; 3]);
    assert_eq!(sd["running_var"].to_vec::<f32>().unwrap(), [1.0; 3]);
    assert_eq!(sd["num_batches_tracked"].dtype(), DType::I64);
    assert_eq!(bn.named_buffers().len(), 3);
    let ln = LayerNorm::new(&[4]).unwrap();
    assert_eq!(ln.weight.as_ref().unwrap().to_vec::<f32>().unwrap(), [1.0; 4]);
    let e = Embedding::new(5, 3, Some(1)).unwrap();
    assert_eq!(e.weight.select(0, 1).unwrap().to_vec::<f32>().unwrap(), [0.0; 3]);
    let c = Conv2d::with(4, 8, 3, Conv2dOpts { groups: 2, ..Default::default() }).unwrap();
    assert_eq!(c.weight.shape(), &[8, 2, 3, 3]);
    let bound = 1.0 / (18f32).sqrt();
    assert!(c.weight.to_vec::<f32>().unwrap().iter().all(|v| v.abs() <= bound));
    let mha = MultiheadAttention::new(8, 2, 0.0, true, false).unwrap();
    let keys: Vec<String> = mha.state_dict().keys().cloned().collect();
    assert_eq!(keys, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
    let tel = TransformerEncoderLayer::new(8, 2, 16, 0.1, "relu", false, false).unwrap();
    let keys: Vec<String> = tel.state_dict().keys().cloned().collect();
    assert_eq!(
        keys[..4],
        ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias"]
    );
    assert_eq!(keys.len(), 12);
}

#[test]
fn batchnorm_counts_batches_and_eval_uses_running_stats() {
    let mut bn = BatchNorm2d::new_2d(2).unwrap();
    let x = t((0..32).map(|i| i as f32).collect(), &[2, 2, 2, 4]);
    bn.forward(&x).unwrap();
    bn.forward(&x).unwrap();
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().to_vec::<i64>().unwrap(), [2]);
    let rm = bn.running_mean.as_ref().unwrap().to_vec::<f32>().unwrap();
    assert!(rm[0] > 0.0 && rm[1] > rm[0]);
    bn.eval();
    let y1 = bn.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let y2 = bn.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(y1, y2);
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().to_vec::<i64>().unwrap(), [2]);
    let e = bn.forward(&t(vec![0.0; 4], &[2, 2])).unwrap_err().to_string();
    assert!(e.contains("expected 4D input (got 2D input)"), "{e}");
}

#[test]
fn dropout_train_and_eval() {
    let mut d = Dropout::new(0.5).unwrap();
    let x = t(vec![1.0; 1000], &[1000]);
    let y = d.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let zeros = y.iter().filter(|&&v| v == 0.0).count();
    assert!((350..650).contains(&zeros), "{zeros}");
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    d.eval();
    assert_eq!(d.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 1000]);
    assert!(Dropout::new(1.5)
        .err()
        .unwrap()
        .to_string()
        .contains("dropout probability has to be between 0 and 1, but got 1.5"));
}

#[test]
fn layer_bad_input_messages() {
    let e = Conv2d::with(3, 4, 3, Conv2dOpts { groups: 2, ..Default::default() }).err().unwrap().to_string();
    assert!(e.contains("in_channels must be divisible by groups"), "{e}");
    let e = MultiheadAttention::new(10, 3, 0.0, true, false).err().unwrap().to_string();
    assert!(e.contains("embed_dim must be divisible by num_heads"), "{e}");
    let e = GroupNorm::new(3, 4).err().unwrap().to_string();
    assert!(e.contains("num_channels must be divisible by num_groups"), "{e}");
    let e = Embedding::new(4, 2, Some(7)).err().unwrap().to_string();
    assert!(e.contains("Padding_idx must be within num_embeddings"), "{e}");
    let l = Linear::new(3, 2, true).unwrap();
    let e = l.forward(&t(vec![0.0; 8], &[2, 4])).unwrap_err().to_string();
    assert!(e.starts_with("linear:"), "{e}");
    let mha = MultiheadAttention::new(4, 2, 0.0, true, false).unwrap();
    let e = mha.forward(&t(vec![0.0; 6], &[1, 2, 3])).unwrap_err().to_string();
    assert!(e.contains("expected query [L, N, 4]"), "{e}");
    let e = TransformerEncoderLayer::new(4, 2, 8, 0.0, "tanh", false, false).err().unwrap().to_string();
    assert!(e.contains("activation should be relu/gelu, not tanh"), "{e}");
    let b = Bilinear::new(2, 3, 1, true).unwrap();
    assert!(b.forward(&t(vec![0.0; 2], &[1, 2])).unwrap_err().to_string().contains("Bilinear takes two inputs"));
}

#[test]
fn attention_masks_zero_the_masked_keys() {
    let mha = MultiheadAttention::new(4, 2, 0.0, true, true).unwrap();
    let x = ferrofx_core::ops::random::randn(&[2, 3, 4], None).unwrap();
    let kpm = Tensor::from_vec(vec![false, false, true, false, true, true], &[2, 3]).unwrap();
    let (_, w) = mha.attend(&x, &x, &x, Some(&kpm), true, None).unwrap();
    let w = w.unwrap();
    assert_eq!(w.shape(), &[2, 3, 3]);
    let w = w.to_vec::<f32>().unwrap();
    for q in 0..3 {
        assert_eq!(w[q * 3 + 2], 0.0); // batch 0, key 2 masked
        assert_eq!(w[9 + q * 3 + 1], 0.0); // batch 1, keys 1 and 2 masked
        assert!((w[9 + q * 3] - 1.0).abs() < 1e-6);
    }
    // causal float mask through forward_values
    let causal = Tensor::from_vec(
        vec![0.0f32, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0, f32::NEG_INFINITY, 0.0, 0.0, 0.0],
        &[3, 3],
    )
    .unwrap();
    let out = mha
        .call_values(&[x.clone().into(), Value::None, Value::None, Value::None, true.into(), causal.into()])
        .unwrap();
    let w = out[1].as_tensor().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(w[1], 0.0);
    assert_eq!(w[2], 0.0);
    assert!((w[0] - 1.0).abs() < 1e-6);
}

#[test]
fn loss_bad_input_messages() {
    let x = t(vec![0.0; 6], &[2, 3]);
    let e = loss::mse_loss(&x, &t(vec![0.0; 3], &[3]), Reduction::Mean).unwrap_err().to_string();
    assert!(
        e.contains("Using a target size ([3]) that is different to the input size ([2, 3]) is not supported"),
        "{e}"
    );
    let e = loss::cross_entropy(&x, &Tensor::from_vec(vec![0i64, 5], &[2]).unwrap(), &CeOpts::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Target 5 is out of bounds"), "{e}");
    let e = loss::cross_entropy(&x, &Tensor::from_vec(vec![0i64, 1, 2], &[3]).unwrap(), &CeOpts::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected target of shape [2]"), "{e}");
    let e = loss::cross_entropy(
        &x,
        &Tensor::from_vec(vec![0i64, 1], &[2]).unwrap(),
        &CeOpts { label_smoothing: 2.0, ..Default::default() },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("label_smoothing must be between 0.0 and 1.0"), "{e}");
    assert!(Reduction::parse("avg").unwrap_err().to_string().contains("avg is not a valid value for reduction"));
    let e = loss::smooth_l1_loss(&x, &x, Reduction::Mean, -1.0).unwrap_err().to_string();
    assert!(e.contains("negative values for beta"), "{e}");
    // a whole batch ignored gives NaN for mean, like PyTorch
    let l = loss::cross_entropy(&x, &Tensor::from_vec(vec![-100i64, -100], &[2]).unwrap(), &CeOpts::default()).unwrap();
    assert!(l.item().unwrap().is_nan());
}

#[test]
fn optimizer_bad_arguments_and_clipping() {
    let p = t(vec![1.0, 2.0], &[2]).requires_grad_(true).unwrap();
    assert!(optim::Sgd::new(vec![p.clone()], -1.0, 0.0, 0.0, 0.0, false)
        .err()
        .unwrap()
        .to_string()
        .contains("Invalid learning rate: -1"));
    assert!(optim::Sgd::new(vec![p.clone()], 0.1, 0.0, 0.0, 0.0, true)
        .err()
        .unwrap()
        .to_string()
        .contains("Nesterov momentum requires a momentum and zero dampening"));
    assert!(optim::Adam::new(vec![p.clone()], 0.1, (1.0, 0.9), 1e-8, 0.0)
        .err()
        .unwrap()
        .to_string()
        .contains("Invalid beta parameter at index 0: 1"));
    let ip = Tensor::from_vec(vec![1i64], &[1]).unwrap();
    assert!(optim::Sgd::new(vec![ip], 0.1, 0.0, 0.0, 0.0, false)
        .err()
        .unwrap()
        .to_string()
        .contains("optimizers need floating-point parameters"));
    // a parameter without gradient is skipped
    let mut sgd = optim::Sgd::new(vec![p.clone()], 0.1, 0.9, 0.0, 0.0, false).unwrap();
    sgd.step().unwrap();
    assert_eq!(p.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    let v0 = p.version();
    p.set_grad(Some(t(vec![3.0, 4.0], &[2]))).unwrap();
    let n = clip_grad_norm_(std::slice::from_ref(&p), 1.0, 2.0).unwrap();
    assert!((n - 5.0).abs() < 1e-9);
    let g = p.grad().unwrap().to_vec::<f32>().unwrap();
    assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5);
    clip_grad_value_(std::slice::from_ref(&p), 0.7).unwrap();
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap()[1], 0.7);
    sgd.step().unwrap();
    assert!(p.version() > v0, "optimizer steps bump the version counter");
    assert!((p.to_vec::<f32>().unwrap()[1] - (2.0 - 0.07)).abs() < 1e-6);
    // load_state_dict checks the parameter count
    let sd = sgd.state_dict();
    let mut other = optim::Sgd::new(vec![p.clone(), p.clone()], 0.1, 0.9, 0.0, 0.0, false).unwrap();
    let e = other.load_state_dict(&sd).unwrap_err().to_string();
    assert!(e.contains("doesn't match the size of optimizer's group (1 vs 2)"), "{e}");
    let e = optim::OneCycleLR::new(&mut other, 0.1, 0, 0.3, 25.0, 1e4).err().unwrap().to_string();
    assert!(e.contains("Expected positive integer total_steps"), "{e}");
}

#[test]
fn zoo_models_run_and_have_torchvision_keys() {
    use ferrofx_nn::zoo::*;
    let _g = ferrofx_core::autograd::no_grad();
    let mut cnn = DigitsCnn::new().unwrap();
    cnn.eval();
    assert_eq!(cnn.forward(&t(vec![0.5; 2 * 64], &[2, 1, 8, 8])).unwrap().shape(), &[2, 10]);
    let mlp = Mlp::new(64, &[32, 16], 10).unwrap();
    assert_eq!(mlp.named_parameters().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()[4], "layers.4.weight");
    assert_eq!(mlp.forward(&t(vec![0.5; 3 * 64], &[3, 1, 8, 8])).unwrap().shape(), &[3, 10]);
    let r18 = ResNet::resnet18(1000).unwrap();
    let sd = r18.state_dict();
    assert_eq!(sd.len(), 122); // torchvision resnet18 state dict size
    assert!(sd.contains_key("layer2.0.downsample.1.running_var"));
    assert_eq!(r18.parameters().iter().map(|p| p.numel()).sum::<usize>(), 11_689_512);
    let r50 = ResNet::resnet50(1000).unwrap();
    assert_eq!(r50.state_dict().len(), 320);
    assert_eq!(r50.parameters().iter().map(|p| p.numel()).sum::<usize>(), 25_557_032);
    let mut mb = MobileNetV2::new(10, 0.5).unwrap();
    mb.eval();
    assert!(mb.state_dict().contains_key("features.1.conv.0.0.weight"));
    assert!(mb.state_dict().contains_key("features.2.conv.3.running_mean"));
    assert!(mb.state_dict().contains_key("classifier.1.weight"));
    assert_eq!(
        mb.forward(&ferrofx_core::ops::random::randn(&[1, 3, 32, 32], None).unwrap()).unwrap().shape(),
        &[1, 10]
    );
    let full = MobileNetV2::new(1000, 1.0).unwrap();
    assert_eq!(full.state_dict().len(), 314);
    assert_eq!(full.parameters().iter().map(|p| p.numel()).sum::<usize>(), 3_504_872);
    let mut tr = TransformerClassifier::new(20, 16, 2, 32, 2, 10, 3, 0.1).unwrap();
    tr.eval();
    let ids = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6, 7, 8], &[2, 4]).unwrap();
    assert_eq!(tr.forward(&ids).unwrap().shape(), &[2, 3]);
    assert!(tr.state_dict().contains_key("layers.1.self_attn.in_proj_weight"));
    let e = tr.forward(&Tensor::from_vec(vec![1i64; 11], &[1, 11]).unwrap()).unwrap_err().to_string();
    assert!(e.contains("L <= 10"), "{e}");
}

#[test]
fn optimizer_updates_in_parallel_chunks_equal_the_element_by_element_update() {
    // a parameter of 100 003 elements is updated in parallel chunks, in place; the same values
    // as 100 parameters of about 1000 elements (each one chunk) must give the same bits, for
    // states (momentum, Adam's two moments) and a gradient that aliases the parameter
    let n = 100_003usize;
    let vals: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let grads: Vec<f32> = (0..n).map(|i| ((i * 104_729) % 997) as f32 / 300.0 - 1.5).collect();
    let cuts: Vec<usize> = (0..=100).map(|k| k * n / 100).collect();
    type Make = fn(Vec<Tensor>) -> Box<dyn Optimizer>;
    let makers: [(&str, Make); 3] = [
        ("sgd", |p| Box::new(optim::Sgd::new(p, 0.1, 0.9, 0.0, 0.01, true).unwrap())),
        ("adam", |p| Box::new(optim::Adam::new(p, 0.01, (0.9, 0.999), 1e-8, 0.0).unwrap())),
        ("plain sgd", |p| Box::new(optim::Sgd::new(p, 0.05, 0.0, 0.0, 0.0, false).unwrap())),
    ];
    for (name, make) in makers {
        let big = t(vals.clone(), &[n]).requires_grad_(true).unwrap();
        let small: Vec<Tensor> = cuts
            .windows(2)
            .map(|w| t(vals[w[0]..w[1]].to_vec(), &[w[1] - w[0]]).requires_grad_(true).unwrap())
            .collect();
        let mut ob = make(vec![big.clone()]);
        let mut os = make(small.clone());
        for step in 0..3 {
            let scale = 1.0 + step as f32;
            big.set_grad(Some(t(grads.iter().map(|g| g * scale).collect(), &[n]))).unwrap();
            for (p, w) in small.iter().zip(cuts.windows(2)) {
                p.set_grad(Some(t(grads[w[0]..w[1]].iter().map(|g| g * scale).collect(), &[w[1] - w[0]]))).unwrap();
            }
            ob.step().unwrap();
            os.step().unwrap();
        }
        let joined: Vec<f32> = small.iter().flat_map(|p| p.to_vec::<f32>().unwrap()).collect();
        assert_eq!(big.to_vec::<f32>().unwrap(), joined, "{name}");
        assert_ne!(big.to_vec::<f32>().unwrap(), vals, "{name}: the step changed nothing");
    }
    // a gradient that is the parameter itself (same storage) is read before it is written
    let p = t(vals.clone(), &[n]).requires_grad_(true).unwrap();
    p.set_grad(Some(p.detach())).unwrap();
    optim::Sgd::new(vec![p.clone()], 0.5, 0.0, 0.0, 0.0, false).unwrap().step().unwrap();
    let want: Vec<f32> = vals.iter().map(|&x| (x as f64 - 0.5 * x as f64) as f32).collect();
    assert_eq!(p.to_vec::<f32>().unwrap(), want);
}
