//! CPU compute kernels for Berth.
//!
//! This crate holds everything numeric that a transformer forward pass needs on the CPU:
//! the GGML block formats and their (de)quantizers ([`quant`]), quantized dot products of
//! one weight row against activations quantized once per row ([`dot`]), multi-threaded
//! matrix-vector and matrix-matrix products over raw weight bytes ([`matmul`]) and over weights
//! repacked into 16-row interleaved groups for AVX-512 VNNI ([`packed`]), running on a
//! small persistent thread pool ([`pool`]), element-wise operations such as RMS norm,
//! softmax, activations and RoPE ([`ops`]), f32 attention of query heads over a KV cache
//! ([`attention`]), the recurrent mixers of hybrid models ([`recurrent`]), and the primitives of
//! vision encoders: LayerNorm, exact GELU, masked bidirectional attention, antialiased resampling
//! ([`vision`]). Every kernel has a
//! portable scalar reference; on x86_64 the hot ones also have AVX2+FMA (some AVX-512) versions
//! picked at runtime by CPU-feature detection from an ordered candidate list (AVX-512, AVX2,
//! scalar; see [`kernel_level`]): `BERTH_KERNELS=scalar|avx2|avx512` forces one level for every
//! table (`BERTH_FORCE_SCALAR=1` still forces the scalar ones).
//! [`testutil`] has a tiny deterministic RNG and random-block generators for tests and
//! benchmarks.
//!
//! Instruction-set code has one layout. Each kernel family with per-set code ([`dot`],
//! [`packed`], [`attention`], [`ops`], [`recurrent`]) is a folder: `mod.rs` holds the public
//! safe API, the family's table type (one entry per kernel) and its one choice of table
//! through [`select_table`], made once; the scalar reference is in `mod.rs` or `scalar.rs`; and
//! each instruction set is one file (`avx2.rs`, `avx512.rs`) that defines its kernels and its
//! table (`recurrent`'s SIMD kernels are written once in `lanes.rs` over a vector type each
//! set's file implements). Calls go through one checked path per family (the table's methods,
//! or the family's checked call) that validates the shapes and then calls the entry, so the
//! set files hold kernels, not wrappers. A new instruction set (NEON, say) is one more file per
//! family, a [`KernelLevel`] and one candidate entry in each family's list.

#![warn(missing_docs)]

pub mod attention;
pub mod dot;
pub mod image;
pub mod layer;
pub mod matmul;
pub mod ops;
pub mod packed;
pub mod pages;
pub mod pool;
pub mod quant;
/// Recurrent mixers of hybrid models: LFM2's short convolution and Qwen3.5's gated delta rule.
pub mod recurrent;
pub mod testutil;
pub mod vision;

use std::sync::OnceLock;

/// Instruction-set levels of the kernel tables, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelLevel {
    /// Portable scalar code (every CPU).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX-512F on top of [`KernelLevel::Avx2`]; a table that needs further AVX-512
    /// extensions (BW, VL, VNNI...) checks them itself.
    Avx512,
}

impl KernelLevel {
    /// Every level, best first: the order in which kernel tables are tried.
    pub const CANDIDATES: [KernelLevel; 3] = [KernelLevel::Avx512, KernelLevel::Avx2, KernelLevel::Scalar];

    /// The level's name as `BERTH_KERNELS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KernelLevel::Scalar => "scalar",
            KernelLevel::Avx2 => "avx2",
            KernelLevel::Avx512 => "avx512",
        }
    }

    /// The level a `BERTH_KERNELS` value names (case-insensitive), if any.
    pub fn from_name(name: &str) -> Option<KernelLevel> {
        let name = name.trim();
        KernelLevel::CANDIDATES
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(name))
    }

    /// True when this CPU has the level's baseline features.
    pub fn supported(self) -> bool {
        match self {
            KernelLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx512 => KernelLevel::Avx2.supported() && is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The level chosen from a `BERTH_KERNELS` value (`forced`), the `BERTH_FORCE_SCALAR` switch and
/// the CPU's support, with the warning to print when the request cannot be honoured.
fn resolve_kernel_level(
    forced: Option<&str>,
    force_scalar: bool,
    supported: impl Fn(KernelLevel) -> bool,
) -> (KernelLevel, Option<String>) {
    let best_below = |cap: KernelLevel| {
        KernelLevel::CANDIDATES
            .into_iter()
            .find(|&l| l <= cap && supported(l))
            .unwrap_or(KernelLevel::Scalar)
    };
    if force_scalar {
        return (KernelLevel::Scalar, None);
    }
    let Some(raw) = forced.filter(|v| !v.trim().is_empty()) else {
        return (best_below(KernelLevel::Avx512), None);
    };
    match KernelLevel::from_name(raw) {
        Some(want) if supported(want) => (want, None),
        Some(want) => {
            let got = best_below(want);
            let msg = format!(
                "berth: BERTH_KERNELS={}: this CPU cannot run the {} kernels; using {}",
                raw.trim(),
                want.name(),
                got.name()
            );
            (got, Some(msg))
        }
        None => {
            let got = best_below(KernelLevel::Avx512);
            let msg = format!(
                "berth: BERTH_KERNELS={}: unknown (expected scalar, avx2 or avx512); using {}",
                raw.trim(),
                got.name()
            );
            (got, Some(msg))
        }
    }
}

/// True when `BERTH_KERNELS` names a level (so a table that cannot honour it should say so).
fn kernel_level_forced() -> bool {
    std::env::var("BERTH_KERNELS").is_ok_and(|v| KernelLevel::from_name(&v).is_some())
}

/// The highest level every kernel table may use, decided once: the best this CPU supports, or
/// the one `BERTH_KERNELS=scalar|avx2|avx512` names (a forced level this CPU lacks falls back to
/// the best one below it, with a warning on stderr); `BERTH_FORCE_SCALAR=1` means `scalar`.
pub fn kernel_level() -> KernelLevel {
    static LEVEL: OnceLock<KernelLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced = std::env::var("BERTH_KERNELS").ok();
        let force_scalar = std::env::var_os("BERTH_FORCE_SCALAR").is_some_and(|v| !v.is_empty() && v != "0");
        let (level, warning) = resolve_kernel_level(forced.as_deref(), force_scalar, KernelLevel::supported);
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        level
    })
}

/// Picks one kernel table from `candidates` (best first, each with its level and whether this
/// CPU can run it): the first at or below [`kernel_level`] that this CPU runs, else the last.
/// When `BERTH_KERNELS` forced a level whose `what` table this CPU cannot run, says so on stderr.
pub fn select_table<T: Copy>(what: &str, candidates: &[(KernelLevel, bool, T)]) -> T {
    let level = kernel_level();
    let pick = candidates
        .iter()
        .find(|(l, ok, _)| *l <= level && *ok)
        .or(candidates.last())
        .expect("at least one kernel table");
    let unmet = candidates.iter().find(|(l, ok, _)| *l == level && !*ok);
    if let (Some((l, _, _)), true) = (unmet, kernel_level_forced()) {
        eprintln!(
            "berth: BERTH_KERNELS={}: this CPU cannot run the {} {what} kernels; using {}",
            l.name(),
            l.name(),
            pick.0.name()
        );
    }
    pick.2
}

#[cfg(test)]
mod level_tests {
    use super::*;

    #[test]
    fn forced_levels_fall_back_with_a_warning() {
        let avx2_cpu = |l: KernelLevel| l <= KernelLevel::Avx2;
        assert_eq!(
            resolve_kernel_level(None, false, avx2_cpu),
            (KernelLevel::Avx2, None)
        );
        assert_eq!(
            resolve_kernel_level(Some("scalar"), false, avx2_cpu),
            (KernelLevel::Scalar, None)
        );
        assert_eq!(
            resolve_kernel_level(Some("AVX2"), false, avx2_cpu),
            (KernelLevel::Avx2, None)
        );
        let (l, w) = resolve_kernel_level(Some("avx512"), false, avx2_cpu);
        assert_eq!(l, KernelLevel::Avx2);
        assert!(w
            .expect("a warning")
            .contains("cannot run the avx512 kernels; using avx2"));
        let (l, w) = resolve_kernel_level(Some("neon"), false, |_| true);
        assert_eq!(l, KernelLevel::Avx512);
        assert!(w.expect("a warning").contains("unknown"));
        assert_eq!(
            resolve_kernel_level(Some("avx512"), true, |_| true),
            (KernelLevel::Scalar, None)
        );
        assert_eq!(
            resolve_kernel_level(Some(""), false, |_| true),
            (KernelLevel::Avx512, None)
        );
        let scalar_cpu = |l: KernelLevel| l == KernelLevel::Scalar;
        assert_eq!(
            resolve_kernel_level(Some("avx2"), false, scalar_cpu).0,
            KernelLevel::Scalar
        );
    }
}
