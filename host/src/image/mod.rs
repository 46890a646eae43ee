//! Image inputs: decoding (JPEG, PNG, WebP, GIF) to 8-bit RGB. What a model does with the
//! pixels (resize, slices, normalisation, placeholder text) is its plugin's `prepare_image`.

pub mod decode;

pub use decode::{decode, DecodeLimits, ImageError, RgbImage};
