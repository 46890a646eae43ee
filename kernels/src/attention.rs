//! Causal attention of one query head against one KV head of a cache, as pure functions over
//! slices: [`head_attention`] in f32, [`head_attention_f16`] as llama.cpp computes it over an F16
//! KV cache (see [`crate::ggml`]).
//!
//! The caller picks the KV head (grouped-query attention), the attended positions
//! ([`window_start`] for a sliding window) and the scratch buffers, so that a decoder can run the
//! heads of a batch on any threads without allocating on a warm step.

use crate::dot::dot_f32;
use crate::ggml::{dot_f16, softmax_ggml_sink, F16DotOrder};
use crate::ops::{axpy, round_f16, softcap, softmax, softmax_fast};

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
    /// [`head_attention_f16`] only: multiply the query by `scale` before rounding it to f16
    /// (llama.cpp scales q first for some models) instead of multiplying the scores.
    pub q_prescale: bool,
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
            q_prescale: false,
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
    if fast {
        #[cfg(target_arch = "x86_64")]
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
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            // SAFETY: as for the scores; value rows are checked like key rows.
            unsafe { avx2::weighted_values(kv, &scores[h * stride..h * stride + len], oh) };
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

/// llama.cpp pads its KV cache's cell count to a multiple of this; the value product runs over
/// that many cells, which decides where [`F16DotOrder::VecDot`]'s f64 tail starts.
pub const GGML_KV_PAD: usize = 256;

/// Buffers of [`head_attention_f16`], reused across the heads one thread computes.
#[derive(Clone, Debug, Default)]
pub struct F16Scratch {
    scores: Vec<f32>,
    q16: Vec<f32>,
    /// Value accumulators per head, slot-major: slot `s` of dimension `i` at
    /// `s * head_dim + i`.
    acc: Vec<f32>,
    tail: Vec<f64>,
}

/// One query head as llama.cpp computes it over its F16 KV cache without flash attention: the
/// cache holds f16 values (the caller rounds them when storing, e.g. with
/// [`crate::ops::round_f16_in_place`]), the query is rounded to f16 (after the scale when
/// `opts.q_prescale`), scores and the probability-weighted values are f16 dot products summed in
/// ggml's lane order (`order`: [`F16DotOrder::for_rows`] of the sequence's rows in the batch), the
/// softmax is [`softmax_ggml_sink`] (with the head's sink, as ggml's `soft_max_add_sinks`), and
/// the probabilities are rounded to f16.
pub fn head_attention_f16(
    q: &[f32],
    kv: &KvRows,
    opts: &HeadOpts,
    order: F16DotOrder,
    f: &mut F16Scratch,
    out: &mut [f32],
) {
    group_attention_f16(q, kv, std::slice::from_ref(opts), order, f, out);
}

/// Several query heads that share one KV head (`q` and `out`: `opts.len()` heads back to back),
/// each bit for bit as [`head_attention_f16`] computes it alone, with every cached key and value
/// read once for all of them.
pub fn group_attention_f16(
    q: &[f32],
    kv: &KvRows,
    opts: &[HeadOpts],
    order: F16DotOrder,
    f: &mut F16Scratch,
    out: &mut [f32],
) {
    let (g, hd) = (opts.len(), group_head_dim(q, kv, opts.len(), out));
    let len = kv.end - kv.start;
    f.q16.clear();
    for (h, o) in opts.iter().enumerate() {
        let pre = if o.q_prescale { o.scale } else { 1.0 };
        f.q16
            .extend(q[h * hd..(h + 1) * hd].iter().map(|&b| round_f16(b * pre)));
    }
    f.scores.clear();
    f.scores.resize(g * len, 0.0);
    for (j, t) in (kv.start..kv.end).enumerate() {
        let k = kv.key(t, hd);
        for (h, o) in opts.iter().enumerate() {
            let s = dot_f16(order, &f.q16[h * hd..(h + 1) * hd], k);
            let post = if o.q_prescale { 1.0 } else { o.scale };
            f.scores[h * len + j] = if post == 1.0 { s } else { s * post };
        }
    }
    for (h, o) in opts.iter().enumerate() {
        let sh = &mut f.scores[h * len..(h + 1) * len];
        if let Some(cap) = o.softcap {
            softcap(sh, cap);
        }
        softmax_ggml_sink(sh, kv.start, o.sink);
    }
    // The value rows are dotted with the probabilities along the cells (ggml multiplies the
    // transposed V cache by the f16 probabilities): cell t goes to slot `order.slot(t)` of every
    // dimension, cells past the vectorised part to an f64 tail.
    let n_cells = kv.end.next_multiple_of(GGML_KV_PAD);
    let nv = order.vector_len(n_cells);
    let per = order.slots() * hd;
    f.acc.clear();
    f.acc.resize(g * per, 0.0);
    let tail = if nv < kv.end { hd } else { 0 };
    f.tail.clear();
    f.tail.resize(g * tail, 0.0);
    for (j, t) in (kv.start..kv.end).enumerate() {
        let vr = kv.value(t, hd);
        for h in 0..g {
            let p = round_f16(f.scores[h * len + j]);
            if p == 0.0 {
                continue;
            }
            if t < nv {
                let slot = order.slot(t);
                axpy(&mut f.acc[h * per + slot * hd..h * per + (slot + 1) * hd], p, vr);
            } else {
                f.tail[h * tail..(h + 1) * tail]
                    .iter_mut()
                    .zip(vr)
                    .for_each(|(a, &v)| *a += (p * v) as f64);
            }
        }
    }
    let mut x = [0.0f32; 32];
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        for (i, oi) in oh.iter_mut().enumerate() {
            for (s, xs) in x.iter_mut().enumerate().take(order.slots()) {
                *xs = f.acc[h * per + s * hd + i];
            }
            *oi = order.reduce(&x, f.tail.get(h * tail + i).copied().unwrap_or(0.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// The decoder's f16 head attention as first written (slot arrays per dimension), to check
    /// the slot-major rewrite against bit for bit.
    fn f16_as_written(q: &[f32], kv: &KvRows, opts: &HeadOpts, order: F16DotOrder) -> Vec<f32> {
        let hd = q.len();
        let (pre, post) = if opts.q_prescale {
            (opts.scale, 1.0)
        } else {
            (1.0, opts.scale)
        };
        let q16: Vec<f32> = q.iter().map(|&b| round_f16(b * pre)).collect();
        let mut scores: Vec<f32> = (kv.start..kv.end)
            .map(|t| {
                let s = dot_f16(order, &q16, &kv.k[t * kv.stride..t * kv.stride + hd]);
                if post == 1.0 {
                    s
                } else {
                    s * post
                }
            })
            .collect();
        if let Some(cap) = opts.softcap {
            softcap(&mut scores, cap);
        }
        softmax_ggml_sink(&mut scores, kv.start, opts.sink);
        let mut acc = vec![[0.0f32; 32]; hd];
        let n_cells = kv.end.next_multiple_of(256);
        let nv = order.vector_len(n_cells);
        let mut tail = vec![0.0f64; if nv < kv.end { hd } else { 0 }];
        for (t, &p) in (kv.start..kv.end).zip(&scores) {
            let p = round_f16(p);
            if p == 0.0 {
                continue;
            }
            let vr = &kv.v[t * kv.stride..t * kv.stride + hd];
            if t < nv {
                let slot = order.slot(t);
                acc.iter_mut().zip(vr).for_each(|(a, &v)| a[slot] += p * v);
            } else {
                tail.iter_mut().zip(vr).for_each(|(a, &v)| *a += (p * v) as f64);
            }
        }
        (0..hd)
            .map(|i| order.reduce(&acc[i], tail.get(i).copied().unwrap_or(0.0)))
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
        // (kv heads, head_dim, window, softcap, q_prescale, sink)
        let configs = [
            (1usize, 16usize, None, None, false, None),
            (2, 32, None, None, true, None),
            (2, 64, Some(5usize), None, false, None),
            (3, 24, Some(1), Some(50.0f32), false, None),
            (1, 256, Some(100), Some(2.0), true, None),
            (4, 8, None, Some(30.0), false, None),
            (2, 16, Some(4), None, false, Some(0.7f32)),
            (1, 64, None, None, true, Some(-1.5)),
            (2, 32, None, None, false, Some(4.0)),
        ];
        let (mut scores, mut f16) = (Vec::new(), F16Scratch::default());
        for (nkv, hd, window, cap, q_prescale, sink) in configs {
            let n_ctx = 40;
            let stride = nkv * hd + 3; // rows padded: stride need not be nkv * hd
            let r16 = |v: &f32| round_f16(v * 3.0);
            let k: Vec<f32> = rng.vec(n_ctx * stride).iter().map(r16).collect();
            let v: Vec<f32> = rng.vec(n_ctx * stride).iter().map(r16).collect();
            let opts = HeadOpts {
                scale: 1.0 / (hd as f32).sqrt(),
                softcap: cap,
                q_prescale,
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
                    for order in [F16DotOrder::Gemm, F16DotOrder::VecDot] {
                        let mut o16 = vec![f32::NAN; hd];
                        head_attention_f16(&q, &kv, &opts, order, &mut f16, &mut o16);
                        // f16 query and probabilities: ~1e-3 relative.
                        close(&o16, &want, 4e-3, "f16 vs naive");
                        let w = f16_as_written(&q, &kv, &opts, order);
                        for (i, (a, b)) in o16.iter().zip(&w).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "f16 vs as written [{i}] {order:?}");
                        }
                    }
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
            let (mut scores, mut f16) = (Vec::new(), F16Scratch::default());
            for (cap, q_prescale, sinks) in [
                (None, false, [None, None, None]),
                (Some(30.0f32), true, [Some(0.5f32), Some(-2.0), Some(1.0)]),
            ] {
                let opts: Vec<HeadOpts> = sinks
                    .iter()
                    .map(|&sink| HeadOpts {
                        scale: 0.2,
                        softcap: cap,
                        q_prescale,
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
                    for order in [F16DotOrder::Gemm, F16DotOrder::VecDot] {
                        group_attention_f16(&q, &kv, &opts, order, &mut f16, &mut got);
                        for h in 0..g {
                            let w = f16_as_written(&q[h * hd..(h + 1) * hd], &kv, &opts[h], order);
                            want[h * hd..(h + 1) * hd].copy_from_slice(&w);
                        }
                        assert_eq!(bits(&got), bits(&want), "f16 pos {pos} {order:?}");
                    }
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
        head_attention_f16(
            &[1.0; 4],
            &kv,
            &opts,
            F16DotOrder::VecDot,
            &mut F16Scratch::default(),
            &mut out,
        );
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
        head_attention_f16(
            &[1.0; 4],
            &kv,
            &opts,
            F16DotOrder::VecDot,
            &mut F16Scratch::default(),
            &mut out,
        );
        close(&out, &want, 2e-3, "f16 with a sink");
        // A sink far below the scores changes nothing.
        let far = HeadOpts {
            sink: Some(-1e4),
            ..opts
        };
        head_attention(&[1.0; 4], &kv, &far, &mut Vec::new(), &mut out);
        assert_eq!(out, v);
    }
}
