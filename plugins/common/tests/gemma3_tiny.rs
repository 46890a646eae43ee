//! The generic decoder's Gemma switches ((1+w) norms, sandwich norms, GeGLU, embedding scale,
//! `query_pre_attn_scalar`, sliding windows, per-layer RoPE bases) against the tiny Gemma 3
//! reference, configured by hand from its config.json.

use berth_plugin_api::{BatchView, LogitsOut};
use berth_plugin_common::npy::read_npy_f32;
use berth_plugin_common::{Activation, Decoder, DecoderConfig, DecoderWeights, HfNames, Weights};

#[test]
fn gemma3_tiny_matches_reference_logits() {
    let dir = berth_plugin_common::npy::shared_fixtures().join("reference-tiny/gemma3");
    let w = Weights::open_safetensors(&[dir.join("model.safetensors")])
        .unwrap()
        .with_hf_names(HfNames::Sandwich);
    let n_layers = 6;
    let mut cfg = DecoderConfig::new(n_layers, 64, 4, 1, 16);
    cfg.eps = 1e-6;
    cfg.norm_add_one = true;
    cfg.qk_norm = true;
    cfg.post_norms = true;
    cfg.activation = Activation::GeluTanh;
    cfg.attn_scale = 1.0 / 16f32.sqrt();
    cfg.embed_scale = Some(64f32.sqrt());
    cfg.tie_embeddings = true;
    for l in 0..n_layers {
        let sliding = (l + 1) % 6 != 0;
        cfg.sliding_window[l] = sliding.then_some(4);
        cfg.rope_base[l] = if sliding { 10000.0 } else { 1_000_000.0 };
    }
    let weights = DecoderWeights::load(&w, &cfg).unwrap();
    let mut d = Decoder::new(cfg, weights, 2, 64, 2);
    let ids = [1, 17, 42, 256, 100, 31, 7, 511];
    let want = read_npy_f32(dir.join("logits.npy")).unwrap();
    let stepwise = read_npy_f32(dir.join("decode_logits.npy")).unwrap();
    let mut got = vec![0.0; 8 * 512];
    let b = BatchView {
        tokens: &ids,
        positions: &[0, 1, 2, 3, 4, 5, 6, 7],
        seq_ids: &[0; 8],
        want_logits: &[1; 8],
    };
    d.decode(&b, &mut LogitsOut::new(&mut got, 512)).unwrap();
    let max_logit = want.data.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        diff(&got, &want.data) <= 1e-3 * max_logit,
        "full: {}",
        diff(&got, &want.data)
    );
    for (i, &t) in ids.iter().enumerate() {
        let mut row = vec![0.0; 512];
        let b = BatchView {
            tokens: &[t],
            positions: &[i as i32],
            seq_ids: &[1],
            want_logits: &[1],
        };
        d.decode(&b, &mut LogitsOut::new(&mut row, 512)).unwrap();
        assert!(
            diff(&row, stepwise.row(i)) <= 1e-3 * max_logit,
            "step {i}: {}",
            diff(&row, stepwise.row(i))
        );
    }
}
