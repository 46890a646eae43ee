//! Causal attention of query heads against one KV head of a cache, in f32, as pure functions over
//! slices: [`head_attention`] for one head, [`group_attention`] for the query heads sharing a KV
//! head, [`group_attention_rows`] for consecutive rows of one sequence.
//!
//! The caller picks the KV head (grouped-query attention), the attended positions
//! ([`window_start`] for a sliding window) and the scratch buffers, so that a decoder can run the
//! heads of a batch on any threads without allocating on a warm step.

use crate::dot::dot_f32;
use crate::ops::{axpy, softcap, softmax, softmax_fast};

/// The cached keys and values one query head attends to.
#[derive(Clone, Copy, Debug)]
pub struct KvRows<'a> {
    /// Keys: the row of cache position `t` is `k[t * stride..t * stride + head_dim]` (start the
    /// slice at the KV head's offset within a position).
    pub k: &'a [f32],
    /// Values, laid out like [`KvRows::k`].
    pub v: &'a [f32],
    /// Distance between the rows of consecutive positions.
    pub stride: usize,
    /// First attended position (see [`window_start`]).
    pub start: usize,
    /// One past the last attended position (the query's position + 1).
    pub end: usize,
}

impl KvRows<'_> {
    /// Panics unless every attended row of `head_dim` lies inside `k` and `v`.
    fn check(&self, head_dim: usize) {
        assert!(self.start <= self.end, "attention: start past end");
        if self.start < self.end {
            let last = (self.end - 1) * self.stride + head_dim;
            assert!(
                last <= self.k.len() && last <= self.v.len(),
                "attention: KV rows out of range"
            );
        }
    }

    #[inline]
    fn key(&self, t: usize, head_dim: usize) -> &[f32] {
        &self.k[t * self.stride..t * self.stride + head_dim]
    }

    #[inline]
    fn value(&self, t: usize, head_dim: usize) -> &[f32] {
        &self.v[t * self.stride..t * self.stride + head_dim]
    }
}

/// How the scores of one head are formed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadOpts {
    /// Multiplier of `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Soft-capping of the scaled scores: `cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// The head's learned sink logit (gpt-oss): one more column in the softmax whose
    /// probability is dropped, so the attended positions' weights sum to less than one.
    pub sink: Option<f32>,
}

impl HeadOpts {
    /// Scores scaled by `scale`, no soft-capping, no sink.
    pub fn scaled(scale: f32) -> HeadOpts {
        HeadOpts {
            scale,
            softcap: None,
            sink: None,
        }
    }
}

/// First position a query at `pos` attends to: 0, or `pos + 1 - window` with a sliding window.
pub fn window_start(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// One query head in f32: `scores = softmax(softcap(q·k_t · scale))` over `kv.start..kv.end`
/// (and the sink logit, when there is one, as a last column that is then dropped),
/// `out = Σ scores_t · v_t`. `out` and `q` have the head dimension; `scores` is scratch.
///
/// The dot products use [`crate::dot::dot_f32`]; the softmax is [`crate::ops::softmax`] (libm
/// `exp`, f64 sum) and the weighted sum [`crate::ops::axpy`] in position order.
pub fn head_attention(q: &[f32], kv: &KvRows, opts: &HeadOpts, scores: &mut Vec<f32>, out: &mut [f32]) {
    group_attention(q, kv, std::slice::from_ref(opts), scores, out);
}

/// Several query heads that share one KV head (`q` and `out`: `opts.len()` heads back to back,
/// `opts[h]` for head `h`), each as [`head_attention`] computes it alone (bit for bit: a head's
/// numbers never depend on the others), with every cached key and value read once for them.
///
/// With AVX2 and a head dimension that is a multiple of 64, the scores and the weighted sum of
/// values are fused multiply-adds held in registers (the weighted sum in position order, one
/// accumulator per lane) and the softmax is [`softmax_fast`]: the same results on every call,
/// close to the portable path's.
pub fn group_attention(q: &[f32], kv: &KvRows, opts: &[HeadOpts], scores: &mut Vec<f32>, out: &mut [f32]) {
    let (g, hd) = (opts.len(), group_head_dim(q, kv, opts.len(), out));
    let len = kv.end - kv.start;
    // Head h's scores at h * stride, with room for its sink.
    let stride = len + 1;
    scores.clear();
    scores.resize(g * stride, 0.0);
    #[cfg(target_arch = "x86_64")]
    let fast = crate::dot::has_avx2() && hd.is_multiple_of(64);
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    #[cfg(target_arch = "x86_64")]
    let wide = fast && crate::kernel_level() >= crate::KernelLevel::Avx512;
    if fast {
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: AVX-512F (the kernel level), AVX2 and FMA are present; kv.check(hd)
            // confirmed every key row of the range; scores holds g rows of `stride >= len`.
            unsafe { avx512::group_scores(q, hd, kv, opts, scores, stride) };
        } else {
            for (h, o) in opts.iter().enumerate() {
                // SAFETY: AVX2 and FMA are present (has_avx2); kv.check(hd) confirmed every key
                // row of the range, and the slices have the lengths asserted above.
                unsafe {
                    avx2::scores(
                        &q[h * hd..(h + 1) * hd],
                        kv,
                        o.scale,
                        &mut scores[h * stride..h * stride + len],
                    )
                };
            }
        }
    } else {
        for (j, t) in (kv.start..kv.end).enumerate() {
            let k = kv.key(t, hd);
            for (h, o) in opts.iter().enumerate() {
                scores[h * stride + j] = dot_f32(&q[h * hd..(h + 1) * hd], k) * o.scale;
            }
        }
    }
    for (h, o) in opts.iter().enumerate() {
        let sh = &mut scores[h * stride..h * stride + len];
        if let Some(cap) = o.softcap {
            softcap(sh, cap);
        }
        let n = len + usize::from(o.sink.is_some());
        if let Some(sink) = o.sink {
            scores[h * stride + len] = sink;
        }
        if fast {
            softmax_fast(&mut scores[h * stride..h * stride + n]);
        } else {
            softmax(&mut scores[h * stride..h * stride + n]);
        }
    }
    if fast {
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: as for the scores; value rows are checked like key rows; out holds g
            // heads of hd.
            unsafe { avx512::group_values(kv, scores, stride, len, out, hd) };
        } else {
            for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
                // SAFETY: as for the scores; value rows are checked like key rows.
                unsafe { avx2::weighted_values(kv, &scores[h * stride..h * stride + len], oh) };
            }
        }
        return;
    }
    out.fill(0.0);
    // With a sink, its probability is the entry past the positions.
    for (j, t) in (kv.start..kv.end).enumerate() {
        let v = kv.value(t, hd);
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            axpy(oh, scores[h * stride + j], v);
        }
    }
}

/// Several rows of one sequence against the same KV head: row `r` holds `opts.len()` query
/// heads (`q` and `out`: rows back to back, each `opts.len()` heads of the head dimension) and
/// attends to `kv[r]` (every entry the same cache, `k`, `v` and `stride`, with the row's own
/// range). Each row is bit for bit what [`group_attention`] computes for it alone; with
/// AVX-512, every cached key and value of the rows' ranges is read once for all of them.
pub fn group_attention_rows(
    q: &[f32],
    kv: &[KvRows],
    opts: &[HeadOpts],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (n_rows, g) = (kv.len(), opts.len());
    assert!(
        n_rows > 0 && q.len().is_multiple_of(n_rows),
        "attention: q is not whole rows"
    );
    assert_eq!(out.len(), q.len(), "attention: output is not the rows");
    let width = q.len() / n_rows;
    let hd = group_head_dim(&q[..width], &kv[0], g, &out[..width]);
    #[cfg(target_arch = "x86_64")]
    let wide = crate::dot::has_avx2()
        && crate::kernel_level() >= crate::KernelLevel::Avx512
        && hd.is_multiple_of(64)
        && n_rows > 1
        && opts.iter().all(|o| o.sink.is_none());
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    if !wide {
        for ((qr, kr), or) in q.chunks_exact(width).zip(kv).zip(out.chunks_exact_mut(width)) {
            group_attention(qr, kr, opts, scores, or);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // The row reaching furthest holds the longest slices of the cache.
        let last = *kv.iter().max_by_key(|r| r.end).expect("at least one row");
        for r in kv {
            assert!(
                r.k.as_ptr() == last.k.as_ptr() && r.v.as_ptr() == last.v.as_ptr() && r.stride == last.stride,
                "attention: rows of different caches"
            );
            r.check(hd);
        }
        let (start, end) = (kv.iter().map(|r| r.start).min().unwrap_or(0), last.end);
        let all = KvRows { start, ..last };
        let len = end - start;
        // Every (row, head) is one vector of the group; its scores span the rows' union.
        let vectors: Vec<HeadOpts> = (0..n_rows).flat_map(|_| opts.iter().copied()).collect();
        scores.clear();
        scores.resize(vectors.len() * len, 0.0);
        // SAFETY: AVX-512F (the kernel level), AVX2 and FMA are present; every row's range was
        // checked and lies inside `all`'s; q holds `vectors.len()` heads of hd and scores
        // that many rows of `len`.
        unsafe { avx512::group_scores(q, hd, &all, &vectors, scores, len) };
        for (v, o) in vectors.iter().enumerate() {
            let r = &kv[v / g];
            let row = &mut scores[v * len..(v + 1) * len];
            let (a, b) = (r.start - start, r.end - start);
            row[..a].fill(0.0);
            row[b..].fill(0.0);
            if let Some(cap) = o.softcap {
                softcap(&mut row[a..b], cap);
            }
            softmax_fast(&mut row[a..b]);
        }
        // SAFETY: as for the scores; value rows are checked like key rows; out holds
        // `vectors.len()` heads of hd.
        unsafe { avx512::group_values(&all, scores, len, len, out, hd) };
    }
}

/// The head dimension of `g` heads in `q` (and `out`), checked against `kv`.
fn group_head_dim(q: &[f32], kv: &KvRows, g: usize, out: &[f32]) -> usize {
    assert!(
        g > 0 && q.len().is_multiple_of(g),
        "attention: q is not whole heads"
    );
    let hd = q.len() / g;
    assert_eq!(out.len(), q.len(), "attention: output is not the heads");
    kv.check(hd);
    hd
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::KvRows;
    use crate::dot::avx2::hsum_ps;
    use std::arch::x86_64::*;

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
}

/// The AVX2 kernels of [`group_attention`] with AVX-512 registers: every head of a group and
/// four keys (or 64 value dimensions) per pass, each number bit for bit what the AVX2 kernel
/// computes. A score's 16-lane accumulator holds the AVX2 kernel's two 8-lane accumulators side
/// by side (dimensions `i..i + 8` low, `i + 8..i + 16` high) and is reduced as they are; every
/// lane of a weighted sum is the same fused multiply-add chain in position order.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{HeadOpts, KvRows};
    use crate::dot::avx2::hsum_ps;
    use std::arch::x86_64::*;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::round_f16;
    use crate::testutil::XorShift;

    /// Masked softmax attention of one head in f64, from the definition.
    fn naive(q: &[f32], kv: &KvRows, opts: &HeadOpts) -> Vec<f32> {
        let hd = q.len();
        let sc: Vec<f64> = (kv.start..kv.end)
            .map(|t| {
                let d: f64 = (0..hd)
                    .map(|e| q[e] as f64 * kv.k[t * kv.stride + e] as f64)
                    .sum();
                let d = d * opts.scale as f64;
                opts.softcap.map_or(d, |c| c as f64 * (d / c as f64).tanh())
            })
            .collect();
        // A sink is one more logit in the softmax whose weight multiplies no value.
        let sink = opts.sink.map(f64::from);
        let mx = sc.iter().chain(&sink).cloned().fold(f64::NEG_INFINITY, f64::max);
        let ex: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
        let sum: f64 = ex.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - mx).exp());
        (0..hd)
            .map(|e| {
                let acc: f64 = (kv.start..kv.end)
                    .zip(&ex)
                    .map(|(t, w)| w / sum * kv.v[t * kv.stride + e] as f64)
                    .sum();
                acc as f32
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what} [{i}] {x} vs {y}");
        }
    }

    #[test]
    fn heads_match_naive_attention() {
        let mut rng = XorShift::new(11);
        // (kv heads, head_dim, window, softcap, sink)
        let configs = [
            (1usize, 16usize, None, None, None),
            (2, 32, None, None, None),
            (2, 64, Some(5usize), None, None),
            (3, 24, Some(1), Some(50.0f32), None),
            (1, 256, Some(100), Some(2.0), None),
            (4, 8, None, Some(30.0), None),
            (2, 16, Some(4), None, Some(0.7f32)),
            (1, 64, None, None, Some(-1.5)),
            (2, 32, None, None, Some(4.0)),
        ];
        let mut scores = Vec::new();
        for (nkv, hd, window, cap, sink) in configs {
            let n_ctx = 40;
            let stride = nkv * hd + 3; // rows padded: stride need not be nkv * hd
            let r16 = |v: &f32| round_f16(v * 3.0);
            let k: Vec<f32> = rng.vec(n_ctx * stride).iter().map(r16).collect();
            let v: Vec<f32> = rng.vec(n_ctx * stride).iter().map(r16).collect();
            let opts = HeadOpts {
                scale: 1.0 / (hd as f32).sqrt(),
                softcap: cap,
                sink,
            };
            for pos in [0usize, 1, 7, 31, 32, 39] {
                for kh in 0..nkv {
                    let q = rng.vec(hd);
                    let kv = KvRows {
                        k: &k[kh * hd..],
                        v: &v[kh * hd..],
                        stride,
                        start: window_start(pos, window),
                        end: pos + 1,
                    };
                    let want = naive(&q, &kv, &opts);
                    let mut o = vec![f32::NAN; hd];
                    head_attention(&q, &kv, &opts, &mut scores, &mut o);
                    close(&o, &want, 1e-5, "f32 vs naive");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_scores_equal_each_key_alone_bit_for_bit() {
        if !crate::dot::has_avx2() {
            eprintln!("avx2 attention scores not run: no AVX2/FMA on this CPU");
            return;
        }
        let mut rng = XorShift::new(21);
        for hd in [64usize, 128, 256] {
            let (n_ctx, stride) = (23usize, hd + 8);
            let (k, q) = (rng.vec(n_ctx * stride), rng.vec(hd));
            for start in 0..5 {
                let kv = KvRows {
                    k: &k,
                    v: &k,
                    stride,
                    start,
                    end: n_ctx,
                };
                let mut all = vec![f32::NAN; n_ctx - start];
                // SAFETY: AVX2 and FMA are present; every row lies inside `k`.
                unsafe { avx2::scores(&q, &kv, 0.3, &mut all) };
                for (j, &got) in all.iter().enumerate() {
                    let one = KvRows {
                        start: start + j,
                        end: start + j + 1,
                        ..kv
                    };
                    let mut alone = [f32::NAN];
                    // SAFETY: as above.
                    unsafe { avx2::scores(&q, &one, 0.3, &mut alone) };
                    assert_eq!(got.to_bits(), alone[0].to_bits(), "hd {hd} start {start} key {j}");
                    let want = dot_f32(&q, &k[(start + j) * stride..(start + j) * stride + hd]) * 0.3;
                    assert!((got - want).abs() < 1e-4, "hd {hd} key {j}: {got} vs {want}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_group_kernels_equal_the_avx2_kernels_bit_for_bit() {
        if !(crate::dot::has_avx2() && crate::KernelLevel::Avx512.supported()) {
            eprintln!("avx512 attention kernels not run: no AVX-512F on this CPU");
            return;
        }
        let mut rng = XorShift::new(33);
        for hd in [64usize, 256] {
            let (n_ctx, stride) = (37usize, hd + 16);
            let (k, v) = (rng.vec(n_ctx * stride), rng.vec(n_ctx * stride));
            for g in [1usize, 2, 3, 4, 5, 7, 8] {
                let q = rng.vec(g * hd);
                let opts: Vec<HeadOpts> = (0..g).map(|h| HeadOpts::scaled(0.1 + h as f32)).collect();
                for (start, end) in [(0usize, 1usize), (0, 3), (2, 9), (5, 37)] {
                    let kv = KvRows {
                        k: &k,
                        v: &v,
                        stride,
                        start,
                        end,
                    };
                    let (len, sstride) = (end - start, end - start + 3);
                    let mut wide = vec![f32::NAN; g * sstride];
                    // SAFETY: AVX-512F, AVX2 and FMA are present; every row lies inside k
                    // and v; the buffers have the documented sizes.
                    unsafe { avx512::group_scores(&q, hd, &kv, &opts, &mut wide, sstride) };
                    let mut p = rng.vec(g * sstride);
                    p.iter_mut().step_by(5).for_each(|x| *x = 0.0);
                    let mut out = vec![f32::NAN; g * hd];
                    // SAFETY: as above.
                    unsafe { avx512::group_values(&kv, &p, sstride, len, &mut out, hd) };
                    for h in 0..g {
                        let mut narrow = vec![f32::NAN; len];
                        // SAFETY: as above.
                        unsafe { avx2::scores(&q[h * hd..(h + 1) * hd], &kv, opts[h].scale, &mut narrow) };
                        assert_eq!(
                            bits(&wide[h * sstride..h * sstride + len]),
                            bits(&narrow),
                            "scores hd {hd} g {g} head {h} {start}..{end}"
                        );
                        let mut o = vec![f32::NAN; hd];
                        // SAFETY: as above.
                        unsafe { avx2::weighted_values(&kv, &p[h * sstride..h * sstride + len], &mut o) };
                        assert_eq!(
                            bits(&out[h * hd..(h + 1) * hd]),
                            bits(&o),
                            "values hd {hd} g {g} head {h} {start}..{end}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rows_of_one_sequence_equal_each_row_alone_bit_for_bit() {
        let mut rng = XorShift::new(44);
        // 64 and 256: the AVX-512 path where there is one; 32: the portable one.
        for hd in [64usize, 256, 32] {
            let (n_ctx, stride) = (90usize, 2 * hd);
            let (k, v) = (rng.vec(n_ctx * stride), rng.vec(n_ctx * stride));
            let mut scores = Vec::new();
            for (g, cap, window) in [
                (1usize, None, None),
                (4, Some(20.0f32), None),
                (7, None, Some(30usize)),
            ] {
                let opts: Vec<HeadOpts> = (0..g)
                    .map(|h| HeadOpts {
                        softcap: cap,
                        ..HeadOpts::scaled(0.125 + 0.01 * h as f32)
                    })
                    .collect();
                for (first, n_rows) in [(0usize, 2usize), (3, 5), (40, 8), (85, 5)] {
                    let kv: Vec<KvRows> = (first..first + n_rows)
                        .map(|pos| KvRows {
                            k: &k[hd..(pos + 1) * stride],
                            v: &v[hd..(pos + 1) * stride],
                            stride,
                            start: window_start(pos, window),
                            end: pos + 1,
                        })
                        .collect();
                    let q = rng.vec(n_rows * g * hd);
                    let mut got = vec![f32::NAN; q.len()];
                    group_attention_rows(&q, &kv, &opts, &mut scores, &mut got);
                    let w = g * hd;
                    for (r, kr) in kv.iter().enumerate() {
                        let mut want = vec![f32::NAN; w];
                        group_attention(&q[r * w..(r + 1) * w], kr, &opts, &mut scores, &mut want);
                        assert_eq!(
                            bits(&got[r * w..(r + 1) * w]),
                            bits(&want),
                            "hd {hd} g {g} rows {first}+{n_rows} row {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_heads_equal_each_head_alone_bit_for_bit() {
        let mut rng = XorShift::new(12);
        // 64: the AVX2 path where there is one; 32: the portable one.
        for hd in [64usize, 32] {
            let (g, n_ctx) = (3usize, 300usize);
            let stride = hd + 5;
            let r16 = |v: &f32| round_f16(v * 3.0);
            let k: Vec<f32> = rng.vec(n_ctx * stride).iter().map(r16).collect();
            let v: Vec<f32> = rng.vec(n_ctx * stride).iter().map(r16).collect();
            let mut scores = Vec::new();
            for (cap, sinks) in [
                (None, [None, None, None]),
                (Some(30.0f32), [Some(0.5f32), Some(-2.0), Some(1.0)]),
            ] {
                let opts: Vec<HeadOpts> = sinks
                    .iter()
                    .map(|&sink| HeadOpts {
                        scale: 0.2,
                        softcap: cap,
                        sink,
                    })
                    .collect();
                for (pos, window) in [(0usize, None), (40, None), (299, None), (299, Some(50usize))] {
                    let kv = KvRows {
                        k: &k,
                        v: &v,
                        stride,
                        start: window_start(pos, window),
                        end: pos + 1,
                    };
                    let q = rng.vec(g * hd);
                    let mut got = vec![f32::NAN; g * hd];
                    group_attention(&q, &kv, &opts, &mut scores, &mut got);
                    let mut want = vec![f32::NAN; g * hd];
                    for h in 0..g {
                        head_attention(
                            &q[h * hd..(h + 1) * hd],
                            &kv,
                            &opts[h],
                            &mut scores,
                            &mut want[h * hd..(h + 1) * hd],
                        );
                    }
                    assert_eq!(bits(&got), bits(&want), "f32 pos {pos}");
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn single_position_copies_value() {
        let k = [1.0, 2.0, 3.0, 4.0];
        let v = [5.0, 6.0, 7.0, 8.0];
        let kv = KvRows {
            k: &k,
            v: &v,
            stride: 4,
            start: 0,
            end: 1,
        };
        let opts = HeadOpts::scaled(0.5);
        let mut out = [0.0; 4];
        head_attention(&[1.0; 4], &kv, &opts, &mut Vec::new(), &mut out);
        assert_eq!(out, v);
        assert_eq!(window_start(10, Some(4)), 7);
        assert_eq!(window_start(2, Some(4)), 0);
        assert_eq!(window_start(10, None), 0);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn rows_outside_the_cache_panic() {
        let k = [0.0; 8];
        let kv = KvRows {
            k: &k,
            v: &k,
            stride: 4,
            start: 0,
            end: 3,
        };
        let opts = HeadOpts::scaled(1.0);
        head_attention(&[1.0; 4], &kv, &opts, &mut Vec::new(), &mut [0.0; 4]);
    }

    #[test]
    fn a_sink_takes_its_share_of_the_probability() {
        // One position with score q·k · scale = 1 and a sink of logit 2: the value is weighted
        // by e^1 / (e^1 + e^2), the sink's share multiplying nothing.
        let k = [1.0, 1.0, 0.0, 0.0];
        let v = [2.0, -4.0, 8.0, 1.0];
        let kv = KvRows {
            k: &k,
            v: &v,
            stride: 4,
            start: 0,
            end: 1,
        };
        let opts = HeadOpts {
            sink: Some(2.0),
            ..HeadOpts::scaled(0.5)
        };
        let w = (1.0f64.exp() / (1.0f64.exp() + 2.0f64.exp())) as f32;
        let want: Vec<f32> = v.iter().map(|x| x * w).collect();
        let mut out = [0.0; 4];
        head_attention(&[1.0; 4], &kv, &opts, &mut Vec::new(), &mut out);
        close(&out, &want, 1e-6, "f32 with a sink");
        // A sink far below the scores changes nothing.
        let far = HeadOpts {
            sink: Some(-1e4),
            ..opts
        };
        head_attention(&[1.0; 4], &kv, &far, &mut Vec::new(), &mut out);
        assert_eq!(out, v);
    }
}
