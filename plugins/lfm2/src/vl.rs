//! LFM2-VL (`lfm2_vl`, `Lfm2VlForConditionalGeneration`): the LFM2 language model with a
//! SigLIP2 NaViT vision tower and the pixel-unshuffle projector. Each image's features (one row
//! of the language model's width per image token) take the place of the token embeddings at the
//! image-token positions of the prompt, in order, as transformers' `masked_scatter` places them.
//!
//! This module is the tower choice ([`Lfm2VlVision`]), the weight map and the image
//! preparation rule (`berth-plugin-common`'s `lfm2_vl` scheme, layout `patches`, with this
//! pack's processor settings); the plugin `Model`, with its rule for pending image features, is
//! `berth-plugin-common`'s [`VisionLanguageModel`].

use berth_plugin_api::{ImageInput, LoadConfig, PixelLayout, PluginError, VisionSpec};
use berth_plugin_common::family::{bad, open_weights, read_json, weight_files};
use berth_plugin_common::vision::lfm2_vl::Lfm2VlProjector;
use berth_plugin_common::vision::preprocess::lfm2_vl::Lfm2VlScheme;
use berth_plugin_common::vision::preprocess::token_text;
use berth_plugin_common::vision::siglip2::Siglip2VisionModel;
use berth_plugin_common::vision::VisionConfig;
use berth_plugin_common::{VisionLanguageModel, VisionTower, WeightFormat};
use serde_json::{json, Map, Value};
use std::path::Path;

/// The image placeholder of the LFM2-VL tokenizers (`<image>`), when the config names none.
const DEFAULT_IMAGE_TOKEN: i64 = 396;

/// One image as the SigLIP2 processor gives it: `mask.len()` patch slots of
/// `channels · patch²` values each (padded), which slots are real, and the `(h, w)` patch grid.
#[derive(Clone, Copy, Debug)]
pub struct ImagePatches<'a> {
    /// Flattened patches, `mask.len() × channels · patch²`.
    pub patches: &'a [f32],
    /// Whether each patch slot holds a real patch.
    pub mask: &'a [bool],
    /// The image's patch grid (rows, columns).
    pub grid: (usize, usize),
}

/// Whether a pack loads as LFM2-VL: safetensors weights and a `config.json` whose
/// `model_type` is `lfm2_vl` (a GGUF LFM2-VL pack holds only the language model).
pub fn is_vl_pack(config: &LoadConfig) -> bool {
    let safetensors = matches!(weight_files(config), Ok((WeightFormat::Safetensors, _)));
    safetensors
        && read_json(&config.pack_dir.join("config.json"))
            .ok()
            .is_some_and(|c| c.get("model_type").and_then(Value::as_str) == Some("lfm2_vl"))
}

/// A loaded LFM2-VL model: the LFM2 language model with [`Lfm2VlVision`] (the plugin `Model`
/// and the pending-feature rule are [`VisionLanguageModel`]'s).
pub type Lfm2VlModel = VisionLanguageModel<Lfm2VlVision>;

/// LFM2-VL's vision side: the SigLIP2 NaViT encoder and the pixel-unshuffle projector.
pub struct Lfm2VlVision {
    /// The SigLIP2 vision tower.
    pub encoder: Siglip2VisionModel,
    /// The projector into the language model's width.
    pub projector: Lfm2VlProjector,
}

/// Loads an `lfm2_vl` safetensors pack: `model.language_model.*` as the LFM2 backbone,
/// `model.vision_tower.*` and `model.multi_modal_projector.*`.
pub fn load(config: &LoadConfig) -> Result<Lfm2VlModel, PluginError> {
    let c = read_json(&config.pack_dir.join("config.json"))?;
    let kind = c.get("model_type").and_then(Value::as_str);
    if kind != Some("lfm2_vl") {
        return Err(bad(format!("config.json: model_type {kind:?} is not lfm2_vl")));
    }
    let vision = c
        .get("vision_config")
        .ok_or_else(|| bad("config.json: lfm2_vl without vision_config"))?;
    let image_token_id = c
        .get("image_token_id")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_IMAGE_TOKEN) as i32;
    let w = open_weights(config)?;
    if w.gguf().is_some() {
        return Err(bad("lfm2_vl is read from safetensors packs only"));
    }
    let encoder = Siglip2VisionModel::load(&w, "model.vision_tower.", VisionConfig::from_json(vision)?)?;
    let projector = Lfm2VlProjector::load(&w, "model.", &c)?;
    let loaded = crate::load_safetensors(w, config)?;
    let spec = vision_spec(
        &config.pack_dir,
        &c,
        &encoder.config,
        projector.factor,
        image_token_id,
    )?;
    let scheme = image_scheme(&config.pack_dir, &spec)?;
    let tower = Lfm2VlVision { encoder, projector };
    VisionLanguageModel::new(loaded, config, tower, spec, Box::new(scheme))
}

impl Lfm2VlVision {
    /// Image tokens an image of `(h, w)` patches takes in the prompt.
    pub fn image_tokens(&self, (h, w): (usize, usize)) -> usize {
        self.projector.tokens(h, w)
    }

    /// One image's features: [`Lfm2VlVision::image_tokens`] rows of the language model's width,
    /// row-major over the downsampled patch grid.
    pub fn image_features(&self, image: &ImagePatches<'_>, threads: usize) -> Result<Vec<f32>, PluginError> {
        let out = self
            .encoder
            .forward(image.patches, image.mask, image.grid, false, threads)?;
        self.projector
            .forward(&out.last_hidden_state, image.grid, threads)
    }

    /// The patch grid of an image handed over the ABI and how many of its patches are real,
    /// after checking `[N, channels · patch²]` patches and a mask whose real patches are the
    /// grid's.
    fn grid_of(&self, img: &ImageInput<'_>) -> Result<((usize, usize), usize), PluginError> {
        let inv = |m: String| PluginError::invalid_argument(m);
        let cols = self.encoder.patch_embedding.weight.cols;
        let &[n, c] = img.shape else {
            return Err(inv(format!(
                "shape {:?}; patches [N, {cols}] expected",
                img.shape
            )));
        };
        let n = n as usize;
        if c as usize != cols {
            return Err(inv(format!(
                "patches of {c} values; the vision tower takes {cols}"
            )));
        }
        let (h, w) = img
            .grid
            .map(|(h, w)| (h as usize, w as usize))
            .ok_or_else(|| inv("no patch grid".into()))?;
        let real = match img.patch_mask {
            Some(m) if m.len() != n => return Err(inv(format!("patch mask of {} for {n} patches", m.len()))),
            Some(m) => m.iter().filter(|&&b| b != 0).count(),
            None => n,
        };
        if real != h * w {
            return Err(inv(format!("{real} real patches for a {h}x{w} patch grid")));
        }
        Ok(((h, w), real))
    }
}

impl VisionTower for Lfm2VlVision {
    fn feature_width(&self) -> usize {
        self.projector.linear_2.weight.rows
    }

    fn image_tokens_of(&self, image: &ImageInput<'_>) -> Result<usize, PluginError> {
        Ok(self.image_tokens(self.grid_of(image)?.0))
    }

    /// Padding patches after the real ones change nothing (they are masked out of attention and
    /// the projector reads the grid's rows only), so only the real ones are encoded when they
    /// lead.
    fn encode(&self, img: &ImageInput<'_>, threads: usize) -> Result<Vec<f32>, PluginError> {
        let (grid, real) = self.grid_of(img)?;
        let cols = self.encoder.patch_embedding.weight.cols;
        let leading = img.patch_mask.is_none_or(|m| m[..real].iter().all(|&b| b != 0));
        let (patches, mask): (&[f32], Vec<bool>) = match img.patch_mask {
            Some(m) if !leading => (img.pixels, m.iter().map(|&b| b != 0).collect()),
            _ => (&img.pixels[..real * cols], vec![true; real]),
        };
        let image = ImagePatches {
            patches,
            mask: &mask,
            grid,
        };
        self.image_features(&image, threads)
    }
}

/// A JSON file, or an empty object when the pack has none.
fn optional_json(path: &Path) -> Result<Value, PluginError> {
    if path.exists() {
        read_json(path)
    } else {
        Ok(json!({}))
    }
}

/// The image preparation of a spec from [`vision_spec`]: its params, with the image token's text
/// from the pack's tokenizer (else `tokenizer_config.json`'s `image_token`).
fn image_scheme(dir: &Path, spec: &VisionSpec) -> Result<Lfm2VlScheme, PluginError> {
    let image_token = token_text(dir, spec.image_token_id)
        .or_else(|| spec.params.get("image_token")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "<image>".into());
    Lfm2VlScheme::from_params(&spec.params, spec.patch_size as usize, image_token).map_err(bad)
}

/// What images are prepared with, as `Lfm2VlImageProcessor` does, with placeholders expanded
/// as `Lfm2VlProcessor` does: the image processor's settings under its own names
/// (from `preprocessor_config.json`, else transformers' defaults; the downsample factor and the
/// patch size are the model's own and must agree), the marker tokens (`tokenizer_config.json`)
/// and whether they are used (`processor_config.json`).
fn vision_spec(
    dir: &Path,
    config: &Value,
    vision: &VisionConfig,
    factor: usize,
    image_token_id: i32,
) -> Result<VisionSpec, PluginError> {
    let pre = optional_json(&dir.join("preprocessor_config.json"))?;
    let mut params: Map<String, Value> = Map::new();
    let model_own = [
        ("downsample_factor", json!(factor)),
        ("encoder_patch_size", json!(vision.patch_size)),
    ];
    for (key, value) in model_own {
        if let Some(v) = pre.get(key).filter(|v| **v != value) {
            return Err(bad(format!(
                "preprocessor_config.json: {key} {v}; the model's is {value}"
            )));
        }
        params.insert(key.into(), value);
    }
    if let Some(v) = config
        .get("downsample_factor")
        .filter(|v| v.as_u64() != Some(factor as u64))
    {
        return Err(bad(format!(
            "config.json: downsample_factor {v}; the projector's is {factor}"
        )));
    }
    let defaults = [
        ("do_image_splitting", json!(true)),
        ("min_tiles", json!(2)),
        ("max_tiles", json!(10)),
        ("use_thumbnail", json!(true)),
        ("min_image_tokens", json!(64)),
        ("max_image_tokens", json!(256)),
        ("tile_size", json!(512)),
        ("max_pixels_tolerance", json!(2.0)),
        ("image_mean", json!([0.5, 0.5, 0.5])),
        ("image_std", json!([0.5, 0.5, 0.5])),
    ];
    for (key, default) in defaults {
        let v = pre.get(key).cloned().unwrap_or(default);
        let ok = match key {
            "image_mean" | "image_std" => v
                .as_array()
                .is_some_and(|a| a.len() == 3 && a.iter().all(Value::is_number)),
            _ => v.is_boolean() || v.is_number(),
        };
        if !ok {
            return Err(bad(format!("preprocessor_config.json: {key} {v}")));
        }
        params.insert(key.into(), v);
    }
    let tok = optional_json(&dir.join("tokenizer_config.json"))?;
    for (key, default) in [
        ("image_token", "<image>"),
        ("image_start_token", "<|image_start|>"),
        ("image_end_token", "<|image_end|>"),
        ("image_thumbnail_token", "<|img_thumbnail|>"),
    ] {
        let v = tok.get(key).and_then(Value::as_str).unwrap_or(default);
        params.insert(key.into(), json!(v));
    }
    let proc = optional_json(&dir.join("processor_config.json"))?;
    let special = proc
        .get("use_image_special_tokens")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    params.insert("use_image_special_tokens".into(), json!(special));
    Ok(VisionSpec {
        scheme: "lfm2_vl".into(),
        layout: PixelLayout::Patches,
        patch_size: vision.patch_size as u32,
        image_token_id,
        params,
    })
}
