//! gpt-oss against the tiny transformers reference model: logits of the full prefill and token
//! by token past the sliding window, from the HF safetensors and from the GGUF llama.cpp's
//! converter made of it, and the multi-sequence contract (batching, fork, rewind).

use berth_gpt_oss::{GptOssFamily, GptOssModel};
use berth_plugin_api::{Family, LoadConfig, Model, Rewind};
use berth_plugin_common::npy::read_npy_f32;
use berth_plugin_common::testing::{
    check_batched_equals_alone, check_fork, check_rewind, check_tiny_reference, decode, tiny_fixture,
    TINY_IDS,
};
use std::path::{Path, PathBuf};

fn load_dir(dir: &Path) -> GptOssModel {
    let cfg = LoadConfig {
        pack_dir: dir.to_path_buf(),
        family: "gpt-oss".into(),
        architecture: "gpt_oss".into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    GptOssFamily::create(&cfg).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn load() -> GptOssModel {
    load_dir(&tiny_fixture("gpt_oss"))
}

/// The tiny model as llama.cpp's converter wrote it (tests/fixtures/gguf-tiny, f32).
fn gguf_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf-tiny/gpt_oss.gguf")
}

fn load_gguf() -> GptOssModel {
    let path = gguf_path();
    let cfg = LoadConfig {
        pack_dir: path.parent().unwrap().to_path_buf(),
        family: "gpt-oss".into(),
        format: "gguf".into(),
        weights: vec![path.clone()],
        threads: Some(2),
        ..Default::default()
    };
    GptOssFamily::create(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn gpt_oss_tiny_matches_reference_logits() {
    check_tiny_reference(&mut load(), "gpt_oss");
}

#[test]
fn gpt_oss_tiny_gguf_from_llama_cpp_matches_reference_logits() {
    check_tiny_reference(&mut load_gguf(), "gpt_oss");
}

/// `max |got - want| / max |want|`.
fn ratio(got: &[f32], want: &[f32]) -> f32 {
    let max_logit = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / max_logit
}

/// Both packs follow transformers to float rounding, prefill and token by token, which
/// [`check_tiny_reference`]'s 1e-3 would not show: rounding YaRN's correction range (the
/// `truncate` the GGUF does not record) alone moves these logits by 5e-4.
#[test]
fn gpt_oss_tiny_matches_reference_to_float_rounding() {
    let dir = tiny_fixture("gpt_oss");
    let full = read_npy_f32(dir.join("logits.npy")).unwrap();
    let steps = read_npy_f32(dir.join("decode_logits.npy")).unwrap();
    let pos: Vec<i32> = (0..8).collect();
    for (what, mut m) in [("safetensors", load()), ("gguf", load_gguf())] {
        let got = decode(&mut m, &TINY_IDS, &pos, &[0; 8], &[1; 8]);
        let prefill = ratio(&got, &full.data);
        let mut stepwise = 0.0f32;
        for (i, &t) in TINY_IDS.iter().enumerate() {
            let got = decode(&mut m, &[t], &[i as i32], &[1], &[1]);
            stepwise = stepwise.max(ratio(&got, steps.row(i)));
        }
        eprintln!("{what}: max|diff| / max|logit|: prefill {prefill:.1e}, token by token {stepwise:.1e}");
        assert!(
            prefill < 1e-5 && stepwise < 1e-5,
            "{what}: {prefill} / {stepwise}"
        );
    }
}

#[test]
fn gpt_oss_describes_itself() {
    let m = load();
    let d = m.describe();
    assert_eq!(d.rewind, Rewind::Anywhere);
    assert_eq!(d.vocab_size, 512);
    assert_eq!(d.extra["architecture"], "gpt-oss");
    // The fixture has no tokenizer and no eos: no stops, nothing breaks.
    assert!(d.stop_tokens.is_empty());
    let g = load_gguf().describe();
    assert_eq!(g.extra["architecture"], "gpt-oss");
    // The converted pack's stand-in vocabulary carries the harmony specials at 507..511 with
    // eos `<|return|>`: it stops on `<|return|>` and `<|call|>`, never on `<|end|>`.
    let special = &g.extra["special_tokens"];
    assert_eq!(special["<|return|>"], 509);
    assert_eq!(special["<|call|>"], 510);
    assert_eq!(special["<|end|>"], 511);
    assert_eq!(g.stop_tokens, vec![509, 510]);
}

#[test]
fn gpt_oss_batched_sequences_decode_as_alone() {
    check_batched_equals_alone(&mut load(), 512);
    check_batched_equals_alone(&mut load_gguf(), 512);
}

#[test]
fn gpt_oss_fork_continues_like_a_fresh_prefill() {
    check_fork(&mut load(), 512);
}

#[test]
fn gpt_oss_rewind_matches_a_fresh_prefill() {
    check_rewind(&mut load(), 512);
}
