//! MiniCPM-V's perceiver resampler (2.5 / 2.6 / 4.0 `Resampler2_5`, 4.5 `Resampler4_5` on
//! images): a fixed set of learned queries attends once over one slice's vision features.
//!
//! ```text
//! x   = ln_kv(kv_proj(vision))            kv_proj: vision width -> embed_dim, no bias
//! q   = ln_q(query)                       query: num_queries x embed_dim
//! out = MHA(q, k = x + pos2d(h, w), v = x)   nn.MultiheadAttention, embed_dim / 128 heads
//! y   = ln_post(out) @ proj               proj: embed_dim x embed_dim
//! ```
//!
//! `pos2d` is the 2-D sincos table of the slice's `h × w` patch grid, row-major:
//! `[sin(c·ω), cos(c·ω), sin(r·ω), cos(r·ω)]` for row `r`, column `c`, each part `D/4` wide,
//! `ω_j = 1 / 10000^(j / (D/4))` (the model's `get_2d_sincos_pos_embed`, whose meshgrid puts
//! the column coordinate first). MiniCPM-V 4.5's own resampler adds the position to the keys
//! for images as 4.0 does (its temporal embedding for video frames is not needed here).

use super::{Attention, Keys, LayerNorm, Linear};
use crate::linear::MatmulScratch;
use crate::weights::{Matrix, Weights};
use berth_plugin_api::PluginError;

fn fail(msg: impl Into<String>) -> PluginError {
    PluginError::failed(msg.into())
}

/// Width of one resampler attention head (MiniCPM-V builds `embed_dim // 128` heads).
pub const RESAMPLER_HEAD_DIM: usize = 128;

/// A loaded resampler.
#[derive(Clone, Debug)]
pub struct Resampler {
    /// Learned queries, `num_queries × embed_dim`.
    pub query: Vec<f32>,
    /// Number of queries (image tokens per slice).
    pub num_queries: usize,
    /// Projection of the vision features to `embed_dim` (no bias).
    pub kv_proj: Linear,
    /// The cross attention (`in_proj` split into q, k, v; `out_proj`).
    pub attn: Attention,
    /// Norm of the queries.
    pub ln_q: LayerNorm,
    /// Norm of the projected vision features.
    pub ln_kv: LayerNorm,
    /// Norm of the attention output.
    pub ln_post: LayerNorm,
    /// The final `x @ proj`, stored transposed as a linear layer (`out × in`).
    pub proj: Linear,
}

/// The 2-D sincos position table of an `h × w` grid, `h·w × dim` row-major (see the module
/// docs), computed in f32 as numpy computes the model's float32 table.
pub fn sincos_2d(dim: usize, h: usize, w: usize) -> Vec<f32> {
    let q = dim / 4;
    let omega: Vec<f32> = (0..q).map(|j| 1.0 / 10000f32.powf(j as f32 / q as f32)).collect();
    let mut out = vec![0.0f32; h * w * dim];
    for r in 0..h {
        for c in 0..w {
            let row = &mut out[(r * w + c) * dim..(r * w + c + 1) * dim];
            for (j, &o) in omega.iter().enumerate() {
                let (a, b) = ((c as f32 * o) as f64, (r as f32 * o) as f64);
                row[j] = a.sin() as f32;
                row[q + j] = a.cos() as f32;
                row[2 * q + j] = b.sin() as f32;
                row[3 * q + j] = b.cos() as f32;
            }
        }
    }
    out
}

impl Resampler {
    /// Loads `{prefix}query`, `.kv_proj`, `.attn.in_proj_{weight,bias}`, `.attn.out_proj`,
    /// `.ln_q`, `.ln_kv`, `.ln_post` and `.proj` (prefix `"resampler"`), for vision features of
    /// `kv_dim` values into `embed_dim`, with `num_queries` queries.
    pub fn load(
        w: &Weights,
        prefix: &str,
        num_queries: usize,
        embed_dim: usize,
        kv_dim: usize,
    ) -> Result<Resampler, PluginError> {
        let d = embed_dim;
        if d < RESAMPLER_HEAD_DIM || !d.is_multiple_of(4) {
            return Err(fail(format!(
                "resampler width {d}: needs at least one {RESAMPLER_HEAD_DIM}-wide head and a multiple of 4"
            )));
        }
        let heads = d / RESAMPLER_HEAD_DIM;
        if !d.is_multiple_of(heads) {
            return Err(fail(format!("resampler width {d} is not split by {heads} heads")));
        }
        let query = w.vector_named(&format!("{prefix}.query"))?;
        if query.len() != num_queries * d {
            return Err(fail(format!(
                "{prefix}.query: {} values, {num_queries}x{d} expected",
                query.len()
            )));
        }
        let in_w = w.matrix_named(&format!("{prefix}.attn.in_proj_weight"))?;
        if in_w.rows != 3 * d || in_w.cols != d {
            return Err(fail(format!(
                "{prefix}.attn.in_proj_weight: {}x{}, {}x{d} expected",
                in_w.rows,
                in_w.cols,
                3 * d
            )));
        }
        let in_b = {
            let name = format!("{prefix}.attn.in_proj_bias");
            if w.has_named(&name) {
                let b = w.vector_named(&name)?;
                if b.len() != 3 * d {
                    return Err(fail(format!("{name}: {} values, {} expected", b.len(), 3 * d)));
                }
                Some(b)
            } else {
                None
            }
        };
        let part = |i: usize| Linear {
            weight: in_w.slice_rows(i * d, d),
            bias: in_b.as_ref().map(|b| b[i * d..(i + 1) * d].to_vec()),
        };
        let proj = w.vector_named(&format!("{prefix}.proj"))?;
        if proj.len() != d * d {
            return Err(fail(format!(
                "{prefix}.proj: {} values, {d}x{d} expected",
                proj.len()
            )));
        }
        // y = x @ proj  <=>  y_j = Σ_i proj[i][j] x_i: the linear weight is projᵀ.
        let mut proj_t = vec![0.0f32; d * d];
        for i in 0..d {
            for j in 0..d {
                proj_t[j * d + i] = proj[i * d + j];
            }
        }
        let ln = |n: &str| LayerNorm::load(w, &format!("{prefix}.{n}"), 1e-6);
        Ok(Resampler {
            query,
            num_queries,
            kv_proj: Linear::load(w, &format!("{prefix}.kv_proj"), d, kv_dim)?,
            attn: Attention::new(
                part(0),
                part(1),
                part(2),
                Linear::load(w, &format!("{prefix}.attn.out_proj"), d, d)?,
                heads,
            ),
            ln_q: ln("ln_q")?,
            ln_kv: ln("ln_kv")?,
            ln_post: ln("ln_post")?,
            proj: Linear {
                weight: Matrix::from_f32(d, d, &proj_t),
                bias: None,
            },
        })
    }

    /// Width of the output rows (the language model's).
    pub fn embed_dim(&self) -> usize {
        self.ln_post.weight.len()
    }

    /// The `num_queries × embed_dim` features of one slice whose vision features `vision`
    /// (`h·w` rows of the tower's width) cover an `h × w` patch grid.
    pub fn forward(
        &self,
        vision: &[f32],
        (h, w): (usize, usize),
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        let d = self.embed_dim();
        let n = h * w;
        let kv_dim = self.kv_proj.weight.cols;
        if n == 0 || vision.len() != n * kv_dim {
            return Err(fail(format!(
                "{} vision values for a {h}x{w} grid of {kv_dim}",
                vision.len()
            )));
        }
        let mut scratch = MatmulScratch::new();
        let mut projected = vec![0.0f32; n * d];
        self.kv_proj
            .forward(vision, n, &mut projected, &mut scratch, threads);
        let mut x = vec![0.0f32; n * d];
        self.ln_kv.forward(&projected, &mut x);
        let mut keyed = x.clone();
        keyed
            .iter_mut()
            .zip(sincos_2d(d, h, w))
            .for_each(|(a, b)| *a += b);

        let nq = self.num_queries;
        let mut qn = vec![0.0f32; nq * d];
        self.ln_q.forward(&self.query, &mut qn);
        // The keys carry the 2-D positions; the values do not.
        let mut attended = vec![0.0f32; nq * d];
        self.attn.cross_attention(
            &qn,
            nq,
            &keyed,
            &x,
            n,
            Keys::All,
            &mut attended,
            &mut scratch,
            threads,
        );
        let mut normed = vec![0.0f32; nq * d];
        self.ln_post.forward(&attended, &mut normed);
        let mut out = vec![0.0f32; nq * d];
        self.proj.forward(&normed, nq, &mut out, &mut scratch, threads);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sincos_table_puts_the_column_first() {
        let t = sincos_2d(8, 2, 3);
        // Row 1, column 2, dim 8: ω = [1, 1/100].
        let row = &t[(3 + 2) * 8..(3 + 3) * 8];
        let want = [
            2f32.sin(),
            0.02f32.sin(),
            2f32.cos(),
            0.02f32.cos(),
            1f32.sin(),
            0.01f32.sin(),
            1f32.cos(),
            0.01f32.cos(),
        ];
        for (a, b) in row.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{row:?}");
        }
    }
}
