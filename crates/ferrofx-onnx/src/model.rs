//! Reading a `ModelProto` from a file or bytes, with the checks a user-supplied file needs.
//!
//! prost decodes the protobuf (no hand-written wire parser). Its decoder allocates only for
//! bytes present in the input (every length prefix is checked against the remaining buffer)
//! and stops nested messages at a recursion depth of 100, so a corrupt or hostile file is an
//! `Err`, with memory bounded by the file's size; [`ModelFile::check`] then bounds what the
//! importer would allocate from declared sizes and the depth of nested graphs.

use crate::proto::{GraphProto, ModelProto};
use crate::tensor_proto::ExternalDataDir;
use ferrofx_core::{Error, Result};
use prost::Message;
use std::path::Path;

/// The deepest nesting of subgraphs (`If`/`Loop` bodies) accepted.
pub const MAX_GRAPH_DEPTH: usize = 32;

/// The largest model file read (2 GiB: protobuf's own limit; weights beyond go in external
/// data files).
pub const MAX_FILE_BYTES: u64 = 2 << 30;

/// A decoded ONNX model and the folder its external data may come from.
#[derive(Clone, Debug)]
pub struct ModelFile {
    /// The decoded model.
    pub model: ModelProto,
    /// The model's own folder (external data is read only from there).
    pub dir: ExternalDataDir,
    /// The default-domain opset the model imports.
    pub opset: i64,
}

impl ModelFile {
    /// Reads and decodes `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<ModelFile> {
        let path = path.as_ref();
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| Error::io("onnx", format!("{shown}: {e}")))?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(Error::io(
                "onnx",
                format!(
                    "{shown}: {} bytes is over protobuf's 2 GiB limit; store the weights as external data",
                    meta.len()
                ),
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io("onnx", format!("{shown}: {e}")))?;
        let dir =
            path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p }).map(Path::to_path_buf);
        Self::decode(&bytes, ExternalDataDir(dir)).map_err(|e| e.with_context(&format!("{shown}")))
    }

    /// Decodes a model from bytes (external data is refused: there is no folder).
    pub fn from_bytes(bytes: &[u8]) -> Result<ModelFile> {
        Self::decode(bytes, ExternalDataDir(None))
    }

    fn decode(bytes: &[u8], dir: ExternalDataDir) -> Result<ModelFile> {
        if bytes.is_empty() {
            return Err(Error::io("onnx", "the file is empty (not an ONNX model)"));
        }
        let model = ModelProto::decode(bytes).map_err(|e| {
            let e = e.to_string();
            if e.contains("recursion limit") {
                Error::io(
                    "onnx",
                    "messages are nested too deep (subgraphs nested more than prost's recursion limit of 100); refused",
                )
            } else {
                Error::io(
                    "onnx",
                    format!("not a valid ONNX model (protobuf decoding failed: {e}); is the file truncated?"),
                )
            }
        })?;
        let opset = model
            .opset_import
            .iter()
            .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
            .and_then(|o| o.version)
            .unwrap_or(0);
        let f = ModelFile { model, dir, opset };
        f.check()?;
        Ok(f)
    }

    /// Structural checks: a graph is present, the opset is one the importer knows, nested
    /// graphs are not deeper than [`MAX_GRAPH_DEPTH`].
    pub fn check(&self) -> Result<()> {
        let g = self.model.graph.as_ref().ok_or_else(|| Error::io("onnx", "the model has no graph"))?;
        if self.opset == 0 {
            return Err(Error::io("onnx", "the model imports no default-domain opset (opset_import is empty)"));
        }
        if !(1..=crate::MAX_OPSET).contains(&self.opset) {
            return Err(Error::io(
                "onnx",
                format!("opset {} is not supported (ferrofx reads opsets 1 to {})", self.opset, crate::MAX_OPSET),
            ));
        }
        check_depth(g, 0)
    }

    /// The main graph.
    pub fn graph(&self) -> Result<&GraphProto> {
        self.model.graph.as_ref().ok_or_else(|| Error::io("onnx", "the model has no graph"))
    }
}

fn check_depth(g: &GraphProto, depth: usize) -> Result<()> {
    if depth > MAX_GRAPH_DEPTH {
        return Err(Error::io(
            "onnx",
            format!(
                "subgraphs are nested more than {MAX_GRAPH_DEPTH} deep (graph `{}`)",
                g.name.as_deref().unwrap_or("")
            ),
        ));
    }
    for n in &g.node {
        for a in &n.attribute {
            if let Some(sub) = &a.g {
                check_depth(sub, depth + 1)?;
            }
            for sub in &a.graphs {
                check_depth(sub, depth + 1)?;
            }
        }
    }
    Ok(())
}
