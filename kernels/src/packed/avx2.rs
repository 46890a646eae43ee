//! The AVX2 kernels (the `_0` kinds, Q4_K and Q6_K), on the same 16-row layout: each 64-byte line is two
//! 32-byte halves of 8 rows. `vpmaddubsw` + `vpmaddwd` stand in for `vpdpbusd`: nibble values
//! (at most 31) go in unsigned as stored; Q8_0's bytes are taken back to signed and multiplied
//! as `|w| · sign(y, w)`, so no pair of products can saturate 16 bits (at most 2 · 128 · 127).
//! The integer sums are exact, and the order of everything after them is the AVX-512 kernel's,
//! so every result equals [`reference_dot`] bit for bit.

use super::{quant_bytes, GroupArgs, GroupKernel, PackedTable, K4, K6, PACK_ROWS, Q4, Q5, Q8};
use crate::quant::Q8_0_BYTES;
use std::arch::x86_64::*;

/// This set's packed kernels.
pub(super) const TABLE: PackedTable = PackedTable {
    name: "avx2",
    batch,
    expanded_kind: U8,
    expand,
    kernel: group_kernel,
    // No pair kernels: two groups' accumulators would not fit AVX2's sixteen registers.
    pair_batch: 0,
    pair: |_| None,
};

/// The AVX2 kernels' name for an unpacked Q4_0/Q5_0 group: unsigned bytes in Q8_0's layout,
/// offset by the original kind's (Q8_0's own kernel takes its bytes signed). Never a stored
/// kind.
const U8: u8 = 80;

/// Activation rows per kernel call, every kind (sixteen YMM registers).
fn batch(_kd: u8) -> usize {
    4
}

/// The kernel for one 16-row group of kind `kd` (or [`U8`]) against `r ≤ 4` activation rows
/// (see [`GroupKernel`]).
fn group_kernel(kd: u8, r: usize) -> Option<GroupKernel> {
    let rows: &[GroupKernel] = match kd {
        Q4 => &[kernel::<Q4, 1>, kernel::<Q4, 2>, kernel::<Q4, 3>, kernel::<Q4, 4>],
        Q5 => &[kernel::<Q5, 1>, kernel::<Q5, 2>, kernel::<Q5, 3>, kernel::<Q5, 4>],
        Q8 => &[kernel_q8::<1>, kernel_q8::<2>, kernel_q8::<3>, kernel_q8::<4>],
        U8 => &[kernel::<U8, 1>, kernel::<U8, 2>, kernel::<U8, 3>, kernel::<U8, 4>],
        K4 => &[
            kernel_q4_k::<1>,
            kernel_q4_k::<2>,
            kernel_q4_k::<3>,
            kernel_q4_k::<4>,
        ],
        K6 => &[
            kernel_q6_k::<1>,
            kernel_q6_k::<2>,
            kernel_q6_k::<3>,
            kernel_q6_k::<4>,
        ],
        _ => &[],
    };
    rows.get(r.checked_sub(1)?).copied()
}

/// Vector `g`'s fifth bits as 0x10 in its bytes, from one half of Q5_0's bit-sliced fifth-bit
/// line (`qh`: bit `g` of each byte): the line shifted by `4 - g` in 16-bit lanes, which moves
/// bit `g` of every byte to bit 4 of the same byte (no bit that lands on bit 4 crosses a byte
/// for shifts of at most four left or three right).
///
/// # Safety
/// AVX2 is present; `g < 8`.
#[inline(always)]
unsafe fn fifth_bit(qh: __m256i, g: usize) -> __m256i {
    let at4 = match g {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<3>(qh),
        2 => _mm256_slli_epi16::<2>(qh),
        3 => _mm256_slli_epi16::<1>(qh),
        4 => qh,
        5 => _mm256_srli_epi16::<1>(qh),
        6 => _mm256_srli_epi16::<2>(qh),
        _ => _mm256_srli_epi16::<3>(qh),
    };
    _mm256_and_si256(at4, _mm256_set1_epi8(0x10))
}

/// Block `q`'s 16 weight vectors (`[vector][half]`, vector `g` holding columns
/// `4 g .. 4 g + 4`): unsigned values for Q4_0/Q5_0/U8.
///
/// # Safety
/// AVX2 is present; `q` points at a block of `quant_bytes(K)` bytes.
#[inline(always)]
unsafe fn weights<const K: u8>(q: *const u8) -> [[__m256i; 2]; 8] {
    let mut w = [[_mm256_setzero_si256(); 2]; 8];
    // SAFETY: every load lies inside the block (the caller's contract).
    unsafe {
        match K {
            U8 => {
                for (g, wg) in w.iter_mut().enumerate() {
                    for (h, v) in wg.iter_mut().enumerate() {
                        *v = _mm256_loadu_si256(q.add(64 * g + 32 * h) as *const __m256i);
                    }
                }
            }
            _ => {
                let m4 = _mm256_set1_epi8(0x0f);
                let (low, high) = w.split_at_mut(4);
                for (l, (lo, hi)) in low.iter_mut().zip(high).enumerate() {
                    for (h, (a, b)) in lo.iter_mut().zip(hi).enumerate() {
                        let x = _mm256_loadu_si256(q.add(64 * l + 32 * h) as *const __m256i);
                        *a = _mm256_and_si256(x, m4);
                        *b = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
                    }
                }
                if K == Q5 {
                    let qh = [0, 1].map(|h| _mm256_loadu_si256(q.add(256 + 32 * h) as *const __m256i));
                    for (g, wg) in w.iter_mut().enumerate() {
                        for (v, &qh) in wg.iter_mut().zip(&qh) {
                            *v = _mm256_add_epi8(*v, fifth_bit(qh, g));
                        }
                    }
                }
            }
        }
    }
    w
}

/// Unpacks the `nb` blocks of a Q4_0 or Q5_0 group's quants into Q8_0's layout in `out`,
/// as [`super::avx512`]'s `expand` does (the same bytes).
///
/// # Safety
/// AVX2 is present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn expand(kd: u8, quants: &[u8], nb: usize, out: &mut [u8]) {
    let qb = quant_bytes(kd);
    for b in 0..nb {
        // SAFETY: block b < nb of both buffers (the caller checked their lengths).
        unsafe {
            let q = quants.as_ptr().add(b * qb);
            let w = if kd == Q5 {
                weights::<Q5>(q)
            } else {
                weights::<Q4>(q)
            };
            let o = out.as_mut_ptr().add(b * quant_bytes(Q8));
            for (g, wg) in w.iter().enumerate() {
                for (h, v) in wg.iter().enumerate() {
                    _mm256_storeu_si256(o.add(64 * g + 32 * h) as *mut __m256i, *v);
                }
            }
        }
    }
}

/// One 16-row group of kind `K` (Q4_0, Q5_0 or [`U8`]; Q8_0 has [`kernel_q8`]) against
/// `R ≤ 4` activation rows, as [`super::avx512`]'s kernel of the kind.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const K: u8, const R: usize>(args: &GroupArgs, out: &mut [[f32; PACK_ROWS]; 8]) {
    let GroupArgs {
        group,
        scale_bytes,
        nb,
        acts,
        rb,
        dy,
        cor,
        prefetch,
    } = *args;
    let qb = quant_bytes(K);
    let base = group.as_ptr();
    let ap = acts.as_ptr();
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..nb {
        // SAFETY: block b < nb of the group (asserted by the caller); the prefetch is a hint.
        let (dx, w) = unsafe {
            let q = base.add(scale_bytes + b * qb);
            prefetch.block(b);
            let s = base.add(b * 32);
            let dx = [
                _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(s.add(16) as *const __m128i)),
            ];
            (dx, weights::<K>(q))
        };
        for j in 0..R {
            // SAFETY: block b < nb of activation row j < R (asserted by the caller).
            let y = unsafe { ap.add(j * rb + b * Q8_0_BYTES + 2) };
            let mut s = [_mm256_setzero_si256(); 2];
            // Unsigned values of at most 31: four vectors' pair sums (each at most
            // 2 · 31 · 128) add up in 16 bits before widening.
            for (q, wq) in w.chunks_exact(4).enumerate() {
                let mut t = [_mm256_setzero_si256(); 2];
                for (g, wg) in wq.iter().enumerate() {
                    // SAFETY: four bytes of the block's 32 quants.
                    let a = unsafe { (y.add(16 * q + 4 * g) as *const i32).read_unaligned() };
                    let a = _mm256_set1_epi32(a);
                    for h in 0..2 {
                        t[h] = _mm256_add_epi16(t[h], _mm256_maddubs_epi16(wg[h], a));
                    }
                }
                for h in 0..2 {
                    s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(t[h], ones));
                }
            }
            let c = _mm256_set1_epi32(cor[j * nb + b]);
            let d = _mm256_set1_ps(dy[j * nb + b]);
            for h in 0..2 {
                let sh = _mm256_cvtepi32_ps(_mm256_sub_epi32(s[h], c));
                acc[j][h] = _mm256_fmadd_ps(_mm256_mul_ps(dx[h], d), sh, acc[j][h]);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: out[j] holds 16 floats.
        unsafe {
            _mm256_storeu_ps(out[j].as_mut_ptr(), a[0]);
            _mm256_storeu_ps(out[j].as_mut_ptr().add(8), a[1]);
        }
    }
}

/// One 16-row Q8_0 group against `R ≤ 4` activation rows, as [`super::avx512`]'s kernel of
/// the kind (the same integer sums, added in another order).
///
/// A line (two vectors and their magnitudes) at a time, used for every activation row before
/// the next line is loaded, its loads kept beside its arithmetic by an empty `asm!` (a
/// compiler barrier). With a block's sixteen loads hoisted to its start, as the compiler
/// schedules them otherwise, one thread streamed a matrix far larger than the caches at
/// 15-21 GB/s; so, at 30-32 (`kernels/examples/headbench`, 131072-151936 rows × 896-1024, the
/// read probe at 27-30), in cache at 43-49 either way. The AVX-512 set takes it for one row
/// too (see its table).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kernel_q8<const R: usize>(args: &GroupArgs, out: &mut [[f32; PACK_ROWS]; 8]) {
    let GroupArgs {
        group,
        scale_bytes,
        nb,
        acts,
        rb,
        dy,
        prefetch,
        ..
    } = *args;
    let qb = quant_bytes(Q8);
    let base = group.as_ptr();
    let ap = acts.as_ptr();
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..nb {
        // SAFETY: block b < nb of the group (asserted by the caller).
        let (dx, q) = unsafe {
            let s = base.add(b * 32);
            let dx = [
                _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(s.add(16) as *const __m128i)),
            ];
            (dx, base.add(scale_bytes + b * qb))
        };
        prefetch.block(b);
        let mut s = [[_mm256_setzero_si256(); 2]; R];
        for g in 0..8 {
            // SAFETY: an empty instruction sequence; it only keeps the compiler from moving
            // memory accesses across it.
            unsafe { std::arch::asm!("", options(nostack, preserves_flags)) };
            // SAFETY: the two halves of line g of block b (asserted by the caller).
            let w = [0, 1].map(|h| unsafe {
                _mm256_xor_si256(_mm256_loadu_si256(q.add(64 * g + 32 * h) as *const __m256i), flip)
            });
            let mag = w.map(|v| _mm256_abs_epi8(v));
            for (j, sj) in s.iter_mut().enumerate() {
                // SAFETY: four of the 32 quants of block b < nb of activation row j < R
                // (asserted by the caller).
                let a =
                    unsafe { (ap.add(j * rb + b * Q8_0_BYTES + 2 + 4 * g) as *const i32).read_unaligned() };
                let a = _mm256_set1_epi32(a);
                for h in 0..2 {
                    let p = _mm256_maddubs_epi16(mag[h], _mm256_sign_epi8(a, w[h]));
                    sj[h] = _mm256_add_epi32(sj[h], _mm256_madd_epi16(p, ones));
                }
            }
        }
        for (j, (aj, sj)) in acc.iter_mut().zip(&s).enumerate() {
            let d = _mm256_set1_ps(dy[j * nb + b]);
            for h in 0..2 {
                aj[h] = _mm256_fmadd_ps(_mm256_mul_ps(dx[h], d), _mm256_cvtepi32_ps(sj[h]), aj[h]);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: out[j] holds 16 floats.
        unsafe {
            _mm256_storeu_ps(out[j].as_mut_ptr(), a[0]);
            _mm256_storeu_ps(out[j].as_mut_ptr().add(8), a[1]);
        }
    }
}

/// One 16-row Q4_K group against `R ≤ 4` Q8_K activation rows, as [`super::avx512`]'s (the
/// same integer sums per sub-block and the same float order); `[h]` is the half of rows
/// `8 h .. 8 h + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_q4_k<const R: usize>(args: &GroupArgs, out: &mut [[f32; PACK_ROWS]; 8]) {
    let GroupArgs {
        group,
        nb: nsb,
        acts,
        rb,
        dy,
        cor: sums,
        prefetch,
        ..
    } = *args;
    use crate::quant::Q8_K_BYTES;
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut accm = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..nsb {
        // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
        // the caller).
        unsafe {
            let x = group.as_ptr().add(b * super::K4_BYTES);
            let half = |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(x.add(at) as *const __m128i));
            let (d, dmin) = ([half(0), half(16)], [half(32), half(48)]);
            let mut isum = [[_mm256_setzero_si256(); 2]; R];
            let mut msum = [[_mm256_setzero_si256(); 2]; R];
            for j in 0..4 {
                if R < 4 {
                    // Fewer than four rows are bound by memory (see [`super::Prefetch::block_part`]).
                    prefetch.block_part(b, j, 4);
                }
                let mut slo = [[_mm256_setzero_si256(); 2]; R];
                let mut shi = [[_mm256_setzero_si256(); 2]; R];
                for g in 0..8 {
                    for h in 0..2 {
                        let q = _mm256_loadu_si256(x.add(320 + 64 * (8 * j + g) + 32 * h) as *const __m256i);
                        let lo = _mm256_and_si256(q, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                        for r in 0..R {
                            let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 64 * j + 4 * g);
                            let y0 = _mm256_set1_epi32((y as *const i32).read_unaligned());
                            let y1 = _mm256_set1_epi32((y.add(32) as *const i32).read_unaligned());
                            let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), ones);
                            let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), ones);
                            slo[r][h] = _mm256_add_epi32(slo[r][h], plo);
                            shi[r][h] = _mm256_add_epi32(shi[r][h], phi);
                        }
                    }
                }
                // Sub-block scales and mins of the 16 rows, as i32 per half.
                let bytes = |at: usize, h: usize| {
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(at + 8 * h) as *const __m128i))
                };
                for h in 0..2 {
                    let (s0, s1) = (bytes(64 + 16 * (2 * j), h), bytes(64 + 16 * (2 * j + 1), h));
                    let (m0, m1) = (bytes(192 + 16 * (2 * j), h), bytes(192 + 16 * (2 * j + 1), h));
                    for r in 0..R {
                        let bs = &sums[(r * nsb + b) * 8..];
                        isum[r][h] = _mm256_add_epi32(
                            isum[r][h],
                            _mm256_add_epi32(
                                _mm256_mullo_epi32(slo[r][h], s0),
                                _mm256_mullo_epi32(shi[r][h], s1),
                            ),
                        );
                        msum[r][h] = _mm256_add_epi32(
                            msum[r][h],
                            _mm256_add_epi32(
                                _mm256_mullo_epi32(m0, _mm256_set1_epi32(bs[2 * j])),
                                _mm256_mullo_epi32(m1, _mm256_set1_epi32(bs[2 * j + 1])),
                            ),
                        );
                    }
                }
            }
            for r in 0..R {
                let yd = _mm256_set1_ps(dy[r * nsb + b]);
                for h in 0..2 {
                    acc[r][h] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), _mm256_mul_ps(d[h], yd), acc[r][h]);
                    accm[r][h] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(msum[r][h]),
                        _mm256_mul_ps(dmin[h], yd),
                        accm[r][h],
                    );
                }
            }
        }
    }
    for r in 0..R {
        for h in 0..2 {
            // SAFETY: out[r] holds 16 floats.
            unsafe {
                _mm256_storeu_ps(
                    out[r].as_mut_ptr().add(8 * h),
                    _mm256_sub_ps(acc[r][h], accm[r][h]),
                )
            };
        }
    }
}

/// One 16-row Q6_K group against `R ≤ 4` Q8_K activation rows, the AVX-512 kernel (the same
/// i32 lane sums and float order) per half of 8 rows
/// (`acc[h]`: rows `8 h .. 8 h + 8`): per lane `l`, `vpmaddubsw` then `vpmaddwd` with the
/// duplicated i16 scale for `Σ_j scale · (q · y)`, `vpmaddwd` of `32 · scale` with the
/// negated bsum pair, the lane's own fused multiply-add, the lanes summed in the same tree.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel_q6_k<const R: usize>(args: &GroupArgs, out: &mut [[f32; PACK_ROWS]; 8]) {
    let GroupArgs {
        group,
        nb: nsb,
        acts,
        rb,
        dy,
        cor: nbs,
        prefetch,
        ..
    } = *args;
    use crate::quant::Q8_K_BYTES;
    // vpshufb patterns putting a pair's first (second) i16 in both halves of each i32.
    let dup = [
        _mm256_setr_epi8(
            0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13,
            12, 13,
        ),
        _mm256_setr_epi8(
            2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11,
            14, 15, 14, 15,
        ),
    ];
    let m6 = _mm256_set1_epi8(0x3f);
    let mut acc = [[[_mm256_setzero_ps(); 8]; R]; 2];
    for b in 0..nsb {
        // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
        // the caller).
        unsafe {
            let x = group.as_ptr().add(b * super::K6_BYTES);
            let q = x.add(320);
            for (h, acc) in acc.iter_mut().enumerate() {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(x.add(16 * h) as *const __m128i));
                // Per pair p, the 8 rows' (scale[2 p], scale[2 p + 1]) as two i16 in an i32.
                let pairs: [__m256i; 8] = std::array::from_fn(|p| {
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(64 + 32 * p + 16 * h) as *const __m128i))
                });
                for (u, &dup_u) in dup.iter().enumerate() {
                    // Lanes 4 u .. 4 u + 4 take sub-block 2 j + u's scale in chunk j.
                    let sc: [__m256i; 8] = std::array::from_fn(|j| _mm256_shuffle_epi8(pairs[j], dup_u));
                    for l in 4 * u..4 * u + 4 {
                        if R < 4 {
                            // Fewer than four rows are bound by memory (see [`super::Prefetch::block_part`]).
                            prefetch.block_part(b, 8 * h + l, 16);
                        }
                        let mut s = [_mm256_setzero_si256(); R];
                        for hj in 0..2 {
                            let v: [__m256i; 4] = {
                                let line = |m: usize| {
                                    let at = 64 * (6 * l + 3 * hj + m) + 32 * h;
                                    _mm256_loadu_si256(q.add(at) as *const __m256i)
                                };
                                let (l0, l1, l2) = (line(0), line(1), line(2));
                                // The top two bits of l0, l1, l2 alone (no bit crosses a
                                // byte in the 16-bit shifts below), to bits 0-1, 2-3, 4-5.
                                let top = |l: __m256i| _mm256_andnot_si256(m6, l);
                                let t = _mm256_or_si256(
                                    _mm256_or_si256(
                                        _mm256_srli_epi16::<6>(top(l0)),
                                        _mm256_srli_epi16::<4>(top(l1)),
                                    ),
                                    _mm256_srli_epi16::<2>(top(l2)),
                                );
                                [
                                    _mm256_and_si256(l0, m6),
                                    _mm256_and_si256(l1, m6),
                                    _mm256_and_si256(l2, m6),
                                    t,
                                ]
                            };
                            for (m, &w) in v.iter().enumerate() {
                                let j = 4 * hj + m;
                                for (r, sr) in s.iter_mut().enumerate() {
                                    let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 32 * j + 4 * l);
                                    let y = _mm256_set1_epi32((y as *const i32).read_unaligned());
                                    // Pairs of q · y are at most 2 · 63 · 128 (no saturation),
                                    // times the scale at most 2 · 16128 · 128 in i32.
                                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), sc[j]);
                                    *sr = _mm256_add_epi32(*sr, p);
                                }
                            }
                        }
                        let off = _mm256_slli_epi16::<5>(pairs[l]);
                        for (r, sr) in s.iter().enumerate() {
                            let i = r * nsb + b;
                            let o = _mm256_madd_epi16(off, _mm256_set1_epi32(nbs[8 * i + l]));
                            let si = _mm256_add_epi32(*sr, o);
                            let dd = _mm256_mul_ps(d, _mm256_set1_ps(dy[i]));
                            acc[r][l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), dd, acc[r][l]);
                        }
                    }
                }
            }
        }
    }
    for (h, ah) in acc.iter().enumerate() {
        for (r, a) in ah.iter().enumerate() {
            let sum = _mm256_add_ps(
                _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
            );
            // SAFETY: out[r] holds 16 floats.
            unsafe { _mm256_storeu_ps(out[r].as_mut_ptr().add(8 * h), sum) };
        }
    }
}
