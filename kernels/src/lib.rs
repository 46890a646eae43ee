//! CPU compute kernels for Berth.
//!
//! This crate holds everything numeric that a transformer forward pass needs on the CPU:
//! the GGML block formats and their (de)quantizers ([`quant`]), quantized dot products of
//! one weight row against activations quantized once per row ([`dot`]), multi-threaded
//! matrix-vector and matrix-matrix products over raw weight bytes ([`matmul`]) running on a
//! small persistent thread pool ([`pool`]), element-wise operations such as RMS norm,
//! softmax, activations and RoPE ([`ops`]), one query head's attention over a KV cache
//! ([`attention`]), the emulation of llama.cpp's own float arithmetic that greedy parity needs
//! ([`ggml`]), the recurrent mixers of hybrid models ([`recurrent`]), and the primitives of vision
//! encoders: LayerNorm, exact GELU, masked bidirectional attention, antialiased resampling
//! ([`vision`]). Every kernel has a
//! portable scalar reference; on x86_64 the hot ones also have AVX2+FMA (some AVX-512) versions
//! picked at runtime by CPU-feature detection (`BERTH_FORCE_SCALAR=1` forces the scalar ones).
//! [`testutil`] has a tiny deterministic RNG and random-block generators for tests and
//! benchmarks.

#![warn(missing_docs)]

pub mod attention;
pub mod dot;
pub mod ggml;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
/// Recurrent mixers of hybrid models: LFM2's short convolution and Qwen3.5's gated delta rule.
pub mod recurrent;
pub mod testutil;
pub mod vision;
