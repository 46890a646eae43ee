//! Single-thread throughput of the dot kernels per shape (in-cache, best of `TB_TRIALS` (7) runs of `TB_REPS` (100), so other
//! load on the machine matters less):
//! `cargo run --release -p berth-kernels --example tilebench`.

use berth_kernels::dot::{ActRow, DotTable, QuantizedActivations};
use berth_kernels::quant::WeightType;
use berth_kernels::testutil::{random_row, XorShift};

fn main() {
    let mut rng = XorShift::new(1);
    let t = DotTable::best();
    let (rows, k) = (256usize, 896usize);
    for wtype in [
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Mxfp4,
        WeightType::Q4_K,
        WeightType::Q6_K,
    ] {
        let k = if wtype.block_size() == 256 { 1024 } else { k };
        let w: Vec<Vec<u8>> = (0..rows).map(|_| random_row(&mut rng, wtype, k)).collect();
        let x = rng.vec(8 * k);
        let mut q = QuantizedActivations::new();
        q.quantize_into(wtype, &x, k);
        let acts: Vec<ActRow<'_>> = (0..8).map(|i| q.row(i)).collect();
        let flat: Vec<u8> = w.concat();
        let reps: usize = std::env::var("TB_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100);
        let trials: usize = std::env::var("TB_TRIALS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(7);
        let mut sink = 0.0f32;
        let mut out = [0.0f32; 8];
        let mut run = |name: &str, f: &mut dyn FnMut(&mut f32)| {
            let mut s = f64::MAX;
            for _ in 0..trials {
                let t0 = std::time::Instant::now();
                for _ in 0..reps {
                    f(&mut sink);
                }
                s = s.min(t0.elapsed().as_secs_f64());
            }
            let width = name
                .rsplit_once(" x")
                .map_or(1.0, |(_, x)| x.parse().unwrap_or(1.0));
            let macs = (reps * rows * k) as f64 * width;
            println!("{wtype:?} {name}: {:.2} GMAC/s", macs / s / 1e9);
        };
        run("single", &mut |s| {
            for r in w.iter() {
                *s += t.vec_dot(wtype, r, acts[0], k);
            }
        });
        run("dot4 x4", &mut |s| {
            for r in w.iter() {
                *s += t.vec_dot4(wtype, r, [acts[0], acts[1], acts[2], acts[3]], k)[0];
            }
        });
        run("tile2 x4", &mut |s| {
            for r in w.chunks(2) {
                t.vec_dot_tile(wtype, &[&r[0][..], &r[1]], &acts[..4], k, &mut out);
                *s += out[0];
            }
        });
        run("single4 x4", &mut |s| {
            for r in w.iter() {
                *s += t.vec_dot4_single(wtype, r, [acts[0], acts[1], acts[2], acts[3]], k)[0];
            }
        });
        let mut many = vec![0.0f32; rows * 8];
        for na in [2usize, 4, 8] {
            run(&format!("many x{na}"), &mut |s| {
                t.vec_dot_rows_single(wtype, &flat, rows, &acts[..na], k, &mut many);
                *s += many[0];
            });
        }
        if let Some(p) = berth_kernels::packed::PackedMatrix::pack(wtype, &flat, rows, k) {
            let pool = berth_kernels::pool::ThreadPool::new(1);
            let mut scratch = berth_kernels::packed::PackedActs::new();
            let mut out = vec![0.0f32; rows * 8];
            for na in [1usize, 4, 8] {
                let mut qa = QuantizedActivations::new();
                qa.quantize_into(wtype, &x[..na * k], k);
                run(&format!("packed x{na}"), &mut |s| {
                    berth_kernels::packed::matmul_packed(&p, &qa, &mut out, &mut scratch, &pool);
                    *s += out[0];
                });
            }
        }
        std::hint::black_box(sink);
    }
}
