//! The AVX2+FMA kernels of [`super::group_attention`].

use super::{AttentionTable, HeadOpts, KvRows};
use crate::dot::avx2::hsum_ps;
use std::arch::x86_64::*;

/// This set's attention kernels: one head at a time, each row of a sequence alone.
pub(super) const TABLE: AttentionTable = AttentionTable {
    name: "avx2",
    scores: group_scores,
    values: group_values,
    rows_at_once: false,
};

/// [`scores`] of every head of the group: head `h`'s at `scores[h · stride..]`.
///
/// # Safety
/// AVX2 and FMA are present; `kv.check(hd)` holds (`hd` a multiple of 64); `q` holds
/// `opts.len()` heads of `hd`; `scores` holds `opts.len()` rows of `stride` and
/// `stride >= kv.end - kv.start`.
#[target_feature(enable = "avx2,fma")]
unsafe fn group_scores(
    q: &[f32],
    hd: usize,
    kv: &KvRows,
    opts: &[HeadOpts],
    scores: &mut [f32],
    stride: usize,
) {
    let len = kv.end - kv.start;
    for (h, o) in opts.iter().enumerate() {
        // SAFETY: the caller's contract, for head h.
        unsafe {
            self::scores(
                &q[h * hd..(h + 1) * hd],
                kv,
                o.scale,
                &mut scores[h * stride..h * stride + len],
            )
        };
    }
}

/// [`weighted_values`] of every head of the group (`out.len() / hd` of them): head `h`'s
/// probabilities at `p[h · stride..h · stride + len]`.
///
/// # Safety
/// As [`group_scores`], with `len = kv.end - kv.start` and `out` holding whole heads of `hd`.
#[target_feature(enable = "avx2,fma")]
unsafe fn group_values(kv: &KvRows, p: &[f32], stride: usize, len: usize, out: &mut [f32], hd: usize) {
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        // SAFETY: the caller's contract, for head h.
        unsafe { weighted_values(kv, &p[h * stride..h * stride + len], oh) };
    }
}

/// `scores[j] = (q · k_{start + j}) · scale` for a head of `q.len()` (a multiple of 64).
/// Each score is two accumulators over alternate 8-lane halves of 16 dimensions, summed and
/// reduced; four keys run side by side (eight independent chains), each exactly as alone.
///
/// # Safety
/// AVX2 and FMA are present; `kv.check(q.len())` holds; `scores` has the range's length.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores(q: &[f32], kv: &KvRows, scale: f32, scores: &mut [f32]) {
    let hd = q.len();
    let qp = q.as_ptr();
    let key = |j: usize| {
        // SAFETY: callers pass j < scores.len(), so row start + j is inside the checked
        // range.
        unsafe { kv.k.as_ptr().add((kv.start + j) * kv.stride) }
    };
    let done = scores.len() / 4 * 4;
    let mut quads = scores.chunks_exact_mut(4);
    for (c, s4) in (&mut quads).enumerate() {
        let k = [key(4 * c), key(4 * c + 1), key(4 * c + 2), key(4 * c + 3)];
        let mut a = [[_mm256_setzero_ps(); 2]; 4];
        for i in (0..hd).step_by(16) {
            // SAFETY: i + 16 <= hd, inside q and inside each checked key row.
            unsafe {
                let (q0, q1) = (_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(qp.add(i + 8)));
                for (ar, &kr) in a.iter_mut().zip(&k) {
                    ar[0] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kr.add(i)), ar[0]);
                    ar[1] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kr.add(i + 8)), ar[1]);
                }
            }
        }
        for (s, ar) in s4.iter_mut().zip(&a) {
            *s = hsum_ps(_mm256_add_ps(ar[0], ar[1])) * scale;
        }
    }
    for (j, s) in quads.into_remainder().iter_mut().enumerate() {
        let k = key(done + j);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..hd).step_by(16) {
            // SAFETY: as above.
            unsafe {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i)), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i + 8)), _mm256_loadu_ps(k.add(i + 8)), a1);
            }
        }
        *s = hsum_ps(_mm256_add_ps(a0, a1)) * scale;
    }
}

/// `out = Σ_j p[j] · v_{start + j}`, 64 dimensions at a time in registers, positions in order.
///
/// # Safety
/// As [`scores`], with `out.len()` the head dimension (a multiple of 64).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_values(kv: &KvRows, p: &[f32], out: &mut [f32]) {
    for c in (0..out.len()).step_by(64) {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &pj) in p.iter().enumerate() {
            if pj == 0.0 {
                continue;
            }
            let pv = _mm256_set1_ps(pj);
            // SAFETY: row start + j is inside the checked range; c + 64 <= head_dim.
            let v = unsafe { kv.v.as_ptr().add((kv.start + j) * kv.stride + c) };
            for (u, a) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                *a = _mm256_fmadd_ps(pv, unsafe { _mm256_loadu_ps(v.add(8 * u)) }, *a);
            }
        }
        for (u, a) in acc.iter().enumerate() {
            // SAFETY: c + 8 u + 8 <= out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * u), *a) };
        }
    }
}
