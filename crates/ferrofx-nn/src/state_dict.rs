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

/// The little-endian bytes of `buf[r]`: borrowed on little-endian machines (no copy), built
/// otherwise.
fn buffer_bytes(buf: &CpuBuffer, r: std::ops::Range<usize>) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    macro_rules! le {
        ($v:expr, $f:expr) => {
            if cfg!(target_endian = "little") {
                Cow::Borrowed(bytemuck::cast_slice(&$v[r]))
            } else {
                Cow::Owned($v[r].iter().flat_map($f).collect::<Vec<u8>>())
            }
        };
    }
    match buf {
        CpuBuffer::Bool(v) => Cow::Borrowed(bytemuck::cast_slice(&v[r])),
        CpuBuffer::U8(v) => Cow::Borrowed(&v[r]),
        CpuBuffer::I8(v) => Cow::Borrowed(bytemuck::cast_slice(&v[r])),
        CpuBuffer::I16(v) => le!(v, |x: &i16| x.to_le_bytes()),
        CpuBuffer::I32(v) => le!(v, |x: &i32| x.to_le_bytes()),
        CpuBuffer::I64(v) => le!(v, |x: &i64| x.to_le_bytes()),
        CpuBuffer::F16(v) => le!(v, |x: &half::f16| x.to_le_bytes()),
        CpuBuffer::BF16(v) => le!(v, |x: &half::bf16| x.to_le_bytes()),
        CpuBuffer::F32(v) => le!(v, |x: &f32| x.to_le_bytes()),
        CpuBuffer::F64(v) => le!(v, |x: &f64| x.to_le_bytes()),
    }
}

/// Calls `f` with safetensors views of every tensor of `sd`, borrowing the tensors' storage
/// (contiguous tensors are not copied; the storages stay read-locked while `f` runs).
fn with_views<R>(sd: &StateDict, f: impl FnOnce(Vec<(String, TensorView<'_>)>) -> Result<R>) -> Result<R> {
    let tensors = sd
        .iter()
        .map(|(k, t)| {
            let t = t.detach();
            Ok((k, if t.is_contiguous() { t } else { t.contiguous()? }))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut guards = Vec::with_capacity(tensors.len());
    for (k, t) in &tensors {
        let (storage, layout) = t.concrete("save_state_dict")?;
        let r = layout
            .contiguous_range()
            .ok_or_else(|| Error::io("save_state_dict", format!("tensor '{k}' is not contiguous")))?;
        guards.push((k, t, storage.read(), r));
    }
    let views = guards.iter().map(|(k, t, guard, r)| (k, t, buffer_bytes(guard, r.clone()))).collect::<Vec<_>>();
    let views = views
        .iter()
        .map(|(k, t, b)| {
            TensorView::new(to_st_dtype(t.dtype()), t.shape().to_vec(), b)
                .map(|v| (k.to_string(), v))
                .map_err(|e| Error::io("save_state_dict", format!("{k}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    f(views)
}

/// Serializes a state dict to safetensors bytes (keys in the state dict's order are sorted by
/// the format; metadata may be attached).
pub fn state_dict_to_bytes(
    sd: &StateDict,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<Vec<u8>> {
    with_views(sd, |views| {
        safetensors::serialize(views, metadata).map_err(|e| Error::io("save_state_dict", e.to_string()))
    })
}

/// Writes a state dict as a safetensors file with optional metadata, streaming each tensor's
/// bytes from its storage to the file (no intermediate copy of the weights). The write is
/// atomic ([`ferrofx_core::atomic_file::write_atomic`]): an interrupted save leaves the
/// previous file intact.
pub fn save_state_dict_with_metadata(
    sd: &StateDict,
    metadata: Option<std::collections::HashMap<String, String>>,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    // atomic: a temporary file in the same folder, synced, then renamed over `path`
    ferrofx_core::atomic_file::write_atomic("save_state_dict", path, |tmp| {
        with_views(sd, |views| {
            safetensors::serialize_to_file(views, metadata, tmp)
                .map_err(|e| Error::io("save_state_dict", format!("cannot write {}: {e}", path.display())))
        })
    })
}

/// Writes a state dict as a safetensors file.
pub fn save_state_dict(sd: &StateDict, path: impl AsRef<Path>) -> Result<()> {
    save_state_dict_with_metadata(sd, None, path)
}

/// Parses safetensors bytes into a state dict (keys in the file's data order: sorted by the
/// safetensors writer, or whatever order other writers chose). Every length and dtype is
/// validated; unsupported dtypes are errors.
pub fn state_dict_from_bytes(bytes: &[u8]) -> Result<StateDict> {
    let mut r = bytes;
    let header = read_safetensors_header(&mut r, bytes.len() as u64)?;
    header.read_tensors(&mut r)
}

/// The header of a safetensors stream: its metadata and the tensors it declares, validated
/// (offsets contiguous from 0, sizes matching dtype × shape, total matching the stream length).
/// Obtained with [`read_safetensors_header`]; the tensors are then read with
/// [`SafetensorsHeader::read_tensors`], straight into their final buffers (one copy).
#[derive(Debug, Clone)]
pub struct SafetensorsHeader {
    metadata: Option<std::collections::HashMap<String, String>>,
    tensors: Vec<(String, safetensors::tensor::TensorInfo)>,
}

/// Largest safetensors header accepted (the safetensors crate's own bound).
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// The header's JSON object as read: `__metadata__` and the tensor entries in file order (a
/// name given twice is kept twice, for [`check_offsets`] to refuse). A malformed entry is an
/// error naming its tensor.
struct RawHeader {
    metadata: Option<std::collections::HashMap<String, String>>,
    tensors: Vec<(String, safetensors::tensor::TensorInfo)>,
}

impl<'de> serde::Deserialize<'de> for RawHeader {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawHeader;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object mapping tensor names to {dtype, shape, data_offsets}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawHeader, A::Error> {
                let mut h = RawHeader { metadata: None, tensors: Vec::new() };
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        if h.metadata.is_some() {
                            return Err(A::Error::custom("__metadata__ appears twice"));
                        }
                        h.metadata = Some(map.next_value()?);
                        continue;
                    }
                    let info: safetensors::tensor::TensorInfo =
                        map.next_value().map_err(|e| A::Error::custom(format!("tensor '{key}': {e}")))?;
                    h.tensors.push((key, info));
                }
                Ok(h)
            }
        }
        d.deserialize_map(V)
    }
}

/// Checks that the tensors' `data_offsets` tile the `data_len` bytes after the header exactly
/// (each tensor's span is its dtype × shape, no gap, no overlap, nothing past the end or left
/// over), naming the tensor at fault; sorts the tensors by offset.
fn check_offsets(
    tensors: &mut [(String, safetensors::tensor::TensorInfo)],
    data_len: u64,
) -> std::result::Result<(), String> {
    // a name given twice (a JSON map would silently keep the last one)
    let mut names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("tensor '{}' appears twice in the header", w[0]));
    }
    drop(names);
    // each entry on its own first, so a wrong size names its own tensor, not a neighbour
    for (name, info) in tensors.iter() {
        let (s, e) = info.data_offsets;
        if e < s {
            return Err(format!("tensor '{name}' has data_offsets [{s}, {e}]: the end is before the start"));
        }
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()));
        let Some(bytes) = bits.filter(|b| b % 8 == 0).map(|b| b / 8) else {
            return Err(format!(
                "tensor '{name}' of dtype {:?} and shape {:?} is not a whole number of bytes that fits in memory",
                info.dtype, info.shape
            ));
        };
        if e - s != bytes {
            return Err(format!(
                "tensor '{name}' is {:?} {:?} ({bytes} bytes), but its data_offsets [{s}, {e}] span {} bytes",
                info.dtype,
                info.shape,
                e - s
            ));
        }
        if e as u64 > data_len {
            return Err(format!(
                "tensor '{name}' has data_offsets [{s}, {e}], past the end of the {data_len} bytes of data after the header: the file is truncated"
            ));
        }
    }
    tensors.sort_by(|(a, x), (b, y)| x.data_offsets.cmp(&y.data_offsets).then_with(|| a.cmp(b)));
    let mut end = 0usize;
    let mut prev: Option<&str> = None;
    for (name, info) in tensors.iter() {
        let (s, e) = info.data_offsets;
        if s < end {
            return Err(format!(
                "tensor '{name}' (data_offsets [{s}, {e}]) overlaps tensor '{}', which ends at byte {end}",
                prev.unwrap_or_default()
            ));
        }
        if s > end {
            return Err(match prev {
                Some(p) => format!(
                    "tensor '{name}' starts at byte {s}, but tensor '{p}' ends at byte {end}: the {} bytes between them belong to no tensor",
                    s - end
                ),
                None => format!("tensor '{name}' starts at byte {s}, but the first tensor's data must start at byte 0"),
            });
        }
        end = e;
        prev = Some(name);
    }
    if end as u64 != data_len {
        let last = prev.map(|p| format!(" (tensor '{p}')")).unwrap_or_default();
        return Err(format!(
            "the tensors' data ends at byte {end}{last}, but {data_len} bytes follow the header: the data region is not fully covered (trailing bytes)"
        ));
    }
    Ok(())
}

/// Reads and validates the header of a safetensors stream of `total_len` bytes, leaving `r` at
/// the first data byte. Errors name what is wrong (truncated, header too large) and the tensor
/// whose entry is at fault (bad dtype, a size that disagrees with its offsets, a gap, an
/// overlap, data past the end).
pub fn read_safetensors_header<R: std::io::Read>(r: &mut R, total_len: u64) -> Result<SafetensorsHeader> {
    use safetensors::SafeTensorError as E;
    let invalid = |m: String| Error::io("load_state_dict", format!("invalid safetensors data: {m}"));
    let bad = |e: E| invalid(e.to_string());
    let mut n = [0u8; 8];
    if total_len < 8 || r.read_exact(&mut n).is_err() {
        return Err(bad(E::HeaderTooSmall));
    }
    let n = u64::from_le_bytes(n);
    if n > MAX_SAFETENSORS_HEADER {
        return Err(bad(E::HeaderTooLarge));
    }
    if n > total_len - 8 {
        return Err(bad(E::InvalidHeaderLength));
    }
    let mut header = vec![0u8; n as usize];
    r.read_exact(&mut header).map_err(|_| bad(E::InvalidHeaderLength))?;
    let text = std::str::from_utf8(&header).map_err(|e| bad(E::InvalidHeader(e)))?;
    let raw: RawHeader = serde_json::from_str(text).map_err(|e| bad(E::InvalidHeaderDeserialization(e)))?;
    drop(header);
    let mut tensors = raw.tensors;
    check_offsets(&mut tensors, total_len - 8 - n).map_err(invalid)?;
    Ok(SafetensorsHeader { metadata: raw.metadata, tensors })
}

impl SafetensorsHeader {
    /// Number of tensors the header declares.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// `true` when the header declares no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The header's `__metadata__` map, if any.
    pub fn metadata(&self) -> Option<&std::collections::HashMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Reads every tensor (in data order) from `r`, positioned right after the header.
    pub fn read_tensors<R: std::io::Read>(&self, r: &mut R) -> Result<StateDict> {
        let mut sd = StateDict::new();
        for (name, info) in &self.tensors {
            let numel: usize = info.shape.iter().product();
            let io = |e: std::io::Error| Error::io("load_state_dict", format!("tensor '{name}': {e}"));
            macro_rules! read_le {
                ($t:ty, $variant:ident) => {{
                    let mut v: Vec<$t> = vec![<$t>::default(); numel];
                    r.read_exact(bytemuck::cast_slice_mut(&mut v)).map_err(io)?;
                    if cfg!(target_endian = "big") {
                        for x in v.iter_mut() {
                            *x = <$t>::from_le_bytes(x.to_ne_bytes());
                        }
                    }
                    CpuBuffer::$variant(v)
                }};
            }
            let buf = match info.dtype {
                StDtype::BOOL => {
                    let mut v = vec![0u8; numel];
                    r.read_exact(&mut v).map_err(io)?;
                    CpuBuffer::Bool(v.into_iter().map(|x| x != 0).collect())
                }
                StDtype::U8 => read_le!(u8, U8),
                StDtype::I8 => read_le!(i8, I8),
                StDtype::I16 => read_le!(i16, I16),
                StDtype::I32 => read_le!(i32, I32),
                StDtype::I64 => read_le!(i64, I64),
                StDtype::F16 => read_le!(half::f16, F16),
                StDtype::BF16 => read_le!(half::bf16, BF16),
                StDtype::F32 => read_le!(f32, F32),
                StDtype::F64 => read_le!(f64, F64),
                other => {
                    return Err(Error::io(
                        "load_state_dict",
                        format!("tensor '{name}' has dtype {other:?}, which ferrofx does not support"),
                    ))
                }
            };
            sd.insert(name.clone(), Tensor::from_buffer(buf, &info.shape).map_err(|e| e.in_op("load_state_dict"))?);
        }
        Ok(sd)
    }
}

/// Reads a safetensors file into a state dict, each tensor read straight from the file into its
/// own buffer.
pub fn load_state_dict_file(path: impl AsRef<Path>) -> Result<StateDict> {
    let path = path.as_ref();
    let (mut r, len) = open_for_reading(path)?;
    let header = read_safetensors_header(&mut r, len)?;
    header.read_tensors(&mut r)
}

/// Opens a file for sequential reading; returns the reader and the file's length.
pub fn open_for_reading(path: &Path) -> Result<(std::io::BufReader<std::fs::File>, u64)> {
    let cannot = |e: std::io::Error| Error::io("load_state_dict", format!("cannot read {}: {e}", path.display()));
    let f = std::fs::File::open(path).map_err(cannot)?;
    let md = f.metadata().map_err(cannot)?;
    if md.is_dir() {
        return Err(Error::io(
            "load_state_dict",
            format!("cannot read {}: it is a directory, not a file; give the path of a file", path.display()),
        ));
    }
    let len = md.len();
    Ok((std::io::BufReader::with_capacity(1 << 16, f), len))
}
