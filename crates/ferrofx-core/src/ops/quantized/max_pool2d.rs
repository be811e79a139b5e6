//! `max_pool2d` on channels-last uint8 tensors (the max-pool after the stem of a quantized
//! ResNet): each output pixel is the byte-wise maximum of its window's channel vectors, and the
//! output stays channels-last, so the convolutions after it read their operand (and their
//! residual adds their identity) without a transpose. Values equal the row-major kernel's (a
//! maximum does not depend on the layout); a row-major input keeps the generic kernel.

use super::channels_last;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::pool::PoolGeom;
use crate::tensor::Tensor;

/// The max-pool of `x` when it is a channels-last uint8 `[N, C, H, W]` tensor (channels-last
/// output), else `None` (the caller runs the generic kernel).
pub(crate) fn max_pool2d_channels_last(op: &str, x: &Tensor, win: &PoolGeom) -> Result<Option<Tensor>> {
    if x.dtype() != DType::U8 {
        return Ok(None);
    }
    let Some([n, c, h, w]) = channels_last::dims(x) else {
        return Ok(None);
    };
    let (oh, ow) = (win.oh, win.ow);
    let mut out = crate::memory::alloc_filled::<u8>(op, &[n, c, oh, ow], 0)?;
    if out.is_empty() {
        return Ok(Some(channels_last::tensor(op, out, [n, c, oh, ow])?));
    }
    channels_last::with_bytes(x, op, |xv| {
        crate::ops::team::chunks_mut(&mut out, ow * c, |row, dst_row| {
            let (img, y) = (row / oh, row % oh);
            let src = &xv[img * h * w * c..(img + 1) * h * w * c];
            // the window's rows inside the input (the same for every pixel of the output row)
            let rows: Vec<usize> =
                (0..win.kh).filter_map(|i| (y * win.sh + i * win.dh).checked_sub(win.ph).filter(|&v| v < h)).collect();
            let mut cols = Vec::with_capacity(win.kw);
            for (x0, dst) in dst_row.chunks_exact_mut(c).enumerate() {
                cols.clear();
                cols.extend(
                    (0..win.kw).filter_map(|j| (x0 * win.sw + j * win.dw).checked_sub(win.pw).filter(|&v| v < w)),
                );
                // 64 channels at a time in a register-sized accumulator (0 is the identity of
                // a byte maximum; a window with no input pixel stays 0, as before)
                let mut c0 = 0;
                while c0 < c {
                    let len = (c - c0).min(64);
                    let mut acc = [0u8; 64];
                    for &ih in &rows {
                        for &iw in &cols {
                            let at = (ih * w + iw) * c + c0;
                            let px = &src[at..at + len];
                            if len == 64 {
                                let px: &[u8; 64] = px.try_into().expect("64 bytes");
                                acc.iter_mut().zip(px).for_each(|(a, &v)| *a = (*a).max(v));
                            } else {
                                acc.iter_mut().zip(px).for_each(|(a, &v)| *a = (*a).max(v));
                            }
                        }
                    }
                    dst[c0..c0 + len].copy_from_slice(&acc[..len]);
                    c0 += len;
                }
            }
        })
    })?;
    Ok(Some(channels_last::tensor(op, out, [n, c, oh, ow])?))
}

#[cfg(test)]
mod tests {
    use crate::ops::pool::max_pool2d;
    use crate::tensor::Tensor;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// A channels-last uint8 input gives the row-major kernel's values, channels-last.
        #[test]
        fn channels_last_max_pool_equals_row_major(n in 1usize..3, c in 2usize..20, h in 2usize..12, w in 1usize..12,
                                                   k in 1usize..4, s in 1usize..3, d in 1usize..3, ceil: bool, seed: u64) {
            // C >= 2 and H * W >= 2: a layout distinct from row-major; windows fit the input
            let pad = k / 2;
            let span = d * (k - 1) + 1;
            let (h, w) = (h.max(span), w.max(span));
            let mut state = seed | 1;
            let v: Vec<u8> = (0..n * c * h * w).map(|_| { state ^= state << 13; state ^= state >> 7; state ^= state << 17; (state >> 24) as u8 }).collect();
            let x = Tensor::from_vec(v, &[n, c, h, w]).unwrap();
            let xcl = x.permute(&[0, 2, 3, 1]).unwrap().contiguous().unwrap().permute(&[0, 3, 1, 2]).unwrap();
            prop_assert!(super::channels_last::dims(&xcl).is_some());
            let (k, s, p, d) = ([k as i64; 2], [s as i64; 2], [pad as i64; 2], [d as i64; 2]);
            let want = max_pool2d(&x, &k, &s, &p, &d, ceil).unwrap();
            let got = max_pool2d(&xcl, &k, &s, &p, &d, ceil).unwrap();
            prop_assert_eq!(got.shape(), want.shape());
            prop_assert!(super::channels_last::dims(&got).is_some() || got.shape()[1] == 1 || got.shape()[2] * got.shape()[3] == 1);
            prop_assert_eq!(got.to_vec::<u8>().unwrap(), want.to_vec::<u8>().unwrap());
        }
    }
}
