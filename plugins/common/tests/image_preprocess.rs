//! Image preprocessing compared with transformers' own MiniCPM-V 4.6 and LFM2-VL image
//! processors on the fixtures recorded by `scripts/gen-image-fixtures`. The processors are fed
//! Pillow's decoded pixels: the lossless formats decode to exactly those (checked here too), the
//! lossy ones are recorded as raw RGB (the host's decoder is compared with them in
//! `host/tests/image_decode.rs`).

use std::path::{Path, PathBuf};

use berth_kernels::image::patch_rows;
use berth_kernels::image::patch_strip;
use berth_kernels::image::resample::Arithmetic;
use berth_plugin_common::vision::preprocess::lfm2_vl::{self as lfm2vl, Lfm2VlParams, Lfm2VlTokens};
use berth_plugin_common::vision::preprocess::minicpmv::{self, MiniCpmVParams, MiniCpmVTokens};
use berth_plugin_common::vision::preprocess::RgbImage;
use serde_json::Value;

/// Largest difference allowed between a pixel value and the reference's.
const PIXEL_TOL: f64 = 1e-5;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/images")
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

fn minicpm_params(v: &Value, arithmetic: Arithmetic) -> MiniCpmVParams {
    assert_eq!(v["downsample_mode"], "16x");
    MiniCpmVParams {
        max_slice_nums: v["max_slice_nums"].as_u64().unwrap() as usize,
        scale_resolution: v["scale_resolution"].as_u64().unwrap() as usize,
        patch_size: v["patch_size"].as_u64().unwrap() as usize,
        image_mean: f32s(&v["image_mean"]).try_into().unwrap(),
        image_std: f32s(&v["image_std"]).try_into().unwrap(),
        arithmetic,
        ..MiniCpmVParams::default()
    }
}

fn lfm2_params(v: &Value) -> Lfm2VlParams {
    let u = |k: &str| v[k].as_u64().unwrap() as usize;
    Lfm2VlParams {
        downsample_factor: u("downsample_factor"),
        min_tiles: u("min_tiles"),
        max_tiles: u("max_tiles"),
        use_thumbnail: v["use_thumbnail"].as_bool().unwrap(),
        min_image_tokens: u("min_image_tokens"),
        max_image_tokens: u("max_image_tokens"),
        encoder_patch_size: u("encoder_patch_size"),
        tile_size: u("tile_size"),
        max_pixels_tolerance: v["max_pixels_tolerance"].as_f64().unwrap(),
        image_mean: f32s(&v["image_mean"]).try_into().unwrap(),
        image_std: f32s(&v["image_std"]).try_into().unwrap(),
        do_image_splitting: true,
    }
}

/// The pixels both processors are fed: Pillow's for the lossy formats, else a lossless decode
/// of the file (checked against Pillow's).
fn decoded(rec: &Value) -> RgbImage {
    let file = rec["file"].as_str().unwrap();
    let (w, h) = (
        rec["width"].as_u64().unwrap() as usize,
        rec["height"].as_u64().unwrap() as usize,
    );
    if let Some(raw) = rec["decoded_rgb"].as_str() {
        let pil = std::fs::read(dir().join(raw)).unwrap();
        assert_eq!(pil.len(), w * h * 3);
        return RgbImage {
            width: w,
            height: h,
            data: pil,
        };
    }
    let bytes = std::fs::read(dir().join(file)).unwrap();
    let img = image::load_from_memory(&bytes)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .to_rgb8();
    assert_eq!(
        (img.width() as usize, img.height() as usize),
        (w, h),
        "{file}: size"
    );
    let ours = RgbImage {
        width: w,
        height: h,
        data: img.into_raw(),
    };
    let values: Vec<f32> = ours.data.iter().map(|&v| f32::from(v)).collect();
    // Lossless formats decode exactly: the tolerance is far below one level.
    compare(&format!("{file} decode"), &values, &[h, w, 3], &rec["decoded"]);
    ours
}

#[test]
fn minicpmv_matches_transformers() {
    let exp = expected();
    for (key, arith) in [
        ("minicpmv4_6", Arithmetic::Pillow),
        ("minicpmv4_6_torchvision", Arithmetic::TorchU8),
    ] {
        let params = minicpm_params(&exp["params"]["minicpmv4_6"], arith);
        for rec in exp["images"].as_array().unwrap() {
            let file = rec["file"].as_str().unwrap();
            let img = decoded(rec);
            let r = &rec[key];
            let out = minicpmv::preprocess(&img, &params, &MiniCpmVTokens::default(), 0);
            let grid = usizes(&r["grid"]);
            assert_eq!((out.grid.0, out.grid.1), (grid[0], grid[1]), "{file}: grid");
            assert_eq!(
                out.placeholder,
                r["placeholder"].as_str().unwrap(),
                "{file}: placeholder"
            );
            let sizes = r["target_sizes"].as_array().unwrap();
            assert_eq!(out.slices.len(), sizes.len(), "{file}: slice count");
            let p = params.patch_size;
            let mut max = 0f64;
            for (i, (s, ts)) in out.slices.iter().zip(sizes).enumerate() {
                assert_eq!(
                    [s.height / p, s.width / p],
                    usizes(ts).as_slice(),
                    "{file}: slice {i} size"
                );
                let values = patch_strip(s, p);
                let shape = [3, p, s.height * s.width / p];
                max = max.max(compare(
                    &format!("{key} {file} slice {i}"),
                    &values,
                    &shape,
                    &r["slices"][i],
                ));
            }
            println!(
                "{key} {file}: grid {grid:?}, {} slices, max sampled diff {max:e}",
                out.slices.len()
            );
        }
    }
}

#[test]
fn lfm2vl_matches_transformers() {
    let exp = expected();
    let params = lfm2_params(&exp["params"]["lfm2_vl"]);
    for rec in exp["images"].as_array().unwrap() {
        let file = rec["file"].as_str().unwrap();
        let img = decoded(rec);
        let r = &rec["lfm2_vl"];
        let out = lfm2vl::preprocess(&img, &params, &Lfm2VlTokens::default());
        let rows = r["rows"].as_u64().unwrap() as usize;
        let cols = r["cols"].as_u64().unwrap() as usize;
        assert_eq!(out.grid, (rows, cols), "{file}: grid");
        assert_eq!(
            out.placeholder,
            r["placeholder"].as_str().unwrap(),
            "{file}: placeholder"
        );
        let shape = usizes(&r["pixel_values_shape"]);
        assert_eq!(out.slices.len(), shape[0], "{file}: tile count");
        let valid = usizes(&r["mask_valid"]);
        let mut max = 0f64;
        for (i, s) in out.slices.iter().enumerate() {
            let tile = patch_rows(s, params.encoder_patch_size, params.max_num_patches());
            assert_eq!(
                tile.patches.len(),
                shape[1] * shape[2],
                "{file}: tile {i} padded size"
            );
            assert_eq!(tile.valid_patches, valid[i], "{file}: tile {i} mask");
            let rt = &r["tiles"][i];
            let ss = usizes(&rt["spatial_shape"]);
            assert_eq!(
                [tile.spatial_shape.0, tile.spatial_shape.1],
                ss.as_slice(),
                "{file}: tile {i}"
            );
            let used = &tile.patches[..tile.valid_patches * shape[2]];
            max = max.max(compare(
                &format!("lfm2 {file} tile {i}"),
                used,
                &[tile.valid_patches, shape[2]],
                rt,
            ));
        }
        println!(
            "lfm2_vl {file}: {rows}x{cols}, {} tiles, max sampled diff {max:e}",
            out.slices.len()
        );
    }
}
