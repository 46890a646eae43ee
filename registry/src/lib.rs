//! Berth model packs and the store they live in.
//!
//! A pack is a directory holding a `pack.toml` manifest and the files it lists (GGUF or
//! safetensors weights, tokenizer, chat template). This crate reads the weight formats' metadata
//! without loading tensors ([`gguf`], [`safetensors`]), defines the manifest and pack references
//! ([`pack`]), manages the on-disk store under `$BERTH_HOME` with import, listing, verification
//! and removal ([`store`]), and formats sizes and ages for the CLI ([`format`](mod@format)).

#![warn(missing_docs)]

pub mod format;
pub mod gguf;
pub mod pack;
pub mod safetensors;
pub mod store;

#[cfg(test)]
#[allow(dead_code)]
mod testutil;

pub use gguf::{file_type_name, quant_mix, GgmlType, GgufError, GgufFile, GgufValue, TensorInfo};
pub use pack::{
    family_for_architecture, FileRole, PackFile, PackFormat, PackManifest, PackRef, KNOWN_FAMILIES,
};
pub use safetensors::{Dtype, SafetensorsFile, SafetensorsTensor};
pub use store::{ImportOptions, PackEntry, Store, StoreError};
