//! `fused_elementwise`: one registry op that runs a whole group of float32 elementwise ops in
//! one pass, reading each input once and writing the output once.
//!
//! The group is carried as **data**: a [`FusedExpr`], a short list of instructions in SSA form
//! whose text (`t0 = add(x0, 1.0); t1 = mul(t0, 2.0); t2 = relu(t1)`) is the op's `expr`
//! argument. It prints with the graph, saves in `.fxm` files as a string and is run by the fixed
//! evaluator below: loading a file never runs code from it, it only parses the text into
//! instructions of a closed set.
//!
//! The evaluator is a vectorised interpreter. The expression is decoded once per call into a
//! list of steps, each a function pointer to a small kernel for one instruction and one kind
//! of operands (strip and strip, strip and constant, ...) compiled for AVX-512, AVX2 or the
//! baseline (see `kernels`); instructions whose operands are all constants (inputs broadcast
//! from one value become constants) are evaluated once at decode time. Contiguous inputs are
//! read in place (and prefetched a little ahead), strided ones gathered 1024 elements at a
//! time. The output is cut into strips of [`STRIP`] elements: for one strip every step is
//! one call of its kernel over registers of `STRIP` floats that never leave L1, and the last
//! writes straight into the output strip. The output is allocated
//! uninitialised through [`crate::memory`] and written once; outputs of at least
//! [`STREAM_MIN_BYTES`] are written with non-temporal stores. Large outputs are split over the
//! kernels' thread team. Inputs may alias each other (they are only read).
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
use crate::tensor::{Tensor, TensorMeta};
use crate::value::Value;
use smallvec::{smallvec, SmallVec};
use std::fmt;
use std::mem::MaybeUninit;

/// Elements per register of the evaluator (512 bytes: eight AVX-512 vectors). Each
/// instruction runs over one strip per kernel call, so a strip must be long enough to hide
/// the call (in a standalone copy of this evaluator, strips of 64 ran ~15% slower than 128 on
/// seed 003's expressions, session 22) and short enough that every temporary stays in L1.
pub const STRIP: usize = 128;
/// Elements per block: strided and broadcast inputs are gathered one block at a time.
const BLOCK: usize = 1024;
/// Elements per parallel task (256 KiB of output).
const TASK: usize = 64 * 1024;
/// The largest group the evaluator accepts (instructions) and the most inputs.
pub const MAX_INSTRS: usize = 256;
/// The most tensor inputs one group may read.
pub const MAX_INPUTS: usize = 64;

const OP: &str = "fused_elementwise";

/// The instruction set: float32 elementwise functions (comparisons give `1.0` / `0.0`).
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
    /// `a == b` as `1.0` / `0.0`
    Eq,
    /// `a != b` as `1.0` / `0.0`
    Ne,
    /// `a > b` as `1.0` / `0.0`
    Gt,
    /// `a >= b` as `1.0` / `0.0`
    Ge,
    /// `a < b` as `1.0` / `0.0`
    Lt,
    /// `a <= b` as `1.0` / `0.0`
    Le,
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
        FusedOp::Eq,
        FusedOp::Ne,
        FusedOp::Gt,
        FusedOp::Ge,
        FusedOp::Lt,
        FusedOp::Le,
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
            FusedOp::Eq => "eq",
            FusedOp::Ne => "ne",
            FusedOp::Gt => "gt",
            FusedOp::Ge => "ge",
            FusedOp::Lt => "lt",
            FusedOp::Le => "le",
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
            | FusedOp::LeakyRelu
            | FusedOp::Eq
            | FusedOp::Ne
            | FusedOp::Gt
            | FusedOp::Ge
            | FusedOp::Lt
            | FusedOp::Le => 2,
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
        // a comparison's bool as float32, as PyTorch promotes it where a float operand reads it
        FusedOp::Eq => f32::from(u8::from(a == b)),
        FusedOp::Ne => f32::from(u8::from(a != b)),
        FusedOp::Gt => f32::from(u8::from(a > b)),
        FusedOp::Ge => f32::from(u8::from(a >= b)),
        FusedOp::Lt => f32::from(u8::from(a < b)),
        FusedOp::Le => f32::from(u8::from(a <= b)),
        _ => a,
    }
}

// ---------------------------------------------------------------------------------------------
// The evaluator.

mod kernels;
use kernels::{Isa, Kernel, Kind};

/// One register of the evaluator: a strip of [`STRIP`] floats, aligned to a cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Reg([f32; STRIP]);

/// Where a decoded operand's strip is read from.
#[derive(Clone, Copy, Debug)]
enum Loc {
    /// The `i`-th input, strip by strip from memory.
    Mem(u16),
    /// An earlier step's register.
    Reg(u16),
    /// Not read by the step's kernel.
    Unused,
}

/// An instruction's value after decoding: a strip in some place, or a constant (an
/// instruction whose operands are all constants, for instance inputs broadcast from one
/// value, is evaluated once at decode time with the same scalar formula).
#[derive(Clone, Copy, Debug)]
enum Val {
    Strip(Loc),
    Const(f32),
}

/// One instruction decoded for one call: its kernel, where its operands are, its constant
/// parameters (see [`Kind`]); it writes register `out`, or the output strip if it is last.
#[derive(Clone, Copy)]
struct Step {
    kernel: Kernel,
    a: Loc,
    b: Loc,
    params: [f32; 2],
    out: u16,
}

/// The decoded expression: the steps to run per strip and the result (the last step's
/// values, or a constant when the whole result is one).
struct Program {
    steps: SmallVec<[Step; 16]>,
    constant: Option<f32>,
}

/// Decodes `expr` against the inputs' access kinds for `isa` (once per call, not per strip).
fn decode(expr: &FusedExpr, access: &[Access<'_>], isa: Isa) -> Result<Program> {
    let mut vals: SmallVec<[Val; 16]> = SmallVec::with_capacity(expr.instrs.len());
    let mut steps: SmallVec<[Step; 16]> = SmallVec::new();
    for (k, ins) in expr.instrs.iter().enumerate() {
        let val = |o: Option<&Operand>| match o {
            Some(&Operand::Input(i)) => match access.get(i as usize) {
                Some(Access::Splat(v)) => Val::Const(*v),
                Some(_) => Val::Strip(Loc::Mem(i)),
                None => Val::Const(0.0),
            },
            Some(&Operand::Tmp(t)) => vals.get(t as usize).copied().unwrap_or(Val::Const(0.0)),
            Some(&Operand::Const(c)) => Val::Const(c),
            None => Val::Const(0.0),
        };
        let constant = |j: usize, default: f32| match ins.args.get(j) {
            Some(&Operand::Const(c)) => c,
            _ => default,
        };
        let op = ins.op;
        // the kernel, its operands and parameters; or the value when it is a constant
        let (kind, a, b, params) = match (op, val(ins.args.first()), val(ins.args.get(1))) {
            (FusedOp::Clamp, a, _) => {
                let (lo, hi) = (constant(1, f32::NEG_INFINITY), constant(2, f32::INFINITY));
                match a {
                    Val::Const(x) => {
                        vals.push(Val::Const(clamp_f(x, lo, hi)));
                        continue;
                    }
                    Val::Strip(l) => (Kind::Unary, l, Loc::Unused, [lo, hi]),
                }
            }
            (op, a, b) if op.arity() == 2 => match (a, b) {
                (Val::Const(x), Val::Const(y)) => {
                    vals.push(Val::Const(binary(op, x, y)));
                    continue;
                }
                (Val::Strip(x), Val::Strip(y)) => (Kind::StripStrip, x, y, [0.0; 2]),
                (Val::Strip(x), Val::Const(c)) => (Kind::StripConst, x, Loc::Unused, [c, 0.0]),
                (Val::Const(c), Val::Strip(y)) => (Kind::ConstStrip, y, Loc::Unused, [c, 0.0]),
            },
            (op, a, _) => match a {
                Val::Const(x) => {
                    vals.push(Val::Const(unary(op, x)));
                    continue;
                }
                Val::Strip(l) => (Kind::Unary, l, Loc::Unused, [0.0; 2]),
            },
        };
        let kernel = kernels::kernel(op, kind, isa).ok_or_else(|| {
            Error::argument(OP, format!("t{k} = {}: no kernel for operands of kind {kind:?}", op.name()))
        })?;
        let out = steps.len() as u16;
        steps.push(Step { kernel, a, b, params, out });
        vals.push(Val::Strip(Loc::Reg(out)));
    }
    let constant = match vals.last() {
        Some(Val::Const(c)) => Some(*c),
        _ => None,
    };
    // the evaluator writes every output element through the last step, or fills the constant
    if constant.is_none() && steps.is_empty() {
        return Err(Error::argument(OP, format!("the expression '{expr}' decoded to no step and no constant")));
    }
    Ok(Program { steps, constant })
}

/// Runs every step over one strip: `mem[i].add(off)` is input `i`'s strip, `regs` holds the
/// steps' registers and the last step writes `dst`.
///
/// # Safety
/// `mem[i].add(off)` is valid for `STRIP` reads for every input a step reads from memory;
/// `regs` holds a register per step; `dst` is valid for `STRIP` writes and overlaps neither;
/// the steps' kernels were chosen for an instruction set this CPU has.
#[inline(always)]
unsafe fn run_strip(steps: &[Step], mem: &[*const f32], off: usize, regs: *mut f32, dst: *mut f32) {
    let last = steps.len().wrapping_sub(1);
    for (i, st) in steps.iter().enumerate() {
        // SAFETY: the caller's contract (Mem and Reg locations were checked by `decode`: a
        // Mem index names an input, a Reg index an earlier step's register)
        unsafe {
            let at = |l: Loc| -> *const f32 {
                match l {
                    Loc::Mem(m) => mem[m as usize].add(off),
                    Loc::Reg(r) => regs.add(r as usize * STRIP),
                    Loc::Unused => std::ptr::null(),
                }
            };
            let o = if i == last { dst } else { regs.add(st.out as usize * STRIP) };
            (st.kernel)(o, at(st.a), at(st.b), st.params);
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

/// Outputs at least this large are written with non-temporal (streaming) stores: they cannot
/// stay in the caches anyway, and streaming saves the read of every output line before its
/// write (a third of the traffic of a one-input map). Smaller outputs are stored normally so
/// the next op finds them in cache.
pub const STREAM_MIN_BYTES: usize = 16 << 20;

/// Writes a register to an output strip with non-temporal stores of `W` bits (`W` is the
/// vector width the calling code is compiled for: 512, 256 or 128).
#[inline(always)]
fn stream_strip<const W: usize>(o: &mut [MaybeUninit<f32>; STRIP], r: &Reg) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        let (d, s) = (o.as_mut_ptr().cast::<f32>(), r.0.as_ptr());
        // SAFETY: `o` holds STRIP floats starting at a 64-byte-aligned address (the caller
        // streams only into outputs whose start is 64-byte aligned, and strips are 256 bytes
        // apart), `r` is 64-byte aligned by its type, every access is within the STRIP floats,
        // and the 512/256-bit forms are only instantiated in functions compiled for (and
        // dispatched to on) CPUs with AVX-512F / AVX (see `eval_range`); SSE is baseline.
        unsafe {
            match W {
                512 => {
                    for i in (0..STRIP).step_by(16) {
                        _mm512_stream_ps(d.add(i), _mm512_load_ps(s.add(i)));
                    }
                }
                256 => {
                    for i in (0..STRIP).step_by(8) {
                        _mm256_stream_ps(d.add(i), _mm256_load_ps(s.add(i)));
                    }
                }
                _ => {
                    for i in (0..STRIP).step_by(4) {
                        _mm_stream_ps(d.add(i), _mm_load_ps(s.add(i)));
                    }
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (o, &v) in o.iter_mut().zip(&r.0) {
        o.write(v);
    }
}

/// How far ahead of the strip being computed the inputs read in place are prefetched
/// (elements). Measured on seed 003's expressions in a standalone copy of this evaluator
/// (session 22): two strips ahead made the two-input `relu(x + 2 * y)` as fast as a
/// hand-written loop of the same expression (~10-15% faster than without), and one input
/// ~10% faster; 4 KiB ahead was no better.
const PREFETCH_AHEAD: usize = 2 * STRIP;

/// Asks for the cache lines of the strip at `p` (a hint: an address past an input's end, or
/// invalid, is harmless; nothing is read).
#[inline(always)]
fn prefetch_strip(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    for l in (0..STRIP).step_by(16) {
        // SAFETY: a prefetch never faults and reads nothing the program sees
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(l).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Evaluates output elements `start..start + out.len()` into `out`: in one span when every
/// input is read in place or is a constant, else block by block with the strided inputs
/// gathered per block; within a span, strip by strip every step's kernel runs over registers
/// and the last writes the output strip (`stream`: through a register and non-temporal
/// stores).
#[inline(always)]
fn eval_range_body<const W: usize>(
    prog: &Program,
    access: &[Access<'_>],
    start: usize,
    out: &mut [MaybeUninit<f32>],
    stream: bool,
) {
    if let Some(c) = prog.constant {
        out.fill(MaybeUninit::new(c));
        return;
    }
    let n_in = access.len();
    let mut regs = vec![Reg([0.0; STRIP]); prog.steps.len()];
    let mut scratch = Scratch {
        regs: regs.as_mut_ptr().cast::<f32>(),
        tails: vec![Reg([0.0; STRIP]); n_in],
        spill: Reg([0.0; STRIP]),
    };
    // the inputs read in place (prefetched ahead of the strip that reads them)
    let in_place: SmallVec<[bool; 8]> = access.iter().map(|a| matches!(a, Access::Contiguous(_))).collect();
    if !access.iter().any(|a| matches!(a, Access::Strided { .. })) {
        // every input is read in place or is a constant: one span over the whole range
        let len = out.len();
        let mem: SmallVec<[&[f32]; 8]> = access
            .iter()
            .map(|a| match a {
                Access::Contiguous(d) => &d[start..start + len],
                _ => &[][..],
            })
            .collect();
        eval_span::<W>(prog, &mem, &in_place, out, &mut scratch, stream);
    } else {
        // strided inputs are gathered one block at a time
        let mut gathered = vec![0f32; n_in * BLOCK];
        for (b, out_b) in out.chunks_mut(BLOCK).enumerate() {
            let (s, len) = (start + b * BLOCK, out_b.len());
            for (i, a) in access.iter().enumerate() {
                if let Access::Strided { data, layout } = a {
                    gather(data, layout, s, &mut gathered[i * BLOCK..i * BLOCK + len]);
                }
            }
            let mem: SmallVec<[&[f32]; 8]> = access
                .iter()
                .enumerate()
                .map(|(i, a)| match a {
                    Access::Contiguous(d) => &d[s..s + len],
                    Access::Strided { .. } => &gathered[i * BLOCK..i * BLOCK + len],
                    Access::Splat(_) => &[][..],
                })
                .collect();
            eval_span::<W>(prog, &mem, &in_place, out_b, &mut scratch, stream);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if stream {
        // non-temporal stores are weakly ordered: fence them before the task completes
        // SAFETY: `sfence` has no preconditions (SSE is part of x86-64's baseline).
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

/// The evaluator's working memory for one task: a register per step (`regs`, `STRIP` floats
/// each), a zero-padded register per input for the last partial strip, and the register the
/// last step writes when the output is streamed.
struct Scratch {
    regs: *mut f32,
    tails: Vec<Reg>,
    spill: Reg,
}

/// Runs `prog` over `out`, whose element `j` reads element `j` of each `mem[i]` (each at least
/// `out.len()` long, or empty for an input decoded as a constant): strip by strip, the inputs
/// marked `in_place` prefetched ahead, then the last partial strip through padded registers.
#[inline(always)]
fn eval_span<const W: usize>(
    prog: &Program,
    mem: &[&[f32]],
    in_place: &[bool],
    out: &mut [MaybeUninit<f32>],
    scratch: &mut Scratch,
    stream: bool,
) {
    let ptrs: SmallVec<[*const f32; 8]> = mem.iter().map(|m| m.as_ptr()).collect();
    let ahead: SmallVec<[*const f32; 8]> =
        ptrs.iter().zip(in_place).filter(|(_, &p)| p).map(|(m, _)| m.wrapping_add(PREFETCH_AHEAD)).collect();
    let full = out.len() / STRIP * STRIP;
    let (body, tail) = out.split_at_mut(full);
    let (regs, spill) = (scratch.regs, &mut scratch.spill);
    for (k, o) in body.chunks_exact_mut(STRIP).enumerate() {
        for &p in &ahead {
            prefetch_strip(p.wrapping_add(k * STRIP));
        }
        // SAFETY: every input read from memory has at least `out.len()` >= (k + 1) * STRIP
        // values from `ptrs[i]` (inputs decoded as constants are never read), `regs` holds a
        // register per step, `o` and `spill` hold STRIP floats apart from them, and the
        // kernels were chosen for this CPU (`eval`)
        unsafe {
            if stream {
                run_strip(&prog.steps, &ptrs, k * STRIP, regs, spill.0.as_mut_ptr());
                if let Some(o) = o.first_chunk_mut::<STRIP>() {
                    stream_strip::<W>(o, spill);
                }
            } else {
                run_strip(&prog.steps, &ptrs, k * STRIP, regs, o.as_mut_ptr().cast());
            }
        }
    }
    if !tail.is_empty() {
        // the last partial strip: inputs copied into zero-padded registers (the padding
        // lanes are computed and dropped)
        let t = tail.len();
        for (r, m) in scratch.tails.iter_mut().zip(mem) {
            if let Some(m) = m.get(full..) {
                r.0[..m.len()].copy_from_slice(m);
                r.0[m.len()..].fill(0.0);
            }
        }
        let tptrs: SmallVec<[*const f32; 8]> = scratch.tails.iter().map(|r| r.0.as_ptr()).collect();
        // SAFETY: as above, with every input's strip in its padded tail register
        unsafe { run_strip(&prog.steps, &tptrs, 0, regs, spill.0.as_mut_ptr()) };
        for (o, &v) in tail.iter_mut().zip(&spill.0[..t]) {
            o.write(v);
        }
    }
}

/// [`eval_range_body`] compiled for `isa` (the one `prog`'s kernels were chosen for; the
/// dispatch is once per task, outside every loop).
fn eval_range(
    prog: &Program,
    isa: Isa,
    access: &[Access<'_>],
    start: usize,
    out: &mut [MaybeUninit<f32>],
    stream: bool,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            #[target_feature(enable = "avx512f,avx2,fma")]
            fn avx512(prog: &Program, access: &[Access<'_>], start: usize, out: &mut [MaybeUninit<f32>], stream: bool) {
                eval_range_body::<512>(prog, access, start, out, stream)
            }
            // SAFETY: `isa` was detected on this CPU (`Isa::detect`).
            unsafe { avx512(prog, access, start, out, stream) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            fn avx2(prog: &Program, access: &[Access<'_>], start: usize, out: &mut [MaybeUninit<f32>], stream: bool) {
                eval_range_body::<256>(prog, access, start, out, stream)
            }
            // SAFETY: as above, for AVX2 and FMA.
            unsafe { avx2(prog, access, start, out, stream) }
        }
        Isa::Base => eval_range_body::<128>(prog, access, start, out, stream),
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
        if !matches!(t.dtype(), DType::F32 | DType::Bool) {
            return Err(Error::dtype(
                OP,
                format!(
                    "input x{i} has dtype {}; fused groups compute in float32 and read bool masks as 1.0 / 0.0 only (leave other dtypes unfused)",
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
    // bool masks (a comparison whose value is also used outside the group) are read as
    // 1.0 / 0.0, PyTorch's promotion of bool where a float32 operand meets it
    let promoted: SmallVec<[Tensor; 4]> = inputs
        .iter()
        .map(|t| if t.dtype() == DType::Bool { crate::ops::kernel::cast(t, DType::F32) } else { Ok(t.clone()) })
        .collect::<Result<_>>()?;
    let mut guards = Vec::with_capacity(inputs.len());
    let mut layouts = Vec::with_capacity(inputs.len());
    for t in &promoted {
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
    let isa = Isa::detect();
    let prog = decode(expr, &access, isa)?;
    // not zero-filled: eval_range writes every element once
    let mut buf: Vec<f32> = crate::memory::alloc_uninit(OP, shape)?;
    let out = &mut buf.spare_capacity_mut()[..n];
    // streaming stores need 64-byte-aligned strips: the output's start (tasks, blocks and
    // strips are multiples of 64 bytes from it)
    let stream = cfg!(target_arch = "x86_64")
        && n.saturating_mul(4) >= STREAM_MIN_BYTES
        && (out.as_ptr() as usize).is_multiple_of(64);
    if n <= TASK {
        eval_range(&prog, isa, &access, 0, out, stream);
    } else {
        super::team::chunks_mut(out, TASK, |t, o| eval_range(&prog, isa, &access, t * TASK, o, stream));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    #[test]
    fn inputs_broadcast_from_one_value_are_folded_at_decode_time() {
        // x0 is one value broadcast over x1's 700 elements: decoded as a constant
        let s = Tensor::from_vec(vec![0.5f32], &[1]).unwrap();
        let x: Vec<f32> = (0..700).map(|i| i as f32 * 0.01 - 3.0).collect();
        let xt = Tensor::from_vec(x.clone(), &[700]).unwrap();
        // constant-and-strip operands both ways, a folded clamp, and a strip clamp
        let expr = "t0 = mul(x0, 4.0); t1 = sub(t0, x1); t2 = div(x1, t0); t3 = add(t1, t2); \
                    t4 = clamp(x0, 0.0, 0.25); t5 = mul(t3, t4); t6 = clamp(t5, -1.0, 1.0)";
        let got = values(&fused_elementwise(&[s.clone(), xt.clone()], expr).unwrap());
        let want: Vec<f32> = x.iter().map(|&v| (((2.0 - v) + v / 2.0) * 0.25).clamp(-1.0, 1.0)).collect();
        assert_eq!(got, want);
        // a result that is a constant (x1 only feeds a dead instruction): the output is filled
        let expr = "t0 = mul(x1, 3.0); t1 = add(x0, 1.0); t2 = mul(t1, t1)";
        let got = values(&fused_elementwise(&[s, xt], expr).unwrap());
        assert_eq!(got, vec![2.25f32; 700]);
    }

    #[test]
    fn every_length_around_the_strip_matches_the_ops_one_by_one() {
        for n in [1, STRIP - 1, STRIP, STRIP + 1, 2 * STRIP + 7, BLOCK + 3] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
            let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 2.0).collect();
            let (xt, yt) = (Tensor::from_vec(x.clone(), &[n]).unwrap(), Tensor::from_vec(y.clone(), &[n]).unwrap());
            let got = values(
                &fused_elementwise(&[xt, yt], "t0 = mul(x1, 2.0); t1 = add(x0, t0); t2 = maximum(t1, x1)").unwrap(),
            );
            let want: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| (a + b * 2.0).max(b)).collect();
            assert_eq!(got, want, "n = {n}");
        }
    }
}
