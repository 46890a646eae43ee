//! What the C ABI costs per decode call: one single-token decode (one sequence, logits wanted,
//! vocabulary 512) through `Plugin` / `ModelInstance` (entry table, vtable, `catch_unwind`, error
//! buffer) versus the same call made directly on `ScriptedModel` through the `Model` trait.
//! Each iteration truncates the sequence back so the state stays the same.
//!
//! Run: `cargo bench -p berth-plugin-scripted --bench abi_decode -- --warm-up-time 1 --measurement-time 3`

use berth_plugin_api::{BatchView, LoadConfig, LogitsOut, Model, Plugin};
use berth_scripted::{Script, ScriptedModel};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

const VOCAB: usize = 512;
/// Tokens already in the sequence before the benchmarked one.
const PROMPT: [i32; 4] = [1, 2, 3, 4];
// The step batch sits at position 4, right after the prompt.
const _: () = assert!(PROMPT.len() == 4);

fn script_json() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": VOCAB,
        "stop_tokens": [0],
        "entries": [{"reply": [10, 11, 12]}],
    })
}

/// The benchmarked batch: one token appended to sequence 0 after the prompt.
fn step_batch() -> BatchView<'static> {
    BatchView {
        tokens: &[7],
        positions: &[4],
        seq_ids: &[0],
        want_logits: &[1],
    }
}

/// The prompt, decoded once before measuring.
fn prompt_batch() -> BatchView<'static> {
    BatchView {
        tokens: &PROMPT,
        positions: &[0, 1, 2, 3],
        seq_ids: &[0; 4],
        want_logits: &[0; 4],
    }
}

fn decode_through_abi(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.json"), script_json().to_string()).unwrap();
    let config = serde_json::to_string(&LoadConfig {
        pack_dir: dir.path().to_path_buf(),
        family: "scripted".into(),
        ..Default::default()
    })
    .unwrap();
    // SAFETY: the table comes from the scripted crate's own entry point, valid for the process.
    let plugin = unsafe { Plugin::from_entry(berth_scripted::berth_plugin_entry_v1()) }.unwrap();
    let mut model = plugin.create(&config).unwrap();
    let mut logits = vec![0.0f32; VOCAB];
    model.decode(&prompt_batch(), &mut logits).unwrap();
    let batch = step_batch();
    c.bench_function("decode 1 token, vocab 512: through the C ABI", |b| {
        b.iter(|| {
            let rows = model.decode(black_box(&batch), &mut logits).unwrap();
            model.seq_truncate(0, PROMPT.len() as u32).unwrap();
            black_box((rows, &logits));
        })
    });
}

fn decode_direct(c: &mut Criterion) {
    let script: Script = serde_json::from_value(script_json()).unwrap();
    let mut model = ScriptedModel::new(script).unwrap();
    let mut logits = vec![0.0f32; VOCAB];
    model
        .decode(&prompt_batch(), &mut LogitsOut::new(&mut logits, VOCAB))
        .unwrap();
    let batch = step_batch();
    c.bench_function("decode 1 token, vocab 512: direct Model call", |b| {
        b.iter(|| {
            let mut out = LogitsOut::new(&mut logits, VOCAB);
            model.decode(black_box(&batch), &mut out).unwrap();
            model.seq_truncate(0, PROMPT.len() as u32).unwrap();
            black_box(&logits);
        })
    });
}

criterion_group!(benches, decode_through_abi, decode_direct);
criterion_main!(benches);
