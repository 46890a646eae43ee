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
