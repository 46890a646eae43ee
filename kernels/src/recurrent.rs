//! Recurrent mixers of hybrid models: LFM2's causal short convolution ([`conv1d_causal`]) and
//! Qwen3.5's gated delta rule, one step at a time for decode ([`gated_delta_step`]) and in
//! chunks of 64 for prefill ([`gated_delta_chunked`]), plus FLA's [`l2_normalize`].
//!
//! Every kernel has a portable scalar reference; on x86_64 an AVX2+FMA and an AVX-512F version
//! of the hot loops (the step's state update and readout, the chunked form's matrix products,
//! the convolution's row updates) are selected once at first use. `BERTH_KERNELS` caps the
//! level as for every kernel table ([`crate::kernel_level`]).

use std::cell::RefCell;
use std::sync::OnceLock;

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

type StepFn = fn(&mut [f32], usize, usize, &[f32], &[f32], &[f32], f32, f32, &mut [f32]);

/// One implementation of every recurrent kernel.
#[derive(Clone, Copy)]
struct Table {
    name: &'static str,
    /// The gated delta step (lengths already checked).
    step: StepFn,
    /// The matrix product of [`Gemm`] (bounds checked inside).
    gemm: fn(&Gemm, &mut [f32]),
    /// `out[c] += w[c] * x[c]` over the shortest length.
    fma_rows: fn(&mut [f32], &[f32], &[f32]),
    /// Sum of squares.
    sumsq: fn(&[f32]) -> f32,
}

const SCALAR: Table = Table {
    name: "scalar",
    step: scalar::step,
    gemm: scalar::gemm,
    fma_rows: scalar::fma_rows,
    sumsq: scalar::sumsq,
};

#[cfg(target_arch = "x86_64")]
const AVX2: Table = Table {
    name: "avx2",
    step: avx2::step,
    gemm: avx2::gemm,
    fma_rows: avx2::fma_rows,
    sumsq: avx2::sumsq,
};

#[cfg(target_arch = "x86_64")]
const AVX512: Table = Table {
    name: "avx512",
    step: avx512::step,
    gemm: avx512::gemm,
    fma_rows: avx512::fma_rows,
    sumsq: avx512::sumsq,
};

/// The fastest kernels for this CPU, detected once (at most the level `BERTH_KERNELS` names).
fn table() -> &'static Table {
    static BEST: OnceLock<Table> = OnceLock::new();
    BEST.get_or_init(|| {
        use crate::KernelLevel;
        #[cfg(target_arch = "x86_64")]
        let candidates = [
            (KernelLevel::Avx512, KernelLevel::Avx512.supported(), &AVX512),
            (KernelLevel::Avx2, KernelLevel::Avx2.supported(), &AVX2),
            (KernelLevel::Scalar, true, &SCALAR),
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let candidates = [(KernelLevel::Scalar, true, &SCALAR)];
        *crate::select_table("recurrent", &candidates)
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
                (tb.fma_rows)(o, &wt[j * channels..(j + 1) * channels], xr);
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
    let inv = 1.0 / ((tb.sumsq)(x) + eps).sqrt();
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
    (tb.step)(
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
    let gemm = tb.gemm;
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

/// Portable reference kernels.
mod scalar {
    use super::Gemm;

    /// The gated delta step exactly as specified, using `o` as kv_mem/delta scratch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step(
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
        let eg = g.exp();
        for x in s.iter_mut() {
            *x *= eg;
        }
        o.fill(0.0);
        for i in 0..dk {
            let row = &s[i * dv..(i + 1) * dv];
            for (oj, sj) in o.iter_mut().zip(row) {
                *oj += sj * k[i];
            }
        }
        for (oj, vj) in o.iter_mut().zip(v) {
            *oj = (vj - *oj) * beta;
        }
        for i in 0..dk {
            let row = &mut s[i * dv..(i + 1) * dv];
            for (sj, dj) in row.iter_mut().zip(o.iter()) {
                *sj += k[i] * dj;
            }
        }
        o.fill(0.0);
        for i in 0..dk {
            let row = &s[i * dv..(i + 1) * dv];
            for (oj, sj) in o.iter_mut().zip(row) {
                *oj += sj * q[i];
            }
        }
    }

    pub(super) fn gemm(p: &Gemm, c: &mut [f32]) {
        p.check(c);
        for i in 0..p.m {
            let crow = &mut c[i * p.crs..i * p.crs + p.n];
            for pp in 0..p.kk {
                let a = p.alpha * p.a[i * p.ars + pp * p.acs];
                let brow = &p.b[pp * p.brs..pp * p.brs + p.n];
                for (cj, bj) in crow.iter_mut().zip(brow) {
                    *cj += a * bj;
                }
            }
        }
    }

    pub(super) fn fma_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
        for ((o, w), x) in out.iter_mut().zip(w).zip(x) {
            *o += w * x;
        }
    }

    pub(super) fn sumsq(x: &[f32]) -> f32 {
        x.iter().map(|v| v * v).sum()
    }
}

/// Stamps out one SIMD module of `$w`-lane vectors, its intrinsics passed by name.
/// The step processes column tiles of `$nstep` vectors; the product uses `$mr`-row ×
/// `$ngemm`-vector register tiles.
#[cfg(target_arch = "x86_64")]
macro_rules! simd_module {
    (
        $modname:ident, $feat:literal, $w:literal, $nstep:literal, $mr:literal, $ngemm:literal,
        $load:ident, $store:ident, $set1:ident, $zero:ident, $fmadd:ident, $mul:ident,
        $add:ident, $sub:ident, $hsum:path
    ) => {
        #[doc = concat!("Kernels for `", $feat, "` (installed only after detecting it).")]
        mod $modname {
            use super::Gemm;
            use std::arch::x86_64::*;

            const W: usize = $w;

            /// Column tile `[j0, j0 + NV*W)` of the step. One read pass gives `a = S^T k` and
            /// `b = S^T q` (old S), so `delta = (v - eg*a)*beta` and
            /// `o = S_new^T q = eg*b + delta*(k.q)`; a second pass writes
            /// `S_new = eg*S + k delta^T`.
            ///
            /// # Safety
            /// `s` points at `dk * dv` floats, `j0 + NV*W <= dv`, and `q`, `k` hold `dk`
            /// floats, `v`, `o` hold `dv`.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn step_cols<const NV: usize>(
                s: *mut f32,
                dk: usize,
                dv: usize,
                j0: usize,
                q: &[f32],
                k: &[f32],
                v: &[f32],
                eg: f32,
                beta: f32,
                kq: f32,
                o: &mut [f32],
            ) {
                // SAFETY (whole body): every S access is row i < dk, columns
                // [j0, j0 + NV*W) within dv; v and o accesses stay below j0 + NV*W <= dv.
                unsafe {
                    let mut ak = [$zero(); NV];
                    let mut aq = [$zero(); NV];
                    for (i, (&ki, &qi)) in k.iter().zip(q).enumerate().take(dk) {
                        let kv = $set1(ki);
                        let qv = $set1(qi);
                        let row = s.add(i * dv + j0);
                        for u in 0..NV {
                            let x = $load(row.add(u * W));
                            ak[u] = $fmadd(x, kv, ak[u]);
                            aq[u] = $fmadd(x, qv, aq[u]);
                        }
                    }
                    let egv = $set1(eg);
                    let bv = $set1(beta);
                    let kqv = $set1(kq);
                    let mut delta = [$zero(); NV];
                    for u in 0..NV {
                        let vv = $load(v.as_ptr().add(j0 + u * W));
                        delta[u] = $mul($sub(vv, $mul(ak[u], egv)), bv);
                        let ov = $fmadd(delta[u], kqv, $mul(aq[u], egv));
                        $store(o.as_mut_ptr().add(j0 + u * W), ov);
                    }
                    for (i, &ki) in k.iter().enumerate().take(dk) {
                        let kv = $set1(ki);
                        let row = s.add(i * dv + j0);
                        for (u, d) in delta.iter().enumerate() {
                            let p = row.add(u * W);
                            $store(p, $fmadd(kv, *d, $mul($load(p), egv)));
                        }
                    }
                }
            }

            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            fn step_impl(
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
                let eg = g.exp();
                let kq = dot_impl(&k[..dk], &q[..dk]);
                let sp = s.as_mut_ptr();
                let mut j0 = 0;
                while j0 + $nstep * W <= dv {
                    // SAFETY: lengths asserted above; the tile ends within dv.
                    unsafe { step_cols::<$nstep>(sp, dk, dv, j0, q, k, v, eg, beta, kq, o) };
                    j0 += $nstep * W;
                }
                while j0 + W <= dv {
                    // SAFETY: lengths asserted above; the tile ends within dv.
                    unsafe { step_cols::<1>(sp, dk, dv, j0, q, k, v, eg, beta, kq, o) };
                    j0 += W;
                }
                for j in j0..dv {
                    let (mut a, mut b) = (0.0f32, 0.0f32);
                    for i in 0..dk {
                        a += s[i * dv + j] * k[i];
                        b += s[i * dv + j] * q[i];
                    }
                    let d = (v[j] - a * eg) * beta;
                    o[j] = b * eg + d * kq;
                    for i in 0..dk {
                        s[i * dv + j] = s[i * dv + j] * eg + k[i] * d;
                    }
                }
            }

            /// Register tile of MR rows × NV vectors at (i0, j0), reduction `p < p_end`.
            ///
            /// # Safety
            /// `p.check(c)` passed, `i0 + MR <= m`, `j0 + NV*W <= n`, `p_end <= kk`.
            #[target_feature(enable = $feat)]
            unsafe fn tile<const MR: usize, const NV: usize>(
                p: &Gemm,
                c: *mut f32,
                i0: usize,
                j0: usize,
                p_end: usize,
            ) {
                // SAFETY (whole body): indices stay inside the ranges `check` verified.
                unsafe {
                    let mut acc = [[$zero(); NV]; MR];
                    let ap = p.a.as_ptr().add(i0 * p.ars);
                    let bp = p.b.as_ptr().add(j0);
                    for pp in 0..p_end {
                        let brow = bp.add(pp * p.brs);
                        let mut bv = [$zero(); NV];
                        for (u, b) in bv.iter_mut().enumerate() {
                            *b = $load(brow.add(u * W));
                        }
                        let acol = ap.add(pp * p.acs);
                        for (r, accr) in acc.iter_mut().enumerate() {
                            let av = $set1(*acol.add(r * p.ars));
                            for (a, b) in accr.iter_mut().zip(bv.iter()) {
                                *a = $fmadd(av, *b, *a);
                            }
                        }
                    }
                    let al = $set1(p.alpha);
                    for (r, accr) in acc.iter().enumerate() {
                        let crow = c.add((i0 + r) * p.crs + j0);
                        for (u, a) in accr.iter().enumerate() {
                            let cp = crow.add(u * W);
                            $store(cp, $fmadd(al, *a, $load(cp)));
                        }
                    }
                }
            }

            /// Rows `i0..i0 + MR` of the product: register tiles, then scalar tail columns.
            ///
            /// # Safety
            /// `p.check(c)` passed for the slice `c` points at, and `i0 + MR <= m`.
            #[target_feature(enable = $feat)]
            unsafe fn rows<const MR: usize>(p: &Gemm, c: *mut f32, i0: usize) {
                const NV: usize = $ngemm;
                let p_end = if p.lower { p.kk.min(i0 + MR) } else { p.kk };
                let n_eff = if p.cut {
                    p.n.min((i0 + MR).next_multiple_of(W))
                } else {
                    p.n
                };
                let mut j = 0;
                // SAFETY (the tiles and tail below): rows i0..i0+MR <= m, columns below
                // n_eff <= n, p_end <= kk, all inside what `check` verified.
                unsafe {
                    while j + NV * W <= n_eff {
                        tile::<MR, NV>(p, c, i0, j, p_end);
                        j += NV * W;
                    }
                    while j + W <= n_eff {
                        tile::<MR, 1>(p, c, i0, j, p_end);
                        j += W;
                    }
                    for i in i0..i0 + MR {
                        for jj in j..n_eff {
                            let mut acc = 0.0f32;
                            for pp in 0..p_end {
                                acc += p.a[i * p.ars + pp * p.acs] * p.b[pp * p.brs + jj];
                            }
                            *c.add(i * p.crs + jj) += p.alpha * acc;
                        }
                    }
                }
            }

            #[target_feature(enable = $feat)]
            fn gemm_impl(p: &Gemm, c: &mut [f32]) {
                const MR: usize = $mr;
                p.check(c);
                let cp = c.as_mut_ptr();
                let mut i0 = 0;
                while i0 < p.m {
                    let left = p.m - i0;
                    // SAFETY (each branch): check passed and the block's rows end within m.
                    i0 += unsafe {
                        if left >= MR {
                            rows::<MR>(p, cp, i0);
                            MR
                        } else if left >= 4 {
                            rows::<4>(p, cp, i0);
                            4
                        } else if left >= 2 {
                            rows::<2>(p, cp, i0);
                            2
                        } else {
                            rows::<1>(p, cp, i0);
                            1
                        }
                    };
                }
            }

            #[target_feature(enable = $feat)]
            fn fma_rows_impl(out: &mut [f32], w: &[f32], x: &[f32]) {
                let n = out.len().min(w.len()).min(x.len());
                let mut j = 0;
                // SAFETY: every access is below n, within all three slices.
                unsafe {
                    while j + W <= n {
                        let op = out.as_mut_ptr().add(j);
                        let r = $fmadd(
                            $load(w.as_ptr().add(j)),
                            $load(x.as_ptr().add(j)),
                            $load(op),
                        );
                        $store(op, r);
                        j += W;
                    }
                }
                for jj in j..n {
                    out[jj] += w[jj] * x[jj];
                }
            }

            /// Dot product over the shorter of `x` and `y`.
            #[target_feature(enable = $feat)]
            fn dot_impl(x: &[f32], y: &[f32]) -> f32 {
                let n = x.len().min(y.len());
                let mut acc = [$zero(); 4];
                let mut j = 0;
                // SAFETY: every load is below n, within both slices.
                unsafe {
                    while j + 4 * W <= n {
                        for (u, a) in acc.iter_mut().enumerate() {
                            let o = j + u * W;
                            *a = $fmadd($load(x.as_ptr().add(o)), $load(y.as_ptr().add(o)), *a);
                        }
                        j += 4 * W;
                    }
                    while j + W <= n {
                        acc[0] = $fmadd($load(x.as_ptr().add(j)), $load(y.as_ptr().add(j)), acc[0]);
                        j += W;
                    }
                }
                let mut s = $hsum($add($add(acc[0], acc[1]), $add(acc[2], acc[3])));
                for (a, b) in x[j..n].iter().zip(&y[j..n]) {
                    s += a * b;
                }
                s
            }

            // The four wrappers below: this module's table is only installed (or used by
            // tests) after detecting the CPU features the implementations are compiled for.
            #[allow(clippy::too_many_arguments)]
            pub(super) fn step(
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
                // SAFETY: the features were detected (see above).
                unsafe { step_impl(s, dk, dv, q, k, v, g, beta, o) }
            }

            pub(super) fn gemm(p: &Gemm, c: &mut [f32]) {
                // SAFETY: the features were detected (see above).
                unsafe { gemm_impl(p, c) }
            }

            pub(super) fn fma_rows(out: &mut [f32], w: &[f32], x: &[f32]) {
                // SAFETY: the features were detected (see above).
                unsafe { fma_rows_impl(out, w, x) }
            }

            pub(super) fn sumsq(x: &[f32]) -> f32 {
                // SAFETY: the features were detected (see above).
                unsafe { dot_impl(x, x) }
            }
        }
    };
}

/// Horizontal sum of eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[cfg(target_arch = "x86_64")]
simd_module!(
    avx2,
    "avx2,fma",
    8,
    4,
    6,
    2,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_mul_ps,
    _mm256_add_ps,
    _mm256_sub_ps,
    super::hsum256
);

#[cfg(target_arch = "x86_64")]
simd_module!(
    avx512,
    "avx512f",
    16,
    8,
    6,
    4,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_mul_ps,
    _mm512_add_ps,
    _mm512_sub_ps,
    _mm512_reduce_add_ps
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::XorShift;

    /// Every table this CPU can run, scalar first (ignores `BERTH_FORCE_SCALAR`).
    fn tables() -> Vec<Table> {
        #[allow(unused_mut)]
        let mut v = vec![SCALAR];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(AVX2);
                if is_x86_feature_detected!("avx512f") {
                    v.push(AVX512);
                }
            }
        }
        v
    }

    /// max |a - b| / max |b|.
    fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
        let diff = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff.is_finite(), "non-finite result");
        diff / scale
    }

    /// Random delta-rule inputs for `t` steps: q, k L2-normalised (q also scaled by dk^-0.5),
    /// g in [glo, ghi], beta in (0, 1).
    struct Inputs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
    }

    fn inputs(rng: &mut XorShift, t: usize, dk: usize, dv: usize, glo: f32, ghi: f32) -> Inputs {
        let mut q = rng.vec(t * dk);
        let mut k = rng.vec(t * dk);
        let scale = (dk as f32).powf(-0.5);
        for r in 0..t {
            l2_normalize_with(&SCALAR, &mut q[r * dk..(r + 1) * dk], 1e-6);
            l2_normalize_with(&SCALAR, &mut k[r * dk..(r + 1) * dk], 1e-6);
            for x in &mut q[r * dk..(r + 1) * dk] {
                *x *= scale;
            }
        }
        let v = rng.vec(t * dv);
        let g = (0..t).map(|_| rng.range(glo, ghi)).collect();
        let beta = (0..t).map(|_| rng.range(0.02, 0.98)).collect();
        Inputs { q, k, v, g, beta }
    }

    /// `t` scalar steps from `state`: (outputs, final state).
    fn recurrent(
        state: &[f32],
        dk: usize,
        dv: usize,
        x: &Inputs,
        t0: usize,
        t: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut s = state.to_vec();
        let mut out = vec![0.0; t * dv];
        for r in t0..t0 + t {
            let o = &mut out[(r - t0) * dv..(r - t0 + 1) * dv];
            let (q, k) = (&x.q[r * dk..(r + 1) * dk], &x.k[r * dk..(r + 1) * dk]);
            step_with(
                &SCALAR,
                &mut s,
                dk,
                dv,
                q,
                k,
                &x.v[r * dv..(r + 1) * dv],
                x.g[r],
                x.beta[r],
                o,
            );
        }
        (out, s)
    }

    /// The chunked form over steps `t0..t0 + t`, updating `s`.
    #[allow(clippy::too_many_arguments)]
    fn chunked(
        tb: &Table,
        s: &mut [f32],
        dk: usize,
        dv: usize,
        x: &Inputs,
        t0: usize,
        t: usize,
        sc: &mut DeltaScratch,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; t * dv];
        chunked_with(
            tb,
            s,
            dk,
            dv,
            t,
            &x.q[t0 * dk..],
            &x.k[t0 * dk..],
            &x.v[t0 * dv..],
            &x.g[t0..],
            &x.beta[t0..],
            &mut out,
            sc,
        );
        out
    }

    #[test]
    fn impl_name_is_known() {
        assert!(["scalar", "avx2", "avx512"].contains(&recurrent_impl_name()));
        eprintln!(
            "recurrent selected: {}; tables here: {:?}",
            recurrent_impl_name(),
            tables().iter().map(|t| t.name).collect::<Vec<_>>()
        );
    }

    /// Direct conv over an explicit concat(state, x).
    fn conv_direct(
        x: &[f32],
        n: usize,
        ch: usize,
        w: &[f32],
        k: usize,
        state: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let mut xin = state[..(k - 1) * ch].to_vec();
        xin.extend_from_slice(&x[..n * ch]);
        let mut out = vec![0.0; n * ch];
        for t in 0..n {
            for c in 0..ch {
                out[t * ch + c] = (0..k).map(|j| w[c * k + j] * xin[(t + j) * ch + c]).sum();
            }
        }
        let st = xin[n * ch..].to_vec();
        (out, st)
    }

    #[test]
    fn conv1d_matches_direct_formula() {
        let mut rng = XorShift::new(11);
        for tb in tables() {
            for &ch in &[1, 7, 64, 100] {
                for &k in &[1, 2, 3, 4] {
                    for &n in &[1, 2, 5, 17] {
                        let x = rng.vec(n * ch);
                        let w = rng.vec(ch * k);
                        let st0 = rng.vec((k - 1) * ch);
                        let (want, want_st) = conv_direct(&x, n, ch, &w, k, &st0);
                        let mut st = st0.clone();
                        let mut out = vec![f32::NAN; n * ch];
                        conv1d_with(&tb, &x, n, ch, &w, k, &mut st, &mut out);
                        assert!(rel_err(&out, &want) < 1e-6, "{} ch={ch} k={k} n={n}", tb.name);
                        assert_eq!(st, want_st, "{} state ch={ch} k={k} n={n}", tb.name);
                    }
                }
            }
        }
    }

    #[test]
    fn conv1d_state_carries_across_calls() {
        let mut rng = XorShift::new(12);
        let (ch, k, n) = (48, 4, 12);
        let x = rng.vec(n * ch);
        let w = rng.vec(ch * k);
        let st0 = rng.vec((k - 1) * ch);
        let (want, want_st) = conv_direct(&x, n, ch, &w, k, &st0);
        for tb in tables() {
            let mut st = st0.clone();
            let mut out = vec![f32::NAN; n * ch];
            let mut t0 = 0;
            // Pieces shorter and longer than k - 1.
            for len in [1, 2, 1, 5, 3] {
                let (xs, os) = (&x[t0 * ch..(t0 + len) * ch], &mut out[t0 * ch..(t0 + len) * ch]);
                conv1d_with(&tb, xs, len, ch, &w, k, &mut st, os);
                t0 += len;
            }
            assert_eq!(t0, n);
            assert!(rel_err(&out, &want) < 1e-6, "{}", tb.name);
            assert_eq!(st, want_st, "{}", tb.name);
        }
    }

    #[test]
    fn l2_normalize_simd_matches_scalar() {
        let mut rng = XorShift::new(13);
        for &n in &[1, 7, 16, 33, 128, 257] {
            let x0 = rng.vec(n);
            let mut want = x0.clone();
            l2_normalize_with(&SCALAR, &mut want, 1e-6);
            let norm: f32 = want.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "n={n} norm={norm}");
            for tb in tables() {
                let mut x = x0.clone();
                l2_normalize_with(&tb, &mut x, 1e-6);
                assert!(rel_err(&x, &want) < 1e-6, "{} n={n}", tb.name);
            }
        }
        let mut z = vec![0.0f32; 8];
        l2_normalize(&mut z, 1e-6);
        assert!(z.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn gemm_simd_matches_scalar() {
        let mut rng = XorShift::new(14);
        let shapes = [
            (1, 1, 1),
            (3, 5, 7),
            (4, 16, 8),
            (9, 37, 13),
            (64, 64, 128),
            (13, 130, 64),
            (64, 128, 64),
        ];
        for (m, n, kk) in shapes {
            for (lower, cut, trans) in [
                (false, false, false),
                (false, true, false),
                (true, false, false),
                (false, false, true),
            ] {
                let kk = if lower { m.max(kk) } else { kk };
                let (ars, acs) = if trans { (1, m) } else { (kk, 1) };
                let mut a = rng.vec(m * kk);
                if lower {
                    for i in 0..m {
                        for p in i + 1..kk {
                            a[i * kk + p] = 0.0;
                        }
                    }
                }
                let b = rng.vec(kk * (n + 3));
                let c0 = rng.vec(m * (n + 2));
                let p = Gemm {
                    m,
                    n,
                    kk,
                    alpha: -0.5,
                    a: &a,
                    ars,
                    acs,
                    b: &b,
                    brs: n + 3,
                    crs: n + 2,
                    lower,
                    cut,
                };
                let mut want = c0.clone();
                (SCALAR.gemm)(&p, &mut want);
                for tb in tables() {
                    let mut c = c0.clone();
                    (tb.gemm)(&p, &mut c);
                    if cut {
                        for i in 0..m {
                            for j in i + 1..n + 2 {
                                c[i * (n + 2) + j] = want[i * (n + 2) + j];
                            }
                        }
                    }
                    assert!(
                        rel_err(&c, &want) < 1e-5,
                        "{} m={m} n={n} kk={kk} lower={lower} cut={cut}",
                        tb.name
                    );
                }
            }
        }
    }

    #[test]
    fn delta_step_simd_matches_scalar() {
        let mut rng = XorShift::new(15);
        for &(dk, dv) in &[(128, 128), (64, 32), (17, 19), (5, 3), (32, 100), (1, 1)] {
            let x = inputs(&mut rng, 6, dk, dv, -1.0, -0.01);
            let s0: Vec<f32> = rng.vec(dk * dv).iter().map(|v| v * 0.5).collect();
            let (want_o, want_s) = recurrent(&s0, dk, dv, &x, 0, 6);
            for tb in tables() {
                let mut s = s0.clone();
                let mut out = vec![0.0; 6 * dv];
                for r in 0..6 {
                    let (q, k) = (&x.q[r * dk..(r + 1) * dk], &x.k[r * dk..(r + 1) * dk]);
                    let o = &mut out[r * dv..(r + 1) * dv];
                    step_with(
                        &tb,
                        &mut s,
                        dk,
                        dv,
                        q,
                        k,
                        &x.v[r * dv..(r + 1) * dv],
                        x.g[r],
                        x.beta[r],
                        o,
                    );
                }
                assert!(rel_err(&out, &want_o) < 1e-5, "{} out dk={dk} dv={dv}", tb.name);
                assert!(rel_err(&s, &want_s) < 1e-5, "{} state dk={dk} dv={dv}", tb.name);
            }
        }
    }

    /// Chunked vs step-by-step for every table, from a random initial state.
    fn check_chunked(seed: u64, dk: usize, dv: usize, t: usize, glo: f32, ghi: f32, tol: f32) {
        let mut rng = XorShift::new(seed);
        let x = inputs(&mut rng, t, dk, dv, glo, ghi);
        let s0: Vec<f32> = rng.vec(dk * dv).iter().map(|v| v * 0.5).collect();
        let (want_o, want_s) = recurrent(&s0, dk, dv, &x, 0, t);
        let mut sc = DeltaScratch::default();
        for tb in tables() {
            let mut s = s0.clone();
            let out = chunked(&tb, &mut s, dk, dv, &x, 0, t, &mut sc);
            let (eo, es) = (rel_err(&out, &want_o), rel_err(&s, &want_s));
            eprintln!("{} dk={dk} dv={dv} t={t}: out {eo:.1e} state {es:.1e}", tb.name);
            assert!(
                eo < tol && es < tol,
                "{} dk={dk} dv={dv} t={t}: out {eo:e} state {es:e}",
                tb.name
            );
        }
    }

    #[test]
    fn delta_chunked_matches_recurrent() {
        for (i, &t) in [1, 5, 8, 63, 64, 65, 130, 200].iter().enumerate() {
            check_chunked(100 + i as u64, 128, 128, t, -1.0, -0.001, 1e-5);
        }
    }

    #[test]
    fn delta_chunked_matches_recurrent_odd_dims() {
        for (i, &(dk, dv, t)) in [
            (20, 36, 9),
            (20, 36, 70),
            (3, 5, 64),
            (33, 17, 131),
            (128, 64, 100),
        ]
        .iter()
        .enumerate()
        {
            check_chunked(200 + i as u64, dk, dv, t, -1.0, -0.001, 1e-5);
        }
    }

    #[test]
    fn delta_chunked_strong_decay_stays_finite() {
        // Steps of g down to -20: cumulative sums reach about -1300 within a chunk.
        check_chunked(300, 64, 64, 130, -20.0, -5.0, 1e-5);
        check_chunked(301, 64, 64, 130, -20.0, -0.0, 1e-5);
        check_chunked(302, 32, 32, 64, -1e-4, 0.0, 1e-5);
    }

    #[test]
    fn delta_chunked_carries_state_across_calls() {
        let (dk, dv) = (128, 128);
        let mut rng = XorShift::new(400);
        let x = inputs(&mut rng, 100, dk, dv, -1.0, -0.001);
        let s0: Vec<f32> = rng.vec(dk * dv).iter().map(|v| v * 0.5).collect();
        let (want_o, want_s) = recurrent(&s0, dk, dv, &x, 0, 100);
        let mut sc = DeltaScratch::default();
        for tb in tables() {
            let mut s = s0.clone();
            let mut out = chunked(&tb, &mut s, dk, dv, &x, 0, 70, &mut sc);
            out.extend(chunked(&tb, &mut s, dk, dv, &x, 70, 30, &mut sc));
            let (eo, es) = (rel_err(&out, &want_o), rel_err(&s, &want_s));
            assert!(eo < 1e-5 && es < 1e-5, "{}: out {eo:e} state {es:e}", tb.name);
        }
        // The public entry points agree with each other too.
        let mut s = s0.clone();
        let mut out = vec![0.0; 100 * dv];
        gated_delta_chunked(
            &mut s, dk, dv, 100, &x.q, &x.k, &x.v, &x.g, &x.beta, &mut out, &mut sc,
        );
        let mut s2 = s0.clone();
        let mut o2 = vec![0.0; dv];
        for r in 0..100 {
            let (q, k) = (&x.q[r * dk..(r + 1) * dk], &x.k[r * dk..(r + 1) * dk]);
            gated_delta_step(
                &mut s2,
                dk,
                dv,
                q,
                k,
                &x.v[r * dv..(r + 1) * dv],
                x.g[r],
                x.beta[r],
                &mut o2,
            );
        }
        assert!(rel_err(&out[99 * dv..], &o2) < 1e-5 && rel_err(&s, &s2) < 1e-5);
    }

    /// Rough timings, best of several runs (run with `--ignored --nocapture`); never asserted.
    #[test]
    #[ignore]
    fn delta_timings() {
        let (dk, dv) = (128, 128);
        let mut rng = XorShift::new(500);
        let x = inputs(&mut rng, 512, dk, dv, -0.1, -0.001);
        let mut sc = DeltaScratch::default();
        let best = |f: &mut dyn FnMut()| {
            (0..7)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    f();
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        for tb in tables() {
            let mut s = vec![0.0; dk * dv];
            let mut o = vec![0.0; dv];
            let iters = 2000;
            let step_us = best(&mut || {
                for it in 0..iters {
                    let r = it % 512;
                    let (q, k) = (&x.q[r * dk..(r + 1) * dk], &x.k[r * dk..(r + 1) * dk]);
                    let v = &x.v[r * dv..(r + 1) * dv];
                    step_with(&tb, &mut s, dk, dv, q, k, v, x.g[r], x.beta[r], &mut o);
                }
            }) * 1e6
                / iters as f64;
            let chunk_us = best(&mut || {
                std::hint::black_box(chunked(&tb, &mut s, dk, dv, &x, 0, 512, &mut sc));
            }) * 1e6
                / 512.0;
            eprintln!(
                "{:>6}: gated_delta_step dk=dv=128 {step_us:.2} us/step; chunked t=512 {chunk_us:.2} us/token",
                tb.name
            );
        }
    }
}
