//! The plugin against the tiny HF reference models (Gemma 3, Gemma 4 with per-layer embeddings and
//! KV sharing, Gemma 4 MoE): full-sequence and token-by-token logits, decoding past the 4-token
//! sliding window, and the multi-sequence batch contract (batching, truncate, fork, rewind; also
//! through the shared checks of `berth_plugin_common::testing`).

use berth_gemma::{GemmaFamily, GemmaModel};
use berth_plugin_api::{BatchView, ErrorKind, Family, LoadConfig, LogitsOut, Model};
use berth_plugin_common::npy::read_npy_f32;
use berth_plugin_common::testing::{
    assert_close, check_batched_equals_alone, check_fork, check_rewind, decode, tiny_fixture, TINY_IDS as IDS,
};

fn fixture(name: &str) -> std::path::PathBuf {
    tiny_fixture(name)
}

fn load(name: &str) -> GemmaModel {
    let cfg = LoadConfig {
        pack_dir: fixture(name),
        family: "gemma".into(),
        architecture: name.into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    GemmaFamily::create(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn check_reference(name: &str) {
    let dir = fixture(name);
    let full = read_npy_f32(dir.join("logits.npy")).unwrap();
    let stepwise = read_npy_f32(dir.join("decode_logits.npy")).unwrap();
    let mut m = load(name);
    let v = m.describe().vocab_size as usize;
    assert_eq!(full.shape, vec![8, v]);

    let pos: Vec<i32> = (0..8).collect();
    let got = decode(&mut m, &IDS, &pos, &[0; 8], &[1; 8]);
    let mut worst = assert_close(&got, &full.data, &format!("{name} full forward"));

    for (i, &t) in IDS.iter().enumerate() {
        let got = decode(&mut m, &[t], &[i as i32], &[1], &[1]);
        worst = worst.max(assert_close(
            &got,
            stepwise.row(i),
            &format!("{name} decode step {i}"),
        ));
    }
    eprintln!("{name}: max|diff| / max|logit| = {worst:.2e}");

    // Eight more steps past the window: the prefilled sequence and the token-by-token one agree.
    let more = [5, 9, 300, 2, 77, 410, 13, 64];
    for (j, &t) in more.iter().enumerate() {
        let p = 8 + j as i32;
        let a = decode(&mut m, &[t], &[p], &[0], &[1]);
        let b = decode(&mut m, &[t], &[p], &[1], &[1]);
        assert_close(&a, &b, &format!("{name} step {p} after prefill vs stepwise"));
    }
    // And a prefill of all sixteen tokens matches the last decoded row.
    let all: Vec<i32> = IDS.iter().chain(&more).copied().collect();
    let pos: Vec<i32> = (0..16).collect();
    let mut want = [0u8; 16];
    want[15] = 1;
    let last = decode(&mut m, &all, &pos, &[2; 16], &want);
    let step = decode(&mut m, &[3], &[16], &[0], &[1]);
    let again = decode(&mut m, &[3], &[16], &[2], &[1]);
    assert_close(&step, &again, &format!("{name} position 16"));
    assert_eq!(last.len(), v);
}

#[test]
fn gemma3_tiny_matches_reference_logits() {
    check_reference("gemma3");
}

#[test]
fn gemma4_tiny_matches_reference_logits() {
    check_reference("gemma4");
}

#[test]
fn gemma4_moe_tiny_matches_reference_logits() {
    check_reference("gemma4_moe");
}

#[test]
fn describe_reports_the_model() {
    for (name, arch) in [
        ("gemma3", "gemma3"),
        ("gemma4", "gemma4"),
        ("gemma4_moe", "gemma4"),
    ] {
        let m = load(name);
        let d = m.describe();
        assert_eq!(d.vocab_size, 512);
        assert_eq!(d.context_length, 4096);
        assert_eq!(d.max_sequences, 16);
        assert_eq!(d.stop_tokens, vec![1]);
        assert_eq!(d.extra["architecture"], arch);
        assert_eq!(d.extra["special_tokens"]["bos"], 2);
    }
}

fn check_batch_contract(name: &str) {
    let mut m = load(name);
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

    // Positions must be the sequence's next ones; sequence ids and tokens must be in range.
    let mut out = vec![0.0; v];
    for (tok, pos, seq) in [(1, 3, 7), (1, 0, 16), (512, 0, 7), (-1, 0, 7)] {
        let bad = BatchView {
            tokens: &[tok],
            positions: &[pos],
            seq_ids: &[seq],
            want_logits: &[1],
        };
        let e = m.decode(&bad, &mut LogitsOut::new(&mut out, v)).unwrap_err();
        assert_eq!(
            e.kind,
            ErrorKind::InvalidArgument,
            "{name}: token {tok} pos {pos} seq {seq}"
        );
    }
}

#[test]
fn gemma3_batches_truncate_and_fork() {
    check_batch_contract("gemma3");
}

#[test]
fn gemma4_batches_truncate_and_fork() {
    check_batch_contract("gemma4");
}

#[test]
fn gemma4_moe_batches_truncate_and_fork() {
    check_batch_contract("gemma4_moe");
}

#[test]
fn batched_sequences_decode_as_alone() {
    for name in ["gemma3", "gemma4", "gemma4_moe"] {
        check_batched_equals_alone(&mut load(name), 512);
    }
}

#[test]
fn fork_continues_like_a_fresh_prefill() {
    for name in ["gemma3", "gemma4", "gemma4_moe"] {
        check_fork(&mut load(name), 512);
    }
}

#[test]
fn rewind_matches_a_fresh_prefill() {
    for name in ["gemma3", "gemma4", "gemma4_moe"] {
        check_rewind(&mut load(name), 512);
    }
}
