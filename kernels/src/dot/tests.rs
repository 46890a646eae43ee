use super::*;
use crate::testutil::{random_row, XorShift};

/// Every SIMD table this CPU runs (not the scalar reference), best first; prints the tables
/// this build has that could not be run here.
fn simd_tables() -> Vec<DotTable> {
    let missing: Vec<&str> = DotTable::NAMES
        .into_iter()
        .filter(|n| DotTable::by_name(n).is_none())
        .collect();
    if !missing.is_empty() {
        berth_formats::test_skip::skip_optional(&format!(
            "kernel tables this CPU cannot run: {}",
            missing.join(", ")
        ));
    }
    DotTable::available()
        .into_iter()
        .filter(|t| t.name != "scalar")
        .collect()
}

fn abs_dot(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

#[test]
fn simd_matches_scalar() {
    let mut rng = XorShift::new(1);
    let scalar = DotTable::scalar();
    assert_eq!(DotTable::best().name != "scalar", has_avx2());
    for best in simd_tables() {
        for wtype in WeightType::ALL {
            for &n in &[256usize, 512, 4864] {
                for _ in 0..5 {
                    let row = random_row(&mut rng, wtype, n);
                    let x = rng.vec(n);
                    let act = QuantizedActivations::quantize(wtype, &x);
                    let r = scalar.vec_dot(wtype, &row, act.row(0), n);
                    let s = best.vec_dot(wtype, &row, act.row(0), n);
                    let mut wd = vec![0.0; n];
                    wtype.dequantize_row(&row, &mut wd);
                    let tol = 1e-5 * abs_dot(&wd, &x) + 1e-6;
                    assert!(
                        (r - s).abs() <= tol,
                        "{wtype:?} n={n}: scalar {r} vs {} {s}",
                        best.name
                    );
                }
            }
        }
    }
}

#[test]
fn float_tails_match() {
    let mut rng = XorShift::new(2);
    for wtype in [WeightType::F32, WeightType::F16, WeightType::BF16] {
        for n in [1usize, 7, 9, 31, 33, 100] {
            let row = random_row(&mut rng, wtype, n);
            let x = rng.vec(n);
            let act = QuantizedActivations::quantize(wtype, &x);
            let r = DotTable::scalar().vec_dot(wtype, &row, act.row(0), n);
            let s = vec_dot(wtype, &row, &act, n);
            assert!((r - s).abs() <= 1e-5 * n as f32, "{wtype:?} n={n}: {r} vs {s}");
        }
    }
    let a = rng.vec(77);
    let b = rng.vec(77);
    assert!((dot_f32(&a, &b) - scalar::dot_f32(&a, &b)).abs() < 1e-4);
}

#[test]
fn quantized_dot_matches_dequantized_f32_dot() {
    let mut rng = XorShift::new(3);
    for wtype in WeightType::ALL {
        let n = 1024;
        let row = match wtype {
            WeightType::Q4_0 => crate::quant::quantize_row_q4_0(&rng.vec(n)),
            WeightType::Q5_0 => crate::quant::quantize_row_q5_0(&rng.vec(n)),
            WeightType::Q8_0 => crate::quant::quantize_row_q8_0(&rng.vec(n)),
            _ => random_row(&mut rng, wtype, n),
        };
        let mut w = vec![0.0; n];
        wtype.dequantize_row(&row, &mut w);
        let x = rng.vec(n);
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let got = vec_dot(wtype, &row, &QuantizedActivations::quantize(wtype, &x), n);
        // Activation rounding error is at most amax/254 per element (amax <= 1 here),
        // plus f16 rounding of the Q8_0 block scale.
        let sum_w: f32 = w.iter().map(|v| v.abs()).sum();
        let tol = if wtype.act_format() == ActFormat::F32 {
            1e-5 * abs_dot(&w, &x)
        } else {
            sum_w / 254.0 + 1e-3 * abs_dot(&w, &x)
        };
        assert!(
            (got as f64 - exact).abs() <= tol as f64,
            "{wtype:?}: got {got} exact {exact} tol {tol}"
        );
        // And it should be much closer than the worst case on random data.
        if wtype.act_format() != ActFormat::F32 {
            assert!(
                (got as f64 - exact).abs() <= tol as f64 * 0.25,
                "{wtype:?} suspiciously far"
            );
        }
    }
}

#[test]
fn multi_row_activations() {
    let mut rng = XorShift::new(4);
    let n = 512;
    let x = rng.vec(3 * n);
    let mut q = QuantizedActivations::new();
    q.quantize_into(WeightType::Q4_K, &x, n);
    assert_eq!(q.rows(), 3);
    let single = QuantizedActivations::quantize(WeightType::Q4_K, &x[n..2 * n]);
    let row = random_row(&mut rng, WeightType::Q4_K, n);
    assert_eq!(
        vec_dot_row(WeightType::Q4_K, &row, q.row(1), n),
        vec_dot(WeightType::Q4_K, &row, &single, n)
    );
}

#[test]
fn parallel_quantization_matches_serial() {
    let mut rng = XorShift::new(8);
    let pool = crate::pool::ThreadPool::new(3);
    for wtype in [WeightType::Q4_0, WeightType::Q6_K, WeightType::F16] {
        let n = 512;
        let x = rng.vec(7 * n);
        let mut a = QuantizedActivations::new();
        let mut b = QuantizedActivations::new();
        a.quantize_into(wtype, &x, n);
        b.quantize_into_par(wtype, &x, n, &pool);
        assert_eq!(a.rows(), b.rows());
        for i in 0..a.rows() {
            match (a.row(i), b.row(i)) {
                (ActRow::F32(p), ActRow::F32(q)) => assert_eq!(p, q),
                (ActRow::Q8_0(p), ActRow::Q8_0(q)) | (ActRow::Q8_K(p), ActRow::Q8_K(q)) => {
                    assert_eq!(p, q)
                }
                _ => panic!("format mismatch"),
            }
        }
    }
}

#[test]
fn dot4_matches_single_row() {
    let mut rng = XorShift::new(10);
    for best in simd_tables() {
        for wtype in WeightType::ALL {
            let n = 768;
            let row = random_row(&mut rng, wtype, n);
            let x = rng.vec(4 * n);
            let mut q = QuantizedActivations::new();
            q.quantize_into(wtype, &x, n);
            let got = best.vec_dot4(wtype, &row, [q.row(0), q.row(1), q.row(2), q.row(3)], n);
            let mut wd = vec![0.0; n];
            wtype.dequantize_row(&row, &mut wd);
            for r in 0..4 {
                let e = DotTable::scalar().vec_dot(wtype, &row, q.row(r), n);
                let tol = 1e-5 * abs_dot(&wd, &x[r * n..(r + 1) * n]) + 1e-6;
                assert!(
                    (got[r] - e).abs() <= tol,
                    "{} {wtype:?} r={r}: {} vs {e}",
                    best.name,
                    got[r]
                );
            }
        }
    }
}

#[test]
fn tiles_match_single_rows() {
    let mut rng = XorShift::new(21);
    let n = 256;
    for best in simd_tables() {
        for wtype in WeightType::ALL {
            let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(&mut rng, wtype, n)).collect();
            let x = rng.vec(4 * n);
            let mut q = QuantizedActivations::new();
            q.quantize_into(wtype, &x, n);
            for (nw, na) in [(4, 1), (2, 4), (4, 4), (3, 2)] {
                let w: Vec<&[u8]> = rows[..nw].iter().map(|r| r.as_slice()).collect();
                let acts: Vec<ActRow<'_>> = (0..na).map(|i| q.row(i)).collect();
                let mut out = vec![0.0; nw * na];
                best.vec_dot_tile(wtype, &w, &acts, n, &mut out);
                for wi in 0..nw {
                    for r in 0..na {
                        let e = DotTable::scalar().vec_dot(wtype, w[wi], acts[r], n);
                        let g = out[wi * na + r];
                        assert!(
                            (g - e).abs() <= 1e-3 * (1.0 + e.abs()),
                            "{} {wtype:?} {nw}x{na}: {g} vs {e}",
                            best.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn simd_activation_quantizers_match_the_references() {
    let mut rng = XorShift::new(5);
    let n = 512;
    for case in 0..6 {
        let mut x = rng.vec(n);
        match case {
            // Exact halves after scaling (ties), zeros, a zero block, a negative extreme first.
            1 => x
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = (i % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32),
            2 => x[..256].fill(0.0),
            3 => {
                x[3] = -9.0;
                x[100] = 9.0;
            }
            4 => x.iter_mut().for_each(|v| *v *= 1e-6),
            _ => {}
        }
        for (format, reference) in [
            (
                ActFormat::Q8_0,
                crate::quant::quantize_row_q8_0 as fn(&[f32]) -> Vec<u8>,
            ),
            (ActFormat::Q8_K, crate::quant::quantize_row_q8_k),
        ] {
            let mut got = vec![0u8; format.row_bytes(n)];
            quantize_act_row(format, &x, &mut got);
            assert_eq!(got, reference(&x), "{format:?} case {case}");
        }
    }
}

#[test]
fn single_order_four_row_kernels_equal_single_rows_bit_for_bit() {
    let mut rng = XorShift::new(22);
    for best in simd_tables() {
        for n in [896, 4864] {
            for wtype in WeightType::ALL {
                if n % wtype.block_size() != 0 {
                    continue;
                }
                let row = random_row(&mut rng, wtype, n);
                let x = rng.vec(4 * n);
                let mut q = QuantizedActivations::new();
                q.quantize_into(wtype, &x, n);
                let got = best.vec_dot4_single(wtype, &row, [q.row(0), q.row(1), q.row(2), q.row(3)], n);
                for (r, g) in got.iter().enumerate() {
                    let e = best.vec_dot(wtype, &row, q.row(r), n);
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{} {wtype:?} n={n} row {r}: {g} vs {e}",
                        best.name
                    );
                }
            }
        }
    }
}

#[test]
fn many_row_kernels_equal_single_rows_bit_for_bit() {
    // Runs of weight rows (odd and even counts) against 1..=8 activation rows, every type, on
    // every table: the many-row kernel where it covers the type, the fallback elsewhere.
    let mut rng = XorShift::new(24);
    for best in std::iter::once(DotTable::scalar()).chain(simd_tables()) {
        for n in [256, 896] {
            for wtype in WeightType::ALL {
                if n % wtype.block_size() != 0 {
                    continue;
                }
                let nrows = 5;
                let w: Vec<u8> = (0..nrows).flat_map(|_| random_row(&mut rng, wtype, n)).collect();
                let x = rng.vec(DotTable::MANY_MAX * n);
                let mut q = QuantizedActivations::new();
                q.quantize_into(wtype, &x, n);
                let rb = wtype.row_bytes(n);
                for na in 1..=DotTable::MANY_MAX {
                    let acts: Vec<ActRow<'_>> = (0..na).map(|j| q.row(j)).collect();
                    let mut got = vec![f32::NAN; nrows * na];
                    best.vec_dot_rows_single(wtype, &w, nrows, &acts, n, &mut got);
                    if let (Some(f), WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0) =
                        (best.rows_many, wtype)
                    {
                        let bytes: Vec<&[u8]> = acts
                            .iter()
                            .map(|a| match a {
                                ActRow::Q8_0(b) => *b,
                                _ => unreachable!(),
                            })
                            .collect();
                        let mut direct = vec![f32::NAN; nrows * na];
                        assert!(
                            f(wtype, &w, nrows, n, &bytes, &mut direct),
                            "{} covers {wtype:?}",
                            best.name
                        );
                        assert_eq!(
                            direct.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                        );
                    }
                    for r in 0..nrows {
                        for j in 0..na {
                            let e = best.vec_dot(wtype, &w[r * rb..(r + 1) * rb], q.row(j), n);
                            let g = got[r * na + j];
                            assert_eq!(
                                g.to_bits(),
                                e.to_bits(),
                                "{} {wtype:?} n={n} na={na} row {r} act {j}: {g} vs {e}",
                                best.name
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mxfp4_every_exponent_and_code_matches_scalar() {
    // All 256 E8M0 exponents (subnormal scales at 0 and 1) and all 16 codes in each block, in
    // the single-row, four-row and tile kernels.
    let mut rng = XorShift::new(23);
    let scalar = DotTable::scalar();
    let wtype = WeightType::Mxfp4;
    let n = 256;
    for best in simd_tables() {
        for e0 in (0..256usize).step_by(8) {
            let rows: Vec<Vec<u8>> = (0..2)
                .map(|r| {
                    let mut b = rng.bytes(wtype.row_bytes(n));
                    for (i, blk) in b.chunks_exact_mut(wtype.block_bytes()).enumerate() {
                        // Keep products finite: scales 2^-128 .. 2^(e-128) with e < 200.
                        blk[0] = ((e0 + i + r) % 200) as u8;
                        blk[1..9].copy_from_slice(&[0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe]);
                    }
                    b
                })
                .collect();
            let x = rng.vec(4 * n);
            let mut q = QuantizedActivations::new();
            q.quantize_into(wtype, &x, n);
            let acts = [q.row(0), q.row(1), q.row(2), q.row(3)];
            let mut tile = [0.0f32; 8];
            best.vec_dot_tile(wtype, &[&rows[0], &rows[1]], &acts, n, &mut tile);
            for (wi, row) in rows.iter().enumerate() {
                let mut wd = vec![0.0; n];
                wtype.dequantize_row(row, &mut wd);
                let four = best.vec_dot4(wtype, row, acts, n);
                for (r, a) in acts.iter().enumerate() {
                    let want = scalar.vec_dot(wtype, row, *a, n);
                    let tol = 1e-5 * abs_dot(&wd, &x[r * n..(r + 1) * n]) + f32::MIN_POSITIVE;
                    for (what, got) in [
                        ("single", best.vec_dot(wtype, row, *a, n)),
                        ("dot4", four[r]),
                        ("tile", tile[wi * 4 + r]),
                    ] {
                        assert!(
                            (got - want).abs() <= tol,
                            "e0={e0} w{wi} r{r} {what}: {got} vs scalar {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Every kernel result (single row, four rows in both orders, tiles of every shape) of `table`.
fn all_results(
    table: &DotTable,
    wtype: WeightType,
    rows: &[Vec<u8>],
    q: &QuantizedActivations,
    n: usize,
) -> Vec<f32> {
    let acts = [q.row(0), q.row(1), q.row(2), q.row(3)];
    let mut v = Vec::new();
    for row in rows {
        v.extend(acts.iter().map(|a| table.vec_dot(wtype, row, *a, n)));
        v.extend(table.vec_dot4(wtype, row, acts, n));
        v.extend(table.vec_dot4_single(wtype, row, acts, n));
    }
    for (nw, na) in [(2, 4), (4, 4), (1, 4), (3, 4), (4, 1), (3, 2), (2, 3)] {
        let w: Vec<&[u8]> = rows[..nw].iter().map(|r| r.as_slice()).collect();
        let mut out = vec![0.0; nw * na];
        table.vec_dot_tile(wtype, &w, &acts[..na], n, &mut out);
        v.extend(out);
    }
    v
}

#[test]
fn avx512_equals_avx2_bit_for_bit() {
    // The AVX-512 table keeps the AVX2 table's float order, so llama.cpp parity carries over.
    let (Some(avx512), Some(avx2)) = (DotTable::by_name("avx512"), DotTable::by_name("avx2")) else {
        berth_formats::test_skip::skip_optional("this CPU cannot run the avx512 (or avx2) kernel table");
        return;
    };
    let mut rng = XorShift::new(24);
    for wtype in WeightType::ALL {
        // Odd and even block counts (the single-row `_0` kernels pair blocks), long rows.
        for n in [256usize, 800, 1024, 4864] {
            if n % wtype.block_size() != 0 {
                continue;
            }
            let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(&mut rng, wtype, n)).collect();
            let mut x = rng.vec(4 * n);
            // Extreme activations: a large outlier per row saturates the quantized range.
            for r in 0..4 {
                x[r * n + (7 * r) % n] = 50.0 * if r % 2 == 0 { 1.0 } else { -1.0 };
            }
            let mut q = QuantizedActivations::new();
            q.quantize_into(wtype, &x, n);
            let a = all_results(&avx512, wtype, &rows, &q, n);
            let b = all_results(&avx2, wtype, &rows, &q, n);
            assert_eq!(a.len(), b.len());
            for (i, (g, e)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{wtype:?} n={n} result {i}: avx512 {g} vs avx2 {e}"
                );
            }
        }
    }
}

#[test]
fn f32_row_tiles_equal_single_rows_bit_for_bit_and_the_exact_product() {
    let mut rng = XorShift::new(25);
    // Every table this CPU runs, the scalar reference included.
    for table in DotTable::available() {
        // Lengths around the 8-, 16- and 32-wide steps and AVX2's 512-long blocks of k, and
        // EmbeddingGemma's 768.
        for n in [
            1usize, 7, 8, 9, 16, 31, 32, 33, 40, 63, 64, 100, 255, 768, 777, 1100,
        ] {
            for nrows in [1usize, 2, 3, 4, 5, 7, 13] {
                let w = random_row(&mut rng, WeightType::F32, nrows * n);
                let x: Vec<Vec<f32>> = (0..DotTable::F32_ROWS).map(|_| rng.vec(n)).collect();
                let rb = 4 * n;
                for na in 1..=DotTable::F32_ROWS {
                    let acts: Vec<&[f32]> = x[..na].iter().map(|v| v.as_slice()).collect();
                    let mut out = vec![f32::NAN; nrows * na];
                    (table.f32_rows)(&w, nrows, n, &acts, &mut out);
                    for r in 0..nrows {
                        let row = &w[r * rb..(r + 1) * rb];
                        let wf: Vec<f32> = row
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                            .collect();
                        for (j, a) in acts.iter().enumerate() {
                            let got = out[r * na + j];
                            let single = (table.f32)(row, a, n);
                            assert_eq!(
                                got.to_bits(),
                                single.to_bits(),
                                "{} n={n} nrows={nrows} na={na} r={r} j={j}: {got} vs single {single}",
                                table.name
                            );
                            let exact: f64 =
                                wf.iter().zip(a.iter()).map(|(p, q)| *p as f64 * *q as f64).sum();
                            let tol = 1e-6 * n as f64 * abs_dot(&wf, a) as f64 + 1e-7;
                            assert!(
                                (got as f64 - exact).abs() <= tol,
                                "{} n={n}: {got} vs exact {exact}",
                                table.name
                            );
                        }
                    }
                }
            }
        }
    }
}
