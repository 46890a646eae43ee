//! How the order of a single thread's reads sets its streaming speed, over a 178 MB buffer in
//! huge pages (`BERTH_HUGEPAGES=0`: small pages): a plain read; `vpdpbusd` over 512-byte blocks
//! (one and four integer chains); and 16-row-group-shaped blocks whose scales sit at the group's
//! start, read a line at a time as the blocks go ("grouped"), with the scale lines asked for at
//! the group's start ("touch"), and with a software prefetch 8 KiB ahead ("pf8k"). AVX-512 VNNI
//! only. `cargo run --release -p berth-kernels --example stream_order`.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
use berth_kernels::pages::PageBuf;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("stream_order: x86-64 only");
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn plain(b: &[u8]) -> i32 {
    let mut acc = [_mm512_setzero_si512(); 4];
    let p = b.as_ptr();
    let mut i = 0;
    while i + 256 <= b.len() {
        for u in 0..4 {
            acc[u] = _mm512_add_epi32(acc[u], _mm512_loadu_si512(p.add(i + 64 * u) as *const _));
        }
        i += 256;
    }
    let s = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
    _mm512_reduce_add_epi32(s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dpb(b: &[u8], y: &[i32; 8], chains: usize) -> i32 {
    let p = b.as_ptr();
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    let d = _mm512_set1_ps(0.5);
    while i + 512 <= b.len() {
        let mut s = [_mm512_setzero_si512(); 4];
        for g in 0..8 {
            let w = _mm512_loadu_si512(p.add(i + 64 * g) as *const _);
            s[g % chains] = _mm512_dpbusd_epi32(s[g % chains], w, _mm512_set1_epi32(y[g]));
        }
        let t = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(t), acc);
        i += 512;
    }
    _mm512_reduce_add_ps(acc) as i32
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn grouped(b: &[u8], y: &[i32; 8], nb: usize, scale_bytes: usize, pf: usize, touch: bool) -> i32 {
    let gb = scale_bytes + nb * 512;
    let mut tot = _mm512_setzero_ps();
    let mut g0 = 0;
    while g0 + gb <= b.len() {
        let base = b.as_ptr().add(g0);
        let mut acc = _mm512_setzero_ps();
        if touch {
            for l in (0..scale_bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(base.add(l) as *const i8);
            }
        }
        for blk in 0..nb {
            let q = base.add(scale_bytes + blk * 512);
            if pf > 0 {
                for l in (0..512).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(pf + l) as *const i8);
                }
            }
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(blk * 32) as *const __m256i));
            let mut s = _mm512_setzero_si512();
            for g in 0..8 {
                let w = _mm512_loadu_si512(q.add(64 * g) as *const _);
                s = _mm512_dpbusd_epi32(s, w, _mm512_set1_epi32(y[g]));
            }
            acc = _mm512_fmadd_ps(dx, _mm512_cvtepi32_ps(s), acc);
        }
        tot = _mm512_add_ps(tot, acc);
        g0 += gb;
    }
    _mm512_reduce_add_ps(tot) as i32
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !is_x86_feature_detected!("avx512vnni") || !is_x86_feature_detected!("avx512bw") {
        eprintln!("stream_order: needs AVX-512 VNNI");
        return;
    }
    let len = 178usize << 20;
    let mut buf = PageBuf::zeroed(len);
    for (i, x) in buf.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 7 + 3) as u8;
    }
    let b = buf.as_slice();
    let y = [1, 2, 3, 4, 5, 6, 7, 8];
    for _ in 0..2 {
        for (name, f) in [
            ("plain", &(|| unsafe { plain(b) }) as &dyn Fn() -> i32),
            ("dpb1", &|| unsafe { dpb(b, &y, 1) }),
            ("dpb4", &|| unsafe { dpb(b, &y, 4) }),
            // SAFETY (all calls): AVX-512 F/BW/VNNI and F16C are present (checked above).
            ("grouped", &|| unsafe { grouped(b, &y, 20, 640, 0, false) }),
            ("grouped-pf8k", &|| unsafe {
                grouped(b, &y, 20, 640, 8192, false)
            }),
            ("grouped-touch", &|| unsafe { grouped(b, &y, 20, 640, 0, true) }),
            ("grouped-touch-pf8k", &|| unsafe {
                grouped(b, &y, 20, 640, 8192, true)
            }),
        ] {
            let mut best = f64::MAX;
            let mut chk = 0;
            for _ in 0..15 {
                let t = std::time::Instant::now();
                chk ^= f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!("{name}: {:.2} GB/s ({chk})", len as f64 / best / 1e9);
        }
    }
}
