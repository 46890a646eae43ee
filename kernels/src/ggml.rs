//! Emulation of ggml-cpu's (llama.cpp's) float arithmetic where it is observable: attention over
//! an F16 KV cache (f16 operands, f32 sums in the lane order of its x86 AVX2 kernels) and its
//! softmax (a polynomial `exp`, sums of eight in f32, then f64).
//!
//! Greedy decoding of a quantized model flips at near-ties: the activations are quantized to 8
//! bits before every matmul, so a difference of one unit in the last place upstream can move an
//! activation across a rounding boundary and change logits by ~1e-3. Following llama.cpp token for
//! token needs the same roundings, not just the same maths. What is emulated was read off
//! ggml-cpu's x86 code paths (AVX2 + FMA + F16C, no AVX-512), the ones llama.cpp takes on the
//! machines Berth is compared on.
//!
//! The scalar functions here define the results; [`dot_f16`] and the exponentials of
//! [`softmax_ggml`] also have AVX2 versions that do the same IEEE operations lane by lane (equal
//! bit for bit), chosen once at first use like [`crate::ops`]' row kernels ([`ggml_impl_name`]).

use std::sync::OnceLock;

/// The order in which ggml-cpu sums the products of an f16 dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16DotOrder {
    /// llamafile's tinyBLAS (matmuls over two or more rows, i.e. prompt batches): one 8-lane f32
    /// accumulator, lane `i % 8`, then a horizontal sum `(h0 + h2) + (h1 + h3)` of
    /// `h[l] = x[l] + x[l + 4]`.
    Gemm,
    /// `ggml_vec_dot_f16` (single-row matmuls, i.e. one token): four 8-lane accumulators over
    /// steps of 32, accumulator `(i / 8) % 4`, reduced as `(x0 + x2) + (x1 + x3)`, then
    /// `h[l] = x[l] + x[l + 4]` and `(h0 + h1) + (h2 + h3)`; elements past the last whole step of
    /// 32 are added in f64.
    VecDot,
}

impl F16DotOrder {
    /// The order of a matmul whose other operand has `rows` rows (tokens in the batch).
    pub fn for_rows(rows: usize) -> F16DotOrder {
        if rows >= 2 {
            F16DotOrder::Gemm
        } else {
            F16DotOrder::VecDot
        }
    }

    /// Accumulator slot (0..32) of element `i`.
    #[inline]
    pub fn slot(self, i: usize) -> usize {
        match self {
            F16DotOrder::Gemm => i % 8,
            F16DotOrder::VecDot => (i / 8) % 4 * 8 + i % 8,
        }
    }

    /// Number of accumulator slots in use: 8 ([`F16DotOrder::Gemm`]) or 32.
    #[inline]
    pub fn slots(self) -> usize {
        match self {
            F16DotOrder::Gemm => 8,
            F16DotOrder::VecDot => 32,
        }
    }

    /// Sums the 32 slots (only the first 8 are used by [`F16DotOrder::Gemm`]) and `tail` (the
    /// f64 sum of elements past the vectorised part, [`F16DotOrder::VecDot`] only).
    #[inline]
    pub fn reduce(self, x: &[f32; 32], tail: f64) -> f32 {
        match self {
            F16DotOrder::Gemm => hsum8(&x[..8]),
            F16DotOrder::VecDot => {
                let mut z = [0.0f32; 8];
                for l in 0..8 {
                    z[l] = (x[l] + x[16 + l]) + (x[8 + l] + x[24 + l]);
                }
                let t: [f32; 4] = std::array::from_fn(|l| z[l] + z[l + 4]);
                (((t[0] + t[1]) + (t[2] + t[3])) as f64 + tail) as f32
            }
        }
    }

    /// Number of leading elements (of `n`) that go through the vector lanes.
    #[inline]
    pub fn vector_len(self, n: usize) -> usize {
        match self {
            F16DotOrder::Gemm => n,
            F16DotOrder::VecDot => n - n % 32,
        }
    }
}

/// Horizontal sum of 8 lanes as AVX code does it: `h[l] = x[l] + x[l + 4]`, then
/// `(h0 + h2) + (h1 + h3)`.
#[inline]
pub fn hsum8(x: &[f32]) -> f32 {
    let h: [f32; 4] = std::array::from_fn(|l| x[l + 4] + x[l]);
    (h[0] + h[2]) + (h[1] + h[3])
}

/// Dot product of two vectors of f16 values (held as f32) in ggml's order, over the shorter
/// length. Products of two f16 values are exact in f32, so fused and unfused multiply-adds agree.
pub fn dot_f16(order: F16DotOrder, a: &[f32], b: &[f32]) -> f32 {
    (table().dot_f16)(order, a, b)
}

#[inline]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// ggml-cpu's vectorised `expf` (AVX2 + FMA `ggml_v_expf`), one lane: a range reduction to
/// `2^n · e^b` and a degree-5 polynomial, with its own rounding (not libm's `expf`).
pub fn ggml_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 1.5 · 2^23
    let z = fma(x, f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = fma(
        -n,
        f32::from_bits(0x35bf_be8e),
        fma(-n, f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = fma(
        fma(
            fma(f32::from_bits(0x3c07_2010), b, f32::from_bits(0x3d2b_9f17)),
            u,
            fma(f32::from_bits(0x3e2a_af33), b, f32::from_bits(0x3eff_fedb)),
        ),
        u,
        f32::from_bits(0x3f7f_fff6) * b,
    );
    if n.abs() > 126.0 {
        return exp_far(n, e, j);
    }
    fma(j, k, k)
}

/// [`ggml_expf`] when `2^n` leaves the normal range: scaled in two steps, or 0 / infinity.
fn exp_far(n: f32, e: u32, j: f32) -> f32 {
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fma(s2, j, s2) * s1
    }
}

/// ggml-cpu's softmax of one row of scores (`ggml_compute_forward_soft_max_f32` with scale 1 and
/// no mask, scores already scaled): `ggml_expf(s - max)`, the exponentials summed in groups of 8
/// consecutive KV cells (`first_cell` is the cell of `x[0]`; masked cells count as 0) with
/// [`hsum8`], the groups in f64, then a multiply by `(f32)(1 / sum)`.
pub fn softmax_ggml(x: &mut [f32], first_cell: usize) {
    softmax_ggml_sink(x, first_cell, None)
}

/// [`softmax_ggml`] with an attention sink, as ggml-cpu adds one (`ggml_soft_max_add_sinks`):
/// the maximum also covers the sink, and `expf(sink - max)` joins the f64 sum after the cells;
/// the sink's own probability is not written.
pub fn softmax_ggml_sink(x: &mut [f32], first_cell: usize, sink: Option<f32>) {
    let mut max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        max = max.max(s);
    }
    (table().exp_shifted)(x, max);
    let mut sum = 0.0f64;
    let mut lanes = [0.0f32; 8];
    let mut group = first_cell / 8;
    for (i, &v) in x.iter().enumerate() {
        let cell = first_cell + i;
        if cell / 8 != group {
            sum += hsum8(&lanes) as f64;
            lanes = [0.0; 8];
            group = cell / 8;
        }
        lanes[cell % 8] = v;
    }
    sum += hsum8(&lanes) as f64;
    if let Some(s) = sink {
        sum += (s - max).exp() as f64;
    }
    let inv = (1.0 / sum) as f32;
    crate::ops::scale_in_place(x, inv);
}

/// One implementation of the vectorised parts.
#[derive(Clone, Copy)]
struct Table {
    name: &'static str,
    dot_f16: fn(F16DotOrder, &[f32], &[f32]) -> f32,
    /// `x[i] = ggml_expf(x[i] - max)`.
    exp_shifted: fn(&mut [f32], f32),
}

const SCALAR: Table = Table {
    name: "scalar",
    dot_f16: scalar::dot_f16,
    exp_shifted: scalar::exp_shifted,
};

#[cfg(target_arch = "x86_64")]
const AVX2: Table = Table {
    name: "avx2",
    dot_f16: avx2::dot_f16,
    exp_shifted: avx2::exp_shifted,
};

/// What these kernels are called in warnings.
const NAME: &str = "ggml-arithmetic";

/// The fastest kernels for this CPU, detected once (at most the level `BERTH_KERNELS` names).
fn table() -> &'static Table {
    static BEST: OnceLock<Table> = OnceLock::new();
    BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let candidates = [
            (
                crate::KernelLevel::Avx2,
                crate::KernelLevel::Avx2.supported(),
                &AVX2,
            ),
            (crate::KernelLevel::Scalar, true, &SCALAR),
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let candidates = [(crate::KernelLevel::Scalar, true, &SCALAR)];
        *crate::select_table(NAME, &candidates)
    })
}

/// Name of the selected implementation ("scalar", "avx2").
pub fn ggml_impl_name() -> &'static str {
    table().name
}

/// The definitions.
mod scalar {
    use super::{ggml_expf, F16DotOrder};

    pub(super) fn dot_f16(order: F16DotOrder, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let nv = order.vector_len(n);
        let mut acc = [0.0f32; 32];
        for i in 0..nv {
            acc[order.slot(i)] += a[i] * b[i];
        }
        let tail: f64 = (nv..n).map(|i| (a[i] * b[i]) as f64).sum();
        order.reduce(&acc, tail)
    }

    pub(super) fn exp_shifted(x: &mut [f32], max: f32) {
        x.iter_mut().for_each(|v| *v = ggml_expf(*v - max));
    }
}

/// AVX2+FMA versions of [`scalar`], lane for lane. The `*_impl` functions need those CPU
/// features; the safe wrappers are only installed in [`AVX2`] (or called by tests) after
/// detecting them.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::F16DotOrder;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    fn dot_f16_impl(order: F16DotOrder, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let nv = order.vector_len(n);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [0.0f32; 32];
        // Unfused multiply-adds, as the scalar code (equal to fused ones on f16 values).
        let mut i = 0;
        match order {
            F16DotOrder::Gemm => {
                let mut v = _mm256_setzero_ps();
                while i + 8 <= nv {
                    // SAFETY: i + 8 <= nv <= n <= both lengths.
                    unsafe {
                        let p = _mm256_mul_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
                        v = _mm256_add_ps(v, p);
                    }
                    i += 8;
                }
                // SAFETY: acc holds 32 f32.
                unsafe { _mm256_storeu_ps(acc.as_mut_ptr(), v) };
                for j in i..nv {
                    acc[j % 8] += a[j] * b[j];
                }
            }
            F16DotOrder::VecDot => {
                let mut v = [_mm256_setzero_ps(); 4];
                while i + 32 <= nv {
                    for (u, vu) in v.iter_mut().enumerate() {
                        // SAFETY: i + 32 <= nv <= n <= both lengths.
                        unsafe {
                            let o = i + 8 * u;
                            let p = _mm256_mul_ps(_mm256_loadu_ps(pa.add(o)), _mm256_loadu_ps(pb.add(o)));
                            *vu = _mm256_add_ps(*vu, p);
                        }
                    }
                    i += 32;
                }
                for (u, vu) in v.iter().enumerate() {
                    // SAFETY: acc holds 32 f32 and 8u + 8 <= 32.
                    unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * u), *vu) };
                }
            }
        }
        let tail: f64 = (nv..n).map(|i| (a[i] * b[i]) as f64).sum();
        order.reduce(&acc, tail)
    }

    /// ggml's AVX2 `ggml_v_expf`, as [`super::ggml_expf`] emulates it lane by lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn expf(x: __m256) -> __m256 {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0))));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let far = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0), _CMP_GT_OQ);
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_mul_ps(c(0x3f7f_fff6), b),
        );
        let near = _mm256_fmadd_ps(j, k, k);
        if _mm256_movemask_ps(far) == 0 {
            return near;
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let very_far = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0), _CMP_GT_OQ);
        let scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
        let r = _mm256_blendv_ps(near, scaled, far);
        _mm256_blendv_ps(r, _mm256_mul_ps(s1, s1), very_far)
    }

    #[target_feature(enable = "avx2,fma")]
    fn exp_shifted_impl(x: &mut [f32], max: f32) {
        let vm = _mm256_set1_ps(max);
        let mut c = x.chunks_exact_mut(8);
        for ch in &mut c {
            // SAFETY: ch holds exactly 8 f32.
            unsafe {
                let v = _mm256_sub_ps(_mm256_loadu_ps(ch.as_ptr()), vm);
                _mm256_storeu_ps(ch.as_mut_ptr(), expf(v));
            }
        }
        c.into_remainder()
            .iter_mut()
            .for_each(|v| *v = super::ggml_expf(*v - max));
    }

    pub(super) fn dot_f16(order: F16DotOrder, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: the CPU features were detected (see the module docs).
        unsafe { dot_f16_impl(order, a, b) }
    }

    pub(super) fn exp_shifted(x: &mut [f32], max: f32) {
        // SAFETY: the CPU features were detected (see the module docs).
        unsafe { exp_shifted_impl(x, max) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    /// Every table this CPU can run, scalar first (ignores `BERTH_FORCE_SCALAR`).
    fn tables() -> Vec<Table> {
        #[allow(unused_mut)]
        let mut v = vec![SCALAR];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            v.push(AVX2);
        }
        v
    }

    #[test]
    fn ggml_expf_is_close_to_exp() {
        for i in -2000..=800 {
            let x = i as f32 * 0.1 + 0.0123;
            let (a, b) = (ggml_expf(x), x.exp());
            assert!(
                (a - b).abs() <= 4e-7 * b.abs() + f32::MIN_POSITIVE,
                "{x}: {a} vs {b}"
            );
        }
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_expf(0.0), 1.0);
    }

    #[test]
    fn simd_expf_equals_scalar() {
        let mut rng = XorShift::new(21);
        let mut x: Vec<f32> = (-2300..=1000).map(|i| i as f32 * 0.1 + 0.0123).collect();
        x.extend((0..20000).map(|_| rng.range(-30.0, 5.0)));
        x.extend((0..5000).map(|_| rng.range(-200.0, 100.0)));
        x.extend([
            f32::NEG_INFINITY,
            f32::INFINITY,
            0.0,
            -0.0,
            88.7,
            89.0,
            -87.4,
            -103.9,
            -150.0,
            -1e30,
        ]);
        for tb in tables() {
            for max in [0.0f32, 1.5, -2.0] {
                let (mut a, mut b) = (x.clone(), x.clone());
                (tb.exp_shifted)(&mut a, max);
                (SCALAR.exp_shifted)(&mut b, max);
                for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        p.to_bits() == q.to_bits(),
                        "{} exp({} - {max}): {p} vs {q}",
                        tb.name,
                        x[i]
                    );
                }
            }
            let mut nan = [f32::NAN; 9];
            (tb.exp_shifted)(&mut nan, 0.0);
            assert!(nan.iter().all(|v| v.is_nan()));
        }
    }

    #[test]
    fn f16_dots_sum_everything() {
        let a: Vec<f32> = (0..80).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..80).map(|i| (i % 5) as f32 * 0.5).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        for order in [F16DotOrder::Gemm, F16DotOrder::VecDot] {
            assert_eq!(dot_f16(order, &a, &b), want);
        }
    }

    #[test]
    fn simd_f16_dots_equal_scalar() {
        let mut rng = XorShift::new(22);
        let r16 = |v: f32| crate::ops::round_f16(v);
        for n in [0usize, 1, 5, 8, 13, 31, 32, 33, 64, 95, 128, 256, 300] {
            let a: Vec<f32> = rng.vec(n).iter().map(|&v| r16(v * 3.0)).collect();
            let b: Vec<f32> = rng.vec(n + 3).iter().map(|&v| r16(v * 3.0)).collect();
            // Not f16 values: the SIMD code must still round as the scalar code does.
            let c: Vec<f32> = rng.vec(n).iter().map(|v| v * 1.7).collect();
            for order in [F16DotOrder::Gemm, F16DotOrder::VecDot] {
                let want = (SCALAR.dot_f16)(order, &a, &b);
                let want_c = (SCALAR.dot_f16)(order, &c, &b);
                for tb in tables() {
                    assert_eq!(
                        (tb.dot_f16)(order, &a, &b).to_bits(),
                        want.to_bits(),
                        "{} {order:?} {n}",
                        tb.name
                    );
                    assert_eq!(
                        (tb.dot_f16)(order, &c, &b).to_bits(),
                        want_c.to_bits(),
                        "{} {order:?} {n}",
                        tb.name
                    );
                }
            }
        }
        // The orders differ: the same vectors can sum differently.
        let a: Vec<f32> = (0..64)
            .map(|i| if i % 9 == 0 { 2048.0 } else { r16(0.1 * i as f32) })
            .collect();
        let b = vec![1.0f32; 64];
        let (g, v) = (
            dot_f16(F16DotOrder::Gemm, &a, &b),
            dot_f16(F16DotOrder::VecDot, &a, &b),
        );
        assert!((g - v).abs() < 1.0);
    }

    #[test]
    fn ggml_softmax_sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, -1.0, 0.5, 7.0, 2.0, 2.0, 1.0, 0.0];
        softmax_ggml(&mut x, 3);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6 && x[5] > x[2]);
        assert!(["scalar", "avx2"].contains(&ggml_impl_name()));
    }

    #[test]
    fn ggml_softmax_groups_cells_by_eight() {
        // The same scores starting at different cells group differently, yet each result is the
        // scalar definition's.
        let mut rng = XorShift::new(23);
        let s: Vec<f32> = rng.vec(37).iter().map(|v| v * 8.0).collect();
        for first in [0usize, 3, 8, 13] {
            let mut a = s.clone();
            softmax_ggml(&mut a, first);
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|v| ggml_expf(v - max)).collect();
            let mut groups = std::collections::BTreeMap::<usize, [f32; 8]>::new();
            for (i, &v) in e.iter().enumerate() {
                groups.entry((first + i) / 8).or_insert([0.0; 8])[(first + i) % 8] = v;
            }
            let sum = groups.values().fold(0.0f64, |s, l| s + hsum8(l) as f64);
            let inv = (1.0 / sum) as f32;
            for (x, y) in a.iter().zip(&e) {
                assert_eq!(x.to_bits(), (y * inv).to_bits(), "first cell {first}");
            }
        }
    }
}
