//! Depthwise 3x3 convolution, stride 1 or 2 (MobileNet's and EfficientNet's), computed straight
//! from the NCHW input with AVX-512: no padded copy of the plane, no scratch, the bias,
//! residual add and ReLU / clamp applied in registers before the one store of each output.
//!
//! Per (image, channel) plane, output rows are computed a few at a time (6 at stride 1, 2 at
//! stride 2, fewer for the last rows), 16 columns per vector:
//! - each input row the group needs is loaded once (three vectors: the columns of the three
//!   kernel taps) and accumulated into every output row of the group that reads it, so at
//!   stride 1 an input row costs three loads for up to three outputs;
//! - the padding is never materialised: the columns of a load that fall outside the row (the
//!   left and right padding, the end of a 7- or 14-wide row) are masked off and read as zero
//!   (masked loads do not touch masked-off memory), and a row outside the plane reads a row of
//!   zeros; chunks of 16 columns with no such column (the interior of wide rows) run unmasked;
//! - stride 2 loads 32 consecutive columns and deinterleaves them into even and odd columns
//!   (`vpermt2ps`) instead of splitting the plane into phases.
//!
//! On MobileNetV2's layers (batch 1, one thread, thread CPU time) this is 1.8-5x faster than
//! the padded phase-split stencil of `depthwise.rs`, which remains the kernel for other
//! geometries (5x5, dilation, stride 3) and for CPUs without AVX-512.
//!
//! The sum per output is `bias + w[0] x[0] + ... + w[8] x[8]` in row-major tap order, one
//! multiply and one add per tap (no fused multiply-add), exactly as the portable kernel of
//! `depthwise.rs` sums it: the two are bit-equal, padding included (a padded tap adds `w * 0`
//! in both).

use super::{Activation, Epilogue, Geom};
use std::mem::MaybeUninit;

/// Output rows computed per pass over the input rows they read, for row stride 1 and 2
/// (measured on MobileNetV2's layers).
const ROWS_S1: usize = 6;
const ROWS_S2: usize = 2;

/// Whether this kernel computes `g` on this CPU: a depthwise 3x3 convolution with stride 1 or 2
/// per dimension and no dilation, on a CPU with AVX-512F.
pub(super) fn applies(g: &Geom) -> bool {
    g.kh == 3
        && g.kw == 3
        && g.dh == 1
        && g.dw == 1
        && matches!(g.sh, 1 | 2)
        && matches!(g.sw, 1 | 2)
        && super::avx512()
}

/// The epilogue part applied in registers; `Silu` and `Hardswish` run after the plane is stored
/// (`Epilogue::apply` on the plane, still in L1).
#[derive(Clone, Copy)]
pub(super) enum RegAct {
    None,
    Relu,
    Clamp(f32, f32),
}

impl RegAct {
    /// The part of `act` applied in registers, and whether the rest (`Silu`, `Hardswish`) is
    /// still to be applied to the stored output.
    pub(super) fn split(act: Activation) -> (RegAct, bool) {
        match act {
            Activation::None => (RegAct::None, false),
            Activation::Relu => (RegAct::Relu, false),
            Activation::Clamp(lo, hi) => (RegAct::Clamp(lo, hi), false),
            Activation::Silu | Activation::Hardswish => (RegAct::None, true),
        }
    }
}

/// One plane: `x` the input plane (`h x w`), `w` its nine weights, `b` the bias, `res` the
/// residual plane (the output's shape) if any, `out` the output plane (`oh x ow`, every element
/// written).
pub(super) struct Plane<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub b: f32,
    pub res: Option<&'a [f32]>,
    /// At least `w` zeros: what a padding row reads.
    pub zero: &'a [f32],
    pub out: &'a mut [MaybeUninit<f32>],
}

/// Computes one plane; returns whether the epilogue's activation still has to be applied
/// (`Silu`, `Hardswish`: the residual, if any, has been added in registers).
pub(super) fn plane(g: &Geom, p: Plane<'_>, ep: Option<&Epilogue<'_>>) -> bool {
    assert!(
        p.x.len() >= g.h * g.w && p.w.len() >= 9 && p.out.len() >= g.oh * g.ow && p.zero.len() >= g.w,
        "depthwise3x3: plane sizes"
    );
    if let Some(r) = p.res {
        assert!(r.len() >= g.oh * g.ow, "depthwise3x3: residual plane size");
    }
    let (act, later) = RegAct::split(ep.map_or(Activation::None, |e| e.act));
    #[cfg(target_arch = "x86_64")]
    {
        assert!(super::avx512(), "depthwise3x3 needs AVX-512F (checked by `applies`)");
        let ptrs = avx512::Ptrs {
            x: p.x.as_ptr(),
            res: p.res.map_or(std::ptr::null(), |r| r.as_ptr()),
            zero: p.zero.as_ptr(),
            out: p.out.as_mut_ptr().cast::<f32>(),
        };
        // SAFETY: the CPU has AVX-512F (asserted above); the pointers hold a plane of `g`
        // each (sizes asserted above), `out` exclusively borrowed: the kernel reads only rows
        // 0..h, columns 0..w of `x` (and `zero`'s first w), elements 0..oh*ow of `res` and
        // writes only elements 0..oh*ow of `out` (see `kernel`).
        unsafe { avx512::kernel(g, &ptrs, p.w[..9].try_into().expect("nine weights"), p.b, act) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (act, &p);
        unreachable!("depthwise3x3 runs on x86-64 only (checked by `applies`)");
    }
    later
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::{Geom, RegAct, ROWS_S1, ROWS_S2};
    use std::arch::x86_64::*;

    /// A plane's memory (see `Plane`); `res` is null without a residual.
    pub(super) struct Ptrs {
        pub x: *const f32,
        pub res: *const f32,
        pub zero: *const f32,
        pub out: *mut f32,
    }

    /// `act(y + res[at..])` (the residual's lanes under `m`; none when `res` is null): the
    /// epilogue in registers, the scalar formulas' results (`x < lo ? lo : x`, then
    /// `y > hi ? hi : y`; NaN stays NaN, `-0.0` stays `-0.0`). Also used by `direct.rs`.
    ///
    /// # Safety
    /// AVX-512F; when `res` is not null, the lanes of `m` at `res + at` are readable.
    #[inline(always)]
    pub(in crate::ops::conv) unsafe fn finish(
        y: __m512,
        res: *const f32,
        at: usize,
        m: __mmask16,
        act: RegAct,
    ) -> __m512 {
        let y = if res.is_null() { y } else { _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, res.add(at))) };
        match act {
            RegAct::None => y,
            RegAct::Relu => _mm512_max_ps(_mm512_setzero_ps(), y),
            RegAct::Clamp(lo, hi) => _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), y)),
        }
    }

    /// The lanes `j` of a 16-lane load at column `t` with `0 <= t + j < w` (also used by
    /// `direct.rs`).
    #[inline(always)]
    pub(in crate::ops::conv) fn mask(t: isize, w: usize) -> __mmask16 {
        let lo = (-t).clamp(0, 16) as u32;
        let hi = (w as isize - t).clamp(0, 16) as u32;
        if hi <= lo {
            return 0;
        }
        let below_hi = if hi == 16 { 0xffff_u32 } else { (1u32 << hi) - 1 };
        (below_hi & !((1u32 << lo) - 1)) as __mmask16
    }

    /// Per 16-column chunk of output: where its loads start and their masks.
    #[derive(Clone, Copy)]
    struct Chunk {
        /// Output column of lane 0.
        c0: usize,
        /// Lanes stored.
        store: __mmask16,
        /// Input column of the first load, and the load masks (stride 1: taps 0, 1, 2;
        /// stride 2: columns `t..t+16`, `t+16..t+32`, `t+2..t+18`, `t+18..t+34`).
        t: isize,
        m: [__mmask16; 4],
    }

    impl Chunk {
        fn new<const SW: usize>(g: &Geom, c0: usize) -> Chunk {
            let lanes = (g.ow - c0).min(16);
            let store = if lanes == 16 { 0xffff } else { ((1u32 << lanes) - 1) as __mmask16 };
            let t = (c0 * SW) as isize - g.pl as isize;
            let m = if SW == 1 {
                [mask(t, g.w), mask(t + 1, g.w), mask(t + 2, g.w), 0]
            } else {
                [mask(t, g.w), mask(t + 16, g.w), mask(t + 2, g.w), mask(t + 18, g.w)]
            };
            Chunk { c0, store, t, m }
        }
    }

    /// The three tap vectors of input row `row` (a pointer to its first column) for chunk `c`:
    /// `v[kj][j] = row[(c0 + j) * SW + kj - pl]`, zero outside the row.
    ///
    /// # Safety
    /// AVX-512F; `row` points at a row of `w` floats (`c`'s masks were made for that `w`).
    #[inline(always)]
    unsafe fn taps<const SW: usize, const MASKED: bool>(row: *const f32, c: &Chunk) -> [__m512; 3] {
        // masked-off lanes are not read: only columns 0..w of the row are touched (an interior
        // chunk, `!MASKED`, has every lane inside)
        let at = |off: isize| row.wrapping_offset(c.t + off);
        let ld = |m: __mmask16, q: *const f32| if MASKED { _mm512_maskz_loadu_ps(m, q) } else { _mm512_loadu_ps(q) };
        if SW == 1 {
            [ld(c.m[0], at(0)), ld(c.m[1], at(1)), ld(c.m[2], at(2))]
        } else {
            let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
            let (a, b) = (ld(c.m[0], at(0)), ld(c.m[1], at(16)));
            let (a2, b2) = (ld(c.m[2], at(2)), ld(c.m[3], at(18)));
            [
                _mm512_permutex2var_ps(a, even, b),
                _mm512_permutex2var_ps(a, odd, b),
                _mm512_permutex2var_ps(a2, even, b2),
            ]
        }
    }

    /// `R` output rows from `r0` for every chunk.
    ///
    /// # Safety
    /// AVX-512F; `p` holds a plane of `g` (checked by `plane`), `r0 + R <= oh`; `chunks` have
    /// every lane inside the rows unless `MASKED`.
    #[inline(always)]
    unsafe fn rows<const R: usize, const SH: usize, const SW: usize, const MASKED: bool>(
        g: &Geom,
        p: &Ptrs,
        wv: &[__m512; 9],
        bias: __m512,
        chunks: &[Chunk],
        r0: usize,
        act: RegAct,
    ) {
        let (x, out) = (p.x, p.out);
        // input rows first..first + (R - 1) * SH + 3 feed output rows r0..r0 + R: a pointer to
        // each (a padding row reads the zero row)
        let first = (r0 * SH) as isize - g.pt as isize;
        let mut rowp = [p.zero; 16];
        for (i, rp) in rowp.iter_mut().enumerate().take((R - 1) * SH + 3) {
            let ri = first + i as isize;
            if ri >= 0 && (ri as usize) < g.h {
                *rp = x.add(ri as usize * g.w);
            }
        }
        for c in chunks {
            let mut acc = [bias; R];
            // input row first + i feeds output row r0 + rr with kernel row ki = i - rr * SH
            for (i, &rp) in rowp.iter().enumerate().take((R - 1) * SH + 3) {
                let v = taps::<SW, MASKED>(rp, c);
                for (rr, a) in acc.iter_mut().enumerate() {
                    if i >= rr * SH && i - rr * SH < 3 {
                        let ki = i - rr * SH;
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(wv[ki * 3], v[0]));
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(wv[ki * 3 + 1], v[1]));
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(wv[ki * 3 + 2], v[2]));
                    }
                }
            }
            for (rr, a) in acc.iter().enumerate() {
                let at = (r0 + rr) * g.ow + c.c0;
                let y = finish(*a, p.res, at, c.store, act);
                if MASKED {
                    _mm512_mask_storeu_ps(out.add(at), c.store, y);
                } else {
                    _mm512_storeu_ps(out.add(at), y);
                }
            }
        }
    }

    /// # Safety
    /// AVX-512F; `p` holds a plane of `g`.
    #[inline(always)]
    unsafe fn run<const SH: usize, const SW: usize>(g: &Geom, p: &Ptrs, w: &[f32; 9], b: f32, act: RegAct) {
        let wv: [__m512; 9] = std::array::from_fn(|k| _mm512_set1_ps(w[k]));
        let bias = _mm512_set1_ps(b);
        // output columns in blocks of up to 8 chunks of 16 (MobileNet's widest row, 112, is 7)
        let mut inner = [Chunk { c0: 0, store: 0, t: 0, m: [0; 4] }; 8];
        let mut edge = inner;
        let mut c0 = 0;
        while c0 < g.ow {
            let n = inner.len().min(g.ow.div_ceil(16) - c0 / 16);
            // interior chunks (every load and the store full: no masks) apart from the edges
            let (mut ni, mut ne) = (0, 0);
            for k in 0..n {
                let ch = Chunk::new::<SW>(g, c0 + 16 * k);
                let loads = if SW == 1 { 3 } else { 4 };
                if ch.store == 0xffff && ch.m[..loads].iter().all(|&m| m == 0xffff) {
                    inner[ni] = ch;
                    ni += 1;
                } else {
                    edge[ne] = ch;
                    ne += 1;
                }
            }
            all_rows::<SH, SW, false>(g, p, &wv, bias, &inner[..ni], act);
            all_rows::<SH, SW, true>(g, p, &wv, bias, &edge[..ne], act);
            c0 += 16 * n;
        }
    }

    /// Every output row for the chunks `cs`.
    ///
    /// # Safety
    /// As `rows`.
    #[inline(always)]
    unsafe fn all_rows<const SH: usize, const SW: usize, const MASKED: bool>(
        g: &Geom,
        p: &Ptrs,
        wv: &[__m512; 9],
        bias: __m512,
        cs: &[Chunk],
        act: RegAct,
    ) {
        // the tails below cover up to 5 rows; `rows` holds (6 - 1) * 2 + 3 input rows
        const { assert!(ROWS_S1 <= 6 && ROWS_S2 <= 6) };
        if cs.is_empty() {
            return;
        }
        let step = if SH == 1 { ROWS_S1 } else { ROWS_S2 };
        let mut r0 = 0;
        while r0 + step <= g.oh {
            if SH == 1 {
                rows::<ROWS_S1, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act);
            } else {
                rows::<ROWS_S2, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act);
            }
            r0 += step;
        }
        // the last oh % step rows
        match g.oh - r0 {
            0 => {}
            1 => rows::<1, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act),
            2 => rows::<2, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act),
            3 => rows::<3, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act),
            4 => rows::<4, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act),
            _ => rows::<5, SH, SW, MASKED>(g, p, wv, bias, cs, r0, act),
        }
    }

    /// # Safety
    /// AVX-512F; `p` holds a plane of `g` (see `plane`); `g` is 3x3 with strides in {1, 2}.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn kernel(g: &Geom, p: &Ptrs, w: &[f32; 9], b: f32, act: RegAct) {
        match (g.sh, g.sw) {
            (1, 1) => run::<1, 1>(g, p, w, b, act),
            (1, 2) => run::<1, 2>(g, p, w, b, act),
            (2, 1) => run::<2, 1>(g, p, w, b, act),
            _ => run::<2, 2>(g, p, w, b, act),
        }
    }
}
