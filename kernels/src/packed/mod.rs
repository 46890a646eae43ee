//! Weights repacked into 16-row interleaved blocks (by the runtime, when a model loads), and
//! their matrix product.
//!
//! A [`PackedMatrix`] holds a Q4_0, Q5_0, Q8_0 or MXFP4 matrix as groups of 16 rows. Per group
//! and block of 32 columns it stores the 16 rows' scales (f16, side by side; MXFP4 its E8M0
//! exponent bytes) and their quants as
//! unsigned bytes interleaved four columns at a time, so one 64-byte load feeds 16 rows and
//! one `vpdpbusd` against four broadcast activation bytes advances all 16 of them. The weight
//! offset (8, 16 or 128; MXFP4's codes are looked up as their doubled values plus 12) is taken
//! back once per block with the activation block's sum, which
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
//! Two kernel sets run this layout, chosen once at run time (and capped by `BERTH_KERNELS`),
//! each a file with its table of group kernels (`avx512.rs`, `avx2.rs`), called through one
//! checked path here: AVX-512 F/BW/VL + VNNI and AVX2 + FMA + F16C, both for every kind but
//! MXFP4 (AVX-512 only: under AVX2 it keeps the unpacked kernels), AVX2
//! with each 64-byte line taken as two halves of 8 rows, `vpmaddubsw` + `vpmaddwd` standing in
//! for `vpdpbusd`. Both give the same bits. Without AVX2 (or under `BERTH_KERNELS=scalar`)
//! [`PackedMatrix::pack`] returns None and the unpacked tables stay the path.
//!
//! From a few activation rows on, a Q4_0/Q5_0 group is unpacked once per product to bytes in
//! Q8_0's layout (the same integer sums). A kernel asks for the next group's bytes while it
//! computes (the K-quant kernels below four rows, where a product is bound by memory); from
//! eight rows on, the AVX-512 set takes groups of Q8_0's layout two at a time instead
//! (`Plan::run_pair`), each activation broadcast serving both.

use crate::dot::QuantizedActivations;
use crate::pages::PageBuf;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;
use crate::pool::ThreadPool;
use crate::quant::{
    e8m0_to_f32_half, f16_to_f32, q6_quad, rd_f32, unpack_scales_mins_k4, ActFormat, WeightType,
    KVALUES_MXFP4, MXFP4_BYTES, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES, QK,
    QK_K,
};

/// Rows per interleaved group.
pub const PACK_ROWS: usize = 16;

/// Zeroed storage for `groups` groups of `group_bytes` (a multiple of 64, so groups start on
/// cache lines), each filled by `fill(group, bytes)`, the groups split over the machine's cores.
/// Large matrices get huge pages ([`PageBuf`]).
fn fill_groups(groups: usize, group_bytes: usize, fill: impl Fn(usize, &mut [u8]) + Sync) -> PageBuf {
    let mut data = PageBuf::zeroed(groups * group_bytes);
    let bytes = data.as_mut_slice();
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

/// MXFP4 (see [`Q4`]): Q4_0's nibble lines, each code looked up as its doubled E2M1 value
/// plus [`offset`], and one E8M0 exponent byte per row and block in place of an f16 scale.
const MX: u8 = 40;

/// Bytes of one block's scales for 16 rows: f16 scales, or MXFP4's exponent bytes.
const fn scale_width(k: u8) -> usize {
    if k == MX {
        16
    } else {
        32
    }
}

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
        WeightType::Mxfp4 => Some(MX),
        _ => None,
    }
}

/// Bytes of one block's quants for 16 rows: Q8_0 8 lines, Q4_0 4 lines of nibbles, Q5_0 those
/// and a line of fifth bits; Q4_K and Q6_K their whole super-blocks ([`K4_BYTES`],
/// [`K6_BYTES`]: their groups have no separate scales).
///
/// Q5_0's fifth-bit line is bit-sliced: byte `4 lane + e` holds in bit `g` the fifth bit of
/// column `4 g + e` of row `lane`, so vector `g`'s bits sit at bit `g` of the bytes they
/// belong to. AVX-512 tests bit `g` into a mask; AVX2 shifts the line by `4 - g` and keeps
/// 0x10, two instructions a vector (a mask of 64 bits per vector took AVX2 nine).
const fn quant_bytes(k: u8) -> usize {
    match k {
        Q4 | MX => 256,
        Q5 => 320,
        K4 => K4_BYTES,
        K6 => K6_BYTES,
        _ => 512,
    }
}

/// What the stored unsigned value exceeds the weight by.
const fn offset(k: u8) -> i32 {
    match k {
        Q4 => 8,
        // MXFP4's doubled values run -12..=12.
        MX => 12,
        Q5 => 16,
        _ => 128,
    }
}

/// The packed layout's version: bytes a [`PackedMatrix`] kept elsewhere (a pack's cache of its
/// packed weights) are read back by [`PackedMatrix::from_packed_bytes`] only under the same
/// version. Raise it whenever a kind's group layout changes. Both kernel sets read the one
/// layout, so it does not depend on the set. (2: Q5_0's fifth bits bit-sliced.)
pub const LAYOUT_VERSION: u32 = 2;

/// Bytes per 16-row group of `rows` × `k` matrix of kind `kd`, or None when the layout does not
/// take that shape.
fn group_bytes_of(kd: u8, rows: usize, k: usize) -> Option<usize> {
    if rows == 0 || !rows.is_multiple_of(PACK_ROWS) || !k.is_multiple_of(QK) {
        return None;
    }
    match kd {
        K4 | K6 if !k.is_multiple_of(QK_K) => None,
        K4 => Some(k / QK_K * K4_BYTES),
        K6 => Some(k / QK_K * K6_BYTES),
        _ => {
            let nb = k / QK;
            Some((nb * scale_width(kd)).next_multiple_of(64) + nb * quant_bytes(kd))
        }
    }
}

/// A quantized matrix repacked into 16-row interleaved groups (see the module docs).
pub struct PackedMatrix {
    wtype: WeightType,
    rows: usize,
    k: usize,
    /// Bytes per group: the scales (`nb · 32`, rounded up to a line), then the quants.
    group_bytes: usize,
    data: PageBuf,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix({} {}x{})", self.wtype.name(), self.rows, self.k)
    }
}

/// The signed weights (and f16 scale bits) of block `b` of a GGUF row of kind `kd`.
fn block_values(kd: u8, row: &[u8], b: usize) -> (u16, [i8; QK]) {
    let mut v = [0i8; QK];
    if kd == MX {
        let x = &row[b * MXFP4_BYTES..(b + 1) * MXFP4_BYTES];
        for j in 0..16 {
            v[j] = KVALUES_MXFP4[(x[1 + j] & 0xf) as usize];
            v[j + 16] = KVALUES_MXFP4[(x[1 + j] >> 4) as usize];
        }
        // The exponent byte stands where the other kinds' f16 scale bits do.
        return (x[0] as u16, v);
    }
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

/// Dot product of GGUF weight `row` (Q4_0, Q5_0, Q8_0 or MXFP4) with Q8_0 activation row `act`
/// in the packed kernels' order: per block the exact integer sum, then
/// `acc = fma(dx · dy, sum, acc)` (MXFP4: `dx` the exponent's half, [`e8m0_to_f32_half`], and
/// the sum over the doubled values).
/// Q6_K (against a Q8_K row): the single-row kernels' order, see [`reference_dot_q6_k`].
pub fn reference_dot(wtype: WeightType, row: &[u8], act: &[u8], n: usize) -> f32 {
    if wtype == WeightType::Q6_K {
        return reference_dot_q6_k(row, act, n);
    }
    let kd = kind(wtype)
        .filter(|&k| k != K4)
        .expect("the reference order covers Q4_0, Q5_0, Q8_0, MXFP4 and Q6_K");
    let mut acc = 0.0f32;
    for b in 0..n / QK {
        let (d, v) = block_values(kd, row, b);
        let y = &act[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
        let sum: i32 = v
            .iter()
            .zip(&y[2..])
            .map(|(&w, &a)| w as i32 * a as i8 as i32)
            .sum();
        let dx = if kd == MX {
            e8m0_to_f32_half(d as u8)
        } else {
            f16_to_f32(d)
        };
        let dd = dx * f16_to_f32(u16::from_le_bytes([y[0], y[1]]));
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

/// One 16-row group (`args`) against `R` activation rows into `out[j][lane]` for `j < R`, where
/// `R` is the row count the kernel was looked up for ([`PackedTable::kernel`]).
///
/// # Safety
/// The CPU has the features of the kernel's set, and `args` holds what its shapes say (checked
/// once, in [`run_group`]).
type GroupKernel = unsafe fn(&GroupArgs, &mut [[f32; PACK_ROWS]; 8]);

/// Two consecutive 16-row groups of Q8_0's layout (`args.group` holds both, the second
/// `stride` bytes after the first) against `R` activation rows into `out[j][lane]`, lanes 16
/// on the second group's; each group's sums are its [`GroupKernel`]'s bit for bit.
///
/// # Safety
/// As [`GroupKernel`] (checked once, in [`run_pair`]).
type PairKernel = unsafe fn(&GroupArgs, usize, &mut [[f32; 2 * PACK_ROWS]; 8]);

/// What a [`GroupKernel`] reads: one 16-row group and the activation rows against it.
#[derive(Clone, Copy)]
struct GroupArgs<'a> {
    /// The group: its scales in the first `scale_bytes`, then `nb` blocks of [`quant_bytes`].
    group: &'a [u8],
    /// Bytes of scales before the quants (none for Q4_K and Q6_K).
    scale_bytes: usize,
    /// Blocks (Q4_K, Q6_K: super-blocks) per row.
    nb: usize,
    /// The first activation row's quantized bytes, the next ones `rb` bytes apart.
    acts: &'a [u8],
    /// Bytes per activation row.
    rb: usize,
    /// Per activation row and block, the activations' scale (`nb` apart).
    dy: &'a [f32],
    /// Per activation row and block, the offset correction (`_0` kinds, `nb` apart) or eight
    /// sums (Q4_K: 32-value sums, Q6_K: negated bsum pairs; `8 nb` apart).
    cor: &'a [i32],
    /// What the `_0` kernels prefetch meanwhile.
    prefetch: Prefetch,
}

/// One instruction set's packed kernels (a file per set: `avx512.rs`, `avx2.rs`), chosen once
/// ([`PackedTable::here`]).
#[derive(Clone, Copy)]
struct PackedTable {
    /// The set's name, as `BERTH_KERNELS` spells it.
    name: &'static str,
    /// Activation rows per kernel call for a kind (as run: an unpacked group's kind is
    /// [`PackedTable::expanded_kind`]).
    batch: fn(u8) -> usize,
    /// The kind whose kernel takes a Q4_0/Q5_0 group unpacked by [`PackedTable::expand`].
    expanded_kind: u8,
    /// Unpacks `nb` blocks of a Q4_0/Q5_0 group's quants (`kd`) into Q8_0's layout in `out`.
    ///
    /// # Safety
    /// The CPU has the set's features; `quants` holds `nb` blocks of `kd`, `out` `nb` of Q8_0
    /// (checked once, in [`expand_group`]).
    expand: unsafe fn(u8, &[u8], usize, &mut [u8]),
    /// The kernel for a kind and a number of activation rows, None past what the set covers.
    kernel: fn(u8, usize) -> Option<GroupKernel>,
    /// Activation rows per call of the pair kernels, 0 where the set has none.
    pair_batch: usize,
    /// The kernel taking two groups of [`PackedTable::expanded_kind`] at once for a number of
    /// activation rows (up to `pair_batch`), if the set has one.
    pair: fn(usize) -> Option<PairKernel>,
}

impl PackedTable {
    /// Every set this build has, best first, each with its level and whether this CPU runs it.
    fn candidates() -> Vec<(crate::KernelLevel, bool, Option<&'static PackedTable>)> {
        use crate::KernelLevel;
        vec![
            #[cfg(target_arch = "x86_64")]
            (
                KernelLevel::Avx512,
                crate::dot::avx512::supported(),
                Some(&avx512::TABLE),
            ),
            #[cfg(target_arch = "x86_64")]
            (
                KernelLevel::Avx2,
                KernelLevel::Avx2.supported(),
                Some(&avx2::TABLE),
            ),
            (KernelLevel::Scalar, true, None),
        ]
    }

    /// The best set this CPU and `BERTH_KERNELS` allow, if any, chosen once.
    fn here() -> Option<&'static PackedTable> {
        static HERE: OnceLock<Option<&'static PackedTable>> = OnceLock::new();
        *HERE.get_or_init(|| crate::select_table("packed", &Self::candidates()))
    }

    /// Every set this CPU can run, whatever `BERTH_KERNELS` says (for tests).
    #[cfg(test)]
    fn runnable() -> Vec<&'static PackedTable> {
        Self::candidates()
            .into_iter()
            .filter_map(|(_, ok, t)| t.filter(|_| ok))
            .collect()
    }

    /// Whether this set covers kind `kd`.
    fn cover(&self, kd: u8) -> bool {
        (self.kernel)(kd, 1).is_some()
    }
}

/// The kernel of `table` for kind `kd` and `r` activation rows.
fn group_kernel(table: &PackedTable, kd: u8, r: usize) -> GroupKernel {
    (table.kernel)(kd, r)
        .unwrap_or_else(|| panic!("{} packed kernels: none for kind {kd} and {r} rows", table.name))
}

/// Activation bytes per block and sums per block of kind `kd`'s activations.
fn act_layout(kd: u8) -> (usize, usize) {
    if kd == K4 || kd == K6 {
        (Q8_K_BYTES, 8)
    } else {
        (Q8_0_BYTES, 1)
    }
}

/// Checks that `m` activation rows (`rb` bytes apart, `nb` blocks each), their scales and
/// corrections hold what kind `kd`'s kernels read: the one check of every length a
/// [`GroupKernel`] reads beyond its group, made once per product ([`Plan::new`]) rather than
/// once per kernel call.
fn check_acts(kd: u8, m: usize, nb: usize, acts: &[u8], rb: usize, dy: &[f32], cor: &[i32]) {
    let (act_block, sums) = act_layout(kd);
    if m > 0 {
        assert!(
            acts.len() >= (m - 1) * rb + nb * act_block,
            "activations too short"
        );
    }
    assert!(
        dy.len() >= m * nb && cor.len() >= sums * m * nb,
        "activation scales too short"
    );
}

/// Runs `kernel` (kind `kd`) for `r` rows of `args`, whose activations [`check_acts`] checked
/// for at least `r` rows; checks the group.
fn run_group(kernel: GroupKernel, kd: u8, r: usize, args: &GroupArgs, out: &mut [[f32; PACK_ROWS]; 8]) {
    assert!((1..=8).contains(&r));
    assert!(args.group.len() >= args.scale_bytes + args.nb * quant_bytes(kd));
    // SAFETY: the kernel comes from a table selected (or listed by `runnable`) only where this
    // CPU has its features; the group's length is checked above and the activation rows' by
    // `check_acts` for the whole product (`Plan::new`).
    unsafe { kernel(args, out) }
}

/// Runs the pair kernel `kernel` for `r` rows of `args` (two groups `stride` bytes apart),
/// whose activations [`check_acts`] checked for at least `r` rows; checks the groups.
fn run_pair(
    kernel: PairKernel,
    r: usize,
    args: &GroupArgs,
    stride: usize,
    out: &mut [[f32; 2 * PACK_ROWS]; 8],
) {
    assert!((1..=8).contains(&r));
    assert!(stride >= args.scale_bytes + args.nb * quant_bytes(Q8));
    assert!(args.group.len() >= stride + args.scale_bytes + args.nb * quant_bytes(Q8));
    // SAFETY: as in `run_group`: a runnable table, the groups' lengths checked above.
    unsafe { kernel(args, stride, out) }
}

/// Unpacks a Q4_0/Q5_0 group's `nb` blocks of quants with `table`'s `expand`, checked.
fn expand_group(table: &PackedTable, kd: u8, quants: &[u8], nb: usize, out: &mut [u8]) {
    assert!(kd == Q4 || kd == Q5, "only Q4_0 and Q5_0 groups unpack");
    assert!(quants.len() >= nb * quant_bytes(kd) && out.len() >= nb * quant_bytes(Q8));
    // SAFETY: as in `run_group`: a runnable table, lengths checked above.
    unsafe { (table.expand)(kd, quants, nb, out) }
}

impl PackedMatrix {
    /// True when this CPU and `BERTH_KERNELS` allow packed kernels (AVX-512 VNNI: every packed
    /// kind; AVX2: all but MXFP4).
    pub fn available() -> bool {
        PackedTable::here().is_some()
    }

    /// True when `wtype` matrices are packed here ([`PackedMatrix::pack`] takes them).
    pub fn covers(wtype: WeightType) -> bool {
        PackedTable::here()
            .zip(kind(wtype))
            .is_some_and(|(t, kd)| t.cover(kd))
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
        group_bytes_of(kd, rows, k)?;
        if kd == K4 {
            return Self::pack_q4_k(w, rows, k);
        }
        if kd == K6 {
            return Self::pack_q6_k(w, rows, k);
        }
        let rb = wtype.row_bytes(k);
        assert!(w.len() >= rows * rb, "weight matrix too short");
        let nb = k / QK;
        let sw = scale_width(kd);
        let scale_bytes = (nb * sw).next_multiple_of(64);
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
                    if kd == MX {
                        scales[b * sw + lane] = x[0];
                    } else {
                        scales[b * sw + 2 * lane..][..2].copy_from_slice(&x[..2]);
                    }
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
                            let qs = match kd {
                                Q5 => &x[6..22],
                                MX => &x[1..17],
                                _ => &x[2..18],
                            };
                            for line in 0..4 {
                                q[line * 64 + lane * 4..][..4].copy_from_slice(&qs[4 * line..4 * line + 4]);
                            }
                            if kd == Q5 {
                                // Bit g of byte 4 lane + e: value 4 g + e's fifth bit.
                                let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
                                for grp in 0..8 {
                                    for e in 0..4 {
                                        q[256 + 4 * lane + e] |= (((qh >> (4 * grp + e)) & 1) as u8) << grp;
                                    }
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
        self.data.as_slice().len()
    }

    /// The packed bytes, as [`PackedMatrix::from_packed_bytes`] takes them back (valid under
    /// this [`LAYOUT_VERSION`] only).
    pub fn packed_bytes(&self) -> &[u8] {
        self.bytes()
    }

    /// Bytes the packed form of a `rows` × `k` matrix of `wtype` takes, or None when the layout
    /// does not take it (the type, or rows not whole groups).
    pub fn packed_len(wtype: WeightType, rows: usize, k: usize) -> Option<usize> {
        let kd = kind(wtype)?;
        Some(group_bytes_of(kd, rows, k)? * (rows / PACK_ROWS))
    }

    /// A matrix from bytes an earlier packing of the same rows made ([`PackedMatrix::packed_bytes`],
    /// kept in a cache): `read` fills a buffer of [`PackedMatrix::packed_len`] bytes. None when
    /// the kernels that run here do not take `wtype` or the shape; `read`'s error otherwise.
    /// The bytes are not checked: the caller answers for them being that packing's, under the
    /// same [`LAYOUT_VERSION`] (a cache checksums them).
    pub fn from_packed_bytes<E>(
        wtype: WeightType,
        rows: usize,
        k: usize,
        read: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Option<Result<PackedMatrix, E>> {
        if !Self::covers(wtype) {
            return None;
        }
        let group_bytes = group_bytes_of(kind(wtype)?, rows, k)?;
        let mut data = PageBuf::zeroed(group_bytes * (rows / PACK_ROWS));
        Some(read(data.as_mut_slice()).map(|()| PackedMatrix {
            wtype,
            rows,
            k,
            group_bytes,
            data,
        }))
    }

    fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Block `b` of row `r` as the GGUF bytes it was packed from (exactly those bytes), into
    /// `x` (one block of the weight type), so a matrix held only packed still reads row by row
    /// (a tied embedding that is also the LM head is held once).
    pub fn gguf_block(&self, r: usize, b: usize, x: &mut [u8]) {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        let kd = kind(self.wtype).expect("packed matrices hold packed kinds");
        let (lane, xb) = (r % PACK_ROWS, self.wtype.block_bytes());
        let group = &self.bytes()[r / PACK_ROWS * self.group_bytes..][..self.group_bytes];
        let x = &mut x[..xb];
        match kd {
            K4 => {
                let o = &group[b * K4_BYTES..(b + 1) * K4_BYTES];
                x[0..2].copy_from_slice(&o[2 * lane..2 * lane + 2]);
                x[2..4].copy_from_slice(&o[32 + 2 * lane..32 + 2 * lane + 2]);
                let sc: [u8; 8] = std::array::from_fn(|j| o[64 + 16 * j + lane]);
                let m: [u8; 8] = std::array::from_fn(|j| o[192 + 16 * j + lane]);
                x[4..16].copy_from_slice(&pack_scales_mins_k4(&sc, &m));
                for line in 0..32 {
                    x[16 + 4 * line..16 + 4 * line + 4]
                        .copy_from_slice(&o[320 + 64 * line + 4 * lane..][..4]);
                }
            }
            K6 => {
                let o = &group[b * K6_BYTES..(b + 1) * K6_BYTES];
                x[208..210].copy_from_slice(&o[2 * lane..2 * lane + 2]);
                for p in 0..8 {
                    x[192 + 2 * p..194 + 2 * p].copy_from_slice(&o[64 + 32 * p + 2 * lane..][..2]);
                }
                // The 6-bit values back from the lines (layout at [`K6_BYTES`]).
                let quants = &o[320..];
                let mut q = [0u8; QK_K];
                for l in 0..8 {
                    for e in 0..4 {
                        let at = 4 * lane + e;
                        for h in 0..2 {
                            let mut top = 0u8;
                            for m in 0..3 {
                                let byte = quants[64 * (6 * l + 3 * h + m) + at];
                                q[32 * (4 * h + m) + 4 * l + e] = byte & 63;
                                top |= (byte >> 6) << (2 * m);
                            }
                            q[32 * (4 * h + 3) + 4 * l + e] = top;
                        }
                    }
                }
                q6_k_bytes(&q, x);
            }
            _ => {
                let nb = self.k / QK;
                let sw = scale_width(kd);
                let scale_bytes = (nb * sw).next_multiple_of(64);
                let qb = quant_bytes(kd);
                if kd == MX {
                    x[0] = group[b * sw + lane];
                } else {
                    x[0..2].copy_from_slice(&group[b * sw + 2 * lane..][..2]);
                }
                let q = &group[scale_bytes + b * qb..scale_bytes + (b + 1) * qb];
                match kd {
                    Q8 => {
                        for grp in 0..8 {
                            for e in 0..4 {
                                x[2 + 4 * grp + e] = q[grp * 64 + lane * 4 + e] ^ 0x80;
                            }
                        }
                    }
                    _ => {
                        let at = match kd {
                            Q5 => 6,
                            MX => 1,
                            _ => 2,
                        };
                        for line in 0..4 {
                            x[at + 4 * line..at + 4 * line + 4]
                                .copy_from_slice(&q[line * 64 + lane * 4..][..4]);
                        }
                        if kd == Q5 {
                            let mut qh = 0u32;
                            for grp in 0..8 {
                                for e in 0..4 {
                                    qh |= (((q[256 + 4 * lane + e] >> grp) & 1) as u32) << (4 * grp + e);
                                }
                            }
                            x[2..6].copy_from_slice(&qh.to_le_bytes());
                        }
                    }
                }
            }
        }
    }

    /// Dequantizes row `r` into `out` (`k` floats), equal to dequantizing the GGUF row it was
    /// packed from: an embedding lookup on a matrix held only packed. Allocates nothing.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (per, xb) = (self.wtype.block_size(), self.wtype.block_bytes());
        let mut block = [0u8; Q6_K_BYTES]; // the largest packed block (Q4_K: 144)
        for (b, dst) in out[..self.k].chunks_exact_mut(per).enumerate() {
            self.gguf_block(r, b, &mut block);
            self.wtype.dequantize_row(&block[..xb], dst);
        }
    }
}

/// The 12 bytes of a Q4_K super-block's 6-bit sub-block scales and mins (the inverse of
/// [`unpack_scales_mins_k4`]).
fn pack_scales_mins_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4);
    }
    q
}

/// Writes the 256 6-bit values `q` into a Q6_K block's `ql` and `qh` bytes (the inverse of
/// [`q6_k_quants`]).
fn q6_k_bytes(q: &[u8; QK_K], x: &mut [u8]) {
    for n2 in 0..2 {
        for l in 0..32 {
            let v: [u8; 4] = std::array::from_fn(|k| q[128 * n2 + 32 * k + l]);
            x[64 * n2 + l] = (v[0] & 0xf) | ((v[2] & 0xf) << 4);
            x[64 * n2 + l + 32] = (v[1] & 0xf) | ((v[3] & 0xf) << 4);
            x[128 + 32 * n2 + l] = (v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6);
        }
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

/// What a kernel prefetches while it runs: at block `b`, the `step` bytes from `at + b · step`
/// (a hint: the addresses need not be valid).
#[derive(Clone, Copy)]
struct Prefetch {
    at: *const u8,
    step: usize,
}

impl Prefetch {
    /// Nothing (the runs of rows after a group's first: it has asked already).
    fn none() -> Prefetch {
        Prefetch {
            at: std::ptr::null(),
            step: 0,
        }
    }

    /// All of `next` (the group computed after this one), spread over this one's `nb` blocks.
    fn next(next: &[u8], nb: usize) -> Prefetch {
        Prefetch {
            at: next.as_ptr(),
            step: next.len().div_ceil(nb.max(1)).next_multiple_of(64),
        }
    }

    /// Asks for block `b`'s share (a hint: nothing is read, no address need be valid).
    #[inline(always)]
    fn block(&self, b: usize) {
        self.block_part(b, 0, 1);
    }

    /// Asks for part `i` of `parts` of block `b`'s share, so that a long block (a K-quant
    /// super-block) spreads its requests over its work rather than asking for all at its start.
    /// The K-quant kernels ask only for fewer than four activation rows: from four on a product
    /// is bound by arithmetic, and asking took AVX-512 Q4_K at 64 rows from 336 to 315 GMAC/s
    /// on a Zen 5.
    #[inline(always)]
    fn block_part(&self, b: usize, i: usize, parts: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let lines = self.step / 64;
            let (from, to) = (lines * i / parts, lines * (i + 1) / parts);
            let p = self.at.wrapping_add(b * self.step);
            for l in (64 * from..64 * to).step_by(64) {
                // SAFETY: a prefetch never faults and reads nothing.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.wrapping_add(l) as *const i8
                    )
                };
            }
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
    let table = PackedTable::here().expect("packed kernels need AVX-512 VNNI or AVX2");
    matmul_packed_with(table, p, act, out, scratch, pool);
}

/// [`matmul_packed`] with the given kernels.
fn matmul_packed_with(
    table: &'static PackedTable,
    p: &PackedMatrix,
    act: &QuantizedActivations,
    out: &mut [f32],
    scratch: &mut PackedActs,
    pool: &ThreadPool,
) {
    let plan = Plan::new(table, p, act, out, scratch);
    let per = plan.chunk_groups(plan.groups, pool.n_threads());
    pool.parallel_for(plan.groups.div_ceil(per), |c| {
        with_expanded(|expanded| plan.run_range(c * per, ((c + 1) * per).min(plan.groups), expanded))
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
    let table = PackedTable::here().expect("packed kernels need AVX-512 VNNI or AVX2");
    let mut plans: [Option<Plan<'a>>; MANY_MAX] = [None, None, None, None];
    // Activations already prepared for a kind (q/k/v and gate/up share theirs): their scratch.
    let mut prepared: [Option<(&'a QuantizedActivations, u8, &'a PackedActs)>; MANY_MAX] = [None; MANY_MAX];
    let mut items = items.into_iter();
    for (i, (p, act, out, scratch)) in (0..MANY_MAX).zip(&mut items) {
        let kd = Plan::checked_kind(table, p, act, out);
        let same = prepared[..i]
            .iter()
            .flatten()
            .find(|(a, k, _)| std::ptr::eq(*a, act) && *k == kd)
            .map(|&(_, _, s)| s);
        let scratch: &'a PackedActs = match same {
            Some(s) => s,
            None => {
                scratch.prepare(kd, act);
                scratch
            }
        };
        prepared[i] = Some((act, kd, scratch));
        plans[i] = Some(Plan::prepared(table, kd, p, act, out, scratch));
    }
    assert!(items.next().is_none(), "at most {MANY_MAX} matrices at once");
    let plans: &[Option<Plan<'_>>] = &plans;
    let total: usize = plans.iter().flatten().map(|p| p.groups).sum();
    let per = plans
        .iter()
        .flatten()
        .map(|p| p.chunk_groups(total, pool.n_threads()))
        .max()
        .unwrap_or(1);
    pool.parallel_for(total.div_ceil(per), |c| {
        with_expanded(|expanded| {
            // Groups from..to of the matrices' groups one after another.
            let (from, to) = (c * per, ((c + 1) * per).min(total));
            let mut first = 0;
            for plan in plans.iter().flatten() {
                let (a, b) = (from.max(first), to.min(first + plan.groups));
                if a < b {
                    plan.run_range(a - first, b - first, expanded);
                }
                first += plan.groups;
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
    table: &'static PackedTable,
    kd: u8,
    m: usize,
    rows: usize,
    groups: usize,
    group_bytes: usize,
    nb: usize,
    sums_per_block: usize,
    scale_bytes: usize,
    batch: usize,
    /// The kernel for `batch` rows and for the last, shorter run of rows (kind as run).
    kernels: (GroupKernel, GroupKernel),
    /// The pair kernels for full runs of `pair_batch` rows and for the last run, where groups go
    /// two at a time (see [`PAIR_MIN_ROWS`]).
    pairs: Option<(PairKernel, PairKernel)>,
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
        table: &'static PackedTable,
        p: &'a PackedMatrix,
        act: &'a QuantizedActivations,
        out: &'a mut [f32],
        scratch: &'a mut PackedActs,
    ) -> Plan<'a> {
        let kd = Plan::checked_kind(table, p, act, out);
        scratch.prepare(kd, act);
        Plan::prepared(table, kd, p, act, out, scratch)
    }

    /// Checks that `act` and `out` fit `p` and that `table` covers its kind; the kind.
    fn checked_kind(table: &PackedTable, p: &PackedMatrix, act: &QuantizedActivations, out: &[f32]) -> u8 {
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
            table.cover(kd),
            "{} kernels do not cover {}",
            table.name,
            p.wtype.name()
        );
        kd
    }

    /// [`Plan::new`] with `scratch` already prepared for `act` and the matrix's kind `kd` (as
    /// [`Plan::checked_kind`] returned it).
    fn prepared(
        table: &'static PackedTable,
        kd: u8,
        p: &'a PackedMatrix,
        act: &'a QuantizedActivations,
        out: &'a mut [f32],
        scratch: &'a PackedActs,
    ) -> Plan<'a> {
        let m = act.rows();
        // Blocks per row, and the activations' sums per block (Q4_K: one per 32-value
        // sub-block; Q6_K: one pair of 16-value sums per 32 values).
        let (nb, sums_per_block) = if kd == K4 || kd == K6 {
            (p.k / QK_K, 8)
        } else {
            (p.k / QK, 1)
        };
        // Several rows: each Q4_0/Q5_0 group is unpacked once to Q8_0's layout (the stored
        // unsigned values as bytes; the offset stays the kind's, in `cor`), so that the nibbles
        // are not unpacked again for every few rows, and eight rows share each weight load. The
        // integer sums, hence the results, are the same.
        let expand = (kd == Q4 || kd == Q5) && m >= EXPAND_MIN_ROWS;
        // Activation rows per kernel call: the set's choice for the kind as run.
        let run_kd = if expand { table.expanded_kind } else { kd };
        let batch = (table.batch)(run_kd);
        let full = batch.min(m).max(1);
        let last = if m.is_multiple_of(batch) { full } else { m % batch };
        let kernels = (
            group_kernel(table, run_kd, full),
            group_kernel(table, run_kd, last),
        );
        // Groups two at a time where the set has the kernel and the rows are many (the unpacked
        // Q4_0/Q5_0 groups and Q8_0's, both in Q8_0's layout).
        let pb = table.pair_batch;
        let pairs = if run_kd == table.expanded_kind && m >= PAIR_MIN_ROWS && pb > 0 {
            let last = if m.is_multiple_of(pb) { pb } else { m % pb };
            (table.pair)(pb).zip((table.pair)(last))
        } else {
            None
        };
        let rb = act.format().row_bytes(p.k);
        check_acts(kd, m, nb, act.bytes(), rb, &scratch.dy, &scratch.cor);
        Plan {
            table,
            kd,
            m,
            rows: p.rows,
            groups: p.rows / PACK_ROWS,
            group_bytes: p.group_bytes,
            nb,
            sums_per_block,
            scale_bytes: p.group_bytes - nb * quant_bytes(kd),
            batch,
            kernels,
            pairs,
            expand,
            rb,
            data: p.bytes(),
            acts: act.bytes(),
            dy: &scratch.dy[..],
            cor: &scratch.cor[..],
            out: OutPtr(out.as_mut_ptr()),
        }
    }

    /// Groups per parallel chunk, of `total` groups over `threads` threads: about four chunks a
    /// thread, an even count where groups go in pairs.
    fn chunk_groups(&self, total: usize, threads: usize) -> usize {
        let per = total.div_ceil(threads * 4).max(1);
        if self.pairs.is_some() {
            per.next_multiple_of(2)
        } else {
            per
        }
    }

    /// Computes groups `from..to`, two at a time where the plan has pair kernels.
    fn run_range(&self, from: usize, to: usize, expanded: &mut Vec<u8>) {
        let mut g = from;
        while g < to {
            if self.pairs.is_some() && g + 1 < to {
                self.run_pair(g, expanded);
                g += 2;
            } else {
                self.run(g, expanded);
                g += 1;
            }
        }
    }

    /// Computes groups `g` and `g + 1` (32 output columns) for every activation row with the
    /// pair kernels: each activation load serves both groups' rows. Bit for bit what
    /// [`Plan::run`] gives each group.
    fn run_pair(&self, g: usize, expanded: &mut Vec<u8>) {
        let (nb, scale_bytes, table) = (self.nb, self.scale_bytes, self.table);
        let pairs = self.pairs.expect("pair kernels");
        let gb = self.group_bytes;
        let (group, stride) = if self.expand {
            let stride = scale_bytes + nb * quant_bytes(Q8);
            expanded.resize(2 * stride, 0);
            for (h, dst) in expanded.chunks_exact_mut(stride).enumerate() {
                self.expand_into(g + h, dst);
            }
            (&expanded[..], stride)
        } else {
            (&self.data[g * gb..(g + 2) * gb], gb)
        };
        let batch = table.pair_batch;
        let mut i = 0;
        while i < self.m {
            let r = (self.m - i).min(batch);
            let mut res = [[0.0f32; 2 * PACK_ROWS]; 8];
            // Many rows are bound by arithmetic, not memory: no prefetch.
            let args = self.args_at(group, i, Prefetch::none());
            let kernel = if r == batch { pairs.0 } else { pairs.1 };
            run_pair(kernel, r, &args, stride, &mut res);
            self.store(i, g, &res[..r]);
            i += r;
        }
    }

    /// Computes group `g` (its 16 output columns) for every activation row; `expanded` is the
    /// calling thread's buffer for an unpacked group.
    fn run(&self, g: usize, expanded: &mut Vec<u8>) {
        let (nb, scale_bytes, table) = (self.nb, self.scale_bytes, self.table);
        let data = self.data;
        let mut group = &data[g * self.group_bytes..(g + 1) * self.group_bytes];
        let mut kd = self.kd;
        // The next group, asked for while this one runs (an unpacked group is in cache, so the
        // memory is free meanwhile). Read straight from memory, the hardware prefetchers alone
        // leave a single thread far below the bandwidth: asking took one Zen 5 thread streaming
        // `examples/headbench` 131072x1024 from 30 to 52 GB/s on Q5_0 and 36 to 39-44 on Q8_0
        // (AVX2 kernels: Q5_0 21 to 40; Gemma 3's Q8_0 head shape, 262144x640, 27 to 42-45),
        // and in parts over each super-block, Q4_K 24-26 to 47 and Q6_K 17 to 47-48 (AVX2 Q4_K
        // 18 to 41-42, Q6_K 25-26 to 35-36). (On a Zen 4, asking for the bytes a fixed 8 KiB
        // ahead had slowed Gemma 3's Q8_0 head from 28.5-29.5 to 19.5-20 GB/s; this scheme is
        // not yet measured there.)
        let next = data.get((g + 1) * self.group_bytes..(g + 2) * self.group_bytes);
        let prefetch = Prefetch::next(next.unwrap_or(&[]), nb);
        if !self.expand {
            // All of the group's scales now, before its quants: the blocks then read memory in
            // one forward sequence, which the hardware prefetchers follow (a scale line every
            // other block, behind the quants, halved a single thread's stream; see
            // [`prefetch_lines`]).
            prefetch_lines(&group[..scale_bytes]);
        }
        if self.expand {
            expanded.resize(scale_bytes + nb * quant_bytes(Q8), 0);
            self.expand_into(g, expanded);
            // The set's kernel of unpacked groups (AVX-512 takes Q8_0's bytes unsigned with the
            // offset in `cor` already; the AVX2 kernel of Q8_0 takes them signed, so it has a
            // kind of its own).
            (group, kd) = (&expanded[..], table.expanded_kind);
        }
        let mut i = 0;
        while i < self.m {
            let r = (self.m - i).min(self.batch);
            let mut res = [[0.0f32; PACK_ROWS]; 8];
            // The first run of rows asks for the next group; asking again for every run only
            // repeats it.
            let args = self.args_at(group, i, if i == 0 { prefetch } else { Prefetch::none() });
            let kernel = if r == self.batch.min(self.m) {
                self.kernels.0
            } else {
                self.kernels.1
            };
            run_group(kernel, kd, r, &args, &mut res);
            self.store(i, g, &res[..r]);
            i += r;
        }
    }

    /// Group `g` unpacked into `dst` in Q8_0's layout: its scales, then its quants as bytes.
    fn expand_into(&self, g: usize, dst: &mut [u8]) {
        let (nb, sb, gb) = (self.nb, self.scale_bytes, self.group_bytes);
        let src = &self.data[g * gb..(g + 1) * gb];
        dst[..sb].copy_from_slice(&src[..sb]);
        expand_group(self.table, self.kd, &src[sb..], nb, &mut dst[sb..]);
    }

    /// What a kernel reads for the activation rows from `i` against `group` (one group, or two
    /// for a pair kernel).
    fn args_at<'g>(&'g self, group: &'g [u8], i: usize, prefetch: Prefetch) -> GroupArgs<'g> {
        let nb = self.nb;
        GroupArgs {
            group,
            scale_bytes: self.scale_bytes,
            nb,
            acts: &self.acts[i * self.rb..],
            rb: self.rb,
            dy: &self.dy[i * nb..],
            cor: &self.cor[i * nb * self.sums_per_block..],
            prefetch,
        }
    }

    /// Writes a kernel's results for activation rows `i..i + res.len()` into the output columns
    /// from group `g`'s first (`N`: 16 for a group, 32 for a pair).
    fn store<const N: usize>(&self, i: usize, g: usize, res: &[[f32; N]]) {
        assert!(i + res.len() <= self.m && (g * PACK_ROWS + N) <= self.rows);
        for (di, vals) in res.iter().enumerate() {
            for (lane, &v) in vals.iter().enumerate() {
                // SAFETY: i + di < m and g * 16 + lane < rows (asserted above), so the index is
                // < out.len() (asserted in `Plan::checked_kind`); one call alone writes these
                // groups' columns.
                unsafe { *self.out.0.add((i + di) * self.rows + g * PACK_ROWS + lane) = v };
            }
        }
    }
}

/// Asks for every cache line of `bytes` now (a hint: nothing is read). A group's block scales
/// come before its quants; read a line at a time as the blocks go, they send the access
/// stream back by up to a group every other block, and on a 2-core Zen 4 a single thread then
/// streamed a Q8_0 matrix at 13.5-14 GB/s where the same loads with the scale lines asked for
/// first ran at 26-28 (a plain read: 29-30), huge pages on (examples/stream_order).
#[inline]
fn prefetch_lines(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for l in (0..bytes.len()).step_by(64) {
        // SAFETY: a prefetch never faults and reads nothing; the address lies inside `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                bytes.as_ptr().add(l) as *const i8
            )
        };
    }
}

/// Activation rows from which Q4_0/Q5_0 groups are unpacked once per product (see
/// [`matmul_packed`]); `examples/headbench` measured Q5_0 4864x896 at 2 threads, direct against
/// unpacked: 163 / 124 GMAC/s at 5 rows, 94 / 173 at 6, 144 / 172 at 8, 149 / 186 at 64.
const EXPAND_MIN_ROWS: usize = 6;

/// Activation rows from which groups of Q8_0's layout go two at a time ([`Plan::run_pair`]):
/// a product of many rows is bound by arithmetic, in which every activation load then serves
/// two groups' weights.
const PAIR_MIN_ROWS: usize = 8;
