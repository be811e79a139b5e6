//! The int8 kernels' shared parts: which implementation runs ([`int8_kernel`], the per-thread
//! override), the epilogues (requantisation to u8, [`Requant`]; dequantization to f32,
//! [`DequantOut`]) and the portable reference GEMM every fast path is checked against.
//!
//! The reference GEMM (`reference_gemm`) takes both operands row-major with the reduction dim
//! `k` contiguous: `a` is `m x k` (u8 activations, or im2col patches), `b` is `n x k` (s8 weights
//! in their natural `[out, in]` layout). Each output `(i, j)` is `epilogue(sum_k a[i,k] *
//! b[j,k], j)`, written to `out[i * ldm + j * ldn]`, so one routine serves row-major linear
//! outputs and channel-major convolution outputs. The fast paths (`linear_packed.rs`,
//! `conv2d_packed.rs`) are bit-identical to it by construction: their i32 sums hold the same exact
//! terms and their vector epilogues do the f32 operations of [`Epilogue::apply`] in the same
//! order.

use std::cell::Cell;

thread_local! {
    static FORCED: Cell<Option<Path>> = const { Cell::new(None) };
}

/// Runs `f` with the int8 ops of this thread on the portable reference kernels (the fast path
/// must give identical results; tests compare the two).
///
/// ```
/// use ferrofx_core::ops::quantized::{int8_kernel, with_reference_kernels};
/// assert_eq!(with_reference_kernels(int8_kernel), "reference");
/// ```
pub fn with_reference_kernels<R>(f: impl FnOnce() -> R) -> R {
    with_path(Path::Reference, f)
}

fn with_path<R>(path: Path, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Path>);
    impl Drop for Reset {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(FORCED.with(|c| c.replace(Some(path))));
    f()
}

/// Runs `f` with the int8 ops of this thread on the named kernels (one of
/// [`int8_kernels_available`]), for example to test the AVX2 path on a CPU that also has
/// AVX-512 VNNI. A name the CPU cannot run is an error that lists the ones it can.
///
/// ```
/// use ferrofx_core::ops::quantized::{int8_kernel, int8_kernels_available, with_int8_kernel};
/// for name in int8_kernels_available() {
///     assert_eq!(with_int8_kernel(name, int8_kernel).unwrap(), name);
/// }
/// assert!(with_int8_kernel("sve", int8_kernel).is_err());
/// ```
pub fn with_int8_kernel<R>(name: &str, f: impl FnOnce() -> R) -> crate::error::Result<R> {
    match Path::available().into_iter().find(|p| p.name() == name) {
        Some(p) => Ok(with_path(p, f)),
        None => Err(crate::error::Error::argument(
            "with_int8_kernel",
            format!("no int8 kernel named {name:?} runs on this CPU; available: {:?}", int8_kernels_available()),
        )),
    }
}

/// The int8 kernels this CPU can run, fastest first (`"amx"`, `"avx512-vnni"`, `"avx2"`, and
/// always `"reference"`). `"amx"` runs the convolutions it covers on AMX tiles and everything
/// else on the AVX-512 VNNI kernels.
///
/// ```
/// use ferrofx_core::ops::quantized::int8_kernels_available;
/// assert_eq!(int8_kernels_available().last(), Some(&"reference"));
/// ```
pub fn int8_kernels_available() -> Vec<&'static str> {
    Path::available().into_iter().map(Path::name).collect()
}

/// The int8 implementation this thread's ops use: `"amx"`, `"avx512-vnni"`, `"avx2"` or
/// `"reference"`.
pub fn int8_kernel() -> &'static str {
    Path::select().name()
}

/// Which implementation runs (decided on the calling thread, before work is split).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Reference,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AMX tiles for the convolutions `conv2d_amx.rs` covers, [`Path::Vnni`] for the rest.
    #[cfg(target_arch = "x86_64")]
    Amx,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Reference => "reference",
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Path::Vnni => "avx512-vnni",
            #[cfg(target_arch = "x86_64")]
            Path::Amx => "amx",
        }
    }

    /// The paths this CPU runs, fastest first.
    fn available() -> Vec<Path> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                if super::conv2d_amx::available() {
                    v.push(Path::Amx);
                }
                v.push(Path::Vnni);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Path::Avx2);
            }
        }
        v.push(Path::Reference);
        v
    }

    /// The vector path of the kernels AMX does not cover (`Amx` → `Vnni`; the others as
    /// they are).
    pub(crate) fn vector(self) -> Path {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Amx => Path::Vnni,
            p => p,
        }
    }

    pub(crate) fn select() -> Path {
        if let Some(p) = FORCED.with(|c| c.get()) {
            return p;
        }
        static BEST: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Path::available()[0])
    }
}

/// The operands of one GEMM call.
pub(crate) struct Operands<'a> {
    /// `m` rows of `k` u8 values, row `i` at `a[i * lda..]`.
    pub a: &'a [u8],
    pub lda: usize,
    /// `n` rows of `k` s8 values, row `j` at `b[j * ldb..]`.
    pub b: &'a [i8],
    pub ldb: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Per-output-column requantisation (slices indexed by the column `j` of the call).
pub(crate) struct Requant<'a> {
    /// The activations' zero point.
    pub a_zp: i32,
    /// `sum_k b[j, k]` (the correction for `a_zp`).
    pub b_sums: &'a [i32],
    /// `bias[j] / (a_scale * w_scale[j])` (0 without bias).
    pub bias_term: &'a [f32],
    /// `a_scale * w_scale[j] / out_scale`.
    pub multiplier: &'a [f32],
    /// The output zero point.
    pub out_zp: i32,
    /// Clamp bounds (`out_zp..=255` with a fused ReLU, else `0..=255`).
    pub lo: i32,
    pub hi: i32,
}

/// What the GEMM does with each exact i32 sum: requantise it to uint8 ([`Requant`]) or
/// dequantize it to f32 ([`DequantOut`], dynamic quantization). Both implementations of the GEMM
/// call the same `apply`, so they stay bit-identical for every epilogue.
pub(crate) trait Epilogue: Sync {
    /// The output element.
    type Out: Copy + Default + Send + Sync;
    /// The output of column `j` (of the call) from its i32 sum.
    fn apply(&self, acc: i32, j: usize) -> Self::Out;
    /// The number of columns the parameters cover.
    fn columns(&self) -> usize;
}

impl Requant<'_> {
    /// fbgemm's `requantize_` for float bias: `lrintf((acc - a_zp * colsum + bias') * mult) +
    /// out_zp`, clamped. Values past the i64 range (and infinities) saturate to the clamp
    /// bounds and NaN gives the zero point (fbgemm's `lrintf` returns `INT_MIN` for anything
    /// past the i32 range, so it clamps such huge positive values to 0; only a degenerate
    /// output scale or bias gets there).
    #[inline(always)]
    pub(crate) fn apply(&self, acc: i32, j: usize) -> u8 {
        let raw = acc.wrapping_sub(self.a_zp.wrapping_mul(self.b_sums[j]));
        let v = (raw as f32 + self.bias_term[j]) * self.multiplier[j];
        let q = (v.round_ties_even() as i64).saturating_add(self.out_zp as i64);
        q.clamp(self.lo as i64, self.hi as i64) as u8
    }
}

impl Epilogue for Requant<'_> {
    type Out = u8;
    #[inline(always)]
    fn apply(&self, acc: i32, j: usize) -> u8 {
        Requant::apply(self, acc, j)
    }
    fn columns(&self) -> usize {
        self.b_sums.len().min(self.bias_term.len()).min(self.multiplier.len())
    }
}

/// Per-output-column dequantization to f32 (fbgemm's `ReQuantizeForFloat`, the epilogue of
/// PyTorch's `quantized::linear_dynamic`): `fma(acc - a_zp * colsum, a_scale * w_scale[j],
/// bias[j])` in f32, one rounding as fbgemm's vector epilogue (`_mm256_fmadd_ps`): PyTorch's
/// outputs are matched bit for bit.
pub(crate) struct DequantOut<'a> {
    /// The activations' zero point.
    pub a_zp: i32,
    /// `sum_k b[j, k]`.
    pub b_sums: &'a [i32],
    /// `a_scale * w_scale[j]` (f32).
    pub scale: &'a [f32],
    /// `bias[j]` (0 without bias: `x + 0.0` is `x` for every non-NaN x but -0.0).
    pub bias: &'a [f32],
}

impl Epilogue for DequantOut<'_> {
    type Out = f32;
    #[inline(always)]
    fn apply(&self, acc: i32, j: usize) -> f32 {
        let raw = acc.wrapping_sub(self.a_zp.wrapping_mul(self.b_sums[j]));
        (raw as f32).mul_add(self.scale[j], self.bias[j])
    }
    fn columns(&self) -> usize {
        self.b_sums.len().min(self.scale.len()).min(self.bias.len())
    }
}

/// The requantisation of a whole op call (all output channels), from its scales and bias.
#[derive(Clone)]
pub(crate) struct RequantParams {
    pub a_zp: i32,
    pub b_sums: Vec<i32>,
    pub bias_term: Vec<f32>,
    pub multiplier: Vec<f32>,
    pub out_zp: i32,
    pub lo: i32,
    pub hi: i32,
}

impl RequantParams {
    /// As fbgemm: `act_times_w_scale[j] = a_scale * w_scale[j]` (f32), multiplier
    /// `act_times_w_scale[j] / out_scale`, bias divided by `act_times_w_scale[j]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        a_scale: f32,
        a_zp: i32,
        w_scale: &[f32],
        b_sums: Vec<i32>,
        bias: Option<&[f32]>,
        out_scale: f32,
        out_zp: i32,
        relu: bool,
    ) -> RequantParams {
        let act: Vec<f32> = w_scale.iter().map(|&w| a_scale * w).collect();
        let multiplier = act.iter().map(|&s| s / out_scale).collect();
        let bias_term = match bias {
            Some(b) => b.iter().zip(&act).map(|(&b, &s)| b / s).collect(),
            None => vec![0.0; act.len()],
        };
        RequantParams { a_zp, b_sums, bias_term, multiplier, out_zp, lo: if relu { out_zp } else { 0 }, hi: 255 }
    }

    /// The parameters extended with zeros to `len` channels (the packed linear reads its
    /// parameters 16 channels at a time; the padded channels' outputs are not stored).
    pub(crate) fn padded(mut self, len: usize) -> RequantParams {
        let len = len.max(self.b_sums.len());
        self.b_sums.resize(len, 0);
        self.bias_term.resize(len, 0.0);
        self.multiplier.resize(len, 0.0);
        self
    }

    /// The parameters of output channels `j0..j1`.
    pub(crate) fn slice(&self, j0: usize, j1: usize) -> Requant<'_> {
        Requant {
            a_zp: self.a_zp,
            b_sums: &self.b_sums[j0..j1],
            bias_term: &self.bias_term[j0..j1],
            multiplier: &self.multiplier[j0..j1],
            out_zp: self.out_zp,
            lo: self.lo,
            hi: self.hi,
        }
    }
}

/// `sum_k b[j, k]` for each of the `n` rows.
pub(crate) fn row_sums(b: &[i8], ldb: usize, n: usize, k: usize) -> Vec<i32> {
    (0..n).map(|j| b[j * ldb..j * ldb + k].iter().map(|&v| v as i32).sum()).collect()
}

/// The portable reference GEMM: writes the epilogue's outputs (requantised u8, or f32) to
/// `out[i * ldm + j * ldn]` (a scalar triple loop, i32 sums).
pub(crate) fn reference_gemm<E: Epilogue>(p: &Operands<'_>, r: &E, out: &mut [E::Out], ldm: usize, ldn: usize) {
    if p.m == 0 || p.n == 0 {
        return;
    }
    assert!(p.a.len() >= (p.m - 1) * p.lda + p.k && p.b.len() >= (p.n - 1) * p.ldb + p.k);
    assert!(out.len() > (p.m - 1) * ldm + (p.n - 1) * ldn);
    assert!(r.columns() >= p.n);
    for i in 0..p.m {
        let a = &p.a[i * p.lda..i * p.lda + p.k];
        for j in 0..p.n {
            let b = &p.b[j * p.ldb..j * p.ldb + p.k];
            let acc = a.iter().zip(b).fold(0i32, |s, (&x, &w)| s.wrapping_add(x as i32 * w as i32));
            out[i * ldm + j * ldn] = r.apply(acc, j);
        }
    }
}
