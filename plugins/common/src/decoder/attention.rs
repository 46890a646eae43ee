//! The attention mixer: q/k/v projections, per-row biases, norms and RoPE, the new keys and
//! values into the sequence's cache, each row attending to its sequence (causal, sliding-window
//! or bidirectional), the optional output gate, the output projection.

use super::forward::{grow, Pass, Scratch};
use super::geometry::AttnGeometry;
use super::{DecoderConfig, DecoderWeights};
use crate::kv::KvCache;
use crate::layers::{KvSource, Mixer};
use crate::linear::{matmul, matmul_shared, par_units};
use crate::ops::{rms_norm_heads, Rope};
use crate::weights::Matrix;
use berth_kernels::attention::{group_attention, group_attention_rows, window_start, HeadOpts, KvRows};
use berth_kernels::layer::{add_bias, mul_sigmoid, norm_heads_unweighted, split_query_gate};
use berth_kernels::ops::round_f16_in_place;
use std::ops::Range;

/// The RoPE of layer `l`: the layer's own shape if it has one, else YaRN, ggml's f32 angles,
/// HF's partial-rotary pairs or the plain table, with the linear scaling divided in.
pub(super) fn layer_rope(cfg: &DecoderConfig, weights: &DecoderWeights, l: usize) -> Rope {
    let b = cfg.rope_base[l];
    let own_shape = (weights.layers.get(l)).and_then(|l| l.mixer.attention()?.shape.as_ref());
    if let Some(shape) = own_shape {
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
        // Config-time: the frequency table of a linearly scaled RoPE.
        r.inv_freq.iter_mut().for_each(|v| *v /= f);
    }
    r
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

impl Pass<'_> {
    /// The attention mixer of layer `l` over the normed rows `s.xn` into `s.o`.
    pub(super) fn attention(&mut self, l: usize, s: &mut Scratch) {
        let (cfg, w) = (self.cfg, self.w);
        let p = AttnProj::of(&w.layers[l].mixer);
        let g = self.geometry[l].expect("attention layers have a geometry");
        let (n, h, qd) = (self.n, cfg.hidden, cfg.n_heads * g.head_dim);
        self.project_qkv(&p, g, s);
        self.position_qkv(l, &p, g, s);
        let att = grow(&mut s.att, n * qd);
        let ends = cfg.bidirectional.then_some(s.seq_next.as_slice());
        let kv = &*self.kv;
        attend(
            cfg,
            kv,
            g,
            p.sinks,
            &s.rows,
            ends,
            &s.q[..n * qd],
            att,
            self.threads,
        );
        if p.gated {
            mul_sigmoid(att, &s.qgate[..n * qd]);
        }
        let o = grow(&mut s.o, n * h);
        matmul(p.wo, att, n, o, &mut s.mm, self.threads);
        add_bias(o, p.bo);
    }

    /// Queries into `s.q` (gated layers: their gates into `s.qgate`), and for a layer with its
    /// own cache keys and values into `s.k` and `s.v` (the keys again without a value projection).
    fn project_qkv(&mut self, p: &AttnProj<'_>, g: AttnGeometry, s: &mut Scratch) {
        let (n, cfg, threads) = (self.n, self.cfg, self.threads);
        let (qd, kvd) = (cfg.n_heads * g.head_dim, g.kv_dim());
        let xn = &s.xn[..n * cfg.hidden];
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
            split_query_gate(q, grow(&mut s.qgate, n * qd), n, cfg.n_heads, g.head_dim);
        }
    }

    /// Each row's query gets its bias, norm and RoPE at the row's position; with its own cache,
    /// its key and value too (bias, norm, RoPE; values normed where asked; rounded to f16 like
    /// llama.cpp's cache), written to the row's sequence's cache.
    fn position_qkv(&mut self, l: usize, p: &AttnProj<'_>, g: AttnGeometry, s: &mut Scratch) {
        let (cfg, rope) = (self.cfg, &self.ropes[l]);
        let (hd, kvd, qd) = (g.head_dim, g.kv_dim(), cfg.n_heads * g.head_dim);
        for i in 0..self.n {
            let qr = &mut s.q[i * qd..(i + 1) * qd];
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
                norm_heads_unweighted(vr, hd, cfg.eps, grow(&mut s.head, hd));
            }
            if cfg.kv_f16 {
                round_f16_in_place(kr);
                round_f16_in_place(vr);
            }
            self.kv.write(seq, l, pos, kr, vr);
        }
    }
}

/// Causal (optionally sliding-window) GQA attention of every row against its sequence's cache,
/// parallel over (row, head) pairs; with `ends` (each sequence's length), bidirectional.
///
/// Each row is computed bit for bit as if it were alone in the batch (the kernels over several rows
/// or heads keep each one's summation order), so continuous batching of several sequences gives
/// each one the numbers of its single-sequence steps.
#[allow(clippy::too_many_arguments)]
fn attend(
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
    let nh = cfg.n_heads;
    let work: usize = rows.iter().map(|&(_, p)| p + 1).sum::<usize>() * nh * g.head_dim;
    let threads = if work < (1 << 16) { 1 } else { threads };
    let group = nh / g.n_kv_heads;
    let (blocks, sub) = plan_units(rows, nh, group, threads);
    let run = AttnRun {
        kv,
        g,
        rows,
        ends,
        sinks,
        opts: HeadOpts {
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap,
            sink: None,
        },
        nh,
        group,
        sub,
    };
    match blocks {
        None => run.rows_alone(q, out, threads),
        Some(blocks) => run.row_blocks(&blocks, q, out, threads),
    }
}

/// Rows of one sequence at consecutive positions run through attention together, this many at
/// most.
const ROW_BLOCK: usize = 8;

/// How attention splits into units of work: consecutive rows of one sequence run together in
/// blocks (each cached key and value read once for the block's rows, where the kernels can), and
/// so do query heads sharing a KV head (`sub` of them), as many of both as still leaves a unit of
/// work per thread. Decode steps (no two rows of a sequence) keep one row per unit (`None`: no
/// blocks) and allocate nothing.
fn plan_units(
    rows: &[(usize, usize)],
    nh: usize,
    group: usize,
    threads: usize,
) -> (Option<Vec<Range<usize>>>, usize) {
    let runs = rows.windows(2).any(|w| w[0].0 == w[1].0 && w[1].1 == w[0].1 + 1);
    let mut block = if runs { ROW_BLOCK } else { 1 };
    loop {
        let blocks = row_blocks(rows, block);
        let n_units = |sub: usize| blocks.len().max(rows.len() * usize::from(block == 1)) * nh / sub;
        let sub = (1..=group)
            .rev()
            .find(|&d| group.is_multiple_of(d) && n_units(d) >= threads)
            .unwrap_or(1);
        if block == 1 {
            return (None, sub);
        }
        if n_units(sub) >= threads {
            return (Some(blocks), sub);
        }
        block /= 2;
    }
}

/// The batch's rows in blocks of at most `max` consecutive rows of one sequence at consecutive
/// positions.
fn row_blocks(rows: &[(usize, usize)], max: usize) -> Vec<Range<usize>> {
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

thread_local! {
    // Per-thread buffers kept between calls: a warm decode step does not allocate.
    static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    static OPTS: std::cell::Cell<Vec<HeadOpts>> = const { std::cell::Cell::new(Vec::new()) };
    static QS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One layer's attention over the batch, in units of `sub` query heads of a row or a block of rows.
struct AttnRun<'a> {
    kv: &'a KvCache,
    g: AttnGeometry,
    rows: &'a [(usize, usize)],
    ends: Option<&'a [Option<usize>]>,
    sinks: Option<&'a [f32]>,
    opts: HeadOpts,
    nh: usize,
    /// Query heads per KV head.
    group: usize,
    /// Query heads per unit.
    sub: usize,
}

impl AttnRun<'_> {
    /// What a row at `pos` of sequence `seq` attends to: causal (up to itself, within the window
    /// behind it) or, given each sequence's end, bidirectional (within the window on both sides).
    fn span(&self, seq: usize, pos: usize) -> (usize, usize) {
        match self.ends {
            None => (window_start(pos, self.g.window), pos + 1),
            Some(ends) => {
                let end = ends[seq].unwrap_or(pos + 1);
                match self.g.window {
                    Some(w) => (pos.saturating_sub(w.saturating_sub(1)), end.min(pos + w)),
                    None => (0, end),
                }
            }
        }
    }

    /// A row's KV range for heads from `head` on.
    fn kv_rows(&self, row: usize, head: usize) -> KvRows<'_> {
        let hd = self.g.head_dim;
        let (seq, pos) = self.rows[row];
        let (start, end) = self.span(seq, pos);
        let (ks, vs) = self.kv.layer(seq, self.g.kv_layer, end);
        let kh = head / self.group;
        KvRows {
            k: &ks[kh * hd..],
            v: &vs[kh * hd..],
            stride: self.g.kv_dim(),
            start,
            end,
        }
    }

    /// The options of heads `head..head + sub` (each its own sink).
    fn head_opts(&self, head_opts: &mut Vec<HeadOpts>, head: usize) {
        head_opts.clear();
        head_opts.extend((head..head + self.sub).map(|h| HeadOpts {
            sink: self.sinks.map(|s| s[h]),
            ..self.opts
        }));
    }

    /// One row per unit (decode steps): each unit writes its heads of `out` in place.
    fn rows_alone(&self, q: &[f32], out: &mut [f32], threads: usize) {
        let (hd, sub, nh) = (self.g.head_dim, self.sub, self.nh);
        let per_row = nh / sub;
        par_units(threads, out, sub * hd, |units, dst| {
            let mut scores = SCORES.take();
            let mut head_opts = OPTS.take();
            for (u, o) in units.zip(dst.chunks_exact_mut(sub * hd)) {
                let (row, head) = (u / per_row, (u % per_row) * sub);
                let base = row * nh * hd + head * hd;
                self.head_opts(&mut head_opts, head);
                let kv = self.kv_rows(row, head);
                group_attention(&q[base..base + sub * hd], &kv, &head_opts, &mut scores, o);
            }
            SCORES.set(scores);
            OPTS.set(head_opts);
        });
    }

    /// Blocks of rows: each unit's rows x heads go to a buffer in unit order, then to `out`.
    fn row_blocks(&self, blocks: &[Range<usize>], q: &[f32], out: &mut [f32], threads: usize) {
        let (hd, sub, nh) = (self.g.head_dim, self.sub, self.nh);
        let per_row = nh / sub;
        let block = blocks.iter().map(|b| b.len()).max().unwrap_or(1);
        let unit = block * sub * hd;
        let mut staged = vec![0.0f32; blocks.len() * per_row * unit];
        par_units(threads, &mut staged, unit, |units, dst| {
            let mut scores = SCORES.take();
            let mut head_opts = OPTS.take();
            let mut qs = QS.take();
            for (u, o) in units.zip(dst.chunks_exact_mut(unit)) {
                let (b, head) = (u / per_row, (u % per_row) * sub);
                let span = blocks[b].clone();
                self.head_opts(&mut head_opts, head);
                qs.clear();
                for row in span.clone() {
                    let base = row * nh * hd + head * hd;
                    qs.extend_from_slice(&q[base..base + sub * hd]);
                }
                let o = &mut o[..span.len() * sub * hd];
                let kvs: Vec<KvRows> = span.map(|row| self.kv_rows(row, head)).collect();
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
}
