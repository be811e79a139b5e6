//! NumPy `.npy` files (format versions 1.0, 2.0 and 3.0): one tensor per file, as
//! `numpy.save` writes and `numpy.load` reads them.
//!
//! Reading accepts little-endian (`<`) and byte-order-free (`|`) element types `b1 u1 i1 i2 i4
//! i8 f2 f4 f8`, C or Fortran order, and validates everything against the file: the magic, the
//! header length and syntax, the shape (no overflow) and the data length, so a damaged or
//! hostile file is an error, never a panic or a huge allocation. Writing produces version 1.0
//! (2.0 when the header needs it), C order, little-endian.

use ferrofx_core::{CpuBuffer, DType, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

/// Element type of a `descr` string (without the byte-order character) and its size.
fn dtype_of(code: &str) -> Option<(DType, usize)> {
    Some(match code {
        "b1" => (DType::Bool, 1),
        "u1" => (DType::U8, 1),
        "i1" => (DType::I8, 1),
        "i2" => (DType::I16, 2),
        "i4" => (DType::I32, 4),
        "i8" => (DType::I64, 8),
        "f2" => (DType::F16, 2),
        "f4" => (DType::F32, 4),
        "f8" => (DType::F64, 8),
        _ => return None,
    })
}

/// The `descr` of a dtype (`None`: NumPy has no bfloat16).
fn descr_of(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::BF16 => return None,
    })
}

/// The three entries of a `.npy` header dict, parsed as strictly as NumPy's reader: a Python
/// dict literal with exactly the keys `descr`, `fortran_order` and `shape` (each once), `descr`
/// a string, `fortran_order` `True`/`False`, `shape` a tuple of non-negative integers.
#[derive(Debug, PartialEq)]
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// A tiny cursor over the header text.
struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t') {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8, what: &str) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("the header dict is malformed: expected {what} at byte {}", self.i))
        }
    }
    fn string(&mut self) -> Result<String, String> {
        self.ws();
        let q = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("the header dict is malformed: expected a quoted string at byte {}", self.i)),
        };
        let start = self.i + 1;
        let len = self.s[start..].iter().position(|&c| c == q).ok_or("the header has an unterminated string")?;
        self.i = start + len + 1;
        String::from_utf8(self.s[start..start + len].to_vec()).map_err(|_| "the header is not text".to_string())
    }
    fn word(&mut self) -> String {
        self.ws();
        let start = self.i;
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_') {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }
}

/// Parses the header dict (the text between the length field and the data).
fn parse_header(text: &str) -> Result<Header, String> {
    // NumPy's writer ends the header with '\n' after space padding; nothing else may follow
    let body = text.strip_suffix('\n').ok_or("the header does not end with a newline (damaged file?)")?;
    let mut c = Cursor { s: body.as_bytes(), i: 0 };
    c.expect(b'{', "'{'")?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let dup = |k: &str| format!("the header dict has the key '{k}' twice");
    loop {
        if c.eat(b'}') {
            break;
        }
        let key = c.string()?;
        c.expect(b':', "':' after a key")?;
        match key.as_str() {
            "descr" => {
                if descr.replace(c.string()?).is_some() {
                    return Err(dup("descr"));
                }
            }
            "fortran_order" => {
                let v = match c.word().as_str() {
                    "True" => true,
                    "False" => false,
                    other => return Err(format!("fortran_order is '{other}', expected True or False")),
                };
                if fortran.replace(v).is_some() {
                    return Err(dup("fortran_order"));
                }
            }
            "shape" => {
                c.expect(b'(', "a tuple for 'shape'")?;
                let mut dims = vec![];
                loop {
                    if c.eat(b')') {
                        break;
                    }
                    let w = c.word();
                    let d = w.parse::<usize>().map_err(|_| format!("the shape has a bad dimension '{w}'"))?;
                    dims.push(d);
                    if !c.eat(b',') {
                        c.expect(b')', "',' or ')' in the shape")?;
                        if dims.len() == 1 {
                            // Python's (3) is an int, not a tuple
                            return Err("the shape '(n)' is not a tuple; NumPy writes '(n,)'".into());
                        }
                        break;
                    }
                }
                if shape.replace(dims).is_some() {
                    return Err(dup("shape"));
                }
            }
            other => {
                return Err(format!(
                    "the header dict has the unexpected key '{other}' (NumPy's keys are exactly descr, fortran_order, shape)"
                ))
            }
        }
        if !c.eat(b',') {
            c.expect(b'}', "',' or '}'")?;
            break;
        }
    }
    c.ws();
    if c.i != c.s.len() {
        return Err("the header has text after its dict (only space padding may follow)".into());
    }
    let missing = |k: &str| format!("the header has no '{k}' entry");
    Ok(Header {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

/// Parses a `.npy` file's bytes into a tensor.
pub fn from_bytes(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (the magic string \\x93NUMPY is missing)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        _ => return Err(format!("unsupported .npy format version {major}.{minor} (1.0, 2.0 and 3.0 are read)")),
    };
    let data_start = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| format!("truncated: the header declares {header_len} bytes, the file has {}", bytes.len()))?;
    if data_start % 16 != 0 {
        return Err(format!(
            "the header ends at byte {data_start}, which is not aligned (NumPy pads the header so the data starts at a multiple of 64)"
        ));
    }
    let raw = &bytes[start..data_start];
    if major < 3 && !raw.is_ascii() {
        return Err(format!("the header of a version {major}.0 file must be ASCII (version 3.0 allows UTF-8)"));
    }
    let header = std::str::from_utf8(raw).map_err(|_| "the header is not text")?;
    let Header { descr, fortran_order: fortran, shape } = parse_header(header)?;
    let descr = descr.as_str();
    let (order, code) = descr.split_at(descr.len().min(1));
    let (dtype, size) = match (order, dtype_of(code)) {
        ("<" | "|", Some(d)) => d,
        (">", Some(_)) => return Err(format!("big-endian data ('{descr}') is not supported; save it little-endian")),
        _ => {
            return Err(format!(
                "element type '{descr}' is not supported (bool, u8, i8, i16, i32, i64, f16, f32, f64 are)"
            ))
        }
    };
    let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or("the shape overflows")?;
    let data = &bytes[data_start..];
    let want = numel.checked_mul(size).ok_or("the shape overflows")?;
    if data.len() != want {
        return Err(format!(
            "the data has {} bytes, but shape {shape:?} of {descr} needs {want} (truncated or damaged file)",
            data.len()
        ));
    }
    macro_rules! le {
        ($t:ty, $n:expr) => {
            data.chunks_exact($n).map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or([0; $n]))).collect::<Vec<$t>>()
        };
    }
    let buf = match dtype {
        DType::Bool => CpuBuffer::Bool(data.iter().map(|&b| b != 0).collect()),
        DType::U8 => CpuBuffer::U8(data.to_vec()),
        DType::I8 => CpuBuffer::I8(data.iter().map(|&b| b as i8).collect()),
        DType::I16 => CpuBuffer::I16(le!(i16, 2)),
        DType::I32 => CpuBuffer::I32(le!(i32, 4)),
        DType::I64 => CpuBuffer::I64(le!(i64, 8)),
        DType::F16 => CpuBuffer::F16(le!(u16, 2).into_iter().map(half::f16::from_bits).collect()),
        DType::F32 => CpuBuffer::F32(le!(f32, 4)),
        DType::F64 => CpuBuffer::F64(le!(f64, 8)),
        DType::BF16 => unreachable!("no npy code maps to bfloat16"),
    };
    if !fortran || shape.len() < 2 {
        return Tensor::from_buffer(buf, &shape).map_err(|e| e.to_string());
    }
    // Fortran order: the data is the C-order array of the reversed shape, transposed.
    let reversed: Vec<usize> = shape.iter().rev().copied().collect();
    let dims: Vec<i64> = (0..shape.len() as i64).rev().collect();
    Tensor::from_buffer(buf, &reversed)
        .and_then(|t| t.permute(&dims))
        .and_then(|t| t.contiguous())
        .map_err(|e| e.to_string())
}

/// Reads a `.npy` file.
pub fn read(path: &std::path::Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A tensor as the bytes of a `.npy` file.
pub fn to_bytes(t: &Tensor) -> Result<Vec<u8>, String> {
    let descr = descr_of(t.dtype())
        .ok_or_else(|| format!("NumPy has no {} type: convert the tensor (e.g. to float32) first", t.dtype()))?;
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // magic + version + length field + header + '\n' is a multiple of 64
    let (version, len_field) = if header.len() + 11 <= u16::MAX as usize { (1u8, 2usize) } else { (2, 4) };
    let unpadded = 6 + 2 + len_field + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(6 + 2 + len_field + header.len() + t.meta_nbytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    let t = t.contiguous().map_err(|e| e.to_string())?;
    let e = |e: ferrofx_core::Error| e.to_string();
    match t.dtype() {
        DType::Bool => out.extend(t.to_vec::<bool>().map_err(e)?.into_iter().map(u8::from)),
        DType::U8 => out.extend(t.to_vec::<u8>().map_err(e)?),
        DType::I8 => out.extend(t.to_vec::<i8>().map_err(e)?.into_iter().map(|v| v as u8)),
        DType::I16 => out.extend(t.to_vec::<i16>().map_err(e)?.into_iter().flat_map(i16::to_le_bytes)),
        DType::I32 => out.extend(t.to_vec::<i32>().map_err(e)?.into_iter().flat_map(i32::to_le_bytes)),
        DType::I64 => out.extend(t.to_vec::<i64>().map_err(e)?.into_iter().flat_map(i64::to_le_bytes)),
        DType::F16 => out.extend(t.to_vec::<half::f16>().map_err(e)?.into_iter().flat_map(|v| v.to_le_bytes())),
        DType::F32 => out.extend(t.to_vec::<f32>().map_err(e)?.into_iter().flat_map(f32::to_le_bytes)),
        DType::F64 => out.extend(t.to_vec::<f64>().map_err(e)?.into_iter().flat_map(f64::to_le_bytes)),
        DType::BF16 => unreachable!("rejected above"),
    }
    Ok(out)
}

/// Writes a tensor as a `.npy` file.
pub fn write(t: &Tensor, path: &std::path::Path) -> Result<(), String> {
    let bytes = to_bytes(t)?;
    ferrofx_core::atomic_file::write_atomic_bytes("npy", path, &bytes).map_err(|e| e.message().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        let x = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0, 7.0, 8.5], &[2, 3]).unwrap();
        for d in
            [DType::F32, DType::F64, DType::F16, DType::I64, DType::I32, DType::I16, DType::I8, DType::U8, DType::Bool]
        {
            let t = x.to_dtype(d).unwrap();
            let bytes = to_bytes(&t).unwrap();
            assert_eq!(&bytes[..6], MAGIC);
            let header_end = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!(header_end % 64, 0, "{d}: header padded to 64 bytes");
            let back = from_bytes(&bytes).unwrap();
            assert_eq!(back.dtype(), d);
            assert_eq!(back.shape(), &[2, 3]);
            assert_eq!(back.to_vec_f64().unwrap(), t.to_vec_f64().unwrap(), "{d}");
        }
        let s = Tensor::from_vec(vec![4i64], &[]).unwrap();
        assert_eq!(from_bytes(&to_bytes(&s).unwrap()).unwrap().shape(), &[] as &[usize]);
        let v = Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap();
        assert!(String::from_utf8_lossy(&to_bytes(&v).unwrap()).contains("'shape': (2,)"));
    }

    /// What `numpy.save(np.arange(6, dtype='<f4').reshape(2, 3, order='F'))` writes: Fortran
    /// order is read back as the same logical array.
    #[test]
    fn fortran_order() {
        let mut header = String::from("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }");
        let unpadded = 10 + header.len() + 1;
        header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
        header.push('\n');
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        // column-major storage of [[0, 1, 2], [3, 4, 5]]
        for v in [0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let t = from_bytes(&bytes).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }

    /// `bytes` with the first `from` replaced by `to` (same length, so the header stays valid).
    fn patched(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let i = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect("pattern");
        let mut out = bytes.to_vec();
        out[i..i + to.len()].copy_from_slice(to.as_bytes());
        out
    }

    /// Files NumPy wrote (`scripts/goldens/gen_npy.py`).
    #[test]
    fn reads_what_numpy_writes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let f = read(&dir.join("fortran_i64.npy")).unwrap();
        assert_eq!((f.shape(), f.dtype()), (&[2usize, 3, 4][..], DType::I64));
        assert_eq!(f.to_vec::<i64>().unwrap(), (0..24).collect::<Vec<i64>>());
        let s = read(&dir.join("scalar_f64.npy")).unwrap();
        assert_eq!((s.shape(), s.to_vec::<f64>().unwrap()), (&[] as &[usize], vec![2.5]));
        let d = read(&dir.join("digits2.npy")).unwrap();
        assert_eq!(d.shape(), &[2, 1, 8, 8]);
        // the first digit's first row is 0 0 5 13 9 1 0 0 (divided by 16)
        let v = d.to_vec::<f32>().unwrap();
        assert_eq!(&v[..8], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0, 9.0 / 16.0, 1.0 / 16.0, 0.0, 0.0]);
    }

    #[test]
    fn damaged_files_are_errors() {
        let good = to_bytes(&Tensor::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap()).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"PK\x03\x04 not npy".to_vec(), "magic"),
            (good[..good.len() - 1].to_vec(), "needs 16"),
            (good[..20].to_vec(), "truncated"),
            (
                {
                    let mut b = good.clone();
                    b[6] = 9;
                    b
                },
                "version 9.0",
            ),
            (patched(&good, "<f4", ">f4"), "big-endian"),
            (patched(&good, "<f4", "<c8"), "not supported"),
            (patched(&good, "(2, 2)", "(2, x)"), "bad dimension"),
            (patched(&good, "(2, 2), }                   ", "(9999999999999999, 99999), }"), "overflows"),
            (patched(&good, "'descr'", "'descx'"), "unexpected key 'descx'"),
            (patched(&good, "'fortran_order': False, ", "'descr': '<f4',         "), "twice"),
            (patched(&good, "'shape': (2, 2), }", "'shape': [2, 2], }"), "a tuple for 'shape'"),
            (patched(&good, "False", "Fals0"), "fortran_order is 'Fals0'"),
            (patched(&good, ", }", "} }"), "text after its dict"),
            (patched(&good, "'shape': (2, 2), }", "'shape': (2, 2)   "), "',' or '}'"),
            (patched(&good, "(2, 2)", "(4)   "), "not a tuple"),
            (
                {
                    let mut b = good.clone();
                    let end = 10 + u16::from_le_bytes([b[8], b[9]]) as usize;
                    b[end - 1] = b' '; // the newline ending the header
                    b
                },
                "newline",
            ),
            (
                {
                    // header shortened by 1 byte: the data no longer starts on the alignment
                    let mut b = good.clone();
                    b[8] -= 1;
                    b
                },
                "not aligned",
            ),
        ];
        for (bytes, want) in cases {
            let err = from_bytes(&bytes).expect_err(want);
            assert!(err.contains(want), "expected '{want}' in: {err}");
        }
        let bf = Tensor::from_vec(vec![1.0f32], &[1]).unwrap().to_dtype(DType::BF16).unwrap();
        assert!(to_bytes(&bf).unwrap_err().contains("NumPy has no"));
    }
}
