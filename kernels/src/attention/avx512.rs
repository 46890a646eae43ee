//! The AVX2 kernels of [`super::group_attention`] with AVX-512 registers: every head of a group and
//! four keys (or 64 value dimensions) per pass, each number bit for bit what the AVX2 kernel
//! computes. A score's 16-lane accumulator holds the AVX2 kernel's two 8-lane accumulators side
//! by side (dimensions `i..i + 8` low, `i + 8..i + 16` high) and is reduced as they are; every
//! lane of a weighted sum is the same fused multiply-add chain in position order.

use super::{AttentionTable, HeadOpts, KvRows};
use crate::dot::avx2::hsum_ps;
use std::arch::x86_64::*;

/// This set's attention kernels: every head of a group at once, and the rows of a sequence too.
pub(super) const TABLE: AttentionTable = AttentionTable {
    name: "avx512",
    scores: group_scores,
    values: group_values,
    rows_at_once: true,
};

/// The AVX2 kernel's `hsum(a0 + a1)` of a 16-lane accumulator.
///
/// # Safety
/// AVX-512F and AVX2 are present.
#[inline(always)]
unsafe fn reduce(a: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(a);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
    hsum_ps(_mm256_add_ps(lo, hi))
}

/// `q · k` of `H` heads (`q`: heads back to back, `hd` each) against `K` key rows.
///
/// # Safety
/// AVX-512F, AVX2 and FMA are present; `q` holds `H · hd` floats and each key `hd`.
#[inline(always)]
unsafe fn tile<const H: usize, const K: usize>(
    q: *const f32,
    hd: usize,
    k: [*const f32; K],
) -> [[f32; K]; H] {
    let mut acc = [[_mm512_setzero_ps(); K]; H];
    for i in (0..hd).step_by(16) {
        let mut kr = [_mm512_setzero_ps(); K];
        for (r, &kp) in kr.iter_mut().zip(&k) {
            // SAFETY: i + 16 <= hd, inside the key row.
            *r = unsafe { _mm512_loadu_ps(kp.add(i)) };
        }
        for (h, ah) in acc.iter_mut().enumerate() {
            // SAFETY: h < H and i + 16 <= hd, inside q.
            let qh = unsafe { _mm512_loadu_ps(q.add(h * hd + i)) };
            for (a, &r) in ah.iter_mut().zip(&kr) {
                *a = _mm512_fmadd_ps(qh, r, *a);
            }
        }
    }
    let mut sums = [[0.0f32; K]; H];
    for (sh, ah) in sums.iter_mut().zip(&acc) {
        for (s, &a) in sh.iter_mut().zip(ah) {
            // SAFETY: the caller's contract: AVX-512F and AVX2 are present.
            *s = unsafe { reduce(a) };
        }
    }
    sums
}

/// Scores of heads `h0..h0 + H` of the group into `scores` (head `h` at `h · stride`).
///
/// # Safety
/// As [`group_scores`].
#[inline(always)]
unsafe fn heads<const H: usize>(
    q: &[f32],
    hd: usize,
    kv: &KvRows,
    opts: &[HeadOpts],
    scores: &mut [f32],
    stride: usize,
    h0: usize,
) {
    let len = kv.end - kv.start;
    let qp = q[h0 * hd..(h0 + H) * hd].as_ptr();
    // SAFETY: callers pass j < len: row start + j is inside the checked range.
    let key = |j: usize| unsafe { kv.k.as_ptr().add((kv.start + j) * kv.stride) };
    let mut put = |j: usize, s: &[f32], h: usize| {
        for (t, &v) in s.iter().enumerate() {
            scores[(h0 + h) * stride + j + t] = v * opts[h0 + h].scale;
        }
    };
    let mut j = 0;
    while j + 4 <= len {
        // SAFETY: the caller's contract; the four keys are rows of the range.
        let s = unsafe { tile::<H, 4>(qp, hd, [key(j), key(j + 1), key(j + 2), key(j + 3)]) };
        for (h, sh) in s.iter().enumerate() {
            put(j, sh, h);
        }
        j += 4;
    }
    while j < len {
        // SAFETY: as above.
        let s = unsafe { tile::<H, 1>(qp, hd, [key(j)]) };
        for (h, sh) in s.iter().enumerate() {
            put(j, sh, h);
        }
        j += 1;
    }
}

/// `scores[h · stride + j] = (q_h · k_{start + j}) · scale_h` for every head of the group.
///
/// # Safety
/// AVX-512F, AVX2 and FMA are present; `kv.check(hd)` holds (`hd` a multiple of 16); `q`
/// holds `opts.len()` heads of `hd`; `scores` holds `opts.len()` rows of `stride` and
/// `stride >= kv.end - kv.start`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn group_scores(
    q: &[f32],
    hd: usize,
    kv: &KvRows,
    opts: &[HeadOpts],
    scores: &mut [f32],
    stride: usize,
) {
    let g = opts.len();
    let mut h0 = 0;
    while h0 < g {
        // SAFETY: the caller's contract, for heads h0..h0 + n of the group.
        unsafe {
            match g - h0 {
                1 => heads::<1>(q, hd, kv, opts, scores, stride, h0),
                2 => heads::<2>(q, hd, kv, opts, scores, stride, h0),
                3 => heads::<3>(q, hd, kv, opts, scores, stride, h0),
                _ => heads::<4>(q, hd, kv, opts, scores, stride, h0),
            }
        }
        h0 += 4;
    }
}

/// `out_h = Σ_j p_h[j] · v_{start + j}` for heads `h0..h0 + H`, 64 dimensions at a time.
///
/// # Safety
/// As [`group_values`].
#[inline(always)]
unsafe fn values<const H: usize>(
    kv: &KvRows,
    p: &[f32],
    stride: usize,
    len: usize,
    out: &mut [f32],
    hd: usize,
    h0: usize,
) {
    for c in (0..hd).step_by(64) {
        let mut acc = [[_mm512_setzero_ps(); 4]; H];
        for j in 0..len {
            // SAFETY: row start + j is inside the checked range; c + 64 <= hd.
            let v = unsafe { kv.v.as_ptr().add((kv.start + j) * kv.stride + c) };
            let mut vr = [_mm512_setzero_ps(); 4];
            for (u, r) in vr.iter_mut().enumerate() {
                // SAFETY: as above.
                *r = unsafe { _mm512_loadu_ps(v.add(16 * u)) };
            }
            for (h, ah) in acc.iter_mut().enumerate() {
                let pj = p[(h0 + h) * stride + j];
                if pj == 0.0 {
                    continue;
                }
                let pv = _mm512_set1_ps(pj);
                for (a, &r) in ah.iter_mut().zip(&vr) {
                    *a = _mm512_fmadd_ps(pv, r, *a);
                }
            }
        }
        for (h, ah) in acc.iter().enumerate() {
            for (u, a) in ah.iter().enumerate() {
                let o = &mut out[(h0 + h) * hd + c + 16 * u..(h0 + h) * hd + c + 16 * (u + 1)];
                // SAFETY: o holds 16 floats.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
            }
        }
    }
}

/// `out_h = Σ_j p[h · stride + j] · v_{start + j}` for every head of the group.
///
/// # Safety
/// AVX-512F, AVX2 and FMA are present; `kv.check(hd)` holds (`hd` a multiple of 64); `p`
/// holds `out.len() / hd` rows of `stride >= len`, `len = kv.end - kv.start`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn group_values(
    kv: &KvRows,
    p: &[f32],
    stride: usize,
    len: usize,
    out: &mut [f32],
    hd: usize,
) {
    let g = out.len() / hd;
    let mut h0 = 0;
    while h0 < g {
        // SAFETY: the caller's contract, for heads h0..h0 + n of the group.
        unsafe {
            match g - h0 {
                1 => values::<1>(kv, p, stride, len, out, hd, h0),
                2 => values::<2>(kv, p, stride, len, out, hd, h0),
                3 => values::<3>(kv, p, stride, len, out, hd, h0),
                _ => values::<4>(kv, p, stride, len, out, hd, h0),
            }
        }
        h0 += 4;
    }
}
