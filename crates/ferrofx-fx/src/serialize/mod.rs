//! Traced-module files: a graph, the specs of its leaf modules and its tensors in one
//! safetensors file, loadable by a program that does not contain the model's source, without
//! executing anything from the file. The format is specified in `docs/format.md`.
//!
//! * [`graph_doc`]: the graph as plain data and back, every reference checked;
//! * [`container`]: the file: safetensors with the module document in its metadata.

pub mod container;
pub mod graph_doc;

pub use container::{
    check_declared_inputs, read_module, read_module_bytes, read_module_file, write_module_bytes, write_module_file,
    LeafDoc, ModuleDoc, SubmoduleDoc, TensorDoc, TensorKind, FORMAT, VERSION,
};
pub use graph_doc::{graph_from_doc, graph_to_doc, ArgDoc, GraphDoc, MetaDoc, NodeDoc, TensorMetaDoc};

/// Why a traced-module file cannot be written or read: one variant per kind of failure, each
/// message naming the tensor, node or field and what to do.
///
/// | variant | kind ([`ferrofx_core::ErrorKind`]) | meaning |
/// | --- | --- | --- |
/// | `Io` | `Io` | the file cannot be opened, read or written (missing, a directory, permissions) |
/// | `NotTracedModule` | `Format` | another kind of file (a plain state dict, not safetensors) |
/// | `Version` | `Format` | written by a newer ferrofx |
/// | `UnknownOp` | `Format` | calls an op this program does not register |
/// | `Invalid` | `Format` | inconsistent content: the message says what and where |
/// | `Limit` | `Limit` | over a bound of the format (nodes, nesting, sizes) |
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// Not a ferrofx traced-module file (another safetensors file, or not safetensors at all).
    #[error("not a ferrofx traced-module file: {0}")]
    NotTracedModule(String),
    /// Written by a newer ferrofx.
    #[error("the file has format version {found}, but this ferrofx reads versions up to {supported}; upgrade ferrofx")]
    Version {
        /// Version in the file.
        found: String,
        /// Newest version this build reads.
        supported: u32,
    },
    /// A `call_function` of an op this build does not have.
    #[error("node '{node}' calls the op '{op}', which is not registered in this program; register the custom op before loading")]
    UnknownOp {
        /// The node.
        node: String,
        /// The op name.
        op: String,
    },
    /// Anything else inconsistent: the message says what and where.
    #[error("invalid traced-module file: {0}")]
    Invalid(String),
    /// Over one of the format's bounds (nodes, nesting, declared sizes, tensors).
    #[error("the file exceeds a limit of the format: {0}")]
    Limit(String),
}

impl From<FormatError> for ferrofx_core::Error {
    fn from(e: FormatError) -> Self {
        use ferrofx_core::Error;
        match &e {
            FormatError::Io(m) => Error::io("traced_module", m.clone()),
            FormatError::Limit(_) => Error::limit("traced_module", e.to_string()),
            _ => Error::format("traced_module", e.to_string()),
        }
    }
}
