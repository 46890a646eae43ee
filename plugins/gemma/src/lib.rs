//! The Gemma plugin: Gemma 3 text models (llama.cpp GGUF or HF safetensors, on the generic
//! decoder of `berth-plugin-common`) and Gemma 4 text models (HF safetensors, on this crate's
//! [`gemma4`] decoder: per-layer embeddings, KV sharing, proportional RoPE, MoE).

pub mod gemma4;

use berth_kernels::quant::WeightType;
use berth_plugin_api::abi::CAP_TOOLS;
use berth_plugin_api::{
    BatchView, Family, LoadConfig, LogitsOut, Model, ModelDescription, PluginError, PluginManifest,
};
use berth_plugin_common::decoder::Ffn;
use berth_plugin_common::linear::resolve_threads;
use berth_plugin_common::ops::Rope;
use berth_plugin_common::{
    Activation, Decoder, DecoderConfig, DecoderWeights, HfNames, Matrix, Role, TensorId, Weights,
};
use gemma4::{AttnShape, Gemma4Decoder, Gemma4Weights, KvProj, Layer, MoeBlock, Ple, PleLayer};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

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

/// The family type exported by this plugin.
pub struct GemmaFamily;

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

impl Family for GemmaFamily {
    type Model = GemmaModel;

    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "gemma".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Gemma 3 (GGUF, safetensors) and Gemma 4 (safetensors) text models".into(),
            families: vec!["gemma".into()],
            architectures: ARCHITECTURES.iter().map(|s| s.to_string()).collect(),
            weight_formats: vec!["gguf".into(), "safetensors".into()],
            ..Default::default()
        }
    }

    fn probe(model_config: &Value) -> u32 {
        let family = model_config.get("family").and_then(Value::as_str);
        let arch = model_config.get("architecture").and_then(Value::as_str);
        match (family, arch) {
            (Some("gemma"), Some(a)) if Variant::from_arch(a).is_some() => 100,
            _ => 0,
        }
    }

    fn create(config: &LoadConfig) -> Result<GemmaModel, PluginError> {
        let mut loaded = if is_safetensors(config) {
            load_safetensors(config)?
        } else {
            load_gguf(config)?
        };
        if config.options.get("dequantize").and_then(Value::as_bool) == Some(true) {
            if let LoadedWeights::Common(cfg, w) = &mut loaded.weights {
                dequantize_common(w);
                // An f32 reference run: no emulation of llama.cpp's f16 steps.
                cfg.kv_f16 = false;
                cfg.rope_f32 = false;
                if cfg.activation == Activation::GeluTanhF16 {
                    cfg.activation = Activation::GeluTanh;
                }
            }
        }
        GemmaModel::new(loaded, config)
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

fn bad(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg)
}

/// The engine behind a model: the common decoder (Gemma 3) or the Gemma 4 decoder.
enum Engine {
    Common(Box<Decoder>),
    Gemma4(Box<Gemma4Decoder>),
}

/// What loading produced, before the runtime state is built.
struct Loaded {
    variant: Variant,
    weights: LoadedWeights,
    context_length: u32,
    stop_tokens: Vec<i32>,
    special: Map<String, Value>,
    tools: bool,
}

enum LoadedWeights {
    Common(DecoderConfig, DecoderWeights),
    Gemma4(Gemma4Weights),
}

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

/// An f32 copy of a matrix.
fn to_f32(m: &Matrix) -> Matrix {
    let mut data = vec![0.0; m.rows * m.cols];
    for (r, row) in data.chunks_exact_mut(m.cols).enumerate() {
        m.dequantize_row(r, row);
    }
    Matrix::from_f32(m.rows, m.cols, &data)
}

/// Converts every matrix to f32 (load option `dequantize`: reference comparisons without
/// quantised activations).
fn dequantize_common(w: &mut DecoderWeights) {
    w.embed = to_f32(&w.embed);
    w.output = to_f32(&w.output);
    for l in &mut w.layers {
        if let Some(a) = l.mixer.attention_mut() {
            for m in [&mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo] {
                *m = to_f32(m);
            }
        }
        if let Ffn::Dense(f) = &mut l.ffn {
            for m in [&mut f.gate, &mut f.up, &mut f.down] {
                *m = to_f32(m);
            }
        }
    }
}

fn push_unique(v: &mut Vec<i32>, id: i32) {
    if !v.contains(&id) {
        v.push(id);
    }
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
    if variant == Variant::Gemma4 {
        return Err(bad(format!(
            "{}: Gemma 4 GGUF files are not supported yet (use safetensors)",
            path.display()
        )));
    }
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
    gemma3_switches(&mut cfg, true);
    // Follow llama.cpp's numerics on its own files (ggml-cpu, default context: F16 KV cache, no
    // flash attention; the Gemma graph scales queries before attention; GEGLU through ggml's f16
    // GELU table).
    cfg.kv_f16 = true;
    cfg.q_prescale = true;
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
        Some(t) => return Err(bad(format!("{}: unsupported RoPE scaling {t:?}", path.display()))),
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
    let tools = variant == Variant::Gemma4
        && g.get_str("tokenizer.chat_template")
            .is_some_and(|t| t.contains("tool"));
    Ok(Loaded {
        variant,
        weights: LoadedWeights::Common(cfg, weights),
        context_length,
        stop_tokens,
        special,
        tools,
    })
}

fn read_json(path: &Path) -> Result<Value, PluginError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
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

fn load_safetensors(config: &LoadConfig) -> Result<Loaded, PluginError> {
    let dir = &config.pack_dir;
    let top = read_json(&dir.join("config.json"))?;
    let c = top.get("text_config").cloned().unwrap_or_else(|| top.clone());
    let model_type = c
        .get("model_type")
        .or_else(|| top.get("model_type"))
        .and_then(Value::as_str)
        .unwrap_or(&config.architecture);
    let variant = Variant::from_arch(model_type)
        .ok_or_else(|| bad(format!("unsupported model_type {model_type:?}")))?;
    let files = if config.weights.is_empty() {
        files_with_ext(dir, "safetensors")?
    } else {
        config.weights.clone()
    };
    let w = Weights::open_safetensors(&files)?.with_hf_names(HfNames::Sandwich);
    let weights = match variant {
        Variant::Gemma3 => {
            let (cfg, dw) = gemma3_safetensors(&c, &w)?;
            LoadedWeights::Common(cfg, dw)
        }
        Variant::Gemma4 => LoadedWeights::Gemma4(gemma4_safetensors(&c, &w)?),
    };
    let context_length = c
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .unwrap_or(32768) as u32;

    let mut stop_tokens = Vec::new();
    let mut special = Map::new();
    let gen = dir.join("generation_config.json");
    let gen = if gen.exists() {
        read_json(&gen)?
    } else {
        Value::Null
    };
    for src in [&gen, &c, &top] {
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
    // Special tokens by text from tokenizer.json's added tokens, when the pack has one.
    let tok = dir.join("tokenizer.json");
    if tok.exists() {
        if let Some(added) = read_json(&tok)?.get("added_tokens").and_then(Value::as_array) {
            for t in added {
                let (Some(text), Some(id)) = (
                    t.get("content").and_then(Value::as_str),
                    t.get("id").and_then(Value::as_i64),
                ) else {
                    continue;
                };
                if SPECIAL_TOKENS.contains(&text) {
                    special.insert(text.into(), json!(id));
                    if STOP_TEXTS.contains(&text) {
                        push_unique(&mut stop_tokens, id as i32);
                    }
                }
            }
        }
    }
    let template = ["chat_template.jinja", "chat_template.json"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .next()
        .unwrap_or_default();
    Ok(Loaded {
        variant,
        weights,
        context_length,
        stop_tokens,
        special,
        tools: variant == Variant::Gemma4 && template.contains("tool"),
    })
}

fn gemma3_safetensors(c: &Value, w: &Weights) -> Result<(DecoderConfig, DecoderWeights), PluginError> {
    let num = |k: &str| c.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let req = |k: &str| num(k).ok_or_else(|| bad(format!("config.json: missing {k}")));
    let flt = |k: &str| c.get(k).and_then(Value::as_f64);
    let (n_layers, hidden, heads) = (
        req("num_hidden_layers")?,
        req("hidden_size")?,
        req("num_attention_heads")?,
    );
    let kv_heads = num("num_key_value_heads").unwrap_or(heads);
    let head_dim = num("head_dim").unwrap_or(hidden / heads);
    let mut cfg = DecoderConfig::new(n_layers, hidden, heads, kv_heads, head_dim);
    gemma3_switches(&mut cfg, false);
    cfg.eps = flt("rms_norm_eps").unwrap_or(1e-6) as f32;
    cfg.attn_scale = (flt("query_pre_attn_scalar").unwrap_or(head_dim as f64) as f32).powf(-0.5);
    cfg.final_softcap = flt("final_logit_softcapping").map(|v| v as f32);
    cfg.attn_softcap = flt("attn_logit_softcapping").map(|v| v as f32);
    let global = rope_params(c, "full_attention", flt("rope_theta").unwrap_or(1_000_000.0));
    let local = rope_params(
        c,
        "sliding_attention",
        flt("rope_local_base_freq").unwrap_or(GEMMA3_LOCAL_BASE as f64),
    );
    let global_scale = match global.kind.as_str() {
        "default" => 1.0,
        "linear" => global.factor,
        k => return Err(bad(format!("config.json: unsupported RoPE type {k:?}"))),
    };
    let window = num("sliding_window");
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
    let embed_type = w.matrix(&TensorId::global(Role::TokenEmbd))?.wtype;
    cfg.embed_scale = Some(round_to_dtype((hidden as f32).sqrt(), embed_type));
    let dw = DecoderWeights::load(w, &cfg)?;
    Ok((cfg, dw))
}

fn gemma4_safetensors(c: &Value, w: &Weights) -> Result<Gemma4Weights, PluginError> {
    let num = |k: &str| c.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let req = |k: &str| num(k).ok_or_else(|| bad(format!("config.json: missing {k}")));
    let flt = |k: &str| c.get(k).and_then(Value::as_f64);
    let (n_layers, hidden, heads) = (
        req("num_hidden_layers")?,
        req("hidden_size")?,
        req("num_attention_heads")?,
    );
    let eps = flt("rms_norm_eps").unwrap_or(1e-6) as f32;
    let window = num("sliding_window");
    let sliding = sliding_layers(c, n_layers, 6);
    let global = rope_params(c, "full_attention", 1_000_000.0);
    let local = rope_params(c, "sliding_attention", 10_000.0);
    let n_shared = num("num_kv_shared_layers").unwrap_or(0).min(n_layers);
    let first_shared = n_layers - n_shared;
    let moe_on = c
        .get("enable_moe_block")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let ple_dim = num("hidden_size_per_layer_input").unwrap_or(0);

    let layer = |i: usize, stem: &str| format!("model.layers.{i}.{stem}");
    let vec = |name: String| w.vector_named(&name);
    let mat = |name: String| w.matrix_named(&name);
    let embed = mat("model.embed_tokens.weight".into())?;
    let mut layers: Vec<Layer> = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let q_norm = vec(layer(i, "self_attn.q_norm.weight"))?;
        let head_dim = q_norm.len();
        let wq = mat(layer(i, "self_attn.q_proj.weight"))?;
        if head_dim == 0 || wq.rows != heads * head_dim || wq.cols != hidden {
            return Err(bad(format!(
                "layer {i}: q_proj {wq:?} does not fit {heads} heads of {head_dim}"
            )));
        }
        let (kv, kv_source, n_kv_heads) = if i < first_shared {
            let wk = mat(layer(i, "self_attn.k_proj.weight"))?;
            let v_name = layer(i, "self_attn.v_proj.weight");
            let wv = if w.has_named(&v_name) {
                Some(mat(v_name)?)
            } else {
                None
            };
            let n_kv = wk.rows / head_dim;
            if n_kv == 0
                || wk.rows != n_kv * head_dim
                || heads % n_kv != 0
                || wv.as_ref().is_some_and(|v| v.rows != wk.rows)
            {
                return Err(bad(format!(
                    "layer {i}: k/v projections {wk:?} {wv:?} do not fit head_dim {head_dim}"
                )));
            }
            let k_norm = vec(layer(i, "self_attn.k_norm.weight"))?;
            (Some(KvProj { wk, wv, k_norm }), i, n_kv)
        } else {
            // The last earlier non-shared layer of the same type.
            let src = (0..first_shared)
                .rev()
                .find(|&j| sliding[j] == sliding[i])
                .ok_or_else(|| {
                    bad(format!(
                        "layer {i}: no earlier layer of its type to share KV with"
                    ))
                })?;
            let a: &AttnShape = &layers[src].attn;
            if a.head_dim != head_dim {
                return Err(bad(format!(
                    "layer {i}: head_dim {head_dim} differs from KV source layer {src}"
                )));
            }
            (None, src, a.n_kv_heads)
        };
        let rope = if sliding[i] {
            Rope::new(local.theta, head_dim, head_dim, true)
        } else if global.kind == "proportional" {
            gemma4::proportional_rope(global.theta, head_dim, global.partial, global.factor)
        } else if global.kind == "default" {
            Rope::new(global.theta, head_dim, head_dim, true)
        } else {
            return Err(bad(format!(
                "config.json: unsupported RoPE type {:?}",
                global.kind
            )));
        };
        let moe = if moe_on {
            let n_experts = req("num_experts")?;
            let top_k = num("top_k_experts")
                .or(num("num_experts_per_tok"))
                .ok_or_else(|| bad("config.json: missing top_k_experts"))?;
            let gate_up = w.stacked_named(&layer(i, "experts.gate_up_proj"))?;
            let down = w.stacked_named(&layer(i, "experts.down_proj"))?;
            if gate_up.len() != n_experts || down.len() != n_experts || gate_up[0].rows % 2 != 0 {
                return Err(bad(format!(
                    "layer {i}: expert tensors do not fit {n_experts} experts"
                )));
            }
            let inter = gate_up[0].rows / 2;
            Some(MoeBlock {
                router: mat(layer(i, "router.proj.weight"))?,
                router_scale: vec(layer(i, "router.scale"))?,
                per_expert_scale: vec(layer(i, "router.per_expert_scale"))?,
                top_k,
                gate: gate_up.iter().map(|m| m.slice_rows(0, inter)).collect(),
                up: gate_up.iter().map(|m| m.slice_rows(inter, inter)).collect(),
                down,
                pre_norm_2: vec(layer(i, "pre_feedforward_layernorm_2.weight"))?,
                post_norm_1: vec(layer(i, "post_feedforward_layernorm_1.weight"))?,
                post_norm_2: vec(layer(i, "post_feedforward_layernorm_2.weight"))?,
            })
        } else {
            None
        };
        let ple = if ple_dim > 0 {
            Some(PleLayer {
                gate: mat(layer(i, "per_layer_input_gate.weight"))?,
                proj: mat(layer(i, "per_layer_projection.weight"))?,
                post_norm: vec(layer(i, "post_per_layer_input_norm.weight"))?,
            })
        } else {
            None
        };
        let scalar_name = layer(i, "layer_scalar");
        let layer_scalar = if w.has_named(&scalar_name) {
            vec(scalar_name)?[0]
        } else {
            1.0
        };
        layers.push(Layer {
            attn: AttnShape {
                head_dim,
                n_kv_heads,
                window: if sliding[i] { window } else { None },
                kv_source,
                rope,
            },
            attn_norm: vec(layer(i, "input_layernorm.weight"))?,
            wq,
            q_norm,
            kv,
            wo: mat(layer(i, "self_attn.o_proj.weight"))?,
            post_attn_norm: vec(layer(i, "post_attention_layernorm.weight"))?,
            ffn_norm: vec(layer(i, "pre_feedforward_layernorm.weight"))?,
            gate: mat(layer(i, "mlp.gate_proj.weight"))?,
            up: mat(layer(i, "mlp.up_proj.weight"))?,
            down: mat(layer(i, "mlp.down_proj.weight"))?,
            post_ffw_norm: vec(layer(i, "post_feedforward_layernorm.weight"))?,
            moe,
            ple,
            layer_scalar,
        });
    }
    let ple = if ple_dim > 0 {
        let pe = mat("model.embed_tokens_per_layer.weight".into())?;
        if pe.cols != n_layers * ple_dim {
            return Err(bad(format!(
                "embed_tokens_per_layer {pe:?} does not fit {n_layers} layers of {ple_dim}"
            )));
        }
        Some(Ple {
            dim: ple_dim,
            embed_scale: round_to_dtype((ple_dim as f32).sqrt(), pe.wtype),
            embed: pe,
            projection: mat("model.per_layer_model_projection.weight".into())?,
            norm: vec("model.per_layer_projection_norm.weight".into())?,
        })
    } else {
        None
    };
    let output = if w.has_named("lm_head.weight")
        && c.get("tie_word_embeddings").and_then(Value::as_bool) == Some(false)
    {
        mat("lm_head.weight".into())?
    } else {
        embed.clone()
    };
    Ok(Gemma4Weights {
        hidden,
        n_heads: heads,
        eps,
        embed_scale: round_to_dtype((hidden as f32).sqrt(), embed.wtype),
        embed,
        ple,
        layers,
        output_norm: vec("model.norm.weight".into())?,
        output,
        final_softcap: flt("final_logit_softcapping").map(|v| v as f32),
        attn_softcap: flt("attn_logit_softcapping").map(|v| v as f32),
    })
}

/// A loaded Gemma model.
pub struct GemmaModel {
    engine: Engine,
    description: ModelDescription,
    tools: bool,
}

impl GemmaModel {
    fn new(l: Loaded, config: &LoadConfig) -> Result<GemmaModel, PluginError> {
        let context = config
            .context_length
            .filter(|&c| c > 0)
            .map_or(l.context_length, |c| c.min(l.context_length));
        let max_seqs = config.max_sequences.filter(|&m| m > 0).unwrap_or(16);
        let threads = resolve_threads(config.threads);
        let (engine, vocab) = match l.weights {
            LoadedWeights::Common(cfg, w) => {
                let vocab = w.output.rows as u32;
                (
                    Engine::Common(Box::new(Decoder::new(
                        cfg,
                        w,
                        max_seqs as usize,
                        context as usize,
                        threads,
                    ))),
                    vocab,
                )
            }
            LoadedWeights::Gemma4(w) => {
                let vocab = w.output.rows as u32;
                (
                    Engine::Gemma4(Box::new(Gemma4Decoder::new(
                        w,
                        max_seqs as usize,
                        context as usize,
                        threads,
                    ))),
                    vocab,
                )
            }
        };
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
            rewind: Default::default(),
        };
        Ok(GemmaModel {
            engine,
            description,
            tools: l.tools,
        })
    }

    /// The common decoder, for Gemma 3 models.
    pub fn decoder(&self) -> Option<&Decoder> {
        match &self.engine {
            Engine::Common(d) => Some(d),
            Engine::Gemma4(_) => None,
        }
    }

    /// The Gemma 4 decoder, for Gemma 4 models.
    pub fn gemma4(&self) -> Option<&Gemma4Decoder> {
        match &self.engine {
            Engine::Common(_) => None,
            Engine::Gemma4(d) => Some(d),
        }
    }
}

impl Model for GemmaModel {
    fn describe(&self) -> ModelDescription {
        self.description.clone()
    }

    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        match &mut self.engine {
            Engine::Common(d) => d.decode(batch, logits),
            Engine::Gemma4(d) => d.decode(batch, logits),
        }
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        match &mut self.engine {
            Engine::Common(d) => d.force_token(seq, token),
            Engine::Gemma4(d) => d.force_token(seq, token),
        }
    }

    fn tools_enabled(&self) -> bool {
        self.tools
    }

    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        match &mut self.engine {
            Engine::Common(d) => d.seq_truncate(seq, len),
            Engine::Gemma4(d) => d.seq_truncate(seq, len),
        }
    }

    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        match &mut self.engine {
            Engine::Common(d) => d.seq_fork(src, dst),
            Engine::Gemma4(d) => d.seq_fork(src, dst),
        }
    }
}

berth_plugin_api::export_plugin!(GemmaFamily);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_accepts_supported_architectures_only() {
        for a in [
            "gemma3",
            "gemma4",
            "gemma3_text",
            "gemma4_text",
            "Gemma3ForCausalLM",
        ] {
            assert_eq!(
                GemmaFamily::probe(&json!({"family": "gemma", "architecture": a, "format": "gguf"})),
                100
            );
        }
        assert_eq!(
            GemmaFamily::probe(&json!({"family": "gemma", "architecture": "llama"})),
            0
        );
        assert_eq!(
            GemmaFamily::probe(&json!({"family": "qwen3", "architecture": "gemma3"})),
            0
        );
        let m = GemmaFamily::manifest();
        assert_eq!(m.name, "gemma");
        assert_eq!(m.families, ["gemma"]);
        assert!(m.architectures.contains(&"gemma4_text".to_string()));
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
