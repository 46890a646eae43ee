//! Plugins built in separate cargo invocations: the out-of-tree example, ABI-evolution variants,
//! a wrong major, a missing symbol and a `panic = "abort"` build, loaded by the unmodified host.

mod common;

use berth::plugins::{PluginSet, PluginState};
use berth_plugin_api::{abi, BatchView, ErrorKind, ImageInput, LoadConfig, Pooling, Rewind};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn cargo_build(manifest: &Path, target_dir: &Path, extra: &[&str]) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .args(extra)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    target_dir.join("debug")
}

/// Builds every external plugin once and returns the directory holding the libraries.
fn external_plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = repo_root();
        let out = root.join("target/test-plugins");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let status = Command::new(root.join("tests/plugins/build-abi-variants"))
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "build-abi-variants: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        let hello = root.join("docs/examples/hello-plugin/Cargo.toml");
        let dir = cargo_build(&hello, &root.join("target/ext"), &[]);
        std::fs::copy(dir.join("libhello_plugin.so"), out.join("libhello_plugin.so")).unwrap();
        let dir = cargo_build(
            &hello,
            &root.join("target/ext-abort"),
            &["--config", "profile.dev.panic=\"abort\""],
        );
        std::fs::copy(dir.join("libhello_plugin.so"), out.join("libhello_abort.so")).unwrap();
        out
    })
}

/// A plugin directory with every external plugin and the scripted one installed.
fn installed(home: &Path) -> PathBuf {
    let dir = home.join("plugins");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(external_plugins())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "so"))
        .collect();
    libs.push(scripted_library());
    for lib in libs {
        berth_ok(
            home,
            None,
            &[
                "plugins",
                "install",
                lib.to_str().unwrap(),
                "--dir",
                dir.to_str().unwrap(),
            ],
        );
    }
    dir
}

fn status_of<'a>(json: &'a serde_json::Value, file: &str) -> &'a serde_json::Value {
    json.as_array()
        .unwrap()
        .iter()
        .find(|p| p["file"].as_str().unwrap().ends_with(file))
        .unwrap_or_else(|| panic!("{file} not listed"))
}

#[test]
fn berth_plugins_lists_good_plugins_and_refuses_bad_ones_with_one_line_each() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    installed(home);
    let json: serde_json::Value =
        serde_json::from_str(&berth_ok(home, None, &["plugins", "--json"])).unwrap();
    assert_eq!(status_of(&json, "libhello_plugin.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_scripted.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_abi_newer.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_abi_newer.so")["abi"], "1.6");
    assert_eq!(status_of(&json, "libberth_abi_v1_3.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_abi_v1_3.so")["abi"], "1.3");
    assert_eq!(status_of(&json, "libberth_abi_v1_2.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_abi_v1_2.so")["abi"], "1.2");
    assert_eq!(status_of(&json, "libberth_abi_v1_1.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_abi_v1_1.so")["abi"], "1.1");
    assert_eq!(status_of(&json, "libberth_abi_older.so")["status"], "ok");
    assert_eq!(status_of(&json, "libberth_abi_older.so")["abi"], "1.0");

    let v2 = status_of(&json, "libberth_abi_v2.so");
    assert_eq!(v2["status"], "refused");
    assert_eq!(
        v2["reason"],
        "plugin 'abi-v2' (libberth_abi_v2.so) was built for ABI 2.0; this host speaks 1.0-1.5"
    );
    let nosym = status_of(&json, "libberth_abi_nosymbol.so");
    assert_eq!(nosym["status"], "refused");
    assert!(
        nosym["reason"]
            .as_str()
            .unwrap()
            .contains("has no `berth_plugin_entry_v1` symbol"),
        "{nosym}"
    );
    let abort = status_of(&json, "libhello_abort.so");
    assert_eq!(abort["status"], "refused");
    assert!(
        abort["reason"].as_str().unwrap().contains("panic = \"abort\""),
        "{abort}"
    );
    for p in json.as_array().unwrap() {
        if let Some(r) = p["reason"].as_str() {
            assert!(!r.contains('\n'), "refusal is one line: {r}");
            assert!(r.starts_with("plugin '"), "refusal names the plugin: {r}");
        }
    }

    let table = berth_ok(home, None, &["plugins"]);
    assert!(
        table.contains("refused: plugin 'abi-v2' (libberth_abi_v2.so) was built for ABI 2.0"),
        "{table}"
    );
}

#[test]
fn a_pack_served_by_the_out_of_tree_plugin_is_listed_with_plugin_ok() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    installed(&home);
    let src = tmp.path().join("greeter");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("hello.json"), r#"{"greeting": [5, 6, 7]}"#).unwrap();
    std::fs::write(
        src.join("pack.toml"),
        "name = \"greeter\"\ntag = \"v1\"\nfamily = \"hello\"\narchitecture = \"hello\"\nformat = \"hello\"\n\n[[files]]\npath = \"hello.json\"\nrole = \"weights\"\n",
    )
    .unwrap();
    berth_ok(&home, None, &["import", src.to_str().unwrap()]);
    let table = berth_ok(&home, None, &["list"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("greeter:v1"))
        .expect("listed");
    assert!(row.contains("hello") && row.contains(" ok "), "{table}");
    let json: serde_json::Value = serde_json::from_str(&berth_ok(&home, None, &["list", "--json"])).unwrap();
    assert_eq!(json[0]["plugin_name"], "hello");
}

fn greedy(row: &[f32]) -> usize {
    (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap()
}

#[test]
fn newer_and_older_minor_plugins_load_and_run_and_missing_fields_read_as_absent() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = installed(tmp.path());
    let set = PluginSet::discover(&[dir]);
    let find = |file: &str| set.records.iter().find(|r| r.library.ends_with(file)).unwrap();
    let config = serde_json::to_string(&LoadConfig {
        family: "abi-test".into(),
        ..Default::default()
    })
    .unwrap();

    // 1.6, 1.3 and 1.2 fill the 1.2 rewind fields (snapshots every 16); 1.1 and 1.0 end before
    // them. 1.6 and 1.3 fill the 1.3 image fields, but only 1.6 has the 1.5 prepare_image: 1.3
    // loads text-only, and 1.2 claims CAP_VISION without any, so neither takes images. Only 1.6
    // fills the 1.4 embedding fields: 1.3 claims CAP_EMBEDDING without them, so it has none.
    let snap = Rewind::Snapshots { every: 16 };
    for (file, minor, rewind, images, embeds) in [
        ("libberth_abi_newer.so", 6, snap, true, true),
        ("libberth_abi_v1_3.so", 3, snap, false, false),
        ("libberth_abi_v1_2.so", 2, snap, false, false),
        ("libberth_abi_v1_1.so", 1, Rewind::Anywhere, false, false),
        ("libberth_abi_older.so", 0, Rewind::Anywhere, false, false),
    ] {
        let plugin = find(file)
            .ready()
            .unwrap_or_else(|| panic!("{file}: {:?}", find(file).state));
        assert_eq!(plugin.abi_version(), (1, minor));
        assert_eq!(plugin.probe(r#"{"family": "abi-test"}"#), 10);
        let mut m = plugin.create(&config).unwrap();
        assert_eq!(m.description().vocab_size, 16);
        assert_eq!(m.description().rewind, rewind, "{file}");
        assert_eq!(m.supports_images(), images, "{file}");
        assert_eq!(m.vision().is_some(), images, "{file}");
        assert_eq!(
            m.description().capabilities & abi::CAP_VISION != 0,
            images,
            "{file}"
        );
        let image = ImageInput {
            shape: &[3, 4, 4],
            pixels: &[0.25; 48],
            patch_mask: None,
            grid: None,
            positions: &[1],
        };
        match m.encode_images(0, &[image]) {
            Ok(()) => assert!(images, "{file} took an image"),
            Err(e) => assert!(!images && e.kind == ErrorKind::Unsupported, "{file}: {e}"),
        }
        assert_eq!(m.vision_refused().is_some(), minor == 3, "{file}");
        let rgb = berth_plugin_api::RgbView {
            width: 1,
            height: 1,
            data: &[7, 8, 9],
        };
        match m.prepare_image(&rgb, 0) {
            Ok(p) => {
                assert!(images, "{file} prepared an image");
                assert_eq!((p.placeholder.as_str(), p.tokens()), ("<img>", 1), "{file}");
                assert_eq!(p.slices[0].pixels, vec![7.0, 8.0, 9.0], "{file}");
            }
            Err(e) => assert!(!images && e.kind == ErrorKind::Unsupported, "{file}: {e}"),
        }
        assert_eq!(m.embedding().is_some(), embeds, "{file}");
        assert_eq!(
            m.description().capabilities & abi::CAP_EMBEDDING != 0,
            embeds,
            "{file}"
        );
        if let Some(spec) = m.embedding() {
            // The spec's unknown `future_knob` key is ignored.
            assert_eq!(
                (spec.dimensions, spec.pooling, spec.normalized, spec.max_tokens),
                (4, Pooling::Mean, false, 64),
                "{file}"
            );
            assert_eq!(spec.prompts.get("query").map(String::as_str), Some("query: "));
        }
        // The toy embeds a sequence as [length, sum of tokens, first token, last token].
        match m.embed(&[&[3, 4, 5], &[7]]) {
            Ok(vectors) => {
                assert!(embeds, "{file} embedded");
                assert_eq!(
                    vectors,
                    vec![vec![3.0, 12.0, 3.0, 5.0], vec![1.0, 7.0, 7.0, 7.0]],
                    "{file}"
                );
            }
            Err(e) => assert!(!embeds && e.kind == ErrorKind::Unsupported, "{file}: {e}"),
        }
        let mut logits = vec![0.0; 32];
        let b = BatchView {
            tokens: &[3, 4],
            positions: &[0, 1],
            seq_ids: &[0, 0],
            want_logits: &[1, 1],
        };
        assert_eq!(m.decode(&b, &mut logits).unwrap(), 2);
        assert_eq!((greedy(&logits[..16]), greedy(&logits[16..])), (1, 2));
        // Truncate and decode again: the sequence keeps serving.
        m.seq_truncate(0, 1).unwrap();
        let b = BatchView {
            tokens: &[5],
            positions: &[1],
            seq_ids: &[0],
            want_logits: &[1],
        };
        assert_eq!(m.decode(&b, &mut logits[..16]).unwrap(), 1);
        assert_eq!(greedy(&logits[..16]), 2);
        let fork = m.seq_fork(0, 1);
        if minor == 0 {
            assert_eq!(
                fork.unwrap_err().kind,
                ErrorKind::Unsupported,
                "1.0 has no seq_fork"
            );
        } else {
            fork.unwrap();
        }
    }
    // The refused plugins did not stop the others from loading.
    assert!(matches!(
        find("libberth_abi_v2.so").state,
        PluginState::Refused(_)
    ));
    assert!(find("libhello_plugin.so").ready().is_some());
    assert!(find("libberth_scripted.so").ready().is_some());
}
