//! Image decoding compared with Pillow's on the fixtures recorded by `scripts/gen-image-fixtures`
//! (the preprocessing of those pixels, beside the vision towers, is compared with transformers'
//! image processors in `plugins/common/tests/image_preprocess.rs`), and decoding errors.

use std::path::{Path, PathBuf};

use berth::image::{decode, DecodeLimits, ImageError};
use serde_json::Value;

/// Largest difference allowed between a pixel value and the reference's.
const PIXEL_TOL: f64 = 1e-5;
/// Largest per-level difference between our JPEG / WebP decoders and Pillow's (libjpeg-turbo,
/// libwebp): IDCT and chroma upsampling are not specified bit-exactly.
const LOSSY_DECODE_TOL: u8 = 6;
/// Largest mean per-level difference for the lossy formats.
const LOSSY_DECODE_MEAN_TOL: f64 = 1.0;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).unwrap()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// Compares values against a recorded `sample()` (shape, sums, strided values); returns the
/// largest sampled difference.
fn compare(what: &str, values: &[f32], shape: &[usize], rec: &Value) -> f64 {
    assert_eq!(shape, usizes(&rec["shape"]).as_slice(), "{what}: shape");
    let stride = rec["stride"].as_u64().unwrap() as usize;
    let samples = f32s(&rec["samples"]);
    let ours: Vec<f32> = values.iter().step_by(stride).copied().collect();
    assert_eq!(ours.len(), samples.len(), "{what}: sample count");
    let mut max = 0f64;
    for (i, (a, b)) in ours.iter().zip(&samples).enumerate() {
        let d = f64::from((a - b).abs());
        assert!(d <= PIXEL_TOL, "{what}: value {} differs: {a} vs {b}", i * stride);
        max = max.max(d);
    }
    let n = values.len() as f64;
    let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
    let sum_sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let (rs, rq) = (rec["sum"].as_f64().unwrap(), rec["sum_sq"].as_f64().unwrap());
    assert!((sum - rs).abs() <= n * 1e-6 + 1e-3, "{what}: sum {sum} vs {rs}");
    assert!(
        (sum_sq - rq).abs() <= n * 1e-6 + 1e-3,
        "{what}: sum of squares {sum_sq} vs {rq}"
    );
    max
}

/// Our decode of the fixture, checked against Pillow's.
fn decoded(rec: &Value) {
    let file = rec["file"].as_str().unwrap();
    let bytes = std::fs::read(dir().join(file)).unwrap();
    let ours = decode(&bytes, DecodeLimits::default()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let (w, h) = (
        rec["width"].as_u64().unwrap() as usize,
        rec["height"].as_u64().unwrap() as usize,
    );
    assert_eq!((ours.width, ours.height), (w, h), "{file}: size");
    match rec["decoded_rgb"].as_str() {
        Some(raw) => {
            let pil = std::fs::read(dir().join(raw)).unwrap();
            assert_eq!(pil.len(), w * h * 3);
            let diffs: Vec<u8> = ours.data.iter().zip(&pil).map(|(a, b)| a.abs_diff(*b)).collect();
            let max = *diffs.iter().max().unwrap();
            let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
            println!("{file}: decode vs Pillow: max {max} levels, mean {mean:.3}");
            assert!(
                max <= LOSSY_DECODE_TOL,
                "{file}: decoded pixels differ by {max} levels"
            );
            assert!(
                mean <= LOSSY_DECODE_MEAN_TOL,
                "{file}: decoded pixels differ by {mean} on average"
            );
        }
        None => {
            let values: Vec<f32> = ours.data.iter().map(|&v| f32::from(v)).collect();
            // Lossless formats decode exactly: the tolerance is far below one level.
            compare(&format!("{file} decode"), &values, &[h, w, 3], &rec["decoded"]);
        }
    }
}

#[test]
fn decoding_matches_pillow() {
    let exp = expected();
    for rec in exp["images"].as_array().unwrap() {
        decoded(rec);
    }
}

#[test]
fn decode_errors_are_typed() {
    let corrupt = std::fs::read(dir().join("corrupt.png")).unwrap();
    assert!(matches!(
        decode(&corrupt, DecodeLimits::default()),
        Err(ImageError::Corrupt(_))
    ));
    let png = std::fs::read(dir().join("large.png")).unwrap();
    let err = decode(
        &png,
        DecodeLimits {
            max_pixels: 1_000_000,
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        ImageError::TooLarge {
            width: 1500,
            height: 1100,
            max_pixels: 1_000_000
        }
    );
    assert!(err.to_string().contains("1500x1100"));
    assert!(matches!(
        decode(b"GIF87a", DecodeLimits::default()),
        Err(ImageError::Corrupt(_))
    ));
    assert!(matches!(
        decode(b"%PDF-1.4", DecodeLimits::default()),
        Err(ImageError::Unsupported(_))
    ));
}
