//! The feed-forward blocks: a dense gated FFN, a routed mixture of experts (with Qwen3.5's
//! shared expert), and Gemma 4's dense + routed block.

use super::forward::{grow, Pass, Scratch};
use crate::layers::{Activation, DenseMoe, Ffn, FfnBias, GatedFfn, MoeConfig, SharedExpert};
use crate::linear::{matmul, matmul_shared, par_units, MatmulScratch};
use berth_kernels::layer::{add_bias, rms_norm_scaled_rows, route, scatter_weighted, sigmoid_in_place};
use berth_kernels::ops::axpy;

impl Pass<'_> {
    /// The feed-forward block of layer `l` over the normed rows `s.xn` into `s.ffn_out`.
    pub(super) fn feed_forward(&mut self, l: usize, s: &mut Scratch) {
        let (w, nh) = (self.w, self.n * self.cfg.hidden);
        grow(&mut s.ffn_out, nh);
        match &w.layers[l].ffn {
            Ffn::Dense(f) => {
                let out = &mut s.ffn_out[..nh];
                let act = self.cfg.activation;
                let xn = &s.xn[..nh];
                gated_ffn(
                    f,
                    None,
                    act,
                    xn,
                    self.n,
                    out,
                    &mut s.gate,
                    &mut s.up,
                    &mut s.mm,
                    self.threads,
                );
            }
            moe @ Ffn::Moe { .. } => self.moe(moe, s),
            Ffn::DenseMoe(m) => self.dense_moe(m, s),
        }
    }

    /// The routing settings of a MoE layer.
    fn moe_config(&self) -> MoeConfig {
        self.cfg.moe.expect("MoE weights need a MoE config")
    }

    /// Routed experts: each row's router logits (plus biases) pick its top-k experts, each expert
    /// runs over the rows routed to it, and their weighted outputs add up; then the shared
    /// expert, if any.
    fn moe(&mut self, ffn: &Ffn, s: &mut Scratch) {
        let Ffn::Moe {
            router,
            experts,
            selection_bias,
            shared,
            biases,
        } = ffn
        else {
            unreachable!("not a MoE feed-forward")
        };
        let (n, h, threads) = (self.n, self.cfg.hidden, self.threads);
        let xn = &s.xn[..n * h];
        let ne = router.rows;
        let r = grow(&mut s.router, n * ne);
        matmul(router, xn, n, r, &mut s.mm, threads);
        add_bias(r, biases.as_ref().map(|b| b.router.as_slice()));
        route(
            &self.moe_config(),
            r,
            ne,
            selection_bias.as_deref(),
            None,
            &mut s.assign,
        );
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
        let out = &mut s.ffn_out[..n * h];
        let act = self.cfg.activation;
        run_experts(experts, biases, act, xn, h, &s.assign, out, ex, threads);
        if let Some(se) = shared {
            self.shared_expert(se, s);
        }
        s.mm.tiled = false;
    }

    /// Qwen3.5's shared expert: `out += sigmoid(gate · x) · ffn(x)` (no gate: a weight of 1).
    fn shared_expert(&mut self, se: &SharedExpert, s: &mut Scratch) {
        let (n, h, threads) = (self.n, self.cfg.hidden, self.threads);
        let xn = &s.xn[..n * h];
        let so = grow(&mut s.moe_out, n * h);
        let act = self.cfg.activation;
        gated_ffn(
            &se.ffn,
            None,
            act,
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
                sigmoid_in_place(sg);
            }
            None => sg.fill(1.0),
        }
        let out = &mut s.ffn_out[..n * h];
        for ((o, y), &weight) in out.chunks_exact_mut(h).zip(so.chunks_exact(h)).zip(sg.iter()) {
            axpy(o, weight, y);
        }
    }

    /// Gemma 4's dense + routed block: `post_dense(dense(xn)) + post_experts(experts(pre(x)))`,
    /// routed by `rms(x) · router_scale / sqrt(hidden)`, both read from the residual stream `x`.
    fn dense_moe(&mut self, m: &DenseMoe, s: &mut Scratch) {
        let (cfg, n, h, threads) = (self.cfg, self.n, self.cfg.hidden, self.threads);
        let out = &mut s.ffn_out[..n * h];
        let act = cfg.activation;
        gated_ffn(
            &m.dense,
            None,
            act,
            &s.xn[..n * h],
            n,
            out,
            &mut s.gate,
            &mut s.up,
            &mut s.mm,
            threads,
        );
        let x = &s.x[..n * h];
        let xin = grow(&mut s.moe_x, n * h);
        rms_norm_scaled_rows(x, &m.router_scale, (h as f32).powf(-0.5), cfg.eps, xin);
        let ne = m.router.rows;
        let r = grow(&mut s.router, n * ne);
        matmul(&m.router, xin, n, r, &mut s.mm, threads);
        route(
            &self.moe_config(),
            r,
            ne,
            None,
            Some(&m.expert_scale),
            &mut s.assign,
        );
        cfg.norm(&m.pre_experts_norm).rows(x, xin);
        let acc = grow(&mut s.moe_acc, n * h);
        s.mm.tiled = true;
        let ex = ExpertScratch {
            input: &mut s.moe_in,
            output: &mut s.moe_out,
            gate: &mut s.gate,
            up: &mut s.up,
            mm: &mut s.mm,
        };
        run_experts(&m.experts, None, act, xin, h, &s.assign, acc, ex, threads);
        s.mm.tiled = false;
        let tmp = grow(&mut s.row, h);
        cfg.norm(&m.post_dense_norm).rows_in_place(out, tmp);
        cfg.norm(&m.post_experts_norm).add_rows(out, acc, tmp);
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
    add_bias(g, bias.map(|b| b.gate.as_slice()));
    add_bias(u, bias.map(|b| b.up.as_slice()));
    let u: &[f32] = u;
    par_units(if n * d < 1 << 14 { 1 } else { threads }, g, d, |rows, gs| {
        for (i, row) in rows.zip(gs.chunks_exact_mut(d)) {
            act.glu_row(row, &u[i * d..(i + 1) * d]);
        }
    });
    matmul(&f.down, g, n, out, mm, threads);
    add_bias(&mut out[..n * f.down.rows], bias.map(|b| b.down.as_slice()));
}

/// Scratch of [`run_experts`].
struct ExpertScratch<'a> {
    input: &'a mut Vec<f32>,
    output: &'a mut Vec<f32>,
    gate: &'a mut Vec<f32>,
    up: &'a mut Vec<f32>,
    mm: &'a mut MatmulScratch,
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
        scatter_weighted(out, eo, rows, h);
    }
}
