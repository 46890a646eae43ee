//! SigLIP's vision tower (`SiglipVisionModel`): a convolutional patch embedding (computed as a
//! matrix product over flattened patches), a learned position table of one entry per patch of the
//! training resolution, the pre-LN encoder and, when configured, the attention-pooling head.

use super::{Encoder, Linear, VisionConfig, VisionOutput};
use crate::linear::MatmulScratch;
use crate::weights::Weights;
use berth_plugin_api::PluginError;

/// A loaded SigLIP vision tower.
#[derive(Clone, Debug)]
pub struct SiglipVisionModel {
    /// Its shape.
    pub config: VisionConfig,
    /// Patch embedding: `hidden × (channels · patch²)`, input ordered channel, row, column.
    pub patch_embedding: Linear,
    /// Position table, `num_patches × hidden`, row-major over the patch grid.
    pub position_embedding: Vec<f32>,
    /// Encoder, post norm and head.
    pub encoder: Encoder,
}

impl SiglipVisionModel {
    /// Loads the tower from `{prefix}embeddings.*`, `{prefix}encoder.*`, `{prefix}post_layernorm`
    /// and `{prefix}head` (prefix `""` for a bare `SiglipVisionModel` checkpoint,
    /// `"vision_model."` inside a `SiglipModel`).
    pub fn load(w: &Weights, prefix: &str, config: VisionConfig) -> Result<SiglipVisionModel, PluginError> {
        let d = config.hidden_size;
        let p = config.patch_size;
        let patch_embedding = Linear::load(
            w,
            &format!("{prefix}embeddings.patch_embedding"),
            d,
            config.num_channels * p * p,
        )?;
        let position_embedding = w.vector_named(&format!("{prefix}embeddings.position_embedding.weight"))?;
        if position_embedding.len() != config.num_patches * d {
            return Err(PluginError::failed(format!(
                "position table holds {} values, {}x{d} expected",
                position_embedding.len(),
                config.num_patches
            )));
        }
        let encoder = Encoder::load(w, prefix, &config)?;
        Ok(SiglipVisionModel {
            config,
            patch_embedding,
            position_embedding,
            encoder,
        })
    }

    /// Encodes one image given as `channels × height × width` floats (already resized and
    /// normalised); the patch grid must match the position table (no interpolation).
    pub fn forward(
        &self,
        pixels: &[f32],
        height: usize,
        width: usize,
        keep_hidden_states: bool,
        threads: usize,
    ) -> Result<VisionOutput, PluginError> {
        let (c, p, d) = (
            self.config.num_channels,
            self.config.patch_size,
            self.config.hidden_size,
        );
        if pixels.len() != c * height * width {
            return Err(PluginError::failed(format!(
                "image holds {} values, {c}x{height}x{width} expected",
                pixels.len()
            )));
        }
        let (gh, gw) = (height / p, width / p);
        if gh * p != height || gw * p != width || gh * gw != self.config.num_patches {
            return Err(PluginError::failed(format!(
                "a {height}x{width} image is not the {} patches of {p} pixels this tower takes",
                self.config.num_patches
            )));
        }
        let n = gh * gw;
        let cols = c * p * p;
        let mut patches = vec![0.0f32; n * cols];
        for (i, patch) in patches.chunks_exact_mut(cols).enumerate() {
            let (py, px) = (i / gw, i % gw);
            for ch in 0..c {
                for ky in 0..p {
                    let src = ch * height * width + (py * p + ky) * width + px * p;
                    let dst = ch * p * p + ky * p;
                    patch[dst..dst + p].copy_from_slice(&pixels[src..src + p]);
                }
            }
        }
        let mut x = vec![0.0f32; n * d];
        self.patch_embedding
            .forward(&patches, n, &mut x, &mut MatmulScratch::new(), threads);
        x.iter_mut()
            .zip(&self.position_embedding)
            .for_each(|(a, b)| *a += b);
        Ok(self.encoder.forward(x, n, None, keep_hidden_states, threads))
    }
}
