//! The plugin on the real Gemma 3 270M base Q4_K_M GGUF (fetched by `scripts/fetch-models`),
//! against transformers' float32-dequantised reference and llama.cpp's own deviation from it.

use berth_gemma::{GemmaFamily, GemmaModel};
use berth_plugin_api::{BatchView, Family, LoadConfig, LogitsOut, Model};
use berth_plugin_common::npy::read_npy_f32;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

/// "The Eiffel Tower is located in the city of" with BOS, from the GGUF vocabulary's pieces.
const EIFFEL: [i32; 10] = [2, 818, 94648, 25822, 563, 5628, 528, 506, 3207, 529];
/// "▁Paris".
const PARIS: i32 = 9079;

/// The real model's reference fixtures (transformers and llama.cpp on the same GGUF).
fn fixtures() -> PathBuf {
    berth_plugin_common::npy::shared_fixtures().join("gemma3-270m")
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The model path, fetched (or found verified in the cache) by the repository's script.
fn model_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| berth_plugin_common::testing::fetched_model("gemma3-270m"))
        .clone()
}

fn load(threads: u32) -> GemmaModel {
    load_with(threads, false)
}

fn load_with(threads: u32, dequantize: bool) -> GemmaModel {
    let path = model_path();
    let cfg = LoadConfig {
        pack_dir: path.parent().unwrap().to_path_buf(),
        family: "gemma".into(),
        architecture: "gemma3".into(),
        format: "gguf".into(),
        weights: vec![path],
        threads: Some(threads),
        options: serde_json::json!({ "dequantize": dequantize })
            .as_object()
            .unwrap()
            .clone(),
        ..Default::default()
    };
    GemmaFamily::create(&cfg).unwrap()
}

fn argmax(row: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as i32
}

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap() as i32)
        .collect()
}

/// Prefills `prompt` into sequence `seq` and decodes greedily; returns the tokens and the logits
/// of every step.
fn greedy(m: &mut GemmaModel, seq: i32, prompt: &[i32], steps: usize) -> (Vec<i32>, Vec<Vec<f32>>) {
    let v = m.describe().vocab_size as usize;
    let mut logits = vec![0.0; v];
    let pos: Vec<i32> = (0..prompt.len() as i32).collect();
    let mut want = vec![0u8; prompt.len()];
    *want.last_mut().unwrap() = 1;
    let b = BatchView {
        tokens: prompt,
        positions: &pos,
        seq_ids: &vec![seq; prompt.len()],
        want_logits: &want,
    };
    m.decode(&b, &mut LogitsOut::new(&mut logits, v)).unwrap();
    let mut out = vec![argmax(&logits)];
    let mut all = vec![logits.clone()];
    while out.len() < steps {
        let p = (prompt.len() + out.len() - 1) as i32;
        let b = BatchView {
            tokens: &[*out.last().unwrap()],
            positions: &[p],
            seq_ids: &[seq],
            want_logits: &[1],
        };
        m.decode(&b, &mut LogitsOut::new(&mut logits, v)).unwrap();
        out.push(argmax(&logits));
        all.push(logits.clone());
    }
    (out, all)
}

#[test]
fn describe_reads_the_gguf() {
    let m = load(2);
    let d = m.describe();
    assert_eq!(d.vocab_size, 262144);
    assert_eq!(d.context_length, 32768);
    // <eos> and <end_of_turn>.
    assert!(
        d.stop_tokens.contains(&1) && d.stop_tokens.contains(&106),
        "{:?}",
        d.stop_tokens
    );
    assert_eq!(d.extra["architecture"], "gemma3");
    assert_eq!(d.extra["special_tokens"]["bos"], 2);
    assert_eq!(d.extra["special_tokens"]["<start_of_turn>"], 105);
    let cfg = &m.decoder().cfg;
    assert_eq!(
        (
            cfg.n_layers,
            cfg.hidden,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim
        ),
        (18, 640, 4, 1, 256)
    );
    assert_eq!(cfg.sliding_window[0], Some(512));
    assert_eq!(cfg.sliding_window[5], None);
    assert_eq!((cfg.rope_base[4], cfg.rope_base[5]), (10000.0, 1_000_000.0));
    assert!(!cfg.norm_add_one);
}

#[test]
fn greedy_steps_match_the_reference() {
    check_reference(false);
}

#[test]
fn dequantised_weights_match_the_reference_closely() {
    check_reference(true);
}

/// A llama.cpp case's name, prompt ids and first-step `(token, logit)` top 5.
type FirstStep = (String, Vec<i32>, Vec<(usize, f32)>);

/// The logits of llama.cpp's first greedy step (`first_step_top5`) for each case of the
/// `scripts/llamacpp-reference` fixture.
fn llama_cpp_first_step_top5() -> Vec<FirstStep> {
    let j = llama_cpp_cases();
    j["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let top5 = case["first_step_top5"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap() as f32))
                .collect();
            (
                case["name"].as_str().unwrap().to_string(),
                ids(&case["prompt_ids"]),
                top5,
            )
        })
        .collect()
}

/// The bounds on this engine's distance from transformers' float32 reference, all derived from
/// llama.cpp's own figures on the same file and prompt: `(max |diff|, mean |diff|, top-10 overlap)`.
fn bounds_from_llama_cpp() -> (f32, f32, usize) {
    let lc = json("reference_llamacpp.json");
    let steps = lc["steps"].as_array().unwrap();
    // llama.cpp's own deviation from the reference (`reference_llamacpp.json`): max 0.943,
    // mean up to 0.182 over the three steps.
    let llama_max = steps
        .iter()
        .map(|s| s["max_abs_diff_vs_hf_full_vocab"].as_f64().unwrap() as f32)
        .fold(0.0, f32::max);
    let llama_mean = steps
        .iter()
        .map(|s| s["mean_abs_diff"].as_f64().unwrap() as f32)
        .fold(0.0, f32::max);
    // llama.cpp's own top-10 shares 10, 10 and 9 ids with the reference's.
    let llama_overlap = steps
        .iter()
        .map(|s| {
            let hf = ids(&s["hf_top10_ids"]);
            ids(&s["top10_ids"]).iter().filter(|t| hf.contains(t)).count()
        })
        .min()
        .unwrap();
    eprintln!("bounds: llama.cpp max {llama_max:.3}, mean {llama_mean:.3}, top-10 overlap {llama_overlap}");
    // No further from transformers than llama.cpp: its largest difference over the three steps
    // (this engine is measured at 0.77, 0.86, 0.79), its largest mean difference (measured
    // 0.144, 0.129, 0.132) and its smallest top-10 overlap (measured 9, 9, 10). The
    // dequantised check stays at 1e-3.
    (llama_max, llama_mean, llama_overlap)
}

fn check_reference(dequantize: bool) {
    let r = json("reference.json");
    let lc = json("reference_llamacpp.json");
    let prompt = ids(&r["prompt_ids"]);
    let want = ids(&r["greedy_continuation_ids"]);
    let ref_logits = read_npy_f32(fixtures().join("reference_logits.npy")).unwrap();
    let (max_bound, mean_bound, overlap_bound) = bounds_from_llama_cpp();
    let mut m = load_with(2, dequantize);
    let (got, logits) = greedy(&mut m, 0, &prompt, want.len());
    assert_eq!(got, want);
    for (i, step) in r["steps"].as_array().unwrap().iter().enumerate() {
        assert_eq!(got[i] as i64, step["argmax"].as_i64().unwrap(), "step {i}");
        let reference = ref_logits.row(i);
        let max_diff = logits[i]
            .iter()
            .zip(reference)
            .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
        let mean_diff = logits[i]
            .iter()
            .zip(reference)
            .map(|(x, y)| (x - y).abs())
            .sum::<f32>()
            / reference.len() as f32;
        let llama = lc["steps"][i]["max_abs_diff_vs_hf_full_vocab"].as_f64().unwrap();
        let top10 = ids(&step["top10_ids"]);
        let mut ours: Vec<(usize, f32)> = logits[i].iter().copied().enumerate().collect();
        ours.sort_by(|a, b| b.1.total_cmp(&a.1));
        let shared = ours[..10]
            .iter()
            .filter(|(t, _)| top10.contains(&(*t as i32)))
            .count();
        eprintln!(
            "dequantize {dequantize} step {i}: max|diff| {max_diff:.3e} mean {mean_diff:.3e} \
             (llama.cpp max {llama:.3}); top-10 overlap {shared}/10"
        );
        if dequantize {
            // Same weights, f32 activations: only summation order differs (measured: max
            // 1.5e-5, mean 4e-6). 1e-3 is within the float32 agreement the fixtures README
            // reports for llama.cpp's own engine against transformers on gemma3 (~2e-3).
            assert!(max_diff < 1e-3, "step {i}: max|diff| {max_diff}");
            assert_eq!(shared, 10, "step {i}: top-10 overlap {shared}");
        } else {
            // Q8 activations as llama.cpp's (measured 2026-12-06: max 0.77, 0.86, 0.79; mean
            // 0.13-0.14).
            assert!(
                max_diff <= max_bound,
                "step {i}: max|diff| {max_diff} > {max_bound} (llama.cpp {llama})"
            );
            assert!(
                mean_diff <= mean_bound,
                "step {i}: mean|diff| {mean_diff} > {mean_bound}"
            );
            assert!(
                shared >= overlap_bound,
                "step {i}: top-10 overlap {shared} < {overlap_bound}"
            );
        }
    }
}

#[test]
fn paris_follows_the_eiffel_tower() {
    let g = berth_formats::GgufFile::open(model_path()).unwrap();
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    let text: Vec<&str> = EIFFEL.iter().map(|&t| tokens[t as usize]).collect();
    assert_eq!(
        text,
        [
            "<bos>",
            "The",
            "▁Eiffel",
            "▁Tower",
            "▁is",
            "▁located",
            "▁in",
            "▁the",
            "▁city",
            "▁of"
        ]
    );
    assert_eq!(tokens[PARIS as usize], "▁Paris");
    assert_eq!(tokens[106], "<end_of_turn>");

    let mut m = load(2);
    let (out, _) = greedy(&mut m, 0, &EIFFEL, 8);
    let words: String = out
        .iter()
        .map(|&t| tokens[t as usize])
        .collect::<String>()
        .replace('▁', " ");
    eprintln!("continuation: {out:?} {words:?}");
    // The very next token, not just somewhere in the continuation.
    assert_eq!(out[0], PARIS, "{words:?}");
    // llama.cpp's greedy continuation of this prompt (" Paris, France. It is the tallest").
    let j = llama_cpp_cases();
    let case = j["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| ids(&c["prompt_ids"]) == EIFFEL)
        .expect("the llama.cpp fixture has the Eiffel prompt");
    let margins = f64s(&case["step_top1_top2_margin"]);
    // Every step before llama.cpp's first near-tie must agree (the first is at step 17), so all 8.
    let clear = margins.iter().position(|&d| d < NEAR_TIE).unwrap_or(8).min(8);
    assert_eq!(clear, 8, "{margins:?}");
    assert_eq!(out[..clear], ids(&case["generated_ids"])[..clear], "{words:?}");
}

#[test]
fn batched_forked_and_truncated_sequences_agree() {
    let mut m = load(2);
    let v = m.describe().vocab_size as usize;
    let (alone, logits) = greedy(&mut m, 0, &EIFFEL, 4);
    // Two sequences in one batch: the Eiffel prompt in 1 and a shorter prompt in 2.
    let short = [2, 818, 5279, 529, 7001, 563];
    let mut toks = EIFFEL.to_vec();
    toks.extend_from_slice(&short);
    let mut pos: Vec<i32> = (0..10).collect();
    pos.extend(0..6);
    let mut seqs = vec![1; 10];
    seqs.extend([2; 6]);
    let mut want = vec![0u8; 16];
    want[9] = 1;
    want[15] = 1;
    let mut out = vec![0.0; 2 * v];
    let b = BatchView {
        tokens: &toks,
        positions: &pos,
        seq_ids: &seqs,
        want_logits: &want,
    };
    m.decode(&b, &mut LogitsOut::new(&mut out, v)).unwrap();
    // A prompt batched with another sequence's prompt: the same numbers as alone.
    assert_bits_equal(&out[..v], &logits[0], "batched prompt row vs alone");
    assert_eq!(argmax(&out[v..]), 506, "short prompt in the batch");

    // Fork sequence 0 after its prompt and first token, then continue both the same way.
    m.seq_truncate(0, 11).unwrap();
    m.seq_fork(0, 3).unwrap();
    let mut two = vec![0.0; 2 * v];
    let b = BatchView {
        tokens: &[alone[1], alone[1]],
        positions: &[11, 11],
        seq_ids: &[0, 3],
        want_logits: &[1, 1],
    };
    m.decode(&b, &mut LogitsOut::new(&mut two, v)).unwrap();
    // Both forks compute the same thing in the same batch.
    assert_bits_equal(&two[..v], &two[v..], "two forks in one batch");
    // And each equals the unbatched run's step bit for bit (measured: 0 values differ; the
    // batched kernels keep one row's float order, as continuous batching requires).
    assert_bits_equal(&two[..v], &logits[2], "forked row vs unbatched step");
    // One row at a time, each fork repeats the unbatched step exactly.
    for seq in [0, 3] {
        m.seq_truncate(seq, 11).unwrap();
        let mut one = vec![0.0; v];
        let b = BatchView {
            tokens: &[alone[1]],
            positions: &[11],
            seq_ids: &[seq],
            want_logits: &[1],
        };
        m.decode(&b, &mut LogitsOut::new(&mut one, v)).unwrap();
        assert_bits_equal(&one, &logits[2], &format!("fork {seq} alone vs unbatched step"));
    }
}

/// Asserts two logit rows are bit-identical, naming how many values differ and the largest gap.
fn assert_bits_equal(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let differ = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let gap = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert_eq!(differ, 0, "{what}: {differ} logits differ (max |diff| {gap})");
}

/// Prompt-processing and generation speed; run with
/// `cargo test -p berth-plugin-gemma --release --test real -- --ignored --nocapture speed`.
#[test]
#[ignore = "benchmark"]
fn speed() {
    for threads in [1u32, 2] {
        let mut m = load(threads);
        let v = m.describe().vocab_size as usize;
        let mut logits = vec![0.0; v];
        let prompt: Vec<i32> = (0..128).map(|i| EIFFEL[1 + i % 9] + (i / 9) as i32).collect();
        let pos: Vec<i32> = (0..128).collect();
        let mut want = vec![0u8; 128];
        want[127] = 1;
        // Warm up (page in the weights).
        greedy(&mut m, 0, &EIFFEL, 2);
        m.seq_truncate(0, 0).unwrap();
        let t = Instant::now();
        let b = BatchView {
            tokens: &prompt,
            positions: &pos,
            seq_ids: &[0; 128],
            want_logits: &want,
        };
        m.decode(&b, &mut LogitsOut::new(&mut logits, v)).unwrap();
        let pp = 128.0 / t.elapsed().as_secs_f64();
        let mut tok = argmax(&logits);
        let t = Instant::now();
        for i in 0..32 {
            let b = BatchView {
                tokens: &[tok],
                positions: &[128 + i],
                seq_ids: &[0],
                want_logits: &[1],
            };
            m.decode(&b, &mut LogitsOut::new(&mut logits, v)).unwrap();
            tok = argmax(&logits);
        }
        let tg = 32.0 / t.elapsed().as_secs_f64();
        eprintln!(
            "threads {threads}: prompt {pp:.1} tok/s (128 tokens), generation {tg:.1} tok/s (32 tokens)"
        );
    }
}

/// Steps whose top-2 logits are closer than this are near-ties, which may flip under any other
/// float order: llama.cpp's own AVX2 and AVX-512 builds part at a step of margin 0.033 (eiffel,
/// step 7). The old rule (0.1) let a case stop agreeing at margins three times that.
const NEAR_TIE: f64 = 0.01;

/// Tokens each case must share with llama.cpp's greedy run, at least, and why. Without an
/// exception the minimum is every step before llama.cpp's first near-tie (capped at 32).
const MIN_EQUAL: [(&str, usize, Option<&str>); 3] = [
    // llama.cpp's margin is 0.008 at step 17. (Its own AVX-512 build agrees with its AVX2 build
    // for 7 tokens only.)
    ("eiffel", 17, None),
    // llama.cpp's margin is 0.003 at step 15 (this engine agrees for all 32).
    ("france", 15, None),
    // Step 5 is a near-tie of the weights themselves: teacher-forced on llama.cpp's tokens, the
    // f32 run (`dequantize`) puts 7489 over 1015 by 0.082, this engine's quantised kernels put
    // 1015 over 7489 by 0.011 and llama.cpp's 7489 over 1015 by 0.239, so both quantised runs
    // sit about as far from the exact arithmetic, on either side (measured 2026-12-06). KL
    // divergence over 4080 tokens of text says the same of the whole distribution
    // (docs/bench/accuracy-2026-12-06.md: 0.00500 here, 0.00502 for llama.cpp).
    ("once", 5, Some("the weights' own near-tie at step 5")),
];

#[test]
fn greedy_tokens_match_llama_cpp() {
    // Recorded by `scripts/llamacpp-reference` with llama.cpp on the same quantised file, on x86
    // with AVX2 and no AVX-512. This engine's float order is not ggml's (packed Q*_0 blocks), so
    // tokens must agree for the stated minimum of each case, which is every step before
    // llama.cpp's first near-tie unless an exception says why not.
    let j = llama_cpp_cases();
    let mut m = load(2);
    for (seq, case) in j["cases"].as_array().unwrap().iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        let margins = f64s(&case["step_top1_top2_margin"]);
        let n = want.len().min(32);
        let (got, _) = greedy(&mut m, seq as i32, &prompt, n);
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        let first_tie = margins.iter().position(|&d| d < NEAR_TIE).unwrap_or(n).min(n);
        eprintln!("{name}: {same} of {n} tokens equal (first near-tie at step {first_tie})");
        let (_, min, exception) = MIN_EQUAL
            .iter()
            .find(|(c, _, _)| *c == name)
            .unwrap_or_else(|| panic!("{name}: no stated minimum"));
        if exception.is_none() {
            assert_eq!(*min, first_tie, "{name}: the stated minimum is not the rule's");
        }
        assert!(
            same >= *min,
            "{name}: differs at step {same}, under the stated minimum {min}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Tolerance on the prompt logits against llama.cpp's: llama.cpp's own AVX2 build (the fixture)
/// and its AVX-512 build (`-march=native` on a Zen 4 EPYC, 2026-12-06) differ by up to 0.475 on
/// these first-step top-5 logits (eiffel; 0.15 on Qwen's prompts), and an engine can be held no
/// closer to one build than the builds are to each other. Measured here: 0.235.
const PROMPT_LOGIT_TOLERANCE: f32 = 0.475;

/// llama.cpp's prompt logits, closely: for each case of the `scripts/llamacpp-reference`
/// fixture (llama.cpp on the same quantised file), this engine's logits after the prompt are
/// within [`PROMPT_LOGIT_TOLERANCE`] of llama.cpp's first-step top-5 logits, and its top token
/// is llama.cpp's where llama.cpp's own top-2 margin is clear.
#[test]
fn prompt_logits_match_llama_cpp_closely() {
    let mut m = load(2);
    let mut worst = 0.0f32;
    for (seq, (name, prompt, top5)) in llama_cpp_first_step_top5().into_iter().enumerate() {
        let (_, logits) = greedy(&mut m, seq as i32, &prompt, 1);
        for &(t, want) in &top5 {
            let got = logits[0][t];
            worst = worst.max((got - want).abs());
            eprintln!("{name}: token {t}: {got} vs llama.cpp {want}");
            assert!(got.is_finite(), "{name}: token {t}: {got}");
        }
        let (best, second) = (top5[0], top5[1]);
        if (best.1 - second.1) as f64 >= NEAR_TIE {
            assert_eq!(argmax(&logits[0]) as usize, best.0, "{name}: top token");
        }
    }
    eprintln!("prompt logits: largest difference from llama.cpp {worst}");
    assert!(worst <= PROMPT_LOGIT_TOLERANCE, "largest difference {worst}");
}

/// `tests/fixtures/llamacpp/gemma3-270m.json`, recorded by `scripts/llamacpp-reference`.
fn llama_cpp_cases() -> Value {
    let path = repo_root().join("tests/fixtures/llamacpp/gemma3-270m.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Loads the real GGUF from a pack directory of a store (its manifest beside it), as `berth
/// serve` does, so the load keeps its packed weights there.
fn load_from_pack(dir: &std::path::Path) -> GemmaModel {
    let cfg = LoadConfig {
        pack_dir: dir.to_path_buf(),
        family: "gemma".into(),
        architecture: "gemma3".into(),
        format: "gguf".into(),
        weights: vec![dir.join("model.gguf")],
        threads: Some(2),
        ..Default::default()
    };
    GemmaFamily::create(&cfg).unwrap()
}

#[test]
fn a_warm_load_reads_the_packed_weights_back_and_answers_bit_for_bit_alike() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model.gguf");
    if std::fs::hard_link(model_path(), &gguf).is_err() {
        std::fs::copy(model_path(), &gguf).unwrap();
    }
    std::fs::write(dir.path().join("pack.toml"), "# a stand-in manifest\n").unwrap();
    let report = |m: &GemmaModel| m.describe().extra["pack_cache"].clone();

    let t = Instant::now();
    let mut cold = load_from_pack(dir.path());
    let cold_s = t.elapsed().as_secs_f64();
    let r = report(&cold);
    assert_eq!(
        (r["read"].as_u64(), r["written"].as_bool()),
        (Some(0), Some(true)),
        "{r}"
    );
    let packed = r["packed"].as_u64().unwrap();
    assert!(packed > 0, "{r}");
    let (want, want_logits) = greedy(&mut cold, 0, &EIFFEL, 4);
    drop(cold);

    let t = Instant::now();
    let mut warm = load_from_pack(dir.path());
    let warm_s = t.elapsed().as_secs_f64();
    let r = report(&warm);
    assert_eq!(r["read"].as_u64(), Some(packed), "every matrix read back: {r}");
    assert_eq!(
        (r["packed"].as_u64(), r["written"].as_bool()),
        (Some(0), Some(false)),
        "{r}"
    );
    let (got, got_logits) = greedy(&mut warm, 0, &EIFFEL, 4);
    assert_eq!(got, want);
    let bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&got_logits) == bits(&want_logits),
        "warm logits differ from cold ones"
    );
    eprintln!("load: cold {cold_s:.2} s (packed {packed} matrices), warm {warm_s:.2} s (none packed)");
}
