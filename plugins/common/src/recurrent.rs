//! The forward passes of the recurrent mixers: LFM2's gated short convolution and Qwen3.5's
//! gated delta-net. Rows are grouped by sequence and run in position order through that
//! sequence's state; the math is in `berth_kernels::recurrent`.

use crate::layers::{GatedDeltaNet, ShortConv};
use crate::linear::{matmul, matmul_shared, MatmulScratch};
use crate::state::{LayerState, SeqStates};
use berth_kernels::layer::{gated_rms_norm_heads, mul_into, silu_in_place, softplus};
use berth_kernels::ops::{scale_in_place, sigmoid};
use berth_kernels::recurrent::{
    conv1d_causal, gated_delta_chunked, gated_delta_step, l2_normalize, DeltaScratch,
};

/// The rows of one sequence in a batch: `rows[start..end]` of [`SeqGroups::rows`], in order.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    /// Sequence index.
    pub seq: usize,
    /// First entry in [`SeqGroups::rows`].
    pub start: usize,
    /// One past the last entry.
    pub end: usize,
    /// Position of the group's first row.
    pub pos0: usize,
}

/// A batch's rows grouped by sequence, each group in position order.
#[derive(Clone, Debug, Default)]
pub struct SeqGroups {
    /// Row indices, grouped.
    pub rows: Vec<usize>,
    /// The groups.
    pub groups: Vec<Group>,
}

impl SeqGroups {
    /// Groups `rows` (each row's sequence and position) by sequence, each group in batch order
    /// (which is position order); reuses its buffers.
    pub fn build(&mut self, rows: &[(usize, usize)]) {
        self.rows.clear();
        self.rows.extend(0..rows.len());
        self.rows.sort_unstable_by_key(|&i| (rows[i].0, i));
        self.groups.clear();
        let mut start = 0;
        while start < self.rows.len() {
            let (seq, pos0) = rows[self.rows[start]];
            let len = self.rows[start..]
                .iter()
                .take_while(|&&i| rows[i].0 == seq)
                .count();
            self.groups.push(Group {
                seq,
                start,
                end: start + len,
                pos0,
            });
            start += len;
        }
    }

    /// Splits a group into runs that end where a snapshot is due (`every` positions), so the
    /// state can be recorded there: `(first row entry, end entry, length after the run)`.
    pub fn runs(g: &Group, states: &SeqStates) -> impl Iterator<Item = (usize, usize, usize)> {
        let g = *g;
        let every = states.every();
        let snap = states.max_snapshots() > 0;
        let mut at = g.start;
        std::iter::from_fn(move || {
            if at >= g.end {
                return None;
            }
            let pos = g.pos0 + (at - g.start);
            let mut len = g.end - at;
            if snap {
                let to_boundary = every - pos % every;
                len = len.min(to_boundary);
            }
            let run = (at, at + len, pos + len);
            at += len;
            Some(run)
        })
    }
}

/// Scratch buffers of the recurrent mixers.
#[derive(Default)]
pub struct RecurrentScratch {
    proj: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    core: Vec<f32>,
    normed: Vec<f32>,
    run: RunScratch,
}

/// Buffers of one run of a sequence's rows through its state.
#[derive(Default)]
struct RunScratch {
    seq_in: Vec<f32>,
    seq_out: Vec<f32>,
    head: HeadScratch,
}

/// Buffers of one value head's delta rule over a run.
#[derive(Default)]
struct HeadScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    o: Vec<f32>,
    delta: DeltaScratch,
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// Below this many rows of one sequence the delta rule runs step by step.
const CHUNKED_FROM: usize = 8;

/// LFM2's short convolution over `n` normed rows `xn` into `out` (`n × hidden`):
/// `out_proj(c · conv(b · x))` with `b, c, x = in_proj(xn)`.
#[allow(clippy::too_many_arguments)]
pub fn short_conv(
    c: &ShortConv,
    layer: usize,
    xn: &[f32],
    n: usize,
    groups: &SeqGroups,
    states: &mut SeqStates,
    out: &mut [f32],
    s: &mut RecurrentScratch,
    mm: &mut MatmulScratch,
    threads: usize,
) {
    let h = c.out_proj.rows;
    let bcx = grow(&mut s.proj, n * 3 * h);
    matmul(&c.in_proj, xn, n, bcx, mm, threads);
    let y = grow(&mut s.core, n * h);
    let r = &mut s.run;
    for g in &groups.groups {
        for (a, e, len) in SeqGroups::runs(g, states) {
            let m = e - a;
            let inp = grow(&mut r.seq_in, m * h);
            for (j, &row) in groups.rows[a..e].iter().enumerate() {
                let bcx_row = &bcx[row * 3 * h..(row + 1) * 3 * h];
                mul_into(&mut inp[j * h..(j + 1) * h], &bcx_row[..h], &bcx_row[2 * h..]);
            }
            let conv_out = grow(&mut r.seq_out, m * h);
            let st = states.layer_mut(g.seq, layer);
            conv1d_causal(inp, m, h, &c.conv, c.kernel, &mut st.conv, conv_out);
            for (j, &row) in groups.rows[a..e].iter().enumerate() {
                let cg = &bcx[row * 3 * h + h..row * 3 * h + 2 * h];
                mul_into(&mut y[row * h..(row + 1) * h], &conv_out[j * h..(j + 1) * h], cg);
            }
            if states.snapshot_due(len) {
                states.snapshot_layer(g.seq, layer, len);
            }
        }
    }
    matmul(&c.out_proj, y, n, out, mm, threads);
}

/// Qwen3.5's gated delta-net over `n` normed rows `xn` into `out` (`n × hidden`); `eps` is the
/// gated norm's epsilon. Projections of all rows, then each sequence's rows through its
/// convolution and delta-rule state (`delta_run`), then the gated norm and the output
/// projection.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    d: &GatedDeltaNet,
    layer: usize,
    eps: f32,
    xn: &[f32],
    n: usize,
    groups: &SeqGroups,
    states: &mut SeqStates,
    out: &mut [f32],
    s: &mut RecurrentScratch,
    mm: &mut MatmulScratch,
    threads: usize,
) {
    let (ch, vd) = (d.conv_channels(), d.v_heads * d.dv);
    let mixed = grow(&mut s.proj, n * ch);
    let z = grow(&mut s.z, n * vd);
    let b = grow(&mut s.b, n * d.v_heads);
    let a = grow(&mut s.a, n * d.v_heads);
    matmul_shared(
        xn,
        n,
        &mut [
            (&d.in_qkv, &mut *mixed),
            (&d.in_z, &mut *z),
            (&d.in_b, &mut *b),
            (&d.in_a, &mut *a),
        ],
        mm,
        threads,
    );
    let core = grow(&mut s.core, n * vd);
    let projected = DeltaInputs { mixed, a, b };
    for g in &groups.groups {
        for (ra, re, len) in SeqGroups::runs(g, states) {
            let st = states.layer_mut(g.seq, layer);
            delta_run(d, &projected, &groups.rows[ra..re], st, core, &mut s.run);
            if states.snapshot_due(len) {
                states.snapshot_layer(g.seq, layer, len);
            }
        }
    }
    gated_rms_norm_heads(core, z, &d.norm, eps, grow(&mut s.normed, d.dv));
    matmul(&d.out_proj, core, n, out, mm, threads);
}

/// The delta-net's projections of every row: the convolution's input channels and each value
/// head's decay (`a`) and update strength (`b`) logits.
struct DeltaInputs<'a> {
    mixed: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
}

/// One run of a sequence's rows: the causal convolution (then SiLU) through the sequence's
/// convolution state, then per value head the delta rule through its recurrent state, each row's
/// output into `core`.
fn delta_run(
    d: &GatedDeltaNet,
    x: &DeltaInputs<'_>,
    rows: &[usize],
    st: &mut LayerState,
    core: &mut [f32],
    r: &mut RunScratch,
) {
    let (m, ch, dk, dv) = (rows.len(), d.conv_channels(), d.dk, d.dv);
    let vd = d.v_heads * dv;
    let inp = grow(&mut r.seq_in, m * ch);
    for (j, &row) in rows.iter().enumerate() {
        inp[j * ch..(j + 1) * ch].copy_from_slice(&x.mixed[row * ch..(row + 1) * ch]);
    }
    let conv = grow(&mut r.seq_out, m * ch);
    conv1d_causal(inp, m, ch, &d.conv, d.kernel, &mut st.conv, conv);
    silu_in_place(conv);
    let r = &mut r.head;
    for hv in 0..d.v_heads {
        head_inputs(d, hv, conv, x, rows, r);
        let (q, k, v) = (&r.q[..m * dk], &r.k[..m * dk], &r.v[..m * dv]);
        let (gg, beta, o) = (&r.g[..m], &r.beta[..m], &mut r.o[..m * dv]);
        let state = &mut st.recurrent[hv * dk * dv..(hv + 1) * dk * dv];
        if m < CHUNKED_FROM {
            for j in 0..m {
                let (qj, kj, vj) = (
                    &q[j * dk..(j + 1) * dk],
                    &k[j * dk..(j + 1) * dk],
                    &v[j * dv..(j + 1) * dv],
                );
                gated_delta_step(
                    state,
                    dk,
                    dv,
                    qj,
                    kj,
                    vj,
                    gg[j],
                    beta[j],
                    &mut o[j * dv..(j + 1) * dv],
                );
            }
        } else {
            gated_delta_chunked(state, dk, dv, m, q, k, v, gg, beta, o, &mut r.delta);
        }
        for (j, &row) in rows.iter().enumerate() {
            core[row * vd + hv * dv..row * vd + (hv + 1) * dv].copy_from_slice(&o[j * dv..(j + 1) * dv]);
        }
    }
}

/// Value head `hv`'s inputs for the run's rows, from the convolved channels: the queries
/// (L2-normed, scaled by `1/sqrt(dk)`) and keys (L2-normed) of its key head, its values, its
/// decay `-exp(A) · softplus(a + dt_bias)` and its update strength `sigmoid(b)`.
fn head_inputs(
    d: &GatedDeltaNet,
    hv: usize,
    conv: &[f32],
    x: &DeltaInputs<'_>,
    rows: &[usize],
    r: &mut HeadScratch,
) {
    let (m, ch, nv, dk, dv) = (rows.len(), d.conv_channels(), d.v_heads, d.dk, d.dv);
    let (kd, hk) = (d.k_heads * dk, d.key_head(hv));
    let scale = 1.0 / (dk as f32).sqrt();
    let (q, k, v) = (
        grow(&mut r.q, m * dk),
        grow(&mut r.k, m * dk),
        grow(&mut r.v, m * dv),
    );
    let (gg, beta) = (grow(&mut r.g, m), grow(&mut r.beta, m));
    grow(&mut r.o, m * dv);
    for (j, &row) in rows.iter().enumerate() {
        let channels = &conv[j * ch..(j + 1) * ch];
        let qj = &mut q[j * dk..(j + 1) * dk];
        qj.copy_from_slice(&channels[hk * dk..(hk + 1) * dk]);
        l2_normalize(qj, 1e-6);
        scale_in_place(qj, scale);
        let kj = &mut k[j * dk..(j + 1) * dk];
        kj.copy_from_slice(&channels[kd + hk * dk..kd + (hk + 1) * dk]);
        l2_normalize(kj, 1e-6);
        v[j * dv..(j + 1) * dv].copy_from_slice(&channels[2 * kd + hv * dv..2 * kd + (hv + 1) * dv]);
        gg[j] = d.neg_a[hv] * softplus(x.a[row * nv + hv] + d.dt_bias[hv]);
        beta[j] = sigmoid(x.b[row * nv + hv]);
    }
}
