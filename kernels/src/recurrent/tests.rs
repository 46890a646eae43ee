use super::*;
use crate::testutil::XorShift;

/// Every table this CPU can run, scalar first (ignores `BERTH_FORCE_SCALAR`).
fn tables() -> Vec<Table> {
    #[allow(unused_mut)]
    let mut v = vec![scalar::TABLE];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            v.push(avx2::TABLE);
            if is_x86_feature_detected!("avx512f") {
                v.push(avx512::TABLE);
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
        l2_normalize_with(&scalar::TABLE, &mut q[r * dk..(r + 1) * dk], 1e-6);
        l2_normalize_with(&scalar::TABLE, &mut k[r * dk..(r + 1) * dk], 1e-6);
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
fn recurrent(state: &[f32], dk: usize, dv: usize, x: &Inputs, t0: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
    let mut s = state.to_vec();
    let mut out = vec![0.0; t * dv];
    for r in t0..t0 + t {
        let o = &mut out[(r - t0) * dv..(r - t0 + 1) * dv];
        let (q, k) = (&x.q[r * dk..(r + 1) * dk], &x.k[r * dk..(r + 1) * dk]);
        step_with(
            &scalar::TABLE,
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
fn conv_direct(x: &[f32], n: usize, ch: usize, w: &[f32], k: usize, state: &[f32]) -> (Vec<f32>, Vec<f32>) {
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
        l2_normalize_with(&scalar::TABLE, &mut want, 1e-6);
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
            scalar::TABLE.gemm(&p, &mut want);
            for tb in tables() {
                let mut c = c0.clone();
                tb.gemm(&p, &mut c);
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
