//! Tiny packs that serve: the tiny random-weight reference models (`../shared/fixtures/
//! reference-tiny`, vocabulary 512) made into packs with the generated 512-token tokenizer and
//! the real chat templates in `tests/fixtures/tiny-packs` (scripts/gen-tiny-tokenizer), imported
//! with `berth import DIR --template FILE`, then driven through the real `berth run` and
//! `berth serve`: determinism, prefix reuse (`usage.prompt_tokens_details.cached_tokens`), the
//! same greedy answer with and without a cached prefix, streamed = non-streamed.
//!
//! Random weights answer gibberish: the tests assert on exit status, non-empty output and
//! equalities, never on the text. Time to first token is measured and printed, never asserted.
//!
//! Plugins: the debug builds next to the test binary (`target/debug/libberth_<name>.so`) are
//! installed into a temporary directory that `BERTH_PLUGIN_PATH` names, so they win over any
//! plugins `scripts/setup` installed next to the binary.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Server tests run one at a time (two shared cores; TTFT is printed).
static SERIAL: Mutex<()> = Mutex::new(());

/// One tiny model made into a pack.
struct Tiny {
    /// Directory under `reference-tiny/`.
    model: &'static str,
    /// Chat template in `tests/fixtures/tiny-packs/`.
    template: &'static str,
    /// The workspace plugin serving it (`libberth_<plugin>.so`).
    plugin: &'static str,
    /// Pack name given to `berth import --name`.
    name: &'static str,
    /// Family and architecture `berth import` must record.
    family: &'static str,
    architecture: &'static str,
}

const QWEN3: Tiny = Tiny {
    model: "qwen3",
    template: "qwen3.jinja",
    plugin: "qwen3",
    name: "tiny-qwen3:test",
    family: "qwen3",
    architecture: "qwen3",
};

const LFM2: Tiny = Tiny {
    model: "lfm2",
    template: "lfm2.jinja",
    plugin: "lfm2",
    name: "tiny-lfm2:test",
    family: "lfm2",
    architecture: "lfm2",
};

const QWEN3_5: Tiny = Tiny {
    model: "qwen3_5",
    template: "qwen3_5.jinja",
    plugin: "qwen3",
    name: "tiny-qwen3.5:test",
    family: "qwen3",
    architecture: "qwen3_5_text",
};

/// `tests/fixtures/tiny-packs`: tokenizer and templates.
fn tiny_fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/tiny-packs")
}

/// `../shared/fixtures/reference-tiny/<model>`.
fn reference_model(model: &str) -> PathBuf {
    let dir = repo_root().join("../shared/fixtures/reference-tiny").join(model);
    assert!(
        dir.join("model.safetensors").is_file(),
        "tiny reference model missing: {} (the shared fixtures lie beside the repository)",
        dir.display()
    );
    dir
}

/// A Berth home holding one imported tiny pack, with its plugin in a directory of its own.
struct TinyHome {
    tmp: tempfile::TempDir,
}

impl TinyHome {
    fn new(tiny: &'static Tiny) -> TinyHome {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("berth-tiny-{}-", tiny.model))
            .tempdir()
            .unwrap();
        let home = TinyHome { tmp };
        std::fs::create_dir_all(home.plugin_dir()).unwrap();
        // Fails loudly when the plugin is not built (e.g. plugins/lfm2 before it exists).
        let lib = plugin_library(tiny.plugin);
        home.ok(&[
            "plugins",
            "install",
            lib.to_str().unwrap(),
            "--dir",
            home.plugin_dir().to_str().unwrap(),
        ]);
        // The import source: the reference model's config and weights, plus the tokenizer.
        let src = home.tmp.path().join("src").join(tiny.model);
        std::fs::create_dir_all(&src).unwrap();
        let reference = reference_model(tiny.model);
        for f in ["config.json", "generation_config.json", "model.safetensors"] {
            std::fs::copy(reference.join(f), src.join(f)).unwrap();
        }
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(tiny_fixtures().join(f), src.join(f)).unwrap();
        }
        let template = tiny_fixtures().join(tiny.template);
        home.ok(&[
            "import",
            src.to_str().unwrap(),
            "--name",
            tiny.name,
            "--template",
            template.to_str().unwrap(),
        ]);
        let show: Value = serde_json::from_str(&home.ok(&["show", tiny.name, "--json"])).unwrap();
        let text = show.to_string();
        assert!(
            text.contains(&format!("\"family\":\"{}\"", tiny.family))
                && text.contains(&format!("\"architecture\":\"{}\"", tiny.architecture)),
            "{} imported with the wrong family or architecture: {show:#}",
            tiny.name
        );
        home
    }

    fn path(&self) -> &Path {
        self.tmp.path()
    }

    fn plugin_dir(&self) -> PathBuf {
        self.tmp.path().join("plugins-debug")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(berth_exe());
        cmd.env("BERTH_HOME", self.path())
            .env("BERTH_PLUGIN_PATH", self.plugin_dir())
            .env_remove("BERTH_PORT")
            .env_remove("BERTH_HOST");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("berth runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "berth {args:?} failed ({}): {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn serve(&self) -> Server {
        let (child, _, port) = spawn_serve(
            self.command()
                .args(["serve", "--port", "0", "--host", "127.0.0.1"])
                // Quiet unless asked (`BERTH_LOG=info` shows each request's cached tokens).
                .env(
                    "BERTH_LOG",
                    std::env::var("BERTH_LOG").unwrap_or_else(|_| "warn".into()),
                ),
        );
        Server { child, port }
    }
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

/// A streamed answer, reassembled.
#[derive(Debug, Default)]
struct Streamed {
    content: String,
    reasoning: String,
    tool_calls: usize,
    finish_reason: Option<String>,
    usage: Option<Value>,
    /// From sending the request to the first chunk carrying text.
    ttft: Option<Duration>,
}

impl Server {
    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        s
    }

    fn send(&self, s: &mut TcpStream, path: &str, body: &Value) {
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
    }

    /// A non-streamed chat completion; panics unless it answers 200.
    fn chat(&self, body: &Value) -> Value {
        let mut s = self.connect();
        self.send(&mut s, "/v1/chat/completions", body);
        let mut r = BufReader::new(s);
        let (status, chunked) = read_head(&mut r);
        let mut raw = Vec::new();
        if chunked {
            while let Some(c) = read_chunk(&mut r) {
                raw.extend(c);
            }
        } else {
            r.read_to_end(&mut raw).unwrap();
        }
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(status, 200, "chat completion failed: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    /// A streamed chat completion (`stream_options.include_usage`), reassembled as it arrives.
    fn chat_stream(&self, body: &Value) -> Streamed {
        let mut body = body.clone();
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut s = self.connect();
        let t0 = Instant::now();
        self.send(&mut s, "/v1/chat/completions", &body);
        let mut r = BufReader::new(s);
        let (status, chunked) = read_head(&mut r);
        assert!(chunked, "a stream is sent chunked");
        let mut out = Streamed::default();
        let mut pending = String::new();
        let mut done = false;
        while let Some(c) = read_chunk(&mut r) {
            pending.push_str(&String::from_utf8_lossy(&c));
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                let Some(data) = event.trim().strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                assert_eq!(status, 200, "stream failed: {data}");
                let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
                assert!(v.get("error").is_none(), "error in stream: {v}");
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    out.usage = Some(u.clone());
                }
                let Some(choice) = v["choices"].get(0) else {
                    continue;
                };
                let delta = &choice["delta"];
                let mut text = false;
                if let Some(t) = delta["content"].as_str() {
                    out.content.push_str(t);
                    text |= !t.is_empty();
                }
                if let Some(t) = delta["reasoning_content"].as_str() {
                    out.reasoning.push_str(t);
                    text |= !t.is_empty();
                }
                if let Some(calls) = delta["tool_calls"].as_array() {
                    out.tool_calls += calls.iter().filter(|c| c.get("id").is_some()).count();
                    text = true;
                }
                if text && out.ttft.is_none() {
                    out.ttft = Some(t0.elapsed());
                }
                if let Some(f) = choice["finish_reason"].as_str() {
                    out.finish_reason = Some(f.to_string());
                }
            }
        }
        assert_eq!(status, 200, "stream failed: {pending}");
        assert!(done, "stream ended without [DONE]: {out:?} {pending}");
        out
    }
}

/// Reads the status line and headers; returns (status, whether the body is chunked).
fn read_head(r: &mut impl BufRead) -> (u16, bool) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {line:?}"));
    let mut chunked = false;
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            return (status, chunked);
        }
        let l = line.to_ascii_lowercase();
        chunked |= l.starts_with("transfer-encoding:") && l.contains("chunked");
    }
}

/// One chunk of a chunked body; `None` at the end.
fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).unwrap() == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16)
        .unwrap_or_else(|e| panic!("bad chunk size {line:?}: {e}"));
    if size == 0 {
        return None;
    }
    let mut buf = vec![0; size + 2];
    r.read_exact(&mut buf).unwrap();
    buf.truncate(size);
    Some(buf)
}

/// The message a non-streamed answer carries, as (content, reasoning, tool calls).
fn message_parts(answer: &Value) -> (String, String, usize) {
    let m = &answer["choices"][0]["message"];
    (
        m["content"].as_str().unwrap_or("").to_string(),
        m["reasoning_content"].as_str().unwrap_or("").to_string(),
        m["tool_calls"].as_array().map_or(0, Vec::len),
    )
}

// ---------------------------------------------------------------------------------------------
// The fixture tokenizer, as the host loads it

#[test]
fn tiny_tokenizer_has_512_ids_and_every_template_marker_is_one_token() {
    let t =
        berth::tokenizer::Tokenizer::from_tokenizer_json(&tiny_fixtures().join("tokenizer.json")).unwrap();
    assert_eq!(t.vocab_size(), 512);
    // Where the LFM2 configs expect them: pad 0, bos 1, eos 2.
    assert_eq!(t.token_id("<|pad|>"), Some(0));
    assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
    assert_eq!(t.token_id("<|startoftext|>"), Some(1));
    assert_eq!(t.token_id("<|im_end|>"), Some(2));
    assert!(!t.add_bos(), "the templates write bos_token themselves");
    assert!(t.is_stop(2) && t.is_stop(t.token_id("<|endoftext|>").unwrap()));
    for template in ["lfm2.jinja", "qwen3_5.jinja", "qwen3.jinja"] {
        let text = std::fs::read_to_string(tiny_fixtures().join(template)).unwrap();
        let mut markers: Vec<&str> = text
            .match_indices("<|")
            .filter_map(|(i, _)| text[i..].find("|>").map(|j| &text[i..i + j + 2]))
            .filter(|m| {
                m[2..m.len() - 2]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            })
            .collect();
        for tag in [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
        ] {
            if text.contains(tag) {
                markers.push(tag);
            }
        }
        assert!(markers.contains(&"<|im_start|>"), "{template}: {markers:?}");
        for m in markers {
            assert_eq!(t.encode(m, false).len(), 1, "{template}: {m} is not one token");
        }
    }
    let text = "<|im_start|>user\nHello, world! naïve 東京<|im_end|>\n";
    let ids = t.encode(text, false);
    assert_eq!(t.decode(&ids, false), text);
    assert!(ids.iter().all(|&id| id < 512));
}

// ---------------------------------------------------------------------------------------------
// berth run

fn run_greedy_twice(tiny: &'static Tiny) {
    let home = TinyHome::new(tiny);
    let args = [
        "run",
        tiny.name,
        "hello",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
    ];
    let first = home.run(&args);
    let stdout = String::from_utf8_lossy(&first.stdout);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(
        first.status.success(),
        "berth run {} failed ({}): {stderr}\n{stdout}",
        tiny.name,
        first.status
    );
    assert!(
        !stdout.trim().is_empty(),
        "berth run {} printed nothing: {stderr}",
        tiny.name
    );
    eprintln!("{}: {stdout:?}", tiny.name);
    let second = home.ok(&args);
    assert_eq!(stdout, second, "greedy `berth run` differs between two runs");
}

#[test]
fn tiny_qwen3_run_is_greedy_and_deterministic() {
    run_greedy_twice(&QWEN3);
}

#[test]
fn tiny_lfm2_run_is_greedy_and_deterministic() {
    run_greedy_twice(&LFM2);
}

#[test]
fn tiny_qwen3_5_run_is_greedy_and_deterministic() {
    run_greedy_twice(&QWEN3_5);
}

// ---------------------------------------------------------------------------------------------
// berth serve

/// A system prompt of about 300 tokens of the tiny tokenizer, shared by both requests.
const SYSTEM: &str = "You are a helpful assistant who lives in a little house by the river. \
Every morning you walk to the market to buy bread, milk and apples, and every evening you sit \
by the window and read a book while the cat sleeps in the warm light of the fire. You answer \
every question in one short sentence, you never use lists, and you always thank the user for \
asking. When you do not know the answer, you say so and suggest where the user could look. \
You like stories about dogs who want to learn to sing, jokes about computers, and questions \
about the capital cities of the world. The weather is cold in the winter and hot in the \
summer, but you are always happy because you have a good friend and a quiet home. Think step \
by step before you answer, and keep your answers kind, clear and true.";

fn ask(tiny: &Tiny, user: &str) -> Value {
    json!({
        "model": tiny.name,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user},
        ],
        "temperature": 0,
        "max_tokens": 16,
    })
}

fn serve_reuses_prefix(tiny: &'static Tiny) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = TinyHome::new(tiny);
    let first = ask(tiny, "Hello! What is the capital of France?");
    let second = ask(tiny, "Tell me a joke about computers, please.");

    // Server 1: load the model with an unrelated request, then the two sharing the prefix.
    let server = home.serve();
    let warm = server.chat(&json!({
        "model": tiny.name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    }));
    assert_eq!(warm["object"], "chat.completion", "{warm}");
    let a = server.chat_stream(&first);
    let b = server.chat_stream(&second);
    let prompt_tokens = |s: &Streamed| s.usage.as_ref().map(|u| u["prompt_tokens"].clone());
    let cached = |u: &Value| u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let (ua, ub) = (a.usage.clone().unwrap(), b.usage.clone().unwrap());
    eprintln!(
        "{}: TTFT first {:?} (prompt {:?} tokens, {} cached), second {:?} (prompt {:?} tokens, {} cached)",
        tiny.name,
        a.ttft,
        prompt_tokens(&a),
        cached(&ua),
        b.ttft,
        prompt_tokens(&b),
        cached(&ub)
    );
    assert!(
        ua["prompt_tokens"].as_u64().unwrap() >= 250,
        "the shared system prompt should be ~300 tokens: {ua}"
    );
    assert!(
        cached(&ub) > 0,
        "the second request shares a ~300-token prefix with the first, yet nothing was reused: {ub}"
    );
    assert!(
        a.ttft.is_some() && b.ttft.is_some(),
        "no text streamed: {a:?} {b:?}"
    );
    // Streamed = non-streamed (the second request again, now with its whole prompt cached).
    let b_plain = server.chat(&second);
    let (content, reasoning, calls) = message_parts(&b_plain);
    assert_eq!(
        (&b.content, &b.reasoning, b.tool_calls),
        (&content, &reasoning, calls),
        "streamed and non-streamed greedy answers differ"
    );
    assert_eq!(
        b.finish_reason.as_deref(),
        b_plain["choices"][0]["finish_reason"].as_str(),
        "{b_plain}"
    );
    assert_eq!(
        ub["completion_tokens"], b_plain["usage"]["completion_tokens"],
        "{ub} vs {}",
        b_plain["usage"]
    );
    assert!(
        ub["completion_tokens"].as_u64().unwrap() > 0,
        "no tokens generated: {ub}"
    );
    drop(server);

    // Server 2, fresh: the same second request without any cached prefix answers the same.
    let fresh = home.serve();
    let b_fresh = fresh.chat(&second);
    eprintln!(
        "{}: fresh server usage {} answer {}",
        tiny.name, b_fresh["usage"], b_fresh["choices"][0]["message"]
    );
    assert_eq!(
        b_fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "a fresh server has nothing cached: {}",
        b_fresh["usage"]
    );
    assert_eq!(
        b_fresh["choices"][0]["message"], b_plain["choices"][0]["message"],
        "the greedy answer after prefix reuse differs from a fresh server's"
    );
    assert_eq!(
        b_fresh["usage"]["completion_tokens"],
        b_plain["usage"]["completion_tokens"]
    );
}

#[test]
fn tiny_qwen3_serve_reuses_the_prefix_and_streams_the_same_answer() {
    serve_reuses_prefix(&QWEN3);
}

#[test]
fn tiny_lfm2_serve_reuses_the_prefix_and_streams_the_same_answer() {
    serve_reuses_prefix(&LFM2);
}

#[test]
fn tiny_qwen3_5_serve_reuses_the_prefix_and_streams_the_same_answer() {
    serve_reuses_prefix(&QWEN3_5);
}

// ---------------------------------------------------------------------------------------------
// berth run and berth serve: one turn, one engine

/// What `berth run` prints for an answer: its reasoning between `Thinking...` and
/// `...done thinking.`, then its content.
fn printed(answer: &Value) -> String {
    let (content, reasoning, _) = message_parts(answer);
    let mut out = String::new();
    if !reasoning.is_empty() {
        out += &format!("Thinking...\n{reasoning}");
    }
    if !content.is_empty() {
        if !reasoning.is_empty() {
            out += "\n...done thinking.\n\n";
        }
        out += &content;
    }
    out
}

/// `berth run` and `berth serve` answer the same prompt with the same options the same way
/// (greedy), with speculation `on` or `off` in both, and with a JSON schema when given.
fn run_and_serve_agree(tiny: &'static Tiny, speculation: &str, schema: Option<&Value>) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = TinyHome::new(tiny);
    let prompt = "Tell me about the river and the market.";
    let mut args = vec![
        "run".to_string(),
        tiny.name.to_string(),
        prompt.to_string(),
        "--temperature".into(),
        "0".into(),
        "--max-tokens".into(),
        "40".into(),
    ];
    let mut body = json!({
        "model": tiny.name,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 40,
    });
    if let Some(s) = schema {
        args.extend(["--format".to_string(), s.to_string()]);
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}});
    }
    let out = home
        .command()
        .env("BERTH_SPECULATION", speculation)
        .args(&args)
        .output()
        .expect("berth runs");
    let ran = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "berth run failed: {}\n{ran}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (child, _, port) = spawn_serve(
        home.command()
            .env("BERTH_SPECULATION", speculation)
            .env("BERTH_LOG", "warn")
            .args(["serve", "--port", "0", "--host", "127.0.0.1"]),
    );
    let server = Server { child, port };
    let answer = server.chat(&body);
    let served = printed(&answer);
    assert!(!served.is_empty(), "{answer}");
    assert_eq!(
        ran.trim_end(),
        served.trim_end(),
        "{} with speculation {speculation}, schema {schema:?}: `berth run` and `berth serve` differ",
        tiny.name
    );
}

#[test]
fn tiny_qwen3_run_and_serve_give_the_same_greedy_answer() {
    // qwen3's template leaves the model thinking: the reasoning pack of the fixtures.
    run_and_serve_agree(&QWEN3, "off", None);
    run_and_serve_agree(&QWEN3, "on", None);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    run_and_serve_agree(&QWEN3, "off", Some(&schema));
}

#[test]
fn tiny_lfm2_run_and_serve_give_the_same_greedy_answer() {
    run_and_serve_agree(&LFM2, "on", None);
}
