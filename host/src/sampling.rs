//! Picks the next token from a row of logits: greedy, or temperature with top-k, top-p and min-p,
//! after repetition / presence / frequency penalties, logit bias and an optional allowed-token
//! mask. The plugin's logits are only read; the sampler works on its own scratch copy (and only
//! when a penalty, bias or mask asks for one: otherwise the row is read in place).

use std::collections::HashMap;

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
    /// OpenAI presence penalty: subtracted once from every token already generated.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per earlier occurrence of a token.
    pub frequency_penalty: f32,
    /// llama.cpp / Ollama repeat penalty over the last `repeat_last_n` tokens; 1 is off.
    pub repeat_penalty: f32,
    /// How many recent tokens `repeat_penalty` looks at; 0 is off.
    pub repeat_last_n: usize,
    /// Added to a token's logit before sampling (OpenAI `logit_bias`, -100..100).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            logit_bias: Vec::new(),
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

    /// Whether any penalty or bias changes the logits (so the sampler needs its own copy).
    pub fn adjusts_logits(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || (self.repeat_penalty != 1.0 && self.repeat_last_n > 0)
            || !self.logit_bias.is_empty()
    }
}

/// OpenAI's `logit_bias`: an object of token id (as a string) to a bias in -100..=100, checked
/// against the vocabulary size; `null` = none. The error names `logit_bias`.
pub fn parse_logit_bias(
    v: Option<&serde_json::Value>,
    vocab: usize,
) -> Result<Vec<(u32, f32)>, crate::constraint::ParamError> {
    let bad = |m: String| crate::constraint::ParamError {
        param: "logit_bias".into(),
        message: m,
    };
    let map = match v {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(m)) => m,
        Some(_) => return Err(bad("'logit_bias' must be an object of token id to bias".into())),
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, b) in map {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id| (id as usize) < vocab)
            .ok_or_else(|| {
                bad(format!(
                    "'logit_bias' key '{k}' is not a token id of this model, whose vocabulary has {vocab} tokens"
                ))
            })?;
        let bias = b
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                bad(format!(
                    "'logit_bias' values are numbers in -100..100; {k} has {b}"
                ))
            })?;
        out.push((id, bias as f32));
    }
    Ok(out)
}

/// Whether token `id` is allowed by a bitmask (bit `id % 32` of word `id / 32`); ids past the
/// mask are not.
pub fn mask_allows(mask: &[u32], id: u32) -> bool {
    mask.get(id as usize / 32)
        .is_some_and(|w| w >> (id % 32) & 1 == 1)
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
    /// The fp32 copy of the row that penalties, bias and mask are applied to.
    scratch: Vec<f32>,
    /// Tokens accepted so far (for the repeat penalty's window).
    history: Vec<u32>,
    /// How often each accepted token occurred (presence and frequency penalties).
    counts: HashMap<u32, u32>,
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
            scratch: Vec::new(),
            history: Vec::new(),
            counts: HashMap::new(),
        }
    }

    /// Records a token that joined the sequence (sampled or forced), for the penalties.
    pub fn accept(&mut self, token: u32) {
        self.history.push(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Picks a token from one row of logits, after penalties and bias, among the tokens `mask`
    /// allows (all when `None`). A mask that allows nothing falls back to the unmasked row.
    pub fn sample_masked(&mut self, logits: &[f32], mask: Option<&[u32]>) -> u32 {
        if !self.params.adjusts_logits() && mask.is_none() {
            return self.sample(logits);
        }
        let scratch = self.adjusted(logits, mask);
        let token = self.sample(&scratch);
        self.scratch = scratch;
        token
    }

    /// Like [`Sampler::sample_masked`], and also reports the log-probabilities of the picked
    /// token and of the `top` most likely tokens. They are a log-softmax over the row the sampler
    /// picked from: after penalties, `logit_bias` and the constraint mask (a masked-out token has
    /// none), before temperature, top-k, top-p and min-p.
    pub fn sample_with_logprobs(
        &mut self,
        logits: &[f32],
        mask: Option<&[u32]>,
        top: usize,
    ) -> (u32, TokenLogprobs) {
        let scratch = self.adjusted(logits, mask);
        let token = self.sample(&scratch);
        let lp = TokenLogprobs::of_row(&scratch, token, top);
        self.scratch = scratch;
        (token, lp)
    }

    /// The row sampling picks from, in the scratch buffer (hand it back after use): the logits
    /// after penalties and bias, masked unless the mask allows nothing.
    fn adjusted(&mut self, logits: &[f32], mask: Option<&[u32]>) -> Vec<f32> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(logits);
        self.adjust(&mut scratch);
        if let Some(mask) = mask {
            if !apply_mask(&mut scratch, mask) {
                scratch.clear();
                scratch.extend_from_slice(logits);
                self.adjust(&mut scratch);
            }
        }
        scratch
    }

    /// Applies penalties and logit bias in place.
    fn adjust(&self, row: &mut [f32]) {
        let p = &self.params;
        if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
            let from = self.history.len().saturating_sub(p.repeat_last_n);
            let mut seen = std::collections::HashSet::new();
            for &t in &self.history[from..] {
                if !seen.insert(t) {
                    continue;
                }
                if let Some(v) = row.get_mut(t as usize) {
                    // llama.cpp's rule: shrink positive logits, grow negative ones.
                    *v = if *v > 0.0 {
                        *v / p.repeat_penalty
                    } else {
                        *v * p.repeat_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.counts {
                if let Some(v) = row.get_mut(t as usize) {
                    *v -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
        for &(t, bias) in &p.logit_bias {
            if let Some(v) = row.get_mut(t as usize) {
                *v += bias;
            }
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

/// The log-probabilities reported for one generated token (OpenAI's `logprobs`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The token picked.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (ties: lower id).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// The log-softmax of `row` at `token`, and its `top` most likely entries. Non-finite
    /// logits (masked tokens) have probability 0 and never appear in the top list.
    pub fn of_row(row: &[f32], token: u32, top: usize) -> TokenLogprobs {
        let max = row
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| f64::from(v - max).exp())
            .sum();
        let lse = max as f64 + sum.ln();
        let lp = |v: f32| {
            if v.is_finite() {
                (f64::from(v) - lse) as f32
            } else {
                f32::NEG_INFINITY
            }
        };
        let mut best: Vec<(f32, u32)> = Vec::new();
        if top > 0 {
            best.extend(
                row.iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(i, &v)| (v, i as u32)),
            );
            let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if best.len() > top {
                best.select_nth_unstable_by(top - 1, order);
                best.truncate(top);
            }
            best.sort_unstable_by(order);
        }
        TokenLogprobs {
            token,
            logprob: row.get(token as usize).map_or(f32::NEG_INFINITY, |&v| lp(v)),
            // Collected from a borrow, into a vector of `top` entries: collected from
            // `best.into_iter()`, it would reuse `best`'s vocabulary-sized buffer in place (same
            // element size), and every token's logprobs a response keeps would hold 1 to 2 MB.
            top: best.iter().map(|&(v, i)| (i, lp(v))).collect(),
        }
    }
}

/// Sets every logit the mask does not allow to -inf; false (row untouched) when it allows none.
fn apply_mask(row: &mut [f32], mask: &[u32]) -> bool {
    let any = row
        .chunks(32)
        .zip(mask.iter().chain(std::iter::repeat(&0)))
        .any(|(chunk, &w)| w & low_bits(chunk.len()) != 0);
    if !any {
        return false;
    }
    for (i, chunk) in row.chunks_mut(32).enumerate() {
        let w = mask.get(i).copied().unwrap_or(0);
        if w == u32::MAX {
            continue;
        }
        for (j, v) in chunk.iter_mut().enumerate() {
            if w >> j & 1 == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    }
    true
}

/// A word with the low `n` bits set (n <= 32).
fn low_bits(n: usize) -> u32 {
    if n >= 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_of_the_row_the_sampler_used() {
        let row = [1.0f32, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let lp = TokenLogprobs::of_row(&row, 2, 3);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        assert!((f64::from(lp.logprob) - (2.0 - lse)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        let total: f64 = (0..4)
            .map(|i| f64::from(TokenLogprobs::of_row(&row, i, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(TokenLogprobs::of_row(&row, 4, 0).logprob, f32::NEG_INFINITY);
        // The top list holds its entries, not the whole row it was chosen from.
        let vocab: Vec<f32> = (0..151_936).map(|i| (i % 1000) as f32 / 100.0).collect();
        let lp = TokenLogprobs::of_row(&vocab, 7, 2);
        assert_eq!(lp.top.len(), 2);
        assert!(
            lp.top.capacity() <= 16,
            "top keeps a buffer of {} entries",
            lp.top.capacity()
        );
        // Greedy: the picked token is the top-1; bias and mask move both.
        let mut s = Sampler::new(SamplingParams::greedy());
        let (t, lp) = s.sample_with_logprobs(&row, None, 2);
        assert_eq!((t, lp.top[0].0), (1, 1));
        let mut p = SamplingParams::greedy();
        p.logit_bias = vec![(0, 5.0)];
        let mut s = Sampler::new(p);
        let mask = [0b0101u32];
        let (t, lp) = s.sample_with_logprobs(&row, Some(&mask), 5);
        assert_eq!((t, lp.top.len()), (0, 2));
        assert_eq!(lp.top[0], (0, lp.logprob));
    }

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
            ..Default::default()
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
            ..Default::default()
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
            ..Default::default()
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
            ..Default::default()
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
            ..Default::default()
        });
        for _ in 0..200 {
            let t = s.sample(&logits);
            assert!(t == 0 || t == 3, "{t}");
        }
    }

    fn uniform(n: usize) -> Vec<f32> {
        vec![0.0; n]
    }

    #[test]
    fn the_mask_restricts_sampling_to_allowed_tokens() {
        let logits = uniform(70);
        let mut mask = vec![0u32; 3];
        for id in [3u32, 40, 69] {
            mask[id as usize / 32] |= 1 << (id % 32);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(5),
            ..Default::default()
        });
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            seen.insert(s.sample_masked(&logits, Some(&mask)));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![3, 40, 69]);
        let mut g = Sampler::new(SamplingParams::greedy());
        let mut row = uniform(70);
        row[5] = 9.0;
        assert_eq!(g.sample_masked(&row, Some(&mask)), 3);
        assert!(mask_allows(&mask, 40) && !mask_allows(&mask, 41) && !mask_allows(&mask, 500));
    }

    #[test]
    fn an_empty_mask_falls_back_to_the_row() {
        let mut row = uniform(40);
        row[7] = 3.0;
        let mut g = Sampler::new(SamplingParams::greedy());
        assert_eq!(g.sample_masked(&row, Some(&[0, 0])), 7);
    }

    #[test]
    fn logit_bias_and_penalties_move_the_choice() {
        let mut row = uniform(10);
        row[2] = 1.0;
        let mut g = Sampler::new(SamplingParams {
            logit_bias: vec![(4, 5.0)],
            ..SamplingParams::greedy()
        });
        assert_eq!(g.sample_masked(&row, None), 4);
        let mut p = Sampler::new(SamplingParams {
            presence_penalty: 2.0,
            ..SamplingParams::greedy()
        });
        assert_eq!(p.sample_masked(&row, None), 2);
        p.accept(2);
        assert_ne!(p.sample_masked(&row, None), 2);
        let mut f = Sampler::new(SamplingParams {
            frequency_penalty: 0.4,
            ..SamplingParams::greedy()
        });
        f.accept(2);
        f.accept(2);
        assert_eq!(f.sample_masked(&row, None), 2, "0.8 < 1.0 still wins");
        f.accept(2);
        assert_ne!(f.sample_masked(&row, None), 2, "1.2 > 1.0 loses");
        let mut r = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            repeat_last_n: 4,
            ..SamplingParams::greedy()
        });
        row[3] = 0.6;
        r.accept(2);
        assert_eq!(r.sample_masked(&row, None), 3, "1.0 / 2 < 0.6");
        for _ in 0..4 {
            r.accept(9);
        }
        assert_eq!(r.sample_masked(&row, None), 2, "out of the window again");
    }

    #[test]
    fn logit_bias_parses_and_checks_ids_and_range() {
        use serde_json::json;
        assert_eq!(
            parse_logit_bias(Some(&json!({"5": -100, "7": 2.5})), 10).unwrap(),
            vec![(5, -100.0), (7, 2.5)]
        );
        assert!(parse_logit_bias(None, 10).unwrap().is_empty());
        assert_eq!(
            parse_logit_bias(Some(&json!({"9": 100})), 10).unwrap(),
            vec![(9, 100.0)],
            "the last id of the vocabulary is in it"
        );
        for bad in [
            json!({"10": 1}),
            json!({"x": 1}),
            json!({"-1": 1}),
            json!({"1": 101}),
            json!([1]),
        ] {
            assert_eq!(parse_logit_bias(Some(&bad), 10).unwrap_err().param, "logit_bias");
        }
        let e = parse_logit_bias(Some(&json!({"3": 1, "4000000000": 1})), 10).unwrap_err();
        assert!(
            e.message.contains("4000000000"),
            "the error names the id: {}",
            e.message
        );
    }

    #[test]
    fn the_unadjusted_path_reads_the_row_in_place() {
        let row: Vec<f32> = (0..100).map(|i| ((i * 13) % 7) as f32).collect();
        let params = SamplingParams {
            seed: Some(9),
            ..Default::default()
        };
        let mut a = Sampler::new(params.clone());
        let mut b = Sampler::new(params);
        for _ in 0..20 {
            assert_eq!(a.sample(&row), b.sample_masked(&row, None));
        }
    }
}
