use super::*;
use crate::testutil::{random_row, XorShift};

/// Packs random `wtype` matrices of each shape and checks every product of `m` activation
/// rows (for each `m`) against `want(row bytes, activations, activation row, k)` bit for bit.
fn check_packed(
    wtype: WeightType,
    seed: u64,
    shapes: &[(usize, usize)],
    ms: &[usize],
    want: impl Fn(&[u8], &QuantizedActivations, usize, usize) -> f32,
) {
    let mut rng = XorShift::new(seed);
    let pool = ThreadPool::new(2);
    for &(rows, k) in shapes {
        let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
        let p = PackedMatrix::pack_anywhere(wtype, &w, rows, k).expect("packs");
        let rb = wtype.row_bytes(k);
        let mut scratch = PackedActs::new();
        for &m in ms {
            let x = rng.vec(m * k);
            let mut act = QuantizedActivations::new();
            act.quantize_into(wtype, &x, k);
            let kd = kind(wtype).expect("packed kind");
            let kernels: Vec<&PackedTable> = PackedTable::runnable()
                .into_iter()
                .filter(|k| k.cover(kd))
                .collect();
            if kernels.is_empty() && kd == MX {
                // Only the AVX-512 set packs MXFP4 (AVX2 takes the unpacked kernels).
                berth_formats::test_skip::skip_optional("packed MXFP4: this CPU lacks AVX-512 VNNI");
                return;
            }
            assert!(!kernels.is_empty(), "no kernels here cover {wtype:?}");
            for &kernels in &kernels {
                let mut out = vec![f32::NAN; m * rows];
                matmul_packed_with(kernels, &p, &act, &mut out, &mut scratch, &pool);
                for i in 0..m {
                    for r in 0..rows {
                        let e = want(&w[r * rb..(r + 1) * rb], &act, i, k);
                        let g = out[i * rows + r];
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{} {wtype:?} {rows}x{k} m={m} act {i} row {r}: {g} vs {e}",
                            kernels.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn several_products_at_once_equal_each_alone_bit_for_bit() {
    if !PackedMatrix::available() {
        berth_formats::test_skip::skip_optional("packed kernels: this CPU lacks AVX2");
        return;
    }
    let mut rng = XorShift::new(37);
    let pool = ThreadPool::new(2);
    let k = 512;
    let mats: Vec<(WeightType, PackedMatrix)> = [
        (WeightType::Q5_0, 48),
        (WeightType::Q8_0, 16),
        (WeightType::Q4_K, 32),
        (WeightType::Q5_0, 32),
    ]
    .into_iter()
    .map(|(t, rows)| {
        let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, t, k)).collect();
        (t, PackedMatrix::pack(t, &w, rows, k).expect("packs"))
    })
    .collect();
    for m in [1usize, 7, 12] {
        let x = rng.vec(m * k);
        let acts: Vec<QuantizedActivations> = mats
            .iter()
            .map(|(t, _)| {
                let mut a = QuantizedActivations::new();
                a.quantize_into(*t, &x, k);
                a
            })
            .collect();
        let mut alone: Vec<Vec<f32>> = Vec::new();
        for ((_, p), a) in mats.iter().zip(&acts) {
            let mut out = vec![f32::NAN; m * p.rows];
            matmul_packed(p, a, &mut out, &mut PackedActs::new(), &pool);
            alone.push(out);
        }
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|(_, p)| vec![f32::NAN; m * p.rows]).collect();
        let mut scratch: Vec<PackedActs> = mats.iter().map(|_| PackedActs::new()).collect();
        // The last matrix takes the first one's activations, as k and v take q's: prepared once.
        let shared = |i: usize| if i == 3 { &acts[0] } else { &acts[i] };
        let items = mats
            .iter()
            .enumerate()
            .zip(outs.iter_mut().zip(scratch.iter_mut()))
            .map(|((i, (_, p)), (o, s))| (p, shared(i), o.as_mut_slice(), s));
        matmul_packed_many(items, &pool);
        for (got, want) in outs.iter().zip(&alone) {
            let (g, w): (Vec<u32>, Vec<u32>) = (
                got.iter().map(|v| v.to_bits()).collect(),
                want.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(g, w, "m={m}");
        }
    }
}

#[test]
fn packed_products_equal_the_reference_order_bit_for_bit() {
    let here = PackedTable::runnable();
    if !here.iter().any(|t| t.name == "avx512") {
        berth_formats::test_skip::skip_optional("packed kernels: this CPU lacks AVX-512 VNNI");
    }
    if here.is_empty() {
        berth_formats::test_skip::skip_optional("packed kernels: this CPU lacks AVX2 too");
        return;
    }
    for (seed, wtype) in [
        (31, WeightType::Q4_0),
        (32, WeightType::Q5_0),
        (33, WeightType::Q8_0),
        (34, WeightType::Mxfp4),
    ] {
        let shapes = [(16, 32), (48, 896), (32, 4864)];
        check_packed(wtype, seed, &shapes, &[1, 3, 8, 11, 16, 21], |row, act, i, k| {
            let arb = ActFormat::Q8_0.row_bytes(k);
            reference_dot(wtype, row, &act.bytes()[i * arb..(i + 1) * arb], k)
        });
    }
}

#[test]
fn packed_q4_k_equals_the_single_row_kernel_bit_for_bit() {
    // The AVX2 table's Q4_K single row is the order the packed kernels keep.
    let Some(single) = crate::dot::DotTable::by_name("avx2") else {
        berth_formats::test_skip::skip_optional("packed Q4_K kernels: this CPU lacks AVX2");
        return;
    };
    let wtype = WeightType::Q4_K;
    check_packed(
        wtype,
        34,
        &[(16, 256), (32, 2048)],
        &[1, 3, 4, 9],
        |row, act, i, k| single.vec_dot(wtype, row, act.row(i), k),
    );
}

#[test]
fn packed_q6_k_equals_the_single_row_kernel_bit_for_bit() {
    // The AVX2 table's Q6_K single row is the order the packed kernels keep (AVX-512's
    // single row equals it, checked too where it runs).
    let Some(single) = crate::dot::DotTable::by_name("avx2") else {
        berth_formats::test_skip::skip_optional("packed Q6_K kernels: this CPU lacks AVX2");
        return;
    };
    let wide = crate::dot::DotTable::by_name("avx512");
    let wtype = WeightType::Q6_K;
    check_packed(
        wtype,
        35,
        &[(16, 256), (48, 768), (32, 2048)],
        &[1, 2, 3, 4, 5, 8, 9, 13],
        |row, act, i, k| {
            let e = single.vec_dot(wtype, row, act.row(i), k);
            if let Some(wide) = wide {
                assert_eq!(wide.vec_dot(wtype, row, act.row(i), k).to_bits(), e.to_bits());
            }
            e
        },
    );
}

#[test]
fn the_q6_k_reference_order_is_the_single_row_kernels() {
    let mut rng = XorShift::new(36);
    let k = 1024;
    for _ in 0..8 {
        let row = random_row(&mut rng, WeightType::Q6_K, k);
        let act = QuantizedActivations::quantize(WeightType::Q6_K, &rng.vec(k));
        let g = reference_dot(WeightType::Q6_K, &row, act.bytes(), k);
        let e = crate::dot::DotTable::scalar().vec_dot(WeightType::Q6_K, &row, act.row(0), k);
        assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
        if let Some(t) = crate::dot::DotTable::by_name("avx2") {
            let e = t.vec_dot(WeightType::Q6_K, &row, act.row(0), k);
            assert_eq!(g.to_bits(), e.to_bits(), "{g} vs {e}");
        }
    }
}

#[test]
fn the_reference_order_is_close_to_the_scalar_dot() {
    let mut rng = XorShift::new(32);
    for wtype in [
        WeightType::Q4_0,
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Mxfp4,
    ] {
        let k = 896;
        let row = random_row(&mut rng, wtype, k);
        let act = QuantizedActivations::quantize(wtype, &rng.vec(k));
        let e = crate::dot::DotTable::scalar().vec_dot(wtype, &row, act.row(0), k);
        let g = reference_dot(wtype, &row, act.bytes(), k);
        assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{wtype:?}: {g} vs {e}");
    }
}

#[test]
fn packing_declines_what_it_does_not_cover() {
    let w = vec![0u8; 16 * WeightType::Q5_K.row_bytes(256)];
    assert!(PackedMatrix::pack_anywhere(WeightType::Q4_K, &vec![0u8; 16 * 144], 16, 256).is_some());
    assert!(PackedMatrix::pack_anywhere(WeightType::Q6_K, &vec![0u8; 16 * 210], 16, 256).is_some());
    assert!(PackedMatrix::pack_anywhere(WeightType::Q6_K, &vec![0u8; 16 * 210], 16, 128).is_none());
    assert!(PackedMatrix::pack_anywhere(WeightType::Q5_K, &w, 16, 256).is_none());
    let w = vec![0u8; 15 * WeightType::Q8_0.row_bytes(32)];
    assert!(PackedMatrix::pack_anywhere(WeightType::Q8_0, &w, 15, 32).is_none());
}

/// Every kind the packed layout takes.
const PACKED_KINDS: [WeightType; 6] = [
    WeightType::Q4_0,
    WeightType::Q5_0,
    WeightType::Q8_0,
    WeightType::Q4_K,
    WeightType::Q6_K,
    WeightType::Mxfp4,
];

/// Asserts that `p` gives back rows `rows` of the GGUF matrix `w` block by block, byte for byte.
fn assert_gives_back_gguf_blocks(p: &PackedMatrix, w: &[u8], rows: impl IntoIterator<Item = usize>) {
    let (wtype, k) = (p.wtype(), p.k());
    let (rb, xb) = (wtype.row_bytes(k), wtype.block_bytes());
    let mut block = vec![0u8; xb];
    for r in rows {
        for b in 0..k / wtype.block_size() {
            p.gguf_block(r, b, &mut block);
            assert_eq!(
                block,
                w[r * rb + b * xb..r * rb + (b + 1) * xb],
                "{wtype:?} row {r} block {b}"
            );
        }
    }
}

#[test]
fn a_packed_matrix_gives_back_every_gguf_byte_and_row() {
    // Random bytes, not only valid rows: every bit of a block must come back, scales included
    // (the inverse of the packing is exact, so a row held only packed reads as it did raw).
    let mut rng = XorShift::new(41);
    for wtype in PACKED_KINDS {
        let (rows, k) = (32, 512);
        let rb = wtype.row_bytes(k);
        let w = rng.bytes(rows * rb);
        let p = PackedMatrix::pack_anywhere(wtype, &w, rows, k).expect("packs");
        assert_gives_back_gguf_blocks(&p, &w, 0..rows);
        // Valid rows dequantize as they did raw, bit for bit (NaN-free values to compare).
        let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
        let p = PackedMatrix::pack_anywhere(wtype, &w, rows, k).expect("packs");
        let (mut got, mut want) = (vec![0.0f32; k], vec![0.0f32; k]);
        for r in 0..rows {
            p.dequantize_row(r, &mut got);
            wtype.dequantize_row(&w[r * rb..(r + 1) * rb], &mut want);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{wtype:?} row {r}");
        }
    }
}

#[test]
fn packed_bytes_read_back_are_the_same_matrix() {
    // What a cache of packed weights relies on: the length is known before packing, and the
    // bytes read back give every GGUF byte of the rows again.
    let mut rng = XorShift::new(43);
    for wtype in PACKED_KINDS {
        let (rows, k) = (48, 768);
        let rb = wtype.row_bytes(k);
        let w = rng.bytes(rows * rb);
        let p = PackedMatrix::pack_anywhere(wtype, &w, rows, k).expect("packs");
        assert_eq!(
            PackedMatrix::packed_len(wtype, rows, k),
            Some(p.size_bytes()),
            "{wtype:?}"
        );
        if !PackedMatrix::covers(wtype) {
            assert!(PackedMatrix::from_packed_bytes(wtype, rows, k, |_| Ok::<(), ()>(())).is_none());
            continue;
        }
        let back = PackedMatrix::from_packed_bytes(wtype, rows, k, |buf| {
            buf.copy_from_slice(p.packed_bytes());
            Ok::<(), ()>(())
        })
        .expect("covered")
        .expect("read");
        assert_eq!(back.packed_bytes(), p.packed_bytes());
        assert_gives_back_gguf_blocks(&back, &w, [0, 17, rows - 1]);
        // A read that fails is the caller's error; a shape the layout does not take is None.
        let err = PackedMatrix::from_packed_bytes(wtype, rows, k, |_| Err("short"));
        assert!(matches!(err, Some(Err("short"))));
        assert!(PackedMatrix::from_packed_bytes(wtype, 15, k, |_| Ok::<(), ()>(())).is_none());
    }
    assert_eq!(PackedMatrix::packed_len(WeightType::Q5_K, 16, 256), None);
}

#[test]
fn packed_mxfp4_takes_every_exponent_as_the_reference_does() {
    // Subnormal scales (exponent bytes 0 and 1) have their own path in the kernel.
    if !PackedTable::runnable().iter().any(|t| t.cover(MX)) {
        berth_formats::test_skip::skip_optional("packed MXFP4: this CPU lacks AVX-512 VNNI");
        return;
    }
    let exps = [0u8, 1, 2, 3, 100, 127, 140, 200];
    let mut rng = XorShift::new(35);
    check_packed(WeightType::Mxfp4, 36, &[(32, 256)], &[1, 5], |row, act, i, k| {
        let arb = ActFormat::Q8_0.row_bytes(k);
        reference_dot(WeightType::Mxfp4, row, &act.bytes()[i * arb..(i + 1) * arb], k)
    });
    // The same with the exponents above, block by block.
    let (rows, k) = (16, 256);
    let mut w: Vec<u8> = (0..rows)
        .flat_map(|_| random_row(&mut rng, WeightType::Mxfp4, k))
        .collect();
    for (i, blk) in w.chunks_exact_mut(MXFP4_BYTES).enumerate() {
        blk[0] = exps[i % exps.len()];
    }
    let p = PackedMatrix::pack_anywhere(WeightType::Mxfp4, &w, rows, k).expect("packs");
    let x = rng.vec(k);
    let mut act = QuantizedActivations::new();
    act.quantize_into(WeightType::Mxfp4, &x, k);
    let pool = ThreadPool::new(1);
    for t in PackedTable::runnable().into_iter().filter(|t| t.cover(MX)) {
        let mut out = vec![f32::NAN; rows];
        matmul_packed_with(t, &p, &act, &mut out, &mut PackedActs::new(), &pool);
        let rb = WeightType::Mxfp4.row_bytes(k);
        for r in 0..rows {
            let want = reference_dot(WeightType::Mxfp4, &w[r * rb..(r + 1) * rb], act.bytes(), k);
            assert_eq!(
                out[r].to_bits(),
                want.to_bits(),
                "{} row {r}: {} vs {want}",
                t.name,
                out[r]
            );
        }
    }
}
