//! Features combined end to end, where each alone is tested elsewhere and the combination is where
//! a bug would hide: `n` > 1 with tools and with a `json_schema` response format (every choice,
//! sampled or greedy, streamed or not, obeys), legacy `/v1/completions` with `n` > 1, prompt-lookup
//! speculation next to a grammar (the constrained answer is the one a server without speculation
//! gives, alone or batched with a request that drafts), and Anthropic streaming with
//! `tool_choice: auto` cut by `max_tokens` in the middle of a call (the stream stays well formed,
//! `stop_reason` is `max_tokens`, and nothing the model wrote is lost: the stream adds up to the
//! non-streamed answer). Real `berth serve` processes: Qwen2.5-Coder 0.5B, and a scripted model
//! for the cut call at every length.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;
use std::sync::Mutex;

/// Qwen tests run one at a time: they share two cores.
static SERIAL: Mutex<()> = Mutex::new(());

const MODEL: &str = "qwen2.5-coder:0.5b";

/// A POST whose answer must be 200; returns the body as JSON.
fn ok(server: &TestServer, path: &str, body: &Value) -> Value {
    server.post_ok(path, body)
}

/// The `data:` payloads of a streamed answer (its `[DONE]` dropped).
fn sse(server: &TestServer, path: &str, body: &Value) -> Vec<Value> {
    let (status, text) = server.post(path, &body.to_string());
    assert_eq!(status, 200, "{path}: {text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// Two tools whose parameters admit nothing but their one required string.
fn tools() -> Value {
    let tool = |name: &str, what: &str, param: &str| {
        json!({"type": "function", "function": {"name": name, "description": what,
            "parameters": {"type": "object", "properties": {param: {"type": "string"}},
                "required": [param], "additionalProperties": false}}})
    };
    json!([
        tool("get_weather", "Current weather for a city", "location"),
        tool("get_time", "Current time in a time zone", "tz"),
    ])
}

/// Panics unless `args` (a call's arguments text) obey tool `name` of [`tools`]: an object with
/// exactly its one parameter, a string.
fn assert_obeys_tool(name: &str, args: &str, what: &str) {
    let param = match name {
        "get_weather" => "location",
        "get_time" => "tz",
        other => panic!("{what}: a call of {other}, which was not offered"),
    };
    let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{what}: {e}: {args}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {args}"));
    assert!(
        o.len() == 1 && o[param].is_string(),
        "{what}: {name} takes only a string {param}: {args}"
    );
}

/// A response format whose schema bounds every value.
fn city_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "city", "strict": true, "schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}, "population": {"type": "integer"},
            "coastal": {"type": "boolean"}},
        "required": ["city", "population", "coastal"], "additionalProperties": false}}})
}

/// Panics unless `content` obeys [`city_format`]'s schema.
fn assert_obeys_city(content: &str, what: &str) {
    let v: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{what}: {e}: {content}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {content}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["city", "coastal", "population"], "{what}: {content}");
    let city = o["city"].as_str().unwrap_or_else(|| panic!("{what}: {content}"));
    assert!(city.chars().count() <= 24, "{what}: {content}");
    assert!(
        o["population"].is_i64() || o["population"].is_u64(),
        "{what}: {content}"
    );
    assert!(o["coastal"].is_boolean(), "{what}: {content}");
}

/// One choice's calls as (name, arguments).
fn calls_of(message: &Value) -> Vec<(String, String)> {
    message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    (
                        c["function"]["name"].as_str().unwrap().to_string(),
                        c["function"]["arguments"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A streamed chat's choices added up by index: (content, calls, finish reason).
type StreamedChoice = (String, Vec<(String, String)>, String);

fn add_up_chat(events: &[Value], n: usize) -> Vec<StreamedChoice> {
    let mut out: Vec<StreamedChoice> = vec![Default::default(); n];
    for e in events {
        for c in e["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            let (content, calls, finish) = &mut out[i];
            content.push_str(c["delta"]["content"].as_str().unwrap_or(""));
            for t in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let k = t["index"].as_u64().unwrap() as usize;
                if k == calls.len() {
                    calls.push(Default::default());
                }
                let f = &t["function"];
                calls[k].0.push_str(f["name"].as_str().unwrap_or(""));
                calls[k].1.push_str(f["arguments"].as_str().unwrap_or(""));
            }
            if let Some(f) = c["finish_reason"].as_str() {
                assert!(finish.is_empty(), "choice {i} finished twice");
                *finish = f.to_string();
            }
        }
    }
    out
}

#[test]
fn n_choices_each_obey_the_tools_and_the_json_schema_streamed_and_not() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen("berth-combined-n-", MODEL);
    let server = TestServer::start(home.path(), &["--parallel", "4"]);
    let ask = |user: &str| json!([{"role": "user", "content": user}]);
    let weather = ask("What is the weather like in Paris, France right now?");

    // Sampled choices differ, yet each one obeys `required`: calls of offered tools only, with
    // arguments their schemas admit.
    for (choice, n) in [
        (json!("required"), 3),
        (json!({"type": "function", "function": {"name": "get_time"}}), 2),
    ] {
        let body = json!({"model": MODEL, "messages": weather, "tools": tools(), "tool_choice": choice,
            "n": n, "temperature": 1.0, "seed": 5, "max_tokens": 80});
        let v = ok(&server, "/v1/chat/completions", &body);
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), n, "{v}");
        let mut nonstreamed = Vec::new();
        for (i, c) in choices.iter().enumerate() {
            let what = format!("tool_choice {choice}, choice {i}");
            assert_eq!(c["index"], i, "{what}: {v}");
            assert_eq!(c["finish_reason"], "tool_calls", "{what}: {v}");
            let calls = calls_of(&c["message"]);
            assert!(!calls.is_empty(), "{what}: no call: {v}");
            for (name, args) in &calls {
                if choice.is_object() {
                    assert_eq!(name, "get_time", "{what}");
                }
                assert_obeys_tool(name, args, &what);
            }
            nonstreamed.push(calls);
        }
        // Streamed with the same seed: the same calls, each choice ending in tool_calls.
        let mut streamed_body = body.clone();
        streamed_body["stream"] = true.into();
        let streamed = add_up_chat(&sse(&server, "/v1/chat/completions", &streamed_body), n);
        for (i, (content, calls, finish)) in streamed.iter().enumerate() {
            assert_eq!(
                (content.as_str(), calls, finish.as_str()),
                ("", &nonstreamed[i], "tool_calls"),
                "tool_choice {choice}, streamed choice {i}"
            );
        }
    }

    // Greedy choices under `auto` are each the answer the request gets alone.
    let greedy = |n: usize| {
        let body = json!({"model": MODEL, "messages": weather, "tools": tools(), "n": n,
            "temperature": 0, "max_tokens": 80});
        ok(&server, "/v1/chat/completions", &body)
    };
    let alone = greedy(1);
    let alone = &alone["choices"][0];
    let three = greedy(3);
    for c in three["choices"].as_array().unwrap() {
        assert_eq!(c["message"], alone["message"], "{three}");
        assert_eq!(c["finish_reason"], alone["finish_reason"], "{three}");
    }

    // A json_schema response format: every sampled choice is a document the schema admits.
    let body = json!({"model": MODEL, "messages": ask("Describe Lisbon as JSON."),
        "response_format": city_format(), "n": 3, "temperature": 1.0, "seed": 9, "max_tokens": 120});
    let v = ok(&server, "/v1/chat/completions", &body);
    let contents: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["finish_reason"], "stop", "{v}");
            c["message"]["content"].as_str().unwrap()
        })
        .collect();
    assert_eq!(contents.len(), 3, "{v}");
    for (i, c) in contents.iter().enumerate() {
        assert_obeys_city(c, &format!("json_schema choice {i}"));
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = true.into();
    for (i, (content, calls, finish)) in add_up_chat(&sse(&server, "/v1/chat/completions", &streamed_body), 3)
        .iter()
        .enumerate()
    {
        assert!(calls.is_empty() && finish == "stop", "streamed choice {i}");
        assert_eq!(content, contents[i], "streamed json_schema choice {i}");
    }
}

#[test]
fn legacy_completions_with_n_give_n_choices_streamed_and_not() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen("berth-combined-completions-", MODEL);
    let server = TestServer::start(home.path(), &["--parallel", "4"]);
    let complete = |n: usize, extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "def fibonacci(n):", "max_tokens": 16,
            "temperature": 0, "n": n});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let alone = ok(&server, "/v1/completions", &complete(1, json!({})));
    let text = alone["choices"][0]["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{alone}");
    let three = ok(&server, "/v1/completions", &complete(3, json!({})));
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{three}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{three}");
        assert_eq!(c["text"], text, "{three}");
        assert_eq!(
            c["finish_reason"], alone["choices"][0]["finish_reason"],
            "{three}"
        );
    }
    // The prompt is counted once, the completions n times.
    assert_eq!(three["usage"]["prompt_tokens"], alone["usage"]["prompt_tokens"]);
    assert_eq!(
        three["usage"]["completion_tokens"].as_u64().unwrap(),
        3 * alone["usage"]["completion_tokens"].as_u64().unwrap()
    );

    // Streamed: every index gets the same text and its own finish reason.
    let events = sse(&server, "/v1/completions", &complete(3, json!({"stream": true})));
    let mut texts = vec![String::new(); 3];
    let mut finishes = vec![None; 3];
    for e in &events {
        for c in e["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            texts[i].push_str(c["text"].as_str().unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                assert!(
                    finishes[i].replace(f.to_string()).is_none(),
                    "index {i} finished twice"
                );
            }
        }
    }
    assert_eq!(texts, vec![text.to_string(); 3]);
    assert!(finishes.iter().all(Option::is_some), "{finishes:?}");

    // Seeded sampling: the choices are their own, and the same again for the same seed.
    let sampled = || {
        let v = ok(
            &server,
            "/v1/completions",
            &complete(3, json!({"temperature": 1.0, "seed": 7})),
        );
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let a = sampled();
    assert_eq!(a, sampled(), "a seeded request is reproducible");
    let distinct: std::collections::BTreeSet<&String> = a.iter().collect();
    assert!(distinct.len() > 1, "seeded choices should differ: {a:?}");
}

/// A `berth serve` over `home` with prompt-lookup speculation `on` or `off`.
fn serve_speculating(home: &std::path::Path, speculation: &str) -> TestServer {
    let (child, base, port) = spawn_serve(
        Command::new(berth_exe())
            .args([
                "serve",
                "--port",
                "0",
                "--parallel",
                "2",
                "--speculation",
                speculation,
            ])
            .env("BERTH_HOME", home)
            .env("BERTH_PLUGIN_PATH", home_plugins(home))
            .env("BERTH_LOG", "info"),
    );
    TestServer { child, base, port }
}

/// Code to copy with one identifier renamed (a copy task: its drafts are accepted).
const SOURCE: &str = "fn area(width: u32, height: u32) -> u32 {
    width * height
}

fn total_area(rects: &[(u32, u32)]) -> u32 {
    rects.iter().map(|&(w, h)| area(w, h)).sum()
}
";

#[test]
fn speculation_next_to_a_grammar_keeps_both_answers_identical() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen("berth-combined-spec-", MODEL);
    // A constrained request that copies from its prompt, where drafts would be accepted if a
    // grammar let them be made, and a free copy task that drafts.
    let record = json!({"model": MODEL, "temperature": 0, "max_tokens": 96,
        "response_format": {"type": "json_schema", "json_schema": {"name": "package", "strict": true,
            "schema": {"type": "object", "properties": {"name": {"type": "string"},
                "description": {"type": "string"}}, "required": ["name", "description"],
                "additionalProperties": false}}},
        "messages": [{"role": "user", "content": "Copy this package record into JSON, word for word.\n\
            name: berth-serve\ndescription: An LLM serving engine in Rust built around dynamically \
            loaded model-family plugins, with continuous batching."}]});
    let copy = json!({"model": MODEL, "temperature": 0, "max_tokens": 72,
        "messages": [{"role": "user", "content": format!(
            "Rewrite this Rust code with the function `area` renamed to `rect_area`. Output only the code.\n\n{SOURCE}")}]});
    let answer = |server: &TestServer, body: &Value| -> String {
        ok(server, "/v1/chat/completions", body)["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let drafted = |server: &TestServer| -> f64 {
        let (_, metrics) = server.http("GET", "/metrics", None);
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("berth_speculative_draft_tokens_total ")?
                    .parse()
                    .ok()
            })
            .unwrap()
    };
    let (plain_record, plain_copy) = {
        let server = serve_speculating(home.path(), "off");
        (answer(&server, &record), answer(&server, &copy))
    };
    let v: Value = serde_json::from_str(&plain_record).unwrap();
    assert_eq!(v["name"], "berth-serve", "{plain_record}");

    let server = serve_speculating(home.path(), "on");
    assert_eq!(
        answer(&server, &record),
        plain_record,
        "speculation changed the constrained answer"
    );
    assert_eq!(
        answer(&server, &copy),
        plain_copy,
        "speculation changed the free answer"
    );
    assert!(drafted(&server) > 0.0, "the free copy task drafted");
    // Both at once: they share batches, and the free one drafts once it decodes alone (drafts are
    // made while one sequence generates); neither answer changes.
    let port = server.port;
    let concurrent = |body: &Value| {
        let body = body.to_string();
        std::thread::spawn(move || http_request(port, "POST", "/v1/chat/completions", &body))
    };
    let (a, b) = (concurrent(&record), concurrent(&copy));
    for (handle, plain, what) in [(a, &plain_record, "constrained"), (b, &plain_copy, "free")] {
        let (status, body) = handle.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"].as_str(),
            Some(plain.as_str()),
            "speculation changed the {what} answer when batched"
        );
    }
}

/// A hermes-style template that offers tools.
const HERMES_TEMPLATE: &str = "{% if tools %}Call tools as <tool_call>{\"name\": N, \"arguments\": A}</tool_call>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

/// What a streamed Anthropic answer adds up to: its blocks (`("text", text)` or
/// `("tool_use:NAME", partial JSON)`) and its stop reason, after checking the stream is well formed.
fn add_up_anthropic(events: &[Value]) -> (Vec<(String, String)>, String) {
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .filter(|t| *t != "ping")
        .collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"message_stop"), "{kinds:?}");
    assert_eq!(kinds[kinds.len() - 2], "message_delta", "{kinds:?}");
    let (mut blocks, mut open): (Vec<(String, String)>, Option<usize>) = (Vec::new(), None);
    let mut stop = None;
    for e in events {
        let index = e["index"].as_u64().map(|i| i as usize);
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert!(
                    open.is_none(),
                    "a block started inside block {open:?}: {events:?}"
                );
                assert_eq!(
                    index,
                    Some(blocks.len()),
                    "blocks are numbered in order: {events:?}"
                );
                let b = &e["content_block"];
                let kind = match b["type"].as_str().unwrap() {
                    "text" => "text".to_string(),
                    "tool_use" => format!("tool_use:{}", b["name"].as_str().unwrap()),
                    other => panic!("unexpected block {other}"),
                };
                blocks.push((kind, String::new()));
                open = index;
            }
            "content_block_delta" => {
                assert_eq!(index, open, "a delta outside its block: {events:?}");
                let d = &e["delta"];
                let piece = match d["type"].as_str().unwrap() {
                    "text_delta" => d["text"].as_str(),
                    "input_json_delta" => d["partial_json"].as_str(),
                    other => panic!("unexpected delta {other}"),
                };
                blocks.last_mut().unwrap().1.push_str(piece.unwrap());
            }
            "content_block_stop" => {
                assert_eq!(index, open, "a stop outside its block: {events:?}");
                open = None;
            }
            "message_delta" => {
                assert!(open.is_none(), "the message ended inside a block: {events:?}");
                stop = e["delta"]["stop_reason"].as_str().map(str::to_string);
            }
            _ => {}
        }
    }
    (blocks, stop.expect("a stop reason"))
}

/// A non-streamed Anthropic answer's blocks in [`add_up_anthropic`]'s terms (a call's input as
/// JSON text) and its stop reason.
fn anthropic_blocks(v: &Value) -> (Vec<(String, String)>, String) {
    let blocks = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| match b["type"].as_str().unwrap() {
            "text" => ("text".to_string(), b["text"].as_str().unwrap().to_string()),
            "tool_use" => (
                format!("tool_use:{}", b["name"].as_str().unwrap()),
                b["input"].to_string(),
            ),
            other => panic!("unexpected block {other}: {v}"),
        })
        .collect();
    (blocks, v["stop_reason"].as_str().unwrap().to_string())
}

/// Whether two blocks say the same: equal, or a call whose streamed partial JSON parses to the
/// non-streamed input.
fn same_block(streamed: &(String, String), whole: &(String, String)) -> bool {
    if streamed.0 != whole.0 {
        return false;
    }
    if streamed.0 == "text" {
        return streamed.1 == whole.1;
    }
    let input: Value = serde_json::from_str(&whole.1).unwrap();
    match serde_json::from_str::<Value>(&streamed.1) {
        Ok(v) => v == input,
        // A call cut inside its arguments streams what was written; the message cannot hold
        // unfinished JSON as `input`.
        Err(_) => input == json!({}) || streamed.1.is_empty(),
    }
}

#[test]
fn anthropic_streams_a_call_cut_by_max_tokens_well_formed_and_losing_nothing() {
    let home = tempfile::Builder::new()
        .prefix("berth-combined-cut-")
        .tempdir()
        .unwrap();
    let h = home.path();
    berth_ok(
        h,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    // One reply per form: the format's own markup, a wrapper models write instead of it, and a
    // bare call object; a byte tokenizer, so `max_tokens` k cuts after k bytes.
    let forms = [
        ("markup", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>"),
        ("wrapper", "<tools>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tools>"),
        ("bare", "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}"),
    ];
    // The markup's `<tool_call>` and `</tool_call>` are the tokenizer's special tokens 257, 258.
    let tokens = |reply: &str| -> Vec<i32> {
        match reply
            .strip_prefix("<tool_call>")
            .and_then(|r| r.strip_suffix("</tool_call>"))
        {
            Some(call) => [vec![257], byte_tokens(call), vec![258]].concat(),
            None => byte_tokens(reply),
        }
    };
    let entries: Vec<Value> = forms
        .iter()
        .map(|(key, reply)| json!({"trigger": byte_tokens(&format!("[{key}]")), "reply": tokens(reply)}))
        .collect();
    let script = json!({"stop_tokens": [256], "tools": true, "entries": entries});
    let src = h.join("src");
    write_scripted_pack(&src, "caller", "latest", &script);
    write_byte_tokenizer(
        &src,
        &["<|end|>", "<tool_call>", "</tool_call>"],
        Some(HERMES_TEMPLATE),
    );
    berth_ok(h, None, &["import", src.to_str().unwrap()]);
    let server = TestServer::start(h, &["--parallel", "2"]);
    let tools = json!([{"name": "get_weather", "description": "Current weather for a city",
        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
            "required": ["location"]}}]);
    for (key, reply) in forms {
        let len = tokens(reply).len();
        let mut saw_cut_call = false;
        // Cut after every token of the reply, then room to end it (and its stop token) freely.
        for max_tokens in (1..=len).chain([len + 16]) {
            let what = format!("{key}, max_tokens {max_tokens}");
            let body = json!({"model": "caller:latest", "max_tokens": max_tokens, "tools": tools,
                "tool_choice": {"type": "auto"}, "temperature": 0,
                "messages": [{"role": "user", "content": format!("[{key}] weather in Paris?")}]});
            let whole = ok(&server, "/v1/messages", &body);
            let (blocks, stop) = anthropic_blocks(&whole);
            let mut streamed_body = body.clone();
            streamed_body["stream"] = true.into();
            let (streamed, streamed_stop) = add_up_anthropic(&sse(&server, "/v1/messages", &streamed_body));
            let cut = max_tokens <= len;
            assert_eq!(
                (stop.as_str(), streamed_stop.as_str()),
                if cut {
                    ("max_tokens", "max_tokens")
                } else {
                    ("tool_use", "tool_use")
                },
                "{what}: {whole}"
            );
            assert_eq!(streamed.len(), blocks.len(), "{what}: {streamed:?} vs {whole}");
            for (s, w) in streamed.iter().zip(&blocks) {
                assert!(same_block(s, w), "{what}: streamed {s:?}, not {w:?}");
            }
            // Nothing lost: what was generated is a call or is text; never an empty answer.
            let calls = blocks.iter().filter(|b| b.0.starts_with("tool_use")).count();
            let text: String = blocks
                .iter()
                .filter(|b| b.0 == "text")
                .map(|b| b.1.as_str())
                .collect();
            if calls == 0 && key != "markup" {
                // All of it is text, but for a marker's first bytes at the very end (held back
                // while a marker might follow, as the format's own markup cut short is dropped).
                let written = reply[..max_tokens.min(reply.len())].trim();
                let rest = written
                    .strip_prefix(text.trim())
                    .unwrap_or_else(|| panic!("{what}: the cut reply was lost: {text:?}, not {written:?}"));
                assert!(
                    rest.is_empty() || (rest.len() < 7 && "<tools>".starts_with(rest)),
                    "{what}: {rest:?} of the cut reply was lost"
                );
            } else if calls > 0 {
                saw_cut_call |= cut;
                assert_eq!(calls, 1, "{what}: {whole}");
            }
            if !cut {
                assert_eq!(
                    blocks,
                    [(
                        "tool_use:get_weather".to_string(),
                        json!({"location": "Paris"}).to_string()
                    )],
                    "{what}"
                );
            }
        }
        assert!(
            saw_cut_call || key == "bare",
            "{key}: no length cut inside a named call"
        );
    }
}

#[test]
fn anthropic_streams_qwens_cut_call_as_it_answers_it_whole() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen("berth-combined-qwen-cut-", MODEL);
    let server = TestServer::start(home.path(), &["--parallel", "2"]);
    let tools = json!([{"name": "get_weather", "description": "Current weather for a city",
        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
            "required": ["location"]}}]);
    // Greedy, so the streamed and the whole answers are the same tokens; cut before the call,
    // inside it and after it.
    for max_tokens in [6, 14, 20, 200] {
        let what = format!("max_tokens {max_tokens}");
        let body = json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "tools": tools,
            "tool_choice": {"type": "auto"},
            "messages": [{"role": "user", "content": "What is the weather like in Paris, France right now?"}]});
        let whole = ok(&server, "/v1/messages", &body);
        let (blocks, stop) = anthropic_blocks(&whole);
        let mut streamed_body = body.clone();
        streamed_body["stream"] = true.into();
        let (streamed, streamed_stop) = add_up_anthropic(&sse(&server, "/v1/messages", &streamed_body));
        assert_eq!(stop, streamed_stop, "{what}");
        assert!(
            ["max_tokens", "tool_use", "end_turn"].contains(&stop.as_str()),
            "{what}: {whole}"
        );
        assert_eq!(streamed.len(), blocks.len(), "{what}: {streamed:?} vs {whole}");
        for (s, w) in streamed.iter().zip(&blocks) {
            assert!(same_block(s, w), "{what}: streamed {s:?}, not {w:?}");
        }
        // Tokens were generated, so something was answered.
        assert!(!blocks.is_empty(), "{what}: an empty answer: {whole}");
        if stop == "max_tokens" {
            assert_eq!(whole["usage"]["output_tokens"], max_tokens, "{what}: {whole}");
        }
    }
}
