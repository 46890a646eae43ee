//! LFM2-VL through the plugin `Model` trait (what the ABI 1.3 entries call): the vision spec,
//! `encode_images` of the fixture image for a sequence, and the logits of the prompt decoded in
//! chunks, after a fork and after a rewind below the image, against the tiny transformers
//! reference (`reference-tiny-vision/lfm2_vl`).

use berth_lfm2::{Lfm2Family, Lfm2Model};
use berth_plugin_api::{BatchView, Family, ImageInput, LoadConfig, LogitsOut, Model, PixelLayout};
use berth_plugin_common::npy::{read_npz_f32, shared_fixtures};
use berth_plugin_common::testing::tiny_fixture;
use std::path::PathBuf;

const VOCAB: usize = 512;
const IMAGE_TOKEN: i32 = 396;

fn dir() -> PathBuf {
    shared_fixtures().join("reference-tiny-vision").join("lfm2_vl")
}

fn create(pack_dir: PathBuf, architecture: &str) -> Lfm2Model {
    let cfg = LoadConfig {
        pack_dir,
        family: "lfm2".into(),
        architecture: architecture.into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    Lfm2Family::create(&cfg).unwrap_or_else(|e| panic!("{architecture}: {e}"))
}

fn load() -> Lfm2Model {
    create(dir(), "lfm2_vl")
}

/// The fixture: patches `[slots, 3·p·p]`, patch mask, grid, prompt ids and reference logits.
struct Fixture {
    patches: Vec<f32>,
    cols: u32,
    mask: Vec<u8>,
    grid: (u32, u32),
    ids: Vec<i32>,
    logits: Vec<f32>,
}

impl Fixture {
    fn new() -> Fixture {
        let i = read_npz_f32(dir().join("inputs.npz")).unwrap();
        let o = read_npz_f32(dir().join("outputs.npz")).unwrap();
        let pv = &i["pixel_values"];
        let shapes = &i["spatial_shapes"].data;
        Fixture {
            patches: pv.data.clone(),
            cols: pv.shape[2] as u32,
            mask: i["pixel_attention_mask"]
                .data
                .iter()
                .map(|&m| (m != 0.0) as u8)
                .collect(),
            grid: (shapes[0] as u32, shapes[1] as u32),
            ids: i["input_ids"].data.iter().map(|&t| t as i32).collect(),
            logits: o["logits"].data.clone(),
        }
    }

    /// Sequence positions of the image tokens when the prompt starts at 0.
    fn positions(&self) -> Vec<i32> {
        (0..self.ids.len() as i32)
            .filter(|&p| self.ids[p as usize] == IMAGE_TOKEN)
            .collect()
    }

    fn slots(&self) -> u32 {
        self.mask.len() as u32
    }

    /// The image as the host hands it over, placeholders at `positions`.
    fn input<'a>(&'a self, shape: &'a [u32], positions: &'a [i32]) -> ImageInput<'a> {
        ImageInput {
            shape,
            pixels: &self.patches,
            patch_mask: Some(&self.mask),
            grid: Some(self.grid),
            positions,
        }
    }
}

/// Decodes `ids[range]` of every sequence in `seqs` in one batch (positions from the range
/// start) and returns each sequence's logits rows.
fn decode(m: &mut Lfm2Model, ids: &[i32], range: std::ops::Range<usize>, seqs: &[i32]) -> Vec<Vec<f32>> {
    let n = range.len();
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    let mut seq_ids = Vec::new();
    for &s in seqs {
        tokens.extend_from_slice(&ids[range.clone()]);
        positions.extend(range.clone().map(|p| p as i32));
        seq_ids.extend(std::iter::repeat_n(s, n));
    }
    let want = vec![1u8; tokens.len()];
    let batch = BatchView {
        tokens: &tokens,
        positions: &positions,
        seq_ids: &seq_ids,
        want_logits: &want,
    };
    let mut out = vec![0.0; tokens.len() * VOCAB];
    m.decode(&batch, &mut LogitsOut::new(&mut out, VOCAB))
        .unwrap_or_else(|e| panic!("decode {range:?} of {seqs:?}: {e}"));
    out.chunks_exact(n * VOCAB).map(<[f32]>::to_vec).collect()
}

/// Max |got − want| / max |want| over `want`'s rows `from..`.
fn rel_err(got: &[f32], want: &[f32], from: usize) -> f32 {
    let want = &want[from * VOCAB..];
    assert_eq!(got.len(), want.len(), "logits length");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

fn assert_close(what: &str, got: &[f32], want: &[f32], from: usize) {
    let r = rel_err(got, want, from);
    println!("lfm2_vl {what}: max|diff| / max|ref| = {r:.3e}");
    assert!(r <= 1e-3, "{what}: {r}");
}

#[test]
fn lfm2_vl_pack_reports_its_vision_spec_and_text_packs_none() {
    let m = load();
    assert!(matches!(m, Lfm2Model::Vision(_)));
    let spec = m.vision().expect("lfm2_vl takes images");
    assert_eq!(spec.scheme, "lfm2_vl");
    assert_eq!(spec.layout, PixelLayout::Patches);
    assert_eq!(spec.patch_size, 8);
    assert_eq!(spec.image_token_id, IMAGE_TOKEN);
    let p = &spec.params;
    assert_eq!(p["downsample_factor"], 2);
    assert_eq!(p["encoder_patch_size"], 8);
    assert_eq!(p["max_image_tokens"], 256);
    assert_eq!(p["min_image_tokens"], 64);
    assert_eq!(p["tile_size"], 512);
    assert_eq!(p["use_thumbnail"], true);
    assert_eq!(p["image_mean"], serde_json::json!([0.5, 0.5, 0.5]));
    assert_eq!(p["image_token"], "<image>");
    let text = create(tiny_fixture("lfm2"), "lfm2");
    assert!(matches!(text, Lfm2Model::Text(_)));
    assert!(text.vision().is_none());
}

#[test]
fn lfm2_vl_encoded_image_fills_a_prompt_decoded_in_two_chunks() {
    let mut m = load();
    let f = Fixture::new();
    let pos = f.positions();
    assert_eq!(pos.len(), 6);
    let shape = [f.slots(), f.cols];
    m.encode_images(0, &[f.input(&shape, &pos)]).unwrap();
    // Split inside the image: its first placeholders go in the first batch, the rest later.
    let cut = pos[2] as usize + 1;
    let mut logits = decode(&mut m, &f.ids, 0..cut, &[0]).remove(0);
    logits.extend(decode(&mut m, &f.ids, cut..f.ids.len(), &[0]).remove(0));
    assert_close("two-chunk prefill logits", &logits, &f.logits, 0);

    // More padding slots (mask 0) after the real patches change nothing.
    let mut m = load();
    let extra = 10;
    let mut padded = Fixture::new();
    padded.patches.extend(vec![0.0; extra * f.cols as usize]);
    padded.mask.extend(vec![0; extra]);
    let shape = [padded.slots(), padded.cols];
    m.encode_images(3, &[padded.input(&shape, &pos)]).unwrap();
    let logits = decode(&mut m, &f.ids, 0..f.ids.len(), &[3]).remove(0);
    assert_close("padded-image prefill logits", &logits, &f.logits, 0);
}

#[test]
fn lfm2_vl_fork_carries_the_image_to_the_new_sequence() {
    let mut m = load();
    let f = Fixture::new();
    let pos = f.positions();
    let shape = [f.slots(), f.cols];
    m.encode_images(0, &[f.input(&shape, &pos)]).unwrap();
    let cut = pos[1] as usize;
    let first = decode(&mut m, &f.ids, 0..cut, &[0]).remove(0);
    assert_close("before fork", &first, &f.logits[..cut * VOCAB], 0);
    m.seq_fork(0, 1).unwrap();
    // Both sequences decode the rest of the prompt, image rows included, in one batch.
    let rest = decode(&mut m, &f.ids, cut..f.ids.len(), &[0, 1]);
    assert_close("source after fork", &rest[0], &f.logits, cut);
    assert_close("forked sequence", &rest[1], &f.logits, cut);
}

#[test]
fn lfm2_vl_rewind_below_the_image_drops_it_until_encoded_again() {
    let mut m = load();
    let f = Fixture::new();
    let pos = f.positions();
    let shape = [f.slots(), f.cols];
    m.encode_images(2, &[f.input(&shape, &pos)]).unwrap();
    decode(&mut m, &f.ids, 0..f.ids.len(), &[2]);
    m.seq_truncate(2, 0).unwrap();
    // The image went with the rewind: its placeholders are refused without features.
    let n = f.ids.len();
    let positions: Vec<i32> = (0..n as i32).collect();
    let (seqs, want) = (vec![2; n], vec![1u8; n]);
    let batch = BatchView {
        tokens: &f.ids,
        positions: &positions,
        seq_ids: &seqs,
        want_logits: &want,
    };
    let mut out = vec![0.0; n * VOCAB];
    let err = m
        .decode(&batch, &mut LogitsOut::new(&mut out, VOCAB))
        .unwrap_err();
    assert!(
        err.message.contains("without an encoded image"),
        "{}",
        err.message
    );
    // Encoded again, the same prompt gives the reference logits again.
    m.encode_images(2, &[f.input(&shape, &pos)]).unwrap();
    let logits = decode(&mut m, &f.ids, 0..n, &[2]).remove(0);
    assert_close("re-encoded after rewind", &logits, &f.logits, 0);
}

#[test]
fn lfm2_vl_refuses_images_that_do_not_fit_their_placeholders() {
    let mut m = load();
    let f = Fixture::new();
    let pos = f.positions();
    let shape = [f.slots(), f.cols];
    // One placeholder short of the grid's image tokens.
    let err = m.encode_images(0, &[f.input(&shape, &pos[..5])]).unwrap_err();
    assert!(err.message.contains("5 placeholder positions"), "{}", err.message);
    // A grid other than the mask's real patches.
    let wrong_grid = ImageInput {
        grid: Some((f.grid.0, f.grid.1 + 1)),
        ..f.input(&shape, &pos)
    };
    assert!(m.encode_images(0, &[wrong_grid]).is_err());
    // Patches of the wrong width.
    let bad_shape = [f.slots() * 2, f.cols / 2];
    assert!(m.encode_images(0, &[f.input(&bad_shape, &pos)]).is_err());
    // Two images on one position.
    let err = m
        .encode_images(0, &[f.input(&shape, &pos), f.input(&shape, &pos)])
        .unwrap_err();
    assert!(err.message.contains("given twice"), "{}", err.message);
    // Nothing refused was kept: the prompt's image tokens still have no features.
    let n = f.ids.len();
    let positions: Vec<i32> = (0..n as i32).collect();
    let (seqs, want) = (vec![0; n], vec![0u8; n]);
    let batch = BatchView {
        tokens: &f.ids,
        positions: &positions,
        seq_ids: &seqs,
        want_logits: &want,
    };
    assert!(m.decode(&batch, &mut LogitsOut::new(&mut [], VOCAB)).is_err());
}
