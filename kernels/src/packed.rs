//! Weights repacked at first use into 16-row interleaved blocks, and their matrix product.
//!
//! A [`PackedMatrix`] holds a Q4_0, Q5_0 or Q8_0 matrix as groups of 16 rows. Per group and
//! block of 32 columns it stores the 16 rows' scales (f16, side by side) and their quants as
//! unsigned bytes interleaved four columns at a time, so one 64-byte load feeds 16 rows and
//! one `vpdpbusd` against four broadcast activation bytes advances all 16 of them. The weight
//! offset (8, 16 or 128) is taken back once per block with the activation block's sum, which
//! the activations carry ([`PackedActs`]). Each output is then
//! `acc = fma(dx · dy, Σ w · y, acc)` over the blocks in order, with the block's whole integer
//! sum: [`reference_dot`] is that order in scalar code, and every kernel here equals it bit for
//! bit, for any number of activation rows, so a sequence's results never depend on what it is
//! batched with.
//!
//! Q4_K and Q6_K (256-value super-blocks against Q8_K activations) keep the order of their
//! single-row kernels instead, so a packed product equals the unpacked one bit for bit: Q4_K's
//! whole per-super-block sums in two fused multiply-adds, Q6_K's eight i32 lanes each with its
//! own fused multiply-add and the lanes summed at the end ([`reference_dot_q6_k`]).
//!
//! Two kernel sets run this layout, chosen at run time (and capped by `BERTH_KERNELS`):
//! AVX-512 F/BW/VL + VNNI and AVX2 + FMA + F16C, both for every kind, AVX2 with each 64-byte
//! line taken as two halves of 8 rows, `vpmaddubsw` + `vpmaddwd` standing in for
//! `vpdpbusd`. Both give the same bits. Without AVX2 (or under `BERTH_KERNELS=scalar`)
//! [`PackedMatrix::pack`] returns None and the unpacked tables stay the path.
//!
//! From a few activation rows on, a Q4_0/Q5_0 group is unpacked once per product to bytes in
//! Q8_0's layout (the same integer sums), and the next group is prefetched while it computes.

use crate::dot::QuantizedActivations;
use crate::pool::ThreadPool;
use crate::quant::{
    f16_to_f32, q6_quad, rd_f32, unpack_scales_mins_k4, ActFormat, WeightType, Q4_0_BYTES, Q4_K_BYTES,
    Q5_0_BYTES, Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES, QK, QK_K,
};

/// Rows per interleaved group.
pub const PACK_ROWS: usize = 16;

/// One 64-byte line (the storage unit, so groups start on cache lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Zeroed storage for `groups` groups of `group_bytes` (a multiple of 64), each filled by
/// `fill(group, bytes)`, the groups split over the machine's cores.
fn fill_groups(groups: usize, group_bytes: usize, fill: impl Fn(usize, &mut [u8]) + Sync) -> Vec<Line> {
    let mut data = vec![Line([0; 64]); groups * group_bytes / 64];
    // SAFETY: `Line` is 64 plain bytes; the slice covers exactly the vector's storage.
    let bytes: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, data.len() * 64) };
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(groups);
    let per = groups.div_ceil(workers.max(1));
    std::thread::scope(|scope| {
        for (c, chunk) in bytes.chunks_mut(per * group_bytes).enumerate() {
            let fill = &fill;
            scope.spawn(move || {
                for (i, dst) in chunk.chunks_mut(group_bytes).enumerate() {
                    fill(c * per + i, dst);
                }
            });
        }
    });
    data
}

/// Weight kinds the packed layout covers, as const parameters of the kernels.
const Q4: u8 = 4;
/// Q5_0 (see [`Q4`]).
const Q5: u8 = 5;
/// Q8_0 (see [`Q4`]).
const Q8: u8 = 8;
/// Q4_K (see [`Q4`]): 256-value super-blocks against Q8_K activations.
const K4: u8 = 44;

/// Q6_K (see [`Q4`]): 256-value super-blocks against Q8_K activations.
const K6: u8 = 46;

/// The AVX2 kernels' name for an unpacked Q4_0/Q5_0 group: unsigned bytes in Q8_0's layout,
/// offset by the original kind's (see [`matmul_packed`]). Never a stored kind.
const U8: u8 = 80;

/// Activation rows per AVX2 kernel call (sixteen YMM registers).
const AVX2_BATCH: usize = 4;

/// Bytes of one Q4_K super-block for 16 rows: a line of `d` and `dmin` (f16), four lines of
/// sub-block scales and mins (u8, `[sub-block][row]`), 32 lines of nibbles.
const K4_BYTES: usize = 64 + 256 + 2048;

/// Bytes of one Q6_K super-block for 16 rows: a line of `d` (f16), four lines of scales (i8,
/// `[pair p][row][2]`: sub-blocks `2 p` and `2 p + 1` side by side), 48 lines of quants (the
/// GGUF block's 210 bytes a row become 212).
///
/// The quants are unsigned (0..63), in 64 vectors of 16 rows × 4 columns (byte `4 row + e`):
/// vector `(l, j)` holds columns `32 j + 4 l + e`, the columns that the single-row kernel sums
/// in its i32 lane `l`. Vectors `(l, 4 h .. 4 h + 4)` share three lines (`6 l + 3 h + m`,
/// m < 3): line `m` is vector `4 h + m` in the low six bits and bits `2 m, 2 m + 1` of vector
/// `4 h + 3` in the top two. (Whole bytes, 64 lines, measured no faster even in cache.)
const K6_BYTES: usize = 64 + 256 + 3072;

/// The kind constant of `wtype`, if packed matrices cover it.
fn kind(wtype: WeightType) -> Option<u8> {
    match wtype {
        WeightType::Q4_0 => Some(Q4),
        WeightType::Q5_0 => Some(Q5),
        WeightType::Q8_0 => Some(Q8),
        WeightType::Q4_K => Some(K4),
        WeightType::Q6_K => Some(K6),
        _ => None,
    }
}

/// Bytes of one block's quants for 16 rows: Q8_0 8 lines, Q4_0 4 lines of nibbles, Q5_0 those
/// and a line of fifth bits.
const fn quant_bytes(k: u8) -> usize {
    match k {
        Q4 => 256,
        Q5 => 320,
        _ => 512,
    }
}

/// What the stored unsigned value exceeds the weight by.
const fn offset(k: u8) -> i32 {
    match k {
        Q4 => 8,
        Q5 => 16,
        _ => 128,
    }
}

/// A quantized matrix repacked into 16-row interleaved groups (see the module docs).
pub struct PackedMatrix {
    wtype: WeightType,
    rows: usize,
    k: usize,
    /// Bytes per group: the scales (`nb · 32`, rounded up to a line), then the quants.
    group_bytes: usize,
    data: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix({} {}x{})", self.wtype.name(), self.rows, self.k)
    }
}

/// The signed weights (and f16 scale bits) of block `b` of a GGUF row of kind `kd`.
fn block_values(kd: u8, row: &[u8], b: usize) -> (u16, [i8; QK]) {
    let mut v = [0i8; QK];
    let (bytes, x) = match kd {
        Q4 => (Q4_0_BYTES, &row[b * Q4_0_BYTES..]),
        Q5 => (Q5_0_BYTES, &row[b * Q5_0_BYTES..]),
        _ => (Q8_0_BYTES, &row[b * Q8_0_BYTES..]),
    };
    let x = &x[..bytes];
    let d = u16::from_le_bytes([x[0], x[1]]);
    match kd {
        Q4 => {
            for j in 0..16 {
                v[j] = (x[2 + j] & 0xf) as i8 - 8;
                v[j + 16] = (x[2 + j] >> 4) as i8 - 8;
            }
        }
        Q5 => {
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            for j in 0..16 {
                let (h0, h1) = (((qh >> j) & 1) << 4, ((qh >> (j + 16)) & 1) << 4);
                v[j] = ((x[6 + j] & 0xf) as u32 | h0) as i8 - 16;
                v[j + 16] = ((x[6 + j] >> 4) as u32 | h1) as i8 - 16;
            }
        }
        _ => {
            for j in 0..QK {
                v[j] = x[2 + j] as i8;
            }
        }
    }
    (d, v)
}

/// Dot product of GGUF weight `row` (Q4_0, Q5_0 or Q8_0) with Q8_0 activation row `act` in the
/// packed kernels' order: per block the exact integer sum, then `acc = fma(dx · dy, sum, acc)`.
/// Q6_K (against a Q8_K row): the single-row kernels' order, see [`reference_dot_q6_k`].
pub fn reference_dot(wtype: WeightType, row: &[u8], act: &[u8], n: usize) -> f32 {
    if wtype == WeightType::Q6_K {
        return reference_dot_q6_k(row, act, n);
    }
    let kd = kind(wtype)
        .filter(|&k| k != K4)
        .expect("the reference order covers Q4_0, Q5_0, Q8_0 and Q6_K");
    let mut acc = 0.0f32;
    for b in 0..n / QK {
        let (d, v) = block_values(kd, row, b);
        let y = &act[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
        let sum: i32 = v
            .iter()
            .zip(&y[2..])
            .map(|(&w, &a)| w as i32 * a as i8 as i32)
            .sum();
        let dd = f16_to_f32(d) * f16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        acc = dd.mul_add(sum as f32, acc);
    }
    acc
}

/// The 256 unsigned quants (0..63) of a Q6_K super-block `x`, in column order.
fn q6_k_quants(x: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n2 in 0..2 {
        let (ql, qh) = (&x[64 * n2..64 * n2 + 64], &x[128 + 32 * n2..128 + 32 * n2 + 32]);
        for l in 0..32 {
            for (k, v) in q6_quad(ql, qh, l).into_iter().enumerate() {
                q[128 * n2 + 32 * k + l] = v as u8;
            }
        }
    }
    q
}

/// Q6_K `row` · Q8_K `act` in the order of the single-row Q6_K kernels (AVX2's, which
/// AVX-512's equals) and of the packed one: eight i32 lanes per super-block, lane `l` holding
/// `Σ scale · q · y` over the columns `c` with `(c / 4) % 8 == l` minus
/// `32 · (scale[2 l] · bsum[2 l] + scale[2 l + 1] · bsum[2 l + 1])`; per lane
/// `acc[l] = fma(dy · d, lane, acc[l])` over the super-blocks in order; the result
/// `((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))`.
pub fn reference_dot_q6_k(row: &[u8], act: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for b in 0..n / QK_K {
        let x = &row[b * Q6_K_BYTES..(b + 1) * Q6_K_BYTES];
        let y = &act[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        let q = q6_k_quants(x);
        let sc = |s: usize| x[192 + s] as i8 as i32;
        let bs = |i: usize| i16::from_le_bytes([y[260 + 2 * i], y[261 + 2 * i]]) as i32;
        let mut lanes = [0i32; 8];
        for (c, &qc) in q.iter().enumerate() {
            lanes[(c / 4) % 8] += sc(c / 16) * qc as i32 * y[4 + c] as i8 as i32;
        }
        let dd = rd_f32(y, 0) * f16_to_f32(u16::from_le_bytes([x[208], x[209]]));
        for (l, (a, &s)) in acc.iter_mut().zip(&lanes).enumerate() {
            let s = s - 32 * (sc(2 * l) * bs(2 * l) + sc(2 * l + 1) * bs(2 * l + 1));
            *a = dd.mul_add(s as f32, *a);
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// The packed kernels a CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernels {
    /// AVX-512 F/BW/VL + VNNI: every kind.
    Avx512,
    /// AVX2 + FMA + F16C: every kind as well (the `_0` kinds, Q4_K and Q6_K).
    Avx2,
}

impl Kernels {
    /// The best this CPU and `BERTH_KERNELS` allow, if any.
    fn here() -> Option<Kernels> {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::kernel_level() >= crate::KernelLevel::Avx512 && crate::dot::avx512::supported() {
                return Some(Kernels::Avx512);
            }
            if crate::dot::has_avx2() {
                return Some(Kernels::Avx2);
            }
        }
        None
    }

    /// Every set this CPU can run, whatever `BERTH_KERNELS` says (for tests).
    #[cfg(test)]
    fn runnable() -> Vec<Kernels> {
        #[allow(unused_mut)]
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::dot::avx512::supported() {
                v.push(Kernels::Avx512);
            }
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                v.push(Kernels::Avx2);
            }
        }
        v
    }

    /// Whether these kernels cover kind `kd`.
    fn cover(self, kd: u8) -> bool {
        self == Kernels::Avx512 || matches!(kd, Q4 | Q5 | Q8 | K4 | K6)
    }
}

impl PackedMatrix {
    /// True when this CPU and `BERTH_KERNELS` allow packed kernels (AVX-512 VNNI or AVX2: every
    /// packed kind).
    pub fn available() -> bool {
        Kernels::here().is_some()
    }

    /// True when `wtype` matrices are packed here ([`PackedMatrix::pack`] takes them).
    pub fn covers(wtype: WeightType) -> bool {
        Kernels::here()
            .zip(kind(wtype))
            .is_some_and(|(k, kd)| k.cover(kd))
    }

    /// Repacks `rows` GGUF rows of `k` columns of `wtype` from `w`; None when the packed kernels
    /// that run here do not cover the type, or `rows` is not a multiple of [`PACK_ROWS`].
    pub fn pack(wtype: WeightType, w: &[u8], rows: usize, k: usize) -> Option<PackedMatrix> {
        if !Self::covers(wtype) {
            return None;
        }
        Self::pack_anywhere(wtype, w, rows, k)
    }

    /// [`PackedMatrix::pack`] whatever this CPU runs (the layout alone, for tests).
    pub fn pack_anywhere(wtype: WeightType, w: &[u8], rows: usize, k: usize) -> Option<PackedMatrix> {
        let kd = kind(wtype)?;
        if rows == 0 || !rows.is_multiple_of(PACK_ROWS) || !k.is_multiple_of(QK) {
            return None;
        }
        if kd == K4 {
            return Self::pack_q4_k(w, rows, k);
        }
        if kd == K6 {
            return Self::pack_q6_k(w, rows, k);
        }
        let rb = wtype.row_bytes(k);
        assert!(w.len() >= rows * rb, "weight matrix too short");
        let nb = k / QK;
        let scale_bytes = (nb * 32).next_multiple_of(64);
        let qb = quant_bytes(kd);
        let group_bytes = scale_bytes + nb * qb;
        let groups = rows / PACK_ROWS;
        let xb = wtype.block_bytes();
        // One group: straight copies of the GGUF bytes in four-byte steps (the nibble lines
        // are Q4_0/Q5_0's own `qs` bytes; Q8_0's values are flipped to unsigned).
        let pack_group = |g: usize, dst: &mut [u8]| {
            let (scales, quants) = dst.split_at_mut(scale_bytes);
            for lane in 0..PACK_ROWS {
                let row = &w[(g * PACK_ROWS + lane) * rb..][..rb];
                for b in 0..nb {
                    let x = &row[b * xb..(b + 1) * xb];
                    scales[b * 32 + 2 * lane..][..2].copy_from_slice(&x[..2]);
                    let q = &mut quants[b * qb..(b + 1) * qb];
                    match kd {
                        Q8 => {
                            for grp in 0..8 {
                                for e in 0..4 {
                                    q[grp * 64 + lane * 4 + e] = x[2 + 4 * grp + e] ^ 0x80;
                                }
                            }
                        }
                        _ => {
                            let qs = if kd == Q5 { &x[6..22] } else { &x[2..18] };
                            for line in 0..4 {
                                q[line * 64 + lane * 4..][..4].copy_from_slice(&qs[4 * line..4 * line + 4]);
                            }
                            if kd == Q5 {
                                // Group g's mask: bit 4 lane + e is value 4 g + e's fifth bit.
                                let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
                                for grp in 0..8 {
                                    q[256 + grp * 8 + lane / 2] |=
                                        (((qh >> (4 * grp)) & 0xf) as u8) << (4 * (lane % 2));
                                }
                            }
                        }
                    }
                }
            }
        };
        let data = fill_groups(groups, group_bytes, pack_group);
        Some(PackedMatrix {
            wtype,
            rows,
            k,
            group_bytes,
            data,
        })
    }

    /// Q4_K rows in 16-row groups of [`K4_BYTES`] per super-block: straight copies of the
    /// GGUF nibbles in four-byte steps (byte `4 lane + e` of line `8 j + g` is byte
    /// `32 j + 4 g + e` of the row's `qs`: sub-block `2 j` in the low nibbles, `2 j + 1` in the
    /// high ones), the scales and mins unpacked to bytes.
    fn pack_q4_k(w: &[u8], rows: usize, k: usize) -> Option<PackedMatrix> {
        if !k.is_multiple_of(QK_K) {
            return None;
        }
        let nsb = k / QK_K;
        let rb = WeightType::Q4_K.row_bytes(k);
        assert!(w.len() >= rows * rb, "weight matrix too short");
        let group_bytes = nsb * K4_BYTES;
        let groups = rows / PACK_ROWS;
        let pack_group = |g: usize, dst: &mut [u8]| {
            for lane in 0..PACK_ROWS {
                let row = &w[(g * PACK_ROWS + lane) * rb..][..rb];
                for b in 0..nsb {
                    let x = &row[b * Q4_K_BYTES..(b + 1) * Q4_K_BYTES];
                    let o = &mut dst[b * K4_BYTES..(b + 1) * K4_BYTES];
                    o[2 * lane..2 * lane + 2].copy_from_slice(&x[0..2]);
                    o[32 + 2 * lane..32 + 2 * lane + 2].copy_from_slice(&x[2..4]);
                    let (sc, m) = unpack_scales_mins_k4(&x[4..16]);
                    for j in 0..8 {
                        o[64 + 16 * j + lane] = sc[j];
                        o[192 + 16 * j + lane] = m[j];
                    }
                    for line in 0..32 {
                        o[320 + 64 * line + 4 * lane..][..4]
                            .copy_from_slice(&x[16 + 4 * line..16 + 4 * line + 4]);
                    }
                }
            }
        };
        let data = fill_groups(groups, group_bytes, pack_group);
        Some(PackedMatrix {
            wtype: WeightType::Q4_K,
            rows,
            k,
            group_bytes,
            data,
        })
    }

    /// Q6_K rows in 16-row groups of [`K6_BYTES`] per super-block (layout there).
    fn pack_q6_k(w: &[u8], rows: usize, k: usize) -> Option<PackedMatrix> {
        if !k.is_multiple_of(QK_K) {
            return None;
        }
        let nsb = k / QK_K;
        let rb = WeightType::Q6_K.row_bytes(k);
        assert!(w.len() >= rows * rb, "weight matrix too short");
        let group_bytes = nsb * K6_BYTES;
        let groups = rows / PACK_ROWS;
        let pack_group = |g: usize, dst: &mut [u8]| {
            for lane in 0..PACK_ROWS {
                let row = &w[(g * PACK_ROWS + lane) * rb..][..rb];
                for b in 0..nsb {
                    let x = &row[b * Q6_K_BYTES..(b + 1) * Q6_K_BYTES];
                    let o = &mut dst[b * K6_BYTES..(b + 1) * K6_BYTES];
                    o[2 * lane..2 * lane + 2].copy_from_slice(&x[208..210]);
                    for p in 0..8 {
                        o[64 + 32 * p + 2 * lane..][..2].copy_from_slice(&x[192 + 2 * p..194 + 2 * p]);
                    }
                    let q = q6_k_quants(x);
                    // Byte e of row `lane` in vector (l, j).
                    let v = |l: usize, j: usize, e: usize| q[32 * j + 4 * l + e];
                    let quants = &mut o[320..];
                    for l in 0..8 {
                        for e in 0..4 {
                            let at = 4 * lane + e;
                            for h in 0..2 {
                                let top = v(l, 4 * h + 3, e);
                                for m in 0..3 {
                                    quants[64 * (6 * l + 3 * h + m) + at] =
                                        v(l, 4 * h + m, e) | ((top >> (2 * m)) & 3) << 6;
                                }
                            }
                        }
                    }
                }
            }
        };
        let data = fill_groups(groups, group_bytes, pack_group);
        Some(PackedMatrix {
            wtype: WeightType::Q6_K,
            rows,
            k,
            group_bytes,
            data,
        })
    }

    /// The weight type the rows had.
    pub fn wtype(&self) -> WeightType {
        self.wtype
    }

    /// Rows (output dimension).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input dimension).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.data.len() * 64
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes; the slice covers exactly the vector's storage.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.data.len() * 64) }
    }
}

/// Q8_0 activation rows with what the packed kernels take per block: the scale as f32 and the
/// weight offset times the block's sum.
#[derive(Default)]
pub struct PackedActs {
    dy: Vec<f32>,
    cor: Vec<i32>,
}

impl PackedActs {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    fn prepare(&mut self, kd: u8, act: &QuantizedActivations) {
        if kd == K4 || kd == K6 {
            // Per super-block: the scale, and eight values from the pairs of bsums: Q4_K their
            // sums (the 32-value sums), Q6_K the pairs negated as two i16 in one i32.
            let nsb = act.n() / QK_K;
            let rb = ActFormat::Q8_K.row_bytes(act.n());
            self.dy.clear();
            self.cor.clear();
            let bytes = act.bytes();
            for r in 0..act.rows() {
                for b in 0..nsb {
                    let y = &bytes[r * rb + b * Q8_K_BYTES..r * rb + (b + 1) * Q8_K_BYTES];
                    self.dy.push(rd_f32(y, 0));
                    for j in 0..8 {
                        let bs = |i: usize| i16::from_le_bytes([y[260 + 2 * i], y[261 + 2 * i]]) as i32;
                        self.cor.push(if kd == K4 {
                            bs(2 * j) + bs(2 * j + 1)
                        } else {
                            (-bs(2 * j)) as u16 as i32 | ((-bs(2 * j + 1)) as u16 as i32) << 16
                        });
                    }
                }
            }
            return;
        }
        let nb = act.n() / QK;
        let rb = ActFormat::Q8_0.row_bytes(act.n());
        self.dy.clear();
        self.cor.clear();
        let bytes = act.bytes();
        for r in 0..act.rows() {
            let row = &bytes[r * rb..(r + 1) * rb];
            for b in 0..nb {
                let y = &row[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
                self.dy.push(f16_to_f32(u16::from_le_bytes([y[0], y[1]])));
                let s: i32 = y[2..].iter().map(|&v| v as i8 as i32).sum();
                self.cor.push(offset(kd) * s);
            }
        }
    }
}

/// Activation rows per Q6_K kernel call.
const K6_BATCH: usize = 8;

/// How far ahead of the block being computed the kernels prefetch a group's own bytes (for
/// decode's streaming). `examples/headbench`, single row, best of alternating runs on a 2-core
/// Zen with AVX-512, GB/s at 1 / 2 threads for 2048 and 8192 bytes: Q5_0 131072x896 19.0 / 36.7
/// and 31.2 / 50.6; Q8_0 262144x640 23.1 / 36.5 and 25.2 / 37.3; Q4_K and Q6_K within noise.
const PREFETCH: usize = 8192;

/// What a kernel prefetches while it runs: at block `b`, the `step` bytes from `at + b · step`
/// (a hint: the addresses need not be valid).
#[derive(Clone, Copy)]
struct Prefetch {
    at: *const u8,
    step: usize,
}

impl Prefetch {
    /// The group's own quants, `ahead` bytes ahead of the block being computed.
    fn ahead(group: &[u8], scale_bytes: usize, block_bytes: usize, ahead: usize) -> Prefetch {
        Prefetch {
            at: group.as_ptr().wrapping_add(scale_bytes + ahead),
            step: block_bytes,
        }
    }

    /// All of `next` (the group computed after this one), spread over this one's `nb` blocks.
    fn next(next: &[u8], nb: usize) -> Prefetch {
        Prefetch {
            at: next.as_ptr(),
            step: next.len().div_ceil(nb.max(1)).next_multiple_of(64),
        }
    }
}

struct OutPtr(*mut f32);
// SAFETY: each parallel chunk writes only the output columns of its own row groups while the
// owning `&mut [f32]` is borrowed by the caller.
unsafe impl Sync for OutPtr {}

/// `out[i][r] = dot(W[r], act.row(i))` for a packed matrix and activations quantized for its
/// type, every element bit for bit [`reference_dot`] (Q4_K: the single-row Q4_K kernels' order:
/// per super-block the whole integer sums of scaled quants and of mins times sums, each in one
/// fused multiply-add with `d · yd` and `dmin · yd`; the result is their difference; Q6_K:
/// [`reference_dot_q6_k`], the single-row Q6_K kernels' order);
/// `scratch` holds the activations' block scales and sums.
pub fn matmul_packed(
    p: &PackedMatrix,
    act: &QuantizedActivations,
    out: &mut [f32],
    scratch: &mut PackedActs,
    pool: &ThreadPool,
) {
    let kernels = Kernels::here().expect("packed kernels need AVX-512 VNNI or AVX2");
    matmul_packed_with(kernels, p, act, out, scratch, pool);
}

/// [`matmul_packed`] with the given kernels.
fn matmul_packed_with(
    kernels: Kernels,
    p: &PackedMatrix,
    act: &QuantizedActivations,
    out: &mut [f32],
    scratch: &mut PackedActs,
    pool: &ThreadPool,
) {
    let plan = Plan::new(kernels, p, act, out, scratch);
    let per = plan.groups.div_ceil(pool.n_threads() * 4).max(1);
    pool.parallel_for(plan.groups.div_ceil(per), |c| {
        with_expanded(|expanded| {
            for g in c * per..((c + 1) * per).min(plan.groups) {
                plan.run(g, expanded);
            }
        })
    });
}

/// Several packed matrices against activations of the same rows (q/k/v, gate/up) in one
/// parallel section: `items` are (matrix, its activations, its output, its scratch), at most
/// [`MANY_MAX`]. Each product is what [`matmul_packed`] computes alone, bit for bit.
pub fn matmul_packed_many<'a>(
    items: impl IntoIterator<
        Item = (
            &'a PackedMatrix,
            &'a QuantizedActivations,
            &'a mut [f32],
            &'a mut PackedActs,
        ),
    >,
    pool: &ThreadPool,
) {
    let kernels = Kernels::here().expect("packed kernels need AVX-512 VNNI or AVX2");
    let mut plans: [Option<Plan<'a>>; MANY_MAX] = [None, None, None, None];
    let mut items = items.into_iter();
    for (slot, (p, act, out, scratch)) in plans.iter_mut().zip(&mut items) {
        *slot = Some(Plan::new(kernels, p, act, out, scratch));
    }
    assert!(items.next().is_none(), "at most {MANY_MAX} matrices at once");
    let plans: &[Option<Plan<'_>>] = &plans;
    let total: usize = plans.iter().flatten().map(|p| p.groups).sum();
    let per = total.div_ceil(pool.n_threads() * 4).max(1);
    pool.parallel_for(total.div_ceil(per), |c| {
        with_expanded(|expanded| {
            for x in c * per..((c + 1) * per).min(total) {
                // Group x of the matrices' groups one after another.
                let mut g = x;
                for plan in plans.iter().flatten() {
                    if g < plan.groups {
                        plan.run(g, expanded);
                        break;
                    }
                    g -= plan.groups;
                }
            }
        })
    });
}

/// Most matrices [`matmul_packed_many`] takes at once.
pub const MANY_MAX: usize = 4;

/// Calls `f` with this thread's buffer for an unpacked group, kept between calls.
fn with_expanded(f: impl FnOnce(&mut Vec<u8>)) {
    thread_local! {
        static EXPANDED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut expanded = EXPANDED.take();
    f(&mut expanded);
    EXPANDED.set(expanded);
}

/// One packed product, checked and set up: what computing any of its groups needs.
struct Plan<'a> {
    wide: bool,
    kd: u8,
    m: usize,
    rows: usize,
    groups: usize,
    group_bytes: usize,
    nb: usize,
    sums_per_block: usize,
    scale_bytes: usize,
    batch: usize,
    expand: bool,
    rb: usize,
    data: &'a [u8],
    acts: &'a [u8],
    dy: &'a [f32],
    cor: &'a [i32],
    out: OutPtr,
}

impl<'a> Plan<'a> {
    /// Checks the shapes, prepares `scratch` for `act` and sets the product up.
    fn new(
        kernels: Kernels,
        p: &'a PackedMatrix,
        act: &'a QuantizedActivations,
        out: &'a mut [f32],
        scratch: &'a mut PackedActs,
    ) -> Plan<'a> {
        let m = act.rows();
        assert_eq!(act.n(), p.k, "activation row length must equal k");
        assert_eq!(
            act.format(),
            p.wtype.act_format(),
            "activations quantized for another type"
        );
        assert!(out.len() >= m * p.rows, "output too short");
        let kd = kind(p.wtype).expect("packed type");
        assert!(
            kernels.cover(kd),
            "{kernels:?} kernels do not cover {}",
            p.wtype.name()
        );
        let wide = kernels == Kernels::Avx512;
        scratch.prepare(kd, act);
        // Blocks per row, and the activations' sums per block (Q4_K: one per 32-value
        // sub-block; Q6_K: one pair of 16-value sums per 32 values).
        let (nb, sums_per_block) = if kd == K4 || kd == K6 {
            (p.k / QK_K, 8)
        } else {
            (p.k / QK, 1)
        };
        // Activation rows per kernel call: eight for Q8_0; four where unpacking nibbles takes
        // registers too (measured faster than eight for Q5_0).
        let batch = match kd {
            _ if !wide => AVX2_BATCH,
            Q8 => 8,
            K6 => K6_BATCH,
            _ => 4,
        };
        // Several rows: each Q4_0/Q5_0 group is unpacked once to Q8_0's layout (the stored
        // unsigned values as bytes; the offset stays the kind's, in `cor`), so that the nibbles
        // are not unpacked again for every few rows, and eight rows share each weight load. The
        // integer sums, hence the results, are the same.
        let expand = (kd == Q4 || kd == Q5) && m >= EXPAND_MIN_ROWS;
        let scratch: &'a PackedActs = scratch;
        Plan {
            wide,
            kd,
            m,
            rows: p.rows,
            groups: p.rows / PACK_ROWS,
            group_bytes: p.group_bytes,
            nb,
            sums_per_block,
            scale_bytes: p.group_bytes - nb * quant_bytes(kd),
            batch: if expand && wide { 8 } else { batch },
            expand,
            rb: act.format().row_bytes(p.k),
            data: p.bytes(),
            acts: act.bytes(),
            dy: &scratch.dy[..],
            cor: &scratch.cor[..],
            out: OutPtr(out.as_mut_ptr()),
        }
    }

    /// Computes group `g` (its 16 output columns) for every activation row; `expanded` is the
    /// calling thread's buffer for an unpacked group.
    fn run(&self, g: usize, expanded: &mut Vec<u8>) {
        let (nb, rb, scale_bytes, wide) = (self.nb, self.rb, self.scale_bytes, self.wide);
        let data = self.data;
        let mut group = &data[g * self.group_bytes..(g + 1) * self.group_bytes];
        let mut kd = self.kd;
        let mut prefetch = Prefetch::ahead(group, scale_bytes, quant_bytes(kd), PREFETCH);
        if self.expand {
            // The expanded group is in cache: fetch the next one from memory meanwhile.
            let next = data.get((g + 1) * self.group_bytes..(g + 2) * self.group_bytes);
            prefetch = Prefetch::next(next.unwrap_or(&[]), nb);
            expanded.resize(scale_bytes + nb * quant_bytes(Q8), 0);
            expanded[..scale_bytes].copy_from_slice(&group[..scale_bytes]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the plan's kernels (covering kd, asserted) run on this CPU; the group
            // holds nb blocks of kind kd after its scales, `expanded` nb blocks of Q8_0's.
            unsafe {
                if wide {
                    avx512::expand(kd, &group[scale_bytes..], nb, &mut expanded[scale_bytes..])
                } else {
                    avx2::expand(kd, &group[scale_bytes..], nb, &mut expanded[scale_bytes..])
                }
            };
            // AVX-512 takes Q8_0's bytes unsigned with the offset in `cor` already; the AVX2
            // kernel of Q8_0 takes them signed, so it gets a kind of its own.
            (group, kd) = (&expanded[..], if wide { Q8 } else { U8 });
        }
        let mut i = 0;
        while i < self.m {
            let r = (self.m - i).min(self.batch);
            let mut res = [[0.0f32; PACK_ROWS]; 8];
            let (acts, dy, cor) = (
                &self.acts[i * rb..],
                &self.dy[i * nb..],
                &self.cor[i * nb * self.sums_per_block..],
            );
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `kernels` (covering kd, asserted) runs on this CPU; the group holds nb
            // blocks of kind kd, and rows i..i + r of the activations nb blocks each.
            unsafe {
                if kd == K4 && !self.wide {
                    avx2::group_q4_k(r, group, nb, acts, rb, dy, cor, &mut res)
                } else if kd == K4 {
                    avx512::group_q4_k(r, group, nb, acts, rb, dy, cor, &mut res)
                } else if kd == K6 && !self.wide {
                    avx2::group_q6_k(r, group, nb, acts, rb, dy, cor, &mut res)
                } else if kd == K6 {
                    avx512::group_q6_k(r, group, nb, acts, rb, dy, cor, &mut res)
                } else if self.wide {
                    avx512::group(
                        kd,
                        r,
                        group,
                        scale_bytes,
                        nb,
                        acts,
                        rb,
                        dy,
                        cor,
                        prefetch,
                        &mut res,
                    )
                } else {
                    avx2::group(
                        kd,
                        r,
                        group,
                        scale_bytes,
                        nb,
                        acts,
                        rb,
                        dy,
                        cor,
                        prefetch,
                        &mut res,
                    )
                }
            };
            for (di, vals) in res.iter().take(r).enumerate() {
                for (lane, &v) in vals.iter().enumerate() {
                    // SAFETY: i + di < m and g * 16 + lane < rows, so the index is
                    // < out.len() (asserted); one call alone writes group g's columns.
                    unsafe { *self.out.0.add((i + di) * self.rows + g * PACK_ROWS + lane) = v };
                }
            }
            i += r;
        }
    }
}

/// Activation rows from which Q4_0/Q5_0 groups are unpacked once per product (see
/// [`matmul_packed`]); `examples/headbench` measured Q5_0 4864x896 at 2 threads, direct against
/// unpacked: 163 / 124 GMAC/s at 5 rows, 94 / 173 at 6, 144 / 172 at 8, 149 / 186 at 64.
const EXPAND_MIN_ROWS: usize = 6;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{quant_bytes, Prefetch, PACK_ROWS, PREFETCH, Q4, Q5, Q8};
    use crate::quant::Q8_0_BYTES;
    use std::arch::x86_64::*;

    /// One 16-row group (`group`: scales in the first `scale_bytes`, then `nb` blocks of
    /// quants) against `r ≤ 8` activation rows (`acts`, `rb` bytes apart; their per-block
    /// scales `dy` and corrections `cor`, `nb` apart) into `out[j][lane]`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI; the slices hold what the shapes say.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group(
        kd: u8,
        r: usize,
        group: &[u8],
        scale_bytes: usize,
        nb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        cor: &[i32],
        prefetch: Prefetch,
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        assert!((1..=8).contains(&r) && acts.len() >= (r - 1) * rb + nb * Q8_0_BYTES);
        assert!(dy.len() >= (r - 1) * nb + nb && cor.len() >= (r - 1) * nb + nb);
        assert!(group.len() >= scale_bytes + nb * quant_bytes(kd));
        macro_rules! rows {
            ($k:expr) => {
                match r {
                    // SAFETY (each arm): as this function's contract, checked above.
                    1 => unsafe { kernel::<$k, 1>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    2 => unsafe { kernel::<$k, 2>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    3 => unsafe { kernel::<$k, 3>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    4 => unsafe { kernel::<$k, 4>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    5 => unsafe { kernel::<$k, 5>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    6 => unsafe { kernel::<$k, 6>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    7 => unsafe { kernel::<$k, 7>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    _ => unsafe { kernel::<$k, 8>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                }
            };
        }
        match kd {
            Q4 => rows!(Q4),
            Q5 => rows!(Q5),
            _ => rows!(Q8),
        }
    }

    /// One 16-row Q4_K group (`nsb` super-blocks of [`super::K4_BYTES`]) against `r ≤ 4`
    /// Q8_K activation rows (`rb` bytes apart; their scales `dy` and 32-value sums `sums`, 8 per
    /// super-block) into `out[j][lane]`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI; the slices hold what the shapes say.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group_q4_k(
        r: usize,
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        sums: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        assert!((1..=4).contains(&r) && acts.len() >= (r - 1) * rb + nsb * Q8_K_BYTES);
        assert!(dy.len() >= (r - 1) * nsb + nsb && sums.len() >= 8 * ((r - 1) * nsb + nsb));
        assert!(group.len() >= nsb * super::K4_BYTES);
        // SAFETY (each arm): as this function's contract, checked above.
        unsafe {
            match r {
                1 => kernel_q4_k::<1>(group, nsb, acts, rb, dy, sums, out),
                2 => kernel_q4_k::<2>(group, nsb, acts, rb, dy, sums, out),
                3 => kernel_q4_k::<3>(group, nsb, acts, rb, dy, sums, out),
                _ => kernel_q4_k::<4>(group, nsb, acts, rb, dy, sums, out),
            }
        }
    }

    /// The kernel of [`group_q4_k`] for `R` activation rows.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel_q4_k<const R: usize>(
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        sums: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        let m4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut accm = [_mm512_setzero_ps(); R];
        for b in 0..nsb {
            // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
            // the caller); the prefetch is a hint.
            unsafe {
                let x = group.as_ptr().add(b * super::K4_BYTES);
                for l in (0..super::K4_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(PREFETCH + l) as *const i8);
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(x as *const __m256i));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(32) as *const __m256i));
                let mut isum = [_mm512_setzero_si512(); R];
                let mut msum = [_mm512_setzero_si512(); R];
                for j in 0..4 {
                    let mut slo = [_mm512_setzero_si512(); R];
                    let mut shi = [_mm512_setzero_si512(); R];
                    for g in 0..8 {
                        let q = _mm512_loadu_si512(x.add(320 + 64 * (8 * j + g)) as *const _);
                        let lo = _mm512_and_si512(q, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                        for r in 0..R {
                            let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 64 * j + 4 * g);
                            let y0 = (y as *const i32).read_unaligned();
                            let y1 = (y.add(32) as *const i32).read_unaligned();
                            slo[r] = _mm512_dpbusd_epi32(slo[r], lo, _mm512_set1_epi32(y0));
                            shi[r] = _mm512_dpbusd_epi32(shi[r], hi, _mm512_set1_epi32(y1));
                        }
                    }
                    let sc = |i: usize| {
                        _mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(64 + 16 * i) as *const __m128i))
                    };
                    let mn = |i: usize| {
                        _mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(192 + 16 * i) as *const __m128i))
                    };
                    let (s0, s1, m0, m1) = (sc(2 * j), sc(2 * j + 1), mn(2 * j), mn(2 * j + 1));
                    for r in 0..R {
                        let bs = &sums[(r * nsb + b) * 8..];
                        isum[r] = _mm512_add_epi32(
                            isum[r],
                            _mm512_add_epi32(_mm512_mullo_epi32(slo[r], s0), _mm512_mullo_epi32(shi[r], s1)),
                        );
                        msum[r] = _mm512_add_epi32(
                            msum[r],
                            _mm512_add_epi32(
                                _mm512_mullo_epi32(m0, _mm512_set1_epi32(bs[2 * j])),
                                _mm512_mullo_epi32(m1, _mm512_set1_epi32(bs[2 * j + 1])),
                            ),
                        );
                    }
                }
                for r in 0..R {
                    let yd = _mm512_set1_ps(dy[r * nsb + b]);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, yd), acc[r]);
                    accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[r]), _mm512_mul_ps(dmin, yd), accm[r]);
                }
            }
        }
        for r in 0..R {
            // SAFETY: out[r] holds 16 floats.
            unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r])) };
        }
    }

    /// One 16-row Q6_K group (`nsb` super-blocks of [`super::K6_BYTES`]) against `r ≤ 8`
    /// Q8_K activation rows (`rb` bytes apart; their scales `dy` and negated bsum pairs `nbs`,
    /// 8 per super-block) into `out[j][lane]`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI; the slices hold what the shapes say.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group_q6_k(
        r: usize,
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        nbs: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        assert!((1..=8).contains(&r) && acts.len() >= (r - 1) * rb + nsb * Q8_K_BYTES);
        assert!(dy.len() >= (r - 1) * nsb + nsb && nbs.len() >= 8 * ((r - 1) * nsb + nsb));
        assert!(group.len() >= nsb * super::K6_BYTES);
        // SAFETY (each arm): as this function's contract, checked above.
        unsafe {
            match r {
                1 => kernel_q6_k::<1>(group, nsb, acts, rb, dy, nbs, out),
                2 => kernel_q6_k::<2>(group, nsb, acts, rb, dy, nbs, out),
                3 => kernel_q6_k::<3>(group, nsb, acts, rb, dy, nbs, out),
                4 => kernel_q6_k::<4>(group, nsb, acts, rb, dy, nbs, out),
                5 => kernel_q6_k::<5>(group, nsb, acts, rb, dy, nbs, out),
                6 => kernel_q6_k::<6>(group, nsb, acts, rb, dy, nbs, out),
                7 => kernel_q6_k::<7>(group, nsb, acts, rb, dy, nbs, out),
                _ => kernel_q6_k::<8>(group, nsb, acts, rb, dy, nbs, out),
            }
        }
    }

    /// The kernel of [`group_q6_k`] for `R` activation rows: per super-block and i32 lane `l` of
    /// the single-row kernel (columns `32 j + 4 l .. + 4`, see [`super::K6_BYTES`]), the 16
    /// rows' lane sums `Σ_j scale · (q · y)` by `vpmaddubsw` and `vpdpwssd`, minus the lane's
    /// `32 · scale · bsum` pair (one more `vpdpwssd`), then the lane's own fused multiply-add;
    /// the lanes are summed at the end in the single-row kernel's tree.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel_q6_k<const R: usize>(
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        nbs: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        // vpshufb patterns putting a pair's first (second) i16 in both halves of each i32.
        let dup = [
            _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13)),
            _mm512_broadcast_i32x4(_mm_setr_epi8(
                2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
            )),
        ];
        let m6 = _mm512_set1_epi8(0x3f);
        let mut acc = [[_mm512_setzero_ps(); 8]; R];
        for b in 0..nsb {
            // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
            // the caller); the prefetch is a hint.
            unsafe {
                let x = group.as_ptr().add(b * super::K6_BYTES);
                for l in (0..super::K6_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(PREFETCH + l) as *const i8);
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(x as *const __m256i));
                // Per pair p, the 16 rows' (scale[2 p], scale[2 p + 1]) as two i16 in an i32.
                let pairs: [__m512i; 8] = std::array::from_fn(|p| {
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256(x.add(64 + 32 * p) as *const __m256i))
                });
                let q = x.add(320);
                for (h, &dup_h) in dup.iter().enumerate() {
                    // Lanes 4 h .. 4 h + 4 take sub-block 2 j + h's scale in chunk j.
                    let sc: [__m512i; 8] = std::array::from_fn(|j| _mm512_shuffle_epi8(pairs[j], dup_h));
                    for l in 4 * h..4 * h + 4 {
                        let mut s = [_mm512_setzero_si512(); R];
                        for hj in 0..2 {
                            let v: [__m512i; 4] = {
                                let line = |m: usize| {
                                    _mm512_loadu_si512(q.add(64 * (6 * l + 3 * hj + m)) as *const _)
                                };
                                let (l0, l1, l2) = (line(0), line(1), line(2));
                                // The top bits of l0, l1, l2 to bits 0-1, 2-3, 4-5 of the
                                // fourth vector (0xe4: a where c is set, else b).
                                let t = _mm512_ternarylogic_epi32::<0xe4>(
                                    _mm512_srli_epi16::<6>(l0),
                                    _mm512_srli_epi16::<4>(l1),
                                    _mm512_set1_epi8(0x03),
                                );
                                let t = _mm512_ternarylogic_epi32::<0xe4>(
                                    t,
                                    _mm512_srli_epi16::<2>(l2),
                                    _mm512_set1_epi8(0x0f),
                                );
                                [
                                    _mm512_and_si512(l0, m6),
                                    _mm512_and_si512(l1, m6),
                                    _mm512_and_si512(l2, m6),
                                    _mm512_and_si512(t, m6),
                                ]
                            };
                            for (m, &w) in v.iter().enumerate() {
                                let j = 4 * hj + m;
                                for (r, sr) in s.iter_mut().enumerate() {
                                    let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 32 * j + 4 * l);
                                    let y = _mm512_set1_epi32((y as *const i32).read_unaligned());
                                    *sr = _mm512_dpwssd_epi32(*sr, _mm512_maddubs_epi16(w, y), sc[j]);
                                }
                            }
                        }
                        let off = _mm512_slli_epi16::<5>(pairs[l]);
                        for (r, sr) in s.iter().enumerate() {
                            let i = r * nsb + b;
                            let si = _mm512_dpwssd_epi32(*sr, off, _mm512_set1_epi32(nbs[8 * i + l]));
                            let dd = _mm512_mul_ps(d, _mm512_set1_ps(dy[i]));
                            acc[r][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), dd, acc[r][l]);
                        }
                    }
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let sum = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
            );
            // SAFETY: out[r] holds 16 floats.
            unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), sum) };
        }
    }

    /// Unpacks the `nb` blocks of quants of a Q4_0 or Q5_0 group (`kd`) into Q8_0's layout in
    /// `out` (512 bytes a block): the unsigned stored values as bytes, four columns of the 16
    /// rows per 64-byte line, exactly what [`kernel`] feeds `vpdpbusd` for those kinds.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    pub(super) unsafe fn expand(kd: u8, quants: &[u8], nb: usize, out: &mut [u8]) {
        let qb = quant_bytes(kd);
        assert!(quants.len() >= nb * qb && out.len() >= nb * quant_bytes(Q8));
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(0x10);
        for b in 0..nb {
            // SAFETY: block b < nb of both buffers (asserted above).
            unsafe {
                let q = quants.as_ptr().add(b * qb);
                let o = out.as_mut_ptr().add(b * quant_bytes(Q8));
                for l in 0..4 {
                    let x = _mm512_loadu_si512(q.add(64 * l) as *const _);
                    let mut lo = _mm512_and_si512(x, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
                    if kd == Q5 {
                        let bits = |g: usize| (q.add(256 + 8 * g) as *const u64).read_unaligned();
                        lo = _mm512_mask_add_epi8(lo, bits(l), lo, sixteen);
                        hi = _mm512_mask_add_epi8(hi, bits(l + 4), hi, sixteen);
                    }
                    _mm512_storeu_si512(o.add(64 * l) as *mut _, lo);
                    _mm512_storeu_si512(o.add(64 * (l + 4)) as *mut _, hi);
                }
            }
        }
    }

    /// The kernel of [`group`] for kind `K` and `R` activation rows.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
    unsafe fn kernel<const K: u8, const R: usize>(
        group: &[u8],
        scale_bytes: usize,
        nb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        cor: &[i32],
        prefetch: Prefetch,
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        let qb = quant_bytes(K);
        let base = group.as_ptr();
        let ap = acts.as_ptr();
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(0x10);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            // SAFETY: block b < nb of the group (asserted by the caller); the prefetch is a hint.
            let (dx, wv) = unsafe {
                let q = base.add(scale_bytes + b * qb);
                let p = prefetch.at.wrapping_add(b * prefetch.step);
                for l in (0..prefetch.step).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l) as *const i8);
                }
                let dx = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(b * 32) as *const __m256i));
                let mut wv = [_mm512_setzero_si512(); 8];
                match K {
                    Q8 => {
                        for (g, v) in wv.iter_mut().enumerate() {
                            *v = _mm512_loadu_si512(q.add(64 * g) as *const _);
                        }
                    }
                    _ => {
                        for l in 0..4 {
                            let x = _mm512_loadu_si512(q.add(64 * l) as *const _);
                            wv[l] = _mm512_and_si512(x, m4);
                            wv[l + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
                        }
                        if K == Q5 {
                            for (g, v) in wv.iter_mut().enumerate() {
                                let bits = (q.add(256 + 8 * g) as *const u64).read_unaligned();
                                *v = _mm512_mask_add_epi8(*v, bits, *v, sixteen);
                            }
                        }
                    }
                }
                (dx, wv)
            };
            for j in 0..R {
                // SAFETY: block b < nb of activation row j < R (asserted by the caller).
                let y = unsafe { ap.add(j * rb + b * Q8_0_BYTES + 2) };
                let mut s = _mm512_setzero_si512();
                for (g, &w) in wv.iter().enumerate() {
                    // SAFETY: four bytes of the block's 32 quants.
                    let a = unsafe { (y.add(4 * g) as *const i32).read_unaligned() };
                    s = _mm512_dpbusd_epi32(s, w, _mm512_set1_epi32(a));
                }
                let s = _mm512_sub_epi32(s, _mm512_set1_epi32(cor[j * nb + b]));
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(dy[j * nb + b]));
                acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[j]);
            }
        }
        for j in 0..R {
            // SAFETY: out[j] holds 16 floats.
            unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
        }
    }
}

/// The AVX2 kernels (the `_0` kinds, Q4_K and Q6_K), on the same 16-row layout: each 64-byte line is two
/// 32-byte halves of 8 rows. `vpmaddubsw` + `vpmaddwd` stand in for `vpdpbusd`: nibble values
/// (at most 31) go in unsigned as stored; Q8_0's bytes are taken back to signed and multiplied
/// as `|w| · sign(y, w)`, so no pair of products can saturate 16 bits (at most 2 · 128 · 127).
/// The integer sums are exact, and the order of everything after them is the AVX-512 kernel's,
/// so every result equals [`reference_dot`] bit for bit.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{quant_bytes, Prefetch, PACK_ROWS, Q4, Q5, Q8, U8};
    use crate::quant::Q8_0_BYTES;
    use std::arch::x86_64::*;

    /// 0x10 in the bytes of two 32-byte vectors whose bits are set in the 8 bytes at `at`
    /// (vector 0 takes the low 32 bits, vector 1 the high; byte `i`, bit `i`).
    ///
    /// # Safety
    /// AVX2 is present; `at` points at 8 readable bytes.
    #[inline(always)]
    unsafe fn fifth_bits(at: *const u8) -> [__m256i; 2] {
        // One broadcast of the 8 bytes; every byte takes the mask byte that holds its bit, then
        // tests that bit.
        // SAFETY: 8 bytes at `at` (the caller's contract).
        let all = _mm256_set1_epi64x(unsafe { (at as *const i64).read_unaligned() });
        let spread_lo = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let spread_hi = _mm256_setr_epi8(
            4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7,
        );
        let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let sixteen = _mm256_set1_epi8(0x10);
        let lo = _mm256_and_si256(_mm256_shuffle_epi8(all, spread_lo), select);
        let hi = _mm256_and_si256(_mm256_shuffle_epi8(all, spread_hi), select);
        [
            _mm256_and_si256(_mm256_cmpeq_epi8(lo, select), sixteen),
            _mm256_and_si256(_mm256_cmpeq_epi8(hi, select), sixteen),
        ]
    }

    /// Block `q`'s 16 weight vectors (`[vector][half]`, vector `g` holding columns
    /// `4 g .. 4 g + 4`): unsigned values for Q4_0/Q5_0/U8, signed bytes for Q8_0.
    ///
    /// # Safety
    /// AVX2 is present; `q` points at a block of `quant_bytes(K)` bytes.
    #[inline(always)]
    unsafe fn weights<const K: u8>(q: *const u8) -> [[__m256i; 2]; 8] {
        let mut w = [[_mm256_setzero_si256(); 2]; 8];
        // SAFETY: every load lies inside the block (the caller's contract).
        unsafe {
            match K {
                Q8 | U8 => {
                    let flip = _mm256_set1_epi8(if K == Q8 { -128 } else { 0 });
                    for (g, wg) in w.iter_mut().enumerate() {
                        for (h, v) in wg.iter_mut().enumerate() {
                            let x = _mm256_loadu_si256(q.add(64 * g + 32 * h) as *const __m256i);
                            *v = _mm256_xor_si256(x, flip);
                        }
                    }
                }
                _ => {
                    let m4 = _mm256_set1_epi8(0x0f);
                    let (low, high) = w.split_at_mut(4);
                    for (l, (lo, hi)) in low.iter_mut().zip(high).enumerate() {
                        for (h, (a, b)) in lo.iter_mut().zip(hi).enumerate() {
                            let x = _mm256_loadu_si256(q.add(64 * l + 32 * h) as *const __m256i);
                            *a = _mm256_and_si256(x, m4);
                            *b = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
                        }
                    }
                    if K == Q5 {
                        for (g, wg) in w.iter_mut().enumerate() {
                            let [lo, hi] = fifth_bits(q.add(256 + 8 * g));
                            wg[0] = _mm256_add_epi8(wg[0], lo);
                            wg[1] = _mm256_add_epi8(wg[1], hi);
                        }
                    }
                }
            }
        }
        w
    }

    /// Unpacks the `nb` blocks of a Q4_0 or Q5_0 group's quants into Q8_0's layout in `out`,
    /// as [`super::avx512`]'s `expand` does (the same bytes).
    ///
    /// # Safety
    /// AVX2 is present.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn expand(kd: u8, quants: &[u8], nb: usize, out: &mut [u8]) {
        let qb = quant_bytes(kd);
        assert!(quants.len() >= nb * qb && out.len() >= nb * quant_bytes(Q8));
        for b in 0..nb {
            // SAFETY: block b < nb of both buffers (asserted above).
            unsafe {
                let q = quants.as_ptr().add(b * qb);
                let w = if kd == Q5 {
                    weights::<Q5>(q)
                } else {
                    weights::<Q4>(q)
                };
                let o = out.as_mut_ptr().add(b * quant_bytes(Q8));
                for (g, wg) in w.iter().enumerate() {
                    for (h, v) in wg.iter().enumerate() {
                        _mm256_storeu_si256(o.add(64 * g + 32 * h) as *mut __m256i, *v);
                    }
                }
            }
        }
    }

    /// One 16-row group against `r ≤ 4` activation rows, as [`super::avx512`]'s `group`
    /// (`kd`: Q4_0, Q5_0, Q8_0 or U8).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the slices hold what the shapes say.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group(
        kd: u8,
        r: usize,
        group: &[u8],
        scale_bytes: usize,
        nb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        cor: &[i32],
        prefetch: Prefetch,
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        assert!((1..=super::AVX2_BATCH).contains(&r) && acts.len() >= (r - 1) * rb + nb * Q8_0_BYTES);
        assert!(dy.len() >= (r - 1) * nb + nb && cor.len() >= (r - 1) * nb + nb);
        assert!(group.len() >= scale_bytes + nb * quant_bytes(kd));
        macro_rules! rows {
            ($k:expr) => {
                match r {
                    // SAFETY (each arm): as this function's contract, checked above.
                    1 => unsafe { kernel::<$k, 1>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    2 => unsafe { kernel::<$k, 2>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    3 => unsafe { kernel::<$k, 3>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                    _ => unsafe { kernel::<$k, 4>(group, scale_bytes, nb, acts, rb, dy, cor, prefetch, out) },
                }
            };
        }
        match kd {
            Q4 => rows!(Q4),
            Q5 => rows!(Q5),
            U8 => rows!(U8),
            _ => rows!(Q8),
        }
    }

    /// The kernel of [`group`] for kind `K` and `R` activation rows.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn kernel<const K: u8, const R: usize>(
        group: &[u8],
        scale_bytes: usize,
        nb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        cor: &[i32],
        prefetch: Prefetch,
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        let qb = quant_bytes(K);
        let base = group.as_ptr();
        let ap = acts.as_ptr();
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..nb {
            // SAFETY: block b < nb of the group (asserted by the caller); the prefetch is a hint.
            let (dx, w) = unsafe {
                let q = base.add(scale_bytes + b * qb);
                let p = prefetch.at.wrapping_add(b * prefetch.step);
                for l in (0..prefetch.step).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l) as *const i8);
                }
                let s = base.add(b * 32);
                let dx = [
                    _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i)),
                    _mm256_cvtph_ps(_mm_loadu_si128(s.add(16) as *const __m128i)),
                ];
                (dx, weights::<K>(q))
            };
            // Q8_0: |w| once for every activation row.
            let mut mag = w;
            if K == Q8 {
                for mg in mag.iter_mut() {
                    for v in mg.iter_mut() {
                        *v = _mm256_abs_epi8(*v);
                    }
                }
            }
            for j in 0..R {
                // SAFETY: block b < nb of activation row j < R (asserted by the caller).
                let y = unsafe { ap.add(j * rb + b * Q8_0_BYTES + 2) };
                let mut s = [_mm256_setzero_si256(); 2];
                if K == Q8 {
                    for (g, (wg, mg)) in w.iter().zip(&mag).enumerate() {
                        // SAFETY: four bytes of the block's 32 quants.
                        let a = _mm256_set1_epi32(unsafe { (y.add(4 * g) as *const i32).read_unaligned() });
                        for h in 0..2 {
                            let p = _mm256_maddubs_epi16(mg[h], _mm256_sign_epi8(a, wg[h]));
                            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p, ones));
                        }
                    }
                } else {
                    // Unsigned values of at most 31: four vectors' pair sums (each at most
                    // 2 · 31 · 128) add up in 16 bits before widening.
                    for (q, wq) in w.chunks_exact(4).enumerate() {
                        let mut t = [_mm256_setzero_si256(); 2];
                        for (g, wg) in wq.iter().enumerate() {
                            // SAFETY: four bytes of the block's 32 quants.
                            let a = unsafe { (y.add(16 * q + 4 * g) as *const i32).read_unaligned() };
                            let a = _mm256_set1_epi32(a);
                            for h in 0..2 {
                                t[h] = _mm256_add_epi16(t[h], _mm256_maddubs_epi16(wg[h], a));
                            }
                        }
                        for h in 0..2 {
                            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(t[h], ones));
                        }
                    }
                }
                let c = _mm256_set1_epi32(if K == Q8 { 0 } else { cor[j * nb + b] });
                let d = _mm256_set1_ps(dy[j * nb + b]);
                for h in 0..2 {
                    let sh = _mm256_cvtepi32_ps(_mm256_sub_epi32(s[h], c));
                    acc[j][h] = _mm256_fmadd_ps(_mm256_mul_ps(dx[h], d), sh, acc[j][h]);
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: out[j] holds 16 floats.
            unsafe {
                _mm256_storeu_ps(out[j].as_mut_ptr(), a[0]);
                _mm256_storeu_ps(out[j].as_mut_ptr().add(8), a[1]);
            }
        }
    }

    /// One 16-row Q4_K group against `r ≤ 4` Q8_K activation rows, as [`super::avx512`]'s
    /// `group_q4_k` (the same integer sums per sub-block and the same float order).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the slices hold what the shapes say.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group_q4_k(
        r: usize,
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        sums: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        assert!((1..=super::AVX2_BATCH).contains(&r) && acts.len() >= (r - 1) * rb + nsb * Q8_K_BYTES);
        assert!(dy.len() >= (r - 1) * nsb + nsb && sums.len() >= 8 * ((r - 1) * nsb + nsb));
        assert!(group.len() >= nsb * super::K4_BYTES);
        // SAFETY (each arm): as this function's contract, checked above.
        unsafe {
            match r {
                1 => kernel_q4_k::<1>(group, nsb, acts, rb, dy, sums, out),
                2 => kernel_q4_k::<2>(group, nsb, acts, rb, dy, sums, out),
                3 => kernel_q4_k::<3>(group, nsb, acts, rb, dy, sums, out),
                _ => kernel_q4_k::<4>(group, nsb, acts, rb, dy, sums, out),
            }
        }
    }

    /// The kernel of [`group_q4_k`] for `R` activation rows; `[h]` is the half of rows
    /// `8 h .. 8 h + 8`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn kernel_q4_k<const R: usize>(
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        sums: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        let m4 = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut accm = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..nsb {
            // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
            // the caller); the prefetch is a hint.
            unsafe {
                let x = group.as_ptr().add(b * super::K4_BYTES);
                for l in (0..super::K4_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(super::PREFETCH + l) as *const i8);
                }
                let half = |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(x.add(at) as *const __m128i));
                let (d, dmin) = ([half(0), half(16)], [half(32), half(48)]);
                let mut isum = [[_mm256_setzero_si256(); 2]; R];
                let mut msum = [[_mm256_setzero_si256(); 2]; R];
                for j in 0..4 {
                    let mut slo = [[_mm256_setzero_si256(); 2]; R];
                    let mut shi = [[_mm256_setzero_si256(); 2]; R];
                    for g in 0..8 {
                        for h in 0..2 {
                            let q =
                                _mm256_loadu_si256(x.add(320 + 64 * (8 * j + g) + 32 * h) as *const __m256i);
                            let lo = _mm256_and_si256(q, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                            for r in 0..R {
                                let y = acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 64 * j + 4 * g);
                                let y0 = _mm256_set1_epi32((y as *const i32).read_unaligned());
                                let y1 = _mm256_set1_epi32((y.add(32) as *const i32).read_unaligned());
                                let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), ones);
                                let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), ones);
                                slo[r][h] = _mm256_add_epi32(slo[r][h], plo);
                                shi[r][h] = _mm256_add_epi32(shi[r][h], phi);
                            }
                        }
                    }
                    // Sub-block scales and mins of the 16 rows, as i32 per half.
                    let bytes = |at: usize, h: usize| {
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(at + 8 * h) as *const __m128i))
                    };
                    for h in 0..2 {
                        let (s0, s1) = (bytes(64 + 16 * (2 * j), h), bytes(64 + 16 * (2 * j + 1), h));
                        let (m0, m1) = (bytes(192 + 16 * (2 * j), h), bytes(192 + 16 * (2 * j + 1), h));
                        for r in 0..R {
                            let bs = &sums[(r * nsb + b) * 8..];
                            isum[r][h] = _mm256_add_epi32(
                                isum[r][h],
                                _mm256_add_epi32(
                                    _mm256_mullo_epi32(slo[r][h], s0),
                                    _mm256_mullo_epi32(shi[r][h], s1),
                                ),
                            );
                            msum[r][h] = _mm256_add_epi32(
                                msum[r][h],
                                _mm256_add_epi32(
                                    _mm256_mullo_epi32(m0, _mm256_set1_epi32(bs[2 * j])),
                                    _mm256_mullo_epi32(m1, _mm256_set1_epi32(bs[2 * j + 1])),
                                ),
                            );
                        }
                    }
                }
                for r in 0..R {
                    let yd = _mm256_set1_ps(dy[r * nsb + b]);
                    for h in 0..2 {
                        acc[r][h] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum[r][h]),
                            _mm256_mul_ps(d[h], yd),
                            acc[r][h],
                        );
                        accm[r][h] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(msum[r][h]),
                            _mm256_mul_ps(dmin[h], yd),
                            accm[r][h],
                        );
                    }
                }
            }
        }
        for r in 0..R {
            for h in 0..2 {
                // SAFETY: out[r] holds 16 floats.
                unsafe {
                    _mm256_storeu_ps(
                        out[r].as_mut_ptr().add(8 * h),
                        _mm256_sub_ps(acc[r][h], accm[r][h]),
                    )
                };
            }
        }
    }

    /// One 16-row Q6_K group against `r ≤ 4` Q8_K activation rows, as [`super::avx512`]'s
    /// `group_q6_k` (the same i32 lane sums and the same float order).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the slices hold what the shapes say.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group_q6_k(
        r: usize,
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        nbs: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        assert!((1..=super::AVX2_BATCH).contains(&r) && acts.len() >= (r - 1) * rb + nsb * Q8_K_BYTES);
        assert!(dy.len() >= (r - 1) * nsb + nsb && nbs.len() >= 8 * ((r - 1) * nsb + nsb));
        assert!(group.len() >= nsb * super::K6_BYTES);
        // SAFETY (each arm): as this function's contract, checked above.
        unsafe {
            match r {
                1 => kernel_q6_k::<1>(group, nsb, acts, rb, dy, nbs, out),
                2 => kernel_q6_k::<2>(group, nsb, acts, rb, dy, nbs, out),
                3 => kernel_q6_k::<3>(group, nsb, acts, rb, dy, nbs, out),
                _ => kernel_q6_k::<4>(group, nsb, acts, rb, dy, nbs, out),
            }
        }
    }

    /// The kernel of [`group_q6_k`] for `R` activation rows, the AVX-512 one per half of 8 rows
    /// (`acc[h]`: rows `8 h .. 8 h + 8`): per lane `l`, `vpmaddubsw` then `vpmaddwd` with the
    /// duplicated i16 scale for `Σ_j scale · (q · y)`, `vpmaddwd` of `32 · scale` with the
    /// negated bsum pair, the lane's own fused multiply-add, the lanes summed in the same tree.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn kernel_q6_k<const R: usize>(
        group: &[u8],
        nsb: usize,
        acts: &[u8],
        rb: usize,
        dy: &[f32],
        nbs: &[i32],
        out: &mut [[f32; PACK_ROWS]; 8],
    ) {
        use crate::quant::Q8_K_BYTES;
        // vpshufb patterns putting a pair's first (second) i16 in both halves of each i32.
        let dup = [
            _mm256_setr_epi8(
                0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
                13, 12, 13,
            ),
            _mm256_setr_epi8(
                2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10,
                11, 14, 15, 14, 15,
            ),
        ];
        let m6 = _mm256_set1_epi8(0x3f);
        let mut acc = [[[_mm256_setzero_ps(); 8]; R]; 2];
        for b in 0..nsb {
            // SAFETY: super-block b < nsb of the group and of each activation row (asserted by
            // the caller); the prefetch is a hint.
            unsafe {
                let x = group.as_ptr().add(b * super::K6_BYTES);
                for l in (0..super::K6_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(super::PREFETCH + l) as *const i8);
                }
                let q = x.add(320);
                for (h, acc) in acc.iter_mut().enumerate() {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(x.add(16 * h) as *const __m128i));
                    // Per pair p, the 8 rows' (scale[2 p], scale[2 p + 1]) as two i16 in an i32.
                    let pairs: [__m256i; 8] = std::array::from_fn(|p| {
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(64 + 32 * p + 16 * h) as *const __m128i))
                    });
                    for (u, &dup_u) in dup.iter().enumerate() {
                        // Lanes 4 u .. 4 u + 4 take sub-block 2 j + u's scale in chunk j.
                        let sc: [__m256i; 8] = std::array::from_fn(|j| _mm256_shuffle_epi8(pairs[j], dup_u));
                        for l in 4 * u..4 * u + 4 {
                            let mut s = [_mm256_setzero_si256(); R];
                            for hj in 0..2 {
                                let v: [__m256i; 4] = {
                                    let line = |m: usize| {
                                        let at = 64 * (6 * l + 3 * hj + m) + 32 * h;
                                        _mm256_loadu_si256(q.add(at) as *const __m256i)
                                    };
                                    let (l0, l1, l2) = (line(0), line(1), line(2));
                                    // The top two bits of l0, l1, l2 alone (no bit crosses a
                                    // byte in the 16-bit shifts below), to bits 0-1, 2-3, 4-5.
                                    let top = |l: __m256i| _mm256_andnot_si256(m6, l);
                                    let t = _mm256_or_si256(
                                        _mm256_or_si256(
                                            _mm256_srli_epi16::<6>(top(l0)),
                                            _mm256_srli_epi16::<4>(top(l1)),
                                        ),
                                        _mm256_srli_epi16::<2>(top(l2)),
                                    );
                                    [
                                        _mm256_and_si256(l0, m6),
                                        _mm256_and_si256(l1, m6),
                                        _mm256_and_si256(l2, m6),
                                        t,
                                    ]
                                };
                                for (m, &w) in v.iter().enumerate() {
                                    let j = 4 * hj + m;
                                    for (r, sr) in s.iter_mut().enumerate() {
                                        let y =
                                            acts.as_ptr().add(r * rb + b * Q8_K_BYTES + 4 + 32 * j + 4 * l);
                                        let y = _mm256_set1_epi32((y as *const i32).read_unaligned());
                                        // Pairs of q · y are at most 2 · 63 · 128 (no saturation),
                                        // times the scale at most 2 · 16128 · 128 in i32.
                                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), sc[j]);
                                        *sr = _mm256_add_epi32(*sr, p);
                                    }
                                }
                            }
                            let off = _mm256_slli_epi16::<5>(pairs[l]);
                            for (r, sr) in s.iter().enumerate() {
                                let i = r * nsb + b;
                                let o = _mm256_madd_epi16(off, _mm256_set1_epi32(nbs[8 * i + l]));
                                let si = _mm256_add_epi32(*sr, o);
                                let dd = _mm256_mul_ps(d, _mm256_set1_ps(dy[i]));
                                acc[r][l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), dd, acc[r][l]);
                            }
                        }
                    }
                }
            }
        }
        for (h, ah) in acc.iter().enumerate() {
            for (r, a) in ah.iter().enumerate() {
                let sum = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                    _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
                );
                // SAFETY: out[r] holds 16 floats.
                unsafe { _mm256_storeu_ps(out[r].as_mut_ptr().add(8 * h), sum) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_row, XorShift};

    /// Packs random `wtype` matrices of each shape and checks every product of `m` activation
    /// rows (for each `m`) against `want(row bytes, activations, activation row, k)` bit for bit.
    fn check_packed(
        wtype: WeightType,
        seed: u64,
        shapes: &[(usize, usize)],
        ms: &[usize],
        want: impl Fn(&[u8], &QuantizedActivations, usize, usize) -> f32,
    ) {
        let mut rng = XorShift::new(seed);
        let pool = ThreadPool::new(2);
        for &(rows, k) in shapes {
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wtype, k)).collect();
            let p = PackedMatrix::pack_anywhere(wtype, &w, rows, k).expect("packs");
            let rb = wtype.row_bytes(k);
            let mut scratch = PackedActs::new();
            for &m in ms {
                let x = rng.vec(m * k);
                let mut act = QuantizedActivations::new();
                act.quantize_into(wtype, &x, k);
                let kd = kind(wtype).expect("packed kind");
                let kernels: Vec<Kernels> = Kernels::runnable().into_iter().filter(|k| k.cover(kd)).collect();
                assert!(!kernels.is_empty(), "no kernels here cover {wtype:?}");
                for &kernels in &kernels {
                    let mut out = vec![f32::NAN; m * rows];
                    matmul_packed_with(kernels, &p, &act, &mut out, &mut scratch, &pool);
                    for i in 0..m {
                        for r in 0..rows {
                            let e = want(&w[r * rb..(r + 1) * rb], &act, i, k);
                            let g = out[i * rows + r];
                            assert_eq!(
                                g.to_bits(),
                                e.to_bits(),
                                "{kernels:?} {wtype:?} {rows}x{k} m={m} act {i} row {r}: {g} vs {e}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn several_products_at_once_equal_each_alone_bit_for_bit() {
        if !PackedMatrix::available() {
            berth_formats::test_skip::skip_optional("packed kernels: this CPU lacks AVX2");
            return;
        }
        let mut rng = XorShift::new(37);
        let pool = ThreadPool::new(2);
        let k = 512;
        let mats: Vec<(WeightType, PackedMatrix)> = [
            (WeightType::Q5_0, 48),
            (WeightType::Q8_0, 16),
            (WeightType::Q4_K, 32),
        ]
        .into_iter()
        .map(|(t, rows)| {
            let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, t, k)).collect();
            (t, PackedMatrix::pack(t, &w, rows, k).expect("packs"))
        })
        .collect();
        for m in [1usize, 7] {
            let x = rng.vec(m * k);
            let acts: Vec<QuantizedActivations> = mats
                .iter()
                .map(|(t, _)| {
                    let mut a = QuantizedActivations::new();
                    a.quantize_into(*t, &x, k);
                    a
                })
                .collect();
            let mut alone: Vec<Vec<f32>> = Vec::new();
            for ((_, p), a) in mats.iter().zip(&acts) {
                let mut out = vec![f32::NAN; m * p.rows];
                matmul_packed(p, a, &mut out, &mut PackedActs::new(), &pool);
                alone.push(out);
            }
            let mut outs: Vec<Vec<f32>> = mats.iter().map(|(_, p)| vec![f32::NAN; m * p.rows]).collect();
            let mut scratch: Vec<PackedActs> = mats.iter().map(|_| PackedActs::new()).collect();
            let items = mats
                .iter()
                .zip(&acts)
                .zip(outs.iter_mut().zip(scratch.iter_mut()))
                .map(|(((_, p), a), (o, s))| (p, a, o.as_mut_slice(), s));
            matmul_packed_many(items, &pool);
            for (got, want) in outs.iter().zip(&alone) {
                let (g, w): (Vec<u32>, Vec<u32>) = (
                    got.iter().map(|v| v.to_bits()).collect(),
                    want.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(g, w, "m={m}");
            }
        }
    }

    #[test]
    fn packed_products_equal_the_reference_order_bit_for_bit() {
        let here = Kernels::runnable();
        if !here.contains(&Kernels::Avx512) {
            berth_formats::test_skip::skip_optional("packed kernels: this CPU lacks AVX-512 VNNI");
        }
        if here.is_empty() {
            berth_formats::test_skip::skip_optional("packed kernels: this CPU lacks AVX2 too");
            return;
        }
        for (seed, wtype) in [
            (31, WeightType::Q4_0),
            (32, WeightType::Q5_0),
            (33, WeightType::Q8_0),
        ] {
            let shapes = [(16, 32), (48, 896), (32, 4864)];
            check_packed(wtype, seed, &shapes, &[1, 3, 8, 11, 16, 21], |row, act, i, k| {
                let arb = ActFormat::Q8_0.row_bytes(k);
                reference_dot(wtype, row, &act.bytes()[i * arb..(i + 1) * arb], k)
            });
        }
    }

    #[test]
    fn packed_q4_k_equals_the_single_row_kernel_bit_for_bit() {
        // The AVX2 table's Q4_K single row is the order the packed kernels keep.
        let Some(single) = crate::dot::DotTable::by_name("avx2") else {
            berth_formats::test_skip::skip_optional("packed Q4_K kernels: this CPU lacks AVX2");
            return;
        };
        let wtype = WeightType::Q4_K;
        check_packed(
            wtype,
            34,
            &[(16, 256), (32, 2048)],
            &[1, 3, 4, 9],
            |row, act, i, k| single.vec_dot(wtype, row, act.row(i), k),
        );
    }

    #[test]
    fn packed_q6_k_equals_the_single_row_kernel_bit_for_bit() {
        // The AVX2 table's Q6_K single row is the order the packed kernels keep (AVX-512's
        // single row equals it, checked too where it runs).
        let Some(single) = crate::dot::DotTable::by_name("avx2") else {
            berth_formats::test_skip::skip_optional("packed Q6_K kernels: this CPU lacks AVX2");
            return;
        };
        let wide = crate::dot::DotTable::by_name("avx512");
        let wtype = WeightType::Q6_K;
        check_packed(
            wtype,
            35,
            &[(16, 256), (48, 768), (32, 2048)],
            &[1, 2, 3, 4, 5, 8, 9, 13],
            |row, act, i, k| {
                let e = single.vec_dot(wtype, row, act.row(i), k);
                if let Some(wide) = wide {
                    assert_eq!(wide.vec_dot(wtype, row, act.row(i), k).to_bits(), e.to_bits());
                }
                e
            },
        );
    }

    #[test]
    fn the_q6_k_reference_order_is_the_single_row_kernels() {
        let mut rng = XorShift::new(36);
        let k = 1024;
        for _ in 0..8 {
            let row = random_row(&mut rng, WeightType::Q6_K, k);
            let act = QuantizedActivations::quantize(WeightType::Q6_K, &rng.vec(k));
            let g = reference_dot(WeightType::Q6_K, &row, act.bytes(), k);
            let e = crate::dot::DotTable::scalar().vec_dot(WeightType::Q6_K, &row, act.row(0), k);
            assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
            if let Some(t) = crate::dot::DotTable::by_name("avx2") {
                let e = t.vec_dot(WeightType::Q6_K, &row, act.row(0), k);
                assert_eq!(g.to_bits(), e.to_bits(), "{g} vs {e}");
            }
        }
    }

    #[test]
    fn the_reference_order_is_close_to_the_scalar_dot() {
        let mut rng = XorShift::new(32);
        for wtype in [WeightType::Q4_0, WeightType::Q5_0, WeightType::Q8_0] {
            let k = 896;
            let row = random_row(&mut rng, wtype, k);
            let act = QuantizedActivations::quantize(wtype, &rng.vec(k));
            let e = crate::dot::DotTable::scalar().vec_dot(wtype, &row, act.row(0), k);
            let g = reference_dot(wtype, &row, act.bytes(), k);
            assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{wtype:?}: {g} vs {e}");
        }
    }

    #[test]
    fn packing_declines_what_it_does_not_cover() {
        let w = vec![0u8; 16 * WeightType::Q5_K.row_bytes(256)];
        assert!(PackedMatrix::pack_anywhere(WeightType::Q4_K, &vec![0u8; 16 * 144], 16, 256).is_some());
        assert!(PackedMatrix::pack_anywhere(WeightType::Q6_K, &vec![0u8; 16 * 210], 16, 256).is_some());
        assert!(PackedMatrix::pack_anywhere(WeightType::Q6_K, &vec![0u8; 16 * 210], 16, 128).is_none());
        assert!(PackedMatrix::pack_anywhere(WeightType::Q5_K, &w, 16, 256).is_none());
        let w = vec![0u8; 15 * WeightType::Q8_0.row_bytes(32)];
        assert!(PackedMatrix::pack_anywhere(WeightType::Q8_0, &w, 15, 32).is_none());
    }
}
