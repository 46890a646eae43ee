//! The vision towers against transformers on the tiny random-weight fixtures
//! (`shared/fixtures/reference-tiny-vision`): every recorded output within 1e-3 × its max |value|.

use berth_plugin_common::npy::{read_npz_f32, shared_fixtures, NpyF32};
use berth_plugin_common::vision::lfm2_vl::Lfm2VlProjector;
use berth_plugin_common::vision::minicpmv4_6::{nearest_position_ids, MiniCpmV46Vision};
use berth_plugin_common::vision::siglip::SiglipVisionModel;
use berth_plugin_common::vision::siglip2::Siglip2VisionModel;
use berth_plugin_common::vision::{VisionConfig, VisionOutput};
use berth_plugin_common::Weights;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    shared_fixtures().join("reference-tiny-vision").join(name)
}

struct Fixture {
    config: serde_json::Value,
    weights: Weights,
    inputs: BTreeMap<String, NpyF32>,
    outputs: BTreeMap<String, NpyF32>,
}

fn fixture(name: &str) -> Fixture {
    let d = dir(name);
    let config = serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
    Fixture {
        config,
        weights: Weights::open_safetensors(&[d.join("model.safetensors")]).unwrap(),
        inputs: read_npz_f32(d.join("inputs.npz")).unwrap(),
        outputs: read_npz_f32(d.join("outputs.npz")).unwrap(),
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

/// Checks every tower output recorded in `outputs` and prints the ratios.
fn check_tower(name: &str, out: &VisionOutput, outputs: &BTreeMap<String, NpyF32>) {
    let mut checked = 0;
    for (i, h) in out.hidden_states.iter().enumerate() {
        let key = format!("hidden_{i:02}");
        if let Some(want) = outputs.get(&key) {
            let r = rel_err(&key, h, want);
            println!("{name} {key}: max|diff| / max|ref| = {r:.3e}");
            assert!(r <= 1e-3, "{name} {key}: {r}");
            checked += 1;
        }
    }
    let r = rel_err(
        "last_hidden_state",
        &out.last_hidden_state,
        &outputs["last_hidden_state"],
    );
    println!("{name} last_hidden_state: {r:.3e}");
    assert!(r <= 1e-3, "{name} last_hidden_state: {r}");
    let pooled = out.pooler_output.as_ref().expect("the fixture has a head");
    let r = rel_err("pooler_output", pooled, &outputs["pooler_output"]);
    println!("{name} pooler_output: {r:.3e}");
    assert!(r <= 1e-3, "{name} pooler_output: {r}");
    assert_eq!(
        checked,
        out.hidden_states.len(),
        "every hidden state has a reference"
    );
}

#[test]
fn siglip_tower_matches_transformers() {
    let f = fixture("siglip");
    let cfg = VisionConfig::from_json(&f.config).unwrap();
    let model = SiglipVisionModel::load(&f.weights, "", cfg).unwrap();
    let px = &f.inputs["pixel_values"];
    assert_eq!(px.shape.len(), 4);
    let (h, w) = (px.shape[2], px.shape[3]);
    for threads in [1, 3] {
        let out = model.forward(&px.data, h, w, true, threads).unwrap();
        assert_eq!(out.hidden_states.len(), 3);
        check_tower("siglip", &out, &f.outputs);
    }
    // A grid the position table does not cover is refused.
    assert!(model.forward(&px.data[..3 * 16 * 32], 16, 32, false, 1).is_err());
}

/// The SigLIP2 inputs: patches, mask and patch grid of the batch's only image.
fn siglip2_inputs(f: &Fixture) -> (Vec<f32>, Vec<bool>, (usize, usize)) {
    let px = &f.inputs["pixel_values"];
    let mask = &f.inputs["pixel_attention_mask"];
    let shapes = &f.inputs["spatial_shapes"];
    assert_eq!(px.shape[0], 1);
    let mask: Vec<bool> = mask.data.iter().map(|&m| m != 0.0).collect();
    (
        px.data.clone(),
        mask,
        (shapes.data[0] as usize, shapes.data[1] as usize),
    )
}

#[test]
fn siglip2_navit_tower_matches_transformers_with_padding() {
    let f = fixture("siglip2");
    let cfg = VisionConfig::from_json(&f.config).unwrap();
    let model = Siglip2VisionModel::load(&f.weights, "", cfg).unwrap();
    let (patches, mask, grid) = siglip2_inputs(&f);
    // The fixture pads a 2×6 grid (aspect ratio 3, table 4×4) to 16 patches.
    assert_eq!(grid, (2, 6));
    assert_eq!(mask.iter().filter(|&&m| m).count(), 12);
    for threads in [1, 2] {
        let out = model.forward(&patches, &mask, grid, true, threads).unwrap();
        check_tower("siglip2", &out, &f.outputs);
    }
    // Padded patches' contents do not reach the real ones.
    let mut noisy = patches.clone();
    let cols = noisy.len() / mask.len();
    noisy[12 * cols..].iter_mut().for_each(|v| *v = 100.0);
    let a = model.forward(&patches, &mask, grid, false, 1).unwrap();
    let b = model.forward(&noisy, &mask, grid, false, 1).unwrap();
    let d = model.config.hidden_size;
    assert_eq!(a.last_hidden_state[..12 * d], b.last_hidden_state[..12 * d]);
    assert_eq!(a.pooler_output, b.pooler_output);
    // A grid larger than the patch slots is refused.
    assert!(model.forward(&patches, &mask, (4, 6), false, 1).is_err());
}

#[test]
fn lfm2_vl_tower_and_projector_match_the_image_features() {
    let f = fixture("lfm2_vl");
    let cfg = VisionConfig::from_json(&f.config["vision_config"]).unwrap();
    let tower = Siglip2VisionModel::load(&f.weights, "model.vision_tower.", cfg).unwrap();
    let projector = Lfm2VlProjector::load(&f.weights, "model.", &f.config).unwrap();
    let (patches, mask, grid) = siglip2_inputs(&f);
    assert_eq!(grid, (4, 6));
    let out = tower.forward(&patches, &mask, grid, false, 2).unwrap();
    let features = projector.forward(&out.last_hidden_state, grid, 2).unwrap();
    assert_eq!(projector.tokens(4, 6), 6);
    let r = rel_err("image_features", &features, &f.outputs["image_features"]);
    println!("lfm2_vl image_features: {r:.3e}");
    assert!(r <= 1e-3, "lfm2_vl image_features: {r}");
}

#[test]
fn minicpmv4_6_tower_and_merger_match_transformers() {
    let f = fixture("minicpmv4_6");
    let model = MiniCpmV46Vision::load(&f.weights, "model.", &f.config).unwrap();
    let px = &f.inputs["pixel_values"];
    let sizes = &f.inputs["target_sizes"];
    let grid = (sizes.data[0] as usize, sizes.data[1] as usize);
    assert_eq!(grid, (4, 8));
    assert_eq!(px.shape, vec![1, 3, 8, 256]);
    for threads in [1, 2] {
        let out = model.forward(&px.data, grid, threads).unwrap();
        assert_eq!(out.grid, (2, 4));
        let r = rel_err(
            "vision_last_hidden_state",
            &out.last_hidden_state,
            &f.outputs["vision_last_hidden_state"],
        );
        println!("minicpmv4_6 vision_last_hidden_state: {r:.3e}");
        assert!(r <= 1e-3, "minicpmv4_6 vision_last_hidden_state: {r}");
        let r = rel_err("image_features", &out.features, &f.outputs["image_features"]);
        println!("minicpmv4_6 image_features: {r:.3e}");
        assert!(r <= 1e-3, "minicpmv4_6 image_features: {r}");
    }
    // A grid of odd size cannot be merged into windows.
    let cut = &px.data[..3 * 8 * 8 * 3 * 8];
    assert!(model.forward(cut, (3, 8), 1).is_err());
}

#[test]
fn nearest_position_ids_bucket_the_grid_onto_the_table() {
    // Same size: the identity; half size: every other entry; a 3-wide grid on a 4-wide table
    // takes buckets 0, 1 (1/3 ≥ 1/4) and 2 (2/3 ≥ 1/2).
    assert_eq!(nearest_position_ids(2, 2, 2), vec![0, 1, 2, 3]);
    assert_eq!(nearest_position_ids(2, 2, 4), vec![0, 2, 8, 10]);
    assert_eq!(nearest_position_ids(1, 3, 4), vec![0, 1, 2]);
    assert_eq!(nearest_position_ids(4, 8, 4), {
        let cols = [0, 0, 1, 1, 2, 2, 3, 3];
        (0..4).flat_map(|r| cols.map(|c| r * 4 + c)).collect::<Vec<_>>()
    });
}
