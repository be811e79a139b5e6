//! Acceptance 4: the Rust source emitted for ResNet-18 compiles (it is part of this test
//! crate) and reproduces the GraphModule's outputs from the weights file written beside it.

#[rustfmt::skip]
#[path = "generated/resnet18.rs"]
mod resnet18;

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::Value;
use ferrofx_fx::symbolic_trace;
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;

#[test]
fn emitted_resnet18_compiles_and_matches_the_graph_module() {
    manual_seed(0);
    let mut m = ResNet::resnet18(1000).unwrap();
    m.eval();
    let gm = symbolic_trace(&m).unwrap();
    let x = randn(&[1, 3, 64, 64], None).unwrap();
    let src = gm.to_rust_source("ResNet18", &[x.clone().into()]).unwrap();
    let committed = include_str!("generated/resnet18.rs");
    assert!(
        src.code == committed,
        "tests/generated/resnet18.rs is stale: run `cargo run --release -p ferrofx-fx --example emit_rust_source`"
    );
    // Every value is dropped after its last use, like GraphModule::code.
    assert!(src.code.contains("drop((x, conv1_weight));"), "{}", &src.code[..2000.min(src.code.len())]);
    let dir = std::env::temp_dir().join(format!("ferrofx_rust_source_{}", std::process::id()));
    src.write(&dir, "resnet18").unwrap();
    let generated = resnet18::ResNet18::load(dir.join("resnet18.safetensors")).unwrap();
    let _ng = ferrofx_core::autograd::no_grad();
    let want = gm.forward(&x).unwrap();
    let got = generated.forward(&[Value::Tensor(x.clone())]).unwrap();
    let got = got[0].as_tensor().unwrap();
    assert_eq!(got.shape(), &[1, 1000]);
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    // Missing inputs are an error, not a panic.
    assert!(generated.forward(&[]).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
