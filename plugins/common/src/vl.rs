//! The vision-language model: a language model ([`DecoderModel`]) whose image-token rows take the
//! features of a vision tower, behind the plugin `Model` trait (ABI 1.3 `vision` and
//! `encode_images`). A family supplies only its tower ([`VisionTower`]), its [`VisionSpec`] and
//! the loaded language model; the pending-feature rule below is the same for every family.

use crate::family::{bad, Loaded};
use crate::vision::preprocess::ImageScheme;
use crate::DecoderModel;
use berth_plugin_api::{
    BatchView, EmbeddingSpec, ImageInput, LoadConfig, LogitsOut, Model, ModelDescription, PluginError,
    PreparedImage, RgbView, VisionSpec,
};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What a vision-language model needs of its vision side: how many image tokens an image gives
/// and its features, one row of the language model's width per token.
pub trait VisionTower: Send + 'static {
    /// Values in one feature row (the language model's hidden size).
    fn feature_width(&self) -> usize;

    /// Checks one image (slice or tile) as the host hands it over against what the tower takes
    /// (layout, shape, grid, mask) and returns how many image tokens it gives.
    fn image_tokens_of(&self, image: &ImageInput<'_>) -> Result<usize, PluginError>;

    /// Encodes one image already accepted by [`VisionTower::image_tokens_of`]: that many rows of
    /// [`VisionTower::feature_width`] values, in placeholder order.
    fn encode(&self, image: &ImageInput<'_>, threads: usize) -> Result<Vec<f32>, PluginError>;
}

/// A language model with a vision tower, serving images through the plugin `Model` trait.
///
/// Pending image features follow one rule, across prefill, decode, fork, truncate and prefix
/// reuse:
/// - **encode**: `encode_images(seq, images)` keeps one feature row per placeholder position of
///   `seq`. Every position must lie at or after the sequence's length (not yet decoded), be
///   given once, and hold no features already; otherwise the call is refused and keeps nothing.
/// - **decode / prefill**: a row at a position holding features must hold the image token and
///   takes the features in place of the token embedding; the features are then dropped
///   (consumed). An image token without features is refused. An image's rows may come over
///   several batches (chunked prefill, token by token) and beside other sequences' rows.
/// - **fork**: `seq_fork(src, dst)` gives `dst` a copy of the features `src` still holds
///   (replacing those of `dst`).
/// - **truncate**: `seq_truncate(seq, len)` drops the features at positions `len` and after.
/// - **prefix reuse**: decoded image rows live on in the KV cache like any row, so a reused
///   prefix keeps them; decoding an image position again after a truncate below it needs the
///   image encoded again. The host does exactly that: it never keeps a prefix that cuts an
///   image, truncates to the kept length and re-sends every image whose first placeholder lies
///   at or after it.
pub struct VisionLanguageModel<T> {
    /// The language model.
    pub text: DecoderModel,
    /// The vision side.
    pub tower: T,
    /// The image placeholder token whose rows take image features.
    pub image_token_id: i32,
    /// What the host is told about the model's images ([`Model::vision`]).
    spec: VisionSpec,
    /// How a decoded image becomes placeholder text and slices ([`Model::prepare_image`]).
    scheme: Box<dyn ImageScheme>,
    /// Per sequence: the feature row of each placeholder position not yet decoded.
    pending: HashMap<i32, BTreeMap<i32, Vec<f32>>>,
}

impl<T: VisionTower> VisionLanguageModel<T> {
    /// Builds the model from the loaded language model, the tower, the host's vision spec
    /// (whose `image_token_id` is the placeholder) and the tower's image preparation rule, after
    /// checking the placeholder against the vocabulary and the tower's feature width against the
    /// language model's.
    pub fn new(
        loaded: Loaded,
        config: &LoadConfig,
        tower: T,
        spec: VisionSpec,
        scheme: Box<dyn ImageScheme>,
    ) -> Result<VisionLanguageModel<T>, PluginError> {
        let (width, hidden) = (tower.feature_width(), loaded.cfg.hidden);
        if width != hidden {
            return Err(bad(format!(
                "the vision side gives {width} values per image token; the language model's width is {hidden}"
            )));
        }
        let image_token_id = spec.image_token_id;
        let vocab = loaded.weights.embed.rows;
        if image_token_id < 0 || image_token_id as usize >= vocab {
            return Err(bad(format!(
                "image token {image_token_id} outside the vocabulary ({vocab})"
            )));
        }
        Ok(VisionLanguageModel {
            text: DecoderModel::new(loaded, config)?,
            tower,
            image_token_id,
            spec,
            scheme,
            pending: HashMap::new(),
        })
    }

    /// Threads the language model (and so the tower) runs on.
    pub fn threads(&self) -> usize {
        self.text.decoder().threads
    }

    /// Image feature rows sequence `seq` holds for positions not yet decoded.
    pub fn pending_rows(&self, seq: i32) -> usize {
        self.pending.get(&seq).map_or(0, BTreeMap::len)
    }

    /// Runs a batch whose image-token rows take the rows of `features` (the concatenated
    /// features of the batch's images), in batch order; their count must equal the image-token
    /// rows'. Pending features are neither used nor consumed. Otherwise the plugin `decode`
    /// contract.
    pub fn decode_with_features(
        &mut self,
        batch: &BatchView<'_>,
        features: &[f32],
        logits: &mut LogitsOut<'_>,
    ) -> Result<(), PluginError> {
        self.text
            .decode_with_token_features(batch, self.image_token_id, features, logits)
    }

    /// Feeds `input_ids` to sequence `seq` from its current length in one batch, `features`
    /// (as [`VisionLanguageModel::decode_with_features`]) at its image tokens, and returns the
    /// logits of every row (`input_ids.len() × vocab`).
    pub fn prefill(
        &mut self,
        seq: i32,
        input_ids: &[i32],
        features: &[f32],
    ) -> Result<Vec<f32>, PluginError> {
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
        self.decode_with_features(&batch, features, &mut LogitsOut::new(&mut out, vocab))?;
        Ok(out)
    }

    /// Checks the images of one `encode_images` call against the rule (see the type's docs) and
    /// the tower, before anything is encoded.
    fn check_images(&self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        let start = self.text.decoder().seq_len(seq)?;
        let held = self.pending.get(&seq);
        let mut seen = HashSet::new();
        for (k, image) in images.iter().enumerate() {
            let refuse = |m: String| Err(PluginError::invalid_argument(format!("image {k}: {m}")));
            image.validate()?;
            let tokens = self
                .tower
                .image_tokens_of(image)
                .map_err(|e| PluginError::invalid_argument(format!("image {k}: {}", e.message)))?;
            if image.positions.len() != tokens {
                return refuse(format!(
                    "{} placeholder positions; the image gives {tokens} image tokens",
                    image.positions.len()
                ));
            }
            for &p in image.positions {
                if (p as usize) < start {
                    return refuse(format!(
                        "position {p} of sequence {seq} is already decoded ({start} held)"
                    ));
                }
                if !seen.insert(p) {
                    return refuse(format!("placeholder position {p} is given twice"));
                }
                if held.is_some_and(|m| m.contains_key(&p)) {
                    return refuse(format!(
                        "position {p} of sequence {seq} already has image features"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl<T: VisionTower> Model for VisionLanguageModel<T> {
    fn describe(&self) -> ModelDescription {
        self.text.describe()
    }

    /// Rows at pending placeholder positions take (and consume) their features; an image-token
    /// row without features, or a placeholder position holding another token, is refused.
    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        batch.validate()?;
        let mut embeds: Vec<(usize, &[f32])> = Vec::new();
        let mut used = Vec::new();
        for i in 0..batch.len() {
            let (token, pos, seq) = (batch.tokens[i], batch.positions[i], batch.seq_ids[i]);
            match self.pending.get(&seq).and_then(|m| m.get(&pos)) {
                Some(_) if token != self.image_token_id => {
                    return Err(PluginError::invalid_argument(format!(
                        "position {pos} of sequence {seq} is an image placeholder, but holds token {token}"
                    )))
                }
                Some(f) => {
                    embeds.push((i, f));
                    used.push((seq, pos));
                }
                None if token == self.image_token_id => {
                    return Err(PluginError::invalid_argument(format!(
                        "image token at position {pos} of sequence {seq} without an encoded image"
                    )))
                }
                None => {}
            }
        }
        self.text.decode_with_embeddings(batch, &embeds, logits)?;
        for (seq, pos) in used {
            if let Some(m) = self.pending.get_mut(&seq) {
                m.remove(&pos);
            }
        }
        self.pending.retain(|_, m| !m.is_empty());
        Ok(())
    }

    /// A forced token goes through [`Model::decode`], so a pending placeholder takes its
    /// features there too.
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

    /// Also drops the sequence's pending features at positions `len` and after.
    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        self.text.seq_truncate(seq, len)?;
        if let Some(m) = self.pending.get_mut(&seq) {
            m.retain(|&p, _| i64::from(p) < i64::from(len));
            if m.is_empty() {
                self.pending.remove(&seq);
            }
        }
        Ok(())
    }

    /// Also copies the pending features of `src` to `dst` (replacing those of `dst`).
    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        self.text.seq_fork(src, dst)?;
        match self.pending.get(&src).cloned() {
            Some(m) => self.pending.insert(dst, m),
            None => self.pending.remove(&dst),
        };
        Ok(())
    }

    fn vision(&self) -> Option<VisionSpec> {
        Some(self.spec.clone())
    }

    fn prepare_image(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        self.scheme.prepare(image, index)
    }

    /// Checks every image, then encodes them all, then keeps them: all or nothing.
    fn encode_images(&mut self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        self.check_images(seq, images)?;
        let (threads, width) = (self.threads(), self.tower.feature_width());
        let mut new = BTreeMap::new();
        for (k, image) in images.iter().enumerate() {
            let features = self.tower.encode(image, threads).map_err(|e| PluginError {
                message: format!("image {k}: {}", e.message),
                ..e
            })?;
            if features.len() != image.positions.len() * width {
                return Err(PluginError::failed(format!(
                    "image {k}: the vision side gave {} values for {} image tokens of {width}",
                    features.len(),
                    image.positions.len()
                )));
            }
            new.extend(
                image
                    .positions
                    .iter()
                    .copied()
                    .zip(features.chunks_exact(width).map(<[f32]>::to_vec)),
            );
        }
        self.pending.entry(seq).or_default().extend(new);
        Ok(())
    }

    fn embedding(&self) -> Option<EmbeddingSpec> {
        self.text.embedding()
    }

    fn embed(&mut self, sequences: &[&[i32]]) -> Result<Vec<f32>, PluginError> {
        self.text.embed(sequences)
    }
}
