//! The Idefics2 / SigLIP NaViT vision tower as MiniCPM-V 2.6, 4.0 and 4.5 run it
//! (`Idefics2VisionTransformer` weights, MiniCPM-V's `MiniCPMVisionEmbeddings` embedding step).
//!
//! A slice of `h × w` patches arrives as one strip of `channels × patch × (h·w·patch)` pixels
//! (the patches side by side, row-major over the grid). The convolutional patch embedding runs
//! over the strip; the learned `side × side` position table is indexed by bucketised fractional
//! coordinates of the slice's own grid (`bucketize(arange(0, 1, 1/h), arange(1/side, 1, 1/side),
//! right=True)`, as [`nearest_position_ids`]); then the pre-LN encoder and the post LayerNorm.
//! The model batches padded slices and masks the padding keys; one slice at a time, unpadded,
//! gives the same rows. `drop_vision_last_layer` drops the last encoder layer.

use super::minicpmv4_6::nearest_position_ids;
use super::{Encoder, Linear, VisionConfig};
use crate::linear::MatmulScratch;
use crate::weights::Weights;
use berth_plugin_api::PluginError;
use serde_json::Value;

fn fail(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg.into())
}

/// A loaded Idefics2 vision tower (MiniCPM-V's `vpm`).
#[derive(Clone, Debug)]
pub struct Idefics2Vision {
    /// The tower's shape; `num_layers` counts the layers that run (after any drop).
    pub config: VisionConfig,
    /// Patch embedding, `hidden × (channels · patch²)`.
    pub patch_embedding: Linear,
    /// Side of the square position table.
    pub side: usize,
    /// Position table, `side² × hidden`.
    pub position_embedding: Vec<f32>,
    /// Encoder layers and the post LayerNorm (no pooling head).
    pub encoder: Encoder,
}

/// Rearranges a strip of `channels × patch × (n·patch)` pixels into `n` rows of
/// `channels · patch²` values (channel, row, column), the convolution's input order.
pub fn strip_to_patches(strip: &[f32], channels: usize, patch: usize, n: usize) -> Vec<f32> {
    let width = n * patch;
    let cols = channels * patch * patch;
    let mut patches = vec![0.0f32; n * cols];
    for (i, row) in patches.chunks_exact_mut(cols).enumerate() {
        for ch in 0..channels {
            for ky in 0..patch {
                let src = ch * patch * width + ky * width + i * patch;
                let dst = ch * patch * patch + ky * patch;
                row[dst..dst + patch].copy_from_slice(&strip[src..src + patch]);
            }
        }
    }
    patches
}

impl Idefics2Vision {
    /// Loads `{prefix}embeddings.*`, `{prefix}encoder.layers.*` and `{prefix}post_layernorm`
    /// (prefix `"vpm."` in a MiniCPM-V pack) with the sizes of `vision_config`; with
    /// `drop_last_layer` the last of its `num_hidden_layers` is not loaded or run.
    pub fn load(
        w: &Weights,
        prefix: &str,
        vision_config: &Value,
        drop_last_layer: bool,
    ) -> Result<Idefics2Vision, PluginError> {
        let mut config = VisionConfig::from_json(vision_config)?;
        config.use_head = false;
        if drop_last_layer {
            if config.num_layers == 0 {
                return Err(fail("drop_vision_last_layer with no vision layers"));
            }
            config.num_layers -= 1;
        }
        let (d, p) = (config.hidden_size, config.patch_size);
        let side = config
            .image_size
            .ok_or_else(|| fail("vision config lacks image_size"))?
            / p;
        if side == 0 {
            return Err(fail("vision image_size is smaller than a patch"));
        }
        let position_embedding = w.vector_named(&format!("{prefix}embeddings.position_embedding.weight"))?;
        if position_embedding.len() != side * side * d {
            return Err(fail(format!(
                "position table holds {} values, {side}²x{d} expected",
                position_embedding.len()
            )));
        }
        let patch_embedding = Linear::load(
            w,
            &format!("{prefix}embeddings.patch_embedding"),
            d,
            config.num_channels * p * p,
        )?;
        let encoder = Encoder::load(w, prefix, &config)?;
        Ok(Idefics2Vision {
            config,
            patch_embedding,
            side,
            position_embedding,
            encoder,
        })
    }

    /// The tower's post-LayerNorm output for one slice, `h·w × hidden`: `strip` is
    /// `channels × patch × (h·w·patch)` pixels, `(h, w)` the slice's patch grid.
    pub fn forward(
        &self,
        strip: &[f32],
        (h, w): (usize, usize),
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        let (c, p, d) = (
            self.config.num_channels,
            self.config.patch_size,
            self.config.hidden_size,
        );
        let n = h * w;
        if n == 0 || strip.len() != c * p * n * p {
            return Err(fail(format!(
                "{} pixel values for a {h}x{w} strip of {p}-pixel patches",
                strip.len()
            )));
        }
        let patches = strip_to_patches(strip, c, p, n);
        let mut x = vec![0.0f32; n * d];
        self.patch_embedding
            .forward(&patches, n, &mut x, &mut MatmulScratch::new(), threads);
        for (row, id) in x.chunks_exact_mut(d).zip(nearest_position_ids(h, w, self.side)) {
            row.iter_mut()
                .zip(&self.position_embedding[id * d..(id + 1) * d])
                .for_each(|(a, b)| *a += b);
        }
        Ok(self.encoder.forward(x, n, None, false, threads).last_hidden_state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_patches_take_each_patch_rows_in_order() {
        // One channel, patch 2, two patches side by side: row 0 is [0 1 | 2 3], row 1 [4 5 | 6 7].
        let strip: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let p = strip_to_patches(&strip, 1, 2, 2);
        assert_eq!(p, vec![0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
    }
}
