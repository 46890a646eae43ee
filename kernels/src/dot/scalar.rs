//! Portable scalar reference dot products (ggml semantics: integer sums per block,
//! scaled by the product of weight and activation block scales).

use crate::quant::{
    e8m0_to_f32_half, q6_quad, rd_f16, rd_f32, rd_i16, unpack_scales_mins_k4, KVALUES_MXFP4, MXFP4_BYTES,
    Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES, QK, QK_K,
};

/// Q4_0 weights · Q8_0 activations.
pub fn q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x = &w[i * Q4_0_BYTES..(i + 1) * Q4_0_BYTES];
        let y = &a[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = x[2 + j];
            sumi += ((q & 0xf) as i32 - 8) * (y[2 + j] as i8 as i32);
            sumi += ((q >> 4) as i32 - 8) * (y[18 + j] as i8 as i32);
        }
        sum += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sum
}

/// Q5_0 weights · Q8_0 activations.
pub fn q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x = &w[i * Q5_0_BYTES..(i + 1) * Q5_0_BYTES];
        let y = &a[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = x[6 + j];
            let h0 = (((qh >> j) & 1) << 4) as i32;
            let h1 = (((qh >> (j + 16)) & 1) << 4) as i32;
            sumi += (((q & 0xf) as i32 | h0) - 16) * (y[2 + j] as i8 as i32);
            sumi += (((q >> 4) as i32 | h1) - 16) * (y[18 + j] as i8 as i32);
        }
        sum += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sum
}

/// Q8_0 weights · Q8_0 activations.
pub fn q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x = &w[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let y = &a[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += (x[2 + j] as i8 as i32) * (y[2 + j] as i8 as i32);
        }
        sum += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sum
}

/// MXFP4 weights · Q8_0 activations.
pub fn mxfp4_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x = &w[i * MXFP4_BYTES..(i + 1) * MXFP4_BYTES];
        let y = &a[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = x[1 + j];
            sumi += KVALUES_MXFP4[(q & 0xf) as usize] as i32 * (y[2 + j] as i8 as i32);
            sumi += KVALUES_MXFP4[(q >> 4) as usize] as i32 * (y[18 + j] as i8 as i32);
        }
        sum += sumi as f32 * (rd_f16(y, 0) * e8m0_to_f32_half(x[0]));
    }
    sum
}

fn bsum(y: &[u8], j: usize) -> i32 {
    rd_i16(y, 260 + 2 * j) as i32
}

/// Q4_K weights · Q8_K activations.
pub fn q4_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for i in 0..n / QK_K {
        let x = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = rd_f32(y, 0);
        let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
        let qs = &x[16..144];
        let yq = &y[4..260];
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for j in 0..4 {
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                s0 += (q & 0xf) as i32 * (yq[64 * j + l] as i8 as i32);
                s1 += (q >> 4) as i32 * (yq[64 * j + 32 + l] as i8 as i32);
            }
            sumi += sc[2 * j] as i32 * s0 + sc[2 * j + 1] as i32 * s1;
        }
        for (j, &mj) in m.iter().enumerate() {
            summ += mj as i32 * (bsum(y, 2 * j) + bsum(y, 2 * j + 1));
        }
        // ggml-cpu's order (x86 repacked Q4_K): one fused multiply-add per block into each of
        // two accumulators, subtracted at the end.
        acc = (sumi as f32).mul_add(rd_f16(x, 0) * yd, acc);
        accm = (summ as f32).mul_add(rd_f16(x, 2) * yd, accm);
    }
    acc - accm
}

/// Q5_K weights · Q8_K activations.
pub fn q5_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * Q5_K_BYTES..(i + 1) * Q5_K_BYTES];
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yd = rd_f32(y, 0);
        let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
        let qh = &x[16..48];
        let qs = &x[48..176];
        let yq = &y[4..260];
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for j in 0..4 {
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                let h0 = (((qh[l] >> (2 * j)) & 1) << 4) as i32;
                let h1 = (((qh[l] >> (2 * j + 1)) & 1) << 4) as i32;
                s0 += ((q & 0xf) as i32 + h0) * (yq[64 * j + l] as i8 as i32);
                s1 += ((q >> 4) as i32 + h1) * (yq[64 * j + 32 + l] as i8 as i32);
            }
            sumi += sc[2 * j] as i32 * s0 + sc[2 * j + 1] as i32 * s1;
        }
        for (j, &mj) in m.iter().enumerate() {
            summ += mj as i32 * (bsum(y, 2 * j) + bsum(y, 2 * j + 1));
        }
        sum += rd_f16(x, 0) * yd * sumi as f32 - rd_f16(x, 2) * yd * summ as f32;
    }
    sum
}

/// Q6_K weights · Q8_K activations.
pub fn q6_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        let y = &a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let yq = &y[4..260];
        let mut sums = [0i32; 16];
        for n2 in 0..2 {
            let ql = &x[64 * n2..64 * n2 + 64];
            let qh = &x[128 + 32 * n2..128 + 32 * n2 + 32];
            for l in 0..32 {
                let q = q6_quad(ql, qh, l);
                for (k, &qk) in q.iter().enumerate() {
                    let e = 128 * n2 + 32 * k + l;
                    sums[e / 16] += (qk - 32) * (yq[e] as i8 as i32);
                }
            }
        }
        let sumi: i32 = (0..16).map(|is| x[192 + is] as i8 as i32 * sums[is]).sum();
        sum += rd_f16(x, 208) * rd_f32(y, 0) * sumi as f32;
    }
    sum
}

/// F32 weights (raw little-endian bytes) · f32 activations.
///
/// One sequential sum from `-0.0` (as `Iterator::sum`), which [`f32_rows`] repeats per pair.
pub fn f32_f32(w: &[u8], x: &[f32], n: usize) -> f32 {
    let mut s = -0.0f32;
    for (i, &v) in x[..n].iter().enumerate() {
        s += rd_f32(w, 4 * i) * v;
    }
    s
}

/// [`f32_f32`] of `nrows` consecutive F32 weight rows × each of `acts` into
/// `out[r * acts.len() + j]`, bit for bit: tiles of four weight rows × four activation rows
/// read each element once for the sixteen sums, each still one sequential sum from `-0.0`.
// One index walks four weight rows and four activation rows at once.
#[allow(clippy::needless_range_loop)]
pub fn f32_rows(w: &[u8], nrows: usize, n: usize, acts: &[&[f32]], out: &mut [f32]) {
    const T: usize = 4;
    let na = acts.len();
    let rb = 4 * n;
    assert!(
        w.len() >= nrows * rb && out.len() >= nrows * na,
        "rows or output too short"
    );
    for r0 in (0..nrows).step_by(T) {
        let rr = (nrows - r0).min(T);
        for j0 in (0..na).step_by(T) {
            let cc = (na - j0).min(T);
            let mut acc = [[-0.0f32; T]; T];
            for i in 0..n {
                let wv: [f32; T] = std::array::from_fn(|a| rd_f32(w, (r0 + a.min(rr - 1)) * rb + 4 * i));
                for c in 0..cc {
                    let xv = acts[j0 + c][i];
                    for (a, &wa) in wv.iter().enumerate() {
                        acc[a][c] += wa * xv;
                    }
                }
            }
            for (a, row) in acc.iter().enumerate().take(rr) {
                out[(r0 + a) * na + j0..(r0 + a) * na + j0 + cc].copy_from_slice(&row[..cc]);
            }
        }
    }
}

/// F16 weights · f32 activations.
pub fn f16_f32(w: &[u8], x: &[f32], n: usize) -> f32 {
    (0..n).map(|i| rd_f16(w, 2 * i) * x[i]).sum()
}

/// BF16 weights · f32 activations.
pub fn bf16_f32(w: &[u8], x: &[f32], n: usize) -> f32 {
    (0..n)
        .map(|i| crate::quant::bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])) * x[i])
        .sum()
}

/// Plain f32 dot product.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The table of these kernels ([`super::DotTable::scalar`]).
pub(super) fn table() -> super::DotTable {
    super::DotTable {
        name: "scalar",
        q4_0: q4_0_q8_0,
        q5_0: q5_0_q8_0,
        q8_0: q8_0_q8_0,
        mxfp4: mxfp4_q8_0,
        q4_k: q4_k_q8_k,
        q5_k: q5_k_q8_k,
        q6_k: q6_k_q8_k,
        f32: f32_f32,
        f16: f16_f32,
        bf16: bf16_f32,
        dot_f32,
        f32_rows,
        dot4: None,
        dot4_gemv: None,
        tile: None,
        tile_rows: 2,
        rows_many: None,
    }
}
