//! Element-wise f32 operations of a forward pass: RMS norm, activations, softmax, RoPE,
//! soft-capping, f16 rounding, and the row arithmetic around them (`y += a·x`, `a += b`, `x *= s`).
//!
//! Each operation is defined by its scalar code: here, and for the row kernels in `scalar.rs`.
//! The row kernels also have an AVX2+FMA+F16C version (`avx2.rs`); a table of them is chosen once
//! at first use from an ordered candidate list (AVX2, then scalar; `BERTH_KERNELS` caps the level
//! for every table, see [`crate::kernel_level`]), see [`ops_impl_name`]. They come in two kinds:
//!
//! - exact: the SIMD version does the same IEEE operations per element as the scalar code, so its
//!   results are equal bit for bit and llama.cpp-parity paths may use it: [`rms_norm`],
//!   [`rms_norm_heads`], [`Rope::apply`], [`axpy`], [`add_in_place`], [`scale_in_place`],
//!   [`geglu_tanh_f16`], [`round_f16_in_place`];
//! - `_fast`: a polynomial `exp` instead of libm's, within a few ulp of the scalar functions but not
//!   equal to them: [`silu_fast`], [`swiglu_fast`], [`geglu_tanh_fast`], [`softmax_fast`]. No model
//!   path uses them yet; parity paths keep [`silu`], [`gelu_tanh`] and [`softmax`].
//!
//! What stays scalar, and why: [`rms_norm`] sums its squares one at a time in f64 like ggml's
//! `ggml_float` loop (any other order can change the last bit of the scale), and [`softmax`],
//! [`silu`], [`gelu_tanh`], [`sigmoid`] and [`softcap`] call libm's `exp` / `tanh`.

use crate::quant::{f16_to_f32, f32_to_f16};
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod scalar;

/// RMS norm of `x` into `out`: `x / sqrt(mean(x²) + eps)`, times `w` (or `1 + w` when `add_one`).
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32, add_one: bool, out: &mut [f32]) {
    // Squares summed in f64, like ggml (`ggml_float`), so both engines see the same scale.
    let n = x.len();
    let ss = (x.iter().map(|v| (v * v) as f64).sum::<f64>() / n as f64) as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    let off = if add_one { 1.0 } else { 0.0 };
    table().scale_mul(out, x, w, scale, off);
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

/// SiLU: `x · sigmoid(x)`, computed as `x / (1 + e^-x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Logistic sigmoid: `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
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

/// [`gelu_tanh_f16`] of every f16 bit pattern (65536 entries).
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

/// GEGLU through ggml's f16 GELU table: `a = gelu_tanh_f16(a) · b` (exact SIMD).
pub fn geglu_tanh_f16(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    table().geglu_f16(a, b)
}

/// Rounds to the nearest f16 and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// [`round_f16`] of every element in place (exact SIMD; NaNs stay NaN, payloads may differ).
pub fn round_f16_in_place(x: &mut [f32]) {
    table().round_f16(x)
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

/// Soft-capping: `cap · tanh(x / cap)` in place.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// `y += a · x`, one rounding per product and per sum (exact SIMD; lengths must match).
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    table().axpy(y, a, x)
}

/// `a += b` element-wise (exact SIMD; lengths must match).
pub fn add_in_place(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    table().add(a, b)
}

/// `x *= s` element-wise (exact SIMD).
pub fn scale_in_place(x: &mut [f32], s: f32) {
    table().scale(x, s)
}

/// `x / max(‖x‖₂, 1e-12)` in place (torch's `F.normalize`, sentence-transformers' Normalize);
/// the sum of squares is taken in f64, so a vector's length is exact to f32 rounding.
pub fn l2_normalize(x: &mut [f32]) {
    let norm = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
    scale_in_place(x, (1.0 / norm.max(1e-12)) as f32);
}

/// The mean of `rows` rows of `out.len()` floats stored back to back in `x`, summed in f64.
pub fn mean_rows(x: &[f32], rows: usize, out: &mut [f32]) {
    let width = out.len();
    assert_eq!(
        x.len(),
        rows * width,
        "mean_rows: x is not rows of the output's width"
    );
    let mut acc = vec![0f64; width];
    for row in x.chunks_exact(width.max(1)) {
        acc.iter_mut().zip(row).for_each(|(a, &v)| *a += f64::from(v));
    }
    let n = rows.max(1) as f64;
    out.iter_mut().zip(&acc).for_each(|(o, &a)| *o = (a / n) as f32);
}

/// SiLU in place with a polynomial `exp` (SIMD; close to [`silu`], not bit-equal).
pub fn silu_fast(x: &mut [f32]) {
    table().gated_fast(x, None, false)
}

/// SwiGLU `a = silu(a) · b` with a polynomial `exp` (SIMD; close to [`silu`], not bit-equal).
pub fn swiglu_fast(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    table().gated_fast(a, Some(b), false)
}

/// GeGLU `a = gelu_tanh(a) · b` with a polynomial `exp` (SIMD; close to [`gelu_tanh`], not
/// bit-equal).
pub fn geglu_tanh_fast(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    table().gated_fast(a, Some(b), true)
}

/// Softmax in place with a polynomial `exp` and an f32 sum (SIMD; close to [`softmax`], not
/// bit-equal; entries of `-inf` become 0).
pub fn softmax_fast(x: &mut [f32]) {
    if !x.is_empty() {
        table().softmax_fast(x)
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
    /// Multiplier of every cos and sin (YaRN's attention factor, see [`Yarn::attention_scale`];
    /// 1 otherwise).
    pub mscale: f32,
}

/// YaRN context extension (transformers' `rope_type: "yarn"`): the inverse frequencies blend
/// the original ones (`base^(-2j/dim)`, extrapolation) and those divided by `factor`
/// (interpolation) with a linear ramp over the pair index between the correction dimensions of
/// `beta_fast` and `beta_slow` rotations, and cos and sin are multiplied by an attention factor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Context extension factor.
    pub factor: f32,
    /// Context length the model was trained with before the extension.
    pub original_max_position: usize,
    /// Rotations below which dimensions are fully extrapolated (default 32).
    pub beta_fast: f32,
    /// Rotations above which dimensions are fully interpolated (default 1).
    pub beta_slow: f32,
    /// Round the correction range outwards to whole dimensions (transformers' default true;
    /// gpt-oss says false).
    pub truncate: bool,
    /// Explicit multiplier of cos and sin (`attention_factor`); `None`: derived from `factor`.
    pub attention_factor: Option<f32>,
    /// DeepSeek's `mscale` and `mscale_all_dim` (both non-zero: the attention factor is
    /// `m(factor, mscale) / m(factor, mscale_all_dim)`).
    pub mscale: Option<(f32, f32)>,
}

impl Yarn {
    /// YaRN with the usual betas (32, 1), rounding of the correction range, and the attention
    /// factor derived from `factor`.
    pub fn new(factor: f32, original_max_position: usize) -> Yarn {
        Yarn {
            factor,
            original_max_position,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: None,
            mscale: None,
        }
    }

    /// The multiplier of cos and sin: `attention_factor` when given, else
    /// `m(factor, mscale) / m(factor, mscale_all_dim)` when both are given, else
    /// `m(factor, 1)`, with `m(s, k) = 0.1·k·ln(s) + 1` (1 for `s ≤ 1`).
    pub fn attention_scale(&self) -> f32 {
        let m = |s: f64, k: f64| if s <= 1.0 { 1.0 } else { 0.1 * k * s.ln() + 1.0 };
        let f = self.factor as f64;
        if let Some(a) = self.attention_factor {
            return a;
        }
        match self.mscale {
            Some((a, b)) if a != 0.0 && b != 0.0 => (m(f, a as f64) / m(f, b as f64)) as f32,
            _ => m(f, 1.0) as f32,
        }
    }

    /// The inverse frequencies of the `rot_dim / 2` rotated pairs for RoPE base `base`.
    pub fn inv_freq(&self, base: f32, rot_dim: usize) -> Vec<f32> {
        let (b, dim) = (base as f64, rot_dim as f64);
        // The dimension whose wavelength fits `rotations` times into the original context.
        let corr = |rotations: f64| {
            dim * (self.original_max_position as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * b.ln())
        };
        let (mut low, mut high) = (corr(self.beta_fast as f64), corr(self.beta_slow as f64));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001;
        }
        let factor = self.factor as f64;
        (0..rot_dim / 2)
            .map(|j| {
                let extrapolated = 1.0 / b.powf(2.0 * j as f64 / dim);
                let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
                (extrapolated / factor * ramp + extrapolated * (1.0 - ramp)) as f32
            })
            .collect()
    }
}

/// The f32 quantities ggml-cpu computes RoPE angles from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GgmlRope {
    /// `powf(base, -2 / rot_dim)`.
    pub theta_scale: f32,
    /// Frequency scale (1 / linear scaling factor).
    pub freq_scale: f32,
}

/// Most rotated pairs [`Rope::apply`] stages on the stack for the SIMD path.
const MAX_PAIRS: usize = 512;

/// One [`Rope::apply`] call as the row kernels see it.
struct RopeRows<'a> {
    head_dim: usize,
    half: usize,
    neox: bool,
    /// ggml's contracted `x0·cos - x1·sin` / `x0·sin + x1·cos` (a fused multiply-add each).
    fused: bool,
    cos: &'a [f32],
    sin: &'a [f32],
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
            mscale: 1.0,
        }
    }

    /// YaRN-scaled RoPE ([`Yarn`]): its inverse frequencies, and cos and sin multiplied by its
    /// attention factor.
    pub fn new_yarn(base: f32, head_dim: usize, rot_dim: usize, neox: bool, yarn: &Yarn) -> Rope {
        Rope {
            inv_freq: yarn.inv_freq(base, rot_dim),
            mscale: yarn.attention_scale(),
            ..Rope::new(base, head_dim, rot_dim, neox)
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
        } else {
            cs.extend(self.inv_freq.iter().map(|&f| {
                let a = pos as f64 * f as f64;
                (a.cos() as f32, a.sin() as f32)
            }));
        }
        if self.mscale != 1.0 {
            let m = self.mscale;
            cs.iter_mut().for_each(|(c, s)| (*c, *s) = (*c * m, *s * m));
        }
    }

    /// Rotates every head of `x` (heads of `head_dim`) by precomputed angles (exact SIMD).
    pub fn apply(&self, x: &mut [f32], cs: &[(f32, f32)]) {
        let n = cs.len();
        let span = if self.neox { self.half + n } else { 2 * n };
        assert!(
            n == 0 || (span <= self.head_dim && (!self.neox || n <= self.half)),
            "RoPE pairs outside the head"
        );
        let (mut cos, mut sin) = ([0.0f32; MAX_PAIRS], [0.0f32; MAX_PAIRS]);
        let mut rows = RopeRows {
            head_dim: self.head_dim,
            half: self.half,
            neox: self.neox,
            fused: self.ggml.is_some(),
            cos: &[],
            sin: &[],
        };
        if n > MAX_PAIRS {
            return scalar::rope_pairs(x, &rows, cs);
        }
        for (j, &(c, s)) in cs.iter().enumerate() {
            cos[j] = c;
            sin[j] = s;
        }
        rows.cos = &cos[..n];
        rows.sin = &sin[..n];
        table().rope(x, &rows)
    }
}

/// `(out, x, w, s, off)`: `out = x · s · (w + off)` (or `x · s` without `w`).
type ScaleMulFn = unsafe fn(&mut [f32], &[f32], Option<&[f32]>, f32, f32);

/// One instruction set's row kernels (a file per set: `scalar.rs`, `avx2.rs`), chosen once
/// ([`table`]). Each entry is `unsafe` only because it may need its set's CPU features; every
/// kernel takes any lengths (it runs over the shortest), and the one way in is [`Table`]'s
/// method of the same name, which checks what a kernel relies on.
#[derive(Clone, Copy)]
struct Table {
    name: &'static str,
    /// [`ScaleMulFn`] over the shortest length.
    scale_mul: ScaleMulFn,
    axpy: unsafe fn(&mut [f32], f32, &[f32]),
    add: unsafe fn(&mut [f32], &[f32]),
    scale: unsafe fn(&mut [f32], f32),
    round_f16: unsafe fn(&mut [f32]),
    geglu_f16: unsafe fn(&mut [f32], &[f32]),
    /// Every head of the slice (`cos.len()` pairs each).
    rope: unsafe fn(&mut [f32], &RopeRows),
    /// `a = act(a) · b` (or `act(a)`), act = GELU-tanh when the flag is set, else SiLU.
    gated_fast: unsafe fn(&mut [f32], Option<&[f32]>, bool),
    softmax_fast: unsafe fn(&mut [f32]),
}

// The checked calls into a table. SAFETY for each: a table is only chosen ([`table`]) or
// listed (tests) after detecting its set's CPU features, and the kernels bound every access by
// their slices' lengths (RoPE's pair layout is checked in `rope`).
impl Table {
    fn scale_mul(&self, out: &mut [f32], x: &[f32], w: Option<&[f32]>, s: f32, off: f32) {
        // SAFETY: see above.
        unsafe { (self.scale_mul)(out, x, w, s, off) }
    }

    fn axpy(&self, y: &mut [f32], a: f32, x: &[f32]) {
        // SAFETY: see above.
        unsafe { (self.axpy)(y, a, x) }
    }

    fn add(&self, a: &mut [f32], b: &[f32]) {
        // SAFETY: see above.
        unsafe { (self.add)(a, b) }
    }

    fn scale(&self, x: &mut [f32], s: f32) {
        // SAFETY: see above.
        unsafe { (self.scale)(x, s) }
    }

    fn round_f16(&self, x: &mut [f32]) {
        // SAFETY: see above.
        unsafe { (self.round_f16)(x) }
    }

    fn geglu_f16(&self, a: &mut [f32], b: &[f32]) {
        // SAFETY: see above.
        unsafe { (self.geglu_f16)(a, b) }
    }

    fn rope(&self, x: &mut [f32], r: &RopeRows) {
        let n = r.cos.len().min(r.sin.len());
        let span = if r.neox { r.half + n } else { 2 * n };
        assert!(
            n == 0 || (span <= r.head_dim && (!r.neox || n <= r.half)),
            "RoPE pairs outside the head"
        );
        // SAFETY: see above; the pairs lie inside each head (checked above).
        unsafe { (self.rope)(x, r) }
    }

    fn gated_fast(&self, a: &mut [f32], b: Option<&[f32]>, gelu: bool) {
        // SAFETY: see above.
        unsafe { (self.gated_fast)(a, b, gelu) }
    }

    fn softmax_fast(&self, x: &mut [f32]) {
        // SAFETY: see above.
        unsafe { (self.softmax_fast)(x) }
    }
}

/// What these kernels are called in warnings.
const NAME: &str = "row-op";

/// The fastest kernels for this CPU, detected once (at most the level `BERTH_KERNELS` names).
fn table() -> &'static Table {
    static BEST: OnceLock<&'static Table> = OnceLock::new();
    BEST.get_or_init(|| {
        use crate::KernelLevel;
        let candidates = [
            #[cfg(target_arch = "x86_64")]
            (KernelLevel::Avx2, KernelLevel::Avx2.supported(), &avx2::TABLE),
            (KernelLevel::Scalar, true, &scalar::TABLE),
        ];
        crate::select_table(NAME, &candidates)
    })
}

/// Name of the selected row kernels ("scalar", "avx2").
pub fn ops_impl_name() -> &'static str {
    table().name
}

#[cfg(test)]
mod tests {

    #[test]
    fn l2_normalize_gives_unit_length_and_leaves_zero_vectors_zero() {
        let mut x = [3.0f32, 4.0];
        l2_normalize(&mut x);
        assert_eq!(x, [0.6, 0.8]);
        let mut z = [0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }

    #[test]
    fn mean_rows_averages_each_column() {
        let mut out = [0.0f32; 2];
        mean_rows(&[1.0, 2.0, 3.0, 6.0, 5.0, 10.0], 3, &mut out);
        assert_eq!(out, [3.0, 6.0]);
    }

    use super::*;
    use crate::testutil::XorShift;

    /// Every table this CPU can run, scalar first (ignores `BERTH_FORCE_SCALAR`).
    fn tables() -> Vec<Table> {
        #[allow(unused_mut)]
        let mut v = vec![scalar::TABLE];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(avx2::TABLE);
        }
        v
    }

    /// Bit-for-bit equality (NaN equals NaN).
    fn same(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{what} [{i}] {x} vs {y}"
            );
        }
    }

    fn close(a: &[f32], b: &[f32], rel: f32, what: &str) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            // The absolute floor: the scalar GELU's `1 + tanh` cancels to 0 for very negative x.
            assert!(
                (x - y).abs() <= rel * x.abs().max(y.abs()) + 1e-7,
                "{what} [{i}] {x} vs {y}"
            );
        }
    }

    const LENS: [usize; 10] = [0, 1, 7, 8, 9, 31, 33, 64, 333, 896];

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
    fn rms_norm_sums_squares_in_f64() {
        // 2^24 + 1 + 1 + ... is not representable in f32 running sums; f64 keeps every 1.
        let mut x = vec![4096.0f32];
        x.extend(std::iter::repeat_n(1.0f32, 7));
        let mut out = vec![0.0; 8];
        rms_norm(&x, None, 0.0, false, &mut out);
        let want = 1.0 / (((4096.0f64 * 4096.0 + 7.0) / 8.0) as f32).sqrt();
        assert_eq!(out[1], want);
    }

    #[test]
    fn exact_row_kernels_equal_scalar() {
        let mut rng = XorShift::new(6);
        for tb in tables() {
            for n in LENS {
                let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 12.0).collect();
                let w = rng.vec(n);
                for (wo, off) in [(Some(&w[..]), 0.0), (Some(&w[..]), 1.0), (None, 0.0)] {
                    let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
                    tb.scale_mul(&mut a, &x, wo, 0.37, off);
                    scalar::TABLE.scale_mul(&mut b, &x, wo, 0.37, off);
                    same(&a, &b, &format!("{} scale_mul", tb.name));
                }
                let check = |f: &dyn Fn(&Table, &mut Vec<f32>), what: &str| {
                    let (mut a, mut b) = (x.clone(), x.clone());
                    f(&tb, &mut a);
                    f(&scalar::TABLE, &mut b);
                    same(&a, &b, &format!("{} {what} n={n}", tb.name));
                };
                check(&|t, v| t.axpy(v, -0.3, &w), "axpy");
                check(&|t, v| t.add(v, &w), "add");
                check(&|t, v| t.scale(v, 1.7), "scale");
                check(&|t, v| t.round_f16(v), "round_f16");
                check(&|t, v| t.geglu_f16(v, &w), "geglu_f16");
            }
            // Edge values of the f16 paths: the table's cut-offs, f16 ties, overflow, subnormals.
            let mut edge = vec![
                -10.0f32,
                10.0,
                -9.999,
                9.999,
                -10.001,
                10.001,
                0.0,
                -0.0,
                65504.0,
                65519.0,
                65520.0,
                1e-8,
                -3e-8,
                6e-8,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                1.0 + 1.0 / 2048.0,
            ];
            for k in 0..4000u32 {
                let h = f16_to_f32((k * 16) as u16);
                edge.extend([
                    h,
                    f32::from_bits(h.to_bits() + 1),
                    f32::from_bits(h.to_bits() + 0x1000),
                ]);
            }
            let g = vec![1.25f32; edge.len()];
            let (mut a, mut b) = (edge.clone(), edge.clone());
            tb.round_f16(&mut a);
            scalar::TABLE.round_f16(&mut b);
            same(&a, &b, &format!("{} round_f16 edges", tb.name));
            let (mut a, mut b) = (edge.clone(), edge.clone());
            tb.geglu_f16(&mut a, &g);
            scalar::TABLE.geglu_f16(&mut b, &g);
            same(&a, &b, &format!("{} geglu_f16 edges", tb.name));
        }
        // Through the public functions too.
        let x: Vec<f32> = rng.vec(100).iter().map(|v| v * 4.0).collect();
        let w = rng.vec(100);
        let mut a = vec![0.0; 100];
        rms_norm(&x, Some(&w), 1e-6, true, &mut a);
        let ss = (x.iter().map(|v| (v * v) as f64).sum::<f64>() / 100.0) as f32;
        let s = 1.0 / (ss + 1e-6).sqrt();
        let b: Vec<f32> = x.iter().zip(&w).map(|(v, g)| v * s * (g + 1.0)).collect();
        same(&a, &b, "rms_norm");
        let mut h = x.clone();
        rms_norm_heads(&mut h, &w[..25], 1e-6, false);
        for (hh, xx) in h.chunks(25).zip(x.chunks(25)) {
            let mut o = vec![0.0; 25];
            rms_norm(xx, Some(&w[..25]), 1e-6, false, &mut o);
            same(hh, &o, "rms_norm_heads");
        }
        let mut a = x.clone();
        geglu_tanh_f16(&mut a, &w);
        let b: Vec<f32> = x.iter().zip(&w).map(|(v, g)| gelu_tanh_f16(*v) * g).collect();
        same(&a, &b, "geglu_tanh_f16");
    }

    #[test]
    fn fast_row_kernels_match_scalar() {
        let mut rng = XorShift::new(7);
        for tb in tables() {
            for n in LENS {
                let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 6.0).collect();
                let g = rng.vec(n);
                for gelu in [false, true] {
                    for b in [None, Some(&g[..])] {
                        let mut a = x.clone();
                        tb.gated_fast(&mut a, b, gelu);
                        let act = if gelu { gelu_tanh } else { silu };
                        let e: Vec<f32> = (0..n).map(|i| act(x[i]) * b.map_or(1.0, |b| b[i])).collect();
                        close(&a, &e, 2e-5, &format!("{} gated gelu={gelu}", tb.name));
                    }
                }
                if n > 0 {
                    let mut s = x.clone();
                    tb.softmax_fast(&mut s);
                    let mut r = x.clone();
                    softmax(&mut r);
                    close(&s, &r, 1e-5, &format!("{} softmax_fast", tb.name));
                }
            }
            let mut m = vec![
                1.0,
                f32::NEG_INFINITY,
                3.0,
                f32::NEG_INFINITY,
                0.5,
                0.0,
                -1.0,
                2.0,
                9.0,
            ];
            tb.softmax_fast(&mut m);
            assert_eq!(m[1], 0.0);
            assert!((m.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        let mut a = vec![0.5f32; 11];
        silu_fast(&mut a);
        assert!((a[10] - silu(0.5)).abs() < 1e-6);
        let mut a = vec![0.5f32; 11];
        swiglu_fast(&mut a, &[2.0; 11]);
        assert!((a[3] - 2.0 * silu(0.5)).abs() < 1e-6);
        let mut a = vec![0.5f32; 11];
        geglu_tanh_fast(&mut a, &[2.0; 11]);
        assert!((a[9] - 2.0 * gelu_tanh(0.5)).abs() < 1e-6);
        let mut a = vec![1.0f32, 2.0];
        softmax_fast(&mut a);
        softmax_fast(&mut []);
        assert!((a[0] + a[1] - 1.0).abs() < 1e-6);
        assert!(["scalar", "avx2"].contains(&ops_impl_name()));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_accuracy() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            berth_formats::test_skip::skip_optional("this CPU lacks AVX2+FMA (avx2::exp8 not run)");
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
        assert_eq!(y[..3], [0.0, 0.0, 1.0]);
        assert!(y[5].is_finite() && y[5] > 2e38);
    }

    #[test]
    fn gelu_and_silu_values() {
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
        for x in [-3.0f32, -0.5, 0.0, 0.7, 2.0] {
            assert!(
                (gelu_tanh_f16(x) - gelu_tanh(x)).abs() < 2e-3 * (1.0 + x.abs()),
                "gelu({x})"
            );
        }
        assert_eq!(gelu_tanh_f16(-10.5), 0.0);
        assert_eq!(gelu_tanh_f16(12.0), 12.0);
        let mut c = [100.0f32, -100.0, 0.5];
        softcap(&mut c, 30.0);
        assert!(c[0] < 30.0 && c[1] > -30.0 && (c[2] - 0.5).abs() < 1e-4);
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

    #[test]
    fn rope_simd_equals_scalar() {
        let mut rng = XorShift::new(8);
        let ropes = [
            Rope::new(10000.0, 128, 128, true),
            Rope::new(10000.0, 128, 128, false),
            Rope::new(1e6, 64, 40, false),
            Rope::new(1e6, 80, 80, true),
            Rope::new_partial(1e7, 256, 64),
            Rope::new_partial(1e7, 24, 6),
            Rope::new_ggml(10000.0, 256, 256, true, 1.0),
            Rope::new_ggml(10000.0, 128, 128, false, 0.25),
            Rope::new_ggml(1e6, 72, 36, false, 1.0),
            Rope::new_ggml(1e6, 512, 128, true, 1.0),
        ];
        for r in &ropes {
            let mut cs = Vec::new();
            r.angles(12345, &mut cs);
            let (cos, sin): (Vec<f32>, Vec<f32>) = cs.iter().copied().unzip();
            let rows = RopeRows {
                head_dim: r.head_dim,
                half: r.half,
                neox: r.neox,
                fused: r.ggml.is_some(),
                cos: &cos,
                sin: &sin,
            };
            let x: Vec<f32> = rng.vec(3 * r.head_dim).iter().map(|v| v * 5.0).collect();
            let mut want = x.clone();
            for head in want.chunks_exact_mut(r.head_dim) {
                for (j, &(c, s)) in cs.iter().enumerate() {
                    scalar::rotate(head, &rows, j, c, s);
                }
            }
            for tb in tables() {
                let mut a = x.clone();
                tb.rope(&mut a, &rows);
                same(
                    &a,
                    &want,
                    &format!("{} rope neox={} ggml={}", tb.name, r.neox, r.ggml.is_some()),
                );
            }
            let mut a = x.clone();
            r.apply(&mut a, &cs);
            same(&a, &want, "Rope::apply");
            // Norm of each rotated pair is preserved; untouched dimensions pass through.
            let rot = if r.neox { 2 * r.half } else { 2 * cs.len() };
            if !r.neox || r.half == cs.len() {
                for (h, xh) in a.chunks(r.head_dim).zip(x.chunks(r.head_dim)) {
                    assert_eq!(h[rot..], xh[rot..]);
                }
            }
        }
        // Position 0 is the identity.
        let r = Rope::new(10000.0, 16, 16, true);
        let mut cs = Vec::new();
        r.angles(0, &mut cs);
        let x = rng.vec(48);
        let mut a = x.clone();
        r.apply(&mut a, &cs);
        assert_eq!(a, x);
    }

    #[test]
    fn ggml_rope_angles_are_a_running_f32_product() {
        let r = Rope::new_ggml(10000.0, 8, 8, true, 0.5);
        let mut cs = Vec::new();
        r.angles(7, &mut cs);
        let ts = 10000f32.powf(-2.0 / 8.0);
        let mut theta = 7.0f32;
        for &(c, s) in &cs {
            assert_eq!((c, s), ((0.5 * theta).cos(), (0.5 * theta).sin()));
            theta *= ts;
        }
    }
    #[test]
    fn yarn_matches_transformers() {
        // transformers 5.24 `_compute_yarn_parameters` for gpt-oss's settings (theta 150000,
        // factor 32, betas 32/1, original context 4096) with head_dim 16, without and with
        // `truncate` (which moves pairs 3 and 4).
        let mut y = Yarn::new(32.0, 4096);
        y.truncate = false;
        let want: [f64; 8] = [
            1.0,
            0.225418001,
            0.0508132726,
            0.00679495931,
            0.000456483918,
            1.8188337e-05,
            4.09997847e-06,
            9.24208962e-07,
        ];
        let truncated = [3usize, 4];
        let want_t: [f64; 2] = [0.00775546534, 0.000914454344];
        // Within 1e-6 relative (transformers computes in f32).
        let near = |got: f32, want: f64| (got as f64 - want).abs() <= 1e-6 * want;
        for (got, want) in y.inv_freq(150000.0, 16).iter().zip(want) {
            assert!(near(*got, want), "{got} vs {want}");
        }
        y.truncate = true;
        let t = y.inv_freq(150000.0, 16);
        for (j, w) in truncated.iter().zip(want_t) {
            assert!(near(t[*j], w), "pair {j}: {} vs {w}", t[*j]);
        }
        assert!((y.attention_scale() - 1.346_573_6).abs() < 1e-6);
        // Explicit and DeepSeek-style attention factors; no scaling below factor 1.
        assert_eq!(
            Yarn {
                attention_factor: Some(0.5),
                ..y
            }
            .attention_scale(),
            0.5
        );
        let ds = Yarn {
            mscale: Some((1.0, 1.0)),
            ..y
        };
        assert_eq!(ds.attention_scale(), 1.0);
        assert_eq!(Yarn::new(1.0, 4096).attention_scale(), 1.0);
        // Head 64 (gpt-oss's own): the blend of pair 13 and the untouched ends.
        let f = Yarn { truncate: false, ..y }.inv_freq(150000.0, 64);
        assert_eq!(f.len(), 32);
        assert!(near(f[13], 0.00386035908));
        assert!(near(f[0], 1.0) && near(f[31], 3.0235114e-07));
        // The rope scales cos and sin by the attention factor.
        let r = Rope::new_yarn(150000.0, 16, 16, true, &y);
        let mut cs = Vec::new();
        r.angles(5, &mut cs);
        let a = 5.0 * t[1] as f64;
        let m = y.attention_scale();
        assert_eq!(cs[1], (a.cos() as f32 * m, a.sin() as f32 * m));
    }
}
