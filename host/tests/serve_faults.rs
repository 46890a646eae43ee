//! Faults under a real `berth serve`: a plugin that panics in the middle of a batch, weights
//! truncated on disk after import, and weights truncated, replaced, rewritten and deleted under a
//! loaded model (the live-store rule). Each test asserts what every client got (never a hung or cut
//! connection), that the process lives, that `/health` answers and that the next good request is
//! served. What each client got is printed (`--nocapture`) for the record.
//!
//! The panic test uses the scripted plugin: `step_delay_ms` keeps three streams generating, the
//! `hold_file` holds their batch inside `decode` until the request whose prompt carries the
//! `panic_token` is queued, so that request joins the very next batch, and that batch panics.
//! The truncation tests use the real Qwen2.5-Coder 0.5B GGUF, copied first: an import hard-links
//! its source, and the shared model cache must never be truncated.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Server tests run one at a time (two shared cores).
static SERIAL: Mutex<()> = Mutex::new(());

/// How long any awaited state may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(300);

/// The scripted model of the panic test.
const SCRIPTED: &str = "scripted:latest";

/// The byte (and, with the byte-level tokenizer, the token) that makes the scripted model panic.
const PANIC_BYTE: u8 = b'~';

const TEMPLATE: &str =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

/// Takes the serial lock even when an earlier test panicked while holding it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The value of a `/metrics` line.
fn metric(server: &TestServer, name: &str) -> f64 {
    let (_, text) = server.http("GET", "/metrics", None);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// Waits until `ok` holds, failing after [`DEADLINE`].
fn wait_for(server: &TestServer, what: &str, ok: impl Fn(&TestServer) -> bool) {
    let t0 = Instant::now();
    while !ok(server) {
        assert!(t0.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asserts the server process is still running.
fn assert_alive(server: &mut TestServer) {
    let status = server.child.try_wait().unwrap();
    assert!(status.is_none(), "berth serve exited: {status:?}");
}

/// `/health` answers 200 with status ok.
fn assert_healthy(server: &TestServer) {
    let (status, body) = server.http("GET", "/health", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"ok\""), "{body}");
}

/// A chat completion body for `model`.
fn chat(model: &str, content: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({"model": model, "stream": stream, "max_tokens": max_tokens,
        "temperature": 0, "messages": [{"role": "user", "content": content}]})
    .to_string()
}

/// An error body in the OpenAI shape: `{"error": {"message", "type", ...}}`; returns the message.
fn openai_error_message(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let message = v["error"]["message"].as_str();
    let kind = v["error"]["type"].as_str();
    assert!(
        message.is_some_and(|m| !m.is_empty()) && kind.is_some(),
        "not an OpenAI error: {body}"
    );
    message.unwrap().to_string()
}

/// What one streamed request got.
#[derive(Debug)]
struct StreamOutcome {
    /// HTTP status.
    status: u16,
    /// Text deltas received before the stream ended.
    text_chunks: usize,
    /// The `data: {"error": ...}` event's message, if one came.
    error: Option<String>,
    /// Whether `data: [DONE]` came.
    done: bool,
    /// Whether the chunked body ended with its terminating empty chunk (not a cut connection).
    clean_end: bool,
    /// Seconds from the request to the end of the answer.
    seconds: f64,
}

/// Parses a chunked SSE chat stream (the raw body with its chunk framing).
fn stream_outcome(status: u16, raw: &str, seconds: f64) -> StreamOutcome {
    let mut text_chunks = 0;
    let mut error = None;
    let mut done = false;
    for line in raw.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(m) = v["error"]["message"].as_str() {
            error = Some(m.to_string());
        } else if v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
        {
            text_chunks += 1;
        }
    }
    StreamOutcome {
        status,
        text_chunks,
        error,
        done,
        clean_end: raw.ends_with("0\r\n\r\n"),
        seconds,
    }
}

/// Starts a streamed request on its own thread.
fn stream(port: u16, body: String) -> JoinHandle<StreamOutcome> {
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let (status, raw) = http_request(port, "POST", "/v1/chat/completions", &body);
        stream_outcome(status, &raw, t0.elapsed().as_secs_f64())
    })
}

/// A home with the scripted plugin and a pack that panics on [`PANIC_BYTE`], replies with a long
/// text one token per `step_ms`, and holds every decode while `hold` exists.
fn home_with_panicking_model(hold: &Path, step_ms: u64) -> tempfile::TempDir {
    let home = tempfile::Builder::new()
        .prefix("berth-faults-")
        .tempdir()
        .unwrap();
    berth_ok(
        home.path(),
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let src = home.path().join("src");
    let script = serde_json::json!({"stop_tokens": [256], "panic_token": PANIC_BYTE,
        "step_delay_ms": step_ms, "hold_file": hold,
        "entries": [{"reply": byte_tokens(&"fine ".repeat(60))}]});
    write_scripted_pack(&src, "scripted", "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], Some(TEMPLATE));
    berth_ok(home.path(), None, &["import", src.to_str().unwrap()]);
    home
}

#[test]
fn a_plugin_panic_mid_batch_fails_that_batch_cleanly_and_the_reloaded_instance_serves_on() {
    let _serial = serial();
    let holder = tempfile::tempdir().unwrap();
    let hold = holder.path().join("hold");
    let home = home_with_panicking_model(&hold, 20);
    let mut server = TestServer::start(home.path(), &["--parallel", "8"]);

    // Load the model and check the script answers.
    let (status, body) = server.post("/v1/chat/completions", &chat(SCRIPTED, "hi", 4, false));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"content\":\"fine\""), "{body}");

    // Three streams generating in one batch (300 tokens at 20 ms a step: seconds of margin).
    let innocent: Vec<_> = (0..3)
        .map(|i| stream(server.port, chat(SCRIPTED, &format!("hello {i}"), 300, true)))
        .collect();
    wait_for(&server, "three generating sequences", |s| {
        metric(s, "berth_active_sequences") == 3.0 && metric(s, "berth_generated_tokens_total") >= 4.0 + 3.0
    });
    // Hold their batch inside decode, queue the panicking request, release: it joins the next batch.
    std::fs::write(&hold, "").unwrap();
    let poison = stream(
        server.port,
        chat(SCRIPTED, &format!("boom {}", PANIC_BYTE as char), 300, true),
    );
    // The step running when the hold appeared may end first and admit it: queued or admitted,
    // it is in the next batch, which waits for the release.
    wait_for(&server, "the panicking request to be queued or admitted", |s| {
        metric(s, "berth_queue_depth") + metric(s, "berth_active_sequences") == 4.0
    });
    let t_release = Instant::now();
    std::fs::remove_file(&hold).unwrap();

    let mut outcomes: Vec<(String, StreamOutcome)> = innocent
        .into_iter()
        .enumerate()
        .map(|(i, h)| (format!("innocent stream {i}"), h.join().unwrap()))
        .collect();
    outcomes.push(("panicking stream".into(), poison.join().unwrap()));
    let after_release = t_release.elapsed().as_secs_f64();
    for (name, o) in &outcomes {
        println!("{name}: ended after {:.2} s: {o:?}", o.seconds);
        // Headers were sent before the panic: a 200 whose stream carries the error, then ends.
        assert_eq!(o.status, 200, "{name}: {o:?}");
        assert!(o.clean_end, "{name}: the connection was cut: {o:?}");
        let error = o
            .error
            .as_deref()
            .unwrap_or_else(|| panic!("{name}: no error event: {o:?}"));
        assert!(error.contains("scripted panic"), "{name}: {error}");
        assert!(!o.done, "{name}: a failed stream must not end with [DONE]: {o:?}");
    }
    for (name, o) in &outcomes[..3] {
        assert!(o.text_chunks >= 1, "{name} was not generating: {o:?}");
        assert!(o.text_chunks < 300, "{name} finished before the panic: {o:?}");
    }
    println!("all four streams ended {after_release:.2} s after the batch was released");

    // The process lives, /health answers, nothing is left running.
    assert_alive(&mut server);
    assert_healthy(&server);
    wait_for(&server, "no running sequence", |s| {
        metric(s, "berth_active_sequences") == 0.0
    });

    // The next good request runs on the recreated instance, streamed and not.
    let t0 = Instant::now();
    let (status, body) = server.post("/v1/chat/completions", &chat(SCRIPTED, "again", 4, false));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"content\":\"fine\""), "{body}");
    println!(
        "first good request after the panic: 200 in {:.2} s (instance recreated)",
        t0.elapsed().as_secs_f64()
    );
    let good = stream(server.port, chat(SCRIPTED, "and again", 4, true))
        .join()
        .unwrap();
    assert!(good.done && good.clean_end && good.error.is_none(), "{good:?}");

    // A panicking request alone, not streamed: a 5xx with the OpenAI error shape, and the server
    // serves on after a second recreation.
    let (status, body) = server.post(
        "/v1/chat/completions",
        &chat(SCRIPTED, &format!("boom {}", PANIC_BYTE as char), 3, false),
    );
    println!("non-streamed panicking request alone: {status} {body}");
    assert_eq!(status, 500, "{status} {body}");
    assert!(openai_error_message(&body).contains("scripted panic"), "{body}");
    assert_alive(&mut server);
    let (status, body) = server.post("/v1/chat/completions", &chat(SCRIPTED, "last", 4, false));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"content\":\"fine\""), "{body}");
}

/// A home with the qwen3 and scripted plugins, a scripted pack `ok:latest` answering "fine", and a
/// private copy of the real Qwen2.5-Coder 0.5B GGUF imported as `qwen:copy`; returns the home and
/// the pack's weights file.
fn home_with_copied_qwen() -> (tempfile::TempDir, PathBuf) {
    let home = tempfile::Builder::new()
        .prefix("berth-truncated-")
        .tempdir()
        .unwrap();
    let dir = home.path();
    for plugin in [plugin_library("qwen3"), scripted_library()] {
        berth_ok(dir, None, &["plugins", "install", plugin.to_str().unwrap()]);
    }
    let src = dir.join("src");
    let script = serde_json::json!({"stop_tokens": [256], "entries": [{"reply": byte_tokens("fine")}]});
    write_scripted_pack(&src, "ok", "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], Some(TEMPLATE));
    berth_ok(dir, None, &["import", src.to_str().unwrap()]);
    // A copy: the import hard-links its source, and truncating must not reach the shared cache.
    let copy = dir.join("qwen.gguf");
    std::fs::copy(real_model("qwen2.5-coder-0.5b"), &copy).unwrap();
    berth_ok(
        dir,
        None,
        &["import", copy.to_str().unwrap(), "--name", "qwen:copy"],
    );
    let weights = dir.join("packs/qwen/copy/model.gguf");
    assert!(weights.is_file(), "{} missing", weights.display());
    (home, weights)
}

/// Truncates a file in place to `len` bytes.
fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn weights_truncated_after_import_are_refused_naming_the_file_and_the_server_serves_on() {
    let _serial = serial();
    let (home, weights) = home_with_copied_qwen();
    let full = std::fs::metadata(&weights).unwrap().len();
    let mut server = TestServer::start(home.path(), &[]);

    for (what, len) in [("half", full / 2), ("eight bytes", 8)] {
        truncate(&weights, len);

        // The reader itself refuses the file (extents checked against its length), no crash.
        let err = berth_registry::GgufFile::open(&weights).unwrap_err().to_string();
        assert!(
            err.contains("truncated") && err.contains("model.gguf"),
            "{what}: {err}"
        );

        // `berth run`: exit 1, one line naming the pack, the file and the sizes.
        let out = berth(
            home.path(),
            Some(&home_plugins(home.path())),
            &["run", "qwen:copy", "hi", "--max-tokens", "2"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!(
            "berth run, weights cut to {what} ({len} bytes): {:?} {}",
            out.status.code(),
            stderr.trim()
        );
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        for needle in ["qwen:copy", "model.gguf", "truncated", &len.to_string()] {
            assert!(
                stderr.contains(needle),
                "{what}: {needle:?} missing from {stderr}"
            );
        }

        // `berth serve`: an error in each API's shape naming the file, streamed or not.
        let (status, body) = server.post("/v1/chat/completions", &chat("qwen:copy", "hi", 2, false));
        println!("served chat, weights cut to {what}: {status} {body}");
        assert_eq!(status, 500, "{what}: {status} {body}");
        let message = openai_error_message(&body);
        assert!(
            message.contains("model.gguf") && message.contains("truncated"),
            "{message}"
        );
        let (status, body) = server.post("/v1/chat/completions", &chat("qwen:copy", "hi", 2, true));
        assert_eq!(status, 500, "{what} streamed: {status} {body}");
        assert!(openai_error_message(&body).contains("model.gguf"), "{body}");
        let ollama = serde_json::json!({"model": "qwen:copy", "stream": false,
            "messages": [{"role": "user", "content": "hi"}]});
        let (status, body) = server.post("/api/chat", &ollama.to_string());
        assert_eq!(status, 500, "{what} ollama: {status} {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains("model.gguf")),
            "{body}"
        );

        // The process lives and the other model answers.
        assert_alive(&mut server);
        assert_healthy(&server);
        let (status, body) = server.post("/v1/chat/completions", &chat("ok:latest", "hi", 8, false));
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"content\":\"fine\""), "{body}");
    }
}

/// The greedy answer of a non-streamed chat: (status, content or the error body).
fn greedy(server: &TestServer, model: &str, content: &str) -> (u16, String) {
    let (status, body) = server.post("/v1/chat/completions", &chat(model, content, 8, false));
    if status != 200 {
        return (status, body);
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        status,
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// Unloads loaded `model` (Ollama's idiom: `/api/generate` with `keep_alive` 0) and waits until
/// it is gone (its memory handed back).
fn unload(server: &TestServer, model: &str) {
    let loaded = metric(server, "berth_loaded_models");
    let unload = serde_json::json!({"model": model, "keep_alive": 0}).to_string();
    let (status, body) = server.post("/api/generate", &unload);
    assert_eq!(status, 200, "{body}");
    wait_for(server, "the unload", |s| {
        metric(s, "berth_loaded_models") < loaded
    });
}

/// Anonymous resident memory of a process, in bytes (`RssAnon` of `/proc/PID/status`).
fn rss_anon(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no RssAnon in {status}"));
    kb * 1024
}

/// The live-store rule (docs/serve.md, "What you may do to a live store"): a loaded model serves
/// the weights it loaded, whatever happens to its files (truncated, replaced by a rename,
/// rewritten in place, deleted); the next load reads the files as they then are, and a broken
/// file is a clear error naming it. The server lives throughout and serves other models, and
/// an unloaded model's memory goes back to the system.
#[test]
fn weights_truncated_under_a_loaded_model_do_not_kill_the_server() {
    let _serial = serial();
    let (home, weights) = home_with_copied_qwen();
    let mut server = TestServer::start(home.path(), &[]);
    let pid = server.child.id();
    let before_load = rss_anon(pid);
    let (status, answer) = greedy(&server, "qwen:copy", "hi");
    assert_eq!(status, 200, "{answer}");
    assert!(!answer.is_empty());
    let loaded = rss_anon(pid);

    // Truncated under the loaded model: the same answer, the server unharmed.
    let full = std::fs::metadata(&weights).unwrap().len();
    truncate(&weights, full / 2);
    let (status, got) = greedy(&server, "qwen:copy", "hi");
    println!("after truncating the loaded weights: {status} {got}");
    assert_eq!((status, got.as_str()), (200, answer.as_str()));
    assert_alive(&mut server);
    assert_healthy(&server);

    // Unloaded, the next load reads the cut file: an error naming it; other models serve on.
    unload(&server, "qwen:copy");
    let after_unload = rss_anon(pid);
    println!(
        "RssAnon: {} MB before the load, {} MB loaded, {} MB after the unload",
        before_load >> 20,
        loaded >> 20,
        after_unload >> 20
    );
    assert!(
        (after_unload as f64) < 1.25 * before_load as f64 + 50e6,
        "an unloaded model's memory stayed: {after_unload} bytes, {before_load} before the load"
    );
    let (status, body) = server.post("/v1/chat/completions", &chat("qwen:copy", "hi", 8, false));
    println!("after the unload: {status} {body}");
    assert_eq!(status, 500, "{body}");
    let message = openai_error_message(&body);
    assert!(
        message.contains("model.gguf") && message.contains("truncated"),
        "{message}"
    );
    assert_alive(&mut server);
    assert_healthy(&server);
    let (status, body) = server.post("/v1/chat/completions", &chat("ok:latest", "hi", 8, false));
    assert_eq!(status, 200, "{body}");

    // Replaced by a rename (how a store update lands): the next load reads the new file.
    let fresh = weights.with_file_name("fresh.gguf");
    std::fs::copy(real_model("qwen2.5-coder-0.5b"), &fresh).unwrap();
    std::fs::rename(&fresh, &weights).unwrap();
    let (status, got) = greedy(&server, "qwen:copy", "hi");
    assert_eq!((status, got.as_str()), (200, answer.as_str()));

    // Rewritten in place with another file, then deleted, under the loaded model: it answers as
    // before; unloaded, the missing file is an error naming it.
    std::fs::write(
        &weights,
        b"not a GGUF file at all, written over the loaded weights",
    )
    .unwrap();
    let (status, got) = greedy(&server, "qwen:copy", "hi");
    println!("after rewriting the loaded weights in place: {status} {got}");
    assert_eq!((status, got.as_str()), (200, answer.as_str()));
    std::fs::remove_file(&weights).unwrap();
    let (status, got) = greedy(&server, "qwen:copy", "hi");
    assert_eq!((status, got.as_str()), (200, answer.as_str()));
    unload(&server, "qwen:copy");
    let (status, body) = server.post("/v1/chat/completions", &chat("qwen:copy", "hi", 8, false));
    println!("after deleting the weights and unloading: {status} {body}");
    assert!(status >= 400, "{status} {body}");
    assert!(body.contains("model.gguf"), "{body}");
    assert_alive(&mut server);
    assert_healthy(&server);
    let (status, body) = server.post("/v1/chat/completions", &chat("ok:latest", "hi", 8, false));
    assert_eq!(status, 200, "{body}");
}
