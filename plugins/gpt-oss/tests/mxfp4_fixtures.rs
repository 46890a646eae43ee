//! The committed MXFP4 fixtures (made by scripts/gen-tiny-mxfp4 from the tiny reference model):
//! - tests/fixtures/gguf-tiny/gpt_oss_mxfp4.gguf: experts in MXFP4 (quantised by gguf-py);
//! - tests/fixtures/gguf-tiny/gpt_oss_mxfp4_dequant.gguf: the same values dequantised to f32;
//! - tests/fixtures/hf-tiny/gpt_oss_mxfp4: the same MXFP4 values as HF `*_blocks` / `*_scales`.
//!
//! All three hold the same model, so their logits agree up to the one thing that differs: the
//! MXFP4 experts run as MXFP4 · Q8_0 dot products (activations rounded to 8 bits per 32-block),
//! the dequantised ones as f32 · f32.

use berth_gpt_oss::{GptOssFamily, GptOssModel};
use berth_kernels::quant::WeightType;
use berth_plugin_api::{Family, LoadConfig};
use berth_plugin_common::mxfp4;
use berth_plugin_common::testing::{argmax, decode, feed, TINY_IDS};
use berth_plugin_common::Weights;
use std::path::{Path, PathBuf};

const VOCAB: usize = 512;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn load_gguf(file: &str) -> GptOssModel {
    let path = fixtures().join("gguf-tiny").join(file);
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

fn hf_dir() -> PathBuf {
    fixtures().join("hf-tiny/gpt_oss_mxfp4")
}

fn load_hf() -> GptOssModel {
    let cfg = LoadConfig {
        pack_dir: hf_dir(),
        family: "gpt-oss".into(),
        architecture: "gpt_oss".into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    GptOssFamily::create(&cfg).unwrap_or_else(|e| panic!("{}: {e}", hf_dir().display()))
}

/// Logits of the reference input: the whole prompt in one batch, then token by token in a fresh
/// sequence (one decode call per token, each attending to the cache).
fn logits(m: &mut GptOssModel) -> (Vec<f32>, Vec<f32>) {
    let pos: Vec<i32> = (0..TINY_IDS.len() as i32).collect();
    let n = TINY_IDS.len();
    let prefill = decode(m, &TINY_IDS, &pos, &vec![0; n], &vec![1; n]);
    let steps = (0..n).flat_map(|i| feed(m, 1, i, &TINY_IDS[i..i + 1])).collect();
    (prefill, steps)
}

/// `max |got - want| / max |want|`.
fn rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_logit = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    max_diff / max_logit
}

fn top(l: &[f32]) -> Vec<i32> {
    l.chunks(VOCAB).map(argmax).collect()
}

/// Q8_0 activations in the MXFP4 products: each activation moves by up to 1/254 of its
/// 32-block's largest magnitude (about 2.5 standard deviations), which for this random model's
/// uncorrelated weights and activations is ~0.5% of a typical expert dot product; through two
/// layers the logits move by 8.5e-3 of their largest (printed by the tests; the same figure for
/// prefill, token by token, GGUF and HF). For scale: the MXFP4 rounding of the weights
/// themselves moves logits by 0.23 of their largest against the original f32 model, and a wrong
/// nibble order, swapped gate/up or exponent off by one changes them by O(1). 3e-2 is ~3.5x the
/// measured activation error, leaving room for other thread counts and dot-product tables.
const Q8_TOLERANCE: f32 = 3e-2;

#[test]
fn mxfp4_gguf_matches_its_dequantised_f32_twin() {
    let (mx_pre, mx_steps) = logits(&mut load_gguf("gpt_oss_mxfp4.gguf"));
    let (dq_pre, dq_steps) = logits(&mut load_gguf("gpt_oss_mxfp4_dequant.gguf"));
    for (what, got, want) in [
        ("prefill", &mx_pre, &dq_pre),
        ("token by token", &mx_steps, &dq_steps),
    ] {
        let r = rel_diff(got, want);
        eprintln!("MXFP4 GGUF vs dequantised f32 GGUF, {what}: max|diff| / max|logit| = {r:.2e}");
        assert!(r <= Q8_TOLERANCE, "{what}: {r}");
        assert!(
            r > 0.0,
            "{what}: bit-identical logits, so the MXFP4 products did not run"
        );
        assert_eq!(top(got), top(want), "{what}: greedy tokens");
    }
    // The dequantised model's own two paths (f32 products) agree far more tightly.
    let r = rel_diff(&dq_steps, &dq_pre);
    eprintln!("dequantised f32 GGUF, token by token vs prefill: {r:.2e}");
    assert!(r <= 1e-4, "{r}");
}

#[test]
fn hf_mxfp4_blocks_match_the_mxfp4_gguf() {
    let (hf_pre, hf_steps) = logits(&mut load_hf());
    let (mx_pre, mx_steps) = logits(&mut load_gguf("gpt_oss_mxfp4.gguf"));
    let (dq_pre, dq_steps) = logits(&mut load_gguf("gpt_oss_mxfp4_dequant.gguf"));
    for (what, got, mx, dq) in [
        ("prefill", &hf_pre, &mx_pre, &dq_pre),
        ("token by token", &hf_steps, &mx_steps, &dq_steps),
    ] {
        // Same MXFP4 bytes, same f32 weights elsewhere (the converter copies them): the logits
        // are bit-identical here; the bound only allows another float order for the
        // differently laid out non-expert tensors.
        let r_mx = rel_diff(got, mx);
        let r_dq = rel_diff(got, dq);
        eprintln!("HF MXFP4 vs MXFP4 GGUF, {what}: {r_mx:.2e}; vs dequantised f32 GGUF: {r_dq:.2e}");
        assert!(r_mx <= 1e-4, "{what}: {r_mx}");
        assert!(r_dq <= Q8_TOLERANCE, "{what}: {r_dq}");
        assert_eq!(top(got), top(dq), "{what}: greedy tokens");
    }
}

#[test]
fn fixture_experts_are_mxfp4_and_hf_repacks_to_the_gguf_bytes() {
    let gguf = Weights::open_gguf(fixtures().join("gguf-tiny/gpt_oss_mxfp4.gguf")).unwrap();
    let hf = Weights::open_safetensors(&[hf_dir().join("model.safetensors")]).unwrap();
    for layer in 0..2 {
        let g = |r: &str| {
            gguf.stacked_named(&format!("blk.{layer}.ffn_{r}_exps.weight"))
                .unwrap()
        };
        let p = format!("model.layers.{layer}.mlp.experts");
        let (gate, up) = mxfp4::hf_gate_up_experts(&hf, &format!("{p}.gate_up_proj")).unwrap();
        let down = mxfp4::hf_experts(&hf, &format!("{p}.down_proj")).unwrap();
        for (name, from_hf, from_gguf) in [
            ("gate", gate, g("gate")),
            ("up", up, g("up")),
            ("down", down, g("down")),
        ] {
            assert_eq!(from_hf.len(), 4, "{name}");
            for (e, (a, b)) in from_hf.iter().zip(&from_gguf).enumerate() {
                assert_eq!(
                    (a.wtype, b.wtype),
                    (WeightType::Mxfp4, WeightType::Mxfp4),
                    "{name} {e}"
                );
                assert_eq!((a.rows, a.cols), (b.rows, b.cols), "{name} {e}");
                assert_eq!(a.bytes(), b.bytes(), "layer {layer} {name} expert {e}");
            }
        }
    }
}
