//! Writes the Rust source that `GraphModule::to_rust_source` emits for ResNet-18 into
//! `crates/ferrofx-fx/tests/generated/resnet18.rs`, which `tests/rust_source.rs` compiles and
//! checks (the test also checks that the committed file is what the emitter produces now).
//!
//! ```text
//! cargo run --release -p ferrofx-fx --example emit_rust_source
//! ```

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_fx::symbolic_trace;
use ferrofx_nn::zoo::ResNet;
use ferrofx_nn::Module;

fn main() -> ferrofx_core::Result<()> {
    manual_seed(0);
    let mut m = ResNet::resnet18(1000)?;
    m.eval();
    let gm = symbolic_trace(&m)?;
    let x = randn(&[1, 3, 64, 64], None)?;
    let src = gm.to_rust_source("ResNet18", &[x.into()])?;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/generated/resnet18.rs");
    std::fs::write(path, &src.code).map_err(|e| ferrofx_core::Error::io("emit_rust_source", format!("{path}: {e}")))?;
    println!("wrote {path} ({} lines, {} weights)", src.code.lines().count(), src.weights.len());
    Ok(())
}
