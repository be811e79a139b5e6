//! `ferrofx draw FILE -o OUT`: the graph of a traced-module file as Graphviz DOT or SVG (drawn
//! in-process; no `dot` program needed). The format follows the output's extension.

use super::CliResult;
use ferrofx_fx::passes::draw::{to_dot, to_svg};
use ferrofx_fx::GraphModule;
use std::path::PathBuf;

/// Arguments of `ferrofx draw`.
#[derive(clap::Args)]
pub struct DrawArgs {
    /// A traced-module file.
    pub file: PathBuf,
    /// Output file: `.dot` or `.svg`.
    #[arg(long, short)]
    pub out: PathBuf,
}

/// Runs `ferrofx draw`.
pub fn run(a: &DrawArgs) -> CliResult<()> {
    let gm = GraphModule::load(&a.file).map_err(|e| format!("cannot load {}: {e}", a.file.display()))?;
    let name = gm.traced_type_name().to_string();
    let text = match a.out.extension().and_then(|e| e.to_str()) {
        Some("dot") => to_dot(gm.graph(), &name),
        Some("svg") => to_svg(gm.graph(), &name)?,
        other => {
            return Err(format!(
                "cannot tell the drawing format from the extension {:?} of {}: use .dot or .svg",
                other.unwrap_or(""),
                a.out.display()
            )
            .into())
        }
    };
    std::fs::write(&a.out, text).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    println!("wrote {}", a.out.display());
    Ok(())
}
