//! LFM2-VL against the tiny transformers reference (`reference-tiny-vision/lfm2_vl`): the image
//! features of the SigLIP2 tower and projector, and the logits of every position with those
//! features at the image tokens, as one prefill and token by token.

use berth_lfm2::vl::{self, ImagePatches, Lfm2VlModel};
use berth_plugin_api::{BatchView, LoadConfig, LogitsOut};
use berth_plugin_common::npy::{read_npz_f32, shared_fixtures, NpyF32};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn dir() -> PathBuf {
    shared_fixtures().join("reference-tiny-vision").join("lfm2_vl")
}

fn load() -> Lfm2VlModel {
    let cfg = LoadConfig {
        pack_dir: dir(),
        family: "lfm2".into(),
        architecture: "lfm2_vl".into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    vl::load(&cfg).unwrap_or_else(|e| panic!("lfm2_vl: {e}"))
}

/// The fixture's inputs: patches, mask, grid and input ids.
struct Inputs {
    patches: Vec<f32>,
    mask: Vec<bool>,
    grid: (usize, usize),
    ids: Vec<i32>,
}

impl Inputs {
    fn image(&self) -> ImagePatches<'_> {
        ImagePatches {
            patches: &self.patches,
            mask: &self.mask,
            grid: self.grid,
        }
    }
}

fn inputs() -> (Inputs, BTreeMap<String, NpyF32>) {
    let i = read_npz_f32(dir().join("inputs.npz")).unwrap();
    let o = read_npz_f32(dir().join("outputs.npz")).unwrap();
    let shapes = &i["spatial_shapes"].data;
    let inputs = Inputs {
        patches: i["pixel_values"].data.clone(),
        mask: i["pixel_attention_mask"].data.iter().map(|&m| m != 0.0).collect(),
        grid: (shapes[0] as usize, shapes[1] as usize),
        ids: i["input_ids"].data.iter().map(|&t| t as i32).collect(),
    };
    (inputs, o)
}

/// Max |got − want| / max |want|, after checking the lengths.
fn rel_err(what: &str, got: &[f32], want: &NpyF32) -> f32 {
    assert_eq!(got.len(), want.data.len(), "{what}: length");
    let scale = want.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(&want.data)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

#[test]
fn lfm2_vl_image_features_and_prefill_logits_match_transformers() {
    let mut m = load();
    let (inp, out) = inputs();
    assert_eq!(m.image_token_id, 396);
    let n_image = inp.ids.iter().filter(|&&t| t == m.image_token_id).count();
    assert_eq!(m.tower.image_tokens(inp.grid), n_image);
    let features = m.tower.image_features(&inp.image(), m.threads()).unwrap();
    let r = rel_err("image_features", &features, &out["image_features"]);
    println!("lfm2_vl image_features: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "image_features: {r}");
    let logits = m.prefill(0, &inp.ids, &features).unwrap();
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("lfm2_vl prefill logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "prefill logits: {r}");
    // Image tokens without an image's features are refused.
    assert!(load().prefill(0, &inp.ids, &[]).is_err());
}

#[test]
fn lfm2_vl_token_by_token_matches_transformers() {
    let mut m = load();
    let (inp, out) = inputs();
    let features = m.tower.image_features(&inp.image(), m.threads()).unwrap();
    let h = features.len() / m.tower.image_tokens(inp.grid);
    let vocab = 512;
    let mut logits = Vec::new();
    let mut next_feature = 0;
    for (p, &t) in inp.ids.iter().enumerate() {
        let f: &[f32] = if t == m.image_token_id {
            next_feature += 1;
            &features[(next_feature - 1) * h..next_feature * h]
        } else {
            &[]
        };
        let batch = BatchView {
            tokens: &[t],
            positions: &[p as i32],
            seq_ids: &[1],
            want_logits: &[1],
        };
        let mut row = vec![0.0; vocab];
        m.decode_with_features(&batch, f, &mut LogitsOut::new(&mut row, vocab))
            .unwrap();
        logits.extend(row);
    }
    assert_eq!(next_feature, 6);
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("lfm2_vl token-by-token logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "token-by-token logits: {r}");
}

#[test]
fn lfm2_vl_refuses_features_that_do_not_fit_the_image_tokens() {
    let mut m = load();
    let (inp, _) = inputs();
    let features = m.tower.image_features(&inp.image(), m.threads()).unwrap();
    let n = inp.ids.len();
    let pos: Vec<i32> = (0..n as i32).collect();
    let batch = BatchView {
        tokens: &inp.ids,
        positions: &pos,
        seq_ids: &vec![0; n],
        want_logits: &vec![0; n],
    };
    let mut none: [f32; 0] = [];
    let h = features.len() / 6;
    let short = &features[..5 * h];
    assert!(m
        .decode_with_features(&batch, short, &mut LogitsOut::new(&mut none, 512))
        .is_err());
    // The sequence is untouched by the refused batch: the full one still goes in at 0.
    assert!(m
        .decode_with_features(&batch, &features, &mut LogitsOut::new(&mut none, 512))
        .is_ok());
}
