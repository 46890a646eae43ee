//! `berth show NAME --template` and `berth render`: the template text and the exact prompt, for
//! the real Qwen2.5-Coder GGUF, compared with transformers' renders (tests/fixtures/templates).

mod common;

use common::{berth, berth_ok, real_model, repo_root};
use std::path::Path;

fn qwen_home(dir: &Path) -> std::path::PathBuf {
    let home = dir.join("home");
    let qwen = real_model("qwen2.5-coder-0.5b");
    berth_ok(
        &home,
        None,
        &["import", qwen.to_str().unwrap(), "--name", "qwen2.5-coder:0.5b"],
    );
    home
}

fn transformers_fixture() -> serde_json::Value {
    let path = repo_root().join("tests/fixtures/templates/qwen2.5-coder-0.5b.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn case<'a>(fixture: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

#[test]
fn show_template_and_render_print_what_transformers_renders() {
    let tmp = tempfile::tempdir().unwrap();
    let home = qwen_home(tmp.path());
    let fixture = transformers_fixture();

    let text = berth_ok(&home, None, &["show", "qwen2.5-coder:0.5b", "--template"]);
    assert_eq!(text.trim_end(), fixture["template"].as_str().unwrap().trim_end());

    for name in ["plain_chat", "tools", "tool_call_round_trip"] {
        let c = case(&fixture, name);
        let messages = tmp.path().join(format!("{name}.messages.json"));
        std::fs::write(&messages, c["messages"].to_string()).unwrap();
        let mut args = vec![
            "render",
            "qwen2.5-coder:0.5b",
            "--messages",
            messages.to_str().unwrap(),
        ];
        let tools = tmp.path().join(format!("{name}.tools.json"));
        if let Some(t) = c.get("tools") {
            std::fs::write(&tools, t.to_string()).unwrap();
            args.extend(["--tools", tools.to_str().unwrap()]);
        }
        if c["add_generation_prompt"] == false {
            args.push("--no-generation-prompt");
        }
        let out = berth(&home, None, &args);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            c["prompt"].as_str().unwrap(),
            "{name}"
        );
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains("chat format: hermes_json"), "{log}");
    }
}

#[test]
fn render_takes_a_request_body_and_kwargs() {
    let tmp = tempfile::tempdir().unwrap();
    let home = qwen_home(tmp.path());
    let body = tmp.path().join("request.json");
    std::fs::write(
        &body,
        r#"{"model": "qwen2.5-coder:0.5b", "messages": [{"role": "system", "content": "{{ x }}"}, {"role": "user", "content": "Hi"}],
            "chat_template_kwargs": {"unused": 1}}"#,
    )
    .unwrap();
    let out = berth_ok(
        &home,
        None,
        &[
            "render",
            "qwen2.5-coder:0.5b",
            "--messages",
            body.to_str().unwrap(),
            "--no-generation-prompt",
        ],
    );
    assert_eq!(
        out,
        "<|im_start|>system\n{{ x }}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );

    // A non-object --kwargs is refused with the parameter's name.
    let out = berth(
        &home,
        None,
        &[
            "render",
            "qwen2.5-coder:0.5b",
            "--messages",
            body.to_str().unwrap(),
            "--kwargs",
            "[1]",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("chat_template_kwargs: must be a JSON object"),
        "{err}"
    );
}

#[test]
fn show_template_of_a_pack_without_one_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let gemma = real_model("gemma3-270m");
    berth_ok(
        &home,
        None,
        &["import", gemma.to_str().unwrap(), "--name", "gemma3:270m"],
    );
    let out = berth(&home, None, &["show", "gemma3:270m", "--template"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no chat template"), "{err}");
}
