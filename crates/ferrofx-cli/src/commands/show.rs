//! `ferrofx show FILE`: a saved traced module's graph, as FX prints it, as MegEngine's expression
//! view (`--exprs`), as a table with FLOPs and activation memory per node, as FLOPs per module, as code, or as a
//! summary. Every view starts with the inputs and outputs the module expects (names, shapes,
//! dtypes).

use super::CliResult;
use ferrofx_nn::Module;
use std::path::PathBuf;

/// What `show` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum View {
    /// The graph, as torch.fx prints it.
    Graph,
    /// One row per node: opcode, name, target, args, shape, dtype, FLOPs, output bytes.
    Tabular,
    /// FLOPs and activation memory per module (each module includes its submodules).
    Flops,
    /// The execution plan as code, with the frees.
    Code,
    /// Parameters and per-node shapes summary.
    Summary,
    /// The expression view (MegEngine's `InternalGraph`: `%id: name = expr`).
    Exprs,
}

/// Arguments of `ferrofx show`.
#[derive(clap::Args)]
pub struct ShowArgs {
    /// A traced-module file (written by `ferrofx demo`, `convert` or `GraphModule::save`).
    pub file: PathBuf,
    /// What to print.
    #[arg(long, value_enum, default_value = "graph")]
    pub view: View,
    /// Print the expression view (same as `--view exprs`).
    #[arg(long)]
    pub exprs: bool,
    /// List the fused groups and why neighbouring nodes were not fused.
    #[arg(long)]
    pub fused: bool,
}

/// Runs `ferrofx show`.
pub fn run(a: &ShowArgs) -> CliResult<()> {
    let gm = super::module_io::load_module(&a.file)?;
    if a.fused {
        return super::compile::show_fused(&gm);
    }
    let view = if a.exprs { View::Exprs } else { a.view };
    // what the module expects and returns comes first: it is what a user needs to run it
    println!("{}: traced from {}", a.file.display(), gm.traced_type_name());
    print!("{}", super::module_io::describe_io(&gm));
    println!();
    match view {
        View::Graph => println!("{gm}"),
        View::Exprs => println!("{}", gm.internal_graph()),
        View::Code => println!("{}", gm.print_readable()?),
        View::Tabular => print!("{}", ferrofx_fx::passes::analysis::tabular(&gm)?),
        View::Flops => {
            let stats = ferrofx_fx::passes::analysis::node_stats(&gm)?;
            let per = ferrofx_fx::passes::analysis::module_stats(&stats);
            println!("{:<32} {:>14} {:>16}", "module", "FLOPs", "activation bytes");
            for (path, (flops, bytes)) in &per {
                let name = if path.is_empty() { "(all)" } else { path.as_str() };
                println!("{name:<32} {flops:>14} {bytes:>16}");
            }
        }
        View::Summary => {
            let params: usize = gm.parameters().iter().map(|p| p.numel()).sum();
            println!("traced from      {}", gm.traced_type_name());
            println!("nodes            {}", gm.graph().len());
            println!("leaf modules     {}", gm.leaf_modules().len());
            println!("parameters       {params}");
            println!("state dict keys  {}", gm.state_dict().len());
        }
    }
    Ok(())
}
