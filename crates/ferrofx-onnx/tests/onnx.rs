//! The ferrofx-onnx test binary (one binary keeps the release build lean): ONNX's backend
//! suite, the real-model zoo, the round trip through export, corrupted files and a short importer fuzzing run.

#[path = "suite/backend.rs"]
mod backend;
#[path = "suite/common.rs"]
mod common;
#[path = "suite/corrupt.rs"]
mod corrupt;
#[path = "suite/dynamic.rs"]
mod dynamic;
#[path = "suite/export_ops.rs"]
mod export_ops;
#[path = "suite/fuzz.rs"]
mod fuzz;
#[path = "suite/mutate.rs"]
mod mutate;
#[path = "suite/zoo.rs"]
mod zoo;
