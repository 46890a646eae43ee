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
//!
//! This crate is the configs, the weight maps and the tower choice ([`MiniCpmVVision`]); the
//! plugin `Model`, with its rule for pending image features, is `berth-plugin-common`'s
//! [`VisionLanguageModel`].

#![warn(missing_docs)]

use berth_plugin_api::{
    Family, ImageInput, LoadConfig, PixelLayout, PluginError, PluginManifest, VisionSpec,
};
use berth_plugin_common::family::{
    bad, chat_template, family_manifest, open_weights, probe_family, read_json, template_has_tools, HfConfig,
    Loaded, Specials,
};
use berth_plugin_common::vision::minicpmv4_6::MiniCpmV46Vision;
use berth_plugin_common::vision::preprocess::minicpmv::MiniCpmVScheme;
use berth_plugin_common::vision::preprocess::token_text;
use berth_plugin_common::vision::VisionConfig;
use berth_plugin_common::{MoeConfig, VisionLanguageModel, VisionTower, Weights};
use serde_json::{json, Map, Value};

// Qwen3.5's config and weight map, from the Qwen family's library crate (not the qwen3 plugin
// crate, whose entry points would be linked in too).
use berth_qwen3_family::qwen35;

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
        load(config)
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
/// 4.5) with [`MiniCpmVVision`] (the plugin `Model` and the pending-feature rule are
/// [`VisionLanguageModel`]'s).
pub type MiniCpmVModel = VisionLanguageModel<MiniCpmVVision>;

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

/// Loads a MiniCPM-V safetensors pack: 4.6 ([`load_v46`]) or, for `model_type` `minicpmv`,
/// 4.0 / 4.5 as its `version` says ([`load_v4`]).
pub fn load(config: &LoadConfig) -> Result<MiniCpmVModel, PluginError> {
    let c = read_json(&config.pack_dir.join("config.json"))?;
    let kind = c.get("model_type").and_then(Value::as_str).unwrap_or("");
    match kind.to_ascii_lowercase().as_str() {
        "minicpmv" => load_v4(config, &c),
        k if knows(k) => load_v46(config, &c),
        _ => Err(bad(format!(
            "config.json: model_type {kind:?} is not minicpmv4_6 or minicpmv"
        ))),
    }
}

/// Loads a MiniCPM-V 4.0 / 4.5 pack: `llm.*` as the Llama or Qwen3 backbone (top-level fields
/// of `config.json`), `vpm.*` and `resampler.*`; the image token is `<unk>`.
pub fn load_v4(config: &LoadConfig, c: &Value) -> Result<MiniCpmVModel, PluginError> {
    let version = v4::Version::from_config(c)?;
    let image_token_id = v4::token_id(&config.pack_dir, "<unk>")?;
    let w = open_weights(config)?;
    if w.gguf().is_some() {
        return Err(bad("minicpmv is read from safetensors packs only"));
    }
    let vision = V4Vision::load(&w, c)?;
    let loaded = v4::load_text(w, config, c, version)?;
    let params = v4::preprocess_params(
        config,
        c,
        vision.tower.config.patch_size,
        vision.resampler.num_queries,
    )?;
    assemble(
        config,
        loaded,
        MiniCpmVVision::V4(Box::new(vision)),
        image_token_id,
        params,
    )
}

/// Loads a `minicpmv4_6` safetensors pack: `model.language_model.*` as the Qwen3.5 backbone
/// (`text_config`), `model.vision_tower.*` and `model.merger.*` (`vision_config`).
pub fn load_v46(config: &LoadConfig, c: &Value) -> Result<MiniCpmVModel, PluginError> {
    let image_token_id =
        c.get("image_token_id")
            .and_then(Value::as_i64)
            .ok_or_else(|| bad("config.json: minicpmv4_6 without image_token_id"))? as i32;
    let w = open_weights(config)?;
    if w.gguf().is_some() {
        return Err(bad("minicpmv4_6 is read from safetensors packs only"));
    }
    let vision = MiniCpmV46Vision::load(&w, "model.", c)?;
    let loaded = load_text(w, config, c)?;
    let params = preprocess_params(config, c, vision.config.patch_size)?;
    assemble(
        config,
        loaded,
        MiniCpmVVision::V46(Box::new(vision)),
        image_token_id,
        params,
    )
}

/// The model from its loaded parts and the host's preprocessing settings (scheme `minicpmv`,
/// layout `patch_strip`).
fn assemble(
    config: &LoadConfig,
    loaded: Loaded,
    vision: MiniCpmVVision,
    image_token_id: i32,
    params: Map<String, Value>,
) -> Result<MiniCpmVModel, PluginError> {
    // The image token's text as the pack's tokenizer has it (`<unk>` for 4.0 / 4.5).
    let image_token = token_text(&config.pack_dir, image_token_id).unwrap_or_else(|| "<unk>".into());
    let scheme =
        MiniCpmVScheme::from_params(&params, vision.config().patch_size, image_token).map_err(bad)?;
    let spec = VisionSpec {
        scheme: "minicpmv".into(),
        layout: PixelLayout::PatchStrip,
        patch_size: vision.config().patch_size as u32,
        image_token_id,
        params,
    };
    VisionLanguageModel::new(loaded, config, vision, spec, Box::new(scheme))
}

impl MiniCpmVVision {
    /// Side of the patch block that becomes one image token (4.6: the ViT merger's window
    /// times the merger's blocks; 4.x: any grid, so 1).
    fn token_block(&self) -> usize {
        match self {
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
        match self {
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

    /// One image's features: [`MiniCpmVVision::image_tokens`] rows of the language model's
    /// width. `strip` is `channels × patch × (h·w·patch)` pixels (the patches side by side,
    /// row-major over the grid); `grid` is `(h, w)` in patches.
    pub fn image_features(
        &self,
        strip: &[f32],
        grid: (usize, usize),
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        self.check_grid(grid)?;
        match self {
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
        threads: usize,
    ) -> Result<Option<Vec<f32>>, PluginError> {
        self.check_grid(grid)?;
        match self {
            MiniCpmVVision::V46(_) => Ok(None),
            MiniCpmVVision::V4(v) => v.hidden(strip, grid, threads).map(Some),
        }
    }

    /// The patch grid of an image handed over the ABI, after checking its patch strip.
    fn grid_of(&self, image: &ImageInput<'_>) -> Result<(usize, usize), PluginError> {
        let (c, p) = (self.config().num_channels, self.config().patch_size);
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
        self.check_grid(grid)?;
        Ok(grid)
    }
}

impl VisionTower for MiniCpmVVision {
    fn feature_width(&self) -> usize {
        match self {
            MiniCpmVVision::V46(v) => v.merger.last().map_or(0, |m| m.linear_2.weight.rows),
            MiniCpmVVision::V4(v) => v.resampler.embed_dim(),
        }
    }

    fn image_tokens_of(&self, image: &ImageInput<'_>) -> Result<usize, PluginError> {
        Ok(self.image_tokens(self.grid_of(image)?))
    }

    fn encode(&self, image: &ImageInput<'_>, threads: usize) -> Result<Vec<f32>, PluginError> {
        let grid = self.grid_of(image)?;
        self.image_features(image.pixels, grid, threads)
    }
}
