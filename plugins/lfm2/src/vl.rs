//! LFM2-VL (`lfm2_vl`, `Lfm2VlForConditionalGeneration`): the LFM2 language model with a
//! SigLIP2 NaViT vision tower and the pixel-unshuffle projector. Each image's features (one row
//! of the language model's width per image token) take the place of the token embeddings at the
//! image-token positions of the prompt, in order, as transformers' `masked_scatter` places them.
//!
//! This is the Rust-level API the plugin's image glue calls; the plugin ABI does not carry
//! images here.

use crate::Lfm2Model;
use berth_plugin_api::{BatchView, LoadConfig, LogitsOut, Model, PluginError};
use berth_plugin_common::family::{bad, open_weights, read_json};
use berth_plugin_common::vision::lfm2_vl::Lfm2VlProjector;
use berth_plugin_common::vision::siglip2::Siglip2VisionModel;
use berth_plugin_common::vision::VisionConfig;
use berth_plugin_common::DecoderModel;
use serde_json::Value;

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

/// A loaded LFM2-VL model: the language model and the vision encoder.
pub struct Lfm2VlModel {
    /// The LFM2 language model (the plugin `Model` for text).
    pub text: Lfm2Model,
    /// The SigLIP2 vision tower.
    pub tower: Siglip2VisionModel,
    /// The projector into the language model's width.
    pub projector: Lfm2VlProjector,
    /// The image placeholder token whose rows take image features.
    pub image_token_id: i32,
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
        Ok(Lfm2VlModel {
            text: DecoderModel::new(loaded, config)?,
            tower,
            projector,
            image_token_id,
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
        let h = self.text.decoder().cfg.hidden;
        let rows: Vec<usize> = (0..batch.tokens.len())
            .filter(|&i| batch.tokens[i] == self.image_token_id)
            .collect();
        if features.len() != rows.len() * h {
            return Err(PluginError::invalid_argument(format!(
                "{} image-token rows, {} feature values (rows of {h})",
                rows.len(),
                features.len()
            )));
        }
        let embeds: Vec<(usize, &[f32])> = rows.into_iter().zip(features.chunks_exact(h)).collect();
        self.text.decode_with_embeddings(batch, &embeds, logits)
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
