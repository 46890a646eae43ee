//! Simple, correct f32 element-wise operations: RMS norm, activations, softmax, RoPE, softcap.
//! (The kernels crate may provide SIMD versions later.)

/// RMS norm of `x` into `out`: `x / sqrt(mean(x²) + eps)`, times `w` (or `1 + w` when `add_one`).
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32, add_one: bool, out: &mut [f32]) {
    let n = x.len();
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / n as f32;
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

/// Softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
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
        }
    }

    /// Fills `cs` with `(cos, sin)` of each pair's angle at `pos`.
    pub fn angles(&self, pos: usize, cs: &mut Vec<(f32, f32)>) {
        cs.clear();
        cs.extend(self.inv_freq.iter().map(|&f| {
            let a = pos as f64 * f as f64;
            (a.cos() as f32, a.sin() as f32)
        }));
    }

    /// Rotates every head of `x` (heads of `head_dim`) by precomputed angles.
    pub fn apply(&self, x: &mut [f32], cs: &[(f32, f32)]) {
        let d = self.head_dim;
        let half = d / 2;
        for head in x.chunks_exact_mut(d) {
            for (j, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if self.neox {
                    (j, j + half)
                } else {
                    (2 * j, 2 * j + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x1 * c + x0 * s;
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
