//! Shared building blocks for Berth model-family plugins: weight loading, KV cache, transformer
//! blocks.
//!
//! - [`weights`]: GGUF / safetensors tensors as zero-copy [`weights::Matrix`]es, names both ways.
//! - [`mxfp4`]: HF MXFP4 expert tensors (`*_blocks` / `*_scales`) repacked as GGUF MXFP4 matrices.
//! - [`linear`]: batched, threaded matrix products over any weight type.
//! - [`ops`]: f32 RMS norm, activations, softmax, RoPE, softcap (re-exported from `berth_kernels`).
//! - [`kv`]: the per-sequence KV cache.
//! - [`state`]: per-sequence convolution and recurrent state, with snapshots for rewinds.
//! - [`recurrent`]: the recurrent mixers (LFM2's short convolution, Qwen3.5's gated delta-net).
//! - [`layers`]: the mixers and feed-forwards a layer is made of, with their shape checks.
//! - [`decoder`]: a generic pre-norm transformer decoder running multi-sequence batches.
//! - [`embedding`]: sentence-transformers heads (pooling, dense, normalise) of embedding models.
//! - [`family`]: what every family plugin shares: weight files, configs, special tokens, the
//!   plugin `Model` over the decoder ([`DecoderModel`]).
//! - [`testing`]: checks every family runs in its tests (reference logits, batching, fork,
//!   rewind).
//! - [`npy`]: `.npy` / `.npz` readers for reference comparisons.
//! - [`vision`]: vision towers (SigLIP, SigLIP2 NaViT) and multimodal projectors (LFM2-VL).
//! - [`vl`]: the vision-language model over any tower ([`vl::VisionLanguageModel`]), with the
//!   one rule for pending image features.

#![warn(missing_docs)]

pub mod decoder;
pub mod embedding;
pub mod family;
pub mod kv;
pub mod layers;
pub mod linear;
pub mod mxfp4;
pub mod npy;
pub mod ops;
pub mod pack_cache;
pub mod recurrent;
pub mod state;
pub mod testing;
pub mod vision;
pub mod vl;
pub mod weights;

pub use decoder::{
    Activation, AttnShape, AttnWeights, Decoder, DecoderConfig, DecoderWeights, DenseMoe, Ffn, FfnBias,
    GatedDeltaNet, GatedFfn, KvSource, LayerWeights, Mixer, MoeBiases, MoeConfig, Ple, PleLayer,
    RouterScoring, SharedExpert, ShortConv,
};
pub use family::DecoderModel;
pub use kv::KvCache;
pub use ops::Yarn;
pub use vl::{VisionLanguageModel, VisionTower};
pub use weights::{HfNames, Matrix, Role, TensorId, WeightFormat, Weights};
