//! Prefixes shared with running sequences, end to end: a request whose prompt shares a long
//! prefix with a request still streaming forks that prefix from the busy sequence (counted as
//! cached in `usage` and `/metrics`) instead of prefilling it again; the streaming request is not
//! disturbed; a plugin refusing the fork or the copy's rewind costs one ordinary prefill, never a
//! failed request; and with Qwen2.5-Coder the forked request's greedy text is the one it gets
//! alone. The scripted models run at full speed: the test orders events by holding the model (the
//! scripted plugin's `hold_file`) and waiting on the state it asserts (`/metrics`), never on time.

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

/// Starts a streamed request (`/v1/completions` or `/v1/chat/completions`) on its own thread,
/// which yields how it ended; the receiver hears once its first text has arrived.
fn spawn_stream(
    port: u16,
    path: &str,
    mut body: serde_json::Value,
) -> (std::thread::JoinHandle<StreamEnd>, std::sync::mpsc::Receiver<()>) {
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
                            let _ = tx.send(());
                        }
                    }
                }
            }
            line.clear();
        }
        (text, finish, Instant::now())
    });
    (handle, rx)
}

/// Starts a streamed request like [`spawn_stream`] and returns once its first text has arrived.
fn start_stream(port: u16, path: &str, body: serde_json::Value) -> std::thread::JoinHandle<StreamEnd> {
    let (handle, started) = spawn_stream(port, path, body);
    started.recv_timeout(DEADLINE).expect("the stream starts");
    handle
}

/// How long any awaited state may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(300);

/// Waits until `ok` holds, polling, failing after [`DEADLINE`].
fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    // Every model decodes at full speed but waits at each step while `hold` exists.
    let hold = home.join("hold");
    let import = |name: &str, rewind: &str, enforce: &str, refuse_fork: bool| {
        let pacing = Pacing::Held(&hold);
        let log = import_rewind_model_paced(home, name, rewind.into(), enforce.into(), refuse_fork, pacing);
        (name.to_string(), log)
    };
    let logs = [
        import("anywhere", "anywhere", "anywhere", false),
        import("nofork", "anywhere", "anywhere", true),
        // Reports "anywhere" but rewinds only to 0: the forked copy cannot be cut back.
        import("lying", "anywhere", "start", false),
        import("start", "start", "start", false),
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
    let completion = |model: &str, prompt: &str, max_tokens: u32| serde_json::json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
    let m = |name: &str| metric(&server, name);
    for ((model, log), want_cached) in logs.iter().zip([128, 0, 0, 0]) {
        let model = model.as_str();
        // A first request loads the model and leaves exactly the shared prefix's two whole
        // chunks in a slot (one token asked for is never fed back): the stream then reuses them
        // without a cut, whatever the rewind rule, and prefills its last chunk in one step.
        let (status, body) = request(&server, "/v1/completions", &completion(model, &shared[..128], 1));
        assert_eq!(status, 200, "{model}: {body}");

        // Held: the stream is admitted and waits in that one step; the other request is queued
        // behind it, so it is placed while the stream runs, holding its whole prompt.
        std::fs::write(&hold, "").unwrap();
        let (cached_before, batched_before) = (
            m("berth_cached_prompt_tokens_total"),
            m("berth_batched_decode_steps_total"),
        );
        let (long, _) = spawn_stream(
            server.port,
            "/v1/completions",
            completion(model, &long_prompt, 400),
        );
        wait_for("the stream to be admitted", || m("berth_active_sequences") == 1.0);
        assert_eq!(
            m("berth_cached_prompt_tokens_total") - cached_before,
            128.0,
            "{model}: the stream reused the first request's two chunks"
        );
        let port = server.port;
        let body = completion(model, &other_prompt, 400).to_string();
        let other = std::thread::spawn(move || http_request(port, "POST", "/v1/completions", &body));
        wait_for("the other request to be queued", || m("berth_queue_depth") == 1.0);
        std::fs::remove_file(&hold).unwrap();

        let (status, body) = other.join().unwrap();
        let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["choices"][0]["text"], REPLY, "{model}: {body}");
        assert_eq!(cached_tokens(&body), want_cached, "{model}: {body}");
        assert_eq!(body["usage"]["prompt_tokens"], other_prompt.len(), "{model}");
        let (text, finish, _) = long.join().unwrap();
        assert_eq!((text, finish.as_str()), (long_reply(), "stop"), "{model}");
        // The two were decoded together: the stream ran on while the other was answered.
        assert!(
            m("berth_batched_decode_steps_total") > batched_before,
            "{model}: no decode step carried both"
        );
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
    // comes from a finished slot).
    let (status, body) = request(
        &server,
        "/v1/completions",
        &completion("anywhere", &other_prompt, 400),
    );
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
