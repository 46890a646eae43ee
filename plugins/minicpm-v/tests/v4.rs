//! MiniCPM-V 4.0 (Llama) and 4.5 (Qwen3) against the tiny references of
//! `scripts/gen-minicpmv4-reference` (`tests/fixtures/hf-tiny/minicpmv4_{0,5}`): each slice's
//! vision-tower output, its resampler features and the whole prompt's logits with the features
//! at the `<unk>` rows, directly and through the plugin `Model` trait.

use berth_minicpm_v::{MiniCpmVFamily, MiniCpmVModel, MiniCpmVVision};
use berth_plugin_api::{BatchView, Family, ImageInput, LoadConfig, LogitsOut, Model, PixelLayout};
use berth_plugin_common::npy::{read_npz_f32, NpyF32};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

const VOCAB: usize = 192;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hf-tiny")
        .join(name)
}

fn load(name: &str) -> MiniCpmVModel {
    let cfg = LoadConfig {
        pack_dir: dir(name),
        family: "minicpm-v".into(),
        architecture: "minicpmv".into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    MiniCpmVFamily::create(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// One slice as the host hands it over: its strip, shape and patch grid.
struct Slice {
    strip: Vec<f32>,
    shape: Vec<u32>,
    grid: (usize, usize),
}

struct Inputs {
    slices: Vec<Slice>,
    ids: Vec<i32>,
}

fn inputs(name: &str) -> (Inputs, BTreeMap<String, NpyF32>) {
    let i = read_npz_f32(dir(name).join("inputs.npz")).unwrap();
    let o = read_npz_f32(dir(name).join("outputs.npz")).unwrap();
    let sizes = &i["target_sizes"];
    let slices = (0..sizes.shape[0])
        .map(|k| {
            let px = &i[&format!("pixel_values_{k}")];
            Slice {
                strip: px.data.clone(),
                shape: px.shape.iter().map(|&d| d as u32).collect(),
                grid: (sizes.data[2 * k] as usize, sizes.data[2 * k + 1] as usize),
            }
        })
        .collect();
    let ids = i["input_ids"].data.iter().map(|&t| t as i32).collect();
    (Inputs { slices, ids }, o)
}

/// Max |got − want| / max |want|, after checking the lengths.
fn rel_err(what: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

fn check(what: &str, got: &[f32], want: &[f32]) {
    let r = rel_err(what, got, want);
    println!("{what}: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "{what}: {r}");
}

/// Runs the whole prompt in one batch with `features` at the image-token rows.
fn prefill(m: &mut MiniCpmVModel, seq: i32, ids: &[i32], features: &[f32]) -> Vec<f32> {
    let n = ids.len();
    let pos: Vec<i32> = (0..n as i32).collect();
    let batch = BatchView {
        tokens: ids,
        positions: &pos,
        seq_ids: &vec![seq; n],
        want_logits: &vec![1; n],
    };
    let mut logits = vec![0.0; n * VOCAB];
    m.decode_with_features(&batch, features, &mut LogitsOut::new(&mut logits, VOCAB))
        .unwrap();
    logits
}

fn matches_reference(name: &str, unk: i32, vision_layers: usize) {
    let mut m = load(name);
    let (inp, out) = inputs(name);
    assert_eq!(m.image_token_id, unk, "{name}: the image token is <unk>");
    let MiniCpmVVision::V4(v) = &m.tower else {
        panic!("{name}: not loaded as 4.x")
    };
    assert_eq!(
        v.tower.encoder.layers.len(),
        vision_layers,
        "{name}: vision layers"
    );
    let q = v.resampler.num_queries;
    assert_eq!(q, 16);
    let rows: Vec<i32> = (0..inp.ids.len() as i32)
        .filter(|&p| inp.ids[p as usize] == unk)
        .collect();
    assert_eq!(rows.len(), inp.slices.len() * q);

    let mut hidden = Vec::new();
    let mut features = Vec::new();
    for s in &inp.slices {
        assert_eq!(m.tower.image_tokens(s.grid), q);
        hidden.extend(
            m.tower
                .vision_hidden(&s.strip, s.grid, m.threads())
                .unwrap()
                .unwrap(),
        );
        features.extend(m.tower.image_features(&s.strip, s.grid, m.threads()).unwrap());
    }
    check(
        &format!("{name} vision hidden states"),
        &hidden,
        &out["vision_hidden"].data,
    );
    check(
        &format!("{name} resampler features"),
        &features,
        &out["resampler"].data,
    );

    let logits = prefill(&mut m, 0, &inp.ids, &features);
    check(&format!("{name} logits"), &logits, &out["logits"].data);

    // The two slices' features swapped: the logits no longer match, so the placement counts.
    let h = q * m.text.decoder().cfg.hidden;
    let swapped: Vec<f32> = features[..h]
        .iter()
        .chain(&features[2 * h..3 * h])
        .chain(&features[h..2 * h])
        .copied()
        .collect();
    let r = rel_err(
        "swapped",
        &prefill(&mut m, 1, &inp.ids, &swapped),
        &out["logits"].data,
    );
    println!("{name} logits with the slices swapped: max|diff| / max|ref| = {r:.3e}");
    assert!(r > 1e-2, "{name}: swapped slices still match ({r})");

    // Through the Model trait: encode the three slices at their rows, then decode the prompt,
    // the first half in one batch and the rest token by token.
    let images: Vec<ImageInput<'_>> = inp
        .slices
        .iter()
        .zip(rows.chunks(q))
        .map(|(s, pos)| ImageInput {
            shape: &s.shape,
            pixels: &s.strip,
            patch_mask: None,
            grid: Some((s.grid.0 as u32, s.grid.1 as u32)),
            positions: pos,
        })
        .collect();
    m.encode_images(2, &images).unwrap();
    assert_eq!(m.pending_rows(2), rows.len());
    let n = inp.ids.len();
    let split = n / 2;
    let mut logits = Vec::new();
    for (from, to) in std::iter::once((0, split)).chain((split..n).map(|p| (p, p + 1))) {
        let pos: Vec<i32> = (from as i32..to as i32).collect();
        let batch = BatchView {
            tokens: &inp.ids[from..to],
            positions: &pos,
            seq_ids: &vec![2; to - from],
            want_logits: &vec![1; to - from],
        };
        let mut part = vec![0.0; (to - from) * VOCAB];
        m.decode(&batch, &mut LogitsOut::new(&mut part, VOCAB)).unwrap();
        logits.extend(part);
    }
    assert_eq!(m.pending_rows(2), 0);
    check(
        &format!("{name} Model::decode logits"),
        &logits,
        &out["logits"].data,
    );

    // A slice given the wrong number of placeholder rows is refused.
    let short = ImageInput {
        positions: &rows[..q - 1],
        ..images[0]
    };
    assert!(m.encode_images(3, &[short]).is_err());
}

#[test]
fn minicpmv4_0_matches_the_llama_reference() {
    // drop_vision_last_layer: 3 layers in the config (and the file), 2 run.
    matches_reference("minicpmv4_0", 0, 2);
}

#[test]
fn minicpmv4_5_matches_the_qwen3_reference() {
    matches_reference("minicpmv4_5", 160, 3);
}

#[test]
fn minicpmv4_vision_spec_names_the_preprocessing() {
    for (name, unk, arch) in [
        ("minicpmv4_0", 0, "minicpmv4_0"),
        ("minicpmv4_5", 160, "minicpmv4_5"),
    ] {
        let m = load(name);
        let spec = m.vision().expect("minicpm-v takes images");
        assert_eq!(spec.scheme, "minicpmv");
        assert_eq!(spec.layout, PixelLayout::PatchStrip);
        assert_eq!(spec.patch_size, 14);
        assert_eq!(spec.image_token_id, unk);
        let p = &spec.params;
        assert_eq!(p["query_num"], json!(16));
        assert_eq!(p["patch_size"], json!(14));
        assert_eq!(p["max_slice_nums"], json!(9));
        assert_eq!(p["scale_resolution"], json!(448));
        assert_eq!(p["slice_mode"], json!(true));
        assert_eq!(p["use_image_id"], json!(true));
        assert_eq!(p["image_mean"], json!([0.5, 0.5, 0.5]));
        assert!(p.get("downsample_mode").is_none());
        let d = m.describe();
        assert_eq!(d.extra["architecture"], json!(arch));
        assert_eq!(d.extra["special_tokens"]["<unk>"], json!(unk));
        assert_eq!(d.vocab_size as usize, VOCAB);
    }
}

#[test]
fn minicpmv4_through_the_exported_c_abi_probes_minicpmv() {
    // SAFETY: the table comes from this crate's own exported entry, valid for the process.
    let plugin =
        unsafe { berth_plugin_api::Plugin::from_entry(berth_minicpm_v::berth_plugin_entry_v1()) }.unwrap();
    assert_eq!(
        plugin.probe(r#"{"family":"minicpm-v","architecture":"minicpmv","format":"safetensors"}"#),
        100
    );
    let cfg = json!({
        "pack_dir": dir("minicpmv4_5"), "family": "minicpm-v", "architecture": "minicpmv",
        "format": "safetensors"
    });
    let m = plugin.create(&cfg.to_string()).unwrap();
    assert!(m.supports_images());
}
