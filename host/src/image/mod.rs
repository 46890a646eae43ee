//! Image inputs: decoding (JPEG, PNG, WebP, GIF) and each vision family's preprocessing
//! (resize, slicing or tiling, normalisation, placeholder text), matched to the families'
//! own Hugging Face image processors.
//!
//! Everything here is model-independent host code: a plugin later receives the pixel tensors
//! of [`PreprocessedImage`] and the prompt receives its placeholder text.

pub mod decode;
pub mod lfm2vl;
pub mod minicpmv;
pub mod resample;

pub use decode::{decode, DecodeLimits, ImageError, RgbImage};

/// One slice (or tile) of an image: normalised f32 pixels, channel-first `[3, height, width]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelSlice {
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
    /// `3 * height * width` values, channel-major.
    pub data: Vec<f32>,
}

/// An image ready for a vision tower: its slices in the model's order and the text the
/// model's processor puts into the prompt in place of the image.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessedImage {
    /// The slices / tiles in the order the model consumes them.
    pub slices: Vec<PixelSlice>,
    /// The slice grid as `(rows, cols)`; `(0, 0)` or `(1, 1)` when the image is not split.
    pub grid: (usize, usize),
    /// The placeholder text that replaces the image in the prompt.
    pub placeholder: String,
    /// How many image (feature) tokens the placeholder holds.
    pub image_tokens: usize,
}

/// Rescales 8-bit pixels to `[0, 1]` and normalises them per channel, `(x / 255 - mean) / std`,
/// into a channel-first slice.
pub fn normalize(img: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> PixelSlice {
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
    PixelSlice {
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
}
