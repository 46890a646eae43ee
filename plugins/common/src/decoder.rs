//! A generic pre-norm transformer decoder (Llama/Qwen layout, with the switches Gemma needs),
//! running a batch of rows from several sequences: linear layers over all rows at once,
//! attention per row against its own sequence's KV cache, and the LM head only for rows that
//! want logits.

use crate::ggml::{dot_f16, softmax_ggml, F16DotOrder};
use crate::kv::KvCache;
use crate::linear::{matmul, matmul_shared, par_units, MatmulScratch};
use crate::ops::{
    gelu_tanh, gelu_tanh_f16, rms_norm, rms_norm_heads, round_f16, silu, softcap, softmax, Rope,
};
use crate::weights::{Matrix, Role, TensorId, Weights};
use berth_kernels::dot::dot_f32;
use berth_plugin_api::{BatchView, LogitsOut, PluginError};

/// The gated activation of the FFN: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): Llama, Qwen.
    Silu,
    /// GELU with the tanh approximation (GeGLU): Gemma.
    GeluTanh,
    /// GELU with the tanh approximation through ggml-cpu's f16 table ([`gelu_tanh_f16`]).
    GeluTanhF16,
}

impl Activation {
    /// Applies the activation.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => silu(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::GeluTanhF16 => gelu_tanh_f16(x),
        }
    }
}

/// Mixture-of-experts FFN settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Number of experts.
    pub n_experts: usize,
    /// Experts used per token.
    pub top_k: usize,
    /// Renormalise the top-k router weights to sum to one.
    pub norm_topk_prob: bool,
}

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
    /// Sliding-window size per layer (`None` = full causal attention).
    pub sliding_window: Vec<Option<usize>>,
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
    /// Use the embedding matrix as the LM head even if an output tensor exists.
    pub tie_embeddings: bool,
    /// Mixture-of-experts FFN in every layer.
    pub moe: Option<MoeConfig>,
    /// llama.cpp's default F16 KV cache and non-flash attention: keys and values are rounded to
    /// f16 when stored, and queries and attention probabilities are rounded to f16 before their
    /// products (f32 accumulation). Set for GGUF models so that greedy decoding follows llama.cpp.
    pub kv_f16: bool,
    /// With `kv_f16`: the attention scale multiplies the queries before their f16 rounding
    /// (llama.cpp's Gemma graphs) rather than the scores (its default `kq_scale`).
    pub q_prescale: bool,
    /// ggml-cpu's RoPE angles: f32 running products and `cosf`/`sinf` ([`Rope::new_ggml`]).
    pub rope_f32: bool,
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
            rope_base: vec![10000.0; n_layers],
            rope_dim: head_dim,
            rope_neox: true,
            embed_scale: None,
            final_softcap: None,
            attn_softcap: None,
            rope_scale: vec![1.0; n_layers],
            tie_embeddings: false,
            moe: None,
            kv_f16: false,
            q_prescale: false,
            rope_f32: false,
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

/// One expert's (or a dense layer's) gated FFN.
#[derive(Clone, Debug)]
pub struct GatedFfn {
    /// Gate projection (`ffn × hidden`).
    pub gate: Matrix,
    /// Up projection (`ffn × hidden`).
    pub up: Matrix,
    /// Down projection (`hidden × ffn`).
    pub down: Matrix,
}

/// A layer's feed-forward block.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// One gated FFN.
    Dense(GatedFfn),
    /// A softmax router over experts, top-k.
    Moe {
        /// Router (`n_experts × hidden`).
        router: Matrix,
        /// The experts.
        experts: Vec<GatedFfn>,
    },
}

/// Weights of one decoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// Pre-attention norm.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub wq: Matrix,
    /// Key projection.
    pub wk: Matrix,
    /// Value projection.
    pub wv: Matrix,
    /// Output projection.
    pub wo: Matrix,
    /// Query bias.
    pub bq: Option<Vec<f32>>,
    /// Key bias.
    pub bk: Option<Vec<f32>>,
    /// Value bias.
    pub bv: Option<Vec<f32>>,
    /// Per-head query norm.
    pub q_norm: Option<Vec<f32>>,
    /// Per-head key norm.
    pub k_norm: Option<Vec<f32>>,
    /// Norm of the attention output (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    /// Pre-FFN norm.
    pub ffn_norm: Vec<f32>,
    /// Norm of the FFN output (Gemma).
    pub post_ffw_norm: Option<Vec<f32>>,
    /// Feed-forward block.
    pub ffn: Ffn,
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
}

fn need(w: &Weights, id: TensorId, flag: bool) -> Result<Option<Vec<f32>>, PluginError> {
    if flag {
        w.vector(&id).map(Some)
    } else {
        Ok(None)
    }
}

impl DecoderWeights {
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
                    }
                }
            };
            let layer = LayerWeights {
                attn_norm: w.vector(&id(Role::AttnNorm))?,
                wq: w.matrix(&id(Role::AttnQ))?,
                wk: w.matrix(&id(Role::AttnK))?,
                wv: w.matrix(&id(Role::AttnV))?,
                wo: w.matrix(&id(Role::AttnOut))?,
                bq: need(w, id(Role::AttnQ).bias(), cfg.qkv_bias)?,
                bk: need(w, id(Role::AttnK).bias(), cfg.qkv_bias)?,
                bv: need(w, id(Role::AttnV).bias(), cfg.qkv_bias)?,
                q_norm: need(w, id(Role::AttnQNorm), cfg.qk_norm)?,
                k_norm: need(w, id(Role::AttnKNorm), cfg.qk_norm)?,
                post_attn_norm: need(w, id(Role::PostAttnNorm), cfg.post_norms)?,
                ffn_norm: w.vector(&id(Role::FfnNorm))?,
                post_ffw_norm: need(w, id(Role::PostFfwNorm), cfg.post_norms)?,
                ffn,
            };
            check_layer(&layer, cfg, i)?;
            layers.push(layer);
        }
        if embed.cols != cfg.hidden || output.cols != cfg.hidden {
            return Err(PluginError::failed(format!(
                "embedding/output width {}/{} differs from hidden size {}",
                embed.cols, output.cols, cfg.hidden
            )));
        }
        Ok(DecoderWeights {
            embed,
            layers,
            output_norm: w.vector(&TensorId::global(Role::OutputNorm))?,
            output,
        })
    }
}

fn check_layer(l: &LayerWeights, cfg: &DecoderConfig, i: usize) -> Result<(), PluginError> {
    let (h, q, kv) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
    let ok = l.wq.rows == q
        && l.wq.cols == h
        && l.wk.rows == kv
        && l.wk.cols == h
        && l.wv.rows == kv
        && l.wv.cols == h
        && l.wo.rows == h
        && l.wo.cols == q
        && l.attn_norm.len() == h
        && l.ffn_norm.len() == h;
    if !ok {
        return Err(PluginError::failed(format!(
            "layer {i}: attention shapes q {:?} k {:?} v {:?} o {:?} do not fit hidden {h}, {} heads, {} kv heads of {}",
            l.wq, l.wk, l.wv, l.wo, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        )));
    }
    Ok(())
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
    /// KV cache of every sequence.
    pub kv: KvCache,
    /// Compute threads.
    pub threads: usize,
    ropes: Vec<Rope>,
    s: Scratch,
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
                let f = cfg.rope_scale.get(l).copied().unwrap_or(1.0);
                if cfg.rope_f32 {
                    return Rope::new_ggml(b, cfg.head_dim, cfg.rope_dim, cfg.rope_neox, 1.0 / f);
                }
                let mut r = Rope::new(b, cfg.head_dim, cfg.rope_dim, cfg.rope_neox);
                if f != 1.0 {
                    r.inv_freq.iter_mut().for_each(|v| *v /= f);
                }
                r
            })
            .collect();
        let kv = KvCache::new(vec![cfg.kv_dim(); cfg.n_layers], max_seqs, max_len);
        Decoder {
            cfg,
            weights,
            kv,
            threads: threads.max(1),
            ropes,
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

    /// Drops every position at or after `len` from a sequence.
    pub fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        let s = self.kv.check_seq(seq)?;
        self.kv.truncate(s, len as usize);
        Ok(())
    }

    /// Copies sequence `src` into `dst`.
    pub fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        let (s, d) = (self.kv.check_seq(src)?, self.kv.check_seq(dst)?);
        self.kv.fork(s, d);
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
        batch.validate()?;
        let n = batch.len();
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
            if tok < 0 || tok as usize >= self.weights.embed.rows {
                return Err(PluginError::invalid_argument(format!(
                    "token {tok} outside the vocabulary (size {})",
                    self.weights.embed.rows
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
        // first and are tiled as they would be alone; one-row sequences (decode steps) follow and
        // round as single-row steps. Logits still come out in batch order.
        s.per_seq.clear();
        s.per_seq.resize(self.kv.max_sequences(), 0);
        for &(seq, _) in &s.rows {
            s.per_seq[seq] += 1;
        }
        let per_seq = &s.per_seq;
        let several = per_seq.iter().filter(|&&c| c > 0).count() > 1;
        s.order.clear();
        s.order.extend(0..n);
        if several {
            let rows = &s.rows;
            s.order.sort_by_key(|&i| per_seq[rows[i].0] == 1);
        }
        let gemm = s
            .order
            .iter()
            .take_while(|&&i| !several || per_seq[s.rows[i].0] > 1)
            .count();
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
        let head_gemm = s.want[..gemm].iter().filter(|&&w| w != 0).count();
        let (tokens, want, dest) = (
            std::mem::take(&mut s.tokens),
            std::mem::take(&mut s.want),
            std::mem::take(&mut s.dest),
        );
        self.forward(&tokens, &want, (gemm, head_gemm), &dest, logits);
        (self.s.tokens, self.s.want, self.s.dest) = (tokens, want, dest);
        let s = &mut self.s;
        for (seq, next) in s.seq_next.iter().enumerate() {
            if let Some(len) = *next {
                self.kv.set_len(seq, len);
            }
        }
        Ok(())
    }

    /// The forward pass over validated rows (`self.s.rows` holds each row's sequence and position).
    /// `gemm`: rows (all, then those wanting logits) tiled as one matrix, the rest rounding as
    /// single rows; `dest`: the logits row of each row that wants logits.
    fn forward(
        &mut self,
        tokens: &[i32],
        want_logits: &[u8],
        gemm: (usize, usize),
        dest: &[usize],
        logits: &mut LogitsOut<'_>,
    ) {
        let cfg = &self.cfg;
        let w = &self.weights;
        let s = &mut self.s;
        let kv = &mut self.kv;
        let threads = self.threads;
        let n = tokens.len();
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        s.mm.gemm_rows = Some(gemm.0);

        let x = grow(&mut s.x, n * h);
        for (i, &t) in tokens.iter().enumerate() {
            let row = &mut x[i * h..(i + 1) * h];
            w.embed.dequantize_row(t as usize, row);
            if let Some(scale) = cfg.embed_scale {
                row.iter_mut().for_each(|v| *v *= scale);
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
            let q = grow(&mut s.q, n * qd);
            let k = grow(&mut s.k, n * kvd);
            let v = grow(&mut s.v, n * kvd);
            let mut qkv = [(&lw.wq, &mut *q), (&lw.wk, &mut *k), (&lw.wv, &mut *v)];
            matmul_shared(xn, n, &mut qkv, &mut s.mm, threads);
            for i in 0..n {
                let (qr, kr, vr) = (
                    &mut q[i * qd..(i + 1) * qd],
                    &mut k[i * kvd..(i + 1) * kvd],
                    &mut v[i * kvd..(i + 1) * kvd],
                );
                add_bias(qr, lw.bq.as_deref());
                add_bias(kr, lw.bk.as_deref());
                add_bias(vr, lw.bv.as_deref());
                if let Some(qn) = &lw.q_norm {
                    rms_norm_heads(qr, qn, cfg.eps, cfg.norm_add_one);
                }
                if let Some(kn) = &lw.k_norm {
                    rms_norm_heads(kr, kn, cfg.eps, cfg.norm_add_one);
                }
                let (seq, pos) = s.rows[i];
                self.ropes[l].angles(pos, &mut s.cs);
                self.ropes[l].apply(qr, &s.cs);
                self.ropes[l].apply(kr, &s.cs);
                if cfg.kv_f16 {
                    kr.iter_mut()
                        .chain(vr.iter_mut())
                        .for_each(|x| *x = round_f16(*x));
                }
                kv.write(seq, l, pos, kr, vr);
            }
            let att = grow(&mut s.att, n * qd);
            attention(cfg, kv, l, &s.rows, &s.per_seq, q, att, threads);
            let o = grow(&mut s.o, n * h);
            matmul(&lw.wo, att, n, o, &mut s.mm, threads);
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
                    cfg.activation,
                    xn,
                    n,
                    out,
                    &mut s.gate,
                    &mut s.up,
                    &mut s.mm,
                    threads,
                ),
                Ffn::Moe { router, experts } => {
                    let moe = cfg.moe.expect("MoE weights need a MoE config");
                    let ne = router.rows;
                    let r = grow(&mut s.router, n * ne);
                    matmul(router, xn, n, r, &mut s.mm, threads);
                    s.assign.resize_with(ne, Vec::new);
                    s.assign.iter_mut().for_each(Vec::clear);
                    for i in 0..n {
                        let p = &mut r[i * ne..(i + 1) * ne];
                        softmax(p);
                        let mut picked = [(0usize, 0.0f32); 64];
                        let k = moe.top_k.min(ne).min(64);
                        for slot in 0..k {
                            let mut best = usize::MAX;
                            for (e, &pe) in p.iter().enumerate() {
                                if picked[..slot].iter().any(|&(pe2, _)| pe2 == e) {
                                    continue;
                                }
                                if best == usize::MAX || pe > p[best] {
                                    best = e;
                                }
                            }
                            picked[slot] = (best, p[best]);
                        }
                        let sum: f32 = picked[..k].iter().map(|x| x.1).sum();
                        for &(e, pe) in &picked[..k] {
                            let wgt = if moe.norm_topk_prob { pe / sum } else { pe };
                            s.assign[e].push((i, wgt));
                        }
                    }
                    out.fill(0.0);
                    // Experts see subsets of rows: tile them all (MoE batches are not split).
                    s.mm.gemm_rows = None;
                    for (e, rows) in s.assign.iter().enumerate() {
                        if rows.is_empty() {
                            continue;
                        }
                        let m = rows.len();
                        let inp = grow(&mut s.moe_in, m * h);
                        for (j, &(i, _)) in rows.iter().enumerate() {
                            inp[j * h..(j + 1) * h].copy_from_slice(&xn[i * h..(i + 1) * h]);
                        }
                        let eo = grow(&mut s.moe_out, m * h);
                        gated_ffn(
                            &experts[e],
                            cfg.activation,
                            inp,
                            m,
                            eo,
                            &mut s.gate,
                            &mut s.up,
                            &mut s.mm,
                            threads,
                        );
                        for (j, &(i, wgt)) in rows.iter().enumerate() {
                            out[i * h..(i + 1) * h]
                                .iter_mut()
                                .zip(&eo[j * h..(j + 1) * h])
                                .for_each(|(a, b)| *a += wgt * b);
                        }
                    }
                    s.mm.gemm_rows = Some(gemm.0);
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
        let lg = grow(&mut s.logits, m * vocab);
        s.mm.gemm_rows = Some(gemm.1);
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

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        x.iter_mut().zip(b).for_each(|(a, b)| *a += b);
    }
}

/// `out = down(act(gate(x)) * up(x))` for `n` rows.
#[allow(clippy::too_many_arguments)]
fn gated_ffn(
    f: &GatedFfn,
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
    g.iter_mut()
        .zip(u.iter())
        .for_each(|(a, b)| *a = act.apply(*a) * b);
    matmul(&f.down, g, n, out, mm, threads);
}

/// Causal (optionally sliding-window) GQA attention of every row against its sequence's cache,
/// parallel over (row, head) pairs.
///
/// Each row is computed as if its sequence were alone in the batch: the summation order (and
/// whether ggml's order is followed at all) depends on how many rows *that sequence* has here, not
/// on the batch size, so continuous batching of several sequences gives each one bit for bit the
/// numbers of its single-sequence steps.
#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &DecoderConfig,
    kv: &KvCache,
    layer: usize,
    rows: &[(usize, usize)],
    per_seq: &[usize],
    q: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let (hd, nh) = (cfg.head_dim, cfg.n_heads);
    let work: usize = rows.iter().map(|&(_, p)| p + 1).sum::<usize>() * nh * hd;
    let threads = if work < (1 << 16) { 1 } else { threads };
    // ggml's exact summation order matters for token-for-token parity on short batches (decode
    // steps, short prompts); long prompts take the fast path over the same f16-rounded cache,
    // which halves pp512 time for Gemma 3 270M (llama.cpp's own batched and unbatched
    // evaluations differ in the last bits too).
    let order = |seq: usize| {
        let n = per_seq[seq];
        (cfg.kv_f16 && n <= GGML_ORDER_MAX_ROWS).then(|| F16DotOrder::for_rows(n))
    };
    thread_local! {
        // Per-thread score buffer kept between calls: a warm decode step does not allocate.
        static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
        static F16: std::cell::Cell<F16Scratch> = std::cell::Cell::new(F16Scratch::default());
    }
    par_units(threads, out, hd, |units, dst| {
        let mut scores = SCORES.take();
        let mut f16 = F16.take();
        for (u, o) in units.zip(dst.chunks_exact_mut(hd)) {
            let (row, head) = (u / nh, u % nh);
            let (seq, pos) = rows[row];
            let qh = &q[row * nh * hd + head * hd..row * nh * hd + (head + 1) * hd];
            match order(seq) {
                Some(ord) => head_attention_f16(cfg, kv, layer, seq, pos, head, qh, ord, &mut f16, o),
                None => head_attention(cfg, kv, layer, seq, pos, head, qh, &mut scores, o),
            }
        }
        SCORES.set(scores);
        F16.set(f16);
    });
}

/// One head of one row of [`attention`] in f32 (the fast path).
#[allow(clippy::too_many_arguments)]
fn head_attention(
    cfg: &DecoderConfig,
    kv: &KvCache,
    layer: usize,
    seq: usize,
    pos: usize,
    head: usize,
    qh: &[f32],
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let (hd, kvd) = (cfg.head_dim, cfg.kv_dim());
    let group = cfg.n_heads / cfg.n_kv_heads;
    let window = cfg.sliding_window.get(layer).copied().flatten();
    let start = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let (ks, vs) = kv.layer(seq, layer, pos + 1);
    let kh = head / group;
    scores.clear();
    scores.extend(
        (start..=pos).map(|t| dot_f32(qh, &ks[t * kvd + kh * hd..t * kvd + (kh + 1) * hd]) * cfg.attn_scale),
    );
    if let Some(cap) = cfg.attn_softcap {
        softcap(scores, cap);
    }
    softmax(scores);
    o.fill(0.0);
    for (t, &p) in (start..=pos).zip(scores.iter()) {
        let vr = &vs[t * kvd + kh * hd..t * kvd + (kh + 1) * hd];
        o.iter_mut().zip(vr).for_each(|(a, b)| *a += p * b);
    }
}

/// Largest batch whose attention follows ggml's summation order when `kv_f16` is set.
const GGML_ORDER_MAX_ROWS: usize = 32;

/// Buffers of [`head_attention_f16`], reused across the heads one thread computes.
#[derive(Default)]
struct F16Scratch {
    scores: Vec<f32>,
    q16: Vec<f32>,
    acc: Vec<[f32; 32]>,
    tail: Vec<f64>,
}

/// One head of one row of [`attention`] as llama.cpp computes it over its F16 KV cache without
/// flash attention (see [`crate::ggml`]): the cache holds f16 values (rounded in
/// [`Decoder::decode`]), the query is rounded to f16 (after the scale when `cfg.q_prescale`),
/// scores and the probability-weighted values are f16 dot products summed in ggml's lane order
/// (`order`: whether the sequence has one row in the batch or more), the softmax is ggml's, and
/// the probabilities are rounded to f16.
#[allow(clippy::too_many_arguments)]
fn head_attention_f16(
    cfg: &DecoderConfig,
    kv: &KvCache,
    layer: usize,
    seq: usize,
    pos: usize,
    head: usize,
    qh: &[f32],
    order: F16DotOrder,
    f: &mut F16Scratch,
    o: &mut [f32],
) {
    let (hd, kvd) = (cfg.head_dim, cfg.kv_dim());
    let group = cfg.n_heads / cfg.n_kv_heads;
    let window = cfg.sliding_window.get(layer).copied().flatten();
    let start = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let (ks, vs) = kv.layer(seq, layer, pos + 1);
    let kh = head / group;
    let (pre, post) = if cfg.q_prescale {
        (cfg.attn_scale, 1.0)
    } else {
        (1.0, cfg.attn_scale)
    };
    f.q16.clear();
    f.q16.extend(qh.iter().map(|&b| round_f16(b * pre)));
    let q16 = &f.q16;
    f.scores.clear();
    f.scores.extend((start..=pos).map(|t| {
        let s = dot_f16(order, q16, &ks[t * kvd + kh * hd..t * kvd + (kh + 1) * hd]);
        if post == 1.0 {
            s
        } else {
            s * post
        }
    }));
    if let Some(cap) = cfg.attn_softcap {
        softcap(&mut f.scores, cap);
    }
    softmax_ggml(&mut f.scores, start);
    // The value rows are dotted with the probabilities along the cells (ggml multiplies the
    // transposed V cache by the f16 probabilities).
    f.acc.clear();
    f.acc.resize(hd, [0.0; 32]);
    let n_cells = (pos + 1).next_multiple_of(256);
    let nv = order.vector_len(n_cells);
    f.tail.clear();
    f.tail.resize(if nv <= pos { hd } else { 0 }, 0.0);
    let tail = &mut f.tail;
    for (t, &p) in (start..=pos).zip(&f.scores) {
        let p = round_f16(p);
        if p == 0.0 {
            continue;
        }
        let vr = &vs[t * kvd + kh * hd..t * kvd + (kh + 1) * hd];
        if t < nv {
            let slot = order.slot(t);
            f.acc.iter_mut().zip(vr).for_each(|(a, &v)| a[slot] += p * v);
        } else {
            tail.iter_mut().zip(vr).for_each(|(a, &v)| *a += (p * v) as f64);
        }
    }
    for (i, (oi, a)) in o.iter_mut().zip(&f.acc).enumerate() {
        *oi = order.reduce(a, f.tail.get(i).copied().unwrap_or(0.0));
    }
}
