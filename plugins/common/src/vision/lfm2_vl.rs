//! LFM2-VL's multimodal projector (`Lfm2VlMultiModalProjector`): the SigLIP2 tower's output for
//! an image of `h × w` patches is pixel-unshuffled by the downsample factor `f` (each `f × f`
//! block of patches, row-major, becomes one token of `f² · hidden` values), then LayerNorm, a
//! linear layer, GELU and a second linear layer give one language-model embedding per token.
//! Tokens run row-major over the `⌊h/f⌋ × ⌊w/f⌋` blocks; padded patches are never read.

use super::{LayerNorm, Linear, VisionAct};
use crate::linear::MatmulScratch;
use crate::weights::Weights;
use berth_plugin_api::PluginError;
use serde_json::Value;

/// LayerNorm epsilon of the projector (`nn.LayerNorm`'s default).
const PROJECTOR_LN_EPS: f32 = 1e-5;

/// A loaded LFM2-VL projector.
#[derive(Clone, Debug)]
pub struct Lfm2VlProjector {
    /// Downsample factor `f`.
    pub factor: usize,
    /// Width of a vision patch.
    pub vision_hidden: usize,
    /// Norm over the unshuffled `f² · vision_hidden` values, when configured.
    pub layer_norm: Option<LayerNorm>,
    /// First projection.
    pub linear_1: Linear,
    /// Activation.
    pub act: VisionAct,
    /// Second projection, to the language model's width.
    pub linear_2: Linear,
}

impl Lfm2VlProjector {
    /// Loads `{prefix}multi_modal_projector.*` (prefix `"model."` in an LFM2-VL checkpoint) with
    /// the sizes of the whole `lfm2_vl` config.
    pub fn load(w: &Weights, prefix: &str, config: &Value) -> Result<Lfm2VlProjector, PluginError> {
        let fail = |k: &str| PluginError::failed(format!("lfm2_vl config lacks {k}"));
        let get = |v: &Value, k: &str| {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| fail(k))
        };
        let factor = config
            .get("downsample_factor")
            .and_then(Value::as_u64)
            .unwrap_or(2) as usize;
        let vision_hidden = get(
            config.get("vision_config").ok_or_else(|| fail("vision_config"))?,
            "hidden_size",
        )?;
        let text_hidden = get(
            config.get("text_config").ok_or_else(|| fail("text_config"))?,
            "hidden_size",
        )?;
        let hidden = get(config, "projector_hidden_size")?;
        let act = VisionAct::parse(
            config
                .get("projector_hidden_act")
                .and_then(Value::as_str)
                .unwrap_or("gelu"),
        )?;
        let use_ln = config
            .get("projector_use_layernorm")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let name = format!("{prefix}multi_modal_projector");
        let in_width = vision_hidden * factor * factor;
        let layer_norm = if use_ln {
            let ln = LayerNorm::load(w, &format!("{name}.layer_norm"), PROJECTOR_LN_EPS)?;
            if ln.weight.len() != in_width {
                return Err(PluginError::failed(format!(
                    "projector norm has {} values, {in_width} expected",
                    ln.weight.len()
                )));
            }
            Some(ln)
        } else {
            None
        };
        Ok(Lfm2VlProjector {
            factor,
            vision_hidden,
            layer_norm,
            linear_1: Linear::load(w, &format!("{name}.linear_1"), hidden, in_width)?,
            act,
            linear_2: Linear::load(w, &format!("{name}.linear_2"), text_hidden, hidden)?,
        })
    }

    /// Image tokens of an `h × w` patch grid: `⌊h/f⌋ · ⌊w/f⌋`.
    pub fn tokens(&self, h: usize, w: usize) -> usize {
        (h / self.factor) * (w / self.factor)
    }

    /// The language-model embeddings (`tokens × text hidden`) of one image's tower output
    /// (`last_hidden_state`, at least `h · w` rows, row-major over the patch grid).
    pub fn forward(
        &self,
        features: &[f32],
        (h, w): (usize, usize),
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        let (f, d) = (self.factor, self.vision_hidden);
        if features.len() < h * w * d {
            return Err(PluginError::failed(format!(
                "{} feature values for a {h}x{w} grid of {d}",
                features.len()
            )));
        }
        let (bh, bw) = (h / f, w / f);
        let n = bh * bw;
        let width = f * f * d;
        let mut x = vec![0.0f32; n * width];
        for (t, token) in x.chunks_exact_mut(width).enumerate() {
            let (r0, c0) = ((t / bw) * f, (t % bw) * f);
            for a in 0..f {
                for b in 0..f {
                    let src = ((r0 + a) * w + c0 + b) * d;
                    let dst = (a * f + b) * d;
                    token[dst..dst + d].copy_from_slice(&features[src..src + d]);
                }
            }
        }
        if let Some(ln) = &self.layer_norm {
            let mut normed = vec![0.0f32; x.len()];
            ln.forward(&x, &mut normed);
            x = normed;
        }
        let mut scratch = MatmulScratch::new();
        let mut hidden = vec![0.0f32; n * self.linear_1.weight.rows];
        self.linear_1.forward(&x, n, &mut hidden, &mut scratch, threads);
        self.act.apply(&mut hidden);
        let mut out = vec![0.0f32; n * self.linear_2.weight.rows];
        self.linear_2.forward(&hidden, n, &mut out, &mut scratch, threads);
        Ok(out)
    }
}
