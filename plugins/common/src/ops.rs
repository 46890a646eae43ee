//! The f32 element-wise operations the decoder uses: RMS norm, activations, softmax, RoPE,
//! softcap, f16 rounding. The math lives in [`berth_kernels::ops`]; this module re-exports it so
//! family code can keep importing `berth_plugin_common::ops`.

pub use berth_kernels::ops::{
    gelu_tanh, gelu_tanh_f16, rms_norm, rms_norm_heads, round_f16, silu, softcap, softmax, GgmlRope, Rope,
    Yarn,
};
