//! AVX2+FMA+F16C row kernels. They need those CPU features: [`TABLE`] is only chosen (or used
//! by tests) after detecting them.

use super::{RopeRows, Table};
use std::arch::x86_64::*;

/// This set's row kernels.
pub(super) const TABLE: Table = Table {
    name: "avx2",
    scale_mul,
    axpy,
    add,
    scale,
    round_f16,
    geglu_f16,
    rope,
    gated_fast: gated,
    softmax_fast: softmax,
};

/// Horizontal sum of eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// e^x for eight lanes (Cephes-style polynomial, ~1 ulp; below -87.3 gives 0).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_ps(x: __m256) -> __m256 {
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
    // 2^fx; fx in [-126, 128] after clamping. Built as two halves so fx = 128 works.
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
pub(super) fn scale_mul(out: &mut [f32], x: &[f32], w: Option<&[f32]>, s: f32, off: f32) {
    let n = out.len().min(x.len()).min(w.map_or(usize::MAX, <[f32]>::len));
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    match w {
        Some(w) => {
            let voff = _mm256_set1_ps(off);
            while i + 8 <= n {
                // SAFETY: i + 8 <= n <= every slice's length; unaligned loads and stores.
                unsafe {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vs);
                    let g = _mm256_add_ps(_mm256_loadu_ps(w.as_ptr().add(i)), voff);
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(v, g));
                }
                i += 8;
            }
            for j in i..n {
                out[j] = x[j] * s * (w[j] + off);
            }
        }
        None => {
            while i + 8 <= n {
                // SAFETY: i + 8 <= n <= both slices' lengths.
                unsafe {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vs);
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
                }
                i += 8;
            }
            for j in i..n {
                out[j] = x[j] * s;
            }
        }
    }
}

/// `y += a * x` as a multiply then an add (no fusing, to match the scalar code).
#[target_feature(enable = "avx2,fma")]
pub(super) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let p = y.as_mut_ptr().add(i);
            let ax = _mm256_mul_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), ax));
        }
        i += 8;
    }
    for j in i..n {
        y[j] += a * x[j];
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn add(a: &mut [f32], b: &[f32]) {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let p = a.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                p,
                _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(b.as_ptr().add(i))),
            );
        }
        i += 8;
    }
    for j in i..n {
        a[j] += b[j];
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn scale(x: &mut [f32], s: f32) {
    let vs = _mm256_set1_ps(s);
    let mut c = x.chunks_exact_mut(8);
    for ch in &mut c {
        // SAFETY: ch holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(ch.as_mut_ptr(), _mm256_mul_ps(_mm256_loadu_ps(ch.as_ptr()), vs)) };
    }
    c.into_remainder().iter_mut().for_each(|v| *v *= s);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn round_f16(x: &mut [f32]) {
    let mut c = x.chunks_exact_mut(8);
    for ch in &mut c {
        // SAFETY: ch holds exactly 8 f32.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(ch.as_ptr()));
            _mm256_storeu_ps(ch.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    c.into_remainder()
        .iter_mut()
        .for_each(|v| *v = super::round_f16(*v));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn geglu_f16(a: &mut [f32], b: &[f32]) {
    let n = a.len().min(b.len());
    let table = super::gelu_f16_table();
    assert_eq!(table.len(), 1 << 16);
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths; the gather indices are u16 values, inside the
        // 65536-entry table.
        unsafe {
            let p = a.as_mut_ptr().add(i);
            let x = _mm256_loadu_ps(p);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let g = _mm256_i32gather_ps::<4>(table.as_ptr(), _mm256_cvtepu16_epi32(h));
            let g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
            let g = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LE_OQ), g);
            _mm256_storeu_ps(p, _mm256_mul_ps(g, _mm256_loadu_ps(b.as_ptr().add(i))));
        }
        i += 8;
    }
    for j in i..n {
        a[j] = super::gelu_tanh_f16(a[j]) * b[j];
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn rope(x: &mut [f32], r: &RopeRows) {
    let (d, n) = (r.head_dim, r.cos.len().min(r.sin.len()));
    for head in x.chunks_exact_mut(d) {
        let p = head.as_mut_ptr();
        let (cp, sp) = (r.cos.as_ptr(), r.sin.as_ptr());
        let mut j = 0;
        if r.neox {
            while j + 8 <= n {
                // SAFETY: j + 8 <= n <= cos/sin lengths, and `Rope::apply` checked
                // half + n <= head_dim, so both halves' lanes lie inside the head.
                unsafe {
                    let x0 = _mm256_loadu_ps(p.add(j));
                    let x1 = _mm256_loadu_ps(p.add(j + r.half));
                    let c = _mm256_loadu_ps(cp.add(j));
                    let s = _mm256_loadu_ps(sp.add(j));
                    let (a, b) = if r.fused {
                        (
                            _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)),
                            _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)),
                        )
                    } else {
                        (
                            _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)),
                            _mm256_add_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x0, s)),
                        )
                    };
                    _mm256_storeu_ps(p.add(j), a);
                    _mm256_storeu_ps(p.add(j + r.half), b);
                }
                j += 8;
            }
        } else {
            while j + 4 <= n {
                // SAFETY: j + 4 <= n <= cos/sin lengths, and `Rope::apply` checked
                // 2n <= head_dim, so the 8 lanes from 2j lie inside the head.
                unsafe {
                    let v = _mm256_loadu_ps(p.add(2 * j));
                    // Pairs swapped: [x1, x0, ...]; cos and sin repeated per pair.
                    let vs = _mm256_permute_ps::<0b10_11_00_01>(v);
                    let c4 = _mm_loadu_ps(cp.add(j));
                    let s4 = _mm_loadu_ps(sp.add(j));
                    let c = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
                    let s = _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
                    let r8 = if r.fused {
                        // Even lanes fma(x0, c, -(x1*s)); odd lanes fma(x0, s, x1*c).
                        let even = _mm256_fmsub_ps(v, c, _mm256_mul_ps(vs, s));
                        let odd = _mm256_fmadd_ps(vs, s, _mm256_mul_ps(v, c));
                        _mm256_blend_ps::<0b1010_1010>(even, odd)
                    } else {
                        // Even lanes x0*c - x1*s; odd lanes x1*c + x0*s.
                        _mm256_addsub_ps(_mm256_mul_ps(v, c), _mm256_mul_ps(vs, s))
                    };
                    _mm256_storeu_ps(p.add(2 * j), r8);
                }
                j += 4;
            }
        }
        for jj in j..n {
            super::scalar::rotate(head, r, jj, r.cos[jj], r.sin[jj]);
        }
    }
}

/// `a = act(a) * b` (or `a = act(a)`), act = silu or gelu_tanh via [`exp_ps`].
#[target_feature(enable = "avx2,fma")]
pub(super) fn gated(a: &mut [f32], b: Option<&[f32]>, gelu: bool) {
    let n = a.len().min(b.map_or(usize::MAX, <[f32]>::len));
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
    let act = if gelu { super::gelu_tanh } else { super::silu };
    for j in i..n {
        a[j] = act(a[j]) * b.map_or(1.0, |b| b[j]);
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
    let mut sum = hsum(vsum);
    for v in &mut x[i..] {
        *v = (*v - max).exp();
        sum += *v;
    }
    scale(x, 1.0 / sum);
}

/// Eight lanes of [`exp_ps`], for tests.
#[cfg(test)]
pub(super) fn exp8(x: [f32; 8]) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: only called by tests after detecting AVX2+FMA; the arrays hold 8 f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp_ps(_mm256_loadu_ps(x.as_ptr()))) };
    out
}
