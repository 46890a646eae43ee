//! Simple, correct f32 element-wise operations: RMS norm, activations, softmax, RoPE, softcap.
//! (The kernels crate may provide SIMD versions later.)

use berth_kernels::quant::{f16_to_f32, f32_to_f16};
use std::sync::OnceLock;

/// RMS norm of `x` into `out`: `x / sqrt(mean(x²) + eps)`, times `w` (or `1 + w` when `add_one`).
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32, add_one: bool, out: &mut [f32]) {
    // Squares summed in f64, like ggml (`ggml_float`), so both engines see the same scale.
    let n = x.len();
    let ss = (x.iter().map(|v| (v * v) as f64).sum::<f64>() / n as f64) as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    match w {
        Some(w) => {
            let off = if add_one { 1.0 } else { 0.0 };
            for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
                *o = v * scale * (wi + off);
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * scale;
            }
        }
    }
}

/// RMS norm in place, applied to each `w.len()`-sized chunk of `x` (per-head q/k norms).
pub fn rms_norm_heads(x: &mut [f32], w: &[f32], eps: f32, add_one: bool) {
    let d = w.len();
    let mut tmp = [0.0f32; 1024];
    for head in x.chunks_exact_mut(d) {
        let t = &mut tmp[..d];
        t.copy_from_slice(head);
        rms_norm(t, Some(w), eps, add_one, head);
    }
}

/// SiLU: `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// Softmax in place (the sum of exponentials in f64, like ggml).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// ggml-cpu's GELU (tanh approximation) as its GEGLU uses it: the input rounded to f16 and looked
/// up in a table of f16 results computed in f32 (`GGML_GELU_FP16`); 0 below -10, identity above 10.
#[inline]
pub fn gelu_tanh_f16(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_f16_table()[f32_to_f16(x) as usize]
    }
}

fn gelu_f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const C: f32 = 0.797_884_6; // sqrt(2/pi)
        (0..=u16::MAX)
            .map(|h| {
                let x = f16_to_f32(h);
                let y = 0.5 * x * (1.0 + (C * x * (1.0 + 0.044715 * x * x)).tanh());
                f16_to_f32(f32_to_f16(y))
            })
            .collect()
    })
}

/// Rounds to the nearest f16 and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Soft-capping: `cap · tanh(x / cap)` in place.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// Rotary position embedding for one layer: inverse frequencies and the pairing layout.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Inverse frequency of each rotated pair (`head_dim_rotated / 2` of them).
    pub inv_freq: Vec<f32>,
    /// Head dimension (pairs are `(i, i + head_dim/2)` in NeoX layout, `(2i, 2i+1)` otherwise).
    pub head_dim: usize,
    /// NeoX / rotate_half layout.
    pub neox: bool,
    /// NeoX pair distance: `head_dim / 2` (llama.cpp, Gemma 4's proportional RoPE), or
    /// `rot_dim / 2` when only the first `rot_dim` dimensions rotate (HF partial rotary, Qwen3.5).
    pub half: usize,
    /// ggml's f32 angles: `theta_j = pos · base^(-2/rot_dim)^j` as a running f32 product, then
    /// `cosf`/`sinf` (instead of f64 angles from `inv_freq`).
    pub ggml: Option<GgmlRope>,
}

/// The f32 quantities ggml-cpu computes RoPE angles from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GgmlRope {
    /// `powf(base, -2 / rot_dim)`.
    pub theta_scale: f32,
    /// Frequency scale (1 / linear scaling factor).
    pub freq_scale: f32,
}

impl Rope {
    /// Default RoPE: `inv_freq[j] = base^(-2j / rot_dim)` for `j < rot_dim / 2`.
    pub fn new(base: f32, head_dim: usize, rot_dim: usize, neox: bool) -> Rope {
        let inv_freq = (0..rot_dim / 2)
            .map(|j| 1.0 / (base as f64).powf(2.0 * j as f64 / rot_dim as f64) as f32)
            .collect();
        Rope {
            inv_freq,
            head_dim,
            neox,
            half: head_dim / 2,
            ggml: None,
        }
    }

    /// HF's partial rotary embedding: only the first `rot_dim` dimensions of each head rotate,
    /// paired `(j, j + rot_dim/2)` (transformers' `partial_rotary_factor`).
    pub fn new_partial(base: f32, head_dim: usize, rot_dim: usize) -> Rope {
        Rope {
            half: rot_dim / 2,
            ..Rope::new(base, head_dim, rot_dim, true)
        }
    }

    /// RoPE with ggml-cpu's f32 angle computation (see [`Rope::ggml`]); `freq_scale` is
    /// 1 / the linear scaling factor.
    pub fn new_ggml(base: f32, head_dim: usize, rot_dim: usize, neox: bool, freq_scale: f32) -> Rope {
        let mut r = Rope::new(base, head_dim, rot_dim, neox);
        r.inv_freq.iter_mut().for_each(|f| *f *= freq_scale);
        r.ggml = Some(GgmlRope {
            theta_scale: base.powf(-2.0 / rot_dim as f32),
            freq_scale,
        });
        r
    }

    /// Fills `cs` with `(cos, sin)` of each pair's angle at `pos`.
    pub fn angles(&self, pos: usize, cs: &mut Vec<(f32, f32)>) {
        cs.clear();
        if let Some(g) = self.ggml {
            let mut theta = pos as f32;
            for _ in 0..self.inv_freq.len() {
                let t = g.freq_scale * theta;
                cs.push((t.cos(), t.sin()));
                theta *= g.theta_scale;
            }
            return;
        }
        cs.extend(self.inv_freq.iter().map(|&f| {
            let a = pos as f64 * f as f64;
            (a.cos() as f32, a.sin() as f32)
        }));
    }

    /// Rotates every head of `x` (heads of `head_dim`) by precomputed angles.
    pub fn apply(&self, x: &mut [f32], cs: &[(f32, f32)]) {
        let d = self.head_dim;
        let half = self.half;
        for head in x.chunks_exact_mut(d) {
            for (j, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if self.neox {
                    (j, j + half)
                } else {
                    (2 * j, 2 * j + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                if self.ggml.is_some() {
                    // As GCC contracts ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`.
                    head[a] = x0.mul_add(c, -(x1 * s));
                    head[b] = x0.mul_add(s, x1 * c);
                } else {
                    head[a] = x0 * c - x1 * s;
                    head[b] = x1 * c + x0 * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_and_softmax_basics() {
        let mut out = [0.0; 2];
        rms_norm(&[3.0, 4.0], Some(&[1.0, 0.0]), 0.0, true, &mut out);
        let s = (12.5f32).sqrt();
        assert!((out[0] - 2.0 * 3.0 / s).abs() < 1e-6 && (out[1] - 4.0 / s).abs() < 1e-6);
        let mut p = [1.0, 2.0, 3.0];
        softmax(&mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6 && p[2] > p[1]);
    }

    #[test]
    fn rope_neox_rotates_pairs_half_apart() {
        let r = Rope::new(10000.0, 4, 4, true);
        let mut cs = Vec::new();
        r.angles(1, &mut cs);
        let mut x = [1.0, 0.0, 0.0, 0.0];
        r.apply(&mut x, &cs);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
    }
}
