//! Shared by the PyTorch golden runners: reading a tensor out of a safetensors golden file.

use ferrofx_core::{DType, Tensor};
use safetensors::{Dtype as StDtype, SafeTensors};

pub fn st_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::BOOL => DType::Bool,
        StDtype::U8 => DType::U8,
        StDtype::I8 => DType::I8,
        StDtype::I16 => DType::I16,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        _ => return None,
    })
}

pub fn load_tensor(st: &SafeTensors, key: &str) -> Result<Tensor, String> {
    let view = st.tensor(key).map_err(|e| format!("missing tensor {key}: {e}"))?;
    let dtype = st_dtype(view.dtype()).ok_or_else(|| format!("{key}: unsupported dtype {:?}", view.dtype()))?;
    let shape = view.shape().to_vec();
    let bytes = view.data();
    macro_rules! le {
        ($t:ty, $n:expr) => {
            bytes.chunks_exact($n).map(|c| <$t>::from_le_bytes(c.try_into().unwrap())).collect::<Vec<$t>>()
        };
    }
    let t = match dtype {
        DType::Bool => Tensor::from_vec(bytes.iter().map(|&b| b != 0).collect::<Vec<bool>>(), &shape),
        DType::U8 => Tensor::from_vec(bytes.to_vec(), &shape),
        DType::I8 => Tensor::from_vec(bytes.iter().map(|&b| b as i8).collect::<Vec<i8>>(), &shape),
        DType::I16 => Tensor::from_vec(le!(i16, 2), &shape),
        DType::I32 => Tensor::from_vec(le!(i32, 4), &shape),
        DType::I64 => Tensor::from_vec(le!(i64, 8), &shape),
        DType::F16 => Tensor::from_vec(le!(u16, 2).into_iter().map(half::f16::from_bits).collect::<Vec<_>>(), &shape),
        DType::BF16 => Tensor::from_vec(le!(u16, 2).into_iter().map(half::bf16::from_bits).collect::<Vec<_>>(), &shape),
        DType::F32 => Tensor::from_vec(le!(f32, 4), &shape),
        DType::F64 => Tensor::from_vec(le!(f64, 8), &shape),
    };
    t.map_err(|e| format!("{key}: {e}"))
}
