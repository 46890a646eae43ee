//! AVX-512 (F, BW, VL, DQ and VNNI) dot products for the weight types of the real model packs,
//! where prompt processing spends its time: Q4_0/Q5_0/Q8_0 tiles (2 or 4 weight rows × 4
//! activation rows), Q4_K and Q6_K four-row kernels, Q6_K single rows, and F32 tiles (4 weight
//! rows × 6 activation rows, for f32 embedding models' batches). Every other entry of
//! the table is the AVX2 one (single rows of the other types stream weights from memory in
//! decode, and measured no faster here).
//!
//! Every result here equals the AVX2 table's bit for bit, so llama.cpp parity is unchanged:
//! the integer sums are exact in any order (VNNI `vpdpbusd` of activations made unsigned,
//! `y + 128`, with signed weights, starting from `-128 · Σ w`; or `vpmaddubsw` over 64 bytes),
//! and the float steps are the AVX2 kernels' own per lane (the same products, fused
//! multiply-adds in the same order, the same horizontal sums), with two of their 8-lane
//! accumulators side by side in one 16-lane register.

use super::avx2::{
    f16c, f16c_at, hsum4_epi32, hsum_ps, k_min_sums_64, load256, nibbles_32, prefetch_block, q4_k_block_acc,
    q6_k_offsets,
};
use crate::quant::WeightType;
use crate::quant::{
    rd_f32, unpack_scales_mins_k4, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES,
    QK, QK_K,
};
use std::arch::x86_64::*;

/// True when this CPU has every feature these kernels use.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Two 256-bit integer vectors as one 512-bit vector (`lo` in the low half).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Two 256-bit float vectors as one 512-bit vector (`lo` in the low half).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn join_ps(lo: __m256, hi: __m256) -> __m512 {
    _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
}

/// The low and high 8-lane halves of a 16-lane float vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn halves_ps(v: __m512) -> (__m256, __m256) {
    (_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v))
}

/// Lane-wise sum of the two 8-lane halves of a 16-lane i32 vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Reads 64 bytes at `p` (unaligned).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn load512(p: *const u8) -> __m512i {
    // SAFETY: caller guarantees 64 readable bytes at p; unaligned load.
    unsafe { _mm512_loadu_si512(p as *const _) }
}

/// Q4_0 as the const parameter `K` of the `_0` kernels.
const Q4: u8 = 4;
/// Q5_0 as the const parameter `K` of the `_0` kernels.
const Q5: u8 = 5;
/// Q8_0 as the const parameter `K` of the `_0` kernels.
const Q8: u8 = 8;

/// Bytes per weight block of `_0` kind `K`.
const fn block_bytes(k: u8) -> usize {
    match k {
        Q4 => Q4_0_BYTES,
        Q5 => Q5_0_BYTES,
        _ => Q8_0_BYTES,
    }
}

/// Decodes the `_0` weight block of kind `K` at `x` to (scale, 32 signed values).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_s0<const K: u8>(x: *const u8) -> (f32, __m256i) {
    // SAFETY: caller guarantees a whole block of kind K at x (18, 22 or 34 bytes).
    unsafe {
        let d = f16c_at(x);
        match K {
            Q4 => (d, _mm256_sub_epi8(nibbles_32(x.add(2)), _mm256_set1_epi8(8))),
            Q5 => {
                // nibble - 16 where the fifth bit (bit e of qh for value e) is clear.
                let qh = (x.add(2) as *const u32).read_unaligned();
                let q = nibbles_32(x.add(6));
                (d, _mm256_mask_sub_epi8(q, !qh, q, _mm256_set1_epi8(16)))
            }
            _ => (d, load256(x.add(2))),
        }
    }
}

/// `2 P` `_0` weight rows of kind `K` against four Q8_0 activation rows (`out[wi * 4 + r]`),
/// bit for bit the AVX2 `tile_0`: each 16-lane accumulator holds the 8 lanes of two weight
/// rows. The activations are made unsigned (`y + 128`, once per block for all weight rows) for
/// `vpdpbusd` against the signed weights, which start from `-128 · Σ w` per 4-byte group.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn tile_0<const K: u8, const P: usize>(w: &[&[u8]], a: &[&[u8]; 4], n: usize, out: &mut [f32]) {
    let nb = n / QK;
    let xb = block_bytes(K);
    assert!(n.is_multiple_of(QK) && w.len() == 2 * P && out.len() >= 8 * P);
    assert!(w.iter().all(|x| x.len() >= nb * xb) && a.iter().all(|y| y.len() >= nb * Q8_0_BYTES));
    let bias = _mm512_set1_epi8(-128);
    let z = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); 4]; P];
    let wp: [*const u8; 4] = std::array::from_fn(|j| w[j.min(2 * P - 1)].as_ptr());
    let ap = a.map(|y| y.as_ptr());
    for i in 0..nb {
        let mut wv = [z; P];
        let mut start = [z; P];
        let mut dx = [_mm512_setzero_ps(); P];
        for p in 0..P {
            // SAFETY: block i < nb of rows holding nb blocks each (asserted above).
            let ((d0, w0), (d1, w1)) = unsafe {
                (
                    decode_s0::<K>(wp[2 * p].add(i * xb)),
                    decode_s0::<K>(wp[2 * p + 1].add(i * xb)),
                )
            };
            wv[p] = join(w0, w1);
            // -128 · Σ w over each 4-byte group: (y + 128) · w summed from here is y · w.
            start[p] = _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, bias, wv[p]));
            dx[p] = join_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        }
        for r in 0..4 {
            // SAFETY: block i < nb of an activation row holding nb 34-byte blocks.
            let (dy, y) = unsafe {
                let y = ap[r].add(i * Q8_0_BYTES);
                (
                    _mm512_set1_ps(f16c_at(y)),
                    _mm512_broadcast_i64x4(load256(y.add(2))),
                )
            };
            let yu = _mm512_xor_si512(y, bias);
            for p in 0..P {
                let v = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start[p], yu, wv[p]));
                acc[p][r] = _mm512_fmadd_ps(_mm512_mul_ps(dx[p], dy), v, acc[p][r]);
            }
        }
    }
    for (p, accp) in acc.iter().enumerate() {
        for (r, &v) in accp.iter().enumerate() {
            let (lo, hi) = halves_ps(v);
            out[8 * p + r] = hsum_ps(lo);
            out[8 * p + 4 + r] = hsum_ps(hi);
        }
    }
}

/// One Q4_K weight row against `R` Q8_K activation rows, bit for bit the AVX2 kernels: with
/// `gemv` the single-row order (whole-block integer sums), else ggml's 4-row gemm order (one
/// fused multiply-add per 64 values). Each step multiplies 64 weights (the low and high
/// nibbles of 32 bytes) with the 64 matching activation bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn rows_q4_k<const R: usize>(gemv: bool, w: &[u8], a: &[&[u8]; R], n: usize) -> [f32; R] {
    let nb = n / QK_K;
    assert!(w.len() >= nb * Q4_K_BYTES && a.iter().all(|y| y.len() >= nb * Q8_K_BYTES));
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [0.0f32; R];
    let mut accm = [0.0f32; R];
    for i in 0..nb {
        let x = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
        let (d, dmin) = (f16c(x, 0), f16c(x, 2));
        let mut isum = [[_mm256_setzero_si256(); 4]; R];
        for j in 0..4 {
            // SAFETY: qs at 16..144 of the 144-byte block x.
            let q = unsafe { load256(x.as_ptr().add(16 + 32 * j)) };
            let q = join(
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
            );
            let s = join(
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
            );
            for r in 0..R {
                let y = &a[r][i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
                // SAFETY: y's quants at 4..260; 4 + 64 * j + 64 <= 260.
                let yv = unsafe { load512(y.as_ptr().add(4 + 64 * j)) };
                isum[r][j] = fold_halves(_mm512_madd_epi16(_mm512_maddubs_epi16(q, yv), s));
            }
        }
        for r in 0..R {
            let y = &a[r][i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
            let yd = rd_f32(y, 0);
            let (is, ms) = (hsum4_epi32(isum[r]), k_min_sums_64(y, &m));
            if gemv {
                let (is, ms) = (is.iter().sum(), ms.iter().sum());
                (acc[r], accm[r]) = q4_k_block_acc(acc[r], accm[r], is, ms, d, dmin, yd);
            } else {
                for j in 0..4 {
                    (acc[r], accm[r]) = q4_k_block_acc(acc[r], accm[r], is[j], ms[j], d, dmin, yd);
                }
            }
        }
    }
    std::array::from_fn(|r| acc[r] - accm[r])
}

/// `vpermw` indices spreading four consecutive i16 scales (from `4 g`) over eight lanes each.
const Q6_SCALE_IDX: [[i16; 32]; 4] = {
    let mut t = [[0i16; 32]; 4];
    let mut g = 0;
    while g < 4 {
        let mut e = 0;
        while e < 32 {
            t[g][e] = (4 * g + e / 8) as i16;
            e += 1;
        }
        g += 1;
    }
    t
};

/// One Q6_K weight row against `R` Q8_K activation rows, bit for bit the AVX2 kernels (8 i32
/// lanes per block, one fused multiply-add per block); each step covers 64 values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn rows_q6_k<const R: usize>(w: &[u8], a: &[&[u8]; R], n: usize) -> [f32; R] {
    let nb = n / QK_K;
    assert!(w.len() >= nb * Q6_K_BYTES && a.iter().all(|y| y.len() >= nb * Q8_K_BYTES));
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    // SAFETY: each index table holds 32 i16 (64 bytes).
    let idx: [__m512i; 4] =
        std::array::from_fn(|g| unsafe { load512(Q6_SCALE_IDX[g].as_ptr() as *const u8) });
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let x = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        if R == 1 {
            prefetch_block(x.as_ptr(), Q6_K_BYTES);
        }
        let sc = &x[192..208];
        // SAFETY: the 16 scale bytes at 192..208 of the 210-byte block.
        let scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(unsafe {
            _mm_loadu_si128(sc.as_ptr() as *const __m128i)
        }));
        let mut sumi = [_mm512_setzero_si512(); R];
        for n2 in 0..2 {
            // SAFETY: ql at 0..128 and qh at 128..192 of the block.
            let (ql0, ql1, qh) = unsafe {
                (
                    load256(x.as_ptr().add(64 * n2)),
                    load256(x.as_ptr().add(64 * n2 + 32)),
                    load256(x.as_ptr().add(128 + 32 * n2)),
                )
            };
            let hb = |h: __m256i| _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
            let q = [
                join(
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(_mm256_srli_epi16(qh, 2))),
                ),
                join(
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        hb(_mm256_srli_epi16(qh, 4)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        hb(_mm256_srli_epi16(qh, 6)),
                    ),
                ),
            ];
            for (kp, &qk) in q.iter().enumerate() {
                let s = _mm512_permutexvar_epi16(idx[2 * n2 + kp], scales);
                for r in 0..R {
                    // SAFETY: 4 + 128 * n2 + 64 * kp + 64 <= 260 within a 292-byte block.
                    let yv = unsafe { load512(a[r][i * Q8_K_BYTES..].as_ptr().add(4 + 128 * n2 + 64 * kp)) };
                    sumi[r] = _mm512_add_epi32(sumi[r], _mm512_madd_epi16(_mm512_maddubs_epi16(qk, yv), s));
                }
            }
        }
        let d = f16c(x, 208);
        for r in 0..R {
            let y = &a[r][i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
            let off = _mm256_slli_epi32(q6_k_offsets(sc, y), 5);
            let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(fold_halves(sumi[r]), off));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(rd_f32(y, 0) * d), s, acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_ps(acc[r]))
}

/// `acc[a][c] += w[a][i..i + 16] * x[c][i..i + 16]` lane-wise in the lanes of `mask`, each
/// weight and activation vector loaded once (only the masked lanes are read).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn f32_tile_step<const R: usize, const C: usize>(
    acc: &mut [[__m512; C]; R],
    w: &[*const f32; R],
    x: &[*const f32; C],
    i: usize,
    mask: __mmask16,
) {
    // SAFETY: the caller guarantees the masked lanes of [i, i + 16) readable at every pointer;
    // masked-off lanes are neither read nor changed.
    unsafe {
        let mut wv = [_mm512_setzero_ps(); R];
        for a in 0..R {
            wv[a] = _mm512_maskz_loadu_ps(mask, w[a].add(i));
        }
        for c in 0..C {
            let xv = _mm512_maskz_loadu_ps(mask, x[c].add(i));
            for a in 0..R {
                acc[a][c] = _mm512_mask3_fmadd_ps(wv[a], xv, acc[a][c], mask);
            }
        }
    }
}

/// The 8-wide steps from `n32` below `n8` in the low eight lanes, on accumulators loaded from and
/// stored back to `acc` (a call of its own, so the tile's main passes keep every register).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn f32_tile_tail<const R: usize, const C: usize>(
    acc: &mut [[__m512; C]; R],
    w: &[*const f32; R],
    x: &[*const f32; C],
    n32: usize,
    n8: usize,
) {
    let mut a = *acc;
    for i in (n32..n8).step_by(8) {
        // SAFETY: the caller guarantees n8 readable f32 at every pointer.
        unsafe { f32_tile_step(&mut a, w, x, i, 0x00ff) };
    }
    *acc = a;
}

/// An `R` × `C` tile of the AVX2 single-row F32 kernel, bit for bit: its accumulators 0 and 1
/// are the low and high halves of one 16-lane register fed from `32 t .. 32 t + 16` (and the
/// 8-wide steps past the last 32 in the low half alone), its accumulators 2 and 3 another fed
/// from `32 t + 16 .. 32 t + 32`; the two only meet in the final sum, so the tile makes one pass
/// over `k` per register, with one register per (weight row, activation row) pair.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn f32_tile<const R: usize, const C: usize>(
    w: [*const f32; R],
    x: [*const f32; C],
    n: usize,
) -> [[f32; C]; R] {
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    let mut parts = [[[_mm512_setzero_ps(); C]; R]; 2];
    // SAFETY (whole body): caller guarantees n readable f32 at every pointer (any alignment).
    unsafe {
        // The two passes read disjoint cache lines (where rows start on a line), so blocks of k
        // would save no reads, as AVX2's four passes do.
        for (h, part) in parts.iter_mut().enumerate() {
            // A local array, so the accumulators stay in registers.
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            let mut i = 16 * h;
            while i < n32 {
                f32_tile_step(&mut acc, &w, &x, i, 0xffff);
                i += 32;
            }
            *part = acc;
        }
        // The 8-wide steps past the last 32 go to the AVX2 kernel's accumulator 0 only.
        f32_tile_tail(&mut parts[0], &w, &x, n32, n8);
        std::array::from_fn(|a| {
            std::array::from_fn(|c| {
                let (lo, hi) = (parts[0][a][c], parts[1][a][c]);
                let p01 = _mm256_add_ps(_mm512_castps512_ps256(lo), _mm512_extractf32x8_ps::<1>(lo));
                let p23 = _mm256_add_ps(_mm512_castps512_ps256(hi), _mm512_extractf32x8_ps::<1>(hi));
                let mut s = hsum_ps(_mm256_add_ps(p01, p23));
                for i in n8..n {
                    s += w[a].add(i).read_unaligned() * x[c].add(i).read_unaligned();
                }
                s
            })
        })
    }
}

// Safe wrappers. SAFETY for all: these are only reachable through the dispatch table, which
// installs them only after `supported()` confirmed every feature the kernels enable.

/// AVX-512 Q6_K·Q8_K (only call when [`supported`]).
pub(crate) fn q6_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: see the note above the wrappers.
    unsafe { rows_q6_k::<1>(w, &[a], n)[0] }
}

/// AVX-512 F32 weight rows × many activation rows in 4 × 6 tiles, bit for bit the AVX2
/// single-row F32 kernel (only call when [`supported`]).
pub(crate) fn f32_rows(w: &[u8], nrows: usize, n: usize, acts: &[&[f32]], out: &mut [f32]) {
    super::f32_rows_tiled::<4, 6>(w, nrows, n, acts, out, f32_tile::<4, 6>, super::avx2::f32_f32);
}

/// AVX-512 dot of one weight row against four activation rows; other types go to AVX2.
pub(crate) fn dot4(wtype: WeightType, w: &[u8], a: &[&[u8]; 4], n: usize) -> Option<[f32; 4]> {
    match wtype {
        // SAFETY: see the note above the wrappers.
        WeightType::Q4_K => Some(unsafe { rows_q4_k(false, w, a, n) }),
        // SAFETY: see the note above the wrappers.
        WeightType::Q6_K => Some(unsafe { rows_q6_k(w, a, n) }),
        _ => super::avx2::dot4(wtype, w, a, n),
    }
}

/// [`dot4`] whose results equal the single-row kernels' bit for bit.
pub(crate) fn dot4_gemv(wtype: WeightType, w: &[u8], a: &[&[u8]; 4], n: usize) -> Option<[f32; 4]> {
    match wtype {
        // SAFETY: see the note above the wrappers.
        WeightType::Q4_K => Some(unsafe { rows_q4_k(true, w, a, n) }),
        // SAFETY: see the note above the wrappers.
        WeightType::Q6_K => Some(unsafe { rows_q6_k(w, a, n) }),
        _ => super::avx2::dot4_gemv(wtype, w, a, n),
    }
}

/// Two or four Q4_0/Q5_0/Q8_0 weight rows × four activation rows; other types go to the AVX2
/// tile (two rows at a time), other shapes to AVX2.
pub(crate) fn tile(wtype: WeightType, w: &[&[u8]], a: &[&[u8]], n: usize, out: &mut [f32]) -> bool {
    let ([a0, a1, a2, a3], 2 | 4) = (a, w.len()) else {
        return super::avx2::tile(wtype, w, a, n, out);
    };
    let acts = &[*a0, *a1, *a2, *a3];
    // SAFETY (each arm): see the note above the wrappers.
    unsafe {
        match (wtype, w.len()) {
            (WeightType::Q4_0, 2) => tile_0::<Q4, 1>(w, acts, n, out),
            (WeightType::Q5_0, 2) => tile_0::<Q5, 1>(w, acts, n, out),
            (WeightType::Q8_0, 2) => tile_0::<Q8, 1>(w, acts, n, out),
            (WeightType::Q4_0, _) => tile_0::<Q4, 2>(w, acts, n, out),
            (WeightType::Q5_0, _) => tile_0::<Q5, 2>(w, acts, n, out),
            (WeightType::Q8_0, _) => tile_0::<Q8, 2>(w, acts, n, out),
            // Other types: the AVX2 tile of two weight rows, twice for four.
            (_, 2) => return super::avx2::tile(wtype, w, a, n, out),
            _ => {
                let (lo, hi) = out.split_at_mut(8);
                return super::avx2::tile(wtype, &w[..2], a, n, lo)
                    && super::avx2::tile(wtype, &w[2..], a, n, hi);
            }
        }
    }
    true
}

thread_local! {
    /// Per-thread scratch of [`rows_many`]: the activation rows paired for 16-lane steps.
    static PAIRED: std::cell::RefCell<(Vec<__m512i>, Vec<__m512>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs of `_0` weight rows of kind `K` (`nrows` consecutive rows of `nb` blocks at `w`)
/// against `na ≤ 2 P` Q8_0 activation rows prepared in pairs (`yu[i * P + p]`: block `i` of
/// rows `2p` and `2p + 1` made unsigned, side by side; `dy[i * P + p]`: their scales, eight
/// lanes each), into `out[r * na + j]`. Two weight rows go through each step.
///
/// Bit for bit the single-row kernels: each half of a 16-lane accumulator is the single row's
/// eight lanes (the same exact integer group sums, `dx · dy` then one fused multiply-add per
/// block, in block order, and the same horizontal sum at the end).
///
/// # Safety
/// `w` holds `nrows · nb` whole blocks of kind `K`; `yu` and `dy` hold `nb · P` entries; `out`
/// holds `nrows · na`; the CPU has every feature enabled here.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_0_many<const K: u8, const P: usize>(
    w: *const u8,
    nrows: usize,
    nb: usize,
    yu: &[__m512i],
    dy: &[__m512],
    na: usize,
    out: &mut [f32],
) {
    let xb = block_bytes(K);
    let bias = _mm512_set1_epi8(-128);
    let z = _mm512_setzero_si512();
    let row_bytes = nb * xb;
    let mut store = |r: usize, acc: &[__m512; P]| {
        for (p, &v) in acc.iter().enumerate() {
            let (lo, hi) = halves_ps(v);
            out[r * na + 2 * p] = hsum_ps(lo);
            if 2 * p + 1 < na {
                out[r * na + 2 * p + 1] = hsum_ps(hi);
            }
        }
    };
    let mut r = 0;
    while r + 2 <= nrows {
        // SAFETY: rows r and r + 1 < nrows lie inside `w` (the caller's contract).
        let (x0, x1) = unsafe { (w.add(r * row_bytes), w.add((r + 1) * row_bytes)) };
        let mut acc0 = [_mm512_setzero_ps(); P];
        let mut acc1 = [_mm512_setzero_ps(); P];
        for i in 0..nb {
            // SAFETY: block i < nb of rows r and r + 1; the prefetch address is only a hint.
            let ((d0, q0), (d1, q1)) = unsafe {
                prefetch_block(x0.add(i * xb), xb);
                prefetch_block(x1.add(i * xb), xb);
                (decode_s0::<K>(x0.add(i * xb)), decode_s0::<K>(x1.add(i * xb)))
            };
            let (w0, w1) = (join(q0, q0), join(q1, q1));
            let s0 = _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, bias, w0));
            let s1 = _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, bias, w1));
            let (dx0, dx1) = (_mm512_set1_ps(d0), _mm512_set1_ps(d1));
            for p in 0..P {
                let (y, d) = (yu[i * P + p], dy[i * P + p]);
                let v0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(s0, y, w0));
                let v1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(s1, y, w1));
                acc0[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx0, d), v0, acc0[p]);
                acc1[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx1, d), v1, acc1[p]);
            }
        }
        store(r, &acc0);
        store(r + 1, &acc1);
        r += 2;
    }
    if r < nrows {
        // SAFETY: row r < nrows lies inside `w`.
        let x0 = unsafe { w.add(r * row_bytes) };
        let mut acc0 = [_mm512_setzero_ps(); P];
        for i in 0..nb {
            // SAFETY: block i < nb of row r.
            let (d0, q0) = unsafe { decode_s0::<K>(x0.add(i * xb)) };
            let w0 = join(q0, q0);
            let s0 = _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, bias, w0));
            let dx0 = _mm512_set1_ps(d0);
            for p in 0..P {
                let v0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(s0, yu[i * P + p], w0));
                acc0[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx0, dy[i * P + p]), v0, acc0[p]);
            }
        }
        store(r, &acc0);
    }
}

/// Pairs `acts` (Q8_0 rows of `nb` blocks) for [`rows_0_many`]: the last row stands in for a
/// missing partner.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn pair_acts(acts: &[&[u8]], nb: usize, yu: &mut Vec<__m512i>, dy: &mut Vec<__m512>) {
    let pairs = acts.len().div_ceil(2);
    let bias = _mm512_set1_epi8(-128);
    yu.clear();
    dy.clear();
    for i in 0..nb {
        for p in 0..pairs {
            let (a0, a1) = (acts[2 * p], acts[(2 * p + 1).min(acts.len() - 1)]);
            // SAFETY: block i < nb of rows holding nb 34-byte blocks (checked by the caller).
            unsafe {
                let (y0, y1) = (a0.as_ptr().add(i * Q8_0_BYTES), a1.as_ptr().add(i * Q8_0_BYTES));
                yu.push(_mm512_xor_si512(
                    join(load256(y0.add(2)), load256(y1.add(2))),
                    bias,
                ));
                dy.push(join_ps(_mm256_set1_ps(f16c_at(y0)), _mm256_set1_ps(f16c_at(y1))));
            }
        }
    }
}

/// `nrows` consecutive Q4_K or Q6_K weight rows against up to [`super::DotTable::MANY_MAX`] Q8_K activation
/// rows, each weight row decoded once for all of them, in the single-row order.
fn rows_many_k(wtype: WeightType, w: &[u8], nrows: usize, n: usize, acts: &[&[u8]], out: &mut [f32]) -> bool {
    let na = acts.len();
    if !super::many_call_fits(wtype, w, nrows, n, acts, out) {
        return false;
    }
    fn go<const R: usize>(
        wtype: WeightType,
        w: &[u8],
        nrows: usize,
        n: usize,
        acts: &[&[u8]],
        out: &mut [f32],
    ) {
        let rb = wtype.row_bytes(n);
        let a: [&[u8]; R] = std::array::from_fn(|j| acts[j]);
        for r in 0..nrows {
            let row = &w[r * rb..(r + 1) * rb];
            // SAFETY: see the note above the wrappers (the kernels check their slices).
            let v = unsafe {
                if wtype == WeightType::Q4_K {
                    rows_q4_k::<R>(true, row, &a, n)
                } else {
                    rows_q6_k::<R>(row, &a, n)
                }
            };
            out[r * R..(r + 1) * R].copy_from_slice(&v);
        }
    }
    match na {
        1 => go::<1>(wtype, w, nrows, n, acts, out),
        2 => go::<2>(wtype, w, nrows, n, acts, out),
        3 => go::<3>(wtype, w, nrows, n, acts, out),
        4 => go::<4>(wtype, w, nrows, n, acts, out),
        5 => go::<5>(wtype, w, nrows, n, acts, out),
        6 => go::<6>(wtype, w, nrows, n, acts, out),
        7 => go::<7>(wtype, w, nrows, n, acts, out),
        _ => go::<8>(wtype, w, nrows, n, acts, out),
    }
    true
}

/// [`rows_0_many`] of one kind and number of activation row pairs.
type ManyFn = unsafe fn(*const u8, usize, usize, &[__m512i], &[__m512], usize, &mut [f32]);

/// `nrows` consecutive Q4_0/Q5_0/Q8_0 weight rows at `w` against up to [`super::DotTable::MANY_MAX`] Q8_0
/// activation rows into `out[r * acts.len() + j]`, each result bit for bit the single-row
/// kernel's; false for other types or counts.
pub(crate) fn rows_many(
    wtype: WeightType,
    w: &[u8],
    nrows: usize,
    n: usize,
    acts: &[&[u8]],
    out: &mut [f32],
) -> bool {
    let na = acts.len();
    let kind = match wtype {
        WeightType::Q4_0 => Q4,
        WeightType::Q5_0 => Q5,
        WeightType::Q8_0 => Q8,
        WeightType::Q4_K | WeightType::Q6_K => return rows_many_k(wtype, w, nrows, n, acts, out),
        _ => return super::avx2::rows_many(wtype, w, nrows, n, acts, out),
    };
    if !super::many_call_fits(wtype, w, nrows, n, acts, out) {
        return false;
    }
    let nb = n / QK;
    PAIRED.with_borrow_mut(|(yu, dy)| {
        // SAFETY (the block): see the note above the wrappers; the lengths are asserted above.
        unsafe {
            pair_acts(acts, nb, yu, dy);
            let (w, yu, dy) = (w.as_ptr(), &yu[..], &dy[..]);
            // The kernel of the kind for pairs of activation rows (1 to 4 pairs).
            let by_pairs: [ManyFn; 4] = match kind {
                Q4 => [
                    rows_0_many::<Q4, 1>,
                    rows_0_many::<Q4, 2>,
                    rows_0_many::<Q4, 3>,
                    rows_0_many::<Q4, 4>,
                ],
                Q5 => [
                    rows_0_many::<Q5, 1>,
                    rows_0_many::<Q5, 2>,
                    rows_0_many::<Q5, 3>,
                    rows_0_many::<Q5, 4>,
                ],
                _ => [
                    rows_0_many::<Q8, 1>,
                    rows_0_many::<Q8, 2>,
                    rows_0_many::<Q8, 3>,
                    rows_0_many::<Q8, 4>,
                ],
            };
            by_pairs[na.div_ceil(2).min(4) - 1](w, nrows, nb, yu, dy, na, out);
        }
    });
    true
}

/// The AVX-512 table (F/BW/VL/DQ + VNNI): the AVX2 table with the tiles, the four-row
/// kernels, the Q6_K single rows and the F32 tiles replaced (equal to AVX2's bit for bit);
/// None when this CPU lacks a feature.
pub(crate) fn table() -> Option<super::DotTable> {
    if !supported() {
        return None;
    }
    Some(super::DotTable {
        name: "avx512",
        q6_k: q6_k_q8_k,
        dot4: Some(dot4),
        dot4_gemv: Some(dot4_gemv),
        tile: Some(tile),
        tile_rows: 4,
        rows_many: Some(rows_many),
        f32_rows,
        ..super::avx2::table()?
    })
}
