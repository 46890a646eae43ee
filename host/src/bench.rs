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

/// Loads one pack with one sequence and `threads` threads through the best installed plugin.
pub fn load_pack(store: &Store, home: &Path, reference: &str, threads: u32) -> Result<LoadedModel> {
    load_pack_from(&PluginSet::discover_default(home), store, reference, threads)
}

/// [`load_pack`] with the plugin chosen from `plugins` (a test names the build under test).
pub fn load_pack_from(
    plugins: &PluginSet,
    store: &Store,
    reference: &str,
    threads: u32,
) -> Result<LoadedModel> {
    load_pack_for(plugins, store, reference, |c| c.threads = Some(threads))
}

/// Loads one pack with one sequence through the best plugin in `plugins`, after `configure` has
/// adjusted its load config (threads, context, load options).
pub fn load_pack_for(
    plugins: &PluginSet,
    store: &Store,
    reference: &str,
    configure: impl FnOnce(&mut berth_plugin_api::LoadConfig),
) -> Result<LoadedModel> {
    let entry = store.get(reference)?;
    let m = entry
        .manifest
        .as_ref()
        .ok_or_else(|| anyhow!("{}: {}", entry.reference, entry.problems.join("; ")))?;
    let (_, plugin) = plugins
        .best_for(&packs::probe_config(m))
        .ok_or_else(|| anyhow!("no installed plugin serves {}", entry.reference))?;
    let mut config = packs::load_config(&entry, m);
    config.max_sequences = Some(1);
    configure(&mut config);
    Ok(LoadedModel::load(plugin.clone(), &config)?)
}

/// Runs the benchmark for one pack at every thread count.
pub fn bench_pack(
    store: &Store,
    home: &Path,
    reference: &str,
    opts: &BenchOptions,
) -> Result<Vec<BenchResult>> {
    let name = store.get(reference)?.reference.clone();
    let mut results = Vec::new();
    for &threads in &opts.threads {
        let mut model = load_pack(store, home, reference, threads)?;
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
                    model: name.clone(),
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

/// How a sequence's logits computed several rows per call (the verify step of speculative
/// decoding) compare with the same rows computed one row per call (plain decoding).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RowAgreement {
    /// Rows compared.
    pub rows: usize,
    /// Rows per call on the several-rows side.
    pub width: usize,
    /// Rows whose greedy token (argmax) is the same both ways.
    pub argmax_equal: usize,
    /// Rows whose logits are bit-identical both ways.
    pub bit_identical: usize,
    /// Largest absolute logit difference over all rows.
    pub max_abs_diff: f32,
    /// Mean milliseconds of one single-row call.
    pub single_row_ms: f64,
    /// Mean milliseconds of one `width`-row call.
    pub multi_row_ms: f64,
}

/// Prefills `prompt` into sequence 0 (aligned 64-row chunks), generates `generate` greedy tokens
/// one row per call, then rewinds to the prompt and feeds the same tokens `width` rows per call
/// with logits for every row, and compares the two sets of logits row by row.
pub fn compare_multi_row_logits(
    model: &mut LoadedModel,
    prompt: &[i32],
    generate: usize,
    width: usize,
) -> Result<RowAgreement> {
    let vocab = model.description().vocab_size as usize;
    let width = width.max(1);
    let mut logits = vec![0.0f32; vocab * width];
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |best, (i, &v)| if v > best.1 { (i, v) } else { best },
            )
            .0 as i32
    };
    time_prompt(model, prompt, 64, &mut logits)?;
    let mut next = argmax(&logits[..vocab]);
    let (mut fed, mut single) = (Vec::new(), Vec::new());
    let start = Instant::now();
    for i in 0..generate {
        let b = BatchView {
            tokens: std::slice::from_ref(&next),
            positions: &[(prompt.len() + i) as i32],
            seq_ids: &[0],
            want_logits: &[1],
        };
        model.decode(&b, &mut logits)?;
        fed.push(next);
        single.extend_from_slice(&logits[..vocab]);
        next = argmax(&logits[..vocab]);
    }
    let single_row_ms = start.elapsed().as_secs_f64() * 1e3 / generate.max(1) as f64;
    model.instance()?.seq_truncate(0, prompt.len() as u32)?;
    let mut multi = Vec::new();
    let start = Instant::now();
    for (c, chunk) in fed.chunks(width).enumerate() {
        let first = prompt.len() + c * width;
        let positions: Vec<i32> = (0..chunk.len()).map(|k| (first + k) as i32).collect();
        let b = BatchView {
            tokens: chunk,
            positions: &positions,
            seq_ids: &vec![0; chunk.len()],
            want_logits: &vec![1; chunk.len()],
        };
        model.decode(&b, &mut logits)?;
        multi.extend_from_slice(&logits[..chunk.len() * vocab]);
    }
    let calls = generate.div_ceil(width).max(1);
    let multi_row_ms = start.elapsed().as_secs_f64() * 1e3 / calls as f64;
    let rows: Vec<(&[f32], &[f32])> = single.chunks(vocab).zip(multi.chunks(vocab)).collect();
    Ok(RowAgreement {
        rows: rows.len(),
        width,
        argmax_equal: rows.iter().filter(|(a, b)| argmax(a) == argmax(b)).count(),
        bit_identical: rows.iter().filter(|(a, b)| a == b).count(),
        max_abs_diff: rows
            .iter()
            .flat_map(|(a, b)| a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()))
            .fold(0.0, f32::max),
        single_row_ms,
        multi_row_ms,
    })
}
