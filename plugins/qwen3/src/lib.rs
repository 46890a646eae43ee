//! The Qwen plugin: Qwen2 / Qwen2.5 (q/k/v biases), Qwen3 (per-head q/k RMSNorm) and Qwen3-MoE
//! (softmax router, top-k SwiGLU experts), from llama.cpp GGUF files or HF safetensors, on the
//! generic decoder of `berth-plugin-common`.

#![warn(missing_docs)]

use berth_plugin_api::abi::CAP_TOOLS;
use berth_plugin_api::{
    BatchView, Family, LoadConfig, LogitsOut, Model, ModelDescription, PluginError, PluginManifest,
};
use berth_plugin_common::linear::resolve_threads;
use berth_plugin_common::{Decoder, DecoderConfig, DecoderWeights, MoeConfig, Weights};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// Architectures served: GGUF `general.architecture` values and HF `model_type`s.
pub const ARCHITECTURES: [&str; 5] = ["qwen2", "qwen3", "qwen3moe", "qwen3_moe", "qwen3_moe_text"];

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

/// The family type exported by this plugin.
pub struct QwenFamily;

/// Which Qwen variant a model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Qwen2 / Qwen2.5: q/k/v biases.
    Qwen2,
    /// Qwen3: per-head q/k norms.
    Qwen3,
    /// Qwen3-MoE: q/k norms and routed experts.
    Qwen3Moe,
}

impl Variant {
    /// The variant for an architecture or model type name.
    pub fn from_arch(arch: &str) -> Option<Variant> {
        match arch.to_ascii_lowercase().as_str() {
            "qwen2" | "qwen2forcausallm" => Some(Variant::Qwen2),
            "qwen3" | "qwen3forcausallm" => Some(Variant::Qwen3),
            "qwen3moe" | "qwen3_moe" | "qwen3_moe_text" | "qwen3moeforcausallm" => Some(Variant::Qwen3Moe),
            _ => None,
        }
    }

    /// The GGUF architecture name.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Variant::Qwen2 => "qwen2",
            Variant::Qwen3 => "qwen3",
            Variant::Qwen3Moe => "qwen3moe",
        }
    }
}

impl Family for QwenFamily {
    type Model = QwenModel;

    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "qwen3".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Qwen2, Qwen2.5, Qwen3 and Qwen3-MoE text models (GGUF, safetensors)".into(),
            families: vec!["qwen3".into()],
            architectures: ARCHITECTURES.iter().map(|s| s.to_string()).collect(),
            weight_formats: vec!["gguf".into(), "safetensors".into()],
            ..Default::default()
        }
    }

    fn probe(model_config: &Value) -> u32 {
        let family = model_config.get("family").and_then(Value::as_str);
        let arch = model_config.get("architecture").and_then(Value::as_str);
        match (family, arch) {
            (Some("qwen3"), Some(a)) if Variant::from_arch(a).is_some() => 100,
            _ => 0,
        }
    }

    fn create(config: &LoadConfig) -> Result<QwenModel, PluginError> {
        let loaded = if is_safetensors(config) {
            load_safetensors(config)?
        } else {
            load_gguf(config)?
        };
        QwenModel::new(loaded, config)
    }
}

fn is_safetensors(config: &LoadConfig) -> bool {
    match config.format.as_str() {
        "safetensors" => true,
        "gguf" => false,
        _ => config.weights.first().map_or(!has_gguf(&config.pack_dir), |p| {
            p.extension().is_some_and(|e| e == "safetensors")
        }),
    }
}

fn has_gguf(dir: &Path) -> bool {
    files_with_ext(dir, "gguf").is_ok_and(|v| !v.is_empty())
}

fn files_with_ext(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, PluginError> {
    let rd = std::fs::read_dir(dir).map_err(|e| PluginError::failed(format!("{}: {e}", dir.display())))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    Ok(v)
}

/// What loading produced, before the runtime state is built.
struct Loaded {
    variant: Variant,
    cfg: DecoderConfig,
    weights: DecoderWeights,
    context_length: u32,
    stop_tokens: Vec<i32>,
    special: Map<String, Value>,
    tools: bool,
}

fn bad(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg)
}

fn load_gguf(config: &LoadConfig) -> Result<Loaded, PluginError> {
    let path = match config.weights.first() {
        Some(p) => p.clone(),
        None => files_with_ext(&config.pack_dir, "gguf")?
            .into_iter()
            .next()
            .ok_or_else(|| bad(format!("no .gguf file in {}", config.pack_dir.display())))?,
    };
    let w = Weights::open_gguf(&path)?;
    let g = w.gguf().expect("opened as GGUF");
    let arch = g.architecture().unwrap_or("").to_string();
    let variant = Variant::from_arch(&arch)
        .ok_or_else(|| bad(format!("{}: unsupported architecture {arch:?}", path.display())))?;
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| g.get_u64(&key(k)).map(|v| v as usize);
    let req = |k: &str| get(k).ok_or_else(|| bad(format!("{}: missing {}", path.display(), key(k))));
    let (n_layers, hidden, heads) = (
        req("block_count")?,
        req("embedding_length")?,
        req("attention.head_count")?,
    );
    let kv_heads = get("attention.head_count_kv").unwrap_or(heads);
    let head_dim = get("attention.key_length").unwrap_or(hidden / heads);
    let mut cfg = DecoderConfig::new(n_layers, hidden, heads, kv_heads, head_dim);
    cfg.eps = g
        .get_f32(&key("attention.layer_norm_rms_epsilon"))
        .unwrap_or(1e-6);
    cfg.rope_base = vec![g.get_f32(&key("rope.freq_base")).unwrap_or(10000.0); n_layers];
    apply_variant(&mut cfg, variant, false);
    if variant == Variant::Qwen3Moe {
        cfg.moe = Some(MoeConfig {
            n_experts: req("expert_count")?,
            top_k: req("expert_used_count")?,
            norm_topk_prob: g.get_bool(&key("expert_weights_norm")).unwrap_or(true),
        });
    }
    let weights = DecoderWeights::load(&w, &cfg)?;
    let context_length = get("context_length").unwrap_or(32768) as u32;

    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap_or_default();
    let mut special = Map::new();
    let mut stop_tokens = Vec::new();
    for (name, k) in [
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("eot", "tokenizer.ggml.eot_token_id"),
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("pad", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(id) = g.get_u64(k) {
            special.insert(name.into(), json!(id));
            if name == "eos" || name == "eot" {
                push_unique(&mut stop_tokens, id as i32);
            }
        }
    }
    for text in SPECIAL_TOKENS {
        if let Some(id) = tokens.iter().position(|t| *t == text) {
            special.insert(text.into(), json!(id));
            if STOP_TEXTS.contains(&text) {
                push_unique(&mut stop_tokens, id as i32);
            }
        }
    }
    let tools = g
        .get_str("tokenizer.chat_template")
        .is_some_and(|t| t.contains("tools"));
    Ok(Loaded {
        variant,
        cfg,
        weights,
        context_length,
        stop_tokens,
        special,
        tools,
    })
}

fn push_unique(v: &mut Vec<i32>, id: i32) {
    if !v.contains(&id) {
        v.push(id);
    }
}

/// Sets the switches that distinguish the Qwen variants.
fn apply_variant(cfg: &mut DecoderConfig, variant: Variant, attention_bias: bool) {
    cfg.rope_neox = true;
    cfg.qkv_bias = variant == Variant::Qwen2 || attention_bias;
    cfg.qk_norm = variant != Variant::Qwen2;
}

fn read_json(path: &Path) -> Result<Value, PluginError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
}

fn load_safetensors(config: &LoadConfig) -> Result<Loaded, PluginError> {
    let dir = &config.pack_dir;
    let c = read_json(&dir.join("config.json"))?;
    let c = c.get("text_config").cloned().unwrap_or(c);
    let model_type = c
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or(&config.architecture);
    let variant = Variant::from_arch(model_type)
        .ok_or_else(|| bad(format!("unsupported model_type {model_type:?}")))?;
    let num = |k: &str| c.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let req = |k: &str| num(k).ok_or_else(|| bad(format!("config.json: missing {k}")));
    let flt = |k: &str| c.get(k).and_then(Value::as_f64);
    let flag = |k: &str| c.get(k).and_then(Value::as_bool);
    let (n_layers, hidden, heads) = (
        req("num_hidden_layers")?,
        req("hidden_size")?,
        req("num_attention_heads")?,
    );
    let kv_heads = num("num_key_value_heads").unwrap_or(heads);
    let head_dim = num("head_dim").unwrap_or(hidden / heads);
    let mut cfg = DecoderConfig::new(n_layers, hidden, heads, kv_heads, head_dim);
    cfg.eps = flt("rms_norm_eps").unwrap_or(1e-6) as f32;
    let theta = flt("rope_theta")
        .or_else(|| c.pointer("/rope_parameters/rope_theta").and_then(Value::as_f64))
        .unwrap_or(10000.0);
    cfg.rope_base = vec![theta as f32; n_layers];
    cfg.tie_embeddings = flag("tie_word_embeddings").unwrap_or(false);
    apply_variant(&mut cfg, variant, flag("attention_bias").unwrap_or(false));
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        let window = num("sliding_window");
        for (i, t) in types.iter().enumerate().take(n_layers) {
            if t.as_str() == Some("sliding_attention") {
                cfg.sliding_window[i] = window;
            }
        }
    }
    if variant == Variant::Qwen3Moe {
        if c.get("mlp_only_layers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
            || num("decoder_sparse_step").is_some_and(|s| s != 1)
        {
            return Err(bad(
                "Qwen3-MoE with dense layers (mlp_only_layers / decoder_sparse_step) is not supported",
            ));
        }
        cfg.moe = Some(MoeConfig {
            n_experts: num("num_experts")
                .or(num("num_local_experts"))
                .ok_or_else(|| bad("config.json: missing num_experts"))?,
            top_k: req("num_experts_per_tok")?,
            norm_topk_prob: flag("norm_topk_prob").unwrap_or(false),
        });
    }
    let files = if config.weights.is_empty() {
        files_with_ext(dir, "safetensors")?
    } else {
        config.weights.clone()
    };
    let w = Weights::open_safetensors(&files)?;
    let weights = DecoderWeights::load(&w, &cfg)?;
    let context_length = num("max_position_embeddings").unwrap_or(32768) as u32;

    let mut stop_tokens = Vec::new();
    let mut special = Map::new();
    let gen = dir.join("generation_config.json");
    let gen = if gen.exists() {
        read_json(&gen)?
    } else {
        Value::Null
    };
    for src in [&gen, &c] {
        match src.get("eos_token_id") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_i64)
                .for_each(|id| push_unique(&mut stop_tokens, id as i32)),
            Some(v) => {
                if let Some(id) = v.as_i64() {
                    push_unique(&mut stop_tokens, id as i32)
                }
            }
            None => {}
        }
    }
    if let Some(id) = stop_tokens.first() {
        special.insert("eos".into(), json!(id));
    }
    if let Some(id) = c.get("bos_token_id").and_then(Value::as_i64) {
        special.insert("bos".into(), json!(id));
    }
    Ok(Loaded {
        variant,
        cfg,
        weights,
        context_length,
        stop_tokens,
        special,
        tools: false,
    })
}

/// A loaded Qwen model.
pub struct QwenModel {
    decoder: Decoder,
    description: ModelDescription,
    tools: bool,
}

impl QwenModel {
    fn new(l: Loaded, config: &LoadConfig) -> Result<QwenModel, PluginError> {
        let context = config
            .context_length
            .filter(|&c| c > 0)
            .map_or(l.context_length, |c| c.min(l.context_length));
        let max_seqs = config.max_sequences.filter(|&m| m > 0).unwrap_or(16);
        let threads = resolve_threads(config.threads);
        let vocab = l.weights.output.rows as u32;
        let decoder = Decoder::new(l.cfg, l.weights, max_seqs as usize, context as usize, threads);
        let description = ModelDescription {
            vocab_size: vocab,
            context_length: context,
            max_sequences: max_seqs,
            capabilities: if l.tools { CAP_TOOLS } else { 0 },
            stop_tokens: l.stop_tokens,
            extra: json!({
                "architecture": l.variant.gguf_arch(),
                "special_tokens": l.special,
                "threads": threads,
            }),
        };
        Ok(QwenModel {
            decoder,
            description,
            tools: l.tools,
        })
    }

    /// The underlying decoder (configuration, weights, KV cache).
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }
}

impl Model for QwenModel {
    fn describe(&self) -> ModelDescription {
        self.description.clone()
    }

    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        self.decoder.decode(batch, logits)
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        self.decoder.force_token(seq, token)
    }

    fn tools_enabled(&self) -> bool {
        self.tools
    }

    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        self.decoder.seq_truncate(seq, len)
    }

    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        self.decoder.seq_fork(src, dst)
    }
}

berth_plugin_api::export_plugin!(QwenFamily);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_accepts_supported_architectures_only() {
        for a in ["qwen2", "qwen3", "qwen3moe", "qwen3_moe"] {
            assert_eq!(
                QwenFamily::probe(&json!({"family": "qwen3", "architecture": a, "format": "gguf"})),
                100
            );
        }
        assert_eq!(
            QwenFamily::probe(&json!({"family": "qwen3", "architecture": "llama"})),
            0
        );
        assert_eq!(
            QwenFamily::probe(&json!({"family": "gemma", "architecture": "qwen2"})),
            0
        );
        let m = QwenFamily::manifest();
        assert_eq!(m.name, "qwen3");
        assert!(m.architectures.contains(&"qwen3moe".to_string()));
    }
}
