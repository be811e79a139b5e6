//! The ONNX protobuf schema as Rust types.
//!
//! `onnx.proto` is copied from the `onnx` Python package (ONNX Project Contributors,
//! Apache-2.0, see the SPDX line at its top); `onnx.rs` is generated from it by
//! `scripts/onnx/gen_proto.sh` (prost-build + protox, so no `protoc` is needed at build time).
//! Decoding is prost's: no hand-written wire parser.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!("onnx.rs");
