//! A malformed-request suite against one real `berth serve` process: hundreds of generated bad
//! requests over every route (wrong JSON types, missing fields, nulls, absurd numbers, unknown
//! roles and content parts, bad images, bad tools and schemas, path-traversal model names, deep
//! nesting, oversized, non-UTF-8, non-JSON, truncated and trickled bodies). Each must get a 4xx
//! in its API's error shape (OpenAI, Ollama, or Anthropic on `/v1/messages`), and after each one
//! the server must still be alive and answer `/health`; at the end a good request to every API
//! works. Most cases go to a scripted model (fast); a share goes to the real Qwen2.5-Coder 0.5B so
//! the tokenizer, template, grammar and tool paths of a real model are hit too.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The scripted model (tools on, so tool requests reach the grammar).
const SCRIPTED: &str = "mal:latest";
/// The real model.
const QWEN: &str = "qwen2.5-coder:0.5b";
/// A scripted model that takes images (LFM2-VL's scheme), so image payloads get decoded.
const EYES: &str = "eyes:latest";
/// The scripted model's answer.
const REPLY: &str = "fine";
/// A chat template for the scripted model's byte tokenizer.
const TEMPLATE: &str =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";
/// How long one answer may take on a loaded machine (the first Qwen request loads the model).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// The server's default body limit is 32 MiB: this is past it.
const OVERSIZE: usize = 40 << 20;
/// How many API cases [`cases`] generates: the suite must run every one of them, so a corpus
/// that shrinks silently (a generator loop that stops producing) fails. Change it only together
/// with the corpus.
const API_CASES: usize = 781;
/// How many malformed-HTTP cases [`malformed_http`] has, likewise.
const PROTOCOL_CASES: usize = 13;

/// Which API's error shape a route answers with.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    OpenAi,
    Ollama,
    Anthropic,
}

fn shape_of(path: &str) -> Shape {
    if path.starts_with("/v1/messages") {
        Shape::Anthropic
    } else if path.starts_with("/api/") {
        Shape::Ollama
    } else {
        Shape::OpenAi
    }
}

/// How a case's bytes travel.
#[derive(Clone, Debug)]
enum Transport {
    /// Headers and body at once.
    Whole,
    /// A `Content-Length` this much larger than the body, then the write side closed.
    Truncated(usize),
    /// `Transfer-Encoding: chunked`, in pieces of this many bytes (no `Content-Length`).
    Chunked(usize),
    /// The body is the whole request, sent as it is (for malformed HTTP itself).
    Raw,
    /// The body in this many pieces with a pause after each but the last.
    Slow(usize, Duration),
}

/// What status a case must get.
#[derive(Clone, Debug)]
enum Expect {
    /// Exactly this one.
    Is(u16),
    /// Any 4xx.
    Any4xx,
}

/// One malformed request.
#[derive(Clone, Debug)]
struct Case {
    name: String,
    method: &'static str,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    expect: Expect,
    transport: Transport,
}

impl Case {
    fn json(name: impl Into<String>, path: &str, body: &Value, expect: Expect) -> Case {
        Case {
            name: name.into(),
            method: if path == "/api/delete" { "DELETE" } else { "POST" },
            path: path.to_string(),
            content_type: "application/json",
            body: body.to_string().into_bytes(),
            expect,
            transport: Transport::Whole,
        }
    }

    fn raw(name: impl Into<String>, path: &str, body: impl Into<Vec<u8>>, expect: Expect) -> Case {
        Case {
            body: body.into(),
            ..Case::json(name, path, &Value::Null, expect)
        }
    }

    fn get(name: impl Into<String>, path: &str, expect: Expect) -> Case {
        Case {
            method: "GET",
            body: Vec::new(),
            ..Case::json(name, path, &Value::Null, expect)
        }
    }
}

/// A raw HTTP/1.1 exchange: (status, body); status 0 when no answer came.
fn exchange(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
    transport: &Transport,
) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    let declared = match transport {
        Transport::Truncated(extra) => body.len() + extra,
        _ => body.len(),
    };
    let length = match transport {
        Transport::Chunked(_) => "Transfer-Encoding: chunked".to_string(),
        _ => format!("Content-Length: {declared}"),
    };
    let head = match transport {
        Transport::Raw => String::new(),
        _ => format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {content_type}\r\n{length}\r\n\r\n"
        ),
    };
    // The body goes from its own thread: a server refusing a large body answers (and may close)
    // before reading it all, and the answer is what counts.
    let mut w = s.try_clone().unwrap();
    let body = body.to_vec();
    let transport = transport.clone();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(head.as_bytes());
        match transport {
            Transport::Whole | Transport::Raw => {
                let _ = w.write_all(&body);
            }
            Transport::Chunked(size) => {
                for chunk in body.chunks(size) {
                    let _ = write!(w, "{:x}\r\n", chunk.len());
                    let _ = w.write_all(chunk);
                    let _ = w.write_all(b"\r\n");
                }
                let _ = w.write_all(b"0\r\n\r\n");
            }
            Transport::Truncated(_) => {
                let _ = w.write_all(&body);
                let _ = w.flush();
                let _ = w.shutdown(Shutdown::Write);
            }
            Transport::Slow(pieces, pause) => {
                let step = body.len().div_ceil(pieces).max(1);
                for (i, chunk) in body.chunks(step).enumerate() {
                    let _ = w.write_all(chunk);
                    let _ = w.flush();
                    if i + 1 < pieces {
                        std::thread::sleep(pause);
                    }
                }
            }
        }
    });
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let _ = writer.join();
    let status = resp
        .get(9..12)
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    let Some(split) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (status, Vec::new());
    };
    let head = String::from_utf8_lossy(&resp[..split]).to_ascii_lowercase();
    let mut body = resp[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, body)
}

/// The payload of a chunked body.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

/// Why an error body does not have its API's shape, if it does not.
fn shape_problem(shape: Shape, body: &[u8]) -> Option<String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Some("not JSON".into());
    };
    let is_str = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    let ok = match shape {
        Shape::OpenAi => is_str(&v["error"]["message"]) && is_str(&v["error"]["type"]),
        Shape::Ollama => is_str(&v["error"]),
        Shape::Anthropic => {
            v["type"] == "error" && is_str(&v["error"]["type"]) && is_str(&v["error"]["message"])
        }
    };
    (!ok).then(|| format!("not {shape:?}-shaped"))
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
    fn request(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let bytes = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let (status, b) = exchange(
            self.port,
            method,
            path,
            "application/json",
            &bytes,
            &Transport::Whole,
        );
        (status, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// Whether the process still runs and `/health` answers 200.
    fn healthy(&mut self) -> bool {
        if self.child.try_wait().unwrap().is_some() {
            return false;
        }
        exchange(
            self.port,
            "GET",
            "/health",
            "application/json",
            b"",
            &Transport::Whole,
        )
        .0 == 200
    }
}

/// A home with the scripted plugin and two scripted packs (tools on; vision), plus the qwen3
/// plugin and Qwen2.5-Coder 0.5B.
fn home() -> tempfile::TempDir {
    let home = tempfile::Builder::new()
        .prefix("berth-malformed-")
        .tempdir()
        .unwrap();
    let h = home.path();
    berth_ok(
        h,
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    berth_ok(
        h,
        None,
        &["plugins", "install", plugin_library("qwen3").to_str().unwrap()],
    );
    let src = h.join("src");
    let script = json!({"stop_tokens": [256], "tools": true,
        "entries": [{"reply": byte_tokens(REPLY)}]});
    write_scripted_pack(&src, "mal", "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], Some(TEMPLATE));
    berth_ok(h, None, &["import", src.to_str().unwrap()]);
    let src = h.join("src-eyes");
    let script = json!({"stop_tokens": [256], "vocab_size": 260, "context_length": 4096,
        "vision": {"scheme": "lfm2_vl", "layout": "patches", "patch_size": 16, "image_token_id": 257,
            "params": {"do_image_splitting": false, "min_image_tokens": 4, "max_image_tokens": 64}},
        "entries": [{"reply": byte_tokens(REPLY)}]});
    write_scripted_pack(&src, "eyes", "latest", &script);
    let specials = ["<|end|>", "<image>", "<|image_start|>", "<|image_end|>"];
    write_byte_tokenizer(&src, &specials, Some(TEMPLATE));
    berth_ok(h, None, &["import", src.to_str().unwrap()]);
    let qwen = real_model("qwen2.5-coder-0.5b");
    berth_ok(h, None, &["import", qwen.to_str().unwrap(), "--name", QWEN]);
    home
}

/// A valid body for each generating route, for a model.
fn base(path: &str, model: &str) -> Value {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    match path {
        "/v1/chat/completions" => json!({"model": model, "messages": msgs, "max_tokens": 4}),
        "/v1/completions" => json!({"model": model, "prompt": "hi", "max_tokens": 4}),
        "/v1/responses" => json!({"model": model, "input": "hi", "max_output_tokens": 4}),
        "/v1/messages" => json!({"model": model, "messages": msgs, "max_tokens": 4}),
        "/v1/messages/count_tokens" => json!({"model": model, "messages": msgs}),
        "/api/chat" => {
            json!({"model": model, "messages": msgs, "stream": false, "options": {"num_predict": 4}})
        }
        "/api/generate" => {
            json!({"model": model, "prompt": "hi", "stream": false, "options": {"num_predict": 4}})
        }
        "/api/show" => json!({"model": model}),
        other => panic!("no base body for {other}"),
    }
}

/// `v` with `key` set (a dotted key sets inside an object).
fn with(mut v: Value, key: &str, value: Value) -> Value {
    let mut at = &mut v;
    let parts: Vec<&str> = key.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        at = &mut at[*p];
    }
    at[parts[parts.len() - 1]] = value;
    v
}

/// `v` without `key`.
fn without(mut v: Value, key: &str) -> Value {
    v.as_object_mut().unwrap().remove(key);
    v
}

const GENERATING: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
];
const POST_ROUTES: [&str; 15] = [
    "/v1/embeddings",
    "/api/embed",
    "/api/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/chat",
    "/api/generate",
    "/api/show",
    "/api/pull",
    "/api/delete",
    "/api/copy",
    "/api/create",
];

/// The field holding a route's conversation or prompt.
fn input_key(path: &str) -> &'static str {
    match path {
        "/v1/completions" | "/api/generate" => "prompt",
        "/v1/responses" => "input",
        _ => "messages",
    }
}

/// The message list of a chat-shaped body with one message replaced.
fn chat_with(path: &str, model: &str, message: Value) -> Value {
    with(base(path, model), "messages", json!([message]))
}

/// The CRC-32 (IEEE) of PNG chunks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG whose header claims `width` x `height` (RGB), with no pixel data after it.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(width.to_be_bytes());
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(13u32.to_be_bytes());
    png.extend(&ihdr);
    png.extend(crc32(&ihdr).to_be_bytes());
    // One IDAT chunk with an empty zlib stream: the decoder reaches the pixel data.
    let mut idat = b"IDAT".to_vec();
    idat.extend([0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    png.extend(8u32.to_be_bytes());
    png.extend(&idat);
    png.extend(crc32(&idat).to_be_bytes());
    png.extend([0, 0, 0, 0]);
    png.extend(b"IEND");
    png.extend(crc32(b"IEND").to_be_bytes());
    png
}

/// Image payloads no decoder may accept, base64-encoded: (what, base64).
fn bad_images() -> Vec<(&'static str, String)> {
    use base64::Engine as _;
    let fixture = |n: &str| std::fs::read(repo_root().join("tests/fixtures/images").join(n)).unwrap();
    let png = fixture("fmt.png");
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut bmp = b"BM".to_vec();
    bmp.extend([0u8; 60]);
    vec![
        ("text bytes", b64(b"hello, not an image")),
        ("corrupt png", b64(&fixture("corrupt.png"))),
        ("truncated png", b64(&png[..png.len() / 2])),
        ("png claiming 100000x100000", b64(&png_header(100_000, 100_000))),
        ("png of 0x0", b64(&png_header(0, 0))),
        ("bmp header", b64(&bmp)),
        ("empty", String::new()),
    ]
}

/// Requests that are not valid HTTP/1.1: (what, the raw bytes).
fn malformed_http() -> Vec<(&'static str, Vec<u8>)> {
    let post = |headers: &str, body: &str| {
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n{body}")
            .into_bytes()
    };
    vec![
        ("not HTTP", b"HELLO THERE\r\n\r\n".to_vec()),
        ("binary junk", vec![0xff; 1024]),
        (
            "Content-Length not a number",
            post("Content-Length: abc\r\n", "{}"),
        ),
        ("negative Content-Length", post("Content-Length: -5\r\n", "{}")),
        (
            "two Content-Lengths",
            post("Content-Length: 2\r\nContent-Length: 7\r\n", "{}"),
        ),
        (
            "Content-Length and chunked",
            post(
                "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
                "2\r\n{}\r\n0\r\n\r\n",
            ),
        ),
        (
            "bad chunk size",
            post("Transfer-Encoding: chunked\r\n", "zz\r\n{}\r\n0\r\n\r\n"),
        ),
        (
            "unknown transfer coding",
            post("Transfer-Encoding: gzip\r\n", "{}"),
        ),
        ("header without colon", post("Content-Length 2\r\n", "{}")),
        (
            "1 MB header",
            post(
                &format!("X-Big: {}\r\nContent-Length: 2\r\n", "a".repeat(1 << 20)),
                "{}",
            ),
        ),
        (
            "100 KB URI",
            format!(
                "GET /v1/models/{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                "a".repeat(100_000)
            )
            .into_bytes(),
        ),
        ("HTTP/9.9", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n".to_vec()),
        (
            "control bytes in a header",
            post("X-Bad: a\x01\x7fb\r\nContent-Length: 2\r\n", "{}"),
        ),
    ]
}

/// Every case, generated.
fn cases() -> Vec<Case> {
    use Expect::*;
    let mut out = Vec::new();
    let bad = 400;

    // The body itself: not JSON, not an object, not UTF-8, too deep, too big, cut short, trickled.
    for path in POST_ROUTES {
        for (what, body) in [
            ("empty body", b"".to_vec()),
            ("not JSON", b"hello there".to_vec()),
            ("unclosed object", b"{\"model\": ".to_vec()),
            ("JSON array", b"[1, 2]".to_vec()),
            ("JSON null", b"null".to_vec()),
            ("JSON string", b"\"chat\"".to_vec()),
            (
                "invalid UTF-8",
                b"{\"model\": \"\xff\xfe\xc3\x28\", \"prompt\": \"\x80\"}".to_vec(),
            ),
            ("deeply nested arrays", b"[".repeat(100_000)),
            ("huge exponent", b"{\"model\": 1e400}".to_vec()),
            (
                "NaN",
                b"{\"model\": \"mal:latest\", \"temperature\": NaN}".to_vec(),
            ),
            (
                "-Infinity",
                b"{\"model\": \"mal:latest\", \"top_p\": -Infinity}".to_vec(),
            ),
            ("trailing garbage", b"{\"model\": \"mal:latest\"} {}".to_vec()),
        ] {
            out.push(Case::raw(format!("{path}: {what}"), path, body, Is(bad)));
        }
        let nested_objects = format!("{}1{}", "{\"a\":".repeat(50_000), "}".repeat(50_000));
        out.push(Case::raw(
            format!("{path}: deeply nested objects"),
            path,
            nested_objects,
            Is(bad),
        ));
        if matches!(path, "/v1/chat/completions" | "/v1/messages" | "/api/generate") {
            let body = format!(
                "{{\"model\": \"{SCRIPTED}\", \"prompt\": \"{}\"}}",
                "a".repeat(OVERSIZE)
            );
            out.push(Case::raw(format!("{path}: 40 MB body"), path, body, Is(413)));
        }
        let mut cut = Case::raw(
            format!("{path}: truncated upload"),
            path,
            format!("{{\"model\": \"{SCRIPTED}\""),
            Is(bad),
        );
        cut.transport = Transport::Truncated(500);
        if matches!(
            path,
            "/v1/completions" | "/v1/messages/count_tokens" | "/api/chat"
        ) {
            // Past the limit without a Content-Length: refused while streaming in.
            let body = format!(
                "{{\"model\": \"{SCRIPTED}\", \"prompt\": \"{}\"}}",
                "a".repeat(OVERSIZE)
            );
            let mut c = Case::raw(format!("{path}: 40 MB chunked body"), path, body, Is(413));
            c.transport = Transport::Chunked(1 << 20);
            out.push(c);
        }
        out.push(cut);
        let mut form = Case::raw(
            format!("{path}: form-encoded body"),
            path,
            "model=mal&prompt=hi",
            Is(bad),
        );
        form.content_type = "application/x-www-form-urlencoded";
        out.push(form);
    }
    // The embedding routes' own fields (the scripted model is no embedding model: a body that
    // gets as far as the model is a 400 saying so; none may be a 5xx).
    for (what, path, body) in [
        ("input missing", "/v1/embeddings", json!({"model": SCRIPTED})),
        (
            "input an object",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": {"a": 1}}),
        ),
        (
            "input empty list",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": []}),
        ),
        (
            "input mixed list",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": ["a", 1]}),
        ),
        (
            "negative token",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": [[1, -1]]}),
        ),
        (
            "huge token",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": [1e300]}),
        ),
        (
            "nested too deep",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": [[[1]]]}),
        ),
        (
            "dimensions zero",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": "a", "dimensions": 0}),
        ),
        (
            "dimensions string",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": "a", "dimensions": "8"}),
        ),
        (
            "bad encoding",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": "a", "encoding_format": "int4"}),
        ),
        (
            "unknown key",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": "a", "colour": 1}),
        ),
        (
            "chat model",
            "/v1/embeddings",
            json!({"model": SCRIPTED, "input": "a"}),
        ),
        (
            "input a number",
            "/api/embed",
            json!({"model": SCRIPTED, "input": 5}),
        ),
        (
            "token ids",
            "/api/embed",
            json!({"model": SCRIPTED, "input": [1, 2]}),
        ),
        (
            "truncate string",
            "/api/embed",
            json!({"model": SCRIPTED, "input": "a", "truncate": "no"}),
        ),
        (
            "dimensions negative",
            "/api/embed",
            json!({"model": SCRIPTED, "input": "a", "dimensions": -3}),
        ),
        (
            "chat model",
            "/api/embed",
            json!({"model": SCRIPTED, "input": "a"}),
        ),
        (
            "prompt a list",
            "/api/embeddings",
            json!({"model": SCRIPTED, "prompt": ["a"]}),
        ),
        ("no model", "/api/embeddings", json!({"prompt": "a"})),
        (
            "chat model",
            "/api/embeddings",
            json!({"model": SCRIPTED, "prompt": "a"}),
        ),
    ] {
        out.push(Case::json(format!("{path}: {what}"), path, &body, Is(bad)));
    }
    // Deep nesting inside an otherwise valid request.
    for path in GENERATING {
        let deep = format!(
            "{{\"model\": \"{SCRIPTED}\", \"{}\": {}{}}}",
            input_key(path),
            "[".repeat(20_000),
            "]".repeat(20_000)
        );
        out.push(Case::raw(format!("{path}: nested input"), path, deep, Is(bad)));
    }
    // Trickled bytes still get their (error) answer.
    for path in ["/v1/chat/completions", "/api/generate"] {
        let body = with(base(path, SCRIPTED), "temperature", json!(-1));
        let body = if path == "/api/generate" {
            with(base(path, SCRIPTED), "options.temperature", json!("hot"))
        } else {
            body
        };
        let mut c = Case::json(format!("{path}: slow upload"), path, &body, Is(bad));
        c.transport = Transport::Slow(5, Duration::from_millis(250));
        out.push(c);
    }

    // Missing, null and wrongly typed required fields; unknown and path-traversal models.
    for path in GENERATING.iter().chain(&["/v1/messages/count_tokens"]) {
        let b = base(path, SCRIPTED);
        let input = input_key(path);
        out.push(Case::json(
            format!("{path}: no model"),
            path,
            &without(b.clone(), "model"),
            Is(bad),
        ));
        // Ollama loads the model for a request without messages or prompt (a 200, as Ollama does).
        if !path.starts_with("/api/") {
            out.push(Case::json(
                format!("{path}: no {input}"),
                path,
                &without(b.clone(), input),
                Is(bad),
            ));
        }
        out.push(Case::json(
            format!("{path}: null model"),
            path,
            &with(b.clone(), "model", Value::Null),
            Is(bad),
        ));
        out.push(Case::json(
            format!("{path}: empty object"),
            path,
            &json!({}),
            Is(bad),
        ));
        for (what, v) in [
            ("number", json!(42)),
            ("array", json!(["mal"])),
            ("object", json!({"name": "mal"})),
            ("bool", json!(true)),
        ] {
            out.push(Case::json(
                format!("{path}: model is a {what}"),
                path,
                &with(b.clone(), "model", v),
                Is(bad),
            ));
        }
        for (what, v) in [
            ("number", json!(7)),
            ("object", json!({"x": 1})),
            ("bool", json!(false)),
        ] {
            out.push(Case::json(
                format!("{path}: {input} is a {what}"),
                path,
                &with(b.clone(), input, v),
                Is(bad),
            ));
        }
        for name in [
            "../../etc/passwd",
            "..%2f..%2fetc%2fpasswd",
            "/etc/passwd",
            "nope-not-a-model:1b",
            "",
        ] {
            let expect = if name.is_empty() { Any4xx } else { Is(404) };
            out.push(Case::json(
                format!("{path}: model {name:?}"),
                path,
                &with(b.clone(), "model", json!(name)),
                expect,
            ));
        }
    }
    // OpenAI's sampling fields out of range or of the wrong type, on both models.
    for model in [SCRIPTED, QWEN] {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let b = base(path, model);
            for (key, v) in [
                ("max_tokens", json!(1e30)),
                ("max_tokens", json!(-1)),
                ("max_tokens", json!(0)),
                ("max_tokens", json!("10")),
                ("max_tokens", json!(2.5)),
                ("temperature", json!(-1)),
                ("temperature", json!(100)),
                ("temperature", json!("hot")),
                ("top_p", json!(2)),
                ("top_p", json!(-0.1)),
                ("n", json!(0)),
                ("n", json!(1_000_000_000)),
                ("seed", json!("lucky")),
                ("presence_penalty", json!(9)),
                ("frequency_penalty", json!(-9)),
                ("stream", json!("yes")),
                ("stop", json!(vec!["x"; 100])),
                ("stop", json!(5)),
                ("stop", json!([1, 2])),
                ("logit_bias", json!({"abc": 1})),
                ("logit_bias", json!({"99999999999": 1})),
                ("logit_bias", json!({"1": 500})),
                ("logit_bias", json!({"1": "x"})),
                ("logit_bias", json!("x")),
                ("logprobs", json!("x")),
                ("unknown_field", json!(1)),
            ] {
                if model == QWEN && !matches!(key, "logit_bias" | "stop" | "max_tokens" | "n") {
                    continue;
                }
                out.push(Case::json(
                    format!("{path} [{model}]: {key} = {v}"),
                    path,
                    &with(b.clone(), key, v),
                    Is(bad),
                ));
            }
        }
        // Messages: unknown roles, content parts of unknown types, bad images.
        let path = "/v1/chat/completions";
        let mut messages = vec![
            json!({"role": "wizard", "content": "hi"}),
            json!({"content": "hi"}),
            json!({"role": 5, "content": "hi"}),
            json!({"role": "user", "content": 5}),
            json!({"role": "user", "content": {"text": "hi"}}),
            json!({"role": "user", "content": [{"type": "hologram", "hologram": "x"}]}),
            json!({"role": "user", "content": [{"type": "text"}]}),
            json!({"role": "user", "content": [{"type": "text", "text": 5}]}),
            json!({"role": "user", "content": [5]}),
            json!("just a string"),
            json!({"role": "tool", "content": "42"}),
            json!({"role": "assistant", "content": null, "tool_calls": "x"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": 5}}]}),
        ];
        for url in [
            "data:image/png;base64,!!!not base64!!!",
            "data:image/png;base64",
            "data:image/png,rawbytes",
            "data:;base64,====",
            "file:///etc/passwd",
            "ftp://example.invalid/cat.png",
            "http://127.0.0.1:1/cat.png",
            "../../etc/passwd",
            "",
        ] {
            messages.push(
                json!({"role": "user", "content": [{"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": url}}]}),
            );
        }
        messages.push(json!({"role": "user", "content": [{"type": "image_url", "image_url": 5}]}));
        messages.push(json!({"role": "user", "content": [{"type": "image_url"}]}));
        for m in messages {
            if model == QWEN && m.get("role").and_then(Value::as_str) != Some("user") {
                continue;
            }
            out.push(Case::json(
                format!("{path} [{model}]: message {m}"),
                path,
                &chat_with(path, model, m),
                Is(bad),
            ));
        }
        out.push(Case::json(
            format!("{path} [{model}]: no messages"),
            path,
            &with(base(path, model), "messages", json!([])),
            Is(bad),
        ));
        // Tools and structured output.
        let tool = json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let b = base(path, model);
        for (what, key, v) in [
            ("tools is a string", "tools", json!("x")),
            ("tools has a number", "tools", json!([5])),
            ("tool without function", "tools", json!([{"type": "function"}])),
            (
                "tool of unknown type",
                "tools",
                json!([{"type": "teleport", "function": {"name": "f"}}]),
            ),
            (
                "tool without name",
                "tools",
                json!([{"type": "function", "function": {"parameters": {}}}]),
            ),
            (
                "tool parameters a string",
                "tools",
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
            ),
            (
                "tool schema of bogus type",
                "tools",
                json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]),
            ),
            (
                "tool schema with a bad $ref",
                "tools",
                json!([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nowhere"}}}]),
            ),
            ("response_format a string", "response_format", json!("json")),
            (
                "response_format of unknown type",
                "response_format",
                json!({"type": "yaml"}),
            ),
            (
                "json_schema without schema",
                "response_format",
                json!({"type": "json_schema"}),
            ),
            (
                "json_schema with a bad type",
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}),
            ),
            (
                "json_schema with a bad $ref",
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/defs/none"}}}),
            ),
            (
                "json_schema with bad pattern",
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(["}}}),
            ),
            (
                "tool_choice required without tools",
                "tool_choice",
                json!("required"),
            ),
            ("tool_choice unknown word", "tool_choice", json!("sometimes")),
        ] {
            // A model without a tool-call format never compiles tool schemas (the tools are only
            // rendered into its prompt), so only the real model's grammar can refuse them.
            if model == SCRIPTED && what.starts_with("tool schema") {
                continue;
            }
            out.push(Case::json(
                format!("{path} [{model}]: {what}"),
                path,
                &with(b.clone(), key, v),
                Is(bad),
            ));
        }
        for (what, choice) in [
            (
                "tool_choice names an unknown tool",
                json!({"type": "function", "function": {"name": "launch_rockets"}}),
            ),
            (
                "tool_choice without a name",
                json!({"type": "function", "function": {}}),
            ),
            ("tool_choice a number", json!(3)),
        ] {
            let body = with(with(b.clone(), "tools", json!([tool])), "tool_choice", choice);
            out.push(Case::json(
                format!("{path} [{model}]: {what}"),
                path,
                &body,
                Is(bad),
            ));
        }
    }
    // Images a vision model must refuse: undecodable payloads on every route that takes images,
    // and URLs that are neither data: nor http(s) (never a file read).
    for (what, b64) in bad_images() {
        let data_url = format!("data:image/png;base64,{b64}");
        let path = "/v1/chat/completions";
        let m = json!({"role": "user", "content": [{"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": data_url}}]});
        out.push(Case::json(
            format!("{path} [{EYES}]: image {what}"),
            path,
            &chat_with(path, EYES, m),
            Is(bad),
        ));
        let path = "/v1/messages";
        let m = json!({"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": b64}}]});
        out.push(Case::json(
            format!("{path} [{EYES}]: image {what}"),
            path,
            &chat_with(path, EYES, m),
            Is(bad),
        ));
        let path = "/v1/responses";
        let input = json!([{"role": "user", "content": [{"type": "input_image", "image_url": data_url}]}]);
        out.push(Case::json(
            format!("{path} [{EYES}]: image {what}"),
            path,
            &with(base(path, EYES), "input", input),
            Is(bad),
        ));
        let path = "/api/generate";
        out.push(Case::json(
            format!("{path} [{EYES}]: image {what}"),
            path,
            &with(base(path, EYES), "images", json!([b64])),
            Is(bad),
        ));
        let path = "/api/chat";
        let m = json!({"role": "user", "content": "see", "images": [b64]});
        out.push(Case::json(
            format!("{path} [{EYES}]: image {what}"),
            path,
            &chat_with(path, EYES, m),
            Is(bad),
        ));
    }
    for url in [
        "file:///etc/passwd",
        "file://localhost/etc/passwd",
        "/etc/passwd",
        "../../etc/passwd",
        "ftp://example.invalid/cat.png",
        "gopher://127.0.0.1:1/x",
        "http://127.0.0.1:1/cat.png",
        "data:image/png;base64,!!!",
        "data:image/png,raw",
        "data:text/plain;base64",
        "",
    ] {
        let path = "/v1/chat/completions";
        let m = json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]});
        out.push(Case::json(
            format!("{path} [{EYES}]: image url {url:?}"),
            path,
            &chat_with(path, EYES, m),
            Is(bad),
        ));
        let path = "/v1/responses";
        let input = json!([{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]);
        out.push(Case::json(
            format!("{path} [{EYES}]: image url {url:?}"),
            path,
            &with(base(path, EYES), "input", input),
            Is(bad),
        ));
        let path = "/v1/messages";
        let m =
            json!({"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]});
        out.push(Case::json(
            format!("{path} [{EYES}]: image url {url:?}"),
            path,
            &chat_with(path, EYES, m),
            Is(bad),
        ));
    }
    // Responses API.
    let path = "/v1/responses";
    let b = base(path, SCRIPTED);
    for (key, v) in [
        ("input", json!([{"role": "wizard", "content": "hi"}])),
        ("input", json!([{"type": "hologram"}])),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_hologram"}]}]),
        ),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]),
        ),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,%%%"}]}]),
        ),
        ("instructions", json!(5)),
        ("max_output_tokens", json!(-1)),
        ("max_output_tokens", json!(1e30)),
        ("temperature", json!(-1)),
        ("top_p", json!(2)),
        ("tools", json!([{"type": "function"}])),
        (
            "tools",
            json!([{"type": "function", "name": "f", "parameters": "x"}]),
        ),
        ("tool_choice", json!({"type": "function", "name": "nope"})),
        (
            "text",
            json!({"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}),
        ),
        ("text", json!("x")),
        ("previous_response_id", json!("resp_does_not_exist")),
        ("previous_response_id", json!(5)),
        ("stream", json!("yes")),
        ("top_k", json!("x")),
        ("min_p", json!(2)),
        ("seed", json!(1.5)),
        ("unknown_field", json!(1)),
    ] {
        let expect = if key == "previous_response_id" && v.is_string() {
            Any4xx
        } else {
            Is(bad)
        };
        out.push(Case::json(
            format!("{path}: {key} = {v}"),
            path,
            &with(b.clone(), key, v),
            expect,
        ));
    }
    // Anthropic's Messages API, on both models.
    for model in [SCRIPTED, QWEN] {
        let path = "/v1/messages";
        let b = base(path, model);
        out.push(Case::json(
            format!("{path} [{model}]: no max_tokens"),
            path,
            &without(b.clone(), "max_tokens"),
            Is(bad),
        ));
        for (key, v) in [
            ("max_tokens", json!(0)),
            ("max_tokens", json!(-1)),
            ("max_tokens", json!(1e30)),
            ("max_tokens", json!("4")),
            ("temperature", json!(-1)),
            ("temperature", json!(100)),
            ("top_p", json!(2)),
            ("top_k", json!("x")),
            ("system", json!(5)),
            ("system", json!([{"type": "hologram"}])),
            ("stop_sequences", json!("x")),
            ("stop_sequences", json!([1])),
            ("messages", json!([{"role": "system", "content": "hi"}])),
            ("messages", json!([{"role": "wizard", "content": "hi"}])),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "hologram"}]}]),
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "!!!"}}]}]),
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]}]),
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "tool_result"}]}]),
            ),
            ("tools", json!([{"name": "f"}])),
            ("tools", json!([{"name": "f", "input_schema": {"type": 5}}])),
            ("tool_choice", json!({"type": "tool", "name": "nope"})),
            ("tool_choice", json!({"type": "sometimes"})),
            ("thinking", json!({"type": "enabled", "budget_tokens": -5})),
            ("metadata", json!("x")),
            ("stream", json!("yes")),
        ] {
            if model == QWEN && !matches!(key, "tools" | "tool_choice" | "messages" | "max_tokens") {
                continue;
            }
            // As above: only a model with a tool-call format compiles the schema.
            if model == SCRIPTED && v.to_string().contains("input_schema") {
                continue;
            }
            out.push(Case::json(
                format!("{path} [{model}]: {key} = {v}"),
                path,
                &with(b.clone(), key, v),
                Is(bad),
            ));
        }
    }
    let path = "/v1/messages/count_tokens";
    for (key, v) in [
        ("messages", json!([{"role": "wizard", "content": "hi"}])),
        ("messages", json!([])),
        ("tools", json!("x")),
        ("system", json!(5)),
    ] {
        out.push(Case::json(
            format!("{path}: {key} = {v}"),
            path,
            &with(base(path, SCRIPTED), key, v),
            Is(bad),
        ));
    }
    // Ollama's chat and generate, on both models.
    for model in [SCRIPTED, QWEN] {
        for path in ["/api/chat", "/api/generate"] {
            let b = base(path, model);
            for (key, v) in [
                ("options", json!("fast")),
                ("options.num_predict", json!("4")),
                ("options.num_ctx", json!(-5)),
                ("options.num_predict", json!(1e30)),
                ("options.num_ctx", json!(1e15)),
                ("options.temperature", json!("hot")),
                ("options.temperature", json!(-1)),
                ("options.top_p", json!(2)),
                ("options.stop", json!(5)),
                ("options.seed", json!("x")),
                ("format", json!({"type": 5})),
                ("format", json!("xml")),
                ("format", json!(5)),
                ("keep_alive", json!("forever-ish")),
                ("keep_alive", json!([1])),
                ("stream", json!("no")),
                ("think", json!("maybe")),
                ("images", json!("x")),
                ("images", json!(["!!!not base64!!!"])),
                ("images", json!([5])),
            ] {
                if model == QWEN && !matches!(key, "format" | "images" | "options.num_ctx") {
                    continue;
                }
                // /api/chat has images per message only; Ollama ignores a top-level `images` there.
                if key == "images" && path == "/api/chat" {
                    continue;
                }
                out.push(Case::json(
                    format!("{path} [{model}]: {key} = {v}"),
                    path,
                    &with(b.clone(), key, v),
                    Is(bad),
                ));
            }
        }
        let path = "/api/chat";
        for m in [
            json!({"role": "wizard", "content": "hi"}),
            json!({"content": "hi"}),
            json!({"role": "user", "content": 5}),
            json!({"role": "user", "content": "hi", "images": ["%%%"]}),
            json!({"role": "user", "content": "hi", "images": "x"}),
            json!({"role": "assistant", "content": "", "tool_calls": "x"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": 5}}]}),
            json!(7),
        ] {
            if model == QWEN && m.get("images").is_none() {
                continue;
            }
            out.push(Case::json(
                format!("{path} [{model}]: message {m}"),
                path,
                &chat_with(path, model, m),
                Is(bad),
            ));
        }
        for tools in [
            json!("x"),
            json!([5]),
            json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        ] {
            out.push(Case::json(
                format!("{path} [{model}]: tools {tools}"),
                path,
                &with(base(path, model), "tools", tools),
                Is(bad),
            ));
        }
    }
    // Ollama's model management: never a real pull, a real delete, or a file touched.
    for (what, path, body, expect) in [
        ("show without a model", "/api/show", json!({}), Is(bad)),
        ("show a number", "/api/show", json!({"model": 5}), Is(bad)),
        (
            "show a traversal",
            "/api/show",
            json!({"model": "../../etc/passwd"}),
            Is(404),
        ),
        (
            "show an absolute path",
            "/api/show",
            json!({"model": "/etc/passwd"}),
            Is(404),
        ),
        (
            "show verbose as a string",
            "/api/show",
            json!({"model": SCRIPTED, "verbose": "yes"}),
            Is(bad),
        ),
        ("pull without a name", "/api/pull", json!({}), Is(bad)),
        ("pull a number", "/api/pull", json!({"model": 5}), Is(bad)),
        (
            "pull a bogus name",
            "/api/pull",
            json!({"model": "no-such-pack-anywhere:9b", "stream": false}),
            Is(404),
        ),
        (
            "pull a traversal",
            "/api/pull",
            json!({"model": "../../etc/passwd", "stream": false}),
            Is(404),
        ),
        (
            "pull stream as a string",
            "/api/pull",
            json!({"model": "no-such-pack:1b", "stream": "x"}),
            Is(bad),
        ),
        ("delete without a name", "/api/delete", json!({}), Is(bad)),
        ("delete a number", "/api/delete", json!({"model": 5}), Is(bad)),
        (
            "delete a bogus name",
            "/api/delete",
            json!({"model": "no-such-model:1b"}),
            Is(404),
        ),
        (
            "delete a traversal",
            "/api/delete",
            json!({"model": "../../etc/passwd"}),
            Is(404),
        ),
        (
            "delete an absolute path",
            "/api/delete",
            json!({"model": "/etc/passwd"}),
            Is(404),
        ),
        (
            "create without a name",
            "/api/create",
            json!({"from": SCRIPTED}),
            Is(bad),
        ),
        (
            "create without a base",
            "/api/create",
            json!({"model": "new"}),
            Is(bad),
        ),
        (
            "create from a server file",
            "/api/create",
            json!({"model": "new", "from": "/etc/passwd", "stream": false}),
            Is(bad),
        ),
        (
            "create from a traversal",
            "/api/create",
            json!({"model": "new", "from": "../../etc/passwd"}),
            Is(bad),
        ),
        (
            "create a traversal",
            "/api/create",
            json!({"model": "../../x", "from": SCRIPTED}),
            Is(bad),
        ),
        (
            "create with a Go template",
            "/api/create",
            json!({"model": "new", "from": SCRIPTED, "template": "{{ .Prompt }}"}),
            Is(bad),
        ),
        (
            "create with mirostat",
            "/api/create",
            json!({"model": "new", "from": SCRIPTED, "parameters": {"mirostat": 2}}),
            Is(bad),
        ),
        (
            "create with a stop number",
            "/api/create",
            json!({"model": "new", "from": SCRIPTED, "parameters": {"stop": [1]}}),
            Is(bad),
        ),
        (
            "create with files",
            "/api/create",
            json!({"model": "new", "files": {"m.gguf": "sha256:00"}}),
            Is(bad),
        ),
        (
            "create with a broken Modelfile",
            "/api/create",
            json!({"model": "new", "modelfile": "FROM x\nSYSTEM \"\"\"open"}),
            Is(bad),
        ),
        (
            "create with a tool message",
            "/api/create",
            json!({"model": "new", "from": SCRIPTED, "messages": [{"role": "tool", "content": "x"}]}),
            Is(bad),
        ),
        ("copy without fields", "/api/copy", json!({}), Is(bad)),
        (
            "copy without destination",
            "/api/copy",
            json!({"source": SCRIPTED}),
            Is(bad),
        ),
        (
            "copy numbers",
            "/api/copy",
            json!({"source": 1, "destination": 2}),
            Is(bad),
        ),
        (
            "copy a bogus source",
            "/api/copy",
            json!({"source": "no-such:1b", "destination": "x:1b"}),
            Is(404),
        ),
        (
            "copy a traversal source",
            "/api/copy",
            json!({"source": "../../etc/passwd", "destination": "x:1b"}),
            Is(404),
        ),
        (
            "copy to a traversal",
            "/api/copy",
            json!({"source": SCRIPTED, "destination": "../../../tmp/evil"}),
            Is(bad),
        ),
        (
            "copy to an absolute path",
            "/api/copy",
            json!({"source": SCRIPTED, "destination": "/tmp/evil:1b"}),
            Is(bad),
        ),
    ] {
        out.push(Case::json(what, path, &body, expect));
    }
    // Odd model ids and response ids in URLs, unknown routes, wrong methods.
    for id in [
        "nope",
        "..%2f..%2fetc%2fpasswd",
        "../../etc/passwd",
        "%2fetc%2fpasswd",
        "a%00b",
        "mal:latest:extra",
        "%ff%fe",
        &"x".repeat(5000),
    ] {
        out.push(Case::get(
            format!("GET /v1/models/{id:.40}"),
            &format!("/v1/models/{id}"),
            Is(404),
        ));
    }
    out.push(Case::get(
        "GET unknown response",
        "/v1/responses/resp_nope",
        Is(404),
    ));
    out.push(Case {
        method: "DELETE",
        ..Case::get("DELETE unknown response", "/v1/responses/resp_nope", Is(404))
    });
    out.push(Case::get("GET unknown route", "/v1/nope", Is(404)));
    out.push(Case::get("GET unknown Ollama route", "/api/nope", Is(404)));
    out.push(Case::raw(
        "POST unknown Anthropic route",
        "/v1/messages/nope",
        "{}",
        Is(404),
    ));
    out.push(Case::get("GET /api/pull", "/api/pull", Is(405)));
    out.push(Case::raw("POST /api/tags", "/api/tags", "{}", Is(405)));
    out.push(Case::get("GET a POST route", "/v1/chat/completions", Is(405)));
    out.push(Case::get("GET /api/chat", "/api/chat", Is(405)));
    out.push(Case::get("GET /v1/messages", "/v1/messages", Is(405)));
    out
}

/// The corpus has its full count (cheap: nothing is sent), so a shrunk generator is caught
/// even where the server suite is not run.
#[test]
fn the_corpus_has_its_full_count() {
    assert_eq!(cases().len(), API_CASES, "API cases");
    assert_eq!(malformed_http().len(), PROTOCOL_CASES, "malformed-HTTP cases");
}

#[test]
fn malformed_requests_get_4xx_in_their_apis_shape_and_the_server_stays_up() {
    let home = home();
    let (child, _, port) = spawn_serve(
        Command::new(berth_exe())
            .args([
                "serve",
                "--port",
                "0",
                "--parallel",
                "4",
                "--max-loaded-models",
                "2",
            ])
            .env("BERTH_HOME", home.path())
            .env("BERTH_PLUGIN_PATH", home_plugins(home.path()))
            .env_remove("BERTH_CATALOG")
            .env("BERTH_LOG", "warn"),
    );
    let mut server = Server { child, port };
    let started = Instant::now();
    let all = cases();
    let (mut fives, mut deaths, mut failures) = (0, 0, Vec::new());
    let mut statuses = std::collections::BTreeMap::new();
    // BERTH_MALFORMED_VERBOSE=1 prints every case's status and answer.
    let verbose = std::env::var_os("BERTH_MALFORMED_VERBOSE").is_some();
    let mut ran = 0;
    for case in &all {
        ran += 1;
        let t0 = Instant::now();
        let (status, body) = exchange(
            port,
            case.method,
            &case.path,
            case.content_type,
            &case.body,
            &case.transport,
        );
        let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        if status >= 500 {
            fives += 1;
        }
        let status_ok = match case.expect {
            Expect::Is(s) => status == s,
            Expect::Any4xx => (400..500).contains(&status),
        };
        let problem = if !status_ok {
            Some(format!("status {status}, wanted {:?}", case.expect))
        } else {
            shape_problem(shape_of(&case.path), &body)
        };
        *statuses.entry(status).or_insert(0) += 1;
        if verbose {
            eprintln!("{status} {}: {shown}", case.name);
        }
        if let Some(p) = problem {
            failures.push(format!("{}: {p}: {shown}", case.name));
        }
        if !server.healthy() {
            deaths += 1;
            failures.push(format!(
                "{}: the server died or stopped answering /health",
                case.name
            ));
            break;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            eprintln!("slow case ({:?}): {}", t0.elapsed(), case.name);
        }
    }
    // Malformed HTTP itself: answered (or closed) by the HTTP layer before any route runs, so no
    // API shape is asked for; never a 5xx, and the server keeps serving.
    let mut protocol = 0;
    if deaths == 0 {
        for (what, raw) in malformed_http() {
            protocol += 1;
            let (status, body) = exchange(port, "", "", "", &raw, &Transport::Raw);
            if verbose {
                eprintln!("{status} protocol {what}: {}", String::from_utf8_lossy(&body));
            }
            *statuses.entry(status).or_insert(0) += 1;
            if status >= 500 {
                fives += 1;
            }
            if status != 0 && !(400..500).contains(&status) {
                failures.push(format!("protocol {what}: status {status}"));
            }
            if !server.healthy() {
                deaths += 1;
                failures.push(format!(
                    "protocol {what}: the server died or stopped answering /health"
                ));
                break;
            }
        }
    }
    let elapsed = started.elapsed();

    // A good request to every API still works (the store is untouched: both models are there).
    if deaths == 0 {
        for (path, model) in [
            ("/v1/chat/completions", SCRIPTED),
            ("/v1/completions", SCRIPTED),
            ("/v1/responses", SCRIPTED),
            ("/v1/messages", SCRIPTED),
            ("/v1/messages/count_tokens", SCRIPTED),
            ("/api/chat", SCRIPTED),
            ("/api/generate", SCRIPTED),
            ("/api/show", SCRIPTED),
            ("/v1/chat/completions", QWEN),
            ("/api/chat", QWEN),
        ] {
            let (status, v) = server.request("POST", path, &base(path, model));
            if status != 200 {
                failures.push(format!("good request to {path} [{model}]: status {status}: {v}"));
            }
        }
        let (status, v) = server.request("GET", "/v1/models", &Value::Null);
        let ids: Vec<&str> = v["data"]
            .as_array()
            .map_or(vec![], |d| d.iter().filter_map(|m| m["id"].as_str()).collect());
        if status != 200 || !ids.contains(&SCRIPTED) || !ids.contains(&QWEN) {
            failures.push(format!("models after the suite: {status} {v}"));
        }
    }
    assert!(!Path::new("/tmp/evil").exists() && !Path::new("/tmp/evil:1b").exists());
    println!(
        "malformed suite: {} cases, {fives} 5xx, {deaths} server deaths ({} API cases, {protocol} malformed-HTTP cases; {:.1} s)",
        all.len() + protocol,
        all.len(),
        elapsed.as_secs_f64()
    );
    println!("statuses: {statuses:?}");
    assert_eq!(
        (ran, protocol),
        (API_CASES, PROTOCOL_CASES),
        "cases run (API, malformed HTTP) differ from the corpus' full count"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!((fives, deaths), (0, 0));
}
