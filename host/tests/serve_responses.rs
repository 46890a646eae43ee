//! `berth serve`'s Responses API (`/v1/responses`) end to end: a real server process on loopback
//! with Qwen2.5-Coder 0.5B, driven by the official `openai` Python package
//! (tests/serve/responses_checks.py, deps installed by scripts/python-test-deps).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};

const MODEL: &str = "qwen2.5-coder:0.5b";

/// A fresh Berth home with the qwen3 plugin and Qwen2.5-Coder 0.5B imported as [`MODEL`].
fn home_with_qwen() -> tempfile::TempDir {
    let tmp = tempfile::Builder::new()
        .prefix("berth-responses-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    berth_ok(
        &dir,
        None,
        &["plugins", "install", plugin_library("qwen3").to_str().unwrap()],
    );
    let qwen = real_model("qwen2.5-coder-0.5b");
    berth_ok(&dir, None, &["import", qwen.to_str().unwrap(), "--name", MODEL]);
    tmp
}

/// A running `berth serve`, killed on drop.
struct Server {
    child: Child,
    base: String,
    port: u16,
}

impl Server {
    fn start(home: &Path) -> Server {
        let (child, base, port) = spawn_serve(
            Command::new(berth_exe())
                .args(["serve", "--port", "0"])
                .env("BERTH_HOME", home)
                // The plugins this home installed (the build under test) are searched first.
                .env("BERTH_PLUGIN_PATH", home_plugins(home))
                .env("BERTH_LOG", "info"),
        );
        Server { child, base, port }
    }

    /// A plain HTTP/1.1 request; returns (status, body).
    fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        let resp = String::from_utf8_lossy(&resp).into_owned();
        let status = resp[9..12].parse().unwrap();
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_openai_client_creates_parses_streams_and_continues_responses() {
    let home = home_with_qwen();
    let server = Server::start(home.path());
    let checks = ["tools", "store", "parse", "stream", "incomplete", "errors"];
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/responses_checks.py"))
        .args([server.base.as_str(), MODEL])
        .args(checks)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "responses checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
    for check in checks {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("ok {check}"))),
            "no `ok {check}` line in:\n{stdout}"
        );
    }
    // Unknown stored responses are 404s in OpenAI's error shape, for GET and DELETE alike.
    for method in ["GET", "DELETE"] {
        let (status, body) = server.http(method, "/v1/responses/resp_unknown", None);
        assert_eq!(status, 404, "{method}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["type"], "not_found_error", "{body}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("resp_unknown"),
            "{body}"
        );
    }
}
