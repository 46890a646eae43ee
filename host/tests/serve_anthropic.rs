//! `berth serve`'s Anthropic Messages API end to end: a real server process on loopback with
//! Qwen2.5-Coder 0.5B, driven by the official `anthropic` Python package
//! (tests/serve/anthropic_checks.py, deps installed by scripts/python-test-deps).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

const MODEL: &str = "qwen2.5-coder:0.5b";

#[test]
fn anthropic_client_creates_streams_calls_tools_counts_tokens_and_gets_typed_errors() {
    let home = home_with_qwen("berth-anthropic-", MODEL);
    let server = TestServer::start(home.path(), &["--parallel", "2"]);
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/anthropic_checks.py"))
        .args([server.base.as_str(), MODEL])
        .args(["messages", "stream", "tools", "errors"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "anthropic checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
    for check in ["messages", "stream", "tools", "errors"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("ok {check}"))),
            "{check} did not report ok:\n{stdout}"
        );
    }

    // The raw event stream: `event:` lines name each `data:` payload's type, in order.
    let body = format!(
        r#"{{"model": "{MODEL}", "max_tokens": 4, "temperature": 0, "stream": true,
            "messages": [{{"role": "user", "content": "Say hello."}}]}}"#
    );
    let (status, text) = server.post("/v1/messages", &body);
    assert_eq!(status, 200, "{text}");
    let mut kinds = Vec::new();
    let mut lines = text
        .lines()
        .filter(|l| l.starts_with("event: ") || l.starts_with("data: "));
    while let Some(event) = lines.next() {
        let kind = event.strip_prefix("event: ").unwrap_or_else(|| panic!("{text}"));
        let data = lines.next().and_then(|l| l.strip_prefix("data: ")).unwrap();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["type"], kind, "{text}");
        kinds.push(kind.to_string());
    }
    assert_eq!(kinds.first().map(String::as_str), Some("message_start"), "{text}");
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["message_delta".to_string(), "message_stop".to_string()],
        "{text}"
    );
    assert!(text.contains(r#""stop_reason":"max_tokens""#), "{text}");

    // `top_k`, and `min_p` and `seed` as extension fields (as llama.cpp's server takes them), are
    // sampling fields like the others: accepted, and checked.
    let sampled = |fields: &str| {
        server.post(
            "/v1/messages",
            &format!(
                r#"{{"model": "{MODEL}", "max_tokens": 2, {fields},
                    "messages": [{{"role": "user", "content": "Say hello."}}]}}"#
            ),
        )
    };
    let (status, text) = sampled(r#""top_k": 40, "min_p": 0.05, "seed": 7"#);
    assert_eq!(status, 200, "{text}");
    for (fields, param) in [(r#""min_p": 2"#, "min_p"), (r#""seed": "x""#, "seed")] {
        let (status, text) = sampled(fields);
        assert_eq!(status, 400, "{fields}: {text}");
        assert!(text.contains(param), "{fields}: {text}");
    }

    // Unknown fields and malformed bodies: 400 in Anthropic's shape, never a 5xx. (`MAX` stands
    // for the `max_tokens` field that only /v1/messages takes.)
    let cases = [
        (r#"{"model": 1"#.to_string(), "JSON"),
        (
            format!(r#"{{"model": "{MODEL}", MAX "messages": [], "foo": 1}}"#),
            "foo",
        ),
        (
            format!(r#"{{"model": "{MODEL}", MAX "messages": "hi"}}"#),
            "messages",
        ),
        (
            format!(
                r#"{{"model": "{MODEL}", MAX "messages": [{{"role": "user", "content": [{{"type": "audio"}}]}}]}}"#
            ),
            "messages[0].content[0].type",
        ),
    ];
    for (body, mention) in cases {
        for (path, max) in [
            ("/v1/messages", r#""max_tokens": 4,"#),
            ("/v1/messages/count_tokens", ""),
        ] {
            let body = body.replace("MAX", max);
            let (status, text) = server.post(path, &body);
            assert_eq!(status, 400, "{path} {body}: {text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["type"], "error", "{text}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{text}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains(mention),
                "{path} {body}: {text}"
            );
        }
    }
    // count_tokens takes no max_tokens.
    let (status, text) = server.post(
        "/v1/messages/count_tokens",
        &format!(
            r#"{{"model": "{MODEL}", "max_tokens": 4, "messages": [{{"role": "user", "content": "hi"}}]}}"#
        ),
    );
    assert_eq!(status, 400, "{text}");

    // A body over the limit (32 MiB): 413 in Anthropic's shape.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let n = 40usize << 20;
        let _ = write!(
            w,
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n"
        );
        let chunk = vec![b'a'; 1 << 16];
        for _ in 0..n >> 16 {
            if w.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut resp = vec![0u8; 4096];
    let mut got = 0;
    while got < resp.len() {
        match s.read(&mut resp[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        if String::from_utf8_lossy(&resp[..got]).contains("}}") {
            break;
        }
    }
    let resp = String::from_utf8_lossy(&resp[..got]).into_owned();
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    assert!(resp.contains(r#""type":"request_too_large""#), "{resp}");
}

/// A byte-level chat template with Qwen3's thinking switch: `enable_thinking` false closes an
/// empty `<think>` block in the generation prompt.
const THINKING_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
    {% if add_generation_prompt %}assistant: \
    {% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

#[test]
fn thinking_blocks_the_thinking_switch_and_a_mid_stream_error_with_a_scripted_model() {
    let home = tempfile::Builder::new()
        .prefix("berth-anthropic-think-")
        .tempdir()
        .unwrap();
    berth_ok(
        home.path(),
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let src = home.path().join("src");
    // It thinks, then answers; after a closed empty think block (thinking off) it only answers.
    // A prompt holding '~' makes the model panic: the engine reports an error mid-stream.
    let script = serde_json::json!({
        "stop_tokens": [256],
        "thinking": true,
        "panic_token": i32::from(b'~'),
        "entries": [
            {"trigger": byte_tokens("</think>\n\n"), "reply": byte_tokens("The answer is 4.")},
            {"reply": byte_tokens("<think>Two and two.</think>The answer is 4.")},
        ],
    });
    write_scripted_pack(&src, "thinker", "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], Some(THINKING_TEMPLATE));
    berth_ok(home.path(), None, &["import", src.to_str().unwrap()]);
    let server = TestServer::start(home.path(), &["--parallel", "2"]);
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/anthropic_checks.py"))
        .args([server.base.as_str(), "thinker:latest", "thinking", "stream_error"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "anthropic checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
    for check in ["thinking", "stream_error"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("ok {check} "))),
            "{check} did not report ok:\n{stdout}"
        );
    }
}
