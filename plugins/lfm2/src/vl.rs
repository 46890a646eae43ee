//! LFM2-VL (`lfm2_vl`, `Lfm2VlForConditionalGeneration`): the LFM2 language model with a
//! SigLIP2 NaViT vision tower and the pixel-unshuffle projector. Each image's features (one row
//! of the language model's width per image token) take the place of the token embeddings at the
//! image-token positions of the prompt, in order, as transformers' `masked_scatter` places them.
//!
//! Through the plugin ABI (1.3) the model reports its preprocessing in [`Model::vision`]
//! (scheme `lfm2_vl`, layout `patches`), and [`Model::encode_images`] encodes each image (tile
//! or thumbnail) of a sequence and keeps its features for the placeholder positions the host
//! gives; `decode` puts them in at those rows of that sequence, over as many batches as the
//! prompt takes.

use berth_plugin_api::{
    BatchView, ImageInput, LoadConfig, LogitsOut, Model, ModelDescription, PixelLayout, PluginError,
    PreparedImage, RgbView, VisionSpec,
};
use berth_plugin_common::family::{bad, open_weights, read_json, weight_files};
use berth_plugin_common::vision::lfm2_vl::Lfm2VlProjector;
use berth_plugin_common::vision::preprocess::lfm2_vl::{self as preprocess, Lfm2VlScheme};
use berth_plugin_common::vision::preprocess::{rgb_image, token_text};
use berth_plugin_common::vision::siglip2::Siglip2VisionModel;
use berth_plugin_common::vision::VisionConfig;
use berth_plugin_common::{DecoderModel, WeightFormat};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
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

/// The features of one encoded image, waiting for (or kept for a re-decode of) the rows at its
/// placeholder positions.
#[derive(Clone, Debug)]
struct PendingImage {
    /// Sequence positions of its placeholder tokens, in order.
    positions: Vec<i32>,
    /// One row of the language model's width per position.
    features: Vec<f32>,
}

impl PendingImage {
    /// The features of the placeholder at `pos`, if it is one of this image's.
    fn row(&self, pos: i32, hidden: usize) -> Option<&[f32]> {
        let k = self.positions.iter().position(|&p| p == pos)?;
        Some(&self.features[k * hidden..(k + 1) * hidden])
    }

    /// Its first placeholder position.
    fn first(&self) -> i32 {
        self.positions.iter().copied().min().unwrap_or(0)
    }
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

/// A loaded LFM2-VL model: the language model and the vision encoder.
pub struct Lfm2VlModel {
    /// The LFM2 language model (the plugin `Model` for text).
    pub text: DecoderModel,
    /// The SigLIP2 vision tower.
    pub tower: Siglip2VisionModel,
    /// The projector into the language model's width.
    pub projector: Lfm2VlProjector,
    /// The image placeholder token whose rows take image features.
    pub image_token_id: i32,
    /// What the host is told about the model's images ([`Model::vision`]).
    spec: VisionSpec,
    /// How images are prepared ([`Model::prepare_image`]), from the spec's params.
    scheme: Lfm2VlScheme,
    /// Encoded images by sequence.
    pending: HashMap<i32, Vec<PendingImage>>,
}

impl Lfm2VlModel {
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
        let tower = Siglip2VisionModel::load(&w, "model.vision_tower.", VisionConfig::from_json(vision)?)?;
        let projector = Lfm2VlProjector::load(&w, "model.", &c)?;
        let loaded = crate::load_safetensors(w, config)?;
        if projector.linear_2.weight.rows != loaded.cfg.hidden {
            return Err(bad(format!(
                "projector gives {} values per token; the language model's width is {}",
                projector.linear_2.weight.rows, loaded.cfg.hidden
            )));
        }
        let vocab = loaded.weights.embed.rows;
        if image_token_id < 0 || image_token_id as usize >= vocab {
            return Err(bad(format!(
                "image token {image_token_id} outside the vocabulary ({vocab})"
            )));
        }
        let spec = vision_spec(
            &config.pack_dir,
            &c,
            &tower.config,
            projector.factor,
            image_token_id,
        )?;
        let scheme = image_scheme(&config.pack_dir, &spec)?;
        Ok(Lfm2VlModel {
            text: DecoderModel::new(loaded, config)?,
            tower,
            projector,
            image_token_id,
            spec,
            scheme,
            pending: HashMap::new(),
        })
    }

    /// Image tokens an image of `(h, w)` patches takes in the prompt.
    pub fn image_tokens(&self, (h, w): (usize, usize)) -> usize {
        self.projector.tokens(h, w)
    }

    /// One image's features: [`Lfm2VlModel::image_tokens`] rows of the language model's width,
    /// row-major over the downsampled patch grid.
    pub fn image_features(&self, image: &ImagePatches<'_>) -> Result<Vec<f32>, PluginError> {
        let threads = self.text.decoder().threads;
        let out = self
            .tower
            .forward(image.patches, image.mask, image.grid, false, threads)?;
        self.projector
            .forward(&out.last_hidden_state, image.grid, threads)
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

    /// Feeds `input_ids` to sequence `seq` from its current length in one batch, the features
    /// of `images` (in order) at its image tokens, and returns the logits of every row
    /// (`input_ids.len() × vocab`).
    pub fn prefill(
        &mut self,
        seq: i32,
        input_ids: &[i32],
        images: &[ImagePatches<'_>],
    ) -> Result<Vec<f32>, PluginError> {
        let mut features = Vec::new();
        for image in images {
            features.extend(self.image_features(image)?);
        }
        let start = self.text.decoder().seq_len(seq)?;
        let n = input_ids.len();
        let positions: Vec<i32> = (start..start + n).map(|p| p as i32).collect();
        let (seqs, want) = (vec![seq; n], vec![1u8; n]);
        let batch = BatchView {
            tokens: input_ids,
            positions: &positions,
            seq_ids: &seqs,
            want_logits: &want,
        };
        let vocab = self.text.describe().vocab_size as usize;
        let mut out = vec![0.0; n * vocab];
        self.decode_with_features(&batch, &features, &mut LogitsOut::new(&mut out, vocab))?;
        Ok(out)
    }
}

/// The text model's width.
fn hidden_of(m: &DecoderModel) -> usize {
    m.decoder().cfg.hidden
}

impl Lfm2VlModel {
    /// The features of one image handed over the ABI: `[N, channels · patch²]` patches, a
    /// patch mask whose real patches are as many as the `grid`'s, and one placeholder position
    /// per image token of the grid. Padding patches after the real ones change nothing (they
    /// are masked out of attention and the projector reads the grid's rows only), so only the
    /// real ones are encoded when they lead.
    fn encode_input(&self, i: usize, img: &ImageInput<'_>) -> Result<Vec<f32>, PluginError> {
        let inv = |m: String| PluginError::invalid_argument(format!("image {i}: {m}"));
        let cols = self.tower.patch_embedding.weight.cols;
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
        let tokens = self.image_tokens((h, w));
        if img.positions.len() != tokens {
            return Err(inv(format!(
                "{} placeholder positions; a {h}x{w} patch grid gives {tokens} image tokens",
                img.positions.len()
            )));
        }
        let leading = img.patch_mask.is_none_or(|m| m[..real].iter().all(|&b| b != 0));
        let (patches, mask): (&[f32], Vec<bool>) = match img.patch_mask {
            Some(m) if !leading => (img.pixels, m.iter().map(|&b| b != 0).collect()),
            _ => (&img.pixels[..real * cols], vec![true; real]),
        };
        self.image_features(&ImagePatches {
            patches,
            mask: &mask,
            grid: (h, w),
        })
    }
}

impl Model for Lfm2VlModel {
    fn describe(&self) -> ModelDescription {
        self.text.describe()
    }

    /// Rows at an encoded image's placeholder positions take its features; an image-token row
    /// without them, or such a position holding another token, is refused.
    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        let hidden = hidden_of(&self.text);
        let mut embeds: Vec<(usize, &[f32])> = Vec::new();
        for (row, ((&token, &pos), &seq)) in batch
            .tokens
            .iter()
            .zip(batch.positions)
            .zip(batch.seq_ids)
            .enumerate()
        {
            let features = self
                .pending
                .get(&seq)
                .and_then(|images| images.iter().find_map(|im| im.row(pos, hidden)));
            match features {
                Some(_) if token != self.image_token_id => {
                    return Err(PluginError::invalid_argument(format!(
                        "position {pos} of sequence {seq} is an image placeholder, but holds token {token}"
                    )))
                }
                Some(f) => embeds.push((row, f)),
                None if token == self.image_token_id => {
                    return Err(PluginError::invalid_argument(format!(
                        "image token at position {pos} of sequence {seq} without an encoded image"
                    )))
                }
                None => {}
            }
        }
        self.text.decode_with_embeddings(batch, &embeds, logits)
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        self.text.force_token(seq, token)
    }

    fn thinking_enabled(&self, requested: Option<bool>) -> bool {
        self.text.thinking_enabled(requested)
    }

    fn tools_enabled(&self) -> bool {
        self.text.tools_enabled()
    }

    /// Also drops the sequence's images whose placeholders all lie at or after `len`.
    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        self.text.seq_truncate(seq, len)?;
        if let Some(images) = self.pending.get_mut(&seq) {
            images.retain(|im| i64::from(im.first()) < i64::from(len));
            if images.is_empty() {
                self.pending.remove(&seq);
            }
        }
        Ok(())
    }

    /// Also copies the images of `src` to `dst` (replacing those of `dst`).
    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        self.text.seq_fork(src, dst)?;
        match self.pending.get(&src).cloned() {
            Some(images) => self.pending.insert(dst, images),
            None => self.pending.remove(&dst),
        };
        Ok(())
    }

    fn vision(&self) -> Option<VisionSpec> {
        Some(self.spec.clone())
    }

    fn prepare_image(&self, image: &RgbView<'_>, _index: u32) -> Result<PreparedImage, PluginError> {
        preprocess::prepare(&self.scheme, &rgb_image(image), PixelLayout::Patches)
    }

    /// Encodes every image first (all or none are kept); an image replaces those of the
    /// sequence it shares a placeholder position with.
    fn encode_images(&mut self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        self.text.decoder().seq_len(seq)?;
        let mut seen = std::collections::HashSet::new();
        for (i, img) in images.iter().enumerate() {
            if let Some(p) = img.positions.iter().find(|&&p| !seen.insert(p)) {
                return Err(PluginError::invalid_argument(format!(
                    "image {i}: placeholder position {p} is given twice"
                )));
            }
        }
        let mut encoded = Vec::with_capacity(images.len());
        for (i, img) in images.iter().enumerate() {
            encoded.push(PendingImage {
                positions: img.positions.to_vec(),
                features: self.encode_input(i, img)?,
            });
        }
        let kept = self.pending.entry(seq).or_default();
        kept.retain(|im| !im.positions.iter().any(|p| seen.contains(p)));
        kept.extend(encoded);
        Ok(())
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
