use super::{
    quant_bytes, GroupArgs, GroupKernel, PackedTable, PairKernel, K4, K6, MX, PACK_ROWS, Q4, Q5, Q8,
};
use crate::quant::Q8_0_BYTES;
use std::arch::x86_64::*;

/// This set's packed kernels.
pub(super) const TABLE: PackedTable = PackedTable {
    name: "avx512",
    batch,
    expanded_kind: Q8,
    expand,
    kernel: group_kernel,
    pair_batch: 4,
    pair: pair_kernel,
};

/// The kernel taking two groups of Q8_0's layout (Q8_0's, and Q4_0/Q5_0 unpacked) against
/// `r ≤ 4` activation rows.
fn pair_kernel(r: usize) -> Option<PairKernel> {
    let rows: [PairKernel; 4] = [
        kernel_pair_q8::<1>,
        kernel_pair_q8::<2>,
        kernel_pair_q8::<3>,
        kernel_pair_q8::<4>,
    ];
    rows.get(r.checked_sub(1)?).copied()
}

/// Activation rows per kernel call for kind `kd`: eight for Q8_0 (and unpacked groups) and
/// Q6_K; four where unpacking nibbles takes registers too (measured faster than eight for
/// Q5_0; MXFP4 unpacks like Q4_0).
fn batch(kd: u8) -> usize {
    // (MXFP4 takes the `_` arm: four rows.)
    match kd {
        Q8 | K6 => 8,
        _ => 4,
    }
}

/// The kernel for one 16-row group of kind `kd` against `r` activation rows: up to 8 rows of
/// the `_0` kinds and Q6_K, up to 4 of Q4_K (see [`GroupKernel`]).
fn group_kernel(kd: u8, r: usize) -> Option<GroupKernel> {
    let rows: &[GroupKernel] = match kd {
        Q4 => &[
            kernel::<Q4, 1>,
            kernel::<Q4, 2>,
            kernel::<Q4, 3>,
            kernel::<Q4, 4>,
            kernel::<Q4, 5>,
            kernel::<Q4, 6>,
            kernel::<Q4, 7>,
            kernel::<Q4, 8>,
        ],
        Q5 => &[
            kernel::<Q5, 1>,
            kernel::<Q5, 2>,
            kernel::<Q5, 3>,
            kernel::<Q5, 4>,
            kernel::<Q5, 5>,
            kernel::<Q5, 6>,
            kernel::<Q5, 7>,
            kernel::<Q5, 8>,
        ],
        // One Q8_0 row takes AVX2's kernel: it streamed one Zen 5 thread at 42-46 GB/s where
        // this set's streamed 38-40 (`examples/headbench`, Qwen's and Gemma 3's head shapes;
        // the same sums, bit for bit). From two rows on, this set's is faster (36 against 27-35
        // at two, 74 against 30 at three in cache).
        Q8 => &[
            super::avx2::kernel_q8::<1>,
            kernel::<Q8, 2>,
            kernel::<Q8, 3>,
            kernel::<Q8, 4>,
            kernel::<Q8, 5>,
            kernel::<Q8, 6>,
            kernel::<Q8, 7>,
            kernel::<Q8, 8>,
        ],
        MX => &[
            kernel::<MX, 1>,
            kernel::<MX, 2>,
            kernel::<MX, 3>,
            kernel::<MX, 4>,
            kernel::<MX, 5>,
            kernel::<MX, 6>,
            kernel::<MX, 7>,
            kernel::<MX, 8>,
        ],
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
            kernel_q6_k::<5>,
            kernel_q6_k::<6>,
            kernel_q6_k::<7>,
            kernel_q6_k::<8>,
        ],
        _ => &[],
    };
    rows.get(r.checked_sub(1)?).copied()
}

/// Two consecutive 16-row groups of Q8_0's layout (the second `stride` bytes after the first)
/// against `R ≤ 4` activation rows: [`kernel`]'s sums for each group (the same exact integers,
/// the same float steps), each activation load serving both groups. With eight rows and one
/// group a call, the activations' broadcast loads bound the product (at 64 rows, one Zen 5
/// thread: 300 GMAC/s; twice the `vpdpbusd` per broadcast took 1.36x the time).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
unsafe fn kernel_pair_q8<const R: usize>(
    args: &GroupArgs,
    stride: usize,
    out: &mut [[f32; 2 * PACK_ROWS]; 8],
) {
    let GroupArgs {
        group,
        scale_bytes,
        nb,
        acts,
        rb,
        dy,
        cor,
        ..
    } = *args;
    let qb = quant_bytes(Q8);
    let base = group.as_ptr();
    let ap = acts.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); R]; 2];
    for b in 0..nb {
        // SAFETY: block b < nb of both groups (asserted by the caller).
        let (dx, q) = unsafe {
            let g1 = base.add(stride);
            (
                [
                    _mm512_cvtph_ps(_mm256_loadu_si256(base.add(b * 32) as *const __m256i)),
                    _mm512_cvtph_ps(_mm256_loadu_si256(g1.add(b * 32) as *const __m256i)),
                ],
                [base.add(scale_bytes + b * qb), g1.add(scale_bytes + b * qb)],
            )
        };
        // The offset correction taken first (the same exact integer sum as [`kernel`]'s).
        let mut s = [[_mm512_setzero_si512(); R]; 2];
        let mut s2 = [[_mm512_setzero_si512(); R]; 2];
        for j in 0..R {
            let c = _mm512_set1_epi32(cor[j * nb + b].wrapping_neg());
            s[0][j] = c;
            s[1][j] = c;
        }
        for g in 0..8 {
            // SAFETY: line g of block b of both groups (asserted by the caller).
            let w = q.map(|q| unsafe { _mm512_loadu_si512(q.add(64 * g) as *const _) });
            for j in 0..R {
                // SAFETY: four of the 32 quants of block b < nb of activation row j < R
                // (asserted by the caller).
                let a =
                    unsafe { (ap.add(j * rb + b * Q8_0_BYTES + 2 + 4 * g) as *const i32).read_unaligned() };
                let a = _mm512_set1_epi32(a);
                if g % 2 == 0 {
                    s[0][j] = _mm512_dpbusd_epi32(s[0][j], w[0], a);
                    s[1][j] = _mm512_dpbusd_epi32(s[1][j], w[1], a);
                } else {
                    s2[0][j] = _mm512_dpbusd_epi32(s2[0][j], w[0], a);
                    s2[1][j] = _mm512_dpbusd_epi32(s2[1][j], w[1], a);
                }
            }
        }
        for j in 0..R {
            let yd = _mm512_set1_ps(dy[j * nb + b]);
            for h in 0..2 {
                let d = _mm512_mul_ps(dx[h], yd);
                let sj = _mm512_add_epi32(s[h][j], s2[h][j]);
                acc[h][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sj), acc[h][j]);
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (o, a) in out.iter_mut().zip(acc) {
            // SAFETY: o holds 32 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(PACK_ROWS * h), *a) };
        }
    }
}

/// One 16-row Q4_K group (`nb` super-blocks of [`super::K4_BYTES`]) against `R ≤ 4` Q8_K
/// activation rows (`rb` bytes apart; their scales `dy` and 32-value sums `cor`, 8 per
/// super-block).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
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
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    for b in 0..nsb {
        // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
        // the caller).
        unsafe {
            let x = group.as_ptr().add(b * super::K4_BYTES);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(x as *const __m256i));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(32) as *const __m256i));
            let mut isum = [_mm512_setzero_si512(); R];
            let mut msum = [_mm512_setzero_si512(); R];
            for j in 0..4 {
                if R < 4 {
                    // Fewer than four rows are bound by memory (see [`super::Prefetch::block_part`]).
                    prefetch.block_part(b, j, 4);
                }
                let mut slo = [_mm512_setzero_si512(); R];
                let mut shi = [_mm512_setzero_si512(); R];
                for g in 0..8 {
                    let q = _mm512_loadu_si512(x.add(320 + 64 * (8 * j + g)) as *const _);
                    let lo = _mm512_and_si512(q, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                    for r in 0..R {
                        let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 64 * j + 4 * g);
                        let y0 = (y as *const i32).read_unaligned();
                        let y1 = (y.add(32) as *const i32).read_unaligned();
                        slo[r] = _mm512_dpbusd_epi32(slo[r], lo, _mm512_set1_epi32(y0));
                        shi[r] = _mm512_dpbusd_epi32(shi[r], hi, _mm512_set1_epi32(y1));
                    }
                }
                let sc =
                    |i: usize| _mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(64 + 16 * i) as *const __m128i));
                let mn =
                    |i: usize| _mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(192 + 16 * i) as *const __m128i));
                let (s0, s1, m0, m1) = (sc(2 * j), sc(2 * j + 1), mn(2 * j), mn(2 * j + 1));
                for r in 0..R {
                    let bs = &sums[(r * nsb + b) * 8..];
                    isum[r] = _mm512_add_epi32(
                        isum[r],
                        _mm512_add_epi32(_mm512_mullo_epi32(slo[r], s0), _mm512_mullo_epi32(shi[r], s1)),
                    );
                    msum[r] = _mm512_add_epi32(
                        msum[r],
                        _mm512_add_epi32(
                            _mm512_mullo_epi32(m0, _mm512_set1_epi32(bs[2 * j])),
                            _mm512_mullo_epi32(m1, _mm512_set1_epi32(bs[2 * j + 1])),
                        ),
                    );
                }
            }
            for r in 0..R {
                let yd = _mm512_set1_ps(dy[r * nsb + b]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, yd), acc[r]);
                accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[r]), _mm512_mul_ps(dmin, yd), accm[r]);
            }
        }
    }
    for r in 0..R {
        // SAFETY: out[r] holds 16 floats.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r])) };
    }
}

/// One 16-row Q6_K group (`nb` super-blocks) against `R ≤ 8` Q8_K activation rows (their
/// scales `dy` and negated bsum pairs `cor`, 8 per super-block): per super-block and i32 lane `l` of
/// the single-row kernel (columns `32 j + 4 l .. + 4`, see [`super::K6_BYTES`]), the 16
/// rows' lane sums `Σ_j scale · (q · y)` by `vpmaddubsw` and `vpdpwssd`, minus the lane's
/// `32 · scale · bsum` pair (one more `vpdpwssd`), then the lane's own fused multiply-add;
/// the lanes are summed at the end in the single-row kernel's tree.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
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
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13)),
        _mm512_broadcast_i32x4(_mm_setr_epi8(
            2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
        )),
    ];
    let m6 = _mm512_set1_epi8(0x3f);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    for b in 0..nsb {
        // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
        // the caller).
        unsafe {
            let x = group.as_ptr().add(b * super::K6_BYTES);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(x as *const __m256i));
            // Per pair p, the 16 rows' (scale[2 p], scale[2 p + 1]) as two i16 in an i32.
            let pairs: [__m512i; 8] = std::array::from_fn(|p| {
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(x.add(64 + 32 * p) as *const __m256i))
            });
            let q = x.add(320);
            for (h, &dup_h) in dup.iter().enumerate() {
                // Lanes 4 h .. 4 h + 4 take sub-block 2 j + h's scale in chunk j.
                let sc: [__m512i; 8] = std::array::from_fn(|j| _mm512_shuffle_epi8(pairs[j], dup_h));
                for l in 4 * h..4 * h + 4 {
                    if R < 4 {
                        // Fewer than four rows are bound by memory (see [`super::Prefetch::block_part`]).
                        prefetch.block_part(b, l, 8);
                    }
                    let mut s = [_mm512_setzero_si512(); R];
                    for hj in 0..2 {
                        let v: [__m512i; 4] = {
                            let line =
                                |m: usize| _mm512_loadu_si512(q.add(64 * (6 * l + 3 * hj + m)) as *const _);
                            let (l0, l1, l2) = (line(0), line(1), line(2));
                            // The top bits of l0, l1, l2 to bits 0-1, 2-3, 4-5 of the
                            // fourth vector (0xe4: a where c is set, else b).
                            let t = _mm512_ternarylogic_epi32::<0xe4>(
                                _mm512_srli_epi16::<6>(l0),
                                _mm512_srli_epi16::<4>(l1),
                                _mm512_set1_epi8(0x03),
                            );
                            let t = _mm512_ternarylogic_epi32::<0xe4>(
                                t,
                                _mm512_srli_epi16::<2>(l2),
                                _mm512_set1_epi8(0x0f),
                            );
                            [
                                _mm512_and_si512(l0, m6),
                                _mm512_and_si512(l1, m6),
                                _mm512_and_si512(l2, m6),
                                _mm512_and_si512(t, m6),
                            ]
                        };
                        for (m, &w) in v.iter().enumerate() {
                            let j = 4 * hj + m;
                            for (r, sr) in s.iter_mut().enumerate() {
                                let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 32 * j + 4 * l);
                                let y = _mm512_set1_epi32((y as *const i32).read_unaligned());
                                *sr = _mm512_dpwssd_epi32(*sr, _mm512_maddubs_epi16(w, y), sc[j]);
                            }
                        }
                    }
                    let off = _mm512_slli_epi16::<5>(pairs[l]);
                    for (r, sr) in s.iter().enumerate() {
                        let i = r * nsb + b;
                        let si = _mm512_dpwssd_epi32(*sr, off, _mm512_set1_epi32(nbs[8 * i + l]));
                        let dd = _mm512_mul_ps(d, _mm512_set1_ps(dy[i]));
                        acc[r][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), dd, acc[r][l]);
                    }
                }
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let sum = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
            _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
        );
        // SAFETY: out[r] holds 16 floats.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), sum) };
    }
}

/// Vector `g`'s fifth bits as a mask (byte `i`: bit `g` of byte `i` of Q5_0's bit-sliced
/// fifth-bit line `qh`).
///
/// # Safety
/// The CPU has AVX-512 F/BW.
#[inline(always)]
unsafe fn fifth_mask(qh: __m512i, g: usize) -> __mmask64 {
    _mm512_test_epi8_mask(qh, _mm512_set1_epi8((1u8 << g) as i8))
}

/// Unpacks the `nb` blocks of quants of a Q4_0 or Q5_0 group (`kd`) into Q8_0's layout in
/// `out` (512 bytes a block): the unsigned stored values as bytes, four columns of the 16
/// rows per 64-byte line, exactly what [`kernel`] feeds `vpdpbusd` for those kinds.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
pub(super) unsafe fn expand(kd: u8, quants: &[u8], nb: usize, out: &mut [u8]) {
    let qb = quant_bytes(kd);
    let m4 = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(0x10);
    for b in 0..nb {
        // SAFETY: block b < nb of both buffers (the caller checked their lengths).
        unsafe {
            let q = quants.as_ptr().add(b * qb);
            let o = out.as_mut_ptr().add(b * quant_bytes(Q8));
            for l in 0..4 {
                let x = _mm512_loadu_si512(q.add(64 * l) as *const _);
                let mut lo = _mm512_and_si512(x, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
                if kd == Q5 {
                    let qh = _mm512_loadu_si512(q.add(256) as *const _);
                    lo = _mm512_mask_add_epi8(lo, fifth_mask(qh, l), lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, fifth_mask(qh, l + 4), hi, sixteen);
                }
                _mm512_storeu_si512(o.add(64 * l) as *mut _, lo);
                _mm512_storeu_si512(o.add(64 * (l + 4)) as *mut _, hi);
            }
        }
    }
}

/// The 16 rows' MXFP4 block scales, [`crate::quant::e8m0_to_f32_half`] of the 16 exponent
/// bytes at `p`: `(e - 1) << 23` as f32 bits, and for `e < 2` the subnormal `0x0020_0000 << e`.
///
/// # Safety
/// 16 bytes at `p`; the CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn e8m0_half_x16(p: *const u8) -> __m512 {
    // SAFETY: 16 bytes at p (the caller's contract).
    let e = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p as *const __m128i) });
    let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, tiny))
}

/// One 16-row group of kind `K` (`group`: scales in the first `scale_bytes`, then `nb` blocks
/// of quants) against `R ≤ 8` activation rows (`acts`, `rb` bytes apart; their per-block
/// scales `dy` and corrections `cor`, `nb` apart).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
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
    let m4 = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(0x10);
    // MXFP4: each code's doubled E2M1 value plus the kind's offset (12), by byte shuffle.
    let lut = {
        let mut t = [0u8; 16];
        for (v, &k) in t.iter_mut().zip(crate::quant::KVALUES_MXFP4.iter()) {
            *v = (k + 12) as u8;
        }
        // SAFETY: `t` is 16 bytes.
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) })
    };
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY: block b < nb of the group (asserted by the caller); the prefetch is a hint.
        let (dx, wv) = unsafe {
            let q = base.add(scale_bytes + b * qb);
            prefetch.block(b);
            let dx = if K == MX {
                e8m0_half_x16(base.add(b * 16))
            } else {
                _mm512_cvtph_ps(_mm256_loadu_si256(base.add(b * 32) as *const __m256i))
            };
            let mut wv = [_mm512_setzero_si512(); 8];
            match K {
                Q8 => {
                    for (g, v) in wv.iter_mut().enumerate() {
                        *v = _mm512_loadu_si512(q.add(64 * g) as *const _);
                    }
                }
                _ => {
                    for l in 0..4 {
                        let x = _mm512_loadu_si512(q.add(64 * l) as *const _);
                        wv[l] = _mm512_and_si512(x, m4);
                        wv[l + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
                    }
                    if K == Q5 {
                        let qh = _mm512_loadu_si512(q.add(256) as *const _);
                        for (g, v) in wv.iter_mut().enumerate() {
                            *v = _mm512_mask_add_epi8(*v, fifth_mask(qh, g), *v, sixteen);
                        }
                    }
                    if K == MX {
                        for v in wv.iter_mut() {
                            *v = _mm512_shuffle_epi8(lut, *v);
                        }
                    }
                }
            }
            (dx, wv)
        };
        for j in 0..R {
            // SAFETY: block b < nb of activation row j < R (asserted by the caller).
            let y = unsafe { ap.add(j * rb + b * Q8_0_BYTES + 2) };
            // The offset correction taken first, and the sum split over two accumulators to
            // halve its chain of dependent `vpdpbusd` (the same exact integer sum).
            let mut s = [
                _mm512_set1_epi32(cor[j * nb + b].wrapping_neg()),
                _mm512_setzero_si512(),
            ];
            for (g, &w) in wv.iter().enumerate() {
                // SAFETY: four bytes of the block's 32 quants.
                let a = unsafe { (y.add(4 * g) as *const i32).read_unaligned() };
                s[g % 2] = _mm512_dpbusd_epi32(s[g % 2], w, _mm512_set1_epi32(a));
            }
            let s = _mm512_add_epi32(s[0], s[1]);
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(dy[j * nb + b]));
            acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[j]);
        }
    }
    for j in 0..R {
        // SAFETY: out[j] holds 16 floats.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
    }
}
