//! The two products of the fused f32 attention (`attention.rs`) on AVX-512 register tiles:
//! the scores `Q Kᵀ · scale (+ mask)` and the output `P V` of one block of query rows.
//!
//! Both are `C = A B` with a short `A` (the block's query rows, or their probabilities) read
//! in place through its strides, and a `B` of one matrix of the batch (`Kᵀ`, `E x S`, or `V`,
//! `S x Ev`) that is small (a head: 128 x 32 floats in a MiniLM-sized encoder) and reused by
//! every row of the block. The `gemm` crate spent about 50 µs per head of 128 x 128 x 32 on
//! these (20 GFLOP/s: its packing and blocking are made for large matrices, and `Kᵀ` is read
//! across its rows). Here `B` is copied once per call into rows of 16-float vectors (zero past
//! its columns), and a tile of `MR` rows x `NV` vectors keeps its sums in registers over the
//! whole reduction: per reduction index, `NV` loads of `B`, `MR` broadcasts of `A` and
//! `MR x NV` FMAs. Each sum is a plain FMA chain in reduction order (the `gemm` crate blocks
//! the reduction differently: results agree to float rounding).
//!
//! The row softmax between them ([`row_max`], [`exp_normalize`]) runs 16 lanes wide with
//! `vscalefps` for the `2^n` of `exp`; the generic vectorised one (`vmath`, 8 lanes for its f64
//! sums) took 60% of a MiniLM-sized attention.

/// `B` (`k x n`, element `(r, c)` at `src[r * rs + c * cs]`) copied into `dst` as `k` rows
/// of `np = n` rounded up to 16 floats, zero past `n`; returns `np`.
///
/// # Safety
/// Every element `(r, c)`, `r < k`, `c < n`, of `src` must be readable.
pub(super) unsafe fn pack_b(src: *const f32, rs: isize, cs: isize, k: usize, n: usize, dst: &mut Vec<f32>) -> usize {
    let np = n.next_multiple_of(16);
    dst.clear();
    dst.resize(k * np, 0.0);
    for (r, row) in dst.chunks_exact_mut(np.max(1)).take(k).enumerate() {
        let base = src.offset(r as isize * rs);
        if cs == 1 {
            std::ptr::copy_nonoverlapping(base, row.as_mut_ptr(), n);
        } else {
            for (c, x) in row[..n].iter_mut().enumerate() {
                *x = *base.offset(c as isize * cs);
            }
        }
    }
    np
}

/// Whether [`gemm_packed_b`] runs on this CPU (AVX-512F).
pub(super) fn available() -> bool {
    crate::ops::simd::avx512f()
}

/// `C[i][j] = (read_c ? C[i][j] : 0) + alpha * Σ_t A[i][t] B[t][j]` for `i < m`, `j < n`:
/// `A` element `(i, t)` at `a[i * a_rs + t * a_cs]`, `B` packed by [`pack_b`] (`k` rows of
/// `np` floats), `C` row `i` at `c + i * c_rs` (contiguous columns).
///
/// # Safety
/// [`available`] must hold; `A`'s `m x k` elements readable, `b` holding `k * np` floats with
/// `np >= n` rounded up to 16, and `C`'s `m x n` elements writable and not aliased by `A`/`B`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_packed_b(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    a_rs: isize,
    a_cs: isize,
    b: &[f32],
    np: usize,
    c: *mut f32,
    c_rs: usize,
    read_c: bool,
    alpha: f32,
) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(np >= n && np.is_multiple_of(16) && b.len() >= k * np, "attention tiles: packed B");
        avx512::gemm(m, n, k, a, a_rs, a_cs, b.as_ptr(), np, c, c_rs, read_c, alpha);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, n, k, a, a_rs, a_cs, b, np, c, c_rs, read_c, alpha);
        unreachable!("attention tiles: AVX-512 only (checked by `available`)");
    }
}

/// The maximum of `row` (`-inf` when empty), NaN when any element is NaN (as `vmath::max`).
///
/// # Safety
/// [`available`] must hold.
pub(super) unsafe fn row_max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::row_max(row)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = row;
        unreachable!("attention tiles: AVX-512 only (checked by `available`)");
    }
}

/// `row[i] = exp(row[i] - mx) / Σ exp(row[j] - mx)` (the sum accumulated in f64), for a
/// finite or `+inf` maximum `mx` of the row (no NaN in it).
///
/// # Safety
/// [`available`] must hold.
pub(super) unsafe fn exp_normalize(row: &mut [f32], mx: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::exp_normalize(row, mx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (row, mx);
        unreachable!("attention tiles: AVX-512 only (checked by `available`)");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Where a tile reads and writes: `A`'s rows (the last real row repeated past `m`), how
    /// many rows are stored, and the epilogue.
    struct Rows<const MR: usize> {
        a: [*const f32; MR],
        c: [*mut f32; MR],
        store: usize,
    }

    /// One tile: rows `rows`, columns `j0..j0 + 16 NV` of `C` (stored up to `n`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const MR: usize, const NV: usize>(
        rows: &Rows<MR>,
        a_cs: isize,
        k: usize,
        b: *const f32,
        np: usize,
        j0: usize,
        n: usize,
        read_c: bool,
        alpha: f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let mut bp = b.add(j0);
        for t in 0..k {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(bp.add(16 * v));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*rows.a[r].offset(t as isize * a_cs));
                for (s, y) in row.iter_mut().zip(bv.iter()) {
                    *s = _mm512_fmadd_ps(x, *y, *s);
                }
            }
            bp = bp.add(np);
        }
        let al = _mm512_set1_ps(alpha);
        for (r, row) in acc.iter().enumerate().take(rows.store) {
            for (v, s) in row.iter().enumerate() {
                let j = j0 + 16 * v;
                if j >= n {
                    break;
                }
                let mask: __mmask16 = if n - j >= 16 { 0xffff } else { ((1u32 << (n - j)) - 1) as u16 };
                let p = rows.c[r].add(j);
                let val = if read_c {
                    _mm512_fmadd_ps(al, *s, _mm512_maskz_loadu_ps(mask, p))
                } else {
                    _mm512_mul_ps(al, *s)
                };
                _mm512_mask_storeu_ps(p, mask, val);
            }
        }
    }

    /// All column tiles of one block of `MR` rows.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const MR: usize, const NV: usize>(
        rows: &Rows<MR>,
        a_cs: isize,
        k: usize,
        b: *const f32,
        np: usize,
        n: usize,
        read_c: bool,
        alpha: f32,
    ) {
        let nvec = n.div_ceil(16);
        let mut v = 0;
        while v + NV <= nvec {
            tile::<MR, NV>(rows, a_cs, k, b, np, 16 * v, n, read_c, alpha);
            v += NV;
        }
        match nvec - v {
            0 => {}
            1 => tile::<MR, 1>(rows, a_cs, k, b, np, 16 * v, n, read_c, alpha),
            2 => tile::<MR, 2>(rows, a_cs, k, b, np, 16 * v, n, read_c, alpha),
            _ => tile::<MR, 3>(rows, a_cs, k, b, np, 16 * v, n, read_c, alpha),
        }
    }

    /// Row blocks of `MR` (the last one's missing rows repeat its last real row, not stored).
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<const MR: usize, const NV: usize>(
        m: usize,
        n: usize,
        k: usize,
        a: *const f32,
        a_rs: isize,
        a_cs: isize,
        b: *const f32,
        np: usize,
        c: *mut f32,
        c_rs: usize,
        read_c: bool,
        alpha: f32,
    ) {
        let mut i0 = 0;
        while i0 < m {
            let store = (m - i0).min(MR);
            let r = |i: usize| i0 + i.min(store - 1);
            let rows = Rows::<MR> {
                a: std::array::from_fn(|i| a.offset(r(i) as isize * a_rs)),
                c: std::array::from_fn(|i| c.add(r(i) * c_rs)),
                store,
            };
            block::<MR, NV>(&rows, a_cs, k, b, np, n, read_c, alpha);
            i0 += MR;
        }
    }

    /// See [`super::gemm_packed_b`]: 4 rows x 64 columns per tile (16 sums), or 8 rows x 32
    /// columns when `C` is at most 32 wide (an attention output of head size 32).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: *const f32,
        a_rs: isize,
        a_cs: isize,
        b: *const f32,
        np: usize,
        c: *mut f32,
        c_rs: usize,
        read_c: bool,
        alpha: f32,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        if n <= 32 {
            rows::<8, 2>(m, n, k, a, a_rs, a_cs, b, np, c, c_rs, read_c, alpha);
        } else {
            rows::<4, 4>(m, n, k, a, a_rs, a_cs, b, np, c, c_rs, read_c, alpha);
        }
    }

    /// The lanes `0..n.min(16)` as a mask.
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as u16
        }
    }

    /// See [`super::row_max`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row_max(row: &[f32]) -> f32 {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let (mut m, mut nan) = (ninf, 0u16);
        let mut i = 0;
        while i < row.len() {
            let k = lanes(row.len() - i);
            let x = _mm512_mask_loadu_ps(ninf, k, row.as_ptr().add(i));
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            m = _mm512_max_ps(m, x);
            i += 16;
        }
        if nan != 0 {
            f32::NAN
        } else {
            _mm512_reduce_max_ps(m)
        }
    }

    /// `e^x` of 16 lanes for `x <= 0` (the shifted scores, no NaN): `vmath::exp`'s range
    /// reduction and polynomial, with FMAs and `2^n` by `vscalefps` (one rounding, subnormal
    /// results included); below -104 (and at `-inf`) the result is 0.
    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        let lo = _mm512_set1_ps(-104.0);
        let xc = _mm512_max_ps(x, lo);
        // n = round(x / ln 2): adding and subtracting 1.5 * 2^23 rounds to the nearest integer
        let magic = _mm512_set1_ps(12_582_912.0);
        let n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E), magic), magic);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let z = _mm512_mul_ps(r, r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0));
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, lo), _mm512_scalef_ps(y, n))
    }

    /// See [`super::exp_normalize`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_normalize(row: &mut [f32], mx: f32) {
        let shift = _mm512_set1_ps(mx);
        let (mut lo, mut hi) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        let p = row.as_mut_ptr();
        let mut i = 0;
        while i < row.len() {
            let k = lanes(row.len() - i);
            let e = _mm512_maskz_mov_ps(k, exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(i)), shift)));
            _mm512_mask_storeu_ps(p.add(i), k, e);
            lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
            hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)))));
            i += 16;
        }
        let sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        let mut i = 0;
        while i < row.len() {
            let k = lanes(row.len() - i);
            _mm512_mask_storeu_ps(p.add(i), k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p.add(i)), inv));
            i += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// Every tile shape and tail (rows past a block of 4 or 8, columns past a vector or a
    /// 4-vector tile, an empty reduction), a strided `A` and a transposed `B`, with and without
    /// accumulating into `C`, equal the f64 product to float rounding.
    #[test]
    fn packed_gemm_matches_f64_on_every_tail() {
        if !available() {
            return;
        }
        for (m, n, k) in [(1, 1, 1), (3, 17, 5), (9, 32, 8), (8, 31, 0), (13, 70, 33), (4, 64, 16), (22, 140, 8)] {
            // A: m x k stored transposed with a padded row (a_rs = 1, a_cs = m + 3)
            let a = rnd((m + 3) * k.max(1), 1);
            // B: k x n stored as n x k (rs = 1, cs = k + 2), as Kᵀ is read
            let b = rnd(n * (k + 2), 2);
            let mut packed = Vec::new();
            // SAFETY: B's k x n elements lie inside `b` (index r + c * (k + 2))
            let np = unsafe { pack_b(b.as_ptr(), 1, (k + 2) as isize, k, n, &mut packed) };
            for read_c in [false, true] {
                let c0 = rnd(m * (n + 5), 3);
                let mut c = c0.clone();
                // SAFETY: AVX-512F checked above; operands sized as documented
                unsafe {
                    gemm_packed_b(
                        m,
                        n,
                        k,
                        a.as_ptr(),
                        1,
                        (m + 3) as isize,
                        &packed,
                        np,
                        c.as_mut_ptr(),
                        n + 5,
                        read_c,
                        0.5,
                    )
                };
                for i in 0..m {
                    for j in 0..n + 5 {
                        let got = c[i * (n + 5) + j];
                        if j >= n {
                            assert_eq!(got, c0[i * (n + 5) + j], "column {j} past n = {n} untouched");
                            continue;
                        }
                        let dot: f64 = (0..k).map(|t| a[i + t * (m + 3)] as f64 * b[t + j * (k + 2)] as f64).sum();
                        let want = if read_c { c0[i * (n + 5) + j] as f64 } else { 0.0 } + 0.5 * dot;
                        assert!(
                            (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{m}x{n}x{k} ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The row softmax equals f64's on rows of every tail length, with masked (`-inf`) and
    /// underflowing entries; the maximum reports NaN.
    #[test]
    fn row_softmax_matches_f64() {
        if !available() {
            return;
        }
        for len in [1usize, 5, 16, 17, 40, 128, 131] {
            let mut row: Vec<f32> = rnd(len, len as u64).iter().map(|v| v * 20.0).collect();
            if len > 3 {
                row[1] = f32::NEG_INFINITY;
                row[len - 1] = -200.0;
            }
            // SAFETY: AVX-512F checked above
            let mx = unsafe { row_max(&row) };
            assert_eq!(mx, row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            let e: Vec<f64> = row.iter().map(|&v| ((v - mx) as f64).exp()).collect();
            let sum: f64 = e.iter().sum();
            let mut got = row.clone();
            // SAFETY: as above
            unsafe { exp_normalize(&mut got, mx) };
            for (g, w) in got.iter().zip(&e) {
                assert!((*g as f64 - w / sum).abs() <= 2e-7 + 2e-6 * w / sum, "len {len}: {g} vs {}", w / sum);
            }
            if len > 3 {
                assert_eq!(got[1], 0.0, "a masked score has probability 0");
            }
            row[len / 2] = f32::NAN;
            // SAFETY: as above
            assert!(unsafe { row_max(&row) }.is_nan());
        }
    }
}
