//! The op registry: the spine every layer of ferrofx reads.
//!
//! Each op is one [`OpDef`]: name, schema, meta inference, kernel, cost, effect, category and
//! backward formula. Public tensor functions, methods and operators all call [`dispatch`].

pub mod args;
mod def;
mod dispatch;
mod flop_counter;
mod registry;
pub mod schema;

pub use def::{
    cost_elementwise, cost_free, cost_memory, BackwardFn, Category, Cost, CostFn, Effect, KernelFn, MetaFn,
    MetaOutputs, OpDef, Outputs, Saves,
};
pub use dispatch::{call, dispatch, run_kernel, CallKind};
pub use flop_counter::FlopCounterMode;
pub use registry::{all_ops, lookup, register, require};
pub use schema::{bind, ArgSpec, ArgType, Default};
