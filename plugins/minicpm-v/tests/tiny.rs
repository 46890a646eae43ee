//! MiniCPM-V 4.6 against the tiny transformers reference (`reference-tiny-vision/minicpmv4_6`):
//! the logits of every position with the image features at the image tokens, as one prefill and
//! token by token, directly and through the plugin `Model` trait (`encode_images`, then
//! `decode`), with the pending features following truncate and fork.

use berth_minicpm_v::{MiniCpmVFamily, MiniCpmVModel};
use berth_plugin_api::{BatchView, Family, ImageInput, LoadConfig, LogitsOut, Model, PixelLayout};
use berth_plugin_common::npy::{read_npz_f32, shared_fixtures, NpyF32};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

const VOCAB: usize = 512;

fn dir() -> PathBuf {
    shared_fixtures()
        .join("reference-tiny-vision")
        .join("minicpmv4_6")
}

fn load() -> MiniCpmVModel {
    let cfg = LoadConfig {
        pack_dir: dir(),
        family: "minicpm-v".into(),
        architecture: "minicpmv4_6".into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    MiniCpmVFamily::create(&cfg).unwrap_or_else(|e| panic!("minicpmv4_6: {e}"))
}

/// The fixture's inputs: the patch strip, its grid and the input ids.
struct Inputs {
    strip: Vec<f32>,
    shape: Vec<u32>,
    grid: (usize, usize),
    ids: Vec<i32>,
}

fn inputs() -> (Inputs, BTreeMap<String, NpyF32>) {
    let i = read_npz_f32(dir().join("inputs.npz")).unwrap();
    let o = read_npz_f32(dir().join("outputs.npz")).unwrap();
    let px = &i["pixel_values"];
    let sizes = &i["target_sizes"].data;
    let inputs = Inputs {
        strip: px.data.clone(),
        shape: px.shape[1..].iter().map(|&d| d as u32).collect(),
        grid: (sizes[0] as usize, sizes[1] as usize),
        ids: i["input_ids"].data.iter().map(|&t| t as i32).collect(),
    };
    (inputs, o)
}

impl Inputs {
    /// The image as the host hands it over, filling the placeholders at `positions`.
    fn image<'a>(&'a self, positions: &'a [i32]) -> ImageInput<'a> {
        ImageInput {
            shape: &self.shape,
            pixels: &self.strip,
            patch_mask: None,
            grid: Some((self.grid.0 as u32, self.grid.1 as u32)),
            positions,
        }
    }

    fn image_positions(&self) -> Vec<i32> {
        (0..self.ids.len() as i32)
            .filter(|&p| self.ids[p as usize] == 500)
            .collect()
    }
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

/// Decodes `ids[from..to]` of `seq` in one batch through `Model::decode`, all rows with logits.
fn decode_rows(m: &mut MiniCpmVModel, seq: i32, ids: &[i32], from: usize, to: usize) -> Vec<f32> {
    let n = to - from;
    let pos: Vec<i32> = (from as i32..to as i32).collect();
    let batch = BatchView {
        tokens: &ids[from..to],
        positions: &pos,
        seq_ids: &vec![seq; n],
        want_logits: &vec![1; n],
    };
    let mut out = vec![0.0; n * VOCAB];
    m.decode(&batch, &mut LogitsOut::new(&mut out, VOCAB)).unwrap();
    out
}

#[test]
fn minicpmv4_6_prefill_and_token_by_token_logits_match_transformers() {
    let mut m = load();
    let (inp, out) = inputs();
    assert_eq!(m.image_token_id, 500);
    let n_image = inp.image_positions().len();
    assert_eq!(m.tower.image_tokens(inp.grid), n_image);
    let features = m.tower.image_features(&inp.strip, inp.grid, m.threads()).unwrap();
    let r = rel_err("image_features", &features, &out["image_features"]);
    println!("minicpmv4_6 image_features: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "image_features: {r}");

    // One prefill.
    let n = inp.ids.len();
    let pos: Vec<i32> = (0..n as i32).collect();
    let batch = BatchView {
        tokens: &inp.ids,
        positions: &pos,
        seq_ids: &vec![0; n],
        want_logits: &vec![1; n],
    };
    let mut logits = vec![0.0; n * VOCAB];
    m.decode_with_features(&batch, &features, &mut LogitsOut::new(&mut logits, VOCAB))
        .unwrap();
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("minicpmv4_6 prefill logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "prefill logits: {r}");

    // Token by token, on another sequence.
    let h = features.len() / n_image;
    let mut logits = Vec::new();
    let mut next = 0;
    for (p, &t) in inp.ids.iter().enumerate() {
        let f: &[f32] = if t == m.image_token_id {
            next += 1;
            &features[(next - 1) * h..next * h]
        } else {
            &[]
        };
        let batch = BatchView {
            tokens: &[t],
            positions: &[p as i32],
            seq_ids: &[1],
            want_logits: &[1],
        };
        let mut row = vec![0.0; VOCAB];
        m.decode_with_features(&batch, f, &mut LogitsOut::new(&mut row, VOCAB))
            .unwrap();
        logits.extend(row);
    }
    assert_eq!(next, n_image);
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("minicpmv4_6 token-by-token logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "token-by-token logits: {r}");

    // The features in the wrong order give other logits: the comparison sees the placement.
    let swapped: Vec<f32> = features[h..].iter().chain(&features[..h]).copied().collect();
    let batch3 = BatchView {
        seq_ids: &vec![3; n],
        ..batch
    };
    let mut logits = vec![0.0; n * VOCAB];
    m.decode_with_features(&batch3, &swapped, &mut LogitsOut::new(&mut logits, VOCAB))
        .unwrap();
    let r = rel_err("logits", &logits, &out["logits"]);
    assert!(r > 1e-2, "swapped image features still match: {r}");

    // Image-token rows and features must agree in number.
    let mut none: [f32; 0] = [];
    let batch = BatchView {
        tokens: &inp.ids,
        positions: &pos,
        seq_ids: &vec![2; n],
        want_logits: &vec![0; n],
    };
    assert!(m
        .decode_with_features(&batch, &features[..h], &mut LogitsOut::new(&mut none, VOCAB))
        .is_err());
}

#[test]
fn minicpmv4_6_vision_spec_names_the_preprocessing() {
    let m = load();
    let spec = m.vision().expect("minicpm-v takes images");
    assert_eq!(spec.scheme, "minicpmv");
    assert_eq!(spec.layout, PixelLayout::PatchStrip);
    assert_eq!(spec.patch_size, 8);
    assert_eq!(spec.image_token_id, 500);
    let p = &spec.params;
    assert_eq!(p["patch_size"], json!(8));
    assert_eq!(p["downsample_mode"], json!("16x"));
    assert_eq!(p["image_token_divisor"], json!(16));
    // No preprocessor_config.json in the fixture: transformers' image processor defaults.
    assert_eq!(p["max_slice_nums"], json!(9));
    assert_eq!(p["scale_resolution"], json!(448));
    assert_eq!(p["slice_mode"], json!(true));
    assert_eq!(p["use_image_id"], json!(true));
    assert_eq!(p["image_mean"], json!([0.5, 0.5, 0.5]));
    assert_eq!(p["image_std"], json!([0.5, 0.5, 0.5]));
    assert_eq!(m.describe().extra["architecture"], json!("minicpmv4_6"));
}

#[test]
fn minicpmv4_6_through_the_model_trait_matches_transformers() {
    let mut m = load();
    let (inp, out) = inputs();
    let positions = inp.image_positions();
    let n = inp.ids.len();

    // Sequence 0: encode, then the whole prompt in one batch.
    m.encode_images(0, &[inp.image(&positions)]).unwrap();
    assert_eq!(m.pending_rows(0), positions.len());
    let logits = decode_rows(&mut m, 0, &inp.ids, 0, n);
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("minicpmv4_6 Model::decode prefill logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "Model prefill logits: {r}");
    assert_eq!(m.pending_rows(0), 0, "decoded features are dropped");

    // Sequence 1: encode, then token by token (the image rows arrive one batch each).
    m.encode_images(1, &[inp.image(&positions)]).unwrap();
    let mut logits = Vec::new();
    for p in 0..n {
        logits.extend(decode_rows(&mut m, 1, &inp.ids, p, p + 1));
    }
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("minicpmv4_6 Model::decode token-by-token logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "Model token-by-token logits: {r}");

    // Sequence 2: encode, decode up to the first image token, fork into 3; both finish alike.
    m.encode_images(2, &[inp.image(&positions)]).unwrap();
    let first = positions[0] as usize;
    let head = decode_rows(&mut m, 2, &inp.ids, 0, first);
    m.seq_fork(2, 3).unwrap();
    assert_eq!(m.pending_rows(3), positions.len(), "fork copies pending features");
    for seq in [2, 3] {
        let mut logits = head.clone();
        logits.extend(decode_rows(&mut m, seq, &inp.ids, first, n));
        let r = rel_err("logits", &logits, &out["logits"]);
        println!("minicpmv4_6 forked sequence {seq} logits: max|diff| / max|ref| = {r:.3e}");
        assert!(r <= 1e-3, "forked sequence {seq}: {r}");
    }
}

#[test]
fn minicpmv4_6_truncate_drops_pending_features_and_bad_images_are_refused() {
    let mut m = load();
    let (inp, _) = inputs();
    let positions = inp.image_positions();
    let n = inp.ids.len();

    // An image token without an encoded image is refused.
    let pos: Vec<i32> = (0..n as i32).collect();
    let batch = BatchView {
        tokens: &inp.ids,
        positions: &pos,
        seq_ids: &vec![0; n],
        want_logits: &vec![0; n],
    };
    let mut none: [f32; 0] = [];
    assert!(m.decode(&batch, &mut LogitsOut::new(&mut none, VOCAB)).is_err());

    // Truncating below the image drops its features: the image tokens are then refused.
    m.encode_images(0, &[inp.image(&positions)]).unwrap();
    m.seq_truncate(0, 0).unwrap();
    assert_eq!(m.pending_rows(0), 0);
    assert!(m.decode(&batch, &mut LogitsOut::new(&mut none, VOCAB)).is_err());

    // Wrong placeholder count, a wrong shape, a missing grid, a position already decoded, and
    // positions given twice are refused, and leave nothing pending.
    assert!(m.encode_images(0, &[inp.image(&positions[..1])]).is_err());
    let short = [3u32, 8, 128];
    let bad_shape = ImageInput {
        shape: &short,
        pixels: &inp.strip[..3 * 8 * 128],
        ..inp.image(&positions)
    };
    assert!(m.encode_images(0, &[bad_shape]).is_err());
    let no_grid = ImageInput {
        grid: None,
        ..inp.image(&positions)
    };
    assert!(m.encode_images(0, &[no_grid]).is_err());
    assert!(m
        .encode_images(0, &[inp.image(&positions), inp.image(&positions)])
        .is_err());
    assert_eq!(m.pending_rows(0), 0);
    // Once the first image row is decoded, the image cannot be encoded again at those positions.
    m.encode_images(0, &[inp.image(&positions)]).unwrap();
    decode_rows(&mut m, 0, &inp.ids, 0, positions[0] as usize + 1);
    assert_eq!(m.pending_rows(0), positions.len() - 1);
    assert!(m.encode_images(0, &[inp.image(&positions)]).is_err());
}

#[test]
fn minicpmv4_6_through_the_exported_c_abi_matches_transformers() {
    // SAFETY: the table comes from this crate's own exported entry, valid for the process.
    let plugin =
        unsafe { berth_plugin_api::Plugin::from_entry(berth_minicpm_v::berth_plugin_entry_v1()) }.unwrap();
    assert_eq!(
        plugin.probe(r#"{"family":"minicpm-v","architecture":"minicpmv4_6","format":"safetensors"}"#),
        100
    );
    assert_eq!(
        plugin.probe(r#"{"family":"qwen3","architecture":"qwen3_5_text","format":"safetensors"}"#),
        0
    );
    let cfg = json!({
        "pack_dir": dir(), "family": "minicpm-v", "architecture": "minicpmv4_6", "format": "safetensors"
    });
    let mut m = plugin.create(&cfg.to_string()).unwrap();
    assert!(m.supports_images());
    assert_eq!(m.vision().map(|v| v.scheme.as_str()), Some("minicpmv"));
    let (inp, out) = inputs();
    let positions = inp.image_positions();
    m.encode_images(0, &[inp.image(&positions)]).unwrap();
    let n = inp.ids.len();
    let pos: Vec<i32> = (0..n as i32).collect();
    let batch = BatchView {
        tokens: &inp.ids,
        positions: &pos,
        seq_ids: &vec![0; n],
        want_logits: &vec![1; n],
    };
    let mut logits = vec![0.0; n * VOCAB];
    assert_eq!(m.decode(&batch, &mut logits).unwrap(), n);
    let r = rel_err("logits", &logits, &out["logits"]);
    println!("minicpmv4_6 C ABI logits: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "C ABI logits: {r}");
}
