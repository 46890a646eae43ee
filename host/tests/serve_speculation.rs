//! Prompt-lookup speculation end to end with Qwen2.5-Coder 0.5B: with `BERTH_SPECULATION=on` a
//! greedy request that copies from its prompt gets drafts accepted (counted in `/metrics`), and
//! its text, like a free-text answer's, is token for token the one a server without speculation
//! gives; `berth run --verbose` reports the acceptance and gives its own plain text. Underneath:
//! the plugin's logits for up to `MAX_DRAFT + 1` rows of one sequence in one call are bit for bit
//! those of the same rows one call each (what keeps speculation's output identical).

mod common;

use common::*;
use std::process::Command;

const MODEL: &str = "qwen2.5-coder:0.5b";

/// A source file to copy with one identifier renamed.
const SOURCE: &str = "fn total(values: &[i64]) -> i64 {
    let mut acc = 0;
    for v in values {
        acc += v;
    }
    acc
}

fn mean(values: &[i64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    total(values) as f64 / values.len() as f64
}
";

/// Serves `home` with speculation `on` or off.
fn serve(home: &std::path::Path, speculation: &str) -> TestServer {
    let (child, base, port) = spawn_serve(
        Command::new(berth_exe())
            .args(["serve", "--port", "0", "--parallel", "2"])
            .env("BERTH_HOME", home)
            .env("BERTH_PLUGIN_PATH", home_plugins(home))
            .env("BERTH_SPECULATION", speculation)
            .env("BERTH_LOG", "info"),
    );
    TestServer { child, base, port }
}

/// The greedy answer to one user message.
fn answer(server: &TestServer, user: &str, max_tokens: u32) -> String {
    let body = serde_json::json!({"model": MODEL, "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": user}]});
    let (status, body) = server.post("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// One value of `/metrics`.
fn metric(server: &TestServer, name: &str) -> f64 {
    let (_, text) = server.http("GET", "/metrics", None);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

#[test]
fn speculation_keeps_greedy_text_identical_and_accepts_drafts_when_copying() {
    let home = home_with_qwen("berth-spec-", MODEL);
    let copy = format!(
        "Rewrite this Rust code with the function `total` renamed to `sum_all`. Output only the code.\n\n{SOURCE}"
    );
    let free = "Write two sentences about the history of the printing press.";
    let (plain_copy, plain_free) = {
        let server = serve(home.path(), "off");
        let texts = (answer(&server, &copy, 72), answer(&server, free, 32));
        assert_eq!(metric(&server, "berth_speculative_draft_tokens_total"), 0.0);
        texts
    };
    let server = serve(home.path(), "on");
    let spec_copy = answer(&server, &copy, 72);
    let drafted = metric(&server, "berth_speculative_draft_tokens_total");
    let accepted = metric(&server, "berth_speculative_accepted_tokens_total");
    eprintln!("copy task: {accepted} of {drafted} drafted tokens accepted");
    assert_eq!(spec_copy, plain_copy, "speculation changed the greedy copy");
    assert!(
        spec_copy.contains("sum_all"),
        "the model did the task: {spec_copy}"
    );
    assert!(
        drafted > 0.0 && accepted >= drafted / 2.0,
        "{accepted} of {drafted}"
    );
    let rate = metric(&server, "berth_speculative_acceptance_rate");
    assert!((rate - accepted / drafted).abs() < 1e-9);
    assert_eq!(
        answer(&server, free, 32),
        plain_free,
        "speculation changed the greedy free text"
    );
}

#[test]
fn berth_run_verbose_reports_the_draft_acceptance_and_keeps_its_text() {
    let home = home_with_qwen("berth-spec-run-", MODEL);
    let prompt = format!(
        "Rewrite this Rust code with the function `total` renamed to `sum_all`. Output only the code.\n\n{SOURCE}"
    );
    let run = |speculation: &str| {
        let out = Command::new(berth_exe())
            .args(["run", "--verbose", "--temperature", "0", MODEL, &prompt])
            .env("BERTH_HOME", home.path())
            .env("BERTH_PLUGIN_PATH", home_plugins(home.path()))
            .env("BERTH_SPECULATION", speculation)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (plain, plain_err) = run("off");
    let (spec, spec_err) = run("on");
    assert!(!plain_err.contains("draft acceptance"), "{plain_err}");
    let line = spec_err
        .lines()
        .find(|l| l.starts_with("draft acceptance:"))
        .unwrap_or_else(|| panic!("no acceptance line in:\n{spec_err}"));
    eprintln!("{line}");
    assert_eq!(spec, plain, "speculation changed berth run's greedy text");
    assert!(spec.contains("sum_all"), "{spec}");
}

#[test]
fn verify_rows_of_one_sequence_round_as_single_rows() {
    use berth::engine::speculation::MAX_DRAFT;
    let home = home_with_qwen("berth-spec-rows-", MODEL);
    let store = berth_registry::store::Store::new(home.path().to_path_buf());
    // The plugin under test (home_with_qwen installed it), never an older copy elsewhere.
    let plugins = berth::plugins::PluginSet::discover(&[home_plugins(home.path())]);
    let mut model = berth::bench::load_pack_from(&plugins, &store, MODEL, 2).unwrap();
    let gguf = berth_registry::gguf::GgufFile::open(real_model("qwen2.5-coder-0.5b")).unwrap();
    let tokenizer = berth::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let text =
        format!("<|im_start|>user\nRename total to sum_all:\n{SOURCE}<|im_end|>\n<|im_start|>assistant\n");
    let prompt: Vec<i32> = tokenizer
        .encode(&text, false)
        .into_iter()
        .map(|t| t as i32)
        .collect();
    // Past MAX_DRAFT + 1 too: rows of one sequence that all want logits go through the kernels
    // four at a time (one weight read for four rows) and the rest one by one, and must round as
    // single rows in every grouping.
    for width in 2..=(MAX_DRAFT + 1).max(6) {
        let r = berth::bench::compare_multi_row_logits(&mut model, &prompt, 24, width).unwrap();
        eprintln!("{}", serde_json::to_string(&r).unwrap());
        assert_eq!(r.bit_identical, r.rows, "{width} rows per call: {r:?}");
    }
}
