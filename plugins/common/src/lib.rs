//! Shared building blocks for Berth model-family plugins: weight loading, KV cache, transformer
//! blocks.
//!
//! - [`weights`]: GGUF / safetensors tensors as zero-copy [`weights::Matrix`]es, names both ways.
//! - [`linear`]: batched, threaded matrix products over any weight type.
//! - [`ops`]: f32 RMS norm, activations, softmax, RoPE, softcap.
//! - [`kv`]: the per-sequence KV cache.
//! - [`decoder`]: a generic pre-norm transformer decoder running multi-sequence batches.
//! - [`npy`]: a float32 `.npy` reader for reference comparisons.
//! - [`ggml`]: emulation of llama.cpp's (ggml-cpu's) f16 attention arithmetic.

#![warn(missing_docs)]

pub mod decoder;
pub mod ggml;
pub mod kv;
pub mod linear;
pub mod npy;
pub mod ops;
pub mod weights;

pub use decoder::{Activation, Decoder, DecoderConfig, DecoderWeights, MoeConfig};
pub use kv::KvCache;
pub use weights::{HfNames, Matrix, Role, TensorId, WeightFormat, Weights};
