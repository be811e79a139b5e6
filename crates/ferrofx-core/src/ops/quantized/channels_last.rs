//! Channels-last uint8 activations between int8 ops (PyTorch's `torch.channels_last` memory
//! format, which fbgemm's quantized ops use throughout).
//!
//! A channels-last tensor keeps its logical `[N, C, H, W]` shape and has the strides
//! `[H * W * C, 1, W * C, C]`: in memory it is `N x H x W x C`, the four input channels of a
//! `vpdpbusd` word of one pixel next to each other. `quantized_conv2d` writes its output in this
//! layout whenever it runs the channels-in-lanes tile (every single-group convolution on AVX-512
//! VNNI: the tile produces pixel rows of channels, so it stores them as they are instead of
//! transposing), and reads such an input in place for a 1x1 convolution without padding or from
//! the zero-point-padded channels-last image otherwise (one row copy per input row; a few
//! channel counts off a multiple of 4 are packed with one 4-byte copy per pixel and channel
//! quad). A residual add (`quantized_conv2d_add`) whose other operand is channels-last happens
//! as each output pixel leaves the tile. The max-pool after the stem keeps the layout,
//! `quantized_add` too (elementwise on the storage) and `quantized_adaptive_avg_pool2d` sums
//! channel vectors; every
//! other op sees an ordinary strided tensor (`with_contiguous` copies it to row-major order), so
//! the layout changes no result, only where the bytes are.
//!
//! `FERROFX_QCONV_NHWC=0` turns the channels-last output off (every int8 op then produces
//! row-major tensors, as before session 16) for a side-by-side measurement.

use crate::error::Result;
use crate::layout::Layout;
use crate::tensor::Tensor;

/// Whether `quantized_conv2d` may write channels-last outputs (`FERROFX_QCONV_NHWC` unset or not
/// `0`).
pub(super) fn enabled() -> bool {
    static E: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *E.get_or_init(|| std::env::var("FERROFX_QCONV_NHWC").map_or(true, |v| v != "0"))
}

/// The strides of the channels-last layout of `[n, c, h, w]`.
fn strides([_, c, h, w]: [usize; 4]) -> [usize; 4] {
    [h * w * c, 1, w * c, c]
}

/// `[N, C, H, W]` when `t` is a concrete 4-D tensor laid out channels-last (and not also
/// row-major: with `C == 1` or `H * W == 1` both layouts are the same bytes, and then `None`).
pub(super) fn dims(t: &Tensor) -> Option<[usize; 4]> {
    let layout = t.layout()?;
    let s = layout.shape();
    if s.len() != 4 || layout.is_contiguous() {
        return None;
    }
    let d = [s[0], s[1], s[2], s[3]];
    (layout.strides() == strides(d)).then_some(d)
}

/// Calls `f` with the `N * H * W * C` bytes of the channels-last tensor `t` (checked with
/// [`dims`] by the caller).
pub(super) fn with_bytes<R>(t: &Tensor, op: &str, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    t.with_data::<u8, _>(op, |data, layout| f(&data[layout.offset()..layout.offset() + layout.numel()]))
}

/// A channels-last `[n, c, h, w]` tensor owning `data` (`n * h * w * c` bytes in `NHWC` order).
pub(super) fn tensor(op: &str, data: Vec<u8>, d: [usize; 4]) -> Result<Tensor> {
    let flat = Tensor::from_vec(data, &[d.iter().product()])?;
    flat.view_with_layout(op, Layout::from_parts(d.into_iter().collect(), strides(d).into_iter().collect(), 0))
}
