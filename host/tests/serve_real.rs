//! `berth serve` end to end: a real server process on loopback with Qwen2.5-Coder 0.5B, driven
//! by the official `openai` Python package (tests/serve/openai_checks.py, deps installed by
//! scripts/python-test-deps), plus the hot registry (import and remove while serving).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Server tests run one at a time: they measure throughput and share two cores.
static SERIAL: Mutex<()> = Mutex::new(());

const MODEL: &str = "qwen2.5-coder:0.5b";
/// How long any awaited state may take on a loaded machine: tests wait on state, never on time.
const DEADLINE: Duration = Duration::from_secs(300);

/// Waits until `ok` holds, polling, failing after [`DEADLINE`].
fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh Berth home with the qwen3 plugin under test and Qwen2.5-Coder 0.5B as `name`.
fn home_with_qwen(name: &str) -> tempfile::TempDir {
    common::home_with_qwen("berth-serve-", name)
}

type Server = TestServer;

/// The model ids `/v1/models` lists.
fn model_ids(server: &Server) -> Vec<String> {
    let (_, body) = server.http("GET", "/v1/models", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// Runs one check of tests/serve/openai_checks.py; returns its `ok` line.
fn openai_check(server: &Server, check: &str, args: &[&str]) -> String {
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/openai_checks.py"))
        .args([server.base.as_str(), MODEL, check])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "check {check} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
    stdout
}

#[test]
fn openai_and_ollama_clients_chat_stream_call_tools_and_get_typed_errors() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen(MODEL);
    let server = Server::start(home.path(), &["--parallel", "8"]);
    for check in [
        "chat",
        "tools",
        "parse",
        "usage",
        "errors",
        "disconnect",
        "logprobs",
        "n",
        "toolsemantics",
        "tolerant",
        "root",
    ] {
        openai_check(&server, check, &[]);
    }
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/ollama_checks.py"))
        .args([server.base.as_str(), MODEL])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ollama checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    let (status, body) = server.http("GET", "/health", None);
    assert_eq!((status, body.contains("ok")), (200, true), "{body}");
    let (status, body) = server.http("POST", "/v1/chat/completions", Some("{\"model\": 1"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_request_error"), "{body}");
    // A body over the limit (32 MiB): the answer is read while the body is still being sent
    // (the server stops reading at the limit and closes).
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let n = 40usize << 20;
        let _ = write!(
            w,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n"
        );
        let chunk = vec![b'a'; 1 << 16];
        for _ in 0..n >> 16 {
            if w.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[9..12], b"413");
    let (_, metrics) = server.http("GET", "/metrics", None);
    for name in [
        "berth_requests_total{route=\"/v1/chat/completions\",status=\"200\"}",
        "berth_time_to_first_token_seconds_count",
        "berth_generated_tokens_total",
        "berth_queue_depth",
        "berth_loaded_models 1",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }
}

#[test]
fn eight_concurrent_greedy_streams_equal_their_single_outputs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen(MODEL);
    let server = Server::start(home.path(), &["--parallel", "8"]);
    openai_check(&server, "concurrency", &["40"]);
}

#[test]
fn a_pack_imported_while_serving_is_listed_answers_evicts_the_lru_model_and_rm_unloads_it() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen(MODEL);
    let server = Server::start(home.path(), &["--max-loaded-models", "1"]);
    assert_eq!(model_ids(&server), [MODEL]);
    let first = format!("{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Say hi\"}}],\"max_tokens\":2}}");
    assert_eq!(server.http("POST", "/v1/chat/completions", Some(&first)).0, 200);
    let qwen = real_model("qwen2.5-coder-0.5b");
    berth_ok(
        home.path(),
        None,
        &["import", qwen.to_str().unwrap(), "--name", "hot:new"],
    );
    // The store watcher lists it: wait for the listing itself, not for a guessed time.
    wait_for("hot:new to be listed", || {
        model_ids(&server).contains(&"hot:new".to_string())
    });
    let ask = r#"{"model":"hot:new","messages":[{"role":"user","content":"Say hi"}],"max_tokens":3,"temperature":0}"#;
    let (status, body) = server.http("POST", "/v1/chat/completions", Some(ask));
    assert_eq!(status, 200, "{body}");
    // One model at most: the least recently used one was unloaded for it.
    let (_, ps) = server.http("GET", "/api/ps", None);
    assert!(ps.contains("hot:new") && !ps.contains(MODEL), "{ps}");
    let out = Command::new(berth_exe())
        .args(["ps", "--json"])
        .env("BERTH_PORT", server.port.to_string())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hot:new"),
        "{out:?}"
    );
    berth_ok(home.path(), None, &["rm", "hot:new"]);
    wait_for("hot:new to be unloaded and unlisted", || {
        let (_, ps) = server.http("GET", "/api/ps", None);
        !ps.contains("hot:new") && !model_ids(&server).contains(&"hot:new".to_string())
    });
    let (status, _) = server.http("POST", "/v1/chat/completions", Some(ask));
    assert_eq!(status, 404);
}

#[test]
fn a_plugin_installed_while_serving_serves_its_packs_without_a_restart() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::Builder::new().prefix("berth-serve-").tempdir().unwrap();
    let home = tmp.path();
    let qwen = real_model("qwen2.5-coder-0.5b");
    berth_ok(home, None, &["import", qwen.to_str().unwrap(), "--name", MODEL]);
    // `scripts/install-plugins debug` may have installed plugins next to the debug binary
    // (target/debug/lib/berth/plugins), which every home sees; the "before" half of the check
    // needs a machine without them (`scripts/setup` installs release plugins, which it never sees).
    let preinstalled = berth_ok(home, None, &["plugins", "--json"]).contains("\"qwen3\"");
    let server = Server::start(home, &[]);
    assert_eq!(model_ids(&server), [MODEL]);
    let ask = format!(
        "{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Say hi\"}}],\"max_tokens\":2}}"
    );
    if !preinstalled {
        let (status, body) = server.http("POST", "/v1/chat/completions", Some(&ask));
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("no installed plugin serves"), "{body}");
    } else {
        eprintln!("a qwen3 plugin is installed next to the binary: only the 'after' half runs");
    }
    berth_ok(
        home,
        None,
        &["plugins", "install", plugin_library("qwen3").to_str().unwrap()],
    );
    let (status, body) = server.http("POST", "/v1/chat/completions", Some(&ask));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn keep_alive_zero_unloads_the_model() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen(MODEL);
    let server = Server::start(home.path(), &[]);
    // Ollama's load / unload idiom: an empty generate, then one with keep_alive 0.
    let load = format!("{{\"model\":\"{MODEL}\"}}");
    let (status, body) = server.http("POST", "/api/generate", Some(&load));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""done_reason":"load""#), "{body}");
    assert!(server.http("GET", "/api/ps", None).1.contains(MODEL));
    let unload = format!("{{\"model\":\"{MODEL}\",\"keep_alive\":0}}");
    let (status, body) = server.http("POST", "/api/generate", Some(&unload));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""done_reason":"unload""#), "{body}");
    // On /api/chat too, and without loading a model that is not loaded.
    let (status, body) = server.http("POST", "/api/chat", Some(&unload));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""done_reason":"unload""#) && body.contains(r#""message""#),
        "{body}"
    );
    // Clients probe the root and the version.
    assert_eq!(
        server.http("GET", "/", None),
        (200, "Berth is running".to_string())
    );
    assert!(server
        .raw("HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .starts_with("HTTP/1.1 200"));
    let (_, version) = server.http("GET", "/api/version", None);
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert!(v["version"].as_str().unwrap().starts_with("0.12."), "{version}");
    assert_eq!(v["berth_version"], env!("CARGO_PKG_VERSION"));
    // Unloading waits for nothing running; on a loaded machine it may still take a while.
    wait_for("the model to unload after keep_alive 0", || {
        !server.http("GET", "/api/ps", None).1.contains(MODEL)
    });
}

/// `/api/create`'s older form (a Modelfile's text) streams its steps, the pack is listed at once,
/// `/api/show` reports its values as Ollama does, and its `modelfile` creates the same pack again.
#[test]
fn api_create_takes_a_modelfile_and_show_gives_it_back() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen(MODEL);
    let server = Server::start(home.path(), &[]);
    let modelfile = format!(
        "FROM {MODEL}\nSYSTEM \"\"\"Reply in French.\"\"\"\nPARAMETER temperature 0\n\
         PARAMETER stop \"<|im_end|>\"\nPARAMETER stop \"###\"\nMESSAGE user Bonjour\n\
         MESSAGE assistant \"Salut !\"\nLICENSE MIT\nPARAMETER num_predict 3\n"
    );
    let create = serde_json::json!({"name": "fr", "modelfile": modelfile}).to_string();
    let (status, body) = server.post("/api/create", &create);
    assert_eq!(status, 200, "{body}");
    for line in [
        format!("{{\"status\":\"using pack {MODEL}\"}}"),
        "{\"status\":\"writing system prompt\"}".to_string(),
        "{\"status\":\"success\"}".to_string(),
    ] {
        assert!(body.contains(&line), "{line} missing from {body}");
    }
    let (_, tags) = server.http("GET", "/api/tags", None);
    assert!(tags.contains("\"fr:latest\""), "{tags}");

    let show = |name: &str| -> serde_json::Value {
        let (status, body) = server.post("/api/show", &serde_json::json!({"model": name}).to_string());
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let a = show("fr");
    assert_eq!(a["system"], "Reply in French.");
    assert_eq!(a["license"], "MIT");
    assert_eq!(
        a["messages"],
        serde_json::json!([{"role": "user", "content": "Bonjour"}, {"role": "assistant", "content": "Salut !"}])
    );
    let params: Vec<Vec<&str>> = a["parameters"]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        params,
        [
            ["num_predict", "3"],
            ["stop", "\"<|im_end|>\""],
            ["stop", "\"###\""],
            ["temperature", "0"]
        ]
    );
    assert!(a["template"].as_str().unwrap().contains("<|im_start|>"));

    // The created pack's defaults apply: its num_predict caps an answer that sets none.
    let chat = serde_json::json!({"model": "fr", "stream": false,
        "messages": [{"role": "user", "content": "Count from 1 to 20."}]});
    let (status, body) = server.post("/api/chat", &chat.to_string());
    assert_eq!(status, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (reply["eval_count"].as_u64(), reply["done_reason"].as_str()),
        (Some(3), Some("length")),
        "{body}"
    );

    let again = serde_json::json!({"model": "fr2", "modelfile": a["modelfile"], "stream": false});
    let (status, body) = server.post("/api/create", &again.to_string());
    assert_eq!((status, body.as_str()), (200, "{\"status\":\"success\"}"));
    let b = show("fr2");
    for key in ["system", "license", "messages", "parameters", "template"] {
        assert_eq!(a[key], b[key], "{key}");
    }

    let go = serde_json::json!({"model": "go", "modelfile": format!("FROM {MODEL}\nTEMPLATE {{{{ .Prompt }}}}\n")});
    let (status, body) = server.post("/api/create", &go.to_string());
    assert_eq!(status, 400, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).unwrap();
    let msg = err["error"].as_str().unwrap();
    assert!(
        msg.contains("line 2") && msg.contains("Go template") && msg.contains("Jinja"),
        "{msg}"
    );
}

/// Ten small Python functions cut around a gap Qwen2.5-Coder 0.5B fills greedily: (prefix,
/// suffix). Each suffix goes on to a `main` so the model sees where the middle ends.
fn fim_cases() -> Vec<(String, String)> {
    let main = |call: &str| {
        format!("\n\n\ndef main():\n    print({call})\n\n\nif __name__ == '__main__':\n    main()\n")
    };
    [
        ("def add(a, b):\n    return ", "", "add(1, 2)"),
        ("def is_even(n):\n    return ", "", "is_even(4)"),
        ("def greet(", "):\n    return 'Hello, ' + name", "greet('Bob')"),
        (
            "def maximum(a, b):\n    if a > b:\n        return a\n    ",
            "",
            "maximum(1, 2)",
        ),
        ("def first(xs):\n    return ", "", "first([4, 5])"),
        // Not `return sum(xs) / `: there the end of text and `len` tie for this model (llama.cpp
        // on the same FIM prompt: log-probabilities -0.966 and -0.990, or the reverse), so a
        // change in summation order picks either.
        (
            "def mean(xs):\n    total = sum(xs)\n    return ",
            "",
            "mean([1, 2, 3])",
        ),
        (
            "def celsius_to_fahrenheit(c):\n    return ",
            "",
            "celsius_to_fahrenheit(100)",
        ),
        (
            "def contains(xs, item):\n    for x in xs:\n        if x == item:\n            return True\n    ",
            "",
            "contains([1, 2], 2)",
        ),
        (
            "def factorial(n):\n    if n == 0:\n        return 1\n    return n * ",
            "",
            "factorial(5)",
        ),
        ("def double(x):\n    return ", "", "double(4)"),
    ]
    .into_iter()
    .map(|(prefix, rest, call)| (prefix.to_string(), format!("{rest}{}", main(call))))
    .collect()
}

/// The indices of the sources Python's `ast.parse` refuses.
fn unparsable(sources: &[String]) -> Vec<usize> {
    let check = "import ast, json, sys\nbad = []\nfor i, s in enumerate(json.load(sys.stdin)):\n    try:\n        ast.parse(s)\n    except SyntaxError:\n        bad.append(i)\nprint(json.dumps(bad))";
    let mut child = Command::new("python3")
        .args(["-c", check])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(sources).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn suffix_and_infill_fill_the_middle_so_the_function_parses_on_three_surfaces() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = real_models_home("berth-fim-");
    let server = Server::start(&home, &[]);
    let json = |(status, body): (u16, String)| -> serde_json::Value {
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let cases = fim_cases();
    let mut sources = Vec::new();
    for (prefix, suffix) in &cases {
        let generate = json(
            server.post(
                "/api/generate",
                &serde_json::json!({"model": MODEL, "prompt": prefix, "suffix": suffix, "stream": false,
                "options": {"temperature": 0, "num_predict": 64}})
                .to_string(),
            ),
        );
        let completion = json(
            server.post(
                "/v1/completions",
                &serde_json::json!({"model": MODEL, "prompt": prefix, "suffix": suffix, "temperature": 0,
                "max_tokens": 64})
                .to_string(),
            ),
        );
        let infill = json(
            server.post(
                "/infill",
                &serde_json::json!({"model": MODEL, "input_prefix": prefix, "input_suffix": suffix,
                "temperature": 0, "n_predict": 64, "samplers": ["top_k"], "cache_prompt": true})
                .to_string(),
            ),
        );
        assert_eq!(infill["stop"], true, "{infill}");
        for middle in [
            &generate["response"],
            &completion["choices"][0]["text"],
            &infill["content"],
        ] {
            let middle = middle.as_str().unwrap();
            assert!(!middle.trim().is_empty(), "an empty middle for {prefix:?}");
            sources.push(format!("{prefix}{middle}{suffix}"));
        }
    }
    let bad = unparsable(&sources);
    assert!(
        bad.is_empty(),
        "these do not parse:\n{}",
        bad.iter()
            .map(|&i| sources[i].as_str())
            .collect::<Vec<_>>()
            .join("\n-----\n")
    );

    // Special-token text in the code is text: the prompt is the three FIM tokens and the literal
    // tokens of the prefix and the suffix.
    let prefix = "EOS = '<|endoftext|>'\nSTART = '<|im_start|>'\n\n\ndef end_token():\n    return ";
    let suffix = "\n";
    let literal = |text: &str| {
        json(server.post(
            "/tokenize",
            &serde_json::json!({"model": MODEL, "content": text, "parse_special": false}).to_string(),
        ))["tokens"]
            .as_array()
            .unwrap()
            .len() as u64
    };
    let generate = json(
        server.post(
            "/api/generate",
            &serde_json::json!({"model": MODEL, "prompt": prefix, "suffix": suffix, "stream": false,
            "options": {"temperature": 0, "num_predict": 8}})
            .to_string(),
        ),
    );
    assert_eq!(
        generate["prompt_eval_count"].as_u64(),
        Some(3 + literal(prefix) + literal(suffix)),
        "{generate}"
    );

    // Other files go before the code (the repository-level layout); streamed, the pieces make
    // the content and the last event has the stop and the counts.
    let (status, body) = server.post(
        "/infill",
        &serde_json::json!({"model": MODEL, "input_prefix": "from util import two\n\nx = ",
            "input_suffix": "\nprint(x)\n", "input_extra": [{"filename": "util.py",
            "text": "def two():\n    return 2\n"}], "temperature": 0, "n_predict": 16, "stream": true})
        .to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let events: Vec<serde_json::Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["stop"], true, "{body}");
    assert!(last["tokens_predicted"].as_u64().unwrap() >= 1, "{last}");
    assert!(events.iter().all(|e| e["content"].is_string()), "{body}");

    // A model without FIM tokens says so, in each surface's shape.
    for (path, body) in [
        (
            "/api/generate",
            r#"{"model": "gemma3:270m", "prompt": "def f(", "suffix": ")"}"#,
        ),
        (
            "/v1/completions",
            r#"{"model": "gemma3:270m", "prompt": "def f(", "suffix": ")"}"#,
        ),
        (
            "/infill",
            r#"{"model": "gemma3:270m", "input_prefix": "def f(", "input_suffix": ")"}"#,
        ),
    ] {
        let (status, answer) = server.post(path, body);
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(
            answer.contains("suffix") && answer.contains("FIM"),
            "{path}: {answer}"
        );
    }
    // llama-server's routes need `model` when the store has more than one pack.
    let (status, answer) = server.post("/infill", r#"{"input_prefix": "a", "input_suffix": "b"}"#);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("'model' is required"), "{answer}");
    drop(server);
    let _ = std::fs::remove_dir_all(&home);
}

/// Fifty texts for the tokenizer round trip: special tokens, multi-byte UTF-8 (CJK, emoji,
/// combining marks), code and whitespace.
fn round_trip_texts() -> Vec<String> {
    let base = [
        "hello world",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>",
        "<|endoftext|>",
        "日本語のテキスト",
        "中文，标点符号。",
        "한국어 문장",
        "emoji 🎉🚀👩‍👩‍👧‍👦 and flags 🇫🇷",
        "🦀",
        "e\u{301}te\u{301} combining",
        "Ωμέγα ελληνικά",
        "Привет, мир",
        "مرحبا بالعالم",
        "  leading and trailing spaces  ",
        "\ttabs\tand\nnewlines\r\n",
        "fn main() { println!(\"{}\", 1 + 2); }",
        "def f(x):\n    return x ** 2\n",
        "{\"json\": [1, 2.5, null, true]}",
        "ascii ~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
        "a<|im_end|>b",
        "<|im_start|><|im_start|>",
        "mixed 日本 and 🎉 and <|im_end|>",
        "\u{feff}bom",
        "zero\u{200b}width",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    ];
    let mut texts: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    texts.extend(base.iter().map(|s| format!("<|im_start|>system\n{s}<|im_end|>")));
    assert_eq!(texts.len(), 50);
    texts
}

#[test]
fn tokenize_then_detokenize_gives_back_every_byte_and_pieces_split_characters_as_bytes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = home_with_qwen(MODEL);
    let server = Server::start(home.path(), &[]);
    let json = |(status, body): (u16, String)| -> serde_json::Value {
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let mut split_pieces = 0;
    // One pack in the store: `model` may be left out, as with llama-server.
    for text in round_trip_texts() {
        let tokens = json(server.post("/tokenize", &serde_json::json!({"content": text}).to_string()));
        let back = json(server.post(
            "/detokenize",
            &serde_json::json!({"tokens": tokens["tokens"]}).to_string(),
        ));
        assert_eq!(back["content"].as_str(), Some(text.as_str()), "{tokens}");
        // The pieces' bytes make the text; a piece that is not valid UTF-8 alone is a byte list.
        let pieces = json(server.post(
            "/tokenize",
            &serde_json::json!({"content": text, "with_pieces": true, "model": MODEL}).to_string(),
        ));
        let mut bytes = Vec::new();
        for (p, id) in pieces["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .zip(tokens["tokens"].as_array().unwrap())
        {
            assert_eq!(&p["id"], id);
            match &p["piece"] {
                serde_json::Value::String(s) => bytes.extend_from_slice(s.as_bytes()),
                serde_json::Value::Array(b) => {
                    split_pieces += 1;
                    let b: Vec<u8> = b.iter().map(|x| x.as_u64().unwrap() as u8).collect();
                    assert!(std::str::from_utf8(&b).is_err(), "{p}");
                    bytes.extend(b);
                }
                other => panic!("piece {other}"),
            }
        }
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
    }
    assert!(split_pieces > 0, "some emoji split across tokens");

    // Special-token text is one token, unless `parse_special` is false.
    let ids = |body: serde_json::Value| json(server.post("/tokenize", &body.to_string()))["tokens"].clone();
    assert_eq!(
        ids(serde_json::json!({"content": "<|im_start|>"}))
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let literal = ids(serde_json::json!({"content": "<|im_start|>", "parse_special": false}));
    assert!(literal.as_array().unwrap().len() > 1, "{literal}");
    let back = json(server.post("/detokenize", &serde_json::json!({"tokens": literal}).to_string()));
    assert_eq!(back["content"], "<|im_start|>");
    // Mistakes are 400s naming the field.
    for (path, body, param) in [
        ("/tokenize", r#"{}"#, "content"),
        ("/detokenize", r#"{"tokens": [1, 999999999]}"#, "tokens[1]"),
        ("/tokenize", r#"{"content": "x", "model": "nope"}"#, "model"),
    ] {
        let (status, answer) = server.post(path, body);
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert!(status == 400 || status == 404, "{path} {body}: {answer}");
        assert_eq!(v["error"]["param"], param, "{answer}");
    }
}
