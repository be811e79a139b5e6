//! The parts of the op registry and dtype system the IR relies on.
//!
//! The IR needs only an op's name and purity (`OpDef::name`, `OpDef::is_pure`), a by-name
//! lookup, and a dtype with a PyTorch name. This module is the single place that binds them.
//!
//! Interim: ferrofx-core's registry is still being written, so this module carries a minimal
//! registry of the same shape (`&'static OpDef` with `name` and `is_pure()`, `lookup(name)`).
//! It is replaced by re-exports of `ferrofx_core::op::{OpDef, lookup}` and
//! `ferrofx_core::DType` as soon as that crate builds; the rest of the IR is written against
//! exactly that API.

use std::fmt;

/// An op of the registry (interim mirror of `ferrofx_core::op::OpDef`).
#[derive(Debug)]
pub struct OpDef {
    /// Stable name, as in PyTorch (`add`, `relu`).
    pub name: &'static str,
    pure: bool,
}

impl OpDef {
    /// `true` when the op has no side effect and no randomness (safe for DCE).
    pub fn is_pure(&self) -> bool {
        self.pure
    }
}

macro_rules! ops {
    ($($id:ident = $name:literal $pure:literal),* $(,)?) => {
        $(static $id: OpDef = OpDef { name: $name, pure: $pure };)*
        static ALL: &[&OpDef] = &[$(&$id),*];
    };
}

ops! {
    ADD = "add" true, SUB = "sub" true, MUL = "mul" true, DIV = "div" true, NEG = "neg" true,
    RELU = "relu" true, GELU = "gelu" true, BITWISE_AND = "bitwise_and" true,
    MATMUL = "matmul" true, LINEAR = "linear" true, SUM = "sum" true, RESHAPE = "reshape" true,
    GETITEM = "getitem" true, DROPOUT = "dropout" false, ADD_ = "add_" false,
    COPY_ = "copy_" false,
}

/// Looks an op up by name.
///
/// ```
/// let add = ferrofx_fx::core_api::lookup("add").unwrap();
/// assert_eq!(add.name, "add");
/// assert!(ferrofx_fx::core_api::lookup("no_such_op").is_none());
/// ```
pub fn lookup(name: &str) -> Option<&'static OpDef> {
    ALL.iter().copied().find(|op| op.name == name)
}

/// Element type of a tensor (interim mirror of `ferrofx_core::DType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `torch.bool`
    Bool,
    /// `torch.int64`
    I64,
    /// `torch.float32`
    F32,
    /// `torch.float64`
    F64,
}

impl DType {
    /// PyTorch's name without the `torch.` prefix (`float32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I64 => "int64",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
