//! Decoding of the accepted image formats (JPEG, PNG, WebP, GIF first frame) to RGB8.

use std::fmt;
use std::io::Cursor;

use image::{ImageFormat, ImageReader};

/// A decoded image: 8-bit RGB, row-major, interleaved (`[height, width, 3]`).
pub use berth_kernels::image::RgbImage;

/// Limits applied before an image is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// The most pixels (`width * height`) an image may have.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        // 50 megapixels: larger than any camera photo a client is likely to send, small
        // enough that the RGB buffer (150 MB) cannot exhaust the host.
        Self {
            max_pixels: 50_000_000,
        }
    }
}

/// Why an image could not be decoded; each maps to a client error naming the part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageError {
    /// The bytes are not in one of the accepted formats (JPEG, PNG, WebP, GIF).
    Unsupported(String),
    /// The format was recognised but the data is broken or truncated.
    Corrupt(String),
    /// The image has more pixels than the limit allows.
    TooLarge {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// The pixel limit it exceeds.
        max_pixels: u64,
    },
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported(what) => {
                write!(
                    f,
                    "unsupported image format ({what}); send JPEG, PNG, WebP or GIF"
                )
            }
            Self::Corrupt(why) => write!(f, "corrupt image data: {why}"),
            Self::TooLarge {
                width,
                height,
                max_pixels,
            } => write!(
                f,
                "image too large: {width}x{height} pixels, at most {max_pixels} pixels are accepted"
            ),
        }
    }
}

impl std::error::Error for ImageError {}

/// The formats Berth accepts.
const ACCEPTED: [ImageFormat; 4] = [
    ImageFormat::Jpeg,
    ImageFormat::Png,
    ImageFormat::WebP,
    ImageFormat::Gif,
];

/// Detects the format of `bytes` from their signature.
pub fn detect_format(bytes: &[u8]) -> Result<ImageFormat, ImageError> {
    match image::guess_format(bytes) {
        Ok(f) if ACCEPTED.contains(&f) => Ok(f),
        Ok(f) => Err(ImageError::Unsupported(format!("{f:?}").to_lowercase())),
        Err(_) => Err(ImageError::Unsupported("unrecognised data".into())),
    }
}

/// Decodes an image (the first frame of a GIF) to RGB8; alpha is dropped, palettes and grey
/// levels are expanded, as PIL's `convert("RGB")` does.
pub fn decode(bytes: &[u8], limits: DecodeLimits) -> Result<RgbImage, ImageError> {
    let format = detect_format(bytes)?;
    let corrupt = |e: image::ImageError| ImageError::Corrupt(e.to_string());
    let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(corrupt)?;
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooLarge {
            width,
            height,
            max_pixels: limits.max_pixels,
        });
    }
    if width == 0 || height == 0 {
        return Err(ImageError::Corrupt(format!("empty image ({width}x{height})")));
    }
    // The decoder's own allocation limit stays in force as a backstop.
    let img = ImageReader::with_format(Cursor::new(bytes), format)
        .decode()
        .map_err(corrupt)?
        .to_rgb8();
    Ok(RgbImage {
        width: img.width() as usize,
        height: img.height() as usize,
        data: img.into_raw(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_and_unaccepted_formats() {
        assert!(matches!(
            decode(b"hello world", DecodeLimits::default()),
            Err(ImageError::Unsupported(_))
        ));
        // A BMP signature is recognised by the sniffer but not accepted.
        let bmp = b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0";
        assert!(matches!(
            decode(bmp, DecodeLimits::default()),
            Err(ImageError::Unsupported(_))
        ));
    }

    #[test]
    fn truncated_png_is_corrupt() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0";
        assert!(matches!(
            decode(png, DecodeLimits::default()),
            Err(ImageError::Corrupt(_))
        ));
    }
}
