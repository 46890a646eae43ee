//! `berth ps` against a real `berth serve` with an API key: without the key it fails naming the
//! 401 (never an empty table); with it (BERTH_API_KEY or `--api-key`) it prints the loaded model.

mod common;

use common::*;
use std::process::{Command, Output};

const KEY: &str = "sekret";

/// `berth ps` against `port`, with `key` in BERTH_API_KEY when given, and `args`.
fn ps(port: u16, key: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(berth_exe());
    cmd.arg("ps")
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
