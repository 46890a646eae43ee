//! The loader against real plugin libraries opened with dlopen.

mod common;

use berth::models::LoadedModel;
use berth::plugins::{PluginSet, PluginState};
use berth_plugin_api::{BatchView, ErrorKind, ImageInput, LoadConfig};
use common::*;

fn greedy(row: &[f32]) -> usize {
    (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap()
}

#[test]
fn installed_plugin_is_indexed_by_its_sidecar_and_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    let lib = scripted_library();
    let out = berth_ok(
        tmp.path(),
        None,
        &[
            "plugins",
            "install",
            lib.to_str().unwrap(),
            "--dir",
            plugins.to_str().unwrap(),
        ],
    );
    assert!(out.contains("installed plugin 'scripted'"), "{out}");
    assert!(plugins.join("libberth_scripted.berth.json").is_file());

    let set = PluginSet::discover(std::slice::from_ref(&plugins));
    assert_eq!(set.records.len(), 1);
    let rec = &set.records[0];
    assert!(matches!(rec.state, PluginState::Ready(_)), "{:?}", rec.state);
    assert_eq!(rec.manifest.as_ref().unwrap().families, vec!["scripted"]);
    assert_eq!(set.families(), vec!["scripted".to_string()]);
    let probe = serde_json::json!({"family": "scripted", "architecture": "scripted", "format": "script"});
    assert!(set.best_for(&probe).is_some());
    let other = serde_json::json!({"family": "gemma", "architecture": "gemma3", "format": "gguf"});
    assert!(set.best_for(&other).is_none());
}

#[test]
fn a_library_without_a_sidecar_is_refused_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(scripted_library(), tmp.path().join("libberth_scripted.so")).unwrap();
    let set = PluginSet::discover(&[tmp.path().to_path_buf()]);
    match &set.records[0].state {
        PluginState::Refused(why) => {
            assert!(why.contains("no sidecar manifest"), "{why}");
            assert!(!why.contains('\n'));
        }
        PluginState::Ready(_) => panic!("a library without a sidecar must not be opened"),
    }
}

#[test]
fn a_panic_in_decode_is_contained_and_the_next_call_runs_on_a_reloaded_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    berth_ok(
        tmp.path(),
        None,
        &[
            "plugins",
            "install",
            scripted_library().to_str().unwrap(),
            "--dir",
            plugins.to_str().unwrap(),
        ],
    );
    let set = PluginSet::discover(&[plugins]);
    let plugin = set.records[0].ready().unwrap().clone();

    let pack = tmp.path().join("pack");
    write_scripted_pack(
        &pack,
        "s",
        "latest",
        &serde_json::json!({"panic_token": 99, "stop_tokens": [2], "entries": [{"reply": [7, 8]}]}),
    );
    let config = LoadConfig {
        pack_dir: pack.clone(),
        family: "scripted".into(),
        weights: vec![pack.join("script.json")],
        ..Default::default()
    };
    let mut model = LoadedModel::load(plugin, &config).unwrap();
    let vocab = model.description().vocab_size as usize;
    let mut logits = vec![0.0f32; vocab];

    let boom = BatchView {
        tokens: &[1, 99],
        positions: &[0, 1],
        seq_ids: &[0, 0],
        want_logits: &[0, 1],
    };
    let err = model.decode(&boom, &mut logits).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Poisoned);
    assert!(err.message.contains("scripted panic"), "{}", err.message);

    let ok = BatchView {
        tokens: &[1],
        positions: &[0],
        seq_ids: &[0],
        want_logits: &[1],
    };
    assert_eq!(model.decode(&ok, &mut logits).unwrap(), 1);
    assert_eq!(greedy(&logits), 7);
    assert_eq!(model.reloads(), 1);
}

#[test]
fn a_plugin_of_this_abi_reports_vision_and_receives_each_image_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    berth_ok(
        tmp.path(),
        None,
        &[
            "plugins",
            "install",
            scripted_library().to_str().unwrap(),
            "--dir",
            plugins.to_str().unwrap(),
        ],
    );
    let set = PluginSet::discover(&[plugins]);
    let plugin = set.records[0].ready().unwrap().clone();
    assert_eq!(plugin.abi_version(), (1, berth_plugin_api::abi::ABI_MINOR));

    let pack = tmp.path().join("pack");
    let log = tmp.path().join("images.jsonl");
    write_scripted_pack(
        &pack,
        "v",
        "latest",
        &serde_json::json!({"image_log": log, "stop_tokens": [2], "entries": [{"reply": [7]}],
            "vision": {"scheme": "minicpmv", "layout": "patch_strip", "patch_size": 2,
                "image_token_id": 9, "params": {"max_slice_nums": 9, "query_num": 3}}}),
    );
    let config = LoadConfig {
        pack_dir: pack.clone(),
        family: "scripted".into(),
        weights: vec![pack.join("script.json")],
        ..Default::default()
    };
    let mut model = plugin.create(&serde_json::to_string(&config).unwrap()).unwrap();
    assert!(model.supports_images());
    assert_ne!(
        model.description().capabilities & berth_plugin_api::abi::CAP_VISION,
        0
    );
    let spec = model.vision().unwrap();
    assert_eq!(
        (spec.scheme.as_str(), spec.patch_size, spec.image_token_id),
        ("minicpmv", 2, 9)
    );
    assert_eq!(spec.params["query_num"], 3);

    // Two slices, with values whose bits are easy to lose (negative zero, a subnormal).
    let a: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) / 7.0).collect();
    let mut b: Vec<f32> = (0..12).map(|i| f32::from_bits(0x3f80_0000 ^ (i * 977))).collect();
    b[0] = -0.0;
    b[1] = f32::MIN_POSITIVE / 3.0;
    let images = [
        ImageInput {
            shape: &[3, 2, 4],
            pixels: &a,
            patch_mask: Some(&[1, 1, 0]),
            grid: Some((1, 2)),
            positions: &[1, 2, 3],
        },
        ImageInput {
            shape: &[3, 4],
            pixels: &b,
            patch_mask: None,
            grid: None,
            positions: &[5, 6, 7],
        },
    ];
    model.encode_images(1, &images).unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"seq": 1, "shape": [3, 2, 4], "pixels": berth_scripted::pixel_checksum(&a),
                "patch_mask": [1, 1, 0], "grid": [1, 2], "positions": [1, 2, 3]}),
            serde_json::json!({"seq": 1, "shape": [3, 4], "pixels": berth_scripted::pixel_checksum(&b),
                "patch_mask": null, "grid": null, "positions": [5, 6, 7]}),
        ]
    );
    // A shape that does not hold the pixels is refused before it crosses.
    let bad = ImageInput {
        shape: &[3, 3],
        ..images[1]
    };
    assert_eq!(
        model.encode_images(1, &[bad]).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    // The decode after the images runs as before.
    let mut logits = vec![0.0f32; model.description().vocab_size as usize];
    let rows = BatchView {
        tokens: &[1, 9],
        positions: &[0, 1],
        seq_ids: &[1, 1],
        want_logits: &[0, 1],
    };
    assert_eq!(model.decode(&rows, &mut logits).unwrap(), 1);
    assert_eq!(greedy(&logits), 7);
}

#[test]
fn a_family_in_two_directories_goes_to_the_earlier_one_and_berth_plugins_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    let home_dir = tmp.path().join("plugins");
    for dir in [&first, &home_dir] {
        berth_ok(
            tmp.path(),
            None,
            &[
                "plugins",
                "install",
                scripted_library().to_str().unwrap(),
                "--dir",
                dir.to_str().unwrap(),
            ],
        );
    }
    let set = PluginSet::discover(&[first.clone(), home_dir.clone()]);
    assert_eq!(set.records.len(), 2);
    assert_eq!(set.records[0].found_in, first);
    assert_eq!(set.records[1].found_in, home_dir);
    assert!(set.tie_winner(0).is_none());
    assert_eq!(set.tie_winner(1).unwrap().library, set.records[0].library);
    let probe = serde_json::json!({"family": "scripted", "architecture": "scripted", "format": "script"});
    let (winner, _) = set.best_for(&probe).unwrap();
    assert_eq!(winner.library, set.records[0].library);

    // The CLI names each plugin's origin and the tie rule.
    let out = berth_ok(tmp.path(), Some(&first), &["plugins"]);
    let row = |dir: &std::path::Path| {
        let file = dir.join("libberth_scripted.so").display().to_string();
        out.lines()
            .find(|l| l.starts_with(&file))
            .unwrap_or_else(|| panic!("no row for {file}: {out}"))
            .to_string()
    };
    assert!(row(&first).contains("BERTH_PLUGIN_PATH"), "{out}");
    assert!(row(&home_dir).contains("BERTH_HOME"), "{out}");
    let tie = format!(
        "{} (BERTH_PLUGIN_PATH) wins ties over {} (BERTH_HOME)",
        first.join("libberth_scripted.so").display(),
        home_dir.join("libberth_scripted.so").display()
    );
    assert!(out.contains(&tie), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&berth_ok(tmp.path(), Some(&first), &["plugins", "--json"])).unwrap();
    let rows = json.as_array().unwrap();
    let mine: Vec<_> = rows
        .iter()
        .filter(|r| r["dir"] == first.to_str().unwrap() || r["dir"] == home_dir.to_str().unwrap())
        .collect();
    assert_eq!(mine.len(), 2, "{json:#}");
    assert_eq!(mine[0]["from"], "BERTH_PLUGIN_PATH");
    assert!(mine[0]["loses_ties_to"].is_null());
    assert_eq!(mine[1]["from"], "BERTH_HOME");
    assert_eq!(
        mine[1]["loses_ties_to"],
        first.join("libberth_scripted.so").to_str().unwrap()
    );
}
