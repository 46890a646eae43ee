//! Streaming speed of a packed matrix-vector product too large for any cache (Gemma 3 270M's
//! output head: 262144 x 640 Q8_0, 178 MB), in GB/s of weights read, at 1 and 2 threads; compare
//! with `read_bandwidth`.
//! `cargo run --release -p berth-kernels --example headbench [rows] [k] [type] [activation rows]`.

use berth_kernels::dot::QuantizedActivations;
use berth_kernels::packed::{matmul_packed, PackedActs, PackedMatrix};
use berth_kernels::pool::ThreadPool;
use berth_kernels::quant::WeightType;
use berth_kernels::testutil::{random_row, XorShift};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(262_144);
    let k: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(640);
    let wtype = match args.get(3).map(String::as_str) {
        Some("q5_0") => WeightType::Q5_0,
        Some("q4_k") => WeightType::Q4_K,
        Some("q6_k") => WeightType::Q6_K,
        _ => WeightType::Q8_0,
    };
    let mut rng = XorShift::new(7);
    // Random rows repeated: the product reads every byte; its values do not matter here.
    let distinct: Vec<u8> = (0..64).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
    let w: Vec<u8> = distinct
        .iter()
        .copied()
        .cycle()
        .take(rows * wtype.row_bytes(k))
        .collect();
    let Some(p) = PackedMatrix::pack(wtype, &w, rows, k) else {
        eprintln!("headbench: packed kernels unavailable on this CPU");
        return;
    };
    drop(w);
    let m: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(1);
    let x = rng.vec(m * k);
    let mut act = QuantizedActivations::new();
    act.quantize_into(wtype, &x, k);
    let mut out = vec![0.0f32; m * rows];
    let mut scratch = PackedActs::new();
    let bytes = (rows * wtype.row_bytes(k)) as f64;
    for threads in [1usize, 2] {
        let pool = ThreadPool::new(threads);
        let mut best = f64::MAX;
        for _ in 0..60 {
            let t0 = std::time::Instant::now();
            matmul_packed(&p, &act, &mut out, &mut scratch, &pool);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{} {rows}x{k} x{m} threads={threads}: {:.3} ms, {:.2} GB/s, {:.1} GMAC/s",
            wtype.name(),
            best * 1e3,
            bytes / best / 1e9,
            (m * rows * k) as f64 / best / 1e9
        );
    }
}
