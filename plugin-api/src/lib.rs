//! The Berth plugin boundary. A plugin is a `cdylib` that exports one versioned C entry point,
//! `berth_plugin_entry_v1`, returning a static table (manifest, probe, create); a created model
//! is an opaque handle plus a vtable (decode, force_token, thinking/tools, sequence management,
//! image preparation and encoding, embedding).
//!
//! - [`abi`]: the raw, frozen C ABI v1 (`#[repr(C)]` structs that only grow at their end).
//! - [`sdk`]: the safe traits plugin authors implement, and [`export_plugin!`], which wraps every
//!   entry in `catch_unwind` so a panic becomes an error and poisons the instance.
//! - [`client`]: the host's safe view of a plugin and its instances.
//! - [`types`]: safe types both sides share (manifests, load configs, errors, batches, images).

pub mod abi;
pub mod client;
pub mod sdk;
pub mod types;

pub use client::{AbiError, ModelInstance, Plugin};
pub use sdk::{Family, Model};
pub use types::{
    BatchView, EmbeddingSpec, ErrorKind, ImageInput, LoadConfig, LogitsOut, ModelDescription, PixelLayout,
    PluginError, PluginManifest, Pooling, PreparedImage, PreparedSlice, Rewind, RgbView, VisionSpec,
};
