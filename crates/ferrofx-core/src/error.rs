//! The one error type of ferrofx-core.
//!
//! Every error names the op (or component) it comes from, what was wrong (shapes, dtypes,
//! values) and, where possible, what the caller should do instead.

use std::fmt;

/// What kind of mistake an [`Error`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Shapes do not fit together (broadcasting, matmul inner dims, view sizes, ...).
    Shape,
    /// A dtype is not supported by the op or two dtypes cannot be combined.
    DType,
    /// An index or dimension is out of range.
    Index,
    /// Any other invalid argument value (negative size, bad padding mode, ...).
    Argument,
    /// No op with that name is registered, or an op was called with the wrong schema.
    Schema,
    /// Autograd failures (version counter, freed graph, non-scalar backward, ...).
    Autograd,
    /// Symbolic tracing failures (data-dependent control flow, ...).
    Trace,
    /// Input/output errors (a file cannot be opened, read or written).
    Io,
    /// A file's content is invalid: not the expected format, an unsupported version, or
    /// inconsistent data.
    Format,
    /// A resource limit: an allocation or a plan's peak memory over the allowed bytes.
    Limit,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::Shape => "shape error",
            ErrorKind::DType => "dtype error",
            ErrorKind::Index => "index error",
            ErrorKind::Argument => "invalid argument",
            ErrorKind::Schema => "schema error",
            ErrorKind::Autograd => "autograd error",
            ErrorKind::Trace => "trace error",
            ErrorKind::Io => "io error",
            ErrorKind::Format => "invalid file",
            ErrorKind::Limit => "resource limit",
        };
        f.write_str(s)
    }
}

/// An error from ferrofx: the op (or component) that failed, the kind, and a message that says
/// what was received, what was expected and how to fix it.
///
/// ```
/// use ferrofx_core::{Error, ErrorKind};
/// let e = Error::shape("matmul", "inner dimensions differ: [2, 3] @ [4, 5]");
/// assert_eq!(e.kind(), ErrorKind::Shape);
/// assert_eq!(e.to_string(), "matmul: shape error: inner dimensions differ: [2, 3] @ [4, 5]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    op: String,
    message: String,
}

impl Error {
    /// A new error of `kind` raised by `op`.
    pub fn new(kind: ErrorKind, op: impl Into<String>, message: impl Into<String>) -> Self {
        Error { kind, op: op.into(), message: message.into() }
    }
    /// A [`ErrorKind::Shape`] error.
    pub fn shape(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Shape, op, message)
    }
    /// A [`ErrorKind::DType`] error.
    pub fn dtype(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DType, op, message)
    }
    /// A [`ErrorKind::Index`] error.
    pub fn index(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Index, op, message)
    }
    /// A [`ErrorKind::Argument`] error.
    pub fn argument(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Argument, op, message)
    }
    /// A [`ErrorKind::Schema`] error.
    pub fn schema(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Schema, op, message)
    }
    /// A [`ErrorKind::Autograd`] error.
    pub fn autograd(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Autograd, op, message)
    }
    /// A [`ErrorKind::Trace`] error.
    pub fn trace(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Trace, op, message)
    }
    /// A [`ErrorKind::Io`] error.
    pub fn io(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Io, op, message)
    }
    /// A [`ErrorKind::Format`] error.
    pub fn format(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Format, op, message)
    }
    /// A [`ErrorKind::Limit`] error.
    pub fn limit(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Limit, op, message)
    }
    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The op or component that raised it.
    pub fn op(&self) -> &str {
        &self.op
    }
    /// The message without the op prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The same error with `context` appended to its message (where it happened: a graph node,
    /// a file).
    pub fn with_context(mut self, context: &str) -> Self {
        self.message = format!("{} ({context})", self.message);
        self
    }
    /// The same error re-attributed to `op` (used when an op is implemented with other ops).
    pub fn in_op(mut self, op: &str) -> Self {
        if self.op != op {
            self.message = format!("{} (inside {})", self.message, self.op);
            self.op = op.to_string();
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.op, self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with ferrofx's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
