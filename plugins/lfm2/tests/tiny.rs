//! LFM2 and LFM2-MoE against the tiny transformers reference models (safetensors): logits of the
//! full prefill and token by token through the convolution state, and the multi-sequence
//! contract of a recurrent model (batching, fork, rewind to snapshots).

use berth_lfm2::{Lfm2Family, Lfm2Model};
use berth_plugin_api::{Family, LoadConfig, Model, Rewind};
use berth_plugin_common::testing::{
    check_batched_equals_alone, check_fork, check_rewind, check_tiny_reference, tiny_fixture,
};

fn load(name: &str) -> Lfm2Model {
    let cfg = LoadConfig {
        pack_dir: tiny_fixture(name),
        family: "lfm2".into(),
        architecture: name.into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    Lfm2Family::create(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn lfm2_tiny_matches_reference_logits() {
    check_tiny_reference(&mut load("lfm2"), "lfm2");
}

#[test]
fn lfm2_moe_tiny_matches_reference_logits() {
    check_tiny_reference(&mut load("lfm2_moe"), "lfm2_moe");
}

#[test]
fn lfm2_reports_snapshot_rewinds() {
    let m = load("lfm2");
    assert_eq!(m.describe().rewind, Rewind::Snapshots { every: 64 });
}

#[test]
fn lfm2_batched_sequences_decode_as_alone() {
    check_batched_equals_alone(&mut load("lfm2"), 512);
    check_batched_equals_alone(&mut load("lfm2_moe"), 512);
}

#[test]
fn lfm2_fork_continues_like_a_fresh_prefill() {
    check_fork(&mut load("lfm2"), 512);
}

#[test]
fn lfm2_rewind_to_a_snapshot_matches_a_fresh_prefill() {
    check_rewind(&mut load("lfm2"), 512);
    check_rewind(&mut load("lfm2_moe"), 512);
}

/// A tiny model as llama.cpp's converter wrote it (tests/fixtures/gguf-tiny, f32 or Q8_0).
fn load_gguf(file: &str) -> Lfm2Model {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf-tiny")
        .join(file);
    let cfg = LoadConfig {
        pack_dir: path.parent().unwrap().to_path_buf(),
        family: "lfm2".into(),
        format: "gguf".into(),
        weights: vec![path.clone()],
        threads: Some(2),
        ..Default::default()
    };
    Lfm2Family::create(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn lfm2_tiny_gguf_from_llama_cpp_matches_reference_logits() {
    check_tiny_reference(&mut load_gguf("lfm2.gguf"), "lfm2");
    check_tiny_reference(&mut load_gguf("lfm2_moe.gguf"), "lfm2_moe");
}

#[test]
fn lfm2_tiny_gguf_q8_0_keeps_the_greedy_tokens() {
    // Q8_0 weights (and Q8_0 activations in the products) move logits by ~1e-2 here; the
    // reference's argmax per position is what must survive.
    let mut m = load_gguf("lfm2.q8_0.gguf");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tiny_fixture("lfm2").join("reference.json")).unwrap())
            .unwrap();
    let want: Vec<i32> = reference["argmax_per_position"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    let pos: Vec<i32> = (0..8).collect();
    let logits = berth_plugin_common::testing::decode(
        &mut m,
        &berth_plugin_common::testing::TINY_IDS,
        &pos,
        &[0; 8],
        &[1; 8],
    );
    let got: Vec<i32> = logits
        .chunks(512)
        .map(berth_plugin_common::testing::argmax)
        .collect();
    assert_eq!(got, want);
}

/// A pack directory: the tiny model, the tiny packs' tokenizer and, optionally, a template.
fn pack_with_template(template: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-packs");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(tiny_fixture("lfm2").join(f), dir.path().join(f)).unwrap();
    }
    std::fs::copy(fixtures.join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    if let Some(t) = template {
        std::fs::copy(fixtures.join(t), dir.path().join("chat_template.jinja")).unwrap();
    }
    dir
}

#[test]
fn lfm2_takes_tools_when_its_template_renders_them_and_stops_on_im_end() {
    let load_dir = |dir: &std::path::Path| {
        let cfg = LoadConfig {
            pack_dir: dir.to_path_buf(),
            family: "lfm2".into(),
            format: "safetensors".into(),
            ..Default::default()
        };
        Lfm2Family::create(&cfg).unwrap()
    };
    let with = pack_with_template(Some("lfm2.jinja"));
    let m = load_dir(with.path());
    assert!(m.tools_enabled());
    let d = m.describe();
    assert_ne!(d.capabilities & berth_plugin_api::abi::CAP_TOOLS, 0);
    // The config's eos (2, `<|im_end|>` in the tiny tokenizer), then `<|endoftext|>`.
    let special = &d.extra["special_tokens"];
    assert_eq!(special["<|im_end|>"], 2);
    let eot = special["<|endoftext|>"].as_i64().unwrap() as i32;
    assert_eq!(d.stop_tokens, vec![2, eot]);
    assert!(special["<|tool_call_start|>"].is_i64());
    let without = pack_with_template(None);
    assert!(!load_dir(without.path()).tools_enabled());
}
