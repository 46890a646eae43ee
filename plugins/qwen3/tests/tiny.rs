//! The plugin against the tiny HF reference models: full-sequence and token-by-token logits, and
//! the multi-sequence batch contract (batching, truncate, fork).

use berth_plugin_api::{BatchView, ErrorKind, Family, LoadConfig, LogitsOut, Model, Rewind};
use berth_plugin_common::npy::read_npy_f32;
use berth_plugin_common::testing::{
    assert_close, check_batched_equals_alone, check_fork, check_rewind, check_tiny_reference, decode,
    tiny_fixture, TINY_IDS as IDS,
};
use berth_qwen3::{QwenFamily, QwenModel};

fn fixture(name: &str) -> std::path::PathBuf {
    tiny_fixture(name)
}

fn load(name: &str) -> QwenModel {
    let cfg = LoadConfig {
        pack_dir: fixture(name),
        family: "qwen3".into(),
        architecture: name.into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    QwenFamily::create(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn check_reference(name: &str) {
    check_tiny_reference(&mut load(name), name);
}

#[test]
fn qwen3_tiny_matches_reference_logits() {
    check_reference("qwen3");
}

#[test]
fn qwen3_moe_tiny_matches_reference_logits() {
    check_reference("qwen3_moe");
}

#[test]
fn qwen3_5_tiny_matches_reference_logits() {
    check_reference("qwen3_5");
}

#[test]
fn qwen3_5_moe_tiny_matches_reference_logits() {
    check_reference("qwen3_5_moe");
}

#[test]
fn qwen3_5_reports_snapshot_rewinds_and_attention_only_models_anywhere() {
    assert_eq!(load("qwen3_5").describe().rewind, Rewind::Snapshots { every: 64 });
    assert_eq!(load("qwen3").describe().rewind, Rewind::Anywhere);
}

#[test]
fn qwen3_5_batched_sequences_decode_as_alone() {
    check_batched_equals_alone(&mut load("qwen3_5"), 512);
    check_batched_equals_alone(&mut load("qwen3_5_moe"), 512);
}

#[test]
fn qwen3_5_fork_continues_like_a_fresh_prefill() {
    check_fork(&mut load("qwen3_5"), 512);
    check_fork(&mut load("qwen3_5_moe"), 512);
}

#[test]
fn qwen3_5_rewind_to_a_snapshot_matches_a_fresh_prefill() {
    check_rewind(&mut load("qwen3_5"), 512);
    check_rewind(&mut load("qwen3_5_moe"), 512);
}

/// A tiny model as llama.cpp's converter wrote it (tests/fixtures/gguf-tiny).
fn load_gguf(file: &str) -> QwenModel {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf-tiny")
        .join(file);
    let cfg = LoadConfig {
        pack_dir: path.parent().unwrap().to_path_buf(),
        family: "qwen3".into(),
        format: "gguf".into(),
        weights: vec![path.clone()],
        threads: Some(2),
        ..Default::default()
    };
    QwenFamily::create(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn qwen3_5_tiny_gguf_from_llama_cpp_matches_reference_logits() {
    check_tiny_reference(&mut load_gguf("qwen3_5.gguf"), "qwen3_5");
    check_tiny_reference(&mut load_gguf("qwen3_5_moe.gguf"), "qwen3_5_moe");
}

#[test]
fn describe_reports_the_model() {
    let m = load("qwen3");
    let d = m.describe();
    assert_eq!(d.vocab_size, 512);
    assert_eq!(d.context_length, 4096);
    assert_eq!(d.max_sequences, 16);
    assert_eq!(d.stop_tokens, vec![1]);
    assert_eq!(d.extra["architecture"], "qwen3");
}

#[test]
fn batched_sequences_match_separate_decoding_and_truncate_and_fork_work() {
    let mut m = load("qwen3_moe");
    let v = 512;
    // Alone: sequence 0 gets IDS[..5], sequence 1 gets IDS[3..8].
    let a = decode(&mut m, &IDS[..5], &[0, 1, 2, 3, 4], &[0; 5], &[0, 0, 0, 0, 1]);
    let b = decode(&mut m, &IDS[3..], &[0, 1, 2, 3, 4], &[1; 5], &[0, 1, 0, 0, 1]);
    // Together, interleaved, in sequences 2 and 3.
    let toks = [
        IDS[0], IDS[3], IDS[1], IDS[4], IDS[2], IDS[5], IDS[3], IDS[6], IDS[4], IDS[7],
    ];
    let pos = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4];
    let seqs = [2, 3, 2, 3, 2, 3, 2, 3, 2, 3];
    let want = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1];
    let both = decode(&mut m, &toks, &pos, &seqs, &want);
    assert_close(&both[..v], &b[..v], "seq 3 row 1");
    assert_close(&both[v..2 * v], &a, "seq 2 last row");
    assert_close(&both[2 * v..], &b[v..], "seq 3 last row");

    // Truncate sequence 2 to 3 positions and decode the same two tokens again.
    m.seq_truncate(2, 3).unwrap();
    let again = decode(&mut m, &IDS[3..5], &[3, 4], &[2, 2], &[0, 1]);
    assert_close(&again, &a, "after truncate");

    // Fork sequence 2 into 5 and continue both with the same token.
    m.seq_fork(2, 5).unwrap();
    let two = decode(&mut m, &[9, 9], &[5, 5], &[2, 5], &[1, 1]);
    assert_close(&two[..v], &two[v..], "fork");

    // force_token advances the sequence like a decode without logits.
    m.force_token(5, 11).unwrap();
    let forced = decode(&mut m, &[12], &[7], &[5], &[1]);
    let plain = decode(&mut m, &[11, 12], &[6, 7], &[2, 2], &[0, 1]);
    assert_close(&forced, &plain, "force_token");

    // Positions must be the sequence's next ones.
    let mut out = vec![0.0; v];
    let bad = BatchView {
        tokens: &[1],
        positions: &[3],
        seq_ids: &[7],
        want_logits: &[1],
    };
    let e = m.decode(&bad, &mut LogitsOut::new(&mut out, v)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let bad_seq = BatchView {
        tokens: &[1],
        positions: &[0],
        seq_ids: &[16],
        want_logits: &[1],
    };
    assert_eq!(
        m.decode(&bad_seq, &mut LogitsOut::new(&mut out, v))
            .unwrap_err()
            .kind,
        ErrorKind::InvalidArgument
    );
}

#[test]
fn the_exported_c_abi_entry_serves_the_model() {
    // SAFETY: the table comes from this crate's own exported entry, valid for the process.
    let plugin =
        unsafe { berth_plugin_api::Plugin::from_entry(berth_qwen3::berth_plugin_entry_v1()) }.unwrap();
    assert_eq!(
        plugin.probe(r#"{"family":"qwen3","architecture":"qwen3_moe","format":"safetensors"}"#),
        100
    );
    let cfg = serde_json::json!({
        "pack_dir": fixture("qwen3"), "family": "qwen3", "architecture": "qwen3", "format": "safetensors"
    });
    let mut m = plugin.create(&cfg.to_string()).unwrap();
    assert_eq!(m.description().vocab_size, 512);
    let want = read_npy_f32(fixture("qwen3").join("logits.npy")).unwrap();
    let mut out = vec![0.0; 512];
    let b = BatchView {
        tokens: &IDS,
        positions: &[0, 1, 2, 3, 4, 5, 6, 7],
        seq_ids: &[0; 8],
        want_logits: &[0, 0, 0, 0, 0, 0, 0, 1],
    };
    assert_eq!(m.decode(&b, &mut out).unwrap(), 1);
    assert_close(&out, want.row(7), "through the C ABI");
}
