//! GGML block formats: layouts, scalar dequantizers and reference quantizers.
//!
//! All layouts are little-endian and bit-exact with ggml's `block_*` structs, so a
//! tensor's raw bytes from a GGUF file can be passed straight in.

/// Elements per block of the simple `_0` formats.
pub const QK: usize = 32;
/// Elements per super-block of the K formats.
pub const QK_K: usize = 256;
/// Bytes per Q4_0 block (f16 d + 16 nibble bytes).
pub const Q4_0_BYTES: usize = 18;
/// Bytes per Q5_0 block (f16 d + u32 qh + 16 nibble bytes).
pub const Q5_0_BYTES: usize = 22;
/// Bytes per Q8_0 block (f16 d + 32 i8).
pub const Q8_0_BYTES: usize = 34;
/// Bytes per Q4_K super-block.
pub const Q4_K_BYTES: usize = 144;
/// Bytes per Q5_K super-block.
pub const Q5_K_BYTES: usize = 176;
/// Bytes per Q6_K super-block.
pub const Q6_K_BYTES: usize = 210;
/// Bytes per Q8_K super-block (f32 d + 256 i8 + 16 i16 bsums).
pub const Q8_K_BYTES: usize = 292;
/// Bytes per MXFP4 block (one E8M0 exponent byte + 16 bytes of E2M1 nibbles).
pub const MXFP4_BYTES: usize = 17;

/// The sixteen E2M1 (FP4) code points of the OCP microscaling spec, doubled so they are
/// integers; an MXFP4 block's values are `KVALUES_MXFP4[code] * e8m0_to_f32_half(e)`.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Storage type of a weight tensor, numbered with ggml type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 4-bit, 32-element blocks with one f16 scale.
    Q4_0,
    /// 5-bit, 32-element blocks with one f16 scale.
    Q5_0,
    /// 8-bit, 32-element blocks with one f16 scale.
    Q8_0,
    /// 4-bit K-quant, 256-element super-blocks with 6-bit sub-scales and mins.
    Q4_K,
    /// 5-bit K-quant, 256-element super-blocks with 6-bit sub-scales and mins.
    Q5_K,
    /// 6-bit K-quant, 256-element super-blocks with 8-bit sub-scales.
    Q6_K,
    /// OCP MXFP4: 32-element blocks of E2M1 values sharing one E8M0 power-of-two scale.
    Mxfp4,
}

impl WeightType {
    /// All supported weight types.
    pub const ALL: [WeightType; 10] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q4_0,
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::Mxfp4,
    ];

    /// The ggml type id (as stored in GGUF tensor infos).
    pub fn ggml_id(self) -> u32 {
        match self {
            WeightType::F32 => 0,
            WeightType::F16 => 1,
            WeightType::Q4_0 => 2,
            WeightType::Q5_0 => 6,
            WeightType::Q8_0 => 8,
            WeightType::Q4_K => 12,
            WeightType::Q5_K => 13,
            WeightType::Q6_K => 14,
            WeightType::BF16 => 30,
            WeightType::Mxfp4 => 39,
        }
    }

    /// Maps a ggml type id to a supported weight type.
    pub fn from_ggml_id(id: u32) -> Option<WeightType> {
        WeightType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Human-readable ggml name (e.g. `"Q4_K"`).
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::BF16 => "BF16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q4_K => "Q4_K",
            WeightType::Q5_K => "Q5_K",
            WeightType::Q6_K => "Q6_K",
            WeightType::Mxfp4 => "MXFP4",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => 1,
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::Mxfp4 => QK,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            WeightType::Q4_0 => Q4_0_BYTES,
            WeightType::Q5_0 => Q5_0_BYTES,
            WeightType::Q8_0 => Q8_0_BYTES,
            WeightType::Q4_K => Q4_K_BYTES,
            WeightType::Q5_K => Q5_K_BYTES,
            WeightType::Q6_K => Q6_K_BYTES,
            WeightType::Mxfp4 => MXFP4_BYTES,
        }
    }

    /// Bytes taken by a row of `n` elements (`n` must be a multiple of the block size).
    pub fn row_bytes(self, n: usize) -> usize {
        debug_assert_eq!(n % self.block_size(), 0);
        n / self.block_size() * self.block_bytes()
    }

    /// The activation format this weight type's dot product consumes.
    pub fn act_format(self) -> ActFormat {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => ActFormat::F32,
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::Mxfp4 => ActFormat::Q8_0,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => ActFormat::Q8_K,
        }
    }

    /// Dequantizes one row (`dst.len()` elements) with the scalar reference decoder.
    pub fn dequantize_row(self, src: &[u8], dst: &mut [f32]) {
        match self {
            WeightType::F32 => dequantize_row_f32(src, dst),
            WeightType::F16 => dequantize_row_f16(src, dst),
            WeightType::BF16 => dequantize_row_bf16(src, dst),
            WeightType::Q4_0 => dequantize_row_q4_0(src, dst),
            WeightType::Q5_0 => dequantize_row_q5_0(src, dst),
            WeightType::Q8_0 => dequantize_row_q8_0(src, dst),
            WeightType::Q4_K => dequantize_row_q4_k(src, dst),
            WeightType::Q5_K => dequantize_row_q5_k(src, dst),
            WeightType::Q6_K => dequantize_row_q6_k(src, dst),
            WeightType::Mxfp4 => dequantize_row_mxfp4(src, dst),
        }
    }
}

/// Activation encodings consumed by the dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ActFormat {
    /// Plain f32 (for float weights).
    F32,
    /// Q8_0 blocks (for the `_0` weight types and MXFP4).
    Q8_0,
    /// Q8_K super-blocks (for the K weight types).
    Q8_K,
}

impl ActFormat {
    /// Bytes needed to hold one row of `n` elements in this format.
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            ActFormat::F32 => n * 4,
            ActFormat::Q8_0 => n / QK * Q8_0_BYTES,
            ActFormat::Q8_K => n / QK_K * Q8_K_BYTES,
        }
    }

    /// Elements per block of this format.
    pub fn block_size(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 => QK,
            ActFormat::Q8_K => QK_K,
        }
    }
}

// ---------------------------------------------------------------------------
// f16 / bf16 conversion
// ---------------------------------------------------------------------------

/// Converts IEEE half bits to f32 (exact).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) >> 15) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if mant == 0 {
            sign
        } else {
            // Subnormal: mant * 2^-24, exactly representable in f32.
            let v = mant as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (mant << 13)
    } else {
        sign | ((exp + 112) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

/// Converts f32 to IEEE half bits, rounding to nearest even.
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let hm = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let hm = if rem > half || (rem == half && (hm & 1) == 1) {
            hm + 1
        } else {
            hm
        };
        return sign | hm as u16;
    }
    let hm = mant >> 13;
    let rem = mant & 0x1fff;
    let mut h = ((e as u32) << 10) | hm;
    if rem > 0x1000 || (rem == 0x1000 && (hm & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

/// Converts bfloat16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Converts f32 to bfloat16 bits, rounding to nearest even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if f.is_nan() {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// Half the value of an E8M0 exponent byte, `2^(e - 128)` (exact, subnormal for `e < 2`):
/// the block scale that goes with the doubled code points of [`KVALUES_MXFP4`].
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 {
        // 2^-128 and 2^-127 are subnormal: a single mantissa bit.
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

#[inline]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[inline]
pub(crate) fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
pub(crate) fn rd_i16(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

/// Unpacks the 6-bit (scale, min) pair `j` (0..8) of a Q4_K/Q5_K 12-byte scale array.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Unpacks all eight 6-bit scales and mins of a Q4_K/Q5_K block (word-parallel form of
/// [`scale_min_k4`]).
#[inline]
pub fn unpack_scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let a = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
    let b = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
    let c = u32::from_le_bytes([q[8], q[9], q[10], q[11]]);
    let sc_lo = a & 0x3f3f_3f3f;
    let m_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    sc[..4].copy_from_slice(&sc_lo.to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    m[..4].copy_from_slice(&m_lo.to_le_bytes());
    m[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, m)
}

fn check(src: &[u8], dst: &[f32], bs: usize, bb: usize) -> usize {
    assert_eq!(dst.len() % bs, 0, "row length must be a multiple of {bs}");
    let nb = dst.len() / bs;
    assert!(src.len() >= nb * bb, "source row too short");
    nb
}

// ---------------------------------------------------------------------------
// Dequantizers (scalar reference)
// ---------------------------------------------------------------------------

/// Decodes a row of little-endian f32.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    check(src, dst, 1, 4);
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Decodes a row of f16.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    check(src, dst, 1, 2);
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Decodes a row of bf16.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    let n = check(src, dst, 1, 2);
    for i in 0..n {
        dst[i] = bf16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
    }
}

/// Decodes a row of Q4_0 blocks.
pub fn dequantize_row_q4_0(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK, Q4_0_BYTES);
    for i in 0..nb {
        let b = &src[i * Q4_0_BYTES..(i + 1) * Q4_0_BYTES];
        let d = rd_f16(b, 0);
        let y = &mut dst[i * QK..(i + 1) * QK];
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = ((q & 0xf) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Decodes a row of Q5_0 blocks.
pub fn dequantize_row_q5_0(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK, Q5_0_BYTES);
    for i in 0..nb {
        let b = &src[i * Q5_0_BYTES..(i + 1) * Q5_0_BYTES];
        let d = rd_f16(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let y = &mut dst[i * QK..(i + 1) * QK];
        for j in 0..16 {
            let q = b[6 + j];
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = (((q & 0xf) as u32 | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }
}

/// Decodes a row of Q8_0 blocks.
pub fn dequantize_row_q8_0(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK, Q8_0_BYTES);
    for i in 0..nb {
        let b = &src[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let d = rd_f16(b, 0);
        for j in 0..QK {
            dst[i * QK + j] = b[2 + j] as i8 as f32 * d;
        }
    }
}

/// Decodes a row of MXFP4 blocks (byte 0: E8M0 exponent; byte `1 + j`: value `j` in the low
/// nibble, value `j + 16` in the high nibble).
pub fn dequantize_row_mxfp4(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK, MXFP4_BYTES);
    for i in 0..nb {
        let b = &src[i * MXFP4_BYTES..(i + 1) * MXFP4_BYTES];
        let d = e8m0_to_f32_half(b[0]);
        let y = &mut dst[i * QK..(i + 1) * QK];
        for j in 0..16 {
            let q = b[1 + j];
            y[j] = KVALUES_MXFP4[(q & 0xf) as usize] as f32 * d;
            y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// Decodes a row of Q4_K super-blocks.
pub fn dequantize_row_q4_k(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK_K, Q4_K_BYTES);
    for i in 0..nb {
        let b = &src[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let d = rd_f16(b, 0);
        let dmin = rd_f16(b, 2);
        let scales = &b[4..16];
        let qs = &b[16..144];
        let y = &mut dst[i * QK_K..(i + 1) * QK_K];
        for j in 0..4 {
            let (s1, m1) = scale_min_k4(2 * j, scales);
            let (s2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let q = &qs[32 * j..32 * j + 32];
            for l in 0..32 {
                y[64 * j + l] = d1 * (q[l] & 0xf) as f32 - m1;
                y[64 * j + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Decodes a row of Q5_K super-blocks.
pub fn dequantize_row_q5_k(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK_K, Q5_K_BYTES);
    for i in 0..nb {
        let b = &src[i * Q5_K_BYTES..(i + 1) * Q5_K_BYTES];
        let d = rd_f16(b, 0);
        let dmin = rd_f16(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        let qs = &b[48..176];
        let y = &mut dst[i * QK_K..(i + 1) * QK_K];
        for j in 0..4 {
            let (s1, m1) = scale_min_k4(2 * j, scales);
            let (s2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let q = &qs[32 * j..32 * j + 32];
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[64 * j + l] = d1 * ((q[l] & 0xf) + h1) as f32 - m1;
                y[64 * j + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// Returns the four 6-bit values (each 0..64) of a Q6_K half-block at position `l`.
#[inline]
pub(crate) fn q6_quad(ql: &[u8], qh: &[u8], l: usize) -> [i32; 4] {
    let h = qh[l];
    [
        ((ql[l] & 0xf) | ((h & 3) << 4)) as i32,
        ((ql[l + 32] & 0xf) | (((h >> 2) & 3) << 4)) as i32,
        ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32,
        ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32,
    ]
}

/// Decodes a row of Q6_K super-blocks.
pub fn dequantize_row_q6_k(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK_K, Q6_K_BYTES);
    for i in 0..nb {
        let b = &src[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        let d = rd_f16(b, 208);
        let y = &mut dst[i * QK_K..(i + 1) * QK_K];
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            for l in 0..32 {
                let is = l / 16;
                let q = q6_quad(ql, qh, l);
                for (k, &qk) in q.iter().enumerate() {
                    y[128 * n + 32 * k + l] = d * (sc[is + 2 * k] as i8 as f32) * (qk - 32) as f32;
                }
            }
        }
    }
}

/// Decodes a row of Q8_K super-blocks (used in tests).
pub fn dequantize_row_q8_k(src: &[u8], dst: &mut [f32]) {
    let nb = check(src, dst, QK_K, Q8_K_BYTES);
    for i in 0..nb {
        let b = &src[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let d = rd_f32(b, 0);
        for j in 0..QK_K {
            dst[i * QK_K + j] = d * b[4 + j] as i8 as f32;
        }
    }
}

// ---------------------------------------------------------------------------
// Quantizers (scalar reference, round-to-nearest like ggml's *_ref functions)
// ---------------------------------------------------------------------------

fn qcheck(x: &[f32], bs: usize) -> usize {
    assert_eq!(x.len() % bs, 0, "row length must be a multiple of {bs}");
    x.len() / bs
}

/// Quantizes a row to Q8_0 into `dst` (which must hold `n/32*34` bytes).
pub fn quantize_row_q8_0_into(x: &[f32], dst: &mut [u8]) {
    let nb = qcheck(x, QK);
    assert!(dst.len() >= nb * Q8_0_BYTES);
    for i in 0..nb {
        let xb = &x[i * QK..(i + 1) * QK];
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        // As ggml-cpu (x86): multiplier 127 / amax (not 1 / d), ties to even.
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let b = &mut dst[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK {
            b[2 + j] = (xb[j] * id).round_ties_even() as i8 as u8;
        }
    }
}

/// Quantizes a row to Q8_0 bytes.
pub fn quantize_row_q8_0(x: &[f32]) -> Vec<u8> {
    let mut v = vec![0u8; x.len() / QK * Q8_0_BYTES];
    quantize_row_q8_0_into(x, &mut v);
    v
}

/// Quantizes a row to Q8_K into `dst` (which must hold `n/256*292` bytes).
pub fn quantize_row_q8_k_into(x: &[f32], dst: &mut [u8]) {
    let nb = qcheck(x, QK_K);
    assert!(dst.len() >= nb * Q8_K_BYTES);
    for i in 0..nb {
        let xb = &x[i * QK_K..(i + 1) * QK_K];
        let b = &mut dst[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES];
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for j in 0..QK_K {
            let v = (iscale * xb[j]).round_ties_even() as i32;
            b[4 + j] = v.min(127) as i8 as u8;
        }
        for j in 0..16 {
            let s: i32 = (0..16).map(|l| b[4 + 16 * j + l] as i8 as i32).sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// Quantizes a row to Q8_K bytes.
pub fn quantize_row_q8_k(x: &[f32]) -> Vec<u8> {
    let mut v = vec![0u8; x.len() / QK_K * Q8_K_BYTES];
    quantize_row_q8_k_into(x, &mut v);
    v
}

/// Quantizes a row to Q4_0 bytes (reference quantizer, for test data).
pub fn quantize_row_q4_0(x: &[f32]) -> Vec<u8> {
    let nb = qcheck(x, QK);
    let mut out = vec![0u8; nb * Q4_0_BYTES];
    for i in 0..nb {
        let xb = &x[i * QK..(i + 1) * QK];
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let b = &mut out[i * Q4_0_BYTES..(i + 1) * Q4_0_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..16 {
            let x0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let x1 = ((xb[j + 16] * id + 8.5) as i8).min(15) as u8;
            b[2 + j] = x0 | (x1 << 4);
        }
    }
    out
}

/// Quantizes a row to Q5_0 bytes (reference quantizer, for test data).
pub fn quantize_row_q5_0(x: &[f32]) -> Vec<u8> {
    let nb = qcheck(x, QK);
    let mut out = vec![0u8; nb * Q5_0_BYTES];
    for i in 0..nb {
        let xb = &x[i * QK..(i + 1) * QK];
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let b = &mut out[i * Q5_0_BYTES..(i + 1) * Q5_0_BYTES];
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let mut qh = 0u32;
        for j in 0..16 {
            let x0 = ((xb[j] * id + 16.5) as i8).min(31) as u8;
            let x1 = ((xb[j + 16] * id + 16.5) as i8).min(31) as u8;
            b[6 + j] = (x0 & 0xf) | ((x1 & 0xf) << 4);
            qh |= (((x0 & 0x10) >> 4) as u32) << j;
            qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
    out
}

/// Quantizes a row to MXFP4 bytes (reference quantizer, for test data and fixtures).
///
/// Per block: the exponent is `floor(log2(amax)) - 2 + 127` (so the largest magnitude lands
/// in the top binade of E2M1), then each value takes the code point nearest to it, the lowest
/// code on ties; this is the rounding of ggml's and gguf-py's reference MXFP4 quantizers.
/// Exponents outside `0..=255` (|x| below 2^-125 or infinite) are clamped.
pub fn quantize_row_mxfp4(x: &[f32]) -> Vec<u8> {
    let nb = qcheck(x, QK);
    let mut out = vec![0u8; nb * MXFP4_BYTES];
    for i in 0..nb {
        let xb = &x[i * QK..(i + 1) * QK];
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let nearest = |v: f32| {
            let mut best = 0usize;
            let mut best_err = (KVALUES_MXFP4[0] as f32 * d - v).abs();
            for (k, &kv) in KVALUES_MXFP4.iter().enumerate().skip(1) {
                let err = (kv as f32 * d - v).abs();
                if err < best_err {
                    best = k;
                    best_err = err;
                }
            }
            best as u8
        };
        let b = &mut out[i * MXFP4_BYTES..(i + 1) * MXFP4_BYTES];
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = nearest(xb[j]) | (nearest(xb[j + 16]) << 4);
        }
    }
    out
}

/// Encodes f32 values as a row of f16 bytes.
pub fn quantize_row_f16(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect()
}

/// Encodes f32 values as a row of bf16 bytes.
pub fn quantize_row_bf16(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|&v| f32_to_bf16(v).to_le_bytes()).collect()
}

/// Encodes f32 values as a row of little-endian f32 bytes.
pub fn quantize_row_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_roundtrip_all() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "h={h:#x} f={f}");
            }
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(1e-8), 0);
        // Halfway between 1.0 and next: ties to even (1.0).
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
    }

    #[test]
    fn bf16_basic() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(f32_to_bf16(-2.5)), -2.5);
    }

    #[test]
    fn q8_0_roundtrip() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.0) * 0.1).collect();
        let q = quantize_row_q8_0(&x);
        let mut y = vec![0.0; 64];
        dequantize_row_q8_0(&q, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 0.02, "{a} {b}");
        }
    }

    #[test]
    fn q4_q5_roundtrip() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.3).collect();
        let mut y = vec![0.0; 64];
        dequantize_row_q4_0(&quantize_row_q4_0(&x), &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 0.5, "q4 {a} {b}");
        }
        dequantize_row_q5_0(&quantize_row_q5_0(&x), &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 0.25, "q5 {a} {b}");
        }
    }

    #[test]
    fn q8_k_roundtrip_and_bsums() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 13 % 97) as f32 - 48.0) * 0.05).collect();
        let q = quantize_row_q8_k(&x);
        let mut y = vec![0.0; 512];
        dequantize_row_q8_k(&q, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 0.02, "{a} {b}");
        }
        for blk in 0..2 {
            let b = &q[blk * Q8_K_BYTES..];
            for j in 0..16 {
                let s: i32 = (0..16).map(|l| b[4 + 16 * j + l] as i8 as i32).sum();
                assert_eq!(rd_i16(b, 260 + 2 * j) as i32, s);
            }
        }
    }

    #[test]
    fn scale_unpack_forms_agree() {
        let mut rng = crate::testutil::XorShift::new(12);
        for _ in 0..1000 {
            let q = rng.bytes(12);
            let (sc, m) = unpack_scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min_k4(j, &q));
            }
        }
    }

    #[test]
    fn mxfp4_quantizer_matches_gguf_py() {
        // 128 f32 inputs (bit patterns), made by scripts/gen_tiny_mxfp4.py testvec
        const INPUT_BITS: [u32; 128] = [
            0x00000000, 0x3e800000, 0x3f000000, 0x3f400000, 0x3f800000, 0x3fa00000, 0x3fc00000, 0x3fe00000,
            0x40000000, 0x40200000, 0x40400000, 0x40600000, 0x40800000, 0x40a00000, 0x40c00000, 0xbe800000,
            0xbf400000, 0xbfa00000, 0xbfe00000, 0xc0200000, 0xc0600000, 0xc0a00000, 0xc0c00000, 0x3dcccccd,
            0xbdcccccd, 0x400ccccd, 0xc08ccccd, 0x40bccccd, 0x3f19999a, 0xbf19999a, 0x3f8ccccd, 0xc0400000,
            0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
            0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
            0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
            0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
            0x3c37ebbc, 0x3cab9bc1, 0x3c8b4237, 0xbcd2df93, 0xbc6f8db6, 0xbd258dbf, 0xbd21ebbd, 0x3d4b7ede,
            0x3cbc57bc, 0x3d4d07a9, 0xbc9d054e, 0x3ca18fd5, 0x3d406b70, 0xbc5d23cc, 0xbc866779, 0x3d439cd3,
            0xbd694bb5, 0xbac46253, 0xbad376c2, 0x3ce3879a, 0xbbd7b979, 0xbc5728ed, 0xbd1faebb, 0x3d1db644,
            0x3d466d64, 0x3c2aa855, 0x3d742c91, 0x3d1dd842, 0xbca2460b, 0xbcad81c8, 0x3b461a84, 0x3d4f07be,
            0x419957fd, 0xc31522d1, 0x42609d0b, 0x43194662, 0x4303ea21, 0x421f3410, 0xc294390a, 0xc47a0000,
            0xc25ddd42, 0x412a6380, 0xc2997b74, 0x432f5de2, 0xc2b81754, 0xc042d07b, 0x4351b4bd, 0xc1bccf53,
            0x42f8868b, 0x4258ec5e, 0xc2009a0a, 0xc274d67a, 0xc19d3b46, 0xc1faaea1, 0x423e459b, 0x42db3267,
            0xc2dc3531, 0xc2ea07b0, 0xc163fc43, 0xc2bc5fd9, 0x432e68f7, 0xc31dde8b, 0xc32e9ab9, 0x427a15a7,
        ];
        // gguf-py 0.19.0: gguf.quants.quantize(inputs, MXFP4)
        const EXPECTED: [u8; 68] = [
            127, 144, 160, 177, 193, 210, 226, 243, 3, 4, 68, 229, 117, 22, 150, 39, 208, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 120, 243, 5, 4, 109, 172, 191, 239, 103, 117, 55, 124, 101, 215,
            219, 28, 119, 134, 32, 26, 145, 146, 2, 1, 25, 47, 169, 160, 9, 147, 57, 160, 179, 16,
        ];
        let x: Vec<f32> = INPUT_BITS.iter().map(|&b| f32::from_bits(b)).collect();
        assert_eq!(quantize_row_mxfp4(&x), EXPECTED);
    }

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let want = 2f64.powi(e as i32 - 128);
            assert_eq!(e8m0_to_f32_half(e) as f64, want, "e={e}");
        }
    }

    #[test]
    fn mxfp4_roundtrip_and_layout() {
        // One block: value j in the low nibble of byte 1 + j, value j + 16 in the high nibble.
        let mut b = [0u8; MXFP4_BYTES];
        b[0] = 127; // e8m0_to_f32_half(127) = 1/2: values are KVALUES_MXFP4 / 2
        b[1] = 0x7f; // value 0: code 15 (-6), value 16: code 7 (6)
        b[16] = 0x91; // value 15: code 1 (0.5), value 31: code 9 (-0.5)
        let mut y = [0.0f32; 32];
        dequantize_row_mxfp4(&b, &mut y);
        assert_eq!((y[0], y[16], y[15], y[31], y[1]), (-6.0, 6.0, 0.5, -0.5, 0.0));
        assert_eq!(quantize_row_mxfp4(&y), b.to_vec());
        // Random rows: every value within half a step of the block's grid (steps up to 2 units of
        // the scale at the top binade; amax maps into [4, 8) units, so error <= amax / 4).
        let mut rng = crate::testutil::XorShift::new(31);
        let x: Vec<f32> = (0..256)
            .map(|i| rng.range(-1.0, 1.0) * (1 + i / 32) as f32)
            .collect();
        let q = quantize_row_mxfp4(&x);
        let mut y = vec![0.0; 256];
        WeightType::Mxfp4.dequantize_row(&q, &mut y);
        for (blk, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= amax / 4.0, "block {blk}: {a} -> {b}");
            }
        }
        assert_eq!(WeightType::Mxfp4.row_bytes(64), 34);
        assert_eq!(WeightType::from_ggml_id(39), Some(WeightType::Mxfp4));
    }

    #[test]
    fn type_ids() {
        for t in WeightType::ALL {
            assert_eq!(WeightType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(WeightType::Q6_K.row_bytes(512), 420);
    }
}
