//! Deterministic random data for tests and benchmarks (xorshift64*, no dependencies).

use crate::quant::{self, WeightType};

/// A tiny xorshift64* pseudo-random generator.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// Creates a generator from a seed (zero is remapped).
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform f32 in `[0, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform f32 in `[lo, hi)`.
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.f32()
    }

    /// A vector of `n` uniform values in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.range(-1.0, 1.0)).collect()
    }

    /// Random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// A random weight row of `n` elements in `wtype` (random bits with sane block scales).
pub fn random_row(rng: &mut XorShift, wtype: WeightType, n: usize) -> Vec<u8> {
    let f16 = |v: f32| quant::f32_to_f16(v).to_le_bytes();
    match wtype {
        WeightType::F32 => quant::quantize_row_f32(&rng.vec(n)),
        WeightType::F16 => quant::quantize_row_f16(&rng.vec(n)),
        WeightType::BF16 => quant::quantize_row_bf16(&rng.vec(n)),
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => {
            let mut b = rng.bytes(wtype.row_bytes(n));
            for blk in b.chunks_exact_mut(wtype.block_bytes()) {
                blk[0..2].copy_from_slice(&f16(rng.range(0.001, 0.02)));
            }
            b
        }
        WeightType::Q4_K | WeightType::Q5_K => {
            let mut b = rng.bytes(wtype.row_bytes(n));
            for blk in b.chunks_exact_mut(wtype.block_bytes()) {
                blk[0..2].copy_from_slice(&f16(rng.range(0.0005, 0.003)));
                blk[2..4].copy_from_slice(&f16(rng.range(0.0005, 0.003)));
            }
            b
        }
        WeightType::Mxfp4 => {
            // Random codes; exponents around 2^-6..2^-4 (values up to about 0.1).
            let mut b = rng.bytes(wtype.row_bytes(n));
            for blk in b.chunks_exact_mut(wtype.block_bytes()) {
                blk[0] = 121 + (rng.next_u64() % 3) as u8;
            }
            b
        }
        WeightType::Q6_K => {
            let mut b = rng.bytes(wtype.row_bytes(n));
            for blk in b.chunks_exact_mut(wtype.block_bytes()) {
                blk[208..210].copy_from_slice(&f16(rng.range(0.0001, 0.001)));
            }
            b
        }
    }
}
