//! Recurrent mixers of hybrid models: LFM2's causal short convolution ([`conv1d_causal`]) and
//! Qwen3.5's gated delta rule, one step at a time for decode ([`gated_delta_step`]) and in
//! chunks of 64 for prefill ([`gated_delta_chunked`]), plus FLA's [`l2_normalize`].
//!
//! Every kernel has a portable scalar reference (`scalar.rs`); on x86_64 an AVX2+FMA and an
//! AVX-512F version of the hot loops (the step's state update and readout, the chunked form's
//! matrix products, the convolution's row updates) are selected once at first use. Both are the
//! SIMD kernels of `lanes.rs`, written once over a vector type that `avx2.rs` and `avx512.rs`
//! each implement with their intrinsics. `BERTH_KERNELS` caps the level as for every kernel
//! table ([`crate::kernel_level`]).

use std::cell::RefCell;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod lanes;
mod scalar;
#[cfg(test)]
mod tests;

/// Chunk length of [`gated_delta_chunked`] (transformers' `chunk_size`).
const CHUNK: usize = 64;
/// Below this many steps [`gated_delta_chunked`] loops the single-step kernel.
const SHORT_T: usize = 8;

/// `C[i][j] += alpha * sum_p A[i*ars + p*acs] * B[p*brs + j]` for `i < m`, `j < n`, `p < kk`,
/// with `C[i][j]` at `c[i*crs + j]`.
#[derive(Clone, Copy)]
struct Gemm<'a> {
    m: usize,
    n: usize,
    kk: usize,
    alpha: f32,
    a: &'a [f32],
    ars: usize,
    acs: usize,
    b: &'a [f32],
    brs: usize,
    crs: usize,
    /// A is lower triangular (zeros stored above the diagonal, `kk >= m`): row `i` may stop
    /// the reduction at `p <= i`.
    lower: bool,
    /// Only `C[i][j]` with `j <= i` are wanted; others may be left untouched.
    cut: bool,
}

impl<'a> Gemm<'a> {
    /// `C[m×n] += A[m×kk] · B[kk×n]` with A's rows `ars` apart (its columns adjacent), B's rows
    /// `brs` apart and C's rows `crs` apart; alpha 1, no triangular shortcuts.
    #[allow(clippy::too_many_arguments)]
    fn new(
        m: usize,
        n: usize,
        kk: usize,
        a: &'a [f32],
        ars: usize,
        b: &'a [f32],
        brs: usize,
        crs: usize,
    ) -> Self {
        Gemm {
            m,
            n,
            kk,
            alpha: 1.0,
            a,
            ars,
            acs: 1,
            b,
            brs,
            crs,
            lower: false,
            cut: false,
        }
    }

    /// Panics unless every index the product touches lies inside `a`, `b` and `c`.
    fn check(&self, c: &[f32]) {
        if self.m == 0 || self.n == 0 {
            return;
        }
        if self.kk > 0 {
            let a_last = (self.m - 1) * self.ars + (self.kk - 1) * self.acs;
            assert!(a_last < self.a.len(), "gemm: A too short");
            assert!(
                (self.kk - 1) * self.brs + self.n <= self.b.len(),
                "gemm: B too short"
            );
        }
        assert!((self.m - 1) * self.crs + self.n <= c.len(), "gemm: C too short");
        assert!(!self.lower || self.kk >= self.m, "gemm: lower A must be square");
    }
}

/// `(s, dk, dv, q, k, v, g, beta, o)`: the gated delta step, see [`gated_delta_step`].
type StepFn = unsafe fn(&mut [f32], usize, usize, &[f32], &[f32], &[f32], f32, f32, &mut [f32]);

/// One instruction set's recurrent kernels (a file per set: `scalar.rs`, and `avx2.rs`,
/// `avx512.rs` over the shared SIMD kernels of `lanes.rs`), chosen once ([`table`]). Each entry
/// is `unsafe` because it may need its set's CPU features and trusts its shapes; the one way in
/// is [`Table`]'s method of the same name, which checks them.
#[derive(Clone, Copy)]
struct Table {
    name: &'static str,
    /// The gated delta step.
    step: StepFn,
    /// The matrix product of [`Gemm`] (`check` passed).
    gemm: unsafe fn(&Gemm, &mut [f32]),
    /// `out[c] += w[c] * x[c]` over the shortest length.
    fma_rows: unsafe fn(&mut [f32], &[f32], &[f32]),
    /// Sum of squares.
    sumsq: unsafe fn(&[f32]) -> f32,
}

// The checked calls into a table. SAFETY for each: a table is only chosen ([`table`]) or
// listed (tests) after detecting its set's CPU features; the shapes are checked here.
impl Table {
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        s: &mut [f32],
        dk: usize,
        dv: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: f32,
        beta: f32,
        o: &mut [f32],
    ) {
        assert!(s.len() >= dk * dv && q.len() >= dk && k.len() >= dk);
        assert!(v.len() >= dv && o.len() >= dv);
        // SAFETY: see above.
        unsafe { (self.step)(s, dk, dv, q, k, v, g, beta, o) }
    }

    fn gemm(&self, p: &Gemm, c: &mut [f32]) {
        p.check(c);
        // SAFETY: see above.
        unsafe { (self.gemm)(p, c) }
    }

    fn fma_rows(&self, out: &mut [f32], w: &[f32], x: &[f32]) {
        // SAFETY: see above (the kernels run over the shortest length).
        unsafe { (self.fma_rows)(out, w, x) }
    }

    fn sumsq(&self, x: &[f32]) -> f32 {
        // SAFETY: see above.
        unsafe { (self.sumsq)(x) }
    }
}

/// The fastest kernels for this CPU, detected once (at most the level `BERTH_KERNELS` names).
fn table() -> &'static Table {
    static BEST: OnceLock<&'static Table> = OnceLock::new();
    BEST.get_or_init(|| {
        use crate::KernelLevel;
        let candidates = [
            #[cfg(target_arch = "x86_64")]
            (
                KernelLevel::Avx512,
                KernelLevel::Avx512.supported(),
                &avx512::TABLE,
            ),
            #[cfg(target_arch = "x86_64")]
            (KernelLevel::Avx2, KernelLevel::Avx2.supported(), &avx2::TABLE),
            (KernelLevel::Scalar, true, &scalar::TABLE),
        ];
        crate::select_table("recurrent", &candidates)
    })
}

/// Name of the selected implementation ("scalar", "avx2", "avx512").
pub fn recurrent_impl_name() -> &'static str {
    table().name
}

/// Causal depthwise conv1d over `n` time steps of `channels` channels (row-major x[t*channels + c]).
/// `weight[c*k + j]` is tap j of channel c (HF Conv1d weight [channels,1,k] flattened); the newest input multiplies tap k-1:
/// out[t][c] = sum_{j<k} weight[c*k+j] * xin[t + j][c], where xin = concat(state (k-1 rows), x) along time.
/// `state` holds the previous k-1 inputs, layout state[r*channels + c], oldest row first; on return it holds the last k-1 inputs (of concat(state, x)).
/// `out` has n*channels floats; it may not alias x.
pub fn conv1d_causal(
    x: &[f32],
    n: usize,
    channels: usize,
    weight: &[f32],
    k: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    conv1d_with(table(), x, n, channels, weight, k, state, out)
}

thread_local! {
    /// Per-thread transposed conv weights (`[k][channels]`), reused between calls.
    static CONV_WT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
fn conv1d_with(
    tb: &Table,
    x: &[f32],
    n: usize,
    channels: usize,
    weight: &[f32],
    k: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    assert!(k >= 1, "conv1d_causal: kernel size must be at least 1");
    let hist = k - 1;
    assert!(x.len() >= n * channels, "conv1d_causal: x too short");
    assert!(weight.len() >= channels * k, "conv1d_causal: weight too short");
    assert!(state.len() >= hist * channels, "conv1d_causal: state too short");
    assert!(out.len() >= n * channels, "conv1d_causal: out too short");
    if n == 0 || channels == 0 {
        return;
    }
    CONV_WT.with(|cell| {
        let mut wt = cell.borrow_mut();
        wt.resize(k * channels, 0.0);
        for c in 0..channels {
            for j in 0..k {
                wt[j * channels + c] = weight[c * k + j];
            }
        }
        for t in 0..n {
            let o = &mut out[t * channels..(t + 1) * channels];
            o.fill(0.0);
            for j in 0..k {
                let r = t + j;
                let xr = if r < hist {
                    &state[r * channels..(r + 1) * channels]
                } else {
                    &x[(r - hist) * channels..(r - hist + 1) * channels]
                };
                tb.fma_rows(o, &wt[j * channels..(j + 1) * channels], xr);
            }
        }
    });
    // Keep the last k-1 rows of concat(state, x).
    if hist > 0 {
        if n >= hist {
            state[..hist * channels].copy_from_slice(&x[(n - hist) * channels..n * channels]);
        } else {
            state.copy_within(n * channels..hist * channels, 0);
            state[(hist - n) * channels..hist * channels].copy_from_slice(&x[..n * channels]);
        }
    }
}

/// x * rsqrt(sum(x^2) + eps) in place (FLA's l2norm; eps 1e-6 for Qwen3.5).
pub fn l2_normalize(x: &mut [f32], eps: f32) {
    l2_normalize_with(table(), x, eps)
}

fn l2_normalize_with(tb: &Table, x: &mut [f32], eps: f32) {
    let inv = 1.0 / (tb.sumsq(x) + eps).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// One step of the gated delta rule for one head. `state` is S with layout S[i*dv + j] (i < dk, j < dv).
/// q, k: dk floats (the caller has already L2-normalised both and scaled q by dk^-0.5); v: dv floats.
/// S <- S * exp(g); kv_mem[j] = sum_i S[i][j]*k[i]; delta[j] = (v[j]-kv_mem[j])*beta; S[i][j] += k[i]*delta[j]; o[j] = sum_i S[i][j]*q[i].
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_step(
    state: &mut [f32],
    dk: usize,
    dv: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    o: &mut [f32],
) {
    step_with(table(), state, dk, dv, q, k, v, g, beta, o)
}

#[allow(clippy::too_many_arguments)]
fn step_with(
    tb: &Table,
    state: &mut [f32],
    dk: usize,
    dv: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    o: &mut [f32],
) {
    assert!(state.len() >= dk * dv, "gated_delta_step: state too short");
    assert!(q.len() >= dk && k.len() >= dk, "gated_delta_step: q/k too short");
    assert!(v.len() >= dv && o.len() >= dv, "gated_delta_step: v/o too short");
    tb.step(
        &mut state[..dk * dv],
        dk,
        dv,
        &q[..dk],
        &k[..dk],
        &v[..dv],
        g,
        beta,
        &mut o[..dv],
    )
}

/// Reusable buffers of gated_delta_chunked.
#[derive(Default)]
pub struct DeltaScratch {
    /// Cumulative g within the chunk.
    gc: Vec<f32>,
    /// exp(gc_r - gc_s) for s <= r, `[C][C]`.
    dec: Vec<f32>,
    /// The strictly-lower A, then T = A + I, `[C][C]`.
    a: Vec<f32>,
    /// Masked q·k scores, `[C][C]`.
    aqk: Vec<f32>,
    /// One row of A before its update.
    row: Vec<f32>,
    /// k of the chunk transposed, `[dk][C]`.
    kt: Vec<f32>,
    /// k * beta, `[C][dk]`.
    kb: Vec<f32>,
    /// W = T @ (kb * exp(gc)), `[C][dk]`.
    w: Vec<f32>,
    /// kb * exp(gc), then q * exp(gc), then k * exp(gc_last - gc), `[C][dk]`.
    tk: Vec<f32>,
    /// v * beta, `[C][dv]`.
    vb: Vec<f32>,
    /// U, then v_new, `[C][dv]`.
    vn: Vec<f32>,
}

impl DeltaScratch {
    fn ensure(&mut self, dk: usize, dv: usize) {
        let c = CHUNK;
        for (buf, len) in [
            (&mut self.gc, c),
            (&mut self.dec, c * c),
            (&mut self.a, c * c),
            (&mut self.aqk, c * c),
            (&mut self.row, c),
            (&mut self.kt, dk * c),
            (&mut self.kb, c * dk),
            (&mut self.w, c * dk),
            (&mut self.tk, c * dk),
            (&mut self.vb, c * dv),
            (&mut self.vn, c * dv),
        ] {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
        }
    }
}

/// Scales the lower triangle of the `l × l` block of `m` (rows `CHUNK` apart) by the decays `dec`
/// (same layout), with or without the diagonal, and zeroes the rest of the block.
fn decay_lower(m: &mut [f32], dec: &[f32], l: usize, diagonal: bool) {
    for r in 0..l {
        let row = &mut m[r * CHUNK..r * CHUNK + l];
        for (s2, x) in row.iter_mut().enumerate() {
            *x = if s2 < r || (diagonal && s2 == r) {
                *x * dec[r * CHUNK + s2]
            } else {
                0.0
            };
        }
    }
}

/// The chunked (prefill) form over `t` steps of one head, mathematically equal to `t` calls of gated_delta_step:
/// q, k: [t][dk] contiguous, v: [t][dv], g: [t], beta: [t]; out: [t][dv]; state updated to the final state.
/// Follow transformers' `torch_chunk_gated_delta_rule` (chunk size 64, decays via cumulative sums of g within a chunk,
/// the lower-triangular solve, then per-chunk inter/intra contributions). `scratch` is reused between calls.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_chunked(
    state: &mut [f32],
    dk: usize,
    dv: usize,
    t: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    out: &mut [f32],
    scratch: &mut DeltaScratch,
) {
    chunked_with(table(), state, dk, dv, t, q, k, v, g, beta, out, scratch)
}

#[allow(clippy::too_many_arguments)]
fn chunked_with(
    tb: &Table,
    state: &mut [f32],
    dk: usize,
    dv: usize,
    t: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    out: &mut [f32],
    sc: &mut DeltaScratch,
) {
    assert!(state.len() >= dk * dv, "gated_delta_chunked: state too short");
    assert!(
        q.len() >= t * dk && k.len() >= t * dk,
        "gated_delta_chunked: q/k too short"
    );
    assert!(
        v.len() >= t * dv && out.len() >= t * dv,
        "gated_delta_chunked: v/out too short"
    );
    assert!(
        g.len() >= t && beta.len() >= t,
        "gated_delta_chunked: g/beta too short"
    );
    let state = &mut state[..dk * dv];
    if t < SHORT_T || dk == 0 || dv == 0 {
        for s in 0..t {
            let (qs, ks) = (&q[s * dk..(s + 1) * dk], &k[s * dk..(s + 1) * dk]);
            let vs = &v[s * dv..(s + 1) * dv];
            let os = &mut out[s * dv..(s + 1) * dv];
            step_with(tb, state, dk, dv, qs, ks, vs, g[s], beta[s], os);
        }
        return;
    }
    sc.ensure(dk, dv);
    let mut t0 = 0;
    while t0 < t {
        let l = CHUNK.min(t - t0);
        chunk(
            tb,
            state,
            dk,
            dv,
            l,
            &q[t0 * dk..(t0 + l) * dk],
            &k[t0 * dk..(t0 + l) * dk],
            &v[t0 * dv..(t0 + l) * dv],
            &g[t0..t0 + l],
            &beta[t0..t0 + l],
            &mut out[t0 * dv..(t0 + l) * dv],
            sc,
        );
        t0 += l;
    }
}

/// One chunk of `l <= CHUNK` steps (matrices use the full row stride `CHUNK` where square).
#[allow(clippy::too_many_arguments)]
fn chunk(
    tb: &Table,
    s: &mut [f32],
    dk: usize,
    dv: usize,
    l: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    out: &mut [f32],
    sc: &mut DeltaScratch,
) {
    const C: usize = CHUNK;
    let gemm = |p: &Gemm, c: &mut [f32]| tb.gemm(p, c);
    // Inclusive cumulative sum of g and the decay matrix exp(gc_r - gc_s), s <= r.
    let mut acc = 0.0f32;
    for (r, gr) in g.iter().enumerate() {
        acc += gr;
        sc.gc[r] = acc;
    }
    let gc = &sc.gc[..l];
    for r in 0..l {
        for s2 in 0..=r {
            sc.dec[r * C + s2] = (gc[r] - gc[s2]).exp();
        }
    }
    // kb = k * beta, vb = v * beta, kt = k^T.
    for r in 0..l {
        for i in 0..dk {
            sc.kb[r * dk + i] = k[r * dk + i] * beta[r];
            sc.kt[i * C + r] = k[r * dk + i];
        }
        for j in 0..dv {
            sc.vb[r * dv + j] = v[r * dv + j] * beta[r];
        }
    }
    // A = -(kb @ k^T) * decay, strictly lower.
    sc.a[..l * C].fill(0.0);
    let g_a = Gemm {
        alpha: -1.0,
        cut: true,
        ..Gemm::new(l, l, dk, &sc.kb, dk, &sc.kt, C, C)
    };
    gemm(&g_a, &mut sc.a);
    decay_lower(&mut sc.a, &sc.dec, l, false);
    // Row by row: A[r][:r] += A[r][:r] @ A[:r][:r] (rows above already updated).
    for r in 1..l {
        sc.row[..r].copy_from_slice(&sc.a[r * C..r * C + r]);
        let (top, rest) = sc.a.split_at_mut(r * C);
        let g_r = Gemm::new(1, r, r, &sc.row, 0, top, C, 0);
        gemm(&g_r, &mut rest[..r]);
    }
    // T = A + I.
    for r in 0..l {
        sc.a[r * C + r] = 1.0;
    }
    // U = T @ vb into vn; W = T @ (kb * exp(gc)).
    for (r, gr) in gc.iter().enumerate() {
        let e = gr.exp();
        for i in 0..dk {
            sc.tk[r * dk + i] = sc.kb[r * dk + i] * e;
        }
    }
    sc.vn[..l * dv].fill(0.0);
    /// `T @ b` for a lower-triangular `[l][C]` matrix `a` and `b` with `n` columns.
    fn tri<'a>(l: usize, a: &'a [f32], b: &'a [f32], n: usize) -> Gemm<'a> {
        Gemm {
            m: l,
            n,
            kk: l,
            alpha: 1.0,
            a,
            ars: C,
            acs: 1,
            b,
            brs: n,
            crs: n,
            lower: true,
            cut: false,
        }
    }
    gemm(&tri(l, &sc.a, &sc.vb, dv), &mut sc.vn);
    sc.w[..l * dk].fill(0.0);
    gemm(&tri(l, &sc.a, &sc.tk, dk), &mut sc.w);
    // v_new = U - W @ S.
    let g_vn = Gemm {
        alpha: -1.0,
        ..Gemm::new(l, dv, dk, &sc.w, dk, &*s, dv, dv)
    };
    gemm(&g_vn, &mut sc.vn);
    // Aqk = (q @ k^T) * decay, lower with diagonal.
    sc.aqk[..l * C].fill(0.0);
    let g_qk = Gemm {
        cut: true,
        ..Gemm::new(l, l, dk, q, dk, &sc.kt, C, C)
    };
    gemm(&g_qk, &mut sc.aqk);
    decay_lower(&mut sc.aqk, &sc.dec, l, true);
    // out = (q * exp(gc)) @ S + Aqk @ v_new.
    for r in 0..l {
        let e = gc[r].exp();
        for i in 0..dk {
            sc.tk[r * dk + i] = q[r * dk + i] * e;
        }
    }
    let out = &mut out[..l * dv];
    out.fill(0.0);
    let g_inter = Gemm::new(l, dv, dk, &sc.tk, dk, &*s, dv, dv);
    gemm(&g_inter, out);
    gemm(&tri(l, &sc.aqk, &sc.vn, dv), out);
    // S <- S * exp(gc_last) + sum_r (k_r * exp(gc_last - gc_r)) ⊗ v_new_r.
    let last = gc[l - 1];
    for r in 0..l {
        let e = (last - gc[r]).exp();
        for i in 0..dk {
            sc.tk[r * dk + i] = k[r * dk + i] * e;
        }
    }
    let el = last.exp();
    for x in s.iter_mut() {
        *x *= el;
    }
    let g_s = Gemm {
        m: dk,
        n: dv,
        kk: l,
        alpha: 1.0,
        a: &sc.tk,
        ars: 1,
        acs: dk,
        b: &sc.vn,
        brs: dv,
        crs: dv,
        lower: false,
        cut: false,
    };
    gemm(&g_s, s);
}
