//! Pooling is data: the tiny Qwen3 reference model with Qwen3-Embedding's sentence-transformers
//! modules (last-token pooling, then Normalize), and with mean pooling, against transformers'
//! `Qwen3Model` on the same token ids (`tests/fixtures/embeddings/tiny-qwen3-last-token.json`,
//! recorded by `scripts/embedding-reference-tiny`). Tolerance 1e-4 per element, as the issue
//! sets against transformers in f32 for a tiny model.

use berth_plugin_api::{Family, LoadConfig, Model, Pooling};
use berth_plugin_common::testing::tiny_fixture;
use berth_qwen3::QwenFamily;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn reference() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embeddings/tiny-qwen3-last-token.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// A pack directory: the tiny Qwen3's config and weights plus sentence-transformers modules
/// pooling with `mode`, then normalising.
fn pack(dir: &Path, mode: &str) {
    let src = tiny_fixture("qwen3");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        format!(r#"{{"word_embedding_dimension": 64, "{mode}": true, "include_prompt": true}}"#),
    )
    .unwrap();
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt() as f32;
    v.iter().map(|x| x / n).collect()
}

fn check(mode: &str, pooling: Pooling, key: &str) {
    let dir = tempfile::tempdir().unwrap();
    pack(dir.path(), mode);
    let cfg = LoadConfig {
        pack_dir: dir.path().to_path_buf(),
        family: "qwen3".into(),
        architecture: "qwen3".into(),
        format: "safetensors".into(),
        threads: Some(2),
        max_sequences: Some(4),
        ..Default::default()
    };
    let mut m = QwenFamily::create(&cfg).unwrap();
    let spec = m.embedding().expect("modules.json makes it an embedding model");
    assert_eq!(
        (spec.dimensions, spec.pooling, spec.normalized),
        (64, pooling, true)
    );
    let r = reference();
    let inputs: Vec<Vec<i32>> = serde_json::from_value(r["inputs"].clone()).unwrap();
    let want: Vec<Vec<f32>> = serde_json::from_value(r[key].clone()).unwrap();
    // Two calls: four sequences sharing one (the model's limit), then the last alone.
    let views: Vec<&[i32]> = inputs.iter().map(Vec::as_slice).collect();
    let mut got = m.embed(&views[..4]).unwrap();
    got.extend(m.embed(&views[4..]).unwrap());
    let mut worst = 0f32;
    for (i, w) in want.iter().enumerate() {
        let g = normalized(&got[i * 64..(i + 1) * 64]);
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs());
        }
    }
    assert!(worst <= 1e-4, "{mode}: worst element difference {worst}");
}

#[test]
fn last_token_pooling_matches_transformers() {
    check("pooling_mode_lasttoken", Pooling::LastToken, "embeddings");
}

#[test]
fn mean_pooling_of_a_causal_model_matches_transformers() {
    check("pooling_mode_mean_tokens", Pooling::Mean, "also_mean");
}
