//! Portable reference kernels.

use super::{Gemm, Table};

/// The portable recurrent kernels.
pub(super) const TABLE: Table = Table {
    name: "scalar",
    step,
    gemm,
    fma_rows,
    sumsq,
};

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
