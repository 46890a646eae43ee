//! Helpers shared by the host's integration tests: the built binary, plugin libraries, packs.

#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The `berth` binary under test.
pub fn berth_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_berth"))
}

/// Runs `berth` with a home directory and extra environment; returns the output.
pub fn berth(home: &Path, plugin_path: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(berth_exe());
    cmd.args(args)
        .env("BERTH_HOME", home)
        .env_remove("BERTH_PLUGIN_PATH");
    if let Some(p) = plugin_path {
        cmd.env("BERTH_PLUGIN_PATH", p);
    }
    cmd.output().expect("berth runs")
}

/// Stdout of a successful `berth` run; panics with stderr otherwise.
pub fn berth_ok(home: &Path, plugin_path: Option<&Path>, args: &[&str]) -> String {
    let out = berth(home, plugin_path, args);
    assert!(
        out.status.success(),
        "berth {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A workspace plugin's shared library (`libberth_<name>.so`), built by cargo next to the test
/// binary (the plugins are dev-dependencies of the host, so `cargo test` builds them).
pub fn plugin_library(name: &str) -> PathBuf {
    let dir = berth_exe().parent().unwrap().to_path_buf();
    let file = format!("libberth_{name}.so");
    // A dev-dependency build refreshes only deps/; target/debug/ holds the copy of the last
    // `cargo build -p <plugin>` (or --workspace). The newer one is the current source.
    let newest = [dir.join(&file), dir.join("deps").join(&file)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    if let Some((_, p)) = newest {
        return p;
    }
    panic!(
        "{file} not found next to {}; run `cargo build --workspace` first",
        dir.display()
    );
}

/// The plugin directory of a test home, `<home>/plugins`, where `berth plugins install` puts the
/// libraries `plugin_library` found (the build under test). End-to-end tests name it in
/// `BERTH_PLUGIN_PATH`, which is searched first: plugins installed next to the binary
/// (`target/debug/lib/berth/plugins`) come later and lose the tie.
pub fn home_plugins(home: &Path) -> PathBuf {
    home.join("plugins")
}

/// The scripted plugin's shared library.
pub fn scripted_library() -> PathBuf {
    plugin_library("scripted")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The trimmed stdout of one of the repo's scripts (`scripts/NAME ARGS`); panics with its stderr
/// when it fails.
pub fn script_stdout(name: &str, args: &[&str]) -> String {
    let out = Command::new(repo_root().join("scripts").join(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("scripts/{name} runs: {e}"));
    assert!(
        out.status.success(),
        "scripts/{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Path of a real model, fetched (or found in the cache) by the repo's own script.
pub fn real_model(name: &str) -> PathBuf {
    PathBuf::from(script_stdout("fetch-models", &[name]))
}

/// The python of the venv with the official `openai` and `ollama` client packages
/// (scripts/python-test-deps, made once per machine).
pub fn client_python() -> PathBuf {
    static PY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PY.get_or_init(|| PathBuf::from(script_stdout("python-test-deps", &[])))
        .clone()
}

/// The client libraries of the client matrix (tests/clients/matrix.py), from
/// scripts/client-deps (installed once per machine under `$BERTH_CACHE/clients`).
pub struct ClientDeps {
    /// The python of the main venv (openai, anthropic, ollama, LangChain, LiteLLM, pydantic-ai,
    /// openai-agents); it also runs the matrix.
    pub py: PathBuf,
    /// The python of instructor's own venv.
    pub instructor: PathBuf,
    /// The folder whose node_modules holds the JavaScript libraries.
    pub npm: PathBuf,
}

/// scripts/client-deps' paths, or `None` after a recorded skip when node/npm are missing or the
/// libraries cannot be installed (under CI both fail the test instead: CI always has them).
pub fn client_deps() -> Option<ClientDeps> {
    use berth_registry::test_skip::skip_unless_ci;
    for tool in ["node", "npm"] {
        let found = Command::new(tool).arg("--version").output();
        if !found.is_ok_and(|o| o.status.success()) {
            skip_unless_ci(&format!(
                "no `{tool}` on PATH (the client matrix runs JavaScript clients)"
            ));
            return None;
        }
    }
    let out = Command::new(repo_root().join("scripts/client-deps"))
        .output()
        .unwrap_or_else(|e| panic!("scripts/client-deps runs: {e}"));
    if !out.status.success() {
        skip_unless_ci(&format!(
            "scripts/client-deps could not install the client libraries: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return None;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("scripts/client-deps printed no {key}=: {stdout}"))
    };
    Some(ClientDeps {
        py: path("py"),
        instructor: path("instructor"),
        npm: path("npm"),
    })
}

/// Hex sha256 of a file.
pub fn sha256_file(p: &Path) -> String {
    let bytes = std::fs::read(p).unwrap();
    format!("{:x}", Sha256::digest(&bytes))
}

/// Writes a scripted pack directory (pack.toml + script.json) ready for `berth import`.
pub fn write_scripted_pack(dir: &Path, name: &str, tag: &str, script: &serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let script_path = dir.join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let size = std::fs::metadata(&script_path).unwrap().len();
    let sha = sha256_file(&script_path);
    let toml = format!(
        "name = \"{name}\"\ntag = \"{tag}\"\nfamily = \"scripted\"\narchitecture = \"scripted\"\nformat = \"script\"\ncapabilities = [\"completion\"]\n\n[[files]]\npath = \"script.json\"\nrole = \"weights\"\nsize = {size}\nsha256 = \"{sha}\"\n"
    );
    std::fs::write(dir.join("pack.toml"), toml).unwrap();
}

/// Starts a configured `berth serve --port 0` command (stdout piped, stderr inherited) and
/// returns the child, the address from its first line (`berth serve listening on ADDRESS`) and
/// the port.
pub fn spawn_serve(cmd: &mut Command) -> (Child, String, u16) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("berth serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .strip_prefix("berth serve listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from berth serve: {line:?}"))
        .to_string();
    let port = address.rsplit(':').next().and_then(|p| p.parse().ok());
    let port = port.unwrap_or_else(|| panic!("no port in berth serve's address {address:?}"));
    (child, address, port)
}

/// Writes a byte-level tokenizer into a scripted pack: token id = byte value, then the `added`
/// special tokens from 256 on (the first is the end of sequence), and optionally a chat template.
pub fn write_byte_tokenizer(dir: &Path, added: &[&str], chat_template: Option<&str>) {
    let vocab: serde_json::Map<String, serde_json::Value> = berth::tokenizer::byte_level_alphabet()
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
        .collect();
    let added_tokens: Vec<serde_json::Value> = added
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
        "use_regex": true});
    let tj = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab,
            "merges": []}});
    std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
    let mut config = serde_json::json!({"eos_token": added.first()});
    if let Some(t) = chat_template {
        config["chat_template"] = t.into();
    }
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// The byte-level tokenizer's ids of a text.
pub fn byte_tokens(text: &str) -> Vec<i32> {
    text.bytes().map(i32::from).collect()
}

/// A fresh Berth home (`prefix` names its temp dir) with the qwen3 plugin under test installed
/// and Qwen2.5-Coder 0.5B imported as `name`.
pub fn home_with_qwen(prefix: &str, name: &str) -> tempfile::TempDir {
    let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let dir = tmp.path();
    berth_ok(
        dir,
        None,
        &["plugins", "install", plugin_library("qwen3").to_str().unwrap()],
    );
    let qwen = real_model("qwen2.5-coder-0.5b");
    berth_ok(dir, None, &["import", qwen.to_str().unwrap(), "--name", name]);
    tmp
}

/// A Berth home (`prefix` names its directory, kept after the test) with the `plugins` under test
/// installed and each real model of `packs` (its file or folder under the models cache, its
/// reference) imported (importing hard-links, so this is cheap after the first fetch).
pub fn home_with(prefix: &str, plugins: &[&str], packs: &[(&str, &str)]) -> PathBuf {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap().keep();
    for plugin in plugins {
        berth_ok(
            &dir,
            None,
            &["plugins", "install", plugin_library(plugin).to_str().unwrap()],
        );
    }
    for (file, name) in packs {
        let path = real_model(file);
        berth_ok(&dir, None, &["import", path.to_str().unwrap(), "--name", name]);
    }
    dir
}

/// A Berth home (`prefix` names its directory, kept after the test) with the qwen3 and gemma
/// plugins under test installed and both real models imported as `qwen2.5-coder:0.5b` and
/// `gemma3:270m`.
pub fn real_models_home(prefix: &str) -> PathBuf {
    home_with(
        prefix,
        &["qwen3", "gemma"],
        &[
            ("qwen2.5-coder-0.5b", "qwen2.5-coder:0.5b"),
            ("gemma3-270m", "gemma3:270m"),
        ],
    )
}

/// A plain HTTP/1.1 request with a JSON body to a loopback port; returns (status, body).
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A server refusing a large body may close before reading it all: the answer counts.
    let _ = std::io::Write::write_all(
        &mut s,
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let mut resp = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut resp);
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status = resp.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A running `berth serve --port 0` over a test home, killed on drop.
pub struct TestServer {
    /// The server process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The port it listens on.
    pub port: u16,
}

impl TestServer {
    /// Serves `home` with `extra` flags; the plugins the home installed (the build under test)
    /// come first on the search path.
    pub fn start(home: &Path, extra: &[&str]) -> TestServer {
        let (child, base, port) = spawn_serve(
            Command::new(berth_exe())
                .args(["serve", "--port", "0"])
                .args(extra)
                .env("BERTH_HOME", home)
                .env("BERTH_PLUGIN_PATH", home_plugins(home))
                .env_remove("BERTH_CORS_ORIGINS")
                .env("BERTH_LOG", "info"),
        );
        TestServer { child, base, port }
    }

    /// A plain HTTP/1.1 request with a JSON body; returns (status, body).
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        http_request(self.port, method, path, body.unwrap_or(""))
    }

    /// A POST with a JSON body; returns (status, body).
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.http("POST", path, Some(body))
    }

    /// A POST whose answer must be a 200 JSON body; returns that body.
    pub fn post_ok(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let (status, text) = self.post(path, &body.to_string());
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Sends raw bytes and returns the whole answer (head and body) as text.
    pub fn raw(&self, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let _ = std::io::Write::write_all(&mut s, request.as_bytes());
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
        out
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the scripted rewind model ([`import_rewind_model`]) answers by default.
pub const REWIND_MODEL_REPLY: &str = "done";
/// The rewind model answers a prompt containing this with [`long_reply`]: long enough (with its
/// step delay) to still be streaming while other requests come and go.
pub const LONG_TRIGGER: &str = "LONG";

/// The rewind model's answer to [`LONG_TRIGGER`].
pub fn long_reply() -> String {
    "0123456789".repeat(30)
}

/// Imports a scripted pack `name:latest` for the rewind and prefix-sharing tests: its model
/// reports the rewind rule `rewind`, its `seq_truncate` enforces `enforce`, `seq_fork` fails when
/// `refuse_fork`, every `seq_truncate` call is logged, and it answers [`REWIND_MODEL_REPLY`] (or
/// [`long_reply`] to [`LONG_TRIGGER`]) at 5 ms a step. Returns the log's path.
pub fn import_rewind_model(
    home: &Path,
    name: &str,
    rewind: serde_json::Value,
    enforce: serde_json::Value,
    refuse_fork: bool,
) -> PathBuf {
    import_rewind_model_paced(home, name, rewind, enforce, refuse_fork, Pacing::StepDelay(5))
}

/// How a scripted model's decode steps are paced.
#[derive(Clone, Copy, Debug)]
pub enum Pacing<'a> {
    /// Every step sleeps this many milliseconds.
    StepDelay(u64),
    /// Steps run at full speed, except that every step waits while this file exists (a test
    /// holds the model at a state it observes, then releases it).
    Held(&'a Path),
}

/// [`import_rewind_model`] with its decode steps paced by `pacing`.
pub fn import_rewind_model_paced(
    home: &Path,
    name: &str,
    rewind: serde_json::Value,
    enforce: serde_json::Value,
    refuse_fork: bool,
    pacing: Pacing<'_>,
) -> PathBuf {
    let log = home.join(format!("{name}-truncates.jsonl"));
    let src = home.join(format!("src-{name}"));
    let mut script = serde_json::json!({
        "stop_tokens": [256],
        "rewind": rewind,
        "enforce_rewind": enforce,
        "refuse_fork": refuse_fork,
        "truncate_log": log,
        "entries": [
            {"trigger": byte_tokens(LONG_TRIGGER), "reply": byte_tokens(&long_reply())},
            {"reply": byte_tokens(REWIND_MODEL_REPLY)},
        ],
    });
    match pacing {
        Pacing::StepDelay(ms) => script["step_delay_ms"] = ms.into(),
        Pacing::Held(hold) => script["hold_file"] = hold.to_str().unwrap().into(),
    }
    write_scripted_pack(&src, name, "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], None);
    berth_ok(home, None, &["import", src.to_str().unwrap()]);
    log
}

/// A chat template that writes each message as `role: content`.
pub const PLAIN_TEMPLATE: &str =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

/// A fresh Berth home (`prefix` names its temp dir) with the scripted plugin and the pack
/// `held:latest`, whose model answers "fine" and waits (at creation and in every decode) while
/// `hold` exists.
pub fn home_with_held_model(prefix: &str, hold: &Path) -> tempfile::TempDir {
    let home = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    berth_ok(
        home.path(),
        None,
        &["plugins", "install", scripted_library().to_str().unwrap()],
    );
    let src = home.path().join("src");
    let script = serde_json::json!({"stop_tokens": [256], "hold_file": hold,
        "entries": [{"reply": byte_tokens("fine")}]});
    write_scripted_pack(&src, "held", "latest", &script);
    write_byte_tokenizer(&src, &["<|end|>"], Some(PLAIN_TEMPLATE));
    berth_ok(home.path(), None, &["import", src.to_str().unwrap()]);
    home
}

/// The text of a Responses answer's message items, in order.
pub fn responses_text(v: &serde_json::Value) -> String {
    v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap_or(""))
        .collect()
}
