//! `berth serve`'s Responses API (`/v1/responses`) end to end: a real server process on loopback
//! with Qwen2.5-Coder 0.5B, driven by the official `openai` Python package
//! (tests/serve/responses_checks.py, deps installed by scripts/python-test-deps).

mod common;

use common::*;
use std::process::Command;

const MODEL: &str = "qwen2.5-coder:0.5b";

#[test]
fn the_openai_client_creates_parses_streams_and_continues_responses() {
    let home = home_with_qwen("berth-responses-", MODEL);
    let server = TestServer::start(home.path(), &[]);
    let checks = [
        "tools",
        "store",
        "parse",
        "stream",
        "incomplete",
        "errors",
        "extensions",
    ];
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
