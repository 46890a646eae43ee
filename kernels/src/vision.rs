//! Primitives of vision encoders (SigLIP / SigLIP2 towers and their projectors): LayerNorm with a
//! bias, the exact (erf) GELU, bidirectional attention over patches with a key mask, and the
//! weights of antialiased bilinear resampling (PyTorch's `F.interpolate(mode="bilinear",
//! align_corners=False, antialias=True)`) used to fit a learned position table to an image's grid.
//!
//! All of them are plain scalar code: vision encoders run once per image, off the decode path.

use crate::dot::dot_f32;
use crate::ops::{axpy, softmax};

/// LayerNorm of `x` into `out`: `(x − mean) / sqrt(var + eps) · w + b` (biased variance, both
/// moments summed in f64).
pub fn layer_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let n = x.len();
    assert!(w.len() == n && out.len() == n, "layer_norm: length mismatch");
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for (i, o) in out.iter_mut().enumerate() {
        let y = ((x[i] as f64 - mean) * inv) as f32 * w[i];
        *o = match b {
            Some(b) => y + b[i],
            None => y,
        };
    }
}

/// The error function in f64: its Maclaurin series below 3, the continued fraction of `erfc`
/// above (absolute error below 1e-13).
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        // erf(a) = 2/√π Σ (−1)^n a^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, a2) = (a, a, a * a);
        for n in 1..200 {
            term *= -a2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = e^(−a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …)))), evaluated backwards.
        let mut k = a;
        for j in (1..=80).rev() {
            k = a + (j as f64 / 2.0) / k;
        }
        1.0 - (-a * a).exp() * std::f64::consts::FRAC_2_SQRT_PI / 2.0 / k
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// GELU, exact form (`gelu`): `x/2 · (1 + erf(x/√2))`.
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// Bidirectional multi-head attention of a block of query rows against all `n_k` key rows.
///
/// `q` and `out` hold whole query rows of `heads · head_dim` values; `k` and `v` hold `n_k` rows
/// of the same width (one KV head per query head). Keys whose `key_mask` entry is false are left
/// out of every softmax (padding patches). Per head: `softmax(q·k · scale) · v`, the dot products
/// by [`dot_f32`], the softmax by [`softmax`], the weighted sum by [`axpy`] in key order.
#[allow(clippy::too_many_arguments)]
pub fn bidirectional_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_k: usize,
    heads: usize,
    head_dim: usize,
    key_mask: Option<&[bool]>,
    scale: f32,
    out: &mut [f32],
) {
    let width = heads * head_dim;
    assert!(
        width > 0 && q.len().is_multiple_of(width),
        "attention: ragged query rows"
    );
    assert_eq!(q.len(), out.len(), "attention: output does not match the queries");
    assert!(
        k.len() >= n_k * width && v.len() >= n_k * width,
        "attention: KV rows missing"
    );
    let kept: Vec<usize> = match key_mask {
        Some(m) => {
            assert_eq!(m.len(), n_k, "attention: key mask length");
            (0..n_k).filter(|&t| m[t]).collect()
        }
        None => (0..n_k).collect(),
    };
    assert!(!kept.is_empty(), "attention: every key is masked");
    let mut scores = vec![0.0f32; kept.len()];
    for (qr, or) in q.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        for h in 0..heads {
            let off = h * head_dim;
            let qh = &qr[off..off + head_dim];
            for (s, &t) in scores.iter_mut().zip(&kept) {
                *s = dot_f32(qh, &k[t * width + off..t * width + off + head_dim]) * scale;
            }
            softmax(&mut scores);
            let oh = &mut or[off..off + head_dim];
            oh.fill(0.0);
            for (&p, &t) in scores.iter().zip(&kept) {
                axpy(oh, p, &v[t * width + off..t * width + off + head_dim]);
            }
        }
    }
}

/// Weights of antialiased bilinear resampling along one axis from `in_size` to `out_size` samples
/// (PyTorch's `antialias=True`, `align_corners=False`), row-major `[out_size][in_size]`, each row
/// summing to one. Output `i` is centred on input coordinate `(i + ½)·s − ½` with
/// `s = in_size / out_size`; the triangle filter is widened to `max(s, 1)` when shrinking. All in
/// f32, as transformers' SigLIP2 computes them.
pub fn antialias_bilinear_weights(in_size: usize, out_size: usize) -> Vec<f32> {
    assert!(in_size > 0 && out_size > 0, "resample: empty axis");
    let scale = in_size as f32 / out_size as f32;
    let support = scale.max(1.0);
    let mut w = vec![0.0f32; in_size * out_size];
    for (i, row) in w.chunks_exact_mut(in_size).enumerate() {
        let center = (i as f32 + 0.5) * scale - 0.5;
        for (j, x) in row.iter_mut().enumerate() {
            *x = (1.0 - (j as f32 - center).abs() / support).max(0.0);
        }
        let sum: f32 = row.iter().sum();
        row.iter_mut().for_each(|x| *x /= sum);
    }
    w
}

/// Resamples a `[in_h][in_w][dim]` grid of vectors to `[out_h][out_w][dim]` with
/// [`antialias_bilinear_weights`] along both axes: every output is the grid weighted by the
/// products of its row's and its column's weights (computed in f32, then summed in grid order).
pub fn resize_grid_antialias_bilinear(
    grid: &[f32],
    in_h: usize,
    in_w: usize,
    dim: usize,
    out_h: usize,
    out_w: usize,
) -> Vec<f32> {
    assert_eq!(grid.len(), in_h * in_w * dim, "resample: grid size");
    let wh = antialias_bilinear_weights(in_h, out_h);
    let ww = antialias_bilinear_weights(in_w, out_w);
    let mut out = vec![0.0f32; out_h * out_w * dim];
    for r in 0..out_h {
        for c in 0..out_w {
            let o = &mut out[(r * out_w + c) * dim..(r * out_w + c + 1) * dim];
            for i in 0..in_h {
                for j in 0..in_w {
                    let wt = wh[r * in_h + i] * ww[c * in_w + j];
                    if wt != 0.0 {
                        let src = &grid[(i * in_w + j) * dim..(i * in_w + j + 1) * dim];
                        o.iter_mut().zip(src).for_each(|(y, &x)| *y += wt * x);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    #[test]
    fn layer_norm_matches_its_definition() {
        let mut rng = XorShift::new(3);
        let x: Vec<f32> = rng.vec(37).iter().map(|v| v * 5.0 + 2.0).collect();
        let w = rng.vec(37);
        let b = rng.vec(37);
        let mut out = vec![0.0; 37];
        layer_norm(&x, &w, Some(&b), 1e-5, &mut out);
        let mean: f32 = x.iter().sum::<f32>() / 37.0;
        let var: f32 = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 37.0;
        for i in 0..37 {
            let want = (x[i] - mean) / (var + 1e-5).sqrt() * w[i] + b[i];
            assert!((out[i] - want).abs() < 1e-4, "{i}: {} vs {want}", out[i]);
        }
        // Without a bias the output is centred on zero when w is all ones.
        layer_norm(&x, &[1.0; 37], None, 1e-5, &mut out);
        assert!(out.iter().sum::<f32>().abs() < 1e-4);
        let sq: f32 = out.iter().map(|v| v * v).sum::<f32>() / 37.0;
        assert!((sq - 1.0).abs() < 1e-3);
    }

    #[test]
    fn erf_and_gelu_match_known_values() {
        // Reference values of erf from standard tables.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.9, 0.999_958_902_121_900_6),
            (3.0, 0.999_977_909_503_001_4),
            (4.5, 0.999_999_999_803_383),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {} vs {want}", erf(x));
        }
        assert_eq!(gelu_erf(0.0), 0.0);
        // gelu(1) = Φ(1) = 0.841344746...
        assert!((gelu_erf(1.0) - 0.841_344_8).abs() < 1e-7);
        assert!((gelu_erf(-1.0) + 0.158_655_25_f32).abs() < 1e-7);
        assert_eq!(gelu_erf(12.0), 12.0);
    }

    /// Attention by the textbook formula: masked scores at −∞ before an f32 softmax.
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n_k: usize,
        heads: usize,
        hd: usize,
        mask: &[bool],
    ) -> Vec<f32> {
        let width = heads * hd;
        let n_q = q.len() / width;
        let mut out = vec![0.0f32; q.len()];
        for i in 0..n_q {
            for h in 0..heads {
                let s: Vec<f32> = (0..n_k)
                    .map(|t| {
                        if !mask[t] {
                            return f32::NEG_INFINITY;
                        }
                        (0..hd)
                            .map(|d| q[i * width + h * hd + d] * k[t * width + h * hd + d])
                            .sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    out[i * width + h * hd + d] =
                        (0..n_k).map(|t| e[t] / z * v[t * width + h * hd + d]).sum();
                }
            }
        }
        out
    }

    #[test]
    fn bidirectional_attention_matches_the_naive_formula_and_skips_masked_keys() {
        let mut rng = XorShift::new(9);
        let (heads, hd, n) = (3, 8, 7);
        let q = rng.vec(n * heads * hd);
        let k = rng.vec(n * heads * hd);
        let mut v = rng.vec(n * heads * hd);
        let mask = [true, true, false, true, true, false, true];
        let mut out = vec![0.0; q.len()];
        let scale = 1.0 / (hd as f32).sqrt();
        bidirectional_attention(&q, &k, &v, n, heads, hd, Some(&mask), scale, &mut out);
        let want = naive(&q, &k, &v, n, heads, hd, &mask);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        // Masked keys' values do not matter.
        v[2 * heads * hd..3 * heads * hd].fill(1e6);
        let mut again = vec![0.0; q.len()];
        bidirectional_attention(&q, &k, &v, n, heads, hd, Some(&mask), scale, &mut again);
        assert_eq!(out, again);
        // No mask: every key counts; a block of query rows gives the same rows as the whole.
        let all = [true; 7];
        bidirectional_attention(&q, &k, &v, n, heads, hd, None, scale, &mut out);
        let want = naive(&q, &k, &v, n, heads, hd, &all);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
        let w = heads * hd;
        let mut part = vec![0.0; 2 * w];
        bidirectional_attention(&q[3 * w..5 * w], &k, &v, n, heads, hd, None, scale, &mut part);
        assert_eq!(part, out[3 * w..5 * w]);
    }

    #[test]
    fn antialias_weights_shrink_with_a_wider_triangle_and_grow_like_plain_bilinear() {
        // Same size: the identity.
        let w = antialias_bilinear_weights(3, 3);
        assert_eq!(w, vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        // 4 → 2: output 0 centred at 0.5 with support 2: triangle 3/4, 3/4, 1/4, 0 → 3/7, 3/7, 1/7.
        let w = antialias_bilinear_weights(4, 2);
        let want = [
            3.0 / 7.0,
            3.0 / 7.0,
            1.0 / 7.0,
            0.0,
            0.0,
            1.0 / 7.0,
            3.0 / 7.0,
            3.0 / 7.0,
        ];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "{a} vs {b}");
        }
        // 2 → 4: plain bilinear, edges clamped: 1 | 3/4 1/4 | 1/4 3/4 | 1.
        let w = antialias_bilinear_weights(2, 4);
        assert_eq!(w, vec![1.0, 0.0, 0.75, 0.25, 0.25, 0.75, 0.0, 1.0]);
    }

    #[test]
    fn grid_resize_is_separable_and_keeps_constants() {
        let mut rng = XorShift::new(5);
        let (h, w, d) = (4, 4, 3);
        let grid = rng.vec(h * w * d);
        // Same size: unchanged.
        assert_eq!(resize_grid_antialias_bilinear(&grid, h, w, d, h, w), grid);
        // A constant grid stays constant at any size.
        let ones = vec![2.5f32; h * w * d];
        for v in resize_grid_antialias_bilinear(&ones, h, w, d, 2, 6) {
            assert!((v - 2.5).abs() < 1e-6);
        }
        // Output (0, 1) of 4×4 → 2×6 is Σ wh[0][i] · ww[1][j] · grid[i][j].
        let out = resize_grid_antialias_bilinear(&grid, h, w, d, 2, 6);
        let wh = antialias_bilinear_weights(4, 2);
        let ww = antialias_bilinear_weights(4, 6);
        for c in 0..d {
            let mut want = 0.0f32;
            for i in 0..4 {
                for j in 0..4 {
                    want += wh[i] * ww[4 + j] * grid[(i * 4 + j) * d + c];
                }
            }
            assert!((out[d + c] - want).abs() < 1e-6);
        }
    }
}
