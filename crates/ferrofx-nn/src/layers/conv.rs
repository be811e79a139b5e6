//! Conv1d, Conv2d, ConvTranspose2d.

use crate::spec::{self, Attr, ModuleSpec, TensorSource};
use crate::{functional as F, init, Module};
use ferrofx_core::{Error, Result, Tensor};

fn check(name: &str, cin: usize, cout: usize, groups: usize) -> Result<()> {
    if groups == 0 || !cin.is_multiple_of(groups) {
        return Err(Error::argument(
            name,
            format!("in_channels must be divisible by groups (in_channels={cin}, groups={groups})"),
        ));
    }
    if !cout.is_multiple_of(groups) {
        return Err(Error::argument(
            name,
            format!("out_channels must be divisible by groups (out_channels={cout}, groups={groups})"),
        ));
    }
    Ok(())
}

/// `nn.Conv2d(in, out, kernel_size, stride, padding, dilation, groups, bias)`; weight
/// `[out, in/groups, kh, kw]` with `kaiming_uniform_(a=sqrt(5))`, bias U(±1/sqrt(fan_in)).
#[derive(crate::Module, Clone)]
#[module(name = "Conv2d")]
pub struct Conv2d {
    /// `[out, in/groups, kh, kw]`
    pub weight: Tensor,
    /// `[out]`
    pub bias: Option<Tensor>,
    /// Configuration.
    pub stride: [i64; 2],
    /// Zero padding per side.
    pub padding: [i64; 2],
    /// Dilation.
    pub dilation: [i64; 2],
    /// Groups.
    pub groups: i64,
    pub(crate) in_channels: usize,
    pub(crate) out_channels: usize,
    pub(crate) kernel: [usize; 2],
}

/// Builder options of [`Conv2d`] (PyTorch's defaults).
#[derive(Debug, Clone, Copy)]
pub struct Conv2dOpts {
    /// stride (1)
    pub stride: usize,
    /// padding (0)
    pub padding: usize,
    /// dilation (1)
    pub dilation: usize,
    /// groups (1)
    pub groups: usize,
    /// bias (true)
    pub bias: bool,
}

impl Default for Conv2dOpts {
    fn default() -> Self {
        Conv2dOpts { stride: 1, padding: 0, dilation: 1, groups: 1, bias: true }
    }
}

impl Conv2d {
    /// `Conv2d(in, out, k)` with defaults.
    pub fn new(in_channels: usize, out_channels: usize, kernel_size: usize) -> Result<Conv2d> {
        Conv2d::with(in_channels, out_channels, kernel_size, Conv2dOpts::default())
    }
    /// `Conv2d(in, out, k, stride, padding, dilation, groups, bias)`.
    pub fn with(in_channels: usize, out_channels: usize, kernel_size: usize, o: Conv2dOpts) -> Result<Conv2d> {
        check("Conv2d", in_channels, out_channels, o.groups)?;
        let k = kernel_size;
        let weight = init::default_weight(&[out_channels, in_channels / o.groups, k, k])?;
        let fan_in = in_channels / o.groups * k * k;
        let bias = if o.bias { Some(init::default_bias(out_channels, fan_in)?) } else { None };
        let (s, p, d) = (o.stride as i64, o.padding as i64, o.dilation as i64);
        Ok(Conv2d {
            weight,
            bias,
            stride: [s, s],
            padding: [p, p],
            dilation: [d, d],
            groups: o.groups as i64,
            in_channels,
            out_channels,
            kernel: [k, k],
        })
    }
}

fn pair(v: [i64; 2]) -> String {
    format!("({}, {})", v[0], v[1])
}

impl Module for Conv2d {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::conv2d(x, &self.weight, self.bias.as_ref(), self.stride, self.padding, self.dilation, self.groups)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("Conv2d")
                .with("in_channels", Attr::Int(self.in_channels as i64))
                .with("out_channels", Attr::Int(self.out_channels as i64))
                .with("kernel_size", spec::ints(&[self.kernel[0] as i64, self.kernel[1] as i64]))
                .with("stride", spec::ints(&self.stride))
                .with("padding", spec::ints(&self.padding))
                .with("dilation", spec::ints(&self.dilation))
                .with("groups", Attr::Int(self.groups))
                .with("bias", Attr::Bool(self.bias.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        let mut s = format!(
            "{}, {}, kernel_size={}, stride={}",
            self.in_channels,
            self.out_channels,
            pair([self.kernel[0] as i64, self.kernel[1] as i64]),
            pair(self.stride)
        );
        if self.padding != [0, 0] {
            s += &format!(", padding={}", pair(self.padding));
        }
        if self.dilation != [1, 1] {
            s += &format!(", dilation={}", pair(self.dilation));
        }
        if self.groups != 1 {
            s += &format!(", groups={}", self.groups);
        }
        if self.bias.is_none() {
            s += ", bias=False";
        }
        s
    }
}

/// `nn.Conv1d(in, out, kernel_size, stride, padding, dilation, groups, bias)`.
#[derive(crate::Module, Clone)]
#[module(name = "Conv1d")]
pub struct Conv1d {
    /// `[out, in/groups, k]`
    pub weight: Tensor,
    /// `[out]`
    pub bias: Option<Tensor>,
    stride: i64,
    padding: i64,
    dilation: i64,
    groups: i64,
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
}

impl Conv1d {
    /// `Conv1d(in, out, k, stride, padding, dilation, groups, bias)`.
    pub fn new(in_channels: usize, out_channels: usize, kernel_size: usize, o: Conv2dOpts) -> Result<Conv1d> {
        check("Conv1d", in_channels, out_channels, o.groups)?;
        let weight = init::default_weight(&[out_channels, in_channels / o.groups, kernel_size])?;
        let fan_in = in_channels / o.groups * kernel_size;
        let bias = if o.bias { Some(init::default_bias(out_channels, fan_in)?) } else { None };
        Ok(Conv1d {
            weight,
            bias,
            stride: o.stride as i64,
            padding: o.padding as i64,
            dilation: o.dilation as i64,
            groups: o.groups as i64,
            in_channels,
            out_channels,
            kernel: kernel_size,
        })
    }
}

impl Module for Conv1d {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::conv1d(x, &self.weight, self.bias.as_ref(), self.stride, self.padding, self.dilation, self.groups)
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("Conv1d")
                .with("in_channels", Attr::Int(self.in_channels as i64))
                .with("out_channels", Attr::Int(self.out_channels as i64))
                .with("kernel_size", Attr::Int(self.kernel as i64))
                .with("stride", Attr::Int(self.stride))
                .with("padding", Attr::Int(self.padding))
                .with("dilation", Attr::Int(self.dilation))
                .with("groups", Attr::Int(self.groups))
                .with("bias", Attr::Bool(self.bias.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, {}, kernel_size=({},), stride=({},){}{}",
            self.in_channels,
            self.out_channels,
            self.kernel,
            self.stride,
            if self.padding != 0 { format!(", padding=({},)", self.padding) } else { String::new() },
            if self.bias.is_none() { ", bias=False" } else { "" }
        )
    }
}

/// `nn.ConvTranspose2d(in, out, kernel_size, stride, padding, output_padding, groups, bias,
/// dilation)`; weight `[in, out/groups, kh, kw]`, fan_in computed from it as PyTorch does.
#[derive(crate::Module, Clone)]
#[module(name = "ConvTranspose2d")]
pub struct ConvTranspose2d {
    /// `[in, out/groups, kh, kw]`
    pub weight: Tensor,
    /// `[out]`
    pub bias: Option<Tensor>,
    stride: [i64; 2],
    padding: [i64; 2],
    output_padding: [i64; 2],
    dilation: [i64; 2],
    groups: i64,
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
}

impl ConvTranspose2d {
    /// `ConvTranspose2d(in, out, k, stride, padding, output_padding, groups, bias, dilation)`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        o: Conv2dOpts,
        output_padding: usize,
    ) -> Result<ConvTranspose2d> {
        check("ConvTranspose2d", in_channels, out_channels, o.groups)?;
        let k = kernel_size;
        let weight = init::default_weight(&[in_channels, out_channels / o.groups, k, k])?;
        // PyTorch: fan_in of the weight tensor = size(1) * k * k
        let fan_in = out_channels / o.groups * k * k;
        let bias = if o.bias { Some(init::default_bias(out_channels, fan_in)?) } else { None };
        let (s, p, d, op) = (o.stride as i64, o.padding as i64, o.dilation as i64, output_padding as i64);
        Ok(ConvTranspose2d {
            weight,
            bias,
            stride: [s, s],
            padding: [p, p],
            output_padding: [op, op],
            dilation: [d, d],
            groups: o.groups as i64,
            in_channels,
            out_channels,
            kernel: k,
        })
    }
}

impl Module for ConvTranspose2d {
    fn clone_module(&self) -> Option<Box<dyn Module>> {
        Some(Box::new(self.clone()))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        F::conv_transpose2d(
            x,
            &self.weight,
            self.bias.as_ref(),
            self.stride,
            self.padding,
            self.output_padding,
            self.groups,
            self.dilation,
        )
    }
    fn is_builtin_leaf(&self) -> bool {
        true
    }
    fn spec(&self) -> Option<ModuleSpec> {
        Some(
            ModuleSpec::new("ConvTranspose2d")
                .with("in_channels", Attr::Int(self.in_channels as i64))
                .with("out_channels", Attr::Int(self.out_channels as i64))
                .with("kernel_size", Attr::Int(self.kernel as i64))
                .with("stride", spec::ints(&self.stride))
                .with("padding", spec::ints(&self.padding))
                .with("output_padding", spec::ints(&self.output_padding))
                .with("dilation", spec::ints(&self.dilation))
                .with("groups", Attr::Int(self.groups))
                .with("bias", Attr::Bool(self.bias.is_some())),
        )
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, {}, kernel_size=({k}, {k}), stride={}{}",
            self.in_channels,
            self.out_channels,
            pair(self.stride),
            if self.bias.is_none() { ", bias=False" } else { "" },
            k = self.kernel
        )
    }
}

/// Reads `in_channels`, `out_channels` and `groups` of a conv spec and checks them.
fn channels(s: &ModuleSpec) -> Result<(usize, usize, usize)> {
    let (cin, cout, g) = (s.size("in_channels", 1)?, s.size("out_channels", 1)?, s.size("groups", 1)?);
    check(&s.type_name, cin, cout, g)?;
    Ok((cin, cout, g))
}

fn non_negative(s: &ModuleSpec, name: &str, v: &[i64], min: i64) -> Result<()> {
    if v.iter().any(|&x| x < min || x > 1 << 20) {
        return Err(Error::argument(&s.type_name, format!("attribute '{name}' = {v:?} is out of range (>= {min})")));
    }
    Ok(())
}

impl Conv2d {
    /// Rebuilds a Conv2d from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<Conv2d> {
        let (cin, cout, g) = channels(s)?;
        let k = s.ints::<2>("kernel_size")?;
        let (stride, padding, dilation) = (s.ints::<2>("stride")?, s.ints::<2>("padding")?, s.ints::<2>("dilation")?);
        non_negative(s, "kernel_size", &k, 1)?;
        non_negative(s, "stride", &stride, 1)?;
        non_negative(s, "padding", &padding, 0)?;
        non_negative(s, "dilation", &dilation, 1)?;
        let kernel = [k[0] as usize, k[1] as usize];
        let weight = spec::tensor(s, src, "weight", &[cout, cin / g, kernel[0], kernel[1]])?;
        let bias = spec::opt_tensor(s, src, "bias", &[cout], s.bool("bias")?)?;
        Ok(Conv2d {
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups: g as i64,
            in_channels: cin,
            out_channels: cout,
            kernel,
        })
    }
}

impl Conv1d {
    /// Rebuilds a Conv1d from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<Conv1d> {
        let (cin, cout, g) = channels(s)?;
        let k = s.size("kernel_size", 1)?;
        let (stride, padding, dilation) = (s.int("stride")?, s.int("padding")?, s.int("dilation")?);
        non_negative(s, "stride", &[stride], 1)?;
        non_negative(s, "padding", &[padding], 0)?;
        non_negative(s, "dilation", &[dilation], 1)?;
        let weight = spec::tensor(s, src, "weight", &[cout, cin / g, k])?;
        let bias = spec::opt_tensor(s, src, "bias", &[cout], s.bool("bias")?)?;
        Ok(Conv1d {
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups: g as i64,
            in_channels: cin,
            out_channels: cout,
            kernel: k,
        })
    }
}

impl ConvTranspose2d {
    /// Rebuilds a ConvTranspose2d from its spec and tensors.
    pub fn from_spec(s: &ModuleSpec, src: &mut TensorSource) -> Result<ConvTranspose2d> {
        let (cin, cout, g) = channels(s)?;
        let k = s.size("kernel_size", 1)?;
        let (stride, padding, dilation) = (s.ints::<2>("stride")?, s.ints::<2>("padding")?, s.ints::<2>("dilation")?);
        let output_padding = s.ints::<2>("output_padding")?;
        non_negative(s, "stride", &stride, 1)?;
        non_negative(s, "padding", &padding, 0)?;
        non_negative(s, "dilation", &dilation, 1)?;
        non_negative(s, "output_padding", &output_padding, 0)?;
        let weight = spec::tensor(s, src, "weight", &[cin, cout / g, k, k])?;
        let bias = spec::opt_tensor(s, src, "bias", &[cout], s.bool("bias")?)?;
        Ok(ConvTranspose2d {
            weight,
            bias,
            stride,
            padding,
            output_padding,
            dilation,
            groups: g as i64,
            in_channels: cin,
            out_channels: cout,
            kernel: k,
        })
    }
}
