//! The Gemma 4 text decoder, as transformers defines it: per-layer head sizes and KV-head counts,
//! q/k norms with weights and a weightless v norm, attention scale 1, proportional RoPE on
//! global layers, KV sharing between layers, per-layer embeddings (PLE), a MoE block next to the
//! dense MLP, per-layer output scalars and a final logit soft-cap. All norms are plain `x · w`.
//!
//! Runs multi-sequence batches under the same contract as the common decoder: each row's
//! position must be its sequence's next one; logits only for rows that want them.

use berth_kernels::dot::dot_f32;
use berth_plugin_api::{BatchView, LogitsOut, PluginError};
use berth_plugin_common::kv::KvCache;
use berth_plugin_common::linear::{matmul, par_units, MatmulScratch};
use berth_plugin_common::ops::{gelu_tanh, rms_norm, rms_norm_heads, softcap, softmax, Rope};
use berth_plugin_common::Matrix;

/// Attention shape of one layer.
#[derive(Clone, Debug)]
pub struct AttnShape {
    /// Dimension per head (`global_head_dim` on full layers).
    pub head_dim: usize,
    /// Key/value heads of the cache this layer reads.
    pub n_kv_heads: usize,
    /// Sliding window (`None` = full causal attention).
    pub window: Option<usize>,
    /// The layer whose KV cache this layer attends to (itself unless KV-shared).
    pub kv_source: usize,
    /// RoPE of this layer (default on sliding layers, proportional on full ones).
    pub rope: Rope,
}

/// Key/value projections of a layer that owns its cache.
#[derive(Clone, Debug)]
pub struct KvProj {
    /// Key projection.
    pub wk: Matrix,
    /// Value projection; `None` when values are the raw keys (`attention_k_eq_v`).
    pub wv: Option<Matrix>,
    /// Per-head key norm weight.
    pub k_norm: Vec<f32>,
}

/// The routed-experts block of a MoE layer.
#[derive(Clone, Debug)]
pub struct MoeBlock {
    /// Router projection (`n_experts × hidden`).
    pub router: Matrix,
    /// Router input scale (`hidden`), applied after a weightless RMS norm.
    pub router_scale: Vec<f32>,
    /// Per-expert output scale.
    pub per_expert_scale: Vec<f32>,
    /// Experts used per token.
    pub top_k: usize,
    /// Expert gate projections (`moe_inter × hidden`).
    pub gate: Vec<Matrix>,
    /// Expert up projections (`moe_inter × hidden`).
    pub up: Vec<Matrix>,
    /// Expert down projections (`hidden × moe_inter`).
    pub down: Vec<Matrix>,
    /// Norm of the experts' input (`pre_feedforward_layernorm_2`).
    pub pre_norm_2: Vec<f32>,
    /// Norm of the dense MLP's output (`post_feedforward_layernorm_1`).
    pub post_norm_1: Vec<f32>,
    /// Norm of the experts' output (`post_feedforward_layernorm_2`).
    pub post_norm_2: Vec<f32>,
}

/// Per-layer-embedding weights of one layer.
#[derive(Clone, Debug)]
pub struct PleLayer {
    /// `per_layer_input_gate` (`ple × hidden`).
    pub gate: Matrix,
    /// `per_layer_projection` (`hidden × ple`).
    pub proj: Matrix,
    /// `post_per_layer_input_norm`.
    pub post_norm: Vec<f32>,
}

/// Weights and shape of one layer.
#[derive(Clone, Debug)]
pub struct Layer {
    /// Attention shape.
    pub attn: AttnShape,
    /// `input_layernorm`.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub wq: Matrix,
    /// Per-head query norm weight.
    pub q_norm: Vec<f32>,
    /// Key/value projections; `None` for KV-shared layers.
    pub kv: Option<KvProj>,
    /// Output projection.
    pub wo: Matrix,
    /// `post_attention_layernorm`.
    pub post_attn_norm: Vec<f32>,
    /// `pre_feedforward_layernorm`.
    pub ffn_norm: Vec<f32>,
    /// Dense MLP gate projection.
    pub gate: Matrix,
    /// Dense MLP up projection.
    pub up: Matrix,
    /// Dense MLP down projection.
    pub down: Matrix,
    /// `post_feedforward_layernorm`.
    pub post_ffw_norm: Vec<f32>,
    /// The MoE block, if enabled.
    pub moe: Option<MoeBlock>,
    /// Per-layer-embedding weights, if the model has PLE.
    pub ple: Option<PleLayer>,
    /// Multiplier of the layer's output.
    pub layer_scalar: f32,
}

/// Model-wide per-layer-embedding weights.
#[derive(Clone, Debug)]
pub struct Ple {
    /// Dimension per layer.
    pub dim: usize,
    /// `embed_tokens_per_layer` (`vocab × layers·dim`).
    pub embed: Matrix,
    /// Multiplier of the PLE rows (`sqrt(dim)`, in the weight dtype).
    pub embed_scale: f32,
    /// `per_layer_model_projection` (`layers·dim × hidden`).
    pub projection: Matrix,
    /// `per_layer_projection_norm` (`dim`).
    pub norm: Vec<f32>,
}

/// All weights and switches of a Gemma 4 text model.
#[derive(Clone, Debug)]
pub struct Gemma4Weights {
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Token embeddings.
    pub embed: Matrix,
    /// Multiplier of the embeddings (`sqrt(hidden)`, in the weight dtype).
    pub embed_scale: f32,
    /// Per-layer embeddings, when present.
    pub ple: Option<Ple>,
    /// Layers.
    pub layers: Vec<Layer>,
    /// Final norm.
    pub output_norm: Vec<f32>,
    /// LM head (the embedding when tied).
    pub output: Matrix,
    /// Final logit soft-cap.
    pub final_softcap: Option<f32>,
    /// Attention score soft-cap.
    pub attn_softcap: Option<f32>,
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    tmp: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    mlp: Vec<f32>,
    moe_acc: Vec<f32>,
    moe: MoeScratch,
    pli: Vec<f32>,
    pl_tmp: Vec<f32>,
    ple_g: Vec<f32>,
    head_in: Vec<f32>,
    logits: Vec<f32>,
    cs: Vec<(f32, f32)>,
    mm: MatmulScratch,
    seq_next: Vec<Option<usize>>,
    rows: Vec<(usize, usize)>,
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// A Gemma 4 decoder with its KV cache: the whole per-instance state of a model.
pub struct Gemma4Decoder {
    /// Weights and switches.
    pub w: Gemma4Weights,
    /// KV cache (KV-shared layers hold no rows of their own).
    pub kv: KvCache,
    /// Compute threads.
    pub threads: usize,
    s: Scratch,
}

impl Gemma4Decoder {
    /// A decoder for `max_seqs` sequences of at most `max_len` positions.
    pub fn new(w: Gemma4Weights, max_seqs: usize, max_len: usize, threads: usize) -> Gemma4Decoder {
        let dims = w
            .layers
            .iter()
            .enumerate()
            .map(|(l, layer)| {
                if layer.attn.kv_source == l {
                    layer.attn.n_kv_heads * layer.attn.head_dim
                } else {
                    0
                }
            })
            .collect();
        Gemma4Decoder {
            kv: KvCache::new(dims, max_seqs, max_len),
            w,
            threads: threads.max(1),
            s: Scratch::default(),
        }
    }

    /// Logits per row: the LM head's rows.
    pub fn vocab_size(&self) -> usize {
        self.w.output.rows
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

    /// Runs a batch: each row's position must be its sequence's next one; one logits row is
    /// written per row that wants logits, in batch order.
    pub fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        batch.validate()?;
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
        let embed_rows = self
            .w
            .ple
            .as_ref()
            .map_or(self.w.embed.rows, |p| p.embed.rows.min(self.w.embed.rows));
        let s = &mut self.s;
        s.seq_next.clear();
        s.seq_next.resize(self.kv.max_sequences(), None);
        s.rows.clear();
        for i in 0..batch.len() {
            let seq = self.kv.check_seq(batch.seq_ids[i])?;
            let tok = batch.tokens[i];
            if tok < 0 || tok as usize >= embed_rows {
                return Err(PluginError::invalid_argument(format!(
                    "token {tok} outside the vocabulary (size {embed_rows})"
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
        self.forward(batch.tokens, batch.want_logits, logits);
        for (seq, next) in self.s.seq_next.iter().enumerate() {
            if let Some(len) = *next {
                self.kv.set_len(seq, len);
            }
        }
        Ok(())
    }

    /// The forward pass over validated rows (`self.s.rows` holds each row's sequence and position).
    fn forward(&mut self, tokens: &[i32], want_logits: &[u8], logits: &mut LogitsOut<'_>) {
        let w = &self.w;
        let s = &mut self.s;
        let kv = &mut self.kv;
        let threads = self.threads;
        let n = tokens.len();
        let (h, eps, nh) = (w.hidden, w.eps, w.n_heads);
        let n_layers = w.layers.len();

        let x = grow(&mut s.x, n * h);
        for (i, &t) in tokens.iter().enumerate() {
            let row = &mut x[i * h..(i + 1) * h];
            w.embed.dequantize_row(t as usize, row);
            row.iter_mut().for_each(|v| *v *= w.embed_scale);
        }

        // Per-layer inputs: (norm(projection(x) / sqrt(hidden)) + ple_embed(token)) / sqrt(2).
        if let Some(p) = &w.ple {
            let width = n_layers * p.dim;
            let pli = grow(&mut s.pli, n * width);
            matmul(&p.projection, x, n, pli, &mut s.mm, threads);
            let tmp = grow(&mut s.pl_tmp, width);
            let (proj_scale, mix) = ((h as f32).powf(-0.5), std::f32::consts::FRAC_1_SQRT_2);
            for (i, &t) in tokens.iter().enumerate() {
                let row = &mut pli[i * width..(i + 1) * width];
                row.iter_mut().for_each(|v| *v *= proj_scale);
                rms_norm_heads(row, &p.norm, eps, false);
                p.embed.dequantize_row(t as usize, tmp);
                for (a, b) in row.iter_mut().zip(tmp.iter()) {
                    *a = (*a + b * p.embed_scale) * mix;
                }
            }
        }

        for (l, lw) in w.layers.iter().enumerate() {
            let a = &lw.attn;
            let hd = a.head_dim;
            let qd = nh * hd;
            let kvd = a.n_kv_heads * hd;
            let x = &mut s.x[..n * h];
            let xn = grow(&mut s.xn, n * h);
            for i in 0..n {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    Some(&lw.attn_norm),
                    eps,
                    false,
                    &mut xn[i * h..(i + 1) * h],
                );
            }
            let q = grow(&mut s.q, n * qd);
            matmul(&lw.wq, xn, n, q, &mut s.mm, threads);
            if let Some(p) = &lw.kv {
                let k = grow(&mut s.k, n * kvd);
                let v = grow(&mut s.v, n * kvd);
                matmul(&p.wk, xn, n, k, &mut s.mm, threads);
                match &p.wv {
                    Some(wv) => matmul(wv, xn, n, v, &mut s.mm, threads),
                    None => v.copy_from_slice(k),
                }
            }
            for i in 0..n {
                let (seq, pos) = s.rows[i];
                a.rope.angles(pos, &mut s.cs);
                let qr = &mut q[i * qd..(i + 1) * qd];
                rms_norm_heads(qr, &lw.q_norm, eps, false);
                a.rope.apply(qr, &s.cs);
                if let Some(p) = &lw.kv {
                    let kr = &mut s.k[i * kvd..(i + 1) * kvd];
                    let vr = &mut s.v[i * kvd..(i + 1) * kvd];
                    rms_norm_heads(kr, &p.k_norm, eps, false);
                    a.rope.apply(kr, &s.cs);
                    norm_heads_unweighted(vr, hd, eps);
                    kv.write(seq, l, pos, kr, vr);
                }
            }
            let att = grow(&mut s.att, n * qd);
            let shape = HeadShape {
                n_heads: nh,
                n_kv_heads: a.n_kv_heads,
                head_dim: hd,
                window: a.window,
                softcap: w.attn_softcap,
            };
            attention(&shape, kv, a.kv_source, &s.rows, q, att, threads);
            let o = grow(&mut s.o, n * h);
            matmul(&lw.wo, att, n, o, &mut s.mm, threads);
            let x = &mut s.x[..n * h];
            let tmp = grow(&mut s.tmp, h);
            for i in 0..n {
                rms_norm(&o[i * h..(i + 1) * h], Some(&lw.post_attn_norm), eps, false, tmp);
                x[i * h..(i + 1) * h]
                    .iter_mut()
                    .zip(tmp.iter())
                    .for_each(|(a, b)| *a += b);
            }

            // Dense MLP on pre_feedforward_layernorm(x).
            let xn = &mut s.xn[..n * h];
            for i in 0..n {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    Some(&lw.ffn_norm),
                    eps,
                    false,
                    &mut xn[i * h..(i + 1) * h],
                );
            }
            let m = grow(&mut s.mlp, n * h);
            geglu(
                &lw.gate,
                &lw.up,
                &lw.down,
                xn,
                n,
                m,
                &mut s.gate,
                &mut s.up,
                &mut s.mm,
                threads,
            );

            if let Some(moe) = &lw.moe {
                // m = post_1(mlp) + post_2(experts(pre_2(x))), routed on the residual x.
                for i in 0..n {
                    let row = &mut m[i * h..(i + 1) * h];
                    let tmp = &mut s.tmp[..h];
                    rms_norm(row, Some(&moe.post_norm_1), eps, false, tmp);
                    row.copy_from_slice(tmp);
                }
                let acc = grow(&mut s.moe_acc, n * h);
                moe_forward(moe, h, eps, x, n, acc, &mut s.moe, &mut s.mm, threads);
                for i in 0..n {
                    let tmp = &mut s.tmp[..h];
                    rms_norm(&acc[i * h..(i + 1) * h], Some(&moe.post_norm_2), eps, false, tmp);
                    m[i * h..(i + 1) * h]
                        .iter_mut()
                        .zip(tmp.iter())
                        .for_each(|(a, b)| *a += b);
                }
            }
            for i in 0..n {
                let tmp = &mut s.tmp[..h];
                rms_norm(&m[i * h..(i + 1) * h], Some(&lw.post_ffw_norm), eps, false, tmp);
                x[i * h..(i + 1) * h]
                    .iter_mut()
                    .zip(tmp.iter())
                    .for_each(|(a, b)| *a += b);
            }

            // Per-layer input: x += post_norm(proj(gelu(gate(x)) * pli[l])).
            if let (Some(pl), Some(p)) = (&lw.ple, &w.ple) {
                let width = n_layers * p.dim;
                let g = grow(&mut s.ple_g, n * p.dim);
                matmul(&pl.gate, x, n, g, &mut s.mm, threads);
                for i in 0..n {
                    let src = &s.pli[i * width + l * p.dim..i * width + (l + 1) * p.dim];
                    for (a, b) in g[i * p.dim..(i + 1) * p.dim].iter_mut().zip(src) {
                        *a = gelu_tanh(*a) * b;
                    }
                }
                let o = &mut s.o[..n * h];
                matmul(&pl.proj, g, n, o, &mut s.mm, threads);
                for i in 0..n {
                    let tmp = &mut s.tmp[..h];
                    rms_norm(&o[i * h..(i + 1) * h], Some(&pl.post_norm), eps, false, tmp);
                    x[i * h..(i + 1) * h]
                        .iter_mut()
                        .zip(tmp.iter())
                        .for_each(|(a, b)| *a += b);
                }
            }
            if lw.layer_scalar != 1.0 {
                x.iter_mut().for_each(|v| *v *= lw.layer_scalar);
            }
        }

        // Final norm, LM head and soft-cap for the rows that want logits.
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
                    eps,
                    false,
                    &mut hin[j * h..(j + 1) * h],
                );
                j += 1;
            }
        }
        let vocab = w.output.rows;
        let lg = grow(&mut s.logits, m * vocab);
        matmul(&w.output, hin, m, lg, &mut s.mm, threads);
        for j in 0..m {
            let src = &mut lg[j * vocab..(j + 1) * vocab];
            if let Some(cap) = w.final_softcap {
                softcap(src, cap);
            }
            let dst = logits.row_mut(j);
            dst[..vocab].copy_from_slice(src);
            dst[vocab..].fill(f32::NEG_INFINITY);
        }
    }
}

/// Scratch buffers of the MoE block.
#[derive(Default)]
struct MoeScratch {
    router: Vec<f32>,
    input: Vec<f32>,
    gathered: Vec<f32>,
    out: Vec<f32>,
    assign: Vec<Vec<(usize, f32)>>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

/// The routed experts on residual rows `x` (`n × h`), weighted sum into `acc`.
#[allow(clippy::too_many_arguments)]
fn moe_forward(
    moe: &MoeBlock,
    h: usize,
    eps: f32,
    x: &[f32],
    n: usize,
    acc: &mut [f32],
    s: &mut MoeScratch,
    mm: &mut MatmulScratch,
    threads: usize,
) {
    let ne = moe.router.rows;
    // Router input: rms_norm(x) · scale / sqrt(hidden).
    let rin = grow(&mut s.input, n * h);
    let root = (h as f32).powf(-0.5);
    for i in 0..n {
        let row = &mut rin[i * h..(i + 1) * h];
        rms_norm(&x[i * h..(i + 1) * h], None, eps, false, row);
        row.iter_mut()
            .zip(&moe.router_scale)
            .for_each(|(a, b)| *a *= b * root);
    }
    let r = grow(&mut s.router, n * ne);
    matmul(&moe.router, rin, n, r, mm, threads);
    s.assign.resize_with(ne, Vec::new);
    s.assign.iter_mut().for_each(Vec::clear);
    let k = moe.top_k.min(ne);
    let mut picked: Vec<(usize, f32)> = Vec::with_capacity(k);
    for i in 0..n {
        let p = &mut r[i * ne..(i + 1) * ne];
        softmax(p);
        picked.clear();
        for _ in 0..k {
            let mut best = usize::MAX;
            for (e, &pe) in p.iter().enumerate() {
                if picked.iter().any(|&(pe2, _)| pe2 == e) {
                    continue;
                }
                if best == usize::MAX || pe > p[best] {
                    best = e;
                }
            }
            picked.push((best, p[best]));
        }
        let sum: f32 = picked.iter().map(|x| x.1).sum();
        for &(e, pe) in &picked {
            s.assign[e].push((i, pe / sum * moe.per_expert_scale[e]));
        }
    }
    // Expert input: pre_feedforward_layernorm_2(x).
    let xin = &mut rin[..n * h];
    for i in 0..n {
        rms_norm(
            &x[i * h..(i + 1) * h],
            Some(&moe.pre_norm_2),
            eps,
            false,
            &mut xin[i * h..(i + 1) * h],
        );
    }
    acc.fill(0.0);
    for (e, rows) in s.assign.iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let m = rows.len();
        let inp = grow(&mut s.gathered, m * h);
        for (j, &(i, _)) in rows.iter().enumerate() {
            inp[j * h..(j + 1) * h].copy_from_slice(&xin[i * h..(i + 1) * h]);
        }
        let eo = grow(&mut s.out, m * h);
        geglu(
            &moe.gate[e],
            &moe.up[e],
            &moe.down[e],
            inp,
            m,
            eo,
            &mut s.gate,
            &mut s.up,
            mm,
            threads,
        );
        for (j, &(i, wgt)) in rows.iter().enumerate() {
            acc[i * h..(i + 1) * h]
                .iter_mut()
                .zip(&eo[j * h..(j + 1) * h])
                .for_each(|(a, b)| *a += wgt * b);
        }
    }
}

/// `out = down(gelu_tanh(gate(x)) * up(x))` for `n` rows.
#[allow(clippy::too_many_arguments)]
fn geglu(
    gate_w: &Matrix,
    up_w: &Matrix,
    down_w: &Matrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    gate: &mut Vec<f32>,
    up: &mut Vec<f32>,
    mm: &mut MatmulScratch,
    threads: usize,
) {
    let d = gate_w.rows;
    let g = grow(gate, n * d);
    let u = grow(up, n * d);
    matmul(gate_w, x, n, g, mm, threads);
    matmul(up_w, x, n, u, mm, threads);
    g.iter_mut()
        .zip(u.iter())
        .for_each(|(a, b)| *a = gelu_tanh(*a) * b);
    matmul(down_w, g, n, out, mm, threads);
}

/// RMS norm without a weight, in place, over each `d`-sized head of `x`.
fn norm_heads_unweighted(x: &mut [f32], d: usize, eps: f32) {
    for head in x.chunks_exact_mut(d) {
        let ss: f32 = head.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        head.iter_mut().for_each(|v| *v *= scale);
    }
}

/// Head layout and options of one attention layer.
struct HeadShape {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    softcap: Option<f32>,
}

/// Causal (optionally sliding-window) GQA attention with scale 1 of every row against layer
/// `src`'s cache of its sequence, parallel over (row, head) pairs.
fn attention(
    sh: &HeadShape,
    kv: &KvCache,
    src: usize,
    rows: &[(usize, usize)],
    q: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let (hd, nh) = (sh.head_dim, sh.n_heads);
    let kvd = sh.n_kv_heads * hd;
    let group = nh / sh.n_kv_heads;
    let work: usize = rows.iter().map(|&(_, p)| p + 1).sum::<usize>() * nh * hd;
    let threads = if work < (1 << 16) { 1 } else { threads };
    par_units(threads, out, hd, |units, dst| {
        let mut scores = Vec::new();
        for (u, o) in units.zip(dst.chunks_exact_mut(hd)) {
            let (row, head) = (u / nh, u % nh);
            let (seq, pos) = rows[row];
            let start = sh.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let (ks, vs) = kv.layer(seq, src, pos + 1);
            let kh = head / group;
            let qh = &q[row * nh * hd + head * hd..row * nh * hd + (head + 1) * hd];
            scores.clear();
            scores
                .extend((start..=pos).map(|t| dot_f32(qh, &ks[t * kvd + kh * hd..t * kvd + (kh + 1) * hd])));
            if let Some(cap) = sh.softcap {
                softcap(&mut scores, cap);
            }
            softmax(&mut scores);
            o.fill(0.0);
            for (t, &p) in (start..=pos).zip(&scores) {
                let vr = &vs[t * kvd + kh * hd..t * kvd + (kh + 1) * hd];
                o.iter_mut().zip(vr).for_each(|(a, b)| *a += p * b);
            }
        }
    });
}

/// Proportional RoPE (Gemma 4 global layers): `inv_freq[j] = base^(-2j / head_dim) / factor` for
/// the first `partial · head_dim / 2` pairs, identity (frequency 0) for the rest.
pub fn proportional_rope(base: f32, head_dim: usize, partial: f32, factor: f32) -> Rope {
    let angles = ((partial as f64 * head_dim as f64) / 2.0).floor() as usize;
    let inv_freq = (0..angles.min(head_dim / 2))
        .map(|j| (1.0 / (base as f64).powf(2.0 * j as f64 / head_dim as f64) / factor as f64) as f32)
        .collect();
    Rope {
        inv_freq,
        head_dim,
        neox: true,
        half: head_dim / 2,
        ggml: None,
    }
}
