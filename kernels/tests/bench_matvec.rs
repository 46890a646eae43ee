//! Rough matvec throughput figures (run with `--ignored --nocapture`).
//!
//! Single-thread figures are also given per CPU-second of the calling thread (from
//! `/proc/thread-self/schedstat`), which stays meaningful on a busy machine.

use berth_kernels::dot::{DotTable, QuantizedActivations};
use berth_kernels::matmul::{matmul, matvec};
use berth_kernels::pool::{default_threads, ThreadPool};
use berth_kernels::quant::WeightType;
use berth_kernels::testutil::{random_row, XorShift};
use std::time::Instant;

/// Nanoseconds this thread has spent on a CPU (Linux), if available.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[test]
#[ignore]
fn bench_matvec_qwen_ffn_down() {
    let (rows, k) = (896usize, 4864usize);
    let mut rng = XorShift::new(42);
    let x = rng.vec(k);
    println!("dot kernels: {}", DotTable::best().name);
    for wtype in [
        WeightType::Q4_K,
        WeightType::Q8_0,
        WeightType::Q6_K,
        WeightType::Q5_0,
        WeightType::Q4_0,
        WeightType::Mxfp4,
        WeightType::F16,
    ] {
        let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
        let mb = w.len() as f64 / 1e6;
        let mut out = vec![0.0f32; rows];
        let mut act = QuantizedActivations::new();
        for threads in [1, default_threads()] {
            let pool = ThreadPool::new(threads);
            for _ in 0..20 {
                matvec(wtype, &w, rows, k, &x, &mut out, &mut act, &pool);
            }
            let iters = 200;
            let cpu0 = thread_cpu_ns();
            let t = Instant::now();
            for _ in 0..iters {
                matvec(wtype, &w, rows, k, &x, &mut out, &mut act, &pool);
            }
            let dt = t.elapsed().as_secs_f64() / iters as f64;
            let cpu = match (cpu0, thread_cpu_ns()) {
                (Some(a), Some(b)) if threads == 1 => {
                    let c = (b - a) as f64 * 1e-9 / iters as f64;
                    format!("  | per CPU-time: {:7.1} us {:6.2} GB/s", c * 1e6, mb / 1e3 / c)
                }
                _ => String::new(),
            };
            println!(
                "matvec {:5} {rows}x{k} ({mb:.2} MB) threads={threads}: wall {:7.1} us {:6.2} GB/s{cpu}",
                wtype.name(),
                dt * 1e6,
                mb / 1e3 / dt,
            );
        }
        // Prefill-style batch of 32 rows on all threads.
        let m = 32;
        let xm = rng.vec(m * k);
        let mut outm = vec![0.0f32; m * rows];
        let pool = ThreadPool::new(default_threads());
        let t = Instant::now();
        let iters = 10;
        for _ in 0..iters {
            matmul(wtype, &w, rows, k, &xm, &mut outm, &mut act, &pool);
        }
        let dt = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "matmul {:5} m={m} threads={}: wall {:7.1} us  {:6.1} GFLOP/s",
            wtype.name(),
            default_threads(),
            dt * 1e6,
            2.0 * (m * rows * k) as f64 / dt / 1e9
        );
    }
}
