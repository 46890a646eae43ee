//! Throughput of F32-weight matrix products over many activation rows (the shapes of
//! EmbeddingGemma-300M's FFN and dense heads), in GFLOP/s through `matmul_quantized_split` as
//! the plugins call it, at 1 and 2 threads; best of `FB_TRIALS` (5) runs, so other load on the
//! machine matters less.
//! `cargo run --release -p berth-kernels --example f32bench [activation rows]`.

use berth_kernels::dot::QuantizedActivations;
use berth_kernels::matmul::matmul_quantized_split;
use berth_kernels::pool::ThreadPool;
use berth_kernels::quant::WeightType;
use berth_kernels::testutil::{random_row, XorShift};

fn main() {
    let m: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(512);
    let trials: usize = std::env::var("FB_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut rng = XorShift::new(5);
    let wtype = WeightType::F32;
    // (rows, k): the FFN's 768 -> 1152 and 1152 -> 768, the dense head's 3072 -> 768.
    for (rows, k) in [(1152usize, 768usize), (768, 1152), (768, 3072)] {
        let w = random_row(&mut rng, wtype, rows * k);
        let x = rng.vec(m * k);
        let mut act = QuantizedActivations::new();
        act.quantize_into(wtype, &x, k);
        let mut out = vec![0.0f32; m * rows];
        let flops = 2.0 * (rows * k * m) as f64;
        let mut line = format!("f32 {rows}x{k} x {m} rows:");
        for threads in [1usize, 2] {
            let pool = ThreadPool::new(threads);
            let mut best = f64::MAX;
            for _ in 0..trials {
                let t0 = std::time::Instant::now();
                matmul_quantized_split(wtype, &w, rows, k, &act, 0, &mut out, &pool);
                best = best.min(t0.elapsed().as_secs_f64());
            }
            line += &format!("  {threads}t {:7.1} GFLOP/s ({:6.2} ms)", flops / best / 1e9, best * 1e3);
        }
        println!("{line}  [{}]", out[out.len() / 2]);
    }
}
