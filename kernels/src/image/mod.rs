//! The pixel arithmetic of vision preprocessing, bit-exact with the Hugging Face image
//! processors: antialiased resizing with Pillow's or torch's integer weights ([`resample`]),
//! cropping, `(x / 255 - mean) / std` normalisation into channel-first planes, and the two ways
//! vision towers take patches (MiniCPM-V's NaViT strip, SigLIP2's rows of flattened patches).
//!
//! Which sizes, grids and layouts a model uses is its family's business (the plugins'
//! `vision::preprocess`); everything here is model-independent.

pub mod resample;

/// An 8-bit RGB image: row-major, interleaved (`[height, width, 3]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes.
    pub data: Vec<u8>,
}

/// Normalised f32 pixels, channel-first `[3, height, width]`: one slice (or tile) of an image.
#[derive(Debug, Clone, PartialEq)]
pub struct ChwImage {
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
    /// `3 * height * width` values, channel-major.
    pub data: Vec<f32>,
}

/// Rescales 8-bit pixels to `[0, 1]` and normalises them per channel, `(x / 255 - mean) / std`,
/// into a channel-first image.
pub fn normalize(img: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> ChwImage {
    let (h, w) = (img.height, img.width);
    let mut data = vec![0f32; 3 * h * w];
    for c in 0..3 {
        // Computed in f64 and rounded once, as the reference rescales in f64.
        let (m, s) = (f64::from(mean[c]), f64::from(std[c]));
        let plane = &mut data[c * h * w..(c + 1) * h * w];
        for (i, v) in plane.iter_mut().enumerate() {
            let x = f64::from(img.data[i * 3 + c]) / 255.0;
            *v = ((x - m) / s) as f32;
        }
    }
    ChwImage {
        height: h,
        width: w,
        data,
    }
}

/// Copies the `width`×`height` window at (`x`, `y`) out of an image.
pub fn crop(img: &RgbImage, x: usize, y: usize, width: usize, height: usize) -> RgbImage {
    let mut data = Vec::with_capacity(width * height * 3);
    for row in y..y + height {
        let start = (row * img.width + x) * 3;
        data.extend_from_slice(&img.data[start..start + width * 3]);
    }
    RgbImage { width, height, data }
}

/// Rearranges an image into the NaViT strip `[3, patch, (H/patch)·(W/patch)·patch]`: for each
/// channel and each row inside a patch, the patches in raster order, each contributing its
/// `patch` pixels of that row.
pub fn patch_strip(s: &ChwImage, patch: usize) -> Vec<f32> {
    let (h, w) = (s.height, s.width);
    let (nh, nw) = (h / patch, w / patch);
    let mut out = Vec::with_capacity(3 * nh * nw * patch * patch);
    for c in 0..3 {
        let plane = &s.data[c * h * w..(c + 1) * h * w];
        for py in 0..patch {
            for i in 0..nh {
                for j in 0..nw {
                    let start = (i * patch + py) * w + j * patch;
                    out.extend_from_slice(&plane[start..start + patch]);
                }
            }
        }
    }
    out
}

/// An image cut into rows of flattened patches, padded to a fixed row count.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchRows {
    /// `[rows, 3·p·p]` values; rows past `valid_patches` are zero.
    pub patches: Vec<f32>,
    /// How many leading rows are real patches (the pixel attention mask).
    pub valid_patches: usize,
    /// `(patches high, patches wide)`.
    pub spatial_shape: (usize, usize),
}

/// Cuts an image into `[max(padded_rows, patches), p·p·3]` rows (row in patch, column in patch,
/// channel), raster order over the patch grid, zero-padded past the real patches.
pub fn patch_rows(s: &ChwImage, patch: usize, padded_rows: usize) -> PatchRows {
    let (h, w) = (s.height, s.width);
    let (nh, nw) = (h / patch, w / patch);
    let dim = 3 * patch * patch;
    let mut patches = vec![0f32; padded_rows.max(nh * nw) * dim];
    for i in 0..nh {
        for j in 0..nw {
            let row = &mut patches[(i * nw + j) * dim..(i * nw + j + 1) * dim];
            for py in 0..patch {
                for px in 0..patch {
                    for c in 0..3 {
                        row[(py * patch + px) * 3 + c] =
                            s.data[c * h * w + (i * patch + py) * w + j * patch + px];
                    }
                }
            }
        }
    }
    PatchRows {
        patches,
        valid_patches: nh * nw,
        spatial_shape: (nh, nw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_is_channel_first() {
        let img = RgbImage {
            width: 2,
            height: 1,
            data: vec![0, 255, 51, 255, 0, 102],
        };
        let s = normalize(&img, [0.5; 3], [0.5; 3]);
        assert_eq!(s.data, vec![-1.0, 1.0, 1.0, -1.0, -0.6, -0.2]);
    }

    #[test]
    fn crop_takes_the_window() {
        let img = RgbImage {
            width: 3,
            height: 2,
            data: (0..18).collect(),
        };
        let c = crop(&img, 1, 1, 2, 1);
        assert_eq!(c.data, vec![12, 13, 14, 15, 16, 17]);
    }

    #[test]
    fn patch_strip_orders_rows_within_patches() {
        // One channel plane of 2x4 with patch 2 -> two patches side by side.
        let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let s = ChwImage {
            height: 2,
            width: 4,
            data,
        };
        let out = patch_strip(&s, 2);
        assert_eq!(&out[..8], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let s2 = ChwImage {
            height: 4,
            width: 2,
            data: (0..24).map(|v| v as f32).collect(),
        };
        // Two patches stacked: row 0 of both patches, then row 1 of both.
        assert_eq!(
            &patch_strip(&s2, 2)[..8],
            &[0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
        );
    }

    #[test]
    fn patch_rows_pad_and_order_channels_last() {
        let data: Vec<f32> = (0..3 * 2 * 2).map(|v| v as f32).collect();
        let t = patch_rows(
            &ChwImage {
                height: 2,
                width: 2,
                data,
            },
            2,
            3,
        );
        assert_eq!(t.valid_patches, 1);
        assert_eq!(t.patches.len(), 3 * 12);
        assert_eq!(&t.patches[..6], &[0.0, 4.0, 8.0, 1.0, 5.0, 9.0]);
        assert!(t.patches[12..].iter().all(|&v| v == 0.0));
    }
}
