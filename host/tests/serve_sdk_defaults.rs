//! What client libraries send by default, end to end on every surface it touches (issue 28): a
//! scripted model (byte tokenizer, hermes markup as single tokens) replays a call followed by the
//! newline Qwen writes after it, a bare JSON call cut by `max_tokens`, JSON for a schema; the
//! requests carry `tool_choice: "required"` / Anthropic `any`, `strict` tools, Responses
//! `item_reference`, Anthropic `output_config`, and OpenAI's prompt-cache fields.

mod common;

use common::*;
use serde_json::{json, Value};

/// Dumps the tools as Qwen2.5's template does (`tojson`), so what reaches the prompt is visible
/// to the scripted model's triggers.
const TEMPLATE: &str = "{% if tools %}Call tools as <tool_call>{\"name\": N, \"arguments\": A}</tool_call>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

/// The special tokens, from id 256: end of turn, then the call markers.
const SPECIALS: [&str; 3] = ["<|end|>", "<tool_call>", "</tool_call>"];

/// The call the model makes, and what it writes after the close marker.
const CALL: &str = "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}";

/// Token ids of a text where the specials are single tokens.
fn tokens(text: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for (i, s) in SPECIALS.iter().enumerate() {
            if let Some(after) = rest.strip_prefix(s) {
                out.push(256 + i as i32);
                rest = after;
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap();
        out.extend(byte_tokens(&c.to_string()));
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
        "required": ["location"], "additionalProperties": false}}}])
}

/// The same tool as openai-agents and pydantic-ai send it.
fn strict_tools() -> Value {
    let mut t = tools();
    t[0]["function"]["strict"] = true.into();
    t
}

fn anthropic_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
        "properties": {"location": {"type": "string"}}, "required": ["location"]}}])
}

/// A server over a home with the scripted pack `m:latest`: `[call]` makes it call then write a
/// newline, `[bare]` write a bare call, `[json]` JSON for `{"n": integer}`; a prompt showing a
/// `strict` key makes it say so.
fn serve() -> (tempfile::TempDir, TestServer) {
    let home = tempfile::Builder::new().prefix("berth-sdk-").tempdir().unwrap();
    let h = home.path();
    berth_ok(
        h,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let entries = json!([
        {"trigger": byte_tokens("\"strict\""), "reply": tokens("strict leaked into the prompt")},
        {"trigger": byte_tokens("[call]"), "reply": tokens(&format!("<tool_call>\n{CALL}\n</tool_call>\n"))},
        {"trigger": byte_tokens("[bare]"), "reply": tokens(CALL)},
        {"trigger": byte_tokens("[json]"), "reply": tokens("{\"n\": 3}")},
        {"reply": tokens("Hello.")},
    ]);
    let script = json!({"stop_tokens": [256], "tools": true, "entries": entries});
    let src = h.join("src");
    write_scripted_pack(&src, "m", "latest", &script);
    write_byte_tokenizer(&src, &SPECIALS, Some(TEMPLATE));
    berth_ok(h, None, &["import", src.to_str().unwrap()]);
    let server = TestServer::start(h, &[]);
    (home, server)
}

/// The JSON events of an SSE body (`data:` lines, `[DONE]` left out).
fn sse(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// What a reply said: its text, its calls as (name, arguments), how it ended.
#[derive(Debug, PartialEq)]
struct Reply {
    text: String,
    calls: Vec<(String, String)>,
    end: String,
}

fn openai(server: &TestServer, body: Value) -> Reply {
    let stream = body["stream"] == true;
    let (status, out) = server.post("/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{out}");
    if !stream {
        let v: Value = serde_json::from_str(&out).unwrap();
        let m = &v["choices"][0]["message"];
        let calls = m["tool_calls"].as_array().into_iter().flatten();
        return Reply {
            text: m["content"].as_str().unwrap_or("").into(),
            calls: calls
                .map(|c| {
                    (
                        c["function"]["name"].as_str().unwrap().into(),
                        c["function"]["arguments"].as_str().unwrap().into(),
                    )
                })
                .collect(),
            end: v["choices"][0]["finish_reason"].as_str().unwrap().into(),
        };
    }
    let mut r = Reply {
        text: String::new(),
        calls: Vec::new(),
        end: String::new(),
    };
    for e in sse(&out) {
        let c = &e["choices"][0];
        r.text += c["delta"]["content"].as_str().unwrap_or("");
        for call in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if i == r.calls.len() {
                r.calls
                    .push((call["function"]["name"].as_str().unwrap().into(), String::new()));
            }
            r.calls[i].1 += call["function"]["arguments"].as_str().unwrap_or("");
        }
        if let Some(f) = c["finish_reason"].as_str() {
            r.end = f.into();
        }
    }
    r
}

fn anthropic(server: &TestServer, body: Value) -> Reply {
    let stream = body["stream"] == true;
    let (status, out) = server.post("/v1/messages", &body.to_string());
    assert_eq!(status, 200, "{out}");
    let mut r = Reply {
        text: String::new(),
        calls: Vec::new(),
        end: String::new(),
    };
    if !stream {
        let v: Value = serde_json::from_str(&out).unwrap();
        for b in v["content"].as_array().unwrap() {
            match b["type"].as_str().unwrap() {
                "text" => r.text += b["text"].as_str().unwrap(),
                "tool_use" => r
                    .calls
                    .push((b["name"].as_str().unwrap().into(), b["input"].to_string())),
                _ => {}
            }
        }
        r.end = v["stop_reason"].as_str().unwrap().into();
        return r;
    }
    for e in sse(&out) {
        match e["type"].as_str().unwrap() {
            "content_block_start" if e["content_block"]["type"] == "tool_use" => r
                .calls
                .push((e["content_block"]["name"].as_str().unwrap().into(), String::new())),
            "content_block_delta" => {
                r.text += e["delta"]["text"].as_str().unwrap_or("");
                if let Some(j) = e["delta"]["partial_json"].as_str() {
                    r.calls.last_mut().unwrap().1 += j;
                }
            }
            "message_delta" => r.end = e["delta"]["stop_reason"].as_str().unwrap().into(),
            _ => {}
        }
    }
    // Streamed inputs are JSON text; compare them as the non-streamed objects print.
    for c in &mut r.calls {
        c.1 = serde_json::from_str::<Value>(&c.1).map_or(c.1.clone(), |v| v.to_string());
    }
    r
}

/// A Responses reply, and the id of its response.
fn responses(server: &TestServer, body: Value) -> (Reply, Value) {
    let stream = body["stream"] == true;
    let (status, out) = server.post("/v1/responses", &body.to_string());
    assert_eq!(status, 200, "{out}");
    let v = if stream {
        let events = sse(&out);
        let done = events
            .iter()
            .find(|e| e["type"] == "response.completed" || e["type"] == "response.incomplete");
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        let v = done.expect("a final event")["response"].clone();
        let whole: String = responses_text(&v);
        assert_eq!(text, whole, "streamed text equals the final response's");
        v
    } else {
        serde_json::from_str(&out).unwrap()
    };
    let calls = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call");
    let reply = Reply {
        text: responses_text(&v),
        calls: calls
            .map(|c| {
                (
                    c["name"].as_str().unwrap().into(),
                    c["arguments"].as_str().unwrap().into(),
                )
            })
            .collect(),
        end: v["status"].as_str().unwrap().into(),
    };
    (reply, v)
}

fn ollama(server: &TestServer, body: Value) -> Reply {
    let (status, out) = server.post("/api/chat", &body.to_string());
    assert_eq!(status, 200, "{out}");
    let mut r = Reply {
        text: String::new(),
        calls: Vec::new(),
        end: String::new(),
    };
    // NDJSON, one object a chunk (the chunk-size lines of the raw HTTP body are left out).
    for line in out.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).unwrap();
        r.text += v["message"]["content"].as_str().unwrap_or("");
        for c in v["message"]["tool_calls"].as_array().into_iter().flatten() {
            r.calls.push((
                c["function"]["name"].as_str().unwrap().into(),
                c["function"]["arguments"].to_string(),
            ));
        }
        if let Some(d) = v["done_reason"].as_str() {
            r.end = d.into();
        }
    }
    r
}

fn one_call(args: &str) -> Vec<(String, String)> {
    vec![("get_weather".to_string(), args.to_string())]
}

/// `required` (Anthropic `any`) with a model that writes a newline after its call: one call,
/// then the turn ends. Before, the grammar allowed only another call after that newline, so the
/// model called again until `max_tokens`.
#[test]
fn required_and_any_end_the_turn_after_a_call_and_its_newline() {
    let (_home, server) = serve();
    let args = "{\"location\": \"Paris\"}";
    for stream in [false, true] {
        let r = openai(
            &server,
            json!({"model": "m", "messages": [{"role": "user", "content": "[call]"}], "tools": tools(),
                "tool_choice": "required", "max_tokens": 300, "stream": stream}),
        );
        assert_eq!(
            r,
            Reply {
                text: String::new(),
                calls: one_call(args),
                end: "tool_calls".into()
            },
            "stream {stream}"
        );
        let r = anthropic(
            &server,
            json!({"model": "m", "max_tokens": 300, "messages": [{"role": "user", "content": "[call]"}],
                "tools": anthropic_tools(), "tool_choice": {"type": "any"}, "stream": stream}),
        );
        let obj = json!({"location": "Paris"}).to_string();
        assert_eq!(
            r,
            Reply {
                text: String::new(),
                calls: one_call(&obj),
                end: "tool_use".into()
            },
            "stream {stream}"
        );
        let flat = json!([{"type": "function", "name": "get_weather",
            "parameters": tools()[0]["function"]["parameters"]}]);
        let (r, _) = responses(
            &server,
            json!({"model": "m", "input": "[call]", "tools": flat, "tool_choice": "required",
                "max_output_tokens": 300, "stream": stream}),
        );
        assert_eq!(
            r,
            Reply {
                text: String::new(),
                calls: one_call(args),
                end: "completed".into()
            },
            "stream {stream}"
        );
    }
}

/// `strict` (and other transport keys) never reach the prompt: the scripted model answers
/// "strict leaked" when the rendered tools show one.
#[test]
fn strict_tools_are_rendered_without_the_strict_key() {
    let (_home, server) = serve();
    let r = openai(
        &server,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": strict_tools()}),
    );
    assert_eq!(r.text, "Hello.");
    let flat = json!([{"type": "function", "name": "get_weather", "strict": true,
        "parameters": tools()[0]["function"]["parameters"]}]);
    let (r, _) = responses(&server, json!({"model": "m", "input": "hi", "tools": flat}));
    assert_eq!(r.text, "Hello.");
}

/// A reply cut by `max_tokens` in the middle of a bare JSON call (no markup) is that text as
/// content on every surface, streamed and not, never an empty reply.
#[test]
fn a_bare_call_cut_by_max_tokens_is_content_everywhere() {
    let (_home, server) = serve();
    let cut = &CALL[..20];
    for stream in [false, true] {
        let r = openai(
            &server,
            json!({"model": "m", "messages": [{"role": "user", "content": "[bare]"}], "tools": tools(),
                "max_tokens": 20, "stream": stream}),
        );
        assert_eq!(
            r,
            Reply {
                text: cut.into(),
                calls: vec![],
                end: "length".into()
            },
            "stream {stream}"
        );
        let r = anthropic(
            &server,
            json!({"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "[bare]"}],
                "tools": anthropic_tools(), "stream": stream}),
        );
        assert_eq!(
            r,
            Reply {
                text: cut.into(),
                calls: vec![],
                end: "max_tokens".into()
            },
            "stream {stream}"
        );
        let flat = json!([{"type": "function", "name": "get_weather",
            "parameters": tools()[0]["function"]["parameters"]}]);
        let (r, _) = responses(
            &server,
            json!({"model": "m", "input": "[bare]", "tools": flat, "max_output_tokens": 20, "stream": stream}),
        );
        assert_eq!(
            r,
            Reply {
                text: cut.into(),
                calls: vec![],
                end: "incomplete".into()
            },
            "stream {stream}"
        );
        let r = ollama(
            &server,
            json!({"model": "m", "messages": [{"role": "user", "content": "[bare]"}], "tools": tools(),
                "options": {"num_predict": 20}, "stream": stream}),
        );
        assert_eq!(
            r,
            Reply {
                text: cut.into(),
                calls: vec![],
                end: "length".into()
            },
            "stream {stream}"
        );
    }
}

/// The Vercel AI SDK's OpenAI provider sends earlier assistant turns as `item_reference` items
/// naming ids Berth issued: three turns, streamed and not.
#[test]
fn responses_item_references_continue_a_conversation() {
    let (_home, server) = serve();
    let mut input = vec![json!({"role": "user", "content": [{"type": "input_text", "text": "hi"}]})];
    for turn in 0..3 {
        let (r, v) = responses(
            &server,
            json!({"model": "m", "input": input, "stream": turn == 1}),
        );
        assert_eq!(r.text, "Hello.", "turn {turn}");
        for item in v["output"].as_array().unwrap() {
            input.push(json!({"type": "item_reference", "id": item["id"]}));
        }
        input.push(json!({"role": "user", "content": [{"type": "input_text", "text": "again"}]}));
    }
    let bad = json!({"model": "m", "input": [{"role": "user", "content": "hi"},
        {"type": "item_reference", "id": "msg_unknown"}]});
    let (status, out) = server.post("/v1/responses", &bad.to_string());
    assert_eq!(status, 400, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["error"]["param"], "input[1].id", "{out}");
}

/// The anthropic SDK's `messages.parse(output_format=...)` sends `output_config.format`: the reply
/// follows the schema (a schema it cannot is a 400 naming the place, in Anthropic's shape).
#[test]
fn anthropic_output_config_constrains_the_reply_to_its_schema() {
    let (_home, server) = serve();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": false});
    for stream in [false, true] {
        for key in ["output_config", "output_format"] {
            let format = json!({"type": "json_schema", "schema": schema});
            let wrapped = if key == "output_config" {
                json!({"format": format, "effort": "low"})
            } else {
                format
            };
            let r = anthropic(
                &server,
                json!({"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "[json]"}],
                    key: wrapped, "stream": stream}),
            );
            assert_eq!(
                serde_json::from_str::<Value>(&r.text).unwrap(),
                json!({"n": 3}),
                "{key}"
            );
            assert_eq!(r.end, "end_turn");
        }
    }
    let bad = json!({"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "[json]"}],
        "output_config": {"format": {"type": "json_schema"}}});
    let (status, out) = server.post("/v1/messages", &bad.to_string());
    assert_eq!(status, 400, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["type"], "error", "{out}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("output_config.format.schema"),
        "{out}"
    );
}

/// `prompt_cache_key`, `safety_identifier` and `prompt_cache_retention` change no answer: chat
/// completions accepts them as Responses does.
#[test]
fn prompt_cache_fields_are_accepted_on_chat_completions() {
    let (_home, server) = serve();
    let r = openai(
        &server,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "conv-1",
            "safety_identifier": "user-1", "prompt_cache_retention": "24h"}),
    );
    assert_eq!(r.text, "Hello.");
    let (r, _) = responses(
        &server,
        json!({"model": "m", "input": "hi", "prompt_cache_key": "conv-1", "safety_identifier": "user-1",
            "prompt_cache_retention": "in_memory"}),
    );
    assert_eq!(r.text, "Hello.");
}
