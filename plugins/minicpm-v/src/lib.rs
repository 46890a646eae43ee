//! The MiniCPM-V plugin, from HF safetensors:
//!
//! - MiniCPM-V 4.6 (`minicpmv4_6`, `MiniCPMV4_6ForConditionalGeneration`): the vision tower and
//!   merger are `berth-plugin-common`'s [`MiniCpmV46Vision`]; the language model is Qwen3.5
//!   (`qwen3_5_text`) with `berth-plugin-qwen3`'s weight map.
//! - MiniCPM-V 4.0 and 4.5 (`minicpmv`, `MiniCPMV`, `version` 4.0 / 4.5; see [`v4`]): the
//!   Idefics2 tower and the perceiver resampler (`query_num` rows per slice), with a Llama (4.0)
//!   or Qwen3 (4.5) language model under `llm.*`; the image token is `<unk>`.
//!
//! Each image's features (one row of the language model's width per image token) take the
//! place of the token embeddings at the image-token positions, in order, as transformers'
//! `masked_scatter` places them; positions stay plain 1-D (the model passes no M-RoPE ids).

#![warn(missing_docs)]

use berth_plugin_api::{
    BatchView, Family, ImageInput, LoadConfig, LogitsOut, Model, ModelDescription, PixelLayout, PluginError,
    PluginManifest, PreparedImage, RgbView, VisionSpec,
};
use berth_plugin_common::family::{
    bad, chat_template, family_manifest, open_weights, probe_family, read_json, template_has_tools, HfConfig,
    Loaded, Specials,
};
use berth_plugin_common::vision::minicpmv4_6::MiniCpmV46Vision;
use berth_plugin_common::vision::preprocess::minicpmv::{self as preprocess, MiniCpmVScheme};
use berth_plugin_common::vision::preprocess::{rgb_image, token_text};
use berth_plugin_common::vision::VisionConfig;
use berth_plugin_common::{DecoderModel, MoeConfig, Weights};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};

// Qwen3.5's config and weight map live in plugins/common: depending on the qwen3 plugin crate
// would link its exported plugin entry points into this library as well.
use berth_plugin_common::qwen35;

pub mod v4;

use v4::V4Vision;

/// Architectures served: HF `model_type`s (`minicpmv` is 4.0 / 4.5, by its `version`).
pub const ARCHITECTURES: [&str; 2] = ["minicpmv4_6", "minicpmv"];

/// Whether an architecture or model type name is one this plugin serves.
pub fn knows(arch: &str) -> bool {
    matches!(
        arch.to_ascii_lowercase().as_str(),
        "minicpmv4_6" | "minicpmv4_6forconditionalgeneration" | "minicpmv"
    )
}

/// Special tokens looked up by text in the vocabulary and reported in the model info (the
/// Qwen3.5 tokenizer's chat markers and MiniCPM-V's image layout markers).
const SPECIAL_TOKENS: [&str; 9] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<image>",
    "</image>",
    "<slice>",
    "</slice>",
];

/// Special tokens that end generation when present.
const STOP_TEXTS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// The Qwen3.5 language model of a `minicpmv4_6` pack: `text_config` and the tensors under
/// `model.language_model.*`.
fn load_text(w: Weights, config: &LoadConfig, c: &Value) -> Result<Loaded, PluginError> {
    let tc = c
        .get("text_config")
        .ok_or_else(|| bad("config.json: minicpmv4_6 without text_config"))?;
    let kind = tc.get("model_type").and_then(Value::as_str).unwrap_or("");
    let moe = match kind {
        "qwen3_5_text" => false,
        "qwen3_5_moe_text" => true,
        _ => return Err(bad(format!("text_config: model_type {kind:?} is not Qwen3.5"))),
    };
    let hc = HfConfig(tc);
    let mut cfg = hc.decoder_config()?;
    cfg.rope_neox = true;
    cfg.qkv_bias = hc.flag("attention_bias").unwrap_or(false);
    cfg.qk_norm = true;
    if moe {
        cfg.moe = Some(MoeConfig::softmax(
            hc.req("num_experts")?,
            hc.req("num_experts_per_tok")?,
            hc.flag("norm_topk_prob").unwrap_or(true),
        ));
    }
    let weights = qwen35::load_hf(&w, &mut cfg, &hc)?;
    let dir = &config.pack_dir;
    let template = chat_template(&w, dir);
    Ok(Loaded {
        architecture: "minicpmv4_6".into(),
        cfg,
        weights,
        context_length: hc.num("max_position_embeddings").unwrap_or(32768) as u32,
        specials: Specials::from_hf(dir, c, &SPECIAL_TOKENS, &STOP_TEXTS)?,
        tools: template_has_tools(template.as_deref()),
    })
}

/// The MiniCPM-V family (plugin name `minicpm-v`).
pub struct MiniCpmVFamily;

impl Family for MiniCpmVFamily {
    type Model = MiniCpmVModel;

    fn manifest() -> PluginManifest {
        let mut m = family_manifest(
            "minicpm-v",
            env!("CARGO_PKG_VERSION"),
            "MiniCPM-V 4.0, 4.5 and 4.6 vision-language models (safetensors)",
            &ARCHITECTURES,
        );
        m.weight_formats = vec!["safetensors".into()];
        m
    }

    fn probe(model_config: &Value) -> u32 {
        probe_family(model_config, "minicpm-v", knows)
    }

    fn create(config: &LoadConfig) -> Result<MiniCpmVModel, PluginError> {
        MiniCpmVModel::load(config)
    }
}

berth_plugin_api::export_plugin!(MiniCpmVFamily);

/// The vision side of a MiniCPM-V model.
#[derive(Clone, Debug)]
pub enum MiniCpmVVision {
    /// 4.6: the NaViT tower with its window merger, and the merger.
    V46(Box<MiniCpmV46Vision>),
    /// 4.0 / 4.5: the Idefics2 tower and the resampler.
    V4(Box<V4Vision>),
}

impl MiniCpmVVision {
    /// The tower's shape.
    pub fn config(&self) -> &VisionConfig {
        match self {
            MiniCpmVVision::V46(v) => &v.config,
            MiniCpmVVision::V4(v) => &v.tower.config,
        }
    }
}

/// A loaded MiniCPM-V model: the language model (Qwen3.5 for 4.6, Llama for 4.0, Qwen3 for
/// 4.5), the vision side, and the image features each sequence still has to take in.
pub struct MiniCpmVModel {
    /// The language model.
    pub text: DecoderModel,
    /// The vision tower and merger or resampler.
    pub vision: MiniCpmVVision,
    /// The image placeholder token whose rows take image features.
    pub image_token_id: i32,
    /// The `minicpmv` preprocessing settings (`VisionSpec::params`).
    params: Map<String, Value>,
    /// How images are prepared ([`Model::prepare_image`]), from `params`.
    scheme: MiniCpmVScheme,
    /// Per sequence: feature rows not yet decoded, by position.
    pending: HashMap<i32, BTreeMap<usize, Vec<f32>>>,
}

/// The image processor's settings: `preprocessor_config.json` where the pack has one, else
/// transformers' `MiniCPMV4_6ImageProcessor` defaults; the patch size and downsample mode are
/// the model's own.
fn preprocess_params(
    config: &LoadConfig,
    c: &Value,
    patch: usize,
) -> Result<Map<String, Value>, PluginError> {
    let path = config.pack_dir.join("preprocessor_config.json");
    let pre = if path.is_file() {
        read_json(&path)?
    } else {
        json!({})
    };
    let get = |k: &str, default: Value| pre.get(k).cloned().unwrap_or(default);
    let downsample = c
        .get("downsample_mode")
        .and_then(Value::as_str)
        .unwrap_or("16x")
        .to_string();
    let divisor = if downsample == "4x" { 4 } else { 16 };
    let mut m = Map::new();
    m.insert("max_slice_nums".into(), get("max_slice_nums", json!(9)));
    m.insert("scale_resolution".into(), get("scale_resolution", json!(448)));
    m.insert("patch_size".into(), json!(patch));
    m.insert("slice_mode".into(), get("slice_mode", json!(true)));
    m.insert("downsample_mode".into(), json!(downsample));
    m.insert("image_token_divisor".into(), json!(divisor));
    m.insert("use_image_id".into(), get("use_image_id", json!(true)));
    m.insert("image_mean".into(), get("image_mean", json!([0.5, 0.5, 0.5])));
    m.insert("image_std".into(), get("image_std", json!([0.5, 0.5, 0.5])));
    Ok(m)
}

impl MiniCpmVModel {
    /// Loads a MiniCPM-V safetensors pack: 4.6 ([`MiniCpmVModel::load_v46`]) or, for
    /// `model_type` `minicpmv`, 4.0 / 4.5 as its `version` says ([`MiniCpmVModel::load_v4`]).
    pub fn load(config: &LoadConfig) -> Result<MiniCpmVModel, PluginError> {
        let c = read_json(&config.pack_dir.join("config.json"))?;
        let kind = c.get("model_type").and_then(Value::as_str).unwrap_or("");
        match kind.to_ascii_lowercase().as_str() {
            "minicpmv" => Self::load_v4(config, &c),
            k if knows(k) => Self::load_v46(config, &c),
            _ => Err(bad(format!(
                "config.json: model_type {kind:?} is not minicpmv4_6 or minicpmv"
            ))),
        }
    }

    /// Loads a MiniCPM-V 4.0 / 4.5 pack: `llm.*` as the Llama or Qwen3 backbone (top-level
    /// fields of `config.json`), `vpm.*` and `resampler.*`; the image token is `<unk>`.
    pub fn load_v4(config: &LoadConfig, c: &Value) -> Result<MiniCpmVModel, PluginError> {
        let version = v4::Version::from_config(c)?;
        let image_token_id = v4::token_id(&config.pack_dir, "<unk>")?;
        let w = open_weights(config)?;
        if w.gguf().is_some() {
            return Err(bad("minicpmv is read from safetensors packs only"));
        }
        let vision = V4Vision::load(&w, c)?;
        let loaded = v4::load_text(w, config, c, version)?;
        let width = vision.resampler.embed_dim();
        if width != loaded.cfg.hidden {
            return Err(bad(format!(
                "the resampler gives {width} values per token; the language model's width is {}",
                loaded.cfg.hidden
            )));
        }
        let params = v4::preprocess_params(
            config,
            c,
            vision.tower.config.patch_size,
            vision.resampler.num_queries,
        )?;
        Self::assemble(
            config,
            loaded,
            MiniCpmVVision::V4(Box::new(vision)),
            image_token_id,
            params,
        )
    }

    /// Loads a `minicpmv4_6` safetensors pack: `model.language_model.*` as the Qwen3.5
    /// backbone (`text_config`), `model.vision_tower.*` and `model.merger.*` (`vision_config`).
    pub fn load_v46(config: &LoadConfig, c: &Value) -> Result<MiniCpmVModel, PluginError> {
        let c = c.clone();
        let image_token_id =
            c.get("image_token_id")
                .and_then(Value::as_i64)
                .ok_or_else(|| bad("config.json: minicpmv4_6 without image_token_id"))? as i32;
        let w = open_weights(config)?;
        if w.gguf().is_some() {
            return Err(bad("minicpmv4_6 is read from safetensors packs only"));
        }
        let vision = MiniCpmV46Vision::load(&w, "model.", &c)?;
        let loaded = load_text(w, config, &c)?;
        let width = vision.merger.last().map(|m| m.linear_2.weight.rows);
        if width != Some(loaded.cfg.hidden) {
            return Err(bad(format!(
                "the merger gives {width:?} values per token; the language model's width is {}",
                loaded.cfg.hidden
            )));
        }
        let params = preprocess_params(config, &c, vision.config.patch_size)?;
        Self::assemble(
            config,
            loaded,
            MiniCpmVVision::V46(Box::new(vision)),
            image_token_id,
            params,
        )
    }

    /// The model from its loaded parts and host preprocessing settings, after checking the
    /// image token against the vocabulary.
    fn assemble(
        config: &LoadConfig,
        loaded: Loaded,
        vision: MiniCpmVVision,
        image_token_id: i32,
        params: Map<String, Value>,
    ) -> Result<MiniCpmVModel, PluginError> {
        let vocab = loaded.weights.embed.rows;
        if image_token_id < 0 || image_token_id as usize >= vocab {
            return Err(bad(format!(
                "image token {image_token_id} outside the vocabulary ({vocab})"
            )));
        }
        // The image token's text as the pack's tokenizer has it (`<unk>` for 4.0 / 4.5).
        let image_token = token_text(&config.pack_dir, image_token_id).unwrap_or_else(|| "<unk>".into());
        let scheme =
            MiniCpmVScheme::from_params(&params, vision.config().patch_size, image_token).map_err(bad)?;
        Ok(MiniCpmVModel {
            text: DecoderModel::new(loaded, config)?,
            vision,
            image_token_id,
            params,
            scheme,
            pending: HashMap::new(),
        })
    }

    /// Side of the patch block that becomes one image token (4.6: the ViT merger's window
    /// times the merger's blocks; 4.x: any grid, so 1).
    fn token_block(&self) -> usize {
        match &self.vision {
            MiniCpmVVision::V46(v) => {
                let window = v.vit_merger.as_ref().map_or(1, |(_, m)| m.window);
                window * v.merge.pow(v.merger.len() as u32)
            }
            MiniCpmVVision::V4(_) => 1,
        }
    }

    /// Image tokens an image (or slice) of `(h, w)` patches takes in the prompt (4.x: always
    /// `query_num`).
    pub fn image_tokens(&self, (h, w): (usize, usize)) -> usize {
        match &self.vision {
            MiniCpmVVision::V46(_) => {
                let b = self.token_block();
                (h / b) * (w / b)
            }
            MiniCpmVVision::V4(v) => v.resampler.num_queries,
        }
    }

    /// Checks a patch grid against what the vision side takes.
    fn check_grid(&self, grid: (usize, usize)) -> Result<(), PluginError> {
        let b = self.token_block();
        if grid.0 == 0 || grid.1 == 0 || !grid.0.is_multiple_of(b) || !grid.1.is_multiple_of(b) {
            return Err(PluginError::invalid_argument(format!(
                "a {}x{} patch grid is not whole {b}x{b} token blocks",
                grid.0, grid.1
            )));
        }
        Ok(())
    }

    /// One image's features: [`MiniCpmVModel::image_tokens`] rows of the language model's
    /// width. `strip` is `channels × patch × (h·w·patch)` pixels (the patches side by side,
    /// row-major over the grid); `grid` is `(h, w)` in patches.
    pub fn image_features(&self, strip: &[f32], grid: (usize, usize)) -> Result<Vec<f32>, PluginError> {
        self.check_grid(grid)?;
        let threads = self.text.decoder().threads;
        match &self.vision {
            MiniCpmVVision::V46(v) => Ok(v.forward(strip, grid, threads)?.features),
            MiniCpmVVision::V4(v) => v.features(strip, grid, threads),
        }
    }

    /// One image's vision-tower output before the merger or resampler, `h·w` rows of the
    /// tower's width (4.x only; 4.6's tower merges patches on the way and gives `None`).
    pub fn vision_hidden(
        &self,
        strip: &[f32],
        grid: (usize, usize),
    ) -> Result<Option<Vec<f32>>, PluginError> {
        self.check_grid(grid)?;
        let threads = self.text.decoder().threads;
        match &self.vision {
            MiniCpmVVision::V46(_) => Ok(None),
            MiniCpmVVision::V4(v) => v.hidden(strip, grid, threads).map(Some),
        }
    }

    /// Runs a batch whose image-token rows take the rows of `features` (the concatenated
    /// features of the batch's images), in batch order; their count must equal the image-token
    /// rows'. Otherwise the plugin `decode` contract.
    pub fn decode_with_features(
        &mut self,
        batch: &BatchView<'_>,
        features: &[f32],
        logits: &mut LogitsOut<'_>,
    ) -> Result<(), PluginError> {
        self.text
            .decode_with_token_features(batch, self.image_token_id, features, logits)
    }

    /// Image feature rows sequence `seq` holds for positions not yet decoded.
    pub fn pending_rows(&self, seq: i32) -> usize {
        self.pending.get(&seq).map_or(0, BTreeMap::len)
    }

    /// Checks one validated [`ImageInput`] against the model and encodes it: one feature row
    /// per placeholder position.
    fn encode_one(&self, image: &ImageInput<'_>) -> Result<Vec<f32>, PluginError> {
        let (c, p) = (self.vision.config().num_channels, self.vision.config().patch_size);
        let (rows, cols) = image
            .grid
            .ok_or_else(|| PluginError::invalid_argument("a minicpmv image needs its patch grid"))?;
        let grid = (rows as usize, cols as usize);
        let want = [c, p, grid.0 * grid.1 * p];
        if image.shape.len() != 3 || image.shape.iter().zip(want).any(|(&a, b)| a as usize != b) {
            return Err(PluginError::invalid_argument(format!(
                "image shape {:?}; a {}x{} patch strip is {want:?}",
                image.shape, grid.0, grid.1
            )));
        }
        if image.patch_mask.is_some_and(|m| m.contains(&0)) {
            return Err(PluginError::invalid_argument(
                "a minicpmv patch strip has no padding patches",
            ));
        }
        let n = self.image_tokens(grid);
        if image.positions.len() != n {
            return Err(PluginError::invalid_argument(format!(
                "a {}x{} patch grid gives {n} image tokens; {} positions given",
                grid.0,
                grid.1,
                image.positions.len()
            )));
        }
        self.image_features(image.pixels, grid)
    }
}

impl Model for MiniCpmVModel {
    fn describe(&self) -> ModelDescription {
        self.text.describe()
    }

    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        batch.validate()?;
        let mut used = Vec::new();
        for i in 0..batch.len() {
            let (seq, pos) = (batch.seq_ids[i], batch.positions[i]);
            let feature = usize::try_from(pos)
                .ok()
                .and_then(|p| self.pending.get(&seq)?.get(&p).map(|f| (p, f)));
            match feature {
                Some((p, f)) => used.push((i, seq, p, f.as_slice())),
                None if batch.tokens[i] == self.image_token_id => {
                    return Err(PluginError::invalid_argument(format!(
                        "sequence {seq}: image token at position {pos} without an encoded image"
                    )))
                }
                None => {}
            }
        }
        let embeds: Vec<(usize, &[f32])> = used.iter().map(|&(i, _, _, f)| (i, f)).collect();
        self.text.decode_with_embeddings(batch, &embeds, logits)?;
        let done: Vec<(i32, usize)> = used.iter().map(|&(_, s, p, _)| (s, p)).collect();
        for (seq, pos) in done {
            if let Some(m) = self.pending.get_mut(&seq) {
                m.remove(&pos);
            }
        }
        self.pending.retain(|_, m| !m.is_empty());
        Ok(())
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        let pos = self.text.decoder().seq_len(seq)? as i32;
        let batch = BatchView {
            tokens: &[token],
            positions: &[pos],
            seq_ids: &[seq],
            want_logits: &[0],
        };
        let vocab = self.text.decoder().vocab_size();
        self.decode(&batch, &mut LogitsOut::new(&mut [], vocab))
    }

    fn thinking_enabled(&self, requested: Option<bool>) -> bool {
        self.text.thinking_enabled(requested)
    }

    fn tools_enabled(&self) -> bool {
        self.text.tools_enabled()
    }

    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        self.text.seq_truncate(seq, len)?;
        if let Some(m) = self.pending.get_mut(&seq) {
            m.retain(|&p, _| p < len as usize);
            if m.is_empty() {
                self.pending.remove(&seq);
            }
        }
        Ok(())
    }

    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        self.text.seq_fork(src, dst)?;
        match self.pending.get(&src).cloned() {
            Some(m) => self.pending.insert(dst, m),
            None => self.pending.remove(&dst),
        };
        Ok(())
    }

    fn vision(&self) -> Option<VisionSpec> {
        Some(VisionSpec {
            scheme: "minicpmv".into(),
            layout: PixelLayout::PatchStrip,
            patch_size: self.vision.config().patch_size as u32,
            image_token_id: self.image_token_id,
            params: self.params.clone(),
        })
    }

    fn prepare_image(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        preprocess::prepare(&self.scheme, &rgb_image(image), index)
    }

    fn encode_images(&mut self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        let start = self.text.decoder().seq_len(seq)?;
        let h = self.text.decoder().cfg.hidden;
        let held = self.pending.get(&seq);
        let mut new: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
        for (k, image) in images.iter().enumerate() {
            image.validate()?;
            for &p in image.positions {
                let p = p as usize;
                if p < start {
                    return Err(PluginError::invalid_argument(format!(
                        "image {k}: position {p} of sequence {seq} is already decoded ({start} held)"
                    )));
                }
                if new.contains_key(&p) || held.is_some_and(|m| m.contains_key(&p)) {
                    return Err(PluginError::invalid_argument(format!(
                        "image {k}: position {p} of sequence {seq} already has image features"
                    )));
                }
                // Reserve the position; the features follow once the image is encoded.
                new.insert(p, Vec::new());
            }
        }
        for image in images {
            let features = self.encode_one(image)?;
            for (&p, row) in image.positions.iter().zip(features.chunks_exact(h)) {
                new.insert(p as usize, row.to_vec());
            }
        }
        self.pending.entry(seq).or_default().extend(new);
        Ok(())
    }
}
