//! MXFP4 expert weights from HF safetensors checkpoints (gpt-oss), repacked into GGUF's MXFP4 row
//! layout so the experts run through the MXFP4 · Q8_0 dot products without ever being
//! dequantised.
//!
//! HF stores a stacked expert tensor `W` (`[E, out, in]`) as two `U8` tensors:
//! - `*_blocks`, shape `[E, out, in/32, 16]`: 32 E2M1 codes per block, two per byte, value `2j`
//!   of the block in the low nibble of byte `j` and value `2j + 1` in the high nibble;
//! - `*_scales`, shape `[E, out, in/32]`: the block's E8M0 exponent (value `2^(s - 127)`).
//!
//! GGUF's MXFP4 block (`WeightType::Mxfp4`, 17 bytes) is the exponent byte followed by 16 code
//! bytes holding value `j` in the low nibble of byte `j` and value `j + 16` in the high nibble.
//! The codes index the same E2M1 table on both sides, so repacking only moves nibbles, and the
//! repacked tensor takes 17/16 of the packed HF bytes.
//!
//! gpt-oss's `gate_up_proj` interleaves its two halves along the output rows (gate on even rows,
//! up on odd rows); [`gate_up_experts_from_hf`] splits them.

use crate::weights::{ByteSource, Matrix, Weights};
use berth_kernels::quant::{WeightType, MXFP4_BYTES, QK};
use berth_plugin_api::PluginError;
use std::sync::Arc;

/// Bytes of one HF MXFP4 block (32 codes, two per byte).
pub const HF_BLOCK_BYTES: usize = 16;

/// The dimensions `[experts, rows, blocks per row]` of an HF `*_blocks` tensor, checked against
/// the byte counts of the blocks and scales.
fn dims(blocks: &[u8], scales: &[u8], shape_blocks: &[usize]) -> Result<[usize; 3], PluginError> {
    let &[e, rows, g, b] = shape_blocks else {
        return Err(PluginError::failed(format!(
            "MXFP4 blocks: expected shape [experts, rows, blocks, 16], got {shape_blocks:?}"
        )));
    };
    if b != HF_BLOCK_BYTES {
        return Err(PluginError::failed(format!(
            "MXFP4 blocks: the last dimension is {b}, expected {HF_BLOCK_BYTES}"
        )));
    }
    let n_blocks = e * rows * g;
    if blocks.len() != n_blocks * HF_BLOCK_BYTES {
        return Err(PluginError::failed(format!(
            "MXFP4 blocks: {} bytes for shape {shape_blocks:?}",
            blocks.len()
        )));
    }
    if scales.len() != n_blocks {
        return Err(PluginError::failed(format!(
            "MXFP4 scales: {} bytes, expected {n_blocks} for blocks of shape {shape_blocks:?}",
            scales.len()
        )));
    }
    Ok([e, rows, g])
}

/// One HF block (16 code bytes, pairs of neighbouring values per byte) and its scale as a GGUF
/// MXFP4 block (scale byte, then values `j` and `j + 16` in byte `1 + j`).
pub fn repack_block(codes: &[u8], scale: u8) -> [u8; MXFP4_BYTES] {
    assert_eq!(codes.len(), HF_BLOCK_BYTES, "an HF MXFP4 block has 16 bytes");
    let code = |i: usize| (codes[i / 2] >> (4 * (i % 2))) & 0xf;
    let mut out = [0u8; MXFP4_BYTES];
    out[0] = scale;
    for j in 0..16 {
        out[1 + j] = code(j) | (code(j + 16) << 4);
    }
    out
}

/// Repacks rows `first, first + step, first + 2·step, ...` of every expert into GGUF MXFP4 rows
/// (all experts back to back) and returns one matrix per expert over the shared bytes.
fn repack_rows(
    blocks: &[u8],
    scales: &[u8],
    [e, rows, g]: [usize; 3],
    first: usize,
    step: usize,
) -> Result<Vec<Matrix>, PluginError> {
    let out_rows = (rows - first).div_ceil(step);
    let row_bytes = g * MXFP4_BYTES;
    let mut bytes = Vec::with_capacity(e * out_rows * row_bytes);
    for x in 0..e {
        for r in (first..rows).step_by(step) {
            let b0 = (x * rows + r) * g;
            for b in b0..b0 + g {
                bytes.extend_from_slice(&repack_block(
                    &blocks[b * HF_BLOCK_BYTES..(b + 1) * HF_BLOCK_BYTES],
                    scales[b],
                ));
            }
        }
    }
    let source: Arc<dyn ByteSource> = Arc::new(bytes);
    (0..e)
        .map(|x| {
            Matrix::new(
                source.clone(),
                x * out_rows * row_bytes,
                WeightType::Mxfp4,
                out_rows,
                g * QK,
            )
        })
        .collect()
}

/// Converts an HF MXFP4 expert tensor (`blocks`: `[E, out, in/32, 16]`, `scales`:
/// `[E, out, in/32]`, both `U8`) into one `out × in` MXFP4 [`Matrix`] per expert, rows in file
/// order.
pub fn experts_from_hf(
    blocks: &[u8],
    scales: &[u8],
    shape_blocks: &[usize],
) -> Result<Vec<Matrix>, PluginError> {
    let d = dims(blocks, scales, shape_blocks)?;
    repack_rows(blocks, scales, d, 0, 1)
}

/// Converts gpt-oss's fused `gate_up_proj` MXFP4 tensor (`[E, 2·I, in/32, 16]`, gate on even
/// rows, up on odd rows) into `(gate, up)`: one `I × in` MXFP4 [`Matrix`] per expert each.
pub fn gate_up_experts_from_hf(
    blocks: &[u8],
    scales: &[u8],
    shape_blocks: &[usize],
) -> Result<(Vec<Matrix>, Vec<Matrix>), PluginError> {
    let d = dims(blocks, scales, shape_blocks)?;
    if d[1] % 2 != 0 {
        return Err(PluginError::failed(format!(
            "MXFP4 gate_up blocks: {} rows do not split into gate and up halves",
            d[1]
        )));
    }
    Ok((
        repack_rows(blocks, scales, d, 0, 2)?,
        repack_rows(blocks, scales, d, 1, 2)?,
    ))
}

/// Reads `{prefix}_blocks` and `{prefix}_scales` from safetensors `weights` (e.g. prefix
/// `model.layers.0.mlp.experts.down_proj`) and converts them with [`experts_from_hf`].
pub fn hf_experts(weights: &Weights, prefix: &str) -> Result<Vec<Matrix>, PluginError> {
    let (shape, blocks) = weights.bytes_named(&format!("{prefix}_blocks"))?;
    let (_, scales) = weights.bytes_named(&format!("{prefix}_scales"))?;
    experts_from_hf(&blocks, &scales, &shape)
        .map_err(|e| PluginError::failed(format!("{prefix}: {}", e.message)))
}

/// Reads `{prefix}_blocks` and `{prefix}_scales` of a fused gate/up tensor (e.g. prefix
/// `model.layers.0.mlp.experts.gate_up_proj`) and splits them with [`gate_up_experts_from_hf`].
pub fn hf_gate_up_experts(
    weights: &Weights,
    prefix: &str,
) -> Result<(Vec<Matrix>, Vec<Matrix>), PluginError> {
    let (shape, blocks) = weights.bytes_named(&format!("{prefix}_blocks"))?;
    let (_, scales) = weights.bytes_named(&format!("{prefix}_scales"))?;
    gate_up_experts_from_hf(&blocks, &scales, &shape)
        .map_err(|e| PluginError::failed(format!("{prefix}: {}", e.message)))
}

/// Whether safetensors `weights` hold the MXFP4 pair `{prefix}_blocks` / `{prefix}_scales`.
pub fn has_hf_mxfp4(weights: &Weights, prefix: &str) -> bool {
    weights.has_named(&format!("{prefix}_blocks")) && weights.has_named(&format!("{prefix}_scales"))
}

/// The value of a 4-bit E2M1 code (sign bit, two exponent bits with bias 1, one mantissa bit),
/// decoded from its bit fields.
pub fn e2m1_value(code: u8) -> f32 {
    let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
    let (exp, mant) = ((code >> 1) & 3, (code & 1) as f32);
    let mag = if exp == 0 {
        0.5 * mant
    } else {
        (1.0 + 0.5 * mant) * (1u32 << (exp - 1)) as f32
    };
    sign * mag
}

/// Dequantises an HF MXFP4 tensor straight from its own layout (each value: its E2M1 code's value
/// times `2^(scale - 127)`) into `[E, out, in]` row-major f32; a reference for tests, which the
/// engine never needs.
pub fn dequantize_hf(blocks: &[u8], scales: &[u8], shape_blocks: &[usize]) -> Result<Vec<f32>, PluginError> {
    dims(blocks, scales, shape_blocks)?;
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for (codes, &s) in blocks.chunks_exact(HF_BLOCK_BYTES).zip(scales) {
        let scale = 2f64.powi(s as i32 - 127);
        for &byte in codes {
            for code in [byte & 0xf, byte >> 4] {
                out.push((e2m1_value(code) as f64 * scale) as f32);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_kernels::quant::{quantize_row_mxfp4, KVALUES_MXFP4};
    use berth_kernels::testutil::XorShift;

    /// Random HF tensors: every code, and exponents from the subnormal ends to large values.
    fn random_hf(rng: &mut XorShift, e: usize, rows: usize, g: usize) -> (Vec<u8>, Vec<u8>) {
        let blocks = rng.bytes(e * rows * g * HF_BLOCK_BYTES);
        let mut scales = rng.bytes(e * rows * g);
        scales[0] = 0;
        scales[1] = 1;
        scales[2] = 254;
        (blocks, scales)
    }

    #[test]
    fn e2m1_codes_are_the_doubled_kvalues_halved() {
        for c in 0..16u8 {
            assert_eq!(e2m1_value(c) * 2.0, KVALUES_MXFP4[c as usize] as f32, "code {c}");
        }
    }

    #[test]
    fn repacked_experts_dequantise_to_the_hf_values() {
        let mut rng = XorShift::new(7);
        let (e, rows, g) = (3, 5, 4);
        let (blocks, scales) = random_hf(&mut rng, e, rows, g);
        let shape = [e, rows, g, 16];
        let want = dequantize_hf(&blocks, &scales, &shape).unwrap();
        let experts = experts_from_hf(&blocks, &scales, &shape).unwrap();
        assert_eq!(experts.len(), e);
        let cols = g * 32;
        let mut row = vec![0.0; cols];
        for (x, m) in experts.iter().enumerate() {
            assert_eq!((m.wtype, m.rows, m.cols), (WeightType::Mxfp4, rows, cols));
            for r in 0..rows {
                m.dequantize_row(r, &mut row);
                let off = (x * rows + r) * cols;
                for (c, (&a, &b)) in row.iter().zip(&want[off..off + cols]).enumerate() {
                    // Exact (code 8 is -0.0 in E2M1 and +0.0 in ggml's table; they compare equal).
                    assert!(a == b, "expert {x} row {r} col {c}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn gate_up_splits_even_and_odd_rows() {
        let mut rng = XorShift::new(8);
        let (e, rows, g) = (2, 6, 2);
        let (blocks, scales) = random_hf(&mut rng, e, rows, g);
        let shape = [e, rows, g, 16];
        let all = experts_from_hf(&blocks, &scales, &shape).unwrap();
        let (gate, up) = gate_up_experts_from_hf(&blocks, &scales, &shape).unwrap();
        for x in 0..e {
            assert_eq!((gate[x].rows, up[x].rows), (rows / 2, rows / 2));
            for i in 0..rows / 2 {
                assert_eq!(gate[x].row(i), all[x].row(2 * i));
                assert_eq!(up[x].row(i), all[x].row(2 * i + 1));
            }
        }
    }

    #[test]
    fn repacking_inverts_the_hf_packing_of_quantised_rows() {
        // Quantise a row with the GGUF reference quantiser, pack it the HF way, repack it back.
        let mut rng = XorShift::new(9);
        let x = rng.vec(64);
        let gguf = quantize_row_mxfp4(&x);
        let mut blocks = Vec::new();
        let mut scales = Vec::new();
        for b in gguf.chunks_exact(MXFP4_BYTES) {
            let code = |i: usize| {
                if i < 16 {
                    b[1 + i] & 0xf
                } else {
                    b[1 + i - 16] >> 4
                }
            };
            scales.push(b[0]);
            blocks.extend((0..16).map(|j| code(2 * j) | (code(2 * j + 1) << 4)));
        }
        let m = experts_from_hf(&blocks, &scales, &[1, 1, 2, 16]).unwrap();
        assert_eq!(m[0].row(0), gguf.as_slice());
    }

    #[test]
    fn repacked_experts_multiply_through_the_threaded_matmul() {
        use crate::linear::{matmul, MatmulScratch};
        let mut rng = XorShift::new(10);
        let (e, rows, g, n) = (2, 40, 3, 5);
        let blocks = rng.bytes(e * rows * g * HF_BLOCK_BYTES);
        // Scales near 2^-4: values up to 0.375.
        let scales: Vec<u8> = (0..e * rows * g).map(|i| 121 + (i % 3) as u8).collect();
        let shape = [e, rows, g, 16];
        let deq = dequantize_hf(&blocks, &scales, &shape).unwrap();
        let cols = g * 32;
        let x = rng.vec(n * cols);
        for (i, m) in experts_from_hf(&blocks, &scales, &shape)
            .unwrap()
            .iter()
            .enumerate()
        {
            let f = Matrix::from_f32(rows, cols, &deq[i * rows * cols..(i + 1) * rows * cols]);
            let (mut got, mut want) = (vec![0.0; n * rows], vec![0.0; n * rows]);
            for threads in [1, 2] {
                matmul(m, &x, n, &mut got, &mut MatmulScratch::new(), threads);
                matmul(&f, &x, n, &mut want, &mut MatmulScratch::new(), threads);
                for b in 0..n {
                    for r in 0..rows {
                        let w = &deq[(i * rows + r) * cols..(i * rows + r + 1) * cols];
                        // Q8_0 activations: each moves by at most amax/254 of its block (amax < 1).
                        let tol = w.iter().map(|v| v.abs()).sum::<f32>() / 254.0 + 1e-5;
                        let (a, b) = (got[b * rows + r], want[b * rows + r]);
                        assert!((a - b).abs() <= tol, "expert {i} row {r}: {a} vs {b} (tol {tol})");
                    }
                }
                assert_ne!(got, want, "the MXFP4 product should see Q8_0-rounded activations");
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let blocks = vec![0u8; 64];
        let scales = vec![0u8; 4];
        assert!(experts_from_hf(&blocks, &scales, &[1, 2, 2, 16]).is_ok());
        assert!(experts_from_hf(&blocks, &scales, &[1, 2, 2, 8]).is_err());
        assert!(experts_from_hf(&blocks, &scales[..3], &[1, 2, 2, 16]).is_err());
        assert!(experts_from_hf(&blocks[..48], &scales, &[1, 2, 2, 16]).is_err());
        assert!(experts_from_hf(&blocks, &scales, &[4, 16]).is_err());
        assert!(gate_up_experts_from_hf(&blocks[..48], &scales[..3], &[1, 3, 1, 16]).is_err());
    }
}
