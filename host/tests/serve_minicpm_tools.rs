//! A MiniCPM5-style model (chat format minicpm_xml: plain-text `<function name="N"><param
//! name="K">V</param></function>` calls) serves every `tool_choice`: a scripted model (byte
//! tokenizer, a template naming MiniCPM5's markup) replays a call or a sentence, and `auto`,
//! `required`, a named function and `none` each answer 200 with the calls parsed and valid against
//! the tools' schemas (for `none`, no call: the markup stays content), streamed and not.

mod common;

use common::*;
use serde_json::{json, Value};

/// A template naming MiniCPM5's markup (detected as minicpm_xml, no reasoning markup).
const MINICPM_TEMPLATE: &str = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n\nTool usage guidelines:\n<function name=\"function-name\"><param name=\"param-name\">param-value</param></function>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

/// The call the scripted model writes when the prompt says `[call]`.
const CALL: &str = "<function name=\"get_weather\"><param name=\"location\"><![CDATA[Paris\n<1er>]]></param><param name=\"days\">3</param></function>";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"location": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["location"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"tz": {"type": "string", "enum": ["CET", "UTC"]}}, "required": ["tz"]}}}
    ])
}

/// Whether a call's arguments follow its tool's schema (the two tools above).
fn valid_call(name: &str, arguments: &str) -> bool {
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    match name {
        "get_weather" => {
            args.keys().all(|k| k == "location" || k == "days")
                && args.get("location").is_some_and(Value::is_string)
                && args
                    .get("days")
                    .is_none_or(|d| d.as_i64().is_some_and(|d| (1..=7).contains(&d)))
        }
        "get_time" => {
            args.len() == 1 && matches!(args.get("tz").and_then(Value::as_str), Some("CET" | "UTC"))
        }
        _ => false,
    }
}

/// The message and finish reason of a non-streamed chat completion (asserting status 200).
fn complete(server: &TestServer, prompt: &str, choice: Value, parallel: bool) -> (Value, String) {
    let body = json!({"model": "minicpm:latest", "messages": [{"role": "user", "content": prompt}],
        "tools": tools(), "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 400});
    let (status, text) = server.post("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{choice}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let choice0 = &v["choices"][0];
    (
        choice0["message"].clone(),
        choice0["finish_reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// The streamed deltas of the same request, added up: (content, calls as (name, arguments)).
fn stream(server: &TestServer, prompt: &str, choice: Value) -> (String, Vec<(String, String)>) {
    let body = json!({"model": "minicpm:latest", "messages": [{"role": "user", "content": prompt}],
        "tools": tools(), "tool_choice": choice, "parallel_tool_calls": false, "max_tokens": 400,
        "stream": true});
    let (status, text) = server.post("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        if let Some(c) = delta["content"].as_str() {
            content.push_str(c);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                calls.push((call["function"]["name"].as_str().unwrap().into(), String::new()));
            }
            calls[i]
                .1
                .push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (content, calls)
}

fn calls_of(message: &Value) -> Vec<(String, String)> {
    message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap().to_string(),
                c["function"]["arguments"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_minicpm_model_serves_auto_required_named_and_none_with_valid_calls() {
    let home = tempfile::Builder::new()
        .prefix("berth-minicpm-tools-")
        .tempdir()
        .unwrap();
    let h = home.path();
    berth_ok(
        h,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let script = json!({"stop_tokens": [256], "tools": true, "entries": [
        {"trigger": byte_tokens("[call]"), "reply": byte_tokens(CALL)},
        {"trigger": byte_tokens("[text]"), "reply": byte_tokens("It is sunny.")},
    ]});
    let src = h.join("src-minicpm");
    write_scripted_pack(&src, "minicpm", "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], Some(MINICPM_TEMPLATE));
    berth_ok(h, None, &["import", src.to_str().unwrap()]);
    let server = TestServer::start(h, &[]);
    let weather = (
        "get_weather".to_string(),
        r#"{"location":"Paris\n<1er>","days":3}"#.to_string(),
    );

    // auto: the model's own call is read, typed by the schema; a sentence stays content.
    let (m, finish) = complete(&server, "[call]", json!("auto"), true);
    assert_eq!(calls_of(&m), std::slice::from_ref(&weather), "{m}");
    assert_eq!(finish, "tool_calls");
    assert_eq!(
        stream(&server, "[call]", json!("auto")),
        (String::new(), vec![weather.clone()])
    );
    let (m, finish) = complete(&server, "[text]", json!("auto"), true);
    assert_eq!(
        (m["content"].as_str(), calls_of(&m).len()),
        (Some("It is sunny."), 0),
        "{m}"
    );
    assert_eq!(finish, "stop");

    // required: one valid call, and (parallel calls off) nothing after it.
    let (m, finish) = complete(&server, "[call]", json!("required"), false);
    assert_eq!(calls_of(&m), std::slice::from_ref(&weather), "{m}");
    assert!(valid_call(&weather.0, &weather.1));
    assert_eq!(finish, "tool_calls");

    // A named function: exactly one call of it, whatever the model wanted. (Once its reply is
    // refused the scripted model has no preference among the tokens the grammar leaves: it picks
    // one at random, so a forced call surely ends only where the schema leaves no free text, as
    // `get_time`'s enum does.)
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    for prompt in ["[call]", "[text]"] {
        let (m, _) = complete(&server, prompt, named.clone(), true);
        let calls = calls_of(&m);
        assert_eq!(calls.len(), 1, "{prompt}: {m}");
        assert_eq!(calls[0].0, "get_time");
        assert!(valid_call(&calls[0].0, &calls[0].1), "{prompt}: {calls:?}");
        let (content, streamed) = stream(&server, prompt, named.clone());
        assert_eq!((content.as_str(), streamed.len()), ("", 1), "{prompt}: streamed");
        assert_eq!(streamed[0].0, "get_time");
        assert!(
            valid_call(&streamed[0].0, &streamed[0].1),
            "{prompt}: {streamed:?}"
        );
    }

    // none: no call is read; what the model wrote is content, byte for byte (the server
    // constrains `none` no further for any format: call markup stays text).
    let (m, finish) = complete(&server, "[call]", json!("none"), true);
    assert!(calls_of(&m).is_empty(), "{m}");
    assert_eq!(m["content"], CALL);
    assert_eq!(finish, "stop");
    let (m, _) = complete(&server, "[text]", json!("none"), true);
    assert_eq!(m["content"], "It is sunny.");
}
