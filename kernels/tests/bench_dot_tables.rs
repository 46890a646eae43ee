//! Every dot table this CPU runs, side by side in one process (run with `--ignored --nocapture`,
//! in release): the prompt-processing shape (2 or 4 weight rows × 4 activation rows tiles, or the
//! four-row kernels, over cache-resident weights) and the decode shape (single rows).
//!
//! Figures are the best of many short repetitions (wall time, one thread), so they stay
//! meaningful on a busy machine.

use berth_kernels::dot::{ActRow, DotTable, QuantizedActivations};
use berth_kernels::quant::WeightType;
use berth_kernels::testutil::{random_row, XorShift};
use std::time::Instant;

/// Best (smallest) wall time of `reps` runs of `f`, in seconds: on a busy machine the best run
/// is the one least disturbed by other processes.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore]
fn bench_dot_tables() {
    let tables = DotTable::available();
    let missing: Vec<&str> = DotTable::NAMES
        .into_iter()
        .filter(|n| DotTable::by_name(n).is_none())
        .collect();
    println!(
        "dot tables run: {} (not run here: {})",
        tables.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
        if missing.is_empty() {
            "none".to_string()
        } else {
            missing.join(", ")
        }
    );
    let mut rng = XorShift::new(7);
    let (rows, k, m) = (64usize, 4864usize, 8usize);
    for wtype in [
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q4_0,
    ] {
        let rb = wtype.row_bytes(k);
        // One contiguous matrix, as the weights of a mapped model file: `rows` cache-resident
        // rows for the tiles, and 64 MB (streamed from memory, as in decode) for single rows.
        let big_rows = (64 << 20) / rb;
        let w: Vec<u8> = (0..big_rows)
            .flat_map(|_| random_row(&mut rng, wtype, k))
            .collect();
        let row = |r: usize| &w[r * rb..(r + 1) * rb];
        let mut q = QuantizedActivations::new();
        q.quantize_into(wtype, &rng.vec(m * k), k);
        let acts: Vec<ActRow<'_>> = (0..m).map(|i| q.row(i)).collect();
        for t in tables.iter().rev() {
            if t.name == "scalar" {
                continue;
            }
            let mut out = [0.0f32; 16];
            let mut sink = 0.0f32;
            // Prompt processing: as matmul does, 4 activation rows × `tile_rows` weight rows.
            let tw = t.tile_rows;
            let pp = best_of(40, || {
                for a4 in acts.chunks_exact(4) {
                    for r in (0..rows).step_by(tw) {
                        let ws: Vec<&[u8]> = (r..r + tw).map(row).collect();
                        t.vec_dot_tile(wtype, &ws, a4, k, &mut out);
                        sink += out[0];
                    }
                }
            });
            // Decode: one activation row against every weight row of the big matrix.
            let tg = best_of(5, || {
                for r in 0..big_rows {
                    sink += t.vec_dot(wtype, row(r), acts[0], k);
                }
            });
            std::hint::black_box(sink);
            println!(
                "{:6} {:5} k={k}: tiles {:6.1} GOP/s (cache-resident) | single rows {:6.2} GB/s of weights ({} MB)",
                t.name,
                wtype.name(),
                2.0 * (m * rows * k) as f64 / pp / 1e9,
                (big_rows * rb) as f64 / tg / 1e9,
                (big_rows * rb) >> 20,
            );
        }
    }
}
