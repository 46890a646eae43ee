//! `berth perplexity` on the real models, as CI's accuracy check: a short slice of the prose
//! text (scripts/fetch-texts) scored with the default kernels must stay within stated bounds of
//! the committed reference figures (tests/fixtures/perplexity/slice.json, measured with
//! `berth perplexity` and llama.cpp's `llama-perplexity` on the same GGUF files and slice), and
//! the default kernels' KL divergence from the f32 run (`--dequantize`, computed here) must stay
//! at or under llama.cpp's own against the same kind of base. Accuracy is deterministic for a
//! kernel set, so nothing here is timed.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| real_models_home("berth-ppl-"))
}

/// The prose text (The Adventures of Sherlock Holmes), fetched and checksummed by the script.
fn prose() -> PathBuf {
    let out = script_stdout("fetch-texts", &[]);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("prose "))
        .expect("fetch-texts prints the prose path");
    PathBuf::from(line)
}

fn fixture() -> Value {
    let path = repo_root().join("tests/fixtures/perplexity/slice.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `berth perplexity` with `args`, its JSON report.
fn perplexity(args: &[&str]) -> Value {
    let mut all = vec!["perplexity"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = berth_ok(home(), Some(&home_plugins(home())), &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// Scores the slice for one model with its f32 base, then with the default kernels against it,
/// and checks both against the committed figures.
fn check_model(model: &str) {
    let fx = fixture();
    let want = &fx["models"][model];
    let (ctx, chunks) = (fx["context"].to_string(), fx["chunks"].to_string());
    let text = prose();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.bin");
    let base = base.to_str().unwrap();
    let common = ["-c", &ctx, "--chunks", &chunks, "-t", "2"];
    let mut args = vec![
        model,
        "-f",
        text.to_str().unwrap(),
        "--dequantize",
        "--kl-divergence-base",
        base,
    ];
    args.extend(common);
    let f32_run = perplexity(&args);
    let mut args = vec![model, "--kl-divergence", "--kl-divergence-base", base];
    args.extend(common);
    let run = perplexity(&args);
    let kld = &run["kld"];
    eprintln!(
        "{model}: PPL {:.4} (f32 {:.4}), mean KLD {:.6} ± {:.6}, same top {:.2} %",
        f(&run, "ppl"),
        f(&f32_run, "ppl"),
        f(kld, "mean"),
        f(kld, "mean_error"),
        f(kld, "same_top_pct")
    );
    assert_eq!(run["tokens_scored"], fx["tokens_scored"], "the slice changed");

    // The f32 run is the reference the transformers checks hold to 1e-3 in the logits: its PPL
    // moves only with the text, the tokenizer or the model code.
    let bound = f(want, "f32_ppl_bound");
    let (got, reference) = (f(&f32_run, "ppl"), f(want, "f32_ppl"));
    assert!(
        (got / reference).ln().abs() <= bound,
        "{model}: f32 PPL {got} moved from {reference} by more than {bound} in ln"
    );
    // The default kernels: PPL within the stated bound of the committed figure, and the KL
    // divergence from the f32 run no larger than llama.cpp's from the same base on the same GGUF
    // (within both printed uncertainties).
    let bound = f(want, "ppl_bound");
    let (got, reference) = (f(&run, "ppl"), f(want, "ppl"));
    assert!(
        (got / reference).ln().abs() <= bound,
        "{model}: PPL {got} moved from {reference} by more than {bound} in ln"
    );
    let limit = f(want, "llama_cpp_kld") + f(want, "llama_cpp_kld_error") + f(kld, "mean_error");
    assert!(
        f(kld, "mean") <= limit,
        "{model}: mean KLD {} from the f32 run is above llama.cpp's {limit}",
        f(kld, "mean")
    );
    let floor = f(want, "llama_cpp_same_top_pct") - f(want, "llama_cpp_same_top_error_pct");
    assert!(
        f(kld, "same_top_pct") >= floor,
        "{model}: same top token {} % under llama.cpp's {floor} %",
        f(kld, "same_top_pct")
    );
}

#[test]
fn qwen_perplexity_and_kld_hold_their_reference() {
    check_model("qwen2.5-coder:0.5b");
}

#[test]
fn gemma_perplexity_and_kld_hold_their_reference() {
    check_model("gemma3:270m");
}

/// `berth perplexity`'s refusals, each with its reason, before any model time is spent.
#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fail = |args: &[&str]| {
        let out = berth(home(), Some(&home_plugins(home())), args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A text shorter than two windows.
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "Only a few words.").unwrap();
    let err = fail(&["perplexity", "gemma3:270m", "-f", short.to_str().unwrap()]);
    assert!(err.contains("needs at least 1024"), "{err}");
    // No text at all.
    let err = fail(&["perplexity", "gemma3:270m"]);
    assert!(err.contains("-f FILE"), "{err}");
    // A base file that is not one, and one cut short.
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"definitely not logits").unwrap();
    let junk = junk.to_str().unwrap();
    let err = fail(&[
        "perplexity",
        "gemma3:270m",
        "--kl-divergence",
        "--kl-divergence-base",
        junk,
    ]);
    assert!(err.contains("not a KL-divergence base file"), "{err}");
    let text = prose();
    let base = dir.path().join("base.bin");
    let base = base.to_str().unwrap();
    let args = ["-c", "64", "--chunks", "2", "-t", "2"];
    let mut write = vec![
        "perplexity",
        "gemma3:270m",
        "-f",
        text.to_str().unwrap(),
        "--kl-divergence-base",
        base,
    ];
    write.extend(args);
    berth_ok(home(), Some(&home_plugins(home())), &write);
    // Another model's base: the vocabularies differ.
    let err = fail(&[
        "perplexity",
        "qwen2.5-coder:0.5b",
        "--kl-divergence",
        "--kl-divergence-base",
        base,
    ]);
    assert!(err.contains("not the same model"), "{err}");
    let mut bytes = std::fs::read(base).unwrap();
    // A token id past the vocabulary (the first token, right after the 20-byte header).
    let first_token = bytes[20..24].to_vec();
    bytes[20..24].copy_from_slice(&i32::MAX.to_le_bytes());
    std::fs::write(base, &bytes).unwrap();
    let err = fail(&[
        "perplexity",
        "gemma3:270m",
        "--kl-divergence",
        "--kl-divergence-base",
        base,
    ]);
    assert!(err.contains("outside the vocabulary"), "{err}");
    bytes[20..24].copy_from_slice(&first_token);
    std::fs::write(base, &bytes[..bytes.len() - 100]).unwrap();
    let err = fail(&[
        "perplexity",
        "gemma3:270m",
        "--kl-divergence",
        "--kl-divergence-base",
        base,
    ]);
    assert!(err.contains("truncated"), "{err}");
}
