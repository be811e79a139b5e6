//! The traced-module file: a safetensors file whose tensors are the module's parameters,
//! buffers and constants, and whose metadata holds `ferrofx.format`, `ferrofx.version` and the
//! module document (`ferrofx.module`, JSON): the graph, the leaf module specs and the declared
//! tensors. Any safetensors reader can read the weights.
//!
//! ```
//! use ferrofx_fx::serialize::{read_module_bytes, write_module_bytes, graph_to_doc, ModuleDoc};
//! use ferrofx_fx::{Graph, Target};
//! let mut g = Graph::new();
//! let x = g.placeholder("x").unwrap();
//! g.output(x.into()).unwrap();
//! let doc = ModuleDoc::new("Identity", true, graph_to_doc(&g).unwrap());
//! let bytes = write_module_bytes(&doc, &Default::default()).unwrap();
//! let (back, tensors) = read_module_bytes(&bytes).unwrap();
//! assert_eq!(back, doc);
//! assert!(tensors.is_empty());
//! ```

use super::graph_doc::{tensor_meta_from_doc, GraphDoc, TensorMetaDoc, MAX_RANK};
use super::FormatError;
use ferrofx_nn::spec::ModuleSpec;
use ferrofx_nn::StateDict;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Value of the `ferrofx.format` metadata key.
pub const FORMAT: &str = "ferrofx.traced_module";
/// The format version this build writes (and the newest it reads).
pub const VERSION: u32 = 1;
/// Largest module document accepted (bytes of JSON).
pub const MAX_DOC_BYTES: usize = 64 << 20;

/// What a declared tensor is to its module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A trainable parameter.
    Parameter,
    /// A buffer (running statistics ...).
    Buffer,
    /// A constant captured while tracing (`_tensor_constant0`).
    Constant,
}

/// A tensor the module owns, by qualified path (`layer1.0.conv1.weight`); its data is the
/// safetensors entry of the same name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorDoc {
    /// Qualified path.
    pub path: String,
    /// Parameter, buffer or constant.
    pub kind: TensorKind,
    /// PyTorch dtype name.
    pub dtype: String,
    /// Sizes.
    pub shape: Vec<u64>,
    /// Whether the parameter requires grad.
    #[serde(default)]
    pub requires_grad: bool,
}

/// A leaf module (`call_module` target) at a qualified path, rebuilt from its spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeafDoc {
    /// Qualified path (`layer1.0.conv1`).
    pub path: String,
    /// Type and configuration.
    pub spec: ModuleSpec,
}

/// The module document stored under `ferrofx.module`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleDoc {
    /// What wrote the file (`ferrofx 0.1.0`).
    pub producer: String,
    /// The traced module's type name (informational: no code is looked up by it).
    pub type_name: String,
    /// Training mode of the root.
    pub training: bool,
    /// The graph.
    pub graph: GraphDoc,
    /// Leaf modules.
    #[serde(default)]
    pub leaves: Vec<LeafDoc>,
    /// Declared tensors.
    #[serde(default)]
    pub tensors: Vec<TensorDoc>,
    /// Declared inputs: the targets of the graph's `placeholder` nodes, in order. When present,
    /// the graph must have exactly these placeholders ([`check_declared_inputs`]); files
    /// without the field (written before it existed) are read without the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<String>>,
    /// Nested traced modules (module-preserving tracing), each `call_module` target of this
    /// graph that is itself a traced module. Their tensors are declared in the root document
    /// under `<path>.<tensor path>` (nested documents declare none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub submodules: Vec<SubmoduleDoc>,
}

/// A nested traced module at a path (relative to the module that calls it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmoduleDoc {
    /// Path in the parent (`block1`).
    pub path: String,
    /// Its own graph, leaves and nested modules.
    pub module: ModuleDoc,
}

impl ModuleDoc {
    /// A document with no leaves or tensors yet.
    pub fn new(type_name: &str, training: bool, graph: GraphDoc) -> ModuleDoc {
        ModuleDoc {
            producer: format!("ferrofx {}", env!("CARGO_PKG_VERSION")),
            type_name: type_name.to_string(),
            training,
            graph,
            leaves: vec![],
            tensors: vec![],
            inputs: None,
            submodules: vec![],
        }
    }

    /// The document's graph's inputs: the targets of its `placeholder` nodes, in order (what
    /// a writer declares in [`ModuleDoc::inputs`]).
    pub fn placeholder_targets(&self) -> Vec<String> {
        self.graph.nodes.iter().filter(|n| n.op == "placeholder").map(|n| n.target.clone()).collect()
    }
}

/// The format's input rule (`docs/format.md`): when a document declares its inputs, its graph
/// has a placeholder for every declared input and none other, in the declared order. `module`
/// names the module in errors (`the module`, `nested module 'block1'`).
pub fn check_declared_inputs(doc: &ModuleDoc, module: &str) -> Result<(), FormatError> {
    let Some(declared) = &doc.inputs else { return Ok(()) };
    let found = doc.placeholder_targets();
    if let Some(missing) = declared.iter().find(|d| !found.contains(*d)) {
        return Err(FormatError::Invalid(format!(
            "{module} declares the input '{missing}', but its graph has no placeholder for it (placeholders: {found:?}); \
             the graph cannot receive that input"
        )));
    }
    if let Some(extra) = found.iter().find(|f| !declared.contains(*f)) {
        return Err(FormatError::Invalid(format!(
            "{module}'s graph has the placeholder '{extra}', which is not among the declared inputs {declared:?}; \
             a caller following the declaration could not feed it"
        )));
    }
    if &found != declared {
        return Err(FormatError::Invalid(format!(
            "{module} declares the inputs {declared:?}, but its graph's placeholders are {found:?} (another order, or repeated)"
        )));
    }
    Ok(())
}

/// The safetensors metadata of a module document, after checking that `tensors` holds exactly
/// the declared tensors with their declared dtypes and shapes.
fn module_metadata(doc: &ModuleDoc, tensors: &StateDict) -> Result<HashMap<String, String>, FormatError> {
    check_tensors(doc, |p| tensors.get(p).map(|t| (t.dtype().name().to_string(), t.shape().to_vec())), tensors.len())?;
    let json =
        serde_json::to_string(doc).map_err(|e| FormatError::Invalid(format!("cannot encode the module: {e}")))?;
    Ok(HashMap::from([
        ("ferrofx.format".to_string(), FORMAT.to_string()),
        ("ferrofx.version".to_string(), VERSION.to_string()),
        ("ferrofx.module".to_string(), json),
    ]))
}

/// Serializes a module document and its tensors (keyed by the paths the document declares).
/// Every declared tensor must be given with its declared dtype and shape, and nothing else.
pub fn write_module_bytes(doc: &ModuleDoc, tensors: &StateDict) -> Result<Vec<u8>, FormatError> {
    let meta = module_metadata(doc, tensors)?;
    ferrofx_nn::state_dict_to_bytes(tensors, Some(meta)).map_err(|e| FormatError::Io(e.to_string()))
}

/// Writes the same bytes as [`write_module_bytes`] to a file, streaming each tensor from its
/// storage to the file (the weights are not copied into an intermediate buffer).
pub fn write_module_file(doc: &ModuleDoc, tensors: &StateDict, path: &std::path::Path) -> Result<(), FormatError> {
    let meta = module_metadata(doc, tensors)?;
    ferrofx_nn::save_state_dict_with_metadata(tensors, Some(meta), path).map_err(|e| FormatError::Io(e.to_string()))
}

fn check_tensors(
    doc: &ModuleDoc,
    get: impl Fn(&str) -> Option<(String, Vec<usize>)>,
    available: usize,
) -> Result<(), FormatError> {
    let mut seen = std::collections::HashSet::with_capacity(doc.tensors.len());
    for t in &doc.tensors {
        if !seen.insert(t.path.as_str()) {
            return Err(FormatError::Invalid(format!("tensor '{}' is declared twice", t.path)));
        }
        if t.shape.len() > MAX_RANK {
            return Err(FormatError::Limit(format!("tensor '{}' has rank {} > {MAX_RANK}", t.path, t.shape.len())));
        }
        let declared = tensor_meta_from_doc(
            &TensorMetaDoc {
                shape: t.shape.clone(),
                dtype: t.dtype.clone(),
                strides: vec![0; t.shape.len()],
                requires_grad: false,
            },
            &format!("tensor '{}'", t.path),
        )?;
        let (dtype, shape) = get(&t.path)
            .ok_or_else(|| FormatError::Invalid(format!("tensor '{}' is declared but its data is missing", t.path)))?;
        if dtype != t.dtype || shape != declared.shape {
            return Err(FormatError::Invalid(format!(
                "tensor '{}' is declared as {} {:?} but the data is {dtype} {shape:?}",
                t.path, t.dtype, t.shape
            )));
        }
    }
    if available != doc.tensors.len() {
        return Err(FormatError::Invalid(format!(
            "the file holds {available} tensors but declares {}; undeclared tensors are not allowed",
            doc.tensors.len()
        )));
    }
    Ok(())
}

/// Parses a traced-module file: checks the format tag and version, decodes the module
/// document, and checks that the stored tensors are exactly the declared ones (names, dtypes,
/// shapes). The graph itself is checked by [`super::graph_from_doc`]; leaf specs by
/// [`ferrofx_nn::spec::build_builtin`].
pub fn read_module_bytes(bytes: &[u8]) -> Result<(ModuleDoc, StateDict), FormatError> {
    let mut r = bytes;
    read_module(&mut r, bytes.len() as u64)
}

/// Reads a traced-module file (validated as [`read_module_bytes`] does), each tensor straight
/// from the file into its own buffer.
pub fn read_module_file(path: &std::path::Path) -> Result<(ModuleDoc, StateDict), FormatError> {
    let (mut r, len) = ferrofx_nn::open_for_reading(path).map_err(|e| FormatError::Io(e.message().to_string()))?;
    read_module(&mut r, len)
}

/// Reads a traced module from a stream of `total_len` bytes: header and document first (so a
/// file that is not a traced module is rejected before any weight is read), then the tensors.
pub fn read_module<R: std::io::Read>(r: &mut R, total_len: u64) -> Result<(ModuleDoc, StateDict), FormatError> {
    let header = ferrofx_nn::read_safetensors_header(r, total_len).map_err(|e| {
        FormatError::Invalid(format!(
            "the file is truncated or corrupt, or not safetensors ({})",
            e.message().trim_start_matches("invalid safetensors data: ")
        ))
    })?;
    let m = header.metadata().ok_or_else(|| {
        FormatError::NotTracedModule("the safetensors header has no metadata (a plain state dict?)".to_string())
    })?;
    match m.get("ferrofx.format") {
        Some(f) if f == FORMAT => {}
        Some(f) => return Err(FormatError::NotTracedModule(format!("ferrofx.format is '{f}', expected '{FORMAT}'"))),
        None => {
            return Err(FormatError::NotTracedModule(
                "no ferrofx.format in the metadata (a plain state dict? load it with load_state_dict)".to_string(),
            ))
        }
    }
    let version = m.get("ferrofx.version").ok_or_else(|| FormatError::Invalid("no ferrofx.version".to_string()))?;
    match version.parse::<u32>() {
        Ok(v) if (1..=VERSION).contains(&v) => {}
        Ok(v) if v > VERSION => return Err(FormatError::Version { found: version.clone(), supported: VERSION }),
        _ => return Err(FormatError::Invalid(format!("ferrofx.version '{version}' is not a version number"))),
    }
    let json = m.get("ferrofx.module").ok_or_else(|| FormatError::Invalid("no ferrofx.module document".to_string()))?;
    if json.len() > MAX_DOC_BYTES {
        return Err(FormatError::Limit(format!("module document of {} bytes exceeds {MAX_DOC_BYTES}", json.len())));
    }
    let doc: ModuleDoc =
        serde_json::from_str(json).map_err(|e| FormatError::Invalid(format!("module document: {e}")))?;
    // bounded work: refuse undeclared tensors before reading any data (a file listing a
    // million undeclared tensors is refused here, not after reading them)
    if header.len() > doc.tensors.len() {
        return Err(FormatError::Invalid(format!(
            "the file holds {} tensors but declares {}; undeclared tensors are not allowed",
            header.len(),
            doc.tensors.len()
        )));
    }
    let tensors = header
        .read_tensors(r)
        .map_err(|e| FormatError::Invalid(e.message().trim_start_matches("invalid safetensors data: ").to_string()))?;
    check_tensors(&doc, |p| tensors.get(p).map(|t| (t.dtype().name().to_string(), t.shape().to_vec())), tensors.len())?;
    Ok((doc, tensors))
}
