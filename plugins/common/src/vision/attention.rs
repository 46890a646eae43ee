//! The one attention block of the vision towers: q/k/v projections, multi-head attention, output
//! projection.
//!
//! ```text
//! q = W_q x_q + b_q          k = W_k x_k + b_k          v = W_v x_v + b_v
//! ctx_h = softmax(q_h k_hᵀ · scale) v_h     per head h, over the keys a query row may see
//! out = W_o ctx + b_o
//! ```
//!
//! Every site is this block with different inputs and key sets:
//! - encoder layers: self-attention (`x_q = x_k = x_v`), padding keys masked ([`Keys::Masked`]);
//! - SigLIP's pooling head: one probe row attends over the patches (cross-attention);
//! - MiniCPM-V 4.6's ViT merger: self-attention within each window of consecutive rows
//!   ([`Keys::Windows`]);
//! - MiniCPM-V 4.x's resampler: learned queries over the patches, keys carrying the 2-D positions
//!   and values not (`x_k ≠ x_v`).
//!
//! Biases are the [`Linear`]s' own (absent when the checkpoint has none); the arithmetic is
//! [`berth_kernels::vision::bidirectional_attention`], query rows split over the threads (each
//! row's numbers do not depend on the split).

use super::Linear;
use crate::linear::{par_units, MatmulScratch};
use berth_kernels::vision::bidirectional_attention;

/// Which key rows each query row attends to.
#[derive(Clone, Copy, Debug, Default)]
pub enum Keys<'a> {
    /// Every key row.
    #[default]
    All,
    /// The key rows whose entry is true (padding patches are false).
    Masked(&'a [bool]),
    /// Self-attention within windows of this many consecutive rows: a row sees the rows of its
    /// own window only.
    Windows(usize),
}

/// Multi-head attention with its q, k, v and output projections.
#[derive(Clone, Debug)]
pub struct Attention {
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub out: Linear,
    /// Heads (as many key/value heads as query heads).
    pub heads: usize,
    /// Score scale; `None` is `1/√head_dim`.
    pub scale: Option<f32>,
}

impl Attention {
    /// The block from its projections, with the usual `1/√head_dim` score scale.
    pub fn new(q: Linear, k: Linear, v: Linear, out: Linear, heads: usize) -> Attention {
        Attention {
            q,
            k,
            v,
            out,
            heads,
            scale: None,
        }
    }

    /// Width of the projected rows (all heads).
    pub fn width(&self) -> usize {
        self.q.weight.rows
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.width() / self.heads
    }

    /// The score scale in use.
    pub fn score_scale(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| 1.0 / (self.head_dim() as f32).sqrt())
    }

    /// Self-attention of the `n` rows of `x` (queries, keys and values all projected from `x`)
    /// into the first `n` rows of `out`.
    pub fn self_attention(
        &self,
        x: &[f32],
        n: usize,
        keys: Keys<'_>,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
        threads: usize,
    ) {
        self.cross_attention(x, n, x, x, n, keys, out, scratch, threads);
    }

    /// Attention of the `n_q` rows of `queries` over `n_k` key rows projected from `keys_in` and
    /// value rows projected from `values_in` (the same slice unless the keys carry something
    /// the values do not), into the first `n_q` rows of `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn cross_attention(
        &self,
        queries: &[f32],
        n_q: usize,
        keys_in: &[f32],
        values_in: &[f32],
        n_k: usize,
        keys: Keys<'_>,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
        threads: usize,
    ) {
        let d = self.width();
        let (mut q, mut k, mut v) = (
            vec![0.0f32; n_q * d],
            vec![0.0f32; n_k * d],
            vec![0.0f32; n_k * d],
        );
        self.q.forward(queries, n_q, &mut q, scratch, threads);
        self.k.forward(keys_in, n_k, &mut k, scratch, threads);
        self.v.forward(values_in, n_k, &mut v, scratch, threads);
        let ctx = self.attend(&q, &k, &v, n_k, keys, threads);
        self.out.forward(&ctx, n_q, out, scratch, threads);
    }

    /// `softmax(q kᵀ · scale) v` per head for projected rows, before the output projection.
    fn attend(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n_k: usize,
        keys: Keys<'_>,
        threads: usize,
    ) -> Vec<f32> {
        let (d, heads, hd, scale) = (self.width(), self.heads, self.head_dim(), self.score_scale());
        let mut ctx = vec![0.0f32; q.len()];
        match keys {
            Keys::All | Keys::Masked(_) => {
                let mask = match keys {
                    Keys::Masked(m) => Some(m),
                    _ => None,
                };
                par_units(threads, &mut ctx, d, |rows, chunk| {
                    let qs = &q[rows.start * d..rows.end * d];
                    bidirectional_attention(qs, k, v, n_k, heads, hd, mask, scale, chunk);
                });
            }
            Keys::Windows(size) => {
                assert!(
                    size > 0 && n_k.is_multiple_of(size) && q.len() == n_k * d,
                    "window attention: {n_k} rows are not whole windows of {size}"
                );
                let ws = size * d;
                par_units(threads, &mut ctx, ws, |windows, chunk| {
                    for (win, o) in windows.zip(chunk.chunks_exact_mut(ws)) {
                        let r = win * ws..(win + 1) * ws;
                        let (qw, kw, vw) = (&q[r.clone()], &k[r.clone()], &v[r]);
                        bidirectional_attention(qw, kw, vw, size, heads, hd, None, scale, o);
                    }
                });
            }
        }
        ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Matrix;

    /// A linear layer with deterministic small weights and, when asked, a bias.
    fn linear(rows: usize, cols: usize, seed: u32, bias: bool) -> Linear {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as u32 * 7 + seed * 13) % 17) as f32 / 17.0 - 0.5)
            .collect();
        Linear {
            weight: Matrix::from_f32(rows, cols, &w),
            bias: bias.then(|| (0..rows).map(|i| i as f32 * 0.01 - 0.02).collect()),
        }
    }

    fn block(d: usize, heads: usize) -> Attention {
        Attention::new(
            linear(d, d, 1, true),
            linear(d, d, 2, false),
            linear(d, d, 3, true),
            linear(d, d, 4, true),
            heads,
        )
    }

    fn rows(n: usize, d: usize, seed: u32) -> Vec<f32> {
        (0..n * d)
            .map(|i| ((i as u32 * 5 + seed) % 11) as f32 / 11.0 - 0.4)
            .collect()
    }

    #[test]
    fn masked_keys_are_the_same_as_leaving_them_out() {
        let (d, n) = (8, 5);
        let a = block(d, 2);
        let x = rows(n, d, 3);
        let mask = [true, false, true, true, false];
        let mut s = MatmulScratch::new();
        let mut masked = vec![0.0; n * d];
        a.cross_attention(&x, n, &x, &x, n, Keys::Masked(&mask), &mut masked, &mut s, 2);
        let kept: Vec<f32> = x
            .chunks_exact(d)
            .zip(mask)
            .filter(|(_, m)| *m)
            .flat_map(|(r, _)| r.iter().copied())
            .collect();
        let mut left_out = vec![0.0; n * d];
        a.cross_attention(&x, n, &kept, &kept, 3, Keys::All, &mut left_out, &mut s, 1);
        assert_eq!(masked, left_out);
    }

    #[test]
    fn windows_attend_within_themselves_only() {
        let (d, size, windows) = (8, 4, 3);
        let a = block(d, 4);
        let n = size * windows;
        let x = rows(n, d, 1);
        let mut s = MatmulScratch::new();
        let mut all = vec![0.0; n * d];
        a.self_attention(&x, n, Keys::Windows(size), &mut all, &mut s, 3);
        for w in 0..windows {
            let part = &x[w * size * d..(w + 1) * size * d];
            let mut alone = vec![0.0; size * d];
            a.self_attention(part, size, Keys::All, &mut alone, &mut s, 1);
            assert_eq!(&all[w * size * d..(w + 1) * size * d], &alone[..], "window {w}");
        }
    }

    #[test]
    fn keys_and_values_come_from_their_own_rows_and_threads_change_nothing() {
        let (d, nq, nk) = (8, 3, 6);
        let a = block(d, 2);
        let (q, k) = (rows(nq, d, 2), rows(nk, d, 4));
        let mut v = k.clone();
        v.iter_mut().for_each(|x| *x *= 2.0);
        let mut s = MatmulScratch::new();
        let mut one = vec![0.0; nq * d];
        a.cross_attention(&q, nq, &k, &v, nk, Keys::All, &mut one, &mut s, 1);
        let mut three = vec![0.0; nq * d];
        a.cross_attention(&q, nq, &k, &v, nk, Keys::All, &mut three, &mut s, 3);
        assert_eq!(one, three);
        let mut same = vec![0.0; nq * d];
        a.cross_attention(&q, nq, &k, &k, nk, Keys::All, &mut same, &mut s, 1);
        assert_ne!(one, same, "the values are not the keys");
        // One head over all the width scales scores by 1/√8 unless told otherwise.
        let mut plain = block(d, 1);
        assert_eq!(plain.score_scale(), 1.0 / 8f32.sqrt());
        plain.scale = Some(0.0);
        let mut flat = vec![0.0; nq * d];
        plain.cross_attention(&q, nq, &k, &v, nk, Keys::All, &mut flat, &mut s, 1);
        // Zero scale: every query row takes the same (mean) value row.
        assert_eq!(flat[..d], flat[d..2 * d]);
    }
}
