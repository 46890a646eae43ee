//! `tool_choice: "auto"` with calls written without the template's markup, end to end: a
//! scripted model (byte tokenizer, a hermes_json and a qwen_xml template) replays each form small
//! models write (a bare call object, a list, several objects, a fenced one, a lead-in sentence,
//! `<tools>` and `<function_call>` wrappers), and the official `openai` and `ollama` Python
//! clients must get the same calls streamed and not, with `finish_reason: "tool_calls"`; without
//! tools, or with `tool_choice: "none"`, the same text is content byte for byte.
//! (tests/serve/openai_checks.py `tolerant`; the real-model check is in serve_real.rs.)

mod common;

use berth::chat::tolerant_forms::{bare_forms, Form};
use common::*;
use serde_json::{json, Value};
use std::process::Command;

/// A template naming the hermes markup (detected as hermes_json).
const HERMES_TEMPLATE: &str = "{% if tools %}Call tools as <tool_call>{\"name\": N, \"arguments\": A}</tool_call>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";
/// A template naming the Qwen XML markup (detected as qwen_xml).
const XML_TEMPLATE: &str = "{% if tools %}Call tools as <tool_call><function=N><parameter=K>V</parameter></function></tool_call>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

/// The forms the scripted model replays: the parser's corpus, except those holding a real
/// `<tool_call>` token (under `auto` the grammar forces the proper markup once it appears, so only
/// the unit tests read them).
fn forms() -> Vec<Form> {
    bare_forms()
        .into_iter()
        .filter(|f| !f.0.contains("tool_call>"))
        .collect()
}

fn tools() -> Value {
    let f = |name: &str, param: &str| {
        json!({"type": "function", "function": {"name": name, "description": "A test tool",
            "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}}})
    };
    json!([f("get_weather", "location"), f("get_time", "tz")])
}

/// The prompt that makes the scripted model write form `i`.
fn prompt(i: usize) -> String {
    format!("[form-{i:02}]")
}

#[test]
fn calls_without_markup_are_calls_streamed_and_not_through_openai_and_ollama_clients() {
    let home = tempfile::Builder::new()
        .prefix("berth-tolerant-")
        .tempdir()
        .unwrap();
    let h = home.path();
    berth_ok(
        h,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let entries: Vec<Value> = forms()
        .iter()
        .enumerate()
        .map(|(i, (text, _, _))| json!({"trigger": byte_tokens(&prompt(i)), "reply": byte_tokens(text)}))
        .collect();
    let script = json!({"stop_tokens": [256], "tools": true, "entries": entries});
    let specials = ["<|end|>", "<tool_call>", "</tool_call>"];
    for (name, template) in [("hermes", HERMES_TEMPLATE), ("xml", XML_TEMPLATE)] {
        let src = h.join(format!("src-{name}"));
        write_scripted_pack(&src, name, "latest", &script);
        write_byte_tokenizer(&src, &specials, Some(template));
        berth_ok(h, None, &["import", src.to_str().unwrap()]);
    }
    let cases: Vec<Value> = forms()
        .iter()
        .enumerate()
        .map(|(i, (text, content, calls))| {
            json!({"prompt": prompt(i), "text": text, "content": content, "calls": calls})
        })
        .collect();
    let spec = h.join("cases.json");
    std::fs::write(&spec, json!({"tools": tools(), "cases": cases}).to_string()).unwrap();
    let server = TestServer::start(h, &[]);
    for model in ["hermes:latest", "xml:latest"] {
        let out = Command::new(client_python())
            .arg(repo_root().join("tests/serve/openai_checks.py"))
            .args([server.base.as_str(), model, "tolerant", spec.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{model}: check tolerant failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("ok tolerant {} forms", forms().len())),
            "{stdout}"
        );
        eprintln!("{model}: {}", stdout.trim());
    }
    // The server logs which chat format each pack was detected as.
    let (_, models) = server.http("GET", "/v1/models", None);
    assert!(
        models.contains("hermes:latest") && models.contains("xml:latest"),
        "{models}"
    );
}
