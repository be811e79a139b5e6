//! Raw helpers the engine needs without recording history: same-dtype addition, in-place
//! accumulation, ones and copies. Floating dtypes only (gradients are floating point).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::kernel;
use crate::tensor::Tensor;

fn add_typed<T: Element>(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    kernel::binary_map::<T, T>("autograd_accumulate", a, b, |x, y| T::from_f64(x.to_f64() + y.to_f64()))
}

/// `a + b` (b converted to a's dtype), no history.
pub(crate) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let b = if b.dtype() != a.dtype() { kernel::cast(b, a.dtype())? } else { b.clone() };
    match a.dtype() {
        DType::F32 => kernel::binary_map::<f32, f32>("autograd_accumulate", a, &b, |x, y| x + y),
        DType::F64 => kernel::binary_map::<f64, f64>("autograd_accumulate", a, &b, |x, y| x + y),
        DType::F16 => add_typed::<half::f16>(a, &b),
        DType::BF16 => add_typed::<half::bf16>(a, &b),
        d => Err(Error::dtype("autograd", format!("gradients must be floating point, got {d}"))),
    }
}

/// `dst += src` directly in `dst`'s buffer when both are contiguous with one shape and one
/// float dtype and do not share storage; `false` (nothing written) otherwise.
fn add_assign_contiguous(dst: &Tensor, src: &Tensor) -> bool {
    fn go<T: Element + std::ops::AddAssign>(
        d: &mut crate::storage::CpuBuffer,
        od: usize,
        s: &crate::storage::CpuBuffer,
        os: usize,
        n: usize,
    ) -> bool {
        match (d.as_mut_slice::<T>(), s.as_slice::<T>()) {
            (Some(d), Some(s)) if od + n <= d.len() && os + n <= s.len() => {
                for (x, &y) in d[od..od + n].iter_mut().zip(&s[os..os + n]) {
                    *x += y;
                }
                true
            }
            _ => false,
        }
    }
    let (Some(sd), Some(ld), Some(ss), Some(ls)) = (dst.storage(), dst.layout(), src.storage(), src.layout()) else {
        return false;
    };
    if sd.same(ss)
        || ld.shape() != ls.shape()
        || !ld.is_contiguous()
        || !ls.is_contiguous()
        || dst.dtype() != src.dtype()
    {
        return false;
    }
    let n = ld.numel();
    let gs = ss.read();
    let mut gd = sd.write();
    match dst.dtype() {
        DType::F32 => go::<f32>(&mut gd, ld.offset(), &gs, ls.offset(), n),
        DType::F64 => go::<f64>(&mut gd, ld.offset(), &gs, ls.offset(), n),
        _ => false,
    }
}

/// `dst += src` in place (bumps dst's version).
pub(crate) fn add_assign(dst: &Tensor, src: &Tensor) -> Result<()> {
    if add_assign_contiguous(dst, src) {
        dst.bump_version();
        return Ok(());
    }
    let s = add(dst, src)?;
    kernel::copy_into("autograd_accumulate", dst, &s)?;
    dst.bump_version();
    Ok(())
}

/// A fresh contiguous copy (never aliases `t`).
pub(crate) fn copy(t: &Tensor) -> Result<Tensor> {
    let d = t.dtype();
    crate::match_dtype!(d, T => kernel::unary_map::<T, T>("autograd_copy", t, |x| x))
}

/// A tensor of ones with `t`'s shape and dtype.
pub(crate) fn ones_like(t: &Tensor) -> Result<Tensor> {
    let n = t.numel();
    let d = t.dtype();
    crate::match_dtype!(d, T => Tensor::from_vec(vec![T::from_f64(1.0); n], t.shape()))
}
