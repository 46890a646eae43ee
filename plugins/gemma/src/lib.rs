//! The Gemma plugin: Gemma 3 text models (llama.cpp GGUF or HF safetensors) and Gemma 4 text
//! models (HF safetensors: per-layer embeddings, KV sharing, proportional RoPE, MoE; see
//! [`gemma4`]). This crate is the config and weight map; the runtime is `berth-plugin-common`.

#![warn(missing_docs)]

pub mod gemma4;

use berth_kernels::quant::WeightType;
use berth_plugin_api::{LoadConfig, PluginError};
use berth_plugin_common::family::{
    bad, chat_template, hf_config, model_type, template_has_tools, HfConfig, Loaded, Specials,
};
use berth_plugin_common::{
    Activation, DecoderConfig, DecoderModel, DecoderWeights, HfNames, Role, TensorId, Weights,
};
use serde_json::Value;

/// Architectures served: GGUF `general.architecture` values and HF `model_type`s.
pub const ARCHITECTURES: [&str; 4] = ["gemma3", "gemma4", "gemma3_text", "gemma4_text"];

/// Special tokens looked up by text in the vocabulary and reported in the model info.
const SPECIAL_TOKENS: [&str; 7] = [
    "<start_of_turn>",
    "<end_of_turn>",
    "<|turn>",
    "<turn|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
];

/// Special tokens that end generation when present (besides `<eos>`).
const STOP_TEXTS: [&str; 3] = ["<end_of_turn>", "<turn|>", "<|tool_response>"];

/// Gemma 3's sliding-window pattern when the file does not say: 5 local layers, then 1 global.
const GEMMA3_PATTERN: usize = 6;

/// Gemma 3's local-layer RoPE base when the file does not say.
const GEMMA3_LOCAL_BASE: f32 = 10000.0;

/// A loaded Gemma model.
pub type GemmaModel = DecoderModel;

/// Which Gemma generation a model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Gemma 3 (text).
    Gemma3,
    /// Gemma 4 (text).
    Gemma4,
}

impl Variant {
    /// The variant for an architecture or model type name.
    pub fn from_arch(arch: &str) -> Option<Variant> {
        match arch.to_ascii_lowercase().as_str() {
            "gemma3" | "gemma3_text" | "gemma3forcausallm" | "gemma3forconditionalgeneration" => {
                Some(Variant::Gemma3)
            }
            "gemma4" | "gemma4_text" | "gemma4forcausallm" | "gemma4forconditionalgeneration" => {
                Some(Variant::Gemma4)
            }
            _ => None,
        }
    }

    /// The GGUF architecture name.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Variant::Gemma3 => "gemma3",
            Variant::Gemma4 => "gemma4",
        }
    }
}

berth_plugin_common::decoder_family!(
    GemmaFamily,
    name: "gemma",
    description: "Gemma 3 (GGUF, safetensors) and Gemma 4 (safetensors) text models",
    architectures: ARCHITECTURES,
    knows: |a| Variant::from_arch(a).is_some(),
    gguf: load_gguf,
    safetensors: load_safetensors,
);

/// `x` rounded to the precision of a weight type (transformers casts the embedding scale to the
/// weight dtype: in bf16, `sqrt(3072) = 55.4256` becomes 55.5).
pub fn round_to_dtype(x: f32, wtype: WeightType) -> f32 {
    let keep = match wtype {
        WeightType::BF16 => 7,
        WeightType::F16 => 10,
        _ => return x,
    };
    let drop = 23 - keep;
    let bits = x.to_bits();
    let half = 1u32 << (drop - 1);
    let odd = (bits >> drop) & 1;
    let rounded = bits.wrapping_add(half - 1 + odd) & !((1u32 << drop) - 1);
    f32::from_bits(rounded)
}

/// Sets the Gemma 3 switches shared by both file formats.
fn gemma3_switches(cfg: &mut DecoderConfig, gguf: bool) {
    cfg.norm_add_one = !gguf;
    cfg.qk_norm = true;
    cfg.post_norms = true;
    cfg.activation = Activation::GeluTanh;
    cfg.rope_neox = true;
    cfg.tie_embeddings = true;
}

fn load_gguf(w: Weights, _config: &LoadConfig) -> Result<Loaded, PluginError> {
    let g = w.gguf().expect("opened as GGUF");
    let arch = g.architecture().unwrap_or("").to_string();
    match Variant::from_arch(&arch) {
        Some(Variant::Gemma3) => {}
        Some(Variant::Gemma4) => {
            return Err(bad("Gemma 4 GGUF files are not supported yet (use safetensors)"))
        }
        None => return Err(bad(format!("unsupported architecture {arch:?}"))),
    }
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| g.get_u64(&key(k)).map(|v| v as usize);
    let req = |k: &str| get(k).ok_or_else(|| bad(format!("GGUF: missing {}", key(k))));
    let (n_layers, hidden, heads) = (
        req("block_count")?,
        req("embedding_length")?,
        req("attention.head_count")?,
    );
    let kv_heads = get("attention.head_count_kv").unwrap_or(heads);
    let head_dim = get("attention.key_length").unwrap_or(hidden / heads);
    let mut cfg = DecoderConfig::new(n_layers, hidden, heads, kv_heads, head_dim);
    gemma3_switches(&mut cfg, true);
    // Follow llama.cpp's numerics on its own files where they are observable (ggml-cpu, default
    // context: F16 KV cache; GEGLU through ggml's f16 GELU table).
    cfg.kv_f16 = true;
    cfg.rope_f32 = true;
    cfg.activation = Activation::GeluTanhF16;
    cfg.eps = g
        .get_f32(&key("attention.layer_norm_rms_epsilon"))
        .unwrap_or(1e-6);
    // llama.cpp's choice: the 27B (62 layers) scales queries by (hidden / heads)^-0.5, the others
    // by head_dim^-0.5 (query_pre_attn_scalar is not in the GGUF).
    let qpas = if n_layers == 62 { hidden / heads } else { head_dim };
    cfg.attn_scale = (qpas as f32).powf(-0.5);
    let window = get("attention.sliding_window");
    let global_base = g.get_f32(&key("rope.freq_base")).unwrap_or(1_000_000.0);
    let scale = match g.get_str(&key("rope.scaling.type")) {
        Some("linear") | None => g
            .get_f32(&key("rope.scaling.factor"))
            .filter(|&f| f > 0.0)
            .unwrap_or(1.0),
        Some("none") => 1.0,
        Some(t) => return Err(bad(format!("unsupported RoPE scaling {t:?}"))),
    };
    for i in 0..n_layers {
        if (i + 1) % GEMMA3_PATTERN != 0 {
            cfg.sliding_window[i] = window;
            cfg.rope_base[i] = GEMMA3_LOCAL_BASE;
        } else {
            cfg.rope_base[i] = global_base;
            cfg.rope_scale[i] = scale;
        }
    }
    cfg.final_softcap = g.get_f32(&key("final_logit_softcapping"));
    cfg.attn_softcap = g.get_f32(&key("attn_logit_softcapping"));
    // llama.cpp scales the embeddings by sqrtf(n_embd) in f32 (GGUF weights are not bf16).
    cfg.embed_scale = Some((hidden as f32).sqrt());
    let weights = DecoderWeights::load(&w, &cfg)?;
    Ok(Loaded {
        architecture: Variant::Gemma3.gguf_arch().into(),
        cfg,
        weights,
        context_length: get("context_length").unwrap_or(32768) as u32,
        specials: Specials::from_gguf(&w, &SPECIAL_TOKENS, &STOP_TEXTS),
        // Gemma 3's templates take no tools.
        tools: false,
    })
}

fn load_safetensors(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let dir = &config.pack_dir;
    let c = hf_config(dir)?;
    let model_type = model_type(&c, config);
    let variant = Variant::from_arch(model_type)
        .ok_or_else(|| bad(format!("unsupported model_type {model_type:?}")))?;
    let w = w.with_hf_names(HfNames::Sandwich);
    let hc = HfConfig(&c);
    let (cfg, weights) = match variant {
        Variant::Gemma3 => gemma3_safetensors(&hc, &w)?,
        Variant::Gemma4 => gemma4::load(&hc, &w)?,
    };
    let template = chat_template(&w, dir);
    Ok(Loaded {
        architecture: variant.gguf_arch().into(),
        cfg,
        weights,
        context_length: hc.num("max_position_embeddings").unwrap_or(32768) as u32,
        specials: Specials::from_hf(dir, &c, &SPECIAL_TOKENS, &STOP_TEXTS)?,
        tools: variant == Variant::Gemma4 && template_has_tools(template.as_deref()),
    })
}

/// RoPE settings of one layer type from an HF config.
#[derive(Clone, Debug, PartialEq)]
struct RopeParams {
    theta: f32,
    kind: String,
    factor: f32,
    partial: f32,
}

/// The RoPE parameters of a layer type (`full_attention` / `sliding_attention`) from
/// `rope_parameters` (per type or flat), falling back to `fallback_theta`.
fn rope_params(c: &Value, layer_type: &str, fallback_theta: f64) -> RopeParams {
    let rp = c.get("rope_parameters");
    let p = rp
        .and_then(|r| r.get(layer_type))
        .or_else(|| rp.filter(|r| r.get("rope_theta").is_some() && layer_type == "full_attention"))
        .or_else(|| c.get("rope_scaling").filter(|_| layer_type == "full_attention"));
    let f = |k: &str| p.and_then(|p| p.get(k)).and_then(Value::as_f64);
    let kind = p
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    RopeParams {
        theta: f("rope_theta").unwrap_or(fallback_theta) as f32,
        kind,
        factor: f("factor").unwrap_or(1.0) as f32,
        partial: f("partial_rotary_factor").unwrap_or(1.0) as f32,
    }
}

/// Whether each layer is a sliding-window layer: `layer_types`, else the pattern.
fn sliding_layers(c: &Value, n_layers: usize, default_pattern: usize) -> Vec<bool> {
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        if types.len() >= n_layers {
            return types[..n_layers]
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect();
        }
    }
    let pattern = ["sliding_window_pattern", "_sliding_window_pattern"]
        .iter()
        .find_map(|k| c.get(*k).and_then(Value::as_u64))
        .map_or(default_pattern, |p| p as usize)
        .max(1);
    (0..n_layers).map(|i| (i + 1) % pattern != 0).collect()
}

fn gemma3_safetensors(hc: &HfConfig, w: &Weights) -> Result<(DecoderConfig, DecoderWeights), PluginError> {
    let c = hc.0;
    let mut cfg = hc.decoder_config()?;
    let (n_layers, hidden, head_dim) = (cfg.n_layers, cfg.hidden, cfg.head_dim);
    gemma3_switches(&mut cfg, false);
    cfg.attn_scale = (hc.float("query_pre_attn_scalar").unwrap_or(head_dim as f64) as f32).powf(-0.5);
    cfg.final_softcap = hc.float("final_logit_softcapping").map(|v| v as f32);
    cfg.attn_softcap = hc.float("attn_logit_softcapping").map(|v| v as f32);
    let global = rope_params(c, "full_attention", hc.float("rope_theta").unwrap_or(1_000_000.0));
    let local = rope_params(
        c,
        "sliding_attention",
        hc.float("rope_local_base_freq")
            .unwrap_or(GEMMA3_LOCAL_BASE as f64),
    );
    let global_scale = match global.kind.as_str() {
        "default" => 1.0,
        "linear" => global.factor,
        k => return Err(bad(format!("config.json: unsupported RoPE type {k:?}"))),
    };
    let mut window = hc.num("sliding_window");
    if c.get("use_bidirectional_attention").and_then(Value::as_bool) == Some(true) {
        // EmbeddingGemma: an encoder. transformers' Gemma3TextConfig turns the window into
        // `sliding_window // 2 + 1` when attention is bidirectional, and a local layer's position
        // then sees those less than that far from it on either side.
        cfg.bidirectional = true;
        window = window.map(|w| w / 2 + 1);
    }
    for (i, sliding) in sliding_layers(c, n_layers, GEMMA3_PATTERN)
        .into_iter()
        .enumerate()
    {
        if sliding {
            // Local layers always use default RoPE.
            cfg.sliding_window[i] = window;
            cfg.rope_base[i] = local.theta;
        } else {
            cfg.rope_base[i] = global.theta;
            cfg.rope_scale[i] = global_scale;
        }
    }
    let embed_type = w.wtype(&TensorId::global(Role::TokenEmbd))?;
    cfg.embed_scale = Some(round_to_dtype((hidden as f32).sqrt(), embed_type));
    let dw = DecoderWeights::load(w, &cfg)?;
    Ok((cfg, dw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_accepts_supported_architectures_only() {
        berth_plugin_common::testing::check_probe::<GemmaFamily>(
            "gemma",
            &[
                "gemma3",
                "gemma4",
                "gemma3_text",
                "gemma4_text",
                "Gemma3ForCausalLM",
            ],
        );
    }

    #[test]
    fn embed_scale_rounds_to_the_weight_dtype() {
        assert_eq!(round_to_dtype(3072f32.sqrt(), WeightType::BF16), 55.5);
        assert_eq!(round_to_dtype(3072f32.sqrt(), WeightType::F32), 3072f32.sqrt());
        assert_eq!(round_to_dtype(4.0, WeightType::BF16), 4.0);
        assert_eq!(round_to_dtype(3072f32.sqrt(), WeightType::F16), 55.4375);
    }

    #[test]
    fn proportional_rope_rotates_a_quarter_with_full_head_dim_denominator() {
        let r = gemma4::proportional_rope(1e6, 32, 0.25, 1.0);
        assert_eq!(r.inv_freq.len(), 4);
        assert!((r.inv_freq[1] - 1e6f32.powf(-2.0 / 32.0)).abs() < 1e-7);
    }
}
