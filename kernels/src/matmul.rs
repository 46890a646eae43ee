//! Matrix-vector and matrix-matrix products over raw weight bytes.
//!
//! The weight matrix is `[rows][k]` stored as consecutive rows of one [`WeightType`];
//! activations are `[m][k]` f32. Output is `[m][rows]` with
//! `out[i][r] = dot(W[r], x[i])`. Each activation row is quantized once, then weight rows
//! are split in chunks over the thread pool; every weight row is reused across a tile of
//! activation rows while it is hot in L1. F32 weights go through register tiles of weight rows
//! × activation rows ([`DotTable::f32_rows`]), whose results equal single rows' bit for bit.

use crate::dot::{ActRow, DotTable, QuantizedActivations};
use crate::pool::ThreadPool;
use crate::quant::WeightType;

/// Activation rows processed per weight row before moving to the next weight row.
const M_TILE: usize = 8;

struct OutPtr(*mut f32);
// SAFETY: the pointer is only used to write disjoint elements (each (i, r) pair belongs to
// exactly one chunk) while the owning `&mut [f32]` is borrowed by the caller.
unsafe impl Sync for OutPtr {}

/// F32 weight bytes per pass over the activation rows: a quarter of a small (1 MiB) L2, which
/// leaves room for the activation rows streaming past (measured a little faster than half).
const F32_PASS_BYTES: usize = 256 * 1024;

/// Most weight rows in one parallel chunk.
const MANY_CHUNK: usize = 256;

/// Weight rows per parallel chunk for a matrix of `rows` rows on `threads` threads.
fn rows_per_chunk(rows: usize, threads: usize) -> usize {
    // About 4 chunks per thread for load balance, at least 4 rows each.
    rows.div_ceil(threads * 4).clamp(4, MANY_CHUNK)
}

/// `out[i][r] = dot(W[r], act.row(i))` for pre-quantized activations (`act.rows()` rows).
///
/// Use this to share one quantization of `x` between several matrices of the same type.
pub fn matmul_quantized(
    wtype: WeightType,
    w: &[u8],
    rows: usize,
    k: usize,
    act: &QuantizedActivations,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    matmul_quantized_split(wtype, w, rows, k, act, act.rows(), out, pool);
}

/// [`matmul_quantized`] where only the first `gemm_rows` activation rows are tiled as one
/// matrix (exactly as if they were all there is); every later row gets bit for bit the result
/// of a single-row product. Continuous batching puts one sequence's prompt rows first and other
/// sequences' decode rows after them, and each must round as it would alone.
#[allow(clippy::too_many_arguments)]
pub fn matmul_quantized_split(
    wtype: WeightType,
    w: &[u8],
    rows: usize,
    k: usize,
    act: &QuantizedActivations,
    gemm_rows: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let m_all = act.rows();
    let m = gemm_rows.min(m_all);
    let rb = wtype.row_bytes(k);
    assert_eq!(act.n(), k, "activation row length must equal k");
    assert_eq!(
        act.format(),
        wtype.act_format(),
        "activations quantized for another type"
    );
    assert!(w.len() >= rows * rb, "weight matrix too short");
    assert!(out.len() >= m_all * rows, "output too short");
    let table = DotTable::best();
    let per = rows_per_chunk(rows, pool.n_threads());
    let n_chunks = rows.div_ceil(per);
    let outp = OutPtr(out.as_mut_ptr());
    pool.parallel_for(n_chunks, |c| {
        let r0 = c * per;
        let r1 = (r0 + per).min(rows);
        let outp = &outp;
        if wtype == WeightType::F32 {
            // Register tiles equal to single rows bit for bit: the gemm rows and the rest alike.
            let mut xs: [&[f32]; DotTable::F32_ROWS] = [&[]; DotTable::F32_ROWS];
            let mut buf = [0.0f32; MANY_CHUNK * DotTable::F32_ROWS];
            // Weight rows per pass over the activations: few enough to stay in L2 while every
            // activation tile streams past them (a chunk of 3072-long rows would not).
            let sub = (F32_PASS_BYTES / rb).max(4) / 4 * 4;
            for s0 in (r0..r1).step_by(sub) {
                let s1 = (s0 + sub).min(r1);
                for i0 in (0..m_all).step_by(DotTable::F32_ROWS) {
                    let na = (m_all - i0).min(DotTable::F32_ROWS);
                    for (d, i) in xs.iter_mut().zip(i0..i0 + na) {
                        let ActRow::F32(x) = act.row(i) else {
                            unreachable!("F32 weights take f32 rows")
                        };
                        *d = x;
                    }
                    let vals = &mut buf[..(s1 - s0) * na];
                    (table.f32_rows)(&w[s0 * rb..s1 * rb], s1 - s0, k, &xs[..na], vals);
                    for (ri, v) in vals.chunks_exact(na).enumerate() {
                        for (di, &v) in v.iter().enumerate() {
                            // SAFETY: i0 + di < m_all and s0 + ri < r1 <= rows, so the index is
                            // < out.len() (asserted); chunk c is the only writer of rows r0..r1.
                            unsafe { *outp.0.add((i0 + di) * rows + s0 + ri) = v };
                        }
                    }
                }
            }
            return;
        }
        let wrow = |r: usize| &w[r * rb..(r + 1) * rb];
        // Weight rows per tile call: what the table's tile kernel covers best (2 or 4).
        let tw = table.tile_rows.clamp(1, 4);
        let mut tile = [0.0f32; 16];
        let mut many = [0.0f32; MANY_CHUNK * DotTable::MANY_MAX];
        // Up to eight activation rows through one pass over this chunk's weight rows, where the
        // table's many-row kernel covers the type (its results equal single rows bit for bit,
        // as the tiles' do for the types it covers); false when it does not.
        let mut many_rows = |i0: usize, i1: usize| -> bool {
            let Some(f) = table.rows_many else { return false };
            let mut b: [&[u8]; DotTable::MANY_MAX] = [&[]; DotTable::MANY_MAX];
            for (d, i) in b.iter_mut().zip(i0..i1) {
                match act.row(i) {
                    ActRow::Q8_0(x) | ActRow::Q8_K(x) => *d = x,
                    ActRow::F32(_) => return false,
                }
            }
            let na = i1 - i0;
            if !f(
                wtype,
                &w[r0 * rb..r1 * rb],
                r1 - r0,
                k,
                &b[..na],
                &mut many[..(r1 - r0) * na],
            ) {
                return false;
            }
            for (ri, vals) in many.chunks_exact(na).take(r1 - r0).enumerate() {
                for (di, &v) in vals.iter().enumerate() {
                    // SAFETY: i0 + di < m_all and r0 + ri < rows, so the index is < out.len()
                    // (asserted); chunk c is the only writer of rows r0..r1.
                    unsafe { *outp.0.add((i0 + di) * rows + r0 + ri) = v };
                }
            }
            true
        };
        let mut gemm_from = 0;
        while gemm_from < m && many_rows(gemm_from, (gemm_from + DotTable::MANY_MAX).min(m)) {
            gemm_from += DotTable::MANY_MAX;
        }
        for i0 in (gemm_from.min(m)..m).step_by(M_TILE) {
            let i1 = (i0 + M_TILE).min(m);
            let mut i = i0;
            // Four activation rows at a time against `tw` (else 2, else 1) weight rows.
            while i + 4 <= i1 {
                let acts = [act.row(i), act.row(i + 1), act.row(i + 2), act.row(i + 3)];
                let mut r = r0;
                while r < r1 {
                    let nw = if r1 - r >= tw { tw } else { (r1 - r).min(2) };
                    let wr: [&[u8]; 4] = std::array::from_fn(|j| wrow((r + j).min(r1 - 1)));
                    table.vec_dot_tile(wtype, &wr[..nw], &acts, k, &mut tile);
                    for wi in 0..nw {
                        for (di, &v) in tile[wi * 4..wi * 4 + 4].iter().enumerate() {
                            // SAFETY: i + di < m and r + wi < rows, so the index is
                            // < out.len() (asserted); chunk c is the only writer of rows r0..r1.
                            unsafe { *outp.0.add((i + di) * rows + r + wi) = v };
                        }
                    }
                    r += nw;
                }
                i += 4;
            }
            // Remaining activation rows one weight row at a time: in decode the weights stream
            // from memory, and one sequential stream per thread measured faster than a tile of
            // four weight rows (Qwen2.5 0.5B: 11 vs 8 tokens per CPU-second).
            for i in i..i1 {
                let a = act.row(i);
                for r in r0..r1 {
                    let v = table.vec_dot(wtype, wrow(r), a, k);
                    // SAFETY: as above.
                    unsafe { *outp.0.add(i * rows + r) = v };
                }
            }
        }
        // Rows past `gemm_rows`: eight at a time through the many-row kernel, else four at a
        // time through the kernel that rounds as `vec_dot`.
        let mut i = m;
        if m_all - m >= 2 {
            while i < m_all && many_rows(i, (i + DotTable::MANY_MAX).min(m_all)) {
                i += DotTable::MANY_MAX;
            }
            i = i.min(m_all);
        }
        while i + 4 <= m_all {
            let acts = [act.row(i), act.row(i + 1), act.row(i + 2), act.row(i + 3)];
            for r in r0..r1 {
                let v = table.vec_dot4_single(wtype, wrow(r), acts, k);
                for (di, &x) in v.iter().enumerate() {
                    // SAFETY: i + di < m_all and r < rows, so the index is < out.len()
                    // (asserted); chunk c is the only writer of rows r0..r1.
                    unsafe { *outp.0.add((i + di) * rows + r) = x };
                }
            }
            i += 4;
        }
        for i in i..m_all {
            let a = act.row(i);
            for r in r0..r1 {
                let v = table.vec_dot(wtype, wrow(r), a, k);
                // SAFETY: as above.
                unsafe { *outp.0.add(i * rows + r) = v };
            }
        }
    });
}

/// `out[i][r] = dot(W[r], x[i])` for `x` of `m` rows (`x.len() / k`); `act` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    wtype: WeightType,
    w: &[u8],
    rows: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    act: &mut QuantizedActivations,
    pool: &ThreadPool,
) {
    act.quantize_into_par(wtype, x, k, pool);
    matmul_quantized(wtype, w, rows, k, act, out, pool);
}

/// `out[r] = dot(W[r], x)` for a single activation row; `act` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    wtype: WeightType,
    w: &[u8],
    rows: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    act: &mut QuantizedActivations,
    pool: &ThreadPool,
) {
    assert_eq!(x.len(), k, "matvec takes exactly one row of k");
    matmul(wtype, w, rows, k, x, out, act, pool);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_row, XorShift};

    #[test]
    fn matmul_matches_per_row_dots() {
        let mut rng = XorShift::new(9);
        let pool = ThreadPool::new(3);
        let mut act = QuantizedActivations::new();
        for wtype in WeightType::ALL {
            let (rows, k, m) = (37, 512, 11);
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
            let x = rng.vec(m * k);
            let mut out = vec![0.0; m * rows];
            matmul(wtype, &w, rows, k, &x, &mut out, &mut act, &pool);
            let rb = wtype.row_bytes(k);
            for i in 0..m {
                let q = QuantizedActivations::quantize(wtype, &x[i * k..(i + 1) * k]);
                for r in 0..rows {
                    let e = crate::dot::vec_dot(wtype, &w[r * rb..(r + 1) * rb], &q, k);
                    let got = out[i * rows + r];
                    assert!((got - e).abs() <= 1e-4 * (1.0 + e.abs()), "{wtype:?} i={i} r={r}");
                }
            }
            let mut o1 = vec![0.0; rows];
            matvec(wtype, &w, rows, k, &x[..k], &mut o1, &mut act, &pool);
            for (a, b) in o1.iter().zip(&out[..rows]) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{wtype:?} matvec");
            }
        }
    }

    #[test]
    fn f32_matmul_rows_equal_single_row_dots_bit_for_bit() {
        let mut rng = XorShift::new(11);
        let wtype = WeightType::F32;
        // Long rows make several L2-sized passes per chunk; 29 and 53 activation rows end in a
        // tile under half full and one over half full.
        for (rows, k, m, threads) in [(37, 4096, 29, 2), (50, 96, 53, 3), (5, 40, 1, 1)] {
            let pool = ThreadPool::new(threads);
            let w = random_row(&mut rng, wtype, rows * k);
            let x = rng.vec(m * k);
            let mut act = QuantizedActivations::new();
            act.quantize_into(wtype, &x, k);
            for g in [0, m / 2, m] {
                let mut out = vec![f32::NAN; m * rows];
                matmul_quantized_split(wtype, &w, rows, k, &act, g, &mut out, &pool);
                for i in 0..m {
                    for r in 0..rows {
                        let e = crate::dot::vec_dot_row(wtype, &w[r * 4 * k..(r + 1) * 4 * k], act.row(i), k);
                        let got = out[i * rows + r];
                        assert_eq!(got.to_bits(), e.to_bits(), "{rows}x{k} m={m} g={g} i={i} r={r}");
                    }
                }
            }
        }
    }

    #[test]
    fn split_matmul_rows_equal_the_gemm_alone_and_single_rows_bit_for_bit() {
        let mut rng = XorShift::new(10);
        let pool = ThreadPool::new(2);
        for wtype in WeightType::ALL {
            let (rows, k, m, g) = (21, 512, 14, 5);
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
            let x = rng.vec(m * k);
            let mut act = QuantizedActivations::new();
            act.quantize_into(wtype, &x, k);
            let mut out = vec![0.0; m * rows];
            matmul_quantized_split(wtype, &w, rows, k, &act, g, &mut out, &pool);
            let mut want = vec![0.0; g * rows];
            let mut a = QuantizedActivations::new();
            a.quantize_into(wtype, &x[..g * k], k);
            matmul_quantized(wtype, &w, rows, k, &a, &mut want, &pool);
            for i in g..m {
                let mut one = vec![0.0; rows];
                a.quantize_into(wtype, &x[i * k..(i + 1) * k], k);
                matmul_quantized(wtype, &w, rows, k, &a, &mut one, &pool);
                want.extend(one);
            }
            let bad = out
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(bad, 0, "{wtype:?}");
        }
    }
}
