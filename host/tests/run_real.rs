//! `berth run` on the real models: chat with Qwen2.5-Coder, raw completion with Gemma 3 base.

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A Berth home with both real models imported and the two family plugins installed, shared by
/// the tests of this file.
fn home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| real_models_home("berth-run-"))
}

#[test]
fn qwen_answers_the_capital_of_france_with_paris() {
    let out = berth_ok(
        home(),
        Some(&home_plugins(home())),
        &[
            "run",
            "qwen2.5-coder:0.5b",
            "What is the capital of France? Answer in one sentence.",
            "--temperature",
            "0",
        ],
    );
    assert!(out.contains("Paris"), "{out}");
    assert!(out.trim().lines().count() <= 3, "one sentence expected: {out}");
}

#[test]
fn gemma_base_completes_the_eiffel_tower_sentence_with_paris() {
    let out = berth_ok(
        home(),
        Some(&home_plugins(home())),
        &[
            "run",
            "--raw",
            "gemma3:270m",
            "The Eiffel Tower is located in the city of",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
        ],
    );
    assert!(out.trim_start().starts_with("Paris"), "{out}");
}

#[test]
fn chat_with_a_base_model_without_template_is_a_clear_error() {
    let out = berth(
        home(),
        Some(&home_plugins(home())),
        &["run", "gemma3:270m", "Hello"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no chat template") && err.contains("--raw"),
        "{err}"
    );
}

#[test]
fn interactive_chat_keeps_history_and_understands_commands() {
    let mut child = Command::new(berth_exe())
        .args([
            "run",
            "qwen2.5-coder:0.5b",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--verbose",
        ])
        .env("BERTH_HOME", home())
        .env("BERTH_PLUGIN_PATH", home_plugins(home()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = "/show info\nMy name is Ada. Reply with one word: OK.\nWhat is my name? Answer with the name only.\n/clear\n/bye\n";
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("context length"), "{stderr}");
    assert!(stderr.contains("Cleared session context"), "{stderr}");
    assert!(stderr.contains("eval rate:"), "{stderr}");
    assert!(stderr.contains("cached"), "{stderr}");
    assert!(
        stdout.contains("Ada"),
        "the second answer uses the first turn: {stdout}"
    );
}

/// `berth run` and `berth serve` give Qwen2.5-Coder's same greedy answer: speculation on and
/// off (a copy-heavy prompt, so drafts are taken), and under a JSON schema.
#[test]
fn qwen_run_and_serve_give_the_same_greedy_answer() {
    // No trailing newline: `berth run` trims what is typed, as `ollama run` does.
    let code = "def area(width, height):\n    return width * height";
    let prompt = format!("Rename `width` to `w` in this function and show the whole function:\n{code}");
    let schema = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"},
        "country": {"type": "string"}}, "required": ["city", "country"]});
    for (speculation, schema) in [("on", None), ("off", None), ("off", Some(&schema))] {
        let mut args = vec![
            "run",
            "qwen2.5-coder:0.5b",
            &prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "48",
        ];
        let format = schema.map(|s| s.to_string());
        if let Some(f) = &format {
            args.extend(["--format", f.as_str()]);
        }
        let plugins = home_plugins(home());
        let mut run = Command::new(berth_exe());
        run.args(&args)
            .env("BERTH_HOME", home())
            .env("BERTH_PLUGIN_PATH", &plugins)
            .env("BERTH_SPECULATION", speculation);
        let out = run.output().expect("berth runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let ran = String::from_utf8_lossy(&out.stdout).into_owned();
        let (mut child, _, port) = common::spawn_serve(
            Command::new(berth_exe())
                .args(["serve", "--port", "0", "--host", "127.0.0.1"])
                .env("BERTH_HOME", home())
                .env("BERTH_PLUGIN_PATH", &plugins)
                .env("BERTH_SPECULATION", speculation)
                .env("BERTH_LOG", "warn"),
        );
        let mut body = serde_json::json!({"model": "qwen2.5-coder:0.5b", "temperature": 0, "max_tokens": 48,
            "messages": [{"role": "user", "content": prompt}]});
        if let Some(s) = schema {
            body["response_format"] =
                serde_json::json!({"type": "json_schema", "json_schema": {"name": "place", "schema": s}});
        }
        let (status, text) = http_request(port, "POST", "/v1/chat/completions", &body.to_string());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(status, 200, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        let served = answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(!served.is_empty(), "{answer}");
        assert_eq!(
            ran.trim_end(),
            served.trim_end(),
            "speculation {speculation}, schema {schema:?}: `berth run` and `berth serve` differ"
        );
    }
}
