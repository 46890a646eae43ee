//! Matmul throughput (`MM_THREADS` threads, default 1) per weight type on a real GGUF: `cargo run --release -p berth-plugin-common --example mmbench -- MODEL.gguf`.

use berth_plugin_common::linear::{matmul, MatmulScratch};
use berth_plugin_common::{Role, TensorId, Weights};
use std::time::Instant;
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}
fn main() {
    let w = Weights::open_gguf(std::env::args().nth(1).unwrap()).unwrap();
    let threads: usize = std::env::var("MM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let ids = [
        TensorId::layer(Role::FfnGate, 0),
        TensorId::layer(Role::FfnDown, 0),
        TensorId::layer(Role::AttnQ, 0),
        TensorId::global(Role::Output),
    ];
    for id in ids {
        let role = id.role;
        let m = w.matrix(&id).unwrap();
        for n in [1usize, 32] {
            let x = vec![0.5f32; n * m.cols];
            let mut out = vec![0.0; n * m.rows];
            let mut s = MatmulScratch::new();
            let iters = if role == Role::Output { 64 / n } else { 200 / n };
            let (t, c) = (Instant::now(), cpu());
            for _ in 0..iters {
                matmul(&m, &x, n, &mut out, &mut s, threads);
            }
            let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu() - c);
            let macs = (iters * n * m.rows * m.cols) as f64;
            println!(
                "{:?} {:?} n={n}: {:.2} GMAC/s wall, {:.2} GMAC/s cpu",
                role,
                m,
                macs / wall / 1e9,
                macs / cpu / 1e9
            );
        }
    }
}
