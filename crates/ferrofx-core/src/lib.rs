//! # ferrofx-core
//!
//! The foundation of ferrofx: [`Tensor`] (strided views over shared, versioned storage), the op
//! registry ([`op`]) that every layer reads, the CPU kernels ([`ops`]), autograd
//! ([`autograd`]) and the tracing hook ([`trace`]).
//!
//! ```
//! use ferrofx_core::Tensor;
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
//! let y = x.reshape(&[3, 2]).unwrap();
//! assert_eq!(y.shape(), &[3, 2]);
//! ```
#![warn(missing_docs)]

pub mod atomic_file;
pub mod autograd;
pub mod dtype;
pub mod error;
pub mod layout;
pub mod memory;
pub mod op;
pub mod ops;
pub mod scalar;
pub mod storage;
pub mod tensor;
pub mod trace;
pub mod value;

pub use dtype::{promote_types, result_type, DType, Element, Operand};
pub use error::{Error, ErrorKind, Result};
pub use layout::{Layout, Shape};
pub use scalar::Scalar;
pub use storage::{CpuBuffer, Storage};
pub use tensor::{Tensor, TensorMeta};
pub use value::Value;
