//! MaxPool2d, AvgPool2d, AdaptiveAvgPool2d.

use crate::spec::{self, Attr, ModuleSpec};
use crate::{functional as F, Module};
use ferrofx_core::{Result, Tensor};

/// `nn.MaxPool2d(kernel_size, stride=kernel_size, padding=0, dilation=1, ceil_mode=False)`.
#[derive(crate::Module, Clone, Copy)]
pub struct MaxPool2d {
    /// kernel
    pub kernel: [i64; 2],
    /// stride
    pub stride: [i64; 2],
    /// padding
    pub padding: [i64; 2],
    /// dilation
    pub dilation: [i64; 2],
    /// ceil_mode
    pub ceil_mode: bool,
}

impl MaxPool2d {
    /// `MaxPool2d(kernel_size)` (stride = kernel).
    pub fn new(kernel_size: usize) -> MaxPool2d {
        MaxPool2d::with(kernel_size, kernel_size, 0)
    }
    /// `MaxPool2d(kernel_size, stride, padding)`.
    pub fn with(kernel_size: usize, stride: usize, padding: usize) -> MaxPool2d {
        let (k, s, p) = (kernel_size as i64, stride as i64, padding as i64);
        MaxPool2d { kernel: [k, k], stride: [s, s], padding: [p, p], dilation: [1, 1], ceil_mode: false }
    }
}

impl Module for MaxPool2d {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::max_pool2d(x, self.kernel, Some(self.stride), self.padding, self.dilation, self.ceil_mode)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("MaxPool2d")
                .with("kernel_size", spec::ints(&self.kernel))
                .with("stride", spec::ints(&self.stride))
                .with("padding", spec::ints(&self.padding))
                .with("dilation", spec::ints(&self.dilation))
                .with("ceil_mode", Attr::Bool(self.ceil_mode)),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}",
            self.kernel[0],
            self.stride[0],
            self.padding[0],
            self.dilation[0],
            super::linear::py_bool(self.ceil_mode)
        )
    }
}

/// `nn.AvgPool2d(kernel_size, stride=kernel_size, padding=0, ceil_mode=False,
/// count_include_pad=True)`.
#[derive(crate::Module, Clone, Copy)]
pub struct AvgPool2d {
    /// kernel
    pub kernel: [i64; 2],
    /// stride
    pub stride: [i64; 2],
    /// padding
    pub padding: [i64; 2],
    /// ceil_mode
    pub ceil_mode: bool,
    /// count_include_pad
    pub count_include_pad: bool,
}

impl AvgPool2d {
    /// `AvgPool2d(kernel_size)`.
    pub fn new(kernel_size: usize) -> AvgPool2d {
        AvgPool2d::with(kernel_size, kernel_size, 0)
    }
    /// `AvgPool2d(kernel_size, stride, padding)`.
    pub fn with(kernel_size: usize, stride: usize, padding: usize) -> AvgPool2d {
        let (k, s, p) = (kernel_size as i64, stride as i64, padding as i64);
        AvgPool2d { kernel: [k, k], stride: [s, s], padding: [p, p], ceil_mode: false, count_include_pad: true }
    }
}

impl Module for AvgPool2d {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::avg_pool2d(x, self.kernel, Some(self.stride), self.padding, self.ceil_mode, self.count_include_pad)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("AvgPool2d")
                .with("kernel_size", spec::ints(&self.kernel))
                .with("stride", spec::ints(&self.stride))
                .with("padding", spec::ints(&self.padding))
                .with("ceil_mode", Attr::Bool(self.ceil_mode))
                .with("count_include_pad", Attr::Bool(self.count_include_pad)),
        )
    }
    fn extra_repr(&self) -> String {
        format!("kernel_size={}, stride={}, padding={}", self.kernel[0], self.stride[0], self.padding[0])
    }
}

/// `nn.AdaptiveAvgPool2d(output_size)`.
#[derive(crate::Module, Clone, Copy)]
pub struct AdaptiveAvgPool2d {
    /// Output `[h, w]`.
    pub output_size: [i64; 2],
}

impl AdaptiveAvgPool2d {
    /// `AdaptiveAvgPool2d((h, w))`.
    pub fn new(h: usize, w: usize) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d { output_size: [h as i64, w as i64] }
    }
}

impl Module for AdaptiveAvgPool2d {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(*self))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::adaptive_avg_pool2d(x, self.output_size)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(ModuleSpec::new("AdaptiveAvgPool2d").with("output_size", spec::ints(&self.output_size)))
    }
    fn extra_repr(&self) -> String {
        format!("output_size=({}, {})", self.output_size[0], self.output_size[1])
    }
}

/// Checks that every entry of a pooling attribute is in `min..=2^20`.
fn range<const N: usize>(s: &ModuleSpec, name: &str, min: i64) -> Result<[i64; N]> {
    let v = s.ints::<N>(name)?;
    if v.iter().any(|&x| x < min || x > 1 << 20) {
        return Err(ferrofx_core::Error::argument(
            &s.type_name,
            format!("attribute '{name}' = {v:?} is out of range (>= {min})"),
        ));
    }
    Ok(v)
}

/// PyTorch's pooling rule, checked when a file is loaded rather than at the first forward:
/// the padding is at most half the effective kernel (`(kernel_size - 1) * dilation + 1`).
fn check_half_kernel(s: &ModuleSpec, kernel: [i64; 2], padding: [i64; 2], dilation: [i64; 2]) -> Result<()> {
    for i in 0..2 {
        if padding[i] > ((kernel[i] - 1) * dilation[i] + 1) / 2 {
            return Err(ferrofx_core::Error::argument(
                &s.type_name,
                format!(
                    "attribute 'padding' = {padding:?} is more than half the effective kernel (kernel_size {kernel:?}, dilation {dilation:?}); \
                     PyTorch refuses such a pooling (pad should be at most half of effective kernel size)"
                ),
            ));
        }
    }
    Ok(())
}

impl MaxPool2d {
    /// Rebuilds a MaxPool2d from its spec.
    pub fn from_spec(s: &ModuleSpec) -> Result<MaxPool2d> {
        let m = MaxPool2d {
            kernel: range(s, "kernel_size", 1)?,
            stride: range(s, "stride", 1)?,
            padding: range(s, "padding", 0)?,
            dilation: range(s, "dilation", 1)?,
            ceil_mode: s.bool("ceil_mode")?,
        };
        check_half_kernel(s, m.kernel, m.padding, m.dilation)?;
        Ok(m)
    }
}

impl AvgPool2d {
    /// Rebuilds an AvgPool2d from its spec.
    pub fn from_spec(s: &ModuleSpec) -> Result<AvgPool2d> {
        let m = AvgPool2d {
            kernel: range(s, "kernel_size", 1)?,
            stride: range(s, "stride", 1)?,
            padding: range(s, "padding", 0)?,
            ceil_mode: s.bool("ceil_mode")?,
            count_include_pad: s.bool("count_include_pad")?,
        };
        check_half_kernel(s, m.kernel, m.padding, [1, 1])?;
        Ok(m)
    }
}

impl AdaptiveAvgPool2d {
    /// Rebuilds an AdaptiveAvgPool2d from its spec.
    pub fn from_spec(s: &ModuleSpec) -> Result<AdaptiveAvgPool2d> {
        Ok(AdaptiveAvgPool2d { output_size: range(s, "output_size", 1)? })
    }
}
