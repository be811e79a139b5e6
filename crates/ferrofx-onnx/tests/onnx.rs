//! The ferrofx-onnx test binary (one binary keeps the release build lean): ONNX's backend
//! suite, the real-model zoo, the round trip through export, and corrupted files.

#[path = "suite/backend.rs"]
mod backend;
#[path = "suite/common.rs"]
mod common;
#[path = "suite/corrupt.rs"]
mod corrupt;
#[path = "suite/zoo.rs"]
mod zoo;
