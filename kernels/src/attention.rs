//! Grouped-query attention over an f32 KV cache.
//!
//! The cache of one layer is laid out `[pos][n_kv_heads][head_dim]` (separate K and V
//! buffers); queries and outputs are `[n_heads][head_dim]` per token. Query head `h` reads
//! KV head `h / (n_heads / n_kv_heads)`. A query at position `pos` attends to cached
//! positions `t <= pos`, and with a sliding window `w` only to `t > pos - w`.
//! Scratch space for scores is passed in, so no call allocates.

use crate::dot::dot_f32;
use crate::ops::{axpy, reference, softmax_in_place};

/// Shape and options of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Multiplier applied to `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Sliding window: attend only to positions `> pos - window`.
    pub window: Option<usize>,
    /// Logit soft-capping: `cap * tanh(x / cap)` after scaling.
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// Plain causal attention with the usual `1/sqrt(head_dim)` scale.
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        AttentionParams {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }

    /// First attended position for a query at `pos`.
    pub fn first_pos(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    fn check(&self, q: &[f32], pos_end: usize, k: &[f32], v: &[f32], out: &[f32]) {
        assert!(
            self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads),
            "GQA shape"
        );
        let kv = pos_end * self.n_kv_heads * self.head_dim;
        assert!(
            k.len() >= kv && v.len() >= kv,
            "KV cache shorter than the positions used"
        );
        assert!(out.len() >= q.len(), "output too short");
    }
}

/// One query head against its KV head `g`: scores into `s`, weighted values into `oh`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn attend_head(
    p: &AttentionParams,
    qh: &[f32],
    pos: usize,
    g: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    oh: &mut [f32],
) {
    let hd = p.head_dim;
    let start = p.first_pos(pos);
    let s = &mut scores[..pos + 1 - start];
    let stride = p.n_kv_heads * hd;
    for (j, sj) in s.iter_mut().enumerate() {
        let off = (start + j) * stride + g * hd;
        *sj = dot_f32(qh, &k_cache[off..off + hd]) * p.scale;
    }
    if let Some(cap) = p.softcap {
        s.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
    }
    softmax_in_place(s);
    oh.fill(0.0);
    for (j, &w) in s.iter().enumerate() {
        let off = (start + j) * stride + g * hd;
        axpy(oh, w, &v_cache[off..off + hd]);
    }
}

/// Attention for the query heads of one token at `pos`, fast path.
///
/// `scores` needs at least `pos + 1` entries (or `window` with a window).
pub fn attention_one(
    p: &AttentionParams,
    q: &[f32],
    pos: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = p.head_dim;
    assert!(q.len() >= p.n_heads * hd);
    p.check(&q[..p.n_heads * hd], pos + 1, k_cache, v_cache, out);
    let group = p.n_heads / p.n_kv_heads;
    for h in 0..p.n_heads {
        let qh = &q[h * hd..(h + 1) * hd];
        let oh = &mut out[h * hd..(h + 1) * hd];
        attend_head(p, qh, pos, h / group, k_cache, v_cache, scores, oh);
    }
}

/// Multi-threaded attention for `m` tokens starting at `first_pos` (`m = 1` for decode),
/// parallel over (token, head) pairs. `scores` needs `pool.n_threads() * (first_pos + m)`
/// entries (one slice per thread).
#[allow(clippy::too_many_arguments)]
pub fn attention_par(
    p: &AttentionParams,
    q: &[f32],
    m: usize,
    first_pos: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    out: &mut [f32],
    pool: &crate::pool::ThreadPool,
) {
    let hd = p.head_dim;
    let w = p.n_heads * hd;
    let ctx = first_pos + m;
    assert!(q.len() >= m * w && out.len() >= m * w, "q/out too short");
    p.check(&q[..m * w], ctx, k_cache, v_cache, out);
    let nt = pool.n_threads();
    assert!(
        scores.len() >= nt * ctx,
        "scores needs n_threads * (first_pos + m) entries"
    );
    struct Shared(*mut f32, *mut f32);
    // SAFETY: output slices are disjoint per (token, head) chunk, and score slices are
    // disjoint per thread index, which parallel_for_indexed never hands to two running
    // chunks at once; both buffers stay mutably borrowed for the whole call.
    unsafe impl Sync for Shared {}
    let ptrs = Shared(out.as_mut_ptr(), scores.as_mut_ptr());
    let group = p.n_heads / p.n_kv_heads;
    pool.parallel_for_indexed(m * p.n_heads, |c, t| {
        let ptrs = &ptrs;
        let (i, h) = (c / p.n_heads, c % p.n_heads);
        // SAFETY: see `Shared`; c < m * n_heads so the output range is in bounds, and
        // t < n_threads so the scores range is in bounds (both asserted above).
        let (oh, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(ptrs.0.add(i * w + h * hd), hd),
                std::slice::from_raw_parts_mut(ptrs.1.add(t * ctx), ctx),
            )
        };
        let qh = &q[i * w + h * hd..i * w + (h + 1) * hd];
        attend_head(p, qh, first_pos + i, h / group, k_cache, v_cache, s, oh);
    });
}

/// Scalar reference of [`attention_one`].
pub fn attention_one_reference(
    p: &AttentionParams,
    q: &[f32],
    pos: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = p.head_dim;
    p.check(&q[..p.n_heads * hd], pos + 1, k_cache, v_cache, out);
    let start = p.first_pos(pos);
    let s = &mut scores[..pos + 1 - start];
    let stride = p.n_kv_heads * hd;
    let group = p.n_heads / p.n_kv_heads;
    for h in 0..p.n_heads {
        let g = h / group;
        for (j, sj) in s.iter_mut().enumerate() {
            let off = (start + j) * stride + g * hd;
            let mut d = 0.0f32;
            for e in 0..hd {
                d += q[h * hd + e] * k_cache[off + e];
            }
            *sj = d * p.scale;
            if let Some(cap) = p.softcap {
                *sj = cap * (*sj / cap).tanh();
            }
        }
        reference::softmax(s);
        for e in 0..hd {
            let mut acc = 0.0f32;
            for (j, &w) in s.iter().enumerate() {
                acc += w * v_cache[(start + j) * stride + g * hd + e];
            }
            out[h * hd + e] = acc;
        }
    }
}

/// Causal attention for `m` consecutive query tokens (prefill) starting at `first_pos`.
///
/// `q` and `out` are `[m][n_heads][head_dim]`; the cache must already hold positions up to
/// `first_pos + m - 1`; `scores` needs `first_pos + m` entries.
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill(
    p: &AttentionParams,
    q: &[f32],
    m: usize,
    first_pos: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let w = p.n_heads * p.head_dim;
    assert!(q.len() >= m * w && out.len() >= m * w);
    for i in 0..m {
        attention_one(
            p,
            &q[i * w..(i + 1) * w],
            first_pos + i,
            k_cache,
            v_cache,
            scores,
            &mut out[i * w..(i + 1) * w],
        );
    }
}

/// Scalar reference of [`attention_prefill`].
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_reference(
    p: &AttentionParams,
    q: &[f32],
    m: usize,
    first_pos: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    scores: &mut [f32],
    out: &mut [f32],
) {
    let w = p.n_heads * p.head_dim;
    for i in 0..m {
        attention_one_reference(
            p,
            &q[i * w..(i + 1) * w],
            first_pos + i,
            k_cache,
            v_cache,
            scores,
            &mut out[i * w..(i + 1) * w],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    /// Full masked softmax over every cached position, in f64.
    fn naive(p: &AttentionParams, q: &[f32], pos: usize, k: &[f32], v: &[f32], n_ctx: usize) -> Vec<f32> {
        let hd = p.head_dim;
        let stride = p.n_kv_heads * hd;
        let group = p.n_heads / p.n_kv_heads;
        let mut out = vec![0.0f32; p.n_heads * hd];
        for h in 0..p.n_heads {
            let g = h / group;
            let mut sc = vec![f64::NEG_INFINITY; n_ctx];
            for (t, st) in sc.iter_mut().enumerate() {
                let allowed = t <= pos && p.window.is_none_or(|w| t + w > pos);
                if allowed {
                    let mut d = 0.0f64;
                    for e in 0..hd {
                        d += q[h * hd + e] as f64 * k[t * stride + g * hd + e] as f64;
                    }
                    d *= p.scale as f64;
                    if let Some(c) = p.softcap {
                        d = c as f64 * (d / c as f64).tanh();
                    }
                    *st = d;
                }
            }
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let ex: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = ex.iter().sum();
            for e in 0..hd {
                let mut acc = 0.0f64;
                for t in 0..n_ctx {
                    acc += ex[t] / sum * v[t * stride + g * hd + e] as f64;
                }
                out[h * hd + e] = acc as f32;
            }
        }
        out
    }

    fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what} [{i}] {x} vs {y}");
        }
    }

    #[test]
    fn matches_reference_and_naive() {
        let mut rng = XorShift::new(11);
        let configs = [
            (4usize, 4usize, 16usize, None, None),
            (8, 2, 32, None, None),
            (8, 1, 64, Some(5usize), None),
            (4, 2, 24, Some(1), Some(50.0f32)),
            (6, 3, 8, Some(100), Some(2.0)),
        ];
        for (nh, nkv, hd, window, softcap) in configs {
            let mut p = AttentionParams::new(nh, nkv, hd);
            p.window = window;
            p.softcap = softcap;
            let n_ctx = 23;
            let k: Vec<f32> = rng.vec(n_ctx * nkv * hd).iter().map(|v| v * 3.0).collect();
            let v = rng.vec(n_ctx * nkv * hd);
            let mut scores = vec![0.0; n_ctx];
            // Decode at several positions.
            for pos in [0usize, 1, 7, 22] {
                let q = rng.vec(nh * hd);
                let mut a = vec![0.0; nh * hd];
                let mut b = vec![0.0; nh * hd];
                attention_one(&p, &q, pos, &k, &v, &mut scores, &mut a);
                attention_one_reference(&p, &q, pos, &k, &v, &mut scores, &mut b);
                close(&a, &b, 1e-5, "fast vs reference");
                close(&a, &naive(&p, &q, pos, &k, &v, n_ctx), 1e-5, "fast vs naive");
            }
            // Prefill of rows 10..23 with a causal mask.
            let (first, m) = (10usize, 13usize);
            let q = rng.vec(m * nh * hd);
            let mut a = vec![0.0; m * nh * hd];
            let mut b = vec![0.0; m * nh * hd];
            attention_prefill(&p, &q, m, first, &k, &v, &mut scores, &mut a);
            attention_prefill_reference(&p, &q, m, first, &k, &v, &mut scores, &mut b);
            close(&a, &b, 1e-5, "prefill fast vs reference");
            let pool = crate::pool::ThreadPool::new(3);
            let mut big = vec![0.0; 3 * n_ctx];
            let mut c = vec![0.0; m * nh * hd];
            attention_par(&p, &q, m, first, &k, &v, &mut big, &mut c, &pool);
            assert_eq!(a, c, "parallel attention differs");
            let w = nh * hd;
            for i in 0..m {
                let e = naive(&p, &q[i * w..(i + 1) * w], first + i, &k, &v, n_ctx);
                close(&a[i * w..(i + 1) * w], &e, 1e-5, "prefill vs naive");
            }
        }
    }

    #[test]
    fn single_position_copies_value() {
        let p = AttentionParams::new(2, 1, 4);
        let k = [1.0, 2.0, 3.0, 4.0];
        let v = [5.0, 6.0, 7.0, 8.0];
        let mut out = [0.0; 8];
        attention_one(&p, &[1.0; 8], 0, &k, &v, &mut [0.0; 1], &mut out);
        assert_eq!(out, [5.0, 6.0, 7.0, 8.0, 5.0, 6.0, 7.0, 8.0]);
    }
}
