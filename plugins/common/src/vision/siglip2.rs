//! SigLIP2's NaViT vision tower (`Siglip2VisionModel`): images of any aspect ratio arrive as a
//! sequence of flattened patches (`[N, channels · patch²]`, padded to a fixed `N`), with a mask of
//! the real patches and the image's patch grid `(h, w)`. The learned square position table is
//! resized to `h × w` with antialiased bilinear weights (transformers'
//! `F.interpolate(bilinear, align_corners=False, antialias=True)`); padding positions take the
//! resized table's first entry, and padded patches are never attended to.

use super::{Encoder, Linear, VisionConfig, VisionOutput};
use crate::linear::MatmulScratch;
use crate::weights::Weights;
use berth_kernels::vision::resize_grid_antialias_bilinear;
use berth_plugin_api::PluginError;

/// A loaded SigLIP2 vision tower.
#[derive(Clone, Debug)]
pub struct Siglip2VisionModel {
    /// Its shape.
    pub config: VisionConfig,
    /// Patch embedding: `hidden × (channels · patch²)` over the processor's patch layout.
    pub patch_embedding: Linear,
    /// Side of the square position table.
    pub grid: usize,
    /// Position table, `grid × grid × hidden`.
    pub position_embedding: Vec<f32>,
    /// Encoder, post norm and head.
    pub encoder: Encoder,
}

impl Siglip2VisionModel {
    /// Loads the tower from `{prefix}embeddings.*`, `{prefix}encoder.*`, `{prefix}post_layernorm`
    /// and `{prefix}head` (prefix `""` for a bare checkpoint, `"model.vision_tower."` in LFM2-VL).
    pub fn load(w: &Weights, prefix: &str, config: VisionConfig) -> Result<Siglip2VisionModel, PluginError> {
        let d = config.hidden_size;
        let p = config.patch_size;
        let grid = (config.num_patches as f64).sqrt().round() as usize;
        if grid * grid != config.num_patches {
            return Err(PluginError::failed(format!(
                "num_patches {} is not a square",
                config.num_patches
            )));
        }
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
        Ok(Siglip2VisionModel {
            config,
            patch_embedding,
            grid,
            position_embedding,
            encoder,
        })
    }

    /// The position embeddings of `n` patch slots for an image of `h × w` patches: the table
    /// resized to `h × w` in row-major order, then the resized first entry for the padding.
    pub fn positions(&self, h: usize, w: usize, n: usize) -> Vec<f32> {
        let d = self.config.hidden_size;
        let resized = resize_grid_antialias_bilinear(&self.position_embedding, self.grid, self.grid, d, h, w);
        let mut out = resized;
        let first = out[..d].to_vec();
        for _ in h * w..n {
            out.extend_from_slice(&first);
        }
        out
    }

    /// Encodes one image: `patches` holds `n` rows of `channels · patch²` values, `mask[i]` says
    /// whether row `i` is a real patch, `(h, w)` is the image's patch grid (`h · w ≤ n`).
    pub fn forward(
        &self,
        patches: &[f32],
        mask: &[bool],
        (h, w): (usize, usize),
        keep_hidden_states: bool,
        threads: usize,
    ) -> Result<VisionOutput, PluginError> {
        let d = self.config.hidden_size;
        let cols = self.patch_embedding.weight.cols;
        let n = mask.len();
        if patches.len() != n * cols {
            return Err(PluginError::failed(format!(
                "{} patch values for {n} patches of {cols}",
                patches.len()
            )));
        }
        if h == 0 || w == 0 || h * w > n {
            return Err(PluginError::failed(format!(
                "a {h}x{w} patch grid does not fit {n} patches"
            )));
        }
        if !mask.iter().any(|&m| m) {
            return Err(PluginError::failed("every patch is masked"));
        }
        let mut x = vec![0.0f32; n * d];
        self.patch_embedding
            .forward(patches, n, &mut x, &mut MatmulScratch::new(), threads);
        x.iter_mut()
            .zip(&self.positions(h, w, n))
            .for_each(|(a, b)| *a += b);
        let all = mask.iter().all(|&m| m);
        let key_mask = (!all).then_some(mask);
        Ok(self.encoder.forward(x, n, key_mask, keep_hidden_states, threads))
    }
}
