//! `ferrofx draw FILE -o OUT`: the graph of a traced-module file as Graphviz DOT or SVG (drawn
//! in-process; no `dot` program needed). The format follows the output's extension.

use super::CliResult;
use ferrofx_fx::passes::draw::{to_dot, to_svg};
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
    let gm = super::module_io::load_module(&a.file)?;
    super::module_io::refuse_overwriting_inputs(&a.out, &[&a.file])?;
    super::module_io::check_output_path(&a.out)?;
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
    ferrofx_core::atomic_file::write_atomic_bytes("draw", &a.out, text.as_bytes())?;
    println!("wrote {}", a.out.display());
    Ok(())
}
