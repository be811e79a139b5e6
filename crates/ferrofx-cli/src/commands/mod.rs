//! One file per subcommand.

pub mod bench;
pub mod compile;
pub mod convert;
pub mod demo;
pub mod draw;
pub mod module_io;
pub mod onnx;
pub mod quantize;
pub mod run;
pub mod show;
pub mod train;
pub mod train_distributed;

/// Errors of the CLI: the library's errors plus file-system and argument problems, each already
/// phrased for the user.
pub type CliResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;
