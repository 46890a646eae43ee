//! LFM2-VL preprocessing: a "smart" resize to multiples of `encoder_patch_size ×
//! downsample_factor` within the token budget, or, for large images, 512×512 tiles plus a
//! thumbnail; bilinear antialiased resize, `(x/255 - mean)/std`; patchification to
//! `[num_patches, 3·p·p]` with a pixel attention mask and spatial shapes; and the
//! `<|image_start|>…<|image_end|>` placeholder of the model's processor.

use super::{lay_out, param, rgb_image, ImageScheme, PreprocessedImage, RgbImage};
use berth_kernels::image::resample::{resize, Arithmetic, Filter};
use berth_kernels::image::{crop, normalize};
use berth_plugin_api::{PixelLayout, PluginError, PreparedImage, RgbView};
use serde_json::{Map, Value};

/// The image processor settings (`preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Lfm2VlParams {
    /// Pixel-unshuffle factor of the projector.
    pub downsample_factor: usize,
    /// Whether large images are split into tiles.
    pub do_image_splitting: bool,
    /// Fewest tiles of a split image.
    pub min_tiles: usize,
    /// Most tiles of a split image.
    pub max_tiles: usize,
    /// Whether a split image also gets a downscaled thumbnail.
    pub use_thumbnail: bool,
    /// Fewest image tokens of a single-tile image.
    pub min_image_tokens: usize,
    /// Most image tokens of a single-tile image.
    pub max_image_tokens: usize,
    /// The vision encoder's patch size.
    pub encoder_patch_size: usize,
    /// Side of a tile.
    pub tile_size: usize,
    /// How far past `max_image_tokens` an image may be before it is tiled.
    pub max_pixels_tolerance: f64,
    /// Per-channel mean.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation.
    pub image_std: [f32; 3],
}

impl Default for Lfm2VlParams {
    fn default() -> Self {
        Self {
            downsample_factor: 2,
            do_image_splitting: true,
            min_tiles: 2,
            max_tiles: 10,
            use_thumbnail: true,
            min_image_tokens: 64,
            max_image_tokens: 256,
            encoder_patch_size: 16,
            tile_size: 512,
            max_pixels_tolerance: 2.0,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
        }
    }
}

impl Lfm2VlParams {
    /// The patch count every tile is padded to.
    pub fn max_num_patches(&self) -> usize {
        let thumb = self.max_image_tokens * self.downsample_factor.pow(2);
        let tile = if self.do_image_splitting {
            (self.tile_size / self.encoder_patch_size).pow(2)
        } else {
            0
        };
        thumb.max(tile)
    }
}

/// The tokenizer's marker strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lfm2VlTokens {
    /// The token repeated once per image feature.
    pub image: String,
    /// Opens an image.
    pub image_start: String,
    /// Closes an image.
    pub image_end: String,
    /// Precedes the thumbnail's tokens.
    pub thumbnail: String,
    /// Whether the start / end / tile / thumbnail markers are used at all.
    pub use_special_tokens: bool,
}

impl Default for Lfm2VlTokens {
    fn default() -> Self {
        Self {
            image: "<image>".into(),
            image_start: "<|image_start|>".into(),
            image_end: "<|image_end|>".into(),
            thumbnail: "<|img_thumbnail|>".into(),
            use_special_tokens: true,
        }
    }
}

/// Python's `round` (half to even).
fn py_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}

fn round_by_factor(x: usize, factor: usize) -> usize {
    (py_round(x as f64 / factor as f64) * factor as i64) as usize
}

/// Whether the image is tiled rather than resized as one.
fn is_too_large(h: usize, w: usize, p: &Lfm2VlParams) -> bool {
    let total = p.encoder_patch_size * p.downsample_factor;
    let hb = p.encoder_patch_size.max(round_by_factor(h, total));
    let wb = p.encoder_patch_size.max(round_by_factor(w, total));
    let limit = (p.max_image_tokens * p.encoder_patch_size.pow(2) * p.downsample_factor.pow(2)) as f64
        * p.max_pixels_tolerance;
    (hb * wb) as f64 > limit
}

/// The single-tile (or thumbnail) size `(height, width)`.
pub fn smart_resize(h: usize, w: usize, p: &Lfm2VlParams) -> (usize, usize) {
    let total = p.encoder_patch_size * p.downsample_factor;
    let per_token = p.encoder_patch_size.pow(2) * p.downsample_factor.pow(2);
    let (min_px, max_px) = (p.min_image_tokens * per_token, p.max_image_tokens * per_token);
    let mut hb = total.max(round_by_factor(h, total));
    let mut wb = total.max(round_by_factor(w, total));
    let (hf, wf, tf) = (h as f64, w as f64, total as f64);
    if hb * wb > max_px {
        let beta = (hf * wf / max_px as f64).sqrt();
        hb = total.max(((hf / beta / tf).floor() * tf) as usize);
        wb = total.max(((wf / beta / tf).floor() * tf) as usize);
    } else if hb * wb < min_px {
        let beta = (min_px as f64 / (hf * wf)).sqrt();
        hb = ((hf * beta / tf).ceil() * tf) as usize;
        wb = ((wf * beta / tf).ceil() * tf) as usize;
    }
    (hb, wb)
}

/// The `(cols, rows)` tile grid whose aspect ratio is closest to the image's.
fn grid_layout(h: usize, w: usize, p: &Lfm2VlParams) -> (usize, usize) {
    let mut ratios: Vec<(usize, usize)> = Vec::new();
    for n in p.min_tiles..=p.max_tiles {
        for gw in 1..=n {
            for gh in 1..=n {
                let area = gw * gh;
                if (p.min_tiles..=p.max_tiles).contains(&area) && !ratios.contains(&(gw, gh)) {
                    ratios.push((gw, gh));
                }
            }
        }
    }
    ratios.sort_by_key(|&(a, b)| a * b);
    let aspect = w as f64 / h as f64;
    let area = (w * h) as f64;
    let mut best = (1, 1);
    let mut best_diff = f64::INFINITY;
    for &(gw, gh) in &ratios {
        let diff = (aspect - gw as f64 / gh as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (gw, gh);
        } else if diff == best_diff && area > 0.5 * (p.tile_size * p.tile_size * gw * gh) as f64 {
            best = (gw, gh);
        }
    }
    best
}

/// Preprocesses one decoded image into its tiles (in the model's order: row-major tiles,
/// then the thumbnail) and its placeholder text.
pub fn preprocess(img: &RgbImage, p: &Lfm2VlParams, tokens: &Lfm2VlTokens) -> PreprocessedImage {
    let (h, w) = (img.height, img.width);
    let (min_tiles, max_tiles) = if p.do_image_splitting {
        (p.min_tiles, p.max_tiles)
    } else {
        (1, 1)
    };
    let splitting = !(min_tiles == 1 && max_tiles == 1);
    let (nh, nw) = smart_resize(h, w, p);
    let norm = |i: &RgbImage| normalize(i, p.image_mean, p.image_std);
    let arith = Arithmetic::TorchU8;
    let (rows, cols, slices) = if splitting && is_too_large(h, w, p) {
        let (gw, gh) = grid_layout(
            h,
            w,
            &Lfm2VlParams {
                min_tiles,
                max_tiles,
                ..p.clone()
            },
        );
        let t = p.tile_size;
        let big = resize(img, t * gw, t * gh, Filter::Bilinear, arith);
        let mut slices = Vec::new();
        for r in 0..gh {
            for c in 0..gw {
                slices.push(norm(&crop(&big, c * t, r * t, t, t)));
            }
        }
        if p.use_thumbnail && gw * gh != 1 {
            slices.push(norm(&resize(img, nw, nh, Filter::Bilinear, arith)));
        }
        (gh, gw, slices)
    } else {
        (1, 1, vec![norm(&resize(img, nw, nh, Filter::Bilinear, arith))])
    };
    let ps = p.encoder_patch_size;
    let down = |n: usize| n.div_ceil(p.downsample_factor);
    let per_tile = down(p.tile_size / ps).pow(2);
    let for_image = down(nh / ps) * down(nw / ps);
    let mut text = String::new();
    let mut count = 0;
    if tokens.use_special_tokens {
        text.push_str(&tokens.image_start);
    }
    if rows > 1 || cols > 1 {
        for r in 0..rows {
            for c in 0..cols {
                if tokens.use_special_tokens {
                    text.push_str(&format!("<|img_row_{}_col_{}|>", r + 1, c + 1));
                }
                text.push_str(&tokens.image.repeat(per_tile));
                count += per_tile;
            }
        }
        if p.use_thumbnail {
            if tokens.use_special_tokens {
                text.push_str(&tokens.thumbnail);
            }
            text.push_str(&tokens.image.repeat(for_image));
            count += for_image;
        }
    } else {
        text.push_str(&tokens.image.repeat(for_image));
        count += for_image;
    }
    if tokens.use_special_tokens {
        text.push_str(&tokens.image_end);
    }
    PreprocessedImage {
        slices,
        grid: (rows, cols),
        placeholder: text,
        image_tokens: count,
    }
}

/// A model's LFM2-VL preprocessing: the processor settings and the marker strings.
#[derive(Debug, Clone, PartialEq)]
pub struct Lfm2VlScheme {
    /// The image processor settings.
    pub params: Lfm2VlParams,
    /// The tokenizer's marker strings.
    pub tokens: Lfm2VlTokens,
}

impl Lfm2VlScheme {
    /// The scheme from a vision spec's `params` (the names of `preprocessor_config.json`, and
    /// `processor_config.json`'s `use_image_special_tokens`; transformers' defaults for what
    /// they leave out), the tower's patch size and the text of the image token.
    pub fn from_params(
        params: &Map<String, Value>,
        patch_size: usize,
        image_token: String,
    ) -> Result<Self, String> {
        let p = params;
        let d = Lfm2VlParams::default();
        let params = Lfm2VlParams {
            downsample_factor: param(p, "downsample_factor", d.downsample_factor)?,
            do_image_splitting: param(p, "do_image_splitting", d.do_image_splitting)?,
            min_tiles: param(p, "min_tiles", d.min_tiles)?,
            max_tiles: param(p, "max_tiles", d.max_tiles)?,
            use_thumbnail: param(p, "use_thumbnail", d.use_thumbnail)?,
            min_image_tokens: param(p, "min_image_tokens", d.min_image_tokens)?,
            max_image_tokens: param(p, "max_image_tokens", d.max_image_tokens)?,
            encoder_patch_size: patch_size,
            tile_size: param(p, "tile_size", d.tile_size)?,
            max_pixels_tolerance: param(p, "max_pixels_tolerance", d.max_pixels_tolerance)?,
            image_mean: param(p, "image_mean", d.image_mean)?,
            image_std: param(p, "image_std", d.image_std)?,
        };
        if params.downsample_factor == 0
            || patch_size == 0
            || params.tile_size < patch_size
            || params.min_tiles > params.max_tiles
        {
            return Err("vision params out of range".into());
        }
        Ok(Lfm2VlScheme {
            params,
            tokens: Lfm2VlTokens {
                image: image_token,
                use_special_tokens: param(p, "use_image_special_tokens", true)?,
                ..Default::default()
            },
        })
    }

    /// Image tokens a tile of `nh × nw` patches takes (the projector's pixel unshuffle).
    pub fn tile_tokens(&self, nh: usize, nw: usize) -> usize {
        let f = self.params.downsample_factor;
        nh.div_ceil(f) * nw.div_ceil(f)
    }
}

/// LFM2-VL's tower takes padded patch rows ([`PixelLayout::Patches`]); the image's number in the
/// request changes nothing.
impl ImageScheme for Lfm2VlScheme {
    fn prepare(&self, image: &RgbView<'_>, _index: u32) -> Result<PreparedImage, PluginError> {
        prepare(self, &rgb_image(image), PixelLayout::Patches)
    }
}

/// Prepares one image for an LFM2-VL tower in `layout` (the model's is
/// [`PixelLayout::Patches`], every tile padded to [`Lfm2VlParams::max_num_patches`]): its tiles,
/// each with its placeholder tokens, and the placeholder text.
pub fn prepare(
    scheme: &Lfm2VlScheme,
    img: &RgbImage,
    layout: PixelLayout,
) -> Result<PreparedImage, PluginError> {
    let p = &scheme.params;
    let pre = preprocess(img, p, &scheme.tokens);
    let padded = match layout {
        PixelLayout::Patches => p.max_num_patches(),
        _ => 0,
    };
    lay_out(pre, layout, p.encoder_patch_size, padded, |nh, nw| {
        scheme.tile_tokens(nh, nw)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_keeps_multiples_of_32_within_budget() {
        let p = Lfm2VlParams::default();
        for (h, w) in [(5, 3), (40, 1000), (1000, 40), (517, 333), (1100, 1500)] {
            let (nh, nw) = smart_resize(h, w, &p);
            assert_eq!((nh % 32, nw % 32), (0, 0), "{h}x{w}");
            assert!(nh * nw <= 256 * 1024, "{h}x{w} -> {nh}x{nw}");
        }
        assert_eq!(smart_resize(512, 512, &p), (512, 512));
    }

    #[test]
    fn grid_prefers_matching_aspect() {
        let p = Lfm2VlParams::default();
        // 2:1 matches (2, 1) and (4, 2); the larger grid wins once the image covers more than
        // half of its area.
        assert_eq!(grid_layout(400, 800, &p), (2, 1));
        assert_eq!(grid_layout(1000, 2000, &p), (4, 2));
        assert_eq!(grid_layout(3000, 1000, &p), (1, 3));
    }

    #[test]
    fn the_scheme_reads_its_params_and_prepares_padded_patches() {
        let params = serde_json::json!({"do_image_splitting": false, "min_image_tokens": 4,
            "max_image_tokens": 64, "use_image_special_tokens": false});
        let scheme = Lfm2VlScheme::from_params(params.as_object().unwrap(), 16, "<image>".into()).unwrap();
        let img = RgbImage {
            width: 100,
            height: 60,
            data: vec![7; 100 * 60 * 3],
        };
        let out = prepare(&scheme, &img, PixelLayout::Patches).unwrap();
        assert_eq!(out.slices.len(), 1);
        let s = &out.slices[0];
        let max = scheme.params.max_num_patches();
        assert_eq!(s.shape, vec![max as u32, 3 * 16 * 16]);
        let (h, w) = s.grid.unwrap();
        let real = s.patch_mask.as_ref().unwrap().iter().filter(|&&m| m != 0).count();
        assert_eq!(real, (h * w) as usize);
        assert_eq!(s.tokens as usize, scheme.tile_tokens(h as usize, w as usize));
        assert_eq!(out.placeholder, "<image>".repeat(s.tokens as usize));
        let bad = serde_json::json!({"min_tiles": 5, "max_tiles": 2});
        assert!(Lfm2VlScheme::from_params(bad.as_object().unwrap(), 16, "<image>".into()).is_err());
    }
}
