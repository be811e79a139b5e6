//! The u8 x s8 GEMM of `quantized_linear_dynamic` on the AMX tiles (Sapphire Rapids and later),
//! for inputs whose feature count is a multiple of 64.
//!
//! The activations are quantized into a 64-byte aligned buffer whose rows are padded to a
//! multiple of 32 (so every 16-row A tile is read in place, one cache line per tile row); the
//! weights are packed once per weight tensor into the B tiles of `conv2d_amx.rs` (a linear is a
//! 1x1 convolution over its rows), cached on the weight's storage. An item multiplies 32 rows by
//! a run of 32-column blocks: 2x2 tiles of 16x16 i32 sums, four `tdpbusd` per 64 features. Its
//! epilogue dequantizes each block's sums to f32 with [`DequantOut`]'s operations in the same
//! order (`fma((acc - a_zp * colsum) as f32, scale, bias)`, one rounding), so the outputs are
//! bit-identical to the VNNI and reference paths.
//!
//! The activations' quantization and the epilogue are a small share of the work here, unlike
//! the convolutions of `conv2d_amx.rs`: a transformer's feed-forward layer multiplies 384 or
//! 1536 features per output, so the item stays simple (no software pipelining).

use super::conv2d::Geom;
use super::conv2d_amx::{self, AmxWeight, KC};
use super::gemm::DequantOut;
use crate::error::{Error, Result};
use crate::memory::AlignedBytes;
use crate::tensor::Tensor;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Rows per item (two tiles of 16).
const TM: usize = 32;
/// Output columns per block (two tiles of 16).
const TN: usize = 32;

/// Whether a linear with `k` input and `n` output features runs on the AMX tiles.
pub(super) fn applies(k: usize, n: usize) -> bool {
    k > 0 && k.is_multiple_of(KC) && n > 0 && conv2d_amx::available()
}

/// The 1x1 convolution a linear `[n, k]` weight is packed as.
fn geom(n: usize, k: usize) -> Geom {
    Geom {
        n: 1,
        c: k,
        h: 1,
        w: 1,
        oc: n,
        kh: 1,
        kw: 1,
        oh: 1,
        ow: 1,
        stride: [1, 1],
        pad: [0, 0],
        dil: [1, 1],
        groups: 1,
    }
}

/// The AMX form of the int8 weight `w` (`[n, k]`): cached on the weight's storage (packed once
/// per weight, again after any write to it), or packed for this call when `w` is a view.
pub(super) fn weight(op: &str, w: &Tensor, n: usize, k: usize) -> Result<Arc<AmxWeight>> {
    const KEY: usize = 0x11a8; // quantized_linear weights as AMX B tiles
    let g = geom(n, k);
    super::linear_packed::cached_pack(op, w, &[KEY, n, k], n * k, |ws| AmxWeight::new(ws, &g))
}

/// A zeroed, 64-byte aligned buffer for `m` rows of `k` quantized activations, with rows up to
/// the next multiple of 32 (the last tile's rows past `m` are read, never stored).
pub(super) fn activations(op: &str, m: usize, k: usize) -> Result<AlignedBytes> {
    let len = m.next_multiple_of(TM).checked_mul(k).ok_or_else(|| {
        Error::limit(op, format!("{m} rows of {k} quantized features do not fit in memory (size overflows usize)"))
    })?;
    AlignedBytes::try_new(op, len, 0)
}

/// `out[i, j] = e.apply(sum_k a[i, k] * w[j, k], j)` for `m` rows (`a` from [`activations`],
/// `k` a multiple of 64) and `n` columns, `out` row-major `m x n`: every one of its `m * n`
/// elements is written (so it may start uninitialised).
pub(super) fn linear_f32(
    a: &[u8],
    m: usize,
    k: usize,
    pw: &AmxWeight,
    n: usize,
    e: &DequantOut,
    out: &mut [MaybeUninit<f32>],
) {
    assert!(applies(k, n) && pw.chunks * KC == k);
    let np = n.next_multiple_of(TN);
    assert!(a.len() >= m.next_multiple_of(TM) * k && out.len() >= m * n && pw.w.len() >= np * k);
    assert!(e.b_sums.len() >= n && e.scale.len() >= n && e.bias.len() >= n);
    if m == 0 {
        return;
    }
    // the epilogue reads 32 columns' parameters at a time: padded copies (`a_zp * colsum`
    // wrapping, as `DequantOut::apply`)
    let pad_f = |v: &[f32]| v[..n].iter().copied().chain(std::iter::repeat(0.0)).take(np).collect::<Vec<f32>>();
    let zsums: Vec<i32> =
        e.b_sums[..n].iter().map(|&s| e.a_zp.wrapping_mul(s)).chain(std::iter::repeat(0)).take(np).collect();
    let (scale, bias) = (pad_f(e.scale), pad_f(e.bias));
    let params = Params { zsums: &zsums, scale: &scale, bias: &bias };
    let tiles = m.div_ceil(TM);
    let jblocks = np / TN;
    // about four items per thread: row tiles x runs of column blocks
    let threads = crate::ops::team::threads();
    let jitems = (4 * threads).div_ceil(tiles).clamp(1, jblocks);
    let jper = jblocks.div_ceil(jitems);
    let jitems = jblocks.div_ceil(jper);
    let dst = out.as_mut_ptr() as usize;
    crate::ops::team::for_each(tiles * jitems, |it| {
        let (t, jb) = (it / jitems, it % jitems);
        let rows = (t * TM, (m - t * TM).min(TM));
        let blocks = (jb * jper, ((jb + 1) * jper).min(jblocks));
        // SAFETY: `applies` (asserted) means AMX-INT8 and AVX-512 F/BW/VL with the tile state
        // granted; the A rows of tile `t` (32 of them, padded) lie in `a` and the B tiles of the
        // blocks in `pw.w` (asserted above); the item writes rows `rows` x columns of `blocks`
        // below `n` of `out`, which no other item writes.
        unsafe { tiles::item(a.as_ptr().add(t * TM * k), k, rows, pw, blocks, n, &params, dst as *mut f32) };
    });
}

/// The epilogue's per-column parameters, padded to a multiple of 32 columns.
struct Params<'a> {
    zsums: &'a [i32],
    scale: &'a [f32],
    bias: &'a [f32],
}

#[cfg(target_arch = "x86_64")]
mod tiles {
    use super::super::conv2d_amx::amx::{step_2x2, store_2x2, TileConfig, CONFIG};
    use super::{AmxWeight, Params, KC, TM, TN};
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// The 32 x 32 i32 sums of one block, 64-byte aligned for `tilestored`.
    #[repr(C, align(64))]
    struct Acc([i32; TM * TN]);

    /// Rows `r0..r0 + live` (their A tiles at `a`, `k` bytes apart) times column blocks
    /// `j0..j1` (of 32) into `out` (`n` columns per row).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn item(
        a: *const u8,
        k: usize,
        (r0, live): (usize, usize),
        pw: &AmxWeight,
        (j0, j1): (usize, usize),
        n: usize,
        p: &Params<'_>,
        out: *mut f32,
    ) {
        let chunks = k / KC;
        let tile = 16 * KC;
        // B tiles of one 16-column block
        let block = chunks * tile;
        let mut acc = Acc([0; TM * TN]);
        asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
        for jb in j0..j1 {
            let w0 = pw.w.as_slice().as_ptr().add(2 * jb * block);
            let w1 = w0.add(block);
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            for ch in 0..chunks {
                step_2x2(a.add(ch * KC), a.add(16 * k + ch * KC), k, w0.add(ch * tile), w1.add(ch * tile));
            }
            store_2x2(acc.0.as_mut_ptr());
            let j = jb * TN;
            let cols = (n - j).min(TN);
            let masks = [0, 16].map(|v| {
                let c = cols.saturating_sub(v).min(16);
                if c == 16 {
                    0xffffu16
                } else {
                    (1u16 << c) - 1
                }
            });
            let zs = [0, 16].map(|v| _mm512_loadu_si512(p.zsums.as_ptr().add(j + v) as *const _));
            let sc = [0, 16].map(|v| _mm512_loadu_ps(p.scale.as_ptr().add(j + v)));
            let bi = [0, 16].map(|v| _mm512_loadu_ps(p.bias.as_ptr().add(j + v)));
            for r in 0..live {
                let row = acc.0.as_ptr().add(r * TN);
                let dst = out.add((r0 + r) * n + j);
                for v in 0..2 {
                    if masks[v] != 0 {
                        let raw = _mm512_sub_epi32(_mm512_load_si512(row.add(16 * v) as *const _), zs[v]);
                        let f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(raw), sc[v], bi[v]);
                        _mm512_mask_storeu_ps(dst.add(16 * v), masks[v], f);
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}
