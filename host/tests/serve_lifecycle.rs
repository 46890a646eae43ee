//! How a real `berth serve` keeps models and reports refusals: keep-alive counts from the end of
//! the last request on a model, never during one (a request held open far past a short
//! keep-alive, streamed and not, and a stream whose client goes away); and every refused request
//! is logged with its reason and the request id its client got, never with its body.
//!
//! The scripted plugin's `hold_file` keeps a request running exactly as long as a test needs:
//! while the file exists, every `decode` waits.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Server tests run one at a time (two shared cores).
static SERIAL: Mutex<()> = Mutex::new(());

/// How long any awaited state may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(300);

/// The keep-alive the keep-alive test serves with.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The scripted model.
const MODEL: &str = "held:latest";

/// Takes the serial lock even when an earlier test panicked while holding it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn chat(content: &str, stream: bool) -> String {
    serde_json::json!({"model": MODEL, "stream": stream, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": content}]})
    .to_string()
}

/// `/api/ps`'s entry for [`MODEL`], if it is loaded.
fn loaded(server: &TestServer) -> Option<serde_json::Value> {
    let (status, body) = server.http("GET", "/api/ps", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == MODEL)
        .cloned()
}

/// Waits until `ok` holds, failing after [`DEADLINE`].
fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Loads [`MODEL`] with a quick request (nothing held).
fn load(server: &TestServer) {
    let (status, body) = server.post("/v1/chat/completions", &chat("hi", false));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("fine"), "{body}");
}

/// Makes the next decode wait; waits until a request is running on [`MODEL`] and held there.
fn hold_a_request(server: &TestServer, hold: &Path, stream: bool) -> std::thread::JoinHandle<(u16, String)> {
    std::fs::write(hold, "").unwrap();
    let port = server.port;
    let body = chat("a long one", stream);
    let request = std::thread::spawn(move || http_request(port, "POST", "/v1/chat/completions", &body));
    wait_for("the held request to run", || {
        loaded(server).is_some_and(|m| m["active"] == 1)
    });
    request
}

/// Asserts [`MODEL`] stays loaded with its request running for well past the keep-alive.
fn stays_loaded_while_running(server: &TestServer) {
    let t0 = Instant::now();
    // The watcher unloads expired models every 500 ms: three of its passes past the keep-alive.
    while t0.elapsed() < KEEP_ALIVE + Duration::from_millis(1500) {
        let m = loaded(server).unwrap_or_else(|| {
            panic!(
                "unloaded {:.2} s into a running request (keep-alive {KEEP_ALIVE:?})",
                t0.elapsed().as_secs_f64()
            )
        });
        assert_eq!(m["active"], 1, "{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for [`MODEL`] to be unloaded; returns how long after `since` that was seen.
fn unloaded_after(server: &TestServer, since: Instant) -> Duration {
    wait_for("the model to be unloaded", || loaded(server).is_none());
    since.elapsed()
}

#[test]
fn keep_alive_counts_from_the_end_of_the_last_request_never_during_one() {
    let _serial = serial();
    let holder = tempfile::tempdir().unwrap();
    let hold = holder.path().join("hold");
    let home = home_with_held_model("berth-lifecycle-", &hold);
    let server = TestServer::start(home.path(), &["--keep-alive", "2s"]);

    for stream in [false, true] {
        let what = if stream { "streamed" } else { "not streamed" };
        load(&server);
        let request = hold_a_request(&server, &hold, stream);
        stays_loaded_while_running(&server);
        std::fs::remove_file(&hold).unwrap();
        let (status, body) = request.join().unwrap();
        // The client has read the whole answer: the request has ended.
        let ended = Instant::now();
        assert_eq!(status, 200, "{what}: {body}");
        // A stream comes one token a chunk: its end is what counts.
        let end = if stream { "[DONE]" } else { "fine" };
        assert!(body.contains(end), "{what}: {body}");
        let after = unloaded_after(&server, ended);
        println!(
            "{what}: unloaded {:.2} s after the request ended (keep-alive {KEEP_ALIVE:?})",
            after.as_secs_f64()
        );
        // The server released the model just before the client saw the end: a little slack.
        assert!(
            after + Duration::from_millis(250) >= KEEP_ALIVE,
            "{what}: unloaded {after:?} after the request ended, before its keep-alive {KEEP_ALIVE:?}"
        );
    }

    // A stream whose client goes away releases the model too: it is unloaded a keep-alive later.
    load(&server);
    std::fs::write(&hold, "").unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let body = chat("going away", true);
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    wait_for("the streamed request to run", || {
        loaded(&server).is_some_and(|m| m["active"] == 1)
    });
    drop(s);
    let gone = Instant::now();
    std::fs::remove_file(&hold).unwrap();
    let after = unloaded_after(&server, gone);
    println!("client gone: unloaded {:.2} s after it left", after.as_secs_f64());
    assert!(
        after + Duration::from_millis(250) >= KEEP_ALIVE,
        "unloaded {after:?} after the client left, before its keep-alive {KEEP_ALIVE:?}"
    );
}

/// The value of a `/metrics` line.
fn metric(server: &TestServer, name: &str) -> f64 {
    let (_, text) = server.http("GET", "/metrics", None);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// Requests for a model that another request is loading wait for the load, as Ollama's do, on
/// every surface. Before, they were a 503 ("is loading; retry shortly"), which Anthropic's
/// clients read as overloaded and Ollama's clients never retry: two first requests to a cold
/// server, and one failed.
#[test]
fn requests_for_a_model_being_loaded_wait_for_the_load() {
    let _serial = serial();
    let holder = tempfile::tempdir().unwrap();
    let hold = holder.path().join("hold");
    let home = home_with_held_model("berth-lifecycle-", &hold);
    let server = TestServer::start(home.path(), &[]);
    // The model's creation waits while the hold file exists.
    std::fs::write(&hold, "").unwrap();
    let port = server.port;
    let post = |path: &'static str, body: serde_json::Value| {
        std::thread::spawn(move || http_request(port, "POST", path, &body.to_string()))
    };
    let user = serde_json::json!([{"role": "user", "content": "hi"}]);
    let first = post(
        "/v1/chat/completions",
        serde_json::json!({"model": MODEL, "max_tokens": 8, "messages": user}),
    );
    wait_for("the load to start", || {
        server.http("GET", "/health", None).1.contains("loading")
    });
    let waiting = [
        post(
            "/api/chat",
            serde_json::json!({"model": MODEL, "stream": false, "messages": user}),
        ),
        post(
            "/v1/messages",
            serde_json::json!({"model": MODEL, "max_tokens": 8, "messages": user}),
        ),
    ];
    wait_for("both to wait for the load", || {
        metric(&server, "berth_requests_waiting_for_load") == 2.0
    });
    std::fs::remove_file(&hold).unwrap();
    for request in std::iter::once(first).chain(waiting) {
        let (status, body) = request.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("fine"), "{body}");
    }
    assert_eq!(metric(&server, "berth_requests_waiting_for_load"), 0.0);
}

/// A `berth serve --port 0` whose log (stderr, text lines) goes to `log`.
fn start_logging(home: &Path, log: &Path, extra: &[&str]) -> TestServer {
    let mut child = Command::new(berth_exe())
        .args(["serve", "--port", "0"])
        .args(extra)
        .env("BERTH_HOME", home)
        .env("BERTH_PLUGIN_PATH", home_plugins(home))
        .env_remove("BERTH_CORS_ORIGINS")
        .env_remove("BERTH_LOG_FORMAT")
        .env("BERTH_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("berth serve starts");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let base = line
        .trim()
        .strip_prefix("berth serve listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from berth serve: {line:?}"))
        .to_string();
    let port = base.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    TestServer { child, base, port }
}

/// Sends one request (`key`: the API key, if any); returns the status, the `x-request-id` the
/// client got and the body.
fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let raw = server.raw(&format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let id = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-request-id")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no x-request-id in the answer:\n{raw}"));
    (status, id, body.to_string())
}

/// The error message of an OpenAI- or Ollama-shaped error body.
fn error_message(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    match &v["error"] {
        serde_json::Value::String(s) => s.clone(),
        e => e["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message: {body}"))
            .to_string(),
    }
}

/// Waits for the `answered` line of request `id` in the log; returns it.
fn answered_line(log: &Path, id: &str) -> String {
    let mut found = None;
    wait_for(&format!("the log line of {id}"), || {
        let text = std::fs::read_to_string(log).unwrap();
        found = text
            .lines()
            .find(|l| l.contains(&format!("id={id}")) && l.contains("answered"))
            .map(str::to_string);
        found.is_some()
    });
    found.unwrap()
}

/// One refused request of the log test.
struct Case<'a> {
    what: &'a str,
    method: &'a str,
    path: &'a str,
    /// The API key sent.
    key: Option<&'a str>,
    body: &'a str,
    /// The status it gets.
    status: u16,
    /// What its log line shows besides the status and the reason.
    logs: &'a [&'a str],
}

impl<'a> Case<'a> {
    /// A request sent with the server's API key.
    fn new(what: &'a str, method: &'a str, path: &'a str, body: &'a str, status: u16) -> Self {
        Case {
            what,
            method,
            path,
            key: Some(API_KEY),
            body,
            status,
            logs: &[],
        }
    }

    fn logs(self, logs: &'a [&'a str]) -> Self {
        Case { logs, ..self }
    }
}

/// The API key the log test serves with.
const API_KEY: &str = "k";

#[test]
fn every_refusal_is_logged_with_its_reason_and_the_request_id_the_client_got() {
    let _serial = serial();
    let holder = tempfile::tempdir().unwrap();
    let home = home_with_held_model("berth-lifecycle-", &holder.path().join("hold"));
    let log = holder.path().join("serve.log");
    let server = start_logging(home.path(), &log, &["--api-key", API_KEY, "--max-body", "4000"]);
    const MARKER: &str = "BODY-MARKER-never-logged";
    let key = Some(API_KEY);
    let bad_param = serde_json::json!({"model": MODEL, "temperature": "hot",
        "messages": [{"role": "user", "content": MARKER}]})
    .to_string();
    let unknown_model = serde_json::json!({"model": "nope:latest",
        "messages": [{"role": "user", "content": MARKER}]})
    .to_string();
    let too_large = serde_json::json!({"model": MODEL,
        "messages": [{"role": "user", "content": MARKER.repeat(200)}]})
    .to_string();
    let ollama_bad = serde_json::json!({"model": MODEL, "options": {"temperature": "hot"},
        "messages": [{"role": "user", "content": MARKER}]})
    .to_string();
    let post = "POST";
    let chat = "/v1/chat/completions";
    let cases = [
        Case::new("a bad parameter", post, chat, &bad_param, 400).logs(&["param=\"temperature\""]),
        Case::new("an unknown model", post, chat, &unknown_model, 404)
            .logs(&["code=\"model_not_found\"", "param=\"model\""]),
        Case::new("a bad Ollama option", post, "/api/chat", &ollama_bad, 400)
            .logs(&["param=\"options.temperature\""]),
        Case::new("no such route", "GET", "/v1/nothing", "", 404),
        Case::new("a body over --max-body", post, chat, &too_large, 413),
        Case {
            key: None,
            ..Case::new("no API key", post, chat, &bad_param, 401).logs(&["code=\"invalid_api_key\""])
        },
        Case::new("a path axum refuses", "GET", "/v1/responses/%FF", "", 400),
    ];
    // The auth scheme's name is case-insensitive: `bearer` passes where `Bearer` does (to the
    // 400 of the bad parameter), and a wrong key in either case does not.
    for (scheme, key, want) in [
        ("bearer", API_KEY, "400"),
        ("BEARER", API_KEY, "400"),
        ("bearer", "nope", "401"),
    ] {
        let raw = server.raw(&format!(
            "POST {chat} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nauthorization: {scheme} {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{bad_param}",
            bad_param.len()
        ));
        assert!(
            raw.starts_with(&format!("HTTP/1.1 {want}")),
            "{scheme} {key}: {raw}"
        );
    }
    for Case {
        what,
        method,
        path,
        key,
        body,
        status: want,
        logs: extra,
    } in cases
    {
        let (status, id, answer) = send(&server, method, path, key, body);
        assert_eq!(status, want, "{what}: {answer}");
        let line = answered_line(&log, &id);
        println!("{what}: {line}");
        assert!(line.contains(" INFO "), "{what}: not at info: {line}");
        assert!(line.contains(&format!("status={want}")), "{what}: {line}");
        // The reason the client got: the error's message, or (not an API error) its text.
        let reason = if answer.trim_start().starts_with('{') {
            error_message(&answer)
        } else {
            answer.trim().to_string()
        };
        assert!(!reason.is_empty(), "{what}: no reason in the answer");
        assert!(
            line.contains(&format!("reason={reason:?}")),
            "{what}: {reason:?} not in {line}"
        );
        for e in extra {
            assert!(line.contains(e), "{what}: {e} not in {line}");
        }
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(MARKER), "a request body reached the log:\n{text}");
    // A served request's line carries no reason.
    let (status, id, answer) = send(&server, "GET", "/v1/models", key, "");
    assert_eq!(status, 200, "{answer}");
    let line = answered_line(&log, &id);
    assert!(line.contains("status=200") && !line.contains("reason="), "{line}");
}
