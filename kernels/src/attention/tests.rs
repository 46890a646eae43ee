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
