//! The shape and switches of a decoder: what a family's config maps to.

use crate::ops::Yarn;
use berth_kernels::layer::{Activation, MoeConfig, RmsNorm};

/// Shape and switches of a decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// Number of layers.
    pub n_layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA).
    pub n_kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Norm weights are applied as `1 + w` (Gemma safetensors; GGUF has the 1 folded in).
    pub norm_add_one: bool,
    /// q/k/v projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head q/k RMSNorm before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norms on the attention and FFN outputs before the residual add (Gemma).
    pub post_norms: bool,
    /// FFN activation.
    pub activation: Activation,
    /// Multiplier of q·k (default `head_dim^-0.5`).
    pub attn_scale: f32,
    /// Sliding-window size per layer (`None` = full causal attention). With `bidirectional`, a
    /// position sees the positions less than this far from it on either side.
    pub sliding_window: Vec<Option<usize>>,
    /// Every position attends to every position of its sequence, later ones too (an encoder:
    /// EmbeddingGemma's `use_bidirectional_attention`). Such a model only embeds whole sequences
    /// ([`super::Decoder::embed_states`]); decoding it is refused.
    pub bidirectional: bool,
    /// RoPE base per layer.
    pub rope_base: Vec<f32>,
    /// Rotated dimensions per head (default `head_dim`).
    pub rope_dim: usize,
    /// NeoX (rotate_half) RoPE layout rather than interleaved pairs.
    pub rope_neox: bool,
    /// Multiplier of the token embeddings (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Final logit soft-capping.
    pub final_softcap: Option<f32>,
    /// Soft-capping of the attention scores (`cap · tanh(s / cap)` after scaling; Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Linear RoPE scaling factor per layer: frequencies are divided by it (default 1).
    pub rope_scale: Vec<f32>,
    /// YaRN scaling of every layer's RoPE (gpt-oss); replaces `rope_scale` and `rope_f32`.
    pub rope_yarn: Option<Yarn>,
    /// Use the embedding matrix as the LM head even if an output tensor exists.
    pub tie_embeddings: bool,
    /// Routing of the mixture-of-experts FFNs ([`super::DecoderWeights::load`]: one in every layer).
    pub moe: Option<MoeConfig>,
    /// llama.cpp's default F16 KV cache: keys and values are rounded to f16 when stored. Set for
    /// GGUF models so that the numbers stay close to llama.cpp's.
    pub kv_f16: bool,
    /// ggml-cpu's RoPE angles: f32 running products and `cosf`/`sinf` ([`crate::ops::Rope::new_ggml`]).
    pub rope_f32: bool,
    /// With `rope_dim < head_dim`: pairs are `(j, j + rope_dim/2)` as in HF's partial rotary
    /// (Qwen3.5) rather than `(j, j + head_dim/2)`.
    pub rope_partial_pairs: bool,
    /// Recurrent layers keep a snapshot of their state every this many positions.
    pub snapshot_every: usize,
    /// Most snapshots kept per sequence (0: rewinds of recurrent layers only to 0).
    pub max_snapshots: usize,
    /// Bytes all sequences' snapshots may take together; fewer snapshots are kept per sequence
    /// when `max_snapshots` of every sequence would not fit (a large hybrid model's state is
    /// tens of megabytes per position).
    pub snapshot_budget: usize,
}

impl DecoderConfig {
    /// A Llama-style configuration (SiLU, NeoX RoPE base 10000, eps 1e-6, untied, no extras).
    pub fn new(n_layers: usize, hidden: usize, n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        DecoderConfig {
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            eps: 1e-6,
            norm_add_one: false,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: vec![None; n_layers],
            bidirectional: false,
            rope_base: vec![10000.0; n_layers],
            rope_dim: head_dim,
            rope_neox: true,
            embed_scale: None,
            final_softcap: None,
            attn_softcap: None,
            rope_scale: vec![1.0; n_layers],
            rope_yarn: None,
            tie_embeddings: false,
            moe: None,
            kv_f16: false,
            rope_f32: false,
            rope_partial_pairs: false,
            snapshot_every: 64,
            max_snapshots: 16,
            snapshot_budget: 1 << 30,
        }
    }

    /// Query width: `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Key/value width: `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

impl DecoderConfig {
    /// The RMS norm of weight `w` with this model's epsilon and weight convention.
    pub fn norm<'a>(&self, w: &'a [f32]) -> RmsNorm<'a> {
        RmsNorm {
            weight: w,
            eps: self.eps,
            add_one: self.norm_add_one,
        }
    }
}
