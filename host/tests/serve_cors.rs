//! CORS end to end: a page calls `berth serve` from headless Chromium (installed by
//! scripts/browser-deps). A page from a loopback origin (`http://127.0.0.1:PORT`) reads Berth's
//! answers without configuration, as Ollama allows it; a page from another origin
//! (`http://page.example:PORT`, which Chromium resolves to the loopback interface) needs
//! `--cors-origin` naming it (or `*`), else the browser refuses its calls. Preflights are
//! answered before authentication (`--api-key`).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

const KEY: &str = "sekret";

/// A running `berth serve` with no models and an API key.
type Server = TestServer;

/// Serves an empty home with `--api-key` and the `cors` flags.
fn start(home: &Path, cors: &[&str]) -> Server {
    let mut flags = vec!["--api-key", KEY];
    flags.extend_from_slice(cors);
    TestServer::start(home, &flags)
}

/// The test page: two cross-origin calls (a GET with a bearer token and a JSON POST, both
/// preflighted) whose outcome it writes into the DOM.
fn page(berth_port: u16) -> String {
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
const base = "http://127.0.0.1:{berth_port}";
const auth = {{"Authorization": "Bearer {KEY}"}};
async function run() {{
  const out = [];
  try {{
    const r = await fetch(base + "/v1/models", {{headers: auth}});
    out.push("models:" + r.status + ":" + (await r.json()).object + ":" + (r.headers.get("x-request-id") ? "id" : "noid"));
  }} catch (e) {{ out.push("models:blocked"); }}
  try {{
    const r = await fetch(base + "/v1/chat/completions", {{method: "POST",
      headers: Object.assign({{"Content-Type": "application/json"}}, auth),
      body: JSON.stringify({{model: "nope", messages: [{{role: "user", content: "hi"}}]}})}});
    out.push("chat:" + r.status + ":" + (await r.json()).error.code);
  }} catch (e) {{ out.push("chat:blocked"); }}
  try {{
    const r = await fetch(base + "/v1/models");
    out.push("nokey:" + r.status + ":" + (await r.json()).error.code);
  }} catch (e) {{ out.push("nokey:blocked"); }}
  document.getElementById("out").textContent = "RESULT " + out.join(" ") + " END";
}}
run();
</script></body></html>"#
    )
}

/// Serves `html` to every request on `listener`, on a thread, until the process ends.
fn serve_page(listener: TcpListener, html: String) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            );
        }
    });
}

/// The host of a page whose origin is not a loopback one.
const PAGE_HOST: &str = "page.example";

/// Starts a server with `cors` flags and a page (on its own loopback port, its origin's host
/// `host`) that calls it; returns the server, the page's origin and what the page saw in Chromium.
fn page_against(
    chromium: &str,
    home: &Path,
    cors: &[&str],
    allow_page: bool,
    host: &str,
) -> (Server, String, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{host}:{}", listener.local_addr().unwrap().port());
    let mut flags: Vec<&str> = cors.to_vec();
    if allow_page {
        flags.extend(["--cors-origin", origin.as_str()]);
    }
    let server = start(home, &flags);
    serve_page(listener, page(server.port));
    let seen = run_page(chromium, &origin);
    (server, origin, seen)
}

/// Loads the page in headless Chromium and returns what it wrote.
fn run_page(chromium: &str, origin: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("--host-resolver-rules=MAP {PAGE_HOST} 127.0.0.1"))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("{origin}/"))
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    let result = dom
        .split_once("RESULT ")
        .and_then(|(_, r)| r.split_once(" END"))
        .map(|(r, _)| r.to_string());
    result.unwrap_or_else(|| {
        panic!(
            "the page wrote no result:\n{dom}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn a_browser_page_calls_berth_only_when_cors_allows_its_origin() {
    let chromium = script_stdout("browser-deps", &[]).trim().to_string();
    let home = tempfile::tempdir().unwrap();
    let works = "models:200:list:id chat:404:model_not_found nokey:401:invalid_api_key";

    // Allowed (next to another origin): the page reads the answers, errors included.
    let (server, origin, seen) = page_against(
        &chromium,
        home.path(),
        &["--cors-origin", "http://elsewhere.example"],
        true,
        PAGE_HOST,
    );
    assert_eq!(seen, works, "with CORS allowed");
    // Preflight: answered before authentication, echoing the origin and the asked headers.
    let pre = server.raw(&format!(
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"
    ));
    let head = pre.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 204"), "{pre}");
    assert!(
        head.contains(&format!("access-control-allow-origin: {origin}")),
        "{pre}"
    );
    assert!(
        head.contains("access-control-allow-headers: authorization, content-type"),
        "{pre}"
    );
    // A list header: tower-http writes it without spaces after the commas.
    let methods = head
        .lines()
        .find_map(|l| l.strip_prefix("access-control-allow-methods:"))
        .map(|v| v.split(',').map(str::trim).collect::<Vec<_>>());
    assert_eq!(methods, Some(vec!["get", "post", "delete", "options"]), "{pre}");
    // Another origin gets no CORS headers (and the 401 of an unauthenticated request).
    let other = server.raw(
        "OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\nAccess-Control-Request-Method: GET\r\nConnection: close\r\n\r\n",
    );
    assert!(
        !other.to_ascii_lowercase().contains("access-control-allow-origin"),
        "{other}"
    );
    assert!(other.starts_with("HTTP/1.1 401"), "{other}");
    drop(server);

    // `*` allows any page.
    let (_s, _, seen) = page_against(&chromium, home.path(), &["--cors-origin", "*"], false, PAGE_HOST);
    assert_eq!(seen, works, "with *");

    // Without configuration, a page from a loopback origin works, as with Ollama; its preflight
    // is answered (an app's web view origin too).
    let (server, origin, seen) = page_against(&chromium, home.path(), &[], false, "127.0.0.1");
    assert_eq!(seen, works, "a loopback page without configuration");
    for o in [origin.as_str(), "http://localhost:1234", "vscode-webview://abc"] {
        let pre = server.raw(&format!(
            "OPTIONS /api/chat HTTP/1.1\r\nHost: x\r\nOrigin: {o}\r\nAccess-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
        ));
        assert!(pre.starts_with("HTTP/1.1 204"), "{o}: {pre}");
        assert!(
            pre.to_ascii_lowercase().contains(&format!(
                "access-control-allow-origin: {}",
                o.to_ascii_lowercase()
            )),
            "{o}: {pre}"
        );
    }
    drop(server);

    // Any other origin is refused by default, or when another origin is allowed.
    let blocked = "models:blocked chat:blocked nokey:blocked";
    let (_s, _, seen) = page_against(&chromium, home.path(), &[], false, PAGE_HOST);
    assert_eq!(seen, blocked, "without CORS");
    let (_s, _, seen) = page_against(
        &chromium,
        home.path(),
        &["--cors-origin", "http://elsewhere.example"],
        false,
        PAGE_HOST,
    );
    assert_eq!(seen, blocked, "with another origin allowed");
}
