//! The Qwen plugin: Qwen2 / Qwen2.5 (q/k/v biases), Qwen3 (per-head q/k RMSNorm), Qwen3-MoE
//! (softmax router, top-k SwiGLU experts), and Qwen3.5 dense and MoE (gated delta-net layers
//! between gated full-attention layers, a shared expert), from llama.cpp GGUF files or HF
//! safetensors. This crate is the config and weight map; the runtime is `berth-plugin-common`.

#![warn(missing_docs)]

use berth_qwen3_family::qwen35;

use berth_plugin_api::{LoadConfig, PluginError};
use berth_plugin_common::family::{
    bad, chat_template, hf_config, model_type, template_has_tools, GgufKeys, HfConfig, Loaded, Specials,
};
use berth_plugin_common::{DecoderConfig, DecoderModel, DecoderWeights, MoeConfig, Weights};

/// Architectures served: GGUF `general.architecture` values and HF `model_type`s.
pub const ARCHITECTURES: [&str; 11] = [
    "qwen2",
    "qwen3",
    "qwen3moe",
    "qwen3_moe",
    "qwen3_moe_text",
    "qwen35",
    "qwen35moe",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

/// Special tokens looked up by text in the vocabulary and reported in the model info.
const SPECIAL_TOKENS: [&str; 6] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
];

/// Special tokens that end generation when present.
const STOP_TEXTS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// A loaded Qwen model.
pub type QwenModel = DecoderModel;

/// Which Qwen variant a model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Qwen2 / Qwen2.5: q/k/v biases.
    Qwen2,
    /// Qwen3: per-head q/k norms.
    Qwen3,
    /// Qwen3-MoE: q/k norms and routed experts.
    Qwen3Moe,
    /// Qwen3.5: gated delta-net and gated attention layers.
    Qwen35,
    /// Qwen3.5-MoE: Qwen3.5 with routed and shared experts.
    Qwen35Moe,
}

impl Variant {
    /// The variant for an architecture or model type name.
    pub fn from_arch(arch: &str) -> Option<Variant> {
        match arch.to_ascii_lowercase().as_str() {
            "qwen2" | "qwen2forcausallm" => Some(Variant::Qwen2),
            "qwen3" | "qwen3forcausallm" => Some(Variant::Qwen3),
            "qwen3moe" | "qwen3_moe" | "qwen3_moe_text" | "qwen3moeforcausallm" => Some(Variant::Qwen3Moe),
            "qwen35" | "qwen3_5" | "qwen3_5_text" | "qwen3_5forcausallm" => Some(Variant::Qwen35),
            "qwen35moe" | "qwen3_5_moe" | "qwen3_5_moe_text" | "qwen3_5moeforcausallm" => {
                Some(Variant::Qwen35Moe)
            }
            _ => None,
        }
    }

    /// The GGUF architecture name.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Variant::Qwen2 => "qwen2",
            Variant::Qwen3 => "qwen3",
            Variant::Qwen3Moe => "qwen3moe",
            Variant::Qwen35 => "qwen35",
            Variant::Qwen35Moe => "qwen35moe",
        }
    }

    fn is_qwen35(self) -> bool {
        matches!(self, Variant::Qwen35 | Variant::Qwen35Moe)
    }
}

berth_plugin_common::decoder_family!(
    QwenFamily,
    name: "qwen3",
    description: "Qwen2, Qwen2.5, Qwen3, Qwen3-MoE, Qwen3.5 and Qwen3.5-MoE text models (GGUF, safetensors)",
    architectures: ARCHITECTURES,
    knows: |a| Variant::from_arch(a).is_some(),
    gguf: load_gguf,
    safetensors: load_safetensors,
);

fn load_gguf(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let k = GgufKeys::new(&w).expect("opened as GGUF");
    let variant =
        Variant::from_arch(&k.arch).ok_or_else(|| bad(format!("unsupported architecture {:?}", k.arch)))?;
    let mut cfg = k.decoder_config()?;
    apply_variant(&mut cfg, variant, false);
    if matches!(variant, Variant::Qwen3Moe | Variant::Qwen35Moe) {
        cfg.moe = Some(MoeConfig::softmax(
            k.req("expert_count")?,
            k.req("expert_used_count")?,
            k.flag("expert_weights_norm").unwrap_or(true),
        ));
    }
    let weights = if variant.is_qwen35() {
        qwen35::load_gguf(&w, &mut cfg, &k)?
    } else {
        DecoderWeights::load(&w, &cfg)?
    };
    let template = chat_template(&w, &config.pack_dir);
    Ok(Loaded {
        architecture: variant.gguf_arch().into(),
        cfg,
        weights,
        context_length: k.context_length(),
        specials: Specials::from_gguf(&w, &SPECIAL_TOKENS, &STOP_TEXTS),
        tools: template_has_tools(template.as_deref()),
    })
}

/// Sets the switches that distinguish the Qwen variants.
fn apply_variant(cfg: &mut DecoderConfig, variant: Variant, attention_bias: bool) {
    cfg.rope_neox = true;
    cfg.qkv_bias = variant == Variant::Qwen2 || attention_bias;
    cfg.qk_norm = variant != Variant::Qwen2;
}

fn load_safetensors(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let dir = &config.pack_dir;
    let c = hf_config(dir)?;
    let model_type = model_type(&c, config);
    let variant = Variant::from_arch(model_type)
        .ok_or_else(|| bad(format!("unsupported model_type {model_type:?}")))?;
    let hc = HfConfig(&c);
    let mut cfg = hc.decoder_config()?;
    apply_variant(&mut cfg, variant, hc.flag("attention_bias").unwrap_or(false));
    if let Some(types) = hc.strings("layer_types") {
        let window = hc.num("sliding_window");
        for (i, t) in types.iter().enumerate().take(cfg.n_layers) {
            if t == "sliding_attention" {
                cfg.sliding_window[i] = window;
            }
        }
    }
    if variant == Variant::Qwen3Moe
        && (hc.strings("mlp_only_layers").is_some_and(|a| !a.is_empty())
            || hc.num("decoder_sparse_step").is_some_and(|s| s != 1))
    {
        return Err(bad(
            "Qwen3-MoE with dense layers (mlp_only_layers / decoder_sparse_step) is not supported",
        ));
    }
    if matches!(variant, Variant::Qwen3Moe | Variant::Qwen35Moe) {
        cfg.moe = Some(MoeConfig::softmax(
            hc.num("num_experts")
                .or(hc.num("num_local_experts"))
                .ok_or_else(|| bad("config.json: missing num_experts"))?,
            hc.req("num_experts_per_tok")?,
            hc.flag("norm_topk_prob").unwrap_or(variant == Variant::Qwen35Moe),
        ));
    }
    let weights = if variant.is_qwen35() {
        qwen35::load_hf(&w, &mut cfg, &hc)?
    } else {
        DecoderWeights::load(&w, &cfg)?
    };
    let template = chat_template(&w, dir);
    Ok(Loaded {
        architecture: variant.gguf_arch().into(),
        cfg,
        weights,
        context_length: hc.num("max_position_embeddings").unwrap_or(32768) as u32,
        specials: Specials::from_hf(dir, &c, &SPECIAL_TOKENS, &STOP_TEXTS)?,
        tools: template_has_tools(template.as_deref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_accepts_supported_architectures_only() {
        berth_plugin_common::testing::check_probe::<QwenFamily>(
            "qwen3",
            &[
                "qwen2",
                "qwen3",
                "qwen3moe",
                "qwen3_moe",
                "qwen35",
                "qwen3_5_text",
                "qwen3_5_moe_text",
            ],
        );
    }
}
