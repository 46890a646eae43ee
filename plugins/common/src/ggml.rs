//! Emulation of llama.cpp's (ggml-cpu's) float arithmetic: its f16 dot-product order, `expf` and
//! softmax. The math lives in [`berth_kernels::ggml`]; this module re-exports it.

pub use berth_kernels::ggml::{dot_f16, ggml_expf, hsum8, softmax_ggml, F16DotOrder};
