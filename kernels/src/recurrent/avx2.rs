//! AVX2+FMA recurrent kernels: the kernels of `lanes.rs` over eight f32 lanes, step tiles of
//! four vectors, product tiles of 6 rows × 2 vectors. [`TABLE`] is only chosen (or used by
//! tests) after detecting AVX2 and FMA.

use super::lanes::{self, Lanes};
use super::{Gemm, Table};
use std::arch::x86_64::*;

/// This set's recurrent kernels.
pub(super) const TABLE: Table = Table {
    name: "avx2",
    step,
    gemm,
    fma_rows,
    sumsq,
};

/// Eight f32 lanes in a YMM register.
struct Avx2;

impl Lanes for Avx2 {
    type V = __m256;
    const W: usize = 8;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the trait's contract (AVX; eight floats at p).
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the trait's contract (AVX; eight floats at p).
        unsafe { _mm256_storeu_ps(p, v) }
    }

    #[inline(always)]
    unsafe fn set1(x: f32) -> __m256 {
        // SAFETY: the trait's contract (AVX).
        unsafe { _mm256_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the trait's contract (AVX).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the trait's contract (FMA).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (AVX).
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (AVX).
        unsafe { _mm256_add_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (AVX).
        unsafe { _mm256_sub_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: the trait's contract (AVX2 and FMA, hsum256's features).
        unsafe { hsum256(v) }
    }
}

/// Horizontal sum of eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

// The table's entries: the shared kernels compiled for this set's features. Each needs AVX2
// and FMA, and the shapes [`Table`]'s methods check.

#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn step(
    s: &mut [f32],
    dk: usize,
    dv: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    o: &mut [f32],
) {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::step::<Avx2, 4>(s, dk, dv, q, k, v, g, beta, o) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn gemm(p: &Gemm, c: &mut [f32]) {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::gemm::<Avx2, 6, 2>(p, c) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn fma_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::fma_rows::<Avx2>(out, w, x) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn sumsq(x: &[f32]) -> f32 {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::dot::<Avx2>(x, x) }
}
