//! What every family plugin shares besides the decoder: finding the weight files, reading HF
//! configs, special and stop tokens (from GGUF metadata or HF configs), the probe, and
//! [`DecoderModel`], the plugin `Model` over a [`Decoder`]. A family crate supplies the config
//! mapping and the weight map and hands a [`Loaded`] to [`DecoderModel::new`].

use crate::decoder::{Decoder, DecoderConfig, DecoderWeights, GatedFfn};
use crate::embedding::SentenceHead;
use crate::layers::Activation;
use crate::linear::resolve_threads;
use crate::ops::Yarn;
use crate::weights::{GgufFile, WeightFormat, Weights};
/// The plugin SDK, for [`decoder_family!`](crate::decoder_family).
pub use berth_plugin_api as api;
use berth_plugin_api::abi::CAP_TOOLS;
use berth_plugin_api::{
    BatchView, EmbeddingSpec, LoadConfig, LogitsOut, Model, ModelDescription, PluginError, PluginManifest,
};
pub use serde_json::Value;
use serde_json::{json, Map};
use std::path::{Path, PathBuf};

/// A load error with a message.
pub fn bad(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg)
}

/// Files in `dir` with extension `ext`, sorted.
pub fn files_with_ext(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, PluginError> {
    let rd = std::fs::read_dir(dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    Ok(v)
}

/// The pack's weight format and files: the manifest's when it names them, else what the pack
/// directory holds (a `.gguf` file wins over safetensors).
pub fn weight_files(config: &LoadConfig) -> Result<(WeightFormat, Vec<PathBuf>), PluginError> {
    let safetensors = match config.format.as_str() {
        "safetensors" => true,
        "gguf" => false,
        _ => config.weights.first().map_or_else(
            || files_with_ext(&config.pack_dir, "gguf").map_or(true, |v| v.is_empty()),
            |p| p.extension().is_some_and(|e| e == "safetensors"),
        ),
    };
    let (format, ext) = if safetensors {
        (WeightFormat::Safetensors, "safetensors")
    } else {
        (WeightFormat::Gguf, "gguf")
    };
    let files = if config.weights.is_empty() {
        files_with_ext(&config.pack_dir, ext)?
    } else {
        config.weights.clone()
    };
    if files.is_empty() {
        return Err(bad(format!("no .{ext} file in {}", config.pack_dir.display())));
    }
    Ok((format, files))
}

/// Opens the pack's weights (the first GGUF file, or every safetensors file).
pub fn open_weights(config: &LoadConfig) -> Result<Weights, PluginError> {
    match weight_files(config)? {
        (WeightFormat::Gguf, files) => {
            let w = Weights::open_gguf(&files[0])?;
            // Only a pack in a store (its manifest beside the weights) keeps a cache: a GGUF
            // loaded from anywhere else (a fixture, a test's directory) is left as it is.
            if crate::pack_cache::cache_wanted() && config.pack_dir.join("pack.toml").is_file() {
                w.with_pack_cache(&config.pack_dir)
            } else {
                Ok(w)
            }
        }
        (_, files) => Weights::open_safetensors(&files),
    }
}

/// The routed experts of a MoE layer: from one 3-D tensor per projection when `name(None, p)`
/// names one (GGUF's `ffn_gate_exps`, ...), else from one tensor per expert, `name(Some(e), p)`;
/// `p` is `"gate"`, `"up"` or `"down"`.
pub fn load_experts(
    w: &Weights,
    name: impl Fn(Option<usize>, &str) -> String,
    n: usize,
) -> Result<Vec<GatedFfn>, PluginError> {
    if w.has_named(&name(None, "gate")) {
        let stack = |p: &str| -> Result<Vec<_>, PluginError> {
            let v = w.stacked_named(&name(None, p))?;
            if v.len() != n {
                return Err(bad(format!(
                    "{}: {} experts, expected {n}",
                    name(None, p),
                    v.len()
                )));
            }
            Ok(v)
        };
        let ffns = stack("gate")?.into_iter().zip(stack("up")?).zip(stack("down")?);
        return Ok(ffns
            .map(|((gate, up), down)| GatedFfn { gate, up, down })
            .collect());
    }
    (0..n)
        .map(|e| {
            Ok(GatedFfn {
                gate: w.matrix_named(&name(Some(e), "gate"))?,
                up: w.matrix_named(&name(Some(e), "up"))?,
                down: w.matrix_named(&name(Some(e), "down"))?,
            })
        })
        .collect()
}

/// The HF `model_type` of a config, else the pack manifest's architecture.
pub fn model_type<'a>(c: &'a Value, config: &'a LoadConfig) -> &'a str {
    c.get("model_type")
        .and_then(Value::as_str)
        .unwrap_or(&config.architecture)
}

/// A JSON file.
pub fn read_json(path: &Path) -> Result<Value, PluginError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// An HF `config.json`, with a multimodal model's `text_config` taken as the whole.
pub fn hf_config(dir: &Path) -> Result<Value, PluginError> {
    let c = read_json(&dir.join("config.json"))?;
    Ok(c.get("text_config").cloned().unwrap_or(c))
}

/// Typed reads of an HF config with errors that name the key.
pub struct HfConfig<'a>(pub &'a Value);

impl HfConfig<'_> {
    /// An unsigned integer.
    pub fn num(&self, k: &str) -> Option<usize> {
        self.0.get(k).and_then(Value::as_u64).map(|v| v as usize)
    }

    /// A required unsigned integer.
    pub fn req(&self, k: &str) -> Result<usize, PluginError> {
        self.num(k)
            .ok_or_else(|| bad(format!("config.json: missing {k}")))
    }

    /// A float, also looked up under `rope_parameters` (transformers 5 moved RoPE keys there).
    pub fn float(&self, k: &str) -> Option<f64> {
        self.0
            .get(k)
            .or_else(|| self.0.get("rope_parameters").and_then(|r| r.get(k)))
            .and_then(Value::as_f64)
    }

    /// A boolean.
    pub fn flag(&self, k: &str) -> Option<bool> {
        self.0.get(k).and_then(Value::as_bool)
    }

    /// A list of strings (e.g. `layer_types`).
    pub fn strings(&self, k: &str) -> Option<Vec<String>> {
        self.0
            .get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_str().unwrap_or("").to_string()).collect())
    }

    /// Which layers `layer_types` marks `"full_attention"` (the hybrid families' pattern).
    pub fn full_attention_layers(&self) -> Option<Vec<bool>> {
        self.strings("layer_types")
            .map(|t| t.iter().map(|t| t == "full_attention").collect())
    }

    /// YaRN RoPE scaling when `rope_parameters` (or the older `rope_scaling`) has `rope_type`
    /// `"yarn"`, read as transformers' `_compute_yarn_parameters` reads it: `factor` (default
    /// `max_position_embeddings / original_max_position_embeddings`), the betas (32 and 1 when
    /// absent or 0), `truncate` (default true), and `attention_factor` or `mscale` /
    /// `mscale_all_dim`.
    pub fn yarn(&self) -> Result<Option<Yarn>, PluginError> {
        let Some(r) = ["rope_parameters", "rope_scaling"]
            .iter()
            .find_map(|k| self.0.get(*k).filter(|r| r.is_object()))
        else {
            return Ok(None);
        };
        let kind = r
            .get("rope_type")
            .or_else(|| r.get("type"))
            .and_then(Value::as_str);
        if kind != Some("yarn") {
            return Ok(None);
        }
        let f = |k: &str| r.get(k).and_then(Value::as_f64);
        let original = f("original_max_position_embeddings")
            .ok_or_else(|| bad("config.json: YaRN without original_max_position_embeddings"))?;
        let factor = match f("factor") {
            Some(v) => v,
            None => {
                self.float("max_position_embeddings")
                    .ok_or_else(|| bad("config.json: YaRN without factor"))?
                    / original
            }
        };
        let nonzero = |k: &str, default: f64| f(k).filter(|&v| v != 0.0).unwrap_or(default) as f32;
        Ok(Some(Yarn {
            factor: factor as f32,
            original_max_position: original as usize,
            beta_fast: nonzero("beta_fast", 32.0),
            beta_slow: nonzero("beta_slow", 1.0),
            truncate: r.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            attention_factor: f("attention_factor").map(|v| v as f32),
            mscale: f("mscale")
                .zip(f("mscale_all_dim"))
                .map(|(a, b)| (a as f32, b as f32)),
        }))
    }

    /// The decoder shape every HF text config states the same way: layers, widths, heads, norm
    /// epsilon (`rms_norm_eps` or `norm_eps`), RoPE base and tied embeddings.
    pub fn decoder_config(&self) -> Result<DecoderConfig, PluginError> {
        let (n_layers, hidden, heads) = (
            self.req("num_hidden_layers")?,
            self.req("hidden_size")?,
            self.req("num_attention_heads")?,
        );
        let kv_heads = self.num("num_key_value_heads").unwrap_or(heads);
        let head_dim = self.num("head_dim").unwrap_or(hidden / heads.max(1));
        let mut cfg = DecoderConfig::new(n_layers, hidden, heads, kv_heads, head_dim);
        cfg.eps = self
            .float("rms_norm_eps")
            .or(self.float("norm_eps"))
            .unwrap_or(1e-6) as f32;
        cfg.rope_base = vec![self.float("rope_theta").unwrap_or(10000.0) as f32; n_layers];
        cfg.tie_embeddings = self.flag("tie_word_embeddings").unwrap_or(false);
        Ok(cfg)
    }
}

/// Typed reads of a GGUF's `<architecture>.*` metadata with errors that name the key.
pub struct GgufKeys<'a> {
    /// The file.
    pub file: &'a GgufFile,
    /// `general.architecture`, the prefix of the model's keys.
    pub arch: String,
}

impl<'a> GgufKeys<'a> {
    /// The keys of a GGUF weight file (`None` for safetensors).
    pub fn new(w: &'a Weights) -> Option<GgufKeys<'a>> {
        let file = w.gguf()?;
        let arch = file.architecture().unwrap_or("").to_string();
        Some(GgufKeys { file, arch })
    }

    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// An unsigned integer.
    pub fn num(&self, k: &str) -> Option<usize> {
        self.file.get_u64(&self.key(k)).map(|v| v as usize)
    }

    /// A required unsigned integer.
    pub fn req(&self, k: &str) -> Result<usize, PluginError> {
        self.num(k)
            .ok_or_else(|| bad(format!("GGUF: missing {}", self.key(k))))
    }

    /// A float.
    pub fn float(&self, k: &str) -> Option<f32> {
        self.file.get_f32(&self.key(k))
    }

    /// A boolean.
    pub fn flag(&self, k: &str) -> Option<bool> {
        self.file.get_bool(&self.key(k))
    }

    /// An integer array (e.g. LFM2's per-layer KV head counts).
    pub fn nums(&self, k: &str) -> Option<Vec<usize>> {
        self.file
            .get_u64_array(&self.key(k))
            .map(|a| a.into_iter().map(|v| v as usize).collect())
    }

    /// A boolean array (e.g. Qwen3.5's `attention.recurrent_layers`).
    pub fn bools(&self, k: &str) -> Option<Vec<bool>> {
        self.file
            .get(&self.key(k))?
            .as_array()?
            .iter()
            .map(|v| v.as_bool())
            .collect()
    }

    /// The decoder shape llama.cpp writes the same way for every family: block count, widths,
    /// heads (a per-layer KV-head array counts by its largest entry), key length, norm epsilon
    /// and RoPE base.
    pub fn decoder_config(&self) -> Result<DecoderConfig, PluginError> {
        let (n_layers, hidden, heads) = (
            self.req("block_count")?,
            self.req("embedding_length")?,
            self.req("attention.head_count")?,
        );
        let kv_heads = match self.nums("attention.head_count_kv") {
            Some(a) => a.into_iter().max().unwrap_or(heads),
            None => self.num("attention.head_count_kv").unwrap_or(heads),
        };
        let head_dim = self.num("attention.key_length").unwrap_or(hidden / heads.max(1));
        let mut cfg = DecoderConfig::new(n_layers, hidden, heads, kv_heads, head_dim);
        cfg.eps = self.float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6);
        cfg.rope_base = vec![self.float("rope.freq_base").unwrap_or(10000.0); n_layers];
        Ok(cfg)
    }

    /// YaRN RoPE scaling when `rope.scaling.type` is `"yarn"`: `rope.scaling.factor`,
    /// `rope.scaling.original_context_length`, the betas (`rope.scaling.yarn_beta_fast` /
    /// `_slow`, default 32 and 1) and `rope.scaling.yarn_attn_factor` (the converter writes HF's
    /// `attention_factor` there). GGUF does not record whether the correction range is rounded:
    /// `truncate` says (transformers' default is true; gpt-oss's configs say false).
    pub fn yarn(&self, truncate: bool) -> Result<Option<Yarn>, PluginError> {
        if self.file.get_str(&self.key("rope.scaling.type")) != Some("yarn") {
            return Ok(None);
        }
        let factor = self
            .float("rope.scaling.factor")
            .ok_or_else(|| bad(format!("GGUF: YaRN without {}", self.key("rope.scaling.factor"))))?;
        Ok(Some(Yarn {
            factor,
            original_max_position: self.req("rope.scaling.original_context_length")?,
            beta_fast: self.float("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
            beta_slow: self.float("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
            truncate,
            attention_factor: self.float("rope.scaling.yarn_attn_factor"),
            mscale: None,
        }))
    }

    /// The model's own context length (default 32768).
    pub fn context_length(&self) -> u32 {
        self.num("context_length").unwrap_or(32768) as u32
    }
}

/// Special tokens by name and the tokens that end generation.
#[derive(Clone, Debug, Default)]
pub struct Specials {
    /// Tokens that end generation.
    pub stop_tokens: Vec<i32>,
    /// Special tokens by name (`eos`, `bos`, ... and marker texts), reported in the model info.
    pub special: Map<String, Value>,
}

impl Specials {
    fn stop(&mut self, id: i32) {
        if !self.stop_tokens.contains(&id) {
            self.stop_tokens.push(id);
        }
    }

    /// From a GGUF's tokenizer metadata: eos/eot/bos/pad ids, and each of `texts` found in the
    /// vocabulary (those in `stop_texts` also end generation).
    pub fn from_gguf(w: &Weights, texts: &[&str], stop_texts: &[&str]) -> Specials {
        let mut s = Specials::default();
        let Some(g) = w.gguf() else { return s };
        for (name, k) in [
            ("eos", "tokenizer.ggml.eos_token_id"),
            ("eot", "tokenizer.ggml.eot_token_id"),
            ("bos", "tokenizer.ggml.bos_token_id"),
            ("pad", "tokenizer.ggml.padding_token_id"),
        ] {
            if let Some(id) = g.get_u64(k) {
                s.special.insert(name.into(), json!(id));
                if name == "eos" || name == "eot" {
                    s.stop(id as i32);
                }
            }
        }
        let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap_or_default();
        s.add_texts(|t| tokens.iter().position(|x| *x == t), texts, stop_texts);
        s
    }

    /// From an HF checkpoint: `eos_token_id` of `generation_config.json` and `config.json`,
    /// `bos_token_id`, and each of `texts` found among `tokenizer.json`'s added tokens.
    pub fn from_hf(
        dir: &Path,
        config: &Value,
        texts: &[&str],
        stop_texts: &[&str],
    ) -> Result<Specials, PluginError> {
        let mut s = Specials::default();
        let gen = dir.join("generation_config.json");
        let gen = if gen.exists() {
            read_json(&gen)?
        } else {
            Value::Null
        };
        for src in [&gen, config] {
            match src.get("eos_token_id") {
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(Value::as_i64)
                    .for_each(|id| s.stop(id as i32)),
                Some(v) => {
                    if let Some(id) = v.as_i64() {
                        s.stop(id as i32)
                    }
                }
                None => {}
            }
        }
        if let Some(id) = s.stop_tokens.first() {
            s.special.insert("eos".into(), json!(id));
        }
        if let Some(id) = config.get("bos_token_id").and_then(Value::as_i64) {
            s.special.insert("bos".into(), json!(id));
        }
        let tok = dir.join("tokenizer.json");
        if tok.exists() {
            let t = read_json(&tok)?;
            let added: Vec<(String, i64)> = t
                .get("added_tokens")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| {
                            Some((x.get("content")?.as_str()?.to_string(), x.get("id")?.as_i64()?))
                        })
                        .collect()
                })
                .unwrap_or_default();
            s.add_texts(
                |t| added.iter().find(|(c, _)| c == t).map(|(_, id)| *id as usize),
                texts,
                stop_texts,
            );
        }
        Ok(s)
    }

    fn add_texts(&mut self, find: impl Fn(&str) -> Option<usize>, texts: &[&str], stop_texts: &[&str]) {
        for &text in texts {
            if let Some(id) = find(text) {
                self.special.insert(text.into(), json!(id));
                if stop_texts.contains(&text) {
                    self.stop(id as i32);
                }
            }
        }
    }
}

/// The pack's chat template: the GGUF's own, else `chat_template.jinja` or
/// `tokenizer_config.json`'s `chat_template` in the pack directory.
pub fn chat_template(w: &Weights, dir: &Path) -> Option<String> {
    if let Some(t) = w.gguf().and_then(|g| g.get_str("tokenizer.chat_template")) {
        return Some(t.to_string());
    }
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(t);
    }
    read_json(&dir.join("tokenizer_config.json"))
        .ok()?
        .get("chat_template")?
        .as_str()
        .map(str::to_string)
}

/// Whether a chat template renders tools (it refers to them).
pub fn template_has_tools(template: Option<&str>) -> bool {
    template.is_some_and(|t| t.contains("tools"))
}

/// The manifest of a plugin named after its one family that reads GGUF and safetensors packs
/// (`version`: the crate's, `env!("CARGO_PKG_VERSION")`).
pub fn family_manifest(
    name: &str,
    version: &str,
    description: &str,
    architectures: &[&str],
) -> PluginManifest {
    PluginManifest {
        name: name.into(),
        version: version.into(),
        description: description.into(),
        families: vec![name.into()],
        architectures: architectures.iter().map(|s| s.to_string()).collect(),
        weight_formats: vec!["gguf".into(), "safetensors".into()],
        ..Default::default()
    }
}

/// A family's loader for one weight format.
pub type LoadFn = fn(Weights, &LoadConfig) -> Result<Loaded, PluginError>;

/// Opens the pack's weights and maps them with the family's GGUF or safetensors loader.
pub fn load_pack(config: &LoadConfig, gguf: LoadFn, safetensors: LoadFn) -> Result<Loaded, PluginError> {
    let w = open_weights(config)?;
    if w.gguf().is_some() {
        gguf(w, config)
    } else {
        safetensors(w, config)
    }
}

/// The probe every family uses: 100 when the pack's `family` is ours and `known` accepts its
/// `architecture`, else 0.
pub fn probe_family(model_config: &Value, family: &str, known: impl Fn(&str) -> bool) -> u32 {
    let fam = model_config.get("family").and_then(Value::as_str);
    let arch = model_config.get("architecture").and_then(Value::as_str);
    match (fam, arch) {
        (Some(f), Some(a)) if f == family && known(a) => 100,
        _ => 0,
    }
}

/// What a family's loader produces: the decoder's config and weights and what the host is told.
pub struct Loaded {
    /// Architecture name reported to the host (GGUF spelling).
    pub architecture: String,
    /// Decoder configuration.
    pub cfg: DecoderConfig,
    /// Decoder weights.
    pub weights: DecoderWeights,
    /// The model's own context length.
    pub context_length: u32,
    /// Special and stop tokens.
    pub specials: Specials,
    /// Whether the model takes tools (its template renders them).
    pub tools: bool,
}

/// A model served on the common decoder: the plugin `Model` of every family.
pub struct DecoderModel {
    decoder: Decoder,
    description: ModelDescription,
    tools: bool,
    /// The sentence-transformers modules of an embedding pack (`modules.json`).
    head: Option<SentenceHead>,
}

impl DecoderModel {
    /// Builds the runtime for a loaded model under the host's load config (context, sequences,
    /// threads).
    pub fn new(l: Loaded, config: &LoadConfig) -> Result<DecoderModel, PluginError> {
        let context = config
            .context_length
            .filter(|&c| c > 0)
            .map_or(l.context_length, |c| c.min(l.context_length));
        let max_seqs = config.max_sequences.filter(|&m| m > 0).unwrap_or(16);
        let threads = resolve_threads(config.threads);
        let mut cfg = l.cfg;
        let mut weights = l.weights;
        if config.options.get("dequantize").and_then(Value::as_bool) == Some(true) {
            // A reference run: f32 weights and activations, and none of llama.cpp's f16 steps
            // emulated (f16 KV cache, f16 GELU, f32-only RoPE tables).
            weights.dequantize();
            cfg.kv_f16 = false;
            cfg.rope_f32 = false;
            if cfg.activation == Activation::GeluTanhF16 {
                cfg.activation = Activation::GeluTanh;
            }
        }
        match config.options.get("quantize").and_then(Value::as_str) {
            None => {}
            Some("q8_0") => weights.quantize_q8_0(),
            Some(q) => {
                return Err(PluginError::invalid_argument(format!(
                    "quantize: {q:?} is not offered (q8_0 is)"
                )))
            }
        }
        if let Some(n) = config.options.get("snapshots").and_then(Value::as_u64) {
            cfg.max_snapshots = n as usize;
        }
        if let Some(n) = config.options.get("snapshot_every").and_then(Value::as_u64) {
            cfg.snapshot_every = (n as usize).max(1);
        }
        // Packed now and held once, so the first request does not wait for packing; what was
        // packed is kept next to the pack for the next load.
        weights.for_serving();
        let pack_report = weights.store_packed();
        let vocab = weights.output.rows as u32;
        let head = SentenceHead::load(&config.pack_dir, cfg.hidden, context)?;
        if cfg.bidirectional && head.is_none() {
            return Err(bad(
                "a bidirectional (embedding) model needs its sentence-transformers modules.json",
            ));
        }
        let decoder = Decoder::new(cfg, weights, max_seqs as usize, context as usize, threads);
        let description = ModelDescription {
            vocab_size: vocab,
            context_length: context,
            max_sequences: max_seqs,
            capabilities: if l.tools { CAP_TOOLS } else { 0 },
            stop_tokens: l.specials.stop_tokens,
            extra: json!({
                "architecture": l.architecture,
                "special_tokens": l.specials.special,
                "threads": threads,
                "pack_cache": {
                    "read": pack_report.read,
                    "packed": pack_report.packed,
                    "written": pack_report.written,
                    "error": pack_report.error,
                },
            }),
            rewind: decoder.rewind(),
        };
        Ok(DecoderModel {
            decoder,
            description,
            tools: l.tools,
            head,
        })
    }

    /// The underlying decoder (configuration, weights, caches).
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// [`Model::decode`] with some rows' input embeddings given by the caller
    /// ([`Decoder::decode_with_embeddings`]: image features at image-token rows).
    pub fn decode_with_embeddings(
        &mut self,
        batch: &BatchView<'_>,
        embeds: &[(usize, &[f32])],
        logits: &mut LogitsOut<'_>,
    ) -> Result<(), PluginError> {
        self.decoder.decode_with_embeddings(batch, embeds, logits)
    }

    /// Runs a batch whose rows holding `image_token` take the rows of `features` (the
    /// concatenated image features of the batch, hidden-size rows) in batch order; their count
    /// must equal those rows'. Otherwise the plugin `decode` contract.
    pub fn decode_with_token_features(
        &mut self,
        batch: &BatchView<'_>,
        image_token: i32,
        features: &[f32],
        logits: &mut LogitsOut<'_>,
    ) -> Result<(), PluginError> {
        let h = self.decoder.cfg.hidden;
        let rows: Vec<usize> = (0..batch.tokens.len())
            .filter(|&i| batch.tokens[i] == image_token)
            .collect();
        if features.len() != rows.len() * h {
            return Err(PluginError::invalid_argument(format!(
                "{} image-token rows, {} feature values (rows of {h})",
                rows.len(),
                features.len()
            )));
        }
        let embeds: Vec<(usize, &[f32])> = rows.into_iter().zip(features.chunks_exact(h)).collect();
        self.decoder.decode_with_embeddings(batch, &embeds, logits)
    }
}

impl Model for DecoderModel {
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

    fn embedding(&self) -> Option<EmbeddingSpec> {
        self.head.as_ref().map(SentenceHead::spec)
    }

    fn embed(&mut self, sequences: &[&[i32]]) -> Result<Vec<f32>, PluginError> {
        let head = self.head.as_ref().ok_or_else(|| {
            PluginError::unsupported("embed: the pack has no sentence-transformers modules")
        })?;
        let states = self.decoder.embed_states(sequences)?;
        let lens: Vec<usize> = sequences.iter().map(|s| s.len()).collect();
        Ok(head.apply(&states, &lens, self.decoder.cfg.hidden, self.decoder.threads))
    }
}

/// Defines a family plugin on the common runtime and exports it: the family type, its manifest
/// (named after the family; GGUF and safetensors), the probe (`knows` accepts an architecture),
/// and `create` (the GGUF or safetensors loader, then an optional `adjust` of what it loaded).
#[macro_export]
macro_rules! decoder_family {
    (
        $family:ident,
        name: $name:literal,
        description: $description:literal,
        architectures: $architectures:expr,
        knows: $knows:expr,
        gguf: $gguf:path,
        safetensors: $safetensors:path
        $(, adjust: $adjust:path)? $(,)?
    ) => {
        /// The family type exported by this plugin.
        pub struct $family;

        impl $crate::family::api::Family for $family {
            type Model = $crate::DecoderModel;

            fn manifest() -> $crate::family::api::PluginManifest {
                $crate::family::family_manifest($name, env!("CARGO_PKG_VERSION"), $description, &$architectures)
            }

            fn probe(model_config: &$crate::family::Value) -> u32 {
                $crate::family::probe_family(model_config, $name, $knows)
            }

            fn create(
                config: &$crate::family::api::LoadConfig,
            ) -> Result<$crate::DecoderModel, $crate::family::api::PluginError> {
                #[allow(unused_mut)]
                let mut loaded = $crate::family::load_pack(config, $gguf, $safetensors)?;
                $($adjust(&mut loaded, config);)?
                $crate::DecoderModel::new(loaded, config)
            }
        }

        $crate::family::api::export_plugin!($family);
    };
}
