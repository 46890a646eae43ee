//! Vision towers: the image encoders of multimodal families, matched to transformers.
//!
//! - [`siglip`]: SigLIP's fixed-resolution tower (`SiglipVisionModel`).
//! - [`siglip2`]: SigLIP2's NaViT tower over patchified images of any aspect ratio
//!   (`Siglip2VisionModel`), with its padding mask and resized position table.
//! - [`lfm2_vl`]: LFM2-VL's pixel-unshuffle projector from SigLIP2 features to the language model.
//! - [`minicpmv4_6`]: MiniCPM-V 4.6's NaViT tower with its 2×2 window merger, and the merger into
//!   the language model.
//! - [`idefics2`]: the Idefics2 / SigLIP NaViT tower of MiniCPM-V 4.0 / 4.5 (bucketised position
//!   ids per slice).
//! - [`resampler`]: MiniCPM-V 4.0 / 4.5's perceiver resampler with its 2-D sincos positions.
//! - [`attention`]: the one attention block (q/k/v projections, attention, output projection)
//!   every tower uses: encoder self-attention, the pooling head, the 4.6 window attention and the
//!   resampler's cross-attention.
//!
//! This module holds what the towers share: the config, LayerNorm and biased linear layers, the
//! pre-LN encoder layer (bidirectional attention, GELU MLP) and the attention-pooling head. The
//! math is in [`berth_kernels::vision`]; projections run through [`crate::linear::matmul`] so
//! quantised weights work unchanged. Every tower encodes one image per call.

pub mod attention;
pub mod idefics2;
pub mod lfm2_vl;
pub mod minicpmv4_6;
pub mod preprocess;
pub mod resampler;
pub mod siglip;
pub mod siglip2;

use crate::linear::{matmul, MatmulScratch};
use crate::weights::{Matrix, Weights};
use berth_kernels::ops::gelu_tanh;
use berth_kernels::vision::{gelu_erf, layer_norm};
use berth_plugin_api::PluginError;
use serde_json::Value;

pub use attention::{Attention, Keys};

fn fail(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg.into())
}

/// The activation of a vision MLP or projector (`hidden_act` in the config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionAct {
    /// `gelu_pytorch_tanh`: GELU, tanh approximation.
    GeluTanh,
    /// `gelu`: exact GELU (erf).
    GeluErf,
}

impl VisionAct {
    /// Parses a transformers activation name.
    pub fn parse(name: &str) -> Result<VisionAct, PluginError> {
        match name {
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(VisionAct::GeluTanh),
            "gelu" => Ok(VisionAct::GeluErf),
            other => Err(fail(format!("unsupported vision activation {other:?}"))),
        }
    }

    /// Applies the activation in place.
    pub fn apply(self, x: &mut [f32]) {
        let f = match self {
            VisionAct::GeluTanh => gelu_tanh,
            VisionAct::GeluErf => gelu_erf,
        };
        x.iter_mut().for_each(|v| *v = f(*v));
    }
}

/// The shape of a SigLIP-style vision tower (a `*_vision_model` config or a `vision_config`).
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Encoder layers.
    pub num_layers: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
    /// Side of a square patch, in pixels.
    pub patch_size: usize,
    /// Colour channels.
    pub num_channels: usize,
    /// Side of the training image, in pixels (SigLIP; absent for NaViT towers).
    pub image_size: Option<usize>,
    /// Entries of the learned position table (SigLIP2: a square number).
    pub num_patches: usize,
    /// Whether the attention-pooling head is present.
    pub use_head: bool,
    /// MLP activation.
    pub act: VisionAct,
}

impl VisionConfig {
    /// Reads a vision config object (the whole `config.json` of a vision model, or its
    /// `vision_config`).
    pub fn from_json(v: &Value) -> Result<VisionConfig, PluginError> {
        let int = |k: &str| {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| fail(format!("vision config lacks {k}")))
        };
        let opt_int = |k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as usize);
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        if num_heads == 0 || !hidden_size.is_multiple_of(num_heads) {
            return Err(fail(format!(
                "hidden size {hidden_size} is not split by {num_heads} heads"
            )));
        }
        let patch_size = int("patch_size")?;
        let image_size = opt_int("image_size");
        let num_patches = match (opt_int("num_patches"), image_size) {
            (Some(n), _) => n,
            (None, Some(s)) => (s / patch_size).pow(2),
            (None, None) => return Err(fail("vision config has neither num_patches nor image_size")),
        };
        Ok(VisionConfig {
            hidden_size,
            intermediate_size: int("intermediate_size")?,
            num_heads,
            num_layers: int("num_hidden_layers")?,
            layer_norm_eps: v.get("layer_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6) as f32,
            patch_size,
            num_channels: opt_int("num_channels").unwrap_or(3),
            image_size,
            num_patches,
            use_head: v.get("vision_use_head").and_then(Value::as_bool).unwrap_or(true),
            act: VisionAct::parse(
                v.get("hidden_act")
                    .and_then(Value::as_str)
                    .unwrap_or("gelu_pytorch_tanh"),
            )?,
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

/// A LayerNorm with weight and optional bias.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// Scale.
    pub weight: Vec<f32>,
    /// Shift.
    pub bias: Option<Vec<f32>>,
    /// Epsilon.
    pub eps: f32,
}

impl LayerNorm {
    /// Loads `{name}.weight` and, when present, `{name}.bias`.
    pub fn load(w: &Weights, name: &str, eps: f32) -> Result<LayerNorm, PluginError> {
        let weight = w.vector_named(&format!("{name}.weight"))?;
        let bias = opt_vector(w, &format!("{name}.bias"), weight.len())?;
        Ok(LayerNorm { weight, bias, eps })
    }

    /// Normalises every row of `x` (rows of the weight's width) into `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.weight.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            layer_norm(xr, &self.weight, self.bias.as_deref(), self.eps, or);
        }
    }
}

fn opt_vector(w: &Weights, name: &str, len: usize) -> Result<Option<Vec<f32>>, PluginError> {
    if !w.has_named(name) {
        return Ok(None);
    }
    let v = w.vector_named(name)?;
    if v.len() != len {
        return Err(fail(format!("{name}: {} values, {len} expected", v.len())));
    }
    Ok(Some(v))
}

/// A linear layer `y = W x + b` over a [`Matrix`] of any weight type.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Weight, `out × in`.
    pub weight: Matrix,
    /// Bias, `out` values.
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// Loads `{name}.weight` (2-D, or a convolution kernel `[out, …]` flattened to `out` rows)
    /// and, when present, `{name}.bias`; checks the shape against `rows × cols`.
    pub fn load(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Linear, PluginError> {
        let wname = format!("{name}.weight");
        let weight = match w.matrix_named(&wname) {
            Ok(m) => m,
            // A convolution kernel (patch embedding): flattened to rows of `in·kh·kw`.
            Err(_) if w.has_named(&wname) => {
                let v = w.vector_named(&wname)?;
                if v.len() != rows * cols {
                    return Err(fail(format!(
                        "{wname}: {} values, {rows}x{cols} expected",
                        v.len()
                    )));
                }
                Matrix::from_f32(rows, cols, &v)
            }
            Err(e) => return Err(e),
        };
        if weight.rows != rows || weight.cols != cols {
            return Err(fail(format!(
                "{wname}: {}x{}, {rows}x{cols} expected",
                weight.rows, weight.cols
            )));
        }
        let bias = opt_vector(w, &format!("{name}.bias"), rows)?;
        Ok(Linear { weight, bias })
    }

    /// `out[i] = W x[i] + b` for the `n` rows of `x`.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32], scratch: &mut MatmulScratch, threads: usize) {
        matmul(&self.weight, x, n, out, scratch, threads);
        if let Some(b) = &self.bias {
            for row in out[..n * self.weight.rows].chunks_exact_mut(self.weight.rows) {
                row.iter_mut().zip(b).for_each(|(y, &c)| *y += c);
            }
        }
    }
}

/// A two-layer MLP `fc2(act(fc1 x))`.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// First projection.
    pub fc1: Linear,
    /// Second projection.
    pub fc2: Linear,
    /// Activation between them.
    pub act: VisionAct,
}

impl Mlp {
    /// Loads `{name}.fc1` / `{name}.fc2`.
    pub fn load(w: &Weights, name: &str, cfg: &VisionConfig) -> Result<Mlp, PluginError> {
        let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            fc1: Linear::load(w, &format!("{name}.fc1"), f, d)?,
            fc2: Linear::load(w, &format!("{name}.fc2"), d, f)?,
            act: cfg.act,
        })
    }

    /// The MLP of `n` rows of `x` into `out`.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32], scratch: &mut MatmulScratch, threads: usize) {
        let mut h = vec![0.0; n * self.fc1.weight.rows];
        self.fc1.forward(x, n, &mut h, scratch, threads);
        self.act.apply(&mut h);
        self.fc2.forward(&h, n, out, scratch, threads);
    }
}

/// One pre-LN encoder layer: `x += attn(ln1 x)`, `x += mlp(ln2 x)`.
#[derive(Clone, Debug)]
pub struct EncoderLayer {
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Self-attention.
    pub attn: Attention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// Feed-forward.
    pub mlp: Mlp,
}

impl EncoderLayer {
    /// Loads `{name}.layer_norm1`, `.self_attn.{q,k,v,out}_proj`, `.layer_norm2`, `.mlp`.
    pub fn load(w: &Weights, name: &str, cfg: &VisionConfig) -> Result<EncoderLayer, PluginError> {
        let d = cfg.hidden_size;
        let proj = |p: &str| Linear::load(w, &format!("{name}.self_attn.{p}"), d, d);
        Ok(EncoderLayer {
            ln1: LayerNorm::load(w, &format!("{name}.layer_norm1"), cfg.layer_norm_eps)?,
            attn: Attention::new(
                proj("q_proj")?,
                proj("k_proj")?,
                proj("v_proj")?,
                proj("out_proj")?,
                cfg.num_heads,
            ),
            ln2: LayerNorm::load(w, &format!("{name}.layer_norm2"), cfg.layer_norm_eps)?,
            mlp: Mlp::load(w, &format!("{name}.mlp"), cfg)?,
        })
    }

    /// Runs the layer over the `n` rows of `x` in place; masked rows are not attended to (they
    /// still get outputs of their own, as in transformers).
    pub fn forward(
        &self,
        x: &mut [f32],
        n: usize,
        key_mask: Option<&[bool]>,
        scratch: &mut MatmulScratch,
        threads: usize,
    ) {
        let d = self.ln1.weight.len();
        let mut h = vec![0.0; n * d];
        let mut o = vec![0.0; n * d];
        self.ln1.forward(&x[..n * d], &mut h);
        let keys = key_mask.map_or(Keys::All, Keys::Masked);
        self.attn.self_attention(&h, n, keys, &mut o, scratch, threads);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        self.ln2.forward(&x[..n * d], &mut h);
        self.mlp.forward(&h, n, &mut o, scratch, threads);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
    }
}

/// SigLIP's attention-pooling head: a learned probe attends over the patches
/// (`nn.MultiheadAttention`), then a residual LayerNorm + MLP.
#[derive(Clone, Debug)]
pub struct PoolingHead {
    /// The probe (query) vector.
    pub probe: Vec<f32>,
    /// The attention (`in_proj` split into q, k, v; `out_proj`).
    pub attn: Attention,
    /// Norm before the MLP.
    pub ln: LayerNorm,
    /// Feed-forward.
    pub mlp: Mlp,
}

impl PoolingHead {
    /// Loads `{name}.probe`, `.attention.in_proj_{weight,bias}`, `.attention.out_proj`,
    /// `.layernorm`, `.mlp`.
    pub fn load(w: &Weights, name: &str, cfg: &VisionConfig) -> Result<PoolingHead, PluginError> {
        let d = cfg.hidden_size;
        let probe = w.vector_named(&format!("{name}.probe"))?;
        if probe.len() != d {
            return Err(fail(format!(
                "{name}.probe: {} values, {d} expected",
                probe.len()
            )));
        }
        let in_w = w.matrix_named(&format!("{name}.attention.in_proj_weight"))?;
        if in_w.rows != 3 * d || in_w.cols != d {
            return Err(fail(format!(
                "{name}: in_proj is {}x{}, {}x{d} expected",
                in_w.rows,
                in_w.cols,
                3 * d
            )));
        }
        let in_b = opt_vector(w, &format!("{name}.attention.in_proj_bias"), 3 * d)?;
        let part = |i: usize| Linear {
            weight: in_w.slice_rows(i * d, d),
            bias: in_b.as_ref().map(|b| b[i * d..(i + 1) * d].to_vec()),
        };
        Ok(PoolingHead {
            probe,
            attn: Attention::new(
                part(0),
                part(1),
                part(2),
                Linear::load(w, &format!("{name}.attention.out_proj"), d, d)?,
                cfg.num_heads,
            ),
            ln: LayerNorm::load(w, &format!("{name}.layernorm"), cfg.layer_norm_eps)?,
            mlp: Mlp::load(w, &format!("{name}.mlp"), cfg)?,
        })
    }

    /// The pooled vector of the `n` rows of `x`, masked keys left out.
    pub fn forward(
        &self,
        x: &[f32],
        n: usize,
        key_mask: Option<&[bool]>,
        scratch: &mut MatmulScratch,
        threads: usize,
    ) -> Vec<f32> {
        let d = self.probe.len();
        let mut pooled = vec![0.0; d];
        let keys = key_mask.map_or(Keys::All, Keys::Masked);
        self.attn
            .cross_attention(&self.probe, 1, x, x, n, keys, &mut pooled, scratch, threads);
        let mut h = vec![0.0; d];
        self.ln.forward(&pooled, &mut h);
        let mut o = vec![0.0; d];
        self.mlp.forward(&h, 1, &mut o, scratch, threads);
        pooled.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        pooled
    }
}

/// The pre-LN encoder stack, the post LayerNorm and the optional pooling head shared by SigLIP
/// and SigLIP2.
#[derive(Clone, Debug)]
pub struct Encoder {
    /// Encoder layers in order.
    pub layers: Vec<EncoderLayer>,
    /// Norm after the last layer.
    pub post_layernorm: LayerNorm,
    /// Attention-pooling head, when the config has one.
    pub head: Option<PoolingHead>,
}

/// What a vision tower returns for one image.
#[derive(Clone, Debug, Default)]
pub struct VisionOutput {
    /// The embeddings and the output of every layer (`1 + layers` arrays of `n × hidden`), when
    /// asked for.
    pub hidden_states: Vec<Vec<f32>>,
    /// The post-LayerNorm output, `n × hidden`.
    pub last_hidden_state: Vec<f32>,
    /// The pooling head's vector, when the tower has a head.
    pub pooler_output: Option<Vec<f32>>,
}

impl Encoder {
    /// Loads `{prefix}encoder.layers.*`, `{prefix}post_layernorm` and `{prefix}head`.
    pub fn load(w: &Weights, prefix: &str, cfg: &VisionConfig) -> Result<Encoder, PluginError> {
        let layers = (0..cfg.num_layers)
            .map(|i| EncoderLayer::load(w, &format!("{prefix}encoder.layers.{i}"), cfg))
            .collect::<Result<Vec<_>, _>>()?;
        let head = if cfg.use_head && w.has_named(&format!("{prefix}head.probe")) {
            Some(PoolingHead::load(w, &format!("{prefix}head"), cfg)?)
        } else {
            None
        };
        Ok(Encoder {
            layers,
            post_layernorm: LayerNorm::load(w, &format!("{prefix}post_layernorm"), cfg.layer_norm_eps)?,
            head,
        })
    }

    /// Runs the layers over the `n` embeddings in `x`, then the post norm and the head.
    pub fn forward(
        &self,
        mut x: Vec<f32>,
        n: usize,
        key_mask: Option<&[bool]>,
        keep_hidden_states: bool,
        threads: usize,
    ) -> VisionOutput {
        let mut scratch = MatmulScratch::new();
        let mut hidden_states = Vec::new();
        for layer in &self.layers {
            if keep_hidden_states {
                hidden_states.push(x.clone());
            }
            layer.forward(&mut x, n, key_mask, &mut scratch, threads);
        }
        if keep_hidden_states {
            hidden_states.push(x.clone());
        }
        let mut last = vec![0.0; x.len()];
        self.post_layernorm.forward(&x, &mut last);
        let pooler_output = self
            .head
            .as_ref()
            .map(|h| h.forward(&last, n, key_mask, &mut scratch, threads));
        VisionOutput {
            hidden_states,
            last_hidden_state: last,
            pooler_output,
        }
    }
}
