//! `berth bench`: prompt-processing (ppN) and generation (tgN) speed through the plugin, measured
//! the way `llama-bench` measures them, so the figures can sit next to llama.cpp's.

use crate::models::LoadedModel;
use crate::packs;
use crate::plugins::PluginSet;
use anyhow::{anyhow, Result};
use berth_plugin_api::BatchView;
use berth_registry::store::Store;
use std::path::Path;
use std::time::Instant;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Prompt length for the pp test (0 skips it).
    pub prompt: usize,
    /// Tokens for the tg test (0 skips it).
    pub generate: usize,
    /// Thread counts to try.
    pub threads: Vec<u32>,
    /// Repetitions per test.
    pub repetitions: usize,
    /// Rows per decode call while processing the prompt.
    pub batch: usize,
}

/// One measured line: model, test, threads, tokens/s samples.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchResult {
    /// Pack reference.
    pub model: String,
    /// `pp512`, `tg128`, ...
    pub test: String,
    /// Threads used.
    pub threads: u32,
    /// Mean tokens per second.
    pub tokens_per_second: f64,
    /// Standard deviation of tokens per second across repetitions.
    pub stddev: f64,
    /// Every repetition's tokens per second.
    pub samples: Vec<f64>,
}

/// Deterministic pseudo-random tokens (llama-bench feeds random tokens too).
fn tokens(n: usize, vocab: u32, seed: u64) -> Vec<i32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as i32
        })
        .collect()
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Time to process `prompt` tokens from an empty sequence, in chunks of `batch` rows.
fn time_prompt(model: &mut LoadedModel, prompt: &[i32], batch: usize, logits: &mut [f32]) -> Result<f64> {
    model.instance()?.seq_truncate(0, 0)?;
    let start = Instant::now();
    for (c, chunk) in prompt.chunks(batch).enumerate() {
        let first = (c * batch) as i32;
        let positions: Vec<i32> = (0..chunk.len() as i32).map(|i| first + i).collect();
        let seq_ids = vec![0; chunk.len()];
        let mut want = vec![0u8; chunk.len()];
        *want.last_mut().expect("non-empty chunk") = 1;
        let b = BatchView {
            tokens: chunk,
            positions: &positions,
            seq_ids: &seq_ids,
            want_logits: &want,
        };
        model.decode(&b, logits)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Time to generate `tokens.len()` tokens one at a time from an empty sequence.
fn time_generation(model: &mut LoadedModel, tokens: &[i32], logits: &mut [f32]) -> Result<f64> {
    model.instance()?.seq_truncate(0, 0)?;
    let start = Instant::now();
    for (i, t) in tokens.iter().enumerate() {
        let b = BatchView {
            tokens: std::slice::from_ref(t),
            positions: &[i as i32],
            seq_ids: &[0],
            want_logits: &[1],
        };
        model.decode(&b, logits)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Runs the benchmark for one pack at every thread count.
pub fn bench_pack(
    store: &Store,
    home: &Path,
    reference: &str,
    opts: &BenchOptions,
) -> Result<Vec<BenchResult>> {
    let entry = store.get(reference)?;
    let m = entry
        .manifest
        .as_ref()
        .ok_or_else(|| anyhow!("{}: {}", entry.reference, entry.problems.join("; ")))?;
    let plugins = PluginSet::discover_default(home);
    let (_, plugin) = plugins
        .best_for(&packs::probe_config(m))
        .ok_or_else(|| anyhow!("no installed plugin serves {}", entry.reference))?;
    let mut results = Vec::new();
    for &threads in &opts.threads {
        let mut config = packs::load_config(&entry, m);
        config.threads = Some(threads);
        config.max_sequences = Some(1);
        let mut model = LoadedModel::load(plugin.clone(), &config)?;
        let vocab = model.description().vocab_size;
        let mut logits = vec![0.0f32; vocab as usize];
        // One untimed warm-up of each test, as llama-bench does.
        let prompt = tokens(opts.prompt, vocab, 1);
        let gen = tokens(opts.generate, vocab, 2);
        let mut run =
            |test: String, n: usize, f: &mut dyn FnMut(&mut LoadedModel, &mut [f32]) -> Result<f64>| {
                f(&mut model, &mut logits)?;
                let samples: Vec<f64> = (0..opts.repetitions.max(1))
                    .map(|_| f(&mut model, &mut logits).map(|s| n as f64 / s))
                    .collect::<Result<_>>()?;
                let (mean, sd) = mean_sd(&samples);
                results.push(BenchResult {
                    model: entry.reference.clone(),
                    test,
                    threads,
                    tokens_per_second: mean,
                    stddev: sd,
                    samples,
                });
                Ok::<(), anyhow::Error>(())
            };
        if opts.prompt > 0 {
            run(format!("pp{}", opts.prompt), opts.prompt, &mut |m, l| {
                time_prompt(m, &prompt, opts.batch, l)
            })?;
        }
        if opts.generate > 0 {
            run(format!("tg{}", opts.generate), opts.generate, &mut |m, l| {
                time_generation(m, &gen, l)
            })?;
        }
    }
    Ok(results)
}
