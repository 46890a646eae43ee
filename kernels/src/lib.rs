//! CPU compute kernels for Berth.
//!
//! This crate holds everything numeric that a transformer forward pass needs on the CPU:
//! the GGML block formats and their (de)quantizers ([`quant`]), quantized dot products of
//! one weight row against activations quantized once per row ([`dot`]), multi-threaded
//! matrix-vector and matrix-matrix products over raw weight bytes ([`matmul`]) running on a
//! small persistent thread pool ([`pool`]), element-wise operations such as RMS norm,
//! softmax, activations and RoPE ([`ops`]), and grouped-query attention over an f32 KV cache
//! ([`attention`]). Every kernel has a portable scalar reference; on x86_64 the hot ones
//! also have AVX2+FMA versions picked at runtime by CPU-feature detection.
//! [`testutil`] has a tiny deterministic RNG and random-block generators for tests and
//! benchmarks.

#![warn(missing_docs)]

pub mod attention;
pub mod dot;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
/// Recurrent mixers of hybrid models: LFM2's short convolution and Qwen3.5's gated delta rule.
pub mod recurrent;
pub mod testutil;
