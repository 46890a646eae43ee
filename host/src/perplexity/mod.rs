//! `berth perplexity`: the counterpart of `llama-perplexity`. Perplexity over a text in windows
//! of `n_ctx` tokens (the first token of each window BOS where the model adds one), scoring the
//! second half of each window; with `--kl-divergence-base FILE` it writes the scored
//! distributions in llama.cpp's own base-file format, and with `--kl-divergence` it compares a
//! run with such a file (written by either engine). Windows are fed through the plugin in the
//! engine's aligned prefill chunks ([`PREFILL_CHUNK`] rows), so the figures measure the kernels
//! `berth serve` runs.

pub mod logits_file;
pub mod stats;

use crate::bench::load_pack_for;
use crate::engine::PREFILL_CHUNK;
use crate::pack::load_text_side;
use crate::plugins::PluginSet;
use anyhow::{anyhow, bail, Context, Result};
use berth_plugin_api::BatchView;
use berth_registry::store::Store;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use logits_file::{quantize_row, row_words, scored_rows, BaseReader, BaseWriter, Header};
use serde::Serialize;
use stats::{covariance, mean_and_uncertainty, median, nll, percentile, KldSums, NllSums};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What to measure and how.
#[derive(Clone, Debug, Default)]
pub struct PerplexityOptions {
    /// The text to score (not needed with `kl_divergence`: the base file holds the tokens).
    pub file: Option<PathBuf>,
    /// Tokens per window.
    pub context: usize,
    /// Score at most this many windows.
    pub chunks: Option<usize>,
    /// Compute threads (`None`: the plugin decides).
    pub threads: Option<u32>,
    /// Run with every weight dequantised to f32 (the load option `dequantize`).
    pub dequantize: bool,
    /// llama.cpp's `--kl-divergence-base`: the base file to write (or, with `kl_divergence`, read).
    pub base_file: Option<PathBuf>,
    /// llama.cpp's `--kl-divergence`: compare with `base_file` instead of writing it.
    pub kl_divergence: bool,
    /// Show a progress bar on stderr (when it is a terminal).
    pub progress: bool,
}

/// The figures of one run, as `--json` prints them.
#[derive(Clone, Debug, Serialize)]
pub struct PerplexityReport {
    /// Pack reference.
    pub model: String,
    /// `BERTH_KERNELS` as set for the run, or `native`.
    pub kernels: String,
    /// Whether the weights were dequantised to f32.
    pub dequantized: bool,
    /// Tokens in the text (or in the base file).
    pub text_tokens: usize,
    /// Tokens per window.
    pub context: usize,
    /// Windows scored.
    pub chunks: usize,
    /// Tokens scored.
    pub tokens_scored: usize,
    /// Perplexity.
    pub ppl: f64,
    /// Its ± estimate (standard error, as llama.cpp's final estimate).
    pub ppl_error: f64,
    /// Seconds spent in the model.
    pub seconds: f64,
    /// Tokens fed per second of model time.
    pub tokens_per_second: f64,
    /// Against a base file, when one was compared.
    pub kld: Option<KldReport>,
}

/// KL-divergence statistics against a base run, named as llama.cpp prints them.
#[derive(Clone, Debug, Serialize)]
pub struct KldReport {
    /// PPL of the base run (from its stored distributions).
    pub ppl_base: f64,
    /// Its ± estimate.
    pub ppl_base_error: f64,
    /// Correlation of ln PPL with ln PPL(base), in %.
    pub ln_ppl_correlation_pct: f64,
    /// Mean ln(PPL/PPL(base)).
    pub ln_ppl_ratio: f64,
    /// Its ± estimate.
    pub ln_ppl_ratio_error: f64,
    /// Mean KL divergence.
    pub mean: f64,
    /// Its ± estimate.
    pub mean_error: f64,
    /// Largest KLD.
    pub max: f32,
    /// 99.9th percentile.
    pub p99_9: f32,
    /// 99th percentile.
    pub p99: f32,
    /// 95th percentile.
    pub p95: f32,
    /// 90th percentile.
    pub p90: f32,
    /// Median.
    pub median: f32,
    /// 10th percentile.
    pub p10: f32,
    /// Smallest KLD.
    pub min: f32,
    /// Mean Δp (probability of the right token, this run minus base), in %.
    pub mean_p_diff_pct: f64,
    /// Its ± estimate, in %.
    pub mean_p_diff_error_pct: f64,
    /// Largest Δp, in %.
    pub max_p_diff_pct: f64,
    /// Smallest Δp, in %.
    pub min_p_diff_pct: f64,
    /// RMS Δp, in %.
    pub rms_p_diff_pct: f64,
    /// Its ± estimate, in %.
    pub rms_p_diff_error_pct: f64,
    /// Tokens whose most likely next token is the base's, in %.
    pub same_top_pct: f64,
    /// Its ± estimate, in %.
    pub same_top_error_pct: f64,
}

/// What each scored row is used for.
enum Mode {
    /// Perplexity only.
    Plain,
    /// Perplexity, and the rows stored in a base file.
    Write(BaseWriter),
    /// Compared with a base file's rows.
    Compare(BaseReader),
}

/// Per-token results a comparison keeps for its percentiles.
#[derive(Default)]
struct Tally {
    nll: NllSums,
    kld: KldSums,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

/// Runs `berth perplexity` on one pack, printing llama.cpp's running figures to stdout as it
/// goes (unless `quiet`), and returns the report.
pub fn perplexity(
    store: &Store,
    home: &Path,
    reference: &str,
    opts: &PerplexityOptions,
    quiet: bool,
) -> Result<PerplexityReport> {
    let entry = store.get(reference)?;
    let (tokenizer, _) = load_text_side(&entry)?;
    let mut mode;
    let (n_ctx, tokens) = if opts.kl_divergence {
        let path = opts
            .base_file
            .as_ref()
            .ok_or_else(|| anyhow!("--kl-divergence needs --kl-divergence-base FILE to compare with"))?;
        let reader = BaseReader::open(path)?;
        if opts.context != 0 && opts.context != reader.header.n_ctx {
            eprintln!(
                "berth: {} was computed with n_ctx {}; using that, not {}",
                path.display(),
                reader.header.n_ctx,
                opts.context
            );
        }
        let n_ctx = reader.header.n_ctx;
        let tokens = reader.header.tokens.clone();
        mode = Mode::Compare(reader);
        (n_ctx, tokens)
    } else {
        let path = opts
            .file
            .as_ref()
            .ok_or_else(|| anyhow!("name the text to score with -f FILE"))?;
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let tokens: Vec<i32> = tokenizer
            .encode(&text, true)
            .into_iter()
            .map(|t| t as i32)
            .collect();
        mode = Mode::Plain;
        (opts.context, tokens)
    };
    if n_ctx < 4 {
        bail!("the context (-c) must be at least 4 tokens, not {n_ctx}");
    }
    if tokens.len() < 2 * n_ctx {
        bail!(
            "the text tokenizes to {} tokens; a context of {n_ctx} needs at least {} (two windows)",
            tokens.len(),
            2 * n_ctx
        );
    }
    let available = tokens.len() / n_ctx;
    let n_chunk = opts.chunks.map_or(available, |c| c.clamp(1, available));
    let plugins = PluginSet::discover_default(home);
    let mut model = load_pack_for(&plugins, store, reference, |c| {
        c.threads = opts.threads;
        c.context_length = Some(n_ctx as u32);
        if opts.dequantize {
            c.options.insert("dequantize".into(), true.into());
        }
    })?;
    let n_vocab = model.description().vocab_size as usize;
    if (model.description().context_length as usize) < n_ctx {
        bail!(
            "{} holds at most {} tokens; -c {n_ctx} does not fit",
            entry.reference,
            model.description().context_length
        );
    }
    match &mut mode {
        Mode::Compare(r) if r.header.n_vocab != n_vocab => bail!(
            "the base file's vocabulary has {} entries and {}'s has {n_vocab}: not the same model",
            r.header.n_vocab,
            entry.reference
        ),
        Mode::Compare(_) if tokens.iter().any(|&t| t < 0 || t as usize >= n_vocab) => {
            bail!("the base file holds tokens outside the vocabulary of {n_vocab}: a damaged file")
        }
        Mode::Plain => {
            if let Some(path) = &opts.base_file {
                let header = Header {
                    n_ctx,
                    n_vocab,
                    n_chunk,
                    tokens: tokens[..n_chunk * n_ctx].to_vec(),
                };
                mode = Mode::Write(BaseWriter::create(path, &header)?);
            }
        }
        _ => {}
    }
    let bos = tokenizer
        .add_bos()
        .then(|| tokenizer.bos_id())
        .flatten()
        .map(|b| b as i32);
    let workers = model
        .description()
        .extra
        .get("threads")
        .and_then(|t| t.as_u64())
        .unwrap_or(1)
        .max(1) as usize;

    let bar = progress_bar(opts.progress && !quiet, (n_chunk * n_ctx) as u64);
    let mut tally = Tally::default();
    let mut seconds = 0.0;
    let mut logits = vec![0.0f32; PREFILL_CHUNK * n_vocab];
    let words = row_words(n_vocab);
    let mut stored = vec![0u16; PREFILL_CHUNK * words];
    let first = n_ctx / 2;
    if !quiet && matches!(mode, Mode::Compare(_)) {
        println!(
            "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
        );
    }
    for chunk in 0..n_chunk {
        let window = &tokens[chunk * n_ctx..(chunk + 1) * n_ctx];
        let mut fed = window.to_vec();
        if let Some(b) = bos {
            fed[0] = b;
        }
        model.instance()?.seq_truncate(0, 0)?;
        for (piece, rows) in fed.chunks(PREFILL_CHUNK).enumerate() {
            let start = piece * PREFILL_CHUNK;
            let positions: Vec<i32> = (start..start + rows.len()).map(|p| p as i32).collect();
            // Row p predicts token p + 1: the scored rows are first ..= n_ctx - 2.
            let want: Vec<u8> = (start..start + rows.len())
                .map(|p| u8::from(p >= first && p + 1 < n_ctx))
                .collect();
            let outputs = want.iter().filter(|&&w| w != 0).count();
            let batch = BatchView {
                tokens: rows,
                positions: &positions,
                seq_ids: &vec![0; rows.len()],
                want_logits: &want,
            };
            let t0 = Instant::now();
            model.decode(&batch, &mut logits)?;
            seconds += t0.elapsed().as_secs_f64();
            if outputs > 0 {
                let first_row = start.max(first);
                let next: Vec<usize> = (first_row..first_row + outputs)
                    .map(|p| window[p + 1] as usize)
                    .collect();
                score_rows(
                    &mut mode,
                    &logits[..outputs * n_vocab],
                    &next,
                    &mut stored[..outputs * words],
                    n_vocab,
                    workers,
                    &mut tally,
                )?;
            }
            bar.inc(rows.len() as u64);
            bar.set_message(format!(
                "{:.1} tokens/s",
                ((chunk * n_ctx + start + rows.len()) as f64) / seconds.max(1e-9)
            ));
        }
        if !quiet {
            print_chunk_line(chunk, &mode, &tally);
        }
    }
    bar.finish_and_clear();
    if let Mode::Write(w) = mode {
        w.finish()?;
    }
    let compared = tally.kld.count > 0;
    let (ppl, ppl_error) = if compared {
        let (m, e) = mean_and_uncertainty(tally.kld.nll.sum, tally.kld.nll.sum2, tally.kld.count);
        (m.exp(), m.exp() * e)
    } else {
        tally.nll.ppl()
    };
    let report = PerplexityReport {
        model: entry.reference.clone(),
        kernels: std::env::var("BERTH_KERNELS").unwrap_or_else(|_| "native".into()),
        dequantized: opts.dequantize,
        text_tokens: tokens.len(),
        context: n_ctx,
        chunks: n_chunk,
        tokens_scored: n_chunk * scored_rows(n_ctx),
        ppl,
        ppl_error,
        seconds,
        tokens_per_second: (n_chunk * n_ctx) as f64 / seconds.max(1e-9),
        kld: compared.then(|| kld_report(&mut tally)),
    };
    if !quiet {
        print_final(&report);
    }
    Ok(report)
}

/// A progress bar over tokens fed, on stderr when it is a terminal.
fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} tokens {msg} {eta}")
            .expect("the progress template parses"),
    );
    bar
}

/// Scores the rows of one decode call (`next[i]` is the token row `i` predicts), spread over
/// `workers` threads: their NLL, and per mode their stored form or their comparison.
fn score_rows(
    mode: &mut Mode,
    logits: &[f32],
    next: &[usize],
    stored: &mut [u16],
    n_vocab: usize,
    workers: usize,
    tally: &mut Tally,
) -> Result<()> {
    let words = row_words(n_vocab);
    let rows = next.len();
    let per = rows.div_ceil(workers.clamp(1, rows.max(1)));
    match mode {
        Mode::Plain => {
            let jobs: Vec<_> = logits
                .chunks(per * n_vocab)
                .zip(next.chunks(per))
                .map(|(l, n)| {
                    move || {
                        let mut sums = NllSums::default();
                        for (row, &t) in l.chunks_exact(n_vocab).zip(n) {
                            sums.add(nll(row, t));
                        }
                        sums
                    }
                })
                .collect();
            in_parallel(jobs).iter().for_each(|p| tally.nll.merge(p));
        }
        Mode::Write(writer) => {
            let jobs: Vec<_> = logits
                .chunks(per * n_vocab)
                .zip(next.chunks(per))
                .zip(stored.chunks_mut(per * words))
                .map(|((l, n), out)| {
                    move || {
                        let mut sums = NllSums::default();
                        for ((row, &t), o) in l.chunks_exact(n_vocab).zip(n).zip(out.chunks_exact_mut(words))
                        {
                            sums.add(quantize_row(row, t, o));
                        }
                        sums
                    }
                })
                .collect();
            in_parallel(jobs).iter().for_each(|p| tally.nll.merge(p));
            writer.write_rows(stored)?;
        }
        Mode::Compare(reader) => {
            reader
                .read_rows(stored)
                .context("reading the base file's rows (it ended early)")?;
            let jobs: Vec<_> = logits
                .chunks(per * n_vocab)
                .zip(next.chunks(per))
                .zip(stored.chunks(per * words))
                .map(|((l, n), base)| {
                    move || {
                        let mut sums = KldSums::default();
                        let (mut k, mut p) = (Vec::new(), Vec::new());
                        for ((row, &t), b) in l.chunks_exact(n_vocab).zip(n).zip(base.chunks_exact(words)) {
                            let (kld, p_diff) = sums.add(row, b, t);
                            k.push(kld as f32);
                            p.push(p_diff);
                        }
                        (sums, k, p)
                    }
                })
                .collect();
            for (sums, k, p) in in_parallel(jobs) {
                tally.kld.merge(&sums);
                tally.kld_values.extend(k);
                tally.p_diff_values.extend(p);
            }
        }
    }
    Ok(())
}

/// Runs each job on a scoped thread of its own; their results in order.
fn in_parallel<T: Send, F: FnOnce() -> T + Send>(jobs: Vec<F>) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.into_iter().map(|job| s.spawn(job)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("scoring thread"))
            .collect()
    })
}

/// The running line llama.cpp prints after each chunk.
fn print_chunk_line(chunk: usize, mode: &Mode, t: &Tally) {
    use std::io::Write;
    match mode {
        Mode::Compare(_) => {
            let k = &t.kld;
            let lp = mean_and_uncertainty(k.nll.sum, k.nll.sum2, k.count);
            let lb = mean_and_uncertainty(k.nll_base.sum, k.nll_base.sum2, k.count);
            let cov = covariance(k.nll.sum, k.nll_base.sum, k.nll_nll_base, k.count);
            let ratio_unc = (lp.1 * lp.1 + lb.1 * lb.1 - 2.0 * cov).max(0.0).sqrt();
            let kl = mean_and_uncertainty(k.kld, k.kld2, k.count);
            let mse = mean_and_uncertainty(k.p_diff2, k.p_diff4, k.count);
            let rms = mse.0.sqrt();
            let top = k.same_top as f64 / k.count as f64;
            println!(
                "{:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
                chunk + 1,
                lp.0.exp(),
                lp.0.exp() * lp.1,
                lp.0 - lb.0,
                ratio_unc,
                kl.0,
                kl.1,
                100.0 * rms,
                100.0 * 0.5 / rms.max(f64::MIN_POSITIVE) * mse.1,
                100.0 * top,
                100.0 * (top * (1.0 - top) / (k.count as f64 - 1.0).max(1.0)).sqrt()
            );
        }
        _ => {
            print!(
                "[{}]{:.4},",
                chunk + 1,
                (t.nll.sum / t.nll.count.max(1) as f64).exp()
            );
            let _ = std::io::stdout().flush();
        }
    }
}

/// The comparison's summary figures; sorts the per-token values.
fn kld_report(t: &mut Tally) -> KldReport {
    let k = &t.kld;
    t.kld_values.sort_by(f32::total_cmp);
    t.p_diff_values.sort_by(f32::total_cmp);
    let (kv, pv) = (&t.kld_values, &t.p_diff_values);
    let lp = mean_and_uncertainty(k.nll.sum, k.nll.sum2, k.count);
    let lb = mean_and_uncertainty(k.nll_base.sum, k.nll_base.sum2, k.count);
    let cov = covariance(k.nll.sum, k.nll_base.sum, k.nll_nll_base, k.count);
    let kl = mean_and_uncertainty(k.kld, k.kld2, k.count);
    let pd = mean_and_uncertainty(k.p_diff, k.p_diff2, k.count);
    let mse = mean_and_uncertainty(k.p_diff2, k.p_diff4, k.count);
    let rms = mse.0.sqrt();
    let top = k.same_top as f64 / k.count as f64;
    KldReport {
        ppl_base: lb.0.exp(),
        ppl_base_error: lb.0.exp() * lb.1,
        ln_ppl_correlation_pct: 100.0 * cov / (lp.1 * lb.1),
        ln_ppl_ratio: lp.0 - lb.0,
        ln_ppl_ratio_error: (lp.1 * lp.1 + lb.1 * lb.1 - 2.0 * cov).max(0.0).sqrt(),
        mean: kl.0,
        mean_error: kl.1,
        max: kv[kv.len() - 1],
        p99_9: percentile(kv, 0.999),
        p99: percentile(kv, 0.99),
        p95: percentile(kv, 0.95),
        p90: percentile(kv, 0.90),
        median: median(kv),
        p10: percentile(kv, 0.10),
        min: kv[0],
        mean_p_diff_pct: 100.0 * pd.0,
        mean_p_diff_error_pct: 100.0 * pd.1,
        max_p_diff_pct: 100.0 * f64::from(pv[pv.len() - 1]),
        min_p_diff_pct: 100.0 * f64::from(pv[0]),
        rms_p_diff_pct: 100.0 * rms,
        rms_p_diff_error_pct: 100.0 * 0.5 / rms.max(f64::MIN_POSITIVE) * mse.1,
        same_top_pct: 100.0 * top,
        same_top_error_pct: 100.0 * (top * (1.0 - top) / (k.count as f64 - 1.0).max(1.0)).sqrt(),
    }
}

/// The closing figures, in llama.cpp's words.
fn print_final(r: &PerplexityReport) {
    println!();
    println!(
        "{}: {} chunks of {} tokens ({} in the text), {} scored, {:.1} tokens/s ({} kernels{})",
        r.model,
        r.chunks,
        r.context,
        r.text_tokens,
        r.tokens_scored,
        r.tokens_per_second,
        r.kernels,
        if r.dequantized { ", dequantized to f32" } else { "" }
    );
    let Some(k) = &r.kld else {
        println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_error);
        return;
    };
    println!("====== Perplexity statistics ======");
    println!(
        "Mean PPL(Q)                   : {:10.6} ± {:10.6}",
        r.ppl, r.ppl_error
    );
    println!(
        "Mean PPL(base)                : {:10.6} ± {:10.6}",
        k.ppl_base, k.ppl_base_error
    );
    println!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        k.ln_ppl_correlation_pct
    );
    println!(
        "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
        k.ln_ppl_ratio, k.ln_ppl_ratio_error
    );
    println!();
    println!("====== KL divergence statistics ======");
    println!("Mean    KLD: {:10.6} ± {:10.6}", k.mean, k.mean_error);
    println!("Maximum KLD: {:10.6}", k.max);
    println!("99.9%   KLD: {:10.6}", k.p99_9);
    println!("99.0%   KLD: {:10.6}", k.p99);
    println!("95.0%   KLD: {:10.6}", k.p95);
    println!("90.0%   KLD: {:10.6}", k.p90);
    println!("Median  KLD: {:10.6}", k.median);
    println!("10.0%   KLD: {:10.6}", k.p10);
    println!("Minimum KLD: {:10.6}", k.min);
    println!();
    println!("====== Token probability statistics ======");
    println!(
        "Mean    Δp: {:6.3} ± {:5.3} %",
        k.mean_p_diff_pct, k.mean_p_diff_error_pct
    );
    println!("Maximum Δp: {:6.3}%", k.max_p_diff_pct);
    println!("Minimum Δp: {:6.3}%", k.min_p_diff_pct);
    println!(
        "RMS Δp    : {:6.3} ± {:5.3} %",
        k.rms_p_diff_pct, k.rms_p_diff_error_pct
    );
    println!(
        "Same top p: {:6.3} ± {:5.3} %",
        k.same_top_pct, k.same_top_error_pct
    );
}
