//! Prefixes shared with running sequences, end to end: a request whose prompt shares a long
//! prefix with a request still streaming forks that prefix from the busy sequence (counted as
//! cached in `usage` and `/metrics`) instead of prefilling it again; the streaming request is not
//! disturbed; a plugin refusing the fork or the copy's rewind costs one ordinary prefill, never a
//! failed request; and with Qwen2.5-Coder the forked request's greedy text is the one it gets
//! alone.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// What every scripted model here answers by default.
const REPLY: &str = REWIND_MODEL_REPLY;

/// Sends an HTTP/1.0 POST (a streamed answer comes unchunked, ending at close).
fn post(port: u16, path: &str, body: &serde_json::Value) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// The end of a streamed request: its text, its finish reason, when its last byte came.
type StreamEnd = (String, String, Instant);

/// Starts a streamed request (`/v1/completions` or `/v1/chat/completions`) and returns once its
/// first text has arrived; the thread yields how it ended.
fn start_stream(port: u16, path: &str, mut body: serde_json::Value) -> std::thread::JoinHandle<StreamEnd> {
    body["stream"] = true.into();
    let mut reader = BufReader::new(post(port, path, &body));
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let (mut text, mut finish, mut started) = (String::new(), String::new(), Some(tx));
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(data) = line.trim().strip_prefix("data: ") {
                if data != "[DONE]" {
                    let v: serde_json::Value = serde_json::from_str(data).unwrap();
                    assert!(v.get("error").is_none(), "the stream failed: {v}");
                    let choice = &v["choices"][0];
                    let piece = choice["text"]
                        .as_str()
                        .or_else(|| choice["delta"]["content"].as_str());
                    text.push_str(piece.unwrap_or(""));
                    if let Some(f) = choice["finish_reason"].as_str() {
                        finish = f.to_string();
                    }
                    if !text.is_empty() {
                        if let Some(tx) = started.take() {
                            tx.send(()).unwrap();
                        }
                    }
                }
            }
            line.clear();
        }
        (text, finish, Instant::now())
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the stream starts");
    handle
}

/// A non-streamed request: (status, body as JSON).
fn request(server: &TestServer, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let (status, body) = server.post(path, &body.to_string());
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// The usage's cached prompt tokens of a Chat Completions or Completions answer.
fn cached_tokens(body: &serde_json::Value) -> u64 {
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {body}"))
}

/// One counter of `/metrics`.
fn metric(server: &TestServer, name: &str) -> f64 {
    let (status, text) = server.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// The `seq_truncate` calls a model saw: (seq, from, len, ok).
fn truncates(log: &Path) -> Vec<(i64, u64, u64, bool)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["seq"].as_i64().unwrap(),
                v["from"].as_u64().unwrap(),
                v["len"].as_u64().unwrap(),
                v["ok"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_prompt_sharing_a_prefix_with_a_running_stream_forks_it_and_refusals_fall_back() {
    let tmp = tempfile::Builder::new()
        .prefix("berth-prefix-")
        .tempdir()
        .unwrap();
    let home = tmp.path();
    berth_ok(
        home,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let logs = [
        (
            "anywhere",
            import_rewind_model(home, "anywhere", "anywhere".into(), "anywhere".into(), false),
        ),
        (
            "nofork",
            import_rewind_model(home, "nofork", "anywhere".into(), "anywhere".into(), true),
        ),
        // Reports "anywhere" but rewinds only to 0: the forked copy cannot be cut back.
        (
            "lying",
            import_rewind_model(home, "lying", "anywhere".into(), "start".into(), false),
        ),
        (
            "start",
            import_rewind_model(home, "start", "start".into(), "start".into(), false),
        ),
    ];
    // The truncation logs pin prefix reuse alone: no speculation (its cuts would join them).
    let server = TestServer::start(
        home,
        &[
            "--parallel",
            "4",
            "--max-loaded-models",
            "4",
            "--speculation",
            "off",
        ],
    );

    // Both prompts share their first 140 tokens: two whole 64-token chunks (128) can be forked.
    let shared: String = "abcdefghijklmnopqrstuvwxyz".chars().cycle().take(140).collect();
    let long_prompt = format!("{shared}{LONG_TRIGGER} please");
    let other_prompt = format!("{shared}{}", "zyxwvutsrqponmlkjihgfedcba".repeat(2));
    let completion = |model: &str, prompt: &str| serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 400, "temperature": 0});
    for (model, log, want_cached) in [
        ("anywhere", &logs[0].1, 128),
        ("nofork", &logs[1].1, 0),
        ("lying", &logs[2].1, 0),
        ("start", &logs[3].1, 0),
    ] {
        let long = start_stream(server.port, "/v1/completions", completion(model, &long_prompt));
        let (status, body) = request(&server, "/v1/completions", &completion(model, &other_prompt));
        let other_done = Instant::now();
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["choices"][0]["text"], REPLY, "{model}: {body}");
        assert_eq!(cached_tokens(&body), want_cached, "{model}: {body}");
        assert_eq!(body["usage"]["prompt_tokens"], other_prompt.len(), "{model}");
        let (text, finish, long_done) = long.join().unwrap();
        assert_eq!((text, finish.as_str()), (long_reply(), "stop"), "{model}");
        assert!(long_done > other_done, "{model}: the stream ran on meanwhile");
        let calls = truncates(log);
        match model {
            // One cut of the copy, in a slot other than the stream's (which was never cut).
            "anywhere" | "lying" => {
                assert_eq!(calls.len(), 1, "{model}: {calls:?}");
                let (_, from, len, ok) = calls[0];
                assert!(from > 150, "{model}: the copy held the stream's rows: {calls:?}");
                assert_eq!((len, ok), (128, model == "anywhere"), "{model}");
            }
            // Nothing forked: the request took an empty slot, nothing to cut.
            _ => assert_eq!(calls, vec![], "{model}"),
        }
    }
    assert_eq!(metric(&server, "berth_prefix_forks_total"), 1.0);
    assert!(metric(&server, "berth_cached_prompt_tokens_total") >= 128.0);

    // The same request alone, now that the stream is over, gets the same text (its prefix now
    // comes from the finished stream's slot).
    let (status, body) = request(&server, "/v1/completions", &completion("anywhere", &other_prompt));
    assert_eq!(
        (status, body["choices"][0]["text"].as_str()),
        (200, Some(REPLY)),
        "{body}"
    );
    assert_eq!(cached_tokens(&body), 128, "{body}");
}

/// A system prompt of several hundred tokens (the shared prefix of the Qwen test).
fn long_system_prompt() -> String {
    let rules = [
        "Answer in plain English without markdown headings.",
        "Prefer short sentences and concrete examples.",
        "When asked for code, write idiomatic Rust with comments.",
        "Never invent library functions; say when you are unsure.",
        "Keep numbers exact and show units where they apply.",
        "If a question is ambiguous, state the reading you chose.",
    ];
    let mut s = String::from("You are Berth's careful assistant. Follow these house rules.\n");
    for k in 0..6 {
        for (j, r) in rules.iter().enumerate() {
            s.push_str(&format!("Rule {}.{}: {r}\n", k + 1, j + 1));
        }
    }
    s
}

#[test]
fn qwen_forks_a_streaming_requests_system_prompt_and_answers_as_alone() {
    let model = "qwen2.5-coder:0.5b";
    let home = home_with_qwen("berth-prefix-qwen-", model);
    // Two slots: the reference request leaves its cache in one; the stream takes that one (it
    // shares the system prompt), so the second request finds the prefix only in the running
    // stream's slot.
    let server = TestServer::start(home.path(), &["--parallel", "2"]);
    let system = long_system_prompt();
    let chat = |user: &str, max_tokens: u32| {
        serde_json::json!({"model": model, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    };
    let question = chat("Name three prime numbers.", 24);
    let (status, alone) = request(&server, "/v1/chat/completions", &question);
    assert_eq!(status, 200, "{alone}");
    assert_eq!(cached_tokens(&alone), 0);
    let prompt_tokens = alone["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens > 560,
        "a long system prompt: {prompt_tokens} tokens"
    );

    let stream = start_stream(
        server.port,
        "/v1/chat/completions",
        chat("Count from 1 to 200, separated by commas.", 220),
    );
    let (status, shared) = request(&server, "/v1/chat/completions", &question);
    let shared_done = Instant::now();
    assert_eq!(status, 200, "{shared}");
    let (_, finish, stream_done) = stream.join().unwrap();
    assert!(!finish.is_empty());
    assert!(stream_done > shared_done, "the stream was still running");
    assert_eq!(metric(&server, "berth_prefix_forks_total"), 1.0);
    let cached = cached_tokens(&shared);
    assert!(
        cached >= 512 && cached.is_multiple_of(64) && cached < prompt_tokens,
        "whole chunks of the system prompt forked: {cached} of {prompt_tokens}"
    );
    assert_eq!(
        shared["choices"][0]["message"]["content"], alone["choices"][0]["message"]["content"],
        "the forked prefix gives the greedy text the request gets alone"
    );
}
