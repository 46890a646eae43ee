//! `berth serve` under pressure, without timing races: the scripted plugin's `hold_file` holds a
//! model load or a running decode open for exactly as long as the test needs, and the test waits
//! on the state it asserts (`/health`, `/metrics`) with deadlines of minutes. A request that
//! arrives while its model loads waits for the load, one past a full queue gets 429, and SIGTERM
//! lets the running and the queued streams finish before the process exits 0.

mod common;

use common::*;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MODEL: &str = "held:latest";
/// How long any awaited state may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(300);

type Server = TestServer;

impl Server {
    /// Starts a streamed chat request on its own thread; the handle yields the whole answer.
    fn stream(&self) -> JoinHandle<String> {
        let port = self.port;
        std::thread::spawn(move || {
            let body = serde_json::json!({"model": MODEL, "stream": true, "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}]});
            http_request(port, "POST", "/v1/chat/completions", &body.to_string()).1
        })
    }

    /// The value of a `/metrics` line.
    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.http("GET", "/metrics", None);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
    }

    /// Waits until `ok` holds, failing after [`DEADLINE`].
    fn wait_for(&self, what: &str, ok: impl Fn(&Server) -> bool) {
        let t0 = Instant::now();
        while !ok(self) {
            assert!(t0.elapsed() < DEADLINE, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn loading_waits_a_full_queue_is_429_and_sigterm_lets_streams_finish() {
    let holder = tempfile::tempdir().unwrap();
    let hold = holder.path().join("hold");
    let home = home_with_held_model("berth-limits-", &hold);
    let mut server = Server::start(home.path(), &["--parallel", "1", "--queue", "1"]);
    let ask = serde_json::json!({"model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();

    // The first request starts the load, which waits on the hold: another request waits for
    // that load (as Ollama's do), then is answered.
    std::fs::write(&hold, "").unwrap();
    let first = server.stream();
    server.wait_for("the model to be loading", |s| {
        s.http("GET", "/health", None).1.contains("loading")
    });
    let port = server.port;
    let body = ask.clone();
    let second = std::thread::spawn(move || http_request(port, "POST", "/v1/chat/completions", &body));
    server.wait_for("the second request to wait for the load", |s| {
        s.metric("berth_requests_waiting_for_load") == 1.0
    });
    std::fs::remove_file(&hold).unwrap();
    let answer = first.join().unwrap();
    assert!(
        answer.contains("\"finish_reason\":\"stop\"") && answer.contains("data: [DONE]"),
        "{answer}"
    );
    let (status, body) = second.join().unwrap();
    assert_eq!(status, 200, "{body}");
    server.wait_for("an idle KV cache", |s| {
        s.metric("berth_kv_cache_usage_ratio") == 0.0
    });

    // One slot and a queue of one: with the running sequence held, a third request is a 429.
    std::fs::write(&hold, "").unwrap();
    let running = server.stream();
    server.wait_for("a running sequence", |s| {
        s.metric("berth_active_sequences") == 1.0
    });
    // The gauges an inference gateway's endpoint picker reads (docs/metrics.md) move with it.
    server.wait_for("the running sequence in the KV-cache gauge", |s| {
        s.metric("berth_kv_cache_usage_ratio") > 0.0
    });
    let queued = server.stream();
    server.wait_for("a queued request", |s| s.metric("berth_queue_depth") == 1.0);
    let (status, body) = server.post("/v1/chat/completions", &ask);
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("rate_limit_error"), "{body}");

    // SIGTERM while both are held: once released, both still end with [DONE]; the process exits 0.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(&hold).unwrap();
    for (name, s) in [("running", running), ("queued", queued)] {
        let all = s.join().unwrap();
        assert!(
            all.contains("data: [DONE]"),
            "{name} stream cut by shutdown: {all}"
        );
    }
    let t0 = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(t0.elapsed() < DEADLINE, "berth serve did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Header limits (hyper's, documented in docs/serve.md): more than 100 header fields, or a head
/// over about 400 KB, is a 431 before any handler runs, and the server goes on serving.
#[test]
fn oversized_headers_are_431_and_the_server_goes_on() {
    let home = tempfile::tempdir().unwrap();
    let server = Server::start(home.path(), &[]);
    let many: String = (0..101).map(|i| format!("X-Header-{i}: v\r\n")).collect();
    let big = format!("X-Big: {}\r\n", "a".repeat(500_000));
    for (what, headers) in [("101 fields", many), ("a 500 KB field", big)] {
        let raw = server.raw(&format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n"
        ));
        assert!(
            raw.starts_with("HTTP/1.1 431"),
            "{what}: {}",
            &raw[..raw.len().min(200)]
        );
    }
    let few: String = (0..90).map(|i| format!("X-Header-{i}: v\r\n")).collect();
    let raw = server.raw(&format!(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{few}\r\n"
    ));
    assert!(raw.starts_with("HTTP/1.1 200"), "{}", &raw[..raw.len().min(200)]);
}
