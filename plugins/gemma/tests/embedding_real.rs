//! The plugin on the real EmbeddingGemma-300M (sentence-transformers layout, f32 safetensors;
//! fetched by `scripts/fetch-models embeddinggemma-300m`) against sentence-transformers' own
//! vectors for the same token ids (`tests/fixtures/embeddings`, recorded by
//! `scripts/embedding-reference`): bidirectional attention with its sliding window, mean pooling,
//! the two dense projections, and Matryoshka truncation.
//!
//! Tolerance: cosine similarity ≥ 0.9999 per vector, the bar the issue sets against an
//! independent f32 implementation (PyTorch on CPU); the two differ only in summation order. That
//! bar alone would pass a sliding window one position too narrow (|i - j| < 256 instead of 257
//! gives cosine 0.99995 on the long texts, but elements off by 1.4e-3, as the reference script's
//! author measured), so every element of the full vectors must also be within 1e-4.

use berth_gemma::GemmaFamily;
use berth_plugin_api::{Family, LoadConfig, Model, Pooling};
use berth_plugin_common::npy::read_npy_f32;
use serde_json::Value;
use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The model directory, fetched (or found verified in the cache) by the repository's script.
fn model_dir() -> PathBuf {
    berth_plugin_common::testing::fetched_model("embeddinggemma-300m")
}

fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/embeddings")
}

fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt() as f32;
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn embeddinggemma_matches_sentence_transformers_at_every_dimension() {
    let dir = model_dir();
    let reference: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("embeddinggemma-300m.json")).unwrap()).unwrap();
    let ids: Vec<Vec<i32>> = serde_json::from_value(reference["token_ids"].clone()).unwrap();
    assert_eq!(ids.len(), 64);
    let cfg = LoadConfig {
        pack_dir: dir,
        family: "gemma".into(),
        architecture: "gemma3_text".into(),
        format: "safetensors".into(),
        threads: Some(2),
        max_sequences: Some(16),
        ..Default::default()
    };
    let mut m = GemmaFamily::create(&cfg).expect("EmbeddingGemma loads");
    let spec = m.embedding().expect("an embedding model");
    assert_eq!(
        (spec.dimensions, spec.pooling, spec.normalized),
        (768, Pooling::Mean, true)
    );
    assert_eq!(spec.max_tokens, 2048);
    assert_eq!(spec.prompts["query"], "task: search result | query: ");
    assert_eq!(spec.prompts["document"], "title: none | text: ");

    // In batches of up to 16 sequences, as the host packs them.
    let mut got: Vec<Vec<f32>> = Vec::new();
    for chunk in ids.chunks(16) {
        let views: Vec<&[i32]> = chunk.iter().map(Vec::as_slice).collect();
        let flat = m.embed(&views).expect("embed");
        got.extend(flat.chunks_exact(768).map(<[f32]>::to_vec));
    }
    let full = read_npy_f32(fixtures().join("embeddinggemma-300m-768.npy")).unwrap();
    let mut max_diff = (0f32, 0usize);
    for (i, g) in got.iter().enumerate() {
        let v = normalized(g.clone());
        for (a, b) in v.iter().zip(&full.data[i * 768..(i + 1) * 768]) {
            if (a - b).abs() > max_diff.0 {
                max_diff = ((a - b).abs(), i);
            }
        }
    }
    eprintln!(
        "largest element difference {:.2e} (text {})",
        max_diff.0, max_diff.1
    );
    assert!(
        max_diff.0 <= 1e-4,
        "text {}: an element differs by {}",
        max_diff.1,
        max_diff.0
    );
    let mut worst = (1.0f64, 0usize, 0usize);
    for dim in [768usize, 512, 256, 128] {
        let want = read_npy_f32(fixtures().join(format!("embeddinggemma-300m-{dim}.npy"))).unwrap();
        assert_eq!(want.shape, vec![64, dim]);
        for (i, g) in got.iter().enumerate() {
            let v = normalized(g[..dim].to_vec());
            let c = cosine(&v, &want.data[i * dim..(i + 1) * dim]);
            if c < worst.0 {
                worst = (c, i, dim);
            }
        }
    }
    eprintln!(
        "worst cosine {:.7} (text {}, {} dimensions)",
        worst.0, worst.1, worst.2
    );
    assert!(
        worst.0 >= 0.9999,
        "text {} at {} dimensions: cosine {}",
        worst.1,
        worst.2,
        worst.0
    );

    // One sequence alone gives the vector it gets in a batch (rows never mix across sequences).
    let alone = m.embed(&[ids[5].as_slice()]).unwrap();
    let c = cosine(&alone, &got[5]);
    assert!(c > 0.999_999, "alone vs batched: cosine {c}");
    // An embedding model does not generate.
    let mut logits = vec![0f32; m.describe().vocab_size as usize];
    let batch = berth_plugin_api::BatchView {
        tokens: &[2],
        positions: &[0],
        seq_ids: &[0],
        want_logits: &[1],
    };
    let e = m
        .decode(
            &batch,
            &mut berth_plugin_api::LogitsOut::new(&mut logits, m.describe().vocab_size as usize),
        )
        .unwrap_err();
    assert!(e.message.contains("embedding model"), "{e}");
}

/// What `berth import --quantize q8_0` costs: the same model with its projection matrices in
/// Q8_0 (and activations quantized to Q8_0 in those products, as llama.cpp's q8_0 does), on the
/// fixture texts of up to 100 tokens, against sentence-transformers' f32 vectors. The bound is
/// the cost measured when the option was added (worst cosine 0.99934, mean 0.99980 over the 58 texts), with margin; the
/// closing note and the benchmark page give the figures.
#[test]
fn q8_0_costs_little_accuracy() {
    let reference: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("embeddinggemma-300m.json")).unwrap()).unwrap();
    let ids: Vec<Vec<i32>> = serde_json::from_value(reference["token_ids"].clone()).unwrap();
    let mut cfg = LoadConfig {
        pack_dir: model_dir(),
        family: "gemma".into(),
        architecture: "gemma3_text".into(),
        format: "safetensors".into(),
        threads: Some(2),
        max_sequences: Some(16),
        ..Default::default()
    };
    cfg.options.insert("quantize".into(), "q8_0".into());
    let mut m = GemmaFamily::create(&cfg).expect("EmbeddingGemma loads as Q8_0");
    let want = read_npy_f32(fixtures().join("embeddinggemma-300m-768.npy")).unwrap();
    let short: Vec<usize> = (0..ids.len()).filter(|&i| ids[i].len() <= 100).collect();
    let (mut worst, mut sum) = (1.0f64, 0.0f64);
    for chunk in short.chunks(16) {
        let views: Vec<&[i32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
        let flat = m.embed(&views).unwrap();
        for (&i, g) in chunk.iter().zip(flat.chunks_exact(768)) {
            let c = cosine(g, &want.data[i * 768..(i + 1) * 768]);
            worst = worst.min(c);
            sum += c;
        }
    }
    eprintln!(
        "q8_0: worst cosine {worst:.6}, mean {:.6} over {} texts",
        sum / short.len() as f64,
        short.len()
    );
    assert!(worst >= 0.998, "q8_0 worst cosine {worst}");
}
