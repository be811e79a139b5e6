//! The fast int8 GEMM of `quantized_linear` and `quantized_linear_dynamic`: weights packed once
//! per weight tensor into `vpdpbusd` panels, activations broadcast four bytes at a time, a
//! register tile of rows x output channels, and the epilogue (requantise to u8, or dequantize to
//! f32 + bias) applied to the tile in registers.
//!
//! **Packing** ([`PackedLinear`]): the `[N, K]` int8 weight becomes panels of [`PANEL`] output
//! channels (the last one narrower, a multiple of 16): panel `p` is `[ceil(K / 4)][width]`
//! little-endian words of four int8 weights (`K` positions `4q..4q + 4` of one channel; zero past
//! `K` and past `N`), so one 64-byte load gives 16 channels' words for one `k` quad, which is the
//! signed operand of `vpdpbusd`. The row sums (for the activation zero point's correction) are
//! packed with it. The packed weight is cached on the weight's storage (`Storage::derived`, as
//! the convolution's): it is built on first use, and again only after a write to the weight.
//!
//! **Micro-kernels**: AVX-512 VNNI: a tile of up to 8 rows x 48 channels (24 zmm accumulators);
//! per `k` quad, three panel vectors are loaded and each row's four activation bytes are
//! broadcast into one `vpdpbusd` per vector (u8 x s8 products summed into i32 exactly, no i16
//! intermediate, so activations use all 8 bits). AVX2: 4 rows x 16 channels, the u8/s8 bytes
//! split in registers into even/odd i16 pairs and multiplied with `vpmaddwd` (exact for all
//! inputs). Row tails run narrower tiles; the channel tail (the zero-padded lanes past `N`) is
//! computed and not stored.
//!
//! **Epilogue** ([`TileEpilogue`]): the per-channel parameters are read as vectors (the caller
//! pads them to [`PackedLinear::padded`] channels) and applied with the same f32 operations in
//! the same order as the scalar `Epilogue::apply` of `gemm.rs`, so every path is bit-identical
//! to the reference (whose i32 sums hold the same exact terms).
//!
//! **Threads**: tasks are (row block, panel block); columns are split first (each core streams
//! its own part of the weights, and a transformer's 128-token linears have few rows), rows when
//! there are too few panels. Within a task, rows are blocked by [`ROW_BLOCK`] and for each panel
//! every row tile of the block runs over the whole `K` (a panel of `K x 48` bytes stays in
//! L1/L2 while the rows pass over it).

use super::gemm::{Epilogue, Path};
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::Arc;

/// Output channels per panel (the VNNI tile's width: three 16-lane vectors).
pub(super) const PANEL: usize = 48;
/// Output channels per vector: `N` is packed in multiples of this.
const LANES: usize = 16;
/// Rows per block of a task (the rows that pass over one panel while it is in cache).
const ROW_BLOCK: usize = 192;

/// An `[N, K]` int8 weight packed for the micro-kernels (see the module docs).
pub(crate) struct PackedLinear {
    /// Output channels and reduction length of the weight.
    n: usize,
    k: usize,
    /// Words per channel: `ceil(K / 4)`.
    kq: usize,
    /// `N` rounded up to 16.
    npad: usize,
    /// The panels, one after the other: panel `p` starts at word `p * PANEL * kq`.
    w: Vec<i32>,
    /// `sum_k w[j, k]` for each of the `npad` channels (0 past `N`).
    pub(super) sums: Vec<i32>,
}

impl PackedLinear {
    /// Packs `w` (`[n, k]`, contiguous).
    pub(super) fn new(w: &[i8], n: usize, k: usize) -> PackedLinear {
        let kq = k.div_ceil(4);
        let npad = n.div_ceil(LANES) * LANES;
        let mut packed = vec![0i32; npad * kq];
        let mut sums = vec![0i32; npad];
        for (j, s) in sums.iter_mut().take(n).enumerate() {
            *s = w[j * k..(j + 1) * k].iter().map(|&v| v as i32).sum();
        }
        for (p, panel) in packed.chunks_mut((PANEL * kq).max(1)).enumerate() {
            let j0 = p * PANEL;
            let width = (npad - j0).min(PANEL);
            for c in 0..width.min(n.saturating_sub(j0)) {
                let row = &w[(j0 + c) * k..(j0 + c + 1) * k];
                for (q, quad) in row.chunks(4).enumerate() {
                    let mut bytes = [0u8; 4];
                    for (b, &v) in bytes.iter_mut().zip(quad) {
                        *b = v as u8;
                    }
                    panel[q * width + c] = i32::from_le_bytes(bytes);
                }
            }
        }
        PackedLinear { n, k, kq, npad, w: packed, sums }
    }

    /// The number of channels the epilogue's parameters must cover (`N` rounded up to 16).
    pub(super) fn padded(&self) -> usize {
        self.npad
    }

    fn panels(&self) -> usize {
        self.npad.div_ceil(PANEL)
    }

    /// Panel `p`: its words and its width in channels (48, or 16/32 for the last one).
    fn panel(&self, p: usize) -> (&[i32], usize) {
        let j0 = p * PANEL;
        let width = (self.npad - j0).min(PANEL);
        (&self.w[j0 * self.kq..(j0 + width) * self.kq], width)
    }
}

/// The packed form of the int8 weight `w` (`[n, k]`): cached on the weight's storage (packed
/// once per weight, again after any write to it), or packed for this call when `w` is a
/// non-contiguous view.
pub(super) fn packed_weight(op: &str, w: &Tensor, n: usize, k: usize) -> Result<Arc<PackedLinear>> {
    const KEY: usize = 0x11a7; // quantized_linear packed int8 weights
    cached_pack(op, w, &[KEY, n, k], n * k, |ws| Ok(PackedLinear::new(ws, n, k)))
}

/// `pack` of the first `len` elements of the int8 weight `w`, cached on its storage under `key`
/// and the weight's offset (packed once per weight, again after any write to it), or packed for
/// this call when `w` is a non-contiguous view.
pub(super) fn cached_pack<T: Send + Sync + 'static>(
    op: &str,
    w: &Tensor,
    key: &[usize],
    len: usize,
    pack: impl Fn(&[i8]) -> Result<T>,
) -> Result<Arc<T>> {
    if let (Some(st), Some(lay)) = (w.storage(), w.layout()) {
        if lay.is_contiguous() {
            let off = lay.offset();
            let key: Vec<usize> = key.iter().copied().chain([off]).collect();
            let cached = st.derived(&key, |buf| {
                buf.as_slice::<i8>().and_then(|v| v.get(off..off + len)).and_then(|ws| pack(ws).ok()).map(Arc::new)
            });
            if let Some(p) = cached.as_ref() {
                return Ok(Arc::clone(p));
            }
        }
    }
    w.with_contiguous::<i8, _>(op, |wv| pack(wv).map(Arc::new))?
}

/// Runs `f` on the activations `a` (`m x k` u8) with the slack [`linear_packed`] reads past the
/// last row: `a` itself when `k` is a multiple of 4, else a copy with 3 more bytes.
pub(super) fn with_quad_slack<R>(op: &str, a: &[u8], k: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    if k.is_multiple_of(4) {
        return Ok(f(a));
    }
    let mut buf = crate::memory::try_vec(op, a.len() + 3, 0u8)?;
    buf[..a.len()].copy_from_slice(a);
    Ok(f(&buf))
}

/// An epilogue the micro-kernels apply to a vector of channels in registers (implemented for
/// `Requant` and `DequantOut` by each instruction set's module).
#[cfg(target_arch = "x86_64")]
pub(super) trait TileEpilogue: Epilogue + vnni::Store16 + avx2::Store8 {}
#[cfg(target_arch = "x86_64")]
impl<T: Epilogue + vnni::Store16 + avx2::Store8> TileEpilogue for T {}
/// An epilogue the micro-kernels apply to a vector of channels in registers.
#[cfg(not(target_arch = "x86_64"))]
pub(super) trait TileEpilogue: Epilogue {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: Epilogue> TileEpilogue for T {}

/// The output pointer shared by the tasks (each writes its own rows x columns).
#[derive(Clone, Copy)]
struct OutPtr<T>(*mut T);
impl<T> OutPtr<T> {
    /// The pointer (a method, so that closures capture the `Send + Sync` wrapper, not the field).
    fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: the tasks write disjoint (row range, column range) blocks of the output.
unsafe impl<T: Send> Send for OutPtr<T> {}
// SAFETY: as above; nothing reads through the pointer.
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// Block boundaries: `parts` ranges of `0..len`, each start a multiple of `align`.
fn bounds(len: usize, parts: usize, align: usize) -> Vec<usize> {
    let mut b: Vec<usize> = (0..parts).map(|i| (i * len / parts) / align * align).collect();
    b.push(len);
    b.dedup();
    b
}

/// `out[i, j] = epilogue(sum_k a[i, k] * w[j, k], j)` for the `m` rows of `a` (`m x k` u8,
/// row-major; it must hold `ceil(k / 4) * 4 - k` readable bytes past the last row, whose values
/// do not matter: they meet zero weights) into `out` (`m x n`, row-major), on a fast path
/// (`path` is not `Path::Reference`). `epilogue` covers [`PackedLinear::padded`] channels.
pub(super) fn linear_packed<E: TileEpilogue>(
    path: Path,
    a: &[u8],
    m: usize,
    pw: &PackedLinear,
    e: &E,
    out: &mut [E::Out],
) {
    let (n, k) = (pw.n, pw.k);
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.len() >= (m - 1) * k + pw.kq * 4, "the activations need the k-quad slack");
    assert!(out.len() >= m * n && e.columns() >= pw.npad && pw.sums.len() == pw.npad);
    let panels = pw.panels();
    let threads = rayon::current_num_threads().max(1);
    let o = OutPtr(out.as_mut_ptr());
    let task = |i0: usize, i1: usize, p0: usize, p1: usize| {
        // SAFETY: the kernel reads rows `i0..i1` of `a` (`kq * 4` bytes each, in bounds by the
        // assertion above) and the panels `p0..p1`, and writes `out[i, j]` for `i` in `i0..i1`,
        // `j < n` of those panels (in bounds: `out.len() >= m * n`); the CPU has the path's
        // features (`Path::select` checks them).
        unsafe { run(path, a.as_ptr(), k, i0, i1, p0, p1, pw, e, o.get(), n) }
    };
    if threads == 1 || m * pw.npad * k.max(1) < 1 << 18 {
        task(0, m, 0, panels);
        return;
    }
    // about 4 tasks per thread (taken from a shared counter, they even out a busy core), columns first
    let target = 4 * threads;
    let cols = panels.min(target);
    let rows = (target / cols).clamp(1, m.div_ceil(8)).max(m / 1024);
    let (rb, cb) = (bounds(m, rows, 8), bounds(panels, cols, 1));
    let tasks: Vec<(usize, usize, usize, usize)> =
        rb.windows(2).flat_map(|r| cb.windows(2).map(move |c| (r[0], r[1], c[0], c[1]))).collect();
    // on the kernels' team (`ops::team`), as the convolutions
    crate::ops::team::for_each(tasks.len(), |t| {
        let (i0, i1, p0, p1) = tasks[t];
        task(i0, i1, p0, p1)
    });
}

/// Rows `i0..i1` x panels `p0..p1` on one thread.
///
/// # Safety
/// As stated at the call in [`linear_packed`].
#[allow(clippy::too_many_arguments)]
unsafe fn run<E: TileEpilogue>(
    path: Path,
    a: *const u8,
    lda: usize,
    i0: usize,
    i1: usize,
    p0: usize,
    p1: usize,
    pw: &PackedLinear,
    e: &E,
    out: *mut E::Out,
    n: usize,
) {
    let mut ib = i0;
    while ib < i1 {
        let ie = (ib + ROW_BLOCK).min(i1);
        for p in p0..p1 {
            let (w, width) = pw.panel(p);
            let j = p * PANEL;
            let cols = (n - j).min(width);
            match path {
                Path::Reference => unreachable!("the reference path does not pack the weights"),
                #[cfg(target_arch = "x86_64")]
                Path::Vnni | Path::Amx => vnni::panel(a, lda, ib, ie, w.as_ptr(), width, pw.kq, j, cols, e, out, n),
                #[cfg(target_arch = "x86_64")]
                Path::Avx2 => avx2::panel(a, lda, ib, ie, w.as_ptr(), width, pw.kq, j, cols, e, out, n),
            }
        }
        ib = ie;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod vnni {
    use super::super::gemm::{DequantOut, Epilogue, Requant};
    use std::arch::x86_64::*;

    /// Rows per register tile.
    const MR: usize = 8;

    /// The epilogue of 16 channels `j..j + 16` of one row, from their i32 sums, in registers.
    pub(crate) trait Store16: Epilogue {
        /// Writes the first `count` (1..=16) outputs to `dst`.
        ///
        /// # Safety
        /// AVX-512 F/BW/VL; the parameters cover channels `j..j + 16`; `dst..dst + count` is
        /// writable.
        unsafe fn store16(&self, acc: __m512i, j: usize, dst: *mut Self::Out, count: usize);
    }

    impl Store16 for Requant<'_> {
        /// `Requant::apply` per lane: the f32 operations in the same order, clamped in f32
        /// before the conversion (the scalar cast's result for out-of-range and infinite
        /// values), NaN to the zero point as `NaN as i64` gives.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn store16(&self, acc: __m512i, j: usize, dst: *mut u8, count: usize) {
            let sums = _mm512_loadu_si512(self.b_sums.as_ptr().add(j) as *const _);
            let raw = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(self.a_zp), sums));
            let f = _mm512_add_ps(_mm512_cvtepi32_ps(raw), _mm512_loadu_ps(self.bias_term.as_ptr().add(j)));
            let f = _mm512_mul_ps(f, _mm512_loadu_ps(self.multiplier.as_ptr().add(j)));
            let f = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(f, f), f);
            let lo = _mm512_set1_ps((self.lo - self.out_zp) as f32);
            let hi = _mm512_set1_ps((self.hi - self.out_zp) as f32);
            let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
            let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(self.out_zp));
            let mask = (((1u32 << count) - 1) & 0xffff) as u16;
            _mm_mask_storeu_epi8(dst as *mut i8, mask, _mm512_cvtepi32_epi8(q));
        }
    }

    impl Store16 for DequantOut<'_> {
        /// `DequantOut::apply` per lane: one fused multiply-add.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn store16(&self, acc: __m512i, j: usize, dst: *mut f32, count: usize) {
            let sums = _mm512_loadu_si512(self.b_sums.as_ptr().add(j) as *const _);
            let raw = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(self.a_zp), sums));
            let f = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(raw),
                _mm512_loadu_ps(self.scale.as_ptr().add(j)),
                _mm512_loadu_ps(self.bias.as_ptr().add(j)),
            );
            let mask = (((1u32 << count) - 1) & 0xffff) as u16;
            _mm512_mask_storeu_ps(dst, mask, f);
        }
    }

    /// A tile of `R` rows at `i` x `NV` vectors of 16 channels at `j` (`cols` of them real).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<E: Store16, const R: usize, const NV: usize>(
        a: *const u8,
        lda: usize,
        i: usize,
        w: *const i32,
        kq: usize,
        j: usize,
        cols: usize,
        e: &E,
        out: *mut E::Out,
        ldo: usize,
    ) {
        let mut acc = [[_mm512_setzero_si512(); NV]; R];
        let a = a.add(i * lda);
        for q in 0..kq {
            let wp = w.add(q * 16 * NV);
            let mut wv = [_mm512_setzero_si512(); NV];
            for (v, x) in wv.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(wp.add(16 * v) as *const _);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_epi32((a.add(r * lda + 4 * q) as *const i32).read_unaligned());
                for (c, x) in row.iter_mut().zip(wv.iter()) {
                    *c = _mm512_dpbusd_epi32(*c, b, *x);
                }
            }
        }
        for (v, _) in acc[0].iter().enumerate() {
            let count = cols.saturating_sub(16 * v).min(16);
            if count == 0 {
                break;
            }
            for (r, row) in acc.iter().enumerate() {
                e.store16(row[v], j + 16 * v, out.add((i + r) * ldo + j + 16 * v), count);
            }
        }
    }

    /// Every row tile of rows `i0..i1` over a panel `NV` vectors wide.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<E: Store16, const NV: usize>(
        a: *const u8,
        lda: usize,
        i0: usize,
        i1: usize,
        w: *const i32,
        kq: usize,
        j: usize,
        cols: usize,
        e: &E,
        out: *mut E::Out,
        ldo: usize,
    ) {
        let mut i = i0;
        while i + MR <= i1 {
            tile::<E, MR, NV>(a, lda, i, w, kq, j, cols, e, out, ldo);
            i += MR;
        }
        macro_rules! tail {
            ($($r:literal)*) => {
                match i1 - i {
                    $($r => tile::<E, $r, NV>(a, lda, i, w, kq, j, cols, e, out, ldo),)*
                    _ => {}
                }
            };
        }
        tail!(1 2 3 4 5 6 7);
    }

    /// Rows `i0..i1` against one panel (`width` 16, 32 or 48 channels at `j`, `cols` real).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panel<E: Store16>(
        a: *const u8,
        lda: usize,
        i0: usize,
        i1: usize,
        w: *const i32,
        width: usize,
        kq: usize,
        j: usize,
        cols: usize,
        e: &E,
        out: *mut E::Out,
        ldo: usize,
    ) {
        match width / 16 {
            3 => rows::<E, 3>(a, lda, i0, i1, w, kq, j, cols, e, out, ldo),
            2 => rows::<E, 2>(a, lda, i0, i1, w, kq, j, cols, e, out, ldo),
            _ => rows::<E, 1>(a, lda, i0, i1, w, kq, j, cols, e, out, ldo),
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::super::gemm::{DequantOut, Epilogue, Requant};
    use std::arch::x86_64::*;

    /// Rows per register tile (x 16 channels: 8 ymm accumulators).
    const MR: usize = 4;

    /// The epilogue of 8 channels `j..j + 8` of one row, from their i32 sums, in registers.
    pub(crate) trait Store8: Epilogue {
        /// Writes the first `count` (1..=8) outputs to `dst`.
        ///
        /// # Safety
        /// AVX2; the parameters cover channels `j..j + 8`; `dst..dst + count` is writable.
        unsafe fn store8(&self, acc: __m256i, j: usize, dst: *mut Self::Out, count: usize);
    }

    impl Store8 for Requant<'_> {
        /// As the AVX-512 version: `Requant::apply` per lane.
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn store8(&self, acc: __m256i, j: usize, dst: *mut u8, count: usize) {
            let sums = _mm256_loadu_si256(self.b_sums.as_ptr().add(j) as *const __m256i);
            let raw = _mm256_sub_epi32(acc, _mm256_mullo_epi32(_mm256_set1_epi32(self.a_zp), sums));
            let f = _mm256_add_ps(_mm256_cvtepi32_ps(raw), _mm256_loadu_ps(self.bias_term.as_ptr().add(j)));
            let f = _mm256_mul_ps(f, _mm256_loadu_ps(self.multiplier.as_ptr().add(j)));
            let f = _mm256_and_ps(f, _mm256_cmp_ps::<_CMP_ORD_Q>(f, f));
            let lo = _mm256_set1_ps((self.lo - self.out_zp) as f32);
            let hi = _mm256_set1_ps((self.hi - self.out_zp) as f32);
            let f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
            let q = _mm256_add_epi32(_mm256_cvtps_epi32(f), _mm256_set1_epi32(self.out_zp));
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, q);
            for (l, &v) in lanes.iter().enumerate().take(count) {
                *dst.add(l) = v as u8;
            }
        }
    }

    impl Store8 for DequantOut<'_> {
        /// `DequantOut::apply` per lane: one fused multiply-add.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn store8(&self, acc: __m256i, j: usize, dst: *mut f32, count: usize) {
            let sums = _mm256_loadu_si256(self.b_sums.as_ptr().add(j) as *const __m256i);
            let raw = _mm256_sub_epi32(acc, _mm256_mullo_epi32(_mm256_set1_epi32(self.a_zp), sums));
            let f = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(raw),
                _mm256_loadu_ps(self.scale.as_ptr().add(j)),
                _mm256_loadu_ps(self.bias.as_ptr().add(j)),
            );
            if count == 8 {
                _mm256_storeu_ps(dst, f);
            } else {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), f);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, count);
            }
        }
    }

    /// A tile of `R` rows at `i` x the 16 channels at `j` (`cols` of them real), whose words
    /// are at `w + 16 * s` of each `k` quad's `width`-word row of the panel. Per quad the weight
    /// words split into sign-extended i16 pairs `(w0, w2)` and `(w1, w3)`, each row's four
    /// activation bytes into `(a0, a2)` and `(a1, a3)`; `vpmaddwd` sums each pair exactly.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<E: Store8, const R: usize>(
        a: *const u8,
        lda: usize,
        i: usize,
        w: *const i32,
        width: usize,
        kq: usize,
        j: usize,
        cols: usize,
        e: &E,
        out: *mut E::Out,
        ldo: usize,
    ) {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let a = a.add(i * lda);
        for q in 0..kq {
            let wp = w.add(q * width);
            let w0 = _mm256_loadu_si256(wp as *const __m256i);
            let w1 = _mm256_loadu_si256(wp.add(8) as *const __m256i);
            let even = [
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w0)),
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w1)),
            ];
            let odd = [_mm256_srai_epi16::<8>(w0), _mm256_srai_epi16::<8>(w1)];
            for (r, row) in acc.iter_mut().enumerate() {
                let word = (a.add(r * lda + 4 * q) as *const i32).read_unaligned();
                let ae = _mm256_set1_epi32(word & 0x00ff_00ff);
                let ao = _mm256_set1_epi32((word >> 8) & 0x00ff_00ff);
                for (v, c) in row.iter_mut().enumerate() {
                    let s = _mm256_add_epi32(_mm256_madd_epi16(ae, even[v]), _mm256_madd_epi16(ao, odd[v]));
                    *c = _mm256_add_epi32(*c, s);
                }
            }
        }
        for v in 0..2 {
            let count = cols.saturating_sub(8 * v).min(8);
            if count == 0 {
                break;
            }
            for (r, row) in acc.iter().enumerate() {
                e.store8(row[v], j + 8 * v, out.add((i + r) * ldo + j + 8 * v), count);
            }
        }
    }

    /// Rows `i0..i1` against one panel (`width` channels at `j`, `cols` real), 16 channels at a
    /// time.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panel<E: Store8>(
        a: *const u8,
        lda: usize,
        i0: usize,
        i1: usize,
        w: *const i32,
        width: usize,
        kq: usize,
        j: usize,
        cols: usize,
        e: &E,
        out: *mut E::Out,
        ldo: usize,
    ) {
        for s in 0..width / 16 {
            let (ws, js) = (w.add(16 * s), j + 16 * s);
            let cs = cols.saturating_sub(16 * s).min(16);
            if cs == 0 {
                break;
            }
            let mut i = i0;
            while i + MR <= i1 {
                tile::<E, MR>(a, lda, i, ws, width, kq, js, cs, e, out, ldo);
                i += MR;
            }
            match i1 - i {
                0 => {}
                1 => tile::<E, 1>(a, lda, i, ws, width, kq, js, cs, e, out, ldo),
                2 => tile::<E, 2>(a, lda, i, ws, width, kq, js, cs, e, out, ldo),
                _ => tile::<E, 3>(a, lda, i, ws, width, kq, js, cs, e, out, ldo),
            }
        }
    }
}
