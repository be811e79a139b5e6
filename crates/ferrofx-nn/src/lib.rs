//! # ferrofx-nn
//!
//! Modules, layers, losses, optimizers and datasets for ferrofx. So far: the embedded digits
//! data set ([`datasets::Digits`]).
#![warn(missing_docs)]

pub mod datasets;
