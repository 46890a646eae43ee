//! A generic pre-norm transformer decoder (Llama/Qwen layout, with the switches and per-layer
//! options Gemma 3 and 4, LFM2 and Qwen3.5 need), running a batch of rows from several sequences:
//! linear layers over all rows at once, attention per row against its own sequence's KV cache,
//! and the LM head only for rows that want logits.

use crate::kv::KvCache;
use crate::layers::check_layer;
pub use crate::layers::{
    Activation, AttnShape, AttnWeights, DenseMoe, Ffn, FfnBias, GatedDeltaNet, GatedFfn, KvSource,
    LayerWeights, Mixer, MoeBiases, MoeConfig, Ple, PleLayer, RouterScoring, SharedExpert, ShortConv,
};
use crate::linear::{matmul, matmul_shared, par_units, MatmulScratch};
use crate::ops::{rms_norm, rms_norm_heads, round_f16, softcap, softmax, Rope, Yarn};
use crate::recurrent::{gated_delta_net, short_conv, RecurrentScratch, SeqGroups};
use crate::state::{LayerStateDims, SeqStates};
use crate::weights::{Matrix, Role, TensorId, Weights};
use berth_kernels::attention::{group_attention, group_attention_rows, window_start, HeadOpts, KvRows};
use berth_plugin_api::{BatchView, LogitsOut, PluginError, Rewind};

/// Shape and switches of a decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// Number of layers.
    pub n_layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA).
    pub n_kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Norm weights are applied as `1 + w` (Gemma safetensors; GGUF has the 1 folded in).
    pub norm_add_one: bool,
    /// q/k/v projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head q/k RMSNorm before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norms on the attention and FFN outputs before the residual add (Gemma).
    pub post_norms: bool,
    /// FFN activation.
    pub activation: Activation,
    /// Multiplier of q·k (default `head_dim^-0.5`).
    pub attn_scale: f32,
    /// Sliding-window size per layer (`None` = full causal attention). With `bidirectional`, a
    /// position sees the positions less than this far from it on either side.
    pub sliding_window: Vec<Option<usize>>,
    /// Every position attends to every position of its sequence, later ones too (an encoder:
    /// EmbeddingGemma's `use_bidirectional_attention`). Such a model only embeds whole sequences
    /// ([`Decoder::embed_states`]); decoding it is refused.
    pub bidirectional: bool,
    /// RoPE base per layer.
    pub rope_base: Vec<f32>,
    /// Rotated dimensions per head (default `head_dim`).
    pub rope_dim: usize,
    /// NeoX (rotate_half) RoPE layout rather than interleaved pairs.
    pub rope_neox: bool,
    /// Multiplier of the token embeddings (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Final logit soft-capping.
    pub final_softcap: Option<f32>,
    /// Soft-capping of the attention scores (`cap · tanh(s / cap)` after scaling; Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Linear RoPE scaling factor per layer: frequencies are divided by it (default 1).
    pub rope_scale: Vec<f32>,
    /// YaRN scaling of every layer's RoPE (gpt-oss); replaces `rope_scale` and `rope_f32`.
    pub rope_yarn: Option<Yarn>,
    /// Use the embedding matrix as the LM head even if an output tensor exists.
    pub tie_embeddings: bool,
    /// Routing of the mixture-of-experts FFNs ([`DecoderWeights::load`]: one in every layer).
    pub moe: Option<MoeConfig>,
    /// llama.cpp's default F16 KV cache: keys and values are rounded to f16 when stored. Set for
    /// GGUF models so that the numbers stay close to llama.cpp's.
    pub kv_f16: bool,
    /// ggml-cpu's RoPE angles: f32 running products and `cosf`/`sinf` ([`Rope::new_ggml`]).
    pub rope_f32: bool,
    /// With `rope_dim < head_dim`: pairs are `(j, j + rope_dim/2)` as in HF's partial rotary
    /// (Qwen3.5) rather than `(j, j + head_dim/2)`.
    pub rope_partial_pairs: bool,
    /// Recurrent layers keep a snapshot of their state every this many positions.
    pub snapshot_every: usize,
    /// Most snapshots kept per sequence (0: rewinds of recurrent layers only to 0).
    pub max_snapshots: usize,
    /// Bytes all sequences' snapshots may take together; fewer snapshots are kept per sequence
    /// when `max_snapshots` of every sequence would not fit (a large hybrid model's state is
    /// tens of megabytes per position).
    pub snapshot_budget: usize,
}

impl DecoderConfig {
    /// A Llama-style configuration (SiLU, NeoX RoPE base 10000, eps 1e-6, untied, no extras).
    pub fn new(n_layers: usize, hidden: usize, n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        DecoderConfig {
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            eps: 1e-6,
            norm_add_one: false,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: vec![None; n_layers],
            bidirectional: false,
            rope_base: vec![10000.0; n_layers],
            rope_dim: head_dim,
            rope_neox: true,
            embed_scale: None,
            final_softcap: None,
            attn_softcap: None,
            rope_scale: vec![1.0; n_layers],
            rope_yarn: None,
            tie_embeddings: false,
            moe: None,
            kv_f16: false,
            rope_f32: false,
            rope_partial_pairs: false,
            snapshot_every: 64,
            max_snapshots: 16,
            snapshot_budget: 1 << 30,
        }
    }

    /// Query width: `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Key/value width: `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// All decoder weights.
#[derive(Clone, Debug)]
pub struct DecoderWeights {
    /// Token embeddings (`vocab × hidden`).
    pub embed: Matrix,
    /// Layers.
    pub layers: Vec<LayerWeights>,
    /// Final norm.
    pub output_norm: Vec<f32>,
    /// LM head (`vocab × hidden`); the embedding when tied.
    pub output: Matrix,
    /// Per-layer embeddings (Gemma 4), set by [`DecoderWeights::with_ple`].
    pub ple: Option<Ple>,
    /// Multiplier of each layer's output (Gemma 4's `layer_scalar`), set by
    /// [`DecoderWeights::with_layer_scalars`].
    pub layer_scalars: Option<Vec<f32>>,
}

fn need(w: &Weights, id: TensorId, flag: bool) -> Result<Option<Vec<f32>>, PluginError> {
    if flag {
        w.vector(&id).map(Some)
    } else {
        Ok(None)
    }
}

impl DecoderWeights {
    /// Converts every projection matrix (embedding, head, attention, short convolution, gated
    /// delta-net, dense and expert feed-forwards, routers) to f32, so a run multiplies f32 weights
    /// by f32 activations: the load option `dequantize`, the reference a quantised run's KL
    /// divergence is measured against. A tied head stays one matrix.
    pub fn dequantize(&mut self) {
        self.convert(&Matrix::to_f32);
    }

    /// Quantizes every projection matrix (as [`DecoderWeights::dequantize`] lists them) to Q8_0,
    /// as llama.cpp's `--outtype q8_0` does: the load option `quantize = "q8_0"` for f32 or bf16
    /// packs, a quarter of the memory and the packed integer kernels. Matrices already quantized
    /// stay as they are.
    pub fn quantize_q8_0(&mut self) {
        self.convert(&Matrix::to_q8_0);
    }

    /// Applies `f` to every projection matrix; a tied head stays one matrix.
    fn convert(&mut self, f: &dyn Fn(&Matrix) -> Matrix) {
        let tied = self.output.bytes().as_ptr() == self.embed.bytes().as_ptr();
        self.embed = f(&self.embed);
        self.output = if tied { self.embed.clone() } else { f(&self.output) };
        let ffn = |g: &mut GatedFfn| {
            for m in [&mut g.gate, &mut g.up, &mut g.down] {
                *m = f(m);
            }
        };
        for l in &mut self.layers {
            match &mut l.mixer {
                Mixer::Attention(a) => {
                    a.wq = f(&a.wq);
                    a.wo = f(&a.wo);
                    if let KvSource::Own { wk, wv, .. } = &mut a.kv {
                        *wk = f(wk);
                        if let Some(v) = wv {
                            *v = f(v);
                        }
                    }
                }
                Mixer::ShortConv(c) => {
                    c.in_proj = f(&c.in_proj);
                    c.out_proj = f(&c.out_proj);
                }
                Mixer::GatedDeltaNet(d) => {
                    for m in [
                        &mut d.in_qkv,
                        &mut d.in_z,
                        &mut d.in_b,
                        &mut d.in_a,
                        &mut d.out_proj,
                    ] {
                        *m = f(m);
                    }
                }
            }
            match &mut l.ffn {
                Ffn::Dense(dense) => ffn(dense),
                Ffn::Moe {
                    router,
                    experts,
                    shared,
                    ..
                } => {
                    *router = f(router);
                    experts.iter_mut().for_each(ffn);
                    if let Some(s) = shared {
                        ffn(&mut s.ffn);
                        if let Some(g) = &mut s.gate {
                            *g = f(g);
                        }
                    }
                }
                Ffn::DenseMoe(d) => {
                    ffn(&mut d.dense);
                    d.router = f(&d.router);
                    d.experts.iter_mut().for_each(ffn);
                }
            }
        }
    }

    /// Loads the standard decoder tensors named by [`TensorId`]s, honouring the config's switches.
    pub fn load(w: &Weights, cfg: &DecoderConfig) -> Result<DecoderWeights, PluginError> {
        let embed = w.matrix(&TensorId::global(Role::TokenEmbd))?;
        let out_id = TensorId::global(Role::Output);
        let output = if cfg.tie_embeddings || !w.has(&out_id) {
            embed.clone()
        } else {
            w.matrix(&out_id)?
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let id = |r| TensorId::layer(r, i);
            let ffn = match cfg.moe {
                None => Ffn::Dense(GatedFfn {
                    gate: w.matrix(&id(Role::FfnGate))?,
                    up: w.matrix(&id(Role::FfnUp))?,
                    down: w.matrix(&id(Role::FfnDown))?,
                }),
                Some(m) => {
                    let gates = w.experts(Role::FfnGateExps, i, m.n_experts)?;
                    let ups = w.experts(Role::FfnUpExps, i, m.n_experts)?;
                    let downs = w.experts(Role::FfnDownExps, i, m.n_experts)?;
                    Ffn::Moe {
                        router: w.matrix(&id(Role::FfnGateInp))?,
                        experts: gates
                            .into_iter()
                            .zip(ups)
                            .zip(downs)
                            .map(|((gate, up), down)| GatedFfn { gate, up, down })
                            .collect(),
                        selection_bias: None,
                        shared: None,
                        biases: None,
                    }
                }
            };
            let layer = LayerWeights {
                attn_norm: w.vector(&id(Role::AttnNorm))?,
                mixer: Mixer::Attention(Box::new(AttnWeights {
                    wq: w.matrix(&id(Role::AttnQ))?,
                    wo: w.matrix(&id(Role::AttnOut))?,
                    bo: None,
                    sinks: None,
                    bq: need(w, id(Role::AttnQ).bias(), cfg.qkv_bias)?,
                    q_norm: need(w, id(Role::AttnQNorm), cfg.qk_norm)?,
                    kv: KvSource::Own {
                        wk: w.matrix(&id(Role::AttnK))?,
                        wv: Some(w.matrix(&id(Role::AttnV))?),
                        bk: need(w, id(Role::AttnK).bias(), cfg.qkv_bias)?,
                        bv: need(w, id(Role::AttnV).bias(), cfg.qkv_bias)?,
                        k_norm: need(w, id(Role::AttnKNorm), cfg.qk_norm)?,
                    },
                    gated: false,
                    v_norm: false,
                    shape: None,
                })),
                post_attn_norm: need(w, id(Role::PostAttnNorm), cfg.post_norms)?,
                ffn_norm: w.vector(&id(Role::FfnNorm))?,
                post_ffw_norm: need(w, id(Role::PostFfwNorm), cfg.post_norms)?,
                ffn,
            };
            layers.push(layer);
        }
        DecoderWeights::new(
            cfg,
            embed,
            layers,
            w.vector(&TensorId::global(Role::OutputNorm))?,
            output,
        )
    }

    /// Assembles weights a family mapped itself, checking every layer's shapes against `cfg`.
    pub fn new(
        cfg: &DecoderConfig,
        embed: Matrix,
        layers: Vec<LayerWeights>,
        output_norm: Vec<f32>,
        output: Matrix,
    ) -> Result<DecoderWeights, PluginError> {
        if layers.len() != cfg.n_layers {
            return Err(PluginError::failed(format!(
                "{} layers mapped; the config has {}",
                layers.len(),
                cfg.n_layers
            )));
        }
        for (i, l) in layers.iter().enumerate() {
            check_layer(l, cfg, i)?;
        }
        if embed.cols != cfg.hidden || output.cols != cfg.hidden || output_norm.len() != cfg.hidden {
            return Err(PluginError::failed(format!(
                "embedding/output/norm width {}/{}/{} differs from hidden size {}",
                embed.cols,
                output.cols,
                output_norm.len(),
                cfg.hidden
            )));
        }
        for (i, l) in layers.iter().enumerate() {
            if let Mixer::Attention(a) = &l.mixer {
                if let KvSource::Shared(src) = a.kv {
                    let geometry = layers[..i].get(src).and_then(|s| match &s.mixer {
                        Mixer::Attention(b) if matches!(b.kv, KvSource::Own { .. }) => Some(b.geometry(cfg)),
                        _ => None,
                    });
                    let (hd, nkv) = a.geometry(cfg);
                    if geometry != Some((hd, nkv)) {
                        return Err(PluginError::failed(format!(
                            "layer {i}: layer {src} is no earlier attention layer with its own cache of {nkv} heads of {hd}"
                        )));
                    }
                }
            }
        }
        Ok(DecoderWeights {
            embed,
            layers,
            output_norm,
            output,
            ple: None,
            layer_scalars: None,
        })
    }

    /// Adds per-layer embeddings, checking their shapes.
    pub fn with_ple(mut self, ple: Ple) -> Result<DecoderWeights, PluginError> {
        let (n, h, d) = (self.layers.len(), self.embed.cols, ple.dim);
        let layers_ok = ple.layers.len() == n
            && ple.layers.iter().all(|l| {
                (
                    l.gate.rows,
                    l.gate.cols,
                    l.proj.rows,
                    l.proj.cols,
                    l.post_norm.len(),
                ) == (d, h, h, d, h)
            });
        if d == 0
            || ple.embed.cols != n * d
            || (ple.projection.rows, ple.projection.cols) != (n * d, h)
            || ple.norm.len() != d
            || !layers_ok
        {
            return Err(PluginError::failed(format!(
                "per-layer embeddings {:?} / projection {:?} do not fit {n} layers of {d} and hidden {h}",
                ple.embed, ple.projection
            )));
        }
        self.ple = Some(ple);
        Ok(self)
    }

    /// Sets a multiplier of each layer's output.
    pub fn with_layer_scalars(mut self, scalars: Vec<f32>) -> Result<DecoderWeights, PluginError> {
        if scalars.len() != self.layers.len() {
            return Err(PluginError::failed(format!(
                "{} layer scalars for {} layers",
                scalars.len(),
                self.layers.len()
            )));
        }
        self.layer_scalars = Some(scalars);
        Ok(self)
    }

    /// Token ids the embeddings cover (the smaller table's rows when there are per-layer ones).
    pub fn vocab_in(&self) -> usize {
        self.ple
            .as_ref()
            .map_or(self.embed.rows, |p| p.embed.rows.min(self.embed.rows))
    }
}

/// Reusable buffers for a forward pass.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ffn_out: Vec<f32>,
    router: Vec<f32>,
    moe_in: Vec<f32>,
    moe_out: Vec<f32>,
    assign: Vec<Vec<(usize, f32)>>,
    head_in: Vec<f32>,
    logits: Vec<f32>,
    cs: Vec<(f32, f32)>,
    qgate: Vec<f32>,
    head: Vec<f32>,
    moe_x: Vec<f32>,
    moe_acc: Vec<f32>,
    pli: Vec<f32>,
    ple_row: Vec<f32>,
    ple_gate: Vec<f32>,
    groups: SeqGroups,
    rec: RecurrentScratch,
    mm: MatmulScratch,
    seq_next: Vec<Option<usize>>,
    rows: Vec<(usize, usize)>,
    // Batch arrangement (see `Decoder::decode`): rows per sequence, row order, rows reordered.
    per_seq: Vec<usize>,
    order: Vec<usize>,
    rows_in: Vec<(usize, usize)>,
    tokens: Vec<i32>,
    want: Vec<u8>,
    rank: Vec<usize>,
    dest: Vec<usize>,
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// A decoder with its KV cache and scratch space: the whole per-instance state of a model.
pub struct Decoder {
    /// Configuration.
    pub cfg: DecoderConfig,
    /// Weights.
    pub weights: DecoderWeights,
    /// KV cache of every sequence (attention layers).
    pub kv: KvCache,
    /// Convolution and recurrent state of every sequence (the other layers).
    pub states: SeqStates,
    /// Compute threads.
    pub threads: usize,
    ropes: Vec<Rope>,
    geometry: Vec<Option<AttnGeometry>>,
    s: Scratch,
}

/// The shape of one attention layer's heads and the cache it reads.
#[derive(Clone, Copy, Debug)]
struct AttnGeometry {
    head_dim: usize,
    n_kv_heads: usize,
    /// The layer whose cache holds the keys and values.
    kv_layer: usize,
    window: Option<usize>,
}

impl AttnGeometry {
    fn of(cfg: &DecoderConfig, mixer: &Mixer, layer: usize) -> Option<AttnGeometry> {
        let window = cfg.sliding_window.get(layer).copied().flatten();
        match mixer {
            Mixer::Attention(a) => {
                let (head_dim, n_kv_heads) = a.geometry(cfg);
                Some(AttnGeometry {
                    head_dim,
                    n_kv_heads,
                    kv_layer: match a.kv {
                        KvSource::Own { .. } => layer,
                        KvSource::Shared(src) => src,
                    },
                    window,
                })
            }
            _ => None,
        }
    }

    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Floats this layer keeps per position in its own cache.
    fn cached(&self, layer: usize) -> usize {
        if self.kv_layer == layer {
            self.kv_dim()
        } else {
            0
        }
    }
}

impl Decoder {
    /// A decoder for `max_seqs` sequences of at most `max_len` positions.
    pub fn new(
        cfg: DecoderConfig,
        weights: DecoderWeights,
        max_seqs: usize,
        max_len: usize,
        threads: usize,
    ) -> Decoder {
        let ropes = cfg
            .rope_base
            .iter()
            .enumerate()
            .map(|(l, &b)| {
                if let Some(shape) = weights
                    .layers
                    .get(l)
                    .and_then(|l| l.mixer.attention()?.shape.as_ref())
                {
                    return shape.rope.clone();
                }
                if let Some(y) = &cfg.rope_yarn {
                    let mut r = Rope::new_yarn(b, cfg.head_dim, cfg.rope_dim, cfg.rope_neox, y);
                    if cfg.rope_partial_pairs {
                        r.half = cfg.rope_dim / 2;
                    }
                    return r;
                }
                let f = cfg.rope_scale.get(l).copied().unwrap_or(1.0);
                if cfg.rope_f32 {
                    return Rope::new_ggml(b, cfg.head_dim, cfg.rope_dim, cfg.rope_neox, 1.0 / f);
                }
                let mut r = if cfg.rope_partial_pairs {
                    Rope::new_partial(b, cfg.head_dim, cfg.rope_dim)
                } else {
                    Rope::new(b, cfg.head_dim, cfg.rope_dim, cfg.rope_neox)
                };
                if f != 1.0 {
                    r.inv_freq.iter_mut().for_each(|v| *v /= f);
                }
                r
            })
            .collect();
        let geometry: Vec<Option<AttnGeometry>> = (weights.layers.iter().enumerate())
            .map(|(l, lw)| AttnGeometry::of(&cfg, &lw.mixer, l))
            .collect();
        let kv_dims = (geometry.iter().enumerate())
            .map(|(l, g)| g.map_or(0, |g| g.cached(l)))
            .collect();
        let kv = KvCache::new(kv_dims, max_seqs, max_len);
        let state_dims: Vec<LayerStateDims> = weights
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attention(_) => LayerStateDims::default(),
                Mixer::ShortConv(c) => LayerStateDims {
                    conv: (c.kernel - 1) * c.out_proj.rows,
                    recurrent: 0,
                },
                Mixer::GatedDeltaNet(d) => LayerStateDims {
                    conv: (d.kernel - 1) * d.conv_channels(),
                    recurrent: d.state_len(),
                },
            })
            .collect();
        let max_snapshots = budgeted_snapshots(&state_dims, max_seqs, cfg.max_snapshots, cfg.snapshot_budget);
        let states = SeqStates::new(state_dims, max_seqs, cfg.snapshot_every, max_snapshots);
        Decoder {
            cfg,
            weights,
            kv,
            states,
            threads: threads.max(1),
            ropes,
            geometry,
            s: Scratch::default(),
        }
    }

    /// Logits per row: the LM head's rows.
    pub fn vocab_size(&self) -> usize {
        self.weights.output.rows
    }

    /// Positions held by sequence `seq`.
    pub fn seq_len(&self, seq: i32) -> Result<usize, PluginError> {
        Ok(self.kv.seq_len(self.kv.check_seq(seq)?))
    }

    /// How far back a sequence can be cut: anywhere without recurrent layers, else to the
    /// snapshots [`SeqStates`] keeps (or only to 0 when it keeps none).
    pub fn rewind(&self) -> Rewind {
        if !self.states.is_recurrent() {
            Rewind::Anywhere
        } else if self.states.max_snapshots() == 0 {
            Rewind::OnlyToStart
        } else {
            Rewind::Snapshots {
                every: self.states.every() as u32,
            }
        }
    }

    /// Drops every position at or after `len` from a sequence; recurrent layers refuse a
    /// position they hold no snapshot of (the sequence is then unchanged).
    pub fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        let s = self.kv.check_seq(seq)?;
        let current = self.kv.seq_len(s);
        self.states.truncate(s, len as usize, current)?;
        self.kv.truncate(s, len as usize);
        Ok(())
    }

    /// Copies sequence `src` into `dst`.
    pub fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        let (s, d) = (self.kv.check_seq(src)?, self.kv.check_seq(dst)?);
        self.kv.fork(s, d);
        self.states.fork(s, d);
        Ok(())
    }

    /// Feeds one token to a sequence at its next position without computing logits.
    pub fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        let pos = self.seq_len(seq)? as i32;
        let batch = BatchView {
            tokens: &[token],
            positions: &[pos],
            seq_ids: &[seq],
            want_logits: &[0],
        };
        self.decode(&batch, &mut LogitsOut::new(&mut [], self.vocab_size()))
    }

    /// Runs a batch (the plugin `decode` contract): each row's position must be its sequence's
    /// next one; one logits row is written per row that wants logits, in batch order.
    pub fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        self.decode_with_embeddings(batch, &[], logits)
    }

    /// [`Decoder::decode`] with some rows' input embeddings given by the caller: each
    /// `(row, embedding)` of `embeds` (a batch row index and `hidden` floats) replaces that row's
    /// token embedding (after any embedding scale) as the first layer's input, as transformers
    /// places `inputs_embeds` (image features at image-token positions). The row's token must
    /// still be a valid id; per-layer embeddings (Gemma 4) still come from it.
    pub fn decode_with_embeddings(
        &mut self,
        batch: &BatchView<'_>,
        embeds: &[(usize, &[f32])],
        logits: &mut LogitsOut<'_>,
    ) -> Result<(), PluginError> {
        batch.validate()?;
        if self.cfg.bidirectional {
            return Err(PluginError::unsupported(
                "this is an embedding model (bidirectional attention): it embeds text and does not generate",
            ));
        }
        let n = batch.len();
        for (k, &(row, e)) in embeds.iter().enumerate() {
            if row >= n || e.len() != self.cfg.hidden {
                return Err(PluginError::invalid_argument(format!(
                    "embedding for row {row} of {n}: {} floats, hidden size {}",
                    e.len(),
                    self.cfg.hidden
                )));
            }
            if embeds[..k].iter().any(|&(r, _)| r == row) {
                return Err(PluginError::invalid_argument(format!(
                    "row {row} is given two embeddings"
                )));
            }
        }
        let vocab = self.vocab_size();
        let want = batch.logit_rows();
        if want > 0 && logits.row_len() < vocab {
            return Err(PluginError::invalid_argument(format!(
                "logits rows hold {} floats; the vocabulary has {vocab}",
                logits.row_len()
            )));
        }
        if logits.capacity_rows() < want {
            return Err(PluginError::invalid_argument(format!(
                "logits buffer holds {} rows; {want} wanted",
                logits.capacity_rows()
            )));
        }
        let s = &mut self.s;
        s.seq_next.clear();
        s.seq_next.resize(self.kv.max_sequences(), None);
        s.rows.clear();
        for i in 0..n {
            let seq = self.kv.check_seq(batch.seq_ids[i])?;
            let tok = batch.tokens[i];
            if tok < 0 || tok as usize >= self.weights.vocab_in() {
                return Err(PluginError::invalid_argument(format!(
                    "token {tok} outside the vocabulary (size {})",
                    self.weights.vocab_in()
                )));
            }
            let next = s.seq_next[seq].unwrap_or_else(|| self.kv.seq_len(seq));
            let pos = batch.positions[i];
            if pos < 0 || pos as usize != next {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq}: position {pos} is not its next position {next}"
                )));
            }
            if next >= self.kv.max_len() {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq} is full ({} positions)",
                    self.kv.max_len()
                )));
            }
            s.seq_next[seq] = Some(next + 1);
            s.rows.push((seq, next));
        }
        for (seq, next) in s.seq_next.iter().enumerate() {
            if let Some(len) = *next {
                self.kv.reserve(seq, len);
            }
        }
        // Continuous batching: the rows of sequences with several rows here (a prompt chunk) go
        // first, so that attention finds them in runs; one-row sequences (decode steps) follow.
        // Matmuls round every row as a single row would (packed or single-order kernels) and
        // attention computes each row alone or bit for bit as alone, so each row's logits are
        // those of running its sequence alone. Logits still come out in batch order.
        s.per_seq.clear();
        s.per_seq.resize(self.kv.max_sequences(), 0);
        for &(seq, _) in &s.rows {
            s.per_seq[seq] += 1;
        }
        let (rows, per_seq) = (&s.rows, &s.per_seq);
        s.order.clear();
        s.order.extend(0..n);
        if per_seq.iter().filter(|&&c| c > 0).count() > 1 {
            s.order.sort_by_key(|&i| per_seq[rows[i].0] == 1);
        }
        s.tokens.clear();
        s.tokens.extend(s.order.iter().map(|&i| batch.tokens[i]));
        s.want.clear();
        s.want.extend(s.order.iter().map(|&i| batch.want_logits[i]));
        s.rows_in.clear();
        s.rows_in.extend_from_slice(&s.rows);
        s.rows.clear();
        s.rows.extend(s.order.iter().map(|&i| s.rows_in[i]));
        s.rank.clear();
        let mut j = 0;
        for &w in batch.want_logits {
            s.rank.push(j);
            j += usize::from(w != 0);
        }
        s.dest.clear();
        s.dest.extend(
            s.order
                .iter()
                .filter(|&&i| batch.want_logits[i] != 0)
                .map(|&i| s.rank[i]),
        );
        let (tokens, want, dest) = (
            std::mem::take(&mut s.tokens),
            std::mem::take(&mut s.want),
            std::mem::take(&mut s.dest),
        );
        if self.states.is_recurrent() {
            self.s.groups.build(&self.s.rows);
        }
        // The given embeddings by forward-pass row (rows run in `order`); no allocation without.
        let placed: Vec<(usize, &[f32])> = embeds
            .iter()
            .map(|&(row, e)| {
                let j = self.s.order.iter().position(|&i| i == row);
                (j.expect("every row is in the order"), e)
            })
            .collect();
        self.forward(&tokens, &placed, &want, &dest, logits, None);
        (self.s.tokens, self.s.want, self.s.dest) = (tokens, want, dest);
        let s = &mut self.s;
        for (seq, next) in s.seq_next.iter().enumerate() {
            if let Some(len) = *next {
                self.kv.set_len(seq, len);
            }
        }
        Ok(())
    }

    /// The final-normed hidden states of whole sequences (an embedding model's token states),
    /// all in one forward pass: sequence `k` of `seqs` runs from position 0 in slot `k`, emptied
    /// before and released after (its keys and values are not needed once the states are out).
    /// Returns `[row][hidden]`, the sequences' rows back to back.
    pub fn embed_states(&mut self, seqs: &[&[i32]]) -> Result<Vec<f32>, PluginError> {
        if self.states.is_recurrent() {
            return Err(PluginError::unsupported(
                "embedding with convolution or recurrent layers",
            ));
        }
        if seqs.len() > self.kv.max_sequences() {
            return Err(PluginError::invalid_argument(format!(
                "{} sequences to embed; the model holds {} at once",
                seqs.len(),
                self.kv.max_sequences()
            )));
        }
        for (k, seq) in seqs.iter().enumerate() {
            if seq.is_empty() || seq.len() > self.kv.max_len() {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {k} has {} tokens; 1 to {} can be embedded",
                    seq.len(),
                    self.kv.max_len()
                )));
            }
            if let Some(&t) = seq
                .iter()
                .find(|&&t| t < 0 || t as usize >= self.weights.vocab_in())
            {
                return Err(PluginError::invalid_argument(format!(
                    "token {t} outside the vocabulary (size {})",
                    self.weights.vocab_in()
                )));
            }
        }
        let s = &mut self.s;
        s.seq_next.clear();
        s.seq_next.resize(self.kv.max_sequences(), None);
        s.rows.clear();
        let mut tokens = Vec::with_capacity(seqs.iter().map(|q| q.len()).sum());
        for (k, seq) in seqs.iter().enumerate() {
            self.kv.set_len(k, 0);
            self.kv.reserve(k, seq.len());
            s.seq_next[k] = Some(seq.len());
            s.rows.extend((0..seq.len()).map(|pos| (k, pos)));
            tokens.extend_from_slice(seq);
        }
        let want = vec![0u8; tokens.len()];
        let mut hidden = Vec::new();
        let vocab = self.vocab_size();
        self.forward(
            &tokens,
            &[],
            &want,
            &[],
            &mut LogitsOut::new(&mut [], vocab),
            Some(&mut hidden),
        );
        for k in 0..seqs.len() {
            self.kv.release(k);
        }
        Ok(hidden)
    }

    /// The forward pass over validated rows (`self.s.rows` holds each row's sequence and position).
    /// `embeds`: rows (in this order) whose input is given rather than their token's; `dest`: the
    /// logits row of each row that wants logits.
    fn forward(
        &mut self,
        tokens: &[i32],
        embeds: &[(usize, &[f32])],
        want_logits: &[u8],
        dest: &[usize],
        logits: &mut LogitsOut<'_>,
        hidden: Option<&mut Vec<f32>>,
    ) {
        let cfg = &self.cfg;
        let w = &self.weights;
        let s = &mut self.s;
        let kv = &mut self.kv;
        let threads = self.threads;
        let n = tokens.len();
        let h = cfg.hidden;
        s.mm.tiled = false;

        let x = grow(&mut s.x, n * h);
        for (i, &t) in tokens.iter().enumerate() {
            let row = &mut x[i * h..(i + 1) * h];
            w.embed.dequantize_row(t as usize, row);
            if let Some(scale) = cfg.embed_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        for &(i, e) in embeds {
            x[i * h..(i + 1) * h].copy_from_slice(e);
        }

        // Per-layer inputs: (norm(projection(x) / sqrt(hidden)) + embed(token) · scale) / sqrt(2).
        if let Some(p) = &w.ple {
            let width = w.layers.len() * p.dim;
            let pli = grow(&mut s.pli, n * width);
            matmul(&p.projection, x, n, pli, &mut s.mm, threads);
            let row_in = grow(&mut s.ple_row, width);
            let root = (h as f32).powf(-0.5);
            for (i, &t) in tokens.iter().enumerate() {
                let row = &mut pli[i * width..(i + 1) * width];
                row.iter_mut().for_each(|v| *v *= root);
                rms_norm_heads(row, &p.norm, cfg.eps, cfg.norm_add_one);
                p.embed.dequantize_row(t as usize, row_in);
                for (a, b) in row.iter_mut().zip(row_in.iter()) {
                    *a = (*a + b * p.embed_scale) * std::f32::consts::FRAC_1_SQRT_2;
                }
            }
        }

        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            let x = &mut s.x[..n * h];
            let xn = grow(&mut s.xn, n * h);
            for i in 0..n {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    Some(&lw.attn_norm),
                    cfg.eps,
                    cfg.norm_add_one,
                    &mut xn[i * h..(i + 1) * h],
                );
            }
            let o = grow(&mut s.o, n * h);
            match &lw.mixer {
                Mixer::Attention(_) => {
                    let p = AttnProj::of(&lw.mixer);
                    let g = self.geometry[l].expect("attention layers have a geometry");
                    let (hd, kvd) = (g.head_dim, g.kv_dim());
                    let qd = cfg.n_heads * hd;
                    let rope = &self.ropes[l];
                    let q = grow(&mut s.q, n * if p.gated { 2 * qd } else { qd });
                    match p.kv {
                        Some((wk, Some(wv))) => {
                            let (k, v) = (grow(&mut s.k, n * kvd), grow(&mut s.v, n * kvd));
                            let mut qkv = [(p.wq, &mut *q), (wk, &mut *k), (wv, &mut *v)];
                            matmul_shared(xn, n, &mut qkv, &mut s.mm, threads);
                        }
                        Some((wk, None)) => {
                            let k = grow(&mut s.k, n * kvd);
                            matmul_shared(xn, n, &mut [(p.wq, &mut *q), (wk, &mut *k)], &mut s.mm, threads);
                            grow(&mut s.v, n * kvd).copy_from_slice(k);
                        }
                        None => matmul(p.wq, xn, n, q, &mut s.mm, threads),
                    }
                    if p.gated {
                        split_query_gate(q, grow(&mut s.qgate, n * qd), n, cfg.n_heads, hd);
                    }
                    let q = &mut s.q[..n * qd];
                    for i in 0..n {
                        let qr = &mut q[i * qd..(i + 1) * qd];
                        add_bias(qr, p.bq);
                        if let Some(qn) = p.q_norm {
                            rms_norm_heads(qr, qn, cfg.eps, cfg.norm_add_one);
                        }
                        let (seq, pos) = s.rows[i];
                        rope.angles(pos, &mut s.cs);
                        rope.apply(qr, &s.cs);
                        if p.kv.is_none() {
                            continue;
                        }
                        let (kr, vr) = (&mut s.k[i * kvd..(i + 1) * kvd], &mut s.v[i * kvd..(i + 1) * kvd]);
                        add_bias(kr, p.bk);
                        add_bias(vr, p.bv);
                        if let Some(kn) = p.k_norm {
                            rms_norm_heads(kr, kn, cfg.eps, cfg.norm_add_one);
                        }
                        rope.apply(kr, &s.cs);
                        if p.v_norm {
                            norm_heads_unweighted(vr, hd, cfg.eps, &mut s.head);
                        }
                        if cfg.kv_f16 {
                            kr.iter_mut()
                                .chain(vr.iter_mut())
                                .for_each(|x| *x = round_f16(*x));
                        }
                        kv.write(seq, l, pos, kr, vr);
                    }
                    let att = grow(&mut s.att, n * qd);
                    let ends = cfg.bidirectional.then_some(s.seq_next.as_slice());
                    attention(cfg, kv, g, p.sinks, &s.rows, ends, q, att, threads);
                    if p.gated {
                        att.iter_mut()
                            .zip(&s.qgate[..n * qd])
                            .for_each(|(a, &g)| *a *= 1.0 / (1.0 + (-g).exp()));
                    }
                    matmul(p.wo, att, n, o, &mut s.mm, threads);
                    if p.bo.is_some() {
                        o.chunks_exact_mut(h).for_each(|row| add_bias(row, p.bo));
                    }
                }
                Mixer::ShortConv(c) => short_conv(
                    c,
                    l,
                    xn,
                    n,
                    &s.groups,
                    &mut self.states,
                    o,
                    &mut s.rec,
                    &mut s.mm,
                    threads,
                ),
                Mixer::GatedDeltaNet(d) => gated_delta_net(
                    d,
                    l,
                    cfg.eps,
                    xn,
                    n,
                    &s.groups,
                    &mut self.states,
                    o,
                    &mut s.rec,
                    &mut s.mm,
                    threads,
                ),
            }
            let x = &mut s.x[..n * h];
            let xn = &mut s.xn[..n * h];
            for i in 0..n {
                let (orow, xr) = (&mut o[i * h..(i + 1) * h], &mut x[i * h..(i + 1) * h]);
                if let Some(pn) = &lw.post_attn_norm {
                    let tmp = &mut xn[i * h..(i + 1) * h];
                    rms_norm(orow, Some(pn), cfg.eps, cfg.norm_add_one, tmp);
                    orow.copy_from_slice(tmp);
                }
                xr.iter_mut().zip(orow.iter()).for_each(|(a, b)| *a += b);
            }

            // Feed-forward block.
            for i in 0..n {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    Some(&lw.ffn_norm),
                    cfg.eps,
                    cfg.norm_add_one,
                    &mut xn[i * h..(i + 1) * h],
                );
            }
            let out = grow(&mut s.ffn_out, n * h);
            match &lw.ffn {
                Ffn::Dense(f) => gated_ffn(
                    f,
                    None,
                    cfg.activation,
                    xn,
                    n,
                    out,
                    &mut s.gate,
                    &mut s.up,
                    &mut s.mm,
                    threads,
                ),
                Ffn::Moe {
                    router,
                    experts,
                    selection_bias,
                    shared,
                    biases,
                } => {
                    let moe = cfg.moe.expect("MoE weights need a MoE config");
                    let ne = router.rows;
                    let r = grow(&mut s.router, n * ne);
                    matmul(router, xn, n, r, &mut s.mm, threads);
                    if let Some(b) = biases {
                        r.chunks_exact_mut(ne)
                            .for_each(|row| add_bias(row, Some(&b.router)));
                    }
                    route(&moe, r, ne, selection_bias.as_deref(), None, &mut s.assign);
                    // Experts see subsets of rows: tile them all (MoE batches are not split).
                    s.mm.tiled = true;
                    let ex = ExpertScratch {
                        input: &mut s.moe_in,
                        output: &mut s.moe_out,
                        gate: &mut s.gate,
                        up: &mut s.up,
                        mm: &mut s.mm,
                    };
                    let biases = biases.as_ref().map(|b| b.experts.as_slice());
                    run_experts(
                        experts,
                        biases,
                        cfg.activation,
                        xn,
                        h,
                        &s.assign,
                        out,
                        ex,
                        threads,
                    );
                    if let Some(se) = shared {
                        let so = grow(&mut s.moe_out, n * h);
                        gated_ffn(
                            &se.ffn,
                            None,
                            cfg.activation,
                            xn,
                            n,
                            so,
                            &mut s.gate,
                            &mut s.up,
                            &mut s.mm,
                            threads,
                        );
                        let sg = grow(&mut s.moe_in, n);
                        match &se.gate {
                            Some(g) => {
                                matmul(g, xn, n, sg, &mut s.mm, threads);
                                sg.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
                            }
                            None => sg.fill(1.0),
                        }
                        for i in 0..n {
                            out[i * h..(i + 1) * h]
                                .iter_mut()
                                .zip(&so[i * h..(i + 1) * h])
                                .for_each(|(a, b)| *a += sg[i] * b);
                        }
                    }
                    s.mm.tiled = false;
                }
                Ffn::DenseMoe(m) => {
                    let moe = cfg.moe.expect("MoE weights need a MoE config");
                    gated_ffn(
                        &m.dense,
                        None,
                        cfg.activation,
                        xn,
                        n,
                        out,
                        &mut s.gate,
                        &mut s.up,
                        &mut s.mm,
                        threads,
                    );
                    // The router reads rms(x) · scale / sqrt(hidden) of the residual.
                    let xin = grow(&mut s.moe_x, n * h);
                    let root = (h as f32).powf(-0.5);
                    for i in 0..n {
                        let row = &mut xin[i * h..(i + 1) * h];
                        rms_norm(&x[i * h..(i + 1) * h], None, cfg.eps, false, row);
                        row.iter_mut()
                            .zip(&m.router_scale)
                            .for_each(|(a, b)| *a *= b * root);
                    }
                    let ne = m.router.rows;
                    let r = grow(&mut s.router, n * ne);
                    matmul(&m.router, xin, n, r, &mut s.mm, threads);
                    route(&moe, r, ne, None, Some(&m.expert_scale), &mut s.assign);
                    for i in 0..n {
                        let row = &mut xin[i * h..(i + 1) * h];
                        rms_norm(
                            &x[i * h..(i + 1) * h],
                            Some(&m.pre_experts_norm),
                            cfg.eps,
                            cfg.norm_add_one,
                            row,
                        );
                    }
                    let acc = grow(&mut s.moe_acc, n * h);
                    s.mm.tiled = true;
                    let ex = ExpertScratch {
                        input: &mut s.moe_in,
                        output: &mut s.moe_out,
                        gate: &mut s.gate,
                        up: &mut s.up,
                        mm: &mut s.mm,
                    };
                    run_experts(
                        &m.experts,
                        None,
                        cfg.activation,
                        xin,
                        h,
                        &s.assign,
                        acc,
                        ex,
                        threads,
                    );
                    s.mm.tiled = false;
                    // out = post_dense(dense) + post_experts(experts).
                    for i in 0..n {
                        let (orow, tmp) = (&mut out[i * h..(i + 1) * h], &mut xn[i * h..(i + 1) * h]);
                        rms_norm(orow, Some(&m.post_dense_norm), cfg.eps, cfg.norm_add_one, tmp);
                        orow.copy_from_slice(tmp);
                        rms_norm(
                            &acc[i * h..(i + 1) * h],
                            Some(&m.post_experts_norm),
                            cfg.eps,
                            cfg.norm_add_one,
                            tmp,
                        );
                        orow.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);
                    }
                }
            }
            for i in 0..n {
                let orow = &mut out[i * h..(i + 1) * h];
                if let Some(pn) = &lw.post_ffw_norm {
                    let tmp = &mut xn[i * h..(i + 1) * h];
                    rms_norm(orow, Some(pn), cfg.eps, cfg.norm_add_one, tmp);
                    orow.copy_from_slice(tmp);
                }
                x[i * h..(i + 1) * h]
                    .iter_mut()
                    .zip(orow.iter())
                    .for_each(|(a, b)| *a += b);
            }

            // Per-layer input: x += post_norm(proj(act(gate(x)) · input_l)).
            if let Some(p) = &w.ple {
                let (pl, d) = (&p.layers[l], p.dim);
                let width = w.layers.len() * d;
                let g = grow(&mut s.ple_gate, n * d);
                matmul(&pl.gate, x, n, g, &mut s.mm, threads);
                for i in 0..n {
                    let src = &s.pli[i * width + l * d..i * width + (l + 1) * d];
                    for (a, b) in g[i * d..(i + 1) * d].iter_mut().zip(src) {
                        *a = cfg.activation.apply(*a) * b;
                    }
                }
                let o = grow(&mut s.o, n * h);
                matmul(&pl.proj, g, n, o, &mut s.mm, threads);
                for i in 0..n {
                    let tmp = &mut xn[i * h..(i + 1) * h];
                    rms_norm(
                        &o[i * h..(i + 1) * h],
                        Some(&pl.post_norm),
                        cfg.eps,
                        cfg.norm_add_one,
                        tmp,
                    );
                    x[i * h..(i + 1) * h]
                        .iter_mut()
                        .zip(tmp.iter())
                        .for_each(|(a, b)| *a += b);
                }
            }
            if let Some(scale) = w.layer_scalars.as_ref().map(|v| v[l]).filter(|&v| v != 1.0) {
                x.iter_mut().for_each(|v| *v *= scale);
            }
        }

        // Every row's final-normed state, when the caller embeds.
        if let Some(out) = hidden {
            out.clear();
            out.resize(n * h, 0.0);
            for (row, dst) in s.x[..n * h].chunks_exact(h).zip(out.chunks_exact_mut(h)) {
                rms_norm(row, Some(&w.output_norm), cfg.eps, cfg.norm_add_one, dst);
            }
        }

        // Final norm and LM head for the rows that want logits.
        let m = want_logits.iter().filter(|&&wl| wl != 0).count();
        if m == 0 {
            return;
        }
        let x = &s.x[..n * h];
        let hin = grow(&mut s.head_in, m * h);
        let mut j = 0;
        for i in 0..n {
            if want_logits[i] != 0 {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    Some(&w.output_norm),
                    cfg.eps,
                    cfg.norm_add_one,
                    &mut hin[j * h..(j + 1) * h],
                );
                j += 1;
            }
        }
        let vocab = w.output.rows;
        s.mm.tiled = false;
        if m == 1 {
            // One row (a decode step): straight into the caller's buffer, without a copy.
            let dst = logits.row_mut(dest[0]);
            let (row, pad) = dst.split_at_mut(vocab);
            matmul(&w.output, hin, 1, row, &mut s.mm, threads);
            if let Some(cap) = cfg.final_softcap {
                softcap(row, cap);
            }
            pad.fill(f32::NEG_INFINITY);
            return;
        }
        let lg = grow(&mut s.logits, m * vocab);
        matmul(&w.output, hin, m, lg, &mut s.mm, threads);
        for j in 0..m {
            let src = &mut lg[j * vocab..(j + 1) * vocab];
            if let Some(cap) = cfg.final_softcap {
                softcap(src, cap);
            }
            let dst = logits.row_mut(dest[j]);
            dst[..vocab].copy_from_slice(src);
            dst[vocab..].fill(f32::NEG_INFINITY);
        }
    }
}

/// Splits a gated query projection (`[row][head][query | gate]`) into the queries, compacted in
/// place to `[row][head][query]`, and the gates.
fn split_query_gate(q: &mut [f32], gate: &mut [f32], n: usize, heads: usize, hd: usize) {
    for i in 0..n {
        for hh in 0..heads {
            let src = (i * heads + hh) * 2 * hd;
            let dst = (i * heads + hh) * hd;
            gate[dst..dst + hd].copy_from_slice(&q[src + hd..src + 2 * hd]);
            q.copy_within(src..src + hd, dst);
        }
    }
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        x.iter_mut().zip(b).for_each(|(a, b)| *a += b);
    }
}

/// `out = down(act(gate(x)) * up(x))` for `n` rows ([`Activation::glu`]), with each
/// projection's bias when `bias` is given.
#[allow(clippy::too_many_arguments)]
fn gated_ffn(
    f: &GatedFfn,
    bias: Option<&FfnBias>,
    act: Activation,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    gate: &mut Vec<f32>,
    up: &mut Vec<f32>,
    mm: &mut MatmulScratch,
    threads: usize,
) {
    let d = f.gate.rows;
    let g = grow(gate, n * d);
    let u = grow(up, n * d);
    matmul_shared(x, n, &mut [(&f.gate, &mut *g), (&f.up, &mut *u)], mm, threads);
    if let Some(b) = bias {
        g.chunks_exact_mut(d).for_each(|row| add_bias(row, Some(&b.gate)));
        u.chunks_exact_mut(d).for_each(|row| add_bias(row, Some(&b.up)));
    }
    let u: &[f32] = u;
    par_units(if n * d < 1 << 14 { 1 } else { threads }, g, d, |rows, gs| {
        for (i, row) in rows.zip(gs.chunks_exact_mut(d)) {
            act.glu_row(row, &u[i * d..(i + 1) * d]);
        }
    });
    matmul(&f.down, g, n, out, mm, threads);
    if let Some(b) = bias {
        let h = f.down.rows;
        out[..n * h]
            .chunks_exact_mut(h)
            .for_each(|row| add_bias(row, Some(&b.down)));
    }
}

/// Scratch of [`run_experts`].
struct ExpertScratch<'a> {
    input: &'a mut Vec<f32>,
    output: &'a mut Vec<f32>,
    gate: &'a mut Vec<f32>,
    up: &'a mut Vec<f32>,
    mm: &'a mut MatmulScratch,
}

/// Turns each row's router logits (`r`, `rows × ne`) into scores in place, picks the top-k
/// experts (by score plus `selection_bias`) and fills `assign[e]` with `(row, weight)`: the score,
/// renormalised over the picked ones if asked, times the routed scale and `expert_scale[e]`.
fn route(
    moe: &MoeConfig,
    r: &mut [f32],
    ne: usize,
    selection_bias: Option<&[f32]>,
    expert_scale: Option<&[f32]>,
    assign: &mut Vec<Vec<(usize, f32)>>,
) {
    assign.resize_with(ne, Vec::new);
    assign.iter_mut().for_each(Vec::clear);
    if ne == 0 {
        return;
    }
    for (i, p) in r.chunks_exact_mut(ne).enumerate() {
        match moe.scoring {
            RouterScoring::Softmax => softmax(p),
            RouterScoring::Sigmoid => p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
            RouterScoring::TopKSoftmax => {}
        }
        let score = |e: usize| p[e] + selection_bias.map_or(0.0, |b| b[e]);
        let mut picked = [(0usize, 0.0f32); 64];
        let k = moe.top_k.min(ne).min(64);
        for slot in 0..k {
            let mut best = usize::MAX;
            for e in 0..ne {
                if picked[..slot].iter().any(|&(pe2, _)| pe2 == e) {
                    continue;
                }
                if best == usize::MAX || score(e) > score(best) {
                    best = e;
                }
            }
            picked[slot] = (best, p[best]);
        }
        if moe.scoring == RouterScoring::TopKSoftmax {
            let mut w = [0.0f32; 64];
            w[..k].iter_mut().zip(&picked[..k]).for_each(|(w, p)| *w = p.1);
            softmax(&mut w[..k]);
            picked[..k].iter_mut().zip(&w[..k]).for_each(|(p, &w)| p.1 = w);
        }
        let sum: f32 = picked[..k].iter().map(|x| x.1).sum::<f32>() + moe.norm_eps;
        for &(e, pe) in &picked[..k] {
            let wgt = if moe.norm_topk_prob { pe / sum } else { pe };
            let wgt = wgt * moe.routed_scale;
            assign[e].push((i, expert_scale.map_or(wgt, |s| wgt * s[e])));
        }
    }
}

/// `out` (rows of `h`) = the weighted sum of the experts each row of `x` was assigned to.
#[allow(clippy::too_many_arguments)]
fn run_experts(
    experts: &[GatedFfn],
    biases: Option<&[FfnBias]>,
    act: Activation,
    x: &[f32],
    h: usize,
    assign: &[Vec<(usize, f32)>],
    out: &mut [f32],
    s: ExpertScratch<'_>,
    threads: usize,
) {
    out.fill(0.0);
    for (e, rows) in assign.iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let m = rows.len();
        let inp = grow(s.input, m * h);
        for (j, &(i, _)) in rows.iter().enumerate() {
            inp[j * h..(j + 1) * h].copy_from_slice(&x[i * h..(i + 1) * h]);
        }
        let eo = grow(s.output, m * h);
        let bias = biases.map(|b| &b[e]);
        gated_ffn(&experts[e], bias, act, inp, m, eo, s.gate, s.up, s.mm, threads);
        for (j, &(i, wgt)) in rows.iter().enumerate() {
            out[i * h..(i + 1) * h]
                .iter_mut()
                .zip(&eo[j * h..(j + 1) * h])
                .for_each(|(a, b)| *a += wgt * b);
        }
    }
}

/// RMS norm without a weight over each `d`-sized head of `x`, in place (`tmp`: scratch).
fn norm_heads_unweighted(x: &mut [f32], d: usize, eps: f32, tmp: &mut Vec<f32>) {
    let t = grow(tmp, d);
    for head in x.chunks_exact_mut(d) {
        t.copy_from_slice(head);
        rms_norm(t, None, eps, false, head);
    }
}

/// One attention layer's projections and switches, whichever mixer holds them.
struct AttnProj<'a> {
    wq: &'a Matrix,
    wo: &'a Matrix,
    bo: Option<&'a [f32]>,
    sinks: Option<&'a [f32]>,
    /// Key and value projections when the layer fills its own cache (no value projection: the
    /// values are the keys).
    kv: Option<(&'a Matrix, Option<&'a Matrix>)>,
    bq: Option<&'a [f32]>,
    bk: Option<&'a [f32]>,
    bv: Option<&'a [f32]>,
    q_norm: Option<&'a [f32]>,
    k_norm: Option<&'a [f32]>,
    v_norm: bool,
    gated: bool,
}

impl<'a> AttnProj<'a> {
    fn of(m: &'a Mixer) -> AttnProj<'a> {
        let Mixer::Attention(a) = m else {
            unreachable!("not an attention mixer")
        };
        let (kv, bk, bv, k_norm) = match &a.kv {
            KvSource::Own {
                wk,
                wv,
                bk,
                bv,
                k_norm,
            } => (
                Some((wk, wv.as_ref())),
                bk.as_deref(),
                bv.as_deref(),
                k_norm.as_deref(),
            ),
            KvSource::Shared(_) => (None, None, None, None),
        };
        AttnProj {
            wq: &a.wq,
            wo: &a.wo,
            bo: a.bo.as_deref(),
            sinks: a.sinks.as_deref(),
            kv,
            bq: a.bq.as_deref(),
            bk,
            bv,
            q_norm: a.q_norm.as_deref(),
            k_norm,
            v_norm: a.v_norm,
            gated: a.gated,
        }
    }
}

/// Causal (optionally sliding-window) GQA attention of every row against its sequence's cache,
/// parallel over (row, head) pairs.
///
/// Each row is computed bit for bit as if it were alone in the batch (the kernels over several rows
/// or heads keep each one's summation order), so continuous batching of several sequences gives
/// each one the numbers of its single-sequence steps.
#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &DecoderConfig,
    kv: &KvCache,
    g: AttnGeometry,
    sinks: Option<&[f32]>,
    rows: &[(usize, usize)],
    ends: Option<&[Option<usize>]>,
    q: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let (hd, nh, kvd) = (g.head_dim, cfg.n_heads, g.kv_dim());
    // What a row at `pos` of sequence `seq` attends to: causal (up to itself, within the window
    // behind it) or, given each sequence's end, bidirectional (within the window on both sides).
    let span = |seq: usize, pos: usize| match ends {
        None => (window_start(pos, g.window), pos + 1),
        Some(ends) => {
            let end = ends[seq].unwrap_or(pos + 1);
            match g.window {
                Some(w) => (pos.saturating_sub(w.saturating_sub(1)), end.min(pos + w)),
                None => (0, end),
            }
        }
    };
    let group = nh / g.n_kv_heads;
    let opts = HeadOpts {
        scale: cfg.attn_scale,
        softcap: cfg.attn_softcap,
        sink: None,
    };
    let work: usize = rows.iter().map(|&(_, p)| p + 1).sum::<usize>() * nh * hd;
    let threads = if work < (1 << 16) { 1 } else { threads };
    // Consecutive rows of one sequence run together in blocks (each cached key and value read
    // once for the block's rows, where the kernels can), and so do query heads sharing a KV head,
    // as many of both as still leaves a unit of work per thread.
    // Decode steps (no two rows of a sequence) keep one row per unit and allocate nothing.
    let runs = rows.windows(2).any(|w| w[0].0 == w[1].0 && w[1].1 == w[0].1 + 1);
    let mut block = if runs { ROW_BLOCK } else { 1 };
    let (blocks, sub) = loop {
        let blocks = row_blocks(rows, block);
        let n_units = |sub: usize| blocks.len().max(rows.len() * usize::from(block == 1)) * nh / sub;
        let sub = (1..=group)
            .rev()
            .find(|&d| group.is_multiple_of(d) && n_units(d) >= threads)
            .unwrap_or(1);
        if n_units(sub) >= threads || block == 1 {
            break (blocks, sub);
        }
        block /= 2;
    };
    thread_local! {
        // Per-thread buffers kept between calls: a warm decode step does not allocate.
        static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
        static OPTS: std::cell::Cell<Vec<HeadOpts>> = const { std::cell::Cell::new(Vec::new()) };
        static QS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let per_row = nh / sub;
    // A row's KV range for heads from `head` on.
    let kv_rows = |row: usize, head: usize| {
        let (seq, pos) = rows[row];
        let (start, end) = span(seq, pos);
        let (ks, vs) = kv.layer(seq, g.kv_layer, end);
        let kh = head / group;
        KvRows {
            k: &ks[kh * hd..],
            v: &vs[kh * hd..],
            stride: kvd,
            start,
            end,
        }
    };
    let head_opts_of = |head_opts: &mut Vec<HeadOpts>, head: usize| {
        head_opts.clear();
        head_opts.extend((head..head + sub).map(|h| HeadOpts {
            sink: sinks.map(|s| s[h]),
            ..opts
        }));
    };
    if block == 1 {
        // One row per block (decode steps): each unit writes its heads of `out` in place.
        par_units(threads, out, sub * hd, |units, dst| {
            let mut scores = SCORES.take();
            let mut head_opts = OPTS.take();
            for (u, o) in units.zip(dst.chunks_exact_mut(sub * hd)) {
                let (row, head) = (u / per_row, (u % per_row) * sub);
                let base = row * nh * hd + head * hd;
                head_opts_of(&mut head_opts, head);
                group_attention(
                    &q[base..base + sub * hd],
                    &kv_rows(row, head),
                    &head_opts,
                    &mut scores,
                    o,
                );
            }
            SCORES.set(scores);
            OPTS.set(head_opts);
        });
        return;
    }
    // Blocks of rows: each unit's rows x heads go to a buffer in unit order, then to `out`.
    let unit = block * sub * hd;
    let mut staged = vec![0.0f32; blocks.len() * per_row * unit];
    par_units(threads, &mut staged, unit, |units, dst| {
        let mut scores = SCORES.take();
        let mut head_opts = OPTS.take();
        let mut qs = QS.take();
        for (u, o) in units.zip(dst.chunks_exact_mut(unit)) {
            let (b, head) = (u / per_row, (u % per_row) * sub);
            let span = blocks[b].clone();
            head_opts_of(&mut head_opts, head);
            qs.clear();
            for row in span.clone() {
                let base = row * nh * hd + head * hd;
                qs.extend_from_slice(&q[base..base + sub * hd]);
            }
            let o = &mut o[..span.len() * sub * hd];
            let kvs: Vec<KvRows> = span.map(|row| kv_rows(row, head)).collect();
            group_attention_rows(&qs, &kvs, &head_opts, &mut scores, o);
        }
        SCORES.set(scores);
        OPTS.set(head_opts);
        QS.set(qs);
    });
    for (u, src) in staged.chunks_exact(unit).enumerate() {
        let (b, head) = (u / per_row, (u % per_row) * sub);
        for (row, s) in blocks[b].clone().zip(src.chunks_exact(sub * hd)) {
            let base = row * nh * hd + head * hd;
            out[base..base + sub * hd].copy_from_slice(s);
        }
    }
}

/// Rows of one sequence at consecutive positions run through attention together, this many at
/// most.
const ROW_BLOCK: usize = 8;

/// The batch's rows in blocks of at most `max` consecutive rows of one sequence at consecutive
/// positions.
fn row_blocks(rows: &[(usize, usize)], max: usize) -> Vec<std::ops::Range<usize>> {
    if max == 1 {
        return Vec::new();
    }
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let mut j = i + 1;
        while j < rows.len() && j - i < max && rows[j].0 == rows[i].0 && rows[j].1 == rows[j - 1].1 + 1 {
            j += 1;
        }
        blocks.push(i..j);
        i = j;
    }
    blocks
}

/// Snapshots per sequence that fit `budget` bytes for `max_seqs` sequences, at most `wanted`.
fn budgeted_snapshots(dims: &[LayerStateDims], max_seqs: usize, wanted: usize, budget: usize) -> usize {
    let per_snapshot: usize = dims.iter().map(|d| (d.conv + d.recurrent) * 4).sum();
    if per_snapshot == 0 {
        return wanted;
    }
    wanted.min(budget / (per_snapshot * max_seqs.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_softmax_routes_by_raw_logits_and_normalises_the_picked() {
        let moe = MoeConfig {
            scoring: RouterScoring::TopKSoftmax,
            ..MoeConfig::softmax(4, 2, false)
        };
        // Two rows: experts 1 and 2 win the first, 0 and 3 the second.
        let mut r = [1.0, 3.0, 2.0, 0.0, 5.0, -1.0, -2.0, 4.0];
        let mut assign = Vec::new();
        route(&moe, &mut r, 4, None, None, &mut assign);
        let e = std::f64::consts::E;
        let (hi, lo) = ((e / (e + 1.0)) as f32, (1.0 / (e + 1.0)) as f32);
        let close = |got: &[(usize, f32)], want: &[(usize, f32)]| {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!(g.0 == w.0 && (g.1 - w.1).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        };
        // assign[expert] = [(row, weight)].
        close(&assign[0], &[(1, hi)]);
        close(&assign[1], &[(0, hi)]);
        close(&assign[2], &[(0, lo)]);
        close(&assign[3], &[(1, lo)]);
    }

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_ways() {
        let act = Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        };
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        // gate 10 -> 7, up -9 -> -7: 7·σ(1.702·7)·(-7 + 1).
        let want = 7.0 * sig(1.702 * 7.0) * -6.0;
        assert!((act.glu(10.0, -9.0) as f64 - want).abs() < 1e-5);
        // No lower clamp of the gate; up inside the limits: -10·σ(-17.02)·(2 + 1).
        let want = -10.0 * sig(-17.02) * 3.0;
        assert!((act.glu(-10.0, 2.0) as f64 - want).abs() < 1e-9);
        // Up above the limit.
        let want = 0.5 * sig(0.851) * 8.0;
        assert!((act.glu(0.5, 100.0) as f64 - want).abs() < 1e-6);
        assert_eq!(Activation::Silu.glu(2.0, 3.0), Activation::Silu.apply(2.0) * 3.0);
    }

    /// A random two-layer decoder (a short convolution, then attention) of hidden size 16.
    fn tiny_decoder() -> Decoder {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
                })
                .collect()
        };
        let (h, vocab, ff) = (16, 32, 24);
        let mut mat = |r: usize, c: usize| Matrix::from_f32(r, c, &rand(r * c));
        let ffn = |mat: &mut dyn FnMut(usize, usize) -> Matrix| {
            Ffn::Dense(GatedFfn {
                gate: mat(ff, h),
                up: mat(ff, h),
                down: mat(h, ff),
            })
        };
        let cfg = DecoderConfig::new(2, h, 4, 2, 4);
        let conv = LayerWeights {
            attn_norm: vec![1.0; h],
            mixer: Mixer::ShortConv(ShortConv {
                in_proj: mat(3 * h, h),
                conv: vec![0.3; h * 3],
                kernel: 3,
                out_proj: mat(h, h),
            }),
            post_attn_norm: None,
            ffn_norm: vec![1.0; h],
            post_ffw_norm: None,
            ffn: ffn(&mut mat),
        };
        let attn = LayerWeights {
            attn_norm: vec![1.0; h],
            mixer: Mixer::Attention(Box::new(AttnWeights::new(
                mat(16, h),
                mat(8, h),
                mat(8, h),
                mat(h, 16),
            ))),
            post_attn_norm: None,
            ffn_norm: vec![1.0; h],
            post_ffw_norm: None,
            ffn: ffn(&mut mat),
        };
        let (embed, output) = (mat(vocab, h), mat(vocab, h));
        let weights = DecoderWeights::new(&cfg, embed, vec![conv, attn], vec![1.0; h], output).unwrap();
        Decoder::new(cfg, weights, 2, 16, 1)
    }

    /// Logits of every row of a batch: sequence 0 takes three rows, sequence 1 one (so the rows
    /// are reordered inside), with `embeds` given.
    fn run(tokens: &[i32; 4], embeds: &[(usize, &[f32])]) -> Vec<f32> {
        let mut d = tiny_decoder();
        let vocab = d.vocab_size();
        let mut out = vec![0.0; 4 * vocab];
        let batch = BatchView {
            tokens,
            positions: &[0, 0, 1, 2],
            seq_ids: &[0, 1, 0, 0],
            want_logits: &[1; 4],
        };
        d.decode_with_embeddings(&batch, embeds, &mut LogitsOut::new(&mut out, vocab))
            .unwrap();
        out
    }

    #[test]
    fn given_embeddings_replace_the_token_rows_they_name() {
        let tokens = [3, 7, 11, 5];
        let plain = run(&tokens, &[]);
        let d = tiny_decoder();
        let h = d.cfg.hidden;
        let row_of = |t: i32| {
            let mut r = vec![0.0; h];
            d.weights.embed.dequantize_row(t as usize, &mut r);
            r
        };
        // A row's own embedding changes nothing, bit for bit.
        let (e7, e11) = (row_of(7), row_of(11));
        assert_eq!(run(&tokens, &[(1, &e7), (2, &e11)]), plain);
        // Another token's embedding is that token: rows 1 (alone in its sequence) and 2 (inside
        // a prompt) each take the given vector, and the rest of sequence 0 sees it.
        let (e20, e9) = (row_of(20), row_of(9));
        let swapped = run(&tokens, &[(2, &e20), (1, &e9)]);
        assert_eq!(swapped, run(&[3, 9, 20, 5], &[]));
        assert_ne!(swapped, plain);
        // A wrong width, a row outside the batch or a row given twice is refused.
        let mut dd = tiny_decoder();
        let mut out = vec![0.0; 32];
        let batch = BatchView {
            tokens: &[1],
            positions: &[0],
            seq_ids: &[0],
            want_logits: &[1],
        };
        let mut lo = LogitsOut::new(&mut out, 32);
        assert!(dd
            .decode_with_embeddings(&batch, &[(0, &e7[..8])], &mut lo)
            .is_err());
        assert!(dd.decode_with_embeddings(&batch, &[(1, &e7)], &mut lo).is_err());
        assert!(dd
            .decode_with_embeddings(&batch, &[(0, &e7), (0, &e9)], &mut lo)
            .is_err());
        assert!(dd.decode_with_embeddings(&batch, &[(0, &e7)], &mut lo).is_ok());
    }

    #[test]
    fn snapshots_per_sequence_follow_the_memory_budget() {
        let tiny = [LayerStateDims {
            conv: 10,
            recurrent: 100,
        }; 2];
        assert_eq!(budgeted_snapshots(&tiny, 16, 16, 1 << 30), 16);
        // A Qwen3.5-9B-like state: 24 delta-net layers of 32 heads × 128 × 128.
        let big = vec![
            LayerStateDims {
                conv: 3 * 8192,
                recurrent: 32 * 128 * 128
            };
            24
        ];
        assert_eq!(budgeted_snapshots(&big, 16, 16, 1 << 30), 1);
        assert_eq!(budgeted_snapshots(&big, 64, 16, 1 << 30), 0);
        assert_eq!(budgeted_snapshots(&[LayerStateDims::default()], 16, 16, 0), 16);
    }
}
