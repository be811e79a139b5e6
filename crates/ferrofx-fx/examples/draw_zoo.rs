//! Draws a zoo model's traced graph (FX's `FxGraphDrawer`): traced with an example input so the
//! edges carry shapes, then written as Graphviz DOT (with one cluster per top-level module) or
//! as SVG laid out in-process.
//!
//! ```text
//! cargo run --release -p ferrofx-fx --example draw_zoo -- resnet18 -o resnet18.svg
//! cargo run --release -p ferrofx-fx --example draw_zoo -- resnet50 -o resnet50.dot
//! ```
//!
//! Models: `mlp`, `digits-cnn`, `resnet18`, `resnet50`, `mobilenet-v2`. For a saved traced
//! module use the CLI: `ferrofx draw FILE.fxm -o FILE.svg`.

use ferrofx_core::ops::random::{manual_seed, randn};
use ferrofx_core::{Result, Value};
use ferrofx_fx::passes::draw::{to_dot, to_svg};
use ferrofx_fx::trace_with_inputs;
use ferrofx_nn::zoo::{DigitsCnn, Mlp, MobileNetV2, ResNet};
use ferrofx_nn::Module;

fn model(name: &str) -> Result<(Box<dyn Module>, Vec<i64>)> {
    let image = vec![1, 3, 224, 224];
    Ok(match name {
        "mlp" => (Box::new(Mlp::new(64, &[32, 16], 10)?), vec![1, 64]),
        "digits-cnn" => (Box::new(DigitsCnn::new()?), vec![1, 1, 8, 8]),
        "resnet18" => (Box::new(ResNet::resnet18(1000)?), image),
        "resnet50" => (Box::new(ResNet::resnet50(1000)?), image),
        "mobilenet-v2" => (Box::new(MobileNetV2::new(1000, 1.0)?), image),
        other => {
            return Err(ferrofx_core::Error::argument(
                "draw_zoo",
                format!("unknown model '{other}' (mlp, digits-cnn, resnet18, resnet50, mobilenet-v2)"),
            ))
        }
    })
}

fn run() -> std::result::Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: draw_zoo MODEL -o OUT.svg|OUT.dot";
    let name = args.first().ok_or(usage)?;
    let out = match args.iter().position(|a| a == "-o" || a == "--out") {
        Some(i) => args.get(i + 1).ok_or(usage)?.clone(),
        None => return Err(usage.into()),
    };
    manual_seed(0);
    let (mut m, shape) = model(name).map_err(|e| e.to_string())?;
    m.eval();
    let x = randn(&shape, None).map_err(|e| e.to_string())?;
    let gm = trace_with_inputs(m.as_ref(), &[Value::Tensor(x)]).map_err(|e| e.to_string())?;
    let text = if out.ends_with(".dot") {
        to_dot(gm.graph(), name)
    } else if out.ends_with(".svg") {
        to_svg(gm.graph(), name).map_err(|e| e.to_string())?
    } else {
        return Err(format!("{out}: the output must end in .svg or .dot"));
    };
    std::fs::write(&out, text).map_err(|e| format!("cannot write {out}: {e}"))?;
    println!("wrote {out} ({} nodes)", gm.graph().len());
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
