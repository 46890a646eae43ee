//! MiniCPM-V 4.6's vision side (`MiniCPMV4_6VisionModel` + `MiniCPMV4_6Merger`).
//!
//! - Tower: a SigLIP-style NaViT encoder. An image of `h × w` patches arrives as one strip of
//!   `channels × patch × (h·w·patch)` pixels (patches side by side, row-major over the grid); the
//!   convolutional patch embedding runs over it, and the learned square position table is indexed
//!   by nearest bucket (`get_vision_nearest_position_ids`).
//! - ViT merger (mode "16x"), after encoder layer `insert_layer_id`: a residual window attention
//!   within each 2×2 block of patches (blocks row-major, patches row-major inside), then each block
//!   becomes one patch: `linear_2(gelu_tanh(linear_1(pre_norm(concat))))` plus the block's mean.
//!   The remaining layers run on the `h/2 × w/2` grid; then the post LayerNorm.
//! - Merger: each 2×2 block of the tower output, concatenated row-major, goes through LayerNorm,
//!   linear, exact GELU and linear into the language model's width (`merger_times` rounds).

use super::{Attention, EncoderLayer, Keys, LayerNorm, Linear, VisionAct, VisionConfig};
use crate::linear::MatmulScratch;
use crate::weights::Weights;
use berth_plugin_api::PluginError;
use serde_json::Value;

fn fail(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg.into())
}

/// The 2×2 window attention + merge MLP inserted into the encoder.
#[derive(Clone, Debug)]
pub struct VitMerger {
    /// Norm before the window attention.
    pub layer_norm1: LayerNorm,
    /// Self-attention within each window (the tower's heads).
    pub attn: Attention,
    /// Norm over a window's concatenated patches.
    pub pre_norm: LayerNorm,
    /// First merge projection.
    pub linear_1: Linear,
    /// Second merge projection, back to the hidden width.
    pub linear_2: Linear,
    /// Window side (2).
    pub window: usize,
}

/// One downsampling MLP of the merger: LayerNorm, linear, exact GELU, linear.
#[derive(Clone, Debug)]
pub struct DownsampleMlp {
    /// Norm over the concatenated 2×2 block.
    pub pre_norm: LayerNorm,
    /// First projection.
    pub linear_1: Linear,
    /// Second projection.
    pub linear_2: Linear,
}

/// A loaded MiniCPM-V 4.6 vision tower and merger.
#[derive(Clone, Debug)]
pub struct MiniCpmV46Vision {
    /// The tower's shape.
    pub config: VisionConfig,
    /// Patch embedding, `hidden × (channels · patch²)`.
    pub patch_embedding: Linear,
    /// Side of the square position table.
    pub grid: usize,
    /// Position table, `grid² × hidden`.
    pub position_embedding: Vec<f32>,
    /// Encoder layers.
    pub layers: Vec<EncoderLayer>,
    /// Norm after the last layer.
    pub post_layernorm: LayerNorm,
    /// The ViT merger and the layer it follows, when the downsample mode uses it ("16x").
    pub vit_merger: Option<(usize, VitMerger)>,
    /// Merger rounds (the last projects to the language model).
    pub merger: Vec<DownsampleMlp>,
    /// Merge block side (2).
    pub merge: usize,
}

/// What [`MiniCpmV46Vision::forward`] returns for one image.
#[derive(Clone, Debug)]
pub struct MiniCpmV46Output {
    /// The tower's post-LayerNorm output over the (merged) patch grid.
    pub last_hidden_state: Vec<f32>,
    /// The grid of `last_hidden_state`.
    pub grid: (usize, usize),
    /// Image features in the language model's width, one row per image token.
    pub features: Vec<f32>,
}

/// Concatenates each `m × m` block of an `h × w` grid of `d`-vectors (blocks row-major, rows of
/// the block major inside), giving `(h/m)·(w/m)` rows of `m²·d`.
fn merge_blocks(x: &[f32], (h, w): (usize, usize), d: usize, m: usize) -> Vec<f32> {
    let (bh, bw) = (h / m, w / m);
    let width = m * m * d;
    let mut out = vec![0.0f32; bh * bw * width];
    for (t, token) in out.chunks_exact_mut(width).enumerate() {
        let (r0, c0) = ((t / bw) * m, (t % bw) * m);
        for a in 0..m {
            for b in 0..m {
                let src = ((r0 + a) * w + c0 + b) * d;
                token[(a * m + b) * d..(a * m + b + 1) * d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    out
}

/// Position-table rows of an `h × w` grid by nearest bucket on a `side × side` table, as
/// transformers' `get_vision_nearest_position_ids` (f32 coordinates `i/h`, bucket boundaries
/// `k/side`, an index counting the boundaries at or below the coordinate).
pub fn nearest_position_ids(h: usize, w: usize, side: usize) -> Vec<usize> {
    // torch.arange(1/side, 1.0, 1/side): start + k·step in f64, stored as f32.
    let step = 1.0 / side as f64;
    let count = ((1.0 - step) / step).ceil().max(0.0) as usize;
    let bounds: Vec<f32> = (0..count).map(|k| (step + k as f64 * step) as f32).collect();
    let bucket = |i: usize, n: usize| {
        let x = i as f32 / n as f32;
        bounds.iter().filter(|&&b| b <= x).count()
    };
    let mut ids = Vec::with_capacity(h * w);
    for r in 0..h {
        for c in 0..w {
            ids.push(bucket(r, h) * side + bucket(c, w));
        }
    }
    ids
}

impl MiniCpmV46Vision {
    /// Loads `{prefix}vision_tower.*` and `{prefix}merger.*` (prefix `"model."` in a checkpoint)
    /// with the sizes of the whole `minicpmv4_6` config.
    pub fn load(w: &Weights, prefix: &str, config: &Value) -> Result<MiniCpmV46Vision, PluginError> {
        let vc = config
            .get("vision_config")
            .ok_or_else(|| fail("minicpmv4_6 config lacks vision_config"))?;
        let cfg = VisionConfig::from_json(vc)?;
        let (d, p) = (cfg.hidden_size, cfg.patch_size);
        let t = format!("{prefix}vision_tower.");
        let grid = cfg
            .image_size
            .ok_or_else(|| fail("vision config lacks image_size"))?
            / p;
        let position_embedding = w.vector_named(&format!("{t}embeddings.position_embedding.weight"))?;
        if position_embedding.len() != grid * grid * d {
            return Err(fail(format!(
                "position table holds {} values, {grid}²x{d} expected",
                position_embedding.len()
            )));
        }
        let sq = |v: Option<&Value>, k: &str| -> Result<usize, PluginError> {
            let Some(v) = v else { return Ok(2) };
            let a: Vec<u64> = v
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            match a.as_slice() {
                [x, y] if x == y && *x > 0 => Ok(*x as usize),
                _ => Err(fail(format!("{k} must be a square kernel, got {v}"))),
            }
        };
        let window = sq(vc.get("window_kernel_size"), "window_kernel_size")?;
        let merge = sq(config.get("merge_kernel_size"), "merge_kernel_size")?;
        let insert = config
            .get("insert_layer_id")
            .or_else(|| vc.get("insert_layer_id"))
            .and_then(Value::as_i64)
            .unwrap_or(6);
        let mode = config
            .get("downsample_mode")
            .and_then(Value::as_str)
            .unwrap_or("16x");
        let layers = (0..cfg.num_layers)
            .map(|i| EncoderLayer::load(w, &format!("{t}encoder.layers.{i}"), &cfg))
            .collect::<Result<Vec<_>, _>>()?;
        let vit_merger = if mode != "4x" && insert >= 0 && (insert as usize) < cfg.num_layers {
            let m = format!("{t}vit_merger");
            let wd = window * window * d;
            let proj = |n: &str| Linear::load(w, &format!("{m}.self_attn.{n}"), d, d);
            Some((
                insert as usize,
                VitMerger {
                    layer_norm1: LayerNorm::load(w, &format!("{m}.layer_norm1"), cfg.layer_norm_eps)?,
                    attn: Attention::new(
                        proj("q_proj")?,
                        proj("k_proj")?,
                        proj("v_proj")?,
                        proj("out_proj")?,
                        cfg.num_heads,
                    ),
                    pre_norm: LayerNorm::load(w, &format!("{m}.pre_norm"), cfg.layer_norm_eps)?,
                    linear_1: Linear::load(
                        w,
                        &format!("{m}.linear_1"),
                        window * window * cfg.intermediate_size,
                        wd,
                    )?,
                    linear_2: Linear::load(
                        w,
                        &format!("{m}.linear_2"),
                        d,
                        window * window * cfg.intermediate_size,
                    )?,
                    window,
                },
            ))
        } else {
            None
        };
        let times = config
            .get("merger_times")
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .max(1) as usize;
        let text_hidden = config
            .get("text_config")
            .and_then(|t| t.get("hidden_size"))
            .and_then(Value::as_u64)
            .ok_or_else(|| fail("minicpmv4_6 config lacks text_config.hidden_size"))?
            as usize;
        let merged = d * merge * merge;
        let merger = (0..times)
            .map(|i| {
                let n = format!("{prefix}merger.mlp.{i}");
                let out = if i + 1 == times { text_hidden } else { d };
                Ok(DownsampleMlp {
                    pre_norm: LayerNorm::load(w, &format!("{n}.pre_norm"), 1e-6)?,
                    linear_1: Linear::load(w, &format!("{n}.linear_1"), merged, merged)?,
                    linear_2: Linear::load(w, &format!("{n}.linear_2"), out, merged)?,
                })
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        Ok(MiniCpmV46Vision {
            patch_embedding: Linear::load(
                w,
                &format!("{t}embeddings.patch_embedding"),
                d,
                cfg.num_channels * p * p,
            )?,
            grid,
            position_embedding,
            layers,
            post_layernorm: LayerNorm::load(w, &format!("{t}post_layernorm"), cfg.layer_norm_eps)?,
            vit_merger,
            merger,
            merge,
            config: cfg,
        })
    }

    /// Encodes one image: `strip` is `channels × patch × (h·w·patch)` pixels, the image's patches
    /// side by side in row-major grid order; `(h, w)` is its patch grid.
    pub fn forward(
        &self,
        strip: &[f32],
        (h, w): (usize, usize),
        threads: usize,
    ) -> Result<MiniCpmV46Output, PluginError> {
        let (c, p, d) = (
            self.config.num_channels,
            self.config.patch_size,
            self.config.hidden_size,
        );
        let n = h * w;
        let width = n * p;
        if n == 0 || strip.len() != c * p * width {
            return Err(fail(format!(
                "{} pixel values for a {h}x{w} strip of {p}-pixel patches",
                strip.len()
            )));
        }
        let cols = c * p * p;
        let mut patches = vec![0.0f32; n * cols];
        for (i, patch) in patches.chunks_exact_mut(cols).enumerate() {
            for ch in 0..c {
                for ky in 0..p {
                    let src = ch * p * width + ky * width + i * p;
                    patch[ch * p * p + ky * p..ch * p * p + (ky + 1) * p]
                        .copy_from_slice(&strip[src..src + p]);
                }
            }
        }
        let mut scratch = MatmulScratch::new();
        let mut x = vec![0.0f32; n * d];
        self.patch_embedding
            .forward(&patches, n, &mut x, &mut scratch, threads);
        for (row, id) in x.chunks_exact_mut(d).zip(nearest_position_ids(h, w, self.grid)) {
            row.iter_mut()
                .zip(&self.position_embedding[id * d..(id + 1) * d])
                .for_each(|(a, b)| *a += b);
        }
        let mut grid = (h, w);
        for (i, layer) in self.layers.iter().enumerate() {
            layer.forward(&mut x, grid.0 * grid.1, None, &mut scratch, threads);
            if let Some((at, merger)) = &self.vit_merger {
                if *at == i {
                    x = merger.forward(&x, grid, &mut scratch, threads)?;
                    grid = (grid.0 / merger.window, grid.1 / merger.window);
                }
            }
        }
        let mut last = vec![0.0f32; x.len()];
        self.post_layernorm.forward(&x, &mut last);
        let mut feats = last.clone();
        let (mut g, mut width) = (grid, d);
        for mlp in &self.merger {
            let m = self.merge;
            if g.0 % m != 0 || g.1 % m != 0 {
                return Err(fail(format!(
                    "a {}x{} grid is not whole {m}x{m} merge blocks",
                    g.0, g.1
                )));
            }
            let merged = merge_blocks(&feats, g, width, m);
            g = (g.0 / m, g.1 / m);
            let rows = g.0 * g.1;
            let mut normed = vec![0.0f32; merged.len()];
            mlp.pre_norm.forward(&merged, &mut normed);
            let mut hid = vec![0.0f32; rows * mlp.linear_1.weight.rows];
            mlp.linear_1
                .forward(&normed, rows, &mut hid, &mut scratch, threads);
            VisionAct::GeluErf.apply(&mut hid);
            width = mlp.linear_2.weight.rows;
            feats = vec![0.0f32; rows * width];
            mlp.linear_2
                .forward(&hid, rows, &mut feats, &mut scratch, threads);
        }
        Ok(MiniCpmV46Output {
            last_hidden_state: last,
            grid,
            features: feats,
        })
    }
}

impl VitMerger {
    /// The merger over an `h × w` grid of `x`: window attention, then one row per window.
    fn forward(
        &self,
        x: &[f32],
        (h, w): (usize, usize),
        scratch: &mut MatmulScratch,
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        let (m, d) = (self.window, self.attn.width());
        if h % m != 0 || w % m != 0 {
            return Err(fail(format!("a {h}x{w} patch grid is not whole {m}x{m} windows")));
        }
        // Window order: windows row-major, patches row-major inside each.
        let reordered = merge_blocks(x, (h, w), d, m);
        let n = h * w;
        let mut normed = vec![0.0f32; n * d];
        self.layer_norm1.forward(&reordered, &mut normed);
        let mut attn = vec![0.0f32; n * d];
        self.attn
            .self_attention(&normed, n, Keys::Windows(m * m), &mut attn, scratch, threads);
        let mut y = reordered;
        y.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
        // Each window's patches, concatenated, become one row.
        let rows = n / (m * m);
        let mut pre = vec![0.0f32; y.len()];
        self.pre_norm.forward(&y, &mut pre);
        let mut hid = vec![0.0f32; rows * self.linear_1.weight.rows];
        self.linear_1.forward(&pre, rows, &mut hid, scratch, threads);
        VisionAct::GeluTanh.apply(&mut hid);
        let mut out = vec![0.0f32; rows * d];
        self.linear_2.forward(&hid, rows, &mut out, scratch, threads);
        for (o, win) in out.chunks_exact_mut(d).zip(y.chunks_exact(m * m * d)) {
            for (j, v) in o.iter_mut().enumerate() {
                let mean = (0..m * m).map(|s| win[s * d + j]).sum::<f32>() / (m * m) as f32;
                *v += mean;
            }
        }
        Ok(out)
    }
}
