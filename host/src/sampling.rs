//! Picks the next token from a row of logits: greedy, or temperature with top-k, top-p and min-p.
//! The plugin's logits are only read; the sampler works on its own scratch copy.

/// How to choose tokens. `temperature <= 0` means greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 (or less) picks the most likely token.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Seed for reproducible sampling; `None` seeds from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Whether sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// A small, fast, seedable generator (SplitMix64); quality is ample for sampling.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Chooses tokens according to [`SamplingParams`]; one per sequence, since it holds RNG state.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    candidates: Vec<(f32, u32)>,
}

/// Index of the largest value (the first one on ties); 0 for an empty row.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler for these parameters.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        Sampler {
            params,
            rng: SplitMix64(seed),
            candidates: Vec::new(),
        }
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks a token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() || logits.len() < 2 {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, &v)| (v, i as u32)),
        );
        if c.is_empty() {
            return argmax(logits);
        }
        let by_logit_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if self.params.top_k > 0 && self.params.top_k < c.len() {
            c.select_nth_unstable_by(self.params.top_k - 1, by_logit_desc);
            c.truncate(self.params.top_k);
        }
        c.sort_unstable_by(by_logit_desc);
        // Softmax with temperature, in place: candidates now hold probabilities.
        let inv_t = 1.0 / self.params.temperature;
        let max = c[0].0;
        let mut sum = 0.0f32;
        for x in c.iter_mut() {
            x.0 = ((x.0 - max) * inv_t).exp();
            sum += x.0;
        }
        for x in c.iter_mut() {
            x.0 /= sum;
        }
        if self.params.min_p > 0.0 {
            let floor = c[0].0 * self.params.min_p;
            let keep = c.iter().take_while(|x| x.0 >= floor).count().max(1);
            c.truncate(keep);
        }
        if self.params.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, x) in c.iter().enumerate() {
                cum += x.0;
                if cum >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        let total: f32 = c.iter().map(|x| x.0).sum();
        let mut r = self.rng.next_f64() as f32 * total;
        for x in c.iter() {
            r -= x.0;
            if r <= 0.0 {
                return x.1;
            }
        }
        c[c.len() - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(42),
        };
        let run = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(&params), run(&params));
        let other = SamplingParams {
            seed: Some(43),
            ..params.clone()
        };
        assert_ne!(run(&params), run(&other));
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let logits = [5.0, 4.9, 4.8, -10.0, 4.7];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(1),
        });
        for _ in 0..200 {
            assert!(s.sample(&logits) <= 1);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.01,
            min_p: 0.0,
            seed: Some(1),
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), 0);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // p(0) = e^1 / (e^1 + e^0) ≈ 0.731 at temperature 1.
        let logits = [1.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(7),
        });
        let n = 20_000;
        let zeros = (0..n).filter(|_| s.sample(&logits) == 0).count();
        let p = zeros as f64 / n as f64;
        assert!((p - 0.731).abs() < 0.02, "{p}");
    }

    #[test]
    fn min_p_drops_unlikely_tokens_and_infinities_are_ignored() {
        let logits = [10.0, 0.0, f32::NEG_INFINITY, 9.9];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: Some(3),
        });
        for _ in 0..200 {
            let t = s.sample(&logits);
            assert!(t == 0 || t == 3, "{t}");
        }
    }
}
