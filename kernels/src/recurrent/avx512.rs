//! AVX-512F recurrent kernels: the kernels of `lanes.rs` over sixteen f32 lanes, step tiles of
//! eight vectors, product tiles of 6 rows × 4 vectors. [`TABLE`] is only chosen (or used by
//! tests) after detecting AVX-512F.

use super::lanes::{self, Lanes};
use super::{Gemm, Table};
use std::arch::x86_64::*;

/// This set's recurrent kernels.
pub(super) const TABLE: Table = Table {
    name: "avx512",
    step,
    gemm,
    fma_rows,
    sumsq,
};

/// Sixteen f32 lanes in a ZMM register.
struct Avx512;

impl Lanes for Avx512 {
    type V = __m512;
    const W: usize = 16;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the trait's contract (AVX-512F; sixteen floats at p).
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the trait's contract (AVX-512F; sixteen floats at p).
        unsafe { _mm512_storeu_ps(p, v) }
    }

    #[inline(always)]
    unsafe fn set1(x: f32) -> __m512 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_add_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_sub_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        // SAFETY: the trait's contract (AVX-512F).
        unsafe { _mm512_reduce_add_ps(v) }
    }
}

// The table's entries: the shared kernels compiled for this set's features. Each needs AVX-512F
// and and the shapes [`Table`]'s methods check.

#[target_feature(enable = "avx512f")]
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
    unsafe { lanes::step::<Avx512, 8>(s, dk, dv, q, k, v, g, beta, o) }
}

#[target_feature(enable = "avx512f")]
unsafe fn gemm(p: &Gemm, c: &mut [f32]) {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::gemm::<Avx512, 6, 4>(p, c) }
}

#[target_feature(enable = "avx512f")]
unsafe fn fma_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::fma_rows::<Avx512>(out, w, x) }
}

#[target_feature(enable = "avx512f")]
unsafe fn sumsq(x: &[f32]) -> f32 {
    // SAFETY: the entry's contract (above).
    unsafe { lanes::dot::<Avx512>(x, x) }
}
