//! Emulation of ggml-cpu's (llama.cpp's) float arithmetic where it is observable: attention over
//! an F16 KV cache (f16 operands, f32 sums in the lane order of its x86 AVX2 kernels) and its
//! softmax (a polynomial `exp`, sums of eight in f32, then f64).
//!
//! Greedy decoding of a quantized model flips at near-ties: the activations are quantized to 8
//! bits before every matmul, so a difference of one unit in the last place upstream can move an
//! activation across a rounding boundary and change logits by ~1e-3. Following llama.cpp token for
//! token needs the same roundings, not just the same maths. What is emulated was read off
//! ggml-cpu's x86 code paths (AVX2 + FMA + F16C, no AVX-512), the ones llama.cpp takes on the
//! machines Berth is compared on.

/// The order in which ggml-cpu sums the products of an f16 dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16DotOrder {
    /// llamafile's tinyBLAS (matmuls over two or more rows, i.e. prompt batches): one 8-lane f32
    /// accumulator, lane `i % 8`, then a horizontal sum `(h0 + h2) + (h1 + h3)` of
    /// `h[l] = x[l] + x[l + 4]`.
    Gemm,
    /// `ggml_vec_dot_f16` (single-row matmuls, i.e. one token): four 8-lane accumulators over
    /// steps of 32, accumulator `(i / 8) % 4`, reduced as `(x0 + x2) + (x1 + x3)`, then
    /// `h[l] = x[l] + x[l + 4]` and `(h0 + h1) + (h2 + h3)`; elements past the last whole step of
    /// 32 are added in f64.
    VecDot,
}

impl F16DotOrder {
    /// The order of a matmul whose other operand has `rows` rows (tokens in the batch).
    pub fn for_rows(rows: usize) -> F16DotOrder {
        if rows >= 2 {
            F16DotOrder::Gemm
        } else {
            F16DotOrder::VecDot
        }
    }

    /// Accumulator slot (0..32) of element `i`.
    #[inline]
    pub fn slot(self, i: usize) -> usize {
        match self {
            F16DotOrder::Gemm => i % 8,
            F16DotOrder::VecDot => (i / 8) % 4 * 8 + i % 8,
        }
    }

    /// Sums the 32 slots (only the first 8 are used by [`F16DotOrder::Gemm`]) and `tail` (the
    /// f64 sum of elements past the vectorised part, [`F16DotOrder::VecDot`] only).
    #[inline]
    pub fn reduce(self, x: &[f32; 32], tail: f64) -> f32 {
        match self {
            F16DotOrder::Gemm => hsum8(&x[..8]),
            F16DotOrder::VecDot => {
                let mut z = [0.0f32; 8];
                for l in 0..8 {
                    z[l] = (x[l] + x[16 + l]) + (x[8 + l] + x[24 + l]);
                }
                let t: [f32; 4] = std::array::from_fn(|l| z[l] + z[l + 4]);
                (((t[0] + t[1]) + (t[2] + t[3])) as f64 + tail) as f32
            }
        }
    }

    /// Number of leading elements (of `n`) that go through the vector lanes.
    #[inline]
    pub fn vector_len(self, n: usize) -> usize {
        match self {
            F16DotOrder::Gemm => n,
            F16DotOrder::VecDot => n - n % 32,
        }
    }
}

/// Horizontal sum of 8 lanes as AVX code does it: `h[l] = x[l] + x[l + 4]`, then
/// `(h0 + h2) + (h1 + h3)`.
#[inline]
pub fn hsum8(x: &[f32]) -> f32 {
    let h: [f32; 4] = std::array::from_fn(|l| x[l + 4] + x[l]);
    (h[0] + h[2]) + (h[1] + h[3])
}

/// Dot product of two vectors of f16 values (held as f32) in ggml's order. Products of two f16
/// values are exact in f32, so fused and unfused multiply-adds agree.
pub fn dot_f16(order: F16DotOrder, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let nv = order.vector_len(n);
    let mut acc = [0.0f32; 32];
    for i in 0..nv {
        acc[order.slot(i)] += a[i] * b[i];
    }
    let tail: f64 = (nv..n).map(|i| (a[i] * b[i]) as f64).sum();
    order.reduce(&acc, tail)
}

#[inline]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// ggml-cpu's vectorised `expf` (AVX2 + FMA `ggml_v_expf`), one lane: a range reduction to
/// `2^n · e^b` and a degree-5 polynomial, with its own rounding (not libm's `expf`).
pub fn ggml_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 1.5 · 2^23
    let z = fma(x, f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = fma(
        -n,
        f32::from_bits(0x35bf_be8e),
        fma(-n, f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = fma(
        fma(
            fma(f32::from_bits(0x3c07_2010), b, f32::from_bits(0x3d2b_9f17)),
            u,
            fma(f32::from_bits(0x3e2a_af33), b, f32::from_bits(0x3eff_fedb)),
        ),
        u,
        f32::from_bits(0x3f7f_fff6) * b,
    );
    if n.abs() > 126.0 {
        return exp_far(n, e, j);
    }
    fma(j, k, k)
}

/// [`ggml_expf`] when `2^n` leaves the normal range: scaled in two steps, or 0 / infinity.
fn exp_far(n: f32, e: u32, j: f32) -> f32 {
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fma(s2, j, s2) * s1
    }
}

/// ggml-cpu's softmax of one row of scores (`ggml_compute_forward_soft_max_f32` with scale 1 and
/// no mask, scores already scaled): `ggml_expf(s - max)`, the exponentials summed in groups of 8
/// consecutive KV cells (`first_cell` is the cell of `x[0]`; masked cells count as 0) with
/// [`hsum8`], the groups in f64, then a multiply by `(f32)(1 / sum)`.
pub fn softmax_ggml(x: &mut [f32], first_cell: usize) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = ggml_expf(*v - max);
    }
    let mut sum = 0.0f64;
    let mut lanes = [0.0f32; 8];
    let mut group = first_cell / 8;
    for (i, &v) in x.iter().enumerate() {
        let cell = first_cell + i;
        if cell / 8 != group {
            sum += hsum8(&lanes) as f64;
            lanes = [0.0; 8];
            group = cell / 8;
        }
        lanes[cell % 8] = v;
    }
    sum += hsum8(&lanes) as f64;
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_expf_is_close_to_exp() {
        for i in -2000..=800 {
            let x = i as f32 * 0.1 + 0.0123;
            let (a, b) = (ggml_expf(x), x.exp());
            assert!(
                (a - b).abs() <= 4e-7 * b.abs() + f32::MIN_POSITIVE,
                "{x}: {a} vs {b}"
            );
        }
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_expf(0.0), 1.0);
    }

    #[test]
    fn f16_dots_sum_everything() {
        let a: Vec<f32> = (0..80).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..80).map(|i| (i % 5) as f32 * 0.5).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        for order in [F16DotOrder::Gemm, F16DotOrder::VecDot] {
            assert_eq!(dot_f16(order, &a, &b), want);
        }
    }

    #[test]
    fn ggml_softmax_sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, -1.0, 0.5, 7.0, 2.0, 2.0, 1.0, 0.0];
        softmax_ggml(&mut x, 3);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6 && x[5] > x[2]);
    }
}
