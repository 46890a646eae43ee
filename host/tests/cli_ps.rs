//! `berth ps` and `berth stop` against a real `berth serve` with an API key: without the key they
//! fail naming the 401 (never an empty table); with it (BERTH_API_KEY or `--api-key`) `ps` prints
//! the loaded model and `stop` unloads it.

mod common;

use common::*;
use std::process::{Command, Output};

const KEY: &str = "sekret";

/// `berth ps` against `port`, with `key` in BERTH_API_KEY when given, and `args`.
fn ps(port: u16, key: Option<&str>, args: &[&str]) -> Output {
    client("ps", port, key, args)
}

/// `berth COMMAND` against `port`, with `key` in BERTH_API_KEY when given, and `args`.
fn client(command: &str, port: u16, key: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(berth_exe());
    cmd.arg(command)
        .args(args)
        .env("BERTH_HOST", "127.0.0.1")
        .env("BERTH_PORT", port.to_string())
        .env_remove("BERTH_API_KEY");
    if let Some(k) = key {
        cmd.env("BERTH_API_KEY", k);
    }
    cmd.output().expect("berth ps runs")
}

#[test]
fn ps_needs_the_servers_key_and_says_so_when_refused() {
    // No hold file: the held model answers at once.
    let home = home_with_held_model("berth-ps", &std::env::temp_dir().join("berth-ps-never-held"));
    let server = TestServer::start(home.path(), &["--api-key", KEY]);
    let body = r#"{"model":"held:latest","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
    let answer = server.raw(&format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    for (what, key) in [("no key", None), ("a wrong key", Some("nope"))] {
        let out = ps(server.port, key, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "with {what}: {stdout}");
        assert!(stdout.is_empty(), "with {what}, no table: {stdout}");
        assert!(
            stderr.contains("401") && stderr.contains("BERTH_API_KEY"),
            "with {what}: {stderr}"
        );
    }

    for out in [
        ps(server.port, Some(KEY), &[]),
        ps(server.port, None, &["--api-key", KEY]),
    ] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut lines = stdout.lines();
        assert!(lines.next().is_some_and(|l| l.starts_with("NAME")), "{stdout}");
        assert!(
            lines.next().is_some_and(|l| l.starts_with("held:latest")),
            "{stdout}"
        );
    }
}

#[test]
fn ps_reports_a_server_error_with_its_status_and_message() {
    // Something that is not Berth answers 500 on the port.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            let body = r#"{"error":"the store is on fire"}"#;
            let _ = std::io::Write::write_all(
                &mut conn,
                format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    let out = ps(port, None, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        stderr.contains("500") && stderr.contains("the store is on fire"),
        "{stderr}"
    );
}

#[test]
fn stop_unloads_a_model_without_loading_one_and_names_what_it_cannot_stop() {
    let home = home_with_held_model("berth-stop", &std::env::temp_dir().join("berth-stop-never-held"));
    let server = TestServer::start(home.path(), &["--api-key", KEY]);
    let loaded = |server: &TestServer| {
        let out = ps(server.port, Some(KEY), &["--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ps --json");
        v["models"].as_array().unwrap().len()
    };
    // Stopping a model that is not loaded does not load it.
    let out = client("stop", server.port, Some(KEY), &["held"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(loaded(&server), 0);

    let body = r#"{"model":"held:latest","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
    let answer = server.raw(&format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(loaded(&server), 1);

    let out = client("stop", server.port, None, &["held"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("401"), "{stderr}");
    assert_eq!(loaded(&server), 1, "a refused stop leaves the model loaded");

    let out = client("stop", server.port, None, &["held", "--api-key", KEY]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(loaded(&server), 0, "stopped");

    let out = client("stop", server.port, Some(KEY), &["nope"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("404") && stderr.contains("nope"),
        "{stderr}"
    );
}
