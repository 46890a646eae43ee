//! Throughput of F32-weight matrix products over many activation rows (the shapes of
//! EmbeddingGemma-300M's FFN and dense heads), in GFLOP/s through `matmul_quantized_split` as
//! the plugins call it ("tiles"), against the single-row loop it replaced ("rows": every weight
//! row against four activation rows, one `vec_dot` each, in the same chunks), at 1 and 2
//! threads; first the tile kernel alone on one chunk in cache. Best of `FB_TRIALS` (7) runs,
//! so other load on the machine matters less.
//! `cargo run --release -p berth-kernels --example f32bench [activation rows]`.

use berth_kernels::dot::{DotTable, QuantizedActivations};
use berth_kernels::matmul::matmul_quantized_split;
use berth_kernels::pool::ThreadPool;
use berth_kernels::quant::WeightType;
use berth_kernels::testutil::{random_row, XorShift};

/// The F32 path before register tiles: chunks as `matmul_quantized_split` cuts them, four
/// activation rows per pass over the chunk's weight rows, one single-row dot per pair.
fn single_rows(
    w: &[u8],
    rows: usize,
    k: usize,
    act: &QuantizedActivations,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let table = DotTable::best();
    let m = act.rows();
    let rb = 4 * k;
    let per = rows.div_ceil(pool.n_threads() * 4).clamp(4, 256);
    let outs: Vec<std::sync::Mutex<Vec<f32>>> = (0..rows.div_ceil(per))
        .map(|_| std::sync::Mutex::new(vec![0.0; m * per]))
        .collect();
    pool.parallel_for(outs.len(), |c| {
        let (r0, r1) = (c * per, ((c + 1) * per).min(rows));
        let mut o = outs[c].lock().unwrap();
        for i0 in (0..m).step_by(4) {
            for r in r0..r1 {
                for i in i0..(i0 + 4).min(m) {
                    o[i * per + r - r0] =
                        table.vec_dot(WeightType::F32, &w[r * rb..(r + 1) * rb], act.row(i), k);
                }
            }
        }
    });
    out[0] = outs[0].lock().unwrap()[0];
}

fn main() {
    let m: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let trials: usize = std::env::var("FB_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    println!("table {}, {m} activation rows", DotTable::best().name);
    let mut rng = XorShift::new(5);
    let wtype = WeightType::F32;
    {
        // The kernel alone on one chunk (144 weight rows × 24 activation rows), in cache.
        let (rows, k, na) = (144usize, 768usize, 24usize);
        let w = random_row(&mut rng, wtype, rows * k);
        let x: Vec<Vec<f32>> = (0..na).map(|_| rng.vec(k)).collect();
        let acts: Vec<&[f32]> = x.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0.0f32; rows * na];
        let mut best = f64::MAX;
        for _ in 0..trials * 50 {
            let t0 = std::time::Instant::now();
            (DotTable::best().f32_rows)(&w, rows, k, &acts, &mut out);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "kernel alone {rows}x{k} x {na}: {:6.1} GFLOP/s",
            2.0 * (rows * k * na) as f64 / 1e9 / best
        );
    }
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    // (rows, k): the FFN's 768 -> 1152 and 1152 -> 768, the dense head's 3072 -> 768.
    for (rows, k) in [(1152usize, 768usize), (768, 1152), (768, 3072)] {
        let w = random_row(&mut rng, wtype, rows * k);
        let x = rng.vec(m * k);
        let mut act = QuantizedActivations::new();
        act.quantize_into(wtype, &x, k);
        let mut out = vec![0.0f32; m * rows];
        let gflop = 2.0 * (rows * k * m) as f64 / 1e9;
        for (name, tiles) in [("rows ", false), ("tiles", true)] {
            let mut line = format!("f32 {rows}x{k} {name}:");
            for pool in &pools {
                let mut wall = f64::MAX;
                for _ in 0..trials {
                    let t0 = std::time::Instant::now();
                    if tiles {
                        matmul_quantized_split(wtype, &w, rows, k, &act, 0, &mut out, pool);
                    } else {
                        single_rows(&w, rows, k, &act, &mut out, pool);
                    }
                    wall = wall.min(t0.elapsed().as_secs_f64());
                }
                line += &format!("  {}t {:6.1} GFLOP/s", pool.n_threads(), gflop / wall);
            }
            println!("{line}");
        }
    }
}
