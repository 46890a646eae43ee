//! Linear layers over a batch of rows, parallel over output rows, and thread-count resolution.
//!
//! The kernels crate's thread pool and matmul are not on this branch yet; this module uses scoped
//! threads with the kernels' dot products and can switch to the pool once it lands.

use crate::weights::Matrix;
use berth_kernels::dot::{DotTable, QuantizedActivations};
use std::ops::Range;

/// The compute thread count: `requested` (from the load config) if set, else `BERTH_THREADS`,
/// else the machine's available parallelism.
pub fn resolve_threads(requested: Option<u32>) -> usize {
    if let Some(n) = requested.filter(|&n| n > 0) {
        return n as usize;
    }
    if let Some(n) = std::env::var("BERTH_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Splits `0..n` into at most `parts` contiguous, nearly equal ranges.
pub fn split_range(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Runs `f` over `data` split into `threads` pieces of whole units (`unit` floats each): `f` gets
/// the unit range and its slice. The calling thread takes the first piece.
pub fn par_units<F>(threads: usize, data: &mut [f32], unit: usize, f: F)
where
    F: Fn(Range<usize>, &mut [f32]) + Sync,
{
    let n_units = data.len().checked_div(unit).unwrap_or(0);
    let ranges = split_range(n_units, threads);
    if ranges.len() <= 1 {
        f(0..n_units, &mut data[..n_units * unit]);
        return;
    }
    std::thread::scope(|s| {
        let mut rest = &mut data[..n_units * unit];
        let mut first = None;
        for (i, r) in ranges.iter().enumerate() {
            let (head, tail) = rest.split_at_mut(r.len() * unit);
            rest = tail;
            if i == 0 {
                first = Some((r.clone(), head));
            } else {
                let f = &f;
                let r = r.clone();
                s.spawn(move || f(r, head));
            }
        }
        if let Some((r, head)) = first {
            f(r, head);
        }
    });
}

/// Reusable buffers for [`matmul`].
#[derive(Default)]
pub struct MatmulScratch {
    act: QuantizedActivations,
    parts: Vec<Vec<f32>>,
}

impl MatmulScratch {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Computes weight rows `rows` against every activation row: `dst[b * stride + (r - rows.start)]`.
fn rows_into(
    w: &Matrix,
    act: &QuantizedActivations,
    rows: Range<usize>,
    n: usize,
    dst: &mut [f32],
    stride: usize,
) {
    let table = DotTable::best();
    let start = rows.start;
    for r in rows {
        let wr = w.row(r);
        for b in 0..n {
            dst[b * stride + (r - start)] = table.vec_dot(w.wtype, wr, act.row(b), w.cols);
        }
    }
}

/// `out[b][r] = Σ_c w[r][c] · x[b][c]` for `n` rows of `x` (`n × w.cols`) into `out`
/// (`n × w.rows`). Activations are quantized once for the weight type; output rows are split
/// over `threads`.
pub fn matmul(w: &Matrix, x: &[f32], n: usize, out: &mut [f32], scratch: &mut MatmulScratch, threads: usize) {
    let (rows, cols) = (w.rows, w.cols);
    assert!(
        x.len() >= n * cols,
        "matmul input holds {} floats, {n}x{cols} needed",
        x.len()
    );
    assert!(
        out.len() >= n * rows,
        "matmul output holds {} floats, {n}x{rows} needed",
        out.len()
    );
    if n == 0 {
        return;
    }
    scratch.act.quantize_into(w.wtype, &x[..n * cols], cols);
    let act = &scratch.act;
    // Enough work per thread to repay a thread start.
    let threads = threads.min((rows * n * cols / (1 << 16)).max(1));
    if threads <= 1 {
        rows_into(w, act, 0..rows, n, out, rows);
        return;
    }
    if n == 1 {
        par_units(threads, &mut out[..rows], 1, |r, dst| {
            rows_into(w, act, r, 1, dst, 0)
        });
        return;
    }
    let ranges = split_range(rows, threads);
    let parts = &mut scratch.parts;
    if parts.len() < ranges.len() {
        parts.resize_with(ranges.len(), Vec::new);
    }
    std::thread::scope(|s| {
        let mut it = ranges.iter().zip(parts.iter_mut());
        let (r0, p0) = it.next().expect("at least one range");
        for (r, p) in it {
            p.resize(r.len() * n, 0.0);
            let r = r.clone();
            s.spawn(move || rows_into(w, act, r.clone(), n, p, r.len()));
        }
        p0.resize(r0.len() * n, 0.0);
        rows_into(w, act, r0.clone(), n, p0, r0.len());
    });
    for (r, p) in ranges.iter().zip(parts.iter()) {
        for b in 0..n {
            out[b * rows + r.start..b * rows + r.end].copy_from_slice(&p[b * r.len()..(b + 1) * r.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_kernels::quant::{quantize_row_q8_0, WeightType};
    use berth_kernels::testutil::XorShift;
    use std::sync::Arc;

    #[test]
    fn matmul_matches_a_naive_product_at_any_thread_count() {
        let mut rng = XorShift::new(7);
        let (rows, cols, n) = (300, 256, 5);
        let w: Vec<f32> = rng.vec(rows * cols);
        let x: Vec<f32> = rng.vec(n * cols);
        let m = Matrix::from_f32(rows, cols, &w);
        let mut want = vec![0.0f32; n * rows];
        for b in 0..n {
            for r in 0..rows {
                want[b * rows + r] = (0..cols).map(|c| w[r * cols + c] * x[b * cols + c]).sum();
            }
        }
        for threads in [1, 2, 3] {
            for nn in [1, n] {
                let mut out = vec![0.0; nn * rows];
                matmul(&m, &x, nn, &mut out, &mut MatmulScratch::new(), threads);
                for (a, b) in out.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-3, "{a} vs {b}");
                }
            }
        }
        // A quantized matrix goes through the Q8_0 path.
        let bytes: Vec<u8> = w.chunks(cols).flat_map(quantize_row_q8_0).collect();
        let q = Matrix::new(Arc::new(bytes), 0, WeightType::Q8_0, rows, cols).unwrap();
        let mut out = vec![0.0; n * rows];
        matmul(&q, &x, n, &mut out, &mut MatmulScratch::new(), 2);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 0.05 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn split_range_covers_everything() {
        let r = split_range(10, 3);
        assert_eq!(r, vec![0..4, 4..7, 7..10]);
        assert_eq!(split_range(2, 8).len(), 2);
        assert_eq!(split_range(0, 4), vec![0..0]);
    }
}
