//! The statistics `llama-perplexity` reports, computed as it computes them: perplexity with its
//! standard error, and against a base run the KL divergence, "same top token" and Δp (the change
//! in the probability of the right token), with their uncertainties and percentiles.

use super::logits_file::row_parts;

/// Running sums of negative log-likelihoods (the PPL and its ± estimate).
#[derive(Clone, Copy, Debug, Default)]
pub struct NllSums {
    /// Σ nll.
    pub sum: f64,
    /// Σ nll².
    pub sum2: f64,
    /// Tokens scored.
    pub count: usize,
}

impl NllSums {
    /// Adds one token's negative log-likelihood.
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    /// Adds another set of sums.
    pub fn merge(&mut self, o: &NllSums) {
        self.sum += o.sum;
        self.sum2 += o.sum2;
        self.count += o.count;
    }

    /// `(ppl, ± error)` as llama.cpp's final estimate: `exp(mean)` and `ppl · sqrt(var/(n-1))`.
    pub fn ppl(&self) -> (f64, f64) {
        let n = self.count.max(1) as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        let ppl = mean.exp();
        let err = if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * ppl
        } else {
            0.0
        };
        (ppl, err)
    }
}

/// The negative log-likelihood of `next` under `logits` (llama.cpp's plain `log_softmax`).
pub fn nll(logits: &[f32], next: usize) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    -(f64::from(logits[next] - max) - sum_exp.ln())
}

/// llama.cpp's `kl_divergence_result`: sums over every compared token.
#[derive(Clone, Copy, Debug, Default)]
pub struct KldSums {
    /// Σ nll and Σ nll² of this run.
    pub nll: NllSums,
    /// Σ nll and Σ nll² of the base.
    pub nll_base: NllSums,
    /// Σ nll · nll_base (their covariance).
    pub nll_nll_base: f64,
    /// Σ KLD.
    pub kld: f64,
    /// Σ KLD².
    pub kld2: f64,
    /// Σ Δp.
    pub p_diff: f64,
    /// Σ Δp².
    pub p_diff2: f64,
    /// Σ Δp⁴.
    pub p_diff4: f64,
    /// Largest |Δp|.
    pub max_p_diff: f32,
    /// Tokens whose most likely next token is the base's.
    pub same_top: usize,
    /// Tokens compared.
    pub count: usize,
}

impl KldSums {
    /// Adds another set of sums.
    pub fn merge(&mut self, o: &KldSums) {
        self.nll.merge(&o.nll);
        self.nll_base.merge(&o.nll_base);
        self.nll_nll_base += o.nll_nll_base;
        self.kld += o.kld;
        self.kld2 += o.kld2;
        self.p_diff += o.p_diff;
        self.p_diff2 += o.p_diff2;
        self.p_diff4 += o.p_diff4;
        self.max_p_diff = self.max_p_diff.max(o.max_p_diff);
        self.same_top += o.same_top;
        self.count += o.count;
    }

    /// Compares one row of logits with the base's stored row for the same position; returns
    /// `(KLD, Δp)` of the row (llama.cpp's `log_softmax` against a base row, float for float).
    pub fn add(&mut self, logits: &[f32], base_row: &[u16], next: usize) -> (f64, f32) {
        let n_vocab = logits.len();
        let (mut max, mut imax) = (logits[0], 0);
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max {
                max = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob, base) = row_parts(base_row, n_vocab);

        let nll = max + log_sum_exp - logits[next];
        self.nll.sum += f64::from(nll);
        self.nll.sum2 += f64::from(nll * nll);
        self.nll.count += 1;
        let nll_base = -(scale * f32::from(base[next]) + min_log_prob);
        self.nll_base.sum += f64::from(nll_base);
        self.nll_base.sum2 += f64::from(nll_base * nll_base);
        self.nll_base.count += 1;
        self.nll_nll_base += f64::from(nll * nll_base);

        let top = max + log_sum_exp;
        let mut sum = 0.0f64;
        let (mut imax_base, mut base_max) = (0usize, 0.0f32);
        for (i, (&q, &l)) in base.iter().zip(logits).enumerate() {
            let p_log_base = scale * f32::from(q) + min_log_prob;
            if i == 0 || p_log_base > base_max {
                base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += f64::from(p_base * (p_log_base - l + top));
            }
        }
        self.kld += sum;
        self.kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.p_diff += f64::from(p_diff);
        let d2 = f64::from(p_diff * p_diff);
        self.p_diff2 += d2;
        self.p_diff4 += d2 * d2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        (sum, p_diff)
    }
}

/// llama.cpp's `mean_and_uncertainty`: the mean and its standard error (0 for 10 values or
/// fewer).
pub fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// llama.cpp's covariance of two means (0 for fewer than 10 values).
pub fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

/// The linear-interpolated percentile llama.cpp prints (`sorted` ascending, `fraction` in 0..1).
pub fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1];
    }
    let p = fraction * (sorted.len() - 1) as f32;
    let ip = p as usize;
    let frac = p - ip as f32;
    (1.0 - frac) * sorted[ip] + frac * sorted[(ip + 1).min(sorted.len() - 1)]
}

/// The median as llama.cpp takes it (the mean of the middle two for an even count).
pub fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

#[cfg(test)]
mod tests {
    use super::super::logits_file::{quantize_row, row_words};
    use super::*;

    fn softmax(l: &[f32]) -> Vec<f64> {
        let max = l.iter().copied().fold(f32::MIN, f32::max) as f64;
        let e: Vec<f64> = l.iter().map(|&x| (x as f64 - max).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn kld_of_a_run_against_its_own_base_is_near_zero_and_matches_the_exact_value_otherwise() {
        let base: Vec<f32> = (0..257).map(|i| ((i * 91 % 257) as f32) * 0.05 - 4.0).collect();
        let mut row = vec![0u16; row_words(base.len())];
        quantize_row(&base, 3, &mut row);
        let mut same = KldSums::default();
        let (k, dp) = same.add(&base, &row, 3);
        assert!(k.abs() < 1e-4 && dp.abs() < 1e-4, "self KLD {k}, Δp {dp}");
        assert_eq!(same.same_top, 1);

        // Another distribution: the KLD is the exact KL(base || q) within the 16-bit steps.
        let q: Vec<f32> = base
            .iter()
            .enumerate()
            .map(|(i, &x)| x + ((i % 7) as f32 - 3.0) * 0.1)
            .collect();
        let mut other = KldSums::default();
        let (k, _) = other.add(&q, &row, 3);
        let (pb, pq) = (softmax(&base), softmax(&q));
        let exact: f64 = pb.iter().zip(&pq).map(|(a, b)| a * (a / b).ln()).sum();
        assert!(
            (k - exact).abs() < 1e-3 * exact.max(1e-3),
            "KLD {k} vs exact {exact}"
        );
        assert!((nll(&q, 3) - (-pq[3].ln())).abs() < 1e-6);
    }

    #[test]
    fn ppl_and_percentiles_follow_llama_cpp() {
        let mut s = NllSums::default();
        for v in [1.0, 2.0, 3.0] {
            s.add(v);
        }
        let (ppl, err) = s.ppl();
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        // var = 14/3 - 4 = 2/3; se = sqrt(2/3 / 2)
        assert!((err - ppl * (1.0f64 / 3.0).sqrt()).abs() < 1e-12);
        let sorted = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(median(&sorted), 2.5);
        assert_eq!(percentile(&sorted, 0.5), 2.5);
        assert_eq!(percentile(&sorted, 1.0), 4.0);
    }
}
