//! `ferrofx show FILE`: a saved traced module's graph, as FX prints it, as MegEngine's expression
//! view (`--exprs`), as a table, as code, or with its work (MACs per op and parameters).

use super::CliResult;
use ferrofx_fx::GraphModule;
use ferrofx_nn::Module;
use std::path::PathBuf;

/// What `show` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum View {
    /// The graph, as torch.fx prints it.
    Graph,
    /// One row per node: opcode, name, target, args, shape, dtype.
    Tabular,
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
}

/// Runs `ferrofx show`.
pub fn run(a: &ShowArgs) -> CliResult<()> {
    let gm = GraphModule::load(&a.file).map_err(|e| format!("cannot load {}: {e}", a.file.display()))?;
    let view = if a.exprs { View::Exprs } else { a.view };
    match view {
        View::Graph => println!("{gm}"),
        View::Exprs => println!("{}", gm.internal_graph()),
        View::Code => println!("{}", gm.print_readable()?),
        View::Tabular => {
            println!("{:<14} {:<16} {:<22} {:<40} {:<20} dtype", "opcode", "name", "target", "args", "shape");
            for n in gm.graph().iter() {
                let (shape, dtype) = n
                    .meta()
                    .tensor_meta
                    .as_ref()
                    .map(|m| (format!("{:?}", m.shape), m.dtype.name().to_string()))
                    .unwrap_or_default();
                let args = format!("{:?}", n.args().iter().map(|x| format!("{x:?}")).collect::<Vec<_>>());
                println!(
                    "{:<14} {:<16} {:<22} {:<40} {:<20} {}",
                    n.op().as_str(),
                    n.name(),
                    n.target().name(),
                    truncate(&args, 40),
                    shape,
                    dtype
                );
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

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}
