//! State dicts: ordered maps from PyTorch key names (`layer1.0.conv1.weight`) to tensors,
//! stored as safetensors. A state dict written by PyTorch with
//! `safetensors.torch.save_file(model.state_dict(), path)` loads as is.

use crate::module::Module;
use ferrofx_core::{CpuBuffer, DType, Error, Result, Tensor};
use indexmap::IndexMap;
use safetensors::tensor::{Dtype as StDtype, TensorView};
use std::path::Path;

/// An ordered map from qualified names to tensors.
pub type StateDict = IndexMap<String, Tensor>;

/// The keys `load_state_dict(strict=false)` skipped (PyTorch's `_IncompatibleKeys`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys of the module absent from the state dict.
    pub missing_keys: Vec<String>,
    /// Keys of the state dict the module does not have.
    pub unexpected_keys: Vec<String>,
}

fn shape_str(s: &[usize]) -> String {
    format!("torch.Size([{}])", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

pub(crate) fn load_into(module: &dyn Module, sd: &StateDict, strict: bool) -> Result<LoadReport> {
    let own = crate::module::named_tensors(module, None, false);
    let mut report = LoadReport::default();
    let mut mismatches = Vec::new();
    let mut copies = Vec::new();
    for (name, dst) in &own {
        match sd.get(name) {
            None => report.missing_keys.push(name.clone()),
            Some(src) => {
                let (ss, ds) = (src.meta_shape().unwrap_or_default(), dst.meta_shape().unwrap_or_default());
                if ss != ds {
                    mismatches.push(format!(
                        "size mismatch for {name}: copying a param with shape {} from checkpoint, the shape in current model is {}.",
                        shape_str(&ss),
                        shape_str(&ds)
                    ));
                } else {
                    copies.push((dst.clone(), src.clone()));
                }
            }
        }
    }
    let own_names: std::collections::HashSet<&str> = own.iter().map(|(n, _)| n.as_str()).collect();
    report.unexpected_keys = sd.keys().filter(|k| !own_names.contains(k.as_str())).cloned().collect();
    let mut msgs = Vec::new();
    if strict {
        let quote = |v: &[String]| v.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ");
        if !report.missing_keys.is_empty() {
            msgs.push(format!("Missing key(s) in state_dict: {}. ", quote(&report.missing_keys)));
        }
        if !report.unexpected_keys.is_empty() {
            msgs.push(format!("Unexpected key(s) in state_dict: {}. ", quote(&report.unexpected_keys)));
        }
    }
    msgs.extend(mismatches);
    if !msgs.is_empty() {
        return Err(Error::argument(
            "load_state_dict",
            format!("Error(s) in loading state_dict for {}:\n\t{}", module.type_name(), msgs.join("\n\t")),
        ));
    }
    let _g = ferrofx_core::autograd::no_grad();
    for (dst, src) in copies {
        copy_param(&dst, &src)?;
    }
    Ok(report)
}

/// Copies `src` into `dst` in place (with dtype conversion), without recording history.
pub(crate) fn copy_param(dst: &Tensor, src: &Tensor) -> Result<()> {
    let _g = ferrofx_core::autograd::no_grad();
    dst.copy_(src).map(|_| ()).map_err(|e| e.in_op("load_state_dict"))
}

fn to_st_dtype(d: DType) -> StDtype {
    match d {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I8 => StDtype::I8,
        DType::I16 => StDtype::I16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
    }
}

fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.detach().contiguous()?;
    let (storage, layout) = t.concrete("save_state_dict")?;
    let guard = storage.read();
    let r = layout.contiguous_range().ok_or_else(|| Error::io("save_state_dict", "tensor is not contiguous"))?;
    macro_rules! le {
        ($v:expr, $f:expr) => {
            $v[r].iter().flat_map($f).collect::<Vec<u8>>()
        };
    }
    Ok(match &*guard {
        CpuBuffer::Bool(v) => le!(v, |x: &bool| [*x as u8]),
        CpuBuffer::U8(v) => v[r].to_vec(),
        CpuBuffer::I8(v) => le!(v, |x: &i8| x.to_le_bytes()),
        CpuBuffer::I16(v) => le!(v, |x: &i16| x.to_le_bytes()),
        CpuBuffer::I32(v) => le!(v, |x: &i32| x.to_le_bytes()),
        CpuBuffer::I64(v) => le!(v, |x: &i64| x.to_le_bytes()),
        CpuBuffer::F16(v) => le!(v, |x: &half::f16| x.to_le_bytes()),
        CpuBuffer::BF16(v) => le!(v, |x: &half::bf16| x.to_le_bytes()),
        CpuBuffer::F32(v) => le!(v, |x: &f32| x.to_le_bytes()),
        CpuBuffer::F64(v) => le!(v, |x: &f64| x.to_le_bytes()),
    })
}

/// Serializes a state dict to safetensors bytes (keys in the state dict's order are sorted by
/// the format; metadata may be attached).
pub fn state_dict_to_bytes(
    sd: &StateDict,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let mut owned = Vec::with_capacity(sd.len());
    for (k, t) in sd {
        owned.push((k.clone(), to_st_dtype(t.dtype()), t.shape().to_vec(), tensor_bytes(t)?));
    }
    let views = owned
        .iter()
        .map(|(k, d, s, b)| {
            TensorView::new(*d, s.clone(), b)
                .map(|v| (k.clone(), v))
                .map_err(|e| Error::io("save_state_dict", format!("{k}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, metadata).map_err(|e| Error::io("save_state_dict", e.to_string()))
}

/// Writes a state dict as a safetensors file.
pub fn save_state_dict(sd: &StateDict, path: impl AsRef<Path>) -> Result<()> {
    let bytes = state_dict_to_bytes(sd, None)?;
    std::fs::write(path.as_ref(), bytes)
        .map_err(|e| Error::io("save_state_dict", format!("cannot write {}: {e}", path.as_ref().display())))
}

fn from_le<T, const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    b.chunks_exact(N).map(|c| f(c.try_into().expect("chunks_exact gives N bytes"))).collect()
}

/// Parses safetensors bytes into a state dict (keys in file order as stored: sorted by the
/// safetensors writer, or by offset for files from other writers). Every length and dtype is
/// validated by the safetensors parser; unsupported dtypes are errors.
pub fn state_dict_from_bytes(bytes: &[u8]) -> Result<StateDict> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::io("load_state_dict", format!("invalid safetensors data: {e}")))?;
    let mut entries: Vec<(String, TensorView)> = st.tensors();
    // keep the file's data order (what PyTorch's state_dict order usually becomes)
    entries.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut sd = StateDict::new();
    for (name, v) in entries {
        let b = v.data();
        let shape = v.shape().to_vec();
        let buf = match v.dtype() {
            StDtype::BOOL => CpuBuffer::Bool(b.iter().map(|&x| x != 0).collect()),
            StDtype::U8 => CpuBuffer::U8(b.to_vec()),
            StDtype::I8 => CpuBuffer::I8(b.iter().map(|&x| x as i8).collect()),
            StDtype::I16 => CpuBuffer::I16(from_le(b, i16::from_le_bytes)),
            StDtype::I32 => CpuBuffer::I32(from_le(b, i32::from_le_bytes)),
            StDtype::I64 => CpuBuffer::I64(from_le(b, i64::from_le_bytes)),
            StDtype::F16 => CpuBuffer::F16(from_le(b, half::f16::from_le_bytes)),
            StDtype::BF16 => CpuBuffer::BF16(from_le(b, half::bf16::from_le_bytes)),
            StDtype::F32 => CpuBuffer::F32(from_le(b, f32::from_le_bytes)),
            StDtype::F64 => CpuBuffer::F64(from_le(b, f64::from_le_bytes)),
            other => {
                return Err(Error::io(
                    "load_state_dict",
                    format!("tensor '{name}' has dtype {other:?}, which ferrofx does not support"),
                ))
            }
        };
        sd.insert(name.clone(), Tensor::from_buffer(buf, &shape).map_err(|e| e.in_op("load_state_dict"))?);
    }
    Ok(sd)
}

/// Reads a safetensors file into a state dict.
pub fn load_state_dict_file(path: impl AsRef<Path>) -> Result<StateDict> {
    let bytes = std::fs::read(path.as_ref())
        .map_err(|e| Error::io("load_state_dict", format!("cannot read {}: {e}", path.as_ref().display())))?;
    state_dict_from_bytes(&bytes)
}
