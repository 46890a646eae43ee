//! The end of the pass: the final norm, and the LM head for the rows that want logits.

use super::forward::{grow, Pass, Scratch};
use crate::linear::matmul;
use crate::ops::softcap;
use berth_plugin_api::LogitsOut;

impl Pass<'_> {
    /// Every row's final-normed state into `out` (`n × hidden`), for a caller that embeds.
    pub(super) fn final_states(&self, out: &mut Vec<f32>, s: &Scratch) {
        let nh = self.n * self.cfg.hidden;
        out.clear();
        out.resize(nh, 0.0);
        self.cfg.norm(&self.w.output_norm).rows(&s.x[..nh], out);
    }

    /// Final norm and LM head for the rows that want logits, into the next logits rows in row
    /// order, soft-capped where the model caps them; a row's padding past the vocabulary is -inf.
    pub(super) fn head(&mut self, want_logits: &[u8], logits: &mut LogitsOut<'_>, s: &mut Scratch) {
        let m = want_logits.iter().filter(|&&wl| wl != 0).count();
        if m == 0 {
            return;
        }
        let (cfg, w, h) = (self.cfg, self.w, self.cfg.hidden);
        let hin = grow(&mut s.head_in, m * h);
        let wanted = (s.x.chunks_exact(h).zip(want_logits)).filter(|&(_, &wl)| wl != 0);
        for ((row, _), dst) in wanted.zip(hin.chunks_exact_mut(h)) {
            cfg.norm(&w.output_norm).rows(row, dst);
        }
        let vocab = w.output.rows;
        s.mm.tiled = false;
        if m == 1 {
            // One row (a decode step): straight into the caller's buffer, without a copy.
            let (row, pad) = logits.row_mut(0).split_at_mut(vocab);
            matmul(&w.output, hin, 1, row, &mut s.mm, self.threads);
            if let Some(cap) = cfg.final_softcap {
                softcap(row, cap);
            }
            pad.fill(f32::NEG_INFINITY);
            return;
        }
        let lg = grow(&mut s.logits, m * vocab);
        matmul(&w.output, hin, m, lg, &mut s.mm, self.threads);
        for (j, src) in lg.chunks_exact_mut(vocab).enumerate() {
            if let Some(cap) = cfg.final_softcap {
                softcap(src, cap);
            }
            let dst = logits.row_mut(j);
            dst[..vocab].copy_from_slice(src);
            dst[vocab..].fill(f32::NEG_INFINITY);
        }
    }
}
