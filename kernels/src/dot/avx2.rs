//! AVX2+FMA(+F16C) dot products. Every function here requires those CPU features; the
//! safe wrappers at the bottom are only installed in the dispatch table after detection.

use crate::quant::WeightType;
use crate::quant::{
    e8m0_to_f32_half, rd_f16, rd_f32, unpack_scales_mins_k4, KVALUES_MXFP4, MXFP4_BYTES, Q4_0_BYTES,
    Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES, QK, QK_K,
};
use std::arch::x86_64::*;

/// Horizontal sum of eight f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Reads a little-endian f16 at `b[off..off + 2]` and converts it with F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn f16c(b: &[u8], off: usize) -> f32 {
    let h = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Horizontal sum of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Signed i8 · i8 over 32 lanes, summed in pairs of 4 into eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_i8_epi32(x: __m256i, y: __m256i) -> __m256i {
    // maddubs wants unsigned × signed: move x's sign onto y.
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    let p = _mm256_maddubs_epi16(ax, sy);
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Expands 16 bytes of nibbles into 32 bytes: low nibbles first, then high nibbles.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn nibbles_32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at p; unaligned load.
    let b = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, m);
    let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    _mm256_set_m128i(hi, lo)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 32 readable bytes at p; unaligned load.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Reads the little-endian f16 at `p` and converts it with F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn f16c_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 2 readable bytes at p; unaligned read.
    let h = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Q5_0 block at `x` to 32 signed values in -16..=15.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn q5_0_values(x: *const u8) -> __m256i {
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bitmask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    // SAFETY: caller guarantees a 22-byte block at x (qh at 2..6, nibbles at 6..22).
    let (qh, q) = unsafe { ((x.add(2) as *const u32).read_unaligned(), nibbles_32(x.add(6))) };
    let hb = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), shuf);
    let hb = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bitmask), bitmask);
    // q - 16 = nibble - 16 where the fifth bit is clear, nibble where it is set.
    _mm256_sub_epi8(q, _mm256_andnot_si256(hb, _mm256_set1_epi8(16)))
}

/// MXFP4 block at `x` to its 32 doubled E2M1 values as signed i8 (-12..=12): the 16 code
/// bytes' low nibbles then high nibbles, each looked up in [`KVALUES_MXFP4`] with a byte shuffle.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mxfp4_values(x: *const u8) -> __m256i {
    // SAFETY: KVALUES_MXFP4 is 16 bytes; caller guarantees a 17-byte block at x (codes at 1..17).
    let (lut, b) = unsafe {
        (
            _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i),
            _mm_loadu_si128(x.add(1) as *const __m128i),
        )
    };
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m));
    let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m));
    _mm256_set_m128i(hi, lo)
}

/// Scaled i8 dot product of one 32-element block pair at `x` (weights) and `y` (Q8_0), as
/// (scale, eight f32 partial sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q4_0(x: *const u8, y: *const u8) -> (__m256, __m256) {
    // SAFETY: caller guarantees an 18-byte block at x and a 34-byte block at y.
    unsafe {
        let d = _mm256_set1_ps(f16c_at(x) * f16c_at(y));
        let qx = _mm256_sub_epi8(nibbles_32(x.add(2)), _mm256_set1_epi8(8));
        (d, _mm256_cvtepi32_ps(dot_i8_epi32(qx, load256(y.add(2)))))
    }
}

/// Q5_0 counterpart of [`block_q4_0`] (22-byte blocks at `x`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q5_0(x: *const u8, y: *const u8) -> (__m256, __m256) {
    // SAFETY: caller guarantees a 22-byte block at x and a 34-byte block at y.
    unsafe {
        let d = _mm256_set1_ps(f16c_at(x) * f16c_at(y));
        (
            d,
            _mm256_cvtepi32_ps(dot_i8_epi32(q5_0_values(x), load256(y.add(2)))),
        )
    }
}

/// Q8_0 counterpart of [`block_q4_0`] (34-byte blocks at `x`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_q8_0(x: *const u8, y: *const u8) -> (__m256, __m256) {
    // SAFETY: caller guarantees 34-byte blocks at x and y.
    unsafe {
        let d = _mm256_set1_ps(f16c_at(x) * f16c_at(y));
        (
            d,
            _mm256_cvtepi32_ps(dot_i8_epi32(load256(x.add(2)), load256(y.add(2)))),
        )
    }
}

/// MXFP4 counterpart of [`block_q4_0`] (17-byte blocks at `x`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_mxfp4(x: *const u8, y: *const u8) -> (__m256, __m256) {
    // SAFETY: caller guarantees a 17-byte block at x and a 34-byte block at y.
    unsafe {
        let d = _mm256_set1_ps(f16c_at(y) * e8m0_to_f32_half(*x));
        (
            d,
            _mm256_cvtepi32_ps(dot_i8_epi32(mxfp4_values(x), load256(y.add(2)))),
        )
    }
}

/// Prefetch distance (bytes) ahead of the weight pointer in the single-row kernels (decode
/// streams the weights from memory; 4 KiB measured best for the Q8_0 LM head).
const PREFETCH: usize = 4096;

/// Prefetches the cache lines `PREFETCH` bytes past a `len`-byte weight block at `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn prefetch_block(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
    }
}

/// Runs a 32-element block kernel (`block(weight block, activation block)`, `xb`-byte weight
/// blocks) over a row with two independent accumulators, walking raw pointers after one
/// length check.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_0<F: Fn(*const u8, *const u8) -> (__m256, __m256)>(
    w: &[u8],
    a: &[u8],
    n: usize,
    xb: usize,
    block: F,
) -> f32 {
    let nb = n / QK;
    assert!(w.len() >= nb * xb && a.len() >= nb * Q8_0_BYTES);
    // One accumulator, blocks in order: the float rounding of ggml-cpu's AVX2
    // `ggml_vec_dot_q*_0_q8_0` (and of `rows_0`), so results are bit-identical to llama.cpp's.
    let mut acc = _mm256_setzero_ps();
    let (mut wp, mut ap) = (w.as_ptr(), a.as_ptr());
    for _ in 0..nb {
        // Weights stream from memory in decode: ask for the bytes a row ahead.
        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH) as *const i8);
        let (d, p) = block(wp, ap);
        acc = _mm256_fmadd_ps(d, p, acc);
        // SAFETY: each step stays within the `nb` blocks asserted above.
        (wp, ap) = unsafe { (wp.add(xb), ap.add(Q8_0_BYTES)) };
    }
    hsum_ps(acc)
}

// SAFETY (the four closures below): `row_0` only passes pointers to whole blocks inside the
// rows it length-checked.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_q8_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    row_0(w, a, n, Q4_0_BYTES, |x, y| unsafe { block_q4_0(x, y) })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_q8_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    row_0(w, a, n, Q5_0_BYTES, |x, y| unsafe { block_q5_0(x, y) })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_q8_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    row_0(w, a, n, Q8_0_BYTES, |x, y| unsafe { block_q8_0(x, y) })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_q8_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    row_0(w, a, n, MXFP4_BYTES, |x, y| unsafe { block_mxfp4(x, y) })
}

/// Sum over the 8 sub-blocks of `mins[j] * (bsums[2j] + bsums[2j+1])` (`y`: a Q8_K block).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn k_min_sum(y: &[u8], m: &[u8; 8]) -> i32 {
    assert!(y.len() >= Q8_K_BYTES);
    // SAFETY: the 16 i16 bsums lie at 260..292 of the asserted 292-byte block.
    let b = unsafe { load256(y.as_ptr().add(260)) };
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let m8 = _mm_cvtsi64_si128(i64::from_le_bytes(*m));
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(m8, dup));
    hsum_epi32(_mm256_madd_epi16(b, mins))
}

/// Eight i32 lanes summing to `Σ_is scales[is] · bsums[is]` over the 16 sub-blocks of a Q6_K
/// block (`sc`: its 16 i8 scales) against a Q8_K block `y`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q6_k_offsets(sc: &[u8], y: &[u8]) -> __m256i {
    assert!(sc.len() >= 16 && y.len() >= Q8_K_BYTES);
    // SAFETY: 16 scale bytes and the 32 bsum bytes at 260..292 are inside the asserted slices.
    let (s, b) = unsafe {
        (
            _mm_loadu_si128(sc.as_ptr() as *const __m128i),
            load256(y.as_ptr().add(260)),
        )
    };
    _mm256_madd_epi16(_mm256_cvtepi8_epi16(s), b)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q8_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / QK_K;
    assert!(w.len() >= nb * Q4_K_BYTES && a.len() >= nb * Q8_K_BYTES);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = 0.0f32;
    let mut accm = 0.0f32;
    for i in 0..nb {
        let x = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        prefetch_block(x.as_ptr(), Q4_K_BYTES);
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = rd_f32(y, 0);
        let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            // SAFETY: x has 144 bytes (qs at 16..144), y has 292 (qs at 4..260).
            let (q, y0, y1) = unsafe {
                (
                    load256(x.as_ptr().add(16 + 32 * j)),
                    load256(y.as_ptr().add(4 + 64 * j)),
                    load256(y.as_ptr().add(36 + 64 * j)),
                )
            };
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * j] as i16));
            let p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, y1),
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        let (d, dmin) = (f16c(x, 0), f16c(x, 2));
        (acc, accm) = q4_k_block_acc(acc, accm, hsum_epi32(sumi), k_min_sum(y, &m), d, dmin, yd);
    }
    acc - accm
}

/// The horizontal sums of four vectors of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum4_epi32(v: [__m256i; 4]) -> [i32; 4] {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    let mut out = [0i32; 4];
    // SAFETY: `out` holds four i32 (16 bytes); unaligned store.
    unsafe { _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, s) };
    out
}

/// `mins[2j] · (bsums[4j] + bsums[4j+1]) + mins[2j+1] · (bsums[4j+2] + bsums[4j+3])` for each
/// pair of sub-blocks `j` of a Q8_K block `y` (64 values each).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn k_min_sums_64(y: &[u8], m: &[u8; 8]) -> [i32; 4] {
    assert!(y.len() >= Q8_K_BYTES);
    // SAFETY: the 16 i16 bsums lie at 260..292 of the asserted 292-byte block.
    let b = unsafe { load256(y.as_ptr().add(260)) };
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let m8 = _mm_cvtsi64_si128(i64::from_le_bytes(*m));
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(m8, dup));
    // Lane l: sub-block l's mins · bsums; pairs of lanes added, then the low halves gathered.
    let p = _mm256_madd_epi16(b, mins);
    let h = _mm256_permute4x64_epi64(_mm256_hadd_epi32(p, p), 0b00_00_10_00);
    let mut out = [0i32; 4];
    // SAFETY: `out` holds four i32 (16 bytes); unaligned store.
    unsafe { _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, _mm256_castsi256_si128(h)) };
    out
}

/// One Q4_K block's contribution in ggml-cpu's float order (x86 AVX2 repacked Q4_K, the
/// `q4_K_8x8_q8_K` gemv and gemm): the block's whole integer sums `isum` (scaled quants) and
/// `msum` (mins · bsums) each enter one fused multiply-add with `d · yd` and `dmin · yd`; the
/// result is `acc - accm` after the last block.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn q4_k_block_acc(
    acc: f32,
    accm: f32,
    isum: i32,
    msum: i32,
    d: f32,
    dmin: f32,
    yd: f32,
) -> (f32, f32) {
    (
        (isum as f32).mul_add(d * yd, acc),
        (msum as f32).mul_add(dmin * yd, accm),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_q8_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / QK_K;
    assert!(w.len() >= nb * Q5_K_BYTES && a.len() >= nb * Q8_K_BYTES);
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut accm = 0.0f32;
    for i in 0..nb {
        let x = &w[i * Q5_K_BYTES..(i + 1) * Q5_K_BYTES];
        prefetch_block(x.as_ptr(), Q5_K_BYTES);
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = rd_f32(y, 0);
        let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
        accm += f16c(x, 2) * yd * k_min_sum(y, &m) as f32;
        // SAFETY: x has 176 bytes; qh at 16..48.
        let hbits = unsafe { load256(x.as_ptr().add(16)) };
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            // SAFETY: qs at 48..176 of x; y qs at 4..260.
            let (q, y0, y1) = unsafe {
                (
                    load256(x.as_ptr().add(48 + 32 * j)),
                    load256(y.as_ptr().add(4 + 64 * j)),
                    load256(y.as_ptr().add(36 + 64 * j)),
                )
            };
            let sh = _mm_cvtsi32_si128(2 * j as i32);
            let sh1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh), one), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh1), one), 4);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * j] as i16));
            let p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, y1),
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        let d = _mm256_set1_ps(f16c(x, 0) * yd);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - accm
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_q8_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / QK_K;
    assert!(w.len() >= nb * Q6_K_BYTES && a.len() >= nb * Q8_K_BYTES);
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let x = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        prefetch_block(x.as_ptr(), Q6_K_BYTES);
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let sc = &x[192..208];
        let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(q6_k_offsets(sc, y), 5));
        for n2 in 0..2 {
            // SAFETY: x has 210 bytes (ql 0..128, qh 128..192); y qs at 4..260.
            let (ql0, ql1, qh) = unsafe {
                (
                    load256(x.as_ptr().add(64 * n2)),
                    load256(x.as_ptr().add(64 * n2 + 32)),
                    load256(x.as_ptr().add(128 + 32 * n2)),
                )
            };
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4),
                ),
            ];
            for (k, &qk) in q.iter().enumerate() {
                // SAFETY: 4 + 128*n2 + 32*k + 32 <= 260.
                let yk = unsafe { load256(y.as_ptr().add(4 + 128 * n2 + 32 * k)) };
                let s0 = sc[8 * n2 + 2 * k] as i8 as i16;
                let s1 = sc[8 * n2 + 2 * k + 1] as i8 as i16;
                let scv = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qk, yk), scv);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        // As ggml-cpu: eight f32 lanes, one fused multiply-add per block, summed at the end.
        let d = _mm256_set1_ps(rd_f32(y, 0) * f16c(x, 208));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

// ---------------------------------------------------------------------------
// Multi-row kernels: one weight row against R activation rows, decoding each weight
// block once (used by prefill matmul).
// ---------------------------------------------------------------------------

/// Decodes a Q4_0/Q5_0/Q8_0/MXFP4 weight block to (scale, 32 signed i8 values).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_0(wtype: WeightType, x: &[u8]) -> (f32, __m256i) {
    match wtype {
        WeightType::Q4_0 => {
            assert!(x.len() >= Q4_0_BYTES);
            // SAFETY: 18-byte block asserted.
            let q = unsafe { nibbles_32(x.as_ptr().add(2)) };
            (f16c(x, 0), _mm256_sub_epi8(q, _mm256_set1_epi8(8)))
        }
        WeightType::Q5_0 => {
            assert!(x.len() >= Q5_0_BYTES);
            let shuf = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3,
                3,
            );
            let bitmask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            let hb = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), shuf);
            let hb = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bitmask), bitmask);
            // SAFETY: 22-byte block asserted.
            let q = unsafe { nibbles_32(x.as_ptr().add(6)) };
            let q = _mm256_sub_epi8(q, _mm256_andnot_si256(hb, _mm256_set1_epi8(16)));
            (f16c(x, 0), q)
        }
        WeightType::Mxfp4 => {
            assert!(x.len() >= MXFP4_BYTES);
            // SAFETY: 17-byte block asserted.
            (e8m0_to_f32_half(x[0]), unsafe { mxfp4_values(x.as_ptr()) })
        }
        _ => {
            assert!(x.len() >= Q8_0_BYTES);
            // SAFETY: 34-byte block asserted.
            (f16c(x, 0), unsafe { load256(x.as_ptr().add(2)) })
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_0<const R: usize>(wtype: WeightType, w: &[u8], a: &[&[u8]; R], n: usize) -> [f32; R] {
    let nb = n / QK;
    let xb = wtype.block_bytes();
    assert!(w.len() >= nb * xb && a.iter().all(|y| y.len() >= nb * Q8_0_BYTES));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let (dx, qx) = decode_0(wtype, &w[i * xb..]);
        let ax = _mm256_sign_epi8(qx, qx);
        for r in 0..R {
            let y = &a[r][i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
            // SAFETY: y is a 34-byte block.
            let qy = unsafe { load256(y.as_ptr().add(2)) };
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, qx)), ones);
            let d = _mm256_set1_ps(dx * f16c(y, 0));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// `W` Q4_0/Q5_0/Q8_0 weight rows (block decoder `dec`) against `R` Q8_0 activation rows:
/// each weight block is decoded once and each activation block loaded once per step, with
/// `W × R` independent accumulators; `out[wi * R + r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_0<const W: usize, const R: usize, D: Fn(*const u8) -> (f32, __m256i)>(
    xb: usize,
    w: &[&[u8]; W],
    a: &[&[u8]; R],
    n: usize,
    out: &mut [f32],
    dec: D,
) {
    let nb = n / QK;
    assert!(n.is_multiple_of(QK) && out.len() >= W * R);
    assert!(w.iter().all(|x| x.len() >= nb * xb) && a.iter().all(|y| y.len() >= nb * Q8_0_BYTES));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    let wp = w.map(|x| x.as_ptr());
    let ap = a.map(|y| y.as_ptr());
    for i in 0..nb {
        let mut dy = [_mm256_setzero_ps(); R];
        let mut qy = [_mm256_setzero_si256(); R];
        for r in 0..R {
            // SAFETY: block i < nb of a row holding nb 34-byte blocks (asserted above).
            unsafe {
                let y = ap[r].add(i * Q8_0_BYTES);
                dy[r] = _mm256_set1_ps(f16c_at(y));
                qy[r] = load256(y.add(2));
            }
        }
        for wi in 0..W {
            // SAFETY: block i < nb of a row holding nb `xb`-byte blocks (asserted above).
            let (dx, qx) = dec(unsafe { wp[wi].add(i * xb) });
            let dx = _mm256_set1_ps(dx);
            let ax = _mm256_sign_epi8(qx, qx);
            for r in 0..R {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy[r], qx)), ones);
                acc[wi][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[r]), _mm256_cvtepi32_ps(p), acc[wi][r]);
            }
        }
    }
    for wi in 0..W {
        for r in 0..R {
            out[wi * R + r] = hsum_ps(acc[wi][r]);
        }
    }
}

/// Runs [`tile_0`] for one `_0` weight type with its decoder inlined.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_0_typed<const W: usize, const R: usize>(
    wtype: WeightType,
    w: &[&[u8]; W],
    a: &[&[u8]; R],
    n: usize,
    out: &mut [f32],
) -> bool {
    match wtype {
        // SAFETY (closures): `tile_0` passes pointers to whole blocks inside checked rows.
        WeightType::Q4_0 => tile_0(Q4_0_BYTES, w, a, n, out, |x| unsafe {
            (
                f16c_at(x),
                _mm256_sub_epi8(nibbles_32(x.add(2)), _mm256_set1_epi8(8)),
            )
        }),
        WeightType::Q5_0 => tile_0(Q5_0_BYTES, w, a, n, out, |x| unsafe {
            (f16c_at(x), q5_0_values(x))
        }),
        WeightType::Q8_0 => tile_0(Q8_0_BYTES, w, a, n, out, |x| unsafe {
            (f16c_at(x), load256(x.add(2)))
        }),
        WeightType::Mxfp4 => tile_0(MXFP4_BYTES, w, a, n, out, |x| unsafe {
            (e8m0_to_f32_half(*x), mxfp4_values(x))
        }),
        _ => return false,
    }
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_k45<const R: usize>(five: bool, gemv: bool, w: &[u8], a: &[&[u8]; R], n: usize) -> [f32; R] {
    let nb = n / QK_K;
    let xb = if five { Q5_K_BYTES } else { Q4_K_BYTES };
    assert!(w.len() >= nb * xb && a.iter().all(|y| y.len() >= nb * Q8_K_BYTES));
    let qs_off = if five { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc4 = [0.0f32; R];
    let mut accm = [0.0f32; R];
    for i in 0..nb {
        let x = &w[i * xb..(i + 1) * xb];
        let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
        let (d, dmin) = (f16c(x, 0), f16c(x, 2));
        // SAFETY: Q5_K blocks have qh at 16..48 (only read when `five`).
        let hbits = if five {
            unsafe { load256(x.as_ptr().add(16)) }
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); R];
        let mut isum = [[_mm256_setzero_si256(); 4]; R];
        for j in 0..4 {
            // SAFETY: qs_off + 32*j + 32 <= block size.
            let q = unsafe { load256(x.as_ptr().add(qs_off + 32 * j)) };
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if five {
                let sh = _mm_cvtsi32_si128(2 * j as i32);
                let sh1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
                let h0 = _mm256_and_si256(_mm256_srl_epi16(hbits, sh), one);
                let h1 = _mm256_and_si256(_mm256_srl_epi16(hbits, sh1), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
            }
            let s0 = _mm256_set1_epi16(sc[2 * j] as i16);
            let s1 = _mm256_set1_epi16(sc[2 * j + 1] as i16);
            for r in 0..R {
                let y = a[r][i * Q8_K_BYTES..].as_ptr();
                // SAFETY: y points at a 292-byte block; qs at 4..260.
                let (y0, y1) = unsafe { (load256(y.add(4 + 64 * j)), load256(y.add(36 + 64 * j))) };
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s1);
                if five {
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p0, p1));
                } else {
                    isum[r][j] = _mm256_add_epi32(p0, p1);
                }
            }
        }
        for r in 0..R {
            let y = &a[r][i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
            let yd = rd_f32(y, 0);
            if five {
                accm[r] += dmin * yd * k_min_sum(y, &m) as f32;
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            } else {
                // ggml-cpu's 4-row repacked Q4_K gemm (`ggml_gemm_q4_K_8x8_q8_K`) accumulates
                // every pair of sub-blocks (64 values) separately, not whole blocks.
                let (is, ms) = (hsum4_epi32(isum[r]), k_min_sums_64(y, &m));
                if gemv {
                    // The single-row order (`q4_k_q8_k_impl`): whole-block integer sums.
                    let (is, ms) = (is.iter().sum(), ms.iter().sum());
                    (acc4[r], accm[r]) = q4_k_block_acc(acc4[r], accm[r], is, ms, d, dmin, yd);
                    continue;
                }
                for j in 0..4 {
                    (acc4[r], accm[r]) = q4_k_block_acc(acc4[r], accm[r], is[j], ms[j], d, dmin, yd);
                }
            }
        }
    }
    if five {
        std::array::from_fn(|r| hsum_ps(acc[r]) - accm[r])
    } else {
        std::array::from_fn(|r| acc4[r] - accm[r])
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_q6_k<const R: usize>(w: &[u8], a: &[&[u8]; R], n: usize) -> [f32; R] {
    let nb = n / QK_K;
    assert!(w.len() >= nb * Q6_K_BYTES && a.iter().all(|y| y.len() >= nb * Q8_K_BYTES));
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let x = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        let sc = &x[192..208];
        let mut sumi = [_mm256_setzero_si256(); R];
        for n2 in 0..2 {
            // SAFETY: ql at 0..128 and qh at 128..192 of a 210-byte block.
            let (ql0, ql1, qh) = unsafe {
                (
                    load256(x.as_ptr().add(64 * n2)),
                    load256(x.as_ptr().add(64 * n2 + 32)),
                    load256(x.as_ptr().add(128 + 32 * n2)),
                )
            };
            let hsh = |k: i32| {
                let h = match k {
                    0 => qh,
                    1 => _mm256_srli_epi16(qh, 2),
                    2 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(h, m3), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), hsh(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), hsh(1)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hsh(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hsh(3)),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let s0 = sc[8 * n2 + 2 * k] as i8 as i16;
                let s1 = sc[8 * n2 + 2 * k + 1] as i8 as i16;
                let scv = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                for r in 0..R {
                    // SAFETY: 4 + 128*n2 + 32*k + 32 <= 260 within a 292-byte block.
                    let yk = unsafe { load256(a[r][i * Q8_K_BYTES..].as_ptr().add(4 + 128 * n2 + 32 * k)) };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qk, yk), scv);
                    sumi[r] = _mm256_add_epi32(sumi[r], p);
                }
            }
        }
        let d = f16c(x, 208);
        for r in 0..R {
            let y = &a[r][i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
            let off = _mm256_slli_epi32(q6_k_offsets(sc, y), 5);
            let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r], off));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(rd_f32(y, 0) * d), s, acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_ps(acc[r]))
}

/// [`dot4`] with each row's result bit for bit that of the single-row kernel (`vec_dot`): the
/// 4-row Q4_K kernel otherwise follows ggml's gemm order, which rounds differently.
pub(crate) fn dot4_gemv(wtype: WeightType, w: &[u8], a: &[&[u8]; 4], n: usize) -> Option<[f32; 4]> {
    match wtype {
        // SAFETY: only installed in the dispatch table after AVX2+FMA+F16C were detected.
        WeightType::Q4_K => Some(unsafe { rows_k45(false, true, w, a, n) }),
        _ => dot4(wtype, w, a, n),
    }
}

/// AVX2 dot of one quantized weight row against four activation rows (None for float types).
pub(crate) fn dot4(wtype: WeightType, w: &[u8], a: &[&[u8]; 4], n: usize) -> Option<[f32; 4]> {
    // SAFETY: only installed in the dispatch table after AVX2+FMA+F16C were detected.
    unsafe {
        match wtype {
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::Mxfp4 => {
                Some(rows_0(wtype, w, a, n))
            }
            WeightType::Q4_K => Some(rows_k45(false, false, w, a, n)),
            WeightType::Q5_K => Some(rows_k45(true, false, w, a, n)),
            WeightType::Q6_K => Some(rows_q6_k(w, a, n)),
            _ => None,
        }
    }
}

/// Several weight rows × several quantized activation rows (`out[wi * acts + r]`); false
/// when no tile kernel covers this type and shape.
pub(crate) fn tile(wtype: WeightType, w: &[&[u8]], a: &[&[u8]], n: usize, out: &mut [f32]) -> bool {
    // SAFETY: only installed in the dispatch table after AVX2+FMA+F16C were detected.
    unsafe {
        match (w, a) {
            ([w0, w1], [a0, a1, a2, a3]) => tile_0_typed::<2, 4>(wtype, &[w0, w1], &[a0, a1, a2, a3], n, out),
            _ => false,
        }
    }
}

/// `nrows` consecutive Q4_0/Q5_0/Q8_0/MXFP4 weight rows at `w` against up to eight Q8_0
/// activation rows into `out[r * acts.len() + j]`: two weight rows × four activation rows per
/// tile call, each result bit for bit the single-row kernel's (the tiles round each pair as
/// `vec_dot` does); false for other types or counts.
pub(crate) fn rows_many(
    wtype: WeightType,
    w: &[u8],
    nrows: usize,
    n: usize,
    acts: &[&[u8]],
    out: &mut [f32],
) -> bool {
    let na = acts.len();
    let covered = matches!(
        wtype,
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::Mxfp4
    );
    if !covered || !super::many_call_fits(wtype, w, nrows, n, acts, out) {
        return false;
    }
    let rb = wtype.row_bytes(n);
    let row = |r: usize| &w[r * rb..(r + 1) * rb];
    let mut tile = [0.0f32; 8];
    let mut r = 0;
    while r < nrows {
        // Two weight rows (the last one twice at an odd end), activation rows four at a time.
        let pair = [row(r), row((r + 1).min(nrows - 1))];
        let mut j = 0;
        while j < na {
            let take = (na - j).min(4);
            let a: [&[u8]; 4] = std::array::from_fn(|i| acts[j + i.min(take - 1)]);
            // SAFETY: only installed in the dispatch table after AVX2+FMA+F16C were detected.
            let ok = unsafe { tile_0_typed::<2, 4>(wtype, &pair, &a, n, &mut tile) };
            assert!(ok, "tile covers the _0 types");
            for wi in 0..2.min(nrows - r) {
                for i in 0..take {
                    out[(r + wi) * na + j + i] = tile[wi * 4 + i];
                }
            }
            j += take;
        }
        r += 2;
    }
    true
}

/// f32 · f32 over raw pointers, `n` elements.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32_ptr(w: *const f32, x: *const f32, n: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (whole body): caller guarantees n readable f32 at both pointers (any alignment).
    unsafe {
        while i + 32 <= n {
            for (u, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * u;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(o)), _mm256_loadu_ps(x.add(o)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(x.add(i)), acc[0]);
            i += 8;
        }
        let mut s = hsum_ps(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            // Unaligned reads: `w` may come from a byte slice (an f32 weight row in a mapped file).
            s += w.add(i).read_unaligned() * x.add(i).read_unaligned();
            i += 1;
        }
        s
    }
}

/// `acc[a][c] += w[a][i..i + 8] * x[c][i..i + 8]` lane-wise, each weight and activation
/// vector loaded once.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_tile_step<const R: usize, const C: usize>(
    acc: &mut [[__m256; C]; R],
    w: &[*const f32; R],
    x: &[*const f32; C],
    i: usize,
) {
    // SAFETY: the caller guarantees i + 8 <= n readable f32 at every pointer.
    unsafe {
        let mut wv = [_mm256_setzero_ps(); R];
        for a in 0..R {
            wv[a] = _mm256_loadu_ps(w[a].add(i));
        }
        for c in 0..C {
            let xv = _mm256_loadu_ps(x[c].add(i));
            for a in 0..R {
                acc[a][c] = _mm256_fmadd_ps(wv[a], xv, acc[a][c]);
            }
        }
    }
}

/// [`f32_tile_step`] at `i`, `i + step`, ... below `end`, on accumulators kept in registers
/// (a call of its own, so the tile's other state does not crowd them out).
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_tile_run<const R: usize, const C: usize>(
    acc: &mut [[__m256; C]; R],
    w: &[*const f32; R],
    x: &[*const f32; C],
    (mut i, end, step): (usize, usize, usize),
) {
    let mut a = *acc;
    while i < end {
        // SAFETY: the caller guarantees every step's lanes readable at every pointer.
        unsafe { f32_tile_step(&mut a, w, x, i) };
        i += step;
    }
    *acc = a;
}

/// Elements of k per block of [`f32_tile`], whose four passes over a block read each cache line
/// twice: the block of every row of a tile stays in L1 for the second read.
const F32_K_BLOCK: usize = 512;

/// An `R` × `C` tile of [`dot_f32_ptr`]s, each bit for bit the single row's: that kernel's
/// lane `l` of accumulator `u` sums the products at `32 t + 8 u + l` in order of `t` (then, for
/// `u = 0`, the 8-wide steps past the last 32), and the four accumulators only meet in the final
/// sum, so the tile runs the same fused multiply-adds one accumulator at a time (four passes
/// over each block of `k`, the block in L1) with one register per (weight row, activation row)
/// pair.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn f32_tile<const R: usize, const C: usize>(
    w: [*const f32; R],
    x: [*const f32; C],
    n: usize,
) -> [[f32; C]; R] {
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    let mut parts = [[[_mm256_setzero_ps(); C]; R]; 4];
    // SAFETY (whole body): caller guarantees n readable f32 at every pointer (any alignment).
    unsafe {
        // Blocks of k that stay in L1 for every pass; each lane still takes its products in
        // order of k.
        let mut k0 = 0;
        while k0 < n32 {
            let k1 = (k0 + F32_K_BLOCK).min(n32);
            for (u, part) in parts.iter_mut().enumerate() {
                f32_tile_run(part, &w, &x, (k0 + 8 * u, k1, 32));
            }
            k0 = k1;
        }
        // The 8-wide steps past the last 32 go to accumulator 0 only, as in `dot_f32_ptr`.
        f32_tile_run(&mut parts[0], &w, &x, (n32, n8, 8));
        std::array::from_fn(|a| {
            std::array::from_fn(|c| {
                let [p0, p1, p2, p3] = [0, 1, 2, 3].map(|u| parts[u][a][c]);
                let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3)));
                for i in n8..n {
                    s += w[a].add(i).read_unaligned() * x[c].add(i).read_unaligned();
                }
                s
            })
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f32_impl(w: &[u8], x: &[f32], n: usize) -> f32 {
    assert!(w.len() >= 2 * n && x.len() >= n);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    // SAFETY (whole body): bounds asserted above; unaligned loads.
    unsafe {
        while i + 32 <= n {
            for (u, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * u;
                let wv = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * o) as *const __m128i));
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(o)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * i) as *const __m128i));
            acc[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
    }
    let mut s = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += rd_f16(w, 2 * i) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_f32_impl(w: &[u8], x: &[f32], n: usize) -> f32 {
    assert!(w.len() >= 2 * n && x.len() >= n);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    // SAFETY (whole body): bounds asserted above; unaligned loads.
    unsafe {
        while i + 16 <= n {
            for (u, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * u;
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(wp.add(2 * o) as *const __m128i));
                let wv = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(o)), *a);
            }
            i += 16;
        }
    }
    let mut s = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    while i < n {
        s += crate::quant::bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])) * x[i];
        i += 1;
    }
    s
}

// ---------------------------------------------------------------------------
// Activation quantizers (bit-identical to the scalar references in `quant`).
// ---------------------------------------------------------------------------

/// Largest |x| over `n` floats at `p` (`n` a multiple of 8).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn abs_max(p: *const f32, n: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for j in (0..n).step_by(8) {
        // SAFETY: caller guarantees n readable floats at p.
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(p.add(j)) }));
    }
    let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// Packs four vectors of i32 (each in -128..=127) into 32 i8 in order at `dst`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_i8x32(v: [__m256i; 4], dst: *mut u8) {
    let a = _mm256_packs_epi32(v[0], v[1]);
    let b = _mm256_packs_epi32(v[2], v[3]);
    let q = _mm256_packs_epi16(a, b);
    // Undo the per-lane interleave of the two packs.
    let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: caller guarantees 32 writable bytes at dst.
    unsafe { _mm256_storeu_si256(dst as *mut __m256i, q) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_0_impl(x: &[f32], dst: &mut [u8]) {
    let nb = x.len() / QK;
    assert!(x.len().is_multiple_of(QK) && dst.len() >= nb * Q8_0_BYTES);
    for i in 0..nb {
        // SAFETY: block i < nb lies inside x (32 floats) and dst (34 bytes), checked above.
        unsafe {
            let xp = x.as_ptr().add(i * QK);
            let b = dst.as_mut_ptr().add(i * Q8_0_BYTES);
            let amax = abs_max(xp, QK);
            // As ggml-cpu (x86) and the scalar reference: multiplier 127 / amax, ties to even.
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            (b as *mut u16).write_unaligned(crate::quant::f32_to_f16(amax / 127.0));
            let mut q = [_mm256_setzero_si256(); 4];
            for (j, qj) in q.iter_mut().enumerate() {
                let v = _mm256_mul_ps(_mm256_loadu_ps(xp.add(8 * j)), id);
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                *qj = _mm256_cvtps_epi32(r);
            }
            store_i8x32(q, b.add(2));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_k_impl(x: &[f32], dst: &mut [u8]) {
    let nb = x.len() / QK_K;
    assert!(x.len().is_multiple_of(QK_K) && dst.len() >= nb * Q8_K_BYTES);
    for i in 0..nb {
        let xb = &x[i * QK_K..(i + 1) * QK_K];
        let b = &mut dst[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        // SAFETY: xb holds 256 floats.
        let amax = unsafe { abs_max(xb.as_ptr(), QK_K) };
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        // The first element of largest magnitude, with its sign (as the reference picks it).
        let max = *xb.iter().find(|v| v.abs() == amax).expect("amax comes from xb");
        let iscale = -127.0 / max;
        let s = _mm256_set1_ps(iscale);
        let hi = _mm256_set1_epi32(127);
        let ones = _mm256_set1_epi16(1);
        for g in 0..8 {
            let mut q = [_mm256_setzero_si256(); 4];
            for (j, qj) in q.iter_mut().enumerate() {
                // SAFETY: 32 * g + 8 * j + 8 <= 256 floats of xb.
                let v = unsafe { _mm256_loadu_ps(xb.as_ptr().add(32 * g + 8 * j)) };
                // cvtps rounds to nearest even in the default MXCSR mode, like round_ties_even.
                *qj = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, s)), hi);
            }
            // SAFETY: bytes 4 + 32g .. 4 + 32g + 32 lie inside the 292-byte block.
            unsafe { store_i8x32(q, b.as_mut_ptr().add(4 + 32 * g)) };
            // Sums of each 16 values (two per group of 32) for the bsums.
            // SAFETY: as above.
            let v = unsafe { load256(b.as_ptr().add(4 + 32 * g)) };
            let w = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), ones);
            let s0 = _mm_add_epi32(
                _mm256_castsi256_si128(w),
                _mm_shuffle_epi32(_mm256_castsi256_si128(w), 0b01_00_11_10),
            );
            let s1 = _mm_add_epi32(
                _mm256_extracti128_si256(w, 1),
                _mm_shuffle_epi32(_mm256_extracti128_si256(w, 1), 0b01_00_11_10),
            );
            let lo = _mm_cvtsi128_si32(s0) + _mm_extract_epi32(s0, 1);
            let hi_ = _mm_cvtsi128_si32(s1) + _mm_extract_epi32(s1, 1);
            b[260 + 4 * g..262 + 4 * g].copy_from_slice(&(lo as i16).to_le_bytes());
            b[262 + 4 * g..264 + 4 * g].copy_from_slice(&(hi_ as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

// Safe wrappers. SAFETY for all: these are only reachable through the dispatch table,
// which installs them only after `is_x86_feature_detected!` confirmed avx2, fma and f16c.

/// AVX2 Q4_0·Q8_0 (only call when AVX2+FMA+F16C are present).
pub(crate) fn q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { q4_0_q8_0_impl(w, a, n) }
}
/// AVX2 Q5_0·Q8_0 (only call when AVX2+FMA+F16C are present).
pub(crate) fn q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { q5_0_q8_0_impl(w, a, n) }
}
/// AVX2 Q8_0·Q8_0 (only call when AVX2+FMA+F16C are present).
pub(crate) fn q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { q8_0_q8_0_impl(w, a, n) }
}
/// AVX2 MXFP4·Q8_0 (only call when AVX2+FMA+F16C are present).
pub(crate) fn mxfp4_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { mxfp4_q8_0_impl(w, a, n) }
}
/// AVX2 Q4_K·Q8_K (only call when AVX2+FMA+F16C are present).
pub(crate) fn q4_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { q4_k_q8_k_impl(w, a, n) }
}
/// AVX2 Q5_K·Q8_K (only call when AVX2+FMA+F16C are present).
pub(crate) fn q5_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { q5_k_q8_k_impl(w, a, n) }
}
/// AVX2 Q6_K·Q8_K (only call when AVX2+FMA+F16C are present).
pub(crate) fn q6_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { q6_k_q8_k_impl(w, a, n) }
}
/// AVX2 F32·F32 over raw weight bytes (only call when AVX2+FMA are present).
pub(crate) fn f32_f32(w: &[u8], x: &[f32], n: usize) -> f32 {
    assert!(w.len() >= 4 * n && x.len() >= n);
    // SAFETY: see the note above the wrappers; bounds asserted; loads are unaligned.
    unsafe { dot_f32_ptr(w.as_ptr() as *const f32, x.as_ptr(), n) }
}
/// AVX2 F32 weight rows × many activation rows in 3 × 4 tiles, bit for bit [`f32_f32`]
/// (only call when AVX2+FMA are present).
pub(crate) fn f32_rows(w: &[u8], nrows: usize, n: usize, acts: &[&[f32]], out: &mut [f32]) {
    super::f32_rows_tiled::<3, 4>(w, nrows, n, acts, out, f32_tile::<3, 4>, f32_f32);
}
/// AVX2 F16·F32 (only call when AVX2+FMA+F16C are present).
pub(crate) fn f16_f32(w: &[u8], x: &[f32], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { f16_f32_impl(w, x, n) }
}
/// AVX2 BF16·F32 (only call when AVX2+FMA are present).
pub(crate) fn bf16_f32(w: &[u8], x: &[f32], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { bf16_f32_impl(w, x, n) }
}
/// AVX2 f32·f32 (only call when AVX2+FMA are present).
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: see the note above the wrappers; n is within both slices.
    unsafe { dot_f32_ptr(a.as_ptr(), b.as_ptr(), n) }
}
/// AVX2 Q8_0 activation quantizer (only call when AVX2+FMA+F16C are present).
pub(crate) fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    // SAFETY: see the note above the wrappers.
    unsafe { quantize_q8_0_impl(x, dst) }
}
/// AVX2 Q8_K activation quantizer (only call when AVX2+FMA+F16C are present).
pub(crate) fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    // SAFETY: see the note above the wrappers.
    unsafe { quantize_q8_k_impl(x, dst) }
}

/// The AVX2+FMA+F16C table; None when this CPU lacks one of them.
pub(crate) fn table() -> Option<super::DotTable> {
    if !crate::KernelLevel::Avx2.supported() {
        return None;
    }
    Some(super::DotTable {
        name: "avx2",
        q4_0: q4_0_q8_0,
        q5_0: q5_0_q8_0,
        q8_0: q8_0_q8_0,
        mxfp4: mxfp4_q8_0,
        q4_k: q4_k_q8_k,
        q5_k: q5_k_q8_k,
        q6_k: q6_k_q8_k,
        f32: f32_f32,
        f16: f16_f32,
        bf16: bf16_f32,
        dot_f32,
        f32_rows,
        dot4: Some(dot4),
        dot4_gemv: Some(dot4_gemv),
        tile: Some(tile),
        tile_rows: 2,
        rows_many: Some(rows_many),
    })
}
