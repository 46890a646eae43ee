//! Memory read bandwidth, the roof decode runs under: `threads` workers each sum their share of
//! a buffer far larger than the caches, best of several passes, printed as one JSON line per
//! thread count. `scripts/bench` divides it by a model's bytes per token for the roofline.
//! `cargo run --release -p berth-kernels --example read_bandwidth -- [THREADS,...] [MIB]`
//! (defaults: `1,2` threads over 1024 MiB).

use std::time::Instant;

/// Passes over the buffer per thread count; the fastest one counts.
const PASSES: usize = 7;

/// Sums a slice with several independent accumulators (so the loop is bound by loads, not by
/// one addition chain); the sum is returned so the reads cannot be optimised away. With AVX2 the
/// loads are 32 bytes wide, as the decode kernels' are (plain 8-byte loads measured a third
/// slower than what decode itself reached).
fn sum(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present.
        return unsafe { sum_avx2(words) };
    }
    sum_portable(words)
}

/// [`sum`] with 8-byte loads.
fn sum_portable(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &w| a.wrapping_add(w));
    for c in chunks {
        for (a, &w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(w);
        }
    }
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

/// [`sum`] with 32-byte loads, four accumulators.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let chunks = words.chunks_exact(16);
    let tail = sum_portable(chunks.remainder());
    let mut acc = [_mm256_setzero_si256(); 4];
    for c in chunks {
        for (u, a) in acc.iter_mut().enumerate() {
            // SAFETY: each chunk holds 16 words: 4 loads of 4 words.
            *a = _mm256_add_epi64(*a, unsafe {
                _mm256_loadu_si256(c.as_ptr().add(4 * u) as *const __m256i)
            });
        }
    }
    let mut lanes = [0u64; 16];
    for (u, a) in acc.iter().enumerate() {
        // SAFETY: 4 words fit at 4 u of the 16-word array.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().add(4 * u) as *mut __m256i, *a) };
    }
    lanes.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

/// One timed pass of `threads` workers over `words`, in bytes per second.
fn pass(words: &[u64], threads: usize) -> (f64, u64) {
    let share = words.len().div_ceil(threads);
    let t0 = Instant::now();
    let total = std::thread::scope(|s| {
        let handles: Vec<_> = words
            .chunks(share)
            .map(|part| s.spawn(move || sum(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .fold(0u64, u64::wrapping_add)
    });
    let secs = t0.elapsed().as_secs_f64();
    (std::mem::size_of_val(words) as f64 / secs, total)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: Vec<usize> = args
        .first()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let n = mib * (1 << 20) / 8;
    // Written once so every page is backed by memory before timing.
    let words: Vec<u64> = (0..n as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    for &t in &threads {
        let t = t.max(1);
        let mut best = 0f64;
        let mut check = 0u64;
        for _ in 0..PASSES {
            let (bps, total) = pass(&words, t);
            best = best.max(bps);
            check ^= total;
        }
        println!(
            "{{\"threads\": {t}, \"mib\": {mib}, \"read_gb_per_s\": {:.2}, \"check\": {}}}",
            best / 1e9,
            check & 0xff
        );
    }
}
