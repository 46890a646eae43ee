//! The vision-language wrapper's rule for pending image features, transition by transition, on
//! the tiny Gemma 3 reference language model with a tiny tower: encode, prefill over several
//! batches, fork, truncate, prefix reuse and what is refused. Logits through the `Model` trait
//! are compared bit for bit with the same batches given their features explicitly.

use berth_plugin_api::{
    BatchView, ImageInput, LoadConfig, LogitsOut, Model, PixelLayout, PluginError, PreparedImage,
    PreparedSlice, RgbView, VisionSpec,
};
use berth_plugin_common::family::Loaded;
use berth_plugin_common::vision::preprocess::ImageScheme;
use berth_plugin_common::{
    Activation, DecoderConfig, DecoderModel, DecoderWeights, HfNames, VisionLanguageModel, VisionTower,
    Weights,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The tiny model's image preparation: one image token per 8-pixel row band, the image's
/// number in the placeholder, pixels as 0..1 rows.
struct TinyScheme;

impl ImageScheme for TinyScheme {
    fn prepare(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        if !image.height.is_multiple_of(8) {
            return Err(PluginError::invalid_argument("height not a multiple of 8"));
        }
        let tokens = (image.height / 8) as usize;
        Ok(PreparedImage {
            placeholder: format!("<{index}>{}", "<img>".repeat(tokens)),
            slices: vec![PreparedSlice {
                shape: vec![tokens as u32, PER_TOKEN as u32],
                pixels: (0..tokens * PER_TOKEN).map(|i| i as f32 / 255.0).collect(),
                patch_mask: None,
                grid: Some((tokens as u32, 1)),
                tokens: tokens as u32,
            }],
        })
    }
}

const VOCAB: usize = 512;
const WIDTH: usize = 64;
const IMAGE: i32 = 7;
/// Values per image token in the tiny tower's input.
const PER_TOKEN: usize = 4;

/// A tower whose input is `[tokens, 4]` values and whose feature rows spread each token's four
/// values over the width; it counts its encodes.
#[derive(Default)]
struct TinyTower {
    encodes: AtomicUsize,
    /// Claims half the language model's width (a mismatched tower).
    narrow: bool,
}

impl VisionTower for TinyTower {
    fn feature_width(&self) -> usize {
        if self.narrow {
            WIDTH / 2
        } else {
            WIDTH
        }
    }

    fn image_tokens_of(&self, image: &ImageInput<'_>) -> Result<usize, PluginError> {
        match image.shape {
            &[n, c] if c as usize == PER_TOKEN => Ok(n as usize),
            s => Err(PluginError::invalid_argument(format!(
                "shape {s:?}; [N, 4] expected"
            ))),
        }
    }

    fn encode(&self, image: &ImageInput<'_>, _threads: usize) -> Result<Vec<f32>, PluginError> {
        self.encodes.fetch_add(1, Ordering::Relaxed);
        Ok(features_of(image.pixels))
    }
}

/// The tiny tower's features of `pixels`.
fn features_of(pixels: &[f32]) -> Vec<f32> {
    pixels
        .chunks_exact(PER_TOKEN)
        .flat_map(|t| (0..WIDTH).map(move |j| t[j % PER_TOKEN] * (1.0 + j as f32 / WIDTH as f32)))
        .collect()
}

fn text() -> (DecoderModel, Loaded) {
    let dir = berth_plugin_common::npy::shared_fixtures().join("reference-tiny/gemma3");
    let w = Weights::open_safetensors(&[dir.join("model.safetensors")])
        .unwrap()
        .with_hf_names(HfNames::Sandwich);
    let mut cfg = DecoderConfig::new(6, 64, 4, 1, 16);
    cfg.norm_add_one = true;
    cfg.qk_norm = true;
    cfg.post_norms = true;
    cfg.activation = Activation::GeluTanh;
    cfg.tie_embeddings = true;
    let weights = DecoderWeights::load(&w, &cfg).unwrap();
    let loaded = || Loaded {
        architecture: "gemma3".into(),
        cfg: cfg.clone(),
        weights: weights.clone(),
        context_length: 64,
        specials: Default::default(),
        tools: false,
    };
    (DecoderModel::new(loaded(), &load_config()).unwrap(), loaded())
}

fn load_config() -> LoadConfig {
    LoadConfig {
        threads: Some(2),
        max_sequences: Some(4),
        ..Default::default()
    }
}

fn spec() -> VisionSpec {
    VisionSpec {
        scheme: "tiny".into(),
        layout: PixelLayout::Patches,
        patch_size: 1,
        image_token_id: IMAGE,
        params: Default::default(),
    }
}

/// The model, and a plain language model fed explicit features for the reference logits.
fn models() -> (VisionLanguageModel<TinyTower>, DecoderModel) {
    let (reference, loaded) = text();
    let m = VisionLanguageModel::new(
        loaded,
        &load_config(),
        TinyTower::default(),
        spec(),
        Box::new(TinyScheme),
    )
    .unwrap();
    (m, reference)
}

/// A prompt with one image of three tokens at positions 2..5.
const PROMPT: [i32; 8] = [2, 40, IMAGE, IMAGE, IMAGE, 41, 42, 43];
const PLACES: [i32; 3] = [2, 3, 4];

fn pixels(seed: f32) -> Vec<f32> {
    (0..PLACES.len() * PER_TOKEN)
        .map(|i| ((i as f32 + seed) * 0.37).sin())
        .collect()
}

fn image<'a>(pixels: &'a [f32], shape: &'a [u32], positions: &'a [i32]) -> ImageInput<'a> {
    ImageInput {
        shape,
        pixels,
        patch_mask: None,
        grid: None,
        positions,
    }
}

/// A batch of `PROMPT[range]` for `seq`, every row with logits.
fn rows(seq: i32, range: std::ops::Range<usize>) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<u8>) {
    let n = range.len();
    let tokens = PROMPT[range.clone()].to_vec();
    let positions = range.map(|p| p as i32).collect();
    (tokens, positions, vec![seq; n], vec![1; n])
}

/// `PROMPT[range]` of `seq` through `Model::decode`.
fn decode(m: &mut dyn Model, seq: i32, range: std::ops::Range<usize>) -> Result<Vec<f32>, PluginError> {
    let (t, p, s, w) = rows(seq, range);
    let batch = BatchView {
        tokens: &t,
        positions: &p,
        seq_ids: &s,
        want_logits: &w,
    };
    let mut out = vec![0.0; t.len() * VOCAB];
    m.decode(&batch, &mut LogitsOut::new(&mut out, VOCAB))?;
    Ok(out)
}

/// `PROMPT[range]` of `seq` with the image's features given explicitly (the reference).
fn reference(m: &mut DecoderModel, seq: i32, range: std::ops::Range<usize>, features: &[f32]) -> Vec<f32> {
    let (t, p, s, w) = rows(seq, range.clone());
    let batch = BatchView {
        tokens: &t,
        positions: &p,
        seq_ids: &s,
        want_logits: &w,
    };
    let first = PLACES.iter().filter(|&&q| (q as usize) < range.start).count();
    let n = t.iter().filter(|&&x| x == IMAGE).count();
    let mut out = vec![0.0; t.len() * VOCAB];
    m.decode_with_token_features(
        &batch,
        IMAGE,
        &features[first * WIDTH..(first + n) * WIDTH],
        &mut LogitsOut::new(&mut out, VOCAB),
    )
    .unwrap();
    out
}

const SHAPE: [u32; 2] = [3, 4];

#[test]
fn an_image_over_several_batches_matches_explicit_features_and_is_consumed() {
    let (mut m, mut r) = models();
    let px = pixels(0.0);
    let f = features_of(&px);
    m.encode_images(0, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    assert_eq!(m.pending_rows(0), 3);
    // Split inside the image: its first two rows go in the first batch, the last one later.
    let a = decode(&mut m, 0, 0..4).unwrap();
    assert_eq!(m.pending_rows(0), 1, "decoded features are consumed");
    let b = decode(&mut m, 0, 4..8).unwrap();
    assert_eq!(m.pending_rows(0), 0);
    assert_eq!(a, reference(&mut r, 0, 0..4, &f));
    assert_eq!(b, reference(&mut r, 0, 4..8, &f));
}

#[test]
fn fork_copies_the_pending_features_only() {
    let (mut m, mut r) = models();
    let px = pixels(1.0);
    let f = features_of(&px);
    m.encode_images(0, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    decode(&mut m, 0, 0..3).unwrap();
    // A fork replaces whatever the destination held.
    let other = pixels(2.0);
    m.encode_images(1, &[image(&other, &SHAPE, &PLACES)]).unwrap();
    m.seq_fork(0, 1).unwrap();
    assert_eq!(m.pending_rows(1), 2, "the two rows 0 had not decoded");
    let want = {
        reference(&mut r, 0, 0..3, &f);
        reference(&mut r, 0, 3..8, &f)
    };
    for seq in [0, 1] {
        assert_eq!(decode(&mut m, seq, 3..8).unwrap(), want, "sequence {seq}");
    }
    // Forking a sequence without pending features leaves the destination none.
    m.encode_images(2, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    m.seq_fork(3, 2).unwrap();
    assert_eq!(m.pending_rows(2), 0);
}

#[test]
fn truncate_drops_features_at_and_after_the_cut_and_reuse_needs_the_image_again() {
    let (mut m, _) = models();
    let px = pixels(3.0);
    m.encode_images(0, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    let first = decode(&mut m, 0, 0..8).unwrap();
    // Prefix reuse past the image: the image rows live on in the cache, nothing is re-sent.
    m.seq_truncate(0, 6).unwrap();
    let tail = decode(&mut m, 0, 6..8).unwrap();
    assert_eq!(tail, first[6 * VOCAB..]);
    // Below the image: its rows are gone and its features were consumed, so the image token is
    // refused until the host encodes the image again.
    m.seq_truncate(0, 2).unwrap();
    let err = decode(&mut m, 0, 2..8).unwrap_err();
    assert!(
        err.message.contains("without an encoded image"),
        "{}",
        err.message
    );
    m.encode_images(0, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    assert_eq!(decode(&mut m, 0, 2..8).unwrap(), first[2 * VOCAB..]);
    // Pending features at or after a cut go with it.
    m.seq_truncate(0, 0).unwrap();
    m.encode_images(0, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    decode(&mut m, 0, 0..2).unwrap();
    m.seq_truncate(0, 2).unwrap();
    assert_eq!(m.pending_rows(0), 0);
    assert_eq!(m.tower.encodes.load(Ordering::Relaxed), 3);
}

#[test]
fn encode_refuses_whole_calls_that_break_the_rule() {
    let (mut m, _) = models();
    let px = pixels(4.0);
    let ok = image(&px, &SHAPE, &PLACES);
    let short = image(&px, &SHAPE, &PLACES[..2]);
    let err = m.encode_images(0, &[short]).unwrap_err();
    assert!(err.message.contains("2 placeholder positions"), "{}", err.message);
    let bad_shape = image(&px, &[4, 3], &PLACES);
    let err = m.encode_images(0, &[ok, bad_shape]).unwrap_err();
    assert!(err.message.starts_with("image 1: shape"), "{}", err.message);
    let err = m.encode_images(0, &[ok, ok]).unwrap_err();
    assert!(err.message.contains("given twice"), "{}", err.message);
    assert_eq!(m.pending_rows(0), 0, "nothing of a refused call is kept");
    assert_eq!(
        m.tower.encodes.load(Ordering::Relaxed),
        0,
        "refused before encoding"
    );
    m.encode_images(0, &[ok]).unwrap();
    let err = m.encode_images(0, &[ok]).unwrap_err();
    assert!(
        err.message.contains("already has image features"),
        "{}",
        err.message
    );
    decode(&mut m, 0, 0..3).unwrap();
    m.seq_truncate(0, 3).unwrap();
    let err = m.encode_images(0, &[ok]).unwrap_err();
    assert!(err.message.contains("already decoded"), "{}", err.message);
    assert!(m.encode_images(9, &[ok]).is_err(), "no such sequence");
}

#[test]
fn a_placeholder_holding_another_token_is_refused_and_a_forced_image_token_takes_its_row() {
    let (mut m, mut r) = models();
    let px = pixels(5.0);
    let f = features_of(&px);
    m.encode_images(0, &[image(&px, &SHAPE, &PLACES)]).unwrap();
    decode(&mut m, 0, 0..2).unwrap();
    let batch = BatchView {
        tokens: &[40],
        positions: &[2],
        seq_ids: &[0],
        want_logits: &[0],
    };
    let err = m.decode(&batch, &mut LogitsOut::new(&mut [], VOCAB)).unwrap_err();
    assert!(err.message.contains("is an image placeholder"), "{}", err.message);
    assert_eq!(m.pending_rows(0), 3, "a refused batch consumes nothing");
    m.force_token(0, IMAGE).unwrap();
    assert_eq!(m.pending_rows(0), 2);
    reference(&mut r, 0, 0..3, &f);
    assert_eq!(decode(&mut m, 0, 3..8).unwrap(), reference(&mut r, 0, 3..8, &f));
}

#[test]
fn the_wrapper_checks_the_tower_and_token_against_the_language_model() {
    let (_, loaded) = text();
    let mut far = spec();
    far.image_token_id = VOCAB as i32;
    let err = VisionLanguageModel::new(
        loaded,
        &load_config(),
        TinyTower::default(),
        far,
        Box::new(TinyScheme),
    )
    .err()
    .unwrap();
    assert!(err.message.contains("outside the vocabulary"), "{}", err.message);
    let (_, loaded) = text();
    let narrow = TinyTower {
        narrow: true,
        ..Default::default()
    };
    let err = VisionLanguageModel::new(loaded, &load_config(), narrow, spec(), Box::new(TinyScheme))
        .err()
        .unwrap();
    assert!(
        err.message.contains("32 values per image token"),
        "{}",
        err.message
    );
    let (m, _) = models();
    assert_eq!(m.vision().unwrap().scheme, "tiny");
    assert_eq!(m.describe().vocab_size as usize, VOCAB);
}

#[test]
fn images_are_prepared_by_the_towers_scheme() {
    let (m, _) = models();
    let data = vec![0u8; 4 * 16 * 3];
    let view = RgbView {
        width: 4,
        height: 16,
        data: &data,
    };
    let prepared = m.prepare_image(&view, 3).unwrap();
    assert_eq!(prepared.placeholder, "<3><img><img>");
    assert_eq!(prepared.slices.len(), 1);
    assert_eq!(prepared.slices[0].tokens, 2);
    let odd = RgbView {
        width: 4,
        height: 15,
        data: &data[..4 * 15 * 3],
    };
    let err = m.prepare_image(&odd, 0).unwrap_err();
    assert!(err.message.contains("multiple of 8"), "{}", err.message);
}
