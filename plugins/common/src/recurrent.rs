//! The forward passes of the recurrent mixers: LFM2's gated short convolution and Qwen3.5's
//! gated delta-net. Rows are grouped by sequence and run in position order through that
//! sequence's state; the math is in `berth_kernels::recurrent`.

use crate::layers::{GatedDeltaNet, ShortConv};
use crate::linear::{matmul, matmul_shared, MatmulScratch};
use crate::ops::{rms_norm, silu};
use crate::state::SeqStates;
use berth_kernels::layer::softplus;
use berth_kernels::ops::sigmoid;
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
    seq_in: Vec<f32>,
    seq_out: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    o: Vec<f32>,
    core: Vec<f32>,
    normed: Vec<f32>,
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

/// LFM2's short convolution over `n` normed rows `xn` into `out` (`n × hidden`).
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
    for g in &groups.groups {
        for (a, e, len) in SeqGroups::runs(g, states) {
            let m = e - a;
            let inp = grow(&mut s.seq_in, m * h);
            for (j, &r) in groups.rows[a..e].iter().enumerate() {
                let row = &bcx[r * 3 * h..(r + 1) * 3 * h];
                let (bg, x) = (&row[..h], &row[2 * h..]);
                inp[j * h..(j + 1) * h]
                    .iter_mut()
                    .zip(bg.iter().zip(x))
                    .for_each(|(d, (b, x))| *d = b * x);
            }
            let conv_out = grow(&mut s.seq_out, m * h);
            let st = states.layer_mut(g.seq, layer);
            conv1d_causal(inp, m, h, &c.conv, c.kernel, &mut st.conv, conv_out);
            for (j, &r) in groups.rows[a..e].iter().enumerate() {
                let cg = &bcx[r * 3 * h + h..r * 3 * h + 2 * h];
                y[r * h..(r + 1) * h]
                    .iter_mut()
                    .zip(conv_out[j * h..(j + 1) * h].iter().zip(cg))
                    .for_each(|(d, (v, c))| *d = v * c);
            }
            if states.snapshot_due(len) {
                states.snapshot_layer(g.seq, layer, len);
            }
        }
    }
    matmul(&c.out_proj, y, n, out, mm, threads);
}

/// Qwen3.5's gated delta-net over `n` normed rows `xn` into `out` (`n × hidden`); `eps` is the
/// gated norm's epsilon.
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
    let (nk, nv, dk, dv) = (d.k_heads, d.v_heads, d.dk, d.dv);
    let (kd, vd) = (nk * dk, nv * dv);
    let ch = d.conv_channels();
    let mixed = grow(&mut s.proj, n * ch);
    let z = grow(&mut s.z, n * vd);
    let b = grow(&mut s.b, n * nv);
    let a = grow(&mut s.a, n * nv);
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
    let scale = 1.0 / (dk as f32).sqrt();
    for g in &groups.groups {
        for (ra, re, len) in SeqGroups::runs(g, states) {
            let m = re - ra;
            let rows = &groups.rows[ra..re];
            let inp = grow(&mut s.seq_in, m * ch);
            for (j, &r) in rows.iter().enumerate() {
                inp[j * ch..(j + 1) * ch].copy_from_slice(&mixed[r * ch..(r + 1) * ch]);
            }
            let conv = grow(&mut s.seq_out, m * ch);
            let st = states.layer_mut(g.seq, layer);
            conv1d_causal(inp, m, ch, &d.conv, d.kernel, &mut st.conv, conv);
            conv.iter_mut().for_each(|v| *v = silu(*v));
            let (q, k, v) = (
                grow(&mut s.q, m * dk),
                grow(&mut s.k, m * dk),
                grow(&mut s.v, m * dv),
            );
            let (gg, beta, o) = (grow(&mut s.g, m), grow(&mut s.beta, m), grow(&mut s.o, m * dv));
            for hv in 0..nv {
                let hk = d.key_head(hv);
                for j in 0..m {
                    let row = &conv[j * ch..(j + 1) * ch];
                    let qj = &mut q[j * dk..(j + 1) * dk];
                    qj.copy_from_slice(&row[hk * dk..(hk + 1) * dk]);
                    l2_normalize(qj, 1e-6);
                    qj.iter_mut().for_each(|x| *x *= scale);
                    let kj = &mut k[j * dk..(j + 1) * dk];
                    kj.copy_from_slice(&row[kd + hk * dk..kd + (hk + 1) * dk]);
                    l2_normalize(kj, 1e-6);
                    v[j * dv..(j + 1) * dv].copy_from_slice(&row[2 * kd + hv * dv..2 * kd + (hv + 1) * dv]);
                    let r = rows[j];
                    gg[j] = d.neg_a[hv] * softplus(a[r * nv + hv] + d.dt_bias[hv]);
                    beta[j] = sigmoid(b[r * nv + hv]);
                }
                let state = &mut st.recurrent[hv * dk * dv..(hv + 1) * dk * dv];
                if m < CHUNKED_FROM {
                    for j in 0..m {
                        gated_delta_step(
                            state,
                            dk,
                            dv,
                            &q[j * dk..(j + 1) * dk],
                            &k[j * dk..(j + 1) * dk],
                            &v[j * dv..(j + 1) * dv],
                            gg[j],
                            beta[j],
                            &mut o[j * dv..(j + 1) * dv],
                        );
                    }
                } else {
                    gated_delta_chunked(state, dk, dv, m, q, k, v, gg, beta, o, &mut s.delta);
                }
                for (j, &r) in rows.iter().enumerate() {
                    core[r * vd + hv * dv..r * vd + (hv + 1) * dv].copy_from_slice(&o[j * dv..(j + 1) * dv]);
                }
            }
            if states.snapshot_due(len) {
                states.snapshot_layer(g.seq, layer, len);
            }
        }
    }
    // Gated RMSNorm per value head: w · rmsnorm(o) · silu(z).
    let normed = grow(&mut s.normed, dv);
    for (oh, zh) in core.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
        rms_norm(oh, Some(&d.norm), eps, false, normed);
        oh.iter_mut()
            .zip(normed.iter().zip(zh))
            .for_each(|(o, (nv, zv))| *o = nv * silu(*zv));
    }
    matmul(&d.out_proj, core, n, out, mm, threads);
}
