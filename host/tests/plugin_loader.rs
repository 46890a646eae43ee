//! The loader against real plugin libraries opened with dlopen.

mod common;

use berth::models::LoadedModel;
use berth::plugins::{PluginSet, PluginState};
use berth_plugin_api::{BatchView, ErrorKind, LoadConfig};
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
