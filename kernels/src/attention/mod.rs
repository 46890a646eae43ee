//! Causal attention of query heads against one KV head of a cache, in f32, as pure functions over
//! slices: [`head_attention`] for one head, [`group_attention`] for the query heads sharing a KV
//! head, [`group_attention_rows`] for consecutive rows of one sequence.
//!
//! The caller picks the KV head (grouped-query attention), the attended positions
//! ([`window_start`] for a sliding window) and the scratch buffers, so that a decoder can run the
//! heads of a batch on any threads without allocating on a warm step.

use crate::dot::dot_f32;
use crate::ops::{axpy, softcap, softmax, softmax_fast};
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

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
    let simd = AttentionTable::here().filter(|_| hd.is_multiple_of(64));
    if let Some(table) = simd {
        table.scores(q, hd, kv, opts, scores, stride);
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
        if simd.is_some() {
            softmax_fast(&mut scores[h * stride..h * stride + n]);
        } else {
            softmax(&mut scores[h * stride..h * stride + n]);
        }
    }
    if let Some(table) = simd {
        table.values(kv, scores, stride, len, out, hd);
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
    let rows_at_once = AttentionTable::here().filter(|t| {
        t.rows_at_once && hd.is_multiple_of(64) && n_rows > 1 && opts.iter().all(|o| o.sink.is_none())
    });
    let Some(table) = rows_at_once else {
        for ((qr, kr), or) in q.chunks_exact(width).zip(kv).zip(out.chunks_exact_mut(width)) {
            group_attention(qr, kr, opts, scores, or);
        }
        return;
    };
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
        // Every row's range was checked and lies inside `all`'s.
        table.scores(q, hd, &all, &vectors, scores, len);
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
        table.values(&all, scores, len, len, out, hd);
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

/// `(q, hd, kv, opts, scores, stride)`: `scores[h · stride + j] = (q_h · k_{start + j}) ·
/// scale_h` for every head `h < opts.len()` of `q`.
///
/// # Safety
/// The CPU has the set's features; the shapes are as [`AttentionTable::scores`] checks them.
type ScoresFn = unsafe fn(&[f32], usize, &KvRows, &[HeadOpts], &mut [f32], usize);

/// `(kv, p, stride, len, out, hd)`: `out_h = Σ_{j < len} p[h · stride + j] · v_{start + j}`
/// for every head `h < out.len() / hd`, in position order.
///
/// # Safety
/// The CPU has the set's features; the shapes are as [`AttentionTable::values`] checks them.
type ValuesFn = unsafe fn(&KvRows, &[f32], usize, usize, &mut [f32], usize);

/// One instruction set's attention kernels (a file per set: `avx512.rs`, `avx2.rs`; the
/// portable path above is the reference), chosen once ([`AttentionTable::here`]). Every set's
/// numbers are the AVX2 kernels' bit for bit.
#[derive(Clone, Copy)]
struct AttentionTable {
    /// The set's name, as `BERTH_KERNELS` spells it.
    name: &'static str,
    /// Every head's scores.
    scores: ScoresFn,
    /// Every head's weighted sum of values.
    values: ValuesFn,
    /// Whether [`group_attention_rows`] runs the rows of a sequence as one group (each key and
    /// value read once for all of them) rather than one by one.
    rows_at_once: bool,
}

impl AttentionTable {
    /// The best set this CPU and `BERTH_KERNELS` allow, chosen once; None: the portable path.
    fn here() -> Option<&'static AttentionTable> {
        use crate::KernelLevel;
        static HERE: OnceLock<Option<&'static AttentionTable>> = OnceLock::new();
        *HERE.get_or_init(|| {
            let candidates = [
                #[cfg(target_arch = "x86_64")]
                (
                    KernelLevel::Avx512,
                    KernelLevel::Avx512.supported(),
                    Some(&avx512::TABLE),
                ),
                #[cfg(target_arch = "x86_64")]
                (
                    KernelLevel::Avx2,
                    KernelLevel::Avx2.supported(),
                    Some(&avx2::TABLE),
                ),
                (KernelLevel::Scalar, true, None),
            ];
            crate::select_table("attention", &candidates)
        })
    }

    /// The checked call of [`AttentionTable::scores`]: `hd` a multiple of 64, every key row of
    /// `kv`'s range inside the cache, `q` `opts.len()` heads of `hd`, `scores` as many rows of
    /// `stride >= kv.end - kv.start`.
    fn scores(
        &self,
        q: &[f32],
        hd: usize,
        kv: &KvRows,
        opts: &[HeadOpts],
        scores: &mut [f32],
        stride: usize,
    ) {
        assert!(
            hd > 0 && hd.is_multiple_of(64),
            "{} attention kernels: head dimension {hd}",
            self.name
        );
        kv.check(hd);
        assert!(q.len() >= opts.len() * hd && stride >= kv.end - kv.start);
        assert!(
            scores.len() >= opts.len() * stride,
            "attention kernels: scores too short"
        );
        // SAFETY: the table was chosen only where this CPU has its features; shapes checked.
        unsafe { (self.scores)(q, hd, kv, opts, scores, stride) }
    }

    /// The checked call of [`AttentionTable::values`]: as [`AttentionTable::scores`], with
    /// `len = kv.end - kv.start`, `out` whole heads of `hd` and `p` a row of `stride` per head.
    fn values(&self, kv: &KvRows, p: &[f32], stride: usize, len: usize, out: &mut [f32], hd: usize) {
        assert!(
            hd > 0 && hd.is_multiple_of(64),
            "{} attention kernels: head dimension {hd}",
            self.name
        );
        kv.check(hd);
        assert!(len == kv.end - kv.start && stride >= len && out.len().is_multiple_of(hd));
        let heads = out.len() / hd;
        assert!(
            heads == 0 || p.len() >= (heads - 1) * stride + len,
            "attention kernels: p too short"
        );
        // SAFETY: as in `scores`.
        unsafe { (self.values)(kv, p, stride, len, out, hd) }
    }
}
