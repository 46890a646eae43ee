//! Element-wise f32 operations: RMS norm, softmax, activations, in-place arithmetic, RoPE.
//!
//! Public functions pick an AVX2 path at runtime where it matters; the scalar versions in
//! [`reference`] define the semantics and are what the tests compare against.

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
use crate::dot::has_avx2;

/// How the RMS-norm weight is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormStyle {
    /// `x / rms * w` (Llama, Qwen).
    Mul,
    /// `x / rms * (1 + w)` (Gemma).
    OnePlus,
}

/// Pairing of rotated dimensions in RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Interleaved pairs `(2i, 2i+1)` (GGML "norm", Llama).
    Normal,
    /// Split halves `(i, i + rotary_dim/2)` (GGML "neox", Qwen2, Gemma).
    Neox,
}

/// Scalar reference implementations.
pub mod reference {
    use super::NormStyle;

    /// `1 / sqrt(mean(x^2) + eps)`.
    pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
        let ss: f32 = x.iter().map(|v| v * v).sum();
        1.0 / (ss / x.len() as f32 + eps).sqrt()
    }

    /// RMS norm of `x` into `out`.
    pub fn rms_norm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32, style: NormStyle) {
        let s = rms_scale(x, eps);
        let off = if style == NormStyle::OnePlus { 1.0 } else { 0.0 };
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
            *o = v * s * (g + off);
        }
    }

    /// Numerically stable softmax in place.
    pub fn softmax(x: &mut [f32]) {
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0.0;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        x.iter_mut().for_each(|v| *v *= inv);
    }

    /// SiLU: `x * sigmoid(x)`.
    pub fn silu(x: f32) -> f32 {
        x / (1.0 + (-x).exp())
    }

    /// GELU, tanh approximation: `0.5 x (1 + tanh(u))`, computed as the equivalent
    /// `x / (1 + e^(-2u))` which does not cancel for negative x.
    pub fn gelu_tanh(x: f32) -> f32 {
        const C: f32 = 0.797_884_6; // sqrt(2/pi)
        let u = C * (x + 0.044715 * x * x * x);
        x / (1.0 + (-2.0 * u).exp())
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::dot::avx2::hsum_ps;
    use std::arch::x86_64::*;

    /// e^x for eight lanes (Cephes-style polynomial, ~1 ulp; < -87.3 gives 0).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_ps(x: __m256) -> __m256 {
        let under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.336_55), _CMP_LT_OQ);
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.376_26));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
        let fx = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
        // 2^fx; fx in [-126, 128] after clamping. Build it as two halves so fx = 128 works.
        let fi = _mm256_cvtps_epi32(fx);
        let half = _mm256_srai_epi32(fi, 1);
        let p1 = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(half, _mm256_set1_epi32(127)),
            23,
        ));
        let p2 = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(_mm256_sub_epi32(fi, half), _mm256_set1_epi32(127)),
            23,
        ));
        let y = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
        _mm256_andnot_ps(under, y)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn sum_squares(x: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut c = x.chunks_exact(8);
        for ch in &mut c {
            // SAFETY: ch has exactly 8 f32; unaligned load.
            let v = unsafe { _mm256_loadu_ps(ch.as_ptr()) };
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        hsum_ps(acc) + c.remainder().iter().map(|v| v * v).sum::<f32>()
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn scale_mul(out: &mut [f32], x: &[f32], w: &[f32], s: f32, off: f32) {
        let n = out.len();
        assert!(x.len() >= n && w.len() >= n);
        let (vs, voff) = (_mm256_set1_ps(s), _mm256_set1_ps(off));
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n <= every slice length; unaligned loads/stores.
            unsafe {
                let g = _mm256_add_ps(_mm256_loadu_ps(w.as_ptr().add(i)), voff);
                let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vs);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(v, g));
            }
            i += 8;
        }
        for j in i..n {
            out[j] = x[j] * s * (w[j] + off);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax(x: &mut [f32]) {
        let n = x.len();
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            vmax = _mm256_max_ps(vmax, unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) });
            i += 8;
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: lanes holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vmax) };
        let max = x[i..]
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let vm = _mm256_set1_ps(max);
        let mut vsum = _mm256_setzero_ps();
        i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(p), vm));
                _mm256_storeu_ps(p, e);
                vsum = _mm256_add_ps(vsum, e);
            }
            i += 8;
        }
        let mut sum = hsum_ps(vsum);
        for v in &mut x[i..] {
            *v = (*v - max).exp();
            sum += *v;
        }
        scale(x, 1.0 / sum);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn scale(x: &mut [f32], s: f32) {
        let vs = _mm256_set1_ps(s);
        let mut c = x.chunks_exact_mut(8);
        for ch in &mut c {
            // SAFETY: ch has exactly 8 f32.
            unsafe { _mm256_storeu_ps(ch.as_mut_ptr(), _mm256_mul_ps(_mm256_loadu_ps(ch.as_ptr()), vs)) };
        }
        c.into_remainder().iter_mut().for_each(|v| *v *= s);
    }

    /// `y += a * x`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len();
        assert!(x.len() >= n);
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe {
                let p = y.as_mut_ptr().add(i);
                _mm256_storeu_ps(
                    p,
                    _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)),
                );
            }
            i += 8;
        }
        for j in i..n {
            y[j] += a * x[j];
        }
    }

    /// `a = act(a) * b` (or `a = act(a)` when `b` is None), act = silu or gelu_tanh.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gated(a: &mut [f32], b: Option<&[f32]>, gelu: bool) {
        let n = a.len();
        if let Some(b) = b {
            assert!(b.len() >= n);
        }
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n <= both lengths.
            unsafe {
                let p = a.as_mut_ptr().add(i);
                let x = _mm256_loadu_ps(p);
                // silu(x) = x / (1 + e^-x); gelu_tanh(x) = x / (1 + e^(-2u)).
                let z = if gelu {
                    let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                    let u = _mm256_fmadd_ps(_mm256_set1_ps(0.044715), x3, x);
                    _mm256_mul_ps(u, _mm256_set1_ps(-2.0 * 0.797_884_6))
                } else {
                    _mm256_sub_ps(_mm256_setzero_ps(), x)
                };
                let mut r = _mm256_div_ps(x, _mm256_add_ps(one, exp_ps(z)));
                if let Some(b) = b {
                    r = _mm256_mul_ps(r, _mm256_loadu_ps(b.as_ptr().add(i)));
                }
                _mm256_storeu_ps(p, r);
            }
            i += 8;
        }
        for j in i..n {
            let v = if gelu {
                super::reference::gelu_tanh(a[j])
            } else {
                super::reference::silu(a[j])
            };
            a[j] = v * b.map_or(1.0, |b| b[j]);
        }
    }

    /// Eight lanes of `exp` for tests.
    #[cfg(test)]
    pub(super) fn exp8(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        // SAFETY: only called by tests after has_avx2(); arrays hold 8 f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp_ps(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }
}

macro_rules! simd_or {
    ($simd:expr, $scalar:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                // SAFETY: AVX2+FMA presence was checked by has_avx2().
                #[allow(unused_unsafe)]
                return unsafe { $simd };
            }
        }
        $scalar
    }};
}

/// Sum of squares of `x`.
pub fn sum_squares(x: &[f32]) -> f32 {
    simd_or!(avx2::sum_squares(x), x.iter().map(|v| v * v).sum())
}

/// RMS norm `out = x / sqrt(mean(x^2) + eps) * w` (or `* (1 + w)`).
pub fn rms_norm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32, style: NormStyle) {
    assert!(x.len() == out.len() && w.len() >= x.len());
    let s = 1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt();
    let off = if style == NormStyle::OnePlus { 1.0 } else { 0.0 };
    simd_or!(avx2::scale_mul(out, x, w, s, off), {
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
            *o = v * s * (g + off);
        }
    })
}

/// RMS norm in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32, style: NormStyle) {
    assert!(w.len() >= x.len());
    let s = 1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt();
    let off = if style == NormStyle::OnePlus { 1.0 } else { 0.0 };
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= s * (g + off);
    }
}

/// Numerically stable softmax in place (entries of `-inf` become 0).
pub fn softmax_in_place(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    simd_or!(avx2::softmax(x), reference::softmax(x))
}

/// Multiplies every element by `s`.
pub fn scale_in_place(x: &mut [f32], s: f32) {
    simd_or!(avx2::scale(x, s), x.iter_mut().for_each(|v| *v *= s))
}

/// `y += a * x` (lengths must match).
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    simd_or!(avx2::axpy(y, a, x), {
        for (v, &u) in y.iter_mut().zip(x) {
            *v += a * u;
        }
    })
}

/// SiLU in place.
pub fn silu_in_place(x: &mut [f32]) {
    simd_or!(
        avx2::gated(x, None, false),
        x.iter_mut().for_each(|v| *v = reference::silu(*v))
    )
}

/// GELU (tanh approximation) in place.
pub fn gelu_tanh_in_place(x: &mut [f32]) {
    simd_or!(
        avx2::gated(x, None, true),
        x.iter_mut().for_each(|v| *v = reference::gelu_tanh(*v))
    )
}

/// SwiGLU: `a = silu(a) * b`.
pub fn swiglu(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    simd_or!(avx2::gated(a, Some(b), false), {
        for (v, &g) in a.iter_mut().zip(b) {
            *v = reference::silu(*v) * g;
        }
    })
}

/// GeGLU with tanh GELU: `a = gelu_tanh(a) * b` (Gemma).
pub fn geglu_tanh(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    simd_or!(avx2::gated(a, Some(b), true), {
        for (v, &g) in a.iter_mut().zip(b) {
            *v = reference::gelu_tanh(*v) * g;
        }
    })
}

/// `a += b` element-wise.
pub fn add_in_place(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

/// `a *= b` element-wise.
pub fn mul_in_place(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    a.iter_mut().zip(b).for_each(|(x, y)| *x *= y);
}

/// Precomputed RoPE inverse frequencies, so decode never allocates.
#[derive(Clone, Debug)]
pub struct RopeCache {
    inv_freq: Vec<f32>,
    head_dim: usize,
    rotary_dim: usize,
    layout: RopeLayout,
    freq_scale: f32,
}

impl RopeCache {
    /// Frequencies `freq_scale * theta_base^(-2i/rotary_dim)` for `i < rotary_dim/2`.
    pub fn new(
        head_dim: usize,
        rotary_dim: usize,
        theta_base: f32,
        freq_scale: f32,
        layout: RopeLayout,
    ) -> RopeCache {
        assert!(
            rotary_dim <= head_dim && rotary_dim.is_multiple_of(2),
            "bad rotary_dim"
        );
        let inv_freq = (0..rotary_dim / 2)
            .map(|i| freq_scale * theta_base.powf(-2.0 * i as f32 / rotary_dim as f32))
            .collect();
        RopeCache {
            inv_freq,
            head_dim,
            rotary_dim,
            layout,
            freq_scale,
        }
    }

    /// The frequency scale this cache was built with.
    pub fn freq_scale(&self) -> f32 {
        self.freq_scale
    }

    /// Rotates `n_heads` heads of `x` (`[n_heads][head_dim]`) for position `pos`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, pos: usize) {
        let hd = self.head_dim;
        assert!(x.len() >= n_heads * hd);
        let half = self.rotary_dim / 2;
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f32 * f).sin_cos();
            let (a, b) = match self.layout {
                RopeLayout::Normal => (2 * i, 2 * i + 1),
                RopeLayout::Neox => (i, i + half),
            };
            for h in 0..n_heads {
                let base = h * hd;
                let (x0, x1) = (x[base + a], x[base + b]);
                x[base + a] = x0 * c - x1 * s;
                x[base + b] = x0 * s + x1 * c;
            }
        }
    }
}

/// Applies RoPE to `[n_heads][head_dim]` at `pos` without a cache (recomputes frequencies).
#[allow(clippy::too_many_arguments)]
pub fn rope_in_place(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    theta_base: f32,
    rotary_dim: usize,
    layout: RopeLayout,
    freq_scale: f32,
) {
    assert!(rotary_dim <= head_dim && rotary_dim.is_multiple_of(2) && x.len() >= n_heads * head_dim);
    let half = rotary_dim / 2;
    for i in 0..half {
        let f = freq_scale * theta_base.powf(-2.0 * i as f32 / rotary_dim as f32);
        let (s, c) = (pos as f32 * f).sin_cos();
        let (a, b) = match layout {
            RopeLayout::Normal => (2 * i, 2 * i + 1),
            RopeLayout::Neox => (i, i + half),
        };
        for h in 0..n_heads {
            let base = h * head_dim;
            let (x0, x1) = (x[base + a], x[base + b]);
            x[base + a] = x0 * c - x1 * s;
            x[base + b] = x0 * s + x1 * c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    fn close(a: &[f32], b: &[f32], rel: f32) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= rel * (x.abs().max(y.abs()) + 1e-6),
                "[{i}] {x} vs {y}"
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_accuracy() {
        if !has_avx2() {
            return;
        }
        let mut rng = XorShift::new(5);
        for _ in 0..2000 {
            let x: [f32; 8] = std::array::from_fn(|_| rng.range(-87.0, 88.0));
            let y = avx2::exp8(x);
            for k in 0..8 {
                let e = x[k].exp();
                assert!((y[k] - e).abs() <= 3e-7 * e, "exp({}) = {} vs {e}", x[k], y[k]);
            }
        }
        let y = avx2::exp8([f32::NEG_INFINITY, -100.0, 0.0, 1.0, -1.0, 88.7, -87.0, 10.0]);
        assert_eq!(y[0], 0.0);
        assert_eq!(y[1], 0.0);
        assert_eq!(y[2], 1.0);
        assert!(y[5].is_finite() && y[5] > 2e38);
    }

    #[test]
    fn norms_and_activations_match_reference() {
        let mut rng = XorShift::new(6);
        for n in [1usize, 7, 64, 333, 896] {
            let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 6.0).collect();
            let w = rng.vec(n);
            for style in [NormStyle::Mul, NormStyle::OnePlus] {
                let mut a = vec![0.0; n];
                let mut b = vec![0.0; n];
                rms_norm(&mut a, &x, &w, 1e-6, style);
                reference::rms_norm(&mut b, &x, &w, 1e-6, style);
                close(&a, &b, 1e-5);
                let mut c = x.clone();
                rms_norm_in_place(&mut c, &w, 1e-6, style);
                close(&c, &b, 1e-5);
            }
            let mut s = x.clone();
            softmax_in_place(&mut s);
            let mut r = x.clone();
            reference::softmax(&mut r);
            close(&s, &r, 1e-5);
            let g = rng.vec(n);
            let mut a = x.clone();
            swiglu(&mut a, &g);
            let e: Vec<f32> = x.iter().zip(&g).map(|(v, g)| reference::silu(*v) * g).collect();
            close(&a, &e, 1e-5);
            let mut a = x.clone();
            geglu_tanh(&mut a, &g);
            let e: Vec<f32> = x
                .iter()
                .zip(&g)
                .map(|(v, g)| reference::gelu_tanh(*v) * g)
                .collect();
            close(&a, &e, 2e-5);
            let mut a = x.clone();
            silu_in_place(&mut a);
            gelu_tanh_in_place(&mut s);
            let mut y = x.clone();
            axpy(&mut y, 0.5, &g);
            let e: Vec<f32> = x.iter().zip(&g).map(|(v, g)| v + 0.5 * g).collect();
            close(&y, &e, 1e-6);
        }
        let mut m = vec![1.0, f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY];
        softmax_in_place(&mut m);
        assert_eq!(m[1], 0.0);
        assert!((m[0] + m[2] - 1.0).abs() < 1e-6);
        assert!((reference::gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        let t = |x: f32| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh());
        for x in [-3.0f32, -0.5, 0.0, 0.7, 2.0] {
            assert!((reference::gelu_tanh(x) - t(x)).abs() < 1e-6, "gelu({x})");
        }
    }

    #[test]
    fn rope_layouts() {
        let mut rng = XorShift::new(7);
        let (nh, hd) = (3, 16);
        let x = rng.vec(nh * hd);
        for layout in [RopeLayout::Normal, RopeLayout::Neox] {
            for rot in [16usize, 8] {
                let cache = RopeCache::new(hd, rot, 10000.0, 1.0, layout);
                let mut a = x.clone();
                cache.apply(&mut a, nh, 5);
                let mut b = x.clone();
                rope_in_place(&mut b, nh, hd, 5, 10000.0, rot, layout, 1.0);
                assert_eq!(a, b);
                // Norm of each rotated pair is preserved; untouched dims pass through.
                for h in 0..nh {
                    for i in 0..rot / 2 {
                        let (p, q) = match layout {
                            RopeLayout::Normal => (2 * i, 2 * i + 1),
                            RopeLayout::Neox => (i, i + rot / 2),
                        };
                        let n0 = x[h * hd + p].hypot(x[h * hd + q]);
                        let n1 = a[h * hd + p].hypot(a[h * hd + q]);
                        assert!((n0 - n1).abs() < 1e-5);
                    }
                    assert_eq!(a[h * hd + rot..h * hd + hd], x[h * hd + rot..h * hd + hd]);
                }
                // Pair 0 rotates by exactly pos radians.
                let (s, c) = 5f32.sin_cos();
                let q = if layout == RopeLayout::Normal { 1 } else { rot / 2 };
                assert!((a[0] - (x[0] * c - x[q] * s)).abs() < 1e-6);
            }
        }
        // Position 0 is the identity.
        let cache = RopeCache::new(hd, hd, 10000.0, 1.0, RopeLayout::Neox);
        let mut a = x.clone();
        cache.apply(&mut a, nh, 0);
        assert_eq!(a, x);
    }
}
