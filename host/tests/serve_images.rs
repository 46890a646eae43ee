//! Images through `berth serve`, with the scripted plugin declaring an `lfm2_vl` vision spec:
//! OpenAI `image_url` parts (data URLs and an http URL served here on the loopback interface)
//! and Ollama `images` reach the plugin's `encode_images` with the pixels the plugin's
//! `prepare_image` computed (`lfm2_vl` beside the tower in `berth-plugin-common`) and the
//! positions of their placeholder tokens; broken, unsupported, unreachable and
//! oversized images are 400s naming what was wrong, and a text-only model refuses images.

mod common;

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

const IMAGE_TOKEN: u32 = 257;
const PATCH: usize = 16;
const TEMPLATE: &str =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

fn params() -> Value {
    json!({"do_image_splitting": false, "min_image_tokens": 4, "max_image_tokens": 64})
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(repo_root().join("tests/fixtures/images").join(name)).unwrap()
}

/// `<|end|>` (256) and the image tokens (257..=259).
const SPECIALS: [&str; 4] = ["<|end|>", "<image>", "<|image_start|>", "<|image_end|>"];

/// Imports a scripted pack; with `log`, it declares the vision spec and logs its images there.
fn import_model(home: &Path, name: &str, log: Option<&Path>) {
    let src = home.join(format!("src-{name}"));
    let mut script = json!({"stop_tokens": [256], "vocab_size": 260, "context_length": 4096,
        "entries": [{"reply": "done".bytes().map(i32::from).collect::<Vec<_>>()}]});
    if let Some(log) = log {
        script["image_log"] = json!(log);
        script["vision"] = json!({"scheme": "lfm2_vl", "layout": "patches", "patch_size": PATCH,
            "image_token_id": IMAGE_TOKEN, "params": params()});
    }
    write_scripted_pack(&src, name, "latest", &script);
    write_byte_tokenizer(&src, &SPECIALS, Some(TEMPLATE));
    berth_ok(home, None, &["import", src.to_str().unwrap()]);
}

/// What the plugin must receive for an image: (shape, pixel checksum, patch mask, grid, tokens).
fn expected(bytes: &[u8]) -> (Vec<u32>, String, Vec<u8>, (u32, u32), usize) {
    use berth_plugin_common::vision::preprocess::lfm2_vl as lfm2vl;
    let p: lfm2vl::Lfm2VlParams = lfm2vl::Lfm2VlParams {
        do_image_splitting: false,
        min_image_tokens: 4,
        max_image_tokens: 64,
        ..Default::default()
    };
    let img = berth::image::decode(bytes, Default::default()).unwrap();
    let pre = lfm2vl::preprocess(&img, &p, &Default::default());
    assert_eq!(pre.slices.len(), 1);
    let t = berth_kernels::image::patch_rows(&pre.slices[0], PATCH, p.max_num_patches());
    let rows = t.patches.len() / (3 * PATCH * PATCH);
    let mask = (0..rows).map(|r| u8::from(r < t.valid_patches)).collect();
    let grid = (t.spatial_shape.0 as u32, t.spatial_shape.1 as u32);
    (
        vec![rows as u32, (3 * PATCH * PATCH) as u32],
        berth_scripted::pixel_checksum(&t.patches),
        mask,
        grid,
        pre.image_tokens,
    )
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
        Server::start_with(home, &[])
    }

    fn start_with(home: &Path, extra: &[&str]) -> Server {
        let (child, _, port) = spawn_serve(
            Command::new(berth_exe())
                .args(["serve", "--port", "0"])
                .args(extra)
                .env("BERTH_HOME", home)
                .env_remove("BERTH_PLUGIN_PATH"),
        );
        Server { child, port }
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp[9..12].parse().unwrap();
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request("POST", path, Some(body))
    }
}

/// Serves `files` over HTTP/1.0 on 127.0.0.1 (404 for any other path); returns the base URL.
fn serve_files(files: Vec<(&'static str, Vec<u8>)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let found = files.iter().find(|(p, _)| *p == path);
            let (status, body) = match found {
                Some((_, b)) => ("200 OK", b.clone()),
                None => ("404 Not Found", b"not found".to_vec()),
            };
            let _ = write!(
                conn,
                "HTTP/1.0 {status}\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(&body);
        }
    });
    base
}

/// The image calls logged since `from`.
fn calls(log: &Path, from: usize) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .skip(from)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn data_url(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", b64(bytes))
}

/// A PNG claiming 20000 x 20000 pixels (valid chunks and CRCs, but no pixel data).
fn oversized_png() -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xedb8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        png.extend_from_slice(&body);
        png.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut ihdr = 20000u32.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&20000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &[]);
    chunk(b"IEND", &[]);
    png
}

/// Checks a logged call against the expected image and the placeholder starting at `first`.
fn check_call(call: &Value, bytes: &[u8], first: usize) {
    let (shape, sum, mask, grid, n) = expected(bytes);
    assert_eq!(call["shape"], json!(shape), "{call}");
    assert_eq!(call["pixels"], json!(sum), "{call}");
    assert_eq!(call["patch_mask"], json!(mask));
    assert_eq!(call["grid"], json!([grid.0, grid.1]));
    let positions: Vec<usize> = (first..first + n).collect();
    assert_eq!(call["positions"], json!(positions));
}

fn home() -> tempfile::TempDir {
    let tmp = tempfile::Builder::new()
        .prefix("berth-images-")
        .tempdir()
        .unwrap();
    berth_ok(
        tmp.path(),
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    tmp
}

#[test]
fn images_reach_the_plugin_through_both_apis_and_bad_ones_are_400s() {
    let home = home();
    let log: PathBuf = home.path().join("images.jsonl");
    import_model(home.path(), "eyes", Some(&log));
    import_model(home.path(), "blind", None);
    let odd = fixture("odd.png");
    let tiny = fixture("tiny.png");
    let base = serve_files(vec![("/cat.png", odd.clone())]);
    // The image server is on loopback: this server is told that its image URLs may go there.
    let server = Server::start_with(home.path(), &["--allow-private-image-urls"]);

    // OpenAI, a data URL between two text parts.
    let req = json!({"model": "eyes", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user",
        "content": [{"type": "text", "text": "look "},
            {"type": "image_url", "image_url": {"url": data_url(&odd)}},
            {"type": "text", "text": " ok?"}]}]});
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "done");
    let prefix = "<user>look ".len();
    let got = calls(&log, 0);
    assert_eq!(got.len(), 1, "{got:?}");
    check_call(&got[0], &odd, prefix + 1);
    let n = expected(&odd).4;
    let text_tokens = "<user>look  ok?\n<assistant>".len();
    assert_eq!(body["usage"]["prompt_tokens"], json!(text_tokens + n + 2));

    // The same image from an http URL, and a second one in the same message.
    let req = json!({"model": "eyes", "max_tokens": 8, "messages": [{"role": "user",
        "content": [{"type": "image_url", "image_url": {"url": format!("{base}/cat.png")}},
            {"type": "image_url", "image_url": {"url": data_url(&tiny)}}]}]});
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200, "{body}");
    let got = calls(&log, 1);
    assert_eq!(got.len(), 2, "{got:?}");
    let first = "<user>".len() + 1;
    check_call(&got[0], &odd, first);
    check_call(&got[1], &tiny, first + n + 2);

    // Ollama chat and generate, with base64 `images`.
    let req = json!({"model": "eyes", "stream": false, "messages": [{"role": "user",
        "content": "what?", "images": [b64(&tiny)]}]});
    let (status, body) = server.post("/api/chat", &req);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["message"]["content"], "done");
    let got = calls(&log, 3);
    assert_eq!(got.len(), 1, "{got:?}");
    check_call(&got[0], &tiny, "<user>".len() + 1);
    let req = json!({"model": "eyes", "stream": false, "prompt": "and this?", "images": [b64(&odd)]});
    let (status, body) = server.post("/api/generate", &req);
    assert_eq!(status, 200, "{body}");
    let got = calls(&log, 4);
    assert_eq!(got.len(), 1, "{got:?}");
    check_call(&got[0], &odd, "<user>".len() + 1);

    // Bad images: 400s naming the part and what was wrong.
    let bmp = b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0".to_vec();
    let cases = [
        (data_url(&fixture("corrupt.png")), "corrupt"),
        (data_url(&bmp), "unsupported image format"),
        (format!("{base}/missing.png"), "/missing.png"),
        (data_url(&oversized_png()), "too large"),
        ("data:image/png;base64,@@@".to_string(), "base64"),
    ];
    for (url, what) in cases {
        let req = json!({"model": "eyes", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]}]});
        let (status, body) = server.post("/v1/chat/completions", &req);
        assert_eq!(status, 400, "{what}: {body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("messages[0].content[1]") && msg.contains(what),
            "{what}: {msg}"
        );
    }
    let req = json!({"model": "eyes", "stream": false, "messages": [{"role": "user",
        "content": "x", "images": [b64(&bmp)]}]});
    let (status, body) = server.post("/api/chat", &req);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("messages[0].images[0]"),
        "{body}"
    );
    assert_eq!(calls(&log, 5).len(), 0);

    // A text-only model refuses images through both APIs.
    let req = json!({"model": "blind", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(&tiny)}}]}]});
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 400, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("messages[0].content[0]") && msg.contains("model blind:latest does not take images"),
        "{msg}"
    );
    let req = json!({"model": "blind", "stream": false, "prompt": "x", "images": [b64(&tiny)]});
    let (status, body) = server.post("/api/generate", &req);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("does not take images"),
        "{body}"
    );

    // Still serving; the loaded vision model lists the capability, the text-only one does not.
    let req = json!({"model": "blind", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = server.post("/v1/chat/completions", &req);
    assert_eq!(status, 200, "{body}");
    let (_, models) = server.request("GET", "/v1/models", None);
    let caps = |name: &str| {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == name)
            .map(|m| m["capabilities"].clone())
            .unwrap()
    };
    assert!(
        caps("eyes:latest").as_array().unwrap().contains(&json!("vision")),
        "{models}"
    );
    assert!(
        !caps("blind:latest")
            .as_array()
            .unwrap()
            .contains(&json!("vision")),
        "{models}"
    );
    let (_, show) = server.post("/api/show", &json!({"model": "eyes"}));
    assert!(
        show["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("vision")),
        "{show}"
    );

    // Prefix reuse: the same image bytes again reuse its rows (no new encode); another image in
    // the same place reuses nothing from its first row on.
    let ask = |bytes: &[u8]| {
        let tail = "and tell me everything about it, in detail. ".repeat(4);
        let req = json!({"model": "eyes", "max_tokens": 8, "messages": [{"role": "user",
            "content": [{"type": "text", "text": "see "},
                {"type": "image_url", "image_url": {"url": data_url(bytes)}},
                {"type": "text", "text": tail}]}]});
        let (status, body) = server.post("/v1/chat/completions", &req);
        assert_eq!(status, 200, "{body}");
        body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap() as usize
    };
    let before = calls(&log, 0).len();
    ask(&odd);
    assert_eq!(calls(&log, 0).len(), before + 1);
    let cached = ask(&odd);
    let image_end = "<user>see ".len() + 1 + n;
    assert!(cached > image_end, "cached {cached}, image ends at {image_end}");
    assert_eq!(
        calls(&log, 0).len(),
        before + 1,
        "the same image was encoded again"
    );
    let other = ask(&tiny);
    assert!(
        other <= "<user>see ".len() + 1,
        "cached {other} rows of another image"
    );
    assert_eq!(calls(&log, 0).len(), before + 2);

    // The official clients: openai with a data URL, an http URL and a corrupt image; ollama.
    let before = calls(&log, 0).len();
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/image_checks.py"))
        .arg(format!("http://127.0.0.1:{}", server.port))
        .arg("eyes")
        .arg(repo_root().join("tests/fixtures/images/odd.png"))
        .arg(format!("{base}/cat.png"))
        .arg(repo_root().join("tests/fixtures/images/corrupt.png"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The http URL brings the data URL's bytes to the same place: its rows are reused.
    let got = calls(&log, before);
    assert_eq!(got.len(), 2, "{got:?}");
    for call in &got {
        assert_eq!(call["pixels"], json!(expected(&odd).1), "{call}");
    }

    // Responses: an `input_image` between two text parts lands where the chat API puts it (after
    // text as long as the first request's, which differs so that no rows are reused); a bad one is
    // a 400 naming its part, and a text-only model refuses it naming the part.
    let before = calls(&log, 0).len();
    let input = |model: &str, url: String| {
        json!({"model": model, "max_output_tokens": 8, "temperature": 0, "input": [{"role": "user",
            "content": [{"type": "input_text", "text": "peek "},
                {"type": "input_image", "image_url": url},
                {"type": "input_text", "text": " ok?"}]}]})
    };
    let (status, body) = server.post("/v1/responses", &input("eyes", format!("{base}/cat.png")));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"][0]["content"][0]["text"], "done", "{body}");
    let got = calls(&log, before);
    assert_eq!(got.len(), 1, "{got:?}");
    check_call(&got[0], &odd, prefix + 1);
    assert_eq!(body["usage"]["input_tokens"], json!(text_tokens + n + 2));
    for (model, what) in [
        ("eyes", "corrupt"),
        ("blind", "model blind:latest does not take images"),
    ] {
        let (status, body) = server.post("/v1/responses", &input(model, data_url(&fixture("corrupt.png"))));
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], "input[0].content[1]", "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(what), "{what}: {msg}");
    }
    assert_eq!(calls(&log, before).len(), 1);
}

/// An image URL naming the server's own network (loopback, by address or by name; the cloud
/// metadata address) is a 400 naming the part, and no connection reaches the address.
#[test]
fn image_urls_cannot_reach_private_addresses_by_default() {
    let home = home();
    import_model(home.path(), "eyes", Some(&home.path().join("images.jsonl")));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Server::start(home.path());
    let urls = [
        format!("http://127.0.0.1:{port}/cat.png"),
        format!("http://localhost:{port}/cat.png"),
        format!("http://[::ffff:127.0.0.1]:{port}/cat.png"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ];
    for url in urls {
        let req = json!({"model": "eyes", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}]});
        let (status, body) = server.post("/v1/chat/completions", &req);
        assert_eq!(status, 400, "{url}: {body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("messages[0].content[0]") && msg.contains("private address"),
            "{url}: {msg}"
        );
    }
    let reached = listener.accept();
    assert!(
        matches!(&reached, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection reached the loopback listener: {reached:?}"
    );
}

#[test]
fn berth_run_attaches_image_files_and_image_options() {
    let home = home();
    let log: PathBuf = home.path().join("images.jsonl");
    import_model(home.path(), "eyes", Some(&log));
    import_model(home.path(), "blind", None);
    let dir = home.path().join("pics");
    std::fs::create_dir_all(&dir).unwrap();
    let (odd, tiny) = (fixture("odd.png"), fixture("tiny.png"));
    std::fs::write(dir.join("cat.png"), &odd).unwrap();
    std::fs::write(dir.join("dot.png"), &tiny).unwrap();
    let cat = dir.join("cat.png");
    let prompt = format!("describe {}", cat.display());
    let dot = dir.join("dot.png");
    let args = [
        "run",
        "eyes",
        prompt.as_str(),
        "--image",
        dot.to_str().unwrap(),
        "--temperature",
        "0",
    ];
    let out = berth_ok(home.path(), None, &args);
    assert!(out.contains("done"), "{out}");
    // `--image` first, then the file named in the prompt; the path is taken out of the text.
    let got = calls(&log, 0);
    assert_eq!(got.len(), 2, "{got:?}");
    let first = "<user>".len() + 1;
    check_call(&got[0], &tiny, first);
    check_call(&got[1], &odd, first + expected(&tiny).4 + 2);
    // A text-only model refuses them.
    let out = berth(home.path(), None, &["run", "blind", prompt.as_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not take images"), "{err}");
}
