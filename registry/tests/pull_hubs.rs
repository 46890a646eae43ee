//! `berth pull` from Hugging Face and Ollama registries, against loopback servers that speak each
//! protocol: quant choice, safetensors repos, tokens, template and params layers, dropped
//! connections resumed with `Range`, wrong digests refused, and the store unchanged after failures.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_formats::testutil::{file_tree as tree, safetensors_bytes, sample_gguf, GgufWriter};
use berth_registry::hub::{pull_hub, HubOptions, HubRef, PullOutcome};
use berth_registry::{FileRole, PackManifest, PullError, PullOptions, Store};
use sha2::Digest as _;

// ---------------------------------------------------------------------------------------------
// A tiny HTTP/1.1 server: one request per connection, `Connection: close`.

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// What the handler answers.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Close the connection after this many body bytes (a dropped connection).
    cut_after: Option<usize>,
}

impl Reply {
    fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            cut_after: None,
        }
    }

    fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: b"{\"error\":\"nope\"}".to_vec(),
            cut_after: None,
        }
    }

    fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

/// A loopback server recording every request and the body bytes it sent per path.
struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    sent: Arc<Mutex<HashMap<String, usize>>>,
}

impl Server {
    fn start(handler: Arc<Handler>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(Mutex::new(HashMap::new()));
        let (seen2, sent2) = (seen.clone(), sent.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (handler, seen, sent) = (handler.clone(), seen2.clone(), sent2.clone());
                std::thread::spawn(move || serve(conn, &*handler, &seen, &sent));
            }
        });
        Server { url, seen, sent }
    }

    fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn requests_to(&self, prefix: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix))
            .collect()
    }

    fn bytes_sent(&self, path: &str) -> usize {
        self.sent.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn serve(
    mut conn: TcpStream,
    handler: &Handler,
    seen: &Mutex<Vec<Seen>>,
    sent: &Mutex<HashMap<String, usize>>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let req = Seen { path, headers };
    seen.lock().unwrap().push(req.clone());
    let reply = handler(&req);
    let reason = match reply.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Status",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reply.body.len()
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let n = reply.cut_after.unwrap_or(reply.body.len()).min(reply.body.len());
    let _ = conn.write_all(&reply.body[..n]);
    let _ = conn.flush();
    *sent.lock().unwrap().entry(req.path.clone()).or_default() += n;
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Serves `data` honouring a `Range: bytes=A-B` header (206), else whole (200).
fn ranged(req: &Seen, data: &[u8]) -> Reply {
    let Some(range) = req.header("range") else {
        return Reply::ok(data.to_vec());
    };
    let spec = range.strip_prefix("bytes=").expect("bytes range");
    let (a, b) = spec.split_once('-').unwrap();
    let a: usize = a.parse().unwrap();
    let b: usize = if b.is_empty() {
        data.len() - 1
    } else {
        b.parse().unwrap()
    };
    if a >= data.len() {
        return Reply::status(416);
    }
    let b = b.min(data.len() - 1);
    Reply {
        status: 206,
        headers: vec![("Content-Range".into(), format!("bytes {a}-{b}/{}", data.len()))],
        body: data[a..=b].to_vec(),
        cut_after: None,
    }
}

/// The start of a request's `Range`, if it had one.
fn range_start(req: &Seen) -> Option<usize> {
    req.header("range")?
        .strip_prefix("bytes=")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

fn sha256(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn git_sha1(bytes: &[u8]) -> String {
    use sha1::Digest as _;
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Fixtures.

struct Env {
    _dir: tempfile::TempDir,
    store: Store,
    opts: HubOptions,
}

fn env(hf: &str, ollama: &str) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        catalog: PullOptions {
            index: "http://127.0.0.1:9".into(),
            cache: dir.path().join("cache"),
        },
        hf_endpoint: hf.to_string(),
        hf_token: None,
        ollama_registry: ollama.to_string(),
        parallel_parts: 1,
        part_size: 1 << 20,
        retries: 0,
        retry_delay: Duration::from_millis(10),
        read_timeout: Duration::from_secs(10),
    };
    Env {
        store: Store::new(dir.path().join("home")),
        _dir: dir,
        opts,
    }
}

fn hub(reference: &str, opts: &HubOptions) -> HubRef {
    HubRef::parse(reference, opts).expect("a hub name").unwrap()
}

fn pull(e: &Env, reference: &str) -> Result<PullOutcome, PullError> {
    pull_hub(&e.store, &hub(reference, &e.opts), &e.opts, &mut |_| {})
}

/// The store holds nothing: no packs, and nothing left in its temporary folder.
fn assert_store_empty(e: &Env) {
    assert!(e.store.list().is_empty(), "{:?}", e.store.list());
    assert_eq!(tree(&e.store.home().join("packs")), Vec::<String>::new());
    assert_eq!(tree(&e.store.home().join("tmp")), Vec::<String>::new());
}

/// A GGUF whose `general.name` marks which file it is.
fn named_gguf(name: &str, template: Option<&str>) -> Vec<u8> {
    let mut w = GgufWriter::new()
        .str("general.architecture", "qwen2")
        .str("general.name", name)
        .kv("qwen2.context_length", berth_formats::gguf::GgufValue::U32(2048));
    if let Some(t) = template {
        w = w.str("tokenizer.chat_template", t);
    }
    w.tensor("token_embd.weight", &[64, 4], berth_formats::gguf::GgmlType::Q8_0)
        .tensor("output_norm.weight", &[64], berth_formats::gguf::GgmlType::F32)
        .build()
}

// ---------------------------------------------------------------------------------------------
// A Hugging Face hub: `/api/models/{repo}/tree/main`, `/{repo}/resolve/main/{path}` (LFS files
// redirect to `/cdn/{sha256}` as the real hub redirects to its CDN).

struct HfFile {
    path: String,
    data: Vec<u8>,
    lfs: bool,
    /// The sha256 the listing publishes (normally the data's).
    listed_sha256: String,
}

fn hf_file(path: &str, data: Vec<u8>, lfs: bool) -> HfFile {
    HfFile {
        path: path.into(),
        listed_sha256: sha256(&data),
        data,
        lfs,
    }
}

fn hf_server(repo: &'static str, files: Vec<HfFile>) -> Server {
    let files = Arc::new(files);
    Server::start(Arc::new(move |req: &Seen| {
        let tree = format!("/api/models/{repo}/tree/main?recursive=true");
        if req.path == tree {
            let entries: Vec<serde_json::Value> = files
                .iter()
                .map(|f| {
                    let mut v = serde_json::json!({
                        "type": "file", "path": f.path, "oid": git_sha1(&f.data), "size": f.data.len(),
                    });
                    if f.lfs {
                        v["size"] = 134.into();
                        v["lfs"] = serde_json::json!({"oid": f.listed_sha256, "size": f.data.len(), "pointerSize": 134});
                    }
                    v
                })
                .collect();
            return Reply::ok(serde_json::to_vec(&entries).unwrap());
        }
        if let Some(path) = req.path.strip_prefix(&format!("/{repo}/resolve/main/")) {
            return match files.iter().find(|f| f.path == path) {
                Some(f) if f.lfs => {
                    let mut r = Reply::status(302).header("Location", &format!("/cdn/{}", sha256(&f.data)));
                    r.body = Vec::new();
                    r.header("X-Linked-Etag", &format!("\"{}\"", sha256(&f.data)))
                }
                Some(f) => ranged(req, &f.data),
                None => Reply::status(404),
            };
        }
        if let Some(sha) = req.path.strip_prefix("/cdn/") {
            if let Some(f) = files.iter().find(|f| sha256(&f.data) == sha) {
                return ranged(req, &f.data);
            }
        }
        Reply::status(404)
    }))
}

fn gguf_repo() -> (Vec<u8>, Vec<u8>, Server) {
    let q8 = named_gguf("eight", Some("{{ messages }}"));
    let q4 = named_gguf("four", Some("{{ messages }} tools"));
    let server = hf_server(
        "acme/Tiny-GGUF",
        vec![
            hf_file("README.md", b"# tiny\n".to_vec(), false),
            hf_file("tiny-Q8_0.gguf", q8.clone(), true),
            hf_file("tiny-Q4_K_M.gguf", q4.clone(), true),
        ],
    );
    (q8, q4, server)
}

fn weights_sha(entry: &berth_registry::PackEntry) -> String {
    let m = PackManifest::load(&entry.dir).unwrap();
    let sha = m.weights().next().unwrap().sha256.clone().unwrap();
    sha
}

#[test]
fn hf_pull_by_quant_fetches_only_that_gguf_and_imports_it() {
    let (q8, _q4, server) = gguf_repo();
    let e = env(&server.url, "http://127.0.0.1:9");
    let mut events = Vec::new();
    let out = pull_hub(
        &e.store,
        &hub("hf.co/acme/Tiny-GGUF:q8_0", &e.opts),
        &e.opts,
        &mut |p| events.push(p.phase.clone()),
    )
    .unwrap();
    let PullOutcome::Pulled(entry) = out else {
        panic!("{out:?}")
    };
    assert_eq!(entry.reference, "acme/tiny-gguf:q8_0");
    assert!(entry.is_ok(), "{:?}", entry.problems);
    // The name it was pulled by finds it too (as `ollama run hf.co/...` does after a pull).
    for name in [
        "hf.co/acme/Tiny-GGUF:q8_0",
        "hf.co/acme/Tiny-GGUF:Q8_0",
        "acme/tiny-gguf:q8_0",
    ] {
        assert_eq!(
            e.store.get(name).unwrap().reference,
            "acme/tiny-gguf:q8_0",
            "{name}"
        );
    }
    assert!(e.store.get("hf.co/acme/Tiny-GGUF:Q4_K_M").is_err());
    assert_eq!(weights_sha(&entry), sha256(&q8));
    let m = PackManifest::load(&entry.dir).unwrap();
    assert_eq!((m.family.as_str(), m.architecture.as_str()), ("qwen3", "qwen2"));
    let resolves: Vec<String> = server
        .requests_to("/acme/Tiny-GGUF/resolve/")
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(resolves, ["/acme/Tiny-GGUF/resolve/main/tiny-Q8_0.gguf"]);
    assert_eq!(server.requests_to("/cdn/").len(), 1);
    assert!(matches!(events.first(), Some(berth_registry::Phase::Manifest)));
    assert!(matches!(events.last(), Some(berth_registry::Phase::Success)));
    // No token configured: none sent.
    assert!(server
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_none()));
}

#[test]
fn hf_pull_without_a_quant_takes_q4_k_m() {
    let (_q8, q4, server) = gguf_repo();
    let e = env(&server.url, "http://127.0.0.1:9");
    let entry = pull(&e, "hf.co/acme/Tiny-GGUF").unwrap().entry().clone();
    assert_eq!(entry.reference, "acme/tiny-gguf:latest");
    assert_eq!(weights_sha(&entry), sha256(&q4));
    let m = PackManifest::load(&entry.dir).unwrap();
    assert!(m.has_capability("tools"), "{:?}", m.capabilities);
}

#[test]
fn hf_unknown_quant_lists_the_choices_and_fetches_nothing() {
    let (_q8, _q4, server) = gguf_repo();
    let e = env(&server.url, "http://127.0.0.1:9");
    let err = pull(&e, "hf.co/acme/Tiny-GGUF:Q2_K").unwrap_err().to_string();
    assert_eq!(
        err,
        "pull hf.co/acme/Tiny-GGUF:Q2_K: no GGUF file for quant Q2_K; choices: Q4_K_M, Q8_0"
    );
    assert!(server.requests_to("/acme/Tiny-GGUF/resolve/").is_empty());
    assert_store_empty(&e);
}

#[test]
fn hf_token_is_sent_as_a_bearer_token() {
    let (_q8, _q4, server) = gguf_repo();
    let mut e = env(&server.url, "http://127.0.0.1:9");
    e.opts.hf_token = Some("hf_secret".into());
    pull(&e, "hf.co/acme/Tiny-GGUF:Q8_0").unwrap();
    let reqs = server.requests();
    assert!(reqs.len() >= 3, "{reqs:?}");
    for r in &reqs {
        assert_eq!(r.header("authorization"), Some("Bearer hf_secret"), "{}", r.path);
    }
}

#[test]
fn hf_safetensors_repo_brings_config_tokenizer_and_template() {
    let config = serde_json::to_vec(&serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 512,
    }))
    .unwrap();
    let tok_config = serde_json::to_vec(&serde_json::json!({"chat_template": "{{ messages }}"})).unwrap();
    let weights = safetensors_bytes(&[("w", "F32", &[2, 2], vec![0u8; 16])], &[("format", "pt")]);
    let server = hf_server(
        "acme/tiny-st",
        vec![
            hf_file(".gitattributes", b"*.safetensors filter=lfs\n".to_vec(), false),
            hf_file("config.json", config.clone(), false),
            hf_file("tokenizer.json", b"{\"model\": {}}".to_vec(), false),
            hf_file("tokenizer_config.json", tok_config, false),
            hf_file("model.safetensors", weights.clone(), true),
            hf_file("README.md", b"hi".to_vec(), false),
        ],
    );
    let e = env(&server.url, "http://127.0.0.1:9");
    let entry = pull(&e, "huggingface.co/acme/tiny-st").unwrap().entry().clone();
    assert_eq!(entry.reference, "acme/tiny-st:latest");
    assert!(entry.is_ok(), "{:?}", entry.problems);
    let m = PackManifest::load(&entry.dir).unwrap();
    assert_eq!(m.format.as_str(), "safetensors");
    assert_eq!(m.family, "qwen3");
    assert_eq!(m.context_length, Some(512));
    let mut files: Vec<(String, FileRole)> = m.files.iter().map(|f| (f.path.clone(), f.role)).collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        files,
        [
            ("chat_template.jinja".to_string(), FileRole::Template),
            ("config.json".to_string(), FileRole::Config),
            ("model.safetensors".to_string(), FileRole::Weights),
            ("tokenizer.json".to_string(), FileRole::Tokenizer),
            ("tokenizer_config.json".to_string(), FileRole::Tokenizer),
        ]
    );
    assert_eq!(std::fs::read(entry.dir.join("config.json")).unwrap(), config);
    assert_eq!(
        std::fs::read(entry.dir.join("model.safetensors")).unwrap(),
        weights
    );
    assert!(server
        .requests_to("/acme/tiny-st/resolve/main/README.md")
        .is_empty());
}

#[test]
fn hf_sentence_transformers_repo_brings_the_module_folders_it_names() {
    let config = serde_json::to_vec(&serde_json::json!({
        "architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "max_position_embeddings": 2048,
    }))
    .unwrap();
    let modules = serde_json::to_vec(&serde_json::json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))
    .unwrap();
    let weights = safetensors_bytes(&[("embed", "F32", &[8, 4], vec![0u8; 128])], &[]);
    let dense = safetensors_bytes(&[("linear.weight", "F32", &[2, 4], vec![1u8; 32])], &[]);
    let server = hf_server(
        "acme/tiny-embed",
        vec![
            hf_file("config.json", config, false),
            hf_file("model.safetensors", weights, true),
            hf_file("tokenizer.json", b"{}".to_vec(), false),
            hf_file("modules.json", modules, false),
            hf_file(
                "sentence_bert_config.json",
                b"{\"max_seq_length\": 512}".to_vec(),
                false,
            ),
            hf_file(
                "1_Pooling/config.json",
                b"{\"pooling_mode_mean_tokens\": true}".to_vec(),
                false,
            ),
            hf_file("2_Dense/config.json", b"{\"in_features\": 4}".to_vec(), false),
            hf_file("2_Dense/model.safetensors", dense.clone(), true),
            hf_file("onnx/model.onnx", b"not a module".to_vec(), true),
        ],
    );
    let e = env(&server.url, "http://127.0.0.1:9");
    let entry = pull(&e, "hf.co/acme/tiny-embed").unwrap().entry().clone();
    assert!(entry.is_ok(), "{:?}", entry.problems);
    let m = PackManifest::load(&entry.dir).unwrap();
    assert_eq!(m.capabilities, ["embedding"]);
    assert_eq!(m.context_length, Some(512));
    let modules: Vec<&str> = m
        .files
        .iter()
        .filter(|f| f.role == FileRole::Module)
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(
        modules,
        [
            "1_Pooling/config.json",
            "2_Dense/config.json",
            "2_Dense/model.safetensors"
        ]
    );
    let weights: Vec<&str> = m.weights().map(|f| f.path.as_str()).collect();
    assert_eq!(weights, ["model.safetensors"]);
    assert_eq!(
        std::fs::read(entry.dir.join("2_Dense/model.safetensors")).unwrap(),
        dense
    );
    assert!(server
        .requests_to("/acme/tiny-embed/resolve/main/onnx/")
        .is_empty());
    // modules.json is fetched once: the second time it comes from the blob cache.
    assert_eq!(
        server
            .requests_to("/acme/tiny-embed/resolve/main/modules.json")
            .len(),
        1
    );
}

#[test]
fn hf_wrong_digest_is_refused_naming_both_digests_and_the_store_is_unchanged() {
    let good = named_gguf("good", None);
    let mut file = hf_file("tiny-Q8_0.gguf", good.clone(), true);
    file.listed_sha256 = sha256(b"something else");
    let server = hf_server("acme/bad", vec![file]);
    let e = env(&server.url, "http://127.0.0.1:9");
    let err = pull(&e, "hf.co/acme/bad").unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "tiny-Q8_0.gguf: sha256 {}, expected {}; the download was deleted and nothing was imported",
            sha256(&good),
            sha256(b"something else")
        )
    );
    assert_store_empty(&e);
    let blobs = tree(&e.opts.catalog.cache.join("blobs"));
    assert!(blobs.iter().all(|b| b.ends_with(".lock")), "{blobs:?}");
}

// ---------------------------------------------------------------------------------------------
// An Ollama registry: `/v2/{ns}/{name}/manifests/{tag}` and `/v2/{ns}/{name}/blobs/{digest}`.

struct OllamaModel {
    gguf: Vec<u8>,
    manifest: Vec<u8>,
    /// Blobs by `sha256:<hex>` (the digest the manifest lists).
    blobs: HashMap<String, Vec<u8>>,
}

const TEMPLATE: &str = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>{{ end }}";
const PARAMS: &str = r#"{"stop": ["<|im_end|>"], "temperature": 0.6, "num_ctx": 4096}"#;

fn ollama_model(gguf: Vec<u8>, model_digest_of: Option<&[u8]>) -> OllamaModel {
    let layer = |media: &str, data: &[u8]| serde_json::json!({"mediaType": media, "digest": format!("sha256:{}", sha256(data)), "size": data.len()});
    let config = br#"{"model_format":"gguf","model_family":"qwen2","file_type":"Q8_0"}"#.to_vec();
    let mut model_layer = layer("application/vnd.ollama.image.model", &gguf);
    let model_digest = format!("sha256:{}", sha256(model_digest_of.unwrap_or(&gguf)));
    model_layer["digest"] = model_digest.clone().into();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": layer("application/vnd.docker.container.image.v1+json", &config),
        "layers": [
            model_layer,
            layer("application/vnd.ollama.image.template", TEMPLATE.as_bytes()),
            layer("application/vnd.ollama.image.license", b"MIT"),
            layer("application/vnd.ollama.image.params", PARAMS.as_bytes()),
        ],
    });
    let mut blobs = HashMap::new();
    for data in [
        config,
        TEMPLATE.as_bytes().to_vec(),
        b"MIT".to_vec(),
        PARAMS.as_bytes().to_vec(),
    ] {
        blobs.insert(format!("sha256:{}", sha256(&data)), data);
    }
    blobs.insert(model_digest, gguf.clone());
    OllamaModel {
        gguf,
        manifest: serde_json::to_vec(&manifest).unwrap(),
        blobs,
    }
}

/// Serves `library/tiny:1b`; `cut` decides, per blob request (and its running count), whether to
/// drop the connection after that many bytes.
fn ollama_server(
    model: OllamaModel,
    cut: impl Fn(&Seen, usize) -> Option<usize> + Send + Sync + 'static,
) -> Server {
    let model = Arc::new(model);
    let blob_requests = AtomicUsize::new(0);
    Server::start(Arc::new(move |req: &Seen| {
        if req.path == "/v2/library/tiny/manifests/1b" {
            return Reply::ok(model.manifest.clone())
                .header(
                    "Content-Type",
                    "application/vnd.docker.distribution.manifest.v2+json",
                )
                .header(
                    "Docker-Content-Digest",
                    &format!("sha256:{}", sha256(&model.manifest)),
                );
        }
        if let Some(digest) = req.path.strip_prefix("/v2/library/tiny/blobs/") {
            let Some(data) = model.blobs.get(digest) else {
                return Reply::status(404);
            };
            let n = blob_requests.fetch_add(1, Ordering::SeqCst);
            let mut reply = ranged(req, data);
            if data == &model.gguf {
                reply.cut_after = cut(req, n);
            }
            return reply;
        }
        Reply::status(404)
    }))
}

fn model_blob_path(m: &OllamaModel) -> String {
    format!("/v2/library/tiny/blobs/sha256:{}", sha256(&m.gguf))
}

#[test]
fn ollama_pull_imports_the_gguf_with_template_params_and_license() {
    let model = ollama_model(named_gguf("tiny", Some("{{ messages }}")), None);
    let gguf = model.gguf.clone();
    let server = ollama_server(model, |_, _| None);
    let e = env("http://127.0.0.1:9", &server.url);
    let entry = pull(&e, "ollama.com/library/tiny:1b").unwrap().entry().clone();
    assert_eq!(entry.reference, "tiny:1b");
    assert!(entry.is_ok(), "{:?}", entry.problems);
    let m = PackManifest::load(&entry.dir).unwrap();
    assert_eq!(m.family, "qwen3");
    assert_eq!(weights_sha(&entry), sha256(&gguf));
    // The GGUF's own Jinja template serves chat; Ollama's Go template is kept beside it.
    assert!(m.has_capability("chat"), "{:?}", m.capabilities);
    assert!(m
        .files
        .iter()
        .all(|f| f.role != FileRole::Template || f.path.ends_with(".jinja")));
    assert_eq!(
        std::fs::read_to_string(entry.dir.join("ollama.template")).unwrap(),
        TEMPLATE
    );
    assert_eq!(
        std::fs::read_to_string(entry.dir.join("params.json")).unwrap(),
        PARAMS
    );
    assert_eq!(std::fs::read_to_string(entry.dir.join("LICENSE")).unwrap(), "MIT");
    assert!(entry.dir.join("ollama-config.json").is_file());
    assert_eq!(m.defaults["temperature"].as_float(), Some(0.6));
    assert_eq!(m.defaults["num_ctx"].as_integer(), Some(4096));
    assert_eq!(
        m.defaults["stop"].as_array().unwrap()[0].as_str(),
        Some("<|im_end|>")
    );
    let manifest_req = &server.requests_to("/v2/library/tiny/manifests/")[0];
    assert_eq!(
        manifest_req.header("accept"),
        Some("application/vnd.docker.distribution.manifest.v2+json")
    );
    // The same model by the registry's own host name lands under the same reference.
    let direct = hub(
        &format!("{}/library/tiny:1b", server.url.trim_start_matches("http://")),
        &e.opts,
    );
    assert_eq!(direct.local_ref().unwrap().to_string(), "tiny:1b");
}

#[test]
fn pulling_an_installed_pack_says_so_and_fetches_nothing() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let server = ollama_server(model, |_, _| None);
    let e = env("http://127.0.0.1:9", &server.url);
    assert!(matches!(
        pull(&e, "ollama.com/library/tiny:1b").unwrap(),
        PullOutcome::Pulled(_)
    ));
    let before = server.requests().len();
    let again = pull(&e, "ollama.com/library/tiny:1b").unwrap();
    let PullOutcome::AlreadyInstalled(entry) = again else {
        panic!("{again:?}")
    };
    assert_eq!(entry.reference, "tiny:1b");
    assert_eq!(server.requests().len(), before);
}

#[test]
fn a_dropped_connection_leaves_the_store_unchanged_and_the_next_pull_resumes_with_range() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let size = model.gguf.len();
    let blob = model_blob_path(&model);
    let half = size / 2;
    let dropping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = dropping.clone();
    let server = ollama_server(model, move |_, _| flag.load(Ordering::SeqCst).then_some(half));
    let e = env("http://127.0.0.1:9", &server.url);

    let err = pull(&e, "ollama.com/library/tiny:1b").unwrap_err().to_string();
    assert!(
        err.contains(&format!("connection closed after {half} of {size} bytes"))
            || err.contains("connection lost"),
        "{err}"
    );
    assert_store_empty(&e);
    let partial: PathBuf = e
        .opts
        .catalog
        .cache
        .join("blobs")
        .join(format!("sha256-{}.partial", &blob[blob.len() - 64..]));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), half as u64);
    assert_eq!(server.bytes_sent(&blob), half);

    dropping.store(false, Ordering::SeqCst);
    let entry = pull(&e, "ollama.com/library/tiny:1b").unwrap().entry().clone();
    assert!(entry.is_ok(), "{:?}", entry.problems);
    let model_reqs = server.requests_to(&blob);
    assert_eq!(model_reqs.len(), 2);
    assert_eq!(model_reqs[0].header("range"), None);
    assert_eq!(range_start(&model_reqs[1]), Some(half), "{:?}", model_reqs[1]);
    // Every byte crossed the wire once.
    assert_eq!(server.bytes_sent(&blob), size);
    assert!(!partial.exists());
}

#[test]
fn parallel_parts_resume_within_one_pull_after_drops() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let size = model.gguf.len();
    let blob = model_blob_path(&model);
    let part = size.div_ceil(4);
    // Every part's first request is cut half-way; the retry continues where it stopped.
    let firsts = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let server = ollama_server(model, move |req, _| {
        let start = range_start(req).unwrap_or(0);
        let part_start = start.is_multiple_of(part);
        (part_start && firsts.lock().unwrap().insert(start)).then(|| {
            let len = req.header("range").map_or(size, |r| {
                let (a, b) = r.trim_start_matches("bytes=").split_once('-').unwrap();
                b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1
            });
            len / 2
        })
    });
    let mut e = env("http://127.0.0.1:9", &server.url);
    e.opts.parallel_parts = 4;
    e.opts.part_size = part as u64;
    e.opts.retries = 2;
    let entry = pull(&e, "ollama.com/library/tiny:1b").unwrap().entry().clone();
    assert!(entry.is_ok(), "{:?}", entry.problems);
    let starts: Vec<usize> = server.requests_to(&blob).iter().filter_map(range_start).collect();
    assert_eq!(starts.len(), 8, "{starts:?}");
    assert_eq!(server.bytes_sent(&blob), size);
    assert_eq!(
        tree(&e.opts.catalog.cache.join("blobs"))
            .iter()
            .filter(|f| f.contains("partial"))
            .count(),
        0
    );
}

#[test]
fn a_server_without_ranges_falls_back_to_one_stream() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let gguf = model.gguf.clone();
    let blob = model_blob_path(&model);
    let model = Arc::new(model);
    let m = model.clone();
    // Ignores `Range` entirely.
    let server = Server::start(Arc::new(move |req: &Seen| {
        if req.path == "/v2/library/tiny/manifests/1b" {
            return Reply::ok(m.manifest.clone());
        }
        match req
            .path
            .strip_prefix("/v2/library/tiny/blobs/")
            .and_then(|d| m.blobs.get(d))
        {
            Some(data) => Reply::ok(data.clone()),
            None => Reply::status(404),
        }
    }));
    let mut e = env("http://127.0.0.1:9", &server.url);
    e.opts.parallel_parts = 4;
    e.opts.part_size = 64;
    let entry = pull(&e, "ollama.com/library/tiny:1b").unwrap().entry().clone();
    assert_eq!(weights_sha(&entry), sha256(&gguf));
    let last = server.requests_to(&blob).pop().unwrap();
    assert_eq!(last.header("range"), None);
}

#[test]
fn ollama_wrong_digest_is_refused_and_the_store_is_unchanged() {
    let gguf = named_gguf("tiny", None);
    let model = ollama_model(gguf.clone(), Some(b"other bytes"));
    let server = ollama_server(model, |_, _| None);
    let e = env("http://127.0.0.1:9", &server.url);
    let err = pull(&e, "ollama.com/library/tiny:1b").unwrap_err().to_string();
    let expected = sha256(b"other bytes");
    assert_eq!(
        err,
        format!(
            "model layer sha256:{}: sha256 {}, expected {expected}; the download was deleted and nothing was imported",
            &expected[..12],
            sha256(&gguf)
        )
    );
    assert_store_empty(&e);
    let blobs = tree(&e.opts.catalog.cache.join("blobs"));
    assert!(
        blobs
            .iter()
            .all(|b| !b.contains(&expected) || b.ends_with(".lock")),
        "{blobs:?}"
    );
}

#[test]
fn unknown_ollama_models_are_one_clear_line() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let server = ollama_server(model, |_, _| None);
    let e = env("http://127.0.0.1:9", &server.url);
    let err = pull(&e, "ollama.com/library/nope:1b").unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}/v2/library/nope/manifests/1b: HTTP status 404 Not Found (no such model or tag in the registry)",
            server.url
        )
    );
    assert_store_empty(&e);
}

#[test]
fn sample_gguf_still_imports_from_a_hub() {
    // The shared fixture GGUF (qwen2, with a size label) goes through a hub pull unchanged.
    let data = sample_gguf(Some("{{ messages }}"));
    let server = hf_server(
        "acme/sample",
        vec![hf_file("sample-Q4_K_M.gguf", data.clone(), true)],
    );
    let e = env(&server.url, "http://127.0.0.1:9");
    let entry = pull(&e, "hf.co/acme/sample:Q4_K_M").unwrap().entry().clone();
    assert_eq!(entry.reference, "acme/sample:q4_k_m");
    assert_eq!(std::fs::read(entry.dir.join("model.gguf")).unwrap(), data);
}

#[test]
fn concurrent_pulls_of_one_blob_share_the_cache_without_clobbering() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let gguf = model.gguf.clone();
    let blob = model_blob_path(&model);
    let server = ollama_server(model, |_, _| None);
    let a = env("http://127.0.0.1:9", &server.url);
    let mut b = env("http://127.0.0.1:9", &server.url);
    b.opts.catalog.cache = a.opts.catalog.cache.clone();
    std::thread::scope(|s| {
        let ta = s.spawn(|| pull(&a, "ollama.com/library/tiny:1b"));
        let tb = s.spawn(|| pull(&b, "ollama.com/library/tiny:1b"));
        for t in [ta, tb] {
            let entry = t.join().unwrap().unwrap().entry().clone();
            assert_eq!(weights_sha(&entry), sha256(&gguf));
        }
    });
    // The second pull found the first one's verified blob.
    assert_eq!(server.bytes_sent(&blob), gguf.len());
}

#[test]
fn a_full_disk_under_one_part_fails_the_pull_cleanly_and_a_pull_with_space_completes() {
    let model = ollama_model(named_gguf("tiny", None), None);
    let gguf = model.gguf.clone();
    let size = gguf.len();
    let key = format!("sha256-{}", sha256(&gguf));
    let blob = model_blob_path(&model);
    let server = ollama_server(model, |_, _| None);
    let mut e = env("http://127.0.0.1:9", &server.url);
    e.opts.parallel_parts = 4;
    e.opts.part_size = size.div_ceil(4) as u64;
    e.opts.retries = 2;
    let blobs = e.opts.catalog.cache.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    // The third of four parts lands on a full disk: its file is /dev/full, where every write
    // fails with a real ENOSPC from the kernel (no root needed).
    let full_part = blobs.join(format!("{key}.partial.2-of-4"));
    std::os::unix::fs::symlink("/dev/full", &full_part).unwrap();

    let err = pull(&e, "ollama.com/library/tiny:1b").unwrap_err();
    let message = err.to_string();
    println!("pull onto a full disk: {message}");
    assert!(
        message.contains("No space left on device") && message.contains(&*full_part.to_string_lossy()),
        "{message}"
    );
    // Nothing imported, no verified blob, and what the other parts left holds only the bytes the
    // server sent at the right offsets (a later pull resumes them and verifies the whole digest).
    assert_store_empty(&e);
    assert!(!blobs.join(&key).exists(), "{:?}", tree(&blobs));
    let chunk = size.div_ceil(4);
    for (i, name) in [
        (0, format!("{key}.partial")),
        (1, format!("{key}.partial.1-of-4")),
        (3, format!("{key}.partial.3-of-4")),
    ] {
        let Ok(bytes) = std::fs::read(blobs.join(&name)) else {
            continue;
        };
        let start = i * chunk;
        assert_eq!(
            bytes[..],
            gguf[start..start + bytes.len()],
            "{name} holds wrong bytes"
        );
    }
    // A local write error is final: the failed part was not retried.
    let third = (2 * chunk).to_string();
    let tries = server
        .requests_to(&blob)
        .iter()
        .filter(|r| {
            r.header("range")
                .is_some_and(|h| h.starts_with(&format!("bytes={third}-")))
        })
        .count();
    assert_eq!(tries, 1, "{:?}", server.requests_to(&blob));

    // Space freed: the part's file is an ordinary file again; the next pull completes.
    std::fs::remove_file(&full_part).unwrap();
    let entry = pull(&e, "ollama.com/library/tiny:1b").unwrap().entry().clone();
    assert!(entry.is_ok(), "{:?}", entry.problems);
    assert_eq!(weights_sha(&entry), sha256(&gguf));
    assert!(
        tree(&blobs).iter().all(|f| !f.contains("partial")),
        "{:?}",
        tree(&blobs)
    );
}
