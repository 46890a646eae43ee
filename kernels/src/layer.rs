//! The arithmetic of a decoder layer's blocks around the matrix products: row-wise RMS norms and
//! residual adds, the gated feed-forward activations, mixture-of-experts routing, the pieces of
//! attention around the attention kernel (biases, per-head norms, query gates), and the gates,
//! activations and gated norm around the recurrent mixers' kernels ([`crate::recurrent`]).
//!
//! Plain scalar Rust built on [`crate::ops`]: each function does the same IEEE operations in the
//! same order as the loops it replaced in the decoder, so the decoder's outputs are unchanged bit
//! for bit.

use crate::ops::{
    add_in_place, axpy, geglu_tanh_f16, gelu_tanh, gelu_tanh_f16, rms_norm, sigmoid, silu, softmax,
    swiglu_fast,
};

/// An RMS norm with its weight: `x / sqrt(mean(x²) + eps) · w` (or `· (1 + w)` when `add_one`),
/// applied to rows of `weight.len()` floats.
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm<'a> {
    /// The weight, one per column.
    pub weight: &'a [f32],
    /// Added to the mean of squares.
    pub eps: f32,
    /// The weight is applied as `1 + w` (Gemma safetensors).
    pub add_one: bool,
}

impl RmsNorm<'_> {
    /// Normalises each row of `x` into the same row of `out`.
    pub fn rows(&self, x: &[f32], out: &mut [f32]) {
        let h = self.weight.len();
        for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
            rms_norm(xr, Some(self.weight), self.eps, self.add_one, or);
        }
    }

    /// Normalises each row of `x` in place (`tmp`: at least one row of scratch).
    pub fn rows_in_place(&self, x: &mut [f32], tmp: &mut [f32]) {
        let h = self.weight.len();
        let tmp = &mut tmp[..h];
        for row in x.chunks_exact_mut(h) {
            rms_norm(row, Some(self.weight), self.eps, self.add_one, tmp);
            row.copy_from_slice(tmp);
        }
    }

    /// `x += norm(y)` row by row (`tmp`: at least one row of scratch).
    pub fn add_rows(&self, x: &mut [f32], y: &[f32], tmp: &mut [f32]) {
        let h = self.weight.len();
        let tmp = &mut tmp[..h];
        for (xr, yr) in x.chunks_exact_mut(h).zip(y.chunks_exact(h)) {
            rms_norm(yr, Some(self.weight), self.eps, self.add_one, tmp);
            add_in_place(xr, tmp);
        }
    }
}

/// The residual add of a block's output `y` to the stream `x`: `x += norm(y)` with the block's
/// post-norm, `x += y` without one (`tmp`: at least one row of scratch).
pub fn add_residual(x: &mut [f32], y: &[f32], post_norm: Option<RmsNorm<'_>>, tmp: &mut [f32]) {
    match post_norm {
        Some(norm) => norm.add_rows(x, y, tmp),
        None => add_in_place(x, y),
    }
}

/// Unweighted RMS norm of each row of `x` (rows of `scale.len()`), times `scale · factor`:
/// Gemma 4's router input `rms(x) · router_scale / sqrt(hidden)`.
pub fn rms_norm_scaled_rows(x: &[f32], scale: &[f32], factor: f32, eps: f32, out: &mut [f32]) {
    let h = scale.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        rms_norm(xr, None, eps, false, or);
        or.iter_mut().zip(scale).for_each(|(a, b)| *a *= b * factor);
    }
}

/// Unweighted RMS norm over each `d`-sized head of `x`, in place (`tmp`: at least `d` floats).
pub fn norm_heads_unweighted(x: &mut [f32], d: usize, eps: f32, tmp: &mut [f32]) {
    let t = &mut tmp[..d];
    for head in x.chunks_exact_mut(d) {
        t.copy_from_slice(head);
        rms_norm(t, None, eps, false, head);
    }
}

/// Adds `b` to each `b.len()`-sized row of `x`; nothing without a bias.
pub fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        x.chunks_exact_mut(b.len()).for_each(|row| add_in_place(row, b));
    }
}

/// Splits a gated query projection (`[row][head][query | gate]`, `n` rows) into the queries,
/// compacted in place to `[row][head][query]`, and the gates.
pub fn split_query_gate(q: &mut [f32], gate: &mut [f32], n: usize, heads: usize, hd: usize) {
    for i in 0..n {
        for hh in 0..heads {
            let src = (i * heads + hh) * 2 * hd;
            let dst = (i * heads + hh) * hd;
            gate[dst..dst + hd].copy_from_slice(&q[src + hd..src + 2 * hd]);
            q.copy_within(src..src + hd, dst);
        }
    }
}

/// `x *= sigmoid(g)` element-wise (an output gate).
pub fn mul_sigmoid(x: &mut [f32], g: &[f32]) {
    x.iter_mut().zip(g).for_each(|(a, &g)| *a *= sigmoid(g));
}

/// `x = sigmoid(x)` element-wise.
pub fn sigmoid_in_place(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = sigmoid(*v));
}

/// torch's softplus (beta 1, threshold 20): `ln(1 + e^x)`, `x` itself above 20.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `out = a · b` element-wise (a gate applied to a signal).
pub fn mul_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.iter_mut()
        .zip(a.iter().zip(b))
        .for_each(|(d, (a, b))| *d = a * b);
}

/// `x = silu(x)` element-wise, with libm's `exp` (the exact scalar [`silu`]).
pub fn silu_in_place(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

/// Gated RMS norm of each `w.len()`-sized head of `x` in place: `w · rmsnorm(x) · silu(z)`
/// (Qwen3.5's delta-net output; `tmp`: at least one head of scratch).
pub fn gated_rms_norm_heads(x: &mut [f32], z: &[f32], w: &[f32], eps: f32, tmp: &mut [f32]) {
    let d = w.len();
    let normed = &mut tmp[..d];
    for (xh, zh) in x.chunks_exact_mut(d).zip(z.chunks_exact(d)) {
        rms_norm(xh, Some(w), eps, false, normed);
        xh.iter_mut()
            .zip(normed.iter().zip(zh))
            .for_each(|(o, (nv, zv))| *o = nv * silu(*zv));
    }
}

/// Gemma 4's per-layer input of one row: `(x + embedding · scale) / sqrt(2)`, in place.
pub fn mix_per_layer_input(x: &mut [f32], embedding: &[f32], scale: f32) {
    for (a, b) in x.iter_mut().zip(embedding) {
        *a = (*a + b * scale) * std::f32::consts::FRAC_1_SQRT_2;
    }
}

/// The gated activation of the FFN: `down(act(gate(x)) * up(x))` ([`Activation::glu`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// SiLU (SwiGLU): Llama, Qwen.
    Silu,
    /// GELU with the tanh approximation (GeGLU): Gemma.
    GeluTanh,
    /// GELU with the tanh approximation through ggml-cpu's f16 table ([`gelu_tanh_f16`]).
    GeluTanhF16,
    /// gpt-oss's clamped SwiGLU: with `g = min(gate, limit)` and `u = clamp(up, ±limit)`,
    /// `g · sigmoid(alpha · g) · (u + 1)`.
    ClampedSwiglu {
        /// Slope inside the sigmoid (`swiglu_alpha`).
        alpha: f32,
        /// Upper clamp of the gate, and clamp of the up projection both ways (`swiglu_limit`).
        limit: f32,
    },
}

impl Activation {
    /// Applies the activation to a gate value (the clamped SwiGLU: its gate half).
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => silu(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::GeluTanhF16 => gelu_tanh_f16(x),
            Activation::ClampedSwiglu { alpha, limit } => {
                let g = x.min(limit);
                g * sigmoid(g * alpha)
            }
        }
    }

    /// The gated unit: `act(gate) · up`, or for the clamped SwiGLU `act(gate) · (clamp(up) + 1)`.
    #[inline]
    pub fn glu(self, gate: f32, up: f32) -> f32 {
        match self {
            Activation::ClampedSwiglu { limit, .. } => (up.clamp(-limit, limit) + 1.0) * self.apply(gate),
            _ => self.apply(gate) * up,
        }
    }

    /// [`Activation::glu`] of one row in place (`gate = glu(gate, up)`), vectorised where the
    /// kernels have the activation: SiLU through [`swiglu_fast`] (a polynomial `exp`, as ggml's
    /// SIMD SiLU), ggml's f16 GELU table exactly. An element's result depends only on its
    /// column, never on the rows around it.
    pub fn glu_row(self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "glu: gate and up differ in length");
        match self {
            Activation::Silu => swiglu_fast(gate, up),
            Activation::GeluTanhF16 => geglu_tanh_f16(gate, up),
            _ => gate.iter_mut().zip(up).for_each(|(a, &b)| *a = self.glu(*a, b)),
        }
    }

    /// `x = act(x) · by` element-wise (the activation alone, no clamp of `by`: Gemma 4's
    /// per-layer input gate).
    pub fn apply_times(self, x: &mut [f32], by: &[f32]) {
        x.iter_mut().zip(by).for_each(|(a, &b)| *a = self.apply(*a) * b);
    }
}

/// How a MoE router turns its logits into expert weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterScoring {
    /// Softmax over all experts (Qwen3-MoE, Qwen3.5-MoE).
    #[default]
    Softmax,
    /// An independent sigmoid per expert (LFM2-MoE).
    Sigmoid,
    /// The raw logits pick the top k; the weights are a softmax over the k picked logits
    /// (gpt-oss).
    TopKSoftmax,
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
    /// Router scores: softmax or sigmoid.
    pub scoring: RouterScoring,
    /// Multiplier of the selected experts' weights (`routed_scaling_factor`, default 1).
    pub routed_scale: f32,
    /// Added to the weight sum before renormalising (LFM2-MoE: 1e-6; 0 elsewhere).
    pub norm_eps: f32,
}

impl MoeConfig {
    /// Softmax top-k routing (Qwen3-MoE style).
    pub fn softmax(n_experts: usize, top_k: usize, norm_topk_prob: bool) -> MoeConfig {
        MoeConfig {
            n_experts,
            top_k,
            norm_topk_prob,
            scoring: RouterScoring::Softmax,
            routed_scale: 1.0,
            norm_eps: 0.0,
        }
    }
}

/// Most experts a row is routed to.
pub const MAX_TOP_K: usize = 64;

/// Turns each row's router logits (`r`, `rows × ne`) into scores in place, picks the top-k
/// experts (by score plus `selection_bias`) and fills `assign[e]` with `(row, weight)`: the score,
/// renormalised over the picked ones if asked, times the routed scale and `expert_scale[e]`.
pub fn route(
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
            RouterScoring::Sigmoid => sigmoid_in_place(p),
            RouterScoring::TopKSoftmax => {}
        }
        let mut picked = [(0usize, 0.0f32); MAX_TOP_K];
        let k = moe.top_k.min(ne).min(MAX_TOP_K);
        pick_top_k(p, selection_bias, &mut picked[..k]);
        if moe.scoring == RouterScoring::TopKSoftmax {
            let mut w = [0.0f32; MAX_TOP_K];
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

/// Fills `picked` with the best `picked.len()` experts of one row, best first, as
/// `(expert, score)`: ranked by score plus `selection_bias`, the first of equal ones winning.
fn pick_top_k(p: &[f32], selection_bias: Option<&[f32]>, picked: &mut [(usize, f32)]) {
    let score = |e: usize| p[e] + selection_bias.map_or(0.0, |b| b[e]);
    for slot in 0..picked.len() {
        let mut best = usize::MAX;
        for e in 0..p.len() {
            if picked[..slot].iter().any(|&(taken, _)| taken == e) {
                continue;
            }
            if best == usize::MAX || score(e) > score(best) {
                best = e;
            }
        }
        picked[slot] = (best, p[best]);
    }
}

/// `out[row] += weight · y[j]` for each `(row, weight)` of `rows` (its `j`-th entry), rows of
/// `h`: an expert's outputs added into the rows routed to it.
pub fn scatter_weighted(out: &mut [f32], y: &[f32], rows: &[(usize, f32)], h: usize) {
    for (j, &(i, wgt)) in rows.iter().enumerate() {
        axpy(&mut out[i * h..(i + 1) * h], wgt, &y[j * h..(j + 1) * h]);
    }
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
    fn sigmoid_routing_selects_by_biased_score_and_renormalises() {
        let moe = MoeConfig {
            scoring: RouterScoring::Sigmoid,
            norm_eps: 0.0,
            ..MoeConfig::softmax(3, 2, true)
        };
        // Scores sigmoid(0) = 0.5 for all; the bias makes experts 2 and 0 win.
        let mut r = [0.0, 0.0, 0.0];
        let mut assign = Vec::new();
        route(
            &moe,
            &mut r,
            3,
            Some(&[0.1, 0.0, 0.2]),
            Some(&[1.0, 1.0, 2.0]),
            &mut assign,
        );
        assert_eq!(assign[0], vec![(0, 0.5)]);
        assert!(assign[1].is_empty());
        assert_eq!(assign[2], vec![(0, 1.0)]);
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

    #[test]
    fn residual_adds_the_normed_output_row_by_row() {
        let w = [1.0, 2.0];
        let norm = RmsNorm {
            weight: &w,
            eps: 0.0,
            add_one: false,
        };
        let mut x = [1.0, 1.0, 0.0, 0.0];
        let y = [3.0, 4.0, 0.0, 2.0];
        let mut tmp = [0.0; 2];
        add_residual(&mut x, &y, Some(norm), &mut tmp);
        // Row 0: rms(3, 4) = sqrt(12.5); row 1: rms(0, 2) = sqrt(2).
        let r0 = 1.0 / 12.5f32.sqrt();
        let r1 = 1.0 / 2.0f32.sqrt();
        assert_eq!(x, [1.0 + 3.0 * r0, 1.0 + 8.0 * r0, 0.0, 4.0 * r1]);
        let mut plain = [1.0, 1.0];
        add_residual(&mut plain, &[2.0, 3.0], None, &mut tmp);
        assert_eq!(plain, [3.0, 4.0]);
        let mut z = y;
        norm.rows_in_place(&mut z, &mut tmp);
        let mut out = [0.0; 4];
        norm.rows(&y, &mut out);
        assert_eq!(z, out);
    }

    #[test]
    fn query_gate_split_compacts_queries_and_collects_gates() {
        // Two rows, two heads of 2: [q q g g] per head.
        let mut q: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let mut gate = vec![0.0; 8];
        split_query_gate(&mut q, &mut gate, 2, 2, 2);
        assert_eq!(&q[..8], &[0.0, 1.0, 4.0, 5.0, 8.0, 9.0, 12.0, 13.0]);
        assert_eq!(gate, [2.0, 3.0, 6.0, 7.0, 10.0, 11.0, 14.0, 15.0]);
    }

    #[test]
    fn small_functions_match_their_definitions() {
        assert_eq!(softplus(30.0), 30.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        let mut x = [2.0, 4.0];
        mul_sigmoid(&mut x, &[0.0, 0.0]);
        assert_eq!(x, [1.0, 2.0]);
        let mut rows = [1.0, 2.0, 3.0, 4.0];
        add_bias(&mut rows, Some(&[10.0, 20.0]));
        assert_eq!(rows, [11.0, 22.0, 13.0, 24.0]);
        let mut out = [0.0; 4];
        scatter_weighted(&mut out, &[1.0, 2.0], &[(1, 0.5)], 2);
        assert_eq!(out, [0.0, 0.0, 0.5, 1.0]);
        let mut heads = [3.0, 4.0, 0.0, 2.0];
        norm_heads_unweighted(&mut heads, 2, 0.0, &mut [0.0; 2]);
        assert!((heads[1] - 4.0 / 12.5f32.sqrt()).abs() < 1e-6);
        let mut prod = [0.0; 2];
        mul_into(&mut prod, &[2.0, 3.0], &[4.0, 5.0]);
        assert_eq!(prod, [8.0, 15.0]);
        let mut s = [0.0, 1.0];
        silu_in_place(&mut s);
        assert_eq!(s, [0.0, silu(1.0)]);
        let mut g = [3.0, 4.0];
        gated_rms_norm_heads(&mut g, &[0.0, 1.0], &[1.0, 1.0], 0.0, &mut [0.0; 2]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 4.0 / 12.5f32.sqrt() * silu(1.0)).abs() < 1e-6);
        let mut p = [0.0, 1.0];
        mix_per_layer_input(&mut p, &[2.0, 2.0], 0.5);
        assert_eq!(
            p,
            [
                std::f32::consts::FRAC_1_SQRT_2,
                2.0 * std::f32::consts::FRAC_1_SQRT_2
            ]
        );
    }
}
