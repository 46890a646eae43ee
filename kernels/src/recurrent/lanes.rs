//! The SIMD recurrent kernels, written once over [`Lanes`]: a vector of `W` f32 lanes and the
//! few operations the kernels use. Each instruction set's file (`avx2.rs`, `avx512.rs`)
//! implements [`Lanes`] with its intrinsics and instantiates these kernels inside functions
//! compiled for its features (everything here is `#[inline(always)]`, so the intrinsics inline
//! there); a new set (NEON, ...) is one more such file.

use super::Gemm;

/// A vector of [`Lanes::W`] f32 lanes of one instruction set, and its operations. Every
/// operation is `unsafe`: it needs the set's CPU features (and `load`/`store` `W` valid floats
/// at the pointer).
pub(super) trait Lanes {
    /// The register type.
    type V: Copy;
    /// Lanes per register.
    const W: usize;
    /// `W` floats from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    /// `v` into the `W` floats at `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `x` in every lane.
    unsafe fn set1(x: f32) -> Self::V;
    /// Zeros.
    unsafe fn zero() -> Self::V;
    /// `a · b + c`, fused.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a · b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// The sum of the lanes (the set's own reduction order).
    unsafe fn hsum(v: Self::V) -> f32;
}

/// Column tile `[j0, j0 + NV*S::W)` of the step. One read pass gives `a = S^T k` and
/// `b = S^T q` (old S), so `delta = (v - eg*a)*beta` and
/// `o = S_new^T q = eg*b + delta*(k.q)`; a second pass writes
/// `S_new = eg*S + k delta^T`.
///
/// # Safety
/// `s` points at `dk * dv` floats, `j0 + NV*S::W <= dv`, and `q`, `k` hold `dk`
/// floats, `v`, `o` hold `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step_cols<S: Lanes, const NV: usize>(
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
    // [j0, j0 + NV*S::W) within dv; v and o accesses stay below j0 + NV*S::W <= dv.
    unsafe {
        let mut ak = [S::zero(); NV];
        let mut aq = [S::zero(); NV];
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate().take(dk) {
            let kv = S::set1(ki);
            let qv = S::set1(qi);
            let row = s.add(i * dv + j0);
            for u in 0..NV {
                let x = S::load(row.add(u * S::W));
                ak[u] = S::fmadd(x, kv, ak[u]);
                aq[u] = S::fmadd(x, qv, aq[u]);
            }
        }
        let egv = S::set1(eg);
        let bv = S::set1(beta);
        let kqv = S::set1(kq);
        let mut delta = [S::zero(); NV];
        for u in 0..NV {
            let vv = S::load(v.as_ptr().add(j0 + u * S::W));
            delta[u] = S::mul(S::sub(vv, S::mul(ak[u], egv)), bv);
            let ov = S::fmadd(delta[u], kqv, S::mul(aq[u], egv));
            S::store(o.as_mut_ptr().add(j0 + u * S::W), ov);
        }
        for (i, &ki) in k.iter().enumerate().take(dk) {
            let kv = S::set1(ki);
            let row = s.add(i * dv + j0);
            for (u, d) in delta.iter().enumerate() {
                let p = row.add(u * S::W);
                S::store(p, S::fmadd(kv, *d, S::mul(S::load(p), egv)));
            }
        }
    }
}

/// The gated delta step of [`super::scalar::step`] in column tiles of `NSTEP` vectors (then
/// single vectors, then scalar columns).
///
/// # Safety
/// The CPU has `S`'s features; `s` holds `dk * dv` floats, `q` and `k` `dk`, `v` and `o` `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn step<S: Lanes, const NSTEP: usize>(
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
    // SAFETY: the caller's CPU features.
    let kq = unsafe { dot::<S>(&k[..dk], &q[..dk]) };
    let sp = s.as_mut_ptr();
    let mut j0 = 0;
    while j0 + NSTEP * S::W <= dv {
        // SAFETY: the caller's features and lengths; the tile ends within dv.
        unsafe { step_cols::<S, NSTEP>(sp, dk, dv, j0, q, k, v, eg, beta, kq, o) };
        j0 += NSTEP * S::W;
    }
    while j0 + S::W <= dv {
        // SAFETY: as above.
        unsafe { step_cols::<S, 1>(sp, dk, dv, j0, q, k, v, eg, beta, kq, o) };
        j0 += S::W;
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
/// `p.check(c)` passed, `i0 + MR <= m`, `j0 + NV*S::W <= n`, `p_end <= kk`.
#[inline(always)]
unsafe fn tile<S: Lanes, const MR: usize, const NV: usize>(
    p: &Gemm,
    c: *mut f32,
    i0: usize,
    j0: usize,
    p_end: usize,
) {
    // SAFETY (whole body): indices stay inside the ranges `check` verified.
    unsafe {
        let mut acc = [[S::zero(); NV]; MR];
        let ap = p.a.as_ptr().add(i0 * p.ars);
        let bp = p.b.as_ptr().add(j0);
        for pp in 0..p_end {
            let brow = bp.add(pp * p.brs);
            let mut bv = [S::zero(); NV];
            for (u, b) in bv.iter_mut().enumerate() {
                *b = S::load(brow.add(u * S::W));
            }
            let acol = ap.add(pp * p.acs);
            for (r, accr) in acc.iter_mut().enumerate() {
                let av = S::set1(*acol.add(r * p.ars));
                for (a, b) in accr.iter_mut().zip(bv.iter()) {
                    *a = S::fmadd(av, *b, *a);
                }
            }
        }
        let al = S::set1(p.alpha);
        for (r, accr) in acc.iter().enumerate() {
            let crow = c.add((i0 + r) * p.crs + j0);
            for (u, a) in accr.iter().enumerate() {
                let cp = crow.add(u * S::W);
                S::store(cp, S::fmadd(al, *a, S::load(cp)));
            }
        }
    }
}

/// Rows `i0..i0 + MR` of the product: register tiles, then scalar tail columns.
///
/// # Safety
/// `p.check(c)` passed for the slice `c` points at, and `i0 + MR <= m`.
#[inline(always)]
unsafe fn rows<S: Lanes, const MR: usize, const NV: usize>(p: &Gemm, c: *mut f32, i0: usize) {
    let p_end = if p.lower { p.kk.min(i0 + MR) } else { p.kk };
    let n_eff = if p.cut {
        p.n.min((i0 + MR).next_multiple_of(S::W))
    } else {
        p.n
    };
    let mut j = 0;
    // SAFETY (the tiles and tail below): rows i0..i0+MR <= m, columns below
    // n_eff <= n, p_end <= kk, all inside what `check` verified.
    unsafe {
        while j + NV * S::W <= n_eff {
            tile::<S, MR, NV>(p, c, i0, j, p_end);
            j += NV * S::W;
        }
        while j + S::W <= n_eff {
            tile::<S, MR, 1>(p, c, i0, j, p_end);
            j += S::W;
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

/// The product of [`Gemm`]: rows in blocks of `MR` (then 4, 2, 1), each in register tiles of
/// `NV` vectors (then single vectors, then scalar columns).
///
/// # Safety
/// The CPU has `S`'s features, and `p.check(c)` passed.
#[inline(always)]
pub(super) unsafe fn gemm<S: Lanes, const MR: usize, const NV: usize>(p: &Gemm, c: &mut [f32]) {
    let cp = c.as_mut_ptr();
    let mut i0 = 0;
    while i0 < p.m {
        let left = p.m - i0;
        // SAFETY (each branch): check passed and the block's rows end within m.
        i0 += unsafe {
            if left >= MR {
                rows::<S, MR, NV>(p, cp, i0);
                MR
            } else if left >= 4 {
                rows::<S, 4, NV>(p, cp, i0);
                4
            } else if left >= 2 {
                rows::<S, 2, NV>(p, cp, i0);
                2
            } else {
                rows::<S, 1, NV>(p, cp, i0);
                1
            }
        };
    }
}

/// `out[c] += w[c] * x[c]` over the shortest length.
///
/// # Safety
/// The CPU has `S`'s features.
#[inline(always)]
pub(super) unsafe fn fma_rows<S: Lanes>(out: &mut [f32], w: &[f32], x: &[f32]) {
    let n = out.len().min(w.len()).min(x.len());
    let mut j = 0;
    // SAFETY: every access is below n, within all three slices.
    unsafe {
        while j + S::W <= n {
            let op = out.as_mut_ptr().add(j);
            let r = S::fmadd(
                S::load(w.as_ptr().add(j)),
                S::load(x.as_ptr().add(j)),
                S::load(op),
            );
            S::store(op, r);
            j += S::W;
        }
    }
    for jj in j..n {
        out[jj] += w[jj] * x[jj];
    }
}

/// Dot product over the shorter of `x` and `y`.
///
/// # Safety
/// The CPU has `S`'s features.
#[inline(always)]
pub(super) unsafe fn dot<S: Lanes>(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    // SAFETY: the caller's CPU features.
    let mut acc = [unsafe { S::zero() }; 4];
    let mut j = 0;
    // SAFETY: every load is below n, within both slices.
    unsafe {
        while j + 4 * S::W <= n {
            for (u, a) in acc.iter_mut().enumerate() {
                let o = j + u * S::W;
                *a = S::fmadd(S::load(x.as_ptr().add(o)), S::load(y.as_ptr().add(o)), *a);
            }
            j += 4 * S::W;
        }
        while j + S::W <= n {
            acc[0] = S::fmadd(S::load(x.as_ptr().add(j)), S::load(y.as_ptr().add(j)), acc[0]);
            j += S::W;
        }
    }
    // SAFETY: the caller's CPU features.
    let mut s = unsafe { S::hsum(S::add(S::add(acc[0], acc[1]), S::add(acc[2], acc[3]))) };
    for (a, b) in x[j..n].iter().zip(&y[j..n]) {
        s += a * b;
    }
    s
}
