//! Tiny vision packs that serve: the random-weight LFM2-VL and MiniCPM-V 4.6 reference models
//! (`../shared/fixtures/reference-tiny-vision/{lfm2_vl,minicpmv4_6}`, vocabulary 512) made into
//! packs and driven through the real `berth serve` by the official `openai` and `ollama` clients
//! (tests/serve/vision_pack_checks.py): an image as a data URL, as an http URL served here on the
//! loopback interface and as Ollama `images`; `usage.prompt_tokens` holding the image's
//! placeholder; the same image bytes again reusing the prefix past the image, other bytes not; a
//! corrupt image a 400 after which the server keeps serving.
//!
//! The packs are made and imported by scripts/lib/tiny_vision_pack.py, which the soak
//! (scripts/load-test --soak) uses too. Tokenizers: derived from the committed 512-token tiny
//! tokenizer (`tests/fixtures/tiny-packs/tokenizer.json`, scripts/gen-tiny-tokenizer): the last
//! merges give their ids to the vision markers the host inserts (so every marker is one token and
//! the vocabulary stays exactly 512), then the image token swaps ids with whatever holds the
//! config's `image_token_id`; checked here against the markers and placeholder the host builds.
//! Templates: no LFM2-VL or MiniCPM-V 4.6 chat template is available, so each pack gets its
//! backbone's real one (LFM2's `lfm2.jinja`, Qwen3.5's `qwen3_5.jinja`); the host turns image parts
//! into text before rendering, so any text template carries them.
//!
//! Random weights answer gibberish: only status, structure, usage and equalities are asserted.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;

/// Server tests run one at a time (two shared cores).
static SERIAL: Mutex<()> = Mutex::new(());

/// The image sent (64×48 PNG), a different one (same size, GIF) and a broken one.
const IMAGE: &str = "fmt.png";
const OTHER: &str = "fmt.gif";
const CORRUPT: &str = "corrupt.png";
/// The user's text after the image: long enough that a prefill chunk boundary (64 tokens) falls
/// after the image's placeholder, so the same image again is reused past its last image token.
const TEXT: &str = "What is this? Please describe the picture in one sentence, then tell me a short \
    story about a little house by the river, an old man and his cat, the market where he buys \
    bread, milk and apples every morning, and the warm light of the fire in the cold winter \
    evenings.";

/// One tiny vision model made into a pack.
struct TinyVision {
    /// Directory under `reference-tiny-vision/` (the model scripts/lib/tiny_vision_pack.py takes).
    model: &'static str,
    /// The workspace plugin serving it (`libberth_<plugin>.so`).
    plugin: &'static str,
    /// Pack name given to `berth import --name`.
    name: &'static str,
    /// Architecture `berth import` must record.
    architecture: &'static str,
    /// The image token's text, as the model's processor writes it.
    image_token: &'static str,
}

const LFM2_VL: TinyVision = TinyVision {
    model: "lfm2_vl",
    plugin: "lfm2",
    name: "tiny-lfm2-vl:test",
    architecture: "lfm2_vl",
    image_token: "<image>",
};

const MINICPMV4_6: TinyVision = TinyVision {
    model: "minicpmv4_6",
    plugin: "minicpm_v",
    name: "tiny-minicpm-v4.6:test",
    architecture: "minicpmv4_6",
    image_token: "<unk>",
};

impl TinyVision {
    fn reference(&self) -> PathBuf {
        let dir = repo_root()
            .join("../shared/fixtures/reference-tiny-vision")
            .join(self.model);
        assert!(
            dir.join("model.safetensors").is_file(),
            "tiny vision model missing: {}",
            dir.display()
        );
        dir
    }

    fn config(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.reference().join("config.json")).unwrap()).unwrap()
    }

    fn image_token_id(&self) -> u32 {
        self.config()["image_token_id"].as_u64().unwrap() as u32
    }

    /// The markers the host's preprocessing writes around and between image tokens, besides
    /// the image token itself: LFM2-VL's (tile markers for grids up to 3×3) or MiniCPM-V's.
    fn markers(&self) -> Vec<String> {
        if self.model == "lfm2_vl" {
            let mut m: Vec<String> = ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
                .map(String::from)
                .to_vec();
            for r in 1..=3 {
                for c in 1..=3 {
                    m.push(format!("<|img_row_{r}_col_{c}|>"));
                }
            }
            m
        } else {
            [
                "<image>",
                "</image>",
                "<slice>",
                "</slice>",
                "<image_id>",
                "</image_id>",
            ]
            .map(String::from)
            .to_vec()
        }
    }

    /// The image's placeholder as the host builds it with the plugin's default settings.
    fn placeholder(&self, bytes: &[u8]) -> berth_plugin_common::vision::preprocess::PreprocessedImage {
        use berth::image::{decode, DecodeLimits};
        use berth_plugin_common::vision::preprocess::{lfm2_vl as lfm2vl, minicpmv};
        let img = decode(bytes, DecodeLimits::default()).unwrap();
        let patch = self.config()["vision_config"]["patch_size"].as_u64().unwrap() as usize;
        if self.model == "lfm2_vl" {
            let p = lfm2vl::Lfm2VlParams {
                encoder_patch_size: patch,
                downsample_factor: self.config()["downsample_factor"].as_u64().unwrap() as usize,
                ..Default::default()
            };
            let t = lfm2vl::Lfm2VlTokens {
                image: self.image_token.into(),
                ..Default::default()
            };
            lfm2vl::preprocess(&img, &p, &t)
        } else {
            let p = minicpmv::MiniCpmVParams {
                patch_size: patch,
                ..Default::default()
            };
            let t = minicpmv::MiniCpmVTokens {
                image: self.image_token.into(),
                ..Default::default()
            };
            minicpmv::preprocess(&img, &p, &t, 0)
        }
    }
}

/// A Berth home holding one imported tiny vision pack, with its plugin in a directory of its own.
struct Home {
    tmp: tempfile::TempDir,
}

impl Home {
    fn new(tiny: &TinyVision) -> Home {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("berth-tiny-{}-", tiny.model))
            .tempdir()
            .unwrap();
        let home = Home { tmp };
        std::fs::create_dir_all(home.plugin_dir()).unwrap();
        let lib = plugin_library(tiny.plugin);
        home.ok(&[
            "plugins",
            "install",
            lib.to_str().unwrap(),
            "--dir",
            home.plugin_dir().to_str().unwrap(),
        ]);
        // The pack's source stays in `src/` for the tokenizer checks.
        let out = Command::new(client_python())
            .arg(repo_root().join("scripts/lib/tiny_vision_pack.py"))
            .args([tiny.model, tiny.name, "--berth"])
            .arg(berth_exe())
            .arg("--src")
            .arg(home.path().join("src").join(tiny.model))
            .env("BERTH_HOME", home.path())
            .env("BERTH_PLUGIN_PATH", home.plugin_dir())
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "tiny_vision_pack.py {} failed ({}): {}",
            tiny.model,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let show = home.ok(&["show", tiny.name, "--json"]);
        assert!(
            show.contains(&format!("\"architecture\":\"{}\"", tiny.architecture))
                || show.contains(&format!("\"architecture\": \"{}\"", tiny.architecture)),
            "{} imported with the wrong architecture: {show}",
            tiny.name
        );
        home
    }

    fn path(&self) -> &Path {
        self.tmp.path()
    }

    fn plugin_dir(&self) -> PathBuf {
        self.path().join("plugins-debug")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(berth_exe());
        cmd.env("BERTH_HOME", self.path())
            .env("BERTH_PLUGIN_PATH", self.plugin_dir())
            .env_remove("BERTH_PORT")
            .env_remove("BERTH_HOST");
        cmd
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().expect("berth runs");
        assert!(
            out.status.success(),
            "berth {args:?} failed ({}): {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A running `berth serve`, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves `body` at `http://127.0.0.1:PORT/image.png` (any other path is a 404); returns the URL.
fn serve_image(body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/image.png", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let (status, bytes) = match line.split_whitespace().nth(1) {
                Some("/image.png") => ("200 OK", body.as_slice()),
                _ => ("404 Not Found", &b"not found"[..]),
            };
            let _ = write!(
                conn,
                "HTTP/1.0 {status}\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n",
                bytes.len()
            );
            let _ = conn.write_all(bytes);
        }
    });
    url
}

fn image_path(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/images").join(name)
}

/// Serves the pack and runs the official clients against it; checks the numbers they report.
fn serve_with_official_clients(tiny: &TinyVision) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = Home::new(tiny);

    // What the host must put in the prompt for the image, with the pack's own tokenizer.
    let tokenizer = berth::tokenizer::Tokenizer::from_tokenizer_json(
        &home.path().join("src").join(tiny.model).join("tokenizer.json"),
    )
    .unwrap();
    assert_eq!(tokenizer.vocab_size(), 512);
    let image_id = tiny.image_token_id();
    assert_eq!(tokenizer.token_id(tiny.image_token), Some(image_id));
    for m in tiny.markers() {
        assert_eq!(tokenizer.encode(&m, false).len(), 1, "{m} is not one token");
    }
    let bytes = std::fs::read(image_path(IMAGE)).unwrap();
    let pre = tiny.placeholder(&bytes);
    let placeholder = tokenizer.encode(&pre.placeholder, false);
    let image_tokens = placeholder.iter().filter(|&&t| t == image_id).count();
    assert_eq!(image_tokens, pre.image_tokens);
    assert!(image_tokens > 0);
    // The placeholder's last image token, counted from the end of the placeholder.
    let after_last = placeholder.len() - 1 - placeholder.iter().rposition(|&t| t == image_id).unwrap();

    let (child, _, port) = spawn_serve(
        home.command()
            // The http-URL case fetches from a loopback server: allowed here on purpose.
            .args([
                "serve",
                "--port",
                "0",
                "--host",
                "127.0.0.1",
                "--allow-private-image-urls",
            ])
            .env(
                "BERTH_LOG",
                std::env::var("BERTH_LOG").unwrap_or_else(|_| "warn".into()),
            ),
    );
    let _server = Server(child);
    let url = serve_image(bytes.clone());
    let out = Command::new(client_python())
        .arg(repo_root().join("tests/serve/vision_pack_checks.py"))
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(tiny.name)
        .arg(image_path(IMAGE))
        .arg(&url)
        .arg(image_path(OTHER))
        .arg(image_path(CORRUPT))
        .arg(TEXT)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: vision checks failed:\n{stdout}\n{}",
        tiny.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let cases: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let get = |case: &str| -> (i64, Option<i64>) {
        let c = cases
            .iter()
            .find(|c| c["case"] == case)
            .unwrap_or_else(|| panic!("no {case} in {stdout}"));
        (
            c["prompt_tokens"].as_i64().unwrap_or(-1),
            c["cached_tokens"].as_i64(),
        )
    };
    let (text, _) = get("text");
    let (first, _) = get("data_url");
    let (again, again_cached) = get("data_url_again");
    let (http, http_cached) = get("http_url");
    let (other, other_cached) = get("other_image");
    let (after, _) = get("after_corrupt");
    let (ollama, _) = get("ollama_chat");
    let _ = get("corrupt_400");
    let l = placeholder.len() as i64;
    eprintln!(
        "{}: image {IMAGE}: {image_tokens} image tokens, placeholder {} tokens; prompt tokens: \
         text {text}, data url {first}, again {again} (cached {again_cached:?}), http {http} \
         (cached {http_cached:?}), other image {other} (cached {other_cached:?}), after the 400 \
         {after}, ollama {ollama}",
        tiny.name,
        placeholder.len()
    );
    // The image's placeholder is in the prompt, whichever way the image came.
    assert_eq!(first - text, l, "prompt tokens with the image - without");
    for (case, n) in [
        ("again", again),
        ("http", http),
        ("after", after),
        ("ollama", ollama),
    ] {
        assert_eq!(n, first, "{case}: the same image and text, other prompt tokens");
    }
    // The image opens the user's content: its placeholder starts after the template's prefix,
    // which is at most `text - TEXT's tokens - 1` long (the end of turn and the generation prompt
    // follow the content), so its last image token lies at or before `last_image_pos`.
    let text_tokens = tokenizer.encode(TEXT, false).len() as i64;
    let last_image_pos = (text - text_tokens - 1) + l - 1 - after_last as i64;
    eprintln!("{}: last image token at or before {last_image_pos}", tiny.name);
    for (case, cached) in [("again", again_cached), ("http", http_cached)] {
        let cached = cached.unwrap_or_else(|| panic!("{case}: no cached_tokens"));
        assert!(
            cached > last_image_pos && cached <= first,
            "{case}: the same image bytes again reuse only {cached} of {first} tokens"
        );
    }
    // Other bytes (same size, so the same placeholder) do not reuse the image's tokens.
    assert_eq!(other, first);
    let other_cached = other_cached.unwrap_or(0);
    assert!(
        other_cached + image_tokens as i64 <= first,
        "another image reused {other_cached} of {first} tokens"
    );
}

#[test]
fn tiny_lfm2_vl_serves_images_to_the_official_clients() {
    serve_with_official_clients(&LFM2_VL);
}

#[test]
fn tiny_minicpm_v4_6_serves_images_to_the_official_clients() {
    serve_with_official_clients(&MINICPMV4_6);
}

/// The tiny MiniCPM-V 4.0 (Llama) and 4.5 (Qwen3) reference packs of
/// `scripts/gen-minicpmv4-reference`, served: an image through Ollama's `/api/generate` fills
/// exactly the `<unk>` rows of the 4.x placeholder layout (`query_num` tokens per overview and
/// slice), for an image left whole and one cut into slices, and a corrupt image is a 400.
#[test]
fn tiny_minicpm_v4_0_and_4_5_packs_take_images() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = tempfile::Builder::new().prefix("berth-mcpv4-").tempdir().unwrap();
    let minicpm = plugin_library("minicpm_v");
    berth_ok(
        home.path(),
        None,
        &["plugins", "install", minicpm.to_str().unwrap()],
    );
    for v in ["4_0", "4_5"] {
        let dir = repo_root().join(format!("tests/fixtures/hf-tiny/minicpmv{v}"));
        berth_ok(
            home.path(),
            None,
            &[
                "import",
                dir.to_str().unwrap(),
                "--name",
                &format!("mcpv{v}:tiny"),
            ],
        );
    }
    let (child, base, _) = spawn_serve(
        Command::new(berth_exe())
            .args(["serve", "--port", "0"])
            .env("BERTH_HOME", home.path())
            .env("BERTH_PLUGIN_PATH", home_plugins(home.path()))
            .env("BERTH_LOG", "warn"),
    );
    let _server = Server(child);
    let generate = |model: &str, image: Option<&Path>| -> (u16, Value) {
        let mut body = json!({"model": model, "prompt": "t5 t6 t7", "raw": true, "stream": false,
            "options": {"num_predict": 3, "temperature": 0}});
        if let Some(p) = image {
            use base64::Engine;
            body["images"] =
                json!([base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap())]);
        }
        post_json(&format!("{base}/api/generate"), &body)
    };
    for v in ["4_0", "4_5"] {
        let model = format!("mcpv{v}:tiny");
        let dir = repo_root().join(format!("tests/fixtures/hf-tiny/minicpmv{v}"));
        let tok = berth::tokenizer::Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json")).unwrap();
        let config: Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let query_num = config["query_num"].as_u64().unwrap() as usize;
        let (status, text_only) = generate(&model, None);
        assert_eq!(status, 200, "{text_only}");
        let text_tokens = text_only["prompt_eval_count"].as_u64().unwrap() as usize;
        for (name, sliced) in [("odd.png", false), ("large.png", true)] {
            let img =
                berth::image::decode(&std::fs::read(image_path(name)).unwrap(), Default::default()).unwrap();
            use berth_plugin_common::vision::preprocess::minicpmv;
            let p = minicpmv::MiniCpmVParams {
                query_num: Some(query_num),
                ..Default::default()
            };
            let pre = minicpmv::preprocess(&img, &p, &Default::default(), 0);
            assert_eq!(
                pre.slices.len() > 1,
                sliced,
                "{name}: {} slices",
                pre.slices.len()
            );
            assert_eq!(pre.image_tokens, pre.slices.len() * query_num, "{name}");
            let placeholder_tokens = tok.encode(&pre.placeholder, false);
            let unk = tok.token_id("<unk>").unwrap();
            assert_eq!(
                placeholder_tokens.iter().filter(|&&t| t == unk).count(),
                pre.image_tokens
            );
            let (status, answer) = generate(&model, Some(&image_path(name)));
            assert_eq!(status, 200, "{model} {name}: {answer}");
            assert_eq!(
                answer["prompt_eval_count"].as_u64().unwrap() as usize,
                text_tokens + placeholder_tokens.len(),
                "{model} {name}: the prompt holds the placeholder layout"
            );
            assert_eq!(answer["eval_count"], 3, "{answer}");
        }
        let (status, bad) = generate(&model, Some(&image_path(CORRUPT)));
        assert_eq!(status, 400, "{bad}");
    }
}

/// POSTs JSON over a plain HTTP/1.0 connection; returns (status, body as JSON or a string).
fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST /{path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    std::io::Read::read_to_string(&mut s, &mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let text = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (
        status,
        serde_json::from_str(text).unwrap_or(Value::String(text.to_string())),
    )
}
