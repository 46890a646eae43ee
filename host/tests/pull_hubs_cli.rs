//! `berth pull` of an Ollama-registry name and a Hugging Face name, end to end through the CLI,
//! against a loopback server speaking both protocols; a second pull says the pack is installed.
//! The Ollama model's params, system, messages and license layers reach the pack's manifest.

mod common;

use berth_registry::testutil::{sample_gguf, sha256_hex};
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::Arc;

/// The params layer of `library/tiny:1b` in the first test.
const PARAMS: &[u8] = br#"{"temperature": 0.3, "stop": ["<|im_end|>", "END"], "num_keep": 24}"#;

/// Serves `library/tiny:1b` (manifest + blobs, with `params` as its params layer) and
/// `acme/tiny` (tree + resolve); returns its URL.
fn start_hub(gguf: Vec<u8>, params: &[u8]) -> String {
    let template = b"{{ .Prompt }}".to_vec();
    let params = params.to_vec();
    let system = b"You are a tiny model.".to_vec();
    let messages =
        br#"[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]"#.to_vec();
    let license = b"MIT License".to_vec();
    let layer = |media: &str, data: &[u8]| serde_json::json!({"mediaType": media, "digest": format!("sha256:{}", sha256_hex(data)), "size": data.len()});
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "layers": [
            layer("application/vnd.ollama.image.model", &gguf),
            layer("application/vnd.ollama.image.template", &template),
            layer("application/vnd.ollama.image.params", &params),
            layer("application/vnd.ollama.image.system", &system),
            layer("application/vnd.ollama.image.messages", &messages),
            layer("application/vnd.ollama.image.license", &license),
        ],
    }))
    .unwrap();
    let tree = serde_json::to_vec(&serde_json::json!([{
        "type": "file", "path": "tiny-Q4_K_M.gguf", "oid": "0".repeat(40), "size": 134,
        "lfs": {"oid": sha256_hex(&gguf), "size": gguf.len(), "pointerSize": 134},
    }]))
    .unwrap();
    let gguf = Arc::new(gguf);
    let mut routes: Vec<(String, Arc<Vec<u8>>)> = vec![
        ("/v2/library/tiny/manifests/1b".into(), Arc::new(manifest)),
        (
            "/api/models/acme/tiny/tree/main?recursive=true".into(),
            Arc::new(tree),
        ),
        ("/acme/tiny/resolve/main/tiny-Q4_K_M.gguf".into(), gguf.clone()),
    ];
    routes.push((
        format!("/v2/library/tiny/blobs/sha256:{}", sha256_hex(&gguf)),
        gguf,
    ));
    for data in [template, params, system, messages, license].map(Arc::new) {
        routes.push((
            format!("/v2/library/tiny/blobs/sha256:{}", sha256_hex(&data)),
            data,
        ));
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match routes.iter().find(|(p, _)| p == path) {
                Some((_, b)) => ("200 OK", b.clone()),
                None => ("404 Not Found", Arc::new(b"{}".to_vec())),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(&body);
        }
    });
    url
}

fn run(dir: &std::path::Path, hub: &str, args: &[&str]) -> Output {
    Command::new(berth_exe())
        .args(args)
        .env("BERTH_HOME", dir.join("home"))
        .env("BERTH_CACHE", dir.join("cache"))
        .env("BERTH_OLLAMA_REGISTRY", hub)
        .env("HF_ENDPOINT", hub)
        .env_remove("HF_TOKEN")
        .env("HF_HOME", dir.join("hf"))
        .env_remove("BERTH_PLUGIN_PATH")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn cli_pulls_from_an_ollama_registry_and_hugging_face_then_reports_installed_packs() {
    let dir = tempfile::Builder::new()
        .prefix("berth-pull-hubs-")
        .tempdir()
        .unwrap();
    let hub = start_hub(sample_gguf(Some("{{ messages }}")), PARAMS);

    let out = run(dir.path(), &hub, &["pull", "ollama.com/library/tiny:1b"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("pulled 'tiny:1b' into "), "{stdout}");
    for status in [
        "pulling manifest",
        "(1/6)",
        "(6/6)",
        "verifying sha256 digest",
        "success",
    ] {
        assert!(stderr.contains(status), "{status} missing from {stderr}");
    }
    // The text layers reach the manifest: the lead's defaults, system prompt and messages apply.
    let show = run(dir.path(), &hub, &["show", "tiny:1b", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    let m = &shown["manifest"];
    assert_eq!(m["system"], "You are a tiny model.");
    assert_eq!(m["license"], "MIT License");
    assert_eq!(
        m["messages"],
        serde_json::json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])
    );
    assert_eq!(m["defaults"]["stop"], serde_json::json!(["<|im_end|>", "END"]));
    assert_eq!(m["defaults"]["temperature"], 0.3);
    let modelfile = text(&run(dir.path(), &hub, &["show", "tiny:1b", "--modelfile"]).stdout);
    for line in [
        "FROM tiny:1b\n",
        "SYSTEM \"\"\"You are a tiny model.\"\"\"\n",
        "PARAMETER stop \"END\"\n",
        "# (not supported by Berth) PARAMETER num_keep 24\n",
        "MESSAGE assistant Hello!\n",
    ] {
        assert!(modelfile.contains(line), "{line:?} missing from {modelfile}");
    }

    let again = run(dir.path(), &hub, &["pull", "ollama.com/library/tiny:1b"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).starts_with("'tiny:1b' is already installed in "),
        "{}",
        text(&again.stdout)
    );

    let out = run(dir.path(), &hub, &["pull", "hf.co/acme/tiny"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("pulled 'acme/tiny:latest' into "));

    let bad = run(dir.path(), &hub, &["pull", "hf.co/acme/tiny:Q8_0"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("no GGUF file for quant Q8_0; choices: Q4_K_M"),
        "{}",
        text(&bad.stderr)
    );

    let list: serde_json::Value =
        serde_json::from_slice(&run(dir.path(), &hub, &["list", "--json"]).stdout).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme/tiny:latest", "tiny:1b"]);
}

/// The real Qwen2.5-Coder GGUF pulled from the loopback registry with params, a system prompt and
/// messages: served, they apply (the same prompt and greedy reply as a plain import of the GGUF
/// given the same values by the request), and the request's own values win.
#[test]
fn a_pulled_packs_parameters_system_prompt_and_messages_apply_when_served() {
    let dir = tempfile::Builder::new()
        .prefix("berth-pull-applies-")
        .tempdir()
        .unwrap();
    let qwen = real_model("qwen2.5-coder-0.5b");
    let hub = start_hub(
        std::fs::read(&qwen).unwrap(),
        br#"{"temperature": 0, "num_predict": 5, "stop": ["<|im_end|>"]}"#,
    );
    let out = run(dir.path(), &hub, &["pull", "ollama.com/library/tiny:1b"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let home = dir.path().join("home");
    let plugin = plugin_library("qwen3");
    for args in [
        vec!["plugins", "install", plugin.to_str().unwrap()],
        vec!["import", qwen.to_str().unwrap(), "--name", "plain:latest"],
    ] {
        let out = run(dir.path(), &hub, &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let server = TestServer::start(&home, &[]);
    let question = serde_json::json!({"role": "user", "content": "Write a haiku about the sea."});
    let pulled = server.post_ok(
        "/api/chat",
        &serde_json::json!({"model": "tiny:1b", "messages": [question], "stream": false}),
    );
    let plain = server.post_ok("/api/chat",
        &serde_json::json!({"model": "plain", "stream": false,
            "messages": [{"role": "system", "content": "You are a tiny model."},
                         {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, question],
            "options": {"temperature": 0, "num_predict": 5}}),
    );
    assert_eq!(
        pulled["prompt_eval_count"], plain["prompt_eval_count"],
        "{pulled}\n{plain}"
    );
    assert_eq!(
        pulled["message"]["content"], plain["message"]["content"],
        "{pulled}\n{plain}"
    );
    assert_eq!(
        (pulled["eval_count"].as_u64(), pulled["done_reason"].as_str()),
        (Some(5), Some("length")),
        "{pulled}"
    );
    // The request's own values win over the pack's.
    let longer = server.post_ok("/api/chat",
        &serde_json::json!({"model": "tiny:1b", "messages": [question], "stream": false, "options": {"num_predict": 9}}),
    );
    assert_eq!(longer["eval_count"].as_u64(), Some(9), "{longer}");
}
