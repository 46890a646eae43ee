//! Linear layers over a batch of rows on the kernels' persistent thread pool and tiled matmul,
//! and thread-count resolution.

use crate::weights::Matrix;
use berth_kernels::dot::QuantizedActivations;
use berth_kernels::matmul::matmul_quantized_split;
use berth_kernels::packed::{matmul_packed, matmul_packed_many, PackedActs, MANY_MAX};
use berth_kernels::pool::ThreadPool;
use berth_kernels::quant::ActFormat;
use std::ops::Range;
use std::sync::Mutex;

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

/// The persistent pool of `threads` threads (the caller counts as one); one pool per distinct
/// count is created on first use and lives for the rest of the process.
pub fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: Mutex<Vec<&'static ThreadPool>> = Mutex::new(Vec::new());
    let threads = threads.max(1);
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.iter().find(|p| p.n_threads() == threads) {
        return p;
    }
    let p: &'static ThreadPool = Box::leak(Box::new(ThreadPool::new(threads)));
    pools.push(p);
    p
}

/// Runs `f` over `data` split into pieces of whole units (`unit` floats each) on the pool of
/// `threads` threads: `f` gets each piece's unit range and its slice. Pieces are claimed
/// dynamically (several per thread), so uneven work per unit still balances.
pub fn par_units<F>(threads: usize, data: &mut [f32], unit: usize, f: F)
where
    F: Fn(Range<usize>, &mut [f32]) + Sync,
{
    let n_units = data.len().checked_div(unit).unwrap_or(0);
    let data = &mut data[..n_units * unit];
    if threads <= 1 || n_units <= 1 {
        f(0..n_units, data);
        return;
    }
    let per = n_units.div_ceil(threads * 4);
    pool(threads).parallel_chunks_mut(data, per * unit, |i, piece| {
        let start = i * per;
        f(start..start + piece.len() / unit, piece)
    });
}

/// Reusable buffers for [`matmul`] and [`matmul_shared`]: one quantized copy of the input per
/// activation format, so a warm decode step allocates nothing.
#[derive(Default)]
pub struct MatmulScratch {
    acts: [QuantizedActivations; 3],
    /// One per matrix of a [`matmul_shared`] whose matrices are all packed.
    packed: [PackedActs; MANY_MAX],
    /// Rows tiled as one matrix (MoE experts, whose batches are not split); false (the
    /// default): every row rounds as a single-row product would, so a sequence's numbers never
    /// depend on the rows batched with it (see
    /// [`berth_kernels::matmul::matmul_quantized_split`]).
    pub tiled: bool,
}

impl MatmulScratch {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }
}

fn slot(f: ActFormat) -> usize {
    match f {
        ActFormat::F32 => 0,
        ActFormat::Q8_0 => 1,
        ActFormat::Q8_K => 2,
    }
}

/// Checks shapes and picks the pool: small products run on the calling thread alone.
fn prepare(w: &Matrix, x: &[f32], n: usize, out: &[f32], threads: usize) -> &'static ThreadPool {
    check_shapes(w, x, n, out);
    // Enough work per thread to repay waking the pool.
    pool(if w.rows * n * w.cols < (1 << 15) {
        1
    } else {
        threads
    })
}

/// Panics unless `x` holds `n` input rows of `w` and `out` their `n` output rows.
fn check_shapes(w: &Matrix, x: &[f32], n: usize, out: &[f32]) {
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
}

/// `w`'s input quantized into its activation format's slot of `acts`, unless `done` says this
/// call already did that format at this width.
fn quantized<'s>(
    acts: &'s mut [QuantizedActivations; 3],
    done: &mut [bool; 3],
    w: &Matrix,
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) -> &'s QuantizedActivations {
    let (f, cols) = (slot(w.wtype.act_format()), w.cols);
    if !done[f] || acts[f].n() != cols {
        acts[f].quantize_into_par(w.wtype, &x[..n * cols], cols, pool);
        done[f] = true;
    }
    &acts[f]
}

/// `out[b][r] = Σ_c w[r][c] · x[b][c]` for `n` rows of `x` (`n × w.cols`) into `out`
/// (`n × w.rows`). Activations are quantized once for the weight type; output rows are split
/// over the pool of `threads` threads.
pub fn matmul(w: &Matrix, x: &[f32], n: usize, out: &mut [f32], scratch: &mut MatmulScratch, threads: usize) {
    matmul_shared(x, n, &mut [(w, out)], scratch, threads);
}

/// [`matmul`] of several matrices with the same input (q/k/v, gate/up): `x` is quantized once
/// per activation format rather than once per matrix.
pub fn matmul_shared(
    x: &[f32],
    n: usize,
    outs: &mut [(&Matrix, &mut [f32])],
    scratch: &mut MatmulScratch,
    threads: usize,
) {
    if n == 0 {
        return;
    }
    // Every matrix packed: quantize once per format, then all products in one parallel section
    // (a decode step's q/k/v and gate/up each wait for the threads once).
    if (2..=MANY_MAX).contains(&outs.len()) && outs.iter().all(|(w, _)| w.packed().is_some()) {
        let work: usize = outs.iter().map(|(w, _)| w.rows * w.cols * n).sum();
        let pool = pool(if work < (1 << 15) { 1 } else { threads });
        let mut done = [false; 3];
        for (w, out) in outs.iter() {
            check_shapes(w, x, n, out);
            quantized(&mut scratch.acts, &mut done, w, x, n, pool);
        }
        let MatmulScratch { acts, packed, .. } = scratch;
        let acts = &*acts;
        let items = outs.iter_mut().zip(packed.iter_mut()).map(|((w, out), s)| {
            let p = w.packed().expect("checked above");
            (p, &acts[slot(w.wtype.act_format())], &mut out[..n * w.rows], s)
        });
        matmul_packed_many(items, pool);
        return;
    }
    let mut done = [false; 3];
    for (w, out) in outs.iter_mut() {
        let pool = prepare(w, x, n, out, threads);
        let (rows, cols) = (w.rows, w.cols);
        let act = quantized(&mut scratch.acts, &mut done, w, x, n, pool);
        if let Some(p) = w.packed() {
            // Every row rounds alike there, whatever it is batched with.
            matmul_packed(p, act, &mut out[..n * rows], &mut scratch.packed[0], pool);
            continue;
        }
        let g = if scratch.tiled { n } else { 0 };
        matmul_quantized_split(w.wtype, w.bytes(), rows, cols, act, g, &mut out[..n * rows], pool);
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

    #[test]
    fn shared_matmul_matches_separate_ones_and_par_units_covers_all() {
        let mut rng = XorShift::new(11);
        let (cols, n) = (256, 3);
        let x: Vec<f32> = rng.vec(n * cols);
        let mats: Vec<Matrix> = [WeightType::Q8_0, WeightType::F32, WeightType::Q8_0]
            .into_iter()
            .zip([64usize, 40, 96])
            .map(|(t, rows)| {
                let w: Vec<f32> = rng.vec(rows * cols);
                if t == WeightType::F32 {
                    Matrix::from_f32(rows, cols, &w)
                } else {
                    let b: Vec<u8> = w.chunks(cols).flat_map(quantize_row_q8_0).collect();
                    Matrix::new(Arc::new(b), 0, t, rows, cols).unwrap()
                }
            })
            .collect();
        let mut want: Vec<Vec<f32>> = mats.iter().map(|m| vec![0.0; n * m.rows]).collect();
        for (m, o) in mats.iter().zip(want.iter_mut()) {
            matmul(m, &x, n, o, &mut MatmulScratch::new(), 1);
        }
        let mut got: Vec<Vec<f32>> = mats.iter().map(|m| vec![0.0; n * m.rows]).collect();
        let mut s = MatmulScratch::new();
        for threads in [1, 2] {
            let mut outs: Vec<(&Matrix, &mut [f32])> = mats
                .iter()
                .zip(got.iter_mut())
                .map(|(m, o)| (m, o.as_mut_slice()))
                .collect();
            matmul_shared(&x, n, &mut outs, &mut s, threads);
            assert_eq!(got, want);
        }
        let mut data = vec![0.0f32; 3 * 37];
        par_units(2, &mut data, 3, |r, d| {
            for (u, c) in r.zip(d.chunks_exact_mut(3)) {
                c.fill(u as f32);
            }
        });
        assert!(data.iter().enumerate().all(|(i, &v)| v == (i / 3) as f32));
    }
}
