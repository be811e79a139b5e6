//! `dst[j] = src[2 j]`: the gather of every other element that im2col does for each row of a
//! stride-2 convolution (ResNet's 3x3 stride-2 layers), on AVX-512 two 16-lane loads
//! deinterleaved by one `vpermt2d` per 16 outputs instead of a scalar loop. Any 4-byte element
//! type: the permute moves bits, it does no arithmetic.

/// Whether [`copy`] runs vectorised for elements of type `T` on this CPU.
pub(super) fn available<T>() -> bool {
    std::mem::size_of::<T>() == 4 && super::avx512()
}

/// Whether im2col rows at column stride `sw` are gathered by [`copy`] for elements of type `T`.
pub(super) fn applies<T>(sw: usize) -> bool {
    sw == 2 && available::<T>()
}

/// `dst[j] = src[2 j]` for every `j < dst.len()`.
///
/// # Panics
/// If `src` is shorter than `2 * dst.len() - 1`, or if not [`available`] for `T`.
pub(super) fn copy<T: Copy>(src: &[T], dst: &mut [T]) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    assert!(src.len() > 2 * (n - 1), "every_other::copy: source of {} for {n} outputs", src.len());
    assert!(available::<T>(), "every_other::copy: 4-byte elements on AVX-512 only (checked by `available`)");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F and 4-byte elements (asserted above); the kernel reads only src[..len]
    // (masked loads) and writes only dst[..n].
    unsafe {
        avx512::copy(src.as_ptr().cast::<u32>(), src.len(), dst.as_mut_ptr().cast::<u32>(), n)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// The lanes of a 16-lane load at `s` that lie below `len`.
    #[inline(always)]
    fn below(s: usize, len: usize) -> __mmask16 {
        let k = len.saturating_sub(s).min(16) as u32;
        if k == 16 {
            0xffff
        } else {
            ((1u32 << k) - 1) as __mmask16
        }
    }

    /// # Safety
    /// AVX-512F; `src` readable for `len` elements, `dst` writable for `n`, `len > 2 (n - 1)`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy(src: *const u32, len: usize, dst: *mut u32, n: usize) {
        let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        let mut j = 0;
        while j < n {
            let s = 2 * j;
            // masked-off lanes are not read: nothing past src[len - 1] is touched
            let a = _mm512_maskz_loadu_epi32(below(s, len), src.add(s).cast());
            let b = _mm512_maskz_loadu_epi32(below(s + 16, len), src.wrapping_add(s + 16).cast());
            let store = below(j, n);
            _mm512_mask_storeu_epi32(dst.add(j).cast(), store, _mm512_permutex2var_epi32(a, even, b));
            j += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_other_element_for_every_length_and_source_slack() {
        if !super::available::<f32>() {
            return;
        }
        let src: Vec<f32> = (0..100).map(|i| i as f32 * 0.5 - 7.0).collect();
        for n in 0..=50 {
            // the shortest source allowed, and one longer
            for extra in [0usize, 1] {
                let len = if n == 0 { 0 } else { 2 * (n - 1) + 1 + extra };
                let mut dst = vec![f32::NAN; n + 3];
                super::copy(&src[..len], &mut dst[..n]);
                for j in 0..n {
                    assert_eq!(dst[j].to_bits(), src[2 * j].to_bits(), "n {n} extra {extra} j {j}");
                }
                assert!(dst[n..].iter().all(|v| v.is_nan()), "wrote past the end at n {n}");
            }
        }
        let ints: Vec<i32> = (0..40).collect();
        let mut out = [0i32; 20];
        super::copy(&ints[..39], &mut out);
        assert_eq!(out.to_vec(), (0..20).map(|j| 2 * j).collect::<Vec<_>>());
    }
}
