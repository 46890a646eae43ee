//! Dot products of one weight row (raw bytes of a [`WeightType`]) against an activation row
//! quantized once into the format that weight type wants ([`QuantizedActivations`]).
//!
//! Each kernel has a scalar reference in [`scalar`]; on x86_64 an integer-SIMD table is
//! selected once at first use from an ordered candidate list ([`DotTable::best`]): AVX-512
//! (F/BW/VL/DQ + VNNI; the AVX2 table with its hot entries replaced, equal to it bit for bit),
//! AVX2+FMA+F16C, scalar; `BERTH_KERNELS` caps the level ([`crate::kernel_level`]).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub mod scalar;

use crate::quant::{quantize_row_q8_0_into, quantize_row_q8_k_into, ActFormat, WeightType};
use std::sync::OnceLock;

/// A quantized-weight · quantized-activation kernel: `(weight row, activation row, n)`.
pub type QDotFn = fn(&[u8], &[u8], usize) -> f32;
/// A float-weight · f32-activation kernel: `(weight row bytes, activations, n)`.
pub type FDotFn = fn(&[u8], &[f32], usize) -> f32;

/// One implementation of every dot kernel, selected per CPU.
#[derive(Clone, Copy)]
pub struct DotTable {
    /// Name of the implementation (`"scalar"`, `"avx2"` or `"avx512"`).
    pub name: &'static str,
    /// Q4_0 · Q8_0.
    pub q4_0: QDotFn,
    /// Q5_0 · Q8_0.
    pub q5_0: QDotFn,
    /// Q8_0 · Q8_0.
    pub q8_0: QDotFn,
    /// MXFP4 · Q8_0.
    pub mxfp4: QDotFn,
    /// Q4_K · Q8_K.
    pub q4_k: QDotFn,
    /// Q5_K · Q8_K.
    pub q5_k: QDotFn,
    /// Q6_K · Q8_K.
    pub q6_k: QDotFn,
    /// F32 · f32.
    pub f32: FDotFn,
    /// F16 · f32.
    pub f16: FDotFn,
    /// BF16 · f32.
    pub bf16: FDotFn,
    /// Plain f32 slice dot product.
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    /// F32 weight rows × many f32 activation rows in register tiles that share their loads,
    /// each result bit for bit [`DotTable::f32`]'s.
    pub f32_rows: RowsF32Fn,
    /// Optional kernel for one quantized weight row against four activation rows
    /// (quantized-activation byte rows); returns None for types it does not cover.
    pub dot4: Option<Dot4Fn>,
    /// [`DotTable::dot4`] whose results equal [`DotTable::vec_dot`]'s bit for bit.
    pub dot4_gemv: Option<Dot4Fn>,
    /// Optional kernel for several weight rows against several activation rows; returns
    /// false for types and shapes it does not cover.
    pub tile: Option<TileFn>,
    /// Weight rows per [`DotTable::vec_dot_tile`] call (with four activation rows) that
    /// [`DotTable::tile`] covers best: 2, or 4 where the kernel also takes four.
    pub tile_rows: usize,
    /// Optional kernel for a run of consecutive weight rows against several (up to
    /// [`DotTable::MANY_MAX`]) quantized activation rows, each result bit for bit
    /// [`DotTable::vec_dot`]'s; returns false for types it does not cover.
    pub rows_many: Option<RowsManyFn>,
}

/// `nrows` consecutive weight rows (raw bytes) × quantized activation rows into
/// `out[r * acts.len() + j]`: `(wtype, weights, nrows, n, acts, out)`.
pub type RowsManyFn = fn(WeightType, &[u8], usize, usize, &[&[u8]], &mut [f32]) -> bool;

/// `nrows` consecutive F32 weight rows (raw bytes) × f32 activation rows (any number) into
/// `out[r * acts.len() + j]`: `(weights, nrows, n, acts, out)`.
pub type RowsF32Fn = fn(&[u8], usize, usize, &[&[f32]], &mut [f32]);

/// A register tile of `R` F32 weight rows × `C` activation rows, each `n` long: every result
/// bit for bit the table's single-row F32 kernel's.
#[cfg(target_arch = "x86_64")]
type F32TileFn<const R: usize, const C: usize> =
    unsafe fn([*const f32; R], [*const f32; C], usize) -> [[f32; C]; R];

/// A [`RowsF32Fn`] over an `R` × `C` tile kernel: activation rows `C` at a time (the last tile
/// padded with repeats of its last row, or, when under half full, `single` per pair), each
/// against every weight row `R` at a time (the last tile padded likewise). The activation tile
/// stays in L1 while the weight rows stream past it.
#[cfg(target_arch = "x86_64")]
fn f32_rows_tiled<const R: usize, const C: usize>(
    w: &[u8],
    nrows: usize,
    n: usize,
    acts: &[&[f32]],
    out: &mut [f32],
    tile: F32TileFn<R, C>,
    single: FDotFn,
) {
    let na = acts.len();
    let rb = 4 * n;
    assert!(w.len() >= nrows * rb, "weight rows too short");
    assert!(acts.iter().all(|a| a.len() >= n), "activation rows too short");
    assert!(out.len() >= nrows * na, "output too short");
    if nrows == 0 || n == 0 {
        out[..nrows * na].fill(0.0);
        return;
    }
    let wrow = |r: usize| w[r * rb..].as_ptr() as *const f32;
    let mut j0 = 0;
    while j0 < na {
        let cc = (na - j0).min(C);
        if 2 * cc < C {
            // Results are the single-row kernel's either way; padding would waste more.
            for r in 0..nrows {
                for j in j0..na {
                    out[r * na + j] = single(&w[r * rb..(r + 1) * rb], acts[j], n);
                }
            }
            return;
        }
        let xs: [*const f32; C] = std::array::from_fn(|c| acts[j0 + c.min(cc - 1)].as_ptr());
        let mut r0 = 0;
        while r0 < nrows {
            let rr = (nrows - r0).min(R);
            let ws: [*const f32; R] = std::array::from_fn(|i| wrow(r0 + i.min(rr - 1)));
            // SAFETY: every pointer starts a row of at least n f32 (asserted above); the tile
            // kernels load unaligned.
            let t = unsafe { tile(ws, xs, n) };
            for (i, tr) in t.iter().enumerate().take(rr) {
                out[(r0 + i) * na + j0..(r0 + i) * na + j0 + cc].copy_from_slice(&tr[..cc]);
            }
            r0 += rr;
        }
        j0 += cc;
    }
}

/// The shape checks of every [`RowsManyFn`]: false for a call none takes (no activation rows,
/// more than [`DotTable::MANY_MAX`], `n` not whole blocks); panics when a slice is shorter than
/// the shape says.
#[cfg(target_arch = "x86_64")]
fn many_call_fits(wtype: WeightType, w: &[u8], nrows: usize, n: usize, acts: &[&[u8]], out: &[f32]) -> bool {
    let na = acts.len();
    if na == 0 || na > DotTable::MANY_MAX || !n.is_multiple_of(wtype.block_size()) {
        return false;
    }
    assert!(w.len() >= nrows * wtype.row_bytes(n), "weight rows too short");
    let arb = wtype.act_format().row_bytes(n);
    assert!(acts.iter().all(|y| y.len() >= arb), "activation row too short");
    assert!(out.len() >= nrows * na, "output too short");
    true
}

/// Weight rows × quantized activation rows into `out[wi * acts.len() + r]`:
/// `(wtype, rows, acts, n, out)`.
pub type TileFn = fn(WeightType, &[&[u8]], &[&[u8]], usize, &mut [f32]) -> bool;

/// One weight row · four quantized activation rows: `(wtype, row, acts, n)`.
pub type Dot4Fn = fn(WeightType, &[u8], &[&[u8]; 4], usize) -> Option<[f32; 4]>;

impl DotTable {
    /// The portable scalar reference kernels.
    pub fn scalar() -> DotTable {
        scalar::table()
    }

    /// Most activation rows one [`DotTable::rows_many`] call takes.
    pub const MANY_MAX: usize = 8;

    /// Activation rows per [`DotTable::f32_rows`] call in [`crate::matmul`]: a multiple of
    /// every table's tile width (4 and 6).
    pub const F32_ROWS: usize = 24;

    /// Names of every table this build has, best first (whether or not this CPU runs them).
    pub const NAMES: [&'static str; 3] = ["avx512", "avx2", "scalar"];

    /// The table called `name` if this CPU can run it (ignores `BERTH_KERNELS`).
    pub fn by_name(name: &str) -> Option<DotTable> {
        match name {
            "scalar" => Some(DotTable::scalar()),
            #[cfg(target_arch = "x86_64")]
            "avx2" => avx2::table(),
            #[cfg(target_arch = "x86_64")]
            "avx512" => avx512::table(),
            _ => None,
        }
    }

    /// Every table this CPU can run, best first (ignores `BERTH_KERNELS`).
    pub fn available() -> Vec<DotTable> {
        DotTable::NAMES
            .iter()
            .filter_map(|n| DotTable::by_name(n))
            .collect()
    }

    /// The fastest kernels for this CPU at or below [`crate::kernel_level`], chosen once from
    /// the candidates avx512, avx2, scalar.
    pub fn best() -> &'static DotTable {
        use crate::KernelLevel;
        static BEST: OnceLock<DotTable> = OnceLock::new();
        BEST.get_or_init(|| {
            let scalar = DotTable::scalar();
            let candidates = [
                (KernelLevel::Avx512, DotTable::by_name("avx512")),
                (KernelLevel::Avx2, DotTable::by_name("avx2")),
                (KernelLevel::Scalar, Some(scalar)),
            ]
            .map(|(l, t)| (l, t.is_some(), t.unwrap_or(scalar)));
            crate::select_table("dot", &candidates)
        })
    }

    /// Dot products of a weight row with four activation rows, decoding the weights once
    /// where a multi-row kernel exists.
    #[inline]
    pub fn vec_dot4(&self, wtype: WeightType, row: &[u8], acts: [ActRow<'_>; 4], n: usize) -> [f32; 4] {
        if let Some(f) = self.dot4 {
            let bytes = acts.map(|a| match a {
                ActRow::Q8_0(b) | ActRow::Q8_K(b) => Some(b),
                ActRow::F32(_) => None,
            });
            if let [Some(a0), Some(a1), Some(a2), Some(a3)] = bytes {
                if acts.iter().all(|a| a.format() == wtype.act_format()) {
                    if let Some(r) = f(wtype, row, &[a0, a1, a2, a3], n) {
                        return r;
                    }
                }
            }
        }
        acts.map(|a| self.vec_dot(wtype, row, a, n))
    }

    /// [`DotTable::vec_dot4`] whose results equal four [`DotTable::vec_dot`] calls bit for bit
    /// (batched rows of different sequences must round as each would alone).
    #[inline]
    pub fn vec_dot4_single(
        &self,
        wtype: WeightType,
        row: &[u8],
        acts: [ActRow<'_>; 4],
        n: usize,
    ) -> [f32; 4] {
        if let Some(f) = self.dot4_gemv {
            let bytes = acts.map(|a| match a {
                ActRow::Q8_0(b) | ActRow::Q8_K(b) => Some(b),
                ActRow::F32(_) => None,
            });
            if let [Some(a0), Some(a1), Some(a2), Some(a3)] = bytes {
                if acts.iter().all(|a| a.format() == wtype.act_format()) {
                    if let Some(r) = f(wtype, row, &[a0, a1, a2, a3], n) {
                        return r;
                    }
                }
            }
        }
        acts.map(|a| self.vec_dot(wtype, row, a, n))
    }

    /// Dot products of `nrows` consecutive weight rows (`wtype` rows of `n` in `w`) with each of
    /// `acts` into `out[r * acts.len() + j]`, each bit for bit [`DotTable::vec_dot`]'s: one pass
    /// over the weights for up to [`DotTable::MANY_MAX`] rows where [`DotTable::rows_many`]
    /// covers the type, else four-row single-order kernels.
    pub fn vec_dot_rows_single(
        &self,
        wtype: WeightType,
        w: &[u8],
        nrows: usize,
        acts: &[ActRow<'_>],
        n: usize,
        out: &mut [f32],
    ) {
        let na = acts.len();
        assert!(out.len() >= nrows * na, "output too short");
        let rb = wtype.row_bytes(n);
        assert!(w.len() >= nrows * rb, "weight rows too short");
        if let Some(f) = self.rows_many {
            if (1..=Self::MANY_MAX).contains(&na) && acts.iter().all(|a| a.format() == wtype.act_format()) {
                let mut b: [&[u8]; Self::MANY_MAX] = [&[]; Self::MANY_MAX];
                for (d, a) in b.iter_mut().zip(acts) {
                    if let ActRow::Q8_0(x) | ActRow::Q8_K(x) = a {
                        *d = x;
                    }
                }
                if f(wtype, w, nrows, n, &b[..na], out) {
                    return;
                }
            }
        }
        for r in 0..nrows {
            let row = &w[r * rb..(r + 1) * rb];
            let o = &mut out[r * na..(r + 1) * na];
            let mut j = 0;
            while j + 4 <= na {
                let v = self.vec_dot4_single(wtype, row, [acts[j], acts[j + 1], acts[j + 2], acts[j + 3]], n);
                o[j..j + 4].copy_from_slice(&v);
                j += 4;
            }
            for j in j..na {
                o[j] = self.vec_dot(wtype, row, acts[j], n);
            }
        }
    }

    /// Dot products of every weight row in `rows` with every activation row in `acts` (at
    /// most 4) into `out[wi * acts.len() + r]`, using a tile kernel where one exists
    /// (2 or [`DotTable::tile_rows`] rows × 4 activation rows of a `_0` type or MXFP4), else
    /// the 4-row or 1-row kernels.
    pub fn vec_dot_tile(
        &self,
        wtype: WeightType,
        rows: &[&[u8]],
        acts: &[ActRow<'_>],
        n: usize,
        out: &mut [f32],
    ) {
        let na = acts.len();
        assert!(na <= 4 && out.len() >= rows.len() * na, "tile output too short");
        if let Some(f) = self.tile {
            let mut b: [&[u8]; 4] = [&[]; 4];
            let mut ok = true;
            for (d, a) in b.iter_mut().zip(acts) {
                match a {
                    ActRow::Q8_0(x) | ActRow::Q8_K(x) if a.format() == wtype.act_format() => *d = x,
                    _ => ok = false,
                }
            }
            if ok && f(wtype, rows, &b[..na], n, out) {
                return;
            }
        }
        for (wi, row) in rows.iter().enumerate() {
            if let [a0, a1, a2, a3] = acts {
                let v = self.vec_dot4(wtype, row, [*a0, *a1, *a2, *a3], n);
                out[wi * 4..wi * 4 + 4].copy_from_slice(&v);
                continue;
            }
            for (r, a) in acts.iter().enumerate() {
                out[wi * na + r] = self.vec_dot(wtype, row, *a, n);
            }
        }
    }

    /// Dot product of a weight row with one activation row using this table.
    #[inline]
    pub fn vec_dot(&self, wtype: WeightType, row: &[u8], act: ActRow<'_>, n: usize) -> f32 {
        assert!(
            n.is_multiple_of(wtype.block_size()) && row.len() >= wtype.row_bytes(n),
            "weight row must hold n elements in whole blocks"
        );
        match (wtype, act) {
            (WeightType::Q4_0, ActRow::Q8_0(a)) => (self.q4_0)(row, a, n),
            (WeightType::Q5_0, ActRow::Q8_0(a)) => (self.q5_0)(row, a, n),
            (WeightType::Q8_0, ActRow::Q8_0(a)) => (self.q8_0)(row, a, n),
            (WeightType::Mxfp4, ActRow::Q8_0(a)) => (self.mxfp4)(row, a, n),
            (WeightType::Q4_K, ActRow::Q8_K(a)) => (self.q4_k)(row, a, n),
            (WeightType::Q5_K, ActRow::Q8_K(a)) => (self.q5_k)(row, a, n),
            (WeightType::Q6_K, ActRow::Q8_K(a)) => (self.q6_k)(row, a, n),
            (WeightType::F32, ActRow::F32(x)) => (self.f32)(row, x, n),
            (WeightType::F16, ActRow::F32(x)) => (self.f16)(row, x, n),
            (WeightType::BF16, ActRow::F32(x)) => (self.bf16)(row, x, n),
            (w, a) => panic!(
                "activation format {:?} does not match weight type {w:?}",
                a.format()
            ),
        }
    }
}

/// True when the AVX2, FMA and F16C kernels are in use: the CPU has them and
/// [`crate::kernel_level`] (`BERTH_KERNELS`, `BERTH_FORCE_SCALAR=1`) allows them.
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    crate::kernel_level() >= crate::KernelLevel::Avx2
}

/// True when the CPU has AVX2, FMA and F16C (never, off x86_64).
#[cfg(not(target_arch = "x86_64"))]
pub fn has_avx2() -> bool {
    false
}

/// A borrowed view of one activation row in a dot-product input format.
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub enum ActRow<'a> {
    /// Plain f32 values.
    F32(&'a [f32]),
    /// Q8_0 block bytes.
    Q8_0(&'a [u8]),
    /// Q8_K super-block bytes.
    Q8_K(&'a [u8]),
}

impl ActRow<'_> {
    /// The format of this row.
    pub fn format(&self) -> ActFormat {
        match self {
            ActRow::F32(_) => ActFormat::F32,
            ActRow::Q8_0(_) => ActFormat::Q8_0,
            ActRow::Q8_K(_) => ActFormat::Q8_K,
        }
    }
}

/// One or more activation rows of `n` elements, quantized once for a given weight type.
///
/// Buffers are reused across calls to [`QuantizedActivations::quantize_into`], so a
/// long-lived instance makes decode allocation-free.
#[derive(Clone, Debug)]
pub struct QuantizedActivations {
    format: ActFormat,
    n: usize,
    rows: usize,
    bytes: Vec<u8>,
    floats: Vec<f32>,
}

impl Default for QuantizedActivations {
    fn default() -> Self {
        Self::new()
    }
}

impl QuantizedActivations {
    /// An empty holder (no rows).
    pub fn new() -> Self {
        QuantizedActivations {
            format: ActFormat::F32,
            n: 0,
            rows: 0,
            bytes: Vec::new(),
            floats: Vec::new(),
        }
    }

    /// Quantizes a single row `x` for dot products against `wtype` weights.
    pub fn quantize(wtype: WeightType, x: &[f32]) -> Self {
        let mut q = Self::new();
        q.quantize_into(wtype, x, x.len());
        q
    }

    /// Quantizes `x.len() / n` rows of `n` elements each, reusing this holder's buffers.
    pub fn quantize_into(&mut self, wtype: WeightType, x: &[f32], n: usize) {
        let format = wtype.act_format();
        assert!(n > 0 && x.len().is_multiple_of(n), "x must hold whole rows of n");
        assert_eq!(
            n % format.block_size(),
            0,
            "n must be a multiple of the block size"
        );
        let rows = x.len() / n;
        self.format = format;
        self.n = n;
        self.rows = rows;
        match format {
            ActFormat::F32 => {
                self.floats.clear();
                self.floats.extend_from_slice(x);
            }
            ActFormat::Q8_0 | ActFormat::Q8_K => {
                let rb = format.row_bytes(n);
                self.bytes.resize(rb * rows, 0);
                for (xr, br) in x.chunks_exact(n).zip(self.bytes.chunks_exact_mut(rb)) {
                    quantize_act_row(format, xr, br);
                }
            }
        }
    }

    /// Like [`QuantizedActivations::quantize_into`], quantizing rows in parallel on `pool`.
    pub fn quantize_into_par(
        &mut self,
        wtype: WeightType,
        x: &[f32],
        n: usize,
        pool: &crate::pool::ThreadPool,
    ) {
        let format = wtype.act_format();
        let rows = x.len().checked_div(n).unwrap_or(0);
        if format == ActFormat::F32 || rows < 2 || pool.n_threads() == 1 {
            return self.quantize_into(wtype, x, n);
        }
        assert!(x.len().is_multiple_of(n), "x must hold whole rows of n");
        assert!(
            n.is_multiple_of(format.block_size()),
            "n must be a multiple of the block size"
        );
        self.format = format;
        self.n = n;
        self.rows = rows;
        let rb = format.row_bytes(n);
        self.bytes.resize(rb * rows, 0);
        struct Dst(*mut u8);
        // SAFETY: each parallel chunk writes only its own row's disjoint byte range.
        unsafe impl Sync for Dst {}
        let dst = Dst(self.bytes.as_mut_ptr());
        pool.parallel_for(rows, |i| {
            let dst = &dst;
            // SAFETY: i < rows and the buffer holds rows * rb bytes; row i's range
            // [i*rb, (i+1)*rb) is touched by this chunk only, while `self.bytes` is
            // mutably borrowed for the whole parallel_for.
            let br = unsafe { std::slice::from_raw_parts_mut(dst.0.add(i * rb), rb) };
            quantize_act_row(format, &x[i * n..(i + 1) * n], br);
        });
    }

    /// Activation format held.
    pub fn format(&self) -> ActFormat {
        self.format
    }

    /// Elements per row.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Every row's bytes, back to back (quantized activations only).
    pub fn bytes(&self) -> &[u8] {
        assert_ne!(self.format, ActFormat::F32, "f32 activations have no bytes");
        &self.bytes[..self.rows * self.format.row_bytes(self.n)]
    }

    /// Borrow row `i`.
    #[inline]
    pub fn row(&self, i: usize) -> ActRow<'_> {
        assert!(i < self.rows, "activation row out of range");
        match self.format {
            ActFormat::F32 => ActRow::F32(&self.floats[i * self.n..(i + 1) * self.n]),
            f => {
                let rb = f.row_bytes(self.n);
                let b = &self.bytes[i * rb..(i + 1) * rb];
                if f == ActFormat::Q8_0 {
                    ActRow::Q8_0(b)
                } else {
                    ActRow::Q8_K(b)
                }
            }
        }
    }
}

/// Quantizes one activation row `x` to Q8_0 or Q8_K bytes in `dst` with the fastest
/// quantizer for this CPU; the result is bit-identical to the scalar reference quantizers.
pub fn quantize_act_row(format: ActFormat, x: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        match format {
            ActFormat::Q8_0 => return avx2::quantize_q8_0(x, dst),
            ActFormat::Q8_K => return avx2::quantize_q8_k(x, dst),
            ActFormat::F32 => {}
        }
    }
    match format {
        ActFormat::Q8_0 => quantize_row_q8_0_into(x, dst),
        ActFormat::Q8_K => quantize_row_q8_k_into(x, dst),
        ActFormat::F32 => panic!("f32 activations are not quantized"),
    }
}

/// Dot product of weight `row` (raw bytes of `wtype`) with the first row of `act`, `n` elements.
#[inline]
pub fn vec_dot(wtype: WeightType, row: &[u8], act: &QuantizedActivations, n: usize) -> f32 {
    DotTable::best().vec_dot(wtype, row, act.row(0), n)
}

/// Dot product of weight `row` with an activation row view, using the best kernels.
#[inline]
pub fn vec_dot_row(wtype: WeightType, row: &[u8], act: ActRow<'_>, n: usize) -> f32 {
    DotTable::best().vec_dot(wtype, row, act, n)
}

/// Plain f32 dot product using the best kernel (lengths must match).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    (DotTable::best().dot_f32)(a, b)
}

#[cfg(test)]
mod tests;
