//! The float32 row-vector times matrix product (`[1, k] x [k, n]`, the matrix's rows
//! contiguous): a classifier's `addmm(b, x, Wt)` at batch 1, which reads the whole weight once
//! per call and is bound by that read.
//!
//! The `gemm` crate packs and blocks this product as it does a large one and read
//! MobileNetV2's 1280 x 1000 classifier at about 35 GB/s (two threads, Xeon), against ONNX
//! Runtime's 52 GB/s. Here each task owns a band of the matrix's rows, a contiguous block of
//! memory that the hardware prefetcher streams, and adds `a[k] * row k` into its own partial
//! output (4 rows per pass, the partial in the L1 cache); the partials are then summed in task
//! order and scaled.

/// Rows of the matrix per task at least (fewer: the partial outputs cost more than the split
/// saves).
const MIN_ROWS: usize = 64;

/// The float types' row-vector times matrix kernel: `dst[j] = prod_coef * sum_k a[k * a_cs] *
/// b[k * b_rs + j] (+ dst_coef * dst[j] when read_dst)` for `j < n`, on `threads` threads of the
/// kernel team; `false` (nothing done) where no such kernel applies: float64, no AVX-512, a
/// small product (the `gemm` crate's call overhead is then lower), strided output or matrix
/// columns.
pub(crate) trait RowGemv: Sized {
    /// See the trait.
    ///
    /// # Safety
    /// `a` readable at `k` elements `a_cs` apart, `b` at `k` rows of `n` contiguous elements
    /// `b_rs` apart, `dst` writable (and readable, with `read_dst`) at `n` contiguous elements,
    /// not overlapping `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_gemv(
        _n: usize,
        _k: usize,
        _dst: *mut Self,
        _dst_cs: isize,
        _read_dst: bool,
        _a: *const Self,
        _a_cs: isize,
        _b: *const Self,
        _b_rs: isize,
        _b_cs: isize,
        _dst_coef: Self,
        _prod_coef: Self,
        _threads: usize,
    ) -> bool {
        false
    }
}

impl RowGemv for f64 {}

impl RowGemv for f32 {
    unsafe fn row_gemv(
        n: usize,
        k: usize,
        dst: *mut f32,
        dst_cs: isize,
        read_dst: bool,
        a: *const f32,
        a_cs: isize,
        b: *const f32,
        b_rs: isize,
        b_cs: isize,
        dst_coef: f32,
        prod_coef: f32,
        threads: usize,
    ) -> bool {
        if !super::simd::avx512f() || dst_cs != 1 || b_cs != 1 || n < 64 || k < 16 || n * k < 1 << 16 {
            return false;
        }
        // beta = 0 ignores the output's old values (NaN included), as PyTorch's addmm
        let read_dst = read_dst && dst_coef != 0.0;
        let tasks = threads.max(1).min(k / MIN_ROWS).max(1);
        let rows = k.div_ceil(tasks);
        let tasks = k.div_ceil(rows);
        // one partial output per task (bounded: `n` floats per thread, and `n` is an existing
        // tensor's dimension)
        let mut partial = vec![0.0f32; tasks * n];
        // the addresses as integers: each task reads its rows and writes its own partial
        let (a, b) = (a as usize, b as usize);
        let task = |t: usize, part: &mut [f32]| {
            let (k0, k1) = (t * rows, ((t + 1) * rows).min(k));
            // SAFETY: AVX-512F (checked); rows k0..k1 of `b` and elements k0..k1 of `a` are inside
            // the operands (the caller's contract); `part` holds `n` floats
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx512::rows(n, k0, k1, a as *const f32, a_cs, b as *const f32, b_rs, part.as_mut_ptr())
            };
        };
        if tasks > 1 && super::team::parallel() {
            super::team::chunks_mut(&mut partial, n, task);
        } else {
            partial.chunks_mut(n).enumerate().for_each(|(t, p)| task(t, p));
        }
        for j in 0..n {
            let mut sum = partial[j];
            for t in 1..tasks {
                sum += partial[t * n + j];
            }
            let d = dst.add(j);
            *d = if read_dst { dst_coef * *d + prod_coef * sum } else { prod_coef * sum };
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `part[j] += sum over k0 <= kk < k1 of a[kk] * b[kk][j]` for `j < n`, 4 rows per pass.
    ///
    /// # Safety
    /// AVX-512F; as [`super::RowGemv::row_gemv`] for rows `k0..k1`; `part` holds `n` floats.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows(
        n: usize,
        k0: usize,
        k1: usize,
        a: *const f32,
        a_cs: isize,
        b: *const f32,
        b_rs: isize,
        part: *mut f32,
    ) {
        let mut kk = k0;
        while kk + 4 <= k1 {
            pass::<4>(n, kk, a, a_cs, b, b_rs, part);
            kk += 4;
        }
        while kk < k1 {
            pass::<1>(n, kk, a, a_cs, b, b_rs, part);
            kk += 1;
        }
    }

    /// `part[j] += sum over kk <= i < kk + R of a[i] * b[i][j]` for `j < n`.
    #[inline(always)]
    unsafe fn pass<const R: usize>(
        n: usize,
        kk: usize,
        a: *const f32,
        a_cs: isize,
        b: *const f32,
        b_rs: isize,
        part: *mut f32,
    ) {
        let tail = (n % 16) as u32;
        let (full, tmask) = (n - n % 16, ((1u32 << tail) - 1) as __mmask16);
        let x: [__m512; R] = std::array::from_fn(|i| _mm512_set1_ps(*a.offset((kk + i) as isize * a_cs)));
        let row: [*const f32; R] = std::array::from_fn(|i| b.offset((kk + i) as isize * b_rs));
        let mut j = 0;
        while j < full {
            let mut acc = _mm512_loadu_ps(part.add(j));
            for i in 0..R {
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(row[i].add(j)), x[i], acc);
            }
            _mm512_storeu_ps(part.add(j), acc);
            j += 16;
        }
        if tail > 0 {
            let mut acc = _mm512_maskz_loadu_ps(tmask, part.add(j));
            for i in 0..R {
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tmask, row[i].add(j)), x[i], acc);
            }
            _mm512_mask_storeu_ps(part.add(j), tmask, acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::random::randn;
    use crate::Tensor;

    /// `[1, k] x [k, n]` (plus `beta * c`) against a float64 sum, through `mm` and `addmm`.
    #[test]
    fn row_times_matrix_equals_float64_sums() {
        for (k, n) in [(1280usize, 1000usize), (512, 1000), (300, 257), (64, 1024), (2048, 130)] {
            let a = randn(&[1, k as i64], None).unwrap();
            let b = randn(&[k as i64, n as i64], None).unwrap();
            let c = randn(&[1, n as i64], None).unwrap();
            let (av, bv, cv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), c.to_vec::<f32>().unwrap());
            let want: Vec<f64> =
                (0..n).map(|j| (0..k).map(|i| av[i] as f64 * bv[i * n + j] as f64).sum::<f64>()).collect();
            let check = |got: &Tensor, beta: f64, what: &str| {
                let got = got.to_vec::<f32>().unwrap();
                assert_eq!(got.len(), n, "{what}");
                for j in 0..n {
                    let w = want[j] + beta * cv[j] as f64;
                    assert!(
                        (got[j] as f64 - w).abs() <= 1e-4 * (1.0 + (k as f64).sqrt()),
                        "{what} k {k} n {n} col {j}"
                    );
                }
            };
            check(&a.mm(&b).unwrap(), 0.0, "mm");
            check(&crate::ops::linalg::addmm(&c, &a, &b, 1.0, 1.0).unwrap(), 1.0, "addmm");
            check(&crate::ops::linalg::addmm(&c, &a, &b, 0.5, 1.0).unwrap(), 0.5, "addmm beta 0.5");
            // a transposed (strided) row vector
            let at = a.t().unwrap().contiguous().unwrap().t().unwrap();
            check(&at.mm(&b).unwrap(), 0.0, "mm of a strided row");
        }
        // beta = 0 ignores the input, NaN included (PyTorch's addmm)
        let (a, b) = (randn(&[1, 512], None).unwrap(), randn(&[512, 256], None).unwrap());
        let nan = crate::ops::creation::full(&[1, 256], f32::NAN, None).unwrap();
        let got = crate::ops::linalg::addmm(&nan, &a, &b, 0.0, 1.0).unwrap().to_vec::<f32>().unwrap();
        assert!(got.iter().all(|v| v.is_finite()));
    }
}
