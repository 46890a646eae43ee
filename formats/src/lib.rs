//! Berth's weight-file readers, kept free of the network stack so plugins can link them.
//!
//! [`gguf`] reads a GGUF file's metadata and tensor table and maps its tensor data;
//! [`safetensors`] does the same for safetensors files. [`test_skip`] records tests skipped for a
//! missing input (a fetched model, `../shared`, a C compiler). `berth-registry` re-exports all of
//! them, so the host keeps its `berth_registry::gguf` paths.

#![warn(missing_docs)]

pub mod gguf;
pub mod safetensors;
pub mod test_skip;

#[cfg(any(test, feature = "testutil"))]
#[allow(dead_code, clippy::new_without_default)]
pub mod testutil;

pub use gguf::{file_type_name, quant_mix, GgmlType, GgufError, GgufFile, GgufValue, TensorInfo};
pub use safetensors::{Dtype, SafetensorsFile, SafetensorsTensor};
