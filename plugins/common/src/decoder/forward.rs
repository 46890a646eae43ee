//! The forward pass as its blocks: embed, then per layer the mixer and the feed-forward each
//! added to the residual stream, Gemma 4's per-layer inputs and layer scalars; then the head
//! ([`super::head`]). The mixers are in [`super::attention`] and [`crate::recurrent`], the
//! feed-forwards in [`super::ffn`]; the arithmetic is in [`berth_kernels::layer`].

use super::geometry::AttnGeometry;
use super::{Decoder, DecoderConfig, DecoderWeights};
use crate::kv::KvCache;
use crate::layers::Mixer;
use crate::linear::{matmul, MatmulScratch};
use crate::ops::{rms_norm_heads, Rope};
use crate::recurrent::{gated_delta_net, short_conv, RecurrentScratch, SeqGroups};
use crate::state::SeqStates;
use berth_kernels::layer::{add_residual, mix_per_layer_input};
use berth_kernels::ops::scale_in_place;
use berth_plugin_api::LogitsOut;

/// Reusable buffers for a forward pass (a warm decode step allocates nothing).
#[derive(Default)]
pub(super) struct Scratch {
    /// The residual stream, `n × hidden`.
    pub x: Vec<f32>,
    /// A block's normed input, `n × hidden`.
    pub xn: Vec<f32>,
    /// One row of scratch (`hidden`).
    pub row: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    /// The mixer's output, `n × hidden`.
    pub o: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// The feed-forward's output, `n × hidden`.
    pub ffn_out: Vec<f32>,
    pub router: Vec<f32>,
    pub moe_in: Vec<f32>,
    pub moe_out: Vec<f32>,
    /// Rows routed to each expert, with their weights.
    pub assign: Vec<Vec<(usize, f32)>>,
    pub head_in: Vec<f32>,
    pub logits: Vec<f32>,
    /// RoPE angles of one position.
    pub cs: Vec<(f32, f32)>,
    pub qgate: Vec<f32>,
    pub head: Vec<f32>,
    pub moe_x: Vec<f32>,
    pub moe_acc: Vec<f32>,
    /// Gemma 4's per-layer inputs, `n × (layers · dim)`.
    pub pli: Vec<f32>,
    pub ple_row: Vec<f32>,
    pub ple_gate: Vec<f32>,
    pub groups: SeqGroups,
    pub rec: RecurrentScratch,
    pub mm: MatmulScratch,
    /// Each sequence's length after the batch (`None`: not in it).
    pub seq_next: Vec<Option<usize>>,
    /// Each row's sequence and position.
    pub rows: Vec<(usize, usize)>,
}

/// The first `n` floats of `v`, grown (with zeros) to hold them.
pub(super) fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// One forward pass over `n` validated rows: what of the decoder its blocks read and write.
pub(super) struct Pass<'a> {
    pub cfg: &'a DecoderConfig,
    pub w: &'a DecoderWeights,
    pub ropes: &'a [Rope],
    pub geometry: &'a [Option<AttnGeometry>],
    pub kv: &'a mut KvCache,
    pub states: &'a mut SeqStates,
    pub threads: usize,
    /// Rows in the batch.
    pub n: usize,
}

impl Decoder {
    /// The forward pass over validated rows (`self.s.rows` holds each row's sequence and
    /// position). `embeds`: rows whose input is given rather than their token's; the rows that
    /// want logits get them in `logits` in row order; `hidden` receives every row's final-normed
    /// state.
    pub(super) fn forward(
        &mut self,
        tokens: &[i32],
        embeds: &[(usize, &[f32])],
        want_logits: &[u8],
        logits: &mut LogitsOut<'_>,
        hidden: Option<&mut Vec<f32>>,
    ) {
        let s = &mut self.s;
        let mut pass = Pass {
            cfg: &self.cfg,
            w: &self.weights,
            ropes: &self.ropes,
            geometry: &self.geometry,
            kv: &mut self.kv,
            states: &mut self.states,
            threads: self.threads,
            n: tokens.len(),
        };
        s.mm.tiled = false;
        pass.embed(tokens, embeds, s);
        pass.per_layer_inputs(tokens, s);
        for l in 0..pass.w.layers.len() {
            pass.layer(l, s);
        }
        if let Some(out) = hidden {
            pass.final_states(out, s);
        }
        pass.head(want_logits, logits, s);
    }
}

impl Pass<'_> {
    /// `x` = each row's token embedding (times the embedding scale), or the embedding given for
    /// the row (image features).
    fn embed(&self, tokens: &[i32], embeds: &[(usize, &[f32])], s: &mut Scratch) {
        let h = self.cfg.hidden;
        let x = grow(&mut s.x, self.n * h);
        for (row, &t) in x.chunks_exact_mut(h).zip(tokens) {
            self.w.embed.dequantize_row(t as usize, row);
            if let Some(scale) = self.cfg.embed_scale {
                scale_in_place(row, scale);
            }
        }
        for &(i, e) in embeds {
            x[i * h..(i + 1) * h].copy_from_slice(e);
        }
    }

    /// Gemma 4's per-layer inputs of every row, all layers at once:
    /// `(norm(projection(x) / sqrt(hidden)) + embed(token) · scale) / sqrt(2)`.
    fn per_layer_inputs(&mut self, tokens: &[i32], s: &mut Scratch) {
        let Some(p) = &self.w.ple else {
            return;
        };
        let (n, h, cfg) = (self.n, self.cfg.hidden, self.cfg);
        let width = self.w.layers.len() * p.dim;
        let pli = grow(&mut s.pli, n * width);
        matmul(&p.projection, &s.x[..n * h], n, pli, &mut s.mm, self.threads);
        let token_row = grow(&mut s.ple_row, width);
        let root = (h as f32).powf(-0.5);
        for (row, &t) in pli.chunks_exact_mut(width).zip(tokens) {
            scale_in_place(row, root);
            rms_norm_heads(row, &p.norm, cfg.eps, cfg.norm_add_one);
            p.embed.dequantize_row(t as usize, token_row);
            mix_per_layer_input(row, token_row, p.embed_scale);
        }
    }

    /// Layer `l`: `x += post_norm(mixer(norm(x)))`, `x += post_norm(ffn(norm(x)))` (a post-norm
    /// where the model has one), then Gemma 4's per-layer input and layer scalar.
    fn layer(&mut self, l: usize, s: &mut Scratch) {
        let (cfg, w) = (self.cfg, self.w);
        let lw = &w.layers[l];
        let (nh, h) = (self.n * cfg.hidden, cfg.hidden);
        cfg.norm(&lw.attn_norm).rows(&s.x[..nh], grow(&mut s.xn, nh));
        self.mixer(l, s);
        let post_attn = lw.post_attn_norm.as_deref().map(|w| cfg.norm(w));
        add_residual(&mut s.x[..nh], &s.o[..nh], post_attn, grow(&mut s.row, h));

        cfg.norm(&lw.ffn_norm).rows(&s.x[..nh], &mut s.xn[..nh]);
        self.feed_forward(l, s);
        let post_ffw = lw.post_ffw_norm.as_deref().map(|w| cfg.norm(w));
        add_residual(&mut s.x[..nh], &s.ffn_out[..nh], post_ffw, &mut s.row);

        self.per_layer_input(l, s);
        if let Some(scale) = self.w.layer_scalars.as_ref().map(|v| v[l]).filter(|&v| v != 1.0) {
            scale_in_place(&mut s.x[..nh], scale);
        }
    }

    /// The token mixer of layer `l` over the normed rows `s.xn` into `s.o`.
    fn mixer(&mut self, l: usize, s: &mut Scratch) {
        let (n, nh, w) = (self.n, self.n * self.cfg.hidden, self.w);
        match &w.layers[l].mixer {
            Mixer::Attention(_) => self.attention(l, s),
            Mixer::ShortConv(c) => short_conv(
                c,
                l,
                &s.xn[..nh],
                n,
                &s.groups,
                self.states,
                grow(&mut s.o, nh),
                &mut s.rec,
                &mut s.mm,
                self.threads,
            ),
            Mixer::GatedDeltaNet(d) => gated_delta_net(
                d,
                l,
                self.cfg.eps,
                &s.xn[..nh],
                n,
                &s.groups,
                self.states,
                grow(&mut s.o, nh),
                &mut s.rec,
                &mut s.mm,
                self.threads,
            ),
        }
    }

    /// Gemma 4's per-layer input of layer `l`: `x += post_norm(proj(act(gate(x)) · input_l))`.
    fn per_layer_input(&mut self, l: usize, s: &mut Scratch) {
        let Some(p) = &self.w.ple else {
            return;
        };
        let (cfg, n, h) = (self.cfg, self.n, self.cfg.hidden);
        let (pl, d) = (&p.layers[l], p.dim);
        let width = self.w.layers.len() * d;
        let g = grow(&mut s.ple_gate, n * d);
        matmul(&pl.gate, &s.x[..n * h], n, g, &mut s.mm, self.threads);
        for (i, gate) in g.chunks_exact_mut(d).enumerate() {
            let input = &s.pli[i * width + l * d..i * width + (l + 1) * d];
            cfg.activation.apply_times(gate, input);
        }
        let o = grow(&mut s.o, n * h);
        matmul(&pl.proj, g, n, o, &mut s.mm, self.threads);
        cfg.norm(&pl.post_norm)
            .add_rows(&mut s.x[..n * h], o, grow(&mut s.row, h));
    }
}
