//! Checks every family runs in its tests: logits against a reference, greedy decoding, and the
//! multi-sequence contract (batching, fork, rewind) on any plugin [`Model`].

use crate::npy::{read_npy_f32, shared_fixtures};
use berth_plugin_api::{BatchView, Family, LogitsOut, Model, Rewind};
use serde_json::json;
use std::path::PathBuf;

/// The input ids of every tiny reference model (`reference.json`).
pub const TINY_IDS: [i32; 8] = [1, 17, 42, 256, 100, 31, 7, 511];

/// A real model fetched (or found verified in the cache) by the repository's
/// `scripts/fetch-models NAME`: the path it prints (a file, or EmbeddingGemma's directory).
pub fn fetched_model(name: &str) -> PathBuf {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models");
    let out = std::process::Command::new(script)
        .arg(name)
        .output()
        .expect("run scripts/fetch-models");
    assert!(
        out.status.success(),
        "fetch-models {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(path.lines().last().expect("fetch-models prints the path").trim())
}

/// A tiny reference model's directory (`../shared/fixtures/reference-tiny/NAME`).
pub fn tiny_fixture(name: &str) -> PathBuf {
    shared_fixtures().join("reference-tiny").join(name)
}

/// Runs one batch and returns the logits of the rows that want them.
pub fn decode(m: &mut dyn Model, tokens: &[i32], positions: &[i32], seqs: &[i32], want: &[u8]) -> Vec<f32> {
    let v = m.describe().vocab_size as usize;
    let rows = want.iter().filter(|&&w| w != 0).count();
    let mut out = vec![0.0; rows * v];
    let b = BatchView {
        tokens,
        positions,
        seq_ids: seqs,
        want_logits: want,
    };
    m.decode(&b, &mut LogitsOut::new(&mut out, v))
        .unwrap_or_else(|e| panic!("decode: {e}"));
    out
}

/// Feeds `tokens` to `seq` from position `start` in one batch; the last row's logits.
pub fn feed(m: &mut dyn Model, seq: i32, start: usize, tokens: &[i32]) -> Vec<f32> {
    let n = tokens.len();
    let pos: Vec<i32> = (start..start + n).map(|p| p as i32).collect();
    let mut want = vec![0u8; n];
    want[n - 1] = 1;
    decode(m, tokens, &pos, &vec![seq; n], &want)
}

/// Index of the largest logit.
pub fn argmax(x: &[f32]) -> i32 {
    x.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0 as i32
}

/// Asserts `max |got - want| ≤ 1e-3 × max |want|`; returns that ratio.
pub fn assert_close(got: &[f32], want: &[f32], what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let max_logit = want.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    let max_diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(
        max_diff <= 1e-3 * max_logit,
        "{what}: max|diff| {max_diff} > 1e-3 × {max_logit}"
    );
    max_diff / max_logit
}

/// The full-prefill logits and the token-by-token logits (through the caches and states) match
/// a tiny reference model's `logits.npy` and `decode_logits.npy`.
pub fn check_tiny_reference(m: &mut dyn Model, name: &str) {
    let dir = tiny_fixture(name);
    let full = read_npy_f32(dir.join("logits.npy")).unwrap();
    let stepwise = read_npy_f32(dir.join("decode_logits.npy")).unwrap();
    let v = m.describe().vocab_size as usize;
    assert_eq!(full.shape, vec![8, v]);
    let pos: Vec<i32> = (0..8).collect();
    let got = decode(m, &TINY_IDS, &pos, &[0; 8], &[1; 8]);
    let prefill = assert_close(&got, &full.data, &format!("{name} full forward"));
    let mut steps = 0.0f32;
    for (i, &t) in TINY_IDS.iter().enumerate() {
        let got = decode(m, &[t], &[i as i32], &[1], &[1]);
        steps = steps.max(assert_close(
            &got,
            stepwise.row(i),
            &format!("{name} decode step {i}"),
        ));
    }
    eprintln!("{name}: max|diff| / max|logit|: prefill {prefill:.1e}, token by token {steps:.1e}");
}

/// Greedy continuation of `prompt` in sequence `seq` (emptied first): `steps` tokens.
pub fn greedy(m: &mut dyn Model, seq: i32, prompt: &[i32], steps: usize) -> Vec<i32> {
    m.seq_truncate(seq, 0).unwrap();
    let mut logits = feed(m, seq, 0, prompt);
    let mut out = Vec::new();
    for i in 0..steps {
        let t = argmax(&logits);
        out.push(t);
        logits = feed(m, seq, prompt.len() + i, &[t]);
    }
    out
}

/// Four sequences with prompts of different lengths, prefilled and then decoded together in
/// batches, give each the greedy tokens it gets alone.
pub fn check_batched_equals_alone(m: &mut dyn Model, vocab: i32) {
    let prompts: Vec<Vec<i32>> = [3usize, 11, 70, 130]
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n).map(|i| ((i * 37 + s * 101 + 5) as i32) % vocab).collect())
        .collect();
    let steps = 6;
    let alone: Vec<Vec<i32>> = prompts.iter().map(|p| greedy(m, 0, p, steps)).collect();
    for s in 0..4 {
        m.seq_truncate(s, 0).unwrap();
    }
    // All four prompts in one batch, then all four decode steps together.
    let (mut toks, mut pos, mut seqs, mut want) = (vec![], vec![], vec![], vec![]);
    for (s, p) in prompts.iter().enumerate() {
        for (i, &t) in p.iter().enumerate() {
            toks.push(t);
            pos.push(i as i32);
            seqs.push(s as i32);
            want.push(u8::from(i + 1 == p.len()));
        }
    }
    let v = m.describe().vocab_size as usize;
    let mut logits = decode(m, &toks, &pos, &seqs, &want);
    let mut got = vec![Vec::new(); 4];
    for step in 0..steps {
        let next: Vec<i32> = (0..4).map(|s| argmax(&logits[s * v..(s + 1) * v])).collect();
        for s in 0..4 {
            got[s].push(next[s]);
        }
        let pos: Vec<i32> = prompts.iter().map(|p| (p.len() + step) as i32).collect();
        logits = decode(m, &next, &pos, &[0, 1, 2, 3], &[1; 4]);
    }
    assert_eq!(
        got, alone,
        "batched greedy tokens differ from each sequence alone"
    );
}

/// A forked sequence continues like a fresh one with the same prefix, and the source is kept.
pub fn check_fork(m: &mut dyn Model, vocab: i32) {
    let prompt: Vec<i32> = (0..40).map(|i| (i * 13 + 7) % vocab).collect();
    let fresh = greedy(m, 2, &prompt, 5);
    m.seq_truncate(0, 0).unwrap();
    feed(m, 0, 0, &prompt);
    m.seq_fork(0, 1).unwrap();
    // Decode the fork: its logits after the prompt are the source's.
    let mut logits = feed(m, 1, prompt.len(), &[fresh[0]]);
    let mut got = vec![fresh[0]];
    for i in 1..5 {
        let t = argmax(&logits);
        got.push(t);
        logits = feed(m, 1, prompt.len() + i, &[t]);
    }
    assert_eq!(got, fresh, "forked sequence diverged from a fresh prefill");
    let src = feed(m, 0, prompt.len(), &[fresh[0]]);
    assert_eq!(argmax(&src), fresh[1], "the fork's source changed");
}

/// Truncating to a rewind point the model allows and decoding again gives the logits of a fresh
/// prefill; a point it does not allow is refused and leaves the sequence usable.
pub fn check_rewind(m: &mut dyn Model, vocab: i32) {
    let rule = m.describe().rewind;
    let every = match rule {
        Rewind::Snapshots { every } => every as usize,
        Rewind::Anywhere => 1,
        Rewind::OnlyToStart => 0,
    };
    let long: Vec<i32> = (0..150).map(|i| (i * 29 + 3) % vocab).collect();
    let cut = 100usize.checked_div(every).map_or(0, |k| k * every);
    assert!(
        cut > 0 || every == 0,
        "a snapshot every {every} positions leaves no point below 100"
    );
    let tail: Vec<i32> = (0..7).map(|i| (i * 5 + 11) % vocab).collect();
    let mut fresh_prompt = long[..cut].to_vec();
    fresh_prompt.extend(&tail);
    let want = {
        m.seq_truncate(3, 0).unwrap();
        feed(m, 3, 0, &fresh_prompt)
    };
    m.seq_truncate(0, 0).unwrap();
    // Prefill in pieces that cross snapshot points, then go back.
    feed(m, 0, 0, &long[..61]);
    feed(m, 0, 61, &long[61..]);
    if every > 1 && cut + 1 < long.len() {
        assert!(
            m.seq_truncate(0, (cut + 1) as u32).is_err(),
            "rewind to {} was not refused",
            cut + 1
        );
    }
    m.seq_truncate(0, cut as u32).unwrap();
    let got = feed(m, 0, cut, &tail);
    assert_close(&got, &want, "decoding after a rewind");
    if every > 1 {
        // Bit-identical: the same rows went through the same state.
        assert_eq!(argmax(&got), argmax(&want));
    }
}

/// A family's probe scores 100 for each of `architectures` under its own `family` name, and 0
/// for an architecture it does not know or a pack of another family; its manifest lists the
/// family.
pub fn check_probe<F: Family>(family: &str, architectures: &[&str]) {
    for a in architectures {
        let pack = json!({"family": family, "architecture": a, "format": "gguf"});
        assert_eq!(F::probe(&pack), 100, "{family} / {a}");
    }
    assert_eq!(F::probe(&json!({"family": family, "architecture": "llama"})), 0);
    assert_eq!(
        F::probe(&json!({"family": "other", "architecture": architectures[0]})),
        0
    );
    let m = F::manifest();
    assert_eq!(m.families, [family]);
}

/// Allocations made by warm single-token decode steps: 16 steps of sequence 0 warm the buffers
/// up, then a window of 4 steps after a rewind to 8 is counted with `allocations` (the test
/// binary's counting allocator), up to three times until a window allocates nothing (a pool
/// worker that first joins a job late may allocate once per thread). The counts per window.
pub fn warm_step_allocations(m: &mut dyn Model, allocations: fn() -> usize) -> Vec<usize> {
    let v = m.describe().vocab_size as usize;
    let mut row = vec![0.0; v];
    let mut step = |m: &mut dyn Model, i: usize| {
        let b = BatchView {
            tokens: &[(7 * i % 500) as i32],
            positions: &[i as i32],
            seq_ids: &[0],
            want_logits: &[1],
        };
        m.decode(&b, &mut LogitsOut::new(&mut row, v)).unwrap();
    };
    for i in 0..16 {
        step(m, i);
    }
    let mut counts = Vec::new();
    for _ in 0..3 {
        m.seq_truncate(0, 8).unwrap();
        let before = allocations();
        for i in 8..12 {
            step(m, i);
        }
        counts.push(allocations() - before);
        if counts.last() == Some(&0) {
            break;
        }
    }
    counts
}
