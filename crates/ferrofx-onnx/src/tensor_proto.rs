//! `TensorProto` ↔ [`Tensor`]: ONNX's element types, raw and typed data, external data files.
//!
//! A model file is user input, so every size is checked before anything is allocated: the
//! element count comes from `dims` (each non-negative, product without overflow) and must match
//! the bytes actually present in the file (or in the external data file, whose range must lie
//! inside that file), so memory is bounded by the size of the input.

use crate::proto::{tensor_proto::DataType as P, TensorProto};
use ferrofx_core::{DType, Element, Error, Result, Tensor};
use half::{bf16, f16};
use std::path::{Component, Path};

/// Where external data files may be read from: the model's own directory (`None`: no external
/// data allowed, e.g. a model given as bytes).
#[derive(Clone, Debug, Default)]
pub struct ExternalDataDir(pub Option<std::path::PathBuf>);

/// The ferrofx dtype of an ONNX `TensorProto.DataType` code, or an error naming the type.
pub fn dtype_from_onnx(code: i32, what: &str) -> Result<DType> {
    Ok(match P::try_from(code) {
        Ok(P::Float) => DType::F32,
        Ok(P::Double) => DType::F64,
        Ok(P::Float16) => DType::F16,
        Ok(P::Bfloat16) => DType::BF16,
        Ok(P::Int64) => DType::I64,
        Ok(P::Int32) => DType::I32,
        Ok(P::Int16) => DType::I16,
        Ok(P::Int8) => DType::I8,
        Ok(P::Uint8) => DType::U8,
        Ok(P::Bool) => DType::Bool,
        Ok(other) => {
            return Err(Error::dtype(
                "onnx",
                format!(
                    "{what}: ONNX element type {} ({code}) is not supported (supported: float, double, float16, \
                     bfloat16, int64, int32, int16, int8, uint8, bool)",
                    other.as_str_name()
                ),
            ))
        }
        Err(_) => return Err(Error::dtype("onnx", format!("{what}: unknown ONNX element type code {code}"))),
    })
}

/// The ONNX `TensorProto.DataType` code of a ferrofx dtype.
pub fn dtype_to_onnx(dtype: DType) -> i32 {
    (match dtype {
        DType::F32 => P::Float,
        DType::F64 => P::Double,
        DType::F16 => P::Float16,
        DType::BF16 => P::Bfloat16,
        DType::I64 => P::Int64,
        DType::I32 => P::Int32,
        DType::I16 => P::Int16,
        DType::I8 => P::Int8,
        DType::U8 => P::Uint8,
        DType::Bool => P::Bool,
    }) as i32
}

/// Checked shape: every dim non-negative, element count without overflow and at most `limit`.
pub(crate) fn checked_shape(dims: &[i64], what: &str, limit: usize) -> Result<(Vec<usize>, usize)> {
    let mut n: usize = 1;
    let mut shape = Vec::with_capacity(dims.len().min(64));
    if dims.len() > 64 {
        return Err(Error::shape("onnx", format!("{what}: {} dimensions (at most 64 supported)", dims.len())));
    }
    for &d in dims {
        let u = usize::try_from(d)
            .map_err(|_| Error::shape("onnx", format!("{what}: negative dimension {d} in dims {dims:?}")))?;
        n = n.checked_mul(u).filter(|&n| n <= limit).ok_or_else(|| {
            Error::shape("onnx", format!("{what}: dims {dims:?} declare more elements than the file holds"))
        })?;
        shape.push(u);
    }
    Ok((shape, n))
}

fn from_le<T: Element, const N: usize>(bytes: &[u8], conv: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|c| conv(c.try_into().unwrap_or([0; N]))).collect()
}

fn tensor_from_raw(bytes: &[u8], dtype: DType, shape: &[usize], n: usize, what: &str) -> Result<Tensor> {
    let need = n.checked_mul(dtype.size()).ok_or_else(|| Error::shape("onnx", format!("{what}: size overflows")))?;
    if bytes.len() != need {
        return Err(Error::shape(
            "onnx",
            format!(
                "{what}: dims {shape:?} of {} need {need} bytes of raw data but the file holds {}",
                dtype_name(dtype),
                bytes.len()
            ),
        ));
    }
    match dtype {
        DType::F32 => Tensor::from_vec(from_le(bytes, f32::from_le_bytes), shape),
        DType::F64 => Tensor::from_vec(from_le(bytes, f64::from_le_bytes), shape),
        DType::F16 => Tensor::from_vec(from_le(bytes, |b| f16::from_bits(u16::from_le_bytes(b))), shape),
        DType::BF16 => Tensor::from_vec(from_le(bytes, |b| bf16::from_bits(u16::from_le_bytes(b))), shape),
        DType::I64 => Tensor::from_vec(from_le(bytes, i64::from_le_bytes), shape),
        DType::I32 => Tensor::from_vec(from_le(bytes, i32::from_le_bytes), shape),
        DType::I16 => Tensor::from_vec(from_le(bytes, i16::from_le_bytes), shape),
        DType::I8 => Tensor::from_vec(from_le(bytes, i8::from_le_bytes), shape),
        DType::U8 => Tensor::from_vec(bytes.to_vec(), shape),
        DType::Bool => Tensor::from_vec(bytes.iter().map(|&b| b != 0).collect::<Vec<bool>>(), shape),
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::I16 => "int16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::Bool => "bool",
    }
}

fn typed_len_err(what: &str, field: &str, have: usize, n: usize, shape: &[usize]) -> Error {
    Error::shape("onnx", format!("{what}: dims {shape:?} need {n} values but {field} holds {have}"))
}

/// Reads an external data file's range, refusing paths that leave `dir`.
fn read_external(t: &TensorProto, dir: &ExternalDataDir, what: &str) -> Result<Vec<u8>> {
    let mut location = None;
    let mut offset: u64 = 0;
    let mut length: Option<u64> = None;
    for e in &t.external_data {
        let v = e.value.as_deref().unwrap_or("");
        match e.key.as_deref().unwrap_or("") {
            "location" => location = Some(v.to_string()),
            "offset" => {
                offset = v
                    .parse()
                    .map_err(|_| Error::io("onnx", format!("{what}: external data offset {v:?} is not a number")))?
            }
            "length" => {
                length =
                    Some(v.parse().map_err(|_| {
                        Error::io("onnx", format!("{what}: external data length {v:?} is not a number"))
                    })?)
            }
            _ => {}
        }
    }
    let location = location.ok_or_else(|| Error::io("onnx", format!("{what}: external data without a `location`")))?;
    let Some(base) = dir.0.as_ref() else {
        return Err(Error::io(
            "onnx",
            format!("{what}: external data `{location}` cannot be read for a model loaded from bytes; load it from its file"),
        ));
    };
    let rel = Path::new(&location);
    if rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(Error::io(
            "onnx",
            format!(
                "{what}: external data location `{location}` leaves the model's folder (absolute or `..` paths are \
                 refused); put the data file beside the model"
            ),
        ));
    }
    let path = base.join(rel);
    let canon_base = base.canonicalize().map_err(|e| Error::io("onnx", format!("{}: {e}", base.display())))?;
    let canon =
        path.canonicalize().map_err(|e| Error::io("onnx", format!("{what}: external data `{location}`: {e}")))?;
    if !canon.starts_with(&canon_base) {
        return Err(Error::io(
            "onnx",
            format!("{what}: external data `{location}` resolves outside the model's folder (symbolic link?); refused"),
        ));
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&canon).map_err(|e| Error::io("onnx", format!("{what}: `{location}`: {e}")))?;
    let size = f.metadata().map_err(|e| Error::io("onnx", format!("{what}: `{location}`: {e}")))?.len();
    let length = length.unwrap_or(size.saturating_sub(offset));
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(Error::io(
            "onnx",
            format!("{what}: external data range {offset}+{length} is beyond the end of `{location}` ({size} bytes)"),
        ));
    }
    f.seek(SeekFrom::Start(offset)).map_err(|e| Error::io("onnx", format!("{what}: {e}")))?;
    let mut buf = vec![0u8; length as usize];
    f.read_exact(&mut buf).map_err(|e| Error::io("onnx", format!("{what}: {e}")))?;
    Ok(buf)
}

/// Converts a `TensorProto` (an initializer, a `Constant`'s value, a test's input) to a tensor.
pub fn tensor_from_proto(t: &TensorProto, dir: &ExternalDataDir) -> Result<Tensor> {
    let what = format!("tensor `{}`", t.name.as_deref().unwrap_or(""));
    let dtype = dtype_from_onnx(t.data_type.unwrap_or(0), &what)?;
    if t.segment.is_some() {
        return Err(Error::argument("onnx", format!("{what}: segmented tensors are not supported")));
    }
    let external = t.data_location == Some(crate::proto::tensor_proto::DataLocation::External as i32);
    let ext_bytes;
    let raw: Option<&[u8]> = if external {
        ext_bytes = read_external(t, dir, &what)?;
        Some(&ext_bytes)
    } else {
        t.raw_data.as_deref()
    };
    // Upper bound on the element count: what the file holds (a raw byte per element at least,
    // or one typed value per element).
    let available = raw.map(|r| r.len()).unwrap_or(0)
        + t.float_data.len()
        + t.int32_data.len()
        + t.int64_data.len()
        + t.double_data.len()
        + t.uint64_data.len();
    let (shape, n) = checked_shape(&t.dims, &what, available.max(1))?;
    if let Some(raw) = raw {
        return tensor_from_raw(raw, dtype, &shape, n, &what);
    }
    macro_rules! typed {
        ($field:ident, $name:literal, $conv:expr) => {{
            if t.$field.len() != n {
                return Err(typed_len_err(&what, $name, t.$field.len(), n, &shape));
            }
            Tensor::from_vec(t.$field.iter().map($conv).collect::<Vec<_>>(), &shape)
        }};
    }
    match dtype {
        DType::F32 => typed!(float_data, "float_data", |&v| v),
        DType::F64 => typed!(double_data, "double_data", |&v| v),
        DType::I64 => typed!(int64_data, "int64_data", |&v| v),
        DType::I32 => typed!(int32_data, "int32_data", |&v| v),
        DType::I16 => typed!(int32_data, "int32_data", |&v| v as i16),
        DType::I8 => typed!(int32_data, "int32_data", |&v| v as i8),
        DType::U8 => typed!(int32_data, "int32_data", |&v| v as u8),
        DType::Bool => typed!(int32_data, "int32_data", |&v| v != 0),
        DType::F16 => typed!(int32_data, "int32_data", |&v| f16::from_bits(v as u16)),
        DType::BF16 => typed!(int32_data, "int32_data", |&v| bf16::from_bits(v as u16)),
    }
}

/// Converts a tensor to a `TensorProto` with `raw_data` (little-endian), named `name`.
pub fn tensor_to_proto(t: &Tensor, name: &str) -> Result<TensorProto> {
    let dims = t.shape().iter().map(|&d| d as i64).collect();
    let mut raw = Vec::with_capacity(t.numel() * t.dtype().size());
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DType::F64 => t.to_vec::<f64>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => t.to_vec::<f16>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_bits().to_le_bytes())),
        DType::BF16 => t.to_vec::<bf16>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_bits().to_le_bytes())),
        DType::I64 => t.to_vec::<i64>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DType::I32 => t.to_vec::<i32>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DType::I16 => t.to_vec::<i16>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DType::I8 => t.to_vec::<i8>()?.iter().for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DType::U8 => raw.extend(t.to_vec::<u8>()?),
        DType::Bool => raw.extend(t.to_vec::<bool>()?.iter().map(|&b| b as u8)),
    }
    Ok(TensorProto {
        dims,
        data_type: Some(dtype_to_onnx(t.dtype())),
        name: Some(name.to_string()),
        raw_data: Some(raw),
        ..Default::default()
    })
}

/// Reads a serialised `TensorProto` file (the `input_0.pb` / `output_0.pb` files of ONNX's
/// test data); external data is refused.
pub fn load_tensor(path: impl AsRef<std::path::Path>) -> Result<Tensor> {
    use prost::Message;
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io("onnx", format!("{}: {e}", path.display())))?;
    let t = TensorProto::decode(bytes.as_slice()).map_err(|e| {
        Error::io("onnx", format!("{}: not a serialised TensorProto (protobuf decoding failed: {e})", path.display()))
    })?;
    tensor_from_proto(&t, &ExternalDataDir(None)).map_err(|e| e.with_context(&path.display().to_string()))
}
