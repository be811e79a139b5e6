//! `fused_elementwise`: one registry op that runs a whole group of float32 elementwise ops in
//! one pass, reading each input once and writing the output once.
//!
//! The group is carried as **data**: a [`FusedExpr`], a short list of instructions in SSA form
//! whose text (`t0 = add(x0, 1.0); t1 = mul(t0, 2.0); t2 = relu(t1)`) is the op's `expr`
//! argument. It prints with the graph, saves in `.fxm` files as a string and is run by the fixed
//! evaluator below: loading a file never runs code from it, it only parses the text into
//! instructions of a closed set.
//!
//! The evaluator is a vectorised interpreter: the output is cut into strips of [`STRIP`]
//! elements; for one strip every instruction runs as a fixed-length loop (a few full-width
//! vector operations) over registers of `STRIP` floats that never leave L1, compiled for
//! AVX-512/AVX2 by `simd_dispatch!`, and the last register is written to the output, which is
//! allocated uninitialised through [`crate::memory`] and written once. Contiguous inputs are
//! read in place; broadcast or strided inputs are gathered per block of strips. Large outputs
//! are split over rayon threads. Inputs may alias each other (they are only read).
//!
//! Element functions are the same formulas as the unfused ops (`Float`/`Num` on f32), so a
//! fused group gives the same bits as the ops run one by one.
//!
//! ```
//! use ferrofx_core::ops::fused::fused_elementwise;
//! use ferrofx_core::Tensor;
//! let x = Tensor::from_vec(vec![-3.0f32, 0.0, 2.0], &[3])?;
//! let y = fused_elementwise(&[x], "t0 = add(x0, 1.0); t1 = mul(t0, 2.0); t2 = relu(t1)")?;
//! assert_eq!(y.to_vec::<f32>()?, vec![0.0, 2.0, 6.0]);
//! # Ok::<(), ferrofx_core::Error>(())
//! ```

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, Layout};
use crate::op::args::{str_, tensors};
use crate::op::{dispatch, ArgSpec, ArgType as T, CallKind, Category, Cost, Effect, MetaOutputs, OpDef, Outputs};
use crate::ops::num::{Float, Num};
use crate::ops::simd::simd_dispatch;
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use rayon::prelude::*;
use smallvec::{smallvec, SmallVec};
use std::fmt;
use std::mem::MaybeUninit;

/// Elements per register of the evaluator (256 bytes: four AVX-512 vectors). Measured on
/// seed 003's `relu((x + 1) * 2)`: strips of 64 keep every temporary in the store buffer and
/// L1 and run at the speed of a copy; registers of 512 or more floats ran 2-5x slower.
pub const STRIP: usize = 64;
/// Elements per block: strided and broadcast inputs are gathered one block at a time.
const BLOCK: usize = 1024;
/// Elements per parallel task (256 KiB of output).
const TASK: usize = 64 * 1024;
/// The largest group the evaluator accepts (instructions) and the most inputs.
pub const MAX_INSTRS: usize = 256;
/// The most tensor inputs one group may read.
pub const MAX_INPUTS: usize = 64;

const OP: &str = "fused_elementwise";

/// The instruction set: float32 elementwise functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// `max(a, b)` (NaN propagates)
    Maximum,
    /// `min(a, b)` (NaN propagates)
    Minimum,
    /// `a ** b`
    Pow,
    /// `-a`
    Neg,
    /// `|a|`
    Abs,
    /// `max(a, 0)` (NaN propagates)
    Relu,
    /// `1 / (1 + e^-a)`
    Sigmoid,
    /// `tanh(a)`
    Tanh,
    /// `e^a`
    Exp,
    /// `e^a - 1`
    Expm1,
    /// `ln(a)`
    Log,
    /// `ln(1 + a)`
    Log1p,
    /// `sqrt(a)`
    Sqrt,
    /// `1 / sqrt(a)`
    Rsqrt,
    /// `1 / a`
    Reciprocal,
    /// `a * sigmoid(a)`
    Silu,
    /// exact GELU (erf)
    Gelu,
    /// GELU, tanh approximation
    GeluTanh,
    /// `erf(a)`
    Erf,
    /// `sin(a)`
    Sin,
    /// `cos(a)`
    Cos,
    /// round toward -inf
    Floor,
    /// round toward +inf
    Ceil,
    /// round toward zero
    Trunc,
    /// `a * relu6(a + 3) / 6`
    Hardswish,
    /// `relu6(a + 3) / 6`
    Hardsigmoid,
    /// `a if a > 0 else b * a` (b: the slope, a constant)
    LeakyRelu,
    /// `min(max(a, b), c)` with constant bounds (`-inf`/`inf` for an absent one)
    Clamp,
}

impl FusedOp {
    const ALL: &'static [FusedOp] = &[
        FusedOp::Add,
        FusedOp::Sub,
        FusedOp::Mul,
        FusedOp::Div,
        FusedOp::Maximum,
        FusedOp::Minimum,
        FusedOp::Pow,
        FusedOp::Neg,
        FusedOp::Abs,
        FusedOp::Relu,
        FusedOp::Sigmoid,
        FusedOp::Tanh,
        FusedOp::Exp,
        FusedOp::Expm1,
        FusedOp::Log,
        FusedOp::Log1p,
        FusedOp::Sqrt,
        FusedOp::Rsqrt,
        FusedOp::Reciprocal,
        FusedOp::Silu,
        FusedOp::Gelu,
        FusedOp::GeluTanh,
        FusedOp::Erf,
        FusedOp::Sin,
        FusedOp::Cos,
        FusedOp::Floor,
        FusedOp::Ceil,
        FusedOp::Trunc,
        FusedOp::Hardswish,
        FusedOp::Hardsigmoid,
        FusedOp::LeakyRelu,
        FusedOp::Clamp,
    ];

    /// The spelling in an expression (the registry name of the unfused op where one exists).
    pub fn name(self) -> &'static str {
        match self {
            FusedOp::Add => "add",
            FusedOp::Sub => "sub",
            FusedOp::Mul => "mul",
            FusedOp::Div => "div",
            FusedOp::Maximum => "maximum",
            FusedOp::Minimum => "minimum",
            FusedOp::Pow => "pow",
            FusedOp::Neg => "neg",
            FusedOp::Abs => "abs",
            FusedOp::Relu => "relu",
            FusedOp::Sigmoid => "sigmoid",
            FusedOp::Tanh => "tanh",
            FusedOp::Exp => "exp",
            FusedOp::Expm1 => "expm1",
            FusedOp::Log => "log",
            FusedOp::Log1p => "log1p",
            FusedOp::Sqrt => "sqrt",
            FusedOp::Rsqrt => "rsqrt",
            FusedOp::Reciprocal => "reciprocal",
            FusedOp::Silu => "silu",
            FusedOp::Gelu => "gelu",
            FusedOp::GeluTanh => "gelu_tanh",
            FusedOp::Erf => "erf",
            FusedOp::Sin => "sin",
            FusedOp::Cos => "cos",
            FusedOp::Floor => "floor",
            FusedOp::Ceil => "ceil",
            FusedOp::Trunc => "trunc",
            FusedOp::Hardswish => "hardswish",
            FusedOp::Hardsigmoid => "hardsigmoid",
            FusedOp::LeakyRelu => "leaky_relu",
            FusedOp::Clamp => "clamp",
        }
    }

    /// Looks an instruction up by its spelling.
    pub fn from_name(name: &str) -> Option<FusedOp> {
        FusedOp::ALL.iter().copied().find(|o| o.name() == name)
    }

    /// Number of operands.
    pub fn arity(self) -> usize {
        match self {
            FusedOp::Add
            | FusedOp::Sub
            | FusedOp::Mul
            | FusedOp::Div
            | FusedOp::Maximum
            | FusedOp::Minimum
            | FusedOp::Pow
            | FusedOp::LeakyRelu => 2,
            FusedOp::Clamp => 3,
            _ => 1,
        }
    }

    /// Operands after the first that must be constants (slopes and bounds).
    fn constant_params(self) -> bool {
        matches!(self, FusedOp::LeakyRelu | FusedOp::Clamp)
    }
}

/// One operand of an instruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    /// The `i`-th tensor input of the group (`x0`, `x1`, ...).
    Input(u16),
    /// The result of instruction `i` (`t0`, `t1`, ...), which must come before.
    Tmp(u16),
    /// A float32 constant (a Python number of the original graph, cast as PyTorch casts it).
    Const(f32),
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Input(i) => write!(f, "x{i}"),
            Operand::Tmp(i) => write!(f, "t{i}"),
            // Debug of f32 is the shortest text that parses back to the same bits
            Operand::Const(c) => write!(f, "{c:?}"),
        }
    }
}

/// One instruction: `t{k} = op(operands...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Instr {
    /// The function.
    pub op: FusedOp,
    /// Its operands (`op.arity()` of them).
    pub args: SmallVec<[Operand; 3]>,
}

/// A fused elementwise group: instructions in SSA order; the last one is the result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FusedExpr {
    /// The instructions.
    pub instrs: Vec<Instr>,
}

impl FusedExpr {
    /// Number of tensor inputs the expression reads (one more than the largest `x` index).
    pub fn num_inputs(&self) -> usize {
        self.instrs
            .iter()
            .flat_map(|i| i.args.iter())
            .filter_map(|a| match a {
                Operand::Input(i) => Some(*i as usize + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Checks the structure: at least one instruction, right arities, temporaries defined
    /// before use, constants where the op needs constants, bounded size.
    pub fn validate(&self) -> Result<()> {
        if self.instrs.is_empty() {
            return Err(Error::argument(OP, "the expression has no instruction; a group computes at least one op"));
        }
        if self.instrs.len() > MAX_INSTRS {
            return Err(Error::argument(
                OP,
                format!("the expression has {} instructions, more than the limit {MAX_INSTRS}", self.instrs.len()),
            ));
        }
        for (k, ins) in self.instrs.iter().enumerate() {
            if ins.args.len() != ins.op.arity() {
                return Err(Error::argument(
                    OP,
                    format!("t{k} = {}(..) takes {} operands, got {}", ins.op.name(), ins.op.arity(), ins.args.len()),
                ));
            }
            for (j, a) in ins.args.iter().enumerate() {
                match *a {
                    Operand::Tmp(t) if t as usize >= k => {
                        return Err(Error::argument(OP, format!("t{k} reads t{t}, which is not defined before it")));
                    }
                    Operand::Input(i) if i as usize >= MAX_INPUTS => {
                        return Err(Error::argument(
                            OP,
                            format!("t{k} reads x{i}; a group reads at most {MAX_INPUTS} inputs"),
                        ));
                    }
                    Operand::Const(_) => {}
                    _ if j > 0 && ins.op.constant_params() => {
                        return Err(Error::argument(
                            OP,
                            format!("t{k} = {}: operand {j} must be a number (slope or bound)", ins.op.name()),
                        ));
                    }
                    _ => {}
                }
            }
            if j0_is_const_only(ins) {
                return Err(Error::argument(
                    OP,
                    format!("t{k} = {}: every operand is a constant; fold it before fusing", ins.op.name()),
                ));
            }
        }
        Ok(())
    }

    /// Parses the text form (`t0 = add(x0, 1.0); t1 = relu(t0)`), validating it.
    ///
    /// ```
    /// use ferrofx_core::ops::fused::FusedExpr;
    /// let e = FusedExpr::parse("t0 = mul(x1, 2.0); t1 = add(x0, t0); t2 = relu(t1)")?;
    /// assert_eq!(e.num_inputs(), 2);
    /// assert_eq!(e.to_string(), "t0 = mul(x1, 2.0); t1 = add(x0, t0); t2 = relu(t1)");
    /// assert!(FusedExpr::parse("t0 = launch_missiles(x0)").is_err());
    /// # Ok::<(), ferrofx_core::Error>(())
    /// ```
    pub fn parse(text: &str) -> Result<FusedExpr> {
        let bad = |msg: String| Error::argument(OP, format!("{msg} in expression '{text}'"));
        let mut instrs = Vec::new();
        for (k, stmt) in text.split(';').map(str::trim).filter(|s| !s.is_empty()).enumerate() {
            let (lhs, rhs) = stmt.split_once('=').ok_or_else(|| bad(format!("statement '{stmt}' has no '='")))?;
            if lhs.trim() != format!("t{k}") {
                return Err(bad(format!("statement {k} must define t{k}, found '{}'", lhs.trim())));
            }
            let rhs = rhs.trim();
            let (name, rest) = rhs.split_once('(').ok_or_else(|| bad(format!("'{rhs}' is not a call")))?;
            let inner = rest.strip_suffix(')').ok_or_else(|| bad(format!("'{rhs}' does not end with ')'")))?;
            let op = FusedOp::from_name(name.trim()).ok_or_else(|| {
                bad(format!(
                    "unknown function '{}' (known: {})",
                    name.trim(),
                    FusedOp::ALL.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
                ))
            })?;
            let mut args = SmallVec::new();
            for a in inner.split(',').map(str::trim) {
                args.push(parse_operand(a).ok_or_else(|| bad(format!("bad operand '{a}'")))?);
            }
            instrs.push(Instr { op, args });
        }
        let e = FusedExpr { instrs };
        e.validate().map_err(|err| bad(err.message().to_string()))?;
        Ok(e)
    }

    /// `add_mul_relu`: the op names in order, for node names (`fused_add_mul_relu`).
    pub fn short_name(&self) -> String {
        let names: Vec<&str> = self.instrs.iter().map(|i| i.op.name()).collect();
        let mut s = names.join("_");
        if s.len() > 48 {
            s.truncate(48);
            s = s.trim_end_matches('_').to_string();
        }
        s
    }
}

fn j0_is_const_only(ins: &Instr) -> bool {
    ins.args.iter().all(|a| matches!(a, Operand::Const(_)))
}

fn parse_operand(a: &str) -> Option<Operand> {
    if let Some(i) = a.strip_prefix('x') {
        return i.parse::<u16>().ok().map(Operand::Input);
    }
    if let Some(i) = a.strip_prefix('t') {
        return i.parse::<u16>().ok().map(Operand::Tmp);
    }
    a.parse::<f32>().ok().map(Operand::Const)
}

impl fmt::Display for FusedExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, ins) in self.instrs.iter().enumerate() {
            if k > 0 {
                write!(f, "; ")?;
            }
            write!(f, "t{k} = {}(", ins.op.name())?;
            for (j, a) in ins.args.iter().enumerate() {
                if j > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{a}")?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Element functions: the same formulas as the unfused ops in unary.rs / binary.rs.

#[inline(always)]
fn clamp_f(x: f32, lo: f32, hi: f32) -> f32 {
    let y = if x < lo { lo } else { x };
    if y > hi {
        hi
    } else {
        y
    }
}

#[inline(always)]
fn unary(op: FusedOp, x: f32) -> f32 {
    let one = 1.0f32;
    match op {
        FusedOp::Neg => Num::neg(x),
        FusedOp::Abs => Num::abs(x),
        FusedOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        FusedOp::Sigmoid => one.div(one.add(Num::neg(x).exp())),
        FusedOp::Tanh => Float::tanh(x),
        FusedOp::Exp => Float::exp(x),
        FusedOp::Expm1 => Float::exp_m1(x),
        FusedOp::Log => Float::ln(x),
        FusedOp::Log1p => Float::ln_1p(x),
        FusedOp::Sqrt => Float::sqrt(x),
        FusedOp::Rsqrt => one.div(Float::sqrt(x)),
        FusedOp::Reciprocal => one.div(x),
        FusedOp::Silu => x.div(one.add(Num::neg(x).exp())),
        // the same vectorisable erf as the eager f32 `gelu` kernel: fused and unfused are bit-equal
        FusedOp::Gelu => super::vmath::gelu(x),
        FusedOp::GeluTanh => {
            let k = f32::c(0.7978845608028654);
            let inner = k.mul(x.add(f32::c(0.044715).mul(x).mul(x).mul(x)));
            f32::c(0.5).mul(x).mul(one.add(inner.tanh()))
        }
        FusedOp::Erf => Float::erf(x),
        FusedOp::Sin => Float::sin(x),
        FusedOp::Cos => Float::cos(x),
        FusedOp::Floor => Float::floor(x),
        FusedOp::Ceil => Float::ceil(x),
        FusedOp::Trunc => Float::trunc(x),
        FusedOp::Hardswish => x.mul(clamp_f(x.add(3.0), 0.0, 6.0)).div(6.0),
        FusedOp::Hardsigmoid => clamp_f(x.add(3.0), 0.0, 6.0).div(6.0),
        // binary ops never reach here (the evaluator matches them first)
        _ => x,
    }
}

#[inline(always)]
fn binary(op: FusedOp, a: f32, b: f32) -> f32 {
    match op {
        FusedOp::Add => Num::add(a, b),
        FusedOp::Sub => Num::sub(a, b),
        FusedOp::Mul => Num::mul(a, b),
        FusedOp::Div => Num::div(a, b),
        FusedOp::Maximum => Num::maximum(a, b),
        FusedOp::Minimum => Num::minimum(a, b),
        FusedOp::Pow => Num::pow(a, b),
        FusedOp::LeakyRelu => {
            if a > 0.0 {
                a
            } else {
                a.mul(b)
            }
        }
        _ => a,
    }
}

// ---------------------------------------------------------------------------------------------
// The evaluator.

/// One register of the evaluator: a strip of [`STRIP`] floats, aligned to a cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Reg([f32; STRIP]);

/// A resolved operand for one strip: a full strip of values or a constant.
#[derive(Clone, Copy)]
enum Src<'a> {
    Strip(&'a [f32; STRIP]),
    Splat(f32),
}

// The loops below run over arrays of the constant length STRIP: the compiler unrolls them into
// a few full-width vector operations with no loop or bounds overhead, so interpreting one
// instruction for one strip costs a jump and STRIP / lanes vector instructions.

#[inline(always)]
fn map1(out: &mut [f32; STRIP], a: &[f32; STRIP], f: impl Fn(f32) -> f32) {
    for j in 0..STRIP {
        out[j] = f(a[j]);
    }
}

#[inline(always)]
fn map2(out: &mut [f32; STRIP], a: Src<'_>, b: Src<'_>, f: impl Fn(f32, f32) -> f32) {
    match (a, b) {
        (Src::Strip(a), Src::Strip(b)) => {
            for j in 0..STRIP {
                out[j] = f(a[j], b[j]);
            }
        }
        (Src::Strip(a), Src::Splat(y)) => map1(out, a, |x| f(x, y)),
        (Src::Splat(x), Src::Strip(b)) => map1(out, b, |y| f(x, y)),
        (Src::Splat(x), Src::Splat(y)) => out.fill(f(x, y)),
    }
}

#[inline(always)]
fn run_unary(op: FusedOp, out: &mut [f32; STRIP], a: Src<'_>) {
    let a = match a {
        Src::Strip(a) => a,
        Src::Splat(x) => {
            out.fill(unary(op, x));
            return;
        }
    };
    // one loop per function, so each loop is a straight vectorisable body
    macro_rules! arms {
        ($($o:ident),*) => {
            match op {
                $(FusedOp::$o => map1(out, a, |x| unary(FusedOp::$o, x)),)*
                _ => map1(out, a, |x| unary(op, x)),
            }
        };
    }
    arms!(Neg, Abs, Relu, Sigmoid, Tanh, Exp, Sqrt, Rsqrt, Reciprocal, Silu, Gelu, GeluTanh, Hardswish, Hardsigmoid)
}

#[inline(always)]
fn run_binary(op: FusedOp, out: &mut [f32; STRIP], a: Src<'_>, b: Src<'_>) {
    macro_rules! arms {
        ($($o:ident),*) => {
            match op {
                $(FusedOp::$o => map2(out, a, b, |x, y| binary(FusedOp::$o, x, y)),)*
                _ => map2(out, a, b, |x, y| binary(op, x, y)),
            }
        };
    }
    arms!(Add, Sub, Mul, Div, Maximum, Minimum, LeakyRelu)
}

/// Evaluates every instruction over one strip; `regs[k]` receives instruction `k`'s values,
/// `ins[i]` is input `i`'s strip (or its broadcast value).
#[inline(always)]
fn eval_strip(instrs: &[Instr], ins: &[Src<'_>], regs: &mut [Reg]) {
    for (k, ins_k) in instrs.iter().enumerate() {
        let (done, rest) = regs.split_at_mut(k);
        let Some(out) = rest.first_mut().map(|r| &mut r.0) else { return };
        let src = |a: &Operand| -> Src<'_> {
            match *a {
                Operand::Input(i) => ins.get(i as usize).copied().unwrap_or(Src::Splat(0.0)),
                Operand::Tmp(t) => done.get(t as usize).map_or(Src::Splat(0.0), |r| Src::Strip(&r.0)),
                Operand::Const(c) => Src::Splat(c),
            }
        };
        match ins_k.op {
            FusedOp::Clamp => {
                let (lo, hi) = match (src(&ins_k.args[1]), src(&ins_k.args[2])) {
                    (Src::Splat(lo), Src::Splat(hi)) => (lo, hi),
                    _ => (f32::NEG_INFINITY, f32::INFINITY),
                };
                match src(&ins_k.args[0]) {
                    Src::Strip(a) => map1(out, a, |x| clamp_f(x, lo, hi)),
                    Src::Splat(x) => out.fill(clamp_f(x, lo, hi)),
                }
            }
            op if op.arity() == 2 => run_binary(op, out, src(&ins_k.args[0]), src(&ins_k.args[1])),
            op => run_unary(op, out, src(&ins_k.args[0])),
        }
    }
}

/// How one input is read: straight from its storage, as one broadcast value, or gathered
/// through its (broadcast, strided) layout.
enum Access<'a> {
    Contiguous(&'a [f32]),
    Splat(f32),
    Strided { data: &'a [f32], layout: Layout },
}

/// Copies elements `start..start + out.len()` (row-major over `layout.shape()`) into `out`.
fn gather(data: &[f32], layout: &Layout, start: usize, out: &mut [f32]) {
    let shape = layout.shape();
    let strides = layout.strides();
    let nd = shape.len();
    let mut idx: SmallVec<[usize; 6]> = smallvec![0; nd];
    let mut rem = start;
    for d in (0..nd).rev() {
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    let mut pos: usize = layout.offset() + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
    let (inner, inner_stride) = (shape[nd - 1], strides[nd - 1]);
    let mut k = 0;
    while k < out.len() {
        // the rest of the innermost row, at most what is left of the block
        let run = (inner - idx[nd - 1]).min(out.len() - k);
        if inner_stride == 0 {
            out[k..k + run].fill(data[pos]);
        } else if inner_stride == 1 {
            out[k..k + run].copy_from_slice(&data[pos..pos + run]);
            pos += run;
        } else {
            for o in &mut out[k..k + run] {
                *o = data[pos];
                pos += inner_stride;
            }
        }
        k += run;
        idx[nd - 1] += run;
        if idx[nd - 1] == inner {
            // carry into the outer dims and recompute the position
            let mut d = nd - 1;
            while d > 0 && idx[d] == shape[d] {
                idx[d] = 0;
                idx[d - 1] += 1;
                d -= 1;
            }
            pos = layout.offset() + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        }
    }
}

simd_dispatch! {
    /// Evaluates output elements `start..start + out.len()` into `out`: block by block (strided
    /// inputs gathered per block of [`BLOCK`]), strip by strip within a block.
    fn eval_range(instrs: &[Instr], access: &[Access<'_>], start: usize, out: &mut [MaybeUninit<f32>]) {
        let n_in = access.len();
        let Some(last) = instrs.len().checked_sub(1) else { return };
        let mut regs = vec![Reg([0.0; STRIP]); instrs.len()];
        // per input: its gathered block (strided inputs) and a zero-padded partial strip
        let strided = access.iter().any(|a| matches!(a, Access::Strided { .. }));
        let mut gathered = vec![0f32; if strided { n_in * BLOCK } else { 0 }];
        let mut tails = vec![Reg([0.0; STRIP]); n_in];
        for (b, out_b) in out.chunks_mut(BLOCK).enumerate() {
            let s = start + b * BLOCK;
            for (i, a) in access.iter().enumerate() {
                if let Access::Strided { data, layout } = a {
                    gather(data, layout, s, &mut gathered[i * BLOCK..i * BLOCK + out_b.len()]);
                }
            }
            for (k, out_s) in out_b.chunks_mut(STRIP).enumerate() {
                let (p, len) = (s + k * STRIP, out_s.len());
                if len < STRIP {
                    // the last strip: inputs copied into zero-padded registers (the padding
                    // lanes are computed and dropped)
                    for (i, a) in access.iter().enumerate() {
                        let src = match a {
                            Access::Contiguous(d) => &d[p..p + len],
                            Access::Strided { .. } => &gathered[i * BLOCK + k * STRIP..][..len],
                            Access::Splat(_) => continue,
                        };
                        tails[i].0[..len].copy_from_slice(src);
                        tails[i].0[len..].fill(0.0);
                    }
                }
                let mut ins: SmallVec<[Src<'_>; 8]> = SmallVec::with_capacity(n_in);
                for (i, a) in access.iter().enumerate() {
                    ins.push(match a {
                        Access::Splat(v) => Src::Splat(*v),
                        _ if len < STRIP => Src::Strip(&tails[i].0),
                        Access::Contiguous(d) => d[p..].first_chunk().map_or(Src::Splat(0.0), Src::Strip),
                        Access::Strided { .. } => gathered[i * BLOCK + k * STRIP..]
                            .first_chunk()
                            .map_or(Src::Splat(0.0), Src::Strip),
                    });
                }
                eval_strip(instrs, &ins, &mut regs);
                for (o, &v) in out_s.iter_mut().zip(&regs[last].0) {
                    o.write(v);
                }
            }
        }
    }
}

/// Output shape and checks shared by meta and kernel.
fn check(inputs: &[Tensor], expr: &FusedExpr) -> Result<SmallVec<[usize; 6]>> {
    let need = expr.num_inputs();
    if inputs.len() != need {
        return Err(Error::argument(
            OP,
            format!(
                "the expression '{expr}' reads {need} inputs (x0..x{}), got {} tensors",
                need.max(1) - 1,
                inputs.len()
            ),
        ));
    }
    if inputs.is_empty() {
        return Err(Error::argument(
            OP,
            format!("the expression '{expr}' reads no tensor; a group needs at least one input"),
        ));
    }
    let mut shape: SmallVec<[usize; 6]> = SmallVec::from_slice(inputs[0].shape());
    for (i, t) in inputs.iter().enumerate() {
        if t.dtype() != DType::F32 {
            return Err(Error::dtype(
                OP,
                format!(
                    "input x{i} has dtype {}; fused groups compute in float32 only (leave other dtypes unfused)",
                    t.dtype()
                ),
            ));
        }
        shape = SmallVec::from_slice(&broadcast_shapes(OP, &shape, t.shape()).map_err(|e| {
            Error::shape(
                OP,
                format!("input x{i} of shape {:?} does not broadcast with the others: {}", t.shape(), e.message()),
            )
        })?);
    }
    Ok(shape)
}

fn meta(args: &[Value]) -> Result<MetaOutputs> {
    let inputs = tensors(OP, args, 0)?;
    let expr = FusedExpr::parse(str_(OP, args, 1)?)?;
    let shape = check(inputs, &expr)?;
    Ok(smallvec![TensorMeta::contiguous(&shape, DType::F32)])
}

fn kernel(args: &[Value]) -> Result<Outputs> {
    let inputs = tensors(OP, args, 0)?;
    let expr = FusedExpr::parse(str_(OP, args, 1)?)?;
    let shape = check(inputs, &expr)?;
    Ok(smallvec![eval(inputs, &expr, &shape)?])
}

/// Runs `expr` over `inputs` (already checked) into a new tensor of `shape`.
fn eval(inputs: &[Tensor], expr: &FusedExpr, shape: &[usize]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut guards = Vec::with_capacity(inputs.len());
    let mut layouts = Vec::with_capacity(inputs.len());
    for t in inputs {
        let (storage, layout) = t.concrete(OP)?;
        guards.push(storage.read());
        layouts.push(layout.broadcast_to(OP, shape)?);
    }
    let mut access = Vec::with_capacity(inputs.len());
    for (g, l) in guards.iter().zip(&layouts) {
        let data = g.as_slice::<f32>().ok_or_else(|| Error::dtype(OP, "expected float32 storage"))?;
        let a = if n == 0 {
            Access::Splat(0.0)
        } else if l.is_contiguous() {
            Access::Contiguous(&data[l.offset()..l.offset() + n])
        } else if l.strides().iter().all(|&s| s == 0) {
            Access::Splat(data[l.offset()])
        } else {
            Access::Strided { data, layout: l.clone() }
        };
        access.push(a);
    }
    // not zero-filled: eval_range writes every element once
    let mut buf: Vec<f32> = crate::memory::alloc_uninit(OP, shape)?;
    let out = &mut buf.spare_capacity_mut()[..n];
    if n <= TASK {
        eval_range(&expr.instrs, &access, 0, out);
    } else {
        out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| eval_range(&expr.instrs, &access, t * TASK, o));
    }
    // SAFETY: alloc_uninit reserved exactly n elements; eval_range writes every element of
    // every strip of `out`, and the strips cover all n elements.
    unsafe { buf.set_len(n) };
    drop(guards);
    Tensor::from_vec(buf, shape)
}

fn cost(args: &[Value], outs: &[TensorMeta]) -> Cost {
    let mut bytes = 0u64;
    for a in args {
        a.for_each_tensor(|t| bytes = bytes.saturating_add(t.meta_nbytes() as u64));
    }
    let instrs = match args.get(1) {
        Some(Value::Str(s)) => FusedExpr::parse(s).map(|e| e.instrs.len()).unwrap_or(1),
        _ => 1,
    };
    let numel: u64 = outs.iter().map(|o| o.numel() as u64).sum();
    bytes = outs.iter().fold(bytes, |b, o| b.saturating_add(o.nbytes() as u64));
    Cost { flops: numel.saturating_mul(instrs as u64), bytes }
}

/// The op: `fused_elementwise(Tensor[] inputs, str expr) -> Tensor`.
pub static FUSED_ELEMENTWISE: OpDef = OpDef {
    name: OP,
    schema: &[ArgSpec::req("inputs", T::TensorList), ArgSpec::req("expr", T::Str)],
    meta,
    kernel,
    cost,
    effect: Effect::Pure,
    category: Category::Elementwise,
    backward: None,
    saves: crate::op::Saves::NOTHING,
    doc: "A group of float32 elementwise ops evaluated in one pass (made by ferrofx-compile's fusion).",
};

/// Runs a fused elementwise expression (see the module docs) over `inputs`.
pub fn fused_elementwise(inputs: &[Tensor], expr: &str) -> Result<Tensor> {
    let out = dispatch(
        &FUSED_ELEMENTWISE,
        CallKind::Function,
        &[Value::Tensors(inputs.to_vec()), Value::Str(expr.to_string())],
    )?;
    out.into_iter().next().ok_or_else(|| Error::argument(OP, "no output"))
}

pub(crate) static OPS: &[&OpDef] = &[&FUSED_ELEMENTWISE];
