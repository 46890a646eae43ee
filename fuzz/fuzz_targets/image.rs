//! Fuzzes the image decoders behind every API's images (`berth::image::decode`: JPEG, PNG, WebP,
//! GIF) with the server's own limits: any bytes must decode to an RGB image within the pixel
//! limit or be an error, never a panic, and a decoded image's buffer must match its size.

#![no_main]

use berth::image::decode::{decode, DecodeLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    if let Ok(image) = decode(data, limits) {
        let pixels = image.width * image.height;
        assert!(
            pixels > 0 && pixels as u64 <= limits.max_pixels,
            "{}x{}",
            image.width,
            image.height
        );
        assert_eq!(image.data.len(), pixels * 3, "an RGB buffer of another size");
    }
});
