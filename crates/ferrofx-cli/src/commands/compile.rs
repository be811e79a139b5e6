//! `ferrofx compile FILE -o OUT`: compile a traced-module file for given input shapes (fusion,
//! memory planning) and save the optimised module; `ferrofx show --fused FILE` lists the fused
//! groups of a file and why neighbouring nodes were not fused. Also the main job's
//! before/after timing of compilation.

use super::CliResult;
use ferrofx_compile::{compile, plan_fusion, CompileOptions};
use ferrofx_core::{DType, Tensor, Value};
use ferrofx_fx::{Argument, GraphModule, Opcode, ShapeProp};
use ferrofx_nn::Module;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `ferrofx compile`.
#[derive(clap::Args)]
pub struct CompileArgs {
    /// A traced-module file.
    pub file: PathBuf,
    /// Where to write the compiled module.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Shape of a float32 input, comma-separated (`1,3,224,224`); once per input, in order.
    /// Default: the shapes recorded in the file when it was traced with example inputs.
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
}

fn parse_shape(s: &str) -> CliResult<Vec<usize>> {
    s.split(',')
        .map(|d| {
            d.trim().parse::<usize>().map_err(|_| format!("bad --shape '{s}': expected sizes like 1,3,224,224").into())
        })
        .collect()
}

/// The example inputs: from `--shape`, or from the placeholders' recorded metadata.
fn example_inputs(gm: &GraphModule, shapes: &[String]) -> CliResult<Vec<Value>> {
    let placeholders: Vec<_> = gm.graph().iter().filter(|n| n.op() == Opcode::Placeholder).collect();
    if !shapes.is_empty() {
        if shapes.len() != placeholders.len() {
            return Err(format!(
                "the module takes {} inputs, got {} --shape options",
                placeholders.len(),
                shapes.len()
            )
            .into());
        }
        return shapes
            .iter()
            .map(|s| Ok(Value::Tensor(ferrofx_core::ops::kernel::zeros(&parse_shape(s)?, DType::F32)?)))
            .collect();
    }
    placeholders
        .iter()
        .map(|p| match &p.meta().tensor_meta {
            Some(m) => Ok(Value::Tensor(ferrofx_core::ops::kernel::zeros(&m.shape, m.dtype)?)),
            None => Err(format!(
                "input '{}' has no recorded shape in the file; pass --shape (e.g. --shape 1,3,224,224) once per input",
                p.name()
            )
            .into()),
        })
        .collect()
}

/// Runs `ferrofx compile`.
pub fn run(a: &CompileArgs) -> CliResult<()> {
    let mut gm = GraphModule::load(&a.file).map_err(|e| format!("cannot load {}: {e}", a.file.display()))?;
    gm.eval();
    let inputs = example_inputs(&gm, &a.shapes)?;
    let t = Instant::now();
    let c = compile(&gm, &inputs, CompileOptions::default())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let spec = c.latest().ok_or("compile produced no specialisation")?;
    spec.module.save(&a.output).map_err(|e| format!("cannot write {}: {e}", a.output.display()))?;
    println!(
        "compiled {} in {ms:.1} ms: {} -> {} nodes, {} fused groups; memory: {}",
        a.file.display(),
        gm.graph().len(),
        spec.module.graph().len(),
        spec.fusion.groups.len(),
        spec.memory
    );
    println!("wrote {}", a.output.display());
    Ok(())
}

/// `show --fused`: every fused node with its expression and inputs, then the fusion planner's
/// reasons for the neighbours it left out.
pub fn show_fused(gm: &GraphModule) -> CliResult<()> {
    let mut n = 0;
    for node in gm.graph().iter() {
        if node.op() != Opcode::CallFunction || node.target().name() != ferrofx_core::ops::fused::FUSED_ELEMENTWISE.name
        {
            continue;
        }
        n += 1;
        let inputs: Vec<String> = match node.args().first() {
            Some(Argument::List(items)) => items
                .iter()
                .map(|a| a.as_node().and_then(|i| gm.graph().node(i).ok()).map_or("?".into(), |x| x.name().to_string()))
                .collect(),
            _ => vec![],
        };
        let expr = match node.args().get(1) {
            Some(Argument::Str(s)) => s.to_string(),
            _ => "?".into(),
        };
        println!("%{} reads ({})\n    {expr}", node.name(), inputs.join(", "));
    }
    println!("{n} fused node(s)");
    // the planner's view of what is left: groups it would still make and why it stops
    let mut g = GraphModule::from_bytes(&gm.to_bytes()?)?;
    let has_meta = g.graph().iter().any(|n| n.meta().tensor_meta.is_some());
    if !has_meta {
        let inputs = example_inputs(&g, &[]);
        match inputs {
            Ok(inputs) => {
                ShapeProp::propagate(&mut g, &inputs)?;
            }
            Err(e) => {
                println!("(no shapes recorded: cannot explain the boundaries: {e})");
                return Ok(());
            }
        }
    }
    let plan = plan_fusion(g.graph())?;
    if !plan.groups.is_empty() {
        println!("{} more group(s) would fuse (run `ferrofx compile`)", plan.groups.len());
    }
    for b in &plan.boundaries {
        println!("not fused: {} -> {}: {}", b.node, b.root, b.reason);
    }
    Ok(())
}

/// The main job's before/after: median time of `gm` and of `compile(gm)` over `images`
/// (ms), and a one-line summary of what compile did.
pub fn time_before_after(gm: &GraphModule, images: &Tensor) -> CliResult<(f64, f64, String)> {
    let _g = ferrofx_core::autograd::no_grad();
    let c = compile(gm, &[images.into()], CompileOptions::default())?;
    let spec = c.latest().ok_or("compile produced no specialisation")?;
    let time = |f: &dyn Fn() -> ferrofx_core::Result<Tensor>| -> CliResult<f64> {
        f()?;
        let mut v = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        v.sort_by(f64::total_cmp);
        Ok(v[v.len() / 2])
    };
    let before = time(&|| gm.forward(images))?;
    let after = time(&|| c.forward(images))?;
    let a = gm.forward(images)?.to_vec::<f32>()?;
    let b = c.forward(images)?.to_vec::<f32>()?;
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let what = format!(
        "{} fused groups, planned arena {:.2} MiB, max |difference| {worst:.2e}",
        spec.fusion.groups.len(),
        spec.memory.arena_bytes as f64 / (1 << 20) as f64
    );
    Ok((before, after, what))
}
