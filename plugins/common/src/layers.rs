//! The building blocks of a decoder layer: token mixers (attention, LFM2's short convolution,
//! Qwen3.5's gated delta-net), feed-forwards (dense, MoE, Gemma 4's dense + routed block) and
//! their settings: the weights a family maps. They depend on no decoder code; the decoder checks
//! their shapes against its config when it assembles them.

use crate::ops::Rope;
use crate::weights::Matrix;

/// The settings of the gated activation and of expert routing; their arithmetic is in
/// [`berth_kernels::layer`].
pub use berth_kernels::layer::{Activation, MoeConfig, RouterScoring};

/// One expert's (or a dense layer's) gated FFN.
#[derive(Clone, Debug)]
pub struct GatedFfn {
    /// Gate projection (`ffn × hidden`).
    pub gate: Matrix,
    /// Up projection (`ffn × hidden`).
    pub up: Matrix,
    /// Down projection (`hidden × ffn`).
    pub down: Matrix,
}

/// Biases of a gated FFN's projections (gpt-oss's experts).
#[derive(Clone, Debug)]
pub struct FfnBias {
    /// Added to the gate projection (`ffn`).
    pub gate: Vec<f32>,
    /// Added to the up projection (`ffn`).
    pub up: Vec<f32>,
    /// Added to the down projection (`hidden`).
    pub down: Vec<f32>,
}

/// The biases of a MoE block with biased linear layers (gpt-oss).
#[derive(Clone, Debug)]
pub struct MoeBiases {
    /// Added to the router's logits (`n_experts`).
    pub router: Vec<f32>,
    /// Each expert's projection biases.
    pub experts: Vec<FfnBias>,
}

/// A shared expert that every token goes through beside the routed ones (Qwen3.5-MoE).
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// The expert's FFN.
    pub ffn: GatedFfn,
    /// Optional `1 × hidden` gate: the expert's output is scaled by `sigmoid(gate · x)`.
    pub gate: Option<Matrix>,
}

/// A layer's feed-forward block.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// One gated FFN.
    Dense(GatedFfn),
    /// A router over experts, top-k ([`MoeConfig`] says how scores are formed).
    Moe {
        /// Router (`n_experts × hidden`).
        router: Matrix,
        /// The experts.
        experts: Vec<GatedFfn>,
        /// Per-expert bias added to the scores for selection only (LFM2-MoE `expert_bias`).
        selection_bias: Option<Vec<f32>>,
        /// Shared expert, if the model has one.
        shared: Option<SharedExpert>,
        /// The router's and the experts' biases (gpt-oss).
        biases: Option<Box<MoeBiases>>,
    },
    /// A dense FFN and routed experts side by side, each with its own norms (Gemma 4).
    DenseMoe(Box<DenseMoe>),
}

/// Gemma 4's feed-forward: `post_dense(dense(xn)) + post_experts(experts(pre_experts(x)))`, where
/// `xn` is the layer's FFN-normed input and `x` the residual; the router reads
/// `rms(x) · router_scale / sqrt(hidden)` and [`crate::decoder::DecoderConfig::moe`] says how it picks experts.
#[derive(Clone, Debug)]
pub struct DenseMoe {
    /// The dense FFN on the normed input.
    pub dense: GatedFfn,
    /// Norm of the dense FFN's output (`post_feedforward_layernorm_1`).
    pub post_dense_norm: Vec<f32>,
    /// Router (`n_experts × hidden`).
    pub router: Matrix,
    /// Multiplier of the router's input (`hidden`), after a weightless RMS norm.
    pub router_scale: Vec<f32>,
    /// Multiplier of each expert's routing weight.
    pub expert_scale: Vec<f32>,
    /// The experts.
    pub experts: Vec<GatedFfn>,
    /// Norm of the experts' input (`pre_feedforward_layernorm_2`).
    pub pre_experts_norm: Vec<f32>,
    /// Norm of the experts' weighted sum (`post_feedforward_layernorm_2`).
    pub post_experts_norm: Vec<f32>,
}

/// LFM2's gated short convolution: `out_proj(C · conv(B · x))` with `B, C, x = in_proj(h)`.
#[derive(Clone, Debug)]
pub struct ShortConv {
    /// `3·hidden × hidden`: B, C and x, in that order.
    pub in_proj: Matrix,
    /// Depthwise taps, `hidden × kernel` (tap `kernel-1` multiplies the newest input).
    pub conv: Vec<f32>,
    /// Kernel width (`conv_L_cache`).
    pub kernel: usize,
    /// `hidden × hidden`.
    pub out_proj: Matrix,
}

/// Qwen3.5's gated delta-net (linear attention with a recurrent matrix state per head).
#[derive(Clone, Debug)]
pub struct GatedDeltaNet {
    /// `2·key_dim + value_dim` rows: q, k and v before the convolution.
    pub in_qkv: Matrix,
    /// `value_dim` rows: the output gate z.
    pub in_z: Matrix,
    /// `v_heads` rows: beta logits.
    pub in_b: Matrix,
    /// `v_heads` rows: decay input.
    pub in_a: Matrix,
    /// Depthwise taps over the q/k/v channels, `channels × kernel`.
    pub conv: Vec<f32>,
    /// Kernel width.
    pub kernel: usize,
    /// `-exp(A_log)` per value head.
    pub neg_a: Vec<f32>,
    /// `dt_bias` per value head.
    pub dt_bias: Vec<f32>,
    /// Gated RMSNorm weight over one value head (plain `w`).
    pub norm: Vec<f32>,
    /// `hidden × value_dim`.
    pub out_proj: Matrix,
    /// Key heads.
    pub k_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub v_heads: usize,
    /// Key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
    /// Value heads are tiled over the key heads (value head `h` reads key head `h % k_heads`,
    /// llama.cpp's GGUF order) rather than grouped (`h / (v_heads / k_heads)`, HF's order).
    pub tiled: bool,
}

impl GatedDeltaNet {
    /// Channels through the convolution: `2·k_heads·dk + v_heads·dv`.
    pub fn conv_channels(&self) -> usize {
        2 * self.k_heads * self.dk + self.v_heads * self.dv
    }

    /// The key head value head `hv` reads.
    pub fn key_head(&self, hv: usize) -> usize {
        if self.tiled {
            hv % self.k_heads
        } else {
            hv / (self.v_heads / self.k_heads)
        }
    }

    /// Floats of one sequence's recurrent state (`v_heads × dk × dv`).
    pub fn state_len(&self) -> usize {
        self.v_heads * self.dk * self.dv
    }
}

/// Softmax attention weights: every variant the families use (q/k/v biases, q/k norms, a
/// gated output, a weightless value norm, a geometry of its own, keys and values shared with an
/// earlier layer).
#[derive(Clone, Debug)]
pub struct AttnWeights {
    /// Query projection (with `gated`: `2·q_dim` rows, each head's query then its gate).
    pub wq: Matrix,
    /// Output projection.
    pub wo: Matrix,
    /// Output projection bias (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// Per query head, a learned sink logit in the softmax (gpt-oss; see
    /// [`berth_kernels::attention::HeadOpts::sink`]).
    pub sinks: Option<Vec<f32>>,
    /// Query bias.
    pub bq: Option<Vec<f32>>,
    /// Per-head query norm.
    pub q_norm: Option<Vec<f32>>,
    /// Keys and values.
    pub kv: KvSource,
    /// The output is multiplied by `sigmoid(gate)` from the query projection (Qwen3.5).
    pub gated: bool,
    /// RMS norm without a weight over each value head before caching (Gemma 4).
    pub v_norm: bool,
    /// Head size, KV heads and RoPE of this layer when they are not the config's (Gemma 4).
    pub shape: Option<AttnShape>,
}

impl AttnWeights {
    /// Plain attention with the config's geometry: no biases, norms or gate.
    pub fn new(wq: Matrix, wk: Matrix, wv: Matrix, wo: Matrix) -> AttnWeights {
        AttnWeights {
            wq,
            wo,
            bo: None,
            sinks: None,
            bq: None,
            q_norm: None,
            kv: KvSource::Own {
                wk,
                wv: Some(wv),
                bk: None,
                bv: None,
                k_norm: None,
            },
            gated: false,
            v_norm: false,
            shape: None,
        }
    }

    /// Adds per-head q and k norms (on a layer with its own keys).
    pub fn with_qk_norms(mut self, q: Vec<f32>, k: Vec<f32>) -> AttnWeights {
        self.q_norm = Some(q);
        if let KvSource::Own { k_norm, .. } = &mut self.kv {
            *k_norm = Some(k);
        }
        self
    }
}

/// An attention layer's own geometry.
#[derive(Clone, Debug)]
pub struct AttnShape {
    /// Dimension per head.
    pub head_dim: usize,
    /// Key/value heads (of the source layer's cache when shared).
    pub n_kv_heads: usize,
    /// RoPE of this layer.
    pub rope: Rope,
}

/// Where an attention layer's keys and values come from.
#[derive(Clone, Debug)]
pub enum KvSource {
    /// The layer projects its own into its own cache.
    Own {
        /// Key projection.
        wk: Matrix,
        /// Value projection; `None`: the values are the keys before the key norm (Gemma 4's
        /// `attention_k_eq_v`).
        wv: Option<Matrix>,
        /// Key bias.
        bk: Option<Vec<f32>>,
        /// Value bias.
        bv: Option<Vec<f32>>,
        /// Per-head key norm.
        k_norm: Option<Vec<f32>>,
    },
    /// The layer attends to this earlier layer's cache and keeps none (Gemma 4's KV sharing).
    Shared(usize),
}

/// A layer's token mixer.
#[derive(Clone, Debug)]
pub enum Mixer {
    /// Softmax attention over the KV cache.
    Attention(Box<AttnWeights>),
    /// LFM2's gated short convolution (a convolution window per sequence).
    ShortConv(ShortConv),
    /// Qwen3.5's gated delta-net (a convolution window and a matrix state per sequence).
    GatedDeltaNet(Box<GatedDeltaNet>),
}

impl Mixer {
    /// The attention weights, if this is an attention layer.
    pub fn attention(&self) -> Option<&AttnWeights> {
        match self {
            Mixer::Attention(a) => Some(&**a),
            _ => None,
        }
    }

    /// The attention weights, mutably.
    pub fn attention_mut(&mut self) -> Option<&mut AttnWeights> {
        match self {
            Mixer::Attention(a) => Some(&mut **a),
            _ => None,
        }
    }
}

/// Weights of one decoder layer: a norm, a mixer, a norm and a feed-forward.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// Pre-mixer norm.
    pub attn_norm: Vec<f32>,
    /// Token mixer.
    pub mixer: Mixer,
    /// Norm of the mixer output (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    /// Pre-FFN norm.
    pub ffn_norm: Vec<f32>,
    /// Norm of the FFN output (Gemma).
    pub post_ffw_norm: Option<Vec<f32>>,
    /// Feed-forward block.
    pub ffn: Ffn,
}

/// Per-layer embeddings (Gemma 4's PLE): each token gets a `dim`-sized input per layer,
/// `(norm(projection(e) / sqrt(hidden)) + embed(token) · embed_scale) / sqrt(2)` with `e` the
/// scaled token embedding, and after its feed-forward layer `l` adds
/// `post_norm(proj(act(gate(x)) · input_l))`.
#[derive(Clone, Debug)]
pub struct Ple {
    /// Dimension per layer.
    pub dim: usize,
    /// Per-layer embedding table (`vocab × n_layers·dim`).
    pub embed: Matrix,
    /// Multiplier of its rows (`sqrt(dim)`, in the weight dtype).
    pub embed_scale: f32,
    /// Projection of the token embedding (`n_layers·dim × hidden`).
    pub projection: Matrix,
    /// Norm of each layer's slice of the projection (`dim`).
    pub norm: Vec<f32>,
    /// What each layer does with its input.
    pub layers: Vec<PleLayer>,
}

/// One layer's use of its per-layer input.
#[derive(Clone, Debug)]
pub struct PleLayer {
    /// Gate (`dim × hidden`).
    pub gate: Matrix,
    /// Projection back to the hidden size (`hidden × dim`).
    pub proj: Matrix,
    /// Norm of the projection's output.
    pub post_norm: Vec<f32>,
}
