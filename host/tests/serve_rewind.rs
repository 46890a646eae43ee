//! Rewind rules end to end, with the scripted plugin: `berth serve`'s prefix reuse follows the
//! plugin's `Rewind` rule, a plugin that refuses a rewind costs that request one re-prefill
//! (never a failed request, and never the requests running next to it), and `berth run`'s chat
//! falls back to a full prefill the same way.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// What every scripted model here answers by default.
const REPLY: &str = REWIND_MODEL_REPLY;

/// A Berth home with the scripted plugin installed.
fn home() -> tempfile::TempDir {
    let tmp = tempfile::Builder::new()
        .prefix("berth-rewind-")
        .tempdir()
        .unwrap();
    berth_ok(
        tmp.path(),
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    tmp
}

/// The `seq_truncate` calls a model saw: (from, len, ok).
fn truncates(log: &Path) -> Vec<(u64, u64, bool)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["from"].as_u64().unwrap(),
                v["len"].as_u64().unwrap(),
                v["ok"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A prompt of `n` letters (no digit, no trigger) and one that shares its first `shared`.
fn prompts(n: usize, shared: usize) -> (String, String) {
    let a: String = "abcdefghijklmnopqrstuvwxyz".chars().cycle().take(n).collect();
    let b = format!("{}{}", &a[..shared], "zyxwvutsrqponmlkjihgfedcba".repeat(2));
    (a, b)
}

/// A running `berth serve`, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(home: &Path) -> Server {
        Server::start_with(home, "off")
    }

    /// A server with prompt-lookup speculation `on` or `off`.
    fn start_with(home: &Path, speculation: &str) -> Server {
        let (child, _, port) = spawn_serve(
            Command::new(berth_exe())
                .args([
                    "serve",
                    "--port",
                    "0",
                    "--parallel",
                    "4",
                    "--max-loaded-models",
                    "4",
                    // The truncation logs pin prefix reuse alone: no speculation (its cuts
                    // would join them; serve_speculation covers a plugin that refuses them).
                    "--speculation",
                    speculation,
                ])
                .env("BERTH_HOME", home)
                .env_remove("BERTH_PLUGIN_PATH")
                .env("BERTH_LOG", "info,berth::engine=debug"),
        );
        Server { child, port }
    }

    /// Sends an HTTP/1.0 POST (a streamed answer comes unchunked, ending at close).
    fn post(&self, path: &str, body: &serde_json::Value) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        s
    }

    /// A non-streamed `/v1/completions`: (status, body).
    fn complete(&self, model: &str, prompt: &str) -> (u16, serde_json::Value) {
        let req = serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 400,
            "temperature": 0});
        let mut resp = String::new();
        self.post("/v1/completions", &req)
            .read_to_string(&mut resp)
            .unwrap();
        let status = resp[9..12].parse().unwrap();
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        (
            status,
            serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Starts a streamed `/v1/completions` for the long reply and returns once its first text
    /// has arrived; the thread yields (the streamed text, the finish reason, when it ended).
    fn start_long_stream(&self, model: &str) -> std::thread::JoinHandle<(String, String, Instant)> {
        let req = serde_json::json!({"model": model, "prompt": format!("{LONG_TRIGGER} please"),
            "max_tokens": 400, "temperature": 0, "stream": true});
        let mut reader = BufReader::new(self.post("/v1/completions", &req));
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let mut text = String::new();
            let mut finish = String::new();
            let mut started = Some(tx);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(data) = line.trim().strip_prefix("data: ") {
                    if data != "[DONE]" {
                        let v: serde_json::Value = serde_json::from_str(data).unwrap();
                        assert!(v.get("error").is_none(), "long stream failed: {v}");
                        let choice = &v["choices"][0];
                        text.push_str(choice["text"].as_str().unwrap_or(""));
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
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the long stream starts");
        handle
    }
}

fn text_and_cached(body: &serde_json::Value) -> (&str, u64) {
    (
        body["choices"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{body}")),
        body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

#[test]
fn serve_prefix_reuse_follows_the_rewind_rule_and_a_refused_rewind_costs_one_prefill() {
    let home = home();
    let home = home.path();
    let anywhere = import_rewind_model(home, "anywhere", "anywhere".into(), "anywhere".into(), false);
    let snap = import_rewind_model(
        home,
        "snap",
        serde_json::json!({"every": 48}),
        serde_json::json!({"every": 48}),
        false,
    );
    let start = import_rewind_model(home, "start", "start".into(), "start".into(), false);
    // Reports "anywhere" but can only rewind to 0 (a hybrid model that does not say so).
    let lying = import_rewind_model(home, "lying", "anywhere".into(), "start".into(), false);
    // Cannot even reset its sequences: the request that needs a reset fails, alone.
    let never = import_rewind_model(home, "never", "anywhere".into(), "never".into(), false);
    let server = Server::start(home);

    // The first prompt fills two whole 64-token chunks (128) plus 22 tokens; the second shares
    // its first 140, so 128 can be reused where the plugin rewinds anywhere.
    let (a, b) = prompts(150, 140);
    let generated = REPLY.len() as u64; // the reply's tokens are fed back; the stop token is not
    let cached_len = 150 + generated;
    // Where nothing can be reused (only-to-start), the request takes the least recently used
    // slot instead and nothing is truncated.
    for (model, log, want_cached, want_truncates) in [
        ("anywhere", &anywhere, 128, vec![(cached_len, 128, true)]),
        ("snap", &snap, 96, vec![(cached_len, 96, true)]),
        ("start", &start, 0, vec![]),
    ] {
        let (status, body) = server.complete(model, &a);
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(text_and_cached(&body), (REPLY, 0), "{model}");
        let (status, body) = server.complete(model, &b);
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(text_and_cached(&body), (REPLY, want_cached), "{model}");
        assert_eq!(truncates(log), want_truncates, "{model}");
    }

    // A refused rewind: the sequence is reset and the whole prompt prefilled; a stream running
    // next to it on the same model is untouched.
    let (status, body) = server.complete("lying", &a);
    assert_eq!((status, text_and_cached(&body)), (200, (REPLY, 0)), "{body}");
    let long = server.start_long_stream("lying");
    let (status, body) = server.complete("lying", &b);
    let b_done = Instant::now();
    assert_eq!(status, 200, "{body}");
    assert_eq!(text_and_cached(&body), (REPLY, 0), "re-prefilled from 0");
    assert_eq!(body["usage"]["prompt_tokens"], b.len());
    assert_eq!(
        truncates(&lying),
        vec![(cached_len, 128, false), (cached_len, 0, true)]
    );
    let (text, finish, long_done) = long.join().unwrap();
    assert_eq!((text, finish.as_str()), (long_reply(), "stop"));
    assert!(
        long_done > b_done,
        "the long stream ran next to the re-prefilled request"
    );
    // The slot serves on (its next rewind is refused again, and re-prefilled again).
    let (status, body) = server.complete("lying", &b);
    assert_eq!((status, text_and_cached(&body)), (200, (REPLY, 0)), "{body}");

    // A sequence that cannot even be reset: only the request that needed it fails.
    let (status, body) = server.complete("never", &a);
    assert_eq!((status, text_and_cached(&body)), (200, (REPLY, 0)), "{body}");
    let long = server.start_long_stream("never");
    let (status, body) = server.complete("never", &b);
    assert_eq!(status, 500, "{body}");
    assert!(body.to_string().contains("cannot reset sequence"), "{body}");
    assert_eq!(
        truncates(&never),
        vec![(cached_len, 128, false), (cached_len, 0, false)]
    );
    let (text, finish, _) = long.join().unwrap();
    assert_eq!((text, finish.as_str()), (long_reply(), "stop"));
    // The next request takes a slot whose sequence is in a known state.
    let (status, body) = server.complete("never", "hello there");
    assert_eq!((status, text_and_cached(&body)), (200, (REPLY, 0)), "{body}");
}

#[test]
fn speculation_on_a_plugin_that_refuses_to_cut_drafts_costs_a_refill_not_the_request() {
    let home = home();
    let home = home.path();
    // Reports "anywhere" but can only rewind to 0: the cut of rejected drafts is refused.
    let lying = import_rewind_model(home, "lying", "anywhere".into(), "start".into(), false);
    let server = Server::start_with(home, "on");
    // The reply starts "0123..."; the prompt's "012X" makes "01" draft "2X", and "X" is rejected.
    let prompt = format!("{LONG_TRIGGER} 012X");
    // The second time the model speculates no more and answers on.
    for attempt in 0..2 {
        let (status, body) = server.complete("lying", &prompt);
        assert_eq!(status, 200, "attempt {attempt}: {body}");
        let text = body["choices"][0]["text"].as_str();
        assert_eq!(text, Some(long_reply().as_str()), "attempt {attempt}: {body}");
        if attempt == 0 {
            let log = truncates(&lying);
            let refused = log.iter().position(|&(_, to, ok)| !ok && to > 0);
            let refused = refused.unwrap_or_else(|| panic!("no refused cut of drafts: {log:?}"));
            let reset = log.get(refused + 1).map(|&(_, to, ok)| (to, ok));
            assert_eq!(reset, Some((0, true)), "{log:?}");
        }
    }
}

#[test]
fn speculation_on_plugins_that_rewind_only_to_snapshots_or_the_start_keeps_answers_correct() {
    let home = home();
    let home = home.path();
    // Rewinds to multiples of 4 only, and only to 0: rejected drafts could not be cut off, so
    // such a model is not speculated for (speculation::enabled), no cut its rule forbids is asked
    // for, and the answer is the one a server without speculation gives.
    let models = [
        (
            "snap",
            import_rewind_model(
                home,
                "snap",
                serde_json::json!({"every": 4}),
                serde_json::json!({"every": 4}),
                false,
            ),
        ),
        (
            "start",
            import_rewind_model(home, "start", "start".into(), "start".into(), false),
        ),
    ];
    let prompt = format!("{LONG_TRIGGER} 012X");
    let answers = |speculation: &str| -> (Vec<String>, String) {
        let server = Server::start_with(home, speculation);
        let texts = models
            .iter()
            .flat_map(|(model, _)| [model, model])
            .map(|model| {
                let (status, body) = server.complete(model, &prompt);
                assert_eq!(status, 200, "{model}, speculation {speculation}: {body}");
                body["choices"][0]["text"].as_str().unwrap().to_string()
            })
            .collect();
        (texts, http_request(server.port, "GET", "/metrics", "").1)
    };
    let (plain, _) = answers("off");
    assert!(plain.iter().all(|t| *t == long_reply()), "{plain:?}");
    let (speculated, metrics) = answers("on");
    assert_eq!(speculated, plain, "speculation changed an answer");
    assert!(
        metrics.contains("\nberth_speculative_draft_tokens_total 0\n"),
        "drafts for a model that cannot cut them:\n{metrics}"
    );
    for (model, log) in &models {
        let log = truncates(log);
        assert!(
            log.iter().all(|&(_, _, ok)| ok),
            "{model}: a forbidden cut was asked for: {log:?}"
        );
    }
}

#[test]
fn berth_run_chat_falls_back_to_a_full_prefill_when_the_rewind_is_refused() {
    let home = home();
    let home = home.path();
    let lying = import_rewind_model(home, "lying", "anywhere".into(), "start".into(), false);
    let snap = import_rewind_model(
        home,
        "snap",
        serde_json::json!({"every": 48}),
        serde_json::json!({"every": 48}),
        false,
    );
    let (a, b) = prompts(150, 140);
    let cached_len = 150 + REPLY.len() as u64;
    // `berth run` reuses what the server does: the shared prefix's whole 64-token chunks (128).
    for (model, log, want) in [
        (
            "lying",
            &lying,
            vec![(cached_len, 128, false), (cached_len, 0, true)],
        ),
        ("snap", &snap, vec![(cached_len, 96, true)]),
    ] {
        let mut child = Command::new(berth_exe())
            .args([
                "run",
                "--raw",
                "--temperature",
                "0",
                "--speculation",
                "off",
                &format!("{model}:latest"),
            ])
            .env("BERTH_HOME", home)
            .env_remove("BERTH_PLUGIN_PATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        write!(child.stdin.take().unwrap(), "{a}\n{b}\n/bye\n").unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{model}: {stderr}");
        assert!(!stderr.contains("error"), "{model}: {stderr}");
        assert_eq!(stdout.lines().collect::<Vec<_>>(), [REPLY, REPLY], "{model}");
        assert_eq!(truncates(log), want, "{model}");
    }
}
