//! Data sets shipped inside the crate, and batch iteration.

mod batches;
mod digits;

pub use batches::Batches;
pub use digits::{Digits, Split};
