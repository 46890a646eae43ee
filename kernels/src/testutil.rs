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

/// The kernel instruction sets this build has (beyond scalar), each with the `/proc/cpuinfo`
/// flags a CPU must show for the set's kernels to run (the features their dispatch detects).
pub const KERNEL_SETS: [(&str, &[&str]); 2] = [
    ("avx2", &["avx2", "fma", "f16c"]),
    (
        "avx512",
        &[
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512dq",
            "avx512_vnni",
        ],
    ),
];

/// The environment variable in which CI states the kernel sets it expects this CPU to run
/// (comma-separated names of [`KERNEL_SETS`]; `.ci/run` derives it from the CPU's flags).
pub const EXPECTED_SETS_ENV: &str = "BERTH_EXPECT_KERNEL_SETS";

/// The flags of the first processor in `/proc/cpuinfo` (empty where there is no such file).
pub fn cpu_flags() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "flags").then(|| value.split_whitespace().map(str::to_string).collect())
        })
        .unwrap_or_default()
}

/// The sets of [`KERNEL_SETS`] whose flags `flags` all show.
pub fn sets_claimed_by(flags: &[String]) -> Vec<&'static str> {
    KERNEL_SETS
        .iter()
        .filter(|(_, needs)| needs.iter().all(|n| flags.iter().any(|f| f == n)))
        .map(|(name, _)| *name)
        .collect()
}

/// Whether this CPU's flags show every feature of the kernel set `set`.
pub fn cpu_claims_set(set: &str) -> bool {
    sets_claimed_by(&cpu_flags()).contains(&set)
}

/// Records that a test skipped the kernels of instruction set `set` (`why` says what it did not
/// run). Under CI (`$CI`) a skip of a set the CPU's flags show is a failure instead: the
/// kernels behind the speed figures must be tested wherever they would run.
#[cfg(test)]
pub fn skip_missing_set(set: &str, why: &str) {
    if berth_formats::test_skip::running_under_ci() && cpu_claims_set(set) {
        panic!("{why}: this CPU's flags show {set}, so under CI its kernels must run, not skip");
    }
    berth_formats::test_skip::skip_optional(why);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_follow_every_flag_they_need() {
        let flags = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(sets_claimed_by(&flags("sse2 avx avx2 fma")), Vec::<&str>::new());
        assert_eq!(sets_claimed_by(&flags("avx2 fma f16c avx512f")), ["avx2"]);
        let all = "avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni";
        assert_eq!(sets_claimed_by(&flags(all)), ["avx2", "avx512"]);
    }

    /// Every kernel test that meets a set this CPU lacks skips it; this check is what keeps
    /// those skips honest. Every set the CPU's flags show (and, under CI, every set CI states in
    /// [`EXPECTED_SETS_ENV`]) must be runnable here; under CI the packed kernels must also be
    /// enabled (`BERTH_KERNELS` must not switch them off), so no skip hides a set the machine has.
    #[test]
    fn every_kernel_set_the_cpu_shows_runs_here() {
        let flags = cpu_flags();
        if flags.is_empty() {
            berth_formats::test_skip::skip_unless_ci("no CPU flags in /proc/cpuinfo to compare with");
            return;
        }
        let claimed = sets_claimed_by(&flags);
        let ci = berth_formats::test_skip::running_under_ci();
        let stated: Option<Vec<String>> = std::env::var(EXPECTED_SETS_ENV).ok().map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        });
        if let Some(stated) = &stated {
            for set in stated {
                assert!(
                    KERNEL_SETS.iter().any(|(n, _)| n == set),
                    "${EXPECTED_SETS_ENV} names {set}, which is not a kernel set of this build"
                );
            }
            let claimed: Vec<String> = claimed.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                stated, &claimed,
                "${EXPECTED_SETS_ENV} (what CI expects) disagrees with this CPU's flags"
            );
        } else if ci {
            eprintln!("${EXPECTED_SETS_ENV} is not set: checking the sets the CPU's flags show");
        }
        for set in &claimed {
            assert!(
                crate::dot::DotTable::by_name(set).is_some(),
                "the CPU's flags show {set} but its dot kernel table does not run here"
            );
        }
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(
                crate::dot::avx512::supported(),
                claimed.contains(&"avx512"),
                "the AVX-512 dispatch and the CPU's flags disagree"
            );
            assert_eq!(
                crate::KernelLevel::Avx2.supported(),
                claimed.contains(&"avx2"),
                "the AVX2 dispatch and the CPU's flags disagree"
            );
        }
        if ci && claimed.contains(&"avx2") {
            assert!(
                crate::packed::PackedMatrix::available(),
                "under CI the packed kernels must run on this CPU (is BERTH_KERNELS set?)"
            );
        }
        eprintln!("kernel sets this CPU runs: {claimed:?}");
    }
}
